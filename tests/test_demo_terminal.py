"""The demo's terminal side without a person: the line editor, the keyboard reader, the terminal
modes, and what the screen draws (the input line, wrapped lines), checked on a pseudo-terminal
or a string buffer."""

from __future__ import annotations

import asyncio
import io
import itertools
import os
import re
import termios
from collections.abc import Iterator

import pytest
from hypothesis import example, given
from hypothesis import strategies as st

from agentloop import Event
from agentloop.demo.editor import LineEditor
from agentloop.demo.keyboard import LineReader, TerminalMode, parse
from agentloop.demo.render import HELP, help_text
from agentloop.demo.screen import Screen, cells, fit_input, wrap

LEFT, RIGHT, UP, DOWN, HOME, END, DELETE = "\x1b[D", "\x1b[C", "\x1b[A", "\x1b[B", "\x1b[H", "\x1b[F", "\x1b[3~"
PASTE = "\x1b[200~{}\x1b[201~"


# -- the line editor ---------------------------------------------------------------------------


def test_enter_sends_the_line_and_keys_edit_it() -> None:
    ed = LineEditor()
    assert ed.feed("helo") == [] and (ed.text, ed.cursor) == ("helo", 4)
    assert ed.feed(LEFT + LEFT + "l") == [] and (ed.text, ed.cursor) == ("hello", 3)
    assert ed.feed(HOME + "\x7f" + DELETE + "H" + END + " world") == []
    assert ed.text == "Hello world"
    assert ed.feed("\x17") == [] and ed.text == "Hello "  # Ctrl-W: the word before the cursor
    assert ed.feed("\x01\x0b") == [] and ed.text == ""  # Ctrl-A, Ctrl-K
    assert ed.feed("abc\x02\x02\x15") == [] and (ed.text, ed.cursor) == ("bc", 0)  # Ctrl-B twice, Ctrl-U
    assert ed.feed("\x05!\r") == ["bc!"] and (ed.text, ed.cursor) == ("", 0)
    assert ed.feed("\n") == [""]  # an empty line too (it runs a queued message)


def test_a_key_split_across_two_reads_is_one_key() -> None:
    ed = LineEditor()
    assert ed.feed("ab\x1b[") == [] and ed.text == "ab"
    assert ed.feed("D") == [] and ed.cursor == 1  # Left, not "D"
    assert ed.feed("\x1b") == [] and ed.feed("x") == [] and ed.text == "axb"  # a lone ESC is the Escape key
    assert ed.feed("\x1b[1;5D\x1bOP\x1b[15~\x1bb") == [] and ed.text == "axb"  # Ctrl-Left, F1, F5, Alt-b: no text


def test_a_paste_of_several_lines_is_one_message_sent_by_enter() -> None:
    ed = LineEditor()
    assert ed.feed(PASTE.format("first line\rsecond\x1b[31m line\r")) == []
    assert ed.text == "first line\nsecond line\n"
    assert ed.feed("\r") == ["first line\nsecond line\n"]
    assert parse("first line\nsecond line\n").text == "first line\nsecond line"  # the breaks reach the model
    # Cut anywhere by the reads, the paste is the same.
    whole = PASTE.format("a\rb") + "\r"
    for cut in range(len(whole) + 1):
        ed = LineEditor()
        assert ed.feed(whole[:cut]) + ed.feed(whole[cut:]) == ["a\nb"], cut


def test_a_pasted_crlf_is_one_line_break() -> None:
    """Text copied with Windows line ends (CR LF) came out with an empty line after every line:
    the CR and the LF were each a line break."""
    whole = PASTE.format("one\r\ntwo\r\n\r\nthree\rfour\nfive") + "\r"
    for cut in range(len(whole) + 1):  # however the reads cut it, a CR LF between them too
        ed = LineEditor()
        assert ed.feed(whole[:cut]) + ed.feed(whole[cut:]) == ["one\ntwo\n\nthree\nfour\nfive"], cut


def test_a_paste_of_a_megabyte_is_taken_and_drawn_in_linear_time(monkeypatch: pytest.MonkeyPatch) -> None:
    """Pasting a large file froze the demo, Ctrl-C included: each character was inserted by
    copying the whole line, and each read redrew it by measuring all of it (a minute for 1 MB).
    Each read inserts its text at once, and each redraw measures a few rows' worth of it."""
    from agentloop.demo import screen

    measured = [0]
    cell = screen._cell

    def counted(ch: str) -> int:
        measured[0] += 1
        return cell(ch)

    monkeypatch.setattr(screen, "_cell", counted)
    inserts = [0]
    insert = LineEditor._insert

    def counted_insert(self: LineEditor, text: str) -> None:
        inserts[0] += 1
        insert(self, text)

    monkeypatch.setattr(LineEditor, "_insert", counted_insert)
    ed = LineEditor()
    body = ("a long pasted line " * 40 + "\r") * 1300  # about 1 MB, in 4 KB reads
    data = PASTE.format(body) + "\r"
    lines: list[str] = []
    reads = range(0, len(data), 4096)
    for i in reads:
        lines += ed.feed(data[i : i + 4096])
        before, at, after = fit_input(ed.text, ed.cursor, 78)
        assert cells(before + at + after) <= 78
    assert lines == [body.replace("\r", "\n")]
    assert inserts[0] <= len(reads)  # one insertion per read, not one per character
    assert measured[0] <= 8 * 78 * len(reads)  # each redraw measures about its width, not the line


def test_ctrl_d_ends_the_input_only_on_an_empty_line() -> None:
    ed = LineEditor()
    assert ed.feed("ab" + LEFT + "\x04") == [] and ed.text == "a" and not ed.eof  # deletes, as in a shell
    assert ed.feed("\x15\x04more\r") == [] and ed.eof  # nothing is taken after the end


def test_up_and_down_recall_the_lines_sent() -> None:
    ed = LineEditor()
    ed.feed("one\rtwo\rtwo\r\rdraft")
    assert ed.feed(UP) == [] and ed.text == "two"  # the same line twice is kept once, an empty one never
    assert ed.feed(UP + UP) == [] and ed.text == "one"  # the oldest stays
    assert ed.feed(DOWN + DOWN) == [] and ed.text == "draft"  # back to what was being typed
    assert ed.feed(UP + "!\r") == ["two!"]


