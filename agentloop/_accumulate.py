"""Build one assistant message from a model's stream events.

One accumulator serves every provider, so a given stream of `StreamEvent`s
always yields the same message whichever adapter produced it.
"""

from __future__ import annotations

import json
import numbers
from collections.abc import Callable, Mapping
from dataclasses import replace
from typing import Any

from ._errors import StreamProtocolError
from ._events import Event, TextDelta, ThinkingDelta, ToolInputDelta
from ._jsondepth import TOO_DEEP, check_depth
from ._jsondepth import deeper_than as _deeper_than
from ._messages import (
    Block,
    Message,
    ProviderBlock,
    RedactedThinkingBlock,
    ToolUseBlock,
    message,
    text_block,
    thinking_block,
    tool_use_block,
)
from ._model import (
    StreamBlockStop,
    StreamEnd,
    StreamEvent,
    StreamLogprobs,
    StreamProviderBlock,
    StreamRedactedThinking,
    StreamSignals,
    StreamSignature,
    StreamText,
    StreamThinking,
    StreamToolInput,
    StreamToolUseStart,
    StreamUsage,
    Usage,
)
from ._quick import quick_new
from ._unicode import json_escapes_surrogate, scrub, scrub_json

__all__ = ["APPLY", "Accumulator"]


# The host's deltas, one per stream event: made by functions, not by calling the class (`quick_new`).
_text_delta = quick_new(TextDelta)
_thinking_delta = quick_new(ThinkingDelta)
_tool_input_delta = quick_new(ToolInputDelta)


class _Part:
    # ``name`` is a tool call's name, or a provider block's provider (its data in ``data``).
    __slots__ = ("chunks", "closed", "data", "id", "kind", "name", "origin", "signature")

    def __init__(self, kind: str, id: str = "", name: str = "") -> None:
        self.kind = kind
        self.chunks: list[str] = []
        self.signature = ""
        self.origin: str | None = None  # a thinking block's: the server that made it
        self.id = id
        self.name = name
        self.closed = False
        self.data: dict[str, Any] | None = None


# The errors of a malformed event name the type of what it carries, never the value: a model's
# value may hold a credential (a key a server echoed), and these errors are raised outside the
# scrubbing of a model's own errors (`agentloop.models` rejects a wrong type itself, scrubbed).


def _malformed(value: object, event: object, field: str, belongs: str = "str") -> StreamProtocolError:
    """``event``'s ``field`` is ``value``, not a ``belongs``: the error says which field and its type."""
    return StreamProtocolError(
        f"malformed stream event: {type(event).__name__}'s {field} is {type(value).__name__}, not a {belongs}",
        retryable=True,
    )


def _counted(usage: Usage, event: StreamUsage | StreamEnd) -> Usage:
    """``usage`` if it is a `Usage` of ints >= 0; one whose counts are whole numbers of another
    type (``12.0``, a numpy integer), or a subclass of `Usage`, as a copy of it with int counts; else the event is
    malformed (a model of the host's own that reports its tokens its own way), rather than
    failing the run's sum later, outside the engine's error handling."""
    if (  # written out: no generator made once per response
        type(usage) is Usage
        and type(usage.input_tokens) is int
        and type(usage.output_tokens) is int
        and type(usage.cache_read_tokens) is int
        and type(usage.cache_write_tokens) is int
        and min(usage.input_tokens, usage.output_tokens, usage.cache_read_tokens, usage.cache_write_tokens) >= 0
    ):
        return usage
    if isinstance(usage, Usage):
        i, o, r, w = (_whole(n) for n in (usage.input_tokens, usage.output_tokens, usage.cache_read_tokens, usage.cache_write_tokens))
        if i is not None and o is not None and r is not None and w is not None:
            return replace(usage, input_tokens=i, output_tokens=o, cache_read_tokens=r, cache_write_tokens=w)
    raise StreamProtocolError(
        f"malformed stream event: {type(event).__name__} carries a usage that is not a Usage of whole "
        f"numbers of tokens >= 0: {_usage_types(usage)}",
        retryable=True,  # as any malformed event: a stream that went wrong once may not again
    )


