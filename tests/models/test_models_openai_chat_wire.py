"""OpenAIChatModel over the Chat Completions wire as servers really write it: the recorded
streams re-encoded (UTF-8 beyond ASCII, CRLF line ends, one event's JSON over several
``data:`` lines) and cut at any byte, and a ``finish_reason`` sent again on a later chunk."""

from __future__ import annotations

import json
from typing import Any

import pytest
from _models_support import API_KEY, MockServer, chat_chunk, chat_stream, collect, final, load, split
from hypothesis import given
from hypothesis import strategies as st

from agentloop._accumulate import Accumulator
from agentloop._errors import ProviderStatusError, ProviderStreamError
from agentloop.models import OpenAIChatModel, StreamEnd, StreamEvent, StreamSignals

CHAT_FIXTURES = [
    "openai_chat_logprobs.recorded.sse",
    "openai_chat_parallel_tools.recorded.sse",
    "openai_chat_text.recorded.sse",
    "openai_chat_tool.recorded.sse",
]

USAGE = {"id": "chatcmpl-1", "choices": [], "usage": {"prompt_tokens": 9, "completion_tokens": 2}}


def _widen(chunk: dict[str, Any]) -> dict[str, Any]:
    """``chunk`` with characters beyond ASCII in what the answer keeps: each text piece gains
    some, and the letters ``e`` and ``o`` of a call's arguments (only ever inside their JSON
    strings in these recordings) become ``é`` and ``ö``."""
    for choice in chunk.get("choices") or ():
        delta = choice.get("delta") or {}
        if delta.get("content"):
            delta["content"] += " é—🙂"
        for call in delta.get("tool_calls") or ():
            fn = call.get("function") or {}
            if fn.get("arguments"):
                fn["arguments"] = fn["arguments"].replace("e", "é").replace("o", "ö")
    return chunk


def reencoded(name: str) -> bytes:
    """The recorded stream ``name`` written again: each chunk's JSON with its characters as
    they are (not ``\\u`` escapes) and spread over several ``data:`` lines (one a JSON token
    or so: the lines are joined with a line feed, whitespace between tokens), every line
    ended with CRLF."""
    out: list[str] = []
    for line in load(name).decode().splitlines():
        if not line.startswith("data: "):
            continue
        data = line[len("data: ") :]
        if data == "[DONE]":
            out.append("data: [DONE]\r\n\r\n")
            continue
        text = json.dumps(_widen(json.loads(data)), ensure_ascii=False, indent=1)
        out.append("".join(f"data: {part}\r\n" for part in text.split("\n")) + "\r\n")
    return "".join(out).encode()


async def _run(body: bytes | list[bytes]) -> tuple[list[StreamEvent], Accumulator]:
    server = MockServer(body)
    async with server.client() as client:
        events, acc = await collect(OpenAIChatModel("m", api_key=API_KEY, http_client=client))
    assert all(s.closed for s in server.streams)
    return events, acc


def _inside_characters(body: bytes) -> list[int]:
    """The offsets in ``body`` that fall inside a UTF-8 character (on a continuation byte)."""
    return [i for i, b in enumerate(body) if b & 0xC0 == 0x80]


def _inside_line_ends(body: bytes) -> list[int]:
    """The offsets in ``body`` between the CR and the LF of a line that an event's next
    ``data:`` line follows."""
    return [i + 1 for i in range(len(body) - 2) if body[i : i + 3] == b"\r\nd" and body[i - 2 : i] != b"\r\n"]


@pytest.mark.parametrize("name", CHAT_FIXTURES)
async def test_the_reencoded_streams_are_what_they_claim(name: str) -> None:
    body = reencoded(name)
    assert any(b > 127 for b in body)  # UTF-8 beyond ASCII, written as it is
    assert b"\\u" not in body
    assert b"\r\n" in body and b"\n" not in body.replace(b"\r\n", b"")
    assert body.count(b"data: ") > 2 * body.count(b"\r\n\r\n")  # several data lines an event
    events, acc = await _run(body)
    assert isinstance(events[-1], StreamEnd)
    message = acc.message()
    if "tool" in name:
        inputs = [json.dumps(b.input, ensure_ascii=False) for b in message.tool_uses]
        assert inputs and all("é" in i or "ö" in i for i in inputs)
    else:
        assert "é—🙂" in message.text


