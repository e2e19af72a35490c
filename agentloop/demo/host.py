"""The host: what a person (or a scenario) does to a running `QueryEngine`.

Every action is one of the engine's plain, thread-safe control calls:
Ctrl-C is ``engine.interrupt("cancel")``, a typed line is
``engine.interject`` (steer) or ``engine.follow_up`` (queue), ``!text`` is
``engine.send_now``. A turn runs in its own task that drains ``engine.run()``
into the `Renderer`; the host itself never blocks the event loop.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator, Callable
from typing import Literal

from .._engine import QueryEngine
from .._events import Event, TurnStarted
from .._validate import validate_transcript
from .editor import LineEditor
from .keyboard import Input
from .render import Renderer, format_transcript, short

__all__ = ["IDLE_CTRL_C_WINDOW", "Host"]

# Seconds a Ctrl-C at idle stays armed: a second one within them exits; a later one arms it again.
IDLE_CTRL_C_WINDOW = 3.0


class Host:
    """Runs turns of ``engine`` and routes the user's input to it."""

    def __init__(
        self,
        engine: QueryEngine,
        renderer: Renderer,
        *,
        mode: Literal["steer", "queue"] = "steer",
        hints: bool = False,
        editor: LineEditor | None = None,
        echo: bool = False,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        """``hints``: a person is at the keyboard; when a turn ends, what to do next is shown on the
        status line, or on a line of its own where there is no status line (--plain, TERM=dumb).
        ``editor``: the line being typed, when the demo edits it. ``echo``: nothing shows what was
        typed (the demo edits the line, or the input is a pipe): a command is printed as it runs.
        ``clock``: the time in seconds, for how long an idle Ctrl-C stays armed."""
        self.engine = engine
        self.hints = hints
        self.editor = editor
        self.echo = echo
        self.r = renderer
        self.mode: Literal["steer", "queue"] = mode
        self.task: asyncio.Task[None] | None = None
        self.exit = asyncio.Event()
        self.on_event: Callable[[Event], None] | None = None
        self.on_idle: Callable[[], None] | None = None
        self._clock = clock
        self._armed_at: float | None = None  # when a Ctrl-C at idle armed the exit
        self._input_ended = False
        # A turn's header is on the screen (or its run ended without one): the keyboard is read
        # from then on, so that what is typed shows below the turn it acts on.
        self.shown = asyncio.Event()

    @property
    def busy(self) -> bool:
        return self.task is not None and not self.task.done()

    # -- turns -------------------------------------------------------------------------

    def start(self, prompt: str | None) -> None:
        """Start a run on ``prompt`` (None: run what the inbox holds)."""
        if self.busy:
            if prompt:  # None: the running turn takes what the inbox holds anyway
                self.engine.follow_up(prompt)
            return
        self._armed_at = None
        try:
            # Made here, not in the task: from now on the run is the engine's current one, so what
            # is typed before the task's first step steers or stops this run.
            run = self.engine.run(prompt)
        except Exception as exc:  # a host keeps going: show it, stay usable
            self.r.note(f"the run failed: {type(exc).__name__}: {short(str(exc), 300)}", "red")
            self.shown.set()
            return
        self.task = asyncio.get_running_loop().create_task(self._drive(run), name="agentloop-demo-run")
        self.task.add_done_callback(self._ran)
        self.show_keys()

    async def _drive(self, run: AsyncIterator[Event]) -> None:
        try:
            async for event in run:
                self.r.show(event, self._started_with(event) if isinstance(event, TurnStarted) else ())
                if isinstance(event, TurnStarted):
                    self.shown.set()
                if self.on_event is not None:
                    self.on_event(event)
        except Exception as exc:  # a host keeps going: show it, stay usable
            self.r.note(f"the run failed: {type(exc).__name__}: {short(str(exc), 300)}", "red")

    def _started_with(self, event: TurnStarted) -> list[str]:
        """The texts ``event``'s turn starts with, when it is more than its prompt: the queued
        texts it took (its ids), which the engine committed just before it, and its prompt."""
        if event.prompt is None or not event.ids or event.ids == (event.prompt.meta.get("receipt"),):
            return []
        ids = set(event.ids)
        recent = self.engine.messages[-len(ids) - 1 :]
        queued = [m.text for m in recent if m.role == "user" and m.meta.get("receipt") in ids]
        return queued if event.prompt.meta.get("receipt") in ids else [*queued, event.prompt.text]

    def _ran(self, task: asyncio.Task[None]) -> None:
        self.shown.set()
        if self._input_ended:  # nothing more will be typed: the session is over
            self.exit.set()
        queued = len(self.engine.inbox.follow_ups)
        hint = f"{queued} queued message(s): press Enter to run" if queued else "type a message, /help, Ctrl-D to exit"
        self.r.idle(hint if queued or self.editor is None else "")  # else the input line says it
        self.show_keys()
        if self.hints and not self.exit.is_set() and not self.r.screen.status_shown:
            self.r.note(f"idle \u2014 {hint}", "dim")
        if self.on_idle is not None:
            self.on_idle()

    async def close(self) -> None:
        """Stop the run in progress (reason "quit") and wait for it to settle."""
        if self.task is not None:
            if not self.task.done():
                self.engine.interrupt("quit")
            await self.task

    # -- input ----------------------------------------------------------------------------

    def show_keys(self) -> None:
        """What the keys do now, on the input line while nothing is typed."""
        if self.busy:
            keys = ["Ctrl-C interrupt", "type to steer" if self.mode == "steer" else "type to queue", "!text send now"]
        elif self.engine.inbox.follow_ups:
            keys = ["Enter runs the queued message", "Ctrl-D exit"]
        else:
            keys = ["type a message", "Ctrl-D exit"]
        self.r.screen.hint([*keys, "/help"])

    def handle(self, item: Input) -> None:
        if self.exit.is_set():  # a line after /quit (a pipe, a paste): the session is over
            return
        if item.kind == "command":
            if self.echo:
                self.r.note(f"\u203a /{item.text}" + (f" {item.arg}" if item.arg else ""), "dim")
            self.command(item.text, item.arg)
        elif item.kind == "send_now":
            self.send_now(item.text) if item.text else self.r.note("usage: !text sends text now", "dim")
        elif item.kind == "message":
            self.message(item.text)
        elif not self.busy and self.engine.inbox.follow_ups:
            self.start(None)

    def message(self, text: str) -> None:
        if not self.busy:
            self.start(text)  # the turn header shows the prompt
        elif self.mode == "steer":
            self.r.note(f"you (steer): {short(text, 200)}  -> engine.interject, delivered at the next safe point", "magenta")
            self.r.stats.steers += 1
            self.engine.interject(text)
        else:
            self.r.note(f"you (queued): {short(text, 200)}  -> engine.follow_up, runs when this turn completes", "magenta")
            self.engine.follow_up(text)

    def send_now(self, text: str) -> None:
        if self.busy:
            self.r.note(f"you (send now): {short(text, 200)}  -> engine.send_now", "magenta")
            self.engine.send_now(text)
        else:  # nothing to replace: a turn like any other (its header shows the text)
            self.start(text)

    def command(self, name: str, arg: str) -> None:
        if name in ("quit", "exit", "q"):
            self.quit()
        elif name == "help":
            self.r.help()
        elif name == "mode":
            arg = arg.lower()
            if arg == "steer":
                self.mode = "steer"
            elif arg == "queue":
                self.mode = "queue"
            elif arg:
                self.r.note("usage: /mode steer|queue", "red")
                return
            self.r.note(f"typing while the agent works will {'steer it' if self.mode == 'steer' else 'queue a turn'}")
            self.show_keys()
        elif name == "transcript":
            self.print_transcript()
        else:
            self.r.note(f"unknown command /{name}: try /help", "red")

    def print_transcript(self) -> None:
        msgs = self.engine.messages
        self.r.note(f"transcript ({len(msgs)} message{'' if len(msgs) == 1 else 's'}):", "bold")
        for line in format_transcript(msgs):
            self.r.screen.line(line)

    def sigint(self) -> None:
        """Ctrl-C: cancel the turn; when idle, clear the line being typed, or a hint, and a second
        one within `IDLE_CTRL_C_WINDOW` seconds exits."""
        if self.busy:
            self.r.note("Ctrl-C: cancel -> engine.interrupt('cancel')", "yellow")
            self.engine.interrupt("cancel")
        elif self.editor is not None and self.editor.text:  # as a shell does
            self.editor.clear()
            self.r.screen.typed("", 0)
        elif self._armed_at is not None and self._clock() - self._armed_at <= IDLE_CTRL_C_WINDOW:
            self.quit()
        else:
            self._armed_at = self._clock()
            self.r.note(f"(idle: Ctrl-C again within {IDLE_CTRL_C_WINDOW:g}s, or Ctrl-D, to exit)", "dim")

    def end_of_input(self) -> None:
        """The end of input that is not a person at a terminal (a pipe, a file): what it asked
        for is played to the end, then the session ends. (Ctrl-D on a terminal is `quit`.)"""
        self._input_ended = True
        if self.exit.is_set():  # /quit came first: it is ending already
            return
        if self.busy:
            self.r.note("(end of input: the demo exits when this turn ends; Ctrl-C stops it now)", "dim")
        else:
            self.quit()

    def quit(self) -> None:
        if self.busy:
            self.engine.interrupt("quit")
        self.exit.set()

    # -- the end ------------------------------------------------------------------------

    def summary(self) -> bool:
        """Print the exit summary and the final transcript; True when the transcript is valid."""
        st = self.r.stats
        problems = validate_transcript(self.engine.messages)
        terminals = ", ".join(f"{k} x{v}" for k, v in sorted(st.terminals.items())) or "none"
        self.r.note("\u2500\u2500 summary \u2500\u2500", "bold")
        self.r.note(
            f"turns: {st.turns}   tool calls: {st.tool_calls}   interrupts: {st.interrupts}   "
            f"doom loops cut: {st.doom_loops}   nudges: {st.nudges}   steers: {st.steers}"
        )
        self.r.note(f"terminals: {terminals}")
        self.print_transcript()
        if problems:
            self.r.note("transcript INVALID: " + "; ".join(problems), "red", "bold")
        else:
            self.r.note("transcript valid (validate_transcript(engine.messages) == [])", "green", "bold")
        return not problems
