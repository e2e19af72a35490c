"""A headless host built from the docs alone: a batch worker and a small service.

Each test is one thing such a host does (many engines over one HTTP client, subagents, an MCP
server's tools, a policy of its own, exit codes, limits, client cancels, follow-ups, events as
JSON), and checks what the docs promise after every job: a valid transcript, the promised
terminal, usage that adds up, and nothing left running or open.
"""

from __future__ import annotations

import asyncio
import json
import sys
from collections.abc import AsyncIterator, Callable, Sequence
from pathlib import Path
from typing import Any

import httpx
import pytest

from agentloop import (
    Event,
    Message,
    QueryEngine,
    ScriptedModel,
    ScriptedResponse,
    ScriptedToolCall,
    TextDelta,
    ToolCallStarted,
    ToolContext,
    ToolResultBlock,
    TurnEnded,
    delegate_tool,
    event_json,
    tool,
    validate_transcript,
)
from agentloop.models import OpenAIChatModel
from agentloop.policies import EndTurn, IdenticalToolCallRun, Nudge, Policy, default_policies
from tests.helpers import EXIT

# ---------------------------------------------------------------------------------------------
# A Chat Completions server played by an httpx.MockTransport, its streams shaped like the
# recorded ones (a role chunk, content or tool-call deltas, a finish chunk, a usage chunk).


def chunk(delta: dict[str, Any] | None, finish: str | None = None, usage: dict[str, int] | None = None) -> str:
    body: dict[str, Any] = {"id": "chatcmpl-host", "object": "chat.completion.chunk", "model": "m"}
    body["choices"] = [] if delta is None else [{"index": 0, "delta": delta, "logprobs": None, "finish_reason": finish}]
    if usage is not None:
        body["usage"] = usage
    return f"data: {json.dumps(body)}\n\n"


def text_stream(text: str, *, prompt: int, completion: int, reasoning: str | None = None) -> list[str]:
    events = [chunk({"role": "assistant", "content": ""})]
    if reasoning is not None:
        events.append(chunk({"reasoning_content": reasoning}))
    events += [chunk({"content": piece}) for piece in text.split(" ")[:1] + [" " + w for w in text.split(" ")[1:]]]
    events.append(chunk({}, "stop"))
    events.append(chunk(None, usage={"prompt_tokens": prompt, "completion_tokens": completion, "total_tokens": prompt + completion}))
    return [*events, "data: [DONE]\n\n"]


def tool_stream(call_id: str, name: str, args: dict[str, Any], *, prompt: int, completion: int, reasoning: str | None = None) -> list[str]:
    raw = json.dumps(args)
    events = [chunk({"role": "assistant", "content": None})]
    if reasoning is not None:
        events.append(chunk({"reasoning_content": reasoning}))
    events.append(chunk({"tool_calls": [{"index": 0, "id": call_id, "type": "function", "function": {"name": name, "arguments": ""}}]}))
    events += [chunk({"tool_calls": [{"index": 0, "function": {"arguments": raw[i : i + 5]}}]}) for i in range(0, len(raw), 5)]
    events.append(chunk({}, "tool_calls"))
    events.append(chunk(None, usage={"prompt_tokens": prompt, "completion_tokens": completion, "total_tokens": prompt + completion}))
    return [*events, "data: [DONE]\n\n"]


class Stalled(list[str]):
    """A stream that stalls after its first two events until the server's gate is set."""


class Body(httpx.AsyncByteStream):
    """A streamed response body that records whether it was closed, and can wait before a chunk."""

    def __init__(self, events: Sequence[str], server: Server, gate: asyncio.Event | None = None) -> None:
        self.events, self.server, self.gate = events, server, gate
        self.closed = False
        server.open_bodies.add(self)

    async def __aiter__(self) -> AsyncIterator[bytes]:
        for i, event in enumerate(self.events):
            if self.gate is not None and isinstance(self.events, Stalled) and i == 2:
                self.server.waiting.set()
                await self.gate.wait()  # the stream stalls here until the test lets it go
            yield event.encode()

    async def aclose(self) -> None:
        self.closed = True
        self.server.open_bodies.discard(self)


