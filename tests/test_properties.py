"""The central invariant, checked on random sessions under random interrupts.

Random scripted sessions (text, thinking, parallel and serial tools with random
durations, permission prompts), a random interrupt instant and a random reason.
After run(): the transcript is valid, every tool_use has exactly one result,
partial text is kept when the abort hit mid-text, and nothing is left running.

Two more properties: a host doing everything at once (steering, send-now,
follow-ups, interrupts from the loop and from a thread, stopping the iteration
three ways or at a call's result, failing and looping attempts, subagents, a deadline, a usage limit,
a session file), and a model whose stream breaks the protocol in any way.
"""

from __future__ import annotations

import asyncio
import tempfile
import threading
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from hypothesis import event as note_case
from hypothesis import given, settings
from hypothesis import strategies as st

from agentloop import (
    AbortSignal,
    Allow,
    AssistantMessage,
    Deny,
    InterjectionDropped,
    InterjectionInjected,
    ModelError,
    QueryEngine,
    ScriptedModel,
    ScriptedResponse,
    ScriptedToolCall,
    TextDelta,
    ToolCallFinished,
    ToolCallStarted,
    ToolContext,
    ToolUseBlock,
    TurnEnded,
    TurnStarted,
    delegate_tool,
    tool,
    validate_transcript,
)
from agentloop._model import (
    ModelRequest,
    StreamBlockStop,
    StreamEnd,
    StreamEvent,
    StreamRedactedThinking,
    StreamSignals,
    StreamSignature,
    StreamText,
    StreamThinking,
    StreamToolInput,
    StreamToolUseStart,
)
from agentloop.sessions import JsonlSession

RUNNING_TOOLS: set[asyncio.Task[object] | None] = set()  # the tools below while they run
TOOL_STARTS: list[Callable[[], None]] = []  # called as each of them starts


def tool_started() -> None:
    RUNNING_TOOLS.add(asyncio.current_task())
    for hook in TOOL_STARTS:
        hook()


@tool(concurrency_safe=True)
async def fast(ms: int, ctx: ToolContext) -> str:
    """Cooperative: stops at the abort."""
    tool_started()
    try:
        async with asyncio.timeout(ms / 1000):
            await ctx.signal.wait()
    except TimeoutError:
        return f"fast {ms}"
    finally:
        RUNNING_TOOLS.discard(asyncio.current_task())
    return "stopped early"


@tool
async def serial(ms: int) -> str:
    """Ignores the signal: only cancellation stops it."""
    tool_started()
    try:
        await asyncio.sleep(ms / 1000)
    finally:
        RUNNING_TOOLS.discard(asyncio.current_task())
    return f"serial {ms}"


@tool(concurrency_safe=True)
async def failing(ms: int) -> str:
    raise RuntimeError(f"failed after {ms}")


class Tracking:
    """Wraps a model and counts streams that were opened but never closed."""

    def __init__(self, inner: ScriptedModel) -> None:
        self.inner = inner
        self.open = 0

    async def stream(self, request: ModelRequest, signal: AbortSignal) -> AsyncIterator[StreamEvent]:
        self.open += 1
        try:
            async for event in self.inner.stream(request, signal):
                yield event
        finally:
            self.open -= 1


@dataclass
class Plan:
    responses: list[ScriptedResponse]
    trigger: tuple[str, int]  # ("event", k), ("timer", ms) or ("tool", k): as the k-th tool starts
    reason: str
    permission: bool


calls = st.builds(
    lambda name, ms: ScriptedToolCall(name, {"ms": ms}),
    st.sampled_from(["fast", "serial", "failing", "missing"]),
    st.integers(0, 4),
)
responses = st.builds(
    lambda text, thinking, signed, tools, chunk, delay: ScriptedResponse(
        text=text, thinking=thinking, sign_thinking=signed, tool_calls=tools, chunk=chunk, delay=delay
    ),
    st.sampled_from(["", "Looking at it. ", "Done, all tests pass.  ", "Running the tools now."]),
    st.sampled_from(["", "think think"]),
    st.booleans(),
    st.lists(calls, max_size=4),
    st.integers(1, 8),
    st.sampled_from([0.0, 0.0, 0.0005]),
)


def with_tools_to_interrupt(plan: Plan) -> Plan:
    """A plan that interrupts as its k-th tool starts has its first response start k tools."""
    kind, k = plan.trigger
    if kind == "tool":
        slow = [ScriptedToolCall("serial" if i % 2 else "fast", {"ms": 4}) for i in range(k)]
        plan.responses.insert(0, ScriptedResponse(text="Starting. ", tool_calls=slow))
    return plan


