"""The engine over mutated provider streams: bad bytes from the model or the network end a run
with a terminal that says what happened, never a crash, and lose nothing that arrived.

Each example starts from a recorded stream (``fixtures/``) and changes it at three levels:
its events (dropped, duplicated, swapped, renamed, renumbered, given another call's id, an
unknown or an error event added, JSON cut or given values of the wrong type, nulls, huge
numbers, lone surrogates, deep nesting), its framing (line endings, a byte order mark,
comments, ``id:``/``retry:`` fields, floods of blank lines), and its delivery (cut at any byte,
in chunks of any size, the connection failing after the last piece, a content type or a body
that is no event stream, gzip, corrupt or not). The first response is the mutated one; a later
request of the run (a retry, the turn after the tools) gets a plain answer.

After every run: the last event is the only `TurnEnded`, a ``model_error`` says what failed,
no key is shown; the transcript is valid; the text a host shows (the deltas, less what an
`AttemptDiscarded` said to erase) is the transcript's; every response was closed; no task is
left. A whole recorded answer completes, whatever the connection does after it.
"""

from __future__ import annotations

import asyncio
import contextlib
import gzip
import json
import zlib
from collections.abc import AsyncIterator
from dataclasses import dataclass
from typing import Any, get_args

import httpx
import pytest
from _models_support import API_KEY, COMPLETE_FIXTURES, MockServer, collect, final, load, request, split
from hypothesis import given, settings
from hypothesis import strategies as st

from agentloop import (
    AbortController,
    AttemptDiscarded,
    QueryEngine,
    TextDelta,
    Tool,
    ToolContext,
    TurnEnded,
    validate_transcript,
)
from agentloop._events import TerminalReason
from agentloop._unicode import scrub
from agentloop.models import AnthropicModel, OpenAIChatModel, OpenAIResponsesModel

PROVIDERS: dict[str, tuple[type[Any], list[str], str]] = {
    "anthropic": (
        AnthropicModel,
        [
            "anthropic_tool_use.sse",
            "anthropic_thinking_tool_use.assembled.sse",
            "anthropic_web_search.repaired.sse",
            "anthropic_text.sse",
            "anthropic_refusal.sdkfixture.sse",
            "anthropic_midstream_error.assembled.sse",
        ],
        "anthropic_text.sse",
    ),
    "openai_chat": (
        OpenAIChatModel,
        ["openai_chat_tool.recorded.sse", "openai_chat_parallel_tools.recorded.sse", "openai_chat_logprobs.recorded.sse"],
        "openai_chat_text.recorded.sse",
    ),
    "openai_responses": (
        OpenAIResponsesModel,
        ["openai_responses_reasoning_function_call.prism.sse", "openai_responses_text.prism.sse"],
        "openai_responses_text.prism.sse",
    ),
}
TOOL_NAMES = ("get_weather", "get_stock_price", "search", "weather")
TERMINALS = set(get_args(TerminalReason))


async def answer(args: dict[str, Any], ctx: ToolContext) -> str:
    await asyncio.sleep(0)
    return "sunny, 21 C"


TOOLS = [Tool(name, "A recorded stream's tool.", {"type": "object"}, answer, concurrency_safe=True) for name in TOOL_NAMES]

# ---------------------------------------------------------------------------------------------
# Events: a fixture as (event name, data) pairs, and what is done to them


def events_of(body: bytes) -> list[tuple[str | None, str]]:
    """The (event, data) pairs of an LF-framed fixture with one data line per event."""
    out: list[tuple[str | None, str]] = []
    for frame in body.decode().split("\n\n"):
        name, data = None, None
        for line in frame.split("\n"):
            if line.startswith("event:"):
                name = line[6:].strip()
            elif line.startswith("data:"):
                data = line[5:].removeprefix(" ")
        if data is not None:
            out.append((name, data))
    return out


_MARK = "\x00wirefuzz\x00"
#: Raw JSON put where a value was: wrong types, nulls, huge numbers, lone surrogates, deep nesting.
ODD_VALUES = [
    "null",
    "true",
    "-1",
    "0",
    "1e999",
    "123456789012345678901234567890123456789",
    "-0.5",
    '"x"',
    '"\\ud800"',
    '"\\udfff tail"',
    "[]",
    "{}",
    '{"type": "unheard_of"}',
    "[" * 3000 + "]" * 3000,
    '{"a":' * 200 + "1" + "}" * 200,
]


