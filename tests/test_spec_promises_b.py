"""SPEC.md §6-11 and API.md, each promise as stated, at its edges."""

from __future__ import annotations

import inspect
import typing
from collections.abc import AsyncIterator, Sequence
from typing import Any

import httpx
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import agentloop
import agentloop.models
import agentloop.policies
from agentloop import (
    AbortController,
    AbortSignal,
    DoomLoopDetected,
    Event,
    ModelError,
    PolicyNudge,
    PromptTooLongError,
    QueryEngine,
    Resampling,
    ScriptedModel,
    ScriptedResponse,
    ScriptedToolCall,
    TextDelta,
    ToolCallFinished,
    ToolContext,
    TurnEnded,
    delegate_tool,
    tool,
    validate_transcript,
)
from agentloop.models import (
    ModelRequest,
    OpenAIResponsesModel,
    StreamBlockStop,
    StreamEnd,
    StreamSignals,
    StreamText,
    StreamThinking,
    StreamToolInput,
    StreamToolUseStart,
    StreamUsage,
    Usage,
)
from agentloop.policies import ConservativeDoomLoopPolicy, EndTurn, IdenticalToolCallRun, Policy
from agentloop.testing import collect
from tests.test_host_policies import responses_stream


def calls(*names: str, **inputs: Any) -> ScriptedResponse:
    return ScriptedResponse(tool_calls=[ScriptedToolCall(n, dict(inputs)) for n in names])


def ends(events: Sequence[Event]) -> list[TurnEnded]:
    return [e for e in events if isinstance(e, TurnEnded) and e.agent_id is None]


def results(events: Sequence[Event]) -> list[ToolCallFinished]:
    return [e for e in events if isinstance(e, ToolCallFinished) and e.agent_id is None]


@tool
async def step() -> str:
    """One step."""
    return "done"


# -- §8 --------------------------------------------------------------------------------------------


@pytest.mark.parametrize("needed", [1, 2, 3])
async def test_s8_max_turns_at_its_bound_completes_and_one_past_ends(needed: int) -> None:
    """A run that needs exactly ``max_turns`` requests completes; one that needs one more ends
    with ``max_turns`` after exactly ``max_turns`` requests, its transcript valid."""
    script = [calls("step")] * (needed - 1) + ["fine"]
    engine = QueryEngine(ScriptedModel(script), tools=[step], policies=[], max_turns=needed)
    events = await collect(engine.run("go"))
    assert [e.reason for e in ends(events)] == ["completed"]
    model = ScriptedModel([calls("step")] * (needed + 1) + ["fine"])
    engine = QueryEngine(model, tools=[step], policies=[], max_turns=needed)
    events = await collect(engine.run("go"))
    end = ends(events)
    assert [e.reason for e in end] == ["max_turns"]
    assert end[0].turns == needed
    assert validate_transcript(engine.messages) == []


async def test_s8_a_deadline_that_has_passed_ends_the_turn_before_the_next_request() -> None:
    """The deadline is wall clock: once it has passed, no further model request goes out, even when
    nothing in the run has waited on the event loop since (a model that streams without waiting,
    ``deadline=0``)."""
    model = ScriptedModel(["never sent"])
    engine = QueryEngine(model, policies=[], deadline=0)
    events = await collect(engine.run("go"))
    assert [(e.reason, e.abort_reason) for e in ends(events)] == [("deadline", "deadline")]
    assert model.requests == []
    assert validate_transcript(engine.messages) == []



# -- §11 -------------------------------------------------------------------------------------------


class RawModel:
    """Streams the given stream events for each request, then ends the response."""

    def __init__(self, *scripts: Sequence[object]) -> None:
        self.scripts = list(scripts)
        self.requests: list[ModelRequest] = []

    async def stream(self, request: ModelRequest, signal: AbortSignal) -> AsyncIterator[Any]:
        self.requests.append(request)
        for event in self.scripts.pop(0) if self.scripts else [StreamText(0, "ok")]:
            yield event
        yield StreamEnd("end_turn")


@pytest.mark.parametrize(
    "usage",
    [None, "12", Usage(-5, 3), Usage(5, "3"), Usage(True, 1), Usage(1, 1, None), Usage(1.5, 0)],  # type: ignore[arg-type]
)
async def test_s11_a_usage_report_that_is_no_count_of_tokens_is_a_malformed_stream(usage: object) -> None:
    """A model stream reporting usage that is no set of token counts ends the run with a terminal
    that says so (after the retries a malformed stream earns), never an exception out of run()."""
    model = RawModel(*[[StreamText(0, "a"), StreamUsage(usage)]] * 5)  # type: ignore[arg-type]
    engine = QueryEngine(model, policies=[], retry_budget=1, retry_base_delay=0)
    events = await collect(engine.run("go"))
    end = ends(events)
    assert [e.reason for e in end] == ["model_error"]
    assert end[0].error is not None and "usage" in end[0].error
    assert validate_transcript(engine.messages) == []
    engine = QueryEngine(RawModel([StreamText(0, "a"), StreamEnd("end_turn", usage)]), policies=[], retry_budget=0)  # type: ignore[arg-type]
    if usage is not None:
        events = await collect(engine.run("go"))
        assert [e.reason for e in ends(events)] == ["model_error"]
        assert validate_transcript(engine.messages) == []



