"""The transcript rules every provider enforces, and the repair that restores them.

Rules (SPEC §3; WIRE.md §1.5, §2.4, §3.5), checked by `validate_transcript`:

R1  every tool_use has exactly one tool_result, in the very next message, which
    is a user message whose leading blocks are the results;
R2  no tool_result without the tool_use it answers in the message just before;
R3  no duplicate tool_result for one id, and no duplicate tool_use id;
R4  no empty message, and no empty or whitespace-only text block;
R5  the final message, when it is the assistant's, does not end with whitespace;
R6  no thinking block without a signature;
R7  no tool_use whose input never completed;
R8  each block in a message of the right role: tool_use, thinking and provider
    blocks only from the assistant, tool_result only from the user;
R9  no string that UTF-8 cannot encode (a lone UTF-16 surrogate), which would make
    every later request fail to encode.

`repair_transcript` fixes each violation deterministically. It is idempotent and
leaves a valid transcript untouched (same objects, same order), so a repaired
history keeps its provider prompt-cache prefix.
"""

from __future__ import annotations

import logging
from collections.abc import Iterable, Sequence
from collections.abc import Set as AbstractSet
from typing import cast

from ._messages import (
    Block,
    Message,
    ProviderBlock,
    RedactedThinkingBlock,
    TextBlock,
    ThinkingBlock,
    ToolResultBlock,
    ToolUseBlock,
    text_block,
    tool_result_block,
)
from ._unicode import has_surrogates, scrub, scrub_json

__all__ = [
    "encodable",
    "encodable_message",
    "interrupted_result",
    "repair_transcript",
    "validate_transcript",
]

log = logging.getLogger("agentloop")

NO_RESULT = "Interrupted by user: no result was recorded for this tool call."


def interrupted_result(tool_use_id: str, text: str) -> ToolResultBlock:
    """A synthetic error result for a call that did not finish."""
    return tool_result_block(tool_use_id, text, is_error=True)


_ASSISTANT_ONLY = ("tool_use", "thinking", "redacted_thinking", "provider")


def _misplaced(block: Block, role: str) -> str | None:
    if role == "user" and block.type in _ASSISTANT_ONLY:
        return f"{block.type} block inside a user message"
    if role == "assistant" and block.type == "tool_result":
        return "tool_result inside an assistant message"
    return None


def _droppable(block: Block) -> str | None:
    """Why a block may never be sent, or None (blocks told apart by their discriminator)."""
    if block.type == "text" and not block.text.strip():
        return "empty or whitespace-only text block"
    if block.type == "thinking" and not block.signature:
        return "thinking block without a signature"
    if block.type == "tool_use" and not block.complete:
        return f"tool_use {block.id!r} ({block.name}) whose input never completed"
    return None


def encodable(block: ToolResultBlock) -> ToolResultBlock:
    """``block`` with its content scrubbed of lone surrogates (a tool's output may hold a
    file name decoded with ``surrogateescape``); ``block`` itself when it has none."""
    content = block.content
    if isinstance(content, str):
        if not has_surrogates(content):  # the common case: one isascii() call
            return block
        return block.model_copy(update={"content": scrub(content)})
    if not any(has_surrogates(b.text) for b in content):
        return block
    return block.model_copy(update={"content": [text_block(scrub(b.text)) for b in content]})


def _strings(block: Block) -> list[str]:
    """Every string of ``block`` that is sent to a provider (a tool input's keys and values too)."""
    # By the discriminator: an isinstance against a pydantic class runs its metaclass's
    # __instancecheck__ in Python.
    if block.type == "text":
        return [block.text]
    if block.type == "thinking":
        return [block.thinking, block.signature]
    if block.type == "redacted_thinking":
        return [block.data]
    if block.type == "tool_use":
        out = [block.id, block.name]
        _json_strings(block.input, out)
        return out
    if block.type == "provider":
        out = [block.provider]
        _json_strings(block.data, out)
        return out
    content = block.content
    return [block.tool_use_id, *([content] if isinstance(content, str) else [b.text for b in content])]


def _json_strings(value: object, out: list[str]) -> None:
    if isinstance(value, str):
        out.append(value)
    elif isinstance(value, dict):
        for k, v in value.items():
            _json_strings(k, out)
            _json_strings(v, out)
    elif isinstance(value, list):
        for v in value:
            _json_strings(v, out)


def _unencodable(block: Block) -> bool:
    if block.type == "text":  # the common case, without building a list
        return has_surrogates(block.text)
    return any(has_surrogates(text) for text in _strings(block))


