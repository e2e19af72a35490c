"""What a gateway or proxy in front of the API sends instead of an event stream: a large body
that is no stream, a JSON error with status 200, an error body that stalls; an abort while the
model waits for one; and the ``User-Agent`` every request carries."""

from __future__ import annotations

import asyncio
import json
from typing import Any

import httpx
import pytest
from _models_support import API_KEY, MockServer, RecordingStream, collect

import agentloop
from agentloop import QueryEngine, TurnEnded
from agentloop._abort import AbortController
from agentloop._errors import AbortError, ProviderStatusError, StreamProtocolError
from agentloop.models import AnthropicModel, OpenAIChatModel, OpenAIResponsesModel
from agentloop.models._http import Connection, _errors

_MODELS = [AnthropicModel, OpenAIChatModel, OpenAIResponsesModel]


def _client(status: int, content_type: str, body: RecordingStream, **headers: str) -> httpx.AsyncClient:
    def handler(request: httpx.Request) -> httpx.Response:
        return httpx.Response(status, headers={"content-type": content_type, **headers}, stream=body)

    return httpx.AsyncClient(transport=httpx.MockTransport(handler))


_KIB64 = 64 << 10


# -- a 2xx body that is no event stream -------------------------------------------------------


@pytest.mark.parametrize("cls", _MODELS)
async def test_a_large_web_page_sent_with_200_is_not_retried_and_not_read_to_its_end(cls: type[Any]) -> None:
    # A proxy's 3 MiB error page: past the first MiB the body was read on, as if it were a stream
    # whose first event had not come yet, and at its end taken for a cut stream and asked for again.
    head = b"<!doctype html><html><head><title>Access denied by proxy</title></head><body>"
    chunks = [head, *[b"<p>" + b"x" * (_KIB64 - 8) + b"</p>\n"] * 48, b"</body></html>"]
    body = RecordingStream(chunks)
    async with _client(200, "text/html", body) as client:
        with pytest.raises(StreamProtocolError) as caught:
            await collect(cls("m", api_key=API_KEY, http_client=client))
    assert caught.value.retryable is False
    assert "web page" in caught.value.message and "Access denied by proxy" in caught.value.message
    assert body.sent <= 20 and body.closed  # about 1 MiB read, not 3


@pytest.mark.parametrize("content_type", ["application/json", "text/plain", ""])
async def test_a_large_body_that_is_no_event_stream_is_not_retried_and_not_read_to_its_end(content_type: str) -> None:
    # A whole response of 3 MiB (a server that ignored "stream": true), or a log dump.
    text = json.dumps({"id": "chatcmpl-1", "choices": [{"message": {"content": "y" * (3 << 20)}}]}).encode()
    body = RecordingStream([text[i : i + _KIB64] for i in range(0, len(text), _KIB64)])
    async with _client(200, content_type, body) as client:
        with pytest.raises(StreamProtocolError) as caught:
            await collect(OpenAIChatModel("m", api_key=API_KEY, http_client=client))
    assert caught.value.retryable is False
    assert "not an event stream" in caught.value.message
    assert body.sent <= 20 and body.closed


async def test_a_large_event_stream_whose_first_event_is_late_is_still_read() -> None:
    # A stream that says it is one is read on past the first MiB (a Responses stream's first
    # event repeats the instructions, which may be long).
    from _models_support import chat_chunk, chat_stream

    padding = b": " + b"p" * (_KIB64 - 3) + b"\n"
    chunks = [padding] * 20 + [chat_stream(chat_chunk({"content": "hi"}), chat_chunk({}, "stop"))]
    async with _client(200, "text/event-stream", RecordingStream(chunks)) as client:
        _, acc = await collect(OpenAIChatModel("m", api_key=API_KEY, http_client=client))
    assert acc.text() == "hi"


@pytest.mark.parametrize(
    ("error", "retryable"),
    [
        ({"type": "overloaded_error", "message": "Overloaded"}, True),
        ({"type": "rate_limit_error", "message": "slow down"}, True),
        ({"code": 429, "message": "too many requests"}, True),
        ({"code": "503", "message": "upstream unavailable"}, True),
        ({"code": "server_error", "message": "upstream failed"}, True),
        ({"type": "invalid_request_error", "message": "bad model"}, False),
        ({"code": 401, "message": "bad gateway token"}, False),
    ],
)
async def test_a_json_error_sent_with_200_is_retried_as_its_type_or_code_says(
    error: dict[str, Any], retryable: bool
) -> None:
    # A gateway that answers 200 with the upstream's error: an overload or a rate limit is as
    # transient there as in a 529 or an error event; it was never retried.
    raw = json.dumps({"error": error}).encode()
    async with _client(200, "application/json", RecordingStream([raw]), **{"retry-after": "2"}) as client:
        with pytest.raises(ProviderStatusError) as caught:
            await collect(OpenAIChatModel("m", api_key=API_KEY, http_client=client))
    assert caught.value.status == 200 and caught.value.message.endswith(error["message"])
    assert caught.value.retryable is retryable
    assert caught.value.retry_after == 2.0


