"""`JsonlSession`, the append-only JSON Lines store, and the `SessionStore` protocol.

Appends are synchronous, under a thread lock, in commit order; the file is opened (and
locked against other writers) at the first append or `JsonlSession.acquire`, and synced
as the ``fsync`` policy says. The record format is in `_format`, the durable writes in
`_files`, the writer's lock in `_locking`, reading back in `_load`.
"""

from __future__ import annotations

import contextlib
import errno
import logging
import os
import stat
import warnings
import weakref
from collections.abc import Iterator, Sequence
from pathlib import Path
from types import TracebackType
from typing import Any, Literal, Protocol, runtime_checkable

from .._checks import count
from .._errors import SessionLockedError
from .._forklock import ForkSafeLock
from .._messages import Message
from ._files import O_BINARY, cut_torn_tail, fsync_dir, fsync_file, make_dirs, plain_file_name, write_all
from ._format import checkpoint_line, dumps, encode_line, event_to_json, message_json
from ._load import LoadedSession, load_file
from ._locking import take_lock

log = logging.getLogger("agentloop")

FsyncPolicy = Literal["always", "batch", "never"]


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

    def append_message(self, message: Message) -> None:
        """Keep ``message``, just committed to the transcript. An exception it raises costs the
        run nothing: the engine adds a line to its ``session_errors`` and goes on."""
        ...

    def append_event(self, event: object) -> None:
        """Keep ``event``, an agentloop event worth keeping; an exception is handled as for
        `append_message`."""
        ...

    def sidechain(self, agent_id: str) -> SessionStore:
        """The store of subagent ``agent_id``'s transcript, kept apart from this one."""
        ...

    def close(self) -> None:
        """Release what the store holds; its owner calls it, never the engine."""
        ...


