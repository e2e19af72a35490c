"""Cancellation: one controller, one signal, shared by everything a run starts.

`AbortController.abort()` is the only way a signal becomes aborted. It is plain
synchronous code that never blocks, so it is safe to call from any thread, from
a signal handler and from inside a tool.

Invariants:
- a signal goes from "not aborted" to "aborted" at most once; the first reason
  wins and never changes afterwards;
- every listener registered before or after the abort is called exactly once
  with the reason (late listeners are called at registration), unless it was
  removed before the abort reached it;
- a child controller (``AbortController(parent=...)``) follows its parent, never
  the other way round.
"""

from __future__ import annotations

import asyncio
import contextlib
import contextvars
import functools
import itertools
import math
import numbers
import threading
import time
import weakref
from collections.abc import Callable, Iterable
from typing import Any

from ._errors import AbortError
from ._timers import Timer, timer_thread

__all__ = ["AbortController", "AbortError", "AbortSignal"]

Listener = Callable[[str], object]
#: What gives the credentials to scrub out of a listener's error, when one raises.
Secrets = Callable[[], Iterable[str]]
#: The credentials of the engine whose run the code at hand belongs to (a tool call's task, what it
#: awaits, the timers it sets): a listener raising there, on a signal that knows none, is logged
#: without them.
_run_secrets: contextvars.ContextVar[Secrets | None] = contextvars.ContextVar("agentloop_run_secrets", default=None)


