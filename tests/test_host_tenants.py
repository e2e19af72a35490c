"""A multi-tenant service host built from the docs alone.

One process serves many customers (tenants). Each brings its own provider key, tools, usage
limit, deadline and session directory; their engines run at once on one event loop and share one
`httpx.AsyncClient`. Each test checks one promise such a host relies on: that nothing of one
tenant (its key, its state, its records, its retries, its interrupt) reaches another.
"""

from __future__ import annotations

import asyncio
import gc
import json
import logging
import traceback
import tracemalloc
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpcore
import httpx
import pytest

from agentloop import (
    Event,
    QueryEngine,
    TurnEnded,
    event_json,
    tool,
    validate_transcript,
)
from agentloop.models import AnthropicModel
from agentloop.policies import default_policies
from agentloop.sessions import JsonlSession
from tests.host_wire import AnthropicServer, Call, Reply

KEY_A = "sk-ant-tenantA-" + "a" * 40
KEY_B = "sk-ant-tenantB-" + "b" * 40


@tool(concurrency_safe=True)
async def lookup(city: str) -> str:
    """Look up the weather of a city."""
    return f"{city}: sunny, 21 C"


class Gateway:
    """One mock endpoint for every tenant: routes each request by its key to that tenant's
    server, or answers it with a scripted status for that key."""

    def __init__(self) -> None:
        self.servers: dict[str, AnthropicServer] = {}
        self.statuses: dict[str, list[httpx.Response]] = {}
        self.seen: list[str] = []

    def tenant(self, key: str, replies: list[Reply]) -> AnthropicServer:
        server = self.servers[key] = AnthropicServer(key, replies)
        return server

    async def handle(self, request: httpx.Request) -> httpx.Response:
        key = request.headers.get("x-api-key", "")
        self.seen.append(key)
        if self.statuses.get(key):
            return self.statuses[key].pop(0)
        server = self.servers.get(key)
        if server is None:  # a revoked or unknown key: a 401 that echoes it, as some servers do
            body = {"type": "error", "error": {"type": "authentication_error", "message": f"invalid x-api-key {key}"}}
            return httpx.Response(401, json=body)
        return await server._handle(request)

    def client(self, **kwargs: Any) -> httpx.AsyncClient:
        return httpx.AsyncClient(transport=httpx.MockTransport(self.handle), **kwargs)


@dataclass
class Tenant:
    """What the host keeps per customer."""

    name: str
    key: str
    engine: QueryEngine
    events: list[Event] = field(default_factory=list)

    @property
    def end(self) -> TurnEnded:
        ends = [e for e in self.events if isinstance(e, TurnEnded) and e.agent_id is None]
        return ends[-1]

    async def run(self, prompt: str | None) -> TurnEnded:
        self.events = [event async for event in self.engine.run(prompt)]
        return self.end


def make_tenant(name: str, key: str, client: httpx.AsyncClient, **options: Any) -> Tenant:
    model = AnthropicModel("claude-sonnet-4-6", api_key=key, http_client=client)
    options.setdefault("retry_base_delay", 0)
    return Tenant(name, key, QueryEngine(model, tools=[lookup], **options))


def shown(tenant: Tenant, caplog: pytest.LogCaptureFixture | None = None) -> str:
    """Everything of a tenant a person or a log could see."""
    parts = [event_json(e) for e in tenant.events]
    parts += [repr(e) for e in tenant.events]
    parts += [repr(tenant.engine), repr(tenant.engine.model), json.dumps([m.text for m in tenant.engine.messages])]
    if caplog is not None:
        parts += [r.getMessage() + (r.exc_text or "") for r in caplog.records]
    return "\n".join(parts)


async def wait_for(event: asyncio.Event) -> None:
    await asyncio.wait_for(event.wait(), 10)


# ---------------------------------------------------------------------------------------------
# Secrets stay with their tenant.


