"""Credentials never show: an HTTP model's key, its credential headers (its own and those of the
host's ``http_client``) and the credentials in its ``base_url`` stay out of every error (message,
args, notes, chained causes, the printed traceback), repr, log record, event, ``event_json`` and
session file, on every failure a transport can produce, and out of what a tool result carrying one
becomes (a subagent's, on a model of its own, included)."""

from __future__ import annotations

import asyncio
import contextlib
import functools
import json
import logging
import re
import shlex
import sys
import tempfile
import traceback
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any
from unittest import mock
from urllib.parse import quote, urlencode

import httpx
import httpx2
import pytest
from hypothesis import example, given, settings
from hypothesis import strategies as st

from agentloop import (
    AbortController,
    AbortSignal,
    Message,
    Policy,
    QueryEngine,
    ScriptedModel,
    Tool,
    ToolContext,
    ToolProgress,
    ToolResultBlock,
    TurnEnded,
    event_json,
    tool,
)
from agentloop._errors import ModelError, ProviderConnectionError
from agentloop.mcp import MCPServer
from agentloop.models import AnthropicModel, ModelRequest, OpenAIChatModel, OpenAIResponsesModel
from agentloop.models._http import Redactor
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
    "long error event": _stream(lambda t: _sse_error(" ".join([t] * 40))),  # quoted cut: start and end
    "long transport error": _raises(lambda r, t: httpx.ConnectError(" ".join([t] * 40), request=r)),
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
        yield from carried_texts(current)
        todo += [e for e in (current.__cause__, current.__context__) if e is not None]


def carried_texts(exc: BaseException) -> Iterator[str]:
    """The text of the objects ``exc`` carries: an httpx (or the MCP SDK's httpx2) error's request
    (its URL and headers) and a status error's response's, a JSON decoding error's document, an
    `OSError`'s file names."""
    requests = [getattr(exc, "_request", None)]
    if isinstance(exc, httpx.HTTPStatusError | httpx2.HTTPStatusError):
        requests += [exc.request, exc.response.request]
    for request in (r for r in requests if isinstance(r, httpx.Request | httpx2.Request)):
        yield from (str(request.url), repr(request.headers.multi_items()), repr(request.content))
    if isinstance(exc, json.JSONDecodeError):
        yield exc.doc
    if isinstance(exc, OSError):
        yield repr((exc.filename, exc.filename2))


class Records(logging.Handler):
    def __init__(self) -> None:
        super().__init__(logging.DEBUG)
        self.texts: list[str] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.texts.append(logging.Formatter().format(record))


@contextlib.contextmanager
def logged(*more: str) -> Iterator[Records]:
    """Every record of the loggers that could quote a request (and of ``more``), at every level."""
    records = Records()
    loggers = [logging.getLogger(name) for name in ("agentloop", "httpx", "httpcore", *more)]
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
_baselines: dict[tuple[str, str, frozenset[str]], str] = {}


def sendable(value: str) -> bool:
    """Whether an HTTP header can carry ``value``."""
    return value.isascii() and value.isprintable() and value == value.strip()


def baseline(kind: str, failure: str, refused: frozenset[str] = frozenset()) -> str:
    """Every text ``failure`` shows with credentials that occur nowhere else, those marked: a
    credential that is a word of it ("base", "POST") shows there whatever is redacted. Those named
    in ``refused`` are drawn as no header can carry (a line break at the end): the error that
    refuses the request has words of its own ("extra_headers")."""
    key = (kind, failure, refused)
    if key not in _baselines:
        drawn = {name: value + "\n" if name in refused else value for name, value in _SENTINELS.items()}
        with tempfile.TemporaryDirectory() as folder, logged() as records:
            texts = asyncio.run(_drive(kind, failure, drawn, Path(folder) / "s.jsonl"))
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
# A key that is a piece of the proxy's host name, with a chained cause that echoes the request.
@example(kind="anthropic", failure="chained cause", key="prox", header="0000", client="0000", password="0000",
         query="0000")  # fmt: skip
# A client header that ends with a double quote, which the error body's JSON escapes.
@example(kind="anthropic", failure="400", key="0000", header="0000", client='0001000100010001000000000000000"',
         password="0000", query="0000")  # fmt: skip
