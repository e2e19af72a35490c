"""Every request body, as sent over HTTP, has the shape the official SDKs declare.

The official ``anthropic`` and ``openai`` SDKs describe each API's request
parameters as TypedDicts. For random transcripts and random model options,
the body each provider puts on the wire is validated against those types with
pydantic, and must come back unchanged: a missing or mistyped field fails the
validation, and a key the SDK does not know (which a strict API rejects with a
400) is dropped by it, so the round trip differs.
"""

from __future__ import annotations

import json
from typing import Any

import httpx
import pytest
from anthropic.types.message_create_params import MessageCreateParamsStreaming
from hypothesis import given, settings
from hypothesis import strategies as st
from openai.types.chat.completion_create_params import CompletionCreateParamsStreaming
from openai.types.responses.response_create_params import ResponseCreateParamsStreaming
from pydantic import TypeAdapter, ValidationError

from agentloop import Message, ModelError, Tool, repair_transcript, tool, validate_transcript
from agentloop._abort import AbortController
from agentloop._messages import RedactedThinkingBlock, TextBlock, ThinkingBlock, ToolResultBlock, ToolUseBlock
from agentloop.models import AnthropicModel, ModelRequest, OpenAIChatModel, OpenAIResponsesModel

SHAPES: dict[str, TypeAdapter[Any]] = {
    "anthropic": TypeAdapter(MessageCreateParamsStreaming),
    "chat": TypeAdapter(CompletionCreateParamsStreaming),
    "responses": TypeAdapter(ResponseCreateParamsStreaming),
}


def _materialise(value: Any) -> Any:
    """pydantic validates an ``Iterable[...]`` field lazily: consume it (validating each item)."""
    if type(value).__name__ == "ValidatorIterator":
        return [_materialise(v) for v in value]
    if isinstance(value, dict):
        return {k: _materialise(v) for k, v in value.items()}
    if isinstance(value, list):
        return [_materialise(v) for v in value]
    return value


def assert_sdk_shape(api: str, body: dict[str, Any]) -> None:
    try:
        echoed = _materialise(SHAPES[api].validate_python(body))
    except ValidationError as exc:
        raise AssertionError(f"{api} body does not validate: {exc}\n{json.dumps(body)[:2000]}") from None
    assert echoed == body, f"{api}: the SDK types drop or change something in\n{json.dumps(body)[:2000]}"


# -- the data ----------------------------------------------------------------------------

words = st.text(st.characters(codec="utf-8"), max_size=12)  # utf-8: no surrogates
json_values = st.recursive(
    st.none()
    | st.booleans()
    | st.integers(-(2**40), 2**40)
    | st.floats(allow_nan=False, allow_infinity=False)
    | words,
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(words, inner, max_size=3),
    max_leaves=8,
)
ids = st.sampled_from(["toolu_1", "call_a", "fc_2", "x"])
blocks = st.one_of(
    words.map(lambda t: TextBlock(text=t)),
    st.builds(ThinkingBlock, thinking=words, signature=st.sampled_from(["", "sig=="])),
    st.builds(RedactedThinkingBlock, data=st.just("opaque")),
    st.builds(
        lambda i, n, inp, done: ToolUseBlock(id=i, name=n, input=inp, complete=done),
        ids,
        st.sampled_from(["add", "read_file"]),
        st.dictionaries(words, json_values, max_size=3),
        st.booleans(),
    ),
    st.builds(
        lambda i, c, err: ToolResultBlock(tool_use_id=i, content=c, is_error=err),
        ids,
        words | st.lists(words.map(lambda t: TextBlock(text=t)), min_size=1, max_size=2),
        st.booleans(),
    ),
)
transcripts = st.lists(
    st.builds(
        lambda role, content: Message(role=role, content=content),
        st.sampled_from(["user", "assistant"]),
        st.lists(blocks, max_size=4),
    ),
    max_size=6,
)


@tool
async def add(a: int, b: int) -> str:
    """Add two integers."""
    return str(a + b)


@tool
async def read_file(path: str, limit: int | None = None) -> str:
    """Read a file."""
    return path


TOOLS: tuple[Tool, ...] = (add, read_file)

requests = st.builds(
    lambda msgs, system, tools, choice, max_tokens: ModelRequest(
        messages=msgs,
        system=system,
        tools=tools,
        tool_choice=choice if tools else None,
        max_tokens=max_tokens,
    ),
    transcripts.map(repair_transcript),
    st.none() | words,
    st.sampled_from([(), TOOLS, TOOLS[:1]]),
    st.sampled_from([None, "auto", "none", "any", "add"]),
    st.none() | st.integers(1, 64_000),
)
anthropic_options = st.fixed_dictionaries(
    {"thinking": st.sampled_from([None, 1024, {"type": "enabled", "budget_tokens": 2048}])}
)
chat_options = st.fixed_dictionaries(
    {
        "logprobs": st.booleans(),
        "top_logprobs": st.none() | st.integers(0, 20),
        "include_usage": st.booleans(),
        "max_tokens_param": st.sampled_from(["max_completion_tokens", "max_tokens"]),
    }
)
responses_options = st.fixed_dictionaries(
    {
        "reasoning": st.sampled_from([None, {"effort": "low"}, {"effort": "high", "summary": "auto"}]),
        "store": st.sampled_from([None, True, False]),
    }
)

MODELS = {"anthropic": AnthropicModel, "chat": OpenAIChatModel, "responses": OpenAIResponsesModel}


async def sent_body(api: str, request: ModelRequest, options: dict[str, Any]) -> dict[str, Any]:
    """The JSON body the model puts on the wire for ``request`` (answered with a 400)."""
    bodies: list[dict[str, Any]] = []

    def handler(req: httpx.Request) -> httpx.Response:
        bodies.append(json.loads(req.content))
        return httpx.Response(400, json={"error": {"type": "invalid_request_error", "message": "no"}})

    async with httpx.AsyncClient(transport=httpx.MockTransport(handler)) as client:
        model = MODELS[api]("m", api_key="k", http_client=client, **options)
        with pytest.raises(ModelError):
            async for _event in model.stream(request, AbortController().signal):
                pass
    (body,) = bodies
    return body


@settings(max_examples=150)
@given(requests, anthropic_options, chat_options, responses_options)
async def test_every_request_body_has_the_shape_the_official_sdks_declare(
    request: ModelRequest, a_opts: dict[str, Any], c_opts: dict[str, Any], r_opts: dict[str, Any]
) -> None:
    assert validate_transcript(request.messages) == []
    for api, options in (("anthropic", a_opts), ("chat", c_opts), ("responses", r_opts)):
        assert_sdk_shape(api, await sent_body(api, request, options))


def test_the_shape_check_catches_an_unknown_key_and_a_missing_field() -> None:
    good = {"model": "m", "max_tokens": 5, "stream": True, "messages": [{"role": "user", "content": "hi"}]}
    assert_sdk_shape("anthropic", good)
    with pytest.raises(AssertionError, match="drop or change"):
        assert_sdk_shape("anthropic", {**good, "messages": [{"role": "user", "content": "hi", "name": "x"}]})
    with pytest.raises(AssertionError, match="does not validate"):
        assert_sdk_shape(
            "chat", {"model": "m", "stream": True, "messages": [{"role": "tool", "content": "r"}]}
        )
