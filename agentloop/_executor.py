"""Running tool calls: batching, permission, timeouts, and turning failures into results.

The executor never decides what an abort means for the transcript: a call that
is aborted raises `AbortError`, and the engine synthesizes its result from
whether the call had started (``started``) or not.
"""

from __future__ import annotations

import asyncio
import inspect
import logging
import threading
import traceback
import types
from collections.abc import Awaitable, Callable, Generator, Iterable, Mapping, Sequence
from typing import TYPE_CHECKING, Any, TypeVar

from ._abort import AbortSignal, task_cancelling
from ._errors import AbortError, ToolInputError
from ._events import PermissionRequested, ToolCallStarted, _Event, check_event
from ._hostlog import host_repr
from ._messages import ToolResultBlock, ToolUseBlock, tool_result_block
from ._quick import quick_new
from ._subagent import main_engine
from ._tools import (
    Allow,
    Deny,
    PermissionCallback,
    Tool,
    ToolContext,
    ToolOutput,
    checked_call,
    close_unstarted,
    input_noted,
    output_to_result,
)
from ._transcript import lineage_credentials, redacted

if TYPE_CHECKING:
    from ._engine import QueryEngine

__all__ = ["CallRunner", "Done", "Mailbox", "Overdue", "cancel_grace", "hold_until_done", "plan_batches"]

log = logging.getLogger("agentloop")

T = TypeVar("T")

#: Seconds a cancelled call (or permission prompt) is given to unwind before it is abandoned:
#: a ``finally`` that awaits (a connection closed, a process group killed) needs a few loop turns.
UNWIND = 0.1


def cancel_grace(options: Any) -> float:
    """The engine's ``tool_cancel_grace``, but at least `UNWIND`: a quick unwind is never cut."""
    return max(float(options.tool_cancel_grace), UNWIND)


def plan_batches(
    uses: Sequence[ToolUseBlock], tools: Mapping[str, Tool], max_parallel: int
) -> list[list[ToolUseBlock]]:
    """Split calls into batches: consecutive concurrency-safe calls together (at
    most ``max_parallel``), any other call alone; the model's order is kept.

    Calls that cannot run (unknown tool, bad input) only produce an error, so
    they count as concurrency-safe.
    """
    if len(uses) == 1:  # the common case: one call is one batch, whatever the tool
        return [[uses[0]]]
    batches: list[list[ToolUseBlock]] = []
    current: list[ToolUseBlock] = []
    for use in uses:
        tool = tools.get(use.name)
        safe = tool is None or use.input_error is not None or tool.concurrency_safe
        if safe and len(current) < max(1, max_parallel):
            current.append(use)
            continue
        if current:
            batches.append(current)
            current = []
        if safe:
            current.append(use)
        else:
            batches.append([use])
    if current:
        batches.append(current)
    return batches


class Mailbox:
    """The loop's single wake-up point: tasks, tools and abort listeners put, the loop gets.

    `put` must run on the loop thread; use ``loop.call_soon_threadsafe(box.put, x)``
    from elsewhere.
    """

    __slots__ = ("_any_thread", "_items", "_waiter", "fresh")

    def __init__(self) -> None:
        self._items: list[object] = []  # a list, not a deque: an empty deque holds a 64-slot block
        self._waiter: asyncio.Future[None] | None = None
        self._any_thread: Callable[[object], None] | None = None
        # Set by who just started tasks that put here (a batch of calls): the next `get` lets
        # them take their first step before it waits. An attribute, not a method: no call.
        self.fresh = False

    def put_any_thread(self) -> Callable[[object], None]:
        """`put`, callable from any thread (what tools get as ``ctx.emit``); made once per
        mailbox, on the loop's thread, at the first tool phase that needs it."""
        if self._any_thread is None:
            self._any_thread = _from_any_thread(self.put)
        return self._any_thread

    def put(self, item: object) -> None:
        self._items.append(item)
        waiter = self._waiter
        if waiter is not None and not waiter.done():
            waiter.set_result(None)

    def take(self) -> list[object]:
        """Everything queued so far, without waiting."""
        items, self._items = self._items, []
        return items

    async def get(self) -> list[object]:
        """Everything queued so far, waiting for at least one item.

        When ``fresh``, it first yields to the loop once, behind the new tasks' first
        steps: a call that needs no await (a quick tool) has put its outcome by then, and is
        received in the same pass of the event loop, without a future and the pass that its
        result would take to wake the loop.
        """
        if self.fresh:
            self.fresh = False
            if not self._items:
                await _one_pass()
        while not self._items:
            self._waiter = asyncio.get_running_loop().create_future()
            try:
                await self._waiter
            finally:
                self._waiter = None
        items, self._items = self._items, []
        return items


