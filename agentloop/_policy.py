"""The policy seam: how runaway defences plug into the loop.

A policy watches the loop through a few hooks and answers with a verdict. The
engine knows only this module; `agentloop.policies` builds the stock policies
on it. Every hook has a no-op default, so a subclass overrides only what it
needs.

Hook order within a turn:

    begin_turn(real_user)                 a turn starts (real_user: a person wrote it)
      begin_attempt()                     before each model request attempt
        on_stream(event) -> verdict?      every stream event of the attempt
      on_response(message) -> verdict?    the accepted response
      on_results(message, results) -> verdict?   after its tool calls ran
"""

from __future__ import annotations

import copy
import logging
import weakref
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, ClassVar, Literal

from ._messages import Message, ToolResultBlock
from ._model import StreamEvent, ToolSpec
from ._signals import DoomLoopSignal
from ._unicode import scrub

if TYPE_CHECKING:
    from ._accumulate import _Part

__all__ = ["EndTurn", "Nudge", "Policy", "Resample", "Verdict", "Warn", "ask", "claim", "notify", "release"]

log = logging.getLogger("agentloop")


@dataclass(frozen=True, slots=True)
class Warn:
    """Report signals without acting (emits a non-confident DoomLoopDetected)."""

    signals: tuple[DoomLoopSignal, ...] = ()


@dataclass(frozen=True, slots=True)
class Resample:
    """Cut the stream now and resample within the doom budget.

    ``reminder`` replaces the engine's default recovery reminder when set.
    """

    signals: tuple[DoomLoopSignal, ...] = ()
    reminder: str | None = None

    def __post_init__(self) -> None:
        if self.reminder is not None:
            object.__setattr__(self, "reminder", _text(self.reminder, "Resample reminder"))


@dataclass(frozen=True, slots=True)
class Nudge:
    """Add ``reminder`` as a synthetic user message before the next request.

    Raises ValueError for a blank reminder (providers refuse a blank user message).
    """

    reminder: str

    def __post_init__(self) -> None:
        reminder = _text(self.reminder, "Nudge reminder")
        if not reminder.strip():
            raise ValueError("a Nudge needs a reminder with text in it")
        object.__setattr__(self, "reminder", reminder)


@dataclass(frozen=True, slots=True)
class EndTurn:
    """End the turn with ``reason`` (a distinct terminal a headless host can act on)."""

    message: str
    reason: Literal["stationarity_ended", "hook_stopped"] = "stationarity_ended"

    def __post_init__(self) -> None:
        object.__setattr__(self, "message", _text(self.message, "EndTurn message"))


def _text(value: object, what: str) -> str:
    """A verdict's text, as it may enter the transcript: a str, each lone surrogate (a file name
    decoded with surrogateescape, quoted from a tool's output) replaced by U+FFFD."""
    if not isinstance(value, str):
        raise TypeError(f"{what} must be a str, not {type(value).__name__}")
    return scrub(value)


Verdict = Warn | Resample | Nudge | EndTurn


class Policy:
    """Base class: override the hooks you need; each returns None to do nothing.

    ``one_engine``: the policy keeps per-run state (counts, a detector's buffer), so one
    object must not serve two engines' runs at the same time; the engine logs a warning
    when it does. True for the stock doom-loop and stationarity policies.
    """

    one_engine: ClassVar[bool] = False
    #: See `_tap`: how many of the next deltas a tapped watcher leaves to the accumulator.
    _skips = 0

    @property
    def name(self) -> str:
        return type(self).__name__

    def bind(self, tools: Mapping[str, ToolSpec]) -> None:
        """Called by the engine with its tools by name, and again when its tool set
        changes (read tool attributes such as ``stationarity``, ``poller`` and
        ``concurrency_safe`` here)."""

    def fork(self) -> Policy:
        """A fresh copy for a subagent engine (default: a deep copy)."""
        return copy.deepcopy(self)

    def begin_turn(self, *, real_user: bool) -> None:
        """A turn starts, or an interjection is merged into it. ``real_user`` is True when a
        person wrote the text; the library's own messages (nudges) never call this."""

    def begin_attempt(self) -> None:
        """A model request attempt starts (also after a retry or a resample)."""

    def on_stream(self, event: StreamEvent) -> Verdict | None:
        """One stream event. Only Warn and Resample are acted on here."""
        return None

    def _tap(self, blocks: Mapping[int, _Part]) -> Callable[[StreamEvent], Verdict | None] | None:
        """Not a hook for hosts (this default declines): the engine offers the only stream
        watcher the attempt's blocks (`Accumulator.blocks`) after `begin_attempt`. A watcher
        that returns a callable reads text, thinking and tool-input deltas there: the engine
        then calls it in place of `on_stream` for one in ``_skips + 1`` of those deltas only
        (reading ``_skips`` after each call), and for every other event."""
        return None

    def on_response(self, message: Message) -> Verdict | None:
        """The model's accepted response, before its tool calls run."""
        return None

    def on_results(self, message: Message, results: Sequence[ToolResultBlock]) -> Verdict | None:
        """The response's tool calls have run; ``results`` are in call order."""
        return None


def notify(policies: Sequence[Policy], hook: str, **kwargs: bool) -> None:
    """Call the verdict-less ``hook`` of each policy; one that raises is logged and skipped.

    A policy is host code: like a verdict hook that raises, it must not break the run.
    """
    for policy in policies:
        try:
            getattr(policy, hook)(**kwargs)
        except Exception:
            log.exception("policy %s.%s raised; ignored", policy.name, hook)


def ask(policies: Sequence[Policy], hook: str, *args: object) -> list[tuple[str, Verdict]]:
    """The verdicts of ``hook`` (``on_response``, ``on_results``), with the name of the policy
    that gave each; a policy that raises is logged and skipped, one that says nothing is left out."""
    out: list[tuple[str, Verdict]] = []
    for policy in policies:
        try:
            verdict = getattr(policy, hook)(*args)
        except Exception:
            log.exception("policy %s.%s raised; ignored", policy.name, hook)
            continue
        if verdict is not None:
            out.append((policy.name, verdict))
    return out


# id(policy) -> the engine whose run holds it now (policies with ``one_engine`` only).
_holders: dict[int, weakref.ref[Any]] = {}
_warned: set[int] = set()


def claim(policies: Sequence[Policy], engine: object) -> None:
    """A run of ``engine`` starts with ``policies``: warn (once per policy) about a stateful one
    that another engine's run holds at this moment, as a list of policies made once and passed
    to every engine would be; its counts would mix both runs."""
    for policy in policies:
        if not policy.one_engine:
            continue
        key = id(policy)
        held = _holders.get(key)
        other = held() if held is not None else None
        running = other is not None and other is not engine and getattr(other, "_state", None) is not None
        if running and key not in _warned:
            _warned.add(key)
            try:  # the id may be reused once the policy is gone
                weakref.finalize(policy, _warned.discard, key)
            except TypeError:  # __slots__ without __weakref__: the id stays marked
                pass
            log.warning(
                "policy %s is used by the runs of two engines at once: it keeps per-run state, so "
                "each run's counts mix with the other's and neither is judged right; give each "
                "engine its own (default_policies(), a new instance, or policy.fork())",
                policy.name,
            )
        _holders[key] = weakref.ref(engine)


def release(policies: Sequence[Policy], engine: object) -> None:
    """The run of ``engine`` has ended: its policies are free."""
    for policy in policies:
        held = _holders.get(id(policy))
        if held is not None and held() is engine:
            del _holders[id(policy)]
