"""A process that forks (without exec) while its session file is open: the one-writer rule holds
in the child, and the parent's lock is neither released nor kept alive by the child."""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path
from typing import Any

import pytest

from agentloop import Message
from agentloop.sessions import JsonlSession, SessionLockedError

pytestmark = pytest.mark.skipif(not hasattr(os, "fork"), reason="POSIX: needs os.fork")

#: What the child reports through its exit status.
_REFUSED, _WROTE, _FAILED = 10, 11, 12


def _wait(pid: int) -> int:
    _, status = os.waitpid(pid, 0)
    return os.waitstatus_to_exitcode(status)


def _records(path: Path) -> list[str]:
    return [json.loads(line)["message"]["content"][0]["text"] for line in path.read_text().splitlines()]


def _in_child(action: str, session: JsonlSession) -> None:
    """The child's side: try ``action`` on the session it inherited; never returns."""
    code = _FAILED
    try:
        if action == "append":
            try:
                session.append_message(Message.user("from the child"))
            except SessionLockedError as exc:
                code = _REFUSED if exc.pid == os.getppid() else _FAILED
            else:
                code = _WROTE
        elif action == "close":
            session.close()
            code = _REFUSED
    except BaseException:
        code = _FAILED
    finally:
        os._exit(code)


@pytest.mark.parametrize("action", ["append", "close"])
def test_a_forked_child_cannot_write_nor_unlock_the_parents_session(tmp_path: Path, action: str) -> None:
    path = tmp_path / "s.jsonl"
    session = JsonlSession(path, fsync="always")
    session.append_message(Message.user("before the fork"))
    sys.stdout.flush(), sys.stderr.flush()
    pid = os.fork()
    if pid == 0:
        _in_child(action, session)
    assert _wait(pid) == _REFUSED
    session.append_message(Message.user("after the fork"))  # the parent goes on, its lock held
    with pytest.raises(SessionLockedError):
        JsonlSession(path).acquire()
    session.close()
    assert _records(path) == ["before the fork", "after the fork"]


def test_a_forked_child_does_not_keep_the_lock_once_the_parent_closes(tmp_path: Path) -> None:
    path = tmp_path / "s.jsonl"
    session = JsonlSession(path)
    session.append_message(Message.user("before the fork"))
    go_on_r, go_on_w = os.pipe()
    ready_r, ready_w = os.pipe()
    sys.stdout.flush(), sys.stderr.flush()
    pid = os.fork()
    if pid == 0:  # a worker that never touches the session, and outlives the parent's use of it
        os.close(go_on_w)
        os.write(ready_w, b"x")  # running: whatever it inherited and let go of is gone by now
        os.read(go_on_r, 1)
        os._exit(0)
    os.close(go_on_r)
    os.close(ready_w)
    try:
        assert os.read(ready_r, 1) == b"x"
        os.close(ready_r)
        session.close()
        with JsonlSession(path) as again:  # before, the child's copy of the descriptor kept the lock
            again.append_message(Message.user("after the close"))
    finally:
        os.close(go_on_w)
        assert _wait(pid) == 0
    assert _records(path) == ["before the fork", "after the close"]


def test_a_forked_child_writes_once_the_parent_has_let_go(tmp_path: Path) -> None:
    path = tmp_path / "s.jsonl"
    session = JsonlSession(path)
    session.append_message(Message.user("parent"))
    ready_r, ready_w = os.pipe()
    sys.stdout.flush(), sys.stderr.flush()
    pid = os.fork()
    if pid == 0:
        os.close(ready_w)
        os.read(ready_r, 1)  # the parent has closed its session
        code = _FAILED
        try:
            session.append_message(Message.user("child"))
            session.close()
            code = _WROTE
        finally:
            os._exit(code)
    os.close(ready_r)
    session.close()
    os.write(ready_w, b"x")
    os.close(ready_w)
    assert _wait(pid) == _WROTE
    assert _records(path) == ["parent", "child"]


