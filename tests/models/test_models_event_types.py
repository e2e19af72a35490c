"""A field that must be a string but is not (null, a number, a list) is a malformed
event for every provider: a clear, retryable `StreamProtocolError`, and for the engine a
`model_error` terminal, never an exception out of ``run()``."""

from __future__ import annotations

from typing import Any

import pytest
from _models_support import API_KEY, MockServer, chat_chunk, chat_stream, collect, sse

from agentloop import QueryEngine, TurnEnded
from agentloop._errors import StreamProtocolError
from agentloop.models import AnthropicModel, OpenAIChatModel, OpenAIResponsesModel

BAD = {"null": None, "number": 7, "list": ["x"], "object": {"text": "x"}}


def anthropic(delta: dict[str, Any] | None = None, block: dict[str, Any] | None = None) -> bytes:
    events: list[tuple[str | None, Any]] = [("message_start", {"type": "message_start", "message": {"id": "m"}})]
    start = block or {"type": "text", "text": ""}
    events.append(("content_block_start", {"type": "content_block_start", "index": 0, "content_block": start}))
    if delta is not None:
        events.append(("content_block_delta", {"type": "content_block_delta", "index": 0, "delta": delta}))
    events += [("content_block_stop", {"type": "content_block_stop", "index": 0}), ("message_stop", {"type": "message_stop"})]
    return sse(*events)


def responses(*events: dict[str, Any]) -> bytes:
    created = {"type": "response.created", "response": {"id": "r"}}
    done = {"type": "response.completed", "response": {"id": "r", "status": "completed"}}
    return sse(*[(e["type"], e) for e in (created, *events, done)])


TOOL = {"type": "tool_use", "id": "t1", "name": "f", "input": {}}
CALL = {"type": "function_call", "id": "fc_1", "call_id": "c1", "name": "f", "arguments": ""}
CASES: dict[str, tuple[type[Any], Any]] = {
    "anthropic-text": (AnthropicModel, lambda v: anthropic({"type": "text_delta", "text": v})),
    "anthropic-thinking": (AnthropicModel, lambda v: anthropic({"type": "thinking_delta", "thinking": v},
                                                               {"type": "thinking", "thinking": ""})),
    "anthropic-signature": (AnthropicModel, lambda v: anthropic({"type": "signature_delta", "signature": v},
                                                                {"type": "thinking", "thinking": ""})),
    "anthropic-input": (AnthropicModel, lambda v: anthropic({"type": "input_json_delta", "partial_json": v}, TOOL)),
    "anthropic-tool-name": (AnthropicModel, lambda v: anthropic(None, {**TOOL, "name": v})),
    "anthropic-block-text": (AnthropicModel, lambda v: anthropic(None, {"type": "text", "text": v})),
    "chat-content": (OpenAIChatModel, lambda v: chat_stream(chat_chunk({"content": v}), chat_chunk(finish="stop"))),
    "chat-reasoning": (OpenAIChatModel, lambda v: chat_stream(chat_chunk({"reasoning": v}), chat_chunk(finish="stop"))),
    "chat-arguments": (OpenAIChatModel, lambda v: chat_stream(
        chat_chunk({"tool_calls": [{"index": 0, "id": "c1", "function": {"name": "f", "arguments": v}}]}),
        chat_chunk(finish="tool_calls"))),
    "chat-name": (OpenAIChatModel, lambda v: chat_stream(
        chat_chunk({"tool_calls": [{"index": 0, "id": "c1", "function": {"name": v, "arguments": "{}"}}]}),
        chat_chunk(finish="tool_calls"))),
    "responses-text": (OpenAIResponsesModel, lambda v: responses(
        {"type": "response.output_text.delta", "output_index": 0, "delta": v})),
    "responses-summary": (OpenAIResponsesModel, lambda v: responses(
        {"type": "response.reasoning_summary_text.delta", "output_index": 0, "summary_index": 0, "delta": v})),
    "responses-arguments": (OpenAIResponsesModel, lambda v: responses(
        {"type": "response.output_item.added", "output_index": 0, "item": CALL},
        {"type": "response.function_call_arguments.delta", "output_index": 0, "delta": v})),
    "responses-call-name": (OpenAIResponsesModel, lambda v: responses(
        {"type": "response.output_item.added", "output_index": 0, "item": {**CALL, "name": v}})),
}
# A null that only means "nothing here" is skipped, and chat content or arguments as a
# list or an object are shapes the adapter reads (tests/models/test_models_openai_chat.py).
READ = {("anthropic-input", "null"), ("anthropic-block-text", "null"), ("chat-content", "null"),
        ("chat-reasoning", "null"), ("chat-arguments", "null"), ("chat-name", "null"), ("responses-summary", "null"),
        ("responses-arguments", "null"), ("chat-content", "list"), ("chat-arguments", "object")}  # fmt: skip
MALFORMED = [(case, value) for case in sorted(CASES) for value in BAD if (case, value) not in READ]


@pytest.mark.parametrize(("case", "value"), MALFORMED, ids=[f"{c}-{v}" for c, v in MALFORMED])
async def test_a_field_that_is_not_a_string_is_a_malformed_event_never_a_crash(case: str, value: str) -> None:
    cls, make = CASES[case]
    body = make(BAD[value])
    server = MockServer(body)
    async with server.client() as client:
        with pytest.raises(StreamProtocolError, match="malformed") as info:
            await collect(cls("m", api_key=API_KEY, http_client=client))
    assert info.value.retryable is True

    server = MockServer(body)
    async with server.client() as client:
        engine = QueryEngine(cls("m", api_key=API_KEY, http_client=client), policies=[], retry_budget=0)
        events = [e async for e in engine.run("hi")]
    end = events[-1]
    assert isinstance(end, TurnEnded)
    assert end.reason == "model_error"
    assert "malformed" in (end.error or "")