def _scrubbed(block: Block) -> Block:
    """``block`` with every string scrubbed of lone surrogates (R9)."""
    if isinstance(block, TextBlock):
        return block.model_copy(update={"text": scrub(block.text)})
    if isinstance(block, ThinkingBlock):
        return block.model_copy(update={"thinking": scrub(block.thinking), "signature": scrub(block.signature)})
    if isinstance(block, RedactedThinkingBlock):
        return block.model_copy(update={"data": scrub(block.data)})
    if isinstance(block, ToolUseBlock):
        return block.model_copy(
            update={"id": scrub(block.id), "name": scrub(block.name), "input": scrub_json(block.input)}
        )
    if isinstance(block, ProviderBlock):
        return block.model_copy(update={"provider": scrub(block.provider), "data": scrub_json(block.data)})
    return encodable(block).model_copy(update={"tool_use_id": scrub(block.tool_use_id)})


def encodable_message(message: Message) -> Message:
    """``message`` with its blocks scrubbed of lone surrogates (R9); itself when it has none."""
    if not any(_unencodable(b) for b in message.content):
        return message
    return message.model_copy(update={"content": [_scrubbed(b) if _unencodable(b) else b for b in message.content]})


def _ends_with_space(message: Message) -> bool:
    last = message.content[-1] if message.content else None
    return last is not None and last.type == "text" and last.text != last.text.rstrip()


_BLOCK_TYPES = (TextBlock, ThinkingBlock, RedactedThinkingBlock, ToolUseBlock, ToolResultBlock, ProviderBlock)


def _listed(messages: object) -> list[object] | None:
    """``messages`` as a new list, or None when it is not a collection of messages at all."""
    if isinstance(messages, str | bytes | dict | Message) or not isinstance(messages, Iterable):
        return None
    return list(messages)


def _as_messages(messages: object) -> tuple[list[Message], list[str]]:
    """``messages`` as a new list of `Message`s, and one line per entry that is not a well-formed
    one (`_malformed`); the list is to be read only when there are no such lines."""
    listed = _listed(messages)
    return cast("list[Message]", listed or []), _malformed(messages, listed)


def _malformed(messages: object, listed: list[object] | None) -> list[str]:
    """One line per entry of ``listed`` (``messages`` as a list) that is not a well-formed
    `Message`: a dict in the wire format, None, a message whose content was replaced without
    validation. [] when every entry is one."""
    if listed is None:
        return [f"messages is of type {type(messages).__name__}, not a list of Message objects"]
    out: list[str] = []
    for i, msg in enumerate(listed):
        if type(msg) is not Message and not isinstance(msg, Message):
            out.append(f"messages[{i}] is of type {type(msg).__name__}, not a Message")
            continue
        if msg.role not in ("user", "assistant"):
            out.append(f"messages[{i}] has the role {msg.role!r}, neither 'user' nor 'assistant'")
        if not isinstance(msg.content, list):
            out.append(f"messages[{i}]: content is of type {type(msg.content).__name__}, not a list of blocks")
            continue
        for j, block in enumerate(msg.content):
            if type(block) not in _BLOCK_TYPES and not isinstance(block, _BLOCK_TYPES):
                out.append(f"messages[{i}]: content[{j}] is of type {type(block).__name__}, not a block")
                continue
            why = _bad_fields(block)
            if why is not None:
                out.append(f"messages[{i}]: content[{j}] ({_fields(block)[0]}): {why}")
    return out


#: Each block class: its ``type`` tag, and the fields the rules read as strings.
_FIELDS: dict[type, tuple[str, tuple[str, ...]]] = {
    TextBlock: ("text", ("text",)),
    ThinkingBlock: ("thinking", ("thinking", "signature")),
    RedactedThinkingBlock: ("redacted_thinking", ("data",)),
    ToolUseBlock: ("tool_use", ("id", "name")),
    ToolResultBlock: ("tool_result", ("tool_use_id",)),
    ProviderBlock: ("provider", ("provider",)),
}


def _fields(block: Block) -> tuple[str, tuple[str, ...]]:
    return next(_FIELDS[c] for c in type(block).__mro__ if c in _FIELDS)  # a subclass's too