@types.coroutine
def _one_pass() -> Generator[None, None, None]:
    """Give the loop one pass: a bare yield, which the task running it takes as "schedule me
    again" (what ``asyncio.sleep(0)`` does, one frame less)."""
    yield


class Done(tuple[ToolUseBlock, "ToolResultBlock | BaseException"]):
    """A finished call, ``Done((use, outcome))``, put into the mailbox by the call's own task.

    A tuple, built in C: one is made for every call, and a class's ``__init__`` would cost
    each a Python frame. The loop reads it as ``use, outcome = done``.
    """

    __slots__ = ()


class Overdue:
    """A call still running ``tool_cancel_grace`` after its own timeout cancelled it:
    it swallowed the cancellation. Put into the mailbox by a timer of the call."""

    __slots__ = ("timeout", "use")

    def __init__(self, use: ToolUseBlock, timeout: float) -> None:
        self.use = use
        self.timeout = timeout

    def result(self) -> ToolResultBlock:
        return error_result(
            self.use.id,
            f"Tool {self.use.name!r} timed out after {self.timeout:g} s and did not stop when cancelled; "
            "it was abandoned and may still have side effects.",
        )


def error_result(tool_use_id: str, text: str) -> ToolResultBlock:
    return ToolResultBlock(tool_use_id=tool_use_id, content=text, is_error=True)


# Made for every call: by functions, not by calling the class (`quick_new`).
_tool_context = quick_new(ToolContext)
_call_started = quick_new(ToolCallStarted)


