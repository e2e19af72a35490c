"""One stateful policy object passed to two engines whose runs overlap (a list made once and
handed to every engine a server makes): both runs stay protected, and nothing raises."""

from __future__ import annotations

import asyncio
import faulthandler
import logging
import os
import threading
from collections.abc import AsyncIterator, Sequence
from typing import Any, ClassVar

import pytest
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st

from agentloop import (
    DoomLoopDetected,
    Event,
    QueryEngine,
    ScriptedModel,
    ScriptedResponse,
    ScriptedToolCall,
    TurnEnded,
    TurnStarted,
    tool,
)
from agentloop.policies import (
    ConservativeDoomLoopPolicy,
    IdenticalToolCallRun,
    Policy,
    RepeatedErrorResult,
    ToolCallCycle,
)

CHANT = "I'll do it.\nI'll execute.\n" * 60
LOOPING = ScriptedResponse(thinking="Let me plan the fix first.\n" + CHANT, text="never shown", chunk=7)
GOOD = ScriptedResponse(thinking="A fresh plan.", text="Fixed it.")


async def _in_lockstep(*runs: AsyncIterator[Event], order: Sequence[int] = ()) -> list[list[Event]]:
    """Step the runs one event at a time until all have ended, in one task, with no timing
    involved: in turn, or first as ``order`` says (indexes into ``runs``), so their streams
    interleave delta by delta."""
    got: list[list[Event]] = [[] for _ in runs]
    live = list(range(len(runs)))
    schedule = iter(order)
    while live:
        i = next(schedule, live[0]) % len(runs)
        if i not in live:
            i = live[0]
        try:
            got[i].append(await anext(runs[i]))
        except StopAsyncIteration:
            live.remove(i)
        else:
            live.append(live.pop(live.index(i)))  # the others go next, unless ``order`` says
    return got


def _engine(policies: list[Policy]) -> QueryEngine:
    return QueryEngine(ScriptedModel([LOOPING, GOOD]), policies=policies, retry_base_delay=0.001)


