"""A web chat service written from the docs: each conversation an engine over its own session file.

The "server" is a plain object whose methods are the HTTP endpoints, each request a task: `POST
/chat` streams `event_json` lines to its client; `POST /stop`, `/steer` (interject), `/replace`
(send_now) and `/approve` (the answer to a permission prompt, a future the permission callback
awaits) come from other tasks while the answer streams. Clients disconnect mid-answer and mid-tool
(their request task cancelled), the process restarts and resumes every conversation from its
directory, and many conversations run at once against mock Anthropic and OpenAI Responses servers
(tests/host_wire.py) that refuse what the real APIs refuse. After every step: a valid transcript,
the terminal the docs promise, nothing left running or open, and no API key anywhere.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import json
import logging
import math
from collections.abc import AsyncGenerator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, get_args

import pytest

from agentloop import (
    Allow,
    AssistantMessage,
    AttemptDiscarded,
    Deny,
    DoomLoopDetected,
    DoomLoopSignal,
    Event,
    InterjectionDropped,
    InterjectionInjected,
    Message,
    PermissionRequested,
    PolicyNudge,
    QueryEngine,
    Resampling,
    Retrying,
    TextBlock,
    TextDelta,
    ThinkingDelta,
    ToolCallFinished,
    ToolCallStarted,
    ToolContext,
    ToolInputDelta,
    ToolProgress,
    ToolResultBlock,
    ToolUseBlock,
    TurnEnded,
    TurnStarted,
    event_json,
    tool,
    validate_transcript,
)
from agentloop.models import AnthropicModel, Model, OpenAIResponsesModel
from agentloop.sessions import JsonlSession, SessionLockedError
from tests.host_wire import AnthropicServer, Call, Reply, ResponsesServer, _Server

ANTHROPIC_KEY = "sk-ant-api03-web-never-shown-44dd"
OPENAI_KEY = "sk-proj-web-never-shown-55ee"


# -- the tools ----------------------------------------------------------------------------------


@dataclass
class Gates:
    """What the slow tool waits on, so a test knows it is running without sleeping."""

    started: asyncio.Event = field(default_factory=asyncio.Event)
    release: asyncio.Event = field(default_factory=asyncio.Event)
    cancelled: bool = False


GATES: dict[str, Gates] = {}


@tool
async def deploy(service: str, ctx: ToolContext) -> str:
    """Deploy a service (slow; stops when the run is aborted)."""
    gates = GATES.setdefault(service, Gates())
    gates.started.set()
    release = asyncio.ensure_future(gates.release.wait())
    aborted = asyncio.ensure_future(ctx.signal.wait())
    try:
        await asyncio.wait({release, aborted}, return_when=asyncio.FIRST_COMPLETED)
    finally:
        release.cancel()
        aborted.cancel()
    ctx.signal.throw_if_aborted()
    return f"{service} deployed"


@tool(concurrency_safe=True)
async def weather(city: str) -> str:
    """Look up today's weather of a city."""
    return f"{city}: sunny, 21 C"


# -- the server ---------------------------------------------------------------------------------


class Conflict(Exception):
    """409: the conversation has a request going already."""


class BadRequest(Exception):
    """400: a request the engine refuses, answered before any event is streamed."""


class NotFound(Exception):
    """404: nothing to answer (no such prompt waiting)."""


class Client:
    """The browser's end of a streamed response: the JSON lines it received."""

    def __init__(self) -> None:
        self.lines: list[str] = []
        self.got = asyncio.Condition()

    async def write(self, line: str) -> None:
        async with self.got:
            self.lines.append(line)
            self.got.notify_all()

    async def until(self, kind: str, count: int = 1) -> dict[str, Any]:
        """Wait (on the lines, not a clock) for the `count`-th event of type `kind`."""
        async with self.got:
            await self.got.wait_for(lambda: len(self.of(kind)) >= count)
        return self.of(kind)[count - 1]

    def of(self, kind: str) -> list[dict[str, Any]]:
        return [e for e in self.events if e["type"] == kind]

    @property
    def events(self) -> list[dict[str, Any]]:
        return [json.loads(line) for line in self.lines]


class Conversation:
    """One conversation: its engine, its session file, and the prompts waiting for an answer."""

    def __init__(self, path: Path, model: Model) -> None:
        self.session, loaded = JsonlSession.resume(path)
        self.repairs = loaded.repairs
        self.approvals: dict[str, asyncio.Future[bool]] = {}
        self.engine = QueryEngine(model, tools=[deploy, weather], system="You are a deploy assistant.",
                                  session=self.session, messages=loaded.messages, permission=self.ask)
        self.task: asyncio.Task[None] | None = None

    async def ask(self, call: ToolUseBlock, ctx: ToolContext) -> Allow | Deny:
        """The permission callback: wait for `POST /approve` (or a stop)."""
        if call.name != "deploy":
            return Allow()
        answer: asyncio.Future[bool] = asyncio.get_running_loop().create_future()
        self.approvals[call.id] = answer
        try:
            return Allow() if await answer else Deny("the user said no")
        finally:
            del self.approvals[call.id]


