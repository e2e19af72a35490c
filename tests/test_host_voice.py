"""A voice assistant's host written from the docs: speech in, speech out, barge-in at any time.

The microphone delivers partial transcripts; the user talks over the assistant, which must stop
speaking at once (`send_now`, `interrupt`, then a new run) or take an "also, ..." remark in its
stride (`interject`). The speaker is a text-to-speech consumer slower than the stream: it awaits
each delta. The tools are a slow cooperative lookup, a timer that ignores the abort for a while,
and a contact call behind a permission prompt the user answers by voice. Everything runs on a
virtual clock (tests/helpers.py), so latencies are measured in loop time and never depend on
the machine's load.
"""

from __future__ import annotations

import asyncio
import contextlib
import tempfile
import threading
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from agentloop import (
    AbortSignal,
    Allow,
    AssistantMessage,
    Deny,
    Event,
    InterjectionDropped,
    InterjectionInjected,
    QueryEngine,
    ScriptedModel,
    ScriptedResponse,
    ScriptedToolCall,
    TextDelta,
    ToolCallFinished,
    ToolCallStarted,
    ToolContext,
    ToolUseBlock,
    TurnEnded,
    TurnStarted,
    tool,
    validate_transcript,
)
from agentloop.models import ModelRequest, StreamEnd, StreamEvent, StreamText, Usage
from agentloop.sessions import JsonlSession
from tests.helpers import VirtualClock

GRACE = 2.0  # the engine's default tool_cancel_grace
UNWIND = 0.1  # what a cancelled call is given to unwind (docs/interrupts.md)
TTS = 0.05  # seconds the speaker takes per delta


@tool(concurrency_safe=True)
async def lookup(query: str, ctx: ToolContext) -> str:
    """Look something up (slow, and stops when asked to)."""
    waited = asyncio.ensure_future(ctx.signal.wait())
    try:
        await asyncio.wait_for(asyncio.shield(waited), 1.5)
    except TimeoutError:
        return f"{query}: 42"
    finally:
        waited.cancel()
    ctx.signal.throw_if_aborted()
    return "unreachable"


@tool
async def set_timer(minutes: int) -> str:
    """Set a timer; the clock service it talks to cannot be interrupted for 3 s."""
    await asyncio.sleep(3)  # ignores the abort; a cancel stops it
    return f"timer set for {minutes} min"


@tool
async def call_contact(name: str) -> str:
    """Call one of the user's contacts."""
    return f"calling {name}"


def stubborn_timer(unwind: float) -> Any:
    """A timer tool that swallows the first cancel and takes ``unwind`` seconds to return."""

    @tool(name="set_timer")
    async def timer(minutes: int) -> str:
        """Set a timer."""
        try:
            await asyncio.sleep(3)
        except asyncio.CancelledError:
            await asyncio.sleep(unwind)  # swallowed: the clock service finishes its write
        return f"timer set for {minutes} min"

    return timer


class VoicePrompt:
    """The permission prompt the assistant speaks: "may I call ...?", answered by voice. With no
    answer within ``patience`` seconds it counts as a no."""

    def __init__(self, patience: float = 3.0) -> None:
        self.patience = patience
        self.waiting: asyncio.Future[bool] | None = None
        self.asked = 0

    async def ask(self, call: ToolUseBlock, ctx: ToolContext) -> Allow | Deny:
        self.asked += 1
        self.waiting = asyncio.get_running_loop().create_future()
        try:
            yes = await asyncio.wait_for(self.waiting, self.patience)
        except TimeoutError:
            return Deny("the user did not answer")
        finally:
            self.waiting = None
        return Allow() if yes else Deny("the user said no")

    def answer(self, yes: bool) -> bool:
        if self.waiting is None or self.waiting.done():
            return False
        self.waiting.set_result(yes)
        return True


@dataclass
class Speaker:
    """Text to speech: slower than the stream, and silenced at once by a barge-in."""

    clock: VirtualClock
    spoken: list[str] = field(default_factory=list)
    current: asyncio.Task[None] | None = None
    after_barge_in: list[str] = field(default_factory=list)
    barged: bool = False
    speaking: asyncio.Event = field(default_factory=asyncio.Event)

    async def say(self, text: str) -> None:
        if self.barged:
            self.after_barge_in.append(text)
        self.current = asyncio.ensure_future(asyncio.sleep(TTS))
        self.speaking.set()
        try:
            await self.current
            self.spoken.append(text)
        except asyncio.CancelledError:
            me = asyncio.current_task()
            if me is not None and me.cancelling():
                raise  # the host itself is being cancelled
            # else silenced: the barge-in cut this delta off
        finally:
            self.current = None

    def silence(self) -> None:
        self.barged = True
        if self.current is not None:
            self.current.cancel()

    def new_turn(self) -> None:
        self.barged = False


