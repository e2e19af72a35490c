"""AbortController / AbortSignal / AbortError: the whole API.md surface."""

from __future__ import annotations

import asyncio
import faulthandler
import gc
import math
import os
import signal
import sys
import threading
import time
import weakref
from fractions import Fraction

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from agentloop import AbortController, AbortError, AbortSignal


def test_abort_is_idempotent_and_first_reason_wins() -> None:
    c = AbortController()
    assert not c.signal.aborted and c.signal.reason is None
    c.abort("send_now")
    c.abort("cancel")
    assert c.signal.aborted and c.signal.reason == "send_now"


def test_default_reason_is_cancel() -> None:
    c = AbortController()
    c.abort()
    assert c.signal.reason == "cancel"



@pytest.mark.parametrize("reason", [None, 3, b"cancel"])
def test_abort_refuses_a_reason_that_is_not_a_str_and_stays_abortable(reason: object) -> None:
    """``abort(None)`` used to take the signal's one abort and leave it not aborted (None is "not
    aborted"): every later abort was ignored, so nothing could ever stop what the signal guards."""
    c = AbortController()
    with pytest.raises(TypeError, match="takes a str"):
        c.abort(reason)  # type: ignore[arg-type]
    assert not c.signal.aborted
    c.abort("cancel")
    assert c.signal.aborted and c.signal.reason == "cancel"


def test_throw_if_aborted_raises_abort_error_with_reason() -> None:
    c = AbortController()
    c.signal.throw_if_aborted()  # not aborted: nothing happens
    c.abort("deadline")
    with pytest.raises(AbortError) as info:
        c.signal.throw_if_aborted()
    assert info.value.reason == "deadline"


@pytest.mark.parametrize("in_loop", [False, True])
def test_timeout_refuses_a_reason_that_is_not_a_str_rather_than_never_aborting(in_loop: bool) -> None:
    # The timer's own abort() refused the reason when it fired (a TypeError nobody saw, in a
    # thread or a loop callback): the signal never aborted.
    async def make() -> None:
        with pytest.raises(TypeError, match="takes a str reason"):
            AbortSignal.timeout(0, reason=None)  # type: ignore[arg-type]

    if in_loop:
        asyncio.run(make())
    else:
        with pytest.raises(TypeError, match="takes a str reason"):
            AbortSignal.timeout(0, reason=3)  # type: ignore[arg-type]
    fired = threading.Event()
    AbortSignal.timeout(0, reason="late").add_listener(lambda r: fired.set())
    assert fired.wait(10)


def test_an_abort_error_keeps_its_reason_and_message_when_copied_or_pickled() -> None:
    import copy
    import pickle

    for again in (copy.copy, copy.deepcopy, lambda e: pickle.loads(pickle.dumps(e))):
        err = again(AbortError("send_now"))
        assert (type(err), err.reason, str(err), err.args) == (AbortError, "send_now", "aborted: send_now", ("aborted: send_now",))
    noted = AbortError("cancel")
    noted.add_note("while reading")
    assert pickle.loads(pickle.dumps(noted)).__notes__ == ["while reading"]


def test_abort_from_many_threads_has_exactly_one_winner() -> None:
    for _ in range(50):
        c = AbortController()
        calls: list[str] = []
        c.signal.add_listener(calls.append)
        barrier = threading.Barrier(8)

        def hit(i: int, c: AbortController = c, barrier: threading.Barrier = barrier) -> None:
            barrier.wait()
            c.abort(f"r{i}")

        threads = [threading.Thread(target=hit, args=(i,)) for i in range(8)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        assert calls == [c.signal.reason]


def test_abort_is_safe_from_a_signal_handler() -> None:
    c = AbortController()
    seen: list[str] = []
    c.signal.add_listener(seen.append)
    old = signal.signal(signal.SIGUSR1, lambda *_: c.abort("sigusr1"))
    try:
        os.kill(os.getpid(), signal.SIGUSR1)
    finally:
        signal.signal(signal.SIGUSR1, old)
    assert c.signal.reason == "sigusr1" and seen == ["sigusr1"]


async def test_wait_wakes_at_once_when_a_signal_handler_aborts_while_the_loop_is_idle() -> None:
    """The handler runs on the loop's thread while the loop sleeps in select(): waking the
    futures there schedules their callbacks, but nothing woke the loop to run them, so wait()
    returned only when something else happened (here, the 10 s timeout)."""
    c = AbortController()
    old = signal.signal(signal.SIGALRM, lambda *_: c.abort("sigalrm"))
    try:
        signal.setitimer(signal.ITIMER_REAL, 0.05)  # fires while the loop waits below
        # Before the fix wait() woke only at the 10 s bound: wait_for raised TimeoutError.
        assert await asyncio.wait_for(c.signal.wait(), 10) == "sigalrm"
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, old)


