"""Anthropic Messages API: request building, event mapping and the `AnthropicModel`.

Wire reference: WIRE.md §1. Server-tool blocks (``server_tool_use``,
``web_search_tool_result`` and the other ``*_tool_result`` blocks) are run by
Anthropic itself and need no client result: each becomes a `ProviderBlock`, kept in
the transcript and sent back as it came (a call with its result), so that the model
sees its searches in later turns, and a ``pause_turn`` response is continued as the
API asks, with the paused call in it.
"""

from __future__ import annotations

import json
from collections.abc import AsyncIterator, Callable, Mapping, Sequence
from typing import Any

import httpx

from .._abort import AbortSignal
from .._errors import PromptTooLongError, ProviderError, ProviderStreamError, StreamProtocolError
from .._messages import (
    Block,
    ProviderBlock,
    RedactedThinkingBlock,
    TextBlock,
    ThinkingBlock,
    ToolResultBlock,
    ToolUseBlock,
)
from .._model import (
    ModelRequest,
    StreamBlockStop,
    StreamEnd,
    StreamEvent,
    StreamProviderBlock,
    StreamRedactedThinking,
    StreamSignature,
    StreamText,
    StreamThinking,
    StreamToolInput,
    StreamToolUseStart,
    StreamUsage,
    Usage,
)
from .._tools import safe_name
from ._driver import Prepared, Turn, count_tokens, excerpt, loads, run_stream, turns
from ._http import (
    Connection,
    HTTPModel,
    check_headers,
    merge_headers,
    missing_key,
    prompt_too_long,
    resolve_key,
)
from ._sse import ServerSentEvent

__all__ = ["AnthropicModel", "build_request"]

_RETRYABLE_ERRORS = frozenset({"overloaded_error", "api_error", "rate_limit_error", "timeout_error"})
_TOOL_CHOICE = {"auto": {"type": "auto"}, "any": {"type": "any"}, "none": {"type": "none"}}


# -- request ------------------------------------------------------------------


def build_request(
    request: ModelRequest,
    *,
    model: str,
    max_tokens: int,
    thinking: dict[str, Any] | None,
    extra_tools: Sequence[Mapping[str, Any]] = (),
    interleaved: bool = False,
) -> dict[str, Any]:
    """The JSON body of a streamed Messages request for ``request``.

    ``max_tokens`` that does not exceed the thinking budget gets the budget added: the API
    refuses such a request ("`max_tokens` must be greater than `thinking.budget_tokens`"),
    and thinking counts against ``max_tokens``, so the budget comes on top of the answer.
    Not with ``interleaved`` thinking (its beta header), whose budget is that of the whole
    assistant turn and may exceed ``max_tokens``.
    ``extra_tools`` are declared as they are, after the request's tools; one of them replaces
    the request's tool of the same name (two tools of one name are refused).
    """
    limit = request.max_tokens or max_tokens
    budget = thinking.get("budget_tokens") if thinking is not None and thinking.get("type") == "enabled" else None
    if type(budget) is int and limit <= budget and not interleaved:
        limit += budget
    body: dict[str, Any] = {
        "model": model,
        "max_tokens": limit,
        "messages": [
            {"role": role, "content": [_block(b) for b in blocks]}
            for role, blocks in _fit(turns(request.messages, foreign=_foreign, provider="anthropic"))
        ],
        "stream": True,
    }
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
    if thinking is not None:
        body["thinking"] = thinking
    return body


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
            if kind in _SERVER_CALLS:
                calls.add(b.data.get("id"))
            elif isinstance(kind, str) and kind.endswith("_tool_result"):
                results.add(b.data.get("tool_use_id"))
    if calls == results or (paused and results <= calls):
        return blocks
    out: list[Block] = []
    for b in blocks:
        if type(b) is ProviderBlock:
            kind = b.data.get("type")
            if kind in _SERVER_CALLS:
                if not paused and b.data.get("id") not in results:
                    continue
            elif isinstance(kind, str) and kind.endswith("_tool_result") and b.data.get("tool_use_id") not in calls:
                continue
        out.append(b)
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
    if isinstance(block, ProviderBlock):
        return block.data  # as the server sent it
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


# -- stream -------------------------------------------------------------------


