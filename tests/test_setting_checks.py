"""The checks of the counts and numbers of seconds a class or function is given when it is made:
what the engine takes (None where it means "no limit", any `numbers.Integral`) is taken there too."""

from __future__ import annotations

import numbers
from pathlib import Path
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from agentloop import (
    DoomLoopSignal,
    ModelError,
    QueryEngine,
    ScriptedModel,
    ScriptedResponse,
    ScriptedToolCall,
    TextDelta,
    Tool,
    delegate_tool,
    event_json,
    tool,
)
from agentloop.models import SSEDecoder
from agentloop.policies import RepetitionDetector
from agentloop.sessions import JsonlSession
from agentloop.testing import collect, turn_ended


class Whole:
    """A whole number that is no int, as numpy's ``int64`` is not: an `numbers.Integral` only by
    registration."""

    def __init__(self, n: int) -> None:
        self.n = n

    def __int__(self) -> int:
        return self.n

    def __index__(self) -> int:
        return self.n

    def __float__(self) -> float:
        return float(self.n)

    def __repr__(self) -> str:
        return f"Whole({self.n})"


numbers.Integral.register(Whole)


def test_delegate_tool_takes_no_limit_on_turns_as_the_engine_does() -> None:
    """``max_turns=None`` is the engine's "no limit": a delegate tool made with it worked before
    its settings were checked, and works again."""
    assert delegate_tool(max_turns=None).name == "task"


async def test_delegate_tool_takes_any_whole_number_the_engine_takes() -> None:
    model = ScriptedModel(
        [
            ScriptedResponse(tool_calls=[ScriptedToolCall("task", {"task": "count"})]),
            "the child's answer",
            "done",
        ]
    )
    delegate = delegate_tool(max_turns=Whole(2), max_depth=Whole(1))  # type: ignore[arg-type]
    engine = QueryEngine(model, tools=[delegate], policies=[])
    events = await collect(engine.run("go"))
    assert turn_ended(events).reason == "completed"
    results = [b for m in engine.messages for b in m.content if getattr(b, "type", "") == "tool_result"]
    assert [r.is_error for r in results] == [False]
    assert "the child's answer" in results[0].text


def test_delegate_tool_still_refuses_what_is_no_count_of_turns() -> None:
    for bad, error in (("10", TypeError), (1.5, TypeError), (True, TypeError), (-1, ValueError)):
        with pytest.raises(error, match="max_turns"):
            delegate_tool(max_turns=bad)  # type: ignore[arg-type]


async def test_a_prefix_with_a_slash_works_without_a_session_and_says_why_not_under_a_jsonl_session(tmp_path: Path) -> None:
    """``agent_prefix="team/sub"`` names the children without a session (as it always did); under
    a `JsonlSession`, which names each subagent's file after its id, each call's result says so."""
    script = [ScriptedResponse(tool_calls=[ScriptedToolCall("task", {"task": "x"})]), "child", "done"]
    engine = QueryEngine(ScriptedModel(script), tools=[delegate_tool(agent_prefix="team/sub")], policies=[])
    events = await collect(engine.run("go"))
    assert turn_ended(events).reason == "completed"
    assert [r.content for r in engine.messages[2].content] == ["child"]  # type: ignore[union-attr]
    session = JsonlSession(tmp_path / "s.jsonl")
    engine = QueryEngine(ScriptedModel(script), tools=[delegate_tool(agent_prefix="team/sub")], policies=[], session=session)
    assert turn_ended(await collect(engine.run("go"))).reason == "completed"
    session.close()
    result = engine.messages[2].content[0]
    assert result.is_error and "'team/sub-1' cannot be used as a file name" in str(result.content)  # type: ignore[union-attr]


async def test_a_delegated_call_under_a_session_uses_the_prefix_it_was_made_with(tmp_path: Path) -> None:
    model = ScriptedModel([ScriptedResponse(tool_calls=[ScriptedToolCall("task", {"task": "x"})]), "child", "done"])
    session = JsonlSession(tmp_path / "s.jsonl")
    engine = QueryEngine(model, tools=[delegate_tool(agent_prefix="..")], policies=[], session=session)
    assert turn_ended(await collect(engine.run("go"))).reason == "completed"
    session.close()
    assert (session.sidechain_dir / "..-1.jsonl").is_file()


