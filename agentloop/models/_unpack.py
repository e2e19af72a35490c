"""Decoding a compressed response body as it streams (``gzip``, ``deflate``).

The models ask for ``identity``; a proxy may compress the body anyway. httpx's decoding reader
(`httpx.Response.aiter_bytes`) stacks async generators, and the inner ones a reader leaves
suspended (it stopped at the terminator, an abort, a corrupt body) are closed later by tasks of
their own, after the response was handed back. Decoding here, over the transport stream the
driver reads and closes itself, leaves nothing behind.
"""

from __future__ import annotations

import zlib
from collections.abc import Iterator, Mapping

import httpx

__all__ = ["DECODED_CHUNK", "Unpacker", "plain", "unpacker"]

#: The largest piece of decoded body handed on at once: one network read of gzip may decode to
#: tens of megabytes (of blank lines, say), split into lines all at once otherwise.
DECODED_CHUNK = 64 << 10

_GZIP = zlib.MAX_WBITS | 16
_ZLIB = zlib.MAX_WBITS
_RAW = -zlib.MAX_WBITS


class _Layer:
    """One ``content-encoding``. ``deflate`` is a zlib stream, or a raw one from servers that
    read the name literally: the first piece tells which."""

    __slots__ = ("_first", "_inflate", "_name")

    def __init__(self, name: str) -> None:
        self._name = name
        self._first = name == "deflate"
        self._inflate = zlib.decompressobj(_GZIP if name != "deflate" else _ZLIB)

    def decode(self, data: bytes) -> bytes:
        first, self._first = self._first, False
        try:
            return self._inflate.decompress(data)
        except zlib.error as exc:
            if first:
                self._inflate = zlib.decompressobj(_RAW)
                return self.decode(data)
            raise httpx.DecodingError(f"{self._name}: {exc}") from None

    def flush(self) -> bytes:
        try:
            return self._inflate.flush()
        except zlib.error as exc:
            raise httpx.DecodingError(f"{self._name}: {exc}") from None


class Unpacker:
    """The decoders of a body's encodings, applied in the reverse of the order they are named."""

    __slots__ = ("_layers",)

    def __init__(self, names: list[str]) -> None:
        self._layers = [_Layer(name) for name in reversed(names)]

    def decode(self, data: bytes) -> Iterator[bytes]:
        """The decoded bytes ``data`` gives, in pieces of at most `DECODED_CHUNK`. Raises
        `httpx.DecodingError` for a body that is not what its encoding says."""
        for layer in self._layers:
            data = layer.decode(data)
        return _pieces(data)

    def flush(self) -> Iterator[bytes]:
        """What is left once the body ended."""
        data = b""
        for layer in self._layers:
            data = layer.decode(data) + layer.flush() if data else layer.flush()
        return _pieces(data)


def _pieces(data: bytes) -> Iterator[bytes]:
    view = memoryview(data)
    for start in range(0, len(data), DECODED_CHUNK):
        yield bytes(view[start : start + DECODED_CHUNK])


def unpacker(headers: Mapping[str, str]) -> Unpacker | None:
    """The `Unpacker` for a response's ``content-encoding``; None when the body is as sent (no
    encoding, ``identity``) or uses one this module does not decode (see `plain`)."""
    names = [n.strip().lower() for n in headers.get("content-encoding", "").split(",")]
    names = [n for n in names if n and n != "identity"]
    if not names or any(n not in ("gzip", "x-gzip", "deflate") for n in names):
        return None
    return Unpacker(names)


def plain(headers: Mapping[str, str]) -> bool:
    """Whether a response's body is as sent: no ``content-encoding``, or ``identity``."""
    return headers.get("content-encoding", "identity").strip().lower() in ("", "identity")
