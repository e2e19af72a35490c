"""A host's cancel arriving at each place where the library awaits during cleanup or a wait of
its own: it propagates, once the cleanup is done, and leaves nothing running (SPEC §1)."""

from __future__ import annotations

import asyncio
import contextlib
import gc
import logging
import sys
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest

from agentloop import (
    ModelError,
    QueryEngine,
    Retrying,
    ScriptedModel,
    ScriptedResponse,
    ScriptedToolCall,
    ToolCallStarted,
    ToolContext,
    tool,
    validate_transcript,
)
from agentloop._executor import _abandoned
from tests.helpers import VirtualClock, child_pids_alive, collect, stubborn_prompt

SERVER = str(Path(__file__).with_name("mcp_server.py"))


def alive(prefix: str) -> list[asyncio.Task[Any]]:
    return [t for t in asyncio.all_tasks() if t.get_name().startswith(prefix) and not t.done()]


# -- the model phase -------------------------------------------------------------------------------


async def test_a_host_cancel_during_the_retry_back_off_propagates_and_leaves_a_valid_transcript() -> None:
    failing = ScriptedResponse(text="Half an ans", chunk=4, error=ModelError("upstream hiccup", retryable=True), error_after=2)
    engine = QueryEngine(ScriptedModel([failing, "Whole answer."]), policies=[], retry_base_delay=30.0, retry_max_delay=30.0)
    backing_off = asyncio.Event()

    async def consume() -> None:
        async for event in engine.run("go"):
            if isinstance(event, Retrying):
                backing_off.set()  # the loop sleeps next, once this event is taken

    task = asyncio.create_task(consume())
    await backing_off.wait()
    await asyncio.sleep(0)  # the consumer asks for the next event: the loop is in the back-off
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
    assert not engine.running and engine._state is None
    assert validate_transcript(engine.messages) == []
    assert [m.text for m in engine.messages] == ["go"]  # the failed attempt was discarded, not kept


# -- the tool phase -------------------------------------------------------------------------------


async def test_a_host_cancel_during_the_tool_cancel_grace_propagates_once_the_calls_are_stopped() -> None:
    """An interrupt gives the calls a grace; the host's cancel during it ends the run when the
    grace does (the calls' cleanup is the run's), with the CancelledError, every call stopped."""
    aborted, stopped = asyncio.Event(), asyncio.Event()

    @tool
    async def deaf(ctx: ToolContext) -> str:
        try:
            await ctx.signal.wait()
            aborted.set()
            await asyncio.Event().wait()  # ignores the abort: only a cancel stops it
        finally:
            stopped.set()
        return "not reached"

    model = ScriptedModel([ScriptedResponse(tool_calls=[ScriptedToolCall("deaf", {})])])
    engine = QueryEngine(model, tools=[deaf], policies=[], tool_cancel_grace=5.0)

    async def consume() -> None:
        async for event in engine.run("go"):
            if isinstance(event, ToolCallStarted):
                engine.interrupt()

    with VirtualClock() as clock:
        start = clock.now
        task = asyncio.create_task(consume())
        await aborted.wait()
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task
        assert stopped.is_set() and clock.now - start <= 5.0 + 1.0  # the grace, not a second one
    assert not engine.running and engine._state is None
    assert validate_transcript(engine.messages) == []


# -- MCP server shutdown -------------------------------------------------------------------------


async def closing_task_started(srv: Any) -> asyncio.Event:
    """An event set once ``srv`` has started the task closing its connection (`_detach`)."""
    started = asyncio.Event()
    detach = srv._detach

    def hooked() -> Any:
        task = detach()
        if task is not None:
            started.set()
        return task

    srv._detach = hooked
    return started


async def test_a_host_cancel_during_an_mcp_servers_aclose_propagates_once_the_server_is_stopped() -> None:
    from agentloop.mcp import MCPServer

    srv = MCPServer.stdio(sys.executable, [SERVER, "--linger", "0.5"])  # slow to exit: the cancel lands meanwhile
    before = child_pids_alive()
    assert await srv.list_tools()
    assert child_pids_alive() - before  # the server runs
    started = await closing_task_started(srv)
    closer = asyncio.create_task(srv.aclose())
    await started.wait()
    closer.cancel()
    with pytest.raises(asyncio.CancelledError):
        await closer
    assert alive("agentloop-mcp") == []  # the server was stopped before the cancel propagated
    assert child_pids_alive() - before == set()


