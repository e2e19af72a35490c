"""SPEC §9: subagents share the model and tools, follow the parent's abort, keep their own transcript."""

from __future__ import annotations

import asyncio
import os
from collections.abc import AsyncIterator, Callable
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest

from agentloop import (
    Allow,
    ModelRequest,
    PermissionRequested,
    QueryEngine,
    ScriptedModel,
    ScriptedResponse,
    ScriptedToolCall,
    TextDelta,
    ToolCallFinished,
    ToolCallStarted,
    ToolContext,
    TurnEnded,
    delegate_tool,
    tool,
    validate_transcript,
)
from agentloop.sessions import JsonlSession
from tests.helpers import VirtualClock, collect


def delegate(task: str) -> ScriptedResponse:
    return ScriptedResponse(tool_calls=[ScriptedToolCall("task", {"task": task})])


def test_subagent_copies_every_setting_but_the_notice_and_a_forced_tool_choice() -> None:
    parent = QueryEngine(
        ScriptedModel([]),
        system="be brief",
        max_turns=4,
        tool_cancel_grace=0.3,
        retry_budget=1,
        retry_base_delay=0.01,
        retry_max_delay=0.02,
        max_tokens=512,
        usage_limit=9000,
        follow_up_behavior="steer",
        background_subagents="abort",
        tool_choice="lookup",
        policies=[],
    )
    child = parent.subagent(agent_id="sub-1")
    same = replace(parent.options, interrupt_notice=None, tool_choice=None)
    assert child.options == same
    assert parent.subagent(agent_id="sub-2", max_tokens=64).options.max_tokens == 64  # overrides win


async def test_subagent_shares_model_and_tools_and_keeps_its_own_transcript() -> None:
    @tool
    async def lookup() -> str:
        return "42"

    model = ScriptedModel([
        delegate("find the answer"),
        ScriptedResponse(tool_calls=[ScriptedToolCall("lookup", {})]),  # the child's first request
        "The answer is 42.",  # the child's final answer
        "Parent: the subagent says 42.",
    ])
    engine = QueryEngine(model, tools=[lookup, delegate_tool()], policies=[])
    events = await collect(engine, "ask a subagent")
    child_events = [e for e in events if e.agent_id == "sub-1"]
    assert child_events and all(e.agent_id == "sub-1" for e in child_events)
    assert any(isinstance(e, ToolCallFinished) and e.result.text == "42" for e in child_events)
    result = next(r for m in engine.messages for r in m.tool_results)
    assert result.text == "The answer is 42." and not result.is_error
    assert not any(r.text == "42" for m in engine.messages for r in m.tool_results)  # kept apart
    assert validate_transcript(engine.messages) == []


async def test_parent_abort_aborts_the_child_with_the_same_reason_and_lists_it() -> None:
    model = ScriptedModel([delegate("long job"), ScriptedResponse(text="child working " * 50, chunk=2, delay=0.001)])
    engine = QueryEngine(model, tools=[delegate_tool()], policies=[])
    child_reasons: list[str | None] = []
    events = []
    async for ev in engine.run("go"):
        events.append(ev)
        if isinstance(ev, TextDelta) and ev.agent_id == "sub-1" and not child_reasons:
            child_reasons.append(None)
            engine.interrupt("cancel")
        if isinstance(ev, TurnEnded) and ev.agent_id == "sub-1":
            child_reasons[0] = ev.abort_reason
    end = events[-1]
    assert isinstance(end, TurnEnded) and end.agent_id is None
    assert end.reason == "aborted_tools" and end.aborted_subagents == ("sub-1",)
    assert child_reasons == ["cancel"]
    result = next(r for m in engine.messages for r in m.tool_results)
    assert "stopped while it was running" in result.text
    assert validate_transcript(engine.messages) == []


async def test_a_parent_abort_lists_the_grandchildren_it_reached_too() -> None:
    model = ScriptedModel([
        delegate("plan the work"),  # the main engine
        delegate("do the work"),  # sub-1 delegates again
        ScriptedResponse(text="grandchild working " * 50, chunk=2, delay=0.001),  # sub-2
    ])
    engine = QueryEngine(model, tools=[delegate_tool()], policies=[])
    ends: dict[str | None, TurnEnded] = {}
    async for ev in engine.run("go"):
        if isinstance(ev, TextDelta) and ev.agent_id == "sub-2" and engine.signal is not None:
            engine.interrupt("cancel")
        if isinstance(ev, TurnEnded):
            ends[ev.agent_id] = ev
    assert {k: v.abort_reason for k, v in ends.items()} == {"sub-2": "cancel", "sub-1": "cancel", None: "cancel"}
    assert ends["sub-1"].aborted_subagents == ("sub-2",)
    assert ends[None].aborted_subagents == ("sub-1", "sub-2")