class Server:
    """Plays an OpenAI-compatible server: a handler turns each request body into a stream."""

    def __init__(self, respond: Callable[[httpx.Request, dict[str, Any]], list[str]], gate: asyncio.Event | None = None) -> None:
        self.respond, self.gate = respond, gate
        self.requests: list[tuple[httpx.Request, dict[str, Any]]] = []
        self.open_bodies: set[Body] = set()
        self.waiting = asyncio.Event()

    async def __call__(self, request: httpx.Request) -> httpx.Response:
        body = json.loads(request.content)
        self.requests.append((request, body))
        stream = Body(self.respond(request, body), self, self.gate)
        return httpx.Response(200, headers={"content-type": "text/event-stream"}, stream=stream)

    def client(self) -> httpx.AsyncClient:
        return httpx.AsyncClient(transport=httpx.MockTransport(self))


def check_job(engine: QueryEngine, end: TurnEnded | None, reason: str) -> TurnEnded:
    """What every job must leave: its promised terminal and a valid transcript."""
    assert end is not None and end.agent_id is None
    assert end.reason == reason, (end.reason, end.error, end.detail)
    assert validate_transcript(engine.messages) == []
    assert not engine.running
    return end


async def drive(engine: QueryEngine, prompt: str | None = None) -> tuple[list[Event], TurnEnded | None]:
    events = [event async for event in engine.run(prompt)]
    ends = [e for e in events if isinstance(e, TurnEnded) and e.agent_id is None]
    return events, (ends[-1] if ends else None)


@tool(concurrency_safe=True)
async def lookup(city: str) -> str:
    """Look up the weather of a city."""
    return f"{city}: sunny, 21 C"


# ---------------------------------------------------------------------------------------------
# A batch worker: 50 engines at once in one event loop, over one HTTP client.


def weather_server(request: httpx.Request, body: dict[str, Any]) -> list[str]:
    last = body["messages"][-1]
    if last["role"] == "tool":  # the tool answered: the final text
        return text_stream(f"It is {last['content']}.", prompt=30, completion=7)
    city = last["content"].removeprefix("Weather in ")
    return tool_stream(f"call_{city}", "lookup", {"city": city}, prompt=20, completion=5)


async def test_fifty_engines_share_one_client_and_each_job_adds_up() -> None:
    server = Server(weather_server)
    async with server.client() as client:
        model = OpenAIChatModel("gpt-4o", api_key="sk-test", http_client=client)

        async def job(n: int) -> tuple[QueryEngine, TurnEnded | None]:
            engine = QueryEngine(model, tools=[lookup], max_turns=5, deadline=30, usage_limit=10_000)
            _, end = await drive(engine, f"Weather in city{n}")
            return engine, end

        results = await asyncio.gather(*(job(n) for n in range(50)))
    for n, (engine, end) in enumerate(results):
        done = check_job(engine, end, "completed")
        assert engine.messages[-1].text == f"It is city{n}: sunny, 21 C."
        assert (done.turns, done.usage.input_tokens, done.usage.output_tokens) == (2, 50, 12)
    assert len(server.requests) == 100
    assert not server.open_bodies  # every response was closed
    assert all(r.url == "https://api.openai.com/v1/chat/completions" for r, _ in server.requests)
    assert all(r.headers["authorization"] == "Bearer sk-test" for r, _ in server.requests)


# ---------------------------------------------------------------------------------------------
# OpenAI-compatible endpoints with their documented options: DeepSeek (echo_reasoning, on for
# its host) and Mistral (short_tool_ids, on for its host; max_tokens, not max_completion_tokens).


def thinking_server(request: httpx.Request, body: dict[str, Any]) -> list[str]:
    last = body["messages"][-1]
    if last["role"] == "tool":
        return text_stream("Done.", prompt=40, completion=3, reasoning="It answered.")
    return tool_stream("call_0123456789abcdefghijklmnopqrstuvwxyz_long", "lookup", {"city": "Oslo"},
                       prompt=25, completion=9, reasoning="I should look it up.")