class AbortSignal:
    """The read side of an `AbortController`: observe, never trigger.

    Created by a controller; use `AbortSignal.any` and `AbortSignal.timeout` for
    derived signals.
    """

    __slots__ = ("__weakref__", "_keys", "_links", "_listeners", "_once", "_reason", "_secrets", "_waiters")

    def __init__(self) -> None:
        self._reason: str | None = None
        # Test-and-set: each `_abort` that finds it empty appends a claim of its own (one
        # atomic step, never blocking), and the first claim in it wins, even from a signal
        # handler that interrupted another `_abort` on the same thread. Whoever loses reads
        # the winner's reason there at once, before the winner records it in ``_reason``.
        self._once: list[tuple[str]] = []
        self._listeners: dict[int, Listener] = {}
        self._keys = itertools.count()
        self._waiters: _LoopWaiters | None = None  # made by the first wait()
        # How it follows a parent signal, or the sources of any(): set as it is made, never after.
        self._links: tuple[_Link, ...] = ()
        # The credentials to scrub out of the log line of a listener that raises (`scrub_listener_errors`):
        # set by an engine on its run's signal, taken by the signals that follow it as they are made.
        self._secrets: Secrets | None = None

    def __repr__(self) -> str:
        state = f"aborted reason={self._reason!r}" if self._reason is not None else "active"
        return f"<AbortSignal {state}>"

    @property
    def aborted(self) -> bool:
        """True once the controller has aborted."""
        return self._reason is not None or bool(self._once)

    @property
    def reason(self) -> str | None:
        """The first abort's reason, or None while not aborted."""
        reason = self._reason
        if reason is None and (claims := self._once):  # the abort that won is recording it
            return claims[0][0]
        return reason

    def throw_if_aborted(self) -> None:
        """Raise `AbortError` with the reason if aborted; otherwise do nothing."""
        reason = self._reason
        if reason is not None:
            raise AbortError(reason)

    def add_listener(self, fn: Listener) -> Callable[[], None]:
        """Call ``fn(reason)`` once on abort; returns a function that removes it.

        If the signal is already aborted, ``fn`` is called at once. A listener
        runs in the thread that aborts; exceptions it raises are logged and swallowed
        so one bad listener cannot stop the others. A KeyboardInterrupt or SystemExit
        propagates out of ``abort()``, after the other listeners ran. Raises TypeError
        for an ``fn`` that is not callable.
        """
        if not callable(fn):
            raise TypeError(f"add_listener takes a callable fn(reason), not {type(fn).__name__}")
        key = next(self._keys)
        listeners = self._listeners
        listeners[key] = fn
        links = self._links
        for link in links:  # a followed signal with a listener is held by what it follows
            link.keep = self
        if self._reason is not None:
            # Aborted while (or before) we registered: whoever pops the entry
            # calls it, so it runs exactly once.
            self._dispatch(key)
        if not links:

            def remove() -> None:
                listeners.pop(key, None)

            return remove

        def remove_followed() -> None:
            listeners.pop(key, None)
            if not listeners:  # nothing listens: what it follows may let it go
                for link in links:
                    link.keep = None
                if listeners:  # one was added meanwhile (its own `keep` may have come first)
                    for link in links:
                        link.keep = self

        return remove_followed

    async def wait(self) -> str:
        """Wait until aborted and return the reason (returns at once if already aborted)."""
        reason = self._reason
        if reason is not None:
            return reason
        loop = asyncio.get_running_loop()
        waiters = self._waiters
        if waiters is None or waiters.loop is not loop:
            waiters = self._waiters = _LoopWaiters(loop)
            waiters.remove = self.add_listener(waiters)
        fut: asyncio.Future[str] = loop.create_future()
        waiters.futures.add(fut)
        reason = self._reason
        if reason is not None and not fut.done():  # aborted (from another thread) meanwhile
            fut.set_result(reason)
        try:
            return await fut
        finally:
            futures = waiters.futures
            futures.discard(fut)
            if not futures:  # the last waiter of this loop: nothing stays registered
                waiters.remove()
                if self._waiters is waiters:
                    self._waiters = None

    @staticmethod
    def any(signals: Iterable[AbortSignal]) -> AbortSignal:
        """A signal that aborts when any of ``signals`` does, with that one's reason.

        Once it has aborted, it stops listening to every source, so a long-lived
        source (an application-wide signal combined with a per-call timeout) does
        not keep one listener per derived signal.
        """
        sources = [_signal(sig, "AbortSignal.any()") for sig in signals]  # all checked before any is linked
        derived = AbortSignal()
        for sig in sources:
            derived._follow(sig)
            if derived.aborted:
                break
        return derived

    @staticmethod
    def timeout(seconds: float, reason: str = "deadline") -> AbortSignal:
        """A signal that aborts with ``reason`` after ``seconds``.

        Inside a running event loop the timer is a loop callback (on the loop's clock); if that
        loop is closed first, the timer is handed to a shared thread and still fires on time.
        Outside a loop, one daemon thread serves every timeout (started when needed, ended
        when none is pending). The timer does not keep the signal alive: one that nothing
        holds and nothing listens to is let go with its timer. ``seconds`` is a number
        (TypeError otherwise, ValueError for NaN); zero or less aborts at the first chance,
        and infinity (or more than ``threading.TIMEOUT_MAX``) never. A ``reason`` that is not
        a str is a TypeError, as for `AbortController.abort`.
        """
        if isinstance(seconds, bool) or not isinstance(seconds, numbers.Real):
            raise TypeError(f"AbortSignal.timeout takes a number of seconds, not {seconds!r}")
        try:
            seconds = float(seconds)
        except OverflowError:  # an int past any float: as far off as infinity (or as long ago)
            seconds = math.inf if seconds > 0 else -math.inf
        if math.isnan(seconds):
            raise ValueError("AbortSignal.timeout takes a number of seconds, not NaN")
        if not isinstance(reason, str):  # the timer's abort() would refuse it, and never abort
            raise TypeError(f"AbortSignal.timeout takes a str reason, such as \"deadline\", not {reason!r}")
        signal = AbortSignal()
        if seconds > threading.TIMEOUT_MAX:  # longer than a thread can wait: never
            return signal
        # The timer aborts the signal through a link, as a parent does a child: it holds the
        # signal only while something listens to it, and is cancelled when the signal aborts
        # or is collected.
        link = _Link(signal)
        timer = Timer(link, reason, time.monotonic() + seconds)
        link.remove = timer.cancel
        signal._links = (link,)
        try:
            loop = asyncio.get_running_loop()
        except RuntimeError:
            timer_thread.add(timer)
        else:
            timer.watch(loop, loop.call_later(seconds, timer.fire))
        return signal

    # -- controller side ---------------------------------------------------

    def _abort(self, reason: str) -> bool:
        claims = self._once
        if claims:
            return False
        claim = (reason,)  # a new tuple each time: only the abort that made it finds it first
        claims.append(claim)
        if claims[0] is not claim:
            return False
        self._reason = reason
        for link in self._links:  # aborted: it follows nothing any more
            link.cut()
        keys = list(self._listeners)
        try:
            for key in keys:
                self._dispatch(key)
        except BaseException:
            # A KeyboardInterrupt (Ctrl-C landing in a listener) or a SystemExit: it propagates,
            # after the listeners not reached yet, which nothing would ever call otherwise.
            for key in keys:
                try:
                    self._dispatch(key)  # a no-op for those already called
                except BaseException:  # the first one is the one that propagates
                    pass
            raise
        return True

    def _dispatch(self, key: int) -> None:
        fn = self._listeners.pop(key, None)  # atomic: exactly one caller gets it
        if fn is None:
            return
        reason = self._reason
        assert reason is not None
        try:
            fn(reason)
        except Exception:  # a listener must not break abort() for the others
            secrets = self._secrets
            _log_listener_error(fn, secrets if secrets is not None else _run_secrets.get())

    def _follow(self, source: AbortSignal) -> None:
        """Abort when ``source`` does. ``source`` holds this signal only while something listens
        to it: one that nothing holds and nothing listens to cannot be observed, and is let go
        (a long-lived parent does not keep every short-lived child it ever had)."""
        link = _Link(self)
        self._links = (*self._links, link)
        if self._secrets is None:  # a child of an engine's run: its listeners' errors are scrubbed too
            self._secrets = source._secrets
        if self._listeners:
            link.keep = self
        link.remove = source.add_listener(link)  # called at once if ``source`` has aborted
        if self._reason is not None:  # aborted meanwhile, before ``remove`` was set
            link.cut()