def _bad_fields(block: Block) -> str | None:
    """Why ``block`` holds what validation would have refused (a field replaced by
    ``model_copy(update=...)``, which does not validate), or None: what the rules read."""
    tag, strings = _fields(block)
    if block.type != tag:
        return f"type is {block.type!r}, not {tag!r}"
    for name in strings:
        value = getattr(block, name)
        if not isinstance(value, str):
            return f"{name} is of type {type(value).__name__}, not str"
    if isinstance(block, ToolUseBlock) and not isinstance(block.input, dict):
        return f"input is of type {type(block.input).__name__}, not dict"
    if isinstance(block, ProviderBlock) and not isinstance(block.data, dict):
        return f"data is of type {type(block.data).__name__}, not dict"
    if isinstance(block, ToolResultBlock):
        content: object = block.content
        if not isinstance(content, str) and not (
            isinstance(content, list) and all(isinstance(b, TextBlock) and isinstance(b.text, str) for b in content)
        ):
            return f"content is of type {type(content).__name__}, not a string or a list of text blocks"
        if not isinstance(block.is_error, bool):
            return f"is_error is of type {type(block.is_error).__name__}, not bool"
    return None


def validate_transcript(messages: Sequence[Message]) -> list[str]:
    """Return one line per rule violation; an empty list means the transcript is valid.

    Never raises: what is not a list of well-formed `Message` objects is reported instead,
    one line per bad entry, and not checked against the rules."""
    messages, malformed = _as_messages(messages)
    if malformed:
        return malformed
    out: list[str] = []
    seen_use: set[str] = set()
    seen_result: set[str] = set()
    expected: dict[str, str] = {}  # tool_use id -> name, owed by the next message
    owed_at = -1
    for i, msg in enumerate(messages):
        where = f"messages[{i}] ({msg.role})"
        if not msg.content:
            out.append(f"{where}: empty message")
        for block in msg.content:
            out.extend(f"{where}: {why}" for why in (_droppable(block), _misplaced(block, msg.role)) if why is not None)
            if _unencodable(block):
                out.append(f"{where}: {block.type} block holds text UTF-8 cannot encode (a lone UTF-16 surrogate)")
        if expected:
            out.extend(_check_answer(messages, i, owed_at, expected, seen_result))
            expected = {}
        else:
            out.extend(
                f"{where}: tool_result for {block.tool_use_id!r} has no tool_use in the message just before it"
                for block in msg.content
                if isinstance(block, ToolResultBlock) and msg.role == "user"
            )
        if msg.role == "assistant":
            for block in msg.content:
                if isinstance(block, ToolUseBlock):
                    if not block.id:
                        out.append(f"{where}: tool_use ({block.name}) without an id")
                    elif block.id in seen_use:
                        out.append(f"{where}: duplicate tool_use id {block.id!r}")
                    seen_use.add(block.id)
                    if block.complete:  # an incomplete call is dropped, not answered
                        expected[block.id] = block.name
            owed_at = i
    for tid, name in expected.items():
        out.append(
            f"messages[{owed_at}] (assistant): tool_use {tid!r} ({name}) has no tool_result "
            "(the transcript ends after it)"
        )
    if messages and messages[-1].role == "assistant" and _ends_with_space(messages[-1]):
        out.append(f"messages[{len(messages) - 1}] (assistant): final assistant message ends with whitespace")
    return out


def is_valid(messages: Sequence[Message]) -> bool:
    """True exactly when `validate_transcript` would report nothing, without writing its lines
    (a property test holds the two together): one pass, stopping at the first violation."""
    seen_use: set[str] = set()
    seen_result: set[str] = set()
    owed: set[str] | None = None  # the ids the message must answer: the calls just before it
    for msg in messages:
        content = msg.content
        if not content:
            return False
        user = msg.role == "user"
        calls: set[str] | None = None
        answered = 0
        leading = True
        for block in content:
            if block.type == "text":
                text = block.text
                if not text or text.isspace() or has_surrogates(text):
                    return False
                leading = False
                continue
            if block.type == "tool_result":
                tid = block.tool_use_id
                if not user or not leading or owed is None or tid not in owed or tid in seen_result:
                    return False
                seen_result.add(tid)
                answered += 1
            elif block.type == "tool_use":
                tid = block.id
                if user or not block.complete or not tid or tid in seen_use:
                    return False
                seen_use.add(tid)
                if calls is None:
                    calls = set()
                calls.add(tid)
                leading = False
            else:  # thinking, redacted thinking, a provider's block
                if user or (block.type == "thinking" and not block.signature):
                    return False
                leading = False
            if _unencodable(block):
                return False
        if owed is not None and answered != len(owed):
            return False
        owed = calls
    if owed:
        return False
    return not (messages and messages[-1].role == "assistant" and _ends_with_space(messages[-1]))


