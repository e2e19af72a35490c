"""The tool phase: run the response's calls in batches, honouring the abort.

Checkpoint 3 sits between batches; after each batch queued interjections are
drained (a safe point) and merged after the results. On abort the calls get
``tool_cancel_grace`` to stop by themselves, then are cancelled.

The phase's steps are here; its loop, which awaits the mailbox, is in `_loop.drive`.
"""

from __future__ import annotations

import asyncio
import dataclasses
from typing import TYPE_CHECKING

from ._abort import run_context
from ._commit import noted, ran_with, settle_results
from ._errors import AbortError
from ._events import Event, ToolCallFinished, ToolProgress, _Event
from ._executor import UNWIND, CallRunner, Done, Overdue, describe, error_result
from ._inbox import told_for
from ._messages import ToolResultBlock, ToolUseBlock
from ._run import ABORTED, GRACE_OVER, RunState, abandon
from ._subagent import link_signal
from ._tools import cut_result, result_length
from ._transcript import (
    Sources,
    credentials_of,
    encodable,
    interrupted_result,
    lineage_sources,
    redacted,
    without_credentials,
)

if TYPE_CHECKING:
    from ._engine import QueryEngine


_ABANDON = object()


def grace_left(engine: QueryEngine, st: RunState) -> float:
    """What is left of the cancel grace of the calls of ``engine``'s run.

    A subagent stopped by its parent's abort, with no longer a grace than its parent's, ends its
    calls a moment before the parent's grace runs out (the call running it would be cancelled
    then): its turn ends, with its `TurnEnded`, rather than being cut off. A grandchild ends a
    moment before the child, and so on up the tree."""
    grace = engine.options.tool_cancel_grace
    left = st.grace_left(grace)
    parent = engine.parent
    if parent is None or parent._state is None or parent._state.aborted_at is None:
        return left
    if link_signal(engine) is not parent._state.signal or grace > parent.options.tool_cancel_grace:
        return left  # not stopped by the parent's abort, or a longer grace of its own: cut off
    margin = min(UNWIND, parent.options.tool_cancel_grace / 2)
    return min(left, max(0.0, grace_left(parent, parent._state) - margin))


def start_tools(engine: QueryEngine, st: RunState) -> CallRunner:
    """The tool phase begins: the runner its calls share, one per turn (its signal and mailbox)."""
    st.phase = "tools"
    runner = st.runner
    if runner is None:
        runner = st.runner = CallRunner(engine, st.signal, st.mailbox, engine.options.permission)
    else:
        runner.tools = engine.tools  # the tools the model was offered for these calls
        runner.started.clear()  # the last phase's calls are settled
        runner.updated.clear()
    st.started = runner.started
    st.spent_tasks = []
    return runner


class Batch:
    """One batch of calls, started together: `receive` turns what the mailbox held into the
    host's events, until no call is left ``waiting``; then (always) the loop cancels its ``timers``.

    The loop awaits the mailbox itself (`_loop.drive`) rather than through a generator of
    this phase: every generator level costs each event a resumption.
    """

    __slots__ = ("engine", "st", "tasks", "timers", "updated", "waiting")

    def __init__(self, engine: QueryEngine, st: RunState, runner: CallRunner, batch: list[ToolUseBlock]) -> None:
        self.engine = engine
        self.st = st
        self.waiting: dict[str, ToolUseBlock] = {}
        self.tasks: dict[str, asyncio.Task[None]] = {}
        self.timers: list[asyncio.TimerHandle] = []
        self.updated = runner.updated
        # What the run's signal scrubs its listeners' errors of (`run_controller`): the engine's
        # credentials, for an abort listener raising in a call on any signal (`run_context`).
        secrets = st.signal._secrets
        for use in batch:  # ids are unique: commit_response saw to it
            key = use.id
            context = run_context(secrets) if secrets is not None else None  # a context each
            task = self.tasks[key] = st.loop.create_task(runner.call(use), context=context)
            self.waiting[key] = use
            st.pending_tasks[task] = use
            st.spent_tasks.append(task)
        st.mailbox.fresh = True  # its first wait lets the calls take their first step

    def receive(self, items: list[object]) -> list[Event]:
        engine, st, waiting, tasks, timers = self.engine, self.st, self.waiting, self.tasks, self.timers
        limit = engine.options.max_tool_result_chars
        set_use, set_result, set_synthetic, set_full, set_updated = _FINISHED_SLOTS
        updated = self.updated
        secrets = run_secrets(engine, st)
        events: list[Event] = []
        for item in items:
            if type(item) is Done:
                use, outcome = item
                key = use.id
                if waiting.pop(key, None) is not None:
                    st.pending_tasks.pop(tasks[key], None)
                    # The common outcome, recorded here as `_record` would: a result whose text is
                    # ASCII (so it has no surrogate to scrub), within the limit (nothing to cut),
                    # and without the model's credentials (nothing to redact).
                    if (
                        type(outcome) is ToolResultBlock
                        and type(content := outcome.content) is str
                        and content.isascii()
                        and (limit is None or len(content) <= limit)
                        and not (secrets and _holds(content, secrets))
                    ):
                        st.results[key] = outcome
                        # ToolCallFinished(tool_use=use, result=outcome), filled through its slots
                        event = _new_event(ToolCallFinished)
                        set_use(event, use)
                        set_result(event, outcome)
                        set_synthetic(event, False)
                        set_full(event, None)
                        set_updated(event, updated.get(key) if updated else None)
                        _set_agent_id(event, None)
                        events.append(event)
                    else:
                        events.append(_record(engine, st, item))
            elif isinstance(item, Overdue):  # a call that swallowed its own timeout's cancellation
                if waiting.pop(item.use.id, None) is not None:
                    abandon(st, tasks[item.use.id], f"it timed out after {item.timeout:g} s")
                    result = noted(engine, item.result(), ran_with(st, item.use.id))
                    events.append(_record(engine, st, Done((item.use, result))))
            elif item is ABORTED:
                if not timers:
                    grace = grace_left(engine, st)
                    timers.append(st.loop.call_later(grace, st.mailbox.put, GRACE_OVER))
            elif item is GRACE_OVER:
                for task in st.pending_tasks:
                    task.cancel()
                timers.append(st.loop.call_later(UNWIND, st.mailbox.put, _ABANDON))
            elif item is _ABANDON:
                for use in waiting.values():
                    abandon(st, tasks[use.id], "the run was interrupted")
                waiting.clear()
            elif type(item) is ToolProgress and secrets and _holds(item.text, secrets):
                events.append(dataclasses.replace(item, text=redacted(item.text, secrets)))  # a tool's report, shown
            else:
                events.append(item)  # type: ignore[arg-type]  # an Event a call put (ToolContext.emit); no cast() call
        return events