def paths(value: Any, at: tuple[Any, ...] = ()) -> list[tuple[Any, ...]]:
    """Every place in a JSON value (the value itself included)."""
    out = [at]
    if isinstance(value, dict):
        for key, item in value.items():
            out += paths(item, (*at, key))
    elif isinstance(value, list):
        for i, item in enumerate(value):
            out += paths(item, (*at, i))
    return out


def replaced(value: Any, at: tuple[Any, ...], new: Any) -> Any:
    if not at:
        return new
    head, rest = at[0], at[1:]
    if isinstance(value, dict):
        return {**value, head: replaced(value[head], rest, new)}
    copy = list(value)
    copy[head] = replaced(copy[head], rest, new)
    return copy


def deleted(value: Any, at: tuple[Any, ...]) -> Any:
    if len(at) == 1:
        if isinstance(value, dict):
            return {k: v for k, v in value.items() if k != at[0]}
        return [v for i, v in enumerate(value) if i != at[0]]
    head = at[0]
    if isinstance(value, dict):
        return {**value, head: deleted(value[head], at[1:])}
    copy = list(value)
    copy[head] = deleted(copy[head], at[1:])
    return copy


#: Events put anywhere: one of no known type, and each API's way of failing mid-stream.
INSERTED: list[tuple[str | None, str]] = [
    ("surprise.event", '{"type": "surprise.event", "index": 0}'),
    ("error", '{"type": "error", "error": {"type": "overloaded_error", "message": "Overloaded"}}'),
    ("error", '{"type": "error", "code": "server_error", "message": "The server had an error"}'),
    ("response.failed", '{"type": "response.failed", "response": {"id": "r", "status": "failed", "error": {"code": "server_error", "message": "boom"}}}'),
    (None, '{"error": {"message": "The server had an error while processing your request", "type": "server_error"}}'),
    ("error", json.dumps({"type": "error", "error": {"type": "authentication_error", "message": f"bad key {API_KEY}"}})),
]


