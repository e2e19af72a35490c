"""Promises of docs/design.md, docs/index.md and README.md that no other test pins."""

from __future__ import annotations

import ast
import asyncio
import importlib
import json
import logging
import re
import sys
import tomllib
from collections.abc import AsyncIterator, Sequence
from pathlib import Path

import pytest

from agentloop import (
    AbortController,
    AbortError,
    AbortSignal,
    Allow,
    Event,
    ModelError,
    ModelRequest,
    QueryEngine,
    ScriptedModel,
    ScriptedResponse,
    ScriptedToolCall,
    TextDelta,
    Texts,
    ToolCallFinished,
    ToolCallStarted,
    ToolContext,
    ToolInputDelta,
    ToolUseBlock,
    TurnEnded,
    TurnStarted,
    Usage,
    tool,
    validate_transcript,
)
from agentloop._executor import race_abort
from agentloop.models import (
    StreamBlockStop,
    StreamEnd,
    StreamEvent,
    StreamProviderBlock,
    StreamRedactedThinking,
    StreamSignature,
    StreamText,
    StreamThinking,
    StreamToolInput,
    StreamToolUseStart,
    StreamUsage,
)
from agentloop.testing import collect
from tests.helpers import VirtualClock


@tool
async def step() -> str:
    """One step."""
    return "done"


def ends(events: Sequence[Event]) -> list[TurnEnded]:
    return [e for e in events if isinstance(e, TurnEnded) and e.agent_id is None]


# -- design.md, Priorities: nothing is lost silently ---------------------------------------------


@pytest.mark.parametrize("retryable", [False, True])
async def test_the_calls_of_a_response_that_failed_for_good_are_answered_as_not_run_by_the_failure(
    retryable: bool,
) -> None:
    """design.md, Priorities 3: "synthesized results say what happened to each call". A response
    whose stream fails after a call's input was complete keeps the call; its result says the
    failure left it unrun, not that the user interrupted it (nobody did). The error it quotes is
    scrubbed of lone surrogates, as the model's other output is."""
    failing = ScriptedResponse(
        text="Let me look.",
        tool_calls=[ScriptedToolCall("step", {})],
        error=ModelError("upstream overloaded at caf\udce9", retryable=retryable),  # a lone surrogate too
        error_after=5,  # the text, its stop, the call's start, input and stop: then the error
    )
    engine = QueryEngine(ScriptedModel([failing] * 2), tools=[step], policies=[], retry_budget=1 if retryable else 0)
    events = await collect(engine.run("go"))
    (end,) = ends(events)
    assert end.reason == "model_error" and end.abort_reason is None
    assert end.error is not None and "upstream overloaded at caf\ufffd" in end.error
    call, answer = engine.messages[-2:]
    assert call.role == "assistant" and call.partial and [b.type for b in call.content] == ["text", "tool_use"]
    (result,) = answer.tool_results
    assert result.is_error and result.tool_use_id == call.content[1].id  # type: ignore[union-attr]
    assert "Interrupted by user" not in result.text
    assert result.text.startswith("Not run:") and "upstream overloaded at caf\ufffd" in result.text
    finished = [e for e in events if isinstance(e, ToolCallFinished)]
    assert [(e.synthetic, e.result.text) for e in finished] == [(True, result.text)]
    assert validate_transcript(engine.messages) == []


# -- design.md, Invariants: no string in the transcript is one UTF-8 cannot encode -----------------


def encodes(value: object) -> bool:
    try:
        json.dumps(value, ensure_ascii=False).encode("utf-8")
    except UnicodeEncodeError:
        return False
    return True


