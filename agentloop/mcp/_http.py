"""The streamable HTTP transport of `MCPServer.http`, and the URL handled with care.

Credentials ride in MCP server URLs (user info, a ``?token=...``): the label shown in logs
and errors is the URL without them (`public_url`), user info is sent as Basic
authentication rather than handed to the SDK in the URL (`split_userinfo`), and a URL whose
host or port cannot be read is refused without being quoted (`check_url`).
"""

from __future__ import annotations

import contextlib
import json
from collections.abc import AsyncIterator, Callable, Mapping
from typing import Any
from urllib.parse import unquote, urlsplit, urlunsplit

import anyio
import httpx2
from mcp import types
from mcp.client.streamable_http import streamable_http_client
from mcp.shared.message import SessionMessage

from ._connection import Connect, Streams

#: The streamable HTTP transport's session header (HTTP header names are case-insensitive).
_SESSION_HEADER = "mcp-session-id"

#: The loggers that quote an MCP server's URL, query string and all.
URL_LOGGERS = ("mcp.client.streamable_http", "httpx2", "httpx")


def public_url(url: str) -> str:
    """``url`` without user info, query or fragment: what can be shown in logs."""
    try:
        parts = urlsplit(url)
        host = parts.hostname or ""
        port = parts.port
    except ValueError:
        return "(unparsable MCP URL)"
    if ":" in host:
        host = f"[{host}]"
    netloc = f"{host}:{port}" if port is not None else host
    return urlunsplit((parts.scheme, netloc, parts.path, "", ""))


def check_url(url: str) -> None:
    """Raise ValueError, without quoting ``url``, when its host or port cannot be read: the
    SDK's HTTP client would quote the part it refuses, which for a password holding an
    unencoded "/", "?" or "#" (``https://user:ab/cd@host``) is the start of the password."""
    try:
        parts = urlsplit(url)
        parts.port  # noqa: B018 - raises ValueError for an invalid port
    except ValueError:
        raise ValueError(
            "the MCP server URL is not a valid URL (its host or port cannot be read); a '/', '?', '#' "
            "or '@' in a user name or password must be percent-encoded (%2F, %3F, %23, %40)"
        ) from None
    if parts.scheme not in ("http", "https") or not parts.hostname:
        raise ValueError("the MCP server URL must be an absolute http:// or https:// URL with a host")


def split_userinfo(url: str) -> tuple[str, httpx2.BasicAuth | None]:
    """``url`` without its user info, and that user info as Basic authentication (None
    when there is none, or when the URL cannot be parsed: the SDK then reports it)."""
    try:
        parts = urlsplit(url)
        user, password = parts.username, parts.password
    except ValueError:
        return url, None
    if user is None and password is None:
        return url, None
    netloc = parts.netloc.rpartition("@")[2]
    auth = httpx2.BasicAuth(unquote(user or ""), unquote(password or ""))
    return urlunsplit((parts.scheme, netloc, parts.path, parts.query, parts.fragment)), auth


def http_connect(
    target: str,
    auth: httpx2.BasicAuth | None,
    *,
    headers: Mapping[str, str] | None,
    http_timeout: float,
    max_event_size: int | None,
    on_forgotten: Callable[[object], None],
) -> Connect:
    """What opens a streamable HTTP connection to ``target`` (see `MCPServer.http`). When the
    server answers 404 to a message posted in a connection's session, that connection's read
    stream is marked ``forgotten`` and ``on_forgotten`` is called with it: the flag is the
    session's, and a connection still closing in the background says nothing of a newer one."""

    @contextlib.asynccontextmanager
    async def connect() -> AsyncIterator[Streams]:
        statuses: dict[Any, str] = {}
        stream: _Explained | None = None  # this connection's read stream, once open

        async def on_response(response: httpx2.Response) -> None:
            request = response.request
            # Only a message posted in the session says so: the SDK's background GET stream
            # (which a server need not offer) and the DELETE that ends a session carry the
            # session id too, and their 404 would reconnect a session the calls still use. (A
            # message is posted only once the streams are open: `stream` is set by then.)
            posted = request.method == "POST" and _SESSION_HEADER in request.headers
            if response.status_code == 404 and posted and stream is not None:
                stream.forgotten = True
                on_forgotten(stream)
            if response.status_code >= 400 and response.request.method == "POST":
                request_id = _request_id(response.request)
                if request_id is not None:
                    statuses[request_id] = f"HTTP {response.status_code} {response.reason_phrase}".rstrip()

        async def on_request(request: httpx2.Request) -> None:
            # Only a request's answer takes as long as its tool runs. The DELETE that ends the session
            # and a notification (a cancellation among them) are answered at once by a live server:
            # unbounded, one to a server that stopped answering held `aclose`, or every later
            # message (they are posted one after the other), for ever.
            if request.method == "DELETE" or (request.method == "POST" and not _is_request(request)):
                request.extensions["timeout"] = {**request.extensions.get("timeout", {}), "read": http_timeout}

        limits = httpx2.Timeout(http_timeout, read=None)
        hooks: dict[str, list[Callable[..., Any]]] = {"request": [on_request], "response": [on_response]}
        async with (
            httpx2.AsyncClient(headers=dict(headers or {}), timeout=limits, auth=auth, event_hooks=hooks) as client,
            streamable_http_client(target, http_client=client, max_sse_event_size=max_event_size) as (read, write),
        ):
            stream = _Explained(read, statuses)
            yield stream, write

    return connect


def _is_request(request: httpx2.Request) -> bool:
    """Whether ``request`` posts a JSON-RPC request (not a notification, nor an answer to the server)."""
    try:
        message = json.loads(request.content)
    except (ValueError, httpx2.RequestNotRead):
        return False
    return isinstance(message, dict) and "method" in message and "id" in message


def _request_id(request: httpx2.Request) -> Any:
    """The JSON-RPC id of the message ``request`` posted, or None (a notification, or not JSON)."""
    try:
        message = json.loads(request.content)
    except (ValueError, httpx2.RequestNotRead):
        return None
    return message.get("id") if isinstance(message, dict) else None


class _Explained:
    """The SDK's read stream, with the HTTP status added to the error that stands for a request
    the server refused without a JSON-RPC error of its own ("Server returned an error response"
    said nothing of a 401 for a wrong token)."""

    __slots__ = ("_statuses", "_stream", "forgotten")

    def __init__(self, stream: Any, statuses: dict[Any, str]) -> None:
        self._stream = stream
        self._statuses = statuses  # by JSON-RPC id, the HTTP status of each refused request
        self.forgotten = False  # the server answered 404 to a message posted in this session

    @property
    def last_context(self) -> Any:  # read by the SDK's dispatcher
        return getattr(self._stream, "last_context", None)

    async def receive(self) -> Any:
        item = await self._stream.receive()
        if isinstance(item, SessionMessage) and isinstance(item.message, types.JSONRPCError):
            status = self._statuses.pop(item.message.id, None)
            error = item.message.error
            if status is not None and status not in error.message:
                error = error.model_copy(update={"message": f"{error.message} ({status})"})
                message = item.message.model_copy(update={"error": error})
                item = SessionMessage(message, metadata=item.metadata)
        return item

    def __aiter__(self) -> _Explained:
        return self

    async def __anext__(self) -> Any:
        try:
            return await self.receive()
        except anyio.EndOfStream:
            raise StopAsyncIteration from None

    async def aclose(self) -> None:
        await self._stream.aclose()

    async def __aenter__(self) -> _Explained:
        return self

    async def __aexit__(self, *exc_info: object) -> None:
        await self.aclose()
