"""The streaming loop shared by the HTTP providers, and transcript helpers.

`run_stream` opens the response inside the async generator (so closing or
cancelling the generator closes the response), decodes SSE, hands each event
to a per-API `Mapper` and yields the `StreamEvent`s it returns. It checks the
abort signal between events and raises `StreamProtocolError` if the body ends
before the mapper saw its terminator.
"""

from __future__ import annotations

import asyncio
import json
import logging
import math
import re
import time
from collections.abc import AsyncGenerator, AsyncIterator, Awaitable, Callable, Collection, Mapping, Sequence
from typing import Any, Protocol, cast

import httpx

from .._abort import AbortSignal, cancels_asked
from .._errors import AbortError, ModelError, ProviderConnectionError, StreamProtocolError
from .._jsondepth import TOO_DEEP, json_too_deep
from .._messages import (
    Block,
    Message,
    ProviderBlock,
    RedactedThinkingBlock,
    TextBlock,
    ThinkingBlock,
    ToolResultBlock,
    ToolUseBlock,
)
from .._model import StreamEvent
from .._tools import fitted
from .._unicode import scrub_json
from ._errbody import PAGE_TYPES, decode_body, is_page, media_type, page_text
from ._http import Connection, Redactor, document_error
from ._http._abortable import aclose_keeping_cancel
from ._sse import ServerSentEvent, SSEDecoder
from ._unpack import unpacker

__all__ = [
    "END_GRACE",
    "OPENAI_TOOL_CHOICES",
    "Mapper",
    "Prepared",
    "Turn",
    "check_end_grace",
    "count_tokens",
    "dumps_input",
    "excerpt",
    "loads",
    "not_a_str",
    "run_stream",
    "turns",
    "wire_id",
    "wire_ids",
]

_scan_once: Callable[[str, int], tuple[Any, int]] = json.JSONDecoder().scan_once  # type: ignore[attr-defined]

log = logging.getLogger("agentloop")


def loads(text: str) -> Any:
    """`json.loads` for the hot path: same results and errors, less per-call overhead
    (it skips the whitespace handling that SSE data payloads never need).

    Raises `ValueError` (`json.JSONDecodeError`) for invalid JSON, and for JSON nested
    more than `MAX_JSON_DEPTH` levels (never `RecursionError`). A lone UTF-16
    surrogate escape (``"\\ud83d"`` without its pair) decodes to U+FFFD, never to a
    string that UTF-8 cannot encode (see `agentloop._unicode`).
    """
    if json_too_deep(text):  # `check_depth`, without a call more per event on the hot path
        raise ValueError(TOO_DEEP)
    try:
        try:
            value, end = _scan_once(text, 0)
        except StopIteration:
            value, end = json.loads(text), -1  # leading whitespace or invalid: json.loads decides
        if end != -1 and end != len(text) and text[end:].strip():
            value = json.loads(text)  # trailing garbage: raises with json's message
        if "\\u" in text and ("\\ud" in text or "\\uD" in text):  # a UTF-16 half, maybe without its pair
            value = scrub_json(value)
    except RecursionError:  # arrays or objects nested past the interpreter's recursion limit
        raise ValueError(TOO_DEEP) from None
    return value



def made_elsewhere(made_by: str | None, origin: str | None) -> bool:
    """Whether a thinking block made by ``made_by`` (its ``origin``) came from another server
    than ``origin`` (the one a request goes to): both known, and not the same. Such a block is
    never sent there: its signature or reasoning id can be checked only where it was made."""
    return origin is not None and made_by is not None and made_by != origin