def test_listener_added_after_abort_is_called_at_once() -> None:
    c = AbortController()
    c.abort("x")
    seen: list[str] = []
    c.signal.add_listener(seen.append)
    assert seen == ["x"]


def test_removed_listener_is_not_called() -> None:
    c = AbortController()
    seen: list[str] = []
    remove = c.signal.add_listener(seen.append)
    remove()
    remove()  # removing twice is harmless
    c.abort()
    assert seen == []


def test_a_raising_listener_does_not_stop_the_others(caplog: pytest.LogCaptureFixture) -> None:
    c = AbortController()
    seen: list[str] = []

    def boom(_reason: str) -> None:
        raise RuntimeError("listener bug")

    c.signal.add_listener(boom)
    c.signal.add_listener(seen.append)
    c.abort("cancel")
    assert seen == ["cancel"]
    assert "listener bug" in caplog.text


def test_a_listener_that_raises_keyboard_interrupt_does_not_stop_the_others() -> None:
    """A Ctrl-C that lands while the listeners run (or a listener that exits) propagates, but only
    after every other listener ran: they would never run otherwise (the signal aborts only once)."""
    c = AbortController()
    seen: list[str] = []

    def ctrl_c(_reason: str) -> None:
        raise KeyboardInterrupt

    c.signal.add_listener(seen.append)
    c.signal.add_listener(ctrl_c)
    child = AbortController(parent=c.signal)
    c.signal.add_listener(seen.append)
    with pytest.raises(KeyboardInterrupt):
        c.abort("cancel")
    assert seen == ["cancel", "cancel"] and child.signal.reason == "cancel"
    c.signal.add_listener(seen.append)  # nothing is left behind to be called twice
    assert seen == ["cancel"] * 3 and c.signal._listeners == {}


def test_linked_child_follows_parent_not_the_other_way() -> None:
    parent = AbortController()
    child = AbortController(parent=parent.signal)
    sibling = AbortController(parent=parent.signal)
    child.abort("child-only")
    assert child.signal.reason == "child-only"
    assert not parent.signal.aborted and not sibling.signal.aborted
    parent.abort("send_now")
    assert sibling.signal.reason == "send_now"
    assert child.signal.reason == "child-only"  # first reason still wins


def test_child_of_an_aborted_parent_starts_aborted() -> None:
    parent = AbortController()
    parent.abort("cancel")
    assert AbortController(parent=parent.signal).signal.reason == "cancel"


def test_unlinked_child_no_longer_follows_parent() -> None:
    parent = AbortController()
    child = AbortController(parent=parent.signal)
    child.unlink()
    parent.abort()
    assert not child.signal.aborted


def test_any_aborts_with_the_first_reason() -> None:
    a, b = AbortController(), AbortController()
    both = AbortSignal.any([a.signal, b.signal])
    assert not both.aborted
    b.abort("second")
    a.abort("first")
    assert both.reason == "second"


def test_any_of_an_already_aborted_signal_is_aborted() -> None:
    a = AbortController()
    a.abort("early")
    assert AbortSignal.any([AbortController().signal, a.signal]).reason == "early"


async def test_timeout_aborts_with_its_reason() -> None:
    sig = AbortSignal.timeout(0.01)
    assert await sig.wait() == "deadline"
    other = AbortSignal.timeout(0.01, reason="slow")
    assert await other.wait() == "slow"


def test_timeout_without_a_loop_uses_a_thread_timer() -> None:
    sig = AbortSignal.timeout(0.01, reason="t")
    done = threading.Event()
    sig.add_listener(lambda _r: done.set())
    assert done.wait(5) and sig.reason == "t"


