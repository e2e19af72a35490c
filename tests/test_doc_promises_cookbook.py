"""Promises of docs/cookbook.md, docs/quickstart.md and docs/api.md that no other test pins.

Each test names the page and the section whose sentence it holds to; the recipes themselves run as
the pages show them in tests/test_docs.py.
"""

from __future__ import annotations

import asyncio
import collections.abc
import inspect
import json
import logging
import os
import re
import subprocess
import sys
import threading
import time
import typing
from collections.abc import AsyncIterator
from pathlib import Path

import pytest

from agentloop import (
    AbortSignal,
    Allow,
    Deny,
    Event,
    ModelError,
    ModelRequest,
    PermissionCallback,
    QueryEngine,
    ScriptedModel,
    ScriptedResponse,
    ScriptedToolCall,
    TextDelta,
    ToolCallStarted,
    ToolContext,
    ToolUseBlock,
    TurnEnded,
    Usage,
    tool,
    validate_transcript,
)
from agentloop.demo import scenario
from agentloop.demo.scenario import ScenarioError
from agentloop.models import StreamEnd, StreamEvent, StreamText, StreamUsage
from agentloop.testing import collect, turn_ended
from tests.helpers import VirtualClock


def calls(*names: str) -> ScriptedResponse:
    return ScriptedResponse(tool_calls=[ScriptedToolCall(n, {}) for n in names])


@tool
async def step() -> str:
    """One step."""
    return "done"


@tool
async def deaf() -> str:
    """Ignores the abort signal (but not a cancellation)."""
    await asyncio.sleep(3600)
    return "never"


async def swallow_once() -> str:
    """Ignores the abort signal and swallows the first cancellation."""
    try:
        await asyncio.sleep(3600)
    except asyncio.CancelledError:
        pass  # swallowed: it carries on
    await asyncio.sleep(3600)
    return "never"


stubborn = tool(name="stubborn")(swallow_once)


async def cancel_the_abandoned() -> None:
    """Cancel once more what the engine abandoned, and wait for it to end."""
    for task in [t for t in asyncio.all_tasks() if t is not asyncio.current_task()]:
        task.cancel()
        await asyncio.gather(task, return_exceptions=True)


# -- cookbook.md ----------------------------------------------------------------------------------


async def test_worker_any_reason_other_than_send_now_is_handled_like_cancel() -> None:
    """cookbook.md, A background worker: ``interrupt("shutdown")`` ends the turn as a cancel
    does (the partial answer, the interrupt notice), with its own reason on the TurnEnded and in
    the abort hooks."""

    async def stopped_with(reason: str) -> tuple[TurnEnded, list[tuple[str | None, bool]], list[str]]:
        engine = QueryEngine(ScriptedModel([ScriptedResponse(text="Job two takes long. " * 10, chunk=4)]))
        hooked: list[str] = []
        engine.on_abort(hooked.append)
        events = []
        async for event in engine.run("two"):
            events.append(event)
            if isinstance(event, TextDelta):
                engine.interrupt(reason)
        assert validate_transcript(engine.messages) == []
        return turn_ended(events), [(m.kind, m.partial) for m in engine.messages], hooked

    shutdown, cancel = await stopped_with("shutdown"), await stopped_with("cancel")
    assert (shutdown[0].reason, shutdown[0].abort_reason) == ("aborted_streaming", "shutdown")
    assert (cancel[0].reason, cancel[0].abort_reason) == ("aborted_streaming", "cancel")
    assert shutdown[1] == cancel[1] == [(None, False), (None, True), ("interrupt_notice", False)]
    assert (shutdown[2], cancel[2]) == (["shutdown"], ["cancel"])


async def test_worker_cancelling_its_task_closes_the_run_as_consumer_closed_and_settles_it() -> None:
    """cookbook.md, A background worker: ``task.cancel()`` works too; the run is closed by its
    consumer (reason "consumer_closed"), the transcript is settled, the engine idle."""
    engine = QueryEngine(ScriptedModel([ScriptedResponse(text="Job two takes long. " * 10, chunk=4), "three"]))
    streaming = asyncio.Event()

    async def worker() -> None:
        async for event in engine.run("two"):
            if isinstance(event, TextDelta):
                streaming.set()
                await asyncio.Event().wait()  # the worker is busy with the event when cancelled

    task = asyncio.create_task(worker())
    await streaming.wait()
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
    last = engine.messages[-1]
    assert (last.role, last.partial, last.meta["abort_reason"], last.text) == ("assistant", True, "consumer_closed", "Job")
    assert not engine.running and validate_transcript(engine.messages) == []
    assert turn_ended(await collect(engine.run("three"))).reason == "completed"


