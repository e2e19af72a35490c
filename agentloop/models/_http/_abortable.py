"""Waits of a request that an abort ends at once, and that may have a deadline of their own.

The model phase cancels its task when the run is aborted, but a host may call
``model.stream(request, signal)`` itself, and then only the signal tells the provider to stop:
checked between events, it would not reach a request still waiting for its response's headers,
nor an error body that stalls. `abortable` covers such a wait, one that never yields to the
caller in between (a timeout scope must not span a generator's ``yield``); the reads of a
stream's body are watched one by one instead (`agentloop.models._driver`).

And the closes of a response that a cancel unwinds (`aclose_keeping_cancel`): a transport whose
close fails then must not turn the cancel into a connection error.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import asynccontextmanager

from ..._abort import AbortSignal, cancels_asked
from ..._errors import AbortError


@asynccontextmanager
async def abortable(signal: AbortSignal | None, deadline: float | None = None) -> AsyncIterator[None]:
    """Run the block so that an abort of ``signal`` (from any thread) ends it at once with
    `AbortError`, and, given a ``deadline`` (seconds), so that it ends with `TimeoutError` once
    that has passed."""
    loop = asyncio.get_running_loop()
    scope = asyncio.timeout(deadline)
    live = False

    def expire() -> None:
        if live and not scope.expired():
            scope.reschedule(loop.time())

    def on_abort(_reason: str) -> None:
        try:
            loop.call_soon_threadsafe(expire)
        except RuntimeError:  # the loop is closed: nothing waits any more
            pass

    remove = signal.add_listener(on_abort) if signal is not None else None
    try:
        async with scope:
            live = True
            yield
    except TimeoutError:
        if signal is not None and signal.aborted:
            raise AbortError(signal.reason or "cancel") from None
        raise
    finally:
        live = False
        if remove is not None:
            remove()


async def aclose_keeping_cancel(aclose: Callable[[], Awaitable[object]], asked: int) -> None:
    """Await ``aclose()``. An error it raises once the running task has been asked to cancel
    (more cancels than ``asked``, `cancels_asked` when the request began: the host's, or the
    engine's on an abort) is that cancel, which the transport turned into the error as the
    cancel unwound it: raised as a CancelledError (the error its cause), never in its place."""
    try:
        await aclose()
    except Exception as exc:
        if cancels_asked() > asked:
            raise asyncio.CancelledError from exc
        raise