plans = st.builds(
    Plan,
    st.lists(responses, min_size=1, max_size=4),
    st.one_of(
        st.tuples(st.just("event"), st.integers(1, 25)),
        st.tuples(st.just("timer"), st.integers(0, 6)),
        st.tuples(st.just("tool"), st.integers(1, 3)),
    ),
    st.sampled_from(["cancel", "send_now", "escape"]),
    st.booleans(),
).map(with_tools_to_interrupt)


async def permission(use: ToolUseBlock, ctx: ToolContext) -> Allow | Deny:
    await asyncio.sleep(0.0005)
    return Deny("no") if use.input.get("ms") == 3 else Allow()


async def drive(engine: QueryEngine, at_event: int, interrupt: Callable[[], None]) -> list[str]:
    """Runs ``engine``, interrupting at its ``at_event``-th event; the partial texts streamed."""
    streamed = ""
    partial_seen: list[str] = []
    count = 0
    async for event in engine.run("start"):
        count += 1
        if count == at_event:
            interrupt()
        if isinstance(event, (TurnStarted, AssistantMessage)):
            streamed = ""
        elif isinstance(event, TextDelta):
            streamed += event.text
        elif isinstance(event, TurnEnded) and event.reason == "aborted_streaming" and streamed.strip():
            partial_seen.append(streamed)
    return partial_seen


async def play(plan: Plan) -> None:
    model = Tracking(ScriptedModel([*plan.responses, "Final answer.", "After send-now."], cycle=True))
    engine = QueryEngine(
        model,
        tools=[fast, serial, failing],
        policies=[],
        tool_cancel_grace=0.01,
        permission=permission if plan.permission else None,
        max_turns=6,
    )

    def interrupt() -> None:
        landed.append("mid-tool" if RUNNING_TOOLS else "streaming" if engine.running else "after the run")
        if plan.reason == "send_now":
            engine.send_now("new instructions")
        else:
            engine.interrupt(plan.reason)

    landed: list[str] = []
    kind, when = plan.trigger
    timer = asyncio.get_running_loop().call_later(when / 1000, interrupt) if kind == "timer" else None
    starts = 0

    def on_tool_start() -> None:
        nonlocal starts
        starts += 1
        if kind == "tool" and starts == when:
            asyncio.get_running_loop().call_soon(interrupt)  # once the tool is waiting

    TOOL_STARTS.append(on_tool_start)
    try:
        partial_seen = await drive(engine, when if kind == "event" else -1, interrupt)
    finally:
        TOOL_STARTS.remove(on_tool_start)
    if timer is not None:
        timer.cancel()
    note_case(f"interrupt {landed[0] if landed else 'never made'}")

    assert validate_transcript(engine.messages) == []
    uses = [b.id for m in engine.messages for b in m.tool_uses]
    answered = [b.tool_use_id for m in engine.messages for b in m.tool_results]
    assert sorted(uses) == sorted(answered) and len(set(answered)) == len(answered)
    partials = [m.text for m in engine.messages if m.partial]
    for seen in partial_seen:
        assert any(p.rstrip() == seen.rstrip() for p in partials), (seen, partials)
    assert model.open == 0, "a model stream was left open"
    assert not engine.running
    for _ in range(3):
        await asyncio.sleep(0)
    me = asyncio.current_task()
    assert [t for t in asyncio.all_tasks() if t is not me and not t.done()] == []


@settings(max_examples=150)
@given(plans)
def test_property_transcript_valid_under_any_interrupt_timing(plan: Plan) -> None:
    asyncio.run(play(plan), debug=True)


# -- a host doing everything at once ------------------------------------------------------------

ACTIONS = ["interject", "send_now", "follow_up", "interrupt", "interrupt_thread", "break", "aclose", "cancel", "break_at_result"]

with_errors = st.one_of(
    responses,
    st.just(ScriptedResponse(text="Delegating.", tool_calls=[ScriptedToolCall("task", {"task": "look around"})])),
    st.just(ScriptedResponse(thinking="Let me check the file again. " * 16, chunk=16)),  # a doom loop: resampled
    st.builds(
        lambda after, retryable: ScriptedResponse(
            text="Partial answer that fails", chunk=4, error=ModelError("upstream hiccup", retryable=retryable), error_after=after
        ),
        st.integers(0, 6),
        st.booleans(),
    ),
)


@dataclass
class HostPlan:
    responses: list[ScriptedResponse]
    actions: list[tuple[int, str]]  # (event count, action), in any order
    permission: bool
    policies: bool  # the stock policies: doom-loop resamples and stationarity verdicts
    deadline: float | None = None  # seconds: the run ends with "deadline" wherever it is
    usage_limit: int | None = None  # tokens: ScriptedModel counts 20 per response


