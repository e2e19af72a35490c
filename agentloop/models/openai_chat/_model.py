"""`OpenAIChatModel`: the Chat Completions connection (key, headers, stream options) and request."""

from __future__ import annotations

from collections.abc import AsyncIterator
from typing import Any

import httpx

from ..._abort import AbortSignal
from ..._model import ModelRequest, StreamEvent
from .._driver import END_GRACE, Prepared, check_end_grace, run_stream
from .._http._client import HTTPModel, check_headers, openai_connection, openai_headers, origin_of
from ._request import build_request
from ._stream import ChatMapper

#: Hosts whose thinking mode needs the reasoning of a tool-call turn passed back (DeepSeek,
#: Moonshot's Kimi): ``echo_reasoning`` defaults to on for them.
_ECHO_HOSTS = frozenset({"api.deepseek.com", "api.moonshot.ai", "api.moonshot.cn"})
#: Hosts of OpenAI's own models, where the output limit is ``max_completion_tokens`` (its
#: reasoning models refuse ``max_tokens``): OpenAI and Azure OpenAI. Other servers read
#: ``max_tokens``, and some do not know the newer name: Ollama drops it unread, Mistral's API
#: and older vLLM refuse it (422, 400).
#: Hosts that take a tool call id of nine letters or digits only (Mistral's API):
#: ``short_tool_ids`` defaults to on for them.
_SHORT_ID_HOSTS = frozenset({"api.mistral.ai"})
_COMPLETION_TOKENS_HOSTS = ("api.openai.com", ".openai.azure.com", ".cognitiveservices.azure.com")


class OpenAIChatModel(HTTPModel):
    """A `Model` backed by OpenAI Chat Completions or a compatible server.

    ``api_key`` defaults to ``OPENAI_API_KEY``; with a ``base_url`` (a local
    vLLM, llama.cpp or Ollama server) it may be absent. ``logprobs=True``
    requests log probabilities and emits `StreamLogprobs` (``top_logprobs``, when set, is sent
    with it). ``include_usage`` (default True) asks for the usage chunk at the end of the stream
    (``stream_options``); turn it off for a server that refuses the option.
    ``max_tokens_param``: the body field for `ModelRequest.max_tokens`; ``None`` (the default)
    sends ``"max_completion_tokens"`` to OpenAI and Azure OpenAI (``api.openai.com``,
    ``*.openai.azure.com``, ``*.cognitiveservices.azure.com``) and ``"max_tokens"`` elsewhere, the
    name every compatible server reads; the resolved name is the model's ``max_tokens_param``.
    ``extra_body`` is merged into every request body.
    ``echo_reasoning``: keep the streamed reasoning (``delta.reasoning_content``) in the
    transcript and send it back as ``reasoning_content`` on each assistant message with tool
    calls, as DeepSeek's and Kimi's thinking modes require; ``None`` (the default) turns it
    on for the hosts ``api.deepseek.com``, ``api.moonshot.ai`` and ``api.moonshot.cn`` only.
    ``short_tool_ids``: send each tool call id as nine letters or digits (an id that is one
    already as it is, another as a hash of it; the transcript keeps the original), as Mistral's
    API and Mistral models' chat templates require; ``None`` (the default) turns it on for
    ``api.mistral.ai`` only. ``strict_tools``: declare the tools ``"strict": true``, their schemas
    made strict (every object closed, every property required; an optional one must accept
    ``null``); a schema that cannot be is a `ModelError` naming the tool.
    ``end_grace``: seconds to wait, once the answer is whole (its ``finish_reason``, and the usage
    when ``include_usage`` asked for it), for the rest of the body (``[DONE]``, its end) before the
    response ends as complete anyway (Ollama versions and proxies keep the connection open); None
    waits for the body's end (the read timeout).
    What a server asks to have back (Gemini's ``extra_content``, OpenRouter's
    ``reasoning_details``) is kept with the server that sent it (`ThinkingBlock.origin`, as for
    the other providers) and sent back to that server only.
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
        logprobs: bool = False,
        top_logprobs: int | None = None,
        include_usage: bool = True,
        max_tokens_param: str | None = None,
        extra_headers: dict[str, str] | None = None,
        extra_body: dict[str, Any] | None = None,
        echo_reasoning: bool | None = None,
        short_tool_ids: bool | None = None,
        strict_tools: bool = False,
        end_grace: float | None = END_GRACE,
    ) -> None:
        self.model = model
        self.end_grace = check_end_grace(end_grace)
        self.logprobs = logprobs
        self.top_logprobs = top_logprobs
        self.include_usage = include_usage
        self.extra_headers = check_headers(extra_headers)
        self.extra_body = dict(extra_body or {})
        self._key_optional = base_url is not None
        self._conn = openai_connection(api_key, base_url, http_client)
        host = self._host = (httpx.URL(self._conn.base_url).host or "").lower()
        self._origin = origin_of(self._conn.base_url)
        if echo_reasoning is None:
            echo_reasoning = host in _ECHO_HOSTS
        self.echo_reasoning = echo_reasoning
        self.short_tool_ids = host in _SHORT_ID_HOSTS if short_tool_ids is None else short_tool_ids
        self.strict_tools = strict_tools
        if max_tokens_param is None:
            openai = host == _COMPLETION_TOKENS_HOSTS[0] or host.endswith(_COMPLETION_TOKENS_HOSTS[1:])
            max_tokens_param = "max_completion_tokens" if openai else "max_tokens"
        self.max_tokens_param = max_tokens_param

    def stream(self, request: ModelRequest, signal: AbortSignal) -> AsyncIterator[StreamEvent]:
        """Stream one response; see `agentloop.models.Model`."""
        logprobs, keep, origin, usage = self.logprobs, self.echo_reasoning, self._origin, self.include_usage
        return run_stream(
            self._conn,
            lambda: self._prepare(request),
            lambda rid: ChatMapper(rid, logprobs=logprobs, keep_reasoning=keep, origin=origin, usage_asked=usage),
            signal,
            error_field=True,
            extra=self.extra_headers,
            grace=self.end_grace,
        )

    def _prepare(self, request: ModelRequest) -> Prepared:
        headers = openai_headers(self._conn, key_optional=self._key_optional, extra=self.extra_headers)
        body = build_request(
            request,
            model=self.model,
            echo_reasoning=self.echo_reasoning,
            host=self._host,
            origin=self._origin,
            short_tool_ids=self.short_tool_ids,
            strict_tools=self.strict_tools,
        )
        body["stream"] = True
        if self.include_usage:
            body["stream_options"] = {"include_usage": True}
        if request.max_tokens:
            body[self.max_tokens_param] = request.max_tokens
        if self.logprobs:
            body["logprobs"] = True
            if self.top_logprobs is not None:
                body["top_logprobs"] = self.top_logprobs
        body.update(self.extra_body)
        return "/chat/completions", headers, body
