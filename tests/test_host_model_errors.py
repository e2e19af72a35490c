"""A model of the host's own that fails: the credentials the engine knows (its ancestors' models'
keys) are taken out of what its error says in the events, and a stop reason that is not a string
ends the turn without a retry, as the built-in providers' does."""

from __future__ import annotations

import logging
from collections.abc import AsyncIterator
from typing import Any

import httpx
import pytest

from agentloop import AbortSignal, ModelError, QueryEngine, StreamProtocolError
from agentloop.models import ModelRequest, OpenAIChatModel, StreamEnd, StreamEvent, StreamText

KEY = "sk-host-KNOWN-0123456789abcdefABCDEF"
UNKNOWN = "sk-host-NEVER-SEEN-9876543210fedcba"


class Failing:
    """Raises ``error`` on every request, once it has streamed a word."""

    def __init__(self, error: Exception) -> None:
        self.error = error
        self.calls = 0

    async def stream(self, request: ModelRequest, signal: AbortSignal) -> AsyncIterator[StreamEvent]:
        self.calls += 1
        yield StreamText(0, "Hi")
        raise self.error


def _no_http(request: httpx.Request) -> httpx.Response:
    raise AssertionError("no request is made")


async def _run_child(model: Any, caplog: pytest.LogCaptureFixture) -> tuple[list[Any], str]:
    """The events of a run of a subagent on ``model``, its parent on an HTTP model holding ``KEY``."""
    async with httpx.AsyncClient(transport=httpx.MockTransport(_no_http)) as client:
        parent = QueryEngine(OpenAIChatModel("m", api_key=KEY, http_client=client), policies=[])
        child = parent.subagent(agent_id="helper", model=model, retry_budget=1, retry_base_delay=0)
        with caplog.at_level(logging.DEBUG, "agentloop"):
            events = [e async for e in child.run("hi")]
    fmt = logging.Formatter("%(message)s")
    return events, "\n".join(fmt.format(r) for r in caplog.records)


@pytest.mark.parametrize(
    ("error", "shown"),
    [
        (ModelError(f"upstream said: bad key {KEY}", retryable=True), "ModelError: upstream said: bad key [REDACTED]"),
        (StreamProtocolError(f"odd event {KEY!r}", retryable=True), "StreamProtocolError: odd event '[REDACTED]'"),
        (RuntimeError(f"Authorization: Bearer {KEY}"), "ModelError: the model raised RuntimeError: Authorization: Bearer [REDACTED]"),
    ],
    ids=["model-error", "protocol-error", "other-exception"],
)  # fmt: skip
async def test_a_host_models_error_never_shows_a_key_the_engine_knows(
    error: Exception, shown: str, caplog: pytest.LogCaptureFixture
) -> None:
    # Before, the message went into Retrying.error and TurnEnded.error as the model wrote it.
    model = Failing(error)
    events, logged = await _run_child(model, caplog)
    end = events[-1]
    assert end.type == "turn_ended" and end.reason == "model_error"
    assert end.error == shown
    retried = getattr(error, "retryable", False)  # a bug of the model's (the RuntimeError) is not
    retries = [e.error for e in events if e.type == "retrying"]
    assert retries == ([shown.split(": ", 1)[1]] if retried else [])
    assert model.calls == 1 + retried
    assert KEY not in repr(events) and KEY not in logged and KEY not in repr(model)


async def test_a_key_the_engine_never_saw_is_shown_as_the_model_wrote_it(caplog: pytest.LogCaptureFixture) -> None:
    # The limit docs/providers.md states: only what the engine knows can be taken out.
    events, _ = await _run_child(Failing(ModelError(f"bad key {UNKNOWN}")), caplog)
    end = events[-1]
    assert end.type == "turn_ended" and end.error == f"ModelError: bad key {UNKNOWN}"


class BadStop:
    """Streams a word, then ends with a stop reason that is not a string."""

    def __init__(self, reason: Any) -> None:
        self.reason = reason
        self.calls = 0

    async def stream(self, request: ModelRequest, signal: AbortSignal) -> AsyncIterator[StreamEvent]:
        self.calls += 1
        yield StreamText(0, "Hi")
        yield StreamEnd(self.reason)


@pytest.mark.parametrize("reason", [["end_turn"], {"k": "v"}, 3], ids=["list", "dict", "int"])
async def test_a_stop_reason_that_is_not_a_string_is_not_retried(reason: Any) -> None:
    # Before, the accumulator's check made it retryable: the whole budget was spent on a model
    # that ends the same way every time.
    model = BadStop(reason)
    engine = QueryEngine(model, policies=[], retry_budget=3, retry_base_delay=0)
    events = [e async for e in engine.run("hi")]
    end = events[-1]
    assert end.type == "turn_ended" and end.reason == "model_error"
    assert end.error is not None and end.error.startswith("StreamProtocolError: malformed stream event: ")
    assert "stop_reason" in end.error
    assert [e for e in events if e.type == "retrying"] == [] and model.calls == 1
