"""Stock policies (SPEC §6-7), driven through the Policy hooks the engine calls."""

from __future__ import annotations

import itertools
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from agentloop._detector import RepetitionDetector
from agentloop._messages import Message, TextBlock, ToolResultBlock, ToolUseBlock
from agentloop._model import StreamLogprobs, StreamSignals, StreamText, StreamThinking, StreamUsage, Usage
from agentloop.policies import (
    ConservativeDoomLoopPolicy,
    DoomLoopPolicy,
    DoomLoopSignal,
    EndTurn,
    IdenticalToolCallRun,
    Judgement,
    Nudge,
    Policy,
    RepeatedErrorResult,
    Resample,
    StationarityPolicy,
    ToolCallCycle,
    Verdict,
    Warn,
    canonical_key,
    default_policies,
    is_keepalive,
)

_ids = itertools.count()


def call(name: str, **args: Any) -> ToolUseBlock:
    return ToolUseBlock(id=f"t{next(_ids)}", name=name, input=args)


def step(
    policy: Policy, *calls: ToolUseBlock, result: str = "ok", error: bool = False, thought: str = ""
) -> Verdict | None:
    """One accepted response and its results, as the engine reports them."""
    content: list[Any] = [TextBlock(text=thought)] if thought else []
    msg = Message(role="assistant", content=[*content, *calls])
    assert policy.on_response(msg) is None
    results = [ToolResultBlock(tool_use_id=c.id, content=result, is_error=error) for c in calls]
    return policy.on_results(msg, results)


def run(policy: Policy, n: int, *calls: ToolUseBlock, **kw: Any) -> list[Verdict | None]:
    return [step(policy, *calls, **kw) for _ in range(n)]


def first(verdicts: list[Verdict | None], kind: type) -> int | None:
    """1-based index of the first verdict of ``kind``."""
    return next((i + 1 for i, v in enumerate(verdicts) if isinstance(v, kind)), None)


class Spec:
    def __init__(self, name: str, stationarity: str = "normal", poller: bool = False) -> None:
        self.name, self.stationarity, self.poller = name, stationarity, poller
        self.description: str = ""
        self.input_schema: dict[str, Any] = {}


# -- SPEC §6: doom-loop judgement ---------------------------------------------------------------


def test_conservative_thinking_tail_repetition_within_max_threshold_is_confident() -> None:
    pol = ConservativeDoomLoopPolicy()
    pol.begin_attempt()
    v = pol.on_stream(StreamSignals(("tail_repetition:64@thinking",)))
    assert isinstance(v, Resample)
    assert v.signals == (DoomLoopSignal.parse("tail_repetition:64@thinking"),)


@pytest.mark.parametrize(
    "raw",
    [
        "tail_repetition:65@thinking",
        "tail_repetition:8@text",
        "low_logprob@thinking",
        "exact_repetition:40x3@thinking",
    ],
)
def test_conservative_everything_else_only_warns(raw: str) -> None:
    pol = ConservativeDoomLoopPolicy()
    pol.begin_attempt()
    assert pol.on_stream(StreamSignals((raw,))) == Warn((DoomLoopSignal.parse(raw),))


def test_conservative_max_threshold_is_configurable() -> None:
    pol = ConservativeDoomLoopPolicy(max_threshold=16)
    pol.begin_attempt()
    assert pol.on_stream(StreamSignals(("tail_repetition:32@thinking",))) == Warn((DoomLoopSignal.parse("tail_repetition:32@thinking"),))
    assert pol.on_stream(StreamSignals(("tail_repetition:16@thinking",))) == Resample((DoomLoopSignal.parse("tail_repetition:16@thinking"),))


def test_server_frames_repeat_signals_so_far_and_are_deduplicated() -> None:
    pol = ConservativeDoomLoopPolicy()
    pol.begin_attempt()
    assert isinstance(pol.on_stream(StreamSignals(("low_logprob@text",))), Warn)
    v = pol.on_stream(StreamSignals(("low_logprob@text", "tail_repetition:32@thinking")))
    assert v == Resample((DoomLoopSignal.parse("tail_repetition:32@thinking"),))
    assert pol.on_stream(StreamSignals(("low_logprob@text", "tail_repetition:32@thinking"))) is None


def test_malformed_server_signal_is_ignored_not_raised() -> None:
    pol = ConservativeDoomLoopPolicy()
    assert pol.on_stream(StreamSignals(("nonsense", "tail_repetition:x@thinking"))) is None


def test_begin_attempt_resets_stream_state() -> None:
    pol = ConservativeDoomLoopPolicy()
    cut = Resample((DoomLoopSignal.parse("tail_repetition:8@thinking"),))
    pol.begin_attempt()
    assert pol.on_stream(StreamSignals(("tail_repetition:8@thinking",))) == cut
    assert pol.on_stream(StreamSignals(("tail_repetition:8@thinking",))) is None  # seen in this attempt
    pol.begin_attempt()
    assert pol.on_stream(StreamSignals(("tail_repetition:8@thinking",))) == cut


