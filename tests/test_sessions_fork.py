"""A process that forks (without exec) while its session file is open: the one-writer rule holds
in the child, and the parent's lock is neither released nor kept alive by the child."""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path

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
