"""Promises of docs/design.md, docs/index.md and README.md that no other test pins."""

from __future__ import annotations

from collections.abc import Sequence

import pytest

from agentloop import (
    Event,
    ModelError,
    QueryEngine,
    ScriptedModel,
    ScriptedResponse,
    ScriptedToolCall,
    ToolCallFinished,
    TurnEnded,
    tool,
    validate_transcript,
)
from agentloop.testing import collect


@tool
async def step() -> str:
    """One step."""
    return "done"


def ends(events: Sequence[Event]) -> list[TurnEnded]:
    return [e for e in events if isinstance(e, TurnEnded) and e.agent_id is None]


# -- design.md, Priorities: nothing is lost silently ---------------------------------------------


@pytest.mark.parametrize("retryable", [False, True])
async def test_the_calls_of_a_response_that_failed_for_good_are_answered_as_not_run_by_the_failure(
    retryable: bool,
) -> None:
    """design.md, Priorities 3: "synthesized results say what happened to each call". A response
    whose stream fails after a call's input was complete keeps the call; its result says the
    failure left it unrun, not that the user interrupted it (nobody did)."""
    failing = ScriptedResponse(
        text="Let me look.",
        tool_calls=[ScriptedToolCall("step", {})],
        error=ModelError("upstream overloaded", retryable=retryable),
        error_after=5,  # the text, its stop, the call's start, input and stop: then the error
    )
    engine = QueryEngine(ScriptedModel([failing] * 2), tools=[step], policies=[], retry_budget=1 if retryable else 0)
    events = await collect(engine.run("go"))
    (end,) = ends(events)
    assert end.reason == "model_error" and end.abort_reason is None
    assert end.error is not None and "upstream overloaded" in end.error
    call, answer = engine.messages[-2:]
    assert call.role == "assistant" and call.partial and [b.type for b in call.content] == ["text", "tool_use"]
    (result,) = answer.tool_results
    assert result.is_error and result.tool_use_id == call.content[1].id  # type: ignore[union-attr]
    assert "Interrupted by user" not in result.text
    assert result.text.startswith("Not run:") and "upstream overloaded" in result.text
    finished = [e for e in events if isinstance(e, ToolCallFinished)]
    assert [(e.synthetic, e.result.text) for e in finished] == [(True, result.text)]
    assert validate_transcript(engine.messages) == []