_KEYS = st.sampled_from(
    ["a", "\u00e9", "\u65e5", " ", "\t", "\r", "\n", "\x7f", "\x04", "\x17", "\x15", "\x0b", "\x01", "\x05", "\x03",
     "\x00", "\x1b", LEFT, RIGHT, UP, DOWN, HOME, END, DELETE, "\x1b[200~", "\x1b[201~", "\x1b[", "\x1bO", "\x9b"]
)


@given(st.lists(st.lists(_KEYS, max_size=12).map("".join), max_size=8))
def test_whatever_is_typed_the_line_holds_only_text(reads: list[str]) -> None:
    """No control character or escape sequence is ever part of a line; the cursor stays in it."""
    ed = LineEditor()
    for data in reads:
        for line in ed.feed(data):
            assert not re.search(r"[\x00-\x09\x0b-\x1f\x7f-\x9f]", line), line
        assert 0 <= ed.cursor <= len(ed.text)
        assert not re.search(r"[\x00-\x09\x0b-\x1f\x7f-\x9f]", ed.text)


# -- the keyboard reader -----------------------------------------------------------------------


def _reader(encoding: str = "utf-8", editor: LineEditor | None = None) -> tuple[LineReader, list[str]]:
    got: list[str] = []
    loop = asyncio.new_event_loop()
    loop.close()  # never used: the reader is fed by hand
    reader = LineReader(
        loop, 0, got.append, lambda: got.append("<eof>"), encoding=encoding, editor=editor,
        on_edit=lambda: got.append("<edit>"),
    )
    return reader, got


def test_a_character_cut_across_two_reads_is_decoded_whole() -> None:
    reader, got = _reader()
    data = "caf\u00e9 \U0001f389\n".encode()
    for i in range(len(data)):
        reader.feed(data[i : i + 1])
    assert got == ["caf\u00e9 \U0001f389"]


def test_typed_text_is_decoded_in_the_keyboards_encoding() -> None:
    """In a Latin-1 locale the terminal sends é as one byte: it was decoded as UTF-8 and became '?'."""
    reader, got = _reader("iso8859-1")
    reader.feed("d\u00e9j\u00e0 vu\n".encode("latin-1"))
    reader.feed(b"")
    assert got == ["d\u00e9j\u00e0 vu", "<eof>"]


def test_a_line_left_unsent_at_ctrl_d_on_a_terminal_is_not_sent() -> None:
    """With the terminal editing lines (``TERM=dumb``, output in a file), "abc" then Ctrl-D twice
    (the first hands "abc" over without a line break, the second ends the input) started a turn
    on "abc" and interrupted it at once, as the demo exited: a turn nobody sent, in the
    transcript. From a pipe, a last line without its line break is still played."""
    got: list[str] = []
    loop = asyncio.new_event_loop()
    loop.close()
    reader = LineReader(loop, 0, got.append, lambda: got.append("<eof>"), partial=False)
    reader.feed(b"sent\nabc")
    reader.feed(b"")
    assert got == ["sent", "<eof>"]
    piped, got = _reader()
    piped.feed(b"sent\nlast")
    piped.feed(b"")
    assert got == ["sent", "last", "<eof>"]
    assert reader.unsent == "abc" and piped.unsent == ""  # the terminal's cursor is after "abc"


def test_a_long_line_from_a_pipe_is_read_in_linear_time() -> None:
    """A file of one long line piped in (``demo < dump.json``) was read in quadratic time: each
    4 KB read copied and searched all of the line so far for a line break (32 MB took minutes).
    Each read is kept as it came, and the line is joined once, when it ends."""
    reader, got = _reader()
    chunk = b"x" * 4096
    reads = 8 * 256  # 8 MB, as the reader's thread reads it
    for n in range(1, reads + 1):
        reader.feed(chunk)
        assert len(reader._parts) == n and reader._parts[-1] == "x" * 4096  # nothing joined yet
    reader.feed(b"\nnext\n")
    reader.feed(b"")
    assert [len(line) for line in got[:-2]] == [reads * 4096] and got[-2:] == ["next", "<eof>"]


def test_with_an_editor_the_reader_passes_keys_and_redraws() -> None:
    ed = LineEditor()
    reader, got = _reader(editor=ed)
    reader.feed(b"ab")
    assert got == ["<edit>"] and ed.text == "ab"
    reader.feed(b"\rcd\r\x04ignored\r")
    assert got == ["<edit>", "<edit>", "ab", "cd", "<eof>"]
    reader.feed(b"more\r")
    assert got[-1] == "<eof>"  # stopped


# -- the terminal's modes ----------------------------------------------------------------------


@pytest.fixture
def pty_fd() -> Iterator[int]:
    main, other = os.openpty()
    try:
        yield other
    finally:
        os.close(main)
        os.close(other)


def test_the_terminal_modes_and_their_undoing(pty_fd: int) -> None:
    """Keys the demo edits are neither echoed nor collected into lines by the terminal; in every mode
    Ctrl-C still interrupts and is not echoed as ^C; `restore` gives back what was there."""
    before = termios.tcgetattr(pty_fd)
    assert before[3] & termios.ECHOCTL and before[3] & termios.ICANON  # a pty starts as a terminal does
    for mode, canonical, echo in (("edit", False, False), ("lines", True, True), ("quiet", True, False)):
        tm = TerminalMode(pty_fd, mode)  # type: ignore[arg-type]
        assert tm.apply()
        lflag = termios.tcgetattr(pty_fd)[3]
        assert not lflag & termios.ECHOCTL and lflag & termios.ISIG, mode
        assert bool(lflag & termios.ICANON) == canonical and bool(lflag & termios.ECHO) == echo, mode
        tm.restore()
        assert termios.tcgetattr(pty_fd) == before, mode
    assert not TerminalMode(os.open(os.devnull, os.O_RDONLY), "edit").apply()  # not a terminal


