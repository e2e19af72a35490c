"""The connection side of the HTTP providers: client, headers, error translation.

Everything httpx-specific that can fail is translated here, at one boundary,
into the `ProviderError` tree (`agentloop._errors`). Wire mapping (request
bodies, event mapping) lives in the per-API modules and never touches httpx.

Secrets: the API key is held in a `Secret`, whose repr hides it, and every
error body and message built here has the key scrubbed out, with the values of the
request's credential headers (an ``extra_headers`` ``Authorization`` for a proxy,
``api-key``, a cookie) and the credentials in ``base_url``.
"""

from __future__ import annotations

import asyncio
import datetime
import email.utils
import json
import logging
import math
import os
import ssl
import time
import weakref
from collections.abc import AsyncIterator, Callable, Iterable, Mapping
from contextlib import asynccontextmanager
from typing import Any
from urllib.parse import unquote, unquote_plus

import httpx

from .._errors import (
    ModelError,
    PromptTooLongError,
    ProviderConnectionError,
    ProviderError,
    ProviderStatusError,
    StreamProtocolError,
)
from .._unicode import scrub_json
from ._errbody import decode_body, is_page, page_text

__all__ = [
    "RETRYABLE_STATUSES",
    "Connection",
    "Redactor",
    "Secret",
    "parse_retry",
    "status_error",
]

#: HTTP statuses a new attempt can fix (408 timeout, 409 conflict/lock,
#: 429 rate limit, 5xx transient, 520-524 Cloudflare in front of the server: unknown
#: error, origin down, connect timeout, origin unreachable, read timeout; 529 Anthropic
#: overloaded).
RETRYABLE_STATUSES = frozenset({408, 409, 429, 500, 502, 503, 504, 520, 521, 522, 523, 524, 529})

log = logging.getLogger("agentloop")

_DEFAULT_TIMEOUT = httpx.Timeout(600.0, connect=5.0)
#: What an ``httpx.AsyncClient`` made without ``timeout=`` has: 5 s for every phase, which
#: fails a model that thinks for longer than that before its first token.
_HTTPX_DEFAULT_TIMEOUT = httpx.Timeout(5.0)
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


#: Words in a header or query parameter name that mark its value as a credential:
#: ``authorization``, ``proxy-authorization``, ``x-api-key``, ``api-key``, ``cookie``,
#: ``x-auth-token``, ``client-secret``, ``password``, ``sig`` (a signed URL)...
_CREDENTIAL_WORDS = ("auth", "key", "token", "secret", "cookie", "pass", "session", "credential", "sig")
#: Shorter values are not scrubbed: no credential is that short, and replacing every "1" of
#: an error (a header such as ``x-session-affinity: 1``) would garble it.
_MIN_PART = 4


#: Query parameters that carry a credential although their name says nothing of one: Azure
#: Functions takes its function key as ``?code=...``.
_QUERY_CREDENTIALS = frozenset({"code"})


def is_credential(name: str) -> bool:
    """Whether a header or query parameter called ``name`` carries a credential."""
    lowered = name.lower()
    return any(word in lowered for word in _CREDENTIAL_WORDS)


def is_query_credential(name: str) -> bool:
    """Whether a query parameter called ``name`` (percent-decoded) carries a credential."""
    return is_credential(name) or name.lower() in _QUERY_CREDENTIALS


def credential_parts(value: str) -> list[str]:
    """What to scrub for a credential ``value``: the value, the credentials after its
    scheme (``Bearer <token>``, ``Basic <base64>``) and each cookie's value, since a
    server may echo any one of them."""
    parts = [value]
    rest = value.partition(" ")[2].strip()
    if rest:
        parts.append(rest)
    for pair in value.split(";"):
        _, eq, part = pair.partition("=")
        if eq and part.strip():
            parts.append(part.strip())
    # As the HTTP layer quotes a value it refuses (a line break in it: "Illegal header value
    # b'tok\\n'"), escaped: the value as given is not in that text.
    escaped = repr(value.encode("utf-8", "backslashreplace"))[2:-1]
    if escaped != value:
        parts.append(escaped)
    return [p for p in parts if len(p) >= _MIN_PART]


