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

import contextlib
import copy
import inspect
import logging
import weakref
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, ClassVar, Literal, Protocol

from ._forklock import ForkSafeLock
from ._hostlog import host_repr, log_failure
from ._messages import Message, ToolResultBlock
from ._model import StreamEvent, ToolSpec
from ._signals import DoomLoopSignal
from ._unicode import scrub

if TYPE_CHECKING:
    from ._accumulate import _Part

__all__ = [
    "HOOKS",
    "VERDICTS",
    "EndTurn",
    "Nudge",
    "Policy",
    "Resample",
    "Verdict",
    "Warn",
    "ask",
    "bind_all",
    "check_hooks",
    "claim",
    "misplaced",
    "not_a_verdict",
    "notify",
    "release",
]

log = logging.getLogger("agentloop")


@dataclass(frozen=True, slots=True)
class Warn:
    """Report signals without acting (emits a non-confident DoomLoopDetected)."""

    signals: tuple[DoomLoopSignal, ...] = ()


@dataclass(frozen=True, slots=True)
class Resample:
    """Cut the stream now and resample within the doom budget.

    ``reminder`` replaces the engine's default recovery reminder when set; a blank one stands
    for the engine's (``None``: the request would end with a blank user message, which providers
    refuse). ``replay=False`` leaves the cut attempt's text and reasoning out of the reminder
    (for a policy that cut it for what it said, rather than for a loop the model should see and
    leave).
    """

    signals: tuple[DoomLoopSignal, ...] = ()
    reminder: str | None = None
    replay: bool = True

    def __post_init__(self) -> None:
        if self.reminder is not None:
            reminder = _text(self.reminder, "Resample reminder")
            object.__setattr__(self, "reminder", reminder if reminder.strip() else None)


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
    """End the turn with ``reason`` (a distinct terminal a headless host can act on).

    Raises ValueError for any other reason: a policy's stop must not pass for a turn the model
    finished (``completed``), an interrupt, or a terminal SPEC §10 does not have.
    """

    message: str
    reason: Literal["stationarity_ended", "hook_stopped"] = "stationarity_ended"

    def __post_init__(self) -> None:
        object.__setattr__(self, "message", _text(self.message, "EndTurn message"))
        if self.reason not in ("stationarity_ended", "hook_stopped"):
            raise ValueError(f'EndTurn reason must be "stationarity_ended" or "hook_stopped", not {self.reason!r}')


def _text(value: object, what: str) -> str:
    """A verdict's text, as it may enter the transcript: a str, each lone surrogate (a file name
    decoded with surrogateescape, quoted from a tool's output) replaced by U+FFFD."""
    if not isinstance(value, str):
        raise TypeError(f"{what} must be a str, not {type(value).__name__}")
    return scrub(value)


Verdict = Warn | Resample | Nudge | EndTurn


class Hold(Protocol):
    """The engine's side of a tapped watcher (see `Policy._tap`): the count of deltas it holds back."""

    skip: int


class Policy:
    """Base class: override the hooks you need; each returns None to do nothing.

    ``one_engine``: the policy keeps per-run state (counts, a detector's buffer), so one
    object must not serve two engines' runs at the same time: the engine made, or whose run
    starts, while another engine's run holds it puts its `fork` in its place, keeps that, and
    logs a warning (so a fork drops the per-run state a deep copy would carry over).
    True for the stock doom-loop and stationarity policies.
    """

    one_engine: ClassVar[bool] = False

    @property
    def name(self) -> str:
        """The name events and logs give the policy (`DoomLoopDetected.policy`,
        `PolicyNudge.policy`): its class's name, unless a subclass says otherwise."""
        return type(self).__name__

    def bind(self, tools: Mapping[str, ToolSpec]) -> None:
        """Called by the engine with its tools by name, and again when its tool set
        changes (read tool attributes such as ``stationarity``, ``poller`` and
        ``concurrency_safe`` here)."""

    def fork(self) -> Policy:
        """A fresh copy for a subagent engine (default: a deep copy). Raises TypeError naming the
        policy when the copy fails (it holds a lock, a client, a file): override `fork` then."""
        try:
            return copy.deepcopy(self)
        except (TypeError, copy.Error) as exc:
            raise TypeError(
                f"{self.name}.fork() makes a deep copy of the policy for a subagent, and it failed "
                f"({exc}): override fork() to return the copy a subagent should get (a new "
                "instance, or self to share one object across the tree)"
            ) from exc

    def begin_turn(self, *, real_user: bool) -> None:
        """A turn starts, or an interjection is merged into it. ``real_user`` is True when a
        person wrote the text; the library's own messages (nudges) never call this."""

    def begin_attempt(self) -> None:
        """A model request attempt starts (also after a retry or a resample)."""

    def on_stream(self, event: StreamEvent) -> Verdict | None:
        """One stream event. Only Warn and Resample are acted on here (another verdict is
        ignored, with a warning once per attempt)."""
        return None

    def _tap(self, blocks: Mapping[int, _Part], hold: Hold) -> Callable[[StreamEvent], Verdict | None] | None:
        """Not a hook for hosts (this default declines): the engine offers the only stream
        watcher the attempt's blocks (`Accumulator.blocks`) after `begin_attempt`. A watcher
        that returns a callable reads text, thinking and tool-input deltas there: the engine
        then calls it in place of `on_stream` for every event but the deltas it holds back.
        ``hold.skip`` (0 at first) is how many of the next deltas it holds back, counting down;
        the watcher sets it itself, whenever it is called (no call of the engine's per hand-over)."""
        return None

    def on_response(self, message: Message) -> Verdict | None:
        """The model's accepted response, before its tool calls run."""
        return None

    def on_results(self, message: Message, results: Sequence[ToolResultBlock]) -> Verdict | None:
        """The response's tool calls have run; ``results`` are in call order."""
        return None


