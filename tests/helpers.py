"""Shared test doubles."""

from __future__ import annotations

import asyncio
import gc
import os
import sys
import threading
import warnings
from collections.abc import AsyncIterator, Sequence
from typing import Any

from agentloop import AbortSignal, Event, Message, QueryEngine
from agentloop._model import ModelRequest, StreamEvent, StreamText

#: The headless host's exit code for each reason a turn ends (the cookbook's batch job).
EXIT = {
    "completed": 0,
    "model_error": 2, "prompt_too_long": 2,
    "max_turns": 3, "usage_limit": 3, "deadline": 3,
    "stationarity_ended": 4, "hook_stopped": 4,
    "aborted_streaming": 130, "aborted_tools": 130,
}


async def collect(engine: QueryEngine, prompt: str | Message | None = None) -> list[Event]:
    return [ev async for ev in engine.run(prompt)]


def kinds(events: Sequence[Event]) -> list[str]:
    return [type(e).__name__ for e in events]


class HangingModel:
    """Streams ``prefix`` text deltas, then waits forever (until cancelled).

    ``closed`` becomes True when the stream is closed, however that happens.
    """

    def __init__(self, prefix: Sequence[str] = ("Hello ", "wor")) -> None:
        self.prefix = list(prefix)
        self.closed = False
        self.waiting = asyncio.Event()
        self.requests: list[ModelRequest] = []

    async def stream(self, request: ModelRequest, signal: AbortSignal) -> AsyncIterator[StreamEvent]:
        self.requests.append(request)
        try:
            for text in self.prefix:
                yield StreamText(0, text)
            self.waiting.set()
            await asyncio.Event().wait()  # ignores the signal: only cancellation stops it
        finally:
            self.closed = True


def pid_alive(pid: int) -> bool:
    """The process exists and is not a zombie (Linux ``/proc``)."""
    from pathlib import Path

    try:
        state = Path(f"/proc/{pid}/stat").read_bytes().rsplit(b")", 1)[1].split()[0]  # a name is bytes
    except (FileNotFoundError, ProcessLookupError):  # gone, or reaped meanwhile
        return False
    return state != b"Z"


def child_pids_alive() -> set[int]:
    """Live (non-zombie) child processes of this process."""
    from pathlib import Path

    pids: set[int] = set()
    for task in Path("/proc/self/task").iterdir():
        try:
            children = (task / "children").read_text().split()
        except FileNotFoundError:  # the thread ended after it was listed
            continue
        pids.update(int(pid) for pid in children if pid_alive(int(pid)))
    return pids


class VirtualClock:
    """Virtual time for the running loop: whenever the loop would sleep until its next
    timer, its clock jumps there at once. IO that is ready is still handled first; with
    no timer pending the loop waits for real (a thread, a signal).

    ``with VirtualClock():`` inside a test; ``now`` is the loop's time.
    """

    def __init__(self) -> None:
        self.loop = asyncio.get_running_loop()
        self.now = self.loop.time()

    def __enter__(self) -> VirtualClock:
        loop: Any = self.loop
        self._selector = loop._selector
        loop._selector = _JumpingSelector(self._selector, self)
        loop.time = lambda: self.now
        return self

    def __exit__(self, *exc: object) -> None:
        loop: Any = self.loop
        loop._selector = self._selector
        del loop.time


class _JumpingSelector:
    def __init__(self, inner: Any, clock: VirtualClock) -> None:
        self._inner = inner
        self._clock = clock

    def select(self, timeout: float | None = None) -> Any:
        ready = self._inner.select(0)
        if ready or timeout is None or timeout <= 0:
            return ready if ready or timeout is not None else self._inner.select(None)
        self._clock.now += timeout
        return ready

    def __getattr__(self, name: str) -> Any:
        return getattr(self._inner, name)


async def exited(pid: int, within: float = 10.0) -> None:
    """Wait until process ``pid`` has ended (a zombie counts as ended): its pidfd becomes
    readable then, so the wait is the kernel's, not a polling loop. Any process, not only a child."""
    try:
        fd = os.pidfd_open(pid)
    except ProcessLookupError:  # gone already
        return
    loop = asyncio.get_running_loop()
    done = loop.create_future()
    loop.add_reader(fd, lambda: done.done() or done.set_result(None))
    try:
        async with asyncio.timeout(within):
            await done
    finally:
        loop.remove_reader(fd)
        os.close(fd)


