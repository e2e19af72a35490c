"""An MCP server's credentials and the size of what it says: the objects its HTTP client's errors
carry (the request, headers and URL), a server's error text of megabytes, the command-line forms
of a password, and the abort listeners of signals no engine made."""

from __future__ import annotations

import asyncio
import functools
import json
import logging
import re
import sys
import traceback
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any
from unittest import mock

import httpx2
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from mcp.shared.exceptions import MCPError

from agentloop import (
    AbortController,
    AbortSignal,
    Allow,
    Message,
    Policy,
    QueryEngine,
    ScriptedModel,
    ScriptedResponse,
    ScriptedToolCall,
    Tool,
    ToolCallStarted,
    ToolContext,
    TurnEnded,
    tool,
)
from agentloop._cmdline import shown_args
from agentloop._errors import AbortError
from agentloop.mcp import MCPServer
from agentloop.mcp._scrub import command_line_credentials
from agentloop.models import OpenAIChatModel
from agentloop.sessions import JsonlSession
from tests.test_secrets_audit import (
    _HOOK_KEY,
    _env_then_done,
    _mcp_answer,
    _on,
    _raise_quoting,
    _rpc,
    exception_texts,
    logged,
)

MARK = "[REDACTED]"
_TOKEN = "mcpHeaderToken0123456789abcdef"
_PASSWORD = "mcpUrlPassword0123456789abcdef"
_QUERY = "mcpQueryToken0123456789abcdef"
_URL = f"https://bob:{_PASSWORD}@mcp.example/mcp?access_token={_QUERY}"
_SECRETS = (_TOKEN, _PASSWORD, _QUERY)
_LOGGERS = ("mcp", "mcp.client.streamable_http", "mcp.client.session", "mcp.shared.jsonrpc_dispatcher", "httpx2")


def _shown(texts: list[str]) -> list[str]:
    return [t[:300] for t in texts if any(s in t for s in _SECRETS)]


def _server(handler: Callable[[httpx2.Request], httpx2.Response], url: str = _URL) -> tuple[MCPServer, Any]:
    client = functools.partial(httpx2.AsyncClient, transport=httpx2.MockTransport(handler))
    patch = mock.patch.object(httpx2, "AsyncClient", client)
    return MCPServer.http(url, headers={"Authorization": f"Bearer {_TOKEN}"}, connect_timeout=10), patch


def _requests_of(exc: BaseException) -> Iterator[httpx2.Request]:
    """The httpx2 requests ``exc`` and the exceptions chained to it carry."""
    todo, seen = [exc], set()
    while todo:
        current = todo.pop()
        if id(current) in seen:
            continue
        seen.add(id(current))
        request = getattr(current, "_request", None)
        if isinstance(request, httpx2.Request):
            yield request
        if isinstance(current, httpx2.HTTPStatusError):
            yield current.response.request
        if isinstance(current, BaseExceptionGroup):
            todo += current.exceptions
        todo += [e for e in (current.__cause__, current.__context__) if e is not None]


def _refused(request: httpx2.Request) -> httpx2.Response:
    raise httpx2.ConnectError("the proxy refused the connection", request=request)


# -- 1. the HTTP client's errors keep a safe copy of their request -----------------------------------


async def test_an_http_client_error_at_start_up_keeps_no_credential_in_its_request() -> None:
    srv, patch = _server(_on("initialize", _refused))
    with patch, logged(*_LOGGERS) as records, pytest.raises(httpx2.ConnectError) as caught:
        async with asyncio.timeout(20), srv:
            pass
    requests = list(_requests_of(caught.value))
    assert requests, "the error keeps what it tried"
    for request in requests:
        assert request.headers["authorization"] == MARK
        assert "bob" not in str(request.url) and _QUERY not in str(request.url)
        assert "access_token=" + MARK in str(request.url)
        assert not _shown([repr(request.headers.multi_items()), str(request.url)])
    assert not _shown([*exception_texts(caught.value), *records.texts])