# A key that is a word of the error refusing a header no request can carry.
@example(kind="chat", failure="400", key="extr", header="tok\n", client="0000", password="0000", query="0000")
def test_no_failure_of_a_request_shows_a_credential(
    kind: str, failure: str, key: str, header: str, client: str, password: str, query: str
) -> None:
    secrets = {"key": key, "header": header, "client": client, "password": password, "query": query}
    with tempfile.TemporaryDirectory() as folder, logged() as records:
        texts = asyncio.run(_drive(kind, failure, secrets, Path(folder) / "s.jsonl"))
    refused = frozenset(name for name in ("key", "header") if not sendable(secrets[name]))
    usual = baseline(kind, failure, refused)
    checked = [s for s in secrets.values() if not any(piece in usual for piece in pieces(s))]
    shown = [(t[:300], found) for t in [*texts, *records.texts] if (found := leaked(checked, t))]
    assert not shown, shown
    if failure.isdigit() and not refused:  # the error quotes what the server said, credentials marked
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


@pytest.mark.parametrize(("kind", "raised"), [(ValueError, ValueError), (OSError, ProviderConnectionError)])
async def test_an_error_of_the_hosts_own_transport_is_raised_scrubbed(
    kind: type[Exception], raised: type[Exception]
) -> None:
    # A programming error is raised as it is; an OSError is a connection failure, retried.
    exc = await _fail_with(_raises(lambda r, t: kind(f"proxy refused {t}")))
    assert type(exc) is raised
    assert "sk-audit-0123456789abcdef" not in "".join(traceback.format_exception(exc))
    assert f"authorization: {MARK}" in str(exc)


async def test_an_error_whose_text_cannot_be_scrubbed_is_not_shown() -> None:
    exc = await _fail_with(_raises(lambda r, t: _Opaque(f"proxy refused {t}")))
    assert isinstance(exc, ModelError)
    assert "_Opaque" in str(exc)
    assert exc.__cause__ is None and exc.__suppress_context__
    assert "sk-audit-0123456789abcdef" not in "".join(traceback.format_exception(exc))


async def test_a_chained_cause_is_scrubbed_when_the_key_is_a_piece_of_the_host_name() -> None:
    # The httpx error's request is replaced by a scrubbed copy; scrubbing "prox" out of the host
    # name made an invalid URL, and the error that raised left the cause below it unscrubbed.
    async with httpx.AsyncClient(transport=httpx.MockTransport(_raises(_caused))) as client:
        model = AnthropicModel("m", api_key="prox", base_url="https://proxy.example/v1", http_client=client,
                               extra_headers={"x-gateway-token": "gw-token-0123456789"})  # fmt: skip
        with pytest.raises(ModelError) as caught:
            async with contextlib.aclosing(model.stream(ModelRequest(messages=[Message.user("hi")]), AbortController().signal)) as s:
                async for _ in s:
                    pass
    cause = caught.value.__cause__
    assert isinstance(cause, httpx.ConnectError) and isinstance(cause.__cause__, OSError)
    assert "gw-token-0123456789" not in "".join(traceback.format_exception(caught.value))
    assert f"x-gateway-token: {MARK}" in str(cause.__cause__)
    assert cause.request.url.host == "proxy.example"


async def test_a_credential_an_error_body_escapes_is_scrubbed_whole() -> None:
    # The body's JSON writes the header's '"' as '\"': the key inside it was scrubbed out of the
    # escaped text, which left the rest of the header's value to show.
    token = 'tok-0123456789abcdef-0000-0000"'
    async with httpx.AsyncClient(transport=httpx.MockTransport(_status(400)), headers={"x-client-token": token}) as client:
        model = AnthropicModel("m", api_key="0000", http_client=client)
        with pytest.raises(ModelError) as caught:
            async with contextlib.aclosing(model.stream(ModelRequest(messages=[Message.user("hi")]), AbortController().signal)) as s:
                async for _ in s:
                    pass
    texts = list(exception_texts(caught.value))
    assert not [t for t in texts if "tok-0123456789" in t or "abcdef-" in t]
    assert f"x-client-token: {MARK}" in str(caught.value)


@pytest.mark.parametrize(
    "form",
    [json.dumps, repr, lambda v: repr(v.encode()), lambda v: quote(v, safe=""), lambda v: urlencode({"q": v})],
    ids=["json", "repr", "bytes repr", "percent-encoded", "form-encoded"],
)
def test_a_credential_is_scrubbed_in_each_form_an_error_can_show_it_in(form: Callable[[str], str]) -> None:
    secret = 'A"B\\C\'D/E:F@G=H I'
    assert form(secret) != secret
    scrubbed = Redactor([secret]).scrub(f"{form(secret)} + {secret}")
    assert scrubbed.count(MARK) == 2
    assert not set(scrubbed.replace(MARK, "")) & set("ABCDEFGHI%"), scrubbed


def _chat(*chunks: dict[str, Any]) -> bytes:
    lines = [f"data: {json.dumps({'id': 'c', 'object': 'chat.completion.chunk', 'choices': [c]})}\n\n" for c in chunks]
    return ("".join(lines) + "data: [DONE]\n\n").encode()


