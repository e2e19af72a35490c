"""The demo, driven as its users drive it: a scenario in a subprocess, and a person at a terminal."""

from __future__ import annotations

import contextlib
import errno
import fcntl
import io
import json
import os
import re
import select
import signal
import subprocess
import sys
import termios
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import pexpect
import pytest

from agentloop.demo.keyboard import parse
from agentloop.demo.scenario import BUILTIN, ScenarioError
from agentloop.demo.scenario import parse as parse_scenario

ROOT = Path(__file__).resolve().parent.parent
RUNNER_MARK = 'exec(files["utils.py"]'  # in the command line of the demo's test-runner subprocess


# Marks the processes this test run starts (a demo's test runner inherits its environment),
# so that a demo run by another test session on the machine is never taken for one of ours.
_TOKEN = f"AGENTLOOP_DEMO_TEST={os.getpid()}-{time.monotonic_ns()}"


def _env(**extra: str) -> dict[str, str]:
    name, value = _TOKEN.split("=")
    env = dict(os.environ, NO_COLOR="1", PYTHONIOENCODING="utf-8", **{name: value}, **extra)
    env.pop("PYTHONASYNCIODEBUG", None)  # the demo is timed for a person, not for debug mode
    return env


def _spawn_demo(**env: str) -> pexpect.spawn:
    """The interactive demo in a pseudo-terminal of 24 x 110."""
    return pexpect.spawn(
        sys.executable, ["-m", "agentloop", "demo"], cwd=str(ROOT), env=_env(**env),
        encoding="utf-8", timeout=30, dimensions=(24, 110),
    )


# Run at the start of every Python process of a demo spawned by `_announcing_demo`: the test
# runner's process writes its pid to the named pipe, so that the test knows when it has started.
_ANNOUNCE = f"""
import os, sys
if any({RUNNER_MARK!r} in arg for arg in sys.orig_argv):
    with open(os.environ["AGENTLOOP_DEMO_TEST_RUNNERS"], "w") as pipe:
        pipe.write(f"{{os.getpid()}}\\n")
"""


@contextlib.contextmanager
def _announcing_demo(tmp_path: Path) -> Iterator[tuple[pexpect.spawn, Callable[[], int]]]:
    """A demo whose test runner, once started, says its pid; ``started()`` blocks until it has
    (a read of a named pipe, bounded by ``select``) and returns the pid."""
    (tmp_path / "sitecustomize.py").write_text(_ANNOUNCE)
    fifo = tmp_path / "runners"
    os.mkfifo(fifo)
    read_fd = os.open(fifo, os.O_RDONLY | os.O_NONBLOCK)
    write_fd = os.open(fifo, os.O_WRONLY)  # held: no end of file between two writers

    def started() -> int:
        ready, _, _ = select.select([read_fd], [], [], 20)
        assert ready, "the demo's test runner did not start"
        return int(os.read(read_fd, 64).split()[0])

    path = os.pathsep.join([str(tmp_path), os.environ.get("PYTHONPATH", "")])
    try:
        yield _spawn_demo(PYTHONPATH=path, AGENTLOOP_DEMO_TEST_RUNNERS=str(fifo)), started
    finally:
        os.close(read_fd)
        os.close(write_fd)


def _runner_processes() -> list[int]:
    """Live processes running the demo's test runner, started by a demo of this test run."""
    pids = []
    for cmdline in Path("/proc").glob("[0-9]*/cmdline"):
        try:
            if RUNNER_MARK.encode() in cmdline.read_bytes() and (
                _TOKEN.encode() in (cmdline.parent / "environ").read_bytes().split(b"\0")
            ):
                pids.append(int(cmdline.parent.name))
        except OSError:
            continue
    return pids


def test_builtin_script_exercises_every_control() -> None:
    proc = subprocess.run(
        [sys.executable, "-m", "agentloop", "demo", "--script", "builtin", "--speed", "2"],
        cwd=ROOT, env=_env(), capture_output=True, text=True, encoding="utf-8", timeout=55,
    )
    log = proc.stdout
    assert proc.returncode == 0, log[-3000:] + proc.stderr
    assert proc.stderr == ""
    assert "turn ended: aborted_streaming (interrupted: cancel)" in log
    assert "steer delivered to the model: Keep the public API" in log
    assert "Noted your message" in log  # the model saw the steer
    assert "turn ended: aborted_tools (interrupted: send_now)" in log
    # The test runner's progress, a dim line per report under its call (the output is piped).
    assert "\n  \u00b7 run_tests: collecting tests ...\n" in log
    assert "\n  \u00b7 run_tests: [1/2] test_slugify_spaces FAILED" in log
    assert "\n  \u00b7 ci_status: asking the CI server about pipeline main" in log
    assert "Switching to your message" in log
    assert "doom loop detected [tail_repetition" in log and "resampling (attempt 1)" in log
    assert "loop detector cut me off" in log  # the resampled answer
    assert "stationarity nudge from IdenticalToolCallRun" in log
    assert "turn ended: stationarity_ended" in log
    assert "terminals: aborted_streaming x1, aborted_tools x1, completed x1, stationarity_ended x1" in log
    assert log.rstrip().endswith("transcript valid (validate_transcript(engine.messages) == [])")
    assert "\x1b[" not in log  # piped: no escape sequences
    assert not _runner_processes()


def test_scenario_file_and_errors(tmp_path: Path) -> None:
    script = tmp_path / "s.json"
    script.write_text(json.dumps([{"on": "tool_call_started", "tool": "list_files", "do": "interrupt"}]))
    proc = subprocess.run(
        [sys.executable, "-m", "agentloop", "demo", "--script", str(script)],
        cwd=ROOT, env=_env(), capture_output=True, text=True, encoding="utf-8", timeout=55,
    )
    # No prompt in the file: the first step waits for an event while the agent is idle.
    assert proc.returncode == 1 and "stuck" in proc.stdout
    bad = tmp_path / "bad.json"
    bad.write_text('[{"do": "dance"}]')
    proc = subprocess.run(
        [sys.executable, "-m", "agentloop", "demo", "--script", str(bad)],
        cwd=ROOT, env=_env(), capture_output=True, text=True, timeout=55,
    )
    assert proc.returncode == 2 and proc.stderr.count("\n") == 1 and "must be one of" in proc.stderr
    with pytest.raises(ScenarioError):
        parse_scenario([{"do": "interrupt", "when": "soon"}])
    for do in ("interject", "follow_up", "send_now", "submit"):  # the engine would refuse it mid-run
        with pytest.raises(ScenarioError, match="needs a \"text\""):
            parse_scenario([{"do": do, "text": "  "}])
    assert len(parse_scenario(BUILTIN).steps) == 5


def test_missing_provider_key_is_one_line_exit_2() -> None:
    env = _env()
    env.pop("ANTHROPIC_API_KEY", None)
    proc = subprocess.run(
        [sys.executable, "-m", "agentloop", "demo", "--provider", "anthropic"],
        cwd=ROOT, env=env, capture_output=True, text=True, timeout=55,
    )
    assert proc.returncode == 2
    assert proc.stderr.strip() == (
        "agentloop demo: ANTHROPIC_API_KEY is not set: export it, or run the offline demo without --provider"
    )
    proc = subprocess.run(
        [sys.executable, "-m", "agentloop", "demo", "--provider", "openai-compatible"],
        cwd=ROOT, env=env, capture_output=True, text=True, timeout=55,
    )
    assert proc.returncode == 2 and "--base-url" in proc.stderr


def test_input_lines_are_classified() -> None:
    assert parse("  /mode queue ").kind == "command" and parse("/mode queue").arg == "queue"
    assert parse("!stop now") == parse("! stop now")
    assert parse("!stop now").kind == "send_now" and parse("!stop now").text == "stop now"
    assert parse("hello").kind == "message" and parse("   ").kind == "empty"


