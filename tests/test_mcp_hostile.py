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


@pytest.mark.parametrize(("tool", "arguments"), [("deep_answer", {}), ("cut_answer", {})])
async def test_an_answer_that_cannot_be_decoded_fails_its_call_not_waits(tool: str, arguments: dict[str, Any]) -> None:
    """An answer nested too deeply to decode, or cut short before its line break, was skipped as a
    line that is not JSON-RPC, and its call waited for ever (or its tool timeout)."""
    async with _raw() as srv:
        pid = await _text(srv, "pid")
        with pytest.raises(MCPError, match="not a valid JSON-RPC answer") as raised:
            await _text(srv, tool, arguments)
        assert srv.label in str(raised.value)
        assert await _text(srv, "pid") == pid


async def test_an_answer_cut_short_before_its_id_ends_the_connection_not_waits() -> None:
    """An answer whose ``id`` came after its ``result``, cut short before the id, was skipped as a
    line that is not JSON-RPC: which request it answered cannot be told, and its call waited for
    ever (or its tool timeout), the server alive. The connection ends, saying why; the next call
    gets a new server."""
    async with _raw() as srv:
        pid = await _text(srv, "pid")
        with pytest.raises(MCPError, match="cut short before its id") as raised:
            await _text(srv, "cut_before_id")
        assert srv.label in str(raised.value)
        assert await _text(srv, "pid") != pid


def _parsed_ending(line: bytes) -> tuple[list[Any], str | None]:
    """The messages `Pipes.parse` reads on ``line``, and the connection's end reason after it."""
    loop = asyncio.new_event_loop()
    try:
        pipes = Pipes(loop, "p", Redactor(()), None)
        return [m.message for m in pipes.parse(bytearray(line))], pipes.end_reason
    finally:
        loop.close()


_RESULT = b'"result":{"content":[{"type":"text","text":"hi"}]}'


@pytest.mark.parametrize(
    "line",
    [
        b'{"jsonrpc":"2.0",' + _RESULT,  # the id never came
        b'{"jsonrpc":"2.0",' + _RESULT + b',"id":',
        b'{"jsonrpc":"2.0",' + _RESULT + b',"id":3',  # 3, or 34 cut after its first digit
        b'{"jsonrpc":"2.0",' + _RESULT + b',"id":"r-',
        b'{"jsonrpc":"2.0","result":{"content":[{"type":"text","text":"hi',  # cut inside the result
        b'{"result":{"content":[]},"error":{"code":1,"message":"m"},"id":12',  # no jsonrpc yet: it may come after
    ],
)
def test_an_answer_cut_short_before_its_whole_id_fails_no_other_request_and_ends_the_connection(line: bytes) -> None:
    messages, reason = _parsed_ending(line)
    assert messages == []
    assert reason is not None and "cut short before its id" in reason


@pytest.mark.parametrize(
    ("line", "rid"),
    [
        (b'{"result":{"content":[]},"id":3,', 3),  # the jsonrpc member was to come after the id
        (b'{"result":{"content":[]},"id":34 ', 34),  # whitespace after it: the number is whole
        (b'{"result":{"content":[{"type":"text","text":"x"}]},"id":"r-3"', "r-3"),
        (b'{"jsonrpc":"2.0","error":{"code":1,"message":"m"},"id":-7}', None),  # whole: decoded as it is
    ],
)
def test_an_answer_cut_short_after_its_whole_id_fails_that_request(line: bytes, rid: Any) -> None:
    messages, reason = _parsed_ending(line)
    (answer,) = messages
    assert isinstance(answer, types.JSONRPCError) and reason is None
    if rid is not None:
        assert answer.id == rid and "could not be decoded" in answer.error.message



