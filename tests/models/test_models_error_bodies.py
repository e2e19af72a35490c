"""Error responses as servers and proxies really send them: cut, huge, HTML, other charsets."""

from __future__ import annotations

import gzip
import json
import tracemalloc
from collections.abc import AsyncIterator
from typing import Any

import httpx
import pytest
from _models_support import API_KEY, MockServer, collect, sse

from agentloop import QueryEngine, Retrying, TurnEnded
from agentloop._errors import ProviderStatusError, ProviderStreamError, StreamProtocolError
from agentloop.models import AnthropicModel, OpenAIChatModel, OpenAIResponsesModel
from agentloop.models._http import status_error


class _Body(httpx.AsyncByteStream):
    """An error body: ``chunks``, then ``fail`` raised (a connection reset), recording how many
    chunks were read and whether it was closed."""

    def __init__(self, chunks: list[bytes], fail: Exception | None = None) -> None:
        self.chunks, self.fail = chunks, fail
        self.sent = 0
        self.closed = False

    async def __aiter__(self) -> AsyncIterator[bytes]:
        for chunk in self.chunks:
            self.sent += 1
            yield chunk
        if self.fail is not None:
            raise self.fail

    async def aclose(self) -> None:
        self.closed = True


async def _error(status: int, body: _Body, headers: dict[str, str], *, anthropic: bool = False) -> ProviderStatusError:
    def handler(request: httpx.Request) -> httpx.Response:
        return httpx.Response(status, headers=headers, stream=body)

    async with httpx.AsyncClient(transport=httpx.MockTransport(handler)) as client:
        cls = AnthropicModel if anthropic else OpenAIChatModel
        with pytest.raises(ProviderStatusError) as caught:
            await collect(cls("m", api_key=API_KEY, http_client=client))
    assert body.closed
    return caught.value


_JSON = {"content-type": "application/json"}


@pytest.mark.parametrize(
    "fail",
    [
        httpx.ReadError("connection reset"),
        httpx.RemoteProtocolError("peer closed"),
        ConnectionResetError(104, "Connection reset by peer"),  # a host's own transport (aiohttp, a proxy)
    ],
)
async def test_an_error_body_cut_short_keeps_its_status(fail: Exception) -> None:
    # A 401 whose body the connection lost mid-way was a retryable "connection failed": the key
    # was asked about three more times, and the error never said 401.
    body = _Body([b'{"type":"error","error":{"type":"authentication_error","mess'], fail)
    error = await _error(401, body, _JSON, anthropic=True)
    assert error.status == 401 and not error.retryable
    assert error.message.startswith("anthropic HTTP 401: ")


async def test_a_rate_limit_whose_body_is_cut_keeps_its_retry_after() -> None:
    error = await _error(429, _Body([b'{"error": {"mess'], httpx.ReadError("reset")), {**_JSON, "retry-after": "7"})
    assert error.status == 429 and error.retryable and error.retry_after == 7.0


async def test_an_endless_error_body_is_read_only_so_far() -> None:
    # A proxy that streams an endless (or enormous) error page was read whole into memory.
    chunk = b"<p>" + b"x" * 65_536 + b"</p>"
    body = _Body([b"<html><title>503 Service Unavailable</title>", *[chunk] * 10_000])
    error = await _error(503, body, {"content-type": "text/html"})
    assert error.status == 503 and error.retryable
    assert body.sent < 100


@pytest.mark.parametrize("cut", [False, True])
async def test_a_compressed_error_body_is_read_decoded(cut: bool) -> None:
    # The server compressed it although we asked for identity; cut short, what arrived is decoded.
    packed = gzip.compress(b'{"error": {"message": "model not found", "type": "invalid_request_error"}}')
    body = _Body([packed[:20]], httpx.ReadError("reset")) if cut else _Body([packed[:20], packed[20:]])
    error = await _error(404, body, {**_JSON, "content-encoding": "gzip"})
    assert error.status == 404 and not error.retryable
    if cut:
        assert error.message.startswith('openai HTTP 404: {"error":') and "model not found" not in error.message
    else:
        assert error.message == "openai HTTP 404: model not found"


_NGINX_502 = (
    b"<html>\r\n<head><title>502 Bad Gateway</title></head>\r\n<body>\r\n<center><h1>502 Bad Gateway</h1></center>\r\n"
    b"<hr><center>nginx/1.18.0</center>\r\n</body>\r\n</html>\r\n"
)
_CLOUDFLARE_524 = (
    '<!DOCTYPE html>\n<!--[if lt IE 7]> <html class="no-js ie6 oldie" lang="en-US"> <![endif]-->\n<head>\n'
    "<title>llm.example | 524: A timeout occurred</title>\n"
    + '<meta charset="UTF-8" />\n<meta http-equiv="X-UA-Compatible" content="IE=Edge" />\n'
    + '<link rel="stylesheet" id="cf_styles-css" href="/cdn-cgi/styles/main.css" />\n' * 30
    + "<script>(function(){window._cf_chl_opt={cvId: '3'};})();</script></head>\n"
    "<body><div id=\"cf-wrapper\"><h1>A timeout occurred</h1><span>Error code 524</span></div></body></html>"
).encode()
_NO_TITLE = (
    b"<!doctype html><html><head><style>body { color: red }</style><script>var key = 1;</script></head>"
    b"<body><h1>Forbidden</h1><p>Your IP &amp; region are not allowed.</p></body></html>"
)


