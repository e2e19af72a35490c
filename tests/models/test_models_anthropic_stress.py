"""AnthropicModel under stress: any chunking of a stream (inside a UTF-8 character, between a
CR and its LF, in an event of several data lines), deltas after a block's end, error events whose
values are of the wrong type, and the response closed and the key kept out on every way out."""

from __future__ import annotations

import json
from typing import Any

import httpx
import pytest
from _models_support import (
    API_KEY,
    MockServer,
    RecordingStream,
    collect,
    final,
    load,
    request,
    run_fixture,
    split,
    sse,
)
from hypothesis import given, settings
from hypothesis import strategies as st

from agentloop import DoomLoopDetected, QueryEngine, TextDelta, ToolInputDelta, TurnEnded, validate_transcript
from agentloop import Tool as AgentTool
from agentloop._errors import ModelError, ProviderStreamError, StreamProtocolError
from agentloop._messages import Message, ProviderBlock, TextBlock, ThinkingBlock
from agentloop.models import AnthropicModel, Usage
from agentloop.models.anthropic import build_request
from agentloop.policies import ConservativeDoomLoopPolicy

START = (
    "message_start",
    {"type": "message_start", "message": {"id": "msg_1", "usage": {"input_tokens": 5, "output_tokens": 1}}},
)
STOP = ("message_stop", {"type": "message_stop"})


def _delta(index: int, **delta: Any) -> tuple[str, dict[str, Any]]:
    return ("content_block_delta", {"type": "content_block_delta", "index": index, "delta": delta})


def _start(index: int, **block: Any) -> tuple[str, dict[str, Any]]:
    return ("content_block_start", {"type": "content_block_start", "index": index, "content_block": block})


def _stop(index: int) -> tuple[str, dict[str, Any]]:
    return ("content_block_stop", {"type": "content_block_stop", "index": index})


def _end(reason: str, output: int = 9) -> tuple[str, dict[str, Any]]:
    return ("message_delta", {"type": "message_delta", "delta": {"stop_reason": reason}, "usage": {"output_tokens": output}})


# -- any chunking gives the same answer ---------------------------------------------------------


def _events(body: bytes) -> list[tuple[str | None, Any]]:
    """The events of a fixture (one ``data:`` line each), their data decoded."""
    out: list[tuple[str | None, Any]] = []
    for part in body.decode().split("\n\n"):
        name, data = None, None
        for line in part.splitlines():
            if line.startswith("event:"):
                name = line[6:].strip()
            elif line.startswith("data:"):
                data = json.loads(line[5:])
        if data is not None:
            out.append((name, data))
    return out


_WIDE_TEXT = "é€😀"  # characters of two, three and four bytes


def _widened(value: Any) -> Any:
    """``value`` with wide characters in every text and thinking delta, and in the model's name
    (which no answer holds: a stream of no text has some too)."""
    if isinstance(value, dict):
        out = {k: _widened(v) for k, v in value.items()}
        if isinstance(out.get("model"), str):
            out["model"] += "-ü"
        if out.get("type") == "text_delta":
            out["text"] = _WIDE_TEXT + out["text"]
        elif out.get("type") == "thinking_delta":
            out["thinking"] = out["thinking"] + _WIDE_TEXT
        return out
    if isinstance(value, list | tuple):
        return type(value)(_widened(v) for v in value)
    return value


def _written(events: list[tuple[str | None, Any]]) -> bytes:
    """The events as a server writes them: JSON with its non-ASCII characters as themselves
    (``sse``'s json.dumps escapes them, and its body is ASCII only), every other event's data
    over several ``data:`` lines, keep-alive comments and pings between them."""
    out: list[str] = [": hello\n\n"]
    for i, (name, data) in enumerate(events):
        text = json.dumps(data, ensure_ascii=False, indent=1 if i % 2 else None)
        head = f"event: {name}\n" if name else ""
        out.append(head + "".join(f"data: {line}\n" for line in text.split("\n")) + "\n")
        if i % 3 == 0:
            out.append('event: ping\ndata: {"type": "ping"}\n\n: keep-alive\n\n')
    return "".join(out).encode()


