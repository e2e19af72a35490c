"""The host's cancel, at each place the library awaits, reaches the host as a cancel: through an
`asyncio.timeout` around the host's iteration (a `TimeoutError`, its task's ``cancelling()``
back to 0), through a `TaskGroup` whose sibling fails (only the sibling's error), or a plain
``task.cancel()``. The run's own abort, consumed where it was caused, never eats one of them."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Callable
from typing import Any

import pytest

from agentloop import (
    AbortSignal,
    Allow,
    Event,
    ModelError,
    QueryEngine,
    Retrying,
    ScriptedModel,
    ScriptedResponse,
    ScriptedToolCall,
    ToolCallStarted,
    ToolContext,
    TurnEnded,
    tool,
    validate_transcript,
)
from agentloop._model import ModelRequest, StreamEvent, StreamText
from tests.helpers import HangingModel, VirtualClock

OnEvent = Callable[[Event], None]


class Host:
    """Iterates ``engine.run(prompt)`` in a task of its own, under an `asyncio.timeout` that
    `expire` makes expire at once: the host's deadline passing at the await the run is at."""

    def __init__(self, engine: QueryEngine, prompt: str | None = "go", on_event: OnEvent | None = None) -> None:
        self.engine = engine
        self.prompt = prompt
        self.on_event = on_event
        self.events: list[Event] = []
        self.scope: asyncio.Timeout | None = None
        self.outcome: tuple[str, int] | None = None

    async def iterate(self) -> None:
        async for event in self.engine.run(self.prompt):
            self.events.append(event)
            if self.on_event is not None:
                self.on_event(event)

    async def under_timeout(self) -> None:
        task = asyncio.current_task()
        assert task is not None
        try:
            async with asyncio.timeout(None) as self.scope:
                await self.iterate()
        except TimeoutError:
            self.outcome = ("timed out", task.cancelling())
        else:
            self.outcome = ("ended", task.cancelling())

    def expire(self) -> None:
        assert self.scope is not None
        self.scope.reschedule(asyncio.get_running_loop().time())


def settled(engine: QueryEngine) -> None:
    assert not engine.running and engine._state is None
    assert validate_transcript(engine.messages) == []


async def expire_at(host: Host, reached: asyncio.Event) -> None:
    """Run ``host`` under its timeout, expire it once ``reached`` is set: it times out, its task
    with no cancel left over."""
    task = asyncio.create_task(host.under_timeout())
    await reached.wait()
    host.expire()
    await task
    assert host.outcome == ("timed out", 0)
    settled(host.engine)


async def fail_sibling_at(host: Host, reached: asyncio.Event) -> None:
    """Run ``host`` in a `TaskGroup` whose other task fails once ``reached`` is set: the group
    raises that failure alone (the run's task ended by the group's cancel, not by an error)."""

    async def sibling() -> None:
        await reached.wait()
        raise LookupError("the sibling failed")

    with pytest.raises(ExceptionGroup) as raised:
        async with asyncio.TaskGroup() as group:
            group.create_task(host.iterate())
            group.create_task(sibling())
            # In the block until the group cancels it: Python 3.11's TaskGroup takes back its
            # cancel of the task running it only when the block itself ends with it.
            await asyncio.Event().wait()
    assert [type(e) for e in raised.value.exceptions] == [LookupError]
    me = asyncio.current_task()
    assert me is not None and me.cancelling() == 0
    settled(host.engine)


async def cancel_at(host: Host, reached: asyncio.Event) -> None:
    task = asyncio.create_task(host.iterate())
    await reached.wait()
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
    settled(host.engine)


HOST_CANCELS = [expire_at, fail_sibling_at, cancel_at]


# -- the model phase -------------------------------------------------------------------------------


@pytest.mark.parametrize("source", HOST_CANCELS)
async def test_a_host_cancel_while_the_model_streams(source: Any) -> None:
    model = HangingModel()
    await source(Host(QueryEngine(model, policies=[])), model.waiting)
    assert model.closed


