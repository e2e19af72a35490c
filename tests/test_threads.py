"""Control calls and run objects met from other threads, other event loops, or a loop not running."""

from __future__ import annotations

import asyncio
import faulthandler
import gc
import os
import subprocess
import sys
import threading
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from agentloop import QueryEngine
from agentloop.testing import assert_valid
from tests.helpers import HangingModel


def _drain(loop: asyncio.AbstractEventLoop) -> None:
    """Let ``loop`` run what was left on it, then close it."""
    loop.run_until_complete(asyncio.sleep(0))
    loop.run_until_complete(loop.shutdown_asyncgens())
    loop.close()


def test_a_run_dropped_while_its_loop_is_not_running_is_settled_at_once() -> None:
    model = HangingModel(prefix=("Hello ", "wor"))
    engine = QueryEngine(model)
    loop = asyncio.new_event_loop()
    try:
        run = engine.run("go")
        for _ in range(3):  # TurnStarted and both deltas: the model now waits
            loop.run_until_complete(run.__anext__())  # type: ignore[arg-type]
        del run
        gc.collect()
        # The loop is not running: nothing else would settle the transcript before it runs again.
        assert not engine.running
        assert [m.role for m in engine.messages] == ["user", "assistant"]
        assert engine.messages[1].content[0].text == "Hello wor"  # type: ignore[union-attr]
        assert_valid(engine.messages)
    finally:
        _drain(loop)
    assert [m.role for m in engine.messages] == ["user", "assistant"]  # settled once


class _Interleaved(list):  # type: ignore[type-arg]
    """A queue that, at its ``at``-th access, lets another thread run ``meanwhile`` to its end."""

    def __init__(self, items: list[object], at: int, meanwhile: Callable[[], object]) -> None:
        super().__init__(items)
        self.at = at
        self.meanwhile = meanwhile
        self.seen = 0

    def _access(self) -> None:
        self.seen += 1
        if self.seen == self.at:
            other = threading.Thread(target=self.meanwhile)
            other.start()
            other.join()

    def __iter__(self) -> Iterator[object]:
        self._access()
        return super().__iter__()

    def __len__(self) -> int:
        self._access()
        return super().__len__()

    def __getitem__(self, index: Any) -> Any:
        self._access()
        return super().__getitem__(index)

    def __setitem__(self, index: Any, value: Any) -> None:
        self._access()
        super().__setitem__(index, value)


@settings(max_examples=30, deadline=None)
@given(at=st.integers(min_value=1, max_value=6))
def test_a_send_now_from_another_thread_as_a_run_not_begun_is_dropped_is_kept(at: int) -> None:
    gc.freeze()  # what the test process holds already: the collection below need not walk it
    try:
        _drop_a_run_not_begun(at)
    finally:
        gc.unfreeze()


def _drop_a_run_not_begun(at: int) -> None:
    engine = QueryEngine(HangingModel())
    run = engine.run("go")
    first = engine.send_now("typed after the prompt")  # for the run made: it begins aborted
    receipts = [first]
    inbox = engine.inbox
    inbox.send_now = _Interleaved(list(inbox.send_now), at, lambda: receipts.append(engine.send_now("from a thread")))
    del run  # dropped before its first step: its send-now text waits for the next run
    gc.collect()
    if len(receipts) == 1:  # the queue was read less than `at` times
        receipts.append(engine.send_now("from a thread"))
    queued = {q.id: q for q in inbox.send_now}
    assert set(queued) == set(receipts)  # no text is lost
    assert not queued[first].late


