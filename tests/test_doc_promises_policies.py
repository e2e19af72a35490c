"""Promises of docs/policies.md that no other test pins."""

from __future__ import annotations

import random
from collections.abc import Hashable, Sequence
from typing import Any

import pytest

from agentloop import (
    Event,
    Message,
    ModelError,
    PolicyNudge,
    QueryEngine,
    Resampling,
    Retrying,
    ScriptedModel,
    ScriptedResponse,
    ScriptedToolCall,
    ToolCallStarted,
    ToolResultBlock,
    ToolUseBlock,
    TurnEnded,
    tool,
    validate_transcript,
)
from agentloop.models import StreamEvent, StreamText, StreamThinking
from agentloop.policies import (
    ConservativeDoomLoopPolicy,
    EndTurn,
    IdenticalToolCallRun,
    Nudge,
    Policy,
    RepetitionDetector,
    Resample,
    Rule,
    StationarityPolicy,
    ToolCallCycle,
    Verdict,
    Warn,
)
from agentloop.testing import collect

PROSE = "Here is what you asked for, with a short note on how it was made and why.\n\n"


def end_of(events: Sequence[Event]) -> TurnEnded:
    end = events[-1]
    assert isinstance(end, TurnEnded)
    return end


def calls(name: str, **args: Any) -> ScriptedResponse:
    return ScriptedResponse(tool_calls=[ScriptedToolCall(name, args)])


@tool
async def shell(command: str) -> str:
    """Run a shell command."""
    return f"ran {command}"


@tool
async def open_file(path: str) -> str:
    """Open a file of the project."""
    return f"contents of {path}"


def verdicts(policy: Policy, text: str, channel: str = "text", size: int = 20) -> list[Warn | Resample]:
    """What ``policy`` says of ``text`` streamed on ``channel`` in deltas of ``size`` characters."""
    policy.begin_attempt()
    make = StreamText if channel == "text" else StreamThinking
    said = [policy.on_stream(make(0, text[i : i + size])) for i in range(0, len(text), size)]
    return [v for v in said if isinstance(v, Warn | Resample)]


# -- How a policy plugs in -----------------------------------------------------------------------


class CutOnce(Policy):
    """Cuts the first attempt at its first text with ``verdict``."""

    def __init__(self, verdict: Resample) -> None:
        self.verdict, self.cut = verdict, False

    def on_stream(self, event: StreamEvent) -> Verdict | None:
        if isinstance(event, StreamText) and not self.cut:
            self.cut = True
            return self.verdict
        return None


@pytest.mark.parametrize("blank", ["", "  \n\t "])
async def test_a_blank_resample_reminder_stands_for_the_engines_and_no_blank_message_is_sent(blank: str) -> None:
    """How a policy plugs in: a verdict's text goes into a request made fit for one. A
    ``Resample(reminder="  ")`` with no signals and no replay sent the resample request with a
    blank user message, which a provider refuses; "" already meant the engine's reminder."""
    model = ScriptedModel(["the first answer", "the second answer"])
    engine = QueryEngine(model, policies=[CutOnce(Resample(reminder=blank, replay=False))])
    end = end_of(await collect(engine.run("go")))
    assert end.reason == "completed"
    reminder = model.requests[1].messages[-1]
    assert reminder.text.startswith("Your previous output was judged to be a repetition loop")
    assert [m.text for m in engine.messages] == ["go", "the second answer"]
    assert Resample(reminder=blank).reminder is None


class NudgeAs(Policy):
    """Nudges after every tool batch; with ``engine``, interrupts it in the same hook."""

    engine: QueryEngine | None = None

    def on_results(self, message: Message, results: Sequence[ToolResultBlock]) -> Verdict | None:
        if self.engine is not None:
            self.engine.interrupt()
        return Nudge("Remember the plan.")


