"""A permission prompt the user closes without answering (the future the callback awaits is
cancelled by the host's UI) is a denial: the call gets an error result that says so, nothing is
logged above DEBUG, and the turn goes on. An abort of the run, or a cancel of the host's task,
that comes while the prompt waits keeps its own meaning, also in the same instant as the close."""

from __future__ import annotations

import asyncio
import itertools
import logging

import pytest

from agentloop import (
    Allow,
    Deny,
    QueryEngine,
    ScriptedModel,
    ScriptedResponse,
    ScriptedToolCall,
    ToolCallFinished,
    ToolContext,
    ToolUseBlock,
    tool,
    validate_transcript,
)
from agentloop._inbox import Texts, told_for
from agentloop.testing import collect, turn_ended

CLOSED = "Permission denied: the user closed the permission prompt without answering; the tool was not run."


@tool
async def act() -> str:
    """Act."""
    raise AssertionError("a call whose prompt was not answered must not run")


class Dialog:
    """A permission prompt shown by a UI: the callback awaits a future the UI answers or cancels."""

    def __init__(self) -> None:
        self.asked = asyncio.Event()
        self.answer: asyncio.Future[Allow | Deny] | None = None

    async def ask(self, use: ToolUseBlock, ctx: ToolContext) -> Allow | Deny:
        self.answer = asyncio.get_running_loop().create_future()
        self.asked.set()
        return await self.answer

    def close(self) -> None:
        assert self.answer is not None
        self.answer.cancel()  # the user closed the dialog without answering


def engine_for(permission: object) -> tuple[QueryEngine, ScriptedModel]:
    model = ScriptedModel([ScriptedResponse(tool_calls=[ScriptedToolCall("act", {})]), "I will not act, then."])
    return QueryEngine(model, tools=[act], permission=permission, policies=[]), model  # type: ignore[arg-type]


def above_debug(caplog: pytest.LogCaptureFixture) -> list[str]:
    return [f"{r.levelname}: {r.getMessage()}" for r in caplog.records if r.levelno > logging.DEBUG]


async def test_a_prompt_the_user_closes_is_a_denial_and_logs_no_error(caplog: pytest.LogCaptureFixture) -> None:
    dialog = Dialog()
    engine, model = engine_for(dialog.ask)
    with caplog.at_level(logging.DEBUG, logger="agentloop"):
        task = asyncio.create_task(collect(engine.run("go")))
        await dialog.asked.wait()
        dialog.close()
        events = await task
    assert turn_ended(events).reason == "completed"
    [finished] = [e for e in events if isinstance(e, ToolCallFinished)]
    assert finished.result.is_error and not finished.synthetic
    assert finished.result.text == CLOSED
    assert above_debug(caplog) == []
    assert model.request_count == 2 and engine.messages[-1].text == "I will not act, then."
    assert validate_transcript(engine.messages) == []


@pytest.mark.parametrize("raises", ["sync", "async"])
async def test_a_callback_raising_cancelled_error_itself_is_a_closed_prompt(
    raises: str, caplog: pytest.LogCaptureFixture
) -> None:
    """A plain function that reads a prompt's future the user closed (``future.result()``), or
    an async one whose UI framework tore its dialog down, raises CancelledError that nobody
    cancelled the run for: the prompt was closed, not the run stopped."""

    def sync_prompt(use: ToolUseBlock, ctx: ToolContext) -> Allow:
        raise asyncio.CancelledError

    async def async_prompt(use: ToolUseBlock, ctx: ToolContext) -> Allow:
        raise asyncio.CancelledError

    engine, model = engine_for(sync_prompt if raises == "sync" else async_prompt)
    with caplog.at_level(logging.DEBUG, logger="agentloop"):
        events = await collect(engine.run("go"))
    assert turn_ended(events).reason == "completed"
    assert [b.text for m in engine.messages for b in m.tool_results] == [CLOSED]
    assert above_debug(caplog) == []
    assert model.request_count == 2 and validate_transcript(engine.messages) == []


async def test_a_callback_that_fails_otherwise_is_still_a_failed_check_logged_as_an_error(
    caplog: pytest.LogCaptureFixture,
) -> None:
    async def prompt(use: ToolUseBlock, ctx: ToolContext) -> Allow:
        future: asyncio.Future[Allow] = asyncio.get_running_loop().create_future()
        future.set_exception(LookupError("no such dialog"))
        return await future

    engine, _ = engine_for(prompt)
    with caplog.at_level(logging.DEBUG, logger="agentloop"):
        events = await collect(engine.run("go"))
    assert turn_ended(events).reason == "completed"
    [text] = [b.text for m in engine.messages for b in m.tool_results]
    assert text == "The permission check failed (LookupError: no such dialog); the tool was not run."
    assert [r.levelno for r in caplog.records if "permission callback failed" in r.getMessage()] == [logging.ERROR]


_ACTIONS = ("close", "interrupt", "cancel_host")
_ORDERS = [order for n in (1, 2, 3) for order in itertools.permutations(_ACTIONS, n)]


@pytest.mark.parametrize("order", _ORDERS, ids=["+".join(o) for o in _ORDERS])
async def test_an_abort_or_a_host_cancel_while_the_prompt_waits_keeps_its_meaning(
    order: tuple[str, ...], caplog: pytest.LogCaptureFixture
) -> None:
    """Whatever else happens in the same instant (in any order): a cancel of the host's task
    propagates once the run is cleaned up; an abort of the run leaves the call never started;
    only a close with neither is a denial."""
    dialog = Dialog()
    engine, _ = engine_for(dialog.ask)
    with caplog.at_level(logging.DEBUG, logger="agentloop"):
        task = asyncio.create_task(collect(engine.run("go")))
        await dialog.asked.wait()
        for action in order:
            if action == "close":
                dialog.close()
            elif action == "interrupt":
                engine.interrupt("stop")
            else:
                task.cancel()
        if "cancel_host" in order:
            with pytest.raises(asyncio.CancelledError):
                await task
        else:
            events = await task
    texts = [b.text for m in engine.messages for b in m.tool_results]
    assert not engine.running and validate_transcript(engine.messages) == []
    assert [r for r in above_debug(caplog) if "permission" in r] == []
    if "cancel_host" in order:  # the run's cleanup took no outcome from the call, or its denial
        # The run's own interrupt is the user's; a cancel of the host's task alone stopped the reading.
        never = Texts().never_started if "interrupt" in order else told_for(Texts().never_started, "consumer_closed")
        assert texts == [never] or ("close" in order and texts == [CLOSED])
    elif "interrupt" in order:
        ended = turn_ended(events)
        assert (ended.reason, ended.abort_reason) == ("aborted_tools", "stop")
        assert texts == [Texts().never_started]
    else:
        assert turn_ended(events).reason == "completed" and texts == [CLOSED]
