"""Every exception agentloop raises, in one place.

    AgentloopError
     ├── AbortError                  a run or a piece of work was aborted (.reason)
     ├── ModelError                  one model request failed (.retryable, .retry_after)
     │    ├── StreamProtocolError    malformed or truncated stream (no terminator, bad JSON)
     │    └── ProviderError          an HTTP provider answered with an error (.status, .body, .request_id)
     │         ├── ProviderConnectionError   the request never got an answer (connect/read failure)
     │         ├── ProviderStatusError       non-2xx HTTP status
     │         │    └── PromptTooLongError   the context does not fit: terminal "prompt_too_long"
     │         └── ProviderStreamError       an error event inside a 200 stream (Anthropic overloaded_error, ...)
     ├── SessionLockedError          a session file has another writer (.path, .pid); an OSError too
     ├── ToolInputError              the model's tool input failed validation (becomes an error tool_result)
     └── TranscriptError             a transcript breaks the provider rules and cannot be used as is

Errors carry data, never credentials: nothing here stores request headers, and
`ProviderError` keeps only the status, the response body and the request id.

Every error pickles (a worker process or a task queue hands it back so) with its message and
its data as they are: unpickling does not call ``__init__`` again, which would want arguments
the error no longer has, or word its message a second time. As for any exception, what it was
raised from (``__cause__``, ``__context__``) and its traceback are not pickled.
"""

from __future__ import annotations

import os
from typing import Any

__all__ = [
    "AbortError",
    "AgentloopError",
    "ModelError",
    "PromptTooLongError",
    "ProviderConnectionError",
    "ProviderError",
    "ProviderStatusError",
    "ProviderStreamError",
    "SessionLockedError",
    "StreamProtocolError",
    "ToolInputError",
    "TranscriptError",
]


def _restore(cls: type[AgentloopError], args: tuple[Any, ...]) -> AgentloopError:
    """An error of type ``cls`` with ``args``, made without its ``__init__`` (see `__reduce__`)."""
    error = cls.__new__(cls)
    error.args = args
    return error


class AgentloopError(Exception):
    """Base class of agentloop's own errors."""

    def __reduce__(self) -> tuple[Any, ...]:
        # Exception's own: ``type(self)(*self.args)`` then the attributes, which calls an
        # ``__init__`` with the message where it wants its data (AbortError("aborted: cancel")
        # said "aborted: aborted: cancel"), or without the keywords it requires.
        return _restore, (type(self), self.args), self.__dict__ or None


class AbortError(AgentloopError):
    """Raised by `AbortSignal.throw_if_aborted` (and by cooperative code) once aborted.

    ``reason`` is the abort reason, for example ``"cancel"`` or ``"send_now"``.
    """

    def __init__(self, reason: str) -> None:
        super().__init__(f"aborted: {reason}")
        self.reason = reason

    def __reduce__(self) -> tuple[Any, ...]:
        # Rebuilt from its reason: from ``args`` (the message) it would read "aborted: aborted: ...".
        return type(self), (self.reason,), self.__dict__


class ModelError(AgentloopError):
    """A model request failed.

    ``retryable``: the engine may retry it within its transport retry budget.
    ``retry_after``: seconds the server asked us to wait, if it said.
    """

    def __init__(
        self, message: str, *, retryable: bool = False, retry_after: float | None = None
    ) -> None:
        super().__init__(message)
        self.message = message
        self.retryable = retryable
        self.retry_after = retry_after


class StreamProtocolError(ModelError):
    """The stream was malformed or ended without its terminator."""


class ProviderError(ModelError):
    """An HTTP provider returned an error.

    ``provider``: "anthropic", "openai", ...; ``status``: HTTP status (200 for an
    error event inside a stream); ``body``: the decoded error body; ``error_type``:
    the provider's error type string; ``request_id``: the provider's request id;
    ``retryable`` and ``retry_after`` as for `ModelError`.
    """

    def __init__(
        self,
        message: str,
        *,
        provider: str,
        status: int | None = None,
        body: Any = None,
        request_id: str | None = None,
        error_type: str | None = None,
        retryable: bool = False,
        retry_after: float | None = None,
    ) -> None:
        super().__init__(message, retryable=retryable, retry_after=retry_after)
        self.provider = provider
        self.status = status
        self.body = body
        self.request_id = request_id
        self.error_type = error_type

    def __repr__(self) -> str:
        return (
            f"{type(self).__name__}({self.message!r}, provider={self.provider!r}, "
            f"status={self.status!r}, error_type={self.error_type!r}, "
            f"request_id={self.request_id!r})"
        )


class ProviderConnectionError(ProviderError):
    """The provider could not be reached or the connection broke."""


class ProviderStatusError(ProviderError):
    """The provider answered with a non-2xx HTTP status."""


class PromptTooLongError(ProviderStatusError):
    """The request does not fit the model's context window."""


class ProviderStreamError(ProviderError):
    """The provider sent an error event inside a stream that began with HTTP 200."""


class SessionLockedError(AgentloopError, OSError):
    """A session file is open for writing by another writer: another process (a worker still
    running, a second terminal), or another `JsonlSession` object of this process.

    Raised instead of interleaving two writers' records. ``path``: the session file. ``pid``:
    the process holding it, when the platform says (Linux does); it may be this process.
    """

    def __init__(self, path: str, pid: int | None) -> None:
        if pid is None:
            who = "another writer"
        elif pid == os.getpid():
            who = f"another session object of this process (pid {pid})"
        else:
            who = f"another process (pid {pid})"
        super().__init__(
            f"session {path!r} is open for writing by {who}: a session file has one writer at a "
            "time (close the other, or let it end, then resume the file)"
        )
        self.path = path
        self.pid = pid


class ToolInputError(AgentloopError):
    """The model's input for a tool failed validation."""


class TranscriptError(AgentloopError):
    """A transcript violates the provider rules (see `validate_transcript`): ``violations``, one
    line per rule broken, also make up the message."""

    def __init__(self, violations: list[str]) -> None:
        super().__init__("invalid transcript:\n" + "\n".join(violations))
        self.violations = violations