async def test_a_parent_usage_limit_counts_its_subagents_tokens() -> None:
    @tool
    async def ping() -> str:
        return "pong"

    ping_call = ScriptedResponse(tool_calls=[ScriptedToolCall("ping", {})])  # 20 tokens each, like every response
    model = ScriptedModel([delegate("keep pinging"), *[ping_call] * 9, "The parent goes on."])
    engine = QueryEngine(model, tools=[ping, delegate_tool()], policies=[], usage_limit=100)
    ends = {ev.agent_id: ev for ev in await collect(engine, "go") if isinstance(ev, TurnEnded)}
    # The parent spent 20 and its subagent 80: the tree's budget of 100 stops the subagent, then the parent.
    assert (ends["sub-1"].reason, ends["sub-1"].usage.total, ends["sub-1"].turns) == ("usage_limit", 80, 4)
    assert (ends[None].reason, ends[None].usage.total) == ("usage_limit", 100)
    assert len(model.requests) == 5
    result = next(r for m in engine.messages for r in m.tool_results)
    assert result.is_error and "usage_limit" in result.text
    assert validate_transcript(engine.messages) == []
    # A later run counts afresh: nothing of the first run, nor of its subagent, is counted again.
    more = ScriptedModel(["Fine."])
    engine.model = more
    assert [ev.usage.total for ev in await collect(engine, "and now?") if isinstance(ev, TurnEnded)] == [20]


async def test_child_abort_leaves_the_parent_running_with_a_clear_error_result() -> None:
    model = ScriptedModel([
        delegate("job"),
        ScriptedResponse(text="child text " * 50, chunk=2, delay=0.001),
        "Parent continues after the failed subagent.",
    ])
    engine = QueryEngine(model, tools=[delegate_tool()], policies=[])
    children: list[QueryEngine] = []
    original = engine.subagent

    def spy(**kw: object) -> QueryEngine:
        child = original(**kw)  # type: ignore[arg-type]
        children.append(child)
        return child

    engine.subagent = spy  # type: ignore[method-assign]
    async for ev in engine.run("go"):
        if isinstance(ev, TextDelta) and ev.agent_id == "sub-1" and children[0].running:
            children[0].interrupt("child_only")
    assert engine.last_turn_ended.reason == "completed"  # type: ignore[union-attr]
    result = next(r for m in engine.messages for r in m.tool_results)
    assert result.is_error and "sub-1 stopped before finishing" in result.text and "child_only" in result.text
    assert validate_transcript(children[0].messages) == []


async def test_main_only_hooks_run_only_when_the_main_engine_is_interrupted() -> None:
    calls: list[str] = []
    model = ScriptedModel([ScriptedResponse(text="abcdefghij" * 10, chunk=2)] * 3)
    engine = QueryEngine(model, policies=[])
    engine.on_abort(lambda r: calls.append("main-only:" + r), main_only=True)
    engine.on_abort(lambda r: calls.append("any:" + r))
    child = engine.subagent(agent_id="c1")
    async for ev in child.run("child"):
        if isinstance(ev, TextDelta):
            child.interrupt("child_cancel")
    assert calls == ["any:child_cancel"]
    async for ev in engine.run("main"):
        if isinstance(ev, TextDelta):
            engine.interrupt("main_cancel")
    assert calls == ["any:child_cancel", "main-only:main_cancel", "any:main_cancel"]


def _gate_tool(gate: asyncio.Event):  # type: ignore[no-untyped-def]
    @tool
    async def wait_for_gate(ctx: ToolContext) -> str:
        await gate.wait()
        return "background finished"

    return wait_for_gate


async def test_background_subagent_is_kept_or_aborted_by_the_engine_setting() -> None:
    for setting, survives in (("keep", True), ("abort", False)):
        gate = asyncio.Event()
        wait_for_gate = _gate_tool(gate)

        child_model = ScriptedModel([ScriptedResponse(tool_calls=[ScriptedToolCall("wait_for_gate", {})]), "bg done"])
        engine = QueryEngine(
            ScriptedModel([ScriptedResponse(text="main " * 40, chunk=2)]),
            tools=[wait_for_gate],
            policies=[],
            background_subagents=setting,  # type: ignore[arg-type]
        )
        bg_task = None
        async for ev in engine.run("go"):
            if bg_task is None:
                child = engine.subagent(agent_id="bg", model=child_model)
                bg_task = engine.start_background(child, "background work")
            elif isinstance(ev, TextDelta):
                await asyncio.sleep(0)
                engine.interrupt()
        gate.set()
        assert bg_task is not None
        events = await bg_task
        end = events[-1]
        assert isinstance(end, TurnEnded)
        assert (end.reason == "completed") is survives, (setting, end)


async def test_a_child_without_an_answer_never_hands_back_its_task_as_the_answer() -> None:
    from agentloop import ModelError

    for child_reply, expected, is_error in (
        ("", "(the subagent gave no answer)", False),
        (ScriptedResponse(error=ModelError("bad request")), "Subagent sub-1 stopped before finishing", True),
    ):
        model = ScriptedModel([delegate("the confidential task text"), child_reply, "parent done"])
        engine = QueryEngine(model, tools=[delegate_tool()], policies=[])
        await collect(engine, "go")
        result = next(r for m in engine.messages for r in m.tool_results)
        assert result.is_error is is_error and result.text.startswith(expected), result.text
        assert "confidential task text" not in result.text


async def test_a_child_stopped_by_its_turn_limit_says_so_once() -> None:
    """The reason is said once: "(max_turns)", not "(max_turns: max_turns)"."""

    @tool
    async def look() -> str:
        """Look around."""
        return "nothing yet"

    model = ScriptedModel([delegate("search"), ScriptedResponse(tool_calls=[ScriptedToolCall("look")]), "parent done"])
    engine = QueryEngine(model, tools=[look, delegate_tool(max_turns=1)], policies=[])
    await collect(engine, "go")
    result = next(r for m in engine.messages for r in m.tool_results if r.text.startswith("Subagent"))
    assert result.is_error and result.text == "Subagent sub-1 stopped before finishing (max_turns).", result.text