#: The tool phase ends: commit the results (the loop merges the queued interjections next).
#: `settle_results` itself, under the name of this step: no call in between.
end_tools = settle_results


def record_finished(engine: QueryEngine, st: RunState) -> None:
    """Before a turn the host stopped is settled: record the calls that finished while the
    loop was suspended at a yield (their outcome still queued), so they keep their real result.

    Events queued with them are dropped: no one will read them.
    """
    if not st.owed:
        return
    owed = {use.id for use in st.owed}
    for item in st.mailbox.take():
        if type(item) is Done and item[0].id in owed and item[0].id not in st.results:
            _record(engine, st, item)


# A frozen dataclass's __init__ sets each field through object.__setattr__; `Batch.receive` fills
# the slots of the common ToolCallFinished through their descriptors instead (C calls, no frame):
# the same event, field for field.
_new_event = object.__new__
_FINISHED_SLOTS = tuple(
    ToolCallFinished.__dict__[f].__set__ for f in ("tool_use", "result", "synthetic", "full_result", "updated_input")
)
_set_agent_id = _Event.__dict__["agent_id"].__set__


def _record(engine: QueryEngine, st: RunState, done: Done) -> ToolCallFinished:
    use, outcome = done
    synthetic = False
    updated = ran_with(st, use.id)
    if not isinstance(outcome, BaseException):  # a builtin class: a failed check stays cheap
        result = outcome  # a call's own result says already which input it ran with
    elif isinstance(outcome, KeyboardInterrupt) or (
        isinstance(outcome, (AbortError, asyncio.CancelledError)) and st.signal.aborted
    ):  # a Ctrl-C that landed in the call's own code stopped it as an interrupt does
        texts = engine.options.texts
        text = texts.stopped_running if use.id in st.started else texts.never_started
        result = interrupted_result(use.id, told_for(text, st.signal.reason))
        synthetic = True
    elif isinstance(outcome, asyncio.CancelledError):  # cancelled by the tool itself or by its host, not by an abort
        effects = "; it may have had side effects" if use.id in st.started else ""
        result = error_result(use.id, f"Tool {use.name!r} was cancelled, although the run was not interrupted{effects}.")
    else:
        result = interrupted_result(use.id, f"Tool {use.name!r} failed inside agentloop: {describe(outcome)}")
    if isinstance(outcome, BaseException):
        result = noted(engine, result, updated)
    result = without_credentials(encodable(result), run_secrets(engine, st))
    limit = engine.options.max_tool_result_chars
    full = None
    if limit is not None and result_length(result) > limit:
        full, result = result, cut_result(result, limit, engine.options.texts.result_cut)
        if st.uncut is None:
            st.uncut = {}
        st.uncut[use.id] = full
    st.results[use.id] = result
    return ToolCallFinished(tool_use=use, result=result, synthetic=synthetic, full_result=full, updated_input=updated)


def _holds(text: str, secrets: tuple[str, ...]) -> bool:
    """Whether ``text`` contains one of ``secrets``. A function of its own: a generator
    expression in `Batch.receive` would make its free variables cells on every call."""
    return any(s in text for s in secrets)


def run_secrets(engine: QueryEngine, st: RunState) -> tuple[str, ...]:
    """The credentials of ``engine``'s model and its ancestors' and of their tools' MCP servers
    (`lineage_credentials`), to redact from tool results: read once per run (an HTTP model
    collects them from its key and headers), again only if a model or a tool set of the lineage
    was replaced (a background child runs on while its parent changes them)."""
    held = st.secrets
    if held is None or not _same_lineage(engine, held[0]):
        sources = lineage_sources(engine)
        held = st.secrets = (sources, credentials_of(sources))
    return held[1]


def _same_lineage(engine: QueryEngine | None, sources: Sources) -> bool:
    """Whether ``sources`` are still `lineage_sources(engine)`: compared in place, each model
    and tool set by identity, with nothing built (once for each batch of tool results)."""
    for model, specs in sources:
        if engine is None or model is not engine.model or specs is not getattr(engine, "tool_specs", ()):
            return False
        engine = engine.parent
    return engine is None
