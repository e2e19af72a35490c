"""OpenAIResponsesModel against the Responses emulations of OpenAI-compatible servers.

The streams are built the way each server's code builds them (WIRE.md §5): llama.cpp
(``tools/server/server-task.cpp``, ``to_json_oaicompat_resp`` and ``..._resp_stream``) sends no
``output_index``, ``content_index`` or ``sequence_number``, and its function call items have no
``id``, only a ``call_id`` that the argument deltas name as their ``item_id``; Ollama
(``openai/responses.go``) gives a message and the first function call after it the same
``output_index``, and leaves the message out of its completed output; LiteLLM's bridge to
chat-completion models (``litellm/responses/litellm_completion_transformation/
streaming_iterator.py``) puts a reasoning item and the message after it both at 0, and its
proxy ends a failing stream with a Chat-shaped error; vLLM
(``vllm/entrypoints/openai/responses/simple_streaming_events.py``) closes the raw reasoning as
a content part.
"""

from __future__ import annotations

import json
from typing import Any

import pytest
from _models_support import MockServer, collect, ev, request, sse
from _models_support import run_responses as run_body

from agentloop._errors import PromptTooLongError, ProviderStreamError, StreamProtocolError
from agentloop._messages import Message, ThinkingBlock
from agentloop.models import (
    OpenAIResponsesModel,
    StreamText,
    StreamThinking,
    StreamToolInput,
    StreamToolUseStart,
)


def llama_cpp_call(call_id: str, name: str, arguments: str, status: str) -> dict[str, Any]:
    return {"type": "function_call", "status": status, "arguments": arguments, "call_id": call_id, "name": name}


def llama_cpp_stream(thinking: list[str], text: list[str], calls: list[tuple[str, str, list[str]]]) -> bytes:
    """A llama.cpp ``/v1/responses`` stream: reasoning, a message, function calls."""
    head = {"id": "resp_L", "object": "response", "status": "in_progress"}
    events = [ev("response.created", response=head), ev("response.in_progress", response=head)]
    reasoning = {"id": "rs_L", "summary": [], "type": "reasoning", "content": [], "encrypted_content": "",
                 "status": "in_progress"}  # fmt: skip
    message = {"content": [], "id": "msg_L", "role": "assistant", "status": "in_progress", "type": "message"}
    if thinking:
        events.append(ev("response.output_item.added", item=reasoning))
        events += [ev("response.reasoning_text.delta", delta=d, item_id="rs_L") for d in thinking]
    if text:
        events.append(ev("response.output_item.added", item=message))
        events.append(ev("response.content_part.added", item_id="msg_L", part={"type": "output_text", "text": ""}))
        events += [ev("response.output_text.delta", item_id="msg_L", delta=d) for d in text]
    for call_id, name, deltas in calls:
        events.append(ev("response.output_item.added", item=llama_cpp_call(call_id, name, "", "in_progress")))
        events += [ev("response.function_call_arguments.delta", delta=d, item_id=call_id) for d in deltas]
    output: list[dict[str, Any]] = []
    if thinking:
        done = {**reasoning, "content": [{"text": "".join(thinking), "type": "reasoning_text"}]}
        del done["status"]
        events.append(ev("response.output_item.done", item=done))
        output.append(done)
    if text:
        part = {"type": "output_text", "annotations": [], "logprobs": [], "text": "".join(text)}
        events.append(ev("response.output_text.done", item_id="msg_L", text="".join(text)))
        events.append(ev("response.content_part.done", item_id="msg_L", part=part))
        done = {**message, "status": "completed", "content": [part]}
        events.append(ev("response.output_item.done", item=done))
        output.append(done)
    for call_id, name, deltas in calls:
        done = llama_cpp_call(call_id, name, "".join(deltas), "completed")
        events.append(ev("response.output_item.done", item=done))
        output.append(done)
    usage = {"input_tokens": 20, "output_tokens": 9, "total_tokens": 29}
    events.append(ev("response.completed", response={**head, "status": "completed", "model": "qwen3",
                                                     "output": output, "usage": usage}))  # fmt: skip
    return sse(*events)


