"""SPEC §1-4: one abort reaches everything; three checkpoints; valid transcripts; reasons."""

from __future__ import annotations

import asyncio
import gc
import logging
import os
import subprocess
import sys
import threading
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as hyp

from agentloop import (
    AbortController,
    AbortError,
    Allow,
    AssistantMessage,
    Deny,
    Message,
    ModelError,
    QueryEngine,
    Retrying,
    ScriptedModel,
    ScriptedResponse,
    ScriptedToolCall,
    TextDelta,
    ToolCallFinished,
    ToolCallStarted,
    ToolContext,
    ToolUseBlock,
    TurnEnded,
    TurnStarted,
    tool,
    validate_transcript,
)
from agentloop._inbox import Texts
from tests.helpers import HangingModel, VirtualClock, collect, kinds, stubborn_prompt

TEXTS = Texts()


def engine_for(responses: list[object], **kw: object) -> QueryEngine:
    kw.setdefault("policies", [])
    return QueryEngine(ScriptedModel(responses), **kw)  # type: ignore[arg-type]


def calls(*names: str) -> ScriptedResponse:
    return ScriptedResponse(text="Working.", tool_calls=[ScriptedToolCall(n, {}) for n in names])


async def interrupt_at_first_text(engine: QueryEngine, reason: str = "cancel") -> None:
    """Run ``engine`` on "go", interrupting it (with ``reason``) at each text delta."""
    async for ev in engine.run("go"):
        if isinstance(ev, TextDelta):
            engine.interrupt(reason)


def results(engine: QueryEngine) -> list[str]:
    return [b.text for m in engine.messages for b in m.tool_results]


# -- checkpoint 1: the model stream -------------------------------------------------


async def test_checkpoint1_abort_mid_stream_keeps_partial_text_as_partial_message() -> None:
    engine = engine_for([ScriptedResponse(text="The quick brown fox jumps", chunk=4)])
    seen = ""
    events = []
    async for ev in engine.run("go"):
        events.append(ev)
        if isinstance(ev, TextDelta):
            seen += ev.text
            if len(seen) >= 8:
                engine.interrupt()
    end = events[-1]
    assert isinstance(end, TurnEnded) and end.reason == "aborted_streaming" and end.abort_reason == "cancel"
    partial = engine.messages[1]
    assert partial.role == "assistant" and partial.partial and partial.text == seen
    assert engine.messages[-1].text == TEXTS.interrupt_notice
    assert validate_transcript(engine.messages) == []


async def test_checkpoint1_abort_cancels_a_stream_that_is_waiting_and_closes_it() -> None:
    model = HangingModel()
    engine = QueryEngine(model, policies=[])
    run = engine.run("go")
    events = []

    async def consume() -> None:
        events.extend([ev async for ev in run])

    task = asyncio.ensure_future(consume())
    await model.waiting.wait()
    threading.Thread(target=engine.interrupt, args=("cancel",)).start()  # from another thread
    await task
    assert model.closed
    assert isinstance(events[-1], TurnEnded) and events[-1].reason == "aborted_streaming"
    assert engine.messages[1].text == "Hello wor" and engine.messages[1].partial
    assert validate_transcript(engine.messages) == []


async def test_checkpoint1_incomplete_tool_use_and_unsigned_thinking_are_dropped_from_history() -> None:
    script = ScriptedResponse(
        thinking="hmm", text="ok", tool_calls=[ScriptedToolCall("t", {"long": "x" * 50})], chunk=5
    )
    engine = engine_for([script])
    async for ev in engine.run("go"):
        if getattr(ev, "partial_json", "").startswith('{"lo'):
            engine.interrupt()
    partial = engine.messages[1]
    assert [b.type for b in partial.content] == ["thinking", "text"]  # the signed thinking stays
    assert validate_transcript(engine.messages) == []



class _StopsOnAbort:
    """A model of the host's own that honours the signal its own way: by ending its stream
    (``stop``), or by failing the way its connection does once closed (``fail``)."""

    def __init__(self, how: str) -> None:
        self.how = how
        self.requests = 0

    async def stream(self, request: object, signal: Any) -> Any:
        from agentloop.models import StreamText

        self.requests += 1
        for word in ("Hello ", "world ", "again"):
            if signal.aborted:
                if self.how == "stop":
                    return
                raise ModelError("connection closed", retryable=self.how == "fail")
            yield StreamText(0, word)


async def _interrupted_at(engine: QueryEngine, kind: type) -> tuple[TurnEnded, list[str]]:
    """Run ``engine`` on "go", interrupting at each event of type ``kind``: the run's last
    event (a TurnEnded) and the reasons its abort hooks were called with."""
    hooked: list[str] = []
    engine.on_abort(hooked.append)
    async for end in engine.run("go"):
        if isinstance(end, kind):
            engine.interrupt()
    assert isinstance(end, TurnEnded)
    return end, hooked


@pytest.mark.parametrize("how", ["stop", "fail", "fail_for_good"])
async def test_checkpoint1_a_stream_that_ends_or_fails_once_aborted_ends_as_the_abort(how: str) -> None:
    """A stream that stopped, or failed, after the host's interrupt ended the turn with
    ``model_error`` ("the model stream ended without its end event"): no abort reason, no notice,
    no abort hook called; the interrupt was lost."""
    model = _StopsOnAbort(how)
    engine = QueryEngine(model, policies=[], retry_base_delay=0)
    end, hooked = await _interrupted_at(engine, TextDelta)
    assert (end.reason, end.abort_reason, end.error) == ("aborted_streaming", "cancel", None)
    assert hooked == ["cancel"] and model.requests == 1  # not retried
    assert [m.text for m in engine.messages] == ["go", "Hello", TEXTS.interrupt_notice]
    assert engine.messages[1].partial
    assert validate_transcript(engine.messages) == []


# -- checkpoint 2: between the response and the tools ---------------------------------


async def test_checkpoint2_abort_after_response_starts_no_tool() -> None:
    started: list[str] = []

    @tool
    async def t() -> str:
        started.append("t")
        return "ran"

    engine = engine_for([calls("t", "t")], tools=[t])
    async for ev in engine.run("go"):
        if isinstance(ev, AssistantMessage):
            engine.interrupt()
    assert started == []
    assert results(engine) == [TEXTS.never_started] * 2
    assert engine.last_turn_ended.reason == "aborted_tools"  # type: ignore[union-attr]
    assert validate_transcript(engine.messages) == []


async def test_checkpoint2_no_call_of_the_response_is_asked_for_started_or_refused() -> None:
    """Checkpoint 2 is the only check between the response and the first batch: without it the
    calls' tasks were made, and a call that cannot run (an unknown tool) answered with its
    refusal, as if the run had gone on, where each call's result must say it never started."""
    asked: list[str] = []

    async def permission(use: ToolUseBlock, ctx: ToolContext) -> Allow:
        asked.append(use.name)
        return Allow()

    @tool(concurrency_safe=True)
    async def t() -> str:
        raise AssertionError("must not start")

    engine = engine_for([calls("nope", "t")], tools=[t], permission=permission)
    events: list[object] = []
    async for ev in engine.run("go"):
        events.append(ev)
        if isinstance(ev, AssistantMessage):
            engine.interrupt()
    assert asked == []
    assert "PermissionRequested" not in kinds(events) and "ToolCallStarted" not in kinds(events)
    assert results(engine) == [TEXTS.never_started] * 2
    assert engine.last_turn_ended.reason == "aborted_tools"  # type: ignore[union-attr]
    assert validate_transcript(engine.messages) == []


# -- checkpoint 3: between batches ---------------------------------------------------