def test_ctrl_backslash_quits_and_a_second_one_gives_the_terminal_back_then_ends_the_demo(
    pty_fd: int, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The first Ctrl-\\ (SIGQUIT) quits as SIGTERM does; one while the demo is quitting already (a
    quit that hangs) ends it by SIGQUIT's default action, as pressing it again means, but only
    once the terminal has its modes back and the screen its rows."""
    import signal

    from agentloop.demo import app

    before = termios.tcgetattr(pty_fd)
    mode = TerminalMode(pty_fd, "edit")
    assert mode.apply()
    stopped: list[bool] = []
    killed: list[tuple[int, int]] = []

    class _Host:
        exit = asyncio.Event()

        def quit(self) -> None:
            self.exit.set()

    class _Screen:
        def stop(self) -> None:
            stopped.append(True)

    monkeypatch.setattr(app.os, "kill", lambda pid, sig: killed.append((pid, sig)))
    host = _Host()
    app._sigquit(host, _Screen(), mode)  # type: ignore[arg-type]
    assert host.exit.is_set() and not stopped and not killed  # the first: a quit
    assert termios.tcgetattr(pty_fd) != before
    app._sigquit(host, _Screen(), mode)  # type: ignore[arg-type]
    assert stopped == [True] and termios.tcgetattr(pty_fd) == before
    assert killed == [(os.getpid(), signal.SIGQUIT)]
    assert signal.getsignal(signal.SIGQUIT) is signal.SIG_DFL


def test_a_demo_that_fails_while_it_sets_up_gives_the_terminal_back(pty_fd: int, monkeypatch: pytest.MonkeyPatch) -> None:
    """The keyboard's modes were set before the session's cleanup was in place: an error (or a
    Ctrl-C, then still a KeyboardInterrupt) while the engine was being built left the terminal
    unechoed."""
    from agentloop.demo import app

    before = termios.tcgetattr(pty_fd)

    def broken(model: object, speed: float) -> object:
        assert termios.tcgetattr(pty_fd) != before  # the modes are set by now
        raise RuntimeError("no engine")

    monkeypatch.setattr(app, "build_engine", broken)
    with open(pty_fd, encoding="utf-8", closefd=False) as keyboard:
        monkeypatch.setattr(app.sys, "stdin", keyboard)
        with pytest.raises(RuntimeError, match="no engine"):
            app.run(app.Options(), out=io.StringIO())
    assert termios.tcgetattr(pty_fd) == before


# -- the screen ---------------------------------------------------------------------------------


class _Tty(io.StringIO):
    def isatty(self) -> bool:
        return True


def _screen(monkeypatch: pytest.MonkeyPatch, rows: int = 24, cols: int = 80) -> tuple[Screen, _Tty]:
    monkeypatch.setattr(
        "agentloop.demo.screen.shutil.get_terminal_size", lambda fallback=(80, 24): os.terminal_size((cols, rows))
    )
    out = _Tty()
    return Screen(out, tty=True, color=False), out


def _region_output(text: str) -> str:
    """What a screen wrote into the scroll region: its output, without the bottom rows it drew."""
    return re.sub(r"\x1b7.*?\x1b8", "", text, flags=re.DOTALL)


def test_what_is_typed_is_drawn_on_the_input_line_never_in_the_output(monkeypatch: pytest.MonkeyPatch) -> None:
    screen, out = _screen(monkeypatch)
    screen.start(keyboard=True)
    assert "\x1b[1;22r" in out.getvalue()  # the output above the status line (23) and the input line (24)
    screen.write("assistant: Let me look at")
    screen.typed("keep the API", 12)
    screen.write(" the project first.")
    screen.status("streaming text")
    text = out.getvalue()
    assert "\x1b7\x1b[24;1H\x1b[2K\u203a keep the API\x1b[7m \x1b[27m\x1b8" in text  # cursor at the end
    assert "\x1b7\x1b[23;1H\x1b[2K streaming text\x1b8" in text
    assert "assistant: Let me look at the project first." in _region_output(text)
    assert "keep" not in _region_output(text)
    screen.typed("", 0)
    screen.hint(["Ctrl-C interrupt", "type to steer", "!text send now"])
    assert out.getvalue().endswith(
        "\x1b[24;1H\x1b[2K\u203a \x1b[7m \x1b[27m \x1b[2mCtrl-C interrupt \u00b7 type to steer \u00b7 !text send now\x1b[22m\x1b8"
    )
    screen.stop()
    end = out.getvalue()
    assert end.endswith("\x1b[23;1H\x1b[2K\x1b[24;1H\x1b[2K\x1b8\x1b[0m\x1b[?25h\n")  # rows cleared, cursor back
    assert "\x1b[?2004h" in end and "\x1b[?2004l" in end  # bracketed paste, on and off


def test_a_narrow_terminal_shows_the_hints_that_fit_and_the_end_of_a_long_line(monkeypatch: pytest.MonkeyPatch) -> None:
    screen, out = _screen(monkeypatch, cols=40)
    screen.start(keyboard=True)
    screen.hint(["Ctrl-C interrupt", "type to steer", "!text send now"])
    assert out.getvalue().endswith("\x1b[2mCtrl-C interrupt \u00b7 type to steer\x1b[22m\x1b8")
    screen.typed("x" * 500 + "END", 503)
    row = out.getvalue().rsplit("\x1b[24;1H\x1b[2K", 1)[1]
    assert row == "\u203a \u2026" + "x" * 32 + "END\x1b[7m \x1b[27m\x1b8"  # 39 columns


def test_a_resize_draws_both_rows_at_the_new_bottom(monkeypatch: pytest.MonkeyPatch) -> None:
    rows = [24]
    monkeypatch.setattr(
        "agentloop.demo.screen.shutil.get_terminal_size", lambda fallback=(80, 24): os.terminal_size((60, rows[0]))
    )
    out = _Tty()
    screen = Screen(out, tty=True, color=False)
    screen.start(keyboard=True)
    screen.status("working")
    screen.typed("abc", 1)
    rows[0] = 4  # too small for both rows and an output region: the terminal's own cursor is shown
    screen.resized()
    # The old bottom rows are cleared from the end of the output down, wherever the terminal put them
    # (one that grows at the bottom kept them in the middle of the screen, under the output).
    assert out.getvalue().endswith("\x1b[J\x1b7\x1b[r\x1b8\x1b[?25h")
    rows[0] = 12
    out.seek(0)
    out.truncate()
    screen.resized()
    text = out.getvalue()
    assert "\x1b7\x1b[1;10r\x1b8\x1b[?25l" in text
    assert "\x1b[11;1H\x1b[2K working\x1b8" in text and "\x1b[12;1H\x1b[2K\u203a a\x1b[7mb\x1b[27mc\x1b8" in text


@given(st.text(st.sampled_from("ab \u00e9\u65e5\u0301\n"), max_size=60), st.integers(0, 60), st.integers(0, 30))
def test_the_input_line_fits_its_columns_and_shows_the_cursor(text: str, cursor: int, width: int) -> None:
    cursor = min(cursor, len(text))
    before, at, after = fit_input(text, cursor, width)
    assert cells(before + at + after) <= width
    if width >= 4:
        assert at == (text[cursor : cursor + 1].replace("\n", "\u21b5") or " ")
        shown = text.replace("\n", "\u21b5")
        assert before.lstrip("\u2026") == shown[:cursor][len(shown[:cursor]) - len(before.lstrip("\u2026")) :]
        if cells(shown) + 1 <= width:
            assert before + at + after in (shown + " ", shown)  # all of it when it fits


@given(st.lists(st.sampled_from(["word", "a", "longer-word", "\u65e5\u672c", "\x1b[1mbold\x1b[0m", ""]), max_size=40),
       st.integers(10, 50))
@example(["", "word", "longer-word"], 15)
def test_wrapped_lines_fit_and_keep_every_word(words: list[str], width: int) -> None:
    """Every row fits; the words come back in order, whole unless too long for a row under the
    indent (then broken where the rows end, no longer left to the terminal to break) or in
    Chinese (broken between its characters)."""
    line = "  " + " ".join(words)
    wrapped = wrap(line, width)
    # A row after the first goes on under the line's own indent plus two (an empty first word
    # adds a space to it), at most half the width: a word wider than what is left is broken.
    room = width - min(len(line) - len(line.lstrip(" ")) + 2, width // 2)
    shown = iter(wrapped.split())
    for word in line.split():
        got = next(shown)
        while got != word and (cells(re.sub(r"\x1b\[[0-9;]*m", "", word)) > room or "\u65e5" in word):
            assert word.startswith(got), (word, got, wrapped)
            got += next(shown)
        assert got == word, wrapped
    assert next(shown, None) is None
    for row in wrapped.split("\n"):
        assert cells(re.sub(r"\x1b\[[0-9;]*m", "", row)) <= width, row


def test_the_help_fits_a_terminal_of_40_columns() -> None:
    """Written for 80 columns, the help was broken by the terminal mid-word in a narrow one
    ("a line s" / "teers it"); it is now wrapped at word boundaries, under its column of descriptions."""
    text = help_text(39)
    assert all(len(row) <= 39 for row in text.split("\n"))
    assert all(row[:12].strip() in {key for key, _ in HELP} | {""} for row in text.split("\n"))
    assert text.split() == help_text(78).split()
    for control in ("engine.interrupt()", "engine.interject(text)", "engine.send_now(text)", "doom-loop", "stationarity"):
        assert control in text


def test_a_screen_too_narrow_or_not_live_does_not_wrap(monkeypatch: pytest.MonkeyPatch) -> None:
    plain = io.StringIO()
    Screen(plain, tty=False, color=False).line("word " * 40)
    assert plain.getvalue() == "word " * 40 + "\n"  # piped output keeps its lines
    screen, out = _screen(monkeypatch, cols=30)
    screen.start()
    screen.line("one two three four five six seven eight nine ten")
    assert "one two three four five six\n  seven eight nine ten\n" in out.getvalue()


def test_a_stream_broken_by_a_line_of_the_host_goes_on_marked_as_going_on() -> None:
    """A steer typed mid-answer printed its line and the answer went on under a fresh label, from
    the middle of a word ("assistant: Noted your m" ... "assistant: essage"), as if a new answer began."""
    from agentloop import TextDelta, ThinkingDelta
    from agentloop.demo.render import Renderer

    out = io.StringIO()
    r = Renderer(Screen(out, tty=False, color=False))
    r.show(TextDelta(text="Noted your m"))
    r.note("you (steer): keep it")
    r.show(TextDelta(text="essage."))
    r.show(ThinkingDelta(thinking="hm"))  # another stream: a label of its own
    assert out.getvalue() == "assistant: Noted your m\nyou (steer): keep it\nassistant: \u2026essage.\nthinking: hm"



def test_control_characters_from_the_model_or_a_tool_never_reach_the_terminal() -> None:
    """A provider's text (or a tool's output) with an escape sequence or a bare carriage return
    was written as is: it could recolour the output, move the cursor over it, reset the scroll
    region that keeps the status line, or set the window's title."""
    from agentloop import TextDelta, ToolCallFinished, ToolCallStarted, ToolUseBlock
    from agentloop._messages import ToolResultBlock
    from agentloop.demo.render import Renderer

    out = io.StringIO()
    r = Renderer(Screen(out, tty=False, color=False))
    r.show(TextDelta(text="red \x1b[31mtext\x1b[0m\r\n"))
    r.show(TextDelta(text="progress 10%\rprogress 100%\x1b]0;title\x07 \x9b2J"))
    use = ToolUseBlock(id="t1", name="run_tests", input={"flag": "\x1b[r"})
    r.show(ToolCallStarted(tool_use=use))
    r.show(ToolCallFinished(tool_use=use, result=ToolResultBlock(tool_use_id="t1", content="\x1b[32mPASSED\x1b[0m")))
    shown = out.getvalue()
    assert not re.search(r"[\x00-\x08\x0b-\x1f\x7f-\x9f]", shown), repr(shown)
    assert "red \ufffd[31mtext\ufffd[0m\nprogress 10%\ufffdprogress 100%" in shown
    assert "PASSED" in shown