class UsageReader:
    """Reads the usage objects of one response, for `count_tokens`. Malformed usage (a usage or a
    part of it that is not an object, a count that is not a number) is a provider's bug, sent
    again on every retry, so it is no reason to retry: the response is kept, the counts it would
    give are unknown (0), and one warning per response names it, however many usage objects
    (one per chunk, as vLLM sends them) are malformed."""

    __slots__ = ("_stream", "_warned")

    def __init__(self, stream: str) -> None:
        self._stream = stream  # what the warning names: "openai chat stream"
        self._warned = False

    def __call__(self, raw: Any, *paths: str) -> list[Any]:
        """The values at ``paths`` (``"input_tokens"``, ``"input_tokens_details.cached_tokens"``)
        of the usage object ``raw``: None where absent, and where malformed."""
        values, problems = _usage_values(raw, paths)
        if problems and not self._warned:
            self._warned = True
            _warn_malformed(self._stream, problems)
        return values


def usage_fields(raw: Any, stream: str, *paths: str) -> list[Any]:
    """`UsageReader` for a response that has one usage object."""
    return UsageReader(stream)(raw, *paths)


def _usage_values(raw: Any, paths: Sequence[str]) -> tuple[list[Any], list[str]]:
    problems: list[str] = []
    if type(raw) is not dict:
        if raw:  # null, or an empty list where an empty object was meant, is no usage
            problems.append(f"the usage is a {type(raw).__name__}, not an object")
        raw = {}
    values: list[Any] = []
    for path in paths:
        *parents, key = path.split(".")
        obj: dict[str, Any] = raw
        for parent in parents:
            part = obj.get(parent)
            said = f"{parent} is a {type(part).__name__}, not an object"
            if part and type(part) is not dict and said not in problems:
                problems.append(said)
            obj = part if type(part) is dict else {}
        value = obj.get(key)
        if value is not None and not _is_count(value):
            problems.append(f"{key} is {type(value).__name__}, not a count")
            value = None
        values.append(value)
    return values, problems


def _warn_malformed(stream: str, problems: list[str]) -> None:
    log.warning(
        "%s: malformed usage in the response (%s); the token counts it would give are unknown and "
        "counted as 0, so a usage_limit cannot hold while this provider's usage is unreadable; the "
        "response is kept, not retried (the server would send it so again)",
        stream, "; ".join(problems),
    )  # fmt: skip


def _is_count(value: Any) -> bool:
    return (type(value) is int and value >= 0) or (type(value) is float and value.is_integer() and value >= 0)


def count_tokens(value: Any, old: int = 0) -> int:
    """A token count read from a usage object: ``value`` when it is a count (an int, or a
    float with no fraction, above 0), else ``old``. A count of another type (a str, a list)
    would pass into `Usage` and fail the run's sum of usage later, outside error handling."""
    if type(value) is int:
        return value if value > 0 else old
    if type(value) is float and value.is_integer() and value > 0:
        return int(value)
    return old


#: The characters keys and tokens are made of (base64, base64url, hex, JWTs, ``sk-...``).
_TOKEN_RUN = re.compile(r"[A-Za-z0-9_.+/=~-]*")


def excerpt(text: str, limit: int = 200) -> str:
    """``text`` cut to about ``limit`` characters, to quote in an error message.

    Never inside a run of the characters keys and tokens are made of: such a run is kept
    whole (up to 512 characters more), since a secret cut in two would escape the
    scrubbing that replaces every secret the request carried (`Redactor`).
    """
    if len(text) <= limit:
        return text
    end = limit
    if _TOKEN_RUN.fullmatch(text[limit - 1]):
        run = _TOKEN_RUN.match(text, limit)  # never None: the pattern matches the empty string
        end = run.end() if run is not None else limit
    return text[: min(end, limit + 512)]


def not_a_str(where: str, field: str, value: Any, *, retryable: bool = True) -> StreamProtocolError:
    """The error for a ``field`` of an event that should be a str and is ``value``, of another
    type (retryable, as malformed data is, unless ``retryable=False``: a stop reason, which a
    server that sent it so sends so again). Raised by a mapper, where the model's errors are
    scrubbed of its secrets (`run_stream`), rather than passed on in a stream event whose own check
    would reject it outside that scrubbing. ``where``: what was malformed (``"openai chat stream:
    malformed chunk"``)."""
    return StreamProtocolError(
        f"{where}: its {field} is {type(value).__name__}, not a str: {excerpt(repr(value))}", retryable=retryable
    )


