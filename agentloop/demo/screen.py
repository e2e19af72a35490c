"""The terminal: colours, a status line pinned to the bottom row, and a clean exit.

On a TTY the status line lives on the last row, outside a scroll region
(DECSTBM) that holds everything else, so streamed text never overwrites it.
Piped output (or ``--plain``) gets neither the status line nor any escape
sequence; ``NO_COLOR`` (https://no-color.org) removes the colours only.

Output that goes away (a pipe into ``head`` that closed, a terminal that hung
up) is not an error of the demo: the screen drops what follows and calls
``on_closed`` once, so the host can end the session. A character the output's
encoding cannot hold (a console in an 8-bit code page) is written as its ASCII
look-alike where the demo's symbols have one (``--`` for ``──``), else as ``?``.
"""

from __future__ import annotations

import errno
import os
import shutil
from collections.abc import Callable
from typing import TextIO

__all__ = ["Screen", "Style"]

# The output went away: the reader closed the pipe, the terminal hung up, the descriptor was closed.
_GONE = frozenset({errno.EPIPE, errno.ECONNRESET, errno.EIO, errno.EBADF})

_CODES = {
    "bold": "1",
    "dim": "2",
    "red": "31",
    "green": "32",
    "yellow": "33",
    "blue": "34",
    "magenta": "35",
    "cyan": "36",
}

# The demo's symbols in ASCII, for an output encoding without them.
_ASCII = str.maketrans({
    "\u2500": "-", "\u2699": "*", "\u2713": "+", "\u2717": "x", "\u2298": "-", "\u21aa": ">",
    "\u2691": "!", "\u26a0": "!", "\u21bb": "~", "\u25a0": "#", "\u2014": "-", "\u2013": "-",
    "\u2026": "...", "\u201c": '"', "\u201d": '"', "\u2018": "'", "\u2019": "'", "\u203a": ">",
    "\u21b5": "|", "\u00b7": "-",
})


class Style:
    """ANSI styling, or none at all."""

    def __init__(self, enabled: bool) -> None:
        self.enabled = enabled

    def __call__(self, text: str, *names: str) -> str:
        if not self.enabled or not names or not text:
            return text
        codes = ";".join(_CODES[n] for n in names)
        return f"\x1b[{codes}m{text}\x1b[0m"


