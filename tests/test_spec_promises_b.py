"""SPEC.md §6-11 and API.md, each promise as stated, at its edges."""

from __future__ import annotations

from collections.abc import AsyncIterator, Sequence
from typing import Any

import pytest

from agentloop import (
    AbortSignal,
    DoomLoopDetected,
    Event,
    PolicyNudge,
    QueryEngine,
    Resampling,
    ScriptedModel,
    ScriptedResponse,
    ScriptedToolCall,
    ToolCallFinished,
    TurnEnded,
    tool,
    validate_transcript,
)
from agentloop.models import (
    ModelRequest,
    StreamEnd,
    StreamSignals,
    StreamText,
    StreamThinking,
    StreamUsage,
    Usage,
)
from agentloop.policies import ConservativeDoomLoopPolicy, IdenticalToolCallRun
from agentloop.testing import collect


def calls(*names: str, **inputs: Any) -> ScriptedResponse:
    return ScriptedResponse(tool_calls=[ScriptedToolCall(n, dict(inputs)) for n in names])


def ends(events: Sequence[Event]) -> list[TurnEnded]:
    return [e for e in events if isinstance(e, TurnEnded) and e.agent_id is None]


def results(events: Sequence[Event]) -> list[ToolCallFinished]:
    return [e for e in events if isinstance(e, ToolCallFinished) and e.agent_id is None]


@tool
async def step() -> str:
    """One step."""
    return "done"


# -- §8 --------------------------------------------------------------------------------------------


@pytest.mark.parametrize("needed", [1, 2, 3])
async def test_s8_max_turns_at_its_bound_completes_and_one_past_ends(needed: int) -> None:
    """A run that needs exactly ``max_turns`` requests completes; one that needs one more ends
    with ``max_turns`` after exactly ``max_turns`` requests, its transcript valid."""
    script = [calls("step")] * (needed - 1) + ["fine"]
    engine = QueryEngine(ScriptedModel(script), tools=[step], policies=[], max_turns=needed)
    events = await collect(engine.run("go"))
    assert [e.reason for e in ends(events)] == ["completed"]
    model = ScriptedModel([calls("step")] * (needed + 1) + ["fine"])
    engine = QueryEngine(model, tools=[step], policies=[], max_turns=needed)
    events = await collect(engine.run("go"))
    end = ends(events)
    assert [e.reason for e in end] == ["max_turns"]
    assert end[0].turns == needed
    assert validate_transcript(engine.messages) == []


async def test_s8_a_deadline_that_has_passed_ends_the_turn_before_the_next_request() -> None:
    """The deadline is wall clock: once it has passed, no further model request goes out, even when
    nothing in the run has waited on the event loop since (a model that streams without waiting,
    ``deadline=0``)."""
    model = ScriptedModel(["never sent"])
    engine = QueryEngine(model, policies=[], deadline=0)
    events = await collect(engine.run("go"))
    assert [(e.reason, e.abort_reason) for e in ends(events)] == [("deadline", "deadline")]
    assert model.requests == []
    assert validate_transcript(engine.messages) == []



# -- §11 -------------------------------------------------------------------------------------------


class RawModel:
    """Streams the given stream events for each request, then ends the response."""

    def __init__(self, *scripts: Sequence[object]) -> None:
        self.scripts = list(scripts)
        self.requests: list[ModelRequest] = []

    async def stream(self, request: ModelRequest, signal: AbortSignal) -> AsyncIterator[Any]:
        self.requests.append(request)
        for event in self.scripts.pop(0) if self.scripts else [StreamText(0, "ok")]:
            yield event
        yield StreamEnd("end_turn")


@pytest.mark.parametrize(
    "usage",
    [None, "12", Usage(-5, 3), Usage(5, "3"), Usage(True, 1), Usage(1, 1, None), Usage(1.5, 0)],  # type: ignore[arg-type]
)
async def test_s11_a_usage_report_that_is_no_count_of_tokens_is_a_malformed_stream(usage: object) -> None:
    """A model stream reporting usage that is no set of token counts ends the run with a terminal
    that says so (after the retries a malformed stream earns), never an exception out of run()."""
    model = RawModel(*[[StreamText(0, "a"), StreamUsage(usage)]] * 5)  # type: ignore[arg-type]
    engine = QueryEngine(model, policies=[], retry_budget=1, retry_base_delay=0)
    events = await collect(engine.run("go"))
    end = ends(events)
    assert [e.reason for e in end] == ["model_error"]
    assert end[0].error is not None and "usage" in end[0].error
    assert validate_transcript(engine.messages) == []
    engine = QueryEngine(RawModel([StreamText(0, "a"), StreamEnd("end_turn", usage)]), policies=[], retry_budget=0)  # type: ignore[arg-type]
    if usage is not None:
        events = await collect(engine.run("go"))
        assert [e.reason for e in ends(events)] == ["model_error"]
        assert validate_transcript(engine.messages) == []


# -- §6 --------------------------------------------------------------------------------------------


