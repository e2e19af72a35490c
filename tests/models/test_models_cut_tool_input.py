"""A tool call that max_tokens (or a refusal, a content filter) cut before its input JSON was
finished gets an error result that says the input was incomplete; it is never run, neither
with the cut input nor with empty arguments. Every provider's path ends there."""

from __future__ import annotations

import json
from collections.abc import Callable
from typing import Any

import httpx
import pytest
from _models_support import API_KEY, chat_chunk, chat_stream, sse
from hypothesis import given
from hypothesis import strategies as st

from agentloop import QueryEngine, ToolCallFinished, TurnEnded, tool, validate_transcript
from agentloop._accumulate import Accumulator
from agentloop._messages import ToolResultBlock
from agentloop._model import StreamBlockStop, StreamEnd, StreamText, StreamToolInput, StreamToolUseStart
from agentloop.models import AnthropicModel, OpenAIChatModel, OpenAIResponsesModel

# -- the accumulator's decision ----------------------------------------------------------


def _call(pieces: list[str], stop_reason: str | None, *, then_text: bool = False) -> Any:
    acc = Accumulator()
    events: list[Any] = [StreamToolUseStart(0, "t1", "write"), *(StreamToolInput(0, p) for p in pieces)]
    events.append(StreamBlockStop(0))
    if then_text:
        events.append(StreamText(1, "more"))
    events.append(StreamEnd(stop_reason))
    for ev in events:
        acc.feed(ev)
    (use,) = acc.message().tool_uses
    return use


@pytest.mark.parametrize("stop", ["max_tokens", "refusal", "model_context_window_exceeded"])
@pytest.mark.parametrize("pieces", [['{"path": "/tmp/a", "text": "hel'], ['{"path"'], ['{'], [], [""]])
def test_a_cut_input_is_an_incomplete_input_error(stop: str, pieces: list[str]) -> None:
    use = _call(pieces, stop)
    assert use.complete and use.input == {}
    assert use.input_error is not None and "incomplete" in use.input_error and stop in use.input_error


@pytest.mark.parametrize("stop", ["max_tokens", "refusal"])
def test_a_finished_input_under_a_cut_stop_is_kept(stop: str) -> None:
    use = _call(['{"path": "/tmp/a"', "}"], stop)
    assert (use.input, use.input_error) == ({"path": "/tmp/a"}, None)


def test_an_empty_input_that_is_not_last_under_a_cut_stop_was_finished() -> None:
    # Output after the call: the model had moved on, so a call without arguments was whole.
    use = _call([], "max_tokens", then_text=True)
    assert (use.input, use.input_error) == ({}, None)


@pytest.mark.parametrize("stop", ["end_turn", "tool_use", None])
def test_an_empty_input_without_a_cut_stop_is_no_arguments(stop: str | None) -> None:
    use = _call([], stop)
    assert (use.input, use.input_error) == ({}, None)


@given(
    value=st.dictionaries(st.text(max_size=5), st.text(max_size=8) | st.integers(), min_size=1, max_size=3),
    data=st.data(),
)
def test_any_proper_prefix_of_an_input_cut_by_max_tokens_is_never_run(value: dict[str, Any], data: Any) -> None:
    text = json.dumps(value)
    cut = data.draw(st.integers(0, len(text) - 1))
    use = _call([text[:cut]], "max_tokens")
    assert use.input_error is not None and "incomplete" in use.input_error


# -- every provider, through the engine ---------------------------------------------------

_ARGS = '{"path": "/tmp/notes.txt", "text": "a long te'


def _anthropic(stop: str, args: str) -> bytes:
    events: list[tuple[str, Any]] = [
        ("message_start", {"type": "message_start", "message": {"id": "m"}}),
        ("content_block_start", {"type": "content_block_start", "index": 0,
                                 "content_block": {"type": "tool_use", "id": "toolu_1", "name": "write", "input": {}}}),
    ]  # fmt: skip
    if args:
        events.append(("content_block_delta", {"type": "content_block_delta", "index": 0,
                                               "delta": {"type": "input_json_delta", "partial_json": args}}))  # fmt: skip
    events += [
        ("content_block_stop", {"type": "content_block_stop", "index": 0}),
        ("message_delta", {"type": "message_delta", "delta": {"stop_reason": stop}}),
        ("message_stop", {"type": "message_stop"}),
    ]
    return sse(*events)


def _chat(finish: str, args: str) -> bytes:
    fn = {"name": "write", **({"arguments": args} if args else {})}
    return chat_stream(
        chat_chunk({"role": "assistant", "tool_calls": [{"index": 0, "id": "call_1", "type": "function", "function": fn}]}),
        chat_chunk(finish=finish),
        {"id": "chatcmpl-1", "choices": [], "usage": {"prompt_tokens": 5, "completion_tokens": 9}},
    )


def _responses(reason: str, args: str) -> bytes:
    item = {"id": "fc_1", "type": "function_call", "call_id": "call_1", "name": "write", "arguments": ""}
    events: list[dict[str, Any]] = [
        {"type": "response.created", "response": {"id": "r"}},
        {"type": "response.output_item.added", "output_index": 0, "item": item},
    ]
    if args:
        events.append({"type": "response.function_call_arguments.delta", "output_index": 0, "item_id": "fc_1", "delta": args})
    events.append({"type": "response.incomplete", "response": {
        "id": "r", "status": "incomplete", "incomplete_details": {"reason": reason}}})  # fmt: skip
    return sse(*[(e["type"], e) for e in events])


