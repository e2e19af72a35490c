"""OpenAIChatModel: request building, recorded streams and local-server quirks (WIRE.md §2, §5)."""

from __future__ import annotations

import json
from typing import Any

import httpx
import pytest
from _models_support import API_KEY, MockServer, chat_chunk, chat_stream, collect, load, request, run_fixture

from agentloop import AssistantMessage, QueryEngine, Retrying
from agentloop._errors import PromptTooLongError, ProviderStreamError, StreamProtocolError
from agentloop._messages import Message, TextBlock, ThinkingBlock, ToolResultBlock, ToolUseBlock
from agentloop.models import (
    OpenAIChatModel,
    StreamBlockStop,
    StreamEnd,
    StreamLogprobs,
    StreamThinking,
    StreamToolUseStart,
    Usage,
)


async def run_body(body: bytes, **kw: Any) -> tuple[list[Any], Any]:
    server = MockServer(body)
    async with server.client() as client:
        return await collect(OpenAIChatModel("m", api_key=API_KEY, http_client=client, **kw))


def call(
    index: int, id: str | None = None, name: str | None = None, args: str | None = None
) -> dict[str, Any]:
    fn: dict[str, Any] = {}
    if name is not None:
        fn["name"] = name
    if args is not None:
        fn["arguments"] = args
    out: dict[str, Any] = {"index": index, "function": fn}
    if id is not None:
        out["id"], out["type"] = id, "function"
    return out


USAGE = {
    "id": "chatcmpl-1",
    "choices": [],
    "usage": {"prompt_tokens": 9, "completion_tokens": 2, "total_tokens": 11},
}


# -- recorded streams -----------------------------------------------------------------


async def test_text_fixture() -> None:
    name = "openai_chat_text.recorded.sse"
    events, acc = await run_fixture(name, load(name))
    assert acc.message().text.startswith("I'm unable to provide real-time weather updates.")
    assert acc.stop_reason == "end_turn"
    assert acc.usage == Usage(14, 30)
    assert isinstance(events[-1], StreamEnd)


async def test_single_tool_fixture() -> None:
    _, acc = await run_fixture("openai_chat_tool.recorded.sse", load("openai_chat_tool.recorded.sse"))
    (tool,) = acc.message().tool_uses
    assert (tool.id, tool.name, tool.input) == (
        "call_4XzlGBLtUe9dy3GVNV4jhq7h",
        "get_weather",
        {"city": "New York City"},
    )
    assert acc.stop_reason == "tool_use"
    assert acc.usage == Usage(44, 16)


async def test_parallel_tools_fixture() -> None:
    name = "openai_chat_parallel_tools.recorded.sse"
    _, acc = await run_fixture(name, load(name))
    tools = acc.message().tool_uses
    assert [t.name for t in tools] == ["GetWeatherArgs", "get_stock_price"]
    assert tools[0].input == {"city": "Edinburgh", "country": "GB", "units": "c"}
    assert tools[1].input == {"ticker": "AAPL", "exchange": "NASDAQ"}


async def test_logprobs_fixture() -> None:
    name = "openai_chat_logprobs.recorded.sse"
    events, acc = await run_fixture(name, load(name), logprobs=True)
    assert acc.message().text == "Foo!"
    lps = [e for e in events if isinstance(e, StreamLogprobs)]
    assert [e.logprobs for e in lps] == [(-0.0025094282,), (-0.26638845,)]
    assert all(e.channel == "text" for e in lps)


async def test_logprobs_not_emitted_unless_asked() -> None:
    name = "openai_chat_logprobs.recorded.sse"
    events, _ = await run_fixture(name, load(name))
    assert not any(isinstance(e, StreamLogprobs) for e in events)


async def test_missing_done_is_a_protocol_error() -> None:
    # Without the usage chunk and the finish_reason too: a body that ends cleanly after a
    # finish_reason (servers that send no [DONE]) is complete.
    body = load("openai_chat_text.recorded.sse").replace(b"data: [DONE]\n\n", b"")
    body = body[: body.rindex(b"data: ")]
    body = body[: body.rindex(b"data: ")]
    assert b'"finish_reason":"stop"' not in body and b'"usage"' not in body
    with pytest.raises(StreamProtocolError, match=r"\[DONE\]") as info:
        await run_fixture("openai_chat_text.recorded.sse", body)
    assert info.value.retryable is True


