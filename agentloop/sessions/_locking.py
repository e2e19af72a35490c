"""One writer per session file: the lock taken when it is opened for appending.

``flock`` on POSIX; on Windows, ``msvcrt.locking`` of one byte far past the end, where no
reader looks. The operating system drops the lock with the process that held it.
"""

from __future__ import annotations

import errno
import logging
import os
import stat
import sys
from pathlib import Path

from .._errors import SessionLockedError

log = logging.getLogger("agentloop")


if sys.platform == "win32":
    import msvcrt

    # Windows locks are mandatory: a locked byte cannot be read by anyone else. One byte far
    # past any real end of file is locked, so that readers of the file are never refused.
    _LOCKED_BYTE = 1 << 62

    def _try_lock(fd: int) -> bool:
        os.lseek(fd, _LOCKED_BYTE, os.SEEK_SET)  # O_APPEND writes still go to the end
        try:
            msvcrt.locking(fd, msvcrt.LK_NBLCK, 1)
        except OSError as exc:
            if exc.errno in (errno.EACCES, errno.EDEADLOCK):
                return False
            raise
        return True

else:
    import fcntl

    def _try_lock(fd: int) -> bool:
        # flock, not fcntl/lockf: a POSIX record lock is dropped when the process closes any
        # descriptor of the file (as every `load` does), and belongs to the process, not the
        # open file, so it could not keep out a second session object of this process.
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            return False
        return True


def take_lock(fd: int, path: Path) -> None:
    """Take the single writer's lock on ``fd``'s file; raise `SessionLockedError` if another
    writer holds it. Held until ``fd`` is closed (by the OS when the process dies). A device
    or a pipe (``os.devnull`` for every engine of a host that keeps nothing, ``/dev/stdout``)
    holds no transcript to protect, and is not locked."""
    if not stat.S_ISREG(os.fstat(fd).st_mode):
        return
    try:
        if _try_lock(fd):
            return
    except OSError as exc:  # a file system that cannot lock (ENOLCK, EOPNOTSUPP): written as before
        log.warning("%s: not locked against other writers, the file system refused (%s)", path, exc)
        return
    raise SessionLockedError(str(path), _lock_holder(fd))


def _lock_holder(fd: int) -> int | None:
    """The pid of the process holding the flock on ``fd``'s file, as Linux lists it in
    /proc/locks; None elsewhere, or when it is not listed."""
    try:
        st = os.fstat(fd)
        with open("/proc/locks", encoding="ascii", errors="replace") as f:
            rows = [line.split() for line in f]
    except OSError:
        return None
    # "3: FLOCK  ADVISORY  WRITE 4242 fe:00:2146355 0 EOF" (a waiter's row has "->" after the
    # number, and is skipped). On an overlay file system the device listed is the one below the
    # overlay, not the one fstat gives: then the inode alone, if only one lock has it, is the file.
    device = f"{os.major(st.st_dev):02x}:{os.minor(st.st_dev):02x}:{st.st_ino}"
    inode = f":{st.st_ino}"
    found = [row for row in rows if len(row) > 5 and row[1] == "FLOCK" and row[5].endswith(inode)]
    exact = [row for row in found if row[5] == device]
    chosen = exact or (found if len(found) == 1 else [])
    try:
        pid = int(chosen[0][4]) if chosen else 0
    except ValueError:
        return None
    return pid if pid > 0 else None
