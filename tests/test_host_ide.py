"""An editor plugin built from the docs alone: the UI thread is not asyncio, the agent runs on an
event loop in a thread of its own.

The test's own thread plays the editor's UI thread. It starts runs, renders every event with
`event_json`, answers permission prompts, applies the edits tools ask for, and presses stop,
steer, send-now and queue at chosen moments: the loop thread waits for the UI's word at the
events a test names, so each moment is hit every time, without sleeps. After each step the
transcript is valid and nothing is left running.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import contextlib
import json
import queue
import sys
import threading
from collections.abc import AsyncGenerator, Callable, Coroutine
from pathlib import Path
from typing import Any

import pytest

from agentloop import (
    Allow,
    Deny,
    Event,
    QueryEngine,
    ScriptedModel,
    ScriptedResponse,
    ScriptedToolCall,
    ToolContext,
    ToolProgress,
    ToolUseBlock,
    event_json,
    run_process,
    tool,
    validate_transcript,
)
from agentloop.sessions import JsonlSession, SessionLockedError
from tests.helpers import child_pids_alive, collect_garbage

WAIT = 20.0  # seconds the UI waits for the loop thread before the test fails (never reached when it passes)


class Editor:
    """The editor's side: its UI thread (the caller) and the agent's loop in a thread of its own.

    The loop thread hands the UI everything through ``ui``: events to render, prompts to answer,
    edits to apply. ``hold`` names the events at which the loop waits for the UI's ``go()``.
    """

    def __init__(self) -> None:
        self.loop = asyncio.new_event_loop()
        self.thread = threading.Thread(target=self.loop.run_forever, name="agent-loop", daemon=True)
        self.thread.start()
        self.ui: queue.Queue[tuple[str, Any]] = queue.Queue()
        self.rendered: list[dict[str, Any]] = []
        self.hold: Callable[[Event], bool] = lambda event: False
        self._held: asyncio.Future[None] | None = None

    # -- the loop thread's side -------------------------------------------------------------

    def submit(self, coro: Coroutine[Any, Any, Any]) -> concurrent.futures.Future[Any]:
        return asyncio.run_coroutine_threadsafe(coro, self.loop)

    def start(self, engine: QueryEngine, prompt: str | None = None) -> concurrent.futures.Future[None]:
        """Start a run from the UI thread: made here, so a stop pressed at once reaches it."""
        return self.submit(self._pump(engine.run(prompt)))

    async def _pump(self, run: AsyncGenerator[Event, None]) -> None:
        try:
            async with contextlib.aclosing(run):
                async for event in run:
                    self.ui.put(("event", event))
                    if self.hold(event):
                        self._held = self.loop.create_future()
                        self.ui.put(("held", event))
                        await self._held
        finally:
            self.ui.put(("ended", None))

    async def ask_ui(self, kind: str, payload: Any) -> Any:
        """Ask the UI thread something; the answer comes back through a concurrent future."""
        answer: concurrent.futures.Future[Any] = concurrent.futures.Future()
        self.ui.put((kind, (payload, answer)))
        return await asyncio.wrap_future(answer)

    # -- the UI thread's side ---------------------------------------------------------------

    def go(self) -> None:
        """Let the loop go on from the event it holds at."""
        held = self._held
        assert held is not None
        self.loop.call_soon_threadsafe(lambda: held.done() or held.set_result(None))

    def next(self, kinds: tuple[str, ...] = ("held", "ended")) -> tuple[str, Any]:
        """Handle the UI's queue (render events, apply edits) until an item of ``kinds``."""
        while True:
            kind, item = self.ui.get(timeout=WAIT)
            if kind == "event":
                self.render(item)
            elif kind == "call":
                item()
            if kind in kinds:
                return kind, item

    def until_ended(self, future: concurrent.futures.Future[None]) -> None:
        self.next(("ended",))
        future.result(timeout=WAIT)

    def render(self, event: Event) -> None:
        line = event_json(event)  # from the UI thread, while the loop thread goes on
        assert "\n" not in line
        self.rendered.append(json.loads(line))

    def types(self) -> list[str]:
        return [e["type"] for e in self.rendered]

    def close(self) -> None:
        """The editor closes: stop the loop, join its thread, and close the loop as
        `asyncio.run` closes its own: cancel what is left, let it end, close the generators."""
        if self.loop.is_running():
            self.loop.call_soon_threadsafe(self.loop.stop)
        self.thread.join(timeout=WAIT)
        assert not self.thread.is_alive()
        while left := asyncio.all_tasks(self.loop):  # and what they start as they end
            for task in left:
                task.cancel()
            self.loop.run_until_complete(asyncio.wait(left))
        self.loop.run_until_complete(self.loop.shutdown_asyncgens())
        self.loop.run_until_complete(self.loop.shutdown_default_executor())
        self.loop.close()


