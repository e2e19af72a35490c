"""Timeouts and connection failures of a model request: a server that keeps the connection
alive without answering, what a timeout error says, a failure no retry fixes."""

from __future__ import annotations

import ssl
from collections.abc import AsyncIterator, Callable
from typing import Any

import httpx
import pytest
from _models_support import API_KEY, chat_chunk, chat_stream, collect, sse

from agentloop import QueryEngine, Retrying, TurnEnded
from agentloop._errors import ProviderConnectionError, StreamProtocolError
from agentloop.models import AnthropicModel, OpenAIChatModel, OpenAIResponsesModel, _driver

#: What each API's stream sends before it stalls (one delta of output), and a keep-alive of it.
_STALLS: dict[str, tuple[type[Any], bytes, bytes]] = {
    "chat-comment": (OpenAIChatModel, chat_stream(chat_chunk({"content": "Hel"}), done=False), b": keep-alive\n\n"),
    "chat-openrouter": (
        OpenAIChatModel,
        chat_stream(chat_chunk({"content": "Hel"}), done=False),
        b": OPENROUTER PROCESSING\n\n",
    ),
    "anthropic-ping": (
        AnthropicModel,
        sse(
            ("message_start", {"type": "message_start", "message": {"id": "msg_1", "usage": {"input_tokens": 1}}}),
            ("content_block_start", {"type": "content_block_start", "index": 0, "content_block": {"type": "text", "text": ""}}),
            ("content_block_delta", {"type": "content_block_delta", "index": 0, "delta": {"type": "text_delta", "text": "Hel"}}),
        ),
        sse(("ping", {"type": "ping"})),
    ),
    "responses-comment": (
        OpenAIResponsesModel,
        sse(("response.created", {"type": "response.created", "response": {"id": "resp_1"}})),
        b":\n\n",
    ),
    # Events that carry nothing of the answer are keep-alives too: a proxy's own event, an event
    # of a name the mapper does not read, a chunk with no choice.
    "responses-keepalive-event": (
        OpenAIResponsesModel,
        sse(("response.created", {"type": "response.created", "response": {"id": "resp_1"}})),
        sse(("keepalive", {"type": "keepalive", "sequence_number": 7})),
    ),
    "anthropic-proxy-keepalive": (
        AnthropicModel,
        sse(("message_start", {"type": "message_start", "message": {"id": "msg_1", "usage": {"input_tokens": 1}}})),
        sse(("keepalive", "")),
    ),
    "chat-empty-chunk": (
        OpenAIChatModel,
        chat_stream(chat_chunk({"content": "Hel"}), done=False),
        chat_stream({"id": "chatcmpl-1", "object": "chat.completion.chunk", "choices": []}, done=False),
    ),
    "chat-keepalive-event": (
        OpenAIChatModel,
        chat_stream(chat_chunk({"content": "Hel"}), done=False),
        sse(("keepalive", "{}")),
    ),
}


class _Clock:
    """A fake monotonic clock that moves on by ``step`` seconds each time it is read."""

    def __init__(self, step: float) -> None:
        self.now = 0.0
        self.step = step

    def __call__(self) -> float:
        self.now += self.step
        return self.now


class _Stalling(httpx.AsyncByteStream):
    """``head``, then ``beat`` over and over (at most ``beats`` times: a stream that stalls
    forever would hang the test without the fix), recording whether it was closed."""

    def __init__(self, head: bytes, beat: bytes, beats: int) -> None:
        self.head, self.beat, self.beats = head, beat, beats
        self.sent = 0
        self.closed = False

    async def __aiter__(self) -> AsyncIterator[bytes]:
        yield self.head
        for _ in range(self.beats):
            self.sent += 1
            yield self.beat

    async def aclose(self) -> None:
        self.closed = True


def _serve(stream: Callable[[], _Stalling], streams: list[_Stalling]) -> httpx.MockTransport:
    def handler(request: httpx.Request) -> httpx.Response:
        streams.append(stream())
        return httpx.Response(200, headers={"content-type": "text/event-stream"}, stream=streams[-1])

    return httpx.MockTransport(handler)


