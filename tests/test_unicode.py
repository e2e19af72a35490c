"""Text UTF-8 cannot encode (lone UTF-16 surrogates) never poisons the transcript.

A tool that lists a directory holding a file name that is not UTF-8 returns
``'caf\\udce9.txt'`` (Python's ``surrogateescape``); a server that slices text by
UTF-16 unit sends ``"\\ud83d"`` without its other half. Kept as they are, such
strings make every later request fail to encode. Rule R9 of the transcript.
"""

from __future__ import annotations

import json
import logging
import os
from pathlib import Path
from typing import Any

import httpx
import pytest
from hypothesis import given
from hypothesis import strategies as st

from agentloop import (
    Message,
    QueryEngine,
    ScriptedModel,
    ScriptedResponse,
    ScriptedToolCall,
    TextBlock,
    TextDelta,
    ToolCallFinished,
    ToolResultBlock,
    ToolUseBlock,
    TurnEnded,
    repair_transcript,
    tool,
    validate_transcript,
)
from agentloop._abort import AbortController
from agentloop._model import StreamBlockStop, StreamEnd, StreamText, StreamToolInput, StreamToolUseStart
from agentloop._unicode import has_surrogates, scrub
from agentloop.models import AnthropicModel, ModelRequest, OpenAIChatModel
from agentloop.sessions import JsonlSession
from tests.helpers import collect

NAME = os.fsdecode(b"caf\xe9.txt")  # 'caf\udce9.txt' on a UTF-8 file system


def encodes(messages: list[Message]) -> bool:
    try:
        json.dumps([m.model_dump(mode="json") for m in messages], ensure_ascii=False).encode()
    except UnicodeEncodeError:
        return False
    return True


# -- the scrub ----------------------------------------------------------------------------


def test_scrub_joins_adjacent_halves_and_replaces_lone_ones() -> None:
    assert scrub("a\ud83d\ude00b") == "a\U0001f600b"  # two halves that reached us apart
    assert scrub("x\ud83d") == "x\ufffd"
    assert scrub(NAME) == "caf\ufffd.txt"
    assert scrub("\ude00\ud83d") == "\ufffd\ufffd"  # the wrong order is no pair
    text = "plain, é, 漢字, \U0001f600"
    assert scrub(text) is text


@given(st.text(st.characters(codec=None, min_codepoint=0, max_codepoint=0x1F64F)))
def test_property_scrub_gives_encodable_text_and_keeps_encodable_text(text: str) -> None:
    clean = scrub(text)
    clean.encode("utf-8")  # never raises
    assert not has_surrogates(clean)
    if not has_surrogates(text):
        assert clean == text
    assert scrub(clean) == clean


# -- the rule -----------------------------------------------------------------------------


def test_validate_reports_and_repair_scrubs_every_string_a_provider_is_sent() -> None:
    msgs = [
        Message.user(f"read {NAME}"),
        Message(role="assistant", content=[ToolUseBlock(id="t1", name="read", input={"path": NAME, NAME: [NAME]})]),
        Message(role="user", content=[ToolResultBlock(tool_use_id="t1", content=[TextBlock(text=f"no such file: {NAME}")])]),
        Message.assistant("done"),
    ]
    problems = validate_transcript(msgs)
    assert len(problems) == 3 and all("cannot encode" in p for p in problems), problems
    assert not encodes(msgs)
    changes: list[str] = []
    fixed = repair_transcript(msgs, changes=changes)
    assert validate_transcript(fixed) == [] and encodes(fixed)
    assert len(changes) == 3 and all("U+FFFD" in c for c in changes)
    use = fixed[1].content[0]
    assert isinstance(use, ToolUseBlock) and use.input == {"path": "caf\ufffd.txt", "caf\ufffd.txt": ["caf\ufffd.txt"]}
    assert fixed[3] is msgs[3]  # what was fine is untouched
    assert repair_transcript(fixed) == fixed


