"""OpenAIResponsesModel: the output a terminal event carries (``response.completed``,
``response.incomplete``, ``response.failed``) is authoritative, as the per-item final copies are
(WIRE.md §3.2; the official SDK's final response is that ``output``, §4.3)."""

from __future__ import annotations

import json
from typing import Any

import pytest
from _models_support import API_KEY, MockServer, ev, request, sse
from _models_support import run_responses as run_body
from hypothesis import given
from hypothesis import strategies as st

from agentloop import QueryEngine, TurnEnded
from agentloop._abort import AbortController
from agentloop._errors import ProviderStreamError, StreamProtocolError
from agentloop._messages import ThinkingBlock
from agentloop.models import (
    OpenAIResponsesModel,
    StreamBlockStop,
    StreamSignature,
    StreamText,
    StreamThinking,
    StreamToolInput,
    StreamToolUseStart,
    StreamUsage,
    Usage,
)

CREATED = ev("response.created", response={"id": "resp_1", "status": "in_progress"})
USAGE = {"input_tokens": 3, "output_tokens": 4}


def terminal(output: list[dict[str, Any]], status: str = "completed", **response: Any) -> tuple[str, dict[str, Any]]:
    kind = f"response.{status}"
    return ev(kind, response={"id": "resp_1", "status": status, "output": output, "usage": USAGE, **response})


def message(text: str, item_id: str = "msg_1", kind: str = "output_text") -> dict[str, Any]:
    key = "text" if kind == "output_text" else "refusal"
    return {"id": item_id, "type": "message", "role": "assistant", "status": "completed",
            "content": [{"type": kind, key: text}]}  # fmt: skip


def call(args: str, item_id: str = "fc_1", call_id: str = "call_1", name: str = "f") -> dict[str, Any]:
    return {"id": item_id, "type": "function_call", "status": "completed", "call_id": call_id, "name": name,
            "arguments": args}  # fmt: skip


def reasoning(*parts: str, item_id: str = "rs_1", **extra: Any) -> dict[str, Any]:
    return {"id": item_id, "type": "reasoning", "summary": [{"type": "summary_text", "text": p} for p in parts],
            **extra}  # fmt: skip


def streamed_text(events: list[Any]) -> str:
    return "".join(e.text for e in events if isinstance(e, StreamText))


def streamed_input(events: list[Any]) -> str:
    return "".join(e.partial_json for e in events if isinstance(e, StreamToolInput))


def text_deltas(*deltas: str, index: int = 0, item_id: str = "msg_1") -> list[tuple[str, dict[str, Any]]]:
    added = {"id": item_id, "type": "message", "role": "assistant", "content": []}
    return [ev("response.output_item.added", output_index=index, item=added)] + [
        ev("response.output_text.delta", output_index=index, item_id=item_id, content_index=0, delta=d)
        for d in deltas
    ]


# -- items that never streamed ---------------------------------------------------------------


@pytest.mark.parametrize("status", ["completed", "incomplete"])
async def test_a_message_only_in_the_terminal_output_is_the_answer(status: str) -> None:
    # A gateway that streams nothing but the lifecycle events: the text was lost.
    events, acc = await run_body(sse(CREATED, terminal([message("Hello there.")], status)))
    assert acc.message().text == "Hello there."
    assert streamed_text(events) == "Hello there."


async def test_a_function_call_only_in_the_completed_output_is_a_call() -> None:
    events, acc = await run_body(sse(CREATED, terminal([call('{"path": "/tmp/a"}')])))
    (use,) = acc.message().tool_uses
    assert (use.id, use.name, use.input) == ("call_1", "f", {"path": "/tmp/a"})
    assert acc.stop_reason == "tool_use"  # before: end_turn, and no call at all
    assert streamed_input(events) == '{"path": "/tmp/a"}'
    assert sum(isinstance(e, StreamToolUseStart) for e in events) == 1


async def test_a_reasoning_item_only_in_the_completed_output_is_thinking_with_its_signature() -> None:
    item = reasoning("First.", "Second.", encrypted_content="ENC")
    _, acc = await run_body(sse(CREATED, terminal([item, message("Done.", "msg_2")])))
    thinking, _ = acc.message().content
    assert isinstance(thinking, ThinkingBlock)
    assert thinking.thinking == "First.\n\nSecond."
    assert json.loads(thinking.signature) == {
        "id": "rs_1", "summary": item["summary"], "encrypted_content": "ENC", "host": "api.openai.com"
    }
    assert acc.message().text == "Done."