async def test_an_http_client_error_of_a_call_keeps_no_credential_in_its_request() -> None:
    srv, patch = _server(_on("tools/call", _refused))
    with patch:
        async with asyncio.timeout(20), srv:
            (echo,) = await srv.list_tools()
            ctx = ToolContext(signal=AbortController().signal, tool_use_id="t1", engine=None)  # type: ignore[arg-type]
            with pytest.raises(Exception) as caught:  # the engine makes it the call's error result
                await echo.handler({}, ctx)
    for request in _requests_of(caught.value):
        assert request.headers["authorization"] == MARK
    assert not _shown(list(exception_texts(caught.value)))


async def test_a_logged_http_client_error_keeps_no_credential_in_its_request() -> None:
    # The SDK logs, with its traceback, the status error of the GET stream a server need not offer
    # (405): a handler reading the record's ``exc_info`` gets the error and its request.
    seen: list[logging.LogRecord] = []

    class Keep(logging.Handler):
        def emit(self, record: logging.LogRecord) -> None:
            seen.append(record)

    logger = logging.getLogger("mcp.client.streamable_http")
    handler, level = Keep(logging.DEBUG), logger.level
    logger.addHandler(handler)
    logger.setLevel(logging.DEBUG)
    try:
        # A URL without credentials: the traceback's text then quotes none, and the record keeps it.
        srv, patch = _server(_mcp_answer, "https://mcp.example/mcp")
        with patch:
            async with asyncio.timeout(20), srv:
                await srv.list_tools()
                await srv.call_tool("echo", {})
    finally:
        logger.removeHandler(handler)
        logger.setLevel(level)
    errors = [r.exc_info[1] for r in seen if r.exc_info and r.exc_info[1] is not None]
    requests = [request for error in errors for request in _requests_of(error)]
    assert requests, "the SDK logs the GET stream's status error"
    for request in requests:
        assert request.headers["authorization"] == MARK
        assert not _shown([repr(request.headers.multi_items()), str(request.url)])


# -- 2. what a server says is quoted at most 2,000 characters, its credentials scrubbed first --------

_CUT = re.compile(r"\[\.\.\. [\d,]+ characters cut \.\.\.\]")