def _usage_types(usage: object) -> str:
    """What a malformed usage is, by types only (`_malformed`): ``a dict``, or the counts of a
    `Usage` that are not whole numbers >= 0 (``input_tokens is str``, ``output_tokens is negative``)."""
    if not isinstance(usage, Usage):
        return f"a {type(usage).__name__}"
    bad = []
    for field in ("input_tokens", "output_tokens", "cache_read_tokens", "cache_write_tokens"):
        n = getattr(usage, field)
        if _whole(n) is None:
            negative = isinstance(n, int | float) and not isinstance(n, bool) and n < 0
            bad.append(f"{field} is {'negative' if negative else type(n).__name__}")
    return ", ".join(bad) or f"a {type(usage).__name__}"


def _whole(n: object) -> int | None:
    """``n`` as an int when it is a whole number >= 0 of another type (a float such as ``12.0``,
    an integral such as a numpy integer; never a bool), else None."""
    if isinstance(n, bool):
        return None
    if isinstance(n, float):
        return int(n) if n.is_integer() and n >= 0 else None
    if isinstance(n, numbers.Integral):  # as `_checks.count` reads a whole number
        value = int(n)
        return value if value >= 0 else None
    return None


def _origin(ev: StreamSignature | StreamRedactedThinking) -> str | None:
    origin = ev.origin
    if origin is not None and type(origin) is not str:
        raise _malformed(origin, ev, "origin")
    return origin if origin is None else scrub(origin)


def _redacted_block(data: str, origin: str | None) -> RedactedThinkingBlock:
    data = scrub(data)  # whole: halves may come in two deltas
    return RedactedThinkingBlock(data=data) if origin is None else RedactedThinkingBlock(data=data, origin=origin)


def _bad_index(index: object, event: object) -> StreamProtocolError:
    return StreamProtocolError(
        f"malformed stream event: {type(event).__name__} carries a block index of type "
        f"{type(index).__name__}, not an int",
        retryable=True,
    )


