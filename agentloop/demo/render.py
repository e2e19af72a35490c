"""Events to readable lines: the demo's view of a running engine.

`Renderer.show(event)` prints one event (streamed deltas inline, everything
else on a line of its own), keeps the status line current and counts what the
exit summary reports. `format_transcript` prints `engine.messages`.
"""

from __future__ import annotations

import json
import re
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass, field

from .._events import (
    AttemptDiscarded,
    DoomLoopDetected,
    Event,
    InterjectionDropped,
    InterjectionInjected,
    PermissionRequested,
    PolicyNudge,
    Resampling,
    Retrying,
    TextDelta,
    ThinkingDelta,
    ToolCallFinished,
    ToolCallStarted,
    ToolProgress,
    TurnEnded,
    TurnStarted,
)
from .._messages import (
    Message,
    ProviderBlock,
    RedactedThinkingBlock,
    TextBlock,
    ThinkingBlock,
    ToolResultBlock,
    ToolUseBlock,
)
from .screen import Screen, shorten, wrap

__all__ = ["HELP", "Renderer", "Stats", "format_transcript", "help_text", "short", "visible"]

# The keys, and what to watch for: (key, what it does), shown under a column of keys.
HELP = (
    ("Ctrl-C", "interrupt the turn: engine.interrupt() (when idle, twice within 3 seconds: exit)"),
    ("typing", "steer the turn while it works: engine.interject(text); when idle, a line starts a new turn"),
    ("!text", "drop the turn and send text now: engine.send_now(text)"),
    ("/mode queue", "typing waits for the turn to end: engine.follow_up(text) (/mode steer: back to steering)"),
    ("Ctrl-D", "exit, with a summary and the final transcript"),
    ("/transcript", "print the messages so far (/help: these lines, /quit: exit)"),
    (
        "watch for",
        "the agent going round in circles: a thinking loop cut and resampled (doom-loop policy), a file "
        "read again and again (the stationarity policy nudges); ask it to wait for CI to see a polling "
        "loop ended",
    ),
)
# "watch for" with a real model (--provider): what the policies would do, promising no loop.
_WATCH_REAL = (
    "watch for",
    "what the policies do if the model goes round in circles: a repeated stream cut and resampled "
    "(doom-loop policy), a file read again and again nudged (the stationarity policy)",
)
_KEYS = 12  # the width of the column of keys

_DOOM_ACTIONS = {"resample": "cut the stream, resampling", "ended": "cut the stream; no resample, the turn ends"}


def help_text(width: int = 78, *, scripted: bool = True) -> str:
    """`HELP` in lines of at most ``width`` columns, each description going on under itself;
    not ``scripted`` (a real model), its "watch for" line names no loop of the scripted agent's."""
    lines = HELP if scripted else (*HELP[:-1], _WATCH_REAL)
    return "\n".join(wrap(f"{key:<{_KEYS}}{text}", width, _KEYS) for key, text in lines)


# What a terminal would take as a command, not as text (an escape sequence that recolours, moves
# the cursor, resets the scroll region or sets the title; a bare carriage return): a model's or a
# tool's text shows it as U+FFFD. Line breaks (CR LF too) and tabs are text.
_UNSHOWN = re.compile(r"[\x00-\x08\x0b-\x1f\x7f-\x9f]")


def visible(text: str) -> str:
    """``text`` with nothing in it that the terminal would act on (see ``_UNSHOWN``)."""
    return _UNSHOWN.sub("\ufffd", text.replace("\r\n", "\n"))


def short(text: str, limit: int = 100) -> str:
    """``text`` on one line, cut to ``limit`` columns (a wide character takes two; and `visible`)."""
    return shorten(visible(" ".join(str(text).split())), limit)


def call_text(use: ToolUseBlock) -> str:
    args = ", ".join(f"{k}={json.dumps(v, ensure_ascii=False)}" for k, v in use.input.items())
    return short(f"{use.name}({args})", 90)


@dataclass
class Stats:
    """What the exit summary reports."""

    turns: int = 0
    tool_calls: int = 0
    interrupts: int = 0
    doom_loops: int = 0
    nudges: int = 0
    steers: int = 0
    terminals: Counter[str] = field(default_factory=Counter)


