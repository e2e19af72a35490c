"""Connection side: retry decisions, status errors, connection errors, key hygiene."""

from __future__ import annotations

import asyncio
import email.utils
import json
import pickle
import re
import traceback

import httpcore
import httpx
import pytest
from _models_support import API_KEY, FakeNetwork, MockServer, chat_chunk, chat_stream, collect, request, sse
from hypothesis import given
from hypothesis import strategies as st

import agentloop.models._http._client
from agentloop import QueryEngine, Retrying, TurnEnded
from agentloop._errors import (
    ModelError,
    PromptTooLongError,
    ProviderConnectionError,
    ProviderStatusError,
    StreamProtocolError,
)
from agentloop._messages import Message, ToolResultBlock, ToolUseBlock
from agentloop.models import AnthropicModel, OpenAIChatModel, OpenAIResponsesModel, parse_retry
from agentloop.models._driver import excerpt
from agentloop.models._http import Connection, Secret, credential_parts, status_error

# -- parse_retry ----------------------------------------------------------------


@pytest.mark.parametrize("status", [408, 409, 429, 500, 502, 503, 504, 529])
def test_retryable_statuses(status: int) -> None:
    assert parse_retry(status, {}) == (True, None)


@pytest.mark.parametrize("status", [520, 521, 522, 523, 524])
async def test_cloudflare_transient_statuses_are_retried(status: int) -> None:
    # Many OpenAI-compatible hosts sit behind Cloudflare; "524: A timeout occurred" is transient
    # (the official SDKs retry every 5xx).
    page = f"<html><title>{status}: A timeout occurred</title></html>".encode()
    server = MockServer(page, status=status, headers={"content-type": "text/html"})
    async with server.client() as client:
        model = OpenAIChatModel("m", api_key=API_KEY, base_url="https://llm.example/v1", http_client=client)
        engine = QueryEngine(model, policies=[], retry_budget=2, retry_base_delay=0.001)
        events = [e async for e in engine.run("hi")]
    assert len([e for e in events if isinstance(e, Retrying)]) == 2 and len(server.requests) == 3
    end = events[-1]
    assert isinstance(end, TurnEnded) and end.reason == "model_error" and f"HTTP {status}" in (end.error or "")


@pytest.mark.parametrize("status", [400, 401, 403, 404, 413, 422, 501])
def test_non_retryable_statuses(status: int) -> None:
    assert parse_retry(status, {}) == (False, None)


def test_x_should_retry_decides_outright() -> None:
    assert parse_retry(400, {"x-should-retry": "true"})[0] is True
    assert parse_retry(529, {"x-should-retry": "false"})[0] is False


def test_retry_after_ms_wins() -> None:
    assert parse_retry(429, {"retry-after-ms": "1500", "retry-after": "30"}) == (True, 1.5)


def test_retry_after_seconds_and_float() -> None:
    assert parse_retry(429, {"retry-after": "7"})[1] == 7.0
    assert parse_retry(429, {"retry-after": "0.25"})[1] == 0.25


def test_retry_after_http_date() -> None:
    now = 1_700_000_000.0
    date = email.utils.formatdate(now + 12, usegmt=True)
    assert parse_retry(503, {"retry-after": date}, now=now)[1] == pytest.approx(12.0)
    past = email.utils.formatdate(now - 60, usegmt=True)
    assert parse_retry(503, {"retry-after": past}, now=now)[1] == 0.0


@pytest.mark.parametrize("value", ["soon", "-3", "nan", "inf", ""])
def test_bad_retry_after_is_ignored(value: str) -> None:
    assert parse_retry(429, {"retry-after": value})[1] is None
    assert parse_retry(429, {"retry-after-ms": value, "retry-after": "2"})[1] == 2.0


_RATE_LIMITED = b'{"type":"error","error":{"type":"rate_limit_error","message":"slow down"}}'


@pytest.mark.parametrize(
    "headers",
    [
        {"retry-after": "0"},
        {"retry-after-ms": "0"},
        {"retry-after": "-5"},
        {"retry-after": email.utils.formatdate(1_000_000_000, usegmt=True)},  # long past
    ],
    ids=["zero", "zero-ms", "negative", "past-date"],
)
async def test_a_zero_or_past_retry_after_still_waits_the_normal_back_off(headers: dict[str, str]) -> None:
    # Retried at once, a server hammering 429 with "retry-after: 0" spends the whole budget in microseconds.
    server = MockServer(_RATE_LIMITED, status=429, headers={"content-type": "application/json", **headers})
    async with server.client() as client:
        model = AnthropicModel("m", api_key=API_KEY, http_client=client)
        engine = QueryEngine(model, policies=[], retry_budget=3, retry_base_delay=0.002, retry_max_delay=1.0)
        events = [e async for e in engine.run("hi")]
    delays = [e.delay for e in events if isinstance(e, Retrying)]
    assert len(delays) == 3 and len(server.requests) == 4
    floors = [0.002 * 2**n * 0.75 for n in range(3)]  # the jittered exponential back-off
    assert all(d >= f for d, f in zip(delays, floors, strict=True)), delays
    end = events[-1]
    assert isinstance(end, TurnEnded) and end.reason == "model_error"


async def test_a_retry_after_longer_than_a_minute_is_not_waited_for() -> None:
    # A quota that resets tomorrow: the turn ends now, saying why, instead of sleeping (or
    # retrying after a capped wait that cannot succeed).
    server = MockServer(
        _RATE_LIMITED, status=429, headers={"content-type": "application/json", "retry-after": "86400"}
    )
    async with server.client() as client:
        engine = QueryEngine(AnthropicModel("m", api_key=API_KEY, http_client=client), policies=[])
        events = []
        async for event in engine.run("hi"):
            events.append(event)
            if isinstance(event, Retrying):
                engine.interrupt()  # the old behaviour: stop the wait rather than sleep through it
    assert not [e for e in events if isinstance(e, Retrying)]
    end = events[-1]
    assert isinstance(end, TurnEnded) and end.reason == "model_error"
    assert "86400 s" in (end.error or "") and "slow down" in (end.error or "")
    assert len(server.requests) == 1


async def test_a_retry_after_within_a_minute_is_honoured() -> None:
    server = MockServer(_RATE_LIMITED, status=429, headers={"content-type": "application/json", "retry-after": "30"})
    async with server.client() as client:
        engine = QueryEngine(AnthropicModel("m", api_key=API_KEY, http_client=client), policies=[])
        events = []
        async for event in engine.run("hi"):
            events.append(event)
            if isinstance(event, Retrying):
                engine.interrupt()  # the sleep is cut: nothing waits 30 s
    assert [e.delay for e in events if isinstance(e, Retrying)] == [30.0]


# -- status errors ----------------------------------------------------------------


def test_anthropic_prompt_too_long_400() -> None:
    body = b'{"type":"error","error":{"type":"invalid_request_error","message":"prompt is too long: 210000 tokens > 200000 maximum"}}'
    err = status_error(
        "anthropic", 400, {"request-id": "req_1"}, body, request_id_header="request-id", secret=None
    )
    assert isinstance(err, PromptTooLongError)
    assert err.retryable is False
    assert err.request_id == "req_1"
    assert err.error_type == "invalid_request_error"


def test_openai_context_length_exceeded_400() -> None:
    body = b'{"error":{"message":"This model\'s maximum context length is 128000 tokens.","type":"invalid_request_error","param":"messages","code":"context_length_exceeded"}}'
    err = status_error("openai", 400, {}, body, request_id_header="x-request-id", secret=None)
    assert isinstance(err, PromptTooLongError)
    assert err.retryable is False and err.error_type == "invalid_request_error"
    assert "maximum context length is 128000 tokens" in str(err)


def test_anthropic_529_overloaded_with_headers() -> None:
    body = b'{"type":"error","error":{"type":"overloaded_error","message":"Overloaded"}}'
    headers = {"x-should-retry": "true", "request-id": "req_01RCc7MbLyQNtGKzBTv8VCep", "retry-after": "3"}
    err = status_error("anthropic", 529, headers, body, request_id_header="request-id", secret=None)
    assert type(err) is ProviderStatusError
    assert (err.status, err.error_type, err.retryable, err.retry_after) == (
        529,
        "overloaded_error",
        True,
        3.0,
    )
    assert err.request_id == "req_01RCc7MbLyQNtGKzBTv8VCep"
    assert "Overloaded" in str(err)


