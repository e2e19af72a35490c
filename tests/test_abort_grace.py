"""The abort's cancel grace (SPEC §1): what the run waits for after an abort (a model stream's
read that absorbed the abort's cancel, the stream's close, async ``on_abort`` hooks) shares one
grace counted from the abort, and every cancel the run makes of the host's task is its own and
taken back, so the host's task is left as it was. Time is driven with events and short graces;
the one bound on time is read from the loop's clock."""

from __future__ import annotations

import asyncio
import contextvars
import logging
from collections.abc import AsyncIterator
from typing import Any

import pytest

from agentloop import (
    AbortSignal,
    Event,
    QueryEngine,
    ScriptedModel,
    TextDelta,
    TurnEnded,
    validate_transcript,
)
from agentloop._model import ModelRequest, StreamBlockStop, StreamEnd, StreamEvent, StreamText
from agentloop._run import RunState
from tests.helpers import VirtualClock


class AbsorbsTwice:
    """A stream whose wait for its next event absorbs the abort's cancel and the one made a
    grace later too, then ends as if nothing happened."""

    async def stream(self, request: ModelRequest, signal: AbortSignal) -> AsyncIterator[StreamEvent]:
        yield StreamText(0, "Hello ")
        for _ in range(2):
            try:
                await asyncio.Event().wait()
            except asyncio.CancelledError:
                pass


async def test_every_cancel_the_run_made_of_a_read_that_absorbed_them_is_taken_back() -> None:
    """The run cancels the read at the abort and once more a grace later; the stream swallows
    both and ends. The host's task is left with no cancel of the run's: a host timeout around the
    run that expires after it is a TimeoutError, not a CancelledError."""
    engine = QueryEngine(AbsorbsTwice(), policies=[], tool_cancel_grace=0.05)
    task = asyncio.current_task()
    assert task is not None
    with pytest.raises(TimeoutError):
        async with asyncio.timeout(None) as scope:
            async for event in engine.run("go"):
                if isinstance(event, TextDelta):
                    engine.interrupt("escape")
            assert task.cancelling() == 0
            scope.reschedule(asyncio.get_running_loop().time())
            await asyncio.Event().wait()
    assert task.cancelling() == 0
    assert not engine.running and validate_transcript(engine.messages) == []


class Honours:
    """A stream whose wait for its next event honours the abort's cancel at once."""

    async def stream(self, request: ModelRequest, signal: AbortSignal) -> AsyncIterator[StreamEvent]:
        yield StreamText(0, "Hello ")
        await asyncio.Event().wait()


def run_timers(loop: asyncio.AbstractEventLoop) -> list[Any]:
    scheduled: list[Any] = getattr(loop, "_scheduled")  # noqa: B009
    return [
        h for h in scheduled if not h.cancelled() and getattr(getattr(h, "_callback", None), "__self__", None).__class__ is RunState
    ]


async def test_no_timer_of_the_run_outlives_it_after_an_abort_of_a_read() -> None:
    """The timer that would cancel the read again is cancelled once the read ended with the
    abort's cancel: nothing of the run (its task, its state) stays scheduled for the grace."""
    engine = QueryEngine(Honours(), policies=[], tool_cancel_grace=30.0)
    async for event in engine.run("go"):
        if isinstance(event, TextDelta):
            engine.interrupt("escape")
    assert run_timers(asyncio.get_running_loop()) == []


class SlowClose:
    """A stream object (no generator) whose ``aclose`` takes a while: a provider draining its
    HTTP response. ``cut`` when the close was cancelled."""

    def __init__(self, seconds: float) -> None:
        self.seconds = seconds
        self.cut = False
        self.closed = False
        self.events: list[StreamEvent] = [StreamText(0, "Hello"), StreamBlockStop(0), StreamEnd("end_turn")]

    def __aiter__(self) -> SlowClose:
        return self

    async def __anext__(self) -> StreamEvent:
        if not self.events:
            raise StopAsyncIteration
        return self.events.pop(0)

    async def aclose(self) -> None:
        try:
            await asyncio.sleep(self.seconds)
        except asyncio.CancelledError:
            self.cut = True
            raise
        self.closed = True


class SlowCloseModel:
    def __init__(self, seconds: float) -> None:
        self.seconds = seconds
        self.streams: list[SlowClose] = []

    def stream(self, request: ModelRequest, signal: AbortSignal) -> SlowClose:
        stream = SlowClose(self.seconds)
        self.streams.append(stream)
        return stream


async def test_a_close_of_a_stream_nobody_aborted_that_never_ends_is_cut_after_the_grace(caplog: pytest.LogCaptureFixture) -> None:
    """A close of a stream that ended normally gets the whole cancel grace (0 here: 0.1 s), then
    is cancelled with a warning: a custom model's close waiting on a dead connection does not
    keep the run from ending; the answer stands."""
    model = SlowCloseModel(3600)
    engine = QueryEngine(model, policies=[], tool_cancel_grace=0.0)
    with caplog.at_level(logging.WARNING, logger="agentloop"):
        async with asyncio.timeout(10):
            events: list[Event] = [e async for e in engine.run("go")]
    end = events[-1]
    assert isinstance(end, TurnEnded) and end.reason == "completed"
    assert model.streams[0].cut and not model.streams[0].closed
    assert "did not close within 0.1 s" in caplog.text
    assert [m.text for m in engine.messages] == ["go", "Hello"]