#: A stream whose text, thinking and tool input hold wide characters, the input's cut inside
#: a string between two deltas.
_WIDE = _written([
    START,
    _start(0, type="thinking", thinking="", signature=""),
    _delta(0, type="thinking_delta", thinking="Ça va 😀 "),
    _delta(0, type="thinking_delta", thinking="naïve"),
    _delta(0, type="signature_delta", signature="c2lnbmF0dXJl"),
    _stop(0),
    _start(1, type="text", text=""),
    _delta(1, type="text_delta", text="né€"),
    _delta(1, type="text_delta", text="𝄞 ok"),
    _stop(1),
    _start(2, type="tool_use", id="toolu_1", name="lookup", input={}),
    _delta(2, type="input_json_delta", partial_json=""),
    _delta(2, type="input_json_delta", partial_json='{"q": "日本'),
    _delta(2, type="input_json_delta", partial_json='語 ☃"}'),
    _stop(2),
    _end("tool_use"),
    STOP,
])  # fmt: skip

_FIXTURES = (
    "anthropic_refusal.sdkfixture.sse",
    "anthropic_text.sse",
    "anthropic_thinking.sse",
    "anthropic_thinking_tool_use.assembled.sse",
    "anthropic_tool_use.sdkfixture.sse",
    "anthropic_tool_use.sse",
    "anthropic_web_search.repaired.sse",
)
_BODIES = {"wide": _WIDE, **{name: _written(_widened(_events(load(name)))) for name in _FIXTURES}}


def _crlf(body: bytes) -> bytes:
    return body.replace(b"\n", b"\r\n")


def _char_cuts(body: bytes) -> list[int]:
    """The offsets inside a character of several bytes (before each continuation byte)."""
    return [i for i in range(1, len(body)) if 0x80 <= body[i] < 0xC0]


def _crlf_cuts(body: bytes) -> list[int]:
    """The offsets between the CR and the LF of each line end of ``body``."""
    return [i for i in range(1, len(body)) if body[i - 1 : i + 1] == b"\r\n"]


async def _outcome(body: bytes | list[bytes]) -> dict[str, Any]:
    events, acc = await run_fixture("anthropic_text.sse", body)
    return {"events": events, **final(acc)}


@pytest.mark.parametrize("name", sorted(_BODIES))
def test_the_streams_hold_what_their_cuts_must_fall_inside(name: str) -> None:
    body = _BODIES[name]
    assert max(body) > 127  # UTF-8 of several bytes, not \u escapes
    assert b"\ndata: " in body.replace(b"\ndata: {", b"")  # an event's data on several lines
    # A decoder that read each chunk on its own would get other text from these cuts.
    pieces = split(body, _char_cuts(body))
    assert "".join(p.decode("utf-8", "replace") for p in pieces) != body.decode()


@pytest.mark.parametrize("name", sorted(_BODIES))
async def test_each_written_stream_reads_as_the_fixture_it_came_from(name: str) -> None:
    got = await _outcome(_BODIES[name])
    if name == "wide":
        thinking, text, call = got["message"]["content"]
        assert (thinking["thinking"], thinking["signature"]) == ("Ça va 😀 naïve", "c2lnbmF0dXJl")
        assert text["text"] == "né€𝄞 ok"
        assert (call["name"], call["input"]) == ("lookup", {"q": "日本語 ☃"})
        assert (got["stop_reason"], got["usage"].output_tokens) == ("tool_use", 9)
        return
    plain = await _outcome(load(name))
    assert got["stop_reason"] == plain["stop_reason"]
    assert [b["type"] for b in got["message"]["content"]] == [b["type"] for b in plain["message"]["content"]]
    for wide, was in zip(got["message"]["content"], plain["message"]["content"], strict=True):
        if was["type"] == "text" and was["text"]:
            assert wide["text"].replace(_WIDE_TEXT, "") == was["text"]
        elif was["type"] != "text":
            assert {k: v for k, v in wide.items() if k != "thinking"} == {k: v for k, v in was.items() if k != "thinking"}


@settings(max_examples=60, deadline=None)
@given(st.sampled_from(sorted(_BODIES)), st.booleans(), st.data())
async def test_any_stream_cut_anywhere_gives_the_same_events_and_message(name: str, crlf: bool, data: st.DataObject) -> None:
    whole = _BODIES[name]
    body = _crlf(whole) if crlf else whole
    cuts = data.draw(st.lists(st.sampled_from(_char_cuts(body)), max_size=8))
    if crlf:
        cuts += data.draw(st.lists(st.sampled_from(_crlf_cuts(body)), max_size=8))
    cuts += data.draw(st.lists(st.integers(1, len(body) - 1), max_size=20))
    assert await _outcome(split(body, cuts)) == await _outcome(whole)