def test_openai_400_pairing_error_keeps_body_and_request_id() -> None:
    body = (
        b'{"error":{"message":"An assistant message with \'tool_calls\' must be followed by tool messages'
        b' responding to each \'tool_call_id\'.","type":"invalid_request_error","param":"messages.[57].role","code":null}}'
    )
    err = status_error(
        "openai", 400, {"x-request-id": "req_x"}, body, request_id_header="x-request-id", secret=None
    )
    assert type(err) is ProviderStatusError
    assert err.retryable is False
    assert err.body["error"]["param"] == "messages.[57].role"
    assert err.request_id == "req_x"


def test_non_json_error_body() -> None:
    err = status_error(
        "openai", 502, {}, b"<html>Bad gateway</html>", request_id_header="x-request-id", secret=None
    )
    assert err.retryable is True
    assert "Bad gateway" in str(err)


# -- through the models ----------------------------------------------------------


async def test_http_status_error_through_model() -> None:
    server = MockServer(
        b'{"type":"error","error":{"type":"rate_limit_error","message":"slow down"}}',
        status=429,
        headers={"content-type": "application/json", "retry-after": "2", "request-id": "req_9"},
    )
    async with server.client() as client:
        with pytest.raises(ProviderStatusError) as info:
            await collect(AnthropicModel("m", api_key=API_KEY, http_client=client))
    err = info.value
    assert (err.status, err.retryable, err.retry_after, err.request_id) == (429, True, 2.0, "req_9")
    assert server.streams[0].closed


async def test_connection_error_is_retryable() -> None:
    def fail(request: httpx.Request) -> httpx.Response:
        raise httpx.ConnectError("connection refused", request=request)

    async with httpx.AsyncClient(transport=httpx.MockTransport(fail)) as client:
        with pytest.raises(ProviderConnectionError) as info:
            await collect(OpenAIChatModel("m", api_key=API_KEY, http_client=client))
    assert info.value.retryable is True
    assert "connection refused" in str(info.value)


async def test_read_error_mid_body_is_a_retryable_connection_error() -> None:
    class Broken(httpx.AsyncByteStream):
        async def __aiter__(self):  # type: ignore[no-untyped-def]
            yield b'event: message_start\ndata: {"type":"message_start","message":{"id":"x"}}\n\n'
            raise httpx.ReadError("peer reset")

    def handler(request: httpx.Request) -> httpx.Response:
        return httpx.Response(200, stream=Broken())

    async with httpx.AsyncClient(transport=httpx.MockTransport(handler)) as client:
        with pytest.raises(ProviderConnectionError) as info:
            await collect(AnthropicModel("m", api_key=API_KEY, http_client=client))
    assert info.value.retryable is True


async def test_a_body_that_cannot_be_decoded_is_a_retryable_connection_error() -> None:
    # A proxy that gzips the stream and corrupts it: httpx raises DecodingError, which
    # is not a TransportError; it must not pass for a bug in the model implementation.
    def handler(request: httpx.Request) -> httpx.Response:
        return httpx.Response(200, headers={"content-encoding": "gzip"}, content=b"not gzip " + API_KEY.encode())

    async with httpx.AsyncClient(transport=httpx.MockTransport(handler)) as client:
        with pytest.raises(ProviderConnectionError) as info:
            await collect(AnthropicModel("m", api_key=API_KEY, http_client=client))
    assert info.value.retryable is True
    assert "could not be decoded" in str(info.value)
    assert API_KEY not in str(info.value)


async def test_a_redirect_loop_is_a_connection_error_that_is_not_retried() -> None:
    def handler(request: httpx.Request) -> httpx.Response:
        return httpx.Response(307, headers={"location": str(request.url)})

    transport = httpx.MockTransport(handler)
    async with httpx.AsyncClient(transport=transport, follow_redirects=True, max_redirects=3) as client:
        with pytest.raises(ProviderConnectionError) as info:
            await collect(OpenAIChatModel("m", api_key=API_KEY, http_client=client))
    assert info.value.retryable is False
    assert "TooManyRedirects" in str(info.value)


@pytest.mark.parametrize("cls", [AnthropicModel, OpenAIChatModel, OpenAIResponsesModel])
@pytest.mark.parametrize("value", [float("nan"), float("inf"), object()], ids=["nan", "inf", "object"])
async def test_a_value_json_cannot_represent_is_a_clear_error_and_nothing_is_sent(cls: type, value: object) -> None:
    # Only a host can put one there (the library refuses NaN in a model's tool input):
    # Python's json would write NaN, which no provider parses, so the request is refused here.
    history = [
        Message.user("q"),
        Message(role="assistant", content=[ToolUseBlock(id="t1", name="f", input={"x": value})]),
        Message(role="user", content=[ToolResultBlock(tool_use_id="t1", content="r")]),
    ]
    server = MockServer(b"")
    async with server.client() as client:
        with pytest.raises(ModelError, match="cannot be encoded as JSON") as info:
            await collect(cls("m", api_key=API_KEY, http_client=client), request(*history))
    assert info.value.retryable is False
    assert server.streams == []  # nothing was sent


@pytest.mark.parametrize("cls", [AnthropicModel, OpenAIChatModel, OpenAIResponsesModel])
async def test_api_key_never_leaks_from_401(cls: type) -> None:
    echo = (
        '{"error":{"type":"authentication_error","message":"invalid x-api-key ' + API_KEY + '",'
        '"headers":{"x-api-key":"' + API_KEY + '","authorization":"Bearer ' + API_KEY + '"}}}'
    ).encode()
    server = MockServer(echo, status=401, headers={"content-type": "application/json"})
    async with server.client() as client:
        model = cls("m", api_key=API_KEY, http_client=client)
        with pytest.raises(ProviderStatusError) as info:
            await collect(model)
    err = info.value
    assert err.retryable is False
    for text in (str(err), repr(err), str(err.body), repr(err.body), repr(model), str(model)):
        assert API_KEY not in text
    assert "[REDACTED]" in str(err)
    pickled = pickle.dumps(err)  # a worker handing the error back to its parent
    assert API_KEY.encode() not in pickled
    clone = pickle.loads(pickled)
    assert (str(clone), clone.status, clone.body) == (str(err), 401, err.body)


@pytest.mark.parametrize("cls", [AnthropicModel, OpenAIChatModel, OpenAIResponsesModel])
@pytest.mark.parametrize(
    "base_url",
    [
        "https://alice:s3cr3t-PASS@proxy.test/v1",
        "https://tok-s3cr3t-PASS@proxy.test/v1?api-version=1",
        # Characters httpx percent-encodes in its user info: the password as written was shown.
        "https://alice:s3cr3t^{PASS}|`@proxy.test/v1",
        "https://alice:s3cr3t-pässwort@proxy.test/v1",
        "https://alice:s3cr3t%5E-PASS@proxy.test:8443/v1",
    ],
)
def test_credentials_in_base_url_are_not_in_the_repr(cls: type, base_url: str) -> None:
    # A proxy behind basic auth, given as https://user:password@host: httpx sends it, the repr hides it.
    model = cls("m", api_key=API_KEY, base_url=base_url)
    for text in (repr(model), str(model)):
        assert "s3cr3t" not in text and API_KEY not in text
        assert re.search(r"//\[REDACTED\]@proxy\.test(:8443)?/v1", text)
    assert model._conn.base_url == base_url  # what is sent is untouched


def test_secret_repr_hides_key() -> None:
    s = Secret(API_KEY)
    assert API_KEY not in repr(s)
    assert API_KEY not in str(s)
    assert s.reveal() == API_KEY


