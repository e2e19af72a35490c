"""The model phase: stream one response, with transport retries and doom-loop resamples.

Two budgets, never mixed: ``retry_budget`` for transport failures (a
retryable `ModelError`), ``doom_budget`` for confident doom-loop verdicts. A
cut or failed attempt's output is discarded with an `AttemptDiscarded` event,
so the host can erase it and nothing is duplicated in the transcript.
"""

from __future__ import annotations

import asyncio
import inspect
import logging
import random
from collections.abc import AsyncGenerator, AsyncIterator, Callable
from typing import TYPE_CHECKING, Any, Literal

from ._accumulate import APPLY, Accumulator
from ._commit import abort_terminal, commit_response, settle_partial
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
    StreamText,
    StreamThinking,
    StreamToolInput,
    StreamToolUseStart,
)
from ._policy import Policy, Resample, Verdict, Warn, notify
from ._recovery import doom_reminder
from ._run import Aborted, RunState, TranscriptView, charge_ancestors
from ._run import current_task_of as current_task
from ._transcript import clean_assistant

if TYPE_CHECKING:
    from ._engine import QueryEngine

log = logging.getLogger("agentloop")

#: The longest ``retry_after`` (seconds) the engine waits; a server asking for more (a
#: quota that resets in an hour) ends the turn with ``model_error`` instead of a retry.
_MAX_RETRY_AFTER = 60.0


class _Budgets:
    """One model phase's attempts: the transport retry and doom-loop budgets, kept apart."""

    __slots__ = ("armed", "attempt", "dooms", "extra", "retries")

    def __init__(self, engine: QueryEngine) -> None:
        opts = engine.options
        self.retries, self.dooms = opts.retry_budget, opts.doom_budget
        self.armed = opts.doom_loop_recovery and opts.doom_budget > 0  # a budget of 0: no resample at all
        self.attempt = 0
        self.extra: tuple[Message, ...] = ()


class _Outcome:
    """How one attempt ended. The defaults are class attributes: an attempt that ends normally
    (most) sets none of them, so making one runs no ``__init__``."""

    aborted = False
    cut: Resample | None = None
    error: ModelError | None = None
    policy = ""


async def model_phase(engine: QueryEngine, st: RunState) -> AsyncGenerator[Event, None]:
    """Stream one response, with transport retries and doom-loop resamples.

    The hot path of the loop: one async generator for the whole phase (each
    generator level costs every event a resumption).
    """
    opts = engine.options
    st.phase, st.response = "model", None
    budgets = _Budgets(engine)
    watch, credit = _stream_watch(engine)
    loop = st.loop
    while True:
        acc = st.begin_attempt()
        if engine.policies:
            notify(engine.policies, "begin_attempt")
        request = ModelRequest(
            messages=TranscriptView(engine.messages, len(engine.messages), budgets.extra),
            system=opts.system,
            tools=engine.tool_specs,
            tool_choice=opts.tool_choice,
            max_tokens=opts.max_tokens,
            attempt=budgets.attempt,
        )
        outcome = _Outcome()
        stream: AsyncIterator[StreamEvent] | None = None
        try:
            if st.signal.aborted:
                raise Aborted
            produced = engine.model.stream(request, st.signal)
            try:
                stream = aiter(produced)
            except TypeError:
                raise _not_a_stream(engine, produced) from None
            while True:
                task = st.task = current_task(loop)
                st.cancel_baseline = task.cancelling() if task is not None else 0
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
                apply, make = _STEPS.get(type(event), _IGNORED)
                if apply is not None:  # acc.feed(event), one call less per event
                    apply(acc, event)
                if make is not None:
                    yield make(event, acc)
                if watch is not None:
                    try:
                        verdict = watch(event)
                    except Exception:
                        log.exception("policy %s.on_stream raised; ignored", credit)
                        verdict = None
                    if verdict is not None and isinstance(verdict, Resample | Warn):  # nothing else acts here
                        outcome.policy = credit if isinstance(credit, str) else credit.policy
                        if isinstance(verdict, Resample) and budgets.armed:
                            outcome.cut = verdict
                            break
                        yield _detected(engine, verdict, outcome.policy)
            if outcome.cut is None and not acc.ended:
                raise StreamProtocolError("the model stream ended without its end event", retryable=True)
        except Aborted:
            outcome.aborted = True
        except AbortError:
            outcome.aborted = st.signal.aborted
            if not outcome.aborted:
                outcome.error = ModelError("the model stream raised AbortError without an abort")
        except ModelError as exc:
            outcome.error = exc
        except Exception as exc:  # a model implementation bug: a terminal, never a crash
            outcome.error = ModelError(f"the model raised {type(exc).__name__}: {exc}")
        finally:
            if stream is not None:
                await _aclose(stream)
        st.usage = st.usage + acc.usage
        if engine.parent is not None and acc.usage:
            charge_ancestors(engine, acc.usage)
        events, delay = _conclude(engine, st, acc, outcome, budgets)
        for step in events:
            yield step
        if delay is None:
            return
        if delay > 0:
            try:
                await st.guarded(asyncio.sleep(delay))
            except Aborted:
                st.terminal = abort_terminal(st)
                return