#: ``ModelRequest.tool_choice``'s words as both OpenAI APIs (Chat Completions, Responses) spell
#: them: "any" is their "required". A tool name is not here: the two name one tool in shapes of
#: their own (``{"type": "function", "function": {"name": ...}}`` and ``{"type": "function",
#: "name": ...}``), which each request builder writes.
OPENAI_TOOL_CHOICES: Mapping[str, str] = {"auto": "auto", "none": "none", "any": "required", "required": "required"}


def wire_id(tool_id: str, *, max_len: int) -> str:
    """A tool call id as an OpenAI API accepts it back; ``tool_id`` itself when it fits.

    The transcript may hold ids another provider made (a host that switches models, a
    resumed session, an OpenAI-compatible server), and Chat Completions refuses one over
    40 characters, the Responses API one over 64. A longer id is cut to fit and ends in a
    hash of the whole id: the same id always maps to the same wire id (prompt caches hold),
    a call and its result stay paired, and two different ids stay apart. (Anthropic's rule,
    ``^[a-zA-Z0-9_-]+$``, is the tool-name rule: `agentloop._tools.safe_name`.)
    """
    return tool_id if len(tool_id) <= max_len else fitted(tool_id, max_len, safe_chars=False)


def wire_ids(fit: Callable[[str], str], *, max_len: int, safe_chars: bool) -> Callable[[str], str]:
    """For one request: each tool call id as ``fit`` sends it (`wire_id`, or Anthropic's
    `agentloop._tools.safe_name`), kept apart from the others. Fitting keeps two different ids
    apart but for one that is itself what fitting makes of another (``"a.b"`` and its Anthropic
    wire form ``"a_b_2e7336dc8e"``); the id seen later then takes a hash of itself and a count,
    so that no two calls of the request share a wire id. Ids are mapped in the order they first
    appear, so a request's ids are sent as in the requests before it (prompt caches hold)."""
    given: dict[str, str] = {}
    taken: set[str] = set()

    def wire(tool_id: str) -> str:
        out = given.get(tool_id)
        if out is None:
            out, salt = fit(tool_id), 0
            while out in taken:
                salt += 1
                out = fitted(f"{tool_id}#{salt}", max_len, safe_chars=safe_chars)
            given[tool_id] = out
            taken.add(out)
        return out

    return wire


def dumps_input(value: Mapping[str, Any]) -> str:
    """A tool call's input as the JSON text the OpenAI APIs carry in ``arguments``.

    Strict, like the request body around it: raises `ModelError` (not retryable) for a
    value JSON cannot represent (NaN, Infinity, an object), which only a host can put in
    a transcript.
    """
    try:
        return json.dumps(value, allow_nan=False)
    except (TypeError, ValueError) as exc:
        raise ModelError(
            f"request cannot be encoded as JSON ({exc}): a tool_use input holds a value JSON cannot represent"
        ) from None


#: ``(path, headers, body)`` of one request.
Prepared = tuple[str, Mapping[str, str], Mapping[str, Any]]


class Mapper(Protocol):
    """Maps one API's SSE events to `StreamEvent`s.

    ``done`` becomes True once the terminator was seen (the last events
    returned then end with `StreamEnd`); ``terminator`` names it for errors.
    A mapper may also have a ``failure`` (a `ModelError`): set with ``done``, it is
    raised once the events returned with it are out (what a failed response held),
    in place of `StreamEnd`. And an ``at_eof()``, called when the body ends cleanly
    before the terminator: the events it returns (ending with `StreamEnd`) complete the
    stream; None leaves it cut. A mapper with ``at_eof`` may have ``settled`` too: True once the
    answer is whole (``at_eof`` would complete it), so a body held open after it ends after the
    model's grace (`run_stream`); and a ``grace_over()``, called when the grace ran out, before
    ``at_eof``. And a ``redactor`` (None until `run_stream` sets it to the request's), which the
    values of the stream its warnings quote are scrubbed with.
    """

    done: bool
    terminator: str

    def handle(self, sse: ServerSentEvent) -> Sequence[StreamEvent] | None: ...


