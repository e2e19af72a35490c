"""The Chat Completions request body: a transcript mapped to the wire (WIRE.md §2).

Tool results become ``tool`` messages, an assistant turn one message with its text and tool
calls (its thinking only as ``reasoning_content``, for the servers that want it back), and
ids are fitted to the 40 characters the API takes.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from ..._messages import TextBlock, ThinkingBlock, ToolResultBlock, ToolUseBlock
from ..._model import ModelRequest
from ..._tools import safe_name
from .._driver import dumps_input, result_text, turns, wire_id


def build_request(request: ModelRequest, *, model: str, echo_reasoning: bool = False) -> dict[str, Any]:
    """The JSON body (without stream options) of a Chat Completions request.

    ``echo_reasoning``: an assistant message with tool calls carries its turn's thinking
    as ``reasoning_content`` (``""`` when there was none), as DeepSeek and Kimi require.
    """
    messages: list[dict[str, Any]] = []
    if request.system:
        messages.append({"role": "system", "content": request.system})
    for role, blocks in turns(request.messages):
        if role == "assistant":
            messages.extend(_assistant(blocks, echo_reasoning))
            continue
        texts: list[str] = []
        for b in blocks:
            if isinstance(b, ToolResultBlock):
                messages.append(
                    {
                        "role": "tool",
                        "tool_call_id": wire_id(b.tool_use_id, max_len=40),
                        "content": result_text(b, mark_error=True),
                    }
                )
            elif isinstance(b, TextBlock):
                texts.append(b.text)
        if texts:
            messages.append({"role": "user", "content": "\n\n".join(texts)})
    body: dict[str, Any] = {"model": model, "messages": messages}
    if request.tools:
        body["tools"] = [
            {
                "type": "function",
                "function": {
                    "name": t.name,
                    "description": t.description,
                    "parameters": dict(t.input_schema),
                },
            }
            for t in request.tools
        ]
    choice = request.tool_choice
    if choice is not None:
        if choice in ("auto", "none"):
            body["tool_choice"] = choice
        elif choice == "any":
            body["tool_choice"] = "required"
        else:
            body["tool_choice"] = {"type": "function", "function": {"name": choice}}
    return body


def _assistant(blocks: Sequence[Any], echo_reasoning: bool) -> list[dict[str, Any]]:
    text = "".join(b.text for b in blocks if isinstance(b, TextBlock))
    calls = [
        {"id": wire_id(b.id, max_len=40), "type": "function", "function": {"name": safe_name(b.name), "arguments": dumps_input(b.input)}}
        for b in blocks
        if isinstance(b, ToolUseBlock)
    ]
    if not text and not calls:
        return []  # thinking only: not sent to Chat Completions
    msg: dict[str, Any] = {"role": "assistant", "content": text or None}
    if calls:
        msg["tool_calls"] = calls
        if echo_reasoning:
            # Required on a tool-call turn, even empty; a turn without calls may leave it out,
            # and does (a server that does not take the field is then spared it).
            msg["reasoning_content"] = "".join(b.thinking for b in blocks if isinstance(b, ThinkingBlock))
    return [msg]