async def test_checkpoint3_abort_between_batches_keeps_finished_results() -> None:
    @tool
    async def first(ctx: ToolContext) -> str:
        ctx.engine.interrupt()  # from inside a tool
        return "first done"

    @tool
    async def second() -> str:
        raise AssertionError("must not start")

    engine = engine_for([calls("first", "second")], tools=[first, second])
    events = await collect(engine, "go")
    assert results(engine) == ["first done", TEXTS.never_started]
    assert isinstance(events[-1], TurnEnded) and events[-1].reason == "aborted_tools"
    assert validate_transcript(engine.messages) == []


async def test_checkpoint3_an_abort_after_a_batch_starts_nothing_of_the_next() -> None:
    """The host interrupts as the first batch's result comes: the next batch (a call that cannot
    run, and one that would ask for permission) is neither asked about, started nor refused."""
    asked: list[str] = []

    async def permission(use: ToolUseBlock, ctx: ToolContext) -> Allow:
        asked.append(use.name)
        return Allow()

    @tool
    async def first() -> str:
        return "first done"

    @tool(concurrency_safe=True)
    async def t() -> str:
        raise AssertionError("must not start")

    engine = engine_for([calls("first", "nope", "t")], tools=[first, t], permission=permission)
    events: list[object] = []
    async for ev in engine.run("go"):
        events.append(ev)
        if isinstance(ev, ToolCallFinished):
            engine.interrupt()
    assert asked == ["first"]
    assert [e.tool_use.name for e in events if isinstance(e, ToolCallStarted)] == ["first"]
    assert results(engine) == ["first done", TEXTS.never_started, TEXTS.never_started]
    assert engine.last_turn_ended.reason == "aborted_tools"  # type: ignore[union-attr]
    assert validate_transcript(engine.messages) == []


async def test_tool_stopped_while_running_gets_a_side_effects_result() -> None:
    gate = asyncio.Event()

    @tool
    async def slow(ctx: ToolContext) -> str:
        gate.set()
        await ctx.signal.wait()
        raise asyncio.CancelledError  # cooperative tools may stop any way they like

    engine = engine_for([calls("slow")], tools=[slow])
    run = asyncio.ensure_future(collect(engine, "go"))
    await gate.wait()
    engine.interrupt()
    events = await run
    assert results(engine) == [TEXTS.stopped_running]
    finished = [e for e in events if isinstance(e, ToolCallFinished)]
    assert finished[0].synthetic and "side effects" in finished[0].result.text


async def test_settlement_a_tool_ignoring_the_signal_is_cancelled_after_the_grace() -> None:
    gate = asyncio.Event()
    cancelled: list[bool] = []

    @tool
    async def stubborn() -> str:
        gate.set()
        try:
            await asyncio.Event().wait()
        except asyncio.CancelledError:
            cancelled.append(True)
            raise
        return "never"

    engine = engine_for([calls("stubborn")], tools=[stubborn], tool_cancel_grace=0.05)
    run = asyncio.ensure_future(collect(engine, "go"))
    await gate.wait()
    engine.interrupt()
    events = await run
    assert cancelled == [True]
    assert isinstance(events[-1], TurnEnded) and events[-1].reason == "aborted_tools"
    assert results(engine) == [TEXTS.stopped_running]


@pytest.mark.parametrize("then", ["keeps_running", "returns"])
async def test_settlement_run_returns_within_one_grace_when_a_tool_swallows_the_cancellation(
    then: str, caplog: pytest.LogCaptureFixture
) -> None:
    # SPEC §1: run() ends within tool_cancel_grace (plus the unwind) of the interrupt,
    # however the tool treats its cancellation; run() used to wait a second grace for it.
    gate, release = asyncio.Event(), asyncio.Event()

    @tool
    async def stubborn() -> str:
        gate.set()
        try:
            await asyncio.Event().wait()
        except asyncio.CancelledError:
            pass  # swallowed: it carries on
        if then == "returns":
            await asyncio.sleep(30)
        else:
            await release.wait()
        return "late"

    grace = 2.0
    with VirtualClock() as clock:
        engine = engine_for([calls("stubborn")], tools=[stubborn], tool_cancel_grace=grace)
        events = []
        with caplog.at_level("WARNING", logger="agentloop"):
            async for event in engine.run("go"):
                events.append(event)
                if isinstance(event, ToolCallStarted):
                    await gate.wait()
                    engine.interrupt()
                    interrupted_at = clock.now
        returned_at = clock.now
        others = [t for t in asyncio.all_tasks() if t is not asyncio.current_task()]
        _, still = await asyncio.wait(others, timeout=60)
        release.set()
        await asyncio.gather(*others, return_exceptions=True)
    assert returned_at - interrupted_at <= grace + 0.1 + 0.01
    assert not still  # the abandoned call was cancelled once more, and honoured that one
    assert isinstance(events[-1], TurnEnded) and events[-1].reason == "aborted_tools"
    assert results(engine) == [TEXTS.stopped_running]
    assert caplog.text.count("ignored cancellation") == 1  # said once, naming the tool
    assert "'stubborn'" in caplog.text


@pytest.mark.swallows_cancel
async def test_settlement_a_host_closing_the_run_mid_grace_waits_only_for_the_rest_of_it(
    caplog: pytest.LogCaptureFixture,
) -> None:
    # The grace counts from the abort: a host that holds an event, then closes the run,
    # does not start a fresh grace for a tool that ignores both the signal and cancellation.
    gate, release = asyncio.Event(), asyncio.Event()

    @tool
    async def stubborn() -> str:
        gate.set()
        while not release.is_set():
            try:
                await release.wait()
            except asyncio.CancelledError:
                pass
        return "late"

    grace = 2.0
    with VirtualClock() as clock:
        engine = engine_for([calls("stubborn")], tools=[stubborn], tool_cancel_grace=grace)
        run = engine.run("go")
        with caplog.at_level("WARNING", logger="agentloop"):
            async for event in run:
                if isinstance(event, ToolCallStarted):
                    await gate.wait()
                    engine.interrupt()
                    interrupted_at = clock.now
                    await asyncio.sleep(1.5)  # the host holds the event...
                    break
            await run.aclose()  # ...then stops
        returned_at = clock.now
        release.set()
        for task in [t for t in asyncio.all_tasks() if t is not asyncio.current_task()]:
            await asyncio.gather(task, return_exceptions=True)
    assert returned_at - interrupted_at <= grace + 0.1 + 0.01
    assert results(engine) == [TEXTS.stopped_running]
    assert caplog.text.count("ignored cancellation") == 1


@pytest.mark.parametrize("how", ["aclose", "drop"])
async def test_settlement_a_call_that_finished_while_the_host_held_an_event_keeps_its_result(how: str) -> None:
    # SPEC §3: a call that finished before the abort keeps its real result, also when the
    # abort is the host ceasing to iterate while it held another call's event.
    release, b_done = asyncio.Event(), asyncio.Event()

    @tool(concurrency_safe=True)
    async def fast() -> str:
        return "fast result"

    @tool(concurrency_safe=True)
    async def slow() -> str:
        await release.wait()
        b_done.set()
        return "slow result"

    engine = engine_for([calls("fast", "slow"), "ok"], tools=[fast, slow])
    run = engine.run("go")
    async for event in run:
        if isinstance(event, ToolCallFinished) and event.tool_use.name == "fast":
            release.set()
            await b_done.wait()  # slow has returned; its outcome waits for the loop
            break
    if how == "aclose":
        await run.aclose()
    else:
        del run  # dropped: settled when collected
        for _ in range(3):
            await asyncio.sleep(0)
    assert results(engine) == ["fast result", "slow result"]
    assert validate_transcript(engine.messages) == []


class _PromptClosed(BaseException):
    pass


