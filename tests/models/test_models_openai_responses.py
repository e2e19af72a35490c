"""OpenAIResponsesModel: request items, stream events, errors, doom-loop frames (WIRE.md §3, SPEC §6)."""

from __future__ import annotations

import json
from collections.abc import Sequence
from typing import Any

import pytest
from _models_support import API_KEY, MockServer, collect, ev, load, request, run_fixture, sse
from _models_support import run_responses as run_body
from hypothesis import given
from hypothesis import strategies as st

from agentloop._errors import PromptTooLongError, ProviderStreamError, StreamProtocolError
from agentloop._messages import Message, TextBlock, ThinkingBlock, ToolResultBlock, ToolUseBlock
from agentloop.models import (
    OpenAIChatModel,
    OpenAIResponsesModel,
    StreamEnd,
    StreamSignals,
    StreamText,
    StreamThinking,
    StreamToolInput,
    Usage,
)

CREATED = ev("response.created", response={"id": "resp_1", "status": "in_progress"})


def completed(status: str = "completed", **response: Any) -> tuple[str, dict[str, Any]]:
    kind = {"completed": "response.completed", "incomplete": "response.incomplete"}[status]
    return ev(kind, response={"id": "resp_1", "status": status,
                              "usage": {"input_tokens": 3, "output_tokens": 4}, **response})  # fmt: skip


def text_item(index: int, *deltas: str) -> list[tuple[str, dict[str, Any]]]:
    item = {"id": f"msg_{index}", "type": "message", "content": [], "role": "assistant"}
    out = [ev("response.output_item.added", output_index=index, item=item)]
    out += [ev("response.output_text.delta", output_index=index, content_index=0, item_id=item["id"], delta=d)
            for d in deltas]  # fmt: skip
    done = {**item, "content": [{"type": "output_text", "text": "".join(deltas)}]}
    out.append(ev("response.output_item.done", output_index=index, item=done))
    return out


# -- recorded streams ------------------------------------------------------------------


async def test_text_fixture() -> None:
    name = "openai_responses_text.prism.sse"
    events, acc = await run_fixture(name, load(name))
    assert (
        acc.message().text
        == "I'm an artificial intelligence trained to assist with tasks and provide information."
    )
    assert acc.stop_reason == "end_turn"
    assert acc.usage == Usage(10, 16)
    assert acc.response_id == "resp_684b3e43e9648199951aea692dce026b010b42c5871a937b"
    assert isinstance(events[-1], StreamEnd)


async def test_reasoning_and_function_call_fixture() -> None:
    name = "openai_responses_reasoning_function_call.prism.sse"
    _, acc = await run_fixture(name, load(name))
    thinking, tool = acc.message().content
    assert isinstance(thinking, ThinkingBlock)
    assert json.loads(thinking.signature) == {
        "id": "rs_684d4bc2885081999e06b1e760a86b6709b7481857442983",
        "summary": [],
    }
    assert isinstance(tool, ToolUseBlock)
    assert (tool.id, tool.name, tool.input) == (
        "call_Kfzsl8lPJayEwvd0rkI7731q",
        "weather",
        {"city": "Detroit"},
    )
    assert acc.stop_reason == "tool_use"
    assert acc.usage == Usage(78, 719)


async def test_missing_completed_is_a_protocol_error() -> None:
    body = load("openai_responses_text.prism.sse")
    body = body[: body.index(b"event: response.completed")]
    with pytest.raises(StreamProtocolError, match=r"response\.completed") as info:
        await run_fixture("openai_responses_text.prism.sse", body)
    assert info.value.retryable is True


# -- events ---------------------------------------------------------------------------


async def test_reasoning_summary_deltas_and_encrypted_content_round_trip() -> None:
    rs = {"id": "rs_1", "type": "reasoning", "summary": []}
    summary = [{"type": "summary_text", "text": "First."}, {"type": "summary_text", "text": "Second."}]
    body = sse(
        CREATED,
        ev("response.output_item.added", output_index=0, item=rs),
        ev(
            "response.reasoning_summary_text.delta",
            output_index=0,
            item_id="rs_1",
            summary_index=0,
            delta="First.",
        ),
        ev(
            "response.reasoning_summary_text.delta",
            output_index=0,
            item_id="rs_1",
            summary_index=1,
            delta="Second.",
        ),
        ev(
            "response.output_item.done",
            output_index=0,
            item={**rs, "summary": summary, "encrypted_content": "ENC"},
        ),
        *text_item(1, "Hi"),
        completed(),
    )
    _, acc = await run_body(body)
    thinking = acc.message().content[0]
    assert isinstance(thinking, ThinkingBlock)
    assert thinking.thinking == "First.\n\nSecond."
    assert json.loads(thinking.signature) == {"id": "rs_1", "summary": summary, "encrypted_content": "ENC"}
    # ... and it goes back as the same reasoning item.
    server = MockServer(sse(CREATED, completed()))
    async with server.client() as client:
        model = OpenAIResponsesModel("o", api_key=API_KEY, http_client=client, reasoning={"effort": "low"})
        await collect(model, request(Message.user("q"), acc.message(), Message.user("more")))
    items = server.body["input"]
    assert items[1] == {"type": "reasoning", "id": "rs_1", "summary": summary, "encrypted_content": "ENC"}
    assert server.body["include"] == ["reasoning.encrypted_content"]
    assert server.body["reasoning"] == {"effort": "low"}


