"""The host's control surface at odd moments: stopping the iteration after a turn's end,
control calls while the next run waits for the last one's cleanup, and receipts for what the
host queued when it stops iterating at any event."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncGenerator, Callable

import pytest

from agentloop import (
    Event,
    InterjectionDropped,
    InterjectionInjected,
    QueryEngine,
    ScriptedModel,
    ScriptedResponse,
    ScriptedToolCall,
    ToolCallFinished,
    ToolCallStarted,
    TurnEnded,
    TurnStarted,
    tool,
    validate_transcript,
)
from tests.helpers import VirtualClock


def calls(*names: str, text: str = "") -> ScriptedResponse:
    return ScriptedResponse(text=text, tool_calls=[ScriptedToolCall(n, {}) for n in names])


@tool
async def quick() -> str:
    """Return at once."""
    return "ok"


@tool
async def stubborn() -> str:
    """Ignore the run's signal and its first cancellation (cleanup takes the whole grace)."""
    try:
        await asyncio.Event().wait()
    except asyncio.CancelledError:
        pass
    return "late"


# -- running again right after stopping the iteration ------------------------------------------


@pytest.mark.parametrize("at", ["turn_ended", "synthetic_result"])
async def test_a_host_that_stops_iterating_after_the_turn_ended_can_run_again_at_once(at: str) -> None:
    """`break` once the turn has ended (at its TurnEnded, or at a result the end of an aborted
    turn synthesized), then run() again at once: the common loop of a chat host. The next run
    waits for the dropped run's cleanup, as it does after a break mid-turn; it used to raise
    RuntimeError ("a run is already in progress")."""
    if at == "turn_ended":
        engine = QueryEngine(ScriptedModel(["one", "two"]), policies=[])
    else:
        engine = QueryEngine(ScriptedModel([calls("quick", text="Calling."), "two"]), tools=[quick], policies=[])
    async for event in engine.run("first"):
        if event.type == "assistant_message" and at == "synthetic_result":
            engine.interrupt()  # checkpoint 2: the call never starts, its result is synthesized at the turn's end
        if isinstance(event, TurnEnded) or (isinstance(event, ToolCallFinished) and event.synthetic):
            break
    events = [event async for event in engine.run("second")]
    end = events[-1]
    assert isinstance(end, TurnEnded) and end.reason == "completed"
    assert engine.messages[-1].text == "two"
    assert not engine.running and validate_transcript(engine.messages) == []


async def test_a_run_left_unfinished_and_still_held_is_named_in_the_error() -> None:
    """A host that keeps the run object it stopped iterating (so it is never closed) gets an
    error that says what to do, rather than only that a run is in progress."""
    engine = QueryEngine(ScriptedModel(["one", "two"]), policies=[])
    run = engine.run("first")
    async for event in run:
        if isinstance(event, TurnEnded):
            break
    with pytest.raises(RuntimeError, match=r"aclose\(\)"):
        async for _ in engine.run("second"):
            pass
    await run.aclose()
    assert [e.type async for e in engine.run("second")][-1] == "turn_ended"


# -- control calls while the next run waits for the last one's cleanup -------------------------


async def _run_while_the_last_one_cleans_up(
    engine: QueryEngine, act: Callable[[AsyncGenerator[Event, None]], object], on_start: Callable[[], object] = str
) -> list[Event]:
    """Break out of a run whose tool ignores its signal (its cleanup takes the 30 s grace),
    start the next run at once, and call ``act(run)`` 1 s later (virtual time): the next run
    is waiting for that cleanup then. ``on_start()`` is called at its TurnStarted."""
    async for event in engine.run("first"):
        if isinstance(event, ToolCallStarted):
            break
    asked = engine.model.request_count  # type: ignore[attr-defined]
    loop = asyncio.get_running_loop()
    with VirtualClock():
        run = engine.run("second")
        loop.call_later(1.0, act, run)
        events = []
        async for event in run:
            events.append(event)
            if isinstance(event, TurnStarted):
                on_start()
    assert engine.model.request_count == asked  # type: ignore[attr-defined]  # the model was not asked again
    assert not engine.running and validate_transcript(engine.messages) == []
    return events


