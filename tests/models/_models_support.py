"""Test helpers for the provider tests: fixtures, mock transports, stream collection."""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import json
from collections.abc import AsyncIterator, Callable, Iterable, Sequence
from pathlib import Path
from typing import Any

import httpcore
import httpx

from agentloop import QueryEngine, TurnEnded
from agentloop._abort import AbortController, AbortSignal
from agentloop._accumulate import Accumulator
from agentloop._messages import Message
from agentloop.models import (
    AnthropicModel,
    ModelRequest,
    OpenAIChatModel,
    OpenAIResponsesModel,
    StreamEvent,
)

FIXTURES = Path(__file__).parent / "fixtures"

#: Fixtures that end with a terminator, and the model class that reads them.
COMPLETE_FIXTURES: dict[str, type[Any]] = {
    "anthropic_refusal.sdkfixture.sse": AnthropicModel,
    "anthropic_text.sse": AnthropicModel,
    "anthropic_thinking.sse": AnthropicModel,
    "anthropic_thinking_tool_use.assembled.sse": AnthropicModel,
    "anthropic_tool_use.sdkfixture.sse": AnthropicModel,
    "anthropic_tool_use.sse": AnthropicModel,
    "anthropic_web_search.repaired.sse": AnthropicModel,
    "openai_chat_logprobs.recorded.sse": OpenAIChatModel,
    "openai_chat_parallel_tools.recorded.sse": OpenAIChatModel,
    "openai_chat_text.recorded.sse": OpenAIChatModel,
    "openai_chat_tool.recorded.sse": OpenAIChatModel,
    "openai_responses_reasoning_function_call.prism.sse": OpenAIResponsesModel,
    "openai_responses_text.prism.sse": OpenAIResponsesModel,
}

API_KEY = "sk-test-SECRET-0123456789abcdef"


def load(name: str, *, terminate: bool = True) -> bytes:
    """A fixture's bytes; ``terminate`` adds the final blank line some copies lack."""
    body = (FIXTURES / name).read_bytes()
    if terminate:
        while not body.endswith(b"\n\n"):
            body += b"\n"
    return body


def sse(*events: tuple[str | None, Any]) -> bytes:
    """Build an SSE body from ``(event_name, data)`` pairs (data: JSON-encoded unless str)."""
    out = []
    for name, data in events:
        text = data if isinstance(data, str) else json.dumps(data)
        head = f"event: {name}\n" if name else ""
        out.append(f"{head}data: {text}\n\n")
    return "".join(out).encode()


def chat_chunk(
    delta: dict[str, Any] | None = None, finish: str | None = None, **extra: Any
) -> dict[str, Any]:
    """One chat.completion.chunk with a single choice."""
    choice: dict[str, Any] = {"index": 0, "delta": delta or {}, "finish_reason": finish}
    return {"id": "chatcmpl-1", "object": "chat.completion.chunk", "choices": [choice], **extra}


def chat_stream(*chunks: dict[str, Any] | str, done: bool = True) -> bytes:
    """A chat completions body: the chunks, then ``[DONE]``."""
    parts: list[tuple[str | None, Any]] = [(None, c) for c in chunks]
    if done:
        parts.append((None, "[DONE]"))
    return sse(*parts)


class RecordingStream(httpx.AsyncByteStream):
    """A response body that yields ``chunks``, optionally then blocks forever, and
    records whether it was closed."""

    def __init__(self, chunks: Iterable[bytes], *, hang: bool = False) -> None:
        self.chunks = list(chunks)
        self.hang = hang
        self.closed = False
        self.sent = 0
        self.blocked = asyncio.Event()

    async def __aiter__(self) -> AsyncIterator[bytes]:
        for chunk in self.chunks:
            self.sent += 1
            yield chunk
        if self.hang:
            self.blocked.set()
            await asyncio.Event().wait()  # until cancelled

    async def aclose(self) -> None:
        self.closed = True


