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
from collections.abc import AsyncIterator, Callable
from typing import TYPE_CHECKING, Literal

from ._abort import cancels_asked, in_task, task_cancelling
from ._accumulate import Accumulator
from ._commit import abort_terminal, commit_response, paused, refused, settle_partial
from ._errors import AbortError, ModelError, PromptTooLongError, StreamProtocolError
from ._events import (
    AssistantMessage,
    AttemptDiscarded,
    DoomLoopDetected,
    Event,
    Resampling,
    Retrying,
)
from ._executor import cancel_grace, describe
from ._hostlog import log_failure
from ._messages import Message
from ._model import ModelRequest, StreamEvent
from ._policy import VERDICTS, Policy, Resample, Verdict, Warn, misplaced, not_a_verdict, notify
from ._quick import quick_new
from ._recovery import doom_reminder
from ._run import RunState, TranscriptView, charge_ancestors, usage_spent
from ._toolphase import run_secrets
from ._transcript import redacted
from ._unicode import scrub

if TYPE_CHECKING:
    from ._engine import QueryEngine

log = logging.getLogger("agentloop")

#: The longest ``retry_after`` (seconds) the engine waits; a server asking for more (a
#: quota that resets in an hour) ends the turn with ``model_error`` instead of a retry.
_MAX_RETRY_AFTER = 60.0


# One of each per model phase: made by functions, not by calling the class (`quick_new`).
_model_request = quick_new(ModelRequest)
_assistant_message = quick_new(AssistantMessage)


class _Outcome:
    """How one attempt ended. The defaults are class attributes: an attempt that ends normally
    (most) sets none of them, so making one runs no ``__init__``."""

    aborted = False
    cut: Resample | None = None
    error: ModelError | None = None
    policy = ""


