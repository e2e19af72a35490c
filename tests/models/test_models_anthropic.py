"""AnthropicModel: request building and every stream rule of WIRE.md §1."""

from __future__ import annotations

from typing import Any

import httpx
import pytest
from _models_support import (
    API_KEY,
    MockServer,
    collect,
    final,
    load,
    model_error_run,
    request,
    run_fixture,
    sse,
)

from agentloop import QueryEngine, TurnEnded
from agentloop import Tool as AgentTool
from agentloop._errors import ProviderStreamError, StreamProtocolError
from agentloop._messages import (
    Message,
    RedactedThinkingBlock,
    TextBlock,
    ThinkingBlock,
    ToolResultBlock,
    ToolUseBlock,
)
from agentloop.models import (
    AnthropicModel,
    StreamBlockStop,
    StreamEnd,
    StreamRedactedThinking,
    StreamSignature,
    StreamText,
    StreamUsage,
    Usage,
)
from agentloop.models.anthropic import build_request


class Tool:
    name = "get_weather"
    description = "Get the weather"
    input_schema: dict[str, Any] = {"type": "object", "properties": {"location": {"type": "string"}}}  # noqa: RUF012


async def run_body(body: bytes, **kw: Any) -> tuple[list[Any], Any]:
    server = MockServer(body)
    async with server.client() as client:
        return await collect(AnthropicModel("m", api_key=API_KEY, http_client=client, **kw))


ORIGIN = "https://api.anthropic.com"  # where the model's thinking is kept as made
START = (
    "message_start",
    {"type": "message_start", "message": {"id": "msg_1", "usage": {"input_tokens": 5, "output_tokens": 1}}},
)
STOP = ("message_stop", {"type": "message_stop"})


def delta_ev(index: int, delta: dict[str, Any]) -> tuple[str, dict[str, Any]]:
    return ("content_block_delta", {"type": "content_block_delta", "index": index, "delta": delta})


def block_start(index: int, block: dict[str, Any]) -> tuple[str, dict[str, Any]]:
    return ("content_block_start", {"type": "content_block_start", "index": index, "content_block": block})


def block_stop(index: int) -> tuple[str, dict[str, Any]]:
    return ("content_block_stop", {"type": "content_block_stop", "index": index})


def message_delta(reason: str, usage: dict[str, Any] | None = None) -> tuple[str, dict[str, Any]]:
    return (
        "message_delta",
        {"type": "message_delta", "delta": {"stop_reason": reason}, "usage": usage or {}},
    )


# -- fixtures -------------------------------------------------------------------


async def test_text_fixture() -> None:
    events, acc = await run_fixture("anthropic_text.sse", load("anthropic_text.sse"))
    assert acc.message().text == "Hello!"
    assert acc.stop_reason == "end_turn"
    assert acc.usage == Usage(25, 15)
    assert acc.response_id == "msg_1nZdL29xx5MUA1yADyHTEsnR8uuvGzszyY"
    assert isinstance(events[-1], StreamEnd)
    assert sum(isinstance(e, StreamEnd) for e in events) == 1


async def test_tool_use_fixture_input_assembled_from_fragments() -> None:
    _, acc = await run_fixture("anthropic_tool_use.sse", load("anthropic_tool_use.sse"))
    msg = acc.message()
    assert msg.text == "Okay, let's check the weather for San Francisco, CA:"
    (call,) = msg.tool_uses
    assert (call.id, call.name) == ("toolu_01T1x1fJ34qAmk2tNTrN7Up6", "get_weather")
    assert call.input == {"location": "San Francisco, CA", "unit": "fahrenheit"}
    assert acc.stop_reason == "tool_use"
    assert acc.usage == Usage(472, 89)


async def test_sdk_fixture_with_newer_fields() -> None:
    _, acc = await run_fixture("anthropic_tool_use.sdkfixture.sse", load("anthropic_tool_use.sdkfixture.sse"))
    assert acc.message().tool_uses[0].input == {"location": "Paris"}
    assert acc.usage == Usage(377, 65)


async def test_thinking_tool_use_and_redacted_thinking() -> None:
    name = "anthropic_thinking_tool_use.assembled.sse"
    events, acc = await run_fixture(name, load(name))
    msg = acc.message()
    kinds = [type(b) for b in msg.content]
    assert kinds == [ThinkingBlock, RedactedThinkingBlock, TextBlock, ToolUseBlock]
    thinking = msg.content[0]
    assert isinstance(thinking, ThinkingBlock)
    assert thinking.thinking == "The user wants the current weather in Paris. I should call get_weather."
    assert thinking.signature.startswith("EqQBCgIYAhIM1gbcDa9GJwZA2b3hGgxB")
    assert any(isinstance(e, StreamRedactedThinking) for e in events)
    assert any(isinstance(e, StreamSignature) for e in events)
    assert acc.stop_reason == "tool_use"
    assert acc.usage.output_tokens == 96


async def test_thinking_fixture_without_usage() -> None:
    _, acc = await run_fixture("anthropic_thinking.sse", load("anthropic_thinking.sse"))
    assert acc.message().text == "The greatest common divisor of 1071 and 462 is **21**."
    assert acc.usage == Usage()


async def test_refusal_with_stop_details() -> None:
    name = "anthropic_refusal.sdkfixture.sse"
    _, acc = await run_fixture(name, load(name))
    assert acc.stop_reason == "refusal"
    assert acc.message().content == []  # the empty text block is not kept


async def test_fixture_with_literal_ellipsis_is_malformed_json() -> None:
    with pytest.raises(StreamProtocolError, match="malformed JSON"):
        await run_fixture("anthropic_web_search.repaired.sse", load("anthropic_web_search.sse"))