class OneDelta:
    """A stream object (no generator) that gives "Hello", then waits as `after_the_delta` does."""

    def __init__(self) -> None:
        self.sent = False

    def __aiter__(self) -> OneDelta:
        return self

    async def __anext__(self) -> StreamEvent:
        if not self.sent:
            self.sent = True
            return StreamText(0, "Hello")
        await self.after_the_delta()
        raise StopAsyncIteration

    async def after_the_delta(self) -> None:
        await asyncio.Event().wait()


class HangsEverywhere(OneDelta):
    """A stream whose read absorbs the abort's cancel in a cleanup that hangs (until cancelled
    again), and whose close hangs (until cancelled)."""

    async def after_the_delta(self) -> None:
        try:
            await asyncio.Event().wait()
        except asyncio.CancelledError:
            await asyncio.Event().wait()  # cancelled again: that one ends it

    async def aclose(self) -> None:
        await asyncio.Event().wait()


class HangsEverywhereModel:
    def stream(self, request: ModelRequest, signal: AbortSignal) -> HangsEverywhere:
        return HangsEverywhere()


async def test_the_grace_counts_once_from_the_abort_across_the_read_the_close_and_the_hooks(
    caplog: pytest.LogCaptureFixture,
) -> None:
    """A read whose cleanup hangs, a close that hangs and two hooks that hang: each is cut at
    what is left of one grace counted from the abort (each given at least 0.1 s to unwind), so
    run() ends well within twice the grace after the abort, not a grace per step."""
    grace = 0.5
    engine = QueryEngine(HangsEverywhereModel(), policies=[], tool_cancel_grace=grace)
    hooks_cut: list[str] = []

    async def hook(reason: str) -> None:
        try:
            await asyncio.Event().wait()
        except asyncio.CancelledError:
            hooks_cut.append(reason)
            raise

    engine.on_abort(hook)
    engine.on_abort(hook)
    aborted_at = 0.0
    # Virtual time: a slow machine's steps take none of it, so only the engine's own waits count.
    with VirtualClock() as clock, caplog.at_level(logging.WARNING, logger="agentloop"):
        async with asyncio.timeout(10):
            async for event in engine.run("go"):
                if isinstance(event, TextDelta):
                    aborted_at = clock.now
                    engine.interrupt("escape")
        took = clock.now - aborted_at
    assert hooks_cut == ["escape", "escape"]
    assert took < 2 * grace + 0.2, took
    assert "Traceback" not in caplog.text  # an ordinary time-out: a line, not a traceback


class TwoTurns:
    """Turn one's stream waits for its next event and honours the abort's cancel; turn two's
    absorbs it in a cleanup that waits until cancelled again, and notes when that came."""

    def __init__(self) -> None:
        self.calls = 0
        self.again_at: float | None = None

    async def stream(self, request: ModelRequest, signal: AbortSignal) -> AsyncIterator[StreamEvent]:
        self.calls += 1
        yield StreamText(0, f"turn {self.calls}")
        if self.calls == 1:
            await asyncio.Event().wait()
        try:
            await asyncio.Event().wait()
        except asyncio.CancelledError:
            try:
                await asyncio.Event().wait()
            except asyncio.CancelledError:
                self.again_at = asyncio.get_running_loop().time()
                raise


async def test_an_earlier_turns_abort_does_not_cancel_a_later_turns_read_again_early() -> None:
    """A send-now stops turn one's read; turn two is interrupted while its read waits, a while
    later. Its read is cancelled again a whole grace after its own abort, not by a timer left
    from turn one's."""
    grace = 0.5
    model = TwoTurns()
    engine = QueryEngine(model, policies=[], tool_cancel_grace=grace)
    loop = asyncio.get_running_loop()
    second_abort = 0.0
    async with asyncio.timeout(10):
        async for event in engine.run("go"):
            if isinstance(event, TextDelta) and event.text == "turn 1":
                engine.send_now("instead")
            elif isinstance(event, TextDelta) and event.text == "turn 2":
                await asyncio.sleep(grace / 2)  # turn two's abort comes well after turn one's
                second_abort = loop.time()
                engine.interrupt("escape")
    assert model.again_at is not None
    assert model.again_at - second_abort >= grace * 0.9