class ModelPhase:
    """One model phase: stream one response, with transport retries and doom-loop resamples.

    The loop (`_loop.drive`) awaits the model's stream itself and yields the host's events as
    they come, rather than through a generator of this phase (each generator level costs every
    event a resumption). This object holds the phase's state, its two budgets kept apart
    (``retries`` for transport failures, ``dooms`` for confident doom-loop verdicts), and does
    its synchronous steps: `open` an attempt's stream, record an exception that ended it
    (`failed`), act on a stream watcher's verdict (`judged`; the loop calls the watcher
    itself), and `conclude` the attempt (commit, resample, retry or end).
    """

    __slots__ = (
        "acc",
        "armed",
        "attempt",
        "credit",
        "delay",
        "dooms",
        "engine",
        "extra",
        "hushed",
        "misplaced",
        "outcome",
        "retries",
        "skip",
        "st",
        "tap",
        "watch",
    )

    def __init__(self, engine: QueryEngine, st: RunState) -> None:
        self.engine = engine
        self.st = st
        st.phase, st.response, st.paused, st.detail = "model", None, False, None
        opts = engine.options
        self.retries, self.dooms = opts.retry_budget, opts.doom_budget
        self.armed = opts.doom_loop_recovery and opts.doom_budget > 0  # a budget of 0: no resample at all
        self.attempt = 0
        self.extra: tuple[Message, ...] = ()  # the recovery reminder, after a resample
        self.watch, self.credit, self.tap = _stream_watch(engine) if engine.policies else _NO_WATCH
        self.skip = 0  # deltas the loop holds back from a tapped watcher, which sets it (see Policy._tap)
        self.hushed = False  # the single watcher raised in this attempt: logged once, not per event
        self.misplaced = False  # it gave a verdict on_stream does not act on: logged once per attempt
        self.delay: float | None = None  # after `conclude`: the pause before another attempt (None: over)

    def open(self) -> AsyncIterator[StreamEvent] | None:
        """Begin an attempt: its request, then the model's stream. None when the attempt is over
        before it streams anything (aborted, or the model's ``stream()`` failed)."""
        engine, st = self.engine, self.st
        opts = engine.options
        self.acc = st.acc = Accumulator()
        if engine.policies:
            self.hushed = self.misplaced = False
            if isinstance(self.credit, _Panel):
                self.credit.hushed.clear()
                self.credit.misplaced.clear()
            notify(engine.policies, "begin_attempt", engine=engine)
            tap = self.tap
            if tap is not None:
                self.skip = 0
                poke = tap._tap(self.acc.blocks(), self)
                self.watch = poke if poke is not None else tap.on_stream
        request = _model_request(
            messages=TranscriptView(engine.messages, len(engine.messages), self.extra),
            system=opts.system,
            tools=engine.tool_specs,
            tool_choice=opts.tool_choice,
            max_tokens=opts.max_tokens,
            attempt=self.attempt,
        )
        self.outcome = _Outcome()
        if st.signal._reason is not None:  # `aborted`, without a call (see the note in `_loop`)
            self.outcome.aborted = True
            return None
        try:
            produced = engine.model.stream(request, st.signal)
            try:
                return aiter(produced)
            except TypeError:
                raise _not_a_stream(engine, produced) from None
        except Exception as exc:
            self.failed(exc)
            return None
        except asyncio.CancelledError:  # raised by the call itself: no await, so no cancel delivered
            if st.owner_cancelling():
                raise
            self.cancelled_itself()
            return None

    def failed(self, exc: Exception) -> None:
        """The attempt ended with ``exc`` (raised by the model's stream, or by the accumulator for
        a malformed event): an abort or a model error, never a crash."""
        outcome = self.outcome
        if isinstance(exc, AbortError):
            outcome.aborted = self.st.signal.aborted
            if not outcome.aborted:
                outcome.error = ModelError("the model stream raised AbortError without an abort")
        elif isinstance(exc, ModelError):
            outcome.error = exc
        else:  # a model implementation bug: a terminal, never a crash
            outcome.error = ModelError(f"the model raised {describe(exc)}")  # even one that cannot print

    def cancelled_itself(self) -> None:
        """The stream raised CancelledError though neither the run's abort nor anyone else
        cancelled the run's task: it awaited something that was cancelled (a connection's reader
        task, say). A failed request, not a cancel of the host's task."""
        self.failed(ModelError("the model stream raised CancelledError, though the run was not cancelled"))

    def watch_raised(self) -> None:
        """``watch`` raised (called from its ``except``): logged, once per attempt (a broken watcher
        raises on every delta), and taken as no verdict."""
        if not self.hushed:
            self.hushed = True
            log_failure(self.engine, _RAISED, self.credit)

    def judged(self, verdict: Verdict) -> list[DoomLoopDetected]:
        """What the stream-watching policies' ``verdict`` on an event does: the events to show
        the host, one for each policy's verdict (see `_Panel`), but a resample that cuts the
        attempt (``outcome.cut``), which `conclude` reports."""
        credit = self.credit
        if isinstance(credit, str):  # a single watcher, called by the loop itself
            if not isinstance(verdict, Resample | Warn):  # nothing else acts here
                if not isinstance(verdict, VERDICTS):
                    self.hushed = _garbage(self.engine, credit, verdict, hushed=self.hushed)
                elif not self.misplaced:
                    self.misplaced = True
                    misplaced(credit, "on_stream", verdict)
                return []
            heard: list[tuple[str, Verdict]] = [(credit, verdict)]
        else:
            heard = credit.heard
        outcome = self.outcome
        shown: list[DoomLoopDetected] = []
        for policy, said in heard:
            if isinstance(said, Resample) and self.armed:
                if outcome.cut is None:  # the first cuts; the attempt is cut once
                    outcome.cut, outcome.policy = said, policy
                continue
            shown.append(_detected(self.engine, said, policy))
        return shown

    def conclude(self) -> list[Event]:
        """After an attempt (its stream closed): commit, resample, retry or end.

        Returns the events to yield; `delay` is then the pause before another attempt
        (None: the phase is over).
        """
        engine, st, acc, outcome = self.engine, self.st, self.acc, self.outcome
        st.count(acc.usage)
        if engine.parent is not None and acc.usage:
            charge_ancestors(engine, acc.usage)
        self.delay = None
        # An attempt that failed, or stopped short of its end event, once the run was aborted was
        # ended by the abort: a model may honour the signal by ending its stream, or fail as its
        # closed connection does. Not a model error, and not retried.
        if outcome.aborted or (
            st.signal._reason is not None and outcome.cut is None and (outcome.error is not None or not acc.ended)
        ):
            settle_partial(engine, st)
            st.terminal = abort_terminal(st)
            return []
        if outcome.cut is not None:
            return self._resample(outcome.cut)
        error = outcome.error
        if error is None and not acc.ended:  # the stream stopped without its end event: it was cut
            error = StreamProtocolError("the model stream ended without its end event", retryable=True)
        if error is None:
            message = acc.committable()
            st.acc = None
            if message is None:  # nothing to commit: said, should it end the turn
                st.detail = (
                    f"the model's response was empty (stop reason {acc.stop_reason!r}): no text and no "
                    "tool call, so nothing was added to the transcript"
                )
                return []
            st.paused = acc.stop_reason == "pause_turn"
            if st.paused:
                message = paused(message)
            elif acc.stop_reason == "refusal":
                message = refused(message)
            message, calls = commit_response(engine, message)
            st.response = message
            st.owed, st.results = calls, {}  # owed from the moment they are in history
            return [_assistant_message(message=message, stop_reason=acc.stop_reason, usage=acc.usage)]
        return self._retry_or_end(error)

    def _resample(self, cut: Resample) -> list[Event]:
        """A confident doom-loop verdict cut the attempt: another one at once, with a reminder.

        A resample is a model request: none once the run is aborted (an interrupt landed as the
        stream was cut) or its tokens reached a usage limit. The turn ends instead, the cut attempt
        discarded all the same (a loop is never kept), and no Resampling is announced."""
        st, acc = self.st, self.acc
        spent = None if st.signal.aborted else usage_spent(self.engine, st.tokens)
        if st.signal.aborted or spent is not None:
            st.acc = None
            if spent is not None:
                st.terminal = "usage_limit"
                st.detail = f"{self.outcome.policy}: a doom loop was cut and not resampled ({spent})"
            else:
                st.terminal = abort_terminal(st)
            return [
                DoomLoopDetected(signals=cut.signals, confident=True, action="ended", policy=self.outcome.policy),
                _discarded(acc, self.attempt, "resample"),
            ]
        self.dooms -= 1
        events: list[Event] = [
            DoomLoopDetected(signals=cut.signals, confident=True, action="resample", policy=self.outcome.policy),
            _discarded(acc, self.attempt, "resample"),
            Resampling(attempt=self.attempt + 1),
        ]
        self.attempt += 1
        self.extra = (doom_reminder(self.engine.options.texts, acc, cut),)
        self.armed = self.dooms > 0
        self.st.acc = None
        self.delay = 0.0
        return events

    def _retry_or_end(self, error: ModelError) -> list[Event]:
        """The attempt failed: another one after a back-off while the error is retryable and
        the budget lasts, else the phase ends with a terminal that says what failed."""
        engine, st, acc = self.engine, self.st, self.acc
        opts = engine.options
        wait = error.retry_after
        too_long = wait is not None and wait > _MAX_RETRY_AFTER
        # A retry is a model request: none once the run's tokens have reached a usage limit.
        spent = usage_spent(engine, st.tokens) if error.retryable else None
        if not error.retryable or self.retries <= 0 or st.signal.aborted or too_long or spent is not None:
            settle_partial(engine, st)
            st.terminal = "prompt_too_long" if isinstance(error, PromptTooLongError) else "model_error"
            st.error = _describe(error, run_secrets(engine, st))
            if spent is not None:
                st.terminal, st.detail = "usage_limit", spent
                st.error += f" (not retried: {spent})"
            elif too_long and error.retryable:
                st.error += (
                    f" (not retried: the server asked to wait {wait:.0f} s, longer than the "
                    f"{_MAX_RETRY_AFTER:.0f} s the engine waits)"
                )
            return []
        self.retries -= 1
        delay = _backoff(opts.retry_base_delay, opts.retry_max_delay, opts.retry_budget - self.retries, error)
        events: list[Event] = [_discarded(acc, self.attempt, "retry")] if not acc.empty or acc.usage else []
        st.acc = None
        self.attempt += 1
        events.append(Retrying(attempt=self.attempt, error=redacted(str(error), run_secrets(engine, st)), delay=delay))
        self.delay = delay
        return events


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


