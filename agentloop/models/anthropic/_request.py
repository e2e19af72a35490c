"""The Messages request body: a transcript mapped to the wire (WIRE.md §1).

Turns alternate roles; an assistant turn never ends in thinking, which the API refuses, and a
server tool call goes with its result; thinking another provider made (an OpenAI reasoning
item), or another Anthropic-compatible server (`ThinkingBlock.origin`), is not sent; blank
tool-result text is left out; ``extra_tools`` are declared as given.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from functools import partial
from typing import Any

from ..._messages import (
    Block,
    Message,
    ProviderBlock,
    RedactedThinkingBlock,
    TextBlock,
    ThinkingBlock,
    ToolResultBlock,
    ToolUseBlock,
)
from ..._model import ModelRequest
from ..._tools import safe_name
from .._compat import check_tool_names
from .._driver import Turn, made_elsewhere, turns, wire_ids

# "required" is OpenAI's word for "any" (as the engine's ``tool_choice`` takes it): never a tool name.
_TOOL_CHOICE = {"auto": {"type": "auto"}, "any": {"type": "any"}, "required": {"type": "any"}, "none": {"type": "none"}}

#: The server-tool calls (each answered by a ``*_tool_result`` block of the server's, by ``id``).
SERVER_CALLS = frozenset({"server_tool_use", "mcp_tool_use"})


def build_request(
    request: ModelRequest,
    *,
    model: str,
    max_tokens: int,
    thinking: dict[str, Any] | None,
    extra_tools: Sequence[Mapping[str, Any]] = (),
    interleaved: bool = False,
    origin: str | None = None,
) -> dict[str, Any]:
    """The JSON body of a streamed Messages request for ``request``.

    ``max_tokens`` that does not exceed the thinking budget gets the budget added: the API
    refuses such a request ("`max_tokens` must be greater than `thinking.budget_tokens`"),
    and thinking counts against ``max_tokens``, so the budget comes on top of the answer.
    Not with ``interleaved`` thinking (its beta header), whose budget is that of the whole
    assistant turn and may exceed ``max_tokens``.
    ``extra_tools`` are declared as they are, after the request's tools; one of them replaces
    the request's tool of the same name (two tools of one name are refused).
    A response that a refusal stopped (marked ``"stop_reason": "refusal"`` in its ``meta``) is
    not sent, nor the results of its tool calls: Anthropic asks that the refused turn be taken
    out of the conversation, which otherwise meets more refusals. The transcript keeps it.
    With thinking on, a request that answers tool results of an assistant turn that does not
    start with thinking (another provider made it) is sent without ``thinking``, and so is one
    whose ``tool_choice`` forces a tool ("any" or a tool's name), which the API does not take
    with thinking.
    Thinking and redacted thinking that a server other than ``origin`` made (their own
    ``origin`` differs) are not sent: only the server that signed them can check them. The
    transcript keeps them; one of unknown origin is sent, as before.
    Raises `ModelError` for a declared tool name the API refuses.
    """
    check_tool_names("anthropic", request.tools)
    limit = request.max_tokens or max_tokens
    budget = thinking.get("budget_tokens") if thinking is not None and thinking.get("type") == "enabled" else None
    if type(budget) is int and limit <= budget and not interleaved:
        limit += budget
    foreign = partial(_foreign, origin=origin)
    ids = wire_ids(safe_name, max_len=64, safe_chars=True)
    messages = [
        {"role": role, "content": [_block(b, ids) for b in blocks]}
        for role, blocks in _fit(turns(_unrefused(request.messages), foreign=foreign, provider="anthropic"))
    ]
    _strip_last(messages)
    body: dict[str, Any] = {"model": model, "max_tokens": limit, "messages": messages, "stream": True}
    if request.system:
        body["system"] = request.system
    if request.tools or extra_tools:
        named = {t.get("name") for t in extra_tools}
        body["tools"] = [
            {"name": t.name, "description": t.description, "input_schema": dict(t.input_schema)}
            for t in request.tools
            if t.name not in named
        ]
        body["tools"] += extra_tools
    if request.tool_choice is not None:
        body["tool_choice"] = _TOOL_CHOICE.get(
            request.tool_choice, {"type": "tool", "name": request.tool_choice}
        )
    forced = body.get("tool_choice", {}).get("type") in ("any", "tool")
    if thinking is not None and not forced and not _unthought_tool_turn(messages):
        body["thinking"] = thinking
    return body


def _strip_last(messages: list[dict[str, Any]]) -> None:
    """The request's last turn, when it is the assistant's (a paused response sent back, a
    host's prefill), without whitespace at the end of its last block if that is text: the API
    refuses it ("final assistant content cannot end with trailing whitespace"). A committed
    response has none, but the thinking `_fit` leaves out after its text can leave it last."""
    if not messages or messages[-1]["role"] != "assistant":
        return
    content = messages[-1]["content"]
    last = content[-1]
    text = last.get("text")
    if last.get("type") == "text" and isinstance(text, str) and text != text.rstrip():
        content[-1] = {**last, "text": text.rstrip()}  # a copy: a `ProviderBlock`'s data is the host's


def _unthought_tool_turn(messages: list[dict[str, Any]]) -> bool:
    """Whether the request answers tool results whose assistant turn does not start with
    thinking (another provider's turn, or one made with thinking off). With thinking on, the
    API refuses it ("a final `assistant` message must start with a thinking block"), so the
    request goes without thinking, as the API's message advises; the next turn has it again."""
    if len(messages) < 2 or not any(b["type"] == "tool_result" for b in messages[-1]["content"]):
        return False
    first = messages[-2]["content"][0]["type"]
    return first not in ("thinking", "redacted_thinking")


def _unrefused(messages: Sequence[Message]) -> Sequence[Message]:
    """``messages`` without the responses a refusal stopped, and without the results of their
    tool calls (a result whose call is not sent is refused); `turns` then joins the user turns
    on either side."""
    if not any(m.role == "assistant" and m.meta.get("stop_reason") == "refusal" for m in messages):
        return messages
    dropped: set[str] = set()
    out: list[Message] = []
    for m in messages:
        if m.role == "assistant" and m.meta.get("stop_reason") == "refusal":
            dropped.update(b.id for b in m.content if isinstance(b, ToolUseBlock))
            continue
        if dropped and m.role == "user" and any(isinstance(b, ToolResultBlock) for b in m.content):
            kept = [b for b in m.content if not (isinstance(b, ToolResultBlock) and b.tool_use_id in dropped)]
            if len(kept) != len(m.content):
                m = m.model_copy(update={"content": kept})
        out.append(m)
    return out


def _fit(wire: list[Turn]) -> list[Turn]:
    """``wire`` as the API accepts its assistant turns. None ends in thinking, which the API
    refuses (a stream cut right after a thinking block leaves one so): trailing thinking and
    redacted-thinking blocks are dropped. A server tool call and its result go together
    (`_paired`). A turn left empty is dropped, and the user turns on either side are joined
    into one, in order, so that roles still alternate (tool results stay first)."""
    if not any(role == "assistant" and _to_fit(blocks) for role, blocks in wire):
        return wire
    out: list[Turn] = []
    last = len(wire) - 1
    for i, (role, blocks) in enumerate(wire):
        if role == "assistant":
            blocks = _paired(blocks, paused=i == last)
            end = len(blocks)
            while end and _is_thinking(blocks[end - 1]):
                end -= 1
            if not end:
                continue
            blocks = blocks[:end]
        if out and out[-1][0] == role:
            joined = out[-1][1] + blocks
            joined.sort(key=lambda b: not isinstance(b, ToolResultBlock))  # stable
            out[-1] = (role, joined)
        else:
            out.append((role, blocks))
    return out


def _to_fit(blocks: list[Block]) -> bool:
    return _is_thinking(blocks[-1]) or any(type(b) is ProviderBlock for b in blocks)


def _paired(blocks: list[Block], *, paused: bool) -> list[Block]:
    """``blocks`` (an assistant turn) without a server tool call whose result is not in the
    turn, nor a result whose call is not: the API refuses either ("`web_search` tool use with
    id ... was found without a corresponding `web_search_tool_result` block"), and a turn cut
    or interrupted between them leaves one alone. The exception is a ``paused`` turn, the
    last message of the request: a ``pause_turn`` response, sent back as it is so that the
    server goes on with its call."""
    calls: set[object] = set()
    results: set[object] = set()
    for b in blocks:
        if type(b) is ProviderBlock:
            kind = b.data.get("type")
            if kind in SERVER_CALLS:
                calls.add(b.data.get("id"))
            elif isinstance(kind, str) and kind.endswith("_tool_result"):
                results.add(b.data.get("tool_use_id"))
    if calls == results or (paused and results <= calls):
        return blocks
    out: list[Block] = []
    for b in blocks:
        if type(b) is ProviderBlock:
            kind = b.data.get("type")
            if kind in SERVER_CALLS:
                if not paused and b.data.get("id") not in results:
                    continue
            elif isinstance(kind, str) and kind.endswith("_tool_result") and b.data.get("tool_use_id") not in calls:
                continue
        out.append(b)
    return out


def _is_thinking(block: Block) -> bool:
    return isinstance(block, ThinkingBlock | RedactedThinkingBlock)


def _foreign(block: ThinkingBlock | RedactedThinkingBlock, *, origin: str | None) -> bool:
    """Thinking another provider made: an OpenAI reasoning item is kept as a JSON object in
    the signature (an Anthropic signature is base64). Or thinking another server made
    (DeepSeek's Anthropic API, then api.anthropic.com): its ``origin`` is not ``origin``.
    Sent back, either would fail every request with "Invalid `signature` in `thinking` block"."""
    if made_elsewhere(block.origin, origin):
        return True
    return isinstance(block, ThinkingBlock) and block.signature.startswith("{")


def _block(block: Block, ids: Callable[[str], str]) -> dict[str, Any]:
    if isinstance(block, TextBlock):
        return {"type": "text", "text": block.text}
    if isinstance(block, ThinkingBlock):
        return {"type": "thinking", "thinking": block.thinking, "signature": block.signature}
    if isinstance(block, RedactedThinkingBlock):
        return {"type": "redacted_thinking", "data": block.data}
    if isinstance(block, ToolUseBlock):
        return {"type": "tool_use", "id": ids(block.id), "name": safe_name(block.name), "input": block.input}
    if isinstance(block, ProviderBlock):
        return block.data  # as the server sent it
    assert isinstance(block, ToolResultBlock)
    out: dict[str, Any] = {"type": "tool_result", "tool_use_id": ids(block.tool_use_id)}
    # Blank text is refused here too ("text content blocks must contain non-whitespace
    # text"); a result with nothing else to say is sent without content, which is allowed.
    if isinstance(block.content, str):
        if block.content.strip():
            out["content"] = block.content
    else:
        parts = [{"type": "text", "text": b.text} for b in block.content if b.text.strip()]
        if parts:
            out["content"] = parts
    if block.is_error:
        out["is_error"] = True
    return out