class LoneHalves:
    """A model of the host's own (no SSE, no driver) whose every string field carries a lone
    UTF-16 surrogate: the accumulated message is where its output is scrubbed."""

    def __init__(self) -> None:
        self.requests = 0

    async def stream(self, request: ModelRequest, signal: AbortSignal) -> AsyncIterator[StreamEvent]:
        self.requests += 1
        if self.requests > 1:
            yield StreamText(0, "done")
            yield StreamEnd("end_turn", Usage(1, 1))
            return
        yield StreamThinking(0, "think \ud83d")
        yield StreamSignature(0, "sig\udc00", origin="o\ud800")
        yield StreamRedactedThinking(1, "opaque\ud800", origin="o\udc00")
        yield StreamProviderBlock(2, "srv\udfff", {"k": "v\ud800"})
        yield StreamText(3, "text \udcff")
        yield StreamToolUseStart(4, "call\ud800", "st\udc80ep")
        yield StreamToolInput(4, "{}")
        yield StreamBlockStop(4)
        yield StreamEnd("tool_use", Usage(1, 1))


async def test_every_string_of_a_models_own_output_is_scrubbed_in_the_accumulated_message() -> None:
    """design.md, Invariants: "Model output (each SSE payload, the accumulated message) [is]
    scrubbed where [it comes] in": for a model of the host's own, every string of the message
    the loop commits (the call's id and name, a signature, redacted data and their origin, a
    provider block's name), not only text, thinking and tool input. The id the host was shown is
    the one kept."""
    engine = QueryEngine(LoneHalves(), tools=[step], policies=[])
    events = await collect(engine.run("go"))
    assert validate_transcript(engine.messages) == []
    assert all(encodes(m.model_dump(mode="python")) for m in engine.messages)
    call = engine.messages[1]
    use = call.content[-1]
    assert use.type == "tool_use" and (use.id, use.name) == ("call\ufffd", "st\ufffdep")
    shown = next(e for e in events if isinstance(e, ToolInputDelta))
    assert (shown.tool_use_id, shown.name) == (use.id, use.name)
    assert engine.messages[2].tool_results[0].tool_use_id == use.id
    assert [e.reason for e in ends(events)] == ["completed"]
    assert any(isinstance(e, TextDelta) for e in events)


async def test_an_interrupt_reason_with_a_lone_surrogate_is_scrubbed_where_it_comes_in() -> None:
    """design.md, Invariants: the host's text is scrubbed where it comes in; an interrupt's reason
    is kept with the cut message (``meta["abort_reason"]``) and reported in ``TurnEnded``."""
    engine = QueryEngine(ScriptedModel([ScriptedResponse(text="abcdefgh", chunk=2)]), policies=[])
    hooked: list[str] = []
    engine.on_abort(hooked.append)
    events: list[Event] = []
    async for event in engine.run("go"):
        events.append(event)
        if isinstance(event, TextDelta):
            engine.interrupt("closed \ud83d\ude00 tab \udcff")
    reason = "closed \U0001f600 tab \ufffd"
    assert [(e.reason, e.abort_reason) for e in ends(events)] == [("aborted_streaming", reason)]
    cut = engine.messages[1]
    assert cut.partial and cut.meta["abort_reason"] == reason
    assert hooked == [reason]
    assert all(encodes(m.model_dump(mode="python")) for m in engine.messages)


# -- design.md, Dependencies; README.md ------------------------------------------------------------


