"""OpenAIChatModel ``echo_reasoning``: DeepSeek and Kimi thinking mode over Chat Completions.

Those servers stream ``delta.reasoning_content`` and refuse (400) a later request whose
assistant message with tool calls lacks that turn's ``reasoning_content``, even an empty one.
"""

from __future__ import annotations

import json
from typing import Any

import httpx
import pytest
from _models_support import API_KEY, MockServer, chat_chunk, chat_stream, collect, request

from agentloop import AssistantMessage, QueryEngine, TurnEnded, tool, validate_transcript
from agentloop._messages import Message, TextBlock, ThinkingBlock, ToolResultBlock, ToolUseBlock
from agentloop.models import OpenAIChatModel
from agentloop.models.openai_chat import build_request

HISTORY = [
    Message.user("weather in Paris and Rome?"),
    Message(role="assistant", content=[
        ThinkingBlock(thinking="Two cities: two calls.", signature='{"type":"reasoning_content"}'),
        ToolUseBlock(id="c1", name="weather", input={"city": "Paris"}),
    ]),
    Message(role="user", content=[ToolResultBlock(tool_use_id="c1", content="sunny")]),
    Message(role="assistant", content=[ToolUseBlock(id="c2", name="weather", input={"city": "Rome"})]),
    Message(role="user", content=[ToolResultBlock(tool_use_id="c2", content="rain")]),
    Message(role="assistant", content=[
        ThinkingBlock(thinking="Both known.", signature='{"type":"reasoning_content"}'),
        TextBlock(text="Paris sunny, Rome rain."),
    ]),
    Message.user("thanks"),
]  # fmt: skip


def assistants(body: dict[str, Any]) -> list[dict[str, Any]]:
    return [m for m in body["messages"] if m["role"] == "assistant"]


def test_with_echo_each_assistant_message_with_tool_calls_carries_its_reasoning() -> None:
    body = build_request(request(*HISTORY), model="deepseek-v4", echo_reasoning=True)
    first, second, third = assistants(body)
    assert first["reasoning_content"] == "Two cities: two calls."
    assert second["reasoning_content"] == ""  # no reasoning streamed: still sent, empty
    assert "reasoning_content" not in third  # no tool calls: not needed, not sent
    assert third["content"] == "Paris sunny, Rome rain."


def test_without_echo_no_reasoning_is_sent() -> None:
    body = build_request(request(*HISTORY), model="gpt-4o")
    assert all("reasoning_content" not in m for m in body["messages"])
    assert "Two cities" not in json.dumps(body)


def test_reasoning_of_another_provider_is_sent_as_plain_text_only_with_echo() -> None:
    signed = Message(role="assistant", content=[
        ThinkingBlock(thinking="Anthropic thought.", signature="EqQBCkYIBxgCKkD=="),
        ToolUseBlock(id="c1", name="weather", input={"city": "Oslo"}),
    ])  # fmt: skip
    tail = Message(role="user", content=[ToolResultBlock(tool_use_id="c1", content="snow")])
    on = build_request(request(Message.user("go"), signed, tail), model="m", echo_reasoning=True)
    off = build_request(request(Message.user("go"), signed, tail), model="m")
    assert assistants(on)[0]["reasoning_content"] == "Anthropic thought."
    assert "EqQBCkYIBxgCKkD" not in json.dumps(on)  # the signature itself never goes
    assert "reasoning_content" not in assistants(off)[0]


@pytest.mark.parametrize(
    ("base_url", "on"),
    [
        ("https://api.deepseek.com", True),
        ("https://api.deepseek.com/v1", True),
        ("https://API.DeepSeek.com/v1", True),
        ("https://api.moonshot.ai/v1", True),
        ("https://api.moonshot.cn/v1", True),
        (None, False),
        ("https://api.openai.com/v1", False),
        ("http://localhost:8000/v1", False),
        ("https://api.deepseek.com.evil.example/v1", False),
    ],
)
def test_echo_is_on_by_default_for_deepseek_and_moonshot_only(base_url: str | None, on: bool) -> None:
    assert OpenAIChatModel("m", api_key=API_KEY, base_url=base_url).echo_reasoning is on
    assert OpenAIChatModel("m", api_key=API_KEY, base_url=base_url, echo_reasoning=not on).echo_reasoning is not on


