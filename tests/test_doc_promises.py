"""Promises of docs/interrupts.md, docs/concepts.md and docs/subagents.md that no other test pins."""

from __future__ import annotations

import asyncio
from collections.abc import Sequence

import pytest

from agentloop import (
    AbortController,
    AssistantMessage,
    Event,
    InterjectionDropped,
    Message,
    ModelRequest,
    QueryEngine,
    ScriptedModel,
    ScriptedResponse,
    ScriptedToolCall,
    TextDelta,
    ToolCallFinished,
    ToolCallStarted,
    ToolContext,
    ToolResultBlock,
    TurnEnded,
    TurnStarted,
    delegate_tool,
    tool,
    validate_transcript,
)
from agentloop.policies import EndTurn, Policy
from agentloop.testing import collect
from tests.helpers import HangingModel, VirtualClock


def calls(*names: str) -> ScriptedResponse:
    return ScriptedResponse(tool_calls=[ScriptedToolCall(n, {}) for n in names])


def ends(events: Sequence[Event]) -> list[TurnEnded]:
    return [e for e in events if isinstance(e, TurnEnded) and e.agent_id is None]


@tool
async def step() -> str:
    """One step."""
    return "done"


# -- interrupts.md --------------------------------------------------------------------------------


async def test_a_tool_that_notices_the_abort_and_returns_keeps_the_result_it_returned() -> None:
    """interrupts.md, Cancel: a tool that returns instead of raising knows best what it did."""

    @tool
    async def careful(ctx: ToolContext) -> str:
        """Stop cleanly."""
        await ctx.signal.wait()
        return "rolled back the half-written file"

    engine = QueryEngine(ScriptedModel([calls("careful")]), tools=[careful], policies=[])
    events = []
    async for event in engine.run("go"):
        events.append(event)
        if isinstance(event, ToolCallStarted):
            engine.interrupt()
    end = events[-1]
    assert isinstance(end, TurnEnded) and (end.reason, end.abort_reason) == ("aborted_tools", "cancel")
    result = engine.messages[2].tool_results[0]
    assert (result.text, result.is_error) == ("rolled back the half-written file", False)
    finished = next(e for e in events if isinstance(e, ToolCallFinished))
    assert not finished.synthetic and finished.result.text == "rolled back the half-written file"
    assert engine.messages[-1].kind == "interrupt_notice"


async def test_an_interjection_an_abort_drops_is_reported_before_the_results_it_synthesizes() -> None:
    """interrupts.md, Steer: an InterjectionDropped comes before the results the turn's end
    synthesizes (here for calls that never started: the abort came before the tools), so a host
    that stops at the first of those results has heard what became of the text."""
    engine = QueryEngine(ScriptedModel([calls("step", "step")]), tools=[step], policies=[])
    events: list[Event] = []
    async for event in engine.run("go"):
        events.append(event)
        if isinstance(event, AssistantMessage):
            receipt = engine.interject("also this")
            engine.interrupt()
    dropped = [i for i, e in enumerate(events) if isinstance(e, InterjectionDropped)]
    synthesized = [i for i, e in enumerate(events) if isinstance(e, ToolCallFinished) and e.synthetic]
    assert len(dropped) == 1 and events[dropped[0]].ids == (receipt,)  # type: ignore[attr-defined]
    assert len(synthesized) == 2 and dropped[0] < min(synthesized)
    assert all("never started" in r.text for r in engine.messages[2].tool_results)
    assert validate_transcript(engine.messages) == []


async def test_a_timeout_around_the_wait_for_an_event_stops_the_run_as_consumer_closed() -> None:
    """interrupts.md: ``asyncio.wait_for(anext(run), t)`` cancels the run's own await; the run
    ends there ("consumer_closed", the transcript settled) and no TurnEnded comes."""
    model = HangingModel(["Half an ", "answer"])
    engine = QueryEngine(model, policies=[])
    run = engine.run("Explain")
    seen = [await anext(run) for _ in range(3)]  # TurnStarted and the two deltas
    try:
        await asyncio.wait_for(anext(run), 0.01)  # the model never sends more: this always times out
    except TimeoutError:
        pass
    else:
        raise AssertionError("the wait did not time out")
    rest = [event async for event in run]
    assert rest == [] and not any(isinstance(e, TurnEnded) for e in seen)
    assert not engine.running and model.closed
    last = engine.messages[-1]
    assert last.role == "assistant" and last.partial and last.meta["abort_reason"] == "consumer_closed"
    assert last.text == "Half an answer"
    assert not any(m.kind == "interrupt_notice" for m in engine.messages)
    assert validate_transcript(engine.messages) == []


# -- concepts.md ----------------------------------------------------------------------------------


