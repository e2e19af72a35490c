"""The texts written for an interrupt say what interrupted: the user (Ctrl-C, send-now), the
run's deadline, the host that stopped reading the run, or the host's own reason."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest

from agentloop import (
    QueryEngine,
    ScriptedModel,
    ScriptedResponse,
    ScriptedToolCall,
    Texts,
    ToolCallStarted,
    tool,
)


@tool
async def wait_forever() -> str:
    """Wait until stopped."""
    await asyncio.Event().wait()
    return "never"


@tool
async def quick() -> str:
    """Answer at once."""
    return "ok"


def _engine(**kw: Any) -> QueryEngine:
    calls = [ScriptedToolCall("wait_forever", {}), ScriptedToolCall("quick", {})]
    return QueryEngine(
        ScriptedModel([ScriptedResponse(tool_calls=calls), "done"]),
        tools=[wait_forever, quick], policies=[], max_parallel_tools=1, tool_cancel_grace=0, **kw,
    )  # fmt: skip


async def _interrupted(reason: str, **kw: Any) -> QueryEngine:
    """A run stopped for ``reason`` while its first call runs and its second waits."""
    engine = _engine(**kw)
    run = engine.run("go")
    async for event in run:
        if isinstance(event, ToolCallStarted):
            break
    if reason == "consumer_closed":
        await run.aclose()
    else:
        engine.interrupt(reason)
        async for _event in run:
            pass
    return engine


def _texts(engine: QueryEngine) -> list[str]:
    return [b.text for m in engine.messages[2:] for b in m.content if hasattr(b, "text")]


@pytest.mark.parametrize("reason", ["cancel", "send_now", "escape"])
async def test_the_users_interrupt_reads_interrupted_by_user(reason: str) -> None:
    """Ctrl-C, send-now, and a host's own reason (treated like "cancel", SPEC section 4)."""
    engine = await _interrupted(reason)
    texts = _texts(engine)
    assert texts[:2] == [Texts().stopped_running, Texts().never_started]
    assert all(t.startswith("Interrupted by user") for t in texts[:2])
    notices = [m.text for m in engine.messages if m.kind == "interrupt_notice"]
    assert notices == ([] if reason == "send_now" else ["[Request interrupted by user]"])


@pytest.mark.parametrize(
    ("reason", "why"),
    [
        ("deadline", "Interrupted because the run's deadline passed"),
        ("consumer_closed", "Interrupted because the application stopped reading the run"),
    ],
)
async def test_an_interrupt_not_the_users_says_what_interrupted(reason: str, why: str) -> None:
    """A run stopped by its deadline, or by the host's code closing it, wrote "Interrupted by
    user" for its calls, which the user never did."""
    engine = await _interrupted(reason)
    texts = _texts(engine)
    assert texts[0] == why + ": this tool call was stopped while it was running; it may have had side effects."
    assert texts[1] == why + ": this tool call never started, so it had no effect."
    assert [m for m in engine.messages if m.kind == "interrupt_notice"] == []


async def test_a_deadline_of_the_engine_says_so() -> None:
    engine = _engine(deadline=0.05)
    async for _event in engine.run("go"):
        pass
    assert _texts(engine)[0].startswith("Interrupted because the run's deadline passed: this tool call was stopped")


async def test_texts_of_the_hosts_own_are_kept_as_written() -> None:
    mine = Texts(never_started="Not run.", stopped_running="Stopped.")
    engine = await _interrupted("deadline", texts=mine)
    assert _texts(engine)[:2] == ["Stopped.", "Not run."]