class Accumulator:
    """Feed stream events in order; read the message at any time.

    The policies' event kinds (signals, logprobs) are ignored here: the engine routes
    them to the policies. Anything that is not a stream event is a `StreamProtocolError`.
    """

    __slots__ = ("_parts", "ended", "response_id", "stop_reason", "usage")

    def __init__(self) -> None:
        self._parts: dict[int, _Part] = {}
        self.stop_reason: str | None = None
        self.usage = _NO_USAGE
        self.ended = False
        self.response_id: str | None = None

    @property
    def empty(self) -> bool:
        """True while nothing visible has been streamed."""
        return not self._parts

    def feed(self, ev: StreamEvent) -> None:
        """Apply one event (dispatched on its exact type: this is the hot path)."""
        apply = APPLY.get(type(ev))
        if apply is not None:
            apply(self, ev)
        else:
            self.other(ev)

    def other(self, ev: object) -> Event | None:
        """An event without a handler of its exact type: the policies' (signals, logprobs) pass,
        a subclass of a stream event is applied as that event, and anything else (a dict, a
        string, a `Model`'s own class) is a malformed event rather than output silently lost."""
        if isinstance(ev, StreamSignals | StreamLogprobs):
            return None
        for cls in type(ev).__mro__[1:]:
            apply = APPLY.get(cls)
            if apply is not None:
                return apply(self, ev)
        raise StreamProtocolError(
            f"malformed stream event: the model yielded {type(ev).__name__}, not one of the stream "
            "events of agentloop.models (StreamText, StreamEnd, ...)"
        )

    # The one check every model's events pass through: a field of the wrong type (a server's
    # null or list, a custom `Model`'s bug) is a malformed event here, inside the engine's error
    # handling, rather than a TypeError when the message is joined after the stream.
    #
    # Each applies its event and returns what the host sees of it (None: nothing), so that the
    # loop makes one call per stream event.

    def _text(self, ev: StreamText) -> TextDelta:
        text = ev.text
        if type(text) is not str:
            raise _malformed(text, ev, "text")
        self._part(ev, "text").chunks.append(text)
        return _text_delta(text=text)

    def _thinking(self, ev: StreamThinking) -> ThinkingDelta:
        text = ev.thinking
        if type(text) is not str:
            raise _malformed(text, ev, "thinking")
        self._part(ev, "thinking").chunks.append(text)
        return _thinking_delta(thinking=text)

    def _signature(self, ev: StreamSignature) -> None:
        if type(ev.signature) is not str:
            raise _malformed(ev.signature, ev, "signature")
        origin = _origin(ev)
        part = self._part(ev, "thinking")
        part.signature = scrub(ev.signature)  # whole, never a piece
        part.origin = origin

    def _tool_input(self, ev: StreamToolInput) -> ToolInputDelta:
        text = ev.partial_json
        if type(text) is not str:
            raise _malformed(text, ev, "partial_json")
        part = self._part(ev, "tool_use")
        part.chunks.append(text)
        return _tool_input_delta(tool_use_id=part.id, name=part.name, partial_json=text)

    def _tool_start(self, ev: StreamToolUseStart) -> ToolInputDelta:
        id, name = ev.id, ev.name
        if type(id) is not str:
            raise _malformed(id, ev, "id")
        if type(name) is not str:
            raise _malformed(name, ev, "name")
        if not (id.isascii() and name.isascii()):  # the host is shown the id the transcript keeps (a
            # test inline: one per tool call of every loop iteration, two calls of `scrub` saved)
            id, name = scrub(id), scrub(name)
        part = self._part(ev, "tool_use")
        part.id, part.name = id, name
        return _tool_input_delta(tool_use_id=id, name=name, partial_json="")

    def _redacted(self, ev: StreamRedactedThinking) -> None:
        if type(ev.data) is not str:
            raise _malformed(ev.data, ev, "data")
        origin = _origin(ev)
        part = self._part(ev, "redacted_thinking")
        part.chunks.append(ev.data)
        part.origin = origin

    def _provider(self, ev: StreamProviderBlock) -> None:
        if type(ev.provider) is not str:
            raise _malformed(ev.provider, ev, "provider")
        if type(ev.data) is not dict:
            raise _malformed(ev.data, ev, "data", "dict")
        if _deeper_than(ev.data, MAX_PROVIDER_DEPTH):
            raise StreamProtocolError(
                f"malformed stream event: StreamProviderBlock carries data nested more than "
                f"{MAX_PROVIDER_DEPTH} levels deep (it could not be sent back, or saved)",
                retryable=True,
            )
        part = self._part(ev, "provider")
        part.name, part.data, part.closed = scrub(ev.provider), ev.data, True

    def _stop(self, ev: StreamBlockStop) -> None:
        if type(ev.index) is not int:
            raise _bad_index(ev.index, ev)
        part = self._parts.get(ev.index)
        if part is not None:
            part.closed = True

    def _usage(self, ev: StreamUsage) -> None:
        self.usage = _merge_usage(self.usage, _counted(ev.usage, ev))

    def _end(self, ev: StreamEnd) -> None:
        reason = ev.stop_reason
        if reason is not None and type(reason) is not str:  # a list or a dict would fail the commit
            # Not retried, as the providers' own check is not: a model that ends so ends so again.
            raise StreamProtocolError(
                f"malformed stream event: StreamEnd carries a stop_reason of type {type(reason).__name__}, "
                "not a str"
            )
        usage = ev.usage
        if usage is not None:  # the end event's usage alone (the common case) is taken as is
            usage = _counted(usage, ev)  # checked before the attempt is marked ended
            self.usage = usage if self.usage is _NO_USAGE else _merge_usage(self.usage, usage)
        self.ended = True
        self.stop_reason = reason
        self.response_id = ev.response_id
        for part in self._parts.values():
            part.closed = True

    def _part(self, ev: StreamText | StreamThinking | StreamSignature | StreamToolInput | StreamToolUseStart
              | StreamRedactedThinking | StreamProviderBlock, kind: str) -> _Part:
        index = ev.index
        if type(index) is not int:  # a str or a float would break the ordering of the blocks
            raise _bad_index(index, ev)
        part = self._parts.get(index)
        if part is None:
            part = self._parts[index] = _Part(kind)
        return part

    def blocks(self) -> Mapping[int, _Part]:
        """The blocks streamed so far by index, in the order they began, each with its ``kind``
        and its ``chunks`` (the deltas as they came, appended to in place): a reader keeps up
        with the stream from here without a call per delta."""
        return self._parts

    def text(self) -> str:
        """All text streamed so far."""
        return "".join("".join(p.chunks) for p in self._parts.values() if p.kind == "text")

    def thinking_text(self) -> str:
        """All thinking streamed so far."""
        return "".join("".join(p.chunks) for p in self._parts.values() if p.kind == "thinking")

    def tool_identity(self, index: int) -> tuple[str, str]:
        """(id, name) of the tool call streaming at ``index`` ("" while unknown)."""
        part = self._parts.get(index)
        return (part.id, part.name) if part is not None else ("", "")

    @property
    def tool_calls(self) -> int:
        """How many tool calls the attempt has started."""
        return sum(1 for p in self._parts.values() if p.kind == "tool_use")

    def message(self, *, partial: bool = False) -> Message:
        """The assistant message as streamed so far (blocks in index order).

        Unfinished tool calls come out with ``complete=False``; thinking without
        a signature keeps an empty signature; `committable` leaves out both.
        Text that UTF-8 cannot encode (a lone UTF-16 surrogate from a model) is
        scrubbed (`agentloop._unicode.scrub`): halves split across deltas are joined.
        """
        blocks: list[Block] = []
        order = sorted(self._parts)
        cut = CUT_BY.get(self.stop_reason or "") if self.ended else None
        for index in order:
            part = self._parts[index]
            body = "".join(part.chunks)
            if part.kind == "text":
                blocks.append(text_block(scrub(body)))
            elif part.kind == "thinking":
                blocks.append(thinking_block(scrub(body), part.signature, part.origin))
            elif part.kind == "redacted_thinking":
                blocks.append(_redacted_block(body, part.origin))
            elif part.kind == "provider":
                blocks.append(_provider_block(part))
            else:
                blocks.append(_tool_use(part, body, cut, last=index == order[-1]))
        return message("assistant", blocks, partial=partial)

    def committable(self, *, partial: bool = False) -> Message | None:
        """The message to commit: `message` without the blocks that may never be sent (the
        droppable ones of `validate_transcript`: whitespace-only text, thinking without a
        signature, a call whose input never completed), which are not made at all, and with
        trailing whitespace stripped from the last text block if only thinking (redacted or
        not) follows it: the end of the message as a request sends it (which leaves thinking
        out at the end of a turn), where the API refuses trailing whitespace, and sent alike
        whether the message is the request's last or not. The transcript never changes after
        commit, so a session file replays to it exactly. None when nothing sendable was streamed."""
        blocks: list[Block] = []
        order = sorted(self._parts)
        cut = CUT_BY.get(self.stop_reason or "") if self.ended else None
        tail: str | None = None  # the text of the last text block kept, if only thinking follows it
        at = 0  # its place in ``blocks``
        for index in order:
            part = self._parts[index]
            kind = part.kind
            if kind == "text":
                text = scrub("".join(part.chunks))
                if not text.strip():
                    continue
                at = len(blocks)
                blocks.append(text_block(text))
                tail = text
                continue
            if kind == "thinking":
                if part.signature:
                    blocks.append(thinking_block(scrub("".join(part.chunks)), part.signature, part.origin))
                continue
            if kind == "redacted_thinking":
                blocks.append(_redacted_block("".join(part.chunks), part.origin))
                continue
            if kind == "provider":
                blocks.append(_provider_block(part))
            else:
                if not part.closed:  # its input never completed
                    continue
                blocks.append(_tool_use(part, "".join(part.chunks), cut, last=index == order[-1]))
            tail = None
        if not blocks:
            return None
        if tail is not None and tail != tail.rstrip():
            blocks[at] = text_block(tail.rstrip())
        return message("assistant", blocks, partial=partial)