def test_the_runtime_dependencies_are_the_three_the_docs_name_and_nothing_else_is_imported() -> None:
    """design.md, Dependencies: "Runtime: httpx, pydantic v2 and typing-extensions. Nothing
    else"; the MCP SDK only for ``agentloop.mcp``. README.md: "httpx (0.27 or newer), pydantic
    (2.10 or newer), typing-extensions"."""
    root = Path(__file__).resolve().parent.parent
    project = tomllib.loads((root / "pyproject.toml").read_text(encoding="utf-8"))["project"]
    declared = dict(re.fullmatch(r"([\w-]+)(.*)", d).groups() for d in project["dependencies"])  # type: ignore[union-attr]
    assert declared == {"httpx": ">=0.27", "pydantic": ">=2.10", "typing-extensions": ">=4.9"}
    readme = (root / "README.md").read_text(encoding="utf-8")
    assert "httpx (0.27 or newer), pydantic (2.10 or newer),\ntyping-extensions" in readme
    allowed = {"httpx", "pydantic", "pydantic_core", "typing_extensions"}  # pydantic_core: pydantic's own
    imported: dict[str, set[str]] = {}
    for path in (root / "agentloop").rglob("*.py"):
        where = path.relative_to(root).as_posix()
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            names = [a.name for a in node.names] if isinstance(node, ast.Import) else []
            if isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
                names = [node.module]
            for name in names:
                top = name.split(".")[0]
                if top not in sys.stdlib_module_names and top != "agentloop":
                    imported.setdefault(top, set()).add(where)
    outside = {top: files for top, files in imported.items() if top not in allowed}
    assert all(f.startswith("agentloop/mcp/") for files in outside.values() for f in files), outside
    assert "mcp" in outside  # the extra is what agentloop.mcp is built on


# -- design.md, Invariants: the engine never yields inside a timeout or a cancel scope -------------


@pytest.mark.parametrize("held", ["TextDelta", "ToolCallStarted"])
async def test_a_host_that_holds_an_event_past_every_timer_of_the_run_is_never_cancelled(held: str) -> None:
    """design.md, Invariants (PEP 789): "The engine never yields inside a task group, a timeout or
    a cancel scope". A host that awaits while it holds an event, past the run's ``deadline``, a
    tool's ``timeout`` and the cancel grace, is never cancelled by them: its await completes; the
    run ends with the deadline afterwards."""
    @tool(timeout=1)
    async def slow() -> str:
        """Take a while."""
        await asyncio.sleep(3600)
        return "late"

    script = [ScriptedResponse(text="abcdefgh", chunk=2, tool_calls=[ScriptedToolCall("slow", {})]), "ok"]
    with VirtualClock() as clock:
        engine = QueryEngine(ScriptedModel(script), tools=[slow], policies=[], deadline=2.0, tool_cancel_grace=0.5)
        slept: list[float] = []
        events: list[Event] = []
        async for event in engine.run("go"):
            events.append(event)
            if type(event).__name__ == held and not slept:
                began = clock.now
                await asyncio.sleep(10)  # the deadline, the tool's timeout and the grace all pass
                slept.append(clock.now - began)
                assert asyncio.current_task().cancelling() == 0  # type: ignore[union-attr]
    assert slept == [pytest.approx(10.0)]
    assert [(e.reason, e.abort_reason) for e in ends(events)] == [("deadline", "deadline")]
    assert validate_transcript(engine.messages) == []


# -- design.md, How an abort reaches everything: the order at the end of an aborted turn -----------


@pytest.mark.parametrize("where", ["streaming", "tools"])
async def test_the_abort_hooks_run_on_a_settled_transcript_with_the_notice_and_turn_ended_comes_last(
    where: str,
) -> None:
    """design.md, How an abort reaches everything: "Then the transcript is settled, the interrupt
    notice is written (for a cancel), on_abort hooks run (main-only ones only for the main
    engine), and TurnEnded is the last event of the turn." A hook sees a valid transcript that
    ends with the notice; a main-only hook runs for the main engine, and no event follows the
    TurnEnded."""
    @tool
    async def waits(ctx: ToolContext) -> str:
        """Wait for the stop."""
        await ctx.signal.wait()
        return "stopped cleanly"

    response = ScriptedResponse(text="abcdefgh", chunk=2, tool_calls=[ScriptedToolCall("waits", {})])
    engine = QueryEngine(ScriptedModel([response]), tools=[waits], policies=[])
    seen: list[tuple[str, str, list[str], str | None]] = []

    def hook(name: str) -> object:
        def record(reason: str) -> None:
            last = engine.messages[-1]
            seen.append((name, reason, validate_transcript(engine.messages), last.kind))

        return record

    engine.on_abort(hook("any"))
    engine.on_abort(hook("main"), main_only=True)
    trigger = TextDelta if where == "streaming" else ToolCallStarted
    events: list[Event] = []
    async for event in engine.run("go"):
        events.append(event)
        if isinstance(event, trigger) and sum(isinstance(e, trigger) for e in events) == 1:
            engine.interrupt()
    assert seen == [("any", "cancel", [], "interrupt_notice"), ("main", "cancel", [], "interrupt_notice")]
    assert isinstance(events[-1], TurnEnded) and len(ends(events)) == 1
    assert events[-1].reason == f"aborted_{where}"


