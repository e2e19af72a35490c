"""Sending a request and following its redirects without taking credentials elsewhere."""

from __future__ import annotations

from collections.abc import AsyncIterator
from contextlib import asynccontextmanager

import httpx

from ..._abort import cancels_asked
from ._abortable import aclose_keeping_cancel
from ._secrets import is_credential


@asynccontextmanager
async def sent(client: httpx.AsyncClient, request: httpx.Request) -> AsyncIterator[httpx.Response]:
    """``request`` sent with a streamed response, closed on the way out (what
    `httpx.AsyncClient.stream` does, for a request already built).

    Redirects are followed here when the client follows them (``follow_redirects=True``, at
    most ``max_redirects``), not by httpx: a redirect to another origin drops only the
    ``Authorization`` header there, and would take an ``x-api-key``, an ``api-key`` or a
    gateway token to the host the redirect names. Every credential header is dropped, and the
    client's own ``auth=`` is not applied there (nor anywhere after), as httpx applies it only
    to the request it was given."""
    asked = cancels_asked()
    response = await client.send(request, stream=True, follow_redirects=False)
    try:
        hops = 0
        auth: httpx.Auth | None = client.auth
        while client.follow_redirects and response.next_request is not None:
            hops += 1
            if hops > client.max_redirects:
                raise httpx.TooManyRedirects("Exceeded maximum allowed redirects.", request=response.next_request)
            following = response.next_request
            if not _same_origin(response.request.url, following.url):
                _drop_credentials(following)
                auth = None  # the client's own ``auth=`` stays with the origin it was sent to
            await response.aclose()
            response = await client.send(following, stream=True, follow_redirects=False, auth=auth)
        yield response
    finally:
        await aclose_keeping_cancel(response.aclose, asked)


def _same_origin(sent: httpx.URL, following: httpx.URL) -> bool:
    """Whether a redirect from ``sent`` to ``following`` stays in its origin: httpx's rule for
    ``Authorization``, which it also keeps on an upgrade of the same host from http to https."""
    a, b = sent, following
    return a.host == b.host and (
        (a.scheme, a.port) == (b.scheme, b.port)
        or ((a.scheme, b.scheme) == ("http", "https") and a.port in (None, 80) and b.port in (None, 443))
    )


def _drop_credentials(request: httpx.Request) -> None:
    """``request`` (where a redirect to another origin leads) without its credential headers."""
    for name in [name for name in request.headers if is_credential(name)]:
        del request.headers[name]