@pytest.mark.parametrize(
    "line",
    [
        # A JSON log line cut short: it holds an error or an id and a result, but also members no
        # answer has, so it is no answer even without its "jsonrpc" (it never had one).
        b'{"error": {"code": 500}, "message": "Traceback (most recent call last):',
        b'{"level": "info", "id": 7, "result": {"rows": 3}, "note": "multi',
        b'{"id": 7, "result": {"rows": 3}, "logger": "db", "msg": "multi',
        b'{"result": {"rows": 3}, "ts": 1700000000, "id": 7, "x',
    ],
)
def test_a_cut_json_log_line_is_no_answer(line: bytes) -> None:
    messages, reason = _parsed_ending(line)
    assert messages == [] and reason is None  # skipped: the connection goes on, no request fails

async def test_a_valid_answer_nested_deeper_than_pydantic_reads_answers_its_call() -> None:
    """pydantic stops near 200 levels, the line's own decoding at 400: a valid answer nested 300
    levels deep failed its call as "not a valid JSON-RPC answer"."""
    async with _raw() as srv:
        assert await _text(srv, "deep_answer", {"n": 300}) == "x"


def _parsed(line: bytes) -> list[Any]:
    """The messages `Pipes.parse` reads on ``line``."""
    loop = asyncio.new_event_loop()
    try:
        return [m.message for m in Pipes(loop, "p", Redactor(()), None).parse(bytearray(line))]
    finally:
        loop.close()


@pytest.mark.parametrize(
    "line",
    [
        b'{"level":"error","id":1,"error":"boom"}',
        b'{"id":2,"result":"ok"}',
        b'[{"id":2,"result":"ok"}]',
        b'{"jsonrpc":"1.0","id":3,"result":"ok"}',
    ],
)
def test_a_json_line_with_an_id_but_not_json_rpc_is_skipped_not_taken_for_an_answer(
    line: bytes, caplog: pytest.LogCaptureFixture
) -> None:
    """A JSON log line on stdout that happens to hold an ``id`` and a ``result`` or an ``error``
    failed the request of that id, as if it were an answer to it."""
    with caplog.at_level("WARNING", logger="agentloop"):
        assert _parsed(line) == []
    assert any("not a JSON-RPC message" in r.getMessage() for r in caplog.records)


def test_a_batch_holding_bytes_that_are_not_utf8_is_read_with_a_warning(caplog: pytest.LogCaptureFixture) -> None:
    """A batch was decoded with U+FFFD in place of what is not UTF-8 without the warning a single
    message gets, once per connection."""
    line = b'[{"jsonrpc":"2.0","id":1,"result":{"content":[{"type":"text","text":"caf\xe9"}]}}]'
    loop = asyncio.new_event_loop()
    try:
        pipes = Pipes(loop, "p", Redactor(()), None)
        with caplog.at_level("DEBUG", logger="agentloop"):
            first, second = pipes.parse(bytearray(line)), pipes.parse(bytearray(line.replace(b"id\":1", b"id\":2")))
    finally:
        loop.close()
    assert [m.message.result["content"][0]["text"] for m in first + second] == ["caf\ufffd", "caf\ufffd"]  # type: ignore[union-attr]
    levels = [r.levelno for r in caplog.records if "U+FFFD" in r.getMessage()]
    assert levels == [logging.WARNING, logging.DEBUG], levels


def test_a_clean_batch_is_not_scrubbed(monkeypatch: pytest.MonkeyPatch) -> None:
    """Every batch was scrubbed of surrogates, string by string, though valid UTF-8 without a
    surrogate escape holds none: a fifth to a third slower."""
    from agentloop.mcp import _stdio

    def scrub(value: Any) -> Any:
        raise AssertionError("scrubbed")

    monkeypatch.setattr(_stdio, "scrub_json", scrub)
    (message,) = _parsed(b'[{"jsonrpc":"2.0","id":1,"result":{"content":[{"type":"text","text":"caf\xc3\xa9"}]}}]')
    assert message.result == {"content": [{"type": "text", "text": "caf\u00e9"}]}


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