async def test_llama_cpp_reasoning_text_and_two_calls() -> None:
    # Before: the two function calls (no id, no output_index) were one item, so the second one
    # restarted the first one's block and its final arguments contradicted the first's: a
    # retryable StreamProtocolError on every such response.
    body = llama_cpp_stream(
        ["The user wants ", "the weather."],
        ["I'll check ", "both."],
        [("fc_a1", "get_weather", ['{"city":', ' "Paris"}']), ("fc_b2", "get_time", ['{"tz": "CET"}'])],
    )
    events, acc = await run_body(body)
    msg = acc.message()
    thinking = msg.content[0]
    assert isinstance(thinking, ThinkingBlock)
    assert thinking.thinking == "The user wants the weather."
    assert msg.text == "I'll check both."
    assert [(t.id, t.name, t.input) for t in msg.tool_uses] == [
        ("fc_a1", "get_weather", {"city": "Paris"}),
        ("fc_b2", "get_time", {"tz": "CET"}),
    ]
    assert acc.stop_reason == "tool_use"
    assert acc.usage.input_tokens == 20
    # Each piece streamed once, as it came: nothing is emitted again from the final copies.
    assert "".join(e.text for e in events if isinstance(e, StreamText)) == "I'll check both."
    assert "".join(e.thinking for e in events if isinstance(e, StreamThinking)) == "The user wants the weather."
    assert [e.partial_json for e in events if isinstance(e, StreamToolInput)] == ['{"city":', ' "Paris"}', '{"tz": "CET"}']
    assert [e.id for e in events if isinstance(e, StreamToolUseStart)] == ["fc_a1", "fc_b2"]


async def test_llama_cpp_one_call_without_text() -> None:
    body = llama_cpp_stream([], [], [("fc_x", "f", ['{"k": ', '"v"}'])])
    events, acc = await run_body(body)
    assert [(t.id, t.input) for t in acc.message().tool_uses] == [("fc_x", {"k": "v"})]
    assert "".join(e.partial_json for e in events if isinstance(e, StreamToolInput)) == '{"k": "v"}'


def ollama_stream() -> bytes:
    """Ollama's stream for thinking, then text, then two calls (its ``output_index`` for the
    message and the first call is the same; its completed output has no message)."""
    head = {"id": "resp_O", "object": "response", "status": "in_progress", "output": []}
    rs = {"id": "rs_1", "type": "reasoning", "summary": []}
    msg = {"id": "msg_O", "type": "message", "status": "in_progress", "role": "assistant", "content": []}
    calls = [
        {"id": "fc_9_0", "type": "function_call", "status": "in_progress", "call_id": "call_a", "name": "f",
         "arguments": ""},
        {"id": "fc_9_1", "type": "function_call", "status": "in_progress", "call_id": "call_b", "name": "g",
         "arguments": ""},
    ]  # fmt: skip
    args = ['{"x": 1}', '{"y": 2}']
    summary = [{"type": "summary_text", "text": "Plan."}]
    done_rs = {**rs, "summary": summary, "encrypted_content": "Plan."}
    events = [
        ev("response.created", response=head),
        ev("response.in_progress", response=head),
        ev("response.output_item.added", output_index=0, item=rs),
        ev("response.reasoning_summary_text.delta", item_id="rs_1", output_index=0, summary_index=0, delta="Plan."),
        ev("response.reasoning_summary_text.done", item_id="rs_1", output_index=0, summary_index=0, text="Plan."),
        ev("response.output_item.done", output_index=0, item=done_rs),
        ev("response.output_item.added", output_index=1, item=msg),
        ev("response.content_part.added", item_id="msg_O", output_index=1, content_index=0,
           part={"type": "output_text", "text": "", "annotations": [], "logprobs": []}),
        ev("response.output_text.delta", item_id="msg_O", output_index=1, content_index=0, delta="Let me check."),
    ]  # fmt: skip
    output: list[dict[str, Any]] = [done_rs]
    for i, (item, a) in enumerate(zip(calls, args, strict=True)):
        at = 1 + i
        done = {**item, "status": "completed", "arguments": a}
        events += [
            ev("response.output_item.added", output_index=at, item=item),
            ev("response.function_call_arguments.delta", item_id=item["id"], output_index=at, delta=a),
            ev("response.function_call_arguments.done", item_id=item["id"], output_index=at, arguments=a),
            ev("response.output_item.done", output_index=at, item=done),
        ]
        output.append(done)
    events.append(ev("response.completed", response={**head, "status": "completed", "output": output,
                                                     "usage": {"input_tokens": 5, "output_tokens": 6}}))  # fmt: skip
    for n, (_, data) in enumerate(events):
        data["sequence_number"] = n
    return sse(*events)


