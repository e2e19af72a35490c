"""The engine's configuration: `EngineOptions`, and the checks of every `QueryEngine` argument.

A wrong argument fails at construction, with a message that says what to pass instead,
rather than deep inside a run (as a TypeError out of `run()`) or at the first request
(as a ``model_error`` blamed on the model). The settings a run reads are grouped in one
frozen `EngineOptions`; a subagent copies them from its parent's.
"""

from __future__ import annotations

import logging
import os
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from typing import Any, Generic, Literal, Protocol, TypeVar, overload

from ._checks import count, non_negative
from ._inbox import Texts
from ._messages import Message
from ._policy import Policy, check_hooks
from ._tools import PermissionCallback, Tool

__all__ = [
    "DEFAULT_TEXTS",
    "EngineOptions",
    "Setting",
    "check_entries",
    "check_lineage",
    "check_model",
    "check_session",
    "message_list",
    "policy_list",
    "recovery_default",
    "tool_map",
]

log = logging.getLogger("agentloop")

T = TypeVar("T")

DEFAULT_TEXTS = Texts()  # frozen: every engine without texts= shares it


@dataclass(frozen=True, slots=True)
class EngineOptions:
    """The engine's settings, grouped (see `QueryEngine` for their meaning)."""

    system: str | None = None
    max_turns: int | None = None
    max_parallel_tools: int = 10
    tool_cancel_grace: float = 2.0
    permission: PermissionCallback | None = None
    follow_up_behavior: Literal["queue", "steer"] = "queue"
    interrupt_notice: Literal["append", "envelope"] | None = "append"
    doom_loop_recovery: bool = True
    doom_budget: int = 2
    retry_budget: int = 3
    retry_base_delay: float = 0.5
    retry_max_delay: float = 8.0
    usage_limit: int | None = None
    deadline: float | None = None
    max_tokens: int | None = None
    tool_choice: str | None = None
    background_subagents: Literal["keep", "abort"] = "keep"
    texts: Texts = field(default_factory=Texts)
    max_tool_result_chars: int | None = 100_000

    def __post_init__(self) -> None:
        """Raise TypeError or ValueError for a setting the engine cannot run with."""
        if self.system is not None and not isinstance(self.system, str):
            raise TypeError(f"system takes a str (the system prompt) or None, not {type(self.system).__name__}")
        if self.follow_up_behavior not in ("queue", "steer"):
            raise ValueError(f"follow_up_behavior must be 'queue' or 'steer', not {self.follow_up_behavior!r}")
        if self.interrupt_notice not in ("append", "envelope", None):
            raise ValueError(f"interrupt_notice must be 'append', 'envelope' or None, not {self.interrupt_notice!r}")
        object.__setattr__(self, "max_tool_result_chars", count("max_tool_result_chars", self.max_tool_result_chars, 1))
        if not isinstance(self.texts, Texts):
            raise TypeError(f"texts takes Texts(...) (the texts to change, by keyword), not {type(self.texts).__name__}")
        if not isinstance(self.doom_loop_recovery, bool):  # "false" from a config file is true
            raise TypeError(
                "doom_loop_recovery takes True, False or None (None: the AGENTLOOP_DOOM_LOOP_RECOVERY "
                f"environment variable decides), not {self.doom_loop_recovery!r}"
            )
        if self.permission is not None and not callable(self.permission):
            raise TypeError(f"permission takes a callable (use, ctx) -> Allow | Deny, not {self.permission!r}")
        choice = self.tool_choice
        if choice is not None and (not isinstance(choice, str) or not choice.strip()):
            raise TypeError(f'tool_choice takes "auto", "any", "none" or a tool name, not {choice!r}')
        if choice == "required":  # OpenAI's word for "any": not a tool name
            object.__setattr__(self, "tool_choice", "any")
        _check_numbers(self)


# The numeric settings: (name, whole numbers only, may be None). Each is >= 0 (a count or a
# number of seconds): a wrong type would otherwise fail deep inside a run, as a TypeError from run().
_NUMBERS = (
    ("max_turns", True, True),
    ("max_parallel_tools", True, False),
    ("tool_cancel_grace", False, False),
    ("doom_budget", True, False),
    ("retry_budget", True, False),
    ("retry_base_delay", False, False),
    ("retry_max_delay", False, False),
    ("usage_limit", True, True),
    ("deadline", False, True),
    ("max_tokens", True, True),
)


