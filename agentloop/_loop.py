"""The loop: the only one in agentloop.

    drive(run)                      one run() call: one or more turns
      turn                          a user message until a terminal
        [safe point] interjections  top of every iteration
        [limits]                    abort / max_turns / usage / deadline
        model phase                 stream -> deltas; retries; doom resamples   (checkpoint 1)
        [checkpoint 2]              aborted? then no tool starts
        tool phase                  batches, each followed by checkpoint 3 and a safe point
        policies                    nudge / end turn
        [safe point] before ending  queued interjections keep the turn going

Invariant: whenever the loop yields, every message in ``engine.messages`` is
committed and final; the only thing not yet in the transcript is the current
attempt's streamed output and the results owed to the last assistant message,
both held in the `RunState`, from which `settle` builds valid messages
synchronously (so even a host that stops iterating leaves a valid transcript).
"""

from __future__ import annotations

import asyncio
import logging
import threading
from collections.abc import AsyncGenerator
from types import AsyncGeneratorType
from typing import TYPE_CHECKING

from ._abort import AbortController
from ._accumulate import APPLY
from ._commit import (
    abort_terminal,
    drain_interjections,
    envelope_due,
    flush_nudges,
    interrupt_notice,
    settle_partial,
    settle_results,
    strip_final,
)
from ._events import Event, InterjectionDropped, TerminalReason, TurnEnded, TurnStarted
from ._executor import plan_batches
from ._inbox import envelope
from ._messages import Message, TextBlock, ToolUseBlock
from ._policy import EndTurn, Nudge, Verdict, claim, notify, release
from ._run import Aborted, NextRun, RunState, abandon, over_ancestor_limit
from ._run import current_task_of as current_task
from ._streaming import ModelPhase, close_stream
from ._toolphase import Batch, end_tools, record_finished, start_tools
from ._transcript import encodable_message, is_valid
from ._unicode import scrub

if TYPE_CHECKING:
    from ._engine import QueryEngine

log = logging.getLogger("agentloop")


async def drive(engine: QueryEngine, prompt: str | Message | None, token: object) -> AsyncGenerator[Event, None]:
    """One `run()`: turns until one ends without a follow-up or a send-now message.

    The turn loop, and the tool phase's wait for its calls, are written out here rather than
    in nested generators: every generator level costs each event one more resumption.
    """
    previous = engine._state
    if previous is not None and previous.loop is not asyncio.get_running_loop():
        _left_in_another_loop(engine, previous)
    if previous is not None and previous.finishing and engine._closing is not None:
        # The previous run is still cleaning up. Meanwhile interrupt() and aclose() reach this
        # run, through the controller its first turn will use.
        waiting = engine._next_run = NextRun(token, AbortController(parent=engine._link_signal()))
        try:
            await asyncio.shield(engine._closing)
            st, starts = _begin(engine, prompt, token, waiting)
        except BaseException:  # cancelled while it waited, or refused: its controller goes unused
            waiting.controller.unlink()
            raise
        finally:
            if engine._next_run is waiting:  # cleared once the run's state is in place (or it failed)
                engine._next_run = None
    else:
        st, starts = _begin(engine, prompt, token)
    queued = len(starts) - isinstance(prompt, str | Message) if starts is not None else 0
    stopped = False
    loop = st.loop
    try:
        while starts is not None:
            yield _start_turn(engine, st, starts, queued, stopped)
            reason: TerminalReason | None = None
            while reason is None:
                if engine.inbox.interjections:  # safe point: top of the iteration
                    for event in drain_interjections(engine, st):
                        yield event
                reason = _limit_reached(engine, st)
                if reason is not None:
                    break
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
                    try:
                        while stream is not None:
                            task = st.task = current_task(loop)
                            st.cancel_baseline = task.cancelling() if task is not None else 0
                            st.guarding = True
                            try:
                                streamed = await anext(stream)
                                apply = APPLY.get(type(streamed))  # acc.feed(event), one call less
                                shown = apply(phase.acc, streamed) if apply is not None else None
                            except StopAsyncIteration:
                                if type(stream) is AsyncGeneratorType:  # ran to its end: closed already
                                    stream = None
                                break
                            except asyncio.CancelledError:
                                if not st.consume_cancel():
                                    raise
                                phase.outcome.aborted = True
                                break
                            except Exception as exc:
                                phase.failed(exc)
                                break
                            finally:
                                st.guarding = False
                            if shown is not None:
                                yield shown
                            if phase.watch is not None:  # called here: one call per event, not two
                                if phase.skip and shown is not None:  # a delta it reads from the accumulator
                                    phase.skip -= 1
                                    continue
                                try:
                                    verdict = phase.watch(streamed)
                                except Exception:
                                    phase.watch_raised()
                                    verdict = None
                                if verdict is not None:
                                    detected = phase.judged(verdict)
                                    if detected is not None:
                                        yield detected
                                    elif phase.outcome.cut is not None:
                                        break
                    finally:
                        if stream is not None:
                            await close_stream(stream)
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
                    for batch in plan_batches(uses, engine.tools, engine.options.max_parallel_tools):
                        if st.signal.aborted:  # checkpoint 3: the next batch does not start
                            break
                        calls = Batch(engine, st, runner, batch)
                        try:
                            while calls.waiting:  # one list of events per wake-up
                                for event in calls.receive(await st.mailbox.get()):
                                    yield event
                        finally:
                            calls.close()
                        merge = merge or not st.signal.aborted
                    for event in end_tools(engine, st):
                        yield event
                    # Then the queued interjections, only now taken: a host that stops at a result
                    # the phase synthesized leaves them queued (the next run delivers them), not
                    # merged behind an InterjectionInjected it never sees.
                    if merge and engine.inbox.interjections:
                        for event in drain_interjections(engine, st):
                            yield event
                    _after_tools(engine, st, uses)
                if st.pending_events:  # a policy ended the turn before its calls ran
                    for event in st.take_pending_events():
                        yield event
                reason = st.terminal
            for event in await _end_turn(engine, st, reason):
                yield event
            stopped = st.signal.aborted  # what _next_turn decides by: read once
            starts = _next_turn(engine, st, stopped)
            queued = len(starts) if starts is not None else 0
    finally:
        await _finish(engine, st)