class _Quoting(Protocol):
    """A `Mapper` with a ``redactor``: `run_stream` gives it the request's, to take the secrets
    out of the values from the stream its warnings quote."""

    redactor: Redactor | None


async def run_stream(
    conn: Connection,
    prepare: Callable[[], Prepared],
    make_mapper: Callable[[str | None], Mapper],
    signal: AbortSignal,
    *,
    error_field: bool = False,
    extra: Collection[str] = (),
    grace: float | None = None,
) -> AsyncIterator[StreamEvent]:
    """Run one streamed request and yield its events.

    Raises `AbortError` when ``signal`` is aborted (checked before the request
    and between events), the errors of `Connection.open`, whatever the mapper
    raises, `StreamProtocolError` (retryable) for a body cut before the terminator,
    and `ProviderConnectionError` (retryable) for a stream that sends only keep-alives
    (comments, pings, events that hold nothing of the answer) for longer than the request's
    read timeout. A body that is one JSON document and no event stream raises what
    `document_error` says instead, and one of more than `_HEAD_LIMIT` bytes with no event,
    unless it says it is an event stream, a `StreamProtocolError` (not retryable) once read
    that far. ``extra``: the names of the model's ``extra_headers`` (see `Connection.open`). ``grace``:
    seconds a body may stay open, sending nothing or only keep-alives, once the mapper's answer is
    whole (its ``settled``) before it ends as if the body had (`Mapper`, ``at_eof``); None: no limit
    but the read timeout's. Never catches `asyncio.CancelledError`.

    Longer than most: it is the generator the model phase awaits for every event, so its
    per-chunk and per-event work is written out here (a helper generator would cost each
    event one more resumption); only what happens once, when the body ends, is `_at_end`.
    """
    path, headers, body = prepare()
    if signal.aborted:
        raise AbortError(signal.reason or "cancel")
    async with conn.open(path, headers, body, signal, extra=extra) as response:
        redactor = conn.redactor(headers, response.request)
        mapper = make_mapper(response.headers.get(conn.request_id_header))
        if hasattr(mapper, "redactor"):  # one whose warnings quote the server's values
            cast(_Quoting, mapper).redactor = redactor
        decoder = SSEDecoder(error_field=error_field)
        feed, handle = decoder.feed, mapper.handle
        chunks = _body(response, signal, mapper if grace is not None and hasattr(mapper, "settled") else None, grace)
        head: list[bytes] | None = []  # the body while it has no event: a JSON answer is explained
        size = 0
        stall = _stall_limit(response)
        quiet: float | None = None  # when the chunks of no answer began (None: the last brought some)
        try:
            async for chunk in chunks:
                events = feed(chunk)
                if head is not None:
                    size += len(chunk)
                    if events:
                        head = None
                    elif size > _HEAD_LIMIT:
                        _no_stream(conn, response, head, redactor)
                        head = None
                    else:
                        head.append(chunk)
                answered = False
                for sse in events:
                    if signal.aborted:
                        raise AbortError(signal.reason or "cancel")
                    out = handle(sse)
                    if not out:
                        continue
                    answered = True
                    if mapper.done:
                        await _read_tail(chunks)
                        for ev in out:
                            yield ev
                        failure = getattr(mapper, "failure", None)
                        if failure is not None:  # a failed response, its events out first
                            raise failure
                        return
                    for ev in out:
                        yield ev
                if answered:
                    quiet = None
                elif stall is not None:
                    quiet = _still_waiting(conn.provider, quiet, stall)
        except ModelError as exc:  # a mapper's error quotes what the server sent
            if redactor is not None:
                redactor.scrub_error(exc)
            raise
        finally:
            await chunks.aclose()
        decoder.close()
        last = _at_end(conn, response, mapper, head, redactor)
        if last:  # the server ended the body where it had finished, without its terminator
            for ev in last:
                yield ev
            return
        said = _held(response, head, redactor)
    if _would_end(decoder.dropped):  # the terminator itself, whole but for its blank line
        said += (
            "; its last event had no blank line after it, so it was not read, as the event stream "
            "rules say (a recorded stream must end with an empty line)"
        )
    raise StreamProtocolError(
        f"{conn.provider} stream ended without {mapper.terminator} (connection cut or truncated response)"
        + said,
        retryable=True,
    )


