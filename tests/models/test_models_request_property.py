"""Any valid transcript becomes a request each provider accepts.

Random transcripts are repaired into valid ones; each provider's request body
is then checked against that provider's pairing rules: Anthropic's strict
alternation with results first in the next user turn, Chat Completions' tool
messages right after the call that asked for them, and the Responses API's one
output per function call.
"""

from __future__ import annotations

import json
import re
from collections.abc import Callable
from functools import partial
from typing import Any

import pytest
from hypothesis import example, given, settings
from hypothesis import strategies as st

from agentloop import (
    Block,
    Message,
    RedactedThinkingBlock,
    TextBlock,
    ThinkingBlock,
    ToolResultBlock,
    ToolUseBlock,
    repair_transcript,
    validate_transcript,
)
from agentloop._tools import safe_name
from agentloop.models import ModelRequest
from agentloop.models import anthropic as anthropic_api
from agentloop.models import openai_chat as chat_api
from agentloop.models import openai_responses as responses_api
from agentloop.models._driver import wire_id
from tests.test_transcript import transcripts


def repaired(msgs: list[Message]) -> list[Message]:
    fixed = repair_transcript(msgs)
    assert validate_transcript(fixed) == []
    return fixed


ANTHROPIC_ID = re.compile(r"[a-zA-Z0-9_-]+")  # what Anthropic accepts back as a tool_use id
TOOL_NAME = re.compile(r"[a-zA-Z0-9_-]{1,64}")  # OpenAI's rule for a tool name, also in history


def check_anthropic(body: dict[str, Any]) -> None:
    messages = body["messages"]
    for msg in messages:
        for b in msg["content"]:
            if b["type"] in ("tool_use", "tool_result"):
                assert ANTHROPIC_ID.fullmatch(b.get("id") or b.get("tool_use_id")), b
            if b["type"] == "tool_use":
                assert TOOL_NAME.fullmatch(b["name"]), b
            if b["type"] == "thinking":  # never another provider's: Anthropic rejects its signature
                assert not b["signature"].startswith("{"), b
            # A tool_result may leave its content out (nothing but blank text was left).
            texts = [b] if b["type"] == "text" else (b.get("content") or []) if b["type"] == "tool_result" else []
            for t in [{"type": "text", "text": texts}] if isinstance(texts, str) else texts:
                if t["type"] == "text":
                    assert t["text"].strip(), b  # "text content blocks must contain non-whitespace text"
    for i, msg in enumerate(messages):
        assert msg["content"], msg
        if msg["role"] == "assistant":  # the API refuses an assistant message that ends in thinking
            assert msg["content"][-1]["type"] not in ("thinking", "redacted_thinking"), msg
            # A server tool call and its result go together; a paused turn, last, may hold a call alone.
            calls = {b["id"] for b in msg["content"] if b["type"] == "server_tool_use"}
            answered = {b["tool_use_id"] for b in msg["content"] if b["type"].endswith("_tool_result")}
            assert answered <= calls and (calls <= answered or i == len(messages) - 1), msg
        if i:
            assert msg["role"] != messages[i - 1]["role"], "roles must alternate"
        uses = [b["id"] for b in msg["content"] if b["type"] == "tool_use"]
        results = [b["tool_use_id"] for b in msg["content"] if b["type"] == "tool_result"]
        asked = [b["id"] for b in messages[i - 1]["content"] if b["type"] == "tool_use"] if i else []
        if msg["role"] == "assistant":
            assert not results
        else:
            assert not uses
            assert sorted(results) == sorted(asked), (asked, results)  # every call answered, nothing else
            kinds = [b["type"] for b in msg["content"]]
            assert kinds[: len(results)] == ["tool_result"] * len(results), kinds  # results first
    if messages and messages[-1]["role"] == "user":
        assert not [b for b in messages[-1]["content"] if b["type"] == "tool_use"]


def check_chat(body: dict[str, Any]) -> None:
    owed: set[str] = set()
    for msg in body["messages"]:
        if msg["role"] == "tool":
            assert len(msg["tool_call_id"]) <= 40, "Chat Completions rejects a longer id"
            assert msg["tool_call_id"] in owed, "a tool message must answer a call just before it"
            owed.discard(msg["tool_call_id"])
            continue
        assert not owed, f"calls {owed} were not answered before the next message"
        if msg["role"] == "assistant":
            assert msg.get("content") or msg.get("tool_calls"), msg
            for call in msg.get("tool_calls", []):  # OpenAI checks the names it is sent back
                assert TOOL_NAME.fullmatch(call["function"]["name"]), call
            owed = {c["id"] for c in msg.get("tool_calls", [])}
    assert not owed


def check_reasoning_followed(items: list[dict[str, Any]], i: int) -> None:
    assert i + 1 < len(items), "a reasoning item ends the input"
    after = items[i + 1]
    assert after["type"] == "function_call" or (after["type"] == "message" and after["role"] == "assistant"), after