@pytest.mark.parametrize(
    ("held_in", "child", "records"),
    [
        ("make_dirs", _WROTE, ["from the child", "parent"]),  # nothing opened yet: the child may write
        ("_identify", _REFUSED, ["parent"]),  # opened and locked, not yet listed as open
    ],
)
def test_a_child_forked_while_another_thread_opens_the_session_keeps_one_writer(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, held_in: str, child: int, records: list[str]
) -> None:
    """A thread of the parent was opening the session's file as the process forked. Held before
    the open (its thread lock taken), the child's first append waited for that thread for ever: it
    is not in the child. Held once the file was open and locked but before the session was listed
    as open, the child kept the parent's descriptor and wrote through the parent's lock. The
    child finds the thread lock free, and lets go of what it inherited."""
    import signal
    import threading

    from agentloop.sessions import _store

    path = tmp_path / "new" / "s.jsonl"
    session = JsonlSession(path)
    entered, go_on = threading.Event(), threading.Event()
    owner = _store if held_in == "make_dirs" else JsonlSession
    real = getattr(owner, held_in)

    def hold(*args: object) -> object:
        if threading.current_thread().name == "opener":  # held there, the session's lock taken
            entered.set()
            go_on.wait()
        return real(*args)

    monkeypatch.setattr(owner, held_in, hold)
    opener = threading.Thread(target=session.acquire, name="opener")
    opener.start()
    try:
        assert entered.wait(timeout=60)
        sys.stdout.flush(), sys.stderr.flush()
        pid = os.fork()
        if pid == 0:
            signal.alarm(20)  # a child stuck on the lock ends, and the test fails, rather than hanging
            _in_child("append", session)
        assert _wait(pid) == child
    finally:
        go_on.set()
        opener.join()
    session.append_message(Message.user("parent"))
    session.close()
    assert _records(path) == records


def _holds_a_descriptor_of(path: Path) -> bool:
    """Whether this process has a descriptor open on the file at ``path``."""
    named = os.stat(path)
    listing = "/proc/self/fd" if os.path.isdir("/proc/self/fd") else "/dev/fd"
    for name in os.listdir(listing):
        try:
            if os.path.samestat(os.fstat(int(name)), named):
                return True
        except OSError:  # the listing's own descriptor, closed by now
            pass
    return False


@pytest.mark.parametrize("step", ["open", "close"])
def test_a_child_forked_as_another_thread_makes_or_closes_the_descriptor_inherits_none(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, step: str
) -> None:
    """A thread of the parent had made the session's descriptor (``os.open`` returned) but not yet
    kept it, or had let go of it but not yet closed it, as another thread forked: the child
    inherited a descriptor its session did not know of, so it could not let go of it, and with it
    kept the parent's lock after the parent closed the file. A fork waits for that step to end."""
    import signal
    import threading

    from agentloop._forklock import ForkSafeLock
    from agentloop.sessions import _store

    path = tmp_path / "s.jsonl"
    session = JsonlSession(path)
    if step == "close":
        session.acquire()
    in_step, go_on = threading.Event(), threading.Event()
    real_open, real_close = os.open, os.close

    def stop_in_step() -> None:
        if threading.current_thread().name == "worker":
            in_step.set()
            go_on.wait()

    def open_(*args: Any, **kwargs: Any) -> int:
        fd = real_open(*args, **kwargs)
        stop_in_step()  # made, not yet kept
        return fd

    def close(fd: int) -> None:
        stop_in_step()  # let go of, not yet closed
        real_close(fd)

    class Guard(ForkSafeLock):
        """The store's guard, which lets the worker go on once a fork waits for it."""

        __slots__ = ()

        def acquire(self, blocking: bool = True, timeout: float = -1) -> bool:
            if threading.current_thread() is threading.main_thread():
                go_on.set()
            return super().acquire(blocking, timeout)

    monkeypatch.setattr(_store, "_FD_GUARD", Guard(), raising=False)
    monkeypatch.setattr(os, "open" if step == "open" else "close", open_ if step == "open" else close)
    worker = threading.Thread(target=session.acquire if step == "open" else session.release, name="worker")
    worker.start()
    try:
        assert in_step.wait(timeout=60)
        sys.stdout.flush(), sys.stderr.flush()
        pid = os.fork()
        if pid == 0:
            signal.alarm(20)
            code = _FAILED
            try:
                code = _WROTE if _holds_a_descriptor_of(path) else _REFUSED
            finally:
                os._exit(code)
        assert _wait(pid) == _REFUSED  # the child holds no descriptor of the file
    finally:
        go_on.set()
        worker.join()
        monkeypatch.undo()
        session.close()
    with JsonlSession(path) as again:
        again.acquire()
