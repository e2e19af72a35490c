"""SPEC.md §1-§5, sentence by sentence, where no other test asserts the promise as stated.

§1 one abort controller per run, §2 the three checkpoints, §3 the transcript is always valid
(checked here with the providers' own request encoders), §4 reason-tagged aborts, §5 soft
interjection. Timing is driven with events (a tool that waits for the test, a model that waits
at a given event), never with sleeps.
"""

from __future__ import annotations

import asyncio
import threading
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from agentloop import (
    AbortSignal,
    Allow,
    Deny,
    Event,
    InterjectionDropped,
    InterjectionInjected,
    Message,
    QueryEngine,
    ScriptedModel,
    ScriptedResponse,
    ScriptedToolCall,
    TextDelta,
    ToolContext,
    ToolUseBlock,
    TurnEnded,
    TurnStarted,
    delegate_tool,
    tool,
    validate_transcript,
)
from agentloop._model import ModelRequest, StreamEvent
from agentloop.models import anthropic as anthropic_api
from agentloop.models import openai_chat as chat_api
from agentloop.models import openai_responses as responses_api
from tests.models.test_models_request_property import check_anthropic, check_chat, check_responses

THINKING = {"type": "enabled", "budget_tokens": 1024}


def check_wire(messages: list[Message]) -> None:
    """``messages`` make a request each provider's encoder builds and that provider accepts."""
    assert validate_transcript(messages) == [], messages
    request = ModelRequest(messages=messages)
    check_anthropic(anthropic_api.build_request(request, model="m", max_tokens=1024, thinking=None))
    check_anthropic(anthropic_api.build_request(request, model="m", max_tokens=1024, thinking=THINKING))
    check_chat(chat_api.build_request(request, model="m"))
    check_responses(responses_api.build_request(request, model="m"))


class Gate:
    """A model wrapper that records the signal of every stream and can hold a stream at its
    ``hold_at``-th event until the test lets it go (``release``)."""

    def __init__(self, inner: ScriptedModel, hold_at: int | None = None) -> None:
        self.inner = inner
        self.hold_at = hold_at
        self.signals: list[AbortSignal] = []
        self.open = 0
        self.held = asyncio.Event()
        self.release = asyncio.Event()

    @property
    def requests(self) -> list[ModelRequest]:
        return self.inner.requests

    async def stream(self, request: ModelRequest, signal: AbortSignal) -> AsyncIterator[StreamEvent]:
        self.signals.append(signal)
        self.open += 1
        try:
            n = 0
            async for event in self.inner.stream(request, signal):
                n += 1
                if self.hold_at is not None and n == self.hold_at:
                    self.hold_at = None
                    self.held.set()
                    await signal.wait()  # signal-aware IO: it ends at the abort
                    signal.throw_if_aborted()
                yield event
        finally:
            self.open -= 1


def text_of(message: Message) -> str:
    return "".join(b.text for b in message.content if b.type == "text")


# -- §3: every cut leaves a transcript each provider's encoder accepts -----------------------------


@tool(concurrency_safe=True)
async def coop(ms: int, ctx: ToolContext) -> str:
    """Works ``ms`` milliseconds, or until the abort (a cooperative call)."""
    started()
    try:
        async with asyncio.timeout(ms / 1000):
            await ctx.signal.wait()
    except TimeoutError:
        return f"coop {ms} done"
    return "stopped early"


@tool
async def deaf(ms: int) -> str:
    """Works ``ms`` milliseconds ignoring the signal: only cancellation stops it sooner."""
    started()
    await asyncio.sleep(ms / 1000)
    return f"deaf {ms} done"


STARTS: list[Callable[[], None]] = []  # called as each tool or prompt starts


def started() -> None:
    for hook in STARTS:
        hook()

_calls = st.builds(
    lambda name, ms: ScriptedToolCall(name, {"ms": ms}),
    st.sampled_from(["coop", "deaf", "missing"]),
    st.integers(0, 3),
)
_responses = st.builds(
    lambda text, thinking, signed, tools, chunk: ScriptedResponse(
        text=text, thinking=thinking, sign_thinking=signed, tool_calls=tools, chunk=chunk
    ),
    st.sampled_from(["", "Looking at it. ", "Done.  ", " \n"]),
    st.sampled_from(["", "think think"]),
    st.booleans(),
    st.lists(_calls, max_size=3),
    st.integers(1, 8),
)


