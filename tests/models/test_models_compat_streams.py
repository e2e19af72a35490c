"""The providers against the streams of OpenAI- and Anthropic-compatible servers and proxies, each
deviation from the official API fed as the server sends it (an ``httpx.MockTransport``):

- OpenRouter keeps the connection alive with SSE comments (``: OPENROUTER PROCESSING``); some
  servers write ``data:`` with no space, end lines with CRLF, or close the body after the
  ``finish_reason`` with no ``data: [DONE]`` (ik_llama.cpp, older TGI and mistral.rs).
- Tool calls: all at ``index`` 0 (or with none) with ids of their own (Gemini's endpoint and
  gateways in front of it); the id and name repeated on every chunk, or ``""`` on later ones
  (vLLM; Qwen on DashScope, deepchat #355); ``arguments`` whole in one chunk, or an object.
- Arguments resent: DeepSeek and Baidu Qianfan in cumulative mode send the arguments so far on
  every chunk instead of the new piece (NousResearch/hermes-agent PR #35718); GLM-style local
  servers send the whole arguments again on the last chunk (anomalyco/opencode PR #17339).
- ``finish_reason: "tool_calls"`` with no call, ``"stop"`` after calls; usage on every chunk
  (vLLM's ``continuous_usage_stats``) or on a ``choices: []`` chunk; ``null`` deltas;
  ``reasoning`` beside ``reasoning_content`` (vLLM sends both names while renaming the field).
- An error sent in the body after the 200 (``data: {"error": {...}}``, then ``[DONE]``: vLLM,
  LiteLLM, OpenRouter).
- Anthropic-compatible gateways that end the body after the ``message_delta`` with the stop
  reason, with no ``message_stop`` (esengine/DeepSeek-Reasonix PR #8756), as the Chat servers
  that send no ``[DONE]`` do.
- Anthropic proxies: no ``ping``, no ``message_start.usage``, ``data:`` lines without ``event:``
  lines, an ``error`` event mid-stream, and a failure written as ``data: {"error": {...}}`` with
  neither an ``event:`` line nor a ``type`` (LiteLLM's ``/v1/messages`` before BerriAI/litellm
  PR #41826, "sends an error Anthropic clients cannot read").
"""

from __future__ import annotations

import json
import tracemalloc
from collections.abc import AsyncIterator, Iterator
from typing import Any

import httpx
import pytest
from _models_support import API_KEY, MockServer, RecordingStream, chat_chunk, chat_stream, collect, sse
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st

from agentloop import QueryEngine, tool, validate_transcript
from agentloop._accumulate import Accumulator
from agentloop._errors import ProviderConnectionError, ProviderStreamError, StreamProtocolError
from agentloop.models import AnthropicModel, OpenAIChatModel
from agentloop.models._sse import ServerSentEvent
from agentloop.models.openai_chat._stream import ChatMapper


async def run_chat(body: bytes) -> tuple[list[Any], Any]:
    server = MockServer(body)
    async with server.client() as client:
        return await collect(OpenAIChatModel("m", api_key=API_KEY, http_client=client))


async def run_anthropic(body: bytes) -> tuple[list[Any], Any]:
    server = MockServer(body)
    async with server.client() as client:
        return await collect(AnthropicModel("claude-x", api_key=API_KEY, http_client=client))


def call(index: int | None, id: str | None = None, name: str | None = None, args: Any = None) -> dict[str, Any]:
    """One tool-call delta; a None ``index``, id, name or args is left out."""
    out: dict[str, Any] = {"type": "function", "function": {}}
    if index is not None:
        out["index"] = index
    if id is not None:
        out["id"] = id
    if name is not None:
        out["function"]["name"] = name
    if args is not None:
        out["function"]["arguments"] = args
    return out


def calls(*deltas: dict[str, Any]) -> dict[str, Any]:
    return chat_chunk({"tool_calls": list(deltas)})


def inputs(acc: Any) -> list[tuple[str, str, Any, str | None]]:
    return [(c.id, c.name, c.input, c.input_error) for c in acc.message().tool_uses]


# -- SSE framing -------------------------------------------------------------------------------


