"""Runaway policies as the author of an unattended agent writes them from docs/policies.md:
subclasses of the stock policies, policies of one's own composed with them, over the engine's
whole life (several runs, a resumed session, subagents, interrupts and steering), a headless
host's exit codes, and the switches that turn recovery off."""

from __future__ import annotations

import asyncio
import json
import logging
import re
import threading
from collections.abc import Hashable, Sequence
from pathlib import Path
from typing import Any

import httpx
import pytest

from agentloop import (
    Allow,
    DoomLoopDetected,
    Message,
    PermissionRequested,
    PolicyNudge,
    QueryEngine,
    Resampling,
    ScriptedModel,
    ScriptedResponse,
    ScriptedToolCall,
    ToolCallFinished,
    ToolCallStarted,
    ToolResultBlock,
    ToolUseBlock,
    TurnEnded,
    delegate_tool,
    tool,
    validate_transcript,
)
from agentloop.models import (
    ModelRequest,
    OpenAIResponsesModel,
    StreamEnd,
    StreamEvent,
    StreamText,
    StreamUsage,
    Usage,
)
from agentloop.policies import (
    ConservativeDoomLoopPolicy,
    DoomLoopPolicy,
    DoomLoopSignal,
    EndTurn,
    IdenticalToolCallRun,
    Judgement,
    Nudge,
    Policy,
    RepeatedErrorResult,
    Resample,
    StationarityPolicy,
    ToolCallCycle,
    Verdict,
    default_policies,
)
from agentloop.sessions import JsonlSession
from agentloop.testing import collect
from tests.helpers import EXIT

CHANT = "I will read the file again to be sure. "


@tool
async def open_file(path: str) -> str:
    """Open a file of the project."""
    return f"contents of {path}"


@tool
async def shell(command: str, max_seconds: int = 60) -> str:
    """Run a shell command."""
    if command.startswith("fail"):
        raise RuntimeError(f"{command}: exit status 2")
    return f"ran {command}"


def ends(events: Sequence[Any]) -> list[TurnEnded]:
    return [e for e in events if isinstance(e, TurnEnded)]


def settled(engine: QueryEngine) -> None:
    """What every test checks after a run: a valid transcript and nothing running."""
    assert validate_transcript(engine.messages) == []
    assert not engine.running
    assert engine.signal is None


def calls(name: str, args: dict[str, Any], n: int = 1) -> ScriptedResponse:
    return ScriptedResponse(tool_calls=[ScriptedToolCall(name, dict(args)) for _ in range(n)])


# -- subclassing the stock policies through the one method the docs point to ----------------------


class AbortTextLoops(DoomLoopPolicy):
    """The docs' example: a tail repetition on any channel is a loop."""

    def judge(self, signal: DoomLoopSignal) -> str:
        if signal.kind == "tail_repetition":
            return "abort"
        return "ignore" if signal.kind == "low_logprob" else "warn"


async def test_a_judge_override_resamples_a_text_loop_the_stock_policy_only_warns_on() -> None:
    model = ScriptedModel([ScriptedResponse(text=CHANT * 30, chunk=8), "The file says hello."])
    engine = QueryEngine(model, policies=[AbortTextLoops()])
    events = await collect(engine.run("What does the file say?"))
    doom = [e for e in events if isinstance(e, DoomLoopDetected)]
    assert doom[0].action == "resample" and doom[0].policy == "AbortTextLoops"
    assert any(isinstance(e, Resampling) for e in events)
    assert ends(events)[-1].reason == "completed"
    assert engine.messages[-1].text == "The file says hello."
    settled(engine)

    stock = QueryEngine(ScriptedModel([ScriptedResponse(text=CHANT * 30, chunk=8)]))
    events = await collect(stock.run("What does the file say?"))
    assert {e.action for e in events if isinstance(e, DoomLoopDetected)} == {"warn"}
    assert not any(isinstance(e, Resampling) for e in events)
    settled(stock)


class IgnoreTimeouts(IdenticalToolCallRun):
    """Calls that differ only in their ``max_seconds`` are one call."""

    def key(self, call: ToolUseBlock, result: ToolResultBlock | None) -> Hashable:
        args = {k: v for k, v in call.input.items() if k != "max_seconds"}
        return super().key(call.model_copy(update={"input": args}), result)


async def test_a_key_override_makes_calls_that_differ_in_an_ignored_argument_one_run() -> None:
    steps = [calls("shell", {"command": "make", "max_seconds": t}) for t in (30, 60) * 6]
    model = ScriptedModel([*steps, "Built."])
    engine = QueryEngine(model, tools=[shell], policies=[IgnoreTimeouts()])
    events = await collect(engine.run("Build it"))
    nudges = [e for e in events if isinstance(e, PolicyNudge)]
    assert [n.policy for n in nudges] == ["IgnoreTimeouts"]
    end = ends(events)[-1]
    assert (end.reason, end.turns) == ("stationarity_ended", 12)
    settled(engine)
    # With the stock key the time limits make two calls that alternate: never a run.
    engine = QueryEngine(ScriptedModel([*steps, "Built."]), tools=[shell], policies=[IdenticalToolCallRun()])
    assert ends(await collect(engine.run("Build it")))[-1].reason == "completed"
    settled(engine)


