"""Failed requests translated into the `ProviderError` tree, at one boundary.

A non-2xx response becomes `ProviderStatusError` (or `PromptTooLongError`), with its status,
its body (read as far as it can be: `error_body`), its request id and whether to retry; an
error body sent with status 200 instead of a stream does too (`document_error`). An httpx
transport failure, or an `OSError` of a host's own transport, becomes `ProviderConnectionError`
(`connection_error`), a timeout saying which wait ran out. The request's secrets are scrubbed out of every message and body.
"""

from __future__ import annotations

import itertools
import ssl
from collections.abc import Mapping
from typing import Any

import httpx

from ..._abort import AbortSignal, cancels_asked
from ..._errors import (
    ModelError,
    PromptTooLongError,
    ProviderConnectionError,
    ProviderError,
    ProviderStatusError,
    StreamProtocolError,
)
from ..._jsondepth import TOO_DEEP, loads
from .._errbody import clipped, decode_body, is_page, page_text
from .._unpack import MissingDecoder, unpacker
from ._abortable import abortable, aclose_keeping_cancel
from ._retry import RETRYABLE_STATUSES, parse_retry
from ._secrets import Redactor

#: What a context-overflow error says in its message, type or code: Anthropic (also "input
#: length and `max_tokens` exceed context limit"), OpenAI Chat ("maximum context length") and
#: Responses ("exceeds the context window"), xAI, llama.cpp, Gemini.
_PROMPT_TOO_LONG_MARKERS = (
    "prompt is too long",
    "exceed context limit",
    "exceeds the maximum number of tokens allowed",
    "context_length_exceeded",
    "maximum context length",
    "exceeds the context window",
    "maximum prompt length",
    "exceed_context_size",
)

#: The type or code of OpenAI's 429 for an account that has run out of credit.
_QUOTA_SPENT = "insufficient_quota"


def prompt_too_long(*fields: object) -> bool:
    """Whether an error's message, type or code (None fields skipped) says the context
    does not fit the model's window."""
    text = " ".join(str(f) for f in fields if f is not None).lower()
    return any(m in text for m in _PROMPT_TOO_LONG_MARKERS)


def _unwrapped(body: Any) -> Any:
    """An error body that is a list of errors (Gemini's OpenAI endpoint sends
    ``[{"error": {...}}]``) stands for its first one."""
    if isinstance(body, list) and body and isinstance(body[0], dict):
        return body[0]
    return body


def error_code(body: Any) -> object:
    """The ``code`` of an OpenAI-style error body (``{"error": {"code": ...}}``, or the flat
    error of older vLLM, `flat_error`), else None."""
    body = _unwrapped(body)
    if not isinstance(body, dict):
        return None
    err = body.get("error")
    if isinstance(err, dict):
        return err.get("code")
    return body.get("code") if flat_error(body) else None


def flat_error(body: Any) -> bool:
    """Whether ``body`` is an error written flat, as older vLLM (and servers built on its
    protocol classes) write one: ``{"object": "error", "message", "type", "param", "code"}``,
    with no ``error`` key, the code an HTTP status (an int)."""
    return isinstance(body, dict) and body.get("object") == "error" and not body.get("error")


def error_fields(body: Any) -> tuple[str | None, str | None]:
    """``(message, type_or_code)`` from an Anthropic, OpenAI or Gemini error body (the type,
    else a code or status that is a word: Gemini's ``INVALID_ARGUMENT`` rather than its ``400``)."""
    body = _unwrapped(body)
    err = body.get("error") if isinstance(body, dict) else None
    if isinstance(err, str):
        return err, None
    if not isinstance(err, dict):
        err = body if isinstance(body, dict) else {}
    message = err.get("message")
    code = err.get("code")
    status = err.get("status")
    kind = err.get("type") or (status if isinstance(status, str) and not isinstance(code, str) else None) or code
    return (
        str(message) if message is not None else None,
        str(kind) if kind is not None else None,
    )


