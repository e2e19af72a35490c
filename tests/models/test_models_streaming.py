"""Chunking invariance, abort at any byte (the response is closed, never drained), and
a real connection pool surviving 1,000 aborted streams."""

from __future__ import annotations

import asyncio
from typing import Any

import httpcore
import httpx
import pytest
from _models_support import (
    API_KEY,
    COMPLETE_FIXTURES,
    FakeNetwork,
    MockServer,
    collect,
    final,
    load,
    request,
    run_fixture,
    split,
)
from hypothesis import given
from hypothesis import strategies as st

from agentloop._abort import AbortController
from agentloop._accumulate import Accumulator
from agentloop._errors import AbortError, ModelError
from agentloop.models import AnthropicModel, StreamEnd, _driver

NAMES = sorted(COMPLETE_FIXTURES)


def model_for(name: str, client: httpx.AsyncClient) -> Any:
    return COMPLETE_FIXTURES[name]("m", api_key=API_KEY, http_client=client)


@pytest.mark.parametrize("name", NAMES)
@given(data=st.data())
async def test_any_byte_chunking_gives_identical_final_message(name: str, data: st.DataObject) -> None:
    body = load(name)
    _, whole = await run_fixture(name, body)
    cuts = data.draw(st.lists(st.integers(1, len(body) - 1), max_size=40), label="cuts")
    events, acc = await run_fixture(name, split(body, cuts))
    assert final(acc) == final(whole)
    assert isinstance(events[-1], StreamEnd)


@pytest.mark.parametrize("name", NAMES)
async def test_byte_by_byte(name: str) -> None:
    body = load(name)
    _, whole = await run_fixture(name, body)
    _, acc = await run_fixture(name, [body[i : i + 1] for i in range(len(body))])
    assert final(acc) == final(whole)


# -- abort ---------------------------------------------------------------------------


@pytest.mark.parametrize("name", NAMES)
@given(data=st.data())
async def test_cancel_at_any_byte_closes_the_response(name: str, data: st.DataObject) -> None:
    body = load(name)
    cut = data.draw(st.integers(0, len(body) - 1), label="cut")
    server = MockServer(body[:cut] if cut else [], hang=True)
    acc = Accumulator()
    async with server.client() as client:
        model = model_for(name, client)

        async def consume() -> None:
            async for ev in model.stream(request(), AbortController().signal):
                acc.feed(ev)

        task = asyncio.create_task(consume())
        if await server_blocked(server, task):
            task.cancel()
            with pytest.raises(asyncio.CancelledError):
                await task
        else:  # the stream ended on its own first (an error event before the cut)
            with pytest.raises(ModelError):
                await task
    assert server.streams[0].closed
    assert not acc.ended
    acc.message(partial=True)  # a partial message can always be built


async def server_blocked(server: MockServer, task: asyncio.Task[None]) -> bool:
    """Wait until the response body blocks; False if the task ended first (e.g. on an error event)."""
    while not server.streams:
        await asyncio.sleep(0)
    blocked = asyncio.ensure_future(server.streams[0].blocked.wait())
    await asyncio.wait([blocked, task], return_when=asyncio.FIRST_COMPLETED)
    blocked.cancel()
    return not task.done()


@pytest.mark.parametrize("name", NAMES)
@pytest.mark.parametrize("mode", ["aclose", "signal"])
async def test_stop_after_every_event_closes_the_response(name: str, mode: str) -> None:
    body = load(name)
    total = len(await _events(name, body))
    for stop_after in range(total):
        server = MockServer(split(body, range(0, len(body), 97)))
        controller = AbortController()
        async with server.client() as client:
            gen = model_for(name, client).stream(request(), controller.signal)
            seen = 0
            if mode == "aclose":
                async for _ in gen:
                    seen += 1
                    if seen > stop_after:
                        break
                await gen.aclose()
            else:
                last: Any = None
                try:
                    async for ev in gen:
                        last = ev
                        seen += 1
                        if seen > stop_after:
                            controller.abort("send_now")
                except AbortError as exc:
                    assert exc.reason == "send_now"
                else:  # aborted after the last SSE event: the stream had already ended
                    assert isinstance(last, StreamEnd)
        assert server.streams[0].closed, (mode, stop_after)


