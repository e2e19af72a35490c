"""Sending a request and following its redirects without taking credentials elsewhere."""

from __future__ import annotations

from collections.abc import AsyncIterator
from contextlib import asynccontextmanager

import httpx

from ._secrets import is_credential


@asynccontextmanager
async def sent(client: httpx.AsyncClient, request: httpx.Request) -> AsyncIterator[httpx.Response]:
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