class Setting(Generic[T]):
    """A `QueryEngine` setting as an attribute of the engine (``engine.permission = ask``,
    ``engine.system = ...``): it lives in the engine's frozen `EngineOptions`, which setting it
    replaces, checked as at construction. The next run uses the new value; a run in progress may
    pick it up at its next model request or tool batch. ``resolve`` turns what is set into
    what the options hold, as the constructor does (``None`` for `doom_loop_recovery`: the
    environment variable decides)."""

    __slots__ = ("name", "resolve")

    def __init__(self, resolve: Callable[[Any], Any] | None = None) -> None:
        self.name = ""
        self.resolve = resolve

    def __set_name__(self, owner: type, name: str) -> None:
        self.name = name

    @overload
    def __get__(self, engine: None, owner: type) -> Setting[T]: ...

    @overload
    def __get__(self, engine: _Configured, owner: type | None = None) -> T: ...

    def __get__(self, engine: _Configured | None, owner: type | None = None) -> T | Setting[T]:
        if engine is None:
            return self
        value: T = getattr(engine.options, self.name)
        return value

    def __set__(self, engine: _Configured, value: T) -> None:
        resolve = self.resolve
        changes: dict[str, Any] = {self.name: value if resolve is None else resolve(value)}  # checked by EngineOptions
        engine.options = replace(engine.options, **changes)


class _Configured(Protocol):
    """What a `Setting` lives on: an object holding its `EngineOptions` (the engine)."""

    options: EngineOptions


def _check_numbers(options: EngineOptions) -> None:
    """Raise TypeError or ValueError for a numeric setting that is not a number >= 0."""
    for name, whole, optional in _NUMBERS:
        non_negative(name, getattr(options, name), whole=whole, optional=optional)


def recovery_default(value: bool | None) -> bool:
    """The argument, else ``AGENTLOOP_DOOM_LOOP_RECOVERY`` (on unless false, 0, no or off; a value
    it does not know keeps recovery on, and says so in the log). An argument that is not a bool
    is returned as it is, for `EngineOptions` to refuse."""
    if value is not None:
        return value
    raw = os.environ.get("AGENTLOOP_DOOM_LOOP_RECOVERY", "")
    env = raw.strip().lower()
    if env in {"0", "false", "no", "off"}:
        return False
    if env not in {"", "1", "true", "yes", "on"}:
        log.warning(
            "AGENTLOOP_DOOM_LOOP_RECOVERY=%r is not understood (use false, 0, no or off to switch "
            "doom-loop recovery off); recovery stays on",
            raw,
        )
    return True


def check_model(model: object) -> None:
    """Raise TypeError, at construction, for what cannot be a `Model` (rather than a
    ``model_error`` at the first request, blamed on the model)."""
    if isinstance(model, type) or not callable(getattr(model, "stream", None)):
        hint = ""
        if isinstance(model, str):
            hint = f" (a model name? pass a model object, e.g. agentloop.models.AnthropicModel({model!r}))"
        elif isinstance(model, type):
            hint = f" (the class {model.__name__}: pass an instance of it)"
        raise TypeError(
            f"QueryEngine needs a model with a stream(request, signal) method, such as "
            f"ScriptedModel([...]) or a model from agentloop.models; got {model!r}{hint}"
        )


def check_lineage(parent: object, agent_id: object, engine_class: type) -> None:
    """Raise TypeError for a ``parent`` that is not an engine, or an ``agent_id`` that is not a
    str (None only for an engine without a parent), ValueError for a blank one: a subagent's
    events and sidechain file are told apart by it."""
    if parent is not None and not isinstance(parent, engine_class):
        raise TypeError(f"parent takes a QueryEngine (or None), not {type(parent).__name__}: use engine.subagent(agent_id=...)")
    if agent_id is None:
        if parent is not None:  # its events would pass for the main engine's
            raise TypeError("a subagent needs an agent_id, a name such as 'sub-1', not None")
        return
    if not isinstance(agent_id, str):
        raise TypeError(f"agent_id takes a str, a name such as 'sub-1', not {type(agent_id).__name__} {agent_id!r:.80}")
    if not agent_id.strip():
        raise ValueError(f"agent_id must be a name such as 'sub-1', not the blank {agent_id!r}")