# -- design.md, Invariants ("Where") and Map of modules --------------------------------------------


def test_every_place_design_md_names_exists_and_every_module_opens_with_a_docstring() -> None:
    """design.md, Map of modules: "One module per concept, each opening with a docstring that says
    what it holds." Every module file, package and ``module.name`` the page points to (the
    invariants' "Where" column, the map) exists, so the map cannot go stale."""
    package = Path(__file__).resolve().parent.parent / "agentloop"
    page = (package.parent / "docs" / "design.md").read_text(encoding="utf-8")
    undocumented = [
        p.relative_to(package).as_posix()
        for p in package.rglob("*.py")
        if ast.get_docstring(ast.parse(p.read_text(encoding="utf-8"))) is None
    ]
    assert undocumented == []
    files = set(re.findall(r"`((?:[\w/]+/)?\w+\.py)`", page))
    folders = set(re.findall(r"`((?:models|mcp|sessions)(?:/\w+)*/)`", page))
    names = set(re.findall(r"`((?:[\w/]+/)?_\w+)\.(\w+(?:\.\w+)?)`", page)) - {(f[:-3], "py") for f in files}
    assert len(files) >= 60 and len(folders) >= 5 and len(names) >= 20, (len(files), len(folders), len(names))
    # Paths are under agentloop/, but for the tests and benchmarks the page names from the root.
    missing = [f for f in files | folders if not (package / f).exists() and not (package.parent / f).exists()]
    assert missing == []
    for module, attr in sorted(names):
        found: object = importlib.import_module("agentloop." + module.replace("/", "."))
        for part in attr.split("."):
            assert hasattr(found, part), f"design.md names `{module}.{attr}`, which does not exist"
            found = getattr(found, part)


# -- design.md, Invariants: the loop converts back only the cancellation it caused -----------------


class ClosingCancels:
    """A model whose stream (an async iterator of its own, not a generator) raises CancelledError
    from ``aclose()``: it awaits a reader task that was cancelled as the connection closed.
    Nobody cancelled the run."""

    def __init__(self, text: str) -> None:
        self.events: list[StreamEvent] = [StreamText(0, text[i : i + 2]) for i in range(0, len(text), 2)]
        self.events.append(StreamEnd("end_turn", Usage(1, 1)))

    def stream(self, request: ModelRequest, signal: AbortSignal) -> ClosingCancels:
        return self

    def __aiter__(self) -> ClosingCancels:
        return self

    async def __anext__(self) -> StreamEvent:
        if not self.events:
            raise StopAsyncIteration
        return self.events.pop(0)

    async def aclose(self) -> None:
        reader = asyncio.ensure_future(asyncio.Event().wait())
        reader.cancel()
        await reader  # raises CancelledError: the reader's, not the run's