async def test_ollama_text_then_calls_at_the_same_output_index() -> None:
    # Before: the first call went into the message's block, so its arguments were appended to the
    # answer ('Let me check.{"x": 1}') and the call was lost.
    events, acc = await run_body(ollama_stream())
    msg = acc.message()
    assert msg.text == "Let me check."
    assert [(t.id, t.name, t.input) for t in msg.tool_uses] == [("call_a", "f", {"x": 1}), ("call_b", "g", {"y": 2})]
    assert isinstance(msg.content[0], ThinkingBlock) and msg.content[0].thinking == "Plan."
    assert acc.stop_reason == "tool_use"
    assert "".join(e.text for e in events if isinstance(e, StreamText)) == "Let me check."


def litellm_stream() -> bytes:
    """LiteLLM's Responses stream for a chat-completions model that reasons, answers, then
    calls a tool (``litellm/responses/litellm_completion_transformation/streaming_iterator.py``):
    the reasoning item and the message are both at ``output_index`` 0, and the message gets no
    ``output_item.added`` when reasoning came first."""
    head = {"id": "resp_X", "object": "response", "status": "in_progress", "output": []}
    rs = {"id": "rs_u1", "type": "reasoning", "status": "in_progress", "summary": None}
    rs_done = {"id": "rs_u1", "type": "reasoning", "summary": [{"type": "summary_text", "text": "Hmm. Weather."}]}
    msg_done = {"id": "msg_u2", "status": "completed", "type": "message", "role": "assistant",
                "content": [{"type": "output_text", "text": "Checking now.", "annotations": []}]}  # fmt: skip
    fc = {"id": "call_7", "type": "function_call", "call_id": "call_7", "name": "weather", "arguments": "",
          "status": "in_progress"}  # fmt: skip
    events = [
        ev("response.created", response=head),
        ev("response.in_progress", response=head),
        ev("response.output_item.added", output_index=0, item=rs),
        ev("response.reasoning_summary_text.delta", item_id="rs_u1", output_index=0, delta="Hmm. "),
        ev("response.reasoning_summary_text.delta", item_id="rs_u1", output_index=0, delta="Weather."),
        ev("response.reasoning_summary_text.done", item_id="rs_u1", output_index=0, summary_index=0,
           text="Hmm. Weather."),
        ev("response.reasoning_summary_part.done", item_id="rs_u1", output_index=0, summary_index=0,
           part={"type": "summary_text", "text": "Hmm. Weather."}),
        ev("response.output_item.done", output_index=0, item=rs_done),
        ev("response.output_text.delta", item_id="msg_u2", output_index=0, content_index=0, delta="Checking "),
        ev("response.output_text.delta", item_id="msg_u2", output_index=0, content_index=0, delta="now."),
        ev("response.output_item.added", output_index=1, item=fc),
        ev("response.function_call_arguments.delta", item_id="call_7", output_index=1, delta='{"city": "Os'),
        ev("response.function_call_arguments.delta", item_id="call_7", output_index=1, delta='lo"}'),
        ev("response.function_call_arguments.done", item_id="call_7", output_index=1, arguments='{"city": "Oslo"}'),
        ev("response.output_item.done", output_index=1, item={**fc, "status": "completed",
                                                              "arguments": '{"city": "Oslo"}'}),
        ev("response.output_text.done", item_id="msg_u2", output_index=0, content_index=0, text="Checking now."),
        # (with reasoning, LiteLLM's content_part.done for the message carries the reasoning)
        ev("response.content_part.done", item_id="msg_u2", output_index=0, content_index=0,
           part={"type": "reasoning_text", "reasoning": "Hmm. Weather."}),
        ev("response.output_item.done", output_index=0, item=msg_done),
        ev("response.completed", response={**head, "status": "completed", "usage": {"input_tokens": 1, "output_tokens": 2},
                                           "output": [rs_done, msg_done, {**fc, "arguments": '{"city": "Oslo"}'}]}),
    ]  # fmt: skip
    return sse(*events)


