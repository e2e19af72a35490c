"""Anthropic's server tools: their blocks are kept whole and sent back, a paused turn goes on.

The streams follow the shapes of the Messages streaming docs (WIRE.md §1.4(f)): a
``server_tool_use`` block whose input streams as ``input_json_delta``, a
``web_search_tool_result`` block that comes whole in its ``content_block_start``, and
text with ``citations_delta``; ``pause_turn`` (WIRE.md §1.3) ends a response whose
server call has no result yet, which the API takes back as it is to go on with.
"""

from __future__ import annotations

import json
from typing import Any

import httpx
import pytest
from _models_support import API_KEY, MockServer, collect, load, request, run_fixture, sse
from anthropic.types import ServerToolUseBlockParam, WebSearchToolResultBlockParam
from pydantic import TypeAdapter

from agentloop import (
    Message,
    ProviderBlock,
    QueryEngine,
    TextBlock,
    TurnEnded,
    repair_transcript,
    validate_transcript,
)
from agentloop._accumulate import Accumulator
from agentloop._errors import StreamProtocolError
from agentloop._messages import ToolResultBlock, ToolUseBlock
from agentloop.models import (
    AnthropicModel,
    OpenAIChatModel,
    OpenAIResponsesModel,
    StreamProviderBlock,
    StreamToolInput,
    StreamToolUseStart,
)

START = (
    "message_start",
    {"type": "message_start", "message": {"id": "msg_1", "usage": {"input_tokens": 5, "output_tokens": 1}}},
)
STOP = ("message_stop", {"type": "message_stop"})
SEARCH_ID = "srvtoolu_014hJH82Qum7Td6UV8gDXThB"


def delta_ev(index: int, delta: dict[str, Any]) -> tuple[str, dict[str, Any]]:
    return ("content_block_delta", {"type": "content_block_delta", "index": index, "delta": delta})


def block_start(index: int, block: dict[str, Any]) -> tuple[str, dict[str, Any]]:
    return ("content_block_start", {"type": "content_block_start", "index": index, "content_block": block})


def block_stop(index: int) -> tuple[str, dict[str, Any]]:
    return ("content_block_stop", {"type": "content_block_stop", "index": index})


def message_delta(reason: str) -> tuple[str, dict[str, Any]]:
    return ("message_delta", {"type": "message_delta", "delta": {"stop_reason": reason}, "usage": {"output_tokens": 9}})


def text(index: int, words: str) -> list[tuple[str, dict[str, Any]]]:
    return [block_start(index, {"type": "text", "text": ""}), delta_ev(index, {"type": "text_delta", "text": words}),
            block_stop(index)]  # fmt: skip


def search_call(index: int, query: str, id: str = SEARCH_ID) -> list[tuple[str, dict[str, Any]]]:
    arguments = json.dumps({"query": query})
    return [
        block_start(index, {"type": "server_tool_use", "id": id, "name": "web_search", "input": {}}),
        delta_ev(index, {"type": "input_json_delta", "partial_json": ""}),
        delta_ev(index, {"type": "input_json_delta", "partial_json": arguments[:9]}),
        delta_ev(index, {"type": "input_json_delta", "partial_json": arguments[9:]}),
        block_stop(index),
    ]


def search_result(index: int, id: str = SEARCH_ID) -> list[tuple[str, dict[str, Any]]]:
    block = {"type": "web_search_tool_result", "tool_use_id": id, "content": [
        {"type": "web_search_result", "title": "Weather in New York City", "url": "https://weather.example/nyc",
         "encrypted_content": "Ev0DCioIAxgCIiQ3NmU4", "page_age": None}]}  # fmt: skip
    return [block_start(index, block), block_stop(index)]


def call_block(query: str, id: str = SEARCH_ID) -> ProviderBlock:
    data = {"type": "server_tool_use", "id": id, "name": "web_search", "input": {"query": query}}
    return ProviderBlock(provider="anthropic", data=data)


def result_block(id: str = SEARCH_ID) -> ProviderBlock:
    return ProviderBlock(provider="anthropic", data={"type": "web_search_tool_result", "tool_use_id": id, "content": []})


# -- the stream ---------------------------------------------------------------------------