_CALL = _chat({"index": 0, "delta": {"tool_calls": [{"index": 0, "id": "call_1", "type": "function",
                                                     "function": {"name": "env", "arguments": "{}"}}]},
               "finish_reason": "tool_calls"})  # fmt: skip
_DONE = _chat({"index": 0, "delta": {"content": "done"}, "finish_reason": "stop"})


def _env_then_done(bodies: list[bytes]) -> httpx.AsyncClient:
    """A client of a mock Chat Completions API that keeps each request's body: the first is
    answered with a call of `env`, the rest with "done"."""

    def serve(request: httpx.Request) -> httpx.Response:
        bodies.append(request.content)
        return httpx.Response(200, headers={"content-type": "text/event-stream"}, content=_CALL if len(bodies) == 1 else _DONE)

    return httpx.AsyncClient(transport=httpx.MockTransport(serve))


def _env_tool(output: str) -> Tool:
    """A tool `env` that prints `output` as the environment."""

    @tool
    async def env() -> str:
        """Print the environment."""
        return output

    return env


async def test_a_subagent_on_a_model_of_its_own_never_sends_its_parents_key() -> None:
    parent_key, child_key = "sk-parent-0123456789abcdefXYZ", "sk-child-9876543210fedcbaQRS"
    bodies: list[bytes] = []
    env = _env_tool(f"OPENAI_API_KEY={child_key}\nANTHROPIC_API_KEY={parent_key}")
    async with _env_then_done(bodies) as client:
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
    env = _env_tool(f"OPENAI_API_KEY={key}")
    async with _env_then_done(bodies) as client:
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
    @tool
    async def env(ctx: ToolContext) -> str:
        """Print the environment."""
        ctx.emit(ToolProgress(tool_use_id=ctx.tool_use_id, text=f"OPENAI_API_KEY={key}"))
        return "done"

    async with _env_then_done([]) as client:
        engine = QueryEngine(OpenAIChatModel("m", api_key=key, http_client=client), tools=[env])
        events = [ev async for ev in engine.run("look")]
    progress = [ev for ev in events if isinstance(ev, ToolProgress)]
    assert [ev.text for ev in progress] == [f"OPENAI_API_KEY={MARK}"]
    assert not [t for t in map(event_json, events) if key in t]


# -- MCP servers: start-up failures, command-line credentials ------------------------------------


def _rpc(body: dict[str, Any], **answer: Any) -> httpx2.Response:
    headers = {"mcp-session-id": "s1"} if body.get("method") == "initialize" else {}
    return httpx2.Response(200, json={"jsonrpc": "2.0", "id": body["id"], **answer}, headers=headers)


def _mcp_answer(request: httpx2.Request) -> httpx2.Response:
    """What a working streamable HTTP MCP server with one tool, ``echo``, answers."""
    if request.method != "POST":
        return httpx2.Response(405 if request.method == "GET" else 200)
    body = json.loads(request.content)
    if "id" not in body:
        return httpx2.Response(202)
    if body["method"] == "initialize":
        info = {"name": "fake", "version": "1"}
        return _rpc(body, result={"protocolVersion": body["params"]["protocolVersion"], "capabilities": {"tools": {}}, "serverInfo": info})
    if body["method"] == "tools/list":
        return _rpc(body, result={"tools": [{"name": "echo", "inputSchema": {"type": "object"}}]})
    return _rpc(body, result={"content": [{"type": "text", "text": "ok"}], "isError": False})


def _mcp_echo(request: httpx2.Request) -> str:
    return " ".join([str(request.url), *(f"{k}: {v}" for k, v in request.headers.items())])


def _mcp_status(code: int, *, plain: bool = False) -> Callable[[httpx2.Request], httpx2.Response]:
    def handler(request: httpx2.Request) -> httpx2.Response:
        text = _mcp_echo(request)
        if plain:
            return httpx2.Response(code, text=f"denied: {text}", headers={"content-type": "text/plain"})
        headers = {"x-echo": text, "www-authenticate": f"Bearer error={text}", "content-type": "application/json"}
        return httpx2.Response(code, headers=headers, json={"error": {"message": text}})

    return handler


def _mcp_raise(make: Callable[[httpx2.Request, str], BaseException]) -> Callable[[httpx2.Request], httpx2.Response]:
    def handler(request: httpx2.Request) -> httpx2.Response:
        raise make(request, _mcp_echo(request))

    return handler


def _mcp_rpc_error(request: httpx2.Request) -> httpx2.Response:
    text = _mcp_echo(request)
    return _rpc(json.loads(request.content), error={"code": -32001, "message": f"refused: {text}", "data": text})