@pytest.mark.parametrize("kind", ["hologram", "tool_use"])
async def test_content_of_a_type_this_client_does_not_know_is_described_and_the_rest_kept(kind: str) -> None:
    """A block of a content type of a later protocol failed the whole result (pydantic's dump of
    thirteen errors): the texts beside it were lost. So did a ``tool_use`` block, a type of
    sampling messages that a tool result may not hold, which was taken for a known one."""
    async with _raw() as srv:
        async with asyncio.timeout(10):
            block = result_to_block("t", await srv.call_tool("new_content", {"type": kind}))
    assert not block.is_error
    assert [b.text for b in block.content] == ["before", f"[{kind} content, not shown]", "after"]  # type: ignore[union-attr]


def _listing() -> types.JSONRPCResponse:
    tools = [{"name": "a", "inputSchema": {"type": "object"}}, {"nom": "bad"}, 7]  # no tool to any check
    return types.JSONRPCResponse(jsonrpc="2.0", id=1, result={"tools": tools})


@pytest.mark.parametrize("check", [None, "raises"])
def test_a_listing_is_read_without_the_per_version_check(check: str | None, monkeypatch: pytest.MonkeyPatch) -> None:
    """The check of a listing for the protocol version agreed comes from a package the SDK pins
    (not one this library declares): missing, or failing for a reason of its own, it raised out
    of the read stream, and the connection was lost. The invalid tool is still left out."""
    from agentloop.mcp import _answers

    def broken(*args: Any) -> object:
        raise RuntimeError("no surface")

    monkeypatch.setattr(_answers, "_by_version", broken if check else None)
    message = _answers.readable(_listing(), "p", "2025-06-18")
    assert [tool["name"] for tool in message.result["tools"]] == ["a"]


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


_TEXTS = st.one_of(
    st.text(),
    st.lists(st.sampled_from(["a", "\u00e9", "\ud800", "\udc00", "\U0001f600", "\\", '"'])).map("".join),  # surrogates
)


@settings(max_examples=200, deadline=None)
@given(
    request=st.one_of(st.integers(-(2**53), 2**53), st.text(max_size=10)),
    payload=st.one_of(
        _TEXTS,  # lone surrogates included, written as \ud800 escapes
        st.binary().map(lambda b: b.replace(b"\n", b"").replace(b"\r", b"")),  # any bytes but a line break
    ),
    shape=st.sampled_from(["text", "error", "bad_code", "bad_content", "cut", "deep"]),
)
def test_property_every_answer_line_answers_its_request(request: int | str, payload: str | bytes, shape: str) -> None:
    """Whatever a line answering a request holds (bytes that are not UTF-8, lone surrogates, a
    shape the SDK refuses, JSON cut short or nested past any parser's depth), reading it yields an
    answer to that request, a result or an error: never nothing, which leaves the request waiting.
    A valid text result or error answer is read as it was sent, a surrogate as U+FFFD."""
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
    line = b'{"jsonrpc":"2.0","id":%s,%s}' % (rid, body) if shape != "cut" else b'{"jsonrpc":"2.0","id":%s,%s' % (rid, body)
    messages = _parsed(line)
    assert len(messages) == 1, line
    (message,) = messages
    assert isinstance(message, types.JSONRPCResponse | types.JSONRPCError) and message.id == request
    sent = _sent(value)
    if shape == "text" and sent is not None:
        assert isinstance(message, types.JSONRPCResponse), line
        assert message.result == {"content": [{"type": "text", "text": sent}]}, line
    elif shape == "error" and sent is not None:
        assert isinstance(message, types.JSONRPCError), line
        assert (message.error.code, message.error.message, message.error.data) == (-32000, sent, None), line


def _sent(value: bytes) -> str | None:
    """The text JSON string ``value`` holds, a lone surrogate as U+FFFD; None when it is not a
    valid JSON string in UTF-8."""
    try:
        text = json.loads(value.decode("utf-8"))
    except ValueError:  # UnicodeDecodeError included
        return None
    return "".join("\ufffd" if "\ud800" <= c <= "\udfff" else c for c in text)