class _Tokens(int):
    """An integral count of another type (as a numpy integer is)."""


class _PricedUsage(Usage):
    """A host's own usage type with a field of its own."""

    cost: float = 0.25


@pytest.mark.parametrize(
    ("usage", "counted"),
    [
        (Usage(12.0, 3), Usage(12, 3)),  # type: ignore[arg-type]
        (Usage(_Tokens(7), _Tokens(2)), Usage(7, 2)),
        (_PricedUsage(4, 5), Usage(4, 5)),
    ],
)
async def test_s11_a_usage_of_whole_counts_of_another_type_is_counted_not_refused(usage: Usage, counted: Usage) -> None:
    """A model of the host's own reporting whole counts as floats, integral numbers of another
    type, or a subclass of Usage: counted as ints (no retry, no model_error)."""
    for events in ([StreamText(0, "a"), StreamUsage(usage)], [StreamText(0, "a"), StreamEnd("end_turn", usage)]):
        engine = QueryEngine(RawModel(events), policies=[], retry_budget=0)
        end = ends(await collect(engine.run("go")))
        assert [(e.reason, e.usage) for e in end] == [("completed", counted)]
        got = end[0].usage
        assert {type(n) for n in (got.input_tokens, got.output_tokens, got.cache_read_tokens, got.cache_write_tokens)} == {int}
        assert isinstance(end[0].usage, Usage)


def test_s11_an_engine_with_a_parent_and_no_agent_id_is_refused() -> None:
    """A child engine without an id would pass for the main engine in events and sessions."""
    parent = QueryEngine(ScriptedModel(["ok"]))
    with pytest.raises(TypeError, match="agent_id"):
        QueryEngine(ScriptedModel(["ok"]), parent=parent)
    with pytest.raises(TypeError, match="agent_id"):
        parent.subagent(agent_id=None)  # type: ignore[arg-type]


@pytest.mark.parametrize(("env", "expected"), [("0", False), ("1", True), ("", True)])
def test_s6_doom_loop_recovery_set_to_none_lets_the_environment_decide_as_at_construction(
    monkeypatch: pytest.MonkeyPatch, env: str, expected: bool
) -> None:
    """``engine.doom_loop_recovery = None`` is what ``QueryEngine(doom_loop_recovery=None)`` is."""
    monkeypatch.setenv("AGENTLOOP_DOOM_LOOP_RECOVERY", env)
    engine = QueryEngine(ScriptedModel(["ok"]), doom_loop_recovery=not expected)
    engine.doom_loop_recovery = None  # type: ignore[assignment]
    assert engine.doom_loop_recovery is expected
    assert QueryEngine(ScriptedModel(["ok"]), doom_loop_recovery=None).doom_loop_recovery is expected
    with pytest.raises(TypeError, match="doom_loop_recovery"):
        engine.doom_loop_recovery = "false"  # type: ignore[assignment]


# -- §6 --------------------------------------------------------------------------------------------


async def test_s6_the_replay_is_cut_to_8_kb_of_reasoning_and_4_kb_of_text_and_goes_with_the_retry_only() -> None:
    """A confident signal after 20 KB of reasoning and 10 KB of text: the retry's reminder replays
    at most 8 KB and 4 KB of them (their beginnings); the transcript keeps neither."""
    thinking = "".join(f"thought {i}; " for i in range(2000))  # ~25 KB, no repetition
    text = "".join(f"word{i} " for i in range(1500))  # ~10 KB
    looping = ScriptedResponse(
        events=[
            StreamThinking(0, thinking),
            StreamText(1, text),
            StreamSignals(("tail_repetition:32@thinking",)),
            StreamEnd("end_turn"),
        ]
    )
    model = ScriptedModel([looping, "Fixed it."])
    engine = QueryEngine(model, policies=[ConservativeDoomLoopPolicy()], retry_base_delay=0)
    events = await collect(engine.run("fix it"))
    assert [e.attempt for e in events if isinstance(e, Resampling)] == [1]
    reminder = model.requests[1].messages[-1]
    assert reminder.synthetic
    replayed_thinking = reminder.text.split("<previous_reasoning>\n", 1)[1].split("\n</previous_reasoning>", 1)[0]
    replayed_text = reminder.text.split("<previous_text>\n", 1)[1].split("\n</previous_text>", 1)[0]
    assert 8 * 1024 - 16 <= len(replayed_thinking.encode()) <= 8 * 1024 and thinking.startswith(replayed_thinking)
    assert 4 * 1024 - 16 <= len(replayed_text.encode()) <= 4 * 1024 and text.startswith(replayed_text)
    assert [m.text for m in engine.messages] == ["fix it", "Fixed it."]
    assert validate_transcript(engine.messages) == []


