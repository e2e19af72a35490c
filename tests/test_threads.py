"""Control calls and run objects met from other threads, other event loops, or a loop not running."""

from __future__ import annotations

import asyncio
import gc
import threading
from collections.abc import Callable, Iterator
from typing import Any

from hypothesis import given, settings
from hypothesis import strategies as st

from agentloop import QueryEngine
from agentloop.testing import assert_valid
from tests.helpers import HangingModel


def _drain(loop: asyncio.AbstractEventLoop) -> None:
    """Let ``loop`` run what was left on it, then close it."""
    loop.run_until_complete(asyncio.sleep(0))
    loop.run_until_complete(loop.shutdown_asyncgens())
    loop.close()


def test_a_run_dropped_while_its_loop_is_not_running_is_settled_at_once() -> None:
    model = HangingModel(prefix=("Hello ", "wor"))
    engine = QueryEngine(model)
    loop = asyncio.new_event_loop()
    try:
        run = engine.run("go")
        for _ in range(3):  # TurnStarted and both deltas: the model now waits
            loop.run_until_complete(run.__anext__())  # type: ignore[arg-type]
        del run
        gc.collect()
        # The loop is not running: nothing else would settle the transcript before it runs again.
        assert not engine.running
        assert [m.role for m in engine.messages] == ["user", "assistant"]
        assert engine.messages[1].content[0].text == "Hello wor"  # type: ignore[union-attr]
        assert_valid(engine.messages)
    finally:
        _drain(loop)
    assert [m.role for m in engine.messages] == ["user", "assistant"]  # settled once


class _Interleaved(list):  # type: ignore[type-arg]
    """A queue that, at its ``at``-th access, lets another thread run ``meanwhile`` to its end."""

    def __init__(self, items: list[object], at: int, meanwhile: Callable[[], object]) -> None:
        super().__init__(items)
        self.at = at
        self.meanwhile = meanwhile
        self.seen = 0

    def _access(self) -> None:
        self.seen += 1
        if self.seen == self.at:
            other = threading.Thread(target=self.meanwhile)
            other.start()
            other.join()

    def __iter__(self) -> Iterator[object]:
        self._access()
        return super().__iter__()

    def __len__(self) -> int:
        self._access()
        return super().__len__()

    def __getitem__(self, index: Any) -> Any:
        self._access()
        return super().__getitem__(index)

    def __setitem__(self, index: Any, value: Any) -> None:
        self._access()
        super().__setitem__(index, value)


@settings(max_examples=30, deadline=None)
@given(at=st.integers(min_value=1, max_value=6))
def test_a_send_now_from_another_thread_as_a_run_not_begun_is_dropped_is_kept(at: int) -> None:
    engine = QueryEngine(HangingModel())
    run = engine.run("go")
    first = engine.send_now("typed after the prompt")  # for the run made: it begins aborted
    receipts = [first]
    inbox = engine.inbox
    inbox.send_now = _Interleaved(list(inbox.send_now), at, lambda: receipts.append(engine.send_now("from a thread")))
    del run  # dropped before its first step: its send-now text waits for the next run
    gc.collect()
    if len(receipts) == 1:  # the queue was read less than `at` times
        receipts.append(engine.send_now("from a thread"))
    queued = {q.id: q for q in inbox.send_now}
    assert set(queued) == set(receipts)  # no text is lost
    assert not queued[first].late
