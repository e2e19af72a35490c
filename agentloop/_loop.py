"""The loop: the only one in agentloop.

    drive(run)                      one run() call: one or more turns
      turn                          a user message until a terminal
        [safe point] interjections  top of every iteration
        [limits]                    abort / max_turns / usage / deadline
        model phase                 stream -> deltas; retries; doom resamples   (checkpoint 1)
        [checkpoint 2]              aborted? then no tool starts
        tool phase                  batches, each followed by checkpoint 3 and a safe point
        policies                    nudge / end turn
        [safe point] before ending  queued interjections keep the turn going

Invariant: whenever the loop yields, every message in ``engine.messages`` is
committed and final; the only thing not yet in the transcript is the current
attempt's streamed output and the results owed to the last assistant message,
both held in the `RunState`, from which `settle` builds valid messages
synchronously (so even a host that stops iterating leaves a valid transcript).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import random
from collections.abc import AsyncGenerator, AsyncIterator
from typing import TYPE_CHECKING, cast

from ._abort import AbortController
from ._errors import AbortError, ModelError, PromptTooLongError, StreamProtocolError
from ._events import (
    AssistantMessage,
    AttemptDiscarded,
    DoomLoopDetected,
    Event,
    InterjectionDropped,
    InterjectionInjected,
    PolicyNudge,
    Resampling,
    Retrying,
    TerminalReason,
    TextDelta,
    ThinkingDelta,
    ToolCallFinished,
    ToolInputDelta,
    TurnEnded,
    TurnStarted,
)
from ._executor import CallRunner, plan_batches
from ._inbox import envelope
from ._messages import Message, TextBlock, ToolUseBlock
from ._model import (
    ModelRequest,
    StreamEvent,
    StreamLogprobs,
    StreamSignals,
    StreamText,
    StreamThinking,
    StreamToolInput,
    StreamToolUseStart,
)
from ._policy import EndTurn, Nudge, Resample, Verdict, Warn
from ._recovery import doom_reminder
from ._run import ABORTED, GRACE_OVER, Aborted, RunState, TranscriptView
from ._tools import ToolContext
from ._transcript import clean_assistant, interrupted_result

if TYPE_CHECKING:
    from ._accumulate import Accumulator
    from ._engine import QueryEngine

log = logging.getLogger("agentloop")

_WATCHED = (StreamText, StreamThinking, StreamSignals, StreamLogprobs)
_ABANDON = object()
_NO_NOTICE = frozenset({"send_now", "consumer_closed", "deadline"})


async def drive(engine: QueryEngine, prompt: str | Message | None, token: object) -> AsyncGenerator[Event, None]:
    """One `run()`: turns until one ends without a follow-up or a send-now message."""
    previous = engine._state
    if previous is not None and previous.finishing and engine._closing is not None:
        await asyncio.shield(engine._closing)  # the previous run is still cleaning up
    if engine._state is not None:
        raise RuntimeError("a run is already in progress on this engine")
    starts = _first_turn(engine, prompt)
    st = RunState(AbortController(parent=engine._link_signal()), asyncio.current_task())
    st.token = token
    engine._state = st
    engine._closing = st.loop.create_future()
    if engine.options.deadline is not None:
        st.deadline_handle = st.loop.call_later(engine.options.deadline, _abort_current, st, "deadline")
    try:
        while starts is not None:
            async with contextlib.aclosing(_turn(engine, st, starts)) as turn:
                async for event in turn:
                    yield event
            starts = _next_turn(engine, st)
    finally:
        await _finish(engine, st)


def _abort_current(st: RunState, reason: str) -> None:
    st.controller.abort(reason)


def consumer_gone(engine: QueryEngine, token: object) -> None:
    """The host stopped iterating: abort with "consumer_closed" and settle now (sync)."""
    st = engine._state
    if st is None or st.token is not token or st.closed or st.turn_over:
        return
    st.finishing = True
    st.controller.abort("consumer_closed")
    _settle_partial(engine, st)
    _settle_results(engine, st)
    _strip_final(engine)


# -- turns -------------------------------------------------------------------


def _user(engine: QueryEngine, text: str, **fields: object) -> Message:
    if engine._wrap_next:
        engine._wrap_next = False
        text = envelope(engine.options.texts.interrupt_envelope, [text])
    return Message.user(text, **fields)


def _first_turn(engine: QueryEngine, prompt: str | Message | None) -> list[Message]:
    if isinstance(prompt, Message):
        if prompt.role != "user":
            raise ValueError("run() takes a user message as its prompt")
        return [prompt]
    if isinstance(prompt, str):
        return [_user(engine, prompt)]
    if prompt is not None:
        raise TypeError(f"run() takes a str or a Message, not {type(prompt).__name__}")
    queued = _take_starts(engine, follow_ups=True)
    if queued:
        return queued
    if engine.inbox.interjections or (engine.messages and engine.messages[-1].role == "user"):
        return []  # resume: the transcript (or the queue) already holds the input
    raise ValueError("run() needs a prompt: the transcript does not end with a user message")


def _take_starts(engine: QueryEngine, *, follow_ups: bool) -> list[Message]:
    inbox = engine.inbox
    items = inbox.take(inbox.send_now)
    if not items and follow_ups:
        items = inbox.take(inbox.follow_ups)
    return [_user(engine, q.text, meta={"receipt": q.id}) for q in items]


def _next_turn(engine: QueryEngine, st: RunState) -> list[Message] | None:
    if not st.continues:
        return None
    starts = _take_starts(engine, follow_ups=st.last_reason == "completed")
    return starts or None


async def _turn(engine: QueryEngine, st: RunState, starts: list[Message]) -> AsyncGenerator[Event, None]:
    st.new_turn(AbortController(parent=engine._link_signal()))
    for message in starts:
        engine._commit(message)
    for policy in engine.policies:
        policy.begin_turn(real_user=True)
    yield TurnStarted(turn=st.turn_index, prompt=starts[-1] if starts else None)
    reason: TerminalReason | None = None
    while reason is None:
        for event in _drain_interjections(engine, st):
            yield event
        reason = _limit_reached(engine, st)
        if reason is not None:
            break
        st.turns += 1
        async with contextlib.aclosing(_model_phase(engine, st)) as phase:
            async for event in phase:
                yield event
        if st.terminal is not None:
            reason = st.terminal
            break
        async with contextlib.aclosing(_after_response(engine, st)) as after:
            async for event in after:
                yield event
        reason = st.terminal
    for event in await _end_turn(engine, st, reason):
        yield event


def _limit_reached(engine: QueryEngine, st: RunState) -> TerminalReason | None:
    opts = engine.options
    if st.signal.aborted:
        return _abort_terminal(st)
    if opts.max_turns is not None and st.turns >= opts.max_turns:
        return "max_turns"
    if opts.usage_limit is not None and st.usage.total >= opts.usage_limit:
        return "usage_limit"
    return None


def _abort_terminal(st: RunState) -> TerminalReason:
    if st.signal.reason == "deadline":
        return "deadline"
    return "aborted_tools" if st.phase == "tools" else "aborted_streaming"


async def _after_response(engine: QueryEngine, st: RunState) -> AsyncGenerator[Event, None]:
    """Everything between an accepted response and the next request."""
    message = st.response
    uses = message.tool_uses if message is not None else []
    verdicts = _ask_policies(engine, "on_response", message) if message is not None else []
    end = next((v for _, v in verdicts if isinstance(v, EndTurn)), None)
    if end is not None:
        st.terminal, st.detail = end.reason, end.message
        for event in _settle_results(engine, st, not_run=f"Not run: {end.message}"):
            yield event
        return
    st.nudges += [(name, v) for name, v in verdicts if isinstance(v, Nudge)]
    if not uses:
        if not engine.inbox.interjections:  # safe point: a queued message keeps the turn going
            st.terminal = "completed"
        return
    if st.signal.aborted:  # checkpoint 2: no tool starts
        st.phase = "tools"
        st.terminal = _abort_terminal(st)
        return
    async with contextlib.aclosing(_tool_phase(engine, st, uses)) as phase:
        async for event in phase:
            yield event
    if st.signal.aborted:
        st.terminal = _abort_terminal(st)
        return
    assert message is not None
    results = [st.last_results[u.id] for u in uses]
    for name, verdict in _ask_policies(engine, "on_results", message, results):
        if isinstance(verdict, EndTurn):
            st.terminal, st.detail = verdict.reason, verdict.message
        elif isinstance(verdict, Nudge):
            st.nudges.append((name, verdict))
    for event in _flush_nudges(engine, st):
        yield event


def _flush_nudges(engine: QueryEngine, st: RunState) -> list[Event]:
    events: list[Event] = []
    for policy, nudge in st.nudges:
        engine._commit(Message.user(nudge.reminder, synthetic=True, kind="nudge", meta={"policy": policy}))
        events.append(PolicyNudge(policy=policy, reminder=nudge.reminder))
    st.nudges = []
    return events


def _ask_policies(engine: QueryEngine, hook: str, *args: object) -> list[tuple[str, Verdict]]:
    out: list[tuple[str, Verdict]] = []
    for policy in engine.policies:
        try:
            verdict = getattr(policy, hook)(*args)
        except Exception:
            log.exception("policy %s.%s raised; ignored", policy.name, hook)
            continue
        if verdict is not None:
            out.append((policy.name, verdict))
    return out


def _drain_interjections(engine: QueryEngine, st: RunState) -> list[Event]:
    items = engine.inbox.take(engine.inbox.interjections)
    if not items:
        return []
    texts = engine.options.texts
    body = envelope(texts.interjection_intro, [q.text for q in items], texts.interjection_reminder)
    engine._commit(Message.user(body, synthetic=True, kind="interjection", meta={"receipts": [q.id for q in items]}))
    for policy in engine.policies:
        policy.begin_turn(real_user=True)
    event = InterjectionInjected(texts=tuple(q.text for q in items), ids=tuple(q.id for q in items))
    engine._record_event(event)
    return [event]


async def _end_turn(engine: QueryEngine, st: RunState, reason: TerminalReason) -> list[Event]:
    events: list[Event] = _settle_results(engine, st)
    aborted = st.signal.aborted and reason in ("aborted_streaming", "aborted_tools", "deadline")
    abort_reason = st.signal.reason if aborted else None
    if aborted and abort_reason is not None:
        _interrupt_notice(engine, reason, abort_reason)
        await engine._run_abort_hooks(abort_reason)
        st.aborted_subagents += _aborted_children(engine)
    _strip_final(engine)
    inbox = engine.inbox
    st.last_reason = reason
    st.continues = bool(inbox.send_now) or (reason == "completed" and bool(inbox.follow_ups))
    if not st.continues and inbox.interjections:
        dropped = inbox.take(inbox.interjections)
        drop = InterjectionDropped(texts=tuple(q.text for q in dropped), ids=tuple(q.id for q in dropped), reason=reason)
        engine._record_event(drop)
        events.append(drop)
    ended = TurnEnded(
        reason=reason,
        abort_reason=abort_reason,
        error=st.error,
        detail=st.detail,
        usage=st.usage,
        turns=st.turns,
        aborted_subagents=tuple(st.aborted_subagents),
    )
    st.turn_over = True
    engine.last_turn_ended = ended
    engine._record_event(ended)
    events.append(ended)
    return events


def _aborted_children(engine: QueryEngine) -> list[str]:
    return [c.agent_id or "?" for c in list(engine._children) if c._state is not None and c._state.signal.aborted]


def _interrupt_notice(engine: QueryEngine, reason: TerminalReason, abort_reason: str) -> None:
    mode = engine.options.interrupt_notice
    if abort_reason in _NO_NOTICE or mode is None:
        return
    if mode == "append":
        engine._commit(Message.user(engine.options.texts.interrupt_notice, synthetic=True, kind="interrupt_notice"))
        return
    last = engine.messages[-1] if engine.messages else None
    if reason == "aborted_streaming" and last is not None and last.role == "assistant" and last.partial:
        engine._wrap_next = True  # grok's way: only truncated text, no dangling call


# -- the model phase -----------------------------------------------------------


async def _model_phase(engine: QueryEngine, st: RunState) -> AsyncGenerator[Event, None]:
    """Stream one response, with transport retries and doom-loop resamples."""
    opts = engine.options
    st.phase, st.response = "model", None
    retries, dooms, armed = opts.retry_budget, opts.doom_budget, opts.doom_loop_recovery
    attempt, extra = 0, ()
    while True:
        acc = st.begin_attempt()
        for policy in engine.policies:
            policy.begin_attempt()
        request = ModelRequest(
            messages=TranscriptView(engine.messages, len(engine.messages), extra),
            system=opts.system,
            tools=tuple(engine.tools.values()),
            tool_choice=opts.tool_choice,
            max_tokens=opts.max_tokens,
            attempt=attempt,
        )
        outcome = _Outcome()
        async with contextlib.aclosing(_stream(engine, st, request, acc, outcome, armed)) as stream:
            async for event in stream:
                yield event
        st.usage = st.usage + acc.usage
        if outcome.aborted:
            _settle_partial(engine, st)
            st.terminal = _abort_terminal(st)
            return
        if outcome.cut is not None and dooms > 0 and armed:
            dooms -= 1
            yield DoomLoopDetected(signals=outcome.cut.signals, confident=True, action="resample", policy=outcome.policy)
            yield _discarded(acc, attempt, "resample")
            attempt += 1
            yield Resampling(attempt=attempt)
            extra = (doom_reminder(opts.texts, acc, outcome.cut),)
            armed = dooms > 0
            st.acc = None
            continue
        error = outcome.error
        if error is not None:
            if error.retryable and retries > 0 and not st.signal.aborted:
                retries -= 1
                delay = _backoff(opts.retry_base_delay, opts.retry_max_delay, opts.retry_budget - retries, error)
                if not acc.empty:
                    yield _discarded(acc, attempt, "retry")
                st.acc = None
                attempt += 1
                yield Retrying(attempt=attempt, error=str(error), delay=delay)
                try:
                    await st.guarded(asyncio.sleep(delay))
                except Aborted:
                    st.terminal = _abort_terminal(st)
                    return
                continue
            _settle_partial(engine, st)
            st.terminal = "prompt_too_long" if isinstance(error, PromptTooLongError) else "model_error"
            st.error = _describe(error)
            return
        message = clean_assistant(acc.message())
        st.acc = None
        if message is not None:
            engine._commit(message)
            st.response = message
            st.owed, st.results = message.tool_uses, {}  # owed from the moment they are in history
            yield AssistantMessage(message=message)
        return


class _Outcome:
    __slots__ = ("aborted", "cut", "error", "policy")

    def __init__(self) -> None:
        self.aborted = False
        self.cut: Resample | None = None
        self.error: ModelError | None = None
        self.policy = ""


async def _stream(
    engine: QueryEngine,
    st: RunState,
    request: ModelRequest,
    acc: Accumulator,
    outcome: _Outcome,
    armed: bool,
) -> AsyncGenerator[Event, None]:
    """Pump one attempt's stream into ``acc``; the hot path of the loop."""
    watch = bool(engine.policies)
    recovery = engine.options.doom_loop_recovery
    stream: AsyncIterator[StreamEvent] | None = None
    try:
        if st.signal.aborted:
            raise Aborted
        stream = aiter(engine.model.stream(request, st.signal))
        while True:
            st.task = asyncio.current_task()
            st.guarding = True
            try:
                event = await anext(stream)
            except StopAsyncIteration:
                break
            except asyncio.CancelledError:
                if st.consume_cancel():
                    raise Aborted from None
                raise
            finally:
                st.guarding = False
            acc.feed(event)
            out = _delta_event(event, acc)
            if out is not None:
                yield out
            if watch and isinstance(event, _WATCHED):
                verdict = _judge_stream(engine, event, outcome)
                if isinstance(verdict, Resample):
                    if armed:
                        outcome.cut = verdict
                        return
                    yield DoomLoopDetected(
                        signals=verdict.signals,
                        confident=True,
                        action="off" if not recovery else "disarmed",
                        policy=outcome.policy,
                    )
                elif isinstance(verdict, Warn):
                    yield DoomLoopDetected(signals=verdict.signals, confident=False, action="warn", policy=outcome.policy)
        if not acc.ended:
            raise StreamProtocolError("the model stream ended without its end event", retryable=True)
    except Aborted:
        outcome.aborted = True
    except AbortError:
        if not st.signal.aborted:
            outcome.error = ModelError("the model stream raised AbortError without an abort")
        else:
            outcome.aborted = True
    except ModelError as exc:
        outcome.error = exc
    except Exception as exc:  # a model implementation bug: a terminal, never a crash
        outcome.error = ModelError(f"the model raised {type(exc).__name__}: {exc}")
    finally:
        if stream is not None:
            await _aclose(stream)