class SameToolTwice(StationarityPolicy):
    """Built on the base: ends the turn when one response calls one tool name twice."""

    one_engine = True

    def key(self, call: ToolUseBlock, result: ToolResultBlock | None) -> Hashable:
        return call.name

    def on_results(self, message: Message, results: Sequence[ToolResultBlock]) -> Verdict | None:
        base, copies = self.signature(message, results)
        twice = sorted(str(key) for key, n in base if n * copies >= 2)
        return EndTurn(f"Stopped: {', '.join(twice)} twice in one step.") if twice else None


async def test_a_stationarity_subclass_with_its_own_on_results_ends_the_turn() -> None:
    model = ScriptedModel([
        ScriptedResponse(tool_calls=[ScriptedToolCall("open_file", {"path": "a"}),
                                     ScriptedToolCall("open_file", {"path": "b"})]),
        "unreached",
    ])
    engine = QueryEngine(model, tools=[open_file], policies=[SameToolTwice()])
    end = ends(await collect(engine.run("Open both")))[-1]
    assert (end.reason, end.detail) == ("stationarity_ended", "Stopped: open_file twice in one step.")
    settled(engine)
    assert SameToolTwice().fork().key(ToolUseBlock(id="t", name="x", input={}), None) == "x"


# -- composing policies of one's own with the stock ones -------------------------------------------


class BannedWord(Policy):
    """A second stream watcher: resamples an attempt whose text says a banned word."""

    one_engine = True

    def __init__(self, word: str) -> None:
        self.word, self.seen, self.events = word, "", 0

    def begin_attempt(self) -> None:
        self.seen = ""

    def on_stream(self, event: StreamEvent) -> Verdict | None:
        self.events += 1
        if isinstance(event, StreamText):
            self.seen += event.text
            if self.word in self.seen:
                return Resample(reminder=f"Do not write {self.word!r}.", replay=False)
        return None


async def test_two_stream_watchers_each_see_every_event_and_each_cuts_its_own_attempt() -> None:
    def script(request: ModelRequest) -> ScriptedResponse | str:
        return [
            ScriptedResponse(thinking=CHANT * 30, chunk=8),  # the stock policy's loop
            ScriptedResponse(text="The password is hunter2, as asked.", chunk=4),  # the host's word
            "I cannot share it.",
        ][model.request_count - 1]

    model = ScriptedModel([script], cycle=True)
    banned = BannedWord("hunter2")
    engine = QueryEngine(model, policies=[ConservativeDoomLoopPolicy(), banned], doom_budget=3)
    events = await collect(engine.run("What is the password?"))
    doom = [(e.policy, e.action) for e in events if isinstance(e, DoomLoopDetected)]
    assert doom == [("ConservativeDoomLoopPolicy", "resample"), ("BannedWord", "resample")]
    assert [e.reason for e in events if type(e).__name__ == "AttemptDiscarded"] == ["resample", "resample"]
    # The host's reminder, without the cut attempt's text: the word is not sent back.
    assert model.requests[2].messages[-1].text == "Do not write 'hunter2'."
    assert "hunter2," not in json.dumps([m.model_dump() for m in model.requests[2].messages])
    assert engine.messages[-1].text == "I cannot share it."
    assert "hunter2" not in json.dumps([m.model_dump() for m in engine.messages])
    assert banned.events > 3 * 9  # every delta of every attempt, not one in `every`
    settled(engine)


class TokenBudget(Policy):
    """Ends the turn from `on_results` once the request's tokens pass a budget. Tokens come from
    the stream (`StreamUsage`, the attempt's usage so far, and `StreamEnd.usage`, its total): a
    cut attempt's tokens count too."""

    one_engine = True

    def __init__(self, budget: int) -> None:
        self.budget, self.spent, self.attempt = budget, 0, Usage()

    def begin_turn(self, *, real_user: bool) -> None:
        if real_user:
            self.spent = 0

    def begin_attempt(self) -> None:
        self.spent += self.attempt.total
        self.attempt = Usage()

    def on_stream(self, event: StreamEvent) -> Verdict | None:
        usage = event.usage if isinstance(event, StreamUsage | StreamEnd) else None
        if usage is not None:
            self.attempt = usage
        return None

    def on_results(self, message: Message, results: Sequence[ToolResultBlock]) -> Verdict | None:
        total = self.spent + self.attempt.total
        if total >= self.budget:
            return EndTurn(f"Stopped: {total} tokens of {self.budget} spent.", reason="hook_stopped")
        return None


