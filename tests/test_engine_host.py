"""The host's control surface at odd moments: receipts for what the host queued when it
stops iterating at any event."""

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
    tool,
    validate_transcript,
)


def calls(*names: str, text: str = "") -> ScriptedResponse:
    return ScriptedResponse(text=text, tool_calls=[ScriptedToolCall(n, {}) for n in names])


@tool
async def quick() -> str:
    """Return at once."""
    return "ok"


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
