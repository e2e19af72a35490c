"""A research orchestrator written from the docs: one parent fans its work out to many subagents.

The parent starts ten subagents in one response; some of them delegate again, down to the depth
limit. Children run on a `ScriptedModel` and on mock Anthropic, OpenAI Chat and OpenAI Responses
servers (tests/host_wire.py) that refuse what the real APIs refuse. The parent is interrupted
while its children stream, run tools or wait for permission; one child fails while the others go
on; the host steers the parent, stops iterating, and restarts from the session files. After every
run: each transcript (the parent's, every child's, every sidechain file's) is valid, and no task,
response or run is left.
"""

from __future__ import annotations

import asyncio
import contextlib
import re
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from agentloop import (
    Allow,
    Event,
    ModelError,
    QueryEngine,
    ScriptedModel,
    ScriptedResponse,
    ScriptedToolCall,
    ToolContext,
    TurnEnded,
    delegate_tool,
    tool,
    validate_transcript,
)
from agentloop.models import AnthropicModel, ModelRequest, OpenAIChatModel, OpenAIResponsesModel
from agentloop.sessions import JsonlSession
from tests.host_wire import AnthropicServer, Call, ChatServer, Reply, ResponsesServer, _Server

ANTHROPIC_KEY = "sk-ant-api03-fanout-never-shown-44dd"
OPENAI_KEY = "sk-proj-fanout-never-shown-55ee"

TOPICS = [f"topic {n}" for n in range(10)]


# -- the orchestrator -----------------------------------------------------------------------------


class Tree:
    """Every engine the parent made, found through the events: the host keeps the children it
    sees start (`subagent` is spied on) so that each transcript can be checked afterwards."""

    def __init__(self, monkeypatch: pytest.MonkeyPatch) -> None:
        self.children: dict[str, QueryEngine] = {}
        made = QueryEngine.subagent

        def spy(engine: QueryEngine, **kw: Any) -> QueryEngine:
            child = made(engine, **kw)
            self.children[kw["agent_id"]] = child
            return child

        monkeypatch.setattr(QueryEngine, "subagent", spy)

    def check(self, parent: QueryEngine) -> None:
        """Every transcript valid, nothing running."""
        assert validate_transcript(parent.messages) == []
        assert not parent.running
        for agent_id, child in self.children.items():
            assert validate_transcript(child.messages) == [], agent_id
            assert not child.running, agent_id


async def drive(engine: QueryEngine, prompt: str | None = None,
                on: Callable[[Event], None] | None = None) -> tuple[list[Event], TurnEnded]:
    events: list[Event] = []
    async with contextlib.aclosing(engine.run(prompt)) as run:
        async for event in run:
            events.append(event)
            if on is not None:
                on(event)
    ends = [e for e in events if isinstance(e, TurnEnded) and e.agent_id is None]
    return events, ends[-1]


def ends_of_children(events: list[Event]) -> list[TurnEnded]:
    return [e for e in events if isinstance(e, TurnEnded) and e.agent_id is not None]


def nothing_left(*servers: _Server) -> None:
    assert {t for t in asyncio.all_tasks() if not t.done()} == {asyncio.current_task()}
    for server in servers:
        assert server.rejections == []
        assert server.open_responses == 0


def task_of(request: ModelRequest) -> str:
    return request.messages[0].text


def results_of(request: ModelRequest) -> list[str]:
    """The results of the calls of the last response (an interjection may follow them)."""
    found: list[str] = []
    for message in reversed(request.messages):
        if message.role == "assistant":
            break
        found[:0] = [r.text for r in message.tool_results]
    return found


def fan_out(tool_name: str = "task") -> ScriptedResponse:
    return ScriptedResponse(text="Splitting the work.",
                            tool_calls=[ScriptedToolCall(tool_name, {"task": t}) for t in TOPICS])


def joined(results: list[str]) -> str:
    return "Report: " + " | ".join(results)


def calling(tool_name: str, arg: str, *, answer: str | None = None,
            report: Callable[[list[str]], str] | None = None) -> Callable[[ModelRequest], ScriptedResponse | str]:
    """A tree's script: the parent fans out over TOPICS (with `report`: until its calls are
    answered, then it reports on the results); each child calls `tool_name` with its topic as
    `arg` (with `answer`: until the call is answered, then it says "<topic>: <answer>")."""

    def script(request: ModelRequest) -> ScriptedResponse | str:
        task, results = task_of(request), results_of(request)
        if task.startswith("Research"):
            return report(results) if report is not None and results else fan_out()
        if answer is not None and results:
            return f"{task}: {answer}"
        return ScriptedResponse(tool_calls=[ScriptedToolCall(tool_name, {arg: task})])

    return script


def researcher(request: ModelRequest) -> ScriptedResponse | str:
    """The whole tree's script: the parent fans out, topics 0-2 delegate down the levels."""
    task, results = task_of(request), results_of(request)
    if task.startswith("Research"):
        return fan_out() if not results else joined(results)
    level, n = task.rsplit(" ", 1)
    deeper = {"topic": "deep", "deep": "deeper", "deeper": "deepest", "deepest": "bottom"}[level]
    if not results and int(n) < 3:
        return ScriptedResponse(tool_calls=[ScriptedToolCall("task", {"task": f"{deeper} {n}"})])
    below = f" ({results[0][:60]})" if results else ""
    return f"{level} {n} found{below}"


# -- ten at once, three levels deep ---------------------------------------------------------------