@pytest.mark.parametrize("streamed", [True, False], ids=["streamed", "whole-in-done"])
async def test_a_reasoning_item_is_its_non_empty_summary_parts_a_blank_line_between(streamed: bool) -> None:
    # Either way the same text: an empty part adds no separator (streamed, it used to
    # after an empty delta; whole, every part was joined, empty ones too).
    texts = ["", "First.", "", "Second.", ""]
    summary = [{"type": "summary_text", "text": t} for t in texts]
    deltas = [
        ev("response.reasoning_summary_text.delta", output_index=0, item_id="rs_1", summary_index=i, delta=t)
        for i, t in enumerate(texts)
    ]
    body = sse(
        CREATED,
        ev("response.output_item.added", output_index=0, item={"id": "rs_1", "type": "reasoning", "summary": []}),
        *(deltas if streamed else []),
        ev("response.output_item.done", output_index=0, item={"id": "rs_1", "type": "reasoning", "summary": summary}),
        completed(),
    )
    _, acc = await run_body(body)
    (thinking,) = acc.message().content
    assert isinstance(thinking, ThinkingBlock)
    assert thinking.thinking == "First.\n\nSecond."
    assert json.loads(thinking.signature) == {"id": "rs_1", "summary": summary}  # sent back as it came


async def test_reasoning_text_delta_is_thinking() -> None:
    body = sse(
        CREATED,
        ev("response.reasoning_text.delta", output_index=0, item_id="rs_1", delta="raw reasoning"),
        ev(
            "response.output_item.done",
            output_index=0,
            item={"id": "rs_1", "type": "reasoning", "summary": []},
        ),
        completed(),
    )
    _, acc = await run_body(body)
    assert acc.message().content[0].thinking == "raw reasoning"  # type: ignore[union-attr]


async def test_function_call_arguments_only_in_done_event() -> None:
    fc = {"id": "fc_1", "type": "function_call", "call_id": "call_1", "name": "f", "arguments": ""}
    body = sse(
        CREATED,
        ev("response.output_item.added", output_index=0, item=fc),
        ev("response.function_call_arguments.done", output_index=0, item_id="fc_1", arguments='{"a": 1}'),
        ev("response.output_item.done", output_index=0, item={**fc, "arguments": '{"a": 1}'}),
        completed(),
    )
    _, acc = await run_body(body)
    assert acc.message().tool_uses[0].input == {"a": 1}


FC = {"id": "fc_1", "type": "function_call", "call_id": "call_1", "name": "f", "arguments": ""}


def call_events(deltas: list[str], *, args_done: str | None = None,
                item_done: str | None = None) -> list[tuple[str, dict[str, Any]]]:  # fmt: skip
    """A function call at output 0: its deltas, then the final copies of its arguments given."""
    out = [ev("response.output_item.added", output_index=0, item=FC)]
    out += [ev("response.function_call_arguments.delta", output_index=0, item_id="fc_1", delta=d) for d in deltas]
    if args_done is not None:
        out.append(ev("response.function_call_arguments.done", output_index=0, item_id="fc_1", arguments=args_done))
    if item_done is not None:
        out.append(ev("response.output_item.done", output_index=0, item={**FC, "arguments": item_done}))
    return out


def streamed_input(events: list[Any]) -> str:
    return "".join(e.partial_json for e in events if isinstance(e, StreamToolInput))


async def test_arguments_only_in_the_arguments_done_event_are_the_input() -> None:
    # No deltas and no output_item.done: the .done event is the only copy of the arguments.
    events, acc = await run_body(sse(CREATED, *call_events([], args_done='{"a": 1}'), completed()))
    assert acc.message().tool_uses[0].input == {"a": 1}
    assert streamed_input(events) == '{"a": 1}'


@pytest.mark.parametrize("copies", [{"args_done"}, {"item_done"}, {"args_done", "item_done"}])
async def test_the_final_arguments_complete_deltas_that_stopped_short_once(copies: set[str]) -> None:
    final = '{"path": "/tmp/a", "n": 12}'
    kw = {c: final for c in copies}
    events, acc = await run_body(sse(CREATED, *call_events(['{"path": "/tmp/a", ', '"n": 1'], **kw), completed()))
    assert acc.message().tool_uses[0].input == {"path": "/tmp/a", "n": 12}
    assert streamed_input(events) == final  # the missing tail emitted once, not per copy


async def test_final_arguments_written_differently_keep_the_streamed_input() -> None:
    # A server that re-serializes the arguments in its final copy: the same JSON, other bytes.
    deltas = ['{"b": [1, 2],', ' "a": "x"}']
    events, acc = await run_body(sse(CREATED, *call_events(deltas, args_done='{"a":"x","b":[1,2]}',
                                                           item_done='{"a":"x","b":[1,2]}'), completed()))  # fmt: skip
    assert acc.message().tool_uses[0].input == {"b": [1, 2], "a": "x"}
    assert streamed_input(events) == "".join(deltas)


