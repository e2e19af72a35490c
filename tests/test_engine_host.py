"""The host's control surface at odd moments: stopping the iteration after a turn's end, and
receipts for what the host queued when it stops iterating at any event."""

from __future__ import annotations

import pytest

from agentloop import (
    InterjectionDropped,
    InterjectionInjected,
    QueryEngine,
    ScriptedModel,
    ScriptedResponse,
    ScriptedToolCall,
    ToolCallFinished,
    TurnEnded,
    tool,
    validate_transcript,
)


def calls(*names: str, text: str = "") -> ScriptedResponse:
    return ScriptedResponse(text=text, tool_calls=[ScriptedToolCall(n, {}) for n in names])


@tool
async def quick() -> str:
    """Return at once."""
    return "ok"


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