def _undecodable(members: list[tuple[str, str]], cut: bool) -> bytes:
    """An answer with ``members`` (raw JSON values) in this order: cut short before its end, or
    with its result nested deeper than any decoder reads."""
    parts = [f'"{key}":{value}' for key, value in members]
    line = "{" + ",".join(parts) + "}"
    return line[: line.index('"result":') + 30].encode() if cut else line.encode()


_DEEP = "[" * 2000 + "]" * 2000


@settings(max_examples=40, deadline=None)
@given(order=st.permutations(["jsonrpc", "id", "result"]), cut=st.booleans(), request=st.sampled_from(["7", '"r-7"']))
def test_an_undecodable_answer_is_recognised_whatever_its_keys_order(order: list[str], cut: bool, request: str) -> None:
    """An answer that cannot be decoded was recognised only when its keys came as servers usually
    write them (jsonrpc, id, result): in another order its request waited for ever."""
    if cut:  # what a cut answer says of itself comes before the cut
        order = [k for k in order if k != "result"] + ["result"]
    values = {"jsonrpc": '"2.0"', "id": request, "result": '{"content":[{"type":"text","text":"' + "x" * 60 + '"}]' + ("" if cut else "," + '"deep":' + _DEEP + "}")}
    [answer] = _parsed(_undecodable([(k, values[k]) for k in order], cut))
    assert isinstance(answer, types.JSONRPCError)
    assert answer.id == json.loads(request) and "could not be decoded" in answer.error.message


@pytest.mark.parametrize(
    "line",
    [
        b'{"id":1,"jsonrpc":"2.0","method":"x","result":' + _DEEP.encode() + b"}",  # a request, not an answer
        b'{"id":1,"jsonrpc":"1.0","result":' + _DEEP.encode() + b"}",
        b'{"result":' + _DEEP.encode() + b',"jsonrpc":"2.0"}',  # no id
        b'{"deep":{"id":1,"jsonrpc":"2.0","result":' + _DEEP.encode() + b"}}",  # not the top level's
        b'{"id":[1],"jsonrpc":"2.0","result":' + _DEEP.encode() + b"}",
    ],
)
def test_an_undecodable_line_that_is_not_an_answer_fails_no_request(line: bytes) -> None:
    assert _parsed(line) == []


class _CountingRedactor(Redactor):
    """A redactor that counts the stderr lines given to it: each is a line worked on in Python."""

    __slots__ = ("seen",)

    def __init__(self, values: Any) -> None:
        super().__init__(values)
        self.seen = 0

    def scrub(self, text: str) -> str:
        self.seen += 1
        return super().scrub(text)


def _fixed_clock(loop: asyncio.AbstractEventLoop, now: list[float]) -> None:
    """The loop's clock reads ``now[0]``: the stderr budget's window moves only when a test says."""
    loop.time = lambda: now[0]  # type: ignore[method-assign]


def test_a_stderr_flood_costs_a_little_per_block_and_keeps_the_last_lines(caplog: pytest.LogCaptureFixture) -> None:
    """A server writing a flood of lines to stderr cost Python work per line: each was decoded,
    scrubbed and logged. Now, past the budget of a window, a block read costs about a split, a
    bounded number of its lines are logged (the rest counted), and the last lines are kept for the
    error that quotes them."""
    loop = asyncio.new_event_loop()
    _fixed_clock(loop, [0.0])
    redactor = _CountingRedactor(("sekrit-0123456789",))
    try:
        pipes = Pipes(loop, "p", redactor, None)
        body = b"".join(b"line %d of the flood\n" % i for i in range(200_000))
        body += b"Traceback: sekrit-0123456789 was refused\nfatal: the last words\n"
        blocks = range(0, len(body), 256 << 10)
        with caplog.at_level(logging.INFO, logger="agentloop"):
            for at in blocks:
                pipes.pipe_data_received(2, body[at : at + (256 << 10)])
    finally:
        loop.close()
    assert list(pipes.tail)[-2:] == ["Traceback: [REDACTED] was refused", "fatal: the last words"]
    assert redactor.seen <= 200 + 25 * len(blocks)
    logged = [r.getMessage() for r in caplog.records]
    assert logged[-1].endswith("(stderr): fatal: the last words") and "sekrit" not in " ".join(logged)
    assert logged[0].endswith("(stderr): line 0 of the flood")
    assert len(logged) <= 200 + 25 * len(blocks) and any("lines not logged" in m for m in logged)