@pytest.mark.parametrize(
    ("cls", "env"),
    [
        (AnthropicModel, "ANTHROPIC_API_KEY"),
        (OpenAIChatModel, "OPENAI_API_KEY"),
        (OpenAIResponsesModel, "OPENAI_API_KEY"),
    ],
)
async def test_missing_key_is_a_clear_error_at_request_time(
    cls: type, env: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv(env, raising=False)
    server = MockServer(b"")
    async with server.client() as client:
        model = cls("m", http_client=client)  # constructing is fine
        with pytest.raises(ModelError, match=env):
            await collect(model)
    assert server.requests == []


async def test_key_from_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("ANTHROPIC_API_KEY", API_KEY)
    server = MockServer(b"")
    async with server.client() as client:
        with pytest.raises(ModelError):
            await collect(AnthropicModel("m", http_client=client))
    assert server.requests[0].headers["x-api-key"] == API_KEY


async def test_owned_client_is_created_and_closed() -> None:
    model = OpenAIChatModel("m", api_key=API_KEY)
    client = model._conn.client
    assert not client.is_closed
    await model.aclose()
    assert client.is_closed


# -- the hot-path JSON parser --------------------------------------------------------


@pytest.mark.parametrize("text", ['{"a": 1}', ' {"a": 1}', '{"a": 1}  ', "[1, 2]", '"s"', "3", "null"])
def test_loads_matches_json(text: str) -> None:
    import json

    from agentloop.models._driver import loads

    assert loads(text) == json.loads(text)


@pytest.mark.parametrize("text", ["", "{", '{"a": 1} x', "{'a': 1}", "[DONE]", "  "])
def test_loads_rejects_what_json_rejects(text: str) -> None:
    from agentloop.models._driver import loads

    with pytest.raises(ValueError):
        loads(text)


@pytest.mark.parametrize("text", ["[" * 100_000, "[" * 5000 + "]" * 5000, '{"a": ' * 3000 + "1" + "}" * 3000,
                                  "[" * 700 + '"\\ud800"' + "]" * 700])  # fmt: skip
def test_loads_raises_value_error_for_json_nested_too_deeply(text: str) -> None:
    from agentloop.models._driver import loads

    with pytest.raises(ValueError, match="nested too deeply"):
        loads(text)


def test_loads_has_one_depth_limit_on_every_python() -> None:
    from agentloop._jsondepth import MAX_JSON_DEPTH
    from agentloop.models._driver import loads

    deepest = "[" * MAX_JSON_DEPTH + "]" * MAX_JSON_DEPTH
    assert str(loads(deepest)).startswith("[[[")
    with pytest.raises(ValueError, match="nested too deeply"):
        loads("[" + deepest + "]")


async def test_a_chunk_nested_too_deeply_is_a_retryable_protocol_error() -> None:
    chunk = '{"id": "c", "choices": [], "junk": ' + "[" * 5000 + "]" * 5000 + "}"
    server = MockServer(f"data: {chunk}\n\ndata: [DONE]\n\n".encode())
    async with server.client() as client:
        with pytest.raises(StreamProtocolError, match="nested too deeply") as info:
            await collect(OpenAIChatModel("m", api_key=API_KEY, http_client=client))
    assert info.value.retryable is True


# -- context overflow, whatever the server calls it --------------------------------------

CONTEXT_OVERFLOW_BODIES = {
    # The Responses API: the code says it, the message does not use the Chat wording.
    "openai_responses": b'{"error":{"message":"Your input exceeds the context window of this model. Please adjust'
    b' your input and try again.","type":"invalid_request_error","param":"input","code":"context_length_exceeded"}}',
    # llama.cpp: only the type says it.
    "llama_cpp": b'{"error":{"code":400,"message":"request (4476 tokens) exceeds the available context size'
    b' (4096 tokens)","type":"exceed_context_size_error","n_prompt_tokens":4476,"n_ctx":4096}}',
    "xai": b'{"code":"Client specified an invalid argument","error":"This model\'s maximum prompt length is 131072'
    b' but the request contains 136973 tokens."}',
    # Anthropic, when the input fits but input + max_tokens does not.
    "anthropic_with_max_tokens": b'{"type":"error","error":{"type":"invalid_request_error","message":"input length'
    b' and `max_tokens` exceed context limit: 178959 + 64000 > 200000, decrease input length or `max_tokens` and'
    b' try again"},"request_id":"req_011CUB2XUHWkFnQzxcKBbjpF"}',
    # Gemini (its OpenAI endpoint wraps the error in a list).
    "gemini": b'[{"error":{"code":400,"message":"The input token count (1200293) exceeds the maximum number of'
    b' tokens allowed (1048576).","status":"INVALID_ARGUMENT"}}]',
}


@pytest.mark.parametrize("server", sorted(CONTEXT_OVERFLOW_BODIES))
def test_a_context_overflow_400_is_prompt_too_long_whatever_field_says_it(server: str) -> None:
    body = CONTEXT_OVERFLOW_BODIES[server]
    err = status_error("openai", 400, {}, body, request_id_header="x-request-id", secret=None)
    assert isinstance(err, PromptTooLongError)
    assert err.retryable is False


def test_an_ordinary_400_is_not_prompt_too_long() -> None:
    body = b'{"error":{"message":"Invalid value for tool_choice","type":"invalid_request_error","code":"invalid_value"}}'
    err = status_error("openai", 400, {}, body, request_id_header="x-request-id", secret=None)
    assert type(err) is ProviderStatusError


async def test_a_context_overflow_400_ends_the_run_with_prompt_too_long() -> None:
    server = MockServer(
        CONTEXT_OVERFLOW_BODIES["openai_responses"], status=400, headers={"content-type": "application/json"}
    )
    async with server.client() as client:
        engine = QueryEngine(OpenAIResponsesModel("m", api_key=API_KEY, http_client=client), policies=[])
        events = [e async for e in engine.run("hi")]
    end = events[-1]
    assert isinstance(end, TurnEnded)
    assert end.reason == "prompt_too_long"
    assert "exceeds the context window" in (end.error or "")
    assert len(server.requests) == 1  # not retried


# -- a model used by one asyncio.run after another ------------------------------------------


class _LoopBoundSocket(httpcore.AsyncNetworkStream):
    """A keep-alive connection that, like a real socket's transport, works only in the event
    loop that opened it, and answers each request with ``body``."""

    def __init__(self, body: bytes) -> None:
        self.loop = asyncio.get_running_loop()
        self.body = body
        self.pending = b""

    def _check(self) -> None:
        if asyncio.get_running_loop() is not self.loop:
            raise RuntimeError("Event loop is closed")

    async def read(self, max_bytes: int, timeout: float | None = None) -> bytes:  # noqa: ASYNC109
        self._check()
        out, self.pending = self.pending[:max_bytes], self.pending[max_bytes:]
        return out

    async def write(self, buffer: bytes, timeout: float | None = None) -> None:  # noqa: ASYNC109
        self._check()
        if buffer.startswith(b"POST "):
            head = f"HTTP/1.1 200 OK\r\ncontent-type: text/event-stream\r\ncontent-length: {len(self.body)}\r\n\r\n"
            self.pending += head.encode() + self.body

    async def aclose(self) -> None:
        self._check()


class _LoopBoundNetwork(FakeNetwork):
    def __init__(self, body: bytes) -> None:
        self.body = body
        self.opened = 0

    def connect(self) -> _LoopBoundSocket:
        self.opened += 1
        return _LoopBoundSocket(self.body)


def _model_over(network: _LoopBoundNetwork, monkeypatch: pytest.MonkeyPatch) -> OpenAIChatModel:
    """A model whose own HTTP clients (made by the model, one per event loop) use ``network``."""

    def new_client(conn: object) -> httpx.AsyncClient:
        transport = httpx.AsyncHTTPTransport()
        transport._pool = httpcore.AsyncConnectionPool(network_backend=network)
        return httpx.AsyncClient(transport=transport)

    monkeypatch.setattr(Connection, "_new_client", new_client)
    return OpenAIChatModel("m", api_key=API_KEY, base_url="http://llm.test/v1")


def test_a_model_serves_one_asyncio_run_after_another(monkeypatch: pytest.MonkeyPatch) -> None:
    # A script, a notebook or a test suite calling asyncio.run per question with one model:
    # the pooled connection of the first run belongs to its closed loop.
    network = _LoopBoundNetwork(chat_stream(chat_chunk({"content": "hi"}, finish="stop")))

    model = _model_over(network, monkeypatch)

    async def ask(close: bool = False) -> TurnEnded:
        events = [e async for e in QueryEngine(model, policies=[], retry_budget=0).run("hi")]
        if close:
            await model.aclose()
        assert isinstance(events[-1], TurnEnded)
        return events[-1]

    ends = [asyncio.run(ask()), asyncio.run(ask()), asyncio.run(ask(close=True))]
    assert [(e.reason, e.error) for e in ends] == [("completed", None)] * 3
    assert network.opened == 3


def test_closing_a_model_after_its_loop_has_ended_does_not_raise(monkeypatch: pytest.MonkeyPatch) -> None:
    network = _LoopBoundNetwork(chat_stream(chat_chunk({"content": "hi"}, finish="stop")))

    model = _model_over(network, monkeypatch)

    async def ask() -> list[str | None]:
        return [e.reason async for e in QueryEngine(model, policies=[], retry_budget=0).run("hi") if isinstance(e, TurnEnded)]

    assert asyncio.run(ask()) == ["completed"]
    asyncio.run(model.aclose())
    assert network.opened == 1


# -- base_url and extra_headers are checked when the model is made ------------------------

_MODELS = [AnthropicModel, OpenAIChatModel, OpenAIResponsesModel]


@pytest.mark.parametrize("cls", _MODELS)
@pytest.mark.parametrize(
    "base_url",
    [
        "htps://api.example.com/v1",
        "api.example.com/v1",
        "localhost:8000/v1",
        "https://api example.com/v1",
        "https://api.example.com/v1\n",
        " https://api.example.com/v1",
        "https:///v1",
        "http://[::1/v1",
        "http://localhost:99999/v1",
        "ftp://user:sk-live-PASSWORD@api.example.com/v1",
        # A fragment: the request path went into it, and every request to the base URL itself.
        "https://api.example.com/v1#",
        "https://user:sk-live-PASSWORD@api.example.com/v1#docs",
    ],
)
def test_a_malformed_base_url_is_refused_when_the_model_is_made(cls: type, base_url: str) -> None:
    with pytest.raises(ValueError, match="base_url") as info:
        cls("m", api_key=API_KEY, base_url=base_url)
    assert "PASSWORD" not in str(info.value) and API_KEY not in str(info.value)


@pytest.mark.parametrize("cls", _MODELS)
@pytest.mark.parametrize(
    "base_url",
    [
        "https://api.example.com/v1/",
        "http://localhost:8000/v1",
        "http://[::1]:8000/v1",
        "https://r.openai.azure.com/openai/deployments/d?api-version=2024-10-21",
        "HTTPS://API.EXAMPLE.COM/v1",
    ],
)
def test_a_well_formed_base_url_is_accepted(cls: type, base_url: str) -> None:
    assert cls("m", api_key=API_KEY, base_url=base_url)._conn.base_url == base_url.replace("/v1/", "/v1")


@pytest.mark.parametrize("cls", _MODELS)
@pytest.mark.parametrize(
    "headers",
    [
        {"x-user": "J\u00f6rg"},
        {"api-key": "sk-live-PASSWORD\n"},
        {"api-key": "sk-live-PASSWORD\r\nx-evil: 1"},
        {"x-trace": " sk-live-PASSWORD"},
        {"x user": "a"},
        {"x-user:": "a"},
        {"": "a"},
        {"x-n": 3},
    ],
)
def test_bad_extra_headers_are_refused_when_the_model_is_made(cls: type, headers: dict[str, object]) -> None:
    with pytest.raises(ValueError, match="extra_headers") as info:
        cls("m", api_key=API_KEY, base_url="http://localhost:8000/v1", extra_headers=headers)
    assert "PASSWORD" not in str(info.value)


@pytest.mark.parametrize("cls", _MODELS)
async def test_a_header_broken_after_construction_ends_with_a_clear_model_error(cls: type) -> None:
    server = MockServer(b"")
    async with server.client() as client:
        model = cls("m", api_key=API_KEY, http_client=client, extra_headers={"api-key": "ok"})
        model.extra_headers["api-key"] = "sk-live-PASSW\u00d6RD"
        end = (await collect_engine(QueryEngine(model, policies=[])))[-1]
    assert isinstance(end, TurnEnded) and end.reason == "model_error"
    assert "could not be built" in (end.error or "") and "extra headers" in (end.error or "")
    assert "PASSW" not in (end.error or "")
    assert not server.requests


@pytest.mark.parametrize("cls", _MODELS)
async def test_a_closed_http_client_ends_with_a_clear_model_error(cls: type) -> None:
    server = MockServer(b"")
    client = server.client()
    await client.aclose()
    model = cls("m", api_key=API_KEY, http_client=client)
    end = (await collect_engine(QueryEngine(model, policies=[], retry_base_delay=0.001)))[-1]
    assert isinstance(end, TurnEnded) and end.reason == "model_error"
    assert "http_client given to the model is closed" in (end.error or "")
    assert "the model raised" not in (end.error or "")


async def collect_engine(engine: QueryEngine) -> list[object]:
    return [e async for e in engine.run("hi")]


# -- an API key a header cannot carry -----------------------------------------------------


class _Socket(httpcore.AsyncNetworkStream):
    """A fake socket that records what was written and answers nothing."""

    def __init__(self, written: list[bytes]) -> None:
        self.written = written

    async def read(self, max_bytes: int, timeout: float | None = None) -> bytes:  # noqa: ASYNC109
        return b""

    async def write(self, buffer: bytes, timeout: float | None = None) -> None:  # noqa: ASYNC109
        self.written.append(buffer)

    async def aclose(self) -> None:
        return None


class _Network(FakeNetwork):
    def __init__(self) -> None:
        self.written: list[bytes] = []

    def connect(self) -> _Socket:
        return _Socket(self.written)


@pytest.mark.parametrize("cls", [AnthropicModel, OpenAIChatModel, OpenAIResponsesModel])
@pytest.mark.parametrize(
    "key",
    [API_KEY + "\n", API_KEY + "\r\n", " " + API_KEY, API_KEY + "\x00", API_KEY + "\u200b"],
    ids=["newline", "crlf", "leading-space", "nul", "zero-width-space"],
)
async def test_a_key_a_header_cannot_carry_is_a_clear_error_that_never_shows_it(cls: type, key: str) -> None:
    # A key read from a file keeps its newline: the HTTP layer refuses the header and quotes
    # it, escaped ("...\\n'"), so scrubbing the key out of the message would miss it.
    network = _Network()
    transport = httpx.AsyncHTTPTransport()
    transport._pool = httpcore.AsyncConnectionPool(network_backend=network)
    async with httpx.AsyncClient(transport=transport) as client:
        model = cls("m", api_key=key, base_url="http://llm.test", http_client=client)
        with pytest.raises(ModelError, match="API key holds a character") as info:
            await collect(model)
    err = info.value
    assert err.retryable is False
    chain = [err, err.__cause__, err.__context__]
    assert not any(API_KEY in str(e) or API_KEY in repr(e) for e in chain if e is not None)
    assert network.written == []  # nothing was sent


async def test_a_key_with_inner_punctuation_is_sent_as_is() -> None:
    server = MockServer(b"")
    key = "sk-proj_AbC.123~x+y/z="
    async with server.client() as client:
        with pytest.raises(ModelError, match="without data: \\[DONE\\]"):
            await collect(OpenAIChatModel("m", api_key=key, http_client=client))
    assert server.requests[0].headers["authorization"] == f"Bearer {key}"


# -- a 200 that is a JSON document, not an event stream ---------------------------------------


@pytest.mark.parametrize("cls", [AnthropicModel, OpenAIChatModel, OpenAIResponsesModel])
@pytest.mark.parametrize("chunked", [False, True])
async def test_an_error_body_sent_with_200_is_the_servers_error_not_a_cut_stream(cls: type, chunked: bool) -> None:
    # Gateways that answer a streamed request with a JSON error and status 200: the
    # server's message must reach the user, and the same request is not sent again.
    body = b'{"error":{"message":"model \\"m\\" is not available for your plan","type":"invalid_request_error"}}'
    server = MockServer([body[i : i + 1] for i in range(len(body))] if chunked else body,
                        headers={"content-type": "application/json", "x-request-id": "r1", "request-id": "r1"})  # fmt: skip
    async with server.client() as client:
        with pytest.raises(ProviderStatusError, match="not available for your plan") as info:
            await collect(cls("m", api_key=API_KEY, http_client=client))
    err = info.value
    assert (err.status, err.retryable, err.error_type, err.request_id) == (200, False, "invalid_request_error", "r1")
    assert server.streams[0].closed


async def test_a_context_overflow_sent_with_200_is_prompt_too_long() -> None:
    server = MockServer(CONTEXT_OVERFLOW_BODIES["openai_responses"], headers={"content-type": "application/json"})
    async with server.client() as client:
        with pytest.raises(PromptTooLongError):
            await collect(OpenAIResponsesModel("m", api_key=API_KEY, http_client=client))


async def test_a_whole_response_instead_of_a_stream_is_a_clear_error_that_is_not_retried() -> None:
    # A server that ignores "stream": true and sends the whole completion.
    body = (b'{"id":"chatcmpl-1","object":"chat.completion","choices":[{"index":0,"message":{"role":"assistant",'
            b'"content":"hi"},"finish_reason":"stop"}]}')  # fmt: skip
    server = MockServer(body, headers={"content-type": "application/json"})
    async with server.client() as client:
        with pytest.raises(StreamProtocolError, match="not an event stream") as info:
            await collect(OpenAIChatModel("m", api_key=API_KEY, http_client=client))
    assert info.value.retryable is False
    assert server.streams[0].closed


@pytest.mark.parametrize(
    "body",
    [b'data: {"id":"chatcmpl-1","choices":[{"index":0,"delta":{"content":"hi"}}]}\n\n', b'{"error":', b"<html>ok</html>"],
    ids=["events-then-cut", "cut-json", "html"],
)
async def test_a_cut_stream_is_still_a_retryable_protocol_error(body: bytes) -> None:
    server = MockServer(body, headers={"content-type": "application/json"})
    async with server.client() as client:
        with pytest.raises(StreamProtocolError, match="without data: \\[DONE\\]") as info:
            await collect(OpenAIChatModel("m", api_key=API_KEY, http_client=client))
    assert info.value.retryable is True


@pytest.mark.parametrize("cls", [AnthropicModel, OpenAIChatModel, OpenAIResponsesModel])
async def test_a_web_page_sent_with_200_is_a_clear_error_not_a_cut_stream(cls: type) -> None:
    # base_url pointing at a web UI, a site or a captive portal: the page is not a cut stream,
    # and the same request would get the same page again.
    page = f"<!doctype html>\n<html><head><title>Chat UI</title></head>\n<body>key {API_KEY}</body></html>".encode()
    server = MockServer(page, headers={"content-type": "text/html; charset=utf-8"})
    async with server.client() as client:
        engine = QueryEngine(cls("m", api_key=API_KEY, http_client=client), policies=[], retry_base_delay=0.001)
        events = [e async for e in engine.run("hi")]
    end = events[-1]
    assert isinstance(end, TurnEnded) and end.reason == "model_error"
    assert "web page (text/html)" in (end.error or "") and "Chat UI" in (end.error or "")
    assert API_KEY not in (end.error or "")
    assert len(server.requests) == 1
    assert server.streams[0].closed


# -- the key inside a stream ----------------------------------------------------------------

ANTHROPIC_ECHO = {"type": "error", "error": {"type": "authentication_error", "message": f"invalid x-api-key {API_KEY}"},
                  "echo": [API_KEY]}  # fmt: skip
CHAT_ECHO = {"error": {"message": f"Incorrect API key provided: {API_KEY}", "type": "invalid_request_error",
                       "code": "invalid_api_key"}}  # fmt: skip
RESPONSES_ECHO = {"type": "error", "code": "invalid_api_key", "message": f"Incorrect API key provided: {API_KEY}"}
ECHOES = {
    AnthropicModel: sse(("error", ANTHROPIC_ECHO)),
    OpenAIChatModel: sse((None, CHAT_ECHO)),
    OpenAIResponsesModel: sse(("error", RESPONSES_ECHO)),
}


@pytest.mark.parametrize("cls", [AnthropicModel, OpenAIChatModel, OpenAIResponsesModel])
@pytest.mark.parametrize("kind", ["error-event", "malformed-data"])
async def test_the_key_is_scrubbed_from_errors_raised_inside_a_stream(cls: type, kind: str) -> None:
    # A proxy that reports a bad key inside the 200 stream, echoing it; or data so broken
    # that the protocol error quotes it.
    body = ECHOES[cls] if kind == "error-event" else f"data: {{oops {API_KEY}\n\n".encode()
    server = MockServer(body)
    async with server.client() as client:
        with pytest.raises(ModelError) as info:
            await collect(cls("m", api_key=API_KEY, http_client=client))
    err = info.value
    body_text = repr(getattr(err, "body", None))
    for text in (str(err), repr(err), err.message, body_text):
        assert API_KEY not in text
    assert "[REDACTED]" in str(err)
    if kind == "error-event":
        assert "[REDACTED]" in body_text


# -- base_url -----------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("cls", "path"),
    [(AnthropicModel, "/v1/messages"), (OpenAIChatModel, "/chat/completions"), (OpenAIResponsesModel, "/responses")],
)
@pytest.mark.parametrize("slash", ["", "/"])
async def test_a_query_string_in_base_url_stays_at_the_end(cls: type, path: str, slash: str) -> None:
    # Azure's deployment URLs carry ?api-version=...: the path goes before it, not into it.
    server = MockServer(b"")
    base = f"https://r.openai.azure.com/openai/deployments/d{slash}?api-version=2024-10-21"
    async with server.client() as client:
        with pytest.raises(StreamProtocolError):
            await collect(cls("m", api_key=API_KEY, base_url=base, http_client=client))
    url = server.requests[0].url
    assert url.path == "/openai/deployments/d" + path
    assert url.params["api-version"] == "2024-10-21"


