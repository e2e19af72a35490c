"""JSON from outside the library (error bodies, session files, MCP output, scenarios, kept
signatures) nests at most 400 levels on every Python version: past that, each place reports it
as it reports other bad input, never RecursionError and never a value that fails later."""

from __future__ import annotations

import asyncio
import json
import logging
import re
from pathlib import Path
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st
from mcp import types

from agentloop import Message, ThinkingBlock
from agentloop._errors import StreamProtocolError
from agentloop._jsondepth import MAX_JSON_DEPTH, TOO_DEEP, _outside_strings, json_too_deep, loads
from agentloop.demo.scenario import ScenarioError
from agentloop.demo.scenario import load as load_scenario
from agentloop.mcp._stdio import Pipes
from agentloop.models._http import Redactor, document_error, status_error
from agentloop.models.openai_responses._request import _reasoning_item
from agentloop.sessions import JsonlSession

_DEPTHS = [MAX_JSON_DEPTH + 100, 5_000]


def _nested(depth: int, closed: bool) -> str:
    """``depth`` arrays, one inside the next, closed or left open (a cut or damaged text)."""
    return "[" * depth + ("]" * depth if closed else "")


def _cases() -> list[Any]:
    return [pytest.param(d, c, id=f"{d}-{'closed' if c else 'open'}") for d in _DEPTHS for c in (True, False)]


@pytest.mark.parametrize(("depth", "closed"), _cases())
def test_the_loader_refuses_past_the_limit_on_every_version(depth: int, closed: bool) -> None:
    for text in (_nested(depth, closed), _nested(depth, closed).encode()):
        with pytest.raises(ValueError, match=r"more than 400 levels"):
            loads(text)
    assert loads(_nested(MAX_JSON_DEPTH, True)) is not None  # the limit itself is fine


@pytest.mark.parametrize(("depth", "closed"), _cases())
def test_an_error_body_too_deep_is_kept_as_text_and_retryable_as_its_status_says(depth: int, closed: bool) -> None:
    raw = ('{"error":' + _nested(depth, closed) + ("}" if closed else "")).encode()
    headers = {"content-type": "application/json", "retry-after": "1"}
    error = status_error("openai", 503, headers, raw, request_id_header="x-request-id", secret=None)
    assert error.body == raw.decode() and error.retryable and error.retry_after == 1.0
    error = status_error("openai", 400, headers, raw, request_id_header="x-request-id", secret=None)
    assert error.body == raw.decode() and not error.retryable


@pytest.mark.parametrize("depth", _DEPTHS)
def test_a_200_document_too_deep_is_a_protocol_error_saying_so(depth: int) -> None:
    raw = ('{"error":' + _nested(depth, True) + "}").encode()
    error = document_error("openai", {}, raw, request_id_header="x-request-id", secret=None)
    assert isinstance(error, StreamProtocolError) and not error.retryable
    assert "more than 400 levels" in str(error)


@pytest.mark.parametrize(("depth", "closed"), _cases())
def test_a_session_line_too_deep_is_skipped_with_a_warning(tmp_path: Path, depth: int, closed: bool) -> None:
    path = tmp_path / "s.jsonl"
    with JsonlSession(path) as session:
        session.append_message(Message.user("one"))
    deep = '{"type":"event","event":{"type":"x","data":' + _nested(depth, closed) + ("}}" if closed else "")
    with path.open("ab") as f:
        f.write(deep.encode() + b"\n")
    with JsonlSession(path) as session:
        session.append_message(Message.user("two"))
    loaded = JsonlSession(path).load()
    assert loaded.messages == [Message.user("one"), Message.user("two")] and loaded.events == []
    assert len(loaded.warnings) == 1 and "more than 400 levels" in loaded.warnings[0]


def test_a_session_line_at_the_limit_loads(tmp_path: Path) -> None:
    path = tmp_path / "s.jsonl"
    data: Any = []
    for _ in range(MAX_JSON_DEPTH - 3):
        data = [data]
    path.write_text(json.dumps({"type": "event", "event": {"type": "x", "data": data}}) + "\n")
    loaded = JsonlSession(path).load()
    assert loaded.warnings == [] and len(loaded.events) == 1


@pytest.mark.parametrize(("depth", "closed"), _cases())
async def test_an_mcp_line_too_deep_is_skipped_and_an_answer_too_deep_fails_its_request(
    depth: int, closed: bool, caplog: pytest.LogCaptureFixture
) -> None:
    pipes = Pipes(asyncio.get_running_loop(), "deep", Redactor([]), None)
    with caplog.at_level(logging.WARNING, logger="agentloop"):
        assert pipes.parse(bytearray(_nested(depth, closed).encode())) == []
        # An answer too deep to decode fails its request, which would otherwise wait for ever.
        (answer,) = pipes.parse(bytearray(('{"jsonrpc":"2.0","id":1,"result":' + _nested(depth, closed)).encode()))
    assert "not a JSON-RPC message" in caplog.text
    assert isinstance(answer.message, types.JSONRPCError) and answer.message.id == 1
    assert "could not be decoded" in answer.message.error.message


@pytest.mark.parametrize(("depth", "closed"), _cases())
def test_a_scenario_file_too_deep_is_a_scenario_error(tmp_path: Path, depth: int, closed: bool) -> None:
    path = tmp_path / "deep.json"
    path.write_text('{"steps":' + _nested(depth, closed) + ("}" if closed else ""))
    with pytest.raises(ScenarioError, match="more than 400 levels"):
        load_scenario(str(path))


@pytest.mark.parametrize("depth", _DEPTHS)
def test_a_kept_reasoning_signature_too_deep_is_not_sent_back(depth: int) -> None:
    signature = '{"id":"rs_1","summary":' + _nested(depth, True) + "}"
    assert _reasoning_item(ThinkingBlock(thinking="t", signature=signature), True, None) is None


def test_the_error_names_the_limit() -> None:
    assert "400" in TOO_DEEP


_STRINGS = re.compile(r'"(?:[^"\\]|\\.)*"?', re.DOTALL)  # a string left open runs to the end


def _brackets(text: str) -> str:
    return re.sub(r"[^][{}]", "", text)


_JSON_VALUES = st.recursive(
    st.none() | st.integers() | st.text(alphabet='[]{}"\\/a\u00e9\n'),
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(alphabet='[]{"\\a'), inner, max_size=4),
    max_leaves=30,
)


@given(_JSON_VALUES, st.booleans(), st.integers(min_value=0, max_value=60))
def test_the_text_check_sees_brackets_only_outside_strings(value: Any, ascii_only: bool, cut: int) -> None:
    """Whatever the strings hold (brackets, quotes, backslashes, escapes), the structure left is
    that of the value, for a whole text and for one cut short (a string left open runs to the end)."""
    text = json.dumps(value, ensure_ascii=ascii_only)
    for whole in (text, text[: max(len(text) - cut, 0)]):
        assert _brackets(_outside_strings(whole)) == _brackets(_STRINGS.sub("", whole))
    deep = "[" * MAX_JSON_DEPTH + text + "]" * MAX_JSON_DEPTH
    assert json_too_deep(deep) == (isinstance(value, list | dict))
