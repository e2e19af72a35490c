"""How a turn ends and how a run ends.

A turn ends with exactly one `TurnEnded` (SPEC §10), after the results it owes are settled;
an aborted turn also gets its interrupt notice (SPEC §4), its background children stopped
(when the engine says so) and its `on_abort` hooks called, once. A run ends, whatever ended
it, with nothing it started still running (SPEC §1): the calls still going get what is left
of the cancel grace, then are cancelled, and a cleanup an abort hook started
(`wait_at_run_end`) is waited for within the same grace.
"""

from __future__ import annotations

import asyncio
import contextvars
import inspect
import logging
from collections.abc import Awaitable
from typing import TYPE_CHECKING, Any

from ._abort import cancels_asked, in_task
from ._commit import abort_terminal, interrupt_notice, settle_partial, settle_results, strip_final
from ._events import Event, InterjectionDropped, TerminalReason, TurnEnded
from ._hostlog import host_repr, log_failure
from ._policy import release
from ._recording import release_sidechain, release_store
from ._run import RunState, abandon
from ._subagent import abort_background
from ._toolphase import record_finished

if TYPE_CHECKING:
    from ._engine import AbortHook, QueryEngine

__all__ = ["end_turn", "finish", "run_abort_hooks", "settle_now", "wait_at_run_end"]


# The terminals a policy's EndTurn gives: an abort that comes before the turn's end wins over them.
_POLICY_ENDS = frozenset({"stationarity_ended", "hook_stopped"})

log = logging.getLogger("agentloop")

# The engine whose abort hooks are being called (set around each call, in the run's task).
_hooked_engine: contextvars.ContextVar[QueryEngine | None] = contextvars.ContextVar("agentloop_hooked", default=None)


def wait_at_run_end(task: asyncio.Task[Any]) -> bool:
    """From an abort hook: let cleanup it started go on without delaying the turn's end.

    The run's ``TurnEnded`` does not wait for ``task``; the run itself waits for it
    before it returns, within ``tool_cancel_grace`` (past that, ``task`` is left to
    whoever owns it). Returns False (and does nothing) outside an abort hook.
    """
    engine = _hooked_engine.get()
    if engine is None or engine._state is None:
        return False
    if engine._cleanup is None:
        engine._cleanup = set()
    engine._cleanup.add(task)
    return True


async def run_abort_hooks(engine: QueryEngine, reason: str, grace: float) -> None:
    """Call the engine's `on_abort` hooks with ``reason`` (main-only ones for a main engine
    only); a hook that raises, or meets a cancellation of its own, is logged and the rest
    still run. An async hook gets what is left of the cancel ``grace``, counted from the abort."""
    token = _hooked_engine.set(engine)
    try:
        for fn, main_only in engine._abort_hooks:
            if main_only and engine.parent is not None:
                continue
            asked = cancels_asked()  # the host's cancel of the run may be under way already
            try:
                result = fn(reason)
                if inspect.isawaitable(result):
                    await _within_grace(engine, fn, result, grace)
            except Exception as exc:
                if cancels_asked() > asked:  # the hook turned a cancel of the run's task into it
                    raise asyncio.CancelledError from exc
                log_failure(engine, "on_abort hook %r failed", fn)
            except asyncio.CancelledError:
                if cancels_asked() > asked:  # a cancel of the run's task came meanwhile: it goes on
                    raise
                # The hook's own cancellation (raised by its call, or by something it awaited that
                # was cancelled), whoever cancels the run: a failed hook, like one that raises.
                log_failure(engine, "on_abort hook %r failed: it was cancelled of its own", fn)
    finally:
        _hooked_engine.reset(token)


def _failed_first(engine: QueryEngine, st: RunState) -> str | None:
    """What answers the calls owed when the model phase failed for good: those of the response
    the failure cut, kept (partial) with the calls it had completed. The failure left them unrun,
    not an interrupt, and the model is told which (without the engine's credentials). None when
    the request did not fail: the calls owed are an abort's, answered by `Texts`."""
    if st.error is None or not st.owed:
        return None
    return engine._without_credentials(f"Not run: the model's response failed before it was complete ({st.error}).")


async def _within_grace(engine: QueryEngine, fn: AbortHook, result: Awaitable[object], grace: float) -> None:
    """Await an async hook's ``result``, in the run's task (it sees the run's context), for what
    is left of the cancel ``grace`` (counted once from the abort; at least 0.1 s, as a cancelled
    call is given to unwind), then cancel it, with a warning: a hook that never returns (a reset
    the server never answers) does not keep `run()` from ending. One cancel is made: a hook that
    swallows it too keeps the run waiting. Longer cleanup belongs in `wait_at_run_end`."""
    st = engine._state
    if not in_task() or st is None:  # driven by hand, not by a task: nothing can cancel it
        await result
        return
    limit = st.step_grace(grace)
    scope = asyncio.timeout(limit)
    try:
        async with scope:
            await result
    except TimeoutError:
        if not scope.expired():
            raise  # the hook's own, a failure like any other
        log.warning(  # an ordinary time-out: a line, no traceback
            "on_abort hook %s did not finish within the cancel grace (%.3g s) and was cancelled "
            "(cleanup that takes longer can be started as a task of its own)",
            host_repr(engine, fn, short=True),
            limit,
        )