async def _aclose(stream: AsyncIterator[StreamEvent]) -> None:
    close = getattr(stream, "aclose", None)
    if close is not None:
        try:
            await close()
        except Exception:
            log.debug("closing the model stream raised", exc_info=True)


def _judge_stream(engine: QueryEngine, event: StreamEvent, outcome: _Outcome) -> Verdict | None:
    found: Verdict | None = None
    for policy in engine.policies:
        try:
            verdict = policy.on_stream(event)
        except Exception:
            log.exception("policy %s.on_stream raised; ignored", policy.name)
            continue
        if isinstance(verdict, Resample):
            outcome.policy = policy.name
            return verdict
        if isinstance(verdict, Warn) and found is None:
            outcome.policy = policy.name
            found = verdict
    return found


def _delta_event(event: StreamEvent, acc: Accumulator) -> Event | None:
    if isinstance(event, StreamText):
        return TextDelta(text=event.text)
    if isinstance(event, StreamThinking):
        return ThinkingDelta(thinking=event.thinking)
    if isinstance(event, StreamToolInput):
        tool_id, name = acc.tool_identity(event.index)
        return ToolInputDelta(tool_use_id=tool_id, name=name, partial_json=event.partial_json)
    if isinstance(event, StreamToolUseStart):
        return ToolInputDelta(tool_use_id=event.id, name=event.name, partial_json="")
    return None


