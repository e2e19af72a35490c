"""A stream that goes quiet once its answer is whole: the stop reason (and, when the request
asked for it, the usage) came, then no ``[DONE]`` or ``message_stop`` and no end of the body, the
connection held open (Ollama versions, proxies). The response ends as complete after the
model's ``end_grace``, and the HTTP response is closed. Time is a fake clock: the event loop's
``time`` moved by the test, so the grace's timer fires when the test says, not after a wait."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import zlib
from collections.abc import AsyncIterator, Callable
from typing import Any

import httpx
import pytest
from _models_support import API_KEY, chat_chunk, chat_stream, collect, sse

from agentloop.models import AnthropicModel, OpenAIChatModel, StreamUsage

GRACE = 2.0


class QuietStream(httpx.AsyncByteStream):
    """A body that sends ``chunks``, then nothing (``blocked`` set) until ``go`` is set, then
    ``after``, then ends, or with ``hold`` waits until cancelled; records whether it was closed."""

    def __init__(self, chunks: list[bytes], after: list[bytes] | None = None, *, hold: bool = False) -> None:
        self.chunks, self.after, self.hold = chunks, after or [], hold
        self.blocked, self.go, self.sent = asyncio.Event(), asyncio.Event(), asyncio.Event()
        self.closed = False

    async def __aiter__(self) -> AsyncIterator[bytes]:
        for chunk in self.chunks:
            yield chunk
        self.blocked.set()
        await self.go.wait()
        for chunk in self.after:
            yield chunk
        self.sent.set()
        if self.hold:
            await asyncio.Event().wait()

    async def aclose(self) -> None:
        self.closed = True


class FakeClock:
    """The running loop's clock, moved forward by `advance` (timers due then fire at once)."""

    def __init__(self, monkeypatch: pytest.MonkeyPatch) -> None:
        loop = asyncio.get_running_loop()
        self._real: Callable[[], float] = loop.time
        self.offset = 0.0
        monkeypatch.setattr(loop, "time", lambda: self._real() + self.offset)

    async def advance(self, seconds: float) -> None:
        self.offset += seconds
        for _ in range(20):  # let the loop run what is due now
            await asyncio.sleep(0)


async def start(
    model_of: Callable[[httpx.AsyncClient], Any], stream: QuietStream, **headers: str
) -> tuple[httpx.AsyncClient, Any]:
    def handler(request: httpx.Request) -> httpx.Response:
        return httpx.Response(200, headers={"content-type": "text/event-stream", **headers}, stream=stream)

    client = httpx.AsyncClient(transport=httpx.MockTransport(handler))
    task = asyncio.create_task(collect(model_of(client)))
    await stream.blocked.wait()
    for _ in range(20):
        await asyncio.sleep(0)
    return client, task


def chat(**kw: Any) -> Callable[[httpx.AsyncClient], Any]:
    return lambda client: OpenAIChatModel("m", api_key=API_KEY, http_client=client, **kw)


USED = {"prompt_tokens": 5, "completion_tokens": 2, "total_tokens": 7}


@pytest.mark.parametrize(
    ("chunks", "kw"),
    [([chat_chunk({"content": "Hi"}), chat_chunk({}, "stop")], {"include_usage": False}),
     ([chat_chunk({"content": "Hi"}), chat_chunk({}, "stop", usage=USED)], {}),  # usage on the finish chunk
     ([chat_chunk({"content": "Hi"}, usage=USED), chat_chunk({}, "stop")], {}),  # usage on every chunk (vLLM)
     ([chat_chunk({"content": "Hi"}), chat_chunk({}, "stop"), chat_chunk({}, usage=USED)], {})],  # on an empty choice
    ids=["no-usage-asked", "usage-on-finish", "usage-before", "usage-after-with-a-choice"],
)  # fmt: skip
async def test_a_chat_stream_quiet_after_its_finish_ends_complete_after_the_grace(
    monkeypatch: pytest.MonkeyPatch, chunks: list[dict[str, Any]], kw: dict[str, Any]
) -> None:
    clock = FakeClock(monkeypatch)
    stream = QuietStream([chat_stream(*chunks, done=False)])
    client, task = await start(chat(end_grace=GRACE, **kw), stream)
    async with contextlib.aclosing(client):
        await clock.advance(GRACE - 0.1)
        assert not task.done() and not stream.closed  # the grace has not run out yet
        await clock.advance(0.2)
        assert task.done()
        _, acc = task.result()
    assert (acc.message().text, acc.stop_reason, acc.ended) == ("Hi", "end_turn", True)
    assert stream.closed


