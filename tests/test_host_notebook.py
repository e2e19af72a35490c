"""A notebook host: Jupyter or IPython drives the engine from cells.

The event loop outlives each cell (top-level ``await``), cells are run again, engines are made
and dropped over and over in one process, and the kernel's interrupt button raises
KeyboardInterrupt in the loop's thread wherever that thread is: in a tool, in a permission
callback, in the model's stream, in the cell's own code. `Kernel` plays that loop: each cell
runs on it until it ends or a KeyboardInterrupt comes out of it, and the next cell runs on the
same loop, where whatever the interrupted cell left pending goes on.
"""

from __future__ import annotations

import asyncio
import gc
import json
import logging
import subprocess
import sys
import tracemalloc
import warnings
import weakref
from collections.abc import AsyncIterator, Coroutine
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from agentloop import (
    Allow,
    Deny,
    Event,
    ModelRequest,
    QueryEngine,
    ScriptedModel,
    ScriptedResponse,
    ScriptedToolCall,
    TextDelta,
    ToolContext,
    ToolUseBlock,
    TurnEnded,
    delegate_tool,
    event_json,
    run_process,
    tool,
    validate_transcript,
)
from agentloop.testing import collect, turn_ended


class Kernel:
    """The notebook's event loop: it outlives each cell, as a kernel's does."""

    def __init__(self) -> None:
        self.loop = asyncio.new_event_loop()
        self.loop.set_debug(True)

    def cell(self, coro: Coroutine[Any, Any, Any]) -> Any:
        """Run a cell to its end; a KeyboardInterrupt that comes out of the loop comes out here."""
        return self.loop.run_until_complete(coro)

    def interrupted_cell(self, coro: Coroutine[Any, Any, Any]) -> None:
        with pytest.raises(KeyboardInterrupt):
            self.cell(coro)

    def pending(self) -> list[asyncio.Task[Any]]:
        return [t for t in asyncio.all_tasks(self.loop) if not t.done()]

    def close(self) -> None:
        self.cell(self.loop.shutdown_asyncgens())
        self.loop.close()


@pytest.fixture
def kernel() -> Any:
    k = Kernel()
    yield k
    k.close()


class CtrlCModel:
    """A `ScriptedModel` whose stream is hit by Ctrl-C after ``after`` events of its first response."""

    def __init__(self, inner: ScriptedModel, after: int) -> None:
        self.inner, self.after, self.armed = inner, after, True

    @property
    def request_count(self) -> int:
        return self.inner.request_count

    async def stream(self, request: ModelRequest, signal: Any) -> AsyncIterator[Any]:
        seen = 0
        async for event in self.inner.stream(request, signal):
            seen += 1
            if self.armed and seen > self.after:
                self.armed = False
                raise KeyboardInterrupt
            yield event


@tool
async def work() -> str:
    """Do some work."""
    return "worked"


def _model(*after_tool: str) -> ScriptedModel:
    return ScriptedModel([
        ScriptedResponse(text="Let me work on it. " * 3, chunk=7, tool_calls=[ScriptedToolCall("work")]),
        *after_tool,
    ])


async def _drain(engine: QueryEngine, prompt: str) -> list[Event]:
    return await collect(engine.run(prompt))


def _next_cell_runs(kernel: Kernel, engine: QueryEngine) -> TurnEnded:
    """The next cell asks again: it runs, the transcript is valid, nothing is left pending."""
    end = turn_ended(kernel.cell(_drain(engine, "again")))
    assert end.reason == "completed"
    assert validate_transcript(engine.messages) == []
    assert not engine.running
    assert kernel.pending() == []
    return end


# -- asyncio.run inside a running loop ---------------------------------------------------------


def test_the_demo_started_from_a_cell_says_to_run_it_in_a_terminal(kernel: Kernel, capsys: pytest.CaptureFixture[str]) -> None:
    # `python -m agentloop demo` in a cell's code (`agentloop.__main__.main([...])`) runs its own
    # event loop: inside the notebook's it raised asyncio.run's bare RuntimeError and left its
    # session coroutine to warn "was never awaited". It is a usage error that says what to do.
    from agentloop.__main__ import main

    async def cell() -> int:
        return main(["demo", "--script", "builtin"])

    with warnings.catch_warnings():
        warnings.simplefilter("error")
        status = kernel.cell(cell())
        gc.collect()  # a coroutine left unawaited would warn here
    assert status == 2
    err = capsys.readouterr().err
    assert "event loop is already running" in err
    assert "!python -m agentloop demo" in err