def _on(method: str, failing: Callable[[httpx2.Request], httpx2.Response]) -> Callable[[httpx2.Request], httpx2.Response]:
    """A working server but for the requests of ``method`` (a JSON-RPC method, or ``GET``)."""

    def handler(request: httpx2.Request) -> httpx2.Response:
        if request.method == method or (request.method == "POST" and json.loads(request.content).get("method") == method):
            return failing(request)
        return _mcp_answer(request)

    return handler


#: Every way an HTTP MCP server's start-up can fail: at connecting, at ``initialize``, at the first
#: tools/list, at the stream the SDK opens for the server's messages.
MCP_FAILURES: dict[str, Callable[[httpx2.Request], httpx2.Response]] = {
    **{f"{code} at initialize": _on("initialize", _mcp_status(code)) for code in (401, 403, 500)},
    "plain 401 at initialize": _on("initialize", _mcp_status(401, plain=True)),
    "redirect": _on("initialize", lambda r: httpx2.Response(302, headers={"location": f"https://elsewhere.example/{_mcp_echo(r)[:200]}"})),
    "web page": _on("initialize", lambda r: httpx2.Response(200, text=f"<html>{_mcp_echo(r)}</html>", headers={"content-type": "text/html"})),
    "connect error": _on("initialize", _mcp_raise(lambda r, t: httpx2.ConnectError(f"cannot connect: {t}", request=r))),
    "host's own error": _on("initialize", _mcp_raise(lambda r, t: OSError(f"proxy refused {t}"))),
    "initialize refused": _on("initialize", _mcp_rpc_error),
    "tools/list refused": _on("tools/list", _mcp_rpc_error),
    "401 at tools/list": _on("tools/list", _mcp_status(401)),
    "401 to the GET stream": _on("GET", _mcp_status(401)),
}


async def _drive_mcp(failure: str, secrets: dict[str, str]) -> list[str]:
    """Every text the host can see when an HTTP MCP server's start-up fails with ``failure``."""
    url = f"https://user:{quote(secrets['password'], safe='')}@mcp.example/mcp?access_token={quote(secrets['query'], safe='')}"
    headers = {"Authorization": f"Bearer {secrets['header']}", "x-api-key": secrets["key"]}
    client = functools.partial(httpx2.AsyncClient, transport=httpx2.MockTransport(MCP_FAILURES[failure]))
    texts: list[str] = []
    with mock.patch.object(httpx2, "AsyncClient", client):
        srv = MCPServer.http(url, headers=headers, connect_timeout=10)
        texts += [repr(srv), str(srv)]
        try:
            async with asyncio.timeout(20), srv:
                await srv.list_tools()
        except Exception as exc:
            texts += exception_texts(exc)
        await srv.aclose()
    return texts


_mcp_baselines: dict[str, str] = {}


def _mcp_baseline(failure: str) -> str:
    if failure not in _mcp_baselines:
        sentinels = {name: f"Sentinel{name}Q7xZ9vW2" for name in ("key", "header", "password", "query")}
        with logged(*_MCP_LOGGERS) as records:
            texts = asyncio.run(_drive_mcp(failure, sentinels))
        joined = "\n".join([*texts, *records.texts])
        for value in sentinels.values():
            joined = joined.replace(value, MARK)
        _mcp_baselines[failure] = joined.replace(MARK, "\x00")
    return _mcp_baselines[failure]


#: The loggers an MCP connection's failure may be told on: agentloop's, the SDK's, its HTTP client's.
_MCP_LOGGERS = ("mcp", "mcp.client.streamable_http", "mcp.client.session", "mcp.shared.jsonrpc_dispatcher", "httpx2")


@settings(max_examples=30)
@given(
    failure=st.sampled_from(sorted(MCP_FAILURES)),
    key=st.one_of(credential, common),
    header=credential,
    password=url_part,
    query=url_part,
)
def test_no_start_up_failure_of_an_http_mcp_server_shows_a_credential(
    failure: str, key: str, header: str, password: str, query: str
) -> None:
    secrets = {"key": key, "header": header, "password": password, "query": query}
    with logged(*_MCP_LOGGERS) as records:
        texts = asyncio.run(_drive_mcp(failure, secrets))
    usual = _mcp_baseline(failure)
    checked = [s for s in secrets.values() if not any(piece in usual for piece in pieces(s))]
    shown = [(t[:300], found) for t in [*texts, *records.texts] if (found := leaked(checked, t))]
    assert not shown, shown


