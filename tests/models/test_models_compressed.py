"""Compression bombs: a body (or an error body) a proxy compressed, which decodes to far more
than any answer holds, is decoded in bounded steps and stopped by the usual size limits, never
inflated whole in memory first."""

from __future__ import annotations

import sys
import tracemalloc
import types
import zlib
from collections.abc import AsyncIterator
from typing import Any

import httpx
import pytest
from _models_support import API_KEY, MockServer, collect
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from agentloop._errors import ProviderStatusError, StreamProtocolError
from agentloop.models import OpenAIChatModel
from agentloop.models._sse import MAX_EVENT_BYTES
from agentloop.models._unpack import DECODED_CHUNK, unpacker

_ZEROS = bytes(1 << 20)


def _zeros_packed(mib: int, wbits: int) -> bytes:
    """``mib`` MiB of zero bytes, compressed by zlib (``wbits``: 31 gzip, 15 zlib), without the
    end of the stream: each MiB after the first is one independent segment, repeated, so the
    bomb is made without compressing all of it."""
    packer = zlib.compressobj(9, zlib.DEFLATED, wbits)
    first = packer.compress(_ZEROS) + packer.flush(zlib.Z_FULL_FLUSH)
    again = packer.compress(_ZEROS) + packer.flush(zlib.Z_FULL_FLUSH)
    return first + again * (mib - 1)


class _BoundedBrotli:
    """`brotli.Decompressor` (1.2 and later, and brotlicffi's): ``process`` with an
    ``output_buffer_limit``, ``can_accept_more_data``, ``is_finished``. Like brotli's, it may
    still hold output when it says it can take more data."""

    def __init__(self) -> None:
        self._inflate = zlib.decompressobj()

    def process(self, data: bytes, output_buffer_limit: int | None = None) -> bytes:
        if data and self._inflate.unconsumed_tail:
            raise zlib.error("brotli: input given while output is pending")
        out = self._inflate.decompress(self._inflate.unconsumed_tail + data, output_buffer_limit or 0)
        _sizes.append(len(out))
        return out

    def can_accept_more_data(self) -> bool:
        return not self._inflate.unconsumed_tail

    def is_finished(self) -> bool:
        return self._inflate.eof


class _Zstd:
    """`zstandard.ZstdDecompressor`: its ``decompressobj`` takes no output bound."""

    def decompressobj(self) -> Any:
        return _ZstdFrame()


class _ZstdFrame:
    def __init__(self) -> None:
        self._inflate = zlib.decompressobj()

    def decompress(self, data: bytes) -> bytes:
        out = self._inflate.decompress(data)
        _sizes.append(len(out))
        return out

    @property
    def eof(self) -> bool:
        return self._inflate.eof

    @property
    def unused_data(self) -> bytes:
        return self._inflate.unused_data


#: The size of each output of the stand-in decompressors, to check the steps are bounded.
_sizes: list[int] = []


@pytest.fixture(autouse=True)
def _packages(monkeypatch: pytest.MonkeyPatch) -> None:
    _sizes.clear()
    monkeypatch.setitem(sys.modules, "brotli", types.SimpleNamespace(Decompressor=_BoundedBrotli, error=zlib.error))
    monkeypatch.setitem(sys.modules, "brotlicffi", None)
    monkeypatch.setitem(sys.modules, "zstandard", types.SimpleNamespace(ZstdDecompressor=_Zstd, ZstdError=zlib.error))


_WBITS = {"gzip": 31, "deflate": 15, "br": 15, "zstd": 15}


@pytest.mark.parametrize("encoding", ["gzip", "deflate", "br", "zstd"])
async def test_a_bomb_in_one_read_is_stopped_by_the_body_limit_holding_a_few_megabytes(encoding: str) -> None:
    # 100 KiB read at once held 100 MiB of zeros, inflated whole by one call before any limit
    # was checked.
    packed = _zeros_packed(100, _WBITS[encoding])
    server = MockServer([packed], headers={"content-type": "application/json", "content-encoding": encoding})
    async with server.client() as client:
        model = OpenAIChatModel("m", api_key=API_KEY, http_client=client)
        tracemalloc.start()
        try:
            with pytest.raises(StreamProtocolError, match="more than 1 MiB of application/json") as info:
                await collect(model)
            peak = tracemalloc.get_traced_memory()[1]
        finally:
            tracemalloc.stop()
    assert not info.value.retryable and server.streams[0].closed
    assert peak < 6 << 20  # the 1 MiB the limit keeps to explain a body, and a few copies of it
    assert max(_sizes, default=0) <= 1 << 20  # each step of a package's decompressor, bounded


async def test_a_bomb_sent_as_an_event_stream_is_stopped_at_the_event_bound() -> None:
    # A stream may have one long first event, so the body is read on past 1 MiB: what holds it
    # is the event decoder's bound, not the size of the bomb.
    packed = _zeros_packed(256, 31)
    server = MockServer([packed], headers={"content-encoding": "gzip"})
    async with server.client() as client:
        model = OpenAIChatModel("m", api_key=API_KEY, http_client=client)
        tracemalloc.start()
        try:
            with pytest.raises(StreamProtocolError, match="without an event completed") as info:
                await collect(model)
            peak = tracemalloc.get_traced_memory()[1]
        finally:
            tracemalloc.stop()
    assert not info.value.retryable and server.streams[0].closed
    assert peak < MAX_EVENT_BYTES + (8 << 20)