@pytest.mark.parametrize(
    ("error", "said"),
    [(AbortError("deadline"), "AbortError: aborted: deadline"), (_PromptClosed("window closed"), "_PromptClosed: window closed")],
)
async def test_a_permission_callback_raising_an_abort_error_or_base_exception_is_a_failed_check(
    error: BaseException, said: str
) -> None:
    # A prompt with a timeout of its own (AbortSignal.timeout) raises AbortError("deadline")
    # while the run is not aborted; that, like a framework's BaseException, used to read
    # "failed inside agentloop".
    ran: list[bool] = []

    @tool
    async def act() -> str:
        ran.append(True)
        return "acted"

    async def prompt(use: ToolUseBlock, ctx: ToolContext) -> Allow:
        raise error

    engine = engine_for([calls("act"), "ok"], tools=[act], permission=prompt)
    events = await collect(engine, "go")
    assert isinstance(events[-1], TurnEnded) and events[-1].reason == "completed"
    [text] = results(engine)
    assert text == f"The permission check failed ({said}); the tool was not run."
    assert not ran


_BEHAVIOURS = ["honours_signal", "honours_cancel", "swallows_once", "swallows_always"]


@settings(max_examples=40)
@given(
    grace=hyp.floats(0, 5),
    behaviours=hyp.lists(hyp.sampled_from(_BEHAVIOURS), min_size=1, max_size=3),
    host=hyp.sampled_from(["iterate", "hold_then_continue", "hold_then_aclose"]),
    hold=hyp.floats(0, 6),
)
def test_property_run_ends_one_grace_after_the_interrupt_whatever_the_tools_and_the_host_do(
    grace: float, behaviours: list[str], host: str, hold: float
) -> None:
    # SPEC §1: whatever the calls do with the signal and the cancellation, run() ends
    # tool_cancel_grace (plus the 0.1 s unwind) after the interrupt, or when the host
    # that held an event lets go, if that is later. Virtual time: no real waiting.
    logging.getLogger("agentloop").disabled = True  # the abandon warnings are expected here
    try:
        asyncio.run(_interrupt_stubborn_batch(grace, behaviours, host, hold), debug=True)
    finally:
        logging.getLogger("agentloop").disabled = False


async def _interrupt_stubborn_batch(grace: float, behaviours: list[str], host: str, hold: float) -> None:
    release = asyncio.Event()
    started = asyncio.Semaphore(0)

    @tool(concurrency_safe=True)
    async def work(how: str, ctx: ToolContext) -> str:
        started.release()
        if how == "honours_signal":
            await ctx.signal.wait()
            ctx.signal.throw_if_aborted()
        swallowed = 0
        while not release.is_set():
            try:
                await release.wait()
            except asyncio.CancelledError:
                if how == "honours_cancel" or (how == "swallows_once" and swallowed):
                    raise
                swallowed += 1
        return "late"

    script = ScriptedResponse(tool_calls=[ScriptedToolCall("work", {"how": how}) for how in behaviours])
    with VirtualClock() as clock:
        engine = engine_for([script, "ok"], tools=[work], tool_cancel_grace=grace)
        run = engine.run("go")
        held = 0.0
        async for event in run:
            if isinstance(event, ToolCallStarted) and event.tool_use.id == engine.messages[-1].tool_uses[-1].id:
                for _ in behaviours:
                    await started.acquire()
                engine.interrupt()
                interrupted_at = clock.now
                if host != "iterate":
                    await asyncio.sleep(hold)
                    held = hold
                    if host == "hold_then_aclose":
                        break
        await run.aclose()
        returned_at = clock.now
        release.set()
        others = [t for t in asyncio.all_tasks() if t is not asyncio.current_task()]
        await asyncio.gather(*others, return_exceptions=True)
    assert returned_at - interrupted_at <= max(grace, held) + 0.1 + 0.01
    assert validate_transcript(engine.messages) == []
    assert len(results(engine)) == len(behaviours)
    assert all(text.startswith("Interrupted by user") for text in results(engine))


async def test_parallel_tools_all_receive_the_one_abort() -> None:
    started = asyncio.Semaphore(0)
    reasons: list[str] = []

    @tool(concurrency_safe=True)
    async def waiter(ctx: ToolContext) -> str:
        started.release()
        reasons.append(await ctx.signal.wait())
        return "stopped cleanly"

    engine = engine_for([calls(*["waiter"] * 5)], tools=[waiter])
    run = asyncio.ensure_future(collect(engine, "go"))
    for _ in range(5):
        await started.acquire()
    engine.interrupt("user_escape")
    events = await run
    assert reasons == ["user_escape"] * 5
    # cooperative tools that return after the abort keep their real result
    assert results(engine) == ["stopped cleanly"] * 5
    assert isinstance(events[-1], TurnEnded) and events[-1].abort_reason == "user_escape"


# -- permission --------------------------------------------------------------------


@tool(name="t", concurrency_safe=True)
async def _must_not_run() -> str:
    """A call a permission check stops, or an interrupt stops before it starts."""
    raise AssertionError("must not run")


async def _prompting(permission: Any, asked: asyncio.Event) -> tuple[QueryEngine, asyncio.Future[list[Any]]]:
    """A run whose one call ``t`` is at its permission prompt (``asked`` is set)."""
    engine = engine_for([calls("t")], tools=[_must_not_run], permission=permission)
    run = asyncio.ensure_future(collect(engine, "go"))
    await asked.wait()
    return engine, run


async def test_permission_prompt_is_abortable_and_sees_the_reason() -> None:
    asked = asyncio.Event()
    seen: list[str | None] = []

    async def permission(use: ToolUseBlock, ctx: ToolContext) -> Allow | Deny:
        asked.set()
        try:
            await asyncio.Event().wait()
        finally:
            seen.append(ctx.signal.reason)
        return Allow()

    engine, run = await _prompting(permission, asked)
    engine.interrupt("changed_my_mind")
    events = await run
    assert seen == ["changed_my_mind"]
    assert results(engine) == [TEXTS.never_started]
    assert "PermissionRequested" in kinds(events)



@pytest.mark.swallows_cancel
async def test_a_permission_prompt_ignoring_its_cancellation_is_abandoned_with_a_warning_and_held(
    caplog: pytest.LogCaptureFixture,
) -> None:
    asked, release, ended = asyncio.Event(), asyncio.Event(), asyncio.Event()

    permission = stubborn_prompt(asked, release, ended)

    engine, run = await _prompting(permission, asked)
    with caplog.at_level(logging.WARNING, logger="agentloop"):
        engine.interrupt()
        events = await run
    assert isinstance(events[-1], TurnEnded) and events[-1].reason == "aborted_tools"
    assert results(engine) == [TEXTS.never_started]
    assert "ignored cancellation; abandoning it" in caplog.text
    gc.collect()  # held: not collected mid-await (a pending task nothing references would be)
    release.set()
    await ended.wait()  # it ran to its end, and its Allow was discarded

async def test_abort_between_starting_the_calls_and_their_first_step_asks_no_one() -> None:
    """An interrupt queued just before the tool phase lands after the call tasks are made and
    before they first run: no prompt is shown, no prompt coroutine is left unawaited (a
    RuntimeWarning, an error under -W error), and each call gets its never-started result."""
    asked: list[str] = []

    async def permission(use: ToolUseBlock, ctx: ToolContext) -> Allow | Deny:
        asked.append(use.id)
        return Allow()

    engine = engine_for([calls("t", "t")], tools=[_must_not_run], permission=permission)
    events = []
    async for event in engine.run("go"):
        events.append(event)
        if isinstance(event, AssistantMessage):
            asyncio.get_running_loop().call_soon(engine.interrupt, "late")
    assert asked == []
    assert results(engine) == [TEXTS.never_started, TEXTS.never_started]
    assert "PermissionRequested" not in kinds(events)
    assert isinstance(events[-1], TurnEnded) and events[-1].abort_reason == "late"
    assert validate_transcript(engine.messages) == []


async def test_a_permission_prompt_that_cancels_itself_is_a_closed_prompt_not_an_interrupt() -> None:
    async def permission(use: ToolUseBlock, ctx: ToolContext) -> Allow | Deny:
        raise asyncio.CancelledError  # e.g. a UI dialog torn down by its own framework

    engine = engine_for([calls("t"), "carrying on"], tools=[_must_not_run], permission=permission)
    events = await collect(engine, "go")
    [text] = results(engine)
    assert text == "Permission denied: the user closed the permission prompt without answering; the tool was not run."
    assert "Interrupted" not in text
    assert isinstance(events[-1], TurnEnded) and events[-1].reason == "completed"