#: A stdio MCP server that says its command line and its ``SERVICE_TOKEN`` wherever it can: on
#: stdout and stderr before it exits (mode ``exit``), in the error answering ``initialize`` or
#: ``tools/list`` (mode: that method), and as the result of its tool ``whoami``. The mode is read
#: from the file named by its first argument at each start.
_LEAKY_SERVER = r"""
import json, os, sys
mode = open(sys.argv[1]).read().strip()
said = " ".join(sys.argv[2:]) + " env " + os.environ.get("SERVICE_TOKEN", "")
if mode == "exit":
    print(f"starting with {said}", flush=True)
    sys.stderr.write(f"bad credentials: {said}\n")
    sys.exit(3)
for line in sys.stdin:
    msg = json.loads(line)
    if "id" not in msg:
        continue
    if msg["method"] == mode:
        reply = {"error": {"code": -32001, "message": f"refused: {said}", "data": {"said": said}}}
    elif msg["method"] == "initialize":
        info = {"name": "leaky", "version": "1"}
        reply = {"result": {"protocolVersion": msg["params"]["protocolVersion"], "capabilities": {"tools": {}}, "serverInfo": info}}
    elif msg["method"] == "tools/list":
        reply = {"result": {"tools": [{"name": "whoami", "inputSchema": {"type": "object"}}]}}
    else:
        reply = {"result": {"content": [{"type": "text", "text": said}], "isError": False}}
    print(json.dumps({"jsonrpc": "2.0", "id": msg["id"], **reply}), flush=True)
"""
_ARGV_SECRETS = {
    "option": "optTokenAAAA0123456789abcdef",
    "joined": "apiKeyBBBB0123456789abcdef",
    "url": "urlPassCCCC0123456789abcdef",
    "env": "envTokenDDDD0123456789abcdef",
}


def _leaky(mode_file: Path) -> MCPServer:
    s = _ARGV_SECRETS
    args = ["-c", _LEAKY_SERVER, str(mode_file), "--token", s["option"], f"--api-key={s['joined']}",
            f"https://bob:{s['url']}@git.example/repo.git"]  # fmt: skip
    return MCPServer.stdio(sys.executable, args, env={"SERVICE_TOKEN": s["env"]}, connect_timeout=20)



def test_a_command_lines_credentials_are_those_its_shown_form_hides() -> None:
    from agentloop.mcp._scrub import command_line_credentials

    args = ["--token", "optTok1234", "--api-key=key12345", "Authorization: Bearer hdr12345",
            "https://bob:pa%40ss1234@h.example/x?token=q%2F123456&y=1", "--verbose", "plain"]  # fmt: skip
    found = set(command_line_credentials(args))
    assert {"optTok1234", "key12345", "Bearer hdr12345", "hdr12345", "pa%40ss1234", "pa@ss1234", "q/123456"} <= found
    assert not {"--verbose", "plain", "h.example", "y=1", "bob"} & found

#: The usual ways a password rides on a command line, as a separate argument and inside a script.
_PASSWORD_FORMS: dict[str, Callable[[str], list[str]]] = {
    "curl -u": lambda p: ["curl", "-u", f"bob:{p}", "https://x.example"],
    "curl --user=": lambda p: ["curl", f"--user=bob:{p}"],
    "curl -H": lambda p: ["curl", "-H", f"Authorization: Bearer {p}"],
    "curl -H, no space": lambda p: ["curl", "-H", f"X-Api-Key:{p}"],
    "wget": lambda p: ["wget", f"--http-password={p}", "https://x.example"],
    "mysql -p": lambda p: ["mysql", "-uroot", f"-p{p}", "db"],
    "env prefix": lambda p: ["env", f"PGPASSWORD={p}", "psql"],
    "script": lambda p: ["sh", "-c", f"cd /srv && curl -u bob:{shlex.quote(p)} https://x.example"],
    "script mysql": lambda p: ["bash", "-c", f"mysql -p{shlex.quote(p)} db | tee out"],
    "sshpass -p": lambda p: ["sshpass", "-p", p, "ssh", "-p", "2222", "bob@host.example"],
    "sshpass -p, joined": lambda p: ["sshpass", f"-p{p}", "scp", "file", "host.example:"],
    "redis-cli -a": lambda p: ["redis-cli", "-h", "cache", "-a", p, "ping"],
    "psql URL": lambda p: ["psql", f"postgres://bob:{quote(p, safe='')}@db.example/app"],
    "docker --env=": lambda p: ["docker", "run", f"--env=API_KEY={p}", "image"],
    "script sshpass": lambda p: ["sh", "-c", f"sshpass -p {shlex.quote(p)} ssh host.example uptime"],
}