async def test_a_token_budget_ends_the_turn_from_on_results_with_hook_stopped() -> None:
    model = ScriptedModel([calls("shell", {"command": f"step {i}"}) for i in range(10)])
    engine = QueryEngine(model, tools=[shell], policies=[*default_policies(), TokenBudget(60)])
    events = await collect(engine.run("Work"))
    end = ends(events)[-1]
    assert (end.reason, end.detail, end.turns) == ("hook_stopped", "Stopped: 60 tokens of 60 spent.", 3)
    assert end.usage.total == 60
    assert sum(isinstance(e, ToolCallFinished) for e in events) == 3
    settled(engine)


class ErrorsPileUp(Policy):
    """Nudges once three tool errors in a row have piled up; a success clears the pile."""

    one_engine = True
    reminder = "Three tool calls failed in a row. Read the errors before calling again."

    def __init__(self) -> None:
        self.errors = 0

    def on_results(self, message: Message, results: Sequence[ToolResultBlock]) -> Verdict | None:
        for result in results:
            self.errors = self.errors + 1 if result.is_error else 0
        if self.errors >= 3:
            self.errors = 0
            return Nudge(self.reminder)
        return None


async def test_a_policy_nudges_when_tool_errors_pile_up() -> None:
    model = ScriptedModel([
        calls("shell", {"command": "fail 1"}), calls("shell", {"command": "fail 2"}),
        calls("shell", {"command": "fail 3"}), "I will read them.",
    ])
    engine = QueryEngine(model, tools=[shell], policies=[*default_policies(), ErrorsPileUp()])
    events = await collect(engine.run("Build"))
    assert [e.policy for e in events if isinstance(e, PolicyNudge)] == ["ErrorsPileUp"]
    last_request = model.requests[-1].messages
    assert last_request[-1].text == ErrorsPileUp.reminder and last_request[-1].synthetic
    assert ends(events)[-1].reason == "completed"
    settled(engine)


class Recorder(Policy):
    """Only observes: logs every hook, returns nothing."""

    def __init__(self) -> None:
        self.log: list[str] = []

    def begin_turn(self, *, real_user: bool) -> None:
        self.log.append(f"turn real_user={real_user}")

    def begin_attempt(self) -> None:
        self.log.append("attempt")

    def on_response(self, message: Message) -> Verdict | None:
        self.log.append(f"response {len(message.tool_uses)} calls")
        return None

    def on_results(self, message: Message, results: Sequence[ToolResultBlock]) -> Verdict | None:
        self.log.append(f"results {[r.is_error for r in results]}")
        return None


async def test_an_observing_policy_sees_every_hook_in_order_and_changes_nothing() -> None:
    script = [calls("open_file", {"path": "a"}), "Done."]
    rec = Recorder()
    engine = QueryEngine(ScriptedModel(script), tools=[open_file], policies=[*default_policies(), rec])
    events = await collect(engine.run("Open a"))
    assert rec.log == [
        "turn real_user=True", "attempt", "response 1 calls", "results [False]", "attempt", "response 0 calls",
    ]
    plain = QueryEngine(ScriptedModel(script), tools=[open_file])
    plain_events = await collect(plain.run("Open a"))
    assert [e.type for e in events] == [e.type for e in plain_events]
    settled(engine)


class Broken(Policy):
    """Every hook a bug: raises, or returns what is not a verdict."""

    def __init__(self, how: str) -> None:
        self.how = how

    def _bug(self) -> Any:
        if self.how == "raise":
            raise KeyError("oops")
        return {"garbage": "stop"}

    def on_stream(self, event: StreamEvent) -> Any:
        return self._bug()

    def on_response(self, message: Message) -> Any:
        return self._bug()

    def on_results(self, message: Message, results: Sequence[ToolResultBlock]) -> Any:
        return self._bug()


@pytest.mark.parametrize("alone", [False, True])
@pytest.mark.parametrize("how", ["raise", "garbage"])
async def test_a_broken_policy_is_logged_once_per_attempt_and_never_ends_the_run(
    how: str, alone: bool, caplog: pytest.LogCaptureFixture
) -> None:
    model = ScriptedModel([calls("open_file", {"path": "a"}), ScriptedResponse(thinking=CHANT * 30, chunk=8), "Ok."])
    policies = [Broken(how)] if alone else [Broken(how), *default_policies()]
    engine = QueryEngine(model, tools=[open_file], policies=policies)
    with caplog.at_level(logging.WARNING, logger="agentloop"):
        events = await collect(engine.run("Open a"))
    assert ends(events)[-1].reason == "completed"
    doom = [e.action for e in events if isinstance(e, DoomLoopDetected)]
    assert doom == ([] if alone else ["resample"])  # the stock policy still works beside it
    logged = [r.getMessage() for r in caplog.records if "Broken" in r.getMessage()]
    assert any("on_results" in m for m in logged)
    attempts = model.request_count
    assert len([m for m in logged if "on_stream" in m]) == attempts  # once per attempt, not per event
    settled(engine)