@pytest.mark.parametrize("how", ["aborted", "usage_limit"])
async def test_a_nudge_due_when_the_turn_is_aborted_or_over_its_usage_limit_is_dropped(how: str) -> None:
    """How a policy plugs in: a nudge with no next request in its turn (aborted, or at a limit)
    is dropped: no `PolicyNudge`, and nothing in the transcript for a later turn to read."""
    policy = NudgeAs()
    model = ScriptedModel([calls("shell", command="make"), "done", "next turn"])
    limit = 15 if how == "usage_limit" else None  # the first response's 20 tokens reach it
    engine = QueryEngine(model, tools=[shell], policies=[policy], usage_limit=limit)
    if how == "aborted":
        policy.engine = engine
    events = await collect(engine.run("build"))
    assert end_of(events).reason == ("aborted_tools" if how == "aborted" else "usage_limit")
    assert not any(isinstance(e, PolicyNudge) for e in events)
    assert all(m.kind != "nudge" and "Remember" not in m.text for m in engine.messages)
    policy.engine = None
    engine.usage_limit = None
    await collect(engine.run("and now?"))
    assert all("Remember" not in m.text for m in model.requests[-1].messages)
    assert validate_transcript(engine.messages) == []


class EndAsInterrupted(Policy):
    """Ends the turn from ``on_response`` while the host's interrupt lands."""

    engine: QueryEngine | None = None

    def on_response(self, message: Message) -> Verdict | None:
        if message.tool_uses and self.engine is not None:
            self.engine.interrupt()
            return EndTurn("enough", reason="hook_stopped")
        return None


async def test_an_interrupt_that_lands_as_on_response_ends_the_turn_gets_the_interrupts_results() -> None:
    """How a policy plugs in, EndTurn: the interrupt wins, so the calls the verdict kept from
    running get the interrupt's results, not "Not run: ..."; the notice is written."""
    policy = EndAsInterrupted()
    both = ScriptedResponse(tool_calls=[ScriptedToolCall("shell", {"command": c}) for c in ("make", "make test")])
    engine = QueryEngine(ScriptedModel([both, "never"]), tools=[shell], policies=[policy])
    policy.engine = engine
    end = end_of(await collect(engine.run("build")))
    assert (end.reason, end.abort_reason, end.detail) == ("aborted_tools", "cancel", None)
    results = engine.messages[2].tool_results
    assert [r.text for r in results] == [engine.texts.never_started] * 2 and all(r.is_error for r in results)
    assert engine.messages[-1].kind == "interrupt_notice"
    assert validate_transcript(engine.messages) == []


class Hooks(Policy):
    """Writes down the verdict-less hooks."""

    def __init__(self) -> None:
        self.seen: list[str] = []

    def begin_turn(self, *, real_user: bool) -> None:
        self.seen.append(f"turn {real_user}")

    def begin_attempt(self) -> None:
        self.seen.append("attempt")


async def test_begin_turn_is_called_for_what_a_person_wrote_and_begin_attempt_for_every_attempt() -> None:
    """How a policy plugs in, the hook table: ``begin_turn(real_user=True)`` for a prompt, a
    send-now text, a follow-up and a user message the host appended; ``False`` for a resume that
    adds nothing and a message marked synthetic; never for a nudge, a resample reminder or a
    transport retry, which do call ``begin_attempt``."""
    hooks = Hooks()
    loop = ScriptedResponse(thinking="Let me plan.\n" + "I'll do it.\nI'll execute.\n" * 60, chunk=7)
    script: list[ScriptedResponse | str] = [
        ScriptedResponse(error=ModelError("reset", retryable=True)), calls("shell", command="make"),
        calls("shell", command="make"), loop, "built",  # the first run: retry, nudge, resample
        calls("shell", command="make test"), "sent now", "followed up", "appended", "synthetic", "resumed",
    ]  # fmt: skip
    policies = [ConservativeDoomLoopPolicy(), IdenticalToolCallRun(nudge_at=2, end_at=None), hooks]
    engine = QueryEngine(ScriptedModel(script), tools=[shell], policies=policies, retry_base_delay=0.001)
    events = await collect(engine.run("build"))
    assert {PolicyNudge, Retrying, Resampling} <= {type(e) for e in events}
    assert hooks.seen == ["turn True", *["attempt"] * 5]  # failed, make, make, loop, built
    hooks.seen.clear()
    engine.follow_up("and then document it")
    async for event in engine.run("test it"):
        if isinstance(event, ToolCallStarted):
            engine.send_now("stop, ship it as it is")
    assert hooks.seen == ["turn True", "attempt", "turn True", "attempt", "turn True", "attempt"]
    hooks.seen.clear()
    engine.messages.append(Message.user("and now?"))
    await collect(engine.run())
    engine.messages.append(Message.user("Continue.", synthetic=True))
    await collect(engine.run())
    engine.messages.pop()
    await collect(engine.run())
    assert hooks.seen == ["turn True", "attempt", "turn False", "attempt", "turn False", "attempt"]