def check(engine: QueryEngine, editor: Editor) -> None:
    """What holds after every step: a valid transcript, no run going, no task left in the loop."""
    assert validate_transcript(engine.messages) == []
    assert not engine.running

    async def tasks() -> list[asyncio.Task[Any]]:
        for _ in range(3):
            await asyncio.sleep(0)
        me = asyncio.current_task()
        return [t for t in asyncio.all_tasks() if t is not me and not t.done()]

    assert editor.submit(tasks()).result(timeout=WAIT) == []


@pytest.fixture
def editor(request: pytest.FixtureRequest) -> Any:
    ed = Editor()
    yield ed
    if not ed.loop.is_closed():
        ed.close()
    del ed
    complaints = collect_garbage(WAIT)
    assert complaints == []


def long_text(n: int = 40) -> ScriptedResponse:
    return ScriptedResponse(text="word " * n, chunk=5)


def held_at(kind: str, n: int = 1) -> Callable[[Event], bool]:
    seen = [0]

    def hold(event: Event) -> bool:
        if event.type == kind:
            seen[0] += 1
            return seen[0] == n
        return False

    return hold


# ---------------------------------------------------------------------------------------------
# Control calls from the UI thread at chosen moments


def stop_mid_text(editor: Editor, engine: QueryEngine, prompt: str) -> None:
    """Start a run, press stop while it is held at its second text delta, and let it end."""
    editor.hold = held_at("text_delta", 2)
    run = editor.start(engine, prompt)
    editor.next()
    engine.interrupt()
    editor.go()
    editor.until_ended(run)


def test_stop_pressed_mid_stream(editor: Editor) -> None:
    engine = QueryEngine(ScriptedModel([long_text()]))
    stop_mid_text(editor, engine, "Explain the module")
    assert editor.rendered[-1]["type"] == "turn_ended"
    assert (editor.rendered[-1]["reason"], editor.rendered[-1]["abort_reason"]) == ("aborted_streaming", "cancel")
    assert engine.messages[1].partial and engine.messages[-1].kind == "interrupt_notice"
    check(engine, editor)


def test_stop_pressed_before_the_loop_thread_took_the_run(editor: Editor) -> None:
    engine = QueryEngine(ScriptedModel([long_text()]))
    gate = threading.Event()
    editor.loop.call_soon_threadsafe(gate.wait, WAIT)  # the loop thread is busy for a moment
    run = editor.start(engine, "Explain")
    engine.interrupt()
    gate.set()
    editor.until_ended(run)
    end = editor.rendered[-1]
    assert (end["reason"], end["abort_reason"]) == ("aborted_streaming", "cancel")
    check(engine, editor)


def test_send_now_mid_stream_and_steer_mid_tool(editor: Editor) -> None:
    @tool
    async def run_tests() -> str:
        """Run the tests."""
        return "2 passed"

    def answer(request: Any) -> str:
        assert request.messages[-1].kind == "interjection"
        return "Done, API unchanged."

    model = ScriptedModel([long_text(), ScriptedResponse(tool_calls=[ScriptedToolCall("run_tests")]), answer])
    engine = QueryEngine(model, tools=[run_tests])
    editor.hold = lambda e: e.type in {"text_delta", "tool_call_started"}
    run = editor.start(engine, "Write an essay")
    editor.next()
    receipt = engine.send_now("Just run the tests.")
    editor.hold = held_at("tool_call_started")
    editor.go()
    editor.next()
    steer = engine.interject("Keep the API unchanged.")
    editor.go()
    editor.until_ended(run)
    started = [e for e in editor.rendered if e["type"] == "turn_started"]
    assert receipt in started[1]["ids"]
    injected = [e for e in editor.rendered if e["type"] == "interjection_injected"]
    assert injected and injected[0]["ids"] == [steer]
    assert engine.messages[-1].text == "Done, API unchanged."
    check(engine, editor)


