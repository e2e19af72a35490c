"""OpenAIChatModel against the streams of compatible servers, each rebuilt from the server's
own source or documentation:

- Together: ``finish_reason`` ``"eos"`` and a stream choice whose ``logprobs`` is one number
  (togethercomputer/together-python ``src/together/types/common.py`` ``FinishReason``,
  ``src/together/types/chat_completions.py`` ``ChatCompletionChoicesChunk``).
- Hugging Face TGI: ``finish_reason`` ``"stop_sequence"`` (its router's ``FinishReason::format``
  turns only ``eos_token`` into ``"stop"``); watsonx: ``"eos_token"`` (spring-ai PR #4900).
- DeepSeek: ``finish_reason`` ``"insufficient_system_resource"``, "the request is interrupted due
  to insufficient resource of the inference system" (DeepSeek API reference).
- vLLM: each chunk carries the log probabilities of the tokens it was made of, a reasoning
  chunk (``delta.reasoning``) too (``vllm/entrypoints/openai/chat_completion/serving.py``
  ``chat_completion_stream_generator``); its chat endpoint once sent them in the completions
  shape, ``{"tokens", "token_logprobs", ...}`` (vllm-project/vllm #3179).
- Ollama: its ``ChatCompletionRequest`` reads ``max_tokens`` and no ``max_completion_tokens``,
  which Go's decoder drops unread (ollama/ollama ``openai/openai.go``; issue #7125: "silently
  accepted but ignored"). Mistral's API refuses any field it does not know with a 422
  ``extra_forbidden``, ``max_completion_tokens`` among them (the body quoted in
  editor-code-assistant/eca #231).
- LiteLLM's proxy: a failure after the stream began is one ``data: {"error": ...}`` chunk built
  from its ``ProxyException``, whose ``code`` is ``str(status_code)`` and whose ``type`` is the
  string ``"None"`` when the exception has none (BerriAI/litellm ``litellm/proxy/_types.py``,
  ``proxy_server.py`` ``async_data_generator``).
"""

from __future__ import annotations

import json
from typing import Any

import httpx
import pytest
from _models_support import API_KEY, MockServer, chat_chunk, chat_stream, collect

from agentloop import QueryEngine, TurnEnded
from agentloop._errors import ProviderStreamError, StreamProtocolError
from agentloop.models import OpenAIChatModel, StreamLogprobs

USAGE = {"id": "chatcmpl-1", "choices": [], "usage": {"prompt_tokens": 9, "completion_tokens": 2, "total_tokens": 11}}


async def run_body(body: bytes, **kw: Any) -> tuple[list[Any], Any]:
    server = MockServer(body)
    async with server.client() as client:
        return await collect(OpenAIChatModel("m", api_key=API_KEY, http_client=client, **kw))


def together_chunk(content: str, finish: str | None = None, logprobs: float | None = None) -> dict[str, Any]:
    """A chunk as Together streams it: ``logprobs`` is the token's log probability, a number."""
    choice = {"index": 0, "logprobs": logprobs, "finish_reason": finish, "delta": {"content": content}}
    return {"id": "8a3f", "object": "chat.completion.chunk", "created": 1, "model": "meta-llama/x", "choices": [choice]}


# -- finish reasons beyond OpenAI's ------------------------------------------------------


@pytest.mark.parametrize(
    ("finish", "reason"),
    [("eos", "end_turn"), ("eos_token", "end_turn"), ("stop_sequence", "stop_sequence")],
    ids=["together", "watsonx", "tgi"],
)
async def test_an_end_of_sequence_finish_is_told_in_the_stop_reason_vocabulary(finish: str, reason: str) -> None:
    # "eos" reached the host as the stop reason, where it looks for "end_turn".
    body = chat_stream(together_chunk("Hello."), together_chunk("", finish), USAGE)
    _, acc = await run_body(body)
    assert (acc.message().text, acc.stop_reason) == ("Hello.", reason)


@pytest.mark.parametrize("finish", ["eos", "stop_sequence"])
async def test_a_tool_call_ended_by_end_of_sequence_is_tool_use(finish: str) -> None:
    call = {"index": 0, "id": "call_1", "type": "function", "function": {"name": "f", "arguments": '{"a": 1}'}}
    body = chat_stream(chat_chunk({"tool_calls": [call]}), chat_chunk(finish=finish))
    _, acc = await run_body(body)
    assert acc.stop_reason == "tool_use" and acc.message().tool_uses[0].input == {"a": 1}


