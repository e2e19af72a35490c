"""Hundreds of engines in one event loop, as a web backend runs them: one per conversation, made
per request and dropped after, all over one list of stock policies. Each run ends as its host
steered it, with a valid transcript holding its own conversation's texts only; the shared stateful
policies are forked (a warning once per policy, not per engine); nothing outlives the engines, no
registry grows with the number made, and one engine's work does not grow with the number alive."""

from __future__ import annotations

import asyncio
import gc
import io
import json
import logging
import os
import random
import re
import sys
import tracemalloc
import weakref
from collections import Counter
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import Any

import httpx
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from agentloop import (
    Allow,
    Deny,
    Event,
    InterjectionInjected,
    QueryEngine,
    ScriptedModel,
    ScriptedResponse,
    ScriptedToolCall,
    TextDelta,
    ToolContext,
    ToolUseBlock,
    TurnStarted,
    _executor,
    _policy,
    _recording,
    _subagent,
    _turns,
    tool,
)
from agentloop._detector import _reach_table
from agentloop.models import OpenAIChatModel
from agentloop.models._http._secrets import (
    URL_LOGS,
    Redactor,
    _UrlCredentialsFilter,
    scrub_record,
    shown_forms,
    url_credentials,
)
from agentloop.policies import ConservativeDoomLoopPolicy, IdenticalToolCallRun, Policy
from agentloop.testing import assert_valid, turn_ended
from tests.host_wire import ChatServer, Reply

TAG = re.compile(r"conv\d{4}")
PLANS = ("interrupt_loop", "interrupt_thread", "send_now", "interject", "plain")


@dataclass
class Conversation:
    """One request's engine, what its host does to it, and what it saw."""

    n: int
    plan: str
    moment: str  # when an interrupt lands: at the first text delta, or while the slow tool runs
    engine: QueryEngine
    slow_started: asyncio.Event = field(default_factory=asyncio.Event)
    release: asyncio.Event = field(default_factory=asyncio.Event)
    events: list[Event] = field(default_factory=list)

    @property
    def tag(self) -> str:
        return f"conv{self.n:04d}"


@tool
async def fast(tag: str) -> str:
    """Answer at once."""
    return f"fast result for {tag}"


@tool
async def slow(tag: str, ctx: ToolContext) -> str:
    """Wait until the host lets it finish."""
    conv: Conversation = ctx.engine.conversation  # type: ignore[attr-defined]
    conv.slow_started.set()
    await conv.release.wait()
    return f"slow result for {tag}"


@tool
async def guarded(tag: str) -> str:
    """A tool the permission callback decides on."""
    return f"guarded result for {tag}"


async def permission(call: ToolUseBlock, ctx: ToolContext) -> Allow | Deny:
    n = int(call.input["tag"][4:])
    return Allow() if call.name != "guarded" or n % 2 == 0 else Deny(f"not for {call.input['tag']}")


def _script(tag: str) -> ScriptedModel:
    calls = [ScriptedToolCall(name, {"tag": tag}) for name in ("fast", "slow", "guarded")]
    return ScriptedModel([
        ScriptedResponse(text=f"Working on {tag}, calling tools.", tool_calls=calls, chunk=5),
        ScriptedResponse(text=f"All done for {tag}.", chunk=5),
        ScriptedResponse(text=f"And once more for {tag}.", chunk=5),
        ScriptedResponse(text=f"Last word for {tag}.", chunk=5),
    ])


def _conversations(count: int, policies: list[Policy], seed: int, first: int = 0) -> list[Conversation]:
    rng = random.Random(seed)
    out = []
    for n in range(first, first + count):
        engine = QueryEngine(_script(f"conv{n:04d}"), tools=[fast, slow, guarded], policies=policies,
                             permission=permission)
        plan = rng.choice(PLANS[:2] if rng.random() < 0.5 else PLANS[2:])  # a random half interrupted
        conv = Conversation(n, plan, rng.choice(("delta", "slow")), engine)
        engine.conversation = conv  # type: ignore[attr-defined]
        out.append(conv)
    return out


async def _host(conv: Conversation, started: Callable[[], None], everyone: asyncio.Event) -> None:
    """Drain one engine's run, steering it as its plan says: at its first text delta, or from
    another task once its slow tool runs."""
    steering = asyncio.create_task(_steer(conv))
    try:
        async for event in conv.engine.run(f"Please help {conv.tag}."):
            conv.events.append(event)
            if isinstance(event, TurnStarted) and len(conv.events) == 1:
                started()
                await everyone.wait()  # every run has begun (holds its policies) before any goes on
            first = isinstance(event, TextDelta) and sum(isinstance(e, TextDelta) for e in conv.events) == 1
            if first and conv.moment == "delta" and conv.plan.startswith("interrupt"):
                await _interrupt(conv)
    finally:
        steering.cancel()


