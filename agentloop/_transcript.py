"""The transcript rules every provider enforces, shared by validation and repair.

Rules (SPEC §3; WIRE.md §1.5, §2.4, §3.5), checked by `validate_transcript`
(`agentloop._validate`) and restored by `repair_transcript` (`agentloop._repair`):

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

This module holds what the two share: the rules a single block or message can break
(R4, R6-R9, and R5's test), the scrubbing that restores R9, the synthetic result for a
call that did not finish, and the check that the input is a list of messages at all.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any, cast

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
    "NO_RESULT",
    "as_messages",
    "droppable",
    "encodable",
    "encodable_message",
    "ends_with_space",
    "interrupted_result",
    "credentials_of",
    "lineage_credentials",
    "lineage_sources",
    "misplaced",
    "redacted",
    "scrubbed",
    "tool_credentials",
    "unencodable",
]

NO_RESULT = "Interrupted by user: no result was recorded for this tool call."


def interrupted_result(tool_use_id: str, text: str) -> ToolResultBlock:
    """A synthetic error result for a call that did not finish."""
    return tool_result_block(tool_use_id, text, is_error=True)


_ASSISTANT_ONLY = ("tool_use", "thinking", "redacted_thinking", "provider")


def misplaced(block: Block, role: str) -> str | None:
    """Why ``block`` may not stand in a message of ``role`` (R8), or None."""
    if role == "user" and block.type in _ASSISTANT_ONLY:
        return f"{block.type} block inside a user message"
    if role == "assistant" and block.type == "tool_result":
        return "tool_result inside an assistant message"
    return None


def droppable(block: Block) -> str | None:
    """Why a block may never be sent (R4, R6, R7), or None (blocks told apart by their discriminator)."""
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


def credentials(model: object) -> tuple[str, ...]:
    """The credentials an HTTP provider ``model`` holds (its API key, the values of its
    credential headers); () for any other model (`ScriptedModel`, the host's own)."""
    return tuple(_held(model))


def tool_credentials(tools: Iterable[object]) -> set[str]:
    """The credentials the handlers of ``tools`` hold: for an MCP server's tool, those the host
    gave the server (`agentloop.mcp.MCPServer`) long enough to scrub out of any text."""
    found: set[str] = set()
    for tool in tools:
        found.update(_held(getattr(tool, "handler", None)))
    return found


def _held(holder: object) -> list[str]:
    """What ``holder._credentials()`` gives: the library's providers and MCP tools say so. A host's
    object may use that name for something else (a dict, a method returning one str): only a
    collection of non-empty strs counts, and one that fails counts as none, never breaking a run."""
    held = getattr(holder, "_credentials", None)
    if not callable(held):
        return []
    try:
        got = held()
        if isinstance(got, str | bytes | Mapping) or not isinstance(got, Iterable):
            return []
        return [s for s in got if isinstance(s, str) and s]
    except Exception:
        return []


def lineage_credentials(engine: Any) -> tuple[str, ...]:
    """The credentials of ``engine``'s model and of its ancestors' (a subagent may run on a
    model of its own: a tool result holding its parent's key must not reach it either), and
    those of the MCP servers whose tools they hold (`tool_credentials`), longest first. Read
    on an error path, or once per run and tool set (`agentloop._toolphase.run_secrets`)."""
    return credentials_of(lineage_sources(engine))


#: What a lineage's credentials are read from: (model, tool set) of an engine and of each ancestor.
Sources = tuple[tuple[object, tuple[object, ...]], ...]


def lineage_sources(engine: Any) -> Sources:
    """What `lineage_credentials` reads: the model and the tool set (a new tuple each time the
    tools are set) of ``engine`` and of each of its ancestors, in turn."""
    found: list[tuple[object, tuple[object, ...]]] = []
    while engine is not None:
        found.append((engine.model, getattr(engine, "tool_specs", ())))
        engine = engine.parent
    return tuple(found)


def credentials_of(sources: Sources) -> tuple[str, ...]:
    """The credentials of the models and tool sets of ``sources`` (`lineage_sources`), longest first."""
    found: set[str] = set()
    for model, specs in sources:
        found.update(credentials(model))
        found.update(tool_credentials(specs))
    return tuple(sorted(found, key=len, reverse=True))


def without_credentials(block: ToolResultBlock, secrets: tuple[str, ...]) -> ToolResultBlock:
    """``block`` with each of ``secrets`` replaced by ``[REDACTED]``; ``block`` itself when it
    holds none. A tool that prints the environment the key came from, or reads a ``.env`` file,
    would otherwise put the key in the events, the transcript, the session file and every later
    request."""
    content = block.content
    if isinstance(content, str):
        clean = redacted(content, secrets)
        return block if clean is content else block.model_copy(update={"content": clean})
    texts = [redacted(b.text, secrets) for b in content]
    if all(t is b.text for t, b in zip(texts, content, strict=True)):
        return block
    return block.model_copy(update={"content": [text_block(t) for t in texts]})


def redacted(text: str, secrets: tuple[str, ...]) -> str:
    """``text`` with each of ``secrets`` (longest first, as `credentials` gives them) replaced
    by ``[REDACTED]``; ``text`` itself when it holds none."""
    for secret in secrets:
        if secret in text:
            text = text.replace(secret, "[REDACTED]")
    return text


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


def unencodable(block: Block) -> bool:
    """True when a string of ``block`` holds a lone surrogate (R9)."""
    if block.type == "text":  # the common case, without building a list
        return has_surrogates(block.text)
    return any(has_surrogates(text) for text in _strings(block))


def scrubbed(block: Block) -> Block:
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
    if not any(unencodable(b) for b in message.content):
        return message
    return message.model_copy(update={"content": [scrubbed(b) if unencodable(b) else b for b in message.content]})


def ends_with_space(message: Message) -> bool:
    """True when ``message`` ends with a text block that ends with whitespace (R5, for a final one)."""
    last = message.content[-1] if message.content else None
    return last is not None and last.type == "text" and last.text != last.text.rstrip()


_BLOCK_TYPES = (TextBlock, ThinkingBlock, RedactedThinkingBlock, ToolUseBlock, ToolResultBlock, ProviderBlock)


def _listed(messages: object) -> list[object] | None:
    """``messages`` as a new list, or None when it is not a collection of messages at all."""
    if isinstance(messages, str | bytes | dict | Message) or not isinstance(messages, Iterable):
        return None
    return list(messages)


def as_messages(messages: object) -> tuple[list[Message], list[str]]:
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