def test_jsonl_session_takes_a_whole_float_as_its_count_of_appends(tmp_path: Path) -> None:
    """``fsync_every=2.0`` (a number read from a config file) worked before it was checked."""
    session = JsonlSession(tmp_path / "s.jsonl", fsync_every=2.0)  # type: ignore[arg-type]
    assert session.fsync_every == 2
    assert type(session.fsync_every) is int
    assert JsonlSession(tmp_path / "s.jsonl", fsync_every=Whole(3)).fsync_every == 3  # type: ignore[arg-type]
    for bad, error in ((2.5, TypeError), (float("nan"), TypeError), (float("inf"), TypeError), (0.0, ValueError)):
        with pytest.raises(error, match="fsync_every"):
            JsonlSession(tmp_path / "s.jsonl", fsync_every=bad)  # type: ignore[arg-type]


@pytest.mark.parametrize(
    "make",
    [
        lambda n: RepetitionDetector(step=n),
        lambda n: RepetitionDetector(window=Whole(4096), anchor=n),
        lambda n: SSEDecoder(max_event_bytes=n),
        lambda n: JsonlSession("s.jsonl", fsync_every=n),
        lambda n: ScriptedResponse(text="abc", chunk=n),
        lambda n: ScriptedResponse(text="abc", error_after=n),
        lambda n: delegate_tool(max_depth=n),
        lambda n: QueryEngine(ScriptedModel([]), policies=[], max_tool_result_chars=n),
        lambda n: event_json(TextDelta(text="abc"), max_text_chars=n),
        lambda n: DoomLoopSignal("tail_repetition", "text", threshold=n),
    ],
)
def test_a_whole_number_that_is_no_int_is_taken_where_a_count_is(make: Any) -> None:
    """A count is any `numbers.Integral` but a bool, as for the engine's own settings."""
    make(Whole(8))
    with pytest.raises(TypeError):
        make(True)


async def test_a_scripted_response_plays_in_chunks_of_a_whole_number_that_is_no_int() -> None:
    model = ScriptedModel([ScriptedResponse(text="abcde", chunk=Whole(2))])  # type: ignore[arg-type]
    events = await collect(QueryEngine(model, policies=[]).run("go"))
    assert [e.text for e in events if isinstance(e, TextDelta)] == ["ab", "cd", "e"]


def test_scripted_response_says_a_whole_number_is_meant() -> None:
    for field, value in (("chunk", 1.5), ("error_after", "2")):
        with pytest.raises(TypeError, match=f"{field} takes a whole number"):
            ScriptedResponse(text="abc", **{field: value})


def test_an_error_after_with_no_error_is_not_counted() -> None:
    """The ValueError for an ``error_after`` past the events holds when an ``error`` is given:
    without one ``error_after`` does nothing, and is not checked against the events."""
    assert ScriptedResponse(text="abc", error_after=99).error_after == 99
    with pytest.raises(ValueError, match="error_after"):
        ScriptedResponse(text="abc", error_after=-1)


def test_a_tool_s_stationarity_of_none_is_refused_naming_the_words_it_takes() -> None:
    async def fine(x: int) -> int:
        return x

    with pytest.raises(ValueError, match='"normal" or "tight"'):
        Tool("t", "", {"type": "object"}, fine, stationarity=None)  # type: ignore[arg-type]
    with pytest.raises(ValueError, match='"normal" or "tight"'):
        tool(stationarity=None)(fine)  # type: ignore[call-overload]