#: Seconds a body may stay open once its answer is whole (the stop reason, and the usage when it
#: was asked for) before it ends as complete: the default of a model's ``end_grace``. What
#: follows the stop reason (the usage chunk, ``[DONE]``, ``message_stop``) comes at once.
END_GRACE = 2.0


def check_end_grace(value: float | None) -> float | None:
    """A model's ``end_grace`` as given (None, or seconds: a finite number, 0 or more);
    ValueError for another value."""
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int | float) or not 0 <= value < math.inf:
        raise ValueError(f"end_grace takes None or a finite number of seconds, 0 or more, not {value!r}")
    return float(value)


#: The events that end a response (each provider's terminator and its like), by event name,
#: JSON ``type`` or data.
_ENDS = frozenset({"message_stop", "response.completed", "response.incomplete", "response.failed", "[DONE]"})


def _would_end(sse: ServerSentEvent | None) -> bool:
    """Whether ``sse``, an event the decoder dropped for want of its blank line, would have ended
    the response: a body cut in another event was cut, not saved without its last empty line."""
    if sse is None:
        return False
    if sse.event in _ENDS or sse.data.strip() in _ENDS:
        return True
    try:
        kind = json.loads(sse.data).get("type")
    except (ValueError, AttributeError, RecursionError):
        return False
    return kind in _ENDS


def _at_end(
    conn: Connection, response: httpx.Response, mapper: Mapper, head: list[bytes] | None, redactor: Redactor
) -> Sequence[StreamEvent] | None:
    """A body that ended before its terminator: the events that complete it (the mapper's
    ``at_eof``), or None when it was cut. Raises the error a body with no event explains
    (``head``, what it held: a JSON error document, a web page)."""
    if head:
        raw = b"".join(head)
        error = document_error(
            conn.provider,
            response.headers,
            raw,
            request_id_header=conn.request_id_header,
            secret=redactor,
        ) or _web_page(conn, response.headers, raw, redactor)
        if error is not None:
            raise error
    at_eof = getattr(mapper, "at_eof", None)
    return at_eof() if at_eof is not None else None


#: How much of a body with no event is kept to explain it, and read at most when it does not say
#: it is an event stream.
_HEAD_LIMIT = 1 << 20


def _no_stream(conn: Connection, response: httpx.Response, head: list[bytes], redactor: Redactor) -> None:
    """A body past `_HEAD_LIMIT` with no event yet: read on (return) when it says it is an event
    stream (the first event may be long: a Responses stream repeats the instructions in it;
    `SSEDecoder` bounds it), else raise the error it explains (a web page) or one that says it
    is not an event stream. Neither is retryable: the same request gets the same body, and
    reading a few more megabytes of it to its end would tell nothing more."""
    media = media_type(response.headers)
    if media == "text/event-stream":
        return None
    raw = b"".join(head)
    error = _web_page(conn, response.headers, raw, redactor)
    if error is None:
        what = f"of {media}" if media else "with no content type"
        error = StreamProtocolError(
            f"{conn.provider} answered with more than {_HEAD_LIMIT >> 20} MiB {what} and no event: not an "
            "event stream (is base_url the API's address? does the server support streaming?)"
        )
    raise error