def test_the_help_with_a_real_model_does_not_promise_the_scripted_agents_loops() -> None:
    """With --provider, /help's "watch for" line still told of the scripted agent's loops (its
    thinking loop, its file read again and again, "ask it to wait for CI") as if they would come."""
    from agentloop.demo.render import Renderer

    scripted = help_text(78)
    real = help_text(78, scripted=False)
    assert "wait for CI" in scripted and "wait for CI" not in real
    assert "doom-loop" in real and "stationarity" in real  # what the policies would do, still named
    out = io.StringIO()
    Renderer(Screen(out, tty=False, color=False), scripted=False).help()
    assert out.getvalue() == real + "\n"


class _AsciiTty(io.TextIOWrapper):
    def isatty(self) -> bool:
        return True


def test_on_an_ascii_only_output_a_long_input_line_still_fits_its_row(monkeypatch: pytest.MonkeyPatch) -> None:
    """The cut marks of a long line being typed (and a "\u2026" in the status line) were counted as
    one column each and written as "..." (three), so the row ran past the terminal's last column."""
    monkeypatch.setattr(
        "agentloop.demo.screen.shutil.get_terminal_size", lambda fallback=(80, 24): os.terminal_size((40, 24))
    )
    raw = io.BytesIO()
    out = _AsciiTty(raw, encoding="ascii", write_through=True)
    screen = Screen(out, tty=True, color=False)
    screen.start(keyboard=True)

    def row(number: int) -> str:
        text = raw.getvalue().decode("ascii").rsplit(f"\x1b[{number};1H\x1b[2K", 1)[1].split("\x1b8")[0]
        return re.sub(r"\x1b\[[0-9;?]*[A-Za-z]", "", text)

    screen.typed("x" * 200 + "END", 203)
    assert row(24) == "> ..." + "x" * 30 + "END "  # 39 columns
    screen.typed("say \u201cx\u201d" + "y" * 100, 5)
    assert row(24) == '> say "x"' + "y" * 27 + "..."
    screen.status("running tests \u2026 " * 5)  # a status line holding the mark, as short() writes it
    assert row(23).startswith(" running tests ... running") and len(row(23)) == 39


