"""agentloop.mcp against a real MCP server process (tests/mcp_server.py), stdio and HTTP."""

from __future__ import annotations

import asyncio
import base64
import contextlib
import importlib
import json
import logging
import os
import re
import signal
import socket
import subprocess
import sys
import threading
from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from typing import Any, ClassVar

import anyio
import httpx2
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from mcp import types
from mcp.shared.exceptions import MCPError

from agentloop import AbortController, AbortError, TextBlock, ToolResultBlock, TurnEnded
from agentloop._tools import Tool, ToolContext
from agentloop.mcp import MCPServer, result_to_block
from tests.helpers import Fifo, VirtualClock, Watched, child_pids_alive, exited, logged, pid_alive

SERVER = str(Path(__file__).with_name("mcp_server.py"))


@pytest.fixture(autouse=True)
async def no_child_left_behind() -> AsyncIterator[None]:
    before = child_pids_alive()
    yield
    while left := child_pids_alive() - before:
        for pid in left:
            await exited(pid)


class Markers:
    """The markers the test server's ``slow`` tool leaves, as it leaves them: it writes each
    one's name to the ``events`` pipe of its markers folder too (see mcp_server.py)."""

    def __init__(self, events: Fifo) -> None:
        self.events = events
        self.seen: set[str] = set()

    async def wait(self, *names: str) -> None:
        while not set(names) <= self.seen:
            self.seen.add(await self.events.line())


@pytest.fixture
async def seen(tmp_path: Path) -> AsyncIterator[Markers]:
    async with Fifo(tmp_path / "events") as events:
        yield Markers(events)


@pytest.fixture
def markers(tmp_path: Path, seen: Markers) -> Path:
    return tmp_path


async def _idle(srv: MCPServer, within: float = 10.0) -> None:
    """Return once ``srv`` has taken its connection out of use (`_detach` does that)."""
    if not repr(srv).endswith(" idle>"):
        dropped = asyncio.Event()
        detach = srv._detach

        def hooked() -> Any:
            try:
                return detach()
            finally:
                dropped.set()

        srv._detach = hooked  # type: ignore[method-assign]
        try:
            async with asyncio.timeout(within):
                await dropped.wait()
        finally:
            del srv._detach
    assert repr(srv).endswith(" idle>"), repr(srv)


@pytest.fixture
async def server(markers: Path) -> AsyncIterator[MCPServer]:
    async with MCPServer.stdio(sys.executable, [SERVER, "--markers", str(markers)]) as srv:
        yield srv


def _ctx(signal: Any, tool_use_id: str = "toolu_1") -> ToolContext:
    return ToolContext(signal=signal, tool_use_id=tool_use_id, engine=None)  # type: ignore[arg-type]


async def _run(tool: Tool, args: dict[str, Any], signal: Any = None) -> Any:
    return await tool.handler(args, _ctx(signal or AbortController().signal))


class _FakeConnection:
    """Stands for the connection of a `MCPServer` whose session is a test's fake."""

    lost = False
    ready = True

    def __init__(self, fake: Any) -> None:
        self.fake = fake

    async def session(self) -> Any:
        return self.fake

    async def close(self) -> None:
        pass


def _serve(srv: MCPServer, fake: Any) -> None:
    """Make ``srv`` talk to ``fake``, an object with the `ClientSession` methods the test needs."""
    conn = _FakeConnection(fake)

    async def open_connection() -> Any:
        srv._conn = conn  # type: ignore[assignment]
        return conn, fake

    srv._open = open_connection  # type: ignore[method-assign]


async def test_list_tools_maps_name_description_and_schema(server: MCPServer) -> None:
    tools = {t.name: t for t in await server.list_tools()}
    assert {"echo", "add", "slow", "fail", "pid"} <= set(tools)
    echo = tools["echo"]
    assert echo.description == "Return the text unchanged."
    assert echo.input_schema["type"] == "object"
    assert echo.input_schema["properties"]["text"]["type"] == "string"
    assert echo.input_schema["required"] == ["text"]
    assert tools["add"].input_schema["properties"]["a"]["type"] == "integer"


async def test_prefix_and_tool_options(markers: Path) -> None:
    srv = MCPServer.stdio(sys.executable, [SERVER], prefix="t_", concurrency_safe=True, timeout=5)
    try:
        tools = {t.name: t for t in await srv.list_tools()}
        assert tools["t_echo"].concurrency_safe and tools["t_echo"].timeout == 5
        result = await _run(tools["t_echo"], {"text": "prefixed"})
        assert result == ToolResultBlock(tool_use_id="toolu_1", content="prefixed")
    finally:
        await srv.aclose()
    await srv.aclose()  # idempotent
    with pytest.raises(RuntimeError, match="closed"):
        await srv.list_tools()


async def test_a_tool_name_the_providers_refuse_is_mapped_and_still_calls_the_server(server: MCPServer) -> None:
    tools = {t.name: t for t in await server.list_tools()}
    (name,) = [n for n in tools if n.startswith("notes_read_")]  # "notes.read" on the server
    assert re.fullmatch(r"[a-zA-Z0-9_-]{1,64}", name)
    assert (await _run(tools[name], {"title": "x"})).content == "notes of x"


async def test_call_echo_add_and_an_error_result(server: MCPServer) -> None:
    tools = {t.name: t for t in await server.list_tools()}
    assert (await _run(tools["echo"], {"text": "héllo"})).content == "héllo"
    assert (await _run(tools["add"], {"a": 2, "b": 40})).content == "42"
    failed = await _run(tools["fail"], {"message": "boom"})
    assert failed.is_error and "boom" in failed.text


async def test_abort_mid_call_cancels_on_the_server_and_keeps_the_connection(
    server: MCPServer, markers: Path, seen: Markers
) -> None:
    tools = {t.name: t for t in await server.list_tools()}
    pid_before = (await _run(tools["pid"], {})).content
    controller = AbortController()
    # The call outlasts the test's timeout: an abort that waited for it would fail the test.
    call = asyncio.create_task(_run(tools["slow"], {"seconds": 3600}, controller.signal))
    await seen.wait("slow.started")
    assert not call.done()
    controller.abort("cancel")
    with pytest.raises(AbortError) as info:
        await call
    assert info.value.reason == "cancel"
    assert not (markers / "slow.finished").exists()  # it did not wait for the server's answer
    await seen.wait("slow.cancelled")
    assert not (markers / "slow.finished").exists()
    # Same connection, same server process: the cancel travelled as a notification.
    assert (await _run(tools["echo"], {"text": "still here"})).content == "still here"
    assert (await _run(tools["pid"], {})).content == pid_before


async def test_one_abort_cancels_every_call_in_flight(server: MCPServer, markers: Path, seen: Markers) -> None:
    tools = {t.name: t for t in await server.list_tools()}
    controller = AbortController()
    calls = [
        asyncio.create_task(_run(tools["slow"], {"seconds": 30, "tag": tag}, controller.signal))
        for tag in ("a", "b")
    ]
    await seen.wait("a.started", "b.started")
    controller.abort("send_now")
    for outcome in await asyncio.gather(*calls, return_exceptions=True):
        assert isinstance(outcome, AbortError) and outcome.reason == "send_now"
    await seen.wait("a.cancelled", "b.cancelled")


async def test_already_aborted_signal_sends_nothing(server: MCPServer, markers: Path) -> None:
    tools = {t.name: t for t in await server.list_tools()}
    controller = AbortController()
    controller.abort("cancel")
    with pytest.raises(AbortError):
        await _run(tools["slow"], {"seconds": 30}, controller.signal)
    assert (await _run(tools["echo"], {"text": "ok"})).content == "ok"
    assert not (markers / "slow.started").exists()


async def test_main_only_abort_hook_resets_the_connection(server: MCPServer, markers: Path, seen: Markers) -> None:
    registered: list[tuple[Any, bool]] = []
    watchers: list[Any] = []

    class Engine:
        def on_abort(self, fn: Any, *, main_only: bool = False) -> None:
            registered.append((fn, main_only))

        def watch_tools(self, fn: Any) -> None:
            watchers.append(fn)

    server.attach(Engine())
    assert registered == [(server.on_main_abort, True)] and watchers == [server.follow_tools]
    tools = {t.name: t for t in await server.list_tools()}
    old_pid = int((await _run(tools["pid"], {})).text)
    controller = AbortController()
    call = asyncio.create_task(_run(tools["slow"], {"seconds": 30}, controller.signal))
    await seen.wait("slow.started")
    controller.abort("cancel")  # the main engine is interrupted: its hook resets the connection
    await server.on_main_abort("cancel")
    with pytest.raises(AbortError):
        await call
    await exited(old_pid)
    new_pid = int((await _run(tools["pid"], {})).text)  # reconnects on next use
    assert new_pid != old_pid