@pytest.mark.parametrize(("threshold", "confident"), [(1, True), (64, True), (65, False)])
async def test_s6_the_default_policy_cuts_at_max_threshold_and_only_warns_one_past(threshold: int, confident: bool) -> None:
    """With the default policies (``policies=None``), a server's thinking-channel tail repetition
    of period 64 is cut and resampled; one of 65 only warns, and its attempt is kept."""
    frame = ScriptedResponse(
        events=[StreamThinking(0, "hmm"), StreamSignals((f"tail_repetition:{threshold}@thinking",)), StreamText(1, "kept"), StreamEnd("end_turn")]
    )
    engine = QueryEngine(ScriptedModel([frame, "resampled"]), retry_base_delay=0)
    events = await collect(engine.run("go"))
    detected = [e for e in events if isinstance(e, DoomLoopDetected)]
    assert [(d.confident, d.action) for d in detected] == [(True, "resample")] if confident else [(False, "warn")]
    assert engine.messages[-1].text == ("resampled" if confident else "kept")
    assert [e.reason for e in ends(events)] == ["completed"]


@pytest.mark.parametrize("budget", [0, 1, 2, 3])
async def test_s6_the_doom_budget_bounds_the_resamples_and_the_attempt_after_it_is_accepted(budget: int) -> None:
    """Exactly ``doom_budget`` resamples, the transport retry budget untouched (0 here), then the
    detector disarms: the next attempt runs to its end and is the answer."""
    looping = ScriptedResponse(
        events=[StreamThinking(0, "hmm"), StreamSignals(("tail_repetition:8@thinking",)), StreamText(1, "loop"), StreamEnd("end_turn")]
    )
    model = ScriptedModel([looping] * (budget + 1) + ["never asked"])
    engine = QueryEngine(model, doom_budget=budget, retry_budget=0, retry_base_delay=0)
    events = await collect(engine.run("go"))
    assert len([e for e in events if isinstance(e, Resampling)]) == budget
    assert [d.action for d in events if isinstance(d, DoomLoopDetected)] == ["resample"] * budget + ["disarmed"]
    assert len(model.requests) == budget + 1
    assert engine.messages[-1].text == "loop" and [e.reason for e in ends(events)] == ["completed"]
    assert validate_transcript(engine.messages) == []


# -- §7 --------------------------------------------------------------------------------------------


@tool
async def read_file(path: str) -> str:
    """Read a file."""
    return "same content"


@tool(stationarity="tight")
async def todo(items: list[str]) -> str:
    """Write the todo list."""
    return "ok"


@tool
async def shell(cmd: str) -> str:
    """Run a shell command."""
    return ""


@pytest.mark.parametrize(
    ("response", "tools", "nudge_at", "end_at"),
    [
        (calls("read_file", path="a.py"), [read_file], 8, 12),
        (calls("todo", items=["x"]), [todo], 4, 8),
        (calls("shell", cmd="true"), [shell], None, 4),
        (calls("shell", cmd=":"), [shell], None, 4),
    ],
)
@pytest.mark.parametrize("offset", [-1, 0])
async def test_s7_each_threshold_at_its_bound_and_one_before(
    response: ScriptedResponse, tools: list[Any], nudge_at: int | None, end_at: int, offset: int
) -> None:
    """``n`` identical responses, then an answer: the nudge comes with the ``nudge_at``-th, and
    the turn ends quietly with ``stationarity_ended`` at the ``end_at``-th, not one before."""
    n = end_at + offset
    engine = QueryEngine(ScriptedModel([response] * n + ["done"]), tools=tools, policies=[IdenticalToolCallRun()])
    events = await collect(engine.run("go"))
    nudges = [e for e in events if isinstance(e, PolicyNudge)]
    end = ends(events)
    if offset == 0:
        assert [(e.reason, e.turns) for e in end] == [("stationarity_ended", end_at)]
    else:
        assert [(e.reason, e.turns) for e in end] == [("completed", n + 1)]
    assert len(nudges) == (0 if nudge_at is None or n < nudge_at else 1)
    if nudges:  # the reminder goes with the request after the nudge_at-th response
        nudged = next(i for i, m in enumerate(engine.messages) if m.kind == "nudge")
        assert sum(1 for m in engine.messages[:nudged] if m.role == "assistant") == nudge_at
    assert validate_transcript(engine.messages) == []


# -- §11: host calls with the wrong types ----------------------------------------------------------


@pytest.mark.parametrize("agent_id", [None, 3, b"sub", ["sub"], "", "   "])
def test_s11_a_subagent_id_that_is_no_name_is_refused(agent_id: object) -> None:
    """A subagent's events and sidechain are told apart by its id: ``None`` (its events would pass
    for the main engine's), a number, bytes or a blank is refused at once, not run with."""
    engine = QueryEngine(ScriptedModel(["x"]), policies=[])
    with pytest.raises((TypeError, ValueError), match="agent_id"):
        engine.subagent(agent_id=agent_id)  # type: ignore[arg-type]
    if agent_id is not None:
        with pytest.raises((TypeError, ValueError), match="agent_id"):
            QueryEngine(ScriptedModel(["x"]), agent_id=agent_id)  # type: ignore[arg-type]


