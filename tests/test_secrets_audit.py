"""Credentials never show: an HTTP model's key, its credential headers (its own and those of the
host's ``http_client``) and the credentials in its ``base_url`` stay out of every error (message,
args, notes, chained causes, the printed traceback), repr, log record, event, ``event_json`` and
session file, on every failure a transport can produce, and out of what a tool result carrying one
becomes (a subagent's, on a model of its own, included)."""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import re
import sys
import tempfile
import traceback
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any
from urllib.parse import quote

import httpx
from hypothesis import given
from hypothesis import strategies as st

from agentloop import (
    AbortController,
    Message,
    QueryEngine,
    ToolContext,
    ToolProgress,
    ToolResultBlock,
    event_json,
    tool,
)
from agentloop._errors import ModelError
from agentloop.mcp import MCPServer
from agentloop.models import AnthropicModel, ModelRequest, OpenAIChatModel, OpenAIResponsesModel
from agentloop.sessions import JsonlSession

MARK = "[REDACTED]"
MODELS: dict[str, Callable[..., Any]] = {
    "anthropic": AnthropicModel,
    "chat": OpenAIChatModel,
    "responses": OpenAIResponsesModel,
}


#: A printed traceback's frames: each ``File`` line, with the source line (and the carets) under it:
#: where the code is and what it says, not text an error carries.
_FRAMES = re.compile(r'^ +File "[^\n]*\n(?: {4,}[^\n]*\n)*', re.MULTILINE)


def leaked(secrets: list[str], text: str) -> list[str]:
    """The secrets ``text`` shows, whole or a long piece of one (an excerpt cut through it); a
    marker is opaque (a secret made of its letters is not in it). The frames of a printed
    traceback are paths and code, not what an error says: a one-letter key is in any of them."""
    text = _FRAMES.sub("", text).replace(MARK, "\x00")
    return [s for s in secrets if any(piece in text for piece in pieces(s))]


def pieces(secret: str) -> list[str]:
    """What of ``secret`` must not show: itself, and for a long one its first and last 16 characters."""
    return [secret, secret[:16], secret[-16:]] if len(secret) >= 32 else [secret]


def echo(request: httpx.Request) -> str:
    """Everything a careless server or transport could quote: the URL and every header."""
    return " ".join([str(request.url), *(f"{k}: {v}" for k, v in request.headers.items())])


def _status(code: int) -> Callable[[httpx.Request], httpx.Response]:
    def handler(request: httpx.Request) -> httpx.Response:
        text = echo(request)
        error = {"message": text, "type": "invalid_request_error", "code": text}
        headers = {"x-echo": text, "content-type": "application/json", "retry-after": "0"}
        return httpx.Response(code, headers=headers, json={"error": error})

    return handler


def _stream(body: Callable[[str], str]) -> Callable[[httpx.Request], httpx.Response]:
    def handler(request: httpx.Request) -> httpx.Response:
        return httpx.Response(200, headers={"content-type": "text/event-stream"}, content=body(echo(request)).encode())

    return handler


def _raises(make: Callable[[httpx.Request, str], BaseException]) -> Callable[[httpx.Request], httpx.Response]:
    def handler(request: httpx.Request) -> httpx.Response:
        raise make(request, echo(request))

    return handler


def _noted(request: httpx.Request, text: str) -> BaseException:
    exc = httpx.ConnectError("connection refused", request=request)
    exc.add_note(f"while connecting: {text}")
    return exc


def _caused(request: httpx.Request, text: str) -> BaseException:
    try:
        raise OSError(f"socket: {text}")
    except OSError as inner:
        try:
            raise httpx.ConnectError("connection refused", request=request) from inner
        except httpx.ConnectError as outer:
            return outer


def _sse_error(text: str) -> str:
    event = {"type": "error", "error": {"type": "overloaded_error", "message": text}}
    return f"event: error\ndata: {json.dumps(event)}\n\ndata: {json.dumps({'error': {'message': text, 'code': text}})}\n\n"


