"""Policies as a host writes and uses them: signal parsing at its edges, one policy list
given to several engines, and a host policy whose stream hook is broken."""

from __future__ import annotations

import logging
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from agentloop import QueryEngine, ScriptedModel, ScriptedResponse, ScriptedToolCall, TurnEnded, tool
from agentloop._model import StreamEvent
from agentloop.policies import DoomLoopSignal, IdenticalToolCallRun, Policy, Verdict, default_policies
from tests.helpers import collect

# -- DoomLoopSignal.parse at its edges ---------------------------------------------------------


@pytest.mark.parametrize(
    "text",
    [
        "tail_repetition:\u0663\u0662@thinking",  # Arabic-Indic digits: 32 to int(), not to a server
        "tail_repetition:\uff13@text",  # a fullwidth 3
        "exact_repetition:\u0664x3@text",
        "tail_repetition:32@think\u0131ng",  # a dotless i: not the thinking channel, nor any other
        "low_logprob@思考",
    ],
)
def test_parse_takes_only_ascii_digits_and_channel_names(text: str) -> None:
    with pytest.raises(ValueError, match="not a doom-loop signal"):
        DoomLoopSignal.parse(text)


@pytest.mark.parametrize(
    "text", ["tail_repetition:0@thinking", "exact_repetition:0x3@text", "exact_repetition:12x0@text"]
)
def test_parse_rejects_a_zero_period_length_or_count(text: str) -> None:
    # A period of 0 is no repetition: the stock policy would otherwise cut the stream on it.
    with pytest.raises(ValueError, match="not a doom-loop signal"):
        DoomLoopSignal.parse(text)


def test_parse_of_an_endless_number_names_the_text() -> None:
    text = "tail_repetition:" + "9" * 5000 + "@thinking"
    with pytest.raises(ValueError, match="not a doom-loop signal"):
        DoomLoopSignal.parse(text)


@pytest.mark.parametrize("value", [None, 32, b"low_logprob@text", ["low_logprob@text"]])
def test_parse_of_what_is_not_a_str_is_a_type_error(value: Any) -> None:
    with pytest.raises(TypeError, match=r"DoomLoopSignal\.parse takes a str"):
        DoomLoopSignal.parse(value)


_pieces = st.sampled_from(
    ["tail_repetition", "low_logprob", "exact_repetition", ":", "@", "x", "X", "0", "7", "12", "\u0663",
     "thinking", "text", " ", "\n", "_", "\u0131", "-1", "@text"]
)


@given(st.lists(_pieces, max_size=8).map("".join) | st.text(max_size=40))
def test_parse_either_refuses_or_round_trips(text: str) -> None:
    try:
        sig = DoomLoopSignal.parse(text)
    except ValueError:
        return
    assert sig.channel.isascii() and sig.channel
    assert all(n is None or n >= 1 for n in (sig.threshold, sig.tokens, sig.copies))
    assert DoomLoopSignal.parse(sig.format()) == sig


@given(st.sampled_from(["thinking", "text"]), st.integers(1, 10**9), st.booleans())
def test_threshold_less_tail_and_stopped_round_trip(channel: str, period: int, bare: bool) -> None:
    sig = DoomLoopSignal("tail_repetition", channel, threshold=None if bare else period)
    assert DoomLoopSignal.parse(sig.format()) == sig


@pytest.mark.parametrize(
    ("kwargs", "match"),
    [
        ({"kind": "exact_repetition", "channel": "text"}, "tokens and copies"),
        ({"kind": "exact_repetition", "channel": "text", "tokens": 4, "copies": 0}, "copies"),
        ({"kind": "tail_repetition", "channel": "thinking", "threshold": -3}, "threshold"),
        ({"kind": "tail_repetition", "channel": "a@b", "threshold": 3}, "channel"),
        ({"kind": "tail_repetition", "channel": "", "threshold": 3}, "channel"),
        ({"kind": "loop", "channel": "text"}, "kind"),
        ({"kind": "tail_repetition", "channel": "text", "threshold": True}, "threshold"),
    ],
)
def test_a_signal_that_has_no_wire_form_is_refused_when_made(kwargs: dict[str, Any], match: str) -> None:
    # A host's own detector builds signals; one format() would write as junk is a clear error.
    with pytest.raises((TypeError, ValueError), match=match):
        DoomLoopSignal(**kwargs)