def test_a_bind_that_raises_when_the_engine_is_made_makes_no_engine() -> None:
    """Stationarity: a `bind` that raises later is logged and ignored; at construction it raises."""

    class Brittle(Policy):
        def bind(self, tools: Any) -> None:
            raise RuntimeError("no tool table")

    with pytest.raises(RuntimeError, match="no tool table"):
        QueryEngine(ScriptedModel(["hi"]), tools=[shell], policies=[IdenticalToolCallRun(), Brittle()])


# -- Doom loops: thresholds, boundary cases, what an exact detector cannot catch ------------------


def test_the_thresholds_table_is_the_detectors_default() -> None:
    """Thresholds: the table's rows, in characters, per channel and inside a fence."""
    big = RepetitionDetector("text").rules[-1].below
    assert RepetitionDetector("thinking").rules == (Rule(16, 0, 256), Rule(64, 4, 0), Rule(big, 3, 0))
    assert RepetitionDetector("text").rules == (Rule(16, 0, 512), Rule(64, 4, 96), Rule(big, 3, 0))
    assert RepetitionDetector("text").fence_rules == (Rule(16, 0, 2048), Rule(64, 12, 1024), Rule(big, 4, 0))
    assert RepetitionDetector("thinking").wordy_rule == Rule(16, 4, 48)
    assert RepetitionDetector("text").wordy_rule == Rule(16, 5, 64)


HEXDUMP = "".join(f"{o:08x}  " + "00 " * 16 + " |................|\n" for o in range(0, 4096, 16))
BOUNCE = "Delivery to ops@example.com failed: mailbox full (552 5.2.2); giving up after 5 days.\n"
LOG_LINE = "WARN disk nearly full on /var/lib/db\n"


@pytest.mark.parametrize(
    ("case", "text", "signal"),
    [
        ("hexdump of a zero page", PROSE + "```\n" + HEXDUMP + "```\n", None),
        ("one record three times outside a fence", PROSE + BOUNCE * 3 + "\nThat is all.\n", "86@"),
        ("one line four times outside a fence", PROSE + LOG_LINE * 4 + "\nThat is all.\n", "37@"),
    ],
)
def test_boundary_cases_are_reported_warned_on_text_and_treated_as_loops_on_thinking(
    case: str, text: str, signal: str | None
) -> None:
    """Boundary cases: reported, never aborted on the text channel (a hexdump, whose offsets
    change, not at all); on the thinking channel the same output is a loop."""
    on_text = verdicts(ConservativeDoomLoopPolicy(), text, "text")
    on_thinking = verdicts(ConservativeDoomLoopPolicy(), text, "thinking")
    if signal is None:
        assert on_text == on_thinking == [], case
        return
    assert on_text and all(isinstance(v, Warn) for v in on_text), case
    assert on_text[0].signals[0].format() == f"tail_repetition:{signal}text"
    assert on_thinking and isinstance(on_thinking[0], Resample), case
    assert on_thinking[0].signals[0].format() == f"tail_repetition:{signal}thinking"


@pytest.mark.parametrize(
    "settings",
    [
        {"max_threshold": "64"},  # read from a config file
        {"max_chars": None},
        {"max_chars": -1},
        {"every": "4"},
        {"every": True},
        {"logprob_run": 0},
        {"logprob_run": "24"},
        {"logprob_floor": "-6"},
        {"logprob_floor": float("nan")},
    ],
)
def test_doom_loop_settings_that_are_not_numbers_are_refused_when_the_policy_is_made(settings: dict[str, Any]) -> None:
    """Judgement: ``max_threshold``, ``max_chars``, ``every``, ``logprob_run`` and
    ``logprob_floor``. ``max_threshold="64"`` or ``logprob_floor="-6"`` made every judgement
    raise, which the engine logs and ignores: no loop was ever resampled."""
    with pytest.raises((TypeError, ValueError), match=next(iter(settings))):
        ConservativeDoomLoopPolicy(**settings)