@dataclass
class Cut:
    responses: list[ScriptedResponse]
    at: tuple[str, int]  # ("event", k): at the host's k-th event; ("start", k): as the k-th tool or prompt starts
    how: str  # cancel, send_now, escape (a reason of the host's own), break, aclose
    notice: str | None
    permission: bool


cuts = st.builds(
    Cut,
    st.lists(_responses, min_size=1, max_size=3),
    st.tuples(st.sampled_from(["event", "start"]), st.integers(1, 30)),
    st.sampled_from(["cancel", "send_now", "escape", "break", "aclose"]),
    st.sampled_from(["append", "envelope", None]),
    st.booleans(),
)


async def _ask(use: ToolUseBlock, ctx: ToolContext) -> Allow | Deny:
    started()
    if use.input.get("ms") == 3:
        try:  # a user who takes a moment, then says no (the abort ends the wait sooner)
            async with asyncio.timeout(0.003):
                await ctx.signal.wait()
        except TimeoutError:
            pass
        return Deny("no")
    return Allow()


async def play_cut(cut: Cut) -> None:
    model = ScriptedModel([*cut.responses, "Final answer."], cycle=True)
    engine = QueryEngine(
        model,
        tools=[coop, deaf],
        policies=[],
        tool_cancel_grace=0.001,
        permission=_ask if cut.permission else None,
        interrupt_notice=cut.notice,  # type: ignore[arg-type]
        max_turns=4,
    )
    run = engine.run("start")
    kind, at = cut.at
    starts = 0
    stop = asyncio.Event()

    def on_start() -> None:
        nonlocal starts
        starts += 1
        if kind == "start" and starts == at:
            asyncio.get_running_loop().call_soon(act)  # once the call or the prompt is waiting

    def act() -> None:
        if cut.how == "send_now":
            engine.send_now("do this instead")
        elif cut.how in ("cancel", "escape"):
            engine.interrupt(cut.how)
        else:
            stop.set()

    STARTS.append(on_start)
    try:
        async with asyncio.timeout(20):
            await _host(engine, run, cut, kind, at, stop)
    finally:
        STARTS.remove(on_start)
    check_wire(engine.messages)
    # The next request, whatever the cut: every request of a later run passes the encoders too.
    before = len(model.requests)
    async with asyncio.timeout(20):
        async for _event in engine.run("and now?"):
            pass
    for request in model.requests[before:]:
        check_wire(list(request.messages))
    check_wire(engine.messages)


async def _host(engine: QueryEngine, run: Any, cut: Cut, kind: str, at: int, stop: asyncio.Event) -> None:
    count = 0
    async for _event in run:
        count += 1
        if not stop.is_set() and not (kind == "event" and count == at):
            continue
        if cut.how == "send_now":
            engine.send_now("do this instead")
        elif cut.how in ("cancel", "escape"):
            engine.interrupt(cut.how)
        elif cut.how == "aclose":
            await run.aclose()
            break
        else:
            break
    await run.aclose()


@settings(max_examples=120)
@given(cuts)
def test_s3_any_cut_leaves_a_transcript_every_providers_encoder_accepts(cut: Cut) -> None:
    asyncio.run(play_cut(cut), debug=True)


# -- §1 and §4: one abort, one reason, every consumer at once --------------------------------------