async def test_two_tenants_failing_at_once_never_show_each_others_key(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.DEBUG)
    gateway = Gateway()

    def echo(key: str) -> list[httpx.Response]:  # a 500 whose body quotes the key, then again
        body = {"type": "error", "error": {"type": "api_error", "message": f"upstream failed for {key}"}}
        return [httpx.Response(500, json=body) for _ in range(4)]

    gateway.statuses = {KEY_A: echo(KEY_A), KEY_B: echo(KEY_B)}
    async with gateway.client() as client:
        with JsonlSession(tmp_path / "a" / "s.jsonl") as sa, JsonlSession(tmp_path / "b" / "s.jsonl") as sb:
            a, b = make_tenant("a", KEY_A, client, session=sa), make_tenant("b", KEY_B, client, session=sb)
            await asyncio.gather(a.run("hi from a"), b.run("hi from b"))
    for tenant in (a, b):
        assert tenant.end.reason == "model_error"
        assert validate_transcript(tenant.engine.messages) == []
    files = {"a": (tmp_path / "a" / "s.jsonl").read_text(), "b": (tmp_path / "b" / "s.jsonl").read_text()}
    for tenant, other in ((a, b), (b, a)):
        seen = shown(tenant) + files[tenant.name]
        assert other.key not in seen and tenant.key not in seen
        assert "[REDACTED]" in str(tenant.end.error)
    logs = "\n".join(r.getMessage() + (r.exc_text or "") for r in caplog.records)
    assert KEY_A not in logs and KEY_B not in logs
    assert "hi from b" not in files["a"] and "hi from a" not in files["b"]


async def test_a_tenants_mcp_server_scrubs_its_key_out_of_other_tenants_records_only_while_it_lives(
    caplog: pytest.LogCaptureFixture,
) -> None:
    # The filter is process-wide (docs/mcp.md: "out of every record of the agentloop logger while
    # the server lives"): a record of B that happens to quote A's credential loses it, which is
    # the safe side; text shorter than 4 characters, or unrelated, is never touched.
    caplog.set_level(logging.DEBUG)
    from agentloop.mcp import MCPServer

    mcp_a = MCPServer.http("https://mcp.tenant-a.example/mcp?key=tenantAmcpKey0123456789")
    log = logging.getLogger("agentloop")  # where B's engine logs
    log.warning("tenant b: user pasted tenantAmcpKey0123456789 in a prompt; key= is a word")
    log.warning("tenant b: tiny ten key abc passes")
    del mcp_a
    gc.collect()
    log.warning("tenant b: after a left, tenantAmcpKey0123456789 is b's own text")
    messages = [r.getMessage() for r in caplog.records if r.getMessage().startswith("tenant b")]
    assert messages == [
        "tenant b: user pasted [REDACTED] in a prompt; key= is a word",
        "tenant b: tiny ten key abc passes",
        "tenant b: after a left, tenantAmcpKey0123456789 is b's own text",
    ]


async def test_a_short_url_credential_of_one_tenant_does_not_garble_another_tenants_url(
    caplog: pytest.LogCaptureFixture,
) -> None:
    # Tenant A's gateway key is a prefix of tenant B's: B's URL must not show the rest of its key.
    caplog.set_level(logging.INFO, logger="httpx")
    gateway = Gateway()
    gateway.tenant("", [Reply(text="ok a"), Reply(text="ok b")])
    async with gateway.client() as client:
        def model(key: str) -> AnthropicModel:
            return AnthropicModel("m", api_key="", base_url=f"https://gw.example/v1?key={key}",
                                  http_client=client, extra_headers={"x-api-key": "gw"})  # fmt: skip
        a = Tenant("a", "abcd1234", QueryEngine(model("abcd1234"), retry_base_delay=0))
        b = Tenant("b", "abcd1234wxyz5678", QueryEngine(model("abcd1234wxyz5678"), retry_base_delay=0))
        assert (await a.run("hi")).reason == (await b.run("hi")).reason
    lines = [r.getMessage() for r in caplog.records if r.name == "httpx"]
    assert len(lines) >= 2
    for line in lines:
        assert "abcd" not in line and "wxyz" not in line and "5678" not in line, line


# ---------------------------------------------------------------------------------------------
# State stays with its tenant.