@pytest.mark.parametrize("parent", ["main", 3, AbortController()])
def test_s11_a_parent_that_is_no_engine_is_a_type_error(parent: object) -> None:
    with pytest.raises(TypeError, match="parent takes a QueryEngine"):
        QueryEngine(ScriptedModel(["x"]), parent=parent, agent_id="sub-1")  # type: ignore[arg-type]


@pytest.mark.parametrize("value", ["false", "true", 0, 1, "off"])
def test_s11_doom_loop_recovery_takes_a_bool_not_a_string_read_from_a_config(value: object) -> None:
    """``doom_loop_recovery="false"`` would switch recovery on (a non-empty string is true)."""
    with pytest.raises(TypeError, match="doom_loop_recovery takes True, False or None"):
        QueryEngine(ScriptedModel(["x"]), doom_loop_recovery=value)  # type: ignore[arg-type]


@pytest.mark.parametrize("fn", [None, 3, "cleanup"])
def test_s11_a_hook_or_listener_that_cannot_be_called_is_refused_when_given(fn: object) -> None:
    """Not logged as a failure at the abort, far from the mistake: a TypeError where it is made."""
    engine = QueryEngine(ScriptedModel(["x"]), policies=[])
    with pytest.raises(TypeError, match="on_abort takes a callable"):
        engine.on_abort(fn)  # type: ignore[arg-type]
    controller = AbortController()
    with pytest.raises(TypeError, match="add_listener takes a callable"):
        controller.signal.add_listener(fn)  # type: ignore[arg-type]
    controller.abort()
    with pytest.raises(TypeError, match="add_listener takes a callable"):
        controller.signal.add_listener(fn)  # type: ignore[arg-type]


# -- API.md: each name with the signature and defaults it lists --------------------------------------


def _params(fn: Any) -> dict[str, tuple[str, Any]]:
    return {n: (p.kind.name, p.default) for n, p in inspect.signature(fn).parameters.items() if n != "self"}


E = inspect.Parameter.empty
KW = "KEYWORD_ONLY"
POS = "POSITIONAL_OR_KEYWORD"

API_SIGNATURES: list[tuple[str, dict[str, tuple[str, Any]]]] = [
    ("AbortController", {"parent": (KW, None)}),
    ("AbortController.abort", {"reason": (POS, "cancel")}),
    ("AbortSignal.timeout", {"seconds": (POS, E), "reason": (POS, "deadline")}),
    ("AbortSignal.any", {"signals": (POS, E)}),
    ("AbortSignal.add_listener", {"fn": (POS, E)}),
    ("AbortSignal.throw_if_aborted", {}),
    ("AbortSignal.wait", {}),
    ("tool", {"fn": (POS, None), "name": (KW, None), "description": (KW, None), "concurrency_safe": (KW, False),
              "timeout": (KW, None), "stationarity": (KW, "normal")}),
    ("run_process", {"args": ("VAR_POSITIONAL", E), "signal": (KW, E), "timeout": (KW, None), "kw": ("VAR_KEYWORD", E)}),
    ("QueryEngine", {"model": (POS, E), "tools": (KW, ()), "system": (KW, None), "messages": (KW, ()),
                     "policies": (KW, None), "max_turns": (KW, None), "max_parallel_tools": (KW, 10),
                     "tool_cancel_grace": (KW, 2.0), "permission": (KW, None), "follow_up_behavior": (KW, "queue"),
                     "interrupt_notice": (KW, "append"), "doom_loop_recovery": (KW, None), "doom_budget": (KW, 2),
                     "retry_budget": (KW, 3), "parent": (KW, None), "agent_id": (KW, None)}),
    ("QueryEngine.run", {"prompt": (POS, None)}),
    ("QueryEngine.interrupt", {"reason": (POS, "cancel")}),
    ("QueryEngine.send_now", {"text": (POS, E)}),
    ("QueryEngine.interject", {"text": (POS, E)}),
    ("QueryEngine.follow_up", {"text": (POS, E)}),
    ("QueryEngine.submit", {"text": (POS, E)}),
    ("QueryEngine.subagent", {"agent_id": (KW, E), "overrides": ("VAR_KEYWORD", E)}),
    ("QueryEngine.on_abort", {"fn": (POS, E), "main_only": (KW, False)}),
    ("Allow", {"updated_input": (POS, None)}),
    ("Deny", {"message": (POS, E)}),
    ("validate_transcript", {"messages": (POS, E)}),
    ("repair_transcript", {"messages": (POS, E)}),
    ("ScriptedModel", {"responses": (POS, E)}),
    ("DoomLoopSignal", {"kind": (POS, E), "channel": (POS, E), "threshold": (POS, None), "tokens": (POS, None), "copies": (POS, None)}),
    ("DoomLoopSignal.parse", {"text": (POS, E)}),
    ("models.AnthropicModel", {"model": (POS, E), "api_key": (KW, None), "base_url": (KW, None), "http_client": (KW, None),
                               "max_tokens": (KW, 4096), "thinking": (KW, None)}),
    ("models.OpenAIChatModel", {"model": (POS, E), "api_key": (KW, None), "base_url": (KW, None), "http_client": (KW, None)}),
    ("models.OpenAIResponsesModel", {"model": (POS, E), "api_key": (KW, None), "base_url": (KW, None),
                                     "http_client": (KW, None), "doom_loop_check": (KW, False)}),
    ("policies.ConservativeDoomLoopPolicy", {"max_threshold": (POS, 64)}),
    ("policies.IdenticalToolCallRun", {"nudge_at": (POS, 8), "end_at": (POS, 12), "tight_nudge_at": (POS, 4),
                                       "tight_end_at": (POS, 8), "keepalive_end_at": (POS, 4)}),
]