# -- one policy list given to several engines ----------------------------------------------------


@tool(stationarity="tight")
async def read(path: str) -> str:
    """Read a file."""
    return "contents"


@tool
async def lookup(path: str) -> str:
    """Look a path up."""
    return "found"


def _same_call_forever(name: str) -> ScriptedModel:
    return ScriptedModel([ScriptedResponse(tool_calls=[ScriptedToolCall(name, {"path": "a"})])], cycle=True)


async def test_a_policy_list_shared_by_engines_judges_each_run_by_its_own_engines_tools() -> None:
    shared = default_policies()
    reader = QueryEngine(_same_call_forever("read"), tools=[read], policies=shared)
    QueryEngine(_same_call_forever("lookup"), tools=[lookup], policies=shared)  # made later, other tools
    end = (await collect(reader, "go"))[-1]
    assert isinstance(end, TurnEnded)
    # `read` is tight in the engine that runs it: stopped at 8, not at the normal class's 12.
    assert (end.reason, end.turns) == ("stationarity_ended", 8)


async def test_a_rebind_at_run_start_that_raises_is_logged_and_the_run_goes_on(
    caplog: pytest.LogCaptureFixture,
) -> None:
    class Picky(IdenticalToolCallRun):
        binds = 0

        def bind(self, tools: Any) -> None:
            self.binds += 1
            if self.binds == 3:  # the rebind at the start of the first engine's run
                raise RuntimeError("picky")
            super().bind(tools)

    shared: list[Policy] = [Picky()]
    first = QueryEngine(ScriptedModel(["hi"]), tools=[read], policies=shared)
    QueryEngine(ScriptedModel(["hello"]), tools=[lookup], policies=shared)
    with caplog.at_level(logging.ERROR, logger="agentloop"):
        end = (await collect(first, "go"))[-1]
    assert isinstance(end, TurnEnded) and end.reason == "completed"
    assert "Picky.bind raised" in caplog.text


# -- a host policy whose stream hook is broken -----------------------------------------------------


class BrokenWatcher(Policy):
    def on_stream(self, event: StreamEvent) -> Verdict | None:
        raise RuntimeError("watcher bug")


@pytest.mark.parametrize("alone", [True, False])
async def test_a_raising_stream_hook_is_logged_once_per_attempt_not_per_delta(
    alone: bool, caplog: pytest.LogCaptureFixture
) -> None:
    model = ScriptedModel([ScriptedResponse(text="word " * 200, chunk=4), "fine"])
    policies: list[Policy] = [BrokenWatcher()] if alone else [BrokenWatcher(), *default_policies()]
    engine = QueryEngine(model, policies=policies)
    with caplog.at_level(logging.ERROR, logger="agentloop"):
        end = (await collect(engine, "go"))[-1]
        end2 = (await collect(engine, "again"))[-1]
    assert isinstance(end, TurnEnded) and end.reason == "completed"
    assert isinstance(end2, TurnEnded) and end2.reason == "completed"
    logged = [r for r in caplog.records if "BrokenWatcher.on_stream raised" in r.getMessage()]
    assert len(logged) == 2  # one per attempt (two runs), not one per event (some 250)
    assert logged[0].exc_info is not None  # the first one keeps its traceback


# -- subagents of an engine whose policy holds what a deep copy cannot take -------------------------


class Metrics(Policy):
    """Counts results into a host's metrics object (here: a lock and a number)."""

    def __init__(self) -> None:
        import threading

        self.lock = threading.Lock()
        self.results = 0


def test_a_policy_a_deep_copy_cannot_take_names_itself_and_the_fix_when_forked() -> None:
    engine = QueryEngine(ScriptedModel(["hi"]), policies=[Metrics()])
    with pytest.raises(TypeError, match=r"Metrics\.fork\(\).*cannot pickle") as info:
        engine.subagent(agent_id="child")
    assert "override fork()" in str(info.value)


def test_a_policy_with_its_own_fork_serves_subagents() -> None:
    class SharedMetrics(Metrics):
        def fork(self) -> Policy:
            return self  # one object on purpose: it counts the whole tree

    policy = SharedMetrics()
    child = QueryEngine(ScriptedModel(["hi"]), policies=[policy]).subagent(agent_id="child")
    assert child.policies == [policy]