class WebHost:
    """The endpoints, over one directory of conversations."""

    def __init__(self, directory: Path, make_model: Any) -> None:
        self.directory = directory
        self.make_model = make_model
        self.conversations: dict[str, Conversation] = {}

    def conversation(self, cid: str) -> Conversation:
        if cid not in self.conversations:
            self.conversations[cid] = Conversation(self.directory / f"{cid}.jsonl", self.make_model(cid))
        return self.conversations[cid]

    def open_run(self, cid: str, text: str | None) -> AsyncGenerator[Event, None]:
        """What `POST /chat` checks before it answers 200: one run at a time, a text to send."""
        engine = self.conversation(cid).engine
        if engine.running:  # one run at a time: the client steers, replaces or stops instead
            raise Conflict(cid)
        try:
            return engine.run(text)
        except (TypeError, ValueError) as exc:  # a blank text: a 400, not a broken stream
            raise BadRequest(str(exc)) from exc

    @staticmethod
    async def stream(run: AsyncGenerator[Event, None], client: Client) -> None:
        """Stream every event of the run to the client, as JSON lines."""
        async with contextlib.aclosing(run):
            async for event in run:
                await client.write(event_json(event))

    async def chat(self, cid: str, text: str | None, client: Client) -> None:
        """`POST /chat`: run the conversation on, streaming every event to the client."""
        await self.stream(self.open_run(cid, text), client)

    def start_chat(self, cid: str, text: str | None, client: Client) -> asyncio.Task[None]:
        """The same, as the request's own task. The run is made before the task, so that a stop
        that comes before the task's first step reaches it (interrupts.md)."""
        task = asyncio.create_task(self.stream(self.open_run(cid, text), client))
        self.conversation(cid).task = task
        return task

    def stop(self, cid: str) -> None:
        self.conversations[cid].engine.interrupt()

    def steer(self, cid: str, text: str) -> str:
        return self.conversations[cid].engine.interject(text)

    def replace(self, cid: str, text: str) -> str:
        return self.conversations[cid].engine.send_now(text)

    def approve(self, cid: str, tool_use_id: str, yes: bool = True) -> None:
        answer = self.conversations[cid].approvals.get(tool_use_id)
        if answer is None or answer.done():
            raise NotFound(tool_use_id)
        answer.set_result(yes)

    async def shutdown(self) -> None:
        for conv in self.conversations.values():
            if conv.task is not None:
                with contextlib.suppress(asyncio.CancelledError, Conflict):
                    await conv.task
            conv.session.close()
        self.conversations.clear()


def anthropic(server: AnthropicServer) -> AnthropicModel:
    return AnthropicModel("claude-opus-4-7", api_key=server.key, http_client=server.client())


def responses(server: ResponsesServer) -> OpenAIResponsesModel:
    return OpenAIResponsesModel("gpt-5", api_key=server.key, http_client=server.client())


def serve(provider: str, replies: list[Reply]) -> tuple[_Server, Any]:
    """A mock server of `provider`, and the host's model factory that talks to it."""
    if provider == "anthropic":
        claude = AnthropicServer(ANTHROPIC_KEY, replies)
        return claude, lambda cid: anthropic(claude)
    gpt = ResponsesServer(OPENAI_KEY, replies)
    return gpt, lambda cid: responses(gpt)


def settled(conv: Conversation, *servers: _Server) -> None:
    """What every step leaves: a valid transcript, no run, nothing refused, no response open."""
    assert validate_transcript(conv.engine.messages) == []
    assert not conv.engine.running
    assert conv.engine.session_errors == []
    assert conv.approvals == {}
    for server in servers:
        assert server.rejections == []
        assert server.open_responses == 0


def terminal(client: Client) -> dict[str, Any]:
    ends = client.of("turn_ended")
    assert ends, client.lines
    return ends[-1]


async def cut(task: asyncio.Task[None]) -> None:
    """The browser went away: its request task is cancelled from outside."""
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task


async def cut_settled(host: WebHost, cid: str, task: asyncio.Task[None], *servers: _Server) -> Conversation:
    """Cut the request, then check the conversation it leaves is settled."""
    await cut(task)
    conv = host.conversations[cid]
    settled(conv, *servers)
    return conv


async def post_again(host: WebHost, cid: str, text: str, *servers: _Server, note: object = "") -> None:
    """A new `POST /chat` to the conversation: it completes, and leaves it settled."""
    again = Client()
    await host.chat(cid, text, again)
    assert terminal(again)["reason"] == "completed", note
    settled(host.conversations[cid], *servers)


# -- the client goes away -----------------------------------------------------------------------


def stalled_answer() -> Reply:
    return Reply(text="Deploying means three steps: build, push, roll out. " * 4, stall_after=3)


def stalled_call() -> Reply:
    return Reply(text="Let me check.", calls=[Call("weather", {"city": "Oslo"})], stall_after=3)