class AnthropicMapper:
    """Maps Messages stream events to `StreamEvent`s (dispatch on the JSON ``type``;
    the ``event:`` line is not needed). Terminator: ``message_stop``."""

    __slots__ = (
        "_blocks",
        "_counts",
        "_server",
        "_stop_reason",
        "_usage",
        "_whole",
        "done",
        "request_id",
        "response_id",
        "terminator",
    )

    def __init__(self, request_id: str | None = None) -> None:
        self.request_id = request_id
        self.done = False
        self.terminator = "message_stop"
        self.response_id: str | None = None
        # The type of each block started, by index; "" for one not mapped as it streams.
        self._blocks: dict[int, str] = {}
        # The server-tool blocks being streamed, by index: the block, and its input's JSON parts.
        self._server: dict[int, tuple[dict[str, Any], list[str]]] = {}
        # A tool call's input given whole in its content_block_start (a proxy's), by index: its
        # input unless input_json_delta streams one, as in the official SDK.
        self._whole: dict[int, str] = {}
        self._stop_reason: str | None = None
        self._usage = Usage()
        # The wire's counts so far: input (the uncached part), output, cache read, cache written.
        self._counts = (0, 0, 0, 0)

    def handle(self, sse: ServerSentEvent) -> Sequence[StreamEvent] | None:
        """Map one SSE event. Raises `StreamProtocolError` for malformed data and
        `ProviderStreamError` for an ``error`` event."""
        try:
            obj = loads(sse.data)
        except ValueError as exc:
            if sse.event == "ping":
                return None  # a keep-alive, whatever it carries (the SDK reads no ping either)
            if sse.event == "error":  # the server's error, in words: its message
                raise self._error({"type": "error", "error": {"message": sse.data}}) from None
            raise StreamProtocolError(
                f"anthropic stream: malformed JSON in {sse.event or 'data'} event: {exc}; data: {excerpt(sse.data)!r}",
                retryable=True,
            ) from None
        kind = obj.get("type") if isinstance(obj, dict) else None
        if kind is None:
            kind = sse.event
        try:
            if kind == "content_block_delta":
                return self._delta(obj)
            if sse.event == "error" or kind == "error":
                raise self._error(obj)
            handler = _HANDLERS.get(kind)  # type: ignore[arg-type]
            return None if handler is None else handler(self, obj)
        except (KeyError, TypeError, AttributeError) as exc:
            raise StreamProtocolError(
                f"anthropic stream: malformed {kind} event ({type(exc).__name__}: {exc})", retryable=True
            ) from None

    def _delta(self, obj: dict[str, Any]) -> Sequence[StreamEvent] | None:
        index = _index(obj)
        block = self._blocks.get(index)
        if not block:
            if block is None:
                raise _out_of_place(f"a content_block_delta for block {index}, which no content_block_start began")
            kept = self._server.get(index)
            if kept is not None and obj["delta"]["type"] == "input_json_delta":  # a server tool call's input
                kept[1].append(obj["delta"]["partial_json"])
            return None  # a skipped block's, or a server-tool block's (whole at its content_block_stop)
        delta = obj["delta"]
        dt = delta["type"]
        if dt == "text_delta":
            if block != "text":
                raise _wrong_block(dt, block, index)
            return (StreamText(index, delta["text"]),)
        if dt == "input_json_delta":
            if block != "tool_use":
                raise _wrong_block(dt, block, index)
            part = delta["partial_json"]
            if not part:
                return None
            if self._whole:
                self._whole.pop(index, None)
            return (StreamToolInput(index, part),)
        if dt == "thinking_delta" or dt == "signature_delta":
            if block != "thinking":
                raise _wrong_block(dt, block, index)
            if dt == "thinking_delta":
                return (StreamThinking(index, delta["thinking"]),)
            return (StreamSignature(index, delta["signature"]),)
        return None  # citations_delta and future delta types

    def _message_start(self, obj: dict[str, Any]) -> Sequence[StreamEvent] | None:
        message = obj["message"]
        self.response_id = message.get("id")
        usage = message.get("usage")
        if usage:
            self._count(usage)
            return (StreamUsage(self._usage),)
        return None

    def _block_start(self, obj: dict[str, Any]) -> Sequence[StreamEvent] | None:
        index, block = _index(obj), obj["content_block"]
        bt = block["type"]
        if index in self._blocks:  # the text or the call already there would be mixed with this one's
            raise _out_of_place(f"a content_block_start for block {index}, which had begun already")
        self._blocks[index] = bt if bt in _MAPPED else ""
        if bt == "text":
            return (StreamText(index, block["text"]),) if block.get("text") else None
        if bt == "thinking":
            whole: list[StreamEvent] = []
            if block.get("thinking"):
                whole.append(StreamThinking(index, block["thinking"]))
            if block.get("signature"):  # a proxy that sends the whole block up front
                whole.append(StreamSignature(index, block["signature"]))
            return whole
        if bt == "redacted_thinking":
            return (StreamRedactedThinking(index, block["data"]),)
        if bt == "tool_use":
            if block.get("input"):  # a proxy that sends the whole input up front: given at the block's end
                self._whole[index] = json.dumps(block["input"])
            return (StreamToolUseStart(index, block["id"], block["name"]),)
        if bt in _SERVER_CALLS or (bt.endswith("_tool_result") and bt != "tool_result"):
            self._server[index] = (block, [])  # given whole at its content_block_stop
        return None  # future block types: skipped

    def _block_stop(self, obj: dict[str, Any]) -> Sequence[StreamEvent] | None:
        index = _index(obj)
        if self._blocks.get(index):
            whole = self._whole.pop(index, None) if self._whole else None
            return (StreamBlockStop(index),) if whole is None else (StreamToolInput(index, whole), StreamBlockStop(index))
        kept = self._server.pop(index, None)
        return None if kept is None else _server_block(index, *kept)

    def _message_delta(self, obj: dict[str, Any]) -> Sequence[StreamEvent] | None:
        reason = obj.get("delta", {}).get("stop_reason")
        if reason is not None:
            self._stop_reason = reason
        usage = obj.get("usage")
        if usage:
            self._count(usage)
        return None

    def _count(self, raw: dict[str, Any]) -> None:
        """Take the counts of a usage object. They are cumulative: present fields replace old ones.
        Anthropic's ``input_tokens`` is only the prompt after the last cache breakpoint; the
        `Usage` counts the whole prompt, cached part included, as OpenAI's do."""
        fresh, output, read, write = self._counts
        self._counts = counts = (
            count_tokens(raw.get("input_tokens"), fresh),
            count_tokens(raw.get("output_tokens"), output),
            count_tokens(raw.get("cache_read_input_tokens"), read),
            count_tokens(raw.get("cache_creation_input_tokens"), write),
        )
        fresh, output, read, write = counts
        self._usage = Usage(fresh + read + write, output, read, write)

    def _message_stop(self, obj: dict[str, Any]) -> Sequence[StreamEvent] | None:
        self.done = True
        end = StreamEnd(self._stop_reason, self._usage, self.response_id)
        if self._whole:  # a call whose content_block_stop never came
            return [*(StreamToolInput(index, whole) for index, whole in self._whole.items()), end]
        return (end,)

    def _error(self, obj: Any) -> ProviderError:
        err = obj.get("error") if isinstance(obj, dict) else None
        if not isinstance(err, dict):
            err = {}
        kind = err.get("type")
        message = err.get("message") or "stream error"
        request_id = obj.get("request_id") if isinstance(obj, dict) else None
        too_long = prompt_too_long(message)
        cls = PromptTooLongError if too_long else ProviderStreamError
        return cls(
            f"anthropic stream error ({kind}): {message}" if kind else f"anthropic stream error: {message}",
            provider="anthropic",
            status=200,
            body=obj,
            request_id=request_id or self.request_id,
            error_type=kind,
            retryable=not too_long and kind in _RETRYABLE_ERRORS,
        )