async def test_interrupting_one_tenant_leaves_the_other_streaming_on_the_shared_client() -> None:
    gateway = Gateway()
    server_a = gateway.tenant(KEY_A, [Reply(text="a long answer that stalls", stall_after=2)])
    server_b = gateway.tenant(KEY_B, [Reply(text="b's answer streams on", stall_after=2), Reply(text="again")])
    async with gateway.client() as client:
        a, b = make_tenant("a", KEY_A, client), make_tenant("b", KEY_B, client)
        task_a = asyncio.create_task(a.run("go"))
        task_b = asyncio.create_task(b.run("go"))
        await wait_for(server_a.stalled)
        await wait_for(server_b.stalled)
        a.engine.interrupt()
        assert (await task_a).reason == "aborted_streaming"
        assert not task_b.done() and b.engine.running
        assert server_a.open_responses == 0 and server_b.open_responses == 1
        b.engine.interrupt()  # B's stalled stream is B's to stop; it is still open until then
        assert (await task_b).reason == "aborted_streaming"
        assert (await b.run("continue")).reason == "completed"
    assert b.engine.messages[-1].text == "again"
    assert server_a.open_responses == server_b.open_responses == 0
    for tenant in (a, b):
        assert validate_transcript(tenant.engine.messages) == []


async def test_a_429_with_retry_after_for_one_tenant_does_not_delay_another() -> None:
    gateway = Gateway()
    gateway.statuses[KEY_A] = [httpx.Response(429, headers={"retry-after": "30"}, json={"type": "error"})]
    gateway.tenant(KEY_A, [Reply(text="never")])
    gateway.tenant(KEY_B, [Reply(text="b is not kept waiting")])
    async with gateway.client() as client:
        a, b = make_tenant("a", KEY_A, client), make_tenant("b", KEY_B, client)
        retrying = asyncio.Event()

        async def run_a() -> list[Event]:
            out = []
            async for event in a.engine.run("go"):
                out.append(event)
                if event.type == "retrying":
                    retrying.set()
            return out

        task_a = asyncio.create_task(run_a())
        await wait_for(retrying)
        assert (await asyncio.wait_for(b.run("go"), 5)).reason == "completed"
        assert not task_a.done()  # A still waits out its own 30 seconds
        a.engine.interrupt()
        a.events = await task_a
    assert a.end.reason == "aborted_streaming"
    assert b.engine.messages[-1].text == "b is not kept waiting"
    assert gateway.seen.count(KEY_A) == 1


async def test_usage_limits_and_deadlines_are_each_tenants_own(tmp_path: Path) -> None:
    gateway = Gateway()
    gateway.tenant(KEY_A, [Reply(calls=[Call("lookup", {"city": "Oslo"})]), Reply(text="never reached")])
    gateway.tenant(KEY_B, [Reply(calls=[Call("lookup", {"city": "Rome"})]), Reply(text="Rome is sunny")])
    key_c = "sk-ant-tenantC-" + "c" * 40
    server_c = gateway.tenant(key_c, [Reply(text="stalls for ever", stall_after=1)])
    async with gateway.client() as client:
        a = make_tenant("a", KEY_A, client, usage_limit=1)
        b = make_tenant("b", KEY_B, client, usage_limit=1_000_000, deadline=60)
        c = make_tenant("c", key_c, client, deadline=0.2)
        ends = await asyncio.gather(a.run("go"), b.run("go"), c.run("go"))
    assert [e.reason for e in ends] == ["usage_limit", "completed", "deadline"]
    assert b.engine.messages[-1].text == "Rome is sunny"
    assert server_c.open_responses == 0
    for tenant in (a, b, c):
        assert validate_transcript(tenant.engine.messages) == []


async def test_each_tenants_session_directory_holds_its_own_records_only(tmp_path: Path) -> None:
    gateway = Gateway()
    keys = {f"t{n}": f"sk-ant-tenant{n}-" + "k" * 40 for n in range(5)}
    for name, key in keys.items():
        gateway.tenant(key, [Reply(calls=[Call("lookup", {"city": name})]), Reply(text=f"done {name}")])
    async with gateway.client() as client:
        sessions = {name: JsonlSession(tmp_path / name / "chat.jsonl") for name in keys}
        tenants = [make_tenant(name, key, client, session=sessions[name]) for name, key in keys.items()]
        await asyncio.gather(*(t.run(f"prompt of {t.name}") for t in tenants))
        for session in sessions.values():
            session.close()
    for tenant in tenants:
        files = list((tmp_path / tenant.name).iterdir())
        assert [f.name for f in files] == ["chat.jsonl"]
        text = files[0].read_text()
        assert f"prompt of {tenant.name}" in text and f"done {tenant.name}" in text
        others = [n for n in keys if n != tenant.name]
        assert not any(f"prompt of {n}" in text or f"done {n}" in text or keys[n] in text for n in others)
        assert tenant.key not in text


