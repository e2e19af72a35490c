"""Nothing agentloop keeps grows with the number of runs or engines a process makes: each family of
runs is done N times, then 3N times more, and the live objects of agentloop's types, the sizes of
its registries, the logging filters and handlers, and the memory traced must not grow between the
two checkpoints beyond a small constant."""

from __future__ import annotations

import asyncio
import functools
import gc
import json
import logging
import os
import sys
import threading
import tracemalloc
import weakref
from collections import Counter
from collections.abc import AsyncGenerator, Awaitable, Callable, Iterator, Mapping
from pathlib import Path
from typing import Any
from unittest import mock

import httpx
import httpx2
import pytest
from _pytest.logging import LogCaptureHandler

from agentloop import (
    Event,
    Policy,
    QueryEngine,
    ScriptedModel,
    ScriptedResponse,
    ScriptedToolCall,
    TextDelta,
    _executor,
    _policy,
    _process,
    _recording,
    _subagent,
    _turns,
    delegate_tool,
    tool,
)
from agentloop.mcp import MCPServer
from agentloop.models import OpenAIChatModel
from agentloop.models._http._secrets import URL_LOGS
from agentloop.sessions import JsonlSession
from agentloop.sessions import _store as sessions_store
from tests.conftest import record_streamed_responses
from tests.helpers import HangingModel, VirtualClock
from tests.test_secrets_audit import _mcp_answer

Scenario = Callable[[], Awaitable[None]]

#: The loggers agentloop, the HTTP clients and the MCP SDK log to: their filters and handlers.
LOGGERS = ("", "agentloop", "httpx", "httpx2", "mcp", "mcp.client.streamable_http", "mcp.client.session", "mcp.client.stdio")
#: Growth allowed between the checkpoints: objects and entries (caches warming up, a pool
#: settling) and traced bytes (allocator and interning noise).
OBJECTS_SLACK = 4
BYTES_SLACK = 48 * 1024


def _registries() -> dict[str, int]:
    return {
        "policy._bound": len(_policy._bound),
        "policy._holders": len(_policy._holders),
        "policy._warned": len(_policy._warned),
        "policy._plain_hooks": len(_policy._plain_hooks),
        "recording._store_writers": len(_recording._store_writers),
        "subagent._numbers": len(_subagent._numbers),
        "executor._abandoned": len(_executor._abandoned),
        "process._live": len(_process._live),
        "turns._beginning": len(_turns._beginning),
        "sessions._OPEN": len(sessions_store._OPEN),
        "URL_LOGS._live": len(URL_LOGS._live),
        "finalizers": len(weakref.finalize._registry),  # type: ignore[attr-defined]
        "filters": sum(len(logging.getLogger(name).filters) for name in LOGGERS),
        "handlers": sum(len(logging.getLogger(name).handlers) for name in LOGGERS),
        "threads": threading.active_count(),
        "file descriptors": len(os.listdir("/proc/self/fd")) if os.path.isdir("/proc/self/fd") else 0,
    }


def _live_objects() -> Counter[str]:
    counts: Counter[str] = Counter()
    for obj in gc.get_objects():
        cls = type(obj)
        if cls.__module__.startswith("agentloop"):
            counts[f"{cls.__module__}.{cls.__qualname__}"] += 1
    return counts


class _Responses:
    """The streamed HTTP responses of the test (as the conftest's check keeps them), the closed
    ones let go of at each checkpoint: the check itself must not be what grows."""

    streamed: list[Any] = []  # noqa: RUF012
    closed: set[int] = set()  # noqa: RUF012

    @classmethod
    def let_go_of_closed(cls) -> None:
        cls.streamed[:] = [r for r in cls.streamed if id(r) not in cls.closed]
        cls.closed.intersection_update(id(r) for r in cls.streamed)


