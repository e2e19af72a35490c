"""Session stores: persist a transcript as it is committed, and resume it after a crash.

`JsonlSession` keeps one append-only JSON Lines file per session. Each line is a
whole record, written by one ``os.write`` call of the full line:

    {"type":"message","message":{...}}         one committed `Message`
    {"type":"event","event":{"type":...}}      an event of interest (turn_ended, ...)
    {"type":"checkpoint","messages":[...]}     the repaired transcript a resume started from

Crash safety, the invariant: a line is committed once its final ``\\n`` is in
the file. A crash (even SIGKILL, even between two halves of a short write) can
only leave a torn *last* line without its newline; `JsonlSession.load` skips it
with a warning, and everything before it is intact. Reopening a file for
appending cuts such a torn tail off first, so a new line is never glued to it.
(A last line that is a whole record, its newline alone missing, is no tear:
JSON Lines lets a file end so. It is loaded, and ended with a newline on reopening.)

Durability is the ``fsync`` policy: ``"always"`` fsyncs after every append
(survives power loss, costs one disk flush per message); ``"batch"`` (the
default) fsyncs on `flush`, on `close` and, with ``fsync_every=N``, every N
appends (survives a process crash, since the data is in the OS page cache, but
a power loss may lose the last unsynced appends); ``"never"`` leaves it to the OS.

One writer at a time: from the moment the file is opened for appending until it is
closed, the session holds a lock on it (``flock`` on POSIX; on Windows, ``msvcrt.locking``
of one byte far past the end, where no reader looks), and a second writer (another
process, or another session object of this one) gets `SessionLockedError` instead of
interleaving its records with the first's. The operating system drops the lock with the
process that held it, so a crash leaves none behind. Reading (`load`) takes no lock and
is never refused.

Writes are synchronous on purpose: appending one line to a local file is a
single syscall that lands in the page cache in microseconds, cheaper than
handing it to a thread, and it keeps the order of records equal to the order of
commits without a queue that a crash could lose. Only ``fsync="always"`` waits
for the disk on each append; choose ``"batch"`` when that latency matters.
"""

from __future__ import annotations

import contextlib
import dataclasses
import enum
import errno
import gc
import json
import logging
import math
import os
import re
import stat
import sys
import threading
import warnings
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from types import TracebackType
from typing import Any, Literal, Protocol, runtime_checkable

from pydantic import BaseModel, ValidationError
from pydantic_core import PydanticSerializationError

from ._errors import SessionLockedError
from ._messages import (
    Message,
    ProviderBlock,
    RedactedThinkingBlock,
    TextBlock,
    ThinkingBlock,
    ToolResultBlock,
    ToolUseBlock,
    jsonable,
)
from ._transcript import repair
from ._unicode import has_surrogates

__all__ = ["FsyncPolicy", "JsonlSession", "LoadedSession", "SessionLockedError", "SessionStore"]

log = logging.getLogger("agentloop")

FsyncPolicy = Literal["always", "batch", "never"]

_ENCODED_SURROGATE = re.compile(rb"\xed[\xa0-\xbf]")
_OTHER_LINE_BREAK = re.compile("[\x85\u2028\u2029]")  # JSON escapes the others (\n, \r, \v, \f, \x1c-\x1e)


@runtime_checkable
class SessionStore(Protocol):
    """What the engine needs from a session store.

    The engine calls `append_message` for every message it commits to the
    transcript, `append_event` for events worth keeping (`TurnEnded`,
    interjection receipts), and `sidechain` once per subagent, whose transcript
    is kept apart. `close` is the owner's job; the engine never calls it on the
    store it was given. A store may also have ``append_checkpoint(messages)``
    (as `JsonlSession` does): the engine calls it when a run starts on a
    transcript the host rewound or edited since the last commit, and ``acquire()``: the
    engine calls it as each run starts, and a `SessionLockedError` it raises refuses the run
    (any other error is left for the appends to report).
    """

    def append_message(self, message: Message) -> None: ...
    def append_event(self, event: object) -> None: ...
    def sidechain(self, agent_id: str) -> SessionStore: ...
    def close(self) -> None: ...