async def test_ten_subagents_in_one_response_nest_to_the_depth_limit_and_the_parent_pays_for_all(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path,
) -> None:
    tree = Tree(monkeypatch)
    model = ScriptedModel([researcher], cycle=True)
    with JsonlSession(tmp_path / "main.jsonl") as session:
        engine = QueryEngine(model, tools=[delegate_tool()], session=session)
        events, end = await drive(engine, "Research the field")
    assert end.reason == "completed"
    # 10 children, 3 grandchildren, 3 great-grandchildren; the latter's calls were refused.
    assert len(tree.children) == 16
    report = engine.messages[-1].text
    for n in range(10):
        assert f"topic {n} found" in report
    # The great-grandchildren (3 levels below the parent) could not delegate: they were told so.
    bottoms = [c for c in tree.children.values() if c.messages[0].text.startswith("deeper")]
    assert len(bottoms) == 3
    for child in bottoms:
        assert child.messages[2].tool_results[0].is_error
        assert "subagent depth limit (3) was reached" in child.messages[2].tool_results[0].text
    # The parent's usage is the whole tree's: every response of every engine, counted once.
    assert end.usage.input_tokens == 10 * model.request_count
    child_ends = ends_of_children(events)
    assert len(child_ends) == 16 and all(e.reason == "completed" for e in child_ends)
    # The parent's transcript holds only its calls and their results.
    assert len(engine.messages) == 4
    tree.check(engine)
    for agent_id, child in tree.children.items():
        loaded = JsonlSession(session.sidechain(agent_id).path).load()
        assert loaded.warnings == [] and loaded.repairs == []
        assert loaded.messages == child.messages, agent_id
    nothing_left()


# -- children on three providers and a scripted model ---------------------------------------------


@tool(concurrency_safe=True)
async def lookup(query: str) -> str:
    """Look a query up in the library."""
    return f"3 papers on {query}"


def serve_children(server: _Server, thinking: str = "") -> None:
    """Each request of a child on `server`: look its topic up first, then answer from the result."""
    def reply(body: dict[str, Any]) -> None:
        items = body.get("messages") or body.get("input") or []
        topic = re.search(r"topic \d", str(items[0]))
        assert topic is not None
        answered = "3 papers on" in str(items[-1])
        server.replies.append(Reply(text=f"{topic[0]}: 3 papers.", thinking=thinking) if answered else
                              Reply(thinking=thinking, calls=[Call("lookup", {"query": topic[0]})]))

    server.on_request = reply


def wired(provider: str, *, summaries: bool = True) -> tuple[_Server, Any]:
    """A mock server of `provider` ("anthropic", "responses" or "chat") and a model that talks to it:
    Claude with extended thinking, GPT-5 with its reasoning summarised unless `summaries` is off."""
    if provider == "anthropic":
        claude = AnthropicServer(ANTHROPIC_KEY, [])
        return claude, AnthropicModel("claude-opus-4-7", api_key=ANTHROPIC_KEY, thinking=2000,
                                      http_client=claude.client())
    if provider == "responses":
        gpt = ResponsesServer(OPENAI_KEY, [])
        extra = {"reasoning": {"effort": "low", "summary": "auto"}} if summaries else None
        return gpt, OpenAIResponsesModel("gpt-5", api_key=OPENAI_KEY, http_client=gpt.client(), extra_body=extra)
    chat = ChatServer(OPENAI_KEY, [])
    return chat, OpenAIChatModel("gpt-4o", api_key=OPENAI_KEY, http_client=chat.client())


def providers() -> tuple[list[_Server], list[Any]]:
    """Mock servers of the three APIs, and a delegate tool per provider (and one scripted)."""
    (claude, claude_model), (gpt, gpt_model), (chat, chat_model) = (wired(p) for p in ("anthropic", "responses", "chat"))
    serve_children(claude, thinking="Which papers? 🤔")
    serve_children(gpt, thinking="Search first.")
    serve_children(chat)
    models = {"claude": claude_model, "gpt": gpt_model, "chat": chat_model}
    tools = [delegate_tool(name=name, agent_prefix=name, model=model) for name, model in models.items()]
    return [claude, gpt, chat], [*tools, delegate_tool(), lookup]


def spread(request: ModelRequest) -> ScriptedResponse | str:
    """The parent's script: the ten topics spread over the four delegate tools."""
    task, results = task_of(request), results_of(request)
    if task.startswith("Research"):
        if results:
            return "Report: " + " | ".join(results)
        names = ["claude", "gpt", "chat", "task"]
        return ScriptedResponse(tool_calls=[ScriptedToolCall(names[n % 4], {"task": t}) for n, t in enumerate(TOPICS)])
    return f"{task}: scripted answer." if results else ScriptedResponse(
        tool_calls=[ScriptedToolCall("lookup", {"query": task})])


async def test_children_on_three_providers_and_a_scripted_model_run_at_once(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path,
) -> None:
    tree = Tree(monkeypatch)
    servers, tools = providers()
    model = ScriptedModel([spread], cycle=True)
    with JsonlSession(tmp_path / "main.jsonl") as session:
        engine = QueryEngine(model, tools=tools, session=session)
        events, end = await drive(engine, "Research the field")
    assert end.reason == "completed", end
    results = engine.messages[2].tool_results
    assert [r.is_error for r in results] == [False] * 10
    assert [r.text.split(":")[0] for r in results] == TOPICS
    assert sorted(tree.children) == sorted(
        ["claude-1", "claude-2", "claude-3", "gpt-1", "gpt-2", "gpt-3", "chat-1", "chat-2", "sub-1", "sub-2"])
    assert all(len(s.bodies) == 6 for s in servers[:2]) and len(servers[2].bodies) == 4
    child_ends = ends_of_children(events)
    assert len(child_ends) == 10
    own = sum(r.usage.input_tokens for r in [ScriptedResponse()] * 2)
    assert end.usage.input_tokens == own + sum(e.usage.input_tokens for e in child_ends)
    tree.check(engine)
    for agent_id, child in tree.children.items():
        loaded = JsonlSession(session.sidechain(agent_id).path).load()
        assert loaded.warnings == [] and loaded.repairs == []
        assert loaded.messages == child.messages, agent_id
    nothing_left(*servers)


# -- the parent interrupted while ten children work -----------------------------------------------


def stalling(server: _Server, thinking: str = "") -> None:
    """Each child on `server` starts its answer, then thinks until the client gives up."""
    server.on_request = lambda body: server.replies.append(
        Reply(thinking=thinking, text="A long survey of the literature. " * 20, chunk=12, stall_after=3))