@pytest.fixture(autouse=True)
def _no_open_responses(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    """The conftest's check that every streamed response was closed, closed ones let go of."""
    _Responses.streamed.clear()
    _Responses.closed.clear()
    for http in (httpx, httpx2):
        record_streamed_responses(monkeypatch, http, _Responses.streamed, _Responses.closed)
    yield
    _Responses.let_go_of_closed()
    assert not _Responses.streamed, f"HTTP responses left open after the test: {_Responses.streamed}"


async def _checkpoint() -> tuple[dict[str, int], Counter[str], int]:
    """What is kept once the loop has done what was left to it (a dropped run's closing, which
    asyncio schedules as the generator is collected) and the collector has run."""
    for _ in range(2):  # what one collection finalizes may leave more to the loop, and back
        for _ in range(20):
            await asyncio.sleep(0)
        gc.collect()
    return _measure()


def _measure() -> tuple[dict[str, int], Counter[str], int]:
    _Responses.let_go_of_closed()
    _let_go_of_captured_logs()
    for _ in range(2):  # finalizers run by one collection free more for the next
        gc.collect()
    return _registries(), _live_objects(), _traced()


def _let_go_of_captured_logs() -> None:
    """pytest keeps each record logged during a test, and what its arguments hold (httpx's
    request line holds the request's URL): what it kept so far is let go of."""
    for handler in logging.getLogger().handlers:
        if isinstance(handler, LogCaptureHandler):
            handler.reset()


def _traced() -> int:
    """The bytes traced, but for tracemalloc's own."""
    snapshot = tracemalloc.take_snapshot().filter_traces([tracemalloc.Filter(False, tracemalloc.__file__)])
    return sum(stat.size for stat in snapshot.statistics("filename"))


@pytest.fixture
def traced() -> Iterator[None]:
    """Memory traced from here on; what lives already is set aside (`gc.freeze`) so that each
    collection goes through what the test made only, and is quick."""
    gc.collect()
    gc.freeze()
    tracemalloc.start()
    try:
        yield
    finally:
        tracemalloc.stop()
        gc.unfreeze()


async def _no_growth(scenario: Scenario, n: int) -> None:
    """Run ``scenario`` ``n`` times, then ``3n`` times more: nothing grows in between."""
    for _ in range(n):
        await scenario()
    before = await _checkpoint()
    for _ in range(3 * n):
        await scenario()
    _compare(before, await _checkpoint(), 3 * n)


def _compare(before: tuple[dict[str, int], Counter[str], int], after: tuple[dict[str, int], Counter[str], int], runs: int) -> None:
    (registries, objects, size), (registries_after, objects_after, size_after) = before, after
    grown = {k: (registries[k], v) for k, v in registries_after.items() if v > registries[k] + 1}
    assert not grown, f"registries grew: {grown}"
    more = {k: v - objects[k] for k, v in objects_after.items() if v - objects[k] > 0}
    assert sum(more.values()) <= OBJECTS_SLACK, f"agentloop objects grew: {more}"
    assert size_after - size <= BYTES_SLACK, f"traced memory grew by {size_after - size} bytes over {runs} runs"


# -- the scenarios -----------------------------------------------------------------------------------


@tool
async def lookup(key: str) -> str:
    """Look a key up."""
    return key.upper()


def _calls(*names: str) -> ScriptedResponse:
    return ScriptedResponse(text="Working.", tool_calls=[ScriptedToolCall(n, {"key": "k"}) for n in names])


async def _plain_run() -> None:
    engine = QueryEngine(ScriptedModel(["Hello there."]))
    async for _ in engine.run("hi"):
        pass
    assert engine.messages[-1].role == "assistant"


async def _tools_and_interrupt() -> None:
    model = ScriptedModel([_calls("lookup", "lookup"), ScriptedResponse(text="long answer " * 20, chunk=3), "Done."])
    engine = QueryEngine(model, tools=[lookup])
    async for ev in engine.run("go"):
        if isinstance(ev, TextDelta) and "long" in ev.text:
            engine.interrupt("cancel")
    async for _ in engine.run("again"):
        pass


def _one_engine() -> Scenario:
    """Run after run of one engine, whose host starts each from a cleared transcript (a chat
    server reusing its engine): only the transcript may grow with its runs."""
    model = ScriptedModel([_calls("lookup"), ScriptedResponse(text="long answer " * 20, chunk=3)], cycle=True, record=False)
    engine = QueryEngine(model, tools=[lookup])

    async def scenario() -> None:
        async for ev in engine.run("go"):
            if isinstance(ev, TextDelta) and "long" in ev.text:
                engine.interrupt("cancel")
        engine.messages.clear()

    return scenario


async def _dropped_mid_run() -> None:
    """A run whose host stops iterating it after its first event and drops it."""
    engine = QueryEngine(ScriptedModel([_calls("lookup"), "Done."]), tools=[lookup])
    run = engine.run("go")
    await anext(run)
    del run


async def _never_run() -> None:
    QueryEngine(ScriptedModel(["never"]), tools=[lookup, delegate_tool()])


async def _unstarted_run() -> None:
    engine = QueryEngine(ScriptedModel(["never"]))
    engine.run("hi")


async def _subagents() -> None:
    model = ScriptedModel([
        ScriptedResponse(tool_calls=[ScriptedToolCall("task", {"task": "look"})]),
        _calls("lookup"),
        "K.",
        "The answer is K.",
    ])
    engine = QueryEngine(model, tools=[lookup, delegate_tool()])
    async for _ in engine.run("ask a subagent"):
        pass


def _sessions(folder: Path) -> Scenario:
    count = iter(range(10**6))

    async def scenario() -> None:
        path = folder / f"s{next(count) % 4}.jsonl"
        path.unlink(missing_ok=True)
        model = ScriptedModel([ScriptedResponse(tool_calls=[ScriptedToolCall("task", {"task": "look"})]), "K.", "First."])
        with JsonlSession(path) as session:
            engine = QueryEngine(model, session=session, tools=[delegate_tool()])
            async for _ in engine.run("one"):
                pass
        session, loaded = JsonlSession.resume(path)
        with session:
            engine = QueryEngine(ScriptedModel(["Second."]), session=session, messages=loaded.messages)
            async for _ in engine.run("two"):
                pass

    return scenario


def _chat_stream(text: str) -> bytes:
    chunks = [
        {"id": "c1", "choices": [{"index": 0, "delta": {"role": "assistant", "content": text}, "finish_reason": None}]},
        {"id": "c1", "choices": [{"index": 0, "delta": {}, "finish_reason": "stop"}]},
    ]
    return b"".join(f"data: {json.dumps(c)}\n\n".encode() for c in chunks) + b"data: [DONE]\n\n"


def _serve_with_errors() -> Callable[[httpx.Request], httpx.Response]:
    """An overloaded answer (retried) every third request, a refused key once in a while, else a stream."""
    served = iter(range(10**6))

    def handle(request: httpx.Request) -> httpx.Response:
        n = next(served)
        if n % 3 == 0:
            return httpx.Response(529, json={"error": {"message": "overloaded"}})
        if n % 7 == 1:
            return httpx.Response(401, json={"error": {"message": "bad key"}})
        return httpx.Response(200, headers={"content-type": "text/event-stream"}, content=_chat_stream("Hi."))

    return handle


def _chat_model(client: httpx.AsyncClient) -> OpenAIChatModel:
    url = "https://u:pw0123456789@api.example/v1?key=q0123456789"
    return OpenAIChatModel("gpt-test", api_key="sk-growth-0123456789", base_url=url, http_client=client)


async def _run_on(model: OpenAIChatModel) -> None:
    engine = QueryEngine(model, retry_base_delay=0.001, retry_max_delay=0.001)
    async for _ in engine.run("hi"):
        pass


def _provider() -> Scenario:
    """Each run with a model and client of its own (a request handler making them)."""
    handle = _serve_with_errors()

    async def scenario() -> None:
        async with httpx.AsyncClient(transport=httpx.MockTransport(handle)) as client:
            await _run_on(_chat_model(client))

    return scenario


def _mcp_http() -> Scenario:
    async def scenario() -> None:
        srv = MCPServer.http("https://bob:pw0123456789@mcp.example/mcp?token=t0123456789", connect_timeout=10)
        async with srv:
            engine = QueryEngine(ScriptedModel([ScriptedResponse(tool_calls=[ScriptedToolCall("echo", {})]), "Done."]), tools=await srv.list_tools())
            async for _ in engine.run("echo"):
                pass

    return scenario


SERVER = str(Path(__file__).with_name("mcp_server.py"))


def _mcp_stdio(server: MCPServer) -> Scenario:
    async def scenario() -> None:
        engine = QueryEngine(ScriptedModel([ScriptedResponse(tool_calls=[ScriptedToolCall("add", {"a": 1, "b": 2})]), "3."]))
        server.attach(engine)
        async for _ in engine.run("add"):
            pass

    return scenario


def _left_in_a_closed_loop() -> None:
    """A run left in an event loop the host stopped and closed under it (an editor quitting):
    once with the host looking at the engine again, once without."""
    for look in (True, False):
        loop = asyncio.new_event_loop()
        loop.set_debug(True)
        engine = QueryEngine(HangingModel())

        async def start(engine: QueryEngine = engine) -> Any:
            run = engine.run("go")
            async for ev in run:
                if isinstance(ev, TextDelta):
                    return run
            raise AssertionError("the run ended")

        run = loop.run_until_complete(start())
        loop.close()
        if look:
            assert not engine.running
        del run, engine


# -- the tests -----------------------------------------------------------------------------------------


async def test_plain_runs_leave_nothing_behind(traced: None) -> None:
    await _no_growth(_plain_run, 8)


async def test_runs_with_tools_and_interrupts_leave_nothing_behind(traced: None) -> None:
    await _no_growth(_tools_and_interrupt, 5)


async def test_runs_of_one_engine_leave_nothing_behind(traced: None) -> None:
    await _no_growth(_one_engine(), 5)


async def test_runs_dropped_mid_way_leave_nothing_behind(traced: None) -> None:
    await _no_growth(_dropped_mid_run, 5)


async def test_engines_never_run_leave_nothing_behind(traced: None) -> None:
    await _no_growth(_never_run, 10)


async def test_run_generators_dropped_unstarted_leave_nothing_behind(traced: None) -> None:
    await _no_growth(_unstarted_run, 10)


async def test_subagent_runs_leave_nothing_behind(traced: None) -> None:
    await _no_growth(_subagents, 4)


async def test_sessions_saved_and_resumed_leave_nothing_behind(traced: None, tmp_path: Path) -> None:
    await _no_growth(_sessions(tmp_path), 3)


async def test_provider_runs_with_retries_and_errors_leave_nothing_behind(traced: None) -> None:
    with VirtualClock():
        await _no_growth(_provider(), 4)


async def test_runs_on_one_provider_model_leave_nothing_behind(traced: None) -> None:
    async with httpx.AsyncClient(transport=httpx.MockTransport(_serve_with_errors())) as client:
        model = _chat_model(client)
        with VirtualClock():
            await _no_growth(functools.partial(_run_on, model), 4)


async def test_mcp_http_servers_leave_nothing_behind(traced: None) -> None:
    client = functools.partial(httpx2.AsyncClient, transport=httpx2.MockTransport(_mcp_answer))
    with mock.patch.object(httpx2, "AsyncClient", client):
        await _no_growth(_mcp_http(), 2)


async def test_runs_on_an_mcp_stdio_server_leave_nothing_behind(traced: None) -> None:
    async with MCPServer.stdio(sys.executable, [SERVER], env={"GROWTH_TOKEN": "secret0123456789"}) as server:
        await _no_growth(_mcp_stdio(server), 3)


@pytest.mark.closes_loop_under_tasks
def test_runs_left_in_loops_closed_under_them_leave_nothing_behind(traced: None) -> None:
    for _ in range(2):
        _left_in_a_closed_loop()
    before = _measure()
    for _ in range(6):
        _left_in_a_closed_loop()
    _compare(before, _measure(), 12)


# -- the registries by id(): an entry of a dead object is not taken for a new one at its address -------


class _Binding(Policy):
    """A stateful policy that keeps the tools it was last bound to."""

    one_engine = True
    # Of a size few other objects have: the block it frees is the next one of that size given out.
    __slots__ = ("tools", *(f"pad{i}" for i in range(37)))

    def __init__(self) -> None:
        self.tools: Mapping[str, Any] | None = None

    def bind(self, tools: Mapping[str, Any]) -> None:
        self.tools = tools


def _dropped(policies: list[Policy]) -> int:
    """The address of the last of ``policies``, taken out of them and collected."""
    policy = policies.pop()
    address, gone = id(policy), weakref.ref(policy)
    del policy
    gc.collect()
    assert gone() is None, "the policy is still held"
    return address


def _made_at(address: int) -> _Binding:
    """A new `_Binding` at ``address``, where one was freed: the allocator gives it out again
    (the others made meanwhile are kept until then, so each takes another free block)."""
    others = []
    for _ in range(10_000):
        policy = _Binding()
        if id(policy) == address:
            return policy
        others.append(policy)
    raise AssertionError("the address was not given out again")


async def _hold_a_run(engine: QueryEngine) -> AsyncGenerator[Event, None]:
    """``engine``'s run, held open (streaming) once its policies are claimed."""
    run = engine.run("go")
    async for ev in run:
        if isinstance(ev, TextDelta):
            return run
    raise AssertionError("the run ended")


async def test_a_policy_made_where_a_dropped_one_was_is_bound_to_the_engine_tools() -> None:
    engine = QueryEngine(ScriptedModel(["Done."]), tools=[lookup], policies=[_Binding()])
    address = _dropped(engine.policies)  # the host takes it out; it is collected
    policy = _made_at(address)
    engine.policies.append(policy)  # a new one in its place, at its address
    async for _ in engine.run("go"):
        pass
    assert policy.tools is not None and set(policy.tools) == {"lookup"}


async def test_a_policy_made_where_a_dropped_one_was_is_not_taken_for_it(caplog: pytest.LogCaptureFixture) -> None:
    first = QueryEngine(ScriptedModel(["Done.", ScriptedResponse(text="more " * 20, chunk=2)]), policies=[_Binding()])
    # The host takes the policy out while the run holds it.
    taken = [first.policies.pop() async for _ in first.run("one") if first.policies]
    policy = _made_at(_dropped(taken))
    run = await _hold_a_run(first)  # another run of the engine, without it
    second = QueryEngine(ScriptedModel(["Done."]), policies=[policy])
    with caplog.at_level(logging.WARNING, "agentloop"):
        async for _ in second.run("hi"):
            pass
    await run.aclose()
    assert not [r.getMessage() for r in caplog.records if "two engines at once" in r.getMessage()]


@pytest.mark.closes_loop_under_tasks
def test_an_engine_kept_after_its_run_was_left_in_a_closed_loop_holds_its_policies_no_more() -> None:
    engine = QueryEngine(HangingModel())
    loop = asyncio.new_event_loop()
    loop.set_debug(True)
    run = loop.run_until_complete(_hold_a_run(engine))
    held = [p for p in engine.policies if _policy._holders.get(p) is not None]
    assert held, "the run holds its stateful policies"
    loop.close()
    assert not engine.running  # the engine finds its run left there, and settles it
    assert [p for p in held if _policy._holders.get(p) is not None] == []
    del run