async def test_editor_a_prompt_the_user_closes_is_an_error_result_and_the_turn_goes_on(
    caplog: pytest.LogCaptureFixture,
) -> None:
    """cookbook.md, An editor plugin: a prompt the user closes is a cancelled future; the call
    gets a denial that says the prompt was closed, the tool does not run, nothing is logged as an
    error, and the turn goes on to the model's answer."""
    import concurrent.futures

    ran: list[str] = []

    @tool
    async def build() -> str:
        """Build the project."""
        ran.append("build")
        return "built"

    async def ask_user(call: ToolUseBlock, ctx: ToolContext) -> Allow:
        answer: concurrent.futures.Future[Allow] = concurrent.futures.Future()
        answer.cancel()  # the dialog closed without an answer
        return await asyncio.wrap_future(answer)

    model = ScriptedModel([calls("build"), "I will not build, then."])
    engine = QueryEngine(model, tools=[build], permission=ask_user, policies=[])
    with caplog.at_level(logging.ERROR, logger="agentloop"):
        events = await collect(engine.run("Build it"))
    assert turn_ended(events).reason == "completed" and ran == []
    result = engine.messages[2].tool_results[0]
    assert result.is_error and result.text == (
        "Permission denied: the user closed the permission prompt without answering; the tool was not run."
    )
    assert caplog.records == []
    assert model.request_count == 2 and engine.messages[-1].text == "I will not build, then."
    assert validate_transcript(engine.messages) == []


async def test_chat_dropping_only_the_notice_after_a_stop_leaves_nothing_to_resume_from() -> None:
    """cookbook.md, A chat: after a stop, dropping only the last message leaves the partial answer
    at the end, and a ``run()`` with no prompt raises ValueError; dropping back to the user's last
    own message (as regenerate does) runs again."""
    model = ScriptedModel([ScriptedResponse(text="Rome was founded in 753 BC.", chunk=4), "Rome, 753 BC."])
    engine = QueryEngine(model, policies=[])
    async for event in engine.run("Tell me its story"):
        if isinstance(event, TextDelta):
            engine.interrupt()
    assert [m.kind for m in engine.messages] == [None, None, "interrupt_notice"]
    del engine.messages[-1]
    before = list(engine.messages)
    with pytest.raises(ValueError, match="does not end with a user message"):
        await collect(engine.run())
    assert engine.messages == before and not engine.running and model.request_count == 1
    mine = max(i for i, m in enumerate(engine.messages) if m.role == "user" and not m.synthetic)
    del engine.messages[mine + 1 :]
    assert turn_ended(await collect(engine.run())).reason == "completed"
    assert [m.text for m in engine.messages] == ["Tell me its story", "Rome, 753 BC."]


async def test_chat_every_user_message_the_library_writes_is_synthetic() -> None:
    """cookbook.md, A chat: the user's own messages are the user messages that are not
    ``synthetic``; tool results, interrupt notices, interjection envelopes and nudges are the
    library's, so regenerate's ``last_prompt`` finds the prompt behind all of them."""
    model = ScriptedModel([*([calls("step")] * 9), ScriptedResponse(text="Still going " * 5, chunk=4)])
    engine = QueryEngine(model, tools=[step])
    interjected = False
    async for event in engine.run("Do it"):
        if event.type == "tool_call_finished" and not interjected:
            interjected = True
            engine.interject("also this")
        if isinstance(event, TextDelta):
            engine.interrupt()
    users = [m for m in engine.messages if m.role == "user"]
    assert {m.kind for m in users if m.synthetic} == {"tool_results", "interjection", "nudge", "interrupt_notice"}
    assert [m.text for m in users if not m.synthetic] == ["Do it"]


# -- cookbook.md, Testing a host with ScriptedModel -----------------------------------------------