@pytest.mark.parametrize("interrupted", [False, True])
async def test_a_cancelled_error_from_closing_the_model_stream_is_logged_and_the_attempts_outcome_stands(
    interrupted: bool, caplog: pytest.LogCaptureFixture
) -> None:
    """design.md, Invariants: a CancelledError the model stream raises "while closing it, [...] is
    logged and the attempt's outcome stands": a completed response is committed as completed,
    an interrupted one ends as the interrupt; the host's task is not cancelled."""
    engine = QueryEngine(ClosingCancels("abcdefgh"), policies=[])  # type: ignore[arg-type]
    events: list[Event] = []
    with caplog.at_level(logging.DEBUG, logger="agentloop"):
        async for event in engine.run("go"):
            events.append(event)
            if interrupted and isinstance(event, TextDelta) and event.text == "cd":
                engine.interrupt()  # seen at the next read, which the loop cuts, then closes
    assert asyncio.current_task().cancelling() == 0  # type: ignore[union-attr]
    reply = engine.messages[1]
    if interrupted:
        assert [(e.reason, e.abort_reason) for e in ends(events)] == [("aborted_streaming", "cancel")]
        shown = "".join(e.text for e in events if isinstance(e, TextDelta))
        assert reply.partial and reply.text == shown != "abcdefgh" and engine.messages[-1].kind == "interrupt_notice"
    else:
        assert [(e.reason, e.error) for e in ends(events)] == [("completed", None)]
        assert not reply.partial and reply.text == "abcdefgh"
    assert validate_transcript(engine.messages) == []
    assert any("closing the model stream raised CancelledError" in r.getMessage() for r in caplog.records)


# -- design.md, Invariants: nothing handed a coroutine leaves it unawaited -------------------------


async def test_race_abort_closes_a_coroutine_it_is_handed_after_the_abort_unstarted() -> None:
    """design.md, Invariants: "Nothing that was handed a coroutine leaves it unawaited:
    `race_abort` closes one it gets after the abort" (no "never awaited" warning, which the
    suite's warnings-as-errors would catch), and the work never starts."""
    ran: list[str] = []

    async def work() -> str:
        ran.append("started")
        return "done"

    controller = AbortController()
    assert await race_abort(work(), controller.signal) == "done"
    controller.abort("user_left")
    late = work()
    with pytest.raises(AbortError) as raised:
        await race_abort(late, controller.signal)
    assert raised.value.reason == "user_left"
    assert late.cr_frame is None and ran == ["started"]  # closed, never run


async def test_texts_the_host_gives_with_a_lone_surrogate_are_scrubbed_before_they_reach_the_transcript() -> None:
    """design.md, Invariants: the host's text is scrubbed where it comes in; that includes the
    `Texts` it gives the engine (read from a file decoded with ``surrogateescape``, say), which the
    engine writes into the transcript as synthetic results, notices and interjections."""
    texts = Texts(
        never_started="Not started (caf\udce9)",
        stopped_running="Stopped (caf\udce9)",
        interrupt_notice="[Stopped by caf\udce9]",
        interjection_intro="Caf\udce9 says:",
        interjection_reminder="Carry on, caf\udce9.",
    )
    assert texts.never_started == "Not started (caf\ufffd)" and texts.interjection_reminder == "Carry on, caf\ufffd."

    @tool
    async def deaf() -> str:
        """Ignore the signal."""
        await asyncio.sleep(3600)
        return "never"

    @tool
    async def steered(ctx: ToolContext) -> str:
        """Ask for a steer."""
        ctx.engine.interject("and the tests")
        return "looked"

    two_batches = ScriptedResponse(tool_calls=[ScriptedToolCall("deaf", {}), ScriptedToolCall("deaf", {})])
    script = [two_batches, ScriptedResponse(tool_calls=[ScriptedToolCall("steered", {})]), "ok"]
    engine = QueryEngine(ScriptedModel(script), tools=[deaf, steered], policies=[], texts=texts, tool_cancel_grace=0)
    async for event in engine.run("go"):
        if isinstance(event, ToolCallStarted):
            engine.interrupt()
    await collect(engine.run("again"))
    kinds = [m.kind for m in engine.messages]
    assert kinds.count("interrupt_notice") == 1 and kinds.count("interjection") == 1
    assert [r.text for r in engine.messages[2].tool_results] == ["Stopped (caf\ufffd)", "Not started (caf\ufffd)"]
    assert validate_transcript(engine.messages) == []
    assert all(encodes(m.model_dump(mode="python")) for m in engine.messages)


