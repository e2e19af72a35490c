"""Promises of docs/mcp.md that no other test pins."""

from __future__ import annotations

import asyncio
import contextlib
import inspect
import json
import logging
import re
import sys
from pathlib import Path
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from mcp import types

from agentloop import AbortController, TextBlock, ToolContext, ToolResultBlock
from agentloop.mcp import MCPServer, result_to_block
from tests.helpers import child_pids_alive, exited, pid_alive

RAW_SERVER = str(Path(__file__).with_name("mcp_raw_server.py"))
TOOL_NAME = re.compile(r"[a-zA-Z0-9_-]{1,64}")


class _Listed:
    """A fake of the SDK session of a server whose tools are ``names``; it records each call."""

    def __init__(self, names: list[str]) -> None:
        self.names = names
        self.called: list[str] = []

    async def list_tools(self, params: types.PaginatedRequestParams | None = None) -> types.ListToolsResult:
        return types.ListToolsResult(tools=[types.Tool(name=n, inputSchema={"type": "object"}) for n in self.names])

    async def call_tool(self, name: str, arguments: dict[str, Any]) -> types.CallToolResult:
        self.called.append(name)
        return types.CallToolResult(content=[types.TextContent(type="text", text=f"ran {name}")])


class _Connection:
    lost = False
    ready = True
    listed = True

    def __init__(self, fake: _Listed) -> None:
        self.fake = fake

    async def session(self) -> _Listed:
        return self.fake

    async def close(self) -> None:
        pass


def _serving(fake: _Listed, prefix: str = "") -> MCPServer:
    """An `MCPServer` whose connection is ``fake``'s."""
    srv = MCPServer(contextlib.nullcontext, label="fake", prefix=prefix)  # type: ignore[arg-type]
    conn = _Connection(fake)

    async def open_connection() -> Any:
        srv._conn = conn  # type: ignore[assignment]
        return conn, fake

    srv._open = open_connection  # type: ignore[method-assign]
    return srv


def _ctx() -> ToolContext:
    return ToolContext(signal=AbortController().signal, tool_use_id="toolu_1", engine=None)  # type: ignore[arg-type]


# -- Usage: names ---------------------------------------------------------------------------------

_NAMES = st.lists(
    st.one_of(
        st.from_regex(r"[a-z][a-z0-9_]{0,20}", fullmatch=True),
        st.from_regex(r"[a-z]{1,8}[./: ][a-z]{1,8}", fullmatch=True),
        st.text(min_size=1, max_size=90),
    ),
    min_size=1,
    max_size=6,
    unique=True,
)


@settings(max_examples=60, deadline=None)
@given(names=_NAMES, prefix=st.sampled_from(["", "gh_", "git.", "p" * 60]))
async def test_property_every_offered_name_is_one_providers_take_and_calls_the_servers_own(
    names: list[str], prefix: str
) -> None:
    """mcp.md, `list_tools()`, Names: a name the providers refuse (prefix included) becomes its
    allowed characters plus a short hash, the same every time; the call still goes to the
    server's own name, and ``remote_name`` gives that name back for the offered one."""
    fake = _Listed(names)
    srv = _serving(fake, prefix)
    try:
        tools = await srv.list_tools()
        again = await srv.list_tools()
        assert [t.name for t in again] == [t.name for t in tools]  # the same every time
        assert len(tools) == len(names) and len({t.name for t in tools}) == len(names)
        for tool, remote in zip(tools, names, strict=True):
            assert TOOL_NAME.fullmatch(tool.name), tool.name
            if TOOL_NAME.fullmatch(prefix + remote):
                assert tool.name == prefix + remote  # a name providers take is left as it is
            assert srv.remote_name(tool.name) == remote
            result = await tool.handler({}, _ctx())
            assert isinstance(result, ToolResultBlock) and result.text == f"ran {remote}"
        assert fake.called == names
    finally:
        await srv.aclose()