class Screen:
    """Writes output; keeps track of the cursor column and of the status line."""

    def __init__(self, out: TextIO, *, tty: bool, color: bool) -> None:
        self.out = out
        self.tty = tty
        self.style = Style(color)
        self.at_line_start = True
        self.closed = False  # the output went away: nothing more is written
        self._live = False  # started on a TTY: a status line whenever the terminal has room
        self.on_closed: Callable[[], None] | None = None
        self._status = ""
        self._rows = 0
        self._drawn = False

    @classmethod
    def for_stream(cls, out: TextIO, *, plain: bool = False) -> Screen:
        tty = not plain and out.isatty() and os.environ.get("TERM", "") != "dumb"
        color = tty and not os.environ.get("NO_COLOR")
        return cls(out, tty=tty, color=color)

    # -- output -----------------------------------------------------------------

    def _emit(self, text: str) -> None:
        """Write and flush ``text``; every byte the screen writes goes through here."""
        if self.closed:
            return
        try:
            try:
                self.out.write(text)
            except UnicodeEncodeError:  # the stream encodes before it writes: nothing went out yet
                encoding = getattr(self.out, "encoding", None) or "ascii"
                self.out.write(text.translate(_ASCII).encode(encoding, "replace").decode(encoding))
            self.out.flush()
        except OSError as exc:
            if exc.errno not in _GONE:  # a full disk, a non-blocking terminal: not "nobody reads"
                raise
            self._close()

    def _close(self) -> None:
        self.closed = True
        self._rows = 0
        # What the stream still buffers would fail again when the interpreter flushes it at
        # exit (a traceback on stderr): point its descriptor at /dev/null, as a CLI should.
        try:
            fd = self.out.fileno()
            devnull = os.open(os.devnull, os.O_WRONLY)
            try:
                os.dup2(devnull, fd)
            finally:
                os.close(devnull)
        except (OSError, ValueError):
            pass
        if self.on_closed is not None:
            self.on_closed()

    def write(self, text: str) -> None:
        """Write ``text`` as is (streamed deltas)."""
        if not text:
            return
        self.at_line_start = text.endswith("\n")
        self._emit(text)

    def line(self, text: str = "") -> None:
        """Write ``text`` on a line of its own, in one write."""
        prefix = "" if self.at_line_start else "\n"
        self.at_line_start = True
        self._emit(f"{prefix}{text}\n")

    # -- the status line -----------------------------------------------------------

    @property
    def status_shown(self) -> bool:
        """A status line is on the screen (a TTY with room for it)."""
        return bool(self._rows)

    def _size(self) -> os.terminal_size:
        """The size of the terminal the screen writes to, asked of the terminal itself: the row
        numbers of the escape sequences are its rows. LINES and COLUMNS in the environment
        (exported by a shell profile, stale after a resize) count only when it cannot tell."""
        try:
            size = os.get_terminal_size(self.out.fileno())
        except (OSError, ValueError):  # io.UnsupportedOperation is both
            size = os.terminal_size((0, 0))
        if size.lines > 0 and size.columns > 0:
            return size
        return shutil.get_terminal_size((0, 0))

    def start(self) -> None:
        """Reserve the bottom row for the status line (TTY only)."""
        if not self.tty:
            return
        self._live = True
        rows = self._size().lines
        if rows < 4:  # no room for now: a resize that makes room brings the status line
            return
        self._rows = rows
        # The region's bottom is the row above the status; keep the cursor at its end.
        self._emit(f"\n\x1b[1;{rows - 1}r\x1b[{rows - 1};1H")
        self.status(self._status or "starting")

    def resized(self) -> None:
        """The terminal changed size (SIGWINCH): set the region up again (or drop it while
        the terminal is too small for one, until it is large enough again)."""
        if not self._live:
            return
        if self._rows:
            self._rows = 0
            self._emit("\x1b7\x1b[r\x1b8")
        self._drawn = False
        rows = self._size().lines
        if rows >= 4 and not self.closed:
            self._rows = rows
            self._emit(f"\x1b7\x1b[1;{rows - 1}r\x1b8")
        self.status(self._status)

    def status(self, text: str) -> None:
        """Show ``text`` on the status line (remembered, drawn on a TTY only, and only when it changes)."""
        if text == self._status and self._drawn:
            return
        self._status = text
        if not self._rows:
            return
        self._drawn = True
        cols = self._size().columns or 80
        shown = self.style(f" {text} ".ljust(cols - 1)[: cols - 1], "bold", "blue")
        self._emit(f"\x1b7\x1b[{self._rows};1H\x1b[2K{shown}\x1b8")

    def suspend(self) -> None:
        """Ctrl-Z: give the whole terminal back to the shell until `resume`."""
        if not self._rows:
            return
        rows, self._rows = self._rows, 0
        self._drawn = False
        self._emit(f"\x1b7\x1b[r\x1b[{rows};1H\x1b[2K\x1b8\x1b[0m")

    def resume(self) -> None:
        """Back in the foreground (``fg``): the status line is set up again, below a fresh line."""
        if self._live and not self.closed:
            self.at_line_start = True
            self.start()

    def stop(self) -> None:
        """Give the whole terminal back: no region, no status line, attributes reset."""
        self._live = False
        if not self._rows:
            return
        rows, self._rows = self._rows, 0
        end = "" if self.at_line_start else "\n"
        self.at_line_start = True
        self._emit(f"\x1b7\x1b[r\x1b[{rows};1H\x1b[2K\x1b8\x1b[0m{end}")