def last_end(events: list[Event]) -> TurnEnded:
    end = events[-1]
    assert isinstance(end, TurnEnded), end
    return end


def no_tasks_left() -> list[asyncio.Task[Any]]:
    me = asyncio.current_task()
    return [t for t in asyncio.all_tasks() if t is not me and not t.done()]


async def settle() -> None:
    for _ in range(5):
        await asyncio.sleep(0)


@dataclass
class Host:
    """Plays one run: speaks its deltas, and records what the docs say a host can rely on."""

    engine: QueryEngine
    clock: VirtualClock
    speaker: Speaker
    events: list[tuple[float, Event]] = field(default_factory=list)
    barge_ins: list[float] = field(default_factory=list)
    leave: bool = False

    async def play(self, prompt: str | None) -> list[Event]:
        seen: list[Event] = []
        async with contextlib.aclosing(self.engine.run(prompt)) as run:
            async for event in run:
                self.events.append((self.clock.now, event))
                seen.append(event)
                if isinstance(event, TurnStarted):
                    self.speaker.new_turn()
                elif isinstance(event, TextDelta):
                    await self.speaker.say(event.text)
        return seen

    def barge_in(self, action: str, text: str = "") -> str | None:
        """The microphone heard the user over the assistant."""
        self.barge_ins.append(self.clock.now)
        if action == "interrupt":
            self.speaker.silence()
            self.engine.interrupt("cancel")
            return None
        if action == "send_now":
            self.speaker.silence()
            return self.engine.send_now(text)
        if action == "interject":
            return self.engine.interject(text)
        return self.engine.follow_up(text)

    def latency_to_turn_end(self, since: float) -> float:
        return next(t for t, e in self.events if t >= since and isinstance(e, TurnEnded)) - since


async def test_barge_in_while_speaking_silences_the_speaker_and_answers_the_new_words() -> None:
    with VirtualClock() as clock:
        model = ScriptedModel([
            ScriptedResponse(text="Once upon a time there was a very long story. " * 10, chunk=6, delay=0.01),
            "It is ten past nine.",
        ])
        engine = QueryEngine(model)
        host = Host(engine, clock, Speaker(clock))
        loop = asyncio.get_running_loop()
        receipt: list[str | None] = []
        loop.call_at(clock.now + 0.2, lambda: receipt.append(host.barge_in("send_now", "what time is it")))
        events = await host.play("tell me a story")

    ends = [e for e in events if isinstance(e, TurnEnded)]
    assert [(e.reason, e.abort_reason) for e in ends] == [("aborted_streaming", "send_now"), ("completed", None)]
    assert host.latency_to_turn_end(host.barge_ins[0]) == 0  # the stream is cut at once
    assert host.speaker.after_barge_in == []  # not one more word of the story was spoken
    assert "".join(host.speaker.spoken).endswith("It is ten past nine.")
    started = [e for e in events if isinstance(e, TurnStarted)]
    assert started[1].ids == (receipt[0],)
    assert engine.messages[1].partial and engine.messages[2].text == "what time is it"
    assert validate_transcript(engine.messages) == []
    await settle()
    assert no_tasks_left() == []


class PausingModel:
    """A model whose stream pauses mid-answer (a slow network, a long think): ``first`` streams,
    then nothing for ``pause`` seconds. It does not watch the signal: the engine cuts it."""

    def __init__(self, first: str, pause: float, then: str = "More.") -> None:
        self.first, self.pause, self.then = first, pause, then

    async def stream(self, request: ModelRequest, signal: AbortSignal) -> AsyncIterator[StreamEvent]:
        yield StreamText(0, self.first)
        await asyncio.sleep(self.pause)
        yield StreamText(0, self.then)
        yield StreamEnd("end_turn", Usage(10, 10))


