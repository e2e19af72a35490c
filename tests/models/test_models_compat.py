"""A transcript carried between providers, and the rules each API holds tool names, tool call
ids and tool schemas to (HTTP mocked at the transport)."""

from __future__ import annotations

import json
import re
from typing import Any, ClassVar

import httpx
import pytest
from _models_support import API_KEY, MockServer, chat_chunk, chat_stream, collect, request, sse
from hypothesis import given
from hypothesis import strategies as st

from agentloop import QueryEngine, tool
from agentloop._errors import ModelError, StreamProtocolError
from agentloop._messages import Message, TextBlock, ToolResultBlock, ToolUseBlock
from agentloop.models import AnthropicModel, OpenAIChatModel, OpenAIResponsesModel

MISTRAL = "https://api.mistral.ai/v1"
GEMINI = "https://generativelanguage.googleapis.com/v1beta/openai"
NINE = re.compile(r"[a-zA-Z0-9]{9}")

CHAT_OK = chat_stream(chat_chunk({"role": "assistant", "content": "ok"}), chat_chunk({}, "stop"))


def _history(*ids: str) -> list[Message]:
    """A user prompt, then one assistant turn calling ``read`` once per id, and the results."""
    calls = [ToolUseBlock(id=i, name="read", input={"n": k}) for k, i in enumerate(ids)]
    results = [ToolResultBlock(tool_use_id=i, content=f"r{k}") for k, i in enumerate(ids)]
    return [Message.user("go"), Message(role="assistant", content=list(calls)), Message(role="user", content=list(results))]


async def _chat_body(history: list[Message], **kw: Any) -> dict[str, Any]:
    server = MockServer(CHAT_OK)
    async with server.client() as client:
        await collect(OpenAIChatModel("m", api_key=API_KEY, http_client=client, **kw), request(*history))
    return server.body


def _wire_ids(body: dict[str, Any]) -> tuple[list[str], list[str]]:
    calls = [c["id"] for m in body["messages"] if m["role"] == "assistant" for c in m.get("tool_calls", [])]
    results = [m["tool_call_id"] for m in body["messages"] if m["role"] == "tool"]
    return calls, results


# -- 1. tool call ids: Mistral's nine letters or digits ---------------------------------------


async def test_ids_from_other_providers_are_sent_to_mistral_as_nine_letters_or_digits() -> None:
    ids = ("toolu_01T1x1fJ34qAmk2tNTrN7Up6", "call_4XzlGBLtUe9dy3GVNV4jhq7h", "functions.read:0", "aB3xK9mP2")
    history = _history(*ids)
    before = [m.model_dump() for m in history]
    body = await _chat_body(history, base_url=MISTRAL)
    calls, results = _wire_ids(body)
    assert all(NINE.fullmatch(i) for i in calls), calls
    assert calls == results  # each result goes with its call
    assert len(set(calls)) == len(ids)  # and two ids stay apart
    assert calls[3] == "aB3xK9mP2"  # an id Mistral made is sent as it is
    assert [m.model_dump() for m in history] == before  # the transcript keeps the originals
    again = await _chat_body(_history(*ids), base_url=MISTRAL)
    assert _wire_ids(again)[0] == calls  # the same ids always map the same way


async def test_short_tool_ids_is_opt_in_for_other_hosts_and_can_be_turned_off() -> None:
    ids = ("toolu_01T1x1fJ34qAmk2tNTrN7Up6",)
    assert _wire_ids(await _chat_body(_history(*ids), base_url="http://localhost:8000/v1"))[0] == list(ids)
    on = _wire_ids(await _chat_body(_history(*ids), base_url="http://localhost:8000/v1", short_tool_ids=True))[0]
    assert NINE.fullmatch(on[0])
    off = _wire_ids(await _chat_body(_history(*ids), base_url=MISTRAL, short_tool_ids=False))[0]
    assert off == list(ids)
    assert OpenAIChatModel("m", base_url=MISTRAL).short_tool_ids is True


@given(st.lists(st.text(min_size=1, max_size=80), min_size=1, max_size=12, unique=True))
def test_short_ids_are_nine_letters_or_digits_and_never_collide(ids: list[str]) -> None:
    from agentloop.models.openai_chat._request import build_request

    body = build_request(request(*_history(*ids)), model="m", short_tool_ids=True)
    calls, results = _wire_ids(body)
    assert calls == results
    assert len(set(calls)) == len(ids)
    assert all(NINE.fullmatch(i) for i in calls)