def _held(response: httpx.Response, head: list[bytes] | None, redactor: Redactor) -> str:
    """What a body that ended with no event held, to quote in the error (a load balancer's
    ``upstream connect error``), or "" when it held nothing."""
    if not head:
        return ""
    text = " ".join(redactor.scrub(decode_body(b"".join(head), response.headers)).split())
    return f"; the body held no event: {excerpt(text)}" if text else ""

#: The clock that times keep-alives (a test puts a fake one here).
_clock = time.monotonic


def _stall_limit(response: httpx.Response) -> float | None:
    """How long a stream may send only keep-alives: the request's read timeout (None: no limit)."""
    timeout = response.request.extensions.get("timeout")
    read = timeout.get("read") if isinstance(timeout, dict) else None
    return float(read) if isinstance(read, int | float) else None


def _still_waiting(provider: str, since: float | None, limit: float) -> float:
    """When the chunks that brought nothing of the answer began (now, if ``since`` is None);
    raises a retryable `ProviderConnectionError` once they have lasted longer than ``limit``
    seconds.

    The read timeout waits for bytes, and a keep-alive is bytes: an SSE comment, an Anthropic
    ``ping``, a proxy's ``event: keepalive``, any event the mapper reads nothing from (an
    unknown one, a chunk with no choice). A stalled model behind a gateway that sends one every
    few seconds would hold the run forever. Counted from the first such chunk after the last
    one that brought part of the answer, so at most one keep-alive interval late."""
    now = _clock()
    if since is None:
        return now
    if now - since > limit:
        raise ProviderConnectionError(
            f"{provider} stream stalled: the server sent only keep-alives, nothing of the answer, for "
            f"{limit:g} s (the read timeout)",
            provider=provider,
            retryable=True,
        )
    return since


def _web_page(
    conn: Connection, headers: Mapping[str, str], raw: bytes, redactor: Redactor | None
) -> StreamProtocolError | None:
    """The error for a 2xx web page instead of an event stream (a ``base_url`` that points at
    a site or a web UI, a captive portal), else None: not retryable, the same URL gives the
    same page. A page is not a cut stream, and says so."""
    text = decode_body(raw, headers)
    if not is_page(text, headers):
        return None
    media = media_type(headers)
    if media not in PAGE_TYPES:  # known by how it begins
        media = "text/html"
    if redactor is not None:
        text = redactor.scrub(text)
    said = page_text(text)
    if redactor is not None:  # an entity-escaped secret is plain once decoded
        said = redactor.scrub(said)
    return StreamProtocolError(
        f"{conn.provider} answered with a web page ({media}), not an event stream: is base_url the "
        f"API's address? {said}"
    )