def test_a_person_at_the_terminal() -> None:
    """Ctrl-C mid-stream, a steer while a tool runs, a send-now, Ctrl-D: as typed on a keyboard."""
    child = _spawn_demo()
    try:
        child.expect("turn 1 .* you: Fix the failing test")
        child.expect("assistant: Let me")  # text is streaming
        child.sendintr()
        child.expect(r"Ctrl-C: cancel")
        child.expect(r"turn ended: aborted_streaming \(interrupted: cancel\)")
        child.expect("idle")
        child.sendline("/mode steer")
        child.expect("steer it")
        child.sendline("go on please")
        child.expect("turn 2 .* you: go on please")
        child.expect(r"run_tests\(\)")  # the real subprocess is running
        child.expect_exact("1 tool running: run_tests \u2014 collecting tests ...")  # its progress, on the status line
        child.sendline("keep the public API unchanged")
        child.expect(r"you \(steer\): keep the public API unchanged")
        child.expect("steer delivered to the model: keep the public API unchanged")
        child.expect("doom loop detected")
        child.expect(r"permission asked for edit_file")
        child.sendline("!stop and summarise")
        child.expect(r"you \(send now\): stop and summarise")
        child.expect(r"interrupted: send_now\)")
        child.expect("turn 3 .* you: stop and summarise")
        child.expect("turn ended: completed")
        child.expect("idle")
        child.sendeof()  # Ctrl-D
        child.expect("summary")
        child.expect("interrupts: 2")
        child.expect("Noted your message")  # in the printed transcript: the steer reached the model
        child.expect(r"transcript valid \(validate_transcript")
        child.expect(pexpect.EOF)
    finally:
        child.close(force=True)
    assert child.exitstatus == 0, child.before
    assert not _runner_processes()


def test_ctrl_d_while_running_stops_the_tool_process(tmp_path: Path) -> None:
    with _announcing_demo(tmp_path) as (child, started):
        _ctrl_d_while_running(child, started)


def _ctrl_d_while_running(child: pexpect.spawn, started: Callable[[], int]) -> None:
    try:
        child.expect("thinking: ")
        child.sendintr()
        child.expect("turn ended: aborted_streaming")
        child.expect_exact("type a message")  # the input line's hint, once idle
        child.sendline("")  # nothing queued: an empty line does nothing
        child.sendintr()  # idle Ctrl-C: a hint
        child.expect("Ctrl-C again")
        child.sendline("run the tests")
        child.expect(r"run_tests\(\)")  # printed as the call starts, before its process does
        assert started() in _runner_processes()
        child.sendeof()
        child.expect(r"interrupted: quit\)")
        child.expect("transcript valid")
        child.expect(pexpect.EOF)
    finally:
        child.close(force=True)
    assert child.exitstatus == 0
    assert not _runner_processes()


def test_sigterm_ends_a_scenario_instead_of_playing_its_next_step(tmp_path: Path) -> None:
    script = tmp_path / "s.json"
    script.write_text(json.dumps({
        "prompt": "Fix the failing test in utils.py",
        "steps": [{"on": "idle", "do": "prompt", "text": "Now wait for CI to go green."}],
    }))
    proc = subprocess.Popen(
        [sys.executable, "-m", "agentloop", "demo", "--script", str(script)],
        cwd=ROOT, env=_env(), stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, encoding="utf-8",
    )
    try:
        assert proc.stdout is not None
        head = proc.stdout.readline()
        assert "turn 1" in head
        proc.send_signal(signal.SIGTERM)  # as a service manager stops a program
        out, err = proc.communicate(timeout=30)
    finally:
        proc.kill()
        proc.communicate()
    assert "turn ended: aborted_streaming (interrupted: quit)" in out
    assert "turn 2" not in out and "wait for CI" not in out.split("summary")[0]
    assert out.rstrip().endswith("transcript valid (validate_transcript(engine.messages) == [])"), out[-2000:]
    assert err == ""
    assert not _runner_processes()


def test_output_piped_into_a_reader_that_stops_ends_the_demo_quietly() -> None:
    """``python -m agentloop demo --script builtin | head -1``: the demo stops when the pipe closes."""
    proc = subprocess.Popen(
        [sys.executable, "-m", "agentloop", "demo", "--script", "builtin"],
        cwd=ROOT, env=_env(), stdout=subprocess.PIPE, stderr=subprocess.PIPE,
    )
    try:
        assert proc.stdout is not None
        assert b"turn 1" in proc.stdout.readline()
        proc.stdout.close()  # the reader is gone: the next write fails with EPIPE
        _, err = proc.communicate(timeout=30)
    finally:
        proc.kill()
        proc.communicate()
    assert err == b""  # no traceback, neither from the run nor from the interpreter's exit
    assert proc.returncode == 0
    assert not _runner_processes()


@pytest.mark.parametrize("how", ["script", "pipe"])
def test_output_to_a_full_disk_is_one_line_on_stderr_and_status_1(how: str) -> None:
    """``python -m agentloop demo > /dev/full``: each write failed with ENOSPC, which came out as
    tracebacks (from the run's task, from an idle callback, from the session), and a scenario then
    waited for its timeout, as its player had died in the callback."""
    args = ["--script", "builtin", "--speed", "4"] if how == "script" else []
    with open(os.devnull, "rb") as devnull, open("/dev/full", "w") as full:
        proc = subprocess.run(
            [sys.executable, "-m", "agentloop", "demo", *args],
            cwd=ROOT, env=_env(), stdin=devnull, stdout=full, stderr=subprocess.PIPE, timeout=60,
        )
    assert b"Traceback" not in proc.stderr, proc.stderr.decode()[-3000:]
    assert proc.stderr.decode().splitlines() == [
        "agentloop demo: cannot write the output: [Errno 28] No space left on device"
    ]
    assert proc.returncode == 1
    assert not _runner_processes()


def test_output_in_an_encoding_without_the_demos_symbols() -> None:
    """A console in an 8-bit code page (or output piped on such a system): the demo's symbols in ASCII
    (they were '?', and the turn header began "?? turn 1 ??"), '?' for anything else it cannot show."""
    proc = subprocess.run(
        [sys.executable, "-m", "agentloop", "demo", "--script", "builtin", "--speed", "4"],
        cwd=ROOT, env=dict(_env(), PYTHONIOENCODING="ascii"), capture_output=True, timeout=55,
    )
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr
    assert proc.stderr == b""
    out = proc.stdout.decode("ascii")
    assert "the run failed" not in out
    assert "-- turn 1 -- you: Fix the failing test in utils.py" in out  # the symbols' ASCII look-alikes
    assert "* list_files(" in out and "  + list_files: " in out and "??" not in out
    assert out.rstrip().endswith("transcript valid (validate_transcript(engine.messages) == [])")


def test_speed_must_be_a_positive_number(capsys: pytest.CaptureFixture[str]) -> None:
    from agentloop.__main__ import main

    for speed in ("0", "-1", "nan"):
        assert main(["demo", "--speed", speed]) == 2, speed
        assert capsys.readouterr().err == "agentloop demo: --speed must be positive\n"


def test_closed_standard_input_is_a_usage_error() -> None:
    """``python -m agentloop demo <&-`` (a service, a cron job): one line and exit 2, not a traceback."""
    proc = subprocess.run(
        ["sh", "-c", 'exec "$0" -m agentloop demo <&-', sys.executable],
        cwd=ROOT, env=_env(), capture_output=True, text=True, timeout=55,
    )
    assert proc.returncode == 2, proc.stdout[-2000:] + proc.stderr
    assert proc.stderr.count("\n") == 1 and "standard input is not readable" in proc.stderr
    assert "--script builtin" in proc.stderr