# -- tool progress ------------------------------------------------------------------------------


def _progress_events() -> list[Event]:
    from agentloop import TextDelta, ToolCallFinished, ToolCallStarted, ToolProgress, ToolUseBlock
    from agentloop._messages import ToolResultBlock

    use = ToolUseBlock(id="t1", name="run_tests", input={})
    return [
        TextDelta(text="Running the tests."),
        ToolCallStarted(tool_use=use),
        ToolProgress(tool_use_id="t1", text="collecting tests ..."),
        ToolProgress(tool_use_id="t1", text="[1/2] test_a PASSED\x1b[2J"),
        ToolCallFinished(tool_use=use, result=ToolResultBlock(tool_use_id="t1", content="2 passed")),
    ]


def test_without_a_status_line_each_progress_report_is_a_dim_line_under_its_call() -> None:
    from agentloop.demo.render import Renderer

    out = io.StringIO()
    r = Renderer(Screen(out, tty=False, color=False))
    for event in _progress_events():
        r.show(event)
    assert out.getvalue().splitlines() == [
        "assistant: Running the tests.",
        "\u2699 run_tests()",
        "  \u00b7 run_tests: collecting tests ...",
        "  \u00b7 run_tests: [1/2] test_a PASSED\ufffd[2J",
        "  \u2713 run_tests: 2 passed",
    ]


def test_with_a_status_line_progress_updates_it_and_adds_no_line(monkeypatch: pytest.MonkeyPatch) -> None:
    from agentloop.demo.render import Renderer

    screen, out = _screen(monkeypatch)
    screen.start(keyboard=True)
    r = Renderer(screen)
    for event in _progress_events()[:-1]:
        r.show(event)
    assert r.status() == "1 tool running: run_tests \u2014 [1/2] test_a PASSED\ufffd[2J"
    assert "\x1b7\x1b[23;1H\x1b[2K 1 tool running: run_tests \u2014 collecting tests ...\x1b8" in out.getvalue()
    assert "collecting" not in _region_output(out.getvalue())
    r.show(_progress_events()[-1])
    assert r.status() == "working"  # the call's progress went with it


# -- streamed text, wrapped as it comes -----------------------------------------------------------


def _columns(row: str, start: int = 0) -> int:
    """The column a terminal's cursor ends at after ``row`` written from column ``start`` (a tab
    goes to the next multiple of 8)."""
    col = start
    for ch in row:
        col = col + 8 - col % 8 if ch == "\t" else col + cells(ch)
    return col


def _written(out: io.StringIO) -> str:
    """The text a screen wrote into the scroll region, without escape sequences."""
    return re.sub(r"\x1b\[[0-9;?]*[A-Za-z]", "", _region_output(out.getvalue()))


def _flowed(chunks: list[str], width: int, column: int = 0) -> str:
    from agentloop.demo.screen import Flow

    flow = Flow(width, column)
    return "".join(flow.feed(chunk) for chunk in chunks) + flow.end()


_PIECES = st.sampled_from(
    ["a", "word", "project", "going", "\u65e5\u672c\u8a9e", "\U0001f642", "e\u0301", " ", " ", "  ", "\t", "\n",
     "x" * 23, "\u5bff" * 9, "-"]
)


@given(st.lists(_PIECES, max_size=40), st.integers(10, 50), st.integers(0, 50), st.lists(st.integers(0, 400), max_size=8))
def test_streamed_text_wraps_at_word_boundaries_however_it_is_chunked(
    pieces: list[str], width: int, column: int, cuts: list[int]
) -> None:
    """Every row fits the width; the text's words come back in order, whole unless too long for
    any row (then broken where a row ends, each piece fitting) or holding wide characters (broken
    between them); the chunks do not matter."""
    text = "".join(pieces)
    column = min(column, width)
    whole = _flowed([text], width, column)
    bounds = sorted({0, len(text), *(min(c, len(text)) for c in cuts)})
    assert _flowed([text[a:b] for a, b in itertools.pairwise(bounds)], width, column) == whole
    assert _flowed(list(text), width, column) == whole
    for i, row in enumerate(whole.split("\n")):
        assert _columns(row, column if i == 0 else 0) <= width, (whole, row)
    shown = iter(whole.split())
    for word in text.split():
        # Fits any row, whatever its indent: never broken (a wide character may begin a row: Chinese
        # text without spaces is broken between its characters).
        if cells(word) <= width // 2 and all(cells(ch) < 2 for ch in word):
            assert next(shown) == word, whole
            continue
        got = ""
        while got != word:
            got += next(shown)
            assert word.startswith(got), (word, got, whole)
    assert next(shown, None) is None


def test_a_word_that_would_cross_the_edge_goes_on_the_next_row_under_the_lines_indent() -> None:
    assert _flowed(["Let me look at", " the proj", "ect first."], 30, 11) == "Let me look at the\n  project first."
    # The text's own line breaks are kept; a wrapped row goes on under its line's indent plus two.
    assert _flowed(["ok\n    - one two three four five six"], 20) == "ok\n    - one two three\n      four five six"
    # Blanks where a row breaks are left out, a break in the text is kept.
    assert _flowed(["aaaa bbbb      cccc\n\ndd"], 10) == "aaaa bbbb\n  cccc\n\ndd"


def test_a_word_too_long_for_a_row_is_broken_where_the_row_ends() -> None:
    assert _flowed(["see ", "x" * 25, " ok"], 12) == "see\n  xxxxxxxxxx\n  xxxxxxxxxx\n  xxxxx ok"
    # Wide characters take two columns each and are never cut in half.
    assert _flowed(["\u65e5" * 9], 12) == "\u65e5" * 6 + "\n  " + "\u65e5" * 3
    assert _flowed(["ab ", "\U0001f642" * 3, " \u65e5\u672c\u8a9e\u65e5"], 12, 3) == "ab \U0001f642\U0001f642\U0001f642\n  \u65e5\u672c\u8a9e\u65e5"


