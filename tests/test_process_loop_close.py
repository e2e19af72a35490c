"""run_process in a loop the host closes under it: nothing is left for the garbage collector."""

from __future__ import annotations

import asyncio
import concurrent.futures
import contextlib
import os
import signal
import subprocess
import sys
import threading
from pathlib import Path
from typing import Any

import pytest

from agentloop import (
    AbortController,
    AbortError,
    QueryEngine,
    ScriptedModel,
    ScriptedResponse,
    ScriptedToolCall,
    ToolContext,
    run_process,
    tool,
)
from tests.helpers import VirtualClock, child_pids_alive, collect_garbage, pid_alive

WAIT = 10.0
left: list[asyncio.Task[Any]] = []  # the tasks a host's main leaves running as it returns


@pytest.mark.parametrize("steps", range(8))
def test_asyncio_run_returning_while_a_call_starts_or_waits_leaves_nothing(steps: int) -> None:
    # asyncio.run cancels every task left, the ones asyncio itself made to connect the child's
    # pipes among them: cancelled before they ran, a pipe was never handed to a transport, and
    # its file was left for the garbage collector ("unclosed file"), to fail a later test.
    async def main() -> None:
        left.append(asyncio.create_task(run_process("sleep", "30", signal=AbortController().signal)))
        for _ in range(steps):  # each step a little further into the call
            await asyncio.sleep(0)

    asyncio.run(main())
    left.clear()
    assert collect_garbage() == []
    assert child_pids_alive() == set()


def test_asyncio_run_returning_while_a_tool_runs_a_process_leaves_nothing() -> None:
    @tool
    async def build(ctx: ToolContext) -> str:
        """Build it."""
        started.set()
        return (await run_process("sleep", "30", signal=ctx.signal)).stdout

    async def main() -> None:
        engine = QueryEngine(ScriptedModel([ScriptedResponse(tool_calls=[ScriptedToolCall("build")]), "Built."]), tools=[build])

        async def pump() -> None:
            async for _ in engine.run("Build it"):
                pass

        left.append(asyncio.create_task(pump()))
        await started.wait()

    started = asyncio.Event()
    asyncio.run(main())
    left.clear()
    assert collect_garbage() == []
    assert child_pids_alive() == set()


def _loop_in_a_thread() -> tuple[asyncio.AbstractEventLoop, threading.Thread]:
    loop = asyncio.new_event_loop()
    thread = threading.Thread(target=loop.run_forever)
    thread.start()
    return loop, thread


async def _started_call(started: threading.Event) -> Any:
    """A call waiting on its child, ``started`` set once the child runs (it has written a line)."""
    code = "import time; print('up', flush=True); time.sleep(30)"
    call = asyncio.ensure_future(run_process(sys.executable, "-c", code, signal=AbortController().signal))
    while not child_pids_alive():
        await asyncio.sleep(0)
    started.set()
    return await call


@pytest.mark.closes_loop_under_tasks
def test_a_loop_stopped_from_another_thread_and_closed_under_a_call_leaves_nothing() -> None:
    # An editor plugin's loop: stopped from the UI thread and closed, nothing cancelled. The call's
    # cleanup never runs there; the group is killed when the call is collected, and its pipes and
    # process must go with it, not be left to complain as the garbage collector finds them.
    loop, thread = _loop_in_a_thread()
    started = threading.Event()
    future: concurrent.futures.Future[Any] | None = asyncio.run_coroutine_threadsafe(_started_call(started), loop)
    assert started.wait(WAIT)
    loop.call_soon_threadsafe(loop.stop)
    thread.join(WAIT)
    loop.close()
    del future
    assert collect_garbage() == []
    assert child_pids_alive() == set()


def _no_pidfds(pid: int) -> int:
    raise OSError("no pidfds here")


