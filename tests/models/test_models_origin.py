"""Where reasoning made elsewhere goes: each provider, each kind of thinking block, and the
block's `origin` (this server's, another's, none recorded) → sent, dropped, or converted (its
text only, as Chat's ``reasoning_content``). The table in docs/providers.md ("Reasoning and
the server that made it") is this one."""

from __future__ import annotations

import json
from typing import Any

import pytest
from _models_support import API_KEY, request

from agentloop._messages import Message, RedactedThinkingBlock, ThinkingBlock, ToolResultBlock, ToolUseBlock
from agentloop.models import AnthropicModel, OpenAIChatModel, OpenAIResponsesModel
from agentloop.models._http import origin_of

HERE = "https://gw.test:8443/v1"  # the base URL every model below speaks to
OTHER = "http://gw.test:8443"  # another server: the same host and port, over http



def _compact(value: Any) -> str:
    return json.dumps(value, separators=(",", ":"))  # as the Chat provider writes what it keeps


#: Each kind of block: how it is made, the secret only a sent block carries, and its text.
KINDS: dict[str, tuple[Any, str, str]] = {
    "anthropic-thinking": (lambda o: ThinkingBlock(thinking="T-claude", signature="EqQBsig", origin=o),
                           "EqQBsig", "T-claude"),
    "anthropic-redacted": (lambda o: RedactedThinkingBlock(data="EmwKred", origin=o), "EmwKred", ""),
    "responses-item": (lambda o: ThinkingBlock(thinking="T-summary", origin=o, signature=json.dumps(
        {"id": "rs_1", "summary": [{"type": "summary_text", "text": "T-summary"}], "encrypted_content": "gAAenc"})),
                       "gAAenc", "T-summary"),
    "chat-reasoning": (lambda o: ThinkingBlock(thinking="T-deepseek", signature='{"type":"reasoning_content"}',
                                               origin=o), "", "T-deepseek"),
    "chat-extra-content": (lambda o: ThinkingBlock(thinking="", origin=o, signature=_compact(
        {"type": "extra_content", "call": "c1", "extra_content": {"google": {"thought_signature": "GSIG"}}})),
                           "GSIG", ""),
    "chat-reasoning-details": (lambda o: ThinkingBlock(thinking="", origin=o, signature=_compact(
        {"type": "reasoning_details", "reasoning_details": [{"type": "reasoning.encrypted", "data": "ORSIG"}]})),
                               "ORSIG", ""),
}  # fmt: skip

S, D, C = "sent", "dropped", "converted"
#: provider → kind → (this server's origin, another's, none recorded)
TABLE: dict[str, dict[str, tuple[str, str, str]]] = {
    "anthropic": {"anthropic-thinking": (S, D, S), "anthropic-redacted": (S, D, S), "responses-item": (D, D, D),
                  "chat-reasoning": (D, D, D), "chat-extra-content": (D, D, D), "chat-reasoning-details": (D, D, D)},
    "responses": {"anthropic-thinking": (D, D, D), "anthropic-redacted": (D, D, D), "responses-item": (S, D, S),
                  "chat-reasoning": (D, D, D), "chat-extra-content": (D, D, D), "chat-reasoning-details": (D, D, D)},
    "chat": {"anthropic-thinking": (D, D, D), "anthropic-redacted": (D, D, D), "responses-item": (D, D, D),
             "chat-reasoning": (D, D, D), "chat-extra-content": (S, D, D), "chat-reasoning-details": (S, D, D)},
    "chat-echo": {"anthropic-thinking": (C, C, C), "anthropic-redacted": (D, D, D), "responses-item": (C, C, C),
                  "chat-reasoning": (C, C, C), "chat-extra-content": (S, D, D), "chat-reasoning-details": (S, D, D)},
}  # fmt: skip

MODELS: dict[str, Any] = {
    "anthropic": lambda: AnthropicModel("m", api_key=API_KEY, base_url=HERE),
    "responses": lambda: OpenAIResponsesModel("m", api_key=API_KEY, base_url=HERE),
    "chat": lambda: OpenAIChatModel("m", api_key=API_KEY, base_url=HERE),
    "chat-echo": lambda: OpenAIChatModel("m", api_key=API_KEY, base_url=HERE, echo_reasoning=True),
}


def _outcome(body: dict[str, Any], secret: str, text: str) -> str:
    wire = json.dumps(body)
    if secret and secret in wire:
        return S
    if text and text in wire:
        assert all(text in m.get("reasoning_content", "") for m in body["messages"] if text in json.dumps(m))
        return C
    return D