def test_too_narrow_a_width_wraps_nothing() -> None:
    assert _flowed(["word " * 5], 9) == "word " * 5
    assert _flowed(["word " * 5], 0) == "word " * 5


def test_a_streamed_answer_on_a_terminal_wraps_at_word_boundaries(monkeypatch: pytest.MonkeyPatch) -> None:
    """The model's deltas were written as they came and the terminal broke words at its edge
    ("proj" on one row, "ect" on the next); the demo's own lines were wrapped."""
    from agentloop import TextDelta, ThinkingDelta, ToolCallStarted, ToolProgress, ToolUseBlock
    from agentloop.demo.render import Renderer

    screen, out = _screen(monkeypatch, cols=31)
    screen.start(keyboard=True)
    r = Renderer(screen)
    text = "Let me look at the project first, then run the tests."
    for i in range(0, len(text), 6):
        r.show(TextDelta(text=text[i : i + 6]))
    screen.typed("keep", 4)  # the input line is drawn at the bottom, away from the output
    use = ToolUseBlock(id="t1", name="run_tests", input={})
    r.show(ToolCallStarted(tool_use=use))
    r.show(ToolProgress(tool_use_id="t1", text="collecting"))
    r.show(ThinkingDelta(thinking="The tests fail because slugify only lowercases."))
    screen.stop()
    shown = _written(out)
    assert shown.endswith(
        "assistant: Let me look at the\n  project first, then run the\n  tests.\n"
        "\u2699 run_tests()\n"
        "thinking: The tests fail\n  because slugify only\n  lowercases.\n"
    ), repr(shown)
    assert "\x1b7\x1b[23;1H\x1b[2K 1 tool running: run_tests" in out.getvalue()
    assert "\x1b[24;1H\x1b[2K\u203a keep\x1b[7m \x1b[27m\x1b8" in out.getvalue()


def test_the_word_held_back_is_written_before_a_line_of_the_host(monkeypatch: pytest.MonkeyPatch) -> None:
    from agentloop import TextDelta
    from agentloop.demo.render import Renderer

    screen, out = _screen(monkeypatch, cols=40)
    screen.start()
    r = Renderer(screen)
    r.show(TextDelta(text="Noted your m"))
    assert _written(out).endswith("assistant: Noted your")  # " m" may not fit the row: held back
    r.note("you (steer): keep it")
    r.show(TextDelta(text="essage."))
    r.idle()  # the end of the turn ends the block: the rest is written
    assert _written(out).endswith("assistant: Noted your m\nyou (steer): keep it\nassistant: \u2026essage.")


def test_a_resized_terminal_wraps_the_next_block_to_its_new_width(monkeypatch: pytest.MonkeyPatch) -> None:
    from agentloop import TextDelta, ThinkingDelta
    from agentloop.demo.render import Renderer

    cols = [80]
    monkeypatch.setattr(
        "agentloop.demo.screen.shutil.get_terminal_size", lambda fallback=(80, 24): os.terminal_size((cols[0], 24))
    )
    out = _Tty()
    screen = Screen(out, tty=True, color=False)
    screen.start()
    r = Renderer(screen)
    r.show(ThinkingDelta(thinking="one two three four five six seven eight"))
    cols[0] = 21
    screen.resized()
    r.show(TextDelta(text="one two three four five six seven eight"))
    r.idle()
    shown = _written(out)
    assert "thinking: one two three four five six seven eight\n" in shown
    assert shown.endswith("assistant: one two\n  three four five\n  six seven eight"), repr(shown)


def test_piped_or_plain_output_streams_text_unwrapped_as_it_comes() -> None:
    from agentloop import TextDelta
    from agentloop.demo.render import Renderer

    out = io.StringIO()
    r = Renderer(Screen(out, tty=False, color=False))
    r.show(TextDelta(text="word " * 30 + "proj"))
    assert out.getvalue() == "assistant: " + "word " * 30 + "proj"  # nothing held back


def test_streamed_text_is_measured_as_written_in_colour_or_in_ascii(monkeypatch: pytest.MonkeyPatch) -> None:
    """Colours take no room; on an output without the demo's symbols a "\u2026" is written "..."
    (three columns) and a character with no look-alike "?": the rows still fit."""
    from agentloop import TextDelta, ThinkingDelta
    from agentloop.demo.render import Renderer

    monkeypatch.setattr(
        "agentloop.demo.screen.shutil.get_terminal_size", lambda fallback=(80, 24): os.terminal_size((21, 24))
    )
    raw = io.BytesIO()
    out = _AsciiTty(raw, encoding="ascii", write_through=True)
    r = Renderer(Screen(out, tty=True, color=True))
    r.screen.start()
    r.show(ThinkingDelta(thinking="wait\u2026 wait\u2026 wait\u2026 wait\u2026 \u65e5\u672c \u2014 ok"))
    r.show(TextDelta(text="caf\u00e9 " * 6))
    r.idle()
    rows = re.sub(r"\x1b\[[0-9;?]*[A-Za-z]", "", re.sub(r"\x1b7.*?\x1b8", "", raw.getvalue().decode("ascii"), flags=re.S))
    assert rows.split() == ["thinking:", *["wait..."] * 4, "??", "-", "ok", "assistant:", *["caf?"] * 6], rows
    assert all(len(row) <= 20 for row in rows.split("\n")), rows
    assert "\x1b[2m" in raw.getvalue().decode("ascii")  # the thinking still dim


# -- wide characters: text without spaces, emoji sequences --------------------------------------

_SENTENCE = "我们今天在这个项目里修复了一个问题\uff0c终端里的中文句子没有空格\uff0c所以不能只在空格处换行。" * 5
_FAMILY = "\U0001f468\u200d\U0001f469\u200d\U0001f467"  # one emoji on a terminal: three joined by ZWJ


def _rows_keep_clusters(text: str) -> bool:
    """No row of ``text`` begins inside a character shown as one: with a combining mark, or
    after a zero-width joiner."""
    rows = text.split("\n")
    return all(
        not (row.lstrip(" ")[:1] and cells(row.lstrip(" ")[0]) == 0) and not before.endswith("\u200d")
        for before, row in itertools.pairwise(rows)
    )


