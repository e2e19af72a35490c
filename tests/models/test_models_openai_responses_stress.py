"""OpenAIResponsesModel under stress: any chunking of a stream (inside a UTF-8 character, between a
CR and its LF, in an event of several data lines), events after an item's end,
malformed values that quote the server's data, a failed response's error in words."""

from __future__ import annotations

import json
from typing import Any

import pytest
from _models_support import (
    API_KEY,
    MockServer,
    collect,
    ev,
    final,
    load,
    model_error_run,
    request,
    run_fixture,
    split,
    sse,
)
from _models_support import run_responses as run_body
from hypothesis import given, settings
from hypothesis import strategies as st

from agentloop._abort import AbortController
from agentloop._errors import ProviderStreamError, StreamProtocolError
from agentloop.models import OpenAIResponsesModel, StreamBlockStop, StreamText, StreamThinking

CREATED = ev("response.created", response={"id": "resp_1", "status": "in_progress"})
COMPLETED = ev("response.completed", response={"id": "resp_1", "status": "completed",
                                               "usage": {"input_tokens": 3, "output_tokens": 4}})  # fmt: skip
MSG = {"id": "msg_1", "type": "message", "role": "assistant", "content": []}
CALL = {"id": "fc_1", "call_id": "call_1", "type": "function_call", "name": "f", "arguments": ""}


def _crlf(body: bytes) -> bytes:
    return body.replace(b"\n", b"\r\n")


def _utf8(*events: tuple[str, Any]) -> bytes:
    """`sse` with the JSON written as servers write it, non-ASCII characters as themselves
    (``sse``'s json.dumps escapes them, and its body would be ASCII only)."""
    return sse(*((name, json.dumps(data, ensure_ascii=False)) for name, data in events))


#: A stream whose text, thinking and arguments hold characters of two, three and four bytes.
_WIDE = _utf8(
    CREATED,
    ev("response.output_item.added", output_index=0, item={"id": "rs_1", "type": "reasoning", "summary": []}),
    ev("response.reasoning_summary_text.delta", output_index=0, item_id="rs_1", summary_index=0, delta="Ça va 😀"),
    ev("response.output_item.done", output_index=0,
       item={"id": "rs_1", "type": "reasoning", "summary": [{"type": "summary_text", "text": "Ça va 😀"}]}),
    ev("response.output_item.added", output_index=1, item=MSG),
    ev("response.output_text.delta", output_index=1, item_id="msg_1", content_index=0, delta="né€"),
    ev("response.output_text.delta", output_index=1, item_id="msg_1", content_index=0, delta="𝄞 ok"),
    ev("response.output_item.done", output_index=1,
       item={**MSG, "content": [{"type": "output_text", "text": "né€𝄞 ok"}]}),
    ev("response.output_item.added", output_index=2, item={**CALL, "id": "fc_2"}),
    ev("response.function_call_arguments.delta", output_index=2, item_id="fc_2", delta='{"q": "日本'),
    ev("response.function_call_arguments.delta", output_index=2, item_id="fc_2", delta='語"}'),
    ev("response.output_item.done", output_index=2, item={**CALL, "id": "fc_2", "arguments": '{"q": "日本語"}'}),
    COMPLETED,
)  # fmt: skip

#: A stream whose events' data span several ``data:`` lines, one of them named by its
#: ``event:`` line alone (its data has no ``type``).
_LINES = (
    sse(CREATED, ev("response.output_item.added", output_index=0, item=MSG))
    + b'event: response.output_text.delta\ndata: {"output_index": 0,\ndata: "item_id": "msg_1",\n'
    b'data: "content_index": 0, "delta": "Hi"}\n\n'
    + b'event: response.output_text.delta\ndata: {"type": "response.output_text.delta",\n'
    b'data:  "output_index": 0, "item_id": "msg_1",\ndata:"content_index": 0,\ndata: "delta": " there"}\n\n'
    + sse(
        ev("response.output_item.done", output_index=0,
           item={**MSG, "content": [{"type": "output_text", "text": "Hi there"}]}),
        COMPLETED,
    )
)  # fmt: skip

_BODIES = {
    "text": load("openai_responses_text.prism.sse"),
    "reasoning-call": load("openai_responses_reasoning_function_call.prism.sse"),
    "wide": _WIDE,
    "lines": _LINES,
}


