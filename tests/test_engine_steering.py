"""SPEC §5, §8, §10, §11 and the consumer contract: steering, limits, terminals, bad input."""

from __future__ import annotations

import asyncio
import re
from collections.abc import AsyncGenerator
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from agentloop import (
    AbortError,
    AssistantMessage,
    AttemptDiscarded,
    InterjectionDropped,
    InterjectionInjected,
    Message,
    ModelError,
    PromptTooLongError,
    QueryEngine,
    Retrying,
    ScriptedModel,
    ScriptedResponse,
    ScriptedToolCall,
    TextDelta,
    ToolCallStarted,
    ToolContext,
    ToolInputError,
    TurnEnded,
    TurnStarted,
    tool,
    validate_transcript,
)
from agentloop._inbox import Texts, envelope, escape_envelope
from agentloop._model import StreamBlockStop, StreamEnd, StreamText, StreamToolInput, StreamToolUseStart
from tests.helpers import HangingModel, collect, kinds


def engine_for(responses: list[object], **kw: object) -> QueryEngine:
    kw.setdefault("policies", [])
    kw.setdefault("retry_base_delay", 0.001)
    return QueryEngine(ScriptedModel(responses), **kw)  # type: ignore[arg-type]


def calls(*names: str) -> ScriptedResponse:
    return ScriptedResponse(tool_calls=[ScriptedToolCall(n, {}) for n in names])


# -- §5 interjections ------------------------------------------------------------------


async def test_interjection_safe_point_top_of_iteration() -> None:
    @tool
    async def t(ctx: ToolContext) -> str:
        receipts.append(ctx.engine.interject("also mind the tests"))
        return "tool done"

    receipts: list[str] = []
    engine = engine_for([calls("t"), "ok"], tools=[t])
    events = await collect(engine, "go")
    injected = [e for e in events if isinstance(e, InterjectionInjected)]
    assert injected[0].ids == tuple(receipts)
    model = engine.model
    assert isinstance(model, ScriptedModel)
    assert "also mind the tests" in model.requests[1].messages[-1].text
    assert model.requests[1].messages[-1].kind == "interjection"


async def test_interjections_merged_into_one_message_keep_every_receipt() -> None:
    receipts: list[str] = []

    @tool
    async def t(ctx: ToolContext) -> str:
        receipts.extend(ctx.engine.interject(text) for text in ("mind the tests", "and the docs"))
        return "tool done"

    engine = engine_for([calls("t"), "ok"], tools=[t])
    events = await collect(engine, "go")
    (injected,) = [e for e in events if isinstance(e, InterjectionInjected)]
    assert (injected.ids, injected.texts) == (tuple(receipts), ("mind the tests", "and the docs"))
    (merged,) = [m for m in engine.messages if m.kind == "interjection"]
    assert merged.meta == {"receipts": receipts}  # what a resumed session tells delivered texts by


@pytest.mark.parametrize("prompt", ["str", "message", "none"])
async def test_an_interjection_sent_while_idle_starts_the_next_run_as_the_users_own_words(prompt: str) -> None:
    """An interjection sent while no run was going reached the next run after its prompt, wrapped
    as "The user sent a message while you were working:" when nothing was running. It now starts
    the run as the user's own message, before the prompt and in the order sent (a send-now text
    sent while idle among them); its receipt is in TurnStarted.ids and in the InterjectionInjected
    that follows."""
    engine = engine_for(["ok"])
    first = engine.interject("also mind the tests")
    sent = engine.send_now("and be brief")
    last = engine.interject("one more thing")
    given: str | Message | None = {"str": "go", "message": Message.user("go"), "none": None}[prompt]
    events = await collect(engine, given)
    started = [e for e in events if isinstance(e, TurnStarted)]
    injected = [e for e in events if isinstance(e, InterjectionInjected)]
    assert [type(e) for e in events[:2]] == [TurnStarted, InterjectionInjected]
    assert started[0].ids == (first, sent, last)
    assert [(e.ids, e.texts) for e in injected] == [((first, last), ("also mind the tests", "one more thing"))]
    texts = ["also mind the tests", "and be brief", "one more thing"] + (["go"] if given is not None else [])
    model = engine.model
    assert isinstance(model, ScriptedModel)
    sent_messages = model.requests[0].messages
    assert [m.text for m in sent_messages] == texts
    assert all(m.role == "user" and not m.synthetic and m.kind is None for m in sent_messages)
    assert "while you were working" not in "".join(m.text for m in sent_messages)
    assert [m.meta for m in sent_messages[:3]] == [{"receipts": [first]}, {"receipt": sent}, {"receipts": [last]}]
    assert started[0].prompt is not None and started[0].prompt.text == texts[-1]
    assert not engine.inbox.interjections and validate_transcript(engine.messages) == []


async def test_an_interjection_sent_after_run_was_called_follows_its_prompt() -> None:
    """run(prompt) was called, its first step not taken yet: the prompt came first, so an
    interjection sent now follows it, as one sent while the model works."""
    engine = engine_for(["ok"])
    run = engine.run("go")
    receipt = engine.interject("also this")
    events = [ev async for ev in run]
    assert [e.ids for e in events if isinstance(e, InterjectionInjected)] == [(receipt,)]
    assert [(m.kind, m.text.startswith("The user sent")) for m in engine.messages[:2]] == [(None, False), ("interjection", True)]


async def test_an_idle_interjection_receipt_is_recorded_in_the_session(tmp_path: Any) -> None:
    from agentloop.sessions import JsonlSession

    path = tmp_path / "s.jsonl"
    with JsonlSession(path) as session:
        engine = engine_for(["ok"], session=session)
        receipt = engine.interject("also mind the tests")
        await collect(engine, "go")
    events = JsonlSession(path).load().events
    assert [e["ids"] for e in events if e["type"] == "interjection_injected"] == [[receipt]]


