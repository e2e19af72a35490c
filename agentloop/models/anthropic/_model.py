"""`AnthropicModel`: the Messages API's connection (key, auth header, version) and request."""

from __future__ import annotations

from collections.abc import AsyncIterator, Mapping, Sequence
from typing import Any

import httpx

from ..._abort import AbortSignal
from ..._model import ModelRequest, StreamEvent
from .._driver import END_GRACE, Prepared, check_end_grace, run_stream
from .._http._client import Connection, HTTPModel, check_headers, gives, merge_headers, missing_key, origin_of
from .._http._secrets import KEY_VARIABLES, resolve_key
from ._request import build_request
from ._stream import AnthropicMapper


class AnthropicModel(HTTPModel):
    """A `Model` backed by the Anthropic Messages API (streaming).

    ``api_key`` defaults to ``ANTHROPIC_API_KEY`` (a missing key raises
    `ModelError` when a request is made). ``thinking``: a Messages ``thinking``
    object, or an int budget for ``{"type": "enabled", "budget_tokens": n}``.
    ``auth_header``: ``"x-api-key"`` or ``"authorization"`` (Bearer).
    ``extra_tools``: tool definitions declared as they are after the engine's tools:
    Anthropic's server tools (``{"type": "web_search_20250305", "name": "web_search"}``),
    or an Anthropic-defined client tool (``{"type": "bash_20250124", "name": "bash"}``),
    which replaces the declaration of the engine's tool of the same name (that tool runs it).
    ``extra_body`` is merged into every request body. ``anthropic_version``: the
    ``anthropic-version`` header sent.
    ``http_client``: an ``httpx.AsyncClient`` to send through (its owner closes it); without
    one the model makes its own on first use, closed by ``aclose()``. ``extra_headers`` go
    on every request, each replacing the library's header of the same name (case ignored);
    ValueError for a name or value HTTP cannot carry (the value is never quoted).
    Thinking is kept with the server that made it (`ThinkingBlock.origin`: the scheme, host,
    port and path of ``base_url``) and sent back to that server only: another Anthropic-compatible
    server (DeepSeek's, Kimi's) cannot check its signatures, and refuses the request.
    ``end_grace``: seconds to wait, once a ``message_delta`` gave the stop reason, for the rest
    of the body (``message_stop``, its end) before the response ends as complete anyway (a
    gateway that keeps the connection open); None waits for the body's end (the read timeout).
    Errors: the `ProviderError` tree, `StreamProtocolError`, `AbortError`.
    """

    def __init__(
        self,
        model: str,
        *,
        api_key: str | None = None,
        base_url: str | None = None,
        http_client: httpx.AsyncClient | None = None,
        max_tokens: int = 4096,
        thinking: dict[str, Any] | int | None = None,
        auth_header: str = "x-api-key",
        anthropic_version: str = "2023-06-01",
        extra_headers: dict[str, str] | None = None,
        extra_body: dict[str, Any] | None = None,
        extra_tools: Sequence[Mapping[str, Any]] = (),
        end_grace: float | None = END_GRACE,
    ) -> None:
        self.model = model
        self.end_grace = check_end_grace(end_grace)
        self.max_tokens = max_tokens
        self.thinking = (
            {"type": "enabled", "budget_tokens": thinking} if isinstance(thinking, int) else thinking
        )
        self.auth_header = auth_header.lower()
        self.anthropic_version = anthropic_version
        self.extra_headers = check_headers(extra_headers)
        self.extra_body = dict(extra_body or {})
        self.extra_tools = [dict(t) for t in extra_tools]
        self._conn = Connection(
            "anthropic",
            base_url or "https://api.anthropic.com",
            secret=resolve_key(api_key, KEY_VARIABLES["anthropic"]),
            http_client=http_client,
            request_id_header="request-id",
        )
        self._origin = origin_of(self._conn.base_url)

    def stream(self, request: ModelRequest, signal: AbortSignal) -> AsyncIterator[StreamEvent]:
        """Stream one response; see `agentloop.models.Model`."""
        origin = self._origin
        return run_stream(
            self._conn,
            lambda: self._prepare(request),
            lambda rid: AnthropicMapper(rid, origin),
            signal,
            extra=self.extra_headers,
            grace=self.end_grace,
        )

    def _prepare(self, request: ModelRequest) -> Prepared:
        secret = self._conn.secret
        hosts = self._conn.host_sets(self.auth_header)  # the host's own client carries the credential
        if secret is None and not hosts and not gives(self.extra_headers, self.auth_header):
            raise missing_key("anthropic", KEY_VARIABLES["anthropic"])
        headers = {
            "anthropic-version": self.anthropic_version,
            "content-type": "application/json",
            "accept": "text/event-stream",
        }
        if secret is not None and not hosts:
            key = secret.reveal()
            headers[self.auth_header] = f"Bearer {key}" if self.auth_header == "authorization" else key
        headers = merge_headers(headers, self.extra_headers)  # the host's own header wins, alone
        beta = next((v for k, v in headers.items() if k.lower() == "anthropic-beta"), "")
        body = build_request(
            request,
            model=self.model,
            max_tokens=self.max_tokens,
            thinking=self.thinking,
            extra_tools=self.extra_tools,
            interleaved="interleaved-thinking" in beta,
            origin=self._origin,
        )
        body.update(self.extra_body)
        return "/v1/messages", headers, body
