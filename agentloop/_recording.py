"""Session recording: one writer per store, and a store kept in step with the transcript.

Each committed message and event goes to the engine's session store as it happens
(`QueryEngine._commit`, `QueryEngine._record_event`: a store that fails costs the run
nothing and is listed in ``session_errors``). This module holds what happens around a
run: the claim that makes an engine's run the only writer of its store, what the host
changed in ``messages`` between runs (appended, or rewritten as a checkpoint) caught up
before the run writes, and the release of both at the run's end.
"""

from __future__ import annotations

import operator
import stat
import weakref
from typing import TYPE_CHECKING, TypeGuard

from ._errors import SessionLockedError
from ._forklock import ForkSafeLock
from ._messages import Message

if TYPE_CHECKING:
    from ._engine import QueryEngine
    from .sessions import JsonlSession, SessionStore

__all__ = [
    "catch_up_session",
    "claim_store",
    "holds_messages",
    "holds_no_records",
    "holds_records",
    "record_lost",
    "record_message",
    "release_sidechain",
    "release_store",
]

# The running engine writing to each session store (by `_store_key`): a store holds one
# transcript, and two engines appending to it at once would interleave their records. Weak:
# an engine whose run could never end (its event loop closed under it) frees the store when
# the engine goes.
_store_writers: weakref.WeakValueDictionary[object, QueryEngine] = weakref.WeakValueDictionary()
# Held while a run checks that its store is free and claims it, as one step: engines may start
# runs in several threads (an event loop each), and a run starting between another's check and
# its claim would pass the check too. Re-entrant: a signal handler reading `QueryEngine.running`
# on a thread inside a claim may settle a run left in a closed loop, which releases its store.
_store_claims = ForkSafeLock()  # a forked child finds it free


def _store_key(store: SessionStore) -> object:
    """What identifies a store's records: a `JsonlSession`'s file (two objects may open one,
    as a server resuming the file for each request does), any other store itself."""
    from .sessions import JsonlSession

    if isinstance(store, JsonlSession):
        try:
            return store.path.resolve()
        except (OSError, RuntimeError):  # a symlink loop: the file cannot be opened anyway
            return store.path
    return id(store)


def holds_records(store: SessionStore | None) -> TypeGuard[JsonlSession]:
    """True when ``store`` is a `JsonlSession` whose file holds records already."""
    return _file_size(store) not in (None, 0)


def holds_messages(store: SessionStore | None) -> TypeGuard[JsonlSession]:
    """True when ``store`` is a `JsonlSession` whose file replays to a transcript of one
    message or more (or cannot be read: it may). A file of a torn first line only, of events
    only, or rewound to nothing by a checkpoint holds records, yet no conversation."""
    if not holds_records(store):
        return False
    from .sessions._load import load_file

    try:
        return bool(load_file(store.path, quiet=True).messages)
    except OSError:
        return True


def holds_no_records(store: SessionStore | None) -> bool:
    """True when ``store`` is a `JsonlSession` whose file is empty or not made yet."""
    return _file_size(store) == 0


def _emptied(store: SessionStore) -> bool:
    """True when ``store`` is a `JsonlSession` whose file is missing or a regular file holding
    nothing (a device or a pipe, such as ``os.devnull``, keeps nothing by design)."""
    from .sessions import JsonlSession

    if not isinstance(store, JsonlSession) or _file_size(store) != 0:
        return False
    try:
        return not store.path.exists() or store.path.is_file()
    except OSError:
        return False


def settle_tail(store: SessionStore) -> None:
    """Cut a `JsonlSession`'s torn last line now, rather than at its next append."""
    from .sessions import JsonlSession

    if isinstance(store, JsonlSession):
        store._settle_tail()


def _file_size(store: SessionStore | None) -> int | None:
    """The size of a `JsonlSession`'s file (0 when there is none yet); None for another store,
    a file that cannot be read, or a directory where the file should be."""
    from .sessions import JsonlSession

    if not isinstance(store, JsonlSession):
        return None
    try:
        st = store.path.stat()
    except FileNotFoundError:
        return 0
    except OSError:
        return None
    return None if stat.S_ISDIR(st.st_mode) else st.st_size  # a directory holds no records: it cannot be opened


def claim_store(engine: QueryEngine) -> None:
    """As a run starts: claim ``engine``'s session store for the run. Raises RuntimeError
    if another engine's run writes to it (or is starting on it), `SessionLockedError` if
    the store has another writer elsewhere (another process). `release_store` undoes it."""
    store = engine.session
    if store is None:
        return
    key = _store_key(store)
    _settle_left_writer(engine, key)
    with _store_claims:
        other = _store_writers.get(key)
        if other is not None and other is not engine and _writes_to(other, key):
            who = f" (agent_id={other.agent_id!r})" if other.agent_id else ""
            if other.session is store:
                fix = "a store records one transcript (give each engine its own, a subagent its own agent_id)"
            else:  # another session object on the same file: the file is what they share
                fix = (
                    "its file records one transcript, whichever session object writes it (give each "
                    "engine a file of its own: two JsonlSession objects on one file are one store)"
                )
            raise RuntimeError(f"the session store {store!r} is in use by another running engine{who}: {fix}")
        _store_writers[key] = engine
        engine._store_claimed = key
    acquire = getattr(store, "acquire", None)
    if acquire is not None:
        try:
            acquire()  # a JsonlSession's file lock: taken now, or the run's records go nowhere
        except SessionLockedError:
            release_store(engine)
            raise
        except Exception:  # a file it cannot open: each append fails too, and is listed
            pass


