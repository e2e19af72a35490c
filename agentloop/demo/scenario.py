"""Scenarios: a person's actions, scripted, for ``python -m agentloop demo --script``.

A scenario is a JSON object (or just the list of steps)::

    {
      "prompt": "Fix the failing test in utils.py",
      "timeout": 120,
      "steps": [
        {"on": "text_delta", "count": 3, "do": "interrupt", "reason": "cancel"},
        {"on": "idle", "do": "prompt", "text": "Go on."},
        {"on": "tool_call_started", "tool": "run_tests", "do": "interject", "text": "Keep the API."},
        {"on": "tool_call_started", "tool": "run_tests", "delay": 0.5, "do": "send_now", "text": "Stop."}
      ]
    }

Steps run in order. Each waits for its trigger, counting only events seen after
the previous step fired:

- ``on``: an event ``type`` (``text_delta``, ``thinking_delta``,
  ``tool_call_started``, ``tool_call_finished``, ``permission_requested``,
  ``interjection_injected``, ``policy_nudge``, ``doom_loop_detected``,
  ``resampling``, ``turn_started``, ``turn_ended``, ...) or ``"idle"`` (no run
  in progress; the default);
- ``count``: fire at the n-th matching event (default 1);
- filters: ``tool`` (the tool name of a tool event), ``terminal`` (the reason
  of a ``turn_ended``), ``turn`` (the session's turn number, from 1);
- ``delay``: seconds to wait after the trigger before acting.

``do`` is one of: ``interrupt`` (``reason``, default "cancel"),
``interject``, ``follow_up``, ``send_now``, ``submit``, ``prompt`` (start a
turn with ``text``; queued as a follow-up if a run is going), ``mode``
(``text`` is "steer" or "queue"), ``transcript`` (print it) and ``quit``.
The scenario ends when the last step has fired and the agent is idle; a step
still waiting for an event while the agent is idle is reported as stuck. Ctrl-C
cancels the turn in progress (as at the keyboard) and ends the scenario there,
reported as interrupted; a second Ctrl-C quits.
"""

from __future__ import annotations

import asyncio
import math
from collections.abc import Callable, Mapping
from dataclasses import dataclass, fields
from pathlib import Path
from typing import Any, TypeGuard, get_args

from .._events import Event, TerminalReason, TurnEnded, TurnStarted
from .._jsondepth import loads
from .host import Host

__all__ = ["BUILTIN", "Player", "Scenario", "ScenarioError", "Step", "load"]

_ACTIONS = {"interrupt", "interject", "follow_up", "send_now", "submit", "prompt", "mode", "transcript", "quit"}
_SENDS = {"interject", "follow_up", "send_now", "submit"}  # the engine refuses a blank text


class ScenarioError(ValueError):
    """A scenario file that cannot be played."""


@dataclass(frozen=True, slots=True)
class Step:
    do: str
    on: str = "idle"
    count: int = 1
    text: str = ""
    reason: str = "cancel"
    tool: str | None = None
    terminal: str | None = None
    turn: int | None = None
    delay: float = 0.0

    def describe(self) -> str:
        when = self.on if self.on == "idle" else f"{self.on} #{self.count}"
        for key in ("tool", "terminal", "turn"):
            if getattr(self, key) is not None:
                when += f" {key}={getattr(self, key)}"
        what = self.do + (f"({self.reason})" if self.do == "interrupt" else f" {self.text!r}" if self.text else "")
        return f"when {when}: {what}"


@dataclass(frozen=True, slots=True)
class Scenario:
    prompt: str | None
    steps: tuple[Step, ...]
    timeout: float = 120.0


BUILTIN: dict[str, Any] = {
    "prompt": "Fix the failing test in utils.py",
    "steps": [
        {"on": "text_delta", "count": 3, "do": "interrupt", "reason": "cancel"},
        {"on": "idle", "do": "prompt", "text": "Sorry, go on: start by listing the files."},
        {"on": "tool_call_started", "tool": "run_tests", "do": "interject",
         "text": "Keep the public API of utils.py unchanged."},
        {"on": "tool_call_started", "tool": "run_tests", "delay": 0.3, "do": "send_now",
         "text": "Run the tests once more and tell me the result."},
        {"on": "idle", "do": "prompt", "text": "Now wait for CI to go green."},
    ],
}


