"""Decoding a compressed response body as it streams (``gzip``, ``deflate``, ``br``, ``zstd``).

The models ask for ``identity``; a proxy may compress the body anyway. httpx's decoding reader
(`httpx.Response.aiter_bytes`) stacks async generators, and the inner ones a reader leaves
suspended (it stopped at the terminator, an abort, a corrupt body) are closed later by tasks of
their own, after the response was handed back. Decoding here, over the transport stream the
driver reads and closes itself, leaves nothing behind. ``br`` and ``zstd`` take an optional
package (``brotli`` or ``brotlicffi``, ``zstandard``), imported when a body needs it; without it
the body is a `MissingDecoder` error that names the encoding and the package. An encoding name
this module does not know is passed over, as httpx does: the body goes on as it came.
"""

from __future__ import annotations

import importlib
import zlib
from collections.abc import Iterator, Mapping
from typing import Any, Protocol

import httpx

__all__ = ["DECODED_CHUNK", "MissingDecoder", "Unpacker", "unpacker"]

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


class _Brotli:
    """``br``, with the ``brotli`` package (its decompressor's ``process``, and ``is_finished``
    to say whether the body ended whole) or ``brotlicffi`` (``decompress``, and ``finish``)."""

    __slots__ = ("_decompress", "_decompressor", "_error", "_seen")

    def __init__(self, module: Any) -> None:
        self._decompressor = module.Decompressor()
        self._decompress = getattr(self._decompressor, "decompress", None) or self._decompressor.process
        self._error: type[BaseException] = getattr(module, "error", Exception)
        self._seen = False

    def decode(self, data: bytes) -> bytes:
        if not data:
            return b""
        self._seen = True
        try:
            return bytes(self._decompress(data))
        except self._error as exc:
            raise httpx.DecodingError(f"br: {exc}") from None

    def flush(self) -> bytes:
        if not self._seen:
            return b""
        finished = getattr(self._decompressor, "is_finished", None)  # brotli's
        if finished is not None and not finished():
            raise httpx.DecodingError("br: the body ended inside the stream")
        finish = getattr(self._decompressor, "finish", None)  # brotlicffi's
        try:
            return bytes(finish()) if finish is not None else b""
        except self._error as exc:
            raise httpx.DecodingError(f"br: {exc}") from None


class _Zstd:
    """``zstd``, with the ``zstandard`` package; a body may hold several frames, one after the
    other, each decoded by a decompressor of its own."""

    __slots__ = ("_error", "_factory", "_frame", "_seen")

    def __init__(self, module: Any) -> None:
        self._factory = module.ZstdDecompressor()
        self._frame = self._factory.decompressobj()
        self._error: type[BaseException] = getattr(module, "ZstdError", Exception)
        self._seen = False

    def decode(self, data: bytes) -> bytes:
        out: list[bytes] = []
        try:
            while data:
                self._seen = True
                out.append(bytes(self._frame.decompress(data)))
                data = bytes(self._frame.unused_data) if self._frame.eof else b""
                if data:
                    self._frame = self._factory.decompressobj()
        except self._error as exc:
            raise httpx.DecodingError(f"zstd: {exc}") from None
        return b"".join(out)

    def flush(self) -> bytes:
        if self._seen and not self._frame.eof:
            raise httpx.DecodingError("zstd: the body ended inside a frame")
        return b""


class _Decoder(Protocol):
    def decode(self, data: bytes) -> bytes: ...
    def flush(self) -> bytes: ...


class MissingDecoder(httpx.DecodingError):
    """A body in an encoding whose optional package is not installed: every attempt would
    get the same body, so it is not worth another (`connection_error`)."""


#: The optional packages of an encoding, in the order they are tried, and what to install.
_PACKAGES = {"br": (("brotli", "brotlicffi"), "brotli"), "zstd": (("zstandard",), "zstandard")}


def _optional(name: str) -> _Decoder:
    """The decoder of ``br`` or ``zstd``, made with the first of its packages that imports;
    raises `MissingDecoder` when none does."""
    modules, install = _PACKAGES[name]
    for module in modules:
        try:
            found = importlib.import_module(module)
        except ImportError:
            continue
        return _Brotli(found) if name == "br" else _Zstd(found)
    raise MissingDecoder(
        f"the body came with content-encoding {name} (a proxy compressed it, though identity was "
        f"asked for), which needs a package that is not installed: pip install {install}"
    )


def _decoder(name: str) -> _Decoder:
    return _optional(name) if name in _PACKAGES else _Layer(name)


class Unpacker:
    """The decoders of a body's encodings, applied in the reverse of the order they are named."""

    __slots__ = ("_layers",)

    def __init__(self, names: list[str]) -> None:
        self._layers: list[_Decoder] = [_decoder(name) for name in reversed(names)]

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


#: The encodings decoded here; any other name (``identity``, one nobody knows) is passed over.
_KNOWN = frozenset({"gzip", "x-gzip", "deflate", "br", "zstd"})


def unpacker(headers: Mapping[str, str]) -> Unpacker | None:
    """The `Unpacker` for a response's ``content-encoding``; None when the body is as sent (no
    encoding, ``identity``, or only names this module does not know, passed over as httpx
    does). Raises `MissingDecoder` for ``br`` or ``zstd`` without its package."""
    names = [n.strip().lower() for n in headers.get("content-encoding", "").split(",")]
    names = [n for n in names if n in _KNOWN]
    return Unpacker(names) if names else None