async def test_a_json_error_sent_with_200_and_x_should_retry_false_is_not_retried() -> None:
    raw = json.dumps({"error": {"type": "overloaded_error", "message": "Overloaded"}}).encode()
    async with _client(200, "application/json", RecordingStream([raw]), **{"x-should-retry": "false"}) as client:
        with pytest.raises(ProviderStatusError) as caught:
            await collect(AnthropicModel("m", api_key=API_KEY, http_client=client))
    assert caught.value.retryable is False


async def test_a_short_body_that_is_no_stream_is_quoted_in_the_cut_stream_error() -> None:
    # An Envoy or load balancer message with status 200: still taken for a cut stream (retried),
    # but the error says what the body held instead of only "connection cut".
    said = b"upstream connect error or disconnect/reset before headers. reset reason: overflow"
    async with _client(200, "text/plain", RecordingStream([said])) as client:
        with pytest.raises(StreamProtocolError) as caught:
            await collect(OpenAIChatModel("m", api_key=API_KEY, http_client=client))
    assert caught.value.retryable is True
    assert "upstream connect error" in caught.value.message


# -- an error body that stalls -----------------------------------------------------------------


@pytest.mark.parametrize("cls", _MODELS)
async def test_an_error_body_that_stalls_is_read_no_longer_than_its_deadline(
    cls: type[Any], monkeypatch: pytest.MonkeyPatch
) -> None:
    # A 500 whose body stops after its first bytes: it was waited for until the read timeout
    # (600 s by default), and one that trickles a byte at a time, for ever.
    monkeypatch.setattr(_errors, "_ERROR_BODY_WAIT", 0.05)
    body = RecordingStream([b'{"error": {"message": "upstream ', b"fail"], hang=True)
    async with _client(500, "application/json", body) as client:
        with pytest.raises(ProviderStatusError) as caught:
            await collect(cls("m", api_key=API_KEY, http_client=client))
    assert caught.value.status == 500 and caught.value.retryable
    assert "upstream fail" in caught.value.message
    assert body.closed


@pytest.mark.parametrize("cls", _MODELS)
async def test_an_abort_reaches_a_stalled_error_body_at_once(cls: type[Any]) -> None:
    # Called directly (no engine to cancel the task), the abort was seen only once the body was read.
    body = RecordingStream([b'{"error": '], hang=True)
    controller = AbortController()
    async with _client(503, "application/json", body) as client:
        model = cls("m", api_key=API_KEY, http_client=client)
        reading = asyncio.ensure_future(collect(model, signal=controller.signal))
        await body.blocked.wait()
        controller.abort("cancel")
        async with asyncio.timeout(5):  # not a wait for the error body's deadline
            with pytest.raises(AbortError):
                await reading
    assert body.closed


async def test_an_abort_reaches_a_request_still_waiting_for_its_response() -> None:
    started = asyncio.Event()

    async def handler(request: httpx.Request) -> httpx.Response:
        started.set()
        await asyncio.Event().wait()  # a model that thinks for ever before its headers
        raise AssertionError

    controller = AbortController()
    async with httpx.AsyncClient(transport=httpx.MockTransport(handler)) as client:
        model = OpenAIChatModel("m", api_key=API_KEY, http_client=client)
        reading = asyncio.ensure_future(collect(model, signal=controller.signal))
        await started.wait()
        controller.abort("cancel")
        async with asyncio.timeout(5):
            with pytest.raises(AbortError, match="cancel"):
                await reading


async def test_an_interrupt_ends_a_run_whose_error_body_stalls() -> None:
    body = RecordingStream([b'{"error": '], hang=True)
    async with _client(500, "application/json", body) as client:
        engine = QueryEngine(OpenAIChatModel("m", api_key=API_KEY, http_client=client), policies=[])
        run = asyncio.ensure_future(_events(engine))
        await body.blocked.wait()
        engine.interrupt()
        async with asyncio.timeout(5):
            events = await run
    end = events[-1]
    assert isinstance(end, TurnEnded) and end.reason == "aborted_streaming"
    assert body.closed


async def _events(engine: QueryEngine) -> list[Any]:
    return [e async for e in engine.run("hi")]


# -- User-Agent --------------------------------------------------------------------------------




@pytest.mark.parametrize("cls", _MODELS)
async def test_every_request_says_it_comes_from_agentloop(cls: type[Any]) -> None:
    server = MockServer(b"")
    async with server.client() as client:
        with pytest.raises(StreamProtocolError):
            await collect(cls("m", api_key=API_KEY, http_client=client))
    agent = server.requests[0].headers["user-agent"]
    assert agent == f"agentloop/{agentloop.__version__} python-httpx/{httpx.__version__}"