async def test_remote_name_is_none_for_a_name_the_last_listing_does_not_offer() -> None:
    """mcp.md, Names: ``remote_name`` is None for a name this server's last listing does not
    offer: before any listing, a server's own (unmapped) name, a tool the server dropped."""
    fake = _Listed(["github.create_issue", "read_note"])
    srv = _serving(fake, prefix="gh_")
    try:
        assert srv.remote_name("gh_read_note") is None  # not listed yet
        offered = {t.name: t for t in await srv.list_tools()}
        (mapped,) = [n for n in offered if n.startswith("gh_github_create_issue_")]
        assert srv.remote_name(mapped) == "github.create_issue"
        assert srv.remote_name("gh_read_note") == "read_note"
        assert srv.remote_name("read_note") is None and srv.remote_name("github.create_issue") is None
        fake.names = ["read_note"]
        await srv.list_tools()
        assert srv.remote_name(mapped) is None and srv.remote_name("gh_read_note") == "read_note"
    finally:
        await srv.aclose()


# -- Results --------------------------------------------------------------------------------------


def test_results_table_audio_blobs_and_several_texts_of_an_error() -> None:
    """mcp.md, Results: audio is a short line as an image is; an embedded blob names its URI and
    MIME type; several text blocks of an ``isError`` result stay a list, with ``is_error``."""
    audio = types.AudioContent(type="audio", data="A" * 6828, mime_type="audio/wav")  # 5121 bytes
    assert result_to_block("t", types.CallToolResult(content=[audio])).content == (
        "[audio: audio/wav, about 5121 bytes, not shown]"
    )
    blob = types.EmbeddedResource(
        type="resource", resource=types.BlobResourceContents(uri="file:///c.png", blob="AA", mime_type="image/png")
    )
    assert result_to_block("t", types.CallToolResult(content=[blob])).content == (
        "[resource: file:///c.png (image/png), not shown]"
    )
    texts = [types.TextContent(type="text", text="bad input"), types.TextContent(type="text", text="try x")]
    block = result_to_block("t", types.CallToolResult(content=texts, is_error=True))
    assert block.content == [TextBlock(text="bad input"), TextBlock(text="try x")] and block.is_error
    one = result_to_block("t", types.CallToolResult(content=texts[:1], is_error=True))
    assert (one.content, one.is_error) == ("bad input", True)


# -- Usage: the handshake and the server's environment --------------------------------------------


async def test_a_server_answering_a_protocol_version_the_sdk_does_not_speak_is_a_runtime_error() -> None:
    """mcp.md, Usage: a server answering ``initialize`` with a protocol version the SDK does not
    speak fails the connection with a RuntimeError naming that version; no server is left."""
    before = child_pids_alive()
    srv = MCPServer.stdio(sys.executable, [RAW_SERVER, "--version", "1999-01-01"], connect_timeout=20)
    with pytest.raises(RuntimeError, match="1999-01-01"):
        await srv.list_tools()
    await srv.aclose()
    for pid in child_pids_alive() - before:
        await exited(pid)


_DUMP_ENV = "import json, os, sys; open(sys.argv[1], 'w').write(json.dumps(dict(os.environ)))"