def test_the_streams_hold_what_their_cuts_must_fall_inside() -> None:
    assert max(_WIDE) > 127  # UTF-8 of several bytes, not \u escapes
    assert b"\ndata: " in _LINES.replace(b"\ndata: {", b"")  # an event's data on several lines


async def _outcome(body: bytes | list[bytes]) -> dict[str, Any]:
    events, acc = await run_fixture("openai_responses_text.prism.sse", body)
    return {"events": events, **final(acc)}


@settings(max_examples=60, deadline=None)
@given(st.sampled_from(sorted(_BODIES)), st.booleans(), st.data())
async def test_any_stream_cut_anywhere_gives_the_same_events_and_message(name: str, crlf: bool, data: st.DataObject) -> None:
    # Cuts fall anywhere: inside a multi-byte character, between the CR and the LF of a line end.
    whole = _BODIES[name]
    body = _crlf(whole) if crlf else whole
    cuts = data.draw(st.lists(st.integers(1, len(body) - 1), max_size=30))
    assert await _outcome(split(body, cuts)) == await _outcome(whole)


def _crlf_cuts(body: bytes) -> list[int]:
    """The offsets between the CR and the LF of each line end of ``body``."""
    return [i for i in range(1, len(body)) if body[i - 1 : i + 1] == b"\r\n"]


def _char_cuts(body: bytes) -> list[int]:
    """The offsets inside a character of several bytes (before each continuation byte)."""
    return [i for i in range(1, len(body)) if 0x80 <= body[i] < 0xC0]


async def test_a_stream_cut_inside_every_wide_character_gives_the_same_outcome() -> None:
    assert await _outcome(split(_WIDE, _char_cuts(_WIDE))) == await _outcome(_WIDE)


@settings(max_examples=30, deadline=None)
@given(st.booleans(), st.data())
async def test_a_wide_stream_cut_inside_some_characters_and_anywhere_gives_the_same_outcome(crlf: bool, data: st.DataObject) -> None:
    body = _crlf(_WIDE) if crlf else _WIDE
    cuts = data.draw(st.lists(st.sampled_from(_char_cuts(body)), min_size=1, max_size=10))
    cuts += data.draw(st.lists(st.integers(1, len(body) - 1), max_size=10))
    assert await _outcome(split(body, cuts)) == await _outcome(_WIDE)


@pytest.mark.parametrize("name", sorted(_BODIES))
async def test_a_crlf_stream_cut_between_every_cr_and_its_lf_gives_the_same_outcome(name: str) -> None:
    # Each chunk but the last ends in CR, and the next begins with its LF: one line break.
    whole = _BODIES[name]
    body = _crlf(whole)
    assert await _outcome(split(body, _crlf_cuts(body))) == await _outcome(whole)


@settings(max_examples=40, deadline=None)
@given(st.sampled_from(sorted(_BODIES)), st.data())
async def test_a_crlf_stream_cut_at_some_line_ends_and_anywhere_gives_the_same_outcome(name: str, data: st.DataObject) -> None:
    whole = _BODIES[name]
    body = _crlf(whole)
    cuts = data.draw(st.lists(st.sampled_from(_crlf_cuts(body)), max_size=20))
    cuts += data.draw(st.lists(st.integers(1, len(body) - 1), max_size=10))
    assert await _outcome(split(body, cuts)) == await _outcome(whole)


async def test_the_lines_stream_is_read_whole() -> None:
    got = await _outcome(_crlf(_LINES))
    assert [b["text"] for b in got["message"]["content"]] == ["Hi there"]
    assert got["stop_reason"] == "end_turn"


async def test_the_wide_stream_is_read_whole() -> None:
    got = await _outcome([_WIDE[i : i + 1] for i in range(len(_WIDE))])  # one byte at a time
    thinking, text, call = got["message"]["content"]
    assert (thinking["thinking"], text["text"], call["input"]) == ("Ça va 😀", "né€𝄞 ok", {"q": "日本語"})
    assert got["stop_reason"] == "tool_use"


# -- events for an item after its output_item.done ---------------------------------------