def status_error(
    provider: str,
    status: int,
    headers: Mapping[str, str],
    raw_body: bytes,
    *,
    request_id_header: str,
    secret: Redactor | None,
    refused: str = "",
) -> ProviderStatusError:
    """Build the error for a non-2xx response (the key scrubbed from body and message).
    ``refused``: for a 401, whose credential the server refused (`Connection` knows).

    A 400/413 whose message, type or code says the context does not fit becomes
    `PromptTooLongError`. (Also used for an error body a server sent with 200 instead of
    a stream: see `document_error`.)
    """
    text = decode_body(raw_body, headers)
    if secret is not None:
        text = secret.scrub(text)
    try:
        body: Any = loads(text) if text else None
    except ValueError:  # not JSON, or nested more than MAX_JSON_DEPTH levels
        body = text
    message, kind = error_fields(body)
    if message is None:
        if isinstance(body, str) and is_page(text, headers):  # a proxy's or web server's page
            said = page_text(text) or httpx.codes.get_reason_phrase(status)
            message = f"{said} (an HTML page, not an API error body)"
        else:
            message = text[:500] or httpx.codes.get_reason_phrase(status)
    retryable, retry_after = parse_retry(status, headers)
    if retryable and _QUOTA_SPENT in (kind, error_code(body)) and "x-should-retry" not in headers:
        retryable = False  # an account out of credit (OpenAI's 429): no wait fixes it
    cls = ProviderStatusError
    if status in (200, 400, 413) and prompt_too_long(message, kind, error_code(body)):
        cls, retryable = PromptTooLongError, False
    error = cls(
        f"{provider} HTTP {status}: {message}" + (f" ({refused})" if refused and status == 401 else ""),
        provider=provider,
        status=status,
        body=body,
        request_id=headers.get(request_id_header),
        error_type=kind,
        retryable=retryable,
        retry_after=retry_after,
    )
    if secret is not None:  # a secret the body escaped (``\\/``, ``\\u002b``) is plain once decoded
        secret.scrub_error(error)
    return error


def document_error(
    provider: str,
    headers: Mapping[str, str],
    raw: bytes,
    *,
    request_id_header: str,
    secret: Redactor | None,
) -> ModelError | None:
    """The error for a 2xx body that is one JSON document instead of an event stream
    (None when ``raw`` is not JSON): a gateway's error body sent with status 200 (older vLLM's
    flat one too, `flat_error`) becomes
    `ProviderStatusError` (``status=200``, or `PromptTooLongError`), anything else (a whole
    response: the server ignored ``"stream": true``) `StreamProtocolError`, not retryable,
    since the same request gets the same answer. An error body is retryable as its type or
    code says (`transient`: an upstream overloaded or rate-limited is as passing behind a
    gateway as in an error event), unless ``x-should-retry`` decides.
    """
    text = decode_body(raw, headers)
    if secret is not None:
        text = secret.scrub(text)
    try:
        body = loads(text)
    except ValueError as exc:  # not JSON, or nested too deep for an error body or a response
        if str(exc) != TOO_DEEP:
            return None
        return StreamProtocolError(f"{provider} answered with a JSON document, not an event stream: {TOO_DEEP}")
    if isinstance(body, dict) and (body.get("error") or flat_error(body)):
        error = status_error(provider, 200, headers, raw, request_id_header=request_id_header, secret=secret)
        if "x-should-retry" not in headers and not isinstance(error, PromptTooLongError):
            error.retryable = transient(body)
        return error
    return StreamProtocolError(
        f"{provider} answered with a JSON document, not an event stream (does the server "
        f"support streaming?): {text[:200]}"
    )