class CallRunner:
    """Runs one tool call to a result; shared by every call of a run."""

    def __init__(
        self,
        engine: QueryEngine,
        signal: AbortSignal,
        mailbox: Mailbox,  # events and the calls' outcomes
        permission: PermissionCallback | None,
    ) -> None:
        self.engine = engine
        self.tools: Mapping[str, Tool] = engine.tools
        self.signal = signal
        self.emit = mailbox.put
        self.permission = permission
        self.started: set[str] = set()
        self.updated: dict[str, dict[str, Any]] = {}  # the inputs permission replaced, by call id
        # Prompts are asked one at a time, also across a parent and its subagents (`_prompt_lock`);
        # the lock is found at the first prompt: most runs ask no one.
        self._perm_lock: asyncio.Lock | None = None
        self.emit_any_thread = mailbox.put_any_thread()  # what tools get as ``ctx.emit``

    async def call(self, use: ToolUseBlock) -> None:
        """One call's task: run it and put its outcome, a `Done`, into the mailbox.

        The outcome is the result, or what ended the call without one (`_ended`). The task
        reports itself, which saves the loop a done-callback hop, and awaits the handler
        directly, with or without a timeout: no helper coroutine, so one frame less for every
        resumption of every call. What awaits nothing is a method: the input's check
        (`_checked`), the start (`_begin`), the results (`_failed`, `_unusual`); the permission
        prompt, awaited only by a call that has one, is `_prompted`. The handler's call made to
        check the input (`checked_call`) is closed at the end unless it was handed over to be awaited.
        """
        key = use.id  # a pydantic model's fields are read through its __getattr__ hook: read once
        opened: Awaitable[ToolOutput] | Exception | None = None
        try:
            checked = self._checked(use, key)
            if isinstance(checked, ToolResultBlock):
                result = checked
            else:
                tool, ctx, given, opened = checked
                refused, tool_input = None, given
                if self.permission is not None:
                    refused, tool_input, opened = await self._prompted(use, tool, ctx, opened)
                if refused is not None:
                    result = refused
                else:
                    updated = self._begin(use, key, given, tool_input)
                    scope: asyncio.Timeout | None = None
                    pending: object = None  # what the handler returned, for `_failed` to tell a sync one
                    try:
                        if isinstance(opened, Exception):  # a validator's own error: the tool's failure
                            raise opened
                        pending = call = tool.handler(tool_input, ctx) if opened is None else opened
                        if tool.timeout is None:
                            opened = None  # handed over
                            output = await call
                        else:
                            overdue = self._overdue(use, tool.timeout)
                            try:
                                async with asyncio.timeout(tool.timeout) as scope:
                                    opened = None  # handed over
                                    output = await call
                            finally:
                                overdue.cancel()
                    except asyncio.CancelledError:
                        raise
                    except BaseException as exc:  # SystemExit, GeneratorExit, a framework's own: the tool's failure too
                        if isinstance(exc, GeneratorExit) and loop_gone():
                            raise
                        had = ctrl_c_had(exc)
                        if had:  # the host has it: the run stops, the call ends quietly
                            raise ctrl_c_seen(self.engine, self.signal) from exc
                        if had is not None:  # raised in this task: it goes out from here, bare
                            if isinstance(exc, KeyboardInterrupt):
                                raise
                            raise KeyboardInterrupt from exc
                        result = self._failed(use, tool, exc, scope, pending)
                    else:
                        if type(output) is str and output.strip():  # the common case, as output_to_result builds it
                            result = tool_result_block(key, output)
                        else:
                            result = self._unusual(use, output)
                    if updated is not None:  # the model's call is left as it wrote it: its result says what ran
                        result = input_noted(result, updated, self.engine.options.texts.input_updated)
        except BaseException as exc:
            if self._ended(use, exc):
                raise
        else:
            self.emit(Done((use, result)))
        finally:
            if opened is not None:  # made to check the input, never awaited: no warning left behind
                close_unstarted(opened)

    def _checked(
        self, use: ToolUseBlock, key: str
    ) -> ToolResultBlock | tuple[Tool, ToolContext, dict[str, Any], Awaitable[ToolOutput] | Exception | None]:
        """The refusal of a call that cannot run (no such tool, input that never parsed or that
        the tool refuses: no one is asked about it), or its tool, context, input, and the
        handler's call checked with that input (`checked_call`)."""
        tool = self.tools.get(use.name)
        if tool is None or use.input_error is not None:
            return self._refusal(use, tool)
        ctx = _tool_context(self.signal, key, self.engine, self.emit_any_thread)
        given: dict[str, Any] = use.input
        opened = checked_call(tool, given, ctx)
        if isinstance(opened, ToolInputError):
            return self._failed(use, tool, opened, None, None)
        return tool, ctx, given, opened

    def _begin(self, use: ToolUseBlock, key: str, given: dict[str, Any], tool_input: dict[str, Any]) -> dict[str, Any] | None:
        """The call starts, unless the run was aborted first (`AbortError`): it is marked started
        and the host told (`ToolCallStarted`). Returns the input a permission callback put in
        the model's place (None when the call runs with the model's): a call that started only."""
        if self.signal._reason is not None:  # `throw_if_aborted()`, called only to raise
            self.signal.throw_if_aborted()
        self.started.add(key)
        updated = None if tool_input is given else tool_input
        if updated is not None:
            self.updated[key] = updated
        self.emit(_call_started(tool_use=use, updated_input=updated))
        return updated

    def _overdue(self, use: ToolUseBlock, timeout: float) -> asyncio.TimerHandle:
        """The timer that gives up on a call a cancel grace after its timeout (see `Overdue`): if
        the timeout's cancellation is swallowed, the timeout holds all the same; a grace of 0
        still leaves a call that honours the cancellation time to unwind."""
        when = timeout + cancel_grace(self.engine.options)
        return asyncio.get_running_loop().call_later(when, self.emit, Overdue(use, timeout))

    def _ended(self, use: ToolUseBlock, exc: BaseException) -> bool:
        """Put what ended the call without a result into the mailbox: an `AbortError` when the
        run was aborted first, a cancellation, Ctrl-C (which stops the run first) or a bug in
        agentloop (never lost). True when it goes on (a cancellation is never swallowed); a
        GeneratorExit of a loop that is gone goes on unreported, nothing can be scheduled."""
        if isinstance(exc, GeneratorExit) and loop_gone():
            return True
        if isinstance(exc, KeyboardInterrupt):
            stop_for_ctrl_c(self.engine)
        self.emit(Done((use, exc)))
        return isinstance(exc, (asyncio.CancelledError, KeyboardInterrupt, SystemExit))

    async def _prompted(
        self, use: ToolUseBlock, tool: Tool, ctx: ToolContext, opened: Awaitable[ToolOutput] | Exception | None
    ) -> tuple[ToolResultBlock | None, dict[str, Any], Awaitable[ToolOutput] | Exception | None]:
        """Ask the permission callback about a call whose input checked (``opened``, what
        `checked_call` made of it): the refusal (None when allowed), the input to run with,
        and the handler's call checked with that input. An input the callback put in the
        model's place is checked again; the call checked with the model's is closed then."""
        given: dict[str, Any] = use.input
        decision = await self._ask(use, ctx)
        if not isinstance(decision, Allow):
            return decision, given, opened  # refused: the refusal is the result
        replaced = decision.updated_input
        if replaced is None:
            return None, given, opened
        try:
            changed = replaced != given
        except Exception as exc:  # a value of the host's whose __eq__ raises: the callback's answer is unusable
            return self._uncomparable(use, exc), given, opened
        if changed:
            close_unstarted(opened)  # checked with the input it will not run with
            opened = checked_call(tool, replaced, ctx)
            if isinstance(opened, ToolInputError):
                return self._updated_refused(use, opened), replaced, opened
            return None, replaced, opened
        return None, given, opened

    def _uncomparable(self, use: ToolUseBlock, exc: Exception) -> ToolResultBlock:
        """The result of an ``Allow(updated_input=...)`` that cannot be compared with the model's
        input (a value's ``__eq__`` raised): the host's bug, told as the callback's wrong answer."""
        what = describe(exc)
        secrets = lineage_credentials(self.engine)
        if secrets:
            what = redacted(what, secrets)
        return self._wrong_answer(
            use,
            f"The permission callback returned Allow(updated_input=...) whose values cannot be compared "
            f"with the call's input ({what}); the tool was not run.",
        )

    @staticmethod
    def _unusual(use: ToolUseBlock, output: object) -> ToolResultBlock:
        """The result of a handler that returned anything but non-blank text: normalised by
        `output_to_result`, or an error result when it cannot be represented."""
        try:
            return output_to_result(use.id, output)
        except Exception as exc:  # a result that cannot be represented
            return error_result(use.id, f"Tool {use.name!r} returned an unusable result: {describe(exc, name=False)}")

    def _refusal(self, use: ToolUseBlock, tool: Tool | None) -> ToolResultBlock:
        """The error result of a call that cannot run: no such tool, or input that never parsed."""
        if tool is None:
            names = ", ".join(sorted(self.tools)) or "(none)"
            return error_result(use.id, f"Unknown tool {use.name!r}. Available tools: {names}.")
        return error_result(use.id, f"Tool {use.name!r} was not run: {use.input_error}")

    @staticmethod
    def _updated_refused(use: ToolUseBlock, exc: ToolInputError) -> ToolResultBlock:
        """The result of a call whose input a permission callback replaced with one the tool
        refuses: it did not run, with either input."""
        return error_result(
            use.id,
            f"Tool {use.name!r} was not run: the permission check changed this call's input, and the "
            f"tool refused the input it was given: {exc}",
        )

    def _failed(
        self, use: ToolUseBlock, tool: Tool, exc: BaseException, scope: asyncio.Timeout | None, returned: object
    ) -> ToolResultBlock:
        """The result of a handler that raised, or that ``returned`` what cannot be awaited (a sync
        def: `Tool` cannot tell it from a def returning an awaitable); an `AbortError` of an
        aborted run goes on."""
        if isinstance(exc, TypeError) and returned is not None and not inspect.isawaitable(returned):
            return error_result(
                use.id,
                f"Tool {use.name!r} has a handler that returned {type(returned).__name__}, not an awaitable: "
                "its handler must be an async def (or return an awaitable).",
            )
        if isinstance(exc, TimeoutError) and scope is not None and scope.expired():
            return error_result(use.id, f"Tool {use.name!r} timed out after {tool.timeout:g} s and was stopped.")
        if isinstance(exc, SystemExit):  # a command-line parser inside the tool, given bad arguments
            return error_result(
                use.id, f"Tool {use.name!r} tried to exit the program (SystemExit({exc.code!r})); it was stopped there."
            )
        if isinstance(exc, ToolInputError):
            return error_result(use.id, f"Tool {use.name!r} was not run: {exc}")
        if isinstance(exc, AbortError):
            if self.signal.aborted:
                raise exc
            return error_result(use.id, f"Tool {use.name!r} raised AbortError although the run was not aborted.")
        if isinstance(exc, BaseExceptionGroup) and self.signal.aborted and _only_aborts(exc):
            # The parts of a tool that fans out (asyncio.TaskGroup) each stopped on the abort.
            raise AbortError(self.signal.reason or "cancel") from exc
        what = describe(exc)
        return error_result(use.id, f"Tool {use.name!r} raised {what}{'.' if what == type(exc).__name__ else ''}")

    async def _ask(self, use: ToolUseBlock, ctx: ToolContext) -> Allow | ToolResultBlock:
        assert self.permission is not None
        permission = self.permission

        lock = self._perm_lock
        if lock is None:
            lock = self._perm_lock = _prompt_lock(self.engine, permission)

        async def ask() -> Allow | Deny:
            self.signal.throw_if_aborted()
            self.emit(PermissionRequested(tool_use=use))
            try:
                decision: Awaitable[Allow | Deny] | Allow | Deny = permission(use, ctx)
                # A plain function answering at once is a permission callback too (as for on_abort).
                return await decision if inspect.isawaitable(decision) else decision
            except (KeyboardInterrupt, BaseExceptionGroup) as exc:
                had = ctrl_c_had(exc)
                if had:  # another task had it, and the host from there
                    seen = ctrl_c_seen(self.engine, self.signal)
                    if task_cancelling():  # asyncio.run's cleanup cancels every task: the cancel goes on
                        raise asyncio.CancelledError from exc
                    raise seen from exc
                if had is None:
                    raise
                stop_for_ctrl_c(self.engine)  # goes out of the loop from this task: the run stops first
                if isinstance(exc, KeyboardInterrupt):
                    raise
                raise KeyboardInterrupt from exc
            except SystemExit as exc:
                # A prompt's own parser refusing the answer typed (argparse, click): raised from this
                # task's step, it would leave the event loop and end the host program. A failed check.
                # Once the run is aborted it is a host abort listener's exit (the callback called
                # interrupt()): that one propagates out of abort(), as docs/concepts.md says.
                if self.signal.aborted:
                    raise
                raise _PromptExited(exc) from exc
            except asyncio.CancelledError:
                if self.signal.aborted or task_cancelling():
                    raise  # the run's abort, or this prompt's own cancel: not the callback's to end
                return _CLOSED  # what it awaited was cancelled (the prompt's future): the user closed it

        # One prompt at a time. The turn is held by this call's task, not by the prompt's: a
        # prompt abandoned for ignoring its cancellation gives the turn back all the same (an
        # engine that shares it, a parent still running, may be waiting for it).
        await _take_turn(lock, self.signal)  # AbortError if the run is aborted first
        try:
            decision = await race_abort(ask(), self.signal)
        except AbortError as exc:
            if self.signal.aborted:  # the run's abort: the call never started
                raise
            return self._check_failed(use, exc)
        except (asyncio.CancelledError, KeyboardInterrupt):
            raise
        except _PromptExited as exc:
            return self._check_failed(use, exc.exited)
        except BaseException as exc:  # GeneratorExit or a framework's own: the callback's failure too
            return self._check_failed(use, exc)
        finally:
            lock.release()
        if decision is _CLOSED:
            log.debug("the permission prompt for tool call %s (%r) was closed without an answer", use.id, use.name)
        if isinstance(decision, Deny):
            # A str, unless the Deny was made around its check (object.__new__, an unpickler).
            why = decision.message.strip() if isinstance(decision.message, str) else ""
            return error_result(use.id, f"Permission denied: {why}" if why else "Permission denied.")
        if not isinstance(decision, Allow):
            shown = host_repr(self.engine, decision)
            return self._wrong_answer(use, f"The permission callback returned {shown}, not Allow or Deny; the tool was not run.")
        if decision.updated_input is not None and not isinstance(decision.updated_input, dict):
            return self._wrong_answer(
                use,
                f"The permission callback returned Allow(updated_input=...) with a "
                f"{type(decision.updated_input).__name__}, not a dict of the tool's arguments; the tool was not run.",
            )
        return decision

    def _wrong_answer(self, use: ToolUseBlock, text: str) -> ToolResultBlock:
        """The result of a permission callback's answer that is not one (the host's bug): the
        model is told, and so is the host, on the log (the call's input is not logged); ``text``
        quotes the answer without the engine's credentials (`host_repr`)."""
        log.warning("tool call %s (%r): %s", use.id, use.name, text)
        return error_result(use.id, text)

    def _check_failed(self, use: ToolUseBlock, exc: BaseException) -> ToolResultBlock:
        """The result of a permission callback that raised; logged with its traceback, as the
        host's own code failed (a prompt with a timeout of its own gave up: no traceback)."""
        what = describe(exc)
        trace = None if isinstance(exc, AbortError) else exc
        secrets = lineage_credentials(self.engine)
        if secrets and trace is not None:  # the traceback as text, so the model's key can be taken out
            text = "".join(traceback.format_exception(trace)).rstrip()
            what, trace, tail = redacted(what, secrets), None, "\n" + redacted(text, secrets)
        else:
            tail = ""
        log.error(
            "permission callback failed for tool call %s (%r): %s; the call was not run%s",
            use.id, use.name, what, tail, exc_info=trace,
        )  # fmt: skip
        return error_result(use.id, f"The permission check failed ({what}); the tool was not run.")