@pytest.mark.parametrize(
    ("base_url", "host"),
    [("https://api.deepseek.com/v1", "deepseek"), ("https://api.mistral.ai/v1", "mistral")],
)
async def test_compatible_endpoints_get_what_their_quirks_need(base_url: str, host: str) -> None:
    server = Server(thinking_server)
    async with server.client() as client:
        model = OpenAIChatModel("m", base_url=base_url, api_key="k", http_client=client)
        engine = QueryEngine(model, tools=[lookup], max_tokens=1000)
        _, end = await drive(engine, "Weather in Oslo")
    done = check_job(engine, end, "completed")
    assert done.usage.total == 25 + 9 + 40 + 3
    assert not server.open_bodies
    (_, first), (_, second) = server.requests
    assert "max_tokens" in first and "max_completion_tokens" not in first
    assistant = next(m for m in second["messages"] if m["role"] == "assistant")
    tool_msg = next(m for m in second["messages"] if m["role"] == "tool")
    wire_id = assistant["tool_calls"][0]["id"]
    assert tool_msg["tool_call_id"] == wire_id
    if host == "deepseek":
        assert model.echo_reasoning and assistant["reasoning_content"] == "I should look it up."
    else:
        assert model.short_tool_ids and len(wire_id) == 9 and wire_id.isalnum()
        assert "reasoning_content" not in assistant
    # The transcript keeps the id the server sent.
    assert engine.messages[1].tool_uses[0].id == "call_0123456789abcdefghijklmnopqrstuvwxyz_long"


# ---------------------------------------------------------------------------------------------
# Subagents: a parent delegates, the tree's usage is the parent's, a parent interrupt stops a child.


def used(total_in: int, total_out: int) -> Any:
    from agentloop import Usage

    return Usage(input_tokens=total_in, output_tokens=total_out)


def weather_desk(request: Any) -> ScriptedResponse:
    """One scripted model for the whole tree: it answers by what the request holds, since the
    children of one response run at once and their requests come in any order."""
    first, last = request.messages[0], request.messages[-1]
    if first.text == "Compare Oslo and Rome":  # the parent
        if last.tool_results:
            return ScriptedResponse(text="Both are sunny.", usage=used(200, 5))
        calls = [ScriptedToolCall("task", {"task": f"Weather in {c}?"}) for c in ("Oslo", "Rome")]
        return ScriptedResponse(tool_calls=calls, usage=used(100, 10))
    city = first.text.removeprefix("Weather in ").rstrip("?")
    if last.tool_results:
        return ScriptedResponse(text=f"{city} is sunny.", usage=used(30, 3))
    return ScriptedResponse(tool_calls=[ScriptedToolCall("lookup", {"city": city})], usage=used(20, 2))


async def test_a_parent_delegates_and_is_charged_for_its_children() -> None:
    model = ScriptedModel([weather_desk], cycle=True)
    engine = QueryEngine(model, tools=[lookup, delegate_tool(max_turns=4)], usage_limit=10_000)
    events, end = await drive(engine, "Compare Oslo and Rome")
    done = check_job(engine, end, "completed")
    child_ends = [e for e in events if isinstance(e, TurnEnded) and e.agent_id is not None]
    assert sorted(e.agent_id or "" for e in child_ends) == ["sub-1", "sub-2"]
    assert all(e.reason == "completed" and e.usage.total == 55 for e in child_ends)
    # The parent's usage is the whole tree's: its own two responses and both children's.
    assert (done.usage.input_tokens, done.usage.output_tokens) == (100 + 200 + 2 * 50, 10 + 5 + 2 * 5)
    assert [r.text for r in engine.messages[2].tool_results] == ["Oslo is sunny.", "Rome is sunny."]
    assert engine.messages[-1].text == "Both are sunny."
    assert model.request_count == 6


def delegating_server(request: httpx.Request, body: dict[str, Any]) -> list[str]:
    """The parent delegates; the child's answer stalls after its first words (see the gate)."""
    first, last = body["messages"][1], body["messages"][-1]  # [0] is the system prompt
    if first["content"] == "Summarise the repo":
        assert last["role"] == "user"  # the parent never gets a second request: it was interrupted
        return tool_stream("call_task", "task", {"task": "Summarise."}, prompt=10, completion=1)
    return Stalled(text_stream("The repository holds many things.", prompt=7, completion=7))


