"""SPEC §6-7 end to end through the engine: doom-loop recovery and stationarity."""

from __future__ import annotations

import logging
import random
import sys
from collections.abc import Sequence
from itertools import pairwise
from types import FrameType

import pytest
from hypothesis import example, given, settings
from hypothesis import strategies as st

from agentloop import (
    AttemptDiscarded,
    DoomLoopDetected,
    DoomLoopSignal,
    InterjectionInjected,
    Message,
    ModelError,
    PolicyNudge,
    QueryEngine,
    Resampling,
    Retrying,
    ScriptedModel,
    ScriptedResponse,
    ScriptedToolCall,
    TextDelta,
    ThinkingDelta,
    ToolResultBlock,
    ToolUseBlock,
    TurnEnded,
    tool,
    validate_transcript,
)
from agentloop._detector import THINKING_RULES, WORDY_RULES, RepetitionDetector
from agentloop._model import (
    StreamBlockStop,
    StreamEnd,
    StreamEvent,
    StreamLogprobs,
    StreamSignals,
    StreamSignature,
    StreamText,
    StreamThinking,
    StreamToolInput,
    StreamToolUseStart,
    StreamUsage,
    Usage,
)
from agentloop._recovery import REPLAY_THINKING_BYTES, truncate_utf8
from agentloop.policies import (
    ConservativeDoomLoopPolicy,
    DoomLoopPolicy,
    EndTurn,
    IdenticalToolCallRun,
    Nudge,
    Policy,
    RepeatedErrorResult,
    Resample,
    Verdict,
    Warn,
    _Channel,
)
from tests.helpers import collect, kinds

CHANT = "I'll do it.\nI'll execute.\n" * 60
LOOPING = ScriptedResponse(thinking="Let me plan the fix first.\n" + CHANT, text="never shown", chunk=7)
GOOD = ScriptedResponse(thinking="A fresh plan.", text="Fixed it.")


def doom_engine(responses: list[object], **kw: object) -> QueryEngine:
    kw.setdefault("policies", [ConservativeDoomLoopPolicy()])
    kw.setdefault("retry_base_delay", 0.001)
    return QueryEngine(ScriptedModel(responses), **kw)  # type: ignore[arg-type]


def streamed_thinking(events: list[object]) -> int:
    return sum(len(e.thinking) for e in events if isinstance(e, ThinkingDelta))


async def test_doom_loop_confident_verdict_cuts_the_stream_and_resamples() -> None:
    engine = doom_engine([LOOPING, GOOD])
    events = await collect(engine, "fix it")
    names = kinds(events)
    assert names.index("DoomLoopDetected") < names.index("AttemptDiscarded") < names.index("Resampling")
    detected = next(e for e in events if isinstance(e, DoomLoopDetected))
    assert detected.confident and detected.action == "resample"
    assert detected.signals[0].kind == "tail_repetition" and detected.signals[0].channel == "thinking"
    assert streamed_thinking(events) < len(LOOPING.thinking) // 2  # cut early, not streamed to the end
    assert [e.attempt for e in events if isinstance(e, Resampling)] == [1]
    assert engine.last_turn_ended.reason == "completed"  # type: ignore[union-attr]


async def test_doom_loop_transcript_keeps_neither_reminder_nor_cut_attempt() -> None:
    engine = doom_engine([LOOPING, GOOD])
    await collect(engine, "fix it")
    assert [m.text for m in engine.messages] == ["fix it", "Fixed it."]
    assert all("I'll execute." not in str(m.content) for m in engine.messages)
    assert validate_transcript(engine.messages) == []


async def test_doom_loop_resample_request_carries_the_reminder_and_the_replay() -> None:
    engine = doom_engine([LOOPING, GOOD])
    await collect(engine, "fix it")
    model = engine.model
    assert isinstance(model, ScriptedModel)
    retry = model.requests[1]
    reminder = retry.messages[-1]
    assert reminder.synthetic and reminder.kind == "doom_reminder"
    assert "judged to be a repetition loop" in reminder.text
    assert "<previous_reasoning>" in reminder.text and "Let me plan the fix first." in reminder.text
    assert retry.attempt == 1 and len(retry.messages) == len(model.requests[0].messages) + 1



async def test_doom_loop_replay_of_text_utf8_cannot_encode_is_scrubbed_not_raised() -> None:
    """A model of the host's that streams a lone surrogate (a name decoded with surrogateescape,
    half an emoji) in a looping attempt: the replay gets U+FFFD, the run does not raise."""
    looping = ScriptedResponse(thinking="Let me open caf\udce9.txt first.\n" + CHANT, text="never shown", chunk=7)
    engine = doom_engine([looping, GOOD])
    events = await collect(engine, "fix it")
    assert engine.last_turn_ended is not None and engine.last_turn_ended.reason == "completed"
    assert any(isinstance(e, Resampling) for e in events)
    model = engine.model
    assert isinstance(model, ScriptedModel)
    reminder = model.requests[1].messages[-1].text
    assert "Let me open caf\ufffd.txt first." in reminder
    reminder.encode("utf-8")

async def test_doom_loop_replay_is_skipped_when_the_attempt_made_tool_calls() -> None:
    chant = [StreamThinking(1, CHANT[i : i + 7]) for i in range(0, len(CHANT), 7)]
    head = [StreamToolUseStart(0, "c1", "t"), StreamToolInput(0, "{}"), StreamBlockStop(0)]
    looping_with_call = ScriptedResponse(events=[*head, *chant, StreamEnd(stop_reason="tool_use")])
    engine = doom_engine([looping_with_call, GOOD])
    await collect(engine, "go")
    model = engine.model
    assert isinstance(model, ScriptedModel)
    assert "<previous_reasoning>" not in model.requests[1].messages[-1].text


