"""Under a host's ``asyncio.eager_task_factory`` (Python 3.12+) a task takes its first step inside
``create_task``: the run's tool calls start before the tool phase has recorded them, and a run
handed to a task may be well under way (or over) when ``create_task`` returns."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator

import pytest

from agentloop import (
    QueryEngine,
    ScriptedModel,
    ScriptedResponse,
    ScriptedToolCall,
    ToolCallFinished,
    ToolContext,
    TurnEnded,
    tool,
    validate_transcript,
)

# Python 3.11 has no eager task factory: there the same outcomes are held under its ordinary
# tasks (what a host on 3.11 gets), so a change that only an eager start would expose is
# caught on 3.12 and later.
EAGER = getattr(asyncio, "eager_task_factory", None)


@pytest.fixture(autouse=True)
async def _eager() -> AsyncIterator[None]:
    loop = asyncio.get_running_loop()
    factory = loop.get_task_factory()
    if EAGER is not None:
        loop.set_task_factory(EAGER)
    yield
    loop.set_task_factory(factory)


def calls(*names: str) -> ScriptedResponse:
    return ScriptedResponse(tool_calls=[ScriptedToolCall(name, {}, id=f"c{i}") for i, name in enumerate(names)])


async def test_calls_whose_first_step_is_their_last_finish_in_order() -> None:
    @tool
    async def now() -> str:
        """Answers at once."""
        return "at once"

    @tool
    async def fails() -> str:
        """Fails at once."""
        raise RuntimeError("broken")

    engine = QueryEngine(ScriptedModel([calls("now", "fails", "now"), "done"]), tools=[now, fails], policies=[])
    events = [e async for e in engine.run("go")]
    finished = [e for e in events if isinstance(e, ToolCallFinished)]
    assert [e.tool_use.id for e in finished] == ["c0", "c1", "c2"]
    assert [e.result.is_error for e in finished] == [False, True, False]
    end = events[-1]
    assert isinstance(end, TurnEnded) and end.reason == "completed"
    assert validate_transcript(engine.messages) == []


async def test_an_interrupt_after_create_task_stops_a_run_already_in_its_tools() -> None:
    started = asyncio.Event()
    cancelled = asyncio.Event()

    @tool
    async def stubborn(ctx: ToolContext) -> str:
        """Waits, ignoring the signal, until cancelled."""
        started.set()
        try:
            await asyncio.Event().wait()
        finally:
            cancelled.set()
        return "never"

    engine = QueryEngine(
        ScriptedModel([calls("stubborn", "stubborn")]), tools=[stubborn], policies=[], tool_cancel_grace=0.0
    )

    async def pump() -> list[object]:
        return [e async for e in engine.run("go")]

    task = asyncio.create_task(pump())
    if EAGER is None:  # 3.11: the run and its calls start at the loop's next pass
        await started.wait()
    assert started.is_set() and not task.done()  # eager: its calls took their first step in create_task
    engine.interrupt("stop")
    events = await task
    end = events[-1]
    assert isinstance(end, TurnEnded) and (end.reason, end.abort_reason) == ("aborted_tools", "stop")
    assert cancelled.is_set() and not engine.running
    assert validate_transcript(engine.messages) == []