async def test_the_parents_interrupt_stops_a_streaming_child() -> None:
    gate = asyncio.Event()  # never set: the child's stream stalls mid-answer
    server = Server(delegating_server, gate)
    async with server.client() as client:
        model = OpenAIChatModel("gpt-4o", api_key="k", http_client=client)
        engine = QueryEngine(model, tools=[delegate_tool()], system="Be brief.")
        child_end: list[TurnEnded] = []
        end: TurnEnded | None = None
        async for event in engine.run("Summarise the repo"):
            if isinstance(event, TextDelta) and event.agent_id == "sub-1":
                engine.interrupt("cancel")
            if isinstance(event, TurnEnded):
                if event.agent_id is None:
                    end = event
                else:
                    child_end.append(event)
    done = check_job(engine, end, "aborted_tools")
    assert done.abort_reason == "cancel" and done.aborted_subagents == ("sub-1",)
    assert [(e.reason, e.abort_reason) for e in child_end] == [("aborted_streaming", "cancel")]
    result = engine.messages[2].tool_results[0]
    assert result.is_error and result.text.startswith("Interrupted by user")
    assert engine.messages[-1].kind == "interrupt_notice"
    # The parent's one response was billed to it; the child's cut stream reported none.
    assert done.usage.total == 11
    assert len(server.requests) == 2 and not server.open_bodies


# ---------------------------------------------------------------------------------------------
# An MCP server's tools, shared by a parent and its subagent; a main interrupt resets the server.

MCP_SERVER = str(Path(__file__).with_name("mcp_server.py"))


def mcp_desk(names: dict[str, str]) -> Callable[[Any], ScriptedResponse]:
    """The model of the MCP jobs; ``names`` maps the server's tool names to the offered ones."""

    def answer(request: Any) -> ScriptedResponse:
        last = request.messages[-1]
        first = next(m.text for m in reversed(request.messages) if m.role == "user" and not m.tool_results)
        if last.tool_results:
            return ScriptedResponse(text="Results: " + "; ".join(r.text for r in last.tool_results))
        if first == "Add and read":
            return ScriptedResponse(tool_calls=[
                ScriptedToolCall(names["add"], {"a": 2, "b": 3}),
                ScriptedToolCall(names["notes.read"], {"title": "plan"}),
                ScriptedToolCall("task", {"task": "Which process serves you?"}),
            ])
        if first == "Which process serves you?":  # the subagent
            return ScriptedResponse(tool_calls=[ScriptedToolCall(names["pid"], {})])
        if first == "Wait":
            return ScriptedResponse(tool_calls=[ScriptedToolCall(names["slow"], {"seconds": 60})])
        return ScriptedResponse(tool_calls=[ScriptedToolCall(names["pid"], {})])

    return answer


async def test_mcp_tools_serve_parent_and_child_and_an_interrupt_resets_the_server(tmp_path: Path) -> None:
    async with MCPServer_stdio(tmp_path) as server:
        tools = await server.list_tools()
        names = {t.name.removeprefix("t_"): t.name for t in tools}
        # A name the providers refuse is offered as its allowed characters plus a hash.
        names["notes.read"] = next(n for n in names.values() if n.startswith("t_notes_read_"))
        engine = QueryEngine(ScriptedModel([mcp_desk(names)], cycle=True), tools=[*tools, delegate_tool()])
        server.attach(engine)

        _, end = await drive(engine, "Add and read")
        check_job(engine, end, "completed")
        add, note, child = engine.messages[2].tool_results
        assert (add.text, note.text, add.is_error, note.is_error) == ("5", "notes of plan", False, False)
        first_pid = int(child.text.removeprefix("Results: "))

        async for event in engine.run("Wait"):
            if isinstance(event, ToolCallStarted) and event.tool_use.name == names["slow"]:
                engine.interrupt("cancel")
            if isinstance(event, TurnEnded):
                end = event
        check_job(engine, end, "aborted_tools")
        assert engine.messages[-2].tool_results[0].text.startswith("Interrupted by user")

        _, end = await drive(engine, "Which process now?")
        check_job(engine, end, "completed")
        # The main interrupt reset the connection: a new server process answers.
        assert int(engine.messages[-1].text.removeprefix("Results: ")) != first_pid
    # Leaving `async with` stopped the server (the test fixtures check no process is left).


def MCPServer_stdio(markers: Path) -> Any:
    from agentloop.mcp import MCPServer

    return MCPServer.stdio(sys.executable, [MCP_SERVER, "--markers", str(markers)], prefix="t_", timeout=30)


# ---------------------------------------------------------------------------------------------
# A headless job: a policy of its own composed with the stock ones, limits, and exit codes.

