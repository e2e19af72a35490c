"""The model phase: stream one response, with transport retries and doom-loop resamples.

Two budgets, never mixed: ``retry_budget`` for transport failures (a
retryable `ModelError`), ``doom_budget`` for confident doom-loop verdicts. A
cut or failed attempt's output is discarded with an `AttemptDiscarded` event,
so the host can erase it and nothing is duplicated in the transcript.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import random
from collections.abc import AsyncGenerator, AsyncIterator
from typing import TYPE_CHECKING

from ._commit import abort_terminal, settle_partial
from ._errors import AbortError, ModelError, PromptTooLongError, StreamProtocolError
from ._events import (
    AssistantMessage,
    AttemptDiscarded,
    DoomLoopDetected,
    Event,
    Resampling,
    Retrying,
    TextDelta,
    ThinkingDelta,
    ToolInputDelta,
)
from ._messages import Message
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
from ._policy import Resample, Verdict, Warn
from ._recovery import doom_reminder
from ._run import Aborted, RunState, TranscriptView
from ._transcript import clean_assistant

if TYPE_CHECKING:
    from ._accumulate import Accumulator
    from ._engine import QueryEngine

log = logging.getLogger("agentloop")

_WATCHED = (StreamText, StreamThinking, StreamSignals, StreamLogprobs)


async def model_phase(engine: QueryEngine, st: RunState) -> AsyncGenerator[Event, None]:
    """Stream one response, with transport retries and doom-loop resamples."""
    opts = engine.options
    st.phase, st.response = "model", None
    retries, dooms, armed = opts.retry_budget, opts.doom_budget, opts.doom_loop_recovery
    attempt = 0
    extra: tuple[Message, ...] = ()
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
            settle_partial(engine, st)
            st.terminal = abort_terminal(st)
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
                    st.terminal = abort_terminal(st)
                    return
                continue
            settle_partial(engine, st)
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
    return float(min(base * 2 ** (n - 1), cap) * (1 - 0.25 * random.random()))


def _describe(error: ModelError) -> str:
    kind = type(error).__name__
    status = getattr(error, "status", None)
    where = f" (HTTP {status})" if status else ""
    return f"{kind}{where}: {error.message}"