async def test_litellm_reasoning_and_message_at_the_same_output_index() -> None:
    # Before: the answer's deltas went into the reasoning item's block, so the answer was lost
    # into the thinking ("Hmm. Weather.Checking now.") and the message had no text.
    events, acc = await run_body(litellm_stream())
    msg = acc.message()
    thinking = msg.content[0]
    assert isinstance(thinking, ThinkingBlock)
    assert thinking.thinking == "Hmm. Weather."
    assert msg.text == "Checking now."
    assert [(t.id, t.input) for t in msg.tool_uses] == [("call_7", {"city": "Oslo"})]
    assert "".join(e.text for e in events if isinstance(e, StreamText)) == "Checking now."


@pytest.mark.parametrize(
    "delta",
    [
        ev("response.output_text.delta", output_index=0, item_id="fc_1", content_index=0, delta="hi"),
        ev("response.output_text.delta", output_index=0, content_index=0, delta="hi"),
        ev("response.reasoning_summary_text.delta", output_index=0, summary_index=0, delta="hm"),
    ],
    ids=["same-id", "no-id", "thinking"],
)
async def test_a_delta_of_another_type_for_the_same_item_is_a_retryable_protocol_error(delta: Any) -> None:
    # Mapped as it came, the text would go into the call's input (or thinking into the answer).
    fc = {"id": "fc_1", "type": "function_call", "call_id": "call_1", "name": "f", "arguments": ""}
    added = ev("response.output_item.added", output_index=0, item=fc)
    with pytest.raises(StreamProtocolError, match="function_call item") as info:
        await run_body(sse(ev("response.created", response={"id": "r"}), added, delta))
    assert info.value.retryable is True


async def test_llama_cpp_reasoning_goes_back_with_its_content() -> None:
    # llama.cpp refuses a reasoning input item without a non-empty `content` array ("item['content']
    # is not an array", a 400), so every request after a response that reasoned failed.
    _, acc = await run_body(llama_cpp_stream(["Think", "ing."], ["Hi."], []), base_url="http://127.0.0.1:8080/v1")
    server = MockServer(llama_cpp_stream([], ["Again."], []))
    async with server.client() as client:
        model = OpenAIResponsesModel("m", base_url="http://127.0.0.1:8080/v1", http_client=client)
        await collect(model, request(Message.user("q"), acc.message(), Message.user("more")))
    (item,) = [i for i in server.body["input"] if i["type"] == "reasoning"]
    assert item["content"] == [{"text": "Thinking.", "type": "reasoning_text"}]
    assert item["content"][0]["text"] == acc.message().content[0].thinking  # type: ignore[union-attr]
    assert "encrypted_content" not in item  # llama.cpp's is "": nothing to send