async def test_the_grace_is_counted_from_the_finish_not_from_each_keep_alive(monkeypatch: pytest.MonkeyPatch) -> None:
    clock = FakeClock(monkeypatch)
    body = chat_stream(chat_chunk({"content": "Hi"}), chat_chunk({}, "stop"), done=False)
    stream = QuietStream([body], [b": keep-alive\n\n"], hold=True)
    client, task = await start(chat(end_grace=GRACE, include_usage=False), stream)
    async with contextlib.aclosing(client):
        await clock.advance(GRACE - 0.5)
        stream.go.set()  # a keep-alive, then the body waits again
        await stream.sent.wait()
        await clock.advance(0.4)
        assert not task.done()
        await clock.advance(0.2)
        assert task.done()
        _, acc = task.result()
    assert acc.stop_reason == "end_turn" and stream.closed


async def test_a_chat_stream_quiet_before_its_finish_waits_on(monkeypatch: pytest.MonkeyPatch) -> None:
    clock = FakeClock(monkeypatch)
    usage = {"id": "chatcmpl-1", "object": "chat.completion.chunk", "choices": [], "usage": USED}
    stream = QuietStream([chat_stream(chat_chunk({"content": "Hi"}), done=False)], [chat_stream(chat_chunk({}, "stop"), usage)])
    client, task = await start(chat(end_grace=GRACE, include_usage=False), stream)
    async with contextlib.aclosing(client):
        await clock.advance(10 * GRACE)
        assert not task.done() and not stream.closed
        stream.go.set()
        _, acc = await task
    assert (acc.message().text, acc.stop_reason) == ("Hi", "end_turn")