def _discarded(acc: Accumulator, attempt: int, reason: str) -> AttemptDiscarded:
    text = acc.text()
    thinking = acc.thinking_text()
    return AttemptDiscarded(
        attempt=attempt,
        reason="retry" if reason == "retry" else "resample",
        text_chars=len(text),
        thinking_chars=len(thinking),
    )


def _backoff(base: float, cap: float, n: int, error: ModelError) -> float:
    if error.retry_after is not None and error.retry_after >= 0:
        return float(min(error.retry_after, 60.0))
    return float(min(base * 2 ** (n - 1), cap) * (1 - 0.25 * random.random()))  # noqa: S311 - jitter


def _describe(error: ModelError) -> str:
    kind = type(error).__name__
    status = getattr(error, "status", None)
    where = f" (HTTP {status})" if status else ""
    return f"{kind}{where}: {error.message}"


# -- the tool phase ------------------------------------------------------------


async def _tool_phase(engine: QueryEngine, st: RunState, uses: list[ToolUseBlock]) -> AsyncGenerator[Event, None]:
    st.phase = "tools"

    def make_ctx(use: ToolUseBlock) -> ToolContext:
        return ToolContext(signal=st.signal, tool_use_id=use.id, engine=engine, emit=st.mailbox.put)

    runner = CallRunner(engine.tools, st.signal, make_ctx, st.mailbox.put, engine.options.permission)
    st.started = runner.started
    drained = []
    for batch in plan_batches(uses, engine.tools, engine.options.max_parallel_tools):
        if st.signal.aborted:  # checkpoint 3: the next batch does not start
            break
        async with contextlib.aclosing(_run_batch(engine, st, runner, batch)) as events:
            async for event in events:
                yield event
        if not st.signal.aborted:  # safe point: drained now, merged after the results
            drained += engine.inbox.take(engine.inbox.interjections)
    for event in _settle_results(engine, st):
        yield event
    if drained:
        engine.inbox.interjections[:0] = drained  # delivered by the next top-of-iteration drain
        for event in _drain_interjections(engine, st):
            yield event