class TurnsCancelIntoAnError:
    """Streams some text, then waits; a cancel of that wait becomes a retryable `ModelError` (a
    client library that wraps whatever ends a read). Every attempt does the same."""

    def __init__(self) -> None:
        self.waiting = asyncio.Event()
        self.attempts = 0

    async def stream(self, request: ModelRequest, signal: AbortSignal) -> AsyncIterator[StreamEvent]:
        self.attempts += 1
        yield StreamText(0, "Hello")
        self.waiting.set()
        try:
            await asyncio.Event().wait()
        except asyncio.CancelledError:
            raise ModelError("the connection was lost", retryable=True) from None


@pytest.mark.parametrize("source", HOST_CANCELS)
async def test_a_host_cancel_the_stream_turns_into_an_error_is_still_the_hosts_cancel(source: Any) -> None:
    """Not a model error the run retries: the host's cancel goes on, and no attempt follows."""
    model = TurnsCancelIntoAnError()
    await source(Host(QueryEngine(model, policies=[], retry_base_delay=0.0)), model.waiting)
    assert model.attempts == 1


class SlowClose:
    """Streams some text, waits, and on its way out (closed) waits for ``release``: its closing
    awaits. ``closing`` is set as the close begins."""

    def __init__(self, convert: bool = False) -> None:
        self.waiting, self.closing, self.release = asyncio.Event(), asyncio.Event(), asyncio.Event()
        self.closed = False
        self.convert = convert  # a cancel of its closing wait becomes an error of its own

    async def stream(self, request: ModelRequest, signal: AbortSignal) -> AsyncIterator[StreamEvent]:
        try:
            yield StreamText(0, "Hello")
            self.waiting.set()
            await asyncio.Event().wait()
        finally:
            await self.cleanup()

    async def cleanup(self) -> None:
        """The stream's cleanup: it waits for ``release``; a cancel of that wait goes on, or, with
        ``convert``, becomes an error of its own."""
        self.closing.set()
        try:
            await self.release.wait()
        except asyncio.CancelledError:
            if self.convert:
                raise RuntimeError("the connection could not be closed cleanly") from None
            raise
        finally:
            self.closed = True


@pytest.mark.parametrize("convert", [False, True])
@pytest.mark.parametrize("source", HOST_CANCELS)
async def test_a_host_cancel_while_an_interrupted_stream_closes(source: Any, convert: bool) -> None:
    """Also when the stream's close turns the cancel into an error of its own: logged, and the
    host's cancel goes on."""
    model = SlowClose(convert)
    engine = QueryEngine(model, policies=[])

    async def interrupt_then_wait() -> None:
        await model.waiting.wait()
        engine.interrupt()

    stopper = asyncio.create_task(interrupt_then_wait())
    await source(Host(engine), model.closing)
    await stopper
    assert model.closed


class ClosedAtAYield(SlowClose):
    """Streams two deltas at once, then waits; its close waits for ``release``. An interrupt
    while the host holds the first ends the attempt at the second, the stream paused at its
    ``yield``: the loop closes it, and the close awaits."""

    async def stream(self, request: ModelRequest, signal: AbortSignal) -> AsyncIterator[StreamEvent]:
        try:
            yield StreamText(0, "Hello")
            yield StreamText(0, " there")
            await asyncio.Event().wait()
        finally:
            await self.cleanup()


@pytest.mark.parametrize("convert", [False, True])
@pytest.mark.parametrize("source", HOST_CANCELS)
async def test_a_host_cancel_while_the_loop_closes_a_stream(source: Any, convert: bool) -> None:
    model = ClosedAtAYield(convert)
    engine = QueryEngine(model, policies=[])

    def interrupt(event: Event) -> None:
        if getattr(event, "text", None) == "Hello":
            engine.interrupt()

    await source(Host(engine, on_event=interrupt), model.closing)
    assert model.closed


@pytest.mark.parametrize("source", HOST_CANCELS)
async def test_a_host_cancel_during_the_retry_back_off(source: Any) -> None:
    failing = ScriptedResponse(text="Half", chunk=4, error=ModelError("hiccup", retryable=True), error_after=1)
    engine = QueryEngine(ScriptedModel([failing, "Whole."]), policies=[], retry_base_delay=30.0, retry_max_delay=30.0)
    backing_off = asyncio.Event()

    def note(event: Event) -> None:
        if isinstance(event, Retrying):
            backing_off.set()

    await source(Host(engine, on_event=note), backing_off)


# -- the tool phase -------------------------------------------------------------------------------