class Redactor:
    """Scrubs secrets (the API key, credential headers, credentials in ``base_url``)
    out of text and errors; its repr shows none of them."""

    __slots__ = ("_make", "_sorted")

    def __init__(self, values: Iterable[str] | Callable[[], Iterable[str]]) -> None:
        # A callable is called at the first scrub: a request's redactor is needed only when
        # something goes wrong, so a request that succeeds never collects its secrets.
        self._make = values
        self._sorted: tuple[str, ...] | None = None if callable(values) else self._order(values)

    @staticmethod
    def _order(values: Iterable[str]) -> tuple[str, ...]:
        # Longest first: a secret that holds another (``Bearer <key>`` and ``<key>``) goes whole.
        return tuple(sorted({v for v in values if v}, key=len, reverse=True))

    @property
    def _values(self) -> tuple[str, ...]:
        values = self._sorted
        if values is None:
            make = self._make
            assert callable(make)
            values = self._sorted = self._order(make())
        return values

    def scrub(self, text: str) -> str:
        """``text`` with every occurrence of a secret replaced by ``[REDACTED]``."""
        for value in self._values:
            if value in text:
                text = text.replace(value, "[REDACTED]")
        return text

    def _found_in(self, text: str) -> bool:
        return any(value in text for value in self._values)

    def scrub_error(self, exc: ModelError) -> None:
        """Scrub the secrets out of ``exc`` in place: its message and, for a `ProviderError`,
        its body (an error event or chunk inside a stream that echoes a secret). The body's
        strings are searched as decoded: a JSON escape (``\\/`` for ``/``) hides nothing."""
        if self._found_in(exc.message):
            exc.message = self.scrub(exc.message)
            exc.args = (exc.message,)
        if isinstance(exc, ProviderError) and exc.body is not None:
            exc.body = self._scrub_json(exc.body)

    def scrub_chain(self, exc: BaseException) -> bool:
        """Scrub the secrets out of the string ``args`` of ``exc`` and of every exception
        chained to it (``__cause__``, ``__context__``), which a printed traceback shows.
        Returns False when a secret is still shown (an exception whose str is not its args)."""
        clean = True
        todo: list[BaseException] = [exc]
        seen: set[int] = set()
        while todo:
            current = todo.pop()
            if id(current) in seen:
                continue
            seen.add(id(current))
            if self._found_in(str(current)) or self._found_in(repr(current.args)):
                current.args = tuple(self.scrub(a) if isinstance(a, str) else a for a in current.args)
                clean = clean and not (self._found_in(str(current)) or self._found_in(repr(current.args)))
            todo += [e for e in (current.__cause__, current.__context__) if e is not None]
        return clean

    def _scrub_json(self, value: Any) -> Any:
        if isinstance(value, str):
            return self.scrub(value)
        if isinstance(value, dict):
            return {self._scrub_json(k): self._scrub_json(v) for k, v in value.items()}
        if isinstance(value, list):
            return [self._scrub_json(v) for v in value]
        return value

    def __repr__(self) -> str:
        return f"{type(self).__name__}('[REDACTED]')"

    __str__ = __repr__


class Secret(Redactor):
    """An API key that never shows itself in a repr or str."""

    __slots__ = ("_value",)

    def __init__(self, value: str) -> None:
        super().__init__((value,))
        self._value = value

    def reveal(self) -> str:
        """The key itself, for the request header only."""
        return self._value

    def check(self, provider: str) -> None:
        """Raise `ModelError` (not retryable, without the key) unless the key can go in an
        HTTP header: printable ASCII without surrounding whitespace.

        A key read from a file with its trailing newline would otherwise be refused by the
        HTTP layer with an error that quotes the header, key and all (escaped, so scrubbing
        misses it), and a non-ASCII character would raise `UnicodeEncodeError`.
        """
        value = self._value
        if not (value.isascii() and value.isprintable() and value == value.strip()):
            raise ModelError(
                f"the {provider} API key holds a character an HTTP header cannot carry (a line "
                "break, a control or non-ASCII character, or whitespace at either end): check how "
                "the key was read"
            )