async def _run_batch(
    engine: QueryEngine, st: RunState, runner: CallRunner, batch: list[ToolUseBlock]
) -> AsyncGenerator[Event, None]:
    loop = st.loop
    tasks: dict[asyncio.Future[object], ToolUseBlock] = {}
    for use in batch:
        task = loop.create_task(runner.run(use))
        task.add_done_callback(st.mailbox.put)
        tasks[task] = use
        st.pending_tasks.add(task)
    timers: list[asyncio.TimerHandle] = []
    grace = engine.options.tool_cancel_grace
    if st.signal.aborted:
        st.mailbox.put(ABORTED)
    try:
        while tasks:
            for item in await st.mailbox.get():
                if item is ABORTED and not timers:
                    timers.append(loop.call_later(grace, st.mailbox.put, GRACE_OVER))
                elif item is GRACE_OVER:
                    for task in tasks:
                        task.cancel()
                    timers.append(loop.call_later(0.1, st.mailbox.put, _ABANDON))
                elif item is _ABANDON:
                    for task, use in list(tasks.items()):
                        log.warning("tool %r ignored cancellation; abandoning it", use.name)
                        st.pending_tasks.discard(task)
                        del tasks[task]
                elif isinstance(item, asyncio.Future):
                    use_or_none = tasks.pop(item, None)
                    if use_or_none is not None:
                        st.pending_tasks.discard(item)
                        yield _record(engine, st, item, use_or_none)
                elif item is not ABORTED:
                    yield cast(Event, item)  # emitted by a tool (ToolContext.emit)
    finally:
        for timer in timers:
            timer.cancel()


