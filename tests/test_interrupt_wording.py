"""The texts written for an interrupt say what interrupted: the user (Ctrl-C, send-now), the
run's deadline, the host that stopped reading the run, or the host's own reason."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from agentloop import (
    QueryEngine,
    ScriptedModel,
    ScriptedResponse,
    ScriptedToolCall,
    Texts,
    ToolCallStarted,
    tool,
)
from agentloop._inbox import told_for


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
        ("deadline", "Interrupted by user-set deadline (the run's deadline passed)"),
        ("consumer_closed", "Interrupted by user code (the application stopped reading the run)"),
    ],
)
async def test_an_interrupt_not_the_users_says_what_interrupted(reason: str, why: str) -> None:
    """A run stopped by its deadline, or by the host's code closing it, wrote "Interrupted by
    user" for its calls, which the user never did. The results still begin "Interrupted by
    user" (SPEC section 3), going on to say whose setting or code it was."""
    engine = await _interrupted(reason)
    texts = _texts(engine)
    assert texts[0] == why + ": this tool call was stopped while it was running; it may have had side effects."
    assert texts[1] == why + ": this tool call never started, so it had no effect."
    assert [m for m in engine.messages if m.kind == "interrupt_notice"] == []


async def test_a_deadline_of_the_engine_says_so() -> None:
    engine = _engine(deadline=0.05)
    async for _event in engine.run("go"):
        pass
    assert _texts(engine)[0].startswith("Interrupted by user-set deadline (the run's deadline passed): this tool call was stopped")


async def test_texts_of_the_hosts_own_are_kept_as_written() -> None:
    mine = Texts(never_started="Not run.", stopped_running="Stopped.")
    engine = await _interrupted("deadline", texts=mine)
    assert _texts(engine)[:2] == ["Stopped.", "Not run."]


@pytest.mark.parametrize(
    "text",
    [
        "Uninterrupted by user input; retry later.",
        "Sorry: this was interrupted by user request or a limit.",
        "Interrupted by username policy.",
        "interrupted by user (lower case): the host's own.",
    ],
)
@pytest.mark.parametrize("reason", ["deadline", "consumer_closed"])
def test_a_hosts_text_not_opening_with_interrupted_by_user_is_kept_whole(text: str, reason: str) -> None:
    # Only the stock opening, "Interrupted by user" as a whole at the start, goes on to say what
    # interrupted; the words elsewhere (or inside a longer word) were spliced into mid-sentence.
    assert told_for(text, reason) == text


_REASONS = ["cancel", "send_now", "escape", "deadline", "consumer_closed"]


@pytest.mark.parametrize("reason", _REASONS)
async def test_every_synthesized_result_begins_interrupted_by_user(reason: str) -> None:
    """SPEC section 3: a synthetic result's content begins "Interrupted by user", whatever stopped
    the run, and says what happened to the call."""
    engine = await _interrupted(reason)
    results = [r.text for m in engine.messages for r in m.tool_results]
    assert len(results) == 2 and all(r.startswith("Interrupted by user") for r in results), results
    assert "stopped while it was running" in results[0] and "never started" in results[1]


@given(reason=st.one_of(st.sampled_from(_REASONS), st.text(max_size=20)))
def test_every_interrupt_text_keeps_its_interrupted_by_user_opening(reason: str) -> None:
    for text in (Texts().never_started, Texts().stopped_running):
        told = told_for(text, reason)
        assert told.startswith("Interrupted by user") and told.endswith(text.split(":", 1)[1])
