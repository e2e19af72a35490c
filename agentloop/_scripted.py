"""`ScriptedModel`: a deterministic, offline model for tests, demos and benchmarks.

Each request consumes the next scripted response. A response is a
`ScriptedResponse`, a plain string (a text reply), or a callable that receives
the `ModelRequest` and returns either. Responses stream in chunks with an
optional delay between events, so interrupts can land mid-stream.
"""

from __future__ import annotations

import asyncio
import itertools
import json
from collections.abc import AsyncIterator, Callable, Sequence
from dataclasses import dataclass, field
from typing import Any, get_args

from ._abort import AbortSignal
from ._checks import count, non_negative
from ._errors import ModelError
from ._model import (
    ModelRequest,
    StreamBlockStop,
    StreamEnd,
    StreamEvent,
    StreamSignature,
    StreamText,
    StreamThinking,
    StreamToolInput,
    StreamToolUseStart,
    Usage,
)
from ._quick import quick_new

__all__ = ["ScriptedModel", "ScriptedResponse", "ScriptedToolCall"]


@dataclass(frozen=True, slots=True)
class ScriptedToolCall:
    """One tool call of a `ScriptedResponse`: the tool's ``name``, its ``input`` (a dict of
    arguments), and its ``id`` (None: a fresh one each time the response is played)."""

    name: str
    input: dict[str, Any] = field(default_factory=dict)
    id: str | None = None