_HANDLER_READS_RUNNING = """
import asyncio, faulthandler, os, signal
from agentloop import QueryEngine, ScriptedModel, ScriptedResponse
from agentloop import _recording
from agentloop.sessions import JsonlSession

faulthandler.dump_traceback_later(20, exit=True)  # a deadlock ends the process, with a traceback
left = QueryEngine(ScriptedModel([ScriptedResponse(text="word " * 40, chunk=5, delay=0.01)]),
                   session=JsonlSession("left.jsonl"))
loop = asyncio.new_event_loop()
run = left.run("first")
loop.run_until_complete(run.__anext__())
loop.close()  # the run is left in a closed loop: the next read of `running` settles it

# The Ctrl-C handler of the cookbook, reading `running` to tell a second Ctrl-C from a first.
signal.signal(signal.SIGUSR1, lambda *_: print("running:", left.running))


class Writers(type(_recording._store_writers)):
    signalled = False

    def get(self, key, default=None):  # called with the store claims held: the signal lands here
        if not self.signalled:
            self.signalled = True
            os.kill(os.getpid(), signal.SIGUSR1)
        return super().get(key, default)


_recording._store_writers = Writers()
engine = QueryEngine(ScriptedModel(["ok"]), session=JsonlSession("other.jsonl"))


async def main() -> None:
    async for _ in engine.run("hi"):
        pass


asyncio.run(main())
for store in (left.session, engine.session):  # closed here, not left to the interpreter's teardown
    store.close()
print("done")
"""


def test_a_signal_handler_reading_running_as_another_run_claims_its_store_does_not_deadlock(tmp_path: Path) -> None:
    """A Ctrl-C handler reading `engine.running` (of an engine whose run was left in a closed
    loop) landed while a run starting on the same thread held the session stores' claim lock:
    settling the left run took that lock again, and the process hung for good."""
    script = tmp_path / "handler.py"
    script.write_text(_HANDLER_READS_RUNNING, encoding="utf-8")
    proc = subprocess.run(
        [sys.executable, "-W", "error", str(script)], cwd=tmp_path, capture_output=True, text=True, timeout=50,
        env=dict(os.environ, PYTHONPATH=str(Path(__file__).resolve().parent.parent)),
    )
    assert (proc.returncode, proc.stdout, proc.stderr) == (0, "running: False\ndone\n", "")


@pytest.mark.skipif(not hasattr(os, "fork"), reason="os.fork")
def test_a_child_forked_while_another_thread_claims_a_store_runs_with_a_session(tmp_path: Path) -> None:
    from agentloop import _recording
    from agentloop.sessions import JsonlSession
    from agentloop.testing import ScriptedModel, collect

    held, done = threading.Event(), threading.Event()

    def claiming() -> None:  # a run starting in another thread, inside its claim as the fork happens
        with _recording._store_claims:
            held.set()
            done.wait(30)

    other = threading.Thread(target=claiming)
    other.start()
    try:
        assert held.wait(10)
        code = os.fork()
        if code == 0:  # the child: exit status 0 if its run ends, whatever happens
            status = 2
            try:
                faulthandler.dump_traceback_later(30, exit=True)  # a deadlock ends the child too
                engine = QueryEngine(ScriptedModel(["ok"]), session=JsonlSession(tmp_path / "child.jsonl"))
                asyncio.run(collect(engine.run("hi")))
                status = 0 if engine.messages[-1].text == "ok" else 1
            finally:
                os._exit(status)
        _, status = os.waitpid(code, 0)
    finally:
        done.set()
        other.join()
    assert os.waitstatus_to_exitcode(status) == 0


def test_a_run_left_in_a_closed_loop_settles_before_another_engine_takes_its_session(tmp_path: Path) -> None:
    """Engine A's run was left in a loop closed under it; engine B ran with A's session object.
    A's run was settled only when A was next looked at, and its streamed text was appended to
    the file after B's conversation: the file replayed to neither transcript."""
    from agentloop import ScriptedResponse
    from agentloop.sessions import JsonlSession
    from agentloop.testing import ScriptedModel, collect

    store = JsonlSession(tmp_path / "s.jsonl")
    left = QueryEngine(ScriptedModel([ScriptedResponse(text="word " * 40, chunk=5, delay=0.01)]), session=store)
    loop = asyncio.new_event_loop()
    run = left.run("first")
    loop.run_until_complete(run.__anext__())  # type: ignore[arg-type]
    loop.run_until_complete(run.__anext__())  # type: ignore[arg-type]
    loop.close()
    engine = QueryEngine(ScriptedModel(["ok"]), session=store)
    asyncio.run(collect(engine.run("second")))
    assert not left.running
    store.close()
    reopened, loaded = JsonlSession.resume(tmp_path / "s.jsonl")
    reopened.close()
    assert [m.text for m in loaded.messages] == [m.text for m in engine.messages] == ["second", "ok"]
    assert [m.text for m in left.messages] == ["first", "word"]