class AbortController:
    """Owns a signal and aborts it.

    ``parent``: when given, the controller aborts (with the same reason) as soon
    as the parent signal does; aborting this controller never touches the parent.
    """

    __slots__ = ("signal",)

    def __init__(self, *, parent: AbortSignal | None = None) -> None:
        self.signal = AbortSignal()
        if parent is not None:
            self.signal._follow(_signal(parent, "AbortController(parent=...)"))

    def __repr__(self) -> str:
        return f"<AbortController signal={self.signal!r}>"

    def abort(self, reason: str = "cancel") -> None:
        """Abort the signal with ``reason``. Idempotent: later calls are ignored.

        Raises TypeError, and aborts nothing, for a ``reason`` that is not a str (a None reason
        would take the signal's one abort and leave it not aborted, for good)."""
        if not isinstance(reason, str):
            raise TypeError(f"abort() takes a str reason, such as \"cancel\", not {reason!r}")
        self.signal._abort(reason)

    def unlink(self) -> None:
        """Stop following the parent signal."""
        for link in self.signal._links:
            link.cut()


class _Link:
    """The listener by which a signal follows another: it aborts the follower, which it holds
    strongly (``keep``) only while the follower has listeners, and weakly otherwise. When the
    follower is collected, the link leaves the signal it was registered on."""

    __slots__ = ("__weakref__", "follower", "keep", "remove")

    def __init__(self, follower: AbortSignal) -> None:
        self.keep: AbortSignal | None = None
        self.remove: Callable[[], None] = _nothing
        self.follower = weakref.ref(follower, self._gone)

    def __call__(self, reason: str) -> None:
        follower = self.follower()
        if follower is not None:
            follower._abort(reason)

    def cut(self) -> None:
        """Leave the signal followed (idempotent)."""
        self.remove()
        self.keep = None

    def _gone(self, _ref: object) -> None:
        self.remove()


def _signal(value: object, where: str) -> AbortSignal:
    """``value`` if it is a signal; TypeError otherwise (a controller is the usual slip)."""
    if isinstance(value, AbortSignal):
        return value
    if isinstance(value, AbortController):
        raise TypeError(f"{where} takes an AbortSignal, not an AbortController: pass its .signal")
    raise TypeError(f"{where} takes an AbortSignal, not {type(value).__name__}")


class _LoopWaiters:
    """The `AbortSignal.wait` futures of one event loop, woken by one listener.

    An abort from another thread costs one hop to the loop for all of them, and
    an abort on the loop's own thread wakes them all at once (and nudges the loop,
    which a signal handler may have interrupted in its sleep).
    """

    __slots__ = ("futures", "loop", "remove", "thread")

    def __init__(self, loop: asyncio.AbstractEventLoop) -> None:
        self.loop = loop
        self.thread = _loop_thread(loop)
        self.futures: set[asyncio.Future[str]] = set()
        self.remove: Callable[[], None] = _nothing

    def __call__(self, reason: str) -> None:
        try:
            if threading.get_ident() == self.thread:
                _wake(self.futures, reason)
                # From a signal handler, the loop may be asleep in select(): the woken futures'
                # callbacks would wait for something else to wake it. Make sure something does.
                if not self.loop.is_closed():
                    self.loop.call_soon_threadsafe(_nothing)
            elif not self.loop.is_closed():
                self.loop.call_soon_threadsafe(_wake, self.futures, reason)
        except RuntimeError:  # the loop closed meanwhile (its own thread): its waiters went with it
            pass


