"""`run_process`: a subprocess that dies with its whole process group on abort.

The child is started in a new session (so a new process group), which makes
``killpg`` reach every grandchild it forks. On abort or timeout the group gets
SIGTERM, then SIGKILL after ``kill_grace`` seconds. Output is collected with a
size cap so a chatty child cannot exhaust memory.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import signal as _signal
from dataclasses import dataclass
from typing import Any

from ._abort import AbortSignal
from ._errors import AbortError

__all__ = ["ProcessResult", "run_process"]

_CAP = 1 << 20  # bytes kept per stream


@dataclass(frozen=True, slots=True)
class ProcessResult:
    """``returncode`` is negative when killed by a signal; ``timed_out`` when the
    timeout killed it. ``stdout``/``stderr`` are decoded (UTF-8, replace) and
    capped at 1 MiB each (``truncated`` says so)."""

    args: tuple[str, ...]
    returncode: int
    stdout: str
    stderr: str
    timed_out: bool = False
    truncated: bool = False

    @property
    def ok(self) -> bool:
        return self.returncode == 0 and not self.timed_out


async def run_process(
    *args: str,
    signal: AbortSignal,
    timeout: float | None = None,
    kill_grace: float = 2.0,
    stdin: bytes | None = None,
    **kw: Any,
) -> ProcessResult:
    """Run ``args`` and wait for it; extra keywords go to `asyncio.create_subprocess_exec`.

    Raises `AbortError` (after the process group is dead) if ``signal`` aborts
    first. A timeout is not an error: the result has ``timed_out=True``.
    """
    signal.throw_if_aborted()
    proc = await asyncio.create_subprocess_exec(
        *args,
        stdin=asyncio.subprocess.PIPE if stdin is not None else asyncio.subprocess.DEVNULL,
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.PIPE,
        start_new_session=True,
        **kw,
    )
    assert proc.stdout is not None and proc.stderr is not None
    out_task = asyncio.ensure_future(_read_capped(proc.stdout))
    err_task = asyncio.ensure_future(_read_capped(proc.stderr))
    abort_task = asyncio.ensure_future(signal.wait())
    wait_task = asyncio.ensure_future(_communicate(proc, stdin))
    timed_out = aborted = False
    try:
        done, _ = await asyncio.wait({wait_task, abort_task}, timeout=timeout, return_when=asyncio.FIRST_COMPLETED)
        if wait_task not in done:
            aborted = abort_task in done
            timed_out = not aborted
            await _kill_group(proc, kill_grace)
    finally:
        # Runs on cancellation too: the group never outlives this call.
        if proc.returncode is None:
            await asyncio.shield(_kill_group(proc, kill_grace))
        abort_task.cancel()
        wait_task.cancel()
        await asyncio.gather(wait_task, abort_task, return_exceptions=True)
    out, out_cut = await out_task
    err, err_cut = await err_task
    if aborted:
        raise AbortError(signal.reason or "cancel")
    assert proc.returncode is not None
    return ProcessResult(
        args=tuple(args),
        returncode=proc.returncode,
        stdout=out.decode("utf-8", "replace"),
        stderr=err.decode("utf-8", "replace"),
        timed_out=timed_out,
        truncated=out_cut or err_cut,
    )


async def _communicate(proc: asyncio.subprocess.Process, stdin: bytes | None) -> int:
    if stdin is not None and proc.stdin is not None:
        with contextlib.suppress(BrokenPipeError, ConnectionResetError):
            proc.stdin.write(stdin)
            await proc.stdin.drain()
        proc.stdin.close()
    return await proc.wait()


async def _read_capped(stream: asyncio.StreamReader) -> tuple[bytes, bool]:
    chunks: list[bytes] = []
    size = 0
    cut = False
    while chunk := await stream.read(65536):
        if size < _CAP:
            chunks.append(chunk[: _CAP - size])
            cut = cut or size + len(chunk) > _CAP
        else:
            cut = True
        size += len(chunk)
    return b"".join(chunks), cut


async def _kill_group(proc: asyncio.subprocess.Process, grace: float) -> None:
    """SIGTERM the group, wait ``grace`` s, then SIGKILL it; reap the child."""
    _signal_group(proc.pid, _signal.SIGTERM)
    try:
        await asyncio.wait_for(proc.wait(), grace)
    except TimeoutError:
        pass
    # Grandchildren may ignore TERM even after the leader exited.
    _signal_group(proc.pid, _signal.SIGKILL)
    await proc.wait()


def _signal_group(pgid: int, sig: int) -> None:
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(pgid, sig)