# -- policies across the engine's life -----------------------------------------------------------


def looping(name: str = "shell", args: dict[str, Any] | None = None) -> ScriptedModel:
    return ScriptedModel([calls(name, args or {"command": "make"})], cycle=True)


async def test_one_engine_several_runs_a_prompt_resets_the_counts_a_bare_run_does_not() -> None:
    engine = QueryEngine(looping(), tools=[shell], policies=[IdenticalToolCallRun(nudge_at=2, end_at=3)])
    first = ends(await collect(engine.run("Build")))[-1]
    assert (first.reason, first.turns) == ("stationarity_ended", 3)
    again = ends(await collect(engine.run()))[-1]  # a headless host simply runs again
    assert (again.reason, again.turns) == ("stationarity_ended", 1)
    fresh = ends(await collect(engine.run("Try once more")))[-1]  # a person asked: a fresh allowance
    assert (fresh.reason, fresh.turns) == ("stationarity_ended", 3)
    settled(engine)


async def test_a_resumed_session_gives_new_policies_that_catch_up_on_the_transcript(tmp_path: Path) -> None:
    path = tmp_path / "job.jsonl"
    with JsonlSession(path) as session:
        engine = QueryEngine(looping(), tools=[shell], session=session,
                             policies=[IdenticalToolCallRun(nudge_at=2, end_at=3), ErrorsPileUp()])
        assert ends(await collect(engine.run("Build")))[-1].reason == "stationarity_ended"
    session, loaded = JsonlSession.resume(path)
    with session:
        rec = Recorder()
        resumed = QueryEngine(looping(), tools=[shell], session=session, messages=loaded.messages,
                              policies=[IdenticalToolCallRun(nudge_at=2, end_at=3), rec])
        # The new policies were shown the responses since the person's request, verdicts dropped.
        assert rec.log == ["response 1 calls", "results [False]"] * 3
        end = ends(await collect(resumed.run()))[-1]
        assert (end.reason, end.turns) == ("stationarity_ended", 1)
        settled(resumed)