async def test_a_tool_that_cancels_itself_gets_an_error_result_not_an_interrupt() -> None:
    @tool
    async def t() -> str:
        raise asyncio.CancelledError

    engine = engine_for([calls("t"), "carrying on"], tools=[t])
    events = await collect(engine, "go")
    [text] = results(engine)
    assert text == "Tool 't' was cancelled, although the run was not interrupted; it may have had side effects."
    finished = [e for e in events if isinstance(e, ToolCallFinished)]
    assert not finished[0].synthetic and finished[0].result.is_error
    assert isinstance(events[-1], TurnEnded) and events[-1].reason == "completed"


# Python 3.11's TaskGroup leaves its task's cancel request after a part fails (3.12 fixed it).
_TASKGROUP_LEAVES_CANCEL = (pytest.mark.swallows_cancel,) if sys.version_info < (3, 12) else ()


@pytest.mark.parametrize(
    "nested", [pytest.param(False, marks=_TASKGROUP_LEAVES_CANCEL), pytest.param(True, marks=_TASKGROUP_LEAVES_CANCEL)]
)
async def test_a_tool_whose_task_group_parts_stop_on_the_abort_gets_the_interrupted_result(nested: bool) -> None:
    """A tool that fans out with asyncio.TaskGroup, each part stopping with AbortError when the
    run is interrupted, raises an ExceptionGroup of AbortErrors (nested, for a group inside a
    part): the call was stopped by the abort, as one that raises AbortError itself is, not a tool
    that failed."""

    async def part(ctx: ToolContext) -> None:
        await ctx.signal.wait()
        raise AbortError(ctx.signal.reason or "cancel")

    async def parts(ctx: ToolContext) -> None:
        async with asyncio.TaskGroup() as group:
            for _ in range(2):
                group.create_task(part(ctx))

    @tool
    async def fan(ctx: ToolContext) -> str:
        """Fan out."""
        async with asyncio.TaskGroup() as group:
            group.create_task(parts(ctx) if nested else part(ctx))
            group.create_task(part(ctx))
        return "done"

    engine = engine_for([calls("fan"), "unused"], tools=[fan])
    events = []
    async for event in engine.run("go"):
        events.append(event)
        if isinstance(event, ToolCallStarted):
            asyncio.get_running_loop().call_soon(engine.interrupt, "stop")
    [finished] = [e for e in events if isinstance(e, ToolCallFinished)]
    assert finished.synthetic and finished.result.is_error
    assert results(engine) == [TEXTS.stopped_running]
    assert isinstance(events[-1], TurnEnded) and (events[-1].reason, events[-1].abort_reason) == ("aborted_tools", "stop")
    assert validate_transcript(engine.messages) == []


async def test_a_tool_raising_a_group_of_abort_errors_without_an_abort_is_a_failed_call() -> None:
    @tool
    async def odd() -> str:
        """Raises a group of AbortErrors although nothing aborted."""
        raise ExceptionGroup("parts", [AbortError("cancel"), AbortError("cancel")])

    engine = engine_for([calls("odd"), "carrying on"], tools=[odd])
    events = await collect(engine, "go")
    assert results(engine) == ["Tool 'odd' raised ExceptionGroup: parts (2 sub-exceptions)"]
    assert isinstance(events[-1], TurnEnded) and events[-1].reason == "completed"


async def test_permission_deny_allow_update_and_failure_become_results() -> None:
    async def permission(use: ToolUseBlock, ctx: ToolContext) -> Allow | Deny:
        if use.input.get("x") == "deny":
            return Deny("not in this repo")
        if use.input.get("x") == "boom":
            raise RuntimeError("prompt crashed")
        return Allow(updated_input={"x": "rewritten"})

    @tool
    async def t(x: str) -> str:
        return f"ran with {x}"

    script = ScriptedResponse(tool_calls=[ScriptedToolCall("t", {"x": v}) for v in ("deny", "boom", "ok")])
    engine = engine_for([script, "done"], tools=[t], permission=permission)
    await collect(engine, "go")
    texts = results(engine)
    assert texts[0] == "Permission denied: not in this repo"
    assert "permission check failed" in texts[1] and "prompt crashed" in texts[1]
    assert texts[2] == TEXTS.input_updated.replace("{input}", '{"x": "rewritten"}') + "\n\nran with rewritten"


async def test_a_permission_callback_that_fails_or_answers_wrongly_is_logged_for_the_host(
    caplog: pytest.LogCaptureFixture,
) -> None:
    """A bug in the host's permission callback (it raises, or returns True instead of Allow()) kept
    every call it was asked about from running, and only the model was told: nothing reached the
    host's logs. Each such failure is now logged on the `agentloop` logger, with the traceback of
    what the callback raised; a Deny, or a prompt the run's abort stopped, logs nothing."""

    async def permission(use: ToolUseBlock, ctx: ToolContext) -> Allow | Deny:
        x = use.input.get("x")
        if x == "boom":
            raise RuntimeError("policy service unreachable")
        if x == "true":
            return True  # type: ignore[return-value]  # the host's bug under test
        return Deny("no")

    @tool
    async def t(x: str) -> str:
        return f"ran with {x}"

    script = ScriptedResponse(tool_calls=[ScriptedToolCall("t", {"x": v}) for v in ("boom", "true", "deny")])
    engine = engine_for([script, "done"], tools=[t], permission=permission)
    with caplog.at_level(logging.WARNING, logger="agentloop"):
        await collect(engine, "go")
    texts = results(engine)
    assert "policy service unreachable" in texts[0] and "returned True" in texts[1] and texts[2] == "Permission denied: no"
    logged = [r for r in caplog.records if r.name == "agentloop"]
    assert len(logged) == 2, [r.getMessage() for r in logged]
    raised, wrong = logged
    assert raised.levelno == logging.ERROR and "'t'" in raised.getMessage() and "RuntimeError" in raised.getMessage()
    assert raised.exc_info is not None and isinstance(raised.exc_info[1], RuntimeError)
    assert "returned True" in wrong.getMessage() and "Allow or Deny" in wrong.getMessage()


# -- reasons: cancel vs send_now ------------------------------------------------------


async def test_send_now_replaces_the_turn_without_a_notice_in_the_same_run() -> None:
    engine = engine_for([ScriptedResponse(text="a long answer that goes on", chunk=3), "New answer."])
    events = []
    async for ev in engine.run("first"):
        events.append(ev)
        if isinstance(ev, TextDelta) and len(events) == 3:
            engine.send_now("actually, do this")
    ends = [e for e in events if isinstance(e, TurnEnded)]
    assert [e.reason for e in ends] == ["aborted_streaming", "completed"]
    assert ends[0].abort_reason == "send_now"
    starts = [e for e in events if isinstance(e, TurnStarted)]
    assert starts[1].prompt is not None and starts[1].prompt.text == "actually, do this"
    assert not any(m.kind == "interrupt_notice" for m in engine.messages)
    assert engine.messages[-1].text == "New answer."
    assert validate_transcript(engine.messages) == []