def notify(policies: Sequence[Policy], hook: str, *, engine: Any = None, **kwargs: bool) -> None:
    """Call the verdict-less ``hook`` of each policy; one that raises is logged and skipped.

    A policy is host code: like a verdict hook that raises, it must not break the run. With
    ``engine``, the credentials it knows are kept out of the record (`log_failure`).
    """
    for policy in policies:
        try:
            getattr(policy, hook)(**kwargs)
        except Exception:
            log_failure(engine, "policy %s.%s raised; ignored", policy.name, hook)


def ask(policies: Sequence[Policy], hook: str, *args: object, engine: Any = None) -> list[tuple[str, Verdict]]:
    """The verdicts of ``hook`` (``on_response``, ``on_results``), with the name of the policy
    that gave each; a policy that raises is logged (without ``engine``'s credentials) and
    skipped, one that says nothing is left out."""
    out: list[tuple[str, Verdict]] = []
    for policy in policies:
        try:
            verdict = getattr(policy, hook)(*args)
        except Exception:
            log_failure(engine, "policy %s.%s raised; ignored", policy.name, hook)
            continue
        if verdict is None:
            continue
        if not isinstance(verdict, VERDICTS):
            not_a_verdict(policy.name, hook, verdict, engine)
            continue
        if not isinstance(verdict, ACTS_ON[hook]):
            misplaced(policy.name, hook, verdict)
            continue
        out.append((policy.name, verdict))
    return out


#: The verdict classes, for an isinstance check of what a hook returned.
VERDICTS = (Warn, Resample, Nudge, EndTurn)
#: The verdicts each verdict hook acts on; any other is ignored (and `misplaced` says so).
ACTS_ON: dict[str, tuple[type, ...]] = {
    "on_stream": (Warn, Resample),
    "on_response": (EndTurn, Nudge),
    "on_results": (EndTurn, Nudge),
}
#: The hooks the engine calls without awaiting them (`check_hooks`).
HOOKS = ("bind", "fork", "begin_turn", "begin_attempt", "on_stream", "on_response", "on_results")


def not_a_verdict(policy: str, hook: str, value: object, engine: Any = None) -> None:
    """A hook returned something that is neither a verdict nor None (``"stop"``, True): a policy
    bug, logged and ignored like one that raises, its repr shortened and without ``engine``'s
    credentials (`host_repr`). A coroutine (an async function set on the instance, which
    `check_hooks` cannot see) is closed, so it is not reported again, unawaited."""
    if inspect.iscoroutine(value):
        value.close()
    log.error(
        "policy %s.%s returned %s, not a verdict (Nudge, EndTurn, Warn, Resample or None); ignored",
        policy,
        hook,
        host_repr(engine, value, short=True),
    )


def misplaced(policy: str, hook: str, verdict: Verdict) -> None:
    """A hook returned a verdict it does not act on (an `EndTurn` from ``on_stream``: a budget
    written in the wrong hook never ends anything): a warning naming the hooks that act on it.
    The caller logs it once per attempt and policy; the verdict is ignored."""
    kind = next(v.__name__ for v in VERDICTS if isinstance(verdict, v))
    acted = ACTS_ON[hook]
    where = " or ".join(h for h, kinds in ACTS_ON.items() if isinstance(verdict, kinds))
    log.warning(
        "policy %s.%s returned %s, which is ignored: %s acts only on %s (return %s from %s)",
        policy,
        hook,
        kind,
        hook,
        " and ".join(v.__name__ for v in acted),
        kind,
        where,
    )