async def test_comments_data_without_a_space_crlf_and_no_done_are_read_as_the_answer() -> None:
    lines = [": OPENROUTER PROCESSING", "", f"data:{json.dumps(chat_chunk({'content': 'Hi'}))}", "",
             ": OPENROUTER PROCESSING", "", f"data:{json.dumps(chat_chunk({}, 'stop'))}", "", ""]  # fmt: skip
    _, acc = await run_chat("\r\n".join(lines).encode())
    assert (acc.message().text, acc.stop_reason) == ("Hi", "end_turn")


# -- tool calls --------------------------------------------------------------------------------


@pytest.mark.parametrize("index", [0, None], ids=["index-0", "no-index"])
async def test_calls_of_one_index_with_ids_of_their_own_stay_apart(index: int | None) -> None:
    body = chat_stream(
        calls(call(index, "a", "f", '{"x":')), calls(call(index, args="1}")),
        calls(call(index, "b", "g", '{"y": 2}')), chat_chunk({}, "tool_calls"),
    )
    _, acc = await run_chat(body)
    assert inputs(acc) == [("a", "f", {"x": 1}, None), ("b", "g", {"y": 2}, None)]


async def test_an_id_and_name_repeated_or_emptied_on_later_chunks_keep_one_call() -> None:
    body = chat_stream(
        calls(call(0, "a", "f", "")), calls(call(0, "a", "f", '{"x":')), calls(call(0, "", "", "1}")),
        chat_chunk({}, "tool_calls"),
    )
    _, acc = await run_chat(body)
    assert inputs(acc) == [("a", "f", {"x": 1}, None)]


@pytest.mark.parametrize(
    "pieces",
    [
        ['{"path": "a', '{"path": "a.txt"', '{"path": "a.txt", "n": 2}'],  # the arguments so far, each time
        ['{"path": "a', '{"path": "a.txt"', '{"path": "a.txt"', '{"path": "a.txt", "n": 2}'],  # one adds nothing
        ['{"path": ', '"a.txt", "n": 2}', '{"path": "a.txt", "n": 2}'],  # pieces, then all of it again
        ['{"path": "a.txt", "n": 2}', '{"path": "a.txt", "n": 2}'],  # whole, then whole again
        ['{"path": "a', '{"path": "a.txt", "n": 2}'],  # all so far, twice: told at the end
        ['{"path": "a', '{"path": "a', '{"path": "a.txt", "n": 2}'],  # a repeat before the resend shows
    ],
    ids=["cumulative", "cumulative-repeat", "pieces-then-whole", "whole-twice", "cumulative-two", "repeat-first"],
)
async def test_arguments_resent_whole_or_so_far_are_the_calls_input_once(pieces: list[str]) -> None:
    body = chat_stream(
        calls(call(0, "a", "read", pieces[0])), *(calls(call(0, args=p)) for p in pieces[1:]),
        chat_chunk({}, "tool_calls"),
    )
    _, acc = await run_chat(body)
    assert inputs(acc) == [("a", "read", {"path": "a.txt", "n": 2}, None)]


@pytest.mark.parametrize(
    "pieces",
    [
        ['{"a": ', '{"b": 1}}'],  # a nested object
        ['{"code": "', '{\\"code\\": 1}"}'],  # JSON inside a string
        ['{"k": ', '"v"', ', "k2": ', '"v"}'],  # a piece that repeats an earlier piece
    ],
)
async def test_arguments_in_ordinary_pieces_are_joined_as_they_came(pieces: list[str]) -> None:
    body = chat_stream(
        calls(call(0, "a", "f", pieces[0])), *(calls(call(0, args=p)) for p in pieces[1:]),
        chat_chunk({}, "tool_calls"),
    )
    _, acc = await run_chat(body)
    assert inputs(acc) == [("a", "f", json.loads("".join(pieces)), None)]


async def test_two_calls_in_one_chunk_at_index_0_stay_apart() -> None:
    body = chat_stream(calls(call(0, "a", "f", '{"x": 1}'), call(0, "b", "g", '{"y": 2}')), chat_chunk({}, "tool_calls"))
    _, acc = await run_chat(body)
    assert inputs(acc) == [("a", "f", {"x": 1}, None), ("b", "g", {"y": 2}, None)]


