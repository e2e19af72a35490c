"""Per-run state, and the machinery that lets an abort reach the loop at once.

A run's loop is an async generator driven by the host's task. While the loop
awaits the model stream (or a retry back-off), an abort cancels that await in
the host's task, exactly as `asyncio.timeout` does: the cancellation is
requested only while the loop is inside one of its own awaits, and converted
back into an abort on the way out (``uncancel()`` counting), so a
`CancelledError` from anyone else is never swallowed. An await still going a
cancel grace later (a stream whose cleanup absorbed the cancellation) is
cancelled once more, and that cancellation is ours too. While tools run, the
loop waits on its `Mailbox`, which an abort simply wakes.
"""

from __future__ import annotations

import asyncio
import logging
import sys
from collections.abc import Awaitable, Callable, Iterator, Sequence
from typing import TYPE_CHECKING, Any, TypeVar, overload

from ._abort import AbortController, AbortSignal
from ._accumulate import Accumulator
from ._executor import UNWIND, CallRunner, Mailbox, hold_until_done
from ._messages import Message, ToolResultBlock, ToolUseBlock
from ._model import Usage
from ._policy import Nudge

if TYPE_CHECKING:
    from ._engine import QueryEngine
    from ._events import Event, InterjectionInjected, TerminalReason
    from ._transcript import Sources

__all__ = [
    "ABORTED",
    "Aborted",
    "NextRun",
    "RunState",
    "TranscriptView",
    "abandon",
    "charge_ancestors",
    "usage_spent",
]

T = TypeVar("T")

log = logging.getLogger("agentloop")

ABORTED = object()  # mailbox marker: the run's signal aborted
GRACE_OVER = object()  # mailbox marker: tool_cancel_grace has elapsed


if sys.version_info >= (3, 12):
    current_task_of: Callable[[asyncio.AbstractEventLoop], asyncio.Task[Any] | None] = asyncio.current_task
else:
    # Python 3.11's current_task() is Python code around this dict lookup; the loop asks
    # once per stream event, so it reads the dict directly (C speed). 3.12+ has a C one.
    current_task_of = getattr(asyncio.tasks, "_current_tasks").get  # noqa: B009


class Aborted(Exception):
    """The run's own cancellation, converted back from CancelledError."""


class TranscriptView(Sequence[Message]):
    """A read-only view of the first ``n`` messages of a list, plus ``extra``.

    The engine only appends to its transcript during a run, so a length-capped
    view is a faithful snapshot that costs O(1) to take.
    """

    __slots__ = ("_base", "_extra", "_n")

    def __init__(self, base: list[Message], n: int, extra: tuple[Message, ...] = ()) -> None:
        self._base = base
        self._n = n
        self._extra = extra

    def __len__(self) -> int:
        return self._n + len(self._extra)

    @overload
    def __getitem__(self, i: int) -> Message: ...
    @overload
    def __getitem__(self, i: slice) -> Sequence[Message]: ...
    def __getitem__(self, i: int | slice) -> Message | Sequence[Message]:
        if isinstance(i, slice):
            return [self[j] for j in range(*i.indices(len(self)))]
        if i < 0:
            i += len(self)
        if 0 <= i < self._n:
            return self._base[i]
        if self._n <= i < len(self):
            return self._extra[i - self._n]
        raise IndexError(i)

    def __iter__(self) -> Iterator[Message]:
        base = self._base
        for i in range(self._n):
            yield base[i]
        yield from self._extra

    def __repr__(self) -> str:
        return f"<TranscriptView {len(self)} messages>"


class NextRun:
    """A run waiting for the last run's cleanup before it begins: the controller its first turn
    will use, so that `interrupt()` meanwhile stops it (the last run has stopped already), and
    whether `aclose()` from another task ended it (no further turn may start then)."""

    __slots__ = ("closed", "controller", "token")

    def __init__(self, token: object, controller: AbortController) -> None:
        self.token = token
        self.controller = controller
        self.closed = False