class JsonlSession:
    """An append-only JSON Lines session file (see the module docstring).

    ``fsync``: durability policy (ValueError for another). ``fsync_every``: with ``"batch"``,
    also fsync every N appends (a whole number, 2.0 too; TypeError for another value, ValueError below 1). ``sidechain_dir``: where subagent files go (default
    ``<dir of path>/subagents/<file name without .jsonl>``, a folder per session; another
    name gets ``<name>.d``, see `default_sidechain_dir`). The file
    and its directories are created on the first append (or `acquire`); constructing or
    loading never creates anything. A file it
    creates has mode 0o600, a directory 0o700 (a transcript may hold secrets: tool
    output, keys the user pasted); existing ones keep their mode. A relative
    path is taken from the working directory at construction; a leading ``~`` is the
    home directory (ValueError when it cannot be told).
    A session is safe to append to from several threads. While its file is open for
    appending (from `acquire` or the first append until `close` or `release`) no other
    session, in this process or another, can open it for appending: they get
    `SessionLockedError`. An append finding that the path no longer names the file it opened
    (deleted, moved away, or replaced by a rename over it) raises OSError (``ESTALE``), writing
    nothing; the next append opens the file at the path again, creating it and any missing
    directory of its path as the first append does (a session folder renamed away comes back
    under its old name), and an engine then writes its whole transcript there, so that the file
    at the path can be resumed alone (after each log rotation, the new file holds all of it
    again). An OSError raised names the file.
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
        if isinstance(fsync_every, float) and fsync_every.is_integer():  # 2.0 from a config file
            fsync_every = int(fsync_every)
        fsync_every = count("fsync_every", fsync_every, 1)
        # Absolute now: the file is opened at the first append, and a sidechain's much later,
        # by when the process (a tool, the host) may have changed its working directory.
        self.path = _absolute(path)
        self.fsync: FsyncPolicy = fsync
        self.fsync_every = fsync_every
        self.sidechain_dir = _absolute(sidechain_dir) if sidechain_dir is not None else default_sidechain_dir(self.path)
        self._fd: int | None = None
        self._identity: tuple[int, int] | None = None  # (device, inode) of an open regular file
        self._closed = False
        self._unsynced = 0
        self._torn = False  # a failed append may have left part of its line at the end
        self._tail_unchecked = False  # opened, its last line not yet checked for a crash's tear
        self._cut_to: int | None = None  # the size before the line of an append whose sync failed
        self._owed: bytes | None = None  # a checkpoint line resume() could not write: goes first
        self._dirs_owed: list[Path] = []  # directories whose new entries are not yet synced
        # Renewed in a forked child when another thread held it (that thread is not in the child):
        # one opening the file, or asking for a sidechain, as the process forked.
        self._lock = ForkSafeLock()
        self._sidechains: dict[str, JsonlSession] = {}

    def __repr__(self) -> str:
        return f"<JsonlSession {str(self.path)!r} fsync={self.fsync!r}>"

    # -- writing ------------------------------------------------------------

    def append_message(self, message: Message) -> None:
        """Append one committed message. Raises ValueError once closed, OSError on IO failure."""
        self._append('{"type":"message","message":' + message_json(message) + "}\n")

    def append_checkpoint(self, messages: Sequence[Message]) -> None:
        """Append a checkpoint record: on load, ``messages`` replace every message read before
        it (a transcript rewound or edited by the host). Raises as `append_message` does."""
        self._append(checkpoint_line(messages))

    def append_event(self, event: object) -> None:
        """Append an event record: any agentloop event dataclass (or pydantic model, or
        mapping). Values JSON cannot encode are written as their ``repr``."""
        record = {"type": "event", "event": event_to_json(event)}
        self._append(dumps(record) + "\n")

    def acquire(self) -> None:
        """Open the file for appending now rather than at the first append (creating it and
        its directories if missing), taking the lock that keeps other writers out until
        `close` or `release`. Does nothing if it is open already. Raises `SessionLockedError`
        when another writer has it open, OSError when it cannot be opened, ValueError once
        closed. The engine calls it as each run starts."""
        with self._lock:
            self._open()

    def _acquire_new(self) -> bool:
        """Create the file and open it for appending, as `acquire` does; False, with nothing
        opened, when the file exists already (or this session has it open). Only one caller,
        in any process, creates a file: a subagent's id is taken by creating its sidechain."""
        with self._lock:
            if self._fd is not None:
                return False
            try:
                self._open(exclusive=True)
            except FileExistsError:
                return False
            return True

    def _settle_tail(self) -> None:
        """Cut a crash's torn last line now rather than at the next append (the engine, as a
        run starts, asks whether the file holds any record). An error is left for the append."""
        with self._lock:
            if self._fd is None or not self._tail_unchecked or self._identity is None:
                return
            try:
                cut_torn_tail(self._fd, self.path, keep_whole=True)
            except OSError:
                return
            self._tail_unchecked = False

    def flush(self) -> None:
        """Make every append so far durable (fsync), unless the policy is ``"never"``."""
        with self._lock, self._naming_file():
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
        with self._lock, self._naming_file():
            fd = self._fd
            if fd is None:
                return
            try:
                self._drop_uncommitted(fd)
                if self.fsync != "never" and self._unsynced:
                    self._sync()
            finally:
                self._close_fd(fd)

    def __del__(self) -> None:
        # As Python's own files do: a session dropped while its file is open closes the file
        # and says so with a ResourceWarning (the host should have closed it). No lock: once
        # the session is unreachable no thread can be using it. The sync `close()` would do
        # is not done (a finalizer must not wait for the disk); the records are in the file. No
        # `source=self`: a warning recorded with it would keep the session (and its sidechains) alive.
        fd = getattr(self, "_fd", None)
        if fd is None:
            return
        # The guard only if free: a finalizer runs wherever the collector does, maybe in a
        # thread holding a lock that the thread now forking (holding the guard) waits for.
        try:
            guard = _FD_GUARD if _FD_GUARD.acquire(blocking=False) else None
        except (AttributeError, NameError, TypeError):  # at interpreter exit, the module may be torn down
            guard = None
        try:
            self._fd = None
            os.close(fd)
        except OSError:
            pass
        finally:
            if guard is not None:
                guard.release()
        try:
            warnings.warn(f"unclosed session file {str(self.path)!r}", ResourceWarning, stacklevel=1)
        except (AttributeError, TypeError):  # at interpreter exit, the module may be torn down
            pass

    def _forget_file(self) -> None:
        """In the child of a ``fork`` (without exec): let go of the descriptor the child
        inherited, without a write, a sync or a truncation, which are the parent's to do.

        The child's copy shares the parent's open file, and with it the parent's lock: writing
        through it would interleave two writers' records, and kept open it would hold the lock
        after the parent closed the file. Closing it leaves the parent's lock as it is (a lock
        taken with ``flock`` goes with the last descriptor of the open file). The session stays
        usable: its next append opens the file afresh, refused with `SessionLockedError` while
        the parent (or anyone else) holds the lock. (The thread lock, maybe held by another
        thread when the process forked, is a `ForkSafeLock`: the child finds it free.)
        """
        fd, self._fd = self._fd, None
        if fd is not None:
            with contextlib.suppress(OSError):
                os.close(fd)
        self._unsynced = 0
        self._torn = self._tail_unchecked = False
        self._cut_to = self._owed = None  # the parent's pending repairs: it makes them
        self._dirs_owed = []

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
        if not plain_file_name(agent_id):
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
        data = encode_line(line)
        with self._lock:
            try:  # `_naming_file` written out: a context manager made per append costs ~1 us more
                self._append_locked(data)
            except OSError as exc:
                _name_file(exc, self.path)
                raise

    def _append_locked(self, data: bytes) -> None:
        fd = self._open()
        if self._identity is not None and not self._named(fd, self._identity):
            self._drop_stale_file(fd)
        if self._tail_unchecked:  # cut a crash's torn last line (a whole record is kept)
            cut_torn_tail(fd, self.path, keep_whole=True)
            self._tail_unchecked = False
        if self._torn:
            cut_torn_tail(fd, self.path)
            self._torn = False
        if self._cut_to is not None:
            os.ftruncate(fd, self._cut_to)
            self._cut_to = None
        if self._owed is not None:  # the checkpoint must come before any later record
            self._write(fd, self._owed)
            self._owed = None
        self._write(fd, data)

    @contextlib.contextmanager
    def _naming_file(self) -> Iterator[None]:
        """An OSError raised inside names this session's file (see `_name_file`)."""
        try:
            yield
        except OSError as exc:
            _name_file(exc, self.path)
            raise

    def _named(self, fd: int, identity: tuple[int, int]) -> bool:
        """Whether the path still names the open file: not deleted, moved away (a rename, a log
        rotation) or replaced (a rename over it). A path that cannot be looked up for another
        reason (a directory made unreadable) leaves the question to the file's link count."""
        try:
            st = os.stat(self.path)
        except (FileNotFoundError, NotADirectoryError):
            return False
        except OSError:
            return os.fstat(fd).st_nlink > 0
        return (st.st_dev, st.st_ino) == identity

    def _identify(self, fd: int) -> tuple[int, int] | None:
        """(device, inode) of the open file as a stat of the path gives them, or None for what is
        not a regular file (a device, a pipe: not watched). The device is the path's: on overlayfs
        and some network file systems a stat of the path and an fstat of the open file give one
        file two devices (see `_locking._lock_holder`), and the path is what later appends look up."""
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode):
            return None
        try:
            at = os.stat(self.path)
        except OSError:
            return st.st_dev, st.st_ino
        return (at.st_dev if at.st_ino == st.st_ino else st.st_dev), st.st_ino

    def _drop_stale_file(self, fd: int) -> None:
        """Close a file the path no longer names (the lock held), and refuse the append: a
        record written there would be lost. The next append opens the file at the path."""
        self._cut_to = None
        self._unsynced = 0
        self._torn = self._tail_unchecked = False
        with contextlib.suppress(OSError):
            self._close_fd(fd)
        raise OSError(
            errno.ESTALE,
            "the session file was deleted, moved away, or replaced by another, since this session opened it: this "
            "record is not written, and the next append opens (or creates) the file at this path",
            str(self.path),
        )

    def _write(self, fd: int, data: bytes) -> None:
        """Write one whole line (the lock held)."""
        try:
            write_all(fd, data)
        except BaseException:
            # Part of the line may be in the file (a short write, then ENOSPC or EIO): cut it
            # off now, or before the next append if that fails too, so that the next record
            # is never glued to it (which would lose that record as well).
            self._torn = True
            with contextlib.suppress(OSError):
                cut_torn_tail(fd, self.path)
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
        """Before the file is closed: cut the line of an append whose sync failed, and the part
        of one whose write failed, if they are still there (the lock held). Either append raised:
        its record must not be in the file (a part all but its newline would load as whole)."""
        if self._cut_to is not None:
            with contextlib.suppress(OSError):
                os.ftruncate(fd, self._cut_to)
            self._cut_to = None
        if self._torn:
            with contextlib.suppress(OSError):
                cut_torn_tail(fd, self.path)
            self._torn = False

    def _open(self, *, exclusive: bool = False) -> int:
        if self._closed:
            raise ValueError(f"I/O operation on closed session {str(self.path)!r}")
        if self._fd is None:
            # Listed as open first, and the descriptor kept as it is made, as one step for a fork
            # (see `_FD_GUARD`): the child of a fork (by another thread, now) lets go of any
            # descriptor the session holds, and inherits no other.
            _OPEN.add(self)
            try:
                made = make_dirs(self.path.parent)
                created = exclusive or not self.path.exists()
                # Owner only (a transcript may hold secrets): the umask can only take bits away from 0o600.
                flags = os.O_RDWR | os.O_CREAT | os.O_APPEND | O_BINARY | (os.O_EXCL if exclusive else 0)
                name = os.fspath(self.path)
                with _FD_GUARD:
                    self._fd = fd = os.open(name, flags, 0o600)
                take_lock(fd, self.path)
            except BaseException:
                if self._fd is None:
                    _OPEN.discard(self)
                else:
                    self._close_fd(self._fd)
                raise
            # A file, not a device: watched so that one deleted, moved or replaced under it is noticed.
            self._identity = self._identify(fd)
            # Checked at the next append, not here: `resume` takes the lock before it loads (a
            # file another writer appends to cannot be read whole), and the load reports the tear.
            self._tail_unchecked = True
            self._dirs_owed += ([self.path.parent] if created else []) + made
        return self._fd

    def _close_fd(self, fd: int) -> None:
        """Let go of the descriptor ``fd`` and close it, as one step for a fork (see `_FD_GUARD`):
        a child forked meanwhile would inherit a descriptor its session no longer knows of."""
        try:
            with _FD_GUARD:
                self._fd = None
                os.close(fd)
        finally:
            _OPEN.discard(self)

    def _sync(self) -> None:
        assert self._fd is not None
        fsync_file(self._fd)
        self._unsynced = 0
        while self._dirs_owed:
            # A new file (or directory) is durable only once the directory holding its entry is
            # synced: until then a power loss can lose the whole file, however often it was synced.
            fsync_dir(self._dirs_owed[0])
            del self._dirs_owed[0]

    # -- reading ------------------------------------------------------------

    def load(self) -> LoadedSession:
        """Read the file and return its repaired transcript (see `LoadedSession`).

        A missing file loads as an empty session, and so does a path that is not a regular
        file (a FIFO, a device: not read, with a warning; ``os.devnull`` without one). Torn and
        corrupt lines are skipped with a warning (logged on the ``agentloop`` logger and
        returned); nothing committed before them is lost. Raises OSError if the file
        exists but cannot be read.
        """
        return load_file(self.path)

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
                session._owed = encode_line(checkpoint_line(loaded.messages))
                warning = (
                    f"{session.path}: could not append the repaired transcript as a checkpoint "
                    f"({type(exc).__name__}: {exc}); it is written before the next record"
                )
                log.warning("%s", warning)
                loaded.warnings.append(warning)
        return session, loaded