async def test_one_policy_list_shared_by_two_tenants_is_warned_about_with_the_fix(
    caplog: pytest.LogCaptureFixture,
) -> None:
    gateway = Gateway()
    server_a = gateway.tenant(KEY_A, [Reply(text="a stalls for a long while", stall_after=1)])
    gateway.tenant(KEY_B, [Reply(text="b done")])
    shared = default_policies()  # made once at module level, as a careless host would
    async with gateway.client() as client:
        a = make_tenant("a", KEY_A, client, policies=shared)
        b = make_tenant("b", KEY_B, client, policies=shared)
        task_a = asyncio.create_task(a.run("go"))
        await wait_for(server_a.stalled)
        assert (await b.run("go")).reason == "completed"
        a.engine.interrupt()
        await task_a
    warnings = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING and "two engines" in r.getMessage()]
    assert len(warnings) == len([p for p in shared if p.one_engine]) >= 1
    assert all("default_policies()" in w and "fork()" in w for w in warnings)


# ---------------------------------------------------------------------------------------------
# Fairness and limits.


async def test_a_hundred_tenants_through_one_small_pool_all_settle() -> None:
    gateway = Gateway()
    keys = [f"sk-ant-tenant{n:03d}-" + "k" * 40 for n in range(100)]
    for n, key in enumerate(keys):
        gateway.tenant(key, [Reply(calls=[Call("lookup", {"city": f"c{n}"})]), Reply(text=f"answer {n}")])
    limits = httpx.Limits(max_connections=4)
    async with gateway.client(limits=limits) as client:
        tenants = [make_tenant(f"t{n}", key, client, deadline=60) for n, key in enumerate(keys)]
        ends = await asyncio.wait_for(asyncio.gather(*(t.run("weather?") for t in tenants)), 60)
    assert [e.reason for e in ends] == ["completed"] * 100
    for n, tenant in enumerate(tenants):
        assert tenant.engine.messages[-1].text == f"answer {n}"
        assert validate_transcript(tenant.engine.messages) == []
    assert all(server.open_responses == 0 for server in gateway.servers.values())
    assert sum(len(server.streams) for server in gateway.servers.values()) == 200


async def test_an_idle_tenants_engine_costs_what_the_docs_say() -> None:
    gateway = Gateway()
    async with gateway.client() as client:
        model = AnthropicModel("m", api_key=KEY_A, http_client=client)
        gc.collect()
        tracemalloc.start()
        try:
            base = tracemalloc.get_traced_memory()[0]
            idle = [QueryEngine(model, tools=[lookup]) for _ in range(200)]
            per_idle = (tracemalloc.get_traced_memory()[0] - base) / len(idle)
        finally:
            tracemalloc.stop()
    assert per_idle <= 20 * 1024  # the documented goal; README reports about 2.2 KB


# ---------------------------------------------------------------------------------------------
# A key revoked mid-conversation.


async def test_a_key_revoked_mid_conversation_then_a_new_key_on_the_same_engine(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.DEBUG)
    gateway = Gateway()
    gateway.tenant(KEY_A, [Reply(calls=[Call("lookup", {"city": "Oslo"})]), Reply(text="Oslo is sunny")])
    new_key = "sk-ant-tenantA-rotated-" + "z" * 40
    async with gateway.client() as client:
        with JsonlSession(tmp_path / "a.jsonl") as session:
            a = make_tenant("a", KEY_A, client, session=session)
            assert (await a.run("first")).reason == "completed"
            before = len(a.engine.messages)
            del gateway.servers[KEY_A]  # the customer revokes the key
            end = await a.run("second")
            assert end.reason == "model_error"
            assert gateway.seen.count(KEY_A) == 3  # two of the first run, one 401: no retries
            assert not any(e.type == "retrying" for e in a.events)
            assert "401" in str(end.error) and KEY_A not in str(end.error)
            assert validate_transcript(a.engine.messages) == []
            assert len(a.engine.messages) == before + 1  # the prompt stays; nothing dangles
            # The documented way to change a key: a new model on the same engine, between runs.
            gateway.tenant(new_key, [Reply(text="back with the new key")])
            a.engine.model = AnthropicModel("claude-sonnet-4-6", api_key=new_key, http_client=client)
            assert (await a.run("third")).reason == "completed"
        assert a.engine.messages[-1].text == "back with the new key"
        texts = [m.text for m in a.engine.messages if m.role == "user" and not m.synthetic]
        assert texts == ["first", "second", "third"]
        sent = gateway.servers[new_key].bodies[-1]["messages"]
        assert [m["role"] for m in sent][:2] == ["user", "assistant"]
    file = (tmp_path / "a.jsonl").read_text()
    logs = "\n".join(r.getMessage() + (r.exc_text or "") for r in caplog.records)
    for text in (file, logs, shown(a)):
        assert KEY_A not in text and new_key not in text