def test_two_threads_starting_runs_of_one_engine_at_once_get_one_run_and_one_error() -> None:
    """Each thread runs its own event loop; the second run() began while the first was between
    its check for a run in progress and putting its state in place: both ran, and both wrote
    into the one transcript."""
    from agentloop.testing import ScriptedModel, collect

    engine = QueryEngine(ScriptedModel(["one", "two"]), policies=[])
    inside, second_done = threading.Event(), threading.Event()
    vet = engine._vet_history

    def slow_vet() -> None:  # the first run is descheduled here, after its check
        if not inside.is_set():
            inside.set()
            second_done.wait(10)
        vet()

    engine._vet_history = slow_vet  # type: ignore[method-assign]
    outcomes: dict[str, object] = {}

    def start(name: str) -> None:
        try:
            outcomes[name] = asyncio.run(collect(engine.run(name)))
        except RuntimeError as exc:
            outcomes[name] = exc
        finally:
            if name == "second":
                second_done.set()

    first = threading.Thread(target=start, args=("first",))
    first.start()
    assert inside.wait(10)
    start("second")
    first.join(10)
    assert isinstance(outcomes["second"], RuntimeError) and "in progress" in str(outcomes["second"])
    assert [m.text for m in engine.messages] == ["first", "one"]


@pytest.mark.skipif(not hasattr(os, "fork"), reason="os.fork")
def test_the_claim_locks_share_one_lock_a_forked_child_finds_free() -> None:
    """The policies' and the session stores' claim locks are one kind of lock, renewed in a
    forked child by one mechanism: a child forked while another thread held either takes it."""
    from agentloop import _policy, _recording
    from agentloop._forklock import ForkSafeLock

    locks = [_policy._claiming, _recording._store_claims]
    assert all(type(lock) is ForkSafeLock for lock in locks)
    held, done = threading.Event(), threading.Event()

    def holding() -> None:
        with locks[0], locks[1]:
            held.set()
            done.wait(30)

    other = threading.Thread(target=holding)
    other.start()
    try:
        assert held.wait(10)
        code = os.fork()
        if code == 0:
            status = 2
            try:
                faulthandler.dump_traceback_later(30, exit=True)
                status = 0 if all(lock.acquire(timeout=5) for lock in locks) else 1
            finally:
                os._exit(status)
        _, status = os.waitpid(code, 0)
    finally:
        done.set()
        other.join()
    assert os.waitstatus_to_exitcode(status) == 0
    with locks[0], locks[0]:  # re-entrant
        pass


@pytest.mark.skipif(not hasattr(os, "fork"), reason="os.fork")
def test_a_child_forked_while_its_own_thread_held_the_claim_lock_releases_it() -> None:
    """The lock was made afresh in every forked child, also in one forked while its own thread
    held it (``with lock: os.fork()``): leaving the ``with`` in the child then raised
    RuntimeError ("cannot release un-acquired lock"). The owning thread's hold goes on in the
    child: it releases it, nested holds too, and the lock is free after."""
    from agentloop._forklock import ForkSafeLock

    lock = ForkSafeLock()
    with lock, lock:
        code = os.fork()
        if code == 0:
            status = 2
            try:
                faulthandler.dump_traceback_later(30, exit=True)
                lock.release()
                lock.release()
                got: list[bool] = []

                def take() -> None:
                    got.append(lock.acquire(timeout=5))
                    if got[0]:
                        lock.release()

                free = threading.Thread(target=take)
                status = 3
                free.start()
                free.join(10)
                status = 0 if got == [True] else 4  # another thread takes the lock: it is free
            except RuntimeError:
                status = 1
            finally:
                os._exit(status)
    _, status = os.waitpid(code, 0)
    assert os.waitstatus_to_exitcode(status) == 0


def test_fork_safe_locks_share_one_at_fork_callback(monkeypatch: pytest.MonkeyPatch) -> None:
    """Each lock registered an at-fork callback of its own, never removed: a process making many
    locks gathered callbacks for ever. One registration of the module renews them all."""
    from agentloop import _forklock

    registered: list[object] = []
    monkeypatch.setattr(os, "register_at_fork", lambda **kw: registered.append(kw), raising=False)
    made = [_forklock.ForkSafeLock() for _ in range(50)]
    assert registered == [] and len(made) == 50
