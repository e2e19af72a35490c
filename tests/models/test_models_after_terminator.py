"""A connection that fails once the stream's terminator has arrived: the answer is whole, kept,
and not retried (the failure was in reading what follows it, normally nothing)."""

from __future__ import annotations

from collections.abc import AsyncIterator, Callable
from typing import Any

import httpx
import pytest
from _models_support import API_KEY, chat_chunk, chat_stream, collect, load, sse

from agentloop import AssistantMessage, QueryEngine, Retrying, TurnEnded
from agentloop._errors import ProviderConnectionError
from agentloop.models import AnthropicModel, OpenAIChatModel, OpenAIResponsesModel

_FAILURES: list[Callable[[], Exception]] = [
    lambda: httpx.ReadError("peer reset"),
    lambda: httpx.RemoteProtocolError("peer closed connection without sending complete message body"),
    lambda: httpx.ReadTimeout("timed out"),
]


class _FailsAfter(httpx.AsyncByteStream):
    """Yields ``chunks``, then raises ``failure`` (a connection that breaks)."""

    def __init__(self, chunks: list[bytes], failure: Exception) -> None:
        self.chunks = chunks
        self.failure = failure
        self.closed = False

    async def __aiter__(self) -> AsyncIterator[bytes]:
        for chunk in self.chunks:
            yield chunk
        raise self.failure

    async def aclose(self) -> None:
        self.closed = True


class _Server:
    def __init__(self, chunks: list[bytes], failure: Callable[[], Exception]) -> None:
        self.chunks = chunks
        self.failure = failure
        self.requests = 0
        self.streams: list[_FailsAfter] = []

    def handler(self, request: httpx.Request) -> httpx.Response:
        self.requests += 1
        stream = _FailsAfter(self.chunks, self.failure())
        self.streams.append(stream)
        return httpx.Response(200, headers={"content-type": "text/event-stream"}, stream=stream)

    def client(self) -> httpx.AsyncClient:
        return httpx.AsyncClient(transport=httpx.MockTransport(self.handler))


_ANTHROPIC_TEXT = sse(
    ("message_start", {"type": "message_start", "message": {"id": "msg_1", "usage": {"input_tokens": 3}}}),
    ("content_block_start", {"type": "content_block_start", "index": 0, "content_block": {"type": "text", "text": ""}}),
    ("content_block_delta", {"type": "content_block_delta", "index": 0, "delta": {"type": "text_delta", "text": "whole answer"}}),
    ("content_block_stop", {"type": "content_block_stop", "index": 0}),
    ("message_delta", {"type": "message_delta", "delta": {"stop_reason": "end_turn"}, "usage": {"output_tokens": 2}}),
    ("message_stop", {"type": "message_stop"}),
)  # fmt: skip
_USAGE = {"id": "chatcmpl-1", "choices": [], "usage": {"prompt_tokens": 3, "completion_tokens": 2}}
_CHAT_TEXT = chat_stream(chat_chunk({"role": "assistant", "content": "whole answer"}), chat_chunk(finish="stop"), _USAGE)


def _responses_text() -> bytes:
    item = {"id": "msg_1", "type": "message", "role": "assistant", "content": []}
    done = {**item, "content": [{"type": "output_text", "text": "whole answer", "annotations": []}]}
    return sse(
        (None, {"type": "response.created", "response": {"id": "resp_1", "status": "in_progress"}}),
        (None, {"type": "response.output_item.added", "output_index": 0, "item": item}),
        (None, {"type": "response.output_text.delta", "output_index": 0, "item_id": "msg_1", "delta": "whole answer"}),
        (None, {"type": "response.output_item.done", "output_index": 0, "item": done}),
        (None, {"type": "response.completed", "response": {"id": "resp_1", "status": "completed", "output": [done]}}),
    )  # fmt: skip


_CASES: dict[str, tuple[Callable[..., Any], bytes]] = {
    "anthropic": (AnthropicModel, _ANTHROPIC_TEXT),
    "openai_chat": (OpenAIChatModel, _CHAT_TEXT),
    "openai_responses": (OpenAIResponsesModel, _responses_text()),
}


@pytest.mark.parametrize("failure", _FAILURES)
@pytest.mark.parametrize("api", sorted(_CASES))
async def test_a_connection_failing_after_the_terminator_keeps_the_answer(
    api: str, failure: Callable[[], Exception]
) -> None:
    cls, body = _CASES[api]
    server = _Server([body], failure)
    async with server.client() as client:
        _, acc = await collect(cls("m", api_key=API_KEY, http_client=client))
    assert acc.ended
    assert acc.message().text == "whole answer"
    assert acc.stop_reason == "end_turn"
    assert server.streams[0].closed


@pytest.mark.parametrize(
    "name,cls",
    [
        ("anthropic_tool_use.sse", AnthropicModel),
        ("openai_chat_tool.recorded.sse", OpenAIChatModel),
        ("openai_responses_reasoning_function_call.prism.sse", OpenAIResponsesModel),
    ],
)
async def test_a_recorded_stream_then_a_reset_is_the_recorded_answer(name: str, cls: Callable[..., Any]) -> None:
    server = _Server([load(name)], _FAILURES[0])
    async with server.client() as client:
        _, acc = await collect(cls("m", api_key=API_KEY, http_client=client))
    assert acc.stop_reason == "tool_use"
    (call,) = acc.message().tool_uses
    assert call.input and call.input_error is None