async def test_s1_s4_one_interrupt_reaches_every_consumer_at_once_with_its_reason() -> None:
    """Parallel calls, a permission prompt being awaited and a subagent's own call are all in
    flight: one ``interrupt("escape")`` aborts every signal before it returns (nothing is
    cancelled one by one), and the reason reaches the tools, the prompt, the subagent, the
    abort hooks, both terminal events and the transcript's partial-message note."""
    seen: dict[str, AbortSignal] = {}
    waiting = {name: asyncio.Event() for name in ("a", "b", "prompt", "child")}

    @tool(concurrency_safe=True)
    async def work(name: str, ctx: ToolContext) -> str:
        seen[name] = ctx.signal
        waiting[name].set()
        return f"stopped by {await ctx.signal.wait()}"

    async def ask(use: ToolUseBlock, ctx: ToolContext) -> Allow | Deny:
        if use.name == "task" or use.input.get("name") != "prompt":
            return Allow()
        seen["prompt"] = ctx.signal
        waiting["prompt"].set()
        return Deny(f"prompt saw {await ctx.signal.wait()}")

    @tool(concurrency_safe=True)
    async def task(ctx: ToolContext) -> str:
        child = ctx.engine.subagent(agent_id="kid", permission=None)
        async for event in child.run("look"):
            ctx.emit(event)
        return "child done"

    hooks: list[str] = []
    model = ScriptedModel(
        [
            ScriptedResponse(
                tool_calls=[  # prompts are asked one at a time: the one left waiting comes last
                    ScriptedToolCall("task"),
                    ScriptedToolCall("work", {"name": "a"}),
                    ScriptedToolCall("work", {"name": "b"}),
                    ScriptedToolCall("work", {"name": "prompt"}),
                ]
            ),
            # the subagent's one response: its own call, which waits for the abort
            ScriptedResponse(tool_calls=[ScriptedToolCall("work", {"name": "child"})]),
        ]
    )
    engine = QueryEngine(
        model, tools=[work, task], policies=[], permission=ask, max_parallel_tools=10
    )
    engine.on_abort(hooks.append)
    task = asyncio.ensure_future(collect_events(engine.run("go")))
    async with asyncio.timeout(10):
        for w in waiting.values():
            await w.wait()
    assert engine.signal is not None
    assert not any(s.aborted for s in seen.values())
    engine.interrupt("escape")
    # At once: no await between the call and these reads.
    assert {name: s.reason for name, s in seen.items()} == dict.fromkeys(seen, "escape")
    assert engine.signal.reason == "escape"
    events = await task
    ends = [e for e in events if isinstance(e, TurnEnded)]
    # The child's (passed on untagged by this tool), then the run's own.
    assert [(e.reason, e.abort_reason) for e in ends] == [("aborted_tools", "escape")] * 2
    assert ends[-1].aborted_subagents == ("kid",)
    assert hooks == ["escape", "escape"]  # the child's copy of the hook, then the parent's
    results = {r.tool_use_id: r for m in engine.messages for r in m.tool_results}
    texts = sorted(str(r.content) for r in results.values())
    assert "stopped by escape" in texts and texts.count("stopped by escape") == 2
    assert any("prompt saw escape" in t for t in texts)
    assert engine.messages[-1].text == "[Request interrupted by user]"
    check_wire(engine.messages)


async def collect_events(run: AsyncIterator[Event]) -> list[Event]:
    return [event async for event in run]


# -- §5: an interjection in each phase is delivered once, at a safe point, cancelling nothing ------


class Waits:
    """Where the test holds the run: ``reached`` is set there, and it goes on at ``go``."""

    def __init__(self) -> None:
        self.reached = asyncio.Event()
        self.go = asyncio.Event()

    async def hold(self, signal: AbortSignal | None = None) -> None:
        """Wait for ``go``, or, given the call's ``signal``, for its abort too (a tool that honours
        it ends at once, leaving the grace unused: no race of the child's grace with its parent's)."""
        self.reached.set()
        if signal is None:
            await self.go.wait()
            return
        stopped = asyncio.Event()
        remove = signal.add_listener(lambda _reason: stopped.set())
        try:
            waits = [asyncio.ensure_future(self.go.wait()), asyncio.ensure_future(stopped.wait())]
            await asyncio.wait(waits, return_when=asyncio.FIRST_COMPLETED)
            for waiting in waits:
                waiting.cancel()
        finally:
            remove()


class HeldModel:
    """A scripted model whose first stream stops after its first event until ``waits.go``."""

    def __init__(self, inner: ScriptedModel, waits: Waits | None) -> None:
        self.inner = inner
        self.waits = waits

    @property
    def requests(self) -> list[ModelRequest]:
        return self.inner.requests

    async def stream(self, request: ModelRequest, signal: AbortSignal) -> AsyncIterator[StreamEvent]:
        waits, self.waits = self.waits, None
        first = True
        async for event in self.inner.stream(request, signal):
            yield event
            if first and waits is not None:
                first = False
                await waits.hold()


PHASES = ["streaming", "tool", "prompt", "subagent"]