def _begin(
    engine: QueryEngine, prompt: str | Message | None, token: object, waited: NextRun | None = None
) -> tuple[RunState, list[Message] | None]:
    if engine._state is not None:
        raise RuntimeError(
            "a run is already in progress on this engine (one you stopped iterating but still hold "
            "ends when you await its aclose() or drop it)"
        )
    engine._claim_store()
    try:
        engine._vet_history()
        engine._catch_up_session()
        starts = _first_turn(engine, prompt)
        controller = waited.controller if waited is not None else AbortController(parent=engine._link_signal())
    except BaseException:  # refused: the store is free again
        engine._release_store()
        raise
    st = RunState(controller, asyncio.current_task())
    st.token = token
    if waited is not None and waited.closed:  # aclose() from another task while it waited
        st.finishing = True
    if engine._start_pending:  # a background child's run: its parent's abort may have come first
        early = engine._take_abort_at_start()
        if early is not None:
            st.controller.abort(early)
    engine._state = st
    early = engine._take_fresh_abort(token)  # an interrupt() between run() and this first step
    if early is not None:
        st.controller.abort(early)
    if engine.policies:
        claim(engine.policies, engine)
    engine._closing = st.loop.create_future()
    if engine.options.deadline is not None:
        st.deadline_handle = st.loop.call_later(engine.options.deadline, _deadline_passed, st)
    return st, starts


def _start_turn(
    engine: QueryEngine, st: RunState, starts: list[Message], queued: int, stopped: bool
) -> TurnStarted:
    """Begin a turn with ``starts``, whose first ``queued`` messages come from the inbox
    (``stopped``: the spent turn's signal had aborted when the inbox was read)."""
    # The first turn uses the run's controller; a later one (send-now, follow-up) gets a fresh one.
    spent = st.signal
    st.new_turn(AbortController(parent=engine._link_signal()) if st.turn_index else None)
    if spent is not st.signal and not stopped and spent.reason not in (None, "send_now"):
        # interrupt() from another thread found the spent turn still in place, after the inbox
        # was read: the stop was meant for this turn. (A send_now's stop never is: it stops the
        # turn it interrupted, and the text it queued starts a turn of its own.)
        st.controller.abort(spent.reason)
    held, st.stop_next = st.stop_next, None
    if held is not None:  # interrupt() after the send_now that stopped the spent turn: "stop" came last
        st.controller.abort(held)
    for message in starts:
        engine._commit(message)
    # A prompt the host marked synthetic (an automatic "continue") is no person's, as in a resume.
    real_user = any(map(_by_person, starts)) or _unanswered_person(engine.messages)
    notify(engine.policies, "begin_turn", real_user=real_user)
    ids = tuple(m.meta["receipt"] for m in starts[:queued])
    return TurnStarted(turn=st.turn_index, prompt=starts[-1] if starts else None, ids=ids)