def _huge(secret: str, size: int) -> str:
    """A server's text of ``size`` characters or so, quoting ``secret`` in its middle and at its end."""
    half = "x" * (size // 2)
    return f"start-of-text {half} {secret} {half} end-of-text {secret}"


def _check_capped(message: str, secret: str) -> None:
    assert len(message) < 2_200, len(message)
    assert "start-of-text" in message and "end-of-text" in message
    assert _CUT.search(message), message[:300]
    assert secret not in message and MARK in message


def _rpc_refusal(text: str) -> Callable[[httpx2.Request], httpx2.Response]:
    def handler(request: httpx2.Request) -> httpx2.Response:
        return _rpc(json.loads(request.content), error={"code": -32001, "message": text, "data": text})

    return handler


@settings(max_examples=15, deadline=None)
@given(size=st.integers(2_500, 300_000), where=st.sampled_from(["initialize", "tools/list", "tools/call"]))
def test_a_servers_error_text_is_cut_to_its_head_and_tail_after_scrubbing(size: int, where: str) -> None:
    text = _huge(_TOKEN, size)

    async def drive() -> BaseException:
        srv, patch = _server(_on(where, _rpc_refusal(text)))
        with patch, pytest.raises(Exception) as caught:
            async with asyncio.timeout(20), srv:
                (echo,) = await srv.list_tools()
                await echo.handler({}, ToolContext(signal=AbortController().signal, tool_use_id="t", engine=None))  # type: ignore[arg-type]
        return caught.value

    error = asyncio.run(drive())
    assert isinstance(error, MCPError), repr(error)[:300]
    _check_capped(str(error), _TOKEN)
    assert all(len(a) < 2_200 for a in error.args if isinstance(a, str))
    assert len("".join(traceback.format_exception(error))) < 20_000


async def test_a_huge_connection_error_is_cut_after_scrubbing() -> None:
    text = _huge(_TOKEN, 500_000)

    def refuse(request: httpx2.Request) -> httpx2.Response:
        raise httpx2.ConnectError(text, request=request)

    srv, patch = _server(_on("initialize", refuse))
    with patch, pytest.raises(httpx2.ConnectError) as caught:
        async with asyncio.timeout(20), srv:
            pass
    _check_capped(str(caught.value), _TOKEN)


_LOUD_SERVER = r"""
import os, sys
token = os.environ["SERVICE_TOKEN"]
for i in range(8):
    sys.stderr.write(f"line {i} {'x' * 1800} {token} end-of-line-{i}\n")
sys.stderr.flush()
sys.exit(3)
"""


async def test_a_stdio_servers_stderr_tail_is_cut_in_its_error() -> None:
    srv = MCPServer.stdio(sys.executable, ["-c", _LOUD_SERVER], env={"SERVICE_TOKEN": _TOKEN}, connect_timeout=20)
    with pytest.raises(MCPError) as caught:
        async with asyncio.timeout(30), srv:
            pass
    message = str(caught.value)
    assert "exited with status 3" in message
    assert len(message) < 2_200, len(message)
    assert _CUT.search(message), message
    assert _TOKEN not in message and "end-of-line-7" in message  # the end of the last line is kept


# -- 3. an abort listener that raises within an engine's run, on a signal no engine made -----------


async def test_a_listener_raising_within_a_run_is_logged_without_the_engines_credentials() -> None:
    """A signal knows no credentials of its own: a listener that raises inside an engine's run (a
    tool's timeout firing, a host's signal the tool aborts) is logged without that engine's; one
    that raises outside any run is logged as it is."""
    hosts = AbortController()  # made outside the run, aborted within it
    later = AbortController()  # made outside the run, aborted after it

    @tool
    async def env(ctx: ToolContext) -> str:  # the tool the mock model calls
        """Stop."""
        deadline = AbortSignal.timeout(0)
        deadline.add_listener(functools.partial(_raise_quoting, "timeout listener"))
        hosts.signal.add_listener(functools.partial(_raise_quoting, "host listener"))
        later.signal.add_listener(functools.partial(_raise_quoting, "late listener"))
        await deadline.wait()
        hosts.abort()
        return "stopped"

    with logged() as records:
        async with _env_then_done([]) as client:
            engine = QueryEngine(OpenAIChatModel("m", api_key=_HOOK_KEY, http_client=client), tools=[env])
            [ev async for ev in engine.run("look")]
            later.abort()
    for where in ("timeout", "host"):
        quoted = [t for t in records.texts if f"{where} listener saw Authorization: Bearer {MARK}" in t]
        assert quoted and "Traceback (most recent call last)" in quoted[0], (where, records.texts)
        assert not [t for t in records.texts if f"{where} listener saw" in t and _HOOK_KEY in t], where
    assert [t for t in records.texts if f"late listener saw Authorization: Bearer {_HOOK_KEY}" in t]


# -- 4. the command-line forms of a password ----------------------------------------------------


@pytest.mark.parametrize(
    ("args", "shown"),
    [
        (["sshpass", "-p", "s3cretPass", "ssh", "-p", "2222", "host"], ["sshpass", "-p", MARK, "ssh", "-p", "2222", "host"]),
        (["/usr/bin/sshpass", "-ps3cretPass", "scp", "f", "h:"], ["/usr/bin/sshpass", f"-p{MARK}", "scp", "f", "h:"]),
        (["redis-cli", "-a", "s3cretPass", "ping"], ["redis-cli", "-a", MARK, "ping"]),
        (["redis-cli", "-as3cretPass", "-p", "6379"], ["redis-cli", f"-a{MARK}", "-p", "6379"]),
        (["mongosh", "-u", "bob", "-p", "s3cretPass"], ["mongosh", "-u", "bob", "-p", MARK]),
        (["psql", "postgres://bob:s3cretPass@db.example/app"], ["psql", f"postgres://{MARK}@db.example/app"]),
        (["redis-cli", "-u", "redis://:s3cretPass@cache:6379/0"], ["redis-cli", "-u", f"redis://{MARK}@cache:6379/0"]),
        (["tool", "--password=s3cretPass", "--token=s3cretPass"], ["tool", f"--password={MARK}", f"--token={MARK}"]),
        (["docker", "run", "-e", "API_KEY=s3cretPass", "image"], ["docker", "run", "-e", f"API_KEY={MARK}", "image"]),
        (["docker", "run", "--env=API_KEY=s3cretPass", "image"], ["docker", "run", f"--env=API_KEY={MARK}", "image"]),
        (["docker", "build", "--build-arg=NPM_TOKEN=s3cretPass", "."], ["docker", "build", f"--build-arg=NPM_TOKEN={MARK}", "."]),
        (["sh", "-c", "sshpass -p s3cretPass ssh host uptime"], ["sh", "-c", f"sshpass -p {MARK} ssh host uptime"]),
    ],
)
def test_more_command_line_passwords_are_redacted(args: list[str], shown: list[str]) -> None:
    assert shown_args(tuple(args)) == shown
    assert any("s3cretPass" in value for value in command_line_credentials(args))


@pytest.mark.parametrize(
    "args",
    [
        ["ssh", "-p", "2222", "host.example"],
        ["scp", "-P", "2222", "-p", "file", "host.example:"],
        ["redis-cli", "-h", "cache", "-p", "6379", "ping"],
        ["docker", "run", "-e", "DEBUG=1", "--env=LANG=C.UTF-8", "-p", "8080:80", "image"],
        ["rsync", "-a", "src/", "dst/"],
        ["tar", "-ap", "-f", "out.tar.gz", "dir"],
    ],
)
def test_what_only_looks_like_one_of_those_passwords_is_shown(args: list[str]) -> None:
    assert shown_args(tuple(args)) == args


class _AbortsTheHosts(Policy):
    """A policy that aborts the host's own signal as it judges the response (the host wired its
    stop button to a policy of its own)."""

    def __init__(self, controller: AbortController) -> None:
        self.controller = controller

    def on_response(self, message: Message) -> None:
        self.controller.abort("stop")


@pytest.mark.parametrize("where", ["policy", "permission", "on_abort"])
async def test_a_listener_raising_as_the_runs_own_task_aborts_a_hosts_signal_is_scrubbed(where: str) -> None:
    """A host's own signal, aborted by the run's own task (a policy hook, the permission
    callback, an abort hook), not in a tool call: its listener that raised was logged with the
    engine's key in it."""
    hosts = AbortController()
    hosts.signal.add_listener(functools.partial(_raise_quoting, "host listener"))

    @tool
    async def env(ctx: ToolContext) -> str:
        """Stop."""
        return "stopped"

    def allow(use: Any, ctx: Any) -> Allow:
        hosts.abort("stop")
        return Allow()

    with logged() as records:
        async with _env_then_done([]) as client:
            engine = QueryEngine(
                OpenAIChatModel("m", api_key=_HOOK_KEY, http_client=client),
                tools=[env],
                policies=[_AbortsTheHosts(hosts)] if where == "policy" else [],
                permission=allow if where == "permission" else None,
            )
            if where == "on_abort":
                engine.on_abort(lambda reason: hosts.abort(reason))
            async for event in engine.run("look"):
                if where == "on_abort" and isinstance(event, ToolCallStarted):
                    engine.interrupt()
    assert hosts.signal.aborted
    quoted = [t for t in records.texts if f"host listener saw Authorization: Bearer {MARK}" in t]
    assert quoted and "Traceback (most recent call last)" in quoted[0], records.texts
    assert not [t for t in records.texts if _HOOK_KEY in t], records.texts


async def test_an_abort_reason_that_quotes_the_models_key_is_scrubbed_wherever_it_goes() -> None:
    """A host's reason text (an error message it passed on as the reason) holding the model's key
    reached the terminal event, the session's events, the abort hooks and what they log."""
    hooked: list[str] = []

    @tool
    async def env(ctx: ToolContext) -> str:
        """Wait for the stop."""
        await ctx.signal.wait()
        ctx.signal.throw_if_aborted()
        return "never"

    with logged() as records:
        async with _env_then_done([]) as client:
            engine = QueryEngine(OpenAIChatModel("m", api_key=_HOOK_KEY, http_client=client), tools=[env])
            engine.on_abort(hooked.append)
            events = []
            async for event in engine.run("look"):
                events.append(event)
                if isinstance(event, ToolCallStarted):
                    engine.interrupt(f"the proxy said: bad key {_HOOK_KEY}")
    end = events[-1]
    assert isinstance(end, TurnEnded) and end.abort_reason == f"the proxy said: bad key {MARK}"
    assert hooked == [end.abort_reason]
    assert not [e for e in events if _HOOK_KEY in repr(e)]
    assert not [m for m in engine.messages if _HOOK_KEY in m.model_dump_json()]
    assert not [t for t in records.texts if _HOOK_KEY in t]
    assert engine.messages[-1].kind == "interrupt_notice"


# -- 5. the credentials of the MCP servers whose tools an engine holds are among those it knows -----


def _waiting_env() -> Any:
    @tool
    async def env(ctx: ToolContext) -> str:
        """Wait for the stop."""
        await ctx.signal.wait()
        ctx.signal.throw_if_aborted()
        return "never"

    return env


async def test_an_abort_reason_quoting_an_mcp_servers_credential_is_scrubbed(tmp_path: Path) -> None:
    """The host passed on an error of its MCP server's as the reason: the server's token reached
    the terminal event, the session file and the abort hooks."""
    hooked: list[str] = []
    srv, patch = _server(_mcp_answer)
    with patch, logged() as records:
        async with asyncio.timeout(20), srv, _env_then_done([]) as client:
            session = JsonlSession(tmp_path / "s.jsonl")
            engine = QueryEngine(OpenAIChatModel("m", api_key=_HOOK_KEY, http_client=client),
                                 tools=[_waiting_env(), *await srv.list_tools()], session=session)  # fmt: skip
            engine.on_abort(hooked.append)
            events = []
            async for event in engine.run("look"):
                events.append(event)
                if isinstance(event, ToolCallStarted):
                    engine.interrupt(f"the MCP server said: bad token {_TOKEN}")
            session.close()
    end = events[-1]
    assert isinstance(end, TurnEnded) and end.abort_reason == f"the MCP server said: bad token {MARK}"
    assert hooked == [end.abort_reason]
    assert not _shown([*map(repr, events), *(m.model_dump_json() for m in engine.messages)])
    assert not _shown([(tmp_path / "s.jsonl").read_text(), *records.texts])


async def test_a_listener_error_quoting_an_mcp_servers_credential_is_scrubbed() -> None:
    """A listener on the host's own signal, aborted in the run's task, raised quoting the token the
    host gave its MCP server."""
    hosts = AbortController()

    def quoting(reason: str) -> None:
        raise RuntimeError(f"listener saw Authorization: Bearer {_TOKEN}")

    hosts.signal.add_listener(quoting)

    def allow(use: Any, ctx: Any) -> Allow:
        hosts.abort("stop")
        return Allow()

    srv, patch = _server(_mcp_answer)
    with patch, logged() as records:
        async with asyncio.timeout(20), srv, _env_then_done([]) as client:
            engine = QueryEngine(OpenAIChatModel("m", api_key=_HOOK_KEY, http_client=client),
                                 tools=[_waiting_env(), *await srv.list_tools()], permission=allow)  # fmt: skip
            async for event in engine.run("look"):
                if isinstance(event, ToolCallStarted):
                    engine.interrupt()
    quoted = [t for t in records.texts if f"listener saw Authorization: {MARK}" in t]
    assert quoted and "Traceback (most recent call last)" in quoted[0], records.texts
    assert not _shown(records.texts)


async def test_a_local_tools_result_quoting_an_mcp_servers_credential_is_scrubbed() -> None:
    """A tool of the host's own printed the environment the MCP server's token came from."""
    parents: list[bytes] = []
    bodies: list[bytes]

    @tool
    async def env() -> str:
        """Print the environment."""
        return f"MCP_TOKEN={_TOKEN}"

    srv, patch = _server(_mcp_answer)
    with patch:
        async with asyncio.timeout(20), srv, _env_then_done(parents) as client:
            engine = QueryEngine(OpenAIChatModel("m", api_key=_HOOK_KEY, http_client=client),
                                 tools=[env, *await srv.list_tools()])  # fmt: skip
            events = [ev async for ev in engine.run("look")]
            async with _env_then_done(bodies := []) as other:
                # A subagent without the server's tools, on a model of its own: its parent's are known to it.
                model = OpenAIChatModel("m", api_key="sk-child-0123456789abcdefXYZ", http_client=other)
                child = engine.subagent(agent_id="worker", model=model, tools=[env])
                events += [ev async for ev in child.run("look")]
            seen = [*parents, *bodies]
    assert [b for b in parents if f"MCP_TOKEN={MARK}" in b.decode()]
    assert [b for b in bodies if f"MCP_TOKEN={MARK}" in b.decode()]
    assert not _shown([*(b.decode() for b in seen), *map(repr, events)])


async def test_the_servers_of_tools_set_during_a_run_are_known_to_it() -> None:
    """The MCP server's tools were given to the engine by a tool of its run: the same run knows
    the server's credentials from then on."""
    bodies: list[bytes] = []
    srv, patch = _server(_mcp_answer)

    @tool
    async def env(ctx: ToolContext) -> str:
        """Connect the server, then print the environment."""
        ctx.engine.tools = [env, *await srv.list_tools()]
        return f"MCP_TOKEN={_TOKEN}"

    with patch:
        async with asyncio.timeout(20), srv, _env_then_done(bodies) as client:
            engine = QueryEngine(OpenAIChatModel("m", api_key=_HOOK_KEY, http_client=client), tools=[env])
            events = [ev async for ev in engine.run("look")]
    assert f"MCP_TOKEN={MARK}" in bodies[1].decode()
    assert not _shown([*(b.decode() for b in bodies), *map(repr, events)])


# -- 6. an MCP server's log lines that quote an abort reason --------------------------------------


async def test_an_mcp_servers_log_lines_quote_an_abort_reason_scrubbed_and_cut() -> None:
    """The reason of the host's signal (an error text of megabytes, quoting the server's token)
    was logged whole by the server as it gave up a call and reset its connection."""
    reason = _huge(_TOKEN, 300_000)
    called = asyncio.Event()

    async def hang(request: httpx2.Request) -> httpx2.Response:
        called.set()
        await asyncio.Event().wait()
        raise AssertionError("unreachable")

    async def serve(request: httpx2.Request) -> httpx2.Response:
        if request.method == "POST" and json.loads(request.content).get("method") == "tools/call":
            return await hang(request)
        return _mcp_answer(request)

    srv, patch = _server(serve)  # type: ignore[arg-type]
    hosts = AbortController()
    with patch, logged() as records:
        async with asyncio.timeout(20), srv:
            call = asyncio.create_task(srv.call_tool("echo", {}, signal=hosts.signal))
            await called.wait()
            hosts.abort(reason)
            with pytest.raises(AbortError):
                await call
            await srv.on_main_abort(reason)
    lines = [t for t in records.texts if "start-of-text" in t]
    assert len(lines) == 2, [t[:200] for t in records.texts]
    for line in lines:
        _check_capped(line, _TOKEN)


async def test_runs_stepped_in_turn_in_one_task_each_keep_their_own_keys_out_of_listener_errors() -> None:
    """A host stepping two engines' runs alternately in one task: a policy hook of the first run
    aborting a host's signal after the second run began had its listener's error scrubbed of
    the second engine's key only, and logged the first's."""
    first_key, second_key = "sk-first-engine-0123456789abcdef", "sk-second-engine-0123456789abcdef"

    def quoting(signal: AbortSignal) -> None:
        raise RuntimeError(f"listener saw {first_key} and {second_key}")

    hosts = AbortController()
    hosts.signal.add_listener(quoting)

    class Keyed(ScriptedModel):
        def __init__(self, key: str, script: list[Any]) -> None:
            super().__init__(script)
            self.key = key

        def _credentials(self) -> tuple[str, ...]:
            return (self.key,)

    first = QueryEngine(Keyed(first_key, ["one"]), policies=[_AbortsTheHosts(hosts)])
    second = QueryEngine(Keyed(second_key, ["two"]), policies=[])
    with logged() as records:
        a, b = aiter(first.run("go")), aiter(second.run("go"))
        await anext(a)  # the first run has begun
        await anext(b)  # and so has the second, in the same task
        rest = [e async for e in a] + [e async for e in b]
    assert hosts.signal.aborted and sum(isinstance(e, TurnEnded) for e in rest) == 2
    quoted = [t for t in records.texts if "listener saw" in t]
    assert quoted and f"listener saw {MARK} and {MARK}" in quoted[0], records.texts
    assert not [t for t in records.texts if first_key in t or second_key in t], records.texts


async def test_runs_broken_out_of_leave_nothing_behind_in_the_hosts_task() -> None:
    """A run the host breaks out of ends in another task: what it set in the host's task for
    listener errors stayed, and each later run wrapped it, until reading the credentials hit
    the recursion limit (after ~1,000 runs) and a listener's error was logged with the key."""
    from agentloop._abort import _run_secrets

    key = "sk-broken-runs-0123456789abcdef"

    def quoting(signal: AbortSignal) -> None:
        raise RuntimeError(f"upstream refused Authorization: Bearer {key}")

    class Keyed(ScriptedModel):
        def _credentials(self) -> tuple[str, ...]:
            return (key,)

    engine = QueryEngine(Keyed(["hello"] * 1_200), policies=[])
    for _ in range(1_200):  # each run waits for the cleanup of the one broken out of before it
        async for _event in engine.run("go"):
            break
    live = _run_secrets.get()
    assert len(getattr(live, "runs", ())) <= 1  # at most the last one's cleanup, still to come
    hosts = AbortController()
    hosts.signal.add_listener(quoting)
    last = QueryEngine(Keyed(["last"]), policies=[_AbortsTheHosts(hosts)])
    with logged() as records:
        events = [e async for e in last.run("go")]
    assert isinstance(events[-1], TurnEnded) and hosts.signal.aborted
    quoted = [t for t in records.texts if "upstream refused" in t]
    assert quoted and MARK in quoted[0] and not [t for t in records.texts if key in t], records.texts


@pytest.mark.parametrize(
    "held",
    [{"user": "u"}, "sk-a-single-str-0123456789", lambda: "sk-a-str-not-a-tuple-012345", lambda: 1 / 0, lambda: (1, None)],
)
async def test_a_hosts_tool_or_model_with_an_attribute_named_credentials_runs_as_any_other(held: Any) -> None:
    """A host's class-based tool handler or model keeping its own `_credentials` (a dict, a
    method returning one str, one that raises) made every run raise, or scrubbed each letter
    of an abort reason."""

    class Handler:
        def __init__(self) -> None:
            self._credentials = held

        async def __call__(self, input: dict[str, Any], ctx: ToolContext) -> str:
            return "done"

    class Model(ScriptedModel):
        _credentials = held

    engine = QueryEngine(
        Model([ScriptedResponse(tool_calls=[ScriptedToolCall("work", {})]), "after", "stopped early"]),
        tools=[Tool("work", "Work.", {"type": "object"}, Handler())],
        policies=[],
    )
    events = [e async for e in engine.run("go")]
    assert isinstance(events[-1], TurnEnded) and events[-1].reason == "completed"
    assert engine.messages[-1].text == "after"
    events = []
    async for event in engine.run("again"):
        events.append(event)
        engine.interrupt("user pressed stop")
    assert isinstance(events[-1], TurnEnded) and events[-1].abort_reason == "user pressed stop"