async def test_a_server_that_cannot_start_raises_the_transport_error_not_a_task_group() -> None:
    cases: list[tuple[MCPServer, type[Exception], str | None]] = [
        (MCPServer.stdio(sys.executable, ["-c", "import sys; sys.exit(3)"]), MCPError, "exited with status 3"),
        (MCPServer.http(f"http://127.0.0.1:{_free_port()}/mcp"), httpx2.ConnectError, None),  # nobody listens
    ]  # fmt: skip
    for srv, error, says in cases:
        with pytest.raises(error, match=says) as info:
            await srv.list_tools()
        assert not isinstance(info.value, BaseExceptionGroup), repr(info.value)
        assert repr(srv) == f"<MCPServer {srv.label} idle>"  # the next call tries again
        await srv.aclose()
    with pytest.raises(MCPError, match="Connection closed"):
        await MCPServer.stdio(sys.executable, ["-c", "pass"]).session()


SILENT = "import sys; sys.stdout.write('not json\\n'); sys.stdout.flush(); sys.stdin.read()"


async def test_a_server_that_never_answers_initialize_times_out_and_is_stopped() -> None:
    srv = MCPServer.stdio(sys.executable, ["-c", SILENT], connect_timeout=0.5)
    with pytest.raises(TimeoutError, match=r"did not answer .*0\.5 s"):  # the bound, not a hang
        await srv.list_tools()
    assert repr(srv) == f"<MCPServer {srv.label} idle>"
    await srv.aclose()  # the fixture checks the server process is gone


async def test_async_with_cancelled_while_connecting_leaves_no_server_behind() -> None:
    srv = MCPServer.stdio(sys.executable, ["-c", SILENT])
    with pytest.raises(TimeoutError):
        async with asyncio.timeout(0.5), srv:
            raise AssertionError("never connected")
    assert repr(srv) == f"<MCPServer {srv.label} closed>"
    assert [t for t in asyncio.all_tasks() if t.get_name().startswith("agentloop-mcp")] == []


async def test_import_error_without_the_sdk(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(sys.modules, "mcp", None)
    monkeypatch.delitem(sys.modules, "agentloop.mcp")
    with pytest.raises(ImportError, match=r"pip install 'agentloop\[mcp\]'"):
        importlib.import_module("agentloop.mcp")


def test_results_are_mapped_to_text() -> None:
    image = types.ImageContent(type="image", data="AAAA", mime_type="image/png")
    link = types.ResourceLink(type="resource_link", uri="file:///a.txt", name="a", mime_type="text/plain")
    text_res = types.EmbeddedResource(
        type="resource", resource=types.TextResourceContents(uri="file:///b", text="inline")
    )
    blob = types.EmbeddedResource(
        type="resource", resource=types.BlobResourceContents(uri="file:///c", blob="AA")
    )
    mixed = types.CallToolResult(
        content=[types.TextContent(type="text", text="hi"), image, link, text_res, blob]
    )
    block = result_to_block("t1", mixed)
    assert isinstance(block.content, list) and block.content[0] == TextBlock(text="hi")
    assert block.content[1].text == "[image: image/png, about 3 bytes, not shown]"
    assert block.content[2].text == "[resource link: file:///a.txt (text/plain)]"
    assert block.content[3].text == "inline"
    assert block.content[4].text == "[resource: file:///c (binary), not shown]"
    structured = types.CallToolResult(content=[], structured_content={"n": 1}, is_error=True)
    assert result_to_block("t2", structured) == ToolResultBlock(
        tool_use_id="t2", content='{"n": 1}', is_error=True
    )
    assert result_to_block("t3", types.CallToolResult(content=[])).content == "(no output)"


# -- streamable HTTP ---------------------------------------------------------------


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port: int = s.getsockname()[1]
        return port


@pytest.fixture
def http_url(markers: Path) -> Iterator[str]:
    port = _free_port()
    proc = subprocess.Popen(
        [sys.executable, SERVER, "--http", str(port), "--markers", str(markers)],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
    )
    assert proc.stderr is not None
    drain = threading.Thread(target=proc.stderr.read)  # the rest of its log, until it exits
    try:
        for line in proc.stderr:  # uvicorn says when it listens; the read blocks until then
            if b"Uvicorn running on" in line:
                break
        else:
            raise AssertionError("the HTTP server exited before it listened")
        drain.start()
        yield f"http://127.0.0.1:{port}/mcp"
    finally:
        proc.terminate()
        try:
            proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(timeout=10)
        if drain.is_alive():
            drain.join()
        proc.stderr.close()
    assert proc.returncode is not None and not pid_alive(proc.pid)


async def test_streamable_http(http_url: str, markers: Path, seen: Markers) -> None:
    async with MCPServer.http(http_url, headers={"x-test": "1"}, timeout=20) as srv:
        tools = {t.name: t for t in await srv.list_tools()}
        assert tools["add"].timeout == 20
        assert (await _run(tools["add"], {"a": 1, "b": 2})).content == "3"
        controller = AbortController()
        call = asyncio.create_task(_run(tools["slow"], {"seconds": 30}, controller.signal))
        await seen.wait("slow.started")
        controller.abort("cancel")
        with pytest.raises(AbortError):
            await call
        await seen.wait("slow.cancelled")
        assert (await _run(tools["echo"], {"text": "over http"})).content == "over http"


# -- with the engine -----------------------------------------------------------------


async def test_engine_subagent_interrupt_keeps_the_connection_main_interrupt_resets_it(
    server: MCPServer, markers: Path, seen: Markers
) -> None:
    # The engine and the scripted model are the lead's modules; imported here so the
    # rest of this file does not depend on them.
    from agentloop._engine import QueryEngine
    from agentloop._scripted import ScriptedModel, ScriptedResponse, ScriptedToolCall
    from agentloop.sessions import JsonlSession

    def slow_then(tag: str, text: str) -> ScriptedModel:
        call = ScriptedToolCall("slow", {"seconds": 30, "tag": tag})
        return ScriptedModel([ScriptedResponse(tool_calls=[call]), text])

    async def interrupt_when_started(engine: Any, tag: str) -> None:
        await seen.wait(f"{tag}.started")
        engine.interrupt("cancel")

    tools = await server.list_tools()
    pid_tool = next(t for t in tools if t.name == "pid")
    first_pid = (await _run(pid_tool, {})).content
    with JsonlSession(markers / "session.jsonl") as session:
        main = QueryEngine(slow_then("main", "main done"), tools=tools, session=session)
        server.attach(main)
        child = main.subagent(agent_id="sub-1", model=slow_then("sub", "sub done"))
        stopper = asyncio.create_task(interrupt_when_started(child, "sub"))
        events = [ev async for ev in child.run("work")]
        await stopper
        assert events[-1].reason == "aborted_tools"
        await seen.wait("sub.cancelled")
        assert (await _run(pid_tool, {})).content == first_pid  # a subagent interrupt keeps it

        stopper = asyncio.create_task(interrupt_when_started(main, "main"))
        events = [ev async for ev in main.run("work")]
        await stopper
        assert events[-1].reason == "aborted_tools"
        assert (await _run(pid_tool, {})).content != first_pid  # the main-only hook reset it
    sidechain = JsonlSession(markers / "subagents" / "session" / "sub-1.jsonl").load()
    assert sidechain.messages[0].text == "work" and sidechain.repairs == []
    results = [r for m in sidechain.messages for r in m.tool_results]
    assert results[0].is_error and "stopped while it was running" in results[0].text
    assert JsonlSession(markers / "session.jsonl").load().events[-1]["reason"] == "aborted_tools"


async def test_main_abort_keeps_the_connection_a_kept_background_subagent_is_using(
    server: MCPServer, markers: Path, seen: Markers
) -> None:
    from agentloop._engine import QueryEngine
    from agentloop._scripted import ScriptedModel, ScriptedResponse, ScriptedToolCall

    tools = await server.list_tools()
    main = QueryEngine(ScriptedModel([ScriptedResponse(text="main " * 20, chunk=5)]), tools=tools)
    server.attach(main)
    call = ScriptedToolCall("slow", {"seconds": 1, "tag": "bg"})
    background = None
    async for _ in main.run("work"):
        if background is None:
            child = main.subagent(agent_id="bg", model=ScriptedModel([ScriptedResponse(tool_calls=[call]), "bg done"]))
            background = main.start_background(child, "background work")  # kept on a main cancel
        elif main.running:  # the main stream waits here until the child's call is in flight
            await seen.wait("bg.started")
            main.interrupt("cancel")  # the main-only hook runs while the child's call is in flight
    assert main.last_turn_ended is not None and main.last_turn_ended.reason == "aborted_streaming"
    assert background is not None and not (markers / "bg.finished").exists()
    await background
    result = next(r for m in child.messages for r in m.tool_results)
    assert (result.text, result.is_error) == ("slept 1.0", False)
    assert (markers / "bg.finished").exists()


async def test_a_tool_list_change_applies_from_the_next_model_request(server: MCPServer) -> None:
    from agentloop._engine import QueryEngine
    from agentloop._scripted import ScriptedModel, ScriptedResponse, ScriptedToolCall

    def offered(model: ScriptedModel) -> list[set[str]]:
        return [{t.name for t in request.tools} for request in model.requests]

    def calls(*names: str) -> ScriptedModel:
        return ScriptedModel([ScriptedResponse(tool_calls=[ScriptedToolCall(n, {"x": 21})]) for n in names] + ["ok"])

    tools = await server.list_tools()
    echo = next(t for t in tools if t.name == "echo")
    model = calls("grow", "extra")
    main = QueryEngine(model, tools=tools, policies=[])
    server.attach(main)
    earlier = main.subagent(agent_id="earlier", model=calls("extra"))  # made before the change
    narrow = main.subagent(agent_id="narrow", model=calls("echo"), tools=[echo])
    async for _ in main.run("add a tool, then use it"):
        pass
    assert [("extra" in names) for names in offered(model)] == [False, True, True]
    results = [r for m in main.messages for r in m.tool_results]
    assert [(r.text, r.is_error) for r in results] == [("grown", False), ("42", False)]
    async for _ in earlier.run("use the new tool"):
        pass
    assert "extra" in offered(earlier.model)[0]  # type: ignore[arg-type]
    assert [r.text for m in earlier.messages for r in m.tool_results] == ["42"]
    async for _ in narrow.run("echo"):
        pass
    assert offered(narrow.model) == [{"echo"}, {"echo"}]  # type: ignore[arg-type]  # never widened


class _Lister:
    """A session whose tools/list answer is ``names`` (one page)."""

    def __init__(self, *names: str) -> None:
        self.names = list(names)

    async def list_tools(self, params: Any = None) -> types.ListToolsResult:
        return types.ListToolsResult(tools=[types.Tool(name=n, inputSchema={"type": "object"}) for n in self.names])


async def test_a_tool_a_server_adds_under_a_name_another_server_offers_is_left_out_not_every_change(
    caplog: pytest.LogCaptureFixture,
) -> None:
    # Two servers without prefixes, attached to one engine: when one of them added a tool named as
    # one of the other's, the engine refused the whole new list (duplicate names), logged a traceback
    # before every model request, and went on offering a tool the server had removed.
    from agentloop._engine import QueryEngine
    from agentloop._scripted import ScriptedModel

    first, second = MCPServer(_no_connect, label="first"), MCPServer(_no_connect, label="second")
    lists = {first: _Lister("read"), second: _Lister("write")}
    for srv, fake in lists.items():
        _serve(srv, fake)
    engine = QueryEngine(ScriptedModel(["ok"]), tools=[*await first.list_tools(), *await second.list_tools()])
    first.attach(engine)
    second.attach(engine)
    lists[first].names = ["write", "extra"]  # "read" removed; "write" is the second server's name
    await first.list_tools()
    with caplog.at_level("WARNING"):
        for _ in range(2):
            engine._refresh_tools()
    assert sorted(engine.tools) == ["extra", "write"]
    assert engine.tools["write"].handler.server is second  # type: ignore[attr-defined]
    assert [r for r in caplog.records if r.exc_info] == []
    warnings = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]
    assert len(warnings) == 1 and "first" in warnings[0] and "'write'" in warnings[0], warnings
    await first.aclose()
    await second.aclose()