async def test_an_abort_spent_on_one_turn_never_reaches_the_next() -> None:
    """send_now while the host holds an event: the loop settles turn 1 and starts turn 2 without
    suspending, so the abort's hand-over to the loop runs only inside turn 2. It must neither
    cancel turn 2's stream nor put an abort into turn 2's mailbox (which would cancel its tools
    after the grace period)."""

    @tool(concurrency_safe=True)
    async def step(ctx: ToolContext) -> str:
        await asyncio.sleep(0)
        return "stepped"

    second = ScriptedResponse(text="Working on it.", chunk=4, delay=0.0005, tool_calls=[ScriptedToolCall("step")])
    engine = engine_for([second, "New answer."], tools=[step], tool_cancel_grace=0)  # turn 1 never streams
    events = []
    async for ev in engine.run("first"):
        events.append(ev)
        if isinstance(ev, TurnStarted) and ev.turn == 1:
            engine.send_now("actually, do this")
    ends = [e for e in events if isinstance(e, TurnEnded)]
    assert [(e.reason, e.abort_reason) for e in ends] == [("aborted_streaming", "send_now"), ("completed", None)]
    assert results(engine) == ["stepped"]
    assert engine.messages[-1].text == "New answer."
    assert validate_transcript(engine.messages) == []


async def test_send_now_from_a_thread_never_stops_the_turn_its_own_text_started() -> None:
    """A UI thread's send_now queues the text, then stops the running turn. If the loop takes
    the text and starts its turn in between (the previous turn was just ending), the stop must
    land on the spent turn, not on the new one: the user's message gets its answer."""
    engine = engine_for(["first answer", ScriptedResponse(text="the answer to it", chunk=4), "unused"])
    queued, turn2 = threading.Event(), threading.Event()
    put = engine.inbox.put

    def slow_put(*args: object, **kwargs: bool) -> str:
        receipt = put(*args, **kwargs)  # type: ignore[arg-type]
        queued.set()
        turn2.wait(5)  # the UI thread is descheduled here until the loop has started turn 2
        return receipt

    engine.inbox.put = slow_put  # type: ignore[method-assign]
    ui = threading.Thread(target=engine.send_now, args=("instead",))
    events = []
    async for ev in engine.run("go"):
        events.append(ev)
        if isinstance(ev, AssistantMessage) and not ui.is_alive() and not turn2.is_set():
            ui.start()
            await asyncio.to_thread(queued.wait, 5)
        elif isinstance(ev, TurnStarted) and ev.turn == 2:
            turn2.set()
            await asyncio.to_thread(ui.join, 5)  # its stop has landed
    ends = [(e.reason, e.abort_reason) for e in events if isinstance(e, TurnEnded)]
    assert ends == [("completed", None), ("completed", None)]
    assert [m.text for m in engine.messages] == ["go", "first answer", "instead", "the answer to it"]


async def test_send_now_while_idle_starts_the_next_run() -> None:
    engine = engine_for(["hi"])
    receipt = engine.send_now("queued for later")
    assert receipt.startswith("send-")
    events = await collect(engine)
    assert isinstance(events[0], TurnStarted) and events[0].prompt is not None
    assert events[0].prompt.text == "queued for later"


async def test_send_now_text_is_never_lost_even_if_cancel_won() -> None:
    engine = engine_for([ScriptedResponse(text="abcdefghij", chunk=2), "second"])
    async for ev in engine.run("go"):
        if isinstance(ev, TextDelta):
            engine.interrupt("cancel")
            engine.send_now("keep me")
    assert any(m.text == "keep me" for m in engine.messages)



@pytest.mark.parametrize("at", ["same_moment", "while_the_turn_settles"])
async def test_an_interrupt_after_a_send_now_stops_the_turn_its_text_starts(at: str) -> None:
    """send_now() then interrupt(), before the send-now's turn began (at once, or while the
    stopped turn's tool used its cancel grace): the interrupt landed on the turn the send-now had
    stopped already and was ignored, so the send-now's turn made its model request anyway. The
    user's last word was "stop"; the text stays in the transcript for the next run."""
    release = asyncio.Event()

    @tool
    async def build(ctx: ToolContext) -> str:
        """Ignores the signal until released."""
        await release.wait()
        return "built"

    engine = engine_for([calls("build"), "the answer to the send-now", "unused"], tools=[build])
    hooked: list[str] = []
    engine.on_abort(hooked.append)
    events = []
    async for ev in engine.run("go"):
        events.append(ev)
        if isinstance(ev, ToolCallStarted):
            engine.send_now("do this instead")
            if at == "same_moment":
                engine.interrupt()
                release.set()
            else:
                asyncio.get_running_loop().call_soon(engine.interrupt)
                asyncio.get_running_loop().call_later(0.01, release.set)
    ends = [(e.reason, e.abort_reason) for e in events if isinstance(e, TurnEnded)]
    assert ends == [("aborted_tools", "send_now"), ("aborted_streaming", "cancel")]
    assert engine.model.request_count == 1  # type: ignore[attr-defined]
    assert [m.text for m in engine.messages[3:]] == ["do this instead", TEXTS.interrupt_notice]
    assert hooked == ["send_now", "cancel"]
    assert validate_transcript(engine.messages) == []


async def test_other_reasons_are_treated_like_cancel() -> None:
    engine = engine_for([ScriptedResponse(text="abcdefghij", chunk=2)])
    await interrupt_at_first_text(engine, "escape_key")
    assert engine.last_turn_ended.abort_reason == "escape_key"  # type: ignore[union-attr]
    assert engine.messages[-1].kind == "interrupt_notice"


async def test_interrupt_notice_envelope_wraps_the_next_user_message() -> None:
    engine = engine_for([ScriptedResponse(text="abcdefghij", chunk=2), "ok"], interrupt_notice="envelope")
    await interrupt_at_first_text(engine)
    assert not any(m.kind == "interrupt_notice" for m in engine.messages)
    await collect(engine, "next question")
    wrapped = next(m for m in engine.messages if "next question" in m.text)
    assert wrapped.text.startswith(TEXTS.interrupt_envelope) and "<user_query>" in wrapped.text


async def test_interrupt_notice_envelope_wraps_a_prompt_given_as_a_message() -> None:
    """A host that sends its prompts as `Message.user(text, meta=...)` (to tag them) got no
    envelope: the model was never told its last answer had been cut."""
    engine = engine_for([ScriptedResponse(text="abcdefghij", chunk=2), "ok", "ok"], interrupt_notice="envelope")
    await interrupt_at_first_text(engine)
    await collect(engine, Message.user("next question", meta={"ui": 7}))
    wrapped = engine.messages[2]
    assert wrapped.text.startswith(TEXTS.interrupt_envelope) and "<user_query>\nnext question\n</user_query>" in wrapped.text
    assert wrapped.meta == {"ui": 7}
    await collect(engine, Message.user("and then"))  # only the next message: the cut is answered
    assert engine.messages[-2].text == "and then"


async def test_interrupt_notice_envelope_is_not_used_when_a_call_was_dangling() -> None:
    @tool
    async def t() -> str:
        return "x"

    engine = engine_for([calls("t"), "ok"], tools=[t], interrupt_notice="envelope")
    async for ev in engine.run("go"):
        if isinstance(ev, AssistantMessage):
            engine.interrupt()
    await collect(engine, "plain")
    assert engine.messages[-2].text == "plain"


async def test_interrupt_notice_none_adds_nothing() -> None:
    engine = engine_for([ScriptedResponse(text="abcdefghij", chunk=2)], interrupt_notice=None)
    await interrupt_at_first_text(engine)
    assert engine.messages[-1].role == "assistant" and engine.messages[-1].partial


async def test_interrupt_when_idle_is_a_no_op_and_never_raises() -> None:
    engine = engine_for(["hi"])
    engine.interrupt()
    engine.interrupt(None)  # type: ignore[arg-type]
    events = await collect(engine, "go")
    assert events[-1].reason == "completed"  # type: ignore[union-attr]


@pytest.mark.parametrize("blank", ["", "  \n"])
async def test_a_blank_interrupt_reason_is_the_default_cancel(blank: str) -> None:
    """``interrupt("")`` (a reason read from an empty field) gave a blank ``abort_reason``."""
    engine = engine_for(["hello there"])
    hooked: list[str] = []
    engine.on_abort(hooked.append)
    events = []
    async for event in engine.run("go"):
        events.append(event)
        if isinstance(event, TurnStarted):
            engine.interrupt(blank)
    end = events[-1]
    assert isinstance(end, TurnEnded) and end.abort_reason == "cancel"
    assert hooked == ["cancel"]