async def test_missing_final_blank_line_drops_the_last_event() -> None:
    # The message_stop without its blank line is never dispatched; the body still ended cleanly
    # after the message_delta that gave the stop reason, which is the end of the answer.
    raw = load("anthropic_tool_use.sdkfixture.sse", terminate=False)
    assert not raw.endswith(b"\n\n")
    _, acc = await run_fixture("anthropic_tool_use.sdkfixture.sse", raw)
    _, whole = await run_fixture("anthropic_tool_use.sdkfixture.sse", load("anthropic_tool_use.sdkfixture.sse"))
    assert final(acc) == final(whole)
    cut = raw[: raw.rindex(b"event: message_delta")].rstrip(b"\n") + b"\n"  # its blank line gone too
    with pytest.raises(StreamProtocolError, match="message_stop") as info:
        await run_fixture("anthropic_tool_use.sdkfixture.sse", cut)
    assert info.value.retryable is True


async def test_midstream_overloaded_error_is_retryable_stream_error() -> None:
    name = "anthropic_midstream_error.assembled.sse"
    server = MockServer(load(name), headers={"request-id": "req_hdr"})
    async with server.client() as client:
        model = AnthropicModel("m", api_key=API_KEY, http_client=client)
        with pytest.raises(ProviderStreamError) as info:
            await collect(model)
    err = info.value
    assert (err.status, err.error_type, err.retryable) == (200, "overloaded_error", True)
    assert err.request_id == "req_hdr"
    assert server.streams[0].closed


async def test_error_event_with_request_id_and_details() -> None:
    body = sse(
        START,
        ("error", {"type": "error", "error": {"details": None, "type": "api_error", "message": "Internal"},
                   "request_id": "req_011Ce3"}),
    )  # fmt: skip
    with pytest.raises(ProviderStreamError) as info:
        await run_body(body)
    assert (info.value.error_type, info.value.retryable, info.value.request_id) == (
        "api_error",
        True,
        "req_011Ce3",
    )


async def test_non_retryable_error_event() -> None:
    body = sse(("error", {"type": "error", "error": {"type": "invalid_request_error", "message": "bad"}}))
    with pytest.raises(ProviderStreamError) as info:
        await run_body(body)
    assert info.value.retryable is False


# -- event rules -------------------------------------------------------------------


async def test_events_without_event_lines_follow_json_type() -> None:
    body = load("anthropic_text.sse").replace(b"event: ", b": was event ")
    _, acc = await run_body(body)
    assert acc.message().text == "Hello!"
    assert acc.stop_reason == "end_turn"


async def test_ping_and_unknown_events_ignored() -> None:
    body = sse(
        START,
        ("ping", {"type": "ping"}),
        ("brand_new_event", {"type": "brand_new_event", "x": 1}),
        block_start(0, {"type": "text", "text": ""}),
        delta_ev(0, {"type": "text_delta", "text": "hi"}),
        delta_ev(0, {"type": "citations_delta", "citation": {}}),
        delta_ev(0, {"type": "brand_new_delta", "x": 1}),
        block_stop(0),
        block_stop(7),  # a block never started: nothing to close
        message_delta("end_turn", {"output_tokens": 3}),
        STOP,
    )
    events, acc = await run_body(body)
    assert acc.message().text == "hi"
    assert [type(e) for e in events] == [StreamUsage, StreamText, StreamBlockStop, StreamEnd]


@pytest.mark.parametrize("data", ["", "keepalive", "15000", '{"type": "ping"}'])
async def test_a_ping_is_ignored_whatever_its_data(data: str) -> None:
    # The SDK skips ping events unread; a proxy's keep-alive with empty or plain-text data
    # used to fail the response as "malformed JSON".
    body = sse(START, ("ping", data), block_start(0, {"type": "text", "text": ""}),
               delta_ev(0, {"type": "text_delta", "text": "hi"}), ("ping", data), block_stop(0),
               message_delta("end_turn"), STOP)  # fmt: skip
    _, acc = await run_body(body)
    assert acc.message().text == "hi"


@pytest.mark.parametrize(("name", "data"), [("keepalive", ""), ("keepalive", "15000"), ("heartbeat", "tick")])
async def test_an_unknown_named_event_whose_data_is_not_json_is_skipped(name: str, data: str) -> None:
    # A proxy's keep-alive (event: keepalive, data: empty) failed the stream as "malformed JSON",
    # a retryable protocol error; the API's docs ask for unknown event types to be handled
    # gracefully, and the SDK reads no named event with empty data.
    body = sse(START, (name, data), block_start(0, {"type": "text", "text": ""}),
               delta_ev(0, {"type": "text_delta", "text": "hi"}), (name, data), block_stop(0),
               message_delta("end_turn"), STOP)  # fmt: skip
    _, acc = await run_body(body)
    assert acc.message().text == "hi"


@pytest.mark.parametrize("name", ["content_block_delta", "message_delta", None])
async def test_an_event_the_mapper_reads_whose_data_is_not_json_is_still_a_protocol_error(name: str | None) -> None:
    with pytest.raises(StreamProtocolError, match="malformed JSON") as info:
        await run_body(sse(START, (name, "{not json")))
    assert info.value.retryable is True


@pytest.mark.parametrize("data", ["upstream overloaded", ""])
async def test_an_error_event_whose_data_is_not_json_is_the_servers_error(data: str) -> None:
    with pytest.raises(ProviderStreamError) as info:
        await run_body(sse(START, ("error", data)))
    assert (info.value.status, info.value.retryable) == (200, False)
    assert str(info.value) == f"anthropic stream error: {data or 'stream error'}"


