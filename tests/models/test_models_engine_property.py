"""The engine over real provider streams, with a host acting at random events.

Each provider's recorded streams are served over a mock transport, cut at random
byte offsets, with the event loop free to run between the pieces. The host
interrupts, interjects, sends a new message or stops iterating at random events.
After every run: the transcript is one the provider accepts, every tool call has
its result, every response was closed, and nothing is left running.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from typing import Any

import httpx
from _models_support import API_KEY, FIXTURES, load, split
from hypothesis import given, settings
from hypothesis import strategies as st

from agentloop import QueryEngine, Tool, ToolContext, validate_transcript
from agentloop.models import AnthropicModel, OpenAIChatModel, OpenAIResponsesModel

# (model class, streams that call tools, a stream that only answers)
PROVIDERS: dict[str, tuple[type[Any], list[str], str]] = {
    "anthropic": (
        AnthropicModel,
        ["anthropic_tool_use.sse", "anthropic_thinking_tool_use.assembled.sse", "anthropic_web_search.repaired.sse"],
        "anthropic_text.sse",
    ),
    "openai_chat": (
        OpenAIChatModel,
        ["openai_chat_tool.recorded.sse", "openai_chat_parallel_tools.recorded.sse"],
        "openai_chat_text.recorded.sse",
    ),
    "openai_responses": (
        OpenAIResponsesModel,
        ["openai_responses_reasoning_function_call.prism.sse"],
        "openai_responses_text.prism.sse",
    ),
}
TOOL_NAMES = ("get_weather", "get_stock_price", "search", "weather")


class PacedStream(httpx.AsyncByteStream):
    """A body in pieces, yielding to the event loop between them; records its closing."""

    def __init__(self, chunks: list[bytes]) -> None:
        self.chunks = chunks
        self.closed = False

    async def __aiter__(self) -> AsyncIterator[bytes]:
        for chunk in self.chunks:
            await asyncio.sleep(0)
            yield chunk

    async def aclose(self) -> None:
        self.closed = True


async def answer(args: dict[str, Any], ctx: ToolContext) -> str:
    await asyncio.sleep(0)
    return "sunny, 21 C"


TOOLS = [Tool(name, "A recorded stream's tool.", {"type": "object"}, answer, concurrency_safe=True) for name in TOOL_NAMES]


async def play(provider: str, first: int, cuts: list[int], actions: list[tuple[int, str]]) -> None:
    cls, tool_streams, text_stream = PROVIDERS[provider]
    bodies = [load(tool_streams[first % len(tool_streams)])]
    streams: list[PacedStream] = []

    def handler(request: httpx.Request) -> httpx.Response:
        body = bodies[len(streams)] if len(streams) < len(bodies) else load(text_stream)
        stream = PacedStream(split(body, cuts))
        streams.append(stream)
        return httpx.Response(200, headers={"content-type": "text/event-stream"}, stream=stream)

    async with httpx.AsyncClient(transport=httpx.MockTransport(handler)) as client:
        engine = QueryEngine(cls("m", api_key=API_KEY, http_client=client), tools=TOOLS, policies=[], tool_cancel_grace=0.01)
        events = engine.run("What is the weather?")
        count = 0
        async for _event in events:
            count += 1
            todo = [a for when, a in actions if when == count]
            if "interrupt" in todo:
                engine.interrupt("host")
            if "interject" in todo:
                engine.interject("in Celsius, please")
            if "send_now" in todo:
                engine.send_now("never mind, what time is it?")
            if "break" in todo:
                break
        await events.aclose()
        assert validate_transcript(engine.messages) == [], engine.messages
        uses = [b.id for m in engine.messages for b in m.tool_uses]
        answered = [b.tool_use_id for m in engine.messages for b in m.tool_results]
        assert sorted(uses) == sorted(answered) and len(set(answered)) == len(answered)
        assert not engine.running
        assert all(s.closed for s in streams), "a response was left open"
    me = asyncio.current_task()
    for _ in range(3):
        await asyncio.sleep(0)
    assert [t for t in asyncio.all_tasks() if t is not me and not t.done()] == []


@settings(max_examples=120, deadline=None)
@given(
    st.sampled_from(sorted(PROVIDERS)),
    st.integers(0, 5),
    st.lists(st.integers(1, 4000), max_size=30),
    st.lists(st.tuples(st.integers(1, 40), st.sampled_from(["interrupt", "interject", "send_now", "break"])), max_size=4),
)
def test_engine_over_recorded_streams_stays_valid_whatever_the_host_does(
    provider: str, first: int, cuts: list[int], actions: list[tuple[int, str]]
) -> None:
    asyncio.run(play(provider, first, cuts, actions), debug=True)


def test_the_recorded_streams_exist() -> None:
    for _, tool_streams, text_stream in PROVIDERS.values():
        for name in [*tool_streams, text_stream]:
            assert (FIXTURES / name).stat().st_size > 0
