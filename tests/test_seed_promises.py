"""What the design's source articles describe of the kernel, where SPEC.md leaves it open.

Each test names the behaviour it pins in its docstring.
"""

from __future__ import annotations

import asyncio
import json
import sys
from pathlib import Path

import httpx
import pytest

from agentloop import (
    Allow,
    Deny,
    DoomLoopDetected,
    InterjectionInjected,
    ModelError,
    QueryEngine,
    Resampling,
    Retrying,
    ScriptedModel,
    ScriptedResponse,
    ScriptedToolCall,
    TextDelta,
    ToolCallStarted,
    ToolContext,
    ToolUseBlock,
    TurnEnded,
    run_process,
    tool,
    validate_transcript,
)
from agentloop._model import ModelRequest, StreamEnd, StreamSignals, StreamText
from agentloop.models import OpenAIResponsesModel
from agentloop.policies import ConservativeDoomLoopPolicy
from tests.helpers import VirtualClock, collect, kinds, pid_alive

#: An attempt the stock doom-loop policy cuts at once: a confident server signal mid-stream.
CUT = ScriptedResponse(
    events=[
        StreamText(0, "partial "),
        StreamSignals(("tail_repetition:32@thinking",)),
        StreamText(0, "more"),
        StreamEnd(stop_reason="end_turn"),
    ]
)


async def test_a_hard_cancel_kills_the_foreground_command_before_the_turn_ends(tmp_path: Path) -> None:
    """Hard cancel: the command running in the foreground is killed first, and only then does
    the turn end, so by the time the host sees the terminal the process is gone."""
    pidfile = tmp_path / "pid"
    script = f"import os, time; open({str(pidfile)!r}, 'w').write(str(os.getpid())); time.sleep(60)"
    running = asyncio.Event()

    @tool
    async def build(ctx: ToolContext) -> str:
        """Build the project."""
        call = asyncio.ensure_future(run_process(sys.executable, "-c", script, signal=ctx.signal))
        while not pidfile.exists() or not pidfile.read_text():
            await asyncio.sleep(0.01)
        running.set()
        return (await call).stdout

    model = ScriptedModel([ScriptedResponse(tool_calls=[ScriptedToolCall("build")])])
    engine = QueryEngine(model, tools=[build], tool_cancel_grace=30.0)
    alive_at_the_end: list[bool] = []
    async for event in engine.run("build it"):
        if isinstance(event, ToolCallStarted):
            await running.wait()
            engine.interrupt()
        elif isinstance(event, TurnEnded):
            assert (event.reason, event.abort_reason) == ("aborted_tools", "cancel")
            alive_at_the_end.append(pid_alive(int(pidfile.read_text())))
    assert alive_at_the_end == [False]
    result = engine.messages[2].tool_results[0]
    assert result.is_error and "stopped while it was running" in result.text


async def test_a_doom_loop_resample_goes_out_at_once_with_no_back_off() -> None:
    """Doom-loop resampling is almost immediate (a loop is a matter of chance, so waiting gains
    nothing): the signals are reported, the attempt discarded, and the resample sent with no
    time passing, however long the transport back-off is."""
    model = ScriptedModel([CUT, "Fixed it."])
    engine = QueryEngine(model, policies=[ConservativeDoomLoopPolicy()], retry_base_delay=30.0)
    with VirtualClock() as clock:
        start = clock.now
        events = await collect(engine, "go")
        elapsed = clock.now - start
    names = kinds(events)
    assert names.index("DoomLoopDetected") < names.index("AttemptDiscarded") < names.index("Resampling")
    assert "Retrying" not in names
    assert elapsed == 0.0
    assert [m.text for m in engine.messages] == ["go", "Fixed it."]