def test_a_chinese_sentence_is_wrapped_between_characters_where_the_row_is_full() -> None:
    """A sentence of 200 Chinese characters is one word to a wrap at spaces: it was left on one
    line 400 columns wide for the terminal to break, under no indent."""
    wrapped = wrap("  " + _SENTENCE, 40)
    rows = wrapped.split("\n")
    assert len(rows) > 5
    assert all(cells(row) <= 40 for row in rows)
    assert all(cells(row) >= 38 for row in rows[:-1])  # full rows, not a character a row
    assert all(row.startswith("    ") for row in rows[1:])  # under the line's indent plus two
    assert "".join(row.strip() for row in rows) == _SENTENCE
    # A comma or a full stop does not begin a row; an opening bracket does not end one.
    assert not any(row.strip()[:1] in "\uff0c\u3002" for row in rows)
    head = "\u770b\u4e00\u4e0b" * 4 + "\u770b\u4e00"  # 28 columns: room for the bracket, not for what follows
    assert wrap(head + "\u300c\u4e2d\u6587\u300d", 30) == head + "\n  \u300c\u4e2d\u6587\u300d"


def test_a_word_too_long_for_a_row_is_wrapped_without_splitting_a_character() -> None:
    wrapped = wrap("see " + "x" * 25 + " ok", 12)
    assert all(cells(row) <= 12 for row in wrapped.split("\n"))
    assert wrapped.split() != []  # broken where the rows end
    assert "".join(wrapped.split()) == "see" + "x" * 25 + "ok"
    wrapped = wrap("ab " + _FAMILY * 6 + "e\u0301" * 30, 20)
    assert all(cells(row) <= 20 for row in wrapped.split("\n"))
    assert _rows_keep_clusters(wrapped), wrapped


_WIDE_PIECES = st.sampled_from(
    ["a", "word", "project", " ", " ", "  ", "\u65e5\u672c\u8a9e", "\u4e2d", "\uff0c", "\u3002", "\u300c", "\u300d",
     "\U0001f642", _FAMILY, "e\u0301", "\u2764\ufe0f", "x" * 23, "\U0001f1eb\U0001f1f7", "\x1b[1m", "\x1b[0m"]
)


@given(st.lists(_WIDE_PIECES, max_size=60), st.integers(16, 60), st.sampled_from([None, 0, 4, 12]))
def test_wrapped_lines_with_wide_characters_fit_and_keep_the_text(
    pieces: list[str], width: int, indent: int | None
) -> None:
    """Every row fits the width, whatever the text holds (no word is left to the terminal to
    break); the text comes back whole, but for the blanks where rows break; no character shown
    as one is split."""
    text = "".join(pieces)
    wrapped = wrap(text, width, indent)
    plain = re.sub(r"\x1b\[[0-9;]*m", "", wrapped)
    for row in plain.split("\n"):
        assert cells(row) <= width, (text, wrapped)
    assert re.sub(r"\s", "", wrapped) == re.sub(r"\s", "", text)
    assert _rows_keep_clusters(plain), wrapped


def test_streamed_chinese_breaks_between_characters_rather_than_moving_a_run_to_the_next_row() -> None:
    # A run of Chinese shorter than a row went whole to the next row, leaving the row half empty.
    assert _flowed(["see: \u65e5\u672c\u8a9e\u65e5"], 12) == "see: \u65e5\u672c\u8a9e\n  \u65e5"
    flowed = _flowed(list("\u7b54\uff1a" + _SENTENCE), 40)
    rows = flowed.split("\n")
    assert all(cells(row) <= 40 for row in rows) and all(cells(row) >= 38 for row in rows[:-1])
    assert "".join(row.strip() for row in rows) == "\u7b54\uff1a" + _SENTENCE
    assert not any(row.strip()[:1] in "\uff0c\u3002" for row in rows)


@pytest.mark.parametrize("width", range(12, 30))
def test_streamed_emoji_sequences_are_not_split_where_a_row_ends(width: int) -> None:
    flowed = _flowed(["ab ", _FAMILY * 8, " ok"], width)
    assert _rows_keep_clusters(flowed), flowed
    assert flowed.replace("\n", "").replace(" ", "") == "ab" + _FAMILY * 8 + "ok"


def test_a_short_summary_is_cut_to_columns_not_characters() -> None:
    from agentloop.demo.render import short

    assert cells(short("\u4e2d" * 100, 20)) <= 20
    assert short("\u4e2d" * 100, 20).endswith("\u2026")
    cut = short("a" + _FAMILY * 10, 9)
    assert cells(cut) <= 9 and not cut.removesuffix("\u2026").endswith("\u200d")


def test_a_long_word_is_cut_reading_only_the_end_of_what_came_before(monkeypatch: pytest.MonkeyPatch) -> None:
    """A word without spaces (base64, a minified line) was judged at each character against the
    whole of it so far: the time grew with the square of its length (80,000 characters took
    1.3 s to wrap). Each judgement reads a few characters, and the wrapping is unchanged."""
    from agentloop.demo import screen

    seen: list[int] = []
    judge = screen._breakable

    def breakable(before: str, ch: str) -> bool:
        seen.append(len(before))
        return judge(before, ch)

    monkeypatch.setattr(screen, "_breakable", breakable)
    word = "x" * 3000 + "\u4e2d\u6587" * 500 + "e\u0301" * 200
    wrapped = wrap(word, 80)
    assert max(seen) <= 4 and len(seen) == len(screen.clusters(word)) - 1
    assert wrapped.replace("\n  ", "").replace("\n", "") == word
    assert all(cells(row) <= 80 for row in wrapped.split("\n"))


def test_shorten_reads_no_further_than_its_width(monkeypatch: pytest.MonkeyPatch) -> None:
    """A 2 MB tool result shown as one short line was cut into characters whole first (1.5 s)."""
    from agentloop.demo import screen

    text = "abc " * 500_000
    assert screen.shorten(text, 20) == "abc abc abc abc abc\u2026"
    monkeypatch.setattr(screen, "clusters", lambda _text: pytest.fail("shorten cut the whole text"))
    assert screen.shorten(text, 20) == "abc abc abc abc abc\u2026"