async def test_a_refusal_only_in_the_completed_output_is_text_and_a_refusal() -> None:
    _, acc = await run_body(sse(CREATED, terminal([message("I can't help.", kind="refusal")])))
    assert (acc.message().text, acc.stop_reason) == ("I can't help.", "refusal")


async def test_items_streamed_and_items_only_in_the_output_are_each_kept_once() -> None:
    # The message streamed (with its final copies); the call after it came only in the output.
    done = ev("response.output_item.done", output_index=0, item=message("Let me look."))
    body = sse(CREATED, *text_deltas("Let me ", "look."), done, terminal([message("Let me look."), call("{}")]))
    events, acc = await run_body(body)
    assert acc.message().text == "Let me look."
    assert streamed_text(events) == "Let me look."
    assert [t.id for t in acc.message().tool_uses] == ["call_1"]


# -- items that streamed in part ---------------------------------------------------------------


@pytest.mark.parametrize("status", ["completed", "incomplete"])
async def test_text_cut_short_is_completed_by_the_terminal_output_once(status: str) -> None:
    # Deltas that stopped short and no .done events: the terminal output has the whole text.
    final = "The answer is 42, as computed."
    body = sse(CREATED, *text_deltas("The answer", " is 4"), terminal([message(final)], status))
    events, acc = await run_body(body)
    assert acc.message().text == final  # before: "The answer is 4"
    assert streamed_text(events) == final


async def test_arguments_cut_short_are_completed_by_the_completed_output_once() -> None:
    added = ev("response.output_item.added", output_index=0, item=call(""))
    delta = ev("response.function_call_arguments.delta", output_index=0, item_id="fc_1", delta='{"n": 1')
    events, acc = await run_body(sse(CREATED, added, delta, terminal([call('{"n": 12}')])))
    assert acc.message().tool_uses[0].input == {"n": 12}  # before: an input error ({"n": 1 is cut)
    assert streamed_input(events) == '{"n": 12}'


async def test_a_reasoning_summary_cut_short_is_completed_and_signed() -> None:
    added = ev("response.output_item.added", output_index=0, item=reasoning())
    delta = ev("response.reasoning_summary_text.delta", output_index=0, item_id="rs_1", summary_index=0, delta="Fir")
    item = reasoning("First.", "Second.", encrypted_content="ENC")
    events, acc = await run_body(sse(CREATED, added, delta, terminal([item])))
    (thinking,) = acc.message().content
    assert isinstance(thinking, ThinkingBlock)
    assert thinking.thinking == "First.\n\nSecond."
    assert "".join(e.thinking for e in events if isinstance(e, StreamThinking)) == thinking.thinking
    assert json.loads(thinking.signature)["encrypted_content"] == "ENC"  # before: unsigned, so dropped


async def test_output_that_repeats_the_final_copies_adds_nothing() -> None:
    done = ev("response.output_item.done", output_index=0, item=message("Hi."))
    events, _ = await run_body(sse(CREATED, *text_deltas("Hi."), done, terminal([message("Hi.")])))
    assert streamed_text(events) == "Hi."
    assert sum(isinstance(e, StreamBlockStop) for e in events) == 1
    assert not any(isinstance(e, StreamSignature) for e in events)


@pytest.mark.parametrize("status", ["completed", "incomplete"])
@pytest.mark.parametrize(
    ("streamed", "output"),
    [
        (text_deltas("The answer is 42."), [message("The answer is 43.")]),
        (
            [
                ev("response.output_item.added", output_index=0, item=call("")),
                ev("response.function_call_arguments.delta", output_index=0, item_id="fc_1", delta='{"path": "/tmp/a"}'),
            ],
            [call('{"path": "/etc/passwd"}')],
        ),
    ],
    ids=["text", "arguments"],
)
async def test_terminal_output_that_contradicts_the_stream_is_a_retryable_protocol_error(
    status: str, streamed: list[Any], output: list[dict[str, Any]]
) -> None:
    with pytest.raises(StreamProtocolError, match="differ") as info:
        await run_body(sse(CREATED, *streamed, terminal(output, status)))
    assert info.value.retryable is True