def _only_aborts(group: BaseExceptionGroup[BaseException]) -> bool:
    """True when every exception in ``group`` (nested groups included) is an `AbortError`."""
    _, rest = group.split(AbortError)
    return rest is None


class _PromptExited(Exception):
    """A permission callback raised SystemExit: carried out of the prompt's task as an error."""

    def __init__(self, exited: SystemExit) -> None:
        super().__init__(exited)
        self.exited = exited


#: The answer of a prompt the user closed without answering (a permission callback that ended
#: with a CancelledError nobody asked of its task, the run not aborted): a denial that says so.
_CLOSED = Deny("the user closed the permission prompt without answering; the tool was not run.")


def _prompt_lock(engine: QueryEngine, permission: PermissionCallback) -> asyncio.Lock:
    """What ``engine``'s prompts take turns on: the lock of its parent's current turn when the
    parent is running and asks the same callback (the subagents it runs, in parallel perhaps,
    and the parent itself ask one person, one prompt at a time), else a lock of its own."""
    parent = engine.parent
    state = parent._state if parent is not None else None
    runner = state.runner if state is not None else None
    if parent is None or runner is None or runner.permission is not permission:
        return asyncio.Lock()
    if runner._perm_lock is None:
        runner._perm_lock = _prompt_lock(parent, permission)
    return runner._perm_lock