def _litellm(*reasoning_again: str, output: bool = True) -> bytes:
    """A stream shaped as LiteLLM's Responses bridge to a chat model sends it: the reasoning item
    and the message both at output_index 0, the reasoning item done when the first text comes,
    and the thinking of a model that reasons again later under the same rs_ id. Its completed
    output holds the thinking and the text whole."""
    rs = {"id": "rs_1", "type": "reasoning", "summary": None}
    thinking, text = "Think" + "".join(reasoning_again), "Hi" + " there" * len(reasoning_again)

    def summary(text: str) -> Any:
        return ev("response.reasoning_summary_text.delta", item_id="rs_1", output_index=0, delta=text)

    def delta(text: str) -> Any:
        return ev("response.output_text.delta", item_id="msg_1", output_index=0, content_index=0, delta=text)

    done_rs = {**rs, "summary": [{"type": "summary_text", "text": "Think"}]}
    events = [CREATED, ev("response.output_item.added", output_index=0, item=rs), summary("Think"),
              ev("response.reasoning_summary_text.done", item_id="rs_1", output_index=0, summary_index=0, text="Think"),
              ev("response.output_item.done", output_index=0, item=done_rs), delta("Hi")]
    for again in reasoning_again:
        events += [summary(again), delta(" there")]
    message = {**MSG, "content": [{"type": "output_text", "text": text, "annotations": []}]}
    events += [ev("response.output_text.done", item_id="msg_1", output_index=0, content_index=0, text=text),
               ev("response.content_part.done", item_id="msg_1", output_index=0, content_index=0,
                  part={"type": "reasoning_text", "reasoning": thinking}),
               ev("response.output_item.done", output_index=0, item=message)]
    final = [{**rs, "summary": [{"type": "summary_text", "text": thinking}]}, message] if output else []
    events.append(ev("response.completed", response={"id": "resp_1", "status": "completed", "output": final}))
    return sse(*events)  # fmt: skip


@pytest.mark.parametrize("output", [True, False], ids=["output", "no-output"])
async def test_thinking_after_its_reasoning_item_is_done_opens_another_thinking_block(output: bool) -> None:
    # LiteLLM's bridge: before, a retryable protocol error, a response never taken (and re-billed).
    events, acc = await run_body(_litellm(" again", " more", output=output))
    thinking = [(e.index, e.thinking) for e in events if isinstance(e, StreamThinking)]
    assert thinking == [(0, "Think"), (2, " again"), (2, " more")]
    assert acc.stop_reason == "end_turn"
    first, text, second = acc.message().content
    assert (first.thinking, text.text, second.thinking) == ("Think", "Hi there there", " again more")  # type: ignore[union-attr]
    assert json.loads(first.signature)["id"] == "rs_1"  # type: ignore[union-attr]
    assert second.signature == ""  # type: ignore[union-attr]  # the item went with the first block
    committed = acc.committable()
    assert committed is not None and [b.type for b in committed.content] == ["thinking", "text"]
    stops = [e.index for e in events if isinstance(e, StreamBlockStop)]
    assert sorted(stops) == ([0, 1, 2] if output else [0, 1])


async def test_a_litellm_stream_that_reasons_once_is_as_before() -> None:
    _, acc = await run_body(_litellm())
    assert [b.type for b in acc.message().content] == ["thinking", "text"]


async def test_a_final_copy_that_contradicts_thinking_split_over_two_blocks_is_a_retryable_protocol_error() -> None:
    body = _litellm(" again").replace(b'"text": "Think again"', b'"text": "Think other"')
    with pytest.raises(StreamProtocolError, match="differs from its final text") as info:
        await run_body(body)
    assert info.value.retryable is True


@pytest.mark.parametrize("output", [True, False], ids=["output", "no-output"])
async def test_text_for_a_message_after_its_item_is_done_opens_another_text_block(output: bool) -> None:
    message = {**MSG, "content": [{"type": "output_text", "text": "Hi more"}]}
    body = sse(
        CREATED,
        ev("response.output_item.added", output_index=0, item=MSG),
        ev("response.output_text.delta", output_index=0, item_id="msg_1", content_index=0, delta="Hi"),
        ev("response.output_item.done", output_index=0, item={**MSG, "content": [{"type": "output_text", "text": "Hi"}]}),
        ev("response.output_text.delta", output_index=0, item_id="msg_1", content_index=0, delta=" more"),
        ev("response.completed", response={"id": "resp_1", "status": "completed", "output": [message] if output else []}),
    )  # fmt: skip
    events, acc = await run_body(body)
    assert [(e.index, e.text) for e in events if isinstance(e, StreamText)] == [(0, "Hi"), (1, " more")]
    assert [b.text for b in acc.message().content] == ["Hi", " more"]  # type: ignore[union-attr]
    assert acc.message().text == "Hi more"