@pytest.mark.parametrize("final", ['{"path": "/etc/passwd"}', '{"path": "/tmp/a", "n": true}', "{}"])
@pytest.mark.parametrize("where", ["args_done", "item_done"])
async def test_final_arguments_that_contradict_the_deltas_are_a_retryable_protocol_error(
    final: str, where: str
) -> None:
    deltas = ['{"path": "/tmp/a", ', '"n": 1}']
    with pytest.raises(StreamProtocolError, match="differ from its final arguments") as info:
        await run_body(sse(CREATED, *call_events(deltas, **{where: final}), completed()))
    assert info.value.retryable is True


@pytest.mark.parametrize("final", ["", None])
async def test_an_empty_or_missing_final_copy_leaves_the_deltas(final: str | None) -> None:
    body = sse(CREATED, *call_events(['{"a": 1}']),
               ev("response.function_call_arguments.done", output_index=0, item_id="fc_1", arguments=final),
               ev("response.output_item.done", output_index=0, item={**FC, "arguments": final}), completed())  # fmt: skip
    _, acc = await run_body(body)
    assert acc.message().tool_uses[0].input == {"a": 1}


@pytest.mark.parametrize("final", [{"a": 1}, 5, ["x"]])
async def test_final_arguments_that_are_not_a_string_are_a_malformed_event(final: Any) -> None:
    with pytest.raises(StreamProtocolError, match="not a str") as info:
        await run_body(sse(CREATED, *call_events(['{"a": 1}'], args_done=final), completed()))  # type: ignore[arg-type]
    assert info.value.retryable is True


@given(
    value=st.dictionaries(st.text(max_size=6), st.text(max_size=8) | st.integers() | st.booleans(), max_size=4),
    data=st.data(),
)
async def test_any_split_any_lost_tail_and_any_final_copies_give_the_final_input_once(
    value: dict[str, Any], data: st.DataObject
) -> None:
    text = json.dumps(value)
    cuts = sorted(data.draw(st.lists(st.integers(0, len(text)), max_size=6), label="cuts"))
    pieces = [text[a:b] for a, b in zip([0, *cuts], [*cuts, len(text)], strict=True)]
    sent = data.draw(st.integers(0, len(pieces)), label="deltas sent")  # the rest never arrived
    copies = data.draw(st.sampled_from(["args_done", "item_done", "both"]), label="final copies")
    final = text
    if sent == len(pieces) and data.draw(st.booleans(), label="re-serialized"):
        final = json.dumps(value, separators=(",", ":"), sort_keys=True)  # same JSON, other bytes
    kw = {"args_done": final if copies != "item_done" else None,
          "item_done": final if copies != "args_done" else None}  # fmt: skip
    events, acc = await run_body(sse(CREATED, *call_events(pieces[:sent], **kw), completed()))
    assert acc.message().tool_uses[0].input == value
    assert json.loads(streamed_input(events)) == value  # nothing emitted twice


MSG = {"id": "msg_1", "type": "message", "role": "assistant", "content": []}
TEXT_COPIES = ("text_done", "part_done", "item_done")


def message_events(deltas: list[str], final: str | None, copies: Sequence[str] = TEXT_COPIES,
                   kind: str = "output_text") -> list[tuple[str, dict[str, Any]]]:  # fmt: skip
    """A message at output 0 with one content part: its deltas, then the final copies named."""
    key = "text" if kind == "output_text" else "refusal"
    at = {"output_index": 0, "item_id": "msg_1", "content_index": 0}
    part = {"type": kind, key: final}
    out = [ev("response.output_item.added", output_index=0, item=MSG)]
    out += [ev(f"response.{kind}.delta", **at, delta=d) for d in deltas]
    if "text_done" in copies:
        out.append(ev(f"response.{kind}.done", **at, **{key: final}))
    if "part_done" in copies:
        out.append(ev("response.content_part.done", **at, part=part))
    if "item_done" in copies:
        out.append(ev("response.output_item.done", output_index=0, item={**MSG, "content": [part]}))
    return out


def streamed_text(events: list[Any]) -> str:
    return "".join(e.text for e in events if isinstance(e, StreamText))


@pytest.mark.parametrize("copies", [("text_done",), ("part_done",), ("item_done",), TEXT_COPIES])
async def test_message_text_that_comes_only_in_a_final_copy_is_the_answer_once(copies: tuple[str, ...]) -> None:
    # A server that sends no text deltas (some Responses-compatible ones do): before, the text of
    # output_text.done or content_part.done alone was lost.
    events, acc = await run_body(sse(CREATED, *message_events([], "Hello there.", copies), completed()))
    assert acc.message().text == "Hello there."
    assert streamed_text(events) == "Hello there."


@pytest.mark.parametrize("copies", [("text_done",), ("part_done",), ("item_done",), TEXT_COPIES])
async def test_the_final_text_completes_deltas_that_stopped_short_once(copies: tuple[str, ...]) -> None:
    final = "The answer is 42, as computed."
    events, acc = await run_body(sse(CREATED, *message_events(["The answer", " is 4"], final, copies), completed()))
    assert acc.message().text == final  # before: "The answer is 4"
    assert streamed_text(events) == final


