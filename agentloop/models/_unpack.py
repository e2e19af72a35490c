"""Decoding a compressed response body as it streams (``gzip``, ``deflate``, ``br``, ``zstd``).

The models ask for ``identity``; a proxy may compress the body anyway. httpx's decoding reader
(`httpx.Response.aiter_bytes`) stacks async generators, and the inner ones a reader leaves
suspended (it stopped at the terminator, an abort, a corrupt body) are closed later by tasks of
their own, after the response was handed back. Decoding here, over the transport stream the
driver reads and closes itself, leaves nothing behind. ``br`` and ``zstd`` take an optional
package (``brotli`` or ``brotlicffi``, ``zstandard``), imported when a body needs it; without it
the body is a `MissingDecoder` error that names the encoding and the package. An encoding name
this module does not know is passed over, as httpx does: the body goes on as it came.

A body is decoded a bounded step at a time, each step only when the reader took the one before,
so the reader's size limits stop a compression bomb before it is inflated: a few KiB of gzip can
decode to a hundred MiB, of ``br`` or ``zstd`` to gigabytes. Only an old ``brotli`` or
``brotlicffi`` (before 1.2, without ``output_buffer_limit``) decodes each read whole.
"""

from __future__ import annotations

import importlib
import zlib
from collections.abc import Iterator, Mapping
from typing import Any, Protocol

import httpx

__all__ = ["DECODED_CHUNK", "MissingDecoder", "Unpacker", "unpacker"]

#: The largest piece of decoded body handed on at once, and the most one step of a decoder
#: makes (zlib's ``max_length``, brotli's ``output_buffer_limit``): one network read of gzip may
#: decode to a hundred megabytes (of zeros, of blank lines), never held whole here.
DECODED_CHUNK = 64 << 10

_GZIP = zlib.MAX_WBITS | 16
_ZLIB = zlib.MAX_WBITS
_RAW = -zlib.MAX_WBITS


class _Layer:
    """One ``content-encoding``. ``deflate`` is a zlib stream, or a raw one from servers that
    read the name literally: its first two bytes (a zlib header, or not) tell which. Each step
    makes at most `DECODED_CHUNK` bytes; what it leaves of the input (``unconsumed_tail``) goes
    to the next."""

    __slots__ = ("_first", "_held", "_inflate", "_name")

    def __init__(self, name: str) -> None:
        self._name = name
        self._first = name == "deflate"
        self._held = b""  # a first read of one byte, too short to tell a zlib header
        self._inflate = zlib.decompressobj(_GZIP if name != "deflate" else _ZLIB)

    def decode(self, data: bytes) -> Iterator[bytes]:
        if self._first:
            data, self._held = self._held + data, b""
            if len(data) < 2:
                self._held = data
                return
        out = self._step(data)
        while True:
            if out:
                yield out
            rest = self._inflate.unconsumed_tail
            if not rest and len(out) < DECODED_CHUNK:  # all input taken, no output held back
                return
            out = self._step(rest)

    def _step(self, data: bytes) -> bytes:
        first, self._first = self._first, False
        try:
            return self._inflate.decompress(data, DECODED_CHUNK)
        except zlib.error as exc:
            if first:
                self._inflate = zlib.decompressobj(_RAW)
                return self._step(data)
            raise httpx.DecodingError(f"{self._name}: {exc}") from None

    def flush(self) -> Iterator[bytes]:
        if self._held:  # a body of one byte: cut, as zlib takes a cut body (no output, no error)
            held, self._held = self._held, b""
            self._step(held)
        try:
            rest = self._inflate.flush()  # small: `decode` leaves no input and no output behind
        except zlib.error as exc:
            raise httpx.DecodingError(f"{self._name}: {exc}") from None
        if rest:
            yield rest