async def test_a_cancel_of_the_task_closing_a_connection_is_not_swallowed() -> None:
    """`Connection.close` waits for its transport; a cancel of its own caller propagates, while
    the cancellation it caused itself (of a transport still connecting) does not."""
    from agentloop.mcp._connection import Connection

    connecting, releasing = asyncio.Event(), asyncio.Event()

    @contextlib.asynccontextmanager
    async def connect() -> AsyncIterator[Any]:
        try:
            connecting.set()
            await asyncio.Event().wait()  # never connects
            yield None, None
        finally:
            await asyncio.shield(releasing.wait())  # a transport that takes a while to stop

    conn = Connection(connect, "test", None, lambda _m: None, lambda _c: None)
    await connecting.wait()
    closer = asyncio.create_task(conn.close())
    await asyncio.sleep(0)  # it cancelled the connecting task and waits for it
    closer.cancel()
    await asyncio.sleep(0)
    releasing.set()
    with pytest.raises(asyncio.CancelledError):
        await closer

    # Closed by no one but itself: its own cancellation of the transport stays inside.
    connecting.clear()
    releasing.set()
    conn = Connection(connect, "test", None, lambda _m: None, lambda _c: None)
    await connecting.wait()
    await conn.close()


# -- a permission prompt --------------------------------------------------------------------------


@pytest.mark.swallows_cancel
async def test_a_prompt_ignoring_its_cancel_is_held_and_warned_about_when_the_host_cancels_the_run(
    caplog: pytest.LogCaptureFixture,
) -> None:
    """The host cancels its task while a call waits for its permission prompt, with no cancel
    grace: the run cancels the call while the call still waits for the prompt to unwind. The
    prompt, which ignores its cancellation, is abandoned as on an interrupt: with a warning, and
    held until it ends (not left to the garbage collector mid-await)."""
    asked, release, ended = asyncio.Event(), asyncio.Event(), asyncio.Event()

    permission = stubborn_prompt(asked, release, ended)

    @tool
    async def t() -> str:
        raise AssertionError("must not run")

    model = ScriptedModel([ScriptedResponse(tool_calls=[ScriptedToolCall("t", {})])])
    engine = QueryEngine(model, tools=[t], policies=[], permission=permission, tool_cancel_grace=0.0)
    task = asyncio.create_task(collect(engine, "go"))
    await asked.wait()
    with caplog.at_level(logging.WARNING, logger="agentloop"):
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task
    assert not engine.running and validate_transcript(engine.messages) == []
    prompts = [t for t in asyncio.all_tasks() if not t.done() and t.get_coro().__name__ == "ask"]  # type: ignore[union-attr]
    assert len(prompts) == 1 and prompts[0] in _abandoned  # held until it ends
    assert [r for r in caplog.records if "ignored cancellation; abandoning it" in r.getMessage() and "ask" in r.getMessage()]
    gc.collect()  # held: not collected mid-await
    release.set()
    await ended.wait()


# -- a sibling's failure --------------------------------------------------------------------------


async def test_a_sibling_failing_in_the_hosts_task_group_stops_the_run_and_leaves_nothing() -> None:
    """The run is iterated in a `TaskGroup` whose other task fails while a tool runs: the group
    cancels the run's task, which ends the run (its tool stopped, its transcript valid) and lets
    the group raise the sibling's error."""
    running, stopped = asyncio.Event(), asyncio.Event()

    @tool
    async def slow() -> str:
        running.set()
        try:
            await asyncio.Event().wait()
        finally:
            stopped.set()
        return "not reached"

    model = ScriptedModel([ScriptedResponse(tool_calls=[ScriptedToolCall("slow", {})])])
    engine = QueryEngine(model, tools=[slow], policies=[], tool_cancel_grace=0.0)

    async def sibling() -> None:
        await running.wait()
        raise LookupError("the sibling failed")

    with pytest.raises(ExceptionGroup) as raised:
        async with asyncio.TaskGroup() as group:
            group.create_task(collect(engine, "go"))
            group.create_task(sibling())
            # Inside the block until the group cancels it: Python 3.11's TaskGroup takes back its
            # cancel of the task running it only when the block itself ends with it.
            await asyncio.Event().wait()
    assert [type(e) for e in raised.value.exceptions] == [LookupError]
    assert stopped.is_set() and not engine.running and engine._state is None
    assert validate_transcript(engine.messages) == []
    assert [t for t in asyncio.all_tasks() if t is not asyncio.current_task() and not t.done()] == []