async def _take_turn(lock: asyncio.Lock, signal: AbortSignal) -> None:
    """Acquire ``lock`` unless ``signal`` aborts first (then raise `AbortError`). Whatever ends
    the wait (an abort, a cancellation), it never leaves the lock held."""
    signal.throw_if_aborted()
    acquiring = asyncio.ensure_future(lock.acquire())
    waiter = asyncio.ensure_future(signal.wait())
    try:
        await asyncio.wait({acquiring, waiter}, return_when=asyncio.FIRST_COMPLETED)
    except BaseException:
        _give_back(acquiring, lock)
        raise
    finally:
        waiter.cancel()
    if signal.aborted:  # perhaps as the lock came: no prompt is asked
        _give_back(acquiring, lock)
        signal.throw_if_aborted()


def _give_back(acquiring: asyncio.Future[Any], lock: asyncio.Lock) -> None:
    """Release what ``acquiring`` took, or stop it (a cancelled `Lock.acquire` never holds the
    lock: it hands its turn to the next waiter)."""
    if not acquiring.done():
        acquiring.cancel()
    elif not acquiring.cancelled() and acquiring.exception() is None:
        lock.release()


def stop_for_ctrl_c(engine: QueryEngine) -> None:
    """A KeyboardInterrupt raised in a call's own code (a tool, a permission prompt): Ctrl-C, for
    the whole run. It goes on out of the event loop; a loop that runs again afterwards (a
    notebook's next cell) finds the run stopped, as ``interrupt()`` stops it, not going on."""
    main_engine(engine).interrupt("cancel")