async def test_testing_each_scripted_response_reports_ten_and_ten_tokens_unless_usage_says() -> None:
    """cookbook.md, Testing: 10 input and 10 output tokens per scripted response unless
    ``usage=`` says otherwise; ``TurnEnded.usage`` and a ``usage_limit`` count them."""
    engine = QueryEngine(ScriptedModel(["plain", ScriptedResponse(text="given", usage=Usage(100, 5))]))
    assert turn_ended(await collect(engine.run("a"))).usage == Usage(10, 10)
    assert turn_ended(await collect(engine.run("b"))).usage == Usage(100, 5)

    engine = QueryEngine(ScriptedModel([calls("step")], cycle=True), tools=[step], policies=[], usage_limit=50)
    end = turn_ended(await collect(engine.run("loop")))
    assert (end.reason, end.usage.total, end.turns) == ("usage_limit", 60, 3)  # 20, 40, then 60 >= 50


async def test_testing_error_after_n_raises_after_exactly_n_events() -> None:
    """cookbook.md, Testing: ``ScriptedResponse(error=..., error_after=n)`` raises after ``n``
    events; a retryable error's attempt is discarded and the next response answers."""
    model = ScriptedModel([
        ScriptedResponse(text="abcdefgh", chunk=1, error=ModelError("reset", retryable=True), error_after=3),
        "fine",
    ])
    events = await collect(QueryEngine(model, retry_base_delay=0).run("x"))
    deltas = [e.text for e in events if isinstance(e, TextDelta)]
    assert deltas == ["a", "b", "c", "fine"]
    discarded = [e for e in events if e.type == "attempt_discarded"]
    assert [(e.text_chars, e.reason) for e in discarded] == [(3, "retry")]  # type: ignore[union-attr]
    assert turn_ended(events).reason == "completed" and model.request_count == 2


async def test_testing_an_assertion_in_a_scripted_callable_fails_the_request_not_the_test() -> None:
    """cookbook.md, Testing: an assertion that fails inside a scripted callable ends the turn with
    ``model_error``, its message in ``TurnEnded.error``; it is not retried."""

    def answer(request: ModelRequest) -> str:
        assert request.system == "Answer in French.", "the system prompt is missing"
        return "Bonjour."

    model = ScriptedModel([answer, "never asked"])
    events = await collect(QueryEngine(model).run("Hi"))
    end = turn_ended(events)
    assert end.reason == "model_error" and "the system prompt is missing" in (end.error or "")
    assert model.request_count == 1


async def test_testing_model_requests_hold_the_transcript_as_each_was_sent() -> None:
    """cookbook.md, Testing: each of ``model.requests`` holds the transcript as it was sent."""
    model = ScriptedModel([calls("step"), "done"])
    engine = QueryEngine(model, tools=[step], policies=[], system="Be brief.")
    await collect(engine.run("go"))
    sent = [[(m.role, m.text) for m in r.messages] for r in model.requests]
    assert sent == [[("user", "go")], [("user", "go"), ("assistant", ""), ("user", "")]]
    assert [r.system for r in model.requests] == ["Be brief.", "Be brief."]
    assert model.requests[1].messages[2].tool_results[0].text == "done"


async def test_testing_a_tool_ignoring_the_abort_ends_its_turn_exactly_the_grace_after() -> None:
    """cookbook.md, Testing: with a virtual clock the figures are exact: a tool that ignores the
    abort ends its turn ``tool_cancel_grace`` after the interrupt; one that swallows the cancel
    it then gets as well, 0.1 s later."""
    for tool_, after in ((deaf, 2.0), (stubborn, 2.1)):
        with VirtualClock() as clock:
            engine = QueryEngine(ScriptedModel([calls(tool_.name)]), tools=[tool_], policies=[], tool_cancel_grace=2.0)
            interrupted_at = 0.0
            async for event in engine.run("go"):
                if isinstance(event, ToolCallStarted):
                    interrupted_at = clock.now
                    engine.interrupt()
                if isinstance(event, TurnEnded):
                    assert event.reason == "aborted_tools"
                    assert clock.now - interrupted_at == pytest.approx(after, abs=1e-9), tool_.name
            await cancel_the_abandoned()
        assert validate_transcript(engine.messages) == []


