"""A response a refusal (or a content filter) stopped: its tool calls are not run, and the turn
ends there, whatever provider said so."""

from __future__ import annotations

from typing import Any

import pytest

from agentloop import (
    AssistantMessage,
    QueryEngine,
    ScriptedModel,
    ScriptedResponse,
    ScriptedToolCall,
    ToolCallFinished,
    ToolCallStarted,
    TurnEnded,
    tool,
    validate_transcript,
)
from tests.helpers import collect


def _engine(*responses: ScriptedResponse | str) -> tuple[QueryEngine, list[dict[str, Any]]]:
    ran: list[dict[str, Any]] = []

    @tool
    async def write(path: str) -> str:
        """Write a file."""
        ran.append({"path": path})
        return "written"

    return QueryEngine(ScriptedModel(list(responses)), tools=[write], policies=[]), ran


_REFUSED = ScriptedResponse(
    text="I will write it.",
    tool_calls=[ScriptedToolCall("write", {"path": "/tmp/a"}), ScriptedToolCall("write", {"path": "/tmp/b"})],
    stop_reason="refusal",
)


async def test_a_refused_response_with_whole_tool_calls_runs_none_and_ends_the_turn() -> None:
    """The calls of a refused response used to run, and the loop asked the model again with
    their results, which a provider that leaves the refused turn out never shows it."""
    engine, ran = _engine(_REFUSED, "never asked")
    events = await collect(engine, "save my notes")
    assert ran == []
    assert not [e for e in events if isinstance(e, ToolCallStarted)]
    finished = [e for e in events if isinstance(e, ToolCallFinished)]
    assert len(finished) == 2 and all(e.synthetic and e.result.is_error for e in finished)
    assert all("Not run" in e.result.text and "refusal" in e.result.text for e in finished)
    (said,) = [e for e in events if isinstance(e, AssistantMessage)]
    assert said.stop_reason == "refusal"
    end = events[-1]
    assert isinstance(end, TurnEnded) and end.reason == "completed"
    model = engine.model
    assert isinstance(model, ScriptedModel) and model.request_count == 1
    assert engine.messages[1].meta.get("stop_reason") == "refusal"
    assert [m.kind for m in engine.messages] == [None, None, "tool_results"]
    assert validate_transcript(engine.messages) == []


async def test_an_interjection_queued_at_a_refusal_is_still_answered() -> None:
    """As after any response without calls to run, a queued interjection keeps the turn going."""
    engine, ran = _engine(_REFUSED, "answered")
    async for event in engine.run("save my notes"):
        if isinstance(event, AssistantMessage) and event.stop_reason == "refusal":
            engine.interject("then just tell me")
    assert ran == []
    assert engine.messages[-1].text == "answered"
    assert validate_transcript(engine.messages) == []


@pytest.mark.parametrize("stop", ["tool_use", "max_tokens"])
async def test_whole_calls_under_other_stops_still_run(stop: str) -> None:
    engine, ran = _engine(
        ScriptedResponse(tool_calls=[ScriptedToolCall("write", {"path": "/tmp/a"})], stop_reason=stop), "done"
    )
    events = await collect(engine, "save")
    assert ran == [{"path": "/tmp/a"}]
    assert isinstance(events[-1], TurnEnded) and engine.messages[-1].text == "done"