@pytest.mark.parametrize("name", sorted(_BODIES))
async def test_a_crlf_stream_cut_inside_every_character_and_every_line_end_gives_the_same_outcome(name: str) -> None:
    whole = _BODIES[name]
    body = _crlf(whole)
    assert await _outcome(split(body, _char_cuts(body) + _crlf_cuts(body))) == await _outcome(whole)


async def test_the_wide_stream_one_byte_at_a_time_gives_the_same_outcome() -> None:
    body = _crlf(_WIDE)
    assert await _outcome([body[i : i + 1] for i in range(len(body))]) == await _outcome(_WIDE)


# -- a delta after its block's content_block_stop ---------------------------------------------


async def _run(body: bytes) -> tuple[dict[str, Any], MockServer]:
    server = MockServer(body)
    async with server.client() as client:
        _, acc = await collect(AnthropicModel("m", api_key=API_KEY, http_client=client))
    return final(acc), server


_LATE = {
    "text": (_start(0, type="text", text=""), _delta(0, type="text_delta", text="Hello"),
             _delta(0, type="text_delta", text=" again")),
    "tool input": (_start(0, type="tool_use", id="toolu_1", name="f", input={}),
                   _delta(0, type="input_json_delta", partial_json='{"a": 1}'),
                   _delta(0, type="input_json_delta", partial_json='{"b": 2}')),
    "thinking": (_start(0, type="thinking", thinking="", signature=""),
                 _delta(0, type="thinking_delta", thinking="so"), _delta(0, type="thinking_delta", thinking=" more")),
    "signature": (_start(0, type="thinking", thinking="", signature=""),
                  _delta(0, type="signature_delta", signature="c2ln"), _delta(0, type="signature_delta", signature="b3RoZXI=")),
}  # fmt: skip


@pytest.mark.parametrize("kind", ["tool input", "signature"])
async def test_a_late_delta_for_a_calls_input_or_a_signature_is_not_retried(kind: str) -> None:
    # The block was whole at its content_block_stop (a call may be run from there): more of it
    # would change the input of a call already made, or replace a signature. A server that sends
    # it does so on every attempt, each one billed: it is not retried.
    start, first, late = _LATE[kind]
    body = sse(START, start, first, _stop(0), late, _end("end_turn"), STOP)
    with pytest.raises(StreamProtocolError, match="after its content_block_stop") as info:
        await _run(body)
    assert info.value.retryable is False
    # Without the late delta, the same stream is a whole answer.
    got, server = await _run(sse(START, start, first, _stop(0), _end("end_turn"), STOP))
    assert got["stop_reason"] == "end_turn" and server.streams[0].closed


async def test_a_late_call_input_ends_the_run_after_one_request() -> None:
    start, first, late = _LATE["tool input"]
    server = MockServer(sse(START, start, first, _stop(0), late, _end("tool_use"), STOP))
    async with server.client() as client:
        engine = QueryEngine(AnthropicModel("m", api_key=API_KEY, http_client=client), policies=[])
        events = [e async for e in engine.run("hi")]
    end = events[-1]
    assert isinstance(end, TurnEnded) and end.reason == "model_error"
    assert end.error is not None and "after its content_block_stop" in end.error
    assert len(server.streams) == 1 and server.streams[0].closed  # not retried


_EMPTY_LATE = {
    "text": (_start(0, type="text", text=""), _delta(0, type="text_delta", text="Hello"),
             _delta(0, type="text_delta", text="")),
    "tool input": (_start(0, type="tool_use", id="toolu_1", name="f", input={}),
                   _delta(0, type="input_json_delta", partial_json='{"a": 1}'),
                   _delta(0, type="input_json_delta", partial_json="")),
    "thinking": (_start(0, type="thinking", thinking="", signature=""),
                 _delta(0, type="signature_delta", signature="c2ln"), _delta(0, type="thinking_delta", thinking="")),
    "signature": (_start(0, type="thinking", thinking="", signature=""),
                  _delta(0, type="signature_delta", signature="c2ln"), _delta(0, type="signature_delta", signature="")),
    "citations": (_start(0, type="text", text=""), _delta(0, type="text_delta", text="Hello"),
                  _delta(0, type="citations_delta", citation={"type": "char_location", "cited_text": "x"})),
}  # fmt: skip