def _record(engine: QueryEngine, st: RunState, task: asyncio.Future[object], use: ToolUseBlock) -> ToolCallFinished:
    texts = engine.options.texts
    synthetic = False
    if task.cancelled() or isinstance(task.exception(), AbortError):
        text = texts.stopped_running if use.id in st.started else texts.never_started
        result = interrupted_result(use.id, text)
        synthetic = True
    elif (exc := task.exception()) is not None:
        result = interrupted_result(use.id, f"Tool {use.name!r} failed inside agentloop: {exc!r}")
    else:
        result = task.result()  # type: ignore[assignment]
    st.results[use.id] = result  # type: ignore[assignment]
    return ToolCallFinished(tool_use=use, result=result, synthetic=synthetic)  # type: ignore[arg-type]


# -- settling: the transcript is valid whatever happened -------------------------------


def _settle_partial(engine: QueryEngine, st: RunState) -> None:
    """Commit what the current attempt streamed, marked partial (sync)."""
    acc = st.acc
    st.acc = None
    if acc is None or acc.empty:
        return
    message = clean_assistant(acc.message(partial=True))
    if message is None:
        return
    engine._commit(message)
    st.owed = message.tool_uses  # completed calls in a cut response never started


def _settle_results(engine: QueryEngine, st: RunState, not_run: str | None = None) -> list[Event]:
    """Commit the results owed to the last assistant message, synthesizing missing ones (sync)."""
    if not st.owed:
        return []
    texts = engine.options.texts
    blocks = []
    events: list[Event] = []
    for use in st.owed:
        result = st.results.get(use.id)
        if result is None:
            text = not_run or (texts.stopped_running if use.id in st.started else texts.never_started)
            result = interrupted_result(use.id, text)
            events.append(ToolCallFinished(tool_use=use, result=result, synthetic=True))
        blocks.append(result)
    st.last_results = {b.tool_use_id: b for b in blocks}
    st.owed, st.results = [], {}
    engine._commit(Message(role="user", content=list(blocks), synthetic=True, kind="tool_results"))
    return events