@pytest.mark.parametrize(
    ("scenario", "message"),
    [
        ({"timeout": "soon", "steps": []}, '"timeout" must be a number of seconds > 0'),
        ({"timeout": None, "steps": []}, '"timeout" must be a number'),
        ({"timeout": 0, "steps": []}, '"timeout" must be a number'),
        ({"prompt": 5, "steps": []}, '"prompt" must be a string'),
        ([{"do": "interrupt", "on": "text_delta", "count": "2"}], 'step 1: "count" must be a whole number >= 1'),
        ([{"do": "interrupt", "on": "text_delta", "count": 0}], 'step 1: "count" must be a whole number'),
        ([{"do": "quit"}, {"do": "interrupt", "delay": "1"}], 'step 2: "delay" must be a number of seconds >= 0'),
        ([{"do": "interject", "on": "text_delta", "text": 5}], 'step 1: "text" must be a string'),
        ([{"do": "interrupt", "reason": None}], 'step 1: "reason" must be a non-empty string'),
        ([{"do": "interrupt", "on": 3}], 'step 1: "on" must be "idle" or an event type'),
        ([{"do": "interrupt", "on": "turn_ended", "turn": "1"}], 'step 1: "turn" must be a turn number'),
    ],
)
def test_a_scenario_with_a_wrongly_typed_value_is_refused_before_it_plays(scenario: object, message: str) -> None:
    """Each of these used to be accepted and fail mid-run (``the run failed: TypeError``) or crash."""
    with pytest.raises(ScenarioError, match=re.escape(message)):
        parse_scenario(scenario)


def test_a_hangup_ends_the_demo_and_stops_the_tool_process(tmp_path: Path) -> None:
    """The terminal window closed (SIGHUP) while the tests ran: the demo used to die at once and
    leave the test runner's process group running on its own."""
    with _announcing_demo(tmp_path) as (child, started):
        _hangup_while_running(child, started)


def _hangup_while_running(child: pexpect.spawn, started: Callable[[], int]) -> None:
    try:
        child.expect("thinking: ")
        child.sendintr()
        child.expect_exact("type a message")
        child.sendline("run the tests")
        child.expect(r"run_tests\(\)")
        assert started() in _runner_processes()
        child.kill(signal.SIGHUP)
        child.expect(r"interrupted: quit\)")
        child.expect(pexpect.EOF)
        assert not _runner_processes()  # stopped by the demo, not left to finish on its own
    finally:
        child.close(force=True)


def test_model_or_base_url_without_provider_is_a_usage_error(capsys: pytest.CaptureFixture[str]) -> None:
    """``demo --model gpt-4o`` used to run the offline scripted demo, ignoring the model asked for."""
    from agentloop.__main__ import main

    for args in (["--model", "gpt-4o"], ["--base-url", "http://127.0.0.1:8000/v1"]):
        assert main(["demo", *args]) == 2, args
        assert capsys.readouterr().err == (
            "agentloop demo: --model and --base-url need --provider (without it the demo is offline)\n"
        )


@pytest.mark.parametrize(
    ("step", "message"),
    [
        ({"do": "interrupt", "on": "text-delta"}, '"on" must be "idle" or an event type (assistant_message, '),
        ({"do": "quit", "on": "turn_ended", "terminal": "done"}, '"terminal" must be a terminal reason (aborted_streaming, '),
    ],
)
def test_a_step_waiting_for_an_event_that_does_not_exist_is_refused(step: dict[str, object], message: str) -> None:
    """A typo used to make a step that could never fire: the scenario played, then reported itself stuck."""
    with pytest.raises(ScenarioError, match=re.escape(message)):
        parse_scenario([step])


class _Tty(io.StringIO):
    def isatty(self) -> bool:
        return True


@pytest.mark.parametrize("first_rows", [24, 3])
def test_the_status_line_comes_back_when_a_small_terminal_grows(
    monkeypatch: pytest.MonkeyPatch, first_rows: int
) -> None:
    """A terminal made (or started) too small for the status line used to lose it for good."""
    from agentloop.demo.screen import Screen

    rows = [first_rows]
    monkeypatch.setattr(
        "agentloop.demo.screen.shutil.get_terminal_size", lambda fallback=(80, 24): os.terminal_size((40, rows[0]))
    )
    out = _Tty()
    screen = Screen(out, tty=True, color=False)
    screen.start()
    screen.status("working")
    rows[0] = 3  # too small: the region is given back
    screen.resized()
    screen.status("2 tools running")
    assert "2 tools running" not in out.getvalue()  # nothing drawn while there is no room
    rows[0] = 30
    out.seek(0)
    out.truncate()
    screen.resized()
    assert "\x1b[1;29r" in out.getvalue()  # the region is back, above the last row
    assert "\x1b[30;1H\x1b[2K 2 tools running\x1b8" in out.getvalue()  # with the latest status
    screen.stop()
    assert out.getvalue().endswith("\x1b7\x1b[r\x1b[30;1H\x1b[2K\x1b8\x1b[0m")


def test_only_output_that_went_away_ends_the_screen() -> None:
    """EPIPE or EIO: nobody reads any more, the session ends quietly. EAGAIN from an output that
    stays non-blocking (one the demo cannot make blocking: no descriptor) is not that: it used to
    be raised, a traceback; the session ends with it as the reason (one line on stderr, status 1)."""
    from agentloop.demo.screen import Screen

    class Failing(io.StringIO):
        def __init__(self, exc: OSError) -> None:
            super().__init__()
            self.exc = exc

        def write(self, text: str) -> int:
            raise self.exc

    ended: list[str] = []
    gone = Screen(Failing(BrokenPipeError(errno.EPIPE, "Broken pipe")), tty=False, color=False)
    gone.on_closed = lambda: ended.append("closed")
    gone.line("a")
    gone.line("b")  # dropped: the screen is closed
    assert gone.closed and ended == ["closed"]
    busy = Screen(Failing(BlockingIOError(errno.EAGAIN, "Resource temporarily unavailable")), tty=False, color=False)
    busy.on_closed = lambda: ended.append("busy")
    busy.line("a")
    assert busy.closed and ended == ["closed", "busy"]
    assert isinstance(busy.failed, BlockingIOError) and gone.failed is None


def test_keys_a_terminal_echoes_as_control_characters_are_not_part_of_a_typed_line() -> None:
    """An arrow key pressed while typing (as to recall a line in a shell) puts ``ESC [ A`` in the
    line. It used to reach the model, and printed back in the turn header it moved the cursor and
    overwrote earlier output; Up then Enter alone started a turn on an invisible prompt."""
    assert parse("fix it\x1b[A\x1b[A\x1b[D please") == parse("fix it please")
    assert parse("\x1b[A").kind == "empty" and parse("\x1bOP\x1b[15~").kind == "empty"  # F1, F5
    assert parse("!\x1b[Astop") == parse("!stop") and parse("\x1b[C/quit").kind == "command"
    assert parse("caf\u00e9 \u65e5\u672c\u8a9e \U0001f389\tok\x07\x7f").text == "caf\u00e9 \u65e5\u672c\u8a9e \U0001f389 ok"


