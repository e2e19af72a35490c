"""run_process in a loop the host closes under it: nothing is left for the garbage collector."""

from __future__ import annotations

import asyncio
import concurrent.futures
import sys
import threading
from typing import Any

import pytest

from agentloop import (
    AbortController,
    QueryEngine,
    ScriptedModel,
    ScriptedResponse,
    ScriptedToolCall,
    ToolContext,
    run_process,
    tool,
)
from tests.helpers import child_pids_alive, collect_garbage

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


async def test_without_pidfds_the_exit_is_seen_by_polling(monkeypatch: pytest.MonkeyPatch) -> None:
    def no_pidfds(pid: int) -> int:
        raise OSError("no pidfds here")

    monkeypatch.setattr("os.pidfd_open", no_pidfds)
    result = await run_process(sys.executable, "-c", "print('hi'); raise SystemExit(3)", signal=AbortController().signal)
    assert (result.returncode, result.stdout) == (3, "hi\n")


@pytest.mark.parametrize("keyword", ["shell", "text", "universal_newlines", "encoding", "errors"])
async def test_a_text_mode_or_a_shell_is_refused_before_the_child_starts(keyword: str) -> None:
    with pytest.raises(ValueError, match=keyword):
        await run_process("true", signal=AbortController().signal, **{keyword: "utf-8" if keyword in ("encoding", "errors") else True})


async def test_no_command_is_a_type_error() -> None:
    with pytest.raises(TypeError, match="command"):
        await run_process(signal=AbortController().signal)