async def test_a_client_that_disconnects_mid_answer_then_posts_again(tmp_path: Path) -> None:
    server = AnthropicServer(ANTHROPIC_KEY, [stalled_answer(), Reply(text="Build, push, roll out.")])
    host = WebHost(tmp_path, lambda cid: anthropic(server))
    first = Client()
    task = host.start_chat("c1", "How do I deploy?", first)
    await first.until("text_delta", 3)
    await server.stalled.wait()
    conv = await cut_settled(host, "c1", task, server)
    assert first.of("turn_ended") == []  # the iteration ends without a TurnEnded (interrupts.md)
    cut_answer = conv.engine.messages[-1]
    assert cut_answer.partial and cut_answer.meta["abort_reason"] == "consumer_closed"
    assert cut_answer.text == "".join(e["text"] for e in first.of("text_delta")).rstrip()

    await post_again(host, "c1", "Short version?", server)
    assert [m["role"] for m in server.bodies[-1]["messages"]] == ["user", "assistant", "user"]
    assert conv.engine.last_turn_ended is not None and conv.engine.last_turn_ended.reason == "completed"

    server.stalled.clear()
    server.replies.append(stalled_answer())
    third = Client()
    task = host.start_chat("c1", "Once more, slowly", third)  # another tab asks how it went
    await server.stalled.wait()
    await cut(task)
    assert conv.engine.last_turn_ended is None  # not the completed turn before it
    settled(conv, server)
    await host.shutdown()


async def test_a_client_that_disconnects_while_the_tool_runs_then_posts_again(tmp_path: Path) -> None:
    GATES["api"] = Gates()
    server = AnthropicServer(ANTHROPIC_KEY, [
        Reply(text="Deploying.", calls=[Call("deploy", {"service": "api"})]),
        Reply(text="The deploy was cut; shall I retry?"),
    ])
    host = WebHost(tmp_path, lambda cid: anthropic(server))
    first = Client()
    task = host.start_chat("c1", "Deploy the api", first)
    request = await first.until("permission_requested")
    host.approve("c1", request["tool_use"]["id"])
    await first.until("tool_call_started")
    await GATES["api"].started.wait()
    conv = await cut_settled(host, "c1", task, server)
    results = conv.engine.messages[-1].tool_results
    assert len(results) == 1 and results[0].is_error and "stopped while it was running" in results[0].text

    await post_again(host, "c1", "What happened?", server)
    await host.shutdown()


async def test_a_client_that_disconnects_while_a_call_streams(tmp_path: Path) -> None:
    server = AnthropicServer(ANTHROPIC_KEY, [stalled_call(), Reply(text="Oslo is sunny.")])
    host = WebHost(tmp_path, lambda cid: anthropic(server))
    first = Client()
    task = host.start_chat("c1", "Weather in Oslo?", first)
    await first.until("tool_input_delta")
    await server.stalled.wait()
    conv = await cut_settled(host, "c1", task, server)
    assert conv.engine.messages[-1].tool_uses == []

    await post_again(host, "c1", "Well?", server)
    await host.shutdown()


# -- two requests at once, a restart ----------------------------------------------------------------


async def test_two_posts_to_one_conversation_at_once(tmp_path: Path) -> None:
    server = AnthropicServer(ANTHROPIC_KEY, [stalled_answer(), Reply(text="Done.")])
    host = WebHost(tmp_path, lambda cid: anthropic(server))
    first = Client()
    one = host.start_chat("c1", "How do I deploy?", first)
    with pytest.raises(Conflict):  # in the same instant, before the first request's task has begun
        host.start_chat("c1", "And roll back?", Client())
    await server.stalled.wait()
    with pytest.raises(Conflict):  # and while it streams
        host.start_chat("c1", "And roll back?", Client())
    conv = host.conversations["c1"]
    with pytest.raises(RuntimeError, match="already in progress"):  # what run() itself says
        async with contextlib.aclosing(conv.engine.run("A third tab")) as run:
            await anext(run)
    host.stop("c1")
    await one
    assert terminal(first)["reason"] == "aborted_streaming"
    settled(conv, server)
    await host.shutdown()
    loaded = JsonlSession(tmp_path / "c1.jsonl").load()
    assert loaded.warnings == [] and loaded.repairs == []
    assert loaded.messages == conv.engine.messages
    assert "And roll back?" not in json.dumps([m.model_dump(mode="json") for m in loaded.messages])


async def test_a_second_process_on_a_conversation_gets_the_lock_error(tmp_path: Path) -> None:
    server = AnthropicServer(ANTHROPIC_KEY, [stalled_answer(), Reply(text="Done.")])
    old, new = WebHost(tmp_path, lambda cid: anthropic(server)), WebHost(tmp_path, lambda cid: anthropic(server))
    first = Client()
    one = old.start_chat("c1", "How do I deploy?", first)
    await server.stalled.wait()
    with pytest.raises(SessionLockedError) as refused:
        await new.chat("c1", "Hello from the new process", Client())
    assert refused.value.path is not None and ANTHROPIC_KEY not in str(refused.value)
    old.stop("c1")
    await one
    await old.shutdown()
    assert JsonlSession(tmp_path / "c1.jsonl").load().warnings == []