@pytest.mark.parametrize("name", CHAT_FIXTURES)
@given(data=st.data())
async def test_a_reencoded_stream_cut_at_any_bytes_gives_the_same_events_and_message(
    name: str, data: st.DataObject
) -> None:
    body = reencoded(name)
    whole_events, whole = await _run(body)
    # One cut always falls inside a character, so reading each piece as UTF-8 of its own would
    # garble it; one between the CR and the LF of a line inside an event, so reading them as two
    # line ends would end the event there, its JSON cut; the others fall anywhere.
    inside = data.draw(st.sampled_from(_inside_characters(body)), label="inside a character")
    crlf = data.draw(st.sampled_from(_inside_line_ends(body)), label="between CR and LF")
    cuts = data.draw(st.lists(st.integers(1, len(body) - 1), max_size=30), label="cuts")
    events, acc = await _run(split(body, [inside, crlf, *cuts]))
    assert events == whole_events
    assert final(acc) == final(whole)


# -- a finish_reason sent again ---------------------------------------------------------


@pytest.mark.parametrize(
    ("first", "then", "reason"),
    [
        ("length", "stop", "max_tokens"),
        ("content_filter", "stop", "refusal"),
        ("stop", "length", "end_turn"),
        ("stop", "abort", "end_turn"),
        ("stop", "error", "end_turn"),
        ("stop", "stop", "end_turn"),
    ],
)
async def test_the_first_finish_reason_decides_however_later_chunks_repeat_or_change_it(
    first: str, then: str, reason: str, caplog: pytest.LogCaptureFixture
) -> None:
    body = chat_stream(chat_chunk({"content": "hi"}), chat_chunk({}, first), chat_chunk({}, then), USAGE)
    with caplog.at_level("WARNING", logger="agentloop"):
        events, acc = await _run(body)
    assert acc.stop_reason == reason
    assert acc.message().text == "hi"
    assert isinstance(events[-1], StreamEnd)
    warned = [r.getMessage() for r in caplog.records if "finish_reason" in r.getMessage()]
    if then == first:
        assert warned == []
    else:
        assert len(warned) == 1 and repr(then) in warned[0] and repr(first) in warned[0]


async def test_a_repetition_finish_sent_again_signals_once() -> None:
    body = chat_stream(
        chat_chunk({"content": "la la"}), chat_chunk({}, "repetition"), chat_chunk({}, "repetition"), USAGE
    )
    events, acc = await _run(body)
    assert acc.stop_reason == "repetition"
    assert len([e for e in events if isinstance(e, StreamSignals)]) == 1


async def test_a_changed_finish_reason_is_warned_of_once_however_many_chunks_carry_it(
    caplog: pytest.LogCaptureFixture,
) -> None:
    later = [chat_chunk({}, "stop") for _ in range(5)]
    body = chat_stream(chat_chunk({"content": "hi"}), chat_chunk({}, "length"), *later, USAGE)
    with caplog.at_level("WARNING", logger="agentloop"):
        _, acc = await _run(body)
    assert acc.stop_reason == "max_tokens"
    assert len([r for r in caplog.records if "finish_reason" in r.getMessage()]) == 1


# -- errors in the body of a 200 -----------------------------------------------------------

_KEYED = f"Incorrect API key provided: {API_KEY}."


