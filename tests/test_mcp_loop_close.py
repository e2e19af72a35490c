"""An MCP stdio server starting or running when the host's asyncio.run returns: nothing is left."""

from __future__ import annotations

import asyncio
import sys
import threading
from pathlib import Path
from typing import Any

import pytest

from agentloop.mcp import MCPServer
from tests.helpers import child_pids_alive, pid_alive
from tests.test_process_loop_close import collect_garbage

SERVER = str(Path(__file__).with_name("mcp_server.py"))
WAIT = 30.0
left: list[asyncio.Task[Any]] = []  # the tasks a host's main leaves running as it returns

# Step 1 is left out: asyncio.run returning then cancels the SDK's session reader (an anyio task)
# before it ever ran, and anyio's TaskGroup.start waits for it for good (see docs/mcp.md).
STEPS = [0, *range(2, 16)]


@pytest.mark.parametrize("steps", STEPS)
def test_asyncio_run_returning_while_a_stdio_server_starts_leaves_nothing(steps: int) -> None:
    # asyncio.run cancels every task left, asyncio's own pipe-connecting task among them: a pipe
    # never handed to a transport was left for the garbage collector, and the server ran on.
    async def main() -> None:
        server = MCPServer.stdio(sys.executable, [SERVER])
        left.append(asyncio.create_task(server.list_tools()))
        for _ in range(steps):  # each step a little further into the start
            await asyncio.sleep(0)

    asyncio.run(main())
    left.clear()
    assert collect_garbage() == []
    assert child_pids_alive() == set()


def test_asyncio_run_returning_while_a_stdio_server_runs_leaves_nothing() -> None:
    async def main() -> None:
        server = MCPServer.stdio(sys.executable, [SERVER])
        assert [t.name for t in await server.list_tools()]  # started and answering
        left.append(asyncio.create_task(server.list_tools()))
        await asyncio.sleep(0)

    asyncio.run(main())
    left.clear()
    assert collect_garbage() == []
    assert child_pids_alive() == set()


@pytest.mark.closes_loop_under_tasks
def test_a_stdio_server_is_killed_as_its_loop_is_closed_from_another_thread() -> None:
    # An editor plugin's loop, stopped from the UI thread and closed, the MCPServer still held by the
    # plugin: nothing ran the server's stop, and the server, in a session of its own, ran on.
    loop = asyncio.new_event_loop()
    thread = threading.Thread(target=loop.run_forever)
    thread.start()
    server = MCPServer.stdio(sys.executable, [SERVER])
    tools = asyncio.run_coroutine_threadsafe(server.list_tools(), loop).result(WAIT)
    assert tools  # started and answering
    (pid,) = child_pids_alive()
    loop.call_soon_threadsafe(loop.stop)
    thread.join(WAIT)
    loop.close()
    assert not pid_alive(pid)  # gone once close() has returned
    del server, tools
    assert collect_garbage() == []