class IgnoreTimeouts(IdenticalToolCallRun):
    """Calls that differ only in their ``timeout`` are one call (policies.md, Writing your own)."""

    def key(self, call: Any, result: Any) -> Any:
        args = {k: v for k, v in call.input.items() if k != "timeout"}
        return super().key(call.model_copy(update={"input": args}), result)


class NoSecrets(Policy):
    """Ends the turn when a tool's result holds what looks like a credential."""

    def on_results(self, message: Message, results: Sequence[ToolResultBlock]) -> Nudge | EndTurn | None:
        if any("BEGIN PRIVATE KEY" in r.text for r in results):
            return EndTurn("Stopped: a tool returned a private key.", reason="hook_stopped")
        return None


released = asyncio.Event()


@tool
async def shell(command: str, timeout: int = 60) -> str:  # noqa: ASYNC109  # the model's argument
    """Run a shell command."""
    if command == "wait":
        await released.wait()  # a command that never finishes on its own
    if command == "cat key.pem":
        return "-----BEGIN PRIVATE KEY-----"
    return "still building"


def job_policies() -> list[Policy]:
    stock = [p for p in default_policies() if not isinstance(p, IdenticalToolCallRun)]
    return [*stock, IgnoreTimeouts(nudge_at=3, end_at=5), NoSecrets()]


async def headless(model: Any, prompt: str, **limits: Any) -> tuple[int, QueryEngine, TurnEnded]:
    engine = QueryEngine(model, tools=[shell], policies=job_policies(), **limits)
    _, end = await drive(engine, prompt)
    assert end is not None
    return EXIT[end.reason], engine, check_job(engine, end, end.reason)


def calls(*inputs: dict[str, Any], usage: Any = None) -> ScriptedModel:
    extra = {} if usage is None else {"usage": usage}
    return ScriptedModel([ScriptedResponse(tool_calls=[ScriptedToolCall("shell", i)], **extra) for i in inputs], cycle=True)


async def test_headless_exit_codes_follow_the_terminals() -> None:
    code, engine, end = await headless(ScriptedModel(["All done."]), "Build")
    assert (code, engine.messages[-1].text) == (0, "All done.")

    # The model varies only the timeout: the custom key sees one call, ended at the 5th.
    polls = calls({"command": "make", "timeout": 30}, {"command": "make", "timeout": 60})
    code, engine, end = await headless(polls, "Build")
    assert (code, end.reason, end.turns) == (4, "stationarity_ended", 5)
    assert [m.kind for m in engine.messages].count("nudge") == 1

    code, engine, end = await headless(calls({"command": "cat key.pem"}), "Show the key")
    assert (code, end.reason, end.detail) == (4, "hook_stopped", "Stopped: a tool returned a private key.")

    code, engine, end = await headless(calls({"command": "ls"}, usage=used(40, 20)), "Build", usage_limit=100)
    assert (code, end.reason, end.usage.total, end.turns) == (3, "usage_limit", 120, 2)

    code, engine, end = await headless(calls({"command": "ls"}), "Build", max_turns=2)
    assert (code, end.reason) == (3, "max_turns")
    # A scripted response that gives no usage reports 10 input and 10 output tokens.
    assert (end.usage.input_tokens, end.usage.output_tokens) == (20, 20)

    code, engine, end = await headless(calls({"command": "wait"}), "Build", deadline=0.2, tool_cancel_grace=0.05)
    assert (code, end.reason, end.abort_reason) == (3, "deadline", "deadline")
    assert engine.messages[-1].tool_results[0].text.startswith("Interrupted by user-set deadline (the run's deadline passed)")
    assert not released.is_set()


# ---------------------------------------------------------------------------------------------
# A service: the client cancels jobs, submits follow-ups, sends now; events go out as JSON.


def story_server(request: httpx.Request, body: dict[str, Any]) -> list[str]:
    """A long story that stalls after its first words; anything else is answered at once."""
    last = body["messages"][-1]
    if last["role"] == "user" and "story" in str(last["content"]):
        return Stalled(text_stream("Once upon a time there was", prompt=5, completion=5))
    return text_stream(f"Answer to: {last['content']}", prompt=5, completion=2)


async def stalled_job(server: Server, engine: QueryEngine) -> tuple[asyncio.Task[list[Event]], Any]:
    """A job iterated by a task of the service, waiting in the middle of the story's stream."""
    run = engine.run("Tell a story")

    async def pump() -> list[Event]:
        return [event async for event in run]

    task = asyncio.create_task(pump())
    await server.waiting.wait()
    server.waiting.clear()
    return task, run