async def test_a_restart_resumes_every_conversation(tmp_path: Path) -> None:
    GATES["db"] = Gates()
    server = AnthropicServer(ANTHROPIC_KEY, [
        Reply(text="Hello!"),
        Reply(text="Deploying.", calls=[Call("deploy", {"service": "db"})]),
        stalled_answer(),
    ])
    host = WebHost(tmp_path, lambda cid: anthropic(server))
    await host.chat("done", "Hi", Client())
    mid_tool, mid_stream = Client(), Client()
    tool_task = host.start_chat("mid-tool", "Deploy the db", mid_tool)
    request = await mid_tool.until("permission_requested")
    host.approve("mid-tool", request["tool_use"]["id"])
    await GATES["db"].started.wait()
    stream_task = host.start_chat("mid-stream", "Explain deploys", mid_stream)
    await server.stalled.wait()
    for cid in ("mid-tool", "mid-stream"):  # what a process killed now (SIGKILL) leaves behind
        (tmp_path / f"crashed-{cid}.jsonl").write_bytes((tmp_path / f"{cid}.jsonl").read_bytes())
    for task in (tool_task, stream_task):
        await cut(task)
    before = {cid: list(c.engine.messages) for cid, c in host.conversations.items()}
    await host.shutdown()

    server.replies = [Reply(text=f"Answer {n}.") for n in range(5)]
    restarted = WebHost(tmp_path, lambda cid: anthropic(server))
    for cid in ("done", "mid-tool", "mid-stream", "crashed-mid-tool", "crashed-mid-stream"):
        conv = restarted.conversation(cid)
        if cid == "crashed-mid-tool":  # the call without its result gets a synthetic one
            assert len(conv.repairs) == 1 and "added a synthetic result" in conv.repairs[0]
            assert conv.engine.messages[:2] == before["mid-tool"][:2]
        elif cid == "crashed-mid-stream":  # the prompt, and nothing of the answer
            assert conv.repairs == [] and conv.engine.messages == before["mid-stream"][:1]
        else:
            assert conv.repairs == [] and conv.engine.messages == before[cid]
        await post_again(restarted, cid, "Where were we?", server)
    await restarted.shutdown()


# -- stop, steer, replace, approve from other requests ------------------------------------------


@pytest.mark.parametrize("provider", ["anthropic", "responses"])
async def test_stop_steer_and_replace_arrive_while_the_answer_streams(provider: str, tmp_path: Path) -> None:
    GATES["api"] = Gates()
    server, make = serve(provider, [
        Reply(text="Deploying.", calls=[Call("deploy", {"service": "api"})]),
        Reply(text="Deployed, and I kept it short."),
        stalled_answer(),
        Reply(text="Rolled back."),
        stalled_answer(),
    ])
    host = WebHost(tmp_path, make)
    client, task, call_id = await deploy_prompt(host, "c1", "api")
    host.approve("c1", call_id)
    await GATES["api"].started.wait()
    receipt = await asyncio.to_thread(host.steer, "c1", "Keep it short.")  # a request handled in a thread pool
    GATES["api"].release.set()
    await task
    conv = host.conversations["c1"]
    assert client.of("interjection_injected")[0]["ids"] == [receipt]
    assert terminal(client)["reason"] == "completed"
    assert "Keep it short." in json.dumps(server.bodies[1])
    settled(conv, server)

    client = Client()
    task = host.start_chat("c1", "How do I deploy?", client)
    await server.stalled.wait()
    receipt = host.replace("c1", "Never mind: roll back instead.")
    await task
    first, second = client.of("turn_ended")
    assert (first["reason"], first["abort_reason"], second["reason"]) == ("aborted_streaming", "send_now", "completed")
    assert client.of("turn_started")[1]["ids"] == [receipt]
    settled(conv, server)

    server.stalled.clear()
    client = Client()
    task = host.start_chat("c1", "Explain once more", client)
    await server.stalled.wait()
    host.stop("c1")
    await task
    assert (terminal(client)["reason"], terminal(client)["abort_reason"]) == ("aborted_streaming", "cancel")
    assert conv.engine.messages[-1].kind == "interrupt_notice"
    settled(conv, server)
    await host.shutdown()


async def deploy_prompt(host: WebHost, cid: str, service: str) -> tuple[Client, asyncio.Task[None], str]:
    client = Client()
    task = host.start_chat(cid, f"Deploy {service}", client)
    request = await client.until("permission_requested")
    return client, task, request["tool_use"]["id"]


def deploy_replies(*services: str) -> list[Reply]:
    replies: list[Reply] = []
    for service in services:
        replies += [Reply(text="Deploying.", calls=[Call("deploy", {"service": service})]), Reply(text="Noted.")]
    return replies


@pytest.mark.parametrize("provider", ["anthropic", "responses"])
async def test_a_permission_prompt_answered_by_another_request(provider: str, tmp_path: Path) -> None:
    GATES["web"] = Gates()
    GATES["web"].release.set()
    server, make = serve(provider, deploy_replies("web", "web"))
    host = WebHost(tmp_path, make)
    client, task, call_id = await deploy_prompt(host, "c1", "web")
    host.approve("c1", call_id)
    await task
    finished = client.of("tool_call_finished")[0]
    assert (finished["result"]["content"], finished["result"]["is_error"]) == ("web deployed", False)
    settled(host.conversations["c1"], server)

    client, task, call_id = await deploy_prompt(host, "c1", "web")
    host.approve("c1", call_id, yes=False)
    await task
    assert "the user said no" in client.of("tool_call_finished")[0]["result"]["content"]
    assert terminal(client)["reason"] == "completed"
    settled(host.conversations["c1"], server)
    await host.shutdown()


@pytest.mark.parametrize("provider", ["anthropic", "responses"])
async def test_a_prompt_nobody_answers_then_stop_then_a_late_approve(provider: str, tmp_path: Path) -> None:
    server, make = serve(provider, deploy_replies("web"))
    host = WebHost(tmp_path, make)
    client, task, call_id = await deploy_prompt(host, "c1", "web")
    host.stop("c1")
    await task
    end = terminal(client)
    assert (end["reason"], end["abort_reason"]) == ("aborted_tools", "cancel")
    result = host.conversations["c1"].engine.messages[-2].tool_results[0]
    assert result.is_error and "never started" in result.text
    with pytest.raises(NotFound):  # the late click finds nothing to answer
        host.approve("c1", call_id)
    settled(host.conversations["c1"], server)

    await post_again(host, "c1", "Go on", server)
    await host.shutdown()