async def test_a_barge_in_while_the_speaker_holds_a_delta_cuts_a_paused_stream_at_once() -> None:
    # The speaker applies backpressure: the host is awaiting speech, not the run, when the user
    # talks. The stream then pauses; the abort must not wait for its next event.
    with VirtualClock() as clock:
        engine = QueryEngine(PausingModel("Let me think about that", pause=30))
        host = Host(engine, clock, Speaker(clock))
        loop = asyncio.get_running_loop()
        loop.call_at(clock.now + TTS / 2, host.barge_in, "interrupt")
        events = await host.play("what is the meaning of life")
    end = events[-1]
    assert isinstance(end, TurnEnded)
    assert (end.reason, end.abort_reason) == ("aborted_streaming", "cancel")
    assert host.latency_to_turn_end(host.barge_ins[0]) == 0
    assert host.speaker.spoken == []  # the one delta was cut off mid-word
    assert [m.kind for m in engine.messages] == [None, None, "interrupt_notice"]
    assert validate_transcript(engine.messages) == []


async def test_partial_transcripts_sent_in_quick_succession_start_one_turn_each_delivered_once() -> None:
    with VirtualClock() as clock:
        model = ScriptedModel([
            ScriptedResponse(text="Here is the weather for the whole week. " * 5, chunk=8, delay=0.01),
            "It is nine.",
        ])
        engine = QueryEngine(model)
        host = Host(engine, clock, Speaker(clock))
        partials = ["what", "what time", "what time is", "what time is it"]
        receipts: list[str | None] = []

        def hear() -> None:
            receipts.extend(host.barge_in("send_now", text) for text in partials)

        asyncio.get_running_loop().call_at(clock.now + 0.1, hear)
        events = await host.play("weather this week")
    started = [e for e in events if isinstance(e, TurnStarted)]
    assert [s.ids for s in started] == [(), tuple(receipts)]  # one turn, every receipt, in order
    assert [m.text for m in engine.messages[2:6]] == partials
    assert [m.meta["receipt"] for m in engine.messages[2:6]] == receipts
    assert model.request_count == 2  # the model answered once, having heard every partial
    assert validate_transcript(engine.messages) == []


async def test_an_also_remark_while_speaking_is_merged_and_the_speech_goes_on() -> None:
    with VirtualClock() as clock:
        def answer(request: ModelRequest) -> str:
            assert request.messages[-1].kind == "interjection"
            return "Booked, with a window seat."

        model = ScriptedModel([
            ScriptedResponse(text="Booking your flight now.", chunk=6, delay=0.01,
                             tool_calls=[ScriptedToolCall("lookup", {"query": "flights"})]),
            answer,
        ])
        engine = QueryEngine(model, tools=[lookup])
        host = Host(engine, clock, Speaker(clock))
        receipt: list[str | None] = []
        asyncio.get_running_loop().call_at(clock.now + 0.05, lambda: receipt.append(host.barge_in("interject", "also, a window seat")))
        events = await host.play("book me a flight")
    injected = [e for e in events if isinstance(e, InterjectionInjected)]
    assert [e.ids for e in injected] == [(receipt[0],)]
    assert host.speaker.after_barge_in == []  # an "also" silences nothing: the speech went on
    assert "".join(host.speaker.spoken) == "Booking your flight now.Booked, with a window seat."
    assert last_end(events).reason == "completed"
    assert validate_transcript(engine.messages) == []


@pytest.mark.parametrize("action", ["interrupt", "send_now"])
@pytest.mark.parametrize(("timer", "latency"), [
    ("lookup", 0.0),  # cooperative: stops at once
    ("ignores_abort", GRACE),  # cancelled when the grace is over
    pytest.param("swallows_cancel", GRACE + 0.05, marks=pytest.mark.swallows_cancel),  # returns within the unwind time
])
async def test_barge_in_over_a_running_tool_ends_the_turn_within_the_grace(action: str, timer: str, latency: float) -> None:
    tools = {"lookup": lookup, "ignores_abort": set_timer, "swallows_cancel": stubborn_timer(0.05)}
    name = "lookup" if timer == "lookup" else "set_timer"
    args: dict[str, Any] = {"query": "pasta"} if timer == "lookup" else {"minutes": 10}
    with VirtualClock() as clock:
        model = ScriptedModel([ScriptedResponse(text="One moment.", tool_calls=[ScriptedToolCall(name, args)]), "Sure."])
        engine = QueryEngine(model, tools=[tools[timer]])
        host = Host(engine, clock, Speaker(clock))

        async def play() -> list[Event]:
            seen: list[Event] = []
            async with contextlib.aclosing(engine.run("set a pasta timer")) as run:
                async for event in run:
                    host.events.append((clock.now, event))
                    seen.append(event)
                    if isinstance(event, ToolCallStarted):
                        asyncio.get_running_loop().call_at(clock.now + 0.5, host.barge_in, action, "never mind")
            return seen

        events = await play()
    first_end = next(e for e in events if isinstance(e, TurnEnded))
    assert (first_end.reason, first_end.abort_reason) == ("aborted_tools", "cancel" if action == "interrupt" else action)
    assert host.latency_to_turn_end(host.barge_ins[0]) == pytest.approx(latency, abs=1e-6)
    assert host.latency_to_turn_end(host.barge_ins[0]) <= GRACE + UNWIND
    result = engine.messages[2].tool_results[0]
    if timer == "swallows_cancel":  # it returned once cancelled: it knows best what it did
        assert result.text == "timer set for 10 min" and not result.is_error
    else:
        assert result.is_error and "stopped while it was running" in result.text
    assert validate_transcript(engine.messages) == []
    await settle()
    assert no_tasks_left() == []