async def test_a_delta_for_a_block_never_started_is_a_retryable_protocol_error() -> None:
    # Before, its text was dropped without a word.
    body = sse(START, delta_ev(0, {"type": "text_delta", "text": "the answer"}), message_delta("end_turn"), STOP)
    with pytest.raises(StreamProtocolError, match="no content_block_start began") as info:
        await run_body(body)
    assert info.value.retryable is True


TOOL_BLOCK = {"type": "tool_use", "id": "toolu_1", "name": "f", "input": {}}


@pytest.mark.parametrize(
    ("block", "delta"),
    [
        ({"type": "text", "text": ""}, {"type": "thinking_delta", "thinking": "private"}),  # was: answer -> thinking
        ({"type": "text", "text": ""}, {"type": "input_json_delta", "partial_json": "{}"}),  # was: a nameless call
        (TOOL_BLOCK, {"type": "text_delta", "text": "x"}),
        ({"type": "thinking", "thinking": "", "signature": ""}, {"type": "text_delta", "text": "x"}),
        ({"type": "redacted_thinking", "data": "EmwK"}, {"type": "signature_delta", "signature": "S"}),
    ],
)
async def test_a_delta_of_another_blocks_type_is_a_retryable_protocol_error(
    block: dict[str, Any], delta: dict[str, Any]
) -> None:
    body = sse(START, block_start(0, block), delta_ev(0, delta), block_stop(0), message_delta("end_turn"), STOP)
    with pytest.raises(StreamProtocolError, match=f"{delta['type']} for block 0, which is a {block['type']} block") as info:
        await run_body(body)
    assert info.value.retryable is True


async def test_a_block_started_twice_is_a_retryable_protocol_error() -> None:
    # Before, a tool call started at the index of a text block was merged into the text: lost.
    body = sse(START, block_start(0, {"type": "text", "text": "x"}), block_stop(0), block_start(0, TOOL_BLOCK),
               delta_ev(0, {"type": "input_json_delta", "partial_json": "{}"}), block_stop(0),
               message_delta("tool_use"), STOP)  # fmt: skip
    with pytest.raises(StreamProtocolError, match="had begun already") as info:
        await run_body(body)
    assert info.value.retryable is True


async def test_a_block_started_below_one_already_begun_is_a_retryable_protocol_error() -> None:
    # The message orders its blocks by index: "first" would come before "second", which the host
    # was shown first. The API numbers blocks from 0 up, one after another.
    body = sse(START, block_start(1, {"type": "text", "text": ""}), delta_ev(1, {"type": "text_delta", "text": "second"}),
               block_stop(1), block_start(0, {"type": "text", "text": ""}),
               delta_ev(0, {"type": "text_delta", "text": "first"}), block_stop(0), message_delta("end_turn"), STOP)  # fmt: skip
    with pytest.raises(StreamProtocolError, match="after block 1") as info:
        await run_body(body)
    assert info.value.retryable is True


@pytest.mark.parametrize("later_closed", [True, False])
async def test_text_for_a_block_before_the_latest_opens_a_new_block_at_the_end(later_closed: bool) -> None:
    # Block 0 was whole once block 1 began: its text would join it in the message, before the
    # text of block 1 the host saw first. It is a block of its own after block 1 (as a Responses
    # message's text after its output_item.done), and block 2 comes after it.
    text = {"type": "text", "text": ""}
    middle = [delta_ev(0, {"type": "text_delta", "text": "three"}), block_stop(0)]
    body = sse(START, block_start(0, text), delta_ev(0, {"type": "text_delta", "text": "one"}), block_stop(0),
               block_start(1, text), delta_ev(1, {"type": "text_delta", "text": "two"}),
               *([block_stop(1), *middle] if later_closed else [*middle, block_stop(1)]),
               block_start(2, text), delta_ev(2, {"type": "text_delta", "text": "four"}), block_stop(2),
               message_delta("end_turn"), STOP)  # fmt: skip
    _, acc = await run_body(body)
    assert [b.text for b in acc.message().content] == ["one", "two", "three", "four"]  # type: ignore[union-attr]


async def test_a_call_input_for_a_block_before_the_latest_is_not_retried() -> None:
    body = sse(START, block_start(0, TOOL_BLOCK), delta_ev(0, {"type": "input_json_delta", "partial_json": "{}"}),
               block_stop(0), block_start(1, {"type": "text", "text": ""}),
               delta_ev(0, {"type": "input_json_delta", "partial_json": "{}"}), block_stop(1),
               message_delta("tool_use"), STOP)  # fmt: skip
    with pytest.raises(StreamProtocolError, match="after its content_block_stop") as info:
        await run_body(body)
    assert info.value.retryable is False


@pytest.mark.parametrize("signature_first", [True, False])
async def test_a_signature_before_or_after_the_thinking_text_gives_the_same_block(signature_first: bool) -> None:
    sig, text = delta_ev(0, {"type": "signature_delta", "signature": "EqQB"}), delta_ev(0, {"type": "thinking_delta", "thinking": "Let me see."})
    deltas = [sig, text] if signature_first else [text, sig]
    body = sse(START, block_start(0, {"type": "thinking", "thinking": "", "signature": ""}), *deltas, block_stop(0),
               message_delta("end_turn"), STOP)  # fmt: skip
    _, acc = await run_body(body)
    assert acc.message().content == [ThinkingBlock(thinking="Let me see.", signature="EqQB", origin=ORIGIN)]