async def test_raw_reasoning_only_in_the_final_item_is_the_thinking() -> None:
    # vLLM and llama.cpp put the raw reasoning in the item's `content`; a server that streams
    # none of it (or a gateway that drops the deltas) lost it: the thinking was empty.
    rs = {"id": "rs_v", "type": "reasoning", "summary": [],
          "content": [{"type": "reasoning_text", "text": "Step one."}]}  # fmt: skip
    body = sse(
        ev("response.created", response={"id": "r"}),
        ev("response.output_item.added", output_index=0, item={**rs, "content": []}),
        ev("response.output_item.done", output_index=0, item=rs),
        ev("response.completed", response={"id": "r", "status": "completed", "output": [rs]}),
    )
    events, acc = await run_body(body)
    (thinking,) = acc.message().content
    assert isinstance(thinking, ThinkingBlock)
    assert thinking.thinking == "Step one."
    assert "".join(e.thinking for e in events if isinstance(e, StreamThinking)) == "Step one."


async def test_raw_reasoning_cut_short_is_completed_by_its_final_copies_once() -> None:
    rs = {"id": "rs_v", "type": "reasoning", "summary": []}
    at = {"output_index": 0, "item_id": "rs_v", "content_index": 0}
    body = sse(
        ev("response.created", response={"id": "r"}),
        ev("response.output_item.added", output_index=0, item=rs),
        ev("response.reasoning_text.delta", **at, delta="Step"),
        ev("response.reasoning_text.done", **at, text="Step one. Step two."),
        ev("response.output_item.done", output_index=0,
           item={**rs, "content": [{"type": "reasoning_text", "text": "Step one. Step two."}]}),
        ev("response.completed", response={"id": "r", "status": "completed"}),
    )  # fmt: skip
    events, acc = await run_body(body)
    assert acc.message().content[0].thinking == "Step one. Step two."  # type: ignore[union-attr]
    assert "".join(e.thinking for e in events if isinstance(e, StreamThinking)) == "Step one. Step two."
    with pytest.raises(StreamProtocolError, match="differs from its final text"):
        await run_body(body.replace(b'"Step one. Step two."', b'"Other steps."'))


@pytest.mark.parametrize(
    ("error", "retryable", "cls"),
    [
        ({"message": "Rate limit reached for gpt-4.1", "type": "None", "param": "None", "code": "429"}, True,
         ProviderStreamError),
        ({"message": "upstream died", "type": "InternalServerError", "code": 500}, True, ProviderStreamError),
        ({"message": "This model's maximum context length is 8192 tokens", "type": "BadRequestError",
          "code": "400"}, False, PromptTooLongError),
        ({"message": "bad request", "type": "invalid_request_error", "code": "400"}, False, ProviderStreamError),
    ],
    ids=["rate-limit", "server", "context", "bad-request"],
)
async def test_a_proxys_chat_style_error_in_a_responses_stream_is_its_error(
    error: dict[str, Any], retryable: bool, cls: type[Exception]
) -> None:
    # LiteLLM's proxy ends a failing stream with `data: {"error": {...}}` (no type, no event name)
    # on every endpoint; the official SDK raises on any event with a top-level "error". Before,
    # it was skipped as an unknown event, and the run failed with "stream ended without
    # response.completed" (retried even for a context overflow), the server's message lost.
    body = sse(ev("response.created", response={"id": "r"}), (None, {"error": error}))
    with pytest.raises(cls) as info:
        await run_body(body)
    assert error["message"] in str(info.value)
    assert info.value.retryable is retryable  # type: ignore[attr-defined]