def test_doom_loop_replay_is_cut_on_character_boundaries() -> None:
    text = "é" * (REPLAY_THINKING_BYTES)  # two bytes each
    cut = truncate_utf8(text, REPLAY_THINKING_BYTES)
    assert len(cut.encode()) <= REPLAY_THINKING_BYTES and cut == "é" * (REPLAY_THINKING_BYTES // 2)
    assert truncate_utf8("short", 10) == "short"


async def test_doom_budget_spent_disarms_and_accepts_the_next_attempt() -> None:
    engine = doom_engine([LOOPING, LOOPING, LOOPING, GOOD], doom_budget=2)
    events = await collect(engine, "go")
    actions = [e.action for e in events if isinstance(e, DoomLoopDetected) and e.confident]
    assert actions == ["resample", "resample", "disarmed"]
    # the third attempt was not cut: its full (looping) output is accepted
    assert engine.messages[-1].text == "never shown"
    assert engine.last_turn_ended.reason == "completed"  # type: ignore[union-attr]


async def test_doom_budget_never_consumes_the_retry_budget() -> None:
    flaky = ScriptedResponse(error=ModelError("overloaded", retryable=True))
    engine = doom_engine([LOOPING, LOOPING, flaky, GOOD], doom_budget=2, retry_budget=1)
    events = await collect(engine, "go")
    assert len([e for e in events if isinstance(e, Resampling)]) == 2
    assert len([e for e in events if isinstance(e, Retrying)]) == 1
    assert engine.last_turn_ended.reason == "completed"  # type: ignore[union-attr]


async def test_retry_budget_never_consumes_the_doom_budget() -> None:
    flaky = ScriptedResponse(error=ModelError("overloaded", retryable=True))
    engine = doom_engine([flaky, flaky, LOOPING, GOOD], doom_budget=1, retry_budget=2)
    events = await collect(engine, "go")
    assert len([e for e in events if isinstance(e, Retrying)]) == 2
    assert [e.action for e in events if isinstance(e, DoomLoopDetected) and e.confident] == ["resample"]
    assert engine.messages[-1].text == "Fixed it."


@pytest.mark.parametrize("how", ["argument", "environment"])
async def test_doom_loop_recovery_can_be_switched_off(how: str, monkeypatch: pytest.MonkeyPatch) -> None:
    kw: dict[str, object] = {}
    if how == "argument":
        kw["doom_loop_recovery"] = False
    else:
        monkeypatch.setenv("AGENTLOOP_DOOM_LOOP_RECOVERY", "false")
    engine = doom_engine([LOOPING, GOOD], **kw)
    events = await collect(engine, "go")
    assert not any(isinstance(e, (Resampling, AttemptDiscarded)) for e in events)
    assert {e.action for e in events if isinstance(e, DoomLoopDetected) and e.confident} == {"off"}
    assert engine.messages[-1].text == "never shown"


async def test_doom_loop_recovery_can_be_switched_off_by_a_policy() -> None:
    class Observe(ConservativeDoomLoopPolicy):
        def judge(self, signal: object) -> str:  # type: ignore[override]
            return "ignore"

    engine = doom_engine([LOOPING, GOOD], policies=[Observe()])
    events = await collect(engine, "go")
    assert not any(isinstance(e, DoomLoopDetected) for e in events)


async def test_server_signals_drive_the_same_policy() -> None:
    frames = [
        StreamText(0, "partial "),
        StreamSignals(("low_logprob@text",)),
        StreamSignals(("low_logprob@text", "tail_repetition:32@thinking")),
        StreamText(0, "more"),
        StreamEnd(stop_reason="end_turn"),
    ]
    engine = doom_engine([ScriptedResponse(events=frames), GOOD])
    events = await collect(engine, "go")
    found = [e for e in events if isinstance(e, DoomLoopDetected)]
    assert [(e.confident, e.action) for e in found] == [(False, "warn"), (True, "resample")]
    assert found[1].signals[-1].unit == "tokens" and found[1].signals[-1].threshold == 32


class Shouts(Policy):
    """Warns on every text delta (a stream watcher that never resamples)."""

    def on_stream(self, event: StreamEvent) -> Verdict | None:
        return Warn(()) if isinstance(event, StreamText) else None


class Breaks(Policy):
    def on_stream(self, event: StreamEvent) -> Verdict | None:
        raise RuntimeError("a bug in a host policy")


async def test_several_stream_policies_resample_wins_and_is_credited_to_its_policy() -> None:
    engine = doom_engine([LOOPING, GOOD], policies=[Shouts(), Breaks(), ConservativeDoomLoopPolicy()])
    events = await collect(engine, "go")
    found = [e for e in events if isinstance(e, DoomLoopDetected)]
    resample = next(e for e in found if e.action == "resample")
    assert resample.policy == "ConservativeDoomLoopPolicy" and resample.confident
    assert {e.policy for e in found if not e.confident} == {"Shouts"}
    assert engine.last_turn_ended.reason == "completed"  # type: ignore[union-attr]
    assert [m.text for m in engine.messages] == ["go", "Fixed it."]


@pytest.mark.parametrize("alone", [True, False])
async def test_a_stream_policy_that_raises_is_logged_and_ignored(alone: bool, caplog: pytest.LogCaptureFixture) -> None:
    policies: list[Policy] = [Breaks()] if alone else [Breaks(), ConservativeDoomLoopPolicy()]
    engine = doom_engine([GOOD], policies=policies)
    events = await collect(engine, "go")
    assert not any(isinstance(e, DoomLoopDetected) for e in events)
    assert engine.messages[-1].text == "Fixed it."
    assert "policy Breaks.on_stream raised; ignored" in caplog.text


@pytest.mark.parametrize("hook", ["begin_turn", "begin_attempt"])
async def test_a_policy_whose_begin_hook_raises_is_logged_and_ignored(hook: str, caplog: pytest.LogCaptureFixture) -> None:
    """Like a verdict hook, a begin hook that raises must not end the run without a terminal, nor
    leave an interjection in the transcript without its InterjectionInjected receipt."""

    class Broken(Policy):
        def begin_turn(self, *, real_user: bool) -> None:
            if hook == "begin_turn":
                raise RuntimeError("policy bug")

        def begin_attempt(self) -> None:
            if hook == "begin_attempt":
                raise RuntimeError("policy bug")

    calling = ScriptedResponse(tool_calls=[ScriptedToolCall("read_file", {"path": "a.py"})])
    engine = doom_engine([calling, GOOD], policies=[Broken()], tools=[read_file])
    events = []
    receipt = ""
    async for ev in engine.run("go"):
        events.append(ev)
        if ev.type == "tool_call_started":
            receipt = engine.interject("also check b.py")
    assert [e.ids for e in events if isinstance(e, InterjectionInjected)] == [(receipt,)]
    assert isinstance(events[-1], TurnEnded) and events[-1].reason == "completed"
    assert engine.messages[-1].text == "Fixed it." and validate_transcript(engine.messages) == []
    assert f"policy Broken.{hook} raised; ignored" in caplog.text


async def test_a_stream_policy_sees_every_stream_event_of_the_attempt() -> None:
    seen: list[type] = []

    class Watch(Policy):
        def on_stream(self, event: StreamEvent) -> Verdict | None:
            seen.append(type(event))
            return None

    frames = [
        StreamText(0, "checking"),
        StreamBlockStop(0),
        StreamToolUseStart(1, "t1", "read_file"),
        StreamToolInput(1, '{"path": "a.py"}'),
        StreamBlockStop(1),
        StreamEnd(stop_reason="tool_use"),
    ]
    engine = doom_engine([ScriptedResponse(events=frames), GOOD], policies=[Watch()], tools=[read_file])
    await collect(engine, "go")
    assert seen[: len(frames)] == [type(f) for f in frames]  # tool input and block ends too, not only text


class Untapped(ConservativeDoomLoopPolicy):
    """The stock policy, taking every event through ``on_stream`` (an override: the engine then
    calls it once per event rather than reading the deltas from its accumulator)."""

    def on_stream(self, event: StreamEvent) -> Verdict | None:
        return super().on_stream(event)


async def _python_calls_into(module_file: str, engine: QueryEngine) -> int:
    calls = 0

    def profile(frame: FrameType, event: str, arg: object) -> None:
        nonlocal calls
        # Calls from outside the module only: how often the engine enters it.
        if event == "call" and frame.f_code.co_filename == module_file and frame.f_back is not None:
            calls += frame.f_back.f_code.co_filename != module_file

    sys.setprofile(profile)
    try:
        await collect(engine, "go")
    finally:
        sys.setprofile(None)
    return calls


async def test_the_engine_hands_the_stock_policy_one_delta_in_every() -> None:
    """The accumulator holds the deltas anyway: the stock doom-loop policy reads them there, and
    the engine calls into it for one text delta in ``every`` (and for the other events), not
    for each (400 calls and more before)."""
    import agentloop.policies

    deltas = [f"line {i} of a report that does not repeat itself; " for i in range(400)]
    frames: list[StreamEvent] = [StreamText(0, d) for d in deltas] + [StreamBlockStop(0), StreamEnd("end_turn")]
    for every in (1, 4, 8):
        policy = ConservativeDoomLoopPolicy(every=every)
        engine = doom_engine([ScriptedResponse(events=frames)], policies=[policy])
        calls = await _python_calls_into(agentloop.policies.__file__, engine)
        assert engine.messages[-1].text == "".join(deltas).rstrip()
        assert policy.detectors["text"].chars == len("".join(deltas))  # every delta read, once
        assert calls <= len(deltas) // every + 10, (every, calls)
        assert policy._blocks is None  # the response is the transcript's now: its deltas are let go


def _looping_frames(seed: int, channel: str) -> list[StreamEvent]:
    """Prose, then a loop, on one channel, in random deltas, with the other events a provider
    sends interleaved (usage, log probabilities, a server frame)."""
    rnd = random.Random(seed)
    unit = "".join(rnd.choice("abcdefghij klmnop,.") for _ in range(rnd.choice([20, 37, 90, 300])))
    text = "We read the configuration first, then plan the change. " * 3 + unit * 12
    frames: list[StreamEvent] = [StreamUsage(Usage(5, 1))]
    i = 0
    while i < len(text):
        k = rnd.randint(1, 60)
        piece = text[i : i + k]
        frames.append(StreamThinking(0, piece) if channel == "thinking" else StreamText(0, piece))
        if rnd.random() < 0.05:
            frames.append(StreamLogprobs(channel, (-0.1, -0.2)))  # type: ignore[arg-type]
        if rnd.random() < 0.02:
            frames.append(StreamSignals(("low_logprob@text",)))
        i += k
    if channel == "thinking":
        frames.append(StreamSignature(0, "sig"))
    return [*frames, StreamBlockStop(0), StreamEnd("end_turn")]


@settings(max_examples=25, deadline=None)
@given(st.integers(0, 2**32), st.sampled_from(["thinking", "text"]), st.sampled_from([1, 3, 4]))
async def test_reading_the_deltas_from_the_accumulator_changes_no_verdict(seed: int, channel: str, every: int) -> None:
    """The stock policy tapped by the engine and its twin that takes every event: the same
    events, the same doom-loop verdicts at the same places in the stream, the same outcome."""
    frames = _looping_frames(seed, channel)
    runs = []
    for policy in (ConservativeDoomLoopPolicy(every=every), Untapped(every=every)):
        engine = doom_engine([ScriptedResponse(events=frames), GOOD], policies=[policy])
        events = await collect(engine, "go")
        runs.append(
            (
                kinds(events),
                [(e.action, e.confident, [s.format() for s in e.signals]) for e in events if isinstance(e, DoomLoopDetected)],
                [m.text for m in engine.messages],
            )
        )
    assert runs[0] == runs[1]
    assert runs[0][1]  # the loop was seen


def _two_channel_frames(seed: int, how: str) -> list[StreamEvent]:
    """A thinking block and a text block, each looping, in random deltas: one block after the
    other ("sequential"), their deltas interleaved at random ("interleaved"), or the same text
    and deltas on both, alternating ("twin": both detectors fire at the same hand-over)."""
    rnd = random.Random(seed)
    texts = []
    for _ in range(2):
        unit = "".join(rnd.choice("abcdefgh ijk,.") for _ in range(rnd.choice([17, 40, 90])))
        texts.append("First we look at the inputs, then we decide. " * 2 + unit * 10)
    cuts = [0]
    while cuts[-1] < max(map(len, texts)):
        cuts.append(cuts[-1] + rnd.randint(1, 50))
    if how == "twin":
        texts[1] = texts[0]
    pieces = [[t[a:b] for a, b in pairwise(cuts) if t[a:b]] for t in texts]
    thinking = [StreamThinking(0, piece) for piece in pieces[0]]
    text = [StreamText(1, piece) for piece in pieces[1]]
    if how == "sequential":
        frames = [*thinking, StreamSignature(0, "sig"), StreamBlockStop(0), *text]
    else:
        frames = []
        while thinking or text:
            side = thinking if thinking and (how == "twin" or not text or rnd.random() < 0.5) else text
            frames.append(side.pop(0))
            if how == "twin" and text:
                frames.append(text.pop(0))
    return [*frames, StreamBlockStop(0), StreamBlockStop(1), StreamEnd("end_turn")]


class LooksAtBoth(DoomLoopPolicy):
    """The base policy (it warns on everything), tapped, but looking at both channels at each
    hand-over, as if each had a block from the start."""

    @property  # type: ignore[override]
    def _feeding(self) -> tuple[_Channel, ...]:
        return tuple(ch for ch in (self._text, self._thinking) if ch is not None)

    @_feeding.setter
    def _feeding(self, channels: tuple[_Channel, ...]) -> None:
        pass


@settings(max_examples=25, deadline=None)
@given(st.integers(0, 2**32), st.sampled_from(["sequential", "interleaved", "twin"]), st.sampled_from([1, 3, 4]))
@example(1, "twin", 4)  # both channels fire in one hand-over
async def test_a_tapped_policy_looks_only_at_the_channels_that_stream(seed: int, how: str, every: int) -> None:
    """Thinking and text streamed in one response: the tapped policy, which looks only at the
    channels that have a block, judges both as one that looks at both channels each time, with
    the signals of a hand-over that fires on both in the same order (both channels get the same
    thresholds, so that a "twin" stream fires on both at once)."""
    frames = _two_channel_frames(seed, how)
    same = {"rules": THINKING_RULES, "wordy_rule": WORDY_RULES["thinking"]}
    runs = []
    for policy in (DoomLoopPolicy(every=every, detector=same), LooksAtBoth(every=every, detector=same)):
        engine = doom_engine([ScriptedResponse(events=frames), GOOD], policies=[policy])
        events = await collect(engine, "go")
        runs.append(
            (
                kinds(events),
                [(e.action, [s.format() for s in e.signals]) for e in events if isinstance(e, DoomLoopDetected)],
                {ch: det.chars for ch, det in policy.detectors.items()},
            )
        )
    assert runs[0] == runs[1]
    assert {s.split("@")[1] for _, signals in runs[0][1] for s in signals} == {"thinking", "text"}


async def test_a_tapped_policy_follows_the_stream_from_block_to_block() -> None:
    """Text blocks around a tool call, the second one looping: the deltas of each block reach
    the text detector in the order they came, whatever the engine held back between them."""
    unit = "Checking the file again before the next step. "
    frames: list[StreamEvent] = [
        StreamThinking(0, "Plan: read the file."),
        StreamSignature(0, "sig"),
        StreamBlockStop(0),
        StreamText(1, "Reading "),
        StreamText(2, "it."),  # a second text block of one delta, inside one held-back stretch
        StreamBlockStop(1),
        StreamBlockStop(2),
        StreamToolUseStart(3, "t1", "read_file"),
        StreamToolInput(3, '{"path": '),
        StreamToolInput(3, '"a.py"}'),
        StreamBlockStop(3),
        *[StreamText(4, unit[i : i + 5]) for i in range(0, len(unit), 5)] * 8,
        StreamBlockStop(4),
        StreamEnd(stop_reason="tool_use"),
    ]

    class Counts(DoomLoopPolicy):
        """Notes how much text the detector had read when the next attempt starts."""

        read: list[int]

        def begin_attempt(self) -> None:
            self.read = [*getattr(self, "read", []), self.detectors["text"].chars]
            super().begin_attempt()

    class CountsUntapped(Counts):
        def on_stream(self, event: StreamEvent) -> Verdict | None:
            return super().on_stream(event)

    results = []
    for policy in (Counts(), CountsUntapped()):
        engine = doom_engine([ScriptedResponse(events=frames), GOOD], policies=[policy], tools=[read_file])
        events = await collect(engine, "go")
        results.append([s.format() for e in events if isinstance(e, DoomLoopDetected) for s in e.signals])
        assert policy.read[1] == len("Reading it.") + 8 * len(unit)  # every text delta, none twice
    n = len(unit)
    assert results[0] == results[1] == [f"tail_repetition:{n}@text", f"exact_repetition:{n}x4@text", f"exact_repetition:{n}x8@text"]


async def test_the_stock_policy_forked_in_the_middle_of_a_stream_takes_nothing_of_the_run() -> None:
    """A host may make a subagent at any event, a delta included, while the stock policy is reading
    the stream from the engine's accumulator: the copy holds nothing of the run (its model phase,
    its task), and watches the child's stream on its own."""
    engine = doom_engine([LOOPING, GOOD, ScriptedResponse(thinking="Plan.\n" + CHANT, chunk=7), GOOD])
    children = []
    async for event in engine.run("go"):
        if isinstance(event, ThinkingDelta) and not children:
            children.append(engine.subagent(agent_id="child"))
    assert engine.messages[-1].text == "Fixed it."
    child = children[0]
    twin = child.policies[0]
    assert isinstance(twin, ConservativeDoomLoopPolicy) and twin is not engine.policies[0]
    events = await collect(child, "and you?")
    assert [e.action for e in events if isinstance(e, DoomLoopDetected)] == ["resample"]
    assert child.messages[-1].text == "Fixed it."


# -- stationarity ---------------------------------------------------------------------------


@tool
async def read_file(path: str) -> str:
    return "same content"


@tool(stationarity="tight")
async def todo(items: list[str]) -> str:
    return "ok"


def same_call(name: str = "read_file", **args: object) -> ScriptedResponse:
    return ScriptedResponse(tool_calls=[ScriptedToolCall(name, args or {"path": "a.py"})])


async def test_stationarity_nudges_at_8_and_ends_at_12_with_a_distinct_terminal() -> None:
    engine = QueryEngine(ScriptedModel([same_call()] * 20), tools=[read_file], policies=[IdenticalToolCallRun()])
    events = await collect(engine, "go")
    nudges = [e for e in events if isinstance(e, PolicyNudge)]
    assert len(nudges) == 1 and nudges[0].policy == "IdenticalToolCallRun"
    end = events[-1]
    assert isinstance(end, TurnEnded) and end.reason == "stationarity_ended" and end.turns == 12
    nudge_at = next(i for i, m in enumerate(engine.messages) if m.kind == "nudge")
    assert sum(1 for m in engine.messages[:nudge_at] if m.role == "assistant") == 8
    assert validate_transcript(engine.messages) == []


@pytest.mark.parametrize("changes", [True, False])
async def test_a_pollers_progress_in_the_part_of_its_result_that_is_cut_still_counts(changes: bool) -> None:
    """A long status page polled until one job in the middle finishes: the transcript holds each
    result cut (head and tail, the same length each time), but the policy judges it whole."""
    polls = iter(range(100))

    @tool(poller=True)
    async def status() -> str:
        """The status page."""
        n = next(polls) if changes else 0
        return "job 0: done\n" * 40 + f"job 41: running {n:06d}\n" + "job 42: done\n" * 40

    engine = QueryEngine(
        ScriptedModel([ScriptedResponse(tool_calls=[ScriptedToolCall("status", {})])] * 14 + ["all done"]),
        tools=[status],
        policies=[IdenticalToolCallRun()],
        max_tool_result_chars=200,
    )
    events = await collect(engine, "wait for the jobs")
    assert all("cut here" in r.text for m in engine.messages for r in m.tool_results)
    end = events[-1]
    assert isinstance(end, TurnEnded)
    if changes:  # progress every time: neither nudged nor stopped
        assert end.reason == "completed" and not [e for e in events if isinstance(e, PolicyNudge)]
    else:
        assert end.reason == "stationarity_ended" and end.turns == 12


async def test_stationarity_tight_tools_use_4_and_8() -> None:
    engine = QueryEngine(
        ScriptedModel([same_call("todo", items=["x"])] * 20), tools=[todo], policies=[IdenticalToolCallRun()]
    )
    events = await collect(engine, "go")
    assert events[-1].reason == "stationarity_ended" and events[-1].turns == 8  # type: ignore[union-attr]


@pytest.mark.parametrize("how", ["watch_tools", "subagent"])
async def test_a_tool_that_is_no_longer_tight_gets_the_normal_thresholds(how: str) -> None:
    """The tight class follows the tools an engine has now: a tool server that redeclares its
    `todo` tool as normal, or a subagent given its own normal `todo`, is not ended at 8."""

    @tool(name="todo")
    async def plain_todo(items: list[str]) -> str:
        return "ok"

    calls = [same_call("todo", items=["x"])] * 20
    if how == "watch_tools":
        engine = QueryEngine(ScriptedModel(calls), tools=[todo], policies=[IdenticalToolCallRun()])
        engine.watch_tools(lambda tools: [plain_todo])
    else:
        parent = QueryEngine(ScriptedModel(calls), tools=[todo], policies=[IdenticalToolCallRun()])
        engine = parent.subagent(agent_id="sub-1", tools=[plain_todo])
    events = await collect(engine, "go")
    assert events[-1].reason == "stationarity_ended" and events[-1].turns == 12  # type: ignore[union-attr]


async def test_stationarity_counters_reset_at_a_real_user_message_not_at_nudges() -> None:
    engine = QueryEngine(ScriptedModel([same_call()] * 30), tools=[read_file], policies=[IdenticalToolCallRun()], max_turns=7)
    await collect(engine, "go")  # 7 identical responses: below the nudge threshold
    events = await collect(engine, "continue")  # a real user message: counting starts again
    assert not any(isinstance(e, PolicyNudge) for e in events)
    assert events[-1].reason == "max_turns"  # type: ignore[union-attr]



async def test_stationarity_a_resume_without_a_new_message_keeps_the_count() -> None:
    # run(None) continues the transcript: no one asked for anything new, so a headless host that
    # resumes after stationarity_ended must not hand the loop a fresh allowance of 12 calls.
    engine = QueryEngine(ScriptedModel([same_call()] * 40), tools=[read_file], policies=[IdenticalToolCallRun()])
    first = await collect(engine, "go")
    assert first[-1].reason == "stationarity_ended" and first[-1].turns == 12  # type: ignore[union-attr]
    again = await collect(engine)
    assert again[-1].reason == "stationarity_ended" and again[-1].turns == 1  # type: ignore[union-attr]
    fresh = await collect(engine, "try another way")  # a real user message: counting starts again
    assert fresh[-1].reason == "stationarity_ended" and fresh[-1].turns == 12  # type: ignore[union-attr]
    engine.messages.append(Message.user("and now?"))  # a person's message the host added itself
    by_hand = await collect(engine)
    assert by_hand[-1].reason == "stationarity_ended" and by_hand[-1].turns == 12  # type: ignore[union-attr]
    assert validate_transcript(engine.messages) == []


async def test_stationarity_a_synthetic_prompt_is_not_a_person_and_keeps_the_count() -> None:
    """A headless harness that answers ``stationarity_ended`` with an automatic "Continue." marks
    it ``synthetic`` (no person wrote it): as when it appends one and resumes, the counts go on,
    so the loop is stopped at the next identical call, not given a fresh allowance of twelve."""
    auto = Message.user("Continue.", synthetic=True, kind="auto_continue")
    for how in ("prompt", "appended"):
        engine = QueryEngine(ScriptedModel([same_call()] * 40), tools=[read_file], policies=[IdenticalToolCallRun()])
        first = await collect(engine, "go")
        assert first[-1].reason == "stationarity_ended" and first[-1].turns == 12  # type: ignore[union-attr]
        if how == "prompt":
            again = await collect(engine, auto)
        else:
            engine.messages.append(auto)
            again = await collect(engine)
        assert again[-1].reason == "stationarity_ended" and again[-1].turns == 1, how  # type: ignore[union-attr]
        assert validate_transcript(engine.messages) == []


@pytest.mark.parametrize("how", ["synthetic prompt", "resumed transcript"])
async def test_stationarity_a_subagent_starts_with_none_of_its_parents_counts(how: str) -> None:
    """`subagent()` forks the parent's policies: the fork is fresh, so a child that starts with
    nothing a person wrote (a prompt marked synthetic, a transcript it resumes) does not inherit
    the parent's run of seven identical calls and get nudged at its own first call."""
    parent = QueryEngine(ScriptedModel([same_call()] * 7), tools=[read_file], policies=[IdenticalToolCallRun()], max_turns=7)
    await collect(parent, "go")  # seven identical calls: one short of the nudge
    child_model = ScriptedModel([same_call()] * 20)
    if how == "synthetic prompt":
        child = parent.subagent(agent_id="helper", model=child_model, max_turns=None)
        events = await collect(child, Message.user("Carry on.", synthetic=True))
    else:
        call = ScriptedToolCall("read_file", {"path": "a.py"})  # the child's own first call of the run
        history = [
            Message.user("read a.py"),
            Message(role="assistant", content=[ToolUseBlock(id="c1", name=call.name, input=call.input)]),
            Message(role="user", content=[ToolResultBlock(tool_use_id="c1", content="b")]),
        ]
        child = parent.subagent(agent_id="helper", model=child_model, messages=history, max_turns=None)
        events = await collect(child)
    own = 0 if how == "synthetic prompt" else 1  # calls of the run the child had made already
    nudges = [e for e in events if isinstance(e, PolicyNudge)]
    assert len(nudges) == 1 and "8 times" in nudges[0].reminder
    assert events[-1].reason == "stationarity_ended" and events[-1].turns == 12 - own  # type: ignore[union-attr]


async def test_stationarity_a_new_engine_resuming_the_transcript_keeps_the_count() -> None:
    # A headless worker restarted after stationarity_ended (a new engine, new policies, the
    # saved transcript): the policies catch up on the calls since the last person's message.
    first = QueryEngine(ScriptedModel([same_call()] * 40), tools=[read_file], policies=[IdenticalToolCallRun()])
    ended = await collect(first, "go")
    assert ended[-1].reason == "stationarity_ended" and ended[-1].turns == 12  # type: ignore[union-attr]

    def restarted() -> QueryEngine:
        return QueryEngine(
            ScriptedModel([same_call()] * 40), tools=[read_file], messages=list(first.messages),
            policies=[IdenticalToolCallRun()],
        )  # fmt: skip

    again = await collect(restarted())
    assert again[-1].reason == "stationarity_ended" and again[-1].turns == 1  # type: ignore[union-attr]
    asked = await collect(restarted(), "try another way")  # a person's new request: a fresh count
    assert asked[-1].reason == "stationarity_ended" and asked[-1].turns == 12  # type: ignore[union-attr]
    by_hand = restarted()
    by_hand.messages.append(Message.user("and now?"))  # a person's message the host added itself
    events = await collect(by_hand)
    assert events[-1].reason == "stationarity_ended" and events[-1].turns == 12  # type: ignore[union-attr]
    assert not any(isinstance(e, PolicyNudge) for e in again)  # caught up quietly: no repeated nudge
    assert validate_transcript(by_hand.messages) == []


@pytest.mark.parametrize("tools_change", [False, True])
async def test_a_new_engine_resuming_below_the_nudge_threshold_nudges_on_time(tools_change: bool) -> None:
    first = QueryEngine(ScriptedModel([same_call()] * 5), tools=[read_file], policies=[IdenticalToolCallRun()], max_turns=5)
    await collect(first, "go")  # 5 identical calls, then max_turns
    engine = QueryEngine(
        ScriptedModel([same_call()] * 40), tools=[read_file], messages=list(first.messages),
        policies=[IdenticalToolCallRun()],
    )  # fmt: skip
    if tools_change:  # the tool set is replaced before every request: the policies are bound again, not caught up again
        engine.watch_tools(lambda tools: list(tools.values()))
    events = await collect(engine)
    nudges = [i for i, e in enumerate(events) if isinstance(e, PolicyNudge)]
    assert len(nudges) == 1
    assert events[-1].reason == "stationarity_ended" and events[-1].turns == 7  # type: ignore[union-attr]


async def test_stationarity_is_not_fooled_by_varying_text_around_an_identical_call() -> None:
    responses = [
        ScriptedResponse(text=f"Attempt {i}: let me read it again.", tool_calls=[ScriptedToolCall("read_file", {"path": "a.py"})])
        for i in range(20)
    ]
    engine = QueryEngine(ScriptedModel(responses), tools=[read_file], policies=[IdenticalToolCallRun()])
    events = await collect(engine, "go")
    assert events[-1].reason == "stationarity_ended"  # type: ignore[union-attr]


async def test_stationarity_batch_work_over_different_arguments_is_not_a_loop() -> None:
    responses: list[object] = [same_call(path=f"file{i}.py") for i in range(15)] + ["done"]
    engine = QueryEngine(ScriptedModel(responses), tools=[read_file], policies=[IdenticalToolCallRun()])
    events = await collect(engine, "go")
    assert events[-1].reason == "completed"  # type: ignore[union-attr]
    assert not any(isinstance(e, PolicyNudge) for e in events)


async def test_default_policies_are_used_when_none_given() -> None:
    engine = QueryEngine(ScriptedModel(["hi"]))
    names = [type(p).__name__ for p in engine.policies]
    assert names == ["ConservativeDoomLoopPolicy", "IdenticalToolCallRun"]
    await collect(engine, Message.user("hello"))


@tool
async def run_tests() -> str:
    raise RuntimeError("3 tests failed")


async def test_policies_that_disagree_end_the_turn_without_a_nudge_after_it() -> None:
    """Four identical failing calls per response: `RepeatedErrorResult` ends the turn on the second
    response, where `IdenticalToolCallRun` nudges. The turn ends; no reminder is left behind for
    a model that will not read it (it would be sent, stale, before the user's next message)."""
    four = ScriptedResponse(tool_calls=[ScriptedToolCall("run_tests", {})] * 4)
    engine = QueryEngine(
        ScriptedModel([four] * 5), tools=[run_tests], policies=[IdenticalToolCallRun(), RepeatedErrorResult()]
    )
    events = await collect(engine, "go")
    end = events[-1]
    assert isinstance(end, TurnEnded) and end.reason == "stationarity_ended" and end.turns == 2
    assert end.detail is not None and "returned the same error 8 times" in end.detail
    nudges = [e.policy for e in events if isinstance(e, PolicyNudge)]
    assert nudges == ["RepeatedErrorResult"]  # the first response's, before the turn ended
    assert engine.messages[-1].kind == "tool_results"
    assert validate_transcript(engine.messages) == []


async def test_when_several_policies_end_the_turn_the_first_one_speaks() -> None:
    class Stop(Policy):
        def __init__(self, text: str, hook: str) -> None:
            self.text, self.hook = text, hook

        def on_response(self, message: Message) -> Verdict | None:
            return EndTurn(self.text) if self.hook == "on_response" else None

        def on_results(self, message: Message, results: Sequence[ToolResultBlock]) -> Verdict | None:
            return EndTurn(self.text)

    for hook in ("on_response", "on_results"):
        policies: list[Policy] = [Stop("first", hook), Stop("second", hook)]
        engine = QueryEngine(ScriptedModel([same_call()] * 3), tools=[read_file], policies=policies)
        end = (await collect(engine, "go"))[-1]
        assert isinstance(end, TurnEnded) and end.reason == "stationarity_ended" and end.detail == "first", hook


class AskForTests(Policy):
    """Nudges a final answer that ran no tool (a host's own "check your work" policy)."""

    def on_response(self, message: Message) -> Verdict | None:
        return None if message.tool_uses else Nudge("Run the tests before you answer.")


async def test_a_nudge_on_a_final_answer_is_not_delivered_later_in_another_turn() -> None:
    engine = QueryEngine(
        ScriptedModel(["All done.", same_call(), "Read it."]), tools=[read_file], policies=[AskForTests()]
    )
    engine.follow_up("Now read a.py")
    events = await collect(engine, "Fix the bug")
    assert [e.reason for e in events if isinstance(e, TurnEnded)] == ["completed", "completed"]
    # the first turn ended with the answer: no model was left to read the nudge, in any turn
    assert not any(m.kind == "nudge" for m in engine.messages), [m.text for m in engine.messages]
    assert not any(isinstance(e, PolicyNudge) for e in events)


async def test_a_nudge_on_an_answer_the_turn_goes_on_from_is_delivered_before_the_next_request() -> None:
    model = ScriptedModel(["All done.", "Tests pass."])
    engine = QueryEngine(model, policies=[AskForTests()])
    events: list[object] = []
    async for event in engine.run("Fix the bug"):
        events.append(event)
        if isinstance(event, TextDelta) and len(model.requests) == 1:
            engine.interject("and mind the docs")  # keeps the turn going after the first answer
    assert [e.reason for e in events if isinstance(e, TurnEnded)] == ["completed"]
    second = model.requests[1].messages
    assert [m.kind for m in second[-2:]] == ["interjection", "nudge"]  # as after tool results
    assert sum(isinstance(e, PolicyNudge) for e in events) == 1


async def test_a_nudge_due_when_the_turn_hits_its_limit_is_not_left_in_the_transcript() -> None:
    """The 8th identical response earns a nudge, but ``max_turns=8`` ends the turn before any
    request could carry it: it is not committed, to reach the model before the next prompt."""
    engine = QueryEngine(ScriptedModel([same_call()] * 20), tools=[read_file], policies=[IdenticalToolCallRun()], max_turns=8)
    events = await collect(engine, "go")
    assert events[-1].reason == "max_turns"  # type: ignore[union-attr]
    assert engine.messages[-1].kind == "tool_results"
    assert not any(m.kind == "nudge" for m in engine.messages)
    assert not any(isinstance(e, PolicyNudge) for e in events)
    # with a turn to spare, the same nudge goes before the 9th request
    engine = QueryEngine(ScriptedModel([same_call()] * 20), tools=[read_file], policies=[IdenticalToolCallRun()], max_turns=9)
    await collect(engine, "go")
    model = engine.model
    assert isinstance(model, ScriptedModel) and model.requests[8].messages[-1].kind == "nudge"


# -- budgets, composition and stream verdicts --------------------------------------------------


async def test_a_doom_budget_of_zero_never_resamples() -> None:
    """``doom_budget=0`` means no resample at all: the confident verdict is reported disarmed and
    the looping attempt is accepted, as when a larger budget is spent."""
    engine = doom_engine([LOOPING, GOOD], doom_budget=0)
    events = await collect(engine, "go")
    assert not any(isinstance(e, (Resampling, AttemptDiscarded)) for e in events)
    assert {e.action for e in events if isinstance(e, DoomLoopDetected) and e.confident} == {"disarmed"}
    assert engine.messages[-1].text == "never shown"
    model = engine.model
    assert isinstance(model, ScriptedModel) and len(model.requests) == 1


class CountsThinking(Policy):
    """A stream watcher that must see every thinking delta (it measures the reasoning)."""

    def __init__(self) -> None:
        self.seen = 0

    def on_stream(self, event: StreamEvent) -> Verdict | None:
        if isinstance(event, StreamThinking):
            self.seen += 1
        return None


@pytest.mark.parametrize("recovery", ["off", "budget spent"])
async def test_every_stream_watcher_sees_the_delta_another_ones_unacted_resample_came_on(recovery: str) -> None:
    """When recovery is off (or its budget spent) a Resample does not cut the stream, so the other
    watchers go on reading it: none may lose the delta the Resample came on."""
    counter = CountsThinking()
    kw: dict[str, object] = {"doom_loop_recovery": False} if recovery == "off" else {"doom_budget": 1}
    engine = doom_engine([LOOPING, LOOPING, GOOD], policies=[ConservativeDoomLoopPolicy(), counter], **kw)
    events = await collect(engine, "go")
    assert any(isinstance(e, DoomLoopDetected) and e.confident for e in events)
    assert counter.seen == sum(1 for e in events if isinstance(e, ThinkingDelta))


@pytest.mark.parametrize("alone", [True, False])
async def test_a_nudge_or_end_from_on_stream_is_not_reported_as_a_doom_loop(alone: bool) -> None:
    """Only Warn and Resample are acted on in ``on_stream``: any other verdict there is ignored,
    never turned into a DoomLoopDetected warning with no signals."""

    class Chatty(Policy):
        def on_stream(self, event: StreamEvent) -> Verdict | None:
            if isinstance(event, StreamText):
                return Nudge("keep it short") if event.text.startswith("F") else EndTurn("stop")
            return None

    policies: list[Policy] = [Chatty()] if alone else [Chatty(), CountsThinking()]
    engine = doom_engine([GOOD], policies=policies)
    events = await collect(engine, "go")
    assert not any(isinstance(e, DoomLoopDetected) for e in events)
    assert engine.last_turn_ended is not None and engine.last_turn_ended.reason == "completed"
    assert [m.text for m in engine.messages] == ["go", "Fixed it."]


@pytest.mark.parametrize("alone", [True, False])
@pytest.mark.parametrize("value", ["loop", True])
async def test_an_on_stream_that_returns_something_else_than_a_verdict_is_logged(
    alone: bool, value: object, caplog: pytest.LogCaptureFixture
) -> None:
    """``on_stream`` returning a string or a bool was ignored without a word, while the other
    hooks log such a return as a policy bug: the host could not tell its watcher from one that
    never fired. It is logged now, alone or beside another watcher, and still ignored."""

    class SaysLoop(Policy):
        def on_stream(self, event: StreamEvent) -> Verdict | None:
            return value if isinstance(event, StreamText) else None  # type: ignore[return-value]

    policies: list[Policy] = [SaysLoop()] if alone else [SaysLoop(), CountsThinking()]
    engine = doom_engine([GOOD], policies=policies)
    events = await collect(engine, "go")
    assert not any(isinstance(e, DoomLoopDetected) for e in events)
    assert engine.last_turn_ended is not None and engine.last_turn_ended.reason == "completed"
    assert [m.text for m in engine.messages] == ["go", "Fixed it."]
    assert f"SaysLoop.on_stream returned {value!r}, not a verdict" in caplog.text


def _says(name: str, verdict: Verdict) -> Policy:
    """A stream watcher called ``name`` that gives ``verdict`` on the response's first text delta."""

    class Says(Policy):
        said = False

        @property
        def name(self) -> str:
            return name

        def begin_attempt(self) -> None:
            self.said = False

        def on_stream(self, event: StreamEvent) -> Verdict | None:
            if isinstance(event, StreamText) and not self.said:
                self.said = True
                return verdict
            return None

    return Says()


def _signal(text: str) -> DoomLoopSignal:
    return DoomLoopSignal.parse(text, unit="chars")


@pytest.mark.parametrize("recovery", [True, False])
async def test_each_stream_policy_that_warns_on_an_event_is_reported(recovery: bool) -> None:
    """Two stream watchers warning on the same event: only the first warning was reported, so
    the second policy's signals never reached the host. Each policy's warning is reported now,
    in ``policies`` order, beside a Resample that cuts the attempt (which is reported once, by
    the first policy to give one) or that recovery off only reports."""
    first, second = Warn((_signal("low_logprob@text"),)), Warn((_signal("tail_repetition:9@text"),))
    cut, also = Resample((_signal("tail_repetition:40@text"),)), Resample((_signal("tail_repetition:12@text"),))
    policies = [
        _says("Quiet", Warn()),
        _says("First", first),
        _says("Cutter", cut),
        _says("Second", second),
        _says("AlsoCuts", also),
    ]
    engine = doom_engine([GOOD, GOOD], policies=policies, doom_loop_recovery=recovery, doom_budget=1)
    events = await collect(engine, "go")
    reported = [(e.policy, e.action, e.signals) for e in events if isinstance(e, DoomLoopDetected)]
    quiet, warned = ("Quiet", "warn", ()), ("First", "warn", first.signals)
    later, never = ("Second", "warn", second.signals), "disarmed" if recovery else "off"
    unarmed = [quiet, warned, ("Cutter", never, cut.signals), later, ("AlsoCuts", never, also.signals)]
    if recovery:  # the cut attempt, then the resample's, with the budget spent
        assert reported == [quiet, warned, later, ("Cutter", "resample", cut.signals), *unarmed]
    else:
        assert reported == unarmed
    assert engine.last_turn_ended is not None and engine.last_turn_ended.reason == "completed"
    assert [m.text for m in engine.messages] == ["go", "Fixed it."]


_VERDICTS = st.sampled_from(["none", "nudge", "end", "raise"])


@settings(max_examples=60, deadline=None)
@given(
    steps=st.lists(st.tuples(st.integers(0, 3), _VERDICTS, _VERDICTS), min_size=1, max_size=8),
    max_turns=st.one_of(st.none(), st.integers(1, 8)),
)
async def test_property_the_transcript_is_valid_after_every_verdict(
    steps: list[tuple[int, str, str]], max_turns: int | None
) -> None:
    """Random responses (0-3 parallel calls) and random verdicts from two hooks, a policy bug among
    them: the transcript is valid, each nudge reached a model, the first EndTurn ends the turn
    with ``stationarity_ended`` and its message."""

    class Scripted(Policy):
        def __init__(self) -> None:
            self.i = -1

        def answer(self, what: str, hook: str) -> Verdict | None:
            if what == "raise":
                raise RuntimeError("policy bug")
            if what == "nudge":
                return Nudge(f"{hook} nudge {self.i}")
            return EndTurn(f"{hook} end {self.i}") if what == "end" else None

        def step(self) -> tuple[int, str, str]:
            return steps[self.i] if self.i < len(steps) else (0, "none", "none")  # the final "done"

        def on_response(self, message: Message) -> Verdict | None:
            self.i += 1
            return self.answer(self.step()[1], "response")

        def on_results(self, message: Message, results: Sequence[ToolResultBlock]) -> Verdict | None:
            return self.answer(self.step()[2], "results")

    responses: list[object] = [
        ScriptedResponse(text=f"step {i}", tool_calls=[ScriptedToolCall("read_file", {"path": f"{i}.py"})] * n)
        for i, (n, _, _) in enumerate(steps)
    ]
    engine = QueryEngine(ScriptedModel([*responses, "done"]), tools=[read_file], policies=[Scripted()], max_turns=max_turns)
    events = await collect(engine, "go")
    assert validate_transcript(engine.messages) == []
    end = events[-1]
    assert isinstance(end, TurnEnded)
    expected = None
    for i, (n, on_response, on_results) in enumerate(steps[: end.turns]):
        if on_response == "end":
            expected = f"response end {i}"
        elif n and on_results == "end":
            expected = f"results end {i}"
        if expected or not n:
            break
    if expected is not None:
        assert (end.reason, end.detail) == ("stationarity_ended", expected)
    else:
        assert end.reason in ("completed", "max_turns")
    nudges = [i for i, m in enumerate(engine.messages) if m.kind == "nudge"]
    assert all(any(m.role == "assistant" for m in engine.messages[i:]) for i in nudges)  # a model read it
    assert len(nudges) == sum(isinstance(e, PolicyNudge) for e in events)


@pytest.mark.parametrize(
    ("value", "recovery"),
    [("false", False), ("0", False), (" No ", False), ("OFF", False), ("False", False),
     ("true", True), ("1", True), (" yes", True), ("", True)],
)
def test_the_recovery_environment_variable_reads_the_usual_spellings(
    value: str, recovery: bool, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    monkeypatch.setenv("AGENTLOOP_DOOM_LOOP_RECOVERY", value)
    assert doom_engine([GOOD]).options.doom_loop_recovery is recovery
    assert doom_engine([GOOD], doom_loop_recovery=not recovery).options.doom_loop_recovery is not recovery
    assert "AGENTLOOP_DOOM_LOOP_RECOVERY" not in caplog.text


@pytest.mark.parametrize("value", ["disabled", "n", "fasle", "2"])
def test_an_unknown_recovery_environment_value_is_logged_not_silently_taken_as_true(
    value: str, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    """A host that writes ``=disabled`` means off: recovery stays on (the safe default), but the
    log says the value was not understood, instead of nothing."""
    monkeypatch.setenv("AGENTLOOP_DOOM_LOOP_RECOVERY", value)
    assert doom_engine([GOOD]).options.doom_loop_recovery is True
    assert f"AGENTLOOP_DOOM_LOOP_RECOVERY={value!r} is not understood" in caplog.text
    caplog.clear()
    doom_engine([GOOD], doom_loop_recovery=False)  # the argument wins: the variable is not read
    assert caplog.text == ""


@pytest.mark.parametrize("hook", ["on_response", "on_results"])
async def test_verdict_texts_with_a_lone_surrogate_leave_a_valid_transcript(hook: str) -> None:
    """A host policy that quotes a tool's output (a file name decoded with surrogateescape) in its
    nudge or its end message: the transcript stays valid, and encodable, with U+FFFD instead."""

    class Quotes(Policy):
        def __init__(self) -> None:
            self.n = 0

        def verdict(self) -> Verdict:
            self.n += 1
            return Nudge("Stop reading caf\udce9.txt") if self.n == 1 else EndTurn("caf\udce9.txt again")

        def on_response(self, message: Message) -> Verdict | None:
            return self.verdict() if hook == "on_response" and message.tool_uses else None

        def on_results(self, message: Message, results: Sequence[ToolResultBlock]) -> Verdict | None:
            return self.verdict() if hook == "on_results" else None

    engine = QueryEngine(ScriptedModel([same_call()] * 3), tools=[read_file], policies=[Quotes()])
    events = await collect(engine, "go")
    end = events[-1]
    assert isinstance(end, TurnEnded) and end.reason == "stationarity_ended" and end.detail == "caf\ufffd.txt again"
    assert [m.text for m in engine.messages if m.kind == "nudge"] == ["Stop reading caf\ufffd.txt"]
    assert validate_transcript(engine.messages) == []


async def test_a_blank_nudge_is_a_policy_bug_logged_and_ignored(caplog: pytest.LogCaptureFixture) -> None:
    """``Nudge("")`` would commit a blank user message, which providers refuse: it raises
    ValueError in the hook that makes it, which is logged and ignored like any hook's bug."""

    class Blank(Policy):
        def on_results(self, message: Message, results: Sequence[ToolResultBlock]) -> Verdict | None:
            return Nudge(" \n")

    engine = QueryEngine(ScriptedModel([same_call(), "done"]), tools=[read_file], policies=[Blank()])
    events = await collect(engine, "go")
    assert not any(isinstance(e, PolicyNudge) for e in events)
    assert not any(m.kind == "nudge" for m in engine.messages)
    assert validate_transcript(engine.messages) == []
    assert "policy Blank.on_results raised; ignored" in caplog.text


async def test_a_resample_reminder_with_a_lone_surrogate_is_scrubbed() -> None:
    class OwnWords(ConservativeDoomLoopPolicy):
        def on_stream(self, event: StreamEvent) -> Verdict | None:
            verdict = super().on_stream(event)
            return Resample(verdict.signals, reminder="You looped on caf\udce9.txt") if isinstance(verdict, Resample) else verdict

    engine = doom_engine([LOOPING, GOOD], policies=[OwnWords()])
    await collect(engine, "go")
    model = engine.model
    assert isinstance(model, ScriptedModel)
    reminder = model.requests[1].messages[-1].text
    assert reminder.startswith("You looped on caf\ufffd.txt")
    reminder.encode("utf-8")


@pytest.mark.parametrize("shared", [True, False])
async def test_stateful_policies_shared_by_two_engines_running_at_once_are_warned_about(
    shared: bool, caplog: pytest.LogCaptureFixture
) -> None:
    made_once = [ConservativeDoomLoopPolicy(), IdenticalToolCallRun()]

    def engine() -> QueryEngine:
        policies = made_once if shared else [ConservativeDoomLoopPolicy(), IdenticalToolCallRun()]
        return QueryEngine(ScriptedModel(["done"]), policies=policies)

    first = engine().run("go")
    await anext(first)  # TurnStarted: the first engine's run holds its policies now
    second = engine()
    async for _event in second.run("go"):
        pass
    async for _event in first:
        pass
    warned = [r.getMessage() for r in caplog.records if "used by two engines at once" in r.getMessage()]
    if shared:
        assert [w.split()[1] for w in warned] == ["ConservativeDoomLoopPolicy", "IdenticalToolCallRun"]
        async for _event in engine().run("again"):  # warned once per policy, not at every run
            pass
        assert len([r for r in caplog.records if "two engines" in r.getMessage()]) == 2
    else:
        assert warned == []


async def test_policies_passed_from_one_engine_to_the_next_are_not_warned_about(caplog: pytest.LogCaptureFixture) -> None:
    policies = [ConservativeDoomLoopPolicy(), IdenticalToolCallRun()]
    for _ in range(2):  # one after the other: the first run has ended when the second starts
        async for _event in QueryEngine(ScriptedModel(["done"]), policies=policies).run("go"):
            pass
    assert "two engines" not in caplog.text


async def test_a_policy_without_client_detectors_is_handed_no_delta() -> None:
    """``client_detector=False``: nothing reads the deltas, so the engine holds back every one,
    and the server frames still reach the policy as they come."""
    import agentloop.policies

    frames: list[StreamEvent] = [
        *[StreamText(0, f"part {i}, ") for i in range(200)],
        StreamSignals(("tail_repetition:32@thinking",)),
        StreamBlockStop(0),
        StreamEnd("end_turn"),
    ]
    policy = ConservativeDoomLoopPolicy(client_detector=False)
    engine = doom_engine([ScriptedResponse(events=frames), GOOD], policies=[policy])
    calls = await _python_calls_into(agentloop.policies.__file__, engine)
    assert calls < 40
    assert [m.text for m in engine.messages] == ["go", "Fixed it."]  # the server's confident signal resampled


async def test_a_stop_text_with_a_typo_still_ends_the_turn(caplog: pytest.LogCaptureFixture) -> None:
    """A host's ``end_text`` naming a field the template lacks made the policy raise at the
    12th call, every call after: logged and ignored, so the loop was never stopped."""
    policy = IdenticalToolCallRun()
    policy.end_text = "Stopped after {n} identical calls"
    engine = QueryEngine(ScriptedModel([same_call()] * 30), tools=[read_file], policies=[policy], max_turns=30)
    end = (await collect(engine, "go"))[-1]
    assert isinstance(end, TurnEnded) and end.reason == "stationarity_ended" and end.turns == 12
    assert end.detail is not None and end.detail.startswith("Stopped: the same tool call(s) (read_file)")
    assert "IdenticalToolCallRun.end_text" in caplog.text
    assert validate_transcript(engine.messages) == []


class _AsyncResults(Policy):
    async def on_results(self, message: Message, results: Sequence[ToolResultBlock]) -> Verdict | None:
        return EndTurn("never seen")


class _AsyncStream(ConservativeDoomLoopPolicy):
    async def on_stream(self, event: StreamEvent) -> Verdict | None:  # type: ignore[override]
        return None


class _AsyncBegin(Policy):
    async def begin_turn(self, *, real_user: bool) -> None:  # type: ignore[override]
        return None


@pytest.mark.parametrize("policy", [_AsyncResults, _AsyncStream, _AsyncBegin])
def test_a_policy_with_an_async_hook_is_refused_at_construction(policy: type[Policy]) -> None:
    """Hooks are called, not awaited: an ``async def`` hook returned a coroutine that nothing
    awaited, so the policy never acted (and each call left a "never awaited" warning)."""
    with pytest.raises(TypeError, match=r"hooks are plain functions.*async def"):
        QueryEngine(ScriptedModel(["done"]), policies=[policy()])


def test_a_policy_class_is_checked_once_and_an_async_subclass_of_it_still_refused() -> None:
    """The hooks of a policy class are inspected at its first engine only (an engine made per
    request does not inspect the stock policies again); a subclass that turns a hook into an
    ``async def`` is a class of its own, and is refused."""

    class Plain(Policy):
        def begin_turn(self, *, real_user: bool) -> None:
            return None

    class AsyncAfterAll(Plain):
        async def begin_turn(self, *, real_user: bool) -> None:  # type: ignore[override]
            return None

    for _ in range(2):
        QueryEngine(ScriptedModel(["done"]), policies=[Plain()])
    with pytest.raises(TypeError, match=r"hooks are plain functions.*AsyncAfterAll\.begin_turn"):
        QueryEngine(ScriptedModel(["done"]), policies=[AsyncAfterAll()])


def test_detectors_of_one_geometry_share_their_reach_table() -> None:
    """The search reach table is made once per (step, window): a policy makes two detectors per
    engine, and building the table took most of its construction (28 -> 2.6 us)."""
    a, b = RepetitionDetector("text"), RepetitionDetector("thinking")
    assert a._reach is b._reach and len(a._reach) == 65
    c = RepetitionDetector("text", window=8192)
    assert c._reach is not a._reach and max(c._reach) == 8192 and max(a._reach) == 4096


async def test_a_hook_that_returns_something_else_than_a_verdict_is_logged(caplog: pytest.LogCaptureFixture) -> None:
    """A hook that returns a string (``"stop"``) or a bool was ignored without a word: the host
    could not tell its policy from one that never fired."""

    class SaysStop(Policy):
        def on_results(self, message: Message, results: Sequence[ToolResultBlock]) -> Verdict | None:
            return "stop"  # type: ignore[return-value]

    engine = QueryEngine(ScriptedModel([same_call(), "done"]), tools=[read_file], policies=[SaysStop()])
    end = (await collect(engine, "go"))[-1]
    assert isinstance(end, TurnEnded) and end.reason == "completed"
    assert "SaysStop.on_results returned 'stop', not a verdict" in caplog.text


async def test_a_policy_whose_bind_raises_on_a_tool_change_leaves_the_others_bound(
    caplog: pytest.LogCaptureFixture,
) -> None:
    """A tool server redeclares ``todo`` as normal mid-run. A policy whose ``bind`` raised kept
    the policies after it bound to the old tools (the stock one still took ``todo`` for tight
    and ended the turn at 8), and the failure was reported as the tool watcher's, with "the
    tools are kept", though the engine had taken the new tools."""

    class Brittle(Policy):
        binds = 0

        def bind(self, tools: object) -> None:
            Brittle.binds += 1
            if Brittle.binds > 1:
                raise RuntimeError("bind failed")

    @tool(name="todo")
    async def plain_todo(items: list[str]) -> str:
        return "ok"

    engine = QueryEngine(
        ScriptedModel([same_call("todo", items=["x"])] * 20), tools=[todo], policies=[Brittle(), IdenticalToolCallRun()]
    )
    engine.watch_tools(lambda tools: [plain_todo])
    events = await collect(engine, "go")
    assert events[-1].reason == "stationarity_ended" and events[-1].turns == 12  # type: ignore[union-attr]
    assert "policy Brittle.bind raised" in caplog.text
    assert "the tools are kept" not in caplog.text


async def test_an_async_hook_set_on_the_instance_is_logged_and_its_coroutine_closed(
    caplog: pytest.LogCaptureFixture,
) -> None:
    policy = IdenticalToolCallRun()

    async def on_results(message: Message, results: Sequence[ToolResultBlock]) -> Verdict | None:
        return None

    policy.on_results = on_results  # type: ignore[method-assign]
    engine = QueryEngine(ScriptedModel([same_call(), "done"]), tools=[read_file], policies=[policy])
    end = (await collect(engine, "go"))[-1]  # -W error: a coroutine left unawaited would fail the test
    assert isinstance(end, TurnEnded) and end.reason == "completed"
    assert "IdenticalToolCallRun.on_results returned <coroutine" in caplog.text


def _chanting(prompt_tokens: int) -> ScriptedResponse:
    """A looping attempt whose prompt is counted as it starts (as Anthropic reports it)."""
    chant = [StreamThinking(0, CHANT[i : i + 7]) for i in range(0, len(CHANT), 7)]
    return ScriptedResponse(events=[StreamUsage(Usage(input_tokens=prompt_tokens)), *chant, StreamEnd()])


async def test_a_doom_loop_cut_at_the_usage_limit_ends_the_turn_instead_of_resampling() -> None:
    """A resample is a model request: a run whose tokens reached ``usage_limit`` made one anyway
    (bounded only by the doom budget), each costing the whole prompt again. The turn now ends
    with ``usage_limit``; the cut attempt is discarded as a resampled one would be."""
    engine = doom_engine([_chanting(50_000), GOOD], usage_limit=40_000)
    events = await collect(engine, "fix it")
    model = engine.model
    assert isinstance(model, ScriptedModel) and model.request_count == 1
    detected = [e for e in events if isinstance(e, DoomLoopDetected)]
    assert [(e.confident, e.action) for e in detected] == [(True, "ended")]
    assert not [e for e in events if isinstance(e, Resampling)]
    discarded = [e for e in events if isinstance(e, AttemptDiscarded)]
    assert len(discarded) == 1 and discarded[0].thinking_chars == streamed_thinking(events) > 0
    end = events[-1]
    assert isinstance(end, TurnEnded) and end.reason == "usage_limit" and end.abort_reason is None
    assert end.usage.total == 50_000 and "doom loop" in (end.detail or "")
    assert (end.detail or "").endswith("(the run's usage_limit of 40000 tokens is reached)")
    assert [m.text for m in engine.messages] == ["fix it"]
    assert validate_transcript(engine.messages) == []


async def test_a_doom_loop_cut_below_the_usage_limit_still_resamples() -> None:
    engine = doom_engine([_chanting(1_000), GOOD], usage_limit=40_000)
    events = await collect(engine, "fix it")
    assert [e.action for e in events if isinstance(e, DoomLoopDetected)] == ["resample"]
    assert engine.last_turn_ended is not None and engine.last_turn_ended.reason == "completed"
    assert engine.messages[-1].text == "Fixed it."


async def test_a_doom_loop_cut_as_the_run_is_interrupted_announces_no_resample() -> None:
    """The detector cut the attempt and an interrupt landed at that instant: the turn ended
    aborted, but the events said ``action="resample"`` and ``Resampling`` first, though no
    request followed. Now the cut is reported ``ended``, with no ``Resampling``."""
    engines: list[QueryEngine] = []

    class CutsAsTheUserStops(Policy):
        def on_stream(self, event: StreamEvent) -> Verdict | None:
            if isinstance(event, StreamThinking) and "execute" in event.thinking:
                engines[0].interrupt("cancel")  # Ctrl-C at this very instant
                return Resample(signals=())
            return None

    engine = doom_engine([LOOPING, GOOD], policies=[CutsAsTheUserStops()])
    engines.append(engine)
    events = await collect(engine, "fix it")
    model = engine.model
    assert isinstance(model, ScriptedModel) and model.request_count == 1
    assert not [e for e in events if isinstance(e, Resampling)]
    assert [e.action for e in events if isinstance(e, DoomLoopDetected)] == ["ended"]
    assert [e.reason for e in events if isinstance(e, AttemptDiscarded)] == ["resample"]
    end = events[-1]
    assert isinstance(end, TurnEnded) and end.reason == "aborted_streaming" and end.abort_reason == "cancel"
    assert [m.text for m in engine.messages] == ["fix it", "[Request interrupted by user]"]
    assert validate_transcript(engine.messages) == []


class _Budget(Policy):
    """A budget policy written in the wrong hook: it says EndTurn on every text delta."""

    def on_stream(self, event: StreamEvent) -> Verdict | None:
        return EndTurn("over budget", reason="hook_stopped") if isinstance(event, StreamText) else None


class _NudgesOnStream(Policy):
    def on_stream(self, event: StreamEvent) -> Verdict | None:
        return Nudge("keep it short") if isinstance(event, StreamText) else None


@pytest.mark.parametrize("alone", [True, False])
async def test_a_verdict_on_stream_cannot_act_on_is_logged_once_per_attempt_and_policy(
    alone: bool, caplog: pytest.LogCaptureFixture
) -> None:
    """A budget policy written in ``on_stream`` returned EndTurn on every delta and never ended
    anything, without a word. Each such policy is now told once per attempt which hook acts on
    its verdict; the verdict is still ignored."""
    policies: list[Policy] = [_Budget()] if alone else [_Budget(), _NudgesOnStream(), CountsThinking()]
    many = ScriptedResponse(text="Fixed it in many small pieces.", chunk=3)
    engine = doom_engine([many, many], policies=policies)
    with caplog.at_level(logging.WARNING, logger="agentloop"):
        await collect(engine, "go")
        await collect(engine, "again")
    assert engine.last_turn_ended is not None and engine.last_turn_ended.reason == "completed"
    budget = [r.getMessage() for r in caplog.records if "_Budget.on_stream" in r.getMessage()]
    assert len(budget) == 2  # one per attempt (two runs), not one per delta
    assert "returned EndTurn" in budget[0] and "on_stream acts only on Warn and Resample" in budget[0]
    assert "return EndTurn from on_response or on_results" in budget[0]
    nudged = [r.getMessage() for r in caplog.records if "_NudgesOnStream.on_stream" in r.getMessage()]
    assert len(nudged) == (0 if alone else 2)


async def test_a_stream_verdict_from_on_response_is_logged_with_the_hook_that_acts_on_it(
    caplog: pytest.LogCaptureFixture,
) -> None:
    class CutsLate(Policy):
        def on_response(self, message: Message) -> Verdict | None:
            return Resample()

    engine = QueryEngine(ScriptedModel(["done"]), policies=[CutsLate()])
    with caplog.at_level(logging.WARNING, logger="agentloop"):
        events = await collect(engine, "go")
    assert isinstance(events[-1], TurnEnded) and events[-1].reason == "completed"
    assert "CutsLate.on_response returned Resample" in caplog.text
    assert "return Resample from on_stream" in caplog.text