@tool
async def echo(x: int = 0) -> str:
    """Say x."""
    return f"x={x}"


async def engine_run(*bodies: bytes) -> QueryEngine:
    replies = iter(bodies)

    def handler(request: httpx.Request) -> httpx.Response:
        stream = RecordingStream([next(replies)])
        return httpx.Response(200, headers={"content-type": "text/event-stream"}, stream=stream)

    async with httpx.AsyncClient(transport=httpx.MockTransport(handler)) as client:
        engine = QueryEngine(OpenAIChatModel("m", api_key=API_KEY, http_client=client), tools=[echo])
        ended = [e async for e in engine.run("hi") if e.type == "turn_ended"]
    assert [e.reason for e in ended] == ["completed"]
    assert validate_transcript(engine.messages) == []
    return engine


async def test_finish_reason_tool_calls_without_a_call_ends_the_turn_with_its_text() -> None:
    engine = await engine_run(chat_stream(chat_chunk({"content": "Done."}), chat_chunk({}, "tool_calls")))
    assert engine.messages[-1].text == "Done."


async def test_two_calls_with_one_id_are_both_run_and_answered_each() -> None:
    first = chat_stream(
        calls(call(0, "call_0", "echo", '{"x": 1}')), calls(call(1, "call_0", "echo", '{"x": 2}')),
        chat_chunk({}, "stop"),
    )
    engine = await engine_run(first, chat_stream(chat_chunk({"content": "ok"}), chat_chunk({}, "stop")))
    results = [r.text for r in engine.messages[2].tool_results]
    assert results == ["x=1", "x=2"]


# -- text, reasoning, usage --------------------------------------------------------------------


async def test_null_deltas_and_both_reasoning_names_give_each_piece_once() -> None:
    body = chat_stream(
        chat_chunk({"role": "assistant", "content": None, "tool_calls": None}),
        chat_chunk({"reasoning": "Let me see.", "reasoning_content": "Let me see.", "content": None}),
        chat_chunk({"reasoning": None, "reasoning_content": None, "content": "Four."}),
        chat_chunk({}, "stop"),
    )
    _, acc = await run_chat(body)
    assert acc.thinking_text() == "Let me see."  # once, not once per name
    assert acc.message().text == "Four."  # and never in the answer


async def test_usage_on_every_chunk_is_the_last_count_not_a_sum() -> None:
    def used(n: int) -> dict[str, int]:
        return {"prompt_tokens": 7, "completion_tokens": n, "total_tokens": 7 + n}

    body = chat_stream(
        chat_chunk({"content": "a"}, usage=used(1)), chat_chunk({"content": "b"}, usage=used(2)),
        chat_chunk({}, "stop", usage=used(2)), {"id": "chatcmpl-1", "choices": [], "usage": used(2)},
    )
    _, acc = await run_chat(body)
    assert (acc.usage.input_tokens, acc.usage.output_tokens, acc.message().text) == (7, 2, "ab")


async def test_an_error_chunk_after_the_200_then_done_is_the_servers_error() -> None:
    body = chat_stream(chat_chunk({"content": "Par"}), {"error": {"message": "Internal Server Error", "code": 500}})
    with pytest.raises(ProviderStreamError, match="Internal Server Error") as info:
        await run_chat(body)
    assert info.value.retryable


# -- Anthropic proxies -------------------------------------------------------------------------


def anthropic_events(*events: dict[str, Any], named: bool = True) -> bytes:
    return sse(*((e["type"] if named else None, e) for e in events))


MESSAGE = {"type": "message_start", "message": {"id": "msg_1", "type": "message", "role": "assistant", "content": []}}
TEXT = [
    {"type": "content_block_start", "index": 0, "content_block": {"type": "text", "text": ""}},
    {"type": "content_block_delta", "index": 0, "delta": {"type": "text_delta", "text": "Hi"}},
]