def test_queue_and_steer_between_runs(editor: Editor) -> None:
    model = ScriptedModel(["First.", "Second.", "Third."])
    engine = QueryEngine(model)
    editor.until_ended(editor.start(engine, "One"))
    check(engine, editor)
    steer = engine.interject("Also, be brief.")  # idle: starts the next run as the user's own message
    queued = engine.follow_up("And then this.")
    editor.until_ended(editor.start(engine))
    started = [e for e in editor.rendered if e["type"] == "turn_started"]
    assert steer in started[1]["ids"] and queued in started[1]["ids"]
    assert [m.text for m in engine.messages if m.role == "user" and not m.synthetic][-2:] == ["Also, be brief.", "And then this."]
    check(engine, editor)


def test_follow_up_queued_while_the_last_response_is_handled(editor: Editor) -> None:
    engine = QueryEngine(ScriptedModel(["First answer.", "Second answer."]))
    editor.hold = held_at("turn_ended")
    run = editor.start(engine, "First")
    editor.next()
    receipt = engine.submit("Second")  # follow_up: the turn completed, so it runs in this run
    editor.hold = lambda e: False
    editor.go()
    editor.until_ended(run)
    started = [e for e in editor.rendered if e["type"] == "turn_started"]
    assert [s["ids"] for s in started] == [[], [receipt]]
    assert engine.messages[-1].text == "Second answer."
    check(engine, editor)


def test_interrupt_while_the_run_settles_then_send_now(editor: Editor) -> None:
    release = asyncio.Event()

    @tool
    async def stubborn() -> str:
        """A tool that finishes what it started before it stops."""
        await release.wait()
        return "finished anyway"

    model = ScriptedModel([ScriptedResponse(tool_calls=[ScriptedToolCall("stubborn")]), "Here is the short answer.", "Now this."])
    engine = QueryEngine(model, tools=[stubborn], tool_cancel_grace=WAIT)
    editor.hold = held_at("tool_call_started")
    run = editor.start(engine, "Do it")
    editor.next()
    engine.interrupt()
    editor.go()
    # The run settles: the tool still runs in its grace. The user changes their mind.
    follow = engine.follow_up("Later, this.")
    now = engine.send_now("Give me the short answer instead.")
    steer = engine.interject("and mind the tests")
    editor.loop.call_soon_threadsafe(release.set)
    editor.until_ended(run)
    started = [e for e in editor.rendered if e["type"] == "turn_started"]
    # The send-now's turn revives the run (the last word wins); the follow-up comes after it.
    assert [s["ids"] for s in started] == [[], [now], [follow]]
    injected = [e for e in editor.rendered if e["type"] == "interjection_injected"]
    assert [e["ids"] for e in injected] == [[steer]]
    assert engine.messages[2].tool_results[0].text == "finished anyway"  # it finished: its real result
    check(engine, editor)


# ---------------------------------------------------------------------------------------------
# Permission prompts answered on the UI thread


def prompt_engine(editor: Editor, tools: list[Any], responses: list[Any]) -> QueryEngine:
    async def permission(call: ToolUseBlock, ctx: ToolContext) -> Allow | Deny:
        result: Allow | Deny = await editor.ask_ui("prompt", call)
        return result

    return QueryEngine(ScriptedModel(responses), tools=tools, permission=permission)


@tool
async def format_file(path: str) -> str:
    """Format a file."""
    return f"formatted {path}"


def call_format() -> ScriptedResponse:
    return ScriptedResponse(tool_calls=[ScriptedToolCall("format_file", {"path": "a.py"})])


def test_permission_granted_and_denied_from_the_ui(editor: Editor) -> None:
    engine = prompt_engine(editor, [format_file], [call_format(), call_format(), "Done."])
    run = editor.start(engine, "Format twice")
    _, (call, answer) = editor.next(("prompt",))
    assert call.name == "format_file"
    answer.set_result(Allow())
    _, (call, answer) = editor.next(("prompt",))
    answer.set_result(Deny("not now"))
    editor.until_ended(run)
    results = [m.tool_results[0] for m in engine.messages if m.tool_results]
    assert results[0].text == "formatted a.py" and not results[0].is_error
    assert results[1].is_error and "not now" in results[1].text
    check(engine, editor)