#: Every way a request can fail that a transport (or the server behind it) can bring about.
FAILURES: dict[str, Callable[[httpx.Request], httpx.Response]] = {
    **{str(code): _status(code) for code in (400, 401, 403, 404, 413, 429, 500, 502)},
    "plain 401": lambda r: httpx.Response(401, text=f"denied: {echo(r)}", headers={"content-type": "text/plain"}),
    "web page": lambda r: httpx.Response(200, text=f"<html><body>{echo(r)}</body></html>"),
    "json document": lambda r: httpx.Response(200, json={"error": {"message": echo(r)}}),
    "redirect": lambda r: httpx.Response(302, headers={"location": f"https://elsewhere.example/{echo(r)[:200]}"}),
    "connect error": _raises(lambda r, t: httpx.ConnectError(f"cannot connect: {t}", request=r)),
    "read timeout": _raises(lambda r, t: httpx.ReadTimeout(f"timed out: {t}", request=r)),
    "note": _raises(_noted),
    "chained cause": _raises(_caused),
    "host's own error": _raises(lambda r, t: OSError(f"proxy refused {t}")),
    "host's bug": _raises(lambda r, t: ValueError(f"bad request {t}")),
    "malformed stream": _stream(lambda t: f"event: message_start\ndata: {{not json {t}\n\n"),
    "error event": _stream(_sse_error),
    "cut stream": _stream(lambda t: f'data: {{"x": "{t}"'),
}


def exception_texts(exc: BaseException) -> Iterator[str]:
    """What a host can see of ``exc`` as text: the printed traceback, and the str, repr, args and
    notes of it and of every exception chained to it."""
    yield "".join(traceback.format_exception(exc))
    todo, seen = [exc], set()
    while todo:
        current = todo.pop()
        if id(current) in seen:
            continue
        seen.add(id(current))
        yield from (str(current), repr(current), repr(current.args), repr(getattr(current, "__notes__", None)))
        for name in ("message", "body"):
            yield repr(getattr(current, name, None))
        todo += [e for e in (current.__cause__, current.__context__) if e is not None]


class Records(logging.Handler):
    def __init__(self) -> None:
        super().__init__(logging.DEBUG)
        self.texts: list[str] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.texts.append(logging.Formatter().format(record))


@contextlib.contextmanager
def logged() -> Iterator[Records]:
    """Every record of the loggers that could quote a request, at every level."""
    records = Records()
    loggers = [logging.getLogger(name) for name in ("agentloop", "httpx", "httpcore")]
    levels = [logger.level for logger in loggers]
    for logger in loggers:
        logger.addHandler(records)
        logger.setLevel(logging.DEBUG)
    try:
        yield records
    finally:
        for logger, level in zip(loggers, levels, strict=True):
            logger.removeHandler(records)
            logger.setLevel(level)


# A credential of any printable ASCII (an HTTP header carries no other): regular-expression
# metacharacters, quotes and backslashes included; from 4 characters (a header value shorter
# than that is not taken for a credential) to longer than any excerpt an error quotes.
_ascii = st.characters(min_codepoint=0x21, max_codepoint=0x7E)
credential = st.text(_ascii, min_size=4, max_size=300)
#: What a URL's password or query value is, percent-encoded in the URL.
url_part = st.text(st.characters(min_codepoint=0x21, max_codepoint=0x7E), min_size=4, max_size=80)
#: Credentials no header can carry (a line break read with the key, a non-ASCII letter): refused
#: without being quoted.
unusual = st.text(min_size=4, max_size=40).filter(lambda t: not (t.isascii() and t.isprintable() and t == t.strip()))
#: Credentials that are words of every request (what the URL, a header or JSON holds).
common = st.sampled_from(["POST", "https", "application/json", "messages", "user-agent", "proxy.example", "error"])