def _index(obj: dict[str, Any]) -> int:
    """The event's content-block ``index``; raises `StreamProtocolError` unless it is an int
    (a str, null, float or bool would be taken for another block, or break their order)."""
    index = obj["index"]
    if type(index) is not int:
        raise StreamProtocolError(
            f"anthropic stream: malformed {obj.get('type')} event: its index is "
            f"{type(index).__name__}, not an int: {excerpt(repr(index))}",
            retryable=True,
        )
    return index


def _server_block(index: int, block: dict[str, Any], parts: list[str]) -> Sequence[StreamEvent] | None:
    """The server-tool block begun as ``block``, its input (a call's) joined from ``parts``.
    None when that input is not a JSON object (output cut inside it): the block could not
    be sent back, and its result, if any, is then left out of requests too."""
    text = "".join(parts)
    if text.strip():
        try:
            value = loads(text)
        except ValueError:
            return None
        if type(value) is not dict:
            return None
        block = {**block, "input": value}
    return (StreamProviderBlock(index, "anthropic", block),)


def _out_of_place(what: str) -> StreamProtocolError:
    return StreamProtocolError(f"anthropic stream: {what}", retryable=True)


def _wrong_block(delta: str, block: str, index: int) -> StreamProtocolError:
    """A delta sent to a block of another type: mapped, it would put thinking into the answer,
    text into a tool call's input, or JSON into the text."""
    return _out_of_place(f"{delta} for block {index}, which is a {block} block")


