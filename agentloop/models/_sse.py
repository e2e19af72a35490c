"""An incremental Server-Sent Events decoder (WHATWG event-stream rules).

Feed it bytes in any chunking; it returns the events completed by each chunk.

- Lines end with ``\\r\\n``, ``\\n`` or ``\\r``; a ``\\r\\n`` split across two
  chunks is one line break. UTF-8 split across chunks is decoded correctly
  (invalid bytes become U+FFFD). One byte order mark at the very start of the
  stream is dropped (a .NET server writing UTF-8 "with BOM"); otherwise it would
  be part of the first field name, and the first event would be lost.
- ``field: value``: one leading space is stripped from the value; several
  ``data`` lines are joined with ``\\n``; ``event``, ``id`` and ``retry`` are
  parsed; lines starting with ``:`` are comments; other fields are ignored.
- An event is dispatched only on a blank line, and only if it had a ``data``
  line. An event still open at EOF is dropped (callers then see no terminator).
- ``max_event_bytes`` (default `MAX_EVENT_BYTES`, 64 MiB) bounds what is held while no event
  completes: a line that never ends, ``data`` lines never followed by a blank line. Past it,
  `feed` raises `StreamProtocolError` (not retryable) rather than buffer without end.

``error_field=True`` is a documented extension for old llama.cpp servers, which
send a mid-stream failure as an ``error: {json}`` *field* line: the value is
kept as data and the event is dispatched with ``event == "error"``.
"""

from __future__ import annotations

import codecs
from dataclasses import dataclass

from .._checks import count
from .._errors import StreamProtocolError

__all__ = ["MAX_EVENT_BYTES", "SSEDecoder", "ServerSentEvent"]

#: The most bytes `SSEDecoder` takes while no event completes (far above any real event: a
#: Responses ``response.completed`` repeats the whole output, a few MB at most).
MAX_EVENT_BYTES = 64 * 1024 * 1024


@dataclass(slots=True)
class ServerSentEvent:
    """One dispatched event. ``event`` is None when the stream sent no ``event:`` line."""

    data: str
    event: str | None = None
    id: str | None = None
    retry: int | None = None


class SSEDecoder:
    """Turn a byte stream into `ServerSentEvent`s, chunk by chunk.

    ``last_event_id`` and ``retry`` keep the latest values the stream set. ``unterminated`` is
    True once `close` dropped an event whose lines had all ended but no blank line followed (a
    recorded stream whose file lost its last empty line, or a connection cut between an event's
    lines), False for one cut inside a line; ``dropped`` is that event (None otherwise). ``max_event_bytes``:
    how many bytes may come while no event completes (None: 64 MiB, `MAX_EVENT_BYTES`; see the
    module's docstring; TypeError for what is not a whole number, ValueError below 1). ``error_field=True`` reads an ``error:`` field line (old llama.cpp
    servers' mid-stream failure) as an event of type ``"error"`` with the value as its data.
    """

    __slots__ = (
        "_data",
        "_decoder",
        "_error_field",
        "_event",
        "_has_data",
        "_pending",
        "_skip_lf",
        "_tail",
        "dropped",
        "last_event_id",
        "max_event_bytes",
        "retry",
        "unterminated",
    )

    def __init__(self, *, error_field: bool = False, max_event_bytes: int | None = None) -> None:
        bound = count("max_event_bytes", max_event_bytes, 1)
        self.max_event_bytes: int = MAX_EVENT_BYTES if bound is None else bound
        self._pending = 0  # bytes fed since the last event completed
        self._decoder = codecs.getincrementaldecoder("utf-8-sig")(errors="replace")  # drops a leading BOM
        self._error_field = error_field
        self._tail: list[str] = []  # the pieces of an unterminated line, for the next chunk
        self._skip_lf = False  # the previous chunk ended in "\r": drop a leading "\n"
        self._data: list[str] = []
        self._has_data = False
        self._event: str | None = None
        self.last_event_id: str | None = None
        self.retry: int | None = None
        self.unterminated = False
        self.dropped: ServerSentEvent | None = None

    def feed(self, chunk: bytes) -> list[ServerSentEvent]:
        """Decode ``chunk`` and return the events it completed (often none). Raises
        `StreamProtocolError` once more than ``max_event_bytes`` came with no event completed."""
        self._pending += len(chunk)
        text = self._decoder.decode(chunk)
        if not text:
            return []
        if self._skip_lf:
            self._skip_lf = False
            if text[0] == "\n":
                text = text[1:]
        if "\r" in text:
            self._skip_lf = text[-1] == "\r"
            text = text.replace("\r\n", "\n").replace("\r", "\n")
        if "\n" not in text:  # a long line arriving in many chunks: collect, split once
            self._tail.append(text)
            if self._pending > self.max_event_bytes:
                raise self._endless()
            return []
        if self._tail:
            self._tail.append(text)
            text = "".join(self._tail)
        lines = text.split("\n")
        tail = lines.pop()
        self._tail = [tail] if tail else []
        out: list[ServerSentEvent] = []
        for line in lines:
            if line:
                if line.startswith("data:"):
                    value = line[5:]
                    self._data.append(value[1:] if value[:1] == " " else value)
                    self._has_data = True
                else:
                    self._field(line)
            elif self._has_data:
                out.append(self._dispatch())
            else:
                self._event = None
        if out:
            self._pending = 0
        elif self._pending > self.max_event_bytes:
            raise self._endless()
        return out

    def _endless(self) -> StreamProtocolError:
        self.close()  # what was held goes
        self.unterminated, self.dropped = False, None  # too long to hold, not unended
        return StreamProtocolError(
            f"event stream: more than {self.max_event_bytes} bytes without an event completed (a line or "
            "an event that never ends): not a stream this decoder can hold"
        )

    def close(self) -> list[ServerSentEvent]:
        """End of stream: an event without its blank line is dropped (WHATWG)."""
        self._decoder.decode(b"", final=True)
        self.unterminated = self._has_data and not self._tail
        self.dropped = self._dispatch() if self.unterminated else None
        self._tail = []
        self._data = []
        self._has_data = False
        self._event = None
        self._pending = 0
        return []

    def _dispatch(self) -> ServerSentEvent:
        data = self._data
        ev = ServerSentEvent(data[0] if len(data) == 1 else "\n".join(data), self._event, self.last_event_id)
        self._data = []
        self._has_data = False
        self._event = None
        return ev

    def _field(self, line: str) -> None:
        if line[0] == ":":
            return  # comment
        name, colon, value = line.partition(":")
        if colon and value[:1] == " ":
            value = value[1:]
        if name == "event":
            self._event = value
        elif name == "data":  # "data" with no colon: an empty data line
            self._data.append(value)
            self._has_data = True
        elif name == "id":
            if "\0" not in value:
                self.last_event_id = value
        elif name == "retry":
            if value.isascii() and value.isdigit():
                self.retry = int(value)
        elif name == "error" and self._error_field:
            self._event = "error"
            self._data.append(value)
            self._has_data = True