async def test_a_thinking_block_sent_whole_in_its_start_keeps_its_signature() -> None:
    # A proxy that replays a finished response sends each block whole in content_block_start.
    # The signature there was ignored: the thinking block was dropped as unsigned, and with
    # thinking on, the next request of a tool loop failed ("Expected `thinking` or
    # `redacted_thinking`, but found `tool_use`"). The official SDK keeps it.
    whole = {"type": "thinking", "thinking": "whole thought", "signature": "EqQBsig"}
    body = sse(START, block_start(0, whole), block_stop(0), block_start(1, TOOL_BLOCK),
               delta_ev(1, {"type": "input_json_delta", "partial_json": "{}"}), block_stop(1), message_delta("tool_use"), STOP)  # fmt: skip
    _, acc = await run_body(body)
    assert acc.committable() == Message(role="assistant", content=[
        ThinkingBlock(thinking="whole thought", signature="EqQBsig", origin=ORIGIN), ToolUseBlock(id="toolu_1", name="f", input={})])  # fmt: skip


@pytest.mark.parametrize(
    ("deltas", "expected"),
    [
        ([], {"a": 1}),  # the input whole in the start, as a proxy sends it
        (["", '{"b": 2}'], {"b": 2}),  # and then streamed too: the streamed input is the call's
        (["", '{"b":', " 2}"], {"b": 2}),
        ([""], {"a": 1}),  # an empty fragment adds nothing
    ],
)
async def test_a_tool_input_given_in_the_start_is_replaced_by_a_streamed_one(
    deltas: list[str], expected: dict[str, Any]
) -> None:
    # Both used to be joined into '{"a": 1}{"b": 2}', not JSON: the call got an error result
    # instead of running. The official SDK takes the streamed input.
    start = {"type": "tool_use", "id": "toolu_1", "name": "f", "input": {"a": 1}}
    fragments = [delta_ev(0, {"type": "input_json_delta", "partial_json": d}) for d in deltas]
    _, acc = await run_body(sse(START, block_start(0, start), *fragments, block_stop(0), message_delta("tool_use"), STOP))
    (call,) = acc.message().tool_uses
    assert (call.input, call.input_error) == (expected, None)


async def test_a_tool_input_given_in_the_start_of_a_block_never_stopped_is_still_the_calls() -> None:
    start = {"type": "tool_use", "id": "toolu_1", "name": "f", "input": {"a": 1}}
    _, acc = await run_body(sse(START, block_start(0, start), message_delta("tool_use"), STOP))
    assert acc.message().tool_uses == [ToolUseBlock(id="toolu_1", name="f", input={"a": 1})]


async def test_a_token_count_that_is_a_string_does_not_crash_a_later_turn() -> None:
    # Before: Usage(output_tokens="3") was added to the next turn's usage, and run() raised TypeError.
    def answer(reason: str, *blocks: tuple[str, dict[str, Any]]) -> bytes:
        usage = {"output_tokens": "3"}
        return sse(START, *blocks, ("message_delta", {"type": "message_delta", "delta": {"stop_reason": reason},
                                                      "usage": usage}), STOP)  # fmt: skip

    call = [block_start(0, TOOL_BLOCK), delta_ev(0, {"type": "input_json_delta", "partial_json": "{}"}), block_stop(0)]
    bodies = [answer("tool_use", *call), answer("end_turn", block_start(0, {"type": "text", "text": "done"}), block_stop(0))]

    async def run_tool(args: dict[str, Any], ctx: Any) -> str:
        return "ok"

    def handler(req: httpx.Request) -> httpx.Response:
        return httpx.Response(200, headers={"content-type": "text/event-stream"}, content=bodies.pop(0))

    async with httpx.AsyncClient(transport=httpx.MockTransport(handler)) as client:
        model = AnthropicModel("m", api_key=API_KEY, http_client=client)
        engine = QueryEngine(model, tools=[AgentTool("f", "f", {"type": "object"}, run_tool)], usage_limit=10**6)
        ends = [e async for e in engine.run("hi") if isinstance(e, TurnEnded)]
    assert engine.messages[-1].text == "done"
    assert ends[-1].usage == Usage(10, 2)


async def test_token_counts_that_are_not_numbers_are_left_out_of_the_usage() -> None:
    body = sse(START, ("message_delta", {"type": "message_delta", "delta": {"stop_reason": "end_turn"}, "usage": {
        "output_tokens": "40", "cache_read_input_tokens": None, "cache_creation_input_tokens": 2.0}}), STOP)  # fmt: skip
    _, acc = await run_body(body)
    assert acc.usage == Usage(7, 1, 0, 2)
    assert type(acc.usage.output_tokens) is int and type(acc.usage.cache_write_tokens) is int


@pytest.mark.parametrize(
    "reason",
    ["end_turn", "tool_use", "max_tokens", "stop_sequence", "refusal", "pause_turn", "model_context_window_exceeded"],
)
async def test_stop_reasons_pass_through(reason: str) -> None:
    _, acc = await run_body(sse(START, message_delta(reason), STOP))
    assert acc.stop_reason == reason


async def test_signature_and_omitted_thinking() -> None:
    body = sse(
        START,
        block_start(0, {"type": "thinking", "thinking": "", "signature": ""}),
        delta_ev(0, {"type": "signature_delta", "signature": "EosnCkYICxIMMb3LzNrMu"}),
        block_stop(0),
        message_delta("end_turn"),
        STOP,
    )
    _, acc = await run_body(body)
    assert acc.message().content == [ThinkingBlock(thinking="", signature="EosnCkYICxIMMb3LzNrMu", origin=ORIGIN)]