def _check_answer(
    messages: Sequence[Message],
    i: int,
    owed_at: int,
    expected: dict[str, str],
    seen_result: set[str],
) -> list[str]:
    msg = messages[i]
    out: list[str] = []
    if msg.role != "user":
        return [
            f"messages[{owed_at}] (assistant): tool_use {tid!r} ({name}) has no tool_result "
            f"in the next message (messages[{i}] is an assistant message)"
            for tid, name in expected.items()
        ]
    leading = True
    answered: set[str] = set()
    for block in msg.content:
        if not isinstance(block, ToolResultBlock):
            leading = False
            continue
        tid = block.tool_use_id
        if tid in seen_result or tid in answered:
            out.append(f"messages[{i}] (user): duplicate tool_result for {tid!r}")
            continue
        if tid not in expected:
            out.append(
                f"messages[{i}] (user): tool_result for {tid!r} has no tool_use "
                "in the message just before it"
            )
            continue
        if not leading:
            out.append(f"messages[{i}] (user): tool_result for {tid!r} comes after other content")
        answered.add(tid)
    seen_result |= answered
    for tid, name in expected.items():
        if tid not in answered:
            out.append(
                f"messages[{owed_at}] (assistant): tool_use {tid!r} ({name}) has no tool_result "
                f"in the next message (messages[{i}])"
            )
    return out


# -- repair -------------------------------------------------------------------


def repair_transcript(
    messages: Sequence[Message], *, changes: list[str] | None = None
) -> list[Message]:
    """Return a new list that satisfies every rule of `validate_transcript`.

    What was changed is described, one line per change, in ``changes`` (when a
    list is given) and in the ``agentloop`` logger at INFO. Deterministic and
    idempotent: ``repair(repair(x)) == repair(x)``, and a valid transcript
    comes back unchanged.
    """
    listed, malformed = _as_messages(messages)
    if malformed:
        more = f"; and {len(malformed) - 3} more" if len(malformed) > 3 else ""
        raise TypeError(
            f"repair_transcript takes a list of Message objects: {'; '.join(malformed[:3])}{more} "
            "(build one from a dict with Message.model_validate(d))"
        )
    return repair(listed, changes=changes)


def repair(messages: Sequence[Message], *, changes: list[str] | None = None, text_checked: bool = False) -> list[Message]:
    """`repair_transcript`; ``text_checked``: the caller knows no string holds a surrogate
    (a session file without a ``\\ud`` escape), so R9 is not checked block by block."""
    notes: list[str] = [] if changes is None else changes
    start = len(notes)  # a list given with lines in it already: only this repair's are logged
    cleaned = _clean_blocks(messages, notes, check_text=not text_checked)
    paired = _pair_results(cleaned, notes)
    _strip_final(paired, notes)
    for line in notes[start:]:
        log.info("repair_transcript: %s", line)
    return paired


def _clean_blocks(messages: Sequence[Message], notes: list[str], *, check_text: bool) -> list[Message]:
    out: list[Message] = []
    ids = _Ids(messages)
    for i, msg in enumerate(messages):
        kept: list[Block] = []
        ids.begin(msg)
        for block in msg.content:
            # A result in an assistant message is kept: paired with its call, or turned into text.
            why = _droppable(block) or (None if block.type == "tool_result" else _misplaced(block, msg.role))
            if why is not None:
                notes.append(f"messages[{i}]: dropped {why}")
                continue
            if check_text and _unencodable(block):
                block = _scrubbed(block)
                notes.append(f"messages[{i}]: replaced lone UTF-16 surrogates in a {block.type} block with U+FFFD")
            if isinstance(block, ToolUseBlock):
                renamed = ids.use(block)
                if renamed is not block:
                    notes.append(f"messages[{i}]: gave tool_use {block.id!r} ({block.name}) the unused id {renamed.id!r}")
                block = renamed
            elif isinstance(block, ToolResultBlock):
                block = ids.result(block)
            kept.append(block)
        if not kept:
            notes.append(f"messages[{i}]: dropped empty {msg.role} message")
            continue
        same = len(kept) == len(msg.content) and all(a is b for a, b in zip(kept, msg.content, strict=True))
        out.append(msg if same else msg.model_copy(update={"content": kept}))
    return out


