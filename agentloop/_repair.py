"""Repairing a transcript: `repair_transcript` restores every rule of `agentloop._transcript`.

Deterministic and idempotent, and the identity on a valid transcript (same objects, same
order), so a repaired history keeps its provider prompt-cache prefix. Three passes: each
message's blocks are cleaned (what may never be sent is dropped, lone surrogates scrubbed,
repeated call ids renamed), then results are paired with their calls by the id the calls had
(given a renamed call's new id, moved next to them, synthesized, or turned into text when they
answer nothing), then the final assistant message's trailing whitespace is stripped.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from collections.abc import Set as AbstractSet

from ._messages import Block, Message, TextBlock, ToolResultBlock, ToolUseBlock
from ._transcript import (
    NO_RESULT,
    as_messages,
    droppable,
    ends_with_space,
    interrupted_result,
    misplaced,
    scrubbed,
    unencodable,
)
from ._unicode import scrub
from ._validate import is_valid

__all__ = ["repair", "repair_transcript", "unused_id", "valid_history"]

log = logging.getLogger("agentloop")

def repair_transcript(
    messages: Sequence[Message], *, changes: list[str] | None = None
) -> list[Message]:
    """Return a new list that satisfies every rule of `validate_transcript`.

    What was changed is described, one line per change, in ``changes`` (when a
    list is given) and in the ``agentloop`` logger at INFO. Deterministic and
    idempotent: ``repair(repair(x)) == repair(x)``, and a valid transcript
    comes back unchanged.
    """
    listed, malformed = as_messages(messages)
    if malformed:
        more = f"; and {len(malformed) - 3} more" if len(malformed) > 3 else ""
        raise TypeError(
            f"repair_transcript takes a list of Message objects: {'; '.join(malformed[:3])}{more} "
            "(build one from a dict with Message.model_validate(d))"
        )
    return repair(listed, changes=changes)


_SHOWN_CHANGES = 20  # a long broken history is summed up, not listed whole in one log line


def valid_history(messages: list[Message], what: str) -> list[Message]:
    """``messages`` itself when every provider would accept it, else a repaired copy: a host's
    history with, say, a call left without its result would make every request fail. Says what
    it changed in a warning."""
    if is_valid(messages):
        return messages
    changes: list[str] = []
    repaired = repair(messages, changes=changes)
    shown = "; ".join(changes[:_SHOWN_CHANGES])
    more = f"; and {len(changes) - _SHOWN_CHANGES} more" if len(changes) > _SHOWN_CHANGES else ""
    log.warning("%s broke the transcript rules; repaired before sending: %s%s", what, shown, more)
    return repaired


def repair(messages: Sequence[Message], *, changes: list[str] | None = None, text_checked: bool = False) -> list[Message]:
    """`repair_transcript`; ``text_checked``: the caller knows no string holds a surrogate
    (a session file without a ``\\ud`` escape), so R9 is not checked block by block."""
    notes: list[str] = [] if changes is None else changes
    start = len(notes)  # a list given with lines in it already: only this repair's are logged
    ids = _Ids(messages)
    cleaned = _clean_blocks(messages, ids, notes, check_text=not text_checked)
    paired = _pair_results(cleaned, ids.origin, notes)
    _strip_final(paired, notes)
    for line in notes[start:]:
        log.info("repair_transcript: %s", line)
    return paired


def _clean_blocks(messages: Sequence[Message], ids: _Ids, notes: list[str], *, check_text: bool) -> list[Message]:
    out: list[Message] = []
    for i, msg in enumerate(messages):
        kept: list[Block] = []
        for block in msg.content:
            # A result in an assistant message is kept: paired with its call, or turned into text.
            why = droppable(block) or (None if block.type == "tool_result" else misplaced(block, msg.role))
            if why is not None:
                notes.append(f"messages[{i}]: dropped {why}")
                continue
            if check_text and unencodable(block):
                block = scrubbed(block)
                notes.append(f"messages[{i}]: replaced lone UTF-16 surrogates in a {block.type} block with U+FFFD")
            if isinstance(block, ToolUseBlock):
                renamed = ids.use(block)
                if renamed is not block:
                    notes.append(f"messages[{i}]: gave tool_use {block.id!r} ({block.name}) the unused id {renamed.id!r}")
                block = renamed
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
    return _unused(old, taken, 1)[0]


def _unused(old: str, taken: AbstractSet[str], start: int) -> tuple[str, int]:
    """`unused_id`, looking from the suffix ``start`` on (none below it is free): the id, and its suffix."""
    stem, n = old or "toolu", start
    while f"{stem}_{n}" in taken:
        n += 1
    return f"{stem}_{n}", n


class _Ids:
    """Tool-call ids while repairing: a call whose id is empty or already used gets an unused
    one. The results that answer it keep the id it had: `_pair_results` gives them the new one
    as it pairs them (see `_gather`)."""

    def __init__(self, messages: Sequence[Message]) -> None:
        # As `use` sees them: scrubbed of lone surrogates, so that a fresh id never equals one
        # that only becomes a call's id once scrubbed ('\ud800_1' is '\ufffd_1'). Nor does it
        # equal any result's, so a result's id is always one a call had in ``messages``.
        self.taken = {scrub(b.id) for m in messages for b in m.content if isinstance(b, ToolUseBlock)}
        self.taken |= {scrub(b.tool_use_id) for m in messages for b in m.content if isinstance(b, ToolResultBlock)}
        self.used: set[str] = set()
        self.origin: dict[str, str] = {}  # a renamed call's new id: the id it had
        # By id: the suffix after the last one it was given. ``taken`` only grows, so none below
        # it is free: each call of an id repeated n times does not look again at those before.
        self.suffix: dict[str, int] = {}

    def use(self, block: ToolUseBlock) -> ToolUseBlock:
        if block.id and block.id not in self.used:
            self.used.add(block.id)
            return block
        fresh, n = _unused(block.id, self.taken, self.suffix.get(block.id, 1))
        self.suffix[block.id] = n + 1
        self.taken.add(fresh)
        self.used.add(fresh)
        self.origin[fresh] = block.id
        return block.model_copy(update={"id": fresh})


def _pair_results(messages: list[Message], origin: dict[str, str], notes: list[str]) -> list[Message]:
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
                moved = _gather(pending, i, owed, origin, notes)
                msg = pending[i] or msg  # without the results it held for its own calls
        if any(isinstance(block, ToolResultBlock) for block in msg.content):
            msg = _rebuild(msg, [], _orphan_blocks(msg.content, notes))
        out.append(msg)
        i += 1
    if owed:
        out.append(_answer(None, owed, moved, notes))
    return out


def _gather(
    pending: list[Message | None], at: int, owed: list[ToolUseBlock], origin: dict[str, str], notes: list[str]
) -> dict[str, ToolResultBlock]:
    """Pair the calls ``owed`` of ``pending[at]`` with their results, and take those that are
    elsewhere than in the very next message, when it is the user's, out of their messages (a
    message left empty becomes None): the results, by call id. The very next user message is
    left to `_answer`, with the results in it that answer a renamed call given its new id.

    The results looked at are those a provider would still pair, because it merges consecutive
    messages of one role: in the assistant messages right after ``pending[at]`` and in the user
    messages after those (a history that holds one message per result, as OpenAI Chat does),
    and, last, those misplaced in ``pending[at]`` itself. A result answers a call that had its
    id before the repair (a repeated id is renamed, see `_Ids`): the results for one id answer
    the calls that had it in the order of both, the call that kept the id first."""
    waiting: dict[str, list[ToolUseBlock]] = {}  # by the id each had: the calls not yet paired
    for use in owed:
        waiting.setdefault(origin.get(use.id, use.id), []).append(use)
    nxt = pending[at + 1] if at + 1 < len(pending) else None
    answering = at + 1 if nxt is not None and nxt.role == "user" else -1
    end = _run_end(pending, _run_end(pending, at + 1, "assistant"), "user")
    found: dict[str, ToolResultBlock] = {}
    for j in (*range(at + 1, end), at):
        msg = pending[j]
        if not waiting:
            break
        if msg is None:
            continue
        kept: list[Block] = []
        for block in msg.content:
            calls = waiting.get(block.tool_use_id) if isinstance(block, ToolResultBlock) else None
            if not calls:
                kept.append(block)
                continue
            assert isinstance(block, ToolResultBlock)
            use = calls.pop(0)
            if not calls:
                del waiting[block.tool_use_id]
            if use.id != block.tool_use_id:
                notes.append(
                    f"gave a tool_result for {block.tool_use_id!r} the id {use.id!r} of the call renamed from it"
                )
                block = block.model_copy(update={"tool_use_id": use.id})
            if j == answering:
                kept.append(block)
            else:
                found[use.id] = block
        if len(kept) == len(msg.content) and all(a is b for a, b in zip(kept, msg.content, strict=True)):
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

    A result in ``moved`` (found in another message, see `_gather`) takes the place of the
    synthetic one. A result in ``msg`` for a call that one in ``moved`` answers (``msg`` was not
    the message right after the calls: the assistant messages between were left empty) is not
    the one `_gather` paired, and is kept as text."""
    wanted = {u.id for u in owed}
    results: dict[str, ToolResultBlock] = {}
    rest: list[Block] = []
    for block in msg.content if msg is not None else ():
        if isinstance(block, ToolResultBlock) and block.tool_use_id in wanted and block.tool_use_id not in moved:
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
    while messages and messages[-1].role == "assistant" and ends_with_space(messages[-1]):
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