async def test_a_follow_up_turn_starts_a_new_max_turns_count() -> None:
    """concepts.md, Hard limits: ``max_turns`` counts the model requests of the current turn; a
    follow-up turn starts a new count, and ``TurnEnded.turns`` is that turn's alone."""
    model = ScriptedModel([calls("step"), "one", calls("step"), "two"])
    engine = QueryEngine(model, tools=[step], policies=[], max_turns=2)
    events: list[Event] = []
    async for event in engine.run("first"):
        events.append(event)
        if isinstance(event, TurnStarted) and event.turn == 1:
            engine.follow_up("second")
    assert [(e.reason, e.turns) for e in ends(events)] == [("completed", 2), ("completed", 2)]
    assert engine.messages[-1].text == "two"


async def test_a_send_now_turn_starts_a_new_max_turns_count() -> None:
    model = ScriptedModel([calls("step"), ScriptedResponse(text="x" * 40, chunk=2), calls("step"), "two"])
    engine = QueryEngine(model, tools=[step], policies=[], max_turns=2)
    events: list[Event] = []
    sent = False
    async for event in engine.run("first"):
        events.append(event)
        if isinstance(event, TextDelta) and not sent:
            sent = True
            engine.send_now("instead")
    assert [(e.reason, e.abort_reason, e.turns) for e in ends(events)] == [
        ("aborted_streaming", "send_now", 2),
        ("completed", None, 2),
    ]
    assert engine.messages[-1].text == "two"


async def test_each_turn_ended_usage_includes_the_earlier_turns_of_the_run() -> None:
    """concepts.md: each ``TurnEnded.usage`` is the run's tokens so far; the last is the total."""
    engine = QueryEngine(ScriptedModel([calls("step"), "one", "two", "three"]), tools=[step], policies=[])
    events: list[Event] = []
    async for event in engine.run("first"):
        events.append(event)
        if isinstance(event, TurnStarted) and event.turn == 1:
            engine.follow_up("second")
    first, second = ends(events)
    assert (first.usage.total, second.usage.total) == (40, 60)  # 20 tokens a scripted response
    again = ends(await collect(engine.run("third")))
    assert [e.usage.total for e in again] == [20]  # a new run counts from zero


# -- subagents.md ---------------------------------------------------------------------------------


class EndAfterResults(Policy):
    """Ends the turn after the first tool batch, and interrupts the engine as it does."""

    def __init__(self) -> None:
        self.engine: QueryEngine | None = None

    def on_results(self, message: Message, results: Sequence[ToolResultBlock]) -> EndTurn:
        assert self.engine is not None
        self.engine.interrupt("cancel")  # the user's stop lands as the policy ends the turn
        return EndTurn("enough", reason="hook_stopped")


async def test_an_interrupt_that_lands_as_a_policy_ends_the_turn_wins_and_runs_the_abort_hooks() -> None:
    """subagents.md, Abort hooks: an interrupt that comes as a policy ends the turn wins over the
    policy, so its hooks run (once)."""
    policy = EndAfterResults()
    engine = QueryEngine(ScriptedModel([calls("step"), "never"]), tools=[step], policies=[policy])
    policy.engine = engine
    hooked: list[str] = []
    engine.on_abort(hooked.append)
    events = await collect(engine.run("go"))
    end = ends(events)[-1]
    assert end.abort_reason == "cancel" and end.reason != "hook_stopped"
    assert (end.reason, end.detail) == ("aborted_tools", None)
    assert hooked == ["cancel"]
    assert engine.messages[-1].kind == "interrupt_notice"
    assert validate_transcript(engine.messages) == []


async def test_after_a_break_mid_stream_run_without_a_prompt_is_a_value_error_and_continue_goes_on() -> None:
    """interrupts.md: a run stopped by the host writes no notice; there is no user message to
    answer, so ``run()`` without a prompt raises ValueError; ``run("continue")`` goes on."""
    engine = QueryEngine(ScriptedModel([ScriptedResponse(text="abcdefgh", chunk=2), "ok"]), policies=[])
    async for event in engine.run("go"):
        if isinstance(event, TextDelta):
            break
    last = engine.messages[-1]
    assert (last.role, last.text, last.partial, last.meta["abort_reason"]) == (
        "assistant",
        "ab",
        True,
        "consumer_closed",
    )
    with pytest.raises(ValueError, match="needs a prompt"):
        await collect(engine.run())
    assert [e.reason for e in ends(await collect(engine.run("continue")))] == ["completed"]
    assert [m.text for m in engine.messages[-2:]] == ["continue", "ok"]