@pytest.mark.parametrize(
    ("body", "headers", "kind", "retryable"),
    [
        # An error chunk with a code that is a word, with one that is a status, with none.
        (chat_stream({"error": {"message": _KEYED, "type": "server_error", "code": None}}), None,
         ProviderStreamError, True),
        (chat_stream(chat_chunk({"content": "hi"}), {"error": {"message": _KEYED, "code": 502}}), None,
         ProviderStreamError, True),
        (chat_stream({"error": {"message": _KEYED, "type": "invalid_request_error"}}), None,
         ProviderStreamError, False),
        # A 200 whose body is a JSON error, not an event stream, whatever its content type says.
        (json.dumps({"error": {"message": _KEYED, "type": "server_error"}}).encode(),
         {"content-type": "application/json"}, ProviderStatusError, True),
        (json.dumps({"error": {"message": _KEYED, "type": "invalid_request_error"}}).encode(), None,
         ProviderStatusError, False),
        # A finish_reason "error" whose detail quotes the key.
        (chat_stream({"id": "c", "choices": [{"index": 0, "delta": {}, "finish_reason": "error",
                                              "error": {"message": _KEYED}}]}), None,
         ProviderStreamError, True),
    ],
)  # fmt: skip
async def test_an_error_in_a_200_body_is_raised_without_the_key_and_the_response_is_closed(
    body: bytes, headers: dict[str, str] | None, kind: type[Exception], retryable: bool
) -> None:
    server = MockServer(body, headers=headers)
    async with server.client() as client:
        with pytest.raises(kind) as caught:
            await collect(OpenAIChatModel("m", api_key=API_KEY, http_client=client))
    err = caught.value
    assert getattr(err, "retryable", None) is retryable
    assert "Incorrect API key provided" in str(err)
    for text in (str(err), repr(err), repr(vars(err)), repr(getattr(err, "body", None))):
        assert API_KEY not in text
    assert server.streams and all(s.closed for s in server.streams)


async def test_an_unknown_finish_reason_sent_after_the_first_is_not_quoted(caplog: pytest.LogCaptureFixture) -> None:
    echoed = f"bad key {API_KEY}"
    body = chat_stream(chat_chunk({"content": "hi"}), chat_chunk({}, "stop"), chat_chunk({}, echoed), USAGE)
    with caplog.at_level("WARNING", logger="agentloop"):
        _, acc = await _run(body)
    assert acc.stop_reason == "end_turn"
    warned = [r.getMessage() for r in caplog.records]
    assert len(warned) == 1 and "'stop'" in warned[0] and "does not know" in warned[0]
    assert not any(API_KEY.lower() in w.lower() for w in warned)


# -- output after a finish_reason (gateways that put "stop" on every chunk) ---------------


def _tool(index: int, id: str | None = None, name: str | None = None, args: str | None = None) -> dict[str, Any]:
    fn = {k: v for k, v in (("name", name), ("arguments", args)) if v is not None}
    return {"index": index, **({"id": id, "type": "function"} if id else {}), "function": fn}


async def _warned(body: bytes, caplog: pytest.LogCaptureFixture) -> tuple[list[StreamEvent], Accumulator, list[str]]:
    with caplog.at_level("WARNING", logger="agentloop"):
        events, acc = await _run(body)
    return events, acc, [r.getMessage() for r in caplog.records if r.levelname == "WARNING"]


@given(pieces=st.lists(st.text(min_size=1, max_size=5), min_size=1, max_size=8), finished=st.data())
async def test_an_answer_with_a_finish_reason_on_every_chunk_is_kept_whole(pieces: list[str], finished: Any) -> None:
    # LiteLLM on Gemini, one-api, one-hub: "stop" on every chunk (or on some), the answer is all of them.
    stops = finished.draw(st.lists(st.booleans(), min_size=len(pieces), max_size=len(pieces)), label="stops")
    chunks = [chat_chunk({"content": p}, "stop" if s or i == len(pieces) - 1 else None)
              for i, (p, s) in enumerate(zip(pieces, stops, strict=True))]  # fmt: skip
    _, acc = await _run(chat_stream(*chunks, USAGE))
    assert acc.message().text == "".join(pieces)
    assert acc.stop_reason == "end_turn"


async def test_stop_on_every_chunk_keeps_the_whole_text_without_a_warning(caplog: pytest.LogCaptureFixture) -> None:
    body = chat_stream(*(chat_chunk({"content": p}, "stop") for p in ("Hello", " world", "!")), USAGE)
    _, acc, warned = await _warned(body, caplog)
    assert (acc.message().text, acc.stop_reason, warned) == ("Hello world!", "end_turn", [])