@given(form=st.sampled_from(sorted(_PASSWORD_FORMS)), password=st.text(_ascii, min_size=4, max_size=60))
@example(form="script sshpass", password="00'0")  # requoted, with [REDACTED] quoted where it stood
def test_a_password_in_the_usual_command_line_forms_is_never_shown(form: str, password: str) -> None:
    from agentloop._process import shown_args
    from agentloop.mcp._scrub import command_line_credentials

    args = _PASSWORD_FORMS[form](password)
    shown = " ".join(shown_args(tuple(args))).replace(MARK, "\x00")
    usual = " ".join(shown_args(tuple(_PASSWORD_FORMS[form]("Sentinel7Qz")))).replace(MARK, "\x00")
    assert password in usual or password not in shown, shown
    assert any(password in value for value in command_line_credentials(args))


@pytest.mark.parametrize("mode", ["exit", "initialize", "tools/list"])
async def test_a_stdio_mcp_server_failing_at_start_up_shows_none_of_its_credentials(tmp_path: Path, mode: str) -> None:
    (tmp_path / "mode").write_text(mode)
    srv = _leaky(tmp_path / "mode")
    with logged(*_MCP_LOGGERS) as records:
        try:
            async with asyncio.timeout(30), srv:
                await srv.list_tools()
        except Exception as exc:
            texts = list(exception_texts(exc))
        else:
            raise AssertionError("the server did not fail")
    secrets = list(_ARGV_SECRETS.values())
    shown = [(t[:300], found) for t in [*texts, *records.texts, repr(srv)] if (found := leaked(secrets, t))]
    assert not shown, shown
    assert f"--token {MARK} --api-key={MARK} https://{MARK}@git.example/repo.git env {MARK}" in texts[0]


async def test_a_stdio_mcp_servers_credentials_stay_out_of_a_run_and_its_start_up_errors(tmp_path: Path) -> None:
    from agentloop.testing import ScriptedModel, ScriptedResponse, ScriptedToolCall

    (tmp_path / "mode").write_text("none")
    call = ScriptedResponse(tool_calls=[ScriptedToolCall("whoami", {})])
    model = ScriptedModel([call, "done", call, "done"])
    texts: list[str] = []
    with logged(*_MCP_LOGGERS) as records:
        async with _leaky(tmp_path / "mode") as srv:
            session = JsonlSession(tmp_path / "s.jsonl")
            engine = QueryEngine(model, tools=await srv.list_tools(), session=session)
            events = [ev async for ev in engine.run("who?")]
            (tmp_path / "mode").write_text("initialize")  # the server restarts, and now refuses
            await srv.reset()
            events += [ev async for ev in engine.run("again")]
            session.close()
    texts += [*map(event_json, events), *map(repr, events), (tmp_path / "s.jsonl").read_text(), *records.texts]
    texts += [m.model_dump_json() for r in model.requests for m in r.messages]
    secrets = list(_ARGV_SECRETS.values())
    assert not [(t[:300], found) for t in texts if (found := leaked(secrets, t))]
    results = [b for m in engine.messages for b in m.content if isinstance(b, ToolResultBlock)]
    assert [r.is_error for r in results] == [False, True]
    assert results[0].text == f"--token {MARK} --api-key={MARK} https://{MARK}@git.example/repo.git env {MARK}"
    assert f"refused: --token {MARK}" in results[1].text


# -- the host's own callbacks ---------------------------------------------------------------------

_HOOK_KEY = "sk-hooks-0123456789abcdefXYZ0"


def _quoting(where: str) -> RuntimeError:
    return RuntimeError(f"{where} saw Authorization: Bearer {_HOOK_KEY}")


class _Quoting(Policy):
    """A policy whose every hook raises an error quoting the model's key (``bind`` once bound)."""

    name = "quoting"

    def __init__(self) -> None:
        self.bound = False

    def bind(self, tools: Any) -> None:
        if self.bound:
            raise _quoting("bind")
        self.bound = True

    def begin_turn(self, *, real_user: bool) -> None:
        raise _quoting("begin_turn")

    def begin_attempt(self) -> None:
        raise _quoting("begin_attempt")

    def on_stream(self, event: Any) -> None:
        raise _quoting("on_stream")

    def on_response(self, message: Message) -> None:
        raise _quoting("on_response")

    def on_results(self, message: Message, results: Any) -> None:
        raise _quoting("on_results")


class _AlsoQuoting(_Quoting):
    name = "also quoting"  # two stream watchers: the engine asks them as a panel