def _no_connect() -> Any:
    raise AssertionError("the test's fake session stands for the connection")


async def test_a_tool_removed_while_its_call_runs_still_answers_and_is_offered_no_more(
    markers: Path,
) -> None:
    from agentloop._engine import QueryEngine
    from agentloop._scripted import ScriptedModel, ScriptedResponse, ScriptedToolCall

    async with MCPServer.stdio(sys.executable, [SERVER, "--markers", str(markers)], concurrency_safe=True) as srv:
        model = ScriptedModel([
            ScriptedResponse(tool_calls=[
                ScriptedToolCall("slow", {"seconds": 0.5, "tag": "gone"}),
                ScriptedToolCall("retire", {"name": "slow", "after": "gone"}),
            ]),
            "ok",
        ])
        main = QueryEngine(model, tools=await srv.list_tools(), policies=[])
        srv.attach(main)
        async for _ in main.run("retire the slow tool while it runs"):
            pass
    results = [(r.text, r.is_error) for m in main.messages for r in m.tool_results]
    assert results == [("slept 0.5", False), ("retired slow", False)]
    assert ["slow" in {t.name for t in request.tools} for request in model.requests] == [True, False]
    assert "slow" not in main.tools


async def test_a_main_abort_does_not_wait_for_a_slow_server_to_exit(
    markers: Path, seen: Markers, caplog: pytest.LogCaptureFixture
) -> None:
    from agentloop._engine import QueryEngine
    from agentloop._scripted import ScriptedModel, ScriptedResponse, ScriptedToolCall

    model = ScriptedModel([ScriptedResponse(tool_calls=[ScriptedToolCall("slow", {"seconds": 3600})]), "ok"])
    # The server stays alive 30 s after its stdin closes: it gets 2 s, then its group is TERMed.
    # The run waits no longer than the tools' cancel grace for that, so it returns first.
    async with MCPServer.stdio(sys.executable, [SERVER, "--markers", str(markers), "--linger", "30"]) as srv:
        tools = await srv.list_tools()
        old_pid = int((await srv.call_tool("pid", {})).content[0].text)  # type: ignore[union-attr]
        main = QueryEngine(model, tools=tools, tool_cancel_grace=0.3, policies=[])
        srv.attach(main)
        with caplog.at_level("WARNING", logger="agentloop"):
            async for event in main.run("work"):
                if event.type == "tool_call_started":
                    await seen.wait("slow.started")
                    main.interrupt("cancel")
                if isinstance(event, TurnEnded):
                    alive_at_end = pid_alive(old_pid)
        alive_at_return = pid_alive(old_pid)
        assert event.reason == "aborted_tools" and alive_at_end  # the turn ended without waiting for it
        assert alive_at_return  # and so did the run
        assert "ignored cancellation" not in caplog.text  # the call ended at the abort, not at the grace
        assert repr(srv) == f"<MCPServer stdio:{sys.executable} idle>"  # the next call opens a new one
        assert int((await srv.call_tool("pid", {})).content[0].text) != old_pid  # type: ignore[union-attr]
    assert not pid_alive(old_pid)  # leaving `async with` waited for it to be stopped


async def test_a_server_that_died_while_idle_is_started_afresh_by_the_next_call(server: MCPServer) -> None:
    # The process exited between two calls: the client sees its stdout end, so the next call,
    # which never reached the dead process, goes to a new one instead of failing once.
    tools = {t.name: t for t in await server.list_tools()}
    old_pid = int((await _run(tools["pid"], {})).text)
    os.kill(old_pid, signal.SIGKILL)
    await _idle(server)
    result = await _run(tools["pid"], {})
    assert not result.is_error and int(result.text) != old_pid
    os.kill(int(result.text), signal.SIGKILL)  # and the same for a listing
    await _idle(server)
    assert {"echo", "pid"} <= {t.name for t in await server.list_tools()}


RAW_SERVER = str(Path(__file__).with_name("mcp_raw_server.py"))


async def test_a_server_that_keeps_dying_is_started_once_per_call_and_no_call_is_sent_twice(tmp_path: Path) -> None:
    # The first process works until a call kills it; every later one exits right after `initialize`.
    starts = tmp_path / "starts"
    args = [RAW_SERVER, "--starts", str(starts), "--die-after-init-from", "2"]
    async with MCPServer.stdio(sys.executable, args, connect_timeout=10) as srv:
        assert "exit" in {t.name for t in await srv.list_tools()}
        with pytest.raises(MCPError, match="Connection closed"):
            await srv.call_tool("exit", {})  # it died in the call: the call may have had effects
        assert len(starts.read_text().splitlines()) == 1  # ...so it is not sent again
        for calls in (1, 2, 3):
            with pytest.raises(MCPError):
                await srv.call_tool("pid", {})
            assert len(starts.read_text().splitlines()) == 1 + calls  # one start per call, no loop
            await _idle(srv)
    assert [t for t in asyncio.all_tasks() if t.get_name().startswith("agentloop-mcp")] == []


async def test_credentials_in_an_http_url_stay_out_of_the_repr_logs_and_errors(caplog: pytest.LogCaptureFixture) -> None:
    port = _free_port()
    srv = MCPServer.http(f"http://alice:pa55word@127.0.0.1:{port}/mcp?api_key=sk-secret-123&x=1")
    assert srv.label == f"http://127.0.0.1:{port}/mcp"
    with caplog.at_level("DEBUG", logger="agentloop"):
        with pytest.raises(httpx2.ConnectError) as info:  # nobody listens
            await srv.list_tools()
        await srv.on_main_abort("cancel")
    seen = [repr(srv), str(info.value), repr(info.value), caplog.text]
    assert not [s for s in seen if "pa55word" in s or "sk-secret-123" in s], seen
    assert f"127.0.0.1:{port}/mcp" in caplog.text  # still says which server
    await srv.aclose()