def load(source: str) -> Scenario:
    """``source`` is "builtin" or a path to a JSON file. Raises ScenarioError."""
    if source == "builtin":
        return parse(BUILTIN)
    try:
        data = loads(Path(source).read_text(encoding="utf-8"))
    except (OSError, ValueError) as exc:
        raise ScenarioError(f"cannot read scenario {source}: {exc}") from None
    return parse(data)


def _number(value: object) -> TypeGuard[float]:
    """A JSON number that is finite (``true`` is not one)."""
    return isinstance(value, int | float) and not isinstance(value, bool) and math.isfinite(value)


# A step waiting for anything else would never fire: the scenario would report itself stuck.
_ON = frozenset({"idle", *(cls.type for cls in get_args(Event))})
_TERMINALS = frozenset(get_args(TerminalReason))

# What each key of a step holds (a wrong type would fail mid-run, blamed on the run).
_KEYS: dict[str, tuple[Callable[[object], bool], str]] = {
    "on": (lambda v: v in _ON, f"\"idle\" or an event type ({', '.join(sorted(_ON - {'idle'}))})"),
    "count": (lambda v: isinstance(v, int) and not isinstance(v, bool) and v >= 1, "a whole number >= 1"),
    "text": (lambda v: isinstance(v, str), "a string"),
    "reason": (lambda v: isinstance(v, str) and bool(v), "a non-empty string"),
    "tool": (lambda v: v is None or isinstance(v, str), "a tool name (a string)"),
    "terminal": (lambda v: v is None or v in _TERMINALS, f"a terminal reason ({', '.join(sorted(_TERMINALS))})"),
    "turn": (lambda v: v is None or (isinstance(v, int) and not isinstance(v, bool)), "a turn number"),
    "delay": (lambda v: _number(v) and v >= 0, "a number of seconds >= 0"),
}


def parse(data: Any) -> Scenario:
    if isinstance(data, list):
        data = {"steps": data}
    if not isinstance(data, Mapping) or not isinstance(data.get("steps", []), list):
        raise ScenarioError("a scenario is an object with a list of \"steps\" (or just that list)")
    top = [f.name for f in fields(Scenario)]
    stray = sorted(set(data) - set(top))
    if stray:  # a misspelt "steps" would play nothing and pass
        has = ", ".join(f'"{k}"' for k in top)
        raise ScenarioError(f"unknown keys {stray}: a scenario has {has}")
    prompt, timeout = data.get("prompt"), data.get("timeout", 120.0)
    if prompt is not None and not isinstance(prompt, str):
        raise ScenarioError("\"prompt\" must be a string")
    if not _number(timeout) or timeout <= 0:
        raise ScenarioError(f"\"timeout\" must be a number of seconds > 0, not {timeout!r}")
    known = {f.name for f in fields(Step)}
    steps = []
    for i, raw in enumerate(data.get("steps", []), 1):
        if not isinstance(raw, Mapping) or raw.get("do") not in _ACTIONS:
            raise ScenarioError(f"step {i}: \"do\" must be one of {sorted(_ACTIONS)}")
        unknown = set(raw) - known
        if unknown:
            raise ScenarioError(f"step {i}: unknown keys {sorted(unknown)}")
        for key, value in raw.items():
            if key in _KEYS and not _KEYS[key][0](value):
                raise ScenarioError(f"step {i}: \"{key}\" must be {_KEYS[key][1]}, not {value!r}")
        if raw["do"] in _SENDS and not str(raw.get("text", "")).strip():
            raise ScenarioError(f"step {i}: \"{raw['do']}\" needs a \"text\" to send")
        steps.append(Step(**raw))
    return Scenario(prompt or None, tuple(steps), float(timeout))


