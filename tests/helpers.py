"""Shared test doubles."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Sequence
from typing import Any

from agentloop import AbortSignal, Event, Message, QueryEngine
from agentloop._model import ModelRequest, StreamEvent, StreamText


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