#: What `Accumulator.feed` calls for each event type (the engine's hot loop reads it directly,
#: and yields the event each returns).
APPLY: dict[type, Callable[[Accumulator, Any], Event | None]] = {
    StreamText: Accumulator._text,
    StreamThinking: Accumulator._thinking,
    StreamSignature: Accumulator._signature,
    StreamToolInput: Accumulator._tool_input,
    StreamToolUseStart: Accumulator._tool_start,
    StreamRedactedThinking: Accumulator._redacted,
    StreamProviderBlock: Accumulator._provider,
    StreamBlockStop: Accumulator._stop,
    StreamUsage: Accumulator._usage,
    StreamEnd: Accumulator._end,
}


#: Stop reasons that cut the output wherever it was, even inside a tool call's input, and why.
CUT_BY = {
    "max_tokens": "the response hit the output token limit (max_tokens)",
    "model_context_window_exceeded": "the response filled the context window (model_context_window_exceeded)",
    "refusal": "the response was stopped by a refusal or a content filter (refusal)",
    "repetition": "the server stopped the response as a repetition loop (repetition)",
}


#: How deeply a provider block's data may nest its objects and arrays (real ones: a few levels).
#: Deeper data, once in the transcript, would fail every later request that encodes it, and
#: the session file, past the interpreter's recursion limit.
MAX_PROVIDER_DEPTH = 100