@pytest.mark.parametrize("again", ["resample", "retry"])
async def test_a_resample_or_a_retry_is_no_safe_point_for_interjections(again: str) -> None:
    """Interjections are merged only at the three safe points (top of an iteration, after a
    tool batch, before the turn ends): the same request tried again after a doom-loop cut or a
    transport error is not one, so the retried request goes without the interjection, which
    is merged after its answer and answered in a request of its own."""
    seen: list[list[str | None]] = []

    def answer(text: str):  # type: ignore[no-untyped-def]
        def respond(request: ModelRequest) -> str:
            seen.append([m.kind for m in request.messages])
            return text

        return respond

    first = CUT if again == "resample" else ScriptedResponse(error=ModelError("overloaded", retryable=True))
    model = ScriptedModel([first, answer("Fixed it."), answer("Noted.")])
    engine = QueryEngine(model, policies=[ConservativeDoomLoopPolicy()], retry_base_delay=0.001)
    events = []
    async for event in engine.run("go"):
        events.append(event)
        cut_streaming = again == "resample" and isinstance(event, TextDelta) and len(events) == 2
        if cut_streaming or isinstance(event, Retrying):
            engine.interject("Keep the API.")
    assert "interjection" not in seen[0]
    assert seen[1][-1] == "interjection"
    injected = [e for e in events if isinstance(e, InterjectionInjected)]
    assert [e.texts for e in injected] == [("Keep the API.",)]
    assert [m.text for m in engine.messages][:2] == ["go", "Fixed it."]
    assert engine.messages[-1].text == "Noted."
    assert validate_transcript(engine.messages) == []


async def test_a_main_only_hook_registered_on_a_subagent_never_runs() -> None:
    """Main-only cleanup is decided by whether the interrupted loop is a subagent's: a
    subagent never runs it, whether it was stopped alone or by its parent's abort, since the
    connection it would close is shared with the main loop; the main engine's runs once."""
    calls: list[str] = []

    @tool
    async def research(ctx: ToolContext) -> str:
        """Hand the research to a subagent."""
        words = ScriptedModel([ScriptedResponse(text="w " * 200, chunk=2, delay=0.001)])
        child = ctx.engine.subagent(agent_id="researcher", model=words)
        child.on_abort(lambda reason: calls.append(f"child main-only ({reason})"), main_only=True)
        async for event in child.run("dig"):
            if isinstance(event, TextDelta) and len(calls) == 0 and not ctx.signal.aborted:
                ctx.engine.interrupt("stop all")
        return child.messages[-1].text

    alone = QueryEngine(ScriptedModel(["unused"]), policies=[])
    child = alone.subagent(agent_id="solo", model=ScriptedModel([ScriptedResponse(text="w " * 50, chunk=2)]))
    child.on_abort(lambda reason: calls.append(f"child main-only ({reason})"), main_only=True)
    async for event in child.run("dig"):
        if isinstance(event, TextDelta):
            child.interrupt("child_cancel")
    assert calls == [] and child.last_turn_ended.abort_reason == "child_cancel"  # type: ignore[union-attr]

    model = ScriptedModel([ScriptedResponse(tool_calls=[ScriptedToolCall("research")])])
    engine = QueryEngine(model, tools=[research], policies=[])
    engine.on_abort(lambda reason: calls.append(f"main-only ({reason})"), main_only=True)
    end = (await collect(engine, "go"))[-1]
    assert isinstance(end, TurnEnded) and end.abort_reason == "stop all"
    assert calls == ["main-only (stop all)"]
    assert validate_transcript(engine.messages) == []


@pytest.mark.parametrize("first", ["allow", "interrupt"])
async def test_an_allow_given_in_the_instant_of_an_abort_never_starts_the_tool(first: str) -> None:
    """The permission prompt's race: the user answers "allow" and presses Ctrl-C at once (in
    either order, before the loop takes the answer). The abort wins: the tool never runs, its
    result says it never started, and the turn ends aborted."""
    ran: list[str] = []
    asked = asyncio.Event()
    answer: asyncio.Future[Allow | Deny] = asyncio.get_running_loop().create_future()

    @tool
    async def deploy() -> str:
        """Deploy to production."""
        ran.append("deploy")
        return "deployed"

    async def permission(use: ToolUseBlock, ctx: ToolContext) -> Allow | Deny:
        asked.set()
        return await answer

    model = ScriptedModel([ScriptedResponse(tool_calls=[ScriptedToolCall("deploy")]), "unused"])
    engine = QueryEngine(model, tools=[deploy], permission=permission)
    run = asyncio.ensure_future(collect(engine, "ship it"))
    await asked.wait()
    for step in (first, "interrupt" if first == "allow" else "allow"):
        if step == "allow":
            answer.set_result(Allow())
        else:
            engine.interrupt()
    events = await run
    end = events[-1]
    assert isinstance(end, TurnEnded) and (end.reason, end.abort_reason) == ("aborted_tools", "cancel")
    assert ran == []
    assert not any(isinstance(e, ToolCallStarted) for e in events)
    result = engine.messages[2].tool_results[0]
    assert result.is_error and result.text.startswith("Interrupted by user")
    assert "never started" in result.text
    assert validate_transcript(engine.messages) == []