@pytest.mark.parametrize("kind", sorted(_EMPTY_LATE))
async def test_an_empty_delta_or_a_citation_after_its_blocks_stop_changes_nothing(kind: str) -> None:
    start, first, late = _EMPTY_LATE[kind]
    got, server = await _run(sse(START, start, first, _stop(0), late, _end("end_turn"), STOP))
    plain, _ = await _run(sse(START, start, first, _stop(0), _end("end_turn"), STOP))
    assert got == plain and server.streams[0].closed
    if kind == "tool input":
        return  # (through the engine, the call would be run)
    # Through the engine: one request, and the turn completes.
    server = MockServer(sse(START, start, first, _stop(0), late, _end("end_turn"), STOP))
    async with server.client() as client:
        engine = QueryEngine(AnthropicModel("m", api_key=API_KEY, http_client=client), policies=[])
        events = [e async for e in engine.run("hi")]
    assert isinstance(events[-1], TurnEnded) and events[-1].reason == "completed"
    assert len(server.streams) == 1


@pytest.mark.parametrize("kind", ["text", "thinking"])
async def test_late_text_or_thinking_opens_a_new_block_before_the_blocks_begun_after_it(kind: str) -> None:
    # A gateway that sends a second segment to the index of a block it closed (claude-code-router's
    # second reasoning segment): a block of its own, shown as it streams, in the order it came.
    delta = "text_delta" if kind == "text" else "thinking_delta"
    start = _start(0, type=kind, text="") if kind == "text" else _start(0, type=kind, thinking="", signature="")
    signed = [_delta(0, type="signature_delta", signature="c2ln")] if kind == "thinking" else []
    body = sse(
        START, start, _delta(0, type=delta, **{kind: "one"}), *signed, _stop(0),
        _delta(0, type=delta, **{kind: "two"}), _delta(0, type=delta, **{kind: " more"}), _stop(0),
        _start(1, type="text", text=""), _delta(1, type="text_delta", text="after"), _stop(1),
        _end("end_turn"), STOP,
    )  # fmt: skip
    server = MockServer(body)
    async with server.client() as client:
        events, acc = await collect(AnthropicModel("m", api_key=API_KEY, http_client=client))
    content = acc.message().content
    assert [(b.type, getattr(b, kind, None) if b.type == kind else b.text) for b in content] == [
        (kind, "one"), (kind, "two more"), ("text", "after")
    ]  # fmt: skip
    indices = [e.index for e in events if hasattr(e, "index")]
    assert len(set(indices)) == 3 and indices == sorted(indices)
    committed = acc.committable()
    assert committed is not None
    if kind == "text":
        assert [b.text for b in committed.content] == ["one", "two more", "after"]
    else:  # the second segment has no signature: shown, not kept
        assert [b.type for b in committed.content] == ["thinking", "text"]
        assert committed.content[0].thinking == "one"
    assert server.streams[0].closed


async def test_a_new_thinking_block_keeps_the_signature_that_comes_for_it_before_its_stop() -> None:
    body = sse(
        START, _start(0, type="thinking", thinking="", signature=""), _delta(0, type="thinking_delta", thinking="one"),
        _delta(0, type="signature_delta", signature="c2ln"), _stop(0),
        _delta(0, type="thinking_delta", thinking="two"), _delta(0, type="signature_delta", signature="b3RoZXI="), _stop(0),
        _start(1, type="text", text=""), _delta(1, type="text_delta", text="ok"), _stop(1), _end("end_turn"), STOP,
    )  # fmt: skip
    server = MockServer(body)
    async with server.client() as client:
        _, acc = await collect(AnthropicModel("m", api_key=API_KEY, http_client=client))
    committed = acc.committable()
    assert committed is not None
    assert [(b.thinking, b.signature) for b in committed.content if isinstance(b, ThinkingBlock)] == [
        ("one", "c2ln"), ("two", "b3RoZXI=")
    ]  # fmt: skip
    assert committed.text == "ok"


async def test_late_text_goes_through_the_engine_into_a_valid_transcript() -> None:
    body = sse(START, _start(0, type="text", text=""), _delta(0, type="text_delta", text="Hello"), _stop(0),
               _delta(0, type="text_delta", text=" again  "), _end("end_turn"), STOP)  # fmt: skip
    server = MockServer(body)
    async with server.client() as client:
        engine = QueryEngine(AnthropicModel("m", api_key=API_KEY, http_client=client), policies=[])
        events = [e async for e in engine.run("hi")]
    assert isinstance(events[-1], TurnEnded) and events[-1].reason == "completed"
    assert "".join(e.text for e in events if isinstance(e, TextDelta)) == "Hello again  "
    assert [b.text for b in engine.messages[-1].content] == ["Hello", " again"]
    assert validate_transcript(engine.messages) == []