@dataclass(frozen=True, slots=True)
class ScriptedResponse:
    """One scripted model response.

    ``thinking`` streams first (signed unless ``sign_thinking`` is False), then
    ``text``, then the ``tool_calls`` (`ScriptedToolCall`s). ``chunk`` is the delta size in characters;
    ``delay`` the pause (seconds) before each event. ``error``: raised after
    ``error_after`` events (None: at the start; all of them: once they are streamed); ValueError
    for an ``error_after`` below 0, and, when an ``error`` is given, for one past the number of
    events, which could never raise it (without an ``error``, ``error_after`` does nothing).
    ``events``: raw stream events, used instead of everything above when given.
    """

    text: str = ""
    thinking: str = ""
    tool_calls: Sequence[ScriptedToolCall] = ()
    chunk: int = 16
    delay: float = 0.0
    sign_thinking: bool = True
    stop_reason: str | None = None
    usage: Usage = field(default_factory=lambda: Usage(10, 10))
    error: ModelError | None = None
    error_after: int | None = None
    events: Sequence[StreamEvent] | None = None

    def __post_init__(self) -> None:
        """Raises TypeError for a script that could only fail when played, blamed on the model
        (a field of another type: ``chunk`` and ``error_after`` take a whole number), and
        ValueError for a ``chunk`` below 1, a negative ``delay`` or ``error_after``, or an
        ``error_after`` past the events of a response given an ``error`` to raise."""
        for name in ("text", "thinking"):
            if not isinstance(getattr(self, name), str):
                raise TypeError(f"ScriptedResponse {name} must be a str, not {type(getattr(self, name)).__name__}")
        if isinstance(self.tool_calls, ScriptedToolCall):
            raise TypeError("ScriptedResponse tool_calls takes a list: tool_calls=[ScriptedToolCall(...)]")
        # Read once into tuples: a generator given here is played on every replay, not used up.
        object.__setattr__(self, "tool_calls", tuple(self.tool_calls))
        if self.events is not None:
            object.__setattr__(self, "events", tuple(self.events))
        for call in self.tool_calls:
            if not isinstance(call, ScriptedToolCall):
                raise TypeError(f"ScriptedResponse tool_calls holds ScriptedToolCall(name, input), not {call!r}")
            if not isinstance(call.input, dict):
                raise TypeError(f"ScriptedToolCall input must be a dict (the tool's arguments), not {call.input!r}")
            if not isinstance(call.name, str) or not isinstance(call.id, str | None):
                raise TypeError(f"ScriptedToolCall takes a str name and a str id (or None), not {call.name!r}, {call.id!r}")
        if not isinstance(self.stop_reason, str | None):
            raise TypeError(f"ScriptedResponse stop_reason takes a str or None, not {self.stop_reason!r}")
        self._check_playable()
        if self.error is not None and self.error_after is not None:
            events = self._event_count()
            if self.error_after > events:
                raise ValueError(
                    f"ScriptedResponse error_after={self.error_after!r} would never raise the error: "
                    f"this response streams {events} events, so it takes 0 to {events}"
                )

    def _check_playable(self) -> None:
        """The fields a play reads as numbers, an exception and stream events: checked now."""
        object.__setattr__(self, "chunk", count("ScriptedResponse chunk", self.chunk, 1, optional=False))
        object.__setattr__(self, "error_after", count("ScriptedResponse error_after", self.error_after, 0))
        non_negative("ScriptedResponse delay", self.delay)
        if self.error is not None and not isinstance(self.error, ModelError):
            raise TypeError(f"ScriptedResponse error takes a ModelError to raise, not {self.error!r}")
        if not isinstance(self.usage, Usage | None):
            raise TypeError(f"ScriptedResponse usage takes a Usage, not {self.usage!r}")
        bad = next((e for e in self.events or () if not isinstance(e, _STREAM_EVENTS)), None)
        if bad is not None:
            raise TypeError(f"ScriptedResponse events holds stream events (StreamText, StreamEnd...), not {bad!r}")

    def _event_count(self) -> int:
        """How many events `stream_events` gives, counted without making them."""
        if self.events is not None:
            return len(self.events)
        size = self.chunk
        blocks = [self.thinking, self.text, *(json.dumps(call.input) for call in self.tool_calls)]
        deltas = sum(-(-len(text) // size) for text in blocks)
        stops = bool(self.thinking) + bool(self.text) + len(self.tool_calls)  # a block stop each
        signature = bool(self.thinking) and self.sign_thinking
        return deltas + stops + len(self.tool_calls) + signature + 1  # tool use starts, the end

    def stream_events(self, ids: Callable[[], str]) -> list[StreamEvent]:
        """The events this response streams (tool ids drawn from ``ids`` when unset)."""
        if self.events is not None:
            return list(self.events)
        out: list[StreamEvent] = []
        index = 0
        if self.thinking:
            out += [StreamThinking(index, c) for c in _chunks(self.thinking, self.chunk)]
            if self.sign_thinking:
                out.append(StreamSignature(index, f"sig-{len(self.thinking)}"))
            out.append(StreamBlockStop(index))
            index += 1
        if self.text:
            out += [StreamText(index, c) for c in _chunks(self.text, self.chunk)]
            out.append(StreamBlockStop(index))
            index += 1
        for call in self.tool_calls:
            out.append(StreamToolUseStart(index, call.id or ids(), call.name))
            out += [StreamToolInput(index, c) for c in _chunks(json.dumps(call.input), self.chunk)]
            out.append(StreamBlockStop(index))
            index += 1
        stop = self.stop_reason or ("tool_use" if self.tool_calls else "end_turn")
        out.append(StreamEnd(stop_reason=stop, usage=self.usage))
        return out


_STREAM_EVENTS = get_args(StreamEvent)

# One per scripted call played: made by a function, not by calling the class (`quick_new`).
_tool_use_start = quick_new(StreamToolUseStart)

Script = ScriptedResponse | str | Callable[[ModelRequest], "ScriptedResponse | str"]


class ScriptedModel:
    """Plays ``responses`` in order, one per request.

    ``cycle``: start again from the first response when the script runs out
    (otherwise a request past the end raises `ModelError`). ``requests`` records
    every `ModelRequest` it was sent, for assertions (none with ``record=False``, for a long
    run that should not keep them); ``request_count`` counts them either way.
    """

    def __init__(self, responses: Sequence[Script], *, cycle: bool = False, record: bool = True) -> None:
        """Raises TypeError for what is not a list of scripts (a bare string would play
        one character per request)."""
        if isinstance(responses, str | ScriptedResponse) or callable(responses):
            raise TypeError(f"ScriptedModel takes a list of responses: ScriptedModel([{responses!r}])")
        self._responses = list(responses)
        for i, script in enumerate(self._responses):
            if not (isinstance(script, str | ScriptedResponse) or callable(script)):
                raise TypeError(
                    f"ScriptedModel response {i} is a {type(script).__name__}: a response is a str, "
                    "a ScriptedResponse, or a callable of the ModelRequest returning one of those"
                )
        self._cycle = cycle
        self._next = 0
        self._ids = itertools.count(1)
        self._record = record
        self.requests: list[ModelRequest] = []
        self.request_count = 0
        # Per script object: its events, and where a fresh tool id goes on every play.
        self._templates: dict[int, tuple[list[StreamEvent], list[tuple[int, StreamToolUseStart]]]] = {}

    def __repr__(self) -> str:
        return f"<ScriptedModel {self._next}/{len(self._responses)} played>"

    def _new_id(self) -> str:
        return f"toolu_{next(self._ids):04d}"

    def _take(self, request: ModelRequest) -> tuple[ScriptedResponse, list[StreamEvent]]:
        if self._next >= len(self._responses):
            if not self._cycle or not self._responses:
                raise ModelError(f"ScriptedModel has no response left (played {self._next})")
            self._next = 0
        script = self._responses[self._next]
        self._next += 1
        if callable(script):
            made = script(request)
            if not isinstance(made, str | ScriptedResponse):
                raise ModelError(f"the scripted callable {script!r} returned {type(made).__name__}, not a str or a ScriptedResponse")
            response = ScriptedResponse(text=made) if isinstance(made, str) else made
            return response, response.stream_events(self._new_id)
        response = ScriptedResponse(text=script) if isinstance(script, str) else script
        found = self._templates.get(id(script))  # the script object lives in self._responses
        if found is None:
            events = response.stream_events(lambda: "")
            fills = [(i, e) for i, e in enumerate(events) if isinstance(e, StreamToolUseStart) and not e.id]
            found = self._templates[id(script)] = (events, fills)
        template, fills = found
        if not fills:
            return response, template
        # Tool calls scripted without an id get a fresh one on every play.
        events = list(template)
        for i, e in fills:
            events[i] = _tool_use_start(e.index, self._new_id(), e.name)
        return response, events

    async def stream(self, request: ModelRequest, signal: AbortSignal) -> AsyncIterator[StreamEvent]:
        """Stream the next response; honours ``signal`` between events."""
        self.request_count += 1
        if self._record:
            self.requests.append(request)
        response, events = self._take(request)
        error, delay = response.error, response.delay
        fail_at = (response.error_after or 0) if error is not None else -1
        for i, event in enumerate(events):
            if i == fail_at:
                assert error is not None
                raise error
            if delay:
                await asyncio.sleep(delay)
            if signal._reason is not None:  # `throw_if_aborted()`, called only to raise: one call less per event
                signal.throw_if_aborted()
            yield event
        if fail_at == len(events):  # after every event: the stream fails as it would have ended
            assert error is not None
            raise error


def _chunks(text: str, size: int) -> list[str]:
    return [text[i : i + size] for i in range(0, len(text), size)]