def _detected(engine: QueryEngine, verdict: Verdict, policy: str) -> DoomLoopDetected:
    if isinstance(verdict, Resample):  # confident, but recovery is off or its budget is spent
        action: Literal["off", "disarmed", "warn"] = "disarmed" if engine.options.doom_loop_recovery else "off"
        return DoomLoopDetected(signals=verdict.signals, confident=True, action=action, policy=policy)
    signals = verdict.signals if isinstance(verdict, Warn) else ()
    return DoomLoopDetected(signals=signals, confident=False, action="warn", policy=policy)


async def close_stream(engine: QueryEngine, stream: AsyncIterator[StreamEvent]) -> None:
    """Close an attempt's stream. What its closing raises is logged (at DEBUG, without the
    credentials the engine knows) and the attempt's outcome stands, a CancelledError included
    unless the task running the loop is being cancelled (then it is the host's, and propagates).
    An error the close raised for a cancel of that task that came while it waited (the stream
    turned the cancel into it) is that cancel: it propagates as a CancelledError.

    Once the run is stopping (its signal aborted, or its task cancelled), the close gets what is
    left of ``tool_cancel_grace`` counted from the abort (at least 0.1 s); a close of a stream
    nobody stopped gets the whole grace (at least 0.1 s). Then it is cancelled once, with a
    warning: a close that honours that cancel cannot keep `run()` from ending (one that swallows
    it too can: the close runs in the run's task, which nothing can abandon)."""
    close = getattr(stream, "aclose", None)
    if close is None:
        return
    limit = _close_limit(engine)
    scope = asyncio.timeout(limit) if limit is not None else None
    asked = cancels_asked()
    try:
        if scope is None:
            await close()
        else:
            async with scope:
                await close()
    except Exception as exc:
        # First: the scope took its own cancel back, so a count above the one before is another's
        # (the host's), which the close turned into this error, also when the scope expired too.
        if cancels_asked() > asked:
            raise asyncio.CancelledError from exc
        if scope is None or not scope.expired():  # else cut at its limit: warned below
            log_failure(engine, "closing the model stream raised", level=logging.DEBUG)
    except asyncio.CancelledError:
        if _owner_cancelling(engine):
            raise
        log_failure(
            engine, "closing the model stream raised CancelledError, though the run was not cancelled", level=logging.DEBUG
        )
    if scope is not None and scope.expired():  # an ordinary time-out: logged without its traceback
        log.warning("the model stream did not close within %.3g s and was cancelled", limit)


