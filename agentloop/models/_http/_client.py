"""The connection of an HTTP provider: its client, its request, its configuration checked.

`Connection` holds one endpoint (base URL, key, the httpx client, shared or owned) and sends
a request (`Connection.open`), handing failures to `_errors` and redirects to `_redirects`;
`HTTPModel` is what every HTTP model shares. The ``check_*`` functions refuse a base URL or
header that could only fail every request, when the model is made.
"""

from __future__ import annotations

import asyncio
import functools
import json
import logging
import weakref
from collections.abc import AsyncIterator, Collection, Mapping
from contextlib import AsyncExitStack, asynccontextmanager
from typing import Any
from urllib.parse import unquote

import httpx

from ..._abort import AbortSignal
from ..._errors import ModelError, ProviderStatusError
from ..._unicode import scrub_json
from ._abortable import abortable
from ._errors import clip_message, connection_error, error_body, status_error
from ._redirects import sent
from ._secrets import (
    KEY_VARIABLES,
    URL_LOGS,
    Redactor,
    Secret,
    credential_parts,
    is_credential,
    is_query_credential,
    resolve_key,
    url_credentials,
)

log = logging.getLogger("agentloop")

_DEFAULT_TIMEOUT = httpx.Timeout(600.0, connect=5.0)
#: The ``User-Agent`` an ``httpx.AsyncClient`` sends unless told otherwise.
_HTTPX_AGENT = f"python-httpx/{httpx.__version__}"


@functools.cache
def _user_agent() -> str:
    """``agentloop/<version> python-httpx/<version>``: which client sent a request, for the
    provider's logs and support (nothing about the machine or the host)."""
    from ... import __version__  # the package's: set once its import has finished

    return f"agentloop/{__version__} {_HTTPX_AGENT}"


#: What an ``httpx.AsyncClient`` made without ``timeout=`` has: 5 s for every phase, which
#: fails a model that thinks for longer than that before its first token.
_HTTPX_DEFAULT_TIMEOUT = httpx.Timeout(5.0)


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
    if "#" in base_url:
        # The request path would go into the fragment, which is never sent: every request would
        # go to the base URL itself.
        raise ValueError(f"base_url has a fragment ('#...'); {_USERINFO_HINT}")
    return base_url


def origin_of(base_url: str) -> str:
    """The server of ``base_url``: its scheme, host, port and path
    (``"https://api.deepseek.com/anthropic"``), scheme and host lower-case, without user info,
    a default port, a query or a trailing ``/``; the path as it is, since a gateway that routes
    by path (``/anthropic``, ``/mistral``) is a server per route. What a thinking block records
    as its `ThinkingBlock.origin`, for every provider: the server that made it, and the only one
    it goes back to."""
    url = httpx.URL(base_url)
    path = url.raw_path.decode("ascii").partition("?")[0].rstrip("/")
    return f"{url.scheme}://{url.netloc.decode('ascii')}".lower() + path


#: Said with an invalid URL: the usual cause in a URL that carries credentials.
_USERINFO_HINT = "a '/', '?', '#' or '@' in a user name or password must be percent-encoded (%2F, %3F, %23, %40)"


def invalid_url_kind(exc: Exception) -> str:
    """What an invalid-URL error says, without the part of the URL it quotes."""
    return str(exc).partition(":")[0].strip() or type(exc).__name__