async def _steer(conv: Conversation) -> None:
    await conv.slow_started.wait()
    if conv.plan.startswith("interrupt"):
        if conv.moment == "slow":
            await _interrupt(conv)
        return
    if conv.plan == "send_now":
        conv.engine.send_now(f"Instead, for {conv.tag}: stop that.")
    elif conv.plan == "interject":
        conv.engine.interject(f"Also, for {conv.tag}: be brief.")
    conv.release.set()


async def _interrupt(conv: Conversation) -> None:
    if conv.plan == "interrupt_thread":
        await asyncio.to_thread(conv.engine.interrupt, f"stop {conv.tag}")
    else:
        conv.engine.interrupt(f"stop {conv.tag}")


def _texts(conv: Conversation) -> set[str]:
    dumped = json.dumps([m.model_dump(mode="json") for m in conv.engine.messages])
    return set(TAG.findall(dumped))


def _check(conv: Conversation) -> None:
    assert_valid(conv.engine.messages)
    assert _texts(conv) == {conv.tag}, (conv.plan, _texts(conv))
    assert {tag for e in conv.events if isinstance(e, TextDelta) for tag in TAG.findall(e.text)} <= {conv.tag}
    end = turn_ended(conv.events)
    if conv.plan.startswith("interrupt"):
        expected = {"aborted_tools"} if conv.moment == "slow" else {"aborted_streaming", "aborted_tools"}
        assert end.reason in expected, (conv.plan, conv.moment, end)
        assert end.abort_reason == f"stop {conv.tag}"
    else:
        assert end.reason == "completed", (conv.plan, end)
    if conv.plan == "interject":
        injected = [e for e in conv.events if isinstance(e, InterjectionInjected)]
        assert [t for e in injected for t in e.texts] == [f"Also, for {conv.tag}: be brief."]


def _warnings(caplog: pytest.LogCaptureFixture) -> list[logging.LogRecord]:
    return [r for r in caplog.records if r.name.startswith("agentloop") and r.levelno >= logging.WARNING]


async def _run_all(convs: list[Conversation], everyone: asyncio.Event | None = None) -> None:
    """Run every conversation at once; ``everyone`` is set once all their runs have begun."""
    everyone = everyone if everyone is not None else asyncio.Event()
    begun = Counter[str]()

    def started() -> None:
        begun["runs"] += 1
        if begun["runs"] == len(convs):
            everyone.set()

    async with asyncio.timeout(120):
        async with asyncio.TaskGroup() as group:
            for conv in convs:
                group.create_task(_host(conv, started, everyone))


async def test_hundreds_of_engines_over_one_policy_list_each_end_as_their_host_steered(
    caplog: pytest.LogCaptureFixture,
) -> None:
    caplog.set_level(logging.INFO, logger="agentloop")
    shared: list[Policy] = [ConservativeDoomLoopPolicy(), IdenticalToolCallRun()]
    convs = _conversations(300, shared, seed=17)
    assert set(Counter(c.plan for c in convs)) == set(PLANS)
    await _run_all(convs)
    for conv in convs:
        _check(conv)
    # The runs overlapped: every engine judges with policies of its own, forks of the shared ones.
    for place in range(len(shared)):
        used = {id(c.engine.policies[place]) for c in convs}
        assert len(used) == len(convs)
    assert all(type(p) is type(q) for c in convs for p, q in zip(c.engine.policies, shared, strict=True))
    # One warning per shared policy, not one per engine.
    warned = _warnings(caplog)
    assert len(warned) == len(shared), [r.getMessage()[:80] for r in warned]
    assert sorted(r.args[0] for r in warned) == sorted(p.name for p in shared)  # type: ignore[index]