def check_interrupted(engine: QueryEngine, tree: Tree, end: TurnEnded, events: list[Event], reason: str) -> None:
    """The parent and all ten children ended with `reason`; the parent's model is told each was stopped."""
    assert end.abort_reason == reason
    assert sorted(end.aborted_subagents) == sorted(tree.children)
    assert len(end.aborted_subagents) == 10
    child_ends = {e.agent_id: e for e in ends_of_children(events)}
    assert sorted(child_ends) == sorted(tree.children)
    assert {e.abort_reason for e in child_ends.values()} == {reason}
    results = engine.messages[2].tool_results
    said = "Interrupted by user-set deadline (the run's deadline passed)" if reason == "deadline" else "Interrupted by user"
    assert len(results) == 10 and all(r.is_error and said in r.text for r in results)
    tree.check(engine)


@pytest.mark.parametrize("provider", ["anthropic", "responses", "chat"])
async def test_the_parent_interrupted_while_ten_children_stream(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path, provider: str,
) -> None:
    tree = Tree(monkeypatch)
    server, child_model = wired(provider, summaries=False)
    stalling(server, thinking="" if provider == "chat" else "Hmm.")
    streaming: set[str] = set()
    with JsonlSession(tmp_path / "main.jsonl") as session:
        engine = QueryEngine(ScriptedModel([fan_out()]), tools=[delegate_tool(model=child_model)], session=session)

        def on(event: Event) -> None:
            if event.type == "text_delta" and event.agent_id is not None:
                streaming.add(event.agent_id)
                if len(streaming) == 10:
                    engine.interrupt("cancel")

        events, end = await drive(engine, "Research the field", on)
        assert open_under(tmp_path / "subagents") == []  # each sidechain closed as its run ended
    assert end.reason == "aborted_tools"
    check_interrupted(engine, tree, end, events, "cancel")
    assert engine.session_errors == []
    assert JsonlSession(tmp_path / "main.jsonl").load().messages == engine.messages
    for agent_id, child in tree.children.items():
        assert child.messages[-1].partial and child.messages[-1].text.startswith("A long survey")
        loaded = JsonlSession(session.sidechain(agent_id).path).load()
        assert loaded.warnings == [] and loaded.repairs == [], agent_id
        assert loaded.messages == child.messages, agent_id
        assert [(e["reason"], e["abort_reason"]) for e in loaded.events if e["type"] == "turn_ended"] == [
            ("aborted_streaming", "cancel")]
    nothing_left(server)


async def test_the_parent_interrupted_while_ten_children_run_tools(monkeypatch: pytest.MonkeyPatch) -> None:
    tree = Tree(monkeypatch)
    running: set[str] = set()
    all_running = asyncio.Event()

    @tool(concurrency_safe=True)
    async def crawl(site: str, ctx: ToolContext) -> str:
        """Crawl a site (until stopped)."""
        running.add(str(ctx.engine.agent_id))
        if len(running) == 10:
            all_running.set()
        await ctx.signal.wait()
        ctx.signal.throw_if_aborted()
        return "crawled"

    script = calling("crawl", "site")
    engine = QueryEngine(ScriptedModel([script], cycle=True), tools=[delegate_tool(), crawl])
    hooks: list[str] = []
    engine.on_abort(lambda reason: hooks.append(f"session cleanup ({reason})"), main_only=True)
    engine.on_abort(lambda reason: hooks.append(f"log ({reason})"))

    async def stop_when_all_run() -> None:
        await all_running.wait()
        engine.interrupt("cancel")

    stopper = asyncio.create_task(stop_when_all_run())
    events, end = await drive(engine, "Research the field")
    await stopper
    assert end.reason == "aborted_tools"
    check_interrupted(engine, tree, end, events, "cancel")
    for child in tree.children.values():
        assert "stopped while it was running" in child.messages[-1].tool_results[0].text
    # Each child inherited the logging hook; the session's cleanup ran once, for the parent.
    assert sorted(hooks) == ["log (cancel)"] * 11 + ["session cleanup (cancel)"]
    nothing_left()


async def test_the_parent_interrupted_while_a_child_waits_for_permission(monkeypatch: pytest.MonkeyPatch) -> None:
    tree = Tree(monkeypatch)
    asked: list[str] = []
    prompt_open = asyncio.Event()

    @tool(concurrency_safe=True)
    async def download(url: str) -> str:
        """Download a paper."""
        return "pdf"

    async def ask(use: Any, ctx: ToolContext) -> Allow:
        if use.name == "task":
            return Allow()
        asked.append(str(ctx.engine.agent_id))
        prompt_open.set()
        await asyncio.Event().wait()  # the user never answers
        raise AssertionError("unreachable")

    script = calling("download", "url")
    engine = QueryEngine(ScriptedModel([script], cycle=True), tools=[delegate_tool(), download], permission=ask)

    def on(event: Event) -> None:
        if event.type == "permission_requested" and event.agent_id is not None:
            engine.interrupt("cancel")

    events, end = await drive(engine, "Research the field", on)
    assert asked and len(asked) == 1  # one prompt at a time: the others never reached the user
    check_interrupted(engine, tree, end, events, "cancel")
    for child in tree.children.values():
        last = child.messages[-1]
        assert last.role == "user" and last.tool_results and last.tool_results[0].is_error, child.agent_id
    nothing_left()


# -- one child fails, the others go on ------------------------------------------------------------


@tool(concurrency_safe=True)
async def bash(command: str) -> str:
    """Run a shell command."""
    return ""


LOOP = "Let me check the index again. " * 80


def failing(request: ModelRequest) -> ScriptedResponse | str:
    """Topic 3's model fails, topic 4's loops in its thinking at every attempt, topic 5 waits on
    `true` forever; the others answer."""
    task, results = task_of(request), results_of(request)
    if task.startswith("Research"):
        return fan_out() if not results else joined(results)
    if task == "topic 3":
        return ScriptedResponse(text="Starting. ", error=ModelError("upstream overloaded", retryable=False), error_after=2)
    if task == "topic 4":
        return ScriptedResponse(thinking=LOOP, text="topic 4: nothing found.", chunk=8)
    if task == "topic 5":
        return ScriptedResponse(tool_calls=[ScriptedToolCall("bash", {"command": "true"})])
    return f"{task}: 3 papers."


