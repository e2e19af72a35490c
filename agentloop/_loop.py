"""The loop: the only one in agentloop.

    drive(run)                      one run() call: one or more turns         (_turns: open_run)
      turn                          a user message until a terminal           (_turns: start_turn)
        [limits]                    abort / max_turns / usage / deadline      (SPEC §8)
        [safe point] interjections  top of every iteration                    (SPEC §5)
        model phase                 stream -> deltas; retries; doom resamples (_streaming; checkpoint 1)
        [checkpoint 2]              aborted? then no tool starts              (_before_tools)
        tool phase                  batches, each followed by checkpoint 3    (_toolphase; the loop)
                                    and, after the results, a safe point
        policies                    nudge / end turn                          (_after_tools)
        [safe point] before ending  queued interjections keep the turn going  (_before_tools)
      end of turn                   results settled, notice, TurnEnded        (_ending: end_turn)
      next turn                     a send-now text, or follow-ups            (_turns: next_turn)
    end of run                      nothing it started outlives it            (_ending: finish)

Invariant: whenever the loop yields, every message in ``engine.messages`` is
committed and final; the only thing not yet in the transcript is the current
attempt's streamed output and the results owed to the last assistant message,
both held in the `RunState`, from which `settle_now` builds valid messages
synchronously (so even a host that stops iterating leaves a valid transcript).
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncGenerator
from types import AsyncGeneratorType
from typing import TYPE_CHECKING

from ._accumulate import APPLY, CUT_BY
from ._commit import abort_terminal, drain_interjections, flush_nudges, settle_results
from ._ending import end_turn, finish
from ._events import Event, TerminalReason
from ._executor import plan_batches
from ._messages import Message, ToolResultBlock, ToolUseBlock
from ._policy import EndTurn, Nudge, ask
from ._run import Aborted, usage_spent
from ._run import current_task_of as current_task
from ._streaming import ModelPhase, close_stream
from ._toolphase import Batch, end_tools, start_tools
from ._turns import deadline_passed, next_turn, open_run, start_turn

if TYPE_CHECKING:
    from ._engine import QueryEngine
    from ._run import RunState

__all__ = ["drive"]

# The checks made on every iteration read ``signal._reason is not None`` rather than the
# ``signal.aborted`` property, without a Python call (Python 3.11 does not specialise a property
# read), and the loop reads it about five times per iteration. They differ only while an abort
# that has won (``_once`` holds its claim) has not yet recorded its reason, a few bytecodes on
# another thread or in a signal handler: a check made then sees the abort a moment later, as
# if it had come a moment later, and its listener still wakes the loop.


async def drive(engine: QueryEngine, prompt: str | Message | None, token: object) -> AsyncGenerator[Event, None]:
    """One `run()`: turns until one ends without a follow-up or a send-now message.

    Longer than the rest on purpose: this is where the run's events are yielded from, and so
    where every await that produces them is written out: the model stream's, the back-off
    sleep's and the tool mailbox's. A phase moved into a generator of its own would cost each
    of its events one more resumption, and each call added on the path of an iteration costs
    ~0.5-2k instructions of the ~254k an iteration takes (`benchmarks/callgrind_overhead.py`).
    So the synchronous steps are named functions (here, in `_turns`, `_streaming`,
    `_toolphase`, `_commit`, `_ending`) and what remains reads as the module's outline above.
    """
    st, starts = await open_run(engine, prompt, token)
    queued = len(starts) - isinstance(prompt, str | Message) if starts is not None else 0
    stopped = False
    loop = st.loop
    try:
        while starts is not None:
            yield start_turn(engine, st, starts, queued, stopped)
            if st.injected is not None:  # interjections queued before the run, in its first turn
                injected, st.injected = st.injected, None
                yield injected
            reason: TerminalReason | None = None
            while reason is None:
                # Limits first: with no request to follow, a merged interjection would go unanswered.
                # It stays queued, and the turn's end reports it dropped with the limit as reason.
                reason = _limit_reached(engine, st)
                if reason is not None:
                    break
                if engine.inbox.interjections:  # safe point: top of the iteration
                    for event in drain_interjections(engine, st):
                        yield event
                if st.nudges:  # a policy's reminder goes with the request it was given for
                    for event in flush_nudges(engine, st):
                        yield event
                if engine._tool_watchers:
                    engine._refresh_tools()
                st.turns += 1
                # The model phase (see _streaming.ModelPhase): attempts until one is committed or
                # the phase ends. The loop awaits the stream itself: no generator level between.
                phase = ModelPhase(engine, st)
                while True:
                    stream = phase.open()
                    # The count of deltas held back from a tapped watcher (`Hold.skip`) is counted
                    # down in a local and written back only for the watcher's call, which reads and
                    # sets it: a held-back delta costs a test and a decrement of a local (7
                    # bytecodes), not two attribute tests and a read-modify-write of one (15).
                    skip = phase.skip
                    armed: asyncio.Handle | None = None
                    try:
                        while stream is not None:
                            if st.signal._reason is not None:  # aborted while the host held an event
                                # The read is cancelled once it waits, so the model's stream ends
                                # as on any abort; one that came back without waiting is cut here.
                                if armed is not None:
                                    armed.cancel()
                                    phase.outcome.aborted = True
                                    break
                                armed = loop.call_soon(st.cancel_read)
                            task = st.task = current_task(loop)
                            baseline = st.cancel_baseline = task.cancelling() if task is not None else 0
                            if baseline < st.host_cancels:  # the host took back a cancel it began under
                                st.lower_host_cancels(task, baseline)
                            st.guarding = True
                            try:
                                streamed = await anext(stream)
                                apply = APPLY.get(type(streamed))  # acc.feed(event), one call less
                                shown = apply(phase.acc, streamed) if apply is not None else phase.acc.other(streamed)
                            except StopAsyncIteration:
                                if type(stream) is AsyncGeneratorType:  # ran to its end: closed already
                                    stream = None
                                break
                            except asyncio.CancelledError:
                                if not st.consume_cancel():
                                    if task is None or task.cancelling() > st.cancels_before(task):  # the run's task's
                                        raise
                                    phase.cancelled_itself()  # nobody cancelled the run: a failure
                                    break
                                phase.outcome.aborted = True
                                break
                            except Exception as exc:
                                if task is not None and st.cancelled_meanwhile(task):
                                    # The stream turned a cancel of the run's task into this
                                    # error (a transport's close failing as the cancel unwound it):
                                    # the cancel goes on, not a retry or a model error.
                                    raise asyncio.CancelledError from exc
                                phase.failed(exc)
                                break
                            finally:
                                st.guarding = False
                                if st._cancel_requested:  # the stream caught our abort's cancel
                                    st.take_back_cancel()  # before the host holds an event
                            if shown is not None:
                                yield shown
                                if skip:  # a delta the tapped watcher reads from the accumulator later
                                    skip -= 1
                                    continue
                            if phase.watch is not None:  # called here: one call per event, not two
                                phase.skip = skip  # the count left, which the watcher reads and sets
                                try:
                                    verdict = phase.watch(streamed)
                                except Exception:
                                    phase.watch_raised()
                                    verdict = None
                                skip = phase.skip
                                if verdict is not None:
                                    for detected in phase.judged(verdict):
                                        yield detected
                                    if phase.outcome.cut is not None:
                                        break
                    finally:
                        if armed is not None:  # not for a later read's wait
                            armed.cancel()
                        if stream is not None:
                            await close_stream(engine, stream)
                    for event in phase.conclude():
                        yield event
                    if phase.delay is None:
                        break
                    if phase.delay > 0:
                        try:
                            await st.guarded(asyncio.sleep(phase.delay))
                        except Aborted:
                            st.terminal = abort_terminal(st)
                            break
                del phase, stream  # spent: not held while the tools run
                uses = _before_tools(engine, st) if st.terminal is None else []
                if uses:  # the tool phase (see _toolphase)
                    runner = start_tools(engine, st)
                    # Interjections stay queued until merged after the results, so a host that stops
                    # iterating mid-phase loses none; a batch that ends unaborted is the safe point.
                    merge = False
                    # Checkpoint 2 (in _before_tools) guards the first batch: nothing awaits between.
                    for batch in plan_batches(uses, engine.tools, engine.options.max_parallel_tools):
                        calls = Batch(engine, st, runner, batch)
                        try:
                            while calls.waiting:  # one list of events per wake-up
                                for event in calls.receive(await st.mailbox.get()):
                                    yield event
                        finally:
                            for timer in calls.timers:  # the grace timers an abort started, if any
                                timer.cancel()
                        if st.signal._reason is not None:  # checkpoint 3: the next batch does not start
                            break
                        merge = True
                    for event in end_tools(engine, st):
                        yield event
                    # The batch is judged before a person's message merged now resets the counts
                    # (SPEC §7): it ran before the model read that message, so it belongs to the
                    # run before it, not to the next. A policy that ends the turn on it leaves
                    # the message queued, reported dropped with that reason, as a limit does.
                    _after_tools(engine, st, uses)
                    # Then the queued interjections, only now taken: a host that stops at a result
                    # the phase synthesized leaves them queued (the next run delivers them), not
                    # merged behind an InterjectionInjected it never sees.
                    if merge and st.terminal is None and engine.inbox.interjections and _limit_reached(engine, st) is None:
                        for event in drain_interjections(engine, st):
                            yield event
                if st.pending_events:  # a policy ended the turn before its calls ran
                    for event in st.take_pending_events():
                        yield event
                reason = st.terminal
            for event in await end_turn(engine, st, reason):
                yield event
            stopped = st.signal.aborted  # what next_turn decides by: read once
            starts = next_turn(engine, st, stopped)
            queued = len(starts) if starts is not None else 0
    finally:
        await finish(engine, st)


def _limit_reached(engine: QueryEngine, st: RunState) -> TerminalReason | None:
    """The terminal of a limit that ends the turn here, if any (a deadline that has passed by the
    clock expires the run here); for ``usage_limit``, ``st.detail`` then says whose budget ran
    out (the engine's own, or one above it that its subagents share)."""
    opts = engine.options
    handle = st.deadline_handle
    if handle is not None and not st.expired and st.loop.time() >= handle.when():
        # Its timer may not have had its turn yet (nothing in the run has waited since the
        # deadline passed, or it is 0): the deadline is the clock's, not the timer's.
        deadline_passed(st)
    if st.signal._reason is not None:
        return abort_terminal(st)
    if opts.max_turns is not None and st.turns >= opts.max_turns:
        return "max_turns"
    if opts.usage_limit is not None or engine.parent is not None:  # a budget of its own or the tree's
        detail = usage_spent(engine, st.tokens)
        if detail is not None:
            st.detail = detail
            return "usage_limit"
    return None


def _before_tools(engine: QueryEngine, st: RunState) -> list[ToolUseBlock]:
    """Judge the accepted response; return the calls to run (checkpoint 2 included)."""
    message = st.response
    uses = st.owed if message is not None else []  # the response's calls, listed when it was committed
    if engine.policies and message is not None:
        verdicts = ask(engine.policies, "on_response", message, engine=engine)
        end = next((v for _, v in verdicts if isinstance(v, EndTurn)), None)
        # An interrupt that has come by now wins over the policy: the turn ends as it would with
        # no policy (checkpoint 2 below), with the abort's terminal, notice and hooks.
        if end is not None and not st.signal.aborted:
            st.terminal, st.detail = end.reason, end.message
            st.pending_events = settle_results(engine, st, not_run=f"Not run: {end.message}")
            return []
        st.nudges += [(name, v) for name, v in verdicts if isinstance(v, Nudge)]
    if uses and message is not None and message.meta.get("stop_reason") == "refusal" and st.signal._reason is None:
        # A refused response's calls do not run: the model did not finish it, and a provider may
        # leave it out of later requests (Anthropic does), results and all. Answered as not run,
        # the response then ends the turn as one without calls does.
        st.pending_events = settle_results(engine, st, not_run=f"Not run: {CUT_BY['refusal']}.")
        uses = []
    if not uses:
        # Safe point: a queued message keeps the turn going. So does a response the server
        # paused (stop reason "pause_turn": its own tools ran long), which the next request,
        # the transcript as it is, lets go on.
        if not engine.inbox.interjections and not st.paused:
            st.terminal = "completed"
        else:  # the turn goes on: an empty response's note (`ModelPhase`) is for a turn it ends
            st.detail = None
        return []
    if st.signal._reason is not None:  # checkpoint 2: no tool starts
        st.phase = "tools"
        st.terminal = abort_terminal(st)
        return []
    return uses


def _after_tools(engine: QueryEngine, st: RunState, uses: list[ToolUseBlock]) -> None:
    """Judge the results; nudges wait in ``st`` for the next request, if the turn makes one.

    The policies get each result whole, also one the transcript holds cut (a poller's progress
    may lie in the part cut out)."""
    uncut = st.uncut
    if uncut is not None:
        st.uncut = None
    if st.signal._reason is not None:
        st.terminal = abort_terminal(st)
        return
    if engine.policies:
        _judge_results(engine, st, uses, uncut)


def _judge_results(engine: QueryEngine, st: RunState, uses: list[ToolUseBlock], uncut: dict[str, ToolResultBlock] | None) -> None:
    """The policies' ``on_results``. A function of its own: its comprehensions' free variables
    are cells, which `_after_tools` would otherwise make on every iteration."""
    assert st.response is not None
    last = st.last_results
    results = [last[u.id] for u in uses] if uncut is None else [uncut.get(u.id) or last[u.id] for u in uses]
    for name, verdict in ask(engine.policies, "on_results", st.response, results, engine=engine):
        if isinstance(verdict, EndTurn):
            if st.terminal is None:  # the first policy to end the turn speaks, as in on_response
                st.terminal, st.detail = verdict.reason, verdict.message
        elif isinstance(verdict, Nudge):
            st.nudges.append((name, verdict))
    if st.terminal is not None and st.signal._reason is not None:
        # An interrupt that came as the policies judged wins, as in `_before_tools`: the turn
        # ends with the abort's terminal, notice and hooks.
        st.terminal, st.detail = abort_terminal(st), None