@pytest.mark.parametrize("reply", ["yes", "no", "silence", "send_now", "interrupt"])
async def test_a_permission_prompt_answered_by_voice_or_talked_over(reply: str) -> None:
    with VirtualClock() as clock:
        model = ScriptedModel([
            ScriptedResponse(text="Calling.", tool_calls=[ScriptedToolCall("call_contact", {"name": "Mum"})]),
            "Done.",
            "Something else, then.",
        ])
        prompt = VoicePrompt(patience=3.0)
        engine = QueryEngine(model, tools=[call_contact], permission=prompt.ask)
        host = Host(engine, clock, Speaker(clock))
        loop = asyncio.get_running_loop()
        events: list[Event] = []
        async with contextlib.aclosing(engine.run("call mum")) as run:
            async for event in run:
                host.events.append((clock.now, event))
                events.append(event)
                if event.type == "permission_requested":
                    await host.speaker.say("May I call Mum?")  # the question, spoken
                    if reply in ("yes", "no"):
                        loop.call_at(clock.now + 1, prompt.answer, reply == "yes")
                    elif reply in ("send_now", "interrupt"):
                        loop.call_at(clock.now + 1, host.barge_in, reply, "no wait, call Dad")
    assert validate_transcript(engine.messages) == []
    result = engine.messages[2].tool_results[0]
    first_end = next(e for e in events if isinstance(e, TurnEnded))
    if reply == "yes":
        assert (result.text, first_end.reason) == ("calling Mum", "completed")
    elif reply in ("no", "silence"):
        said = "the user said no" if reply == "no" else "the user did not answer"
        assert result.is_error and result.text == f"Permission denied: {said}"
        assert first_end.reason == "completed"
    else:
        assert result.is_error and "never started" in result.text
        assert first_end.reason == "aborted_tools"
        assert host.latency_to_turn_end(host.barge_ins[0]) == 0
        assert prompt.answer(True) is False  # a late "yes" finds no prompt waiting
    assert prompt.waiting is None
    await settle()
    assert no_tasks_left() == []


def assistant_script() -> ScriptedModel:
    """Answers, lookups and timers in turn, for as long as the conversation goes."""
    return ScriptedModel([
        ScriptedResponse(text="Let me look that up for you.", chunk=20, delay=0.01,
                         tool_calls=[ScriptedToolCall("lookup", {"query": "news"})]),
        ScriptedResponse(text="Here is what I found: nothing new today.", chunk=20, delay=0.01),
        ScriptedResponse(text="Setting it.", chunk=20, tool_calls=[ScriptedToolCall("set_timer", {"minutes": 5})]),
        ScriptedResponse(text="Your timer is set.", chunk=20, delay=0.01),
    ], cycle=True, record=False)


async def test_hundreds_of_turns_with_barge_ins_replay_from_the_session_file(tmp_path: Path) -> None:
    path = tmp_path / "voice.jsonl"
    with VirtualClock() as clock, JsonlSession(path) as session:
        engine = QueryEngine(assistant_script(), tools=[lookup, set_timer], session=session)
        host = Host(engine, clock, Speaker(clock))
        loop = asyncio.get_running_loop()
        for n in range(200):
            action = ("interrupt", "send_now", "interject", None, None)[n % 5]
            if action is not None:
                loop.call_at(clock.now + 0.02 + (n % 7) * 0.4, host.barge_in, action, f"remark {n}")
            await host.play(f"question {n}")
            assert validate_transcript(engine.messages) == [], n
            await settle()
            assert no_tasks_left() == [], n
            if n % 50 == 49:
                assert JsonlSession(path).load().messages == engine.messages, n
        assert engine.session_errors == []
    loaded = JsonlSession(path).load()
    assert loaded.messages == engine.messages and loaded.warnings == [] and loaded.repairs == []
    assert len(engine.messages) > 800