def engine_held_in(phase: str, waits: Waits) -> QueryEngine:
    @tool(concurrency_safe=True)
    async def step(ctx: ToolContext) -> str:
        if ctx.engine.parent is not None or phase == "tool":
            await waits.hold(ctx.signal)
        return "step done"

    async def ask(use: ToolUseBlock, ctx: ToolContext) -> Allow:
        if phase == "prompt":
            await waits.hold()
        return Allow()

    if phase == "streaming":
        script: list[Any] = [ScriptedResponse(text="Working on it, nearly done.", chunk=4)]
    elif phase == "subagent":
        script = [
            ScriptedResponse(tool_calls=[ScriptedToolCall("task", {"task": "look"})]),
            ScriptedResponse(tool_calls=[ScriptedToolCall("step")]),  # the child's
            "child answer",
        ]
    else:
        script = [ScriptedResponse(text="Let me step.", tool_calls=[ScriptedToolCall("step")])]
    model = HeldModel(ScriptedModel([*script, "Final answer."], cycle=True), waits if phase == "streaming" else None)
    return QueryEngine(
        model,
        tools=[step, delegate_tool(tools=[step], max_turns=3)],
        policies=[],
        permission=ask if phase == "prompt" else None,
        max_turns=6,
    )


@pytest.mark.parametrize("phase", PHASES)
async def test_s5_an_interjection_in_any_phase_is_merged_once_at_a_safe_point_and_cancels_nothing(phase: str) -> None:
    waits = Waits()
    engine = engine_held_in(phase, waits)
    task = asyncio.ensure_future(collect_events(engine.run("go")))
    async with asyncio.timeout(10):
        await waits.reached.wait()
    signal = engine.signal
    assert signal is not None
    receipt = engine.interject("also check </user_query> the logs")
    assert not signal.aborted  # nothing is cancelled
    waits.go.set()
    async with asyncio.timeout(10):
        events = await task
    own = [e for e in events if e.agent_id is None]
    ends = [e for e in own if isinstance(e, TurnEnded)]
    assert [(e.reason, e.abort_reason) for e in ends] == [("completed", None)]
    injected = [e for e in own if isinstance(e, InterjectionInjected)]
    assert [e.ids for e in injected] == [(receipt,)]
    assert not [e for e in events if isinstance(e, InterjectionDropped)]
    # The calls ran to their real results; none was interrupted.
    assert all(not r.is_error for m in engine.messages for r in m.tool_results)
    wrapped = [m for m in engine.messages if m.kind == "interjection"]
    assert len(wrapped) == 1 and wrapped[0].meta["receipts"] == [receipt]
    body = wrapped[0].text
    assert body.startswith("The user sent a message while you were working:\n<user_query>\n")
    assert body.count("</user_query>") == 1 and "also check &lt;/user_query> the logs" in body
    at = engine.messages.index(wrapped[0])
    before = engine.messages[at - 1]
    # A safe point: after the committed response (no calls) or after the batch's results.
    assert (before.role == "assistant" and not before.tool_uses) or before.kind == "tool_results", before
    assert engine.messages[at + 1].role == "assistant"  # the model answered it, in the same run
    check_wire(engine.messages)


# -- §4: send_now in any phase stops the turn and starts the next one in the same run -------------


@pytest.mark.parametrize("phase", PHASES)
async def test_s4_send_now_in_any_phase_starts_its_text_in_the_same_run_without_a_notice(phase: str) -> None:
    waits = Waits()  # never let go: only the abort ends the wait
    engine = engine_held_in(phase, waits)
    task = asyncio.ensure_future(collect_events(engine.run("go")))
    async with asyncio.timeout(10):
        await waits.reached.wait()
    receipt = engine.send_now("stop, do this instead")
    async with asyncio.timeout(10):
        events = await task
    own = [e for e in events if e.agent_id is None]
    ends = [e for e in own if isinstance(e, TurnEnded)]
    cut = "aborted_streaming" if phase == "streaming" else "aborted_tools"
    assert [(e.reason, e.abort_reason) for e in ends] == [(cut, "send_now"), ("completed", None)]
    starts = [e for e in own if isinstance(e, TurnStarted)]
    assert len(starts) == 2
    if phase == "subagent":  # the child stopped with the parent's reason
        child_ends = [e for e in events if isinstance(e, TurnEnded) and e.agent_id is not None]
        assert [(e.reason, e.abort_reason) for e in child_ends] == [("aborted_tools", "send_now")]
    texts = [m.text for m in engine.messages if m.role == "user"]
    assert "[Request interrupted by user]" not in texts
    sent = [m for m in engine.messages if m.role == "user" and m.text == "stop, do this instead"]
    assert len(sent) == 1 and sent[0].meta.get("receipt") == receipt
    at = engine.messages.index(sent[0])
    assert engine.messages[at + 1].role == "assistant" and not engine.messages[at + 1].partial
    check_wire(engine.messages)