def _not_a_stream(engine: QueryEngine, produced: object) -> ModelError:
    """The error for a ``stream()`` that returned no async iterator (a coroutine is closed,
    so that it does not also warn that it was never awaited)."""
    where = f"{type(engine.model).__name__}.stream()"
    if inspect.iscoroutine(produced):
        produced.close()
        return ModelError(
            f"{where} returned a coroutine, not an async iterator: write it as an async generator "
            "(an async def that yields the stream events)"
        )
    return ModelError(f"{where} returned {type(produced).__name__}, not an async iterator of stream events")


def _conclude(
    engine: QueryEngine, st: RunState, acc: Accumulator, outcome: _Outcome, budgets: _Budgets
) -> tuple[list[Event], float | None]:
    """After one attempt: commit, resample, retry or end.

    Returns the events to yield and, for another attempt, the delay before it
    (None: the phase is over).
    """
    opts = engine.options
    if outcome.aborted:
        settle_partial(engine, st)
        st.terminal = abort_terminal(st)
        return [], None
    if outcome.cut is not None:
        budgets.dooms -= 1
        cut = outcome.cut
        events: list[Event] = [
            DoomLoopDetected(signals=cut.signals, confident=True, action="resample", policy=outcome.policy),
            _discarded(acc, budgets.attempt, "resample"),
            Resampling(attempt=budgets.attempt + 1),
        ]
        budgets.attempt += 1
        budgets.extra = (doom_reminder(opts.texts, acc, cut),)
        budgets.armed = budgets.dooms > 0
        st.acc = None
        return events, 0.0
    error = outcome.error
    if error is None:
        message = clean_assistant(acc.message())
        st.acc = None
        if message is None:
            return [], None
        message = commit_response(engine, message)
        st.response = message
        st.owed, st.results = message.tool_uses, {}  # owed from the moment they are in history
        return [AssistantMessage(message=message, stop_reason=acc.stop_reason)], None
    wait = error.retry_after
    too_long = wait is not None and wait > _MAX_RETRY_AFTER
    if not error.retryable or budgets.retries <= 0 or st.signal.aborted or too_long:
        settle_partial(engine, st)
        st.terminal = "prompt_too_long" if isinstance(error, PromptTooLongError) else "model_error"
        st.error = _describe(error)
        if too_long and error.retryable:
            st.error += (
                f" (not retried: the server asked to wait {wait:.0f} s, longer than the "
                f"{_MAX_RETRY_AFTER:.0f} s the engine waits)"
            )
        return [], None
    budgets.retries -= 1
    delay = _backoff(opts.retry_base_delay, opts.retry_max_delay, opts.retry_budget - budgets.retries, error)
    events = [_discarded(acc, budgets.attempt, "retry")] if not acc.empty else []
    st.acc = None
    budgets.attempt += 1
    events.append(Retrying(attempt=budgets.attempt, error=str(error), delay=delay))
    return events, delay


def _detected(engine: QueryEngine, verdict: Verdict, policy: str) -> DoomLoopDetected:
    if isinstance(verdict, Resample):  # confident, but recovery is off or its budget is spent
        action: Literal["off", "disarmed", "warn"] = "disarmed" if engine.options.doom_loop_recovery else "off"
        return DoomLoopDetected(signals=verdict.signals, confident=True, action=action, policy=policy)
    signals = verdict.signals if isinstance(verdict, Warn) else ()
    return DoomLoopDetected(signals=signals, confident=False, action="warn", policy=policy)