host_plans = st.builds(
    HostPlan,
    st.lists(with_errors, min_size=1, max_size=4),
    st.lists(st.tuples(st.integers(1, 30), st.sampled_from(ACTIONS)), max_size=5),
    st.booleans(),
    st.booleans(),
    st.one_of(st.none(), st.sampled_from([0.0005, 0.002, 0.01])),
    st.one_of(st.none(), st.sampled_from([20, 40, 60])),
)


async def host(plan: HostPlan) -> None:
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "session.jsonl"
        with JsonlSession(path) as session:
            engine = await host_with(plan, session)
        # The file replays to exactly the transcript the engine ended with, with nothing to repair.
        loaded = JsonlSession(path).load()
        assert loaded.repairs == [] and loaded.warnings == []
        assert loaded.messages == engine.messages


async def host_with(plan: HostPlan, session: JsonlSession) -> QueryEngine:
    model = Tracking(ScriptedModel([*plan.responses, "Final answer."], cycle=True))
    engine = QueryEngine(
        model,
        tools=[fast, serial, failing, delegate_tool(max_turns=3, tools=[fast, serial, failing])],
        policies=None if plan.policies else [],
        tool_cancel_grace=0.01,
        permission=permission if plan.permission else None,
        retry_base_delay=0.0005,
        retry_max_delay=0.001,
        max_turns=8,
        session=session,
        deadline=plan.deadline,
        usage_limit=plan.usage_limit,
    )
    children: list[QueryEngine] = []
    make_child = engine.subagent

    def subagent(**kwargs: Any) -> QueryEngine:
        children.append(make_child(**kwargs))
        return children[-1]

    engine.subagent = subagent  # type: ignore[method-assign]
    receipts: dict[str, str] = {}  # receipt -> kind
    injected: list[str] = []
    dropped: list[str] = []
    events = engine.run("start")

    # Per agent (None: the engine itself; a subagent's events come tagged with its id).
    turn_open: dict[str | None, bool] = {}
    calls_open: dict[str | None, set[str]] = {}
    finished: list[tuple[str | None, str]] = []

    stop_at_result = False  # "break_at_result": a host that stops at the next call's result (a failed one, say)

    async def consume() -> None:
        nonlocal stop_at_result
        count = 0
        async for event in events:
            count += 1
            if stop_at_result and isinstance(event, ToolCallFinished) and event.agent_id is None:
                return
            # The event protocol: turns do not overlap, a started call finishes once, in its turn.
            who = event.agent_id
            open_calls = calls_open.setdefault(who, set())
            if isinstance(event, TurnStarted):
                assert not turn_open.get(who) and not open_calls
                turn_open[who] = True
            elif isinstance(event, TurnEnded):
                assert turn_open.get(who) and not open_calls, (event, open_calls)
                turn_open[who] = False
                if event.reason.startswith("aborted"):
                    assert event.abort_reason is not None, event  # an abort always says whose
            elif isinstance(event, ToolCallStarted):
                key = (who, event.tool_use.id)
                assert event.tool_use.id not in open_calls and key not in finished
                open_calls.add(event.tool_use.id)
            elif isinstance(event, ToolCallFinished):
                key = (who, event.tool_use.id)
                assert key not in finished
                assert event.tool_use.id in open_calls or event.synthetic or event.result.is_error
                open_calls.discard(event.tool_use.id)
                finished.append(key)
            if isinstance(event, InterjectionInjected):
                injected.extend(event.ids)
            elif isinstance(event, InterjectionDropped):
                dropped.extend(event.ids)
            for when, action in plan.actions:
                if when != count:
                    continue
                if action == "interject":
                    receipts[engine.interject(f"note {count}")] = action
                elif action == "send_now":
                    receipts[engine.send_now(f"instead {count}")] = action
                elif action == "follow_up":
                    receipts[engine.follow_up(f"then {count}")] = action
                elif action == "interrupt":
                    engine.interrupt("host")
                elif action == "interrupt_thread":  # a host's UI thread
                    ui = threading.Thread(target=engine.interrupt, args=("host",))
                    ui.start()
                    ui.join()
                elif action == "aclose":
                    await events.aclose()
                    return
                elif action == "break":
                    return
                elif action == "break_at_result":
                    stop_at_result = True
                else:  # "cancel": the host's task is cancelled while it awaits the next event
                    me = asyncio.current_task()
                    assert me is not None
                    me.cancel()

    task = asyncio.ensure_future(consume())
    try:
        await task
    except asyncio.CancelledError:
        assert task.cancelled()
    await events.aclose()  # a no-op when it already ended

    assert validate_transcript(engine.messages) == []
    uses = [b.id for m in engine.messages for b in m.tool_uses]
    answered = [b.tool_use_id for m in engine.messages for b in m.tool_results]
    assert sorted(uses) == sorted(answered) and len(set(answered)) == len(answered)
    assert model.open == 0, "a model stream was left open"
    assert not engine.running
    for child in children:  # a subagent stops with its parent and leaves a valid transcript
        assert not child.running
        assert validate_transcript(child.messages) == [], child.messages
    # Nothing the host queued is lost: every receipt was delivered, reported dropped, or waits.
    delivered = {str(m.meta.get("receipt")) for m in engine.messages if m.meta}
    queued = {q.id for q in [*engine.inbox.interjections, *engine.inbox.send_now, *engine.inbox.follow_ups]}
    for receipt, kind in receipts.items():
        places = [receipt in delivered, receipt in queued, receipt in injected, receipt in dropped]
        assert sum(places) == 1, (receipt, kind, places)
    # The next run delivers what waits: every send-now starts it; a follow-up runs after a turn
    # that completed, and otherwise keeps waiting.
    if engine.inbox.send_now or engine.inbox.follow_ups:
        sends = {q.id for q in engine.inbox.send_now}
        waiting = sends | {q.id for q in engine.inbox.follow_ups}
        async for _event in engine.run():
            pass
        delivered = {str(m.meta.get("receipt")) for m in engine.messages if m.meta}
        still = {q.id for q in engine.inbox.follow_ups}
        assert sends <= delivered and waiting <= delivered | still, (waiting, delivered, still)
        assert not delivered & still
        assert validate_transcript(engine.messages) == []
        assert model.open == 0 and not engine.running
    for _ in range(3):
        await asyncio.sleep(0)
    me = asyncio.current_task()
    assert [t for t in asyncio.all_tasks() if t is not me and not t.done()] == []
    return engine