async def test_a_plain_base_url_with_a_trailing_slash() -> None:
    server = MockServer(b"")
    async with server.client() as client:
        with pytest.raises(StreamProtocolError):
            await collect(OpenAIChatModel("m", base_url="http://localhost:8000/v1/", http_client=client))
    assert str(server.requests[0].url) == "http://localhost:8000/v1/chat/completions"


# -- credentials in extra_headers and base_url ----------------------------------------------

PROXY_SECRETS = ("prx-bearer-SECRET-1", "cookie-SECRET-2", "hdr-SECRET-3", "qry-SECRET-4")
PROXY_HEADERS = {
    "Authorization": f"Bearer {PROXY_SECRETS[0]}",
    "Cookie": f"theme=dark; sid={PROXY_SECRETS[1]}",
    "X-Gateway-Token": PROXY_SECRETS[2],
}
_ECHO = " ".join(PROXY_SECRETS) + " " + " ".join(f"{k}: {v}" for k, v in PROXY_HEADERS.items())
_ERROR_EVENT = {"type": "error", "error": {"type": "api_error", "message": f"bad token {_ECHO}"},
                "code": "x", "message": f"bad token {_ECHO}"}  # fmt: skip
PROXY_ECHOES = {
    "401 body": (401, "application/json", json.dumps({"error": {"message": f"denied: {_ECHO}", "echo": _ECHO}})),
    "error event": (200, "text/event-stream", f"event: error\ndata: {json.dumps(_ERROR_EVENT)}\n\n"),
    "malformed data": (200, "text/event-stream", f"data: {{oops {_ECHO}\n\n"),
    "error document": (200, "application/json", json.dumps({"error": f"bad gateway credentials {_ECHO}"})),
    "web page": (200, "text/html", f"<html><body>Sign in again: {_ECHO}</body></html>"),
}