@pytest.mark.parametrize("named", [True, False], ids=["event-lines", "no-event-lines"])
async def test_an_anthropic_proxy_without_ping_or_start_usage_is_read(named: bool) -> None:
    body = anthropic_events(
        MESSAGE, *TEXT, {"type": "content_block_stop", "index": 0},
        {"type": "message_delta", "delta": {"stop_reason": "end_turn"}, "usage": {"output_tokens": 3}},
        {"type": "message_stop"}, named=named,
    )
    _, acc = await run_anthropic(body)
    assert (acc.message().text, acc.stop_reason, acc.usage.output_tokens) == ("Hi", "end_turn", 3)


@pytest.mark.parametrize(
    ("error", "retryable"),
    [({"type": "overloaded_error", "message": "Overloaded"}, True),
     ({"type": "invalid_request_error", "message": "Overloaded"}, False)],
)
async def test_an_anthropic_error_event_mid_stream_is_the_servers_error(error: dict[str, Any], retryable: bool) -> None:
    body = anthropic_events(MESSAGE, *TEXT, {"type": "error", "error": error})
    with pytest.raises(ProviderStreamError, match="Overloaded") as info:
        await run_anthropic(body)
    assert info.value.retryable is retryable


@pytest.mark.parametrize(
    ("error", "retryable"),
    [({"type": "api_error", "message": "upstream reset"}, True),
     ({"message": "upstream reset", "type": "None", "code": "503"}, True),
     ({"message": "upstream reset", "type": "invalid_request_error", "code": "400"}, False),
     ({"message": "upstream reset", "type": "authentication_error", "code": "500"}, False),  # the type says
     ({"message": "upstream reset", "code": 503}, True),  # no type: the code says
     ("upstream reset", False)],
)
@pytest.mark.parametrize("event", [None, "message"], ids=["no-event-line", "event-message"])
async def test_a_proxys_error_as_bare_data_is_the_servers_error_not_a_cut_stream(
    error: Any, retryable: bool, event: str | None
) -> None:
    # ``event: message`` is SSE's default name, as good as no event line.
    body = anthropic_events(MESSAGE, *TEXT) + sse((event, {"error": error}))
    with pytest.raises(ProviderStreamError, match="upstream reset") as info:
        await run_anthropic(body)
    assert info.value.retryable is retryable


END_TURN = [
    {"type": "content_block_stop", "index": 0},
    {"type": "message_delta", "delta": {"stop_reason": "end_turn"}, "usage": {"output_tokens": 3}},
]


async def test_an_anthropic_body_that_ends_cleanly_after_the_stop_reason_is_the_whole_answer() -> None:
    _, acc = await run_anthropic(anthropic_events(MESSAGE, *TEXT, *END_TURN))
    assert (acc.message().text, acc.stop_reason, acc.usage.output_tokens) == ("Hi", "end_turn", 3)


async def test_an_anthropic_tool_call_whose_body_ends_after_the_stop_reason_runs() -> None:
    start = {"type": "content_block_start", "index": 0,
             "content_block": {"type": "tool_use", "id": "toolu_1", "name": "f", "input": {}}}  # fmt: skip
    piece = {"type": "content_block_delta", "index": 0, "delta": {"type": "input_json_delta", "partial_json": '{"x": 1}'}}
    stop = {"type": "message_delta", "delta": {"stop_reason": "tool_use"}, "usage": {"output_tokens": 9}}
    _, acc = await run_anthropic(anthropic_events(MESSAGE, start, piece, END_TURN[0], stop))
    assert (inputs(acc), acc.stop_reason) == ([("toolu_1", "f", {"x": 1}, None)], "tool_use")


@pytest.mark.parametrize("upto", [1, 2, 3], ids=["after-start", "mid-text", "after-block-stop"])
async def test_an_anthropic_body_that_ends_before_the_stop_reason_is_still_cut(upto: int) -> None:
    events = [MESSAGE, *TEXT, END_TURN[0]][: upto + 1]
    with pytest.raises(StreamProtocolError, match="without message_stop") as info:
        await run_anthropic(anthropic_events(*events))
    assert info.value.retryable


class _Resets(httpx.AsyncByteStream):
    """A body that breaks after ``chunk``, as a reset connection does."""

    def __init__(self, chunk: bytes) -> None:
        self.chunk = chunk

    async def __aiter__(self) -> AsyncIterator[bytes]:
        yield self.chunk
        raise httpx.ReadError("connection reset by peer")