def resolve_key(api_key: str | None, env_var: str) -> Secret | None:
    """The explicit key, else the environment variable's, else None."""
    value = api_key if api_key is not None else os.environ.get(env_var)
    return Secret(value) if value else None


#: The characters of an HTTP header name (RFC 9110 ``token``).
_TOKEN_CHARS = frozenset("!#$%&'*+-.^_`|~0123456789abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ")


def check_base_url(base_url: str) -> str:
    """``base_url`` itself when it is an absolute http(s) URL; raises `ValueError` otherwise.

    Checked when a model is made: a typo ("htps://"), a missing scheme, a space or a
    trailing newline would otherwise fail every request with a bare httpx error. The
    message never quotes the URL, which may carry credentials (``https://user:pass@...``).
    """
    if not isinstance(base_url, str):
        raise ValueError(f"base_url must be a str, got {type(base_url).__name__}")
    if any(c.isspace() or not c.isprintable() for c in base_url):
        raise ValueError("base_url holds whitespace or a control character: check how it was read")
    try:
        url = httpx.URL(base_url)
    except httpx.InvalidURL as exc:
        # Only the kind of fault: httpx quotes the part it refused ("Invalid port: 'x'"), which
        # for a password holding an unencoded "/", "?" or "#" is the start of the password.
        raise ValueError(f"base_url is not a valid URL ({invalid_url_kind(exc)}); {_USERINFO_HINT}") from None
    if url.scheme not in ("http", "https"):
        raise ValueError("base_url must start with http:// or https://")
    if not url.host:
        raise ValueError("base_url has no host")
    if url.port is not None and not 0 < url.port < 65536:
        raise ValueError(f"base_url has an invalid port ({url.port})")
    return base_url


#: Said with an invalid URL: the usual cause in a URL that carries credentials.
_USERINFO_HINT = "a '/', '?', '#' or '@' in a user name or password must be percent-encoded (%2F, %3F, %23, %40)"


def invalid_url_kind(exc: Exception) -> str:
    """What an invalid-URL error says, without the part of the URL it quotes."""
    return str(exc).partition(":")[0].strip() or type(exc).__name__


def check_headers(extra_headers: Mapping[str, str] | None) -> dict[str, str]:
    """A copy of ``extra_headers``; raises `ValueError` for a name that is not an HTTP token
    or a value an HTTP header cannot carry (non-ASCII, a control character, whitespace at
    either end), naming the header but never quoting its value, which may be a credential."""
    out: dict[str, str] = {}
    for name, value in (extra_headers or {}).items():
        if not isinstance(name, str) or not name or not set(name) <= _TOKEN_CHARS:
            raise ValueError(f"extra_headers: {name!r} is not a valid HTTP header name")
        if not isinstance(value, str):
            raise ValueError(f"extra_headers[{name!r}] must be a str, got {type(value).__name__}")
        if not (value.isascii() and value.replace("\t", " ").isprintable() and value == value.strip()):
            raise ValueError(
                f"extra_headers[{name!r}] holds a character an HTTP header cannot carry (a line break, "
                "a control or non-ASCII character, or whitespace at either end)"
            )
        out[name] = value
    return out


def merge_headers(base: Mapping[str, str], extra: Mapping[str, str]) -> dict[str, str]:
    """``base`` updated with ``extra``, header names compared without case (as HTTP does):
    a host's ``Authorization`` replaces the library's ``authorization`` rather than being
    sent next to it."""
    names = {name.lower() for name in extra}
    return {**{k: v for k, v in base.items() if k.lower() not in names}, **extra}