class Player:
    """Plays a `Scenario` against a `Host`; ``finished`` is set at the end."""

    def __init__(self, host: Host, scenario: Scenario) -> None:
        self.host = host
        self.scenario = scenario
        self.finished = asyncio.Event()
        self.stuck = False
        self.interrupted = False  # by Ctrl-C: the run was cancelled and no further step played
        self._i = 0
        self._seen = 0
        self._turn = 0
        self._waiting = False  # a fired step's delay is running
        host.on_event = self.event
        host.on_idle = self.idle

    @property
    def step(self) -> Step | None:
        return self.scenario.steps[self._i] if self._i < len(self.scenario.steps) else None

    def begin(self) -> None:
        if self.scenario.prompt:
            self.host.start(self.scenario.prompt)
        else:
            self.idle()

    def event(self, ev: Event) -> None:
        if isinstance(ev, TurnStarted):
            self._turn += 1
        step = self.step
        if step is None or self._waiting or self.interrupted or step.on != ev.type or not self._matches(step, ev):
            return
        self._seen += 1
        if self._seen >= step.count:
            self._trigger(step)

    def _matches(self, step: Step, ev: Event) -> bool:
        if step.turn is not None and step.turn != self._turn:
            return False
        if step.tool is not None:
            use = getattr(ev, "tool_use", None)
            if use is None or use.name != step.tool:
                return False
        return step.terminal is None or (isinstance(ev, TurnEnded) and ev.reason == step.terminal)

    def interrupt(self) -> None:
        """Ctrl-C: the turn in progress is cancelled (as at the keyboard) and no further step is
        played; the scenario finishes once the agent is idle. A second Ctrl-C quits."""
        if self.interrupted:
            self.host.quit()
            self.finished.set()
            return
        self.interrupted = True
        self._waiting = False  # a step's delay that is running: the step is not played
        where = f"before step {self._i + 1}" if self.step is not None else "after its last step"
        self.host.r.note(f"[script] interrupted by Ctrl-C {where}", "yellow")
        if self.host.busy:
            self.host.r.note("Ctrl-C: cancel -> engine.interrupt('cancel')", "yellow")
            self.host.engine.interrupt("cancel")
        else:
            self.finished.set()

    def idle(self) -> None:
        step = self.step
        if self._waiting:
            return
        if step is None or self.interrupted or self.host.exit.is_set():  # the end, Ctrl-C, SIGTERM
            self.finished.set()
        elif step.on == "idle":
            self._trigger(step)
        else:
            self.host.r.note(f"[script] stuck: the agent is idle but step {self._i + 1} waits ({step.describe()})", "red")
            self.stuck = True
            self.finished.set()

    def _trigger(self, step: Step) -> None:
        if step.delay > 0:
            self._waiting = True
            asyncio.get_running_loop().call_later(step.delay, self._fire, step)
        else:
            self._fire(step)

    def _fire(self, step: Step) -> None:
        if self.interrupted:  # Ctrl-C during the step's delay: the step is not played
            return
        self._waiting = False
        if self.host.exit.is_set():  # the user quit during the step's delay
            self.finished.set()
            return
        self.host.r.note(f"[script] step {self._i + 1}, {step.describe()}", "blue")
        self._i += 1
        self._seen = 0
        self._act(step)
        if not self.host.busy:
            self.idle()

    def _act(self, step: Step) -> None:
        host, engine = self.host, self.host.engine
        if step.do == "interrupt":
            engine.interrupt(step.reason)
        elif step.do == "interject":
            host.r.stats.steers += 1
            host.r.note(f"you (steer): {step.text}", "magenta")
            engine.interject(step.text)
        elif step.do == "follow_up":
            engine.follow_up(step.text)
        elif step.do == "submit":
            engine.submit(step.text)
        elif step.do == "send_now":
            host.send_now(step.text)
        elif step.do == "prompt":
            host.start(step.text)
        elif step.do == "mode":
            host.command("mode", step.text)
        elif step.do == "transcript":
            host.print_transcript()
        elif step.do == "quit":
            host.quit()
            self._i = len(self.scenario.steps)