def test_the_status_line_is_on_the_terminals_last_row_whatever_lines_says() -> None:
    """``LINES`` and ``COLUMNS`` exported in the environment (a shell profile, or values a shell
    exported before the window was resized) used to be taken for the terminal's size: the scroll
    region and the status line were placed for 40 rows in a terminal of 24 (every status update was
    drawn in the middle of the output) and the status line was too wide for its row. A resize kept
    the stale size too."""
    child = pexpect.spawn(
        sys.executable, ["-m", "agentloop", "demo"], cwd=str(ROOT), env=dict(_env(), LINES="40", COLUMNS="200"),
        encoding="utf-8", timeout=30, dimensions=(24, 110),
    )
    try:
        child.expect(r"\x1b\[1;(\d+)r")
        assert child.match.group(1) == "22"  # the region ends above the real terminal's last two rows
        child.expect(r"\x1b7\x1b\[(\d+);1H\x1b\[2K starting\x1b8")
        assert child.match.group(1) == "23"  # the status line
        child.expect(r"\x1b7\x1b\[(\d+);1H\x1b\[2K\u203a ")
        assert child.match.group(1) == "24"  # the input line
        child.expect("assistant: Let me")
        child.setwinsize(30, 110)
        child.expect(r"\x1b7\x1b\[1;(\d+)r\x1b8")
        assert child.match.group(1) == "28"
        child.sendeof()
        child.expect("transcript valid")
        child.expect(pexpect.EOF)
    finally:
        child.close(force=True)
    assert child.exitstatus == 0


@pytest.mark.parametrize("how", ["--plain", "TERM=dumb"])
def test_without_a_status_line_the_idle_hint_is_a_line(how: str) -> None:
    """With --plain (or TERM=dumb, or the output in a file) there is no status line, and the hint it
    shows when a turn ends was never seen: nothing said the agent was idle, nor that a message
    queued before a Ctrl-C waits for Enter."""
    env = dict(_env(), TERM="dumb") if how == "TERM=dumb" else _env()
    args = ["-m", "agentloop", "demo"] + (["--plain"] if how == "--plain" else [])
    child = pexpect.spawn(sys.executable, args, cwd=str(ROOT), env=env, encoding="utf-8", timeout=30, dimensions=(24, 110))
    try:
        child.expect("thinking: ")
        child.sendintr()
        child.expect(r"turn ended: aborted_streaming \(interrupted: cancel\)\r\n")
        child.expect_exact("idle \u2014 type a message, /help, Ctrl-D to exit\r\n")
        child.sendline("/mode queue")
        child.expect("queue a turn")
        child.sendline("go on")
        child.expect("turn 2 .* you: go on")
        child.sendline("then summarise")
        child.expect(r"you \(queued\): then summarise")
        child.sendintr()
        child.expect(r"turn ended: \w+ \(interrupted: cancel\)\r\n")
        child.expect_exact("idle \u2014 1 queued message(s): press Enter to run\r\n")
        child.sendline("")
        child.expect("turn 3 .* you: then summarise")
        child.sendeof()
        child.expect(r"interrupted: quit\)")
        child.expect("summary")
        assert "idle" not in child.before  # the session is ending: no hint
        child.expect(r"transcript valid \(validate_transcript")
        child.expect(pexpect.EOF)
    finally:
        child.close(force=True)
    assert child.exitstatus == 0


def test_input_from_a_pipe_is_played_to_the_end_before_the_demo_exits() -> None:
    """``echo "keep the API" | python -m agentloop demo``: the end of a pipe or a file is the end of
    what there is to read, not a person pressing Ctrl-D to leave now. It used to quit at once: the
    first turn was aborted before the model had said a word, whatever the input asked for."""
    proc = subprocess.run(
        [sys.executable, "-m", "agentloop", "demo", "--speed", "4"], input="keep the public API unchanged\n",
        cwd=ROOT, env=_env(), capture_output=True, text=True, encoding="utf-8", timeout=55,
    )
    log = proc.stdout
    assert proc.returncode == 0, log[-3000:] + proc.stderr
    assert proc.stderr == ""
    assert "steer delivered to the model: keep the public API unchanged" in log
    assert "Noted your message \u201ckeep the public API unchanged\u201d" in log  # the model saw it
    assert "terminals: completed x1" in log and "interrupted" not in log
    assert log.rstrip().endswith("transcript valid (validate_transcript(engine.messages) == [])")
    assert "\x1b[" not in log
    # /quit in the input still quits at once, and an empty input still ends the session.
    proc = subprocess.run(
        [sys.executable, "-m", "agentloop", "demo"], input="hello\n/quit\n",
        cwd=ROOT, env=_env(), capture_output=True, text=True, encoding="utf-8", timeout=55,
    )
    assert proc.returncode == 0 and proc.stderr == ""
    assert "(interrupted: quit)" in proc.stdout and "terminals: completed" not in proc.stdout
    assert not _runner_processes()


async def test_a_steer_is_acknowledged_even_when_the_next_step_has_no_text() -> None:
    """A steer delivered while list_files ran reached the model, but the next step (reading
    utils.py) says nothing, so the scripted agent never acknowledged it: typing while it works
    looked ignored."""
    from agentloop import InterjectionInjected, ScriptedModel, TextDelta, validate_transcript
    from agentloop.demo.app import build_engine
    from agentloop.demo.story import Story

    engine = build_engine(ScriptedModel([Story(delay=0)], cycle=True, record=False), speed=100)
    said = ""
    async for event in engine.run("Fix the failing test in utils.py"):
        if event.type == "tool_call_started" and event.tool_use.name == "list_files":
            engine.interject("keep the public API unchanged")
        elif isinstance(event, InterjectionInjected):
            said = ""  # what the model says from here on
        elif isinstance(event, TextDelta):
            said += event.text
        elif event.type == "tool_call_started" and event.tool_use.name == "read_file":
            engine.interrupt()
    assert said.startswith("Noted your message \u201ckeep the public API unchanged\u201d")
    assert validate_transcript(engine.messages) == []


def test_ctrl_z_gives_the_terminal_back_to_the_shell_and_fg_takes_it_again() -> None:
    """Ctrl-Z used to stop the demo with its scroll region and status line still set: the shell
    ran in the rows above a stale status line until the demo was resumed."""
    env = dict(_env(), PS1="demo-shell$ ", HISTFILE="/dev/null", TERM="xterm")
    shell = pexpect.spawn(
        "bash", ["--norc", "--noprofile", "-i"], cwd=str(ROOT), env=env, encoding="utf-8", timeout=30,
        dimensions=(24, 110),
    )
    try:
        shell.expect_exact("demo-shell$ ")
        shell.sendline(f"'{sys.executable}' -m agentloop demo")
        shell.expect("assistant: Let me")
        shell.sendcontrol("z")
        shell.expect("Stopped")
        # The region is given back and the bottom rows cleared before the shell has the terminal.
        assert "\x1b7\x1b[r\x1b[23;1H\x1b[2K\x1b[24;1H\x1b[2K\x1b8" in shell.before
        shell.expect_exact("demo-shell$ ")
        shell.sendline("fg")
        shell.expect_exact("\x1b[1;22r")  # taken again on resume...
        shell.expect(r"\x1b\[23;1H\x1b\[2K \w")  # ...with the status line
        shell.sendeof()
        shell.expect(r"transcript valid \(validate_transcript")
        shell.expect_exact("demo-shell$ ")
        shell.sendline("echo demo-status=$?")  # the status of the job fg resumed
        shell.expect(r"demo-status=(\d+)")
        assert shell.match.group(1) == "0"
        shell.sendline("exit")
        shell.expect(pexpect.EOF)
    finally:
        shell.close(force=True)
    assert not _runner_processes()


def _lflag(child: pexpect.spawn) -> int:
    """The local modes of the child's terminal (read through the pty's main side, which shares them)."""
    return int(termios.tcgetattr(child.child_fd)[3])


