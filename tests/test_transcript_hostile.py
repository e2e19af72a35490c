"""Hostile transcripts: messages of any roles in any order, blocks of any kind in either, ids
repeated, missing, mismatched, huge, holding lone surrogates or equal to what a repair would
rename another to, text of Unicode whitespace (and zero-width characters, which are not), and
responses a refusal stopped. Repairing one yields a valid transcript, idempotently and saying
what it changed, keeps every block the rules allow in its order, and gives each provider a
request it accepts."""

from __future__ import annotations

import json
import re
from typing import Any

from hypothesis import given
from hypothesis import strategies as st

from agentloop import (
    Message,
    ProviderBlock,
    RedactedThinkingBlock,
    TextBlock,
    ThinkingBlock,
    ToolResultBlock,
    ToolUseBlock,
    repair_transcript,
    validate_transcript,
)
from agentloop._tools import safe_name
from agentloop._unicode import scrub
from agentloop._validate import is_valid
from agentloop.models import ModelRequest
from agentloop.models import anthropic as anthropic_api
from agentloop.models import openai_chat as chat_api
from agentloop.models import openai_responses as responses_api
from agentloop.models._driver import wire_id
from tests.models.test_models_request_property import check_anthropic, check_chat, check_responses

SPACES = " \t\n\r\x0b\x0c\x1c\x1f\x85\xa0\u1680\u2000\u2028\u2029\u202f\u205f\u3000\u200b\u200d\u2060\ufeff\u180e"
texts = st.text(alphabet=SPACES + "xé\ud800\udc00", max_size=4) | st.sampled_from(["x", "hi ", "\u200b", "a\u3000"])
ids = (
    st.sampled_from(["a", "a_1", "a_1_1", "", "toolu_1", "\ud800", "\ufffd", "\ufffd_1", "\ud800_1", "x" * 300, "x" * 300 + "_1", "functions.read:0"])
    | st.text(alphabet="a_1\ud800", max_size=4)
    # what a provider's request makes of another id: sent as it is, they would be one id there
    | st.sampled_from([safe_name("functions.read:0"), wire_id("x" * 300, max_len=40), wire_id("x" * 300, max_len=64)])
)
blocks = st.one_of(
    texts.map(lambda t: TextBlock(text=t)),
    st.builds(
        ThinkingBlock,
        thinking=texts,
        signature=st.sampled_from(["", "sig", " ", '{"id": "rs_1"}', "s\ud800"]),
        origin=st.sampled_from([None, "https://api.anthropic.com", "https://elsewhere"]),
    ),
    st.builds(RedactedThinkingBlock, data=st.sampled_from(["r", "", " "])),
    st.builds(
        lambda i, n, c, inp: ToolUseBlock(id=i, name=n, input=inp, complete=c),
        ids,
        st.sampled_from(["t", "", "multi_tool_use.parallel", "n\ud800"]),
        st.booleans(),
        st.sampled_from([{}, {"k": "v"}, {"\ud800": ["\udc00"]}]),
    ),
    st.builds(
        lambda i, t, e: ToolResultBlock(tool_use_id=i, content=t, is_error=e),
        ids,
        texts | st.lists(texts.map(lambda t: TextBlock(text=t)), max_size=3),
        st.booleans(),
    ),
    st.builds(
        lambda p, d: ProviderBlock(provider=p, data=d),
        st.sampled_from(["anthropic", "openai", ""]),
        st.sampled_from(
            [
                {"type": "server_tool_use", "id": "srv_1", "input": {}},
                {"type": "web_search_tool_result", "tool_use_id": "srv_1", "content": []},
                {"type": "server_tool_use", "id": "srv_2", "input": {}},

                {"type": "x", "q": "caf\udce9"},
            ]
        ),
    ),
)
messages = st.builds(
    lambda role, content, partial, synthetic, refused: Message(
        role=role, content=content, partial=partial, synthetic=synthetic, meta={"stop_reason": "refusal"} if refused else {}
    ),
    st.sampled_from(["user", "assistant"]),
    st.lists(blocks, max_size=5),
    st.booleans(),
    st.booleans(),
    st.integers(0, 9).map(lambda n: n == 0),
)
transcripts = st.lists(messages, max_size=9)


@given(transcripts)
def test_repair_of_a_hostile_transcript_is_valid_idempotent_deterministic_and_says_so(msgs: list[Message]) -> None:
    changes: list[str] = []
    fixed = repair_transcript(msgs, changes=changes)
    assert validate_transcript(fixed) == [], (msgs, fixed)
    assert is_valid(fixed)
    again: list[str] = []
    assert repair_transcript(fixed, changes=again) == fixed and again == []
    assert repair_transcript(list(msgs)) == fixed
    problems = validate_transcript(msgs)
    assert (problems == []) == (changes == []) == is_valid(msgs), (problems, changes)
    if not changes:
        assert all(x is y for x, y in zip(fixed, msgs, strict=True)) and len(fixed) == len(msgs)
    # one line per violation: none blank, none spread over lines
    assert all(p and "\n" not in p for p in problems)


def _tag(msgs: list[Message]) -> list[Message]:
    out = []
    for n, m in enumerate(msgs):
        content: list[Any] = []
        for k, b in enumerate(m.content):
            if isinstance(b, TextBlock) and b.text.strip():
                b = TextBlock(text=f"<{n}.{k}>{b.text}")
            elif isinstance(b, ToolResultBlock) and b.text.strip():
                b = ToolResultBlock(tool_use_id=b.tool_use_id, content=f"<{n}.{k}>{b.text}", is_error=b.is_error)
            content.append(b)
        out.append(m.model_copy(update={"content": content}))
    return out