@pytest.mark.parametrize("provider", ["anthropic", "responses"])
async def test_a_client_that_disconnects_while_its_prompt_waits(provider: str, tmp_path: Path) -> None:
    server, make = serve(provider, deploy_replies("web"))
    host = WebHost(tmp_path, make)
    _, task, call_id = await deploy_prompt(host, "c1", "web")
    await cut(task)
    with pytest.raises(NotFound):
        host.approve("c1", call_id)
    conv = host.conversations["c1"]
    settled(conv, server)
    assert "never started" in conv.engine.messages[-1].tool_results[0].text
    await post_again(host, "c1", "Go on", server)
    await host.shutdown()


# -- many conversations at once -----------------------------------------------------------------


async def test_thirty_conversations_at_once_and_one_over_responses(tmp_path: Path) -> None:
    claude = AnthropicServer(ANTHROPIC_KEY, [])
    gpt = ResponsesServer(OPENAI_KEY, [Reply(text="Checking.", calls=[Call("weather", {"city": "Rome"})]),
                                       Reply(text="Rome is sunny.")])
    shared = anthropic(claude)  # one model (one HTTP client) for every Claude conversation

    def script(body: dict[str, Any]) -> None:  # each request gets the reply its conversation asks for
        last = json.dumps(body["messages"][-1])
        if "Weather" in last:
            claude.replies.insert(0, Reply(text="Checking.", calls=[Call("weather", {"city": "Oslo"})]))
        elif "Explain" in last:
            claude.replies.insert(0, Reply(text="Step one, step two, step three. " * 3, stall_after=2))
        else:
            claude.replies.insert(0, Reply(text="Oslo is sunny." if "tool_result" in last else "Hello!"))

    claude.on_request = script
    host = WebHost(tmp_path, lambda cid: responses(gpt) if cid == "gpt" else shared)
    prompts = {f"c{n:02d}": ("Weather in Oslo?", "Hi", "Explain deploys")[n % 3] for n in range(30)}
    clients = {cid: Client() for cid in [*prompts, "gpt"]}
    tasks = {cid: host.start_chat(cid, prompts.get(cid, "Weather in Rome?"), clients[cid]) for cid in clients}
    explaining = [cid for cid, p in prompts.items() if p.startswith("Explain")]
    for cid in explaining:
        await clients[cid].until("text_delta", 2)
    for n, cid in enumerate(explaining):
        if n % 2:
            host.stop(cid)
        else:
            tasks[cid].cancel()  # this browser went away
    results = await asyncio.gather(*tasks.values(), return_exceptions=True)
    for cid, outcome in zip(tasks, results, strict=True):
        conv = host.conversations[cid]
        settled(conv, claude, gpt)
        if cid in explaining and isinstance(outcome, asyncio.CancelledError):
            assert conv.engine.messages[-1].meta["abort_reason"] == "consumer_closed"
        elif cid in explaining:
            assert (terminal(clients[cid])["reason"], terminal(clients[cid])["abort_reason"]) == ("aborted_streaming", "cancel")
        else:
            assert outcome is None and terminal(clients[cid])["reason"] == "completed"
    assert len(claude.bodies) == 30 + 10 and len(gpt.bodies) == 2
    for cid, conv in host.conversations.items():  # each file replays to its own conversation
        assert JsonlSession(tmp_path / f"{cid}.jsonl").load().messages == conv.engine.messages
    await host.shutdown()
    await shared.aclose()


@pytest.mark.parametrize("provider", ["anthropic", "responses"])
async def test_an_approve_in_the_same_instant_as_the_stop_runs_nothing(provider: str, tmp_path: Path) -> None:
    GATES["web"] = Gates()
    server, make = serve(provider, deploy_replies("web"))
    host = WebHost(tmp_path, make)
    client, task, call_id = await deploy_prompt(host, "c1", "web")
    host.stop("c1")
    host.approve("c1", call_id)  # the click was already on its way: the stop came first
    await task
    assert not GATES["web"].started.is_set()
    assert client.of("tool_call_started") == []
    assert (terminal(client)["reason"], terminal(client)["abort_reason"]) == ("aborted_tools", "cancel")
    settled(host.conversations["c1"], server)
    await host.shutdown()


@tool
async def stubborn_deploy(service: str) -> str:
    """Deploy a service; ignores the abort signal until its gate opens."""
    gates = GATES[service]
    gates.started.set()
    try:
        await gates.release.wait()
    except asyncio.CancelledError:
        gates.cancelled = True
        raise
    return f"{service} deployed"


def stubborn_host(tmp_path: Path) -> tuple[AnthropicServer, WebHost, Conversation]:
    """A host whose conversation "c1" is asked to run `stubborn_deploy` on "api", then answers."""
    GATES["api"] = Gates()
    server = AnthropicServer(ANTHROPIC_KEY, [
        Reply(text="Deploying.", calls=[Call("stubborn_deploy", {"service": "api"})]),
        Reply(text="It was cut; shall I retry?"),
    ])
    host = WebHost(tmp_path, lambda cid: anthropic(server))
    conv = host.conversation("c1")
    conv.engine.tools = [*conv.engine.tools.values(), stubborn_deploy]
    return server, host, conv