@pytest.mark.parametrize("final", ["The answer is 43.", "Something else entirely", "the answer is 42."])
@pytest.mark.parametrize("where", TEXT_COPIES)
async def test_a_final_text_that_contradicts_the_deltas_is_a_retryable_protocol_error(final: str, where: str) -> None:
    with pytest.raises(StreamProtocolError, match="differs from its final text") as info:
        await run_body(sse(CREATED, *message_events(["The answer", " is 42."], final, (where,)), completed()))
    assert info.value.retryable is True


@pytest.mark.parametrize("final", ["", None, "The answer", "The answer is 42.", "  The answer is 42. \n"],
                         ids=["empty", "absent", "snapshot-taken-early", "trimmed", "spaced"])  # fmt: skip
async def test_a_final_text_that_is_empty_shorter_or_differently_spaced_leaves_the_deltas(final: str | None) -> None:
    # Proxies seen doing each: an empty output_text.done / content_part.done, a final copy taken
    # before the last deltas, one with the trailing whitespace trimmed.
    deltas = ["The answer", " is 42.\n\n"]
    events, acc = await run_body(sse(CREATED, *message_events(deltas, final), completed()))
    assert acc.message().text == "The answer is 42.\n\n"
    assert streamed_text(events) == "".join(deltas)


@pytest.mark.parametrize("copies", [("text_done",), ("part_done",), ("item_done",)])
async def test_a_refusal_that_comes_only_in_a_final_copy_is_text_and_a_refusal(copies: tuple[str, ...]) -> None:
    _, acc = await run_body(sse(CREATED, *message_events([], "I can't help.", copies, "refusal"), completed()))
    assert acc.message().text == "I can't help."
    assert acc.stop_reason == "refusal"  # before: end_turn, and for .done alone no text at all


async def test_a_refusal_cut_short_is_completed_by_its_final_copy() -> None:
    body = sse(CREATED, *message_events(["I can"], "I can't help with that.", kind="refusal"), completed())
    events, acc = await run_body(body)
    assert (acc.message().text, acc.stop_reason) == ("I can't help with that.", "refusal")
    assert streamed_text(events) == "I can't help with that."


async def test_a_character_split_into_utf16_halves_by_the_deltas_is_no_contradiction() -> None:
    # A server that slices text by UTF-16 unit: each half decodes to U+FFFD; the final copy has
    # the character, and more text after it.
    at = {"output_index": 0, "item_id": "msg_1", "content_index": 0}
    halves = ['data: {"type": "response.output_text.delta", "output_index": 0, "item_id": "msg_1", '
              f'"content_index": 0, "delta": "{d}"}}\n\n' for d in ("ok \\ud83d", "\\ude00 go")]  # fmt: skip
    head = sse(CREATED, ev("response.output_item.added", output_index=0, item=MSG))
    tail = sse(ev("response.output_text.done", **at, text="ok \U0001f600 go"),
               ev("response.output_item.done", output_index=0,
                  item={**MSG, "content": [{"type": "output_text", "text": "ok \U0001f600 go on"}]}),
               completed())  # fmt: skip
    events, acc = await run_body(head + "".join(halves).encode() + tail)
    assert acc.message().text == "ok \ufffd\ufffd go on"  # as streamed, plus the tail it lacked
    assert streamed_text(events) == "ok \ufffd\ufffd go on"


async def test_message_parts_are_completed_in_order_and_a_part_left_behind_is_an_error() -> None:
    def delta(i: int, d: str) -> tuple[str, dict[str, Any]]:
        return ev("response.output_text.delta", output_index=0, item_id="msg_1", content_index=i, delta=d)

    def done(*texts: str) -> tuple[str, dict[str, Any]]:
        content = [{"type": "output_text", "text": t} for t in texts]
        return ev("response.output_item.done", output_index=0, item={**MSG, "content": content})

    added = ev("response.output_item.added", output_index=0, item=MSG)
    _, acc = await run_body(sse(CREATED, added, delta(0, "One. "), delta(1, "Tw"), done("One. ", "Two."), completed()))
    assert acc.message().text == "One. Two."
    _, acc = await run_body(sse(CREATED, added, done("One. ", "Two."), completed()))
    assert acc.message().text == "One. Two."
    # Part 0 lost its tail, but part 1 streamed after it: the tail has no place in the text.
    with pytest.raises(StreamProtocolError, match="after a later part streamed") as info:
        await run_body(sse(CREATED, added, delta(0, "On"), delta(1, "Two."), done("One. ", "Two."), completed()))
    assert info.value.retryable is True


@pytest.mark.parametrize("final", [{"text": "x"}, 5, ["x"]])
async def test_a_final_text_that_is_not_a_string_is_a_malformed_event(final: Any) -> None:
    with pytest.raises(StreamProtocolError, match="not a str") as info:
        await run_body(sse(CREATED, *message_events(["x"], final, ("text_done",)), completed()))
    assert info.value.retryable is True