async def test_resume_after_a_crash_mid_write_continues_the_conversation(tmp_path: Path) -> None:
    path, crashed = tmp_path / "voice.jsonl", tmp_path / "crashed.jsonl"
    with VirtualClock() as clock, JsonlSession(path) as session:
        engine = QueryEngine(assistant_script(), tools=[lookup, set_timer], session=session)
        host = Host(engine, clock, Speaker(clock))
        loop = asyncio.get_running_loop()
        for n in range(12):
            loop.call_at(clock.now + 0.05, host.barge_in, "send_now" if n % 3 else "interject", f"and {n}")
            await host.play(f"question {n}")
        at_crash: list[Any] = []
        async with contextlib.aclosing(engine.run("set a timer")) as run:
            async for event in run:
                if isinstance(event, ToolCallStarted) and not at_crash:
                    # The process dies here, while writing its next record: the disk holds the
                    # records so far and the first half of one more line.
                    data = path.read_bytes()
                    last = data.rstrip(b"\n").rsplit(b"\n", 1)[-1]
                    crashed.write_bytes(data + last[: len(last) // 2])
                    at_crash = list(engine.messages)
    held = {m.meta.get("receipt") for m in at_crash} - {None}

    resumed, loaded = JsonlSession.resume(crashed)
    assert len(loaded.warnings) == 1 and "torn" in loaded.warnings[0]
    assert loaded.repairs == [f"added a synthetic result for tool_use '{at_crash[-1].tool_uses[0].id}' ({at_crash[-1].tool_uses[0].name})"]
    assert loaded.messages[:-1] == at_crash
    assert "no result was recorded" in loaded.messages[-1].tool_results[0].text
    with VirtualClock() as clock, resumed:
        engine = QueryEngine(assistant_script(), tools=[lookup, set_timer], session=resumed, messages=loaded.messages)
        host = Host(engine, clock, Speaker(clock))
        receipt = engine.send_now("did the timer get set?")
        assert receipt not in held  # never an id the file holds
        events = await host.play(None)
        assert [e.ids for e in events if isinstance(e, TurnStarted)] == [(receipt,)]
        assert last_end(events).reason in ("completed", "aborted_tools")
        assert validate_transcript(engine.messages) == []
    assert JsonlSession(crashed).load().messages == engine.messages


ACTIONS = ("send_now", "interject", "interrupt", "follow_up", "yes", "no", "leave")
SPEAKING = -1.0  # a gap that waits until the speaker is saying something (within 5 s)
GAPS = st.sampled_from([SPEAKING, SPEAKING, 0.0, 0.0, 0.005, 0.02, 0.06, 0.3, 1.0, 2.5])


@dataclass
class Ledger:
    """What became of every text the microphone handed the engine (interrupts.md: receipts)."""

    kinds: dict[str, str] = field(default_factory=dict)
    reported: dict[str, int] = field(default_factory=dict)
    in_flight: bool = False  # the host saw the turn's TurnStarted and not yet its TurnEnded
    answered: bool = False  # the host saw the turn's final answer
    stops: list[float] = field(default_factory=list)  # barge-ins that stop a turn in flight

    def note(self, receipt: str | None, kind: str) -> None:
        if receipt is not None:
            self.kinds[receipt] = kind

    def report(self, ids: tuple[str, ...], kinds: tuple[str, ...]) -> None:
        for receipt in ids:
            if self.kinds.get(receipt) in kinds:
                self.reported[receipt] = self.reported.get(receipt, 0) + 1

    def left(self) -> None:
        """The host stopped iterating the run: no TurnEnded will come for the turn."""
        self.in_flight = False
        self.stops.clear()

    def pending(self) -> set[str]:
        return set(self.kinds) - set(self.reported)

    def see(self, clock: VirtualClock, event: Event) -> None:
        if isinstance(event, TurnStarted):
            self.report(event.ids, ("send_now", "follow_up"))
            self.in_flight, self.answered = True, False
        elif isinstance(event, InterjectionInjected | InterjectionDropped):
            self.report(event.ids, ("interject",))
        elif isinstance(event, AssistantMessage):
            self.answered = not event.message.tool_uses
        elif isinstance(event, TurnEnded):
            self.in_flight = False
            late = [t for t in self.stops if clock.now - t > GRACE + UNWIND + 1e-9]
            assert not late, f"a barge-in waited {clock.now - late[0]:.3f} s for its TurnEnded"
            if self.stops and not self.answered:
                assert event.reason in ("aborted_streaming", "aborted_tools"), event
                assert event.abort_reason in ("cancel", "send_now"), event
            self.stops.clear()


async def microphone(plan: list[tuple[float, str]], host: Host, prompt: VoicePrompt, ledger: Ledger, heard: asyncio.Event) -> None:
    speaker = host.speaker
    for n, (gap, action) in enumerate(plan):
        if gap == SPEAKING:
            speaker.speaking.clear()
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(5):  # no task of its own, as wait_for's would be
                    await speaker.speaking.wait()
        else:
            await asyncio.sleep(gap)
        if action in ("yes", "no"):
            prompt.answer(action == "yes")
            continue
        if action == "leave":  # the host stops listening to this run at its next event
            host.leave = True
            host.speaker.silence()
            continue
        if action in ("interrupt", "send_now") and ledger.in_flight:
            ledger.stops.append(host.clock.now)
        ledger.note(host.barge_in(action, f"{action} {n}"), action)
        heard.set()


def voice_model() -> ScriptedModel:
    return ScriptedModel([
        ScriptedResponse(text="Let me check.", chunk=4, delay=0.01, tool_calls=[ScriptedToolCall("lookup", {"query": "q"})]),
        ScriptedResponse(text="May I call your contact?", chunk=5, tool_calls=[ScriptedToolCall("call_contact", {"name": "Ann"})]),
        ScriptedResponse(text="Setting a timer.", chunk=4, delay=0.02, tool_calls=[
            ScriptedToolCall("set_timer", {"minutes": 1}), ScriptedToolCall("lookup", {"query": "r"})]),
        ScriptedResponse(text="All done, anything else?", chunk=3, delay=0.01),
        ScriptedResponse(text="Hmm, let me think about that one.", chunk=12, delay=2.5),  # a slow network
    ], cycle=True, record=False)


async def listen(host: Host, ledger: Ledger, first: str | None) -> bool:
    """One run, spoken; True when the host stopped iterating it mid-turn."""
    host.leave = False
    async for event in host.engine.run(first):
        host.events.append((host.clock.now, event))
        ledger.see(host.clock, event)
        if host.leave:  # before anything more is said
            left = ledger.in_flight
            ledger.left()
            return left
        if isinstance(event, TurnStarted):
            host.speaker.new_turn()
        elif isinstance(event, TextDelta):
            await host.speaker.say(event.text)
    return False


async def check_after_run(host: Host, left: bool, path: Path) -> None:
    engine = host.engine
    ended = [e for _, e in host.events if isinstance(e, TurnEnded)]
    if not left:
        assert engine.last_turn_ended is ended[-1]
    elif engine.last_turn_ended is not None:  # api.md: None, but when the host stopped at one
        # of the events that come with the turn's end, just before its TurnEnded
        last = host.events[-1][1]
        assert isinstance(last, InterjectionDropped) or (isinstance(last, ToolCallFinished) and last.synthetic)
        assert all(engine.last_turn_ended is not e for e in ended)  # this turn's, never an earlier one
    if host.leave:  # the run's cleanup goes on in the background, for the grace at most
        await asyncio.sleep(GRACE + UNWIND)
    assert not engine.running and engine.signal is None
    assert validate_transcript(engine.messages) == []
    assert JsonlSession(path).load().messages == engine.messages


async def converse(plan: list[tuple[float, str]], path: Path) -> None:
    with VirtualClock() as clock, JsonlSession(path) as session:
        prompt = VoicePrompt(patience=1.0)
        engine = QueryEngine(voice_model(), tools=[lookup, set_timer, call_contact], permission=prompt.ask, session=session)
        host = Host(engine, clock, Speaker(clock))
        ledger = Ledger()
        heard = asyncio.Event()
        mic = asyncio.create_task(microphone(plan, host, prompt, ledger, heard))
        first: str | None = "hello"
        for _ in range(len(plan) + 3):
            if first is None and not ledger.pending():  # idle: wait for the user to say something
                if mic.done():
                    break
                heard.clear()
                waiter = asyncio.ensure_future(heard.wait())
                await asyncio.wait([mic, waiter], return_when=asyncio.FIRST_COMPLETED)
                waiter.cancel()
                if not ledger.pending():
                    continue
            left = await listen(host, ledger, first)
            first = None
            await check_after_run(host, left, path)
            await settle()
            assert [t for t in no_tasks_left() if t is not mic] == []
        await mic
    assert ledger.pending() == set(), ledger
    assert all(count == 1 for count in ledger.reported.values()), ledger.reported
    assert host.speaker.after_barge_in == []
    assert engine.session_errors == []
    kept = [r["ids"] for r in JsonlSession(path).load().events if r["type"].startswith("interjection_")]
    seen = [list(e.ids) for _, e in host.events if isinstance(e, InterjectionInjected | InterjectionDropped)]
    assert kept == seen  # every receipt's fate is in the file too


@given(st.lists(st.tuples(GAPS, st.sampled_from(ACTIONS)), max_size=12))
def test_random_barge_ins_keep_every_promise(plan: list[tuple[float, str]]) -> None:
    with tempfile.TemporaryDirectory() as tmp:
        asyncio.run(converse(plan, Path(tmp) / "voice.jsonl"), debug=True)


async def test_a_host_that_stops_listening_on_barge_in_starts_the_new_run_after_the_cleanup() -> None:
    # Another way to stop speaking: leave the `async for` (the run settles at once) and start a
    # new run with the new words, which waits for the stopped run's timer to be cancelled.
    with VirtualClock() as clock:
        model = ScriptedModel([
            ScriptedResponse(text="Setting it.", tool_calls=[ScriptedToolCall("set_timer", {"minutes": 3})]),
            "Ten minutes it is.",
        ])
        engine = QueryEngine(model, tools=[set_timer])
        async for event in engine.run("set a timer for three minutes"):
            if isinstance(event, ToolCallStarted):
                barge_in = clock.now
                break
        assert not engine.running
        assert validate_transcript(engine.messages) == []
        result = engine.messages[2].tool_results[0]
        assert result.is_error and "stopped while it was running" in result.text
        events = [(clock.now, event) async for event in engine.run("no, ten minutes")]
    started_at, started = events[0]
    assert isinstance(started, TurnStarted) and started.prompt is not None
    assert started.prompt.text == "no, ten minutes"
    assert started_at - barge_in == pytest.approx(GRACE)  # the timer ignored the abort for the grace
    assert last_end([event for _, event in events]).reason == "completed"
    assert engine.messages[-1].text == "Ten minutes it is."
    assert validate_transcript(engine.messages) == []
    await settle()
    assert no_tasks_left() == []


async def test_an_also_remark_over_a_permission_prompt_waits_for_the_answer() -> None:
    with VirtualClock() as clock:
        def answer(request: ModelRequest) -> str:
            assert request.messages[-2].tool_results[0].text == "calling Mum"
            assert request.messages[-1].kind == "interjection"
            return "Calling Mum on her mobile."

        model = ScriptedModel([ScriptedResponse(tool_calls=[ScriptedToolCall("call_contact", {"name": "Mum"})]), answer])
        prompt = VoicePrompt()
        engine = QueryEngine(model, tools=[call_contact], permission=prompt.ask)
        loop = asyncio.get_running_loop()
        events: list[Event] = []
        async for event in engine.run("call mum"):
            events.append(event)
            if event.type == "permission_requested":
                receipt = engine.interject("also, use her mobile")
                loop.call_at(clock.now + 1, prompt.answer, True)
    injected = [e for e in events if isinstance(e, InterjectionInjected)]
    assert [e.ids for e in injected] == [(receipt,)]
    assert last_end(events).reason == "completed"
    assert engine.messages[-1].text == "Calling Mum on her mobile."
    assert validate_transcript(engine.messages) == []


async def test_partials_from_the_recogniser_thread_while_the_speaker_holds_a_delta() -> None:
    # The speech recogniser runs in a thread of its own; it hears the user while the speaker is
    # saying the first delta, passes on three guesses, then the speaker is told to stop.
    with VirtualClock() as clock:
        engine = QueryEngine(PausingModel("Let me see", pause=30))
        loop = asyncio.get_running_loop()
        receipts: list[str] = []
        partials = ["call", "call my", "call my sister"]

        def recogniser(speaking: asyncio.Future[None]) -> None:
            receipts.extend(engine.send_now(text) for text in partials)
            loop.call_soon_threadsafe(speaking.cancel)  # silence the speaker

        events: list[tuple[float, Event]] = []
        async for event in engine.run("what's on today"):
            events.append((clock.now, event))
            if isinstance(event, TextDelta) and len(receipts) == 0:
                speaking: asyncio.Future[None] = loop.create_future()
                thread = threading.Thread(target=recogniser, args=(speaking,))
                thread.start()
                barge_in = clock.now
                with contextlib.suppress(asyncio.CancelledError):
                    await speaking
                thread.join()
                assert not any(isinstance(e, TurnEnded) for _, e in events)
            if len(events) > 20:
                break
    ends = [(t, e) for t, e in events if isinstance(e, TurnEnded)]
    assert [(e.reason, e.abort_reason) for _, e in ends] == [("aborted_streaming", "send_now"), ("completed", None)]
    assert ends[0][0] == barge_in  # at once: the 30 s pause is never waited for
    assert [e.ids for _, e in events if isinstance(e, TurnStarted)] == [(), tuple(receipts)]
    assert [m.text for m in engine.messages[2:5]] == partials
    assert validate_transcript(engine.messages) == []


async def test_what_the_user_said_while_idle_starts_the_next_run_in_order() -> None:
    # The assistant is idle; the user says several things before the host starts the run.
    engine = QueryEngine(ScriptedModel(["One.", "Two."]))
    also = engine.interject("also, it's for two people")
    now = engine.send_now("book a table")
    then = engine.follow_up("then text Sam")
    later = engine.interject("at eight")
    events = [event async for event in engine.run()]
    assert [e.ids for e in events if isinstance(e, TurnStarted)] == [(also, now, later), (then,)]
    assert [e.ids for e in events if isinstance(e, InterjectionInjected)] == [(also, later)]
    assert [m.text for m in engine.messages] == [
        "also, it's for two people", "book a table", "at eight", "One.", "then text Sam", "Two.",
    ]
    assert validate_transcript(engine.messages) == []


class EagerModel:
    """A model whose whole answer is at hand (a local model's buffer): its stream never waits,
    and it does not look at the signal."""

    async def stream(self, request: ModelRequest, signal: AbortSignal) -> AsyncIterator[StreamEvent]:
        for word in ("One ", "two ", "three ", "four."):
            yield StreamText(0, word)
        yield StreamEnd("end_turn", Usage(10, 10))


async def test_a_barge_in_over_a_stream_that_never_waits_still_ends_the_turn() -> None:
    engine = QueryEngine(EagerModel())
    events: list[Event] = []
    async for event in engine.run("count"):
        events.append(event)
        if isinstance(event, TextDelta) and event.text == "One ":
            engine.interrupt()  # the speaker heard the user over "One"
    end = last_end(events)
    assert (end.reason, end.abort_reason) == ("aborted_streaming", "cancel")
    assert len([e for e in events if isinstance(e, TextDelta)]) <= 2  # what was already read, at most
    assert [m.kind for m in engine.messages] == [None, None, "interrupt_notice"]
    assert validate_transcript(engine.messages) == []


class CutThenSlowModel:
    """First a stream that stops without its end event and never waits; then a slow answer."""

    def __init__(self) -> None:
        self.calls = 0

    async def stream(self, request: ModelRequest, signal: AbortSignal) -> AsyncIterator[StreamEvent]:
        self.calls += 1
        if self.calls == 1:
            yield StreamText(0, "One ")
            yield StreamText(0, "two")
            return
        await asyncio.sleep(1)
        yield StreamText(0, "Three.")
        yield StreamEnd("end_turn", Usage(10, 10))


async def test_a_barge_in_at_a_cut_streams_last_delta_leaves_the_new_turn_alone() -> None:
    with VirtualClock():
        engine = QueryEngine(CutThenSlowModel())
        events: list[Event] = []
        async for event in engine.run("count"):
            events.append(event)
            if isinstance(event, TextDelta) and event.text == "two":
                engine.send_now("count again")
    ends = [(e.reason, e.abort_reason) for e in events if isinstance(e, TurnEnded)]
    assert ends == [("aborted_streaming", "send_now"), ("completed", None)]
    assert engine.messages[-1].text == "Three."
    assert validate_transcript(engine.messages) == []
