"""Stopping a stdio MCP server, as the MCP spec says, and what it left in its process group.

Close its stdin, give the server `_EXIT_GRACE` s to exit, SIGTERM its process group, and
SIGKILL it `_EXIT_GRACE` s later; what the group still holds once the server is gone is
stopped the same way. The caller's cancellation waits for all of it (`agentloop._process.uncancellable`).
"""

from __future__ import annotations

import asyncio
import logging
import signal
from typing import TYPE_CHECKING, Any

from .._process import group_alive as _group_alive
from .._process import signal_group

if TYPE_CHECKING:
    from ._child import ServerChild
    from ._stdio import Pipes

log = logging.getLogger("agentloop")

_EXIT_GRACE = 2.0  # seconds a server has to exit once its stdin is closed, and again once TERMed


async def stop(child: ServerChild, pipes: Pipes) -> None:
    """Stop the server as the MCP spec says (stdin closed, then SIGTERM, then SIGKILL), stop what
    it left in its process group, and close the pipes."""
    pgid = child.pid
    if 0 in pipes.open:
        child.close_stdin(pipes)  # after what is queued: the server reads to the end, then exits
    for sig in (signal.SIGTERM, signal.SIGKILL):
        if await _within(pipes.exited, _EXIT_GRACE):
            break
        signal_group(pgid, sig)
    else:
        if not await _within(pipes.exited, _EXIT_GRACE):
            log.warning("MCP server %s: its process %d is still alive after SIGKILL; leaving it", pipes.label, pgid)
    if pipes.exited.done():
        await _stop_group(pgid, pipes.label)
    child.close()
    for fd in (0, 1, 2):
        if fd in pipes.open:
            pipes.pipe_connection_lost(fd)


async def _stop_group(pgid: int, label: str) -> None:
    """Stop the processes the server left in its group (SIGTERM, then SIGKILL `_EXIT_GRACE` s
    later): a child holding its pipes, helpers it started."""
    if not _group_alive(pgid):
        return
    log.info("MCP server %s exited leaving processes in its group; stopping them", label)
    signal_group(pgid, signal.SIGTERM)
    deadline = asyncio.get_running_loop().time() + _EXIT_GRACE
    while _group_alive(pgid):  # they are not our children: nothing to wait on but the group
        if asyncio.get_running_loop().time() >= deadline:
            signal_group(pgid, signal.SIGKILL)
            return
        await asyncio.sleep(0.02)


async def _within(future: asyncio.Future[Any], seconds: float) -> bool:
    """Whether ``future`` is done within ``seconds`` (it is not cancelled otherwise)."""
    if not future.done():
        await asyncio.wait((future,), timeout=seconds)
    return future.done()
