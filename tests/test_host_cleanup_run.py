"""A run started inside the host's own cancellation cleanup: the host's task was cancelled, and in
its ``except CancelledError:`` (or its ``finally``) it runs the engine to the end, to save a
summary, before the cancel goes on. The task's ``cancelling()`` is 1 all that time (nobody took
the cancel back): a cancel the run must not take for one made of it now, nor swallow."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from typing import Any

import pytest

from agentloop import (
    AbortSignal,
    Allow,
    Event,
    QueryEngine,
    ScriptedModel,
    ScriptedResponse,
    ScriptedToolCall,
    ToolContext,
    ToolUseBlock,
    TurnEnded,
    tool,
    validate_transcript,
)
from agentloop._model import ModelRequest, StreamEvent, StreamText


@tool
async def note(text: str) -> str:
    """Note a line."""
    await asyncio.sleep(0)
    return f"noted {text}"


async def allow(use: ToolUseBlock, ctx: ToolContext) -> Allow:
    await asyncio.sleep(0)
    return Allow()


def _engine(**kw: Any) -> QueryEngine:
    script = [
        ScriptedResponse(text="Saving. ", tool_calls=[ScriptedToolCall("note", {"text": "a"})], chunk=3),
        ScriptedResponse(text="The summary, in a few words.", chunk=4),
    ]
    return QueryEngine(ScriptedModel(script), tools=[note], **kw)


@pytest.mark.parametrize("where", ["except", "finally"])
@pytest.mark.parametrize("prompted", [False, True], ids=["no-prompt", "permission-prompt"])
async def test_a_run_in_the_hosts_cancel_cleanup_completes_and_the_cancel_goes_on(where: str, prompted: bool) -> None:
    engine = _engine(permission=allow if prompted else None)
    waiting = asyncio.Event()
    seen: dict[str, Any] = {}

    async def summarize() -> None:
        task = asyncio.current_task()
        assert task is not None
        seen["cancelling"] = task.cancelling()
        events: list[Event] = [e async for e in engine.run("Summarize.")]
        seen["events"] = events
        seen["after"] = task.cancelling()

    async def host() -> None:
        if where == "except":
            try:
                waiting.set()
                await asyncio.Event().wait()
            except asyncio.CancelledError:
                await summarize()
                raise
        else:
            try:
                waiting.set()
                await asyncio.Event().wait()
            finally:
                await summarize()

    task = asyncio.create_task(host())
    await waiting.wait()
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
    assert task.cancelled()
    assert seen["cancelling"] == 1 and seen["after"] == 1  # the host's cancel, still there, and only it
    [end] = [e for e in seen["events"] if isinstance(e, TurnEnded)]
    assert (end.reason, end.abort_reason) == ("completed", None)
    assert engine.messages[-1].text == "The summary, in a few words."
    [result] = [r for m in engine.messages for r in m.tool_results]
    assert not result.is_error and result.text == "noted a"
    assert validate_transcript(engine.messages) == [] and not engine.running


async def test_an_interrupt_of_a_run_in_the_hosts_cancel_cleanup_stops_it_and_the_cancel_goes_on() -> None:
    # The run's own abort, in a task already cancelling: its cancel is the run's, taken back; the
    # host's stays, and goes on.
    release = asyncio.Event()

    @tool
    async def slow() -> str:
        """Work slowly."""
        release.set()
        await asyncio.Event().wait()
        return "never"

    model = ScriptedModel([ScriptedResponse(tool_calls=[ScriptedToolCall("slow", {})]), "after"])
    engine = QueryEngine(model, tools=[slow])
    waiting = asyncio.Event()
    seen: dict[str, Any] = {}

    async def host() -> None:
        try:
            waiting.set()
            await asyncio.Event().wait()
        except asyncio.CancelledError:
            task = asyncio.current_task()
            assert task is not None
            seen["events"] = [e async for e in engine.run("go")]
            seen["after"] = task.cancelling()
            raise

    async def interrupt() -> None:
        await release.wait()
        engine.interrupt()

    task = asyncio.create_task(host())
    await waiting.wait()
    task.cancel()
    stopper = asyncio.create_task(interrupt())
    with pytest.raises(asyncio.CancelledError):
        await task
    await stopper
    assert seen["after"] == 1
    [end] = [e for e in seen["events"] if isinstance(e, TurnEnded)]
    assert (end.reason, end.abort_reason) == ("aborted_tools", "cancel")
    assert model.request_count == 1
    assert validate_transcript(engine.messages) == [] and not engine.running


async def test_a_run_in_a_cleanup_that_took_the_cancel_back_is_a_plain_run() -> None:
    # The host uncancel()s first (the cancel is handled, not going on): the run is an ordinary one.
    engine = _engine()
    waiting = asyncio.Event()

    async def host() -> str:
        try:
            waiting.set()
            await asyncio.Event().wait()
        except asyncio.CancelledError:
            task = asyncio.current_task()
            assert task is not None
            task.uncancel()
        async for _ in engine.run("Summarize."):
            pass
        return engine.messages[-1].text

    task = asyncio.create_task(host())
    await waiting.wait()
    task.cancel()
    assert await task == "The summary, in a few words."


class _SelfCancelling:
    """A model whose stream raises CancelledError of its own (what it awaited was cancelled, a
    connection's reader task, say): nobody cancelled the run's task."""

    async def stream(self, request: ModelRequest, signal: AbortSignal) -> AsyncIterator[StreamEvent]:
        yield StreamText(0, "Half an")
        raise asyncio.CancelledError


class _Held:
    """A model whose stream waits (``reading`` set) until cancelled."""

    def __init__(self) -> None:
        self.reading = asyncio.Event()

    async def stream(self, request: ModelRequest, signal: AbortSignal) -> AsyncIterator[StreamEvent]:
        yield StreamText(0, "Half an")
        self.reading.set()
        await asyncio.Event().wait()


async def _in_cleanup(engine: QueryEngine, again: asyncio.Event | None = None) -> tuple[asyncio.Task[None], dict[str, Any]]:
    """Run ``engine`` in the cancel cleanup of a host task, cancelled once (and again once
    ``again`` is set); the task, and what the cleanup saw."""
    waiting = asyncio.Event()
    seen: dict[str, Any] = {}

    async def host() -> None:
        try:
            waiting.set()
            await asyncio.Event().wait()
        except asyncio.CancelledError:
            task = asyncio.current_task()
            assert task is not None
            try:
                seen["events"] = [e async for e in engine.run("Summarize.")]
            except asyncio.CancelledError:
                seen["cancelled"] = task.cancelling()
                raise
            raise

    task = asyncio.create_task(host())
    await waiting.wait()
    task.cancel()
    return task, seen


async def test_a_stream_that_cancels_itself_in_the_hosts_cancel_cleanup_is_a_model_error_as_anywhere() -> None:
    # The host's cancel, there before the run began, was taken for one made of the run's task
    # now: the stream's own CancelledError came out of run() in place of the model error.
    task, seen = await _in_cleanup(QueryEngine(_SelfCancelling()))
    with pytest.raises(asyncio.CancelledError):
        await task
    assert "cancelled" not in seen
    [end] = [e for e in seen["events"] if isinstance(e, TurnEnded)]
    assert end.reason == "model_error" and "though the run was not cancelled" in (end.error or "")


async def test_a_second_cancel_of_the_host_during_a_run_in_its_cancel_cleanup_goes_through() -> None:
    model = _Held()
    engine = QueryEngine(model)
    task, seen = await _in_cleanup(engine)
    await model.reading.wait()
    task.cancel()  # the host gives up on its cleanup too
    with pytest.raises(asyncio.CancelledError):
        await task
    assert seen["cancelled"] == 2 and "events" not in seen
    assert validate_transcript(engine.messages) == [] and not engine.running



class _Paced:
    """A model whose stream writes a part, then waits for ``go`` (``reading`` set) to write the
    next, then waits until cancelled (``read_on`` set)."""

    def __init__(self) -> None:
        self.reading = asyncio.Event()
        self.go = asyncio.Event()
        self.read_on = asyncio.Event()

    async def stream(self, request: ModelRequest, signal: AbortSignal) -> AsyncIterator[StreamEvent]:
        yield StreamText(0, "Half ")
        self.reading.set()
        await self.go.wait()
        yield StreamText(0, "an")
        self.read_on.set()
        await asyncio.Event().wait()


async def test_a_cancel_of_the_host_after_it_took_back_the_first_goes_through() -> None:
    # The cancel the run began under is taken back while the model's stream waits, and the task
    # is cancelled anew later: cancelling() is 1 again, no more than when the run began, and that
    # new cancel was swallowed, the run ending on a model error ("though the run was not cancelled").
    model = _Paced()
    engine = QueryEngine(model)
    task, seen = await _in_cleanup(engine)
    await model.reading.wait()
    assert task.uncancel() == 0  # the first cancel is handled
    model.go.set()
    await model.read_on.wait()  # the stream ran on: read again, from a task not cancelling
    task.cancel()  # the host cancels again: this one is the run's
    with pytest.raises(asyncio.CancelledError):
        await task
    assert seen["cancelled"] == 1 and "events" not in seen
    assert validate_transcript(engine.messages) == [] and not engine.running