class MockServer:
    """A MockTransport serving one canned response per request and recording requests."""

    def __init__(
        self,
        body: bytes | Sequence[bytes] = b"",
        *,
        status: int = 200,
        headers: dict[str, str] | None = None,
        hang: bool = False,
    ) -> None:
        chunks = [body] if isinstance(body, bytes) else list(body)
        self.chunks = chunks
        self.status = status
        self.headers = {"content-type": "text/event-stream", **(headers or {})}
        self.hang = hang
        self.requests: list[httpx.Request] = []
        self.streams: list[RecordingStream] = []

    def handler(self, request: httpx.Request) -> httpx.Response:
        self.requests.append(request)
        stream = RecordingStream(self.chunks, hang=self.hang)
        self.streams.append(stream)
        return httpx.Response(self.status, headers=self.headers, stream=stream)

    def client(self) -> httpx.AsyncClient:
        return httpx.AsyncClient(transport=httpx.MockTransport(self.handler))

    @property
    def body(self) -> dict[str, Any]:
        """The JSON body of the last request."""
        result: dict[str, Any] = json.loads(self.requests[-1].content)
        return result


def request(*messages: Message, **fields: Any) -> ModelRequest:
    return ModelRequest(messages=list(messages) or [Message.user("hi")], **fields)


async def collect(
    model: Any, req: ModelRequest | None = None, signal: AbortSignal | None = None
) -> tuple[list[StreamEvent], Accumulator]:
    """Run a stream to its end; returns the events and the fed accumulator (raises what it raises).
    The stream is closed on the way out, also when feeding the accumulator raises, as the engine
    closes it: left to the garbage collector, its HTTP response would stay open until then."""
    acc = Accumulator()
    events: list[StreamEvent] = []
    async with contextlib.aclosing(model.stream(req or request(), signal or AbortController().signal)) as stream:
        async for ev in stream:
            events.append(ev)
            acc.feed(ev)
    return events, acc


async def run_fixture(
    name: str, body: bytes | Sequence[bytes], **kw: Any
) -> tuple[list[StreamEvent], Accumulator]:
    server = MockServer(body)
    async with server.client() as client:
        model = COMPLETE_FIXTURES[name]("m", api_key=API_KEY, http_client=client, **kw)
        return await collect(model)


def final(acc: Accumulator) -> dict[str, Any]:
    """The comparable final state of an accumulator."""
    return {
        "message": acc.message().model_dump(),
        "stop_reason": acc.stop_reason,
        "usage": acc.usage,
        "response_id": acc.response_id,
    }


def split(body: bytes, cuts: Iterable[int]) -> list[bytes]:
    """``body`` cut at the given byte offsets."""
    points = sorted({c for c in cuts if 0 < c < len(body)})
    edges = [0, *points, len(body)]
    return [body[a:b] for a, b in itertools.pairwise(edges)]


Factory = Callable[[httpx.AsyncClient], Any]


class FakeNetwork(httpcore.AsyncNetworkBackend):
    """An httpcore network whose connections `connect()` makes (one per TCP connect)."""

    def connect(self) -> httpcore.AsyncNetworkStream:
        raise NotImplementedError

    async def connect_tcp(
        self,
        host: str,
        port: int,
        timeout: float | None = None,  # noqa: ASYNC109 (httpcore's signature)
        local_address: str | None = None,
        socket_options: Any = None,
    ) -> httpcore.AsyncNetworkStream:
        return self.connect()


async def run_responses(body: bytes, **kw: Any) -> tuple[list[Any], Any]:
    """What an `OpenAIResponsesModel` made with ``kw`` streams from ``body``, and its final message."""
    from agentloop.models import OpenAIResponsesModel

    server = MockServer(body)
    async with server.client() as client:
        return await collect(OpenAIResponsesModel("m", api_key=API_KEY, http_client=client, **kw))


def ev(kind: str, **fields: Any) -> tuple[str, dict[str, Any]]:
    """One Responses event for `sse`: its name, and its data with the same ``type``."""
    return (kind, {"type": kind, **fields})


async def model_error_run(cls: type[Any], body: bytes) -> tuple[TurnEnded, QueryEngine]:
    """A run of an engine on a ``cls`` model answered by ``body`` (no retry), which must end
    with ``model_error``."""
    server = MockServer(body)
    async with server.client() as client:
        engine = QueryEngine(cls("m", api_key=API_KEY, http_client=client), policies=[], retry_budget=0)
        events = [e async for e in engine.run("hi")]
    end = events[-1]
    assert isinstance(end, TurnEnded) and end.reason == "model_error"
    return end, engine