#: The types and codes of errors a new attempt can fix: Anthropic's, OpenAI's, those of the
#: servers and gateways that speak their APIs, and Gemini's statuses.
_TRANSIENT_KINDS = frozenset({
    "overloaded_error", "api_error", "rate_limit_error", "timeout_error", "rate_limit_exceeded",
    "server_error", "internal_server_error", "internal_error", "server_is_overloaded", "slow_down",
    "too_many_requests", "service_unavailable", "UNAVAILABLE", "RESOURCE_EXHAUSTED", "INTERNAL",
    "DEADLINE_EXCEEDED",
})  # fmt: skip


def transient(body: Any) -> bool:
    """Whether an error body says a new attempt can fix it: its type or code is a transient
    one (`_TRANSIENT_KINDS`), or an HTTP status that is (an int, or a str of digits: ``429``,
    ``"503"``), and the account has not run out of credit (``insufficient_quota``)."""
    _, kind = error_fields(body)
    code = error_code(body)
    if _QUOTA_SPENT in (kind, code):
        return False
    status = str(code)
    if status.isascii() and status.isdigit() and int(status) in RETRYABLE_STATUSES:
        return True
    return kind in _TRANSIENT_KINDS or (isinstance(code, str) and code in _TRANSIENT_KINDS)


def clip_message(exc: ModelError) -> None:
    """Cut ``exc``'s message, in place, to its start and end (`clipped`) when it quotes more of
    a server's text than an error should: to be called once its secrets are scrubbed."""
    message = clipped(exc.message)
    if message is not exc.message:
        exc.message = message
        exc.args = (message,)


def connection_error(
    provider: str, exc: httpx.RequestError | OSError, redactor: Redactor | None, timeouts: object = None
) -> ProviderError:
    """The error for a transport failure of a request to ``provider`` (``redactor`` scrubs the
    request's secrets out of what the transport said; ``timeouts`` are the request's, for a
    timeout's message): retryable unless another attempt meets the same fault. An `OSError`
    is a host transport's own (an aiohttp-backed or proxy transport: `ConnectionResetError`,
    `TimeoutError`), a connection failure as httpx's are."""
    detail = str(exc) or type(exc).__name__
    if redactor is not None:
        detail = redactor.scrub(detail)
    detail = clipped(detail)  # after scrubbing: a cut never splits a secret it could then miss
    if isinstance(exc, httpx.TimeoutException | TimeoutError):
        return _timeout_error(provider, exc, detail, timeouts)
    # Protocol misuse (bad URL, unsupported scheme), a redirect loop and a body whose decoder
    # is not installed cannot be fixed by retrying; a body that failed to decode (a corrupt compressed
    # stream) or a transport failure can.
    retryable = not isinstance(
        exc, httpx.UnsupportedProtocol | httpx.LocalProtocolError | httpx.TooManyRedirects | MissingDecoder
    )
    what = "response could not be decoded" if isinstance(exc, httpx.DecodingError) else "connection failed"
    if _caused_by(exc, ssl.SSLCertVerificationError):
        # Every attempt meets the same certificate (a proxy that re-signs TLS, a self-signed
        # server): a retry only delays the error.
        retryable = False
        detail += (
            " (the server's TLS certificate could not be verified: give the http_client the CA "
            "that signed it, httpx.AsyncClient(verify=...))"
        )
    return ProviderConnectionError(
        f"{provider} {what} ({type(exc).__name__}): {detail}",
        provider=provider,
        retryable=retryable,
    )


def _timeout_error(
    provider: str, exc: httpx.TimeoutException | TimeoutError, detail: str, timeouts: object
) -> ProviderError:
    """A timeout that says which wait ran out, and after how long (the request's timeouts,
    httpx's ``{"connect": ..., "read": ..., ...}``), then what the transport said, if more
    than its name. Retryable."""
    kind = type(exc).__name__
    phase, what = _TIMEOUTS.get(type(exc), ("", "")) if isinstance(exc, httpx.TimeoutException) else ("", "")
    limit = timeouts.get(phase) if isinstance(timeouts, dict) and phase else None
    if what and isinstance(limit, int | float):
        said = what.format(f"{limit:g}") + f" (the {phase} timeout)"
        if detail != kind:
            said += f": {detail}"
    else:
        said = detail
    return ProviderConnectionError(
        f"{provider} request timed out ({kind}): {said}", provider=provider, retryable=True
    )