async def test_a_server_whose_tool_pages_never_end_is_an_error_not_a_hang() -> None:
    class Looping:  # a server that hands out the same cursor again
        calls = 0

        async def list_tools(self, params: types.PaginatedRequestParams | None = None) -> types.ListToolsResult:
            self.calls += 1
            tool = types.Tool(name=f"t{self.calls}", inputSchema={"type": "object"})
            return types.ListToolsResult(tools=[tool], nextCursor="page-2")

    looping = Looping()
    srv = MCPServer(contextlib.nullcontext, label="looping")  # type: ignore[arg-type]

    _serve(srv, looping)
    with pytest.raises(MCPError, match="repeated the tools/list cursor 'page-2'"):
        await srv.list_tools()
    assert looping.calls == 2


async def test_a_token_in_an_http_url_query_is_kept_out_of_the_sdk_logs(caplog: pytest.LogCaptureFixture) -> None:
    """A query string is part of the address and is sent as is, but the SDK logs the URL it
    connects to (and its HTTP client each request's): the token is scrubbed from those records."""
    port = _free_port()
    srv = MCPServer.http(f"http://127.0.0.1:{port}/mcp?access_token=mcp-tok-4711abc&x=1", connect_timeout=10)
    with caplog.at_level("DEBUG"):
        with pytest.raises(httpx2.ConnectError):  # nobody listens
            await srv.list_tools()
        await srv.aclose()
    assert "mcp-tok-4711abc" not in caplog.text
    assert f"127.0.0.1:{port}/mcp?access_token=[REDACTED]&x=1" in caplog.text  # the SDK still says where


async def test_user_info_in_an_http_url_is_sent_as_basic_auth_and_kept_out_of_every_log(
    caplog: pytest.LogCaptureFixture, monkeypatch: pytest.MonkeyPatch
) -> None:
    # The SDK logs the URL it is given ("Connecting to StreamableHTTP endpoint: ..."), and so
    # does the HTTP client for each request: the user info must not be in it.
    port = _free_port()
    url = f"http://alice:pa%40ss-w0rd@127.0.0.1:{port}/mcp?x=1"
    srv = MCPServer.http(url, connect_timeout=10)
    with caplog.at_level("DEBUG"):
        with pytest.raises(httpx2.ConnectError):  # nobody listens
            await srv.list_tools()
        await srv.aclose()
    assert "pa@ss-w0rd" not in caplog.text and "pa%40ss-w0rd" not in caplog.text and "alice" not in caplog.text
    assert f"127.0.0.1:{port}/mcp" in caplog.text  # the SDK still says where it connects

    seen: dict[str, Any] = {}

    @contextlib.asynccontextmanager
    async def fake_transport(target: str, *, http_client: Any, **_: Any) -> AsyncIterator[Any]:
        seen["url"] = target
        request = http_client.build_request("POST", target)
        seen["authorization"] = next(http_client.auth.sync_auth_flow(request)).headers["authorization"]
        raise ConnectionError("not connecting in this test")
        yield  # pragma: no cover

    monkeypatch.setattr("agentloop.mcp._http.streamable_http_client", fake_transport)
    srv = MCPServer.http(url, connect_timeout=10)
    with pytest.raises(ConnectionError):
        await srv.list_tools()
    await srv.aclose()
    assert seen["url"] == f"http://127.0.0.1:{port}/mcp?x=1"
    assert seen["authorization"] == "Basic " + base64.b64encode(b"alice:pa@ss-w0rd").decode()


@pytest.mark.parametrize("url", ["http://alice:Zx9/Qw8-PASSWORD@127.0.0.1/mcp", "http://alice:Zx9#PASSWORD@h/mcp",
                                 "ftp://h/mcp", "/mcp"])  # fmt: skip
async def test_an_unreadable_http_url_is_refused_without_quoting_it(url: str) -> None:
    with pytest.raises(ValueError, match="MCP server URL") as info:
        MCPServer.http(url)
    assert "Zx9" not in str(info.value) and "PASSWORD" not in str(info.value)


async def test_a_tool_result_over_a_mebibyte_comes_through_streamable_http(http_url: str) -> None:
    # The SDK's default SSE event limit (1 MiB) failed such a call outright ("Server-sent event
    # exceeded the 1048576 byte limit"): the result was lost, not cut to size by the engine.
    text = "0123456789" * 300_000  # 3 MB
    async with MCPServer.http(http_url, timeout=60) as srv:
        result = await srv.call_tool("echo", {"text": text})
        assert not result.is_error and isinstance(result.content[0], types.TextContent)
        assert result.content[0].text == text
    async with MCPServer.http(http_url, max_event_size=1 << 20) as srv:  # a host's own limit holds
        with pytest.raises(MCPError, match="byte limit"):
            await srv.call_tool("echo", {"text": text})


async def test_a_tool_listed_twice_is_offered_once_with_a_warning(caplog: pytest.LogCaptureFixture) -> None:
    # Providers refuse a request whose tools share a name: the first listing of a name wins.
    class Doubled:
        async def list_tools(self, params: types.PaginatedRequestParams | None = None) -> types.ListToolsResult:
            if params is None:
                return types.ListToolsResult(
                    tools=[
                        types.Tool(name="dup", description="first", inputSchema={"type": "object"}),
                        types.Tool(name="one", inputSchema={"type": "object"}),
                    ],
                    nextCursor="p2",
                )
            return types.ListToolsResult(
                tools=[types.Tool(name="dup", description="second", inputSchema={"type": "object"})]
            )

    srv = MCPServer(contextlib.nullcontext, label="doubled", prefix="d_")  # type: ignore[arg-type]

    _serve(srv, Doubled())
    with caplog.at_level("WARNING", logger="agentloop"):
        tools = await srv.list_tools()
    assert [(t.name, t.description) for t in tools] == [("d_dup", "first"), ("d_one", "")]
    warnings = [r.getMessage() for r in caplog.records if r.levelname == "WARNING"]
    assert len(warnings) == 1 and "'dup'" in warnings[0] and "doubled" in warnings[0], warnings
    from agentloop import QueryEngine, ScriptedModel

    QueryEngine(ScriptedModel([]), tools=tools)  # no "duplicate tool names" ValueError


async def test_a_relisting_the_server_never_answers_is_bounded_by_connect_timeout(
    caplog: pytest.LogCaptureFixture,
) -> None:
    # After notifications/tools/list_changed the tools are listed again, and a call's result waits
    # for that listing: a server that never answers it must not hang the call (nor the next turn).
    never = asyncio.Event()
    cancelled = asyncio.Event()
    srv: MCPServer

    class Mute:
        listings = 0

        async def list_tools(self, params: types.PaginatedRequestParams | None = None) -> types.ListToolsResult:
            self.listings += 1
            if self.listings == 1:
                return types.ListToolsResult(tools=[types.Tool(name="old", inputSchema={"type": "object"})])
            try:
                await never.wait()
            except asyncio.CancelledError:
                cancelled.set()
                raise
            raise AssertionError("unreachable")  # pragma: no cover

        async def call_tool(self, name: str, arguments: dict[str, Any]) -> types.CallToolResult:
            srv._on_message(types.ToolListChangedNotification())  # the server's news comes first
            await asyncio.sleep(0)
            return types.CallToolResult(content=[types.TextContent(type="text", text="done")])

    mute = Mute()
    srv = MCPServer(contextlib.nullcontext, label="mute", connect_timeout=0.05)  # type: ignore[arg-type]

    _serve(srv, mute)
    tools = await srv.list_tools()
    with caplog.at_level("WARNING", logger="agentloop"):
        async with asyncio.timeout(10):  # the bound under test is 0.05 s; this only stops a hang
            result = await srv.call_tool("old", {})
    assert isinstance(result.content[0], types.TextContent) and result.content[0].text == "done"
    assert cancelled.is_set() and mute.listings == 2
    assert srv.follow_tools({t.name: t for t in tools}) is None  # the old list is kept
    assert any("mute" in r.getMessage() and "0.05" in r.getMessage() for r in caplog.records if r.levelname == "WARNING")
    await srv.aclose()


