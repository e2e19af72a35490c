"""`run_process`: a subprocess that dies with its whole process group on abort.

The child is started in a new session (so a new process group), which makes
``killpg`` reach every grandchild it forks. On abort or timeout the group gets
SIGTERM, then SIGKILL after ``kill_grace`` seconds; a cancelled call (the engine's
``tool_cancel_grace`` ran out) SIGKILLs it at once. Output is collected with a
size cap so a chatty child cannot exhaust memory. A loop closed under a call, or the
interpreter exiting, kills the group too (`track`).
"""

from __future__ import annotations

import asyncio
import atexit
import codecs
import os
import signal as _signal
import subprocess
import time
import weakref
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field, fields
from pathlib import Path
from typing import Any, Protocol

from ._abort import AbortSignal
from ._checks import non_negative
from ._cmdline import shown_args
from ._errors import AbortError

__all__ = ["ProcessResult", "run_process"]

_CAP = 1 << 20  # bytes kept per stream
#: A command-line argument, as `subprocess` takes it.
Arg = str | bytes | os.PathLike[str] | os.PathLike[bytes]
# Seconds to read what is left in the pipes once a timed-out group is dead: a process
# that left the group (setsid) may hold them open forever.
_DRAIN = 0.25
# Seconds a killed group has to be gone (its processes dead, if not yet reaped by their parent).
_GONE = 1.0
#: The process group of each call in progress (and stdio MCP server), the event loop it runs in and
#: its child (process and pipes). A loop stopped and closed under a call never runs the call's
#: cleanup: the guard `track` sets kills the group as the loop closes (`kill_left_in` when the engine
#: finds its run left there, `_kill_at_exit` at the interpreter's exit), and closes and reaps it.
_live: dict[int, tuple[asyncio.AbstractEventLoop, _Child]] = {}
# Seconds until a timer that never fires: each child has one in its loop, dropped as the loop closes.
_NEVER = 1e7


@dataclass(frozen=True, slots=True)
class ProcessResult:
    """``args`` is the command as run, as text (a path or bytes given decoded as the OS does);
    ``returncode`` is negative when killed by a signal; ``timed_out`` when the
    timeout killed it. ``stdout``/``stderr`` are decoded (UTF-8, replace) and
    capped at 1 MiB each: ``stdout_truncated``/``stderr_truncated`` say which was
    cut (``truncated``: either), and a cut stream's text ends on a whole character;
    ``stdout_bytes``/``stderr_bytes`` are the same output exactly as the child
    wrote it (binary output, another encoding), up to the cap."""

    args: tuple[str, ...]
    returncode: int
    stdout: str
    stderr: str
    timed_out: bool = False
    truncated: bool = False
    stdout_bytes: bytes = field(default=b"", repr=False)
    stderr_bytes: bytes = field(default=b"", repr=False)
    stdout_truncated: bool = False
    stderr_truncated: bool = False

    @property
    def ok(self) -> bool:
        """True when the child exited with ``returncode`` 0 and was not killed by the timeout."""
        return self.returncode == 0 and not self.timed_out

    def as_json(self) -> dict[str, Any]:
        """The result as JSON data, without ``stdout_bytes``/``stderr_bytes``: what a tool
        that returns it gives the model. The raw bytes would repeat the output (twice the
        size in the transcript), and bytes that are not UTF-8 cannot be JSON at all.
        ``args`` comes with the credentials on the command line redacted (`shown_args`)."""
        data = {f.name: getattr(self, f.name) for f in fields(self) if not f.name.endswith("_bytes")}
        data["args"] = shown_args(self.args)
        return data

    def __repr__(self) -> str:
        shown = (f"{f.name}={getattr(self, f.name)!r}" for f in fields(self) if f.repr and f.name != "args")
        return f"{type(self).__name__}(args={tuple(shown_args(self.args))!r}, {', '.join(shown)})"