async def _aclose(stream: AsyncIterator[StreamEvent]) -> None:
    close = getattr(stream, "aclose", None)
    if close is not None:
        try:
            await close()
        except Exception:
            log.debug("closing the model stream raised", exc_info=True)


def _stream_watch(engine: QueryEngine) -> tuple[Callable[[StreamEvent], Verdict | None] | None, str | _Panel]:
    """What to call per stream event, and who to credit its verdicts to: a policy
    name, or the `_Panel` that remembers which of several policies spoke.

    Only the policies that override ``on_stream`` are called once per delta; a
    single one is called directly (the common case: one doom-loop policy).
    """
    if not engine.policies:
        return None, ""
    watchers = [p for p in engine.policies if type(p).on_stream is not Policy.on_stream]
    if not watchers:
        return None, ""
    if len(watchers) == 1:
        return watchers[0].on_stream, watchers[0].name
    panel = _Panel(watchers)
    return panel.judge, panel


class _Panel:
    """Several stream-watching policies: the first `Resample` wins, else the first `Warn`.

    Every watcher sees every event, also the one a `Resample` comes on: the stream is not
    cut when recovery is off or its budget spent, and the others go on reading it.
    """

    __slots__ = ("policy", "watchers")

    def __init__(self, watchers: list[Policy]) -> None:
        self.watchers = watchers
        self.policy = ""

    def judge(self, event: StreamEvent) -> Verdict | None:
        found: Verdict | None = None
        for policy in self.watchers:
            try:
                verdict = policy.on_stream(event)
            except Exception:
                log.exception("policy %s.on_stream raised; ignored", policy.name)
                continue
            # The first Resample wins, else the first Warn.
            if (isinstance(verdict, Resample) and not isinstance(found, Resample)) or (
                isinstance(verdict, Warn) and found is None
            ):
                self.policy = policy.name
                found = verdict
        return found


def _tool_delta(event: StreamEvent, acc: Accumulator) -> Event:
    assert isinstance(event, StreamToolInput)
    tool_id, name = acc.tool_identity(event.index)
    return ToolInputDelta(tool_use_id=tool_id, name=name, partial_json=event.partial_json)


def _tool_start(event: StreamEvent, acc: Accumulator) -> Event:
    assert isinstance(event, StreamToolUseStart)
    return ToolInputDelta(tool_use_id=event.id, name=event.name, partial_json="")


# What the host sees of each stream event (by exact type: the hot path avoids isinstance chains).
_DELTAS: dict[type, Callable[[Any, Accumulator], Event]] = {
    StreamText: lambda e, _acc: TextDelta(text=e.text),
    StreamThinking: lambda e, _acc: ThinkingDelta(thinking=e.thinking),
    StreamToolInput: _tool_delta,
    StreamToolUseStart: _tool_start,
}

# Per stream event type, one lookup: how the accumulator applies it, and what the host sees.
_Step = tuple[Callable[[Accumulator, Any], None] | None, Callable[[Any, Accumulator], Event] | None]
_STEPS: dict[type, _Step] = {kind: (APPLY.get(kind), _DELTAS.get(kind)) for kind in (*APPLY, *_DELTAS)}
_IGNORED: _Step = (None, None)  # a type the accumulator does not know (a policy may)


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
    """The delay before retry ``n`` (1-based): the jittered exponential back-off, or the
    server's ``retry_after`` when that is longer. The back-off is a floor: a server that
    answers 429 with ``retry-after: 0`` (or a date in the past) would otherwise have the
    whole budget spent within microseconds."""
    delay = min(base * 2 ** (n - 1), cap) * (1 - 0.25 * random.random())
    if error.retry_after is not None and error.retry_after > delay:
        delay = error.retry_after
    return float(delay)


def _describe(error: ModelError) -> str:
    kind = type(error).__name__
    status = getattr(error, "status", None)
    where = f" (HTTP {status})" if status else ""
    return f"{kind}{where}: {error.message}"