async def test_a_chat_stream_quiet_after_its_finish_without_the_usage_asked_for_ends_after_the_grace(
    monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    # The answer is whole at its finish_reason: a usage chunk that never comes does not hold
    # it until the read timeout. The usage is unknown (0), and a warning says so, once.
    clock = FakeClock(monkeypatch)
    stream = QuietStream([chat_stream(chat_chunk({"content": "Hi"}), chat_chunk({}, "stop"), done=False)], hold=True)
    with caplog.at_level(logging.WARNING, "agentloop"):
        client, task = await start(chat(end_grace=GRACE), stream)
        async with contextlib.aclosing(client):
            await clock.advance(GRACE - 0.1)
            assert not task.done() and not stream.closed
            await clock.advance(0.2)
            assert task.done()
            events, acc = task.result()
    assert (acc.message().text, acc.stop_reason, acc.ended) == ("Hi", "end_turn", True)
    assert (acc.usage.input_tokens, acc.usage.output_tokens) == (0, 0)
    assert stream.closed and not any(isinstance(e, StreamUsage) for e in events)
    (record,) = [r for r in caplog.records if "usage" in r.getMessage()]
    assert "include_usage" in record.getMessage()


async def test_the_usage_that_comes_within_the_grace_after_the_finish_is_kept(
    monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    clock = FakeClock(monkeypatch)
    usage = {"id": "chatcmpl-1", "object": "chat.completion.chunk", "choices": [], "usage": USED}
    body = chat_stream(chat_chunk({"content": "Hi"}), chat_chunk({}, "stop"), done=False)
    stream = QuietStream([body], [chat_stream(usage, done=False)], hold=True)
    with caplog.at_level(logging.WARNING, "agentloop"):
        client, task = await start(chat(end_grace=GRACE), stream)
        async with contextlib.aclosing(client):
            await clock.advance(GRACE - 0.5)
            assert not task.done()
            stream.go.set()
            _, acc = await task
    assert (acc.message().text, acc.stop_reason, acc.usage.input_tokens, acc.usage.output_tokens) == ("Hi", "end_turn", 5, 2)
    assert stream.closed and not caplog.records


async def test_an_end_grace_of_none_waits_for_the_end_of_the_body(monkeypatch: pytest.MonkeyPatch) -> None:
    clock = FakeClock(monkeypatch)
    stream = QuietStream([chat_stream(chat_chunk({"content": "Hi"}), chat_chunk({}, "stop"), done=False)], [b"data: [DONE]\n\n"])
    client, task = await start(chat(end_grace=None, include_usage=False), stream)
    async with contextlib.aclosing(client):
        await clock.advance(1000.0)
        assert not task.done()
        stream.go.set()
        _, acc = await task
    assert acc.stop_reason == "end_turn"


def test_the_default_grace_is_short_and_an_invalid_one_is_refused() -> None:
    assert 0 < OpenAIChatModel("m", api_key=API_KEY).end_grace <= 5
    assert 0 < AnthropicModel("m", api_key=API_KEY).end_grace <= 5
    for bad in (-1, float("nan"), float("inf"), "2", True):
        with pytest.raises(ValueError, match="end_grace"):
            OpenAIChatModel("m", api_key=API_KEY, end_grace=bad)
        with pytest.raises(ValueError, match="end_grace"):
            AnthropicModel("m", api_key=API_KEY, end_grace=bad)


MESSAGE = {"type": "message_start", "message": {"id": "msg_1", "type": "message", "role": "assistant", "content": []}}
TEXT = [
    {"type": "content_block_start", "index": 0, "content_block": {"type": "text", "text": ""}},
    {"type": "content_block_delta", "index": 0, "delta": {"type": "text_delta", "text": "Hi"}},
    {"type": "content_block_stop", "index": 0},
]
STOP = {"type": "message_delta", "delta": {"stop_reason": "end_turn"}, "usage": {"output_tokens": 3}}


@pytest.mark.parametrize("stop", [True, False], ids=["after-stop-reason", "before-stop-reason"])
async def test_an_anthropic_stream_quiet_after_its_stop_reason_ends_complete_after_the_grace(
    monkeypatch: pytest.MonkeyPatch, stop: bool
) -> None:
    clock = FakeClock(monkeypatch)
    events = [MESSAGE, *TEXT, *([STOP] if stop else [])]
    rest = [] if stop else [sse((STOP["type"], STOP), ("message_stop", {"type": "message_stop"}))]
    stream = QuietStream([sse(*((e["type"], e) for e in events))], rest)
    client, task = await start(lambda c: AnthropicModel("claude-x", api_key=API_KEY, http_client=c, end_grace=GRACE), stream)
    async with contextlib.aclosing(client):
        await clock.advance(GRACE + 0.1)
        assert task.done() is stop
        if not stop:
            stream.go.set()
        _, acc = await task
    assert (acc.message().text, acc.stop_reason, acc.usage.output_tokens) == ("Hi", "end_turn", 3)
    assert stream.closed


async def test_a_compressed_body_held_open_after_its_finish_ends_complete(monkeypatch: pytest.MonkeyPatch) -> None:
    # A proxy that gzips the stream anyway: what was sent is decoded as it came (a sync flush),
    # and the unfinished compressed stream is not finished when the grace runs out.
    clock = FakeClock(monkeypatch)
    packer = zlib.compressobj(wbits=31)
    body = chat_stream(chat_chunk({"content": "Hi"}), chat_chunk({}, "stop"), done=False)
    stream = QuietStream([packer.compress(body) + packer.flush(zlib.Z_SYNC_FLUSH)])
    client, task = await start(chat(end_grace=GRACE, include_usage=False), stream, **{"content-encoding": "gzip"})
    async with contextlib.aclosing(client):
        await clock.advance(GRACE + 0.1)
        assert task.done()
        _, acc = task.result()
    assert (acc.message().text, acc.stop_reason) == ("Hi", "end_turn") and stream.closed


@pytest.mark.parametrize("asked", [True, False])
async def test_a_chat_body_that_closes_after_its_finish_without_the_usage_asked_for_warns_once(
    asked: bool, caplog: pytest.LogCaptureFixture
) -> None:
    # The body ends after the finish_reason, no usage chunk and no [DONE]: the answer is whole,
    # its usage unknown (0). Held open instead, the grace warns of the missing usage; closed, it
    # went by with no word.
    body = chat_stream(chat_chunk({"content": "Hi"}), chat_chunk({}, "stop"), done=False)

    def handler(request: httpx.Request) -> httpx.Response:
        return httpx.Response(200, headers={"content-type": "text/event-stream"}, content=body)

    with caplog.at_level(logging.WARNING, "agentloop"):
        async with httpx.AsyncClient(transport=httpx.MockTransport(handler)) as client:
            _, acc = await collect(chat(include_usage=asked)(client))
    assert (acc.message().text, acc.stop_reason, acc.ended) == ("Hi", "end_turn", True)
    assert (acc.usage.input_tokens, acc.usage.output_tokens) == (0, 0)
    warned = [r.getMessage() for r in caplog.records if "usage" in r.getMessage()]
    if asked:
        (record,) = warned
        assert "include_usage" in record and "unknown, 0" in record
    else:
        assert warned == []


class PacedStream(httpx.AsyncByteStream):
    """A body that sends its first chunk, then each next one when `step` allows it (``waiting``
    set while it waits), then holds the body open until cancelled; records whether it was closed."""

    def __init__(self, chunks: list[bytes]) -> None:
        self.chunks = chunks
        self.waiting, self.next = asyncio.Event(), asyncio.Event()
        self.closed = False

    async def __aiter__(self) -> AsyncIterator[bytes]:
        for i, chunk in enumerate(self.chunks):
            if i:
                self.waiting.set()
                await self.next.wait()
                self.next.clear()
            yield chunk
        self.waiting.set()
        await asyncio.Event().wait()

    async def step(self) -> None:
        await self.waiting.wait()
        self.waiting.clear()
        self.next.set()
        for _ in range(20):
            await asyncio.sleep(0)

    async def aclose(self) -> None:
        self.closed = True


async def test_once_output_came_after_a_finish_the_grace_no_longer_ends_the_body(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # A gateway that puts "stop" on every chunk: once output came after a "stop", no "stop" is
    # final, so a pause longer than the grace (a model writing a whole tool call in one piece)
    # does not end the answer; [DONE] does.
    clock = FakeClock(monkeypatch)
    call = {"index": 0, "id": "c1", "type": "function", "function": {"name": "f", "arguments": '{"a": 1}'}}
    chunks = [chat_chunk({"content": "Hello"}, "stop"), chat_chunk({"content": " world"}, "stop"),
              chat_chunk({"tool_calls": [call]}, "stop")]  # fmt: skip
    stream = PacedStream([*(chat_stream(c, done=False) for c in chunks), b"data: [DONE]\n\n"])
    client = httpx.AsyncClient(transport=httpx.MockTransport(
        lambda _: httpx.Response(200, headers={"content-type": "text/event-stream"}, stream=stream)))  # fmt: skip
    async with contextlib.aclosing(client):
        task = asyncio.create_task(collect(chat(end_grace=GRACE, include_usage=False)(client)))
        await stream.waiting.wait()
        await clock.advance(0.5 * GRACE)
        await stream.step()  # " world", with "stop" again: the first "stop" was not final
        await stream.waiting.wait()
        await clock.advance(1.25 * GRACE)
        assert not task.done()
        await stream.step()  # the tool call
        await stream.waiting.wait()
        await clock.advance(5 * GRACE)
        assert not task.done()
        await stream.step()  # [DONE]
        _, acc = await task  # the answer ends with it
    message = acc.message()
    assert (message.text, [(u.id, u.name, u.input) for u in message.tool_uses]) == ("Hello world", [("c1", "f", {"a": 1})])
    assert (acc.stop_reason, acc.ended) == ("tool_use", True)
    assert stream.closed