# -- §5: ordering and loss-freedom of queued texts ----------------------------------------------


@tool(concurrency_safe=True)
async def quick(n: int) -> str:
    """Returns at once."""
    return f"quick {n}"


@tool
async def alone(n: int) -> str:
    """Not concurrency-safe: a batch of its own."""
    return f"alone {n}"


_steps = st.lists(
    st.builds(
        lambda text, calls: ScriptedResponse(text=text, tool_calls=calls, chunk=3),
        st.sampled_from(["", "Working. ", "All done."]),
        st.lists(st.builds(lambda name, n: ScriptedToolCall(name, {"n": n}), st.sampled_from(["quick", "alone"]), st.integers(0, 9)), max_size=3),
    ),
    min_size=1,
    max_size=4,
)
_sends = st.lists(
    st.tuples(st.integers(1, 40), st.sampled_from(["interject", "interject_thread", "follow_up", "submit_steer"])),
    max_size=6,
)


@settings(max_examples=80)
@given(_steps, _sends)
def test_s5_queued_texts_are_delivered_once_each_in_the_order_sent(steps: list[ScriptedResponse], sends: list[tuple[int, str]]) -> None:
    async def main() -> None:
        engine = QueryEngine(
            ScriptedModel([*steps, "Final answer."], cycle=True),
            tools=[quick, alone],
            policies=[],
            max_parallel_tools=2,
            follow_up_behavior="steer",
        )
        order: list[tuple[str, str]] = []  # (receipt, kind) in the order sent
        count = 0
        async with asyncio.timeout(20):
            async for _event in engine.run("start"):
                count += 1
                for at, how in sends:
                    if at != count:
                        continue
                    text = f"{how} {len(order)}"
                    if how == "interject":
                        order.append((engine.interject(text), "int"))
                    elif how == "submit_steer":
                        order.append((engine.submit(text), "int"))
                    elif how == "follow_up":
                        order.append((engine.follow_up(text), "fup"))
                    else:
                        got: list[str] = []
                        thread = threading.Thread(target=lambda t=text, out=got: out.append(engine.interject(t)))
                        thread.start()
                        thread.join()
                        order.append((got[0], "int"))
            # What the run left queued (sent as its last turn ended) goes with the next run.
            if engine.inbox.interjections or engine.inbox.follow_ups:
                async for _event in engine.run():
                    pass
        delivered: list[str] = []
        for m in engine.messages:
            delivered += m.meta.get("receipts", []) if m.kind == "interjection" else []
            if m.meta.get("receipt") is not None:
                delivered.append(str(m.meta["receipt"]))
        sent = [r for r, _ in order]
        assert sorted(delivered) == sorted(sent), (delivered, sent)  # each once, none lost
        ints = [r for r, kind in order if kind == "int"]
        assert [r for r in delivered if r in ints] == ints  # interjections keep their order
        fups = [r for r, kind in order if kind == "fup"]
        assert [r for r in delivered if r in fups] == fups  # so do follow-ups
        check_wire(engine.messages)

    asyncio.run(main(), debug=True)


# -- §2: an abort while the host holds the event before a request starts no request -------------


class Counting:
    """Counts the streams opened and the ones whose first event was asked for."""

    def __init__(self, inner: ScriptedModel) -> None:
        self.inner = inner
        self.opened = 0

    async def stream(self, request: ModelRequest, signal: AbortSignal) -> AsyncIterator[StreamEvent]:
        self.opened += 1
        async for event in self.inner.stream(request, signal):
            yield event


@pytest.mark.parametrize("held", ["TurnStarted", "InterjectionInjected", "PolicyNudge"])
async def test_s2_an_abort_while_the_host_holds_the_event_before_a_request_sends_no_request(held: str) -> None:
    from agentloop.policies import Nudge, Policy

    class Nudger(Policy):
        def on_results(self, message: Message, results: Any) -> Any:
            return Nudge("try something else")

    model = Counting(ScriptedModel([ScriptedResponse(tool_calls=[ScriptedToolCall("quick", {"n": 1})]), "Final answer."]))
    engine = QueryEngine(model, tools=[quick], policies=[Nudger()] if held == "PolicyNudge" else [])
    if held == "InterjectionInjected":
        engine.interject("queued before the run")  # merged at the top of the first iteration
    opened: list[int] = []
    events: list[Event] = []
    async for event in engine.run("go"):
        events.append(event)
        if type(event).__name__ == held and not opened:
            opened.append(model.opened)
            engine.interrupt()
    assert opened, [type(e).__name__ for e in events]
    assert model.opened == opened[0]  # no request was started after the abort
    assert isinstance(events[-1], TurnEnded) and events[-1].abort_reason == "cancel"
    check_wire(engine.messages)