async def test_an_interjection_left_by_a_stopped_run_keeps_its_envelope_ahead_of_the_next_prompt() -> None:
    """Sent while the model was working, then left queued by a run the host stopped: the next run
    still delivers it as sent while working, before the new prompt it came before, and an idle
    one after it, in the order sent."""
    engine = engine_for([ScriptedResponse(text="abcdefgh", chunk=2), "ok"])
    working = ""
    run = engine.run("go")
    async for ev in run:
        if isinstance(ev, TextDelta):
            working = engine.interject("while working")
            break
    await run.aclose()
    idle = engine.interject("while idle")
    events = await collect(engine, "next")
    assert [e.ids for e in events if isinstance(e, InterjectionInjected)] == [(working, idle)]
    assert [e.ids for e in events if isinstance(e, TurnStarted)] == [(working, idle)]
    model = engine.model
    assert isinstance(model, ScriptedModel)
    tail = model.requests[-1].messages[-3:]
    assert tail[0].kind == "interjection" and tail[0].text.startswith("The user sent a message while you were working:")
    assert "<user_query>\nwhile working\n</user_query>" in tail[0].text
    assert [(m.kind, m.text) for m in tail[1:]] == [(None, "while idle"), (None, "next")]
    assert validate_transcript(engine.messages) == []


async def test_interjection_safe_point_after_a_tool_batch_cancels_nothing() -> None:
    @tool
    async def t(ctx: ToolContext) -> str:
        ctx.engine.interject("steer: use v2")
        return "tool done"

    engine = engine_for([calls("t"), "ok"], tools=[t])
    events = await collect(engine, "go")
    assert isinstance(events[-1], TurnEnded) and events[-1].reason == "completed"
    roles = [(m.role, m.kind) for m in engine.messages]
    assert roles[2:4] == [("user", "tool_results"), ("user", "interjection")]
    assert engine.messages[2].tool_results[0].text == "tool done"
    assert validate_transcript(engine.messages) == []


async def test_interjection_past_a_safe_point_survives_a_host_that_stops_in_a_later_batch() -> None:
    """Drained after the first batch, merged only after the last: if the host stops iterating
    in between, the interjection goes back to the queue and the next run delivers it."""
    @tool(concurrency_safe=True)
    async def a() -> str:
        return "a done"

    @tool  # not concurrency-safe: a batch of its own
    async def b(ctx: ToolContext) -> str:
        await ctx.signal.wait()
        return "b stopped"

    engine = engine_for([calls("a", "b"), "resumed"], tools=[a, b])
    events = engine.run("go")
    receipt, stopped = "", False
    async for ev in events:
        if isinstance(ev, AssistantMessage):
            receipt = engine.interject("also check the logs")
        if isinstance(ev, ToolCallStarted) and ev.tool_use.name == "b":
            stopped = True
            break
    await events.aclose()
    assert stopped
    assert [q.id for q in engine.inbox.interjections] == [receipt]
    again = await collect(engine)
    injected = [e for e in again if isinstance(e, InterjectionInjected)]
    assert [e.ids for e in injected] == [(receipt,)]
    assert validate_transcript(engine.messages) == []


async def test_interjection_safe_point_before_turn_end_keeps_the_turn_going() -> None:
    engine = engine_for(["first answer", "second answer"])
    async for ev in engine.run("go"):
        if isinstance(ev, AssistantMessage) and ev.message.text == "first answer":
            engine.interject("one more thing")
    assert [m.text for m in engine.messages if m.role == "assistant"] == ["first answer", "second answer"]
    assert engine.last_turn_ended.reason == "completed"  # type: ignore[union-attr]