@pytest.mark.parametrize(
    ("chunks", "reason"),
    [
        # gcli2api: the reasoning chunk and the tool-call chunk both carry "stop".
        ([chat_chunk({"reasoning_content": "weather, so a call"}, "stop"),
          chat_chunk({"tool_calls": [_tool(0, "c1", "weather", '{"city": "Oslo"}')]}, "stop")], "tool_use"),
        # A merging gateway: "stop" on the text, then the calls, then "tool_calls".
        ([chat_chunk({"content": "Let me look."}, "stop"),
          chat_chunk({"tool_calls": [_tool(0, "c1", "weather", "")]}),
          chat_chunk({"tool_calls": [_tool(0, args='{"city": "Oslo"}')]}),
          chat_chunk({}, "tool_calls")], "tool_use"),
        # The same, with no reason after the calls: the calls still end the turn as tool_use.
        ([chat_chunk({"content": "Let me look."}, "stop"),
          chat_chunk({"tool_calls": [_tool(0, "c1", "weather", '{"city": "Oslo"}')]})], "tool_use"),
    ],
    ids=["reasoning-then-call", "text-then-call-then-tool-calls", "text-then-call"],
)  # fmt: skip
async def test_a_tool_call_after_a_finish_reason_is_kept_and_ends_the_turn_as_tool_use(
    chunks: list[dict[str, Any]], reason: str, caplog: pytest.LogCaptureFixture
) -> None:
    _, acc, warned = await _warned(chat_stream(*chunks, USAGE), caplog)
    (use,) = acc.committable().tool_uses
    assert (use.id, use.name, use.input) == ("c1", "weather", {"city": "Oslo"})
    assert acc.stop_reason == reason and warned == []


async def test_the_reason_after_the_last_output_decides(caplog: pytest.LogCaptureFixture) -> None:
    # "stop" then more text then "length": the answer was cut by the token limit after all.
    body = chat_stream(chat_chunk({"content": "Hi"}, "stop"), chat_chunk({"content": " there"}),
                       chat_chunk({}, "length"), chat_chunk({}, "stop"), USAGE)  # fmt: skip
    _, acc, warned = await _warned(body, caplog)
    assert (acc.message().text, acc.stop_reason) == ("Hi there", "max_tokens")
    assert len(warned) == 1 and "'stop'" in warned[0] and "'length'" in warned[0]


@pytest.mark.parametrize("first", ["stop", "length", "tool_calls"])
async def test_a_content_filter_after_the_finish_reason_makes_the_answer_a_refusal(
    first: str, caplog: pytest.LogCaptureFixture
) -> None:
    # A filter's verdict that comes late is not dropped: the host is told the answer was filtered.
    body = chat_stream(chat_chunk({"content": "hi"}), chat_chunk({}, first), chat_chunk({}, "content_filter"), USAGE)
    _, acc, warned = await _warned(body, caplog)
    assert (acc.message().text, acc.stop_reason) == ("hi", "refusal")
    assert len(warned) == 1 and "'content_filter'" in warned[0]


@pytest.mark.parametrize("late", [1, ["stop"], {"reason": "stop"}, True])
async def test_a_later_finish_reason_that_is_not_a_string_is_ignored_with_one_warning(
    late: Any, caplog: pytest.LogCaptureFixture
) -> None:
    later = [{"id": "chatcmpl-1", "choices": [{"index": 0, "delta": {}, "finish_reason": late}]}] * 3
    body = chat_stream(chat_chunk({"content": "hi"}), chat_chunk({}, "stop"), *later, USAGE)
    _, acc, warned = await _warned(body, caplog)
    assert (acc.message().text, acc.stop_reason) == ("hi", "end_turn")
    assert len(warned) == 1 and "'stop'" in warned[0]


async def test_output_after_a_repetition_finish_is_left_out_and_signals_once(caplog: pytest.LogCaptureFixture) -> None:
    # The server judged the output a loop and cut it there: what it sends after is no part of it.
    body = chat_stream(chat_chunk({"content": "la la"}), chat_chunk({}, "repetition"),
                       chat_chunk({"content": " la"}, "repetition"), USAGE)  # fmt: skip
    events, acc, warned = await _warned(body, caplog)
    assert (acc.message().text, acc.stop_reason) == ("la la", "repetition")
    assert len([e for e in events if isinstance(e, StreamSignals)]) == 1
    assert len(warned) == 1 and "'repetition'" in warned[0]