def _caused_by(exc: BaseException, kind: type[BaseException]) -> bool:
    """Whether ``exc`` or an exception chained below it (a few levels: httpx's error from
    httpcore's from the socket's) is a ``kind``."""
    current: BaseException | None = exc
    for _ in range(8):
        if current is None:
            return False
        if isinstance(current, kind):
            return True
        current = current.__cause__ or current.__context__
    return False


#: httpx's timeouts: the phase of ``httpx.Timeout`` each one is, and what ran out.
_TIMEOUTS: dict[type[httpx.TimeoutException], tuple[str, str]] = {
    httpx.ConnectTimeout: ("connect", "could not connect within {} s"),
    httpx.ReadTimeout: ("read", "no data from the server for {} s"),
    httpx.WriteTimeout: ("write", "could not send the request within {} s"),
    httpx.PoolTimeout: ("pool", "no free connection in the client's pool within {} s"),
}


#: The most of an error body that is read: enough for any error a server writes, and for the
#: start of a proxy's error page; an endless one is not read into memory.
_ERROR_BODY_LIMIT = 1 << 20
#: The longest wait (seconds) for an error body, from its first byte to its end: a server writes
#: one at once, and the status and headers already say what failed; one that stalls or trickles
#: must not hold the run for the read timeout, again and again.
_ERROR_BODY_WAIT = 10.0


async def error_body(response: httpx.Response, signal: AbortSignal | None = None) -> bytes:
    """The body of a non-2xx ``response`` as far as it can be read: at most `_ERROR_BODY_LIMIT`
    bytes, what came within `_ERROR_BODY_WAIT` seconds, and what came before a read failed (a
    connection reset, a truncated body). The status and headers already say what went wrong and
    whether to retry; a body cut short must not turn a 401 into a retryable connection error, nor
    lose a 429's ``retry-after``. Raises `AbortError` at once when ``signal`` is aborted.

    Read from the transport stream (one generator, closed here: one left suspended by a reader
    that stops early is finalized later in a task of its own), then decoded when the server
    compressed it anyway, as far as it decodes."""
    raw = bytearray()
    stream = response.stream
    assert isinstance(stream, httpx.AsyncByteStream)
    chunks = stream.__aiter__()
    asked = cancels_asked()
    try:
        async with abortable(signal, _ERROR_BODY_WAIT):
            async for chunk in chunks:
                raw += chunk
                if len(raw) >= _ERROR_BODY_LIMIT:
                    break
    except (httpx.RequestError, OSError):  # OSError: a host transport's reset; TimeoutError is one
        pass
    finally:
        aclose = getattr(chunks, "aclose", None)
        if aclose is not None:
            await aclose_keeping_cancel(aclose, asked)
    return _decoded(bytes(raw), response.headers)


def _decoded(raw: bytes, headers: Mapping[str, str]) -> bytes:
    """``raw`` as decoded by its ``content-encoding`` (`_unpack`, as a stream's body is), no
    further than `_ERROR_BODY_LIMIT` (1 MiB of gzip can hold a gigabyte; one of zstd more) and
    as far as it decodes (a cut or corrupt body keeps what decoded before the fault). A body in
    an encoding whose package is missing is left out: its bytes would say nothing."""
    try:
        unpack = unpacker(headers)
    except MissingDecoder:
        return b""
    if unpack is None:
        return raw[:_ERROR_BODY_LIMIT]
    decoded = bytearray()
    try:
        for piece in itertools.chain(unpack.decode(raw), unpack.flush()):
            decoded += piece
            if len(decoded) >= _ERROR_BODY_LIMIT:
                break
    except httpx.DecodingError:
        pass  # what decoded before the corrupt part
    return bytes(decoded[:_ERROR_BODY_LIMIT])