#: The frame of a callback the event loop runs (a task's step): a KeyboardInterrupt whose traceback
#: passed through it left the loop from there, out to the host.
_LOOP_CALLBACK = asyncio.events.Handle._run.__code__


def ctrl_c_had(exc: BaseException) -> bool | None:
    """Whether ``exc``, raised in a call's task (a tool's call, a permission prompt), is Ctrl-C the
    host had already (True), Ctrl-C that has not left the event loop yet (False), or no Ctrl-C at
    all (None).

    asyncio lets a KeyboardInterrupt out of the loop from the step of the task it was raised in,
    after keeping it as that task's outcome. One raised in another task than the call's (a task
    group's child, a task awaited, the task ``wait_for`` makes for a coroutine) reached the host
    from there, and reaches the call when the loop runs again: raised from the call's task too, it
    would be a second Ctrl-C no one pressed (in asyncio.run's cleanup, or a notebook's next cell).
    It is told by being some task's outcome (`_kept_by_a_task`), or, once that task is gone (a task
    group lets go of its children before raising their errors), by a traceback that went through
    the loop's own frames. A BaseExceptionGroup holding KeyboardInterrupts (anyio's task groups)
    is the host's when every one of them is."""
    if isinstance(exc, BaseExceptionGroup):
        if exc.subgroup(KeyboardInterrupt) is None:
            return None
        return exc.subgroup(lambda leaf: isinstance(leaf, KeyboardInterrupt) and not ctrl_c_had(leaf)) is None
    if not isinstance(exc, KeyboardInterrupt):
        return None
    return _kept_by_a_task(exc) or _left_the_loop(exc)


