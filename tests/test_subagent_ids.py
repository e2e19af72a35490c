"""A nested subagent given the id of its parent (or of another ancestor)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from agentloop import (
    QueryEngine,
    ScriptedModel,
    ScriptedResponse,
    ScriptedToolCall,
    ToolCallFinished,
    ToolContext,
    tool,
)
from agentloop.sessions import JsonlSession
from tests.helpers import collect


@tool
async def nest(agent_id: str, ctx: ToolContext) -> Any:
    """Start a subagent with that id."""
    child = ctx.engine.subagent(agent_id=agent_id)
    return [e.type async for e in child.run("hi")][-1]


async def test_a_nested_subagent_given_its_parents_id_is_refused_up_front_naming_the_ids(tmp_path: Path) -> None:
    # With a session the grandchild opened its parent's sidechain file (nested subagents share one
    # folder) while the parent held it: SessionLockedError, from deep inside the grandchild's run.
    def answer(request: Any) -> ScriptedResponse:
        text = request.messages[0].content[0].text
        if text == "go" and len(request.messages) == 1:
            return ScriptedResponse(tool_calls=[ScriptedToolCall("nest", {"agent_id": "helper"})])
        if text == "hi" and len(request.messages) == 1:
            return ScriptedResponse(tool_calls=[ScriptedToolCall("nest", {"agent_id": "helper"})])
        return ScriptedResponse(text="done")

    with JsonlSession(tmp_path / "main.jsonl") as session:
        engine = QueryEngine(ScriptedModel([answer], cycle=True), tools=[nest], policies=[], session=session)
        child = engine.subagent(agent_id="helper")
        results = [e.result for e in await collect(child, "go") if isinstance(e, ToolCallFinished)]
    [result] = results
    assert result.is_error
    assert "'helper'" in result.text and "ancestor" in result.text and "SessionLocked" not in result.text


def test_subagent_refuses_the_id_of_any_ancestor_and_of_the_engine_itself() -> None:
    engine = QueryEngine(ScriptedModel(["x"]), policies=[])
    child = engine.subagent(agent_id="a")
    grandchild = child.subagent(agent_id="b")
    for taken in ("a", "b"):
        with pytest.raises(ValueError, match=rf"agent_id '{taken}'.*'a' > 'b'"):
            grandchild.subagent(agent_id=taken)
    assert grandchild.subagent(agent_id="c").agent_id == "c"
    assert child.subagent(agent_id="b").agent_id == "b"  # a sibling may reuse an id (one after another)
