"""Keyboard input without blocking the event loop.

`LineReader` watches a file descriptor with ``loop.add_reader`` (TTYs, pipes)
and falls back to a daemon thread feeding ``loop.call_soon_threadsafe`` where
the selector cannot watch it (a regular file). It reads with ``os.read`` on the
raw descriptor, never through ``sys.stdin``'s buffered object, so an
abandoned thread holds no interpreter lock at exit.

`parse` turns a typed line into an `Input`: a command (``/help``), a send-now
message (``!text``) or a plain message.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import re
import threading
from collections.abc import Callable
from dataclasses import dataclass
from typing import Literal

__all__ = ["HELP", "Input", "LineReader", "parse"]

HELP = """\
keys     Ctrl-C  cancel the running turn (when idle: press it again to exit)
         Ctrl-D  exit (the summary and the final transcript are printed)
typing   while the agent works, a line steers it (/mode steer, the default:
         engine.interject) or waits for the turn to end (/mode queue:
         engine.follow_up); when idle, a line starts a new turn.
         !text   stop the current turn and send text now (engine.send_now)
commands /help  /mode steer|queue  /transcript  /quit"""


# What a terminal puts in a line for a key that is not text: an escape sequence (an arrow or
# function key: CSI or SS3; ESC and one character for Alt+key) or another control character
# (a tab is kept, as a space). Printed back, it would move the cursor over earlier output.
_CONTROL = re.compile(r"\x1b(?:\[[0-?]*[ -/]*[@-~]|O.|.)?|[\x00-\x08\x0a-\x1f\x7f-\x9f]", re.DOTALL)


@dataclass(frozen=True, slots=True)
class Input:
    kind: Literal["command", "send_now", "message", "empty"]
    text: str
    arg: str = ""


def parse(line: str) -> Input:
    """Classify one typed line (without the control characters and escape sequences it holds)."""
    text = _CONTROL.sub("", line.replace("\t", " ")).strip()
    if not text:
        return Input("empty", "")
    if text.startswith("/"):
        name, _, arg = text[1:].partition(" ")
        return Input("command", name.lower(), arg.strip())
    if text.startswith("!"):
        return Input("send_now", text[1:].strip())
    return Input("message", text)


class LineReader:
    """Calls ``on_line(text)`` per complete line and ``on_eof()`` once at end of input.

    Standard input is read by a daemon thread, never by the event loop: a Ctrl-C
    makes the terminal discard typed input, so a read that ``select()`` announced
    can find nothing and block; in a thread that costs nothing, in the loop it
    would freeze the demo (including its Ctrl-C handling).
    """

    def __init__(
        self,
        loop: asyncio.AbstractEventLoop,
        fd: int,
        on_line: Callable[[str], None],
        on_eof: Callable[[], None],
    ) -> None:
        self._loop = loop
        self._fd = fd
        self._on_line = on_line
        self._on_eof = on_eof
        self._buf = b""
        self._closed = False

    def start(self) -> None:
        threading.Thread(target=self._pump, name="agentloop-demo-stdin", daemon=True).start()

    def stop(self) -> None:
        self._closed = True

    def _pump(self) -> None:
        while True:
            try:
                data = os.read(self._fd, 4096)
            except OSError:  # e.g. EIO when the terminal went away
                data = b""
            with contextlib.suppress(RuntimeError):  # the loop is closed: nobody listens
                self._loop.call_soon_threadsafe(self._feed, data)
            if not data:
                return

    def _feed(self, data: bytes) -> None:
        if self._closed:
            return
        if not data:
            rest, self._buf = self._buf, b""
            if rest.strip():
                self._on_line(rest.decode("utf-8", "replace"))
            self.stop()
            self._on_eof()
            return
        self._buf += data
        while b"\n" in self._buf:
            line, self._buf = self._buf.split(b"\n", 1)
            self._on_line(line.decode("utf-8", "replace"))