async def test_engines_made_per_request_while_others_run_warn_once_per_shared_policy(
    caplog: pytest.LogCaptureFixture,
) -> None:
    caplog.set_level(logging.INFO, logger="agentloop")
    shared: list[Policy] = [ConservativeDoomLoopPolicy(), IdenticalToolCallRun()]
    early = _conversations(150, shared, seed=8)
    async with asyncio.timeout(120), asyncio.TaskGroup() as group:
        begun = asyncio.Event()
        running = group.create_task(_run_all(early, begun))
        await begun.wait()
        late = _conversations(150, shared, seed=9, first=150)  # made while early runs hold the policies
        group.create_task(_run_all(late))
        await running
    for conv in early + late:
        _check(conv)
    warned = _warnings(caplog)
    assert len(warned) == len(shared), [r.getMessage()[:80] for r in warned]


async def test_engines_dropped_after_their_runs_leave_nothing_alive() -> None:
    shared: list[Policy] = [ConservativeDoomLoopPolicy(), IdenticalToolCallRun()]
    convs = _conversations(120, shared, seed=5)
    await _run_all(convs)
    refs: list[weakref.ref[Any]] = []
    for conv in convs:
        _check(conv)
        refs.append(weakref.ref(conv.engine))
        for policy in conv.engine.policies:
            if not any(policy is p for p in shared):
                refs.append(weakref.ref(policy))
                refs += [weakref.ref(d) for d in getattr(policy, "detectors", {}).values()]
    assert len(refs) > 3 * len(convs)
    del convs, conv, policy
    gc.collect()
    alive = [ref() for ref in refs if ref() is not None]
    assert not alive, f"{len(alive)} still alive, e.g. {type(alive[0]).__name__}"


def _registries() -> dict[str, int]:
    """The size of every module-level store agentloop keeps about engines, runs and policies."""
    loggers = ("", "agentloop", "httpx", "httpx2", "mcp")
    return {
        "bound": len(_policy._bound), "holders": len(_policy._holders), "warned": len(_policy._warned),
        "busy": len(_policy._busy), "plain_hooks": len(_policy._plain_hooks),
        "numbers": len(_subagent._numbers), "store_writers": len(_recording._store_writers),
        "beginning": len(_turns._beginning), "abandoned": len(_executor._abandoned),
        "url_logs": len(URL_LOGS._live), "reach_table": _reach_table.cache_info().currsize,
        "filters": sum(len(logging.getLogger(n).filters) for n in loggers),
        "handlers": sum(len(logging.getLogger(n).handlers) for n in loggers),
    }


@pytest.fixture
def at_fork_calls(monkeypatch: pytest.MonkeyPatch) -> Iterator[list[Any]]:
    calls: list[Any] = []
    real = os.register_at_fork

    def counting(**kwargs: Any) -> None:
        calls.append(kwargs)
        real(**kwargs)

    monkeypatch.setattr(os, "register_at_fork", counting)
    yield calls


async def _one_request(n: int, shared: list[Policy], sub: bool) -> None:
    tag = f"conv{n % 10_000:04d}"
    engine = QueryEngine(_script(tag), tools=[fast, guarded], policies=shared, permission=permission)
    if sub:
        engine = engine.subagent(agent_id="helper")
    # A model of the request's own key, made and dropped with it.
    assert OpenAIChatModel("gpt-4o", api_key="sk-test", base_url=f"https://gw.invalid/v1?key=secret{n:06d}")
    events = [e async for e in engine.run(f"hi {tag}")]
    assert turn_ended(events).reason == "completed"


async def test_eighty_engines_one_after_another_grow_no_registry(at_fork_calls: list[Any]) -> None:
    # Sixty engines measured: a store keeping one entry per engine grows past the margin of two.
    shared: list[Policy] = [ConservativeDoomLoopPolicy(), IdenticalToolCallRun()]
    for n in range(0, 20, 2):  # two at once: the second's run forks the shared policies
        await asyncio.gather(_one_request(n, shared, sub=n % 3 == 0), _one_request(n + 1, shared, sub=False))
    gc.collect()
    before, forks_before = _registries(), len(at_fork_calls)
    for n in range(20, 80, 2):
        await asyncio.gather(_one_request(n, shared, sub=n % 3 == 0), _one_request(n + 1, shared, sub=False))
    gc.collect()
    after = _registries()
    grown = {k: (before[k], after[k]) for k in after if after[k] > before[k] + 2}
    assert not grown, grown
    assert len(at_fork_calls) - forks_before <= 2