async def test_usage_is_cumulative_and_cache_fields_mapped() -> None:
    start = ("message_start", {"type": "message_start", "message": {"id": "m", "usage": {
        "input_tokens": 10, "output_tokens": 1, "cache_read_input_tokens": 7, "cache_creation_input_tokens": 3}}})  # fmt: skip
    _, acc = await run_body(sse(start, message_delta("end_turn", {"output_tokens": 40}), STOP))
    assert acc.usage == Usage(20, 40, 7, 3)


async def test_input_tokens_count_the_prompt_read_from_and_written_to_the_cache() -> None:
    # Anthropic's input_tokens is only the part of the prompt after the last cache breakpoint
    # (1 token here, out of 30,721). OpenAI's counts include the cached part, and a usage_limit
    # counts input_tokens: it used to see 1 token for this request.
    start = ("message_start", {"type": "message_start", "message": {"id": "m", "usage": {
        "input_tokens": 1, "output_tokens": 1, "cache_read_input_tokens": 30433, "cache_creation_input_tokens": 287}}})  # fmt: skip
    events, acc = await run_body(sse(start, message_delta("end_turn", {"output_tokens": 67}), STOP))
    assert acc.usage == Usage(input_tokens=30721, output_tokens=67, cache_read_tokens=30433, cache_write_tokens=287)
    assert events[0] == StreamUsage(Usage(30721, 1, 30433, 287))
    # message_delta's counts are cumulative totals too: those it carries replace the earlier ones.
    later = message_delta("end_turn", {"output_tokens": 67, "input_tokens": 5, "cache_read_input_tokens": 30500})
    _, acc = await run_body(sse(start, later, STOP))
    assert acc.usage == Usage(30792, 67, 30500, 287)


async def test_truncated_tool_input_is_incomplete() -> None:
    body = sse(
        START,
        block_start(0, {"type": "tool_use", "id": "t1", "name": "f", "input": {}}),
        delta_ev(0, {"type": "input_json_delta", "partial_json": '{"location": "San'}),
    )
    with pytest.raises(StreamProtocolError):
        await run_body(body)


async def test_malformed_json_data_line() -> None:
    with pytest.raises(StreamProtocolError, match="malformed JSON"):
        await run_body(sse(START, ("content_block_delta", "{not json")))


async def test_event_missing_fields_is_a_protocol_error() -> None:
    with pytest.raises(StreamProtocolError, match="malformed content_block_start"):
        await run_body(sse(START, ("content_block_start", {"type": "content_block_start", "index": 0})))


async def test_empty_body_is_a_protocol_error() -> None:
    with pytest.raises(StreamProtocolError, match="without message_stop"):
        await run_body(b"")


# -- request ---------------------------------------------------------------------


async def test_request_shape_and_headers() -> None:
    server = MockServer(sse(START, message_delta("end_turn"), STOP))
    history = [
        Message.user("weather?"),
        Message.user("in Paris", meta={"host": 1}),
        Message(
            role="assistant",
            content=[
                ThinkingBlock(thinking="think", signature="sig"),
                ThinkingBlock(thinking="unsigned", signature=""),
                RedactedThinkingBlock(data="opaque"),
                TextBlock(text=""),
                ToolUseBlock(id="t1", name="get_weather", input={"location": "Paris"}),
                ToolUseBlock(id="t2", name="get_weather", input={}, complete=False),
            ],
        ),
        Message(
            role="user", content=[TextBlock(text="also"), ToolResultBlock(tool_use_id="t1", content="88F")]
        ),
        Message(
            role="user",
            content=[ToolResultBlock(tool_use_id="t9", content=[TextBlock(text="x")], is_error=True)],
            synthetic=True,
            kind="tool_results",
        ),
    ]
    async with server.client() as client:
        model = AnthropicModel("claude-x", api_key=API_KEY, http_client=client, thinking=2048, max_tokens=4999)
        await collect(model, request(*history, system="be brief", tools=[Tool()], tool_choice="auto"))
    req = server.requests[0]
    assert req.url == "https://api.anthropic.com/v1/messages"
    assert req.headers["x-api-key"] == API_KEY
    assert req.headers["anthropic-version"] == "2023-06-01"
    body = server.body
    assert body["model"] == "claude-x"
    assert body["stream"] is True
    assert body["max_tokens"] == 4999
    assert body["system"] == "be brief"
    assert body["thinking"] == {"type": "enabled", "budget_tokens": 2048}
    assert body["tool_choice"] == {"type": "auto"}  # a forced one goes without thinking
    assert body["tools"] == [
        {"name": "get_weather", "description": "Get the weather", "input_schema": Tool.input_schema}
    ]
    msgs = body["messages"]
    assert [m["role"] for m in msgs] == ["user", "assistant", "user"]
    assert msgs[0]["content"] == [{"type": "text", "text": "weather?"}, {"type": "text", "text": "in Paris"}]
    assert msgs[1]["content"] == [
        {"type": "thinking", "thinking": "think", "signature": "sig"},
        {"type": "redacted_thinking", "data": "opaque"},
        {"type": "tool_use", "id": "t1", "name": "get_weather", "input": {"location": "Paris"}},
    ]
    assert msgs[2]["content"] == [
        {"type": "tool_result", "tool_use_id": "t1", "content": "88F"},
        {
            "type": "tool_result",
            "tool_use_id": "t9",
            "content": [{"type": "text", "text": "x"}],
            "is_error": True,
        },
        {"type": "text", "text": "also"},
    ]


