"""The errors a Chat Completions stream reports in-band, as `ProviderError`s.

An error chunk (``data: {"error": ...}``, older vLLM's flat ``data: {"object": "error", ...}``,
or an ``error`` event) becomes `ProviderStreamError`,
or `PromptTooLongError` for a context overflow; ``finish_reason: "error"`` too, retryable. A
code that is an HTTP status (vLLM's int, LiteLLM's str) or a known transient code is retryable.
"""

from __future__ import annotations

from typing import Any

from ..._errors import PromptTooLongError, ProviderError, ProviderStreamError
from .._http._errors import error_code, error_fields, prompt_too_long
from .._http._retry import RETRYABLE_STATUSES

_RETRYABLE_CODES = frozenset({"rate_limit_exceeded", "server_error", "internal_server_error",
                              "server_is_overloaded", "slow_down", "InternalServerError",
                              "ServiceUnavailableError", "too_many_requests"})  # fmt: skip
_RETRYABLE_INT = RETRYABLE_STATUSES


def stream_error(obj: dict[str, Any], request_id: str | None) -> ProviderError:
    """`ProviderStreamError`, or `PromptTooLongError` (``status=200``) for a context
    overflow (llama.cpp's ``exceed_context_size_error``, OpenAI's ``context_length_exceeded``)."""
    message, kind = error_fields(obj)
    code = error_code(obj)
    if kind == "None":  # how LiteLLM's proxy writes the type of an exception that has none
        kind = str(code) if code is not None else None
    too_long = prompt_too_long(message, kind, code)
    # A code that is an HTTP status (vLLM's int, LiteLLM's str "429") is retryable as it is.
    status = str(code)
    retryable = not too_long and (
        (status.isascii() and status.isdigit() and int(status) in _RETRYABLE_INT)
        or bool({status, kind} & _RETRYABLE_CODES)
    )
    cls = PromptTooLongError if too_long else ProviderStreamError
    label = kind or (str(code) if code is not None else "")
    return cls(
        f"openai chat stream error ({label}): {message or 'stream error'}"
        if label
        else f"openai chat stream error: {message or 'stream error'}",
        provider="openai",
        status=200,
        body=obj,
        request_id=request_id,
        error_type=kind or (str(code) if code is not None else None),
        retryable=retryable,
    )


def finish_error(detail: Any, request_id: str | None) -> ProviderError:
    """The error for ``finish_reason: "error"`` (Mistral, OpenRouter): the generation
    failed midway, so what streamed is not the whole answer. Retryable, as a server
    failure is, unless the context does not fit."""
    if not isinstance(detail, dict) or not detail.get("message"):
        detail = {"message": "the server ended the response with finish_reason 'error'"}
    err = stream_error({"error": detail}, request_id)
    if not isinstance(err, PromptTooLongError):
        err.retryable = True
    return err