def test_the_user_closes_the_permission_prompt(editor: Editor) -> None:
    engine = prompt_engine(editor, [format_file], [call_format(), "Understood, I will not."])
    run = editor.start(engine, "Format it")
    _, (_, answer) = editor.next(("prompt",))
    answer.cancel()  # the dialog closed without an answer
    editor.until_ended(run)
    result = engine.messages[2].tool_results[0]
    assert result.is_error
    check(engine, editor)


def test_stop_pressed_while_the_prompt_waits(editor: Editor) -> None:
    engine = prompt_engine(editor, [format_file], [call_format()])
    run = editor.start(engine, "Format it")
    _, (_, answer) = editor.next(("prompt",))
    engine.interrupt()
    editor.until_ended(run)
    assert answer.cancelled()  # the dialog is told it is no longer wanted
    assert editor.rendered[-1]["reason"] == "aborted_tools"
    check(engine, editor)


# ---------------------------------------------------------------------------------------------
# Tools that touch the editor


def test_an_edit_applied_on_the_ui_thread(editor: Editor) -> None:
    buffers = {"a.py": "x=1\n"}
    ui_thread = threading.get_ident()

    @tool
    async def apply_edit(path: str, text: str) -> str:
        """Replace a buffer's text in the editor."""
        loop = asyncio.get_running_loop()
        applied: asyncio.Future[str] = loop.create_future()

        def on_ui() -> None:  # runs on the UI thread, which owns the buffers
            assert threading.get_ident() == ui_thread
            buffers[path] = text
            loop.call_soon_threadsafe(lambda: applied.done() or applied.set_result(f"{path} edited"))

        editor.ui.put(("call", on_ui))
        return await applied

    model = ScriptedModel([ScriptedResponse(tool_calls=[ScriptedToolCall("apply_edit", {"path": "a.py", "text": "x = 1\n"})]), "Formatted."])
    engine = QueryEngine(model, tools=[apply_edit])
    editor.until_ended(editor.start(engine, "Format a.py"))
    assert buffers == {"a.py": "x = 1\n"}
    assert engine.messages[2].tool_results[0].text == "a.py edited"
    check(engine, editor)


def test_a_tool_streams_progress_to_the_ui_from_a_worker_thread(editor: Editor) -> None:
    @tool
    async def index(ctx: ToolContext) -> str:
        """Index the workspace."""

        def work() -> int:
            for n in range(3):
                ctx.emit(ToolProgress(tool_use_id=ctx.tool_use_id, text=f"indexed {n + 1}/3"))
            return 3

        return f"{await asyncio.to_thread(work)} files indexed"

    model = ScriptedModel([ScriptedResponse(tool_calls=[ScriptedToolCall("index")]), "Indexed."])
    engine = QueryEngine(model, tools=[index])
    editor.until_ended(editor.start(engine, "Index"))
    call_id = engine.messages[1].tool_uses[0].id
    progress = [(e["tool_use_id"], e["text"]) for e in editor.rendered if e["type"] == "tool_progress"]
    assert progress == [(call_id, f"indexed {n}/3") for n in (1, 2, 3)]
    types = editor.types()
    assert types.index("tool_call_started") < types.index("tool_progress") < types.index("tool_call_finished")
    assert "text_delta" not in types[: types.index("tool_call_finished")]  # the answer's text is not mixed with it
    check(engine, editor)


@tool
async def build(ctx: ToolContext) -> str:
    """Build the project."""
    result = await run_process(sys.executable, "-c", "import time; print('building', flush=True); time.sleep(60)", signal=ctx.signal, kill_grace=0.5)
    return result.stdout


def test_a_build_cancelled_from_the_ui(editor: Editor) -> None:
    model = ScriptedModel([ScriptedResponse(tool_calls=[ScriptedToolCall("build")])])
    engine = QueryEngine(model, tools=[build])
    editor.hold = held_at("tool_call_started")
    run = editor.start(engine, "Build it")
    editor.next()
    editor.go()
    engine.interrupt()
    editor.until_ended(run)
    assert editor.rendered[-1]["reason"] == "aborted_tools"
    assert "stopped while it was running" in engine.messages[2].tool_results[0].text
    assert child_pids_alive() == set()
    check(engine, editor)


# ---------------------------------------------------------------------------------------------
# The editor closes, the plugin reloads, two windows


