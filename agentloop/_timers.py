"""The timers of `AbortSignal.timeout`: run by the event loop they were made in, or by one shared
thread (made outside a loop, or dropped unrun by a loop that closed).

Invariants:
- a timer fires at most once, and never once cancelled (its ``done`` flag; a race between the
  two calls the link twice at worst, and a signal aborts once);
- the thread runs only while a timer is pending on it, and one at a time (``_running``, set
  under ``_guard`` before a thread is started, cleared under it only with an empty queue);
- a timer holds its link, never the signal: the link decides whether the signal is kept.
"""

from __future__ import annotations

import asyncio
import heapq
import itertools
import os
import queue
import threading
import time
import weakref
from collections.abc import Callable


class Timer:
    """The timer of one `AbortSignal.timeout`: at ``deadline`` (on `time.monotonic`) it calls its
    link, which aborts the signal if it is still there. Run by the event loop it was made in;
    by the shared `TimerThread` if made outside a loop or if that loop let go of it unrun
    (closed, or collected) before it was due."""

    __slots__ = ("__weakref__", "deadline", "done", "handle", "link", "loop", "reason", "threaded")

    def __init__(self, link: Callable[[str], object], reason: str, deadline: float) -> None:
        self.link = link
        self.reason = reason
        self.deadline = deadline
        self.done = False  # fired or cancelled: a flag, so a race between the two is harmless
        self.threaded = False  # run by the `TimerThread` (else by a loop)
        self.loop: weakref.ref[asyncio.AbstractEventLoop] | None = None
        self.handle: weakref.ref[asyncio.TimerHandle] | None = None

    def watch(self, loop: asyncio.AbstractEventLoop, handle: asyncio.TimerHandle) -> None:
        """Run by ``loop``, and taken over by the thread if the loop drops ``handle`` unrun."""
        try:
            self.handle = weakref.ref(handle, self._dropped)
            self.loop = weakref.ref(loop)
        except TypeError:  # a loop whose handles cannot be watched: the timer stays with it
            self.handle = self.loop = None

    def fire(self) -> None:
        if not self.done:
            self.done = True
            self.link(self.reason)

    def cancel(self) -> None:
        """The signal aborted or was collected: nothing left to do (callable from any thread,
        and from a weakref callback)."""
        if self.done:
            return
        self.done = True
        if self.threaded:  # the thread lets go of cancelled timers in bulk
            timer_thread.cancelled()
            return
        if self.handle is None or self.loop is None:
            return
        handle, loop = self.handle(), self.loop()
        if handle is not None and loop is not None and not loop.is_closed():
            try:  # on the loop's own thread: a handle is not cancelled safely from elsewhere
                loop.call_soon_threadsafe(handle.cancel)
            except RuntimeError:  # closed meanwhile: the handle is gone with it
                pass

    def _dropped(self, _ref: object) -> None:
        # The loop let go of the handle: after running it (done), or unrun as it closed.
        if not self.done:
            self.handle = self.loop = None
            timer_thread.add(self)


class TimerHeap:
    """The thread's pending timers, earliest first. Cancelled ones are left in place and
    dropped in bulk once they are more than half of it."""

    __slots__ = ("_cancelled", "_entries", "_order")

    def __init__(self) -> None:
        self._entries: list[tuple[float, int, Timer]] = []
        self._order = itertools.count()  # ties fire in the order made; timers are never compared
        self._cancelled = 0

    def __len__(self) -> int:
        return len(self._entries)

    def add(self, timer: Timer) -> None:
        heapq.heappush(self._entries, (timer.deadline, next(self._order), timer))

    def note_cancelled(self) -> None:
        self._cancelled += 1
        if self._cancelled * 2 > len(self._entries):
            self._entries = [entry for entry in self._entries if not entry[2].done]
            heapq.heapify(self._entries)
            self._cancelled = 0

    def pop_due(self, now: float) -> list[Timer]:
        due: list[Timer] = []
        entries = self._entries
        while entries and entries[0][0] <= now:
            timer = heapq.heappop(entries)[2]
            if timer.done:
                self._cancelled = max(0, self._cancelled - 1)
            else:
                due.append(timer)
        return due

    def wait(self, now: float) -> float | None:
        """Seconds until the next pending timer is due; None when none is pending."""
        entries = self._entries
        while entries and entries[0][2].done:
            heapq.heappop(entries)
            self._cancelled = max(0, self._cancelled - 1)
        return max(0.0, entries[0][0] - now) if entries else None


class TimerThread:
    """One daemon thread for every timer not run by an event loop. Started by the first timer,
    it ends when none is pending. Timers and cancellations reach it through a queue whose
    ``put`` is safe from a weakref callback (a signal collected, a loop's handle dropped)."""

    def __init__(self) -> None:
        self._inbox: queue.SimpleQueue[Timer | None] = queue.SimpleQueue()
        self._heap = TimerHeap()
        self._guard = threading.RLock()
        self._running = False
        self.thread: threading.Thread | None = None

    def add(self, timer: Timer) -> None:
        timer.threaded = True
        self._inbox.put(timer)
        self._start()

    def cancelled(self) -> None:
        self._inbox.put(None)

    def forked(self) -> None:
        """In a forked child: the parent's thread is not there. The timers it had pending are the
        child's too (its copies of their signals): a thread of the child's own runs them."""
        self._guard = threading.RLock()
        self._running = False
        self.thread = None
        if len(self._heap) or not self._inbox.empty():
            self._start()

    def _start(self) -> None:
        """Start the thread unless it runs (it takes what is queued before it may end)."""
        with self._guard:
            if self._running:
                return
            self._running = True  # first: a weakref callback while starting finds it set
            try:
                self.thread = threading.Thread(target=self._run, name="agentloop-timeouts", daemon=True)
                self.thread.start()
            except BaseException:
                self._running = False
                raise

    def _run(self) -> None:
        heap, inbox = self._heap, self._inbox
        while True:
            for timer in heap.pop_due(time.monotonic()):
                try:
                    timer.fire()
                except BaseException:  # a listener's SystemExit or KeyboardInterrupt: not ours to die of
                    _log_abort_error()
            wait = heap.wait(time.monotonic())
            if wait is None:
                with self._guard:
                    if inbox.empty():
                        self._running = False
                        return
                wait = 0.0
            try:
                item = inbox.get(timeout=min(wait, threading.TIMEOUT_MAX)) if wait > 0 else inbox.get_nowait()
            except queue.Empty:
                continue
            if item is None:
                heap.note_cancelled()
            else:
                heap.add(item)


timer_thread = TimerThread()
if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=timer_thread.forked)


def _log_abort_error() -> None:
    import logging

    logging.getLogger("agentloop").exception("an abort by AbortSignal.timeout raised on the timer thread")
