"""Promises of docs/providers.md that no other test pins (HTTP mocked at the transport)."""

from __future__ import annotations

import asyncio
import json
from collections.abc import Callable
from contextlib import aclosing
from pathlib import Path
from typing import Any

import httpx
import pytest
from _models_support import API_KEY, RecordingStream, chat_chunk, chat_stream, sse

from agentloop import (
    AbortController,
    AbortError,
    Message,
    ModelError,
    PromptTooLongError,
    QueryEngine,
    Retrying,
    StreamProtocolError,
    ToolCallFinished,
    TurnEnded,
    tool,
    validate_transcript,
)
from agentloop._errors import ProviderConnectionError, ProviderStatusError, ProviderStreamError
from agentloop.models import AnthropicModel, ModelRequest, OpenAIChatModel, OpenAIResponsesModel
from agentloop.sessions import JsonlSession
from tests.helpers import VirtualClock

SSE = {"content-type": "text/event-stream"}


class Server:
    """Serves ``bodies`` in turn (the last one again once they run out) and keeps each request."""

    def __init__(self, *bodies: bytes, status: int = 200, headers: dict[str, str] | None = None) -> None:
        self.bodies = list(bodies)
        self.status = status
        self.headers = headers or SSE
        self.requests: list[httpx.Request] = []

    def handler(self, request: httpx.Request) -> httpx.Response:
        self.requests.append(request)
        body = self.bodies.pop(0) if len(self.bodies) > 1 else self.bodies[0]
        return httpx.Response(self.status, headers=self.headers, content=body)

    def client(self) -> httpx.AsyncClient:
        return httpx.AsyncClient(transport=httpx.MockTransport(self.handler))

    def body(self, n: int) -> dict[str, Any]:
        result: dict[str, Any] = json.loads(self.requests[n].content)
        return result


def _anthropic(*blocks: dict[str, Any], stop: str, args: str | None = None) -> bytes:
    """A Messages stream of whole ``blocks``, the last one's input streamed as ``args`` if given."""
    events: list[tuple[str, Any]] = [("message_start", {"type": "message_start", "message": {"id": "msg_1"}})]
    for i, block in enumerate(blocks):
        events.append(("content_block_start", {"type": "content_block_start", "index": i, "content_block": block}))
        if args is not None and i == len(blocks) - 1:
            delta = {"type": "input_json_delta", "partial_json": args}
            events.append(("content_block_delta", {"type": "content_block_delta", "index": i, "delta": delta}))
        events.append(("content_block_stop", {"type": "content_block_stop", "index": i}))
    events += [
        ("message_delta", {"type": "message_delta", "delta": {"stop_reason": stop}}),
        ("message_stop", {"type": "message_stop"}),
    ]
    return sse(*events)


def _responses(items: list[dict[str, Any]], *, incomplete: str | None = None) -> bytes:
    """A Responses stream whose items come whole in their ``output_item.done``."""
    events: list[dict[str, Any]] = [{"type": "response.created", "response": {"id": "resp_1"}}]
    for i, item in enumerate(items):
        events.append({"type": "response.output_item.done", "output_index": i, "item": item})
    if incomplete is None:
        events.append({"type": "response.completed", "response": {"id": "resp_1", "status": "completed"}})
    else:
        end = {"id": "resp_1", "status": "incomplete", "incomplete_details": {"reason": incomplete}}
        events.append({"type": "response.incomplete", "response": end})
    return sse(*[(e["type"], e) for e in events])


_TEXT = {"type": "text", "text": ""}
_OK = {
    AnthropicModel: _anthropic({"type": "text", "text": "Fine."}, stop="end_turn"),
    OpenAIChatModel: chat_stream(chat_chunk({"content": "Fine."}), chat_chunk(finish="stop")),
    OpenAIResponsesModel: _responses(
        [{"id": "msg_2", "type": "message", "role": "assistant", "content": [{"type": "output_text", "text": "Fine."}]}]
    ),
}


# -- Choosing a provider, and passing the key --------------------------------------------------