class _Calls:
    """Python lines run while active, a loop's each time round (a deterministic measure of
    work, not a timing)."""

    def __init__(self) -> None:
        self.count = 0
        self._was_enabled = True

    def __enter__(self) -> _Calls:
        # A collection inside the window would run the callbacks of whatever garbage it finds (a
        # credential filter forgetting a collected model, one call each): when it comes depends on
        # how much was allocated before, not on the work measured. Garbage goes first, and none
        # is collected while counting.
        gc.collect()
        self._was_enabled = gc.isenabled()
        gc.disable()
        sys.settrace(self._trace)
        return self

    def __exit__(self, *exc: object) -> None:
        sys.settrace(None)
        if self._was_enabled:
            gc.enable()

    def _trace(self, frame: Any, event: str, arg: Any) -> Any:
        self.count += 1
        return self._trace


async def _work_of_one_more(live: int, shared: list[Policy]) -> int:
    """Python calls one engine's run makes (and a log line to httpx), with ``live`` other engines
    alive and holding forks of ``shared``, each with a model of its own key."""
    convs = _conversations(live, shared, seed=live)
    for conv in convs:
        conv.plan, conv.moment = "plain", "slow"
    await _run_all(convs)
    models = [OpenAIChatModel("gpt-4o", api_key="sk-test", base_url=f"https://gw.invalid/v1?key=secret{n:06d}")
              for n in range(live)]
    one = Conversation(9999, "plain", "slow", QueryEngine(_script("conv9999"), tools=[fast, slow, guarded],
                                                          policies=shared, permission=permission))
    one.engine.conversation = one  # type: ignore[attr-defined]
    one.release.set()
    loop = asyncio.get_running_loop()
    slow_after = loop.slow_callback_duration
    # Debug mode logs a step that took longer than this (traced, with 300 engines, on a busy
    # machine): a record through every logging filter, counted as the engine's work. Not timed here.
    loop.slow_callback_duration = float("inf")
    with _Calls() as calls:
        await _host(one, lambda: None, _set_event())
        one.engine.interrupt("nothing running")
        logging.getLogger("httpx").info("HTTP Request: POST %s", "https://gw.invalid/v1/chat/completions")
    loop.slow_callback_duration = slow_after
    _check(one)
    del models
    return calls.count


def _set_event() -> asyncio.Event:
    event = asyncio.Event()
    event.set()
    return event


async def test_one_engines_work_does_not_grow_with_the_engines_alive(caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.INFO, logger="httpx")  # a host that logs each request
    shared: list[Policy] = [ConservativeDoomLoopPolicy(), IdenticalToolCallRun()]
    await _work_of_one_more(5, shared)  # caches warmed
    few = await _work_of_one_more(10, shared)
    many = await _work_of_one_more(300, shared)
    assert many - few <= 100, (few, many)  # the same work, give or take a few lines


class _PoolTransport(httpx.AsyncBaseTransport):
    """The mock server behind a pool of ``size`` connections: a request waits for a free one, and
    frees it when its response is closed (as httpx's pool does)."""

    def __init__(self, server: ChatServer, size: int) -> None:
        self._inner = httpx.MockTransport(server._handle)
        self.free = asyncio.Semaphore(size)
        self.size = size

    async def handle_async_request(self, request: httpx.Request) -> httpx.Response:
        await self.free.acquire()
        try:
            response = await self._inner.handle_async_request(request)
        except BaseException:
            self.free.release()
            raise
        return httpx.Response(response.status_code, headers=response.headers,
                              stream=_Freeing(response.stream, self.free), request=request)


class _Freeing(httpx.AsyncByteStream):
    def __init__(self, inner: Any, free: asyncio.Semaphore) -> None:
        self._inner = inner
        self._free = free
        self._done = False

    async def __aiter__(self) -> Any:
        async for chunk in self._inner:
            yield chunk

    async def aclose(self) -> None:
        if not self._done:
            self._done = True
            self._free.release()
        await self._inner.aclose()