async def test_a_final_copy_that_adds_to_a_done_message_is_a_retryable_protocol_error() -> None:
    body = sse(
        CREATED,
        ev("response.output_item.added", output_index=0, item=MSG),
        ev("response.output_text.delta", output_index=0, item_id="msg_1", content_index=0, delta="Hi"),
        ev("response.output_item.done", output_index=0, item={**MSG, "content": [{"type": "output_text", "text": "Hi"}]}),
        ev("response.output_text.done", output_index=0, item_id="msg_1", content_index=0, text="Hi more"),
        COMPLETED,
    )
    with pytest.raises(StreamProtocolError, match=r"after its output_item\.done") as info:
        await run_body(body)
    assert info.value.retryable is True


@pytest.mark.parametrize(
    "late",
    [
        ev("response.function_call_arguments.delta", output_index=0, item_id="fc_1", delta="x"),
        ev("response.function_call_arguments.done", output_index=0, item_id="fc_1", arguments='{"a":1}x'),
    ],
    ids=["delta", "longer-final-copy"],
)
async def test_arguments_for_a_call_after_its_item_is_done_are_a_protocol_error_not_retried(late: Any) -> None:
    # Before, the call's input became '{"a":1}x' (a call not run, answered with an error) where
    # the item said '{"a":1}'. A server that does it does it again: a retry would be billed for
    # the same stream.
    body = sse(
        CREATED,
        ev("response.output_item.added", output_index=0, item=CALL),
        ev("response.function_call_arguments.delta", output_index=0, item_id="fc_1", delta='{"a":1}'),
        ev("response.output_item.done", output_index=0, item={**CALL, "arguments": '{"a":1}'}),
        late,
        COMPLETED,
    )
    with pytest.raises(StreamProtocolError, match=r"after its output_item\.done") as info:
        await run_body(body)
    assert info.value.retryable is False


@pytest.mark.parametrize(
    "empty",
    [
        ev("response.output_text.delta", output_index=0, item_id="msg_1", content_index=0, delta=""),
        ev("response.output_text.delta", output_index=0, item_id="msg_1", content_index=1, delta=""),
        ev("response.refusal.delta", output_index=0, item_id="msg_1", content_index=0, delta=""),
    ],
    ids=["text", "text-other-part", "refusal"],
)
async def test_an_empty_text_delta_after_its_item_is_done_changes_nothing(empty: Any) -> None:
    # As an empty delta of arguments or thinking did: before, a protocol error.
    body = sse(
        CREATED,
        ev("response.output_item.added", output_index=0, item=MSG),
        ev("response.output_text.delta", output_index=0, item_id="msg_1", content_index=0, delta="Hi"),
        ev("response.output_item.done", output_index=0, item={**MSG, "content": [{"type": "output_text", "text": "Hi"}]}),
        empty,
        COMPLETED,
    )
    events, acc = await run_body(body)
    assert [e.text for e in events if isinstance(e, StreamText)] == ["Hi"]
    assert [b.text for b in acc.message().content] == ["Hi"]  # type: ignore[union-attr]
    assert acc.stop_reason == "end_turn"


async def test_an_empty_delta_for_another_part_does_not_switch_parts() -> None:
    # Before, the empty delta made part 1 the one streaming, and part 0's next delta was "for a
    # part before the one streaming".
    body = sse(CREATED, _text(0, "A"), _text(1, ""), _text(0, "B"), COMPLETED)
    _, acc = await run_body(body)
    assert acc.message().text == "AB"


