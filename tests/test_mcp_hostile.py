"""agentloop.mcp against a server that answers in ways the protocol does not allow: bytes that
are not UTF-8, a lone surrogate, an answer or a tool listing of the wrong shape, a content type
of a later protocol. Each costs at most its own call (or its own tool), never the connection,
and no call waits for an answer the server already sent."""

from __future__ import annotations

import asyncio
import json
import logging
import sys
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from mcp import types
from mcp.shared.exceptions import MCPError

from agentloop.mcp import MCPServer, result_to_block
from agentloop.mcp._stdio import Pipes
from agentloop.models._http import Redactor
from tests.helpers import child_pids_alive, exited

RAW_SERVER = str(Path(__file__).with_name("mcp_raw_server.py"))


@pytest.fixture(autouse=True)
async def no_child_left_behind() -> AsyncIterator[None]:
    before = child_pids_alive()
    yield
    while left := child_pids_alive() - before:
        for pid in left:
            await exited(pid)


def _raw(*args: str, **options: Any) -> MCPServer:
    return MCPServer.stdio(sys.executable, [RAW_SERVER, *args], **{"connect_timeout": 10, **options})


async def _text(srv: MCPServer, name: str, arguments: dict[str, Any] | None = None) -> str:
    async with asyncio.timeout(10):  # an answer dropped on the way is a call that waits for ever
        return result_to_block("t", await srv.call_tool(name, arguments or {})).text


@pytest.mark.parametrize(("tool", "text"), [("latin1", "caf\ufffd"), ("surrogate", "a\ufffdb")])
async def test_an_answer_that_is_not_valid_unicode_is_read_with_replacement_characters(
    tool: str, text: str, caplog: pytest.LogCaptureFixture
) -> None:
    """A line holding bytes that are not UTF-8 (a server writing Latin-1), or a lone surrogate
    escape, was taken for "not a JSON-RPC message" and skipped: the call whose answer it was
    waited for ever (or its tool timeout)."""
    with caplog.at_level("WARNING", logger="agentloop"):
        async with _raw() as srv:
            assert await _text(srv, tool) == text
            assert await _text(srv, "last") == "the last answer"  # the same server: nothing was lost
    warnings = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]
    assert len(warnings) == 1 and "U+FFFD" in warnings[0] and srv.label in warnings[0], warnings


@pytest.mark.parametrize(("tool", "arguments"), [("deep_answer", {}), ("deep_answer", {"n": 300}), ("cut_answer", {})])
async def test_an_answer_that_cannot_be_decoded_fails_its_call_not_waits(tool: str, arguments: dict[str, Any]) -> None:
    """An answer nested too deeply to decode, or cut short before its line break, was skipped as a
    line that is not JSON-RPC, and its call waited for ever (or its tool timeout)."""
    async with _raw() as srv:
        pid = await _text(srv, "pid")
        with pytest.raises(MCPError, match="not a valid JSON-RPC answer") as raised:
            await _text(srv, tool, arguments)
        assert srv.label in str(raised.value)
        assert await _text(srv, "pid") == pid


async def test_an_answer_of_the_wrong_shape_fails_its_call_not_waits(caplog: pytest.LogCaptureFixture) -> None:
    """An error answer whose code is not a number was skipped as "not JSON-RPC": the call waited for
    ever. It fails the call, saying so, and the connection goes on."""
    async with _raw() as srv:
        pid = await _text(srv, "pid")
        with pytest.raises(MCPError, match="not a valid JSON-RPC") as raised:
            await _text(srv, "bad_error")
        assert srv.label in str(raised.value) and "went wrong" not in str(raised.value)
        assert await _text(srv, "pid") == pid


async def test_a_result_of_the_wrong_shape_is_a_short_error() -> None:
    """A result whose ``content`` is not a list raised pydantic's ValidationError, whose text (a
    dozen lines, links to pydantic's site, the server's values) became the model's tool result."""
    async with _raw() as srv:
        pid = await _text(srv, "pid")
        with pytest.raises(MCPError) as raised:
            await _text(srv, "bad_result")
        message = str(raised.value)
        assert "bad_result" in message and srv.label in message and "content" in message
        assert "pydantic" not in message and "\n" not in message and len(message) < 400, message
        assert await _text(srv, "pid") == pid


async def test_content_of_a_type_this_client_does_not_know_is_described_and_the_rest_kept() -> None:
    """A block of a content type of a later protocol failed the whole result (pydantic's dump of
    thirteen errors): the texts beside it were lost."""
    async with _raw() as srv:
        async with asyncio.timeout(10):
            block = result_to_block("t", await srv.call_tool("new_content", {}))
    assert not block.is_error
    assert [b.text for b in block.content] == ["before", "[hologram content, not shown]", "after"]  # type: ignore[union-attr]


async def test_a_listing_with_entries_that_are_not_tools_keeps_the_others(caplog: pytest.LogCaptureFixture) -> None:
    """One tool of an invalid schema failed the whole tools/list: no tool of the server was offered,
    and every call failed too (the SDK lists the tools again to check a call's result)."""
    with caplog.at_level("WARNING", logger="agentloop"):
        async with _raw("--bad-tools") as srv:
            names = [t.name for t in await srv.list_tools()]
            assert names[:3] == ["split", "joined", "big"] and "pid" in names and "bad" not in names
            assert (await _text(srv, "pid")).isdigit()
    warnings = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]
    assert any("'bad'" in w and srv.label in w for w in warnings), warnings
    assert all("pydantic" not in w for w in warnings), warnings