class SharedClientPolicy(Policy):
    """Holds what a deep copy cannot take (a lock, a client)."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.seen: list[str | None] = []

    def on_response(self, message: Message) -> Verdict | None:
        with self.lock:
            self.seen.append(message.text)
        return None


class SharingPolicy(SharedClientPolicy):
    def fork(self) -> SharingPolicy:
        return self  # one object across the tree


async def test_a_policy_a_deep_copy_cannot_take_names_itself_and_fork_self_shares_it() -> None:
    engine = QueryEngine(ScriptedModel(["hi"]), policies=[SharedClientPolicy()])
    with pytest.raises(TypeError, match=r"SharedClientPolicy\.fork\(\)"):
        engine.subagent(agent_id="child")
    shared = SharingPolicy()
    parent = QueryEngine(ScriptedModel(["parent", "child"]), policies=[*default_policies(), shared])
    child = parent.subagent(agent_id="child")
    assert shared in child.policies
    assert not any(p is q for p in parent.policies for q in child.policies if p is not shared)
    await collect(parent.run("go"))
    await collect(child.run("go"))
    assert shared.seen == ["parent", "child"]
    settled(parent)
    settled(child)


async def test_delegate_tool_forks_its_policy_template_for_each_child() -> None:
    template = IdenticalToolCallRun(nudge_at=None, end_at=2)

    def script(request: ModelRequest) -> ScriptedResponse | str:
        first = request.messages[0].text
        if first == "Do the work":  # the parent: two delegations at once, then the answer
            if len(request.messages) == 1:
                return ScriptedResponse(tool_calls=[ScriptedToolCall("worker", {"task": "a"}),
                                                    ScriptedToolCall("worker", {"task": "b"})])
            return "Both done."
        return calls("shell", {"command": "make"})  # each child loops

    engine = QueryEngine(ScriptedModel([script], cycle=True),
                         tools=[shell, delegate_tool(name="worker", policies=[template])])
    events = await collect(engine.run("Do the work"))
    child_ends = [e for e in ends(events) if e.agent_id is not None]
    assert sorted(e.reason for e in child_ends) == ["stationarity_ended"] * 2
    assert all(e.turns == 2 for e in child_ends)  # neither child inherits the other's run
    assert ends(events)[-1].reason == "completed" and ends(events)[-1].agent_id is None
    assert template.fork() is not template
    settled(engine)


# -- interrupts and steering while policies act ---------------------------------------------------


@pytest.mark.parametrize("when", ["at_resampling", "in_the_resample"])
async def test_an_interrupt_in_the_middle_of_a_resample_ends_the_turn_as_an_abort(when: str) -> None:
    model = ScriptedModel([ScriptedResponse(thinking=CHANT * 30, chunk=8),
                           ScriptedResponse(text="A fresh answer, streamed slowly. " * 4, chunk=4)])
    engine = QueryEngine(model, policies=[*default_policies(), Recorder()])
    events = []
    resampling = False
    async for event in engine.run("Think"):
        events.append(event)
        if isinstance(event, Resampling):
            resampling = True
            if when == "at_resampling":
                engine.interrupt()
        elif resampling and type(event).__name__ == "TextDelta":
            engine.interrupt()
    end = ends(events)[-1]
    assert end.reason == "aborted_streaming" and end.abort_reason == "cancel"
    assert model.request_count == (1 if when == "at_resampling" else 2)
    assert not any(m.kind == "doom_reminder" for m in engine.messages)  # the reminder went with the request only
    settled(engine)


async def test_an_interjection_resets_the_counts_after_its_batch_is_judged() -> None:
    policy = IdenticalToolCallRun(nudge_at=None, end_at=4)
    rec = Recorder()
    engine: QueryEngine

    @tool
    async def poll(job: str) -> str:
        """Poll a job."""
        if sum(m.role == "assistant" for m in engine.messages) == 3:
            engine.interject("Keep polling, it is nearly done.")
        return "running"

    engine = QueryEngine(ScriptedModel([calls("poll", {"job": "j1"})], cycle=True), tools=[poll],
                         policies=[policy, rec])
    events = await collect(engine.run("Wait for j1"))
    end = ends(events)[-1]
    assert end.reason == "stationarity_ended"
    assert end.turns == 3 + 4  # three before the message, then four from the model's first answer to it
    assert [line for line in rec.log if line.startswith("turn")] == ["turn real_user=True"] * 2
    settled(engine)


class NudgeEveryBatch(Policy):
    reminder = "Check the result before the next step."

    def on_results(self, message: Message, results: Sequence[ToolResultBlock]) -> Verdict | None:
        return Nudge(self.reminder)


async def test_send_now_while_a_nudge_is_pending_drops_the_nudge() -> None:
    engine: QueryEngine

    @tool
    async def step() -> str:
        """Take a step."""
        engine.send_now("Stop that and summarise instead.")
        return "stepped"

    model = ScriptedModel([ScriptedResponse(tool_calls=[ScriptedToolCall("step")]), "Summary."])
    engine = QueryEngine(model, tools=[step], policies=[*default_policies(), NudgeEveryBatch()])
    events = await collect(engine.run("Go"))
    assert [e.reason for e in ends(events)][-1] == "completed"
    assert model.requests[-1].messages[-1].text == "Stop that and summarise instead."
    sent = json.dumps([m.model_dump() for r in model.requests for m in r.messages])
    assert NudgeEveryBatch.reminder not in sent
    assert NudgeEveryBatch.reminder not in json.dumps([m.model_dump() for m in engine.messages])
    settled(engine)


# -- the headless host -----------------------------------------------------------------------------

class NoDeploys(Policy):
    """Ends the turn before a deploy runs: nobody is there to approve it."""

    def on_response(self, message: Message) -> Verdict | None:
        if any(use.name == "deploy" for use in message.tool_uses):
            return EndTurn("Stopped: deploys need a person.", reason="hook_stopped")
        return None

    def on_results(self, message: Message, results: Sequence[ToolResultBlock]) -> Verdict | None:
        return Nudge("Go on.")  # given with nothing after it: dropped, never seen


async def job(model: ScriptedModel, policies: list[Policy]) -> tuple[int, list[Any], QueryEngine]:
    """The cookbook's headless job, with a permission callback that would wait for ever."""
    asked: list[str] = []

    async def ask_a_person(call: ToolUseBlock, ctx: Any) -> Allow:
        if call.name == "deploy":  # nobody will answer
            asked.append(call.name)
            await asyncio.Event().wait()
        return Allow()

    @tool
    async def deploy(env: str) -> str:
        """Deploy the build."""
        return f"deployed to {env}"

    engine = QueryEngine(model, tools=[shell, deploy], policies=policies, max_turns=20, deadline=60,
                         permission=ask_a_person)
    events = await collect(engine.run("Ship it"))
    end = engine.last_turn_ended
    assert end is not None and end is ends(events)[-1]
    assert asked == []
    return EXIT[end.reason], events, engine


