"""What a first host program meets: the errors it gets must say what to do."""

from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import get_args

import httpx
import pytest

from agentloop import (
    Allow,
    Deny,
    Event,
    QueryEngine,
    ScriptedModel,
    ScriptedResponse,
    ScriptedToolCall,
    ToolCallFinished,
    ToolCallStarted,
    ToolContext,
    ToolUseBlock,
    tool,
)
from agentloop.models import AnthropicModel, OpenAIChatModel, OpenAIResponsesModel
from agentloop.testing import collect, turn_ended

KEY = "sk-test-walkthrough-0123456789abcdef"


def _serving(*responses: httpx.Response) -> httpx.MockTransport:
    queue = list(responses)

    def serve(request: httpx.Request) -> httpx.Response:
        return queue.pop(0)

    return httpx.MockTransport(serve)


@pytest.mark.parametrize(
    ("cls", "env_var", "body"),
    [
        (AnthropicModel, "ANTHROPIC_API_KEY", {"type": "error", "error": {"type": "authentication_error", "message": "invalid x-api-key"}}),
        (OpenAIChatModel, "OPENAI_API_KEY", {"error": {"message": "Incorrect API key provided.", "code": "invalid_api_key"}}),
        (OpenAIResponsesModel, "OPENAI_API_KEY", {"error": {"message": "Incorrect API key provided.", "code": "invalid_api_key"}}),
    ],
)
async def test_a_refused_key_says_where_the_key_comes_from(cls: type, env_var: str, body: dict[str, object]) -> None:
    # "anthropic HTTP 401: invalid x-api-key" named neither the parameter nor the variable the key
    # is read from: a first host's wrong key left its author to guess where it came from.
    async with httpx.AsyncClient(transport=_serving(httpx.Response(401, json=body))) as client:
        engine = QueryEngine(cls("m", api_key=KEY, http_client=client))
        end = turn_ended(await collect(engine.run("hi")))
    assert end.reason == "model_error" and end.error is not None
    assert "HTTP 401" in end.error and end.error.endswith("(the server refused the key passed as api_key=)")
    assert env_var not in end.error  # the key was not read from it
    assert KEY not in end.error


_RESPONSES_STREAM = (Path(__file__).parent / "models" / "fixtures" / "openai_responses_text.prism.sse").read_bytes()


async def test_a_recorded_stream_without_its_last_blank_line_is_told_apart_from_a_cut_one() -> None:
    # A stream saved to a file loses its last blank line easily (an editor, `.strip()`), and its
    # last event, the terminator, is then dropped as the SSE rules say. The error read "stream ended
    # without response.completed (connection cut or truncated response)" of a body that held one.
    sse = {"content-type": "text/event-stream"}
    assert _RESPONSES_STREAM.endswith(b"}\n\n")
    unended = _RESPONSES_STREAM[:-1]
    async with httpx.AsyncClient(transport=_serving(httpx.Response(200, headers=sse, content=unended))) as client:
        engine = QueryEngine(OpenAIResponsesModel("m", api_key=KEY, http_client=client), retry_budget=0)
        end = turn_ended(await collect(engine.run("hi")))
    assert end.reason == "model_error" and end.error is not None
    assert "without response.completed" in end.error and "blank line" in end.error
    cut = _RESPONSES_STREAM[:-40]
    async with httpx.AsyncClient(transport=_serving(httpx.Response(200, headers=sse, content=cut))) as client:
        engine = QueryEngine(OpenAIResponsesModel("m", api_key=KEY, http_client=client), retry_budget=0)
        end = turn_ended(await collect(engine.run("hi")))
    assert end.error is not None and "truncated" in end.error and "blank line" not in end.error


async def test_a_call_whose_input_fails_validation_asks_no_permission() -> None:
    # A person was asked to allow `delete(path=5, force=True)`, then the call was refused for its
    # input after all; the callback of the docs' example (`use.input["path"].startswith(...)`)
    # raised on such an input and its failure was logged as the host's bug.
    asked: list[dict[str, object]] = []

    @tool
    async def delete(path: str) -> str:
        """Delete a file."""
        return f"deleted {path}"

    async def ask(use: ToolUseBlock, ctx: ToolContext) -> Allow | Deny:
        asked.append(use.input)
        return Deny("not outside the project") if use.input["path"].startswith("/etc") else Allow()

    model = ScriptedModel([
        ScriptedResponse(tool_calls=[
            ScriptedToolCall("delete", {"path": 5, "force": True}),
            ScriptedToolCall("delete", {"path": "notes.txt"}),
        ]),
        "Done.",
    ])
    engine = QueryEngine(model, tools=[delete], permission=ask)
    events = await collect(engine.run("Clean up"))
    assert asked == [{"path": "notes.txt"}]
    started = [e.tool_use.input for e in events if isinstance(e, ToolCallStarted)]
    assert started == [{"path": "notes.txt"}]
    first, second = engine.messages[2].tool_results
    assert first.is_error and "invalid tool input" in first.text and "path" in first.text
    assert not second.is_error and second.text == "deleted notes.txt"
    assert turn_ended(events).reason == "completed"