class _GarbledHttpServer:
    """A streamable HTTP MCP server in an `httpx2.MockTransport` whose answer to a tools/call is
    ``garbage`` (with its content type), until ``garbage`` is None."""

    def __init__(self) -> None:
        self.garbage: tuple[bytes, str] | None = None

    async def handle(self, request: Any) -> Any:
        import httpx2

        if request.method != "POST":
            return httpx2.Response(405 if request.method == "GET" else 200)
        body = json.loads(request.content)
        if "id" not in body:
            return httpx2.Response(202)
        if body["method"] == "initialize":
            result: dict[str, Any] = {
                "protocolVersion": body["params"]["protocolVersion"],
                "capabilities": {"tools": {}},
                "serverInfo": {"name": "garbled", "version": "1"},
            }
        elif body["method"] == "tools/list":
            result = {"tools": [{"name": "t", "inputSchema": {"type": "object"}}]}
        elif self.garbage is not None:
            content, kind = self.garbage
            return httpx2.Response(200, content=content, headers={"content-type": kind})
        else:
            result = {"content": [{"type": "text", "text": "fine"}]}
        return httpx2.Response(200, json={"jsonrpc": "2.0", "id": body["id"], "result": result},
                               headers={"mcp-session-id": "s1"})  # fmt: skip


@pytest.mark.parametrize(
    "garbage",
    [
        (b"event: message\ndata: <html>secret-ish page</html>\n\n", "text/event-stream"),
        (b'event: message\ndata: {"jsonrpc":"2.0","id":1,"error":{"code":"x","message":"m"}}\n\n', "text/event-stream"),
        (b"<html>secret-ish page</html>", "application/json"),
    ],
)
async def test_an_http_answer_that_is_not_json_rpc_is_a_one_line_error(
    garbage: tuple[bytes, str], monkeypatch: pytest.MonkeyPatch
) -> None:
    """The SDK failed such a call with pydantic's dump of every error, the server's text quoted:
    a dozen lines for the model. The call fails in one line saying what happened, and the
    connection goes on."""
    import functools

    import httpx2

    fake = _GarbledHttpServer()
    monkeypatch.setattr(httpx2, "AsyncClient", functools.partial(httpx2.AsyncClient, transport=httpx2.MockTransport(fake.handle)))
    async with MCPServer.http("http://mcp.invalid/mcp", connect_timeout=10) as srv:
        assert await _text(srv, "t") == "fine"
        fake.garbage = garbage
        with pytest.raises(MCPError) as raised:
            await _text(srv, "t")
        message = str(raised.value)
        assert "not valid JSON-RPC" in message and srv.label in message, message
        assert "\n" not in message and "pydantic" not in message and "secret-ish" not in message, message
        fake.garbage = None
        assert await _text(srv, "t") == "fine"


@settings(max_examples=200, deadline=None)
@given(
    request=st.one_of(st.integers(-(2**53), 2**53), st.text(max_size=10)),
    payload=st.one_of(
        st.text(),  # any text: lone surrogates included, written as \ud800 escapes
        st.binary().map(lambda b: b.replace(b"\n", b"").replace(b"\r", b"")),  # any bytes but a line break
    ),
    shape=st.sampled_from(["text", "error", "bad_code", "bad_content", "cut", "deep"]),
)
def test_property_every_answer_line_answers_its_request(request: int | str, payload: str | bytes, shape: str) -> None:
    """Whatever a line answering a request holds (bytes that are not UTF-8, lone surrogates, a
    shape the SDK refuses, JSON cut short or nested past any parser's depth), reading it yields an
    answer to that request, a result or an error: never nothing, which leaves the request waiting."""
    rid = json.dumps(request).encode()
    if isinstance(payload, str):
        value = json.dumps(payload).encode()  # ensure_ascii: a surrogate is a \\ud800 escape
    else:
        value = b'"' + payload.replace(b"\\", b"\\\\").replace(b'"', b'\\"') + b'"'  # raw bytes in a string
    body = {
        "text": b'"result":{"content":[{"type":"text","text":%s}]}' % value,
        "error": b'"error":{"code":-32000,"message":%s}' % value,
        "bad_code": b'"error":{"code":%s,"message":"m"}' % value,
        "bad_content": b'"result":{"content":%s}' % value,
        "cut": b'"result":{"content":[{"type":"text","text":%s' % value,
        "deep": b'"result":{"content":[],"structuredContent":{"a":%s%s%s}}' % (b"[" * 500, value, b"]" * 500),
    }[shape]
    line = bytearray(b'{"jsonrpc":"2.0","id":%s,%s}' % (rid, body) if shape != "cut" else b'{"jsonrpc":"2.0","id":%s,%s' % (rid, body))
    loop = asyncio.new_event_loop()
    try:
        pipes = Pipes(loop, "p", Redactor(()), None)
        messages = [m.message for m in pipes.parse(line)]
    finally:
        loop.close()
    assert len(messages) == 1, line
    (message,) = messages
    assert isinstance(message, types.JSONRPCResponse | types.JSONRPCError) and message.id == request
