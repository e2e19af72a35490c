"""Keyboard input without blocking the event loop.

`LineReader` reads the keyboard's file descriptor in a daemon thread and hands
what it reads to the event loop (``loop.call_soon_threadsafe``): whole lines,
or, with a `LineEditor`, the keys for the demo's own line editing. It reads
with ``os.read`` on the raw descriptor, never through ``sys.stdin``'s buffered
object, so an abandoned thread holds no interpreter lock at exit, and decodes
in the keyboard's encoding (the locale's), so a key cut across two reads is
not lost.

`TerminalMode` sets the terminal up for the session and gives it back (at the
end, and on Ctrl-Z): keys unechoed and one by one for the demo's line editor,
and Ctrl-C never echoed as ``^C`` over the output.

`Blocking` puts standard input and output in blocking mode for the session and
back as they were at the end: another program (a crashed node or ssh) can leave
the terminal non-blocking (O_NONBLOCK), and a read or a write would then fail
with EAGAIN. The flag found set again during the session (`Blocking.ensure`) is
put back at the end too. A read that still finds it set waits until there is
something to read.

`parse` turns a typed line into an `Input`: a command (``/help``), a send-now
message (``!text``) or a plain message.
"""

from __future__ import annotations

import asyncio
import codecs
import contextlib
import os
import re
import select
import threading
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Literal

from .editor import LineEditor

try:
    import fcntl
    import termios
except ImportError:  # pragma: no cover - not a POSIX system: the terminal is left as it is
    fcntl = None  # type: ignore[assignment]
    termios = None  # type: ignore[assignment]

__all__ = ["Blocking", "Input", "LineReader", "TerminalMode", "blocking", "parse"]

# What a terminal puts in a line for a key that is not text: an escape sequence (an arrow or
# function key: CSI or SS3; ESC and one character for Alt+key) or another control character
# (a tab is kept, as a space; a line break, from a pasted message of several lines, too).
_CONTROL = re.compile(r"\x1b(?:\[[0-?]*[ -/]*[@-~]|O.|.)?|[\x00-\x08\x0b-\x1f\x7f-\x9f]", re.DOTALL)


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


class TerminalMode:
    """The keyboard terminal's settings for the session; `restore` gives back the ones it had.

    ``"edit"``: keys come one by one and are not echoed (the demo edits and draws the line);
    ``"lines"``: the terminal edits and echoes lines as usual; ``"quiet"``: lines, not echoed
    (nothing reads them: a scenario plays). In every mode Ctrl-C and Ctrl-Z still send their
    signals, and are not echoed as ``^C`` in the middle of the output.
    """

    def __init__(self, fd: int, mode: Literal["edit", "lines", "quiet"]) -> None:
        self.fd = fd
        self.mode = mode
        self._saved: list[Any] | None = None  # the settings to give back

    def apply(self) -> bool:
        """Set the mode up (again, after a Ctrl-Z); False where the descriptor is no terminal."""
        if termios is None:  # pragma: no cover
            return False
        try:
            saved = termios.tcgetattr(self.fd)
        except (termios.error, OSError, ValueError):
            return False
        attrs = list(saved)
        lflag = attrs[3] & ~getattr(termios, "ECHOCTL", 0)
        if self.mode == "edit":
            lflag &= ~(termios.ICANON | termios.ECHO | termios.IEXTEN)
            cc = list(attrs[6])
            cc[termios.VMIN], cc[termios.VTIME] = 1, 0
            attrs[6] = cc
        elif self.mode == "quiet":
            lflag &= ~termios.ECHO
        attrs[3] = lflag
        try:
            termios.tcsetattr(self.fd, termios.TCSANOW, attrs)
        except (termios.error, OSError):
            return False
        self._saved = saved
        return True

    def restore(self) -> None:
        """Give the terminal its settings back (keys typed and not read yet are dropped, as they
        were typed for the demo, not for the shell)."""
        saved, self._saved = self._saved, None
        if saved is not None and termios is not None:
            with contextlib.suppress(termios.error, OSError):
                termios.tcsetattr(self.fd, termios.TCSAFLUSH, saved)


def blocking(fd: int) -> bool:
    """Clear O_NONBLOCK on ``fd``; True if it was set (and is cleared now)."""
    if fcntl is None:  # pragma: no cover
        return False
    try:
        flags = fcntl.fcntl(fd, fcntl.F_GETFL)
        if not flags & os.O_NONBLOCK:
            return False
        fcntl.fcntl(fd, fcntl.F_SETFL, flags & ~os.O_NONBLOCK)
    except (OSError, ValueError):
        return False
    return True