async def test_a_chat_stream_cut_after_finish_reason_and_usage_is_complete() -> None:
    # The usage-only chunk comes once the server has finished: the [DONE] after it carries
    # nothing, so a connection lost (or a body that ends) in between loses nothing.
    body = sse((None, chat_chunk({"content": "whole answer"})), (None, chat_chunk(finish="stop")), (None, _USAGE))
    for failure in _FAILURES:
        server = _Server([body], failure)
        async with server.client() as client:
            _, acc = await collect(OpenAIChatModel("m", api_key=API_KEY, http_client=client))
        assert (acc.message().text, acc.stop_reason) == ("whole answer", "end_turn")
        assert acc.usage.output_tokens == 2


async def test_a_chat_body_ending_after_finish_reason_and_usage_without_done_is_complete() -> None:
    body = sse((None, chat_chunk({"content": "whole answer"})), (None, chat_chunk(finish="stop")), (None, _USAGE))

    def handler(request: httpx.Request) -> httpx.Response:
        return httpx.Response(200, headers={"content-type": "text/event-stream"}, content=body)

    async with httpx.AsyncClient(transport=httpx.MockTransport(handler)) as client:
        _, acc = await collect(OpenAIChatModel("m", api_key=API_KEY, http_client=client))
    assert (acc.message().text, acc.stop_reason, acc.usage.output_tokens) == ("whole answer", "end_turn", 2)


@pytest.mark.parametrize("api", sorted(_CASES))
async def test_a_connection_failing_before_the_terminator_still_fails(api: str) -> None:
    cls, body = _CASES[api]
    cut = body[: body.rindex(b"data:")]  # everything but the terminator (chat: the [DONE])
    if api == "openai_chat":
        cut = cut[: cut.rindex(b"data:")]  # and the usage chunk: the finish alone is not the end
    server = _Server([cut], _FAILURES[0])
    async with server.client() as client:
        with pytest.raises(ProviderConnectionError) as info:
            await collect(cls("m", api_key=API_KEY, http_client=client))
    assert info.value.retryable


async def test_a_chat_finish_reason_without_usage_then_a_reset_is_still_cut() -> None:
    # With include_usage off, only [DONE] (or a body that ends there cleanly) says the server
    # has finished: a connection that breaks instead is not taken for the end.
    body = sse((None, chat_chunk({"content": "whole answer"})), (None, chat_chunk(finish="stop")))
    server = _Server([body], _FAILURES[0])
    async with server.client() as client:
        with pytest.raises(ProviderConnectionError) as info:
            await collect(OpenAIChatModel("m", api_key=API_KEY, http_client=client, include_usage=False))
    assert info.value.retryable


@pytest.mark.parametrize("api", sorted(_CASES))
async def test_the_engine_keeps_the_answer_and_does_not_retry(api: str) -> None:
    cls, body = _CASES[api]
    server = _Server([body], _FAILURES[1])
    async with server.client() as client:
        engine = QueryEngine(cls("m", api_key=API_KEY, http_client=client), policies=[], retry_base_delay=0.001)
        events = [e async for e in engine.run("hi")]
    assert server.requests == 1
    assert not [e for e in events if isinstance(e, Retrying)]
    (answer,) = [e.message for e in events if isinstance(e, AssistantMessage)]
    assert answer.text == "whole answer" and not answer.partial
    assert isinstance(events[-1], TurnEnded) and events[-1].reason == "completed"


#: Errors of a host's own transport or client hook, not httpx's: raised as they are (docs/providers.md).
_HOST_FAILURES: list[Callable[[], Exception]] = [
    lambda: ConnectionResetError(104, "Connection reset by peer"),
    lambda: RuntimeError("the proxy's client hook failed"),
]


@pytest.mark.parametrize("failure", _HOST_FAILURES)
@pytest.mark.parametrize("api", sorted(_CASES))
async def test_a_host_transport_failing_after_the_terminator_keeps_the_answer(
    api: str, failure: Callable[[], Exception]
) -> None:
    cls, body = _CASES[api]
    server = _Server([body], failure)
    async with server.client() as client:
        engine = QueryEngine(cls("m", api_key=API_KEY, http_client=client), policies=[], retry_base_delay=0.001)
        events = [e async for e in engine.run("hi")]
    (answer,) = [e.message for e in events if isinstance(e, AssistantMessage)]
    assert answer.text == "whole answer" and not answer.partial
    assert isinstance(events[-1], TurnEnded) and events[-1].reason == "completed", events[-1]
    assert server.requests == 1 and server.streams[0].closed


async def test_a_host_transport_failing_before_the_terminator_still_fails() -> None:
    cls, body = _CASES["anthropic"]
    server = _Server([body[: body.rindex(b"event: message_stop")]], _HOST_FAILURES[0])
    async with server.client() as client:
        with pytest.raises(ConnectionResetError):
            await collect(cls("m", api_key=API_KEY, http_client=client))
    assert server.streams[0].closed