def _cut(name: str, marker: bytes) -> bytes:
    """A recorded stream cut just before the chunk holding ``marker``, then closed with
    ``[DONE]``, as a proxy does that ends a broken upstream stream with its own terminator."""
    body = load(name)
    return body[: body.rindex(b"data: ", 0, body.index(marker))] + b"data: [DONE]\n\n"


@pytest.mark.parametrize(
    ("name", "marker"),
    [
        ("openai_chat_text.recorded.sse", b" weather"),
        ("openai_chat_tool.recorded.sse", b'"\\"}"'),  # the chunk closing the arguments
        ("openai_chat_parallel_tools.recorded.sse", b'"index":1,"id"'),  # cut between two calls
        ("openai_chat_text.recorded.sse", b'"finish_reason":"stop"'),
        ("openai_chat_text.recorded.sse", b'"role":"assistant"'),
    ],
    ids=["mid-text", "mid-arguments", "between-calls", "before-finish", "before-any-output"],
)
async def test_done_without_finish_reason_is_a_retryable_cut(name: str, marker: bytes) -> None:
    body = _cut(name, marker)
    assert b'"finish_reason":"' not in body
    with pytest.raises(StreamProtocolError, match="finish_reason") as info:
        await run_body(body)
    assert info.value.retryable is True


async def test_a_cut_stream_is_retried_not_committed() -> None:
    bodies = [_cut("openai_chat_tool.recorded.sse", b'"\\"}"'), load("openai_chat_tool.recorded.sse")]
    sent: list[httpx.Request] = []

    def handler(req: httpx.Request) -> httpx.Response:
        sent.append(req)
        return httpx.Response(200, headers={"content-type": "text/event-stream"}, content=bodies[len(sent) - 1])

    async with httpx.AsyncClient(transport=httpx.MockTransport(handler)) as client:
        model = OpenAIChatModel("m", api_key=API_KEY, http_client=client)
        engine = QueryEngine(model, policies=[], retry_base_delay=0.001, max_turns=1)
        events = [e async for e in engine.run("weather?")]
    assert len(sent) == 2 and len([e for e in events if isinstance(e, Retrying)]) == 1
    (answer,) = [e.message for e in events if isinstance(e, AssistantMessage)]
    assert answer.tool_uses[0].input == {"city": "New York City"}  # never the cut '{"city":"New York City'


@pytest.mark.parametrize("name", ["openai_chat_text.recorded.sse", "openai_chat_tool.recorded.sse"])
async def test_final_usage_chunk_stands_for_a_missing_finish_reason(name: str) -> None:
    # A server that never fills finish_reason but sends the usage-only chunk (include_usage) has finished.
    body = load(name)
    for finish in (b'"finish_reason":"stop"', b'"finish_reason":"tool_calls"'):
        body = body.replace(finish, b'"finish_reason":null')
    _, whole = await run_body(load(name))
    _, acc = await run_body(body)
    assert (acc.message(), acc.stop_reason, acc.usage) == (whole.message(), whole.stop_reason, whole.usage)


# -- finish reasons ---------------------------------------------------------------------


@pytest.mark.parametrize(
    ("finish", "reason"),
    [
        ("stop", "end_turn"),
        ("length", "max_tokens"),
        ("model_length", "max_tokens"),
        ("content_filter", "refusal"),
        ("tool_calls", "tool_use"),
    ],
)
async def test_finish_reason_mapping(finish: str, reason: str) -> None:
    _, acc = await run_body(chat_stream(chat_chunk({"content": "x"}), chat_chunk(finish=finish)))
    assert acc.stop_reason == reason