async def test_reasoning_summary_parts_cut_short_or_only_final_are_completed() -> None:
    def delta(i: int, d: str) -> tuple[str, dict[str, Any]]:
        return ev("response.reasoning_summary_text.delta", output_index=0, item_id="rs_1", summary_index=i, delta=d)

    summary = [{"type": "summary_text", "text": t} for t in ("First.", "Second.", "Third.")]
    body = sse(
        CREATED,
        ev("response.output_item.added", output_index=0, item={"id": "rs_1", "type": "reasoning", "summary": []}),
        delta(0, "Fir"),  # cut short; its .done completes it
        ev("response.reasoning_summary_text.done", output_index=0, item_id="rs_1", summary_index=0, text="First."),
        # No deltas at all for part 1:
        ev("response.reasoning_summary_part.done", output_index=0, item_id="rs_1", summary_index=1, part=summary[1]),
        ev("response.output_item.done", output_index=0, item={"id": "rs_1", "type": "reasoning", "summary": summary}),
        completed(),
    )
    events, acc = await run_body(body)
    (thinking,) = acc.message().content
    assert isinstance(thinking, ThinkingBlock)
    assert thinking.thinking == "First.\n\nSecond.\n\nThird."
    assert "".join(e.thinking for e in events if isinstance(e, StreamThinking)) == thinking.thinking


async def test_raw_reasoning_text_is_not_compared_with_the_summary() -> None:
    summary = [{"type": "summary_text", "text": "A summary."}]
    body = sse(
        CREATED,
        ev("response.reasoning_text.delta", output_index=0, item_id="rs_1", content_index=0, delta="raw steps"),
        ev("response.output_item.done", output_index=0, item={"id": "rs_1", "type": "reasoning", "summary": summary}),
        completed(),
    )
    _, acc = await run_body(body)
    assert acc.message().content[0].thinking == "raw steps"  # type: ignore[union-attr]


@given(
    text=st.text(st.characters(codec="utf-8"), min_size=1, max_size=30),
    data=st.data(),
)
async def test_any_split_any_lost_tail_and_any_final_copies_give_the_final_text_once(
    text: str, data: st.DataObject
) -> None:
    cuts = sorted(data.draw(st.lists(st.integers(0, len(text)), max_size=5), label="cuts"))
    pieces = [p for a, b in zip([0, *cuts], [*cuts, len(text)], strict=True) if (p := text[a:b])]
    sent = data.draw(st.integers(0, len(pieces)), label="deltas sent")  # the rest never arrived
    copies = data.draw(st.lists(st.sampled_from(TEXT_COPIES), min_size=1, unique=True), label="final copies")
    kind = data.draw(st.sampled_from(["output_text", "refusal"]), label="kind")
    events, acc = await run_body(sse(CREATED, *message_events(pieces[:sent], text, copies, kind), completed()))
    assert acc.message().text == text
    assert streamed_text(events) == text  # nothing emitted twice


async def test_llama_cpp_style_events_without_output_index() -> None:
    fc = {"id": "fc_x", "type": "function_call", "call_id": "fc_x", "name": "f", "arguments": ""}
    body = sse(
        (
            "response.created",
            {
                "type": "response.created",
                "response": {"id": "r", "object": "response", "status": "in_progress"},
            },
        ),
        ev("response.output_text.delta", item_id="msg_a", delta="Hello"),
        ev("response.output_item.added", item=fc),
        ev("response.function_call_arguments.delta", item_id="fc_x", delta='{"k":'),
        ev("response.function_call_arguments.delta", item_id="fc_x", delta=' "v"}'),
        ev("response.output_item.done", item={**fc, "arguments": '{"k": "v"}'}),
        completed(),
    )
    _, acc = await run_body(body)
    assert acc.message().text == "Hello"
    assert acc.message().tool_uses[0].input == {"k": "v"}


@pytest.mark.parametrize(
    ("reason", "stop"),
    [("max_output_tokens", "max_tokens"), ("content_filter", "refusal"), ("max_messages", "end_turn")],
)
async def test_incomplete(reason: str, stop: str) -> None:
    body = sse(CREATED, *text_item(0, "cut"), completed("incomplete", incomplete_details={"reason": reason}))
    _, acc = await run_body(body)
    assert acc.stop_reason == stop
    assert acc.message().text == "cut"


@pytest.mark.parametrize(("reason", "stop"), [("max_output_tokens", "max_tokens"), ("content_filter", "refusal"),
                                            ("max_messages", "tool_use")])  # fmt: skip
async def test_incomplete_with_a_function_call_says_why_it_was_cut(reason: str, stop: str) -> None:
    # The host must learn that the token limit cut the call (its arguments may be cut too).
    fc = {"id": "fc_1", "type": "function_call", "call_id": "call_1", "name": "f", "arguments": ""}
    body = sse(
        CREATED,
        ev("response.output_item.added", output_index=0, item=fc),
        ev("response.function_call_arguments.delta", output_index=0, item_id="fc_1", delta='{"path": "/tm'),
        completed("incomplete", incomplete_details={"reason": reason}),
    )
    _, acc = await run_body(body)
    assert acc.stop_reason == stop