async def test_the_doom_loop_watcher_reads_late_text_in_its_new_block() -> None:
    chant = "I'll do it.\nI'll execute.\n" * 60
    looping = sse(START, _start(0, type="text", text=""), _delta(0, type="text_delta", text="Plan.\n"), _stop(0),
                  *(_delta(0, type="text_delta", text=chant[i : i + 7]) for i in range(0, len(chant), 7)),
                  _end("end_turn"), STOP)  # fmt: skip
    server = _Server(looping, hang=False)
    async with httpx.AsyncClient(transport=httpx.MockTransport(server.handler)) as client:
        engine = QueryEngine(AnthropicModel("m", api_key=API_KEY, http_client=client),
                             policies=[ConservativeDoomLoopPolicy()])  # fmt: skip
        events = [e async for e in engine.run("hi")]
    # The repetition is only in the new block: the watcher read it there (text is only warned of).
    detected = [e for e in events if isinstance(e, DoomLoopDetected)]
    assert detected and all((s.channel, s.source) == ("text", "client") for d in detected for s in d.signals)
    assert isinstance(events[-1], TurnEnded) and events[-1].reason == "completed"
    assert [b.text for b in engine.messages[-1].content] == ["Plan.\n", chant.rstrip()]


async def test_a_delta_for_a_skipped_block_after_its_stop_is_still_passed_over() -> None:
    # A block type this mapper does not know streams nothing of the answer, before or after its end.
    body = sse(
        START,
        _start(0, type="future_block"),
        _delta(0, type="future_delta", value=1),
        _stop(0),
        _delta(0, type="future_delta", value=2),
        _start(1, type="text", text=""),
        _delta(1, type="text_delta", text="ok"),
        _stop(1),
        _end("end_turn"),
        STOP,
    )
    got, _ = await _run(body)
    assert [b["text"] for b in got["message"]["content"]] == ["ok"]


# -- error events whose values are of the wrong type -------------------------------------------


@pytest.mark.parametrize("named", [True, False], ids=["error-event", "bare-data"])
@pytest.mark.parametrize("kind", [["overloaded_error"], {"t": 1}, 529, True])
async def test_an_error_whose_type_is_not_a_string_is_the_servers_error(named: bool, kind: Any) -> None:
    # Its message is kept; with no type to read, it is not retried, as an error of no type.
    error = {"type": kind, "message": "upstream failed"}
    event = ("error", {"type": "error", "error": error}) if named else (None, {"error": error})
    server = MockServer(sse(START, event), headers={"request-id": "req_hdr"})
    async with server.client() as client:
        with pytest.raises(ProviderStreamError, match="upstream failed") as info:
            await collect(AnthropicModel("m", api_key=API_KEY, http_client=client))
    err = info.value
    assert (err.error_type, err.retryable, err.request_id) == (None, False, "req_hdr")
    assert server.streams[0].closed


@pytest.mark.parametrize("request_id", [7, ["req_1"], {"id": "req_1"}])
async def test_an_error_whose_request_id_is_not_a_string_keeps_the_headers(request_id: Any) -> None:
    event = ("error", {"type": "error", "error": {"type": "overloaded_error", "message": "Overloaded"},
                       "request_id": request_id})  # fmt: skip
    server = MockServer(sse(START, event), headers={"request-id": "req_hdr"})
    async with server.client() as client:
        with pytest.raises(ProviderStreamError) as info:
            await collect(AnthropicModel("m", api_key=API_KEY, http_client=client))
    assert (info.value.request_id, info.value.error_type, info.value.retryable) == ("req_hdr", "overloaded_error", True)


@pytest.mark.parametrize("message", [{"text": "Overloaded"}, ["Overloaded"], 503])
async def test_an_error_whose_message_is_not_a_string_is_quoted_as_text(message: Any) -> None:
    event = ("error", {"type": "error", "error": {"type": "overloaded_error", "message": message}})
    with pytest.raises(ProviderStreamError) as info:
        await _run(sse(START, event))
    assert isinstance(info.value.message, str) and str(message) in info.value.message
    assert (info.value.error_type, info.value.retryable) == ("overloaded_error", True)


# -- every way out closes the response, and never shows the key -----------------------------------


_FAILING = {
    "error event quoting the key": sse(START, ("error", {"type": "error", "error": {
        "type": "api_error", "message": f"bad key {API_KEY}"}})),
    "bare error of a list type quoting the key": sse(START, (None, {"error": {"type": [API_KEY], "message": API_KEY}})),
    "malformed text quoting the key": sse(START, _start(0, type="text", text=""), _delta(0, type="text_delta", text=[API_KEY])),
    "late call input": sse(START, *_LATE["tool input"][:2], _stop(0), _LATE["tool input"][2]),
    "cut": sse(START, _start(0, type="text", text=""), _delta(0, type="text_delta", text=f"{API_KEY}")),
    "malformed JSON quoting the key": sse(START, ("content_block_delta", f'{{"type": "content_block_delta", "x": "{API_KEY}"')),
}  # fmt: skip