async def test_failing_children_leave_the_others_going_and_the_parent_is_told_why(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    tree = Tree(monkeypatch)
    engine = QueryEngine(ScriptedModel([failing], cycle=True), tools=[delegate_tool(), bash])
    events, end = await drive(engine, "Research the field")
    assert end.reason == "completed"
    results = {t: r for t, r in zip(TOPICS, engine.messages[2].tool_results, strict=True)}
    assert results["topic 3"].is_error
    assert results["topic 3"].text.startswith("Subagent sub-4 stopped before finishing (model_error: ")
    assert "upstream overloaded" in results["topic 3"].text
    assert results["topic 5"].is_error
    assert "(stationarity_ended: Stopped: 4 no-op keep-alive commands in a row (bash).)" in results["topic 5"].text
    # The looping child was cut and resampled until its budget was spent, then its answer taken,
    # with a note that tells the parent's model where it came from.
    actions = [e.action for e in events if e.type == "doom_loop_detected" and e.agent_id == "sub-5"]
    assert actions[:2] == ["resample", "resample"] and "disarmed" in actions
    assert results["topic 4"].text.startswith("(Subagent sub-5's answer came out of a doom loop: ")
    assert results["topic 4"].text.endswith(")\n\ntopic 4: nothing found.")
    assert not any(results[t].is_error for t in TOPICS if t not in ("topic 3", "topic 4", "topic 5"))
    tree.check(engine)
    nothing_left()


# -- the host steers the parent, or stops iterating -----------------------------------------------


class Crawlers:
    """Ten children each running a `crawl` that waits until its run is stopped; `all_running` is
    set when the tenth has started."""

    def __init__(self) -> None:
        self.running: set[str] = set()
        self.all_running = asyncio.Event()
        self.seen: list[ModelRequest] = []

        @tool(concurrency_safe=True)
        async def crawl(site: str, ctx: ToolContext) -> str:
            """Crawl a site (until stopped, or told to finish)."""
            self.running.add(str(ctx.engine.agent_id))
            if len(self.running) == 10:
                self.all_running.set()
            await ctx.signal.wait()
            ctx.signal.throw_if_aborted()
            return "crawled"

        self.tool = crawl

    def script(self, request: ModelRequest) -> ScriptedResponse | str:
        self.seen.append(request)
        task = task_of(request)
        if task.startswith("Research"):
            last = request.messages[-1]
            if last.text.startswith("Stop"):
                return "Stopped as asked: two papers per topic so far."
            return fan_out() if not results_of(request) else joined(results_of(request))
        return ScriptedResponse(text=f"{task}: 2 papers so far; crawling for more.",
                                tool_calls=[ScriptedToolCall("crawl", {"site": task})])


async def test_send_now_on_the_parent_stops_its_ten_children_and_starts_the_new_turn(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    tree = Tree(monkeypatch)
    crawlers = Crawlers()
    engine = QueryEngine(ScriptedModel([crawlers.script], cycle=True), tools=[delegate_tool(), crawlers.tool])

    async def redirect() -> str:
        await crawlers.all_running.wait()
        return engine.send_now("Stop the crawl and say what you have.")

    redirecting = asyncio.create_task(redirect())
    events, _ = await drive(engine, "Research the field")
    receipt = await redirecting
    ends = [e for e in events if isinstance(e, TurnEnded) and e.agent_id is None]
    assert [e.reason for e in ends] == ["aborted_tools", "completed"]
    check_interrupted(engine, tree, ends[0], events, "send_now")
    starts = [e for e in events if e.type == "turn_started" and e.agent_id is None]
    assert starts[1].ids == (receipt,)
    assert engine.messages[-1].text == "Stopped as asked: two papers per topic so far."
    assert engine.messages[-2].text == "Stop the crawl and say what you have."  # no interrupt notice
    # The parent's model, asked for what it has, gets what each child had found when it stopped.
    for topic, result in zip(TOPICS, engine.messages[2].tool_results, strict=True):
        assert result.text.endswith(f"Its last words: {topic}: 2 papers so far; crawling for more."), result.text
    nothing_left()


async def test_an_interjection_on_the_parent_waits_for_its_ten_children(monkeypatch: pytest.MonkeyPatch) -> None:
    tree = Tree(monkeypatch)
    order: list[str] = []

    @tool(concurrency_safe=True)
    async def read(paper: str) -> str:
        """Read a paper."""
        return f"{paper}: read"

    def script(request: ModelRequest) -> ScriptedResponse | str:
        task, results = task_of(request), results_of(request)
        if task.startswith("Research"):
            if not results:
                return fan_out()
            assert request.messages[-1].kind == "interjection"
            return "Report in French: " + " | ".join(results)
        assert all(m.kind != "interjection" for m in request.messages), "the child saw the parent's interjection"
        return f"{task}: read" if results else ScriptedResponse(tool_calls=[ScriptedToolCall("read", {"paper": task})])

    engine = QueryEngine(ScriptedModel([script], cycle=True), tools=[delegate_tool(), read])
    receipt = ""

    def on(event: Event) -> None:
        nonlocal receipt
        if event.type == "tool_call_started" and event.agent_id == "sub-1" and not receipt:
            receipt = engine.interject("Write the report in French.")
        if isinstance(event, TurnEnded) and event.agent_id is not None:
            order.append("child ended")
        if event.type == "interjection_injected":
            assert event.agent_id is None and event.ids == (receipt,)
            order.append("injected")

    _, end = await drive(engine, "Research the field", on)
    assert end.reason == "completed", end
    assert order == ["child ended"] * 10 + ["injected"]
    assert engine.messages[-1].text.startswith("Report in French: topic 0: read")
    tree.check(engine)
    nothing_left()


async def test_a_host_that_stops_iterating_leaves_every_transcript_valid(monkeypatch: pytest.MonkeyPatch) -> None:
    tree = Tree(monkeypatch)
    crawlers = Crawlers()
    engine = QueryEngine(ScriptedModel([crawlers.script], cycle=True), tools=[delegate_tool(), crawlers.tool])
    run = engine.run("Research the field")
    async for _event in run:
        if crawlers.all_running.is_set():
            break
    await run.aclose()
    assert validate_transcript(engine.messages) == []
    assert not engine.running
    results = engine.messages[2].tool_results
    assert len(results) == 10 and all(r.is_error for r in results)
    # The children's cleanup goes on in the background; a new run waits for it.
    _, end = await drive(engine, "Stop and say what you have.")
    assert end.reason == "completed"
    tree.check(engine)
    for child in tree.children.values():
        assert child.last_turn_ended is None or child.last_turn_ended.abort_reason == "consumer_closed"
    nothing_left()


# -- sessions: a restart resumes the parent; every sidechain stands on its own ---------------------


def open_under(folder: Path) -> list[str]:
    """The files under `folder` this process holds open."""
    import os

    held = []
    for fd in Path("/proc/self/fd").iterdir():
        with contextlib.suppress(OSError):  # closed meanwhile
            target = os.readlink(fd)
            if target.startswith(f"{folder}/"):
                held.append(target)
    return held


def sidechains(main: Path) -> dict[str, Path]:
    return {p.stem: p for p in sorted((main.parent / "subagents" / main.stem).glob("*.jsonl"))}


async def test_a_restart_mid_fan_out_resumes_the_parent_and_each_sidechain_loads_on_its_own(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path,
) -> None:
    import shutil

    tree = Tree(monkeypatch)
    crawlers = Crawlers()
    live, crashed = tmp_path / "live", tmp_path / "crashed"
    with JsonlSession(live / "main.jsonl") as session:
        engine = QueryEngine(ScriptedModel([crawlers.script], cycle=True), tools=[delegate_tool(), crawlers.tool],
                             session=session)

        def on(event: Event) -> None:
            if crawlers.all_running.is_set() and not crashed.exists():
                shutil.copytree(live, crashed)  # what a SIGKILL now would leave on disk
                engine.interrupt("quit")

        await drive(engine, "Research the field", on)
        assert open_under(live / "subagents") == []
    tree.check(engine)
    nothing_left()

    # The "restarted" process: the parent resumes; its ten calls were cut off.
    files = sidechains(crashed / "main.jsonl")
    assert sorted(files) == sorted(f"sub-{n}" for n in range(1, 11))
    for agent_id, path in files.items():
        loaded = JsonlSession(path).load()
        assert loaded.warnings == [], agent_id
        assert validate_transcript(loaded.messages) == [], agent_id
        assert loaded.messages[0].text in TOPICS
    session, loaded = JsonlSession.resume(crashed / "main.jsonl")
    assert len(loaded.repairs) == 10
    tree.children.clear()
    crawlers2 = Crawlers()
    with session:
        engine = QueryEngine(ScriptedModel([crawlers2.script], cycle=True), tools=[delegate_tool(), crawlers2.tool],
                             session=session, messages=loaded.messages)
        _, end = await drive(engine, "Stop: tell me what you have.")
    assert end.reason == "completed"
    tree.check(engine)
    assert JsonlSession(crashed / "main.jsonl").load().messages == engine.messages
    nothing_left()


async def test_a_resumed_parent_fans_out_again_under_new_ids(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    tree = Tree(monkeypatch)
    path = tmp_path / "main.jsonl"
    with JsonlSession(path) as session:
        engine = QueryEngine(ScriptedModel([researcher], cycle=True), tools=[delegate_tool()], session=session)
        await drive(engine, "Research the field")
    first = {agent_id: JsonlSession(p).load().messages for agent_id, p in sidechains(path).items()}
    assert len(first) == 16
    session, loaded = JsonlSession.resume(path)
    with session:
        engine = QueryEngine(ScriptedModel([researcher], cycle=True), tools=[delegate_tool()], session=session,
                             messages=loaded.messages)
        _, end = await drive(engine, "Research the field again")
    assert end.reason == "completed"
    second = sidechains(path)
    assert len(second) == 32
    for agent_id, messages in first.items():  # the first run's children are untouched
        assert JsonlSession(second[agent_id]).load().messages == messages
    for agent_id, p in second.items():
        loaded_child = JsonlSession(p).load()
        assert loaded_child.warnings == [] and loaded_child.repairs == [], agent_id
        assert validate_transcript(loaded_child.messages) == [], agent_id
    tree.check(engine)
    nothing_left()


# -- limits charged across the tree ---------------------------------------------------------------


async def test_the_parents_usage_limit_is_the_trees_budget(monkeypatch: pytest.MonkeyPatch) -> None:
    tree = Tree(monkeypatch)

    script = calling("lookup", "query", answer="3 papers", report=lambda results: "Report.")
    model = ScriptedModel([script], cycle=True)
    engine = QueryEngine(model, tools=[delegate_tool(), lookup], usage_limit=100)
    events, end = await drive(engine, "Research the field")
    # The parent's response and four children's reach the limit: no engine of the tree asks again.
    assert model.request_count == 5
    assert end.reason == "usage_limit"
    assert end.usage.total == 20 * 5
    child_ends = ends_of_children(events)
    assert [e.reason for e in child_ends] == ["usage_limit"] * 10
    results = engine.messages[2].tool_results
    assert all(r.is_error and "stopped before finishing (usage_limit: the parent's usage_limit of 100 tokens" in r.text for r in results)
    tree.check(engine)
    nothing_left()


async def test_the_parents_deadline_stops_ten_children_with_it(monkeypatch: pytest.MonkeyPatch) -> None:
    from tests.helpers import VirtualClock

    tree = Tree(monkeypatch)

    @tool(concurrency_safe=True)
    async def fetch(url: str) -> str:
        """Fetch a slow page."""
        await asyncio.sleep(3600)
        return "page"

    script = calling("fetch", "url")
    with VirtualClock():
        engine = QueryEngine(ScriptedModel([script], cycle=True), tools=[delegate_tool(), fetch], deadline=30)
        events, end = await drive(engine, "Research the field")
    assert end.reason == "deadline"
    check_interrupted(engine, tree, end, events, "deadline")
    child_ends = ends_of_children(events)
    assert [e.reason for e in child_ends] == ["deadline"] * 10
    nothing_left()


async def test_a_childs_own_deadline_stops_only_the_child(monkeypatch: pytest.MonkeyPatch) -> None:
    from tests.helpers import VirtualClock

    tree = Tree(monkeypatch)

    @tool(concurrency_safe=True)
    async def fetch(url: str) -> str:
        """Fetch a page (topic 0's is slow)."""
        await asyncio.sleep(3600 if url == "topic 0" else 1)
        return "page"

    script = calling("fetch", "url", answer="page", report=joined)
    with VirtualClock():
        engine = QueryEngine(ScriptedModel([script], cycle=True), tools=[delegate_tool(deadline=30), fetch])
        _, end = await drive(engine, "Research the field")
    assert end.reason == "completed"
    results = engine.messages[2].tool_results
    # The reason is said once, as for the other limits: not "(deadline: deadline)".
    assert results[0].is_error and results[0].text == "Subagent sub-1 stopped before finishing (deadline)."
    assert [r.text for r in results[1:]] == [f"{t}: page" for t in TOPICS[1:]]
    tree.check(engine)
    nothing_left()


async def test_a_child_with_its_parents_grace_ends_its_turn_before_the_parent_cuts_it_off(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # The children's tools ignore the abort; a child's grace is its parent's (copied). Each child
    # cancels its own call first, so its turn ends and says so (its TurnEnded, its transcript's
    # "stopped while running" result) before the parent's grace runs out and it cancels the task.
    from tests.helpers import VirtualClock

    tree = Tree(monkeypatch)
    started: list[str] = []

    @tool(concurrency_safe=True)
    async def fetch(url: str, ctx: ToolContext) -> str:
        """Fetch a slow page (deaf to the abort)."""
        started.append(url)
        await asyncio.sleep(3600)
        return "page"

    def script(request: ModelRequest) -> ScriptedResponse | str:
        task = task_of(request)
        if task.startswith("Research"):
            return fan_out()
        if task in ("topic 0", "topic 1") and not results_of(request):
            return ScriptedResponse(tool_calls=[ScriptedToolCall("task", {"task": f"deep {task[-1]}"})])
        return ScriptedResponse(tool_calls=[ScriptedToolCall("fetch", {"url": task})])

    with VirtualClock() as clock:
        engine = QueryEngine(ScriptedModel([script], cycle=True), tools=[delegate_tool(), fetch])

        def on(event: Event) -> None:
            if len(started) == 10 and not engine.signal.aborted:  # type: ignore[union-attr]
                engine.interrupt("cancel")

        begun = clock.now
        events, end = await drive(engine, "Research the field", on)
        assert clock.now - begun <= 2.0 + 0.01  # the parent's grace bounds it all
    assert len(tree.children) == 12
    child_ends = {e.agent_id: e for e in ends_of_children(events)}
    assert sorted(child_ends) == sorted(tree.children)
    assert {e.reason for e in child_ends.values()} == {"aborted_tools"}
    assert sorted(end.aborted_subagents) == sorted(tree.children)
    tree.check(engine)
    nothing_left()


async def test_a_child_out_of_turns_hands_the_parent_what_it_said_last(monkeypatch: pytest.MonkeyPatch) -> None:
    # A child stopped by its turn limit after a tool batch: its transcript ends with the results,
    # but its last response's words are what it had found so far; the parent's model gets them.
    tree = Tree(monkeypatch)

    def script(request: ModelRequest) -> ScriptedResponse | str:
        task, results = task_of(request), results_of(request)
        if task.startswith("Research"):
            return fan_out() if not results else "Report."
        step = len(request.messages) // 2 + 1
        return ScriptedResponse(text=f"{task}: {step * 3} papers so far; checking more.",
                                tool_calls=[ScriptedToolCall("lookup", {"query": f"{task} page {step}"})])

    engine = QueryEngine(ScriptedModel([script], cycle=True), tools=[delegate_tool(max_turns=2), lookup])
    _, end = await drive(engine, "Research the field")
    assert end.reason == "completed"
    for topic, result in zip(TOPICS, engine.messages[2].tool_results, strict=True):
        assert result.is_error
        assert result.text.startswith("Subagent sub-")
        assert result.text.endswith(f"stopped before finishing (max_turns). Its last words: {topic}: 6 papers so far; "
                                    "checking more."), result.text
    tree.check(engine)
    nothing_left()


@pytest.mark.parametrize("provider", ["anthropic", "responses", "chat"])
async def test_a_parent_on_a_provider_interrupted_mid_fan_out_is_accepted_when_it_goes_on(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path, provider: str,
) -> None:
    tree = Tree(monkeypatch)
    server, model = wired(provider)
    server.on_request = lambda body: server.replies.append(
        Reply(text="Summary of what came back.") if "Go on" in str(body) else
        Reply(thinking="Ten topics: fan out.", text="Splitting the work.",
              calls=[Call("task", {"task": t}) for t in TOPICS]))
    crawlers = Crawlers()
    children = ScriptedModel([crawlers.script], cycle=True)
    path = tmp_path / "main.jsonl"
    with JsonlSession(path) as session:
        engine = QueryEngine(model, tools=[delegate_tool(model=children), crawlers.tool], session=session)

        def on(event: Event) -> None:
            if crawlers.all_running.is_set():
                engine.interrupt("cancel")

        events, end = await drive(engine, "Research the field", on)
        check_interrupted(engine, tree, end, events, "cancel")
        _, end = await drive(engine, "Go on with what you have.")
    assert end.reason == "completed"
    assert engine.messages[-1].text == "Summary of what came back."
    assert engine.session_errors == []
    assert JsonlSession(path).load().messages == engine.messages
    tree.check(engine)
    nothing_left(server)


# -- best of n: the same task to many children at once -------------------------------------------


@pytest.mark.parametrize("copies", [10, 12])
async def test_the_same_task_given_to_many_children_at_once_is_no_loop(copies: int) -> None:
    # "Best of n": the parent asks for several drafts of one task in one response. The calls are
    # identical, the answers are not: that is new information, not a repeated call.
    drafts = iter(range(100))

    def script(request: ModelRequest) -> ScriptedResponse | str:
        task, results = task_of(request), results_of(request)
        if task.startswith("Pick"):
            call = ScriptedToolCall("task", {"task": "Write one title for the survey."})
            return ScriptedResponse(tool_calls=[call] * copies) if not results else "Picked: " + results[0]
        return f"Draft title {next(drafts)}"

    engine = QueryEngine(ScriptedModel([script], cycle=True), tools=[delegate_tool()])
    events, end = await drive(engine, "Pick the best of several titles")
    assert end.reason == "completed", end.detail
    assert not [e for e in events if e.type == "policy_nudge"]
    assert engine.messages[-1].text.startswith("Picked: Draft title ")
    nothing_left()


async def test_children_that_all_answer_alike_are_still_a_loop() -> None:
    def script(request: ModelRequest) -> ScriptedResponse | str:
        if task_of(request).startswith("Pick"):
            call = ScriptedToolCall("task", {"task": "Write one title for the survey."})
            return ScriptedResponse(tool_calls=[call] * 12)
        return "The same title."

    engine = QueryEngine(ScriptedModel([script], cycle=True), tools=[delegate_tool()])
    _, end = await drive(engine, "Pick the best of several titles")
    assert end.reason == "stationarity_ended"
    nothing_left()


async def test_the_user_answers_the_childrens_prompts_then_redirects_the_parent(monkeypatch: pytest.MonkeyPatch) -> None:
    # A UI: each PermissionRequested shows a dialog (a future per call id) that the user answers.
    # The children ask one at a time; the user allows three, then, on the fourth, sends a new
    # instruction to the parent, which stops the children still at work.
    tree = Tree(monkeypatch)
    dialogs: dict[str, asyncio.Future[Allow]] = {}
    loop = asyncio.get_running_loop()

    @tool(concurrency_safe=True)
    async def download(url: str) -> str:
        """Download a paper."""
        return f"{url}.pdf"

    async def ask(use: Any, ctx: ToolContext) -> Allow:
        if use.name == "task":
            return Allow()
        return await dialogs.setdefault(use.id, loop.create_future())

    def script(request: ModelRequest) -> ScriptedResponse | str:
        task, results = task_of(request), results_of(request)
        if task.startswith("Research"):
            last = request.messages[-1]
            if last.text.startswith("Never mind"):
                return "Summary of the three papers downloaded."
            return fan_out()
        return f"{task}: {results[0]}" if results else ScriptedResponse(
            tool_calls=[ScriptedToolCall("download", {"url": task})])

    engine = QueryEngine(ScriptedModel([script], cycle=True), tools=[delegate_tool(), download], permission=ask)
    asked: list[str] = []

    def on(event: Event) -> None:
        if event.type == "permission_requested" and event.agent_id is not None:
            asked.append(event.agent_id)
            if len(asked) <= 3:
                dialogs.setdefault(event.tool_use.id, loop.create_future()).set_result(Allow())
            else:
                engine.send_now("Never mind the rest: summarise what you have.")

    events, end = await drive(engine, "Research the field", on)
    assert end.reason == "completed" and engine.messages[-1].text == "Summary of the three papers downloaded."
    assert len(asked) == 4
    results = engine.messages[2].tool_results
    done = [r.text for r in results if not r.is_error]
    assert len(done) == 3 and all(text.endswith(".pdf") for text in done)
    stopped = [r.text for r in results if r.is_error]
    assert len(stopped) == 7 and all("Interrupted by user" in text for text in stopped)
    first = next(e for e in events if isinstance(e, TurnEnded) and e.agent_id is None)
    assert first.abort_reason == "send_now" and len(first.aborted_subagents) == 7
    tree.check(engine)
    nothing_left()


@pytest.mark.parametrize("provider", ["anthropic", "responses", "chat"])
async def test_a_child_looping_on_a_provider_is_resampled_while_its_siblings_answer(
    monkeypatch: pytest.MonkeyPatch, provider: str,
) -> None:
    # Topic 0's child thinks the same sentence over and over at every attempt: it is cut and resampled, within its own budget, on the wire; its siblings
    # answer meanwhile, and every request the tree makes is one the API accepts.
    tree = Tree(monkeypatch)
    server, child_model = wired(provider)

    def reply(body: dict[str, Any]) -> None:
        items = body.get("messages") or body.get("input") or []
        topic = re.search(r"topic \d", str(items[0]))
        assert topic is not None
        if topic[0] != "topic 0":
            server.replies.append(Reply(text=f"{topic[0]}: 3 papers."))
        else:
            server.replies.append(Reply(thinking=LOOP, text="topic 0: nothing found.", chunk=8))

    server.on_request = reply
    engine = QueryEngine(ScriptedModel([researcher], cycle=True), tools=[delegate_tool(model=child_model)])
    events, end = await drive(engine, "Research the field")
    assert end.reason == "completed"
    looped = [e for e in events if e.type == "doom_loop_detected" and e.agent_id == "sub-1"]
    assert [e.action for e in looped][:3] == ["resample", "resample", "disarmed"]
    assert [e.agent_id for e in events if e.type == "resampling"] == ["sub-1", "sub-1"]
    results = engine.messages[2].tool_results
    assert [r.text for r in results[1:]] == [f"{t}: 3 papers." for t in TOPICS[1:]]
    tree.check(engine)
    nothing_left(server)


async def test_the_parents_turn_limit_counts_its_own_requests_only(monkeypatch: pytest.MonkeyPatch) -> None:
    # max_turns=1: the parent's one response fans out, the children (with the delegate tool's own
    # limit, 10) finish their work three levels deep, and the parent stops before its next request.
    tree = Tree(monkeypatch)
    model = ScriptedModel([researcher], cycle=True)
    engine = QueryEngine(model, tools=[delegate_tool()], max_turns=1)
    events, end = await drive(engine, "Research the field")
    assert end.reason == "max_turns" and end.turns == 1
    child_ends = ends_of_children(events)
    assert len(child_ends) == 16 and {e.reason for e in child_ends} == {"completed"}
    assert end.usage.total == 20 * model.request_count
    assert [r.is_error for r in engine.messages[2].tool_results] == [False] * 10
    tree.check(engine)
    nothing_left()


async def test_calls_beyond_max_parallel_tools_never_start_a_child_when_the_parent_stops(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path,
) -> None:
    # Three children at a time: the interrupt stops the three at work; the seven waiting never
    # started (no subagent, no sidechain file), and the parent's model is told they had no effect.
    tree = Tree(monkeypatch)
    crawlers = Crawlers()
    three = asyncio.Event()

    @tool(concurrency_safe=True)
    async def crawl(site: str, ctx: ToolContext) -> str:
        """Crawl a site (until stopped)."""
        crawlers.running.add(str(ctx.engine.agent_id))
        if len(crawlers.running) == 3:
            three.set()
        await ctx.signal.wait()
        ctx.signal.throw_if_aborted()
        return "crawled"

    with JsonlSession(tmp_path / "main.jsonl") as session:
        engine = QueryEngine(ScriptedModel([crawlers.script], cycle=True), tools=[delegate_tool(), crawl],
                             max_parallel_tools=3, session=session)

        def on(event: Event) -> None:
            if three.is_set():
                engine.interrupt("cancel")

        _, end = await drive(engine, "Research the field", on)
    assert sorted(end.aborted_subagents) == ["sub-1", "sub-2", "sub-3"] == sorted(tree.children)
    assert sorted(sidechains(tmp_path / "main.jsonl")) == ["sub-1", "sub-2", "sub-3"]
    results = [r.text for r in engine.messages[2].tool_results]
    assert all("stopped while it was running" in text for text in results[:3])
    assert results[3:] == ["Interrupted by user: this tool call never started, so it had no effect."] * 7
    tree.check(engine)
    nothing_left()


# -- a host that runs its children itself, to steer them -------------------------------------------


async def test_a_host_steers_and_stops_single_children_of_its_own_fan_out(monkeypatch: pytest.MonkeyPatch) -> None:
    # subagents.md's "Steering a child", run ten at once: each child gets an id of its own (from
    # its call's id), the host keeps the running ones by id, interjects on one and stops another;
    # the others never see either, and the parent goes on.
    import dataclasses

    tree = Tree(monkeypatch)
    children: dict[str, QueryEngine] = {}
    gate = asyncio.Event()

    @tool(concurrency_safe=True)
    async def search(query: str) -> str:
        """Search the library (waits for the host's go)."""
        await gate.wait()
        return f"3 papers on {query}"

    @tool(concurrency_safe=True)
    async def research(topic: str, ctx: ToolContext) -> str:
        """Research a topic with a helper agent."""
        agent_id = f"research-{ctx.tool_use_id}"
        child = children[topic] = ctx.engine.subagent(agent_id=agent_id, max_turns=5)
        end: TurnEnded | None = None
        try:
            async for event in child.run(topic):
                if event.agent_id is None:
                    event = dataclasses.replace(event, agent_id=agent_id)
                    end = event if isinstance(event, TurnEnded) else end
                ctx.emit(event)
        finally:
            del children[topic]
        if end is None or end.reason != "completed":
            raise RuntimeError(f"the helper stopped: {end.reason if end else 'no end'}")
        return child.messages[-1].text

    def script(request: ModelRequest) -> ScriptedResponse | str:
        task, results = task_of(request), results_of(request)
        if task.startswith("Research"):
            return ScriptedResponse(tool_calls=[ScriptedToolCall("research", {"topic": t}) for t in TOPICS]) if (
                not results) else "Report: " + " | ".join(results)
        if not results:
            return ScriptedResponse(tool_calls=[ScriptedToolCall("search", {"query": task})])
        steer = [m.text for m in request.messages if m.kind == "interjection"]
        return f"{task}: 3 papers" + (" (only the recent ones)" if steer else "")

    engine = QueryEngine(ScriptedModel([script], cycle=True), tools=[research, search])
    searching: set[str] = set()

    def on(event: Event) -> None:
        if event.type == "tool_call_started" and event.tool_use.name == "search":
            searching.add(str(event.agent_id))
            if len(searching) == 10:
                children["topic 3"].interject("Only the recent ones.")
                children["topic 5"].interrupt("skip")
                gate.set()

    events, end = await drive(engine, "Research the field", on)
    assert end.reason == "completed"
    results = [r.text for r in engine.messages[2].tool_results]
    assert results[3] == "topic 3: 3 papers (only the recent ones)"
    assert results[5] == "Tool 'research' raised RuntimeError: the helper stopped: aborted_tools"
    assert [r for n, r in enumerate(results) if n not in (3, 5)] == [
        f"{t}: 3 papers" for n, t in enumerate(TOPICS) if n not in (3, 5)]
    assert children == {}
    assert len({e.agent_id for e in events if e.agent_id is not None}) == 10
    tree.check(engine)
    nothing_left()


async def test_a_child_that_finished_as_the_parent_was_stopped_hands_back_its_answer() -> None:
    # The parent's interrupt lands after a child's turn completed, before the call running it
    # returned (here: as the child's TurnEnded is recorded). The child did its task: its answer
    # is the call's result, not "stopped while it was running".
    engine: QueryEngine

    class Store:
        def __init__(self, agent_id: str | None = None) -> None:
            self.agent_id = agent_id

        def append_message(self, message: Any) -> None:
            pass

        def append_event(self, event: Any) -> None:
            if isinstance(event, TurnEnded) and self.agent_id == "sub-1" and event.reason == "completed":
                engine.interrupt("cancel")

        def sidechain(self, agent_id: str) -> Store:
            return Store(agent_id)

        def close(self) -> None:
            pass

    @tool(concurrency_safe=True)
    async def wait(ctx: ToolContext) -> str:
        """Wait until stopped."""
        await ctx.signal.wait()
        ctx.signal.throw_if_aborted()
        return "never"

    def script(request: ModelRequest) -> ScriptedResponse | str:
        task = task_of(request)
        if task.startswith("Research"):
            return ScriptedResponse(tool_calls=[ScriptedToolCall("task", {"task": "topic 0"}),
                                                ScriptedToolCall("wait")])
        return "topic 0: 3 papers."

    engine = QueryEngine(ScriptedModel([script], cycle=True), tools=[delegate_tool(), wait], session=Store())
    _, end = await drive(engine, "Research the field")
    assert end.reason == "aborted_tools"
    first, second = engine.messages[2].tool_results
    assert not first.is_error and first.text == "topic 0: 3 papers."
    assert second.is_error and second.text.startswith("Interrupted by user")
    assert validate_transcript(engine.messages) == []
    nothing_left()