async def test_subagents_of_one_engine_never_share_an_agent_id_or_a_sidechain(tmp_path: Path) -> None:
    # Two delegate tools with the default prefix run in parallel, and the first child has a
    # delegate tool of its own (a narrower tool set): three children, three ids, three files.
    inner = delegate_tool(tools=[])

    def script(request: ModelRequest) -> ScriptedResponse | str:
        first = request.messages[0].text
        if first == "job A" and not any(m.tool_results for m in request.messages):
            return ScriptedResponse(tool_calls=[ScriptedToolCall("task", {"task": "job C"})])
        if first.startswith("job"):
            return ScriptedResponse(text=f"answer to {first}", chunk=3, delay=0.001)
        if any(m.tool_results for m in request.messages):
            return "done"
        calls = [ScriptedToolCall("research", {"task": "job A"}), ScriptedToolCall("code", {"task": "job B"})]
        return ScriptedResponse(tool_calls=calls)

    tools = [delegate_tool(name="research", tools=[inner]), delegate_tool(name="code")]
    with JsonlSession(tmp_path / "main.jsonl") as session:
        engine = QueryEngine(ScriptedModel([script], cycle=True), tools=tools, session=session, policies=[])
        events = await collect(engine, "go")
    ends = {e.agent_id: e for e in events if isinstance(e, TurnEnded) and e.agent_id is not None}
    assert len(ends) == 3 and all(e.reason == "completed" for e in ends.values())
    files = sorted((tmp_path / "subagents" / "main").iterdir())
    assert [f.stem for f in files] == sorted(ends)
    firsts = set()
    for f in files:
        loaded = JsonlSession(f).load()
        assert [m.role for m in loaded.messages][:1] == ["user"] and loaded.repairs == []
        assert sum(m.role == "user" and not m.tool_results for m in loaded.messages) == 1, f
        firsts.add(loaded.messages[0].text)
    assert firsts == {"job A", "job B", "job C"}


async def test_a_resumed_session_gives_a_new_subagent_a_new_sidechain(tmp_path: Path) -> None:
    path = tmp_path / "main.jsonl"
    for job in ("first job", "second job"):  # two processes, one session file
        model = ScriptedModel([delegate(job), f"answer to {job}", "done"])
        with JsonlSession(path) as session:
            messages = session.load().messages
            engine = QueryEngine(model, tools=[delegate_tool()], session=session, messages=messages, policies=[])
            events = await collect(engine, f"please do the {job}")
        ends = [e for e in events if isinstance(e, TurnEnded) and e.agent_id is not None]
        assert [e.reason for e in ends] == ["completed"]
    assert sorted(f.stem for f in (tmp_path / "subagents" / "main").iterdir()) == ["sub-1", "sub-2"]
    for name, job in (("sub-1", "first job"), ("sub-2", "second job")):
        loaded = JsonlSession(tmp_path / "subagents" / "main" / f"{name}.jsonl").load()
        assert [m.text for m in loaded.messages] == [job, f"answer to {job}"]


@pytest.mark.parametrize("where", ["one process", "a resumed session"])
async def test_a_reused_agent_id_sidechain_replays_to_the_latest_child(tmp_path: Path, where: str) -> None:
    """A host that names its subagent ("helper") and makes one per task: each child starts a
    conversation of its own, so the sidechain file replays to the latest child's transcript, not
    to the children's conversations joined into one that no child ever had."""
    path = tmp_path / "main.jsonl"
    children: list[QueryEngine] = []
    for job in ("first job", "second job"):
        with JsonlSession(path) as session:  # one session across both jobs, or one per process
            engine = QueryEngine(ScriptedModel([f"answer to {job}"]), session=session, policies=[])
            child = engine.subagent(agent_id="helper")
            await collect(child, job)
            children.append(child)
            if where == "one process":
                second = engine.subagent(agent_id="helper", model=ScriptedModel(["answer to second job"]))
                await collect(second, "second job")
                children.append(second)
                break
    loaded = JsonlSession(tmp_path / "subagents" / "main" / "helper.jsonl").load()
    assert [m.text for m in children[-1].messages] == ["second job", "answer to second job"]
    assert loaded.messages == children[-1].messages
    assert all(not c.session_errors for c in children)


@pytest.mark.parametrize("max_depth", [None, 1, 2])
async def test_delegation_stops_at_max_depth_with_an_error_result(max_depth: int | None) -> None:
    # A model that always delegates would nest subagents for ever: at the limit, the call fails.
    depth = 3 if max_depth is None else max_depth  # the default is 3
    answers = [f"answer at depth {d}" for d in range(depth, -1, -1)]
    model = ScriptedModel([*(delegate(f"level {d}") for d in range(depth + 1)), *answers])
    kwargs = {} if max_depth is None else {"max_depth": max_depth}
    engine = QueryEngine(model, tools=[delegate_tool(**kwargs)], policies=[])
    events = await collect(engine, "go deep")
    started = {e.agent_id for e in events if isinstance(e, TurnEnded) and e.agent_id is not None}
    assert started == {f"sub-{n}" for n in range(1, depth + 1)}
    refused = [e for e in events if isinstance(e, ToolCallFinished) and e.agent_id == (f"sub-{depth}" if depth else None)]
    assert len(refused) == 1 and refused[0].result.is_error
    assert "depth limit" in refused[0].result.text and str(depth) in refused[0].result.text
    assert events[-1] == engine.last_turn_ended and isinstance(events[-1], TurnEnded)
    assert events[-1].reason == "completed" and engine.messages[-1].text == "answer at depth 0"
    assert validate_transcript(engine.messages) == []