async def test_items_that_nothing_names_follow_each_other() -> None:
    # A minimal emulation: no output_index, no item_id, no item events. The thinking and the
    # answer are two items, one after the other (not one block of both, not an error).
    body = sse(
        ev("response.created", response={"id": "r"}),
        ev("response.reasoning_text.delta", delta="Let me think."),
        ev("response.output_text.delta", delta="Hello"),
        ev("response.output_text.delta", delta=" there."),
        ev("response.completed", response={"id": "r", "status": "completed", "output": [
            {"type": "message", "role": "assistant", "content": [{"type": "output_text", "text": "Hello there."}]}]}),
    )  # fmt: skip
    events, acc = await run_body(body)
    thinking, text = acc.message().content
    assert (thinking.type, thinking.thinking) == ("thinking", "Let me think.")  # type: ignore[union-attr]
    assert (text.type, text.text) == ("text", "Hello there.")  # type: ignore[union-attr]
    assert "".join(e.text for e in events if isinstance(e, StreamText)) == "Hello there."


@pytest.mark.parametrize("head", [{}, {"response": None}, {"response": {"status": "in_progress"}}])
async def test_lifecycle_events_without_a_response_are_no_error(head: dict[str, Any]) -> None:
    # A minimal emulation's response.created / response.in_progress carry no response object:
    # before, each was a malformed event, so every request failed (and was retried) for nothing.
    body = sse(
        ev("response.created", **head),
        ev("response.in_progress", **head),
        ev("response.output_text.delta", item_id="m", delta="Hi."),
        ev("response.completed", response={"id": "resp_9", "status": "completed"}),
    )
    _, acc = await run_body(body)
    assert (acc.message().text, acc.response_id) == ("Hi.", "resp_9")


def vllm_stream(thinking: list[str], text: list[str]) -> bytes:
    """vLLM's Responses stream for a reasoning parser's output
    (``vllm/entrypoints/openai/responses/simple_streaming_events.py``): the reasoning item's
    raw text opens and closes as a *content part* of type ``reasoning_text``."""
    head = {"id": "resp_V", "object": "response", "status": "in_progress", "output": []}
    rs = {"type": "reasoning", "id": "a1b2", "summary": [], "status": "in_progress"}
    msg = {"id": "c3d4", "type": "message", "role": "assistant", "content": [], "status": "in_progress"}
    rs_at = {"output_index": 0, "item_id": "a1b2", "content_index": 0}
    msg_at = {"output_index": 1, "item_id": "c3d4", "content_index": 0}
    reasoning, answer = "".join(thinking), "".join(text)
    rs_done = {**rs, "status": "completed", "content": [{"text": reasoning, "type": "reasoning_text"}]}
    part = {"type": "output_text", "text": answer, "annotations": []}
    msg_done = {**msg, "status": "completed", "content": [part]}
    events = [
        ev("response.created", response=head),
        ev("response.in_progress", response=head),
        ev("response.output_item.added", output_index=0, item=rs),
        ev("response.content_part.added", **rs_at, part={"type": "reasoning_text", "text": ""}),
        *[ev("response.reasoning_text.delta", **rs_at, delta=d) for d in thinking],
        ev("response.reasoning_text.done", **rs_at, text=reasoning),
        ev("response.content_part.done", **rs_at, part={"text": reasoning, "type": "reasoning_text"}),
        ev("response.output_item.done", output_index=0, item=rs_done),
        ev("response.output_item.added", output_index=1, item=msg),
        ev("response.content_part.added", **msg_at, part={"type": "output_text", "text": "", "annotations": []}),
        *[ev("response.output_text.delta", **msg_at, delta=d, logprobs=[]) for d in text],
        ev("response.output_text.done", **msg_at, text=answer, logprobs=[]),
        ev("response.content_part.done", **msg_at, part=part),
        ev("response.output_item.done", output_index=1, item=msg_done),
        ev("response.completed", response={**head, "status": "completed", "output": [rs_done, msg_done],
                                           "usage": {"input_tokens": 7, "output_tokens": 8}}),
    ]  # fmt: skip
    for n, (_, data) in enumerate(events):
        data["sequence_number"] = n
    return sse(*events)