async def run_process(
    *args: Arg,
    signal: AbortSignal,
    timeout: float | None = None,
    kill_grace: float = 2.0,
    stdin: bytes | None = None,
    stderr: int = subprocess.PIPE,
    on_line: Callable[[str], None] | None = None,
    **kw: Any,
) -> ProcessResult:
    """Run ``args`` and wait for it to exit and its output to end; extra keywords
    (``kw``: ``cwd``, ``env``...) go to `subprocess.Popen` (not ``shell`` or a text mode: ValueError).
    ``stderr=subprocess.STDOUT`` merges the child's stderr into ``stdout``, in the
    order it was written (``stderr`` is then empty).

    Raises `AbortError` (after the process group is dead) if ``signal`` aborts
    first. A timeout is not an error: the result has ``timed_out=True``. Both
    hold while a process that left the group (``setsid``) keeps the pipes open:
    the call stops reading and returns, leaving that process alone. Raises
    ValueError for another ``stderr`` and TypeError for ``stdout``: the output
    is collected here. Before the child starts, raises TypeError for a ``timeout``
    or ``kill_grace`` that is not a number of seconds (ValueError when it is
    below 0, or NaN) and for a ``stdin`` that is not bytes.

    ``on_line`` is called with each line of stdout (stderr too when merged) as the child
    writes it, without its line break, on the event loop: what a tool shows as progress
    (`ToolProgress`). The last line comes when the output ends, with or without a line break.
    An exception it raises stops the calls and is raised once the child has ended.
    """
    _check_streams(stderr, kw)
    _check_args(timeout, kill_grace, stdin)
    if on_line is not None and not callable(on_line):
        raise TypeError(f"run_process: on_line takes a function of one line (str), not {on_line!r}")
    merged = stderr == subprocess.STDOUT
    signal.throw_if_aborted()
    loop = asyncio.get_running_loop()
    proto = _Collector(loop, merged=merged, on_line=on_line)
    child = _Child(loop, _spawn(args, stdin is not None, stderr, kw))
    pgid = child.pid
    track(child)
    timed_out = aborted = cancelled = False
    try:
        child.start(stdin, proto)
        timed_out, aborted = await _wait(child, proto, signal, timeout, kill_grace)
    except asyncio.CancelledError:
        cancelled = True
        raise
    except GeneratorExit:  # closed unfinished, its loop closed under it: nothing can be awaited now
        _kill_now([pgid])
        raise
    finally:
        if pgid in _live:
            await _end(child, proto, pgid, kill_grace, cancelled=cancelled)
    if aborted:
        raise AbortError(signal.reason or "cancel")
    if proto.lines is not None and proto.lines.error is not None:
        raise proto.lines.error
    return _result(args, child, proto, timed_out)


def _spawn(args: tuple[Arg, ...], feed: bool, stderr: int, kw: dict[str, Any]) -> subprocess.Popen[bytes]:
    """Start the child in a session of its own, its output (and input, to ``feed`` it) on pipes.

    The pipes and the process are the call's own, not an asyncio transport's: closing the call
    closes them at once, also when the host's loop is closed (or its tasks cancelled) under it."""
    if not args:
        raise TypeError("run_process takes the command to run: run_process('ls', '-l', signal=...)")
    for name in ("shell", "text", "universal_newlines", "encoding", "errors"):
        if kw.get(name):
            raise ValueError(f"run_process does not take {name}=: it runs a command and collects its output as bytes")
    return subprocess.Popen(
        [os.fspath(a) for a in args],
        stdin=subprocess.PIPE if feed else subprocess.DEVNULL,
        stdout=subprocess.PIPE,
        stderr=stderr,
        start_new_session=True,
        **kw,
    )


async def _end(child: _Child, proto: _Collector, pgid: int, kill_grace: float, *, cancelled: bool) -> None:
    """The end of every call: kill the group if it is alive, and close the pipes."""
    try:
        # Runs on cancellation too: the group never outlives this call. A cancellation
        # (a caller's grace ran out, a tool's timeout) kills it at once, without a TERM
        # grace of its own, also when the child has exited but its output has not ended
        # (a background grandchild of the group holds the pipes).
        # A cancellation meanwhile is raised once the group is gone; it ends a TERM grace at once.
        if child.returncode is None or (cancelled and not proto.done.done()):
            kill = _kill_group(pgid, proto, 0 if cancelled else kill_grace)
            await uncancellable(kill, on_cancel=lambda: signal_group(pgid, _signal.SIGKILL))
    finally:
        untrack(child)
        child.close()


