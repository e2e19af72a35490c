"""`run_process`: a subprocess that dies with its whole process group on abort.

The child is started in a new session (so a new process group), which makes
``killpg`` reach every grandchild it forks. On abort or timeout the group gets
SIGTERM, then SIGKILL after ``kill_grace`` seconds; a cancelled call (the engine's
``tool_cancel_grace`` ran out) SIGKILLs it at once. Output is collected with a
size cap so a chatty child cannot exhaust memory.
"""

from __future__ import annotations

import asyncio
import codecs
import numbers
import os
import signal as _signal
import subprocess
import time
from collections.abc import Callable
from dataclasses import dataclass, field, fields
from pathlib import Path
from typing import Any

from ._abort import AbortSignal
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
#: The process group of each call in progress, and the event loop it runs in. A loop stopped and
#: closed under a call never runs the call's cleanup: `kill_left_in` kills the groups it left.
_live: dict[int, asyncio.AbstractEventLoop] = {}


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


#: Words in an option, variable or header name that mark its value as a credential
#: (``--token``, ``--password=``, ``GITHUB_TOKEN=``, ``Authorization:``, ``--api-key``...).
_CREDENTIAL_WORDS = ("token", "secret", "pass", "auth", "key", "cookie", "credential")
_REDACTED = "[REDACTED]"


def _is_credential(name: str) -> bool:
    lowered = name.lower()
    return any(word in lowered for word in _CREDENTIAL_WORDS)


def shown_args(args: tuple[str, ...]) -> list[str]:
    """``args`` with the credentials a command line carries replaced by ``[REDACTED]``: the
    value of a credential-named option (``--token X``, ``--token=X``), variable (``TOKEN=X``)
    or header (``Authorization: Bearer X``), and a URL's user info and credential query
    parameters. The rest is shown as it is, so the model still sees what ran."""
    shown: list[str] = []
    hide_next = False
    for arg in args:
        if hide_next:
            shown.append(_REDACTED)
            hide_next = False
            continue
        if arg.startswith("-") and "=" not in arg and _is_credential(arg.lstrip("-")):
            hide_next = True  # ``--token X``: X is the credential
            shown.append(arg)
            continue
        shown.append(_shown_arg(arg))
    return shown


def _shown_arg(arg: str) -> str:
    """One argument with the credential it holds, if any, redacted."""
    name, eq, value = arg.partition("=")
    if eq and value and "://" not in name and " " not in name and _is_credential(name):
        return f"{name}={_REDACTED}"
    header, colon, value = arg.partition(":")
    if colon and value.startswith(" ") and " " not in header and _is_credential(header):
        return f"{header}: {_REDACTED}"
    if "://" in arg:
        return _shown_url(arg)
    return arg


def _shown_url(url: str) -> str:
    """``url`` with its user info and the values of its credential query parameters redacted."""
    scheme, sep, rest = url.partition("://")
    end = min((i for i in (rest.find("/"), rest.find("?")) if i >= 0), default=len(rest))
    authority, tail = rest[:end], rest[end:]
    if "@" in authority:
        authority = f"{_REDACTED}@{authority.rpartition('@')[2]}"
    path, question, query = tail.partition("?")
    if question:
        pairs = [pair.partition("=") for pair in query.split("&")]
        query = "&".join(f"{k}={_REDACTED}" if eq and v and _is_credential(k) else k + eq + v for k, eq, v in pairs)
    return f"{scheme}{sep}{authority}{path}{question}{query}"


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
    (``cwd``, ``env``...) go to `asyncio.loop.subprocess_exec`.
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
    transport, proto = await loop.subprocess_exec(
        lambda: _Collector(loop, merged=merged, on_line=on_line),
        *args,
        stdin=subprocess.PIPE if stdin is not None else subprocess.DEVNULL,
        stdout=subprocess.PIPE,
        stderr=stderr,
        start_new_session=True,
        **kw,
    )
    pgid = transport.get_pid()
    _live[pgid] = loop
    timed_out = aborted = cancelled = False
    try:
        if stdin is not None:
            _feed(transport, stdin)
        timed_out, aborted = await _wait(transport, proto, signal, timeout, kill_grace)
    except asyncio.CancelledError:
        cancelled = True
        raise
    except GeneratorExit:  # closed unfinished, its loop closed under it: nothing can be awaited now
        _kill_now([pgid])
        raise
    finally:
        if pgid in _live:
            await _end(transport, proto, pgid, kill_grace, cancelled=cancelled)
    if aborted:
        raise AbortError(signal.reason or "cancel")
    if proto.lines is not None and proto.lines.error is not None:
        raise proto.lines.error
    return _result(args, transport, proto, timed_out)


async def _end(transport: asyncio.SubprocessTransport, proto: _Collector, pgid: int, kill_grace: float, *, cancelled: bool) -> None:
    """The end of every call: kill the group if it is alive, and close the pipes."""
    try:
        # Runs on cancellation too: the group never outlives this call. A cancellation
        # (a caller's grace ran out, a tool's timeout) kills it at once, without a TERM
        # grace of its own, also when the child has exited but its output has not ended
        # (a background grandchild of the group holds the pipes).
        if transport.get_returncode() is None or (cancelled and not proto.done.done()):
            await asyncio.shield(_kill_group(pgid, proto, 0 if cancelled else kill_grace))
    finally:
        _live.pop(pgid, None)
        await _close(transport, proto)