def waiting_tool(running: asyncio.Event, stopped: asyncio.Event) -> Any:
    @tool
    async def wait() -> str:
        running.set()
        try:
            await asyncio.Event().wait()
        finally:
            stopped.set()
        return "not reached"

    return wait


def calls(*names: str) -> ScriptedModel:
    return ScriptedModel([ScriptedResponse(tool_calls=[ScriptedToolCall(n, {}) for n in names]), "Done."])


@pytest.mark.parametrize("source", HOST_CANCELS)
async def test_a_host_cancel_while_a_tool_runs(source: Any) -> None:
    running, stopped = asyncio.Event(), asyncio.Event()
    engine = QueryEngine(calls("wait"), tools=[waiting_tool(running, stopped)], policies=[], tool_cancel_grace=0.5)
    await source(Host(engine), running)
    assert stopped.is_set()


@pytest.mark.parametrize("source", HOST_CANCELS)
async def test_a_host_cancel_while_a_permission_prompt_waits(source: Any) -> None:
    asked, closed = asyncio.Event(), asyncio.Event()
    running, stopped = asyncio.Event(), asyncio.Event()

    async def prompt(use: object, ctx: object) -> Allow:
        asked.set()
        try:
            await asyncio.Event().wait()
        finally:
            closed.set()
        return Allow()

    engine = QueryEngine(
        calls("wait"), tools=[waiting_tool(running, stopped)], policies=[], permission=prompt, tool_cancel_grace=0.5
    )
    await source(Host(engine), asked)
    assert closed.is_set() and not running.is_set()


@pytest.mark.parametrize("source", HOST_CANCELS)
async def test_a_host_cancel_while_an_abort_hook_waits(source: Any) -> None:
    running, stopped = asyncio.Event(), asyncio.Event()
    hooked, unhooked = asyncio.Event(), asyncio.Event()
    engine = QueryEngine(calls("wait"), tools=[waiting_tool(running, stopped)], policies=[], tool_cancel_grace=0.0)
    called: list[str] = []

    async def hook(reason: str) -> None:
        called.append(reason)
        hooked.set()
        try:
            await asyncio.Event().wait()
        finally:
            unhooked.set()

    engine.on_abort(hook)

    def interrupt(event: Event) -> None:
        if isinstance(event, ToolCallStarted):
            engine.interrupt()

    await source(Host(engine, on_event=interrupt), hooked)
    assert unhooked.is_set() and called == ["cancel"]  # called once, not again by the cleanup


@pytest.mark.parametrize("source", HOST_CANCELS)
async def test_a_host_cancel_during_the_grace_an_interrupt_gave(source: Any) -> None:
    aborted, stopped = asyncio.Event(), asyncio.Event()

    @tool
    async def deaf(ctx: ToolContext) -> str:
        try:
            await ctx.signal.wait()
            aborted.set()
            await asyncio.Event().wait()
        finally:
            stopped.set()
        return "not reached"

    engine = QueryEngine(calls("deaf"), tools=[deaf], policies=[], tool_cancel_grace=0.2)

    def interrupt(event: Event) -> None:
        if isinstance(event, ToolCallStarted):
            engine.interrupt()

    await source(Host(engine, on_event=interrupt), aborted)
    assert stopped.is_set()


# -- a subagent ------------------------------------------------------------------------------------


@pytest.mark.parametrize("source", HOST_CANCELS)
async def test_a_host_cancel_while_a_subagents_model_streams(source: Any) -> None:
    from agentloop import delegate_tool

    child_model = HangingModel()
    parent_model = ScriptedModel([ScriptedResponse(tool_calls=[ScriptedToolCall("delegate", {"task": "look"})]), "Done."])
    engine = QueryEngine(parent_model, tools=[delegate_tool(name="delegate", model=child_model)], policies=[], tool_cancel_grace=0.2)
    await source(Host(engine), child_model.waiting)
    assert child_model.closed



async def interrupted_under_timeout(host: Host, waiting: asyncio.Event) -> None:
    """Iterate ``host``'s run under its timeout; interrupt the run once ``waiting`` is set."""

    async def interrupt() -> None:
        await waiting.wait()
        host.engine.interrupt()

    stopper = asyncio.create_task(interrupt())
    await host.under_timeout()
    await stopper