class RunState:
    """Everything one `run()` call owns. Lives from the run's start to its end."""

    __slots__ = (
        "_again",
        "_cancel_requested",
        "_recancels",
        "_remove_listener",
        "aborted_at",
        "aborted_subagents",
        "acc",
        "cancel_baseline",
        "closed",
        "continues",
        "controller",
        "deadline_handle",
        "detail",
        "error",
        "expired",
        "finishing",
        "guarding",
        "hooked",
        "host",
        "host_cancels",
        "injected",
        "last_reason",
        "last_results",
        "leave",
        "loop",
        "mailbox",
        "nudges",
        "owed",
        "paused",
        "pending_events",
        "pending_tasks",
        "phase",
        "read_grace",
        "released",
        "response",
        "results",
        "runner",
        "secrets",
        "signal",
        "spent_tasks",
        "started",
        "stop_next",
        "task",
        "terminal",
        "token",
        "turn_index",
        "turn_over",
        "turns",
        "uncut",
        "used",
    )

    def __init__(self, controller: AbortController, task: asyncio.Task[Any] | None, read_grace: float) -> None:
        self.controller = controller
        self.signal: AbortSignal = controller.signal
        self.task = task
        # The task that began the run, and the cancels it had been asked then and not taken back:
        # a run begun in its host's own cancel cleanup (an ``except CancelledError:`` or a
        # ``finally`` that saves a summary) finds its task cancelling already, by a cancel that is
        # no one's of this run (`cancels_before`).
        self.host = task
        self.host_cancels = task.cancelling() if task is not None else 0
        self.loop = asyncio.get_running_loop()
        self.mailbox = Mailbox()
        self.turns = 0
        # The run's token counts, subagents' included (``usage``): counted in place, so that adding
        # an attempt's makes no object. In `Usage`'s order.
        self.used = [0, 0, 0, 0]
        self.acc: Accumulator | None = None
        self.phase = "idle"  # "model" | "tools" | "idle"
        # Tool calls owed a result, in the committed assistant message's order.
        self.owed: list[ToolUseBlock] = []
        self.results: dict[str, ToolResultBlock] = {}
        self.started: set[str] = set()
        # What runs this turn's calls (made at its first tool phase): its signal and mailbox.
        self.runner: CallRunner | None = None
        # The running calls' tasks, each with its call.
        self.pending_tasks: dict[asyncio.Task[Any], ToolUseBlock] = {}
        # When this turn's abort reached the loop (loop time): the calls' cancel grace counts
        # from here, once, however long the host holds an event and whoever waits on the calls.
        self.aborted_at: float | None = None
        # The last tool phase's finished tasks: freed at the next tool phase or at the
        # run's end, so their teardown never delays the events that follow them.
        self.spent_tasks: list[asyncio.Task[Any]] = []
        self.terminal: TerminalReason | None = None
        self.error: str | None = None
        self.detail: str | None = None
        self.closed = False
        self.aborted_subagents: list[str] = []
        self.nudges: list[tuple[str, Nudge]] = []
        self.token: object = None
        # Undoes what the run set in its task for abort listeners' errors (`enter_run`).
        self.leave: Callable[[], None] | None = None
        self.deadline_handle: asyncio.TimerHandle | None = None
        self.expired = False  # the run's deadline has passed: no further turn starts
        self.turn_over = False
        self.hooked = False  # this turn's abort hooks have been called
        self.finishing = False
        self.released = False  # the host stopped iterating (dropped or closed the run): it is gone for the host
        self.continues = False
        self.last_reason: TerminalReason | None = None
        self.response: Message | None = None
        # The response committed last stopped with "pause_turn": the server paused a turn of its
        # own tools, and the next request (the transcript as it is) lets it go on.
        self.paused = False
        self.last_results: dict[str, ToolResultBlock] = {}
        # The whole of each result cut by max_tool_result_chars in this tool phase, for the policies
        # (a poller's progress can be in the part cut out); None while nothing was cut.
        self.uncut: dict[str, ToolResultBlock] | None = None
        # What the credentials of this run were read from (its lineage's models and tools), and
        # them (see `run_secrets`).
        self.secrets: tuple[Sources, tuple[str, ...]] | None = None
        self.turn_index = 0
        # The interjections queued before the run, which its first turn begins with: reported
        # right after that turn's TurnStarted.
        self.injected: InterjectionInjected | None = None
        # The reason of an interrupt() that found the turn stopped by a send_now already: it is
        # meant for the turn the send-now's text starts (`_turns.start_turn` applies it).
        self.stop_next: str | None = None
        self.pending_events: list[Event] = []
        # Self-cancellation bookkeeping (see the module docstring). ``cancel_baseline`` is the
        # task's ``cancelling()`` count when the guarded await began, as asyncio.timeout records
        # it on entry: a cancellation requested by anyone else before our own is never ours.
        self.guarding = False
        self._cancel_requested = False
        self.cancel_baseline = 0
        # Cancels made again of a guarded await that outlived the first by what was left of
        # ``read_grace`` (the engine's tool_cancel_grace; a model stream whose cleanup absorbed it):
        # each is ours, undone with it.
        self._recancels = 0
        self.read_grace = read_grace
        self._again: asyncio.TimerHandle | None = None  # the timer that makes that cancel again
        self._remove_listener = self.signal.add_listener(self._on_abort)

    @property
    def usage(self) -> Usage:
        """What the run has used so far."""
        return Usage(*self.used)

    @property
    def tokens(self) -> int:
        """``usage.total``: what a ``usage_limit`` counts."""
        used = self.used
        return used[0] + used[1]

    def count(self, usage: Usage) -> None:
        """Add ``usage`` (an attempt's, or a subagent's) to the run's."""
        used = self.used
        used[0] += usage.input_tokens
        used[1] += usage.output_tokens
        used[2] += usage.cache_read_tokens
        used[3] += usage.cache_write_tokens

    def new_turn(self, controller: AbortController | None) -> None:
        """A turn starts; a later turn (send-now, follow-up) replaces the spent controller."""
        if controller is not None:
            self._remove_listener()
            self.controller.unlink()
            self.controller, self.signal = controller, controller.signal
            self._remove_listener = self.signal.add_listener(self._on_abort)
            self.mailbox = Mailbox()
            self.runner = None
        self.turn_index += 1
        self.turns = 0
        self.turn_over = False
        self.hooked = False
        self.continues = False
        self.terminal = None
        self.error = None
        self.detail = None
        self.phase = "idle"
        self.aborted_at = None
        self.aborted_subagents = []

    def take_pending_events(self) -> list[Event]:
        events, self.pending_events = self.pending_events, []
        return events

    def consume_cancel(self) -> bool:
        """After a CancelledError in a guarded await: True if it was our abort's."""
        if not self._cancel_requested:
            return False
        self._cancel_requested = False
        assert self.task is not None
        self._take_back_recancels(self.task)
        return self.task.uncancel() <= self.cancel_baseline

    def cancelled_meanwhile(self, task: asyncio.Task[Any]) -> bool:
        """After a guarded await that raised an error, not the CancelledError: True when someone
        else asked ``task`` to cancel while it waited (counted as `consume_cancel` does, our
        abort's own cancel aside). The awaited code turned that cancel into the error."""
        return task.cancelling() > self.cancel_baseline + self.own_cancels()

    def own_cancels(self) -> int:
        """How many cancels of the run's task are this run's own and not taken back yet."""
        return (1 if self._cancel_requested else 0) + self._recancels

    def take_back_cancel(self) -> None:
        """After a guarded await that ended without the CancelledError our abort's cancel threw
        into it (the awaited code caught it, and went on or raised something else): take that
        cancel back. Else it would stay on the task, taken for its owner's by every check
        after it (``cancelling()``), and the next guarded await's baseline would count it: a
        cancel of the host's there would be taken for our abort's, and swallowed."""
        if self._cancel_requested:
            self._cancel_requested = False
            if self.task is not None:
                self._take_back_recancels(self.task)
                self.task.uncancel()

    def _take_back_recancels(self, task: asyncio.Task[Any]) -> None:
        """Undo the cancels made again of the guarded await, and stop the timer that makes one."""
        if self._again is not None:
            self._again.cancel()
            self._again = None
        while self._recancels:
            self._recancels -= 1
            task.uncancel()

    def _on_abort(self, _reason: str) -> None:
        # Any thread, even a signal handler: only hand over to the loop.
        try:
            self.loop.call_soon_threadsafe(self._abort_in_loop)
        except RuntimeError:  # loop closed: the run is over anyway
            pass

    def _abort_in_loop(self) -> None:
        if self.closed or not self.signal.aborted:
            # The run is over, or this abort was a spent turn's: the loop settled that turn and
            # began the next without suspending, so the hand-over arrives inside a fresh turn
            # whose own signal it must not act for.
            return
        if self.aborted_at is None:
            self.aborted_at = self.loop.time()
        task = self.task
        if (
            self.guarding
            and not self._cancel_requested
            and task is not None
            and asyncio.current_task() is not task
        ):
            self._cancel_requested = True
            task.cancel()
            self._arm_again(task)
        self.mailbox.put(ABORTED)

    def cancel_read(self) -> None:
        """Cancel the loop's read of the model stream, if it waits: for an abort that came while
        the host held an event, when the hand-over found no read to cancel."""
        task = self.task
        if self.guarding and not self._cancel_requested and task is not None and self.signal.aborted:
            self._cancel_requested = True
            task.cancel()
            self._arm_again(task)

    def _arm_again(self, task: asyncio.Task[Any]) -> None:
        """Cancel ``task``'s guarded await again once what is left of the grace (counted from the
        abort, at least `UNWIND`) has passed, if it is still going then."""
        if self._again is None:
            self._again = self.loop.call_later(self.step_grace(self.read_grace), self._cancel_again, task)

    def _cancel_again(self, task: asyncio.Task[Any]) -> None:
        """The guarded await our abort cancelled is still going a grace later (the model's stream
        absorbed the cancellation in its cleanup, waiting on something that never comes):
        cancel it again, as a call that ignores the signal is cancelled. One that absorbs this
        cancel too is not cancelled a third time: it ends when it ends."""
        self._again = None
        if self.closed or not self.guarding or not self._cancel_requested or self.task is not task or task.done():
            return
        log.warning("the model stream did not stop within the cancel grace of the abort; cancelling it again")
        self._recancels += 1
        task.cancel()

    async def guarded(self, aw: Awaitable[T]) -> T:
        """Await ``aw`` so that an abort cancels it at once; raises `Aborted` then."""
        if self.signal.aborted:
            _close(aw)
            raise Aborted
        task = self.task = current_task_of(self.loop)
        baseline = self.cancel_baseline = task.cancelling() if task is not None else 0
        if baseline < self.host_cancels:
            self.lower_host_cancels(task, baseline)
        self.guarding = True
        try:
            return await aw
        except asyncio.CancelledError:
            if self.consume_cancel():
                raise Aborted from None
            raise
        finally:
            self.guarding = False
            self.take_back_cancel()  # still requested: ``aw`` caught it

    def cut_off(self) -> bool:
        """True when the task running the loop has been asked to cancel by someone else (not by
        this run's own abort) since the run began: whoever owns the run wants it to end now."""
        task = asyncio.current_task(self.loop)
        if task is None:
            return False
        return task.cancelling() > self.own_cancels() + self.cancels_before(task)

    def lower_host_cancels(self, task: asyncio.Task[Any] | None, cancelling: int) -> None:
        """``task`` is asked ``cancelling`` cancels as a guarded await starts, fewer than when it
        began the run: its host took back (``uncancel()``) a cancel the run began under, so a
        cancel asked from here on is one of the run, and propagates (`cancels_before`)."""
        if task is self.host:
            self.host_cancels = cancelling

    def cancels_before(self, task: asyncio.Task[Any]) -> int:
        """The cancels ``task`` had been asked when it began the run (its host's cancel cleanup
        runs it): not cancels of the run. 0 for another task."""
        return self.host_cancels if task is self.host else 0

    def owner_cancelling(self) -> bool:
        """`task_cancelling` for this run: after a CancelledError no abort of the run's caused,
        True when the running task was asked to cancel since the run began (the cancel is its
        owner's, and propagates), not only before (a run in the host's cancel cleanup)."""
        task = current_task_of(self.loop)
        return task is None or task.cancelling() > self.cancels_before(task)

    def grace_left(self, grace: float) -> float:
        """What is left of the calls' cancel ``grace`` (all of it if no abort has reached the loop)."""
        if self.aborted_at is None:
            return grace
        return max(0.0, self.aborted_at + grace - self.loop.time())

    def step_grace(self, grace: float) -> float:
        """How long one step of stopping after an abort (the read's cleanup, the stream's close,
        an abort hook) may take: what is left of ``grace``, counted once from the abort, but at
        least `UNWIND` to unwind."""
        return max(self.grace_left(grace), UNWIND)

    def close(self) -> None:
        self.closed = True
        if self._again is not None:
            self._again.cancel()
            self._again = None
        for task in self.spent_tasks:
            # A call ended by KeyboardInterrupt or SystemExit re-raised it (never swallowed) after
            # reporting it; its result is recorded, so its exception is retrieved here, not logged.
            if task.done() and not task.cancelled():
                task.exception()
        self.spent_tasks = []
        self._remove_listener()
        self.controller.unlink()