def check_responses(body: dict[str, Any]) -> None:
    calls: list[str] = []
    outputs: list[str] = []
    items = body["input"]
    for i, item in enumerate(items):
        if item["type"] == "reasoning":
            # "Item 'rs_...' of type 'reasoning' was provided without its required following item":
            # the model's own output must follow it directly (a hosted tool item between them
            # in the original output is not kept, so another reasoning item does not count).
            check_reasoning_followed(items, i)
        if item["type"] in ("function_call", "function_call_output"):
            assert len(item["call_id"]) <= 64, "the Responses API rejects a longer call_id"
        if item["type"] == "function_call":
            assert TOOL_NAME.fullmatch(item["name"]), item
            calls.append(item["call_id"])
        elif item["type"] == "function_call_output":
            assert item["call_id"] in calls, "an output must follow its call"
            outputs.append(item["call_id"])
    assert sorted(calls) == sorted(outputs) and len(set(calls)) == len(calls)


@settings(max_examples=300)
@given(transcripts)
@example([  # a tool result of blank text only: Anthropic gets it without content
    Message.user("go"),
    Message(role="assistant", content=[ToolUseBlock(id="t1", name="read", input={})]),
    Message(role="user", content=[ToolResultBlock(tool_use_id="t1", content="  ")]),
])
def test_any_valid_transcript_is_a_request_every_provider_accepts(msgs: list[Message]) -> None:
    request = ModelRequest(messages=repaired(msgs))
    check_anthropic(anthropic_api.build_request(request, model="m", max_tokens=1024, thinking=None))
    check_chat(chat_api.build_request(request, model="m"))
    check_responses(responses_api.build_request(request, model="m"))


@given(st.lists(st.text(min_size=1, max_size=90), min_size=1, max_size=6, unique=True))
def test_wire_ids_fit_each_provider_and_keep_distinct_ids_apart(tool_ids: list[str]) -> None:
    # A transcript may hold ids another provider made (a host that switches models, a
    # resumed session): Anthropic rejects one outside [a-zA-Z0-9_-], Chat Completions one
    # over 40 characters, the Responses API one over 64, on every later request.
    rules: list[tuple[Callable[[str], str], int, re.Pattern[str] | None]] = [
        (safe_name, 64, ANTHROPIC_ID),  # what AnthropicModel sends ids through
        (partial(wire_id, max_len=40), 40, None),  # Chat Completions
        (partial(wire_id, max_len=64), 64, None),  # Responses
    ]
    for fit, max_len, pattern in rules:
        wired = [fit(t) for t in tool_ids]
        assert len(set(wired)) == len(wired)  # still one id per call
        assert wired == [fit(t) for t in tool_ids]  # deterministic: prompt caches hold
        for original, sent in zip(tool_ids, wired, strict=True):
            assert len(sent) <= max_len
            if pattern is not None:
                assert pattern.fullmatch(sent)
            ok = len(original) <= max_len and (pattern is None or pattern.fullmatch(original))
            assert (sent == original) == bool(ok)  # an id that fits is sent as it is


def _reasoning_block(draw: st.DrawFn) -> Block:
    """A block of an assistant turn as the Responses adapter sees it: its own reasoning (with or
    without encrypted content, with or without summary), another provider's thinking, text, a call."""
    kind = draw(st.sampled_from(["reasoning", "reasoning", "sealed", "foreign", "redacted", "text", "call"]))
    n = draw(st.integers(0, 9))
    if kind == "reasoning":
        return ThinkingBlock(thinking=f"r{n}", signature=json.dumps({"id": f"rs_{n}", "summary": []}))
    if kind == "sealed":
        return ThinkingBlock(thinking="", signature=json.dumps({"id": f"rs_{n}", "encrypted_content": "E"}))
    if kind == "foreign":
        return ThinkingBlock(thinking="t", signature="EqQBCkYI")
    if kind == "redacted":
        return RedactedThinkingBlock(data="R")
    if kind == "text":
        return TextBlock(text=f"text {n}")
    return ToolUseBlock(id=f"call_{draw(st.integers(0, 10**6))}", name="f", input={})


reasoning_turns = st.lists(st.composite(_reasoning_block)(), min_size=1, max_size=8)


@settings(max_examples=300)
@given(st.lists(reasoning_turns, min_size=1, max_size=3), st.sampled_from([None, True, False]))
def test_every_reasoning_item_sent_is_directly_followed_by_its_message_or_call(
    turns: list[list[Block]], store: bool | None
) -> None:
    msgs: list[Message] = []
    for blocks in turns:
        msgs += [Message.user("go"), Message(role="assistant", content=blocks)]
    request = ModelRequest(messages=repaired(msgs))
    body = responses_api.build_request(request, model="m", stored=store is not False)
    items = body["input"]
    for i, item in enumerate(items):
        if item["type"] == "reasoning":
            check_reasoning_followed(items, i)
    check_responses(body)