async def test_final_copies_that_repeat_a_done_item_add_nothing() -> None:
    # What the item already says is no contradiction: the .done events some servers send after it.
    body = sse(
        CREATED,
        ev("response.output_item.added", output_index=0, item=MSG),
        ev("response.output_text.delta", output_index=0, item_id="msg_1", content_index=0, delta="Hi"),
        ev("response.output_item.done", output_index=0, item={**MSG, "content": [{"type": "output_text", "text": "Hi"}]}),
        ev("response.output_text.done", output_index=0, item_id="msg_1", content_index=0, text="Hi"),
        ev("response.output_item.done", output_index=0, item={**MSG, "content": [{"type": "output_text", "text": "Hi"}]}),
        COMPLETED,
    )
    events, acc = await run_body(body)
    assert "".join(e.text for e in events if isinstance(e, StreamText)) == "Hi"
    assert acc.message().text == "Hi"
    assert acc.stop_reason == "end_turn"


# -- malformed values: the mapper's own error, scrubbed -----------------------------------


@pytest.mark.parametrize(
    "bad",
    [
        [ev("response.output_text.delta", output_index=0, item_id="msg_1", content_index=0, delta={API_KEY: 1})],
        [ev("response.refusal.delta", output_index=0, item_id="msg_1", content_index=0, delta=[API_KEY])],
        [ev("response.reasoning_summary_text.delta", output_index=0, item_id="rs_1", summary_index=0, delta=[API_KEY])],
        [ev("response.reasoning_text.delta", output_index=0, item_id="rs_1", content_index=0, delta={"k": API_KEY})],
        [ev("response.output_item.added", output_index=0, item=CALL),
         ev("response.function_call_arguments.delta", output_index=0, item_id="fc_1", delta=[API_KEY])],
        [ev("response.output_item.added", output_index=0, item={**CALL, "name": [API_KEY]})],
        [ev("response.output_item.added", output_index=0, item={**CALL, "arguments": {"k": API_KEY}})],
    ],
    ids=["text", "refusal", "summary", "reasoning-text", "arguments", "call-name", "call-arguments"],
)
async def test_a_value_of_the_wrong_type_is_a_malformed_event_that_never_shows_the_key(bad: list[Any]) -> None:
    # Before, the value went out in a stream event, and the accumulator's error quoted it whole,
    # past the scrubbing of the model's errors: the engine's TurnEnded.error showed the key.
    end, engine = await model_error_run(OpenAIResponsesModel, sse(CREATED, *bad, COMPLETED))
    assert end.error is not None
    assert end.error.startswith("StreamProtocolError: openai responses stream: malformed")
    assert API_KEY not in end.error
    assert API_KEY not in repr(engine.messages)


# -- response.failed ------------------------------------------------------------------------


@pytest.mark.parametrize("error", ["Upstream model crashed", {"message": "Upstream model crashed"}])
async def test_a_failed_responses_error_in_words_is_its_error(error: Any) -> None:
    # Before, an error given as a string was a malformed event: the server's words were lost.
    body = sse(CREATED, ev("response.failed", response={"id": "resp_1", "status": "failed", "error": error}))
    server = MockServer(body)
    async with server.client() as client:
        with pytest.raises(ProviderStreamError, match="Upstream model crashed") as info:
            await collect(OpenAIResponsesModel("m", api_key=API_KEY, http_client=client))
    assert info.value.status == 200
    assert server.streams[0].closed


# -- parts out of order, calls nothing names ------------------------------------------------


def _summary(index: int, text: str) -> Any:
    return ev("response.reasoning_summary_text.delta", output_index=0, item_id="rs_1", summary_index=index, delta=text)


def _text(index: int, text: str) -> Any:
    return ev("response.output_text.delta", output_index=0, item_id="msg_1", content_index=index, delta=text)


@pytest.mark.parametrize("delta", [_summary, _text], ids=["summary-part", "content-part"])
async def test_a_delta_for_a_part_before_the_one_streaming_is_a_retryable_protocol_error(delta: Any) -> None:
    # Before, part 0's "C" was shown (and kept) after part 1's "B": "A\n\nBC" for the summary
    # parts ["AC", "B"].
    body = sse(CREATED, delta(0, "A"), delta(1, "B"), delta(0, "C"), COMPLETED)
    with pytest.raises(StreamProtocolError, match="part 0 after part 1") as info:
        await run_body(body)
    assert info.value.retryable is True