async def uncancellable(work: Awaitable[None], on_cancel: Callable[[], object] | None = None) -> None:
    """Run ``work`` to its end even when the caller is cancelled meanwhile (``on_cancel`` is
    called at each cancellation), then raise that cancellation: what stops a process must not
    be left running behind the caller. Should ``work`` then fail, its error is that cancellation's
    cause, not raised in its place: the caller's cancel is never turned into something else."""
    task = asyncio.ensure_future(work)
    cancelled: asyncio.CancelledError | None = None
    while not task.done():
        try:
            await asyncio.shield(task)
        except asyncio.CancelledError as exc:
            if task.done():
                raise
            cancelled = exc
            if on_cancel is not None:
                on_cancel()
        except Exception as exc:  # a KeyboardInterrupt or SystemExit is the person's: never replaced
            if cancelled is None:
                raise
            raise cancelled from exc  # the caller's cancel, which the failure came after
    if cancelled is not None:
        raise cancelled
    task.result()


def _check_streams(stderr: int, kw: dict[str, Any]) -> None:
    """Raise ValueError for a ``stderr`` that is neither PIPE nor STDOUT, TypeError for ``stdout``."""
    if stderr not in (subprocess.PIPE, subprocess.STDOUT):
        raise ValueError("run_process takes stderr=subprocess.PIPE (kept apart, the default) or subprocess.STDOUT (merged)")
    if "stdout" in kw:
        raise TypeError("run_process collects stdout itself; it does not take stdout=")


def _check_args(timeout: object, kill_grace: object, stdin: object) -> None:
    """Raise TypeError or ValueError for a ``timeout`` or ``kill_grace`` that is not a number of
    seconds >= 0 (``timeout`` may be None), TypeError for a ``stdin`` that is not bytes."""
    non_negative("run_process: timeout", timeout, optional=True)
    non_negative("run_process: kill_grace", kill_grace)
    if stdin is not None and not isinstance(stdin, (bytes, bytearray, memoryview)):
        raise TypeError(
            f"run_process: stdin takes bytes to feed the child, not {type(stdin).__name__} (for text: text.encode())"
        )


async def _wait(
    child: _Child, proto: _Collector, signal: AbortSignal, timeout: float | None, kill_grace: float
) -> tuple[bool, bool]:
    """Wait for the process to exit and its output to end, for ``signal`` or for ``timeout``;
    on either of the last two the group is killed. Returns (timed out, aborted)."""
    abort_task = asyncio.ensure_future(signal.wait())
    closing = False
    try:
        done, _ = await asyncio.wait((proto.done, abort_task), timeout=timeout, return_when=asyncio.FIRST_COMPLETED)
    except GeneratorExit:  # closed with its loop, closed under it: nothing can be scheduled now
        closing = True
        raise
    finally:
        if not closing:
            abort_task.cancel()
            await asyncio.gather(abort_task, return_exceptions=True)
    if proto.done in done:
        return False, False
    aborted = abort_task in done
    await _kill_group(child.pid, proto, kill_grace)
    if not aborted:  # timed out: what the group wrote before it died is part of the result
        await asyncio.wait((proto.done,), timeout=_DRAIN)
    return not aborted, aborted


def _result(args: tuple[Arg, ...], child: _Child, proto: _Collector, timed_out: bool) -> ProcessResult:
    """The `ProcessResult` of a process that has exited, from what ``proto`` collected."""
    returncode = child.returncode
    assert returncode is not None
    out, err = bytes(proto.output[1]), bytes(proto.output[2])
    cut = proto.truncated
    return ProcessResult(
        args=tuple(os.fsdecode(a) for a in args),  # a Path or bytes as text, which JSON can hold
        returncode=returncode,
        stdout=_decode(out, cut=1 in cut),
        stderr=_decode(err, cut=2 in cut),
        timed_out=timed_out,
        truncated=bool(cut),
        stdout_bytes=out,
        stderr_bytes=err,
        stdout_truncated=1 in cut,
        stderr_truncated=2 in cut,
    )


def _decode(data: bytes, *, cut: bool) -> str:
    """``data`` as text (UTF-8, an invalid byte becoming U+FFFD). Output cut at the cap may
    end inside a character: that partial character is left out, not shown as U+FFFD."""
    if not cut:
        return data.decode("utf-8", "replace")
    return codecs.getincrementaldecoder("utf-8")("replace").decode(data, final=False)