@settings(max_examples=150)
@given(host_plans)
def test_property_host_actions_at_random_events_lose_nothing(plan: HostPlan) -> None:
    """Interjections, send-now, follow-ups, interrupts, a host that stops iterating (break,
    aclose, a cancelled task) and failing model attempts, at random events, in any mix."""
    asyncio.run(host(plan), debug=True)


# -- a model that breaks the stream protocol ------------------------------------------------------

_index = st.integers(0, 3)
stream_events = st.one_of(
    st.builds(StreamText, _index, st.sampled_from(["", " ", "Hello ", "world.\n", "  "])),
    st.builds(StreamThinking, _index, st.sampled_from(["", "hmm ", "think"])),
    st.builds(StreamSignature, _index, st.sampled_from(["", "sig"])),
    st.builds(StreamRedactedThinking, _index, st.just("opaque")),
    st.builds(StreamToolUseStart, _index, st.sampled_from(["t1", "t2", "t1", ""]), st.sampled_from(["fast", "failing", "missing", ""])),
    st.builds(StreamToolInput, _index, st.sampled_from(['{"ms": 1}', '{"ms"', ": 2}", "", "[1]", "null", '{"ms": "x"}', "}"])),
    st.builds(StreamBlockStop, _index),
    st.builds(StreamSignals, st.just(("tail_repetition:8@thinking", "nonsense"))),
    st.builds(StreamEnd, st.sampled_from([None, "end_turn", "tool_use", "max_tokens", "refusal"])),
)


@settings(max_examples=300)
@given(st.lists(st.lists(stream_events, max_size=14), min_size=1, max_size=3))
def test_property_any_stream_event_sequence_ends_cleanly(scripts: list[list[StreamEvent]]) -> None:
    """Out-of-order blocks, reused ids, empty names, broken tool JSON, events after the end, no
    end at all: every run ends with a terminal and a transcript a provider accepts."""

    async def main() -> None:
        model = Tracking(ScriptedModel([*(ScriptedResponse(events=e) for e in scripts), "Final answer."], cycle=True))
        engine = QueryEngine(model, tools=[fast, failing], policies=None, max_turns=5, retry_budget=1, retry_base_delay=0.0005)
        events = [event async for event in engine.run("start")]
        assert isinstance(events[-1], TurnEnded)
        assert validate_transcript(engine.messages) == [], engine.messages
        uses = [b.id for m in engine.messages for b in m.tool_uses]
        answered = [b.tool_use_id for m in engine.messages for b in m.tool_results]
        assert sorted(uses) == sorted(answered) and len(set(answered)) == len(answered)
        assert model.open == 0 and not engine.running

    asyncio.run(main(), debug=True)