def test_max_depth_must_be_a_positive_whole_number() -> None:
    for bad in (0, -1, 1.5, True):
        with pytest.raises((TypeError, ValueError)):
            delegate_tool(max_depth=bad)  # type: ignore[arg-type]


@pytest.mark.parametrize("started", ["while_idle", "in_an_earlier_run"])
async def test_background_abort_reaches_children_not_started_in_the_current_run(started: str) -> None:
    # background_subagents="abort": a parent abort stops every background child of the parent,
    # also one started while the parent was idle, or during an earlier run that completed.
    holding = asyncio.Event()

    @tool
    async def hold(ctx: ToolContext) -> str:
        holding.set()
        return f"stopped: {await ctx.signal.wait()}"

    child_model = ScriptedModel([ScriptedResponse(tool_calls=[ScriptedToolCall("hold", {})]), "never reached"])
    engine = QueryEngine(
        ScriptedModel(["first run done.", ScriptedResponse(text="main " * 40, chunk=2)]),
        tools=[hold],
        policies=[],
        background_subagents="abort",
    )
    child = engine.subagent(agent_id="bg", model=child_model)
    bg_task: asyncio.Task[list[Any]] | None = None
    if started == "while_idle":
        bg_task = engine.start_background(child, "background work")
        await holding.wait()  # the child runs, the parent has not run yet
        await collect(engine, "first run")
    else:
        async for _ in engine.run("first run"):
            if bg_task is None:
                bg_task = engine.start_background(child, "background work")
    assert engine.last_turn_ended is not None and engine.last_turn_ended.reason == "completed"
    assert bg_task is not None
    await holding.wait()
    assert not bg_task.done()
    async for ev in engine.run("second run"):
        if isinstance(ev, TextDelta):
            engine.interrupt("cancel")
    try:
        events = await asyncio.wait_for(bg_task, 10)
    finally:
        bg_task.cancel()
    end = events[-1]
    assert isinstance(end, TurnEnded) and end.reason == "aborted_tools" and end.abort_reason == "cancel"
    assert validate_transcript(child.messages) == []


def _open_files(path: Path) -> int:
    fds = Path("/proc/self/fd")
    count = 0
    for fd in fds.iterdir():
        try:
            count += Path(os.readlink(fd)) == path
        except OSError:  # closed meanwhile (the directory's own fd)
            pass
    return count


async def test_a_subagents_sidechain_file_is_closed_when_its_run_ends(tmp_path: Path) -> None:
    model = ScriptedModel([delegate("one"), "child one.", "parent one.", delegate("two"), "child two.", "parent two."])
    with JsonlSession(tmp_path / "main.jsonl") as session:
        engine = QueryEngine(model, tools=[delegate_tool()], policies=[], session=session)
        await collect(engine, "first")
        side = session.sidechain("sub-1")
        assert side.path.exists() and _open_files(side.path) == 0  # not held until the engine goes
        assert _open_files(session.path) == 1  # the main file is the owner's to close
        # A child (a fresh one, or one of the same id) writes to its sidechain again.
        again = engine.subagent(agent_id="sub-1", model=ScriptedModel(["again."]))
        await collect(again, "once more")
        assert _open_files(side.path) == 0
        await collect(engine, "second")
        assert _open_files(session.sidechain("sub-2").path) == 0
    assert [m.text for m in JsonlSession(side.path).load().messages] == ["once more", "again."]
    assert [m.text for m in JsonlSession(tmp_path / "subagents" / "main" / "sub-2.jsonl").load().messages] == ["two", "child two."]


async def test_a_child_cancelled_after_the_grace_is_still_listed_as_aborted() -> None:
    # The child's tool ignores the abort, and the child's own grace is longer than the parent's: the
    # parent cancels the delegate call at the end of its grace, so the child never ends its turn
    # (no TurnEnded of its own), yet the parent's TurnEnded names it among the subagents aborted.
    release = asyncio.Event()
    holding = asyncio.Event()

    @tool
    async def stubborn(ctx: ToolContext) -> str:
        holding.set()
        await release.wait()  # ignores ctx.signal (a cancellation still stops it)
        return "late"

    model = ScriptedModel([delegate("stubborn job"), ScriptedResponse(tool_calls=[ScriptedToolCall("stubborn", {})])])
    engine = QueryEngine(
        model, tools=[stubborn, delegate_tool(tool_cancel_grace=60.0)], policies=[], tool_cancel_grace=0.01
    )
    events = []
    async for ev in engine.run("go"):
        events.append(ev)
        if isinstance(ev, ToolCallStarted) and ev.agent_id == "sub-1":
            await holding.wait()
            engine.interrupt("cancel")
    end = events[-1]
    assert isinstance(end, TurnEnded) and end.agent_id is None and end.reason == "aborted_tools"
    assert end.aborted_subagents == ("sub-1",)
    assert not [e for e in events if isinstance(e, TurnEnded) and e.agent_id == "sub-1"]
    assert validate_transcript(engine.messages) == []
    release.set()  # (the child's calls were cancelled with it: nothing should be left to finish)
    others = asyncio.all_tasks() - {asyncio.current_task()}
    _, pending = await asyncio.wait(others, timeout=10) if others else (set(), set())
    assert not pending