def abandon(st: RunState, task: asyncio.Task[Any], why: str) -> None:
    """Stop waiting for a call's task that ignored its cancellation; it runs on unowned.

    Python cannot stop a coroutine that swallows `CancelledError`, so the run ends
    without it; a warning names the call, once. It is cancelled once more (a tool that
    swallowed one may honour the next), not waited for; whatever it returns later is
    discarded.
    """
    use = st.pending_tasks.pop(task, None)
    if not hold_until_done(task):
        return
    task.cancel()
    name = use.name if use is not None else "?"
    log.warning("tool %r (call %s) ignored cancellation; abandoning it (%s)", name, use.id if use else "?", why)


def _close(aw: Awaitable[Any]) -> None:
    close = getattr(aw, "close", None)
    if close is not None:
        close()


def charge_ancestors(engine: QueryEngine, usage: Usage) -> None:
    """Add a subagent's ``usage`` to the current run of each engine above it.

    A parent's usage (its ``TurnEnded.usage`` and its ``usage_limit``) counts what its
    subagents spent for it. Each attempt is charged once, when it ends, so nothing is
    counted twice: not by a later run of the same child, nor by a resumed session.
    """
    parent = engine.parent
    while parent is not None:
        state = parent._state
        if state is not None:
            state.count(usage)
        parent = parent.parent


def usage_spent(engine: QueryEngine, tokens: int) -> str | None:
    """Whose ``usage_limit`` is reached, as `TurnEnded.detail` says it, with ``tokens`` spent by
    ``engine``'s run: its own, or that of a running engine above it whose budget its subagents
    share; None while every budget lasts."""
    limit = engine.options.usage_limit
    if limit is not None and tokens >= limit:
        own = "its own" if engine.parent is not None else "the run's"
        return f"{own} usage_limit of {limit} tokens is reached"
    spent = _spent_ancestor(engine)
    if spent is None:
        return None
    if spent is engine.parent:
        whose = "the parent's"
    elif spent.parent is None:
        whose = "the main engine's"
    else:
        whose = f"{spent.agent_id}'s"
    return f"{whose} usage_limit of {spent.options.usage_limit} tokens (shared with its subagents) is reached"


def _spent_ancestor(engine: QueryEngine) -> QueryEngine | None:
    """The nearest running engine above ``engine`` that has reached its ``usage_limit``, if any."""
    parent = engine.parent
    while parent is not None:
        state, limit = parent._state, parent.options.usage_limit
        if state is not None and limit is not None and state.tokens >= limit:
            return parent
        parent = parent.parent
    return None