@pytest.mark.parametrize(
    ("status", "page", "content_type", "said"),
    [
        (502, _NGINX_502, "text/html", "502 Bad Gateway"),
        (524, _CLOUDFLARE_524, "text/html; charset=UTF-8", "llm.example | 524: A timeout occurred"),
        (403, _NO_TITLE, "text/html", "Forbidden Your IP & region are not allowed."),
        (502, _NGINX_502, "", "502 Bad Gateway"),  # no content type: the page says what it is
        (413, _NGINX_502.replace(b"502 Bad Gateway", b"413 Request Entity Too Large"), "text/html", "413 Request"),
    ],
    ids=["nginx", "cloudflare", "no-title", "untyped", "nginx-413"],
)
async def test_a_proxys_web_page_is_told_by_what_it_says_not_quoted_as_markup(
    status: int, page: bytes, content_type: str, said: str
) -> None:
    # The error quoted the first 500 characters of the page: for Cloudflare's, nothing but
    # <meta> and <link> tags, never the "524: A timeout occurred" it shows.
    headers = {"content-type": content_type} if content_type else {}
    error = await _error(status, _Body([page]), headers)
    assert error.message.startswith(f"openai HTTP {status}: {said}")
    assert "(an HTML page, not an API error body)" in error.message
    assert "<" not in error.message and len(error.message) < 300
    assert error.status == status and error.body == page.decode()


@pytest.mark.parametrize("charset", ["iso-8859-1", "utf-16", "windows-1252", "shift_jis"])
async def test_an_error_body_in_another_charset_is_read_in_it(charset: str) -> None:
    message = "Requête refusée : modèle « gpt-x » inconnu" if charset != "shift_jis" else "モデルが見つかりません"
    raw = json.dumps({"error": {"message": message, "type": "invalid_request_error"}}, ensure_ascii=False)
    body = _Body([raw.encode(charset)])
    error = await _error(400, body, {"content-type": f"application/json; charset={charset}"})
    assert error.message == f"openai HTTP 400: {message}"


async def test_an_unknown_charset_falls_back_to_utf8() -> None:
    raw = json.dumps({"error": {"message": "modèle inconnu"}}, ensure_ascii=False).encode()
    error = await _error(400, _Body([raw]), {"content-type": "application/json; charset=x-no-such-thing"})
    assert error.message == "openai HTTP 400: modèle inconnu"


async def test_an_error_body_with_a_byte_order_mark_is_json_still() -> None:
    raw = b"\xef\xbb\xbf" + json.dumps({"error": {"message": "bad model", "type": "invalid_request_error"}}).encode()
    error = await _error(400, _Body([raw]), _JSON)
    assert error.message == "openai HTTP 400: bad model" and error.error_type == "invalid_request_error"


@pytest.mark.parametrize("content_type", ["", "text/plain", "application/octet-stream"])
async def test_a_web_page_sent_with_200_and_no_html_type_is_still_a_web_page(content_type: str) -> None:
    # A captive portal or a misconfigured site that does not say what it sends: not a cut stream
    # to retry three times, but the page, told by its title.
    page = b"<!DOCTYPE html>\n<html><head><title>Hotel Wi-Fi &mdash; sign in</title></head><body>...</body></html>"
    headers = {"content-type": content_type} if content_type else {}

    def handler(request: httpx.Request) -> httpx.Response:
        return httpx.Response(200, headers=headers, content=page)

    async with httpx.AsyncClient(transport=httpx.MockTransport(handler)) as client:
        with pytest.raises(StreamProtocolError) as caught:
            await collect(OpenAIChatModel("m", api_key=API_KEY, http_client=client))
    error = caught.value
    assert not error.retryable
    assert error.message.endswith("answered with a web page (text/html), not an event stream: is base_url the "
                                  "API's address? Hotel Wi-Fi \u2014 sign in")  # fmt: skip


_TOO_DEEP = b"[" * 100_000 + b"]" * 100_000


async def test_an_error_body_nested_too_deeply_to_decode_keeps_its_status() -> None:
    # A broken proxy's 503: json.loads raised RecursionError, out of the ProviderError tree, and
    # the 503 was not retried.
    error = await _error(503, _Body([_TOO_DEEP]), {**_JSON, "retry-after": "2"})
    assert error.status == 503 and error.retryable and error.retry_after == 2.0
    assert error.body == _TOO_DEEP.decode() and error.message.startswith("openai HTTP 503: [[[")


async def test_a_200_json_body_nested_too_deeply_to_decode_is_a_model_error() -> None:
    def handler(request: httpx.Request) -> httpx.Response:
        return httpx.Response(200, headers=_JSON, content=_TOO_DEEP)

    async with httpx.AsyncClient(transport=httpx.MockTransport(handler)) as client:
        with pytest.raises(StreamProtocolError, match="nested too deeply") as caught:
            await collect(OpenAIChatModel("m", api_key=API_KEY, http_client=client))
    assert not caught.value.retryable  # the same request gets the same document


