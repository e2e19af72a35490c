"""The Messages event stream mapped to `StreamEvent`s (WIRE.md §1), and its errors.

Server-tool blocks (``server_tool_use``, ``web_search_tool_result`` and the other
``*_tool_result`` blocks) are run by Anthropic itself and need no client result: each is
given whole at its ``content_block_stop``, as a `StreamProviderBlock`. An ``error`` event
becomes `ProviderStreamError` (or `PromptTooLongError`), and so does a proxy's failure sent as
bare ``data: {"error": ...}``. The terminator is ``message_stop``, or a body that ends cleanly
after the ``message_delta`` that gives the stop reason (compatible gateways that send none).
"""

from __future__ import annotations

import json
import logging
from collections.abc import Callable, Sequence
from typing import Any

from ..._errors import PromptTooLongError, ProviderError, ProviderStreamError, StreamProtocolError
from ..._model import (
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
from .._driver import UsageReader, count_tokens, excerpt, loads, not_a_str
from .._http._errors import prompt_too_long
from .._http._retry import RETRYABLE_STATUSES
from .._sse import ServerSentEvent
from ._request import SERVER_CALLS

log = logging.getLogger("agentloop")

_RETRYABLE_ERRORS = frozenset({"overloaded_error", "api_error", "rate_limit_error", "timeout_error"})


class AnthropicMapper:
    """Maps Messages stream events to `StreamEvent`s (dispatch on the JSON ``type``;
    the ``event:`` line is not needed). Terminator: ``message_stop``. ``origin``: the
    server streaming (`origin_of`), given to each thinking block it signs."""

    __slots__ = (
        "_again",
        "_blocks",
        "_counts",
        "_latest",
        "_moved",
        "_open",
        "_rewarned",
        "_server",
        "_shift",
        "_since",
        "_stop_reason",
        "_usage",
        "_usage_read",
        "_whole",
        "done",
        "origin",
        "request_id",
        "response_id",
        "settled",
        "terminator",
    )

    def __init__(self, request_id: str | None = None, origin: str | None = None) -> None:
        self.request_id = request_id
        self.origin = origin
        self.done = False
        self.settled = False  # the stop reason came: a body held open after it ends after the grace
        self.terminator = "message_stop"
        self.response_id: str | None = None
        self._usage_read = UsageReader("anthropic stream")  # warns once of malformed usage
        # The type of each block started, by index; "" for one not mapped as it streams.
        self._blocks: dict[int, str] = {}
        self._latest = -1  # the index of the block begun last: the only one a delta may go to
        self._open = False  # whether that block is still streaming (no content_block_stop yet)
        # The index a block's events carry, by its index on the wire, where they differ: text or
        # thinking after a block's content_block_stop opens a block of its own under the next
        # index, and every block begun after it is numbered one further on (``_shift``).
        self._moved: dict[int, int] = {}
        self._shift = 0
        # The blocks before the one begun last whose late text or thinking streams in a new block
        # (until their next content_block_stop), by their index on the wire.
        self._again: set[int] = set()
        # The server-tool blocks being streamed, by index: the block, and its input's JSON parts.
        self._server: dict[int, tuple[dict[str, Any], list[str]]] = {}
        # A tool call's input given whole in its content_block_start (a proxy's), by index: its
        # input unless input_json_delta streams one, as in the official SDK.
        self._whole: dict[int, str] = {}
        self._stop_reason: str | None = None
        self._since = False  # output came after the stop reason: the next one decides instead
        self._rewarned = False  # a later stop reason that differs was warned of (once)
        self._usage = Usage()
        # The wire's counts so far: input (the uncached part), output, cache read, cache written.
        self._counts = (0, 0, 0, 0)

    def handle(self, sse: ServerSentEvent) -> Sequence[StreamEvent] | None:
        """Map one SSE event. Raises `StreamProtocolError` for malformed data and
        `ProviderStreamError` for an ``error`` event."""
        try:
            obj = loads(sse.data)
        except ValueError as exc:
            if sse.event == "ping" or (sse.event is not None and sse.event not in _READ):
                # A keep-alive, whatever it carries (the SDK reads no ping either), or an event
                # this mapper does not read (a proxy's "event: keepalive" with empty data): the
                # API asks for unknown event types to be passed over.
                return None
            if sse.event in (None, "message") and not sse.data.strip():
                return None  # "data:" alone, with no name (a proxy's keep-alive): it carries nothing
            if sse.event == "error":  # the server's error, in words: its message
                raise self._error({"type": "error", "error": {"message": sse.data.strip()}}) from None
            raise StreamProtocolError(
                f"anthropic stream: malformed JSON in {sse.event or 'data'} event: {exc}; data: {excerpt(sse.data)!r}",
                retryable=True,
            ) from None
        kind = obj.get("type") if isinstance(obj, dict) else None
        if kind is None:
            kind = sse.event
            if (kind is None or kind == "message") and isinstance(obj, dict) and obj.get("error"):
                # A proxy's failure as bare data, with neither a type nor an ``event:`` line (or
                # SSE's default ``event: message``; LiteLLM's /v1/messages wrote it so): the
                # server's error, not a cut stream.
                raise self._error(obj)
        try:
            if kind == "content_block_delta":
                out = self._delta(obj)
                if out and self.settled:
                    self._since = True
                return out
            if sse.event == "error" or kind == "error":
                raise self._error(obj)
            handler = _HANDLERS.get(kind)  # type: ignore[arg-type]
            out = None if handler is None else handler(self, obj)
            if out and self.settled and not self._since:
                self._since = any(type(e) is not StreamBlockStop for e in out)
            return out
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
        at = self._moved.get(index, index) if self._moved else index
        # Blocks stream one after another: one before the block begun last was whole when that began.
        streaming = self._open if index == self._latest else index in self._again
        if dt == "text_delta":
            if block != "text":
                raise _wrong_block(dt, block, index)
            text = _str(delta, "text", obj)
            if not streaming:
                if not text:
                    return None  # an empty delta after the stop changes nothing
                at = self._reopen(index)
            return (StreamText(at, text),)
        if dt == "input_json_delta":
            if block != "tool_use":
                raise _wrong_block(dt, block, index)
            part = _str(delta, "partial_json", obj)
            if not part:
                return None
            if not streaming:
                raise _after_stop(dt, index)
            if self._whole:
                self._whole.pop(index, None)
            return (StreamToolInput(at, part),)
        if dt == "thinking_delta" or dt == "signature_delta":
            if block != "thinking":
                raise _wrong_block(dt, block, index)
            if dt == "thinking_delta":
                text = _str(delta, "thinking", obj)
                if not streaming:
                    if not text:
                        return None
                    at = self._reopen(index)
                return (StreamThinking(at, text),)
            signature = _str(delta, "signature", obj)
            if not streaming:
                if not signature:
                    return None
                raise _after_stop(dt, index)
            return (StreamSignature(at, signature, self.origin),)
        return None  # citations_delta and future delta types

    def _reopen(self, index: int) -> int:
        """The index of a new block for text or thinking that came for block ``index`` after its
        content_block_stop, or after a later block began (a gateway's second segment sent to a block
        it closed): the block was whole there, so the rest is a block of its own, after every block
        begun so far (as text after a Responses item's ``output_item.done``) and before any begun
        later. It streams until the next content_block_stop for ``index``."""
        self._shift += 1
        at = self._moved[index] = self._latest + self._shift
        if index == self._latest:
            self._open = True
        else:
            self._again.add(index)
        return at

    def _message_start(self, obj: dict[str, Any]) -> Sequence[StreamEvent] | None:
        message = obj["message"]
        given = message.get("id")
        self.response_id = given if type(given) is str else None
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
        if index < self._latest:
            # The message orders blocks by index: this one would go before what was shown after it.
            raise _out_of_place(f"a content_block_start for block {index}, after block {self._latest}")
        self._latest, self._open = index, True
        self._blocks[index] = bt if bt in _MAPPED else ""
        at = index
        if self._shift:  # after a block opened again: numbered past it
            at = self._moved[index] = index + self._shift
        if bt == "text":
            return (StreamText(at, _str(block, "text", obj)),) if block.get("text") else None
        if bt == "thinking":
            whole: list[StreamEvent] = []
            if block.get("thinking"):
                whole.append(StreamThinking(at, _str(block, "thinking", obj)))
            if block.get("signature"):  # a proxy that sends the whole block up front
                whole.append(StreamSignature(at, _str(block, "signature", obj), self.origin))
            return whole
        if bt == "redacted_thinking":
            return (StreamRedactedThinking(at, _str(block, "data", obj), self.origin),)
        if bt == "tool_use":
            id, name = _str(block, "id", obj), _str(block, "name", obj)
            if block.get("input"):  # a proxy that sends the whole input up front: given at the block's end
                self._whole[index] = json.dumps(block["input"])
            return (StreamToolUseStart(at, id, name),)
        if bt in SERVER_CALLS or (bt.endswith("_tool_result") and bt != "tool_result"):
            self._server[index] = (block, [])  # given whole at its content_block_stop
        return None  # future block types: skipped

    def _block_stop(self, obj: dict[str, Any]) -> Sequence[StreamEvent] | None:
        index = _index(obj)
        if index == self._latest:
            self._open = False
        elif self._again:
            self._again.discard(index)
        if self._blocks.get(index):
            whole = self._whole.pop(index, None) if self._whole else None
            at = self._moved.get(index, index) if self._moved else index
            return (StreamBlockStop(at),) if whole is None else (StreamToolInput(at, whole), StreamBlockStop(at))
        kept = self._server.pop(index, None)
        return None if kept is None else _server_block(self._moved.get(index, index), *kept)

    def _message_delta(self, obj: dict[str, Any]) -> Sequence[StreamEvent] | None:
        reason = obj.get("delta", {}).get("stop_reason")
        if reason is not None:
            first = self._stop_reason
            if first is not None and not self._since:
                self._late_reason(reason)
            elif type(reason) is not str:
                if first is None:  # as a Chat finish_reason: the server would send it so again
                    where = f"anthropic stream: malformed {obj.get('type')} event"
                    raise not_a_str(where, "stop_reason", reason, retryable=False)
                self._late_reason(reason)  # the one before it stands
            else:
                self._stop_reason, self._since = reason, False
            self.settled = True
        usage = obj.get("usage")
        if usage:
            self._count(usage)
        return None

    def _late_reason(self, reason: Any) -> None:
        """A stop reason sent again after the answer's with no output since, or one that is not a
        string after it: the first decides (``max_tokens`` then ``end_turn`` is still a cut
        answer; a malformed one is ignored), except a refusal after a reason that is not one, so
        a host is never told a refused answer ended normally. One that differs is warned of, once."""
        first = self._stop_reason
        if reason == first:
            return
        verdict = reason == "refusal"
        if verdict:
            self._stop_reason = reason
        if self._rewarned and not verdict:
            return
        self._rewarned = True
        said = _named(reason) if type(reason) is str else f"of type {type(reason).__name__}"
        log.warning(
            "anthropic stream: the server sent stop_reason %s after its stop_reason %s; the answer ends with the %s",
            said, _named(first or ""), "refusal" if verdict else "first",
        )

    def _count(self, raw: Any) -> None:
        """Take the counts of a usage object. They are cumulative: present fields replace old ones.
        Anthropic's ``input_tokens`` is only the prompt after the last cache breakpoint; the
        `Usage` counts the whole prompt, cached part included, as OpenAI's do."""
        fresh, output, read, write = self._counts
        given = self._usage_read(raw, *_COUNTS)
        self._counts = counts = (
            count_tokens(given[0], fresh),
            count_tokens(given[1], output),
            count_tokens(given[2], read),
            count_tokens(given[3], write),
        )
        fresh, output, read, write = counts
        self._usage = Usage(fresh + read + write, output, read, write)

    def _message_stop(self, obj: dict[str, Any]) -> Sequence[StreamEvent] | None:
        self.done = True
        end = StreamEnd(self._stop_reason, self._usage, self.response_id)
        if self._whole:  # a call whose content_block_stop never came
            moved = self._moved
            return [*(StreamToolInput(moved.get(index, index), whole) for index, whole in self._whole.items()), end]
        return (end,)

    def at_eof(self) -> Sequence[StreamEvent] | None:
        """The end of a body that stopped cleanly without ``message_stop``: complete once a
        ``message_delta`` gave the stop reason (compatible gateways end there, as Chat servers
        without ``[DONE]`` do), else None (cut). A connection that breaks is never taken for it."""
        return self._message_stop({}) if self._stop_reason is not None else None

    def _error(self, obj: Any) -> ProviderError:
        err = obj.get("error") if isinstance(obj, dict) else None
        if not isinstance(err, dict):  # a proxy's error in words is its message
            err = {"message": err} if isinstance(err, str) else {}
        kind = err.get("type")
        if type(kind) is not str:  # a list, a number: no type to read (and not one to keep)
            kind = None
        if kind is None or kind == "None":  # "None": how LiteLLM's proxy writes a missing type
            code = str(err.get("code"))  # a proxy's: the HTTP status of the upstream failure
            kind = code if code.isascii() and code.isdigit() else None
            transient = kind is not None and int(code) in RETRYABLE_STATUSES
        else:  # an explicit type says whether the failure is transient, whatever the code
            transient = kind in _RETRYABLE_ERRORS
        message = err.get("message") or "stream error"
        if type(message) is not str:
            message = str(message)
        request_id = obj.get("request_id") if isinstance(obj, dict) else None
        if type(request_id) is not str:  # the header's, then
            request_id = None
        too_long = prompt_too_long(message)
        cls = PromptTooLongError if too_long else ProviderStreamError
        return cls(
            f"anthropic stream error ({kind}): {message}" if kind else f"anthropic stream error: {message}",
            provider="anthropic",
            status=200,
            body=obj,
            request_id=request_id or self.request_id,
            error_type=kind,
            retryable=not too_long and transient,
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


def _str(holder: dict[str, Any], field: str, obj: dict[str, Any]) -> str:
    """The str ``holder[field]`` of the event ``obj`` (KeyError when absent). Another type is a
    malformed event raised here, where the model's errors are scrubbed of its secrets, and not
    passed on in a stream event whose own check would reject it outside that scrubbing."""
    value = holder[field]
    if type(value) is not str:
        kind = obj.get("type")
        what = f"{holder.get('type')} block" if kind == "content_block_start" else holder.get("type")
        raise not_a_str(f"anthropic stream: malformed {kind} event", f"{what}'s {field}", value)
    return value


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


def _named(reason: str) -> str:
    """A stop reason as a warning names it: quoted when it is one the API documents (a server's
    value of its own is not quoted, so nothing of the request it may echo reaches a log)."""
    return repr(reason) if reason in _KNOWN_REASONS else "(one this library does not know)"


def _out_of_place(what: str) -> StreamProtocolError:
    return StreamProtocolError(f"anthropic stream: {what}", retryable=True)


def _after_stop(delta: str, index: int) -> StreamProtocolError:
    """More of a call's input, or another signature, after the block's content_block_stop, which
    gave it whole (a call may be run from there): taken, it would change a call already given, or
    the signature of its thinking. Not retryable: a server that sends it does so on every attempt,
    and each retry would be billed for the same stream."""
    return StreamProtocolError(
        f"anthropic stream: a {delta} for block {index} after its content_block_stop", retryable=False
    )


def _wrong_block(delta: str, block: str, index: int) -> StreamProtocolError:
    """A delta sent to a block of another type: mapped, it would put thinking into the answer,
    text into a tool call's input, or JSON into the text."""
    return _out_of_place(f"{delta} for block {index}, which is a {block} block")


#: The block types mapped to the message as they stream; server-tool blocks are given whole at
#: their end, and future types are skipped.
_MAPPED = frozenset({"text", "thinking", "redacted_thinking", "tool_use"})


_Handler = Callable[[AnthropicMapper, dict[str, Any]], Sequence[StreamEvent] | None]
_HANDLERS: dict[str, _Handler] = {
    "message_start": AnthropicMapper._message_start,
    "content_block_start": AnthropicMapper._block_start,
    "content_block_stop": AnthropicMapper._block_stop,
    "message_delta": AnthropicMapper._message_delta,
    "message_stop": AnthropicMapper._message_stop,
}
#: The stop reasons the Messages API documents.
_KNOWN_REASONS = frozenset({"end_turn", "max_tokens", "stop_sequence", "tool_use", "pause_turn", "refusal",
                            "model_context_window_exceeded"})  # fmt: skip
#: The counts of a usage object, in the order `_count` keeps them.
_COUNTS = ("input_tokens", "output_tokens", "cache_read_input_tokens", "cache_creation_input_tokens")
# The event names whose data this mapper reads: data that is not JSON in one is malformed.
_READ = frozenset({*_HANDLERS, "content_block_delta", "error"})