async def test_a_headless_job_stopped_by_a_policy_exits_4_with_a_distinct_terminal() -> None:
    model = ScriptedModel([calls("shell", {"command": "make"}),
                           ScriptedResponse(tool_calls=[ScriptedToolCall("deploy", {"env": "prod"})])])
    code, events, engine = await job(model, [*default_policies(), NoDeploys()])
    end = ends(events)[-1]
    assert (code, end.reason, end.detail) == (4, "hook_stopped", "Stopped: deploys need a person.")
    assert not any(isinstance(e, PermissionRequested) and e.tool_use.name == "deploy" for e in events)
    assert not any(isinstance(e, ToolCallStarted) and e.tool_use.name == "deploy" for e in events)
    result = engine.messages[-1].tool_results[0]
    assert result.is_error and result.text == "Not run: Stopped: deploys need a person."
    # The nudge given with the first batch went in before the next request; none after the stop.
    assert [e.reminder for e in events if isinstance(e, PolicyNudge)] == ["Go on."]
    settled(engine)

    code, events, engine = await job(looping(), [*default_policies()])
    assert (code, ends(events)[-1].reason) == (4, "stationarity_ended")
    settled(engine)


# -- an HTTP provider: the Responses API with server doom-loop frames ------------------------------


def _frame(data: dict[str, Any]) -> str:
    return f"event: {data['type']}\ndata: {json.dumps(data)}\n\n"


def responses_stream(n: int, text: str, signals: dict[int, list[str]]) -> bytes:
    """A Responses text stream shaped like openai_responses_text.prism.sse, with the server's
    `response.doom_loop_check` frames (every signal so far) after the given deltas."""
    rid, mid = f"resp_{n:04d}", f"msg_{n:04d}"
    part = {"type": "output_text", "annotations": [], "text": ""}
    out = [_frame({"type": "response.created", "sequence_number": 0,
                   "response": {"id": rid, "object": "response", "status": "in_progress", "output": []}}),
           _frame({"type": "response.output_item.added", "output_index": 0,
                   "item": {"id": mid, "type": "message", "status": "in_progress", "content": [], "role": "assistant"}}),
           _frame({"type": "response.content_part.added", "item_id": mid, "output_index": 0, "content_index": 0,
                   "part": part})]
    pieces = [text[i : i + 6] for i in range(0, len(text), 6)]
    for i, piece in enumerate(pieces):
        out.append(_frame({"type": "response.output_text.delta", "item_id": mid, "output_index": 0,
                           "content_index": 0, "delta": piece}))
        if i in signals:
            out.append(_frame({"type": "response.doom_loop_check", "signals": signals[i]}))
    done = {**part, "text": text}
    item = {"id": mid, "type": "message", "status": "completed", "content": [done], "role": "assistant"}
    out += [_frame({"type": "response.output_text.done", "item_id": mid, "output_index": 0, "content_index": 0,
                    "text": text}),
            _frame({"type": "response.content_part.done", "item_id": mid, "output_index": 0, "content_index": 0,
                    "part": done}),
            _frame({"type": "response.output_item.done", "output_index": 0, "item": item}),
            _frame({"type": "response.completed", "response": {
                "id": rid, "object": "response", "status": "completed", "output": [item],
                "usage": {"input_tokens": 10, "output_tokens": 16, "total_tokens": 26}}})]
    return "".join(out).encode()


class _Body(httpx.AsyncByteStream):
    """A response body that records whether the client closed it."""

    def __init__(self, data: bytes) -> None:
        self.data, self.closed = data, False

    async def __aiter__(self) -> Any:
        for line in self.data.splitlines(keepends=True):
            yield line

    async def aclose(self) -> None:
        self.closed = True


class ResponsesServer:
    """`POST /v1/responses` over `httpx.MockTransport`: one scripted stream per request."""

    def __init__(self, streams: list[bytes]) -> None:
        self.streams = streams
        self.headers: list[httpx.Headers] = []
        self.bodies: list[dict[str, Any]] = []
        self.sent: list[_Body] = []

    async def handle(self, request: httpx.Request) -> httpx.Response:
        assert request.url.path == "/v1/responses"
        self.headers.append(request.headers)
        self.bodies.append(json.loads(request.content))
        body = _Body(self.streams.pop(0))
        self.sent.append(body)
        return httpx.Response(200, headers={"content-type": "text/event-stream"}, stream=body)

    def model(self) -> OpenAIResponsesModel:
        client = httpx.AsyncClient(transport=httpx.MockTransport(self.handle))
        return OpenAIResponsesModel("gpt-test", api_key="sk-test-0000", http_client=client, doom_loop_check=True)


class ServerSignalsOnly(DoomLoopPolicy):
    """Resamples on what the server measured, and on nothing the client detector says."""

    def judge(self, signal: DoomLoopSignal) -> str:
        if signal.source == "server":
            return "abort" if signal.kind == "tail_repetition" else "warn"
        return "ignore"