async def test_on_abort_hooks_receive_the_reason_sync_and_async() -> None:
    got: list[str] = []

    async def async_hook(reason: str) -> None:
        got.append("async:" + reason)

    engine = engine_for([ScriptedResponse(text="abcdefgh", chunk=2)])
    engine.on_abort(lambda r: got.append("sync:" + r))
    engine.on_abort(async_hook, main_only=True)
    await interrupt_at_first_text(engine, "stop")
    assert got == ["sync:stop", "async:stop"]



async def test_an_abort_hook_that_meets_a_cancellation_of_its_own_is_a_failed_hook(caplog: pytest.LogCaptureFixture) -> None:
    """A hook awaiting cleanup that someone else cancelled (a connection's reader task stopped
    during its shutdown) raised CancelledError out of ``run()`` into a host whose task nobody had
    cancelled: no TurnEnded, and the hooks after it were never called. It is a hook that failed:
    logged, and the others still run."""
    got: list[str] = []

    async def cleanup(reason: str) -> None:
        reader = asyncio.ensure_future(asyncio.Event().wait())
        reader.cancel()  # stopped by the connection's own shutdown
        await reader

    engine = engine_for([ScriptedResponse(text="abcdefgh", chunk=2)])
    engine.on_abort(cleanup)
    engine.on_abort(got.append)
    with caplog.at_level(logging.ERROR, logger="agentloop"):
        await interrupt_at_first_text(engine)
    assert got == ["cancel"]
    end = engine.last_turn_ended
    assert end is not None and (end.reason, end.abort_reason) == ("aborted_streaming", "cancel")
    assert any("on_abort hook" in r.getMessage() for r in caplog.records)
    assert not engine.running and validate_transcript(engine.messages) == []


async def test_an_abort_hook_cut_short_by_a_cancel_of_the_host_is_not_called_again() -> None:
    """A server interrupts the run, then cancels its task while a slow async on_abort hook runs
    (closing a connection, say): the cleanup that follows must not call the hooks a second time."""
    calls: list[str] = []
    entered = asyncio.Event()

    async def slow_hook(reason: str) -> None:
        calls.append(reason)
        entered.set()
        if len(calls) == 1:
            await asyncio.Event().wait()  # until the host cancels it

    engine = engine_for([ScriptedResponse(text="abcdefgh", chunk=2)])
    engine.on_abort(slow_hook)

    async def consume() -> None:
        async for ev in engine.run("go"):
            if isinstance(ev, TextDelta):
                engine.interrupt("shutdown")

    task = asyncio.ensure_future(consume())
    await entered.wait()
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
    assert calls == ["shutdown"]
    assert not engine.running and validate_transcript(engine.messages) == []


async def test_run_rejects_a_non_user_prompt_and_a_second_concurrent_run() -> None:
    engine = engine_for(["a", "b"])
    with pytest.raises(ValueError, match="user message"):
        await collect(engine, Message.assistant("x"))
    with pytest.raises(ValueError, match="needs a prompt"):
        await collect(engine)
    for blank in ("", "  \n"):  # a blank user message, which providers refuse on every request
        with pytest.raises(ValueError, match="needs a prompt with text"):
            await collect(engine, blank)
        with pytest.raises(ValueError, match="needs text"):
            engine.follow_up(blank)
        with pytest.raises(ValueError, match="needs text"):
            engine.send_now(blank)
    assert engine.messages == [] and not engine.inbox.follow_ups and not engine.inbox.send_now
    it = engine.run("one")
    await it.__anext__()
    with pytest.raises(RuntimeError, match="already in progress"):
        await collect(engine, "two")
    await it.aclose()
    assert validate_transcript(engine.messages) == []


async def test_toolcallstarted_is_emitted_when_a_call_starts() -> None:
    @tool
    async def t() -> str:
        return "x"

    events = await collect(engine_for([calls("t"), "done"], tools=[t]), "go")
    names = kinds(events)
    assert names.index("ToolCallStarted") < names.index("ToolCallFinished")
    assert isinstance(events[names.index("ToolCallStarted")], ToolCallStarted)


async def test_interrupt_from_a_signal_handler_stops_the_stream() -> None:
    import os
    import signal

    model = HangingModel()
    engine = QueryEngine(model, policies=[])
    old = signal.signal(signal.SIGUSR1, lambda *_: engine.interrupt("sigusr1"))
    try:
        run = asyncio.ensure_future(collect(engine, "go"))
        await model.waiting.wait()
        os.kill(os.getpid(), signal.SIGUSR1)
        events = await run
    finally:
        signal.signal(signal.SIGUSR1, old)
    end = events[-1]
    assert isinstance(end, TurnEnded) and end.reason == "aborted_streaming" and end.abort_reason == "sigusr1"
    assert model.closed and validate_transcript(engine.messages) == []


async def test_interject_from_another_thread_is_delivered() -> None:
    gate = asyncio.Event()
    release = threading.Event()

    @tool
    async def slow(ctx: ToolContext) -> str:
        gate.set()
        await asyncio.to_thread(release.wait, 10)
        return "done"

    engine = engine_for([calls("slow"), "ok"], tools=[slow])
    run = asyncio.ensure_future(collect(engine, "go"))
    await gate.wait()
    receipts: list[str] = []
    thread = threading.Thread(target=lambda: (receipts.append(engine.interject("from a thread")), release.set()))
    thread.start()
    events = await run
    thread.join()
    injected = [e for e in events if type(e).__name__ == "InterjectionInjected"]
    assert injected and injected[0].ids == tuple(receipts)  # type: ignore[attr-defined]
    assert any("from a thread" in m.text for m in engine.messages if m.kind == "interjection")


async def test_hook_stopped_terminal_from_a_policy_before_tools_run() -> None:
    from agentloop import Policy
    from agentloop._policy import EndTurn

    class Gate(Policy):
        def on_response(self, message: Message) -> EndTurn | None:
            return EndTurn("a pre-tool hook refused this batch", reason="hook_stopped") if message.tool_uses else None

    ran: list[str] = []

    @tool
    async def t() -> str:
        ran.append("t")
        return "x"

    engine = QueryEngine(ScriptedModel([calls("t")]), tools=[t], policies=[Gate()])
    events = await collect(engine, "go")
    end = events[-1]
    assert isinstance(end, TurnEnded) and end.reason == "hook_stopped"
    assert end.detail == "a pre-tool hook refused this batch" and ran == []
    assert results(engine) == ["Not run: a pre-tool hook refused this batch"]
    assert validate_transcript(engine.messages) == []


def _gated_engine(reason: str) -> QueryEngine:
    """An engine whose policy ends the turn (with ``reason``) on its one response, a call of a
    tool that must never start."""
    from agentloop import Policy
    from agentloop._policy import EndTurn

    class Gate(Policy):
        def on_response(self, message: Message) -> EndTurn | None:
            return EndTurn("the same call again", reason=reason)  # type: ignore[arg-type]

    @tool
    async def t() -> str:
        raise AssertionError("never started")

    return QueryEngine(ScriptedModel([calls("t")]), tools=[t], policies=[Gate()])


@pytest.mark.parametrize("reason", ["stationarity_ended", "hook_stopped"])
async def test_an_interrupt_that_lands_with_a_policys_end_of_the_turn_wins(reason: str) -> None:
    """The host interrupted as the response came (holding its AssistantMessage) and a policy
    ended the turn on that response: the turn ended with the policy's terminal, ``abort_reason``
    None, no notice and no ``on_abort`` hook called, though the host had asked to stop. The
    interrupt wins now, as it does at checkpoint 2 with no policy."""
    engine = _gated_engine(reason)
    end, hooked = await _interrupted_at(engine, AssistantMessage)
    assert (end.reason, end.abort_reason) == ("aborted_tools", "cancel")
    assert hooked == ["cancel"]
    assert results(engine) == [TEXTS.never_started]
    assert engine.messages[-1].text == TEXTS.interrupt_notice
    assert validate_transcript(engine.messages) == []