@pytest.mark.parametrize(
    ("finish", "reason"),
    [("length", "max_tokens"), ("model_length", "max_tokens"), ("content_filter", "refusal"), ("stop", "tool_use")],
)
async def test_a_tool_call_cut_by_the_token_limit_reports_max_tokens(finish: str, reason: str) -> None:
    # "tool_use" would tell the host the model finished its call; the limit cut its arguments.
    body = chat_stream(chat_chunk({"tool_calls": [call(0, "c1", "write", '{"path": "/tm')]}), chat_chunk(finish=finish))
    _, acc = await run_body(body)
    assert acc.stop_reason == reason


@pytest.mark.parametrize(
    "detail",
    [None, {"code": 502, "message": "Provider disconnected"}],
    ids=["mistral", "openrouter"],
)
async def test_finish_reason_error_is_a_retryable_stream_error(detail: dict[str, Any] | None) -> None:
    # The generation failed midway: the text so far must not pass for a complete answer.
    last = chat_chunk(finish="error")
    if detail is not None:
        last["choices"][0]["error"] = detail
    body = chat_stream(chat_chunk({"content": "The answer is"}), last, USAGE)
    with pytest.raises(ProviderStreamError, match="Provider disconnected" if detail else "finish_reason 'error'") as info:
        await run_body(body)
    assert info.value.retryable is True


async def test_streamed_tool_call_with_finish_stop_is_tool_use() -> None:
    body = chat_stream(chat_chunk({"tool_calls": [call(0, "c1", "f", '{"a":1}')]}), chat_chunk(finish="stop"))
    _, acc = await run_body(body)
    assert acc.stop_reason == "tool_use"
    assert acc.message().tool_uses[0].input == {"a": 1}


async def test_done_without_any_output_is_an_error() -> None:
    with pytest.raises(StreamProtocolError):
        await run_body(chat_stream(USAGE))


# -- local servers ------------------------------------------------------------------


async def test_vllm_repeated_id_in_every_chunk() -> None:
    body = chat_stream(
        chat_chunk({"role": "assistant", "content": ""}),
        chat_chunk({"tool_calls": [call(0, "chatcmpl-tool-A", "f", "")]}),
        chat_chunk({"tool_calls": [call(0, "chatcmpl-tool-A", None, '{"a"')]}),
        chat_chunk({"tool_calls": [call(0, "chatcmpl-tool-B", None, ": 1}")]}),  # a fresh id, same index
        chat_chunk(finish="tool_calls"),
    )
    events, acc = await run_body(body)
    (tool,) = acc.message().tool_uses
    assert (tool.id, tool.input) == ("chatcmpl-tool-A", {"a": 1})
    assert sum(isinstance(e, StreamToolUseStart) for e in events) == 1


@pytest.mark.parametrize("indexed", [True, False])
async def test_gemini_parallel_calls_sent_whole_under_one_index_stay_apart(indexed: bool) -> None:
    # Gemini's OpenAI endpoint sends each parallel call whole, in its own chunk, all
    # with index 0 (or no index at all): they must not merge into one call whose
    # arguments are '{"city":"Paris"}{"city":"Oslo"}'.
    def whole(call_id: str, city: str) -> dict[str, Any]:
        raw = {"index": 0, "id": call_id, "type": "function",
               "function": {"name": "get_weather", "arguments": json.dumps({"city": city})}}  # fmt: skip
        if not indexed:
            del raw["index"]
        return raw

    body = chat_stream(
        chat_chunk({"role": "assistant", "tool_calls": [whole("function-call-1", "Paris")]}),
        chat_chunk({"tool_calls": [whole("function-call-2", "Oslo")]}),
        chat_chunk({"tool_calls": [whole("function-call-3", "Lima")]}, finish="stop"),
    )
    events, acc = await run_body(body)
    calls = [(t.id, t.name, t.input, t.complete) for t in acc.message().tool_uses]
    assert calls == [
        ("function-call-1", "get_weather", {"city": "Paris"}, True),
        ("function-call-2", "get_weather", {"city": "Oslo"}, True),
        ("function-call-3", "get_weather", {"city": "Lima"}, True),
    ]
    assert acc.stop_reason == "tool_use"
    stops = [e.index for e in events if isinstance(e, StreamBlockStop)]
    assert sorted(stops) == [0, 1, 2]