def test_doom_loop_settings_at_their_least_are_accepted() -> None:
    policy = ConservativeDoomLoopPolicy(0, max_chars=0, every=1, logprob_run=1, logprob_floor=None)
    assert (policy.max_threshold, policy.max_chars, policy.every, policy.logprob_run) == (0, 0, 1, 1)
    assert ConservativeDoomLoopPolicy(logprob_floor=-3).logprob_floor == -3


DIGITS = str.maketrans("0123456789", "0000000000")


class CountersAsOne(ConservativeDoomLoopPolicy):
    """The page's example: reads every digit as 0."""

    def on_stream(self, event: StreamEvent) -> Verdict | None:
        if isinstance(event, StreamText):
            event = StreamText(event.index, event.text.translate(DIGITS))
        elif isinstance(event, StreamThinking):
            event = StreamThinking(event.index, event.thinking.translate(DIGITS))
        return super().on_stream(event)


def test_a_counter_that_changes_is_missed_and_caught_when_digits_read_as_one() -> None:
    """What an exact detector cannot catch: the snippet's printed lines."""
    paragraph = "The build failed again, so I will run the same command with the same flags"
    stream = "".join(f"{paragraph} (attempt {n}).\n" for n in range(1, 13))
    printed = []
    for policy in (ConservativeDoomLoopPolicy(), CountersAsOne()):
        said = verdicts(policy, stream, "thinking")
        printed.append(f"{type(policy).__name__} {said[0].signals[0].format() if said else 'no loop'}")
    assert printed == ["ConservativeDoomLoopPolicy no loop", "CountersAsOne tail_repetition:88@thinking"]


def test_a_unit_longer_than_the_window_is_missed_and_a_wider_window_reaches_it() -> None:
    """What an exact detector cannot catch: a 6 KB section written again is never two copies
    inside 4096 characters; ``detector={"window": 8192}`` reaches it, within 3 * window + 2 * anchor
    a channel."""
    rng = random.Random(6)
    words = ["plan", "the", "fix", "read", "file", "again", "check", "test", "build", "run", "step", "note"]
    unit = ""
    while len(unit) < 6000:
        unit += " ".join(rng.choice(words) for _ in range(10)) + f" ({len(unit)})\n"
    text = "Let me think this through.\n" + unit * 3
    assert verdicts(ConservativeDoomLoopPolicy(), text, "thinking", size=50) == []
    wide = ConservativeDoomLoopPolicy(detector={"window": 8192})
    said = verdicts(wide, text, "thinking", size=50)
    assert said and said[0].signals[0].format() == f"tail_repetition:{len(unit)}@thinking"
    assert len(wide.detectors["thinking"]._buf) <= 3 * 8192 + 2 * 16


# -- Stationarity ---------------------------------------------------------------------------------


class KeyOnly(StationarityPolicy):
    def key(self, call: ToolUseBlock, result: ToolResultBlock | None) -> Hashable:
        return call.name


async def test_a_stationarity_subclass_that_overrides_only_key_judges_nothing() -> None:
    """Stationarity: the base class judges nothing, whatever its key says."""
    model = ScriptedModel([calls("shell", command="true")] * 30 + ["done"])
    events = await collect(QueryEngine(model, tools=[shell], policies=[KeyOnly()]).run("wait"))
    assert end_of(events).reason == "completed" and end_of(events).turns == 31
    assert not any(isinstance(e, PolicyNudge) for e in events)


