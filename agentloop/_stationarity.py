"""Stationarity policies: runaway *actions* (SPEC §7), re-exported by `agentloop.policies`.

All of them count in ``on_results`` (after the response's calls ran), which a
retried or resampled attempt never reaches, so a transport retry cannot count
twice. They reset at a genuine user message only.

Identity of a call is `StationarityPolicy.key`: the tool name plus the
canonical JSON of *every* argument (sorted keys, no whitespace, non-ASCII kept),
and, for a tool declared ``poller=True``, a digest of its result. Folding the
result into a poller's key is how polling is told from looping: the same poll
with a changed result is a new key (progress, the run restarts); the same poll
with the same result N times is a run like any other and stops at the
thresholds of its class.
"""

from __future__ import annotations

import hashlib
import json
import logging
import re
from collections import Counter, deque
from collections.abc import Callable, Collection, Hashable, Iterable, Mapping, Sequence
from math import gcd
from typing import Any

from ._checks import count
from ._messages import Message, ToolResultBlock, ToolUseBlock
from ._model import ToolSpec
from ._policy import EndTurn, Nudge, Policy, Verdict

__all__ = [
    "IdenticalToolCallRun",
    "RepeatedErrorResult",
    "StationarityPolicy",
    "ToolCallCycle",
    "canonical_key",
    "is_keepalive",
]

Signature = frozenset[tuple[Hashable, int]]

log = logging.getLogger("agentloop")

_NOOP = re.compile(
    r"\s*(?:true|:|/bin/true|/usr/bin/true|sleep\s+0+(?:\.0+)?s?|exit(?:\s+0)?|wait|echo(?:\s+(?:''|\"\"))?)?"
    r"\s*;?\s*\Z"
)
_COMMAND_KEYS = ("command", "cmd", "script", "shell")
# A word of a tool's name that makes it a shell (bash, run_shell_command, execute_command,
# developer__shell, run_terminal_cmd, runTerminalCommand, exec_command, execute_powershell).
_SHELL_WORDS = frozenset({"bash", "sh", "zsh", "shell", "terminal", "powershell", "pwsh", "cmd", "command", "exec"})
_WORD_BREAK = re.compile(r"(?<=[a-z0-9])(?=[A-Z])|(?<=[A-Z])(?=[A-Z][a-z])")  # runTerminal, MCPShell
_SHELLS = frozenset({"sh", "bash", "zsh", "dash", "ksh", "/bin/sh", "/bin/bash", "/usr/bin/bash", "/bin/zsh"})


def _numbers(value: Any) -> Any:
    """``value`` with every integral float (``1.0``, ``-0.0``, ``1e16``) written as the integer
    it equals (exactly: a float's value is a whole number when it is integral): JSON has one
    number type, so ``1`` and ``1.0`` are one argument."""
    kind = type(value)
    if kind is float:
        return int(value) if value.is_integer() else value
    if kind is dict:
        return {k: _numbers(v) for k, v in value.items()}
    if kind is list:
        return [_numbers(v) for v in value]
    return value


def canonical_key(call: ToolUseBlock) -> tuple[str, str]:
    """(name, canonical JSON of all arguments): equal exactly when the calls are.

    Keys are sorted, whitespace dropped, non-ASCII kept, and numbers compared by value (an
    integral float is written as the integer: ``1.0`` as ``1``). A call whose input was not a
    JSON object has no arguments to encode; its ``input_error`` (which quotes the start of what
    the model sent) stands for them, so two different malformed inputs are two calls, and
    neither is the call with no arguments.
    """
    if call.input_error is not None:
        return call.name, call.input_error
    args = _dumps(call.input)
    if ".0" in args or "e+" in args:  # perhaps an integral float (1.0, 1e+16), perhaps only a string
        try:
            args = _dumps(_numbers(call.input))
        except RecursionError:  # nested deeper than a Python walk goes: compared as written
            pass
    return call.name, args


def _dumps(value: Any) -> str:
    return json.dumps(value, sort_keys=True, separators=(",", ":"), ensure_ascii=False, default=str)