@pytest.mark.parametrize("depth", [1, 2])
async def test_a_child_cut_off_by_its_parent_ends_with_the_parents_run(depth: int, caplog: pytest.LogCaptureFixture) -> None:
    # The child's grace (60 s) is far longer than the parent's (0.05 s), and the child's tool ignores
    # the abort (a cancellation still stops it). When the parent's grace runs out it cancels the call
    # running the child: the child's cleanup must not wait out its own grace then, unowned, after the
    # parent's run() has returned. With depth 2 the child had delegated to a grandchild, which holds
    # the stubborn tool.
    holding = asyncio.Event()
    cancelled: list[str] = []

    @tool
    async def stubborn(ctx: ToolContext) -> str:
        holding.set()
        try:
            await asyncio.Event().wait()  # ignores ctx.signal
        except asyncio.CancelledError:
            cancelled.append(ctx.engine.agent_id or "main")
            raise
        return "never"

    script: list[Any] = [delegate("job")] * depth + [ScriptedResponse(tool_calls=[ScriptedToolCall("stubborn", {})])]
    with VirtualClock() as clock:
        engine = QueryEngine(
            ScriptedModel(script),
            tools=[stubborn, delegate_tool(tool_cancel_grace=60.0)],
            policies=[],
            tool_cancel_grace=0.05,
        )
        children: list[QueryEngine] = []
        real_subagent = QueryEngine.subagent

        def spy(self: QueryEngine, **kw: Any) -> QueryEngine:
            child = real_subagent(self, **kw)
            children.append(child)
            return child

        events = []
        QueryEngine.subagent = spy  # type: ignore[method-assign]
        try:
            async for ev in engine.run("go"):
                events.append(ev)
                if isinstance(ev, ToolCallStarted) and ev.tool_use.name == "stubborn":
                    await holding.wait()
                    interrupted_at = clock.now
                    engine.interrupt("cancel")
        finally:
            QueryEngine.subagent = real_subagent  # type: ignore[method-assign]
        returned_at = clock.now
        left = [t for t in asyncio.all_tasks() if t is not asyncio.current_task()]
    assert not left, f"tasks outlived the parent's run: {left}"
    assert returned_at - interrupted_at <= 0.05 + 0.1 + 0.01  # the parent's grace, not the child's
    assert cancelled == [children[-1].agent_id]  # the stubborn call was cancelled, once
    end = events[-1]
    assert isinstance(end, TurnEnded) and end.agent_id is None and end.reason == "aborted_tools"
    assert end.aborted_subagents == tuple(c.agent_id for c in children)  # ("sub-1", "sub-2") at depth 2
    assert "ignored cancellation" not in caplog.text  # the call running the child was not abandoned
    for e in (engine, *children):
        assert not e.running
        assert validate_transcript(e.messages) == [], e.agent_id
    # the cut-off child's stubborn call is settled as stopped while running
    last = children[-1].messages[-1]
    assert last.tool_results and last.tool_results[0].is_error


@pytest.mark.parametrize("when", ["before_the_run", "during_the_run"])
async def test_background_abort_stops_a_child_whose_run_had_not_started_yet(when: str) -> None:
    # background_subagents="abort": a background child whose task was made, but whose run had not
    # begun (its task never had a step) when the parent's aborted turn ended, starts aborted: its
    # run ends at once with the aborted terminal and the same reason; its model is never asked.
    child_model = ScriptedModel(["the child must not answer"])
    engine = QueryEngine(
        ScriptedModel([ScriptedResponse(text="main " * 40, chunk=2)]), policies=[], background_subagents="abort"
    )
    child = engine.subagent(agent_id="bg", model=child_model)
    bg_task: asyncio.Task[list[Any]] | None = None
    if when == "before_the_run":
        bg_task = engine.start_background(child, "background work")
    async for ev in engine.run("go"):
        if bg_task is None:
            bg_task = engine.start_background(child, "background work")
        if not ev.agent_id:  # no await in between: the child's task has had no step yet
            engine.interrupt("shutdown")
    assert bg_task is not None
    end = engine.last_turn_ended
    assert end is not None and end.abort_reason == "shutdown"
    assert not engine.running
    events = await asyncio.wait_for(bg_task, 10)
    ended = [e for e in events if isinstance(e, TurnEnded)]
    assert len(ended) == 1 and ended[0] is events[-1]
    assert ended[0].reason == "aborted_streaming" and ended[0].abort_reason == "shutdown"
    assert child_model.requests == []
    assert validate_transcript(child.messages) == []
    assert [m.text for m in child.messages][:1] == ["background work"]
    # The mark is spent: the child's next run is not aborted.
    child_model2 = ScriptedModel(["later answer"])
    child.model = child_model2
    again = await collect(child, "later work")
    assert isinstance(again[-1], TurnEnded) and again[-1].reason == "completed"