async def test_with_echo_streamed_reasoning_is_kept_in_the_transcript() -> None:
    body = chat_stream(
        chat_chunk({"role": "assistant", "reasoning_content": "Let me "}),
        chat_chunk({"reasoning_content": "think."}),
        chat_chunk({"content": "Hi."}),
        chat_chunk(finish="stop"),
    )
    for echo, kept in ((True, True), (False, False)):
        server = MockServer(body)
        async with server.client() as client:
            model = OpenAIChatModel("m", api_key=API_KEY, http_client=client, echo_reasoning=echo)
            _, acc = await collect(model)
        thinking = acc.message().content[0]
        assert isinstance(thinking, ThinkingBlock) and thinking.thinking == "Let me think."
        assert bool(thinking.signature) is kept  # an unsigned block is dropped at commit


# -- a DeepSeek-like server, end to end ------------------------------------------------


@tool
async def weather(city: str) -> str:
    """The weather in a city."""
    return {"Paris": "sunny", "Rome": "rain"}[city]


class DeepSeek:
    """Plays DeepSeek in thinking mode: two tool turns (the second without reasoning), then an
    answer; a request whose assistant message with tool calls lacks ``reasoning_content`` gets
    the 400 the API gives."""

    def __init__(self) -> None:
        self.bodies: list[dict[str, Any]] = []

    def handler(self, req: httpx.Request) -> httpx.Response:
        body = json.loads(req.content)
        self.bodies.append(body)
        for i, m in enumerate(body["messages"]):
            if m["role"] == "assistant" and m.get("tool_calls") and "reasoning_content" not in m:
                error = {"error": {
                    "message": f"Missing `reasoning_content` field in the assistant message at message index {i}",
                    "type": "invalid_request_error", "param": None, "code": "invalid_request_error",
                }}  # fmt: skip
                return httpx.Response(400, json=error)
        turn = sum(1 for m in body["messages"] if m["role"] == "assistant")
        call = {"index": 0, "id": f"call_{turn}", "type": "function", "function": {"name": "weather"}}
        if turn == 0:
            chunks = [
                chat_chunk({"role": "assistant", "reasoning_content": "Paris first."}),
                chat_chunk({"tool_calls": [{**call, "function": {"name": "weather", "arguments": '{"city": "Paris"}'}}]}),
                chat_chunk(finish="tool_calls"),
            ]
        elif turn == 1:
            chunks = [
                chat_chunk({"role": "assistant", "content": None}),
                chat_chunk({"tool_calls": [{**call, "function": {"name": "weather", "arguments": '{"city": "Rome"}'}}]}),
                chat_chunk(finish="tool_calls"),
            ]
        else:
            chunks = [chat_chunk({"reasoning_content": "Done."}), chat_chunk({"content": "Sunny, then rain."}),
                      chat_chunk(finish="stop")]  # fmt: skip
        return httpx.Response(200, headers={"content-type": "text/event-stream"}, content=chat_stream(*chunks))


async def run_against_deepseek(**kw: Any) -> tuple[DeepSeek, QueryEngine, TurnEnded]:
    server = DeepSeek()
    async with httpx.AsyncClient(transport=httpx.MockTransport(server.handler)) as client:
        model = OpenAIChatModel("deepseek-v4-flash", api_key=API_KEY, base_url="https://api.deepseek.com",
                                http_client=client, **kw)  # fmt: skip
        engine = QueryEngine(model, tools=[weather], policies=[], retry_base_delay=0.001)
        events = [e async for e in engine.run("weather in Paris, then Rome?")]
    ended = events[-1]
    assert isinstance(ended, TurnEnded)
    assert [e for e in events if isinstance(e, AssistantMessage)]
    return server, engine, ended


async def test_a_tool_loop_against_deepseek_passes_reasoning_back_and_completes() -> None:
    server, engine, ended = await run_against_deepseek()  # on by default for api.deepseek.com
    assert ended.reason == "completed" and engine.messages[-1].text == "Sunny, then rain."
    assert len(server.bodies) == 3
    last = assistants(server.bodies[-1])
    assert [m.get("reasoning_content") for m in last] == ["Paris first.", ""]
    assert validate_transcript(engine.messages) == []


async def test_a_tool_loop_against_deepseek_without_echo_gets_the_400() -> None:
    server, _, ended = await run_against_deepseek(echo_reasoning=False)
    assert ended.reason == "model_error" and len(server.bodies) == 2  # a 400 is not retried
    assert ended.error is not None and "reasoning_content" in ended.error and "400" in ended.error
    assert API_KEY not in ended.error