def _shell_name(name: str) -> bool:
    """True when one of the words of a tool's name is a shell's (see `is_keepalive`)."""
    words = re.split(r"[^a-z0-9]+", _WORD_BREAK.sub("_", name).lower())
    return not _SHELL_WORDS.isdisjoint(words)


def is_keepalive(call: ToolUseBlock, *, shell_tools: Collection[str] = ()) -> bool:
    """True for a shell call whose command does nothing: ``true``, ``:``, ``sleep 0``,
    ``exit 0``, ``wait``, a bare ``echo`` or an empty command (SPEC §7).

    A shell call is a call of a tool named in ``shell_tools``, or whose name names a shell:
    one of its words (split at ``_``, ``-``, ``.``, ``/`` and case changes) is ``bash``,
    ``sh``, ``zsh``, ``shell``, ``terminal``, ``powershell``, ``pwsh``, ``cmd``, ``command``
    or ``exec`` (``run_shell_command``, ``execute_command``, ``runTerminalCommand``). Any
    other tool is real work, whatever its arguments read like. The command is the
    ``command``/``cmd``/``script``/``shell`` argument, or the only argument when there is
    just one; a list of strings counts as argv, and an argv that runs a shell on ``-c``
    (``["bash", "-lc", "true"]``) stands for the script it runs.
    """
    if call.name not in shell_tools and not _shell_name(call.name):
        return False
    args = call.input
    cmd: Any = next((args[k] for k in _COMMAND_KEYS if k in args), None)
    if cmd is None and len(args) == 1:
        cmd = next(iter(args.values()))
    if isinstance(cmd, list) and all(isinstance(part, str) for part in cmd):
        if len(cmd) == 3 and cmd[0] in _SHELLS and cmd[1] in ("-c", "-lc"):
            cmd = cmd[2]
        else:
            cmd = " ".join(cmd)
    return isinstance(cmd, str) and _NOOP.match(cmd) is not None


def _names(calls: Sequence[ToolUseBlock]) -> str:
    return ", ".join(sorted({c.name for c in calls}))


def _say(policy: Policy, owner: type, attr: str, **fields: object) -> str:
    """The policy's text ``attr`` filled in with ``fields``. One that cannot be (a field the
    template lacks, a brace meant literally, not a str) is logged, and ``owner``'s own text is
    used: a mistake in a host's wording must not cancel the verdict it announces."""
    text = getattr(policy, attr)
    if isinstance(text, str):
        try:
            return text.format(**fields)
        except Exception:  # KeyError, IndexError, ValueError, AttributeError, or a __format__'s own
            pass
    log.warning(
        "%s.%s %r cannot be filled in (its fields are %s); the stock text is used",
        policy.name,
        attr,
        text,
        ", ".join(f"{{{f}}}" for f in fields),
    )
    stock: str = getattr(owner, attr)
    return stock.format(**fields)