@dataclass(slots=True)
class LoadedSession:
    """What `JsonlSession.load` found.

    ``messages``: the repaired, valid transcript. ``repairs``: one line per change
    `repair_transcript` made. ``warnings``: torn or corrupt lines that were
    skipped. ``events``: the event records, as JSON objects (``event["type"]``
    is the event's type tag).
    """

    messages: list[Message]
    repairs: list[str] = field(default_factory=list)
    warnings: list[str] = field(default_factory=list)
    events: list[dict[str, Any]] = field(default_factory=list)


class JsonlSession:
    """An append-only JSON Lines session file (see the module docstring).

    ``fsync``: durability policy. ``fsync_every``: with ``"batch"``, also fsync
    every N appends. ``sidechain_dir``: where subagent files go (default
    ``<dir of path>/subagents``). The file and its directories are created on
    the first append (or `acquire`); constructing or loading never creates anything. A file it
    creates has mode 0o600, a directory 0o700 (a transcript may hold secrets: tool
    output, keys the user pasted); existing ones keep their mode. A relative
    path is taken from the working directory at construction.
    A session is safe to append to from several threads. While its file is open for
    appending (from `acquire` or the first append until `close` or `release`) no other
    session, in this process or another, can open it for appending: they get
    `SessionLockedError`.
    """

    def __init__(
        self,
        path: str | os.PathLike[str],
        *,
        fsync: FsyncPolicy = "batch",
        fsync_every: int | None = None,
        sidechain_dir: str | os.PathLike[str] | None = None,
    ) -> None:
        if fsync not in ("always", "batch", "never"):
            raise ValueError(f"fsync must be 'always', 'batch' or 'never', not {fsync!r}")
        if fsync_every is not None and fsync_every < 1:
            raise ValueError("fsync_every must be >= 1")
        # Absolute now: the file is opened at the first append, and a sidechain's much later,
        # by when the process (a tool, the host) may have changed its working directory.
        self.path = Path(path).absolute()
        self.fsync: FsyncPolicy = fsync
        self.fsync_every = fsync_every
        self.sidechain_dir = (
            Path(sidechain_dir).absolute() if sidechain_dir is not None else self.path.parent / "subagents"
        )
        self._fd: int | None = None
        self._closed = False
        self._unsynced = 0
        self._torn = False  # a failed append may have left part of its line at the end
        self._tail_unchecked = False  # opened, its last line not yet checked for a crash's tear
        self._cut_to: int | None = None  # the size before the line of an append whose sync failed
        self._owed: bytes | None = None  # a checkpoint line resume() could not write: goes first
        self._dirs_owed: list[Path] = []  # directories whose new entries are not yet synced
        self._lock = threading.Lock()
        self._sidechains: dict[str, JsonlSession] = {}

    def __repr__(self) -> str:
        return f"<JsonlSession {str(self.path)!r} fsync={self.fsync!r}>"

    # -- writing ------------------------------------------------------------

    def append_message(self, message: Message) -> None:
        """Append one committed message. Raises ValueError once closed, OSError on IO failure."""
        try:
            body = message.model_dump_json()
        except (PydanticSerializationError, ValueError):
            # A lone UTF-16 surrogate (kept exactly, as a \udXXX escape), or a value in the host's
            # ``meta`` that JSON cannot encode (written as its repr, as in an event record).
            body = _dumps(event_to_json(message))
        self._append('{"type":"message","message":' + body + "}\n")

    def append_checkpoint(self, messages: Sequence[Message]) -> None:
        """Append a checkpoint record: on load, ``messages`` replace every message read before
        it (a transcript rewound or edited by the host). Raises as `append_message` does."""
        self._append(_checkpoint_line(messages))

    def append_event(self, event: object) -> None:
        """Append an event record: any agentloop event dataclass (or pydantic model, or
        mapping). Values JSON cannot encode are written as their ``repr``."""
        record = {"type": "event", "event": event_to_json(event)}
        self._append(_dumps(record) + "\n")

    def acquire(self) -> None:
        """Open the file for appending now rather than at the first append (creating it and
        its directories if missing), taking the lock that keeps other writers out until
        `close` or `release`. Does nothing if it is open already. Raises `SessionLockedError`
        when another writer has it open, OSError when it cannot be opened, ValueError once
        closed. The engine calls it as each run starts."""
        with self._lock:
            self._open()

    def flush(self) -> None:
        """Make every append so far durable (fsync), unless the policy is ``"never"``."""
        with self._lock:
            if self._fd is not None and self.fsync != "never" and self._unsynced:
                self._sync()

    def close(self) -> None:
        """Flush (per the policy) and close this file and its sidechains. Idempotent.

        Every file is closed even when syncing one fails; the (last) OSError is raised after.
        """
        with self._lock:
            # Closed before the sidechains are listed: one asked for from another thread from
            # here on comes closed, rather than open and missed by the list (its file never closed).
            self._closed = True
            children = list(self._sidechains.values())
        with contextlib.ExitStack() as stack:
            stack.callback(self._close_file)
            for child in reversed(children):
                stack.callback(child.close)  # run first, in the order they were made

    def release(self) -> None:
        """Flush (per the policy) and close the file, leaving the session open: the next
        append opens the file again. The engine calls it on a subagent's sidechain when the
        subagent's run ends, so an idle subagent holds no open file. Raises OSError if the
        sync fails (the file is closed all the same)."""
        self._close_file()

    def _close_file(self) -> None:
        with self._lock:
            fd = self._fd
            if fd is None:
                return
            try:
                self._drop_uncommitted(fd)
                if self.fsync != "never" and self._unsynced:
                    self._sync()
            finally:
                self._fd = None
                os.close(fd)

    def __del__(self) -> None:
        # As Python's own files do: a session dropped while its file is open closes the file
        # and says so with a ResourceWarning (the host should have closed it). No lock: once
        # the session is unreachable no thread can be using it. The sync `close()` would do
        # is not done (a finalizer must not wait for the disk); the records are in the file. No
        # `source=self`: a warning recorded with it would keep the session (and its sidechains) alive.
        fd = getattr(self, "_fd", None)
        if fd is None:
            return
        self._fd = None
        try:
            os.close(fd)
        except OSError:
            pass
        try:
            warnings.warn(f"unclosed session file {str(self.path)!r}", ResourceWarning, stacklevel=1)
        except (AttributeError, TypeError):  # at interpreter exit, the module may be torn down
            pass

    def __enter__(self) -> JsonlSession:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.close()

    def sidechain(self, agent_id: str) -> JsonlSession:
        """The session of subagent ``agent_id``: ``<sidechain_dir>/<agent_id>.jsonl``.

        Same policy as this one; nested subagents share the same directory. The
        same object is returned for the same id, and `close` closes it too (one
        asked for once this session is closed comes closed). Raises ValueError
        for an id that is not a plain file name.
        """
        if not agent_id or agent_id in (".", "..") or any(c in agent_id for c in "/\\\0"):
            raise ValueError(f"agent_id {agent_id!r} cannot be used as a file name")
        with self._lock:
            child = self._sidechains.get(agent_id)
            if child is None:
                child = JsonlSession(
                    self.sidechain_dir / f"{agent_id}.jsonl",
                    fsync=self.fsync,
                    fsync_every=self.fsync_every,
                    sidechain_dir=self.sidechain_dir,
                )
                child._closed = self._closed  # nothing would ever close it (nor its file)
                self._sidechains[agent_id] = child
            return child

    def _append(self, line: str) -> None:
        data = _encode_line(line)
        with self._lock:
            fd = self._open()
            if self._tail_unchecked:  # cut a crash's torn last line (a whole record is kept)
                _cut_torn_tail(fd, self.path, keep_whole=True)
                self._tail_unchecked = False
            if self._torn:
                _cut_torn_tail(fd, self.path)
                self._torn = False
            if self._cut_to is not None:
                os.ftruncate(fd, self._cut_to)
                self._cut_to = None
            if self._owed is not None:  # the checkpoint must come before any later record
                self._write(fd, self._owed)
                self._owed = None
            self._write(fd, data)

    def _write(self, fd: int, data: bytes) -> None:
        """Write one whole line (the lock held)."""
        try:
            _write_all(fd, data)
        except BaseException:
            # Part of the line may be in the file (a short write, then ENOSPC or EIO): cut it
            # off now, or before the next append if that fails too, so that the next record
            # is never glued to it (which would lose that record as well).
            self._torn = True
            with contextlib.suppress(OSError):
                _cut_torn_tail(fd, self.path)
                self._torn = False
            raise
        self._unsynced += 1
        if self.fsync == "always" or (
            self.fsync == "batch" and self.fsync_every and self._unsynced >= self.fsync_every
        ):
            try:
                self._sync()
            except BaseException:
                # The whole line is in the file, yet the append raises: the caller takes the
                # record as not written (the engine lists it as lost; a host appends it again),
                # so it must not be. Cut it off now, or before the next append or the close.
                self._unsynced -= 1
                with contextlib.suppress(OSError):
                    self._cut_to = os.fstat(fd).st_size - len(data)
                    os.ftruncate(fd, self._cut_to)
                    self._cut_to = None
                raise

    def _drop_uncommitted(self, fd: int) -> None:
        """Before the file is closed: cut the line of an append whose sync failed, if it is
        still there (the lock held)."""
        if self._cut_to is not None:
            with contextlib.suppress(OSError):
                os.ftruncate(fd, self._cut_to)
            self._cut_to = None

    def _open(self) -> int:
        if self._closed:
            raise ValueError(f"I/O operation on closed session {str(self.path)!r}")
        if self._fd is None:
            made = _make_dirs(self.path.parent)
            created = not self.path.exists()
            # Owner only (a transcript may hold secrets): the umask can only take bits away from 0o600.
            fd = os.open(self.path, os.O_RDWR | os.O_CREAT | os.O_APPEND | _O_BINARY, 0o600)
            try:
                _lock(fd, self.path)
            except BaseException:
                os.close(fd)
                raise
            self._fd = fd
            # Checked at the next append, not here: `resume` takes the lock before it loads (a
            # file another writer appends to cannot be read whole), and the load reports the tear.
            self._tail_unchecked = True
            self._dirs_owed += ([self.path.parent] if created else []) + made
        return self._fd

    def _sync(self) -> None:
        assert self._fd is not None
        _fsync(self._fd)
        self._unsynced = 0
        while self._dirs_owed:
            # A new file (or directory) is durable only once the directory holding its entry is
            # synced: until then a power loss can lose the whole file, however often it was synced.
            _fsync_dir(self._dirs_owed[0])
            del self._dirs_owed[0]

    # -- reading ------------------------------------------------------------

    def load(self) -> LoadedSession:
        """Read the file and return its repaired transcript (see `LoadedSession`).

        A missing file loads as an empty session. Torn and corrupt lines are
        skipped with a warning (logged on the ``agentloop`` logger and returned);
        nothing committed before them is lost. Raises OSError if the file
        exists but cannot be read.
        """
        try:
            data = self.path.read_bytes()
        except FileNotFoundError:
            return LoadedSession(messages=[])
        # A string holds a surrogate only through a \ud escape, or through the bytes of one
        # encoded as if it were a character (0xED 0xA0-0xBF: json decodes bytes with
        # "surrogatepass"; CESU-8 writers do this): without either, rule R9 need not be
        # checked string by string (about a tenth of a large load).
        escaped = b"\\u" in data and (b"\\ud" in data or b"\\uD" in data)
        encoded = b"\xed" in data and _ENCODED_SURROGATE.search(data) is not None
        lines = _lines(data)
        del data  # the lines hold it from here on, each let go once read: a large file is not held twice
        loaded = LoadedSession(messages=[])
        problems: list[str] = []
        notes: list[str] = []  # what a record from a newer version lost, yet was kept
        with _gc_paused():
            for lineno, line, complete in lines:
                why = _read_record(line, loaded, notes)
                if why is not None and not complete:
                    why = "no final newline"  # torn: a whole record without one is kept (JSON Lines)
                if why is not None:
                    where = "the torn last line" if lineno == -1 else f"corrupt line {lineno}"
                    problems.append(f"skipped {where} ({why})")
                    notes = []  # what the skipped line would have lost: not news of the next line
                elif notes:
                    where = "the last line" if lineno == -1 else f"line {lineno}"
                    problems += [f"{where}: {note}" for note in notes]
                    notes = []
        for problem in problems:
            warning = f"{self.path}: {problem}"
            log.warning("%s", warning)
            loaded.warnings.append(warning)
        loaded.messages = repair(loaded.messages, changes=loaded.repairs, text_checked=not (escaped or encoded))
        return loaded

    @classmethod
    def resume(cls, path: str | os.PathLike[str], **options: Any) -> tuple[JsonlSession, LoadedSession]:
        """Open ``path`` to continue a session: ``session, loaded = JsonlSession.resume(p)``.

        Pass ``loaded.messages`` to the engine and the session as its store. When
        the load needed repairs, the repaired transcript is appended as a
        checkpoint record, so the file replays to exactly what the engine
        continues from. A checkpoint that cannot be written (a read-only file, a
        full disk) is a warning in ``loaded.warnings``, not an error: it is written
        before the next record the session appends. ``options`` go to the
        constructor. An existing file is locked (as by `acquire`) before it is read:
        raises `SessionLockedError` if another writer has it open, and otherwise OSError
        only if the file exists but cannot be read.
        """
        session = cls(path, **options)
        if session.path.exists():  # a missing file is created by the first append, not here
            # Locked before it is read: what another writer appends meanwhile would be missing
            # from the transcript the engine continues, and its records mixed with the engine's.
            try:
                session.acquire()
            except SessionLockedError:
                raise
            except OSError:  # a file it cannot write still loads (its checkpoint is owed, below)
                pass
        try:
            loaded = session.load()
        except BaseException:
            session.close()  # and with it the lock
            raise
        if loaded.repairs:
            try:
                session.append_checkpoint(loaded.messages)
            except OSError as exc:
                session._owed = _encode_line(_checkpoint_line(loaded.messages))
                warning = (
                    f"{session.path}: could not append the repaired transcript as a checkpoint "
                    f"({type(exc).__name__}: {exc}); it is written before the next record"
                )
                log.warning("%s", warning)
                loaded.warnings.append(warning)
        return session, loaded