async def test_a_named_fragment_with_a_fresh_id_inside_unfinished_arguments_stays_one_call() -> None:
    body = chat_stream(
        chat_chunk({"tool_calls": [call(0, "chatcmpl-tool-A", "f", '{"a"')]}),
        chat_chunk({"tool_calls": [call(0, "chatcmpl-tool-B", "f", ": 1}")]}),
        chat_chunk(finish="tool_calls"),
    )
    _, acc = await run_body(body)
    (tool,) = acc.message().tool_uses
    assert (tool.id, tool.input) == ("chatcmpl-tool-A", {"a": 1})


async def test_ollama_whole_calls_in_one_chunk_and_reasoning() -> None:
    body = chat_stream(
        chat_chunk({"role": "assistant", "reasoning": "thinking it over"}),
        chat_chunk({"tool_calls": [call(0, "call_a", "f", '{"x": 1}'), call(1, "call_b", "g", '{"y": 2}')]}),
        chat_chunk(finish="stop"),
        USAGE,
    )
    _events, acc = await run_body(body)
    msg = acc.message()
    assert msg.content[0] == ThinkingBlock(thinking="thinking it over", signature="")
    assert [(t.id, t.name, t.input) for t in msg.tool_uses] == [
        ("call_a", "f", {"x": 1}),
        ("call_b", "g", {"y": 2}),
    ]
    assert acc.stop_reason == "tool_use"
    assert acc.usage == Usage(9, 2)


async def test_llama_cpp_reasoning_content_then_text_new_blocks() -> None:
    body = chat_stream(
        chat_chunk({"role": "assistant", "content": None}),
        chat_chunk({"reasoning_content": "step 1"}),
        chat_chunk({"reasoning_content": " step 2"}),
        chat_chunk({"content": "answer"}),
        chat_chunk({"tool_calls": [call(0, "id1", "f", "")]}),
        chat_chunk({"tool_calls": [call(0, None, None, "{}")]}),
        chat_chunk(finish="tool_calls"),
    )
    events, acc = await run_body(body)
    assert [type(b) for b in acc.message().content] == [ThinkingBlock, TextBlock, ToolUseBlock]
    assert acc.message().content[0] == ThinkingBlock(thinking="step 1 step 2", signature="")
    stops = [e.index for e in events if isinstance(e, StreamBlockStop)]
    assert stops == [0, 1, 2]
    assert sum(isinstance(e, StreamThinking) for e in events) == 2


async def test_arguments_before_name_are_buffered_and_missing_id_generated() -> None:
    body = chat_stream(
        chat_chunk({"tool_calls": [{"index": 0, "function": {"arguments": '{"q":'}}]}),
        chat_chunk({"tool_calls": [{"index": 0, "function": {"name": "search", "arguments": '"x"}'}}]}),
        chat_chunk(finish="tool_calls"),
    )
    _, acc = await run_body(body)
    (tool,) = acc.message().tool_uses
    assert tool.name == "search"
    assert tool.input == {"q": "x"}
    assert tool.id.startswith("call_")


async def test_midstream_error_chunk_with_integer_code_vllm() -> None:
    body = chat_stream(
        chat_chunk({"content": "partial"}),
        {"error": {"message": "engine died", "type": "InternalServerError", "param": None, "code": 500}},
    )
    with pytest.raises(ProviderStreamError) as info:
        await run_body(body)
    err = info.value
    assert (err.status, err.error_type, err.retryable) == (200, "InternalServerError", True)
    assert "engine died" in str(err)


async def test_midstream_error_chunk_not_retryable() -> None:
    body = chat_stream({"error": {"message": "grammar failed to parse", "type": "invalid_request_error", "code": 400}})
    with pytest.raises(ProviderStreamError) as info:
        await run_body(body)
    assert info.value.retryable is False


async def test_midstream_llama_cpp_context_overflow_is_prompt_too_long() -> None:
    body = chat_stream({"error": {"code": 400, "type": "exceed_context_size_error",
                                  "message": "request (4476 tokens) exceeds the available context size (4096 tokens)"}})  # fmt: skip
    with pytest.raises(PromptTooLongError, match="exceeds the available context size") as info:
        await run_body(body)
    assert (info.value.status, info.value.retryable) == (200, False)