def _wake(futures: set[asyncio.Future[str]], reason: str) -> None:
    for fut in list(futures):  # a snapshot: a waiter cancelled meanwhile discards its own
        if not fut.done():
            fut.set_result(reason)


def _nothing() -> None:
    pass


def _loop_thread(loop: asyncio.AbstractEventLoop) -> int | None:
    # BaseEventLoop records the thread it runs in; other loops fall back to
    # call_soon_threadsafe, which is always correct, only slower.
    return getattr(loop, "_thread_id", None)


def scrub_listener_errors(signal: AbortSignal, secrets: Secrets) -> None:
    """Log the error of a listener of ``signal`` that raises, and of the signals made to follow
    it from now on (children, `AbortSignal.any`), with ``secrets()`` replaced by ``[REDACTED]``:
    an engine's credentials, on its run's signal. ``secrets`` is called only when one raises."""
    signal._secrets = secrets


def run_context(secrets: Secrets) -> contextvars.Context:
    """A copy of the current context in which a listener that raises, on a signal that knows no
    credentials (the host's own, a bare `AbortSignal.timeout`), is logged with ``secrets()``
    replaced by ``[REDACTED]``: for a task of an engine's run (a tool call). A signal knows
    none of its own; the run the listener raised in does."""
    context = contextvars.copy_context()
    context.run(_run_secrets.set, secrets)
    return context


def _running_task() -> asyncio.Task[Any] | None:
    """The task running the caller; None outside one, and with no event loop running (a
    finalizer: a run dropped and collected, its stream closed there)."""
    try:
        return asyncio.current_task()
    except RuntimeError:  # no running event loop
        return None


def in_task() -> bool:
    """True when a task runs the caller: an `asyncio.timeout` can cancel it then."""
    return _running_task() is not None


def task_cancelling() -> bool:
    """After a CancelledError that no abort of the run's caused: True when the running task was
    asked to cancel (and has not taken the request back), so the cancel is its owner's and must
    propagate; False when what it awaited was cancelled of its own (a connection's reader task,
    a prompt's future the user closed). True outside a task, where nothing else could end it."""
    task = _running_task()
    return task is None or task.cancelling() > 0


def cancels_asked() -> int:
    """How many cancels the running task has been asked and not taken back (``cancelling()``):
    0 outside a task, and with no event loop running (a generator finalized after its loop)."""
    task = _running_task()
    return task.cancelling() if task is not None else 0


def enter_run(secrets: Secrets) -> Callable[[], None]:
    """For the task a run is iterated in (the run's own code: its policy hooks, abort hooks,
    session store, and the host's code between events): a listener that raises there, on a
    signal that knows no credentials (the host's own), is logged with ``secrets()`` replaced by
    ``[REDACTED]``, as in the run's tool calls (`run_context`). Returns what undoes it once the
    run is over, in any order and from any task (a run the host broke out of ends in another).

    The task holds one `_LiveRuns`, made by its first run: runs iterated in turn in it (a host
    that steps two engines' runs alternately) are scrubbed of every live run's credentials, never
    of the latest's alone, and what it holds never grows past the runs still going."""
    current = _run_secrets.get()
    live = current if isinstance(current, _LiveRuns) else None
    if live is None:
        live = _LiveRuns(current)
        _run_secrets.set(live)
    live.runs.append(secrets)
    return functools.partial(live.leave, secrets)


class _LiveRuns:
    """The credentials of the runs going on in a task, and of what was set there before them
    (a tool call's, for a subagent's run iterated inside it)."""

    __slots__ = ("outer", "runs")

    def __init__(self, outer: Secrets | None) -> None:
        self.outer = outer
        self.runs: list[Secrets] = []

    def leave(self, secrets: Secrets) -> None:
        with contextlib.suppress(ValueError):  # left already
            self.runs.remove(secrets)

    def __call__(self) -> list[str]:
        found = list(self.outer()) if self.outer is not None else []
        for secrets in list(self.runs):
            found.extend(secrets())
        return found


def _log_listener_error(fn: Listener, secrets: Secrets | None) -> None:
    if secrets is not None:
        from ._hostlog import log_scrubbed

        log_scrubbed(secrets, "abort listener %r raised", fn, stacklevel=3)
        return
    import logging

    logging.getLogger("agentloop").exception("abort listener %r raised", fn)
