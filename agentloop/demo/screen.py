"""The terminal: colours, a status line and an input line pinned to the bottom, and a clean exit.

On a TTY the bottom rows live outside a scroll region (DECSTBM) that holds
everything else, so streamed text never overwrites them: the status line, and,
when the keyboard is read key by key (`start(keyboard=True)`), the line being
typed below it, drawn by the demo with a cursor of its own (the terminal's is
hidden: it stays where the output goes on). Lines of output are wrapped at word
boundaries (and between the characters of Chinese or Japanese text, which has no spaces) to
the terminal's width, going on under their indent; so is streamed text (`Screen.flow`), as it
comes (see `Flow`).

Piped output (or ``--plain``) gets none of this, nor any escape sequence;
``NO_COLOR`` (https://no-color.org) removes the colours only.

Output made non-blocking by another program (O_NONBLOCK: a crashed node or ssh
leaves a terminal so) is made blocking again before each write, through the
session's `Blocking`, which puts the flag back at the end: a write that found the
pipe or the terminal full would fail with EAGAIN and drop text. Output with a
descriptor is written to it directly, to the last byte: a flag set again in the
middle of a write (the text layer would drop what did not fit, silently, under
``python -u``) makes the screen wait until the output has room, and go on.

Output that goes away (a pipe into ``head`` that closed, a terminal that hung
up) is not an error of the demo: the screen drops what follows and calls
``on_closed`` once, so the host can end the session. Output that cannot be
written (a full disk) ends it the same way, and ``failed`` says why. A character the output's
encoding cannot hold (a console in an 8-bit code page) is written as its ASCII
look-alike where the demo's symbols have one (``--`` for ``──``), else as ``?``.
"""

from __future__ import annotations

import errno
import os
import re
import select
import shutil
import unicodedata
from collections.abc import Callable, Iterator, Sequence
from typing import TextIO

from .keyboard import Blocking

__all__ = ["Flow", "Screen", "Style", "clusters", "fit_input", "shorten", "wrap"]

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
_ESCAPE = re.compile(r"\x1b\[[0-?]*[ -/]*[@-~]")
_TOKEN = re.compile(r"\x1b\[[0-?]*[ -/]*[@-~]|.", re.DOTALL)  # an escape sequence, or a character
_ZWJ = "\u200d"  # the zero-width joiner: what follows it is part of the same emoji
_FLAGS_HALF = frozenset(chr(c) for c in range(0x1F1E6, 0x1F200))  # regional indicators: a flag is two
# CJK marks a row does not begin with (closing), and does not end with (opening).
_NO_START = frozenset("\u3001\u3002\uff0c\uff0e\uff1a\uff1b\uff1f\uff01\uff09\u300d\u300f\u3011\u3015\u3009\u300b\uff5d\uff3d\u30fc\u3005\u30fb")
_NO_END = frozenset("\uff08\u300c\u300e\u3010\u3014\u3008\u300a\uff5b\uff3b")
PROMPT = "\u203a "  # the input line's prompt
_NEWLINE = "\u21b5"  # a line break in the line being typed (a pasted message of several lines)
_HIDE_CURSOR, _SHOW_CURSOR = "\x1b[?25l", "\x1b[?25h"  # the terminal's own cursor
_NARROW = 10  # a width under which nothing is wrapped
_PASTE_ON, _PASTE_OFF = "\x1b[?2004h", "\x1b[?2004l"  # bracketed paste


def cells(text: str) -> int:
    """The columns ``text`` takes on a terminal: 2 for a wide character, 0 for a combining one."""
    return sum(_cell(ch) for ch in text)


def _shows(out: object, symbols: str) -> bool:
    """Whether ``out`` can write ``symbols`` (its encoding holds them; a stream of text, such as
    a ``StringIO``, with no encoding holds all)."""
    encoding = getattr(out, "encoding", None)
    if not encoding:
        return True
    try:
        symbols.encode(encoding)
    except (UnicodeEncodeError, LookupError):
        return False
    return True