_DEEP = "[" * 100_000 + "]" * 100_000


@pytest.mark.parametrize("api", ["chat", "responses"])
def test_a_thinking_signature_nested_too_deeply_to_decode_is_not_sent(api: str) -> None:
    # A signature of the host's transcript that starts as one kept JSON object but is nested past
    # what Python decodes raised RecursionError on every request, not the skip another
    # unreadable signature gets.
    signature = (
        '{"type":"extra_content","call":"c1","extra_content":' + _DEEP + "}"
        if api == "chat"
        else '{"id":"rs_1","summary":' + _DEEP + "}"
    )
    msgs = [
        Message.user("go"),
        Message(role="assistant", content=[ThinkingBlock(thinking="t", signature=signature), TextBlock(text="ok")]),
        Message.user("more"),
    ]
    request = ModelRequest(messages=msgs)
    if api == "chat":
        body = chat_api.build_request(request, model="m")
        assert body["messages"][1] == {"role": "assistant", "content": "ok"}
    else:
        body = responses_api.build_request(request, model="m")
        assert [item["type"] for item in body["input"]] == ["message", "message", "message"]


def _wire(api: str, msgs: list[Message]) -> list[Any]:
    """The messages (or input items) of the request ``api`` builds for ``msgs``."""
    request = ModelRequest(messages=msgs, system="be brief")
    if api == "anthropic":
        return list(anthropic_api.build_request(request, model="m", max_tokens=64, thinking=None)["messages"])
    if api == "chat":
        return list(chat_api.build_request(request, model="m")["messages"])
    return list(responses_api.build_request(request, model="m")["input"])


@settings(max_examples=150)
@given(transcripts)
def test_request_bytes_are_deterministic_and_an_earlier_request_is_a_prefix_of_a_later_one(msgs: list[Message]) -> None:
    # A provider's prompt cache matches the request's bytes from the start: the same transcript
    # must give the same bytes, and a transcript that grew must begin as its earlier request did
    # (all but that request's last message, which a later user turn may be joined to).
    full = repaired(msgs)
    for api in ("anthropic", "chat", "responses"):
        later = _wire(api, full)
        assert json.dumps(later) == json.dumps(_wire(api, list(full)))
        for k in range(1, len(full)):
            part = full[:k]
            if part[-1].role != "user" or validate_transcript(part):
                continue  # a request is made of a valid transcript that ends with the user's turn
            earlier = _wire(api, part)
            assert json.dumps(earlier[:-1]) == json.dumps(later[: len(earlier) - 1]), (api, k)


@pytest.mark.parametrize("api", ["anthropic", "chat", "responses"])
def test_two_ids_that_fit_to_one_wire_id_stay_apart(api: str) -> None:
    # Fitting keeps apart two different ids but for one that is itself another's fitted form
    # (an id that is not [a-zA-Z0-9_-] for Anthropic, one too long for OpenAI): both calls
    # went with one id, which every provider refuses, though the transcript is valid.
    long = "call." + "x" * 70
    first, twin = {"anthropic": (long, safe_name(long)), "chat": (long, wire_id(long, max_len=40)), "responses": (long, wire_id(long, max_len=64))}[api]
    msgs = [
        Message.user("go"),
        Message(role="assistant", content=[ToolUseBlock(id=first, name="t", input={}), ToolUseBlock(id=twin, name="t", input={})]),
        Message(role="user", content=[ToolResultBlock(tool_use_id=twin, content="2"), ToolResultBlock(tool_use_id=first, content="1")]),
    ]
    assert validate_transcript(msgs) == []
    request = ModelRequest(messages=msgs)
    if api == "anthropic":
        body = anthropic_api.build_request(request, model="m", max_tokens=64, thinking=None)
        check_anthropic(body)
        calls = [b["id"] for b in body["messages"][1]["content"]]
        outputs = {b["tool_use_id"]: b["content"] for b in body["messages"][2]["content"]}
    elif api == "chat":
        body = chat_api.build_request(request, model="m")
        check_chat(body)
        calls = [c["id"] for c in body["messages"][1]["tool_calls"]]
        outputs = {m["tool_call_id"]: m["content"] for m in body["messages"][2:]}
    else:
        body = responses_api.build_request(request, model="m")
        check_responses(body)
        calls = [i["call_id"] for i in body["input"] if i["type"] == "function_call"]
        outputs = {i["call_id"]: i["output"] for i in body["input"] if i["type"] == "function_call_output"}
    assert len(set(calls)) == 2
    assert [outputs[c] for c in calls] == ["1", "2"]  # each result still answers its own call
