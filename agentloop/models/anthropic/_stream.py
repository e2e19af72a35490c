"""The Messages event stream mapped to `StreamEvent`s (WIRE.md §1), and its errors.

Server-tool blocks (``server_tool_use``, ``web_search_tool_result`` and the other
``*_tool_result`` blocks) are run by Anthropic itself and need no client result; they are
skipped here (and their deltas) safely, so the text around them is kept but the blocks are
not replayed. An ``error`` event becomes `ProviderStreamError` (or `PromptTooLongError`).
"""

from __future__ import annotations

import json
from collections.abc import Callable, Sequence
from typing import Any

from ..._errors import PromptTooLongError, ProviderError, ProviderStreamError, StreamProtocolError
from ..._model import (
    StreamBlockStop,
    StreamEnd,
    StreamEvent,
    StreamRedactedThinking,
    StreamSignature,
    StreamText,
    StreamThinking,
    StreamToolInput,
    StreamToolUseStart,
    StreamUsage,
    Usage,
)
from .._driver import count_tokens, excerpt, loads
from .._http._errors import prompt_too_long
from .._sse import ServerSentEvent

_RETRYABLE_ERRORS = frozenset({"overloaded_error", "api_error", "rate_limit_error", "timeout_error"})


class AnthropicMapper:
    """Maps Messages stream events to `StreamEvent`s (dispatch on the JSON ``type``;
    the ``event:`` line is not needed). Terminator: ``message_stop``."""

    __slots__ = ("_blocks", "_stop_reason", "_usage", "done", "request_id", "response_id", "terminator")

    def __init__(self, request_id: str | None = None) -> None:
        self.request_id = request_id
        self.done = False
        self.terminator = "message_stop"
        self.response_id: str | None = None
        # The type of each block started, by index; "" for one skipped (server-tool blocks).
        self._blocks: dict[int, str] = {}
        self._stop_reason: str | None = None
        self._usage = Usage()

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
            return None  # a skipped block's
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
            return (StreamToolInput(index, part),) if part else None
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
            self._usage = _usage(usage, self._usage)
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
            return (StreamThinking(index, block["thinking"]),) if block.get("thinking") else None
        if bt == "redacted_thinking":
            return (StreamRedactedThinking(index, block["data"]),)
        if bt == "tool_use":
            start: list[StreamEvent] = [StreamToolUseStart(index, block["id"], block["name"])]
            if block.get("input"):  # a proxy that sends the whole input up front
                start.append(StreamToolInput(index, json.dumps(block["input"])))
            return start
        return None  # server-tool blocks and future types: skipped (see module docstring)

    def _block_stop(self, obj: dict[str, Any]) -> Sequence[StreamEvent] | None:
        index = _index(obj)
        return (StreamBlockStop(index),) if self._blocks.get(index) else None

    def _message_delta(self, obj: dict[str, Any]) -> Sequence[StreamEvent] | None:
        reason = obj.get("delta", {}).get("stop_reason")
        if reason is not None:
            self._stop_reason = reason
        usage = obj.get("usage")
        if usage:
            self._usage = _usage(usage, self._usage)
        return None

    def _message_stop(self, obj: dict[str, Any]) -> Sequence[StreamEvent] | None:
        self.done = True
        return (StreamEnd(self._stop_reason, self._usage, self.response_id),)

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


def _usage(raw: dict[str, Any], old: Usage) -> Usage:
    """Anthropic usage counts are cumulative: present fields replace old ones."""
    return Usage(
        count_tokens(raw.get("input_tokens"), old.input_tokens),
        count_tokens(raw.get("output_tokens"), old.output_tokens),
        count_tokens(raw.get("cache_read_input_tokens"), old.cache_read_tokens),
        count_tokens(raw.get("cache_creation_input_tokens"), old.cache_write_tokens),
    )


def _out_of_place(what: str) -> StreamProtocolError:
    return StreamProtocolError(f"anthropic stream: {what}", retryable=True)


def _wrong_block(delta: str, block: str, index: int) -> StreamProtocolError:
    """A delta sent to a block of another type: mapped, it would put thinking into the answer,
    text into a tool call's input, or JSON into the text."""
    return _out_of_place(f"{delta} for block {index}, which is a {block} block")


#: The block types mapped to the message; the others (server-tool blocks, future types) are skipped.
_MAPPED = frozenset({"text", "thinking", "redacted_thinking", "tool_use"})


_Handler = Callable[[AnthropicMapper, dict[str, Any]], Sequence[StreamEvent] | None]
_HANDLERS: dict[str, _Handler] = {
    "message_start": AnthropicMapper._message_start,
    "content_block_start": AnthropicMapper._block_start,
    "content_block_stop": AnthropicMapper._block_stop,
    "message_delta": AnthropicMapper._message_delta,
    "message_stop": AnthropicMapper._message_stop,
}