@pytest.mark.parametrize(
    ("chunks", "text"),
    [
        ([chat_chunk({"content": "hi"}, "content_filter"), chat_chunk({"content": " more"}, "stop")], "hi"),
        # Gemini's own reasons, passed on by a gateway (upper case).
        ([chat_chunk({"content": "hi"}, "SAFETY"), chat_chunk({"content": " more"}, "STOP")], "hi"),
        ([chat_chunk({"content": "hi"}), chat_chunk({}, "content_filter"),
          chat_chunk({"tool_calls": [_tool(0, "c1", "weather", "{}")]}, "tool_calls")], "hi"),
    ],
    ids=["content-filter-then-text", "safety-then-text", "content-filter-then-call"],
)  # fmt: skip
async def test_output_after_a_filter_verdict_is_left_out_and_the_answer_is_a_refusal(
    chunks: list[dict[str, Any]], text: str, caplog: pytest.LogCaptureFixture
) -> None:
    # A filter stopped the answer: what follows is no part of it, and it is never passed off
    # as a normal end (nor as a tool call to run).
    _, acc, warned = await _warned(chat_stream(*chunks, USAGE), caplog)
    message = acc.message()
    assert (message.text, message.tool_uses, acc.stop_reason) == (text, [], "refusal")
    assert len(warned) == 1 and "after its finish_reason" in warned[0]


_WHOLE = "Hello world, how are you?"


@pytest.mark.parametrize(
    ("chunks", "thinking"),
    [
        # The answer, its finish, then the whole answer again in one chunk (an aggregating gateway).
        ([chat_chunk({"content": "Hello world,"}), chat_chunk({"content": " how are you?"}), chat_chunk({}, "stop"),
          chat_chunk({"role": "assistant", "content": _WHOLE}, "stop")], ""),
        # "stop" on every chunk, the last the whole of it.
        ([chat_chunk({"content": "Hello world,"}, "stop"), chat_chunk({"content": " how are you?"}, "stop"),
          chat_chunk({"content": _WHOLE}, "stop")], ""),
        # The reasoning and the text, each sent whole again.
        ([chat_chunk({"reasoning_content": "A greeting, "}), chat_chunk({"reasoning_content": "so greet back."}),
          chat_chunk({"content": "Hello world,"}), chat_chunk({"content": " how are you?"}, "stop"),
          chat_chunk({"reasoning_content": "A greeting, so greet back.", "content": _WHOLE}, "stop")],
         "A greeting, so greet back."),
    ],
    ids=["after-the-finish", "stop-on-every-chunk", "reasoning-and-text"],
)  # fmt: skip
async def test_the_whole_answer_sent_again_after_the_finish_is_left_out_once(
    chunks: list[dict[str, Any]], thinking: str, caplog: pytest.LogCaptureFixture
) -> None:
    _, acc, warned = await _warned(chat_stream(*chunks, USAGE), caplog)
    message = acc.message()
    said = "".join(getattr(b, "thinking", "") for b in message.content)
    assert (message.text, said, acc.stop_reason) == (_WHOLE, thinking, "end_turn")
    assert len(warned) == 1 and "again" in warned[0] and _WHOLE not in warned[0]


@pytest.mark.parametrize(
    ("text", "kept"),
    [("a", "aa"), ("Hello there!", "Hello there!Hello there!"), ("x" * 15, "x" * 30), ("x" * 16, "x" * 16)],
    ids=["one-character", "short", "15-characters", "16-characters"],
)
async def test_a_repeat_after_the_finish_is_a_resend_only_from_16_characters(
    text: str, kept: str, caplog: pytest.LogCaptureFixture
) -> None:
    # A short piece equal to all the text so far may well be the model's next piece ("a", "a"):
    # it is kept; from 16 characters, it is read as the answer sent again.
    body = chat_stream(chat_chunk({"content": text}, "stop"), chat_chunk({"content": text}, "stop"), USAGE)
    _, acc, warned = await _warned(body, caplog)
    assert (acc.message().text, acc.stop_reason, len(warned)) == (kept, "end_turn", int(kept == text))