async def end_turn(engine: QueryEngine, st: RunState, reason: TerminalReason) -> list[Event]:
    st.nudges = []  # a reminder no request of this turn carried would reach a model stale, in a later one
    events: list[Event] = settle_results(engine, st, not_run=_failed_first(engine, st))
    reason = _abort_wins(st, reason)
    aborted = st.signal.aborted and reason in ("aborted_streaming", "aborted_tools", "deadline")
    abort_reason = st.signal.reason if aborted else None
    if aborted and abort_reason is not None:
        interrupt_notice(engine, reason, abort_reason)
        st.hooked = True  # before the await: a host that cancels it does not get them called twice
        abort_background(engine, abort_reason)
        await run_abort_hooks(engine, abort_reason, engine.options.tool_cancel_grace)
        _report_to_parent(engine, st)
    strip_final(engine)
    inbox = engine.inbox
    st.last_reason = reason
    # After a completed turn, an interjection that came since the loop last looked (from another
    # thread) gets a turn of its own, as one sent after the TurnEnded does (`next_turn`).
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


def _abort_wins(st: RunState, reason: TerminalReason) -> TerminalReason:
    """The turn's terminal, read once more as its end begins: an abort that came after a policy
    ended the turn on a response with calls (while the host held the results it kept from
    running, or from another thread after the verdicts) ends it ``aborted_tools``, as with no
    policy; the results written stay as they are. After a whole answer without calls the abort
    has nothing to stop, and the policy's terminal (and its detail) stands."""
    if reason not in _POLICY_ENDS or not st.signal.aborted:
        return reason
    response = st.response
    if response is None or not response.tool_uses:
        return reason
    st.detail = None
    st.phase = "tools"  # its calls' results are in: the abort is one of the tool phase
    return abort_terminal(st)


def _report_to_parent(engine: QueryEngine, st: RunState) -> None:
    """An aborted subagent is listed in its parent's terminal event, with the subagents of its own
    that the abort reached (they ended first, so the child's list is complete): a main engine's
    list names every engine of the tree the abort stopped, not only its direct children."""
    parent = engine.parent
    state = parent._state if parent is not None else None
    if state is not None and not state.turn_over and engine.agent_id is not None:
        state.aborted_subagents += [engine.agent_id, *st.aborted_subagents]


async def finish(engine: QueryEngine, st: RunState) -> None:
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
    if engine.parent is None and st.cut_off():
        # The host cancelled the task iterating the run (a client gone, a timeout): it stopped
        # iterating, so no run is going for it, as after a break; a run() begun during the
        # cleanup below waits for it.
        st.released = True
    try:
        if not st.turn_over:
            settle_now(engine, st)  # "consumer_closed", unless an abort came first
            if not st.hooked:
                abort_background(engine, st.signal.reason or "consumer_closed")
                await run_abort_hooks(engine, st.signal.reason or "consumer_closed", grace)
        await _cancel_tasks(st, grace)
        cleanup, engine._cleanup = engine._cleanup, None
        if cleanup and not st.loop.is_closed():  # started by abort hooks (closing a tool server, say), owned by them
            await asyncio.wait(cleanup, timeout=max(0.0, ends_by - st.loop.time()))
    finally:
        _cancel_left(st)
        if report:
            _report_to_parent(engine, st)
        if st.deadline_handle is not None:
            st.deadline_handle.cancel()
        st.close()
        if engine.policies:
            release(engine.policies, engine)
        engine._vetted = list(engine.messages)  # valid: the run settled it
        engine._state = None
        release_store(engine)
        release_sidechain(engine)
        closing, engine._closing = engine._closing, None
        if closing is not None and not closing.done():
            closing.set_result(None)
        if st.leave is not None:
            st.leave()


def _cancel_left(st: RunState) -> None:
    """Cancel the calls still running: the cleanup was cut short (the host cancelled it again),
    or the loop was closed under the run, when nothing can run them again (cancelling one
    then raises, as its waiter schedules the wake-up on the closed loop)."""
    if not st.loop.is_closed():
        for task in st.pending_tasks:
            if not task.done() and not task.cancelling():
                task.cancel()
    st.pending_tasks.clear()


async def _cancel_tasks(st: RunState, grace: float) -> None:
    """Give the calls still running what is left of their grace, then cancel them;
    abandon those that swallow the cancellation."""
    pending = {t for t in st.pending_tasks if not t.done()}  # cleared by finish, even if this is cut short
    if not pending or st.loop.is_closed():  # closed under the run: there is no waiting on them
        return
    _, still = await asyncio.wait(pending, timeout=st.grace_left(grace))
    for task in still:
        task.cancel()
    if still:
        _, stuck = await asyncio.wait(still, timeout=0.1)
        for task in stuck:
            abandon(st, task, "the run ended")


def settle_now(engine: QueryEngine, st: RunState) -> None:
    """Stop the run ("consumer_closed", unless it was aborted already) and settle, synchronously,
    what is in flight: the streamed output and the results owed join the transcript."""
    st.finishing = True
    st.controller.abort("consumer_closed")
    settle_partial(engine, st)
    record_finished(engine, st)
    settle_results(engine, st)
    strip_final(engine)