async def test_the_docs_web_search_stream_keeps_the_call_and_its_result_whole() -> None:
    # Before, both blocks were dropped: the model never saw its searches again, and a paused
    # turn could not be continued.
    name = "anthropic_web_search.repaired.sse"
    events, acc = await run_fixture(name, load(name))
    msg = acc.message()
    assert [b.type for b in msg.content] == ["text", "provider", "provider", "text"]
    call, result = msg.content[1], msg.content[2]
    assert isinstance(call, ProviderBlock) and isinstance(result, ProviderBlock)
    assert call == ProviderBlock(provider="anthropic", data={
        "type": "server_tool_use", "id": SEARCH_ID, "name": "web_search", "input": {"query": "weather NYC today"}})  # fmt: skip
    assert result.data["type"] == "web_search_tool_result" and result.data["tool_use_id"] == SEARCH_ID
    assert result.data["content"][0]["url"] == "https://world-weather.info/forecast/usa/new_york/may-2025/"
    assert msg.tool_uses == []  # no call for the host: nothing to run, no result owed
    assert not any(isinstance(e, StreamToolUseStart | StreamToolInput) for e in events)
    assert msg.text.startswith("I'll check the current weather in New York City for you.")
    committed = acc.committable()
    assert committed is not None and committed.content[1:3] == [call, result]


async def test_a_server_call_whose_input_was_cut_is_not_kept() -> None:
    # A max_tokens stop inside the call's input: the block could not be sent back.
    cut = [block_start(1, {"type": "server_tool_use", "id": SEARCH_ID, "name": "web_search", "input": {}}),
           delta_ev(1, {"type": "input_json_delta", "partial_json": '{"query": "weath'}), block_stop(1)]  # fmt: skip
    server = MockServer(sse(START, *text(0, "Searching."), *cut, message_delta("max_tokens"), STOP))
    async with server.client() as client:
        _, acc = await collect(AnthropicModel("m", api_key=API_KEY, http_client=client))
    assert acc.message().content == [TextBlock(text="Searching.")]


def test_a_provider_block_event_of_the_wrong_shape_is_a_protocol_error() -> None:
    acc = Accumulator()
    with pytest.raises(StreamProtocolError, match="data is list, not a dict"):
        acc.feed(StreamProviderBlock(0, "anthropic", ["not", "a", "block"]))  # type: ignore[arg-type]


# -- the request ---------------------------------------------------------------------------


def sent(model_cls: type[Any], *history: Message) -> dict[str, Any]:
    """The request body ``model_cls`` builds for ``history``."""
    server = MockServer(b"")
    model = model_cls("m", api_key=API_KEY, http_client=httpx.AsyncClient(transport=httpx.MockTransport(server.handler)))
    _, _, body = model._prepare(request(*history))
    return dict(body)


def test_server_blocks_go_back_as_they_came_each_call_with_its_result() -> None:
    history = [
        Message.user("weather?"),
        Message(
            role="assistant",
            content=[TextBlock(text="Searching."), call_block("nyc"), result_block(), TextBlock(text="Sunny.")],
        ),
        Message.user("and Paris?"),
        # Interrupted between the call and its result: the API refuses the call alone.
        Message(
            role="assistant",
            content=[TextBlock(text="Searching again."), call_block("paris", "srvtoolu_2")],
            partial=True,
        ),
        Message.user("never mind; and Rome?"),
        # A result whose call is gone (a host that edited the transcript).
        Message(role="assistant", content=[result_block("srvtoolu_9"), TextBlock(text="Rome: rain.")]),
        Message.user("thanks"),
    ]
    messages = sent(AnthropicModel, *history)["messages"]
    assert [m["role"] for m in messages] == ["user", "assistant", "user", "assistant", "user", "assistant", "user"]
    assert messages[1]["content"] == [
        {"type": "text", "text": "Searching."},
        call_block("nyc").data,
        result_block().data,
        {"type": "text", "text": "Sunny."},
    ]
    assert messages[3]["content"] == [{"type": "text", "text": "Searching again."}]
    assert messages[5]["content"] == [{"type": "text", "text": "Rome: rain."}]


def test_a_paused_turn_is_sent_back_with_its_call_and_an_empty_turn_is_not_sent() -> None:
    paused = Message(role="assistant", content=[TextBlock(text="Searching."), call_block("nyc")])
    messages = sent(AnthropicModel, Message.user("weather?"), paused)["messages"]
    assert messages[-1] == {"role": "assistant", "content": [{"type": "text", "text": "Searching."}, call_block("nyc").data]}
    # The same turn once a user message follows it: the call alone is left out, and a turn
    # left empty goes with it (the user turns around it are joined).
    alone = Message(role="assistant", content=[call_block("nyc")])
    messages = sent(AnthropicModel, Message.user("weather?"), alone, Message.user("hello?"))["messages"]
    assert messages == [{"role": "user", "content": [{"type": "text", "text": "weather?"}, {"type": "text", "text": "hello?"}]}]