def feed(pol: DoomLoopPolicy, text: str, thinking: bool, size: int = 17) -> list[Verdict]:
    out = []
    for i in range(0, len(text), size):
        piece = text[i : i + size]
        ev = StreamThinking(0, piece) if thinking else StreamText(1, piece)
        if (v := pol.on_stream(ev)) is not None:
            out.append(v)
    return out


LOOP = "Thinking about it. I'll send.\n" * 40


def test_client_detector_thinking_loop_is_confident_and_in_chars() -> None:
    pol = ConservativeDoomLoopPolicy()
    pol.begin_attempt()
    verdicts = feed(pol, "Let me plan the change first.\n" + LOOP, thinking=True)
    assert isinstance(verdicts[0], Resample)
    tail = verdicts[0].signals[0]
    assert (tail.kind, tail.unit, tail.source, tail.threshold) == ("tail_repetition", "chars", "client", 30)


def test_client_detector_text_loop_only_warns() -> None:
    pol = ConservativeDoomLoopPolicy()
    pol.begin_attempt()
    verdicts = feed(pol, "Here is the answer.\n" + LOOP, thinking=False)
    assert verdicts and all(isinstance(v, Warn) for v in verdicts)


def test_client_thinking_period_above_max_chars_only_warns() -> None:
    pol = ConservativeDoomLoopPolicy(max_chars=20)
    pol.begin_attempt()
    assert all(isinstance(v, Warn) for v in feed(pol, LOOP, thinking=True))


def test_boundary_user_requested_repetition_on_text_is_a_warning_never_an_abort() -> None:
    pol = ConservativeDoomLoopPolicy()
    pol.begin_attempt()
    verdicts = feed(pol, "hello world " * 50, thinking=False)
    assert verdicts and not any(isinstance(v, Resample) for v in verdicts)


def test_boundary_base64_zeros_on_text_is_a_warning_never_an_abort() -> None:
    pol = ConservativeDoomLoopPolicy()
    pol.begin_attempt()
    verdicts = feed(pol, "```\n" + "A" * 4096 + "\n```\n", thinking=False)
    assert verdicts and all(isinstance(v, Warn) for v in verdicts)


def test_client_detector_can_be_switched_off() -> None:
    pol = ConservativeDoomLoopPolicy(client_detector=False)
    pol.begin_attempt()
    assert feed(pol, LOOP, thinking=True) == []


def test_detector_settings_are_passed_through() -> None:
    pol = DoomLoopPolicy(detector={"window": 512})
    assert all(d.window == 512 for d in pol.detectors.values())


def test_begin_attempt_resets_the_client_detectors() -> None:
    pol = ConservativeDoomLoopPolicy()
    pol.begin_attempt()
    feed(pol, LOOP[:100], thinking=True)
    pol.begin_attempt()
    assert all(d.chars == 0 for d in pol.detectors.values())


def test_judge_is_the_one_method_to_override() -> None:
    class AbortOnText(DoomLoopPolicy):
        def judge(self, signal: DoomLoopSignal) -> Judgement:
            return "abort" if signal.channel == "text" else "ignore"

    pol = AbortOnText()
    pol.begin_attempt()
    assert pol.on_stream(StreamSignals(("tail_repetition:8@thinking",))) is None
    assert isinstance(pol.on_stream(StreamSignals(("low_logprob@text",))), Resample)


def test_base_doom_loop_policy_only_warns() -> None:
    pol = DoomLoopPolicy()
    pol.begin_attempt()
    assert pol.on_stream(StreamSignals(("tail_repetition:8@thinking",))) == Warn((DoomLoopSignal.parse("tail_repetition:8@thinking"),))


def test_low_logprob_run_raises_a_signal_once_per_run() -> None:
    pol = DoomLoopPolicy(logprob_floor=-5.0, logprob_run=4)
    pol.begin_attempt()
    assert pol.on_stream(StreamLogprobs("text", (-6.0, -7.0, -0.1, -6.0))) is None
    v = pol.on_stream(StreamLogprobs("text", (-6.0, -6.0, -9.0, -8.0)))
    assert v == Warn((DoomLoopSignal("low_logprob", "text", source="client"),))
    assert pol.on_stream(StreamLogprobs("text", (-6.0, -6.0))) is None


def test_low_logprob_can_be_switched_off() -> None:
    pol = DoomLoopPolicy(logprob_floor=None)
    assert pol.on_stream(StreamLogprobs("thinking", (-50.0,) * 100)) is None


def test_unrelated_stream_events_are_ignored() -> None:
    assert ConservativeDoomLoopPolicy().on_stream(StreamUsage(Usage(1, 2))) is None


# -- SPEC §7: identical tool-call run -----------------------------------------------------------


def test_identical_run_nudges_on_8th_and_ends_on_12th() -> None:
    verdicts = run(IdenticalToolCallRun(), 12, call("grep", pattern="x", path="src"))
    assert first(verdicts, Nudge) == 8
    assert first(verdicts, EndTurn) == 12
    end = verdicts[-1]
    assert isinstance(end, EndTurn) and end.reason == "stationarity_ended"
    assert [type(v) for v in verdicts[8:11]] == [type(None)] * 3


def test_tight_class_tools_use_4_and_8() -> None:
    pol = IdenticalToolCallRun()
    pol.bind({"read_file": Spec("read_file", stationarity="tight")})
    verdicts = run(pol, 8, call("read_file", path="a.py"))
    assert first(verdicts, Nudge) == 4 and first(verdicts, EndTurn) == 8