async def test_failed_is_a_stream_error() -> None:
    failed = ev("response.failed", response={"id": "r", "status": "failed",
                                             "error": {"code": "server_error", "message": "boom"}})  # fmt: skip
    with pytest.raises(ProviderStreamError, match="boom") as info:
        await run_body(sse(CREATED, failed))
    assert (info.value.error_type, info.value.retryable) == ("server_error", True)


async def test_error_event_flat_shape() -> None:
    body = sse(CREATED, ("error", {"type": "error", "code": "ERR_SOMETHING", "message": "Something went wrong",
                                   "param": None, "sequence_number": 1}))  # fmt: skip
    with pytest.raises(ProviderStreamError, match="Something went wrong") as info:
        await run_body(body)
    assert (info.value.error_type, info.value.retryable) == ("ERR_SOMETHING", False)


async def test_error_event_nested_shape_rate_limit_is_retryable() -> None:
    body = sse(CREATED, ("error", {"type": "error", "sequence_number": 2, "error": {
        "type": "too_many_requests", "code": "too_many_requests", "message": "Too Many Requests", "param": None}}))  # fmt: skip
    with pytest.raises(ProviderStreamError, match="Too Many Requests") as info:
        await run_body(body)
    assert info.value.retryable is True
    assert info.value.status == 200


async def test_a_context_overflow_error_event_is_prompt_too_long() -> None:
    # What the API sends, inside a 200 stream, when the input does not fit.
    body = sse(CREATED, ("error", {"type": "error", "sequence_number": 2, "error": {
        "type": "invalid_request_error", "code": "context_length_exceeded", "param": "input",
        "message": "Your input exceeds the context window of this model. Please adjust your input and try again."}}))  # fmt: skip
    with pytest.raises(PromptTooLongError, match="exceeds the context window") as info:
        await run_body(body)
    assert (info.value.status, info.value.error_type, info.value.retryable) == (200, "context_length_exceeded", False)


async def test_a_failed_response_for_context_overflow_is_prompt_too_long() -> None:
    failed = ev("response.failed", response={"id": "r", "status": "failed", "error": {
        "code": "context_length_exceeded", "message": "Your input exceeds the context window of this model."}})  # fmt: skip
    with pytest.raises(PromptTooLongError):
        await run_body(sse(CREATED, failed))


async def test_unknown_events_ignored_and_refusal() -> None:
    body = sse(
        CREATED,
        ev("response.web_search_call.in_progress", output_index=0, item_id="ws"),
        ev("response.output_item.done", output_index=0, item={"id": "ws", "type": "web_search_call"}),
        ev("response.refusal.delta", output_index=1, item_id="m", content_index=0, delta="No."),
        ev("response.something_new", x=1),
        completed(),
    )
    _, acc = await run_body(body)
    assert acc.message().text == "No."
    assert acc.stop_reason == "refusal"


@pytest.mark.parametrize("data", ["upstream connect error or disconnect/reset before headers", ""])
@pytest.mark.parametrize("api", ["responses", "chat"])
async def test_an_error_event_whose_data_is_not_json_is_the_servers_error_in_both_apis(data: str, api: str) -> None:
    # Before, Responses called it "malformed JSON" (a retryable StreamProtocolError) where Chat
    # raised the server's error; now both raise ProviderStreamError, its text the message.
    body = sse(CREATED, ("error", data)) if api == "responses" else sse(("error", data))
    server = MockServer(body)
    async with server.client() as client:
        cls = OpenAIResponsesModel if api == "responses" else OpenAIChatModel
        with pytest.raises(ProviderStreamError) as info:
            await collect(cls("m", api_key=API_KEY, http_client=client))
    assert (info.value.status, info.value.retryable) == (200, False)
    assert str(info.value).endswith(data or "stream error")
    if api == "responses":
        assert str(info.value) == f"openai responses stream error: {data or 'stream error'}"


async def test_token_counts_that_are_not_numbers_are_left_out_of_the_usage() -> None:
    # A str would pass into Usage and make the run's usage sum raise TypeError, out of run().
    usage = {"input_tokens": "12", "output_tokens": 7.0, "input_tokens_details": {"cached_tokens": [3]}}
    _, acc = await run_body(sse(CREATED, *text_item(0, "hi"), ev("response.completed", response={
        "id": "resp_1", "status": "completed", "usage": usage})))  # fmt: skip
    assert acc.usage == Usage(0, 7, 0)
    assert all(type(n) is int for n in (acc.usage.input_tokens, acc.usage.output_tokens, acc.usage.cache_read_tokens))


async def test_malformed_json() -> None:
    with pytest.raises(StreamProtocolError, match="malformed JSON"):
        await run_body(b"event: response.created\ndata: {\n\n")


# -- doom-loop frames -------------------------------------------------------------------