class Blocking:
    """Blocking mode on the descriptors given for the session; `restore` sets O_NONBLOCK again on
    those that had it (the flag belongs to the open file, which the shell shares), and on those
    `ensure` found non-blocking later in the session (another program set the flag meanwhile)."""

    def __init__(self, fds: list[int]) -> None:
        self._fds = fds
        self._cleared: list[int] = []

    def apply(self) -> None:
        """Make the descriptors given blocking; each is recorded as soon as its flag is cleared
        (a Ctrl-C in between leaves nothing that `restore` does not put back)."""
        for fd in dict.fromkeys(self._fds):
            self.ensure(fd)

    def ensure(self, fd: int) -> bool:
        """Clear O_NONBLOCK on ``fd`` if it is set, recorded for `restore`; True if it was set."""
        if not blocking(fd):
            return False
        if fd not in self._cleared:
            self._cleared.append(fd)
        return True

    def restore(self) -> None:
        cleared, self._cleared = self._cleared, []
        for fd in cleared:
            with contextlib.suppress(OSError, ValueError):
                fcntl.fcntl(fd, fcntl.F_SETFL, fcntl.fcntl(fd, fcntl.F_GETFL) | os.O_NONBLOCK)


class LineReader:
    """Calls ``on_line(text)`` per complete line and ``on_eof()`` once at end of input.

    With an ``editor`` the bytes read are keys: the editor makes the lines (Enter), the end of
    input (Ctrl-D on an empty line), and ``on_edit()`` is called after each read to redraw the
    line being typed. ``partial``: a last line without its line break counts at the end of input
    (a pipe, a file); on a terminal, Ctrl-D ends the input and the text typed before it, never
    sent with Enter, is dropped.

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
        *,
        encoding: str = "utf-8",
        editor: LineEditor | None = None,
        on_edit: Callable[[], None] | None = None,
        partial: bool = True,
    ) -> None:
        self._loop = loop
        self._fd = fd
        self._on_line = on_line
        self._on_eof = on_eof
        self.editor = editor
        self._on_edit = on_edit
        self._partial = partial
        try:
            self._decoder = codecs.getincrementaldecoder(encoding)("replace")
        except LookupError:
            self._decoder = codecs.getincrementaldecoder("utf-8")("replace")
        self._parts: list[str] = []  # the line in progress, as read
        self._closed = False

    @property
    def unsent(self) -> str:
        """Text typed with no Enter after it (none with an editor, which draws the line itself):
        on a terminal that echoes the lines, the cursor is still after it."""
        return "".join(self._parts)

    def _lines(self, text: str) -> list[str]:
        """The lines ``text`` completes. Only ``text`` is searched for line breaks and the line in
        progress is joined once it ends: a long line from a pipe is read in linear time."""
        *ended, rest = text.split("\n")
        if ended:
            ended[0] = "".join([*self._parts, ended[0]])
            self._parts = []
        if rest:
            self._parts.append(rest)
        return ended

    def start(self) -> None:
        threading.Thread(target=self._pump, name="agentloop-demo-stdin", daemon=True).start()

    def stop(self) -> None:
        self._closed = True

    def _pump(self) -> None:
        while True:
            try:
                data = os.read(self._fd, 4096)
            except BlockingIOError:  # made non-blocking again by another program: wait for input
                if self._wait():
                    continue
                data = b""
            except OSError:  # e.g. EIO when the terminal went away
                data = b""
            with contextlib.suppress(RuntimeError):  # the loop is closed: nobody listens
                self._loop.call_soon_threadsafe(self.feed, data)
            if not data:
                return

    def _wait(self) -> bool:
        """Wait until the descriptor is readable; False if it cannot be waited on."""
        try:
            select.select([self._fd], [], [])
        except (OSError, ValueError):
            return False
        return True

    def feed(self, data: bytes) -> None:
        """Take ``data`` as read (``b""``: the end of input)."""
        if self._closed:
            return
        text = self._decoder.decode(data, final=not data)
        if self.editor is not None:
            lines = self.editor.feed(text)
            if self._on_edit is not None:
                self._on_edit()
            ended = self.editor.eof or not data
        else:
            lines = self._lines(text)
            ended = not data
            if ended and self._partial and self.unsent.strip():
                lines.append(self.unsent)
                self._parts = []
        for line in lines:
            if self._closed:
                return
            self._on_line(line)
        if ended and not self._closed:
            self.stop()
            self._on_eof()