def test_keepalive_noop_repeated_4_times_ends_the_turn() -> None:
    pol = IdenticalToolCallRun()
    verdicts = [step(pol, call("bash", command=c)) for c in ["true", ":", "sleep 0", "true"]]
    assert first(verdicts, EndTurn) == 4


@pytest.mark.parametrize("cmd", ["true", ":", "sleep 0", "exit 0", "  true ; ", "", "/bin/true"])
def test_keepalive_default_predicate_recognises_noops(cmd: str) -> None:
    assert is_keepalive(call("bash", command=cmd, timeout=5))
    assert is_keepalive(call("shell", argv=[cmd]) if cmd.strip() else call("sh", cmd=cmd))


@pytest.mark.parametrize(
    "args", [{"command": "pytest -q"}, {"command": "sleep 60"}, {"path": "true", "mode": "r"}]
)
def test_keepalive_default_predicate_rejects_real_work(args: dict[str, Any]) -> None:
    assert not is_keepalive(call("bash", **args))


@pytest.mark.parametrize(
    "tool_call",
    [
        call("lookup", word="true"),  # a dictionary lookup of the word "true"
        call("search", query=""),
        call("set_flag", enabled="true"),
        call("think", thought="wait"),
        call("game", command="wait"),  # a command, but not a shell's
        call("write_file", path="x.sh", script=":"),
    ],
)
def test_keepalive_is_a_shell_call_only(tool_call: ToolUseBlock) -> None:
    """SPEC §7: a keep-alive is a *shell call* of ``true``, ``:`` and the like. A real tool whose
    argument happens to read like a no-op is not one: it keeps the thresholds of its class."""
    assert not is_keepalive(tool_call)
    pol = IdenticalToolCallRun()
    verdicts = run(pol, 12, tool_call)
    assert first(verdicts, EndTurn) == 12 and first(verdicts, Nudge) == 8


@pytest.mark.parametrize(
    "tool_call",
    [
        call("bash", command="true"),
        call("Bash", command=":", description="keep the session alive"),
        call("run_shell_command", command="sleep 0"),
        call("execute_command", command="true", requires_approval=False),
        call("developer__shell", command="exit 0"),
        call("run_terminal_cmd", command="true", is_background=False),
        call("runTerminalCommand", command=":"),
        call("MCPShell", command="true"),
        call("exec_command", cmd="true"),
        call("shell", command=["true"]),
        call("shell", command=["bash", "-lc", "true"]),  # argv through a shell's -c
        call("local_shell", argv=["sh", "-c", ":"]),
        call("mcp__box__execute_bash", input="true"),  # a shell's only argument
    ],
)
def test_keepalive_shell_calls_are_caught(tool_call: ToolUseBlock) -> None:
    assert is_keepalive(tool_call)
    pol = IdenticalToolCallRun()
    assert first(run(pol, 4, tool_call), EndTurn) == 4


def test_keepalive_shell_tools_names_a_shell_the_name_does_not_tell() -> None:
    sandbox = call("sandbox", command="true")
    assert not is_keepalive(sandbox)
    assert is_keepalive(sandbox, shell_tools={"sandbox"})
    assert not is_keepalive(call("sandbox", command="make"), shell_tools={"sandbox"})


def test_keepalive_predicate_is_configurable() -> None:
    pol = IdenticalToolCallRun(keepalive=lambda c: c.name == "ping", nudge_at=None, end_at=None)
    assert first(run(pol, 4, call("ping")), EndTurn) == 4


def test_call_order_is_ignored_and_arguments_compared_canonically() -> None:
    pol = IdenticalToolCallRun(nudge_at=3)
    step(pol, call("a", x=1, y={"b": 2, "a": 1}), call("b"))
    step(pol, call("b"), call("a", y={"a": 1, "b": 2}, x=1))
    assert isinstance(step(pol, call("a", x=1, y={"a": 1, "b": 2}), call("b")), Nudge)


def test_canonical_key_sorts_keys_strips_whitespace_keeps_unicode() -> None:
    assert canonical_key(call("w", b=[1, 2], a="é")) == ("w", '{"a":"é","b":[1,2]}')



def test_calls_whose_input_was_not_json_are_told_apart_by_what_the_model_sent() -> None:
    """Each attempt at a call whose JSON broke differently is a different call, not a run of
    "identical arguments"; the same broken input repeated is a run."""

    def broken(raw: str) -> ToolUseBlock:
        error = f"the tool input is not valid JSON (Expecting ',' delimiter); raw input: {raw!r}"
        return ToolUseBlock(id=f"t{next(_ids)}", name="todo", input={}, input_error=error)

    pol = IdenticalToolCallRun()
    pol.bind({"todo": Spec("todo", stationarity="tight")})
    attempts = [step(pol, broken(f'{{"items": ["step {i}" "more"]}}')) for i in range(10)]
    assert attempts == [None] * 10
    assert step(pol, call("todo")) is None  # no arguments at all: not the broken call before it
    same = run(pol, 8, broken('{"items": [1 2]}'))
    assert first(same, Nudge) == 4 and first(same, EndTurn) == 8
    assert canonical_key(broken("{")) != canonical_key(call("todo"))