@pytest.mark.parametrize("usage", [True, False])
async def test_deepseeks_insufficient_system_resource_is_a_cut_answer_that_is_retried(usage: bool) -> None:
    # DeepSeek stops a response it has no resources to finish: the text so far is not the answer.
    chunks: list[dict[str, Any]] = [
        chat_chunk({"role": "assistant", "content": "The first half"}),
        chat_chunk(finish="insufficient_system_resource"),
    ]
    if usage:
        chunks.append(USAGE)
    with pytest.raises(StreamProtocolError, match="insufficient_system_resource") as info:
        await run_body(chat_stream(*chunks))
    assert not isinstance(info.value, ProviderStreamError)
    assert info.value.retryable is True


# -- errors inside the stream ------------------------------------------------------------


def litellm_error(status: str, message: str) -> dict[str, Any]:
    return {"error": {"message": message, "type": "None", "param": "None", "code": status}}


@pytest.mark.parametrize(("status", "retryable"), [("429", True), ("500", True), ("503", True), ("400", False)])
async def test_litellms_error_chunk_is_retried_as_its_http_status_is(status: str, retryable: bool) -> None:
    # The status came as a str ("429"), and a rate-limited stream ended the turn unretried.
    body = chat_stream(chat_chunk({"content": "x"}), litellm_error(status, "litellm.RateLimitError: slow down"))
    with pytest.raises(ProviderStreamError) as info:
        await run_body(body)
    assert info.value.retryable is retryable
    assert str(info.value).startswith(f"openai chat stream error ({status}): litellm.RateLimitError")
    assert info.value.error_type == status


# -- logprobs ------------------------------------------------------------------------------


def logprobs_of(events: list[Any]) -> list[tuple[str, tuple[float, ...]]]:
    return [(e.channel, e.logprobs) for e in events if isinstance(e, StreamLogprobs)]


async def test_togethers_logprob_as_one_number_is_read_not_a_malformed_chunk() -> None:
    # Each chunk failed as malformed ('float' object has no attribute 'get'): no answer at all.
    body = chat_stream(
        together_chunk("Hel", logprobs=-0.25), together_chunk("lo", logprobs=0), together_chunk("", "eos"), USAGE
    )
    events, acc = await run_body(body, logprobs=True)
    assert acc.message().text == "Hello" and acc.stop_reason == "end_turn"
    assert logprobs_of(events) == [("text", (-0.25,)), ("text", (0.0,))]


async def test_logprobs_in_the_completions_shape_are_read() -> None:
    chunk = chat_chunk({"content": "Hello"})
    chunk["choices"][0]["logprobs"] = {
        "text_offset": [0, 2, 3],
        "token_logprobs": [-0.5, None, -1.5],
        "tokens": ["He", "l", "lo"],
        "top_logprobs": None,
    }
    body = chat_stream(chunk, chat_chunk(finish="stop"))
    events, acc = await run_body(body, logprobs=True)
    assert acc.message().text == "Hello"
    assert logprobs_of(events) == [("text", (-0.5, -1.5))]


@pytest.mark.parametrize("lp", ["-0.5", [-0.5], {"content": "x"}, {"content": [{"token": "x"}, "y"]}, True])
async def test_logprobs_of_an_unknown_shape_are_left_out_and_the_answer_kept(lp: Any) -> None:
    chunk = chat_chunk({"content": "Hi"})
    chunk["choices"][0]["logprobs"] = lp
    events, acc = await run_body(chat_stream(chunk, chat_chunk(finish="stop")), logprobs=True)
    assert acc.message().text == "Hi" and logprobs_of(events) == []


async def test_logprobs_of_vllm_reasoning_tokens_are_on_the_thinking_channel() -> None:
    # They were reported on the text channel: a run of unlikely reasoning tokens counted as text.
    def chunk(delta: dict[str, Any], *logprobs: float) -> dict[str, Any]:
        out = chat_chunk(delta)
        content = [{"token": "t", "logprob": v, "bytes": [116], "top_logprobs": []} for v in logprobs]
        out["choices"][0]["logprobs"] = {"content": content}
        return out

    body = chat_stream(
        chat_chunk({"role": "assistant", "content": ""}),
        chunk({"reasoning": "Let me"}, -0.1, -0.2),
        chunk({"reasoning": " think."}, -0.3),
        chunk({"content": "Four."}, -0.4),
        chat_chunk(finish="stop"),
    )
    events, acc = await run_body(body, logprobs=True)
    assert acc.message().text == "Four."
    assert logprobs_of(events) == [("thinking", (-0.1, -0.2)), ("thinking", (-0.3,)), ("text", (-0.4,))]


