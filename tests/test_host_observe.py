"""A host that ships everything to its telemetry, written from the docs: every event as one
JSON line for a log pipeline, a span per turn, model attempt, tool call and subagent built
from the events alone, token accounting, and the ``agentloop`` logger through a JSON
formatter."""

from __future__ import annotations

import asyncio
import json
import logging
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any, get_args

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from agentloop import (
    Allow,
    AssistantMessage,
    AttemptDiscarded,
    Event,
    Message,
    ModelError,
    QueryEngine,
    Retrying,
    ScriptedModel,
    ScriptedResponse,
    ScriptedToolCall,
    ToolCallFinished,
    ToolCallStarted,
    ToolContext,
    ToolProgress,
    TurnEnded,
    TurnStarted,
    delegate_tool,
    event_json,
    tool,
)
from agentloop._model import StreamText, StreamUsage, Usage
from agentloop.models import AnthropicModel
from agentloop.policies import ConservativeDoomLoopPolicy, IdenticalToolCallRun, Policy
from tests.host_wire import AnthropicServer, Call, Reply

KEY = "sk-ant-api03-FAKEKEYfakekeyFAKEKEY0123456789abcdef"
CHANT = "I'll do it.\nI'll execute.\n" * 60


# -- the host ---------------------------------------------------------------------------


class JsonFormatter(logging.Formatter):
    """The log pipeline's formatter: one JSON object a record."""

    def format(self, record: logging.LogRecord) -> str:
        out: dict[str, Any] = {"level": record.levelname, "logger": record.name, "message": record.getMessage()}
        if record.exc_info:
            out["exc"] = self.formatException(record.exc_info)
        return json.dumps(out)


class Pipeline(logging.Handler):
    def __init__(self) -> None:
        super().__init__(logging.DEBUG)
        self.setFormatter(JsonFormatter())
        self.lines: list[str] = []
        self.records: list[logging.LogRecord] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.records.append(record)
        self.lines.append(self.format(record))


@contextmanager
def pipeline() -> Iterator[Pipeline]:
    logger = logging.getLogger("agentloop")
    handler, level = Pipeline(), logger.level
    logger.addHandler(handler)
    logger.setLevel(logging.DEBUG)
    try:
        yield handler
    finally:
        logger.removeHandler(handler)
        logger.setLevel(level)


@dataclass
class Span:
    kind: str
    key: tuple[Any, ...]
    parent: tuple[Any, ...] | None
    attrs: dict[str, Any] = field(default_factory=dict)
    ended: int = 0


class Telemetry:
    """Spans from the events alone: turn per agent, model attempt, tool call, subagent."""

    def __init__(self) -> None:
        self.lines: list[str] = []
        self.spans: list[Span] = []
        self.open: dict[tuple[Any, ...], Span] = {}
        self.turns: dict[str | None, int] = {}
        self.attempts: dict[str | None, int] = {}
        self.problems: list[str] = []

    def _start(self, kind: str, key: tuple[Any, ...], parent: tuple[Any, ...] | None, **attrs: Any) -> Span:
        if key in self.open:
            self.problems.append(f"{key} started twice")
        span = Span(kind, key, parent, attrs)
        self.spans.append(span)
        self.open[key] = span
        return span

    def _end(self, key: tuple[Any, ...], **attrs: Any) -> Span | None:
        span = self.open.pop(key, None)
        if span is None:
            self.problems.append(f"{key} ended but not open")
            return None
        span.ended += 1
        span.attrs.update(attrs)
        return span

    def _turn_key(self, agent: str | None) -> tuple[Any, ...]:
        return ("turn", agent, self.turns.get(agent, 0))

    def _attempt(self, agent: str | None) -> tuple[Any, ...]:
        """The current model attempt's span, opened on its first sign of life."""
        key = ("attempt", agent, self.turns.get(agent, 0), self.attempts.get(agent, 0))
        if key not in self.open:
            self._start("attempt", key, self._turn_key(agent))
        return key

    def _next_attempt(self, agent: str | None, **attrs: Any) -> None:
        self._end(self._attempt(agent), **attrs)
        self.attempts[agent] = self.attempts.get(agent, 0) + 1

    def feed(self, event: Event) -> None:
        self.lines.append(event_json(event))
        agent = event.agent_id
        if isinstance(event, TurnStarted):
            self.turns[agent] = self.turns.get(agent, 0) + 1
            self.attempts[agent] = 0
            parent = None
            link = event.parent_tool_use_id
            if agent is not None:
                parent = next((k for k in self.open if k[0] == "tool" and k[2] == link), None)
                if parent is None:
                    self.problems.append(f"subagent {agent}'s turn has no parent tool call")
            self._start("turn", self._turn_key(agent), parent)
        elif isinstance(event, AssistantMessage):
            self._next_attempt(agent, usage=event.usage, outcome="committed")
        elif isinstance(event, AttemptDiscarded):
            self._next_attempt(agent, usage=event.usage, outcome=event.reason)
        elif isinstance(event, Retrying):
            key = ("attempt", agent, self.turns.get(agent, 0), self.attempts.get(agent, 0))
            if key in self.open:  # nothing discarded: the failed attempt ends here
                self._next_attempt(agent, outcome="retry")
        elif isinstance(event, ToolCallStarted):
            self._start("tool", ("tool", agent, event.tool_use.id), self._turn_key(agent), name=event.tool_use.name)
        elif isinstance(event, ToolCallFinished):
            key = ("tool", agent, event.tool_use.id)
            if key not in self.open:  # a call that never started: a span of no length
                self._start("tool", key, self._turn_key(agent), name=event.tool_use.name, never_started=True)
            self._end(key, error=event.result.is_error, synthetic=event.synthetic)
        elif isinstance(event, TurnEnded):
            for key in [k for k in self.open if k[0] == "attempt" and k[1] == agent]:
                self._end(key, outcome="turn_ended")
            self._end(self._turn_key(agent), reason=event.reason, usage=event.usage)
        elif event.type in ("text_delta", "thinking_delta", "tool_input_delta", "doom_loop_detected"):
            self._attempt(agent)