@pytest.mark.parametrize(("path", "listed"), API_SIGNATURES, ids=[p for p, _ in API_SIGNATURES])
def test_api_each_signature_keeps_the_parameters_and_defaults_api_md_lists(path: str, listed: dict[str, tuple[str, Any]]) -> None:
    """Every parameter API.md lists is there, of its kind, with its default, in its order; what
    the code adds is optional and comes after them, so no call API.md shows changes meaning."""
    obj: Any = agentloop
    for part in path.split("."):
        obj = getattr(obj, part)
    params = _params(obj)
    assert {n: params.get(n) for n in listed} == listed
    assert [n for n in params if n in listed] == list(listed)
    names = list(params)
    last = max(names.index(n) for n in listed) if listed else -1
    for name, (kind, default) in params.items():
        if name not in listed:
            assert default is not E or kind == "VAR_KEYWORD", f"{path}: {name} is an addition that is not optional"
            assert kind == KW or names.index(name) > last, f"{path}: {name} is put before a listed parameter"


def test_api_the_listed_fields_and_types_are_there() -> None:
    from agentloop.policies import DoomLoopPolicy, RepetitionDetector, StationarityPolicy

    assert issubclass(agentloop.policies.ConservativeDoomLoopPolicy, DoomLoopPolicy)
    assert issubclass(agentloop.policies.IdenticalToolCallRun, StationarityPolicy)
    assert callable(RepetitionDetector)
    assert issubclass(agentloop.AbortError, Exception) and agentloop.AbortError("x").reason == "x"
    assert isinstance(agentloop.AbortSignal.aborted, property) and isinstance(agentloop.AbortSignal.reason, property)
    assert typing.get_args(agentloop.TerminalReason) == (
        "completed", "aborted_streaming", "aborted_tools", "max_turns", "stationarity_ended",
        "usage_limit", "deadline", "model_error", "prompt_too_long", "hook_stopped",
    )
    assert agentloop.ToolResultBlock(tool_use_id="t", content="x").is_error is False
    block_types = {
        "TextBlock": "text", "ThinkingBlock": "thinking", "RedactedThinkingBlock": "redacted_thinking",
        "ToolUseBlock": "tool_use", "ToolResultBlock": "tool_result",
    }
    for name, tag in block_types.items():
        assert getattr(agentloop, name).model_fields["type"].default == tag
    message = agentloop.Message(role="user", content=[agentloop.TextBlock(text="x")])
    assert message.partial is False and message.synthetic is False
    events = {
        "TurnStarted": (), "TextDelta": ("text",), "ThinkingDelta": ("thinking",), "AssistantMessage": ("message",),
        "ToolCallStarted": ("tool_use",), "ToolCallFinished": ("tool_use", "result"), "InterjectionInjected": ("texts",),
        "PolicyNudge": ("policy", "reminder"), "DoomLoopDetected": ("signals", "confident"), "Resampling": ("attempt",),
        "Retrying": ("attempt", "error", "delay"), "TurnEnded": ("reason", "abort_reason", "error"),
    }
    for name, fields in events.items():
        params = _params(getattr(agentloop, name))
        assert all(f in params for f in fields), name
        assert isinstance(getattr(getattr(agentloop, name), "type", None), str), name
    made = tool(name="t", description="d", concurrency_safe=True, timeout=3.0, stationarity="tight")(_noop)
    assert (made.name, made.description, made.concurrency_safe, made.timeout, made.stationarity) == ("t", "d", True, 3.0, "tight")
    assert made.input_schema["type"] == "object"
    assert "ctx" not in made.input_schema.get("properties", {})


async def _noop(n: int, ctx: ToolContext) -> str:
    """Nothing."""
    return ""


# -- §9: limits and terminals inside subagents -------------------------------------------------------


@tool
async def step_tool() -> str:
    """One step."""
    return "done"


class _StopAtCalls(Policy):
    def on_response(self, message: Any, *, engine: Any = None) -> EndTurn | None:
        return EndTurn("stop it", reason="hook_stopped") if message.tool_uses else None