# -- §1/§2: control calls from inside the loop's own callbacks ---------------------------------


async def test_s2_a_call_whose_permission_comes_back_after_the_abort_never_starts() -> None:
    """The prompt's own code interrupts (the user pressed Esc in the dialog) and then answers
    Allow: the call must not start, since the run is aborted by then."""
    ran: list[int] = []

    @tool
    async def act(n: int) -> str:
        ran.append(n)
        return f"acted {n}"

    async def ask(use: ToolUseBlock, ctx: ToolContext) -> Allow:
        ctx.engine.interrupt("escape")  # never blocks, never raises, from inside the prompt
        return Allow()

    engine = QueryEngine(
        ScriptedModel([ScriptedResponse(tool_calls=[ScriptedToolCall("act", {"n": 1}), ScriptedToolCall("act", {"n": 2})])]),
        tools=[act],
        policies=[],
        permission=ask,
    )
    events = await collect_events(engine.run("go"))
    assert ran == []
    end = events[-1]
    assert isinstance(end, TurnEnded) and (end.reason, end.abort_reason) == ("aborted_tools", "escape")
    results = [r for m in engine.messages for r in m.tool_results]
    assert [r.is_error for r in results] == [True, True]
    assert all(str(r.content).startswith("Interrupted by user") for r in results)
    check_wire(engine.messages)


async def test_s1_s4_send_now_from_inside_a_tool_starts_its_text_in_the_same_run() -> None:
    @tool
    async def act(ctx: ToolContext) -> str:
        ctx.engine.send_now("new plan")
        return "acted"

    engine = QueryEngine(
        ScriptedModel([ScriptedResponse(tool_calls=[ScriptedToolCall("act"), ScriptedToolCall("act")]), "On the new plan."]),
        tools=[act],
        policies=[],
    )
    events = await collect_events(engine.run("go"))
    ends = [e for e in events if isinstance(e, TurnEnded)]
    assert [(e.reason, e.abort_reason) for e in ends] == [("aborted_tools", "send_now"), ("completed", None)]
    results = [r for m in engine.messages for r in m.tool_results]
    assert str(results[0].content) == "acted"  # finished: it keeps its real result
    assert results[1].is_error and str(results[1].content).startswith("Interrupted by user")  # the next batch never started
    assert [m.text for m in engine.messages if m.role == "user" and not m.synthetic] == ["go", "new plan"]
    check_wire(engine.messages)


async def test_s1_an_interrupt_from_inside_a_subagents_tool_stops_only_the_subagent() -> None:
    @tool
    async def act(ctx: ToolContext) -> str:
        if ctx.engine.parent is not None:
            ctx.engine.interrupt("child gives up")
            return "child act"
        return "parent act"

    model = ScriptedModel(
        [
            ScriptedResponse(tool_calls=[ScriptedToolCall("task", {"task": "try"})]),
            ScriptedResponse(tool_calls=[ScriptedToolCall("act")]),  # the child's
            ScriptedResponse(tool_calls=[ScriptedToolCall("act")]),  # the parent's, after the child
            "Parent done.",
        ]
    )
    engine = QueryEngine(model, tools=[act, delegate_tool(tools=[act])], policies=[])
    events = await collect_events(engine.run("go"))
    ends = [(e.agent_id, e.reason, e.abort_reason) for e in events if isinstance(e, TurnEnded)]
    assert ends == [("sub-1", "aborted_tools", "child gives up"), (None, "completed", None)]
    assert engine.messages[-1].text == "Parent done."
    check_wire(engine.messages)


# -- §1: run() always ends, whatever an abort hook does ---------------------------------------------