@pytest.mark.parametrize(
    "arguments",
    [
        ev("response.function_call_arguments.delta", output_index=0, item_id="fc_1", delta='{"a":1}'),
        ev("response.function_call_arguments.done", output_index=0, item_id="fc_1", arguments='{"a":1}'),
    ],
    ids=["delta", "done"],
)
async def test_arguments_of_a_call_that_nothing_names_are_a_retryable_protocol_error(arguments: Any) -> None:
    # No output_item event and no output names the call: before, its arguments were dropped
    # and the response ended as a finished answer with nothing in it.
    with pytest.raises(StreamProtocolError, match="no event named") as info:
        await run_body(sse(CREATED, arguments, COMPLETED))
    assert info.value.retryable is True


async def test_arguments_of_a_call_named_only_by_the_output_are_its_input() -> None:
    body = sse(
        CREATED,
        ev("response.function_call_arguments.delta", output_index=0, item_id="fc_1", delta='{"a":1}'),
        ev("response.completed", response={"id": "resp_1", "status": "completed",
                                           "output": [{**CALL, "arguments": '{"a":1}'}]}),
    )  # fmt: skip
    _, acc = await run_body(body)
    (call,) = acc.message().content
    assert (call.id, call.name, call.input) == ("call_1", "f", {"a": 1})  # type: ignore[union-attr]
    assert acc.stop_reason == "tool_use"


async def test_an_item_added_without_ids_after_one_that_is_done_is_a_new_item() -> None:
    # A minimal emulation: item events with no id and no output_index. Before, the second
    # message was taken for the first, done already: its text joined the first's, and its
    # output_item.done contradicted that ("AB" against "B").
    def message(text: str) -> list[Any]:
        item = {"type": "message", "role": "assistant", "content": []}
        return [
            ev("response.output_item.added", item=item),
            ev("response.output_text.delta", delta=text),
            ev("response.output_item.done", item={**item, "content": [{"type": "output_text", "text": text}]}),
        ]

    _, acc = await run_body(sse(CREATED, *message("A"), *message("B"), COMPLETED))
    assert [b.text for b in acc.message().content] == ["A", "B"]  # type: ignore[union-attr]


# -- a completed response whose status says it failed ------------------------------------------


@pytest.mark.parametrize("status", ["failed", "cancelled"])
@pytest.mark.parametrize("terminal", ["response.completed", "response.incomplete"])
async def test_a_terminal_event_whose_response_failed_is_the_error_of_response_failed(terminal: str, status: str) -> None:
    # Before, it ended the answer as an empty end_turn: a failure passed off as a finished answer.
    error = {"code": "server_error", "message": "Upstream model crashed"}
    failed = sse(CREATED, ev("response.failed", response={"id": "resp_1", "status": "failed", "error": error}))
    body = sse(CREATED, ev(terminal, response={"id": "resp_1", "status": status, "error": error}))
    raised = []
    for stream in (failed, body):
        server = MockServer(stream)
        async with server.client() as client:
            with pytest.raises(ProviderStreamError) as info:
                await collect(OpenAIResponsesModel("m", api_key=API_KEY, http_client=client))
        assert server.streams[0].closed
        raised.append((type(info.value), str(info.value), info.value.retryable, info.value.status))
    assert raised[1] == raised[0]
    assert "Upstream model crashed" in raised[1][1] and raised[1][2] is True


@pytest.mark.parametrize("status", ["failed", "cancelled"])
async def test_a_completed_response_that_failed_without_an_error_says_its_status(status: str) -> None:
    body = sse(CREATED, ev("response.completed", response={"id": "resp_1", "status": status, "error": None}))
    with pytest.raises(ProviderStreamError, match=f"status {status!r}") as info:
        await run_body(body)
    assert info.value.retryable is (status == "failed")  # nothing said of a failure: taken for a transient one


async def test_a_completed_response_that_failed_keeps_what_streamed_before_its_error() -> None:
    # As with response.failed: the output it holds and its usage come out, then the error.
    body = sse(
        CREATED,
        ev("response.output_item.added", output_index=0, item=MSG),
        ev("response.output_text.delta", output_index=0, item_id="msg_1", content_index=0, delta="Hi"),
        ev("response.completed", response={"id": "resp_1", "status": "cancelled", "usage": {"input_tokens": 3, "output_tokens": 1}}),
    )
    events: list[Any] = []
    server = MockServer(body)
    async with server.client() as client:
        model = OpenAIResponsesModel("m", api_key=API_KEY, http_client=client)
        with pytest.raises(ProviderStreamError):
            async for event in model.stream(request(), AbortController().signal):
                events.append(event)  # noqa: PERF401 (what came before the error is what is checked)
    assert [type(e).__name__ for e in events] == ["StreamText", "StreamUsage"]
    assert not any(type(e).__name__ == "StreamEnd" for e in events)