class StationarityPolicy(Policy):
    """Base for action-repetition policies. Override `key` to change what counts
    as "the same call"; subclasses implement ``on_results``.

    Tool classes come from `bind` (``stationarity="tight"``, ``poller=True``) and
    can be added by name with ``tight_tools`` / ``poller_tools`` (lists of names: a bare str
    is a TypeError).
    """

    one_engine = True  # per-run state: one engine at a time

    def __init__(self, *, tight_tools: Iterable[str] = (), poller_tools: Iterable[str] = ()) -> None:
        self.tight_tools = _tool_names("tight_tools", tight_tools)
        self.poller_tools = _tool_names("poller_tools", poller_tools)
        # The names the last `bind` added (those the host named stay whatever the tools say).
        self._bound_tight: set[str] = set()
        self._bound_pollers: set[str] = set()
        self.reset()

    def bind(self, tools: Mapping[str, ToolSpec]) -> None:
        """Take the tool classes from ``tools``, the engine's tools now: a tool the last bind
        made tight or a poller, and that ``tools`` does not declare so (gone, or declared
        otherwise), leaves its class. Names given as ``tight_tools`` / ``poller_tools`` stay."""
        tight = {n for n, spec in tools.items() if getattr(spec, "stationarity", "normal") == "tight"}
        pollers = {n for n, spec in tools.items() if getattr(spec, "poller", False)}
        self.tight_tools -= self._bound_tight
        self._bound_tight = tight - self.tight_tools
        self.tight_tools |= tight
        self.poller_tools -= self._bound_pollers
        self._bound_pollers = pollers - self.poller_tools
        self.poller_tools |= pollers

    def fork(self) -> Policy:
        """A copy with its settings and tool classes, and none of this one's counts: a subagent
        counts its own calls (also one that starts with nothing a person wrote)."""
        twin = super().fork()
        if isinstance(twin, StationarityPolicy):
            twin.reset()
        return twin

    def key(self, call: ToolUseBlock, result: ToolResultBlock | None) -> Hashable:
        """Identity of ``call``: its name and canonical arguments (`canonical_key`), and for a
        poller tool also ``result`` (its error flag and text), so a poll whose answer changed is
        another call."""
        name, args = canonical_key(call)
        if result is None or name not in self.poller_tools:
            return name, args
        digest = hashlib.blake2b(result.text.encode(), digest_size=16).hexdigest()
        return name, args, result.is_error, digest

    def reset(self) -> None:
        """Forget all counters (called at a genuine user message)."""

    def begin_turn(self, *, real_user: bool) -> None:
        if real_user:
            self.reset()

    def signature(self, message: Message, results: Sequence[ToolResultBlock]) -> tuple[Signature, int]:
        """The calls of ``message`` (each keyed with its result in ``results``) as a multiset,
        reduced: (base, multiplicity).

        Order is ignored; ``k`` parallel copies of the same set count ``k`` times
        (five identical calls in one response are five repetitions).
        """
        by_id = {r.tool_use_id: r for r in results}
        counts = Counter(self.key(c, by_id.get(c.id)) for c in message.tool_uses)
        m = gcd(*counts.values())
        return frozenset((k, n // m) for k, n in counts.items()), m


def _tool_names(field: str, names: Iterable[str]) -> set[str]:
    """``names`` as a set; TypeError for a bare str, which would be read letter by letter."""
    if isinstance(names, str):
        raise TypeError(f"{field} takes a list of tool names: {field}=[{names!r}]")
    return set(names)


class IdenticalToolCallRun(StationarityPolicy):
    """Consecutive responses with the identical set of tool calls (SPEC §7).

    At ``nudge_at`` repetitions a reminder is injected, once per pattern (set of
    calls) until the next genuine user message: again only when a run of that
    pattern reaches twice the count of its last nudge, also after a detour; at
    ``end_at`` the turn ends with ``stationarity_ended``. A response made only of tight-class tools uses
    the tight thresholds, ``tight_nudge_at`` and ``tight_end_at``. ``keepalive_end_at`` no-op calls in a row (any mix of
    them, per ``keepalive``) end the turn. ``None`` disables a threshold.
    Texts are `str.format` templates with ``{count}`` and ``{tools}``. Other keyword arguments
    (``kwargs``: ``tight_tools``, ``poller_tools``) go to `StationarityPolicy`.
    """

    nudge_text = (
        "You have made the same tool call(s) ({tools}) {count} times in a row with identical "
        "arguments, and repeating them gives you no new information. Step back, reconsider what "
        "you already know, and try a different approach."
    )
    end_text = (
        "Stopped: the same tool call(s) ({tools}) were repeated {count} times in a row without progress."
    )
    keepalive_text = "Stopped: {count} no-op keep-alive commands in a row ({tools})."

    def __init__(
        self,
        nudge_at: int | None = 8,
        end_at: int | None = 12,
        tight_nudge_at: int | None = 4,
        tight_end_at: int | None = 8,
        keepalive_end_at: int | None = 4,
        *,
        keepalive: Callable[[ToolUseBlock], bool] | None = is_keepalive,
        **kwargs: Any,
    ) -> None:
        self.nudge_at, self.end_at = count("nudge_at", nudge_at, 1), count("end_at", end_at, 1)
        self.tight_nudge_at = count("tight_nudge_at", tight_nudge_at, 1)
        self.tight_end_at = count("tight_end_at", tight_end_at, 1)
        self.keepalive_end_at = count("keepalive_end_at", keepalive_end_at, 1)
        self.keepalive = keepalive
        super().__init__(**kwargs)

    def reset(self) -> None:
        self._last: Signature | None = None
        self.count = 0
        self._nudged: dict[Signature, int] = {}  # pattern -> the count it was last nudged at
        self.idle = 0

    def on_response(self, message: Message) -> Verdict | None:
        if not message.tool_uses:  # a response without calls breaks every run (its nudges are kept)
            self._last, self.count, self.idle = None, 0, 0
        return None

    def on_results(self, message: Message, results: Sequence[ToolResultBlock]) -> Verdict | None:
        calls = message.tool_uses
        if not calls:
            return None
        tools = _names(calls)
        keep = self.keepalive
        self.idle = self.idle + len(calls) if keep and all(keep(c) for c in calls) else 0
        if self.keepalive_end_at is not None and self.idle >= self.keepalive_end_at:
            return EndTurn(_say(self, IdenticalToolCallRun, "keepalive_text", count=self.idle, tools=tools))
        base, m = self.signature(message, results)
        if base == self._last:
            self.count += m
        else:
            self._last, self.count = base, m
        tight = all(c.name in self.tight_tools for c in calls)
        nudge_at = self.tight_nudge_at if tight else self.nudge_at
        end_at = self.tight_end_at if tight else self.end_at
        if end_at is not None and self.count >= end_at:
            return EndTurn(_say(self, IdenticalToolCallRun, "end_text", count=self.count, tools=tools))
        if nudge_at is not None and self.count >= max(nudge_at, 2 * self._nudged.get(base, 0)):
            self._nudged[base] = self.count
            return Nudge(_say(self, IdenticalToolCallRun, "nudge_text", count=self.count, tools=tools))
        return None


class ToolCallCycle(StationarityPolicy):
    """Opt-in: a cycle of 2..``max_period`` different responses (A, B, A, B, ...).

    Nudges when the last cycle has repeated ``nudge_repeats`` times in a row
    (again at twice that), ends the turn at ``end_repeats`` (None: never). Other keyword
    arguments (``kwargs``) go to `StationarityPolicy`.
    """

    nudge_text = (
        "Your last {length} tool-call steps repeat the same cycle of {period} steps {count} times "
        "({tools}). You are going in circles: stop and try a different approach."
    )
    end_text = "Stopped: a cycle of {period} tool-call steps ({tools}) repeated {count} times."

    def __init__(
        self,
        max_period: int = 5,
        nudge_repeats: int = 3,
        end_repeats: int | None = 5,
        **kwargs: Any,
    ) -> None:
        self.max_period = count("max_period", max_period, 2, optional=False)
        self.nudge_repeats = count("nudge_repeats", nudge_repeats, 2, optional=False)
        self.end_repeats = count("end_repeats", end_repeats, 2)
        super().__init__(**kwargs)

    def reset(self) -> None:
        self._history: deque[Signature] = deque(maxlen=self.max_period)
        # The tools each of those responses called: the texts name them whatever `key` returns.
        self._tools: deque[frozenset[str]] = deque(maxlen=self.max_period)
        # _streak[k]: how many of the latest responses each equal the one k before it, so the
        # tail repeats with period k for _streak[k] + k responses, however long the cycle runs.
        self._streak = [0] * (self.max_period + 1)
        self._nudged: dict[tuple[Signature, ...], int] = {}

    def on_response(self, message: Message) -> Verdict | None:
        if not message.tool_uses:
            self._history.clear()
            self._tools.clear()
            self._streak = [0] * (self.max_period + 1)
        return None

    def on_results(self, message: Message, results: Sequence[ToolResultBlock]) -> Verdict | None:
        if not message.tool_uses:
            return None
        sig = self.signature(message, results)[0]
        h, streak = self._history, self._streak
        for k in range(2, self.max_period + 1):
            streak[k] = streak[k] + 1 if len(h) >= k and h[-k] == sig else 0
        h.append(sig)
        self._tools.append(frozenset(c.name for c in message.tool_uses))
        found = self._cycle()
        if found is None:
            return None
        block, reps = found
        fields = {"period": len(block), "count": reps, "length": reps * len(block)}
        tools = ", ".join(sorted(frozenset().union(*list(self._tools)[-len(block) :])))
        if self.end_repeats is not None and reps >= self.end_repeats:
            return EndTurn(_say(self, ToolCallCycle, "end_text", tools=tools, **fields))
        # (A, B) and (B, A) are one cycle seen from two places: key on one rotation.
        pattern = min((block[i:] + block[:i] for i in range(len(block))), key=repr)
        if reps >= max(self.nudge_repeats, 2 * self._nudged.get(pattern, 0)):
            self._nudged[pattern] = reps
            return Nudge(_say(self, ToolCallCycle, "nudge_text", tools=tools, **fields))
        return None

    def _cycle(self) -> tuple[tuple[Signature, ...], int] | None:
        """The shortest tail cycle with enough repetitions to nudge or to end the turn."""
        least = self.nudge_repeats if self.end_repeats is None else min(self.nudge_repeats, self.end_repeats)
        h = self._history
        for k in range(2, min(self.max_period, len(h)) + 1):
            reps = (self._streak[k] + k) // k
            if reps < least:
                continue
            block = tuple(h)[-k:]
            if len(set(block)) >= 2:
                return block, reps
        return None


class RepeatedErrorResult(StationarityPolicy):
    """Opt-in: the same error from the same tool ``nudge_at`` times in a row,
    whatever the arguments (the first ``prefix`` characters of the error are
    compared). A response with a successful result breaks the run: the calls of
    one response are judged together, whatever their order. Nudged once per error
    until the next genuine user message, again when a run of it doubles; the turn ends with
    ``stationarity_ended`` at ``end_at`` (None: never). Other keyword arguments (``kwargs``)
    go to `StationarityPolicy`."""

    nudge_text = (
        "The tool {tools} has returned the same error {count} times in a row. Repeating the call "
        "will not fix it: read the error, then change the approach."
    )
    end_text = "Stopped: the tool {tools} returned the same error {count} times in a row."

    def __init__(
        self, nudge_at: int = 3, end_at: int | None = 6, *, prefix: int = 200, **kwargs: Any
    ) -> None:
        self.nudge_at = count("nudge_at", nudge_at, 1, optional=False)
        self.end_at = count("end_at", end_at, 1)
        self.prefix = count("prefix", prefix, 0, optional=False)
        super().__init__(**kwargs)

    def reset(self) -> None:
        self._last: Hashable | None = None
        self.count = 0
        self._nudged: dict[Hashable, int] = {}  # error -> the count it was last nudged at

    def key(self, call: ToolUseBlock, result: ToolResultBlock | None) -> Hashable:
        """The tool's name and the first ``prefix`` characters of ``result`` (the error), the
        arguments of ``call`` left out."""
        text = result.text[: self.prefix].strip() if result is not None else ""
        return call.name, text

    def on_results(self, message: Message, results: Sequence[ToolResultBlock]) -> Verdict | None:
        # The calls of one response ran together: their order says nothing, so a response is
        # judged as a whole. One with a success breaks the run, and so does one whose errors
        # differ from each other; one whose calls all failed alike extends it.
        by_id = {r.tool_use_id: r for r in results}
        errors: list[Hashable] = []
        name, broken = "", False
        for call in message.tool_uses:
            result = by_id.get(call.id)
            if result is None or not result.is_error:
                broken = True
                continue
            errors.append(self.key(call, result))
            name = call.name
        if broken or len(set(errors)) != 1:
            self._last, self.count = None, 0
            return None
        k = errors[0]
        if k == self._last:
            self.count += len(errors)
        else:
            self._last, self.count = k, len(errors)
        if self.end_at is not None and self.count >= self.end_at:
            return EndTurn(_say(self, RepeatedErrorResult, "end_text", tools=name, count=self.count))
        if self.count >= max(self.nudge_at, 2 * self._nudged.get(k, 0)):
            self._nudged[k] = self.count
            return Nudge(_say(self, RepeatedErrorResult, "nudge_text", tools=name, count=self.count))
        return None