async def test_a_hundred_engines_on_one_http_client_close_every_response_when_interrupted() -> None:
    server = ChatServer("sk-shared", [])
    stopped = set(random.Random(3).sample(range(100), 50))

    def reply_for(body: dict[str, Any]) -> None:
        tag = TAG.findall(json.dumps(body["messages"]))[0]
        n = int(tag[4:])
        server.replies.insert(0, Reply(text=f"Here is the answer for {tag}, in pieces.", chunk=6,
                                       stall_after=2 if n in stopped else None))

    server.on_request = reply_for
    pool = _PoolTransport(server, size=20)
    client = httpx.AsyncClient(transport=pool, base_url="https://api.invalid")
    model = OpenAIChatModel("gpt-4o", api_key="sk-shared", base_url="https://api.invalid/v1", http_client=client)

    async def chat(n: int) -> tuple[QueryEngine, list[Event]]:
        tag = f"conv{n:04d}"
        engine = QueryEngine(model, policies=None)
        events: list[Event] = []
        async for event in engine.run(f"Question {tag}"):
            events.append(event)
            deltas = sum(isinstance(e, TextDelta) for e in events)
            if n in stopped and deltas == 2 and isinstance(event, TextDelta):
                if n % 2:
                    await asyncio.to_thread(engine.interrupt, f"stop {tag}")
                else:
                    engine.interrupt(f"stop {tag}")
        return engine, events

    async with asyncio.timeout(60):
        results = await asyncio.gather(*(chat(n) for n in range(100)))
    for n, (engine, events) in enumerate(results):
        tag = f"conv{n:04d}"
        assert_valid(engine.messages)
        assert set(TAG.findall(json.dumps([m.model_dump(mode="json") for m in engine.messages]))) == {tag}
        end = turn_ended(events)
        assert end.reason == ("aborted_streaming" if n in stopped else "completed"), (n, end)
    assert server.open_responses == 0
    assert len(server.streams) == 100
    assert pool.free._value == pool.size
    async with asyncio.timeout(10):  # a pool with a slot leaked would wait for ever
        answer = await client.post("/v1/chat/completions", headers={"authorization": "Bearer sk-shared"},
                                   json={"stream": True, "messages": [{"role": "user", "content": "conv0100 after"}]})
        await answer.aread()
    assert answer.status_code == 200
    await client.aclose()


class _Owner:
    """Something credentials live with (a model's connection, an MCP server)."""


_SECRET = st.text(alphabet=st.sampled_from("abcXYZ019-_.:/%@ \"'\\é"), min_size=1, max_size=12)


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(secrets=st.lists(_SECRET, min_size=1, max_size=8), shown=st.lists(st.integers(0, 7), max_size=4),
       around=st.lists(_SECRET, min_size=1, max_size=5))
def test_the_log_filter_scrubs_what_a_search_for_every_live_credential_would(
    secrets: list[str], shown: list[int], around: list[str]
) -> None:
    owners = [_Owner() for _ in secrets]
    for owner, secret in zip(owners, secrets, strict=True):
        URL_LOGS.watch(owner, [secret], ())
    pieces = [*around]
    for i in shown:  # each form a credential is shown in, glued to what is around it
        pieces.insert(i % (len(pieces) + 1), sorted(shown_forms(secrets[i % len(secrets)]))[i % 2 - 1])
    text = "".join(pieces)
    record = logging.LogRecord("httpx", logging.INFO, __file__, 1, "%s", (text,), None)
    URL_LOGS.filter(record)
    expected = logging.LogRecord("httpx", logging.INFO, __file__, 1, "%s", (text,), None)
    scrub_record(expected, Redactor(secrets))
    assert record.getMessage() == expected.getMessage()


def test_the_log_filter_forgets_a_collected_owner_at_once() -> None:
    gc.collect()  # owners other tests left for the collector go first: only this one is counted
    before = len(URL_LOGS._live)
    owner = _Owner()
    key = id(owner)
    URL_LOGS.watch(owner, ["secret-of-a-dropped-owner"], ())
    assert len(URL_LOGS._live) == before + 1 and key in URL_LOGS._live
    del owner
    gc.collect()
    assert len(URL_LOGS._live) == before and key not in URL_LOGS._live
    record = logging.LogRecord("httpx", logging.INFO, __file__, 1, "%s", ("secret-of-a-dropped-owner",), None)
    URL_LOGS.filter(record)
    assert record.getMessage() == "secret-of-a-dropped-owner"


def _record(msg: str, *args: object) -> logging.LogRecord:
    return logging.LogRecord("httpx", logging.INFO, __file__, 1, msg, args, None)


def test_a_record_that_fails_to_format_is_reported_without_its_credentials(
    capsys: pytest.CaptureFixture[str],
) -> None:
    url = "https://gw.invalid/v1?key=topsecret123456"
    owner = _Owner()
    URL_LOGS.watch(owner, url_credentials(url), ())
    handler = logging.StreamHandler(io.StringIO())
    handler.addFilter(URL_LOGS)
    handler.handle(_record("POST %s %s", url))  # one argument for two placeholders
    reported = capsys.readouterr().err  # the logging module's report of a record it cannot format
    assert "Arguments:" in reported  # still reported as malformed, by the logging module
    assert "gw.invalid/v1?key=[REDACTED]" in reported
    assert "topsecret123456" not in reported