async def test_an_interjection_that_lands_as_a_completed_turn_ends_gets_a_turn_not_a_drop(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """From another thread, interject() after the loop checked the queue for the last response
    but before the turn's end: the completed turn reported it dropped (``reason="completed"``),
    though the same text a moment later (after the TurnEnded) got a turn of its own."""
    import agentloop._ending as loop_module

    engine = engine_for(["first", "second"])
    receipts: list[str] = []
    strip_final = loop_module.strip_final

    def interject_then_strip(target: QueryEngine) -> None:
        if not receipts:
            receipts.append(target.interject("one more thing"))  # what a UI thread does at this instant
        strip_final(target)

    monkeypatch.setattr(loop_module, "strip_final", interject_then_strip)
    events = await collect(engine, "go")
    assert not [e for e in events if isinstance(e, InterjectionDropped)]
    assert [e.ids for e in events if isinstance(e, InterjectionInjected)] == [tuple(receipts)]
    assert [e.reason for e in events if isinstance(e, TurnEnded)] == ["completed", "completed"]
    assert [m.kind for m in engine.messages] == [None, None, "interjection", None]
    assert engine.messages[-1].text == "second" and validate_transcript(engine.messages) == []


@pytest.mark.parametrize("how", ["submit_steer", "interject"])
async def test_a_message_steered_in_while_the_host_holds_the_last_turnended_gets_its_turn(how: str) -> None:
    """A message steered in while the host handled the final TurnEnded (the run still going)
    was neither delivered nor reported dropped: the run ended and left it queued, so the user got
    no reply until they typed again. After a completed turn it now gets a turn of its own, as a
    follow-up does; after an interrupted one it waits for the next run, as a follow-up does."""
    engine = engine_for(["first", "second"], follow_up_behavior="steer")
    receipts = []
    events = []
    async for ev in engine.run("go"):
        events.append(ev)
        if isinstance(ev, TurnEnded) and not receipts:
            receipts.append(engine.submit("and also this") if how == "submit_steer" else engine.interject("and also this"))
    injected = [e for e in events if isinstance(e, InterjectionInjected)]
    assert [e.ids for e in injected] == [tuple(receipts)]
    assert [e.reason for e in events if isinstance(e, TurnEnded)] == ["completed", "completed"]
    assert [e.prompt for e in events if isinstance(e, TurnStarted)][1] is None
    assert [m.kind for m in engine.messages] == [None, None, "interjection", None]
    assert engine.messages[-1].text == "second" and not engine.inbox.interjections

    engine = engine_for([ScriptedResponse(text="abcdefgh", chunk=2), "later"], follow_up_behavior="steer")
    receipt = None
    async for ev in engine.run("go"):
        if isinstance(ev, TextDelta) and not engine.signal.aborted:  # type: ignore[union-attr]
            engine.interrupt()
        if isinstance(ev, TurnEnded):
            receipt = engine.interject("after the stop")
    assert engine.last_turn_ended.reason == "aborted_streaming"  # type: ignore[union-attr]
    assert [q.id for q in engine.inbox.interjections] == [receipt]  # the user said stop: kept for later


async def test_interjection_envelope_text_and_reminder() -> None:
    engine = engine_for(["first", "ok"])
    async for ev in engine.run("go"):
        if isinstance(ev, AssistantMessage) and ev.message.text == "first":
            engine.interject("hello")
    body = next(m for m in engine.messages if m.kind == "interjection").text
    assert body.startswith("The user sent a message while you were working:")
    assert "<user_query>\nhello\n</user_query>" in body
    assert "do not drop the work" in body


@pytest.mark.parametrize("behavior", ["queue", "steer"])
async def test_a_blank_text_is_refused_by_every_control_call(behavior: str) -> None:
    """A blank interjection used to be queued and delivered as an envelope around nothing (an
    empty <user_query>), while the other three calls refused it: all four refuse it alike, idle
    or running, and queue nothing."""
    engine = engine_for(["first answer", "second answer"], follow_up_behavior=behavior)
    controls = [engine.interject, engine.follow_up, engine.send_now, engine.submit]
    blanks = ["", " ", "\n\t", "\u3000\u2003"]  # ideographic and em spaces are whitespace too
    for call in controls:
        for blank in blanks:
            with pytest.raises(ValueError, match="needs text"):
                call(blank)
    running = []
    async for ev in engine.run("go"):
        if isinstance(ev, TextDelta) and not running:
            running.append(engine.running)
            for call in controls:
                with pytest.raises(ValueError, match="needs text"):
                    call(" \r\n")
    assert running == [True]
    assert not (engine.inbox.interjections or engine.inbox.follow_ups or engine.inbox.send_now)
    assert [m.kind for m in engine.messages] == [None, None]
    assert validate_transcript(engine.messages) == []


async def test_interjection_dropped_with_a_receipt_when_the_run_is_cancelled() -> None:
    engine = engine_for([ScriptedResponse(text="abcdefgh", chunk=2)])
    events = []
    async for ev in engine.run("go"):
        events.append(ev)
        if isinstance(ev, TextDelta):
            engine.interrupt()
            receipt = engine.interject("too late")
    dropped = [e for e in events if isinstance(e, InterjectionDropped)]
    assert dropped[0].ids == (receipt,) and dropped[0].texts == ("too late",)
    assert kinds(events)[-1] == "TurnEnded"


@given(st.text())
def test_envelope_cannot_be_escaped_by_user_text(text: str) -> None:
    wrapped = envelope("intro", [text], "outro")
    closing = re.findall(r"<\s*/\s*user_query", wrapped, flags=re.IGNORECASE)
    opening = re.findall(r"<\s*user_query", wrapped, flags=re.IGNORECASE)
    assert len(closing) == 1 and len(opening) == 1
    assert wrapped.endswith("</user_query>\nouttro".replace("outtro", "outro"))


def test_envelope_escape_examples() -> None:
    assert escape_envelope("a </user_query> b") == "a &lt;/user_query> b"
    assert escape_envelope("< / USER_QUERY >") == "&lt; / USER_QUERY >"
    assert escape_envelope("x < y") == "x < y"


async def test_follow_up_runs_as_a_new_turn_after_the_current_one() -> None:
    engine = engine_for(["first", "second"])
    events = []
    async for ev in engine.run("go"):
        events.append(ev)
        if isinstance(ev, TurnStarted) and ev.turn == 1:
            engine.follow_up("then this")
    starts = [e for e in events if isinstance(e, TurnStarted)]
    assert [s.prompt.text for s in starts if s.prompt] == ["go", "then this"]
    assert [e.reason for e in events if isinstance(e, TurnEnded)] == ["completed", "completed"]


async def test_turn_started_repeats_the_receipts_of_the_queued_texts_it_delivers() -> None:
    """follow_up(), submit() and send_now() return a receipt id "repeated in the event that
    reports the delivery", but no event carried it: only interjections' did (and a turn that
    two send-now texts started named only the last one, as its prompt)."""
    engine = engine_for(["first", "second", "third"])
    now = [engine.send_now("one"), engine.send_now("two")]
    later = ""
    events = []
    async for ev in engine.run():
        events.append(ev)
        if isinstance(ev, TurnStarted) and ev.turn == 1:
            later = engine.follow_up("three")
    starts = [e for e in events if isinstance(e, TurnStarted)]
    assert [s.ids for s in starts] == [tuple(now), (later,)]
    host = Message.user("mine", meta={"receipt": "not one of ours"})
    events = await collect(engine, host)
    assert [e.ids for e in events if isinstance(e, TurnStarted)] == [()]
async def test_follow_up_waits_after_a_cancel() -> None:
    engine = engine_for([ScriptedResponse(text="abcdefgh", chunk=2), "later"])
    async for ev in engine.run("go"):
        if isinstance(ev, TextDelta):
            engine.follow_up("queued")
            engine.interrupt()
    assert not any(m.text == "queued" for m in engine.messages)
    events = await collect(engine)  # the queued follow-up starts the next run
    assert events[0].prompt.text == "queued"  # type: ignore[union-attr]


@pytest.mark.parametrize("at", [AssistantMessage, TurnEnded])
async def test_an_interrupt_while_the_host_holds_a_turns_last_events_stops_its_follow_ups(at: type) -> None:
    """The run is still going (engine.running) while the host handles the final answer or the
    turn's TurnEnded: a Ctrl-C then means "stop", so the queued follow-up does not start."""
    engine = engine_for(["first", "second"])
    receipt = engine.follow_up("then this")
    events = []
    async for ev in engine.run("go"):
        events.append(ev)
        if isinstance(ev, at) and len(events) < 5:
            assert engine.running
            engine.interrupt()
    assert [e.reason for e in events if isinstance(e, TurnEnded)] == ["completed"]
    assert [m.text for m in engine.messages] == ["go", "first"]
    assert [q.id for q in engine.inbox.follow_ups] == [receipt]  # waits for the next run
    events = await collect(engine)
    assert events[0].prompt.text == "then this"  # type: ignore[union-attr]
    assert engine.messages[-1].text == "second"


async def test_send_now_while_the_host_holds_turn_ended_starts_a_turn_in_the_same_run() -> None:
    engine = engine_for(["first", "second"])
    events = []
    async for ev in engine.run("go"):
        events.append(ev)
        if isinstance(ev, TurnEnded) and not engine.inbox.send_now and len(events) < 5:
            engine.send_now("and this")
    assert [s.prompt.text for s in events if isinstance(s, TurnStarted) and s.prompt] == ["go", "and this"]
    assert engine.messages[-1].text == "second" and not engine.inbox.send_now


async def test_no_turn_starts_after_the_run_deadline_even_for_send_now() -> None:
    """The deadline counts from run(): a send-now that races it waits for the next run instead of
    starting a turn with no deadline at all."""
    engine = engine_for(["never streamed"], deadline=0.0)
    events = []
    async for ev in engine.run("go"):
        events.append(ev)
        if isinstance(ev, TurnStarted) and ev.turn == 1:
            signal = engine.signal
            assert signal is not None
            await signal.wait()  # the deadline passes while the host handles the event
            receipt = engine.send_now("instead")
    assert [(e.reason, e.abort_reason) for e in events if isinstance(e, TurnEnded)] == [("deadline", "deadline")]
    assert [q.id for q in engine.inbox.send_now] == [receipt]
    assert validate_transcript(engine.messages) == []


async def test_submit_queues_or_steers_by_follow_up_behavior() -> None:
    steer = engine_for(["a", "b"], follow_up_behavior="steer")
    async for ev in steer.run("go"):
        if isinstance(ev, TurnStarted):
            assert steer.submit("steered").startswith("int-")
    queue = engine_for(["a", "b"])
    async for ev in queue.run("go"):
        if isinstance(ev, TurnStarted) and ev.turn == 1:
            assert queue.submit("queued").startswith("fup-")
    assert any(m.kind == "interjection" for m in steer.messages)
    assert any(m.text == "queued" and not m.synthetic for m in queue.messages)


# -- §8 limits -----------------------------------------------------------------------------


async def test_max_turns_ends_with_its_terminal_and_a_valid_transcript() -> None:
    @tool
    async def t() -> str:
        return "again"

    engine = engine_for([calls("t")] * 5, tools=[t], max_turns=2)
    events = await collect(engine, "go")
    end = events[-1]
    assert isinstance(end, TurnEnded) and end.reason == "max_turns" and end.turns == 2
    assert validate_transcript(engine.messages) == []


async def test_usage_limit_ends_with_its_terminal() -> None:
    @tool
    async def t() -> str:
        return "x"

    engine = engine_for([calls("t")] * 5, tools=[t], usage_limit=30)
    events = await collect(engine, "go")
    assert events[-1].reason == "usage_limit"  # type: ignore[union-attr]
    assert validate_transcript(engine.messages) == []



@pytest.mark.parametrize("limit", ["max_turns", "usage_limit"])
@pytest.mark.parametrize("sent", ["with_the_answer", "from_a_tool"])
async def test_an_interjection_the_turns_limit_leaves_unanswered_is_reported_dropped(limit: str, sent: str) -> None:
    """A queued interjection was merged at the top of the iteration (or after the tool batch)
    and reported ``InterjectionInjected``, then the limit ended the turn before any request: the
    model never saw it, though the host was told it was delivered. It is now not merged, and the
    turn's end reports it dropped, with the limit as the reason."""
    receipts: list[str] = []

    @tool
    async def t(ctx: ToolContext) -> str:
        receipts.append(ctx.engine.interject("also mind the tests"))
        return "done"

    bound = {"max_turns": 1} if limit == "max_turns" else {"usage_limit": 20}  # one response: 20 tokens
    first = calls("t") if sent == "from_a_tool" else "first answer"
    engine = engine_for([first, "never asked"], tools=[t], **bound)
    events = []
    async for ev in engine.run("go"):
        events.append(ev)
        if isinstance(ev, AssistantMessage) and sent == "with_the_answer":
            receipts.append(engine.interject("also mind the tests"))
    assert not [e for e in events if isinstance(e, InterjectionInjected)]
    dropped = [e for e in events if isinstance(e, InterjectionDropped)]
    assert [(e.ids, e.reason) for e in dropped] == [(tuple(receipts), limit)]
    assert [(e.reason, e.turns) for e in events if isinstance(e, TurnEnded)] == [(limit, 1)]
    assert not [m for m in engine.messages if m.kind == "interjection"] and not engine.inbox.interjections
    assert validate_transcript(engine.messages) == []


async def test_usage_limit_is_not_overrun_by_transport_retries() -> None:
    """A retryable failure after the request's prompt was counted (Anthropic reports the input
    tokens at the stream's start; an ``overloaded_error`` can come after) was retried whatever the
    run had used: with ``usage_limit=60_000`` and a 50,000-token prompt, six requests went out and
    300,000 tokens were spent, and the turn ended with ``model_error``. A retry is a model request:
    once the limit is reached, none is made."""
    from agentloop.models import StreamText, StreamUsage, Usage

    class Overloaded:
        requests = 0

        async def stream(self, request: object, signal: object) -> AsyncGenerator[object, None]:
            self.requests += 1
            yield StreamUsage(Usage(input_tokens=50_000, output_tokens=0))
            yield StreamText(0, "Let me ")
            raise ModelError("overloaded", retryable=True)

    model = Overloaded()
    engine = QueryEngine(model, policies=[], usage_limit=60_000, retry_budget=5, retry_base_delay=0)  # type: ignore[arg-type]
    events = await collect(engine, "go")
    end = events[-1]
    assert model.requests == 2  # the second one reached the limit
    assert isinstance(end, TurnEnded) and end.reason == "usage_limit" and end.usage.total == 100_000
    assert "overloaded" in (end.error or "") and "usage_limit" in (end.error or "")
    assert end.detail == "the run's usage_limit of 60000 tokens is reached"
    assert (end.error or "").endswith(f"(not retried: {end.detail})")
    assert [e.attempt for e in events if isinstance(e, Retrying)] == [1]
    assert engine.messages[-1].partial and engine.messages[-1].text == "Let me"  # as a failure that is not retried
    assert validate_transcript(engine.messages) == []


async def test_deadline_ends_with_its_terminal_and_no_notice() -> None:
    engine = QueryEngine(HangingModel(), policies=[], deadline=0.05)
    events = await collect(engine, "go")
    end = events[-1]
    assert isinstance(end, TurnEnded) and end.reason == "deadline" and end.abort_reason == "deadline"
    assert not any(m.kind == "interrupt_notice" for m in engine.messages)
    assert validate_transcript(engine.messages) == []


# -- §10/§11 errors and retries --------------------------------------------------------------


async def test_model_error_ends_with_model_error_and_keeps_partial_output() -> None:
    engine = engine_for([ScriptedResponse(text="partial words", chunk=4, error=ModelError("bad gateway"), error_after=2)])
    events = await collect(engine, "go")
    end = events[-1]
    assert isinstance(end, TurnEnded) and end.reason == "model_error" and "bad gateway" in (end.error or "")
    assert engine.messages[-1].partial and engine.messages[-1].text == "partial"  # final: stripped
    assert validate_transcript(engine.messages) == []


async def test_prompt_too_long_has_its_own_terminal() -> None:
    err = PromptTooLongError("prompt is too long", provider="anthropic", status=400)
    events = await collect(engine_for([ScriptedResponse(error=err)]), "go")
    assert events[-1].reason == "prompt_too_long"  # type: ignore[union-attr]


async def test_retry_discards_partial_output_so_nothing_is_duplicated() -> None:
    flaky = ScriptedResponse(text="Hello there", chunk=3, error=ModelError("overloaded", retryable=True), error_after=2)
    engine = engine_for([flaky, ScriptedResponse(text="Hello there", chunk=3)])
    events = await collect(engine, "go")
    names = kinds(events)
    assert names.index("AttemptDiscarded") < names.index("Retrying")
    discarded = next(e for e in events if isinstance(e, AttemptDiscarded))
    assert discarded.text_chars == 6 and discarded.reason == "retry"
    assert [m.text for m in engine.messages if m.role == "assistant"] == ["Hello there"]


async def test_retry_budget_is_spent_then_model_error() -> None:
    fail = ScriptedResponse(error=ModelError("503", retryable=True, retry_after=0.0))
    engine = engine_for([fail] * 4, retry_budget=3)
    events = await collect(engine, "go")
    assert [e.attempt for e in events if isinstance(e, Retrying)] == [1, 2, 3]
    assert events[-1].reason == "model_error"  # type: ignore[union-attr]


async def test_retry_backoff_sleep_is_cut_by_an_abort() -> None:
    fail = ScriptedResponse(error=ModelError("429", retryable=True, retry_after=30.0))
    engine = engine_for([fail, "never"])
    events = []
    async for ev in engine.run("go"):
        events.append(ev)
        if isinstance(ev, Retrying):
            assert ev.delay == 30.0
            asyncio.get_running_loop().call_soon(engine.interrupt)
    assert events[-1].reason == "aborted_streaming"  # type: ignore[union-attr]


async def test_stream_without_end_event_is_an_error_never_a_silent_success() -> None:
    events = [StreamToolUseStart(0, "t1", "t"), StreamToolInput(0, "{}"), StreamBlockStop(0)]
    engine = engine_for([ScriptedResponse(events=events)] * 4, retry_budget=0)
    out = await collect(engine, "go")
    assert out[-1].reason == "model_error" and "without its end event" in (out[-1].error or "")  # type: ignore[union-attr]


async def test_bad_tool_input_unknown_tool_raising_tool_and_timeout_become_error_results() -> None:
    @tool
    async def boom() -> str:
        raise ValueError("disk on fire")

    @tool(timeout=0.01)
    async def slow() -> str:
        await asyncio.Event().wait()
        return "never"

    bad_json = [
        StreamToolUseStart(0, "j1", "boom"),
        StreamToolInput(0, '{"oops": '),
        StreamBlockStop(0),
        StreamToolUseStart(1, "j2", "nope"),
        StreamBlockStop(1),
        StreamToolUseStart(2, "j3", "boom"),
        StreamBlockStop(2),
        StreamToolUseStart(3, "j4", "slow"),
        StreamBlockStop(3),
        StreamToolUseStart(4, "j5", "boom"),
        StreamToolInput(4, '{"unexpected": 1}'),
        StreamBlockStop(4),
        StreamEnd(stop_reason="tool_use"),
    ]
    engine = engine_for([ScriptedResponse(events=bad_json), "recovered"], tools=[boom, slow])
    events = await collect(engine, "go")
    texts = [b.text for m in engine.messages for b in m.tool_results]
    assert "not valid JSON" in texts[0]
    assert texts[1].startswith("Unknown tool 'nope'") and "boom" in texts[1]
    assert texts[2] == "Tool 'boom' raised ValueError: disk on fire"
    assert "timed out after 0.01 s" in texts[3]
    assert "unexpected" in texts[4] and "invalid tool input" in texts[4]
    assert all(b.is_error for m in engine.messages for b in m.tool_results)
    assert isinstance(events[-1], TurnEnded) and events[-1].reason == "completed"


async def test_every_other_tool_failure_becomes_an_error_result_that_says_what_happened() -> None:
    class Unprintable:
        def __str__(self) -> str:
            raise RuntimeError("no text for you")

    @tool
    async def own_timeout() -> str:
        raise TimeoutError

    @tool
    async def stray_abort() -> str:
        raise AbortError("mine")

    @tool
    async def bad_args() -> str:
        raise ToolInputError("path must be relative")

    @tool
    async def weird() -> object:
        return Unprintable()

    calls = [ScriptedToolCall(name, {}) for name in ("own_timeout", "stray_abort", "bad_args", "weird")]
    engine = engine_for([ScriptedResponse(tool_calls=calls), "recovered"], tools=[own_timeout, stray_abort, bad_args, weird])
    events = await collect(engine, "go")
    texts = [b.text for m in engine.messages for b in m.tool_results]
    assert texts == [
        "Tool 'own_timeout' raised TimeoutError.",
        "Tool 'stray_abort' raised AbortError although the run was not aborted.",
        "Tool 'bad_args' was not run: path must be relative",
        "Tool 'weird' returned an unusable result: no text for you",
    ]
    assert all(b.is_error for m in engine.messages for b in m.tool_results)
    assert isinstance(events[-1], TurnEnded) and events[-1].reason == "completed"

async def test_tool_calls_without_an_id_or_with_a_repeated_one_get_fresh_ids() -> None:
    """Some OpenAI-compatible servers number their calls afresh in every response ("call_0"),
    or send no id: the transcript would repeat ids, which providers reject, and results are paired
    by id. Such a call gets a fresh id before it is committed."""

    @tool(concurrency_safe=True)
    async def t(n: int) -> str:
        return f"ran {n}"

    def response(*ids: str) -> ScriptedResponse:
        events: list[Any] = []
        for i, tid in enumerate(ids):
            events += [StreamToolUseStart(i, tid, "t"), StreamToolInput(i, f'{{"n": {i}}}'), StreamBlockStop(i)]
        return ScriptedResponse(events=[*events, StreamEnd("tool_use")])

    first = response("call_0", "call_0", "")
    engine = engine_for([lambda _request: first, response("call_0"), "done"], tools=[t])  # played as is
    await collect(engine, "go")
    ids = [b.id for m in engine.messages for b in m.tool_uses]
    assert ids == ["call_0", "call_0_1", "toolu_1", "call_0_2"]
    assert [(r.tool_use_id, r.text) for m in engine.messages for r in m.tool_results] == [
        ("call_0", "ran 0"), ("call_0_1", "ran 1"), ("toolu_1", "ran 2"), ("call_0_2", "ran 0")
    ]
    assert validate_transcript(engine.messages) == []


@pytest.mark.parametrize("how", ["slice", "clear_extend", "same_length"])
async def test_fresh_ids_hold_after_the_host_rewrites_the_transcript_in_place(how: str) -> None:
    """A host switching conversations rewrites ``engine.messages`` in place between runs; a
    server that numbers its calls afresh ("call_0") must still never repeat an id of the new
    content, even one the engine had not seen before."""

    @tool
    async def t() -> str:
        return "ran"

    def call(tid: str) -> ScriptedResponse:
        return ScriptedResponse(tool_calls=[ScriptedToolCall("t", id=tid)])

    other = engine_for([call("call_0"), "ok", call("call_1"), "ok"], tools=[t])
    await collect(other, "b")
    await collect(other, "c")
    engine = engine_for([call("first"), "ok", call("call_0"), "ok"], tools=[t])
    await collect(engine, "a")
    if how == "slice":
        engine.messages[:] = other.messages
    elif how == "clear_extend":
        engine.messages.clear()
        engine.messages.extend(other.messages)
    else:  # as many messages as the engine had read, so nothing looks new
        engine.messages[:] = other.messages[: len(engine.messages)]
    await collect(engine, "d")
    ids = [b.id for m in engine.messages for b in m.tool_uses]
    assert len(ids) == len(set(ids)) and ids[-1] != "call_0"
    assert validate_transcript(engine.messages) == []


async def test_a_model_that_raises_anything_ends_with_model_error() -> None:
    class Broken:
        def stream(self, request: object, signal: object) -> object:
            raise KeyError("bug")

    events = await collect(QueryEngine(Broken(), policies=[]), "go")  # type: ignore[arg-type]
    assert events[-1].reason == "model_error" and "KeyError" in (events[-1].error or "")  # type: ignore[union-attr]


async def _ends_with_model_error(model: Any) -> QueryEngine:
    """Run ``model`` (whose stream raises a CancelledError of its own, once): the turn ends with
    ``model_error``, not retried, no abort hook called, and the engine is usable again."""
    engine = QueryEngine(model, policies=[], retry_base_delay=0)
    hooked: list[str] = []
    engine.on_abort(hooked.append)
    events = await collect(engine, "go")
    end = events[-1]
    assert isinstance(end, TurnEnded) and (end.reason, end.abort_reason) == ("model_error", None)
    assert "CancelledError" in (end.error or "") and model.requests == 1 and hooked == []
    assert validate_transcript(engine.messages) == [] and not engine.running
    return engine


async def test_a_model_stream_that_raises_cancelled_error_of_its_own_ends_with_model_error() -> None:
    """A stream that raises CancelledError though nobody cancelled the run (it awaited a task
    that something else cancelled: a connection pool's reader, say) propagated out of run() as a
    cancel of the host's task: no TurnEnded, and a host that does not expect a cancel crashed.
    It is a failure of the model's request now."""

    class Stray:
        requests = 0

        async def stream(self, request: object, signal: object) -> AsyncGenerator[object, None]:
            self.requests += 1
            yield StreamText(0, "Let me ")
            reader = asyncio.ensure_future(asyncio.Event().wait())
            reader.cancel()
            await reader  # raises the cancellation of a task that is not the run's

    engine = await _ends_with_model_error(Stray())
    assert engine.messages[-1].partial and engine.messages[-1].text == "Let me"


async def test_a_model_stream_call_that_raises_cancelled_error_of_its_own_ends_with_model_error() -> None:
    """``model.stream(...)`` itself (not its iteration) raising CancelledError, though nobody
    cancelled the run, propagated out of run() as a cancel of the host's task. It is a failure
    of the model's request now, as when the stream raises it while iterated."""

    class Stray:
        requests = 0

        def stream(self, request: object, signal: object) -> object:
            self.requests += 1
            raise asyncio.CancelledError  # e.g. the result of a cancelled future read synchronously

    engine = await _ends_with_model_error(Stray())
    assert [m.role for m in engine.messages] == ["user"]


@pytest.mark.parametrize("ending", ["complete", "failed"])
async def test_a_model_stream_that_raises_cancelled_error_as_it_is_closed_does_not_cancel_the_host(
    ending: str,
) -> None:
    """A stream whose closing (``aclose()`` at the end of an attempt) raises CancelledError of
    its own, though nobody cancelled the run, propagated out of run() as a cancel of the host's
    task. It is treated as any other error raised while closing: logged, and the attempt's
    outcome stands (a complete response is kept; a failed attempt is retried or ends the turn)."""

    class Closing:
        """An async iterator (not a generator: its aclose is called even after its end)."""

        def __init__(self) -> None:
            self.events: list[object] = [StreamText(0, "Done."), StreamBlockStop(0), StreamEnd("end_turn")]
            self.closed = 0

        def __aiter__(self) -> Closing:
            return self

        async def __anext__(self) -> object:
            if not self.events:
                raise StopAsyncIteration
            if ending == "failed" and len(self.events) == 1:
                raise ModelError("connection reset")
            return self.events.pop(0)

        async def aclose(self) -> None:
            self.closed += 1
            raise asyncio.CancelledError  # its connection's reader task was cancelled

    class Model:
        def __init__(self) -> None:
            self.streams: list[Closing] = []

        def stream(self, request: object, signal: object) -> Closing:
            self.streams.append(Closing())
            return self.streams[-1]

    model = Model()
    engine = QueryEngine(model, policies=[], retry_base_delay=0)  # type: ignore[arg-type]
    events = await collect(engine, "go")
    end = events[-1]
    assert isinstance(end, TurnEnded) and end.abort_reason is None
    assert all(s.closed == 1 for s in model.streams)
    if ending == "complete":
        assert end.reason == "completed" and engine.messages[-1].text == "Done." and len(model.streams) == 1
    else:
        assert end.reason == "model_error" and "connection reset" in (end.error or "")
    assert validate_transcript(engine.messages) == [] and not engine.running


async def test_a_host_cancel_while_the_model_stream_is_closed_propagates() -> None:
    """The other side of the rule above: a cancel of the host's task that lands while the
    attempt's stream is being closed (its aclose awaits its connection) propagates after cleanup."""
    closing = asyncio.Event()

    class SlowClose:
        def __aiter__(self) -> SlowClose:
            return self

        async def __anext__(self) -> object:
            raise ModelError("bad request")  # not retryable: the attempt ends, the stream is closed

        async def aclose(self) -> None:
            closing.set()
            await asyncio.Event().wait()

    class Model:
        def stream(self, request: object, signal: object) -> SlowClose:
            return SlowClose()

    engine = QueryEngine(Model(), policies=[])  # type: ignore[arg-type]

    async def consume() -> None:
        async for _ in engine.run("go"):
            pass

    task = asyncio.ensure_future(consume())
    await closing.wait()
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
    assert not engine.running and validate_transcript(engine.messages) == []


# -- the consumer contract ------------------------------------------------------------------


async def test_consumer_break_aborts_with_consumer_closed_and_leaves_a_valid_transcript() -> None:
    gate = asyncio.Event()

    @tool
    async def t(ctx: ToolContext) -> str:
        gate.set()
        await ctx.signal.wait()
        return "stopped"

    reasons: list[str] = []
    engine = engine_for([calls("t"), "next run"], tools=[t])
    engine.on_abort(reasons.append)
    async for ev in engine.run("go"):
        if type(ev).__name__ == "ToolCallStarted":
            break
    assert validate_transcript(engine.messages) == []  # settled synchronously on break
    events = await collect(engine, "again")  # the next run waits for the cleanup
    assert isinstance(events[-1], TurnEnded) and events[-1].reason == "completed"
    assert reasons == ["consumer_closed"]


async def test_consumer_aclose_aborts_and_cleans_up() -> None:
    model = HangingModel()
    engine = QueryEngine(model, policies=[])
    run = engine.run("go")
    while not isinstance(await run.__anext__(), TextDelta):
        pass
    await run.aclose()
    assert not engine.running and model.closed
    assert engine.messages[-1].partial
    assert validate_transcript(engine.messages) == []


@pytest.mark.parametrize("phase", ["model", "tools"])
async def test_aclose_from_another_task_stops_the_run_the_iterating_task_sees_its_end(phase: str) -> None:
    """A "stop" button's task closes the run while the host's task awaits the next event: no
    RuntimeError ("already running"), the run aborts with consumer_closed, no further turn starts
    (a send-now queued meanwhile waits), and the iterating task gets the turn's end."""
    started = asyncio.Event()

    @tool
    async def t(ctx: ToolContext) -> str:
        started.set()
        await ctx.signal.wait()
        ctx.signal.throw_if_aborted()
        return "not reached"

    model = HangingModel()
    engine = QueryEngine(model, policies=[]) if phase == "model" else engine_for([calls("t"), "next"], tools=[t])
    run = engine.run("go")
    events = []

    async def consume() -> None:
        events.extend([ev async for ev in run])

    task = asyncio.ensure_future(consume())
    await (model.waiting if phase == "model" else started).wait()
    await run.aclose()
    receipt = engine.send_now("and then this")
    await task
    end = events[-1]
    assert isinstance(end, TurnEnded) and end.abort_reason == "consumer_closed"
    assert end.reason == ("aborted_streaming" if phase == "model" else "aborted_tools")
    assert sum(isinstance(e, TurnEnded) for e in events) == 1
    assert not engine.running and [q.id for q in engine.inbox.send_now] == [receipt]
    assert validate_transcript(engine.messages) == []
    await run.aclose()  # a no-op once the run has ended


async def test_run_is_an_async_generator_and_an_error_thrown_in_settles_the_run() -> None:
    """run() returns an async generator (so a host's aclose() type-checks); a host that throws
    its own error into it (athrow) gets that error back after the same cleanup as aclose()."""
    model = HangingModel()
    engine = QueryEngine(model, policies=[])
    run = engine.run("go")
    assert isinstance(run, AsyncGenerator)
    while not isinstance(await run.asend(None), TextDelta):
        pass
    with pytest.raises(LookupError, match="host failed"):
        await run.athrow(LookupError("host failed"))
    assert not engine.running and model.closed
    assert engine.messages[-1].partial
    assert validate_transcript(engine.messages) == []


async def test_foreign_cancellation_propagates_after_cleanup() -> None:
    model = HangingModel()
    engine = QueryEngine(model, policies=[])

    async def consume() -> None:
        async for _ in engine.run("go"):
            pass

    task = asyncio.ensure_future(consume())
    await model.waiting.wait()
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
    assert model.closed and not engine.running
    assert validate_transcript(engine.messages) == []


@pytest.mark.parametrize("during", ["grace", "abort_hook"])
async def test_a_second_cancel_during_cleanup_still_stops_every_tool_task(during: str) -> None:
    """The host cancels its task, then cancels it again while the run cleans up (a shutdown
    that will not wait out tool_cancel_grace): no tool task may outlive the run."""
    started, cleaning, stopped = asyncio.Event(), asyncio.Event(), asyncio.Event()

    @tool
    async def stubborn() -> str:
        started.set()
        try:
            await asyncio.Event().wait()  # ignores the signal: only a cancel stops it
        finally:
            stopped.set()
        return "not reached"

    engine = engine_for([calls("stubborn")], tools=[stubborn], tool_cancel_grace=30.0)

    async def hook(_reason: str) -> None:
        cleaning.set()
        if during == "abort_hook":
            await asyncio.Event().wait()  # a slow cleanup of the host's own

    engine.on_abort(hook if during == "abort_hook" else lambda _reason: cleaning.set())

    async def consume() -> None:
        async for _ in engine.run("go"):
            pass

    task = asyncio.ensure_future(consume())
    await started.wait()
    task.cancel()
    await cleaning.wait()  # the run is cleaning up: awaiting the hook, or the tools' grace
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
    await asyncio.wait_for(stopped.wait(), 5)
    assert not engine.running and validate_transcript(engine.messages) == []


async def test_a_run_dropped_in_another_thread_is_settled_on_the_loop_thread() -> None:
    import threading

    model = HangingModel()
    engine = QueryEngine(model, policies=[])
    run = engine.run("go")
    while not isinstance(await run.__anext__(), TextDelta):
        pass
    holder = [run]
    del run
    dropper = threading.Thread(target=holder.clear)  # the last reference dies in that thread
    dropper.start()
    dropper.join()
    assert not engine.running  # dropped: over for the host at once, whatever its cleanup still does
    for _ in range(200):  # bounded: the loop thread settles, then the generator's cleanup runs
        if engine._state is None:
            break
        await asyncio.sleep(0)
    assert engine._state is None and model.closed
    assert engine.messages[-1].partial and validate_transcript(engine.messages) == []


async def test_an_interrupt_that_lands_as_the_next_turn_starts_stops_that_turn() -> None:
    """From another thread (or a signal handler), interrupt() stops the turn it finds running.
    One landing while the loop took a follow-up to start its turn reached the spent turn's
    controller, which the new turn replaced: the user's stop was lost and the follow-up ran
    to completion, a model request the user had cancelled."""
    engine = engine_for(["first", "second"])
    take = engine.inbox.take

    def take_then_interrupt(queue: Any) -> Any:
        items = take(queue)
        if items and queue is engine.inbox.follow_ups:
            engine.interrupt()  # what a UI thread's Ctrl-C does at this instant
        return items

    engine.inbox.take = take_then_interrupt  # type: ignore[method-assign]
    events = []
    async for ev in engine.run("go"):
        events.append(ev)
        if isinstance(ev, TurnStarted) and ev.turn == 1:
            engine.follow_up("then this")
    ends = [(e.reason, e.abort_reason) for e in events if isinstance(e, TurnEnded)]
    assert ends == [("completed", None), ("aborted_streaming", "cancel")]
    assert [m.text for m in engine.messages] == ["go", "first", "then this", Texts().interrupt_notice]


async def test_a_send_now_that_lands_as_its_own_turn_starts_does_not_stop_that_turn() -> None:
    engine = engine_for(["first", "second"])
    take = engine.inbox.take
    sent: list[str] = []

    def take_then_stop(queue: Any) -> Any:
        items = take(queue)
        if items and queue is engine.inbox.send_now and not sent:
            sent.append("x")
            state = engine._state
            assert state is not None
            state.controller.abort("send_now")  # the stop of a send_now() that read the old turn
        return items

    engine.inbox.take = take_then_stop  # type: ignore[method-assign]
    events = []
    async for ev in engine.run("go"):
        events.append(ev)
        if isinstance(ev, AssistantMessage) and len(events) < 5:
            engine.inbox.put(engine.inbox.send_now, "instead", "send")  # queued, not yet stopped
    ends = [(e.reason, e.abort_reason) for e in events if isinstance(e, TurnEnded)]
    assert ends == [("completed", None), ("completed", None)]


async def test_an_interjection_sent_while_a_run_the_host_broke_out_of_cleans_up_is_idle() -> None:
    """The host stopped iterating (``break``, the handle dropped, no ``aclose()``) while a call
    ran; the run's cleanup still waits for that call in the background. From the host's side no
    run is going, so an interjection sent then is the user's own words before the next prompt,
    not a message "sent while you were working" (the envelope it got)."""
    release = asyncio.Event()

    @tool
    async def slow(ctx: ToolContext) -> str:
        while not release.is_set():  # ignores the abort: the cleanup waits out its grace for it
            try:
                await release.wait()
            except asyncio.CancelledError:
                continue
        return "done"

    engine = engine_for([calls("slow"), "ok"], tools=[slow], tool_cancel_grace=60.0)
    async for ev in engine.run("go"):
        if isinstance(ev, ToolCallStarted):
            break
    closing = engine._closing
    assert closing is not None and not closing.done()  # the cleanup is still going
    receipt = engine.interject("while idle")
    release.set()
    await closing
    events = await collect(engine, "next")
    assert [e.ids for e in events if isinstance(e, TurnStarted)] == [(receipt,)]
    model = engine.model
    assert isinstance(model, ScriptedModel)
    tail = model.requests[-1].messages[-2:]
    assert [(m.kind, m.text, m.meta) for m in tail] == [(None, "while idle", {"receipts": [receipt]}), (None, "next", {})]
    assert validate_transcript(engine.messages) == []


async def test_a_run_made_and_dropped_unbegun_leaves_later_interjections_idle() -> None:
    """``run()`` called and its result dropped, never iterated: an interjection sent afterwards
    was taken as sent after that run's prompt ("late"), and followed the next run's prompt in the
    envelope. No run is going: it is the user's own words, before the next prompt."""
    engine = engine_for(["ok"])
    engine.run("never iterated")
    receipt = engine.interject("while idle")
    events = await collect(engine, "go")
    assert [e.ids for e in events if isinstance(e, TurnStarted)] == [(receipt,)]
    assert [(m.kind, m.text) for m in engine.messages] == [(None, "while idle"), (None, "go"), (None, "ok")]
    assert validate_transcript(engine.messages) == []