#: The block types mapped to the message as they stream; server-tool blocks are given whole at
#: their end, and future types are skipped.
_MAPPED = frozenset({"text", "thinking", "redacted_thinking", "tool_use"})

#: The server-tool calls (each answered by a ``*_tool_result`` block of the server's, by ``id``).
_SERVER_CALLS = frozenset({"server_tool_use", "mcp_tool_use"})


_Handler = Callable[[AnthropicMapper, dict[str, Any]], Sequence[StreamEvent] | None]
_HANDLERS: dict[str, _Handler] = {
    "message_start": AnthropicMapper._message_start,
    "content_block_start": AnthropicMapper._block_start,
    "content_block_stop": AnthropicMapper._block_stop,
    "message_delta": AnthropicMapper._message_delta,
    "message_stop": AnthropicMapper._message_stop,
}


# -- model --------------------------------------------------------------------


class AnthropicModel(HTTPModel):
    """A `Model` backed by the Anthropic Messages API (streaming).

    ``api_key`` defaults to ``ANTHROPIC_API_KEY`` (a missing key raises
    `ModelError` when a request is made). ``thinking``: a Messages ``thinking``
    object, or an int budget for ``{"type": "enabled", "budget_tokens": n}``.
    ``auth_header``: ``"x-api-key"`` or ``"authorization"`` (Bearer).
    ``extra_tools``: tool definitions declared as they are after the engine's tools:
    Anthropic's server tools (``{"type": "web_search_20250305", "name": "web_search"}``),
    or an Anthropic-defined client tool (``{"type": "bash_20250124", "name": "bash"}``),
    which replaces the declaration of the engine's tool of the same name (that tool runs it).
    ``extra_body`` is merged into every request body.
    Errors: the `ProviderError` tree, `StreamProtocolError`, `AbortError`.
    """

    def __init__(
        self,
        model: str,
        *,
        api_key: str | None = None,
        base_url: str | None = None,
        http_client: httpx.AsyncClient | None = None,
        max_tokens: int = 4096,
        thinking: dict[str, Any] | int | None = None,
        auth_header: str = "x-api-key",
        anthropic_version: str = "2023-06-01",
        extra_headers: dict[str, str] | None = None,
        extra_body: dict[str, Any] | None = None,
        extra_tools: Sequence[Mapping[str, Any]] = (),
    ) -> None:
        self.model = model
        self.max_tokens = max_tokens
        self.thinking = (
            {"type": "enabled", "budget_tokens": thinking} if isinstance(thinking, int) else thinking
        )
        self.auth_header = auth_header.lower()
        self.anthropic_version = anthropic_version
        self.extra_headers = check_headers(extra_headers)
        self.extra_body = dict(extra_body or {})
        self.extra_tools = [dict(t) for t in extra_tools]
        self._conn = Connection(
            "anthropic",
            base_url or "https://api.anthropic.com",
            secret=resolve_key(api_key, "ANTHROPIC_API_KEY"),
            http_client=http_client,
            request_id_header="request-id",
        )

    def stream(self, request: ModelRequest, signal: AbortSignal) -> AsyncIterator[StreamEvent]:
        """Stream one response; see `agentloop.models.Model`."""
        return run_stream(self._conn, lambda: self._prepare(request), AnthropicMapper, signal)

    def _prepare(self, request: ModelRequest) -> Prepared:
        secret = self._conn.secret
        hosts = self._conn.host_sets(self.auth_header)  # the host's own client carries the credential
        if secret is None and not hosts:
            raise missing_key("anthropic", "ANTHROPIC_API_KEY")
        headers = {
            "anthropic-version": self.anthropic_version,
            "content-type": "application/json",
            "accept": "text/event-stream",
        }
        if secret is not None and not hosts:
            key = secret.reveal()
            headers[self.auth_header] = f"Bearer {key}" if self.auth_header == "authorization" else key
        headers = merge_headers(headers, self.extra_headers)  # the host's own header wins, alone
        beta = next((v for k, v in headers.items() if k.lower() == "anthropic-beta"), "")
        body = build_request(
            request,
            model=self.model,
            max_tokens=self.max_tokens,
            thinking=self.thinking,
            extra_tools=self.extra_tools,
            interleaved="interleaved-thinking" in beta,
        )
        body.update(self.extra_body)
        return "/v1/messages", headers, body