@pytest.mark.swallows_cancel
@pytest.mark.parametrize("where", ["loop", "thread"])
async def test_an_interrupt_while_the_next_run_waits_for_the_last_ones_cleanup_stops_it(where: str) -> None:
    """Ctrl-C while the new run waits for the dropped run's tools to give up: the new run is
    the one the user stops. It used to reach the old, already stopped run and be lost, and the
    new run went on to ask the model."""
    import threading

    engine = QueryEngine(ScriptedModel([calls("stubborn"), "never asked"]), tools=[stubborn], policies=[], tool_cancel_grace=30.0)

    def interrupt(_run: object) -> None:
        if where == "loop":
            engine.interrupt("stop")
        else:
            ui = threading.Thread(target=engine.interrupt, args=("stop",))
            ui.start()
            ui.join()

    events = await _run_while_the_last_one_cleans_up(engine, interrupt)
    assert [type(e) for e in events] == [TurnStarted, TurnEnded]
    end = events[-1]
    assert isinstance(end, TurnEnded) and (end.reason, end.abort_reason) == ("aborted_streaming", "stop")
    assert [m.text for m in engine.messages[-2:]] == ["second", "[Request interrupted by user]"]


@pytest.mark.swallows_cancel
async def test_aclose_from_another_task_while_the_next_run_waits_ends_it_without_a_model_request() -> None:
    engine = QueryEngine(ScriptedModel([calls("stubborn"), "never asked"]), tools=[stubborn], policies=[], tool_cancel_grace=30.0)
    closers: list[asyncio.Future[None]] = []
    receipts: list[str] = []

    def stop(run: AsyncGenerator[Event, None]) -> None:  # a "stop" button's task, and a text sent then
        closers.append(asyncio.ensure_future(run.aclose()))
        receipts.append(engine.send_now("and this"))

    later: list[str] = []
    events = await _run_while_the_last_one_cleans_up(engine, stop, lambda: later.append(engine.send_now("later")))
    await closers[0]
    assert [q.id for q in engine.inbox.send_now] == later  # closed: no further turn starts; it waits
    start, end = events[0], events[-1]
    assert [type(e) for e in events] == [TurnStarted, TurnEnded]  # one turn, which asks no model
    assert isinstance(start, TurnStarted) and start.ids == tuple(receipts)  # the text began the run, before the prompt
    assert isinstance(end, TurnEnded) and (end.reason, end.abort_reason) == ("aborted_streaming", "consumer_closed")
    assert [m.text for m in engine.messages[-2:]] == ["and this", "second"]


@pytest.mark.swallows_cancel
async def test_send_now_while_the_next_run_waits_joins_its_first_turn_without_stopping_it() -> None:
    """send_now() then means "take this too": its text starts the run beside the prompt, and
    the run is not stopped (its stop reaches the old run)."""
    engine = QueryEngine(ScriptedModel([calls("stubborn"), "both answered"]), tools=[stubborn], policies=[], tool_cancel_grace=30.0)
    async for event in engine.run("first"):
        if isinstance(event, ToolCallStarted):
            break
    receipts: list[str] = []
    loop = asyncio.get_running_loop()
    with VirtualClock():
        loop.call_later(1.0, lambda: receipts.append(engine.send_now("also this")))
        events = [event async for event in engine.run("second")]
    start, end = events[0], events[-1]
    assert isinstance(start, TurnStarted) and start.ids == tuple(receipts)
    assert isinstance(end, TurnEnded) and end.reason == "completed"
    assert [m.text for m in engine.messages[-3:]] == ["also this", "second", "both answered"]