async def _body(
    response: httpx.Response, signal: AbortSignal | None = None, mapper: Any = None, grace: float | None = None
) -> AsyncGenerator[bytes, None]:
    """The response body, read from the transport stream directly; a read that waits when
    ``signal`` is aborted ends at once with `AbortError` (see `_ReadWatch`). Once ``mapper`` is
    ``settled`` (its answer whole), the body ends ``grace`` seconds later, whatever it still sends
    (`_settled_read`); once output came after that (a mapper's ``resumed`` count, when it has
    one), its stop reason is known not to be final, and the grace no longer applies: the body
    ends with its terminator, its end, or the read timeout.

    `httpx.Response.aiter_bytes` stacks three async generators that are left
    for the garbage collector to finalize when a reader stops early; reading
    the stream here keeps one layer that `run_stream` closes itself. A body a proxy
    compressed anyway (we ask for ``identity``) is decoded here too (`_unpack`: gzip, deflate,
    and br or zstd with their optional packages, else `MissingDecoder`), in pieces of at most
    `DECODED_CHUNK` bytes, each decoded only when the one before was taken (a compression bomb
    meets the size limits before it is inflated); httpx's decoders are never used.
    """
    stream = response.stream
    assert isinstance(stream, httpx.AsyncByteStream)
    unpack = unpacker(response.headers)
    source: AsyncIterator[bytes] = stream.__aiter__()
    watch = _ReadWatch(signal) if signal is not None else None
    step = source.__anext__
    asked = cancels_asked()  # a cancel asked of the reader after this is one its close must not hide
    deadline: float | None = None
    settled: Any = None  # the mapper, once its answer is whole
    try:
        while True:
            if mapper is not None and grace is not None and mapper.settled:
                if getattr(mapper, "resumed", 0):
                    # Output came after its stop reason (gateways that put "stop" on every
                    # chunk): no stop reason of this body is final, so none arms the grace.
                    deadline = settled = mapper = None
                elif settled is None:
                    deadline, settled = asyncio.get_running_loop().time() + grace, mapper
            if watch is not None:
                watch.reading = True
            try:
                chunk = await (step() if deadline is None else _settled_read(step, deadline))
            except StopAsyncIteration:
                break
            except _GraceOver:  # what a compressed body still held is no part of the answer
                over = getattr(settled, "grace_over", None)
                if over is not None:
                    over()
                return
            except asyncio.CancelledError:
                if watch is not None and watch.withdrawn():
                    raise AbortError(watch.reason) from None
                raise
            if watch is not None:  # `_ReadWatch.read`, inline: once per chunk read
                watch.reading = False
                if watch._fired:
                    watch.withdrawn()
            if unpack is None:  # the usual body: each read as it came, no list per read
                if chunk:
                    yield chunk
                continue
            for piece in unpack.decode(chunk):
                if piece:
                    yield piece
        if unpack is not None:
            for piece in unpack.flush():
                yield piece
    finally:
        if watch is not None:
            watch.close()
        aclose = getattr(source, "aclose", None)
        if aclose is not None:
            await aclose_keeping_cancel(aclose, asked)


class _GraceOver(Exception):
    """The grace after a whole answer ran out: the body ends there (`_settled_read`)."""


async def _settled_read(step: Callable[[], Awaitable[bytes]], deadline: float) -> bytes:
    """The next chunk of a body whose answer is whole, or `_GraceOver` once the loop's clock
    passes ``deadline``: a server that keeps the body open after its stop reason (no ``[DONE]``,
    keep-alives) would otherwise hold the finished answer until the read timeout, which then
    fails it."""
    try:
        async with asyncio.timeout_at(deadline) as within:
            return await step()
    except TimeoutError:
        if within.expired():
            raise _GraceOver from None
        raise


class _ReadWatch:
    """Ends a read of the body that waits when the signal is aborted: cancels the task reading
    (the one that made the watch; only while a read is awaited, ``reading``, never while the
    body's consumer runs), unless someone is cancelling it already (the engine cancels its own
    task on an abort). `withdrawn` tells a `CancelledError` this watch caused alone, and takes
    the cancel back."""

    __slots__ = ("_fired", "_loop", "_remove", "_signal", "_task", "reading")

    def __init__(self, signal: AbortSignal) -> None:
        self._loop = asyncio.get_running_loop()
        self._task = asyncio.current_task()
        self._signal = signal
        self._fired = False
        self.reading = False
        self._remove = signal.add_listener(self._on_abort)

    @property
    def reason(self) -> str:
        return self._signal.reason or "cancel"

    def _on_abort(self, _reason: str) -> None:  # any thread
        try:
            self._loop.call_soon_threadsafe(self._cancel)
        except RuntimeError:  # the loop is closed: nothing reads any more
            pass

    def _cancel(self) -> None:
        task = self._task
        if self.reading and not self._fired and task is not None and not task.done() and task.cancelling() == 0:
            self._fired = True
            task.cancel()

    def withdrawn(self) -> bool:
        fired, self._fired = self._fired, False
        return fired and self._task is not None and self._task.uncancel() == 0

    def read(self) -> None:
        """A read came back without a CancelledError: a cancel this watch sent it, the transport
        caught (and read on), is taken back, else it would stay on the reading task for good."""
        self.reading = False
        if self._fired:
            self.withdrawn()

    def close(self) -> None:
        self.read()  # a read that raised another error in place of the cancel, too
        self._remove()