@st.composite
def corrupt_data(draw: st.DrawFn, data: str) -> str:
    """``data`` with one thing wrong: cut, a value swapped for an odd one, a key gone."""
    kind = draw(st.sampled_from(["cut", "value", "delete", "garbage"]))
    if kind == "garbage":
        return draw(st.sampled_from(["", "{", "not json", "[DONE", "null", "[]", '"str"', "\ufffd\ufffd"]))
    if kind == "cut":
        return data[: draw(st.integers(0, max(0, len(data) - 1)))]
    try:
        value = json.loads(data)
    except (ValueError, RecursionError):  # a corrupted event may be nested past the limit
        return data[: len(data) // 2]
    places = paths(value)
    at = places[draw(st.integers(0, len(places) - 1))]
    if kind == "delete" and at:
        return json.dumps(deleted(value, at))
    raw = draw(st.sampled_from(ODD_VALUES))
    return json.dumps(replaced(value, at, _MARK)).replace(json.dumps(_MARK), raw)


@st.composite
def mutated_events(draw: st.DrawFn, events: list[tuple[str | None, str]]) -> list[tuple[str | None, str]]:
    """``events`` after a few drops, duplicates, swaps, corruptions and insertions."""
    events = list(events)
    for _ in range(draw(st.integers(0, 3))):
        if not events:
            break
        i = draw(st.integers(0, len(events) - 1))
        op = draw(st.sampled_from(["drop", "dup", "swap", "corrupt", "unknown", "retype", "renumber", "reuse_id"]))
        if op == "drop":
            del events[i]
        elif op == "dup":
            events.insert(draw(st.integers(0, len(events))), events[i])
        elif op == "swap":
            j = draw(st.integers(0, len(events) - 1))
            events[i], events[j] = events[j], events[i]
        elif op == "corrupt":
            events[i] = (events[i][0], draw(corrupt_data(events[i][1])))
        elif op == "unknown":
            events.insert(i, draw(st.sampled_from(INSERTED)))
        elif op == "retype":  # an event named as another kind: its data read by the wrong rule
            names = sorted({n for n, _ in events if n})
            if names:
                events[i] = (draw(st.sampled_from(names)), events[i][1])
        else:  # an index moved (to another block's, of another type), or an id another call has
            key = "index" if op == "renumber" else "id"
            events[i] = (events[i][0], draw(rekeyed(events[i][1], key, [d for _, d in events])))
    return events


@st.composite
def rekeyed(draw: st.DrawFn, data: str, key: str, others: list[str]) -> str:
    """``data`` with the values under ``key`` (``index``, ``output_index``; ``id``, ``call_id``)
    set to small numbers, or to one found in another event."""
    try:
        value = json.loads(data)
    except (ValueError, RecursionError):  # a corrupted event may be nested past the limit
        return data
    seen = [v for d in others for v in _values(d, key)]
    for at in [p for p in paths(value) if p and isinstance(p[-1], str) and p[-1].endswith(key)]:
        new = draw(st.integers(0, 3)) if key == "index" or not seen else draw(st.sampled_from(seen))
        value = replaced(value, at, new)
    return json.dumps(value)


def _values(data: str, key: str) -> list[Any]:
    try:
        value = json.loads(data)
    except (ValueError, RecursionError):  # a corrupted event may be nested past the limit
        return []
    found = []
    for at in paths(value):
        if at and isinstance(at[-1], str) and at[-1].endswith(key):
            item: Any = value
            for step in at:
                item = item[step]
            if isinstance(item, str | int):
                found.append(item)
    return found


# ---------------------------------------------------------------------------------------------
# Framing and delivery


@st.composite
def framed(draw: st.DrawFn, events: list[tuple[str | None, str]]) -> bytes:
    """The events as an SSE body, each line ending drawn, with extras the decoder must skip."""
    eol = draw(st.sampled_from(["\n", "\r\n", "\r"]))
    out = ["\ufeff"] if draw(st.booleans()) else []
    extras = [": keep-alive", "id: 7", "retry: 3000", "retry: soon", "foo: bar", ""]
    for name, data in events:
        if draw(st.integers(0, 9)) == 0:
            out += [draw(st.sampled_from(extras)) + eol for _ in range(draw(st.integers(1, 4)))]
        if draw(st.integers(0, 19)) == 0:
            out.append(eol * draw(st.integers(1, 50)))  # a flood of blank lines
        if name is not None:
            out.append(f"event: {name}{eol}")
        out.append(f"data: {data}{eol}{eol}")
    return "".join(out).encode("utf-8", "surrogatepass")


@dataclass
class Delivery:
    """How the body travels: its pieces, and what the connection does."""

    chunks: list[bytes]
    headers: dict[str, str]
    fail: tuple[type[Exception], tuple[Any, ...]] | None = None  # raised (made anew) after the chunks
    whole: bool = False  # the body arrives whole, as an event stream (``fail`` aside)


class FaultyStream(httpx.AsyncByteStream):
    """A body in pieces, the event loop free between them, maybe failing after the last;
    records its closing."""

    def __init__(self, delivery: Delivery) -> None:
        self.delivery = delivery
        self.closed = False

    async def __aiter__(self) -> AsyncIterator[bytes]:
        for chunk in self.delivery.chunks:
            await asyncio.sleep(0)
            yield chunk
        if self.delivery.fail is not None:
            kind, args = self.delivery.fail
            raise kind(*args)

    async def aclose(self) -> None:
        self.closed = True


FAILURES: list[tuple[type[Exception], tuple[Any, ...]]] = [
    (httpx.ReadError, ("connection reset by peer",)),
    (httpx.RemoteProtocolError, ("peer closed connection without sending complete message body",)),
    (httpx.ReadTimeout, ("timed out",)),
    (ConnectionResetError, (104, "Connection reset by peer")),  # a host transport's own
]
#: Bodies of a 200 that are no event stream: a JSON answer, an error document, a web page, text.
DOCUMENTS = [
    (b'{"id": "x", "object": "chat.completion", "choices": []}', "application/json"),
    (b'{"error": {"message": "overloaded", "type": "overloaded_error"}}', "application/json"),
    (b"<html><body><h1>502 Bad Gateway</h1></body></html>", "text/html"),
    (b"upstream connect error or disconnect/reset before headers", "text/plain"),
    (b"", "text/event-stream"),
]
CONTENT_TYPES = ["text/event-stream", "text/event-stream; charset=utf-8", "application/json", "text/html", "text/plain", None]


@st.composite
def delivered(draw: st.DrawFn, body: bytes) -> Delivery:
    """``body`` maybe cut, in chunks, maybe gzipped (and corrupt), the connection maybe failing."""
    original = body
    if draw(st.integers(0, 3)) == 0:
        body = body[: draw(st.integers(0, len(body)))]
    media = draw(st.sampled_from(CONTENT_TYPES)) if draw(st.integers(0, 5)) == 0 else "text/event-stream"
    if draw(st.integers(0, 11)) == 0:
        body, media = draw(st.sampled_from(DOCUMENTS))
    whole = body == original and media is not None and media.startswith("text/event-stream")
    headers = {} if media is None else {"content-type": media}
    if draw(st.integers(0, 7)) == 0:
        headers["content-encoding"] = "gzip"
        body = gzip.compress(body)
        if draw(st.booleans()):  # corrupt: a byte flipped, or cut
            whole = False
            at = draw(st.integers(0, len(body) - 1))
            body = body[:at] + bytes([body[at] ^ 0x5A]) + body[at + 1 :] if draw(st.booleans()) else body[:at]
    cuts = draw(st.lists(st.integers(1, max(1, len(body) - 1)), max_size=25))
    if len(body) < 4000 and draw(st.integers(0, 9)) == 0:
        cuts = list(range(1, len(body)))  # byte by byte (a short body: each byte costs a turn of the loop)
    fail = draw(st.sampled_from(FAILURES)) if draw(st.integers(0, 4)) == 0 else None
    return Delivery(split(body, cuts) if body else [], headers, fail, whole)


@dataclass
class Case:
    provider: str
    fixture: str
    delivery: Delivery
    retries: int = 0
    intact: bool = False  # a complete recorded answer, its events as recorded


@st.composite
def cases(draw: st.DrawFn, provider: str) -> Case:
    _, streams, _ = PROVIDERS[provider]
    name = draw(st.sampled_from(streams))
    recorded = events_of(load(name))
    events = draw(mutated_events(recorded))
    delivery = draw(delivered(draw(framed(events))))
    intact = events == recorded and delivery.whole and name in COMPLETE_FIXTURES
    return Case(provider, name, delivery, draw(st.integers(0, 2)), intact)


# ---------------------------------------------------------------------------------------------
# The run and what must hold after it


async def play(case: Case) -> None:
    cls, _, text_stream = PROVIDERS[case.provider]
    streams: list[FaultyStream] = []

    def handler(request: httpx.Request) -> httpx.Response:
        if streams:
            delivery = Delivery([load(text_stream)], {"content-type": "text/event-stream"})
        else:
            delivery = case.delivery
        stream = FaultyStream(delivery)
        streams.append(stream)
        return httpx.Response(200, headers=delivery.headers, stream=stream)

    async with httpx.AsyncClient(transport=httpx.MockTransport(handler)) as client:
        model = cls("m", api_key=API_KEY, http_client=client)
        engine = QueryEngine(
            model,
            tools=TOOLS,
            policies=[],
            retry_budget=case.retries,
            retry_base_delay=0,
            retry_max_delay=0,
            max_turns=4,
            tool_cancel_grace=0.01,
        )
        events = [e async for e in engine.run("What is the weather?")]
    check(engine, events, streams)
    if case.intact:  # whatever the connection did after the last byte, the answer is whole
        assert events[-1].reason in {"completed", "max_turns"}, events[-1]
    me = asyncio.current_task()
    for _ in range(3):
        await asyncio.sleep(0)
    assert [t for t in asyncio.all_tasks() if t is not me and not t.done()] == []


def check(engine: QueryEngine, events: list[Any], streams: list[FaultyStream]) -> None:
    ends = [e for e in events if isinstance(e, TurnEnded)]
    assert len(ends) == 1 and events[-1] is ends[0], events[-3:]
    end = ends[0]
    assert end.reason in TERMINALS
    if end.reason == "model_error":
        assert end.error and "SECRET" not in end.error, end
    else:
        assert end.reason in {"completed", "max_turns"}, end
    assert validate_transcript(engine.messages) == [], engine.messages
    assert "SECRET" not in repr(engine.messages) and "SECRET" not in repr(events)
    # What a host shows: the deltas, less what each discarded attempt said to erase. Whitespace
    # aside: a text block of only whitespace is never committed, and the last block's trailing
    # whitespace is stripped (docs/concepts.md).
    view = ""
    for e in events:
        if isinstance(e, TextDelta):
            view += e.text
        elif isinstance(e, AttemptDiscarded):
            view = view[: len(view) - e.text_chars]
    shown = "".join(scrub(view).split())
    kept = "".join(b.text for m in engine.messages if m.role == "assistant" for b in m.content if b.type == "text")
    assert "".join(kept.split()) == shown, (end, engine.messages)
    assert all(s.closed for s in streams), "a response was left open"


@st.composite
def whole_then_failing(draw: st.DrawFn) -> Case:
    """A complete recorded answer, reframed and in chunks, then the connection failing."""
    provider = draw(st.sampled_from(sorted(PROVIDERS)))
    name = draw(st.sampled_from([n for n in PROVIDERS[provider][1] if n in COMPLETE_FIXTURES]))
    body = draw(framed(events_of(load(name))))
    cuts = draw(st.lists(st.integers(1, len(body) - 1), max_size=25))
    fail = draw(st.sampled_from(FAILURES))
    return Case(provider, name, Delivery(split(body, cuts), {"content-type": "text/event-stream"}, fail, True), 0, True)


@settings(max_examples=30, deadline=None)
@given(whole_then_failing())
def test_a_whole_answer_then_any_connection_failure_is_kept(case: Case) -> None:
    asyncio.run(play(case), debug=True)


@settings(max_examples=40, deadline=None)
@given(cases("anthropic"))
def test_anthropic_mutated_streams_end_with_a_terminal_and_keep_what_arrived(case: Case) -> None:
    asyncio.run(play(case), debug=True)


@settings(max_examples=30, deadline=None)
@given(cases("openai_chat"))
def test_openai_chat_mutated_streams_end_with_a_terminal_and_keep_what_arrived(case: Case) -> None:
    asyncio.run(play(case), debug=True)


@settings(max_examples=30, deadline=None)
@given(cases("openai_responses"))
def test_openai_responses_mutated_streams_end_with_a_terminal_and_keep_what_arrived(case: Case) -> None:
    asyncio.run(play(case), debug=True)


# ---------------------------------------------------------------------------------------------
# What the properties found, one plain case each


def _gzipped(body: bytes, *, corrupt_at: int | None = None) -> MockServer:
    packed = gzip.compress(body)
    if corrupt_at is not None:
        packed = packed[:corrupt_at] + bytes([packed[corrupt_at] ^ 0x5A]) + packed[corrupt_at + 1 :]
    return MockServer(split(packed, range(16, len(packed), 16)), headers={"content-encoding": "gzip"})


def _no_task_left() -> list[asyncio.Task[Any]]:
    me = asyncio.current_task()
    return [t for t in asyncio.all_tasks() if t is not me and not t.done()]


async def test_a_gzipped_stream_left_early_leaves_no_generator_for_the_garbage_collector() -> None:
    # httpx's decoding reader stacks async generators; the inner one a reader leaves suspended
    # is closed later, by a task of its own, after the response was closed and handed back.
    server = _gzipped(load("anthropic_tool_use.sse"))
    async with server.client() as client:
        model = AnthropicModel("m", api_key=API_KEY, http_client=client)
        async with contextlib.aclosing(model.stream(request(), AbortController().signal)) as stream:
            first = await anext(stream)
        assert _no_task_left() == []
    assert first is not None and server.streams[0].closed


async def test_a_corrupt_gzipped_stream_is_a_decoding_error_and_leaves_nothing_running() -> None:
    body = load("openai_chat_text.recorded.sse")
    server = _gzipped(body, corrupt_at=0)
    async with server.client() as client:
        engine = QueryEngine(OpenAIChatModel("m", api_key=API_KEY, http_client=client), policies=[], retry_budget=0)
        events = [e async for e in engine.run("hi")]
        assert _no_task_left() == []
    end = events[-1]
    assert isinstance(end, TurnEnded) and end.reason == "model_error"
    assert end.error is not None and "could not be decoded" in end.error
    assert validate_transcript(engine.messages) == [] and server.streams[0].closed


def _deflate(body: bytes, wbits: int) -> bytes:
    packer = zlib.compressobj(wbits=wbits)
    return packer.compress(body) + packer.flush()


@pytest.mark.parametrize(
    ("encoding", "pack"),
    [
        ("gzip", gzip.compress),
        ("x-gzip", gzip.compress),
        ("deflate", lambda b: _deflate(b, zlib.MAX_WBITS)),
        ("deflate", lambda b: _deflate(b, -zlib.MAX_WBITS)),  # raw, as some servers send it
        ("gzip, deflate", lambda b: _deflate(gzip.compress(b), zlib.MAX_WBITS)),
        ("identity", lambda b: b),
    ],
    ids=["gzip", "x-gzip", "deflate-zlib", "deflate-raw", "gzip-then-deflate", "identity"],
)
async def test_a_compressed_stream_in_small_pieces_reads_as_the_plain_one(encoding: str, pack: Any) -> None:
    body = load("openai_responses_reasoning_function_call.prism.sse")
    packed = pack(body)
    server = MockServer(split(packed, range(7, len(packed), 7)), headers={"content-encoding": encoding})
    async with server.client() as client:
        _, acc = await collect(OpenAIResponsesModel("m", api_key=API_KEY, http_client=client))
    plain = MockServer(body)
    async with plain.client() as client:
        _, expected = await collect(OpenAIResponsesModel("m", api_key=API_KEY, http_client=client))
    assert final(acc) == final(expected) and server.streams[0].closed