@pytest.mark.swallows_cancel
async def test_a_run_cancelled_while_it_waits_for_the_last_ones_cleanup_leaves_nothing_behind() -> None:
    """The host's task is cancelled while its new run waits: the run never began (its prompt is
    not in the transcript), a later interrupt() reaches nothing stale, and the next run is whole."""
    engine = QueryEngine(ScriptedModel([calls("stubborn"), "answered"]), tools=[stubborn], policies=[], tool_cancel_grace=30.0)
    async for event in engine.run("first"):
        if isinstance(event, ToolCallStarted):
            break
    loop = asyncio.get_running_loop()
    with VirtualClock():
        task = asyncio.ensure_future(collect_events(engine, "never begun"))
        loop.call_later(1.0, task.cancel)
        with pytest.raises(asyncio.CancelledError):
            await task
        engine.interrupt()  # nothing waits now: a no-op for the next run
        events = await collect_events(engine, "second")
    end = events[-1]
    assert isinstance(end, TurnEnded) and end.reason == "completed"
    assert "never begun" not in [m.text for m in engine.messages]
    assert engine.messages[-1].text == "answered" and validate_transcript(engine.messages) == []


async def collect_events(engine: QueryEngine, prompt: str) -> list[Event]:
    return [event async for event in engine.run(prompt)]


# -- control calls between run() and its first step ---------------------------------------------


@pytest.mark.parametrize("where", ["loop", "thread"])
async def test_an_interrupt_between_run_and_its_first_step_stops_that_run(where: str) -> None:
    """A chat server hands a run() to a task, and the user presses stop at once, before the task
    has had a step: the run begins aborted, before any model request. The interrupt used to
    reach no run (none was in progress yet) and be lost, and the run went on to its end."""
    import threading

    engine = QueryEngine(ScriptedModel(["never asked"]), policies=[])

    async def pump(run: AsyncGenerator[Event, None]) -> list[Event]:
        return [event async for event in run]

    task = asyncio.create_task(pump(engine.run("Explain")))  # the task has had no step yet
    if where == "loop":
        engine.interrupt("stop")
    else:
        ui = threading.Thread(target=engine.interrupt, args=("stop",))
        ui.start()
        ui.join()
    events = await task
    assert [type(e) for e in events] == [TurnStarted, TurnEnded]
    end = events[-1]
    assert isinstance(end, TurnEnded) and (end.reason, end.abort_reason) == ("aborted_streaming", "stop")
    assert engine.model.request_count == 0  # type: ignore[attr-defined]
    assert [m.text for m in engine.messages] == ["Explain", "[Request interrupted by user]"]
    assert not engine.running and validate_transcript(engine.messages) == []


async def test_a_send_now_between_run_and_its_first_step_replaces_that_runs_turn() -> None:
    """A host hands run(prompt) to a task and the user sends a message now before the task has
    had a step (input that was waiting, a fast paste): the prompt's turn is the one replaced.
    The text used to be taken as typed before the prompt: it went first in the transcript, and
    the prompt's turn, the one it was sent to stop, ran to its end."""
    engine = QueryEngine(ScriptedModel(["the answer to the text sent now"]), policies=[])

    async def pump(run: AsyncGenerator[Event, None]) -> list[Event]:
        return [event async for event in run]

    task = asyncio.create_task(pump(engine.run("Explain")))  # the task has had no step yet
    receipt = engine.send_now("Stop; do this instead")
    events = await task
    starts = [e for e in events if isinstance(e, TurnStarted)]
    ends = [e for e in events if isinstance(e, TurnEnded)]
    assert [s.prompt.text if s.prompt else None for s in starts] == ["Explain", "Stop; do this instead"]
    assert starts[1].ids == (receipt,)
    assert [(e.reason, e.abort_reason) for e in ends] == [("aborted_streaming", "send_now"), ("completed", None)]
    assert engine.model.request_count == 1  # type: ignore[attr-defined]
    assert [m.text for m in engine.messages] == ["Explain", "Stop; do this instead", "the answer to the text sent now"]
    assert validate_transcript(engine.messages) == []