async def observe(engine: QueryEngine, prompt: str | None, tel: Telemetry, on_event: Any = None) -> list[Event]:
    events: list[Event] = []
    async for event in engine.run(prompt):
        tel.feed(event)
        events.append(event)
        if on_event is not None:
            on_event(event, engine)
    return events


def assert_clean(tel: Telemetry, pipe: Pipeline | None = None) -> None:
    assert tel.problems == []
    assert tel.open == {}, f"left open after TurnEnded: {list(tel.open)}"
    assert all(span.ended == 1 for span in tel.spans)
    for line in tel.lines + (pipe.lines if pipe else []):
        assert KEY not in line and KEY[:20] not in line
        assert "\n" not in line
        json.loads(line)


# -- tools ------------------------------------------------------------------------------


@tool(concurrency_safe=True)
async def build(target: str, ctx: ToolContext) -> str:
    """Build a target."""
    for n in range(3):
        ctx.emit(ToolProgress(tool_use_id=ctx.tool_use_id, text=f"{target}: step {n}"))
        await asyncio.sleep(0)
    return f"built {target}"


@tool(concurrency_safe=True)
async def slow(n: int, ctx: ToolContext) -> str:
    """Wait a while."""
    await ctx.signal.wait()
    return "stopped"


@tool
async def dump(size: int) -> str:
    """Dump a big file."""
    return "x" * size


def model_with_key(responses: list[Any]) -> ScriptedModel:
    model = ScriptedModel(responses)
    model.api_key = KEY
    return model


# -- every event type serializes, with a stable shape ---------------------------------

#: The keys of each event type's JSON line, in order: what the log pipeline's schema holds.
GOLDEN: dict[str, list[str]] = {
    "turn_started": ["type", "agent_id", "turn", "prompt", "ids", "parent_tool_use_id"],
    "text_delta": ["type", "agent_id", "text"],
    "thinking_delta": ["type", "agent_id", "thinking"],
    "tool_input_delta": ["type", "agent_id", "tool_use_id", "name", "partial_json"],
    "assistant_message": ["type", "agent_id", "message", "stop_reason", "usage"],
    "permission_requested": ["type", "agent_id", "tool_use"],
    "tool_call_started": ["type", "agent_id", "tool_use", "updated_input", "input"],
    "tool_call_finished": ["type", "agent_id", "tool_use", "result", "synthetic", "full_result", "updated_input", "input"],
    "tool_progress": ["type", "agent_id", "tool_use_id", "text"],
    "interjection_injected": ["type", "agent_id", "texts", "ids"],
    "interjection_dropped": ["type", "agent_id", "texts", "ids", "reason"],
    "policy_nudge": ["type", "agent_id", "policy", "reminder"],
    "doom_loop_detected": ["type", "agent_id", "signals", "confident", "action", "policy"],
    "resampling": ["type", "agent_id", "attempt"],
    "retrying": ["type", "agent_id", "attempt", "error", "delay"],
    "attempt_discarded": ["type", "agent_id", "attempt", "reason", "text_chars", "thinking_chars", "usage"],
    "turn_ended": ["type", "agent_id", "reason", "abort_reason", "error", "detail", "usage", "turns", "aborted_subagents"],
}
USAGE_KEYS = ["input_tokens", "output_tokens", "cache_read_tokens", "cache_write_tokens"]