@pytest.mark.parametrize("case", sorted(_STALLS))
async def test_a_server_that_only_sends_keep_alives_times_out_like_a_silent_one(
    case: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    # The read timeout waits for bytes, and a keep-alive is bytes: a stalled upstream behind a
    # gateway that sends a comment every few seconds (or an Anthropic ping) held the run forever.
    # The clock moves on 1 s per reading; the default read timeout is 600 s.
    monkeypatch.setattr(_driver, "_clock", _Clock(1.0))
    cls, head, beat = _STALLS[case]
    streams: list[_Stalling] = []
    async with httpx.AsyncClient(transport=_serve(lambda: _Stalling(head, beat, 5000), streams)) as client:
        model = cls("m", api_key=API_KEY, http_client=client)
        with pytest.raises(ProviderConnectionError) as caught:
            await collect(model)
    error = caught.value
    assert error.retryable
    assert "600 s" in error.message and "keep-alive" in error.message
    assert streams[0].closed and 590 <= streams[0].sent <= 610


async def test_keep_alives_between_events_that_keep_coming_are_not_a_stall(monkeypatch: pytest.MonkeyPatch) -> None:
    # A keep-alive between two deltas, 599 s after the last one: the answer goes on.
    monkeypatch.setattr(_driver, "_clock", _Clock(1.0))
    delta = chat_stream(chat_chunk({"content": "."}), done=False)
    chunks = [delta, *([b": keep-alive\n\n"] * 598 + [delta]) * 3, chat_stream(chat_chunk({}, "stop"))]

    def handler(request: httpx.Request) -> httpx.Response:
        return httpx.Response(200, headers={"content-type": "text/event-stream"}, stream=_Chunks(chunks))

    async with httpx.AsyncClient(transport=httpx.MockTransport(handler)) as client:
        _, acc = await collect(OpenAIChatModel("m", api_key=API_KEY, http_client=client))
    assert acc.text() == "...." and acc.stop_reason == "end_turn"


async def test_without_a_read_timeout_keep_alives_are_waited_for(monkeypatch: pytest.MonkeyPatch) -> None:
    # A host that turned the read timeout off (timeout=None) waits as long as the server does.
    monkeypatch.setattr(_driver, "_clock", _Clock(1000.0))
    cls, head, beat = _STALLS["chat-comment"]
    streams: list[_Stalling] = []
    transport = _serve(lambda: _Stalling(head, beat, 50), streams)
    async with httpx.AsyncClient(transport=transport, timeout=None) as client:
        with pytest.raises(StreamProtocolError):  # the body ended without [DONE]: not a stall
            await collect(cls("m", api_key=API_KEY, http_client=client))
    assert streams[0].sent == 50


async def test_a_read_timeout_the_host_chose_is_the_keep_alive_limit_too(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(_driver, "_clock", _Clock(1.0))
    cls, head, beat = _STALLS["chat-comment"]
    streams: list[_Stalling] = []
    transport = _serve(lambda: _Stalling(head, beat, 5000), streams)
    async with httpx.AsyncClient(transport=transport, timeout=httpx.Timeout(30.0, read=120.0)) as client:
        with pytest.raises(ProviderConnectionError, match="120 s"):
            await collect(cls("m", api_key=API_KEY, http_client=client))
    assert 110 <= streams[0].sent <= 130


class _Chunks(httpx.AsyncByteStream):
    def __init__(self, chunks: list[bytes]) -> None:
        self.chunks = chunks

    async def __aiter__(self) -> AsyncIterator[bytes]:
        for chunk in self.chunks:
            yield chunk


@pytest.mark.parametrize(
    ("kind", "said"),
    [
        (httpx.ConnectTimeout, "could not connect within 5 s (the connect timeout)"),
        (httpx.ReadTimeout, "no data from the server for 600 s (the read timeout)"),
        (httpx.WriteTimeout, "could not send the request within 600 s (the write timeout)"),
        (httpx.PoolTimeout, "no free connection in the client's pool within 600 s (the pool timeout)"),
    ],
)
async def test_a_timeout_says_which_one_ran_out_and_after_how_long(kind: type[httpx.TimeoutException], said: str) -> None:
    # It said "openai connection failed (ReadTimeout): ReadTimeout": not which wait, nor how long.
    def handler(request: httpx.Request) -> httpx.Response:
        raise kind("", request=request)

    async with httpx.AsyncClient(transport=httpx.MockTransport(handler)) as client:
        with pytest.raises(ProviderConnectionError) as caught:
            await collect(OpenAIChatModel("m", api_key=API_KEY, http_client=client))
    assert caught.value.message == f"openai request timed out ({kind.__name__}): {said}"
    assert caught.value.retryable


async def test_a_timeout_the_host_set_is_the_one_quoted() -> None:
    def handler(request: httpx.Request) -> httpx.Response:
        raise httpx.ReadTimeout("timed out", request=request)

    transport = httpx.MockTransport(handler)
    async with httpx.AsyncClient(transport=transport, timeout=httpx.Timeout(30.0, read=90.5)) as client:
        with pytest.raises(ProviderConnectionError) as caught:
            await collect(AnthropicModel("m", api_key=API_KEY, http_client=client))
    assert caught.value.message == (
        "anthropic request timed out (ReadTimeout): no data from the server for 90.5 s (the read timeout): timed out"
    )


async def test_a_timeout_during_the_stream_is_told_the_same_way() -> None:
    class _Stops(httpx.AsyncByteStream):
        async def __aiter__(self) -> AsyncIterator[bytes]:
            yield chat_stream(chat_chunk({"content": "Hel"}), done=False)
            raise httpx.ReadTimeout("")

    def handler(request: httpx.Request) -> httpx.Response:
        return httpx.Response(200, headers={"content-type": "text/event-stream"}, stream=_Stops())

    async with httpx.AsyncClient(transport=httpx.MockTransport(handler)) as client:
        with pytest.raises(ProviderConnectionError) as caught:
            await collect(OpenAIChatModel("m", api_key=API_KEY, http_client=client))
    assert caught.value.message == (
        "openai request timed out (ReadTimeout): no data from the server for 600 s (the read timeout)"
    )


async def test_a_certificate_that_fails_verification_is_not_retried() -> None:
    # A corporate proxy that re-signs TLS, a self-signed local server: every new attempt fails the
    # same way, and the three retries only delayed the error.
    calls: list[httpx.Request] = []

    def handler(request: httpx.Request) -> httpx.Response:
        calls.append(request)
        cause = ssl.SSLCertVerificationError(1, "[SSL: CERTIFICATE_VERIFY_FAILED] certificate verify failed: self-signed")
        raise httpx.ConnectError(str(cause), request=request) from cause

    async with httpx.AsyncClient(transport=httpx.MockTransport(handler)) as client:
        engine = QueryEngine(OpenAIChatModel("m", api_key=API_KEY, http_client=client), policies=[], retry_base_delay=0.001)
        events = [e async for e in engine.run("hi")]
    assert len(calls) == 1 and not [e for e in events if isinstance(e, Retrying)]
    end = events[-1]
    assert isinstance(end, TurnEnded) and end.reason == "model_error"
    assert "CERTIFICATE_VERIFY_FAILED" in (end.error or "")