_TRACEBACK = b"".join(
    [b"Traceback (most recent call last):\n"]
    + [b'  File "/srv/server.py", line %d, in step%d\n    step%d()\n' % (i, i, i + 1) for i in range(15)]
    + [b"RuntimeError: the database is gone\n"]
)


def test_a_traceback_written_at_once_is_logged_whole(caplog: pytest.LogCaptureFixture) -> None:
    """A crash's traceback (32 lines, one read of the pipe) lost its head: only the last 20 lines
    of a read were logged, with a line claiming a flood. A burst within the window's budget is
    logged in full."""
    loop = asyncio.new_event_loop()
    _fixed_clock(loop, [0.0])
    try:
        pipes = Pipes(loop, "p", Redactor(()), None)
        with caplog.at_level(logging.INFO, logger="agentloop"):
            pipes.pipe_data_received(2, _TRACEBACK)
    finally:
        loop.close()
    logged = [r.getMessage().split("(stderr): ", 1)[1] for r in caplog.records]
    assert logged == _TRACEBACK.decode().splitlines()
    assert logged[0] == "Traceback (most recent call last):"


def test_after_a_flood_a_later_window_logs_a_traceback_whole(caplog: pytest.LogCaptureFixture) -> None:
    """The budget is per window: a flood spends it, and a crash a while later is logged in full."""
    loop = asyncio.new_event_loop()
    now = [0.0]
    _fixed_clock(loop, now)
    try:
        pipes = Pipes(loop, "p", Redactor(()), None)
        pipes.pipe_data_received(2, b"noise\n" * 10_000)
        now[0] = 5.0
        with caplog.at_level(logging.INFO, logger="agentloop"):
            pipes.pipe_data_received(2, _TRACEBACK)
    finally:
        loop.close()
    logged = [r.getMessage().split("(stderr): ", 1)[1] for r in caplog.records]
    assert logged == _TRACEBACK.decode().splitlines()


def test_a_burst_over_the_byte_budget_is_cut_though_its_lines_are_few(caplog: pytest.LogCaptureFixture) -> None:
    """Long lines spend the budget by their bytes: 100 lines of 4 KiB log the first 64 KiB's worth
    in full, count the middle, and log the last ones."""
    loop = asyncio.new_event_loop()
    _fixed_clock(loop, [0.0])
    try:
        pipes = Pipes(loop, "p", Redactor(()), None)
        with caplog.at_level(logging.INFO, logger="agentloop"):
            pipes.pipe_data_received(2, b"".join(b"%03d" % i + b"x" * 4093 + b"\n" for i in range(100)))
    finally:
        loop.close()
    logged = [r.getMessage() for r in caplog.records]
    counted = [m for m in logged if "lines not logged" in m]
    assert len(counted) == 1 and len(logged) < 100
    heads = [m.split("(stderr): ", 1)[1][:3] for m in logged if m not in counted]
    assert heads[0] == "000" and heads[-1] == "099"
    assert len(heads) + int(counted[0].split("(stderr): ", 1)[1].split()[0]) == 100


def test_stderr_lines_split_across_blocks_and_an_overlong_one_are_read_as_before() -> None:
    loop = asyncio.new_event_loop()
    try:
        pipes = Pipes(loop, "p", Redactor(()), None)
        for piece in [b"one ", b"line\ntwo\n\n", b"x" * 20_000, b"y" * 10, b"\nthree", b"\r\n", b"last"]:
            pipes.pipe_data_received(2, piece)
        pipes.pipe_connection_lost(2)
    finally:
        loop.close()
    assert list(pipes.tail) == ["one line", "two", "x" * 2000 + "…", "three", "last"]