async def test_llama_cpp_error_field_line_is_an_error() -> None:
    body = b'data: {"choices":[{"index":0,"delta":{"content":"hi"}}]}\n\nerror: {"code":500,"message":"slot failed","type":"server_error"}\n\ndata: [DONE]\n\n'
    with pytest.raises(ProviderStreamError, match="slot failed") as info:
        await run_body(body)
    assert info.value.retryable is True


async def test_error_event_with_non_json_data() -> None:
    with pytest.raises(ProviderStreamError, match="overloaded"):
        await run_body(b"event: error\ndata: overloaded\n\n")


async def test_malformed_chunk_json() -> None:
    with pytest.raises(StreamProtocolError, match="malformed JSON"):
        await run_body(b"data: {oops\n\n")


async def test_usage_chunk_with_empty_choices_and_cached_tokens() -> None:
    usage = {"choices": [], "usage": {"prompt_tokens": 100, "completion_tokens": 5,
                                      "prompt_tokens_details": {"cached_tokens": 64}}}  # fmt: skip
    _, acc = await run_body(chat_stream(chat_chunk({"content": "x"}, finish="stop"), usage))
    assert acc.usage == Usage(100, 5, 64)


async def test_azure_content_filter_chunks_are_ignored_and_do_not_blank_the_response_id() -> None:
    # Azure OpenAI: a first chunk with no choices, "id": "" and the prompt's filter results; the
    # choices carry content_filter_results; with the async filter, a last chunk with no delta.
    filters = {"hate": {"filtered": False, "severity": "safe"}}
    prompt_filter = {"choices": [], "created": 0, "id": "", "model": "", "object": "",
                     "prompt_filter_results": [{"prompt_index": 0, "content_filter_results": filters}]}  # fmt: skip

    def chunk(delta: dict[str, Any] | None, finish: str | None = None) -> dict[str, Any]:
        choice = {"index": 0, "finish_reason": finish, "content_filter_results": filters}
        if delta is not None:
            choice["delta"] = delta
        return {"id": "chatcmpl-AZ1", "object": "chat.completion.chunk", "choices": [choice]}

    async_filter = {"id": "", "object": "", "created": 0, "model": "", "choices": [
        {"index": 0, "finish_reason": None, "content_filter_results": filters,
         "content_filter_offsets": {"check_offset": 3, "start_offset": 3, "end_offset": 9}}]}  # fmt: skip
    body = chat_stream(prompt_filter, chunk({"role": "assistant", "content": "Hi"}), chunk({"content": None}),
                       chunk({}, "stop"), async_filter, {**USAGE, "id": "chatcmpl-AZ1"})  # fmt: skip
    events, acc = await run_body(body)
    assert acc.message().text == "Hi"
    assert acc.stop_reason == "end_turn"
    assert acc.response_id == "chatcmpl-AZ1"
    assert isinstance(events[-1], StreamEnd) and events[-1].response_id == "chatcmpl-AZ1"


async def test_refusal_delta_is_text_and_refusal() -> None:
    _, acc = await run_body(chat_stream(chat_chunk({"refusal": "I can't"}), chat_chunk(finish="stop")))
    assert acc.message().text == "I can't"
    assert acc.stop_reason == "refusal"


# -- request --------------------------------------------------------------------------


class Tool:
    name = "f"
    description = "does f"
    input_schema: dict[str, Any] = {"type": "object"}  # noqa: RUF012