def check_headers(extra_headers: Mapping[str, str] | None, what: str = "extra_headers") -> dict[str, str]:
    """A copy of ``extra_headers``; raises `ValueError` for a name that is not an HTTP token
    or a value an HTTP header cannot carry (non-ASCII, a control character, whitespace at
    either end), naming the header (as an item of ``what``) but never quoting its value, which
    may be a credential."""
    out: dict[str, str] = {}
    for name, value in (extra_headers or {}).items():
        if not isinstance(name, str) or not name or not set(name) <= _TOKEN_CHARS:
            raise ValueError(f"{what}: {name!r} is not a valid HTTP header name")
        if not isinstance(value, str):
            raise ValueError(f"{what}[{name!r}] must be a str, got {type(value).__name__}")
        if not (value.isascii() and value.replace("\t", " ").isprintable() and value == value.strip()):
            raise ValueError(
                f"{what}[{name!r}] holds a character an HTTP header cannot carry (a line break, "
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
        self._url_secrets = url_credentials(self.base_url)
        if self._url_secrets:
            URL_LOGS.watch(self, self._url_secrets, ("httpx",))
        self.secret = secret
        self.request_id_header = request_id_header
        self._client = http_client
        self._owns = http_client is None
        self._loop: weakref.ref[asyncio.AbstractEventLoop] | None = None  # where an owned client was made

    @property
    def shown_url(self) -> str:
        """``base_url`` for reprs: credentials in it (``https://user:password@proxy/v1``, a
        ``?key=...`` query parameter) are not shown."""
        # Cut out of the URL as written: httpx's user info is percent-encoded (a "^", a "|", a
        # non-ASCII letter), so it is not always the text the URL holds. A checked URL has no
        # unencoded "/" in its user info, so the authority ends at the first "/".
        scheme, sep, rest = self._prefix.partition("://")
        authority, slash, path = rest.partition("/")
        userinfo, at, host = authority.rpartition("@")
        shown = f"{scheme}{sep}[REDACTED]@{host}{slash}{path}" if at and userinfo else self._prefix
        if self._query:
            pairs = self._query[1:].split("&")
            shown += "?" + "&".join(
                f"{name}=[REDACTED]" if eq and is_query_credential(unquote(name)) else name + eq + value
                for name, eq, value in (pair.partition("=") for pair in pairs)
            )
        return shown

    def redactor(self, headers: Mapping[str, str], request: httpx.Request | None = None) -> Redactor:
        """What scrubs the secrets of a request with ``headers`` out of its errors: the API
        key, the values of credential headers (`is_credential`: the request's, those the
        host set on its own ``http_client``, and those of ``request``, the request as it went
        out, with what the client's ``auth=`` added) and the credentials in ``base_url``.
        They are collected at its first use (an error), not for every request."""

        def collect() -> list[str]:
            values = list(self._url_secrets)
            if self.secret is not None:
                values.append(self.secret.reveal())
            given = self._client.headers.items() if not self._owns and self._client is not None else ()
            went = request.headers.items() if request is not None else ()
            for name, value in (*given, *headers.items(), *went):
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
        self,
        path: str,
        headers: Mapping[str, str],
        body: Mapping[str, Any],
        signal: AbortSignal | None = None,
        *,
        extra: Collection[str] = (),
    ) -> AsyncIterator[httpx.Response]:
        """POST ``body`` as JSON and yield the open 2xx streaming response (``extra``: the names
        of the caller's ``extra_headers`` among ``headers``, for a 401 to say whose it refused).

        The response is closed on the way out (never drained), also on
        cancellation. Raises `ProviderStatusError` (or `PromptTooLongError`)
        for a non-2xx status (with as much of its body as could be read) and
        `ProviderConnectionError` for transport failures (httpx's, and an `OSError` of the
        host's own transport) and undecodable bodies, including those raised while the caller
        reads the body; `ModelError` (nothing
        sent) for an API key a header cannot carry; `AbortError` as soon as ``signal`` is
        aborted while the response's headers or an error body are awaited.
        """
        secret = self.secret
        if secret is not None and any(secret.reveal() in value for value in headers.values()):
            secret.check(self.provider)  # only a key that is sent (not one a host's header replaced)
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
                headers=merge_headers(self._base_headers(client), headers),
                content=content,
                timeout=timeout,
            )
        except (httpx.InvalidURL, UnicodeEncodeError, ValueError, TypeError) as exc:
            # Not quoted: the message can hold a header value, and a header can be a credential.
            raise ModelError(
                f"{self.provider} request could not be built ({type(exc).__name__}): check base_url "
                "and the extra headers"
            ) from None
        redactor = self.redactor(headers, request)  # the client's auth= sets its header on request
        try:
            async with AsyncExitStack() as stack:
                async with abortable(signal):
                    response = await stack.enter_async_context(sent(client, request))
                if not 200 <= response.status_code < 300:
                    raise self._status_error(response, await error_body(response, signal), redactor, headers, extra)
                yield response
        except httpx.HTTPStatusError as exc:
            # The host's client raised for the status itself (a response hook that calls
            # ``raise_for_status()``), its body closed: the status and headers still say what
            # failed and whether to retry. Not chained: its message quotes the request URL; the
            # request it holds (still its context) is replaced by a scrubbed copy.
            redactor.scrub_chain(exc)
            raise self._status_error(exc.response, b"", redactor, headers, extra) from None
        except (httpx.RequestError, OSError) as exc:  # OSError: a host transport's own (ConnectionResetError)
            error = connection_error(self.provider, exc, redactor, request.extensions.get("timeout"))
            # Chained, the transport error is printed with the traceback: scrubbed too, or left out.
            raise error from (exc if redactor.scrub_chain(exc) else None)
        except ModelError as exc:  # raised here, or by the caller reading the body (a mapper's)
            redactor.scrub_error(exc)
            clip_message(exc)
            if not redactor.scrub_chain(exc):
                exc.__cause__, exc.__suppress_context__ = None, True
            raise
        except Exception as exc:
            # Not httpx's: a host's transport (or a hook of its client) raising an error of its
            # own, which may quote the URL or a header. Scrubbed in place; one whose text cannot
            # be scrubbed (its str is not its args) is not shown at all.
            if redactor.scrub_chain(exc):
                raise
            raise ModelError(
                f"{self.provider} request failed: the HTTP client raised {type(exc).__name__} "
                "(its message, which quotes a credential, is not shown)"
            ) from None

    def _base_headers(self, client: httpx.AsyncClient) -> dict[str, str]:
        """The headers every request carries unless the request's own replace them: the media
        it takes, and a ``User-Agent`` that names agentloop, unless the host's own client sets
        one of its own."""
        base = {"accept": "text/event-stream", "accept-encoding": "identity"}
        if client.headers.get("user-agent") in (None, _HTTPX_AGENT):
            base["user-agent"] = _user_agent()
        return base

    def _status_error(
        self,
        response: httpx.Response,
        raw: bytes,
        redactor: Redactor,
        headers: Mapping[str, str],
        extra: Collection[str],
    ) -> ProviderStatusError:
        return status_error(
            self.provider,
            response.status_code,
            response.headers,
            raw,
            request_id_header=self.request_id_header,
            secret=redactor,
            refused=self._refused(response, headers, extra) if response.status_code == 401 else "",
        )

    def _refused(self, response: httpx.Response, headers: Mapping[str, str], extra: Collection[str]) -> str:
        """Whose credential a 401 refused, as the request that went out tells (``headers``: the
        model's as it gave them, ``extra`` the names of those from ``extra_headers``): the key
        and where it was read from, a header of ``extra_headers`` or of the host's ``http_client``,
        one its ``auth=`` or the user info in ``base_url`` put in, or none at all."""
        try:
            sent = response.request.headers
        except RuntimeError:  # a response built without its request
            sent = httpx.Headers(headers)
        secret = self.secret
        key = secret.reveal() if secret is not None else None
        credentials = [name for name in sent if is_credential(name)]
        others = [name for name in credentials if key is None or key not in sent[name]]
        went = [secret.origin] if secret is not None and len(others) < len(credentials) else []
        given = {name.lower(): value for name, value in headers.items()}
        named = {name.lower(): name for name in extra}
        went += [self._whose(name, sent[name], given, named) for name in others]
        if len(url_credentials(self._prefix)) < len(self._url_secrets):  # a ?key=... of base_url's
            went.append("the credential in base_url")
        if len(went) == 1:
            return f"the server refused {went[0]}"
        if went:
            return "the server refused one of the credentials sent: " + "; ".join(went)
        variable = KEY_VARIABLES.get(self.provider)
        where = f"pass api_key= or set the {variable} environment variable" if variable else "pass api_key="
        return f"no credential was sent: {where}"

    def _whose(self, name: str, value: str, given: Mapping[str, str], named: Mapping[str, str]) -> str:
        """Where the ``name`` header a request carried with ``value`` (not the key) came from:
        ``extra_headers`` (``named``), the host's ``http_client``, or, when it left with a value the
        model (``given``) and the client did not set, the client's ``auth=`` or base_url's user info."""
        if given.get(name) == value:
            if name in named:
                return f"the credential in the {named[name]} header of extra_headers"
            return f"the credential in the {name} header"
        if name not in given and self.host_sets(name) and self.client.headers.get(name) == value:
            return f"the credential in the {name} header the http_client sends"
        if not self._owns and self._client is not None and self._client.auth is not None:
            return f"the credential the http_client's auth= puts in the {name} header"
        if httpx.URL(self._prefix).userinfo:
            return f"the user info in base_url, sent in the {name} header"
        return f"the credential in the {name} header"

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