def _kept_by_a_task(exc: BaseException) -> bool:
    """Whether ``exc`` is the outcome of a finished task still alive (asyncio keeps every live
    task in a weak registry, finished ones included): a task cannot be given an exception from
    outside (`Task.set_exception` raises), so a KeyboardInterrupt it keeps was raised in its own
    step, and went out of the loop from there. ``Future.result()`` hands it on with the traceback
    it had then, before it went out: the traceback alone cannot tell."""
    for registry in ("_all_tasks", "_scheduled_tasks"):  # the name before Python 3.12, and after
        tasks = getattr(asyncio.tasks, registry, None)
        if tasks is None:
            continue
        for task in _snapshot(tasks):
            try:
                if task.done() and not task.cancelled() and getattr(task, "_exception", None) is exc:
                    return True
            except Exception:  # a registry of another shape (a later Python): the traceback decides
                return False
    return False


def _snapshot(tasks: Iterable[asyncio.Task[Any]]) -> list[asyncio.Task[Any]]:
    """The tasks of a registry shared by every thread's loop (a WeakSet): another thread making a
    task while it is copied changes its size under the copy, so it is copied again, as
    `asyncio.all_tasks` does; never failing (an empty list after that: the traceback decides)."""
    for _ in range(1000):
        try:
            return list(tasks)
        except RuntimeError:
            continue
    return []


def _left_the_loop(exc: BaseException) -> bool:
    """Whether ``exc``'s traceback passed through a callback the loop ran (`_LOOP_CALLBACK`)."""
    tb = exc.__traceback__
    while tb is not None:
        if tb.tb_frame.f_code is _LOOP_CALLBACK:
            return True
        tb = tb.tb_next
    return False


def ctrl_c_seen(engine: QueryEngine, signal: AbortSignal) -> AbortError:
    """What a call's task raises for Ctrl-C the host had already (`ctrl_c_had`): the run stops as
    for a bare one (`stop_for_ctrl_c`), and the call ends on the abort, quietly: the call is
    reported stopped, and nothing goes out of the loop a second time."""
    stop_for_ctrl_c(engine)
    return AbortError(signal.reason or "cancel")


def loop_gone() -> bool:
    """No event loop runs this code, or its loop is closed: a coroutine closed with the loop it
    was left in (closed under it) may only unwind, since nothing can be scheduled there."""
    try:
        return asyncio.get_running_loop().is_closed()
    except RuntimeError:
        return True