async def test_the_docs_asyncio_run_in_a_cell_fails_at_once_and_await_works() -> None:
    # The docs' examples end with asyncio.run(main()); in a cell the loop runs already. The
    # quickstart says to `await main()` there; asyncio.run refuses at once (no hang).
    engine = QueryEngine(ScriptedModel(["Hello!"]))

    async def main() -> None:
        async for _ in engine.run("Hi"):
            pass

    coro = main()
    with pytest.raises(RuntimeError, match="cannot be called from a running event loop"):
        asyncio.run(coro)
    coro.close()
    await main()
    assert [m.role for m in engine.messages] == ["user", "assistant"]


# -- a cell run again while the last one's run is iterated elsewhere ---------------------------


async def test_a_cell_run_again_while_the_last_run_streams_is_refused_and_the_first_run_goes_on() -> None:
    engine = QueryEngine(ScriptedModel([ScriptedResponse(text="one two three four five", chunk=3), "second"]))
    streaming = asyncio.Event()
    go_on = asyncio.Event()

    async def first_cell() -> list[Event]:
        events: list[Event] = []
        async for event in engine.run("first"):
            events.append(event)
            if isinstance(event, TextDelta) and not streaming.is_set():
                streaming.set()
                await go_on.wait()
        return events

    task = asyncio.create_task(first_cell())
    await streaming.wait()
    with pytest.raises(RuntimeError, match="a run is already in progress"):
        await collect(engine.run("second cell"))
    go_on.set()
    events = await task
    assert turn_ended(events).reason == "completed"
    assert "".join(e.text for e in events if isinstance(e, TextDelta)) == "one two three four five"
    assert [m.text for m in engine.messages] == ["first", "one two three four five"]
    assert turn_ended(await collect(engine.run("now"))).reason == "completed"
    assert validate_transcript(engine.messages) == []


# -- Ctrl-C (the kernel's interrupt button) at any point of a run ------------------------------


def test_ctrl_c_mid_stream_keeps_the_partial_answer_and_the_next_cell_runs(kernel: Kernel) -> None:
    model = CtrlCModel(_model("Second answer."), after=3)
    engine = QueryEngine(model, tools=[work])
    kernel.interrupted_cell(_drain(engine, "go"))
    assert not engine.running
    assert validate_transcript(engine.messages) == []
    assert engine.messages[-1].partial
    _next_cell_runs(kernel, engine)
    assert engine.messages[-1].text == "Second answer."
    assert model.request_count == 2


def test_ctrl_c_in_a_tool_stops_the_run_as_an_interrupt_does(kernel: Kernel) -> None:
    # The KeyboardInterrupt lands in the tool's code, in the call's own task: it comes out of the
    # loop, and the cell's task stays pending. The run went on once the loop ran again (the next
    # cell), asking the model as if nobody had pressed the button; it stops, as interrupt() does.
    @tool
    async def crunch() -> str:
        """Crunch numbers."""
        raise KeyboardInterrupt

    model = ScriptedModel([
        ScriptedResponse(tool_calls=[ScriptedToolCall("crunch")]),
        "The answer nobody asked for.",
        "Second answer.",
    ])
    engine = QueryEngine(model, tools=[crunch])
    first = asyncio.ensure_future(_drain(engine, "go"), loop=kernel.loop)
    kernel.interrupted_cell(asyncio.wait({first}))
    kernel.cell(asyncio.wait({first}))  # the interrupted cell's task goes on when the loop runs
    end = turn_ended(first.result())
    assert (end.reason, end.abort_reason) == ("aborted_tools", "cancel")
    assert model.request_count == 1
    assert engine.messages[-1].kind == "interrupt_notice"
    [result] = engine.messages[-2].tool_results
    assert result.is_error and result.text.startswith("Interrupted by user")
    _next_cell_runs(kernel, engine)
    assert engine.messages[-1].text == "The answer nobody asked for."


def test_ctrl_c_at_a_permission_prompt_comes_out_once_and_stops_the_run(kernel: Kernel) -> None:
    # The prompt runs in a task of its own: its KeyboardInterrupt came out of the loop, and then
    # again out of the next cell (the call's task re-raised it), a Ctrl-C nobody pressed.
    asked: list[str] = []

    async def ask(use: ToolUseBlock, ctx: ToolContext) -> Allow | Deny:
        asked.append(use.id)
        if len(asked) == 1:
            raise KeyboardInterrupt
        return Allow()

    model = _model("After the stop.", "Second answer.")
    engine = QueryEngine(model, tools=[work], permission=ask)
    first = asyncio.ensure_future(_drain(engine, "go"), loop=kernel.loop)
    kernel.interrupted_cell(asyncio.wait({first}))
    kernel.cell(asyncio.wait({first}))  # no second KeyboardInterrupt here
    end = turn_ended(first.result())
    assert (end.reason, end.abort_reason) == ("aborted_tools", "cancel")
    assert model.request_count == 1
    [result] = engine.messages[-2].tool_results
    assert result.is_error and "never started" in result.text
    _next_cell_runs(kernel, engine)