async def test_vllm_reasoning_closed_as_a_content_part() -> None:
    events, acc = await run_body(vllm_stream(["Two ", "plus two."], ["It is ", "4."]))
    thinking, text = acc.message().content
    assert isinstance(thinking, ThinkingBlock)
    assert thinking.thinking == "Two plus two."
    assert json.loads(thinking.signature)["content"] == [{"text": "Two plus two.", "type": "reasoning_text"}]
    assert text.text == "It is 4."  # type: ignore[union-attr]
    assert "".join(e.thinking for e in events if isinstance(e, StreamThinking)) == "Two plus two."
    assert "".join(e.text for e in events if isinstance(e, StreamText)) == "It is 4."


async def test_final_copies_at_the_next_items_output_index_go_to_the_item_they_name() -> None:
    # vLLM's older gpt-oss (harmony) streaming sent an item's .done events with the *next* item's
    # output_index (and the item's own item_id): they made a new item, so the thinking and the
    # answer came twice.
    rs = {"id": "rs_1", "type": "reasoning", "summary": []}
    msg = {"id": "msg_1", "type": "message", "role": "assistant", "content": []}
    rs_done = {**rs, "content": [{"type": "reasoning_text", "text": "Think."}]}
    msg_done = {**msg, "content": [{"type": "output_text", "text": "Answer."}]}
    body = sse(
        ev("response.created", response={"id": "r"}),
        ev("response.output_item.added", output_index=0, item=rs),
        ev("response.reasoning_text.delta", output_index=0, item_id="rs_1", content_index=0, delta="Think."),
        ev("response.reasoning_text.done", output_index=1, item_id="rs_1", content_index=0, text="Think."),
        ev("response.output_item.done", output_index=1, item=rs_done),
        ev("response.output_item.added", output_index=1, item=msg),
        ev("response.output_text.delta", output_index=1, item_id="msg_1", content_index=0, delta="Answer."),
        ev("response.output_text.done", output_index=2, item_id="msg_1", content_index=0, text="Answer."),
        ev("response.output_item.done", output_index=2, item=msg_done),
        ev("response.completed", response={"id": "r", "status": "completed", "output": [rs_done, msg_done]}),
    )
    events, acc = await run_body(body)
    thinking, text = acc.message().content
    assert (thinking.thinking, text.text) == ("Think.", "Answer.")  # type: ignore[union-attr]
    assert "".join(e.thinking for e in events if isinstance(e, StreamThinking)) == "Think."
    assert "".join(e.text for e in events if isinstance(e, StreamText)) == "Answer."


async def test_two_local_servers_on_one_host_each_get_only_their_own_reasoning() -> None:
    # vLLM on :8000 and llama.cpp on :8080 of one machine are two servers: an item id one of
    # them made means nothing to the other. The block records the server as an Anthropic
    # thinking block does (`origin`: scheme, host, port and path), and its signature is the item only.
    vllm, llama = "http://127.0.0.1:8000/v1", "http://127.0.0.1:8080/v1"
    _, acc = await run_body(llama_cpp_stream(["Think", "ing."], ["Hi."], []), base_url=llama)
    (thinking, _text) = acc.message().content
    assert isinstance(thinking, ThinkingBlock)
    assert thinking.origin == "http://127.0.0.1:8080/v1"
    assert "host" not in json.loads(thinking.signature)
    history = request(Message.user("q"), acc.message(), Message.user("more"))
    sent: dict[str, list[Any]] = {}
    for base_url in (vllm, llama):
        server = MockServer(llama_cpp_stream([], ["Again."], []))
        async with server.client() as client:
            await collect(OpenAIResponsesModel("m", base_url=base_url, http_client=client), history)
        sent[base_url] = [i["id"] for i in server.body["input"] if i["type"] == "reasoning"]
    assert sent == {vllm: [], llama: [json.loads(thinking.signature)["id"]]}