@pytest.mark.parametrize("provider", list(TABLE))
@pytest.mark.parametrize("kind", list(KINDS))
def test_reasoning_made_elsewhere_is_sent_dropped_or_converted_as_the_table_says(provider: str, kind: str) -> None:
    make, secret, text = KINDS[kind]
    model = MODELS[provider]()
    here = model._origin
    seen = []
    for origin in (here, OTHER, None):
        history = [
            Message.user("q"),
            Message(role="assistant", content=[make(origin), ToolUseBlock(id="c1", name="f", input={})]),
            Message(role="user", content=[ToolResultBlock(tool_use_id="c1", content="done")]),
        ]
        _, _, body = model._prepare(request(*history))
        seen.append(_outcome(body, secret, text))
        assert history[1].content[0] == make(origin)  # the transcript keeps it
    assert tuple(seen) == TABLE[provider][kind]


# -- a gateway that routes by path: each base URL is a server of its own -------------------


@pytest.mark.parametrize(
    ("base_url", "origin"),
    [("https://api.anthropic.com", "https://api.anthropic.com"), ("https://api.anthropic.com/", "https://api.anthropic.com"),
     ("https://API.DeepSeek.com:443/anthropic/", "https://api.deepseek.com/anthropic"),
     ("http://user:pw@localhost:8080/v1?api-version=1", "http://localhost:8080/v1"),
     ("https://gw.test/Anthropic//", "https://gw.test/Anthropic")],
)  # fmt: skip
def test_the_origin_is_the_base_url_without_what_does_not_name_the_server(base_url: str, origin: str) -> None:
    # Scheme and host lower-case, a default port, user info, a query and trailing slashes left
    # out; the path kept as it is (a server may tell /Anthropic from /anthropic).
    assert origin_of(base_url) == origin


GATEWAY = "https://gw.test/v1"  # routes by the path that follows: /google-ai-studio/..., /mistral/...


def _gemini_turn(origin: str | None) -> list[Message]:
    kept = _compact({"type": "extra_content", "call": "c1", "extra_content": {"google": {"thought_signature": "GSIG"}}})
    return [
        Message.user("q"),
        Message(role="assistant", content=[ToolUseBlock(id="c1", name="f", input={}),
                                           ThinkingBlock(thinking="", signature=kept, origin=origin)]),
        Message(role="user", content=[ToolResultBlock(tool_use_id="c1", content="done")]),
    ]  # fmt: skip


@pytest.mark.parametrize(
    ("base_url", "sent"),
    [(f"{GATEWAY}/google-ai-studio/v1beta/openai", True), (f"{GATEWAY}/google-ai-studio/v1beta/openai/", True),
     (f"{GATEWAY}/mistral/v1", False), (f"{GATEWAY}/compat", False)],
    ids=["same-route", "same-route-trailing-slash", "mistral-route", "another-route"],
)  # fmt: skip
def test_a_gateway_routing_by_path_gets_each_routes_reasoning_on_that_route_only(base_url: str, sent: bool) -> None:
    # Gemini's thought signature, made through the gateway's Google route, sent through its
    # Mistral route, reaches Mistral's API, which refuses the field (422) on every request.
    made_at = origin_of(f"{GATEWAY}/google-ai-studio/v1beta/openai")
    model = OpenAIChatModel("m", api_key=API_KEY, base_url=base_url)
    _, _, body = model._prepare(request(*_gemini_turn(made_at)))
    assert ("GSIG" in json.dumps(body)) is sent


@pytest.mark.parametrize(
    ("base_url", "sent"),
    [("https://gw.test", True), ("https://gw.test/", True), ("https://gw.test/anthropic", False)],
    ids=["that-server", "that-server-slash", "a-route-of-it"],
)  # fmt: skip
def test_a_block_recorded_without_a_path_goes_back_to_that_base_url_only(base_url: str, sent: bool) -> None:
    # What a session saved before the path counted holds ("https://gw.test" for a model at
    # "https://gw.test/anthropic" then): it loads as it was, and goes to a server with no path;
    # behind a route of the gateway it is left out, which costs the model that context only.
    history = [
        Message.user("q"),
        Message(role="assistant", content=[ThinkingBlock(thinking="hm", signature="EqQBsig", origin="https://gw.test"),
                                           ToolUseBlock(id="c1", name="f", input={})]),
        Message(role="user", content=[ToolResultBlock(tool_use_id="c1", content="done")]),
    ]  # fmt: skip
    model = AnthropicModel("m", api_key=API_KEY, base_url=base_url, thinking=2000)
    _, _, body = model._prepare(request(*history))
    assert ("EqQBsig" in json.dumps(body)) is sent
    assert ("thinking" in body) is sent  # a turn whose thinking is left out counts as one that did not think