class Sink(Protocol):
    """What `_Child` tells of the child's output pipes and its exit (`_Collector`; an MCP
    server's pipes)."""

    def pipe_data_received(self, fd: int, data: bytes) -> None: ...
    def pipe_connection_lost(self, fd: int) -> None: ...
    def process_exited(self) -> None: ...


class _Collector:
    """Keeps up to `_CAP` bytes of stdout and stderr; ``done`` when the child has
    exited and both have ended."""

    def __init__(
        self, loop: asyncio.AbstractEventLoop, *, merged: bool = False, on_line: Callable[[str], None] | None = None
    ) -> None:
        self.output = {1: bytearray(), 2: bytearray()}
        self.lines = None if on_line is None else _Lines(on_line)
        self.truncated: set[int] = set()  # the streams cut at the cap
        self.open = {1} if merged else {1, 2}  # the output pipes not yet ended (stderr has none when merged)
        self.exited: asyncio.Future[None] = loop.create_future()
        self.done: asyncio.Future[None] = loop.create_future()

    def pipe_data_received(self, fd: int, data: bytes) -> None:
        if fd == 1 and self.lines is not None:
            self.lines.feed(data)
        buf = self.output[fd]
        room = _CAP - len(buf)
        if len(data) > room:
            self.truncated.add(fd)
            data = data[: max(room, 0)]
        buf += data

    def pipe_connection_lost(self, fd: int) -> None:
        if fd == 1 and self.lines is not None:
            self.lines.feed(b"", final=True)
        self.open.discard(fd)
        self._check_done()

    def process_exited(self) -> None:
        _resolve(self.exited)
        self._check_done()

    def _check_done(self) -> None:
        if not self.open and self.exited.done():
            _resolve(self.done)


class _Child:
    """The child and our ends of its pipes, read and written with the loop's reader and writer
    callbacks; its exit is seen on a pidfd (where the OS has them) or by polling. `close` lets go
    of everything at once, without the loop: a closed loop runs no callback to do it later.
    The collector is only in the callbacks: `_live` holds this, and must not keep alive (through
    the collector's futures) a call collected with the loop it was left in."""

    def __init__(self, loop: asyncio.AbstractEventLoop, popen: subprocess.Popen[bytes]) -> None:
        self.loop, self.popen = loop, popen
        self.pid = popen.pid
        self.files = {fd: f for fd, f in ((0, popen.stdin), (1, popen.stdout), (2, popen.stderr)) if f is not None}
        self.pidfd: int | None = None
        self.poller: asyncio.Task[None] | None = None
        self.closed = False
        self.guard: weakref.finalize[[list[int]], asyncio.TimerHandle] | None = None  # see `track`

    @property
    def returncode(self) -> int | None:
        return self.popen.returncode

    def start(self, stdin: bytes | None, proto: Sink) -> None:
        """Read the output into ``proto``, feed ``stdin`` (closing the child's input once written),
        watch for the exit."""
        for fd in (1, 2):
            if fd in self.files:
                os.set_blocking(self.files[fd].fileno(), False)
                self.loop.add_reader(self.files[fd].fileno(), self._read, fd, proto)
        if stdin is not None:
            os.set_blocking(self.files[0].fileno(), False)
            self._write(memoryview(bytes(stdin)))
        try:
            self.pidfd = os.pidfd_open(self.pid)
        except (AttributeError, OSError):  # no pidfds here: poll
            self.poller = self.loop.create_task(self._poll(weakref.ref(proto)))
        else:
            self.loop.add_reader(self.pidfd, self._reap, proto)

    def _read(self, fd: int, proto: Sink) -> None:
        try:
            data = os.read(self.files[fd].fileno(), 1 << 16)
        except BlockingIOError:
            return
        except OSError:
            data = b""
        if data:
            proto.pipe_data_received(fd, data)
            return
        self._drop(fd)
        proto.pipe_connection_lost(fd)

    def _write(self, data: memoryview) -> None:
        """Write what the pipe takes of ``data`` now, the rest when it has room; a child that
        stops reading or exits early only loses the rest."""
        fileno = self.files[0].fileno()
        self.loop.remove_writer(fileno)
        try:
            data = data[os.write(fileno, data) :] if data else data
        except BlockingIOError:
            pass
        except OSError:  # the child closed its input, or exited
            data = data[:0]
        if data:
            self.loop.add_writer(fileno, self._write, data)
        else:
            self._drop(0)

    def _drop(self, fd: int) -> None:
        """Stop watching pipe ``fd`` and close our end of it."""
        file = self.files.pop(fd, None)
        if file is not None:
            if not self.loop.is_closed():
                (self.loop.remove_writer if fd == 0 else self.loop.remove_reader)(file.fileno())
            file.close()

    def _reap(self, proto: Sink) -> None:
        """The child has exited (its pidfd is readable): reap it."""
        if self.popen.poll() is not None:
            self._unwatch()
            proto.process_exited()

    async def _poll(self, proto: weakref.ref[Sink]) -> None:
        """Wait for the exit, polling (``proto`` weakly held: see the class)."""
        pause = 0.001
        while self.popen.poll() is None:
            await asyncio.sleep(pause)
            pause = min(pause * 2, 0.05)
        if (collector := proto()) is not None:
            collector.process_exited()

    def _unwatch(self) -> None:
        if self.pidfd is not None:
            if not self.loop.is_closed():
                self.loop.remove_reader(self.pidfd)
            os.close(self.pidfd)
            self.pidfd = None
        if self.poller is not None:
            if not self.loop.is_closed():  # a closed loop cannot run the cancellation (nor the task)
                self.poller.cancel()
            self.poller = None

    def close(self) -> None:
        """Close our ends of the pipes (no flush: a stalled reader cannot hold this up), stop
        watching the child, and reap it: SIGKILLed with its group if it still runs."""
        if self.closed:
            return
        self.closed = True
        for fd in tuple(self.files):
            self._drop(fd)
        self._unwatch()
        if self.popen.poll() is None:
            signal_group(self.pid, _signal.SIGKILL)
            try:
                self.popen.wait(_GONE)
            except subprocess.TimeoutExpired:  # stuck in the kernel: reaped when it can be
                pass