@pytest.mark.parametrize("cls", _MODELS)
@pytest.mark.parametrize("kind", list(PROXY_ECHOES))
async def test_credentials_in_extra_headers_and_base_url_never_leak(
    cls: type, kind: str, caplog: pytest.LogCaptureFixture
) -> None:
    # A gateway in front of the provider, authenticated by headers and a ?key= the host
    # configured, that echoes them back in its error.
    status, media, body = PROXY_ECHOES[kind]
    server = MockServer(body.encode(), status=status, headers={"content-type": media})
    base = f"https://gw.test/v1?api-version=2024-10-21&key={PROXY_SECRETS[3]}"
    async with server.client() as client:
        model = cls("m", api_key=API_KEY, base_url=base, http_client=client, extra_headers=PROXY_HEADERS)
        with pytest.raises(ModelError) as info:
            await collect(model)
        with caplog.at_level("DEBUG"):
            engine = QueryEngine(model, policies=[], retry_budget=1, retry_base_delay=0.001)
            events = [e async for e in engine.run("hi")]
    err = info.value
    # httpx's own INFO line quotes each request's URL: its ?key= is scrubbed there too.
    logged = [r.getMessage() for r in caplog.records]
    assert any(r.name == "httpx" and "key=[REDACTED]" in r.getMessage() for r in caplog.records)
    shown = [str(err), repr(err), err.message, repr(getattr(err, "body", None)), repr(model), str(model),
             *logged, *(repr(e) for e in events)]  # fmt: skip
    leaks = [(secret, text) for secret in (*PROXY_SECRETS, API_KEY) for text in shown if secret in text]
    assert not leaks
    assert "[REDACTED]" in str(err)
    assert "api-version=2024-10-21" in repr(model) and "key=[REDACTED]" in repr(model)
    assert server.requests[0].headers["x-gateway-token"] == PROXY_SECRETS[2]  # what is sent is untouched