def test_golden_covers_every_event_type() -> None:
    assert sorted(GOLDEN) == sorted(cls.type for cls in get_args(Event))


def retry_then_answer() -> list[ScriptedResponse]:
    billed = ScriptedResponse(
        events=[StreamUsage(Usage(100, 0, cache_read_tokens=60)), StreamText(0, "Hel")],
        error=ModelError("overloaded", retryable=True), error_after=2,
    )
    return [billed, ScriptedResponse(text="Hello.", usage=Usage(100, 5, cache_read_tokens=60))]


async def every_event_kind() -> tuple[list[Event], Telemetry, Pipeline]:
    """One main run that yields every event type (a permission prompt, tools with progress, a
    retry, a doom loop resampled, a stationarity nudge, interjections merged and dropped, a
    subagent); each line goes through the host."""
    looping = ScriptedResponse(thinking="Let me plan.\n" + CHANT, text="never shown", chunk=7)
    same = ScriptedResponse(tool_calls=[ScriptedToolCall("build", {"target": "all"})])
    script: list[Any] = [
        *retry_then_answer()[:1],
        looping,
        ScriptedResponse(text="Building.", tool_calls=[ScriptedToolCall("build", {"target": "lib"}),
                                                       ScriptedToolCall("task", {"task": "Look around."})]),
        "Looked around: fine.",  # the child
        *[same] * 4,
        "Done.",
    ]
    engine = QueryEngine(
        ScriptedModel(script), tools=[build, delegate_tool()], retry_base_delay=0,
        permission=lambda use, ctx: Allow(),
        policies=[ConservativeDoomLoopPolicy(), IdenticalToolCallRun(nudge_at=3, end_at=9)],
    )
    tel = Telemetry()
    asked = False

    def steer(event: Event, eng: QueryEngine) -> None:
        nonlocal asked
        if isinstance(event, ToolCallStarted) and not asked:
            asked = True
            eng.interject("Also check the docs.")

    with pipeline() as pipe:
        events = await observe(engine, "Build it.", tel, steer)
        engine.interject("Late note.")
        engine.interrupt("cancel")  # nothing running: the note waits for the next run
        engine.model = ScriptedModel([ScriptedResponse(text="Slow " * 30, chunk=4, delay=0.001)])

        def stop(event: Event, eng: QueryEngine) -> None:
            if event.type == "text_delta":
                eng.interject("Dropped note.")
                eng.interrupt("cancel")

        events += await observe(engine, None, tel, stop)
    return events, tel, pipe


async def test_every_event_type_serializes_with_its_golden_keys() -> None:
    events, tel, pipe = await every_event_kind()
    seen = {e.type for e in events}
    missing = set(GOLDEN) - seen
    assert missing == set(), f"the scenario yields no {missing}"
    for event, line in zip(events, tel.lines, strict=True):
        data = json.loads(line)
        assert list(data) == GOLDEN[event.type], event.type
        if "usage" in data and data["usage"] is not None:
            assert list(data["usage"]) == USAGE_KEYS
    assert_clean(tel, pipe)


# -- spans from the events alone -------------------------------------------------------


def best_of_two(request: Any) -> ScriptedResponse | str:
    """The parent asks two children the same task at once; each child answers."""
    first = request.messages[0].text
    if first.startswith("Name it"):
        done = [b for m in request.messages for b in m.content if b.type == "tool_result"]
        if done:
            return "Picked one."
        return ScriptedResponse(tool_calls=[ScriptedToolCall("task", {"task": "Draft a title."})] * 2)
    return ScriptedResponse(text="A title.", chunk=3)