@tool
async def stop_myself(ctx: ToolContext) -> str:
    """The subagent interrupts itself."""
    ctx.engine.interrupt("cancel")
    return "stopped"


CHILD_ENDINGS: list[tuple[str, Any, dict[str, Any]]] = [
    ("max_turns", [calls("step_tool")] * 5, {"max_turns": 2}),
    ("usage_limit", [calls("step_tool")] * 5, {"usage_limit": 30}),
    ("deadline", [calls("step_tool")] * 5, {"deadline": 0}),
    ("model_error", [ScriptedResponse(error=ModelError("no such model"))], {"retry_budget": 0}),
    ("prompt_too_long", [ScriptedResponse(error=PromptTooLongError("too long", provider="x", status=400))], {}),
    ("stationarity_ended", [calls("shell", cmd="true")] * 5, {"policies": [IdenticalToolCallRun()]}),
    ("hook_stopped", [calls("step_tool")] * 5, {"policies": [_StopAtCalls()]}),
    ("aborted_tools", [calls("stop_myself"), "never"], {}),
]


@pytest.mark.parametrize(("terminal", "script", "settings"), CHILD_ENDINGS, ids=[t for t, _, _ in CHILD_ENDINGS])
async def test_s9_a_subagents_terminal_reaches_the_parent_as_an_error_result(
    terminal: str, script: list[Any], settings: dict[str, Any]
) -> None:
    """Whatever ends a subagent's turn, the parent gets an error tool result that names it, its
    own run goes on to its answer, and both transcripts stay valid; a child's own abort never
    aborts the parent."""
    children: list[QueryEngine] = []

    @tool
    async def task(ctx: ToolContext) -> str:
        """Delegate."""
        child = ctx.engine.subagent(agent_id="sub-1", model=ScriptedModel(script), **settings)
        children.append(child)
        events = await collect(child.run("do it"))
        end = ends_of(events, "sub-1")
        assert [e.reason for e in end] == [terminal]
        raise RuntimeError(f"subagent stopped: {end[0].reason}")

    model = ScriptedModel([calls("task"), "parent done"])
    engine = QueryEngine(model, tools=[task, step_tool, shell, stop_myself], policies=[])
    events = await collect(engine.run("go"))
    assert [e.reason for e in ends(events)] == ["completed"]
    [finished] = results(events)
    assert finished.result.is_error and terminal in str(finished.result.content)
    assert engine.messages[-1].text == "parent done"
    assert validate_transcript(engine.messages) == [] and validate_transcript(children[0].messages) == []


@pytest.mark.parametrize(("terminal", "script", "settings"), CHILD_ENDINGS, ids=[t for t, _, _ in CHILD_ENDINGS])
async def test_s9_the_delegate_tool_reports_each_subagent_terminal(terminal: str, script: list[Any], settings: dict[str, Any]) -> None:
    parent = ScriptedModel([ScriptedResponse(tool_calls=[ScriptedToolCall("task", {"task": "do"})]), "parent done"])
    delegate = delegate_tool(model=ScriptedModel(script), **settings)
    engine = QueryEngine(parent, tools=[delegate, step_tool, shell, stop_myself], policies=[])
    events = await collect(engine.run("go"))
    assert [e.reason for e in ends(events)] == ["completed"]
    assert [e.reason for e in ends_of(events, "sub-1")] == [terminal]
    [finished] = results(events)
    assert finished.result.is_error and f"({terminal}" in str(finished.result.content)
    assert validate_transcript(engine.messages) == []


def ends_of(events: Sequence[Event], agent_id: str) -> list[TurnEnded]:
    return [e for e in events if isinstance(e, TurnEnded) and e.agent_id == agent_id]


# -- §10 ---------------------------------------------------------------------------------------------


_RESPONSES = st.sampled_from(
    [
        ScriptedResponse(text="an answer"),
        calls("step"),
        calls("step", "step"),
        calls("shell", cmd="true"),
        ScriptedResponse(error=ModelError("overloaded", retryable=True)),
        ScriptedResponse(text="half", error=ModelError("cut", retryable=False), error_after=1),
        ScriptedResponse(error=PromptTooLongError("too long", provider="x", status=400)),
        ScriptedResponse(events=[StreamThinking(0, "hm"), StreamSignals(("tail_repetition:4@thinking",)), StreamEnd("end_turn")]),
        ScriptedResponse(events=[StreamText(0, "x"), StreamUsage(None)]),  # type: ignore[arg-type]
    ]
)