def _name_file(exc: OSError, path: Path) -> None:
    """Make ``exc`` name ``path`` if it names no file: a failed ``write`` or ``fsync`` says only
    "No space left on device". A `SessionLockedError` says whose lock it met itself."""
    if exc.filename is None and not isinstance(exc, SessionLockedError):
        exc.filename = str(path)


def default_sidechain_dir(path: Path) -> Path:
    """Where the subagents of the session file ``path`` write by default: a folder of its own,
    ``<dir>/subagents/<name>`` (``name`` the file's without ``.jsonl``), so that the sessions
    of one directory (a conversation and its fork) never share a subagent's file.

    Any other file name (``a``, ``a.d.jsonl``) gets ``<name>.d``: the folders of ``a`` and
    ``a.jsonl`` differ, as do those of any two names (only the first kind yields a folder
    name that does not end in ``.d``), and none is named as a sidechain file of the shared
    ``subagents/`` of earlier versions (``<id>.jsonl``)."""
    name = path.name
    stem = name.removesuffix(".jsonl")
    if stem == name or not stem or stem.endswith((".d", ".jsonl")):
        return path.parent / "subagents" / f"{name}.d"
    return path.parent / "subagents" / stem


def _absolute(path: str | os.PathLike[str]) -> Path:
    """``path`` made absolute from the working directory, a leading ``~`` or ``~user`` taken
    as that home directory (as a shell does), never as a folder named ``~``. Raises ValueError
    when the home directory cannot be told."""
    try:
        return Path(path).expanduser().absolute()
    except RuntimeError as exc:  # no such user, or no HOME and no password entry
        raise ValueError(f"cannot expand {str(path)!r}: {exc}") from None