def test_short_ids_stay_apart_when_an_id_equals_another_ids_short_form() -> None:
    from agentloop.models.openai_chat._request import build_request

    first = "call_one"
    short = _wire_ids(build_request(request(*_history(first)), model="m", short_tool_ids=True))[0][0]
    calls, _ = _wire_ids(build_request(request(*_history(first, short)), model="m", short_tool_ids=True))
    assert len(set(calls)) == 2 and calls[0] == short


async def test_anthropic_sends_an_openai_compatible_servers_id_in_its_own_characters() -> None:
    server = MockServer(b"")
    async with server.client() as client:
        model = AnthropicModel("m", api_key=API_KEY, http_client=client)
        with pytest.raises(ModelError):  # the empty body: only the request matters here
            await collect(model, request(*_history("functions.read:0", "call:1/2")))
    blocks = [b for m in server.body["messages"] for b in m["content"]]
    calls = [b["id"] for b in blocks if b["type"] == "tool_use"]
    results = [b["tool_use_id"] for b in blocks if b["type"] == "tool_result"]
    assert calls == results and len(set(calls)) == 2
    assert all(re.fullmatch(r"[a-zA-Z0-9_-]+", i) for i in calls)


# -- 2. tool names ----------------------------------------------------------------------------


@tool(name="3d_render")
async def render(scene: str) -> str:
    """Render a scene."""
    return scene


async def test_a_tool_name_gemini_refuses_is_an_error_naming_the_tool_before_anything_is_sent() -> None:
    server = MockServer(CHAT_OK)
    async with server.client() as client:
        model = OpenAIChatModel("gemini-2.5-flash", api_key=API_KEY, base_url=GEMINI, http_client=client)
        engine = QueryEngine(model, tools=[render])
        ended = [e async for e in engine.run("draw") if e.type == "turn_ended"]
    assert ended[0].reason == "model_error"
    assert "3d_render" in str(ended[0].error) and "letter or '_'" in str(ended[0].error)
    assert server.requests == []


async def test_the_same_tool_name_is_sent_to_other_chat_servers() -> None:
    server = MockServer(CHAT_OK)
    async with server.client() as client:
        await collect(OpenAIChatModel("m", api_key=API_KEY, http_client=client), request(tools=[render]))
    assert server.body["tools"][0]["function"]["name"] == "3d_render"


class _Spec:
    name = "read.file"
    description = "Read."
    input_schema: ClassVar[dict[str, Any]] = {"type": "object", "properties": {}}


@pytest.mark.parametrize("make", [AnthropicModel, OpenAIChatModel, OpenAIResponsesModel])
async def test_a_declared_tool_name_no_provider_accepts_is_an_error_naming_it(make: Any) -> None:
    server = MockServer(CHAT_OK)
    async with server.client() as client:
        with pytest.raises(ModelError, match=r"'read\.file'.*letters, digits, '_' or '-'") as info:
            await collect(make("m", api_key=API_KEY, http_client=client), request(tools=[_Spec()]))
    assert not info.value.retryable
    assert server.requests == []


class _NamelessSpec:
    name = None
    description = "Read."
    input_schema: ClassVar[dict[str, Any]] = {"type": "object", "properties": {}}


async def test_a_declared_tool_name_that_is_not_a_str_is_an_error_too() -> None:
    server = MockServer(CHAT_OK)
    async with server.client() as client:
        with pytest.raises(ModelError, match="tool name None"):
            await collect(OpenAIChatModel("m", api_key=API_KEY, http_client=client), request(tools=[_NamelessSpec()]))
    assert server.requests == []


# -- 3. strict function tools (OpenAI) --------------------------------------------------------


@tool
async def find(query: str, limit: int | None = None, tags: list[str] | None = None) -> str:
    """Find things."""
    return query


@tool
async def page(url: str, size: int = 10) -> str:
    """Fetch a page."""
    return url


def _strict_check(schema: Any) -> None:
    """Every object closed and every property required, no ``default``, all the way down."""
    if isinstance(schema, dict):
        assert "default" not in schema
        if schema.get("type") == "object" or "properties" in schema:
            assert schema.get("additionalProperties") is False
            assert sorted(schema.get("required", [])) == sorted(schema.get("properties", {}))
        for v in schema.values():
            _strict_check(v)
    elif isinstance(schema, list):
        for v in schema:
            _strict_check(v)