async def test_an_anthropic_connection_that_breaks_after_the_stop_reason_is_still_cut() -> None:
    body = anthropic_events(MESSAGE, *TEXT, *END_TURN)

    def handler(request: httpx.Request) -> httpx.Response:
        return httpx.Response(200, headers={"content-type": "text/event-stream"}, stream=_Resets(body))

    async with httpx.AsyncClient(transport=httpx.MockTransport(handler)) as client:
        with pytest.raises(ProviderConnectionError) as info:
            await collect(AnthropicModel("claude-x", api_key=API_KEY, http_client=client))
    assert info.value.retryable


async def test_the_last_content_and_arguments_on_the_finish_chunk_are_kept() -> None:
    # vLLM before PR #36944, Mistral, SGLang: the last tokens ride on the finish_reason chunk.
    text = chat_stream(chat_chunk({"content": "Hel"}), chat_chunk({"content": "lo."}, "stop"))
    _, acc = await run_chat(text)
    assert (acc.message().text, acc.stop_reason) == ("Hello.", "end_turn")
    tail = chat_stream(calls(call(0, "a", "f", '{"x": ')), chat_chunk({"tool_calls": [call(0, args="1}")]}, "tool_calls"))
    _, acc = await run_chat(tail)
    assert inputs(acc) == [("a", "f", {"x": 1}, None)]


_JSON = st.recursive(
    st.none() | st.booleans() | st.integers(-9, 99) | st.sampled_from(["", "a", '{"a": ', "{", '"}', '{"a": 1}']),
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.sampled_from(["a", "b"]), inner, max_size=2),
    max_leaves=8,
)
_DEEP = {"a": {"a": {"a": {"a": {"a": 1}}}}}


def shown_and_recorded(events: list[Any], acc: Any) -> list[tuple[str, str]]:
    """Per tool call: the input text the host was shown, piece by piece, and the one recorded."""
    blocks = acc.blocks()
    return [("".join(e.partial_json for e in events if type(e).__name__ == "StreamToolInput" and e.index == i),
             "".join(part.chunks)) for i, part in blocks.items() if part.kind == "tool_use"]  # fmt: skip


@st.composite
def parallel_streams(draw: st.DrawFn) -> tuple[list[dict[str, Any]], list[str]]:
    """Several calls at distinct indexes, each of any JSON value cut in any pieces, their pieces
    interleaved across chunks as they came; and each call's arguments."""
    texts = [json.dumps(v) for v in draw(st.lists(_JSON, min_size=1, max_size=3))]
    queues: list[list[dict[str, Any]]] = []
    for k, text in enumerate(texts):
        cuts = draw(st.lists(st.integers(1, 80), max_size=5))
        ends = sorted({c for c in cuts if c < len(text)} | {len(text)})
        pieces = [text[a:b] for a, b in zip([0, *ends], ends, strict=False)]
        queues.append([call(k, f"c{k}", "f", pieces[0]), *(call(k, args=p) for p in pieces[1:])])
    chunks = []
    while any(queues):
        live = [q for q in queues if q]
        picked = draw(st.lists(st.sampled_from(range(len(live))), min_size=1, max_size=len(live), unique=True))
        chunks.append(calls(*(live[i].pop(0) for i in picked)))
    return chunks, texts


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(value=_JSON, cuts=st.lists(st.integers(1, 80), max_size=6), then=st.booleans())
@example(value=_DEEP, cuts=[6, 18], then=False)  # pieces that each start with all before them
@example(value={"a": {"a": 1}}, cuts=[6], then=True)  # so, and the next call at the same index
@example(value={"a": '{"a": '}, cuts=[9], then=False)
async def test_any_json_value_in_any_pieces_is_recorded_as_it_came(value: Any, cuts: list[int], then: bool) -> None:
    # The reading of resent arguments never changes a stream whose pieces are each new, whatever
    # they repeat (a nested object that starts as its parent, JSON inside a string): the joined
    # pieces are valid JSON, and that is the call's input. Followed by another call at index 0
    # (Gemini's parallel calls), after arguments that are an object, the two stay apart.
    text = json.dumps(value)
    then = then and isinstance(value, dict)
    ends = sorted({c for c in cuts if c < len(text)} | {len(text)})
    pieces = [text[a:b] for a, b in zip([0, *ends], ends, strict=False)]
    following = [calls(call(0, "b", "g", '{"y": 2}'))] if then else []
    body = chat_stream(
        calls(call(0, "a", "f", pieces[0])), *(calls(call(0, args=p)) for p in pieces[1:]), *following,
        chat_chunk({}, "tool_calls"),
    )
    events, acc = await run_chat(body)
    assert shown_and_recorded(events, acc) == [(text, text)] + ([('{"y": 2}', '{"y": 2}')] if then else [])
    if isinstance(value, dict):
        assert inputs(acc)[0] == ("a", "f", value, None)


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(stream=parallel_streams(), finish=st.sampled_from(["tool_calls", "stop", "length"]))
@example(stream=([calls(call(0, "c0", "f", '{"a": '), call(1, "c1", "f", '{"a": ')),
                  calls(call(1, args='{"a": 1}}')), calls(call(0, args='{"a": 1}}'))], ['{"a": {"a": 1}}'] * 2),
         finish="tool_calls")  # fmt: skip