@pytest.mark.parametrize("how", ["task_cancel", "aclose"])
async def test_a_job_the_client_cancels_is_settled_and_closes_its_response(how: str) -> None:
    server = Server(story_server, asyncio.Event())
    async with server.client() as client:
        engine = QueryEngine(OpenAIChatModel("gpt-4o", api_key="k", http_client=client))
        task, run = await stalled_job(server, engine)
        if how == "task_cancel":
            task.cancel()
            with pytest.raises(asyncio.CancelledError):
                await task
        else:
            await run.aclose()  # from another task than the one waiting for the next event
            events = await task
            assert isinstance(events[-1], TurnEnded) and events[-1].abort_reason == "consumer_closed"
        assert validate_transcript(engine.messages) == [] and not engine.running
        assert [m.role for m in engine.messages][:2] == ["user", "assistant"]
        assert engine.messages[1].partial and engine.messages[1].text.startswith("Once")
        assert not server.open_bodies
        # The service goes on with the same engine.
        _, end = await drive(engine, "Next")
        check_job(engine, end, "completed")
    assert not server.open_bodies


async def test_send_now_and_submitted_follow_ups_reach_the_model_in_order() -> None:
    server = Server(story_server, asyncio.Event())
    async with server.client() as client:
        engine = QueryEngine(OpenAIChatModel("gpt-4o", api_key="k", http_client=client), follow_up_behavior="queue")
        lines: list[dict[str, Any]] = []
        receipts: dict[str, str] = {}
        async for event in engine.run("Tell a story"):
            line = event_json(event)
            assert "\n" not in line
            lines.append(json.loads(line))
            if isinstance(event, TextDelta) and "now" not in receipts:
                receipts["now"] = engine.send_now("Stop: just say hi — 👋")
                receipts["later"] = engine.submit("Then say bye")
        assert not server.open_bodies
    ends = [line for line in lines if line["type"] == "turn_ended"]
    assert [(e["reason"], e["abort_reason"]) for e in ends] == [
        ("aborted_streaming", "send_now"), ("completed", None), ("completed", None),
    ]
    started = [line for line in lines if line["type"] == "turn_started"]
    assert [s["ids"] for s in started] == [[], [receipts["now"]], [receipts["later"]]]
    assert all(next(iter(line)) == "type" for line in lines)
    assert [m.text for m in engine.messages if m.role == "assistant"] == [
        "Once", "Answer to: Stop: just say hi — 👋", "Answer to: Then say bye",
    ]
    assert validate_transcript(engine.messages) == []
    # A TurnEnded's usage is the run's so far, not the turn's: the last one is the run's total.
    assert [(e["usage"]["input_tokens"], e["usage"]["output_tokens"]) for e in ends] == [(0, 0), (5, 2), (10, 4)]
    assert [e["turns"] for e in ends] == [1, 1, 1]


async def test_a_failing_endpoint_is_exit_2_and_the_key_is_never_shown() -> None:
    async def refuse(request: httpx.Request) -> httpx.Response:
        echoed = {"error": {"message": f"Incorrect API key provided: {request.headers['authorization']}", "type": "invalid_request_error"}}
        return httpx.Response(401, json=echoed)

    async with httpx.AsyncClient(transport=httpx.MockTransport(refuse)) as client:
        model = OpenAIChatModel("m", base_url="https://api.mistral.ai/v1", api_key="sk-secret-123", http_client=client)
        engine = QueryEngine(model)
        events, end = await drive(engine, "Hi")
    done = check_job(engine, end, "model_error")
    assert EXIT[done.reason] == 2 and done.error is not None and "401" in done.error
    assert all("sk-secret-123" not in event_json(e) for e in events)
    assert "sk-secret-123" not in repr(model)


async def test_sigterm_interrupts_a_headless_job() -> None:
    import os
    import signal

    engine = QueryEngine(calls({"command": "wait"}), tools=[shell], tool_cancel_grace=0.05)
    loop = asyncio.get_running_loop()
    loop.add_signal_handler(signal.SIGTERM, engine.interrupt, "shutdown")
    end: TurnEnded | None = None
    try:
        async for event in engine.run("Build"):
            if isinstance(event, ToolCallStarted):
                os.kill(os.getpid(), signal.SIGTERM)
            if isinstance(event, TurnEnded):
                end = event
    finally:
        loop.remove_signal_handler(signal.SIGTERM)
    done = check_job(engine, end, "aborted_tools")
    assert (EXIT[done.reason], done.abort_reason) == (130, "shutdown")