class SignalDeafModel:
    """A model of one's own that never looks at the abort signal: a delta a second, forever."""

    async def stream(self, request: ModelRequest, signal: AbortSignal) -> AsyncIterator[StreamEvent]:
        yield StreamUsage(Usage(10, 0))
        while True:
            yield StreamText(0, "word ")
            await asyncio.sleep(1)
        yield StreamEnd("end_turn")  # never reached


async def test_testing_a_model_that_does_not_look_at_the_signal_is_cut_all_the_same() -> None:
    """cookbook.md, Testing: a model of your own that does not look at the signal between its
    events is cut at the interrupt, not at its next event."""
    with VirtualClock() as clock:
        engine = QueryEngine(SignalDeafModel(), policies=[])
        interrupted_at = 0.0
        events: list[Event] = []
        async for event in engine.run("go"):
            events.append(event)
            if isinstance(event, TextDelta) and sum(isinstance(e, TextDelta) for e in events) == 2:
                interrupted_at = clock.now  # the second word: the model now sleeps for a second
                engine.interrupt()
        end = turn_ended(events)
        assert (end.reason, clock.now - interrupted_at) == ("aborted_streaming", 0)
    assert engine.messages[1].text == "word word" and engine.messages[1].partial  # as providers take it


# -- quickstart.md --------------------------------------------------------------------------------


@pytest.mark.parametrize(("grace", "late"), [(2.0, 2.0), (0.05, 0.1), (0.0, 0.1)])
async def test_tools_a_timed_out_call_that_swallows_the_cancel_is_abandoned_the_grace_later(
    grace: float, late: float, caplog: pytest.LogCaptureFixture
) -> None:
    """quickstart.md, Tools: a call that swallows its timeout's cancellation gets the timeout's
    error result ``tool_cancel_grace`` later (0.1 s at least), with a warning, and the run goes
    on."""
    hangs = tool(name="hangs", timeout=30)(swallow_once)

    with VirtualClock() as clock, caplog.at_level(logging.WARNING, logger="agentloop"):
        engine = QueryEngine(ScriptedModel([calls("hangs"), "ok"]), tools=[hangs], policies=[], tool_cancel_grace=grace)
        started = finished = 0.0
        async for event in engine.run("go"):
            if isinstance(event, ToolCallStarted):
                started = clock.now
            if event.type == "tool_call_finished":
                finished = clock.now
                assert event.result.is_error and "timed out after 30 s" in event.result.text  # type: ignore[union-attr]
            end = event
        await cancel_the_abandoned()
    assert finished - started == pytest.approx(30 + late, abs=1e-9)
    assert isinstance(end, TurnEnded) and end.reason == "completed"
    assert any(r.levelno == logging.WARNING and "ignored cancellation" in r.getMessage() for r in caplog.records)


@pytest.mark.parametrize(
    ("returned", "text"),
    [
        (b"hello \xc3\xa9", "hello é"),
        (b"\x89PNG\r\n", repr(b"\x89PNG\r\n")),
        (None, "(no output)"),
        (" \n", "(no output)"),
        ([], "[]"),
    ],
)
async def test_tools_what_a_tool_returns_becomes_its_result(returned: object, text: str) -> None:
    """quickstart.md, Tools: bytes as the text they hold when UTF-8, else as their repr; None or a
    blank string as "(no output)"; an empty list as ``[]``."""

    @tool
    async def fetch() -> object:
        """Fetch something."""
        return returned

    engine = QueryEngine(ScriptedModel([calls("fetch"), "ok"]), tools=[fetch], policies=[])
    await collect(engine.run("go"))
    result = engine.messages[2].tool_results[0]
    assert (result.text, result.is_error) == (text, False)


async def test_permission_an_updated_input_equal_to_the_models_is_a_plain_allow() -> None:
    """quickstart.md, Permission: ``Allow(updated_input=...)`` equal to the model's input is a
    plain ``Allow()``: no ``updated_input`` on the events, no note in the result."""

    @tool
    async def delete(path: str) -> str:
        """Delete a file."""
        return f"deleted {path}"

    model = ScriptedModel([ScriptedResponse(tool_calls=[ScriptedToolCall("delete", {"path": "a.txt"})]), "ok"])
    engine = QueryEngine(model, tools=[delete], policies=[], permission=lambda use, ctx: Allow(updated_input={"path": "a.txt"}))
    events = await collect(engine.run("go"))
    calls_ = [e for e in events if e.type in ("tool_call_started", "tool_call_finished")]
    assert [(e.updated_input, e.input) for e in calls_] == [(None, {"path": "a.txt"})] * 2  # type: ignore[union-attr]
    assert engine.messages[2].tool_results[0].text == "deleted a.txt"