@settings(max_examples=80, deadline=None)
@given(
    script=st.lists(_RESPONSES, min_size=1, max_size=14),
    max_turns=st.one_of(st.none(), st.integers(0, 6)),
    usage_limit=st.one_of(st.none(), st.integers(0, 120)),
    expired=st.booleans(),
    stationarity=st.booleans(),
)
async def test_s10_every_run_ends_with_exactly_one_terminal_that_says_what_ended_it(
    script: list[ScriptedResponse], max_turns: int | None, usage_limit: int | None, expired: bool, stationarity: bool
) -> None:
    """Any mix of answers, calls, failures, loops and limits: the run's last event is its one
    `TurnEnded`, its reason is a `TerminalReason`, a limit's terminal is true to the limit, a
    failure's says what failed, and the transcript is valid."""
    model = ScriptedModel([*script, "the end"])
    policies = [ConservativeDoomLoopPolicy(), IdenticalToolCallRun(keepalive_end_at=2)] if stationarity else []
    engine = QueryEngine(
        model, tools=[step, shell], policies=policies, max_turns=max_turns, usage_limit=usage_limit,
        deadline=0 if expired else None, retry_budget=1, retry_base_delay=0, doom_budget=1,
    )
    events = await collect(engine.run("go"))
    main = ends(events)
    assert len(main) == 1 and events[-1] is main[0]
    end = main[0]
    assert end.reason in typing.get_args(agentloop.TerminalReason)
    if expired:
        assert end.reason == "deadline" and model.requests == []
    if end.reason == "max_turns":
        assert max_turns is not None and end.turns == max_turns
    if end.reason == "usage_limit":
        assert usage_limit is not None and end.usage.total >= usage_limit
    if end.reason in ("model_error", "prompt_too_long"):
        assert end.error
    if end.reason == "stationarity_ended":
        assert stationarity and end.detail
    assert (end.abort_reason is not None) == (end.reason in ("aborted_streaming", "aborted_tools", "deadline"))
    assert validate_transcript(engine.messages) == []


# -- §6: the server's frames -------------------------------------------------------------------------


def _responses_model(stream: bytes, headers: list[httpx.Headers], *, check: bool) -> OpenAIResponsesModel:
    async def handle(request: httpx.Request) -> httpx.Response:
        headers.append(request.headers)
        return httpx.Response(200, headers={"content-type": "text/event-stream"}, content=stream)

    client = httpx.AsyncClient(transport=httpx.MockTransport(handle))
    return OpenAIResponsesModel("gpt-test", api_key="sk-test-0000", http_client=client, doom_loop_check=check)


@pytest.mark.parametrize("check", [True, False])
async def test_s6_the_doom_loop_headers_are_sent_only_when_asked_for(check: bool) -> None:
    headers: list[httpx.Headers] = []
    engine = QueryEngine(_responses_model(responses_stream(1, "Hello there.", {}), headers, check=check))
    await collect(engine.run("go"))
    sent = {k: v for k, v in headers[0].items() if k.startswith("x-grok-")}
    assert sent == ({"x-grok-doom-loop-check": "true", "x-grok-exact-repetition-check": "true"} if check else {})


@pytest.mark.parametrize(
    "signals",
    [["tail_repetition:4@text"], "tail_repetition:4@thinking", [1, None, {"a": 1}], None, ["no signal at all"], []],
)
async def test_s6_a_servers_frame_is_absorbed_whatever_it_holds(signals: object) -> None:
    """A `response.doom_loop_check` frame becomes no text and no event of its own but the verdict
    on its signals (a warning here); one whose signals are not signal strings is ignored."""
    stream = responses_stream(1, "Hello there, world.", {1: signals})  # type: ignore[dict-item]
    engine = QueryEngine(_responses_model(stream, [], check=True))
    events = await collect(engine.run("go"))
    assert engine.messages[-1].text == "Hello there, world."
    detected = [e for e in events if isinstance(e, DoomLoopDetected)]
    assert [(d.action, [s.format() for s in d.signals]) for d in detected] == (
        [("warn", ["tail_repetition:4@text"])] if signals == ["tail_repetition:4@text"] else []
    )
    assert [e.reason for e in ends(events)] == ["completed"]
    assert validate_transcript(engine.messages) == []


async def test_s9_a_main_abort_that_reaches_a_running_subagent_runs_main_only_cleanup_once() -> None:
    """The main engine interrupted while its subagent streams: the child ends with the same
    reason, an ordinary hook runs for each engine, a main-only one once, for the main engine."""
    seen: list[str] = []

    @tool
    async def task(ctx: ToolContext) -> str:
        """Delegate."""
        child = ctx.engine.subagent(agent_id="c1", model=ScriptedModel([ScriptedResponse(text="abc" * 50, chunk=1)]))
        async for ev in child.run("work"):
            if isinstance(ev, TextDelta) and not seen:
                ctx.engine.interrupt("stop")
            if isinstance(ev, TurnEnded):
                seen.append(f"child:{ev.reason}:{ev.abort_reason}")
        return "child done"

    engine = QueryEngine(ScriptedModel([calls("task"), "done"]), tools=[task], policies=[])
    engine.on_abort(lambda r: seen.append("main-only:" + r), main_only=True)
    engine.on_abort(lambda r: seen.append("any:" + r))
    events = await collect(engine.run("go"))
    assert seen == ["any:stop", "child:aborted_streaming:stop", "main-only:stop", "any:stop"]
    assert [(e.reason, e.abort_reason) for e in ends(events)] == [("aborted_tools", "stop")]
    assert validate_transcript(engine.messages) == []


