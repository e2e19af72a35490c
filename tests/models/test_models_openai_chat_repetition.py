"""vLLM's ``finish_reason: "repetition"`` (``repetition_detection``): the server's own doom-loop
verdict, judged by the doom-loop policies and resampled with the doom budget (SPEC §6)."""

from __future__ import annotations

import json
from collections.abc import Callable
from typing import Any

import httpx
import pytest
from _models_support import API_KEY, chat_chunk, chat_stream, collect
from _models_support import MockServer as Server

from agentloop import (
    AssistantMessage,
    DoomLoopDetected,
    DoomLoopSignal,
    Event,
    QueryEngine,
    Resampling,
    Retrying,
    ToolCallFinished,
    TurnEnded,
    tool,
    validate_transcript,
)
from agentloop.models import OpenAIChatModel, StreamEnd, StreamSignals
from agentloop.policies import ConservativeDoomLoopPolicy, DoomLoopPolicy

# -- the signal -------------------------------------------------------------------------


def test_a_tail_repetition_without_a_period_parses_and_formats() -> None:
    signal = DoomLoopSignal.parse("tail_repetition@text")
    assert (signal.kind, signal.channel, signal.threshold, signal.stopped) == ("tail_repetition", "text", None, False)
    assert signal.format() == "tail_repetition@text"
    assert DoomLoopSignal.parse("tail_repetition:32@thinking").format() == "tail_repetition:32@thinking"


@pytest.mark.parametrize("channel", ["text", "thinking"])
def test_the_conservative_policy_is_confident_when_the_server_stopped_the_stream(channel: str) -> None:
    policy = ConservativeDoomLoopPolicy()
    assert policy.judge(DoomLoopSignal("tail_repetition", channel, stopped=True)) == "abort"
    assert policy.judge(DoomLoopSignal("tail_repetition", channel)) == "warn"  # no period, no stop: unsure


# -- the mapper ---------------------------------------------------------------------------


def call(args: str) -> dict[str, Any]:
    return {"tool_calls": [{"index": 0, "id": "call_1", "type": "function",
                            "function": {"name": "write", "arguments": args}}]}  # fmt: skip


@pytest.mark.parametrize(
    ("deltas", "channel"),
    [
        ([{"content": "so so so"}], "text"),
        ([{"content": "Plan:"}, {"reasoning_content": "wait wait wait"}], "thinking"),
        ([{"reasoning_content": "ok"}, call('{"text": "aaaa')], "text"),
    ],
)
async def test_finish_reason_repetition_is_a_server_signal_on_the_channel_that_was_streaming(
    deltas: list[dict[str, Any]], channel: str
) -> None:
    body = chat_stream(*(chat_chunk(d) for d in deltas), chat_chunk(finish="repetition"))
    server = Server(body)
    async with server.client() as client:
        events, acc = await collect(OpenAIChatModel("m", api_key=API_KEY, http_client=client))
    signals = [e for e in events if isinstance(e, StreamSignals)]
    assert signals == [StreamSignals((f"tail_repetition@{channel}",), stopped=True)]
    assert events.index(signals[0]) < len(events) - 1 and isinstance(events[-1], StreamEnd)
    assert acc.stop_reason == "repetition"


def _vllm_finish(finish: str, stop_reason: str | int | None) -> dict[str, Any]:
    """vLLM's finish chunk as its chat serving writes it: the engine's ``stop_reason`` beside
    ``finish_reason``, then the final usage chunk (vllm/v1/core/sched/utils.py sets
    ``FINISHED_REPETITION`` with ``stop_reason="repetition_detected"``)."""
    choice = {"index": 0, "delta": {"content": ""}, "logprobs": None, "finish_reason": finish,
              "stop_reason": stop_reason}  # fmt: skip
    return {"id": "chatcmpl-v", "object": "chat.completion.chunk", "model": "m", "choices": [choice]}


@pytest.mark.parametrize(
    ("finish", "stop_reason", "stop", "signalled"),
    [
        ("repetition", "repetition_detected", "repetition", True),
        ("stop", None, "end_turn", False),  # EOS
        ("stop", "###", "end_turn", False),  # a stop string of the request
        ("stop", 128009, "end_turn", False),  # a stop token id
    ],
)
async def test_vllm_finish_chunks_as_sent_with_their_stop_reason(
    finish: str, stop_reason: str | int | None, stop: str, signalled: bool
) -> None:
    usage = {"id": "chatcmpl-v", "object": "chat.completion.chunk", "model": "m", "choices": [],
             "usage": {"prompt_tokens": 4, "completion_tokens": 40, "total_tokens": 44}}  # fmt: skip
    body = chat_stream(
        chat_chunk({"role": "assistant", "content": ""}),
        chat_chunk({"content": "la la la la"}),
        _vllm_finish(finish, stop_reason),
        usage,
    )
    server = Server(body)
    async with server.client() as client:
        events, acc = await collect(OpenAIChatModel("m", api_key=API_KEY, http_client=client))
    assert acc.stop_reason == stop and acc.message().text == "la la la la"
    signals = [e for e in events if isinstance(e, StreamSignals)]
    assert signals == ([StreamSignals(("tail_repetition@text",), stopped=True)] if signalled else [])


