"""Credentials in the places scrubbing once left alone: the usual command-line forms of a password
(curl's ``-u``, a header after ``-H``, mysql's ``-p``, a shell script's ``KEY=value cmd``), an MCP
server's stdio label, the objects a provider error carries chained, an error message quoting a
huge payload, and the log line of an abort listener of an engine's run that raises."""

from __future__ import annotations

import asyncio
import contextlib
import json
import re
import traceback
from collections.abc import Callable

import httpx
import pytest

from agentloop import AbortController, Message
from agentloop._errors import ModelError
from agentloop._process import shown_args
from agentloop.mcp import MCPServer
from agentloop.mcp._scrub import command_line_credentials
from agentloop.models import ModelRequest
from tests.test_secrets_audit import MODELS, exception_texts, logged

MARK = "[REDACTED]"


@pytest.mark.parametrize(
    ("args", "shown"),
    [
        (["curl", "-u", "bob:s3cretPass", "https://x.example"], ["curl", "-u", f"bob:{MARK}", "https://x.example"]),
        (["curl", "--user", "bob:s3cretPass"], ["curl", "--user", f"bob:{MARK}"]),
        (["wget", "--user=bob:s3cretPass"], ["wget", f"--user=bob:{MARK}"]),
        (["/usr/bin/curl", "-ubob:s3cretPass"], ["/usr/bin/curl", f"-ubob:{MARK}"]),
        (["curl", "-U", "proxy:s3cretPass"], ["curl", "-U", f"proxy:{MARK}"]),
        (["curl", "--proxy-user", "proxy:s3cretPass"], ["curl", "--proxy-user", f"proxy:{MARK}"]),
        (["curl", "-H", "Authorization:Bearer tok12345"], ["curl", "-H", f"Authorization:{MARK}"]),
        (["curl", "--header", "X-Api-Key:tok12345"], ["curl", "--header", f"X-Api-Key:{MARK}"]),
        (["curl", "--header=Cookie:sid=tok12345"], ["curl", f"--header=Cookie:{MARK}"]),
        (["curl", "-H", "Authorization: Bearer tok12345"], ["curl", "-H", f"Authorization: {MARK}"]),
        (["wget", "--password", "s3cretPass"], ["wget", "--password", MARK]),
        (["wget", "--http-password=s3cretPass"], ["wget", f"--http-password={MARK}"]),
        (["mysql", "-uroot", "-ps3cretPass", "db"], ["mysql", "-uroot", f"-p{MARK}", "db"]),
        (["sudo", "/usr/bin/mysqldump", "-ps3cretPass"], ["sudo", "/usr/bin/mysqldump", f"-p{MARK}"]),
        (["env", "PGPASSWORD=s3cretPass", "psql"], ["env", f"PGPASSWORD={MARK}", "psql"]),
        (["sh", "-c", "PGPASSWORD=s3cret Pass psql"], ["sh", "-c", f"PGPASSWORD={MARK}"]),
        (
            ["sh", "-c", "cd /srv && PGPASSWORD=s3cretPass psql -h db && curl -u bob:pw123456 https://x.example"],
            ["sh", "-c", f"cd /srv && PGPASSWORD={MARK} psql -h db && curl -u bob:{MARK} https://x.example"],
        ),
        (
            ["bash", "-c", "curl -H 'Authorization: Bearer tok12345' https://x.example"],
            ["bash", "-c", f"curl -H 'Authorization: {MARK}' https://x.example"],
        ),
        (["bash", "-c", 'mysql -p"s3cret Pass" db'], ["bash", "-c", f'mysql -p"{MARK}" db']),
    ],
)
def test_the_usual_command_line_passwords_are_redacted(args: list[str], shown: list[str]) -> None:
    assert shown_args(tuple(args)) == shown
    found = set(command_line_credentials(args))
    assert any(secret in value for value in found for secret in ("s3cretPass", "tok12345", "s3cret Pass"))


@pytest.mark.parametrize(
    "args",
    [
        ["git", "push", "-u", "origin", "main"],
        ["python", "-u", "server.py"],
        ["docker", "run", "-p8080:80", "-u", "1000:1000", "image"],
        ["mkdir", "-p", "out"],
        ["grep", "-H", "keycloak:8080", "hosts"],
        ["echo", "a plain sentence, nothing hidden"],
        ["ssh", "-p", "2222", "host.example"],
    ],
)
def test_what_only_looks_like_a_password_is_shown_as_it_is(args: list[str]) -> None:
    assert shown_args(tuple(args)) == args


_COMMAND_TOKEN = "ghp_commandLineToken0123456789"


async def test_a_stdio_servers_label_and_start_up_error_hide_the_credentials_of_its_command() -> None:
    # A host that put the variable in front of the command, as a shell would take it.
    srv = MCPServer.stdio(f"GITHUB_TOKEN={_COMMAND_TOKEN} npx", ["-y", "server"], connect_timeout=20)
    assert srv.label == f"stdio:GITHUB_TOKEN={MARK}"
    assert _COMMAND_TOKEN not in repr(srv)
    with logged() as records, pytest.raises(FileNotFoundError) as caught:
        async with asyncio.timeout(30), srv:
            pass
    texts = [*exception_texts(caught.value), *records.texts]
    assert not [t for t in texts if _COMMAND_TOKEN in t]
    assert any(f"GITHUB_TOKEN={MARK}" in t for t in texts)  # what failed is still said


#: A payload far longer than any error message should quote, with the key in its middle.
_KEY = "sk-capped-0123456789abcdefghij"
_HUGE = "start-of-payload " + "x" * 400_000 + f" {_KEY} " + "y" * 400_000 + " end-of-payload"