async def test_output_items_are_matched_by_id_when_the_output_leaves_one_out() -> None:
    # Ollama's completed output leaves out the message that streamed before its calls: the
    # calls are matched by their ids, not by their position in the output.
    body = sse(
        CREATED,
        *text_deltas("Checking.", index=0),
        ev("response.output_item.added", output_index=1, item=call("")),
        ev("response.function_call_arguments.delta", output_index=1, item_id="fc_1", delta="{}"),
        ev("response.output_item.done", output_index=1, item=call("{}")),
        terminal([call("{}")]),
    )
    events, acc = await run_body(body)
    assert acc.message().text == "Checking."
    assert [t.id for t in acc.message().tool_uses] == ["call_1"]
    assert sum(isinstance(e, StreamToolUseStart) for e in events) == 1


@given(
    text=st.text(st.characters(codec="utf-8"), min_size=1, max_size=30),
    data=st.data(),
)
async def test_any_deltas_cut_anywhere_and_the_output_give_the_text_once(text: str, data: st.DataObject) -> None:
    cuts = sorted(data.draw(st.lists(st.integers(0, len(text)), max_size=5), label="cuts"))
    pieces = [p for a, b in zip([0, *cuts], [*cuts, len(text)], strict=True) if (p := text[a:b])]
    sent = data.draw(st.integers(0, len(pieces)), label="deltas sent")  # the rest never arrived
    status = data.draw(st.sampled_from(["completed", "incomplete"]), label="status")
    events, acc = await run_body(sse(CREATED, *text_deltas(*pieces[:sent]), terminal([message(text)], status)))
    assert acc.message().text == text
    assert streamed_text(events) == text  # nothing emitted twice


# -- response.failed -------------------------------------------------------------------------


async def test_a_failed_response_keeps_its_output_and_counts_its_usage_before_its_error() -> None:
    # The tokens were billed: the run counts them. Text the stream had not carried is kept, so the
    # partial answer the engine keeps is the server's.
    failed = terminal([message("Partial answer, then")], "failed",
                      error={"code": "server_error", "message": "boom"})  # fmt: skip
    server = MockServer(sse(CREATED, *text_deltas("Partial"), failed))
    seen: list[Any] = []

    async def read(stream: Any) -> None:
        async for e in stream:
            seen.append(e)  # noqa: PERF401 (what came before the error is what is checked)

    async with server.client() as client:
        model = OpenAIResponsesModel("m", api_key=API_KEY, http_client=client)
        with pytest.raises(ProviderStreamError, match="boom") as info:
            await read(model.stream(request(), AbortController().signal))
    assert info.value.retryable is True
    assert streamed_text(seen) == "Partial answer, then"
    assert [e.usage for e in seen if isinstance(e, StreamUsage)] == [Usage(3, 4)]


async def test_a_failed_response_whose_output_contradicts_the_stream_still_raises_its_own_error() -> None:
    failed = terminal([message("Something else")], "failed", error={"code": "server_error", "message": "boom"})
    with pytest.raises(ProviderStreamError, match="boom"):
        await run_body(sse(CREATED, *text_deltas("Partial"), failed))


async def test_the_engine_keeps_a_failed_responses_output_and_counts_its_tokens() -> None:
    failed = terminal([message("Partial answer, then")], "failed",
                      error={"code": "invalid_prompt", "message": "flagged"})  # fmt: skip
    server = MockServer(sse(CREATED, *text_deltas("Partial"), failed))
    async with server.client() as client:
        engine = QueryEngine(OpenAIResponsesModel("m", api_key=API_KEY, http_client=client), policies=[])
        events = [e async for e in engine.run("hi")]
    end = events[-1]
    assert isinstance(end, TurnEnded)
    assert (end.reason, end.usage) == ("model_error", Usage(3, 4))  # before: Usage(0, 0)
    assert "flagged" in (end.error or "")
    kept = engine.messages[-1]
    assert (kept.role, kept.partial, kept.text) == ("assistant", True, "Partial answer, then")  # before: "Partial"