def test_ctrl_c_in_the_loop_itself_leaves_the_run_to_the_next_cells_interrupt(kernel: Kernel) -> None:
    # A Ctrl-C that lands in a callback of the loop (here the one that reads a tool's subprocess
    # output, as it calls on_line) comes out of the loop without passing through the run, which
    # goes on when the loop runs again. The next cell's interrupt() stops it: the process group
    # is gone once the run has ended, and nothing is left running in the loop.
    @tool
    async def build(ctx: ToolContext) -> str:
        """Build the project."""

        def on_line(line: str) -> None:
            raise KeyboardInterrupt

        code = "import time; print('compiling', flush=True); time.sleep(30)"
        result = await run_process(sys.executable, "-c", code, signal=ctx.signal, on_line=on_line)
        return result.stdout

    model = ScriptedModel([ScriptedResponse(tool_calls=[ScriptedToolCall("build")]), "Second answer."])
    engine = QueryEngine(model, tools=[build], tool_cancel_grace=0.2)
    first = asyncio.ensure_future(_drain(engine, "go"), loop=kernel.loop)
    kernel.interrupted_cell(asyncio.wait({first}))
    assert engine.running  # it landed in the loop itself, not in the run: nothing told the run

    async def next_cell() -> list[Event]:
        engine.interrupt()  # what the notebook recipe does first (docs/cookbook.md)
        return await first

    assert turn_ended(kernel.cell(next_cell())).reason == "aborted_tools"
    assert model.request_count == 1
    _next_cell_runs(kernel, engine)  # and the fixture finds no process of the build left


@pytest.mark.parametrize("at", ["text_delta", "tool_call_started", "tool_call_finished", "assistant_message", "turn_ended"])
def test_ctrl_c_in_the_cells_own_code_between_events(kernel: Kernel, at: str) -> None:
    # The cell renders each event; the Ctrl-C lands there, between two steps of the run.
    engine = QueryEngine(_model("Done.", "Second answer."), tools=[work])

    async def cell() -> None:
        async for event in engine.run("go"):
            if event.type == at:
                raise KeyboardInterrupt

    kernel.interrupted_cell(cell())
    gc.collect()  # the run the cell dropped is closed by the loop's async-generator hook
    kernel.cell(asyncio.sleep(0))
    assert not engine.running
    assert validate_transcript(engine.messages) == []
    _next_cell_runs(kernel, engine)


def test_ctrl_c_in_a_subagents_tool_stops_the_whole_run(kernel: Kernel) -> None:
    @tool
    async def crunch() -> str:
        """Crunch numbers."""
        raise KeyboardInterrupt

    model = ScriptedModel([
        ScriptedResponse(tool_calls=[ScriptedToolCall("task", {"task": "crunch it"})]),  # the parent
        ScriptedResponse(tool_calls=[ScriptedToolCall("crunch")]),  # the child
        "Went on after the Ctrl-C.",
        "Second answer.",
    ])
    engine = QueryEngine(model, tools=[delegate_tool(tools=[crunch])])
    first = asyncio.ensure_future(_drain(engine, "go"), loop=kernel.loop)
    kernel.interrupted_cell(asyncio.wait({first}))
    kernel.cell(asyncio.wait({first}))
    end = turn_ended(first.result())
    assert (end.reason, end.abort_reason) == ("aborted_tools", "cancel")
    assert model.request_count == 2
    _next_cell_runs(kernel, engine)
    assert engine.messages[-1].text == "Went on after the Ctrl-C."


@settings(max_examples=25)
@given(where=st.sampled_from(["stream", "tool", "permission", "cell"]), at=st.integers(0, 12))
def test_ctrl_c_anywhere_leaves_a_valid_transcript_and_a_reusable_engine(where: str, at: int) -> None:
    kernel = Kernel()
    try:
        hits = [0]

        def ctrl_c_here(place: str) -> None:
            hits[0] += 1
            if place == where and hits[0] > at:
                hits[0] = -(10**9)  # once
                raise KeyboardInterrupt

        @tool(concurrency_safe=True)
        async def step(n: int) -> str:
            """One step."""
            ctrl_c_here("tool")
            await asyncio.sleep(0)
            ctrl_c_here("tool")
            return f"step {n}"

        async def ask(use: ToolUseBlock, ctx: ToolContext) -> Allow:
            ctrl_c_here("permission")
            return Allow()

        calls = [ScriptedToolCall("step", {"n": i}) for i in range(3)]
        inner = ScriptedModel([ScriptedResponse(text="Working. " * 4, chunk=5, tool_calls=calls)] * 3 + ["Done."], cycle=True)
        model = CtrlCModel(inner, after=at if where == "stream" else 10**9)
        engine = QueryEngine(model, tools=[step], permission=ask)

        async def cell() -> list[Event]:
            events: list[Event] = []
            async for event in engine.run("go"):
                events.append(event)
                ctrl_c_here("cell")
            return events

        first = asyncio.ensure_future(cell(), loop=kernel.loop)
        try:
            kernel.cell(asyncio.wait({first}))
        except KeyboardInterrupt:
            kernel.cell(asyncio.wait({first}))  # what the interrupted cell left goes on
        if isinstance(first.exception(), KeyboardInterrupt):
            gc.collect()  # the run the cell dropped is closed by the loop's async-generator hook
            kernel.cell(asyncio.sleep(0))
        assert not engine.running
        assert validate_transcript(engine.messages) == []
        _next_cell_runs(kernel, engine)
    finally:
        kernel.close()