async def test_a_subagent_span_is_tied_to_the_parent_call_that_ran_it() -> None:
    """Two children given the same task at once: the host ties each child's spans to its own
    `task` call, which neither the agent id nor the prompt can tell."""
    engine = QueryEngine(ScriptedModel([best_of_two], cycle=True), tools=[delegate_tool()])
    tel = Telemetry()
    events = await observe(engine, "Name it.", tel)
    calls = [e.tool_use.id for e in events if isinstance(e, ToolCallStarted) and e.agent_id is None]
    starts = [e for e in events if isinstance(e, TurnStarted) and e.agent_id is not None]
    assert sorted(e.parent_tool_use_id for e in starts) == sorted(calls)
    children = [s for s in tel.spans if s.kind == "turn" and s.key[1] is not None]
    assert sorted(s.parent[2] for s in children if s.parent) == sorted(calls)
    main_start = next(e for e in events if isinstance(e, TurnStarted) and e.agent_id is None)
    assert main_start.parent_tool_use_id is None
    assert_clean(tel)


async def test_a_grandchild_is_tied_to_the_childs_call() -> None:
    def script(request: Any) -> ScriptedResponse | str:
        first = request.messages[0].text
        done = any(b.type == "tool_result" for m in request.messages for b in m.content)
        if first == "Top." and not done:
            return ScriptedResponse(tool_calls=[ScriptedToolCall("task", {"task": "Middle."})])
        if first == "Middle." and not done:
            return ScriptedResponse(tool_calls=[ScriptedToolCall("task", {"task": "Bottom."})])
        return "ok"

    engine = QueryEngine(ScriptedModel([script], cycle=True), tools=[delegate_tool()])
    tel = Telemetry()
    events = await observe(engine, "Top.", tel)
    starts = {e.agent_id: e for e in events if isinstance(e, TurnStarted)}
    calls = {e.agent_id: e.tool_use.id for e in events if isinstance(e, ToolCallStarted)}
    assert starts["sub-1"].parent_tool_use_id == calls[None]
    assert starts["sub-2"].parent_tool_use_id == calls["sub-1"]
    assert_clean(tel)


async def test_retried_and_resampled_attempts_are_distinct_spans() -> None:
    looping = ScriptedResponse(thinking="Let me plan.\n" + CHANT, text="never shown", chunk=7)
    engine = QueryEngine(ScriptedModel([*retry_then_answer()[:1], looping, "Fine."]), retry_base_delay=0,
                         policies=[ConservativeDoomLoopPolicy()])
    tel = Telemetry()
    await observe(engine, "Go.", tel)
    attempts = [s for s in tel.spans if s.kind == "attempt"]
    assert [s.attrs["outcome"] for s in attempts] == ["retry", "resample", "committed"]
    assert len({s.key for s in attempts}) == 3
    assert_clean(tel)


@st.composite
def sessions(draw: st.DrawFn) -> tuple[list[Any], int]:
    """A random session: responses calling quick and slow tools in batches, children, text;
    and the event after which the host interrupts (past the end: never)."""
    script: list[Any] = []
    for _ in range(draw(st.integers(1, 4))):
        calls = draw(st.lists(st.sampled_from(["build", "slow", "task", "dump"]), max_size=4))
        made = [ScriptedToolCall(n, {"target": "a"} if n == "build" else {"n": 1} if n == "slow"
                                 else {"size": 10} if n == "dump" else {"task": "Sub."}) for n in calls]
        script.append(ScriptedResponse(text=draw(st.sampled_from(["", "Working on it. "])), tool_calls=made, chunk=4))
    script.append("All done.")
    return script, draw(st.integers(0, 60))


def answer_children(script: list[Any]) -> Any:
    plays = iter(script)

    def respond(request: Any) -> Any:
        if request.messages[0].text == "Sub.":
            return "Sub done."
        return next(plays, "All done.")

    return respond


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(sessions())
def test_spans_pair_and_close_whatever_the_interrupt_instant(case: tuple[list[Any], int]) -> None:
    script, at = case

    async def main() -> None:
        engine = QueryEngine(ScriptedModel([answer_children(script)], cycle=True),
                             tools=[build, slow, dump, delegate_tool()], tool_cancel_grace=0.5)
        tel = Telemetry()
        count = 0

        def maybe_stop(event: Event, eng: QueryEngine) -> None:
            nonlocal count
            count += 1
            if count == at or (isinstance(event, ToolCallStarted) and event.tool_use.name == "slow"):
                eng.interrupt("cancel")

        events = await observe(engine, "Start.", tel, maybe_stop)
        assert events[-1].type == "turn_ended" and events[-1].agent_id is None
        starts = [e.tool_use.id for e in events if isinstance(e, ToolCallStarted)]
        ends = [e.tool_use.id for e in events if isinstance(e, ToolCallFinished)]
        assert len(ends) == len(set(ends)) and set(starts) <= set(ends)
        ended = events[-1]
        assert isinstance(ended, TurnEnded)
        cut_off = set(ended.aborted_subagents)
        # a child the abort cut off may leave its own turn without a TurnEnded: documented
        for key in list(tel.open):
            if key[1] in cut_off:
                tel.open.pop(key)
        assert_clean(tel)

    asyncio.run(main())