async def _drive(kind: str, failure: str, secrets: dict[str, str], session: Path) -> list[str]:
    """Every text the host can see when ``failure`` happens to a request of a ``kind`` model."""
    url = f"https://user:{quote(secrets['password'], safe='')}@proxy.example/v1?api-version=1&key={quote(secrets['query'], safe='')}"
    texts: list[str] = []
    transport = httpx.MockTransport(FAILURES[failure])
    async with httpx.AsyncClient(transport=transport, headers={"x-client-token": secrets["client"]}) as client:
        try:
            model = MODELS[kind]("m", api_key=secrets["key"], base_url=url, http_client=client,
                                 extra_headers={"x-gateway-token": secrets["header"]})  # fmt: skip
        except ValueError as exc:  # a header an HTTP request cannot carry, refused at once
            return list(exception_texts(exc))
        texts += [repr(model), str(model)]
        request = ModelRequest(messages=[Message.user("hi")])
        try:
            async with contextlib.aclosing(model.stream(request, AbortController().signal)) as stream:
                texts += [repr(ev) async for ev in stream]
        except Exception as exc:
            texts += exception_texts(exc)
        engine = QueryEngine(model, retry_budget=1, session=JsonlSession(session))
        texts += [t for ev in [ev async for ev in engine.run("hi")] for t in (repr(ev), event_json(ev))]
        engine.session.close()  # type: ignore[union-attr]
        texts += [repr(engine), session.read_text()]
    return texts


#: Credentials nobody would draw, for the texts a failure shows whatever the credentials are.
_SENTINELS = {name: f"Sentinel{name}Q7xZ9vW2" for name in ("key", "header", "client", "password", "query")}
_baselines: dict[tuple[str, str], str] = {}


def baseline(kind: str, failure: str) -> str:
    """Every text ``failure`` shows with credentials that occur nowhere else, those marked: a
    credential that is a word of it ("base", "POST") shows there whatever is redacted."""
    key = (kind, failure)
    if key not in _baselines:
        with tempfile.TemporaryDirectory() as folder, logged() as records:
            texts = asyncio.run(_drive(kind, failure, _SENTINELS, Path(folder) / "s.jsonl"))
        joined = "\n".join([*texts, *records.texts])
        for value in _SENTINELS.values():
            joined = joined.replace(value, MARK)
        _baselines[key] = joined.replace(MARK, "\x00")
    return _baselines[key]


@given(
    kind=st.sampled_from(sorted(MODELS)),
    failure=st.sampled_from(sorted(FAILURES)),
    key=st.one_of(credential, common, st.text(_ascii, min_size=1, max_size=3), unusual),
    header=st.one_of(credential, common, unusual),
    client=credential,
    password=url_part,
    query=url_part,
)
def test_no_failure_of_a_request_shows_a_credential(
    kind: str, failure: str, key: str, header: str, client: str, password: str, query: str
) -> None:
    secrets = {"key": key, "header": header, "client": client, "password": password, "query": query}
    with tempfile.TemporaryDirectory() as folder, logged() as records:
        texts = asyncio.run(_drive(kind, failure, secrets, Path(folder) / "s.jsonl"))
    usual = baseline(kind, failure)
    checked = [s for s in secrets.values() if not any(piece in usual for piece in pieces(s))]
    shown = [(t[:300], found) for t in [*texts, *records.texts] if (found := leaked(checked, t))]
    assert not shown, shown
    sendable = all(v.isascii() and v.isprintable() and v == v.strip() for v in (key, header))
    if failure.isdigit() and sendable:  # the error quotes what the server said, credentials marked
        assert any(MARK in t for t in texts if "Error" in t)


class _Opaque(Exception):
    """An error whose text is not its args: scrubbing its args cannot clean it."""

    def __init__(self, text: str) -> None:
        super().__init__()
        self.text = text

    def __str__(self) -> str:
        return self.text


async def _fail_with(handler: Callable[[httpx.Request], httpx.Response]) -> BaseException:
    async with httpx.AsyncClient(transport=httpx.MockTransport(handler)) as client:
        model = OpenAIChatModel("m", api_key="sk-audit-0123456789abcdef", http_client=client)
        try:
            async with contextlib.aclosing(model.stream(ModelRequest(messages=[Message.user("hi")]), AbortController().signal)) as s:
                async for _ in s:
                    pass
        except Exception as exc:
            return exc
    raise AssertionError("the request did not fail")