# -- the run's own abort, with the host's cancel at the same time -----------------------------------


async def test_an_interrupt_under_a_hosts_timeout_leaves_no_cancel_behind() -> None:
    model = HangingModel()
    engine = QueryEngine(model, policies=[])
    host = Host(engine)

    await interrupted_under_timeout(host, model.waiting)
    assert host.outcome == ("ended", 0)
    assert isinstance(host.events[-1], TurnEnded) and host.events[-1].reason == "aborted_streaming"
    settled(engine)


@pytest.mark.parametrize("order", ["abort first", "host first"])
async def test_an_interrupt_and_a_host_timeout_together_end_in_the_timeout(order: str) -> None:
    model = HangingModel()
    engine = QueryEngine(model, policies=[])
    host = Host(engine)
    task = asyncio.create_task(host.under_timeout())
    await model.waiting.wait()
    if order == "abort first":
        engine.interrupt()
        host.expire()
    else:
        host.expire()
        await asyncio.sleep(0)
        engine.interrupt()
    await task
    assert host.outcome == ("timed out", 0)
    settled(engine)


class SwallowsOnce:
    """A model stream that catches the first cancel of its read (it should not) and goes on:
    it streams ``after`` and then ends (``hang=False``) or waits for good (``hang=True``)."""

    def __init__(self, after: tuple[str, ...] = (" there",), hang: bool = False) -> None:
        self.after = after
        self.hang = hang
        self.waiting = asyncio.Event()
        self.swallowed = False

    async def stream(self, request: ModelRequest, signal: AbortSignal) -> AsyncIterator[StreamEvent]:
        yield StreamText(0, "Hello")
        self.waiting.set()
        try:
            await asyncio.Event().wait()
        except asyncio.CancelledError:
            self.swallowed = True
        for text in self.after:
            yield StreamText(0, text)
        if self.hang:
            await asyncio.Event().wait()


async def test_an_abort_cancel_the_stream_swallowed_is_taken_back_by_the_runs_end() -> None:
    """The run's own cancel of the read, caught by the stream, does not stay on the host's
    task: after the run its ``cancelling()`` is 0, and the same task's next run is not taken
    for one its host is cancelling."""
    model = SwallowsOnce()
    engine = QueryEngine(model, policies=[])
    host = Host(engine)

    await interrupted_under_timeout(host, model.waiting)
    assert model.swallowed
    assert host.outcome == ("ended", 0)
    ended = host.events[-1]
    assert isinstance(ended, TurnEnded) and ended.reason == "aborted_streaming"
    settled(engine)


async def test_a_host_timeout_after_a_swallowed_abort_cancel_is_not_taken_for_the_abort() -> None:
    """The stream caught the abort's cancel, streamed on, then waited; the host's deadline,
    passing as it handled that delta, reaches it as its TimeoutError, not as the run's abort."""
    model = SwallowsOnce(hang=True)
    engine = QueryEngine(model, policies=[])
    host = Host(engine)

    def expire_on_the_late_delta(event: Event) -> None:
        if model.swallowed and host.scope is not None and not host.scope.expired():
            host.expire()

    host.on_event = expire_on_the_late_delta
    task = asyncio.create_task(host.under_timeout())
    await model.waiting.wait()
    engine.interrupt()
    await task
    assert model.swallowed
    assert host.outcome == ("timed out", 0)
    settled(engine)



async def test_a_host_timeout_while_it_awaits_holding_a_delta_after_a_swallowed_abort_cancel() -> None:
    """The stream caught the abort's cancel and gave a delta; while the host holds it, awaiting
    its own work, no cancel of the run's is left on its task, and its deadline passing there is
    its TimeoutError, not a CancelledError."""
    model = SwallowsOnce(hang=True)
    engine = QueryEngine(model, policies=[])
    loop = asyncio.get_running_loop()
    never = asyncio.Event()  # the host's own work, which its deadline cuts
    seen: list[object] = []

    async def host() -> None:
        task = asyncio.current_task()
        assert task is not None
        try:
            async with asyncio.timeout(None) as scope:
                async for _event in engine.run("go"):
                    if model.swallowed and not seen:
                        seen.append(task.cancelling())
                        scope.reschedule(loop.time())
                        await never.wait()
        except TimeoutError:
            seen.append(("timed out", task.cancelling()))

    running = asyncio.create_task(host())
    await model.waiting.wait()
    engine.interrupt()
    await running
    assert seen == [0, ("timed out", 0)]