# -- bounded payloads -------------------------------------------------------------------


async def test_a_5mb_tool_result_does_not_make_a_5mb_log_line() -> None:
    engine = QueryEngine(ScriptedModel([ScriptedResponse(tool_calls=[ScriptedToolCall("dump", {"size": 5_000_000})]),
                                        "Big."]), tools=[dump])
    tel = Telemetry()
    events = await observe(engine, "Dump.", tel)
    finished = next(e for e in events if isinstance(e, ToolCallFinished))
    assert finished.full_result is not None and len(finished.full_result.text) == 5_000_000  # kept for the host
    line = event_json(finished, max_text_chars=2000)
    assert len(line) < 10_000
    data = json.loads(line)
    assert list(data) == GOLDEN["tool_call_finished"]
    assert "5000000" in line or "4998000" in line  # it says how much was left out
    assert max(len(event_json(e, max_text_chars=2000)) for e in events) < 10_000
    assert event_json(finished) == tel.lines[events.index(finished)]  # by default: every character


# -- usage: per attempt, per turn, per subagent -------------------------------------------


def own_usage(events: list[Event], agent: str | None) -> Usage:
    """What the host's attempt spans of one agent add up to (documented: each attempt's tokens
    on its `AssistantMessage` or its `AttemptDiscarded`)."""
    total = Usage()
    for e in events:
        if isinstance(e, AssistantMessage | AttemptDiscarded) and e.agent_id == agent:
            total = total + e.usage
    return total


async def test_attempt_usage_adds_up_to_the_turn_with_retries_and_cached_tokens() -> None:
    engine = QueryEngine(ScriptedModel(retry_then_answer()), retry_base_delay=0)
    tel = Telemetry()
    events = await observe(engine, "Hi.", tel)
    discarded = next(e for e in events if isinstance(e, AttemptDiscarded))
    assert discarded.reason == "retry" and discarded.usage == Usage(100, 0, cache_read_tokens=60)
    answer = next(e for e in events if isinstance(e, AssistantMessage))
    assert answer.usage == Usage(100, 5, cache_read_tokens=60)
    end = events[-1]
    assert isinstance(end, TurnEnded) and end.usage == own_usage(events, None) == Usage(200, 5, cache_read_tokens=120)
    assert [s.attrs["usage"] for s in tel.spans if s.kind == "attempt"] == [discarded.usage, answer.usage]
    assert json.loads(tel.lines[events.index(answer)])["usage"] == {
        "input_tokens": 100, "output_tokens": 5, "cache_read_tokens": 60, "cache_write_tokens": 0}
    assert_clean(tel)


async def test_a_failed_attempt_that_streamed_nothing_still_reports_its_tokens() -> None:
    billed = ScriptedResponse(events=[StreamUsage(Usage(300, 0, cache_write_tokens=300))],
                              error=ModelError("overloaded", retryable=True), error_after=1)
    engine = QueryEngine(ScriptedModel([billed, "Fine."]), retry_base_delay=0)
    events = await observe(engine, "Hi.", Telemetry())
    discarded = [e for e in events if isinstance(e, AttemptDiscarded)]
    assert [(d.text_chars, d.usage) for d in discarded] == [(0, Usage(300, 0, cache_write_tokens=300))]
    end = events[-1]
    assert isinstance(end, TurnEnded) and end.usage == own_usage(events, None)


async def test_subagent_usage_is_charged_to_the_parent_once() -> None:
    def script(request: Any) -> ScriptedResponse | str:
        done = any(b.type == "tool_result" for m in request.messages for b in m.content)
        if request.messages[0].text == "Sub.":
            return ScriptedResponse(text="sub answer", usage=Usage(7, 3, cache_read_tokens=2))
        if done:
            return ScriptedResponse(text="main answer", usage=Usage(50, 5))
        return ScriptedResponse(tool_calls=[ScriptedToolCall("task", {"task": "Sub."})] * 2, usage=Usage(40, 4))

    engine = QueryEngine(ScriptedModel([script], cycle=True), tools=[delegate_tool()])
    events = await observe(engine, "Main.", Telemetry())
    ends = {e.agent_id: e for e in events if isinstance(e, TurnEnded)}
    for child in ("sub-1", "sub-2"):
        assert ends[child].usage == own_usage(events, child) == Usage(7, 3, cache_read_tokens=2)
    children = ends["sub-1"].usage + ends["sub-2"].usage
    assert ends[None].usage == own_usage(events, None) + children == Usage(104, 15, cache_read_tokens=4)