# ---------------------------------------------------------------------------------------------
# The same over httpcore's real connection pool, on a fake network: one socket per connection.


def response_head(length: int) -> bytes:
    return f"HTTP/1.1 200 OK\r\ncontent-type: text/event-stream\r\ncontent-length: {length}\r\n\r\n".encode()


class Socket(httpcore.AsyncNetworkStream):
    """A keep-alive HTTP/1.1 connection: answers each request with a whole SSE response, or, for
    a request carrying `hang_key`, with its head and first events, then a read that never ends."""

    def __init__(self, net: Network) -> None:
        self.net, self.closed = net, False
        self.queue: list[bytes] = []
        self.hanging = False

    async def write(self, buffer: bytes, timeout: float | None = None) -> None:  # noqa: ASYNC109
        if not buffer.startswith(b"POST "):
            return  # the body: the head decided the answer
        hang = self.net.hang_key is not None and self.net.hang_key.encode() in buffer
        events = "".join(AnthropicServer("k", []).render(Reply(text="answer over the pool"))[0]).encode()
        if hang:
            self.hanging = True
            self.queue.append(response_head(100_000) + events[: len(events) // 2])
            return
        self.queue.append(response_head(len(events)) + events)

    async def read(self, max_bytes: int, timeout: float | None = None) -> bytes:  # noqa: ASYNC109
        if self.queue:
            return self.queue.pop(0)
        assert self.hanging, "read with nothing asked"
        self.net.hung.set()
        await asyncio.Event().wait()
        raise AssertionError("unreachable")  # pragma: no cover

    async def aclose(self) -> None:
        self.closed = True

    async def start_tls(self, ssl_context: Any, server_hostname: str | None = None,
                        timeout: float | None = None) -> httpcore.AsyncNetworkStream:  # noqa: ASYNC109
        return self

    def get_extra_info(self, info: str) -> Any:
        return None


class Network(httpcore.AsyncNetworkBackend):
    def __init__(self, hang_key: str | None = None) -> None:
        self.hang_key = hang_key
        self.sockets: list[Socket] = []
        self.hung = asyncio.Event()

    async def connect_tcp(self, host: str, port: int, timeout: float | None = None,  # noqa: ASYNC109
                          local_address: str | None = None, socket_options: Any = None) -> httpcore.AsyncNetworkStream:  # fmt: skip
        self.sockets.append(Socket(self))
        return self.sockets[-1]

    async def sleep(self, seconds: float) -> None:  # pragma: no cover - unused by the pool
        await asyncio.sleep(seconds)


def pooled_client(net: Network, max_connections: int) -> tuple[httpx.AsyncClient, httpcore.AsyncConnectionPool]:
    transport = httpx.AsyncHTTPTransport()
    pool = transport._pool = httpcore.AsyncConnectionPool(max_connections=max_connections, network_backend=net)
    return httpx.AsyncClient(transport=transport, timeout=httpx.Timeout(30.0, pool=20.0)), pool


async def test_a_hundred_tenants_through_a_real_pool_of_four_connections() -> None:
    net = Network()
    client, pool = pooled_client(net, 4)
    async with client:
        keys = [f"sk-ant-tenant{n:03d}-" + "k" * 40 for n in range(100)]
        tenants = [make_tenant(f"t{n}", key, client) for n, key in enumerate(keys)]
        ends = await asyncio.wait_for(asyncio.gather(*(t.run("hello") for t in tenants)), 60)
        assert [e.reason for e in ends] == ["completed"] * 100
        assert all(t.engine.messages[-1].text == "answer over the pool" for t in tenants)
        assert len(net.sockets) <= 4  # connections were reused, not one per tenant
        assert all(c.is_idle() for c in pool.connections)  # none left checked out


async def test_one_tenants_interrupt_closes_only_its_own_pooled_connection() -> None:
    net = Network(hang_key=KEY_A)
    client, pool = pooled_client(net, 2)
    async with client:
        a, b = make_tenant("a", KEY_A, client), make_tenant("b", KEY_B, client)
        assert (await b.run("warm the pool")).reason == "completed"  # B's connection is pooled now
        task_a = asyncio.create_task(a.run("go"))
        await wait_for(net.hung)
        a.engine.interrupt()
        assert (await task_a).reason == "aborted_streaming"
        hung = [s for s in net.sockets if s.hanging]
        assert len(hung) == 1 and hung[0].closed  # A's response was closed with its connection
        ends = [await b.run(f"again {n}") for n in range(3)]
        assert [e.reason for e in ends] == ["completed"] * 3
        assert not any(s.closed for s in net.sockets if not s.hanging)  # B's stayed open, reused
        assert len(net.sockets) == 2 and all(c.is_idle() for c in pool.connections)
    assert validate_transcript(a.engine.messages) == [] and validate_transcript(b.engine.messages) == []


async def test_two_tenants_whose_gateway_urls_carry_their_keys_fail_to_connect_at_once(
    caplog: pytest.LogCaptureFixture,
) -> None:
    caplog.set_level(logging.DEBUG)
    keys = {"a": "gwKeyOfTenantA0123456789abcdef", "b": "gwKeyOfTenantB0123456789abcdef"}

    def refuse(request: httpx.Request) -> httpx.Response:  # the error quotes the request, as some do
        raise httpx.ConnectError(f"cannot reach {request.url} ({request.headers.get('x-api-key')})", request=request)

    async with httpx.AsyncClient(transport=httpx.MockTransport(refuse)) as client:
        tenants = [
            Tenant(name, key, QueryEngine(AnthropicModel(
                "m", api_key=f"sk-{name}-" + "x" * 30, base_url=f"https://gw.example/{name}?key={key}", http_client=client,
            ), retry_base_delay=0))
            for name, key in keys.items()
        ]  # fmt: skip
        ends = await asyncio.gather(*(t.run("hi") for t in tenants))
    assert [e.reason for e in ends] == ["model_error", "model_error"]
    logs = "\n".join(r.getMessage() + (r.exc_text or "") for r in caplog.records)
    for tenant, end in zip(tenants, ends, strict=True):
        trace = "".join(traceback.format_exception(end.error)) if isinstance(end.error, BaseException) else str(end.error)
        seen = shown(tenant) + trace + logs
        for secret in (*keys.values(), "x" * 30):
            assert secret not in seen
        assert "cannot reach" in trace


async def test_a_key_revoked_between_a_tool_call_and_the_next_request_of_one_run() -> None:
    gateway = Gateway()
    gateway.tenant(KEY_A, [Reply(text="Looking. ", calls=[Call("lookup", {"city": "Oslo"})])])

    @tool(name="lookup")
    async def revoking_lookup(city: str) -> str:
        """Look up a city; the customer revokes the key meanwhile."""
        del gateway.servers[KEY_A]
        return f"{city}: rain"

    async with gateway.client() as client:
        model = AnthropicModel("claude-sonnet-4-6", api_key=KEY_A, http_client=client)
        a = Tenant("a", KEY_A, QueryEngine(model, tools=[revoking_lookup], retry_base_delay=0))
        end = await a.run("weather?")
    assert end.reason == "model_error" and "401" in str(end.error)
    assert gateway.seen.count(KEY_A) == 2 and not any(e.type == "retrying" for e in a.events)
    assert validate_transcript(a.engine.messages) == []
    results = [r.text for m in a.engine.messages for r in m.tool_results]
    assert results == ["Oslo: rain"]  # the call that ran keeps its result
    assert KEY_A not in shown(a)
