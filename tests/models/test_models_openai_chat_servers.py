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
- Gemini's OpenAI endpoint: with Gemini 3, each step's first function call carries
  ``"extra_content": {"google": {"thought_signature": ...}}``, streamed on the tool-call delta,
  and a later request whose assistant message does not send it back on that call is refused,
  ``[{"error": {"code": 400, "message": "Function call is missing a thought_signature in
  functionCall parts. ...", "status": "INVALID_ARGUMENT"}}]`` (ai.google.dev
  thought-signatures docs; the error as quoted on discuss.ai.google.dev; the delta as openai/codex
  PR #7586 reads it).
- Servers that end the body after the ``finish_reason`` chunk with no ``data: [DONE]``: TGI
  before huggingface/text-generation-inference PR #2221 (its final chunk carries the usage
  beside the choice), ik_llama.cpp (ikawrakow/ik_llama.cpp #467), mistral.rs before PR #1226.
- DeepSeek counts the prompt tokens read from its cache as ``usage.prompt_cache_hit_tokens``
  (beside ``prompt_cache_miss_tokens``), not OpenAI's ``prompt_tokens_details.cached_tokens``
  (DeepSeek's context caching guide). Moonshot (Kimi) puts a stream's usage in the finish
  chunk's ``choices[0].usage``, at the top level only on the trailing chunk that
  ``include_usage`` asks for (as other clients' Kimi adapters read it).
- OpenRouter: a failure after the stream began is a chunk with a top-level ``error`` beside a
  choice whose ``finish_reason`` is ``"error"`` (OpenRouter's API docs, "Error handling during
  streaming"). Groq: usage on the finish chunk (top level and in ``x_groq``), then again on a
  ``choices: []`` chunk; Kimi's tool call ids ``functions.add:0`` (a recorded Groq stream,
  charmbracelet/fantasy ``providertests/testdata/.../multi_tool_streaming_groq-kimi-k2.yaml``).
- OpenRouter's ``reasoning_details``: the model's reasoning as a list of typed entries
  (``reasoning.text`` with a ``signature`` for Claude, ``reasoning.encrypted`` with ``data`` for
  Gemini's thought signatures, ``reasoning.summary``), streamed in pieces on the deltas beside
  ``reasoning``, and to be sent back "unmodified" on the assistant message so that a tool loop
  with Claude's thinking or Gemini 3 goes on (OpenRouter's reasoning-tokens guide, "Preserving
  reasoning blocks"; the consecutive ``reasoning.text`` pieces of one block joined as
  OpenRouterTeam/ai-sdk-provider ``src/chat/index.ts`` joins them; Gemini 3 tool use over
  OpenRouter failing without them: cline #7551, Roo-Code PR #9506).
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
from _models_support import API_KEY, MockServer, chat_chunk, chat_stream, collect, request

from agentloop import QueryEngine, TurnEnded, tool, validate_transcript
from agentloop._errors import ProviderStreamError, StreamProtocolError
from agentloop._messages import Message, TextBlock, ThinkingBlock, ToolResultBlock, ToolUseBlock
from agentloop.models import OpenAIChatModel, StreamLogprobs, anthropic, openai_chat, openai_responses
from agentloop.sessions import JsonlSession

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


# -- Gemini's thought signatures -----------------------------------------------------------


@tool
async def weather(city: str) -> str:
    """The weather in a city."""
    return {"Paris": "sunny", "Rome": "rain", "Oslo": "snow"}[city]


def gemini_call(id: str, city: str, signature: str | None) -> dict[str, Any]:
    """A function call as Gemini streams it: whole, no ``index``, the signature beside it."""
    call: dict[str, Any] = {"id": id, "type": "function",
                            "function": {"name": "weather", "arguments": json.dumps({"city": city})}}  # fmt: skip
    if signature is not None:
        call["extra_content"] = {"google": {"thought_signature": signature}}
    return call


class Gemini:
    """Plays Gemini 3 over its OpenAI endpoint: a step of two parallel calls (the signature on the
    first), a step of one, then the answer; a request that drops a signature gets its 400."""

    def __init__(self) -> None:
        self.bodies: list[dict[str, Any]] = []
        self.signed: dict[str, str] = {}

    def handler(self, req: httpx.Request) -> httpx.Response:
        body = json.loads(req.content)
        self.bodies.append(body)
        for m in body["messages"]:
            for call in m.get("tool_calls") or ():
                sent = (call.get("extra_content") or {}).get("google", {}).get("thought_signature")
                if call["id"] in self.signed and sent != self.signed[call["id"]]:
                    message = ("Function call is missing a thought_signature in functionCall parts. This is required "
                               "for tools to work correctly, and missing thought_signature may lead to degraded model "
                               "performance. Additional data, function call `default_api:weather` , position 2.")  # fmt: skip
                    return httpx.Response(400, json=[{"error": {"code": 400, "message": message, "status": "INVALID_ARGUMENT"}}])
        step = sum(1 for m in body["messages"] if m["role"] == "assistant")
        if step == 0:
            self.signed["function-call-1"] = "CiQBjz1rX1Rk+sig/one=="
            calls = [gemini_call("function-call-1", "Paris", "CiQBjz1rX1Rk+sig/one=="),
                     gemini_call("function-call-2", "Rome", None)]  # fmt: skip
        elif step == 1:
            self.signed["function-call-3"] = "CiQBsig-two"
            calls = [gemini_call("function-call-3", "Oslo", "CiQBsig-two")]
        else:
            chunks = [chat_chunk({"role": "assistant", "content": "Sunny, rain, snow."}), chat_chunk(finish="stop")]
            return httpx.Response(200, headers={"content-type": "text/event-stream"}, content=chat_stream(*chunks))
        chunks = [*(chat_chunk({"role": "assistant", "tool_calls": [c]}) for c in calls), chat_chunk(finish="tool_calls")]
        return httpx.Response(200, headers={"content-type": "text/event-stream"}, content=chat_stream(*chunks))


async def _weather_loop(handler: Any, name: str, base_url: str, prompt: str) -> QueryEngine:
    """A run of ``prompt`` with the ``weather`` tool against the server ``handler`` at
    ``base_url``, which must complete."""
    async with httpx.AsyncClient(transport=httpx.MockTransport(handler)) as client:
        model = OpenAIChatModel(name, api_key=API_KEY, http_client=client, base_url=base_url)
        engine = QueryEngine(model, tools=[weather], policies=[], retry_base_delay=0.001)
        events = [e async for e in engine.run(prompt)]
    ended = events[-1]
    assert isinstance(ended, TurnEnded) and ended.reason == "completed", ended
    return engine


async def test_a_tool_loop_against_gemini_sends_each_thought_signature_back_and_completes() -> None:
    # The signature was dropped, so the request after the first tool call was always refused.
    server = Gemini()
    engine = await _weather_loop(server.handler, "gemini-3-flash-preview",
                                 "https://generativelanguage.googleapis.com/v1beta/openai/", "weather in Paris and Rome, then Oslo?")  # fmt: skip
    assert engine.messages[-1].text == "Sunny, rain, snow." and len(server.bodies) == 3
    sent = [c for m in server.bodies[-1]["messages"] for c in m.get("tool_calls") or ()]
    assert [c.get("extra_content") for c in sent] == [
        {"google": {"thought_signature": "CiQBjz1rX1Rk+sig/one=="}}, None, {"google": {"thought_signature": "CiQBsig-two"}},
    ]  # fmt: skip
    assert all("reasoning_content" not in m for m in server.bodies[-1]["messages"])
    assert validate_transcript(engine.messages) == []


async def test_the_signature_stays_with_its_call_whatever_the_chunks() -> None:
    # A signature that comes on a later fragment of a call, and a call with no id of its own.
    late = {"extra_content": {"google": {"thought_signature": "late"}}}
    body = chat_stream(
        chat_chunk({"tool_calls": [{"index": 0, "function": {"name": "weather", "arguments": ""}}]}),
        chat_chunk({"tool_calls": [{"index": 0, "function": {"arguments": '{"city": "Oslo"}'}, **late}]}),
        chat_chunk({"tool_calls": [{"index": 0, **late}]}),  # sent again: kept once
        chat_chunk(finish="tool_calls"),
    )
    _, acc = await run_body(body)
    msg = acc.message()
    (call,) = msg.tool_uses
    assert call.input == {"city": "Oslo"} and call.id.startswith("call_")
    assert sum(isinstance(b, ThinkingBlock) for b in msg.content) == 1
    tail = Message(role="user", content=[ToolResultBlock(tool_use_id=call.id, content="snow")])
    wire = openai_chat.build_request(request(Message.user("go"), msg, tail), model="m")
    (sent,) = [c for m in wire["messages"] for c in m.get("tool_calls") or ()]
    assert sent["id"] == call.id and sent["extra_content"] == {"google": {"thought_signature": "late"}}


async def test_a_call_without_a_signature_is_sent_without_extra_content() -> None:
    body = chat_stream(chat_chunk({"tool_calls": [gemini_call("c1", "Oslo", None)]}), chat_chunk(finish="tool_calls"))
    _, acc = await run_body(body)
    assert [type(b) for b in acc.message().content] == [ToolUseBlock]


async def test_the_signature_goes_back_only_to_the_server_that_sent_it() -> None:
    # Mistral's API refuses a field it does not know (422 extra_forbidden): a transcript carried
    # over from Gemini must not take Gemini's extra_content there.
    body = chat_stream(chat_chunk({"tool_calls": [gemini_call("c1", "Oslo", "SIG")]}), chat_chunk(finish="tool_calls"))
    gemini_url = "https://generativelanguage.googleapis.com/v1beta/openai/"
    server = MockServer(body)
    async with server.client() as client:
        _, acc = await collect(OpenAIChatModel("g", api_key=API_KEY, base_url=gemini_url, http_client=client))
    result = Message(role="user", content=[ToolResultBlock(tool_use_id="c1", content="snow")])
    history = request(Message.user("go"), acc.message(), result)
    sent: dict[str, str] = {}
    for url in (gemini_url, "https://api.mistral.ai/v1"):
        server = MockServer(chat_stream(chat_chunk({"content": "Snow."}), chat_chunk(finish="stop")))
        async with server.client() as client:
            await collect(OpenAIChatModel("m", api_key=API_KEY, base_url=url, http_client=client), history)
        sent[url] = json.dumps(server.body)
    assert '"extra_content": {"google": {"thought_signature": "SIG"}}' in sent[gemini_url]
    assert "extra_content" not in sent["https://api.mistral.ai/v1"] and "SIG" not in sent["https://api.mistral.ai/v1"]


async def test_the_signature_never_reaches_another_provider() -> None:
    body = chat_stream(chat_chunk({"tool_calls": [gemini_call("c1", "Oslo", "SIG")]}), chat_chunk(finish="tool_calls"))
    _, acc = await run_body(body)
    result = Message(role="user", content=[ToolResultBlock(tool_use_id="c1", content="snow")])
    history = request(Message.user("go"), acc.message(), result, Message(role="assistant", content=[TextBlock(text="Snow.")]))
    assert "SIG" not in json.dumps(anthropic.build_request(history, model="m", max_tokens=64, thinking=None))
    assert "SIG" not in json.dumps(openai_responses.build_request(history, model="m"))
    echoed = openai_chat.build_request(history, model="m", echo_reasoning=True)
    assistants = [m for m in echoed["messages"] if m["role"] == "assistant"]
    assert [m.get("reasoning_content") for m in assistants] == ["", None]  # the signature is not reasoning
    assert json.dumps(echoed).count("SIG") == 1  # on its call only


# -- a body that ends without [DONE] -------------------------------------------------------


def tgi_stream(*, done: bool) -> bytes:
    """TGI's chat stream before it sent [DONE]: the usage on the last chunk, beside its choice."""
    last = chat_chunk(finish="stop")
    last["usage"] = {"prompt_tokens": 5, "completion_tokens": 2, "total_tokens": 7}
    return chat_stream(chat_chunk({"role": "assistant", "content": "Hello"}), chat_chunk({"content": "!"}), last,
                       done=done)  # fmt: skip


@pytest.mark.parametrize("include_usage", [True, False])
async def test_a_body_that_ends_cleanly_after_the_finish_reason_is_the_whole_answer(include_usage: bool) -> None:
    # It failed as cut ("ended without data: [DONE]"), was asked again three times, then the
    # turn ended with model_error: no answer from such a server, ever.
    _, acc = await run_body(tgi_stream(done=False), include_usage=include_usage)
    assert (acc.message().text, acc.stop_reason, acc.usage.output_tokens) == ("Hello!", "end_turn", 2)
    _, whole = await run_body(tgi_stream(done=True), include_usage=include_usage)
    assert (acc.message(), acc.stop_reason, acc.usage) == (whole.message(), whole.stop_reason, whole.usage)


async def test_a_tool_call_whose_body_ends_cleanly_after_the_finish_reason_is_complete() -> None:
    call = {"index": 0, "id": "call_1", "type": "function", "function": {"name": "f", "arguments": '{"a": 1}'}}
    body = chat_stream(chat_chunk({"tool_calls": [call]}), chat_chunk(finish="tool_calls"), done=False)
    _, acc = await run_body(body)
    assert acc.stop_reason == "tool_use" and acc.message().tool_uses[0].input == {"a": 1}


@pytest.mark.parametrize(
    "chunks",
    [
        [chat_chunk({"content": "Hel"})],
        [chat_chunk({"tool_calls": [{"index": 0, "id": "c1", "function": {"name": "f", "arguments": '{"a"'}}]})],
        [],
    ],
    ids=["mid-text", "mid-arguments", "nothing"],
)
async def test_a_body_that_ends_before_any_finish_reason_is_still_cut(chunks: list[dict[str, Any]]) -> None:
    with pytest.raises(StreamProtocolError, match=r"\[DONE\]") as info:
        await run_body(chat_stream(*chunks, done=False))
    assert info.value.retryable is True


# -- usage where servers put it ------------------------------------------------------------


async def test_deepseeks_cache_hits_are_the_cache_read_tokens() -> None:
    usage = {"prompt_tokens": 120, "completion_tokens": 8, "total_tokens": 128,
             "prompt_cache_hit_tokens": 100, "prompt_cache_miss_tokens": 20}  # fmt: skip
    body = chat_stream(chat_chunk({"content": "x"}), chat_chunk(finish="stop"), {"id": "c", "choices": [], "usage": usage})
    _, acc = await run_body(body)
    assert (acc.usage.input_tokens, acc.usage.output_tokens, acc.usage.cache_read_tokens) == (120, 8, 100)


@pytest.mark.parametrize("include_usage", [True, False])
async def test_moonshots_usage_in_the_finish_choice_is_read(include_usage: bool) -> None:
    # Without include_usage the run's usage was 0: the only usage was inside the choice.
    last = chat_chunk(finish="stop")
    last["choices"][0]["usage"] = {"prompt_tokens": 30, "completion_tokens": 4, "total_tokens": 34}
    chunks: list[dict[str, Any]] = [chat_chunk({"role": "assistant", "content": "Hi"}), last]
    if include_usage:
        chunks.append({"id": "c", "choices": [], "usage": {"prompt_tokens": 30, "completion_tokens": 4, "total_tokens": 34}})
    _, acc = await run_body(chat_stream(*chunks), include_usage=include_usage)
    assert (acc.usage.input_tokens, acc.usage.output_tokens) == (30, 4)


# -- streams that were already read right (kept so they stay so) ---------------------------


async def test_openrouters_mid_stream_error_is_a_retryable_stream_error() -> None:
    chunk = chat_chunk({"content": ""}, finish="error", provider="openai")
    chunk["error"] = {"code": "server_error", "message": "Provider disconnected unexpectedly"}
    body = chat_stream(chat_chunk({"role": "assistant", "content": "The answer"}), chunk)
    with pytest.raises(ProviderStreamError, match="Provider disconnected unexpectedly") as info:
        await run_body(body)
    assert info.value.retryable is True


async def test_groqs_stream_with_usage_twice_and_kimis_call_ids() -> None:
    usage = {"queue_time": 0.22, "prompt_tokens": 207, "prompt_time": 0.02, "completion_tokens": 58,
             "completion_time": 0.13, "total_tokens": 265, "total_time": 0.15}  # fmt: skip

    def call(index: int, name: str) -> dict[str, Any]:
        return {"id": f"functions.{name}:{index}", "type": "function",
                "function": {"name": name, "arguments": '{"a":2,"b":3}'}, "index": index}  # fmt: skip

    finish = chat_chunk(finish="tool_calls", x_groq={"id": "req_01", "usage": usage}, usage=usage)
    body = chat_stream(
        chat_chunk({"role": "assistant", "content": ""}, x_groq={"id": "req_01"}),
        chat_chunk({"content": "I'll add and multiply."}),
        chat_chunk({"tool_calls": [call(0, "add")]}),
        chat_chunk({"tool_calls": [call(1, "multiply")]}),
        finish,
        {"id": "chatcmpl-1", "choices": [], "usage": usage, "service_tier": "on_demand"},
    )
    _, acc = await run_body(body)
    msg = acc.message()
    assert msg.text == "I'll add and multiply." and acc.stop_reason == "tool_use"
    assert [(t.id, t.name, t.input) for t in msg.tool_uses] == [
        ("functions.add:0", "add", {"a": 2, "b": 3}), ("functions.multiply:1", "multiply", {"a": 2, "b": 3}),
    ]  # fmt: skip
    assert (acc.usage.input_tokens, acc.usage.output_tokens) == (207, 58)


# -- OpenRouter's reasoning_details ----------------------------------------------------------


class OpenRouterGemini:
    """Plays Gemini 3 behind OpenRouter: reasoning, then a call whose thought signature comes as a
    ``reasoning.encrypted`` entry; a request that does not send the details back is refused as
    OpenRouter relays Google's 400."""

    SIGNED = "CiQBjz1rX1Rk+sig=="

    def __init__(self) -> None:
        self.bodies: list[dict[str, Any]] = []

    def handler(self, req: httpx.Request) -> httpx.Response:
        body = json.loads(req.content)
        self.bodies.append(body)
        assistants = [m for m in body["messages"] if m["role"] == "assistant"]
        for m in assistants:
            if m.get("tool_calls") and not any(d.get("data") == self.SIGNED for d in m.get("reasoning_details") or ()):
                raw = "Function call is missing a thought_signature in functionCall parts."
                error = {"error": {"message": "Provider returned error", "code": 400,
                                   "metadata": {"raw": raw, "provider_name": "Google AI Studio"}}}  # fmt: skip
                return httpx.Response(400, json=error)
        if not assistants:
            text = {"type": "reasoning.text", "format": "google-gemini-v1", "index": 0}
            call = {"index": 0, "id": "tool_0_weather", "type": "function",
                    "function": {"name": "weather", "arguments": '{"city": "Paris"}'}}  # fmt: skip
            encrypted = {"type": "reasoning.encrypted", "data": self.SIGNED, "id": "tool_0_weather",
                         "format": "google-gemini-v1", "index": 0}  # fmt: skip
            chunks = [
                chat_chunk({"role": "assistant", "content": "", "reasoning": "Paris first.",
                            "reasoning_details": [{**text, "text": "Paris first."}]}),
                chat_chunk({"reasoning": " One call.", "reasoning_details": [{**text, "text": " One call."}]}),
                chat_chunk({"tool_calls": [call], "reasoning_details": [encrypted]}),
                chat_chunk(finish="tool_calls"),
                {"id": "gen-1", "choices": [], "usage": {"prompt_tokens": 20, "completion_tokens": 9}},
            ]
        else:
            chunks = [chat_chunk({"role": "assistant", "content": "Sunny."}), chat_chunk(finish="stop")]
        return httpx.Response(200, headers={"content-type": "text/event-stream"}, content=chat_stream(*chunks))


async def test_a_tool_loop_over_openrouter_sends_the_reasoning_details_back_and_completes() -> None:
    # They were dropped, and the request after a tool call was refused, every time.
    server = OpenRouterGemini()
    engine = await _weather_loop(server.handler, "google/gemini-3-flash-preview", "https://openrouter.ai/api/v1", "weather in Paris?")
    assert engine.messages[-1].text == "Sunny." and len(server.bodies) == 2
    (sent,) = [m for m in server.bodies[-1]["messages"] if m["role"] == "assistant"]
    assert sent["reasoning_details"] == [
        {"type": "reasoning.text", "format": "google-gemini-v1", "index": 0, "text": "Paris first. One call."},
        {"type": "reasoning.encrypted", "data": OpenRouterGemini.SIGNED, "id": "tool_0_weather",
         "format": "google-gemini-v1", "index": 0},
    ]  # fmt: skip
    assert "reasoning_content" not in sent and "reasoning" not in sent
    assert validate_transcript(engine.messages) == []


async def test_claudes_signed_reasoning_text_pieces_are_joined_and_keep_their_signature() -> None:
    def piece(text: str, **more: Any) -> dict[str, Any]:
        detail = {"type": "reasoning.text", "text": text, "format": "anthropic-claude-v1", "index": 0, **more}
        return chat_chunk({"reasoning": text, "reasoning_details": [detail]})

    body = chat_stream(piece("Let me "), piece("think."), piece("", signature="EqQBCkYIsig=="),
                       chat_chunk({"content": "Done."}), chat_chunk(finish="stop"))  # fmt: skip
    server = MockServer(body)
    async with server.client() as client:
        model = OpenAIChatModel("anthropic/claude-sonnet-4.5", api_key=API_KEY, http_client=client,
                                base_url="https://openrouter.ai/api/v1")  # fmt: skip
        _, acc = await collect(model)
    msg = acc.message()
    assert msg.text == "Done."
    history = request(Message.user("hi"), msg, Message.user("and?"))
    wire = openai_chat.build_request(history, model="m", host="openrouter.ai", origin="https://openrouter.ai/api/v1")
    (sent,) = [m for m in wire["messages"] if m["role"] == "assistant"]
    assert sent["reasoning_details"] == [{"type": "reasoning.text", "text": "Let me think.", "format": "anthropic-claude-v1",
                                          "index": 0, "signature": "EqQBCkYIsig=="}]  # fmt: skip
    for other in (openai_chat.build_request(history, model="m", host="api.mistral.ai", origin="https://api.mistral.ai/v1"),
                  anthropic.build_request(history, model="m", max_tokens=64, thinking=None),
                  openai_responses.build_request(history, model="m")):  # fmt: skip
        assert "EqQBCkYIsig==" not in json.dumps(other) and "reasoning_details" not in json.dumps(other)


# -- what a server asked to have back goes back to that server only (its origin) ------------

#: An assistant turn as a session file held it before the server was kept as the blocks'
#: `origin`: made by `OpenAIChatModel(base_url="http://gw.test:8001/v1", echo_reasoning=True)`,
#: its reasoning kept, OpenRouter's reasoning_details and Gemini's extra_content each in a
#: block whose JSON signature names the host only.
HOST_ONLY_LINE = (
    r'{"type":"message","message":{"role":"assistant","content":[{"type":"thinking","thinking":"Oslo first.",'
    r'"signature":"{\"type\":\"reasoning_content\"}"},{"type":"tool_use","id":"call_1","name":"weather",'
    r'"input":{"city":"Oslo"},"complete":true,"input_error":null},{"type":"thinking","thinking":"",'
    r'"signature":"{\"type\":\"extra_content\",\"call\":\"call_1\",\"host\":\"gw.test\",\"extra_content\":'
    r'{\"google\":{\"thought_signature\":\"R2VtaW5pU2ln\"}}}"},{"type":"thinking","thinking":"",'
    r'"signature":"{\"type\":\"reasoning_details\",\"host\":\"gw.test\",\"reasoning_details\":'
    r'[{\"type\":\"reasoning.encrypted\",\"data\":\"T1JzaWc=\",\"format\":\"google-gemini-v1\",\"index\":0}]}"}],'
    r'"partial":false,"synthetic":false,"kind":null,"meta":{}}}'
)


def _kept_turn_stream() -> bytes:
    call = gemini_call("call_1", "Oslo", "R2VtaW5pU2ln")
    details = [{"type": "reasoning.encrypted", "data": "T1JzaWc=", "format": "google-gemini-v1", "index": 0}]
    return chat_stream(chat_chunk({"reasoning_content": "Oslo first."}), chat_chunk({"reasoning_details": details}),
                       chat_chunk({"tool_calls": [call]}), chat_chunk(finish="tool_calls"))  # fmt: skip


async def _sent_assistant(history: Any, base_url: str) -> dict[str, Any]:
    """The assistant message of the request `OpenAIChatModel` at ``base_url`` sends for ``history``."""
    server = MockServer(chat_stream(chat_chunk({"content": "Snow."}), chat_chunk(finish="stop")))
    async with server.client() as client:
        model = OpenAIChatModel("m", api_key=API_KEY, base_url=base_url, http_client=client, echo_reasoning=True)
        await collect(model, history)
    (sent,) = [m for m in server.body["messages"] if m["role"] == "assistant"]
    return sent


def _kept_parts(sent: dict[str, Any]) -> tuple[Any, Any, Any]:
    return sent.get("reasoning_content"), sent["tool_calls"][0].get("extra_content"), sent.get("reasoning_details")


KEPT_PARTS = ("Oslo first.", {"google": {"thought_signature": "R2VtaW5pU2ln"}},
              [{"type": "reasoning.encrypted", "data": "T1JzaWc=", "format": "google-gemini-v1", "index": 0}])  # fmt: skip


@pytest.mark.parametrize(
    ("base_url", "kept"),
    [("http://gw.test:8001/v1", True), ("https://gw.test/v1", True), ("http://gw.test:9000/other", True),
     ("http://other.test:8001/v1", False)],
    ids=["same-server", "same-host-other-scheme", "same-host-other-port", "other-host"],
)  # fmt: skip
async def test_a_session_saved_with_the_host_only_replays_as_it_did(tmp_path: Any, base_url: str, kept: bool) -> None:
    # Such blocks have no origin: the host in their JSON decides, as it did when they were saved.
    path = tmp_path / "s.jsonl"
    result = Message(role="user", content=[ToolResultBlock(tool_use_id="call_1", content="snow")])
    lines = [json.dumps({"type": "message", "message": Message.user("weather?").model_dump(mode="json")}),
             HOST_ONLY_LINE, json.dumps({"type": "message", "message": result.model_dump(mode="json")})]  # fmt: skip
    path.write_text("\n".join(lines) + "\n", encoding="utf-8")
    loaded = JsonlSession(path).load()
    assert loaded.repairs == [] and loaded.warnings == []
    assert [getattr(b, "origin", "-") for b in loaded.messages[1].content] == [None, "-", None, None]
    sent = await _sent_assistant(request(*loaded.messages), base_url)
    assert _kept_parts(sent) == (KEPT_PARTS if kept else ("Oslo first.", None, None))


@pytest.mark.parametrize(
    ("base_url", "kept"),
    [("http://gw.test:8001/v1", True), ("HTTP://GW.test:8001/v1/", True), ("https://gw.test:8001/v1", False),
     ("http://gw.test:8002/v1", False), ("http://other.test:8001/v1", False)],
    ids=["same-server", "same-server-spelt-otherwise", "other-scheme", "other-port", "other-host"],
)  # fmt: skip
async def test_what_a_server_asked_back_goes_back_to_its_origin_only(base_url: str, kept: bool) -> None:
    # Two gateways on one host name, on two ports (or http and https), are two servers, as they are
    # for the Anthropic and Responses providers: the blocks record `origin_of(base_url)` (scheme,
    # host, port and path), and their JSON no longer names a host. The reasoning text itself is sent as plain text to any server.
    server = MockServer(_kept_turn_stream())
    async with server.client() as client:
        model = OpenAIChatModel("g", api_key=API_KEY, base_url="http://gw.test:8001/v1", http_client=client,
                                echo_reasoning=True)  # fmt: skip
        _, acc = await collect(model)
    made = acc.message()
    thinking = [b for b in made.content if isinstance(b, ThinkingBlock)]
    assert [b.origin for b in thinking] == ["http://gw.test:8001/v1"] * 3
    assert not any('"host"' in b.signature for b in thinking)
    result = Message(role="user", content=[ToolResultBlock(tool_use_id="call_1", content="snow")])
    sent = await _sent_assistant(request(Message.user("weather?"), made, result), base_url)
    assert _kept_parts(sent) == (KEPT_PARTS if kept else ("Oslo first.", None, None))