@pytest.mark.parametrize("plain", [False, True])
def test_ctrl_backslash_quits_and_gives_the_terminal_back(plain: bool) -> None:
    """Ctrl-\\ (SIGQUIT) killed the demo by its default action, leaving the terminal without echo and
    line editing (a shell typed into blind) and, on a full terminal, the scroll region and the
    hidden cursor. It now quits as SIGTERM does: the turn stopped, the terminal given back."""
    child = pexpect.spawn(
        sys.executable, ["-m", "agentloop", "demo", *(["--plain"] if plain else [])], cwd=str(ROOT), env=_env(),
        encoding="utf-8", timeout=30, dimensions=(24, 110),
    )
    child.logfile_read = log = io.StringIO()
    try:
        child.expect("assistant: Let me")
        during = _lflag(child)
        assert not during & termios.ECHOCTL
        assert bool(during & termios.ECHO) == bool(during & termios.ICANON) == plain  # the demo edits, or the terminal
        child.sendcontrol("\\")
        child.expect(r"transcript valid \(validate_transcript")
        child.expect(pexpect.EOF)
        after = _lflag(child)
    finally:
        child.close(force=True)
    assert child.signalstatus is None and child.exitstatus == 0
    given_back = termios.ECHO | termios.ICANON | termios.ECHOCTL  # as a pty starts, and a shell wants it
    assert after & given_back == given_back
    if not plain:  # the scroll region and the cursor too
        assert "\x1b7\x1b[r\x1b[23;1H\x1b[2K\x1b[24;1H\x1b[2K\x1b8" in log.getvalue() and "\x1b[?25h" in log.getvalue().split("\u2500\u2500 summary")[0]
    assert not _runner_processes()


@pytest.mark.parametrize("how", ["--plain", "TERM=dumb"])
def test_without_a_status_line_the_terminal_echoes_what_is_typed_once(how: str) -> None:
    """With --plain or TERM=dumb the terminal edits and echoes the lines (no input row to draw them
    on): each typed line shows once, where it was typed, and the demo does not print it again;
    Ctrl-C is not echoed as ^C."""
    env = dict(_env(), TERM="dumb") if how == "TERM=dumb" else _env()
    child = pexpect.spawn(
        sys.executable, ["-m", "agentloop", "demo", *([how] if how == "--plain" else [])], cwd=str(ROOT), env=env,
        encoding="utf-8", timeout=30, dimensions=(24, 110),
    )
    child.logfile_read = log = io.StringIO()
    try:
        child.expect("assistant: Let me")
        lflag = _lflag(child)
        assert lflag & termios.ECHO and lflag & termios.ICANON and not lflag & termios.ECHOCTL
        child.send("zebra\r")
        child.expect(r"you \(steer\): zebra")
        child.sendintr()
        child.expect(r"turn ended: aborted_streaming \(interrupted: cancel\)")
        child.expect_exact("type a message")
        child.send("/transcript\r")
        child.expect(r"transcript \(\d+ messages\)")
        child.sendeof()
        child.expect(r"transcript valid \(validate_transcript")
        child.expect(pexpect.EOF)
    finally:
        child.close(force=True)
    assert child.exitstatus == 0
    text = log.getvalue()
    assert "\x1b[" not in text  # no escape sequences at all
    # The terminal's echo, and the demo's two notes ("you (steer): zebra", "not delivered ...: zebra").
    assert text.count("zebra") == 3 and text.count(": zebra") == 2
    assert text.count("/transcript\r\n") == 1 and "\u203a /transcript" not in text  # the echo; the help names it too
    assert "^C" not in text


def _output(log: io.StringIO) -> str:
    """What a demo wrote into its scroll region: its output, without the bottom rows it drew."""
    return re.sub(r"\x1b7.*?\x1b8", "", log.getvalue(), flags=re.DOTALL)


def test_typing_while_the_model_streams_stays_on_the_input_line() -> None:
    """The terminal echoed what was typed where the output had got to, in the middle of the streamed
    answer, and echoed Ctrl-C as ``^C`` there too. The line being typed is now drawn on the input
    line under the status line; the output shows it once sent, as a turn or a steer."""
    child = _spawn_demo()
    child.logfile_read = log = io.StringIO()
    try:
        child.expect("thinking: ")
        child.send("zebra")  # while the model streams
        child.expect(r"\x1b\[24;1H\x1b\[2K\u203a zebra")  # drawn on the input line (the last row)
        child.expect("assistant: Let me")
        child.sendintr()
        child.expect(r"turn ended: aborted_streaming \(interrupted: cancel\)")
        child.send(" crossing\r")  # the line kept through the Ctrl-C that stopped the turn
        child.expect("turn 2 .* you: zebra crossing")
        child.sendintr()
        child.expect("turn ended")
        child.expect_exact("type a message")
        child.send("quokka")
        child.expect_exact("\u203a quokka")
        child.sendintr()  # idle, with a line typed: Ctrl-C clears it, as a shell does
        child.expect_exact("\u203a \x1b[7m \x1b[27m \x1b[2mtype a message")
        child.sendline("/transcript")
        child.expect("\u203a /transcript")  # printed back: nothing else shows a command that ran
        child.expect(r"transcript \(\d+ messages\)")
        child.sendeof()
        child.expect(r"transcript valid \(validate_transcript")
        child.expect(pexpect.EOF)
    finally:
        child.close(force=True)
    assert child.exitstatus == 0
    shown = _output(log)
    assert "zebra" not in shown.split("turn 2")[0]
    assert "quokka" not in shown
    assert "^C" not in log.getvalue()
    assert "\x1b[?25h" in shown.split("\u2500\u2500 summary")[0]  # the terminal's cursor is back at the end


def test_ctrl_c_while_the_package_imports_ends_the_demo_without_a_traceback(tmp_path: Path) -> None:
    """A Ctrl-C in the half second ``python -m agentloop demo`` spends importing the package printed a
    traceback through the import machinery. The signal is sent here as the package imports its
    first own module (by an import hook in sitecustomize), as a Ctrl-C pressed then would be."""
    (tmp_path / "sitecustomize.py").write_text(
        "import importlib.abc, os, signal, sys\n"
        "class Hook(importlib.abc.MetaPathFinder):\n"
        "    def find_spec(self, name, path, target=None):\n"
        "        if name == 'agentloop._abort':\n"
        "            sys.meta_path.remove(self)\n"
        "            os.kill(os.getpid(), signal.SIGINT)\n"
        "        return None\n"
        "sys.meta_path.insert(0, Hook())\n"
    )
    env = dict(_env(), PYTHONPATH=os.pathsep.join([str(tmp_path), str(ROOT)]))
    proc = subprocess.run(
        [sys.executable, "-m", "agentloop", "demo", "--script", "builtin"],
        cwd=ROOT, env=env, capture_output=True, text=True, timeout=55,
    )
    assert proc.stderr == "" and proc.stdout == ""
    assert proc.returncode == -signal.SIGINT  # ended by the Ctrl-C, as a shell expects of a program
    # Imported as a library (not by python -m), Ctrl-C is KeyboardInterrupt from the first line on.
    proc = subprocess.run(
        [sys.executable, "-c", "import agentloop"], cwd=ROOT, env=env, capture_output=True, text=True, timeout=55,
    )
    assert "KeyboardInterrupt" in proc.stderr


def test_ctrl_c_before_the_session_started_is_a_quiet_exit(monkeypatch: pytest.MonkeyPatch) -> None:
    """A Ctrl-C after the import but before the event loop ran the session ended the demo with
    "RuntimeWarning: coroutine '_session' was never awaited"."""
    import gc
    import warnings

    from agentloop.demo import app

    def interrupted(coro: object) -> int:
        raise KeyboardInterrupt  # as Python raises it inside asyncio.run, before the loop starts

    monkeypatch.setattr(app.asyncio, "run", interrupted)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        assert app.run(app.Options(script="builtin"), out=io.StringIO()) == 130
        gc.collect()
    assert [str(w.message) for w in caught] == []