_DONE = {
    AnthropicModel: sse(
        ("message_start", {"type": "message_start", "message": {"id": "m2"}}),
        ("content_block_start", {"type": "content_block_start", "index": 0, "content_block": {"type": "text", "text": "ok"}}),
        ("content_block_stop", {"type": "content_block_stop", "index": 0}),
        ("message_delta", {"type": "message_delta", "delta": {"stop_reason": "end_turn"}}),
        ("message_stop", {"type": "message_stop"}),
    ),
    OpenAIChatModel: chat_stream(chat_chunk({"content": "ok"}), chat_chunk(finish="stop")),
    OpenAIResponsesModel: sse(
        ("response.output_text.delta", {"type": "response.output_text.delta", "output_index": 0, "delta": "ok"}),
        ("response.completed", {"type": "response.completed", "response": {"id": "r2", "status": "completed"}}),
    ),
}  # fmt: skip

_PATHS: list[tuple[str, type, Callable[[str], bytes], str]] = [
    ("anthropic-max_tokens", AnthropicModel, lambda a: _anthropic("max_tokens", a), "max_tokens"),
    ("anthropic-refusal", AnthropicModel, lambda a: _anthropic("refusal", a), "refusal"),
    ("chat-length", OpenAIChatModel, lambda a: _chat("length", a), "max_tokens"),
    ("chat-content_filter", OpenAIChatModel, lambda a: _chat("content_filter", a), "refusal"),
    ("responses-max_output_tokens", OpenAIResponsesModel, lambda a: _responses("max_output_tokens", a), "max_tokens"),
    ("responses-content_filter", OpenAIResponsesModel, lambda a: _responses("content_filter", a), "refusal"),
]


async def _save_notes(cls: type, first: bytes) -> tuple[list[dict[str, Any]], list[bytes], QueryEngine, list[Any]]:
    """A run offered a ``write`` tool, answered by ``first`` and then a plain reply: what the
    tool was run with, the bodies left unasked for, the engine, and the run's events."""
    ran: list[dict[str, Any]] = []

    @tool
    async def write(path: str = "", text: str = "") -> str:
        """Write a file."""
        ran.append({"path": path, "text": text})
        return "written"

    bodies = [first, _DONE[cls]]

    def handler(request: httpx.Request) -> httpx.Response:
        return httpx.Response(200, headers={"content-type": "text/event-stream"}, content=bodies.pop(0))

    async with httpx.AsyncClient(transport=httpx.MockTransport(handler)) as client:
        engine = QueryEngine(cls("m", api_key=API_KEY, http_client=client), tools=[write], policies=[])
        events = [e async for e in engine.run("save my notes")]
    return ran, bodies, engine, events


@pytest.mark.parametrize("args", [_ARGS, "", '{"path": ' + "[" * 5000], ids=["cut-json", "no-json-yet", "bracket-loop"])
@pytest.mark.parametrize(("name", "cls", "make", "stop"), _PATHS, ids=[p[0] for p in _PATHS])
async def test_a_call_cut_before_its_input_was_finished_is_answered_with_an_error_and_not_run(
    name: str, cls: type, make: Callable[[str], bytes], stop: str, args: str
) -> None:
    ran, bodies, engine, events = await _save_notes(cls, make(args))
    assert ran == []  # never run, not even with empty or default arguments
    (finished,) = [e for e in events if isinstance(e, ToolCallFinished)]
    result = finished.result
    assert isinstance(result, ToolResultBlock) and result.is_error
    # A refusal's calls are not run at all, cut or whole, and the turn ends with the refusal.
    said = "Not run" if stop == "refusal" else "incomplete"
    assert said in result.text and stop in result.text
    assert isinstance(events[-1], TurnEnded) and events[-1].reason == "completed"
    assert len(bodies) == (1 if stop == "refusal" else 0)
    assert validate_transcript(engine.messages) == []


_WHOLE = '{"path": "/tmp/notes.txt", "text": "hello"}'


@pytest.mark.parametrize(("name", "cls", "make", "stop"), [p for p in _PATHS if p[3] == "refusal"],
                         ids=[p[0] for p in _PATHS if p[3] == "refusal"])  # fmt: skip
async def test_a_whole_call_in_a_refused_response_is_not_run_and_the_turn_ends(
    name: str, cls: type, make: Callable[[str], bytes], stop: str
) -> None:
    """Anthropic's refusal and both OpenAI APIs' content filter: the response is marked refused,
    its finished call is answered as not run, and the model is not asked again in that turn."""
    ran, bodies, engine, events = await _save_notes(cls, make(_WHOLE))
    assert ran == [] and len(bodies) == 1
    (finished,) = [e for e in events if isinstance(e, ToolCallFinished)]
    assert finished.synthetic and finished.tool_use.input == {"path": "/tmp/notes.txt", "text": "hello"}
    assert finished.result.is_error and "Not run" in finished.result.text
    assert engine.messages[1].meta.get("stop_reason") == "refusal"
    assert isinstance(events[-1], TurnEnded) and events[-1].reason == "completed"
    assert validate_transcript(engine.messages) == []