async def test_parallel_calls_in_any_pieces_interleaved_are_each_recorded_as_they_came(
    stream: tuple[list[dict[str, Any]], list[str]], finish: str
) -> None:
    chunks, texts = stream
    events, acc = await run_chat(chat_stream(*chunks, chat_chunk({}, finish)))
    ids = [c.id for c in acc.message().tool_uses]  # in the order the calls began
    assert sorted(ids) == [f"c{k}" for k in range(len(texts))]
    assert shown_and_recorded(events, acc) == [(texts[int(i[1:])], texts[int(i[1:])]) for i in ids]


def map_chunks(*chunks: dict[str, Any]) -> list[Any]:
    mapper = ChatMapper()
    events: list[Any] = []
    for chunk in chunks:
        events.extend(mapper.handle(ServerSentEvent(json.dumps(chunk))) or ())
    return [*events, *(mapper.handle(ServerSentEvent("[DONE]")) or ())]


def accumulate(events: list[Any]) -> Accumulator:
    acc = Accumulator()
    for event in events:
        acc.feed(event)
    return acc


def cumulative(text: str, step: int) -> Iterator[dict[str, Any]]:
    """``text`` sent in cumulative mode: every chunk holds all of it so far, ``step`` more each time."""
    yield calls(call(0, "a", "f", text[:step]))
    for end in [*range(2 * step, len(text), step), len(text)]:
        yield calls(call(0, args=text[:end]))


def test_a_long_call_in_cumulative_mode_is_mapped_in_memory_linear_in_its_size() -> None:
    # 200 KB in 10-character steps: the pieces together are 2 GB, kept whole they would not fit.
    value = {"content": "y" * 200_000}
    text = json.dumps(value)
    mapper = ChatMapper()
    events: list[Any] = []
    tracemalloc.start()
    try:
        for chunk in cumulative(text, 10):
            events.extend(mapper._chunk(chunk) or ())
        events.extend(mapper._chunk(chat_chunk({}, "tool_calls")) or ())
        events.extend(mapper._end())
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert peak < 10 * len(text)  # kept whole, the pieces took 30 000 times it
    acc = accumulate(events)
    assert inputs(acc) == [("a", "f", value, None)]
    assert shown_and_recorded(events, acc) == [(text, text)]


def test_a_call_in_cumulative_mode_cut_by_the_token_limit_is_an_error_quoting_its_last_piece() -> None:
    text = json.dumps({"content": "y" * 20_000})[:-5]
    events = map_chunks(*cumulative(text, 10), chat_chunk({}, "length"))
    acc = accumulate(events)
    ((_, name, _, error),) = inputs(acc)
    assert acc.stop_reason == "max_tokens" and name == "f" and error is not None
    assert text[-20:] in error and text[:20] + text[:20] not in error
    assert shown_and_recorded(events, acc) == [(text, text)]