@pytest.mark.parametrize("panel", [False, True])
async def test_an_error_of_the_hosts_callbacks_is_logged_without_the_engines_credentials(panel: bool) -> None:
    @tool
    async def env(ctx: ToolContext) -> str:
        """Stop the run."""
        ctx.engine.interrupt("enough")
        return "stopped"

    def watcher(tools: Any) -> None:
        raise _quoting("tool watcher")

    def abort_hook(reason: str) -> None:
        raise _quoting("abort hook")

    policies = [_Quoting(), _AlsoQuoting()] if panel else [_Quoting()]
    with logged() as records:
        async with _env_then_done([]) as client:
            engine = QueryEngine(OpenAIChatModel("m", api_key=_HOOK_KEY, http_client=client), tools=[env], policies=policies)
            engine.watch_tools(watcher)
            engine.on_abort(abort_hook)
            engine.tools = [env]  # a policy's bind raises (after the first)
            [ev async for ev in engine.run("look")]
    assert not [t for t in records.texts if _HOOK_KEY in t]
    for where in ("bind", "begin_turn", "begin_attempt", "on_stream", "on_response", "tool watcher", "abort hook"):
        quoted = [t for t in records.texts if f"{where} saw Authorization: Bearer {MARK}" in t]
        assert quoted and "Traceback (most recent call last)" in quoted[0], where


async def test_a_raising_abort_listener_of_an_engines_run_is_logged_without_its_credentials() -> None:
    outside = AbortController()  # a signal of the host's own, not the engine's

    @tool
    async def env(ctx: ToolContext) -> str:
        """Stop the run."""
        child = AbortController(parent=ctx.signal)
        derived = AbortSignal.any([ctx.signal, AbortSignal.timeout(3600)])
        for signal, where in ((ctx.signal, "run"), (child.signal, "child"), (derived, "derived"), (outside.signal, "host")):
            signal.add_listener(functools.partial(_raise_quoting, f"{where} listener"))
        ctx.engine.interrupt("enough")
        return "stopped"

    with logged() as records:
        async with _env_then_done([]) as client:
            engine = QueryEngine(OpenAIChatModel("m", api_key=_HOOK_KEY, http_client=client), tools=[env])
            [ev async for ev in engine.run("look")]
            outside.abort()
    for where in ("run", "child", "derived"):
        quoted = [t for t in records.texts if f"{where} listener saw Authorization: Bearer {MARK}" in t]
        assert quoted and "Traceback (most recent call last)" in quoted[0], where
        assert not [t for t in records.texts if f"{where} listener saw" in t and _HOOK_KEY in t], where
    # A signal the engine never made is not its to scrub: logged as it is.
    assert [t for t in records.texts if f"host listener saw Authorization: Bearer {_HOOK_KEY}" in t]


def _raise_quoting(where: str, reason: str) -> None:
    raise _quoting(where)


class _FailingStore:
    """A session store whose every write fails with an error quoting the model's key."""

    def append_message(self, message: Message) -> None:
        raise _quoting("append_message")

    def append_event(self, event: object) -> None:
        raise _quoting("append_event")

    def sidechain(self, agent_id: str) -> _FailingStore:
        return self

    def close(self) -> None:
        pass


async def test_a_failing_session_store_is_reported_without_the_engines_credentials() -> None:
    def serve(request: httpx.Request) -> httpx.Response:
        return httpx.Response(200, headers={"content-type": "text/event-stream"}, content=_DONE)

    with logged() as records:
        async with httpx.AsyncClient(transport=httpx.MockTransport(serve)) as client:
            engine = QueryEngine(OpenAIChatModel("m", api_key=_HOOK_KEY, http_client=client), session=_FailingStore())
            [ev async for ev in engine.run("look")]
    assert engine.session_errors and records.texts
    assert not [t for t in [*engine.session_errors, *records.texts] if _HOOK_KEY in t]
    assert f"append_message saw Authorization: Bearer {MARK}" in engine.session_errors[0]


class _Leaky:
    """What a host's callback returned by mistake: an object whose repr is the model's key."""

    def __repr__(self) -> str:
        return _HOOK_KEY


#: What a host's callback returned instead of a verdict or a decision, its repr quoting the key:
#: whole, or in a text that a shortened repr would show the start and end of.
_WRONG_ANSWERS = {"object": _Leaky, "text": lambda: f"deny: the proxy refused Authorization: Bearer {_HOOK_KEY}"}


class _Garbage(Policy):
    """A policy whose hooks return what is not a verdict."""

    name = "garbage"

    def __init__(self, make: Callable[[], object]) -> None:
        self.make = make

    def on_stream(self, event: Any) -> Any:
        return self.make()

    def on_response(self, message: Message) -> Any:
        return self.make()

    def on_results(self, message: Message, results: Any) -> Any:
        return self.make()


