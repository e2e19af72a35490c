"""Error responses as servers and proxies really send them: cut, huge, HTML, other charsets."""

from __future__ import annotations

import gzip
from collections.abc import AsyncIterator

import httpx
import pytest
from _models_support import API_KEY, collect

from agentloop._errors import ProviderStatusError
from agentloop.models import AnthropicModel, OpenAIChatModel


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


@pytest.mark.parametrize("fail", [httpx.ReadError("connection reset"), httpx.RemoteProtocolError("peer closed")])
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
