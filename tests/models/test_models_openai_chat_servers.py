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
- LiteLLM's proxy: a failure after the stream began is one ``data: {"error": ...}`` chunk built
  from its ``ProxyException``, whose ``code`` is ``str(status_code)`` and whose ``type`` is the
  string ``"None"`` when the exception has none (BerriAI/litellm ``litellm/proxy/_types.py``,
  ``proxy_server.py`` ``async_data_generator``).
"""

from __future__ import annotations

from typing import Any

import pytest
from _models_support import API_KEY, MockServer, chat_chunk, chat_stream, collect

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