def catch_up_policies(engine: QueryEngine) -> None:
    """A new engine over a saved transcript (a headless worker resuming its session after a
    restart): its policies are shown what the model did since the last request a person made,
    as if they had watched it, their verdicts dropped (the nudges they would give are in the
    transcript already). So a run that adds nothing gets no fresh allowance after
    ``stationarity_ended``, as a run again on the same engine gets none; a run that brings a
    person's message resets the counts at its ``begin_turn`` as always."""
    messages = engine.messages
    start = next((i + 1 for i in range(len(messages) - 1, -1, -1) if _by_person(messages[i])), 0)
    for i in range(start, len(messages)):
        message = messages[i]
        if message.role != "assistant":
            continue
        _ask_policies(engine, "on_response", message)
        uses = message.tool_uses
        if uses and i + 1 < len(messages):
            given = {r.tool_use_id: r for r in messages[i + 1].tool_results}
            results = [given.get(u.id) for u in uses]
            if all(r is not None for r in results):
                _ask_policies(engine, "on_results", message, results)


def _by_person(message: Message) -> bool:
    """A request a person made: their own message, or an interjection the library wrapped."""
    if message.role != "user" or (message.synthetic and message.kind != "interjection"):
        return False
    return not any(b.type == "tool_result" for b in message.content)


def _unanswered_person(messages: list[Message]) -> bool:
    """True when the transcript ends with a message a person wrote (a host appended it itself).

    A resume that adds nothing (the transcript ends with tool results, say) is not a new request
    from anyone: it keeps the policies' counts, so a host that runs again after
    ``stationarity_ended`` does not hand the loop a fresh allowance. Queued interjections are
    a person's words too (merging them calls ``begin_turn`` itself, and a transcript that ends
    with one is a request not answered yet)."""
    return bool(messages) and _by_person(messages[-1])


def _deadline_passed(st: RunState) -> None:
    st.expired = True
    st.controller.abort("deadline")


def consumer_gone(engine: QueryEngine, token: object) -> None:
    """The host stopped iterating: abort with "consumer_closed" and settle now (sync)."""
    st = engine._state
    if st is None or st.token is not token or st.closed:
        return
    if st.turn_over:
        # Stopped after the turn's TurnEnded: nothing to settle, and no further turn. Marked, so
        # that a run() begun at once waits for the cleanup rather than finding a run in progress.
        st.finishing = True
        return
    if threading.get_ident() != getattr(st.loop, "_thread_id", threading.get_ident()):
        # Dropped (garbage-collected) in another thread: settle on the loop's own thread.
        st.loop.call_soon_threadsafe(consumer_gone, engine, token)
        return
    _settle_now(engine, st)


def _settle_now(engine: QueryEngine, st: RunState) -> None:
    st.finishing = True
    st.controller.abort("consumer_closed")
    settle_partial(engine, st)
    record_finished(engine, st)
    settle_results(engine, st)
    strip_final(engine)


def _left_in_another_loop(engine: QueryEngine, st: RunState) -> None:
    """A new run finds the last one bound to another event loop.

    If that loop was closed before the run could end (closed without shutting down its
    async generators, as a hand-made loop or a thread's often is), the run never will:
    settle what it left and forget it, so the engine serves the new loop. A loop still
    open may yet end its run: RuntimeError.
    """
    if not st.loop.is_closed():
        raise RuntimeError(
            "a run of this engine is in progress in another event loop: end it there (iterate it "
            "to its end, or await its aclose()) before starting one in this loop"
        )
    forget_closed_run(engine, st)