class _Lines:
    """Splits a stream into lines for ``on_line`` (a line longer than `_CAP` bytes is passed in
    pieces); keeps the first exception it raised, after which no more lines are passed."""

    def __init__(self, on_line: Callable[[str], None]) -> None:
        self.on_line = on_line
        self.error: Exception | None = None
        self._decoder = codecs.getincrementaldecoder("utf-8")("replace")
        self._buf = ""

    def feed(self, data: bytes, *, final: bool = False) -> None:
        if self.error is not None:
            return
        self._buf += self._decoder.decode(data, final=final)
        *lines, self._buf = self._buf.split("\n")
        if (final and self._buf) or len(self._buf) > _CAP:  # the last line, or one too long to wait for
            lines.append(self._buf)
        if final or len(self._buf) > _CAP:
            self._buf = ""
        for line in lines:
            try:
                self.on_line(line.removesuffix("\r"))
            except Exception as exc:  # raised by run_process once the child has ended
                self.error = exc
                return


def _resolve(fut: asyncio.Future[None]) -> None:
    if not fut.done():
        fut.set_result(None)


async def _kill_group(pgid: int, proto: _Collector, grace: float) -> None:
    """SIGTERM the group, wait ``grace`` s for it to exit and let go of the pipes,
    then SIGKILL it; reap the child."""
    if grace > 0:
        signal_group(pgid, _signal.SIGTERM)
        await asyncio.wait((proto.done,), timeout=grace)
    # Grandchildren may ignore TERM even after the leader exited.
    signal_group(pgid, _signal.SIGKILL)
    await proto.exited
    await _until_gone(pgid)


async def _until_gone(pgid: int) -> None:
    """Wait until no process of the group is alive: SIGKILL is sent at once but takes effect a
    moment later, and a grandchild that let go of the pipes would otherwise outlive the call.
    Bounded by `_GONE` (a process stuck in the kernel, in uninterruptible IO, dies when it can)."""
    loop = asyncio.get_running_loop()
    deadline = loop.time() + _GONE
    pause = 0.0005
    while group_alive(pgid):
        if loop.time() >= deadline:
            return
        await asyncio.sleep(pause)
        pause = min(pause * 2, 0.02)