def _close_limit(engine: QueryEngine) -> float | None:
    """How long a stream's close may take: what is left of the cancel grace once the run is
    stopping, the whole grace while it is not; None where nothing can cancel the close (no task)."""
    st = engine._state
    if not in_task():
        return None
    if st is None or (not st.signal.aborted and not st.owner_cancelling()):
        return cancel_grace(engine.options)
    return st.step_grace(engine.options.tool_cancel_grace)


def _owner_cancelling(engine: QueryEngine) -> bool:
    """`RunState.owner_cancelling` of ``engine``'s run (`task_cancelling` with none)."""
    st = engine._state
    return st.owner_cancelling() if st is not None else task_cancelling()


_RAISED = "policy %s.on_stream raised; ignored (logged once per attempt)"

#: What `_stream_watch` finds for an engine without policies, taken as is: no call per phase.
_NO_WATCH: tuple[None, str, None] = (None, "", None)


def _stream_watch(
    engine: QueryEngine,
) -> tuple[Callable[[StreamEvent], Verdict | None] | None, str | _Panel, Policy | None]:
    """What to call per stream event, who to credit its verdicts to (a policy name, or
    the `_Panel` that remembers which of several policies spoke), and the single watcher
    the engine may tap (`Policy._tap`).

    Only the policies that override ``on_stream`` are called once per delta; a
    single one is called directly, and if it takes the tap at an attempt's start
    (the common case: the stock doom-loop policy alone) only for some deltas.
    """
    if not engine.policies:
        return None, "", None
    watchers = [p for p in engine.policies if type(p).on_stream is not Policy.on_stream]
    if not watchers:
        return None, "", None
    if len(watchers) == 1:
        return watchers[0].on_stream, watchers[0].name, watchers[0]
    panel = _Panel(watchers, engine)
    return panel.judge, panel, None