def _settle_left_writer(engine: QueryEngine, key: object) -> None:
    """The store's last writer, if its run was left in an event loop closed under it, is settled
    now (it is, at the latest, when next looked at): what it owes the store goes there before
    this run's records, not after them."""
    other = _store_writers.get(key)
    state = other._state if other is not None and other is not engine else None
    if other is not None and state is not None and state.loop.is_closed():
        from ._handle import forget_closed_run

        forget_closed_run(other, state)


def _writes_to(engine: QueryEngine, key: object) -> bool:
    """Whether ``engine``, found as the writer of store ``key``, still writes to it: its run
    is starting (claimed, no state yet) or going on in an open loop (a run left in an event
    loop that was closed under it writes no more, nor does one its host stopped iterating once
    its transcript is settled: what its cleanup still does in the background is not recorded)."""
    state = engine._state
    return (
        (state is None or not (state.loop.is_closed() or (state.released and state.finishing)))
        and engine.session is not None
        and _store_key(engine.session) == key
    )


def release_store(engine: QueryEngine) -> None:
    """As a run ends (or fails to start): ``engine`` no longer writes to its store."""
    key, engine._store_claimed = engine._store_claimed, None
    if key is not None:
        with _store_claims:
            if _store_writers.get(key) is engine:
                del _store_writers[key]


def catch_up_session(engine: QueryEngine) -> None:
    """As a run starts: record in the session what the host did to `messages` since the
    last commit (appended messages are appended; a rewound or edited transcript is written
    as a checkpoint), so that the session replays to the transcript the run starts from."""
    recorded = engine._recorded
    if engine.session is None or recorded is None:
        return
    if recorded:
        settle_tail(engine.session)  # a crash's torn only line is no record: cut it now
        if _emptied(engine.session):
            # The file holds none of what the engine took it to hold: its only line was torn,
            # or it was removed while released. The transcript goes there whole.
            engine._checkpoint_due = True
    messages = engine.messages
    due, engine._checkpoint_due = engine._checkpoint_due, False
    if not due and len(messages) >= len(recorded) and all(map(operator.is_, messages, recorded)):
        if len(messages) == len(recorded):
            return
        for message in messages[len(recorded) :]:  # appended by the host
            _append(engine, message)
    else:
        _checkpoint(engine, "a checkpoint of the transcript" + ("" if due else " the host rewrote"))
    engine._recorded = list(messages)


def record_message(engine: QueryEngine, message: Message) -> None:
    """Append ``message``, just committed, to ``engine``'s session. After a record the store
    failed to write (a full disk, a file deleted under it), the whole transcript is written as a
    checkpoint instead, so that the file replays to ``engine.messages`` again once it can."""
    checkpoint = getattr(engine.session, "append_checkpoint", None)
    if not engine._checkpoint_due or checkpoint is None:
        _append(engine, message)
        return
    engine._checkpoint_due = False
    _checkpoint(engine, f"a message ({message.role}), with the transcript before it")


def _checkpoint(engine: QueryEngine, what: str) -> None:
    """Write ``engine``'s whole transcript to its session as a checkpoint; a failure (or a store
    without ``append_checkpoint``) is recorded as ``what`` lost."""
    checkpoint = getattr(engine.session, "append_checkpoint", None)
    try:
        if checkpoint is None:
            raise TypeError(f"{type(engine.session).__name__} has no append_checkpoint()")
        checkpoint(list(engine.messages))
    except Exception as exc:
        record_lost(engine)
        engine._store_failed(what, exc)


def record_lost(engine: QueryEngine) -> None:
    """What ``engine``'s session holds no longer replays to its transcript (a message it failed
    to append): the next message is written with the whole transcript, if the store can."""
    if hasattr(engine.session, "append_checkpoint"):
        engine._checkpoint_due = True


def _append(engine: QueryEngine, message: Message) -> None:
    assert engine.session is not None
    try:
        engine.session.append_message(message)
    except Exception as exc:
        record_lost(engine)
        engine._store_failed(f"a message ({message.role})", exc)


def release_sidechain(engine: QueryEngine) -> None:
    """As a subagent's run ends: close the file of the sidechain `subagent()` gave it (a
    `JsonlSession` opens it again on its next append), rather than hold it open until the
    parent's session is closed. The sidechain is the parent's store's to close, not the child's."""
    release = getattr(engine.session, "release", None)
    if not engine._own_sidechain or release is None:
        return
    try:
        release()
    except Exception as exc:
        engine._store_failed("the end of its sidechain file (closing it)", exc)