@pytest.mark.parametrize(
    ("choice", "wire"),
    [
        ("auto", {"type": "auto"}),
        ("any", {"type": "any"}),
        ("required", {"type": "any"}),  # OpenAI's word, as QueryEngine(tool_choice=...) takes it
        ("none", {"type": "none"}),
        ("f", {"type": "tool", "name": "f"}),
    ],
)
async def test_tool_choice_mapping(choice: str, wire: dict[str, str]) -> None:
    server = MockServer(sse(START, message_delta("end_turn"), STOP))
    async with server.client() as client:
        await collect(
            AnthropicModel("m", api_key=API_KEY, http_client=client),
            request(tool_choice=choice, max_tokens=5),
        )
    assert server.body["tool_choice"] == wire
    assert server.body["max_tokens"] == 5
    assert "thinking" not in server.body


@pytest.mark.parametrize(
    ("thinking", "max_tokens", "sent"),
    [
        (8000, None, 4096 + 8000),  # the docs' example: thinking=8000 with the default max_tokens
        ({"type": "enabled", "budget_tokens": 2048}, 1000, 3048),
        ({"type": "enabled", "budget_tokens": 2048}, 2048, 4096),
        ({"type": "enabled", "budget_tokens": 2048}, 3000, 3000),  # room already: untouched
        ({"type": "adaptive"}, 1000, 1000),
    ],
)
async def test_max_tokens_always_exceeds_the_thinking_budget(
    thinking: object, max_tokens: int | None, sent: int
) -> None:
    # Anthropic answers 400 "`max_tokens` must be greater than `thinking.budget_tokens`" otherwise.
    server = MockServer(sse(START, message_delta("end_turn"), STOP))
    async with server.client() as client:
        await collect(AnthropicModel("m", api_key=API_KEY, http_client=client, thinking=thinking),  # type: ignore[arg-type]
                      request(max_tokens=max_tokens))  # fmt: skip
    assert server.body["max_tokens"] == sent
    assert server.body["thinking"] == (thinking if isinstance(thinking, dict) else {"type": "enabled", "budget_tokens": 8000})


@pytest.mark.parametrize(
    "beta", ["interleaved-thinking-2025-05-14", "fine-grained-tool-streaming-2025-05-14,interleaved-thinking-2025-05-14"]
)
async def test_with_interleaved_thinking_the_budget_may_exceed_max_tokens(beta: str) -> None:
    # With the interleaved-thinking beta, budget_tokens is the budget of the whole assistant turn
    # and may exceed max_tokens (the docs). max_tokens=16000 used to go out as 36000, above
    # Claude Opus 4's 32000 output tokens: a 400 for every request.
    server = MockServer(sse(START, message_delta("end_turn"), STOP))
    async with server.client() as client:
        model = AnthropicModel("m", api_key=API_KEY, http_client=client, thinking=20000, max_tokens=16000,
                               extra_headers={"Anthropic-Beta": beta})  # fmt: skip
        await collect(model)
    assert server.requests[0].headers["anthropic-beta"] == beta
    assert (server.body["max_tokens"], server.body["thinking"]["budget_tokens"]) == (16000, 20000)


async def test_bearer_auth_and_base_url_and_extras() -> None:
    server = MockServer(sse(START, message_delta("end_turn"), STOP))
    async with server.client() as client:
        model = AnthropicModel(
            "m", api_key=API_KEY, http_client=client, base_url="http://proxy.local/",
            auth_header="authorization", anthropic_version="2026-10-21",
            thinking={"type": "adaptive"}, extra_body={"metadata": {"user_id": "u"}},
        )  # fmt: skip
        await collect(model)
    req = server.requests[0]
    assert req.url == "http://proxy.local/v1/messages"
    assert req.headers["authorization"] == f"Bearer {API_KEY}"
    assert "x-api-key" not in req.headers
    assert req.headers["anthropic-version"] == "2026-10-21"
    assert server.body["thinking"] == {"type": "adaptive"}
    assert server.body["metadata"] == {"user_id": "u"}


async def test_a_transcript_from_another_provider_is_sent_as_anthropic_accepts_it() -> None:
    # A host that moves a session from an OpenAI-compatible server or the Responses API to
    # Claude: reasoning kept as a Responses item (a JSON signature) would fail every request
    # with "Invalid `signature` in `thinking` block", and Kimi's ids with the id pattern.
    server = MockServer(sse(START, message_delta("end_turn"), STOP))
    history = [
        Message.user("list it"),
        Message(
            role="assistant",
            content=[
                ThinkingBlock(thinking="from OpenAI", signature='{"id":"rs_1","summary":[]}'),
                ToolUseBlock(id="functions.ls:0", name="ls", input={}),
            ],
        ),
        Message(role="user", content=[ToolResultBlock(tool_use_id="functions.ls:0", content="a.txt")]),
        Message(role="assistant", content=[ThinkingBlock(thinking="mine", signature="EqQBCgIY")]),
        Message(role="assistant", content=[TextBlock(text="one file")]),
        Message.user("thanks"),
    ]
    async with server.client() as client:
        await collect(AnthropicModel("claude-x", api_key=API_KEY, http_client=client), request(*history))
    messages = server.body["messages"]
    assert [m["role"] for m in messages] == ["user", "assistant", "user", "assistant", "user"]
    (use,) = messages[1]["content"]  # the foreign thinking is not sent
    (result,) = messages[2]["content"]
    assert use["type"] == "tool_use" and use["id"] == result["tool_use_id"]
    assert use["id"].startswith("functions_ls_0_") and use["id"].replace("_", "").isalnum()
    assert [b["type"] for b in messages[3]["content"]] == ["thinking", "text"]  # Claude's own is kept


