"""Test-wide hygiene: asyncio debug mode, and nothing a test starts may outlive it."""

from __future__ import annotations

import asyncio
import gc
import logging
import os
import signal
import sys
from collections.abc import AsyncIterator, Coroutine, Iterator
from pathlib import Path
from typing import Any

import httpx
import httpx2
import pytest
from hypothesis import HealthCheck, settings

from agentloop.models._http._secrets import URL_LOGS

os.environ["PYTHONASYNCIODEBUG"] = "1"  # read by every new event loop
os.environ.setdefault("AGENTLOOP_DOOM_LOOP_RECOVERY", "true")

settings.register_profile(
    "agentloop",
    max_examples=int(os.environ.get("HYPOTHESIS_MAX_EXAMPLES", "60")),
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture],
    # CI runs the same examples every time, so a run fails for a change, not for a draw;
    # local runs draw anew and keep what fails in .hypothesis/.
    derandomize=os.environ.get("CI", "").lower() not in {"", "0", "false", "no"},
)
settings.load_profile("agentloop")

# AGENTLOOP_TEST_EAGER_TASKS=1 (Python 3.12+): every task a test's loop makes starts eagerly, as
# under a host's asyncio.eager_task_factory.
EAGER_TASKS = os.environ.get("AGENTLOOP_TEST_EAGER_TASKS", "") not in {"", "0"}

# A shell without job control starts a command it runs in the background (`cmd &`) with Ctrl-C
# ignored, and every process the tests start would inherit that: the tests of Ctrl-C need it
# delivered, as in a terminal. Python then installs its own handler only if it was not ignored.
if signal.getsignal(signal.SIGINT) is signal.SIG_IGN:
    signal.signal(signal.SIGINT, signal.default_int_handler)
if EAGER_TASKS and sys.version_info < (3, 12):
    raise pytest.UsageError(
        "AGENTLOOP_TEST_EAGER_TASKS needs Python 3.12 or later (asyncio.Task takes eager_start from 3.12); "
        f"this is Python {sys.version_info.major}.{sys.version_info.minor}"
    )


def child_pids() -> set[int]:
    """Live (non-zombie) processes whose parent is this process."""
    me = str(os.getpid()).encode()
    out: set[int] = set()
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            # Bytes: a process's name (in the parentheses) need not be valid in any encoding.
            fields = stat.read_bytes().rsplit(b")", 1)[-1].split()
        except OSError:
            continue
        if len(fields) > 1 and fields[1] == me and fields[0] != b"Z":
            out.add(int(stat.parent.name))
    return out


@pytest.fixture(autouse=True)
def _no_leftover_processes() -> Iterator[None]:
    before = child_pids() if Path("/proc").exists() else set()
    yield
    if Path("/proc").exists():
        left = child_pids() - before
        assert not left, f"child processes left behind: {sorted(left)}"


@pytest.fixture(autouse=True)
def _no_leftover_log_scrubbing() -> Iterator[None]:
    """A model or MCP server with credentials scrubs them out of every ``agentloop`` log record
    while it lives; one a test left in a garbage cycle would scrub the next tests' records (a
    drawn credential such as ``none`` garbles their messages). Collected after the test."""
    yield
    if len(URL_LOGS._live):
        gc.collect()


def swallowed_cancel(task: asyncio.Task[Any]) -> bool:
    """The task was asked to cancel and returned as if it had not been: it caught the
    CancelledError and neither re-raised it nor took the request back (``uncancel()``)."""
    return not task.cancelled() and task.cancelling() > 0 and task.exception() is None


def watch_tasks(loop: asyncio.AbstractEventLoop, swallowed: list[asyncio.Task[Any]]) -> None:
    """From now on each task made in ``loop`` that swallows a cancel is added to ``swallowed``."""

    def note(task: asyncio.Task[Any]) -> None:
        if swallowed_cancel(task):
            swallowed.append(task)

    def make(loop: asyncio.AbstractEventLoop, coro: Coroutine[Any, Any, Any], **kwargs: Any) -> asyncio.Task[Any]:
        if EAGER_TASKS:
            kwargs.setdefault("eager_start", True)
        task = asyncio.Task(coro, loop=loop, **kwargs)
        task.add_done_callback(note)
        return task

    loop.set_task_factory(make)