def check_session(session: object) -> None:
    """Raise TypeError for what cannot be a session store."""
    if session is not None and not (
        callable(getattr(session, "append_message", None)) and callable(getattr(session, "append_event", None))
    ):
        raise TypeError(
            "session takes a session store (append_message, append_event), such as "
            f"agentloop.sessions.JsonlSession(path), not {type(session).__name__}"
        )


def _not_a_list(arg: str, value: object, fix: str) -> None:
    """Raise a TypeError naming ``arg`` for a ``value`` that is no collection of items: a class,
    a function, a str or a number (Python's own "object is not iterable" names neither)."""
    if isinstance(value, type):
        what = f"the class {value.__name__}"
    elif callable(value) and not isinstance(value, Iterable):
        what = f"the function {getattr(value, '__name__', type(value).__name__)}"
    elif isinstance(value, str | bytes) or not isinstance(value, Iterable):
        what, fix = repr(value), ""
    else:
        return
    raise TypeError(f"{arg} takes a list of {arg}, not {what}{fix.format(name=what.rsplit(' ', 1)[-1])}")


def tool_map(tools: Sequence[Tool] | Mapping[str, Tool]) -> dict[str, Tool]:
    """The tools by name, from a list of tools or a dict by name (what `QueryEngine.tools`
    reads as). Raises TypeError for what is not a `Tool`, ValueError for a name given twice or
    a dict key that is not its tool's name."""
    if isinstance(tools, Mapping):
        for key, t in tools.items():
            if isinstance(t, Tool) and key != t.name:
                raise ValueError(f"tools: the key {key!r} names the tool {t.name!r}: the key must be the tool's name")
        tools = list(tools.values())
    if isinstance(tools, Tool):
        raise TypeError(f"tools takes a list of tools: tools=[{tools.name}]")
    _not_a_list("tools", tools, ": decorate {name} with @tool and pass tools=[{name}]")
    tools = list(tools)  # read twice below: a generator would be spent by the first pass
    for t in tools:
        if not isinstance(t, Tool):
            what = getattr(t, "__name__", None)
            hint = f": decorate {what} with @tool (an async def with annotated parameters)" if what else ""
            raise TypeError(f"tools takes Tool objects, not {type(t).__name__} {t!r}{hint}")
    names = [t.name for t in tools]
    if len(set(names)) != len(names):
        raise ValueError(f"duplicate tool names: {sorted(n for n in set(names) if names.count(n) > 1)}")
    return {t.name: t for t in tools}


def policy_list(policies: Sequence[Policy]) -> list[Policy]:
    """``policies`` as a new list. Raises TypeError for anything but `Policy` instances, and for
    a policy with an ``async def`` hook (see `check_hooks`)."""
    if isinstance(policies, Policy):
        raise TypeError(f"policies takes a list of policies: policies=[{type(policies).__name__}(...)]")
    _not_a_list("policies", policies, ": policies=[{name}()]")
    out = list(policies)
    for p in out:
        if isinstance(p, type):
            raise TypeError(f"policies takes Policy objects, not the class {p.__name__}: write {p.__name__}()")
        if not isinstance(p, Policy):
            raise TypeError(f"policies takes Policy objects (subclasses of agentloop.Policy), not {p!r}")
        check_hooks(p)
    return out


def message_list(messages: Sequence[Message]) -> list[Message]:
    """``messages`` as a new list. Raises TypeError for anything but `Message`s (a dict in the
    wire format would otherwise fail later, at a request, far from where it came in)."""
    if isinstance(messages, str | Message) or not isinstance(messages, Iterable):
        raise TypeError(f"messages takes a list of Message objects, not a {type(messages).__name__}")
    out = list(messages)
    for m in out:
        if not isinstance(m, Message):
            raise TypeError(
                f"messages takes Message objects, not {type(m).__name__}: build one with "
                "Message.user(text), Message(role=..., content=[...]) or, from a dict, Message.model_validate(d)"
            )
    return out


def check_entries(messages: Sequence[object], start: int) -> None:
    """Raises TypeError for an entry of `engine.messages` that is not a `Message` (one the host
    appended or assigned between runs), naming its index, before anything reads it."""
    for i, m in enumerate(messages, start):
        if not isinstance(m, Message):
            raise TypeError(
                f"engine.messages[{i}] is a {type(m).__name__}, not a Message: build one with "
                "Message.user(text), Message(role=..., content=[...]) or, from a dict, Message.model_validate(d)"
            )