def _provider_block(part: _Part) -> ProviderBlock:
    """The provider block of ``part``; its data scrubbed of lone surrogates, as model text is."""
    return ProviderBlock(provider=part.name, data=scrub_json(part.data or {}))


def _tool_use(part: _Part, body: str, cut: str | None = None, *, last: bool = False) -> ToolUseBlock:
    """The call of ``part``. Under a stop that ``cut`` the output (see `CUT_BY`), an input
    that is not whole JSON, or an empty one in the last block (the call being written when the
    output stopped), is incomplete: an ``input_error``, so the call is answered, not run."""
    if not part.closed:
        return tool_use_block(part.id, part.name, {}, complete=False)
    if not body.strip():
        if cut is not None and last:
            return ToolUseBlock(id=part.id, name=part.name, input={}, input_error=_incomplete(cut, body))
        return tool_use_block(part.id, part.name, {})
    error: str | None = None
    value: Any = None
    try:
        value = _json_value(body)
    except ValueError as exc:
        if cut is not None:
            return ToolUseBlock(id=part.id, name=part.name, input={}, input_error=scrub(_incomplete(cut, body)))
        error = f"the tool input is not valid JSON ({exc}); raw input: {body[:500]!r}"
    if error is None and not isinstance(value, dict):
        error = f"the tool input must be a JSON object, got {type(value).__name__}"
    if error is not None:
        return ToolUseBlock(id=part.id, name=part.name, input={}, input_error=scrub(error))
    return tool_use_block(part.id, part.name, value)


def _incomplete(cut: str, body: str) -> str:
    return f"the tool input is incomplete: {cut} before its JSON was finished; raw input: {body[:500]!r}"


_NO_USAGE = Usage()  # frozen: one shared zero
_JSON_SPACE = " \t\n\r"


def _no_constant(name: str) -> Any:
    # Python's json accepts NaN and Infinity; JSON does not, and a request that echoes them
    # back in the tool call would be rejected by the provider, every time.
    raise ValueError(f"{name} is not a JSON value")


# What json.loads ends up calling (the C scanner), without its Python wrappers.
_scan_json: Callable[[str, int], tuple[Any, int]] = json.JSONDecoder(parse_constant=_no_constant).scan_once  # type: ignore[attr-defined]


def _json_value(body: str) -> Any:
    """``json.loads(body)`` for a str (strict: no NaN or Infinity), minus two layers of
    Python; anything unusual (an error, trailing data) goes through json.loads itself
    for its exact message. Strings that hold a lone UTF-16 surrogate are scrubbed.
    Raises `ValueError`, also for JSON nested too deeply to decode (a model stuck
    repeating ``[`` in its arguments), never `RecursionError`."""
    text = body.strip(_JSON_SPACE)
    check_depth(text)  # the same limit on every Python version
    try:
        try:
            value, end = _scan_json(text, 0)
        except (StopIteration, ValueError):  # ValueError: positions would be off by the strip
            end = -1
        if end != len(text):
            value = json.loads(body, parse_constant=_no_constant)  # raises the error json.loads would
        if json_escapes_surrogate(body):
            value = scrub_json(value)
    except RecursionError:
        raise ValueError(TOO_DEEP) from None
    return value


def _merge_usage(old: Usage, new: Usage) -> Usage:
    if not old:
        return new
    if not new:
        return old
    return Usage(
        new.input_tokens or old.input_tokens,
        new.output_tokens or old.output_tokens,
        new.cache_read_tokens or old.cache_read_tokens,
        new.cache_write_tokens or old.cache_write_tokens,
    )