def parse_retry(
    status: int | None, headers: Mapping[str, str], *, now: float | None = None
) -> tuple[bool, float | None]:
    """Decide ``(retryable, retry_after_seconds)`` for a failed HTTP response.

    ``x-should-retry: true|false`` decides outright; otherwise the status
    decides (`RETRYABLE_STATUSES`). The delay comes from ``retry-after-ms``
    (wins) or ``retry-after`` (seconds, or an HTTP-date, GMT, relative to ``now``);
    missing, negative or unparsable values give None. Never raises.
    """
    should = headers.get("x-should-retry", "").strip().lower()
    if should == "true":
        retryable = True
    elif should == "false":
        retryable = False
    else:
        retryable = status in RETRYABLE_STATUSES
    return retryable, _retry_after(headers, now)


def _retry_after(headers: Mapping[str, str], now: float | None) -> float | None:
    raw_ms = headers.get("retry-after-ms")
    if raw_ms is not None:
        ms = _float(raw_ms)
        if ms is not None:
            return ms / 1000.0
    raw = headers.get("retry-after")
    if raw is None:
        return None
    seconds = _float(raw)
    if seconds is not None:
        return seconds
    try:
        when = email.utils.parsedate_to_datetime(raw.strip())
    except (TypeError, ValueError, IndexError):
        return None
    if when.tzinfo is None:  # asctime or "-0000": an HTTP date is GMT, never local time
        when = when.replace(tzinfo=datetime.UTC)
    return max(0.0, when.timestamp() - (time.time() if now is None else now))