def forget_closed_run(engine: QueryEngine, st: RunState) -> None:
    """Settle what a run left in a closed event loop left, and forget it (sync)."""
    if not (st.closed or st.turn_over):
        _settle_now(engine, st)
    st.close()
    engine._state = None
    engine._closing = None
    engine._release_store()


def close_elsewhere(engine: QueryEngine, token: object) -> None:
    """``aclose()`` while another task is inside the loop: abort and start no further turn.

    The loop, still driven by that task, settles the transcript and ends the run itself.
    """
    waiting = engine._next_run
    if waiting is not None and waiting.token is token:  # it waits for the last run's cleanup
        waiting.closed = True
        waiting.controller.abort("consumer_closed")
        return
    st = engine._state
    if st is None or st.token is not token or st.closed:
        return
    st.finishing = True
    st.controller.abort("consumer_closed")


# -- turns -------------------------------------------------------------------


def _user(engine: QueryEngine, text: str, wrap: bool, **fields: object) -> Message:
    if wrap:
        text = envelope(engine.options.texts.interrupt_envelope, [text])
    return Message.user(text, **fields)


def _first_turn(engine: QueryEngine, prompt: str | Message | None) -> list[Message]:
    if isinstance(prompt, Message):
        if prompt.role != "user":
            raise ValueError("run() takes a user message as its prompt")
        given = _vetted_prompt(encodable_message(prompt))
        # Texts sent now while the engine was idle start the run: they were typed first.
        queued = _take_starts(engine, follow_ups=False)
        if not queued and envelope_due(engine):
            given[0] = _in_envelope(engine, given[0])
        return [*queued, *given]
    if isinstance(prompt, str):
        if not prompt.strip():  # it would be a blank user message, which providers refuse
            raise ValueError("run() needs a prompt with text in it (or None, to resume)")
        queued = _take_starts(engine, follow_ups=False)
        wrap = not queued and envelope_due(engine)
        return [*queued, _user(engine, scrub(prompt), wrap)]  # queued texts were scrubbed when queued
    if prompt is not None:
        raise TypeError(f"run() takes a str or a Message, not {type(prompt).__name__}")
    queued = _take_starts(engine, follow_ups=True)
    if queued:
        return queued
    if engine.inbox.interjections or (engine.messages and engine.messages[-1].role == "user"):
        return []  # resume: the transcript (or the queue) already holds the input
    raise ValueError("run() needs a prompt: the transcript does not end with a user message")


def _vetted_prompt(prompt: Message) -> list[Message]:
    """A prompt message as ``messages.append(prompt); run()`` would send it: one that breaks a
    rule (a blank text block, a result: the transcript it follows owes none) is repaired, with
    the same warning; one left with nothing to send is refused, as a blank text is."""
    if is_valid([prompt]):
        return [prompt]
    from ._engine import valid_history

    repaired = valid_history([prompt], "the prompt given to run()")
    if not repaired:
        raise ValueError("run() needs a prompt with text in it (or None, to resume)")
    return repaired


def _in_envelope(engine: QueryEngine, message: Message) -> Message:
    """``message`` (a vetted prompt: text only) in the interrupt envelope, its metadata kept."""
    text = "\n\n".join(b.text for b in message.content if isinstance(b, TextBlock))
    wrapped = envelope(engine.options.texts.interrupt_envelope, [text])
    return message.model_copy(update={"content": [TextBlock(text=wrapped)]})


def _take_starts(engine: QueryEngine, *, follow_ups: bool) -> list[Message]:
    inbox = engine.inbox
    items = inbox.take(inbox.send_now)
    if not items and follow_ups:
        items = inbox.take(inbox.follow_ups)
    wrap = envelope_due(engine)  # the first text only: it follows the cut answer
    return [_user(engine, q.text, wrap and i == 0, meta={"receipt": q.id}) for i, q in enumerate(items)]