async def test_a_call_refused_for_its_input_is_never_said_to_start() -> None:
    # `ToolCallStarted` came for a call whose input then failed validation: a host showed a
    # spinner for a tool that never ran, and a "running" call the transcript says was not run.
    @tool
    async def resize(width: int) -> str:
        """Resize."""
        return f"{width} wide"

    model = ScriptedModel([
        ScriptedResponse(tool_calls=[ScriptedToolCall("resize", {"width": "wide"}), ScriptedToolCall("resize", {"width": 3})]),
        "Done.",
    ])
    engine = QueryEngine(model, tools=[resize])
    events = await collect(engine.run("Resize"))
    assert [e.input for e in events if isinstance(e, ToolCallStarted)] == [{"width": 3}]
    finished = [e.result for e in events if isinstance(e, ToolCallFinished)]
    assert [r.is_error for r in finished] == [True, False]
    assert 'width: Input should be a valid integer' in finished[0].text


def test_the_api_page_names_every_field_of_every_event() -> None:
    # api.md said "ThinkingDelta — a fragment of streamed reasoning": a host guessed `.text`, as
    # `TextDelta` has, and met an AttributeError; ten other events' lines named none of their fields.
    api = (Path(__file__).parent.parent / "docs" / "api.md").read_text(encoding="utf-8")
    lines = {line.split("`")[1]: line for line in api.splitlines() if line.startswith("- `")}
    unnamed = {
        cls.__name__: missing
        for cls in get_args(Event)
        if (missing := [f.name for f in dataclasses.fields(cls) if f.name != "agent_id" and f"`{f.name}`" not in lines[cls.__name__]])
    }
    assert unnamed == {}


_REFUSED_EMPTY = (
    b'event: message_start\ndata: {"type":"message_start","message":{"id":"msg_1","type":"message",'
    b'"role":"assistant","content":[],"model":"m","usage":{"input_tokens":20,"output_tokens":1}}}\n\n'
    b'event: content_block_start\ndata: {"type":"content_block_start","index":0,"content_block":{"type":"text","text":""}}\n\n'
    b'event: content_block_stop\ndata: {"type":"content_block_stop","index":0}\n\n'
    b'event: message_delta\ndata: {"type":"message_delta","delta":{"stop_reason":"refusal","stop_details":'
    b'{"type":"refusal","category":"cyber"}},"usage":{"output_tokens":0}}\n\n'
    b'event: message_stop\ndata: {"type":"message_stop"}\n\n'
)


async def test_a_refusal_with_nothing_in_it_is_not_a_silent_completed_turn() -> None:
    # The anthropic SDK's own refusal fixture: no text at all. No `AssistantMessage` came, the
    # turn ended `completed` with nothing else to tell, and `engine.messages[-1].text`, where the
    # docs send a host for the answer, was the user's own prompt.
    sse = {"content-type": "text/event-stream"}
    async with httpx.AsyncClient(transport=_serving(httpx.Response(200, headers=sse, content=_REFUSED_EMPTY))) as client:
        engine = QueryEngine(AnthropicModel("m", api_key=KEY, http_client=client))
        end = turn_ended(await collect(engine.run("hi")))
    assert end.reason == "completed"
    assert end.detail is not None and "refusal" in end.detail and "empty" in end.detail
    assert [m.role for m in engine.messages] == ["user"]


async def test_an_empty_answer_after_a_tool_batch_says_so() -> None:
    @tool
    async def ls() -> str:
        """List."""
        return "a.py"

    model = ScriptedModel([ScriptedResponse(tool_calls=[ScriptedToolCall("ls")]), ScriptedResponse(text=" ")])
    engine = QueryEngine(model, tools=[ls])
    end = turn_ended(await collect(engine.run("List")))
    assert end.reason == "completed" and end.detail is not None and "end_turn" in end.detail
    # A turn that answered has no detail.
    end = turn_ended(await collect(QueryEngine(ScriptedModel(["Hi."])).run("Hi")))
    assert end.detail is None


async def test_run_without_a_prompt_on_a_new_engine_says_the_transcript_is_empty() -> None:
    # "the transcript does not end with a user message", said of a transcript with nothing in it.
    engine = QueryEngine(ScriptedModel(["Hi."]))
    with pytest.raises(ValueError, match=r"needs a prompt: the transcript is empty"):
        await collect(engine.run())
    await collect(engine.run("Hi"))
    with pytest.raises(ValueError, match=r"needs a prompt: the transcript does not end with a user message but with the model's response"):
        await collect(engine.run())
