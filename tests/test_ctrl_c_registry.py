"""Telling a Ctrl-C the host already has by the task that keeps it: asyncio's registry of tasks
is shared by every thread's loop, and copying it can meet another thread's change."""

from __future__ import annotations

import asyncio
from collections.abc import Iterator
from typing import Any

import pytest

from agentloop import _executor


class _Busy:
    """A registry another thread changes while it is copied, ``busy`` times, then holds ``tasks``."""

    def __init__(self, tasks: list[Any], busy: int) -> None:
        self.tasks = tasks
        self.busy = busy
        self.copies = 0

    def __iter__(self) -> Iterator[Any]:
        self.copies += 1
        if self.busy:
            self.busy -= 1
            raise RuntimeError("Set changed size during iteration")
        return iter(self.tasks)


@pytest.mark.parametrize("busy", [0, 3])
def test_a_registry_changed_while_copied_is_copied_again(monkeypatch: pytest.MonkeyPatch, busy: int) -> None:
    class _Done:
        _exception: BaseException

        def done(self) -> bool:
            return True

        def cancelled(self) -> bool:
            return False

    kept = KeyboardInterrupt()
    task = _Done()
    task._exception = kept
    registry = _Busy([task], busy)
    monkeypatch.setattr(asyncio.tasks, "_all_tasks", registry, raising=False)
    monkeypatch.setattr(asyncio.tasks, "_scheduled_tasks", _Busy([], 0), raising=False)
    assert _executor._kept_by_a_task(kept) is True
    assert registry.copies == busy + 1
    assert _executor._kept_by_a_task(KeyboardInterrupt()) is False


def test_a_registry_that_never_holds_still_falls_back_to_the_traceback(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(asyncio.tasks, "_all_tasks", _Busy([], 10**6), raising=False)
    monkeypatch.setattr(asyncio.tasks, "_scheduled_tasks", _Busy([], 10**6), raising=False)
    assert _executor._kept_by_a_task(KeyboardInterrupt()) is False  # no RuntimeError out of it


def test_a_registry_of_another_shape_is_no_error(monkeypatch: pytest.MonkeyPatch) -> None:
    class _Odd:
        def done(self) -> bool:
            raise TypeError("not a task")

    monkeypatch.setattr(asyncio.tasks, "_all_tasks", _Busy([_Odd()], 0), raising=False)
    monkeypatch.setattr(asyncio.tasks, "_scheduled_tasks", _Busy([], 0), raising=False)
    assert _executor._kept_by_a_task(KeyboardInterrupt()) is False