async def test_per_turn_usage_is_the_difference_of_the_runs_totals() -> None:
    slow_text = ScriptedResponse(text="Long answer " * 20, chunk=3, delay=0.001, usage=Usage(30, 9))
    engine = QueryEngine(ScriptedModel(["First.", slow_text, ScriptedResponse(text="Now.", usage=Usage(60, 2))]))
    sent = False

    def redirect(event: Event, eng: QueryEngine) -> None:
        nonlocal sent
        if event.type == "text_delta" and not sent:
            sent = True
            eng.send_now("Stop, do this instead.")

    await observe(engine, "One.", Telemetry())
    events = await observe(engine, "Two.", Telemetry(), redirect)
    ends = [e for e in events if isinstance(e, TurnEnded)]
    assert [e.reason for e in ends] == ["aborted_streaming", "completed"]
    # the cut attempt never reached its end: no tokens reported for it; the run's total is the sum
    first, last = ends[0].usage, ends[-1].usage
    second = Usage(*(getattr(last, k) - getattr(first, k) for k in USAGE_KEYS))
    assert second == own_usage(events[events.index(ends[0]):], None) == Usage(60, 2)


# -- the agentloop logger through the JSON formatter --------------------------------------


async def test_a_users_interrupt_logs_nothing_at_warning_or_above() -> None:
    engine = QueryEngine(ScriptedModel([ScriptedResponse(
        text="Let me build. ", tool_calls=[ScriptedToolCall("slow", {"n": 1}), ScriptedToolCall("task", {"task": "x"})])]),
        tools=[slow, delegate_tool()])

    def stop(event: Event, eng: QueryEngine) -> None:
        if isinstance(event, ToolCallStarted):
            eng.interrupt("cancel")

    with pipeline() as pipe:
        tel = Telemetry()
        events = await observe(engine, "Build.", tel, stop)
    end = events[-1]
    assert isinstance(end, TurnEnded) and end.reason == "aborted_tools"
    assert [r.getMessage() for r in pipe.records if r.levelno >= logging.WARNING] == []
    assert_clean(tel, pipe)


class Leaky(Policy):
    """A host policy with a bug: it raises with the request's key in the message."""

    name = "leaky"

    def on_response(self, message: Message) -> None:
        raise RuntimeError(f"could not audit: x-api-key: {KEY}")


@tool
async def printenv() -> str:
    """Print the environment."""
    return f"HOME=/root\nANTHROPIC_API_KEY={KEY}\n"


async def test_no_secret_in_any_event_line_or_json_log_record() -> None:
    server = AnthropicServer(KEY, [Reply(calls=[Call("printenv", {})]), Reply(text="Done.")])
    async with server.client() as client:
        engine = QueryEngine(AnthropicModel("claude-opus-4-7", api_key=KEY, http_client=client),
                             tools=[printenv], policies=[Leaky()])
        tel = Telemetry()
        with pipeline() as pipe:
            events = await observe(engine, "Show the env.", tel)
    assert isinstance(events[-1], TurnEnded) and events[-1].reason == "completed"
    errors = [json.loads(line) for line in pipe.lines if json.loads(line)["level"] == "ERROR"]
    assert errors and all("[REDACTED]" in e["message"] + e.get("exc", "") for e in errors)
    assert any("[REDACTED]" in line for line in tel.lines)
    assert_clean(tel, pipe)


def test_max_text_chars_is_checked_and_keeps_short_lines_as_they_are() -> None:
    event = ToolProgress(tool_use_id="t1", text="make: ok")
    assert event_json(event, max_text_chars=100) == event_json(event)
    assert json.loads(event_json(event, max_text_chars=0))["text"] == "[... 8 characters left out ...]"
    with pytest.raises(TypeError):
        event_json(event, max_text_chars="100")  # type: ignore[arg-type]
    with pytest.raises(ValueError):
        event_json(event, max_text_chars=-1)