@pytest.mark.parametrize(
    ("cls", "env", "header"),
    [(AnthropicModel, "ANTHROPIC_API_KEY", "x-api-key"), (OpenAIChatModel, "OPENAI_API_KEY", "authorization"),
     (OpenAIResponsesModel, "OPENAI_API_KEY", "authorization")],
)  # fmt: skip
async def test_the_key_is_read_from_the_environment_when_the_model_is_made_not_per_request(
    cls: type[Any], env: str, header: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Choosing a provider: "The key comes from the environment variable in the table when the
    model is made (not at import, not per request)"."""
    first, second = "sk-made-with-this-0123456789abcdef", "sk-set-afterwards-0123456789abcdef"
    monkeypatch.delenv(env, raising=False)
    server = Server(_OK[cls])
    async with server.client() as client:
        keyless = cls("m", http_client=client)
        monkeypatch.setenv(env, first)
        made = cls("m", http_client=client)
        monkeypatch.setenv(env, second)
        ends = [e async for e in QueryEngine(made).run("hi") if isinstance(e, TurnEnded)]
        assert ends[0].reason == "completed"
        assert server.requests[0].headers[header].endswith(first)
        # Made before the variable was set, the model still has no key: its turn ends with
        # model_error naming the variable, and nothing is sent.
        ends = [e async for e in QueryEngine(keyless).run("hi") if isinstance(e, TurnEnded)]
    assert ends[0].reason == "model_error" and env in (ends[0].error or "")
    assert len(server.requests) == 1


@pytest.mark.parametrize("cls", [OpenAIChatModel, OpenAIResponsesModel])
async def test_openai_api_key_goes_to_any_base_url_unless_api_key_is_empty(
    cls: type[Any], monkeypatch: pytest.MonkeyPatch
) -> None:
    """Choosing a provider: "`OPENAI_API_KEY`, when set, goes to whatever `base_url` you give
    too ... or `api_key=""` to send none, so that your OpenAI key does not reach a third party"."""
    monkeypatch.setenv("OPENAI_API_KEY", API_KEY)
    server = Server(_OK[cls])
    async with server.client() as client:
        for api_key in (None, ""):
            model = cls("m", base_url="https://third-party.example/v1", http_client=client, api_key=api_key)
            ends = [e async for e in QueryEngine(model).run("hi") if isinstance(e, TurnEnded)]
            assert ends[0].reason == "completed"
    with_env, without = server.requests
    assert with_env.headers["authorization"] == f"Bearer {API_KEY}"
    assert "authorization" not in without.headers and API_KEY not in str(without.headers)


# -- What every provider shares: a call the stop cut ---------------------------------------------

_CUT = '{"path": "/tmp/notes.txt", "text": "a long te'

_CUT_BODIES: dict[type[Any], bytes] = {
    AnthropicModel: _anthropic({"type": "tool_use", "id": "toolu_1", "name": "write", "input": {}}, stop="max_tokens", args=_CUT),
    OpenAIChatModel: chat_stream(
        chat_chunk({"tool_calls": [{"index": 0, "id": "call_1", "type": "function",
                                    "function": {"name": "write", "arguments": _CUT}}]}),
        chat_chunk(finish="length"),
    ),
    OpenAIResponsesModel: _responses(
        [{"id": "fc_1", "type": "function_call", "call_id": "call_1", "name": "write", "arguments": _CUT}],
        incomplete="max_output_tokens",
    ),
}  # fmt: skip


def _sent_pair(cls: type[Any], body: dict[str, Any]) -> tuple[Any, str]:
    """The cut call's input as the next request sends it, and the result sent with it."""
    if cls is AnthropicModel:
        call, result = body["messages"][1]["content"][0], body["messages"][2]["content"][0]
        assert (call["id"], result["tool_use_id"], result["is_error"]) == ("toolu_1", "toolu_1", True)
        return call["input"], result["content"]
    if cls is OpenAIChatModel:
        call, result = body["messages"][1]["tool_calls"][0], body["messages"][2]
        assert (call["id"], result["role"], result["tool_call_id"]) == ("call_1", "tool", "call_1")
        return json.loads(call["function"]["arguments"]), result["content"]
    call, result = body["input"][1], body["input"][2]
    assert (call["type"], result["type"], call["call_id"], result["call_id"]) == (
        "function_call", "function_call_output", "call_1", "call_1"
    )  # fmt: skip
    return json.loads(call["arguments"]), result["output"]


@pytest.mark.parametrize("cls", [AnthropicModel, OpenAIChatModel, OpenAIResponsesModel])
async def test_a_cut_call_goes_back_to_the_model_with_its_error_so_it_can_try_again(cls: type[Any]) -> None:
    """What every provider shares: a call the output token limit cut "is never run ... It gets
    an error result that says the input was incomplete and why ... so the model can try again
    with less": the next request of the turn sends the call (with no cut JSON in it, which the
    API would refuse) and that error result, paired."""
    ran: list[str] = []

    @tool
    async def write(path: str = "", text: str = "") -> str:
        """Write a file."""
        ran.append(path)
        return "written"

    server = Server(_CUT_BODIES[cls], _OK[cls])
    async with server.client() as client:
        engine = QueryEngine(cls("m", api_key=API_KEY, http_client=client), tools=[write], policies=[])
        events = [e async for e in engine.run("save my notes")]
    assert ran == [] and len(server.requests) == 2
    end = events[-1]
    assert isinstance(end, TurnEnded) and end.reason == "completed" and engine.messages[-1].text == "Fine."
    sent_input, sent_result = _sent_pair(cls, server.body(1))
    assert sent_input == {}
    assert "Tool 'write' was not run: the tool input is incomplete: the response hit the output token limit" in sent_result
    (finished,) = [e for e in events if isinstance(e, ToolCallFinished)]
    assert finished.result.text in sent_result
    assert validate_transcript(engine.messages) == []


# -- Anthropic: refusal and pause_turn, marked in a session file ---------------------------------


async def _run_in_session(path: Path, body: bytes, prompt: str | None, **kw: Any) -> tuple[list[TurnEnded], Server]:
    """One run of an `AnthropicModel` engine over the session file at ``path`` (resumed when
    it exists), answered by ``body`` then a plain answer."""
    session, loaded = JsonlSession.resume(path)
    server = Server(body, _OK[AnthropicModel])
    try:
        async with server.client() as client:
            model = AnthropicModel("m", api_key=API_KEY, http_client=client)
            engine = QueryEngine(model, messages=loaded.messages, session=session, policies=[], **kw)
            ends = [e async for e in engine.run(prompt) if isinstance(e, TurnEnded)]
    finally:
        session.close()
    return ends, server


async def test_a_refusal_stays_marked_in_the_session_file_and_out_of_a_resumed_engines_requests(tmp_path: Path) -> None:
    """Anthropic, `refusal`: "The message is marked in its `meta` (`"stop_reason": "refusal"`,
    kept in a session file too)" and "`AnthropicModel` leaves a response marked so out of every
    later request ... and sends the user turns on either side as one; the transcript keeps it".
    The mark must survive the file, or a worker resuming it would send the refused turn back and
    meet more refusals."""
    path = tmp_path / "s.jsonl"
    refused = _anthropic({"type": "text", "text": "I can help with th"}, stop="refusal")
    ends, _ = await _run_in_session(path, refused, "first")
    assert [e.reason for e in ends] == ["completed"]
    loaded = JsonlSession(path).load()
    assert loaded.messages[1].text == "I can help with th"
    assert loaded.messages[1].meta.get("stop_reason") == "refusal"
    ends, server = await _run_in_session(path, _OK[AnthropicModel], "second")
    assert [e.reason for e in ends] == ["completed"]
    assert server.body(0)["messages"] == [
        {"role": "user", "content": [{"type": "text", "text": "first"}, {"type": "text", "text": "second"}]}
    ]
    assert [m.text for m in JsonlSession(path).load().messages] == ["first", "I can help with th", "second", "Fine."]


async def test_a_paused_turn_stopped_by_max_turns_goes_on_from_the_session_file(tmp_path: Path) -> None:
    """Anthropic, `pause_turn`: "The paused response is marked in its `meta` (`"stop_reason":
    "pause_turn"`, kept in a session file too): when `max_turns` ... ends the run right after
    it, `run()` with no prompt goes on from it, in this engine or one built later on the same
    transcript"."""
    path = tmp_path / "s.jsonl"
    paused = _anthropic({"type": "text", "text": "Searching."}, stop="pause_turn")
    ends, _ = await _run_in_session(path, paused, "weather?", max_turns=1)
    assert [e.reason for e in ends] == ["max_turns"]
    assert JsonlSession(path).load().messages[-1].meta.get("stop_reason") == "pause_turn"
    ends, server = await _run_in_session(path, _OK[AnthropicModel], None)
    assert [e.reason for e in ends] == ["completed"]
    assert server.body(0)["messages"][-1] == {"role": "assistant", "content": [{"type": "text", "text": "Searching."}]}
    messages = JsonlSession(path).load().messages
    assert [m.text for m in messages] == ["weather?", "Searching.", "Fine."]
    assert validate_transcript(messages) == []


# -- OpenAI: a refused response goes back as it is -----------------------------------------------

_FILTERED: dict[type[Any], Callable[[], bytes]] = {
    OpenAIChatModel: lambda: chat_stream(chat_chunk({"content": "Here is how to"}), chat_chunk(finish="content_filter")),
    OpenAIResponsesModel: lambda: _responses(
        [{"id": "msg_1", "type": "message", "role": "assistant",
          "content": [{"type": "output_text", "text": "Here is how to"}]}],
        incomplete="content_filter",
    ),
}  # fmt: skip


@pytest.mark.parametrize("cls", [OpenAIChatModel, OpenAIResponsesModel])
async def test_the_openai_models_send_a_refused_response_back_as_it_is(cls: type[Any]) -> None:
    """OpenAI Chat Completions, `finish_reason`: "A response with stop reason `refusal` is marked
    refused as Anthropic's is (... the turn ends with it), but the OpenAI models send it in later
    requests as it is: OpenAI does not ask for the refused turn to be left out"."""
    server = Server(_FILTERED[cls](), _OK[cls])
    async with server.client() as client:
        engine = QueryEngine(cls("m", api_key=API_KEY, http_client=client), policies=[])
        first = [e async for e in engine.run("first") if isinstance(e, TurnEnded)]
        second = [e async for e in engine.run("second") if isinstance(e, TurnEnded)]
    assert [e.reason for e in first + second] == ["completed", "completed"]
    assert engine.messages[1].meta.get("stop_reason") == "refusal"
    sent = server.body(1)
    if cls is OpenAIChatModel:
        assert sent["messages"] == [
            {"role": "user", "content": "first"},
            {"role": "assistant", "content": "Here is how to"},
            {"role": "user", "content": "second"},
        ]
    else:
        assert [(i.get("role"), i.get("content")) for i in sent["input"]] == [
            ("user", "first"), ("assistant", "Here is how to"), ("user", "second")
        ]  # fmt: skip


# -- Errors and retries: the back-off -------------------------------------------------------------


async def test_the_default_back_off_doubles_from_half_a_second_to_eight_with_jitter() -> None:
    """Errors and retries: "The defaults are `retry_budget=3` retries per model request,
    `retry_base_delay=0.5` and `retry_max_delay=8.0` seconds, each back-off multiplied by a random
    factor between 0.75 and 1"; and "The wait before a retry is the longer of `retry_after` and
    the engine's own jittered back-off"."""
    body = b'{"error": {"message": "try later", "type": "server_error"}}'
    json_headers = {"content-type": "application/json"}
    with VirtualClock() as clock:
        waits: list[list[float]] = []
        for budget, retry_after in ((None, None), (6, None), (None, "5")):
            headers = {**json_headers, "retry-after": retry_after} if retry_after else json_headers
            server = Server(body, status=503, headers=headers)
            async with server.client() as client:
                kw = {} if budget is None else {"retry_budget": budget}
                engine = QueryEngine(OpenAIChatModel("m", api_key=API_KEY, http_client=client), policies=[], **kw)
                start = clock.now
                events = [e async for e in engine.run("hi")]
            end = events[-1]
            assert isinstance(end, TurnEnded) and end.reason == "model_error"
            delays = [e.delay for e in events if isinstance(e, Retrying)]
            assert len(server.requests) == len(delays) + 1
            assert clock.now - start == pytest.approx(sum(delays))  # each delay is waited, no more
            waits.append(delays)
    default, longer, told = waits
    floors = [0.5, 1.0, 2.0, 4.0, 8.0, 8.0]
    assert len(default) == 3 and len(longer) == 6
    for delays in (default, longer):
        assert all(0.75 * f <= d <= f for d, f in zip(delays, floors, strict=False)), delays
    assert told == [5.0, 5.0, 5.0]  # longer than each back-off of the three


# -- Errors and retries: what code that calls model.stream() itself catches ----------------------


@pytest.mark.parametrize("cls", [AnthropicModel, OpenAIChatModel, OpenAIResponsesModel])
async def test_an_abort_is_not_a_model_error_that_except_model_error_would_swallow(cls: type[Any]) -> None:
    """Errors and retries: "code that calls `model.stream()` itself catches `ModelError`"; the
    table's classes are `ModelError`s, but for `AbortError`: an abort is the caller's own doing,
    not a failure of the request, and goes through such an ``except``."""
    assert all(
        issubclass(error, ModelError)
        for error in (ProviderStatusError, PromptTooLongError, ProviderConnectionError, ProviderStreamError, StreamProtocolError)
    )
    assert not issubclass(AbortError, ModelError)
    body = RecordingStream([_OK[cls][:40]], hang=True)

    def handler(request: httpx.Request) -> httpx.Response:
        return httpx.Response(200, headers=SSE, stream=body)

    controller = AbortController()
    caught: list[BaseException] = []

    async def read() -> None:
        async with httpx.AsyncClient(transport=httpx.MockTransport(handler)) as client:
            model = cls("m", api_key=API_KEY, http_client=client)
            try:
                async with aclosing(model.stream(ModelRequest(messages=[Message.user("hi")]), controller.signal)) as stream:
                    async for _ in stream:
                        pass
            except ModelError as error:  # what a caller of stream() catches for a failed request
                caught.append(error)

    reading = asyncio.ensure_future(read())
    await body.blocked.wait()
    controller.abort("user_left")
    with pytest.raises(AbortError, match="user_left"):
        await reading
    assert caught == [] and body.closed