@pytest.mark.parametrize("given", [list, lambda ps: (p for p in ps)], ids=["list", "generator"])
async def test_policies_given_to_a_delegate_tool_are_forked_for_each_subagent(given: Callable[[list[Any]], Any]) -> None:
    """``delegate_tool(policies=[...])``: two subagents running at once must not share one policy
    object, or the one going round in circles is never stopped (the other's calls keep
    breaking its run of identical calls). Any iterable is a template (a generator was handed to
    the first child as it was: neither forked nor left for the second)."""
    from agentloop.policies import IdenticalToolCallRun

    reads = iter(range(1000))

    @tool
    async def read_file(path: str) -> str:
        """Read a file."""
        await asyncio.sleep(0)
        return "same content"

    def script(request: ModelRequest) -> ScriptedResponse | str:
        first = request.messages[0].text
        if first == "compare both":
            done = any(m.tool_results for m in request.messages)
            return "both compared" if done else ScriptedResponse(
                tool_calls=[ScriptedToolCall("task", {"task": "loop"}), ScriptedToolCall("task", {"task": "vary"})]
            )
        path = "a.py" if first == "loop" else f"f{next(reads)}.py"
        return ScriptedResponse(tool_calls=[ScriptedToolCall("read_file", {"path": path})])

    shared = IdenticalToolCallRun()
    task = delegate_tool(max_turns=20, policies=given([shared]))
    engine = QueryEngine(ScriptedModel([script], cycle=True), tools=[read_file, task], policies=[])
    events = await collect(engine, "compare both")
    ends = {e.agent_id: (e.reason, e.turns) for e in events if isinstance(e, TurnEnded) and e.agent_id}
    assert sorted(ends.values()) == [("max_turns", 20), ("stationarity_ended", 12)], ends
    assert shared.count == 0  # the caller's instance is a template: each subagent got its own copy
    assert validate_transcript(engine.messages) == []


def test_subagent_with_its_own_policies_does_not_fork_the_parents() -> None:
    """``subagent(policies=...)`` replaces the parent's policies: they are not copied (a policy
    holding a lock, a client or a file cannot be deep-copied, and need not be)."""
    from agentloop.policies import IdenticalToolCallRun, Policy

    class Unforkable(Policy):
        def fork(self) -> Policy:
            raise RuntimeError("this policy holds a connection")

    parent = QueryEngine(ScriptedModel([]), policies=[Unforkable()])
    mine = IdenticalToolCallRun()
    child = parent.subagent(agent_id="sub-1", policies=[mine])
    assert child.policies == [mine]
    with pytest.raises(RuntimeError, match="holds a connection"):
        parent.subagent(agent_id="sub-2")  # without policies=, the parent's are forked


async def test_subagents_running_at_once_ask_the_permission_callback_one_at_a_time() -> None:
    """An engine asks its permission callback one call at a time (a person answers one prompt
    at a time); children running in parallel share their parent's callback, so they take turns
    with each other and with the parent, as the calls of one engine do."""
    asking: list[str | None] = []
    peak = 0

    @tool
    async def rm(path: str) -> str:
        """Remove a file."""
        return f"removed {path}"

    async def ask(use: Any, ctx: ToolContext) -> Allow:
        nonlocal peak
        asking.append(ctx.engine.agent_id)
        peak = max(peak, len(asking))
        await asyncio.sleep(1)  # a person thinking (virtual time: everything else runs first)
        asking.remove(ctx.engine.agent_id)
        return Allow()

    def script(request: ModelRequest) -> ScriptedResponse | str:
        first = request.messages[0].text
        done = any(m.tool_results for m in request.messages)
        if first == "go":
            calls = [ScriptedToolCall("task", {"task": "a.txt"}), ScriptedToolCall("task", {"task": "b.txt"})]
            return "both removed" if done else ScriptedResponse(tool_calls=calls)
        return f"{first} removed" if done else ScriptedResponse(tool_calls=[ScriptedToolCall("rm", {"path": first})])

    with VirtualClock():
        engine = QueryEngine(
            ScriptedModel([script], cycle=True), tools=[rm, delegate_tool()], permission=ask, policies=[]
        )
        events = await collect(engine, "go")
    prompts = [e.agent_id for e in events if isinstance(e, PermissionRequested)]
    assert sorted(prompts, key=str) == sorted([None, None, "sub-1", "sub-2"], key=str)
    assert peak == 1
    assert events[-1].reason == "completed"  # type: ignore[attr-defined]
    assert sorted(r.text for m in engine.messages for r in m.tool_results) == ["a.txt removed", "b.txt removed"]


@pytest.mark.swallows_cancel
async def test_a_subagent_prompt_abandoned_on_its_own_abort_does_not_hold_the_parents_prompts() -> None:
    """A child aborted alone while its permission prompt is open, whose callback ignores the
    cancellation (it is abandoned), must not keep the prompt turn it shares with its parent:
    the parent goes on, and its next prompt is asked."""
    release = asyncio.Event()
    asked: list[str | None] = []

    @tool
    async def rm(path: str) -> str:
        """Remove a file."""
        return f"removed {path}"

    async def ask(use: Any, ctx: ToolContext) -> Allow:
        asked.append(ctx.engine.agent_id)
        while ctx.engine.agent_id == "sub-1" and not release.is_set():
            try:
                await release.wait()
            except asyncio.CancelledError:  # a callback that swallows its cancellation
                continue
        return Allow()

    model = ScriptedModel([
        delegate("clean up"),
        ScriptedResponse(tool_calls=[ScriptedToolCall("rm", {"path": "child.txt"})]),  # sub-1
        ScriptedResponse(tool_calls=[ScriptedToolCall("rm", {"path": "parent.txt"})]),  # the parent goes on
        "Done.",
    ])
    engine = QueryEngine(model, tools=[rm, delegate_tool()], permission=ask, policies=[])
    children: list[QueryEngine] = []
    real_subagent = engine.subagent

    def spy(**kw: Any) -> QueryEngine:
        child = real_subagent(**kw)
        children.append(child)
        return child

    engine.subagent = spy  # type: ignore[method-assign]

    async def drive() -> list[Any]:
        events = []
        async for ev in engine.run("go"):
            events.append(ev)
            if isinstance(ev, PermissionRequested) and ev.agent_id == "sub-1":
                children[0].interrupt("child_only")
        return events

    try:
        with VirtualClock():
            events = await asyncio.wait_for(drive(), 60)
    finally:
        release.set()
    assert asked == [None, "sub-1", None]
    assert events[-1].reason == "completed"
    results = [r.text for m in engine.messages for r in m.tool_results]
    assert "child_only" in results[0] and results[1] == "removed parent.txt"
    assert validate_transcript(engine.messages) == [] and validate_transcript(children[0].messages) == []