def test_short_or_harmless_header_values_do_not_garble_errors() -> None:
    conn = Connection("openai", "https://gw.test/v1", secret=None, http_client=None, request_id_header="x")
    redactor = conn.redactor({"x-session-affinity": "1", "content-type": "application/json"})
    assert redactor._values == ()  # nothing to scrub
    assert redactor.scrub("HTTP 401: session 1 refused") == "HTTP 401: session 1 refused"


def test_a_cookies_preferences_are_not_scrubbed_but_its_session_id_is() -> None:
    """Scrubbing ``lang=en-US`` or ``theme=dark`` would garble every record holding the word
    (in a service, every tenant's while one server lives); a session id is long, and a
    cookie named as a credential is scrubbed whatever its length."""
    cookie = "lang=en-US; theme=dark; sid=0f3a9c2e71b4d5a6; token=k9Zq"
    conn = Connection("openai", "https://gw.test/v1", secret=None, http_client=None, request_id_header="x")
    redactor = conn.redactor({"cookie": cookie})
    text = redactor.scrub("HTTP 401: locale en-US, theme dark; session 0f3a9c2e71b4d5a6 and k9Zq refused")
    assert text == "HTTP 401: locale en-US, theme dark; session [REDACTED] and [REDACTED] refused"
    assert redactor.scrub(f"echo: {cookie}") == "echo: [REDACTED]"  # the header's value whole


def test_a_request_that_succeeds_never_collects_its_secrets(monkeypatch: pytest.MonkeyPatch) -> None:
    """The secrets to scrub are gathered at the first error, not for every request."""
    conn = Connection("openai", "https://u:pw1234@gw.test/v1", secret=Secret("sk-abcdef"), http_client=None,
                      request_id_header="x")  # fmt: skip
    calls: list[str] = []

    def counting(value: str) -> list[str]:
        calls.append(value)
        return credential_parts(value)

    monkeypatch.setattr(agentloop.models._http._client, "credential_parts", counting)
    redactor = conn.redactor({"authorization": "Bearer gw-token-1"})
    assert calls == []
    assert redactor.scrub("echo: Bearer gw-token-1, sk-abcdef, pw1234") == "echo: [REDACTED], [REDACTED], [REDACTED]"
    assert calls == ["Bearer gw-token-1"]
    redactor.scrub("again")
    assert calls == ["Bearer gw-token-1"]  # collected once


@pytest.mark.parametrize(
    ("cls", "header"),
    [(AnthropicModel, "X-Api-Key"), (OpenAIChatModel, "Authorization"), (OpenAIResponsesModel, "AUTHORIZATION")],
)
async def test_an_auth_header_in_extra_headers_replaces_the_key_instead_of_joining_it(cls: type, header: str) -> None:
    # A gateway with its own credential while OPENAI_API_KEY / ANTHROPIC_API_KEY is set: the
    # host's header is the one sent, and the provider key does not go to the gateway as well.
    server = MockServer(b"")
    async with server.client() as client:
        model = cls("m", api_key=API_KEY, base_url="https://gw.test/v1", http_client=client,
                    extra_headers={header: "gw-credential", "Accept-Encoding": "identity"})  # fmt: skip
        with pytest.raises(ModelError):
            await collect(model)
    raw = server.requests[0].headers.raw
    assert [v for k, v in raw if k.lower() == header.lower().encode()] == [b"gw-credential"]
    assert [k for k, _ in raw if k.lower() == b"accept-encoding"] == [b"Accept-Encoding"]
    assert not [k for k, v in raw if API_KEY.encode() in v]