# -- an HTTP model's stream ------------------------------------------------------------------------


def _anthropic_events(*events: tuple[str, dict[str, Any]]) -> bytes:
    import json

    return "".join(f"event: {name}\ndata: {json.dumps(data)}\n\n" for name, data in events).encode()


_START = _anthropic_events(
    ("message_start", {"type": "message_start", "message": {"id": "msg_1", "usage": {"input_tokens": 3, "output_tokens": 1}}}),
    ("content_block_start", {"type": "content_block_start", "index": 0, "content_block": {"type": "text", "text": ""}}),
    ("content_block_delta", {"type": "content_block_delta", "index": 0, "delta": {"type": "text_delta", "text": "Hello"}}),
)
_MORE = _anthropic_events(
    ("content_block_delta", {"type": "content_block_delta", "index": 0, "delta": {"type": "text_delta", "text": " there"}}),
)


class Body:
    """A response body: ``_START``, then a wait; a cancel of that wait is swallowed (``swallow``,
    as a host's transport should not) and ``_MORE`` follows, or ends it. ``closed`` once closed."""

    def __init__(self, swallow: bool, close_fails: bool = False) -> None:
        self.swallow = swallow
        self.close_fails = close_fails
        self.blocked = asyncio.Event()
        self.swallowed = False
        self.closed = False

    async def __aiter__(self) -> AsyncIterator[bytes]:
        yield _START
        self.blocked.set()
        try:
            await asyncio.Event().wait()
        except asyncio.CancelledError:
            if not self.swallow:
                raise
            self.swallowed = True
        yield _MORE
        await asyncio.Event().wait()

    async def aclose(self) -> None:
        self.closed = True
        if self.close_fails:
            raise OSError("connection reset while closing")


def http_model(body: Body) -> tuple[Any, Any]:
    import httpx

    from agentloop.models import AnthropicModel

    class Stream(httpx.AsyncByteStream):
        def __aiter__(self) -> AsyncIterator[bytes]:
            return body.__aiter__()

        async def aclose(self) -> None:
            await body.aclose()

    def serve(request: httpx.Request) -> httpx.Response:
        return httpx.Response(200, headers={"content-type": "text/event-stream"}, stream=Stream())

    client = httpx.AsyncClient(transport=httpx.MockTransport(serve))
    return AnthropicModel("m", api_key="sk-test-SECRET-0123456789", http_client=client), client


@pytest.mark.parametrize("source", HOST_CANCELS)
async def test_a_host_cancel_while_an_http_models_body_is_read(source: Any) -> None:
    body = Body(swallow=False)
    model, client = http_model(body)
    async with client:
        await source(Host(QueryEngine(model, policies=[])), body.blocked)
    assert body.closed


@pytest.mark.parametrize("source", HOST_CANCELS)
async def test_a_host_cancel_while_a_body_is_read_whose_close_fails(source: Any) -> None:
    """The transport's close of the body fails as the host's cancel unwinds the read: the host
    gets its cancel all the same, not a connection error the run would retry."""
    body = Body(swallow=False, close_fails=True)
    model, client = http_model(body)
    async with client:
        await source(Host(QueryEngine(model, policies=[], retry_budget=0)), body.blocked)
    assert body.closed


async def test_a_read_cancel_the_transport_swallowed_does_not_stay_on_the_task_reading() -> None:
    """The stream, iterated directly (no engine), cancels its own read of the body on an
    abort; a transport that catches that cancel and reads on leaves no cancel on the task: the
    stream ends with AbortError, the task's ``cancelling()`` back to 0."""
    from agentloop import AbortController, AbortError, Message
    from agentloop._model import ModelRequest as Request

    body = Body(swallow=True)
    model, client = http_model(body)
    controller = AbortController()
    seen: list[StreamEvent] = []

    async def read() -> int:
        stream = model.stream(Request(messages=[Message.user("hi")]), controller.signal)
        try:
            with pytest.raises(AbortError):
                seen.extend([event async for event in stream])
        finally:
            await stream.aclose()
        task = asyncio.current_task()
        assert task is not None
        return task.cancelling()

    async with client:
        reading = asyncio.create_task(read())
        await body.blocked.wait()
        controller.abort("cancel")
        assert await reading == 0
    assert body.swallowed and body.closed


