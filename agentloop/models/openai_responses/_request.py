"""The Responses request body: a transcript mapped to input items (WIRE.md §3).

Reasoning items round-trip through `ThinkingBlock.signature`, which holds the JSON ``{"id",
"summary", "content"?, "encrypted_content"?}`` of the item; thinking blocks whose
signature is not such JSON (from another provider) are not sent, nor is a reasoning item the
API would refuse (one not followed by its message or call, one without encrypted content when
nothing is stored, one another Responses server made: its `ThinkingBlock.origin` is not this
one's).
"""

from __future__ import annotations

from collections.abc import Callable
from functools import partial
from typing import Any

from ..._jsondepth import loads
from ..._messages import TextBlock, ThinkingBlock, ToolResultBlock, ToolUseBlock
from ..._model import ModelRequest
from ..._tools import safe_name
from .._compat import check_tool_names, strict_schema
from .._driver import OPENAI_TOOL_CHOICES, dumps_input, made_elsewhere, result_text, turns, wire_id, wire_ids


def build_request(
    request: ModelRequest, *, model: str, stored: bool = True, strict_tools: bool = False, origin: str | None = None
) -> dict[str, Any]:
    """The JSON body (without ``stream`` and options) of a Responses request.

    ``stored=False`` (the request says ``store: false``): a reasoning item is sent only
    with its encrypted content, since the server keeps nothing to look its id up by (it
    would answer every request with "Item with id 'rs_...' not found").
    ``strict_tools``: tools are declared ``strict``, their schemas made so (`strict_schema`).
    ``origin``: the server's (`origin_of`); a reasoning item whose block has another origin
    (OpenAI's, sent to xAI) is not sent, since its encrypted content and id mean nothing there.
    Raises `ModelError` for a tool name the API refuses or a schema that cannot be strict.
    """
    check_tool_names("openai", request.tools)
    items: list[dict[str, Any]] = []
    ids = wire_ids(partial(wire_id, max_len=64), max_len=64, safe_chars=False)
    for role, blocks in turns(request.messages):
        made = (_item(role, b, stored, origin, ids) for b in blocks)
        turn = [item for item in made if item is not None]
        items.extend(_followed(turn) if role == "assistant" else turn)
    body: dict[str, Any] = {"model": model, "input": items}
    if request.system:
        body["instructions"] = request.system
    if request.tools:
        body["tools"] = [
            {
                "type": "function",
                "name": t.name,
                "description": t.description,
                "parameters": strict_schema(t.name, t.input_schema) if strict_tools else dict(t.input_schema),
                "strict": strict_tools,
            }
            for t in request.tools
        ]
    choice = request.tool_choice
    if choice is not None:  # a tool name, in the Responses shape (Chat Completions nests it in "function")
        body["tool_choice"] = OPENAI_TOOL_CHOICES.get(choice) or {"type": "function", "name": choice}
    if request.max_tokens:
        body["max_output_tokens"] = request.max_tokens
    return body


def _followed(turn: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """An assistant turn's items without the reasoning items not directly followed by a
    message or function call.

    The API refuses a reasoning item "without its required following item". One can lose
    it: a cut stream leaves it last in its turn, and a hosted tool item that followed it
    (``web_search_call`` and the like) is not kept in the transcript, so it is followed by
    the next reasoning item instead. The transcript keeps such items; they are not sent.
    """
    if not any(item["type"] == "reasoning" for item in turn):
        return turn
    return [
        item
        for item, after in zip(turn, [*turn[1:], None], strict=True)
        if item["type"] != "reasoning" or (after is not None and after["type"] in ("message", "function_call"))
    ]


def _item(role: str, block: Any, stored: bool, origin: str | None, ids: Callable[[str], str]) -> dict[str, Any] | None:
    if isinstance(block, TextBlock):
        return {"type": "message", "role": role, "content": block.text}
    if isinstance(block, ToolResultBlock):
        return {
            "type": "function_call_output",
            "call_id": ids(block.tool_use_id),
            "output": result_text(block, mark_error=True),
        }
    if isinstance(block, ToolUseBlock):
        return {"type": "function_call", "call_id": ids(block.id), "name": safe_name(block.name),
                "arguments": dumps_input(block.input)}  # fmt: skip
    if isinstance(block, ThinkingBlock):
        return _reasoning_item(block, stored, origin)
    return None  # redacted thinking (Anthropic only)


def _reasoning_item(block: ThinkingBlock, stored: bool, origin: str | None) -> dict[str, Any] | None:
    if made_elsewhere(block.origin, origin):
        return None  # another Responses server's (one of unknown origin goes as before)
    try:
        saved = loads(block.signature)
    except ValueError:  # not JSON, or nested more than MAX_JSON_DEPTH levels
        return None
    if not isinstance(saved, dict) or not isinstance(saved.get("id"), str):
        return None
    summary = saved.get("summary")
    if summary is None:
        summary = [{"type": "summary_text", "text": block.thinking}] if block.thinking else []
    item: dict[str, Any] = {"type": "reasoning", "id": saved["id"], "summary": summary}
    if saved.get("content"):
        item["content"] = saved["content"]
    if saved.get("encrypted_content"):
        item["encrypted_content"] = saved["encrypted_content"]
    elif not stored:
        return None  # nothing to look the id up by
    return item