@pytest.mark.parametrize(("grace", "child_ends_after"), [(2.0, 1.9), (0.1, 0.05), (0.04, 0.02)])
async def test_a_child_cancels_its_deaf_calls_a_moment_before_the_parents_grace_runs_out(
    grace: float, child_ends_after: float
) -> None:
    """subagents.md, Linked abort: a child with its parent's grace cancels its own calls that
    ignore the signal 0.1 s before the parent's grace runs out, or half the parent's grace if
    that is shorter, so its own TurnEnded comes within the parent's grace."""

    @tool
    async def deaf() -> str:
        """Ignores the signal."""
        await asyncio.sleep(3600)
        return "never"

    def script(request: ModelRequest) -> ScriptedResponse:
        if request.messages[0].text == "go":
            return ScriptedResponse(tool_calls=[ScriptedToolCall("task", {"task": "dig"})])
        return calls("deaf")

    with VirtualClock() as clock:
        engine = QueryEngine(
            ScriptedModel([script], cycle=True),
            tools=[delegate_tool(), deaf],
            tool_cancel_grace=grace,
            policies=[],
        )
        aborted_at = None
        ended_at: dict[str | None, float] = {}
        async for event in engine.run("go"):
            if isinstance(event, ToolCallStarted) and event.agent_id == "sub-1" and aborted_at is None:
                aborted_at = clock.now
                engine.interrupt()
            if isinstance(event, TurnEnded):
                ended_at[event.agent_id] = clock.now
                assert event.reason == "aborted_tools"
    assert aborted_at is not None and set(ended_at) == {"sub-1", None}
    assert ended_at["sub-1"] - aborted_at == pytest.approx(child_ends_after, abs=1e-6)
    assert ended_at[None] - aborted_at <= grace
    result = engine.messages[2].tool_results[0]
    assert "stopped while it was running" in result.text


async def test_a_background_childs_tokens_count_for_the_parents_run_and_for_none_while_it_is_idle() -> None:
    """subagents.md, Usage and limits: a background child's tokens count for the run its parent
    is in when they are spent, and for none while the parent is idle."""
    idle_parent = QueryEngine(ScriptedModel(["child answer", "parent answer"]), policies=[])
    await idle_parent.start_background(idle_parent.subagent(agent_id="bg"), "work")
    assert [e.usage.total for e in ends(await collect(idle_parent.run("go")))] == [20]  # its own response

    @tool
    async def spawn(ctx: ToolContext) -> str:
        """Start a background helper and wait for it."""
        await ctx.engine.start_background(ctx.engine.subagent(agent_id="bg"), "work")
        return "spawned"

    model = ScriptedModel([calls("spawn"), "child answer", "parent answer"])
    parent = QueryEngine(model, tools=[spawn], policies=[])
    assert [e.usage.total for e in ends(await collect(parent.run("go")))] == [
        60
    ]  # two of its own, one child's


def test_a_scenarios_defaults_and_the_event_types_its_steps_wait_for_are_as_the_page_says() -> None:
    """interrupts.md, Scripted scenarios: ``timeout`` 120 s, ``on`` "idle", ``count`` 1, an
    interrupt's ``reason`` "cancel"; a bare list of steps is a scenario too; each ``on`` the page
    lists is an event type."""
    import re
    import typing
    from pathlib import Path

    from agentloop.demo.scenario import parse

    for data in ({"steps": [{"do": "interrupt"}]}, [{"do": "interrupt"}]):
        scenario = parse(data)
        assert (scenario.prompt, scenario.timeout) == (None, 120.0)
        (only,) = scenario.steps
        assert (only.on, only.count, only.reason, only.delay) == ("idle", 1, "cancel", 0.0)
    page = (Path(__file__).resolve().parent.parent / "docs" / "interrupts.md").read_text(encoding="utf-8")
    listed = re.search(r"- `on`: an event type \((.*?)\)", page, re.DOTALL)
    assert listed is not None
    named = re.findall(r"`(\w+)`", listed.group(1))
    types = {cls.__dataclass_fields__["type"].default for cls in typing.get_args(Event)}
    assert len(named) >= 10 and set(named) <= types, set(named) - types


@pytest.mark.parametrize("grace", [2.0, 0.05, 0.0])
@pytest.mark.parametrize("swallows", [False, True])
async def test_a_tool_deaf_to_the_abort_is_cancelled_one_grace_after_it_and_given_0_1_s_to_unwind(
    grace: float, swallows: bool
) -> None:
    """interrupts.md, Cancel: a tool that ignores the signal is cancelled when
    ``tool_cancel_grace`` has passed since the abort (not before), and given 0.1 s more; one that
    swallows the cancellation is abandoned then, and ``run()`` ends."""
    with VirtualClock() as clock:
        at: dict[str, float] = {}

        @tool
        async def deaf() -> str:
            """Ignores the signal."""
            try:
                await asyncio.sleep(3600)
            except asyncio.CancelledError:
                at["cancelled"] = clock.now
                if not swallows:
                    raise
            await asyncio.sleep(3600)
            return "late"

        engine = QueryEngine(
            ScriptedModel([calls("deaf")]), tools=[deaf], policies=[], tool_cancel_grace=grace
        )
        async for event in engine.run("go"):
            if isinstance(event, ToolCallStarted):
                engine.interrupt()
                at["abort"] = clock.now
        at["end"] = clock.now
        for task in [t for t in asyncio.all_tasks() if t is not asyncio.current_task()]:
            task.cancel()  # the abandoned call, once the test has seen when the run ended
            await asyncio.gather(task, return_exceptions=True)
    assert at["cancelled"] - at["abort"] == pytest.approx(grace, abs=1e-6)
    assert at["end"] - at["abort"] == pytest.approx(grace + (0.1 if swallows else 0.0), abs=1e-6)
    assert "stopped while it was running" in engine.messages[2].tool_results[0].text