class _Panel:
    """Several stream-watching policies. Every watcher sees every event, also the one a
    `Resample` comes on: the stream is not cut when recovery is off or its budget spent, and
    the others go on reading it. Each one's `Warn` or `Resample` on an event is kept in
    ``heard`` (in ``policies`` order) for `ModelPhase.judged`, which reports each; the first
    `Resample` is the one that cuts the attempt.
    """

    __slots__ = ("engine", "heard", "hushed", "misplaced", "watchers")

    def __init__(self, watchers: list[Policy], engine: QueryEngine) -> None:
        self.watchers = watchers
        self.engine = engine  # whose credentials a watcher's error is logged without
        self.hushed: set[int] = set()  # the watchers (by index) that raised in this attempt, logged once
        self.misplaced: set[int] = set()  # those that gave a verdict on_stream does not act on, logged once
        self.heard: list[tuple[str, Verdict]] = []

    def judge(self, event: StreamEvent) -> Verdict | None:
        """The first `Resample` given on ``event``, else the first `Warn`, else None; ``heard``
        is set only when one is returned (nothing is stored for the events nobody speaks on)."""
        heard: list[tuple[str, Verdict]] | None = None
        for i, policy in enumerate(self.watchers):
            try:
                verdict = policy.on_stream(event)
            except Exception:
                if i not in self.hushed:
                    self.hushed.add(i)
                    log_failure(self.engine, _RAISED, policy.name)
                continue
            if verdict is None:
                continue
            if not isinstance(verdict, Resample | Warn):  # nothing else acts here
                if not isinstance(verdict, VERDICTS):
                    if _garbage(self.engine, policy.name, verdict, hushed=i in self.hushed):
                        self.hushed.add(i)
                elif i not in self.misplaced:
                    self.misplaced.add(i)
                    misplaced(policy.name, "on_stream", verdict)
                continue
            if heard is None:
                heard = []
            heard.append((policy.name, verdict))
        if heard is None:
            return None
        self.heard = heard
        return next((said for _, said in heard if isinstance(said, Resample)), heard[0][1])


def _garbage(engine: QueryEngine, policy: str, value: object, *, hushed: bool) -> bool:
    """``on_stream`` returned what is not a verdict: logged once per attempt (without ``engine``'s
    credentials), like a raise (a broken watcher does it on every event), and a coroutine closed
    every time. Returns True."""
    if not hushed:
        not_a_verdict(policy, "on_stream", value, engine)
    elif inspect.iscoroutine(value):
        value.close()
    return True


def _discarded(acc: Accumulator, attempt: int, reason: str) -> AttemptDiscarded:
    text = acc.text()
    thinking = acc.thinking_text()
    return AttemptDiscarded(
        attempt=attempt,
        reason="retry" if reason == "retry" else "resample",
        text_chars=len(text),
        thinking_chars=len(thinking),
        usage=acc.usage,
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


def _describe(error: ModelError, secrets: tuple[str, ...]) -> str:
    """What failed, for `TurnEnded.error` (and the results of the calls the failure left unrun):
    scrubbed of lone surrogates, as the model's other output is (a model of the host's own may
    quote a server's text as it came), and of the credentials the engine knows, ``secrets`` (a
    model of the host's own may quote its ancestors' key: the built-in ones scrub their own)."""
    kind = type(error).__name__
    status = getattr(error, "status", None)
    where = f" (HTTP {status})" if status else ""
    return redacted(scrub(f"{kind}{where}: {error.message}"), secrets)