@pytest.mark.swallows_cancel  # the hook, on purpose
async def test_an_async_abort_hook_runs_in_the_runs_task_and_sees_its_context() -> None:
    """A hook awaits in the task that iterates the run (a contextvar the host set is the hook's,
    ``asyncio.current_task()`` is the host's task); the other hooks run after it."""
    marker: contextvars.ContextVar[str] = contextvars.ContextVar("marker", default="unset")
    seen: list[object] = []

    async def hook(reason: str) -> None:
        await asyncio.sleep(0)
        seen.append((reason, marker.get(), asyncio.current_task()))

    engine = QueryEngine(Honours(), policies=[])
    engine.on_abort(hook)
    engine.on_abort(seen.append)
    marker.set("the host's")
    async with asyncio.timeout(10):
        async for event in engine.run("go"):
            if isinstance(event, TextDelta):
                engine.interrupt("escape")
    assert seen == [("escape", "the host's", asyncio.current_task()), "escape"]


@pytest.mark.parametrize("kind", ["async", "sync"])
async def test_a_hook_cancelled_of_its_own_after_a_host_cancel_skips_neither_the_hooks_nor_the_grace(
    kind: str, caplog: pytest.LogCaptureFixture
) -> None:
    """The host cancels its task while a tool runs; the first abort hook raises a CancelledError of
    its own. It is that hook's failure: the next hook still runs, and the tool is still given its
    grace to stop on the abort (it ends with AbortError, not cancelled)."""
    from agentloop import AbortError, ScriptedResponse, ScriptedToolCall, ToolContext, tool

    running = asyncio.Event()
    outcome: list[str] = []
    later: list[str] = []

    @tool
    async def wait(ctx: ToolContext) -> str:
        running.set()
        try:
            await ctx.signal.wait()
            ctx.signal.throw_if_aborted()
        except BaseException as exc:
            outcome.append(type(exc).__name__)
            raise
        return "not reached"

    async def own_cancel_async(reason: str) -> None:
        raise asyncio.CancelledError

    def own_cancel_sync(reason: str) -> None:
        raise asyncio.CancelledError

    own_cancel = own_cancel_async if kind == "async" else own_cancel_sync
    model = ScriptedModel([ScriptedResponse(tool_calls=[ScriptedToolCall("wait", {})]), "Done."])
    engine = QueryEngine(model, tools=[wait], policies=[], tool_cancel_grace=5.0)
    engine.on_abort(own_cancel)
    engine.on_abort(later.append)

    async def host() -> None:
        async for _ in engine.run("go"):
            pass

    task = asyncio.create_task(host())
    await running.wait()
    task.cancel()
    with caplog.at_level(logging.ERROR, logger="agentloop"), pytest.raises(asyncio.CancelledError):
        await task
    assert later == ["consumer_closed"]
    assert outcome == [AbortError.__name__]
    assert "own_cancel" in caplog.text
    assert not engine.running and validate_transcript(engine.messages) == []


class ResetOnSecondCancel(OneDelta):
    """After the abort (its read cancelled), a close that hangs, and, cut at its limit, unwinds by
    waiting again; a cancel of that wait it turns into a connection error."""

    def __init__(self) -> None:
        super().__init__()
        self.unwinding = asyncio.Event()

    async def aclose(self) -> None:
        try:
            await asyncio.Event().wait()
        except asyncio.CancelledError:
            self.unwinding.set()
            try:
                await asyncio.Event().wait()
            except asyncio.CancelledError:
                raise RuntimeError("connection reset") from None


async def test_a_host_cancel_while_a_cut_close_unwinds_into_an_error_reaches_the_host() -> None:
    """The close was cut at its limit after the abort; the host cancels its task as the close
    unwinds, and the close turns that cancel into an error: the host's cancel goes on."""
    stream = ResetOnSecondCancel()

    class Model:
        def stream(self, request: ModelRequest, signal: AbortSignal) -> ResetOnSecondCancel:
            return stream

    engine = QueryEngine(Model(), policies=[], tool_cancel_grace=0.0)

    async def host() -> None:
        async for event in engine.run("go"):
            if isinstance(event, TextDelta):
                engine.interrupt("escape")

    task = asyncio.create_task(host())
    async with asyncio.timeout(10):
        await stream.unwinding.wait()
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
    assert not engine.running


async def test_a_host_cancel_a_hook_turns_into_an_error_reaches_the_host() -> None:
    """An async hook awaiting a library that turns a cancel into its own error (a connection
    reset): the host's cancel of the run, arriving then, goes on; it is not logged as the hook's
    failure with the run ending normally."""
    waiting = asyncio.Event()

    async def hook(reason: str) -> None:
        try:
            waiting.set()
            await asyncio.Event().wait()
        except asyncio.CancelledError:
            raise ConnectionError("reset while the request was cancelled") from None

    engine = QueryEngine(Honours(), policies=[], tool_cancel_grace=30.0)
    engine.on_abort(hook)

    async def host() -> None:
        async for event in engine.run("go"):
            if isinstance(event, TextDelta):
                engine.interrupt("escape")

    task = asyncio.create_task(host())
    async with asyncio.timeout(10):
        await waiting.wait()
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
    assert not engine.running