async def test_s6_the_replay_is_cut_to_8_kb_of_reasoning_and_4_kb_of_text_and_goes_with_the_retry_only() -> None:
    """A confident signal after 20 KB of reasoning and 10 KB of text: the retry's reminder replays
    at most 8 KB and 4 KB of them (their beginnings); the transcript keeps neither."""
    thinking = "".join(f"thought {i}; " for i in range(2000))  # ~25 KB, no repetition
    text = "".join(f"word{i} " for i in range(1500))  # ~10 KB
    looping = ScriptedResponse(
        events=[
            StreamThinking(0, thinking),
            StreamText(1, text),
            StreamSignals(("tail_repetition:32@thinking",)),
            StreamEnd("end_turn"),
        ]
    )
    model = ScriptedModel([looping, "Fixed it."])
    engine = QueryEngine(model, policies=[ConservativeDoomLoopPolicy()], retry_base_delay=0)
    events = await collect(engine.run("fix it"))
    assert [e.attempt for e in events if isinstance(e, Resampling)] == [1]
    reminder = model.requests[1].messages[-1]
    assert reminder.synthetic
    replayed_thinking = reminder.text.split("<previous_reasoning>\n", 1)[1].split("\n</previous_reasoning>", 1)[0]
    replayed_text = reminder.text.split("<previous_text>\n", 1)[1].split("\n</previous_text>", 1)[0]
    assert 8 * 1024 - 16 <= len(replayed_thinking.encode()) <= 8 * 1024 and thinking.startswith(replayed_thinking)
    assert 4 * 1024 - 16 <= len(replayed_text.encode()) <= 4 * 1024 and text.startswith(replayed_text)
    assert [m.text for m in engine.messages] == ["fix it", "Fixed it."]
    assert validate_transcript(engine.messages) == []


@pytest.mark.parametrize(("threshold", "confident"), [(1, True), (64, True), (65, False)])
async def test_s6_the_default_policy_cuts_at_max_threshold_and_only_warns_one_past(threshold: int, confident: bool) -> None:
    """With the default policies (``policies=None``), a server's thinking-channel tail repetition
    of period 64 is cut and resampled; one of 65 only warns, and its attempt is kept."""
    frame = ScriptedResponse(
        events=[StreamThinking(0, "hmm"), StreamSignals((f"tail_repetition:{threshold}@thinking",)), StreamText(1, "kept"), StreamEnd("end_turn")]
    )
    engine = QueryEngine(ScriptedModel([frame, "resampled"]), retry_base_delay=0)
    events = await collect(engine.run("go"))
    detected = [e for e in events if isinstance(e, DoomLoopDetected)]
    assert [(d.confident, d.action) for d in detected] == [(True, "resample")] if confident else [(False, "warn")]
    assert engine.messages[-1].text == ("resampled" if confident else "kept")
    assert [e.reason for e in ends(events)] == ["completed"]


@pytest.mark.parametrize("budget", [0, 1, 2, 3])
async def test_s6_the_doom_budget_bounds_the_resamples_and_the_attempt_after_it_is_accepted(budget: int) -> None:
    """Exactly ``doom_budget`` resamples, the transport retry budget untouched (0 here), then the
    detector disarms: the next attempt runs to its end and is the answer."""
    looping = ScriptedResponse(
        events=[StreamThinking(0, "hmm"), StreamSignals(("tail_repetition:8@thinking",)), StreamText(1, "loop"), StreamEnd("end_turn")]
    )
    model = ScriptedModel([looping] * (budget + 1) + ["never asked"])
    engine = QueryEngine(model, doom_budget=budget, retry_budget=0, retry_base_delay=0)
    events = await collect(engine.run("go"))
    assert len([e for e in events if isinstance(e, Resampling)]) == budget
    assert [d.action for d in events if isinstance(d, DoomLoopDetected)] == ["resample"] * budget + ["disarmed"]
    assert len(model.requests) == budget + 1
    assert engine.messages[-1].text == "loop" and [e.reason for e in ends(events)] == ["completed"]
    assert validate_transcript(engine.messages) == []


# -- §7 --------------------------------------------------------------------------------------------


@tool
async def read_file(path: str) -> str:
    """Read a file."""
    return "same content"


@tool(stationarity="tight")
async def todo(items: list[str]) -> str:
    """Write the todo list."""
    return "ok"


@tool
async def shell(cmd: str) -> str:
    """Run a shell command."""
    return ""


@pytest.mark.parametrize(
    ("response", "tools", "nudge_at", "end_at"),
    [
        (calls("read_file", path="a.py"), [read_file], 8, 12),
        (calls("todo", items=["x"]), [todo], 4, 8),
        (calls("shell", cmd="true"), [shell], None, 4),
        (calls("shell", cmd=":"), [shell], None, 4),
    ],
)
@pytest.mark.parametrize("offset", [-1, 0])
async def test_s7_each_threshold_at_its_bound_and_one_before(
    response: ScriptedResponse, tools: list[Any], nudge_at: int | None, end_at: int, offset: int
) -> None:
    """``n`` identical responses, then an answer: the nudge comes with the ``nudge_at``-th, and
    the turn ends quietly with ``stationarity_ended`` at the ``end_at``-th, not one before."""
    n = end_at + offset
    engine = QueryEngine(ScriptedModel([response] * n + ["done"]), tools=tools, policies=[IdenticalToolCallRun()])
    events = await collect(engine.run("go"))
    nudges = [e for e in events if isinstance(e, PolicyNudge)]
    end = ends(events)
    if offset == 0:
        assert [(e.reason, e.turns) for e in end] == [("stationarity_ended", end_at)]
    else:
        assert [(e.reason, e.turns) for e in end] == [("completed", n + 1)]
    assert len(nudges) == (0 if nudge_at is None or n < nudge_at else 1)
    if nudges:  # the reminder goes with the request after the nudge_at-th response
        nudged = next(i for i, m in enumerate(engine.messages) if m.kind == "nudge")
        assert sum(1 for m in engine.messages[:nudged] if m.role == "assistant") == nudge_at
    assert validate_transcript(engine.messages) == []