@pytest.mark.parametrize(
    ("cls", "header", "env"),
    [
        (AnthropicModel, "X-Api-Key", "ANTHROPIC_API_KEY"),
        (OpenAIChatModel, "Authorization", "OPENAI_API_KEY"),
        (OpenAIResponsesModel, "AUTHORIZATION", "OPENAI_API_KEY"),
    ],
)
@pytest.mark.parametrize("key", ["given", "from the environment", "none"])
async def test_an_auth_header_on_the_hosts_client_is_sent_instead_of_the_key(
    cls: type, header: str, env: str, key: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    # The same rule as for extra_headers: a gateway's credential set on the host's own client is
    # the one sent; the provider key (often picked up from the environment unasked) does not
    # replace it, and goes nowhere. Without a key, the host's header is enough.
    monkeypatch.delenv(env, raising=False)
    if key == "from the environment":
        monkeypatch.setenv(env, API_KEY)
    server = MockServer(b"")
    client = httpx.AsyncClient(transport=httpx.MockTransport(server.handler), headers={header: "gw-credential"})
    async with client:
        model = cls("m", api_key=API_KEY if key == "given" else None, base_url="https://gw.test/v1", http_client=client)
        with pytest.raises(ModelError) as info:  # the empty body is a protocol error, after the request
            await collect(model)
    assert "no API key" not in str(info.value)
    raw = server.requests[0].headers.raw
    assert [v for k, v in raw if k.lower() == header.lower().encode()] == [b"gw-credential"]
    assert not [k for k, v in raw if API_KEY.encode() in v]


@pytest.mark.parametrize("cls", _MODELS)
async def test_a_key_the_hosts_client_header_replaces_is_not_checked(cls: type) -> None:
    """A key read with its trailing newline fails every request that sends it; one the host's own
    header replaced is not sent, so it fails nothing."""
    header = "x-api-key" if cls is AnthropicModel else "authorization"
    server = MockServer(b"")
    client = httpx.AsyncClient(transport=httpx.MockTransport(server.handler), headers={header: "gw-credential"})
    async with client:
        model = cls("m", api_key=API_KEY + "\n", base_url="https://gw.test/v1", http_client=client)
        with pytest.raises(ModelError) as info:  # the empty body is a protocol error, after the request
            await collect(model)
    assert "cannot carry" not in str(info.value) and len(server.requests) == 1


@pytest.mark.parametrize("cls", _MODELS)
@pytest.mark.parametrize("sep", ["/", "?", "#"])
def test_a_password_with_an_unencoded_slash_is_not_quoted_by_the_base_url_error(cls: type, sep: str) -> None:
    # httpx reads "Zx9" as the port ("Invalid port: 'Zx9'"): the start of the password.
    with pytest.raises(ValueError, match="base_url is not a valid URL") as info:
        cls("m", api_key=API_KEY, base_url=f"https://alice:Zx9{sep}Qw8-PASSWORD@proxy.test/v1")
    assert "Zx9" not in str(info.value) and "PASSWORD" not in str(info.value)
    assert "Invalid port" in str(info.value) and "percent-encoded" in str(info.value)


@pytest.mark.parametrize("cls", _MODELS)
@pytest.mark.parametrize("where", ["401 body", "error event"])
async def test_a_credential_the_server_json_escaped_is_scrubbed_too(cls: type, where: str) -> None:
    # PHP's json_encode writes "/" as "\/" (and some encoders "+" as "\u002b"): the raw body
    # does not hold the token as sent, the decoded error does.
    token = "gw/tok+EN=SECRET/5"
    escaped = token.replace("/", "\\/").replace("+", "\\u002b")
    echo = '{"type":"error","error":{"type":"api_error","message":"bad token ' + escaped + '"},"message":"bad token ' + escaped + '"}'
    body, status, media = (echo, 401, "application/json") if where == "401 body" else (f"event: error\ndata: {echo}\n\n", 200, "text/event-stream")
    server = MockServer(body.encode(), status=status, headers={"content-type": media})
    async with server.client() as client:
        model = cls("m", api_key=API_KEY, base_url="https://gw.test/v1", http_client=client,
                    extra_headers={"x-gateway-token": token})  # fmt: skip
        with pytest.raises(ModelError) as info:
            await collect(model)
    err = info.value
    for text in (str(err), repr(err), err.message, repr(getattr(err, "body", None))):
        assert "SECRET" not in text
    assert "[REDACTED]" in str(err)


@pytest.mark.parametrize("cls", _MODELS)
async def test_credentials_set_on_the_hosts_http_client_are_scrubbed_too(cls: type) -> None:
    # A gateway credential given as the http_client's default headers, echoed in a 401.
    echo = json.dumps({"error": {"message": f"bad gateway token {PROXY_SECRETS[2]}", "type": "auth"}})
    server = MockServer(echo.encode(), status=401, headers={"content-type": "application/json"})
    client = httpx.AsyncClient(transport=httpx.MockTransport(server.handler), headers={"X-Gateway-Token": PROXY_SECRETS[2]})
    async with client:
        model = cls("m", api_key=API_KEY, base_url="https://gw.test/v1", http_client=client)
        with pytest.raises(ModelError) as info:
            await collect(model)
    err = info.value
    for text in (str(err), repr(err), err.message, repr(getattr(err, "body", None))):
        assert PROXY_SECRETS[2] not in text
    assert server.requests[0].headers["x-gateway-token"] == PROXY_SECRETS[2]


@pytest.mark.parametrize("cls", _MODELS)
async def test_the_hosts_client_auth_is_scrubbed_from_an_error_that_echoes_it(cls: type) -> None:
    # A gateway behind basic auth given as the http_client's ``auth=``: the Authorization header
    # it adds when the request is sent was not among the secrets scrubbed.
    def handler(request: httpx.Request) -> httpx.Response:
        said = f"bad credentials: {request.headers['authorization']}"
        return httpx.Response(401, json={"error": {"message": said, "type": "auth"}})

    auth = httpx.BasicAuth("gateway", PROXY_SECRETS[0])
    async with httpx.AsyncClient(transport=httpx.MockTransport(handler), auth=auth) as client:
        model = cls("m", api_key=API_KEY, base_url="https://gw.test/v1", http_client=client)
        with pytest.raises(ProviderStatusError) as info:
            await collect(model)
    err = info.value
    sent = next(auth.auth_flow(httpx.Request("GET", "https://gw.test"))).headers["authorization"]
    for text in (str(err), repr(err), repr(err.body)):
        assert sent not in text and sent.partition(" ")[2] not in text
    assert "[REDACTED]" in str(err)


@pytest.mark.parametrize("cls", _MODELS)
async def test_a_status_the_hosts_response_hook_raises_for_is_the_status_error(cls: type) -> None:
    # A shared client whose response hook calls raise_for_status(): its HTTPStatusError left the
    # ProviderError tree, was not retried, and quoted the request URL with its ?key=.
    async def raise_for_status(response: httpx.Response) -> None:
        response.raise_for_status()

    def handler(request: httpx.Request) -> httpx.Response:
        return httpx.Response(429, headers={"retry-after": "3", "x-request-id": "req_1", "request-id": "req_1"})

    transport = httpx.MockTransport(handler)
    async with httpx.AsyncClient(transport=transport, event_hooks={"response": [raise_for_status]}) as client:
        model = cls("m", api_key=API_KEY, base_url=f"https://gw.test/v1?key={PROXY_SECRETS[3]}", http_client=client)
        with pytest.raises(ProviderStatusError) as info:
            await collect(model)
    err = info.value
    assert (err.status, err.retryable, err.retry_after, err.request_id) == (429, True, 3.0, "req_1")
    assert PROXY_SECRETS[3] not in str(err) and PROXY_SECRETS[3] not in repr(err.__cause__)


@pytest.mark.parametrize("cls", _MODELS)
@pytest.mark.parametrize("at", [184, 190, 196])
async def test_a_key_across_the_quoted_excerpts_cut_is_not_half_shown(cls: type, at: int) -> None:
    # A malformed chunk quoted in the error is cut at 200 characters; a key the cut fell
    # inside escaped the scrubbing of the whole key, and its first part was shown.
    data = "{oops " + " " * (at - 6) + API_KEY + " and more"
    server = MockServer(f"data: {data}\n\n".encode())
    async with server.client() as client:
        with pytest.raises(StreamProtocolError) as info:
            await collect(cls("m", api_key=API_KEY, http_client=client))
    assert API_KEY[: 200 - at] not in str(info.value) and "[REDACTED]" in str(info.value)


@given(text=st.text(alphabet="ab/+= .\"", max_size=400), limit=st.integers(min_value=1, max_value=300))
def test_an_excerpt_is_a_prefix_that_never_ends_inside_a_token_run(text: str, limit: int) -> None:
    out = excerpt(text, limit)
    assert text.startswith(out) and len(out) >= min(len(text), limit) and len(out) <= limit + 512
    if len(out) < len(text) and len(out) < limit + 512:
        assert not (re.fullmatch(r"[A-Za-z0-9_.+/=~-]", out[-1]) and re.fullmatch(r"[A-Za-z0-9_.+/=~-]", text[len(out)]))


# -- the host's client left at httpx's default timeout -----------------------------------

_BODIES = {
    AnthropicModel: sse(("message_start", {"type": "message_start", "message": {"id": "m"}}),
                        ("message_stop", {"type": "message_stop"})),
    OpenAIChatModel: chat_stream(chat_chunk({"content": "x"}, "stop")),
    OpenAIResponsesModel: sse((None, {"type": "response.completed", "response": {"id": "r", "status": "completed"}})),
}  # fmt: skip


async def _timeout_used(cls: type, **client_kw: object) -> dict[str, float | None]:
    seen: list[dict[str, float | None]] = []

    def handler(request: httpx.Request) -> httpx.Response:
        seen.append(request.extensions["timeout"])
        return httpx.Response(200, headers={"content-type": "text/event-stream"}, content=_BODIES[cls])

    async with httpx.AsyncClient(transport=httpx.MockTransport(handler), **client_kw) as client:  # type: ignore[arg-type]
        await collect(cls("m", api_key=API_KEY, http_client=client))
    (timeout,) = seen
    return timeout


@pytest.mark.parametrize("cls", list(_BODIES))
async def test_a_host_client_left_at_httpx_default_timeout_gets_a_long_read_timeout(cls: type) -> None:
    # httpx's default (5 s for every phase) fails a model that thinks 30 s before its first token.
    async with httpx.AsyncClient() as untouched:
        assert untouched.timeout == httpx.Timeout(5.0)
    timeout = await _timeout_used(cls)
    assert (timeout["connect"], timeout["read"]) == (5.0, 600.0)


@pytest.mark.parametrize(
    "chosen",
    [httpx.Timeout(30.0), httpx.Timeout(5.0, read=120.0), httpx.Timeout(None), httpx.Timeout(2.0, connect=1.0)],
    ids=["30s", "read-120s", "none", "2s"],
)
async def test_a_timeout_the_host_chose_is_kept(chosen: httpx.Timeout) -> None:
    timeout = await _timeout_used(OpenAIChatModel, timeout=chosen)
    assert timeout == chosen.as_dict()


# -- secrets in the errors httpx raises, and in their chain ------------------------------------


def _shown(exc: BaseException) -> str:
    """All a host sees of ``exc``: its str, repr, args and the full traceback, chain included."""
    return "\n".join([str(exc), repr(exc), repr(exc.args), "".join(traceback.format_exception(exc))])


@pytest.mark.parametrize("cls", _MODELS)
@pytest.mark.parametrize("kind", [httpx.ConnectError, httpx.ReadTimeout, httpx.RemoteProtocolError, httpx.ProxyError])
async def test_a_transport_error_quoting_a_secret_is_scrubbed_in_the_chain_too(cls: type, kind: type) -> None:
    # The error agentloop raises keeps the transport error as its __cause__, which a host
    # printing the whole traceback (or a crash reporter) shows: scrubbed there as well.
    def refuse(request: httpx.Request) -> httpx.Response:
        raise kind(f"upstream refused {API_KEY} with {PROXY_HEADERS['Authorization']}", request=request)

    async with httpx.AsyncClient(transport=httpx.MockTransport(refuse)) as client:
        model = cls("m", api_key=API_KEY, http_client=client, extra_headers={"Authorization": PROXY_HEADERS["Authorization"]})
        with pytest.raises(ProviderConnectionError) as info:
            await collect(model)
    err = info.value
    shown = _shown(err)
    assert API_KEY not in shown and PROXY_SECRETS[0] not in shown
    assert isinstance(err.__cause__, kind) and "[REDACTED]" in str(err.__cause__)  # the chain is kept


@pytest.mark.parametrize("cls", _MODELS)
@pytest.mark.parametrize("where", ["extra_headers changed after construction", "the host's client"])
@pytest.mark.parametrize("value", ["gw-SECRET-token-7\n", "Bearer gw-SECRET-token-7\r\n", "gw-SECRET-token-7\r\nX-Evil: 1"])
async def test_a_credential_header_with_a_line_break_is_never_quoted(cls: type, where: str, value: str) -> None:
    # HTTP refuses the header and quotes its value escaped (b'...\\n'): the plain value is
    # not in that text, so scrubbing it missed the credential.
    network = _Network()
    transport = httpx.AsyncHTTPTransport()
    transport._pool = httpcore.AsyncConnectionPool(network_backend=network)
    header = {"X-Gateway-Token": value}
    async with httpx.AsyncClient(transport=transport, headers=header if where == "the host's client" else None) as client:
        model = cls("m", api_key=API_KEY, base_url="http://llm.test", http_client=client,
                    extra_headers={"X-Gateway-Token": "ok"} if where != "the host's client" else None)  # fmt: skip
        if where != "the host's client":
            model.extra_headers["X-Gateway-Token"] = value
        with pytest.raises(ModelError) as info:
            await collect(model)
        end = (await collect_engine(QueryEngine(model, policies=[], retry_base_delay=0.001)))[-1]
    assert isinstance(end, TurnEnded) and end.reason == "model_error"
    for text in (_shown(info.value), end.error or ""):
        assert "SECRET" not in text
    assert network.written == []  # nothing was sent


# -- redirects followed by the host's client ----------------------------------------------------

_PATHS = {AnthropicModel: "/v1/v1/messages", OpenAIChatModel: "/v1/chat/completions", OpenAIResponsesModel: "/v1/responses"}


def _redirecting(cls: type, target: str, status: int = 307) -> tuple[list[httpx.Request], httpx.AsyncClient]:
    """A host client that follows redirects, in front of a server that sends the model's first
    request to ``target`` (then serves a whole stream there)."""
    seen: list[httpx.Request] = []

    def handler(request: httpx.Request) -> httpx.Response:
        seen.append(request)
        if len(seen) == 1:
            return httpx.Response(status, headers={"location": target})
        return httpx.Response(200, headers={"content-type": "text/event-stream"}, content=_BODIES[cls])

    return seen, httpx.AsyncClient(transport=httpx.MockTransport(handler), follow_redirects=True)


@pytest.mark.parametrize("cls", _MODELS)
@pytest.mark.parametrize("target", ["https://elsewhere.test/v1/x", "https://api.test:8443/v1/x", "http://api.test/v1/x"])
async def test_a_redirect_to_another_origin_never_takes_the_credentials_along(cls: type, target: str) -> None:
    # httpx drops only Authorization on such a redirect: Anthropic's x-api-key, Azure's api-key
    # and a gateway's token went to whatever host the redirect named.
    seen, client = _redirecting(cls, target)
    async with client:
        model = cls("m", api_key=API_KEY, base_url="https://api.test/v1", http_client=client,
                    extra_headers={"api-key": PROXY_SECRETS[2], "X-Gateway-Token": PROXY_SECRETS[3]})  # fmt: skip
        await collect(model)  # the redirect is followed, as the host's client asks
    first, second = seen
    assert str(second.url) == target and second.content == first.content
    sent = [v for _, v in second.headers.raw]
    assert not [v for v in sent if any(s.encode() in v for s in (API_KEY, *PROXY_SECRETS))]
    assert [v for v in first.headers.raw if API_KEY.encode() in v[1]]  # the first request had it


@pytest.mark.parametrize("cls", _MODELS)
@pytest.mark.parametrize("target", ["https://elsewhere.test/v1/x", "http://api.test/v1/x"])
async def test_a_redirect_to_another_origin_never_takes_the_clients_auth_along(cls: type, target: str) -> None:
    # The host's client authenticates with ``auth=``: httpx applies it to the first request only,
    # and each hop sent anew went through it again, to whatever host the redirect named.
    seen, client = _redirecting(cls, target)
    client.auth = httpx.BasicAuth("gateway", PROXY_SECRETS[0])
    async with client:
        await collect(cls("m", api_key=API_KEY, base_url="https://api.test/v1", http_client=client))
    first, second = seen
    assert first.headers["authorization"].startswith("Basic ")
    assert "authorization" not in second.headers


@pytest.mark.parametrize("cls", _MODELS)
@pytest.mark.parametrize("status", [307, 308])
@pytest.mark.parametrize("base", ["https://api.test", "http://api.test"], ids=["same-origin", "upgrade-to-https"])
async def test_a_redirect_within_the_origin_keeps_the_credentials(cls: type, status: int, base: str) -> None:
    # As httpx does with Authorization: kept within the origin, and on an upgrade of the same
    # host from http to https.
    seen, client = _redirecting(cls, "https://api.test/v2/x", status)
    async with client:
        model = cls("m", api_key=API_KEY, base_url=base + "/v1", http_client=client)
        events, _ = await collect(model)
    assert events and len(seen) == 2 and str(seen[0].url) == base + _PATHS[cls]
    key = "x-api-key" if cls is AnthropicModel else "authorization"
    assert seen[0].headers[key] == seen[1].headers[key] and API_KEY in seen[1].headers[key]


@pytest.mark.parametrize("cls", _MODELS)
async def test_redirects_are_bounded_by_the_clients_max_redirects(cls: type) -> None:
    seen: list[httpx.Request] = []

    def loop(request: httpx.Request) -> httpx.Response:
        seen.append(request)
        return httpx.Response(307, headers={"location": f"https://api.test/hop{len(seen)}"})

    async with httpx.AsyncClient(transport=httpx.MockTransport(loop), follow_redirects=True, max_redirects=3) as client:
        with pytest.raises(ProviderConnectionError, match="TooManyRedirects") as info:
            await collect(cls("m", api_key=API_KEY, base_url="https://api.test/v1", http_client=client))
    assert info.value.retryable is False and len(seen) == 4


@pytest.mark.parametrize("cls", _MODELS)
async def test_a_redirect_is_not_followed_by_a_client_that_does_not_follow_them(cls: type) -> None:
    seen, client = _redirecting(cls, "https://api.test/v2/x")
    client.follow_redirects = False
    async with client:
        with pytest.raises(ProviderStatusError, match="HTTP 307") as info:
            await collect(cls("m", api_key=API_KEY, base_url="https://api.test/v1", http_client=client))
    assert info.value.retryable is False and len(seen) == 1