class _AlsoGarbage(_Garbage):
    name = "also garbage"  # two stream watchers: the engine asks them as a panel


@pytest.mark.parametrize("panel", [False, True])
@pytest.mark.parametrize("kind", sorted(_WRONG_ANSWERS))
async def test_what_a_policy_returned_instead_of_a_verdict_is_logged_without_the_key(kind: str, panel: bool) -> None:
    make = _WRONG_ANSWERS[kind]
    policies = [_Garbage(make), _AlsoGarbage(make)] if panel else [_Garbage(make)]
    with logged() as records:
        async with _env_then_done([]) as client:
            engine = QueryEngine(OpenAIChatModel("m", api_key=_HOOK_KEY, http_client=client),
                                 tools=[_env_tool("ok")], policies=policies)  # fmt: skip
            [ev async for ev in engine.run("look")]
    for hook in ("on_stream", "on_response", "on_results"):
        said = [t for t in records.texts if f".{hook} returned" in t]
        assert said and all(MARK in t for t in said), (hook, records.texts)
    assert not [t for t in records.texts if _HOOK_KEY[:12] in t or _HOOK_KEY[-12:] in t], records.texts


@pytest.mark.parametrize("kind", sorted(_WRONG_ANSWERS))
async def test_what_a_permission_callback_returned_instead_of_a_decision_is_logged_without_the_key(kind: str) -> None:
    make = _WRONG_ANSWERS[kind]
    bodies: list[bytes] = []
    with logged() as records:
        async with _env_then_done(bodies) as client:
            engine = QueryEngine(OpenAIChatModel("m", api_key=_HOOK_KEY, http_client=client),
                                 tools=[_env_tool("ok")], permission=lambda use, ctx: make())  # fmt: skip
            events = [ev async for ev in engine.run("look")]
    said = [t for t in records.texts if "The permission callback returned" in t]
    assert said and all(MARK in t for t in said), records.texts
    shown = [*records.texts, *(b.decode() for b in bodies), *map(event_json, events)]
    assert not [t for t in shown if _HOOK_KEY in t]


async def test_what_closing_a_model_stream_raised_is_logged_without_the_models_key(
    caplog: pytest.LogCaptureFixture,
) -> None:
    """A stream whose ``aclose()`` fails with the key in its message (a client that prints its
    request) was logged, at DEBUG, with the key in it."""
    key = "sk-close-secret-0123456789abcdef"

    class Stream:
        def __init__(self, inner: Any) -> None:
            self.inner = inner

        def __aiter__(self) -> Stream:
            return self

        async def __anext__(self) -> Any:
            return await anext(self.inner)

        async def aclose(self) -> None:
            await self.inner.aclose()
            raise RuntimeError(f"closing failed for Authorization: Bearer {key}")

    class Model:
        name = "closing"
        scripted = ScriptedModel(["fine"])

        def _credentials(self) -> tuple[str, ...]:
            return (key,)

        def stream(self, request: ModelRequest, signal: Any) -> Stream:
            return Stream(aiter(self.scripted.stream(request, signal)))

    engine = QueryEngine(Model(), policies=[])  # type: ignore[arg-type]
    with caplog.at_level(logging.DEBUG, logger="agentloop"):
        events = [e async for e in engine.run("go")]
    assert isinstance(events[-1], TurnEnded) and events[-1].reason == "completed"
    logged = [r.getMessage() for r in caplog.records if "closing the model stream raised" in r.getMessage()]
    assert len(logged) == 1 and "[REDACTED]" in logged[0]
    assert key not in caplog.text


@pytest.mark.parametrize("at", [0, 1990, 1995, 2000, 3990, 6000])
def test_a_long_wrong_answer_is_scrubbed_before_it_is_cut_wherever_the_key_sits(at: int) -> None:
    """What a host's callback returned by mistake is shown cut to its start and end: a key that
    straddled the cut was shown but for a few characters, the cut made before the scrub."""
    from agentloop._hostlog import host_repr

    key = "sk-cut-0123456789abcdefghij"

    class Model(ScriptedModel):
        def _credentials(self) -> tuple[str, ...]:
            return (key,)

    class Answer:
        def __repr__(self) -> str:
            return "x" * at + key + "y" * 5_000

    engine = QueryEngine(Model([]), policies=[])
    for value in (Answer(), "x" * at + key + "y" * 5_000):
        shown = host_repr(engine, value)
        assert len(shown) <= 4_003
        assert not any(key[i : i + 8] in shown for i in range(len(key) - 7)), shown
        assert "[REDACTED]" in shown or at != 0  # elsewhere the cut may take it whole
        assert "sk-cut" not in host_repr(engine, value, short=True)