# -- where outside text comes in ---------------------------------------------------------


@tool
async def ls() -> str:
    """List the files."""
    return f"files: {NAME}, notes.md"


@tool
async def cat(path: str) -> str:
    """Read a file."""
    raise FileNotFoundError(2, "No such file or directory", NAME)


class Recorder:
    """A model that records each request's encoded body and answers with a text."""

    def __init__(self) -> None:
        self.bodies: list[bytes] = []

    async def stream(self, request: ModelRequest, signal: Any) -> Any:
        self.bodies.append(json.dumps([m.model_dump(mode="json") for m in request.messages]).encode())
        yield StreamText(0, "ok")
        yield StreamBlockStop(0)
        yield StreamEnd(stop_reason="end_turn")


async def test_a_tool_output_holding_a_surrogate_escaped_file_name_is_scrubbed() -> None:
    model = ScriptedModel([
        ScriptedResponse(tool_calls=[ScriptedToolCall("ls", {}), ScriptedToolCall("cat", {"path": "x"})]),
        "done",
    ])
    engine = QueryEngine(model, tools=[ls, cat])
    events = await collect(engine, "what is here?")
    results = [e.result for e in events if isinstance(e, ToolCallFinished)]
    assert results[0].content == "files: caf\ufffd.txt, notes.md"  # the event shows what history holds
    assert results[1].is_error and "FileNotFoundError" in results[1].text
    assert not has_surrogates(results[1].text)
    assert validate_transcript(engine.messages) == [] and encodes(engine.messages)
    recorder = Recorder()
    engine.model = recorder
    events = await collect(engine, "and now?")
    assert isinstance(events[-1], TurnEnded) and events[-1].reason == "completed"
    assert b"caf\\ufffd.txt" in recorder.bodies[0]


def _anthropic_sse(text_pieces: list[str], tool_json: str) -> bytes:
    events: list[dict[str, Any]] = [
        {"type": "message_start", "message": {"id": "msg_1", "type": "message", "role": "assistant", "content": [],
                                              "model": "m", "usage": {"input_tokens": 1, "output_tokens": 1}}},
        {"type": "content_block_start", "index": 0, "content_block": {"type": "text", "text": ""}},
        *({"type": "content_block_delta", "index": 0, "delta": {"type": "text_delta", "text": t}} for t in text_pieces),
        {"type": "content_block_stop", "index": 0},
        {"type": "content_block_start", "index": 1,
         "content_block": {"type": "tool_use", "id": "toolu_1", "name": "cat", "input": {}}},
        {"type": "content_block_delta", "index": 1, "delta": {"type": "input_json_delta", "partial_json": tool_json}},
        {"type": "content_block_stop", "index": 1},
        {"type": "message_delta", "delta": {"stop_reason": "tool_use"}, "usage": {"output_tokens": 5}},
        {"type": "message_stop"},
    ]  # fmt: skip
    # json.dumps escapes each lone surrogate as \udXXX, as a server slicing UTF-16 would send it
    return "".join(f"event: {e['type']}\ndata: {json.dumps(e)}\n\n" for e in events).encode()


async def test_a_lone_surrogate_escape_from_a_provider_becomes_u_fffd_in_deltas_and_history() -> None:
    body = _anthropic_sse(["I see \ud83d", "\ude00 here"], json.dumps({"path": "a\ud800b"}))
    requests: list[bytes] = []

    def handler(request: httpx.Request) -> httpx.Response:
        requests.append(request.content)
        if len(requests) == 1:
            return httpx.Response(200, content=body)
        return httpx.Response(400, json={"error": {"type": "invalid_request_error", "message": "stop here"}})

    async with httpx.AsyncClient(transport=httpx.MockTransport(handler)) as client:
        engine = QueryEngine(AnthropicModel("m", api_key="k", http_client=client), tools=[cat])
        events = await collect(engine, "go")
    deltas = [e.text for e in events if isinstance(e, TextDelta)]
    assert deltas == ["I see \ufffd", "\ufffd here"]  # each event scrubbed on its own: the halves came apart
    assert engine.messages[1].text == "I see \ufffd\ufffd here"
    use = engine.messages[1].tool_uses[0]
    assert use.input == {"path": "a\ufffdb"}
    assert validate_transcript(engine.messages) == [] and encodes(engine.messages)
    assert len(requests) == 2  # the second request was built and sent


