"""Stationarity counts around an interjection merged after a tool batch (SPEC §5, §7)."""

from __future__ import annotations

from agentloop import (
    QueryEngine,
    ScriptedModel,
    ScriptedResponse,
    ScriptedToolCall,
    ToolContext,
    TurnEnded,
    tool,
)
from agentloop.policies import IdenticalToolCallRun
from tests.helpers import collect


def _looping_engine(interject_at: int, end_at: int) -> tuple[QueryEngine, list[int]]:
    ran: list[int] = []

    @tool
    async def poll(ctx: ToolContext) -> str:
        """Poll."""
        ran.append(len(ran) + 1)
        if len(ran) == interject_at:  # the person writes while this call runs
            ctx.engine.interject("any news?")
        return "nothing yet"

    model = ScriptedModel([ScriptedResponse(tool_calls=[ScriptedToolCall("poll", {})])], cycle=True)
    policy = IdenticalToolCallRun(nudge_at=None, end_at=end_at, tight_nudge_at=None, tight_end_at=None)
    return QueryEngine(model, tools=[poll], policies=[policy], max_turns=50), ran


async def test_a_batch_that_ran_before_an_interjection_is_not_counted_after_it() -> None:
    # The interjection merged after the 2nd batch reset the counts before that batch was judged:
    # it counted as the first repetition of the new run, which then ended one response early.
    # The person's message resets the counts; what the model does after reading it counts.
    engine, ran = _looping_engine(interject_at=2, end_at=3)
    events = await collect(engine, "watch the build")
    end = [e for e in events if isinstance(e, TurnEnded)][-1]
    assert end.reason == "stationarity_ended" and "3 times" in (end.detail or "")
    assert len(ran) == 2 + 3  # two before the message, three identical after it


async def test_a_run_that_reaches_its_end_before_the_interjection_is_read_still_ends() -> None:
    # The 3rd identical call ran before the model saw the message: the run is judged as it was;
    # the message, not merged into a turn that ends, is reported dropped (as with a limit).
    engine, ran = _looping_engine(interject_at=3, end_at=3)
    events = await collect(engine, "watch the build")
    end = [e for e in events if isinstance(e, TurnEnded)][-1]
    assert end.reason == "stationarity_ended" and len(ran) == 3
    dropped = [e for e in events if e.type == "interjection_dropped"]
    assert [d.texts for d in dropped] == [("any news?",)]
    assert not [e for e in events if e.type == "interjection_injected"]