async def test_the_blocks_of_the_docs_stream_go_back_in_the_shape_the_official_sdk_declares() -> None:
    # The blocks as the adapter keeps them from the docs' web search stream, in the next request:
    # validated against the anthropic SDK's request types, they must come back unchanged.
    name = "anthropic_web_search.repaired.sse"
    _, acc = await run_fixture(name, load(name))
    answer = acc.committable()
    assert answer is not None
    body = sent(AnthropicModel, Message.user("weather in NYC?"), answer, Message.user("thanks"))
    text_before, call, result, text_after = body["messages"][1]["content"]
    for shape, block in ((ServerToolUseBlockParam, call), (WebSearchToolResultBlockParam, result)):
        assert _materialise(TypeAdapter(shape).validate_python(block)) == block
    assert (call["type"], result["type"], result["tool_use_id"]) == ("server_tool_use", "web_search_tool_result", call["id"])
    assert text_before["type"] == text_after["type"] == "text"


def _materialise(value: Any) -> Any:
    """pydantic validates an ``Iterable[...]`` field lazily: consume it (validating each item)."""
    if type(value).__name__ == "ValidatorIterator":
        return [_materialise(v) for v in value]
    if isinstance(value, dict):
        return {k: _materialise(v) for k, v in value.items()}
    if isinstance(value, list):
        return [_materialise(v) for v in value]
    return value


@pytest.mark.parametrize("model_cls", [OpenAIChatModel, OpenAIResponsesModel])
def test_other_providers_leave_anthropics_blocks_out(model_cls: type[Any]) -> None:
    history = [
        Message.user("weather?"),
        Message(role="assistant", content=[call_block("nyc"), result_block(), TextBlock(text="Sunny.")]),
        Message.user("thanks"),
    ]
    body = json.dumps(sent(model_cls, *history))
    assert "Sunny." in body
    assert SEARCH_ID not in body and "web_search" not in body


# -- the transcript -----------------------------------------------------------------------


def test_a_provider_block_is_valid_in_an_assistant_message_only() -> None:
    good = [Message.user("q"), Message(role="assistant", content=[call_block("q"), result_block(), TextBlock(text="a")])]
    assert validate_transcript(good) == []
    assert repair_transcript(good) == good
    bad = [Message(role="user", content=[TextBlock(text="q"), result_block()])]
    assert validate_transcript(bad) == ["messages[0] (user): provider block inside a user message"]
    assert repair_transcript(bad) == [Message.user("q")]
    lone = Message(role="assistant", content=[ProviderBlock(provider="anthropic", data={"q": "\ud83d"})])
    assert validate_transcript([Message.user("q"), lone]) == [
        "messages[1] (assistant): provider block holds text UTF-8 cannot encode (a lone UTF-16 surrogate)"
    ]
    assert repair_transcript([Message.user("q"), lone])[1].content[0].data == {"q": "\ufffd"}  # type: ignore[union-attr]


# -- the engine: a paused turn goes on -----------------------------------------------------


def _paused_search() -> tuple[httpx.MockTransport, list[dict[str, Any]]]:
    """A server that pauses the turn mid-search, then answers: its transport, and the bodies of
    the requests it got."""
    bodies = [
        sse(START, *text(0, "Searching."), *search_call(1, "weather nyc"), message_delta("pause_turn"), STOP),
        sse(START, *search_result(0), *text(1, "Sunny, 21 C."), message_delta("end_turn"), STOP),
    ]
    requests: list[dict[str, Any]] = []

    def handler(req: httpx.Request) -> httpx.Response:
        requests.append(json.loads(req.content))
        return httpx.Response(200, headers={"content-type": "text/event-stream"}, content=bodies.pop(0))

    return httpx.MockTransport(handler), requests