async def test_a_disconnect_while_a_tool_ignores_the_abort_ends_once_the_tool_is_stopped(tmp_path: Path) -> None:
    server, host, conv = stubborn_host(tmp_path)
    conv.engine.tool_cancel_grace = 0.05
    first = Client()
    task = host.start_chat("c1", "Deploy the api", first)
    await GATES["api"].started.wait()
    await cut(task)  # returns once the run's cleanup is done: the tool's cancel grace, then its cancel
    assert GATES["api"].cancelled  # nothing the run started is left running
    settled(conv, server)
    assert "stopped while it was running" in conv.engine.messages[2].tool_results[0].text
    await post_again(host, "c1", "What happened?", server)
    await host.shutdown()
    assert JsonlSession(tmp_path / "c1.jsonl").load().messages == conv.engine.messages


class GoneClient(Client):
    """A browser that went away: writing the event of type `gone_at` to it fails."""

    def __init__(self, gone_at: str) -> None:
        super().__init__()
        self.gone_at = gone_at

    async def write(self, line: str) -> None:
        if json.loads(line)["type"] == self.gone_at:
            raise ConnectionResetError("the client went away")
        await super().write(line)


async def test_a_run_dropped_for_a_gone_client_frees_its_file_for_a_new_engine_at_once(tmp_path: Path) -> None:
    server, host, conv = stubborn_host(tmp_path)
    client = GoneClient("tool_call_started")
    with pytest.raises(ConnectionResetError):
        async for event in conv.engine.run("Deploy the api"):  # as the cookbook's host iterates
            await client.write(event_json(event))
    settled(conv, server)  # at once, though the tool still runs: its cleanup goes on in the background
    assert not conv.engine.running and not GATES["api"].release.is_set()
    await host.shutdown()

    restarted = WebHost(tmp_path, lambda cid: anthropic(server))  # the conversation, opened anew
    again = Client()
    task = restarted.start_chat("c1", "What happened?", again)
    await again.until("turn_started")
    GATES["api"].release.set()  # the old run's tool ends; its result is discarded
    await task
    assert terminal(again)["reason"] == "completed"
    conv = restarted.conversations["c1"]
    settled(conv, server)
    assert "stopped while it was running" in conv.engine.messages[2].tool_results[0].text
    await restarted.shutdown()


# -- the events as JSON, and no secret anywhere ---------------------------------------------------


class EchoingAnthropic(AnthropicServer):
    """A server (or a gateway in front of it) that quotes the request's key in its errors."""

    def check(self, body: dict[str, Any]) -> str | None:
        if "echo" in json.dumps(body["messages"][-1]):
            return f"invalid request for x-api-key {self.key}: prompt refused"
        return super().check(body)


class EchoingResponses(ResponsesServer):
    def check(self, body: dict[str, Any]) -> str | None:
        if "echo" in json.dumps(body["input"][-1]):
            return f"Incorrect API key provided: {self.key}."
        return super().check(body)


LEAKED: list[str] = []


@tool
async def read_env(name: str) -> str:
    """Read a variable of the server's environment (as a shell tool's printenv would)."""
    return f"{name}={LEAKED[-1]}"


@pytest.mark.parametrize("provider", ["anthropic", "responses"])
async def test_no_api_key_in_any_event_error_log_or_repr(provider: str, tmp_path: Path,
                                                         caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.DEBUG)
    key = ANTHROPIC_KEY if provider == "anthropic" else OPENAI_KEY
    server: _Server
    replies = [
        Reply(text="Looking it up.", error=f"overloaded (key: {key})", stall_after=1),  # an error event, retried
        Reply(text="Looking.", calls=[Call("read_env", {"name": "API_KEY"})]),
        Reply(text="It is set."),
    ]
    LEAKED.append(key)
    if provider == "anthropic":
        claude = EchoingAnthropic(key, replies)
        server, host = claude, WebHost(tmp_path, lambda cid: anthropic(claude))
    else:
        gpt = EchoingResponses(key, replies)
        server, host = gpt, WebHost(tmp_path, lambda cid: responses(gpt))
    conv = host.conversation("c1")
    conv.engine.tools = [*conv.engine.tools.values(), read_env]
    conv.engine.retry_base_delay = 0
    seen = Client()
    await host.chat("c1", "Is the key set?", seen)
    assert [e["type"] for e in seen.events].count("retrying") == 1
    await host.chat("c1", "echo this", seen)
    assert terminal(seen)["reason"] == "model_error"
    assert [key in r for r in server.rejections] == [True]  # what the server said
    server.rejections.clear()
    settled(conv, server)
    assert [e["type"] for e in seen.events].count("tool_call_finished") == 1
    assert "[REDACTED]" in seen.of("tool_call_finished")[0]["result"]["content"]
    assert "[REDACTED]" in terminal(seen)["error"]
    await host.shutdown()
    everything = [
        *seen.lines, *(r.getMessage() for r in caplog.records), *(r.exc_text or "" for r in caplog.records),
        repr(conv.engine), repr(conv.engine.model), repr(conv.session), *conv.engine.session_errors,
        (tmp_path / "c1.jsonl").read_text(encoding="utf-8"), *(repr(m) for m in conv.engine.messages),
    ]
    assert not [text for text in everything if key in text]