async def test_a_note_on_a_transport_error_is_scrubbed_in_the_printed_traceback() -> None:
    exc = await _fail_with(_raises(_noted))
    printed = "".join(traceback.format_exception(exc))
    assert "sk-audit-0123456789abcdef" not in printed
    assert f"authorization: {MARK}" in printed  # the note is still there, the credential marked in it


async def test_an_error_of_the_hosts_own_transport_is_raised_scrubbed() -> None:
    exc = await _fail_with(_raises(lambda r, t: OSError(f"proxy refused {t}")))
    assert type(exc) is OSError
    assert "sk-audit-0123456789abcdef" not in "".join(traceback.format_exception(exc))
    assert f"authorization: {MARK}" in str(exc)


async def test_an_error_whose_text_cannot_be_scrubbed_is_not_shown() -> None:
    exc = await _fail_with(_raises(lambda r, t: _Opaque(f"proxy refused {t}")))
    assert isinstance(exc, ModelError)
    assert "_Opaque" in str(exc)
    assert exc.__cause__ is None and exc.__suppress_context__
    assert "sk-audit-0123456789abcdef" not in "".join(traceback.format_exception(exc))


def _chat(*chunks: dict[str, Any]) -> bytes:
    lines = [f"data: {json.dumps({'id': 'c', 'object': 'chat.completion.chunk', 'choices': [c]})}\n\n" for c in chunks]
    return ("".join(lines) + "data: [DONE]\n\n").encode()


_CALL = _chat({"index": 0, "delta": {"tool_calls": [{"index": 0, "id": "call_1", "type": "function",
                                                     "function": {"name": "env", "arguments": "{}"}}]},
               "finish_reason": "tool_calls"})  # fmt: skip
_DONE = _chat({"index": 0, "delta": {"content": "done"}, "finish_reason": "stop"})


async def test_a_subagent_on_a_model_of_its_own_never_sends_its_parents_key() -> None:
    parent_key, child_key = "sk-parent-0123456789abcdefXYZ", "sk-child-9876543210fedcbaQRS"
    bodies: list[bytes] = []

    def serve(request: httpx.Request) -> httpx.Response:
        bodies.append(request.content)
        return httpx.Response(200, headers={"content-type": "text/event-stream"}, content=_CALL if len(bodies) == 1 else _DONE)

    @tool
    async def env() -> str:
        """Print the environment."""
        return f"OPENAI_API_KEY={child_key}\nANTHROPIC_API_KEY={parent_key}"

    async with httpx.AsyncClient(transport=httpx.MockTransport(serve)) as client:
        parent = QueryEngine(AnthropicModel("m", api_key=parent_key, http_client=client))
        child = parent.subagent(agent_id="worker", model=OpenAIChatModel("m", api_key=child_key, http_client=client),
                                tools=[env])  # fmt: skip
        events = [ev async for ev in child.run("look")]
    assert len(bodies) == 2
    shown = [*(b.decode() for b in bodies), *map(event_json, events), *(m.model_dump_json() for m in child.messages)]
    assert not [t for t in shown if parent_key in t or child_key in t]
    assert f"ANTHROPIC_API_KEY={MARK}" in bodies[1].decode()


_MCP_SERVER = str(Path(__file__).with_name("mcp_server.py"))


async def test_an_mcp_servers_own_credentials_never_reach_the_model(tmp_path: Path) -> None:
    token = "ghp_mcpAuditToken0123456789abcdef"
    srv = MCPServer.stdio(sys.executable, [_MCP_SERVER, "--markers", str(tmp_path)], env={"GITHUB_TOKEN": token})
    async with srv:
        tools = {t.name: t for t in await srv.list_tools()}
        ctx = ToolContext(signal=AbortController().signal, tool_use_id="toolu_1", engine=None)  # type: ignore[arg-type]
        echoed = await tools["echo"].handler({"text": f"token is {token}"}, ctx)
        assert isinstance(echoed, ToolResultBlock)
        assert echoed.content == f"token is {MARK}"
        failed = await tools["fail"].handler({"message": f"bad token {token}"}, ctx)
        assert isinstance(failed, ToolResultBlock)
        assert failed.is_error and failed.content == f"Error executing tool fail: bad token {MARK}"