def leftover_tasks(me: asyncio.Task[Any] | None) -> list[asyncio.Task[Any]]:
    return [t for t in asyncio.all_tasks() if t is not me and not t.done()]


@pytest.fixture(autouse=True)
async def _no_leftover_tasks(request: pytest.FixtureRequest) -> AsyncIterator[None]:
    loop = asyncio.get_running_loop()
    assert loop.get_debug(), "tests run in asyncio debug mode"
    swallowed: list[asyncio.Task[Any]] = []
    watch_tasks(loop, swallowed)
    yield
    me = asyncio.current_task()
    for _ in range(3):  # let finished tasks be reaped
        await asyncio.sleep(0)
    left = leftover_tasks(me)
    assert not left, f"tasks left running after the test: {left}"
    if request.node.get_closest_marker("swallows_cancel") is None:
        assert not swallowed, f"tasks that swallowed a cancel: {swallowed}"


def record_streamed_responses(monkeypatch: pytest.MonkeyPatch, http: Any, streamed: list[Any], closed: set[int]) -> None:
    """Each response ``http.AsyncClient`` gives with ``stream=True`` goes to ``streamed``, and
    the id of each response closed (``aclose()``) to ``closed``, until the test ends."""
    send, aclose = http.AsyncClient.send, http.Response.aclose

    async def recording_send(self: Any, request: Any, **kwargs: Any) -> Any:
        response = await send(self, request, **kwargs)
        if kwargs.get("stream"):
            streamed.append(response)
        return response

    async def recording_aclose(self: Any) -> None:
        closed.add(id(self))
        await aclose(self)

    monkeypatch.setattr(http.AsyncClient, "send", recording_send)
    monkeypatch.setattr(http.Response, "aclose", recording_aclose)


@pytest.fixture(autouse=True)
def _no_open_responses(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    """Every streamed response an HTTP client (the models' httpx, the MCP SDK's httpx2) gave
    during the test was closed by who asked for it. Closed, not only read: a mocked body given as
    bytes is read (and counts as closed to httpx) before the response is handed over, which a
    real network's never is."""
    streamed: list[Any] = []
    closed: set[int] = set()
    for http in (httpx, httpx2):
        record_streamed_responses(monkeypatch, http, streamed, closed)
    yield
    left = [r for r in streamed if id(r) not in closed]
    assert not left, f"HTTP responses left open after the test: {left}"


def _not_a_slow_step(record: logging.LogRecord) -> bool:
    """Debug mode logs each loop step slower than its bound (0.1 s) as a warning; on a loaded
    machine any step may be, so such a record would fail a test that checks what was logged
    (``caplog``) for no fault of the code. Dropped at the ``asyncio`` logger, for every loop."""
    return record.msg != "Executing %s took %.3f seconds"


logging.getLogger("asyncio").addFilter(_not_a_slow_step)

# What asyncio's debug mode reports about a task or coroutine nobody saw to the end. Slow
# callbacks ("Executing <Task ...> took ...") are not among them: the filter above drops those.
_NEGLECT = ("Task was destroyed but it is pending", "was never retrieved", "was never awaited", "never awaited")


class _NeglectLog(logging.Handler):
    def __init__(self) -> None:
        super().__init__(logging.WARNING)
        self.said: list[str] = []

    def emit(self, record: logging.LogRecord) -> None:
        message = record.getMessage()
        if any(text in message for text in _NEGLECT):
            self.said.append(message)


@pytest.fixture(autouse=True)
def _no_neglected_tasks(request: pytest.FixtureRequest) -> Iterator[None]:
    """Nothing the test ran made asyncio log a task destroyed while pending, an exception never
    retrieved or a coroutine never awaited (what debug mode reports, whichever loop ran it)."""
    if request.node.get_closest_marker("closes_loop_under_tasks") is not None:
        yield
        return
    handler = _NeglectLog()
    logger = logging.getLogger("asyncio")
    logger.addHandler(handler)
    try:
        yield
    finally:
        logger.removeHandler(handler)
    assert not handler.said, f"asyncio reported neglected tasks or coroutines: {handler.said}"