@pytest.mark.parametrize("status", [["failed"], {"state": "failed"}, 7, None], ids=["list", "dict", "int", "null"])
@pytest.mark.parametrize("terminal", ["response.completed", "response.incomplete"])
async def test_a_terminal_event_whose_status_is_not_a_string_ends_the_answer(terminal: str, status: Any) -> None:
    # Before, a list or a dict raised TypeError (unhashable) where the status was looked up among
    # the failed ones: a malformed stream, retried, though the answer had come whole.
    body = sse(
        CREATED,
        ev("response.output_item.added", output_index=0, item=MSG),
        ev("response.output_text.delta", output_index=0, item_id="msg_1", content_index=0, delta="Hi"),
        ev(terminal, response={"id": "resp_1", "status": status, "usage": {"input_tokens": 3, "output_tokens": 1}}),
    )
    events, acc = await run_body(body)
    end = events[-1]
    assert type(end).__name__ == "StreamEnd"
    assert acc.text() == "Hi" and acc.usage.output_tokens == 1
    assert acc.stop_reason == "end_turn"  # (no incomplete_details says why an incomplete one stopped)


# -- keep-alives, incomplete details, failures that say nothing ------------------------------------


def _feed(*events: tuple[str | None, str]) -> list[Any]:
    from agentloop.models._sse import ServerSentEvent
    from agentloop.models.openai_responses._stream import ResponsesMapper

    mapper, out = ResponsesMapper(), []
    for name, data in events:
        out.extend(mapper.handle(ServerSentEvent(data, name)) or ())
    return out


@pytest.mark.parametrize("name", ["keepalive", "ping", "heartbeat"])
@pytest.mark.parametrize("data", ["", " "])
def test_an_event_the_mapper_does_not_read_with_empty_data_is_passed_over(name: str, data: str) -> None:
    assert _feed((name, data)) == []


@pytest.mark.parametrize("name", ["response.output_text.delta", "response.completed"])
def test_an_event_the_mapper_reads_with_empty_data_is_still_malformed(name: str) -> None:
    with pytest.raises(StreamProtocolError):
        _feed((name, ""))


def _ended(details: Any) -> Any:
    text = ev("response.output_text.delta", output_index=0, item_id="msg_1", content_index=0, delta="hi")
    done = ev("response.incomplete", response={"id": "resp_1", "status": "incomplete",
                                              "incomplete_details": details, "output": []})  # fmt: skip
    added = ev("response.output_item.added", output_index=0, item=MSG)
    out = _feed(*((name, json.dumps(data)) for name, data in (CREATED, added, text, done)))
    return out[-1].stop_reason


@pytest.mark.parametrize(
    ("details", "reason"),
    [
        ("max_output_tokens", "max_tokens"),
        ("content_filter", "refusal"),
        ({"reason": "max_output_tokens"}, "max_tokens"),
        (["max_output_tokens"], "end_turn"),
        ({"reason": 5}, "end_turn"),
        ({"reason": ["max_output_tokens"]}, "end_turn"),
        (7, "end_turn"),
        (None, "end_turn"),
    ],
)
def test_incomplete_details_of_any_shape_end_the_answer_unretried(details: Any, reason: str) -> None:
    assert _ended(details) == reason


@pytest.mark.parametrize(("status", "retried"), [("failed", True), ("cancelled", False)])
@pytest.mark.parametrize("event", ["response.completed", "response.failed"])
def test_a_failure_that_says_nothing_is_retried_unless_cancelled(status: str, retried: bool, event: str) -> None:
    done = ev(event, response={"id": "resp_1", "status": status})
    with pytest.raises(ProviderStreamError) as caught:
        _feed(*((name, json.dumps(data)) for name, data in (CREATED, done)))
    assert caught.value.retryable is retried


@pytest.mark.parametrize("data", [" ", "  \n"])
def test_an_error_event_of_whitespace_reads_stream_error(data: str) -> None:
    with pytest.raises(ProviderStreamError) as caught:
        _feed(("error", data))
    assert str(caught.value).endswith("stream error")
