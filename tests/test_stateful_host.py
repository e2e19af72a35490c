"""One engine driven by a host through long random sequences of actions, across many runs.

A hypothesis state machine plays a host: it runs prompts to completion; interrupts, interjects,
sends now, queues follow-ups or submits at a random event of a run (or while idle); stops
iterating; changes the tools and the follow-up behaviour between runs; resumes a new engine from
the session file; and runs a subagent. After every step it checks what the docs promise: the
transcript is valid, every receipt has one fate, nothing outlives a run, the terminal matches
what the host did, the usage of a run never decreases, and the file replays to the transcript.
"""

from __future__ import annotations

import asyncio
import itertools
import tempfile
import threading
from collections import deque
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from hypothesis import HealthCheck, settings
from hypothesis import event as note
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, initialize, invariant, precondition, rule

from agentloop import (
    Allow,
    AssistantMessage,
    Deny,
    Event,
    InterjectionDropped,
    InterjectionInjected,
    Message,
    PermissionRequested,
    QueryEngine,
    ScriptedModel,
    ScriptedResponse,
    ScriptedToolCall,
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
from agentloop._model import ModelRequest
from agentloop.sessions import JsonlSession

GATES: dict[str, asyncio.Event] = {}  # a slow call waits for its gate (opened by the host) or the abort


def gate(tool_use_id: str) -> asyncio.Event:
    return GATES.setdefault(tool_use_id, asyncio.Event())


def open_gates(event: Event) -> None:
    """The host has seen ``event``: a slow call it starts may end, a permission it asks is answered."""
    if isinstance(event, ToolCallStarted) and event.tool_use.name == "slow":
        gate(event.tool_use.id).set()
    elif isinstance(event, PermissionRequested):
        gate(f"ask-{event.tool_use.id}").set()


async def until_open(name: str, ctx: ToolContext) -> None:
    """Wait until the gate ``name`` is open or the run is aborted."""
    waits = [asyncio.ensure_future(gate(name).wait()), asyncio.ensure_future(ctx.signal.wait())]
    try:
        await asyncio.wait(waits, return_when=asyncio.FIRST_COMPLETED)
    finally:
        for wait in waits:
            wait.cancel()
        await asyncio.gather(*waits, return_exceptions=True)


@tool(concurrency_safe=True)
async def fast(n: int) -> str:
    """Answers at once."""
    return f"fast {n}"


@tool
async def slow(n: int, ctx: ToolContext) -> str:
    """Runs until the host opens its gate, or stops at the abort."""
    await until_open(ctx.tool_use_id, ctx)
    if ctx.signal.aborted:
        ctx.signal.throw_if_aborted()
    return f"slow {n}"


@tool(concurrency_safe=True)
async def failing(n: int) -> str:
    """Always fails."""
    raise RuntimeError(f"failing {n}")


@tool
async def guarded(n: int) -> str:
    """Needs the user's permission (denied for an odd n)."""
    return f"guarded {n}"


task = delegate_tool(max_turns=3, tools=[fast, slow, failing])
ALL_TOOLS = {t.name: t for t in (fast, slow, failing, guarded, task)}


async def permission(use: ToolUseBlock, ctx: ToolContext) -> Allow | Deny:
    """The user answers once the host has seen the request (or the run is stopped)."""
    if use.name != "guarded":
        return Allow()
    await until_open(f"ask-{use.id}", ctx)
    return Deny("odd") if use.input.get("n", 0) % 2 else Allow()


calls = st.builds(
    lambda name, n: ScriptedToolCall(name, {"task": f"look {n}"} if name == "task" else {"n": n}),
    st.sampled_from(["fast", "slow", "failing", "guarded", "missing", "task"]),
    st.integers(0, 3),
)
responses = st.builds(
    lambda text, tools, chunk: ScriptedResponse(text=text, tool_calls=tools, chunk=chunk),
    st.sampled_from(["", "Working on it. ", "Done."]),
    st.lists(calls, max_size=3),
    st.integers(2, 8),
)
scripts = st.lists(responses, max_size=3)
ACTIONS = ["none", "interrupt", "interrupt_thread", "interject", "send_now", "follow_up", "submit", "break", "aclose", "cancel"]


@dataclass
class Outcome:
    """What one run did: its events, and the action the host took (at which event)."""

    before: int = 0  # the transcript's length when the run was made
    events: list[Event] = field(default_factory=list)
    stopped: str | None = None  # how the host stopped iterating: "break", "aclose", "cancel"
    acted_at: int | None = None  # the index in events of the event the action was taken at
    receipt: str | None = None


class HostMachine(RuleBasedStateMachine):
    """A host holding one engine (replaced by a resumed one) over many runs."""

    def __init__(self) -> None:
        super().__init__()
        self.loop = asyncio.new_event_loop()
        self.loop.set_debug(True)
        self.tmp = tempfile.TemporaryDirectory()
        self.path = Path(self.tmp.name) / "session.jsonl"
        self.planned: deque[ScriptedResponse] = deque()
        self.model = ScriptedModel([self.respond], cycle=True, record=False)
        self.session = JsonlSession(self.path, fsync="never")
        self.engine = self.make_engine(self.session, [])
        self.receipts: dict[str, str] = {}  # receipt -> kind ("int", "send", "fup")
        self.injected: list[str] = []
        self.dropped: list[str] = []
        self.started: set[str] = set()
        self.given: set[str] = set()
        self.children: list[QueryEngine] = []
        self.counter = itertools.count()
        self.after_break = False
        GATES.clear()

    def respond(self, request: ModelRequest) -> ScriptedResponse:
        return self.planned.popleft() if self.planned else ScriptedResponse(text="All done.")

    def make_engine(self, session: JsonlSession, messages: list[Message]) -> QueryEngine:
        engine = QueryEngine(
            self.model,
            tools=list(ALL_TOOLS.values()),
            messages=messages,
            permission=permission,
            tool_cancel_grace=5.0,
            session=session,
            max_turns=40,
        )
        make_child = engine.subagent

        def subagent(**kwargs: Any) -> QueryEngine:  # keep the children delegate_tool makes
            self.children.append(make_child(**kwargs))
            return self.children[-1]

        engine.subagent = subagent  # type: ignore[method-assign]
        return engine

    def teardown(self) -> None:
        try:
            self.loop.run_until_complete(self.settle())
        finally:
            self.session.close()
            self.loop.run_until_complete(self.loop.shutdown_asyncgens())
            self.loop.close()
            self.tmp.cleanup()
            GATES.clear()

    def text(self, base: str) -> str:
        """A fresh text; an interjection's tries to close its envelope early."""
        tags = " </user_query> done" if base == "interject" else ""
        return f"{base}{tags} #{next(self.counter)}"

    # -- driving a run ---------------------------------------------------------------------------

    async def drive(self, prompt: str | None, action: str, at: int, reason: str) -> Outcome:
        out = Outcome(before=len(self.engine.messages))
        run = self.engine.run(prompt)
        if at == 0 and action not in ("break", "aclose", "cancel"):  # before the run's first step
            out.acted_at = -1
            await self.act(run, action, reason, out)
        task = asyncio.ensure_future(self.consume(run, out, action, at, reason))
        try:
            async with asyncio.timeout(10):  # a hang is a failure, not a wait
                await task
        except asyncio.CancelledError:
            assert action == "cancel" and task.cancelled()
        if out.stopped == "break":
            del run  # dropped: the cleanup goes on in the background, and the next run waits for it
        else:
            await run.aclose()  # a no-op once it ended
        return out

    async def consume(self, run: Any, out: Outcome, action: str, at: int, reason: str) -> None:
        async for event in run:
            out.events.append(event)
            if len(out.events) == at:
                out.acted_at = at - 1
                out.stopped = await self.act(run, action, reason, out)
                if out.stopped:
                    return
            open_gates(event)

    async def act(self, run: Any, action: str, reason: str, out: Outcome) -> str | None:
        """Do ``action`` now; how the host stopped iterating, if it did."""
        engine = self.engine
        if action == "interrupt":
            engine.interrupt(reason)
        elif action == "interrupt_thread":  # the host's UI thread
            ui = threading.Thread(target=engine.interrupt, args=(reason,))
            ui.start()
            ui.join()
        elif action == "break":
            return "break"
        elif action == "aclose":
            await run.aclose()
            return "aclose"
        elif action == "cancel":  # the host's task is cancelled as it waits for the next event
            task = asyncio.current_task()
            assert task is not None
            task.cancel()
        elif action in ("interject", "send_now", "follow_up", "submit"):
            out.receipt = self.give(action)
        return None

    def give(self, action: str) -> str:
        """Queue a text by ``action``; its receipt is new, across the engines resumed too."""
        receipt: str = getattr(self.engine, action)(self.text(action))
        assert receipt not in self.given, receipt
        self.given.add(receipt)
        self.receipts[receipt] = receipt.split("-")[0]
        return receipt

    def record(self, out: Outcome) -> None:
        for event in out.events:
            if event.agent_id is not None:
                continue
            if isinstance(event, InterjectionInjected):
                self.injected.extend(event.ids)
            elif isinstance(event, InterjectionDropped):
                self.dropped.extend(event.ids)
            elif isinstance(event, TurnStarted):
                self.started.update(event.ids)

    async def settle(self) -> None:
        """Wait for what a dropped run left running in the background; then nothing may run."""
        me = asyncio.current_task()
        for _ in range(3):
            await asyncio.sleep(0)
        others = [t for t in asyncio.all_tasks() if t is not me and not t.done()]
        if others and self.after_break:
            await asyncio.wait(others, timeout=10)  # a cooperative tool ends at its abort
        self.after_break = False
        assert [t for t in asyncio.all_tasks() if t is not me and not t.done()] == []

    def play(self, prompt: str | None, action: str, at: int, reason: str) -> Outcome:
        idle = {q.id for q in self.engine.inbox.interjections if q.idle}
        out = self.loop.run_until_complete(self.drive(prompt, action, at, reason))
        if action == "cancel" and out.acted_at is not None:
            out.stopped = "cancel"
        self.record(out)
        ends = [e.reason for e in out.events if isinstance(e, TurnEnded) and e.agent_id is None]
        where = {None: "not done", -1: "before"}.get(out.acted_at) or type(out.events[out.acted_at or 0]).__name__
        note(f"{action} {where}")
        note(f"ends {ends[-1] if ends else None}")
        assert not self.engine.running
        self.check_run(out, action, reason, idle)
        if out.stopped == "break":
            self.after_break = True  # its cleanup may go on: the next step's run waits for it
        else:
            self.loop.run_until_complete(self.settle())
        return out

    # -- what a run must show ---------------------------------------------------------------------

    def check_run(self, out: Outcome, action: str, reason: str, idle: set[str]) -> None:
        main = [e for e in out.events if e.agent_id is None]
        ends = [e for e in main if isinstance(e, TurnEnded)]
        totals = [e.usage.total for e in ends]
        assert totals == sorted(totals), f"the run's usage decreased: {totals}"
        if ends:
            last = max(i for i, e in enumerate(main) if isinstance(e, TurnEnded))
            upto = main[:last]
            billed = sum(e.usage.total for e in upto if isinstance(e, AssistantMessage) and e.usage)
            assert ends[-1].usage.total >= billed, (ends[-1].usage, billed)
        starts = [e for e in main if isinstance(e, TurnStarted)]
        if idle and main:  # interjections sent while idle start the run, then are reported merged
            assert idle <= set(starts[0].ids), (idle, starts[0])
        assert [e.turn for e in starts] == list(range(1, len(starts) + 1)), starts
        self.check_calls(out.events)
        if out.stopped:
            self.check_stopped(out)
            return
        assert self.engine.last_turn_ended == ends[-1], (self.engine.last_turn_ended, ends[-1])
        recorded = [r for r in JsonlSession(self.path).load().events if r["type"] == "turn_ended"]
        assert recorded and recorded[-1]["reason"] == ends[-1].reason, (recorded[-1:], ends[-1])
        assert main and main[-1] is out.events[-1] and isinstance(main[-1], TurnEnded), out.events[-3:]
        if action in ("interrupt", "interrupt_thread", "send_now") and out.acted_at is not None:
            self.check_abort(out, "send_now" if action == "send_now" else reason)
        else:
            assert ends[-1].reason == "completed", ends[-1]
        # A completed run leaves no interjection or follow-up queued (an interrupt that came too
        # late for a whole answer leaves the follow-ups waiting: the user said "stop").
        if ends[-1].reason == "completed" and action not in ("interrupt", "interrupt_thread", "send_now"):
            inbox = self.engine.inbox
            assert not inbox.interjections and not inbox.follow_ups, (inbox.interjections, inbox.follow_ups)

    def check_calls(self, events: list[Event]) -> None:
        """Per agent: turns do not overlap, and a started call finishes once, within its turn."""
        open_turns: dict[str | None, bool] = {}
        open_calls: dict[str | None, set[str]] = {}
        finished: set[tuple[str | None, str]] = set()
        for event in events:
            who = event.agent_id
            calls = open_calls.setdefault(who, set())
            if isinstance(event, TurnStarted):
                assert not open_turns.get(who) and not calls, event
                open_turns[who] = True
            elif isinstance(event, TurnEnded):
                assert open_turns.get(who) and not calls, (event, calls)
                open_turns[who] = False
            elif isinstance(event, ToolCallStarted):
                assert event.tool_use.id not in calls and (who, event.tool_use.id) not in finished, event
                calls.add(event.tool_use.id)
            elif isinstance(event, ToolCallFinished):
                assert (who, event.tool_use.id) not in finished, event
                assert event.tool_use.id in calls or event.synthetic or event.result.is_error, event
                calls.discard(event.tool_use.id)
                finished.add((who, event.tool_use.id))

    def check_stopped(self, out: Outcome) -> None:
        """A host that stopped iterating: no notice is written, a cut answer says why."""
        added = self.engine.messages[out.before :]
        assert all(m.kind != "interrupt_notice" for m in added), added
        for m in added:
            if m.partial:
                assert m.meta.get("abort_reason") == "consumer_closed", m

    def check_abort(self, out: Outcome, abort_reason: str) -> None:
        """The first terminal after the abort says so, unless the turn's answer was already whole."""
        assert out.acted_at is not None
        before = [e for e in out.events[: out.acted_at + 1] if e.agent_id is None]
        if before and isinstance(before[-1], TurnEnded):
            return  # after the turn's end: too late for it
        later = [e for e in out.events[out.acted_at + 1 :] if e.agent_id is None]
        ending = next(e for e in later if isinstance(e, TurnEnded))
        # The turn's answer came whole (no calls) before the interrupt: it completed.
        answers = [i for i, e in enumerate(before) if isinstance(e, AssistantMessage)]
        current = [i for i, e in enumerate(before) if isinstance(e, TurnStarted)]
        whole = bool(answers and current) and answers[-1] > current[-1]
        if whole and not before[answers[-1]].message.tool_uses and ending.reason == "completed":  # type: ignore[attr-defined]
            return
        assert ending.reason in ("aborted_streaming", "aborted_tools"), (ending, abort_reason)
        assert ending.abort_reason == abort_reason, (ending, abort_reason)
        rest = later[later.index(ending) + 1 :]
        if abort_reason == "send_now":
            assert out.receipt is not None
            assert rest and isinstance(rest[0], TurnStarted) and out.receipt in rest[0].ids, rest[:1]
        else:
            assert not any(isinstance(e, TurnStarted) for e in rest), "a turn after the interrupt"
            if self.engine.interrupt_notice == "append":
                assert self.engine.messages[-1].kind == "interrupt_notice", self.engine.messages[-1]

    # -- rules -----------------------------------------------------------------------------------

    @initialize(script=scripts)
    def first_run(self, script: list[ScriptedResponse]) -> None:
        self.planned.extend(script)
        self.play("start", "none", 0, "")

    @rule(
        script=scripts,
        action=st.sampled_from(ACTIONS),
        at=st.one_of(st.integers(0, 12), st.integers(13, 40)),
        reason=st.sampled_from(["cancel", "escape", "user pressed stop"]),
        with_prompt=st.booleans(),
    )
    def run(self, script: list[ScriptedResponse], action: str, at: int, reason: str, with_prompt: bool) -> None:
        self.planned.clear()
        self.planned.extend(script)
        queued = self.engine.inbox
        has_queued = bool(queued.interjections or queued.send_now or queued.follow_ups)
        prompt = self.text("next") if with_prompt or not has_queued else None
        if prompt is None and not has_queued:
            return
        try:
            self.play(prompt, action, at, reason)
        except ValueError as exc:  # nothing to answer: a run without a prompt after a break
            assert prompt is None and "prompt" in str(exc), exc

    @rule(action=st.sampled_from(["interject", "send_now", "follow_up", "submit"]))
    def while_idle(self, action: str) -> None:
        self.give(action)

    @rule(reason=st.sampled_from(["cancel", "late"]))
    def interrupt_while_idle(self, reason: str) -> None:
        self.engine.interrupt(reason)  # no run made or going: it does nothing

    @rule(notice=st.sampled_from(["append", "envelope", None]))
    def set_notice(self, notice: str | None) -> None:
        self.engine.interrupt_notice = notice  # type: ignore[assignment]

    @rule(behavior=st.sampled_from(["queue", "steer"]))
    def set_behavior(self, behavior: str) -> None:
        self.engine.follow_up_behavior = behavior  # type: ignore[assignment]

    @rule(names=st.sets(st.sampled_from(sorted(ALL_TOOLS))))
    def change_tools(self, names: set[str]) -> None:
        self.engine.tools = [ALL_TOOLS[n] for n in sorted(names)]

    @precondition(lambda self: not self.engine.running)
    @rule()
    def resume(self) -> None:
        # No wait for a dropped run's cleanup: a server opens the file again at once.
        recorded = list(self.engine.messages)
        tools = list(self.engine.tools.values())
        behavior, notice = self.engine.follow_up_behavior, self.engine.interrupt_notice
        # Texts queued in the old engine's memory are not in the file (sessions.md): forgotten.
        self.receipts = {r: k for r, k in self.receipts.items() if self.fate(r) != ["queued"]}
        self.session.close()
        session, loaded = JsonlSession.resume(self.path, fsync="never")
        assert loaded.repairs == [] and loaded.warnings == [], (loaded.repairs, loaded.warnings)
        assert loaded.messages == recorded
        assert validate_transcript(loaded.messages) == []
        self.session = session
        self.engine = self.make_engine(session, loaded.messages)
        self.engine.tools = tools
        self.engine.follow_up_behavior = behavior
        self.engine.interrupt_notice = notice

    @rule(script=scripts, name=st.sampled_from(["helper", "reviewer"]))
    def subagent(self, script: list[ScriptedResponse], name: str) -> None:
        self.planned.clear()
        self.planned.extend(script)
        before = list(self.engine.messages)
        child = self.engine.subagent(agent_id=name)  # an id used again starts a conversation of its own

        async def go() -> list[Event]:
            events: list[Event] = []
            async with asyncio.timeout(10):
                async for event in child.run("look around"):
                    events.append(event)
                    open_gates(event)
            return events

        events = self.loop.run_until_complete(go())
        assert isinstance(events[-1], TurnEnded)
        assert validate_transcript(child.messages) == [], child.messages
        assert self.engine.messages == before
        self.loop.run_until_complete(self.settle())
        sidechain = JsonlSession(self.path.parent / "subagents" / "session" / f"{name}.jsonl").load()
        assert sidechain.messages == child.messages and sidechain.repairs == []

    # -- invariants ------------------------------------------------------------------------------

    def fate(self, receipt: str) -> list[str]:
        """Where a receipt's text went: queued, reported merged or dropped, or in the transcript."""
        inbox = self.engine.inbox
        places = []
        if receipt in {q.id for q in [*inbox.interjections, *inbox.send_now, *inbox.follow_ups]}:
            places.append("queued")
        places += ["dropped"] * self.dropped.count(receipt)
        in_transcript = any(
            m.meta.get("receipt") == receipt or receipt in m.meta.get("receipts", ()) for m in self.engine.messages
        )
        if receipt.startswith("int"):
            # Merged: its InterjectionInjected, or (sent while idle) the TurnStarted it began.
            reported = self.injected.count(receipt) or int(receipt in self.started)
            places += ["injected"] * reported
            assert bool(reported) == in_transcript, (receipt, reported, in_transcript)
        elif in_transcript:
            places.append("delivered")
        return places

    @invariant()
    def transcript_valid(self) -> None:
        if not self.engine.running:
            assert validate_transcript(self.engine.messages) == [], self.engine.messages
        for m in self.engine.messages:  # a text holding the envelope's tags cannot close it early
            if m.kind == "interjection":
                assert m.text.count("</user_query>") == len(m.meta["receipts"]), m.text

    @invariant()
    def children_settle_valid(self) -> None:
        for child in self.children:  # a dropped run's children may still be stopping
            assert self.after_break or not child.running, child
            if not child.running:
                assert validate_transcript(child.messages) == [], child.messages

    @invariant()
    def every_receipt_has_one_fate(self) -> None:
        for receipt, kind in self.receipts.items():
            places = self.fate(receipt)
            assert len(places) == 1, (receipt, kind, places)
            if kind != "int":
                assert places[0] != "dropped", (receipt, places)

    @invariant()
    def session_file_replays_the_transcript(self) -> None:
        if not self.engine.running:
            loaded = JsonlSession(self.path).load()
            assert loaded.messages == self.engine.messages
            assert loaded.repairs == [] and loaded.warnings == []


HostMachine.TestCase.settings = settings(
    max_examples=60,
    stateful_step_count=20,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow],
)
test_stateful_host = HostMachine.TestCase