async def test_a_deadline_per_job_stops_stalled_streams_and_closes_them() -> None:
    server = Server(story_server, asyncio.Event())
    async with server.client() as client:
        model = OpenAIChatModel("gpt-4o", api_key="k", http_client=client)

        async def job(n: int) -> tuple[QueryEngine, TurnEnded | None]:
            engine = QueryEngine(model, deadline=0.3)
            _, end = await drive(engine, "Tell a story" if n % 2 else f"Job {n}")
            return engine, end

        results = await asyncio.gather(*(job(n) for n in range(20)))
    for n, (engine, end) in enumerate(results):
        done = check_job(engine, end, "deadline" if n % 2 else "completed")
        if n % 2:
            assert done.abort_reason == "deadline" and engine.messages[-1].partial
            assert engine.messages[-1].kind is None  # no interrupt notice: nobody interrupted
    assert not server.open_bodies


@pytest.mark.parametrize("how", ["task_cancel", "aclose"])
async def test_a_client_cancel_during_an_mcp_call_leaves_nothing_running(how: str, tmp_path: Path) -> None:
    async with MCPServer_stdio(tmp_path) as server:
        tools = await server.list_tools()
        names = {t.name.removeprefix("t_"): t.name for t in tools}
        engine = QueryEngine(ScriptedModel([mcp_desk(names)], cycle=True), tools=tools, tool_cancel_grace=1)
        server.attach(engine)
        started = asyncio.Event()
        run = engine.run("Wait")

        async def pump() -> list[Event]:
            out = []
            async for event in run:
                out.append(event)
                if isinstance(event, ToolCallStarted):
                    started.set()
            return out

        task = asyncio.create_task(pump())
        await started.wait()
        if how == "task_cancel":
            task.cancel()
            with pytest.raises(asyncio.CancelledError):
                await task
        else:
            await run.aclose()
            events = await task
            assert isinstance(events[-1], TurnEnded) and events[-1].abort_reason == "consumer_closed"
        assert validate_transcript(engine.messages) == [] and not engine.running
        assert engine.messages[-1].tool_results[0].text.startswith("Interrupted by user code (the application stopped reading the run)")
        _, end = await drive(engine, "Which process now?")
        check_job(engine, end, "completed")


async def test_a_permission_callback_tells_mcp_tools_by_the_servers_own_names(tmp_path: Path) -> None:
    from agentloop import Allow, Deny, ToolUseBlock

    async with MCPServer_stdio(tmp_path) as server:
        tools = await server.list_tools()
        offered = {server.remote_name(t.name): t.name for t in tools}
        assert offered["notes.read"].startswith("t_notes_read_") and offered["add"] == "t_add"
        assert server.remote_name("t_nothing") is None and server.remote_name("task") is None

        def allow_list(use: ToolUseBlock, ctx: ToolContext) -> Allow | Deny:
            return Allow() if server.remote_name(use.name) in {"add", "pid"} else Deny("not on the list")

        names = {remote: name for remote, name in offered.items() if remote is not None}
        engine = QueryEngine(ScriptedModel([mcp_desk(names)], cycle=True), tools=[*tools, delegate_tool()], permission=allow_list)
        _, end = await drive(engine, "Add and read")
        check_job(engine, end, "completed")
        add, note, _child = engine.messages[2].tool_results
        assert add.text == "5" and note.is_error and "not on the list" in note.text


async def test_an_interrupt_from_a_request_handlers_thread_stops_a_stalled_stream() -> None:
    server = Server(story_server, asyncio.Event())
    async with server.client() as client:
        engine = QueryEngine(OpenAIChatModel("gpt-4o", api_key="k", http_client=client))
        task, _ = await stalled_job(server, engine)
        await asyncio.to_thread(engine.interrupt, "cancel")  # a handler running in a thread pool
        events = await task
    end = events[-1]
    assert isinstance(end, TurnEnded)
    check_job(engine, end, "aborted_streaming")
    assert end.abort_reason == "cancel" and engine.messages[-1].kind == "interrupt_notice"
    assert not server.open_bodies