def _check_streams(stderr: int, kw: dict[str, Any]) -> None:
    """Raise ValueError for a ``stderr`` that is neither PIPE nor STDOUT, TypeError for ``stdout``."""
    if stderr not in (subprocess.PIPE, subprocess.STDOUT):
        raise ValueError("run_process takes stderr=subprocess.PIPE (kept apart, the default) or subprocess.STDOUT (merged)")
    if "stdout" in kw:
        raise TypeError("run_process collects stdout itself; it does not take stdout=")


def _check_args(timeout: object, kill_grace: object, stdin: object) -> None:
    """Raise TypeError or ValueError for a ``timeout`` or ``kill_grace`` that is not a number of
    seconds >= 0 (``timeout`` may be None), TypeError for a ``stdin`` that is not bytes."""
    for name, value in (("timeout", timeout), ("kill_grace", kill_grace)):
        if value is None and name == "timeout":
            continue
        if isinstance(value, bool) or not isinstance(value, numbers.Real):
            none = " or None" if name == "timeout" else ""
            raise TypeError(f"run_process: {name} takes a number of seconds{none}, not {value!r}")
        if not float(value) >= 0:  # NaN too
            raise ValueError(f"run_process: {name} must be >= 0, not {value!r}")
    if stdin is not None and not isinstance(stdin, (bytes, bytearray, memoryview)):
        raise TypeError(
            f"run_process: stdin takes bytes to feed the child, not {type(stdin).__name__} (for text: text.encode())"
        )


async def _wait(
    transport: asyncio.SubprocessTransport, proto: _Collector, signal: AbortSignal, timeout: float | None, kill_grace: float
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
    await _kill_group(transport.get_pid(), proto, kill_grace)
    if not aborted:  # timed out: what the group wrote before it died is part of the result
        await asyncio.wait((proto.done,), timeout=_DRAIN)
    return not aborted, aborted


def _result(args: tuple[Arg, ...], transport: asyncio.SubprocessTransport, proto: _Collector, timed_out: bool) -> ProcessResult:
    """The `ProcessResult` of a process that has exited, from what ``proto`` collected."""
    returncode = transport.get_returncode()
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


class _Collector(asyncio.SubprocessProtocol):
    """Keeps up to `_CAP` bytes of stdout and stderr; ``done`` when the child has
    exited and both have ended, ``closed`` when the transport is finished."""

    def __init__(
        self, loop: asyncio.AbstractEventLoop, *, merged: bool = False, on_line: Callable[[str], None] | None = None
    ) -> None:
        self.output = {1: bytearray(), 2: bytearray()}
        self.lines = None if on_line is None else _Lines(on_line)
        self.truncated: set[int] = set()  # the streams cut at the cap
        self.open = {0, 1} if merged else {0, 1, 2}  # the pipes not yet lost (stderr has none when merged)
        self.exited: asyncio.Future[None] = loop.create_future()
        self.done: asyncio.Future[None] = loop.create_future()
        self.closed: asyncio.Future[None] = loop.create_future()

    def pipe_data_received(self, fd: int, data: bytes) -> None:
        if fd == 1 and self.lines is not None:
            self.lines.feed(data)
        buf = self.output[fd]
        room = _CAP - len(buf)
        if len(data) > room:
            self.truncated.add(fd)
            data = data[: max(room, 0)]
        buf += data

    def pipe_connection_lost(self, fd: int, exc: Exception | None) -> None:
        if fd == 1 and self.lines is not None:
            self.lines.feed(b"", final=True)
        self.open.discard(fd)
        self._check_done()

    def process_exited(self) -> None:
        _resolve(self.exited)
        self._check_done()

    def connection_lost(self, exc: Exception | None) -> None:
        _resolve(self.closed)

    def _check_done(self) -> None:
        if 1 not in self.open and 2 not in self.open and self.exited.done():
            _resolve(self.done)


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


def _feed(transport: asyncio.SubprocessTransport, data: bytes) -> None:
    """Hand ``data`` to the child's stdin and close it once written (a child that
    stops reading or exits early only loses the rest)."""
    pipe = transport.get_pipe_transport(0)
    if isinstance(pipe, asyncio.WriteTransport):
        pipe.write(data)
        pipe.close()


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


async def _close(transport: asyncio.SubprocessTransport, proto: _Collector) -> None:
    """Close our ends of the pipes now (no flush: a stalled reader cannot hold this
    up) and wait until the transport has let go of them."""
    for fd in tuple(proto.open):  # a lost pipe is closed already (and must not be aborted)
        pipe = transport.get_pipe_transport(fd)
        if isinstance(pipe, asyncio.WriteTransport):
            pipe.abort()
        elif pipe is not None:
            pipe.close()
    transport.close()
    if transport.get_returncode() is not None:  # else the transport only finishes once the child is reaped
        await asyncio.shield(proto.closed)


def kill_left_in(loop: asyncio.AbstractEventLoop) -> None:
    """SIGKILL the process group of each call left in ``loop``, closed under it: its cleanup
    can never run now, and the group, in a session of its own, would outlive the host."""
    _kill_now([pgid for pgid, owner in list(_live.items()) if owner is loop])


def _kill_now(pgids: list[int]) -> None:
    """SIGKILL the groups ``pgids`` of calls whose loop is gone, and wait (up to `_GONE` s, this
    thread blocked) until they are dead."""
    killed = [pgid for pgid in pgids if _live.pop(pgid, None) is not None]
    for pgid in killed:
        signal_group(pgid, _signal.SIGKILL)
    deadline = time.monotonic() + _GONE
    while any(group_alive(pgid) for pgid in killed) and time.monotonic() < deadline:
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