@given(transcripts.map(_tag))
def test_repair_of_a_hostile_transcript_loses_no_user_text_nor_tool_output_and_keeps_their_order(msgs: list[Message]) -> None:
    fixed = repair_transcript(msgs)
    flat = [b.text for m in fixed for b in m.content if isinstance(b, TextBlock | ToolResultBlock)]
    kept = "\n".join(flat)
    tags_in_order = []
    for n, m in enumerate(msgs):
        answered: set[str] = set()
        for k, b in enumerate(m.content):
            if isinstance(b, TextBlock) and b.text.strip() and m.role == "user":
                assert scrub(b.text) in kept, (b, fixed)
                tags_in_order.append(f"<{n}.{k}>")
            if isinstance(b, ToolResultBlock) and b.text.strip() and b.tool_use_id not in answered:
                answered.add(b.tool_use_id)
                assert scrub(b.text).strip() in kept, (b, fixed)
    # the user's texts keep their order
    pos = [kept.index(t) for t in tags_in_order]
    assert pos == sorted(pos), (tags_in_order, fixed)


@given(transcripts, st.sampled_from([None, "https://api.anthropic.com"]), st.booleans())
def test_a_repaired_hostile_transcript_is_a_request_every_provider_accepts(msgs: list[Message], origin: str | None, think: bool) -> None:
    fixed = repair_transcript(msgs)
    request = ModelRequest(messages=fixed)
    thinking = {"type": "enabled", "budget_tokens": 1024} if think else None
    body = anthropic_api.build_request(request, model="m", max_tokens=2048, thinking=thinking, origin=origin)
    check_anthropic(body)
    last = body["messages"][-1] if body["messages"] else None
    if last and last["role"] == "assistant" and last["content"][-1]["type"] == "text":
        assert last["content"][-1]["text"] == last["content"][-1]["text"].rstrip()
    json.dumps(body).encode()
    chat = chat_api.build_request(request, model="m")
    check_chat(chat)
    for m in chat["messages"]:
        if m["role"] in ("user", "tool"):
            assert isinstance(m["content"], str)
        if m["role"] == "user":
            assert m["content"].strip()
    json.dumps(chat).encode()
    check_chat(chat_api.build_request(request, model="m", short_tool_ids=True))
    resp = responses_api.build_request(request, model="m")
    check_responses(resp)
    json.dumps(resp).encode()


def _tag_all(msgs: list[Message]) -> list[Message]:
    out = []
    for n, m in enumerate(msgs):
        content: list[Any] = []
        for k, b in enumerate(m.content):
            tag = f"<{n}.{k}>"
            if isinstance(b, TextBlock) and b.text.strip():
                b = TextBlock(text=f"{tag}{b.text}")
            elif isinstance(b, ToolResultBlock):
                b = ToolResultBlock(tool_use_id=b.tool_use_id, content=f"{tag}{b.text}", is_error=b.is_error)
            elif isinstance(b, ToolUseBlock):
                b = ToolUseBlock(id=b.id, name=b.name, input={"tag": tag}, complete=b.complete)
            elif isinstance(b, ThinkingBlock):
                b = ThinkingBlock(thinking=f"{tag}{b.thinking}", signature=b.signature, origin=b.origin)
            elif isinstance(b, RedactedThinkingBlock):
                b = RedactedThinkingBlock(data=tag)
            elif isinstance(b, ProviderBlock):
                b = ProviderBlock(provider=b.provider, data={**b.data, "tag": tag})
            content.append(b)
        out.append(m.model_copy(update={"content": content}))
    return out


def _tags(b: Any) -> str:
    if isinstance(b, TextBlock | ToolResultBlock):
        return b.text
    if isinstance(b, ToolUseBlock | ProviderBlock):
        return str(b.input.get("tag") if isinstance(b, ToolUseBlock) else b.data.get("tag"))
    if isinstance(b, ThinkingBlock):
        return b.thinking
    return str(b.data)


@given(transcripts.map(_tag_all))
def test_repair_of_a_hostile_transcript_keeps_every_block_the_rules_allow_in_its_order(msgs: list[Message]) -> None:
    fixed = repair_transcript(msgs)
    where: dict[str, int] = {}  # a block's tag: the repaired message that holds it
    for j, m in enumerate(fixed):
        for b in m.content:
            for t in re.findall(r"<\d+\.\d+>", _tags(b)):
                where.setdefault(t, j)
    order = []
    for n, m in enumerate(msgs):
        for k, b in enumerate(m.content):
            tag = f"<{n}.{k}>"
            allowed = (
                (isinstance(b, TextBlock) and b.text.strip())
                or (m.role == "assistant" and isinstance(b, ToolUseBlock) and b.complete)
                or (m.role == "assistant" and isinstance(b, ThinkingBlock) and b.signature)
                or (m.role == "assistant" and isinstance(b, RedactedThinkingBlock | ProviderBlock))
            )
            if allowed:
                assert tag in where, (tag, b, fixed)
                order.append((where[tag], n, b))
    # blocks other than results (which move next to their calls) keep the order of their messages
    idx = [w for w, _, _ in order]
    assert idx == sorted(idx), (order, fixed)