# -- design.md, How an abort reaches everything: one controller per turn --------------------------


async def test_one_signal_per_turn_reaches_the_model_the_prompt_and_the_tools_and_a_send_now_turn_gets_a_fresh_one() -> None:
    """design.md, How an abort reaches everything: "One `AbortController` per turn (a send-now turn
    gets a fresh one). Its signal is handed to the model stream, every tool call
    (`ToolContext.signal`), the permission prompt [...]". The turn a send-now stopped keeps its
    aborted signal; the send-now's turn, and a follow-up's after it, each get their own."""
    seen: list[tuple[int, str, AbortSignal]] = []
    turn = 0
    script = ScriptedModel([
        ScriptedResponse(tool_calls=[ScriptedToolCall("look", {})]),
        ScriptedResponse(text="abcdefgh", chunk=2),  # the send-now lands here
        ScriptedResponse(tool_calls=[ScriptedToolCall("look", {})]),
        "instead",
        "later",
    ])

    class Recording:
        def stream(self, request: ModelRequest, signal: AbortSignal) -> AsyncIterator[StreamEvent]:
            seen.append((turn, "model", signal))
            return script.stream(request, signal)

    @tool
    async def look(ctx: ToolContext) -> str:
        """Look around."""
        seen.append((turn, "tool", ctx.signal))
        return "seen"

    async def permission(use: ToolUseBlock, ctx: ToolContext) -> Allow:
        seen.append((turn, "prompt", ctx.signal))
        return Allow()

    engine = QueryEngine(Recording(), tools=[look], policies=[], permission=permission)  # type: ignore[arg-type]
    events: list[Event] = []
    async for event in engine.run("go"):
        events.append(event)
        if isinstance(event, TurnStarted):
            turn = event.turn
            if turn == 1:
                engine.follow_up("and then this")
        if isinstance(event, TextDelta) and event.text == "ab":
            engine.send_now("do this instead")
    assert [(e.reason, e.abort_reason) for e in ends(events)] == [
        ("aborted_streaming", "send_now"),
        ("completed", None),
        ("completed", None),
    ]
    by_turn = {n: {id(s) for t, _, s in seen if t == n} for n in (1, 2, 3)}
    assert all(len(ids) == 1 for ids in by_turn.values())  # one signal for all of a turn's work
    assert len(set.union(*by_turn.values())) == 3  # and a fresh one each turn
    assert [k for t, k, _ in seen if t == 1] == ["model", "prompt", "tool", "model"]
    assert [k for t, k, _ in seen if t == 2] == ["model", "prompt", "tool", "model"]
    signals = {t: s for t, _, s in seen}
    assert signals[1].reason == "send_now" and not signals[2].aborted and not signals[3].aborted


# -- design.md, Priorities 3 (every terminal says what ended the turn) for a model's bad usage ------


class Reports:
    """A model of the host's own that reports ``usage`` its own way on its first request."""

    def __init__(self, usage: object, *, separate: bool) -> None:
        self.usage, self.separate, self.requests = usage, separate, 0

    async def stream(self, request: ModelRequest, signal: AbortSignal) -> AsyncIterator[StreamEvent]:
        self.requests += 1
        yield StreamText(0, "hello")
        if self.requests > 1:
            yield StreamEnd("end_turn", Usage(3, 4))
        elif self.separate:
            yield StreamUsage(self.usage)  # type: ignore[arg-type]
            yield StreamEnd("end_turn")
        else:
            yield StreamEnd("end_turn", self.usage)  # type: ignore[arg-type]