def _next_turn(engine: QueryEngine, st: RunState, stopped: bool) -> list[Message] | None:
    """The next turn's messages, if this run goes on (read again after the host saw TurnEnded).

    A send-now text always goes on, until the deadline; follow-ups, and interjections sent
    while the host held the last events (a new turn with no prompt delivers them), only after a
    turn that completed with no abort: an interrupt while the host held the turn's last events
    (or between turns) means "stop", so they stay queued for the next run. ``stopped``: the
    turn's signal has aborted.
    """
    if st.expired or st.finishing:  # the deadline passed, or aclose() from another task
        return None
    follow_ups = st.last_reason == "completed" and not stopped
    starts = _take_starts(engine, follow_ups=follow_ups)
    if not starts and follow_ups and engine.inbox.interjections:
        return []
    return starts or None


def _limit_reached(engine: QueryEngine, st: RunState) -> TerminalReason | None:
    opts = engine.options
    if st.signal.aborted:
        return abort_terminal(st)
    if opts.max_turns is not None and st.turns >= opts.max_turns:
        return "max_turns"
    if opts.usage_limit is not None and st.tokens >= opts.usage_limit:
        return "usage_limit"
    if engine.parent is not None and over_ancestor_limit(engine):  # the tree's budget is spent
        return "usage_limit"
    return None


def _before_tools(engine: QueryEngine, st: RunState) -> list[ToolUseBlock]:
    """Judge the accepted response; return the calls to run (checkpoint 2 included)."""
    message = st.response
    uses = st.owed if message is not None else []  # the response's calls, listed when it was committed
    if engine.policies and message is not None:
        verdicts = _ask_policies(engine, "on_response", message)
        end = next((v for _, v in verdicts if isinstance(v, EndTurn)), None)
        if end is not None:
            st.terminal, st.detail = end.reason, end.message
            st.pending_events = settle_results(engine, st, not_run=f"Not run: {end.message}")
            return []
        st.nudges += [(name, v) for name, v in verdicts if isinstance(v, Nudge)]
    if not uses:
        # Safe point: a queued message keeps the turn going. So does a response the server
        # paused (stop reason "pause_turn": its own tools ran long), which the next request,
        # the transcript as it is, lets go on.
        if not engine.inbox.interjections and not st.paused:
            st.terminal = "completed"
        return []
    if st.signal.aborted:  # checkpoint 2: no tool starts
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
    if st.signal.aborted:
        st.terminal = abort_terminal(st)
        return
    if engine.policies:
        assert st.response is not None
        last = st.last_results
        results = [last[u.id] for u in uses] if uncut is None else [uncut.get(u.id) or last[u.id] for u in uses]
        for name, verdict in _ask_policies(engine, "on_results", st.response, results):
            if isinstance(verdict, EndTurn):
                if st.terminal is None:  # the first policy to end the turn speaks, as in on_response
                    st.terminal, st.detail = verdict.reason, verdict.message
            elif isinstance(verdict, Nudge):
                st.nudges.append((name, verdict))


def _ask_policies(engine: QueryEngine, hook: str, *args: object) -> list[tuple[str, Verdict]]:
    out: list[tuple[str, Verdict]] = []
    for policy in engine.policies:
        try:
            verdict = getattr(policy, hook)(*args)
        except Exception:
            log.exception("policy %s.%s raised; ignored", policy.name, hook)
            continue
        if verdict is not None:
            out.append((policy.name, verdict))
    return out


async def _end_turn(engine: QueryEngine, st: RunState, reason: TerminalReason) -> list[Event]:
    st.nudges = []  # a reminder no request of this turn carried would reach a model stale, in a later one
    events: list[Event] = settle_results(engine, st)
    aborted = st.signal.aborted and reason in ("aborted_streaming", "aborted_tools", "deadline")
    abort_reason = st.signal.reason if aborted else None
    if aborted and abort_reason is not None:
        interrupt_notice(engine, reason, abort_reason)
        st.hooked = True  # before the await: a host that cancels it does not get them called twice
        engine._abort_background(abort_reason)
        await engine._run_abort_hooks(abort_reason)
        _report_to_parent(engine, st)
    strip_final(engine)
    inbox = engine.inbox
    st.last_reason = reason
    # After a completed turn, an interjection that came since the loop last looked (from another
    # thread) gets a turn of its own, as one sent after the TurnEnded does (`_next_turn`).
    st.continues = not (st.expired or st.finishing) and (
        bool(inbox.send_now)
        or (reason == "completed" and not st.signal.aborted and bool(inbox.follow_ups or inbox.interjections))
    )
    if not st.continues and inbox.interjections:
        dropped = inbox.take(inbox.interjections)
        drop = InterjectionDropped(texts=tuple(q.text for q in dropped), ids=tuple(q.id for q in dropped), reason=reason)
        engine._record_event(drop)
        # First: a host that stops at a result synthesized above has seen the drop it made.
        events.insert(0, drop)
    ended = TurnEnded(
        reason=reason,
        abort_reason=abort_reason,
        error=st.error,
        detail=st.detail,
        usage=st.usage,
        turns=st.turns,
        aborted_subagents=tuple(st.aborted_subagents),
    )
    st.turn_over = True
    engine.last_turn_ended = ended
    engine._record_event(ended)
    events.append(ended)
    return events


