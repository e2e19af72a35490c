"""The Messages request body: a transcript mapped to the wire (WIRE.md §1).

Turns alternate roles; an assistant turn never ends in thinking, which the API refuses;
thinking another provider made (an OpenAI reasoning item) is not sent; blank tool-result
text is left out.
"""

from __future__ import annotations

from typing import Any

from ..._messages import Block, RedactedThinkingBlock, TextBlock, ThinkingBlock, ToolResultBlock, ToolUseBlock
from ..._model import ModelRequest
from ..._tools import safe_name
from .._driver import Turn, turns

_TOOL_CHOICE = {"auto": {"type": "auto"}, "any": {"type": "any"}, "none": {"type": "none"}}


def build_request(
    request: ModelRequest, *, model: str, max_tokens: int, thinking: dict[str, Any] | None
) -> dict[str, Any]:
    """The JSON body of a streamed Messages request for ``request``.

    ``max_tokens`` that does not exceed the thinking budget gets the budget added: the API
    refuses such a request ("`max_tokens` must be greater than `thinking.budget_tokens`"),
    and thinking counts against ``max_tokens``, so the budget comes on top of the answer.
    """
    limit = request.max_tokens or max_tokens
    budget = thinking.get("budget_tokens") if thinking is not None and thinking.get("type") == "enabled" else None
    if type(budget) is int and limit <= budget:
        limit += budget
    body: dict[str, Any] = {
        "model": model,
        "max_tokens": limit,
        "messages": [
            {"role": role, "content": [_block(b) for b in blocks]}
            for role, blocks in _no_trailing_thinking(turns(request.messages, foreign=_foreign))
        ],
        "stream": True,
    }
    if request.system:
        body["system"] = request.system
    if request.tools:
        body["tools"] = [
            {"name": t.name, "description": t.description, "input_schema": dict(t.input_schema)}
            for t in request.tools
        ]
    if request.tool_choice is not None:
        body["tool_choice"] = _TOOL_CHOICE.get(
            request.tool_choice, {"type": "tool", "name": request.tool_choice}
        )
    if thinking is not None:
        body["thinking"] = thinking
    return body


def _no_trailing_thinking(wire: list[Turn]) -> list[Turn]:
    """``wire`` with no assistant turn ending in thinking, which the API refuses (a stream cut
    right after a thinking block leaves one so). Trailing thinking and redacted-thinking blocks
    are dropped; a turn left empty is dropped, and the user turns on either side are joined
    into one, in order, so that roles still alternate (tool results stay first)."""
    if not any(role == "assistant" and _is_thinking(blocks[-1]) for role, blocks in wire):
        return wire
    out: list[Turn] = []
    for role, blocks in wire:
        if role == "assistant":
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


def _is_thinking(block: Block) -> bool:
    return isinstance(block, ThinkingBlock | RedactedThinkingBlock)


def _foreign(block: ThinkingBlock) -> bool:
    """Thinking another provider made: an OpenAI reasoning item is kept as a JSON object in
    the signature (an Anthropic signature is base64). Sent back, it would fail every request
    with "Invalid `signature` in `thinking` block"."""
    return block.signature.startswith("{")


def _block(block: Block) -> dict[str, Any]:
    if isinstance(block, TextBlock):
        return {"type": "text", "text": block.text}
    if isinstance(block, ThinkingBlock):
        return {"type": "thinking", "thinking": block.thinking, "signature": block.signature}
    if isinstance(block, RedactedThinkingBlock):
        return {"type": "redacted_thinking", "data": block.data}
    if isinstance(block, ToolUseBlock):
        return {"type": "tool_use", "id": safe_name(block.id), "name": safe_name(block.name), "input": block.input}
    assert isinstance(block, ToolResultBlock)
    out: dict[str, Any] = {"type": "tool_result", "tool_use_id": safe_name(block.tool_use_id)}
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
