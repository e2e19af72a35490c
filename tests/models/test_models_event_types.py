"""A field that must be a string but is not (null, a number, a list) is a malformed
event for every provider: a clear, retryable `StreamProtocolError`, and for the engine a
`model_error` terminal, never an exception out of ``run()``."""

from __future__ import annotations

import json
from typing import Any

import pytest
from _models_support import API_KEY, MockServer, chat_chunk, chat_stream, collect, model_error_run, sse
from hypothesis import given
from hypothesis import strategies as st

from agentloop import QueryEngine, TurnEnded
from agentloop._errors import StreamProtocolError
from agentloop.models import AnthropicModel, OpenAIChatModel, OpenAIResponsesModel
from agentloop.models._sse import ServerSentEvent
from agentloop.models.anthropic import AnthropicMapper

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


# -- a block index that is not an int ---------------------------------------------------

_INDEX_BAD: dict[str, Any] = {"str": "0", "null": None, "float": 0.0, "bool": False, "list": [0], "object": {"i": 0}}


def _anthropic_indexed(where: str, index: Any) -> bytes:
    def at(name: str) -> Any:
        return index if name == where else 0

    return sse(
        ("message_start", {"type": "message_start", "message": {"id": "m"}}),
        ("content_block_start", {"type": "content_block_start", "index": at("start"), "content_block": {"type": "text", "text": ""}}),
        ("content_block_delta", {"type": "content_block_delta", "index": at("delta"), "delta": {"type": "text_delta", "text": "hi"}}),
        ("content_block_stop", {"type": "content_block_stop", "index": at("stop")}),
        ("message_delta", {"type": "message_delta", "delta": {"stop_reason": "end_turn"}}),
        ("message_stop", {"type": "message_stop"}),
    )  # fmt: skip


_INDEX_CASES: dict[str, tuple[type[Any], Any, list[str]]] = {
    **{
        f"anthropic-{where}": (AnthropicModel, lambda v, w=where: _anthropic_indexed(w, v), list(_INDEX_BAD))
        for where in ("start", "delta", "stop")
    },
    # A tool call without an index (Gemini), or with a null one, is placed by its position.
    "chat-tool-call": (OpenAIChatModel, lambda v: chat_stream(
        chat_chunk({"tool_calls": [{"index": v, "id": "c1", "function": {"name": "f", "arguments": "{}"}}]}),
        chat_chunk(finish="tool_calls")), [k for k in _INDEX_BAD if k != "null"]),
    # llama.cpp's emulation sends no output_index (nor a null one): its items are keyed by id.
    "responses-output": (OpenAIResponsesModel, lambda v: responses(
        {"type": "response.output_text.delta", "output_index": v, "item_id": "msg_1", "delta": "hi"}),
        [k for k in _INDEX_BAD if k != "null"]),
}  # fmt: skip
_INDEX_MALFORMED = [(case, value) for case, (_, _, values) in sorted(_INDEX_CASES.items()) for value in values]


@pytest.mark.parametrize(("case", "value"), _INDEX_MALFORMED, ids=[f"{c}-{v}" for c, v in _INDEX_MALFORMED])
async def test_a_block_index_that_is_not_an_int_is_a_malformed_event_never_a_crash(case: str, value: str) -> None:
    cls, make, _ = _INDEX_CASES[case]
    body = make(_INDEX_BAD[value])
    server = MockServer(body)
    async with server.client() as client:
        with pytest.raises(StreamProtocolError, match="index") as info:
            await collect(cls("m", api_key=API_KEY, http_client=client))
    assert "malformed" in str(info.value)
    assert type(_INDEX_BAD[value]).__name__ in str(info.value)

    end, _ = await model_error_run(cls, body)
    assert "index" in (end.error or "")


@pytest.mark.parametrize("case", ["chat-tool-call", "responses-output"])
async def test_a_null_index_is_read_as_no_index(case: str) -> None:
    cls, make, _ = _INDEX_CASES[case]
    server = MockServer(make(None))
    async with server.client() as client:
        _, acc = await collect(cls("m", api_key=API_KEY, http_client=client))
    message = acc.message()
    assert message.text == "hi" or [(t.id, t.input) for t in message.tool_uses] == [("c1", {})]


_JSON_NOT_INT = st.recursive(
    st.none() | st.booleans() | st.floats() | st.text(max_size=4),
    lambda children: st.lists(children, max_size=2) | st.dictionaries(st.text(max_size=3), children, max_size=2),
    max_leaves=4,
)


@given(index=_JSON_NOT_INT, event=st.sampled_from(["content_block_start", "content_block_delta", "content_block_stop"]))
def test_any_anthropic_index_that_is_not_an_int_is_a_protocol_error(index: Any, event: str) -> None:
    mapper = AnthropicMapper()
    mapper.handle(ServerSentEvent(json.dumps({"type": "message_start", "message": {"id": "m"}})))
    mapper.handle(ServerSentEvent(json.dumps({"type": "content_block_start", "index": 0, "content_block": {"type": "text", "text": ""}})))  # fmt: skip
    fields = {
        "content_block_start": {"content_block": {"type": "text", "text": ""}},
        "content_block_delta": {"delta": {"type": "text_delta", "text": "x"}},
        "content_block_stop": {},
    }[event]
    with pytest.raises(StreamProtocolError, match="not an int"):
        mapper.handle(ServerSentEvent(json.dumps({"type": event, "index": index, **fields})))