@pytest.mark.parametrize("name", sorted(_FAILING))
async def test_a_failed_stream_is_closed_and_its_error_never_shows_the_key(name: str) -> None:
    server = MockServer(_FAILING[name])
    async with server.client() as client:
        with pytest.raises(ModelError) as info:
            await collect(AnthropicModel("m", api_key=API_KEY, http_client=client))
    err = info.value
    assert len(server.streams) == 1 and server.streams[0].closed
    for shown in (str(err), repr(err), err.message, repr(getattr(err, "body", None))):
        assert API_KEY not in shown


# -- the request: the last assistant turn never ends in whitespace ------------------------------


@pytest.mark.parametrize(
    "tail",
    [
        [TextBlock(text="Searching now  \n")],
        [TextBlock(text="Searching now \t"), ThinkingBlock(thinking="x", signature="c2ln")],
        [TextBlock(text="Searching now \n"), TextBlock(text=" \n")],
    ],
    ids=["text", "text-then-thinking", "blank-text-after"],
)
def test_the_last_assistant_turn_of_a_request_never_ends_in_whitespace(tail: list[Any]) -> None:
    # The API refuses a final assistant turn whose content ends in whitespace; what `_fit` drops
    # (thinking at the end) or `turns` drops (blank text) can leave one so.
    body = build_request(
        request(Message.user("hi"), Message(role="assistant", content=tail)),
        model="m",
        max_tokens=100,
        thinking=None,
    )
    last = body["messages"][-1]
    assert last["role"] == "assistant"
    assert last["content"][-1] == {"type": "text", "text": "Searching now"}


def test_building_the_request_leaves_a_hosts_provider_block_as_it_was() -> None:
    # Stripped in the request, on a copy: the block's data is the host's, and the transcript's.
    data = {"type": "text", "text": "Searching now  "}
    block = ProviderBlock(provider="anthropic", data=data)
    body = build_request(
        request(Message.user("hi"), Message(role="assistant", content=[block])), model="m", max_tokens=100, thinking=None
    )
    assert body["messages"][-1]["content"][-1] == {"type": "text", "text": "Searching now"}
    assert data == {"type": "text", "text": "Searching now  "} and block.data == data


@pytest.mark.parametrize(
    "after",
    [
        [_start(1, type="thinking", thinking="", signature=""), _delta(1, type="thinking_delta", thinking="hmm"),
         _delta(1, type="signature_delta", signature="c2ln"), _stop(1)],
        [_start(1, type="redacted_thinking", data="cmVk"), _stop(1)],
    ],
    ids=["thinking", "redacted"],
)  # fmt: skip
async def test_a_turns_text_is_sent_the_same_whether_its_turn_is_the_last_or_not(after: list[Any]) -> None:
    # Text followed only by thinking, which the request leaves out at the end of a turn: committed
    # without its trailing whitespace, so the request that ends with this turn (a paused response
    # sent back) and the next one send it byte for byte alike, and a prompt cache written by the
    # one is read by the other.
    body = sse(START, _start(0, type="text", text=""), _delta(0, type="text_delta", text="Let me think  \n"),
               _stop(0), *after, _end("end_turn"), STOP)  # fmt: skip
    server = MockServer(body)
    async with server.client() as client:
        _, acc = await collect(AnthropicModel("m", api_key=API_KEY, http_client=client))
    turn = acc.committable()
    assert turn is not None and turn.content[0] == TextBlock(text="Let me think")
    assert acc.message().content[0] == TextBlock(text="Let me think  \n")  # shown as streamed
    last = build_request(request(Message.user("hi"), turn), model="m", max_tokens=100, thinking=None)
    nxt = build_request(request(Message.user("hi"), turn, Message.user("go on")), model="m", max_tokens=100, thinking=None)
    sent, then = json.dumps(last["messages"]).encode(), json.dumps(nxt["messages"]).encode()
    assert then.startswith(sent[:-1])


def test_whitespace_is_kept_in_an_assistant_turn_that_is_not_the_last() -> None:
    body = build_request(
        request(Message.user("hi"), Message(role="assistant", content=[TextBlock(text="Well  ")]), Message.user("go on")),
        model="m",
        max_tokens=100,
        thinking=None,
    )
    assert body["messages"][1]["content"] == [{"type": "text", "text": "Well  "}]