class _Brotli:
    """``br``, with the ``brotli`` package (its decompressor's ``process``, and ``is_finished``
    to say whether the body ended whole) or ``brotlicffi`` (``process`` too from 1.2 on, else
    ``decompress``; and ``finish``). From brotli 1.2 and brotlicffi 1.2 on (they have
    ``can_accept_more_data``), each step makes about `DECODED_CHUNK` bytes at most
    (``output_buffer_limit``); an older package decodes each read whole, unbounded."""

    __slots__ = ("_accepts", "_decompress", "_decompressor", "_error", "_seen")

    def __init__(self, module: Any) -> None:
        self._decompressor = module.Decompressor()
        self._accepts = getattr(self._decompressor, "can_accept_more_data", None)
        bounded = self._accepts is not None  # then ``process`` takes ``output_buffer_limit``
        unbounded = getattr(self._decompressor, "decompress", None)
        self._decompress = self._decompressor.process if bounded or unbounded is None else unbounded
        self._error: type[BaseException] = getattr(module, "error", Exception)
        self._seen = False

    def decode(self, data: bytes) -> Iterator[bytes]:
        if not data:
            return
        self._seen = True
        try:
            if self._accepts is None:
                yield bytes(self._decompress(data))
                return
            yield from self._steps(data)
        except self._error as exc:
            raise httpx.DecodingError(f"br: {exc}") from None

    def _steps(self, data: bytes) -> Iterator[bytes]:
        """Bounded steps, on until the decompressor takes input again and has nothing left to
        give (brotli's may say it takes input while it still holds output)."""
        accepts = self._accepts
        assert accepts is not None
        out = bytes(self._decompress(data, output_buffer_limit=DECODED_CHUNK))
        while out or not accepts():
            if out:
                yield out
            out = bytes(self._decompress(b"", output_buffer_limit=DECODED_CHUNK))
            if not out and not accepts():
                raise httpx.DecodingError("br: the decoder neither gives output nor takes input")

    def flush(self) -> Iterator[bytes]:
        if not self._seen:
            return
        finished = getattr(self._decompressor, "is_finished", None)  # brotli's
        if finished is not None and not finished():
            raise httpx.DecodingError("br: the body ended inside the stream")
        finish = getattr(self._decompressor, "finish", None)  # brotlicffi's
        try:
            rest = bytes(finish()) if finish is not None else b""
        except self._error as exc:
            raise httpx.DecodingError(f"br: {exc}") from None
        if rest:
            yield rest


#: How much of a zstd body is given to ``zstandard``'s decompressor at once: it takes no output
#: bound, and a block of up to 128 KiB of output can be written in 4 bytes, so 32 bytes of input
#: make at most about 1 MiB (an event of a compressed stream of text is a few such calls).
_ZSTD_SLICE = 32


class _Zstd:
    """``zstd``, with the ``zstandard`` package; a body may hold several frames, one after the
    other, each decoded by a decompressor of its own. Given `_ZSTD_SLICE` bytes at a time, each
    step makes at most about 1 MiB."""

    __slots__ = ("_error", "_factory", "_frame", "_seen")

    def __init__(self, module: Any) -> None:
        self._factory = module.ZstdDecompressor()
        self._frame = self._factory.decompressobj()
        self._error: type[BaseException] = getattr(module, "ZstdError", Exception)
        self._seen = False

    def decode(self, data: bytes) -> Iterator[bytes]:
        view = memoryview(data)
        try:
            for start in range(0, len(data), _ZSTD_SLICE):
                yield from self._slice(bytes(view[start : start + _ZSTD_SLICE]))
        except self._error as exc:
            raise httpx.DecodingError(f"zstd: {exc}") from None

    def _slice(self, data: bytes) -> Iterator[bytes]:
        while data:
            self._seen = True
            out = bytes(self._frame.decompress(data))
            if out:
                yield out
            data = bytes(self._frame.unused_data) if self._frame.eof else b""
            if data:
                self._frame = self._factory.decompressobj()

    def flush(self) -> Iterator[bytes]:
        if self._seen and not self._frame.eof:
            raise httpx.DecodingError("zstd: the body ended inside a frame")
        yield from ()


class _Decoder(Protocol):
    def decode(self, data: bytes) -> Iterator[bytes]: ...
    def flush(self) -> Iterator[bytes]: ...


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
        """The decoded bytes ``data`` gives, in pieces of at most `DECODED_CHUNK`, each decoded
        only when the one before was taken: a reader that stops (a size limit) stops the
        decoding. Raises `httpx.DecodingError` for a body that is not what its encoding says."""
        return _pieces_of(_through(self._layers, data))

    def flush(self) -> Iterator[bytes]:
        """What is left once the body ended, as `decode` gives it."""
        return _pieces_of(self._flushed())

    def _flushed(self) -> Iterator[bytes]:
        layers = self._layers
        for at, layer in enumerate(layers):
            for piece in layer.flush():
                yield from _through(layers[at + 1 :], piece)


def _through(layers: list[_Decoder], data: bytes) -> Iterator[bytes]:
    """``data`` decoded by each of ``layers`` in turn, a step at a time."""
    if len(layers) == 1:
        yield from layers[0].decode(data)
        return
    for piece in layers[0].decode(data):
        yield from _through(layers[1:], piece)


def _pieces_of(decoded: Iterator[bytes]) -> Iterator[bytes]:
    for data in decoded:
        if len(data) <= DECODED_CHUNK:
            yield data
        else:
            yield from _pieces(data)


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