def _cell(ch: str) -> int:
    if unicodedata.combining(ch) or unicodedata.category(ch) in ("Mn", "Me", "Cf"):
        return 0
    return 2 if unicodedata.east_asian_width(ch) in ("W", "F") else 1


def _cell_ascii(ch: str) -> int:
    """The columns ``ch`` may take on an output that cannot show the demo's symbols: as written
    in ASCII when it has a look-alike ("..." for "\u2026"), a "?" when it has none; counted wide
    rather than narrow when unsure."""
    return max(_cell(ch), len(ch.translate(_ASCII)))


def _cut(text: str, width: int) -> str:
    """The start of ``text`` that fits in ``width`` columns."""
    used = 0
    for i, ch in enumerate(text):
        used += _cell(ch)
        if used > width:
            return text[:i]
    return text


def shorten(text: str, width: int, mark: str = "\u2026") -> str:
    """``text`` if it takes at most ``width`` columns, else its start and ``mark`` in ``width``
    columns, cut between two characters as a terminal shows them (`clusters`)."""
    if _fits(text, width):
        return text
    room, kept = width - cells(mark), []
    for cluster in _each_cluster(text):
        room -= cells(cluster)
        if room < 0:
            break
        kept.append(cluster)
    return "".join(kept) + mark


def _fits(text: str, width: int) -> bool:
    """``cells(text) <= width``, reading no further than the columns tell (a pasted file is long)."""
    used = 0
    for ch in text:
        used += _cell(ch)
        if used > width:
            return False
    return True


def _cut_end(text: str, width: int) -> str:
    """The end of ``text`` that fits in ``width`` columns."""
    used = 0
    for i in range(len(text) - 1, -1, -1):
        used += _cell(text[i])
        if used > width:
            return text[i + 1 :]
    return text