@pytest.mark.parametrize("whose", ["parent", "child"])
async def test_a_deadline_stops_a_subagent_whichever_engine_set_it(whose: str) -> None:
    """A child copies its parent's ``deadline`` and counts it from its own start; the parent's
    deadline stops it all the same (its abort reaches the child, reason "deadline"). A child's
    own deadline stops only the child: the parent gets an error result saying so and goes on."""
    slow = ScriptedResponse(text="thinking aloud " * 100, chunk=5, delay=0.1)  # 30 s of streaming
    model = ScriptedModel([delegate("long job"), slow, "The parent goes on."])
    if whose == "parent":
        engine = QueryEngine(model, tools=[delegate_tool(deadline=600.0)], policies=[], deadline=5.0)
    else:
        engine = QueryEngine(model, tools=[delegate_tool(deadline=5.0)], policies=[])
    with VirtualClock() as clock:
        start = clock.now
        events = await collect(engine, "go")
        took = clock.now - start
    ends = {e.agent_id: e for e in events if isinstance(e, TurnEnded)}
    assert ends["sub-1"].reason == "deadline" and ends["sub-1"].abort_reason == "deadline"
    assert 4.99 <= took < 6.0
    result = next(r for m in engine.messages for r in m.tool_results)
    assert result.is_error
    if whose == "parent":
        assert ends[None].reason == "deadline" and ends[None].aborted_subagents == ("sub-1",)
        assert result.text.startswith("Interrupted by user-set deadline (the run's deadline passed): this tool call was stopped")
    else:
        assert ends[None].reason == "completed" and "deadline" in result.text
        assert engine.messages[-1].text == "The parent goes on."
    assert validate_transcript(engine.messages) == []


@pytest.mark.parametrize("whose", ["parent", "own"])
async def test_a_child_stopped_by_usage_limit_says_whose_budget_ran_out(whose: str) -> None:
    """"Subagent sub-1 stopped before finishing (usage_limit)." did not say whether the child
    spent its own budget (a narrower task may fit) or the tree's (nothing more will run). The
    child's `TurnEnded.detail` says whose limit it was, and the delegate result repeats it."""

    @tool
    async def ping() -> str:
        return "pong"

    ping_call = ScriptedResponse(tool_calls=[ScriptedToolCall("ping", {})])  # 20 tokens each
    model = ScriptedModel([delegate("keep pinging"), *[ping_call] * 9, "The parent goes on."])
    if whose == "parent":
        engine = QueryEngine(model, tools=[ping, delegate_tool()], policies=[], usage_limit=100)
    else:
        engine = QueryEngine(model, tools=[ping, delegate_tool(usage_limit=40)], policies=[], usage_limit=1000)
    ends = {ev.agent_id: ev for ev in await collect(engine, "go") if isinstance(ev, TurnEnded)}
    child = ends["sub-1"]
    result = next(r for m in engine.messages for r in m.tool_results)
    assert child.reason == "usage_limit" and result.is_error
    if whose == "parent":
        assert child.detail == "the parent's usage_limit of 100 tokens (shared with its subagents) is reached"
        assert ends[None].detail == "the run's usage_limit of 100 tokens is reached"
    else:
        assert child.detail == "its own usage_limit of 40 tokens is reached"
        assert ends[None].reason == "completed" and ends[None].detail is None
    assert f"stopped before finishing (usage_limit: {child.detail})." in result.text


async def test_a_childs_retry_skipped_for_the_parents_spent_budget_names_the_parents_limit() -> None:
    """A retry a child did not make because the tree's budget was spent said "the run's
    usage_limit is reached", though the child had no limit of its own: its error and detail
    now name whose budget it was, as a limit reached between iterations does."""
    from agentloop import ModelError
    from agentloop.models import StreamText, StreamUsage, Usage

    class Overloaded:
        requests = 0

        async def stream(self, request: object, signal: object) -> AsyncIterator[object]:
            self.requests += 1
            yield StreamUsage(Usage(input_tokens=500, output_tokens=0))
            yield StreamText(0, "Let me ")
            raise ModelError("overloaded", retryable=True)

    child_model = Overloaded()
    model = ScriptedModel([delegate("look it up"), "The parent goes on."])
    task = delegate_tool(model=child_model, retry_base_delay=0, usage_limit=None)  # no budget of its own
    engine = QueryEngine(model, tools=[task], policies=[], usage_limit=100)
    ends = {ev.agent_id: ev for ev in await collect(engine, "go") if isinstance(ev, TurnEnded)}
    child = ends["sub-1"]
    whose = "the parent's usage_limit of 100 tokens (shared with its subagents) is reached"
    assert child_model.requests == 1
    assert child.reason == "usage_limit" and child.detail == whose
    assert f"(not retried: {whose})" in (child.error or "")
    assert validate_transcript(engine.messages) == []


