"""`OpenAIResponsesModel`: the Responses API's connection (key, headers, options) and request."""

from __future__ import annotations

from collections.abc import AsyncIterator
from typing import Any

import httpx

from ..._abort import AbortSignal
from ..._model import ModelRequest, StreamEvent
from .._driver import Prepared, run_stream
from .._http._client import (
    HTTPModel,
    check_headers,
    merge_headers,
    openai_connection,
    openai_headers,
    origin_of,
)
from ._request import build_request
from ._stream import ResponsesMapper

#: What ``doom_loop_check=True`` sends (a header of the same name in ``extra_headers`` wins).
_DOOM_HEADERS = {"x-grok-doom-loop-check": "true", "x-grok-exact-repetition-check": "true"}


class OpenAIResponsesModel(HTTPModel):
    """A `Model` backed by the OpenAI Responses API (streaming, stateless input).

    ``api_key`` defaults to ``OPENAI_API_KEY`` (optional when ``base_url`` is
    given). ``reasoning``: the Responses ``reasoning`` object (e.g.
    ``{"effort": "medium", "summary": "auto"}``); when set, encrypted reasoning
    is requested so it can be passed back. ``doom_loop_check=True`` asks the
    server for doom-loop signals (SPEC §6). ``store``: sent when not None.
    ``strict_tools``: declare the tools ``"strict": true``, their schemas made strict (every
    object closed, every property required; an optional one must accept ``null``); a schema
    that cannot be is a `ModelError` naming the tool.
    ``extra_body`` is merged into every request body.
    ``http_client``: an ``httpx.AsyncClient`` to send through (its owner closes it); without
    one the model makes its own on first use, closed by ``aclose()``. ``extra_headers`` go
    on every request, each replacing the library's header of the same name (case ignored);
    ValueError for a name or value HTTP cannot carry (the value is never quoted).
    Errors: the `ProviderError` tree, `StreamProtocolError`, `AbortError`.
    """

    def __init__(
        self,
        model: str,
        *,
        api_key: str | None = None,
        base_url: str | None = None,
        http_client: httpx.AsyncClient | None = None,
        reasoning: dict[str, Any] | None = None,
        doom_loop_check: bool = False,
        store: bool | None = None,
        extra_headers: dict[str, str] | None = None,
        extra_body: dict[str, Any] | None = None,
        strict_tools: bool = False,
    ) -> None:
        self.model = model
        self.reasoning = reasoning
        self.doom_loop_check = doom_loop_check
        self.store = store
        self.strict_tools = strict_tools
        self.extra_headers = check_headers(extra_headers)
        self.extra_body = dict(extra_body or {})
        self._key_optional = base_url is not None
        self._conn = openai_connection(api_key, base_url, http_client)
        # Reasoning items are sealed for the server that made them: kept with its origin, sent back there only.
        self._origin = origin_of(self._conn.base_url)

    def stream(self, request: ModelRequest, signal: AbortSignal) -> AsyncIterator[StreamEvent]:
        """Stream one response; see `agentloop.models.Model`."""
        origin = self._origin
        return run_stream(
            self._conn,
            lambda: self._prepare(request),
            lambda rid: ResponsesMapper(rid, origin),
            signal,
            extra=self.extra_headers,
        )

    def _prepare(self, request: ModelRequest) -> Prepared:
        extra = merge_headers(_DOOM_HEADERS, self.extra_headers) if self.doom_loop_check else self.extra_headers
        headers = openai_headers(self._conn, key_optional=self._key_optional, extra=extra)
        body = build_request(
            request, model=self.model, stored=self.store is not False, strict_tools=self.strict_tools, origin=self._origin
        )
        body["stream"] = True
        if self.reasoning is not None:
            body["reasoning"] = self.reasoning
            body["include"] = ["reasoning.encrypted_content"]
        if self.store is not None:
            body["store"] = self.store
        body.update(self.extra_body)
        return "/responses", headers, body