async def test_a_stdio_server_gets_the_safe_default_environment_and_env_over_it(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """mcp.md, Usage: a stdio server's environment is the SDK's safe default (``HOME``,
    ``LOGNAME``, ``PATH``, ``SHELL``, ``TERM``, ``USER``) with ``env`` over it: nothing else of the
    host's environment, its API keys included, reaches the server."""
    monkeypatch.setenv("ANTHROPIC_API_KEY", "sk-ant-host-key-never-shared")
    monkeypatch.setenv("HOME", "/home/host")
    dump = tmp_path / "env.json"
    srv = MCPServer.stdio(
        sys.executable, ["-c", _DUMP_ENV, str(dump)], env={"HOME": "/srv/notes", "NOTES_DIR": "/srv/notes/db"},
        connect_timeout=20,
    )
    with pytest.raises(Exception, match="exited"):  # it writes its environment, then exits
        await srv.list_tools()
    await srv.aclose()
    seen = json.loads(dump.read_text(encoding="utf-8"))
    python_adds = {"LC_CTYPE"}  # set by the interpreter itself under the C locale (PEP 538)
    assert set(seen) - python_adds <= {"HOME", "LOGNAME", "PATH", "SHELL", "TERM", "USER", "NOTES_DIR"}, seen
    assert seen["HOME"] == "/srv/notes" and seen["NOTES_DIR"] == "/srv/notes/db"
    assert "PATH" in seen and "ANTHROPIC_API_KEY" not in seen


async def test_a_line_nested_too_deeply_on_stdout_is_skipped_with_one_warning(caplog: pytest.LogCaptureFixture) -> None:
    """mcp.md, Usage: a line on a stdio server's stdout that is JSON nested more than 400 levels
    deep is not a JSON-RPC message: it is skipped, with one warning per connection quoting its
    start, and the answer after it still comes."""
    srv = MCPServer.stdio(sys.executable, [RAW_SERVER], connect_timeout=20)
    with caplog.at_level("WARNING", logger="agentloop"):
        async with srv:
            for _ in range(2):
                assert result_to_block("t", await srv.call_tool("deep", {})).text == "after the deep line"
    assert [r for r in caplog.records if r.levelno >= logging.ERROR] == []
    warnings = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]
    assert len(warnings) == 1 and srv.label in warnings[0] and "[[[[" in warnings[0], warnings
    assert max(len(w) for w in warnings) < 1000  # its start, not the whole line


# -- Connection lifetime --------------------------------------------------------------------------


async def test_a_cancel_of_the_task_closing_a_server_propagates_once_the_server_is_stopped() -> None:
    """mcp.md, Connection lifetime: a cancel of the task closing the server waits for the server
    to be stopped, then propagates: nothing of the server outlives the CancelledError."""
    srv = MCPServer.stdio(sys.executable, [RAW_SERVER], connect_timeout=20)
    await srv.list_tools()
    pid = int(result_to_block("t", await srv.call_tool("pid", {})).text)
    closing = asyncio.create_task(srv.aclose())
    await asyncio.sleep(0)  # the close has begun
    closing.cancel()
    with pytest.raises(asyncio.CancelledError):
        await closing
    assert not pid_alive(pid)
    with pytest.raises(RuntimeError, match="closed"):
        await srv.list_tools()


def test_the_defaults_the_doc_states() -> None:
    """mcp.md, Usage: ``max_message_size=64 MiB`` (stdio), ``http_timeout=30.0`` and
    ``max_event_size=64 MiB`` (HTTP), ``connect_timeout`` 60 s and no prefix for both."""
    stdio = inspect.signature(MCPServer.stdio).parameters
    http = inspect.signature(MCPServer.http).parameters
    assert stdio["args"].default == () and stdio["env"].default is None and stdio["cwd"].default is None
    assert stdio["max_message_size"].default == 64 * 1024 * 1024
    assert http["headers"].default is None and http["http_timeout"].default == 30.0
    assert http["max_event_size"].default == 64 * 1024 * 1024
    for made in (MCPServer.stdio("uvx", ["mcp-server-git"]), MCPServer.http("https://tools.example.com/mcp")):
        assert (made.connect_timeout, made.prefix, made.concurrency_safe, made.timeout) == (60.0, "", False, None)


async def test_on_main_abort_called_by_the_host_returns_once_the_server_is_stopped() -> None:
    """mcp.md, Connection lifetime: called outside an engine's abort hooks, ``on_main_abort``
    waits for the close itself: when it returns the old server process is gone, and the next
    call starts a new one."""
    async with MCPServer.stdio(sys.executable, [RAW_SERVER], connect_timeout=20) as srv:
        old = int(result_to_block("t", await srv.call_tool("pid", {})).text)
        await srv.on_main_abort("cancel")
        assert not pid_alive(old)
        new = int(result_to_block("t", await srv.call_tool("pid", {})).text)
        assert new != old and pid_alive(new)