# The policy classes `check_hooks` has passed, so an engine made per request with the stock
# policies does not inspect their hooks again.
_plain_hooks: weakref.WeakSet[type] = weakref.WeakSet()


def check_hooks(policy: Policy) -> None:
    """Raises TypeError when one of ``policy``'s hooks is an ``async def``: the engine calls
    hooks and acts on what they return, so a coroutine would never run, and the policy never act."""
    cls = type(policy)
    if cls in _plain_hooks:
        return
    for hook in HOOKS:
        fn = getattr(cls, hook, None)
        if inspect.iscoroutinefunction(fn) or inspect.isasyncgenfunction(fn):
            raise TypeError(
                f"policy hooks are plain functions, called and not awaited: {type(policy).__name__}.{hook} "
                "is an async def (do the waiting in a tool, or in a task the policy starts and reads later)"
            )
    _plain_hooks.add(cls)


class _ByPolicy:
    """Something known of each policy, by identity (a policy may define ``__eq__``): its entry
    goes as the policy is collected, so nothing is kept for policies gone, and a policy made
    later at a collected one's address is not taken for it."""

    def __init__(self) -> None:
        self._entries: dict[int, tuple[weakref.ref[Policy], Any]] = {}

    def __len__(self) -> int:
        return len(self._entries)

    def get(self, policy: Policy) -> Any:
        entry = self._entries.get(id(policy))
        return entry[1] if entry is not None and entry[0]() is policy else None

    def put(self, policy: Policy, value: Any) -> None:
        key = id(policy)
        entry = self._entries.get(key)
        ref = entry[0] if entry is not None and entry[0]() is policy else weakref.ref(policy, self._forget(key))
        self._entries[key] = (ref, value)

    def drop(self, policy: Policy) -> None:
        if self.get(policy) is not None:
            self._entries.pop(id(policy), None)

    def _forget(self, key: int) -> Callable[[weakref.ref[Policy]], None]:
        def gone(ref: weakref.ref[Policy]) -> None:  # the entry of a new policy at the address stays
            entry = self._entries.get(key)
            if entry is not None and entry[0] is ref:
                self._entries.pop(key, None)

        return gone


def _engine_of(ref: weakref.ref[Any] | None) -> Any:
    return ref() if ref is not None else None


# Each policy's engine it was last bound to (weakly: an engine is not kept for its policies).
_bound = _ByPolicy()


def bind_all(policies: Sequence[Policy], engine: Any, *, strict: bool = False) -> None:
    """Bind each policy to ``engine``'s tools (`Policy.bind`) and remember that it was.

    ``strict``: a bind that raises propagates (at construction); else it is logged and the
    others are bound all the same."""
    for policy in policies:
        try:
            policy.bind(engine.tools)
        except Exception:
            if strict:
                raise
            log_failure(engine, "policy %s.bind raised; ignored", policy.name)
        _bound.put(policy, weakref.ref(engine))


# Each policy's engine whose run holds it now (policies with ``one_engine`` only, weakly), and
# what it was warned about ("forked", "shared": each outcome of its forks once).
_holders = _ByPolicy()
_warned = _ByPolicy()
# Each policy an engine is being made over, or is setting its tools for, by that engine (`occupied`).
_busy = _ByPolicy()
# Held while a run's claim looks whether another engine has its policies and marks the others its
# own, by runs starting in two threads at once: never while a policy's fork() (the host's code) or
# a log handler runs. Reentrant, so that nothing run while it is held (a collection's weakref
# callbacks included) could ever deadlock on it.
_claiming = ForkSafeLock()  # a forked child finds it free


def claim(policies: list[Policy], engine: Any) -> list[Policy]:
    """A run of ``engine`` starts with ``policies`` (the engine's own list). A stateful one
    (``one_engine``) that another engine's run holds at this moment, as a list made once and
    passed to every engine would be, is replaced in ``policies`` by its `Policy.fork`, which
    this engine keeps from then on: each run is judged by counts of its own, and neither writes
    over the other's state. A warning says so, once per policy. Returns the forks put in place
    (they have seen none of this engine's transcript yet). A policy bound to another engine's
    tools since this engine bound it (a list shared by engines with other tools, one run after
    the other) is bound to this engine's again, so its tool classes are this run's."""
    with _claiming:  # engines of two threads: the look and the take are one step
        held = _held_at(policies, engine)
        _mark(_holders, [p for i, p in enumerate(policies) if i not in held], engine)
    forks = _fork_at(policies, engine, held, _holders)  # outside the lock: fork() is the host's code
    if held:
        with _claiming:  # the forks, or a policy that could not be forked (shared then, warned)
            _mark(_holders, [policies[i] for i in held], engine)
    stale = [p for p in policies if _engine_of(_bound.get(p)) is not engine]
    if stale:
        bind_all(stale, engine)
    return forks


