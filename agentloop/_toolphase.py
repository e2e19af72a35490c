"""The tool phase: run the response's calls in batches, honouring the abort.

Checkpoint 3 sits between batches; after each batch queued interjections are
drained (a safe point) and merged after the results. On abort the calls get
``tool_cancel_grace`` to stop by themselves, then are cancelled.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import AsyncGenerator
from typing import TYPE_CHECKING, cast

from ._commit import drain_interjections, settle_results
from ._errors import AbortError
from ._events import Event, ToolCallFinished
from ._executor import CallRunner, plan_batches
from ._messages import ToolResultBlock, ToolUseBlock
from ._run import ABORTED, GRACE_OVER, RunState
from ._tools import ToolContext
from ._transcript import interrupted_result

if TYPE_CHECKING:
    from ._engine import QueryEngine

log = logging.getLogger("agentloop")

_ABANDON = object()


async def tool_phase(engine: QueryEngine, st: RunState, uses: list[ToolUseBlock]) -> AsyncGenerator[Event, None]:
    st.phase = "tools"

    def make_ctx(use: ToolUseBlock) -> ToolContext:
        return ToolContext(signal=st.signal, tool_use_id=use.id, engine=engine, emit=st.mailbox.put)

    runner = CallRunner(engine.tools, st.signal, make_ctx, st.mailbox.put, engine.options.permission)
    st.started = runner.started
    drained = []
    for batch in plan_batches(uses, engine.tools, engine.options.max_parallel_tools):
        if st.signal.aborted:  # checkpoint 3: the next batch does not start
            break
        async with contextlib.aclosing(_run_batch(engine, st, runner, batch)) as events:
            async for event in events:
                yield event
        if not st.signal.aborted:  # safe point: drained now, merged after the results
            drained += engine.inbox.take(engine.inbox.interjections)
    for event in settle_results(engine, st):
        yield event
    if drained:
        engine.inbox.interjections[:0] = drained  # delivered by the next top-of-iteration drain
        for event in drain_interjections(engine, st):
            yield event


async def _run_batch(
    engine: QueryEngine, st: RunState, runner: CallRunner, batch: list[ToolUseBlock]
) -> AsyncGenerator[Event, None]:
    loop = st.loop
    tasks: dict[asyncio.Future[ToolResultBlock], ToolUseBlock] = {}
    for use in batch:
        task = loop.create_task(runner.run(use))
        task.add_done_callback(st.mailbox.put)
        tasks[task] = use
        st.pending_tasks.add(task)
    timers: list[asyncio.TimerHandle] = []
    grace = engine.options.tool_cancel_grace
    if st.signal.aborted:
        st.mailbox.put(ABORTED)
    try:
        while tasks:
            for item in await st.mailbox.get():
                if item is ABORTED and not timers:
                    timers.append(loop.call_later(grace, st.mailbox.put, GRACE_OVER))
                elif item is GRACE_OVER:
                    for running in tasks:
                        running.cancel()
                    timers.append(loop.call_later(0.1, st.mailbox.put, _ABANDON))
                elif item is _ABANDON:
                    for stuck, use in list(tasks.items()):
                        log.warning("tool %r ignored cancellation; abandoning it", use.name)
                        st.pending_tasks.discard(stuck)
                        del tasks[stuck]
                elif isinstance(item, asyncio.Future):
                    done: asyncio.Future[ToolResultBlock] = item
                    use_or_none = tasks.pop(done, None)
                    if use_or_none is not None:
                        st.pending_tasks.discard(done)
                        yield _record(engine, st, done, use_or_none)
                elif item is not ABORTED:
                    yield cast(Event, item)  # emitted by a tool (ToolContext.emit)
    finally:
        for timer in timers:
            timer.cancel()


def _record(
    engine: QueryEngine, st: RunState, task: asyncio.Future[ToolResultBlock], use: ToolUseBlock
) -> ToolCallFinished:
    texts = engine.options.texts
    synthetic = False
    if task.cancelled() or isinstance(task.exception(), AbortError):
        text = texts.stopped_running if use.id in st.started else texts.never_started
        result = interrupted_result(use.id, text)
        synthetic = True
    elif (exc := task.exception()) is not None:
        result = interrupted_result(use.id, f"Tool {use.name!r} failed inside agentloop: {exc!r}")
    else:
        result = task.result()
    st.results[use.id] = result
    return ToolCallFinished(tool_use=use, result=result, synthetic=synthetic)