#: The sessions whose file is open for appending (see `JsonlSession._forget_file`).
_OPEN: weakref.WeakSet[JsonlSession] = weakref.WeakSet()

#: Held while a session's descriptor is made and kept (``os.open`` and ``_fd`` set), or let go of
#: and closed, and by the thread that forks, across the fork: a child never inherits a descriptor
#: its session does not know of (made but not yet kept, or let go of but not yet closed), which it
#: could not let go of, and which would keep the parent's lock (a ``flock`` goes with the open
#: file, shared by both copies) after the parent closed the file. Held for a system call, never
#: while waiting for another lock; re-entrant (a finalizer may close a file in the thread holding
#: it), and a new one in the child, where the thread that forked holds the parent's.
_FD_GUARD = ForkSafeLock()


def _before_fork() -> None:
    _FD_GUARD.acquire()


def _after_fork_in_parent() -> None:
    _FD_GUARD.release()


def _after_fork_in_child() -> None:
    global _FD_GUARD
    _FD_GUARD = ForkSafeLock()
    for session in list(_OPEN):
        session._forget_file()
    _OPEN.clear()


if hasattr(os, "register_at_fork"):  # POSIX
    os.register_at_fork(
        before=_before_fork, after_in_parent=_after_fork_in_parent, after_in_child=_after_fork_in_child
    )