def wrap(text: str, width: int, indent: int | None = None) -> str:
    """``text`` with a line break where what comes next would go past ``width`` columns: before
    a word, or between two characters of text without spaces where one of them is wide (Chinese,
    Japanese); each line it breaks goes on under ``indent`` spaces (default: its own indent, plus
    two). A word too long for a row is broken where the row ends. A break never splits what a
    terminal shows as one character (an emoji sequence, a letter and its accents), nor puts a
    closing CJK mark (a comma, a full stop, a closing bracket) at the start of a row or an
    opening one at the end. Wide characters take two columns, combining marks none, escape
    sequences no room."""
    if width < _NARROW:
        return text
    out: list[str] = []
    for line in text.split("\n"):
        plain = _ESCAPE.sub("", line)
        if cells(plain) <= width:
            out.append(line)
            continue
        hang = len(plain) - len(plain.lstrip(" ")) + 2 if indent is None else indent
        out.append(_wrap_line(line, width, min(hang, width // 2)))
    return "\n".join(out)


def _wrap_line(line: str, width: int, hang: int) -> str:
    """``line`` broken into rows of ``width`` columns, each after the first under ``hang`` spaces."""
    pieces: list[str] = []
    col = 0
    for k, (sep, unit) in enumerate(_units(line, width - hang)):
        w = cells(_ESCAPE.sub("", unit))
        if k and not w and col >= width:
            pieces.append(unit)  # a space that would only begin the next row: left out
        elif k and w and col and col >= hang and col + len(sep) + w > width:
            pieces.append("\n" + " " * hang + unit)
            col = hang + w
        else:
            pieces.append(sep + unit)
            col += len(sep) + w
    return "".join(pieces)


def _units(line: str, room: int) -> Iterator[tuple[str, str]]:
    """The pieces of ``line`` a row may break between, each with what goes before it when on the
    same row: a word after a space; within a word, a wide character after nothing (`_parts`)."""
    for i, word in enumerate(line.split(" ")):
        for j, part in enumerate(_parts(word, room)):
            yield (" " if i and not j else ""), part


def _parts(word: str, room: int) -> list[str]:
    """``word`` cut where a row may break inside it; into its characters (`clusters`) when it is
    longer than ``room`` columns, or a piece of it is."""
    units = clusters(word)
    if not units:
        return [word]
    parts = [units[0]]
    # The end of the current part without its escapes, as far back as `_breakable` reads (its
    # last character with a width, and the two before the end): not the whole part again for
    # every character of a long word.
    before = _ESCAPE.sub("", units[0])
    for unit in units[1:]:
        plain = _ESCAPE.sub("", unit)
        if before and _breakable(before, plain[:1]):
            parts.append(unit)
            before = plain
        else:
            parts[-1] += unit
            before = before[-1:] + plain if any(_cell(c) for c in plain) else before + plain
    if any(cells(_ESCAPE.sub("", part)) > room for part in parts):
        return units
    return parts


def clusters(text: str) -> list[str]:
    """``text`` cut into what a terminal shows as one character each: a character with the
    combining marks, variation selectors and zero-width joiners after it (a ZWJ emoji sequence
    is one), a pair of regional indicators (a flag). An escape sequence goes with the character
    after it (with the last one at the end)."""
    return list(_each_cluster(text))


def _each_cluster(text: str) -> Iterator[str]:
    """`clusters`, one at a time: a reader that stops early (`shorten`) cuts no more of a long text."""
    current: str | None = None
    pending = ""  # escape sequences before the next character
    for match in _TOKEN.finditer(text):
        token = match.group()
        if token.startswith("\x1b") and len(token) > 1:
            pending += token
        elif current is not None and not pending and _joins(_ESCAPE.sub("", current), token):
            current += token
        else:
            if current is not None:
                yield current
            current = pending + token
            pending = ""
    if pending:
        current = current + pending if current is not None else pending
    if current is not None:
        yield current


def _joins(cluster: str, ch: str) -> bool:
    """Whether ``ch`` belongs to the character ``cluster`` shows (its end so far)."""
    if not cluster:
        return False
    return _cell(ch) == 0 or cluster.endswith(_ZWJ) or (cluster in _FLAGS_HALF and ch in _FLAGS_HALF)


def _breakable(before: str, ch: str) -> bool:
    """Whether a row may break between ``before`` (a word so far) and its next character ``ch``:
    where either is wide (text without spaces), not inside a character (`_joins`), not before a
    closing CJK mark nor after an opening one."""
    if not ch or _joins(_last_cluster(before), ch):
        return False
    last = next((c for c in reversed(before) if _cell(c)), "")
    if ch in _NO_START or last in _NO_END:
        return False
    return _wide(ch) or _wide(last)


def _last_cluster(text: str) -> str:
    """The end of ``text`` that is one character on a terminal (enough of it for `_joins`)."""
    return text[-2:] if len(text) >= 2 and text[-2] in _FLAGS_HALF and text[-1] in _FLAGS_HALF else text[-1:]


def _wide(ch: str) -> bool:
    return bool(ch) and unicodedata.east_asian_width(ch) in ("W", "F")


class Flow:
    """Streamed text wrapped at word boundaries as it comes, in rows of at most ``width`` columns.

    `feed` returns what can be written now and holds back only the word in progress (and the
    blanks before it): whether it fits the row is known once it ends. `end` (the end of the
    block) returns what is held. A word that would cross the edge goes on the next row, under
    the indent of the text's line plus two (as `wrap` does); the blanks where a row breaks are
    left out; a word too long for any row is written as it comes, broken where each row ends;
    the text's own line breaks are kept. Text without spaces may break between wide characters,
    as in `wrap`. Wide characters take two columns; what a terminal shows as one character (an
    emoji sequence, a letter and its accents: `clusters`) is never cut.
    The rows do not depend on how the text is cut into chunks. ``column``: where the cursor is
    (after a label); ``width`` under 10 (the output is not a terminal): nothing is wrapped.
    """

    def __init__(self, width: int, column: int = 0, cell: Callable[[str], int] = _cell) -> None:
        self.width = width
        self.column = column  # the cursor's, after what was returned
        self._cell = cell
        self._gap = ""  # the blanks after the last word, held back with the next one
        self._word = ""  # the word in progress, held back
        self._size = 0  # its columns
        self._long = False  # the word in progress is too long for a row: written as it comes
        self._bare = column == 0  # the row holds nothing yet but blanks
        self._lead = True  # the text's line has had only blanks so far
        self._indent = 0  # the columns of those blanks

    def feed(self, text: str) -> str:
        """What to write now of ``text``, the next chunk of the stream."""
        if self.width < _NARROW:
            out = self.end() + text
            _, newline, last = out.rpartition("\n")
            self.column = (0 if newline else self.column) + sum(self._cell(ch) for ch in last)
            self._bare = (bool(newline) or self._bare) and not last.strip(" \t")
            return out
        return "".join([self._take(ch) for ch in text])

    def end(self) -> str:
        """What is held back: the word in progress, on this row or the next."""
        out = self._place()
        self._gap = ""
        return out

    @property
    def _hang(self) -> int:
        return min(self._indent + 2, self.width // 2)

    def _take(self, ch: str) -> str:
        if ch == "\n":
            out = self._place()
            self._gap, self.column, self._bare, self._lead, self._indent = "", 0, True, True, 0
            return out + "\n"
        if ch in " \t":
            out = self._place()
            self._gap += ch
            return out
        if self._lead:
            self._lead, self._indent = False, _blanks(self._gap, 0)
        if self._long:
            return self._held(ch)
        if self._word and _breakable(self._word, ch):  # text without spaces: a row may break here
            return self._place() + self._take(ch)
        self._word += ch
        self._size += self._cell(ch)
        if self._size <= self.width - self._hang:
            return ""
        # No row can hold it: from here on it is written as it comes, a character at a time.
        word, self._long = self._word, True
        out = self._open(self._size)
        *whole, self._word = clusters(word)  # the last may go on (an accent, a joined emoji)
        self._size = 0
        return out + "".join([self._letter(c) for c in whole])

    def _held(self, ch: str) -> str:
        """A character of a word too long for a row: the one before it is written once ``ch``
        does not belong to it (`clusters`); a character is never cut at the row's end."""
        if self._word and not _joins(self._word, ch):
            out, self._word = self._letter(self._word), ch
            return out
        self._word += ch
        return ""

    def _place(self) -> str:
        """The word held back (if any), after its blanks or on the next row."""
        if self._long:
            out = self._letter(self._word) if self._word else ""
            self._long, self._word = False, ""
            return out
        if not self._word:
            return ""
        out = self._open(self._size) + self._word
        self.column += self._size
        self._word, self._size, self._bare = "", 0, False
        return out

    def _open(self, size: int) -> str:
        """What goes before a word of ``size`` columns: its blanks, or a row break if it would
        cross the edge. A row that holds nothing yet is not broken: its blanks are cut to fit."""
        gap = _blanks(self._gap, self.column)
        out, self._gap = self._gap, ""
        if self._bare:
            room = max(0, min(gap, self.width - self.column - size))
            out, gap = (out, gap) if room == gap else (" " * room, room)
        elif self.column + gap + size > self.width:
            return self._break()
        self.column += gap
        return out

    def _letter(self, cluster: str) -> str:
        """One character of a word too long for a row (with its accents, or the emoji it joins):
        on the next row if it would cross the edge."""
        width = sum(self._cell(ch) for ch in cluster)
        out = self._break() if self.column + width > self.width else ""
        self.column += width
        self._bare = False
        return out + cluster

    def _break(self) -> str:
        self.column, self._bare = self._hang, True
        return "\n" + " " * self._hang


def _blanks(gap: str, column: int) -> int:
    """The columns ``gap`` (spaces and tabs) takes written from ``column`` (a tab stop every 8)."""
    end = column
    for ch in gap:
        end = end + 8 - end % 8 if ch == "\t" else end + 1
    return end - column


def fit_input(text: str, cursor: int, width: int, mark: str = "\u2026") -> tuple[str, str, str]:
    """The line being typed as shown in ``width`` columns: (before the cursor, under it, after).

    A line break shows as ``↵``. Text that does not fit is cut at either end, marked ``mark``
    (``…``; ``...`` on an output that cannot show it), so the cursor is always in view; the
    whole takes at most ``width`` columns.
    """
    shown = text.replace("\n", _NEWLINE)
    before, at, after = shown[:cursor], shown[cursor : cursor + 1] or " ", shown[cursor + 1 :]
    room = width - _cell(at)
    if room <= 0:
        return "", at if width > 0 and _cell(at) <= width else "", ""
    wide = cells(mark)
    if not _fits(before, room):  # keep the end of what is before the cursor
        before = mark + _cut_end(before, room - wide) if room >= wide else _cut_end(before, room)
    rest = room - cells(before)
    if not _fits(after, rest):
        after = _cut(after, rest - wide) + mark if rest >= wide else ""
    return before, at, after


def _write_all(fd: int, data: bytes) -> None:
    """Write every byte of ``data`` to ``fd``, once each: a descriptor made non-blocking (by
    another program) that has no room is waited for, and the write goes on where it stopped."""
    rest = memoryview(data)
    while rest:
        try:
            written = os.write(fd, rest)
        except BlockingIOError:
            select.select([], [fd], [])
            continue
        rest = rest[written:]


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
    """Writes output; keeps track of the cursor column, the status line and the input line."""

    def __init__(self, out: TextIO, *, tty: bool, color: bool, modes: Blocking | None = None) -> None:
        self.out = out
        self._modes = modes if modes is not None else Blocking([])  # records the flags it clears
        self.tty = tty
        self.style = Style(color)
        self.at_line_start = True
        self.closed = False  # the output went away: nothing more is written
        self.failed: OSError | None = None  # why, when it was not that nobody reads (a full disk)
        self.keyboard = False  # an input line under the status line (keys read one by one)
        self._live = False  # started on a TTY: a status line whenever the terminal has room
        self.on_closed: Callable[[], None] | None = None
        self._status = ""
        self._typed = ("", 0)  # the line being typed and the cursor's index in it
        self._hint: tuple[str, ...] = ()  # shown on an empty input line: what keys do
        self._rows = 0  # the terminal's rows while the bottom rows are ours, else 0
        self._cols = 0
        self._drawn = False
        self._column = 0  # where the cursor is in its row (while no streamed text is in progress)
        self._flow: Flow | None = None  # the streamed text in progress
        self._flow_style: tuple[str, ...] = ()
        # The output cannot show the demo's symbols (an ASCII-only locale): they are written in
        # ASCII, and what is cut to fit a row is measured as written ("..." takes three columns).
        self._ascii = not _shows(out, "\u2026\u203a")
        self._cell = _cell_ascii if self._ascii else _cell
        # The descriptor written to directly: on POSIX, where another program can make it
        # non-blocking (elsewhere the stream writes, as it would translate line ends or write to
        # a console in its own way).
        try:
            self._fd: int | None = out.fileno() if os.name == "posix" else None
        except (AttributeError, OSError, ValueError):  # a stream in memory, or none at all
            self._fd = None

    @classmethod
    def for_stream(cls, out: TextIO, *, plain: bool = False, modes: Blocking | None = None) -> Screen:
        tty = not plain and out.isatty() and os.environ.get("TERM", "") != "dumb"
        color = tty and not os.environ.get("NO_COLOR")
        return cls(out, tty=tty, color=color, modes=modes)

    # -- output -----------------------------------------------------------------

    def _emit(self, text: str) -> None:
        """Write and flush ``text``; every byte the screen writes goes through here."""
        if self.closed or not text:
            return
        try:
            if self._fd is None:
                self._write(text)
            else:  # made non-blocking by another program meanwhile: blocking again, given back at the end
                self._modes.ensure(self._fd)
                self.out.flush()  # what the stream holds goes first
                _write_all(self._fd, self._encode(text))
        except OSError as exc:
            if exc.errno not in _GONE:  # a full disk: nothing more can be shown, and it is worth saying
                self.failed = exc
            self._close()

    def _write(self, text: str) -> None:
        try:
            self.out.write(text)
        except UnicodeEncodeError:  # the stream encodes before it writes: nothing went out yet
            encoding = getattr(self.out, "encoding", None) or "ascii"
            self.out.write(text.translate(_ASCII).encode(encoding, "replace").decode(encoding))
        self.out.flush()

    def _encode(self, text: str) -> bytes:
        """``text`` in the stream's encoding (what it cannot hold in ASCII look-alikes, else ``?``)."""
        encoding = getattr(self.out, "encoding", None) or "utf-8"
        try:
            return text.encode(encoding, getattr(self.out, "errors", None) or "strict")
        except UnicodeEncodeError:
            return text.translate(_ASCII).encode(encoding, "replace")

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
        """Write ``text`` as is (a label before streamed text); the streamed text before it ends."""
        self.settle()
        if not text:
            return
        self.at_line_start = text.endswith("\n")
        _, newline, last = text.rpartition("\n")
        self._column = (0 if newline else self._column) + sum(self._cell(ch) for ch in _ESCAPE.sub("", last))
        self._emit(text)

    def flow(self, text: str, *style: str) -> None:
        """Write streamed ``text`` (a model's deltas) in ``style``: on a terminal with a status
        line, wrapped at word boundaries as it comes (the word in progress is held back until
        it ends, or `settle`); else as is. A change of style starts another block of text."""
        if self._flow is not None and style != self._flow_style:
            self.settle()
        if self._flow is None:
            self._flow, self._flow_style = Flow(self.width, self._column, self._cell), style
        self._flow.width = self.width  # a resize applies from the next word on
        self._put(self._flow.feed(text))

    def settle(self) -> None:
        """End the streamed text in progress: what it holds back is written."""
        if self._flow is None:
            return
        flow, self._flow = self._flow, None
        self._put(flow.end())
        self._column = flow.column

    def _put(self, text: str) -> None:
        if text:
            self.at_line_start = text.endswith("\n")
            self._emit(self.style(text, *self._flow_style))

    def line(self, text: str = "", *, indent: int | None = None) -> None:
        """Write ``text`` on a line of its own, in one write (wrapped, under the status line:
        see `wrap` for ``indent``)."""
        self.settle()
        prefix = "" if self.at_line_start else "\n"
        self.at_line_start = True
        self._column = 0
        if self._rows:
            text = wrap(text, self.width, indent)
        self._emit(f"{prefix}{text}\n")

    # -- the bottom rows -------------------------------------------------------------

    @property
    def width(self) -> int:
        """The terminal's columns while the bottom rows are shown (lines are wrapped to it), else 0."""
        return self._cols - 1 if self._rows else 0

    @property
    def status_shown(self) -> bool:
        """A status line is on the screen (a TTY with room for it)."""
        return bool(self._rows)

    @property
    def _bar(self) -> int:
        """How many rows at the bottom are the demo's: the status line, and the input line."""
        return 2 if self.keyboard else 1

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

    def start(self, *, keyboard: bool | None = None) -> None:
        """Reserve the bottom rows (TTY only): the status line, and with ``keyboard`` the input
        line, where the demo draws what is typed (pastes then come bracketed)."""
        if keyboard is not None:
            self.keyboard = keyboard
        if not self.tty or self.closed:
            return
        self._live = True
        self._emit(_PASTE_ON if self.keyboard else "")
        size = self._size()
        rows, bar = size.lines, self._bar
        if rows < bar + 3:  # no room for now: a resize that makes room brings the bottom rows
            return
        self._rows, self._cols, self._column = rows, size.columns or 80, 0
        # Make room below the output, then keep the cursor at the end of the region.
        self._emit("\n" * bar + f"\x1b[1;{rows - bar}r\x1b[{rows - bar};1H" + (_HIDE_CURSOR if self.keyboard else ""))
        self._drawn = False
        self.status(self._status or "starting")
        self._draw_input()

    def resized(self) -> None:
        """The terminal changed size (SIGWINCH): set the region up again (or drop it while
        the terminal is too small for one, until it is large enough again)."""
        if not self._live:
            return
        if self._rows:
            # Below the end of the output there are only the bottom rows: wherever the terminal
            # moved them (a taller one may keep its rows at the top), clear them from there on.
            self._rows = 0
            self._emit("\x1b[J\x1b7\x1b[r\x1b8")
        self._drawn = False
        size = self._size()
        rows, bar = size.lines, self._bar
        if rows >= bar + 3 and not self.closed:
            self._rows, self._cols = rows, size.columns or 80
            self._emit(f"\x1b7\x1b[1;{rows - bar}r\x1b8" + (_HIDE_CURSOR if self.keyboard else ""))
            self.status(self._status)
            self._draw_input()
        elif self.keyboard:
            self._emit(_SHOW_CURSOR)  # no input line to draw a cursor on: the terminal's shows

    def status(self, text: str) -> None:
        """Show ``text`` on the status line (remembered, drawn on a TTY only, and only when it changes)."""
        if text == self._status and self._drawn:
            return
        self._status = text
        if not self._rows:
            return
        self._drawn = True
        line = f" {text}".translate(_ASCII) if self._ascii else f" {text}"
        shown = self.style(_cut(line, self._cols - 1), "bold", "blue")
        self._emit(f"\x1b7\x1b[{self._rows - self._bar + 1};1H\x1b[2K{shown}\x1b8")

    def typed(self, text: str, cursor: int) -> None:
        """Show the line being typed, with the cursor before ``text[cursor]``."""
        self._typed = (text, cursor)
        self._draw_input()

    def hint(self, parts: Sequence[str]) -> None:
        """What the keys do, shown (dim) while the input line is empty: as many of ``parts`` as fit."""
        if tuple(parts) != self._hint:
            self._hint = tuple(parts)
            self._draw_input()

    def _draw_input(self) -> None:
        if not self._rows or not self.keyboard:
            return
        text, cursor = self._typed
        width = self._cols - 1 - cells(PROMPT)
        if text:
            mark = "\u2026"
            if self._ascii:  # as written: the cursor stays under the same character
                head, text, mark = text[:cursor].translate(_ASCII), text[cursor:].translate(_ASCII), "..."
                text, cursor = head + text, len(head)
            before, at, after = fit_input(text, cursor, width, mark)
            body = f"{before}\x1b[7m{at}\x1b[27m{after}"
        else:
            shown = ""
            for part in self._hint:
                more = f"{shown} \u00b7 {part}" if shown else part
                if cells(more) > width - 2:
                    break
                shown = more
            body = "\x1b[7m \x1b[27m" + (f" \x1b[2m{shown}\x1b[22m" if shown else "")
        self._emit(f"\x1b7\x1b[{self._rows};1H\x1b[2K{self.style(PROMPT, 'bold')}{body}\x1b8")

    def _give_back(self, then: str = "") -> None:
        """Give the whole terminal back: no region, the bottom rows cleared, attributes reset."""
        if self.keyboard and self._live:
            self._emit(_PASTE_OFF)
        if not self._rows:
            return
        rows, self._rows = self._rows, 0
        self._drawn = False
        clear = "".join(f"\x1b[{row};1H\x1b[2K" for row in range(rows - self._bar + 1, rows + 1))
        self._emit(f"\x1b7\x1b[r{clear}\x1b8\x1b[0m" + (_SHOW_CURSOR if self.keyboard else "") + then)

    def suspend(self) -> None:
        """Ctrl-Z: give the whole terminal back to the shell until `resume`."""
        self.settle()
        self._give_back()

    def resume(self) -> None:
        """Back in the foreground (``fg``): the bottom rows are set up again, below a fresh line."""
        if self._live and not self.closed:
            self.at_line_start = True
            self.start()

    def stop(self) -> None:
        """Give the whole terminal back: no region, no status line, attributes reset."""
        self.settle()
        end = "" if self.at_line_start else "\n"
        shown = bool(self._rows)
        self._give_back(end)
        self._live = False
        if shown:
            self.at_line_start = True