_ENCODINGS = [("gzip", 31), ("deflate", 15), ("deflate", -15), ("br", 15), ("zstd", 15)]
#: Text, and runs of zeros that decode to many times their size.
_PARTS = st.one_of(st.binary(max_size=3000), st.integers(1, 400).map(lambda kib: bytes(kib << 10)))


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(st.sampled_from(_ENCODINGS), st.lists(_PARTS, max_size=6), st.data())
def test_a_compressed_body_in_any_reads_decodes_to_itself_in_bounded_pieces(
    encoding: tuple[str, int], parts: list[bytes], data: st.DataObject
) -> None:
    name, wbits = encoding
    plain = b"".join(parts)
    packer = zlib.compressobj(6, zlib.DEFLATED, wbits)
    packed = packer.compress(plain) + packer.flush()
    cuts = sorted(data.draw(st.sets(st.integers(1, len(packed) - 1), max_size=20)))
    unpack = unpacker({"content-encoding": name})
    assert unpack is not None
    out: list[bytes] = []
    for start, end in zip([0, *cuts], [*cuts, len(packed)], strict=True):
        out.extend(unpack.decode(packed[start:end]))
    out.extend(unpack.flush())
    assert b"".join(out) == plain
    assert all(0 < len(piece) <= DECODED_CHUNK for piece in out)


class _Body(httpx.AsyncByteStream):
    def __init__(self, chunks: list[bytes]) -> None:
        self.chunks = chunks
        self.closed = False

    async def __aiter__(self) -> AsyncIterator[bytes]:
        for chunk in self.chunks:
            yield chunk

    async def aclose(self) -> None:
        self.closed = True


async def _status_error(status: int, body: _Body, headers: dict[str, str]) -> ProviderStatusError:
    def handler(request: httpx.Request) -> httpx.Response:
        return httpx.Response(status, headers=headers, stream=body)

    async with httpx.AsyncClient(transport=httpx.MockTransport(handler)) as client:
        with pytest.raises(ProviderStatusError) as caught:
            await collect(OpenAIChatModel("m", api_key=API_KEY, http_client=client))
    assert body.closed
    return caught.value


@pytest.mark.parametrize("encoding", ["br", "zstd"])
async def test_a_br_or_zstd_error_body_is_decoded_as_the_stream_is(encoding: str) -> None:
    # httpx's own decoders read it: without their package (or with one httpx does not use) the
    # error quoted the compressed bytes.
    packed = zlib.compress(b'{"error": {"message": "model not found", "type": "invalid_request_error"}}')
    error = await _status_error(404, _Body([packed]), {"content-type": "application/json", "content-encoding": encoding})
    assert error.status == 404 and not error.retryable
    assert error.message == "openai HTTP 404: model not found"


@pytest.mark.parametrize("encoding", ["gzip", "br", "zstd"])
async def test_an_error_body_bomb_is_decoded_in_bounded_steps_up_to_its_limit(encoding: str) -> None:
    packer = zlib.compressobj(9, zlib.DEFLATED, _WBITS[encoding])
    packed = packer.compress(b"x" * (64 << 20)) + packer.flush()
    headers = {"content-type": "text/plain", "content-encoding": encoding}
    tracemalloc.start()
    try:
        error = await _status_error(500, _Body([packed]), headers)
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert error.status == 500 and isinstance(error.body, str) and error.body == "x" * (1 << 20)
    assert peak < 8 << 20
    assert max(_sizes, default=0) <= 1 << 20


async def test_an_error_body_in_an_encoding_with_no_package_is_left_out() -> None:
    packed = zlib.compress(b'{"error": {"message": "model not found"}}')
    sys.modules["zstandard"] = None  # type: ignore[assignment]  # undone by the fixture
    error = await _status_error(404, _Body([packed]), {"content-type": "application/json", "content-encoding": "zstd"})
    assert error.status == 404 and not error.retryable
    assert error.message == "openai HTTP 404: Not Found"  # the status says it; the bytes would not


@pytest.mark.parametrize("wbits", [15, -15], ids=["zlib", "raw"])
def test_a_deflate_body_whose_first_read_is_one_byte_is_decoded(wbits: int) -> None:
    # Whether a deflate body is a zlib stream or a raw one was told by the first read alone:
    # a single byte passes for the start of a zlib header, and the raw stream then failed.
    plain = b'data: {"n": 1}\n\n'
    packer = zlib.compressobj(6, zlib.DEFLATED, wbits)
    packed = packer.compress(plain) + packer.flush()
    unpack = unpacker({"content-encoding": "deflate"})
    assert unpack is not None
    out = [*unpack.decode(packed[:1]), *unpack.decode(packed[1:]), *unpack.flush()]
    assert b"".join(out) == plain