@pytest.mark.parametrize(("grace", "abandoned_after"), [(2.0, 3.0), (0.5, 1.5), (0.05, 1.1), (0.0, 1.1)])
async def test_a_call_that_swallows_its_timeouts_cancellation_is_abandoned_a_grace_later_at_least_0_1_s(
    grace: float, abandoned_after: float
) -> None:
    """interrupts.md: a call that swallows its own ``timeout``'s cancellation is abandoned
    ``tool_cancel_grace`` after the timeout (0.1 s at least), with its timeout error, and the turn
    goes on."""

    @tool(timeout=1)
    async def stuck() -> str:
        """Hang."""
        try:
            await asyncio.sleep(50)
        except asyncio.CancelledError:
            pass  # swallowed: it carries on
        await asyncio.sleep(50)
        return "late"

    with VirtualClock() as clock:
        engine = QueryEngine(
            ScriptedModel([calls("stuck"), "ok"]), tools=[stuck], policies=[], tool_cancel_grace=grace
        )
        at: dict[str, float] = {}
        async for event in engine.run("go"):
            at[type(event).__name__] = clock.now
            if isinstance(event, TurnEnded):
                assert event.reason == "completed"
        for task in [t for t in asyncio.all_tasks() if t is not asyncio.current_task()]:
            await asyncio.gather(task, return_exceptions=True)  # the abandoned call, cancelled once more
    assert at["ToolCallFinished"] - at["ToolCallStarted"] == pytest.approx(abandoned_after, abs=1e-6)
    assert engine.messages[2].tool_results[0].text.startswith("Tool 'stuck' timed out after 1 s")
    assert engine.messages[-1].text == "ok"


async def test_a_reason_of_your_own_is_treated_like_cancel() -> None:
    """concepts.md, Reasons: any other reason is treated like "cancel": the partial text kept
    with the reason, the interrupt notice written, the run ended, its follow-ups left queued."""
    engine = QueryEngine(
        ScriptedModel([ScriptedResponse(text="abcdefgh", chunk=2), "later answer"]), policies=[]
    )
    events: list[Event] = []
    async for event in engine.run("go"):
        events.append(event)
        if isinstance(event, TextDelta) and len(events) == 2:  # the first delta
            engine.follow_up("later")
            engine.interrupt("user_left")
    assert [(e.reason, e.abort_reason) for e in ends(events)] == [("aborted_streaming", "user_left")]
    cut, notice = engine.messages[-2:]
    assert cut.partial and cut.meta["abort_reason"] == "user_left" and notice.kind == "interrupt_notice"
    assert [e.turn for e in await collect(engine.run()) if isinstance(e, TurnStarted)] == [1]
    assert [m.text for m in engine.messages[-2:]] == ["later", "later answer"]


def test_a_listener_that_raises_system_exit_propagates_after_the_others_ran() -> None:
    """concepts.md: a KeyboardInterrupt or SystemExit from a listener propagates out of
    ``abort()``, after the others ran."""
    controller = AbortController()
    seen: list[str] = []

    def leave(_reason: str) -> None:
        raise SystemExit(3)

    controller.signal.add_listener(leave)
    controller.signal.add_listener(seen.append)
    with pytest.raises(SystemExit) as raised:
        controller.abort("quit")
    assert raised.value.code == 3 and seen == ["quit"] and controller.signal.reason == "quit"


async def test_a_run_without_a_prompt_that_goes_on_from_the_transcript_starts_a_turn_with_no_prompt() -> None:
    """api.md, TurnStarted: ``prompt`` is None for a turn that starts without a user message of
    its own (here ``run()`` going on from the results ``max_turns`` stopped at)."""
    model = ScriptedModel([calls("step"), "done"])
    engine = QueryEngine(model, tools=[step], policies=[], max_turns=1)
    assert [e.reason for e in ends(await collect(engine.run("go")))] == ["max_turns"]
    events = await collect(engine.run())
    assert [(e.turn, e.prompt, e.ids) for e in events if isinstance(e, TurnStarted)] == [(1, None, ())]
    assert [e.reason for e in ends(events)] == ["completed"] and engine.messages[-1].text == "done"
