"""Chat Completions and Anthropic streams whose values have the wrong type, the API key echoed
inside them: each is a malformed event raised by the model itself, where its errors are scrubbed,
and the key shows nowhere the host looks (the turn's error, the events, the log, the exception)."""

from __future__ import annotations

import logging
import re
from typing import Any

import pytest
from _models_support import API_KEY, MockServer, chat_chunk, chat_stream, collect, sse

from agentloop import QueryEngine, TurnEnded
from agentloop._errors import StreamProtocolError
from agentloop.models import AnthropicModel, OpenAIChatModel, StreamEnd

#: A piece of the key: a quote cut short would still show it.
PIECE = API_KEY[8:20]


def _log_text(caplog: pytest.LogCaptureFixture) -> str:
    fmt = logging.Formatter("%(message)s")
    return "\n".join(fmt.format(r) for r in caplog.records)


def _no_key(*texts: str) -> None:
    for text in texts:
        assert API_KEY not in text
        assert PIECE not in text


# -- Chat Completions -------------------------------------------------------------------------


def _call(**fields: Any) -> dict[str, Any]:
    function = {"name": "f", "arguments": "{}", **fields.pop("function", {})}
    return {"tool_calls": [{"index": 0, "id": "call_1", "type": "function", "function": function, **fields}]}


_CHAT: dict[str, bytes] = {
    "content": chat_stream(chat_chunk({"content": {"text": API_KEY}}), chat_chunk(finish="stop")),
    "content-number-key": chat_stream(chat_chunk({"content": {API_KEY: 1}}), chat_chunk(finish="stop")),
    "content-part-text": chat_stream(
        chat_chunk({"content": [{"type": "text", "text": [API_KEY]}]}), chat_chunk(finish="stop")
    ),
    "content-part-thinking": chat_stream(
        chat_chunk({"content": [{"type": "thinking", "thinking": {"k": API_KEY}}]}), chat_chunk(finish="stop")
    ),
    "content-part-thinking-list": chat_stream(
        chat_chunk({"content": [{"type": "thinking", "thinking": [{"type": "text", "text": "ok"},
                                                                  {"type": "text", "text": [API_KEY]}]}]}),
        chat_chunk(finish="stop"),
    ),
    "refusal": chat_stream(chat_chunk({"refusal": [API_KEY]}), chat_chunk(finish="stop")),
    "reasoning": chat_stream(chat_chunk({"reasoning": {"k": API_KEY}}), chat_chunk(finish="stop")),
    "reasoning-content": chat_stream(chat_chunk({"reasoning_content": [API_KEY]}), chat_chunk(finish="stop")),
    "tool-id": chat_stream(chat_chunk(_call(id=[API_KEY])), chat_chunk(finish="tool_calls")),
    "tool-name": chat_stream(chat_chunk(_call(function={"name": {"k": API_KEY}})), chat_chunk(finish="tool_calls")),
    "arguments": chat_stream(
        chat_chunk(_call(function={"arguments": [API_KEY] * 8})), chat_chunk(finish="tool_calls")
    ),
    "arguments-short": chat_stream(
        chat_chunk(_call(function={"arguments": [API_KEY]})), chat_chunk(finish="tool_calls")
    ),
    "tool-index": chat_stream(chat_chunk({"tool_calls": [{"index": [API_KEY], "id": "c", "function": {"name": "f"}}]})),
    "finish-reason": chat_stream(chat_chunk({"content": "Hi"}), chat_chunk(finish=[API_KEY])),  # type: ignore[arg-type]
}


# -- Anthropic ----------------------------------------------------------------------------------

_START = ("message_start", {"type": "message_start", "message": {"id": "msg_1", "usage": {"input_tokens": 5}}})
_STOP = ("message_stop", {"type": "message_stop"})


def _block(index: int, block: dict[str, Any]) -> tuple[str, dict[str, Any]]:
    return ("content_block_start", {"type": "content_block_start", "index": index, "content_block": block})


