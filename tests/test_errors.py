"""The public exceptions: each one survives pickling (a worker process, a task queue, a
multiprocessing pool hands errors back so) with its message and its data."""

from __future__ import annotations

import os
import pickle
import types
from typing import Any

import pytest

import agentloop
import agentloop.models
import agentloop.policies
import agentloop.sessions
import agentloop.testing
from agentloop import _errors

_PUBLIC_MODULES: tuple[types.ModuleType, ...] = (
    agentloop,
    agentloop.models,
    agentloop.policies,
    agentloop.sessions,
    agentloop.testing,
    _errors,
)


def _exported_exceptions() -> list[type[BaseException]]:
    found: dict[str, type[BaseException]] = {}
    for module in _PUBLIC_MODULES:
        for name in getattr(module, "__all__", ()):
            value = getattr(module, name)
            if isinstance(value, type) and issubclass(value, BaseException):
                found[value.__qualname__] = value
    return sorted(found.values(), key=lambda cls: cls.__qualname__)


def _provider_kwargs() -> dict[str, Any]:
    return {
        "provider": "anthropic",
        "status": 529,
        "body": {"type": "error", "error": {"type": "overloaded_error", "message": "Overloaded"}},
        "request_id": "req_011",
        "error_type": "overloaded_error",
        "retryable": True,
        "retry_after": 1.5,
    }


#: One instance of each exported exception, its data set to something other than the defaults.
_SAMPLES: dict[type[BaseException], Any] = {
    _errors.AgentloopError: lambda: _errors.AgentloopError("something broke"),
    _errors.AbortError: lambda: _errors.AbortError("send_now"),
    _errors.ModelError: lambda: _errors.ModelError("stream cut", retryable=True, retry_after=2.0),
    _errors.StreamProtocolError: lambda: _errors.StreamProtocolError("no terminator", retryable=True),
    _errors.ProviderError: lambda: _errors.ProviderError("anthropic HTTP 529: Overloaded", **_provider_kwargs()),
    _errors.ProviderConnectionError: lambda: _errors.ProviderConnectionError(
        "connection failed", provider="openai", retryable=True
    ),
    _errors.ProviderStatusError: lambda: _errors.ProviderStatusError("HTTP 529", **_provider_kwargs()),
    _errors.PromptTooLongError: lambda: _errors.PromptTooLongError(
        "prompt is too long", provider="anthropic", status=400, body={"error": {"message": "too long"}}
    ),
    _errors.ProviderStreamError: lambda: _errors.ProviderStreamError("overloaded_error", **_provider_kwargs()),
    _errors.SessionLockedError: lambda: _errors.SessionLockedError("/tmp/chat.jsonl", os.getpid() + 1),
    _errors.ToolInputError: lambda: _errors.ToolInputError("field required: path"),
    _errors.TranscriptError: lambda: _errors.TranscriptError(["message 0: empty message", "message 1: orphan"]),
}


def test_every_exported_exception_has_a_sample() -> None:
    assert set(_exported_exceptions()) <= set(_SAMPLES)


@pytest.mark.parametrize("cls", _exported_exceptions(), ids=lambda cls: cls.__qualname__)
@pytest.mark.parametrize("protocol", [0, pickle.HIGHEST_PROTOCOL])
def test_an_exported_exception_round_trips_through_pickle(cls: type[BaseException], protocol: int) -> None:
    original = _SAMPLES[cls]()
    assert type(original) is cls
    clone = pickle.loads(pickle.dumps(original, protocol=protocol))
    assert type(clone) is cls
    assert str(clone) == str(original)
    assert repr(clone) == repr(original)
    assert clone.args == original.args
    assert vars(clone) == vars(original)


def test_a_session_locked_error_keeps_its_path_pid_and_os_error_fields() -> None:
    original = _errors.SessionLockedError("/tmp/chat.jsonl", None)
    clone = pickle.loads(pickle.dumps(original))
    assert (clone.path, clone.pid) == ("/tmp/chat.jsonl", None)
    assert "another writer" in str(clone)
    assert isinstance(clone, OSError)
    assert (clone.errno, clone.strerror, clone.filename) == (original.errno, original.strerror, original.filename)


def test_a_pickled_exception_leaves_its_chain_and_traceback_behind() -> None:
    # What an error was raised from (an httpx error whose text may hold a credential header
    # the redactor could not reach) and its frames (locals) stay in the process.
    secret = "sk-live-0123456789abcdef"
    try:
        try:
            raise RuntimeError(f"header Authorization: Bearer {secret}")
        except RuntimeError as exc:
            raise _errors.ProviderConnectionError("connection failed", provider="openai") from exc
    except _errors.ProviderConnectionError as caught:
        raised = caught
    data = pickle.dumps(raised)
    assert secret.encode() not in data
    clone = pickle.loads(data)
    assert clone.__cause__ is None and clone.__traceback__ is None