@pytest.mark.parametrize("reason", ["stationarity_ended", "hook_stopped"])
async def test_an_interrupt_while_the_host_holds_a_call_a_policy_kept_from_running_wins(reason: str) -> None:
    """A policy ended the turn on a response with calls, whose "Not run" results the host was
    handling when the user pressed stop: the turn ended with the policy's terminal, no abort
    reason, no notice, no ``on_abort`` hook. The abort wins now; the results stay as written."""
    engine = _gated_engine(reason)
    end, hooked = await _interrupted_at(engine, ToolCallFinished)
    assert (end.reason, end.abort_reason, end.detail) == ("aborted_tools", "cancel", None)
    assert hooked == ["cancel"]
    assert results(engine) == ["Not run: the same call again"]
    assert engine.messages[-1].text == TEXTS.interrupt_notice
    assert validate_transcript(engine.messages) == []


def _interrupt_as_the_turn_ends(engine: QueryEngine, monkeypatch: pytest.MonkeyPatch) -> None:
    """Land ``engine.interrupt()`` as the turn's end begins, after the policies' verdicts: what an
    interrupt from another thread does at that instant."""
    from agentloop import _ending

    settle = _ending.settle_results

    def settle_then_interrupt(*args: Any, **kw: Any) -> Any:
        engine.interrupt()
        return settle(*args, **kw)

    monkeypatch.setattr(_ending, "settle_results", settle_then_interrupt)


async def test_an_interrupt_after_a_policy_ended_the_turn_on_results_wins(monkeypatch: pytest.MonkeyPatch) -> None:
    """The interrupt came after ``on_results`` had ended the turn, before its TurnEnded: the
    turn used to end ``stationarity_ended`` as if nobody had pressed stop; the abort wins now."""
    from agentloop import Policy
    from agentloop._policy import EndTurn

    class Enough(Policy):
        def on_results(self, message: Message, results: Any) -> EndTurn:
            return EndTurn("polled enough")

    @tool
    async def t() -> str:
        return "real"

    engine = QueryEngine(ScriptedModel([calls("t"), "never"]), tools=[t], policies=[Enough()])
    _interrupt_as_the_turn_ends(engine, monkeypatch)
    hooked: list[str] = []
    engine.on_abort(hooked.append)
    end = (await collect(engine, "go"))[-1]
    assert isinstance(end, TurnEnded)
    assert (end.reason, end.abort_reason, end.detail) == ("aborted_tools", "cancel", None)
    assert hooked == ["cancel"] and results(engine) == ["real"]  # the real result stays
    assert engine.messages[-1].text == TEXTS.interrupt_notice
    assert validate_transcript(engine.messages) == []


async def test_an_interrupt_after_a_policy_ended_a_turn_with_no_calls_leaves_the_policys_end(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """After a whole answer with no calls the abort has nothing to stop: the policy's end, and
    its detail, stand (as a plain answer is `completed` after such an interrupt)."""
    from agentloop import Policy
    from agentloop._policy import EndTurn

    class Gate(Policy):
        def on_response(self, message: Message) -> EndTurn:
            return EndTurn("enough said", reason="hook_stopped")

    engine = QueryEngine(ScriptedModel(["the answer"]), policies=[Gate()])
    _interrupt_as_the_turn_ends(engine, monkeypatch)
    end = (await collect(engine, "go"))[-1]
    assert isinstance(end, TurnEnded)
    assert (end.reason, end.abort_reason, end.detail) == ("hook_stopped", None, "enough said")
    assert [m.text for m in engine.messages] == ["go", "the answer"]


async def test_assistant_message_event_says_why_the_model_stopped() -> None:
    @tool
    async def t() -> str:
        return "x"

    events = await collect(engine_for([calls("t"), "done"], tools=[t]), "go")
    stops = [e.stop_reason for e in events if isinstance(e, AssistantMessage)]
    assert stops == ["tool_use", "end_turn"]


async def test_the_loop_reads_the_running_task_as_asyncio_does() -> None:
    # The stream loop records the task it runs in (an abort cancels that task's await);
    # on Python 3.11 it reads it without the Python current_task() wrapper.
    from agentloop._run import current_task_of

    loop = asyncio.get_running_loop()
    assert current_task_of(loop) is asyncio.current_task() is not None

    async def report() -> object:
        return current_task_of(loop)

    inner = asyncio.ensure_future(report())
    assert await inner is inner


@pytest.mark.parametrize("where", ["stream", "retry_backoff"])
async def test_a_cancel_of_the_host_task_is_never_swallowed_by_an_abort_that_follows_it(where: str) -> None:
    """A server shutting down interrupts the engine, then cancels the task iterating it: both
    land before the task runs again. The abort's own cancellation is converted; the host's must
    still reach the host (asyncio.timeout's rule: a cancel requested before ours is not ours)."""
    if where == "stream":
        model: object = HangingModel()
    else:
        busy = ModelError("overloaded", retryable=True, retry_after=30.0)
        model = ScriptedModel([ScriptedResponse(error=busy), "never streamed"])
    engine = QueryEngine(model, policies=[])  # type: ignore[arg-type]
    events: list[object] = []
    waiting = asyncio.Event()

    async def consume() -> None:
        async for ev in engine.run("go"):
            events.append(ev)
            if isinstance(ev, Retrying):
                waiting.set()  # the task goes on into the back-off sleep, then suspends

    task = asyncio.ensure_future(consume())
    await (model.waiting if isinstance(model, HangingModel) else waiting).wait()
    engine.interrupt("shutdown")
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
    assert task.cancelled()
    assert not engine.running and not any(isinstance(e, TurnEnded) for e in events)
    assert validate_transcript(engine.messages) == []


async def test_send_now_while_idle_comes_before_the_prompt_of_the_next_run() -> None:
    """A text sent now while idle starts the next run: run(prompt) used to send the prompt
    first and the earlier text after the model had answered it, as a second turn."""
    seen: list[list[str]] = []

    def answer(request: object) -> str:
        seen.append([m.text for m in request.messages])  # type: ignore[attr-defined]
        return "both answered"

    engine = engine_for([answer])
    receipt = engine.send_now("first, this")
    events = await collect(engine, "then this")
    assert seen == [["first, this", "then this"]]
    assert [m.text for m in engine.messages] == ["first, this", "then this", "both answered"]
    assert engine.messages[0].meta == {"receipt": receipt}
    assert [e.reason for e in events if isinstance(e, TurnEnded)] == ["completed"]
    assert not engine.inbox.send_now



async def test_interrupt_envelope_survives_a_new_engine_on_the_same_transcript() -> None:
    """The "envelope" notice was a flag of the engine that was interrupted: a host that builds a
    new engine for the next request (a server, a resumed session) lost it, and the model never
    learned that its previous answer was cut short."""
    first = engine_for([ScriptedResponse(text="abcdefghij", chunk=2)], interrupt_notice="envelope")
    async for ev in first.run("go"):
        if isinstance(ev, TextDelta):
            first.interrupt()
    second = engine_for(["ok"], messages=first.messages, interrupt_notice="envelope")
    await collect(second, "next question")
    wrapped = second.messages[-2]
    assert wrapped.text.startswith(TEXTS.interrupt_envelope) and "next question" in wrapped.text


async def test_interrupt_envelope_survives_a_session_file(tmp_path: object) -> None:
    from pathlib import Path

    from agentloop.sessions import JsonlSession

    path = Path(str(tmp_path)) / "s.jsonl"
    with JsonlSession(path) as session:
        first = engine_for([ScriptedResponse(text="abcdefghij", chunk=2)], interrupt_notice="envelope", session=session)
        async for ev in first.run("go"):
            if isinstance(ev, TextDelta):
                first.interrupt()
    session, loaded = JsonlSession.resume(path)
    with session:
        second = engine_for(["ok"], messages=loaded.messages, interrupt_notice="envelope", session=session)
        await collect(second, "next question")
    assert second.messages[-2].text.startswith(TEXTS.interrupt_envelope)
    assert JsonlSession(path).load().messages == second.messages


async def test_interrupt_envelope_wraps_only_the_message_right_after_the_cut() -> None:
    """The flag used to wait for the next str prompt: after a Message prompt (or an interjection)
    answered the cut, a much later question was still wrapped as if it followed the interrupt."""
    engine = engine_for(
        [ScriptedResponse(text="abcdefghij", chunk=2), "one", "two"], interrupt_notice="envelope"
    )
    await interrupt_at_first_text(engine)
    await collect(engine, Message.user("a message of the host's"))
    await collect(engine, "a later question")
    assert engine.messages[-2].text == "a later question"
    wrapped = [m.text for m in engine.messages if TEXTS.interrupt_envelope in m.text]
    assert len(wrapped) == 1 and "a message of the host's" in wrapped[0]  # the one right after the cut


async def test_interrupt_envelope_is_not_used_after_a_consumer_close() -> None:
    engine = engine_for([ScriptedResponse(text="abcdefghij", chunk=2), "ok"], interrupt_notice="envelope")
    async for ev in engine.run("go"):
        if isinstance(ev, TextDelta):
            break
    assert engine.messages[-1].partial
    await collect(engine, "plain")
    assert engine.messages[-2].text == "plain"


async def test_send_now_while_idle_after_an_envelope_interrupt_wraps_only_the_first_text() -> None:
    engine = engine_for([ScriptedResponse(text="abcdefghij", chunk=2), "ok"], interrupt_notice="envelope")
    await interrupt_at_first_text(engine)
    engine.send_now("sent now")
    await collect(engine, "the prompt")
    assert engine.messages[-3].text.startswith(TEXTS.interrupt_envelope) and "sent now" in engine.messages[-3].text
    assert engine.messages[-2].text == "the prompt"


_SIGNAL_CHILD = """
import signal
from agentloop import QueryEngine, ScriptedModel

engine = QueryEngine(ScriptedModel([]), policies=[])
from_handler, typed, taken = [], [], []

def handler(signum, frame):
    from_handler.append(engine.interject("from a signal handler"))

signal.signal(signal.SIGALRM, handler)
signal.setitimer(signal.ITIMER_REAL, 0.0005, 0.0005)
while len(from_handler) < 500:  # the loop's safe points, as the user types and hits keys
    typed.append(engine.follow_up("typed"))
    taken += [q.id for q in engine.inbox.take(engine.inbox.follow_ups)]
    taken += [q.id for q in engine.inbox.take(engine.inbox.interjections)]
signal.setitimer(signal.ITIMER_REAL, 0, 0)
taken += [q.id for q in engine.inbox.take(engine.inbox.interjections)]
sent = from_handler + typed
assert len(set(sent)) == len(sent), "a receipt was given twice"
assert sorted(taken) == sorted(sent), "a queued text was lost"
print("ok")
"""


def test_a_control_call_from_a_signal_handler_never_waits_for_the_thread_it_interrupted() -> None:
    """A signal handler runs on the thread it interrupts. Landing while that thread was inside
    the inbox (the loop draining it, or the host queueing a text), an interject() from the
    handler waited for a lock that thread held, and the process hung for good."""
    repo = Path(__file__).resolve().parent.parent
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(repo), os.environ.get("PYTHONPATH", "")])}
    done = subprocess.run(
        [sys.executable, "-c", _SIGNAL_CHILD], capture_output=True, text=True, env=env, timeout=60, check=False
    )
    assert (done.returncode, done.stdout.strip()) == (0, "ok"), done.stderr[-2000:]


