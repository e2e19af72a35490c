"""A response whose usage block is malformed (a provider's bug, sent again on every retry) is
kept, its usage reported unknown with a warning: it does not burn the retry budget. A stream
truly cut is still retried."""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import Any

import httpx
import pytest

from agentloop import QueryEngine, TurnEnded
from agentloop.models import AnthropicModel, OpenAIChatModel, OpenAIResponsesModel
from tests.models._models_support import chat_stream, sse


def _anthropic(usage: Any, *, cut: bool = False) -> bytes:
    events: list[tuple[str | None, Any]] = [
        ("message_start", {"type": "message_start", "message": {
            "id": "m1", "type": "message", "role": "assistant", "content": [], "model": "x",
            "usage": {"input_tokens": 5, "output_tokens": 1}}}),
        ("content_block_start", {"type": "content_block_start", "index": 0, "content_block": {"type": "text", "text": ""}}),
        ("content_block_delta", {"type": "content_block_delta", "index": 0, "delta": {"type": "text_delta", "text": "hello"}}),
        ("content_block_stop", {"type": "content_block_stop", "index": 0}),
        ("message_delta", {"type": "message_delta", "delta": {"stop_reason": "end_turn"}, "usage": usage}),
        ("message_stop", {"type": "message_stop"}),
    ]  # fmt: skip
    return sse(*events[: 3 if cut else None])


def _chat(usage: Any, *, cut: bool = False) -> bytes:
    text = {"id": "c", "choices": [{"index": 0, "delta": {"role": "assistant", "content": "hello"}, "finish_reason": None}]}
    end = {"id": "c", "choices": [{"index": 0, "delta": {}, "finish_reason": "stop"}]}
    if cut:
        return chat_stream(text)
    return chat_stream(text, end, {"id": "c", "choices": [], "usage": usage})


def _responses(usage: Any, *, cut: bool = False) -> bytes:
    item = {"type": "message", "id": "msg1", "role": "assistant", "status": "completed",
            "content": [{"type": "output_text", "text": "hello", "annotations": []}]}  # fmt: skip
    response = {"id": "r1", "object": "response", "status": "completed", "output": [item], "usage": usage}
    events: list[tuple[str | None, Any]] = [
        ("response.created", {"type": "response.created", "response": {**response, "status": "in_progress", "output": [], "usage": None}}),
        ("response.output_text.delta", {"type": "response.output_text.delta", "item_id": "msg1", "output_index": 0,
                                        "content_index": 0, "delta": "hello"}),
        ("response.completed", {"type": "response.completed", "response": response}),
    ]  # fmt: skip
    return sse(*events[: 2 if cut else None])


PROVIDERS: list[tuple[type[Any], Callable[..., bytes]]] = [
    (AnthropicModel, _anthropic),
    (OpenAIChatModel, _chat),
    (OpenAIResponsesModel, _responses),
]
MALFORMED: list[Any] = [
    "oops",
    [1, 2],
    7,
    {"input_tokens": "many", "prompt_tokens": "many", "output_tokens": 3, "completion_tokens": 3},
    {"input_tokens": 1, "prompt_tokens": 1, "input_tokens_details": "y", "prompt_tokens_details": "z",
     "cache_read_input_tokens": -4},
]  # fmt: skip


async def _run(cls: type[Any], body: bytes) -> tuple[TurnEnded, int, QueryEngine]:
    requests = 0

    def handler(request: httpx.Request) -> httpx.Response:
        nonlocal requests
        requests += 1
        return httpx.Response(200, content=body, headers={"content-type": "text/event-stream"})

    client = httpx.AsyncClient(transport=httpx.MockTransport(handler))
    engine = QueryEngine(cls("m", api_key="k", http_client=client), policies=[], retry_base_delay=0.001)
    events = [e async for e in engine.run("hi")]
    await client.aclose()
    end = events[-1]
    assert isinstance(end, TurnEnded)
    return end, requests, engine


@pytest.mark.parametrize("usage", MALFORMED, ids=["str", "list", "int", "bad-count", "bad-details"])
@pytest.mark.parametrize(("cls", "body"), PROVIDERS, ids=["anthropic", "chat", "responses"])
async def test_a_malformed_usage_block_keeps_the_response_and_warns_once_without_retrying(
    cls: type[Any], body: Callable[..., bytes], usage: Any, caplog: pytest.LogCaptureFixture
) -> None:
    with caplog.at_level(logging.WARNING, logger="agentloop"):
        end, requests, engine = await _run(cls, body(usage))
    assert (end.reason, requests) == ("completed", 1)
    assert engine.messages[-1].text == "hello"
    warned = [r.getMessage() for r in caplog.records if "usage" in r.getMessage()]
    assert len(warned) == 1 and "malformed" in warned[0] and "unknown" in warned[0]
    assert not [r for r in caplog.records if r.levelno >= logging.ERROR]