async def test_request_shape() -> None:
    server = MockServer(chat_stream(chat_chunk({"content": "x"}, finish="stop")))
    history = [
        Message.user("go"),
        Message(role="assistant", content=[
            ThinkingBlock(thinking="t", signature="s"), TextBlock(text="calling"),
            ToolUseBlock(id="c1", name="f", input={"a": 1}), ToolUseBlock(id="c2", name="f", input={}),
        ]),
        Message(role="user", content=[
            TextBlock(text="and then?"), ToolResultBlock(tool_use_id="c1", content="ok"),
            ToolResultBlock(tool_use_id="c2", content="boom", is_error=True),
        ]),
        Message(role="assistant", content=[ThinkingBlock(thinking="only thinking", signature="s")]),
    ]  # fmt: skip
    async with server.client() as client:
        model = OpenAIChatModel("gpt-x", api_key=API_KEY, http_client=client, logprobs=True, top_logprobs=3,
                                extra_body={"temperature": 0})  # fmt: skip
        await collect(
            model, request(*history, system="sys", tools=[Tool()], tool_choice="any", max_tokens=64)
        )
    req = server.requests[0]
    assert req.url == "https://api.openai.com/v1/chat/completions"
    assert req.headers["authorization"] == f"Bearer {API_KEY}"
    body = server.body
    assert body["stream"] is True
    assert body["stream_options"] == {"include_usage": True}
    assert (body["logprobs"], body["top_logprobs"], body["temperature"]) == (True, 3, 0)
    assert body["max_completion_tokens"] == 64
    assert body["tool_choice"] == "required"
    assert body["tools"] == [
        {
            "type": "function",
            "function": {"name": "f", "description": "does f", "parameters": {"type": "object"}},
        }
    ]
    assert body["messages"] == [
        {"role": "system", "content": "sys"},
        {"role": "user", "content": "go"},
        {"role": "assistant", "content": "calling", "tool_calls": [
            {"id": "c1", "type": "function", "function": {"name": "f", "arguments": '{"a": 1}'}},
            {"id": "c2", "type": "function", "function": {"name": "f", "arguments": "{}"}},
        ]},
        {"role": "tool", "tool_call_id": "c1", "content": "ok"},
        {"role": "tool", "tool_call_id": "c2", "content": "Error: boom"},
        {"role": "user", "content": "and then?"},
    ]  # fmt: skip


@pytest.mark.parametrize(
    ("choice", "wire"),
    [
        ("auto", "auto"),
        ("none", "none"),
        ("any", "required"),
        ("required", "required"),  # its own word: never taken for a tool's name
        ("f", {"type": "function", "function": {"name": "f"}}),
    ],
)
async def test_tool_choice(choice: str, wire: Any) -> None:
    server = MockServer(chat_stream(chat_chunk({"content": "x"}, finish="stop")))
    async with server.client() as client:
        await collect(OpenAIChatModel("m", api_key=API_KEY, http_client=client), request(tool_choice=choice))
    assert server.body["tool_choice"] == wire


