"""The streamable HTTP transport of `MCPServer.http`, and the URL handled with care.

Credentials ride in MCP server URLs (user info, a ``?token=...``): the label shown in logs
and errors is the URL without them (`public_url`), user info is sent as Basic
authentication rather than handed to the SDK in the URL (`split_userinfo`), and a URL whose
host or port cannot be read is refused without being quoted (`check_url`).
"""

from __future__ import annotations

import contextlib
from collections.abc import AsyncIterator, Callable, Mapping
from urllib.parse import unquote, urlsplit, urlunsplit

import httpx2
from mcp.client.streamable_http import streamable_http_client

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
    on_forgotten: Callable[[], None],
) -> Connect:
    """What opens a streamable HTTP connection to ``target`` (see `MCPServer.http`); calls
    ``on_forgotten`` when the server answers 404 to a request of the current session."""

    async def on_response(response: httpx2.Response) -> None:
        if response.status_code == 404 and _SESSION_HEADER in response.request.headers:
            on_forgotten()

    @contextlib.asynccontextmanager
    async def connect() -> AsyncIterator[Streams]:
        limits = httpx2.Timeout(http_timeout, read=None)
        hooks = {"response": [on_response]}
        async with (
            httpx2.AsyncClient(headers=dict(headers or {}), timeout=limits, auth=auth, event_hooks=hooks) as client,
            streamable_http_client(target, http_client=client, max_sse_event_size=max_event_size) as streams,
        ):
            yield streams

    return connect
