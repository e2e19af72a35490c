"""Control calls and run objects met from other threads, other event loops, or a loop not running."""

from __future__ import annotations

import asyncio
import gc

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
