"""A re-entrant lock that a process forked without exec finds free."""

from __future__ import annotations

import os
import threading
import weakref
from types import TracebackType

__all__ = ["ForkSafeLock"]


class ForkSafeLock:
    """A `threading.RLock` renewed in a forked child: the thread that held it (a run starting,
    in another thread, as the process forked) is not in the child, and would hold it for ever.

    Module-level locks that runs of several threads take for a moment (to look and claim as
    one step) are made this way.
    """

    __slots__ = ("__weakref__", "_lock")

    def __init__(self) -> None:
        self._lock = threading.RLock()
        if hasattr(os, "register_at_fork"):  # POSIX
            mine = weakref.ref(self)
            os.register_at_fork(after_in_child=lambda: _renew(mine))

    def acquire(self, blocking: bool = True, timeout: float = -1) -> bool:
        return self._lock.acquire(blocking, timeout)

    def release(self) -> None:
        self._lock.release()

    def __enter__(self) -> bool:
        return self._lock.acquire()

    def __exit__(
        self, kind: type[BaseException] | None, exc: BaseException | None, trace: TracebackType | None
    ) -> None:
        self._lock.release()


def _renew(ref: weakref.ref[ForkSafeLock]) -> None:
    lock = ref()
    if lock is not None:
        lock._lock = threading.RLock()