@pytest.mark.parametrize("failure", ["doom_loop", "transport"])
async def test_each_model_request_of_a_turn_has_its_budget_afresh(failure: str) -> None:
    """The doom-loop budget is the sampler's, like the transport budget: each model request of
    a turn gets it whole, so a loop in the request after a tool batch is resampled (or an error
    retried) even when the request before it spent the budget."""

    @tool
    async def look() -> str:
        """Look around."""
        return "seen"

    flaky = ScriptedResponse(error=ModelError("overloaded", retryable=True))
    bad = CUT if failure == "doom_loop" else flaky
    model = ScriptedModel([bad, ScriptedResponse(tool_calls=[ScriptedToolCall("look")]), bad, "Done."])
    budgets = (
        {"doom_budget": 1, "retry_budget": 0}
        if failure == "doom_loop"
        else {"doom_budget": 0, "retry_budget": 1}
    )
    engine = QueryEngine(
        model, tools=[look], policies=[ConservativeDoomLoopPolicy()], retry_base_delay=0.001, **budgets
    )
    events = await collect(engine, "go")
    again = Resampling if failure == "doom_loop" else Retrying
    assert len([e for e in events if isinstance(e, again)]) == 2
    assert [e.action for e in events if isinstance(e, DoomLoopDetected)] == (
        ["resample", "resample"] if failure == "doom_loop" else []
    )
    end = events[-1]
    assert isinstance(end, TurnEnded) and end.reason == "completed"
    assert engine.messages[-1].text == "Done." and len(model.requests) == 4
    assert validate_transcript(engine.messages) == []


def _responses_body(signals: object) -> bytes:
    """A Responses stream answering "Hello", with one doom-loop frame carrying ``signals``."""
    item = {"type": "message", "id": "m1", "role": "assistant", "content": []}
    done = {**item, "content": [{"type": "output_text", "text": "Hello"}]}
    at = {"output_index": 0, "item_id": "m1", "content_index": 0}
    frames: list[dict[str, object]] = [
        {"type": "response.created", "response": {"id": "r1", "status": "in_progress", "output": []}},
        {"type": "response.output_item.added", "output_index": 0, "item": item},
        {"type": "response.output_text.delta", **at, "delta": "Hello"},
        {"type": "response.doom_loop_check", "signals": signals},
        {"type": "response.output_text.done", **at, "text": "Hello"},
        {"type": "response.output_item.done", "output_index": 0, "item": done},
        {"type": "response.completed", "response": {"id": "r1", "status": "completed", "output": []}},
    ]
    return "".join(f"event: {f['type']}\ndata: {json.dumps(f)}\n\n" for f in frames).encode()


@pytest.mark.parametrize("signals", [5, True, 2.5, {"tail": 32}, "tail_repetition:32@thinking"])
async def test_an_unreadable_doom_loop_frame_is_absorbed_and_the_answer_kept(signals: object) -> None:
    """The doom-loop frame is a side channel, absorbed before normal parsing so it can never
    spoil the response: one whose ``signals`` is not a list of signal strings (a number, an
    object, one bare string) carries no signal, and the answer streams on to its end (a number
    used to end the turn as a model error, "'int' object is not iterable")."""
    body = _responses_body(signals)
    transport = httpx.MockTransport(lambda request: httpx.Response(200, content=body))
    async with httpx.AsyncClient(transport=transport) as client:
        model = OpenAIResponsesModel("grok", api_key="k", http_client=client, doom_loop_check=True)
        events = await collect(QueryEngine(model, retry_budget=0), "go")
    end = events[-1]
    assert isinstance(end, TurnEnded) and (end.reason, end.error) == ("completed", None)
    assert not any(isinstance(e, DoomLoopDetected) for e in events)
    assert events[-2].message.text == "Hello"  # type: ignore[attr-defined]