class Fifo:
    """A named pipe at ``path`` that child processes write lines to (``open(path, "w")``), and
    the test awaits (``await fifo.line()``): a blocking read in the loop, no polling. The test
    keeps a write end open too, so the pipe does not end between two writers."""

    def __init__(self, path: Any) -> None:
        self.path = path
        os.mkfifo(path)

    def __str__(self) -> str:
        return str(self.path)

    async def __aenter__(self) -> Fifo:
        read_fd = os.open(self.path, os.O_RDONLY | os.O_NONBLOCK)
        self._write_fd = os.open(self.path, os.O_WRONLY)
        self.reader = asyncio.StreamReader()
        loop = asyncio.get_running_loop()
        self._transport, _ = await loop.connect_read_pipe(
            lambda: asyncio.StreamReaderProtocol(self.reader), os.fdopen(read_fd, "rb", buffering=0)
        )
        return self

    async def __aexit__(self, *exc: object) -> None:
        self._transport.close()
        os.close(self._write_fd)

    async def line(self, within: float = 10.0) -> str:
        """The next line a writer wrote, without its newline."""
        async with asyncio.timeout(within):
            return (await self.reader.readline()).decode().rstrip("\n")


class Watched(list[Any]):
    """A list a test can wait on: each ``append`` wakes the waiters of ``until``, which check
    their condition again (a condition variable, not a polling loop)."""

    def __init__(self) -> None:
        super().__init__()
        self._waiters: list[asyncio.Future[None]] = []

    def append(self, item: Any) -> None:
        super().append(item)
        for waiter in self._waiters:
            if not waiter.done():
                waiter.set_result(None)

    async def until(self, ok: Any, within: float = 10.0) -> None:
        """Return once ``ok(self)`` holds; TimeoutError after ``within`` seconds."""
        async with asyncio.timeout(within):
            while not ok(self):
                waiter = asyncio.get_running_loop().create_future()
                self._waiters.append(waiter)
                try:
                    await waiter
                finally:
                    self._waiters.remove(waiter)


async def logged(logger: str, text: str, seen: str = "", within: float = 10.0) -> None:
    """Return once a record of ``logger`` (or a logger below it) says ``text``, or at once if
    ``seen`` (the log so far, e.g. ``caplog.text``) does. A handler wakes the wait."""
    import logging

    if text in seen:
        return
    loop = asyncio.get_running_loop()
    said = asyncio.Event()

    class Wake(logging.Handler):
        def emit(self, record: logging.LogRecord) -> None:
            if text in record.getMessage():
                loop.call_soon_threadsafe(said.set)

    handler = Wake()
    logging.getLogger(logger).addHandler(handler)
    try:
        async with asyncio.timeout(within):
            await said.wait()
    finally:
        logging.getLogger(logger).removeHandler(handler)


def collect_garbage(wait: float = 10.0) -> list[str]:
    """Collect the garbage now, warnings as errors; what complained as it was collected (an
    unclosed pipe, file or transport that only the collector would have closed)."""
    for thread in threading.enumerate():  # asyncio's child watchers: they hold a process until it is reaped
        if thread.name.startswith("waitpid-"):
            thread.join(wait)
    complaints: list[str] = []
    hook = sys.unraisablehook
    sys.unraisablehook = lambda u: complaints.append(f"{u.exc_type.__name__}: {u.exc_value}")
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("error")
            gc.collect()
    finally:
        sys.unraisablehook = hook
    return complaints


def stubborn_prompt(asked: asyncio.Event, release: asyncio.Event, ended: asyncio.Event) -> Any:
    """A permission callback that ignores its cancellation (a UI toolkit's prompt that cannot be
    cancelled): it sets ``asked``, swallows the first cancel, then waits for ``release`` (a
    future only it holds) and sets ``ended`` on its way out, allowing the call."""
    from agentloop import Allow

    async def permission(use: object, ctx: object) -> Allow:
        asked.set()
        try:
            await asyncio.Event().wait()
        except asyncio.CancelledError:
            pass  # swallowed
        try:
            await release.wait()
        finally:
            ended.set()
        return Allow()

    return permission