def one_of_each_event() -> list[Event]:
    """An instance of every event type the docs list, with the awkward values a real run can
    carry: line separators, non-ASCII, a NaN delay, a subagent's id."""
    call = ToolUseBlock(id="toolu_01", name="deploy", input={"service": "api\u2028web", "ratio": math.nan})
    result = ToolResultBlock(tool_use_id="toolu_01", content="deployed 🚀\u0085", is_error=False)
    answer = Message(role="assistant", content=[TextBlock(text="Grüße"), call], meta={"x": math.inf})
    signal = DoomLoopSignal.parse("tail_repetition:12@thinking")
    return [
        TurnStarted(turn=1, prompt=Message.user("Deploy"), ids=("r1",)),
        TextDelta(text="line\nbreak\u2029"), ThinkingDelta(thinking="hmm", agent_id="sub-1"),
        ToolInputDelta(tool_use_id="toolu_01", name="deploy", partial_json='{"serv'),
        AssistantMessage(message=answer, stop_reason="tool_use"), PermissionRequested(tool_use=call),
        ToolCallStarted(tool_use=call, updated_input={"service": "web"}),
        ToolCallFinished(tool_use=call, result=result, synthetic=True, full_result=result),
        ToolProgress(tool_use_id="toolu_01", text="step 2/3\u2028uploading\u00e9"),
        InterjectionInjected(texts=("also this",), ids=("r2",)),
        InterjectionDropped(texts=("also this",), ids=("r2",), reason="aborted_tools"),
        PolicyNudge(policy="IdenticalToolCallRun", reminder="You repeat yourself."),
        DoomLoopDetected(signals=(signal,), confident=True, action="resample", policy="conservative"),
        Resampling(attempt=1), Retrying(attempt=1, error="overloaded", delay=math.nan),
        AttemptDiscarded(attempt=1, reason="resample", text_chars=3, thinking_chars=4),
        TurnEnded(reason="aborted_tools", abort_reason="cancel", aborted_subagents=("sub-1",)),
    ]


def test_every_event_the_docs_list_goes_to_the_browser_as_one_json_line() -> None:
    events = one_of_each_event()
    assert {type(e) for e in events} == set(get_args(Event))
    for event in events:
        line = event_json(event)
        assert len(line.splitlines()) == 1 and "\n" not in line
        line.encode("utf-8")
        data = json.loads(line)
        assert next(iter(data)) == "type" and data["type"] == event.type
        assert json.loads(json.dumps(data, allow_nan=False)) == data  # strict JSON, round-trips
        names = {f.name for f in dataclasses.fields(event)}
        assert names <= set(data)


# -- the same cuts over thinking models -----------------------------------------------------------


def thinking_model(provider: str) -> tuple[_Server, Any]:
    if provider == "anthropic":
        claude = AnthropicServer(ANTHROPIC_KEY, [])
        return claude, lambda cid: AnthropicModel("claude-opus-4-7", api_key=ANTHROPIC_KEY, thinking=2000,
                                                  http_client=claude.client())
    gpt = ResponsesServer(OPENAI_KEY, [])
    return gpt, lambda cid: OpenAIResponsesModel("gpt-5", api_key=OPENAI_KEY, http_client=gpt.client(),
                                                 extra_body={"reasoning": {"effort": "low", "summary": "auto"}})


@pytest.mark.parametrize("provider", ["anthropic", "responses"])
@pytest.mark.parametrize("where", ["thinking", "text", "call", "tool"])
async def test_cuts_over_a_thinking_model_then_a_restart(provider: str, where: str, tmp_path: Path) -> None:
    GATES["api"] = Gates()
    server, make = thinking_model(provider)
    thought = "First I check the service, then I deploy it. " * 2
    stall = {"thinking": 2, "text": 13, "call": 15, "tool": None}[where]
    server.replies = [
        Reply(thinking=thought, text="Deploying now.", calls=[Call("deploy", {"service": "api"})], stall_after=stall),
        Reply(thinking="It was cut.", text="Shall I retry?"),
        Reply(thinking="Resuming.", text="Where we left off: nothing deployed."),
    ]
    host = WebHost(tmp_path, make)
    client = Client()
    task = host.start_chat("c1", "Deploy the api", client)
    if where == "tool":
        request = await client.until("permission_requested")
        host.approve("c1", request["tool_use"]["id"])
        await GATES["api"].started.wait()
    else:
        await server.stalled.wait()
        kinds = {"thinking": "thinking_delta", "text": "text_delta", "call": "tool_input_delta"}
        assert client.events[-1]["type"] == kinds[where]
    conv = await cut_settled(host, "c1", task, server)
    await post_again(host, "c1", "What happened?", server)
    kept = list(conv.engine.messages)
    await host.shutdown()

    restarted = WebHost(tmp_path, make)
    conv = restarted.conversation("c1")
    assert conv.repairs == [] and conv.engine.messages == kept
    await post_again(restarted, "c1", "And now?", server)
    await restarted.shutdown()


