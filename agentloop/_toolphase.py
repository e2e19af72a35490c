"""The tool phase: run the response's calls in batches, honouring the abort.

Checkpoint 3 sits between batches; after each batch queued interjections are
drained (a safe point) and merged after the results. On abort the calls get
``tool_cancel_grace`` to stop by themselves, then are cancelled.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncGenerator
from typing import TYPE_CHECKING, cast

from ._commit import drain_interjections, settle_results
from ._errors import AbortError
from ._events import Event, ToolCallFinished
from ._executor import CallRunner, Done, Overdue, describe, error_result, plan_batches
from ._messages import ToolUseBlock
from ._run import ABORTED, GRACE_OVER, RunState, abandon
from ._tools import cut_result, result_length
from ._transcript import encodable, interrupted_result

if TYPE_CHECKING:
    from ._engine import QueryEngine


_ABANDON = object()


async def tool_phase(
    engine: QueryEngine, st: RunState, uses: list[ToolUseBlock]
) -> AsyncGenerator[list[Event], None]:
    """Run ``uses`` batch by batch, yielding the calls' events; commits the results.

    Events come in lists, one per wake-up of the loop: a hundred calls that end
    together cost one generator resumption here, not a hundred.
    """
    st.phase = "tools"

    runner = CallRunner(engine, st.signal, st.mailbox, engine.options.permission)
    st.started = runner.started
    spent = st.spent_tasks = []
    # Interjections stay queued until merged after the results, so a host that stops iterating
    # mid-phase loses none; a batch that ends unaborted is the safe point that lets them in.
    merge = False
    for batch in plan_batches(uses, engine.tools, engine.options.max_parallel_tools):
        if st.signal.aborted:  # checkpoint 3: the next batch does not start
            break
        waiting: dict[str, ToolUseBlock] = {}
        tasks: dict[str, asyncio.Task[None]] = {}
        for use in batch:  # ids are unique: commit_response saw to it
            task = tasks[use.id] = st.loop.create_task(runner.call(use))
            waiting[use.id] = use
            st.pending_tasks[task] = use
            spent.append(task)
        timers: list[asyncio.TimerHandle] = []
        if st.signal.aborted:
            st.mailbox.put(ABORTED)
        try:
            while waiting:
                events: list[Event] = []
                for item in await st.mailbox.get():
                    if isinstance(item, Done):
                        if waiting.pop(item.use.id, None) is not None:
                            st.pending_tasks.pop(tasks[item.use.id], None)
                            events.append(_record(engine, st, item))
                    elif isinstance(item, Overdue):  # a call that swallowed its own timeout's cancellation
                        if waiting.pop(item.use.id, None) is not None:
                            abandon(st, tasks[item.use.id], f"it timed out after {item.timeout:g} s")
                            events.append(_record(engine, st, Done(item.use, item.result())))
                    elif item is ABORTED:
                        if not timers:
                            grace = st.grace_left(engine.options.tool_cancel_grace)
                            timers.append(st.loop.call_later(grace, st.mailbox.put, GRACE_OVER))
                    elif item is GRACE_OVER:
                        for task in st.pending_tasks:
                            task.cancel()
                        timers.append(st.loop.call_later(0.1, st.mailbox.put, _ABANDON))
                    elif item is _ABANDON:
                        for use in waiting.values():
                            abandon(st, tasks[use.id], "the run was interrupted")
                        waiting.clear()
                    else:
                        events.append(cast(Event, item))  # emitted by a tool (ToolContext.emit)
                if events:
                    yield events
        finally:
            for timer in timers:
                timer.cancel()
        merge = merge or not st.signal.aborted
    events = settle_results(engine, st)  # a fresh list
    if merge and engine.inbox.interjections:
        events += drain_interjections(engine, st)
    if events:
        yield events


def record_finished(engine: QueryEngine, st: RunState) -> None:
    """Before a turn the host stopped is settled: record the calls that finished while the
    loop was suspended at a yield (their outcome still queued), so they keep their real result.

    Events queued with them are dropped: no one will read them.
    """
    if not st.owed:
        return
    owed = {use.id for use in st.owed}
    for item in st.mailbox.take():
        if isinstance(item, Done) and item.use.id in owed and item.use.id not in st.results:
            _record(engine, st, item)


def _record(engine: QueryEngine, st: RunState, done: Done) -> ToolCallFinished:
    use, outcome = done.use, done.outcome
    synthetic = False
    if not isinstance(outcome, BaseException):  # a builtin class: a failed check stays cheap
        result = outcome
    elif isinstance(outcome, (AbortError, asyncio.CancelledError)) and st.signal.aborted:
        texts = engine.options.texts
        result = interrupted_result(use.id, texts.stopped_running if use.id in st.started else texts.never_started)
        synthetic = True
    elif isinstance(outcome, asyncio.CancelledError):  # cancelled by the tool itself or by its host, not by an abort
        effects = "; it may have had side effects" if use.id in st.started else ""
        result = error_result(use.id, f"Tool {use.name!r} was cancelled, although the run was not interrupted{effects}.")
    else:
        result = interrupted_result(use.id, f"Tool {use.name!r} failed inside agentloop: {describe(outcome)}")
    result = encodable(result)
    limit = engine.options.max_tool_result_chars
    full = None
    if limit is not None and result_length(result) > limit:
        full, result = result, cut_result(result, limit, engine.options.texts.result_cut)
    st.results[use.id] = result
    return ToolCallFinished(tool_use=use, result=result, synthetic=synthetic, full_result=full)
