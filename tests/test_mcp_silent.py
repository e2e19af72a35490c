"""An MCP server that never answers initialize or tools/list: a call waiting for it is bounded."""

from __future__ import annotations

import asyncio
import sys
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest

from agentloop import (
    QueryEngine,
    ScriptedModel,
    ScriptedResponse,
    ScriptedToolCall,
    ToolCallFinished,
    ToolCallStarted,
    TurnEnded,
)
from agentloop.mcp import MCPServer
from tests.helpers import child_pids_alive

RAW_SERVER = str(Path(__file__).with_name("mcp_raw_server.py"))


@pytest.fixture(autouse=True)
async def no_server_left() -> AsyncIterator[None]:
    before = child_pids_alive()
    yield
    assert child_pids_alive() - before == set()


async def _restarted(mute: str, starts: Path, **options: Any) -> tuple[MCPServer, list[Any]]:
    """A server whose tools were listed, then restarted as a process that never answers ``mute``."""
    srv = MCPServer.stdio(sys.executable, [RAW_SERVER, "--starts", str(starts), f"--mute-{mute}-from", "2"], **options)
    async with asyncio.timeout(30):
        srv_tools = await srv.list_tools()
    assert "pid" in {t.name for t in srv_tools}
    await srv.reset()  # the next call starts the second process
    return srv, srv_tools


def _engine(srv: MCPServer, tools: list[Any]) -> QueryEngine:
    model = ScriptedModel([ScriptedResponse(tool_calls=[ScriptedToolCall("pid", {})]), "ok"])
    engine = QueryEngine(model, tools=tools, policies=[], tool_cancel_grace=0.5)
    srv.attach(engine)
    return engine


async def _first_call(srv: MCPServer, tools: list[Any]) -> ToolCallFinished:
    """Run an engine that calls ``pid`` once, and give back that call's end."""
    async with asyncio.timeout(30):
        events = [e async for e in _engine(srv, tools).run("go")]
    [finished] = [e for e in events if isinstance(e, ToolCallFinished)]
    return finished


@pytest.mark.parametrize("mute", ["init", "list"])
async def test_an_abort_reaches_a_call_waiting_for_a_server_that_never_answers(mute: str, tmp_path: Path) -> None:
    # Without a connect_timeout, the first call on a new connection waits for initialize (and for
    # the listing before it is sent): an interrupt must end it, and the server process with it.
    before = child_pids_alive()
    srv, tools = await _restarted(mute, tmp_path / "starts", connect_timeout=None)
    try:
        engine = _engine(srv, tools)
        events = []
        async with asyncio.timeout(30):
            async for event in engine.run("go"):
                events.append(event)
                if isinstance(event, ToolCallStarted):
                    asyncio.get_running_loop().call_later(0.3, engine.interrupt)
        ends = [e for e in events if isinstance(e, TurnEnded)]
        assert ends[0].reason == "aborted_tools"
        [finished] = [e for e in events if isinstance(e, ToolCallFinished)]
        assert finished.result.is_error
        assert child_pids_alive() - before == set()  # the abort hook stopped the server as run() ended
    finally:
        await srv.aclose()


async def test_a_first_call_on_a_server_that_never_answers_initialize_is_an_error_naming_it(tmp_path: Path) -> None:
    srv, tools = await _restarted("init", tmp_path / "starts", connect_timeout=0.5)
    try:
        finished = await _first_call(srv, tools)
        assert finished.result.is_error
        assert srv.label in finished.result.text and "initialize" in finished.result.text
        assert "0.5 s" in finished.result.text
    finally:
        await srv.aclose()


async def test_a_first_call_on_a_server_that_never_answers_tools_list_gets_its_answer(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    # The listing before the call is given up after connect_timeout; the call is sent and answered,
    # and nothing waits for a listing afterwards (the SDK's own, to check the result, included).
    srv, tools = await _restarted("list", tmp_path / "starts", connect_timeout=30)
    try:
        # The new process answers initialize under the generous bound (a busy machine may take
        # a while to start it); only the listing, which is never answered, meets the short one.
        async with asyncio.timeout(30):
            session = await srv.session()
        srv.connect_timeout = session.listing_timeout = 0.5  # type: ignore[attr-defined]
        finished = await _first_call(srv, tools)
        assert not finished.result.is_error and finished.result.text.isdigit()
        assert f"MCP server {srv.label} answered the call of 'pid' but not tools/list within 0.5 s" in caplog.text
    finally:
        await srv.aclose()