# -- helpers --------------------------------------------------------------------


def event_to_json(value: Any) -> Any:
    """Turn an event (or any value inside one) into JSON-ready data.

    Dataclasses become objects (with their ``type`` tag when they have one),
    pydantic models are dumped in JSON mode (a value a model cannot dump, such as a
    host's object in a message's ``meta``, as its repr), tuples and sets become lists, enums
    their value; anything else JSON cannot encode is left for the encoder's
    ``repr`` fallback.
    """
    if isinstance(value, BaseModel):
        try:
            return value.model_dump(mode="json")
        except (PydanticSerializationError, ValueError):  # a host's object in a message's meta, ...
            return {name: jsonable(getattr(value, name), repr) for name in type(value).model_fields}
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        out: dict[str, Any] = {}
        tag = getattr(type(value), "type", None)
        if isinstance(tag, str):
            out["type"] = tag
        for f in dataclasses.fields(value):
            out[f.name] = event_to_json(getattr(value, f.name))
        return out
    if isinstance(value, Mapping):
        return {str(k): event_to_json(v) for k, v in value.items()}
    if isinstance(value, list | tuple | set | frozenset):
        return [event_to_json(v) for v in value]
    if isinstance(value, enum.Enum):
        return event_to_json(value.value)
    return value


@contextlib.contextmanager
def _gc_paused() -> Iterator[None]:
    # Decoding builds many small acyclic objects; letting the cyclic GC scan
    # them over and over roughly doubles the time of a large load.
    enabled = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if enabled:
            gc.enable()