# -- the output token limit's field ---------------------------------------------------------


def ollama(req: httpx.Request) -> httpx.Response:
    """Ollama's chat endpoint: ``max_tokens`` bounds the answer; ``max_completion_tokens`` is not
    a field of its request, so it bounds nothing."""
    limit = json.loads(req.content).get("max_tokens")
    words = ["one", " two", " three", " four", " five", " six"]
    shown = words if limit is None else words[:limit]
    finish = "length" if len(shown) < len(words) else "stop"
    chunks = [chat_chunk({"role": "assistant", "content": w}) for w in shown]
    body = chat_stream(*chunks, chat_chunk(finish=finish), USAGE)
    return httpx.Response(200, headers={"content-type": "text/event-stream"}, content=body)


def mistral(req: httpx.Request) -> httpx.Response:
    """Mistral's API: a field it does not know is refused, before anything streams."""
    body = json.loads(req.content)
    if "max_completion_tokens" in body:
        detail = [{"type": "extra_forbidden", "loc": ["body", "max_completion_tokens"],
                   "msg": "Extra inputs are not permitted", "input": body["max_completion_tokens"]}]  # fmt: skip
        error = {"object": "error", "message": {"detail": detail}, "type": "invalid_request_error", "param": None,
                 "code": None}  # fmt: skip
        return httpx.Response(422, json=error)
    return httpx.Response(200, headers={"content-type": "text/event-stream"},
                          content=chat_stream(chat_chunk({"content": "Bonjour."}), chat_chunk(finish="stop")))  # fmt: skip


async def run_engine(handler: Any, base_url: str, **kw: Any) -> tuple[QueryEngine, TurnEnded]:
    async with httpx.AsyncClient(transport=httpx.MockTransport(handler)) as client:
        model = OpenAIChatModel("m", api_key=API_KEY, base_url=base_url, http_client=client, **kw)
        engine = QueryEngine(model, policies=[], max_tokens=3, retry_base_delay=0.001)
        events = [e async for e in engine.run("count to six")]
    ended = events[-1]
    assert isinstance(ended, TurnEnded)
    return engine, ended


async def test_ollama_gets_the_output_limit_in_the_field_it_reads() -> None:
    # Sent as max_completion_tokens, the limit was dropped unread and the answer ran to its end.
    engine, ended = await run_engine(ollama, "http://localhost:11434/v1")
    assert ended.reason == "completed"
    assert engine.messages[-1].text == "one two three"


async def test_mistral_takes_a_request_with_an_output_limit() -> None:
    # Every request with max_tokens was refused: 422 "Extra inputs are not permitted".
    engine, ended = await run_engine(mistral, "https://api.mistral.ai/v1")
    assert ended.reason == "completed" and engine.messages[-1].text == "Bonjour."


@pytest.mark.parametrize(
    ("base_url", "field"),
    [
        (None, "max_completion_tokens"),
        ("https://api.openai.com/v1", "max_completion_tokens"),
        ("https://my-resource.openai.azure.com/openai/deployments/o3?api-version=2025-04-01-preview",
         "max_completion_tokens"),
        ("https://my-resource.cognitiveservices.azure.com/openai/deployments/o3", "max_completion_tokens"),
        ("http://localhost:8000/v1", "max_tokens"),
        ("https://api.deepseek.com", "max_tokens"),
        ("https://generativelanguage.googleapis.com/v1beta/openai/", "max_tokens"),
        ("https://api.openai.com.evil.example/v1", "max_tokens"),
    ],
)  # fmt: skip
def test_the_limit_field_is_openais_own_only_for_openai_and_azure_openai(base_url: str | None, field: str) -> None:
    model = OpenAIChatModel("m", api_key=API_KEY, base_url=base_url)
    assert model.max_tokens_param == field
    chosen = "max_tokens" if field == "max_completion_tokens" else "max_completion_tokens"
    assert OpenAIChatModel("m", api_key=API_KEY, base_url=base_url, max_tokens_param=chosen).max_tokens_param == chosen