# -- an MCP call -----------------------------------------------------------------------------------


@pytest.mark.parametrize("source", HOST_CANCELS)
async def test_a_host_cancel_while_an_mcp_call_waits(source: Any, tmp_path: Any) -> None:
    """The run waits on a stdio MCP server's ``slow`` call: the host's cancel stops the call
    (the server sees it cancelled) and reaches the host; the server is stopped at its close,
    no process left."""
    import sys
    from pathlib import Path

    from agentloop.mcp import MCPServer
    from tests.helpers import Fifo

    server_script = str(Path(__file__).with_name("mcp_server.py"))
    server = MCPServer.stdio(sys.executable, [server_script, "--markers", str(tmp_path)])
    async with Fifo(tmp_path / "events") as events, server as srv:
        tools = await srv.list_tools()
        model = ScriptedModel([ScriptedResponse(tool_calls=[ScriptedToolCall("slow", {"seconds": 60})]), "Done."])
        engine = QueryEngine(model, tools=tools, policies=[], tool_cancel_grace=5.0)
        started = asyncio.Event()

        async def watch() -> None:
            while await events.line() != "slow.started":
                pass
            started.set()

        watcher = asyncio.create_task(watch())
        await source(Host(engine), started)
        await watcher
        while await events.line() != "slow.cancelled":  # the server saw the call cancelled
            pass


# -- a child process -------------------------------------------------------------------------------


@pytest.mark.parametrize("grace", [0.0, 5.0])
@pytest.mark.parametrize("source", HOST_CANCELS)
async def test_a_host_cancel_while_a_tool_waits_on_a_child_process(source: Any, grace: float) -> None:
    """A tool waits on ``run_process``: the host's cancel stops the process group (by the abort
    within the grace, or by the cancel of the call once it is over) before it reaches the host."""
    import sys

    from agentloop import run_process

    started = asyncio.Event()
    stopped: list[str] = []

    @tool
    async def sleeper(ctx: ToolContext) -> str:
        script = "import sys, time; print('up', flush=True); time.sleep(60)"

        def line(text: str) -> None:
            if text == "up":
                started.set()

        try:
            await run_process(sys.executable, "-c", script, signal=ctx.signal, kill_grace=0.5, on_line=line)
        except BaseException as exc:
            stopped.append(type(exc).__name__)
            raise
        return "not reached"

    engine = QueryEngine(calls("sleeper"), tools=[sleeper], policies=[], tool_cancel_grace=grace)
    await source(Host(engine), started)
    assert stopped == ["CancelledError" if grace == 0.0 else "AbortError"]


async def interrupt_at(host: Host, reached: asyncio.Event) -> None:
    """Not a host cancel: the run's own interrupt, once ``reached`` is set; the run ends."""
    task = asyncio.create_task(host.iterate())
    await reached.wait()
    host.engine.interrupt()
    await task
    settled(host.engine)


@pytest.mark.parametrize("source", [*HOST_CANCELS, interrupt_at])
async def test_a_prompt_that_unwinds_in_a_few_loop_turns_is_waited_for_not_abandoned(
    source: Any, caplog: pytest.LogCaptureFixture
) -> None:
    """No cancel grace: the run cancels the call while it waits for its cancelled prompt to
    unwind. A prompt that honours its cancel, closing its dialog in a few loop turns, ends
    before the run does: not abandoned, nor warned about, nor left running after the run."""
    import logging

    asked, closed = asyncio.Event(), asyncio.Event()

    async def prompt(use: object, ctx: object) -> Allow:
        asked.set()
        try:
            await asyncio.Event().wait()
        finally:
            for _ in range(5):  # a dialog that takes a few loop turns to close
                await asyncio.sleep(0)
            closed.set()
        return Allow()

    @tool
    async def t() -> str:
        raise AssertionError("must not run")

    engine = QueryEngine(calls("t"), tools=[t], policies=[], permission=prompt, tool_cancel_grace=0.0)
    # Virtual time: the unwind time runs out only once nothing else is left to run, however slow
    # the machine is between the dialog's loop turns.
    with VirtualClock(), caplog.at_level(logging.WARNING, logger="agentloop"):
        await source(Host(engine), asked)
    assert closed.is_set()  # it ended before the run did
    assert not [r for r in caplog.records if "ignored cancellation" in r.getMessage()]