async def test_a_policy_resamples_on_the_servers_signal_only() -> None:
    loop = "Checking again. " * 12  # a loop the client detector reports too (on the text channel)
    server = ResponsesServer([
        responses_stream(1, "Let me look. " + loop, {3: ["exact_repetition:4x3@text"],
                                                     5: ["exact_repetition:4x3@text", "tail_repetition:4@text"]}),
        responses_stream(2, loop, {}),  # the client detector's signals alone: ignored
        responses_stream(3, "unused", {}),
    ])
    engine = QueryEngine(server.model(), policies=[ServerSignalsOnly(), IdenticalToolCallRun()])
    events = await collect(engine.run("Look"))
    doom = [(e.action, [s.format() for s in e.signals]) for e in events if isinstance(e, DoomLoopDetected)]
    assert doom == [("warn", ["exact_repetition:4x3@text"]), ("resample", ["tail_repetition:4@text"])]
    assert len(server.bodies) == 2
    assert all(h.get("x-grok-doom-loop-check") == "true" for h in server.headers)
    assert engine.messages[-1].text == loop.rstrip()
    assert "Your discarded answer began" in json.dumps(server.bodies[1]["input"][-1])  # the replayed loop
    assert all(body.closed for body in server.sent)  # the cut stream too
    settled(engine)


# -- switching recovery off, with policies of one's own in the list -----------------------------


def switch_script() -> ScriptedModel:
    return ScriptedModel([
        ScriptedResponse(thinking=CHANT * 30, chunk=8, text="The password is hunter2.",
                         tool_calls=[ScriptedToolCall("shell", {"command": "fail 1"})]),
        calls("shell", {"command": "fail 2"}), calls("shell", {"command": "fail 3"}),
        "Giving up.",
    ])


def switch_policies() -> list[Policy]:
    return [*default_policies(), BannedWord("hunter2"), ErrorsPileUp()]