def _strip_final(engine: QueryEngine) -> None:
    """The final assistant message may not end with whitespace (Anthropic rejects it)."""
    messages = engine.messages
    while messages and messages[-1].role == "assistant":
        last = messages[-1]
        block = last.content[-1]
        if not isinstance(block, TextBlock) or block.text == block.text.rstrip():
            return
        content = [*last.content[:-1]]
        if block.text.strip():
            content.append(TextBlock(text=block.text.rstrip()))
        if content:
            messages[-1] = last.model_copy(update={"content": content})
            return
        messages.pop()


async def _finish(engine: QueryEngine, st: RunState) -> None:
    """Run cleanup: whatever ended the run, nothing it started survives it."""
    st.finishing = True
    try:
        if not st.turn_over:
            if not st.signal.aborted:
                st.controller.abort("consumer_closed")
            _settle_partial(engine, st)
            _settle_results(engine, st)
            _strip_final(engine)
            await engine._run_abort_hooks(st.signal.reason or "consumer_closed")
        await _cancel_tasks(st, engine.options.tool_cancel_grace)
    finally:
        if st.deadline_handle is not None:
            st.deadline_handle.cancel()
        st.close()
        engine._state = None
        closing, engine._closing = engine._closing, None
        if closing is not None and not closing.done():
            closing.set_result(None)


async def _cancel_tasks(st: RunState, grace: float) -> None:
    pending = {t for t in st.pending_tasks if not t.done()}
    st.pending_tasks.clear()
    if not pending:
        return
    _, still = await asyncio.wait(pending, timeout=grace)
    for task in still:
        task.cancel()
    if still:
        await asyncio.wait(still, timeout=0.1)