def test_a_malformed_record_with_a_traceback_keeps_no_credential() -> None:
    url = "https://gw.invalid/v1?key=topsecret123456"
    owner = _Owner()
    URL_LOGS.watch(owner, url_credentials(url), ())
    try:
        raise ValueError(f"refused {url}")
    except ValueError:
        record = logging.LogRecord("httpx", logging.ERROR, __file__, 1, "%d: %s", ({"url": url},), sys.exc_info())
    URL_LOGS.filter(record)
    shown = f"{record.msg!s} {record.args!r} {record.exc_text} {record.exc_info}"
    assert "topsecret123456" not in shown
    with pytest.raises(TypeError):  # still malformed: the logging module reports it so
        record.getMessage()


class _CountedText(str):
    """A text that counts the searches for a substring made in it."""

    searches = 0

    def __contains__(self, part: object) -> bool:
        type(self).searches += 1
        return super().__contains__(part)  # type: ignore[operator]


def _watched(owners: list[_Owner], count: int, make: Callable[[int], str]) -> _UrlCredentialsFilter:
    """A filter of its own (no logger) watching ``count`` owners, the n-th holding ``make(n)``."""
    scrubber = _UrlCredentialsFilter()
    owners += [_Owner() for _ in range(count)]
    for n, owner in enumerate(owners):
        scrubber.watch(owner, [make(n)], ())
    return scrubber


def test_a_long_record_is_searched_by_tails_whatever_the_owners() -> None:
    owners: list[_Owner] = []
    scrubber = _watched(owners, 1000, lambda n: f"secret{n:06d}")
    text = _CountedText("x" * 70_000 + "secret000500")
    _CountedText.searches = 0
    assert scrubber._tails.found_in(text) == ["secret000500"]
    assert _CountedText.searches <= 10, _CountedText.searches  # not one per owner
    record = _record("%s", str(text))
    scrubber.filter(record)
    assert record.getMessage() == "x" * 70_000 + "[REDACTED]"


def test_a_credential_across_the_boundary_of_two_pieces_of_a_long_record_is_found() -> None:
    owners: list[_Owner] = []
    scrubber = _watched(owners, 40, lambda n: f"tok-{n:02d}-abcdefgh")
    secret = "tok-07-abcdefgh"
    for end in range(65_536 - 2, 65_536 + len(secret) + 6):
        text = "y" * (end - len(secret)) + secret + "y" * 100_000
        assert scrubber._tails.found_in(text) == [secret], end
        assert scrubber._tails.found_in(text + "z" * (131_072 - len(text))) == [secret], end


def test_a_long_record_with_few_credentials_takes_little_memory() -> None:
    owners: list[_Owner] = []
    scrubber = _watched(owners, 1, lambda n: "topsecret123456")
    text = "x" * 60_000 + "topsecret123456"
    tracemalloc.start()
    try:
        assert scrubber._tails.found_in(text) == ["topsecret123456"]
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert peak < 100_000, peak  # not a four-character string per character


def test_a_credential_with_a_line_break_in_its_tail_is_found_among_many() -> None:
    url = "https://gw.invalid/v1?key=abcdef%0A12"  # decodes to "abcdef\n12"
    owners: list[_Owner] = []
    scrubber = _watched(owners, 30, lambda n: f"other-secret-{n:03d}")
    owner = _Owner()
    scrubber.watch(owner, url_credentials(url), ())
    record = _record("GET %s done", "abcdef\n12")
    scrubber.filter(record)
    assert record.getMessage() == "GET [REDACTED] done"


@pytest.mark.parametrize("others", [0, 30])
def test_a_credential_two_owners_share_is_scrubbed_while_one_of_them_lives(others: int) -> None:
    owners: list[_Owner] = []
    scrubber = _watched(owners, others, lambda n: f"other-secret-{n:03d}")
    first, second = _Owner(), _Owner()
    scrubber.watch(first, ["shared-secret-1234"], ())
    scrubber.watch(second, ["shared-secret-1234"], ())
    del first
    gc.collect()
    record = _record("key %s", "shared-secret-1234")
    scrubber.filter(record)
    assert record.getMessage() == "key [REDACTED]"
    del second
    gc.collect()
    record = _record("key %s", "shared-secret-1234")
    scrubber.filter(record)
    assert record.getMessage() == "key shared-secret-1234"