def missing_key(provider: str, env_var: str) -> ModelError:
    """The error for a request made with no API key configured."""
    return ModelError(
        f"no API key for {provider}: pass api_key=... or set the {env_var} environment variable"
    )


#: The shortest credential scrubbed out of tool results. Real keys and tokens are longer; a local
#: server's placeholder key (``"ollama"``, ``"EMPTY"``, ``"sk-no-key-required"``) is a word that
#: a tool's output may well hold, which redacting would garble.
MIN_TOOL_SECRET = 20


class HTTPModel:
    """What every HTTP model shares: its `Connection`, a repr without the key, `aclose`.

    Subclasses set ``model`` and ``_conn`` in ``__init__``.
    """

    model: str
    extra_headers: dict[str, str]
    _conn: Connection

    def _credentials(self) -> tuple[str, ...]:
        """This model's credentials (its key, the values of its credential headers, those in
        ``base_url``) of `MIN_TOOL_SECRET` characters or more, longest first: the engine scrubs
        them out of tool results."""
        return tuple(v for v in self._conn.redactor(self.extra_headers).values if len(v) >= MIN_TOOL_SECRET)

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
        secret=resolve_key(api_key, KEY_VARIABLES["openai"]),
        http_client=http_client,
        request_id_header="x-request-id",
    )


def gives(headers: Mapping[str, str], name: str) -> bool:
    """True when ``headers`` set ``name`` (a lower-case header name), whatever its case."""
    return any(key.lower() == name for key in headers)


def openai_headers(conn: Connection, *, key_optional: bool, extra: Mapping[str, str]) -> dict[str, str]:
    """JSON + SSE headers with ``Authorization: Bearer``; an OpenAI-compatible server
    (``key_optional``: a custom base URL) may be used without a key. An ``Authorization``
    header in ``extra`` or on the host's own ``http_client`` (a gateway's own credential) is
    sent instead of the key, never next to it nor replaced by it.

    Raises `ModelError` when the key is required and missing.
    """
    secret = conn.secret
    hosts = conn.host_sets("authorization")  # the host's own client carries the credential
    if secret is None and not key_optional and not hosts and not gives(extra, "authorization"):
        raise missing_key("openai", KEY_VARIABLES["openai"])
    base = {"content-type": "application/json", "accept": "text/event-stream"}
    if secret is not None and not hosts:
        base["authorization"] = f"Bearer {secret.reveal()}"
    return merge_headers(base, extra)