def test_timeout_without_a_loop_longer_than_a_thread_can_wait_never_fires_and_raises_nothing(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    raised: list[object] = []
    monkeypatch.setattr(threading, "excepthook", raised.append)
    before = set(threading.enumerate())
    signals = [AbortSignal.timeout(math.inf), AbortSignal.timeout(threading.TIMEOUT_MAX * 2)]
    for thread in set(threading.enumerate()) - before:
        thread.join(5)  # a timer thread that cannot wait that long dies at once
    assert raised == [] and not any(sig.aborted for sig in signals)


@pytest.mark.parametrize("in_loop", [False, True])
def test_timeout_refuses_what_is_not_a_number_of_seconds(in_loop: bool) -> None:
    """A string or None was lost in the timer thread outside a loop (the signal never fired)."""

    async def make(seconds: object) -> AbortSignal:
        return AbortSignal.timeout(seconds)  # type: ignore[arg-type]

    def timeout(seconds: object) -> AbortSignal:
        return asyncio.run(make(seconds)) if in_loop else AbortSignal.timeout(seconds)  # type: ignore[arg-type]

    for bad in ("5", None, True):
        with pytest.raises(TypeError, match="takes a number of seconds"):
            timeout(bad)
    with pytest.raises(ValueError, match="not NaN"):
        timeout(math.nan)
    assert isinstance(timeout(Fraction(1, 2)), AbortSignal)  # any real number


async def test_wait_returns_reason_when_aborted_from_another_thread() -> None:
    c = AbortController()
    waiter = asyncio.ensure_future(c.signal.wait())
    await asyncio.sleep(0)
    threading.Thread(target=c.abort, args=("remote",)).start()
    assert await waiter == "remote"


async def test_wait_on_aborted_signal_returns_at_once() -> None:
    c = AbortController()
    c.abort("done")
    assert await c.signal.wait() == "done"


async def test_cancelled_wait_removes_its_listener() -> None:
    c = AbortController()
    waiter = asyncio.ensure_future(c.signal.wait())
    await asyncio.sleep(0)
    waiter.cancel()
    with pytest.raises(asyncio.CancelledError):
        await waiter
    assert not c.signal._listeners


async def test_abort_from_another_thread_wakes_every_waiter_in_one_hop() -> None:
    c = AbortController()
    loop = asyncio.get_running_loop()
    waiters = [asyncio.ensure_future(c.signal.wait()) for _ in range(50)]
    await asyncio.sleep(0)  # every waiter registered
    hops: list[object] = []
    hop = loop.call_soon_threadsafe

    def counted(callback: object, *args: object, **kwargs: object) -> object:
        hops.append(callback)
        return hop(callback, *args, **kwargs)  # type: ignore[arg-type]

    def abort_elsewhere() -> int:
        before = len(hops)
        c.abort("ui")
        return len(hops) - before  # the hops abort() itself asked for

    loop.call_soon_threadsafe = counted  # type: ignore[method-assign]
    try:
        made = await loop.run_in_executor(None, abort_elsewhere)
        assert await asyncio.gather(*waiters) == ["ui"] * 50
    finally:
        del loop.call_soon_threadsafe
    assert made == 1
    assert not c.signal._listeners


async def test_waiters_leave_nothing_registered_once_all_are_gone() -> None:
    c = AbortController()
    first = [asyncio.ensure_future(c.signal.wait()) for _ in range(3)]
    await asyncio.sleep(0)
    assert len(c.signal._listeners) == 1  # one listener for all of this loop's waiters
    for waiter in first[:2]:
        waiter.cancel()
    await asyncio.gather(*first[:2], return_exceptions=True)
    assert len(c.signal._listeners) == 1  # the third still waits
    first[2].cancel()
    await asyncio.gather(first[2], return_exceptions=True)
    assert not c.signal._listeners
    again = asyncio.ensure_future(c.signal.wait())  # a later wait registers afresh
    await asyncio.sleep(0)
    c.abort("late")
    assert await again == "late"


def test_repr_shows_state() -> None:
    c = AbortController()
    assert "active" in repr(c.signal)
    c.abort("why")
    assert "why" in repr(c)


# Waiters: any interleaving of waits, cancellations and one abort, from the loop or a thread.
waiter_steps = st.lists(st.one_of(st.just("wait"), st.integers(0, 20), st.just("tick")), max_size=40)


@settings(max_examples=60, deadline=None)
@given(waiter_steps, st.sampled_from(["loop", "thread", "never"]))
def test_property_every_waiter_gets_the_reason_and_nothing_stays_registered(steps: list[object], where: str) -> None:
    async def play() -> None:
        c = AbortController()
        waiters: list[asyncio.Task[str]] = []
        for step in steps:
            if step == "wait":
                waiters.append(asyncio.ensure_future(c.signal.wait()))
            elif step == "tick":
                await asyncio.sleep(0)
            elif isinstance(step, int) and step < len(waiters):
                waiters[step].cancel()
        await asyncio.sleep(0)
        if where == "loop":
            c.abort("why")
        elif where == "thread":
            await asyncio.get_running_loop().run_in_executor(None, c.abort, "why")
        else:
            for waiter in waiters:
                waiter.cancel()
        outcomes = await asyncio.gather(*waiters, return_exceptions=True)
        for waiter, outcome in zip(waiters, outcomes, strict=True):
            if waiter.cancelled():
                assert isinstance(outcome, asyncio.CancelledError)
            else:
                assert outcome == "why"
        assert not c.signal._listeners  # woken, cancelled or both: no listener is left behind

    asyncio.run(play(), debug=True)


def test_any_stops_listening_to_its_sources_once_aborted() -> None:
    app = AbortController()  # long-lived, never aborted
    refs = []
    for i in range(50):
        per_call = AbortController()
        derived = AbortSignal.any([app.signal, per_call.signal])
        refs.append(weakref.ref(derived))
        per_call.abort(f"call {i} done")
        assert derived.reason == f"call {i} done"
        del derived, per_call
    gc.collect()
    assert [r for r in refs if r() is not None] == []  # the app signal holds none of them
    late = AbortSignal.any([app.signal])
    app.abort("shutdown")
    assert late.reason == "shutdown"  # a live derived signal still follows its source


def test_any_of_an_aborted_source_does_not_stay_registered_on_the_others() -> None:
    app, done = AbortController(), AbortController()
    done.abort("early")
    derived = AbortSignal.any([app.signal, done.signal])
    ref = weakref.ref(derived)
    assert derived.reason == "early"
    del derived
    gc.collect()
    assert ref() is None


# Links: a parent holds a child only while the child has listeners of its own.


def test_a_long_lived_parent_does_not_keep_the_children_nobody_holds() -> None:
    parent = AbortController()
    refs: list[weakref.ref[AbortSignal]] = []
    for i in range(1000):
        child = AbortController(parent=parent.signal)
        grandchild = AbortController(parent=child.signal)
        if i % 3 == 0:  # listened to, then no more
            grandchild.signal.add_listener(print)()
        elif i % 3 == 1:
            first, second = child.signal.add_listener(print), child.signal.add_listener(print)
            first()
            second()
            del first, second  # a remover holds its signal
        refs += [weakref.ref(child.signal), weakref.ref(grandchild.signal)]
        del child, grandchild
    gc.collect()
    assert [r for r in refs if r() is not None] == []
    assert parent.signal._listeners == {}
    parent.abort("shutdown")
    assert parent.signal.reason == "shutdown"


def test_a_child_nobody_holds_still_runs_its_listeners_and_its_own_childrens() -> None:
    parent = AbortController()
    seen: list[str] = []
    AbortController(parent=parent.signal).signal.add_listener(lambda r: seen.append(f"child {r}"))
    # Only the grandchild's signal is held: the child between them must stay linked.
    grandchild = AbortController(parent=AbortController(parent=parent.signal).signal).signal
    derived = AbortSignal.any([AbortController(parent=parent.signal).signal])
    derived.add_listener(lambda r: seen.append(f"derived {r}"))
    del derived
    gc.collect()
    parent.abort("stop")
    assert sorted(seen) == ["child stop", "derived stop"] and grandchild.reason == "stop"
    assert parent.signal._listeners == {}


def test_a_child_that_threads_added_listeners_to_and_removed_some_from_still_runs_the_rest() -> None:
    """Listeners added and removed at once from several threads: once the threads let go of the
    child, the parent alone holds it, and every listener left runs exactly once on abort."""
    for _ in range(30):
        parent = AbortController()
        held = [AbortController(parent=parent.signal).signal]  # a list: the threads' only way to it
        calls: list[tuple[int, int]] = []
        barrier = threading.Barrier(3)

        def churn(
            t: int, held: list[AbortSignal] = held, barrier: threading.Barrier = barrier, calls: list[tuple[int, int]] = calls
        ) -> None:
            child = held[0]
            barrier.wait()
            for k in range(100):
                remove = child.add_listener(lambda _r, key=(t, k): calls.append(key))
                if k % 2 or k < 90:
                    remove()

        threads = [threading.Thread(target=churn, args=(t,)) for t in range(3)]
        switch = sys.getswitchinterval()
        sys.setswitchinterval(1e-6)  # many thread switches inside add_listener and remove
        try:
            for thread in threads:
                thread.start()
            for thread in threads:
                thread.join()
        finally:
            sys.setswitchinterval(switch)
        ref = weakref.ref(held.pop())
        assert ref() is not None  # it has listeners: its parent holds it
        parent.abort("stop")
        assert sorted(calls) == [(t, k) for t in range(3) for k in range(90, 100, 2)]


# -- AbortSignal.timeout: its timers ----------------------------------------------------------


def _new_threads(before: set[threading.Thread]) -> list[threading.Thread]:
    return [t for t in threading.enumerate() if t not in before and t.is_alive()]


def test_timeouts_made_outside_a_loop_share_one_thread_that_ends_when_none_is_pending() -> None:
    # One daemon thread per signal: a host making thousands of timeouts from sync code made
    # thousands of threads, each alive for the whole timeout.
    before = set(threading.enumerate())  # (the thread may be running already, for an earlier test)
    signals = [AbortSignal.timeout(3600) for _ in range(200)]
    threads = _new_threads(before)
    assert len(threads) <= 1, f"{len(threads)} threads for 200 timeouts"
    from agentloop._timers import timer_thread

    thread = timer_thread.thread
    assert thread is not None and thread.is_alive()
    fired = threading.Event()
    AbortSignal.timeout(0, reason="soon").add_listener(lambda r: fired.set())
    assert fired.wait(10)
    assert not any(sig.aborted for sig in signals) and timer_thread.thread is thread
    del signals
    gc.collect()  # the signals nobody holds any more need no timer: the thread ends
    thread.join(10)
    assert not thread.is_alive()


class _TimerClock:
    """A stand-in for ``time.monotonic`` in the timers: it moves only when told to. Once
    ``watch()`` is called it counts the reads the timer thread makes with nothing left in its
    inbox (so with every timer handed to it so far in its heap)."""

    def __init__(self) -> None:
        from agentloop._timers import timer_thread

        self.now = time.monotonic()
        self._inbox = timer_thread._inbox
        self._reads: int | None = None  # not counting yet
        self.looked = threading.Event()  # the thread has been round its loop with all it was given

    def monotonic(self) -> float:
        on_thread = threading.current_thread().name == "agentloop-timeouts"
        if self._reads is not None and on_thread and self._inbox.empty():
            self._reads += 1
            if self._reads >= 3:  # three reads in a row: at least one whole pass of pop_due
                self.looked.set()
        return self.now

    def watch(self) -> None:
        self._reads = 0


def test_a_timeout_made_in_a_loop_that_closed_still_aborts_on_time(monkeypatch: pytest.MonkeyPatch) -> None:
    # asyncio.run() closed its loop with the timer still in it: the signal never aborted, in a
    # later asyncio.run() or a thread alike.
    from agentloop import _abort, _timers

    async def make(seconds: float, reason: str) -> AbortSignal:
        return AbortSignal.timeout(seconds, reason=reason)

    clock = _TimerClock()
    with monkeypatch.context() as patch:
        for module in (_abort, _timers):
            patch.setattr(module, "time", clock)
        held = asyncio.run(make(0.2, "held"))  # its timer goes to the thread as the loop closes
        assert not held.aborted  # not early: no time has passed on the timers' clock
        clock.watch()
        fired = threading.Event()
        held.add_listener(lambda r: (fired.set(), clock.looked.set()))
        assert clock.looked.wait(10), "the timer thread never took the timer"
        assert not held.aborted  # the thread holds the timer and has seen it is not due yet
        clock.now += 0.2
        assert fired.wait(10) and held.reason == "held"

    later = asyncio.run(make(0.05, "later"))

    async def wait(sig: AbortSignal) -> str:
        async with asyncio.timeout(10):  # only stops a hang; the timeout under test is 0.05 s
            return await sig.wait()

    assert asyncio.run(wait(later)) == "later"


def test_a_timeout_of_a_loop_the_host_closes_itself_still_aborts() -> None:
    loop = asyncio.new_event_loop()

    async def make() -> AbortSignal:
        return AbortSignal.timeout(0.05, reason="orphan")

    try:
        sig = loop.run_until_complete(make())
    finally:
        loop.close()
    fired = threading.Event()
    sig.add_listener(lambda r: fired.set())
    assert fired.wait(10) and sig.reason == "orphan"


@pytest.mark.skipif(not hasattr(os, "fork"), reason="os.fork")
def test_a_timeout_made_in_a_forked_child_fires_though_the_parent_had_a_timer_thread() -> None:
    pending = AbortSignal.timeout(3600)  # the parent's timer thread is running as it forks
    code = os.fork()
    if code == 0:  # the child: exit status 0 if its own timeout fires, whatever happens
        status = 2
        try:
            faulthandler.dump_traceback_later(30, exit=True)  # a deadlock ends the child too
            fired = threading.Event()
            AbortSignal.timeout(0, reason="child").add_listener(lambda r: fired.set())
            status = 0 if fired.wait(10) else 1
        finally:
            os._exit(status)
    _, status = os.waitpid(code, 0)
    assert os.waitstatus_to_exitcode(status) == 0 and not pending.aborted


async def test_a_timeout_in_a_running_loop_fires_from_the_loop_on_its_clock() -> None:
    from tests.helpers import VirtualClock

    fired_in: list[int] = []
    with VirtualClock() as clock:
        start = clock.now
        sig = AbortSignal.timeout(3600, reason="hour")
        sig.add_listener(lambda r: fired_in.append(threading.get_ident()))
        assert await sig.wait() == "hour"
        assert clock.now - start >= 3600 - 1e-6  # times are floats: start + 3600 - start may round below 3600
    assert fired_in == [threading.get_ident()]


@pytest.mark.parametrize("in_loop", [False, True])
def test_a_timeout_signal_nothing_holds_or_listens_to_is_let_go(in_loop: bool) -> None:
    # The timer held its signal until it fired: 10,000 dropped signals with a one-hour timeout
    # stayed in memory for the hour.
    refs: list[weakref.ref[AbortSignal]] = []

    def make() -> None:
        refs.extend(weakref.ref(AbortSignal.timeout(3600)) for _ in range(10_000))

    async def make_in_loop() -> None:
        make()
        gc.collect()
        assert [r for r in refs if r() is not None] == []

    if in_loop:
        asyncio.run(make_in_loop())
    else:
        make()
    gc.collect()
    assert [r for r in refs if r() is not None] == []


def test_a_timeout_signal_only_listened_to_is_kept_and_fires() -> None:
    fired: list[str] = []
    done = threading.Event()

    def listen(reason: str) -> None:
        fired.append(reason)
        done.set()

    AbortSignal.timeout(0.05, reason="kept").add_listener(listen)
    got = threading.Event()
    AbortSignal.any([AbortSignal.timeout(0.05, reason="any")]).add_listener(lambda r: got.set())
    gc.collect()
    assert done.wait(10) and fired == ["kept"]
    assert got.wait(10)


async def test_a_timeout_signal_only_awaited_is_kept_and_fires() -> None:
    fired = asyncio.Event()
    AbortSignal.timeout(0.05, reason="kept").add_listener(lambda r: fired.set())
    either = AbortSignal.any([AbortController().signal, AbortSignal.timeout(0.05, reason="any")])
    waiting = asyncio.ensure_future(either.wait())
    await asyncio.sleep(0)
    gc.collect()
    async with asyncio.timeout(10):  # only stops a hang
        assert await waiting == "any"
        await fired.wait()


def test_a_listener_raising_on_the_timer_thread_does_not_stop_the_other_timeouts() -> None:
    me = threading.get_ident()
    raised: list[str] = []

    def stop(reason: str) -> None:
        if threading.get_ident() != me:  # (called here at once only if registered too late)
            raised.append(reason)
            raise SystemExit(3)

    first = AbortSignal.timeout(0.2, reason="first")
    second = AbortSignal.timeout(0.3, reason="second")
    first.add_listener(stop)
    fired = threading.Event()
    second.add_listener(lambda r: fired.set())
    assert fired.wait(10) and first.reason == "first"
    fired_too = threading.Event()
    AbortSignal.timeout(0, reason="third").add_listener(lambda r: fired_too.set())
    assert fired_too.wait(10)


@given(
    st.lists(st.tuples(st.floats(0, 100), st.booleans()), max_size=60),
    st.lists(st.floats(0, 120), min_size=1, max_size=10),
)
def test_the_timer_thread_fires_each_pending_timer_once_in_deadline_order_and_lets_go_of_cancelled_ones(
    timers: list[tuple[float, bool]], nows: list[float]
) -> None:
    from agentloop._abort import _Link
    from agentloop._timers import Timer, TimerHeap

    heap = TimerHeap()
    fired: list[tuple[float, int]] = []
    made: list[Timer] = []
    for i, (deadline, cancel) in enumerate(timers):
        timer = Timer(_Link(AbortController().signal), str(i), deadline)
        timer.link = lambda _r, d=deadline, i=i: fired.append((d, i))  # type: ignore[assignment, misc]
        heap.add(timer)
        made.append(timer)
        if cancel:
            timer.done = True
            heap.note_cancelled()
        assert len(heap) <= 2 * sum(not t.done for t in made) + 1  # cancelled ones do not pile up
    for now in sorted(nows):
        for timer in heap.pop_due(now):
            timer.fire()
        wait = heap.wait(now)
        pending = [t.deadline for t in made if not t.done]
        assert wait == (max(0.0, min(pending) - now) if pending else None)
    last = max(nows)
    expected = sorted((d, i) for i, (d, cancel) in enumerate(timers) if not cancel and d <= last)
    assert fired == expected  # each once, earliest first, ties in the order made, none early


@pytest.mark.skipif(not hasattr(os, "fork"), reason="os.fork")
def test_a_timeout_pending_on_the_timer_thread_as_the_process_forks_still_fires_in_the_child() -> None:
    made_before = AbortSignal.timeout(0.2, reason="made before the fork")
    code = os.fork()
    if code == 0:  # the child: exit status 0 if its copy of the timeout fires, whatever happens
        status = 2
        try:
            faulthandler.dump_traceback_later(30, exit=True)  # a deadlock ends the child too
            fired = threading.Event()
            made_before.add_listener(lambda r: fired.set())
            status = 0 if fired.wait(10) and made_before.reason == "made before the fork" else 1
        finally:
            os._exit(status)
    _, status = os.waitpid(code, 0)
    assert os.waitstatus_to_exitcode(status) == 0


def test_an_abort_that_loses_reads_the_winners_reason_at_once_even_inside_the_winners_abort() -> None:
    """A signal handler (or another thread) aborting while the first abort has won but not yet
    recorded its reason: it loses, and sees the signal aborted with the winner's reason."""
    controller = AbortController()
    seen: list[tuple[bool, str | None]] = []

    class Claims(list[tuple[str]]):
        def append(self, claim: tuple[str]) -> None:
            super().append(claim)
            if len(self) == 1:  # the winner's claim is in: the "handler" lands here
                controller.abort("second")
                seen.append((controller.signal.aborted, controller.signal.reason))

    controller.signal._once = Claims()
    heard: list[str] = []
    controller.signal.add_listener(heard.append)
    controller.abort("first")
    assert seen == [(True, "first")]
    assert controller.signal.reason == "first" and heard == ["first"]


def test_an_abort_as_a_waiting_loop_closes_in_its_own_thread_logs_no_error(caplog: pytest.LogCaptureFixture) -> None:
    """The loop of a `wait()` closed (by the thread that ran it) just after the abort from this
    thread found it open: its waiters are gone with it, and the abort has nothing to report."""
    from agentloop._abort import _LoopWaiters

    class ClosedMeanwhile(asyncio.SelectorEventLoop):
        checked = False

        def is_closed(self) -> bool:
            was = super().is_closed()
            if not self.checked:
                self.checked = True
                self.close()  # the loop's thread closes it right after the first check
            return was

    loop = ClosedMeanwhile()
    controller = AbortController()
    waiters = _LoopWaiters(loop)
    waiters.futures.add(loop.create_future())
    controller.signal.add_listener(waiters)
    with caplog.at_level("DEBUG", logger="agentloop"):
        controller.abort("stop")
    assert loop.is_closed() and controller.signal.reason == "stop"
    assert [r.getMessage() for r in caplog.records] == []