async def test_a_send_now_for_a_run_dropped_unbegun_starts_the_next_run() -> None:
    engine = QueryEngine(ScriptedModel(["answered"]), policies=[])
    dropped = engine.run("never iterated")
    engine.send_now("the text sent now")  # its turn never begins: the text waits, as when idle
    del dropped
    events = [event async for event in engine.run()]
    assert isinstance(events[-1], TurnEnded) and events[-1].reason == "completed"
    assert [m.text for m in engine.messages] == ["the text sent now", "answered"]


async def test_an_interrupt_between_run_and_its_first_iteration_stops_that_run() -> None:
    engine = QueryEngine(ScriptedModel(["never asked"]), policies=[])
    run = engine.run("Explain")
    engine.interrupt()
    events = [event async for event in run]
    end = events[-1]
    assert isinstance(end, TurnEnded) and (end.reason, end.abort_reason) == ("aborted_streaming", "cancel")
    assert engine.model.request_count == 0  # type: ignore[attr-defined]


async def test_an_interrupt_while_idle_or_for_a_run_dropped_unbegun_stops_no_later_run() -> None:
    engine = QueryEngine(ScriptedModel(["one", "two"]), policies=[])
    engine.interrupt()  # nothing made, nothing running: a no-op
    assert [e.type async for e in engine.run("first")][-1] == "turn_ended"
    assert engine.last_turn_ended is not None and engine.last_turn_ended.reason == "completed"
    dropped = engine.run("never iterated")
    engine.interrupt()  # reaches that run, which is never begun
    del dropped
    events = [event async for event in engine.run("second")]
    end = events[-1]
    assert isinstance(end, TurnEnded) and end.reason == "completed"
    assert [m.text for m in engine.messages] == ["first", "one", "second", "two"]
    engine.interrupt()  # after a run that ran: a no-op again
    assert [e.type async for e in engine.run("third")][-1] == "turn_ended"


# -- receipts when the host stops at any event ---------------------------------------------


@pytest.mark.parametrize("where", ["end_of_tool_phase", "end_of_turn"])
async def test_a_host_stopping_at_a_synthetic_result_never_loses_an_interjections_receipt(where: str) -> None:
    """Every interjection gets exactly one InterjectionInjected or InterjectionDropped that the
    host sees, or stays queued for the next run. A host that stops at the first failed call
    (`break` at a synthetic ToolCallFinished) used to lose it: the interjection was merged (or
    dropped) with the results, and its event came after the one the host stopped at."""
    if where == "end_of_tool_phase":  # three serial calls; stopped after the second: the third never runs
        engine = QueryEngine(ScriptedModel([calls("quick", "quick", "quick"), "noted"]), tools=[quick], policies=[])
    else:  # stopped after the response: its call never runs, its result is synthesized at the turn's end
        engine = QueryEngine(ScriptedModel([calls("quick", text="Calling."), "noted"]), tools=[quick], policies=[])
    receipt = ""
    seen: list[str] = []
    finished = 0
    async for event in engine.run("go"):
        if isinstance(event, InterjectionInjected | InterjectionDropped):
            seen += event.ids
        if isinstance(event, ToolCallFinished):
            finished += 1
            if event.synthetic:
                break
            if where == "end_of_tool_phase" and finished == 2:
                receipt = engine.interject("mind the docs")
                engine.interrupt()
        if where == "end_of_turn" and event.type == "assistant_message":
            receipt = engine.interject("mind the docs")
            engine.interrupt()
    assert validate_transcript(engine.messages) == []
    if receipt not in seen:  # not reported: then it waits, and the next run delivers it
        assert [q.id for q in engine.inbox.interjections] == [receipt]
        events = [event async for event in engine.run()]
        seen += [i for e in events if isinstance(e, InterjectionInjected | InterjectionDropped) for i in e.ids]
    assert seen == [receipt]
    assert validate_transcript(engine.messages) == []


# -- running, as the host sees it --------------------------------------------------------------