_NO_QUOTA = (
    b'{"error": {"message": "You exceeded your current quota, please check your plan and billing details.", '
    b'"type": "insufficient_quota", "param": null, "code": "insufficient_quota"}}'
)


async def test_a_429_for_a_spent_quota_is_not_retried() -> None:
    # OpenAI answers an account out of credit with 429 insufficient_quota: no wait fixes it, and
    # three retries only delayed the error (and looked like a rate limit to the host).
    server_calls: list[httpx.Request] = []

    def handler(request: httpx.Request) -> httpx.Response:
        server_calls.append(request)
        return httpx.Response(429, headers=_JSON, content=_NO_QUOTA)

    async with httpx.AsyncClient(transport=httpx.MockTransport(handler)) as client:
        model = OpenAIChatModel("m", api_key=API_KEY, http_client=client)
        engine = QueryEngine(model, policies=[], retry_base_delay=0.001)
        events = [e async for e in engine.run("hi")]
    assert not [e for e in events if isinstance(e, Retrying)] and len(server_calls) == 1
    end = events[-1]
    assert isinstance(end, TurnEnded) and end.reason == "model_error" and "exceeded your current quota" in (end.error or "")


@pytest.mark.parametrize(
    ("body", "headers", "retryable"),
    [
        (b'{"error": {"message": "quota", "type": "insufficient_quota", "code": null}}', {}, False),
        (b'{"error": {"message": "quota", "type": "requests", "code": "insufficient_quota"}}', {}, False),
        (_NO_QUOTA, {"x-should-retry": "true"}, True),  # the server's word wins
        (b'{"error": {"message": "Rate limit reached", "type": "requests", "code": "rate_limit_exceeded"}}', {}, True),
    ],
    ids=["type", "code", "x-should-retry", "rate-limit"],
)
def test_only_a_spent_quota_429_is_final(body: bytes, headers: dict[str, str], retryable: bool) -> None:
    error = status_error("openai", 429, {**_JSON, **headers}, body, request_id_header="x-request-id", secret=None)
    assert error.retryable is retryable


_GEMINI_400 = (
    b'[{\n  "error": {\n    "code": 400,\n    "message": "API key not valid. Please pass a valid API key.",\n'
    b'    "status": "INVALID_ARGUMENT",\n    "details": [{"@type": "type.googleapis.com/google.rpc.ErrorInfo",'
    b' "reason": "API_KEY_INVALID"}]\n  }\n}\n]\n'
)


async def test_geminis_error_wrapped_in_a_list_gives_its_message() -> None:
    # Gemini's OpenAI endpoint (and gateways in front of it) sends its error body as a list of one
    # error: the message was the whole JSON text, cut at 500 characters.
    error = await _error(400, _Body([_GEMINI_400]), _JSON)
    assert error.message == "openai HTTP 400: API key not valid. Please pass a valid API key."
    assert error.error_type == "INVALID_ARGUMENT" and not error.retryable


def test_a_context_overflow_wrapped_in_a_list_is_prompt_too_long() -> None:
    body = json.dumps([{"error": {"code": 400, "status": "INVALID_ARGUMENT", "message": (
        "The input token count (1200000) exceeds the maximum number of tokens allowed (1048576)."
    )}}]).encode()  # fmt: skip
    error = status_error("openai", 400, _JSON, body, request_id_header="x-request-id", secret=None)
    assert type(error).__name__ == "PromptTooLongError"
    assert error.message == "openai HTTP 400: The input token count (1200000) exceeds the maximum number of tokens allowed (1048576)."


async def test_a_compressed_error_body_is_decoded_no_further_than_the_limit() -> None:
    # 1 MiB of gzip can hold a gigabyte: what is decoded stops where reading would have.
    packed = gzip.compress(b"x" * (64 << 20))  # 64 MiB of one letter, about 64 KiB packed
    tracemalloc.start()
    try:
        error = await _error(500, _Body([packed]), {"content-type": "text/plain", "content-encoding": "gzip"})
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert error.status == 500 and isinstance(error.body, str) and len(error.body) == 1 << 20
    assert peak < 24 << 20  # never the whole 64 MiB


@pytest.mark.parametrize(
    ("cls", "event"),
    [
        (AnthropicModel, ("error", {"type": "error", "error": "Upstream overloaded, try again"})),
        (OpenAIResponsesModel, (None, {"type": "error", "error": "Upstream overloaded, try again"})),
        (OpenAIChatModel, (None, {"error": "Upstream overloaded, try again"})),
    ],
    ids=["anthropic", "responses", "chat"],
)
async def test_an_error_event_whose_error_is_a_string_says_it(cls: type[Any], event: tuple[str | None, Any]) -> None:
    # A proxy's error event with the error as words, not an object: they are the message.
    server = MockServer(sse(event))
    async with server.client() as client:
        with pytest.raises(ProviderStreamError, match="Upstream overloaded, try again"):
            await collect(cls("m", api_key=API_KEY, http_client=client))