@pytest.mark.parametrize("how", ["env", "constructor"])
async def test_with_recovery_off_verdicts_are_reported_and_everything_else_still_runs(
    how: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    if how == "env":
        monkeypatch.setenv("AGENTLOOP_DOOM_LOOP_RECOVERY", " False ")
        engine = QueryEngine(switch_script(), tools=[shell], policies=switch_policies())
    else:
        engine = QueryEngine(switch_script(), tools=[shell], policies=switch_policies(), doom_loop_recovery=False)
    events = await collect(engine.run("Log in"))
    doom = [(e.policy, e.action, e.confident) for e in events if isinstance(e, DoomLoopDetected)]
    assert ("ConservativeDoomLoopPolicy", "off", True) in doom
    assert ("BannedWord", "off", True) in doom
    assert {action for _, action, _ in doom} <= {"off", "warn"}
    assert not any(isinstance(e, Resampling) for e in events)
    assert engine.messages[1].text == "The password is hunter2."  # accepted as it streamed
    assert [e.policy for e in events if isinstance(e, PolicyNudge)] == ["ErrorsPileUp"]  # not a stream verdict
    assert ends(events)[-1].reason == "completed"
    settled(engine)


async def test_the_constructor_switch_wins_over_the_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("AGENTLOOP_DOOM_LOOP_RECOVERY", "off")
    model = switch_script()
    engine = QueryEngine(model, tools=[shell], policies=switch_policies(), doom_loop_recovery=True, doom_budget=1)
    events = await collect(engine.run("Log in"))
    assert [e.action for e in events if isinstance(e, DoomLoopDetected) and e.confident][:1] == ["resample"]
    assert any(isinstance(e, Resampling) for e in events)
    settled(engine)


class MistakenJudge(DoomLoopPolicy):
    """Answers with the verdict's name rather than a judgement."""

    def judge(self, signal: DoomLoopSignal) -> Any:
        return "resample"


@pytest.mark.parametrize("alone", [True, False])
async def test_a_judge_that_answers_what_is_not_a_judgement_is_a_logged_bug(
    alone: bool, caplog: pytest.LogCaptureFixture
) -> None:
    model = ScriptedModel([ScriptedResponse(thinking=CHANT * 30, chunk=8), "Ok."])
    policies = [MistakenJudge()] if alone else [MistakenJudge(), Recorder(), BannedWord("x")]
    engine = QueryEngine(model, policies=policies)
    with caplog.at_level(logging.ERROR, logger="agentloop"):
        events = await collect(engine.run("Think"))
    assert not any(isinstance(e, DoomLoopDetected) for e in events)  # not passed off as a warning
    logged = "\n".join(r.getMessage() + str(r.exc_info and r.exc_info[1]) for r in caplog.records)
    assert "MistakenJudge.judge returned 'resample'" in logged and "'ignore', 'warn' or 'abort'" in logged
    assert ends(events)[-1].reason == "completed"
    settled(engine)


async def test_a_counting_policy_of_ones_own_shared_by_two_running_engines_is_warned_about(
    caplog: pytest.LogCaptureFixture,
) -> None:
    both = asyncio.Event()
    inside = 0

    @tool
    async def wait_for_the_other() -> str:
        """Wait until both engines are inside a tool."""
        nonlocal inside
        inside += 1
        if inside == 2:
            both.set()
        await both.wait()
        return "ok"

    shared = ErrorsPileUp()  # one_engine = True: it counts
    script = [ScriptedResponse(tool_calls=[ScriptedToolCall("wait_for_the_other")]), "done"]
    engines = [QueryEngine(ScriptedModel(script), tools=[wait_for_the_other], policies=[shared]) for _ in range(2)]
    with caplog.at_level(logging.WARNING, logger="agentloop"):
        runs = await asyncio.gather(*(collect(e.run("go")) for e in engines))
    assert [ends(r)[-1].reason for r in runs] == ["completed", "completed"]
    warned = [r.getMessage() for r in caplog.records if "ErrorsPileUp" in r.getMessage()]
    assert len(warned) == 1
    for engine in engines:
        settled(engine)


class SameErrorWhateverTheNumbers(RepeatedErrorResult):
    """Errors that differ only in their numbers (a pid, a line) are one error."""

    def key(self, call: ToolUseBlock, result: ToolResultBlock | None) -> Hashable:
        name, text = super().key(call, result)  # type: ignore[misc]
        return name, re.sub(r"\d+", "N", text)


class CycleOfToolNames(ToolCallCycle):
    """A cycle of tools, whatever their arguments."""

    def key(self, call: ToolUseBlock, result: ToolResultBlock | None) -> Hashable:
        return call.name


class AlsoAbortTextTails(ConservativeDoomLoopPolicy):
    def judge(self, signal: DoomLoopSignal) -> Judgement:
        if signal.kind == "tail_repetition" and signal.channel == "text":
            return "abort"
        return super().judge(signal)


async def test_the_opt_in_policies_subclassed_through_key() -> None:
    failing = ScriptedModel([calls("shell", {"command": f"fail {i}"}) for i in range(1, 9)])
    engine = QueryEngine(failing, tools=[shell], policies=[SameErrorWhateverTheNumbers(nudge_at=2, end_at=3)])
    end = ends(await collect(engine.run("Build")))[-1]
    assert (end.reason, end.turns) == ("stationarity_ended", 3)
    settled(engine)
    stock = QueryEngine(ScriptedModel([calls("shell", {"command": f"fail {i}"}) for i in range(1, 5)] + ["ok"]),
                        tools=[shell], policies=[RepeatedErrorResult(nudge_at=2, end_at=3)])
    assert ends(await collect(stock.run("Build")))[-1].reason == "completed"

    flip = ScriptedModel([calls("open_file", {"path": f"{n}.py"}) if n % 2 else calls("shell", {"command": f"cat {n}"})
                          for n in range(20)])
    engine = QueryEngine(flip, tools=[open_file, shell], policies=[CycleOfToolNames(nudge_repeats=2, end_repeats=3)])
    end = ends(await collect(engine.run("Read")))[-1]
    assert (end.reason, end.turns) == ("stationarity_ended", 6)
    settled(engine)


async def test_a_conservative_subclass_keeps_the_stock_judgement_and_adds_its_own() -> None:
    model = ScriptedModel([ScriptedResponse(text=CHANT * 30, chunk=8), ScriptedResponse(thinking=CHANT * 30, chunk=8),
                           "Clean."])
    engine = QueryEngine(model, policies=[AlsoAbortTextTails()], doom_budget=2)
    events = await collect(engine.run("Go"))
    assert [e.action for e in events if isinstance(e, DoomLoopDetected) and e.confident] == ["resample", "resample"]
    assert engine.messages[-1].text == "Clean."
    settled(engine)


@pytest.mark.parametrize("how", ["send_now", "interject"])
async def test_steering_at_a_resample_never_leaks_the_reminder_into_the_transcript(how: str) -> None:
    model = ScriptedModel([ScriptedResponse(thinking=CHANT * 30, chunk=8), "after", "more"])
    rec = Recorder()
    engine = QueryEngine(model, policies=[*default_policies(), rec])
    events = []
    async for event in engine.run("go"):
        events.append(event)
        if isinstance(event, Resampling):
            getattr(engine, how)("New direction.")
    assert ends(events)[-1].reason == "completed"
    assert rec.log.count("turn real_user=True") == 2  # the person's text resets counts either way
    assert not any(m.kind == "doom_reminder" for m in engine.messages)
    if how == "send_now":  # the resample is replaced: no request carries its reminder
        assert [e.reason for e in ends(events)] == ["aborted_streaming", "completed"]
        assert model.request_count == 2
        assert not any(m.kind == "doom_reminder" for m in model.requests[-1].messages)
    else:  # the resample goes on; the text is merged after its answer
        assert model.requests[1].messages[-1].kind == "doom_reminder"
        assert model.requests[2].messages[-1].kind == "interjection"
    settled(engine)