_CHANT = "I'll do it.\nI'll execute.\n" * 60
_LOOPING = ScriptedResponse(thinking="Let me plan the fix first.\n" + _CHANT, text="Done: all fixed.", chunk=7)


@pytest.mark.parametrize("budget", [0, 1])
async def test_a_childs_answer_out_of_a_doom_loop_it_did_not_leave_comes_with_a_note(budget: int) -> None:
    """A child that kept looping after its resample budget was spent had its answer accepted as
    any other: the parent's model took it at its word. The result now says where it came from;
    a child whose loop a resample ended answers as usual."""
    model = ScriptedModel([delegate("fix the bug"), *[_LOOPING] * (budget + 1), "The parent goes on."])
    engine = QueryEngine(model, tools=[delegate_tool(doom_budget=budget)])
    await collect(engine, "go")
    result = next(r for m in engine.messages for r in m.tool_results)
    assert not result.is_error
    assert result.text.startswith("(Subagent sub-1's answer came out of a doom loop: its output kept repeating")
    assert result.text.endswith("\n\nDone: all fixed.")

    resolved = ScriptedModel([delegate("fix the bug"), _LOOPING, "Fixed it.", "The parent goes on."])
    engine = QueryEngine(resolved, tools=[delegate_tool(doom_budget=1)])
    await collect(engine, "go")
    assert next(r for m in engine.messages for r in m.tool_results).text == "Fixed it."


async def test_a_child_stopped_for_repeating_its_calls_says_so_to_the_parents_model() -> None:
    @tool
    async def ping() -> str:
        return "pong"

    ping_call = ScriptedResponse(text="Checking again.", tool_calls=[ScriptedToolCall("ping", {})])
    model = ScriptedModel([delegate("wait for it"), *[ping_call] * 12, "The parent goes on."])
    engine = QueryEngine(model, tools=[ping, delegate_tool(max_turns=20)])
    ends = {ev.agent_id: ev for ev in await collect(engine, "go") if isinstance(ev, TurnEnded)}
    assert ends["sub-1"].reason == "stationarity_ended"
    result = next(r for m in engine.messages for r in m.tool_results if r.text.startswith("Subagent"))
    assert result.is_error
    assert "stopped before finishing (stationarity_ended: Stopped: " in result.text
    assert "). It was going round in circles with its tool calls: given again unchanged, the task" in result.text
    assert result.text.endswith("Its last words: Checking again.")


async def test_last_words_out_of_a_doom_loop_come_with_the_note_too() -> None:
    @tool
    async def ping() -> str:
        return "pong"

    looping_call = replace(_LOOPING, text="3 papers so far.", tool_calls=[ScriptedToolCall("ping", {})])
    model = ScriptedModel([delegate("survey"), looping_call, "The parent goes on."])
    engine = QueryEngine(model, tools=[ping, delegate_tool(doom_budget=0, max_turns=1)])
    await collect(engine, "go")
    result = next(r for m in engine.messages for r in m.tool_results if r.text.startswith("Subagent"))
    assert result.is_error and "stopped before finishing (max_turns). Its last words: 3 papers so far. (" in result.text
    assert result.text.endswith("came out of a doom loop: its output kept repeating itself and resampling did not "
                                "stop it, so it may be cut short or padded with repeats. Check it before relying on it.)")


class _Keyed(ScriptedModel):
    """A model holding a credential, as an HTTP provider does (its key)."""

    def __init__(self, key: str, script: list[Any]) -> None:
        super().__init__(script)
        self.key = key

    def _credentials(self) -> tuple[str, ...]:
        return (self.key,)


class _KeyedHandler:
    """A tool handler holding a credential, as an MCP server's tool does."""

    def __init__(self, key: str) -> None:
        self.key = key

    def _credentials(self) -> tuple[str, ...]:
        return (self.key,)

    async def __call__(self, args: dict[str, Any], ctx: ToolContext) -> str:
        return "ok"


@pytest.mark.parametrize("change", ["model", "tools"])
async def test_a_running_childs_results_are_redacted_of_its_parents_credentials_given_meanwhile(change: str) -> None:
    """A child read its ancestors' credentials once per run: a background child that goes on
    while its parent swaps its model (a rotated key) or its tools (a new MCP server) let the
    parent's new credential through in its tool results. They are read again after a change."""
    from agentloop import Tool

    new = "parent-new-credential-0123456789"
    parent = QueryEngine(_Keyed("parent-old-credential-0123456789", ["hi"]), policies=[])

    @tool
    async def env() -> str:
        """Print the environment."""
        return f"TOKEN={new}"

    @tool
    async def rotate() -> str:
        """The parent's set-up changes while this child runs."""
        if change == "model":
            parent.model = _Keyed(new, ["hi"])
        else:
            parent.tools = [Tool("remote", "A server's tool.", {"type": "object"}, _KeyedHandler(new))]
        return "rotated"

    calls = [ScriptedToolCall("env", {}, id="before"), ScriptedToolCall("rotate", {}), ScriptedToolCall("env", {}, id="after")]
    script = [ScriptedResponse(tool_calls=[call]) for call in calls]
    child = parent.subagent(agent_id="bg", model=ScriptedModel([*script, "done"]), tools=[env, rotate])
    await collect(child, "go")
    results = {r.tool_use_id: r.text for m in child.messages for r in m.tool_results}
    assert results["before"] == f"TOKEN={new}"  # not a credential of the lineage yet
    assert results["after"] == "TOKEN=[REDACTED]"