async def test_the_models_own_client_says_it_too(monkeypatch: pytest.MonkeyPatch) -> None:
    seen: list[httpx.Request] = []

    def handler(request: httpx.Request) -> httpx.Response:
        seen.append(request)
        return httpx.Response(503)

    def new_client(self: Connection) -> httpx.AsyncClient:
        return httpx.AsyncClient(transport=httpx.MockTransport(handler))

    monkeypatch.setattr(Connection, "_new_client", new_client)
    model = OpenAIChatModel("m", api_key=API_KEY)
    with pytest.raises(ProviderStatusError):
        await collect(model)
    await model.aclose()
    assert seen[0].headers["user-agent"] == f"agentloop/{agentloop.__version__} python-httpx/{httpx.__version__}"


@pytest.mark.parametrize("name", ["User-Agent", "user-agent"])
async def test_a_user_agent_in_extra_headers_is_sent_alone(name: str) -> None:
    server = MockServer(b"")
    async with server.client() as client:
        model = OpenAIChatModel("m", api_key=API_KEY, http_client=client, extra_headers={name: "my-app/2.1"})
        with pytest.raises(StreamProtocolError):
            await collect(model)
    assert server.requests[0].headers.get_list("user-agent") == ["my-app/2.1"]


async def test_a_user_agent_on_the_hosts_client_is_kept() -> None:
    server = MockServer(b"")
    transport = httpx.MockTransport(server.handler)
    async with httpx.AsyncClient(transport=transport, headers={"User-Agent": "host-app/7"}) as client:
        with pytest.raises(StreamProtocolError):
            await collect(AnthropicModel("m", api_key=API_KEY, http_client=client))
    assert server.requests[0].headers.get_list("user-agent") == ["host-app/7"]


# -- a compressed stream -------------------------------------------------------------------------


async def test_a_compressed_stream_is_fed_to_the_decoder_in_bounded_pieces() -> None:
    # A server (or proxy) that compresses the stream though it was asked for identity: 48 KiB of
    # gzip held 48 MiB of blank lines, decoded and split at once into a list of 50 million lines
    # (about 490 MB at its peak) before the decoder's 64 MiB bound could act; then inflated whole
    # by one call (48 MiB at once) before it was cut into pieces.
    import gzip
    import tracemalloc

    from _models_support import chat_chunk, chat_stream

    plain = b"\n" * (48 << 20) + chat_stream(chat_chunk({"content": "hi"}), chat_chunk({}, "stop"))
    body = RecordingStream([gzip.compress(plain, 9)])
    async with _client(200, "text/event-stream", body, **{"content-encoding": "gzip"}) as client:
        tracemalloc.start()
        try:
            _, acc = await collect(OpenAIChatModel("m", api_key=API_KEY, http_client=client))
            peak = tracemalloc.get_traced_memory()[1]
        finally:
            tracemalloc.stop()
    assert acc.text() == "hi"
    assert peak < 8 << 20  # a few pieces of the decoded body at a time, never all of it


@pytest.mark.parametrize(
    ("cls", "own"),
    [(AnthropicModel, {"anthropic-version", "x-api-key"}), (OpenAIChatModel, {"authorization"}),
     (OpenAIResponsesModel, {"authorization"})],
)  # fmt: skip
async def test_a_request_carries_no_header_beyond_what_the_api_needs(cls: type[Any], own: set[str]) -> None:
    # Nothing about the machine, the Python running it or the program (no x-stainless-* telemetry).
    server = MockServer(b"")
    async with server.client() as client:
        with pytest.raises(StreamProtocolError):
            await collect(cls("m", api_key=API_KEY, http_client=client))
    http = {"accept", "accept-encoding", "connection", "content-length", "content-type", "host", "user-agent"}
    assert set(server.requests[0].headers.keys()) == http | own


@pytest.mark.parametrize("cls", _MODELS)
async def test_an_abort_reaches_a_stream_that_stalled_between_events_at_once(cls: type[Any]) -> None:
    # Called directly, the abort was checked only between events: a stream whose server went quiet
    # held the caller until the read timeout (600 s by default).
    from _models_support import chat_chunk, chat_stream, ev, sse

    first = {
        AnthropicModel: sse(("message_start", {"type": "message_start", "message": {"id": "msg_1", "usage": {}}})),
        OpenAIChatModel: chat_stream(chat_chunk({"content": "Hel"}), done=False),
        OpenAIResponsesModel: sse(ev("response.created", response={"id": "resp_1"})),
    }[cls]
    body = RecordingStream([first], hang=True)
    controller = AbortController()
    async with _client(200, "text/event-stream", body) as client:
        reading = asyncio.ensure_future(collect(cls("m", api_key=API_KEY, http_client=client), signal=controller.signal))
        await body.blocked.wait()
        controller.abort("send_now")
        async with asyncio.timeout(5):
            with pytest.raises(AbortError, match="send_now"):
                await reading
    assert body.closed
    assert reading.cancelling() == 0  # the cancel that ended the read was withdrawn