def test_a_rebind_keeps_only_the_tool_classes_of_the_new_tool_set_and_those_named() -> None:
    """Tight and poller classes come from the tools bound last (an engine whose tools changed, a
    fork bound to a subagent's narrower set), plus the names given to the policy itself."""
    pol = IdenticalToolCallRun(tight_tools=["notes"], poller_tools=["jobs"])
    pol.bind({
        "read_file": Spec("read_file", stationarity="tight"),
        "todo": Spec("todo", stationarity="tight"),
        "status": Spec("status", poller=True),
    })  # fmt: skip
    assert (pol.tight_tools, pol.poller_tools) == ({"notes", "read_file", "todo"}, {"jobs", "status"})
    child = pol.fork()
    assert isinstance(child, IdenticalToolCallRun)
    child.bind({"read_file": Spec("read_file"), "status": Spec("status"), "notes": Spec("notes")})
    assert (child.tight_tools, child.poller_tools) == ({"notes"}, {"jobs"})
    assert (pol.tight_tools, pol.poller_tools) == ({"notes", "read_file", "todo"}, {"jobs", "status"})
    pol.bind({"todo": Spec("todo", stationarity="tight")})
    assert (pol.tight_tools, pol.poller_tools) == ({"notes", "todo"}, {"jobs"})
    verdicts = run(child, 12, call("read_file", path="a.py"))  # no longer tight: 8 and 12, not 4 and 8
    assert first(verdicts, Nudge) == 8 and first(verdicts, EndTurn) == 12


def test_parallel_identical_calls_in_one_response_count() -> None:
    pol = IdenticalToolCallRun()
    assert isinstance(step(pol, *[call("mvn", goal="test") for _ in range(8)]), Nudge)
    assert isinstance(step(pol, *[call("mvn", goal="test") for _ in range(4)]), EndTurn)


def test_batch_work_over_different_arguments_is_not_a_run() -> None:
    pol = IdenticalToolCallRun()
    verdicts = [step(pol, call("edit", path=f"f{i}.py", old="a", new="b")) for i in range(20)]
    verdicts += [step(pol, call("read_file", path="big.py", offset=i * 100)) for i in range(20)]
    assert verdicts == [None] * 40


def test_varying_thought_text_with_identical_call_still_counts() -> None:
    pol = IdenticalToolCallRun()
    verdicts = [step(pol, call("ls", path="."), thought=f"Maybe now, attempt {i}") for i in range(8)]
    assert first(verdicts, Nudge) == 8


def test_counters_reset_at_a_real_user_message_only() -> None:
    pol = IdenticalToolCallRun()
    run(pol, 7, call("ls"))
    pol.begin_turn(real_user=False)  # a resume that adds no message (nudges never call it)
    assert isinstance(step(pol, call("ls")), Nudge)
    pol.begin_turn(real_user=True)  # the user typed "continue"
    assert run(pol, 7, call("ls")) == [None] * 7


def test_transport_retry_does_not_double_count() -> None:
    pol = IdenticalToolCallRun()
    for _ in range(7):
        pol.begin_attempt()
        pol.begin_attempt()  # a retried attempt never reaches on_response
        step(pol, call("ls"))
    assert pol.count == 7


def test_response_without_tool_calls_breaks_the_run() -> None:
    pol = IdenticalToolCallRun()
    run(pol, 7, call("ls"))
    pol.on_response(Message.assistant("Let me think."))
    assert run(pol, 7, call("ls")) == [None] * 7


def test_nudge_fires_once_per_pattern_and_again_when_it_doubles() -> None:
    verdicts = run(IdenticalToolCallRun(end_at=None), 20, call("ls"))
    assert [i + 1 for i, v in enumerate(verdicts) if isinstance(v, Nudge)] == [8, 16]


def test_a_pattern_nudged_once_is_not_nudged_again_after_a_detour_until_it_doubles() -> None:
    """Once per pattern: a model nudged off a run that takes one other step and goes back to the
    same calls is not nudged again at the same count (only when the run doubles); the turn ends
    at ``end_at`` as before. Another pattern gets its own nudge."""
    a, b = call("ls", path="."), call("cat", path="x")
    pol = IdenticalToolCallRun(end_at=None)
    verdicts = [*run(pol, 8, a), step(pol, b), *run(pol, 16, a), *run(pol, 8, b)]
    assert [i + 1 for i, v in enumerate(verdicts) if isinstance(v, Nudge)] == [8, 25, 33]
    pol = IdenticalToolCallRun()
    ended = [*run(pol, 8, a), step(pol, b), *run(pol, 12, a)]
    assert [(i + 1, type(v).__name__) for i, v in enumerate(ended) if v] == [(8, "Nudge"), (21, "EndTurn")]
    pol.begin_turn(real_user=True)  # a person's message: every pattern may be nudged again
    assert first(run(pol, 8, a), Nudge) == 8