def test_signature_is_a_reduced_multiset_of_keys() -> None:
    """Stationarity: two identical calls in one response are ``({(key, 1)}, 2)``; a key's count
    in the response is ``n * copies``."""
    policy = KeyOnly()

    def response(*names: str) -> tuple[Message, list[ToolResultBlock]]:
        uses = [ToolUseBlock(id=f"c{i}", name=n, input={}) for i, n in enumerate(names)]
        return Message(role="assistant", content=uses), [ToolResultBlock(tool_use_id=u.id, content="ok") for u in uses]

    assert policy.signature(*response("ls", "ls")) == (frozenset({("ls", 1)}), 2)
    assert policy.signature(*response("ls", "cat", "ls", "ls", "ls", "cat")) == (frozenset({("ls", 2), ("cat", 1)}), 2)
    assert policy.signature(*response("ls", "cat", "ls")) == (frozenset({("ls", 2), ("cat", 1)}), 1)


class CycleOfToolNames(ToolCallCycle):
    def key(self, call: ToolUseBlock, result: ToolResultBlock | None) -> Hashable:
        return call.name


async def test_a_cycle_judged_by_a_key_of_ones_own_still_names_its_tools() -> None:
    """Stationarity, Opt-in: `key` is the one method to override, and the texts name the tools
    (``{tools}``). With a key that was not a tuple, ``ToolCallCycle`` named none: the turn ended
    with "a cycle of 2 tool-call steps () repeated 5 times"."""
    flip = [calls("open_file", path=f"{n}.py") if n % 2 else calls("shell", command=f"cat {n}") for n in range(20)]
    engine = QueryEngine(ScriptedModel(flip), tools=[open_file, shell], policies=[CycleOfToolNames()])
    events = await collect(engine.run("read them"))
    nudge = next(e for e in events if isinstance(e, PolicyNudge))
    assert "(open_file, shell)" in nudge.reminder
    end = end_of(events)
    assert (end.reason, end.turns) == ("stationarity_ended", 10)
    assert end.detail == "Stopped: a cycle of 2 tool-call steps (open_file, shell) repeated 5 times."


async def test_a_key_of_the_arguments_alone_ends_a_progressing_poll_at_the_twelfth() -> None:
    """Writing your own: "a `key` that returned the arguments alone would have ended it at the
    12th poll" (the build's log moves on at every poll, which the stock key sees)."""
    steps = iter(range(1, 100))

    @tool(name="shell", poller=True)
    async def poll_shell(command: str, max_seconds: float = 60) -> str:
        """Run a shell command."""
        return f"build.log: step {next(steps)} of 16"

    class ArgumentsAlone(IdenticalToolCallRun):
        def key(self, call: ToolUseBlock, result: ToolResultBlock | None) -> Hashable:
            return call.name, tuple(sorted((k, v) for k, v in call.input.items() if k != "max_seconds"))

    poll = [calls("shell", command="tail -1 build.log", max_seconds=t) for t in (30, 60) * 8]
    engine = QueryEngine(ScriptedModel([*poll, "The build is done."]), tools=[poll_shell], policies=[ArgumentsAlone()])
    end = end_of(await collect(engine.run("Wait for the build")))
    assert (end.reason, end.turns) == ("stationarity_ended", 12)


async def test_a_new_engine_over_the_transcript_counts_a_cut_pollers_results_by_what_it_holds() -> None:
    """Stationarity: a new engine over a saved transcript goes on counting where the run left
    off, except for a poller's results the transcript holds cut (its policies judged them whole,
    which the transcript no longer has): such a run starts again at the restart."""

    @tool(poller=True)
    async def status() -> str:
        """The status page."""
        return "queued\n" + "job: waiting\n" * 400

    def engine(limit: int, messages: Sequence[Message] = ()) -> QueryEngine:
        model = ScriptedModel([calls("status")], cycle=True)
        policy = IdenticalToolCallRun(nudge_at=None, end_at=5)
        return QueryEngine(model, tools=[status], policies=[policy], max_turns=3, max_tool_result_chars=limit, messages=messages)

    for limit, turns in ((100_000, 2), (1_000, 5)):
        first = engine(limit)
        assert end_of(await collect(first.run("wait for the job"))).reason == "max_turns"  # 3 polls
        restarted = engine(limit, list(first.messages))
        restarted.max_turns = None
        end = end_of(await collect(restarted.run()))
        assert (end.reason, end.turns) == ("stationarity_ended", turns), limit
