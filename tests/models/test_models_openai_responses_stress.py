"""OpenAIResponsesModel under stress: any chunking of a stream, events after an item's end,
malformed values that quote the server's data, a failed response's error in words."""

from __future__ import annotations

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
    run_fixture,
    split,
    sse,
)
from _models_support import run_responses as run_body
from hypothesis import given, settings
from hypothesis import strategies as st

from agentloop._errors import ProviderStreamError, StreamProtocolError
from agentloop.models import OpenAIResponsesModel, StreamText

CREATED = ev("response.created", response={"id": "resp_1", "status": "in_progress"})
COMPLETED = ev("response.completed", response={"id": "resp_1", "status": "completed",
                                               "usage": {"input_tokens": 3, "output_tokens": 4}})  # fmt: skip
MSG = {"id": "msg_1", "type": "message", "role": "assistant", "content": []}
CALL = {"id": "fc_1", "call_id": "call_1", "type": "function_call", "name": "f", "arguments": ""}


def _crlf(body: bytes) -> bytes:
    return body.replace(b"\n", b"\r\n")


#: A stream whose text, thinking and arguments hold characters of two, three and four bytes.
_WIDE = sse(
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

_BODIES = {
    "text": load("openai_responses_text.prism.sse"),
    "reasoning-call": load("openai_responses_reasoning_function_call.prism.sse"),
    "wide": _WIDE,
}


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


async def test_the_wide_stream_is_read_whole() -> None:
    got = await _outcome([_WIDE[i : i + 1] for i in range(len(_WIDE))])  # one byte at a time
    thinking, text, call = got["message"]["content"]
    assert (thinking["thinking"], text["text"], call["input"]) == ("Ça va 😀", "né€𝄞 ok", {"q": "日本語"})
    assert got["stop_reason"] == "tool_use"


# -- events for an item after its output_item.done ---------------------------------------


@pytest.mark.parametrize(
    "late",
    [
        ev("response.output_text.delta", output_index=0, item_id="msg_1", content_index=0, delta=" more"),
        ev("response.output_text.done", output_index=0, item_id="msg_1", content_index=0, text="Hi more"),
    ],
    ids=["delta", "longer-final-copy"],
)
async def test_text_for_a_message_after_its_item_is_done_is_a_retryable_protocol_error(late: Any) -> None:
    # Before, the text went to a block already stopped: the answer became what the item said it was not.
    body = sse(
        CREATED,
        ev("response.output_item.added", output_index=0, item=MSG),
        ev("response.output_text.delta", output_index=0, item_id="msg_1", content_index=0, delta="Hi"),
        ev("response.output_item.done", output_index=0, item={**MSG, "content": [{"type": "output_text", "text": "Hi"}]}),
        late,
        COMPLETED,
    )
    with pytest.raises(StreamProtocolError, match=r"after its output_item\.done") as info:
        await run_body(body)
    assert info.value.retryable is True


async def test_arguments_for_a_call_after_its_item_is_done_are_a_retryable_protocol_error() -> None:
    # Before, the call's input became '{"a":1}x' (a call not run, answered with an error) where
    # the item said '{"a":1}'.
    body = sse(
        CREATED,
        ev("response.output_item.added", output_index=0, item=CALL),
        ev("response.function_call_arguments.delta", output_index=0, item_id="fc_1", delta='{"a":1}'),
        ev("response.output_item.done", output_index=0, item={**CALL, "arguments": '{"a":1}'}),
        ev("response.function_call_arguments.delta", output_index=0, item_id="fc_1", delta="x"),
        COMPLETED,
    )
    with pytest.raises(StreamProtocolError, match=r"after its output_item\.done") as info:
        await run_body(body)
    assert info.value.retryable is True


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