def _encode_line(line: str) -> bytes:
    if _OTHER_LINE_BREAK.search(line) is not None:
        # Raw in a JSON string, yet a line break to str.splitlines() and to other readers of
        # "lines": escaped, the file has one record per line for every reader.
        line = _OTHER_LINE_BREAK.sub(lambda m: f"\\u{ord(m.group()):04x}", line)
    return line.encode("utf-8")


def _checkpoint_line(messages: Sequence[Message]) -> str:
    return _dumps({"type": "checkpoint", "messages": [event_to_json(m) for m in messages]}) + "\n"


def _dumps(obj: Any) -> str:
    try:
        text = json.dumps(obj, ensure_ascii=False, separators=(",", ":"), default=repr, allow_nan=False)
    except ValueError:  # a NaN or an infinity, which JSON has no number for: null, as in a message
        obj = _finite(obj)
        text = json.dumps(obj, ensure_ascii=False, separators=(",", ":"), default=repr)
    if has_surrogates(text):  # UTF-8 cannot encode it: escape everything non-ASCII instead
        text = json.dumps(obj, ensure_ascii=True, separators=(",", ":"), default=repr)
    return text


def _finite(value: Any) -> Any:
    """``value`` with every float that is NaN or infinite replaced by None."""
    if isinstance(value, float):
        return value if math.isfinite(value) else None
    if isinstance(value, dict):
        return {k: _finite(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [_finite(v) for v in value]
    return value


def _non_finite(constant: str) -> None:
    """What a ``NaN``, ``Infinity`` or ``-Infinity`` token (not JSON; an older version wrote
    them in event records) reads as: None, as the null written for one today."""
    return None


_DECODER = json.JSONDecoder(parse_constant=_non_finite)


def _loads_non_finite(line: bytes) -> Any:
    """json.loads, with a ``NaN`` or ``Infinity`` token read as None (it costs what json.loads
    costs: the token is handled only where it occurs)."""
    # As json.loads does with bytes: UTF-8 (or the UTF-16/32 a BOM or NUL bytes show), with
    # surrogates kept for the repair to join or replace.
    return _DECODER.decode(line.decode(json.detect_encoding(line), "surrogatepass"))


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


def _lock(fd: int, path: Path) -> None:
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


def _write_all(fd: int, data: bytes) -> None:
    # One call in practice; the loop only guards against a short write (disk full, signal).
    view = memoryview(data)
    while view:
        view = view[os.write(fd, view) :]


def _fsync(fd: int) -> None:
    try:
        os.fsync(fd)
    except OSError as exc:
        # A pipe, a FIFO, a socket or a device (os.devnull, /dev/stdout piped to a viewer) keeps
        # nothing to make durable, and refuses fsync with EINVAL: there is nothing to lose.
        if exc.errno != errno.EINVAL or stat.S_ISREG(os.fstat(fd).st_mode):
            raise


def _make_dirs(directory: Path) -> list[Path]:
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


def _fsync_dir(directory: Path) -> None:
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


_O_BINARY: int = getattr(os, "O_BINARY", 0)  # Windows: no newline translation


def _pread(fd: int, n: int, offset: int) -> bytes:
    """``os.pread``, or a seek and a read where it is missing (Windows); appends are
    O_APPEND, so moving the file position changes where nothing is written."""
    if hasattr(os, "pread"):
        return os.pread(fd, n, offset)
    os.lseek(fd, offset, os.SEEK_SET)
    return os.read(fd, n)


def _cut_torn_tail(fd: int, path: Path, *, keep_whole: bool = False) -> None:
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
    if keep_whole and _is_object(_pread(fd, size - keep, keep)):
        _write_all(fd, b"\n")
        return
    log.warning("%s: cut a torn last line of %d bytes before appending", path, size - keep)
    os.ftruncate(fd, keep)


def _is_object(line: bytes) -> bool:
    # A torn object never parses: its closing brace is its last byte.
    try:
        return isinstance(_loads_non_finite(line), dict)
    except (ValueError, RecursionError):
        return False


def _lines(data: bytes) -> Iterator[tuple[int, bytes, bool]]:
    """(line number, line, ends with newline); the line number of a torn tail is -1.

    Holds ``data`` only until it is split, and each line only until it is read (the caller
    drops its own reference to ``data``), so that memory holds the file about once."""
    parts = data.split(b"\n")
    del data
    tail = parts.pop()  # b"" when the data ends with a newline
    last = len(parts)
    parts.reverse()  # popped from the end, in file order
    for i in range(1, last + 1):
        part = parts.pop()
        if part.strip():
            yield (-1 if i == last and not tail else i), part, True
    if tail:
        yield -1, tail, False


def _read_record(line: bytes, loaded: LoadedSession, notes: list[str]) -> str | None:
    """Add one record to ``loaded``; return why it was skipped, or None (``notes``: what a
    record kept from a newer version lost)."""
    try:
        try:
            record = _loads_non_finite(line)
        except UnicodeDecodeError:  # bytes that are not UTF-8 (edited or damaged elsewhere): keep the rest
            record = _loads_non_finite(line.decode("utf-8", "replace").encode("utf-8"))
            notes.append("replaced bytes that are not UTF-8 with U+FFFD")
        kind = record.get("type") if isinstance(record, dict) else None
        if kind == "message":
            loaded.messages.append(_message(record["message"], notes))
        elif kind == "event" and isinstance(record.get("event"), dict):
            loaded.events.append(record["event"])
        elif kind == "checkpoint":
            loaded.messages = [_message(m, notes) for m in record["messages"]]
        else:
            return f"unknown record type {kind!r}"
    except (ValueError, KeyError, TypeError, ValidationError, RecursionError) as exc:
        # RecursionError: a line nested deeper than the parser's stack (damage, or not a session)
        return f"{type(exc).__name__}: {str(exc).splitlines()[0][:200]}"
    return None


_BLOCKS: dict[str, type[BaseModel]] = {
    cls.model_fields["type"].default: cls
    for cls in (TextBlock, ThinkingBlock, RedactedThinkingBlock, ToolUseBlock, ToolResultBlock, ProviderBlock)
}


def _message(data: Any, notes: list[str]) -> Message:
    """``data`` as a `Message`. One written by a newer version is kept without the fields and
    the blocks this version does not know (each noted in ``notes``) rather than skipped whole;
    raises the original ValidationError when even that does not validate."""
    try:
        return Message.model_validate(data)
    except ValidationError as exc:
        if not isinstance(data, dict) or not isinstance(data.get("content"), list):
            raise
        lost: list[str] = []
        known = _known_fields(data, Message, "message", lost)
        known["content"] = _known_blocks(data["content"], lost)
        try:
            message = Message.model_validate(known)
        except ValidationError:
            raise exc from None
        notes += lost
        return message


def _known_blocks(blocks: list[Any], lost: list[str]) -> list[Any]:
    out: list[Any] = []
    for block in blocks:
        cls = _BLOCKS.get(str(block.get("type"))) if isinstance(block, dict) else None
        if cls is None:
            if isinstance(block, dict):
                lost.append(f"dropped a block of unknown type {block.get('type')!r}")
            else:
                out.append(block)  # not a block at all: validation fails, as it should
            continue
        known = _known_fields(block, cls, f"{block['type']} block", lost)
        if cls is ToolResultBlock and isinstance(known.get("content"), list):
            known["content"] = _known_blocks(known["content"], lost)
        out.append(known)
    return out


def _known_fields(data: dict[str, Any], cls: type[BaseModel], what: str, lost: list[str]) -> dict[str, Any]:
    unknown = [k for k in data if k not in cls.model_fields]
    if unknown:
        lost.append(f"ignored unknown field(s) {', '.join(map(repr, unknown))} of a {what}")
    return {k: v for k, v in data.items() if k in cls.model_fields}