def test_the_editor_closes_while_a_build_runs(editor: Editor, tmp_path: Path) -> None:
    path = tmp_path / "chat.jsonl"
    session = JsonlSession(path)
    model = ScriptedModel([ScriptedResponse(text="Building.", tool_calls=[ScriptedToolCall("build")])])
    engine = QueryEngine(model, tools=[build], session=session)
    editor.hold = held_at("tool_call_started")
    run = editor.start(engine, "Build it")
    editor.next()
    editor.go()
    engine.interrupt("quit")  # the window closes: stop the run, let it settle, then stop the loop
    editor.until_ended(run)
    editor.close()
    session.close()
    assert child_pids_alive() == set()
    loaded = JsonlSession(path).load()
    assert loaded.repairs == [] and loaded.messages == engine.messages
    assert validate_transcript(engine.messages) == []


def test_the_plugin_reloads_from_its_session_file(editor: Editor, tmp_path: Path) -> None:
    path = tmp_path / "chat.jsonl"
    with JsonlSession(path) as session:
        engine = QueryEngine(ScriptedModel([long_text()]), session=session)
        stop_mid_text(editor, engine, "Explain")
        check(engine, editor)
    editor.close()

    again = Editor()  # the reloaded plugin: a new loop thread, an engine from the file
    try:
        session, loaded = JsonlSession.resume(path)
        assert loaded.messages == engine.messages
        with session:
            engine2 = QueryEngine(ScriptedModel(["Going on."]), messages=loaded.messages, session=session)
            again.until_ended(again.start(engine2, "continue"))
            check(engine2, again)
        assert JsonlSession(path).load().messages == engine2.messages
    finally:
        again.close()


def test_two_windows_on_one_session(editor: Editor, tmp_path: Path) -> None:
    path = tmp_path / "chat.jsonl"
    first = JsonlSession(path)
    engine = QueryEngine(ScriptedModel(["One.", "Three."]), session=first)
    editor.until_ended(editor.start(engine, "First"))
    second = JsonlSession(path)
    other = QueryEngine(ScriptedModel(["Two."]), messages=second.load().messages, session=second)
    run = editor.start(other, "Second")
    editor.next(("ended",))
    with pytest.raises(SessionLockedError):
        run.result(timeout=WAIT)
    check(other, editor)
    first.close()  # the first window closes: the second takes the file over
    editor.until_ended(editor.start(other, "Second"))
    check(other, editor)
    second.close()
    assert JsonlSession(path).load().messages == other.messages


# ---------------------------------------------------------------------------------------------
# Every event type rendered on the UI thread


def test_every_event_type_renders_on_the_ui_thread(editor: Editor) -> None:
    from agentloop import _events

    engine = QueryEngine(ScriptedModel([long_text()]))
    editor.until_ended(editor.start(engine, "Hi"))
    all_types = {getattr(_events, name).type for name in _events.__all__ if hasattr(getattr(_events, name), "type")}
    assert {"turn_started", "text_delta", "assistant_message", "turn_ended"} <= set(editor.types()) <= all_types


@pytest.mark.closes_loop_under_tasks
def test_a_build_left_in_a_loop_closed_under_it_is_killed(tmp_path: Path) -> None:
    editor = Editor()
    started = tmp_path / "started"
    model = ScriptedModel([ScriptedResponse(tool_calls=[ScriptedToolCall("build_in_background")])])

    @tool
    async def build_in_background(ctx: ToolContext) -> str:
        """Build the project."""
        code = f"import pathlib, time; pathlib.Path({str(started)!r}).touch(); time.sleep(60)"
        return (await run_process(sys.executable, "-c", code, signal=ctx.signal)).stdout

    engine = QueryEngine(model, tools=[build_in_background])
    editor.hold = held_at("tool_call_started")
    editor.start(engine, "Build it")
    editor.next()
    editor.go()
    waited = threading.Event()
    while not started.exists():  # the build has begun
        assert not waited.wait(0.01) and engine.running
    # The editor quits at once: the loop stopped and closed under the run, nothing cancelled.
    editor.loop.call_soon_threadsafe(editor.loop.stop)
    editor.thread.join(timeout=WAIT)
    editor.loop.close()
    assert not engine.running  # the run has ended (concepts.md): so has its build
    assert validate_transcript(engine.messages) == []
    assert child_pids_alive() == set()
    # What the closed loop held is collected here: the build's pipes and process went with its
    # group, so nothing complains (no unclosed file or transport), and nothing of the run fails.
    del engine, editor
    assert collect_garbage(WAIT) == []