async def test_blank_text_is_never_sent_not_even_inside_a_tool_result() -> None:
    # Anthropic answers "text content blocks must contain non-whitespace text" to every
    # request that carries one: a blank message a host wrote, a tool that printed a newline.
    server = MockServer(sse(START, message_delta("end_turn"), STOP))
    history = [
        Message.user("  \n"),
        Message.user("list it"),
        Message(role="assistant", content=[ToolUseBlock(id="t1", name="ls", input={}),
                                           ToolUseBlock(id="t2", name="ls", input={})]),
        Message(role="user", content=[ToolResultBlock(tool_use_id="t1", content="\n"),
                                      ToolResultBlock(tool_use_id="t2", content=[TextBlock(text=" "), TextBlock(text="a")])]),
    ]  # fmt: skip
    async with server.client() as client:
        await collect(AnthropicModel("claude-x", api_key=API_KEY, http_client=client), request(*history))
    first, _, results = server.body["messages"]
    assert first["content"] == [{"type": "text", "text": "list it"}]
    assert results["content"] == [
        {"type": "tool_result", "tool_use_id": "t1"},
        {"type": "tool_result", "tool_use_id": "t2", "content": [{"type": "text", "text": "a"}]},
    ]


# -- an assistant turn never ends with thinking ------------------------------------------

_SIGNED = ThinkingBlock(thinking="hmm", signature="EosnCkYICxIM")
_REDACTED = RedactedThinkingBlock(data="ENCRYPTED")


def _sent(*history: Message) -> list[dict[str, Any]]:
    body = build_request(request(*history), model="m", max_tokens=1024, thinking=None)
    messages: list[dict[str, Any]] = body["messages"]
    return messages


def test_trailing_thinking_is_dropped_from_an_assistant_turn() -> None:
    history = [
        Message.user("q"),
        Message(role="assistant", content=[_SIGNED, TextBlock(text="partial answer"), _REDACTED, _SIGNED], partial=True),
        Message.user("go on"),
    ]
    sent = _sent(*history)
    assert [m["role"] for m in sent] == ["user", "assistant", "user"]
    assert [b["type"] for b in sent[1]["content"]] == ["thinking", "text"]  # the leading one stays
    assert len(history[1].content) == 4  # the transcript is not changed


@pytest.mark.parametrize("cut", [[_SIGNED], [_REDACTED], [_SIGNED, _REDACTED]], ids=["thinking", "redacted", "both"])
def test_an_assistant_turn_of_thinking_only_is_dropped_and_the_user_turns_around_it_joined(cut: list[Any]) -> None:
    history = [
        Message.user("first"),
        Message(role="assistant", content=[TextBlock(text="ok"), ToolUseBlock(id="t1", name="f", input={})]),
        Message(role="user", content=[ToolResultBlock(tool_use_id="t1", content="done"), TextBlock(text="and")]),
        Message(role="assistant", content=cut, partial=True),
        Message.user("then"),
    ]
    sent = _sent(*history)
    assert [m["role"] for m in sent] == ["user", "assistant", "user"]
    assert sent[2]["content"] == [
        {"type": "tool_result", "tool_use_id": "t1", "content": "done"},
        {"type": "text", "text": "and"},
        {"type": "text", "text": "then"},
    ]


def test_a_last_assistant_turn_of_thinking_only_is_not_sent() -> None:
    sent = _sent(Message.user("q"), Message(role="assistant", content=[_SIGNED], partial=True))
    assert sent == [{"role": "user", "content": [{"type": "text", "text": "q"}]}]


_FOREIGN = ThinkingBlock(thinking="r", signature='{"id": "rs_1", "summary": []}')


@pytest.mark.parametrize(
    ("first", "thinks"),
    [([_SIGNED], True), ([_REDACTED], True), ([_FOREIGN], False), ([], False)],
    ids=["signed", "redacted", "another-providers", "none"],
)
@pytest.mark.parametrize("thinking", [{"type": "enabled", "budget_tokens": 2000}, {"type": "adaptive"}])
def test_thinking_is_left_off_a_request_answering_a_tool_turn_that_did_not_think(
    first: list[Any], thinks: bool, thinking: dict[str, Any]
) -> None:
    history = [
        Message.user("q"),
        Message(role="assistant", content=[*first, TextBlock(text="Looking."), ToolUseBlock(id="t1", name="f", input={})]),
        Message(role="user", content=[ToolResultBlock(tool_use_id="t1", content="done")]),
        Message.user("[Request interrupted by user]"),
    ]
    body = build_request(request(*history), model="m", max_tokens=1024, thinking=thinking)
    assert ("thinking" in body) is thinks
    # A request whose last user turn answers no tool call keeps thinking, whatever came before.
    later = build_request(request(*history, Message.assistant("ok"), Message.user("next")),
                          model="m", max_tokens=1024, thinking=thinking)
    assert later["thinking"] == thinking


# -- thinking goes back to the server that made it only ----------------------------------

_DEEPSEEK = "https://api.deepseek.com/anthropic"


async def test_thinking_is_kept_with_the_server_that_made_it() -> None:
    # DeepSeek's (or Kimi's) Anthropic API signs thinking with keys of its own: the block
    # records the server (scheme, host, port and path; no user info, query or trailing slash),
    # not the model.
    body = sse(START, block_start(0, {"type": "thinking", "thinking": "", "signature": ""}),
               delta_ev(0, {"type": "thinking_delta", "thinking": "hm"}),
               delta_ev(0, {"type": "signature_delta", "signature": "ZHMtc2ln"}), block_stop(0),
               block_start(1, {"type": "redacted_thinking", "data": "ZHMtcmVk"}), block_stop(1),
               block_start(2, {"type": "text", "text": "ok"}), block_stop(2), message_delta("end_turn"), STOP)  # fmt: skip
    origins = []
    for base_url in ("https://API.DeepSeek.com:443/anthropic", "http://user:pw@localhost:8080/v1?x=1"):
        server = MockServer(body)
        async with server.client() as client:
            _, acc = await collect(AnthropicModel("m", api_key=API_KEY, base_url=base_url, http_client=client))
        message = acc.committable()
        assert message is not None
        origins.append([getattr(b, "origin", "-") for b in message.content])
    here = ["https://api.deepseek.com/anthropic", "http://localhost:8080/v1"]
    assert origins == [[here[0], here[0], "-"], [here[1], here[1], "-"]]