@contextlib.contextmanager
def occupied(policies: list[Policy], engine: Any) -> Iterator[list[Policy]]:
    """While ``engine`` is made (binding its tools, catching up on its transcript) or sets its
    tools, the stateful policies of ``policies`` (its own list) are its own: one another
    engine's run holds is replaced by its fork first (see `claim`), and a run starting in
    another thread meanwhile forks the others. Yields the forks put in place."""
    with _claiming:
        held = _held_at(policies, engine)
        mine = [p for i, p in enumerate(policies) if p.one_engine and i not in held]
        _mark(_busy, mine, engine)
    forks: list[Policy] = []
    try:
        forks = _fork_at(policies, engine, held, _busy)
        yield forks
    finally:
        with _claiming:
            for policy in mine + forks:
                if _engine_of(_busy.get(policy)) is engine:
                    _busy.drop(policy)


def _held_at(policies: list[Policy], engine: Any) -> set[int]:
    """The places in ``policies`` of the stateful policies another engine has now (the lock held)."""
    return {i for i, p in enumerate(policies) if p.one_engine and _held_elsewhere(p, engine)}


def _mark(marks: _ByPolicy, policies: list[Policy], engine: Any) -> None:
    for policy in policies:
        if policy.one_engine:
            marks.put(policy, weakref.ref(engine))


def _fork_at(policies: list[Policy], engine: Any, held: set[int], marks: _ByPolicy) -> list[Policy]:
    """Put in ``policies`` the fork of each policy at a place of ``held``, marked ``engine``'s
    in ``marks``; return the forks."""
    forks: list[Policy] = []
    for i in sorted(held):
        twin = _own_copy(policies[i], engine, marks)
        if twin is not None:
            policies[i] = twin
            forks.append(twin)
    return forks


def _held_elsewhere(policy: Policy, engine: object) -> bool:
    """Another engine's run holds ``policy`` now, or another engine is being made over it or
    setting its tools."""
    other = _engine_of(_holders.get(policy))
    if other is not None and other is not engine and getattr(other, "_state", None) is not None:
        return True
    busy = _engine_of(_busy.get(policy))
    return busy is not None and busy is not engine


_FORKED = (
    "policy %s is used by two engines at once: it keeps per-run state, so the engine made, or "
    "whose run started, while the other's run held it now uses its own policy.fork() of it, and "
    "keeps it; give each engine its own (default_policies(), a new instance, or policy.fork()) to "
    "be rid of this warning"
)
_SHARED = (
    "policy %s is used by two engines at once: it keeps per-run state, and its fork() "
    "gives %s, so each run's counts mix with the other's and neither is judged right; give each "
    "engine its own (default_policies(), a new instance, or policy.fork())"
)


def _own_copy(policy: Policy, engine: Any, marks: _ByPolicy) -> Policy | None:
    """``policy``'s fork for ``engine``, marked its own in ``marks`` (in the step that sees no
    other engine has it) and warned about once per policy and outcome; None when `fork` raises or gives no
    other policy free to take (the policy itself, to share one object, or one another engine is
    using, a pool's spare handed out twice): both runs share ``policy`` then, and the warning
    says they are not judged right."""
    try:
        twin = policy.fork()
        if isinstance(twin, Policy):
            check_hooks(twin)
    except Exception as exc:
        twin, got = None, f"an error ({type(exc).__name__})"
    else:
        got = "the policy itself" if twin is policy else f"a {type(twin).__name__}, not another policy"
    ok = isinstance(twin, Policy) and twin is not policy
    with _claiming:  # two threads forking one policy at once: one warning
        if ok and twin is not None and twin.one_engine:
            ok = not _held_elsewhere(twin, engine)
            if ok:
                _mark(marks, [twin], engine)
            else:
                got = "a policy another engine is using"
        outcome = "forked" if ok else "shared"
        told: frozenset[str] = _warned.get(policy) or frozenset()
        first = outcome not in told
        _warned.put(policy, told | {outcome})
    if first:
        if ok:
            log.warning(_FORKED, policy.name)
        else:
            log.warning(_SHARED, policy.name, got)
    return twin if ok else None


def release(policies: Sequence[Policy], engine: object) -> None:
    """The run of ``engine`` has ended: its policies are free."""
    for policy in policies:
        if _engine_of(_holders.get(policy)) is engine:
            _holders.drop(policy)