def _from_any_thread(put: Callable[[object], None]) -> Callable[[object], None]:
    """``put``, callable from any thread: a tool may report progress from a worker thread
    (``asyncio.to_thread``), and the mailbox may only be touched on the loop's thread."""
    loop = asyncio.get_running_loop()
    loop_thread = threading.get_ident()

    def emit(item: object) -> None:
        if not isinstance(item, _Event):  # the test inline: a subagent forwards each of its events
            check_event(item)
        if threading.get_ident() == loop_thread:
            put(item)
            return
        try:
            loop.call_soon_threadsafe(put, item)
        except RuntimeError:  # the loop is closed: the run is long over, no one would read it
            pass

    return emit


def describe(exc: BaseException, *, name: bool = True) -> str:
    """``Name: message`` (or only the message; only the name when it has no message),
    even for an exception whose ``__str__`` raises."""
    try:
        text = str(exc)
    except Exception:
        return f"{type(exc).__name__} (its message could not be formatted)"
    if not name:
        return text
    return f"{type(exc).__name__}: {text}" if text else type(exc).__name__


#: Tasks given up on because they ignored their cancellation: held here until they end, so that
#: one waiting on a future nothing else holds is not garbage-collected mid-await.
_abandoned: set[asyncio.Task[Any]] = set()


def hold_until_done(task: asyncio.Task[Any]) -> bool:
    """Keep ``task`` referenced until it ends. False (nothing done) when it has ended or is
    held already, so a caller reports an abandoned task once."""
    if task.done() or task in _abandoned:
        return False
    _abandoned.add(task)
    task.add_done_callback(_abandoned.discard)
    return True


async def _unwound(task: asyncio.Task[Any]) -> None:
    """Give ``task``, cancelled, `UNWIND` seconds to end; one that ignores its cancellation is
    abandoned (with a warning) rather than allowed to hold the run open. A cancel of the caller's
    meanwhile (the run cancels the call: its grace is over) is raised once ``task`` has ended or
    that time is up, not before: a prompt that honours its cancel in a few loop turns (a dialog
    closing) is waited for, not abandoned to run on after the run."""
    loop = asyncio.get_running_loop()
    ends = loop.time() + UNWIND
    cancelled: asyncio.CancelledError | None = None
    while not task.done() and (left := ends - loop.time()) > 0:
        try:
            await asyncio.wait({task}, timeout=left)
        except asyncio.CancelledError as exc:
            cancelled = exc  # raised below: the caller's, never swallowed
    if not task.done() and hold_until_done(task):
        log.warning("%r ignored cancellation; abandoning it", task.get_coro())
    if cancelled is not None:
        raise cancelled


async def race_abort(aw: Awaitable[T], signal: AbortSignal) -> T:
    """Await ``aw`` unless ``signal`` aborts first; then cancel it and raise `AbortError`.

    Aborted already: a coroutine passed in is closed unstarted (never left unawaited).
    """
    if signal.aborted:
        if asyncio.iscoroutine(aw):
            aw.close()
        signal.throw_if_aborted()
    task = asyncio.ensure_future(aw)
    waiter = asyncio.ensure_future(signal.wait())
    try:
        await asyncio.wait({task, waiter}, return_when=asyncio.FIRST_COMPLETED)
    finally:
        waiter.cancel()
        if not task.done():
            task.cancel()
            await _unwound(task)
        elif signal.aborted and not task.cancelled():
            # Ended as the run was aborted (a KeyboardInterrupt out of its own step, which the host
            # had already): its outcome is of no use, also when this wait is cancelled meanwhile
            # (asyncio.run cancels every task once Ctrl-C has left the loop).
            task.exception()
    if signal.aborted and (task.cancelled() or not task.done() or isinstance(task.exception(), KeyboardInterrupt)):
        # A KeyboardInterrupt left the loop from the task's own step, which stopped the run: the
        # host had it once, and the abort is what is left of it here.
        raise AbortError(signal.reason or "cancel")
    if task.cancelled():  # it cancelled itself: a failure of its own, not an abort
        raise RuntimeError("it was cancelled although the run was not aborted")
    return task.result()