# -- what must finish though its caller is cancelled ----------------------------------------------


async def test_a_cancel_that_came_while_uncancellable_work_ran_is_raised_though_the_work_then_failed() -> None:
    """`uncancellable` (stopping a process group, an MCP server) runs its work to the end when
    its caller is cancelled meanwhile, then raises that cancel: also when the work then fails,
    the failure kept as the cancel's cause, not raised in the cancel's place."""
    from agentloop._process import uncancellable

    working, fail = asyncio.Event(), asyncio.Event()

    async def work() -> None:
        working.set()
        await fail.wait()
        raise OSError("the pipe broke as it was closed")

    async def caller() -> int:
        task = asyncio.current_task()
        assert task is not None
        try:
            await uncancellable(work())
        except asyncio.CancelledError as exc:
            assert isinstance(exc.__cause__, OSError)
            raise
        return task.cancelling()

    calling = asyncio.create_task(caller())
    await working.wait()
    calling.cancel()
    await asyncio.sleep(0)  # the cancel reaches the caller, which goes on waiting for the work
    fail.set()
    with pytest.raises(asyncio.CancelledError):
        await calling



async def test_a_keyboard_interrupt_from_uncancellable_work_is_not_turned_into_the_callers_cancel() -> None:
    """Ctrl-C (or SystemExit) out of the work after the caller's cancel came is the person's, not
    the library's to replace: it propagates as it is."""
    from agentloop._process import uncancellable

    # In the test's own task: a KeyboardInterrupt out of a task's step would leave the event loop.
    loop = asyncio.get_running_loop()
    me = asyncio.current_task()
    assert me is not None
    work: asyncio.Future[None] = loop.create_future()
    seen: list[str] = []

    def cancel_then_interrupt() -> None:
        me.cancel()  # delivered at the caller's next step: it goes on waiting for the work
        loop.call_soon(lambda: loop.call_soon(work.set_exception, KeyboardInterrupt()))

    loop.call_soon(cancel_then_interrupt)
    try:
        await uncancellable(work, on_cancel=lambda: seen.append("cancelled"))
    except KeyboardInterrupt:
        seen.append("KeyboardInterrupt")
    assert seen == ["cancelled", "KeyboardInterrupt"]
    assert me.uncancel() == 0  # the caller's cancel, which came first, taken back by the test


async def test_a_host_timeout_while_a_stream_read_directly_waits_whose_close_fails() -> None:
    """Iterated directly (no engine), under the host's `asyncio.timeout`: the transport's close of
    the body fails as the cancel unwinds the read, and the host gets its TimeoutError, not a
    connection error."""
    from agentloop import AbortController, Message
    from agentloop._model import ModelRequest as Request

    body = Body(swallow=False, close_fails=True)
    model, client = http_model(body)

    scopes: list[asyncio.Timeout] = []

    async def read() -> int:
        task = asyncio.current_task()
        assert task is not None
        with pytest.raises(TimeoutError):
            async with asyncio.timeout(None) as scope:
                scopes.append(scope)
                stream = model.stream(Request(messages=[Message.user("hi")]), AbortController().signal)
                try:
                    async for _ in stream:
                        pass
                finally:
                    await stream.aclose()
        return task.cancelling()

    async with client:
        reading = asyncio.create_task(read())
        await body.blocked.wait()
        scopes[0].reschedule(asyncio.get_running_loop().time())
        assert await reading == 0
    assert body.closed


def test_the_running_task_helpers_answer_with_no_event_loop_running() -> None:
    """Read in a finalizer after the run's loop is gone (a dropped run's stream closed there):
    no RuntimeError; no task, so nothing can cancel the close, and a cancel met there is taken
    for its owner's."""
    from agentloop._abort import cancels_asked, in_task, task_cancelling

    assert (in_task(), cancels_asked(), task_cancelling()) == (False, 0, True)