async def test_doom_loop_frames_become_signals_and_headers_sent() -> None:
    doom = {"type": "response.doom_loop_check", "signals": ["tail_repetition:32@thinking"]}
    doom2 = {
        "type": "response.doom_loop_check",
        "signals": ["tail_repetition:32@thinking", "low_logprob@text"],
    }
    body = sse(
        CREATED,
        *text_item(0, "a", "b")[:2],
        ("response.doom_loop_check", doom),
        *text_item(0, "a", "b")[2:],
        ("response.doom_loop_check", doom2),
        completed(),
    )
    server = MockServer(body)
    async with server.client() as client:
        model = OpenAIResponsesModel("grok", api_key=API_KEY, http_client=client, doom_loop_check=True)
        events, acc = await collect(model)
    headers = server.requests[0].headers
    assert headers["x-grok-doom-loop-check"] == "true"
    assert headers["x-grok-exact-repetition-check"] == "true"
    signals = [e for e in events if isinstance(e, StreamSignals)]
    assert [s.signals for s in signals] == [
        ("tail_repetition:32@thinking",),
        ("tail_repetition:32@thinking", "low_logprob@text"),
    ]
    assert acc.message().text == "ab"
    assert [e.text for e in events if isinstance(e, StreamText)] == ["a", "b"]


async def test_doom_loop_headers_off_by_default() -> None:
    server = MockServer(sse(CREATED, completed()))
    async with server.client() as client:
        await collect(OpenAIResponsesModel("m", api_key=API_KEY, http_client=client))
    assert "x-grok-doom-loop-check" not in server.requests[0].headers


async def test_a_doom_loop_header_in_extra_headers_replaces_the_models_whatever_its_case() -> None:
    # extra_headers replace the library's headers of the same name: sent next to the model's,
    # the server saw both "false" and "true" for one header.
    server = MockServer(sse(CREATED, completed()))
    extra = {"X-Grok-Doom-Loop-Check": "false"}
    async with server.client() as client:
        model = OpenAIResponsesModel("grok", api_key=API_KEY, http_client=client, doom_loop_check=True,
                                     extra_headers=extra)  # fmt: skip
        await collect(model)
    raw = server.requests[0].headers.raw
    assert [v for k, v in raw if k.lower() == b"x-grok-doom-loop-check"] == [b"false"]
    assert [v for k, v in raw if k.lower() == b"x-grok-exact-repetition-check"] == [b"true"]


async def test_doom_loop_frame_without_type_field_is_still_absorbed() -> None:
    body = sse(CREATED, ("response.doom_loop_check", {"signals": ["low_logprob@text"]}), completed())
    events, _ = await run_body(body)
    assert [e.signals for e in events if isinstance(e, StreamSignals)] == [("low_logprob@text",)]


# -- request -------------------------------------------------------------------------


class Tool:
    name = "f"
    description = "does f"
    input_schema: dict[str, Any] = {"type": "object"}  # noqa: RUF012


async def test_request_items() -> None:
    server = MockServer(sse(CREATED, completed()))
    history = [
        Message.user("go"),
        Message(role="assistant", content=[
            ThinkingBlock(thinking="anthropic thinking", signature="not-json"),
            ThinkingBlock(thinking="summary", signature='{"id": "rs_9"}'),
            TextBlock(text="calling"), ToolUseBlock(id="call_1", name="f", input={"a": 1}),
        ]),
        Message(role="user", content=[ToolResultBlock(tool_use_id="call_1", content="bad", is_error=True)]),
    ]  # fmt: skip
    async with server.client() as client:
        model = OpenAIResponsesModel("m", api_key=API_KEY, http_client=client, store=True)
        await collect(model, request(*history, system="sys", tools=[Tool()], tool_choice="f", max_tokens=50))
    assert server.requests[0].url == "https://api.openai.com/v1/responses"
    body = server.body
    assert body["instructions"] == "sys"
    assert (body["stream"], body["store"], body["max_output_tokens"]) == (True, True, 50)
    assert body["tool_choice"] == {"type": "function", "name": "f"}
    assert body["tools"] == [{"type": "function", "name": "f", "description": "does f",
                              "parameters": {"type": "object"}, "strict": False}]  # fmt: skip
    assert "include" not in body
    assert body["input"] == [
        {"type": "message", "role": "user", "content": "go"},
        {"type": "reasoning", "id": "rs_9", "summary": [{"type": "summary_text", "text": "summary"}]},
        {"type": "message", "role": "assistant", "content": "calling"},
        {"type": "function_call", "call_id": "call_1", "name": "f", "arguments": '{"a": 1}'},
        {"type": "function_call_output", "call_id": "call_1", "output": "Error: bad"},
    ]


@pytest.mark.parametrize("store", [None, True, False])
async def test_with_store_false_reasoning_goes_back_only_with_its_encrypted_content(store: bool | None) -> None:
    # With store=false the server keeps nothing: an item sent back by id alone is answered
    # with "Item with id 'rs_...' not found", on every request.
    history = [
        Message.user("q"),
        Message(role="assistant", content=[
            ThinkingBlock(thinking="plain", signature='{"id":"rs_1","summary":[]}'),
            TextBlock(text="a"),
            ThinkingBlock(thinking="sealed", signature='{"id":"rs_2","summary":[],"encrypted_content":"ENC"}'),
            TextBlock(text="b"),
        ]),
        Message.user("more"),
    ]  # fmt: skip
    server = MockServer(sse(CREATED, completed()))
    async with server.client() as client:
        await collect(OpenAIResponsesModel("o", api_key=API_KEY, http_client=client, store=store), request(*history))
    sent = [item["id"] for item in server.body["input"] if item["type"] == "reasoning"]
    assert sent == (["rs_2"] if store is False else ["rs_1", "rs_2"])
    assert server.body.get("store") == store