def unused_id(old: str, taken: AbstractSet[str]) -> str:
    """A fresh id for a tool call: ``old`` with the smallest suffix ``_n`` not in ``taken``
    (``toolu_n`` when ``old`` is empty)."""
    stem, n = old or "toolu", 1
    while f"{stem}_{n}" in taken:
        n += 1
    return f"{stem}_{n}"


class _Ids:
    """Tool-call ids while repairing: a call whose id is empty or already used gets an unused
    one, and the results that answer it follow, wherever `_pair_results` would take them from:
    later in the call's own message, in the assistant messages after it and in the user messages
    after those (the first results with that id answer the calls that kept it, the next ones the
    renamed calls, in order)."""

    def __init__(self, messages: Sequence[Message]) -> None:
        # As `use` sees them: scrubbed of lone surrogates, so that a fresh id never equals one
        # that only becomes a call's id once scrubbed ('\ud800_1' is '\ufffd_1').
        self.taken = {scrub(b.id) for m in messages for b in m.content if isinstance(b, ToolUseBlock)}
        self.taken |= {scrub(b.tool_use_id) for m in messages for b in m.content if isinstance(b, ToolResultBlock)}
        self.used: set[str] = set()
        # The exchange of the latest assistant message with calls: its calls that kept their
        # id and its renamed ones (by old id), and the results read since, by id.
        self.kept: dict[str, int] = {}
        self.renamed: dict[str, list[str]] = {}
        self.seen: dict[str, int] = {}
        self.role = "user"

    def begin(self, msg: Message) -> None:
        """Start reading ``msg``: an assistant message with calls starts an exchange, and one
        after a user message ends the one before."""
        if msg.role == "assistant" and (self.role == "user" or any(b.type == "tool_use" for b in msg.content)):
            self.kept, self.renamed, self.seen = {}, {}, {}
        self.role = msg.role

    def use(self, block: ToolUseBlock) -> ToolUseBlock:
        if block.id and block.id not in self.used:
            self.used.add(block.id)
            self.kept[block.id] = self.kept.get(block.id, 0) + 1
            return block
        fresh = unused_id(block.id, self.taken)
        self.taken.add(fresh)
        self.used.add(fresh)
        self.renamed.setdefault(block.id, []).append(fresh)
        return block.model_copy(update={"id": fresh})

    def result(self, block: ToolResultBlock) -> ToolResultBlock:
        tid = block.tool_use_id
        renamed = self.renamed.get(tid)
        if renamed is None:
            return block
        nth = self.seen.get(tid, 0)
        self.seen[tid] = nth + 1
        k = nth - self.kept.get(tid, 0)
        if 0 <= k < len(renamed):
            return block.model_copy(update={"tool_use_id": renamed[k]})
        return block


def _pair_results(messages: list[Message], notes: list[str]) -> list[Message]:
    out: list[Message] = []
    owed: list[ToolUseBlock] = []
    moved: dict[str, ToolResultBlock] = {}
    pending: list[Message | None] = list(messages)
    i = 0
    while i < len(pending):
        msg = pending[i]
        if msg is None:  # its only blocks were results, moved next to their calls
            i += 1
            continue
        if owed:
            answers_it = msg.role == "user"
            out.append(_answer(msg if answers_it else None, owed, moved, notes))
            owed, moved = [], {}
            if answers_it:
                i += 1
            continue
        if msg.role == "assistant":
            owed = msg.tool_uses
            if owed:
                moved = _gather(pending, i, owed, notes)
                msg = pending[i] or msg  # without the results it held for its own calls
        if any(isinstance(block, ToolResultBlock) for block in msg.content):
            msg = _rebuild(msg, [], _orphan_blocks(msg.content, notes))
        out.append(msg)
        i += 1
    if owed:
        out.append(_answer(None, owed, moved, notes))
    return out