def test_a_pipe_shows_the_commands_it_runs_and_quits_quietly() -> None:
    """``printf 'hello\\n/quit\\n' | python -m agentloop demo``: the commands from a pipe were not shown,
    and the end of input after /quit announced "the demo exits when this turn ends" although it was
    quitting already. A line after /quit started a turn."""
    proc = subprocess.run(
        [sys.executable, "-m", "agentloop", "demo"], input="hello\n/quit\nrun the tests\n",
        cwd=ROOT, env=_env(), capture_output=True, text=True, encoding="utf-8", timeout=55,
    )
    assert proc.returncode == 0 and proc.stderr == ""
    log = proc.stdout
    assert "you (steer): hello" in log and "\u203a /quit\n" in log
    # In the order it happened: the turn the lines steer and stop first (they came above its header).
    assert log.index("turn 1 \u2500\u2500 you: Fix") < log.index("you (steer): hello") < log.index("\u203a /quit")
    assert "end of input" not in log and "run the tests" not in log and "turn 2" not in log
    assert log.rstrip().endswith("transcript valid (validate_transcript(engine.messages) == [])")


def test_typed_text_in_a_latin_1_locale() -> None:
    """The keyboard's bytes were decoded as UTF-8 whatever the locale: in a Latin-1 one, "café" reached
    the model as "caf\ufffd" and was shown as "caf?"."""
    proc = subprocess.run(
        [sys.executable, "-m", "agentloop", "demo", "--speed", "4"], input="caf\u00e9 cr\u00e8me\n/quit\n".encode("latin-1"),
        cwd=ROOT, env=dict(_env(), PYTHONIOENCODING="latin-1"), capture_output=True, timeout=55,
    )
    assert proc.returncode == 0 and proc.stderr == b""
    assert "you (steer): caf\u00e9 cr\u00e8me" in proc.stdout.decode("latin-1")


async def test_send_now_while_idle_starts_a_turn_without_claiming_to_replace_one() -> None:
    """``!text`` while idle printed "you (send now): ... -> engine.send_now" although no turn was there
    to replace; it starts a turn, as a typed line does, shown by the turn's header."""
    from agentloop import ScriptedModel
    from agentloop.demo.app import build_engine
    from agentloop.demo.host import Host
    from agentloop.demo.render import Renderer
    from agentloop.demo.screen import Screen

    out = io.StringIO()
    host = Host(build_engine(ScriptedModel(["Hello."]), speed=100), Renderer(Screen(out, tty=False, color=False)))
    host.handle(parse("!look again"))
    assert host.task is not None
    await host.task
    assert "send_now" not in out.getvalue() and "\u2500\u2500 turn 1 \u2500\u2500 you: look again" in out.getvalue()


def test_a_failed_import_of_the_package_under_python_m_gives_ctrl_c_back(tmp_path: Path) -> None:
    """Under ``python -m``, Ctrl-C has its default action while agentloop imports; an import that
    failed midway (a dependency missing, caught by a program that can do without agentloop) left
    it so: the program's next Ctrl-C killed it, with no KeyboardInterrupt to clean up on."""
    (tmp_path / "sitecustomize.py").write_text(
        "import importlib.abc, sys\n"
        "class Hook(importlib.abc.MetaPathFinder):\n"
        "    def find_spec(self, name, path, target=None):\n"
        "        if name == 'agentloop._abort':\n"
        "            raise ImportError('a dependency is missing')\n"
        "        return None\n"
        "sys.meta_path.insert(0, Hook())\n"
    )
    tool = tmp_path / "host_tool"
    tool.mkdir()
    (tool / "__init__.py").write_text(  # imported by python -m before __main__ runs, as agentloop is
        "try:\n"
        "    import agentloop\n"
        "except ImportError as exc:\n"
        "    failed = str(exc)\n"
    )
    (tool / "__main__.py").write_text(
        "import signal\n"
        "from host_tool import failed\n"
        "print(failed, signal.getsignal(signal.SIGINT) is signal.default_int_handler)\n"
    )
    env = dict(_env(), PYTHONPATH=os.pathsep.join([str(tmp_path), str(ROOT)]))
    proc = subprocess.run(
        [sys.executable, "-m", "host_tool"], cwd=tmp_path, env=env, capture_output=True, text=True, timeout=55,
    )
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout == "a dependency is missing True\n"


async def test_a_send_now_right_after_the_first_prompt_replaces_its_turn() -> None:
    """``printf '!stop now\\n' | python -m agentloop demo``: the line is read before the first turn's
    task has had a step. "stop now" went into the transcript before the first prompt, and the
    turn it was sent to stop ran to its end, the text never answered."""
    from agentloop import ScriptedModel, validate_transcript
    from agentloop.demo.app import build_engine
    from agentloop.demo.host import Host
    from agentloop.demo.render import Renderer
    from agentloop.demo.screen import Screen

    out = io.StringIO()
    engine = build_engine(ScriptedModel(["Stopped, as asked."]), speed=100)
    host = Host(engine, Renderer(Screen(out, tty=False, color=False)))
    host.start("Fix the failing test in utils.py")
    host.handle(parse("!stop now"))
    assert host.task is not None
    await host.task
    log = out.getvalue()
    assert "turn ended: aborted_streaming (interrupted: send_now)" in log
    assert "\u2500\u2500 turn 2 \u2500\u2500 you: stop now" in log
    assert [m.text for m in engine.messages] == ["Fix the failing test in utils.py", "stop now", "Stopped, as asked."]
    assert validate_transcript(engine.messages) == []


async def test_a_turn_started_by_several_queued_messages_shows_them_all() -> None:
    """Two lines queued (/mode queue) while a turn works run as one turn; its header showed only
    the last, as if the first had been lost."""
    from agentloop import ScriptedModel, ScriptedResponse
    from agentloop.demo.app import build_engine
    from agentloop.demo.host import Host
    from agentloop.demo.render import Renderer
    from agentloop.demo.screen import Screen

    out = io.StringIO()
    engine = build_engine(ScriptedModel([ScriptedResponse(text="First answer."), "Both done."]), speed=100)
    host = Host(engine, Renderer(Screen(out, tty=False, color=False)), mode="queue")
    host.start("Fix the failing test in utils.py")
    host.handle(parse("first queued"))
    host.handle(parse("second queued"))
    assert host.task is not None
    await host.task
    log = out.getvalue()
    assert "\u2500\u2500 turn 2 \u2500\u2500 you: first queued; second queued\n" in log
    assert [m.text for m in engine.messages][-3:] == ["first queued", "second queued", "Both done."]


def test_a_commands_argument_is_as_case_blind_as_its_name() -> None:
    """``/Mode Queue`` ran /mode (names are case-blind) and then refused "Queue" as no mode."""
    from agentloop import ScriptedModel
    from agentloop.demo.app import build_engine
    from agentloop.demo.host import Host
    from agentloop.demo.render import Renderer
    from agentloop.demo.screen import Screen

    out = io.StringIO()
    host = Host(build_engine(ScriptedModel(["unused"]), speed=100), Renderer(Screen(out, tty=False, color=False)))
    host.handle(parse("/Mode Queue"))
    assert host.mode == "queue" and "usage" not in out.getvalue()
    host.handle(parse("/MODE STEER"))
    assert host.mode == "steer"


def test_no_command_is_usage_on_stderr_and_status_2(capsys: pytest.CaptureFixture[str]) -> None:
    """``python -m agentloop`` with no command printed its help on standard output yet exited 2:
    help nobody asked for is a usage error, on standard error (``--help`` stays on stdout, 0)."""
    from agentloop.__main__ import main

    assert main([]) == 2
    out, err = capsys.readouterr()
    assert out == "" and err.startswith("usage: agentloop") and "demo" in err
    with pytest.raises(SystemExit) as info:
        main(["--help"])
    out, err = capsys.readouterr()
    assert info.value.code == 0 and out.startswith("usage: agentloop") and err == ""