async def test_a_paused_turn_is_continued_with_the_transcript_as_it_is() -> None:
    # Before, "pause_turn" ended the turn as "completed" with "Searching." for an answer.
    transport, requests = _paused_search()
    async with httpx.AsyncClient(transport=transport) as client:
        model = AnthropicModel("m", api_key=API_KEY, http_client=client)
        engine = QueryEngine(model, max_turns=5)
        ends = [e async for e in engine.run("weather in NYC?") if isinstance(e, TurnEnded)]
    assert [e.reason for e in ends] == ["completed"]
    assert len(requests) == 2
    assert requests[1]["messages"][-1] == {
        "role": "assistant",
        "content": [{"type": "text", "text": "Searching."}, call_block("weather nyc").data],
    }
    assert [m.role for m in engine.messages] == ["user", "assistant", "assistant"]
    assert engine.messages[-1].text == "Sunny, 21 C."
    assert validate_transcript(engine.messages) == []
    # The next request sends the turn as one: the call and its result together.
    (turn,) = [m for m in sent(AnthropicModel, *engine.messages, Message.user("thanks"))["messages"]
               if m["role"] == "assistant"]  # fmt: skip
    assert [b["type"] for b in turn["content"]] == ["text", "server_tool_use", "web_search_tool_result", "text"]


async def test_a_paused_turn_with_nothing_in_it_ends() -> None:
    # Nothing committed: no progress to go on from, and no request to repeat forever.
    server = MockServer(sse(START, message_delta("pause_turn"), STOP))
    async with server.client() as client:
        engine = QueryEngine(AnthropicModel("m", api_key=API_KEY, http_client=client))
        ends = [e async for e in engine.run("hi") if isinstance(e, TurnEnded)]
    assert [e.reason for e in ends] == ["completed"]
    assert len(server.requests) == 1


async def test_a_paused_turn_counts_against_max_turns() -> None:
    body = sse(START, *text(0, "Searching."), *search_call(1, "q"), message_delta("pause_turn"), STOP)
    server = MockServer(body)
    async with server.client() as client:
        engine = QueryEngine(AnthropicModel("m", api_key=API_KEY, http_client=client), max_turns=3)
        ends = [e async for e in engine.run("hi") if isinstance(e, TurnEnded)]
    assert [e.reason for e in ends] == ["max_turns"]
    assert len(server.requests) == 3


async def test_a_run_that_max_turns_stopped_on_a_paused_turn_resumes_with_a_bare_run() -> None:
    # Before, run() with no prompt refused: "the transcript does not end with a user message".
    transport, requests = _paused_search()
    async with httpx.AsyncClient(transport=transport) as client:
        model = AnthropicModel("m", api_key=API_KEY, http_client=client)
        engine = QueryEngine(model, max_turns=1)
        ends = [e async for e in engine.run("weather in NYC?") if isinstance(e, TurnEnded)]
        assert [e.reason for e in ends] == ["max_turns"]
        assert validate_transcript(engine.messages) == []
        # A new engine over the saved transcript (a worker resuming a session) goes on as well.
        saved = [Message.model_validate_json(m.model_dump_json()) for m in engine.messages]
        resumed = QueryEngine(model, messages=saved)
        ends = [e async for e in resumed.run() if isinstance(e, TurnEnded)]
    assert [e.reason for e in ends] == ["completed"]
    assert len(requests) == 2
    assert requests[1]["messages"][-1] == {
        "role": "assistant",
        "content": [{"type": "text", "text": "Searching."}, call_block("weather nyc").data],
    }
    assert [m.role for m in resumed.messages] == ["user", "assistant", "assistant"]
    assert resumed.messages[-1].text == "Sunny, 21 C."
    assert validate_transcript(resumed.messages) == []


async def test_a_bare_run_after_a_finished_answer_still_asks_for_a_prompt() -> None:
    server = MockServer(sse(START, *text(0, "Hello."), message_delta("end_turn"), STOP))
    async with server.client() as client:
        engine = QueryEngine(AnthropicModel("m", api_key=API_KEY, http_client=client))
        [e async for e in engine.run("hi")]
        with pytest.raises(ValueError, match="needs a prompt"):
            [e async for e in engine.run()]
    assert len(server.requests) == 1


def test_tool_results_stay_first_when_user_turns_are_joined() -> None:
    history = [
        Message.user("q"),
        Message(role="assistant", content=[ToolUseBlock(id="t1", name="f", input={})]),
        Message(role="user", content=[ToolResultBlock(tool_use_id="t1", content="r")]),
        Message(role="assistant", content=[call_block("x")], partial=True),
        Message.user("go on"),
    ]
    messages = sent(AnthropicModel, *history)["messages"]
    assert messages[-1]["content"] == [
        {"type": "tool_result", "tool_use_id": "t1", "content": "r"},
        {"type": "text", "text": "go on"},
    ]