# -- engines made and dropped, cell after cell --------------------------------------------------


def _handlers() -> int:
    return sum(len(logging.getLogger(name).handlers) for name in ("agentloop", *logging.root.manager.loggerDict))


def test_two_hundred_engines_made_and_dropped_leave_nothing_behind(kernel: Kernel) -> None:
    def one_cell() -> weakref.ref[QueryEngine]:
        engine = QueryEngine(_model("Done."), tools=[work], system="Be brief.")
        kernel.cell(_drain(engine, "go"))
        return weakref.ref(engine)

    for _ in range(5):  # first-use caches
        one_cell()
    gc.collect()
    handlers = _handlers()
    tracemalloc.start()
    try:
        base = tracemalloc.get_traced_memory()[0]
        with warnings.catch_warnings():
            warnings.simplefilter("error")
            refs = [one_cell() for _ in range(200)]
            gc.collect()
        grown = tracemalloc.get_traced_memory()[0] - base
    finally:
        tracemalloc.stop()
    assert [r for r in refs if r() is not None] == []
    assert grown < 200 * 200, f"{grown} bytes kept after 200 engines were dropped"
    assert _handlers() == handlers
    assert kernel.pending() == []


_AFTER_REFUSALS = """
import gc, tracemalloc
from agentloop import Message, QueryEngine, ScriptedModel
for bad in ({"max_turns": "3"}, {"tools": [print]}):
    try:
        QueryEngine(ScriptedModel(["hi"]), **bad)
    except TypeError:
        pass
history = [Message.user("question"), Message.assistant("answer")]
engines = [QueryEngine(ScriptedModel(["hi"]), messages=history, policies=[])]
gc.collect()
tracemalloc.start()
base = tracemalloc.get_traced_memory()[0]
engines += [QueryEngine(ScriptedModel(["hi"]), messages=history, policies=[]) for _ in range(200)]
print((tracemalloc.get_traced_memory()[0] - base) / 200)
"""


def test_two_refused_constructions_first_cost_later_engines_nothing() -> None:
    # A cell with a typo, run twice, before the first engine of the kernel is made. CPython
    # gives a class's instances one shared key table whose room shrinks with each instance made
    # before one has set all its attributes: the two half-made engines left too little room,
    # and every engine made afterwards in that kernel held a dict of its own (1.3 KB more each).
    done = subprocess.run([sys.executable, "-c", _AFTER_REFUSALS], capture_output=True, text=True, timeout=50, check=False)
    assert done.returncode == 0, done.stderr
    assert float(done.stdout) <= 2_600, f"{float(done.stdout):.0f} bytes per idle engine"


@pytest.mark.parametrize("bad", [3, None, 2.5])
def test_a_history_that_is_not_a_list_is_refused_clearly(bad: object) -> None:
    # A cell passing the wrong variable as messages= got Python's "'int' object is not iterable".
    with pytest.raises(TypeError, match=f"messages takes a list of Message objects, not a {type(bad).__name__}"):
        QueryEngine(ScriptedModel(["hi"]), messages=bad)  # type: ignore[arg-type]


# -- rendering events, also of a stream cut short -------------------------------------------------


def test_event_json_renders_every_event_of_a_cut_stream_with_its_type_whole() -> None:
    # A cell that logs bounded lines dispatches on "type": a cut value there (or in a call's id)
    # would make the line unreadable as an event.
    engine = QueryEngine(ScriptedModel([
        ScriptedResponse(text="Let me look. ", tool_calls=[ScriptedToolCall("work", {"path": "é" * 60})], chunk=4),
    ]), tools=[work])

    async def cell() -> list[Event]:
        events: list[Event] = []
        async for event in engine.run("go"):
            events.append(event)
            if event.type == "tool_input_delta":
                engine.interrupt()
        return events

    events = asyncio.run(cell())
    for event in events:
        line = event_json(event, max_text_chars=8)
        data = json.loads(line)
        assert data["type"] == event.type
        assert "\n" not in line
    assert turn_ended(events).reason == "aborted_streaming"