@pytest.mark.parametrize(
    ("argv", "bad"), [(["demo", "--bogus"], "--bogus"), (["demo", "extra"], "extra"), (["demo", "--plain", "-x"], "-x")]
)
def test_a_bad_argument_to_demo_shows_the_demos_usage(
    argv: list[str], bad: str, capsys: pytest.CaptureFixture[str]
) -> None:
    """``agentloop demo --bogus`` answered with the usage of ``agentloop`` (``COMMAND ...``), which
    names none of the demo's options: the error is the demo's, under its own usage."""
    from agentloop.__main__ import main

    with pytest.raises(SystemExit) as info:
        main(argv)
    out, err = capsys.readouterr()
    assert info.value.code == 2 and out == ""
    assert err.startswith("usage: agentloop demo") and "--provider" in err
    assert err.endswith(f"\nagentloop demo: error: unrecognized arguments: {bad}\n")


def test_with_term_dumb_text_left_before_ctrl_d_does_not_run_into_the_summary() -> None:
    """With TERM=dumb the terminal echoes what is typed: "abc" then Ctrl-D twice left the cursor
    after "abc", and the summary's first line began there ("abc── summary ──")."""
    child = pexpect.spawn(
        sys.executable, ["-m", "agentloop", "demo"], cwd=str(ROOT), env=dict(_env(), TERM="dumb"),
        encoding="utf-8", timeout=30, dimensions=(24, 110),
    )
    child.logfile_read = log = io.StringIO()
    try:
        child.expect("thinking: ")
        child.sendintr()
        child.expect_exact("idle \u2014 type a message")
        child.send("abc")
        child.expect_exact("abc")
        child.sendeof()
        child.sendeof()
        child.expect(r"transcript valid \(validate_transcript")
        child.expect(pexpect.EOF)
    finally:
        child.close(force=True)
    text = log.getvalue()
    assert "abc\r\n\u2500\u2500 summary" in text, text[-600:]


async def test_after_the_showcase_every_turn_runs_the_tests_and_suggests_what_is_left() -> None:
    """Once the fix was done, every message got one canned sentence back, at once, with no tool: a
    user who wanted to try !text or /mode queue had nothing running to replace or queue behind,
    "run the tests" ran none, and the answer still suggested CI after the CI loop had been seen."""
    from agentloop import ScriptedModel, TextDelta, ToolCallStarted, ToolProgress, validate_transcript
    from agentloop.demo.app import build_engine
    from agentloop.demo.story import Story

    engine = build_engine(ScriptedModel([Story(delay=0)], cycle=True, record=False), speed=100)

    async def turn(prompt: str) -> tuple[list[str], list[str], str]:
        tools, progress, said = [], [], ""
        async for event in engine.run(prompt):
            if isinstance(event, ToolCallStarted):
                tools.append(event.tool_use.name)
            elif isinstance(event, ToolProgress):
                progress.append(event.text)
            elif isinstance(event, TextDelta):
                said += event.text
        return tools, progress, said

    await turn("Fix the failing test in utils.py")
    tools, progress, said = await turn("run the tests")
    assert tools == ["run_tests"] and "2 passed" in progress
    assert "wait for CI" in said  # not tried yet
    tools, _, _ = await turn("now wait for CI")
    assert set(tools) == {"ci_status"}
    tools, _, said = await turn("what else?")
    assert tools == ["run_tests"]
    assert "CI" not in said and "/mode queue" in said and "!text" in said
    assert validate_transcript(engine.messages) == []


def test_the_idle_ctrl_c_that_arms_the_exit_expires() -> None:
    """A Ctrl-C at idle armed the exit for good: another one minutes later quit the demo. The
    arming lasts `IDLE_CTRL_C_WINDOW` seconds (driven here by a fake clock)."""
    from agentloop import ScriptedModel
    from agentloop.demo.app import build_engine
    from agentloop.demo.host import IDLE_CTRL_C_WINDOW, Host
    from agentloop.demo.render import HELP, Renderer
    from agentloop.demo.screen import Screen

    now = [1000.0]
    out = io.StringIO()
    host = Host(
        build_engine(ScriptedModel(["Hello."]), speed=100), Renderer(Screen(out, tty=False, color=False)),
        clock=lambda: now[0],
    )
    assert 0 < IDLE_CTRL_C_WINDOW <= 10
    assert any(f"twice within {IDLE_CTRL_C_WINDOW:g} seconds" in what for _, what in HELP)  # as /help says
    host.sigint()
    assert f"Ctrl-C again within {IDLE_CTRL_C_WINDOW:g}s" in out.getvalue()
    now[0] += 120  # minutes later: a first Ctrl-C again, not an exit
    host.sigint()
    assert not host.exit.is_set()
    assert out.getvalue().count("Ctrl-C again") == 2
    now[0] += IDLE_CTRL_C_WINDOW  # just at the window's end: still armed
    host.sigint()
    assert host.exit.is_set()


def test_two_ctrl_c_in_quick_succession_at_idle_exit() -> None:
    from agentloop import ScriptedModel
    from agentloop.demo.app import build_engine
    from agentloop.demo.host import Host
    from agentloop.demo.render import Renderer
    from agentloop.demo.screen import Screen

    now = [5.0]
    host = Host(
        build_engine(ScriptedModel(["Hello."]), speed=100),
        Renderer(Screen(io.StringIO(), tty=False, color=False)), clock=lambda: now[0],
    )
    host.sigint()
    now[0] += 0.5
    host.sigint()
    assert host.exit.is_set()


def test_ctrl_c_during_a_script_interrupts_it_and_is_not_reported_stuck(tmp_path: Path) -> None:
    """Ctrl-C while a scenario played cancelled the turn, and the player, finding the agent idle
    with a step still waiting for an event, reported the scenario as stuck. It is the interrupt
    path, as at the keyboard: the turn is cancelled, no further step is played, and the report says
    the scenario was interrupted (exit status 130)."""
    script = tmp_path / "s.json"
    script.write_text(json.dumps({
        "prompt": "Fix the failing test in utils.py",
        "steps": [{"on": "turn_ended", "turn": 5, "do": "prompt", "text": "never played"}],
    }))
    proc = subprocess.Popen(
        [sys.executable, "-m", "agentloop", "demo", "--script", str(script)],
        cwd=ROOT, env=_env(), stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, encoding="utf-8",
    )
    try:
        assert proc.stdout is not None
        assert "turn 1" in proc.stdout.readline()  # the handlers are in place before the first turn
        proc.send_signal(signal.SIGINT)
        out, err = proc.communicate(timeout=30)
    finally:
        proc.kill()
        proc.communicate()
    assert err == ""
    assert "(interrupted: cancel)" in out, out[-2000:]
    assert "stuck" not in out and "never played" not in out.split("summary")[0]
    assert "[script] interrupted by Ctrl-C before step 1" in out
    assert out.rstrip().endswith("transcript valid (validate_transcript(engine.messages) == [])"), out[-2000:]
    assert proc.returncode == 130
    assert not _runner_processes()


def _nonblocking(fd: int) -> bool:
    return bool(fcntl.fcntl(fd, fcntl.F_GETFL) & os.O_NONBLOCK)


def _set_nonblocking(fd: int) -> None:
    fcntl.fcntl(fd, fcntl.F_SETFL, fcntl.fcntl(fd, fcntl.F_GETFL) | os.O_NONBLOCK)


def _read_until(fd: int, marker: bytes, got: bytearray) -> None:
    """Read ``fd`` into ``got`` until ``marker`` is in it or the end of file (30 s at most per read)."""
    while marker not in got:
        ready, _, _ = select.select([fd], [], [], 30)
        assert ready, f"no output for 30 s: {bytes(got[-2000:])!r}"
        data = os.read(fd, 65536)
        if not data:
            return
        got += data