@pytest.mark.parametrize("origin", [ORIGIN, _DEEPSEEK, None], ids=["this-server", "another-server", "unknown"])
def test_thinking_another_server_made_is_not_sent_there(origin: str | None) -> None:
    # Sent to api.anthropic.com, DeepSeek's signature fails every request ("Invalid
    # `signature` in `thinking` block"), and Claude's fails at DeepSeek. A block of unknown
    # origin (a session saved before the origin was kept) is sent, as it was then.
    signed = ThinkingBlock(thinking="hm", signature="EqQB", origin=origin)
    redacted = RedactedThinkingBlock(data="EmwK", origin=origin)
    history = [
        Message.user("q"),
        Message(role="assistant", content=[signed, redacted, ToolUseBlock(id="t1", name="f", input={})]),
        Message(role="user", content=[ToolResultBlock(tool_use_id="t1", content="done")]),
    ]
    thinking = {"type": "enabled", "budget_tokens": 2000}
    body = build_request(request(*history), model="m", max_tokens=1024, thinking=thinking, origin=ORIGIN)
    sent = [b["type"] for b in body["messages"][1]["content"]]
    if origin == _DEEPSEEK:  # the turn did not think, as far as this server can tell
        assert sent == ["tool_use"] and "thinking" not in body
    else:
        assert sent == ["thinking", "redacted_thinking", "tool_use"] and body["thinking"] == thinking
    assert history[1].content[:2] == [signed, redacted]  # the transcript keeps it


# -- Anthropic's own tools: server tools and Anthropic-defined client tools ----------------

WEB_SEARCH = {"type": "web_search_20250305", "name": "web_search", "max_uses": 3}


class Bash:
    name = "bash"
    description = "Run a shell command"
    input_schema: dict[str, Any] = {"type": "object", "properties": {"command": {"type": "string"}}}  # noqa: RUF012


async def test_extra_tools_are_declared_after_the_engines_tools() -> None:
    # Before, a server tool could only go in extra_body, whose "tools" replaced every tool the
    # engine declared. An Anthropic-defined client tool (bash_20250124) replaces the engine's
    # declaration of the tool of the same name, whose Tool runs it: two tools of one name fail.
    server = MockServer(sse(START, message_delta("end_turn"), STOP))
    bash = {"type": "bash_20250124", "name": "bash"}
    async with server.client() as client:
        model = AnthropicModel("m", api_key=API_KEY, http_client=client, extra_tools=[WEB_SEARCH, bash])
        await collect(model, request(tools=[Tool(), Bash()]))
        assert server.body["tools"] == [
            {"name": "get_weather", "description": "Get the weather", "input_schema": Tool.input_schema},
            WEB_SEARCH,
            bash,
        ]
        await collect(model, request())  # no tool of the engine's: the extra ones alone
        assert server.body["tools"] == [WEB_SEARCH, bash]


async def test_a_stop_reason_that_is_not_a_str_is_a_model_error_not_a_crash() -> None:
    body = sse(
        ("message_start", {"type": "message_start", "message": {"id": "msg_1", "usage": {"input_tokens": 3}}}),
        ("content_block_start", {"type": "content_block_start", "index": 0, "content_block": {"type": "text", "text": ""}}),
        ("content_block_delta", {"type": "content_block_delta", "index": 0, "delta": {"type": "text_delta", "text": "half"}}),
        ("content_block_stop", {"type": "content_block_stop", "index": 0}),
        ("message_delta", {"type": "message_delta", "delta": {"stop_reason": ["end_turn"]}, "usage": {"output_tokens": 2}}),
        ("message_stop", {"type": "message_stop"}),
    )  # fmt: skip
    end, engine = await model_error_run(AnthropicModel, body)
    assert end.error is not None and "stop_reason" in end.error
    assert engine.messages[-1].text == "half" and engine.messages[-1].partial


async def test_a_server_tool_result_nested_past_the_recursion_limit_is_a_model_error_not_a_crash() -> None:
    nested = '{"a":' * 700 + "1" + "}" * 700
    result = (
        '{"type":"content_block_start","index":0,"content_block":{"type":"web_search_tool_result",'
        f'"tool_use_id":"srvtoolu_1","content":{nested}}}}}'
    )
    body = (
        sse(("message_start", {"type": "message_start", "message": {"id": "msg_1", "usage": {"input_tokens": 3}}}))
        + f"event: content_block_start\ndata: {result}\n\n".encode()
        + sse(
            ("content_block_stop", {"type": "content_block_stop", "index": 0}),
            ("message_delta", {"type": "message_delta", "delta": {"stop_reason": "end_turn"}, "usage": {"output_tokens": 2}}),
            ("message_stop", {"type": "message_stop"}),
        )
    )  # fmt: skip
    end, engine = await model_error_run(AnthropicModel, body)
    assert end.error is not None and "nested" in end.error
    assert [m.role for m in engine.messages] == ["user"]  # nothing of the broken response is kept