@pytest.mark.parametrize(("cls", "body"), PROVIDERS, ids=["anthropic", "chat", "responses"])
async def test_a_stream_truly_cut_is_still_retried(cls: type[Any], body: Callable[..., bytes]) -> None:
    end, requests, _engine = await _run(cls, body({"input_tokens": 1}, cut=True))
    assert end.reason == "model_error" and requests > 1


def _anthropic_both(usage: Any) -> bytes:
    """Malformed usage in message_start and in message_delta."""
    events: list[tuple[str | None, Any]] = [
        ("message_start", {"type": "message_start", "message": {
            "id": "m1", "type": "message", "role": "assistant", "content": [], "model": "x", "usage": usage}}),
        ("content_block_start", {"type": "content_block_start", "index": 0, "content_block": {"type": "text", "text": ""}}),
        ("content_block_delta", {"type": "content_block_delta", "index": 0, "delta": {"type": "text_delta", "text": "hello"}}),
        ("content_block_stop", {"type": "content_block_stop", "index": 0}),
        ("message_delta", {"type": "message_delta", "delta": {"stop_reason": "end_turn"}, "usage": usage}),
        ("message_stop", {"type": "message_stop"}),
    ]  # fmt: skip
    return sse(*events)


def _chat_every_chunk(usage: Any) -> bytes:
    """vLLM's way: the usage on every chunk (here malformed on each)."""
    pieces = [
        {"id": "c", "choices": [{"index": 0, "delta": {"role": "assistant", "content": t}, "finish_reason": None}],
         "usage": usage} for t in ("he", "l", "lo")
    ]  # fmt: skip
    end = {"id": "c", "choices": [{"index": 0, "delta": {}, "finish_reason": "stop"}], "usage": usage}
    return chat_stream(*pieces, end, {"id": "c", "choices": [], "usage": usage})


@pytest.mark.parametrize("usage", MALFORMED, ids=["str", "list", "int", "bad-count", "bad-details"])
@pytest.mark.parametrize(
    ("cls", "body"), [(AnthropicModel, _anthropic_both), (OpenAIChatModel, _chat_every_chunk)], ids=["anthropic", "chat"]
)
async def test_malformed_usage_in_every_event_of_a_response_warns_once(
    cls: type[Any], body: Callable[[Any], bytes], usage: Any, caplog: pytest.LogCaptureFixture
) -> None:
    """The warning came once per usage object: a server sending the usage on every chunk (vLLM)
    flooded the log with one per chunk. It comes once per response."""
    with caplog.at_level(logging.WARNING, logger="agentloop"):
        end, requests, engine = await _run(cls, body(usage))
    assert (end.reason, requests) == ("completed", 1)
    assert engine.messages[-1].text == "hello"
    warned = [r.getMessage() for r in caplog.records if "malformed usage" in r.getMessage()]
    assert len(warned) == 1


@pytest.mark.parametrize(("cls", "body"), PROVIDERS, ids=["anthropic", "chat", "responses"])
async def test_malformed_usage_under_a_usage_limit_warns_that_the_limit_cannot_hold(
    cls: type[Any], body: Callable[..., bytes], caplog: pytest.LogCaptureFixture
) -> None:
    """Usage read as 0 never reaches a run's usage_limit: the warning says so."""
    client = httpx.AsyncClient(
        transport=httpx.MockTransport(
            lambda _r: httpx.Response(200, content=body("oops"), headers={"content-type": "text/event-stream"})
        )
    )
    engine = QueryEngine(cls("m", api_key="k", http_client=client), policies=[], usage_limit=500)
    with caplog.at_level(logging.WARNING, logger="agentloop"):
        events = [e async for e in engine.run("hi")]
    await client.aclose()
    assert isinstance(events[-1], TurnEnded) and events[-1].reason == "completed"
    (warned,) = [r.getMessage() for r in caplog.records if "malformed usage" in r.getMessage()]
    assert "a usage_limit cannot hold while this provider's usage is unreadable" in warned