async def test_interrupt_with_no_reason_is_the_default_cancel_not_the_text_none() -> None:
    engine = engine_for([ScriptedResponse(text="The quick brown fox jumps", chunk=4)])
    async for ev in engine.run("go"):
        if isinstance(ev, TextDelta):
            engine.interrupt(None)  # type: ignore[arg-type]
        end = ev
    assert isinstance(end, TurnEnded) and end.reason == "aborted_streaming" and end.abort_reason == "cancel"


class _HandlerInside(list[tuple[str]]):
    """A signal's claims that run ``handler`` just after the first abort has claimed it, before
    that abort records its reason: as a Ctrl-C handler landing there would."""

    def __init__(self, handler: Callable[[], object]) -> None:
        super().__init__()
        self._handler: Callable[[], object] | None = handler

    def append(self, claim: tuple[str]) -> None:
        super().append(claim)
        handler, self._handler = self._handler, None
        if handler is not None:
            handler()


async def test_an_interrupt_landing_inside_a_send_nows_own_abort_stops_the_turn_its_text_starts() -> None:
    """A signal handler's interrupt() ran while send_now() was aborting the turn, after the abort
    had won and before it recorded "send_now": the interrupt found no reason yet, took the turn
    for one not stopped by a send-now, and was lost. The send-now's turn made its request."""
    release = asyncio.Event()

    @tool
    async def build(ctx: ToolContext) -> str:
        """Ignores the signal until released."""
        await release.wait()
        return "built"

    engine = engine_for([calls("build"), "the answer to the send-now", "unused"], tools=[build])
    events = []
    async for ev in engine.run("go"):
        events.append(ev)
        if isinstance(ev, ToolCallStarted):
            assert engine.signal is not None
            engine.signal._once = _HandlerInside(engine.interrupt)
            engine.send_now("do this instead")
            release.set()
    ends = [(e.reason, e.abort_reason) for e in events if isinstance(e, TurnEnded)]
    assert ends == [("aborted_tools", "send_now"), ("aborted_streaming", "cancel")]
    assert engine.model.request_count == 1  # type: ignore[attr-defined]
    assert validate_transcript(engine.messages) == []


async def test_an_interrupt_from_a_thread_that_finds_the_send_nows_turn_begun_leaves_no_stop_for_a_later_turn() -> None:
    """send_now(A), then interrupt() from a thread that read the turn A stopped and resumed only
    once A's turn had begun (and taken its pending stop): it stopped A's turn, and its stop also
    stayed pending, so the turn of a later send_now(B) began stopped. B is the user's last word."""
    release = asyncio.Event()
    in_abort, a_begun = threading.Event(), threading.Event()

    @tool
    async def build(ctx: ToolContext) -> str:
        """Ignores the signal until released."""
        await release.wait()
        return "built"

    class Paused(AbortController):
        __slots__ = ()

        def abort(self, reason: str = "cancel") -> None:
            super().abort(reason)
            if reason == "cancel":  # the interrupting thread: descheduled here until A's turn began
                in_abort.set()
                a_begun.wait(5)

    engine = engine_for([calls("build"), "answer", "answer", "answer"], tools=[build])
    ui = threading.Thread(target=engine.interrupt)
    events = []
    async for ev in engine.run("go"):
        events.append(ev)
        if isinstance(ev, ToolCallStarted):
            engine.send_now("A")
            assert engine._state is not None
            engine._state.controller.__class__ = Paused
            ui.start()
            await asyncio.to_thread(in_abort.wait, 5)
            release.set()
        elif isinstance(ev, TurnStarted) and ev.turn == 2:
            a_begun.set()
            await asyncio.to_thread(ui.join, 5)
        elif isinstance(ev, TurnEnded) and ev.abort_reason == "cancel":
            engine.send_now("B")
    ends = [(e.reason, e.abort_reason) for e in events if isinstance(e, TurnEnded)]
    assert ends[0] == ("aborted_tools", "send_now") and ends[1][1] == "cancel"
    assert ends[2:] == [("completed", None)]
    assert engine.messages[-1].text == "answer"
    assert validate_transcript(engine.messages) == []