@settings(max_examples=300, deadline=None)
@given(value=_JSON, cuts=st.lists(st.integers(1, 60), min_size=1, max_size=6), short=st.integers(0, 5),
       finish=st.sampled_from(["length", "content_filter"]))  # fmt: skip
def test_arguments_so_far_under_a_cut_finish_are_never_taken_as_complete(
    value: Any, cuts: list[int], short: int, finish: str
) -> None:
    # Pieces that each start with the one before, cut by the finish: unless they joined are
    # valid JSON, the call is an error; what the host is shown is what is recorded.
    text = json.dumps(value)
    text = text[: len(text) - short] or text
    ends = [*sorted({c for c in cuts if c < len(text)}), len(text)]
    pieces = [text[:e] for e in ends]
    events = map_chunks(calls(call(0, "a", "f", pieces[0])), *(calls(call(0, args=p)) for p in pieces[1:]),
                        chat_chunk({}, finish))  # fmt: skip
    acc = accumulate(events)
    ((_, _, _, error),) = inputs(acc)
    (shown, recorded) = shown_and_recorded(events, acc)[0]
    assert shown == recorded
    if len(pieces) > 1:
        try:
            json.loads("".join(pieces))
        except ValueError:
            assert error is not None


@pytest.mark.parametrize("finish", ["length", "content_filter"])
async def test_a_call_cut_by_the_finish_is_never_read_as_a_resend(finish: str) -> None:
    # '{"a": ' then '{"a": 1}': resent so far, or a nested object cut by the token limit. The
    # output was cut, so the call is not taken as complete: it is answered with an error.
    body = chat_stream(calls(call(0, "a", "f", '{"a": ')), calls(call(0, args='{"a": 1}')), chat_chunk({}, finish))
    events, acc = await run_chat(body)
    ((_, _, _, error),) = inputs(acc)
    assert error is not None and '{"a": {"a": 1}' in error
    assert shown_and_recorded(events, acc) == [('{"a": {"a": 1}', '{"a": {"a": 1}')]


_WORDS = st.text("abz09 .", max_size=4)


@settings(max_examples=200, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(value=st.dictionaries(st.sampled_from(["path", "n"]), _WORDS | st.integers(0, 99), min_size=1), cuts=st.lists(st.integers(1, 40), min_size=1, max_size=6))
@example(value={"path": "a.txt"}, cuts=[11, 11])  # a piece that repeats all so far, before the resend shows
async def test_arguments_resent_so_far_any_number_of_times_are_the_input_once(value: dict[str, Any], cuts: list[int]) -> None:
    # Cumulative mode (DeepSeek, Baidu Qianfan): each piece is all the arguments so far, some
    # repeated unchanged; the call's input is the arguments once, and the host is shown them so.
    text = json.dumps(value)
    pieces = [text[:c] for c in sorted(c for c in cuts if c < len(text))] + [text]
    body = chat_stream(
        calls(call(0, "a", "f", pieces[0])), *(calls(call(0, args=p)) for p in pieces[1:]),
        chat_chunk({}, "tool_calls"),
    )
    events, acc = await run_chat(body)
    assert (inputs(acc), shown_and_recorded(events, acc)) == ([("a", "f", value, None)], [(text, text)])


async def test_two_identical_calls_without_ids_at_one_index_are_an_error_not_one_call() -> None:
    # No id tells a second identical call from a resend; only the finish chunk's repeat is read
    # as one (GLM-style servers resend there). Otherwise the call is answered with an error.
    twice = chat_stream(calls(call(None, None, "f", '{"x": 1}')), calls(call(None, None, "f", '{"x": 1}')),
                        chat_chunk({}, "tool_calls"))  # fmt: skip
    _, acc = await run_chat(twice)
    ((_, name, _, error),) = inputs(acc)
    assert name == "f" and error is not None and '{"x": 1}{"x": 1}' in error
    resent = chat_stream(calls(call(None, None, "f", '{"x": 1}')),
                         chat_chunk({"tool_calls": [call(None, None, None, '{"x": 1}')]}, "tool_calls"))  # fmt: skip
    _, acc = await run_chat(resent)
    assert [(n, i, e) for _, n, i, e in inputs(acc)] == [("f", {"x": 1}, None)]