async def test_local_server_without_key(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("OPENAI_API_KEY", raising=False)
    server = MockServer(chat_stream(chat_chunk({"content": "x"}, finish="stop")))
    async with server.client() as client:
        model = OpenAIChatModel("llama", base_url="http://localhost:8080/v1", http_client=client,
                                max_tokens_param="max_tokens", include_usage=False)  # fmt: skip
        _, acc = await collect(model, request(max_tokens=10))
    req = server.requests[0]
    assert req.url == "http://localhost:8080/v1/chat/completions"
    assert "authorization" not in req.headers
    assert server.body["max_tokens"] == 10
    assert "stream_options" not in server.body
    assert acc.message().text == "x"


# -- content and arguments in other shapes ----------------------------------------------


async def test_mistral_content_as_a_list_of_thinking_and_text_chunks() -> None:
    # Magistral streams delta.content as typed chunks: thinking first, then text.
    def thinking(t: str) -> dict[str, Any]:
        return {"content": [{"type": "thinking", "thinking": [{"type": "text", "text": t}]}]}

    body = chat_stream(
        chat_chunk({"role": "assistant", "content": ""}),
        chat_chunk(thinking("It's a greeting")),
        chat_chunk(thinking(", I should greet back.")),
        chat_chunk({"content": [{"type": "text", "text": "Hello"}]}),
        chat_chunk({"content": "!"}),
        chat_chunk({"content": [{"type": "image_url", "image_url": "x"}]}),
        chat_chunk(finish="stop"),
    )
    _, acc = await run_body(body)
    assert acc.message().content == [
        ThinkingBlock(thinking="It's a greeting, I should greet back.", signature=""),
        TextBlock(text="Hello!"),
    ]
    assert acc.stop_reason == "end_turn"


async def test_arguments_sent_as_an_object_are_the_input() -> None:
    body = chat_stream(
        chat_chunk({"tool_calls": [{"index": 0, "id": "c1", "function": {"name": "f", "arguments": {"a": [1, 2]}}}]}),
        chat_chunk(finish="tool_calls"),
    )
    _, acc = await run_body(body)
    (tool,) = acc.message().tool_uses
    assert (tool.id, tool.input, tool.complete) == ("c1", {"a": [1, 2]}, True)


# -- vLLM's finish_reason "abort" ------------------------------------------------------


@pytest.mark.parametrize(
    "before",
    [
        [chat_chunk({"role": "assistant", "content": "The answer is"})],
        [chat_chunk({"tool_calls": [call(0, "c1", "f", '{"path": "/tm')]})],
        [],
    ],
    ids=["text", "tool-call", "nothing"],
)
@pytest.mark.parametrize("usage", [True, False])
async def test_finish_reason_abort_is_a_retryable_stream_error(before: list[dict[str, Any]], usage: bool) -> None:
    # vLLM ends a request its server aborted with finish_reason "abort": what streamed is cut,
    # like a dropped connection, and must not pass for a finished answer (or a finished call).
    chunks: list[dict[str, Any]] = [*before, chat_chunk(finish="abort")]
    if usage:
        chunks.append(USAGE)
    with pytest.raises(StreamProtocolError, match="abort") as info:
        await run_body(chat_stream(*chunks))
    assert not isinstance(info.value, ProviderStreamError)
    assert info.value.retryable is True


async def test_the_engine_retries_an_aborted_vllm_response() -> None:
    bodies = [
        chat_stream(chat_chunk({"content": "The answer"}), chat_chunk(finish="abort"), USAGE),
        chat_stream(chat_chunk({"content": "The answer is 4."}), chat_chunk(finish="stop"), USAGE),
    ]
    sent: list[int] = []

    def handler(request: httpx.Request) -> httpx.Response:
        sent.append(1)
        return httpx.Response(200, headers={"content-type": "text/event-stream"}, content=bodies[len(sent) - 1])

    async with httpx.AsyncClient(transport=httpx.MockTransport(handler)) as client:
        model = OpenAIChatModel("m", base_url="http://vllm.local/v1", http_client=client)
        engine = QueryEngine(model, policies=[], retry_base_delay=0.001)
        events = [e async for e in engine.run("2 + 2?")]
    assert len(sent) == 2 and len([e for e in events if isinstance(e, Retrying)]) == 1
    (answer,) = [e.message for e in events if isinstance(e, AssistantMessage)]
    assert answer.text == "The answer is 4."


@pytest.mark.parametrize(
    ("usage", "expected"),
    [
        ({"prompt_tokens": "12", "completion_tokens": 7.0, "prompt_tokens_details": {"cached_tokens": [3]}}, Usage(0, 7, 0)),
        ({"prompt_tokens": 5, "completion_tokens": None, "prompt_tokens_details": "none"}, Usage(5, 0, 0)),
        ("12 tokens", Usage()),
    ],
)
async def test_token_counts_that_are_not_numbers_are_left_out_of_the_usage(usage: Any, expected: Usage) -> None:
    # A str would pass into Usage and make the run's usage sum raise TypeError, out of run().
    _, acc = await run_body(chat_stream(chat_chunk({"content": "x"}, finish="stop"), {"choices": [], "usage": usage}))
    assert acc.usage == expected
    assert all(type(n) is int for n in (acc.usage.input_tokens, acc.usage.output_tokens, acc.usage.cache_read_tokens))
    assert acc.message().text == "x"


async def test_an_error_object_with_neither_type_nor_code_says_none_of_either() -> None:
    body = chat_stream(chat_chunk({"content": "x"}), {"error": {"message": "the upstream went away"}})
    with pytest.raises(ProviderStreamError) as caught:
        await run_body(body)
    assert str(caught.value).startswith("openai chat stream error: the upstream went away")
    assert "None" not in str(caught.value)


def _choice(index: int, delta: dict[str, Any], finish: str | None = None) -> dict[str, Any]:
    return {"index": index, "delta": delta, "finish_reason": finish}


async def test_a_second_choice_is_not_mixed_into_the_first() -> None:
    # A server that answers with several choices (n > 1, or a gateway fanning out) interleaves
    # them, each chunk naming its choice's index: only the first choice is the answer.
    body = chat_stream(
        {"id": "c", "choices": [_choice(0, {"content": "The answer"}), _choice(1, {"content": "Another"})]},
        {"id": "c", "choices": [_choice(1, {"content": " one", "tool_calls": [call(0, "call_9", "search", "{}")]})]},
        {"id": "c", "choices": [_choice(0, {"content": " is 4."})]},
        {"id": "c", "choices": [_choice(1, {}, "tool_calls")]},
        {"id": "c", "choices": [_choice(0, {}, "stop")]},
    )
    _, acc = await run_body(body)
    assert acc.message().model_dump()["content"] == [{"type": "text", "text": "The answer is 4."}]
    assert acc.stop_reason == "end_turn"


async def test_the_finish_of_a_second_choice_does_not_finish_the_first() -> None:
    body = chat_stream(
        {"id": "c", "choices": [_choice(0, {"content": "The answer"})]},
        {"id": "c", "choices": [_choice(1, {"content": "x"}, "stop")]},
    )  # [DONE] right after: the first choice was cut
    with pytest.raises(StreamProtocolError, match="finish_reason"):
        await run_body(body)


async def test_a_tool_call_that_never_names_its_tool_is_kept_and_answered_not_dropped() -> None:
    # Its arguments came, its name never did: dropped, the turn would end as if the model had
    # called nothing. Kept with no name, it is answered with an error the model can act on.
    body = chat_stream(
        chat_chunk({"content": "Checking."}),
        chat_chunk({"tool_calls": [call(0, "call_1", None, '{"city": "Paris"}')]}),
        chat_chunk(finish="tool_calls"),
    )
    _, acc = await run_body(body)
    assert acc.stop_reason == "tool_use"
    (use,) = acc.committable().tool_uses
    assert (use.id, use.name, use.input, use.input_error) == ("call_1", "", {"city": "Paris"}, None)
    bodies = [body, chat_stream(chat_chunk({"content": "Sorry."}), chat_chunk(finish="stop"))]
    requests: list[httpx.Request] = []

    def handler(request: httpx.Request) -> httpx.Response:
        requests.append(request)
        return httpx.Response(200, headers={"content-type": "text/event-stream"}, content=bodies[len(requests) - 1])

    async with httpx.AsyncClient(transport=httpx.MockTransport(handler)) as client:
        engine = QueryEngine(OpenAIChatModel("m", api_key=API_KEY, http_client=client), policies=[])
        [e async for e in engine.run("weather?")]
    (result,) = engine.messages[2].tool_results
    assert result.tool_use_id == "call_1" and result.is_error and "Unknown tool" in str(result.content)
    assert len(requests) == 2


async def test_a_delta_after_finish_reason_is_added_to_the_answer(caplog: pytest.LogCaptureFixture) -> None:
    # Output after a finish_reason means it was not final (gateways put "stop" on chunks that
    # go on): the text and the call are kept, as the official SDK's accumulator keeps them.
    body = chat_stream(
        chat_chunk({"role": "assistant", "content": "Hello"}),
        chat_chunk({}, finish="stop"),
        chat_chunk({"content": " and more"}),
        chat_chunk({"tool_calls": [call(0, "c1", "late", "{}")]}),
        chat_chunk({"content": " again"}),
    )
    with caplog.at_level("WARNING", logger="agentloop"):
        _, acc = await run_body(body)
    message = acc.message()
    assert message.text == "Hello and more again" and [u.name for u in message.tool_uses] == ["late"]
    assert acc.stop_reason == "tool_use"
    assert [r for r in caplog.records if r.levelname == "WARNING"] == []