def test_a_repeated_error_nudged_once_is_not_nudged_again_after_a_success_until_it_doubles() -> None:
    pol = RepeatedErrorResult(end_at=None)
    fail = [step(pol, call("fetch", url="u"), result="404 Not Found", error=True) for _ in range(3)]
    fail += [step(pol, call("fetch", url="v"))]
    fail += [step(pol, call("fetch", url="u"), result="404 Not Found", error=True) for _ in range(6)]
    assert [i + 1 for i, v in enumerate(fail) if isinstance(v, Nudge)] == [3, 10]


def test_nudge_text_is_configurable_and_names_the_count() -> None:
    pol = IdenticalToolCallRun(nudge_at=2)
    pol.nudge_text = "again {count}x: {tools}"
    assert run(pol, 2, call("ls"))[-1] == Nudge("again 2x: ls")
    default = run(IdenticalToolCallRun(nudge_at=2), 2, call("ls"))[-1]
    assert isinstance(default, Nudge) and "2 times in a row" in default.reminder


def test_polling_with_changing_results_is_progress() -> None:
    pol = IdenticalToolCallRun()
    pol.bind({"tail_log": Spec("tail_log", poller=True)})
    verdicts = [step(pol, call("tail_log", n=20), result=f"line {i}") for i in range(30)]
    assert verdicts == [None] * 30


def test_polling_with_unchanged_result_stops() -> None:
    pol = IdenticalToolCallRun(poller_tools=["task_list"])
    verdicts = run(pol, 12, call("task_list"), result="3 running")
    assert first(verdicts, Nudge) == 8 and first(verdicts, EndTurn) == 12


def test_non_poller_with_changing_results_still_counts() -> None:
    pol = IdenticalToolCallRun()
    verdicts = [step(pol, call("git_status"), result=f"t={i}") for i in range(8)]
    assert first(verdicts, Nudge) == 8


def test_key_is_the_one_method_to_override() -> None:
    class IgnoreTimeout(IdenticalToolCallRun):
        def key(self, call: ToolUseBlock, result: ToolResultBlock | None) -> Any:
            return call.name, call.input.get("command")

    pol = IgnoreTimeout(nudge_at=3)
    verdicts = [step(pol, call("bash", command="make", timeout=t)) for t in (1, 2, 3)]
    assert isinstance(verdicts[-1], Nudge)
    assert isinstance(pol, StationarityPolicy)


def test_fork_gives_an_independent_copy() -> None:
    pol = IdenticalToolCallRun()
    run(pol, 7, call("ls"))
    child = pol.fork()
    assert isinstance(child, IdenticalToolCallRun)
    run(child, 3, call("ls"))
    assert pol.count == 7


# -- opt-in: cycles and repeated errors -----------------------------------------------------------


def test_cycle_a_b_three_times_over_nudges_and_five_ends() -> None:
    pol = ToolCallCycle()
    a, b = call("edit", path="x", new="1"), call("pytest")
    verdicts = [step(pol, a if i % 2 == 0 else b) for i in range(10)]
    assert first(verdicts, Nudge) == 6
    assert first(verdicts, EndTurn) == 10
    # (A, B) seen again as (B, A) one step later is the same cycle: one nudge only
    assert sum(isinstance(v, Nudge) for v in verdicts) == 1


def test_cycle_of_period_five_is_caught_and_identical_run_is_not_a_cycle() -> None:
    pol = ToolCallCycle()
    steps = [call(f"s{i % 5}") for i in range(15)]
    assert first([step(pol, c) for c in steps], Nudge) == 15
    assert run(ToolCallCycle(), 12, call("ls")) == [None] * 12



@pytest.mark.parametrize("period", [2, 3, 5])
def test_cycle_without_an_end_nudges_again_each_time_it_doubles(period: int) -> None:
    """With ``end_repeats=None`` a cycle that goes on is nudged at 3, 6, 12, ... repetitions,
    whatever its period (counting is not bounded by a history of a few responses)."""
    pol = ToolCallCycle(end_repeats=None)
    steps = [call(f"s{i % period}") for i in range(period * 24)]
    verdicts = [step(pol, c) for c in steps]
    nudged = [i + 1 for i, v in enumerate(verdicts) if isinstance(v, Nudge)]
    assert nudged == [period * 3, period * 6, period * 12, period * 24]
    assert not any(isinstance(v, EndTurn) for v in verdicts)
    last = verdicts[nudged[-1] - 1]
    assert isinstance(last, Nudge) and f"{period} steps 24 times" in last.reminder

def test_repeated_error_result_three_times_nudges() -> None:
    pol = RepeatedErrorResult()
    verdicts = [step(pol, call("fetch", url=f"u{i}"), result="404 Not Found", error=True) for i in range(6)]
    assert first(verdicts, Nudge) == 3
    assert first(verdicts, EndTurn) == 6


def test_repeated_error_run_is_broken_by_a_success() -> None:
    pol = RepeatedErrorResult()
    step(pol, call("fetch"), result="boom", error=True)
    step(pol, call("fetch"), result="boom", error=True)
    step(pol, call("fetch"), result="fine")
    assert step(pol, call("fetch"), result="boom", error=True) is None