def _float(raw: str) -> float | None:
    try:
        value = float(raw.strip())
    except ValueError:
        return None
    return value if math.isfinite(value) and value >= 0 else None


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
    """The ``code`` of an OpenAI-style error body (``{"error": {"code": ...}}``), else None."""
    body = _unwrapped(body)
    err = body.get("error") if isinstance(body, dict) else None
    return err.get("code") if isinstance(err, dict) else None


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
) -> ProviderStatusError:
    """Build the error for a non-2xx response (the key scrubbed from body and message).

    A 400/413 whose message, type or code says the context does not fit becomes
    `PromptTooLongError`. (Also used for an error body a server sent with 200 instead of
    a stream: see `document_error`.)
    """
    text = decode_body(raw_body, headers)
    if secret is not None:
        text = secret.scrub(text)
    try:
        body: Any = json.loads(text) if text else None
    except ValueError:
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
        f"{provider} HTTP {status}: {message}",
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
    (None when ``raw`` is not JSON): a gateway's error body sent with status 200 becomes
    `ProviderStatusError` (``status=200``, or `PromptTooLongError`), anything else (a whole
    response: the server ignored ``"stream": true``) `StreamProtocolError`. Neither is
    retryable (unless ``x-should-retry: true`` says so), since the same request gets the
    same answer.
    """
    text = decode_body(raw, headers)
    if secret is not None:
        text = secret.scrub(text)
    try:
        body = json.loads(text)
    except ValueError:
        return None
    if isinstance(body, dict) and body.get("error"):
        return status_error(provider, 200, headers, raw, request_id_header=request_id_header, secret=secret)
    return StreamProtocolError(
        f"{provider} answered with a JSON document, not an event stream (does the server "
        f"support streaming?): {text[:200]}"
    )


class Connection:
    """One provider endpoint: the httpx client (shared or owned), auth and error mapping.

    ``http_client``: use this client (the caller closes it); otherwise one is
    created on first use and closed by `aclose`, and made anew when the event loop
    it was made in has ended (a model used by one ``asyncio.run`` after another: the
    old client's pooled connections belong to the closed loop and would fail every
    request). A query string in ``base_url`` (Azure's ``?api-version=...``) stays at
    the end of every request URL.
    """

    __slots__ = ("__weakref__", "_client", "_loop", "_owns", "_prefix", "_query", "_url_secrets", "base_url",
                 "provider", "request_id_header", "secret")  # fmt: skip

    def __init__(
        self,
        provider: str,
        base_url: str,
        *,
        secret: Secret | None,
        http_client: httpx.AsyncClient | None,
        request_id_header: str,
    ) -> None:
        self.provider = provider
        base, mark, query = check_base_url(base_url).partition("?")
        self._prefix, self._query = base.rstrip("/"), mark + query
        self.base_url = self._prefix + self._query
        self._url_secrets = _url_credentials(self.base_url)
        if self._url_secrets:
            _URL_LOGS.watch(self, self._url_secrets, ("httpx",))
        self.secret = secret
        self.request_id_header = request_id_header
        self._client = http_client
        self._owns = http_client is None
        self._loop: weakref.ref[asyncio.AbstractEventLoop] | None = None  # where an owned client was made

    @property
    def shown_url(self) -> str:
        """``base_url`` for reprs: credentials in it (``https://user:password@proxy/v1``, a
        ``?key=...`` query parameter) are not shown."""
        userinfo = httpx.URL(self.base_url).userinfo.decode("ascii", errors="replace")
        shown = self._prefix.replace(f"//{userinfo}@", "//[REDACTED]@", 1) if userinfo else self._prefix
        if self._query:
            pairs = self._query[1:].split("&")
            shown += "?" + "&".join(
                f"{name}=[REDACTED]" if eq and is_query_credential(unquote(name)) else name + eq + value
                for name, eq, value in (pair.partition("=") for pair in pairs)
            )
        return shown

    def redactor(self, headers: Mapping[str, str]) -> Redactor:
        """What scrubs the secrets of a request with ``headers`` out of its errors: the API
        key, the values of credential headers (`is_credential`: the request's, and those
        the host set on its own ``http_client``) and the credentials in ``base_url``. They
        are collected at its first use (an error), not for every request."""

        def collect() -> list[str]:
            values = list(self._url_secrets)
            if self.secret is not None:
                values.append(self.secret.reveal())
            given = self._client.headers.items() if not self._owns and self._client is not None else ()
            for name, value in (*given, *headers.items()):
                if is_credential(name):
                    values += credential_parts(value)
            return values

        return Redactor(collect)

    def host_sets(self, name: str) -> bool:
        """True when the host's own ``http_client`` sends a ``name`` header on every request
        (compared without case): a gateway's credential set there is sent instead of the
        model's key, never replaced by it, as one in ``extra_headers`` is."""
        return not self._owns and self._client is not None and name in self._client.headers

    @property
    def client(self) -> httpx.AsyncClient:
        """The client requests go through (created on first use when not given)."""
        if self._owns:
            try:
                loop: asyncio.AbstractEventLoop | None = asyncio.get_running_loop()
            except RuntimeError:
                loop = None
            made_in = self._loop() if self._loop is not None else None
            if self._client is not None and made_in is not loop and (made_in is None or made_in.is_closed()):
                # Not closed here: its connections can only be closed by the loop that is gone.
                log.debug("%s: the event loop the HTTP client was made in has ended; making a new one", self.provider)
                self._client = None
            if self._client is None:
                self._client = self._new_client()
                self._loop = weakref.ref(loop) if loop is not None else None
        assert self._client is not None
        return self._client

    def _new_client(self) -> httpx.AsyncClient:
        return httpx.AsyncClient(timeout=_DEFAULT_TIMEOUT)

    async def aclose(self) -> None:
        """Close the client if this connection created it."""
        if self._owns and self._client is not None:
            client, self._client = self._client, None
            made_in = self._loop() if self._loop is not None else None
            if made_in is not None and made_in.is_closed():
                return  # its connections went with their loop: closing them would raise
            await client.aclose()

    @asynccontextmanager
    async def open(
        self, path: str, headers: Mapping[str, str], body: Mapping[str, Any]
    ) -> AsyncIterator[httpx.Response]:
        """POST ``body`` as JSON and yield the open 2xx streaming response.

        The response is closed on the way out (never drained), also on
        cancellation. Raises `ProviderStatusError` (or `PromptTooLongError`)
        for a non-2xx status (with as much of its body as could be read) and
        `ProviderConnectionError` for transport failures and undecodable bodies,
        including those raised while the caller reads the body; `ModelError` (nothing
        sent) for an API key a header cannot carry.
        """
        secret = self.secret
        if secret is not None and any(secret.reveal() in value for value in headers.values()):
            secret.check(self.provider)  # only a key that is sent (not one a host's header replaced)
        redactor = self.redactor(headers)
        content = self._encode(body)
        client = self.client
        if client.is_closed:
            raise ModelError(
                f"{self.provider}: the http_client given to the model is closed (it must stay open "
                "while the model is used)"
            )
        # A host's client left at httpx's default timeout gets ours for its requests (a long
        # read: a model may think for minutes before its first token); one it chose is kept.
        timeout = _DEFAULT_TIMEOUT if client.timeout == _HTTPX_DEFAULT_TIMEOUT else httpx.USE_CLIENT_DEFAULT
        try:
            request = client.build_request(
                "POST",
                self._prefix + path + self._query,
                headers=merge_headers({"accept": "text/event-stream", "accept-encoding": "identity"}, headers),
                content=content,
                timeout=timeout,
            )
        except (httpx.InvalidURL, UnicodeEncodeError, ValueError, TypeError) as exc:
            # Not quoted: the message can hold a header value, and a header can be a credential.
            raise ModelError(
                f"{self.provider} request could not be built ({type(exc).__name__}): check base_url "
                "and the extra headers"
            ) from None
        try:
            async with _sent(client, request) as response:
                if not 200 <= response.status_code < 300:
                    raw = await _error_body(response)
                    raise status_error(
                        self.provider,
                        response.status_code,
                        response.headers,
                        raw,
                        request_id_header=self.request_id_header,
                        secret=redactor,
                    )
                yield response
        except httpx.RequestError as exc:
            error = self._connection_error(exc, redactor, request.extensions.get("timeout"))
            # Chained, the transport error is printed with the traceback: scrubbed too, or left out.
            raise error from (exc if redactor.scrub_chain(exc) else None)

    def _encode(self, body: Mapping[str, Any]) -> bytes:
        """The request body as strict JSON (no NaN or Infinity) in UTF-8.

        Raises `ModelError` (not retryable) for a value JSON cannot represent, which only
        a host can put in a transcript (the library rejects NaN in a model's tool input).
        """
        try:
            text = json.dumps(body, ensure_ascii=False, separators=(",", ":"), allow_nan=False)
        except (TypeError, ValueError) as exc:
            raise ModelError(
                f"{self.provider} request cannot be encoded as JSON ({exc}): a message or tool "
                "definition holds a value JSON cannot represent"
            ) from None
        try:
            return text.encode()
        except UnicodeEncodeError:
            # A lone UTF-16 surrogate in text the host wrote into the transcript itself
            # (`validate_transcript` reports it): sent as U+FFFD rather than failing every request.
            log.warning("%s request: replaced lone UTF-16 surrogates with U+FFFD", self.provider)
            return json.dumps(scrub_json(body), ensure_ascii=False, separators=(",", ":")).encode()

    def _connection_error(
        self, exc: httpx.RequestError, redactor: Redactor | None, timeouts: object = None
    ) -> ProviderError:
        detail = str(exc) or type(exc).__name__
        if redactor is not None:
            detail = redactor.scrub(detail)
        if isinstance(exc, httpx.TimeoutException):
            return self._timeout_error(exc, detail, timeouts)
        # Protocol misuse (bad URL, unsupported scheme) and a redirect loop cannot be
        # fixed by retrying; a body that failed to decode (a corrupt compressed
        # stream) or a transport failure can.
        retryable = not isinstance(
            exc, httpx.UnsupportedProtocol | httpx.LocalProtocolError | httpx.TooManyRedirects
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
            f"{self.provider} {what} ({type(exc).__name__}): {detail}",
            provider=self.provider,
            retryable=retryable,
        )

    def _timeout_error(self, exc: httpx.TimeoutException, detail: str, timeouts: object) -> ProviderError:
        """A timeout that says which wait ran out, and after how long (the request's timeouts,
        httpx's ``{"connect": ..., "read": ..., ...}``), then what the transport said, if more
        than its name. Retryable."""
        kind = type(exc).__name__
        phase, what = _TIMEOUTS.get(type(exc), ("", ""))
        limit = timeouts.get(phase) if isinstance(timeouts, dict) and phase else None
        if what and isinstance(limit, int | float):
            said = what.format(f"{limit:g}") + f" (the {phase} timeout)"
            if detail != kind:
                said += f": {detail}"
        else:
            said = detail
        return ProviderConnectionError(
            f"{self.provider} request timed out ({kind}): {said}", provider=self.provider, retryable=True
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


async def _error_body(response: httpx.Response) -> bytes:
    """The body of a non-2xx ``response`` as far as it can be read: at most `_ERROR_BODY_LIMIT`
    bytes, and what came before a read failed (a connection reset, a truncated body). The
    status and headers already say what went wrong and whether to retry; a body cut short must
    not turn a 401 into a retryable connection error, nor lose a 429's ``retry-after``.

    Read from the transport stream (one generator, closed here: one left suspended by a reader
    that stops early is finalized later in a task of its own), then decoded when the server
    compressed it anyway, as far as it decodes."""
    raw = bytearray()
    stream = response.stream
    assert isinstance(stream, httpx.AsyncByteStream)
    chunks = stream.__aiter__()
    try:
        async for chunk in chunks:
            raw += chunk
            if len(raw) >= _ERROR_BODY_LIMIT:
                break
    except httpx.RequestError:
        pass
    finally:
        aclose = getattr(chunks, "aclose", None)
        if aclose is not None:
            await aclose()
    if response.headers.get("content-encoding", "identity").strip().lower() in ("", "identity"):
        return bytes(raw[:_ERROR_BODY_LIMIT])
    # Decoded piece by piece, and no further than the limit: 1 MiB of gzip can hold a gigabyte.
    pieces = (bytes(raw[i : i + 4096]) for i in range(0, len(raw), 4096))
    packed = httpx.Response(response.status_code, headers=response.headers, content=pieces)
    decoded = bytearray()
    try:
        for part in packed.iter_bytes():
            decoded += part
            if len(decoded) >= _ERROR_BODY_LIMIT:
                break
    except httpx.DecodingError:
        pass  # what decoded before the corrupt part
    return bytes(decoded[:_ERROR_BODY_LIMIT])


@asynccontextmanager
async def _sent(client: httpx.AsyncClient, request: httpx.Request) -> AsyncIterator[httpx.Response]:
    """``request`` sent with a streamed response, closed on the way out (what
    `httpx.AsyncClient.stream` does, for a request already built).

    Redirects are followed here when the client follows them (``follow_redirects=True``, at
    most ``max_redirects``), not by httpx: a redirect to another origin drops only the
    ``Authorization`` header there, and would take an ``x-api-key``, an ``api-key`` or a
    gateway token to the host the redirect names. Every credential header is dropped."""
    response = await client.send(request, stream=True, follow_redirects=False)
    try:
        hops = 0
        while client.follow_redirects and response.next_request is not None:
            hops += 1
            if hops > client.max_redirects:
                raise httpx.TooManyRedirects("Exceeded maximum allowed redirects.", request=response.next_request)
            following = _without_credentials(response.request, response.next_request)
            await response.aclose()
            response = await client.send(following, stream=True, follow_redirects=False)
        yield response
    finally:
        await response.aclose()


def _without_credentials(sent: httpx.Request, following: httpx.Request) -> httpx.Request:
    """``following`` (the request a redirect of ``sent`` leads to) without its credential
    headers when it leaves the origin of ``sent``; httpx's rule for ``Authorization``, which
    it also keeps on an upgrade of the same host from http to https."""
    a, b = sent.url, following.url
    same = a.host == b.host and (
        (a.scheme, a.port) == (b.scheme, b.port)
        or ((a.scheme, b.scheme) == ("http", "https") and a.port in (None, 80) and b.port in (None, 443))
    )
    if not same:
        for name in [name for name in following.headers if is_credential(name)]:
            del following.headers[name]
    return following


class _UrlCredentialsFilter(logging.Filter):
    """Scrubs the credentials of live URLs (a ``?key=...``, user info) out of other libraries'
    log records: httpx's INFO line ``HTTP Request: POST <url> ...`` quotes the request URL,
    and the MCP SDK logs the URL it connects to.

    Put on a logger by the first owner (a connection, an MCP server) whose URL holds
    credentials, and forgets an owner when it is garbage-collected. A record holding none of
    them passes untouched; none is made while the logger is below its level."""

    def __init__(self) -> None:
        super().__init__()
        self._live: weakref.WeakKeyDictionary[object, tuple[str, ...]] = weakref.WeakKeyDictionary()

    def watch(self, owner: object, secrets: Iterable[str], loggers: Iterable[str]) -> None:
        self._live[owner] = tuple(secrets)
        for name in loggers:
            logging.getLogger(name).addFilter(self)  # a filter already there is not added again

    def filter(self, record: logging.LogRecord) -> bool:
        secrets = [value for values in list(self._live.values()) for value in values]
        if secrets:
            redactor = Redactor(secrets)
            try:
                text = record.getMessage()
            except Exception:  # a malformed record is the logging module's to report, not ours
                return True
            if redactor._found_in(text):
                record.msg, record.args = redactor.scrub(text), ()
        return True


_URL_LOGS = _UrlCredentialsFilter()


def hide_url_credentials(owner: object, url: str, loggers: Iterable[str]) -> None:
    """Scrub the credentials in ``url`` out of the records of ``loggers`` for as long as
    ``owner`` lives."""
    secrets = _url_credentials(url)
    if secrets:
        _URL_LOGS.watch(owner, secrets, loggers)


def _url_credentials(url: str) -> list[str]:
    """The credentials in ``url``, as written and percent-decoded: its user info
    (``user:password``, and the password alone) and the values of its credential query
    parameters (``?key=...``)."""
    parsed = httpx.URL(url)
    userinfo = parsed.userinfo.decode("ascii", "replace")
    out = [p for p in (userinfo, unquote(userinfo), parsed.password or "") if len(p) >= _MIN_PART]
    for pair in parsed.query.decode("ascii", "replace").split("&"):
        name, eq, value = pair.partition("=")
        if eq and value and is_query_credential(unquote(name)):
            out += [value, *credential_parts(unquote_plus(value))]
    return out


def missing_key(provider: str, env_var: str) -> ModelError:
    """The error for a request made with no API key configured."""
    return ModelError(
        f"no API key for {provider}: pass api_key=... or set the {env_var} environment variable"
    )


class HTTPModel:
    """What every HTTP model shares: its `Connection`, a repr without the key, `aclose`.

    Subclasses set ``model`` and ``_conn`` in ``__init__``.
    """

    model: str
    _conn: Connection

    def __repr__(self) -> str:
        return f"{type(self).__name__}(model={self.model!r}, base_url={self._conn.shown_url!r})"

    async def aclose(self) -> None:
        """Close the HTTP client if this model created it."""
        await self._conn.aclose()


def openai_connection(api_key: str | None, base_url: str | None, http_client: httpx.AsyncClient | None) -> Connection:
    """The connection both OpenAI APIs use (key from ``OPENAI_API_KEY`` by default)."""
    return Connection(
        "openai",
        base_url or "https://api.openai.com/v1",
        secret=resolve_key(api_key, "OPENAI_API_KEY"),
        http_client=http_client,
        request_id_header="x-request-id",
    )


def openai_headers(conn: Connection, *, key_optional: bool, extra: Mapping[str, str]) -> dict[str, str]:
    """JSON + SSE headers with ``Authorization: Bearer``; an OpenAI-compatible server
    (``key_optional``: a custom base URL) may be used without a key. An ``Authorization``
    header in ``extra`` or on the host's own ``http_client`` (a gateway's own credential) is
    sent instead of the key, never next to it nor replaced by it.

    Raises `ModelError` when the key is required and missing.
    """
    secret = conn.secret
    hosts = conn.host_sets("authorization")  # the host's own client carries the credential
    if secret is None and not key_optional and not hosts:
        raise missing_key("openai", "OPENAI_API_KEY")
    base = {"content-type": "application/json", "accept": "text/event-stream"}
    if secret is not None and not hosts:
        base["authorization"] = f"Bearer {secret.reveal()}"
    return merge_headers(base, extra)