@pytest.mark.parametrize(
    "cut",
    [
        [ThinkingBlock(thinking="plan", signature='{"id":"rs_cut","summary":[]}')],
        [TextBlock(text="Let me"), ThinkingBlock(thinking="plan", signature='{"id":"rs_cut","summary":[]}')],
        [
            ThinkingBlock(thinking="a", signature='{"id":"rs_cut","summary":[]}'),
            ThinkingBlock(thinking="b", signature='{"id":"rs_cut2","summary":[],"encrypted_content":"E"}'),
        ],
    ],
    ids=["reasoning-only", "after-text", "two-trailing"],
)
@pytest.mark.parametrize("last", [True, False])
async def test_a_reasoning_item_left_trailing_by_a_cut_turn_is_not_sent(cut: list[Any], last: bool) -> None:
    # A stream interrupted after a reasoning item, before the message or call it leads to: the
    # API refuses the item without its following item, on every request that carries it.
    history = [
        Message.user("q"),
        Message(role="assistant", content=[
            ThinkingBlock(thinking="kept", signature='{"id":"rs_ok","summary":[]}'),
            ToolUseBlock(id="call_1", name="f", input={}),
        ]),
        Message(role="user", content=[ToolResultBlock(tool_use_id="call_1", content="done")]),
        Message(role="assistant", content=cut, partial=True),
    ]  # fmt: skip
    if not last:
        history.append(Message.user("go on"))
    server = MockServer(sse(CREATED, completed()))
    async with server.client() as client:
        await collect(OpenAIResponsesModel("o", api_key=API_KEY, http_client=client), request(*history))
    items = server.body["input"]
    assert [i["id"] for i in items if i["type"] == "reasoning"] == ["rs_ok"]  # the one a call follows
    texts = [i["content"] for i in items if i["type"] == "message"]
    assert texts == ["q", *(["Let me"] if isinstance(cut[0], TextBlock) else []), *([] if last else ["go on"])]
    assert history[-1 if last else -2].content == cut  # the transcript is not changed


@pytest.mark.parametrize("store", [None, False])
async def test_a_reasoning_item_whose_hosted_tool_item_was_not_kept_is_not_sent(store: bool | None) -> None:
    # Output rs_1, web_search_call, rs_2, message: the hosted tool item is not kept, so the
    # transcript holds rs_1, rs_2, message; rs_1 sent back without the item that followed it
    # is refused ("provided without its required following item"), on every request.
    def rs(i: str) -> ThinkingBlock:
        return ThinkingBlock(thinking=f"plan {i}", signature=f'{{"id":"rs_{i}","summary":[],"encrypted_content":"E{i}"}}')

    turn = Message(role="assistant", content=[rs("1"), rs("2"), TextBlock(text="Found it."),
                                              rs("3"), rs("4"), ToolUseBlock(id="call_1", name="f", input={})])  # fmt: skip
    history = [Message.user("search"), turn,
               Message(role="user", content=[ToolResultBlock(tool_use_id="call_1", content="ok")])]  # fmt: skip
    server = MockServer(sse(CREATED, completed()))
    async with server.client() as client:
        await collect(OpenAIResponsesModel("o", api_key=API_KEY, http_client=client, store=store), request(*history))
    kinds = [(i["type"], i.get("id")) for i in server.body["input"]]
    assert kinds == [
        ("message", None), ("reasoning", "rs_2"), ("message", None),
        ("reasoning", "rs_4"), ("function_call", None), ("function_call_output", None),
    ]  # fmt: skip
    assert [b.thinking for b in turn.content if isinstance(b, ThinkingBlock)] == ["plan 1", "plan 2", "plan 3", "plan 4"]


@pytest.mark.parametrize(("reason", "stop"), [("max_output_tokens", "max_tokens"), ("content_filter", "refusal")])
async def test_an_incomplete_response_without_its_status_is_still_incomplete(reason: str, stop: str) -> None:
    # A server that leaves `status` out of the response: the event says it was cut.
    fc = {"id": "fc_1", "type": "function_call", "call_id": "call_1", "name": "f", "arguments": ""}
    body = sse(
        CREATED,
        ev("response.output_item.added", output_index=0, item=fc),
        ev("response.function_call_arguments.delta", output_index=0, item_id="fc_1", delta='{"path": "/tm'),
        ev("response.incomplete", response={"id": "resp_1", "incomplete_details": {"reason": reason}}),
    )
    _, acc = await run_body(body)
    assert acc.stop_reason == stop  # before: tool_use, and the cut call was "not valid JSON"
    assert "incomplete" in (acc.message().tool_uses[0].input_error or "")


@pytest.mark.parametrize("choice", ["any", "required"])
async def test_any_and_required_force_some_tool_never_one_named_required(choice: str) -> None:
    server = MockServer(sse(CREATED, completed()))
    async with server.client() as client:
        model = OpenAIResponsesModel("m", api_key=API_KEY, http_client=client)
        await collect(model, request(tool_choice=choice))
    assert server.body["tool_choice"] == "required"