async def _events(name: str, body: bytes) -> list[Any]:
    events, _ = await run_fixture(name, body)
    return events


@pytest.mark.parametrize("name", NAMES)
async def test_a_server_that_keeps_the_body_open_after_the_terminator_does_not_hold_the_answer(
    name: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    # The terminator says the response is whole; a server (or proxy) that keeps the body open
    # after it held back the final event until the read timeout, which then failed the answer.
    monkeypatch.setattr(_driver, "_TAIL_WAIT", 0.01)
    body = load(name)
    _, whole = await run_fixture(name, body)
    server = MockServer([body, b": keep-alive\n\n"], hang=True)
    async with server.client() as client:
        events, acc = await asyncio.wait_for(collect(model_for(name, client)), 10)
    assert final(acc) == final(whole)
    assert isinstance(events[-1], StreamEnd)
    assert server.streams[0].blocked.is_set() and server.streams[0].closed


async def test_aborted_before_start_sends_nothing() -> None:
    server = MockServer(load("anthropic_text.sse"))
    controller = AbortController()
    controller.abort("cancel")
    async with server.client() as client:
        with pytest.raises(AbortError):
            await collect(AnthropicModel("m", api_key=API_KEY, http_client=client), signal=controller.signal)
    assert server.requests == []


# -- a real httpcore pool ---------------------------------------------------------------


class HangingNetworkStream(httpcore.AsyncNetworkStream):
    """A fake socket: returns the canned bytes, then blocks reading until cancelled."""

    def __init__(self, data: bytes, blocked: asyncio.Event) -> None:
        self._chunks = [data]
        self._blocked = blocked
        self.closed = False

    async def read(self, max_bytes: int, timeout: float | None = None) -> bytes:  # noqa: ASYNC109
        if self._chunks:
            return self._chunks.pop()
        self._blocked.set()
        await asyncio.Event().wait()
        raise AssertionError("unreachable")  # pragma: no cover

    async def write(self, buffer: bytes, timeout: float | None = None) -> None:  # noqa: ASYNC109
        return None

    async def aclose(self) -> None:
        self.closed = True

    def get_extra_info(self, info: str) -> Any:
        return None


class Backend(FakeNetwork):
    def __init__(self, response: bytes) -> None:
        self.response = response
        self.streams: list[HangingNetworkStream] = []
        self.blocked = asyncio.Event()

    def connect(self) -> HangingNetworkStream:
        stream = HangingNetworkStream(self.response, self.blocked)
        self.streams.append(stream)
        return stream

    async def sleep(self, seconds: float) -> None:  # pragma: no cover - unused by the pool here
        await asyncio.sleep(seconds)


async def test_1000_aborted_streams_through_a_small_pool() -> None:
    events = load("anthropic_text.sse")[:600]  # message_start + a block start + ping, no end
    head = b"HTTP/1.1 200 OK\r\ncontent-type: text/event-stream\r\ncontent-length: 100000\r\n\r\n"
    backend = Backend(head + events)
    transport = httpx.AsyncHTTPTransport(limits=httpx.Limits(max_connections=2))
    pool = httpcore.AsyncConnectionPool(max_connections=2, network_backend=backend)
    transport._pool = pool
    timeout = httpx.Timeout(10.0, pool=2.0)  # a leaked connection would make us hit PoolTimeout
    async with httpx.AsyncClient(transport=transport, timeout=timeout) as client:
        model = AnthropicModel("m", api_key=API_KEY, http_client=client, base_url="http://llm.test")
        for i in range(1000):
            if i % 2:  # stop the consumer with aclose() after the first event
                gen = model.stream(request(), AbortController().signal)
                async for _ in gen:
                    break
                await gen.aclose()
            else:  # cancel the task while it waits for bytes
                backend.blocked.clear()
                task = asyncio.create_task(collect(model))
                blocked = asyncio.ensure_future(backend.blocked.wait())
                await asyncio.wait([blocked, task], return_when=asyncio.FIRST_COMPLETED)
                assert not task.done()
                task.cancel()
                with pytest.raises(asyncio.CancelledError):
                    await task
            assert len(pool.connections) == 0, i
    assert len(backend.streams) == 1000
    assert all(s.closed for s in backend.streams)