def _gather(pending: list[Message | None], at: int, owed: list[ToolUseBlock], notes: list[str]) -> dict[str, ToolResultBlock]:
    """Take out of other messages the results for ``owed`` that belong with their calls: those a
    provider would still pair, because it merges consecutive messages of one role (in the
    assistant messages right after ``pending[at]`` and in the user messages after those: a
    history that holds one message per result, as OpenAI Chat does), and those misplaced in
    ``pending[at]`` itself. The very next message, when it is the user's, is left to `_answer`;
    a message left empty becomes None."""
    wanted = {u.id for u in owed}
    nxt = pending[at + 1] if at + 1 < len(pending) else None
    if nxt is not None and nxt.role == "user":  # the common case: the next message answers them all
        wanted -= {b.tool_use_id for b in nxt.content if isinstance(b, ToolResultBlock)}
        if not wanted:
            return {}
        wanted = {u.id for u in owed}
    first_user = _run_end(pending, at + 1, "assistant")
    end = _run_end(pending, first_user, "user")
    start = at + 1
    nxt = pending[start] if start < end else None
    if nxt is not None and nxt.role == "user":  # the very next message: `_answer` reads it
        wanted -= {b.tool_use_id for b in nxt.content if isinstance(b, ToolResultBlock)}
        start += 1
    found: dict[str, ToolResultBlock] = {}
    for j in (*range(start, end), at):
        msg = pending[j]
        if not wanted or msg is None:
            continue
        kept: list[Block] = []
        for block in msg.content:
            if isinstance(block, ToolResultBlock) and block.tool_use_id in wanted:
                wanted.discard(block.tool_use_id)
                found[block.tool_use_id] = block
            else:
                kept.append(block)
        if len(kept) == len(msg.content):
            continue
        if not kept:
            notes.append(f"dropped a {msg.role} message left empty by moving its tool results")
        pending[j] = msg.model_copy(update={"content": kept}) if kept else None
    return found


def _run_end(pending: list[Message | None], start: int, role: str) -> int:
    """The index after the run of ``role`` messages (or removed ones) that begins at ``start``."""
    end = start
    while end < len(pending):
        msg = pending[end]
        if msg is not None and msg.role != role:
            break
        end += 1
    return end


def _answer(
    msg: Message | None, owed: list[ToolUseBlock], moved: dict[str, ToolResultBlock], notes: list[str]
) -> Message:
    """The user message that answers ``owed``: results first, built from ``msg`` if any.

    A result in ``moved`` (found in a later message, see `_gather`) takes the place of the
    synthetic one."""
    wanted = {u.id for u in owed}
    results: dict[str, ToolResultBlock] = {}
    rest: list[Block] = []
    for block in msg.content if msg is not None else ():
        if isinstance(block, ToolResultBlock) and block.tool_use_id in wanted:
            if block.tool_use_id in results:
                notes.append(f"dropped duplicate tool_result for {block.tool_use_id!r}")
            else:
                if rest:  # after other content: it goes first, as providers require
                    notes.append(f"moved the tool_result for {block.tool_use_id!r} before the other content of its message")
                results[block.tool_use_id] = block
            continue
        rest.append(block)
    for use in owed:
        if use.id in results:
            continue
        found = moved.get(use.id)
        if found is not None:
            notes.append(f"moved the tool_result for {use.id!r} ({use.name}) next to its call")
            results[use.id] = found
        else:
            notes.append(f"added a synthetic result for tool_use {use.id!r} ({use.name})")
            results[use.id] = interrupted_result(use.id, NO_RESULT)
    if msg is None:
        return Message(role="user", content=list(results.values()), synthetic=True, kind="tool_results")
    return _rebuild(msg, list(results.values()), _orphan_blocks(rest, notes))


def _rebuild(msg: Message, head: list[Block], tail: list[Block]) -> Message:
    """``msg`` with content head + tail; the same object when nothing changed."""
    content = [*head, *tail]
    if len(content) == len(msg.content) and all(a is b for a, b in zip(content, msg.content, strict=True)):
        return msg
    return msg.model_copy(update={"content": content})


def _orphan_blocks(blocks: Sequence[Block], notes: list[str]) -> list[Block]:
    """``blocks`` with every tool_result turned into text (nothing is lost)."""
    out: list[Block] = []
    for block in blocks:
        if isinstance(block, ToolResultBlock):
            notes.append(f"turned orphan tool_result for {block.tool_use_id!r} into text")
            body = block.text.strip() or "(empty)"
            out.append(
                TextBlock(text=f"[result of tool call {block.tool_use_id} without a matching call]\n{body}")
            )
        else:
            out.append(block)
    return out


def _strip_final(messages: list[Message], notes: list[str]) -> None:
    while messages and messages[-1].role == "assistant" and _ends_with_space(messages[-1]):
        msg = messages[-1]
        last = msg.content[-1]
        assert isinstance(last, TextBlock)
        stripped = last.text.rstrip()
        notes.append(f"messages[{len(messages) - 1}]: stripped trailing whitespace of the final assistant message")
        content = list(msg.content[:-1])
        if stripped:
            content.append(TextBlock(text=stripped))
        if content:
            messages[-1] = msg.model_copy(update={"content": content})
        else:
            messages.pop()
            notes.append("dropped the final assistant message, which held only whitespace")