def test_repeated_error_ignores_the_order_of_a_responses_calls() -> None:
    """Three parallel calls fail alike and a fourth succeeds, response after response: the
    verdict does not depend on whether the model listed the successful call first or last
    (it nudged on every response when the success came first, never when it came last)."""

    def respond(pol: RepeatedErrorResult, ok_first: bool) -> Verdict | None:
        failing = [call("test", shard=i) for i in range(3)]
        ok = call("read", path="a.py")
        calls = [ok, *failing] if ok_first else [*failing, ok]
        msg = Message(role="assistant", content=list(calls))
        results = [ToolResultBlock(tool_use_id=c.id, content="ok" if c is ok else "boom", is_error=c is not ok) for c in calls]
        assert pol.on_response(msg) is None
        return pol.on_results(msg, results)

    for ok_first in (True, False):
        pol = RepeatedErrorResult()
        assert [respond(pol, ok_first) for _ in range(4)] == [None] * 4, ok_first
    pol = RepeatedErrorResult()  # the same failures without the success are a run
    verdicts = [step(pol, *[call("test", shard=i) for i in range(3)], result="boom", error=True) for _ in range(2)]
    assert [type(v) for v in verdicts] == [Nudge, EndTurn]


_responses = st.lists(
    st.lists(
        st.tuples(st.sampled_from(["ls", "test", "bash"]), st.sampled_from([{}, {"x": 1}, {"command": "true"}]), st.booleans()),
        max_size=4,
    ),
    max_size=24,
)


@given(_responses, st.randoms(), st.sampled_from([IdenticalToolCallRun, ToolCallCycle, RepeatedErrorResult]))
def test_property_stationarity_verdicts_ignore_the_order_of_a_responses_calls(
    responses: list[list[tuple[str, dict[str, Any], bool]]], rnd: Any, cls: type[StationarityPolicy]
) -> None:
    listed, shuffled = cls(), cls()
    for calls in responses:
        verdicts = []
        for pol, order in ((listed, calls), (shuffled, rnd.sample(calls, len(calls)))):
            uses = [call(name, **args) for name, args, _ in order]
            msg = Message(role="assistant", content=list(uses)) if uses else Message.assistant("Thinking it over.")
            results = [
                ToolResultBlock(tool_use_id=u.id, content="boom" if err else "ok", is_error=err)
                for u, (_, _, err) in zip(uses, order, strict=True)
            ]
            verdicts.append((pol.on_response(msg), pol.on_results(msg, results) if uses else None))
        assert verdicts[0] == verdicts[1], calls

@given(st.lists(st.tuples(st.sampled_from(["ls", "cat"]), st.integers(1, 3) | st.integers(8, 11)), max_size=12))
def test_property_identical_run_nudges_each_pattern_at_doubling_counts_and_ends_at_end_at(
    runs: list[tuple[str, int]],
) -> None:
    """Stretches of one call (a stretch may continue the one before it): the turn ends exactly
    when a run of identical responses reaches 12; before that, each pattern is nudged first at 8
    and again only at a run at least twice as long as its last nudge, whatever came between."""
    pol = IdenticalToolCallRun()
    last: str | None = None
    length = 0
    nudged: dict[str, int] = {}
    for name, repeat in runs:
        for _ in range(repeat):
            length = length + 1 if name == last else 1
            last = name
            verdict = step(pol, call(name, path="."))
            if length >= 12:
                assert isinstance(verdict, EndTurn) and f"{length} times" in verdict.message
                return  # the turn is over
            if isinstance(verdict, Nudge):
                assert length >= max(8, 2 * nudged.get(name, 0)), (name, length, nudged)
                nudged[name] = length
            else:
                assert verdict is None and length < max(8, 2 * nudged.get(name, 0)), (name, length, nudged)


def test_default_policies_are_conservative_doom_loop_and_identical_run() -> None:
    pols = default_policies()
    assert [type(p) for p in pols] == [ConservativeDoomLoopPolicy, IdenticalToolCallRun]
    assert isinstance(pols[0], ConservativeDoomLoopPolicy) and pols[0].max_threshold == 64


def test_detector_queues_deltas_until_its_next_checkpoint() -> None:
    det = RepetitionDetector("text")
    for _ in range(3):
        assert det.feed("ten chars.") == ()
    assert det.chars == 30 and det._buf == ""  # queued: the first checkpoint is at 32
    det.feed("ten chars.")
    assert det._buf == "ten chars." * 4 and det._pending == ""
    assert det.in_fence is False
    det.feed("\n```py\n")  # queued, but asking for the fence state looks at it
    assert det.in_fence is True and det._pending == ""


def test_doom_policy_holds_cold_text_for_every_deltas() -> None:
    pol = ConservativeDoomLoopPolicy(every=3)
    det = pol.detectors["text"]
    pol.on_stream(StreamText(0, "a" * 40))
    pol.on_stream(StreamText(0, "b" * 40))
    assert det.chars == 0  # two deltas held by the policy
    pol.on_stream(StreamText(0, "c" * 40))
    assert det._buf == "a" * 40 + "b" * 40 + "c" * 40
    pol.on_stream(StreamThinking(0, "t" * 40))  # channels are counted apart
    assert pol.detectors["thinking"].chars == 0
    pol.begin_attempt()  # a new attempt forgets what was held
    for ch in "xyz":
        pol.on_stream(StreamText(0, ch))
    assert det.chars == 3
    assert ConservativeDoomLoopPolicy().every == 4  # the stock setting