def track(child: _Child) -> None:
    """Record ``child`` (a call's, an MCP server's) in `_live` until `untrack`. A loop closed
    first kills its group and lets go of its pipes, in ``loop.close()`` itself: asyncio's loop
    drops its timers as it closes, the guard timer set here among them (never to fire), and
    a finalizer on that timer does it. Its pid is also what `_kill_at_exit` kills."""
    _live[child.pid] = (child.loop, child)
    _guard(child)


def _guard(child: _Child) -> None:
    """Set ``child``'s guard timer (see `track`)."""
    timer = child.loop.call_later(_NEVER, _rearm, weakref.ref(child))
    try:
        child.guard = weakref.finalize(timer, _kill_now, [child.pid])
    except TypeError:  # a loop whose handles take no weak reference: `kill_left_in` and the exit kill
        timer.cancel()
        return
    child.guard.atexit = False  # `_kill_at_exit` does it, without closing pipes a running loop reads


def _rearm(child: weakref.ref[_Child]) -> None:
    """The guard timer came due (months later, or on a loop whose clock jumps): set a new one,
    letting go of this one without killing anything."""
    if (alive := child()) is not None and alive.guard is not None:
        alive.guard.detach()
        _guard(alive)


def untrack(child: _Child) -> None:
    """``child``'s call (or server) has ended, its own cleanup done or under way: forget it."""
    if (call := _live.get(child.pid)) is not None and call[1] is child:
        del _live[child.pid]
    guard, child.guard = child.guard, None
    timer = None if guard is None else guard.detach()
    if timer is not None and not child.loop.is_closed():
        timer[0].cancel()


def _kill_at_exit() -> None:
    """At the interpreter's exit, SIGKILL the groups of the calls and servers still running (a
    loop left running in a daemon thread, a loop never closed): in sessions of their own, they
    would outlive the host. Their pipes and processes are left to the OS: a loop may still be
    reading them in another thread."""
    _kill_groups([pgid for pgid, (_, child) in list(_live.items()) if not child.closed])


atexit.register(_kill_at_exit)


def kill_left_in(loop: asyncio.AbstractEventLoop) -> None:
    """SIGKILL the process group of each call left in ``loop``, closed under it: its cleanup
    can never run now, and the group, in a session of its own, would outlive the host."""
    _kill_now([pgid for pgid, (owner, _) in list(_live.items()) if owner is loop])


def _kill_now(pgids: list[int]) -> None:
    """SIGKILL the groups ``pgids`` of calls whose loop is gone, wait (up to `_GONE` s, this
    thread blocked) until they are dead, and close the calls' pipes and reap their children."""
    children = [call[1] for pgid in pgids if (call := _live.get(pgid)) is not None]
    for child in children:
        untrack(child)
    _kill_groups([child.pid for child in children])
    for child in children:  # its pipes and its process: nothing left for the garbage collector
        child.close()


def _kill_groups(pgids: list[int]) -> None:
    """SIGKILL the groups ``pgids`` and wait (up to `_GONE` s, this thread blocked) until they are dead."""
    for pgid in pgids:
        signal_group(pgid, _signal.SIGKILL)
    deadline = time.monotonic() + _GONE
    while any(group_alive(pgid) for pgid in pgids) and time.monotonic() < deadline:
        time.sleep(0.001)


def signal_group(pgid: int, sig: int) -> bool:
    """Send ``sig`` to the process group; False when it has no process left to take it (or
    none of ours: a process that changed its user is not ours to stop)."""
    try:
        os.killpg(pgid, sig)
    except (ProcessLookupError, PermissionError):
        return False
    return True


def group_alive(pgid: int) -> bool:
    """Whether a process of the group is alive. A dead one stays in the group until its new
    parent reaps it, which takes a while in some containers: /proc tells them apart, when there."""
    if not signal_group(pgid, 0):
        return False
    proc = Path("/proc")
    if not (proc / "self" / "stat").exists():
        return True  # no /proc: the group's word holds
    group = str(pgid).encode()
    for path in proc.glob("[0-9]*/stat"):
        try:
            # After "pid (command)": state, ppid, pgrp. Bytes: a command name (any process's on the
            # machine) is cut to 15 bytes, in the middle of a character as often as not.
            fields = path.read_bytes().rpartition(b")")[2].split()
        except OSError:  # it went meanwhile
            continue
        if len(fields) > 2 and fields[2] == group and fields[0] not in (b"Z", b"X"):
            return True
    return False