class _ForgetfulServer:
    """A streamable HTTP MCP server in an `httpx2.MockTransport`, which can forget its sessions
    (a restart): a request carrying a forgotten ``Mcp-Session-Id`` gets 404, as the spec says."""

    def __init__(self) -> None:
        self.sessions: set[str] = set()
        self.initialized = 0
        self.not_found = 0
        self.tools = ["where"]  # what tools/list answers
        self.listings = 0
        self.mute = False  # tools/list is never answered (until the request is cancelled)
        self.methods = Watched()  # every JSON-RPC method posted, notifications included
        self.client_info: dict[str, Any] = {}  # what the client said it is, in `initialize`

    async def handle(self, request: Any) -> Any:
        import httpx2

        if request.method != "POST":
            return httpx2.Response(405 if request.method == "GET" else 200)
        sid = request.headers.get("mcp-session-id")
        body = json.loads(request.content)
        self.methods.append(body.get("method", ""))
        if body.get("method") == "initialize":
            self.client_info = body["params"]["clientInfo"]
            self.initialized += 1
            sid = f"s{self.initialized}"
            self.sessions.add(sid)
            result: dict[str, Any] = {
                "protocolVersion": body["params"]["protocolVersion"],
                "capabilities": {"tools": {}},
                "serverInfo": {"name": "forgetful", "version": "1"},
            }
            return httpx2.Response(200, json={"jsonrpc": "2.0", "id": body["id"], "result": result},
                                   headers={"mcp-session-id": sid})  # fmt: skip
        if sid not in self.sessions:
            self.not_found += 1
            return httpx2.Response(404, text="no such session")
        if "id" not in body:
            return httpx2.Response(202)
        if body["method"] == "tools/list":
            self.listings += 1
            if self.mute:
                await asyncio.Event().wait()  # until the connection is closed
            result = {"tools": [{"name": name, "inputSchema": {"type": "object"}} for name in self.tools]}
        else:
            result = {"content": [{"type": "text", "text": f"session {sid}"}], "isError": False}
        return httpx2.Response(200, json={"jsonrpc": "2.0", "id": body["id"], "result": result})