async def test_halves_a_custom_model_streams_apart_are_joined_in_history() -> None:
    class Halves:
        async def stream(self, request: ModelRequest, signal: Any) -> Any:
            yield StreamText(0, "smile \ud83d")
            yield StreamText(0, "\ude00")
            yield StreamToolUseStart(1, "t1", "cat")
            yield StreamToolInput(1, '{"path": "\\ud800x"}')
            yield StreamBlockStop(0)
            yield StreamBlockStop(1)
            yield StreamEnd(stop_reason="tool_use")

    engine = QueryEngine(Halves(), tools=[cat], max_turns=1)
    await collect(engine, "go")
    assert engine.messages[1].text == "smile \U0001f600"
    assert engine.messages[1].tool_uses[0].input == {"path": "\ufffdx"}
    assert validate_transcript(engine.messages) == []


async def test_host_text_with_a_lone_surrogate_is_scrubbed_where_it_comes_in() -> None:
    engine = QueryEngine(ScriptedModel(["one", "two", "three"]))
    await collect(engine, f"open {NAME}")
    engine.follow_up(f"then {NAME}")
    await collect(engine, Message.user(f"and {NAME}"))  # then the follow-up, as a second turn
    assert [m.text for m in engine.messages if m.role == "user"] == [
        "open caf\ufffd.txt", "and caf\ufffd.txt", "then caf\ufffd.txt",
    ]  # fmt: skip
    assert validate_transcript(engine.messages) == []


async def test_a_history_the_host_built_with_a_lone_surrogate_is_sent_scrubbed_not_failed(
    caplog: pytest.LogCaptureFixture,
) -> None:
    sent: list[dict[str, Any]] = []

    def handler(request: httpx.Request) -> httpx.Response:
        sent.append(json.loads(request.content))
        return httpx.Response(400, json={"error": {"type": "invalid_request_error", "message": "seen"}})

    history = [Message.user(f"open {NAME}"), Message.assistant("opened")]
    async with httpx.AsyncClient(transport=httpx.MockTransport(handler)) as client:
        model = OpenAIChatModel("m", api_key="k", http_client=client)
        with caplog.at_level(logging.WARNING, logger="agentloop"):
            request = ModelRequest(messages=[*history, Message.user("and?")])
            with pytest.raises(Exception, match="HTTP 400"):
                async for _event in model.stream(request, AbortController().signal):
                    pass
    assert sent[0]["messages"][0]["content"] == "open caf\ufffd.txt"
    assert "lone UTF-16 surrogates" in caplog.text


def test_a_session_keeps_a_lone_surrogate_exactly_and_its_load_repairs_it(tmp_path: Path) -> None:
    path = tmp_path / "s.jsonl"
    with JsonlSession(path) as session:
        session.append_message(Message.user(f"open {NAME}"))
        session.append_message(Message.assistant("ok"))
        session.append_event(TurnEnded(reason="completed", error=f"about {NAME}"))
    assert path.read_bytes().decode("utf-8").count("\\udce9") == 2  # escaped, ASCII on disk
    loaded = JsonlSession(path).load()
    assert [m.text for m in loaded.messages] == ["open caf\ufffd.txt", "ok"]
    assert loaded.warnings == [] and len(loaded.repairs) == 1 and "U+FFFD" in loaded.repairs[0]
    assert loaded.events[0]["error"] == f"about {NAME}"