@pytest.mark.parametrize("separate", [False, True])
@pytest.mark.parametrize("usage", ["1200 tokens", {"input_tokens": 3}, Usage("3", 4), Usage(3, None)])  # type: ignore[arg-type]
async def test_a_usage_of_the_wrong_type_from_a_models_own_stream_is_a_malformed_event_not_a_crash(
    usage: object, separate: bool
) -> None:
    """design.md, Priorities 3: "every terminal says what ended the turn", and SPEC's "never a
    crash": a model of the host's own that reports its usage as something other than a `Usage`
    of whole numbers is a malformed stream event, retried like any (then the answer is taken),
    or the turn's `model_error` when no retry is left; ``run()`` never raises for it."""
    engine = QueryEngine(Reports(usage, separate=separate), policies=[], retry_budget=1, retry_base_delay=0)  # type: ignore[arg-type]
    events = await collect(engine.run("go"))
    assert [(e.reason, e.usage) for e in ends(events)] == [("completed", Usage(3, 4))]
    assert engine.messages[-1].text == "hello"
    failing = QueryEngine(Reports(usage, separate=separate), policies=[], retry_budget=0)  # type: ignore[arg-type]
    events = await collect(failing.run("go"))
    (end,) = ends(events)
    assert end.reason == "model_error" and "malformed stream event" in (end.error or "")
    assert validate_transcript(failing.messages) == [] and not failing.running


class Unprintable(Exception):
    """A bug of a model's own whose message cannot even be formatted."""

    def __str__(self) -> str:
        raise RuntimeError("no message")


class RaisesUnprintable:
    def __init__(self, where: str) -> None:
        self.where = where

    def stream(self, request: ModelRequest, signal: AbortSignal) -> AsyncIterator[StreamEvent]:
        if self.where == "calling stream()":
            raise Unprintable
        return self.events()

    async def events(self) -> AsyncIterator[StreamEvent]:
        yield StreamText(0, "Let me")
        raise Unprintable


@pytest.mark.parametrize("where", ["calling stream()", "iterating it"])
async def test_a_model_failing_with_an_exception_that_cannot_be_printed_ends_the_turn_as_a_model_error(
    where: str,
) -> None:
    """design.md, Invariants: what the model stream raises, "raised by the call to `stream()` or
    while iterating it", is the stream's own failure (`model_error`), a terminal that says what
    failed, never a crash of ``run()``: also when the exception's ``str()`` itself raises."""
    engine = QueryEngine(RaisesUnprintable(where), policies=[], retry_budget=0)  # type: ignore[arg-type]
    events = await collect(engine.run("go"))
    (end,) = ends(events)
    assert end.reason == "model_error"
    assert end.error is not None and "Unprintable (its message could not be formatted)" in end.error
    assert validate_transcript(engine.messages) == [] and not engine.running


class StoreFailingUnprintably:
    """A session store of the host's own whose every write fails with an exception that cannot
    be printed."""

    def append_message(self, message: object) -> None:
        raise Unprintable

    def append_event(self, event: object) -> None:
        raise Unprintable

    def sidechain(self, agent_id: str) -> StoreFailingUnprintably:
        return self

    def close(self) -> None:
        pass


async def test_a_session_store_failing_with_an_exception_that_cannot_be_printed_does_not_stop_the_run() -> None:
    """design.md, Priorities 3 (nothing is lost silently) and 1: a failing store is reported in
    ``session_errors``, the run goes on to its terminal with a valid transcript, also when the
    store's exception cannot be formatted."""
    engine = QueryEngine(ScriptedModel(["fine"]), policies=[], session=StoreFailingUnprintably())  # type: ignore[arg-type]
    events = await collect(engine.run("go"))
    assert [e.reason for e in ends(events)] == ["completed"] and engine.messages[-1].text == "fine"
    assert engine.session_errors and all("its message could not be formatted" in n for n in engine.session_errors)
    assert validate_transcript(engine.messages) == []