# -- end to end ----------------------------------------------------------------------------

CHANT = "wait, "


def looping(kind: str = "reasoning_content") -> list[dict[str, Any]]:
    return [chat_chunk({"role": "assistant", kind: "Let me see. "}), chat_chunk({kind: CHANT * 4}),
            chat_chunk(finish="repetition")]  # fmt: skip


def answer(text: str) -> list[dict[str, Any]]:
    return [chat_chunk({"role": "assistant", "content": text}), chat_chunk(finish="stop")]


class VLLM:
    """A vLLM server whose replies are given per request number."""

    def __init__(self, reply: Callable[[int, dict[str, Any]], list[dict[str, Any]]]) -> None:
        self.reply = reply
        self.bodies: list[dict[str, Any]] = []

    def handler(self, req: httpx.Request) -> httpx.Response:
        body = json.loads(req.content)
        self.bodies.append(body)
        chunks = self.reply(len(self.bodies) - 1, body)
        return httpx.Response(200, headers={"content-type": "text/event-stream"}, content=chat_stream(*chunks))


written: list[dict[str, Any]] = []


@tool
async def write(text: str) -> str:
    """Write a text."""
    written.append({"text": text})
    return "written"


async def run(server: VLLM, **kw: Any) -> tuple[QueryEngine, list[Event]]:
    kw.setdefault("retry_base_delay", 0.001)
    async with httpx.AsyncClient(transport=httpx.MockTransport(server.handler)) as client:
        model = OpenAIChatModel("qwen3", base_url="http://vllm.local/v1", http_client=client)
        engine = QueryEngine(model, tools=[write], **kw)
        events = [e async for e in engine.run("write the essay")]
    return engine, events


async def test_a_repetition_stop_is_resampled_with_the_doom_budget_and_the_reminder() -> None:
    server = VLLM(lambda n, _: looping() if n == 0 else answer("The essay."))
    engine, events = await run(server, retry_budget=0)  # default policies; no transport retry to spend
    (detected,) = [e for e in events if isinstance(e, DoomLoopDetected)]
    assert detected.confident and detected.action == "resample"
    (signal,) = detected.signals
    assert (signal.kind, signal.channel, signal.source, signal.stopped) == ("tail_repetition", "thinking", "server", True)
    assert [e.attempt for e in events if isinstance(e, Resampling)] == [1]
    assert not [e for e in events if isinstance(e, Retrying)]
    reminder = server.bodies[1]["messages"][-1]
    assert reminder["role"] == "user" and "judged to be a repetition loop" in reminder["content"]
    assert "tail_repetition@thinking" in reminder["content"]
    assert [m.text for m in engine.messages] == ["write the essay", "The essay."]
    assert events[-1] == engine.last_turn_ended and engine.last_turn_ended.reason == "completed"


async def test_when_the_doom_budget_is_spent_the_looped_text_is_accepted() -> None:
    server = VLLM(lambda n, _: looping("content"))
    engine, events = await run(server, doom_budget=2, retry_budget=3)
    assert len(server.bodies) == 3  # two resamples, then accepted; no transport retry spent
    assert [d.action for d in events if isinstance(d, DoomLoopDetected)] == ["resample", "resample", "disarmed"]
    assert not [e for e in events if isinstance(e, Retrying)]
    (accepted,) = [e for e in events if isinstance(e, AssistantMessage)]
    assert accepted.stop_reason == "repetition" and accepted.message.text == "Let me see. " + (CHANT * 4).rstrip()
    ended = events[-1]
    assert isinstance(ended, TurnEnded) and ended.reason == "completed"
    assert validate_transcript(engine.messages) == []


async def test_an_accepted_repetition_stop_does_not_run_a_tool_call_it_cut() -> None:
    written.clear()

    def reply(n: int, body: dict[str, Any]) -> list[dict[str, Any]]:
        if n < 2:
            return [chat_chunk(call('{"text": "' + "la " * 8)), chat_chunk(finish="repetition")]
        return answer("Sorry, let me be brief.")

    engine, events = await run(server := VLLM(reply), doom_budget=1)
    assert len(server.bodies) == 3 and written == []
    (finished,) = [e for e in events if isinstance(e, ToolCallFinished)]
    assert finished.result.is_error and "incomplete" in finished.result.text and "repetition" in finished.result.text
    tool_message = next(m for m in server.bodies[2]["messages"] if m["role"] == "tool")
    assert tool_message["content"].startswith("Error")
    assert engine.last_turn_ended is not None and engine.last_turn_ended.reason == "completed"
    assert validate_transcript(engine.messages) == []


async def test_a_host_policy_that_only_warns_keeps_the_stopped_answer() -> None:
    server = VLLM(lambda n, _: looping("content"))
    engine, events = await run(server, policies=[DoomLoopPolicy(client_detector=False)])
    assert len(server.bodies) == 1
    (detected,) = [e for e in events if isinstance(e, DoomLoopDetected)]
    assert not detected.confident and detected.action == "warn" and detected.signals[0].stopped
    assert engine.messages[-1].text.startswith("Let me see.")