# -- api.md ---------------------------------------------------------------------------------------


async def test_api_running_is_true_for_a_run_made_and_false_once_its_host_stops_iterating() -> None:
    """api.md, QueryEngine.running: a run made and not begun is running; one the host stopped
    iterating (a ``break``) is not, the repr says idle and ``signal`` is None, though its cleanup
    goes on in the background (here a tool that ignores the abort is cancelled when the grace
    runs out)."""
    cancelled_at: list[float] = []

    @tool
    async def deaf_tool() -> str:
        """Ignores the abort signal."""
        try:
            await asyncio.sleep(3600)
        except asyncio.CancelledError:
            cancelled_at.append(asyncio.get_running_loop().time())
            raise
        return "never"

    with VirtualClock() as clock:
        model = ScriptedModel([calls("deaf_tool"), "never"])
        engine = QueryEngine(model, tools=[deaf_tool], policies=[], tool_cancel_grace=5)
        run = engine.run("go")
        assert engine.running and "running" in repr(engine)
        async for event in run:
            if isinstance(event, ToolCallStarted):
                assert engine.signal is not None and not engine.signal.aborted
                break
        del run  # dropped, as a loop over engine.run(...) drops it: its cleanup goes to the background
        stopped_at = clock.now
        assert not engine.running and "idle" in repr(engine)
        assert engine.signal is None  # api.md, QueryEngine.signal: None when idle
        assert validate_transcript(engine.messages) == []
        await asyncio.sleep(6)
    assert [t - stopped_at for t in cancelled_at] == [pytest.approx(5, abs=1e-9)]
    assert model.request_count == 1 and engine.messages[-1].tool_results[0].is_error


def test_api_permission_callback_type_admits_a_plain_function_that_answers_at_once() -> None:
    """api.md, PermissionCallback: a plain function that answers at once is accepted too, so the
    type a host annotates its callback with (and that ``permission=`` takes) admits it: a host
    checked with ``mypy --strict`` is not told otherwise."""
    params, returned = typing.get_args(PermissionCallback)
    assert params == [ToolUseBlock, ToolContext]
    answers = set(typing.get_args(returned))
    assert {Allow, Deny} <= answers
    assert any(typing.get_origin(a) is collections.abc.Awaitable for a in answers)
    assert inspect.signature(QueryEngine).parameters["permission"].annotation == "PermissionCallback | None"


def test_api_each_events_type_is_the_literal_its_host_dispatches_on() -> None:
    """api.md, Event: each event has a ``type`` string, and the recipes dispatch on it
    (``if event.type == "permission_requested": event.tool_use.id``). The type checker narrows
    the ``Event`` union by that test only when each ``type`` is declared as its own literal."""
    import agentloop._events as events_module

    for cls in typing.get_args(Event):
        declared = typing.get_type_hints(cls, vars(events_module), include_extras=True)["type"]
        assert typing.get_origin(declared) is typing.ClassVar, cls.__name__
        (literal,) = typing.get_args(declared)
        assert typing.get_origin(literal) is typing.Literal and typing.get_args(literal) == (cls.type,), cls.__name__


async def test_tools_work_in_a_thread_ends_at_the_timeout_at_once_and_at_an_abort_by_the_grace() -> None:
    """quickstart.md, Tools: work handed to ``asyncio.to_thread`` lets a timeout end the call at
    once; an abort ends it once ``tool_cancel_grace`` has passed, the thread being unable to see
    the signal."""
    release = threading.Event()

    @tool(timeout=30)
    async def crunch() -> str:
        """Crunch numbers in a thread."""
        return await asyncio.to_thread(lambda: "done" if release.wait(3600) else "")

    try:
        with VirtualClock() as clock:
            model = ScriptedModel([calls("crunch"), "ok", calls("crunch"), "ok"])
            engine = QueryEngine(model, tools=[crunch], policies=[], tool_cancel_grace=2.0)
            took: list[float] = []
            started = 0.0
            for prompt in ("time out", "abort"):
                async for event in engine.run(prompt):
                    if isinstance(event, ToolCallStarted):
                        started = clock.now
                        if prompt == "abort":
                            engine.interrupt()
                    if event.type == "tool_call_finished":
                        took.append(clock.now - started)
                        assert event.result.is_error  # type: ignore[union-attr]
        assert took == [pytest.approx(30, abs=1e-9), pytest.approx(2.0, abs=1e-9)]
    finally:
        release.set()