def _delta(index: Any, delta: dict[str, Any]) -> tuple[str, dict[str, Any]]:
    return ("content_block_delta", {"type": "content_block_delta", "index": index, "delta": delta})


def _end(reason: Any = "end_turn") -> list[tuple[str, dict[str, Any]]]:
    return [
        ("content_block_stop", {"type": "content_block_stop", "index": 0}),
        ("message_delta", {"type": "message_delta", "delta": {"stop_reason": reason}, "usage": {"output_tokens": 2}}),
        _STOP,
    ]


_TEXT = {"type": "text", "text": ""}
_THINKING = {"type": "thinking", "thinking": "", "signature": ""}
_TOOL = {"type": "tool_use", "id": "toolu_1", "name": "f", "input": {}}

_ANTHROPIC: dict[str, bytes] = {
    "text": sse(_START, _block(0, _TEXT), _delta(0, {"type": "text_delta", "text": [API_KEY]}), *_end()),
    "start-text": sse(_START, _block(0, {"type": "text", "text": {"k": API_KEY}}), *_end()),
    "thinking": sse(_START, _block(0, _THINKING), _delta(0, {"type": "thinking_delta", "thinking": {"k": API_KEY}}),
                    *_end()),
    "start-thinking": sse(_START, _block(0, {**_THINKING, "thinking": [API_KEY]}), *_end()),
    "signature": sse(_START, _block(0, _THINKING), _delta(0, {"type": "signature_delta", "signature": [API_KEY]}),
                     *_end()),
    "start-signature": sse(_START, _block(0, {**_THINKING, "signature": {"k": API_KEY}}), *_end()),
    "redacted": sse(_START, _block(0, {"type": "redacted_thinking", "data": [API_KEY]}), *_end()),
    "tool-id": sse(_START, _block(0, {**_TOOL, "id": [API_KEY]}), *_end("tool_use")),
    "tool-name": sse(_START, _block(0, {**_TOOL, "name": {"k": API_KEY}}), *_end("tool_use")),
    "partial-json": sse(_START, _block(0, _TOOL), _delta(0, {"type": "input_json_delta", "partial_json": [API_KEY]}),
                        *_end("tool_use")),
    "index": sse(_START, _block(0, _TEXT), _delta([API_KEY], {"type": "text_delta", "text": "x"}), *_end()),
    "stop-reason": sse(_START, _block(0, _TEXT), _delta(0, {"type": "text_delta", "text": "Hi"}), *_end([API_KEY])),
}  # fmt: skip

_CASES = [(OpenAIChatModel, name, body) for name, body in _CHAT.items()] + [
    (AnthropicModel, name, body) for name, body in _ANTHROPIC.items()
]
_IDS = [f"{'chat' if cls is OpenAIChatModel else 'anthropic'}-{name}" for cls, name, _ in _CASES]
_PREFIX = {OpenAIChatModel: "openai chat stream: ", AnthropicModel: "anthropic stream: "}
#: A stop reason that is not a string: the server would send it so again, so it is not retried.
_FOR_GOOD = {"finish-reason", "stop-reason"}


@pytest.mark.parametrize(("cls", "name", "body"), _CASES, ids=_IDS)
async def test_a_value_of_the_wrong_type_is_the_models_own_error_and_never_shows_the_key(
    cls: type[Any], name: str, body: bytes
) -> None:
    # Before, the value went out in a stream event whose check in the accumulator quoted it,
    # past the scrubbing of the model's errors: the key showed in the error and the log.
    server = MockServer(body)
    async with server.client() as client:
        with pytest.raises(StreamProtocolError) as info:
            await collect(cls("m", api_key=API_KEY, http_client=client))
    error = info.value
    assert str(error).startswith(_PREFIX[cls]), str(error)  # not the accumulator's "malformed stream event"
    assert error.retryable is (name not in _FOR_GOOD)
    # It says which value was wrong, and its type (not a TypeError of the mapper's, caught after).
    assert re.search(r" is (list|dict), not an? (str|int): " if name != "finish-reason" else "is not a string", str(error))
    _no_key(str(error), repr(error), repr(error.args))
    assert server.streams[0].closed