def test_doom_policy_hands_over_every_delta_once_a_run_is_live() -> None:
    pol = ConservativeDoomLoopPolicy(every=3)
    det = pol.detectors["thinking"]
    unit = "I'll check the file again. "
    for _ in range(3):
        pol.on_stream(StreamThinking(0, unit * 2))
    assert det.live  # the repeat is being tracked
    pol.on_stream(StreamThinking(0, unit))
    assert det.chars == 7 * len(unit)  # handed over at once, not held


def test_doom_policy_every_must_be_positive() -> None:
    with pytest.raises(ValueError, match="every"):
        ConservativeDoomLoopPolicy(every=0)


@pytest.mark.parametrize("every", [1, 3])
@pytest.mark.parametrize("size", [1, 4, 24, 120])
def test_doom_policy_fires_at_most_every_minus_one_deltas_after_the_detector(every: int, size: int) -> None:
    unit = "Checking the config again before I answer. "
    text = "We read the plan, compare it with the file, and decide.\n" * 3 + unit * 30
    deltas = [text[i : i + size] for i in range(0, len(text), size)]
    det = RepetitionDetector("thinking")
    bare = next(i for i, d in enumerate(deltas) if any(s.kind == "tail_repetition" for s in det.feed(d)))
    pol = ConservativeDoomLoopPolicy(every=every)
    via = next(i for i, d in enumerate(deltas) if pol.on_stream(StreamThinking(0, d)) is not None)
    assert bare <= via <= bare + every - 1


def test_canonical_key_compares_numbers_by_value() -> None:
    """Canonical JSON compares numbers as numbers: ``1`` and ``1.0`` (and ``-0.0`` and ``0``) are
    the same argument, so a model alternating between them is still repeating one call."""
    assert canonical_key(call("t", n=1)) == canonical_key(call("t", n=1.0))
    assert canonical_key(call("t", n=[0, {"x": 2}])) == canonical_key(call("t", n=[-0.0, {"x": 2.0}]))
    assert canonical_key(call("t", n=1.5)) == ("t", '{"n":1.5}')
    assert canonical_key(call("t", n=True)) != canonical_key(call("t", n=1))  # a boolean is not a number
    pol = IdenticalToolCallRun()
    verdicts = [step(pol, call("read", path="a.py", limit=100 if i % 2 else 100.0)) for i in range(12)]
    assert first(verdicts, Nudge) == 8 and first(verdicts, EndTurn) == 12


_json = st.recursive(
    st.none() | st.booleans() | st.integers(-(2**60), 2**60) | st.floats(allow_nan=False) | st.text(max_size=5),
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=4), inner, max_size=4),
    max_leaves=20,
)


def _as_floats(value: Any) -> Any:
    """The same JSON value with each integer written as a float, where a float holds it exactly."""
    if isinstance(value, bool):
        return value
    if isinstance(value, int) and abs(value) <= 2**53:
        return float(value)
    if isinstance(value, list):
        return [_as_floats(v) for v in value]
    if isinstance(value, dict):
        return {k: _as_floats(v) for k, v in reversed(value.items())}
    return value


@given(_json)
def test_property_canonical_key_ignores_key_order_and_number_spelling(value: Any) -> None:
    args = {"v": value}
    assert canonical_key(call("t", **args)) == canonical_key(call("t", **_as_floats(args)))


def test_a_deeply_nested_argument_with_a_float_is_still_keyed() -> None:
    """An argument nested as deep as the decoder allows is keyed as written (not by number
    value) rather than raising, so the policy still counts the run it makes."""
    deep: Any = 1.0
    for _ in range(600):
        deep = [deep]
    assert canonical_key(call("t", x=deep))[1].startswith('{"x":[[[')
    verdicts = run(IdenticalToolCallRun(), 12, call("t", x=deep))
    assert first(verdicts, Nudge) == 8 and first(verdicts, EndTurn) == 12


@given(st.integers(2**53 + 1, 2**1000).map(lambda n: int(float(n))))
def test_property_canonical_key_compares_large_integral_floats_by_value(n: int) -> None:
    """A float above 2**53 that holds an integer exactly is that integer: ``1e16`` and
    ``10000000000000000`` are one argument, as ``1.0`` and ``1`` are."""
    assert float(n) == n
    assert canonical_key(call("t", offset=float(n))) == canonical_key(call("t", offset=n))


# -- verdict texts and settings a host gets wrong ------------------------------------------------


def _looping(policy: StationarityPolicy, n: int) -> list[Verdict | None]:
    """``n`` responses that every stock stationarity policy counts: the same failing shell call."""
    return run(policy, n, call("bash", command="true"), result="Error: no such file", error=True)