async def test_a_session_the_http_server_forgot_fails_one_call_and_the_next_starts_a_new_one(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    import functools

    import httpx2

    fake = _ForgetfulServer()
    monkeypatch.setattr(httpx2, "AsyncClient", functools.partial(httpx2.AsyncClient, transport=httpx2.MockTransport(fake.handle)))
    async with MCPServer.http("http://mcp.invalid/mcp", connect_timeout=10) as srv:
        async with asyncio.timeout(10):
            first = await srv.call_tool("where", {})
            assert result_to_block("t", first).text == "session s1"
            fake.sessions.clear()  # the server restarted
            with pytest.raises(MCPError):
                await srv.call_tool("where", {})
            assert fake.not_found == 1
            again = await srv.call_tool("where", {})
            assert result_to_block("t", again).text == "session s2"
            assert [t.name for t in await srv.list_tools()] == ["where"]
    assert fake.initialized == 2 and fake.not_found == 1


async def test_an_http_status_refusing_a_request_is_named_in_its_error(monkeypatch: pytest.MonkeyPatch) -> None:
    # A 401 (a wrong or expired token), 403 or 500 all said only "Server returned an error response":
    # nothing told a user that the credentials were refused.
    import functools

    import httpx2

    fake = _ForgetfulServer()
    refuse: dict[str, int] = {"initialize": 401}

    async def handle(request: Any) -> Any:
        if request.method == "POST" and (status := refuse.get(json.loads(request.content).get("method", ""))):
            return httpx2.Response(status, text="no")
        return await fake.handle(request)

    monkeypatch.setattr(httpx2, "AsyncClient", functools.partial(httpx2.AsyncClient, transport=httpx2.MockTransport(handle)))
    srv = MCPServer.http("http://mcp.invalid/mcp?token=sekrit", connect_timeout=10)
    async with asyncio.timeout(10):
        with pytest.raises(MCPError, match="HTTP 401 Unauthorized") as refused:
            await srv.list_tools()
        assert "sekrit" not in str(refused.value)
        refuse = {"tools/call": 500}
        with pytest.raises(MCPError, match="HTTP 500 Internal Server Error"):
            await srv.call_tool("where", {})
        refuse = {}
        assert result_to_block("t", await srv.call_tool("where", {})).text == "session s1"  # the session is kept
    await srv.aclose()


@settings(max_examples=50, deadline=None)
@given(names=st.lists(st.sampled_from(["a", "b", "c", "d"]), max_size=12))
def test_property_a_listing_keeps_the_first_tool_of_each_name_in_order(names: list[str]) -> None:
    from agentloop.mcp._tools import unique_specs

    specs = [types.Tool(name=n, description=str(i), inputSchema={"type": "object"}) for i, n in enumerate(names)]
    kept = unique_specs(specs, "p")
    assert [s.name for s in kept] == list(dict.fromkeys(names))
    assert all(s.description == str(names.index(s.name)) for s in kept)


def _forgetful(monkeypatch: pytest.MonkeyPatch) -> _ForgetfulServer:
    import functools

    import httpx2

    fake = _ForgetfulServer()
    transport = httpx2.MockTransport(fake.handle)
    monkeypatch.setattr(httpx2, "AsyncClient", functools.partial(httpx2.AsyncClient, transport=transport))
    return fake


async def test_list_tools_on_a_server_that_never_answers_is_bounded_by_connect_timeout(
    monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    # A host calling list_tools() itself: the tools/list request is bounded by connect_timeout too,
    # and the error names the server by its public label (no user info, no query string).
    fake = _forgetful(monkeypatch)
    fake.mute = True
    url = "http://alice:pa55word@mcp.invalid/mcp?api_key=sk-secret-123"
    with VirtualClock() as clock, caplog.at_level("DEBUG", logger="agentloop"):
        async with MCPServer.http(url, connect_timeout=5) as srv:
            started = clock.now
            async with asyncio.timeout(60):  # a hang stops here (virtual time), not at the bound under test
                with pytest.raises(TimeoutError) as info:
                    await srv.list_tools()
            waited = clock.now - started
            fake.mute = False
            assert [t.name for t in await srv.list_tools()] == ["where"]  # the connection is kept
            assert "notifications/cancelled" in fake.methods  # the request was given up, and the server told
    message = str(info.value)
    assert "http://mcp.invalid/mcp" in message and "tools/list" in message and "5 s" in message
    assert not [s for s in (message, repr(info.value), caplog.text) if "pa55word" in s or "sk-secret-123" in s]
    assert 5 - 1e-6 <= waited < 5.5  # float times: 5 s after a start may read 4.999999999
    assert fake.initialized == 1


async def test_after_the_http_session_is_renewed_the_next_poll_sees_the_servers_new_tools(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # The server restarted (it answers the old session with 404) and came back with other tools:
    # once the next call has opened a new session, the tool watcher offers the new list.
    fake = _forgetful(monkeypatch)
    async with MCPServer.http("http://mcp.invalid/mcp", connect_timeout=10) as srv:
        async with asyncio.timeout(10):
            current = {t.name: t for t in await srv.list_tools()}
            assert srv.follow_tools(current) is None
            fake.sessions.clear()  # the server restarted...
            fake.tools = ["where", "added"]  # ...with a tool more
            with pytest.raises(MCPError):
                await srv.call_tool("where", {})
            assert srv.follow_tools(current) is None  # no new session yet: nothing new is known
            again = await srv.call_tool("where", {})
            assert result_to_block("t", again).text == "session s2"
            updated = srv.follow_tools(current)
            assert updated is not None and sorted(t.name for t in updated) == ["added", "where"]
            assert srv.follow_tools({t.name: t for t in updated}) is None
    assert fake.initialized == 2


async def test_after_a_lost_connection_the_next_poll_sees_the_restarted_servers_tools(server: MCPServer) -> None:
    current = {t.name: t for t in await server.list_tools()}
    assert (await server.call_tool("grow", {})).content[0].text == "grown"  # type: ignore[union-attr]
    grown = server.follow_tools(current)
    assert grown is not None and "extra" in {t.name for t in grown}
    current = {t.name: t for t in grown}
    old_pid = int((await server.call_tool("pid", {})).content[0].text)  # type: ignore[union-attr]
    os.kill(old_pid, signal.SIGKILL)
    await _idle(server)
    new_pid = int((await server.call_tool("pid", {})).content[0].text)  # type: ignore[union-attr]
    assert new_pid != old_pid
    fresh = server.follow_tools(current)  # a new process: `extra` was never added to it
    assert fresh is not None
    names = {t.name for t in fresh}
    assert "extra" not in names and {"echo", "pid", "grow"} <= names


async def test_a_tool_schema_the_providers_refuse_is_made_an_object_or_the_tool_left_out(
    caplog: pytest.LogCaptureFixture,
) -> None:
    # The providers refuse a whole request whose tool schema is not of type "object" (Anthropic:
    # "input_schema.type: Field required"), so one such tool would fail every model request.
    defs = {"A": {"type": "object", "properties": {"x": {"type": "integer"}}}}

    class Loose:
        async def list_tools(self, params: types.PaginatedRequestParams | None = None) -> types.ListToolsResult:
            return types.ListToolsResult(
                tools=[
                    types.Tool(name="bare", inputSchema={}),
                    types.Tool(name="ref", inputSchema={"$ref": "#/$defs/A", "$defs": defs}),
                    types.Tool(name="nullable", inputSchema={"type": ["object", "null"], "properties": {}}),
                    types.Tool(name="text", inputSchema={"type": "string"}),
                    types.Tool(name="ok", inputSchema={"type": "object", "properties": {}}),
                ]
            )

    srv = MCPServer(contextlib.nullcontext, label="loose")  # type: ignore[arg-type]

    _serve(srv, Loose())
    with caplog.at_level("WARNING", logger="agentloop"):
        tools = {t.name: t for t in await srv.list_tools()}
    assert list(tools) == ["bare", "ref", "nullable", "ok"]
    assert tools["bare"].input_schema == {"type": "object"}
    assert tools["ref"].input_schema == {"type": "object", "$ref": "#/$defs/A", "$defs": defs}
    assert tools["nullable"].input_schema == {"type": "object", "properties": {}}
    assert tools["ok"].input_schema == {"type": "object", "properties": {}}
    warnings = [r.getMessage() for r in caplog.records if r.levelname == "WARNING"]
    assert len(warnings) == 1 and "'text'" in warnings[0] and "loose" in warnings[0], warnings
    assert all(t.handler.listing == frozenset(tools) for t in tools.values())  # type: ignore[attr-defined]


async def test_a_server_that_says_its_tools_changed_at_every_listing_is_not_listed_for_ever(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    # Each tools/list brings another notifications/tools/list_changed: listing again on each one
    # never ended, and a call's result waits for the listing.
    methods = tmp_path / "methods"
    args = [RAW_SERVER, "--changes-on-list", "--methods", str(methods)]

    def listings() -> int:
        return methods.read_text().splitlines().count("tools/list")

    with caplog.at_level("WARNING", logger="agentloop"):
        async with MCPServer.stdio(sys.executable, args, connect_timeout=10) as srv:
            await srv.list_tools()
            for _ in range(2):
                async with asyncio.timeout(20):
                    result = await srv.call_tool("changes", {})
                assert result_to_block("t", result).text == "changed"
                while (relisting := srv._relisting) is not None and not relisting.done():
                    await asyncio.wait([relisting])
            settled = listings()
            assert settled <= 1 + 3 * 3, settled  # at most three listings per call, not an endless stream
            assert (await srv.call_tool("pid", {})).content  # still usable
    assert listings() <= settled + 3
    assert any("keeps saying" in r.getMessage() for r in caplog.records), caplog.text


async def test_a_server_that_hands_out_a_new_cursor_for_ever_is_stopped_at_the_page_bound() -> None:
    # Without connect_timeout, a server whose every tools/list page names a new cursor was paged
    # without end (only a repeated cursor was caught).
    from agentloop.mcp._server import _MAX_PAGES

    class Endless:
        calls = 0

        async def list_tools(self, params: types.PaginatedRequestParams | None = None) -> types.ListToolsResult:
            self.calls += 1
            if self.calls > 20 * _MAX_PAGES:  # the test fails rather than hangs
                raise AssertionError("the client never stopped paging")
            tool = types.Tool(name=f"t{self.calls}", inputSchema={"type": "object"})
            return types.ListToolsResult(tools=[tool], nextCursor=f"page-{self.calls + 1}")

    endless = Endless()
    srv = MCPServer(contextlib.nullcontext, label="endless", connect_timeout=None)  # type: ignore[arg-type]
    _serve(srv, endless)
    with pytest.raises(MCPError, match=rf"MCP server endless .*{_MAX_PAGES:,} pages") as info:
        await srv.list_tools()
    assert info.value.error.code == types.INTERNAL_ERROR
    assert endless.calls == _MAX_PAGES
    assert _MAX_PAGES >= 100  # generous enough for real servers

    class Paged:  # a server with many pages, under the bound, is listed in full
        async def list_tools(self, params: types.PaginatedRequestParams | None = None) -> types.ListToolsResult:
            page = int(params.cursor) if params is not None and params.cursor else 1
            tool = types.Tool(name=f"t{page}", inputSchema={"type": "object"})
            return types.ListToolsResult(tools=[tool], nextCursor=str(page + 1) if page < _MAX_PAGES else None)

    paged = MCPServer(contextlib.nullcontext, label="paged", connect_timeout=None)  # type: ignore[arg-type]
    _serve(paged, Paged())
    assert len(await paged.list_tools()) == _MAX_PAGES
    await srv.aclose()
    await paged.aclose()


async def test_a_result_that_arrived_is_kept_when_the_run_is_aborted_while_it_waits_for_a_relisting() -> None:
    # The result came, then waited for the listing the server's list_changed caused; an abort then
    # gave AbortError and dropped the result, though a result that arrives before the abort is kept.
    answered = asyncio.Event()
    listing = asyncio.Event()
    srv: MCPServer

    class Changing:
        listings = 0

        async def list_tools(self, params: types.PaginatedRequestParams | None = None) -> types.ListToolsResult:
            self.listings += 1
            if self.listings > 1:
                listing.set()
                await asyncio.Event().wait()  # the relisting is slow: until cancelled
            return types.ListToolsResult(tools=[types.Tool(name="old", inputSchema={"type": "object"})])

        async def call_tool(self, name: str, arguments: dict[str, Any]) -> types.CallToolResult:
            srv._on_message(types.ToolListChangedNotification())  # the server's news comes first
            await listing.wait()
            answered.set()  # the client holds the result from here on
            return types.CallToolResult(content=[types.TextContent(type="text", text="done")])

    srv = MCPServer(contextlib.nullcontext, label="changing")  # type: ignore[arg-type]
    _serve(srv, Changing())
    tools = await srv.list_tools()
    controller = AbortController()
    try:
        async with asyncio.timeout(10):
            call = asyncio.create_task(_run(tools[0], {}, controller.signal))
            await answered.wait()
            assert not call.done()  # waiting for the new list
            controller.abort("cancel")
            block = await call
        assert block.text == "done" and not block.is_error
        assert srv._relisting is not None and not srv._relisting.done()  # the listing goes on, for the next request
    finally:
        await srv.aclose()
    assert srv._relisting is None


async def test_a_404_on_the_background_get_stream_does_not_make_an_unrelated_failure_reconnect(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # The SDK opens a GET stream for server messages, with the session id; a server (or a proxy in
    # front of it) that answers it 404 set the "session forgotten" flag, so the next call failing for
    # another reason (an HTTP 500 here) threw the live session away and started a new one.
    import functools

    import httpx2

    fake = _ForgetfulServer()
    gets = Watched()
    fail_calls = False

    async def handle(request: Any) -> Any:
        if request.method == "GET":
            gets.append(request.headers.get("mcp-session-id"))
            return httpx2.Response(404, text="no GET stream here")
        if fail_calls and request.method == "POST" and json.loads(request.content).get("method") == "tools/call":
            return httpx2.Response(500, text="oops")
        return await fake.handle(request)

    monkeypatch.setattr(httpx2, "AsyncClient", functools.partial(httpx2.AsyncClient, transport=httpx2.MockTransport(handle)))
    async with MCPServer.http("http://mcp.invalid/mcp", connect_timeout=10) as srv:
        async with asyncio.timeout(10):
            await gets.until(len)
            assert gets[0] == "s1"  # it carries the session id
            fail_calls = True
            with pytest.raises(MCPError, match="HTTP 500"):
                await srv.call_tool("where", {})
            fail_calls = False
            again = await srv.call_tool("where", {})
            assert result_to_block("t", again).text == "session s1"  # the session is kept
            fake.sessions.clear()  # a POST of the session answered 404 still means it is gone
            with pytest.raises(MCPError):
                await srv.call_tool("where", {})
            assert result_to_block("t", await srv.call_tool("where", {})).text == "session s2"
    assert fake.initialized == 2


async def test_a_404_to_the_old_session_after_a_reset_does_not_mark_the_new_one_forgotten(
    monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    # After on_main_abort, the old connection closes in the background. A 404 to one of its POSTs
    # that came once the next connection was open set the server-wide "session forgotten" flag: the
    # next call on the new session failing for another reason (an HTTP 500) threw that live session
    # away too. The flag belongs to the session the 404 answered.
    import functools

    import httpx2

    fake = _ForgetfulServer()
    answer_slow = asyncio.Event()  # the old session's slow call is answered 404
    end_old = asyncio.Event()  # the old session's DELETE (its close) completes
    fail_calls = False

    async def handle(request: Any) -> Any:
        sid = request.headers.get("mcp-session-id")
        if request.method == "DELETE" and sid == "s1":
            await end_old.wait()
        if request.method == "POST":
            body = json.loads(request.content)
            if body.get("method") == "tools/call" and body["params"]["name"] == "slow":
                fake.methods.append("tools/call")
                await answer_slow.wait()
                fake.not_found += 1
                return httpx2.Response(404, text="no such session")
            if fail_calls and body.get("method") == "tools/call":
                return httpx2.Response(500, text="oops")
        return await fake.handle(request)

    monkeypatch.setattr(httpx2, "AsyncClient", functools.partial(httpx2.AsyncClient, transport=httpx2.MockTransport(handle)))
    with caplog.at_level("DEBUG", logger="agentloop"):
        async with MCPServer.http("http://mcp.invalid/mcp", connect_timeout=10) as srv:
            try:
                async with asyncio.timeout(10):
                    assert result_to_block("t", await srv.call_tool("where", {})).text == "session s1"
                    controller = AbortController()
                    slow = asyncio.create_task(srv.call_tool("slow", {}, signal=controller.signal))
                    await fake.methods.until(lambda methods: methods.count("tools/call") == 2)
                    controller.abort("cancel")
                    with pytest.raises(AbortError):
                        await slow
                    reset = asyncio.create_task(srv.on_main_abort("cancel"))  # waits for the old session's close
                    await logged("agentloop", "resetting MCP connection", caplog.text)
                    assert result_to_block("t", await srv.call_tool("where", {})).text == "session s2"
                    answer_slow.set()
                    await logged("agentloop", "(404)", caplog.text)
                    fail_calls = True
                    with pytest.raises(MCPError, match="HTTP 500"):
                        await srv.call_tool("where", {})
                    fail_calls = False
                    assert result_to_block("t", await srv.call_tool("where", {})).text == "session s2"  # kept
                    end_old.set()
                    await reset
            finally:  # a failure above must not leave the old session's close waiting for ever
                answer_slow.set()
                end_old.set()
    assert fake.initialized == 2 and fake.not_found == 1


# -- the stdio wire ------------------------------------------------------------------


def _raw(*args: str, **options: Any) -> MCPServer:
    return MCPServer.stdio(sys.executable, [RAW_SERVER, *args], **{"connect_timeout": 10, **options})


async def test_messages_split_or_joined_across_writes_and_requests_from_the_server() -> None:
    async with _raw() as srv:
        assert result_to_block("t", await srv.call_tool("split", {})).text == "héllo, split"
        assert result_to_block("t", await srv.call_tool("joined", {})).text == "joined"
        assert json.loads(result_to_block("t", await srv.call_tool("ping", {})).text) == {"result": {}}
        roots = json.loads(result_to_block("t", await srv.call_tool("roots", {})).text)
        assert roots["error"]["code"] == types.INVALID_REQUEST  # declined: the roots capability is not offered


async def test_a_json_rpc_batch_from_the_server_is_read_message_by_message() -> None:
    # Protocol 2025-03-26 lets a server send a batch (a JSON array of messages), which a client must
    # accept: the line was skipped as "not a JSON-RPC message", and the call whose answer it held
    # waited for ever. The ping inside is answered too.
    async with _raw("--version", "2025-03-26") as srv:
        async with asyncio.timeout(10):
            result = await srv.call_tool("batch", {})
        assert json.loads(result_to_block("t", result).text) == {}


class _Touched(bytearray):
    """A stand-in for the stdout line being received that adds to ``work`` the bytes each
    operation on it goes through: appending, searching, slicing, splitting, concatenating."""

    work: ClassVar[list[int]] = [0]

    @staticmethod
    def _span(size: int, start: int | None, end: int | None) -> int:
        return len(range(size)[slice(start, end)])

    def __iadd__(self, data: Any) -> _Touched:
        self.work[0] += len(data)
        return super().__iadd__(data)

    def __add__(self, data: Any) -> _Touched:
        self.work[0] += len(self) + len(data)
        return _Touched(bytes(self) + bytes(data))

    def __getitem__(self, key: Any) -> Any:
        if isinstance(key, slice):
            self.work[0] += len(range(len(self))[key])
        return super().__getitem__(key)

    def __contains__(self, item: object) -> bool:
        self.work[0] += len(self)
        return super().__contains__(item)

    def find(self, sub: Any, start: Any = None, end: Any = None) -> int:
        self.work[0] += self._span(len(self), start, end)
        return super().find(sub, start, end)

    def rfind(self, sub: Any, start: Any = None, end: Any = None) -> int:
        self.work[0] += self._span(len(self), start, end)
        return super().rfind(sub, start, end)

    def index(self, sub: Any, start: Any = None, end: Any = None) -> int:
        self.work[0] += self._span(len(self), start, end)
        return super().index(sub, start, end)

    def rindex(self, sub: Any, start: Any = None, end: Any = None) -> int:
        self.work[0] += self._span(len(self), start, end)
        return super().rindex(sub, start, end)

    def split(self, sep: Any = None, maxsplit: int = -1) -> list[bytearray]:
        self.work[0] += len(self)
        return super().split(sep, maxsplit)

    def splitlines(self, keepends: bool = False) -> list[bytearray]:
        self.work[0] += len(self)
        return super().splitlines(keepends)


async def test_a_large_stdio_message_is_read_with_linear_work(monkeypatch: pytest.MonkeyPatch) -> None:
    # The SDK's reader joined each 64 KiB read to all that came before it: a 40 MB result took
    # 9 s of CPU (quadratic), and a 64 MiB one about 25 s. The work is counted, not timed: each
    # byte of the line being received may be appended, searched and cut out a bounded number of
    # times, however the pipe's reads fall.
    from agentloop.mcp import _stdio

    pipes_init = _stdio.Pipes.__init__

    def init(self: _stdio.Pipes, *args: Any) -> None:
        pipes_init(self, *args)
        self._partial = _Touched()

    monkeypatch.setattr(_stdio.Pipes, "__init__", init)
    async with _raw() as srv:
        for size in (4 << 20, 32 << 20):
            _Touched.work[0] = 0
            result = await srv.call_tool("big", {"n": size})
            assert len(result_to_block("t", result).text) == size
            work = _Touched.work[0]
            assert size <= work <= 4 * size, (size, work)  # the line went through the counted buffer, linearly


async def test_a_stdio_message_over_max_message_size_ends_the_connection_with_an_error() -> None:
    async with _raw(max_message_size=1 << 20) as srv:
        first = int(result_to_block("t", await srv.call_tool("pid", {})).text)
        assert result_to_block("t", await srv.call_tool("big", {"n": 1000})).text == "x" * 1000
        with pytest.raises(MCPError, match="more than 1048576 bytes"):
            await srv.call_tool("big", {"n": 2 << 20})
        again = int(result_to_block("t", await srv.call_tool("pid", {})).text)  # a new server
        assert again != first


async def test_lines_on_stdout_that_are_not_json_rpc_are_skipped_with_one_warning(
    caplog: pytest.LogCaptureFixture,
) -> None:
    # A banner or a print() on stdout: the SDK logged each such line (a blank one too) as an ERROR
    # with a traceback, quoting it.
    with caplog.at_level("DEBUG"):
        async with _raw("--noise") as srv:
            for _ in range(2):
                assert result_to_block("t", await srv.call_tool("noise", {})).text == "after the noise"
    assert [r for r in caplog.records if r.levelno >= logging.ERROR or r.exc_info] == []
    warnings = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]
    assert len(warnings) == 1 and srv.label in warnings[0] and "my-server v1.0" in warnings[0], warnings


async def test_the_servers_stderr_goes_to_the_log_with_its_credentials_scrubbed(
    caplog: pytest.LogCaptureFixture,
) -> None:
    secret = "ghp-very-secret-4711"
    env = {"GITHUB_TOKEN": secret, "MODE": "dev"}
    with caplog.at_level("INFO", logger="agentloop"):
        async with _raw(env=env) as srv:
            text = f"auth failed for {secret}\nmode dev, second line\n" + "z" * (1 << 20) + "\n"
            assert result_to_block("t", await srv.call_tool("stderr", {"text": text})).text == "written"
            await logged("agentloop", "second line", caplog.text)
    lines = [r.getMessage() for r in caplog.records if "stderr" in r.getMessage()]
    assert any(srv.label in m and "auth failed for [REDACTED]" in m for m in lines), lines
    assert any("mode dev, second line" in m for m in lines)
    assert secret not in caplog.text
    assert max(len(m) for m in lines) < 5000  # a huge line is cut


async def test_a_server_that_exits_at_start_up_says_why() -> None:
    script = "import sys; sys.stderr.write('error: config file missing\\n'); sys.exit(3)"
    srv = MCPServer.stdio(sys.executable, ["-c", script])
    with pytest.raises(MCPError, match="Connection closed") as info:
        await srv.list_tools()
    assert "status 3" in str(info.value) and "error: config file missing" in str(info.value)
    await srv.aclose()


async def test_a_server_that_dies_mid_call_leaving_a_process_holding_its_stdout_fails_the_call(
    tmp_path: Path,
) -> None:
    # Its stdout never ends (a child it left behind holds it): the exit itself ends the connection.
    orphan = tmp_path / "orphan"
    async with _raw() as srv:
        first = int(result_to_block("t", await srv.call_tool("pid", {})).text)
        async with asyncio.timeout(10):
            with pytest.raises(MCPError, match="Connection closed"):
                await srv.call_tool("exit", {"orphan": str(orphan)})
        again = int(result_to_block("t", await srv.call_tool("pid", {})).text)
        assert again != first
    await exited(int(orphan.read_text()))


@settings(max_examples=80, deadline=None)
@given(
    texts=st.lists(st.text(max_size=40), max_size=8),
    cuts=st.lists(st.integers(0, 1000), max_size=12),
    ending=st.sampled_from([b"\n", b"\r\n", b"\n\n"]),
    limit=st.sampled_from([None, 120]),
    batched=st.booleans(),
)
def test_property_stdout_is_cut_into_the_messages_written_however_the_reads_fall(
    texts: list[str], cuts: list[int], ending: bytes, limit: int | None, batched: bool
) -> None:
    from agentloop.mcp._stdio import Pipes
    from agentloop.models._http import Redactor

    def note(text: str) -> dict[str, Any]:
        return {"jsonrpc": "2.0", "method": "notifications/message", "params": {"level": "info", "data": text}}

    # One message a line, or (``batched``) two: a JSON-RPC batch, as protocol 2025-03-26 allows.
    groups = [texts[i : i + 2] for i in range(0, len(texts), 2)] if batched else [[t] for t in texts]
    lines = [
        json.dumps([note(t) for t in group] if batched else note(group[0]), ensure_ascii=False).encode()
        for group in groups
    ]
    wire = b"".join(line + ending for line in lines)
    points = sorted({c % (len(wire) + 1) for c in cuts})
    loop = asyncio.new_event_loop()
    try:
        pipes = Pipes(loop, "p", Redactor(()), limit)
        for start, end in zip([0, *points], [*points, len(wire)], strict=True):
            pipes.pipe_data_received(1, wire[start:end])
        got = []
        while (line := pipes.next_line()) is not None:
            messages = pipes.parse(line)
            assert messages or not line.strip()
            got += [m.message.params["data"] for m in messages]  # type: ignore[union-attr]
        fits = [len(line + ending.rstrip(b"\n")) <= limit if limit is not None else True for line in lines]
        if all(fits):
            assert got == texts and pipes.end_reason is None
        else:  # a message over the limit ends the connection; the ones before it may be read
            assert got == texts[: len(got)] and len(got) <= sum(len(g) for g in groups[: fits.index(False)])
            assert pipes.end_reason is not None and "more than 120 bytes" in pipes.end_reason
        assert pipes._queued == 0 and not pipes.stdout.noisy
    finally:
        loop.close()


async def test_the_client_introduces_itself_as_agentloop(monkeypatch: pytest.MonkeyPatch) -> None:
    # The SDK's placeholder ("mcp" 0.1.0) told servers nothing about the client they serve.
    import agentloop

    fake = _forgetful(monkeypatch)
    async with MCPServer.http("http://mcp.invalid/mcp", connect_timeout=10) as srv:
        await srv.list_tools()
    assert fake.client_info == {"name": "agentloop", "version": agentloop.__version__}


async def test_an_abort_never_waits_for_a_server_that_stopped_reading_its_stdin(tmp_path: Path) -> None:
    # The server reads no more of its stdin: a call's arguments fill the pipe, and the
    # notifications/cancelled of an abort queue behind them. The abort ends the calls at once all
    # the same (the SDK would wait 5 s for each notification to be written), so nothing of them
    # outlives a run that is cut off after its tool_cancel_grace.
    async with _raw() as srv, Fifo(tmp_path / "deaf") as deaf:
        controller = AbortController()
        calls = [asyncio.create_task(srv.call_tool("deaf", {"deaf": str(deaf)}, signal=controller.signal))]
        assert await deaf.line() == "deaf"  # the server stops reading its stdin
        conn = srv._conn
        assert conn is not None
        pipes = conn._read._pipes
        paused, pause = asyncio.Event(), pipes.pause_writing
        pipes.pause_writing = lambda: (pause(), paused.set())  # type: ignore[method-assign]
        calls.append(asyncio.create_task(srv.call_tool("pid", {"pad": "x" * (4 << 20)}, signal=controller.signal)))
        async with asyncio.timeout(10):
            await paused.wait()  # the write of the second call waits for the server
        assert pipes._writable is not None
        controller.abort("cancel")
        # Milliseconds on a quiet machine; the bound only has to stay below the SDK's 5 s per notification.
        async with asyncio.timeout(4):
            for call in calls:
                with pytest.raises(AbortError, match="cancel"):
                    await call


class _HungServer:
    """A streamable HTTP MCP server in an `httpx2.MockTransport` that answers ``initialize`` and
    ``tools/list``, then nothing: a request waits for as long as its read timeout allows, and fails as the real
    transport would then (for ever without one)."""

    def __init__(self) -> None:
        self.seen = Watched()  # the HTTP method, or the JSON-RPC method posted, of each request

    async def handle(self, request: Any) -> Any:
        import httpx2

        body = json.loads(request.content) if request.method == "POST" else {}
        self.seen.append(body.get("method", request.method))
        if body.get("method") == "initialize":
            result = {
                "protocolVersion": body["params"]["protocolVersion"],
                "capabilities": {"tools": {}},
                "serverInfo": {"name": "hung", "version": "1"},
            }
            return httpx2.Response(200, json={"jsonrpc": "2.0", "id": body["id"], "result": result},
                                   headers={"mcp-session-id": "s1"})  # fmt: skip
        if body.get("method") == "notifications/initialized":
            return httpx2.Response(202)
        if body.get("method") == "tools/list":
            tools = {"tools": [{"name": "where", "inputSchema": {"type": "object"}}]}
            return httpx2.Response(200, json={"jsonrpc": "2.0", "id": body["id"], "result": tools})
        if request.method == "GET":
            return httpx2.Response(405)
        read = request.extensions["timeout"]["read"]
        if read is None:
            await asyncio.Event().wait()
        await asyncio.sleep(read)  # the transport's read timeout, as it would run out
        raise httpx2.ReadTimeout("timed out", request=request)


# When the abort's notifications/cancelled times out in the MCP SDK's post_writer task just as
# aclose() tears the SDK's task group down, that task (the SDK's, not agentloop's) logs the timeout
# and loses the cancel: the after-test check for swallowed cancels would flag the SDK's code.
@pytest.mark.swallows_cancel
async def test_an_http_server_that_stops_answering_cannot_hold_aclose_for_ever(monkeypatch: pytest.MonkeyPatch) -> None:
    # Neither the notifications/cancelled of an abort nor the DELETE that ends the session were
    # bounded (reads wait for as long as a tool runs): aclose() waited for the server for ever.
    import functools

    import httpx2

    hung = _HungServer()
    monkeypatch.setattr(httpx2, "AsyncClient", functools.partial(httpx2.AsyncClient, transport=httpx2.MockTransport(hung.handle)))
    srv = MCPServer.http("http://mcp.invalid/mcp", http_timeout=0.5, connect_timeout=10)
    controller = AbortController()
    call = asyncio.create_task(srv.call_tool("where", {}, signal=controller.signal))
    await hung.seen.until(lambda seen: "tools/call" in seen)
    controller.abort("cancel")
    with pytest.raises(AbortError, match="cancel"):
        await call
    await hung.seen.until(lambda seen: "notifications/cancelled" in seen)
    async with asyncio.timeout(5):
        await srv.aclose()
    assert "DELETE" in hung.seen  # the session was ended, as far as the server let it



async def test_the_last_messages_of_a_server_that_exits_are_read_however_far_behind_the_session_is(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # A server writes MiBs, its answer, and exits. Reading its stdout pauses while the session is
    # a MiB behind, so the answer waits in the pipe; the end of the connection, due `_DRAIN` s
    # after the exit (for a process left behind holding the pipe), came first and dropped it.
    from agentloop.mcp import _stdio
    from agentloop.models._http import Redactor

    monkeypatch.setattr(_stdio, "_DRAIN", 0.0)

    def note(n: int) -> bytes:
        return json.dumps({"jsonrpc": "2.0", "method": "notifications/message", "params": {"level": "info", "data": "x" * n}}).encode()

    answer = json.dumps(text_result := {"jsonrpc": "2.0", "id": 1, "result": {"content": []}}).encode()
    pipes = _stdio.Pipes(asyncio.get_running_loop(), "p", Redactor(()), None)
    pipes.pipe_data_received(1, note(2 << 20) + b"\n")  # the session is behind: reading pauses
    assert pipes._paused
    pipes.process_exited()
    for _ in range(3):  # the drain delay (0 here) runs out while the session is still behind
        await asyncio.sleep(0)
    read = [await pipes.stdout.receive()]  # the session catches up: reading resumes
    pipes.pipe_data_received(1, note(10) + b"\n" + answer + b"\n")  # what waited in the pipe
    pipes.pipe_connection_lost(1, None)
    with pytest.raises(anyio.EndOfStream):
        while True:
            read.append(await pipes.stdout.receive())
    assert len(read) == 3 and read[-1].message.id == text_result["id"]  # type: ignore[union-attr]
    assert pipes.end_reason is not None


@pytest.mark.parametrize("listed", [False, True])
async def test_a_call_answered_by_a_server_that_exits_at_once_keeps_its_answer(listed: bool) -> None:
    # The SDK lists the tools after the answer to a call of a tool its session has not seen listed
    # (to check the result against the tool's output schema): on a new connection, the call of a
    # server that answered and exited failed with "Connection closed", its answer lost.
    async with _raw() as srv:
        if listed:
            await srv.list_tools()
        assert result_to_block("t", await srv.call_tool("last", {})).text == "the last answer"
        await _idle(srv)
        assert result_to_block("t", await srv.call_tool("last", {})).text == "the last answer"  # on a new one