async def _strict_body(make: Any, tools: list[Any]) -> dict[str, Any]:
    server = MockServer(CHAT_OK)
    async with server.client() as client:
        try:
            await collect(make("m", api_key=API_KEY, http_client=client, strict_tools=True), request(tools=tools))
        except StreamProtocolError:  # a Chat body read as a Responses stream: only the request matters
            assert make is OpenAIResponsesModel
    return server.body


async def test_strict_tools_on_chat_completions() -> None:
    body = await _strict_body(OpenAIChatModel, [find])
    fn = body["tools"][0]["function"]
    assert fn["strict"] is True
    _strict_check(fn["parameters"])
    assert find.input_schema["required"] == ["query"]  # the tool's own schema is not changed


async def test_strict_tools_on_responses() -> None:
    body = await _strict_body(OpenAIResponsesModel, [find])
    assert body["tools"][0]["strict"] is True
    _strict_check(body["tools"][0]["parameters"])


async def test_tools_are_not_strict_by_default() -> None:
    server = MockServer(CHAT_OK)
    async with server.client() as client:
        await collect(OpenAIChatModel("m", api_key=API_KEY, http_client=client), request(tools=[find]))
    assert "strict" not in server.body["tools"][0]["function"]
    assert server.body["tools"][0]["function"]["parameters"] == find.input_schema


@pytest.mark.parametrize("make", [OpenAIChatModel, OpenAIResponsesModel])
async def test_a_schema_that_cannot_be_strict_is_an_error_naming_the_tool_and_property(make: Any) -> None:
    with pytest.raises(ModelError, match=r"'page'.*'size'.*null") as info:
        await _strict_body(make, [page])
    assert not info.value.retryable


async def test_an_open_object_cannot_be_strict() -> None:
    @tool
    async def tag(labels: dict[str, int]) -> str:
        """Tag."""
        return ""

    with pytest.raises(ModelError, match=r"'tag'.*'labels'.*additionalProperties"):
        await _strict_body(OpenAIChatModel, [tag])


# -- 4. Anthropic refusals --------------------------------------------------------------------


def _anthropic(text: str, reason: str) -> bytes:
    return sse(
        ("message_start", {"type": "message_start", "message": {"id": "msg_1", "usage": {"input_tokens": 5}}}),
        ("content_block_start", {"type": "content_block_start", "index": 0, "content_block": {"type": "text", "text": ""}}),
        ("content_block_delta", {"type": "content_block_delta", "index": 0, "delta": {"type": "text_delta", "text": text}}),
        ("content_block_stop", {"type": "content_block_stop", "index": 0}),
        ("message_delta", {"type": "message_delta", "delta": {"stop_reason": reason}, "usage": {"output_tokens": 2}}),
        ("message_stop", {"type": "message_stop"}),
    )


async def test_a_refused_response_is_kept_but_not_sent_back_to_anthropic() -> None:
    bodies = [_anthropic("Hello..", "refusal"), _anthropic("Fine.", "end_turn")]
    seen: list[dict[str, Any]] = []

    def handler(req: httpx.Request) -> httpx.Response:
        seen.append(json.loads(req.content))
        return httpx.Response(200, headers={"content-type": "text/event-stream"}, content=bodies[len(seen) - 1])

    async with httpx.AsyncClient(transport=httpx.MockTransport(handler)) as client:
        engine = QueryEngine(AnthropicModel("m", api_key=API_KEY, http_client=client))
        first = [e async for e in engine.run("first") if e.type == "turn_ended"]
        [e async for e in engine.run("second")]
    assert first[0].reason == "completed"
    refused = engine.messages[1]
    assert refused.text == "Hello.." and refused.meta.get("stop_reason") == "refusal"  # kept, and marked
    assert "Hello.." not in json.dumps(seen[1])
    assert seen[1]["messages"] == [{"role": "user", "content": [{"type": "text", "text": "first"}, {"type": "text", "text": "second"}]}]


async def test_a_refused_turns_tool_calls_and_their_results_are_left_out_together() -> None:
    from agentloop.models.anthropic import build_request

    refused = Message(
        role="assistant",
        content=[TextBlock(text="Sure"), ToolUseBlock(id="toolu_1", name="read", input={})],
        meta={"stop_reason": "refusal"},
    )
    history = [
        Message.user("go"),
        refused,
        Message(role="user", content=[ToolResultBlock(tool_use_id="toolu_1", content="x")]),
        Message(role="user", content=[TextBlock(text="next")]),
    ]
    body = build_request(request(*history), model="m", max_tokens=64, thinking=None)
    assert body["messages"] == [
        {"role": "user", "content": [{"type": "text", "text": "go"}, {"type": "text", "text": "next"}]}
    ]
