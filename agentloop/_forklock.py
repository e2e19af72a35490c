"""A re-entrant lock that a process forked without exec finds free."""

from __future__ import annotations

import os
import threading
import weakref
from types import TracebackType

__all__ = ["ForkSafeLock"]


class ForkSafeLock:
    """A `threading.RLock` renewed in a forked child when another thread held it: that thread (a
    run starting, in another thread, as the process forked) is not in the child, and would hold it
    for ever. A hold of the thread that forked (``with lock: os.fork()``) goes on in the child,
    which releases it as it would have.

    Module-level locks that runs of several threads take for a moment (to look and claim as
    one step) are made this way.
    """

    __slots__ = ("__weakref__", "_lock")

    def __init__(self) -> None:
        self._lock = threading.RLock()
        _locks.add(self)

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

    def _renew(self) -> None:
        """In a forked child: a new lock unless the thread that forked (the child's only one)
        holds this one. An RLock knows its owner; the child's thread is the forking one."""
        owned = getattr(self._lock, "_is_owned", None)
        if owned is None or not owned():
            self._lock = threading.RLock()


#: Every lock made, weakly: renewed in a forked child by one callback of the module.
_locks: weakref.WeakSet[ForkSafeLock] = weakref.WeakSet()


def _renew_all() -> None:
    for lock in list(_locks):
        lock._renew()


if hasattr(os, "register_at_fork"):  # POSIX
    os.register_at_fork(after_in_child=_renew_all)