# -- usage, and an interrupted transcript, through the engine -------------------------------------


class _Server:
    """One canned body per request, in turn (the last one held open once sent: a model still
    streaming), recording the requests' JSON bodies."""

    def __init__(self, *bodies: bytes, hang: bool = True) -> None:
        self.bodies = list(bodies)
        self.hang = hang
        self.sent: list[dict[str, Any]] = []
        self.streams: list[RecordingStream] = []

    def handler(self, req: httpx.Request) -> httpx.Response:
        self.sent.append(json.loads(req.content))
        body = self.bodies[len(self.sent) - 1]
        stream = RecordingStream([body], hang=self.hang and len(self.sent) == 1)
        self.streams.append(stream)
        return httpx.Response(200, headers={"content-type": "text/event-stream"}, stream=stream)


async def test_usage_of_message_start_and_message_delta_is_counted_once_with_the_later_output() -> None:
    body = sse(
        ("message_start", {"type": "message_start", "message": {"id": "msg_1", "usage": {
            "input_tokens": 5, "output_tokens": 1, "cache_read_input_tokens": 100}}}),
        _start(0, type="text", text=""), _delta(0, type="text_delta", text="hi"), _stop(0),
        ("message_delta", {"type": "message_delta", "delta": {"stop_reason": "end_turn"},
                           "usage": {"output_tokens": 9, "cache_read_input_tokens": 100}}),
        STOP,
    )  # fmt: skip
    server = MockServer(body)
    async with server.client() as client:
        engine = QueryEngine(AnthropicModel("m", api_key=API_KEY, http_client=client), policies=[])
        events = [e async for e in engine.run("hi")]
    end = events[-1]
    assert isinstance(end, TurnEnded) and end.reason == "completed"
    assert end.usage == Usage(input_tokens=105, output_tokens=9, cache_read_tokens=100, cache_write_tokens=0)


async def _lookup(args: dict[str, Any], ctx: Any) -> str:
    return "found"


async def test_a_stream_interrupted_inside_a_tool_call_leaves_a_transcript_the_next_request_sends_validly() -> None:
    # Text ending in whitespace, a whole call, then a call cut inside its input: interrupted there.
    first = sse(
        START,
        _start(0, type="text", text=""), _delta(0, type="text_delta", text="Let me look  \n"), _stop(0),
        _start(1, type="tool_use", id="toolu_1", name="lookup", input={}),
        _delta(1, type="input_json_delta", partial_json='{"q": "a"}'), _stop(1),
        _start(2, type="tool_use", id="toolu_2", name="lookup", input={}),
        _delta(2, type="input_json_delta", partial_json='{"q": "b'),
    )  # fmt: skip
    second = sse(START, _start(0, type="text", text=""), _delta(0, type="text_delta", text="ok"), _stop(0),
                 _end("end_turn"), STOP)  # fmt: skip
    server = _Server(first, second)
    tool = AgentTool("lookup", "Look a word up", {"type": "object", "properties": {"q": {"type": "string"}}}, _lookup)
    async with httpx.AsyncClient(transport=httpx.MockTransport(server.handler)) as client:
        engine = QueryEngine(AnthropicModel("m", api_key=API_KEY, http_client=client), tools=[tool], policies=[])
        async for event in engine.run("hi"):
            if isinstance(event, ToolInputDelta) and event.tool_use_id == "toolu_2" and event.partial_json:
                engine.interrupt()
        events = [e async for e in engine.run("go on")]
    assert isinstance(events[-1], TurnEnded) and events[-1].reason == "completed"
    assert all(s.closed for s in server.streams)
    messages = server.sent[1]["messages"]
    assert [m["role"] for m in messages] == ["user", "assistant", "user"]
    calls = [b["id"] for b in messages[1]["content"] if b["type"] == "tool_use"]
    results = [b for b in messages[2]["content"] if b["type"] == "tool_result"]
    assert calls and sorted(calls) == sorted(r["tool_use_id"] for r in results)
    assert messages[2]["content"][: len(results)] == results  # the results first
    assert all(r.get("is_error") for r in results)  # interrupted, never run
    for m in messages:
        for b in m["content"] if isinstance(m["content"], list) else []:
            if b["type"] == "text":
                assert b["text"].strip()
    # Not the last turn: its text goes as it was streamed (only a final assistant turn may not end in whitespace).
    assert messages[1]["content"][0] == {"type": "text", "text": "Let me look  \n"}