def test_output_made_non_blocking_during_the_session_loses_no_text() -> None:
    """A full pipe or terminal made non-blocking by another program while the demo runs: the write
    failed with EAGAIN (BlockingIOError, a traceback, and the text that did not fit was lost)."""
    import fcntl
    import threading

    read_fd, write_fd = os.pipe()
    fcntl.fcntl(write_fd, fcntl.F_SETPIPE_SZ, 4096)
    out = open(write_fd, "w", encoding="utf-8")  # noqa: SIM115 - closed below
    screen = Screen(out, tty=False, color=False)
    fcntl.fcntl(write_fd, fcntl.F_SETFL, fcntl.fcntl(write_fd, fcntl.F_GETFL) | os.O_NONBLOCK)
    got = bytearray()

    def drain() -> None:
        while data := os.read(read_fd, 65536):
            got.extend(data)

    reader = threading.Thread(target=drain)
    reader.start()
    try:
        for i in range(20):
            screen.line(f"{i:02d}" + "x" * 30000)
    finally:
        out.close()
        reader.join()
        os.close(read_fd)
    assert screen.failed is None and not screen.closed
    assert got.decode() == "".join(f"{i:02d}" + "x" * 30000 + "\n" for i in range(20))


async def test_input_made_non_blocking_during_the_session_is_waited_for(monkeypatch: pytest.MonkeyPatch) -> None:
    """A read of standard input made non-blocking by another program failed with EAGAIN, taken
    for the end of the input: the demo quit. The reader waits until there is input."""
    import fcntl
    import threading

    read_fd, write_fd = os.pipe()
    fcntl.fcntl(read_fd, fcntl.F_SETFL, fcntl.fcntl(read_fd, fcntl.F_GETFL) | os.O_NONBLOCK)
    tried = threading.Event()  # the reader's thread found nothing to read
    real_read = os.read

    def read(fd: int, n: int) -> bytes:
        try:
            return real_read(fd, n)
        except BlockingIOError:
            if fd == read_fd:
                tried.set()
            raise

    monkeypatch.setattr(os, "read", read)
    got: list[str] = []
    ended = asyncio.Event()
    reader = LineReader(asyncio.get_running_loop(), read_fd, got.append, ended.set)
    try:
        reader.start()
        assert await asyncio.to_thread(tried.wait, 30)
        os.write(write_fd, b"hello\n")
        os.close(write_fd)
        await asyncio.wait_for(ended.wait(), 30)
    finally:
        reader.stop()
        os.close(read_fd)
    assert got == ["hello"]


def _nonblocking(fd: int) -> bool:
    import fcntl

    return bool(fcntl.fcntl(fd, fcntl.F_GETFL) & os.O_NONBLOCK)


def _set_nonblocking(fd: int) -> None:
    import fcntl

    fcntl.fcntl(fd, fcntl.F_SETFL, fcntl.fcntl(fd, fcntl.F_GETFL) | os.O_NONBLOCK)


def test_output_made_non_blocking_during_the_session_is_given_back_non_blocking() -> None:
    """Another program made the output non-blocking while the demo ran: the screen made it
    blocking again before its next write and never put the flag back. The session's `Blocking`
    records it, and gives it back at the end."""
    from agentloop.demo.keyboard import Blocking

    read_fd, write_fd = os.pipe()
    out = open(write_fd, "w", encoding="utf-8")  # noqa: SIM115 - closed below
    try:
        modes = Blocking([write_fd])
        modes.apply()  # blocking already: nothing to give back
        screen = Screen(out, tty=False, color=False, modes=modes)
        screen.line("before")
        _set_nonblocking(write_fd)  # by another program, during the session
        screen.line("after")
        assert not _nonblocking(write_fd)
        modes.restore()
        assert _nonblocking(write_fd)
        assert os.read(read_fd, 100) == b"before\nafter\n"
    finally:
        out.close()
        os.close(read_fd)


def test_ctrl_c_while_the_session_makes_its_descriptors_blocking_gives_back_those_done(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A Ctrl-C after the first descriptor was made blocking and before the others were: the
    demo ended with that descriptor blocking for good (the list of those to give back was not
    made yet, and the restore was outside the reach of the interrupt)."""
    import sys

    from agentloop.demo import app, keyboard

    pipes = [os.pipe(), os.pipe()]
    outs = [open(w, "w", encoding="utf-8") for _, w in pipes]  # noqa: SIM115 - closed below
    real = keyboard.blocking
    cleared: list[int] = []

    def interrupted(fd: int) -> bool:
        if cleared:
            raise KeyboardInterrupt
        cleared.append(fd)
        return real(fd)

    try:
        for _, w in pipes:
            _set_nonblocking(w)
        monkeypatch.setattr(keyboard, "blocking", interrupted)
        monkeypatch.setattr(sys, "stderr", outs[1])
        with pytest.raises(KeyboardInterrupt):
            app.run(app.Options(script="builtin"), out=outs[0])
        assert cleared == [pipes[0][1]]
        assert _nonblocking(pipes[0][1]) and _nonblocking(pipes[1][1])
    finally:
        for out, (r, _) in zip(outs, pipes, strict=True):
            out.close()
            os.close(r)


def test_a_write_that_finds_a_non_blocking_output_full_waits_for_room_and_goes_on(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Every byte once, in order, and a wait (not a loop of failing writes) while there is no room."""
    import fcntl
    import select
    import threading

    from agentloop.demo import screen

    read_fd, write_fd = os.pipe()
    fcntl.fcntl(write_fd, fcntl.F_SETPIPE_SZ, 4096)
    _set_nonblocking(write_fd)
    data = bytes(range(256)) * 400  # 25 times the pipe
    waits: list[list[int]] = []
    waiting = threading.Event()  # the writer found the pipe full: the reading begins
    real_select = select.select

    def watched(r: list[int], w: list[int], x: list[int]) -> tuple[list[int], list[int], list[int]]:
        waits.append(w)
        waiting.set()
        return real_select(r, w, x)

    monkeypatch.setattr(select, "select", watched)
    writer = threading.Thread(target=screen._write_all, args=(write_fd, data))
    writer.start()
    got = bytearray()
    try:
        assert waiting.wait(30)
        while len(got) < len(data):
            ready, _, _ = real_select([read_fd], [], [], 30)
            assert ready, f"{len(got)} bytes of {len(data)}"
            got += os.read(read_fd, 65536)
    finally:
        writer.join(30)
        os.close(read_fd)
        os.close(write_fd)
    assert bytes(got) == data
    assert waits and all(w == [write_fd] for w in waits) and len(waits) <= len(data) // 4096 + 1