@pytest.mark.parametrize(("cls", "name", "body"), _CASES, ids=_IDS)
async def test_a_run_that_meets_a_value_of_the_wrong_type_never_shows_the_key(
    cls: type[Any], name: str, body: bytes, caplog: pytest.LogCaptureFixture
) -> None:
    server = MockServer(body)
    with caplog.at_level(logging.DEBUG, "agentloop"):
        async with server.client() as client:
            engine = QueryEngine(cls("m", api_key=API_KEY, http_client=client), policies=[], retry_budget=1,
                                 retry_base_delay=0)  # fmt: skip
            events = [e async for e in engine.run("hi")]
    end = events[-1]
    assert isinstance(end, TurnEnded) and end.reason == "model_error"
    assert end.error is not None and end.error.startswith("StreamProtocolError: " + _PREFIX[cls])
    assert [e.type for e in events].count("retrying") == (name not in _FOR_GOOD)  # malformed: retried once
    _no_key(end.error, repr(events), repr(engine.messages), _log_text(caplog))


# -- values of the wrong type the response is kept with ------------------------------------------

_KEPT: list[tuple[type[Any], bytes]] = [
    (OpenAIChatModel, chat_stream(chat_chunk({"content": "Hi"}), chat_chunk(finish="stop"),
                                  {"id": "chatcmpl-1", "choices": [], "usage": {"prompt_tokens": [API_KEY]}})),
    (OpenAIChatModel, chat_stream({**chat_chunk({"content": "Hi"}), "id": [API_KEY]}, chat_chunk(finish="stop"))),
    (AnthropicModel, sse(_START, _block(0, _TEXT), _delta(0, {"type": "text_delta", "text": "Hi"}),
                         ("content_block_stop", {"type": "content_block_stop", "index": 0}),
                         ("message_delta", {"type": "message_delta", "delta": {"stop_reason": "end_turn"},
                                            "usage": {"output_tokens": {"k": API_KEY}}}), _STOP)),
    (AnthropicModel, sse(("message_start", {"type": "message_start", "message": {"id": [API_KEY]}}), _block(0, _TEXT),
                         _delta(0, {"type": "text_delta", "text": "Hi"}), *_end())),
]  # fmt: skip


@pytest.mark.parametrize(("cls", "body"), _KEPT, ids=["chat-usage", "chat-id", "anthropic-usage", "anthropic-id"])
async def test_a_usage_or_response_id_of_the_wrong_type_keeps_the_answer_and_never_shows_the_key(
    cls: type[Any], body: bytes, caplog: pytest.LogCaptureFixture
) -> None:
    server = MockServer(body)
    with caplog.at_level(logging.DEBUG, "agentloop"):
        async with server.client() as client:
            engine = QueryEngine(cls("m", api_key=API_KEY, http_client=client), policies=[], retry_budget=0)
            events = [e async for e in engine.run("hi")]
    end = events[-1]
    assert isinstance(end, TurnEnded) and end.reason == "completed"
    assert engine.messages[-1].text == "Hi"
    _no_key(repr(events), repr(engine.messages), _log_text(caplog))


@pytest.mark.parametrize(
    ("cls", "body", "kept"),
    [(*_KEPT[1], "chatcmpl-1"), (*_KEPT[3], None)],  # Chat: the id of the next chunk, a string
    ids=["chat-id", "anthropic-id"],
)
async def test_a_response_id_of_the_wrong_type_is_not_kept_by_the_model(
    cls: type[Any], body: bytes, kept: str | None
) -> None:
    # The engine does not read the response id, so a run cannot tell: the model's own end must.
    server = MockServer(body)
    async with server.client() as client:
        events, acc = await collect(cls("m", api_key=API_KEY, http_client=client))
    end = events[-1]
    assert isinstance(end, StreamEnd) and end.stop_reason == "end_turn"
    assert end.response_id == kept and acc.response_id == kept
    assert acc.text() == "Hi"