async def test_without_pidfds_the_exit_is_seen_by_polling(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr("os.pidfd_open", _no_pidfds)
    result = await run_process(sys.executable, "-c", "print('hi'); raise SystemExit(3)", signal=AbortController().signal)
    assert (result.returncode, result.stdout) == (3, "hi\n")


@pytest.mark.parametrize("keyword", ["shell", "text", "universal_newlines", "encoding", "errors"])
async def test_a_text_mode_or_a_shell_is_refused_before_the_child_starts(keyword: str) -> None:
    with pytest.raises(ValueError, match=keyword):
        await run_process("true", signal=AbortController().signal, **{keyword: "utf-8" if keyword in ("encoding", "errors") else True})


async def test_no_command_is_a_type_error() -> None:
    with pytest.raises(TypeError, match="command"):
        await run_process(signal=AbortController().signal)


@pytest.mark.closes_loop_under_tasks
@pytest.mark.parametrize("pidfds", [True, False])
def test_the_group_of_a_call_is_killed_as_its_loop_is_closed_while_the_host_still_holds_the_call(
    pidfds: bool, monkeypatch: pytest.MonkeyPatch
) -> None:
    # The host keeps the future of the call (its plugin object lives on): nothing collects the call,
    # and its group, in a session of its own, ran on after the loop was closed, for as long as the host.
    if not pidfds:  # the exit is polled for, by a task of the loop that the close leaves behind
        monkeypatch.setattr("os.pidfd_open", _no_pidfds)
    loop, thread = _loop_in_a_thread()
    started = threading.Event()
    future = asyncio.run_coroutine_threadsafe(_started_call(started), loop)
    assert started.wait(WAIT)
    (pid,) = child_pids_alive()
    loop.call_soon_threadsafe(loop.stop)
    thread.join(WAIT)
    loop.close()
    assert not pid_alive(pid)  # gone once close() has returned
    assert not future.done()
    del future
    assert collect_garbage() == []


_HOST = r"""
import asyncio, sys, threading
from agentloop import AbortController, run_process

async def call():
    up = asyncio.Event()
    code = "import time; print('up', flush=True); time.sleep(60)"
    task = asyncio.ensure_future(run_process(sys.executable, "-c", code, signal=AbortController().signal,
                                             on_line=lambda _: up.set()))
    await up.wait()
    return task

loop = asyncio.new_event_loop()
threading.Thread(target=loop.run_forever, daemon=True).start()
task = asyncio.run_coroutine_threadsafe(call(), loop).result(30)
import os
print(" ".join(p for t in os.listdir("/proc/self/task") for p in open(f"/proc/self/task/{t}/children").read().split()), flush=True)
# the host returns from main with the loop still running in its daemon thread
"""


def test_a_host_exiting_with_a_call_in_a_daemon_threads_loop_leaves_no_group_behind(tmp_path: Path) -> None:
    # Nothing stops a daemon thread's loop at exit: the call's group, in a session of its own,
    # outlived the host.
    host = tmp_path / "host.py"
    host.write_text(_HOST)
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(sys.path)}
    done = subprocess.run([sys.executable, str(host)], capture_output=True, text=True, timeout=60, env=env)
    assert done.returncode == 0, done.stderr
    pids = [int(p) for p in done.stdout.split()]
    try:
        assert len(pids) == 1
        assert not pid_alive(pids[0])
    finally:
        for pid in pids:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(pid, signal.SIGKILL)


async def test_a_call_outlasting_its_loop_close_guard_timer_is_not_killed_by_it() -> None:
    # The timer that kills the group as the loop closes never fires in real time (months); a loop
    # whose clock jumps (a fake clock) reaches it, and the call goes on: only a closing loop kills.
    with VirtualClock():
        code = "import time; time.sleep(0.3); print('done')"
        result = await run_process(sys.executable, "-c", code, signal=AbortController().signal)
    assert (result.returncode, result.stdout) == (0, "done\n")


async def test_a_loop_whose_timer_handles_cannot_be_weakly_referenced_still_runs_and_stops_calls() -> None:
    """The guard timer is watched through a weak reference to its handle: on a loop whose
    handles take none (another loop implementation), `run_process` raised TypeError."""

    class Unreferable:
        __slots__ = ("handle",)

        def __init__(self, handle: asyncio.TimerHandle) -> None:
            self.handle = handle

        def cancel(self) -> None:
            self.handle.cancel()

    loop = asyncio.get_running_loop()
    real = loop.call_later
    loop.call_later = lambda delay, callback, *args, **kw: Unreferable(real(delay, callback, *args, **kw))  # type: ignore[assignment, method-assign, return-value]
    try:
        done = await run_process(sys.executable, "-c", "print('done')", signal=AbortController().signal)
        controller = AbortController()
        stopped = asyncio.ensure_future(run_process("sleep", "30", signal=controller.signal))
        await asyncio.sleep(0)
        controller.abort("stop")
        with pytest.raises(AbortError, match="stop"):
            await asyncio.wait_for(stopped, WAIT)
    finally:
        del loop.call_later
    assert (done.returncode, done.stdout) == (0, "done\n")
