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
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from hypothesis import given
from hypothesis import strategies as st

from agentloop import (
    AbortSignal,
    Allow,
    Deny,
    Event,
    InterjectionDropped,
    InterjectionInjected,
    QueryEngine,
    ScriptedModel,
    ScriptedResponse,
    ScriptedToolCall,
    TextDelta,
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

    async def say(self, text: str) -> None:
        if self.barged:
            self.after_barge_in.append(text)
        self.current = asyncio.ensure_future(asyncio.sleep(TTS))
        try:
            await self.current
            self.spoken.append(text)
        except asyncio.CancelledError:
            if self.current.cancelled() and not asyncio.current_task().cancelling():  # type: ignore[union-attr]
                return  # silenced: the barge-in cut this delta off
            raise
        finally:
            self.current = None

    def silence(self) -> None:
        self.barged = True
        if self.current is not None:
            self.current.cancel()

    def new_turn(self) -> None:
        self.barged = False


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