def _huge_error(kind: str) -> Callable[[httpx.Request], httpx.Response]:
    def handler(request: httpx.Request) -> httpx.Response:
        sse = {"content-type": "text/event-stream"}
        if kind == "error event":
            event = {"type": "error", "error": {"type": "overloaded_error", "message": _HUGE}}
            return httpx.Response(200, headers=sse, content=f"event: error\ndata: {json.dumps(event)}\n\n".encode())
        if kind == "error chunk":
            chunk = {"type": "error", "error": {"message": _HUGE}}
            return httpx.Response(200, headers=sse, content=f"data: {json.dumps(chunk)}\n\n".encode())
        if kind == "plain error event":
            return httpx.Response(200, headers=sse, content=f"event: error\ndata: {_HUGE}\n\n".encode())
        if kind == "status":
            return httpx.Response(400, json={"error": {"message": _HUGE, "type": "invalid_request_error"}})
        raise httpx.ConnectError(f"proxy said: {_HUGE}", request=request)

    return handler


@pytest.mark.parametrize("kind", ["error event", "error chunk", "plain error event", "status", "transport"])
@pytest.mark.parametrize("provider", sorted(MODELS))
async def test_an_error_quoting_a_huge_payload_quotes_its_head_and_tail_and_says_how_much_was_cut(
    provider: str, kind: str
) -> None:
    async with httpx.AsyncClient(transport=httpx.MockTransport(_huge_error(kind))) as client:
        model = MODELS[provider]("m", api_key=_KEY, http_client=client)
        with pytest.raises(ModelError) as caught:
            async with contextlib.aclosing(model.stream(ModelRequest(messages=[Message.user("hi")]), AbortController().signal)) as s:
                async for _ in s:
                    pass
    error = caught.value
    assert len(error.message) < 5_000, len(error.message)
    assert error.args == (error.message,)
    assert "start-of-payload" in error.message and "end-of-payload" in error.message
    assert re.search(r"\[\.\.\. [\d,]+ characters cut \.\.\.\]", error.message), error.message[:3000]
    assert _KEY not in "".join(traceback.format_exception(error))


_CHAIN_SECRETS = ("sk-chained-key-0123456789", "gateway-token-0123456789", "url-password-0123456789", "query-key-0123456789")
_CHAIN_URL = f"https://bob:{_CHAIN_SECRETS[2]}@proxy.example/v1?api-version=1&key={_CHAIN_SECRETS[3]}"


def _chained_objects(exc: BaseException) -> list[BaseException]:
    todo, seen, out = [exc], set(), []
    while todo:
        current = todo.pop()
        if id(current) not in seen:
            seen.add(id(current))
            out.append(current)
            todo += [e for e in (current.__cause__, current.__context__) if e is not None]
    return out


def _carried(exc: BaseException) -> list[str]:
    """The text of what the exceptions chained to ``exc`` carry: an httpx error's request (and a
    status error's response), a JSON decoding error's document."""
    texts: list[str] = []
    for current in _chained_objects(exc):
        requests = [getattr(current, "_request", None)]
        response = getattr(current, "response", None) if isinstance(current, httpx.HTTPStatusError) else None
        if response is not None:
            requests.append(response.request)
        for request in (r for r in requests if r is not None):
            texts += [str(request.url), repr(request.headers), repr(dict(request.headers)), repr(request.content)]
        if isinstance(current, json.JSONDecodeError):
            texts.append(current.doc)
    return texts


def _status_raised(request: httpx.Request) -> httpx.Response:
    return httpx.Response(401, request=request).raise_for_status()  # type: ignore[func-returns-value]


_CHAIN_FAILURES: dict[str, Callable[[httpx.Request], httpx.Response]] = {
    "connect error": lambda r: (_ for _ in ()).throw(httpx.ConnectError("refused", request=r)),
    "read error": lambda r: (_ for _ in ()).throw(httpx.ReadError("reset", request=r)),
    "status raised by the client": _status_raised,
    "malformed stream": lambda r: httpx.Response(
        200, headers={"content-type": "text/event-stream"},
        content=f"event: message_start\ndata: {{not json {r.headers.get('x-gateway-token')}\n\n".encode(),
    ),
}


@pytest.mark.parametrize("failure", sorted(_CHAIN_FAILURES))
@pytest.mark.parametrize("provider", sorted(MODELS))
async def test_the_objects_a_chained_error_carries_hold_no_credential(provider: str, failure: str) -> None:
    async with httpx.AsyncClient(transport=httpx.MockTransport(_CHAIN_FAILURES[failure])) as client:
        model = MODELS[provider]("m", api_key=_CHAIN_SECRETS[0], base_url=_CHAIN_URL, http_client=client,
                                 extra_headers={"x-gateway-token": _CHAIN_SECRETS[1]})  # fmt: skip
        with pytest.raises(ModelError) as caught:
            async with contextlib.aclosing(model.stream(ModelRequest(messages=[Message.user("hi")]), AbortController().signal)) as s:
                async for _ in s:
                    pass
    carried = _carried(caught.value)
    assert carried, "nothing chained carries a request or a document"
    shown = [t for t in carried if any(secret in t for secret in _CHAIN_SECRETS)]
    assert not shown, shown
    requests = [e._request for e in _chained_objects(caught.value) if getattr(e, "_request", None) is not None]
    for request in requests:  # what a user needs to debug is kept
        assert request.method == "POST" and request.url.host == "proxy.example"
        assert request.url.path.startswith("/v1/")