async def test_tools_a_thread_that_checks_the_signal_ends_the_aborted_call_as_it_returns() -> None:
    """quickstart.md, Tools: a long loop in the thread checks ``ctx.signal.aborted``; the
    aborted call then ends as soon as it returns, with what it returned, not at the grace."""

    def work(signal: AbortSignal) -> str:
        while not signal.aborted:
            time.sleep(0.001)
        return "stopped at the signal"

    @tool
    async def crunch(ctx: ToolContext) -> str:
        """Crunch numbers in a thread."""
        return await asyncio.to_thread(work, ctx.signal)

    engine = QueryEngine(ScriptedModel([calls("crunch")]), tools=[crunch], policies=[], tool_cancel_grace=3600)
    async for event in engine.run("abort"):
        if isinstance(event, ToolCallStarted):
            engine.interrupt()
        end = event
    assert isinstance(end, TurnEnded) and end.reason == "aborted_tools"
    result = engine.messages[2].tool_results[0]
    assert (result.text, result.is_error) == ("stopped at the signal", False)


async def test_api_an_interrupt_stops_a_run_made_while_the_last_one_still_cleans_up() -> None:
    """api.md, QueryEngine.run: a ``run()`` started right after a ``break`` waits for the last
    run's cleanup, and ``interrupt()`` meanwhile stops it, as it stops a run made and not iterated
    yet: also when the interrupt comes before the new run's first step (a web host's stop that
    arrives before the task it made the run for has begun)."""
    with VirtualClock():
        model = ScriptedModel([calls("deaf"), "the next answer"])
        engine = QueryEngine(model, tools=[deaf], policies=[], tool_cancel_grace=5)
        async for event in engine.run("go"):
            if isinstance(event, ToolCallStarted):
                break  # the deaf call's cleanup goes on for the grace
        hooked: list[str] = []
        engine.on_abort(hooked.append)
        run = engine.run("next")
        assert engine.running
        engine.interrupt("stop")
        events = await collect(run)
    end = turn_ended(events)
    assert (end.reason, end.abort_reason) == ("aborted_streaming", "stop")
    assert model.request_count == 1 and hooked == ["consumer_closed", "stop"]  # the last run's, then its own
    assert [m.kind for m in engine.messages[-2:]] == [None, "interrupt_notice"]
    assert engine.messages[-2].text == "next" and validate_transcript(engine.messages) == []


@pytest.mark.parametrize("typo", [{"step": [{"on": "text_delta", "do": "interrupt"}]}, {"promt": "Fix it"}, {"timout": 5}])
def test_headless_a_scenario_with_a_key_it_does_not_know_is_a_usage_error(typo: dict[str, object], tmp_path: Path) -> None:
    """cookbook.md, A headless job: ``python -m agentloop demo --script FILE`` exits 2 for a file
    that is not a scenario. An object with a key a scenario does not have (``"step"`` for
    ``"steps"``) is none: played, it would do nothing that it says and exit 0, as a step with an
    unknown key is refused."""
    script = tmp_path / "scenario.json"
    script.write_text(json.dumps({"prompt": "Fix the failing test in utils.py", **typo}), encoding="utf-8")
    with pytest.raises(ScenarioError, match=re.escape(f"unknown keys {sorted(typo)}")):
        scenario.load(str(script))
    proc = subprocess.run(
        [sys.executable, "-m", "agentloop", "demo", "--script", str(script)],
        env=dict(os.environ, PYTHONPATH=str(Path(__file__).resolve().parent.parent)),
        stdin=subprocess.DEVNULL, capture_output=True, text=True, timeout=60, check=False,
    )
    assert proc.returncode == 2 and "unknown keys" in proc.stderr and proc.stdout == ""