@pytest.mark.swallows_cancel
async def test_a_run_the_host_broke_out_of_is_not_running_while_its_cleanup_goes_on() -> None:
    """After a ``break`` mid-call, the dropped run's cleanup waits out the tool's grace in the
    background. ``running`` and the repr said a run was in progress, and ``submit()`` with
    ``follow_up_behavior="steer"`` made the text an interjection, while ``interject()`` already
    took that state as idle. No run is going for the host: ``running`` is False, the repr says
    idle, and a steered submit is a follow-up, as with no run at all."""
    engine = QueryEngine(
        ScriptedModel([calls("stubborn"), "answered", "followed up"]), tools=[stubborn], policies=[],
        tool_cancel_grace=30.0, follow_up_behavior="steer",
    )  # fmt: skip
    async for event in engine.run("first"):
        if isinstance(event, ToolCallStarted):
            break
    closing = engine._closing
    assert closing is not None and not closing.done()  # the cleanup is still going
    assert not engine.running
    assert " idle " in repr(engine)
    receipt = engine.submit("and then this")
    assert [q.id for q in engine.inbox.follow_ups] == [receipt] and not engine.inbox.interjections
    seen: list[tuple[bool, bool]] = []
    with VirtualClock():
        events = await _run_while_the_last_one_cleans_up_and_look(engine, seen)
    assert seen == [(True, True)]  # the next run, waiting for that cleanup, is the host's run in progress
    # The follow-up is the turn after the next run's prompt, not words slipped in before it.
    assert [(e.turn, e.prompt.text, e.ids) for e in events if isinstance(e, TurnStarted)] == [
        (1, "second", ()), (2, "and then this", (receipt,))
    ]  # fmt: skip
    assert [e.reason for e in events if isinstance(e, TurnEnded)] == ["completed", "completed"]
    assert not engine.running and " idle " in repr(engine)
    assert validate_transcript(engine.messages) == []


async def _run_while_the_last_one_cleans_up_and_look(engine: QueryEngine, seen: list[tuple[bool, bool]]) -> list[Event]:
    loop = asyncio.get_running_loop()
    loop.call_later(1.0, lambda: seen.append((engine.running, " running " in repr(engine))))
    return [event async for event in engine.run("second")]


# -- settings changed between runs --------------------------------------------------------------


async def test_settings_set_on_the_engine_between_runs_take_effect() -> None:
    """A chat UI toggles its permission mode or edits the system prompt between runs with
    `engine.permission = ...` / `engine.system = ...`; that used to make a new attribute the
    engine never read, so the old callback went on answering."""
    from agentloop import Allow, Deny, ModelRequest

    seen: list[str | None] = []

    def answer(request: ModelRequest) -> ScriptedResponse:
        seen.append(request.system)
        return ScriptedResponse(text="ok")

    model = ScriptedModel([calls("quick"), answer, calls("quick"), answer])
    engine = QueryEngine(model, tools=[quick], system="Be brief.", permission=lambda use, ctx: Allow())
    events = [e async for e in engine.run("one")]
    assert [e.result.is_error for e in events if isinstance(e, ToolCallFinished)] == [False]
    engine.permission = lambda use, ctx: Deny("read-only mode")
    engine.system = "Be thorough."
    assert engine.system == "Be thorough." and engine.options.system == "Be thorough."
    events = [e async for e in engine.run("two")]
    denied = [e.result for e in events if isinstance(e, ToolCallFinished)]
    assert denied[0].is_error and "read-only mode" in denied[0].text
    assert seen == ["Be brief.", "Be thorough."]
    assert validate_transcript(engine.messages) == []


def test_a_setting_set_on_the_engine_is_checked_as_at_construction() -> None:
    engine = QueryEngine(ScriptedModel(["ok"]))
    with pytest.raises(ValueError, match="follow_up_behavior"):
        engine.follow_up_behavior = "later"  # type: ignore[assignment]
    assert engine.follow_up_behavior == "queue"
    # A system prompt that is not text would reach the provider as it is (a 400 on every request).
    with pytest.raises(TypeError, match="system"):
        engine.system = 5  # type: ignore[assignment]
    with pytest.raises(TypeError, match="system"):
        QueryEngine(ScriptedModel(["ok"]), system=["Be brief."])  # type: ignore[arg-type]
