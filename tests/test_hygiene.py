"""The checks tests/conftest.py makes after every test catch what they are for.

Each leak below is made by a test of its own in a pytest run of its own, under the same
conftest.py and settings as this suite; the run has to fail that test at its teardown, naming the
leak, and pass the test that cleans up after itself (and the one marked as swallowing a cancel
on purpose)."""

from __future__ import annotations

import asyncio
import logging
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

LEAKS = '''
import asyncio
import subprocess
import sys

import httpx
import httpx2
import pytest

kept = []


async def test_leaves_a_task_running():
    kept.append(asyncio.create_task(asyncio.Event().wait()))
    await asyncio.sleep(0)


async def test_destroys_a_pending_task():
    import gc

    async def forever():
        await asyncio.get_running_loop().create_future()  # a future only this task holds

    task = asyncio.create_task(forever())
    await asyncio.sleep(0)
    del task
    gc.collect()  # asyncio logs "Task was destroyed but it is pending!"


async def swallow_a_cancel():
    started = asyncio.Event()

    async def deaf():
        try:
            started.set()
            await asyncio.Event().wait()
        except asyncio.CancelledError:
            return "carried on"

    task = asyncio.create_task(deaf())
    await started.wait()
    task.cancel()
    assert await task == "carried on"


async def test_swallows_a_cancel():
    await swallow_a_cancel()


@pytest.mark.swallows_cancel
async def test_swallows_a_cancel_on_purpose():
    await swallow_a_cancel()


async def test_leaves_a_response_open():
    transport = httpx.MockTransport(lambda request: httpx.Response(200, content=b"body"))
    async with httpx.AsyncClient(transport=transport) as client:
        response = await client.send(client.build_request("GET", "http://test.invalid/"), stream=True)
        kept.append(response)


async def test_leaves_an_httpx2_response_open():  # the MCP SDK's HTTP client
    transport = httpx2.MockTransport(lambda request: httpx2.Response(200, content=b"body"))
    async with httpx2.AsyncClient(transport=transport) as client:
        response = await client.send(client.build_request("GET", "http://test.invalid/"), stream=True)
        kept.append(response)


def test_leaves_a_child_process():
    # The child reads its stdin, which closes when this run ends: it outlives the test, not the run.
    kept.append(subprocess.Popen([sys.executable, "-c", "import sys; sys.stdin.read()"], stdin=subprocess.PIPE))


async def test_cleans_up_after_itself():
    async def answer():
        return 42

    assert await asyncio.create_task(answer()) == 42
    transport = httpx.MockTransport(lambda request: httpx.Response(200, content=b"body"))
    async with httpx.AsyncClient(transport=transport) as client:
        async with client.stream("GET", "http://test.invalid/") as response:
            assert await response.aread() == b"body"
    child = subprocess.Popen([sys.executable, "-c", "pass"])
    assert child.wait(timeout=30) == 0
'''

INI = """[pytest]
asyncio_mode = auto
asyncio_default_fixture_loop_scope = function
asyncio_debug = true
timeout = 60
filterwarnings = error
markers = swallows_cancel: on purpose
"""


@pytest.fixture(scope="module")
def leak_run(tmp_path_factory: pytest.TempPathFactory) -> str:
    where = tmp_path_factory.mktemp("leaks")
    (where / "conftest.py").write_text((Path(__file__).parent / "conftest.py").read_text())
    (where / "pytest.ini").write_text(INI)
    (where / "test_leaks.py").write_text(LEAKS)
    done = subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "-rA", "-p", "no:cacheprovider", "test_leaks.py"],
        cwd=where, capture_output=True, text=True, timeout=120, check=False, env={**os.environ, "COLUMNS": "400"},
    )  # fmt: skip
    return done.stdout


@pytest.mark.parametrize(
    ("test", "complaint"),
    [
        ("test_leaves_a_task_running", "tasks left running after the test"),
        ("test_swallows_a_cancel", "tasks that swallowed a cancel"),
        ("test_leaves_a_response_open", "HTTP responses left open after the test"),
        ("test_leaves_an_httpx2_response_open", "HTTP responses left open after the test"),
        ("test_leaves_a_child_process", "child processes left behind"),
        ("test_destroys_a_pending_task", "asyncio reported neglected tasks or coroutines"),
    ],
)
def test_each_leak_fails_its_test_at_teardown(leak_run: str, test: str, complaint: str) -> None:
    assert re.search(rf"^ERROR test_leaks\.py::{test} - AssertionError: {complaint}", leak_run, re.M), leak_run
    assert re.search(rf"^PASSED test_leaks\.py::{test}$", leak_run, re.M), leak_run  # the test, then its teardown


@pytest.mark.parametrize("test", ["test_cleans_up_after_itself", "test_swallows_a_cancel_on_purpose"])
def test_a_test_that_cleans_up_or_is_marked_passes(leak_run: str, test: str) -> None:
    assert re.search(rf"^PASSED test_leaks\.py::{test}$", leak_run, re.M), leak_run
    assert "8 passed, 6 errors" in leak_run, leak_run


async def test_a_step_slower_than_debug_modes_bound_logs_nothing_a_test_could_trip_on(
    caplog: pytest.LogCaptureFixture,
) -> None:
    """On a loaded machine any step of the loop may take longer than debug mode's bound (0.1 s).
    What asyncio logs then ("Executing ... took ...") must not reach a test that checks the log
    is empty, or counts its warnings."""
    loop = asyncio.get_running_loop()
    bound = loop.slow_callback_duration
    loop.slow_callback_duration = 0.0  # every step is slow
    try:
        with caplog.at_level(logging.WARNING):
            await asyncio.sleep(0)
            await asyncio.sleep(0)
    finally:
        loop.slow_callback_duration = bound
    assert caplog.records == []