def _report_to_parent(engine: QueryEngine, st: RunState) -> None:
    """An aborted subagent is listed in its parent's terminal event, with the subagents of its own
    that the abort reached (they ended first, so the child's list is complete): a main engine's
    list names every engine of the tree the abort stopped, not only its direct children."""
    parent = engine.parent
    state = parent._state if parent is not None else None
    if state is not None and not state.turn_over and engine.agent_id is not None:
        state.aborted_subagents += [engine.agent_id, *st.aborted_subagents]


async def _finish(engine: QueryEngine, st: RunState) -> None:
    """Run cleanup: whatever ended the run, nothing it started survives it."""
    st.finishing = True
    grace = engine.options.tool_cancel_grace
    if engine.parent is not None and st.cut_off():
        # A subagent whose parent cancelled the call running it (the parent's grace ran out):
        # its own grace, longer perhaps, must not outlast the parent's run, so its calls are
        # cancelled at once and its cleanup is not waited for.
        grace = 0.0
        st.aborted_at = st.loop.time() if st.aborted_at is None else min(st.aborted_at, st.loop.time())
    ends_by = st.loop.time() + grace  # tools and hooks' cleanup share one grace
    # Aborted, then stopped before its turn could end (a parent's grace ran out and it cancelled
    # this subagent's call): no TurnEnded will say so, the parent's must. Reported once its own
    # calls are stopped, so the subagents they ran are listed too.
    report = not st.turn_over and st.signal.aborted
    try:
        if not st.turn_over:
            if not st.signal.aborted:
                st.controller.abort("consumer_closed")
            settle_partial(engine, st)
            record_finished(engine, st)
            settle_results(engine, st)
            strip_final(engine)
            if not st.hooked:
                engine._abort_background(st.signal.reason or "consumer_closed")
                await engine._run_abort_hooks(st.signal.reason or "consumer_closed")
        await _cancel_tasks(st, grace)
        cleanup, engine._cleanup = engine._cleanup, None
        if cleanup:  # started by abort hooks (closing a tool server, say), owned by them
            await asyncio.wait(cleanup, timeout=max(0.0, ends_by - st.loop.time()))
    finally:
        for task in st.pending_tasks:  # the cleanup was cut short (the host cancelled it again)
            if not task.done() and not task.cancelling():
                task.cancel()
        st.pending_tasks.clear()
        if report:
            _report_to_parent(engine, st)
        if st.deadline_handle is not None:
            st.deadline_handle.cancel()
        st.close()
        if engine.policies:
            release(engine.policies, engine)
        engine._vetted = list(engine.messages)  # valid: the run settled it
        engine._state = None
        engine._release_store()
        engine._release_sidechain()
        closing, engine._closing = engine._closing, None
        if closing is not None and not closing.done():
            closing.set_result(None)


async def _cancel_tasks(st: RunState, grace: float) -> None:
    """Give the calls still running what is left of their grace, then cancel them;
    abandon those that swallow the cancellation."""
    pending = {t for t in st.pending_tasks if not t.done()}  # cleared by _finish, even if this is cut short
    if not pending:
        return
    _, still = await asyncio.wait(pending, timeout=st.grace_left(grace))
    for task in still:
        task.cancel()
    if still:
        _, stuck = await asyncio.wait(still, timeout=0.1)
        for task in stuck:
            abandon(st, task, "the run ended")