# -- a stop reason sent again ---------------------------------------------------------------------


def _mapped(events: list[tuple[str, dict[str, Any]]]) -> list[Any]:
    from agentloop.models._sse import ServerSentEvent
    from agentloop.models.anthropic._stream import AnthropicMapper

    mapper, out = AnthropicMapper(), []
    for name, obj in events:
        out.extend(mapper.handle(ServerSentEvent(json.dumps(obj), name)) or ())
    return out


def _reason(events: list[tuple[str, dict[str, Any]]]) -> Any:
    return _mapped(events)[-1].stop_reason


_TEXT = [START, _start(0, type="text", text=""), _delta(0, type="text_delta", text="a"), _stop(0)]


@pytest.mark.parametrize(
    ("first", "then", "ends"),
    [
        ("max_tokens", "end_turn", "max_tokens"),
        ("end_turn", "max_tokens", "end_turn"),
        ("tool_use", "end_turn", "tool_use"),
        ("end_turn", "refusal", "refusal"),
        ("max_tokens", "max_tokens", "max_tokens"),
    ],
)
def test_the_first_stop_reason_decides_when_no_output_came_since(
    first: str, then: str, ends: str, caplog: pytest.LogCaptureFixture
) -> None:
    assert _reason([*_TEXT, _end(first), _end(then), STOP]) == ends
    warned = [r for r in caplog.records if "stop_reason" in r.getMessage()]
    assert len(warned) == (first != then)


def test_a_stop_reason_differing_again_is_warned_of_once(caplog: pytest.LogCaptureFixture) -> None:
    assert _reason([*_TEXT, _end("max_tokens"), _end("end_turn"), _end("stop_sequence"), STOP]) == "max_tokens"
    assert len([r for r in caplog.records if "stop_reason" in r.getMessage()]) == 1


def test_a_stop_reason_after_output_that_came_after_the_first_decides() -> None:
    events = [*_TEXT, _end("max_tokens"), _start(1, type="text", text=""), _delta(1, type="text_delta", text="b"),
              _stop(1), _end("end_turn"), STOP]  # fmt: skip
    assert _reason(events) == "end_turn"


@pytest.mark.parametrize("bad", [5, ["x"], {"a": 1}, True])
def test_a_malformed_stop_reason_after_a_settled_one_is_warned_of_and_ignored(
    bad: Any, caplog: pytest.LogCaptureFixture
) -> None:
    late = ("message_delta", {"type": "message_delta", "delta": {"stop_reason": bad}, "usage": {"output_tokens": 3}})
    assert _reason([*_TEXT, _end("end_turn"), late, STOP]) == "end_turn"
    assert any("stop_reason" in r.getMessage() for r in caplog.records)


@pytest.mark.parametrize("bad", [5, ["x"]])
def test_a_malformed_stop_reason_with_none_settled_fails_the_answer_unretried(bad: Any) -> None:
    late = ("message_delta", {"type": "message_delta", "delta": {"stop_reason": bad}, "usage": {"output_tokens": 3}})
    with pytest.raises(StreamProtocolError) as caught:
        _mapped([*_TEXT, late, STOP])
    assert caught.value.retryable is False


@pytest.mark.parametrize("data", [" ", "  \n"])
def test_an_error_event_of_whitespace_reads_stream_error(data: str) -> None:
    from agentloop.models._sse import ServerSentEvent
    from agentloop.models.anthropic._stream import AnthropicMapper

    with pytest.raises(ProviderStreamError) as caught:
        AnthropicMapper().handle(ServerSentEvent(data, "error"))
    assert str(caught.value) == "anthropic stream error: stream error"


_REASONS = st.sampled_from(["end_turn", "max_tokens", "stop_sequence", "tool_use", "pause_turn", "refusal"])


@settings(max_examples=60, deadline=None)
@given(st.lists(st.one_of(_REASONS, st.integers(), st.lists(st.text(max_size=3), max_size=2)), min_size=1, max_size=5)
       .filter(lambda rs: type(rs[0]) is str))  # fmt: skip
def test_with_no_output_between_them_the_first_stop_reason_or_a_refusal_ends_the_answer(reasons: list[Any]) -> None:
    ends = _reason([*_TEXT, *(("message_delta", {"type": "message_delta", "delta": {"stop_reason": r}}) for r in reasons),
                    STOP])  # fmt: skip
    assert ends == ("refusal" if "refusal" in reasons else reasons[0])