class Renderer:
    """Prints events on a `Screen` and keeps its status line up to date."""

    def __init__(self, screen: Screen, *, asks: frozenset[str] = frozenset(), scripted: bool = True) -> None:
        """``asks``: the tools whose permission prompt is worth a line (others only show in the
        status); ``scripted``: the model is the demo's scripted one (what /help says to watch for)."""
        self.screen = screen
        self.scripted = scripted
        self.asks = asks
        self.s = screen.style
        self.stats = Stats()
        self._channel: str | None = None  # the delta stream in progress
        self._cut: str | None = None  # the delta stream a line of the host broke into
        self._running: dict[str, str] = {}  # tool_use_id -> name
        self._progress: dict[str, str] = {}  # tool_use_id -> its last report, the latest last
        self._asking: set[str] = set()

    def note(self, text: str, *style: str) -> None:
        """A line from the host (not an event)."""
        if self._channel is not None:
            self._cut = self._channel
        self._channel = None
        self.screen.line(self.s(text, *style))

    def help(self) -> None:
        """The keys and what to watch for, in lines that fit the terminal (or 78 columns)."""
        if self._channel is not None:
            self._cut = self._channel
        self._channel = None
        self.screen.line(help_text(min(78, self.screen.width or 78), scripted=self.scripted))

    def show(self, event: Event, starts: Sequence[str] = ()) -> None:
        """``starts``: for a `TurnStarted`, every text the turn starts with (several queued
        messages run as one turn), when the event's prompt is not the whole of it."""
        if isinstance(event, TextDelta | ThinkingDelta):
            self._delta(event)
            return
        if isinstance(event, ToolProgress):
            self._report(event)
            return
        self._channel = self._cut = None
        self._line(event, starts)
        self.screen.status(self.status())

    def status(self) -> str:
        if self._asking:
            return "waiting for permission"
        if self._running:
            n = len(self._running)
            names = ", ".join(sorted(set(self._running.values())))
            latest = next(reversed(self._progress.values()), None)
            return f"{n} tool{'s' if n > 1 else ''} running: {names}" + (f" \u2014 {latest}" if latest else "")
        if self._channel is not None:
            return f"streaming {self._channel}"
        return "working"

    def _report(self, ev: ToolProgress) -> None:
        """A running tool's progress: on the status line where there is one (the latest report of
        a call still running), else a dim line of its own per report."""
        name = self._running.get(ev.tool_use_id, "tool")
        text = short(ev.text, 200)
        if not self.screen.status_shown:
            self.note(f"  \u00b7 {name}: {text}", "dim")
            return
        if ev.tool_use_id in self._running:
            self._progress.pop(ev.tool_use_id, None)
            self._progress[ev.tool_use_id] = text
            self.screen.status(self.status())

    def idle(self, hint: str = "") -> None:
        self.screen.settle()
        self._running.clear()
        self._progress.clear()
        self._asking.clear()
        self._channel = None
        self.screen.status("idle" + (f" \u2014 {hint}" if hint else ""))

    def _delta(self, event: TextDelta | ThinkingDelta) -> None:
        channel = "text" if isinstance(event, TextDelta) else "thinking"
        chunk = event.text if isinstance(event, TextDelta) else event.thinking
        if channel != self._channel:
            # The stream goes on after a line of the host: its label again, marked as going on.
            more = "\u2026" if channel == self._cut else ""
            self._channel, self._cut = channel, None
            self.screen.status(self.status())  # before the text, so a streamed block stays contiguous
            self.screen.settle()
            head = self.s("assistant: ", "bold") + more if channel == "text" else self.s("thinking: ", "dim") + more
            self.screen.write(("" if self.screen.at_line_start else "\n") + head)
        # Wrapped at word boundaries as it comes (on a terminal), going on under its line's indent.
        self.screen.flow(visible(chunk), *(("dim",) if channel == "thinking" else ()))

    def _line(self, event: Event, starts: Sequence[str] = ()) -> None:
        if isinstance(event, TurnStarted):
            self.stats.turns += 1
            said = "; ".join(short(t, 200) for t in starts) if starts else None
            who = said or (short(event.prompt.text, 200) if event.prompt is not None else "(resuming)")
            text: str | None = self.s(f"\u2500\u2500 turn {self.stats.turns} \u2500\u2500 you: ", "bold", "magenta") + who
        else:
            text = self._describe(event)
        if text:
            self.screen.line(text)

    def _describe(self, ev: Event) -> str | None:
        s = self.s
        if isinstance(ev, PermissionRequested):
            self._asking.add(ev.tool_use.id)
            if ev.tool_use.name not in self.asks:
                return None
            return s(f"? permission asked for {call_text(ev.tool_use)} (the demo allows it after a moment)", "yellow")
        if isinstance(ev, ToolCallStarted):
            self._asking.discard(ev.tool_use.id)
            self._running[ev.tool_use.id] = ev.tool_use.name
            self.stats.tool_calls += 1
            return s("\u2699 ", "cyan") + s(call_text(ev.tool_use), "cyan")
        if isinstance(ev, ToolCallFinished):
            return self._finished(ev)
        if isinstance(ev, InterjectionInjected):
            return s(f"\u21aa steer delivered to the model: {'; '.join(short(t, 80) for t in ev.texts)}", "magenta")
        if isinstance(ev, InterjectionDropped):
            return s(f"\u21aa not delivered (the turn ended: {ev.reason}): {'; '.join(short(t, 200) for t in ev.texts)}", "yellow")
        if isinstance(ev, PolicyNudge):
            self.stats.nudges += 1
            return s(f"\u2691 stationarity nudge from {ev.policy}: {short(ev.reminder, 120)}", "yellow")
        if isinstance(ev, DoomLoopDetected):
            self.stats.doom_loops += ev.action == "resample"
            sig = ", ".join(str(x) for x in ev.signals)
            verdict = _DOOM_ACTIONS.get(ev.action, ev.action)
            return s(f"\u26a0 doom loop detected [{sig}] by {ev.policy or 'policy'}: {verdict}", "yellow", "bold")
        if isinstance(ev, AttemptDiscarded):
            n = ev.text_chars + ev.thinking_chars
            return s(f"  (the looping attempt was discarded: {n} characters dropped from history)", "dim")
        if isinstance(ev, Resampling):
            return s(f"\u21bb resampling (attempt {ev.attempt}) with a recovery reminder", "yellow")
        if isinstance(ev, Retrying):
            return s(f"\u21bb retrying in {ev.delay:.1f}s (attempt {ev.attempt}): {short(ev.error, 80)}", "yellow")
        if isinstance(ev, TurnEnded):
            return self._ended(ev)
        return None

    def _finished(self, ev: ToolCallFinished) -> str:
        self._running.pop(ev.tool_use.id, None)
        self._progress.pop(ev.tool_use.id, None)
        self._asking.discard(ev.tool_use.id)
        body = short(ev.result.text, 110)
        if ev.synthetic:
            return self.s(f"  \u2298 {ev.tool_use.name}: {body}", "yellow")
        if ev.result.is_error:
            return self.s(f"  \u2717 {ev.tool_use.name}: {body}", "red")
        return self.s("  \u2713 ", "green") + self.s(f"{ev.tool_use.name}: {body}", "dim")

    def _ended(self, ev: TurnEnded) -> str:
        self.stats.terminals[ev.reason] += 1
        self._running.clear()
        self._progress.clear()
        self._asking.clear()
        extra = ""
        if ev.abort_reason is not None:
            self.stats.interrupts += 1
            extra = f" (interrupted: {ev.abort_reason})"
        if ev.detail:
            extra += f": {short(ev.detail, 100)}"
        if ev.error:
            extra += f": {short(ev.error, 100)}"
        colour = "green" if ev.reason == "completed" else "yellow"
        return self.s(f"\u25a0 turn ended: {ev.reason}{extra}", colour, "bold")


def _block(block: object) -> str:
    if isinstance(block, TextBlock):
        return short(block.text, 160)
    if isinstance(block, ThinkingBlock):
        return "[thinking] " + short(block.thinking, 100)
    if isinstance(block, RedactedThinkingBlock):
        return "[redacted thinking]"
    if isinstance(block, ToolUseBlock):
        return f"[tool_use {block.id}] {call_text(block)}"
    if isinstance(block, ToolResultBlock):
        flag = " error" if block.is_error else ""
        return f"[tool_result {block.tool_use_id}{flag}] {short(block.text, 100)}"
    if isinstance(block, ProviderBlock):
        return f"[{block.provider} {block.data.get('type')}]"
    return repr(block)


def format_transcript(messages: Sequence[Message]) -> list[str]:
    """One header line per message, one indented line per block."""
    lines: list[str] = []
    for i, m in enumerate(messages, 1):
        flags = [f for f, on in (("partial", m.partial), ("synthetic", m.synthetic)) if on]
        if m.kind:
            flags.append(m.kind)
        lines.append(f"{i:3d}. {m.role}" + (f" ({', '.join(flags)})" if flags else ""))
        lines += [f"       {_block(b)}" for b in m.content]
    return lines