@pytest.mark.parametrize(
    ("make", "attr"),
    [
        (lambda: IdenticalToolCallRun(keepalive=None), "end_text"),
        (lambda: IdenticalToolCallRun(keepalive=None), "nudge_text"),
        (lambda: IdenticalToolCallRun(), "keepalive_text"),
        (lambda: ToolCallCycle(max_period=2), "end_text"),
        (lambda: RepeatedErrorResult(), "end_text"),
        (lambda: RepeatedErrorResult(), "nudge_text"),
    ],
)
@pytest.mark.parametrize("text", ["Stopped after {n} calls", "{count} calls {0}", "args were {tools.x}", None])
def test_a_verdict_text_that_cannot_be_formatted_still_gives_the_verdict(
    make: Any, attr: str, text: Any, caplog: pytest.LogCaptureFixture
) -> None:
    """A host's text with a field the template does not have (a typo) used to raise from the
    hook, which the engine logs and ignores: the stop never came, and the loop ran on until
    ``max_turns`` (unlimited by default). The verdict comes with the stock text instead, and
    the mistake is logged."""
    policy = make()
    stock = getattr(policy, attr)
    setattr(policy, attr, text)
    if isinstance(policy, ToolCallCycle):
        verdicts = [step(policy, call("read", path="ab"[i % 2])) for i in range(12)]
    else:
        verdicts = _looping(policy, 12)
    kind = Nudge if attr == "nudge_text" else EndTurn
    got = [v for v in verdicts if isinstance(v, kind)]
    assert got, verdicts
    said = got[0].reminder if isinstance(got[0], Nudge) else got[0].message
    assert said.startswith(stock.split("{", 1)[0])
    assert f"{type(policy).__name__}.{attr}" in caplog.text


@pytest.mark.parametrize(
    "make",
    [
        lambda: IdenticalToolCallRun(nudge_at=0),
        lambda: IdenticalToolCallRun(end_at=-1),
        lambda: IdenticalToolCallRun(tight_nudge_at="4"),  # type: ignore[arg-type]
        lambda: IdenticalToolCallRun(tight_end_at=2.5),  # type: ignore[arg-type]
        lambda: IdenticalToolCallRun(keepalive_end_at=True),  # type: ignore[arg-type]
        lambda: ToolCallCycle(max_period=1),
        lambda: ToolCallCycle(nudge_repeats=1),
        lambda: ToolCallCycle(end_repeats=0),
        lambda: ToolCallCycle(max_period="5"),  # type: ignore[arg-type]
        lambda: RepeatedErrorResult(nudge_at=0),
        lambda: RepeatedErrorResult(end_at="6"),  # type: ignore[arg-type]
        lambda: RepeatedErrorResult(prefix=-1),
    ],
)
def test_thresholds_that_are_not_counts_are_refused_at_construction(make: Any) -> None:
    """``nudge_at=0`` nudged at every first call, ``nudge_repeats=1`` took any two different
    responses for a cycle, and a threshold read from a config file as ``"8"`` made every hook
    raise (logged and ignored: no nudge, ever). Each is a clear error when the policy is made."""
    with pytest.raises((TypeError, ValueError), match=r"(must be|takes) "):
        make()


def test_thresholds_at_their_least_and_none_are_accepted() -> None:
    least = IdenticalToolCallRun(1, 1, 1, 1, 1)
    assert (least.nudge_at, least.end_at, least.tight_nudge_at, least.tight_end_at, least.keepalive_end_at) == (1,) * 5
    off = IdenticalToolCallRun(None, None, None, None, None)
    assert (off.nudge_at, off.end_at, off.tight_nudge_at, off.tight_end_at, off.keepalive_end_at) == (None,) * 5
    cycle = ToolCallCycle(max_period=2, nudge_repeats=2, end_repeats=None)
    assert (cycle.max_period, cycle.nudge_repeats, cycle.end_repeats) == (2, 2, None)
    errors = RepeatedErrorResult(nudge_at=1, end_at=None, prefix=0)
    assert (errors.nudge_at, errors.end_at, errors.prefix) == (1, None, 0)


@pytest.mark.parametrize("reason", ["completed", "aborted_tools", "max_turns", "bogus", None])
def test_an_end_turn_reason_other_than_its_own_two_is_refused(reason: Any) -> None:
    """``EndTurn(reason="completed")`` ended a turn a policy stopped with the terminal of a turn
    the model finished (a headless host could not tell), and any other string ended it with a
    reason outside SPEC §10."""
    with pytest.raises(ValueError, match=r"stationarity_ended.*hook_stopped"):
        EndTurn("stop", reason=reason)


@pytest.mark.parametrize(
    ("channels", "error"),
    [("text", TypeError), (["text", "answer"], ValueError), (None, TypeError), ([1], ValueError)],
)
def test_channels_other_than_thinking_and_text_are_refused_when_the_policy_is_made(
    channels: Any, error: type[Exception]
) -> None:
    """`channels="text"` made detectors for the channels "t", "e" and "x": the text channel was
    silently not watched."""
    with pytest.raises(error, match="channels"):
        ConservativeDoomLoopPolicy(channels=channels)


def test_a_policy_watching_thinking_only_leaves_the_text_alone() -> None:
    policy = ConservativeDoomLoopPolicy(channels=["thinking"], every=1)
    assert list(policy.detectors) == ["thinking"]
    assert [policy.on_stream(StreamText(0, "ab" * 200)) for _ in range(4)] == [None] * 4
    verdicts = [policy.on_stream(StreamThinking(0, "ab" * 200)) for _ in range(4)]
    assert any(isinstance(v, Resample) for v in verdicts)
