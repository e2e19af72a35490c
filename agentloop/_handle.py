"""The object `run()` returns, and what happens when its host stops iterating it.

Whatever way the host stops (``break``, ``aclose()``, dropping it, a cancelled task, an
event loop closed under it) the transcript is settled at once, synchronously, so it is
valid from that moment (SPEC §3), and the run's cleanup finishes in the background or,
with ``aclose()``, before it returns.
"""

from __future__ import annotations

import threading
from collections.abc import AsyncGenerator, Coroutine
from typing import TYPE_CHECKING, Any

from ._ending import settle_now
from ._events import Event
from ._policy import release
from ._process import kill_left_in
from ._recording import release_store
from ._run import RunState

if TYPE_CHECKING:
    from ._engine import QueryEngine

__all__ = ["RunHandle", "close_elsewhere", "consumer_gone", "forget_closed_run", "left_in_another_loop"]


_TWO_CONSUMERS = (
    "this run is being iterated by another task already: iterate a run() from one task only (to "
    "hand its events to several consumers, iterate it once and forward each event)"
)


class RunHandle(AsyncGenerator[Event, None]):
    """The object `run()` returns: an async generator of the loop's events.

    Dropping it (``break`` out of ``async for``) settles the transcript at once
    and lets the loop's cleanup finish in the background; ``aclose()`` does the
    same and waits for the cleanup. Typed as an async generator so that a host's
    ``aclose()`` type-checks.
    """

    __slots__ = ("_agen", "_engine", "_token")

    def __init__(self, engine: QueryEngine, agen: AsyncGenerator[Event, None], token: object) -> None:
        self._engine = engine
        self._agen = agen
        self._token = token

    def __aiter__(self) -> RunHandle:
        return self

    def __anext__(self) -> Coroutine[Any, Any, Event]:
        # The generator's own awaitable, not a coroutine around it: one frame less per event.
        if self._agen.ag_running:  # type: ignore[attr-defined]  # drive() is an async generator function
            raise RuntimeError(_TWO_CONSUMERS)
        return self._agen.__anext__()

    def asend(self, value: None) -> Coroutine[Any, Any, Event]:
        return self._agen.asend(value)

    def athrow(self, typ: Any, val: Any = None, tb: Any = None) -> Coroutine[Any, Any, Event]:
        return self._agen.athrow(typ) if val is None and tb is None else self._agen.athrow(typ, val, tb)

    async def aclose(self) -> None:
        """Stop the run (reason ``"consumer_closed"`` if still going) and wait for cleanup.

        Called while another task awaits the next event, it stops the run the same way and
        returns at once: that task receives the run's last events (its ``TurnEnded``), then the
        end of iteration, and the cleanup runs there.
        """
        if getattr(self._agen, "ag_running", False):  # another task is inside the loop: the run ends there
            close_elsewhere(self._engine, self._token)
            return
        consumer_gone(self._engine, self._token)
        await self._agen.aclose()

    def __del__(self) -> None:
        try:  # at interpreter exit, what it calls may be torn down already
            consumer_gone(self._engine, self._token)
        except Exception:  # never raise from a finalizer
            pass


def consumer_gone(engine: QueryEngine, token: object) -> None:
    """The host stopped iterating: abort with "consumer_closed" and settle now (sync)."""
    fresh = engine._fresh_run
    if fresh is not None and fresh[0] is token:  # made and dropped (or closed) before its first step
        engine._fresh_run = None
        engine.inbox.forget_late()
    st = engine._state
    if st is None or st.token is not token or st.closed:
        return
    st.released = True  # from the host's side no run is going, whatever its cleanup still does
    if st.turn_over:
        # Stopped after the turn's TurnEnded: nothing to settle, and no further turn. Marked, so
        # that a run() begun at once waits for the cleanup rather than finding a run in progress.
        st.finishing = True
        return
    loop_thread = getattr(st.loop, "_thread_id", None)  # None while the loop is not running
    if loop_thread is not None and loop_thread != threading.get_ident():
        # Dropped (garbage-collected) in another thread while the loop runs: settle on the
        # loop's own thread. A loop not running runs nothing meanwhile: settle now, from here.
        st.loop.call_soon_threadsafe(consumer_gone, engine, token)
        return
    settle_now(engine, st)


def left_in_another_loop(engine: QueryEngine, st: RunState) -> None:
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
    """Settle what a run left in a closed event loop left, and forget it (sync): the
    subprocesses its tools started there are killed, as an abort would have."""
    kill_left_in(st.loop)
    if not (st.closed or st.turn_over):
        settle_now(engine, st)
    st.close()
    if engine.policies:
        release(engine.policies, engine)
    engine._state = None
    engine._closing = None
    release_store(engine)


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