@pytest.mark.parametrize("provider", ["anthropic", "responses"])
async def test_a_replace_while_the_prompt_waits(provider: str, tmp_path: Path) -> None:
    server, make = serve(provider, [*deploy_replies("web")[:1], Reply(text="Rolling back instead.")])
    host = WebHost(tmp_path, make)
    client, task, call_id = await deploy_prompt(host, "c1", "web")
    receipt = host.replace("c1", "No, roll back instead.")
    await task
    first, second = client.of("turn_ended")
    assert (first["reason"], first["abort_reason"], second["reason"]) == ("aborted_tools", "send_now", "completed")
    assert client.of("turn_started")[1]["ids"] == [receipt]
    with pytest.raises(NotFound):
        host.approve("c1", call_id)
    settled(host.conversations["c1"], server)
    await host.shutdown()


# -- a client gone at every event -----------------------------------------------------------------


def sweep_replies() -> list[Reply]:
    return [
        Reply(text="Let me look that up.", error="overloaded", stall_after=1),  # retried
        Reply(text="Checking.", calls=[Call("weather", {"city": "Oslo"}), Call("weather", {"city": "Rome"})]),
        Reply(text="Both sunny; I kept it short."),
        Reply(text="Noted."),
    ]


class SteeringClient(Client):
    """A browser that also types "keep it short" when the first tool starts."""

    def __init__(self, host: WebHost, cid: str, gone_at: int | None = None) -> None:
        super().__init__()
        self.host, self.cid, self.gone_at = host, cid, gone_at

    async def write(self, line: str) -> None:
        if len(self.lines) == self.gone_at:
            raise ConnectionResetError("the client went away")
        if json.loads(line)["type"] == "tool_call_started" and not self.of("tool_call_started"):
            self.host.steer(self.cid, "Keep it short.")
        await super().write(line)


@pytest.mark.parametrize("provider", ["anthropic", "responses"])
async def test_a_client_gone_at_every_event_of_a_run(provider: str, tmp_path: Path) -> None:
    server, make = serve(provider, sweep_replies())
    host = WebHost(tmp_path, make)
    host.conversation("whole").engine.retry_base_delay = 0
    whole = SteeringClient(host, "whole")
    await host.chat("whole", "Weather in Oslo and Rome?", whole)
    kinds = [e["type"] for e in whole.events]
    assert {"retrying", "attempt_discarded", "interjection_injected", "tool_call_finished"} <= set(kinds)
    for k in range(len(kinds)):
        cid = f"gone-at-{k}"
        server.replies = sweep_replies()
        conv = host.conversation(cid)
        conv.engine.retry_base_delay = 0
        with pytest.raises(ConnectionResetError):
            await host.chat(cid, "Weather in Oslo and Rome?", SteeringClient(host, cid, gone_at=k))
        settled(conv, server)
        await post_again(host, cid, "Go on", server, note=(k, kinds[k]))
        assert JsonlSession(tmp_path / f"{cid}.jsonl").load().messages == conv.engine.messages
    await host.shutdown()


async def test_a_blank_message_is_a_400_before_anything_streams(tmp_path: Path) -> None:
    server = AnthropicServer(ANTHROPIC_KEY, [Reply(text="Hello!")])
    host = WebHost(tmp_path, lambda cid: anthropic(server))
    client = Client()
    for blank in ("", " \n\t"):
        with pytest.raises(BadRequest, match="needs a prompt with text"):
            await host.chat("c1", blank, client)
    assert client.lines == [] and server.bodies == []
    await host.chat("c1", "Hi", client)
    assert terminal(client)["reason"] == "completed"
    settled(host.conversations["c1"], server)
    await host.shutdown()


async def test_a_post_while_a_disconnected_request_still_stops_its_tool_waits_rather_than_409(tmp_path: Path) -> None:
    """The browser reloads and sends again while the cut request's tool uses its cancel grace:
    that run is not going for the host any more (as after a break), so the new one waits for its
    cleanup and starts, rather than a 409 for a run the user cannot see."""
    server, host, conv = stubborn_host(tmp_path)
    stopped = asyncio.Event()
    conv.engine.on_abort(lambda reason: stopped.set())
    task = host.start_chat("c1", "Deploy the api", Client())
    await GATES["api"].started.wait()
    task.cancel()  # the browser went away
    await stopped.wait()  # the run is stopped and settled; its tool has its grace
    assert not conv.engine.running
    again = Client()
    second = host.start_chat("c1", "What happened?", again)  # not a 409
    GATES["api"].release.set()
    await second
    with pytest.raises(asyncio.CancelledError):
        await task
    assert terminal(again)["reason"] == "completed"
    settled(conv, server)
    assert "stopped while it was running" in conv.engine.messages[2].tool_results[0].text
    await host.shutdown()


async def test_a_stop_posted_before_the_chat_request_has_begun(tmp_path: Path) -> None:
    server = AnthropicServer(ANTHROPIC_KEY, [Reply(text="Hello!")])
    host = WebHost(tmp_path, lambda cid: anthropic(server))
    client = Client()
    task = host.start_chat("c1", "Deploy everything", client)
    host.stop("c1")  # the user pressed stop at once: the request's task has had no step yet
    await task
    end = terminal(client)
    assert (end["reason"], end["abort_reason"]) == ("aborted_streaming", "cancel")
    assert server.bodies == []  # no model request was made
    conv = host.conversations["c1"]
    assert [m.text for m in conv.engine.messages] == ["Deploy everything", "[Request interrupted by user]"]
    settled(conv, server)
    await host.shutdown()