def test_output_left_non_blocking_by_another_program_is_written_whole() -> None:
    """Standard output left O_NONBLOCK (a crashed node or ssh does that to a terminal): a write that
    found the pipe full failed with EAGAIN, and the demo ended in a BlockingIOError traceback. It
    writes in blocking mode for the session, and puts the flag back on exit."""
    read_fd, write_fd = os.pipe()
    try:
        fcntl.fcntl(write_fd, fcntl.F_SETPIPE_SZ, 4096)
        _set_nonblocking(write_fd)
        with contextlib.suppress(BlockingIOError):  # fill the pipe: the demo's first write finds it full
            while True:
                os.write(write_fd, b"#" * 512)
        proc = subprocess.Popen(
            [sys.executable, "-m", "agentloop", "demo", "--script", "builtin", "--speed", "4"],
            cwd=ROOT, env=_env(), stdin=subprocess.DEVNULL, stdout=write_fd, stderr=subprocess.PIPE,
        )
        try:
            got = bytearray()
            _read_until(read_fd, b"transcript valid (validate_transcript(engine.messages) == [])\n", got)
            _, err = proc.communicate(timeout=30)
        finally:
            proc.kill()
            proc.communicate()
        assert err == b"", err.decode()[-3000:]
        assert proc.returncode == 0
        log = got.lstrip(b"#").decode()
        assert log.startswith("\u2500\u2500 turn 1") and "terminals: aborted_streaming x1" in log
        assert _nonblocking(write_fd)  # given back as it was found
    finally:
        os.close(read_fd)
        os.close(write_fd)


def test_input_left_non_blocking_by_another_program_is_waited_for() -> None:
    """Standard input left O_NONBLOCK: a read with nothing typed yet failed with EAGAIN, which the
    demo took for the end of its input (it quit before anything was typed). It waits for input,
    and puts the flag back on exit."""
    in_read, in_write = os.pipe()
    out_read, out_write = os.pipe()
    try:
        _set_nonblocking(in_read)
        proc = subprocess.Popen(
            [sys.executable, "-m", "agentloop", "demo", "--speed", "4"],
            cwd=ROOT, env=_env(), stdin=in_read, stdout=out_write, stderr=subprocess.PIPE,
        )
        os.close(out_write)
        try:
            got = bytearray()
            _read_until(out_read, "idle \u2014".encode(), got)  # the first turn ended, nothing typed yet
            os.write(in_write, b"/quit\n")
            _read_until(out_read, b"\0", got)  # to the end of the output
            _, err = proc.communicate(timeout=30)
        finally:
            proc.kill()
            proc.communicate()
        log = got.decode()
        assert err == b"", err.decode()[-3000:]
        assert proc.returncode == 0
        assert "end of input" not in log and "\u203a /quit\n" in log
        assert log.rstrip().endswith("transcript valid (validate_transcript(engine.messages) == [])")
        assert _nonblocking(in_read)  # given back as it was found
    finally:
        for fd in (in_read, in_write, out_read):
            os.close(fd)


def test_a_terminal_left_non_blocking_by_another_program() -> None:
    """A terminal a crashed program left O_NONBLOCK: the demo's first read found nothing typed yet,
    failed with EAGAIN, and was taken for Ctrl-D (the demo quit at once). It reads and writes as
    usual, and the terminal is left non-blocking, as it was found, for the program after it."""
    flag = "import fcntl, os; print('NONBLOCK', bool(fcntl.fcntl(0, fcntl.F_GETFL) & os.O_NONBLOCK))"
    set_flag = "import fcntl, os; fcntl.fcntl(0, fcntl.F_SETFL, fcntl.fcntl(0, fcntl.F_GETFL) | os.O_NONBLOCK)"
    py = sys.executable
    script = f'"{py}" -c "{set_flag}"; "{py}" -m agentloop demo --speed 4; echo STATUS=$?; "{py}" -c "{flag}"'
    child = pexpect.spawn(
        "sh", ["-c", script], cwd=str(ROOT), env=_env(), encoding="utf-8", timeout=30, dimensions=(24, 110),
    )
    try:
        child.expect("turn 1")
        child.send("keep the public API unchanged\r")
        child.expect("steer delivered to the model: keep the public API unchanged")
        child.expect_exact("type a message")  # idle
        child.sendeof()
        child.expect(r"transcript valid \(validate_transcript")
        child.expect(r"STATUS=(\d+)")
        status = child.match.group(1)
        child.expect(r"NONBLOCK (\w+)")
        flag_after = child.match.group(1)
        child.expect(pexpect.EOF)
        before = child.before
    finally:
        child.close(force=True)
    assert status == "0" and flag_after == "True"
    assert "Traceback" not in before


def test_unbuffered_output_made_non_blocking_in_the_middle_of_a_write_loses_no_text() -> None:
    """Under ``python -u`` (PYTHONUNBUFFERED) standard output writes to the descriptor itself: a
    write that found the pipe full once another program had made it non-blocking wrote part of the
    line, and the rest was dropped without an error (exit status 0). The demo writes every byte,
    waiting for room, and gives the output back non-blocking, as it was made during the session."""
    long_command = "/start" + "x" * 50_000 + "end"  # a command name is read in lower case
    in_read, in_write = os.pipe()
    out_read, out_write = os.pipe()
    try:
        fcntl.fcntl(out_write, fcntl.F_SETPIPE_SZ, 4096)
        proc = subprocess.Popen(
            [sys.executable, "-m", "agentloop", "demo", "--speed", "4"],
            cwd=ROOT, env=_env(PYTHONUNBUFFERED="1"), stdin=in_read, stdout=out_write, stderr=subprocess.PIPE,
        )
        try:
            got = bytearray()
            _read_until(out_read, "idle \u2014".encode(), got)  # the first turn ended
            os.write(in_write, f"{long_command}\n/quit\n".encode())
            # The line is ten times the pipe: once its start is read, the demo is inside its write.
            _read_until(out_read, b"/start", got)
            _set_nonblocking(out_write)
            _read_until(out_read, b"transcript valid (validate_transcript(engine.messages) == [])\n", got)
            _, err = proc.communicate(timeout=30)
        finally:
            proc.kill()
            proc.communicate()
        log = got.decode()
        assert err == b"", err.decode()[-3000:]
        assert proc.returncode == 0
        assert f"\u203a {long_command}\n" in log  # the line as typed, whole
        assert f"unknown command {long_command}: try /help\n" in log
        assert _nonblocking(out_write)  # made non-blocking during the session: given back so
    finally:
        for fd in (in_read, in_write, out_read, out_write):
            os.close(fd)


def test_a_scenario_leaves_standard_input_as_it_found_it() -> None:
    """A scenario never reads standard input, and its O_NONBLOCK flag belongs to the open file,
    which other programs share: the demo made it blocking for the session all the same."""
    in_read, in_write = os.pipe()
    out_read, out_write = os.pipe()
    try:
        _set_nonblocking(in_read)
        proc = subprocess.Popen(
            [sys.executable, "-m", "agentloop", "demo", "--script", "builtin", "--speed", "4"],
            cwd=ROOT, env=_env(), stdin=in_read, stdout=out_write, stderr=subprocess.PIPE,
        )
        os.close(out_write)
        try:
            got = bytearray()
            _read_until(out_read, b"turn 1", got)  # the session has begun
            during = _nonblocking(in_read)
            _read_until(out_read, b"\0", got)  # to the end of the output
            _, err = proc.communicate(timeout=60)
        finally:
            proc.kill()
            proc.communicate()
        assert err == b"", err.decode()[-3000:]
        assert proc.returncode == 0
        assert got.decode().rstrip().endswith("transcript valid (validate_transcript(engine.messages) == [])")
        assert during and _nonblocking(in_read)
    finally:
        for fd in (in_read, in_write, out_read):
            os.close(fd)
