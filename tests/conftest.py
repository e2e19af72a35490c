"""Test-wide hygiene: asyncio debug mode, and nothing a test starts may outlive it."""

from __future__ import annotations

import asyncio
import os
from collections.abc import AsyncIterator, Iterator
from pathlib import Path

import pytest
from hypothesis import HealthCheck, settings

os.environ["PYTHONASYNCIODEBUG"] = "1"  # read by every new event loop
os.environ.setdefault("AGENTLOOP_DOOM_LOOP_RECOVERY", "true")

settings.register_profile(
    "agentloop",
    max_examples=int(os.environ.get("HYPOTHESIS_MAX_EXAMPLES", "60")),
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture],
    # CI runs the same examples every time, so a run fails for a change, not for a draw;
    # local runs draw anew and keep what fails in .hypothesis/.
    derandomize=bool(os.environ.get("CI")),
)
settings.load_profile("agentloop")


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
async def _no_leftover_tasks() -> AsyncIterator[None]:
    loop = asyncio.get_running_loop()
    assert loop.get_debug(), "tests run in asyncio debug mode"
    yield
    me = asyncio.current_task()
    for _ in range(3):  # let finished tasks be reaped
        await asyncio.sleep(0)
    left = [t for t in asyncio.all_tasks() if t is not me and not t.done()]
    assert not left, f"tasks left running after the test: {left}"
