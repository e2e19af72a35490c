"""The Chat Completions request body: a transcript mapped to the wire (WIRE.md §2).

Tool results become ``tool`` messages, an assistant turn one message with its text and tool
calls (its thinking only as ``reasoning_content``, for the servers that want it back, and what
a server asked to have back, ``extra_content`` and ``reasoning_details``, only to that server),
and ids are fitted to the 40 characters the API takes.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from functools import partial
from typing import Any, NamedTuple

from ..._jsondepth import loads
from ..._messages import TextBlock, ThinkingBlock, ToolResultBlock, ToolUseBlock
from ..._model import ModelRequest, ToolSpec
from ..._tools import safe_name
from .._compat import check_tool_names, short_ids, strict_schema
from .._driver import OPENAI_TOOL_CHOICES, dumps_input, made_elsewhere, result_text, turns, wire_id, wire_ids

#: The ``type`` of the JSON signature of a thinking block that holds a tool call's
#: ``extra_content`` (``{"type": "extra_content", "call": <id>, "extra_content": {...}}``, the
#: block's `ThinkingBlock.origin` the server that sent it): no thinking, and JSON, so the
#: Anthropic and Responses adapters never send it either; nor does this one to another origin
#: (Mistral's API refuses a field it does not know). One saved before the origin was kept
#: names the server's host in the JSON (``"host"``), and goes back to that host only.
EXTRA_CONTENT = "extra_content"
#: Likewise for OpenRouter's ``reasoning_details`` of a response (``{"type": "reasoning_details",
#: "reasoning_details": [...]}``), which go back on its assistant message.
REASONING_DETAILS = "reasoning_details"
#: Gemini's OpenAI-compatible endpoint, which holds tool names to a stricter rule.
GEMINI_HOST = "generativelanguage.googleapis.com"
_KEPT_PREFIXES = ('{"type":"extra_content",', '{"type":"reasoning_details",')


def build_request(
    request: ModelRequest,
    *,
    model: str,
    echo_reasoning: bool = False,
    host: str | None = None,
    short_tool_ids: bool = False,
    strict_tools: bool = False,
    origin: str | None = None,
) -> dict[str, Any]:
    """The JSON body (without stream options) of a Chat Completions request.

    ``echo_reasoning``: an assistant message with tool calls carries its turn's thinking
    as ``reasoning_content`` (``""`` when there was none), as DeepSeek and Kimi require.
    ``origin``: the server's (`origin_of`); what a server asked to have back (a tool call's
    ``extra_content``, `EXTRA_CONTENT`; `REASONING_DETAILS`) goes back only to the origin that
    sent it (None: whatever server sent it). ``host``: the server's host, for a block saved
    before its origin was kept, which names the host only (and for Gemini's tool-name rule).
    ``short_tool_ids``: tool call ids go as nine letters or digits (`short_ids`), as Mistral
    wants them. ``strict_tools``: tools are declared ``strict`` (`strict_schema`).
    Raises `ModelError` for a tool name the server refuses (Gemini's rule on its host), or a
    schema that cannot be strict.
    """
    check_tool_names("openai", request.tools, gemini=host == GEMINI_HOST)
    ids: Callable[[str], str] = short_ids() if short_tool_ids else wire_ids(partial(wire_id, max_len=40), max_len=40, safe_chars=False)
    messages: list[dict[str, Any]] = []
    if request.system:
        messages.append({"role": "system", "content": request.system})
    for role, blocks in turns(request.messages):
        if role == "assistant":
            messages.extend(_assistant(blocks, echo_reasoning, _Server(origin, host), ids))
            continue
        texts: list[str] = []
        for b in blocks:
            if isinstance(b, ToolResultBlock):
                messages.append(
                    {
                        "role": "tool",
                        "tool_call_id": ids(b.tool_use_id),
                        "content": result_text(b, mark_error=True),
                    }
                )
            elif isinstance(b, TextBlock):
                texts.append(b.text)
        if texts:
            messages.append({"role": "user", "content": "\n\n".join(texts)})
    body: dict[str, Any] = {"model": model, "messages": messages}
    if request.tools:
        body["tools"] = [{"type": "function", "function": _function(t, strict_tools)} for t in request.tools]
    choice = request.tool_choice
    if choice is not None:  # a tool name, in Chat Completions' shape (Responses names it flat)
        body["tool_choice"] = OPENAI_TOOL_CHOICES.get(choice) or {"type": "function", "function": {"name": choice}}
    return body


def _function(tool: ToolSpec, strict: bool) -> dict[str, Any]:
    if not strict:
        return {"name": tool.name, "description": tool.description, "parameters": dict(tool.input_schema)}
    params = strict_schema(tool.name, tool.input_schema)
    return {"name": tool.name, "description": tool.description, "parameters": params, "strict": True}


def _assistant(
    blocks: Sequence[Any], echo_reasoning: bool, server: _Server, ids: Callable[[str], str]
) -> list[dict[str, Any]]:
    text = "".join(b.text for b in blocks if isinstance(b, TextBlock))
    extras, details = _kept(blocks, server)
    calls = []
    for b in blocks:
        if isinstance(b, ToolUseBlock):
            call = {"id": ids(b.id), "type": "function",
                    "function": {"name": safe_name(b.name), "arguments": dumps_input(b.input)}}  # fmt: skip
            extra = extras.get(b.id) if extras else None
            if extra is not None:
                call["extra_content"] = extra
            calls.append(call)
    if not text and not calls:
        return []  # thinking only: not sent to Chat Completions
    msg: dict[str, Any] = {"role": "assistant", "content": text or None}
    if details:
        msg[REASONING_DETAILS] = details
    if calls:
        msg["tool_calls"] = calls
        if echo_reasoning:
            # Required on a tool-call turn, even empty; a turn without calls may leave it out,
            # and does (a server that does not take the field is then spared it).
            msg["reasoning_content"] = "".join(b.thinking for b in blocks if isinstance(b, ThinkingBlock))
    return [msg]


class _Server(NamedTuple):
    """The server a request goes to: its origin (`origin_of`) and its host (None: unknown)."""

    origin: str | None
    host: str | None

    def made(self, block: ThinkingBlock, kept: dict[str, Any]) -> bool:
        """Whether this server made ``block`` (its JSON ``kept``): its `ThinkingBlock.origin` is
        this origin; or, for a block saved before the origin was kept (none recorded), the
        host its JSON names is this host, as then. Unknown on this side: any server did."""
        if block.origin is not None:
            return not made_elsewhere(block.origin, self.origin)
        return self.host is None or kept.get("host") == self.host


def _kept(blocks: Sequence[Any], server: _Server) -> tuple[dict[str, Any], list[Any]]:
    """What the turn's thinking blocks keep for ``server`` to have back: the ``extra_content``
    of each tool call id (`EXTRA_CONTENT`), and the ``reasoning_details``
    (`REASONING_DETAILS`)."""
    extras: dict[str, Any] = {}
    details: list[Any] = []
    for b in blocks:
        if isinstance(b, ThinkingBlock) and b.signature.startswith(_KEPT_PREFIXES):
            try:
                kept = loads(b.signature)
            except ValueError:  # not JSON, or nested more than MAX_JSON_DEPTH levels
                continue
            if not isinstance(kept, dict) or not server.made(b, kept):
                continue
            if kept.get("type") == EXTRA_CONTENT and isinstance(kept.get("call"), str):
                extras[kept["call"]] = kept.get(EXTRA_CONTENT)
            elif kept.get("type") == REASONING_DETAILS and isinstance(kept.get(REASONING_DETAILS), list):
                details.extend(kept[REASONING_DETAILS])
    return extras, details