def test_an_http_mcp_servers_credential_headers_and_url_are_known_to_it() -> None:
    srv = MCPServer.http("https://mcp.example/mcp?access_token=urlToken0123456789abcdefg",
                         headers={"Authorization": "Bearer hdrToken0123456789abcdefg", "x-trace": "plainValue0123456789xyz"})  # fmt: skip
    assert "hdrToken0123456789abcdefg" in srv._secrets
    assert "urlToken0123456789abcdefg" in srv._secrets
    assert "plainValue0123456789xyz" not in srv._secrets


async def test_a_tool_result_carrying_the_key_is_marked_everywhere_and_in_a_fork(tmp_path: Path) -> None:
    key, other = "sk-main-0123456789abcdefXYZ0", "sk-fork-9876543210fedcbaQRS1"
    bodies: list[bytes] = []

    def serve(request: httpx.Request) -> httpx.Response:
        bodies.append(request.content)
        return httpx.Response(200, headers={"content-type": "text/event-stream"}, content=_CALL if len(bodies) == 1 else _DONE)

    @tool
    async def env() -> str:
        """Print the environment."""
        return f"OPENAI_API_KEY={key}"

    async with httpx.AsyncClient(transport=httpx.MockTransport(serve)) as client:
        session = JsonlSession(tmp_path / "main.jsonl")
        main = QueryEngine(OpenAIChatModel("m", api_key=key, http_client=client), tools=[env], session=session)
        events = [ev async for ev in main.run("look")]
        session.close()
        fork = QueryEngine(OpenAIChatModel("m", api_key=other, http_client=client), messages=main.messages)
        events += [ev async for ev in fork.run("again")]
    shown = [*(b.decode() for b in bodies), *map(event_json, events), *map(repr, events),
             (tmp_path / "main.jsonl").read_text()]  # fmt: skip
    assert not [t for t in shown if key in t or other in t]
    assert f"OPENAI_API_KEY={MARK}" in bodies[1].decode() and f"OPENAI_API_KEY={MARK}" in bodies[2].decode()


def test_an_mcp_header_no_request_can_carry_is_refused_without_being_quoted() -> None:
    token = "mcpLineBreakToken0123456789"
    try:
        MCPServer.http("https://mcp.example/mcp", headers={"Authorization": f"Bearer {token}\n"})
    except ValueError as exc:
        assert "Authorization" in str(exc)
        assert token not in "".join(traceback.format_exception(exc))
    else:
        raise AssertionError("the header was taken")


async def test_a_tools_progress_report_carrying_the_key_is_marked() -> None:
    key = "sk-progress-0123456789abcdefXYZ"
    calls = 0

    def serve(request: httpx.Request) -> httpx.Response:
        nonlocal calls
        calls += 1
        return httpx.Response(200, headers={"content-type": "text/event-stream"}, content=_CALL if calls == 1 else _DONE)

    @tool
    async def env(ctx: ToolContext) -> str:
        """Print the environment."""
        ctx.emit(ToolProgress(tool_use_id=ctx.tool_use_id, text=f"OPENAI_API_KEY={key}"))
        return "done"

    async with httpx.AsyncClient(transport=httpx.MockTransport(serve)) as client:
        engine = QueryEngine(OpenAIChatModel("m", api_key=key, http_client=client), tools=[env])
        events = [ev async for ev in engine.run("look")]
    progress = [ev for ev in events if isinstance(ev, ToolProgress)]
    assert [ev.text for ev in progress] == [f"OPENAI_API_KEY={MARK}"]
    assert not [t for t in map(event_json, events) if key in t]