@settings(max_examples=30, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(order=st.lists(st.integers(0, 1), max_size=400))
@example(order=[])  # strictly in turn
@example(order=[0] * 15)  # the first attempt well under way when the second begins
async def test_a_doom_loop_policy_shared_by_two_running_engines_catches_the_loop_in_both(
    order: list[int], caplog: pytest.LogCaptureFixture
) -> None:
    caplog.clear()
    shared: list[Policy] = [ConservativeDoomLoopPolicy()]
    first, second = _engine(shared), _engine(shared)
    with caplog.at_level(logging.WARNING, logger="agentloop"):
        runs = await _in_lockstep(first.run("fix it"), second.run("fix it"), order=order)
    assert [r.getMessage() for r in caplog.records if r.levelno >= logging.ERROR] == []
    for events in runs:
        detected = [e for e in events if isinstance(e, DoomLoopDetected)]
        assert [(d.confident, d.action) for d in detected] == [(True, "resample")]
        end = events[-1]
        assert isinstance(end, TurnEnded) and end.reason == "completed"
    assert [m.text for m in first.messages] == [m.text for m in second.messages] == ["fix it", "Fixed it."]
    # Unless one run ended before the other began, the engine whose run began second forked it.
    forked = [e for e in (first, second) if e.policies[0] is not shared[0]]
    warned = [r.getMessage() for r in caplog.records if "two engines at once" in r.getMessage()]
    assert len(forked) == len(warned) <= 1
    assert all("uses its own policy.fork()" in w for w in warned)
    if len(order) < 20:  # neither run can end (27 events) before the other begins
        assert len(forked) == 1
    if order == []:  # in turn: the second engine's run began second
        assert forked == [second]


@tool
async def read_file(path: str) -> str:
    """Read a file."""
    raise FileNotFoundError(path)


def _stuck_engine(policies: list[Policy], paths: str, **kw: Any) -> QueryEngine:
    """Its model reads ``paths`` in turn (one letter a file), for ever; each read fails alike."""
    calls = [ScriptedResponse(tool_calls=[ScriptedToolCall("read_file", {"path": p})]) for p in paths * 40]
    kw.setdefault("max_turns", 40)
    return QueryEngine(ScriptedModel(calls[:40]), tools=[read_file], policies=policies, **kw)


@pytest.mark.parametrize(
    ("make", "paths"), [(IdenticalToolCallRun, "a"), (ToolCallCycle, "ab"), (RepeatedErrorResult, "a")]
)
async def test_a_stationarity_policy_shared_by_two_running_engines_stops_each_at_its_own_count(
    make: type[Policy], paths: str, caplog: pytest.LogCaptureFixture
) -> None:
    alone = [e async for e in _stuck_engine([make()], paths).run("go")][-1]
    shared: list[Policy] = [make()]
    with caplog.at_level(logging.WARNING, logger="agentloop"):
        runs = await _in_lockstep(_stuck_engine(shared, paths).run("go"), _stuck_engine(shared, paths).run("go"))
    assert [r.getMessage() for r in caplog.records if r.levelno >= logging.ERROR] == []
    assert isinstance(alone, TurnEnded) and alone.reason == "stationarity_ended"
    for events in runs:
        end = events[-1]
        assert isinstance(end, TurnEnded) and (end.reason, end.turns) == (alone.reason, alone.turns)


async def test_the_fork_a_resumed_run_takes_counts_the_calls_its_own_transcript_made_already() -> None:
    """A run that adds nothing to a transcript ending in five identical failed calls is stopped
    after the calls that make twelve, as alone, though another engine's run held the policy."""
    begun = _stuck_engine([IdenticalToolCallRun()], "a", max_turns=5)
    async for _event in begun.run("go"):
        pass
    assert begun.last_turn_ended is not None and begun.last_turn_ended.reason == "max_turns"
    alone = [e async for e in _stuck_engine([IdenticalToolCallRun()], "a", messages=begun.messages).run()][-1]
    assert isinstance(alone, TurnEnded) and (alone.reason, alone.turns) == ("stationarity_ended", 7)
    shared: list[Policy] = [IdenticalToolCallRun()]
    resumed = _stuck_engine(shared, "a", messages=begun.messages)
    other = _stuck_engine(shared, "a").run("go")
    first = await anext(other)  # its run holds the policy now
    runs = await _in_lockstep(other, resumed.run())
    ends = [e for run in runs for e in run[-1:] if isinstance(e, TurnEnded)]
    assert isinstance(first, TurnStarted)
    assert [(e.reason, e.turns) for e in ends] == [("stationarity_ended", 12), ("stationarity_ended", 7)]


class _OneForTheTree(ConservativeDoomLoopPolicy):
    """A policy whose fork is itself: one object meant to serve a whole tree of engines."""

    def fork(self) -> Policy:
        return self


class _Unforkable(ConservativeDoomLoopPolicy):
    """A policy whose fork fails (it would hold a lock, a client)."""

    def fork(self) -> Policy:
        raise TypeError("cannot copy the client")


@pytest.mark.parametrize(("make", "gives"), [(_OneForTheTree, "the policy itself"), (_Unforkable, "an error")])
async def test_a_shared_doom_loop_policy_that_cannot_be_forked_is_warned_about_and_never_raises(
    make: type[Policy], gives: str, caplog: pytest.LogCaptureFixture
) -> None:
    shared: list[Policy] = [make()]
    first, second = _engine(shared), _engine(shared)
    with caplog.at_level(logging.WARNING, logger="agentloop"):
        runs = await _in_lockstep(first.run("fix it"), second.run("fix it"))
    assert [r.getMessage() for r in caplog.records if r.levelno >= logging.ERROR] == []
    warned = [r.getMessage() for r in caplog.records if "two engines at once" in r.getMessage()]
    assert len(warned) == 1 and f"its fork() gives {gives}" in warned[0] and "neither is judged right" in warned[0]
    assert first.policies == second.policies == shared  # shared still: there is no copy to give either
    assert [type(r[-1]).__name__ for r in runs] == ["TurnEnded", "TurnEnded"]


@tool(stationarity="tight")
async def read_same(path: str) -> str:
    """Read a file that never changes."""
    return "same"


def _reads(n: int) -> list[ScriptedResponse | str]:
    return [ScriptedResponse(tool_calls=[ScriptedToolCall("read_same", {"path": "a"})]) for _ in range(n)]


@pytest.mark.parametrize("made", ["none", "without_tools", "over_a_transcript", "tools_changed"])
async def test_an_engine_made_with_a_policy_another_engines_run_holds_leaves_that_run_alone(made: str) -> None:
    """Only a run's start took a fork: an engine made with the shared list meanwhile (a server
    making one per request from a module-level list) bound the policy to its own tools, or
    caught it up on its own transcript, under the other engine's run, which was then stopped
    at the wrong turn (12 turns, or 2, for its 8)."""
    shared: list[Policy] = [IdenticalToolCallRun()]
    first = QueryEngine(ScriptedModel(_reads(30)), tools=[read_same], policies=shared, max_turns=30)
    idle = QueryEngine(ScriptedModel([]), tools=[read_same], policies=shared)  # made before the run
    run = first.run("go")
    await anext(run)
    if made == "without_tools":
        QueryEngine(ScriptedModel(["hi"]), tools=[], policies=shared)
    elif made == "over_a_transcript":
        earlier = QueryEngine(ScriptedModel(_reads(6)), tools=[read_same], policies=[], max_turns=6)
        async for _event in earlier.run("go"):
            pass
        QueryEngine(ScriptedModel([]), tools=[read_same], policies=shared, messages=earlier.messages)
    elif made == "tools_changed":
        idle.tools = []  # its tools change while the first engine's run holds the policy
    events = [e async for e in run]
    end = events[-1]
    assert isinstance(end, TurnEnded) and (end.reason, end.turns) == ("stationarity_ended", 8)


def test_two_threads_starting_runs_over_one_policy_at_once_never_both_take_it(
    monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    """Engines in two threads (each with its event loop, as a threaded server runs them) given
    one policy list: the claim of a run looked whether another run held a policy, then took
    it, and a second thread's run starting between the two took it as well: both runs wrote
    into one policy's counts. The claim is atomic now: the second run waits, and forks."""
    import threading

    from agentloop import _policy

    first_checked, go_on, first_may_end = threading.Event(), threading.Event(), threading.Event()
    shared = [IdenticalToolCallRun()]

    def hold(request: Any) -> str:
        assert first_may_end.wait(30)  # the first run holds its policy until the second's claim is over
        return "done"

    first = QueryEngine(ScriptedModel([hold]), policies=shared)
    second = QueryEngine(ScriptedModel(["done"]), policies=shared)
    real = _policy._held_elsewhere

    def held_elsewhere(policy: Any, engine: object) -> bool:
        found = real(policy, engine)
        if engine is first and not first_checked.is_set():  # the first claim looked, and has not taken it yet
            first_checked.set()
            assert go_on.wait(30)
        return found

    monkeypatch.setattr(_policy, "_held_elsewhere", held_elsewhere)
    claiming = getattr(_policy, "_claiming", None)
    if claiming is not None:

        class Noted:
            """The claims' lock: the second thread waiting on it lets the first claim go on."""

            def __enter__(self) -> None:
                if threading.current_thread() is second_thread:
                    go_on.set()
                claiming.__enter__()

            def __exit__(self, *exc: object) -> None:
                claiming.__exit__(*exc)

        monkeypatch.setattr(_policy, "_claiming", Noted())

    def run_second() -> None:
        try:
            assert first_checked.wait(30)
            asyncio.run(_drain(second))
        finally:
            go_on.set()
            first_may_end.set()

    second_thread = threading.Thread(target=run_second)
    second_thread.start()
    try:
        with caplog.at_level(logging.WARNING, logger="agentloop"):
            asyncio.run(_drain(first))
    finally:
        go_on.set()
        first_may_end.set()
        second_thread.join(30)
    assert first.policies[0] is shared[0]
    assert second.policies[0] is not shared[0]  # the second run forked its own
    assert "used by two engines at once" in caplog.text


async def _drain(engine: QueryEngine) -> None:
    async for _ in engine.run("hi"):
        pass


@pytest.mark.skipif(not hasattr(os, "fork"), reason="os.fork")
def test_a_child_forked_while_another_thread_claims_policies_runs_with_policies() -> None:
    """A process forked while a thread of it was claiming its run's policies: the child's copy
    of the claims' lock stayed held by a thread it does not have, and every run of the child
    that had a stateful policy waited for it for ever."""
    from agentloop import _policy

    held, done = threading.Event(), threading.Event()

    def claiming() -> None:  # a run starting in another thread, inside its claim as the fork happens
        with _policy._claiming:
            held.set()
            done.wait(30)

    other = threading.Thread(target=claiming)
    other.start()
    try:
        assert held.wait(10)
        code = os.fork()
        if code == 0:  # the child: exit status 0 if its run ends, whatever happens
            status = 2
            try:
                faulthandler.dump_traceback_later(20, exit=True)  # a deadlock ends the child too
                engine = QueryEngine(ScriptedModel(["ok"]), policies=[IdenticalToolCallRun()])
                asyncio.run(_drain(engine))
                status = 0 if engine.messages[-1].text == "ok" else 1
            finally:
                os._exit(status)
        _, status = os.waitpid(code, 0)
    finally:
        done.set()
        other.join()
    assert os.waitstatus_to_exitcode(status) == 0


class _WaitingFork(IdenticalToolCallRun):
    """A policy whose fork() waits for another thread's run to have started (the host's code:
    it may wait on anything)."""

    started = threading.Event()
    waited: ClassVar[list[bool]] = []

    def fork(self) -> Policy:
        other = QueryEngine(ScriptedModel([self._started]), policies=[IdenticalToolCallRun()])
        thread = threading.Thread(target=lambda: asyncio.run(_drain(other)))
        thread.start()
        self.waited.append(self.started.wait(10))  # bounded: the old claim waited here for ever
        thread.join(30)
        return super().fork()

    def _started(self, request: Any) -> str:
        self.started.set()  # the other thread's run is past its start (and its claim)
        return "ok"


def test_a_policy_fork_waiting_on_another_threads_run_start_does_not_deadlock() -> None:
    """A run forking a policy another engine's run held called fork() with the process-wide
    claims' lock held: every other thread's run start waited behind it, and a fork() waiting
    for one of them never returned."""
    shared = [_WaitingFork()]
    first = QueryEngine(ScriptedModel(["done"]), policies=shared)
    second = QueryEngine(ScriptedModel(["done"]), policies=shared)

    async def main() -> None:
        run = first.run("hi")
        await run.__anext__()  # the first run holds the policy
        await _drain(second)
        async for _ in run:
            pass

    asyncio.run(main())
    assert _WaitingFork.waited == [True]
    assert second.policies[0] is not shared[0]


def test_an_engine_made_over_a_policy_another_threads_run_claims_never_shares_it(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """An engine made (binding its tools, catching up on its transcript) over a policy list a
    run in another thread claims at that moment: the engine's check and the run's take were
    not one step, so both could write into one policy. One of the two gets a fork."""
    from agentloop import _policy

    shared = [IdenticalToolCallRun()]
    runner = QueryEngine(ScriptedModel(["done"]), policies=shared)
    binding, claimed = threading.Event(), threading.Event()
    real_bind = _policy.bind_all

    def bind_all(policies: Any, engine: Any, *, strict: bool = False) -> None:
        if engine is not runner and not binding.is_set():  # the new engine, past its check
            binding.set()
            claimed.wait(5)  # the run's claim, if it may go on, comes now
        real_bind(policies, engine, strict=strict)

    monkeypatch.setattr(_policy, "bind_all", bind_all)
    monkeypatch.setattr("agentloop._engine.bind_all", bind_all)
    real_claim = _policy.claim

    def claim(policies: Any, engine: Any) -> Any:
        try:
            return real_claim(policies, engine)
        finally:
            claimed.set()

    monkeypatch.setattr("agentloop._turns.claim", claim)

    def run_other() -> None:
        assert binding.wait(10)
        asyncio.run(_drain(runner))

    thread = threading.Thread(target=run_other)
    thread.start()
    made = QueryEngine(ScriptedModel(["done"]), messages=[], policies=shared)
    thread.join(30)
    assert made.policies[0] is not runner.policies[0]


class _PooledFork(IdenticalToolCallRun):
    """A policy whose fork hands out one spare object from a pool, the same one every time."""

    spare: ClassVar[Policy | None] = None

    def fork(self) -> Policy:
        assert _PooledFork.spare is not None
        return _PooledFork.spare


@pytest.mark.parametrize("when", ["made", "run"])
async def test_a_fork_that_is_a_policy_another_engines_run_holds_is_not_shared_with_it(
    when: str, caplog: pytest.LogCaptureFixture
) -> None:
    """fork() gave a policy another engine's run was using (a pool's spare already handed out):
    the engine made, or whose run started, took it as its own, so both engines wrote into one
    stateful policy. It is refused as a fork, with a warning that names the problem."""
    spare = _PooledFork.spare = _PooledFork()
    shared: list[Policy] = [_PooledFork()]
    owner = QueryEngine(ScriptedModel(_reads(30)), tools=[read_same], policies=[spare], max_turns=30)
    holder = QueryEngine(ScriptedModel(_reads(30)), tools=[read_same], policies=shared, max_turns=30)
    owning, holding = owner.run("go"), holder.run("go")
    await anext(owning), await anext(holding)  # each run holds its policy now
    with caplog.at_level(logging.WARNING, logger="agentloop"):
        if when == "made":
            third = QueryEngine(ScriptedModel(["hi"]), tools=[], policies=shared)
        else:
            third = QueryEngine(ScriptedModel(_reads(3)), tools=[read_same], policies=[shared[0]], max_turns=3)
            runs = await _in_lockstep(third.run("go"), order=[0])
            assert isinstance(runs[0][-1], TurnEnded)
    assert third.policies[0] is not spare
    warned = [r.getMessage() for r in caplog.records if "two engines at once" in r.getMessage()]
    assert len(warned) == 1 and "another engine is using" in warned[0]
    events = [e async for e in owning]
    end = events[-1]
    assert isinstance(end, TurnEnded) and (end.reason, end.turns) == ("stationarity_ended", 8)
    await holding.aclose()


async def test_a_refused_fork_after_a_forked_one_is_warned_about_too(caplog: pytest.LogCaptureFixture) -> None:
    """One flag per policy served both warnings: once a fork was taken and warned about, a later
    fork refused (the pool's spare, now held by the first fork's run) shared the policy between
    two runs without a word. Each outcome is warned about once per policy."""
    spare = _PooledFork.spare = _PooledFork()
    shared: list[Policy] = [_PooledFork()]
    holder = QueryEngine(ScriptedModel(_reads(30)), tools=[read_same], policies=shared, max_turns=30)
    holding = holder.run("go")
    await anext(holding)  # the holder's run holds the policy
    with caplog.at_level(logging.WARNING, logger="agentloop"):
        forked = QueryEngine(ScriptedModel(_reads(30)), tools=[read_same], policies=shared, max_turns=30)
        assert forked.policies[0] is spare  # the fork is taken
        running = forked.run("go")
        await anext(running)  # its run holds the spare now
        refused = QueryEngine(ScriptedModel(["hi"]), tools=[], policies=shared)
        again = QueryEngine(ScriptedModel(["hi"]), tools=[], policies=shared)
    assert refused.policies[0] is not spare and again.policies[0] is not spare
    warned = [r.getMessage() for r in caplog.records if "two engines at once" in r.getMessage()]
    assert len(warned) == 2, warned
    assert "now uses its own policy.fork()" in warned[0] and "another engine is using" in warned[1]
    await running.aclose()
    await holding.aclose()