#: Seconds to wait for the end of the body after the terminator. A server that keeps the
#: response open after it (keep-alive comments, a proxy that never ends the body) would
#: otherwise hold back the final event until the read timeout, which then fails the
#: finished response.
_TAIL_WAIT = 1.0


async def _read_tail(chunks: AsyncIterator[bytes], limit: int = 1 << 16) -> None:
    """After the terminator, read what is left of the body (normally nothing) so the
    connection can go back to the pool; give up (the connection is then closed)
    past ``limit`` bytes or ``_TAIL_WAIT`` seconds, when the connection fails, or on an
    abort: the answer is whole by then, and a reset or a read error while reading nothing
    more must neither discard it nor make it be asked for again. Whatever the failure: httpx's,
    or one of a host's own transport or client hook (raised as it is before the terminator)."""
    size = 0
    try:
        async with asyncio.timeout(_TAIL_WAIT):
            async for chunk in chunks:
                size += len(chunk)
                if size > limit:
                    return
    except Exception:  # TimeoutError, httpx.HTTPError, AbortError, a host transport's own
        return


# -- transcript helpers -----------------------------------------------------

Turn = tuple[str, list[Block]]


def turns(
    messages: Sequence[Message],
    *,
    foreign: Callable[[ThinkingBlock | RedactedThinkingBlock], bool] | None = None,
    provider: str | None = None,
) -> list[Turn]:
    """The transcript as the providers want it.

    Drops what may not be sent (empty or blank text, thinking without a signature,
    unfinished tool calls, our metadata, thinking or redacted thinking that ``foreign``
    says another provider or server made, and the `ProviderBlock`s of any provider but
    ``provider``), drops messages left empty, merges consecutive messages of one role, and
    puts tool results first in a user message.
    """
    out: list[Turn] = []
    for msg in messages:
        blocks = [
            b
            for b in msg.content
            if (_sendable(b) and (foreign is None or not isinstance(b, ThinkingBlock | RedactedThinkingBlock) or not foreign(b)))
            or (isinstance(b, ProviderBlock) and b.provider == provider)
        ]
        if not blocks:
            continue
        if out and out[-1][0] == msg.role:
            out[-1][1].extend(blocks)
        else:
            out.append((msg.role, blocks))
    for role, blocks in out:
        if role == "user" and any(isinstance(b, ToolResultBlock) for b in blocks):
            blocks.sort(key=lambda b: not isinstance(b, ToolResultBlock))  # stable
    return out


def _sendable(block: Block) -> bool:
    if isinstance(block, TextBlock):
        # Anthropic refuses a whitespace-only text block ("text content blocks must contain
        # non-whitespace text"), on every request that carries it; it says nothing anyway.
        return bool(block.text) and not block.text.isspace()
    if isinstance(block, ThinkingBlock):
        return bool(block.signature)
    if isinstance(block, ToolUseBlock):
        return block.complete
    return isinstance(block, RedactedThinkingBlock | ToolResultBlock)


def result_text(block: ToolResultBlock, *, mark_error: bool) -> str:
    """The result as one string; an error result is prefixed ``"Error: "`` when asked
    (for APIs with no ``is_error`` flag, so the model can tell)."""
    text = block.text
    if mark_error and block.is_error and not text.startswith("Error"):
        return "Error: " + text
    return text