@pytest.mark.parametrize("where", ["turn_end", "consumer_closed"])
async def test_s1_an_async_abort_hook_that_never_returns_is_cancelled_after_the_grace_and_run_ends(
    where: str, caplog: pytest.LogCaptureFixture
) -> None:
    """Abort hooks are handed the abort like the rest of the run's code; one that hangs (a
    connection reset that never answers) is cancelled after ``tool_cancel_grace``, as a tool
    that ignores the signal is, so ``run()`` still ends; the other hooks still run."""
    hung = asyncio.Event()
    stopped: list[str] = []
    later: list[str] = []

    async def hook(reason: str) -> None:
        hung.set()
        try:
            await asyncio.Event().wait()
        except asyncio.CancelledError:
            stopped.append(reason)
            raise

    engine = QueryEngine(
        ScriptedModel([ScriptedResponse(text="Hello there, this is long", chunk=2)]), policies=[], tool_cancel_grace=0.05
    )
    engine.on_abort(hook)
    engine.on_abort(later.append)
    events: list[Event] = []

    async def host() -> None:
        run = engine.run("go")
        async for event in run:
            events.append(event)
            if isinstance(event, TextDelta):
                if where == "turn_end":
                    engine.interrupt("escape")
                else:
                    await run.aclose()  # the run is settled as consumer_closed: the hooks run then
                    return

    async with asyncio.timeout(5):
        await host()
    reason = "escape" if where == "turn_end" else "consumer_closed"
    assert hung.is_set() and stopped == [reason] and later == [reason]
    if where == "turn_end":
        end = events[-1]
        assert isinstance(end, TurnEnded) and end.abort_reason == "escape"
    assert not engine.running
    assert "did not finish" in caplog.text
    check_wire(engine.messages)


class StuckClose:
    """A model whose stream, once closed, waits forever in its cleanup (a client's close that
    never finishes on a dead connection). Its events come without a wait, so an abort stops the
    stream by closing it, not by cancelling a read."""

    def __init__(self) -> None:
        self.cleanup_cancelled = False

    async def stream(self, request: ModelRequest, signal: AbortSignal) -> AsyncIterator[StreamEvent]:
        from agentloop._model import StreamText

        try:
            yield StreamText(0, "Hello ")
            yield StreamText(0, "world, and more")
            for _ in range(100):
                yield StreamText(0, ".")
        finally:
            try:
                await asyncio.Event().wait()
            except asyncio.CancelledError:
                self.cleanup_cancelled = True
                raise


async def test_s1_a_model_stream_whose_close_never_finishes_is_cancelled_after_the_grace_and_run_ends(
    caplog: pytest.LogCaptureFixture,
) -> None:
    model = StuckClose()
    engine = QueryEngine(model, policies=[], tool_cancel_grace=0.05)
    events: list[Event] = []

    async def host() -> None:
        async for event in engine.run("go"):
            events.append(event)
            if isinstance(event, TextDelta) and event.text == "world, and more":
                engine.interrupt("escape")

    async with asyncio.timeout(5):
        await host()
    end = events[-1]
    assert isinstance(end, TurnEnded) and (end.reason, end.abort_reason) == ("aborted_streaming", "escape")
    assert model.cleanup_cancelled
    partial = engine.messages[1]
    assert partial.partial and partial.text.startswith("Hello world, and more")  # the streamed text is kept
    assert "did not close within" in caplog.text
    check_wire(engine.messages)


class StuckCleanup:
    """A model whose stream waits for its next event (an abort cancels that read), and whose
    cleanup then waits forever: it absorbs the one cancellation the abort makes."""

    async def stream(self, request: ModelRequest, signal: AbortSignal) -> AsyncIterator[StreamEvent]:
        from agentloop._model import StreamText

        try:
            yield StreamText(0, "Hello ")
            yield StreamText(0, "world")
            await asyncio.Event().wait()
        finally:
            await asyncio.Event().wait()


async def test_s1_a_model_stream_that_hangs_in_its_cleanup_after_the_abort_is_cancelled_again_after_the_grace() -> None:
    engine = QueryEngine(StuckCleanup(), policies=[], tool_cancel_grace=0.05)
    events: list[Event] = []

    async def host() -> None:
        async for event in engine.run("go"):
            events.append(event)
            if isinstance(event, TextDelta) and event.text == "world":
                engine.interrupt("escape")  # the read of the next event waits: the abort cancels it

    async with asyncio.timeout(5):
        await host()
    end = events[-1]
    assert isinstance(end, TurnEnded) and (end.reason, end.abort_reason) == ("aborted_streaming", "escape")
    assert engine.messages[1].partial and engine.messages[1].text == "Hello world"
    check_wire(engine.messages)
