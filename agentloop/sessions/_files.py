"""Appending to a session file durably: whole lines written, synced, and a torn tail cut.

A line is committed once its final newline is in the file; what a crash (or a failed write)
leaves after the last newline is cut before the next append (`cut_torn_tail`), and a new
file or directory is durable once the directory holding it is synced (`fsync_dir`).
"""

from __future__ import annotations

import errno
import logging
import os
import stat
from pathlib import Path

from ._format import loads_record

log = logging.getLogger("agentloop")


#: Whether file names are read as Windows reads them (`plain_file_name`).
WINDOWS = os.name == "nt"

#: What Windows reads as a device in a file name, whatever follows a dot (``CON.jsonl`` is the console);
#: the superscript digits ¹ ² ³ count as digits there (``COM¹`` is a port).
_DEVICES = frozenset(
    [
        "CON",
        "PRN",
        "AUX",
        "NUL",
        "CONIN$",
        "CONOUT$",
        *(f"{port}{n}" for port in ("COM", "LPT") for n in "0123456789\u00b9\u00b2\u00b3"),
    ]
)


def plain_file_name(name: str) -> bool:
    """Whether ``name`` names a file in a directory, not a path (a subagent's sidechain file is
    ``<agent_id>.jsonl``): not empty, ``.`` or ``..``, and no separator or NUL in it. On Windows,
    nor a drive (``C:x`` is ``x`` in drive C's working directory, out of the folder it is joined
    to), an alternate data stream (``a:b``), a device (``CON``, ``nul.x``), or a character no
    Windows file name holds."""
    if not name or name in (".", "..") or any(c in name for c in "/\\\0"):
        return False
    if WINDOWS:
        if any(c in name for c in ':*?"<>|') or any(ord(c) < 32 for c in name):
            return False
        return name.split(".")[0].rstrip(" ").upper() not in _DEVICES
    return True


def write_all(fd: int, data: bytes) -> None:
    # One call in practice; the loop only guards against a short write (disk full, signal).
    view = memoryview(data)
    while view:
        view = view[os.write(fd, view) :]


def fsync_file(fd: int) -> None:
    try:
        os.fsync(fd)
    except OSError as exc:
        # A pipe, a FIFO, a socket or a device (os.devnull, /dev/stdout piped to a viewer) keeps
        # nothing to make durable, and refuses fsync with EINVAL: there is nothing to lose.
        if exc.errno != errno.EINVAL or stat.S_ISREG(os.fstat(fd).st_mode):
            raise


def make_dirs(directory: Path) -> list[Path]:
    """Create ``directory`` and its missing parents; return the directories that got a new
    entry (the parent of each directory made), deepest first."""
    missing: list[Path] = []
    while not directory.exists() and directory.parent != directory:
        missing.append(directory)
        directory = directory.parent
    changed: list[Path] = []
    for made in reversed(missing):
        try:
            made.mkdir(mode=0o700)  # owner only, as the session files in it
        except FileExistsError:  # made by someone else meanwhile
            continue
        changed.append(made.parent)
    return changed[::-1]


def fsync_dir(directory: Path) -> None:
    try:
        dfd = os.open(directory, os.O_RDONLY)
    except OSError:  # not supported on this platform (Windows)
        return
    try:
        os.fsync(dfd)
    except OSError:
        pass
    finally:
        os.close(dfd)


O_BINARY: int = getattr(os, "O_BINARY", 0)  # Windows: no newline translation


def _pread(fd: int, n: int, offset: int) -> bytes:
    """``os.pread``, or a seek and a read where it is missing (Windows); appends are
    O_APPEND, so moving the file position changes where nothing is written."""
    if hasattr(os, "pread"):
        return os.pread(fd, n, offset)
    os.lseek(fd, offset, os.SEEK_SET)
    return os.read(fd, n)


def cut_torn_tail(fd: int, path: Path, *, keep_whole: bool = False) -> None:
    """Truncate a final line that has no newline (a torn write), so appends start clean.

    With ``keep_whole``, a final line that is a whole JSON object (a file that simply ends
    without a newline, as JSON Lines allows) is ended with a newline instead of cut.
    """
    size = os.fstat(fd).st_size
    if size == 0 or _pread(fd, 1, size - 1) == b"\n":
        return
    keep = size
    while keep > 0:
        start = max(0, keep - 65536)
        chunk = _pread(fd, keep - start, start)
        nl = chunk.rfind(b"\n")
        if nl >= 0:
            keep = start + nl + 1
            break
        keep = start
    if keep_whole and is_object(_pread(fd, size - keep, keep)):
        write_all(fd, b"\n")
        return
    log.warning("%s: cut a torn last line of %d bytes before appending", path, size - keep)
    os.ftruncate(fd, keep)


def is_object(line: bytes) -> bool:
    # A torn object never parses: its closing brace is its last byte. Read as `load` reads a
    # line (a byte that is not UTF-8 as U+FFFD), so that a last record it keeps is kept here too.
    try:
        return isinstance(loads_record(line)[0], dict)
    except (ValueError, RecursionError):
        return False