# -- §11: hostile tool arguments and return values ------------------------------------------------


@tool
async def add(a: int, b: int = 0) -> int:
    """Add two numbers."""
    return a + b


@pytest.mark.parametrize(
    ("name", "raw", "says"),
    [
        ("add", "[1, 2]", "must be a JSON object"),
        ("add", "null", "must be a JSON object"),
        ("add", '{"a": "x"}', "a: Input should be a valid integer"),
        ("add", '{"a": 1, "zz": 2}', "zz: not a parameter"),
        ("add", "{", "not valid JSON"),
        ("add", '{"a": NaN}', "not valid JSON"),
        ("add", '{"a": 1e999}', "finite number"),
        ("add", '{"a":' + "[" * 5000 + "]" * 5000 + "}", "nested too deeply"),
        ("add", '{"a": 1}{"a": 2}', "not valid JSON"),
        ("nope", "{}", "Unknown tool 'nope'"),
        ("", "{}", "Unknown tool ''"),
    ],
)
async def test_s11_hostile_tool_input_from_the_model_is_an_error_result(name: str, raw: str, says: str) -> None:
    """What the model sent as a call, however broken, is answered with an error result that says
    what is wrong; the tool does not run, and the turn goes on to the model's next answer."""
    call = [StreamToolUseStart(0, "toolu_1", name), StreamToolInput(0, raw), StreamBlockStop(0)]
    engine = QueryEngine(RawModel(call, [StreamText(0, "sorry")]), tools=[add], policies=[])
    events = await collect(engine.run("go"))
    [finished] = results(events)
    assert finished.result.is_error and says in str(finished.result.content)
    assert [e.reason for e in ends(events)] == ["completed"] and engine.messages[-1].text == "sorry"
    assert validate_transcript(engine.messages) == []


class _Unprintable:
    def __str__(self) -> str:
        raise RuntimeError("no text")

    __repr__ = __str__


def _nested(depth: int) -> list[Any]:
    value: list[Any] = []
    for _ in range(depth):
        value = [value]
    return value


async def _never_awaited() -> int:
    return 1


@pytest.mark.parametrize(
    ("make", "error"),
    [
        (lambda: None, False),
        (lambda: 3, False),
        (lambda: b"\xff\xfe", False),
        (lambda: {"a": float("inf")}, False),
        (lambda: "\ud800 lone surrogate", False),
        (lambda: "", False),
        (lambda: object(), False),
        (_Unprintable, True),
        (lambda: _nested(100_000), True),
        (_never_awaited, True),
    ],
)
async def test_s11_a_tools_return_value_of_any_kind_becomes_a_result_never_a_crash(make: Any, error: bool) -> None:
    @tool
    async def odd() -> Any:
        """Return something odd."""
        return make()

    engine = QueryEngine(ScriptedModel([calls("odd"), "ok"]), tools=[odd], policies=[])
    events = await collect(engine.run("go"))
    [finished] = results(events)
    assert finished.result.is_error is error
    text = finished.result.content if isinstance(finished.result.content, str) else "".join(b.text for b in finished.result.content)
    assert text.strip()
    text.encode("utf-8")  # nothing a provider's JSON encoder would refuse
    assert [e.reason for e in ends(events)] == ["completed"]
    assert validate_transcript(engine.messages) == []


@pytest.mark.parametrize(("limit", "requests", "terminal"), [(20, 1, "usage_limit"), (21, 2, "usage_limit"), (40, 2, "usage_limit"), (41, 3, "completed")])
async def test_s8_usage_limit_at_its_bound_and_one_past(limit: int, requests: int, terminal: str) -> None:
    """Each scripted response reports 20 tokens; the limit is reached when the run's tokens come to
    it, and no request starts after that (the results of the last calls are in the transcript)."""
    model = ScriptedModel([calls("step"), calls("step"), "fine"])
    engine = QueryEngine(model, tools=[step], policies=[], usage_limit=limit)
    events = await collect(engine.run("go"))
    assert [e.reason for e in ends(events)] == [terminal]
    assert len(model.requests) == requests
    assert validate_transcript(engine.messages) == []


async def test_s8_max_turns_counts_responses_not_the_retries_and_resamples_of_one() -> None:
    """concepts.md: a retry or a resample asks again for the same response; with ``max_turns=1``
    the turn still gets its one answer after a doom-loop cut and a failed request."""
    looping = ScriptedResponse(events=[StreamThinking(0, "hm"), StreamSignals(("tail_repetition:4@thinking",)), StreamEnd("end_turn")])
    model = ScriptedModel([looping, ScriptedResponse(error=ModelError("overloaded", retryable=True)), "good"])
    engine = QueryEngine(model, max_turns=1, retry_base_delay=0)
    events = await collect(engine.run("go"))
    assert len(model.requests) == 3
    assert [(e.reason, e.turns) for e in ends(events)] == [("completed", 1)]
    assert engine.messages[-1].text == "good"