@given(
    st.text(max_size=40),
    st.text(max_size=40),
    st.lists(st.dictionaries(st.text(max_size=5), st.integers(), max_size=3), max_size=3),
    st.integers(1, 50),
    st.booleans(),
)
def test_the_events_a_scripted_error_may_come_after_are_those_the_response_streams(
    thinking: str, text: str, inputs: list[dict[str, int]], chunk: int, sign: bool
) -> None:
    """``error_after`` takes 0 to the number of events the response streams, counted without
    making them."""
    calls = [ScriptedToolCall("t", args) for args in inputs]
    fields = {"thinking": thinking, "text": text, "tool_calls": calls, "chunk": chunk, "sign_thinking": sign}
    streamed = len(ScriptedResponse(**fields).stream_events(lambda: "id"))
    assert ScriptedResponse(**fields, error=ModelError("boom"), error_after=streamed).error_after == streamed
    with pytest.raises(ValueError, match="error_after"):
        ScriptedResponse(**fields, error=ModelError("boom"), error_after=streamed + 1)


def test_the_policies_counts_take_a_whole_number_that_is_no_int() -> None:
    """numpy's ``int64`` is a count for the engine; the policies refused it (``int`` only)."""
    from agentloop.policies import ConservativeDoomLoopPolicy, IdenticalToolCallRun, ToolCallCycle

    assert IdenticalToolCallRun(nudge_at=Whole(3), end_at=Whole(6)).end_at == 6  # type: ignore[arg-type]
    assert ToolCallCycle(max_period=Whole(3)).max_period == 3  # type: ignore[arg-type]
    assert ConservativeDoomLoopPolicy(max_threshold=Whole(64)).max_threshold == 64  # type: ignore[arg-type]
    with pytest.raises(TypeError, match="nudge_at takes a whole number"):
        IdenticalToolCallRun(nudge_at=2.0)  # type: ignore[arg-type]


def test_a_whole_number_that_is_no_int_is_kept_as_an_int_and_a_delay_takes_any_real_number() -> None:
    """What a check takes is what the options hold: an int, not the host's integral type (the
    cut of a result compares and slices with it); a scripted delay takes any real number of
    seconds (a Fraction too) and refuses what the other numbers of seconds refuse."""
    from fractions import Fraction

    engine = QueryEngine(ScriptedModel(["ok"]), max_tool_result_chars=Whole(100))  # type: ignore[arg-type]
    assert type(engine.max_tool_result_chars) is int and engine.max_tool_result_chars == 100
    assert ScriptedResponse("x", delay=Fraction(1, 2)).delay == Fraction(1, 2)  # type: ignore[arg-type]
    for bad, error in (("1", TypeError), (True, TypeError), (-1, ValueError), (float("nan"), ValueError), (10**400, ValueError)):
        with pytest.raises(error, match="ScriptedResponse delay"):
            ScriptedResponse("x", delay=bad)


async def test_a_scripted_response_given_generators_plays_them_every_time() -> None:
    """``events`` and ``tool_calls`` given as generators are read once when the response is made
    (the check reads them) and played whole, on each replay too."""
    from agentloop.models import StreamEnd, StreamText

    response = ScriptedResponse(events=(e for e in [StreamText(0, "hi"), StreamEnd("end_turn")]))
    engine = QueryEngine(ScriptedModel([response, response]), policies=[])
    for _ in range(2):
        end = turn_ended(await collect(engine.run("go")))
        assert end.reason == "completed" and engine.messages[-1].text == "hi"
    calls = ScriptedResponse(tool_calls=(ScriptedToolCall("missing", {}) for _ in range(2)))
    assert len(calls.tool_calls) == 2


@pytest.mark.parametrize(
    "make",
    [
        lambda: ScriptedResponse("x", stop_reason=5),
        lambda: ScriptedResponse(tool_calls=[ScriptedToolCall(5)]),  # type: ignore[arg-type]
        lambda: ScriptedResponse(tool_calls=[ScriptedToolCall("a", id=5)]),  # type: ignore[arg-type]
    ],
)
def test_a_scripted_field_of_the_wrong_type_is_refused_when_made(make: Any) -> None:
    """As the docstring says: a stop_reason, a call's name or id of another type could only fail
    when played, blamed on the model."""
    with pytest.raises(TypeError, match=r"stop_reason|ScriptedToolCall"):
        make()
