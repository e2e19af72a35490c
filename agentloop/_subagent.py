"""Subagents: the delegate tool, and how a child's runs are linked to its parent's (SPEC §9).

The delegate tool: a model hands a task to a subagent (the "Task" tool pattern).

The subagent is a child `QueryEngine` (`QueryEngine.subagent`) running the same
loop. Its events reach the parent's stream tagged with its ``agent_id``; its
final answer becomes the tool result. A parent abort aborts it with the same
reason (the call then ends as "stopped while running"); an abort of the child
alone gives the parent's call a clear error result and leaves the parent running.

The links: a child's run follows its parent's current run (`link_signal`). A background
child (`QueryEngine.start_background`) follows none under ``background_subagents="keep"``;
under "abort", each abort of its parent stops it (`abort_background`), also one that comes
before its run has begun (`take_abort_at_start`).
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import replace
from typing import TYPE_CHECKING, Any
from weakref import WeakKeyDictionary

from ._checks import count
from ._errors import AbortError, SessionLockedError
from ._events import AssistantMessage, AttemptDiscarded, DoomLoopDetected, Event, TurnEnded, TurnStarted
from ._inbox import told_for
from ._messages import ToolResultBlock
from ._policy import Policy
from ._tools import Tool, ToolContext

if TYPE_CHECKING:
    from ._abort import AbortSignal
    from ._engine import QueryEngine

__all__ = ["abort_background", "delegate_tool", "link_signal", "take_abort_at_start"]

_SCHEMA = {
    "type": "object",
    "properties": {
        "task": {"type": "string", "description": "What the subagent must do, with all the context it needs."},
    },
    "required": ["task"],
    "additionalProperties": False,
}


def delegate_tool(
    *,
    name: str = "task",
    description: str = (
        "Delegate a self-contained task to a subagent that has the same tools. "
        "It works on its own and returns its final answer."
    ),
    max_turns: int | None = 10,
    agent_prefix: str = "sub",
    system: str | None = None,
    max_depth: int = 3,
    **overrides: Any,
) -> Tool:
    """A tool that runs each call in a fresh subagent with its own ``max_turns``.

    ``max_depth`` bounds the nesting: a subagent that has this tool too may
    delegate again, but a call from an engine ``max_depth`` levels below the main
    engine starts no subagent and returns an error result saying the depth limit
    was reached (default 3: main engine, child, grandchild, great-grandchild).
    ``max_turns``: each subagent's, as for `QueryEngine` (None: no limit). Raises TypeError or
    ValueError for a ``max_depth`` that is not a whole number >= 1, or a ``max_turns`` that is
    neither None nor a whole number >= 0. An ``agent_prefix`` with a ``/``, a ``\\`` or a NUL in it
    works without a session; under a `JsonlSession`, which names each subagent's file after its
    id, each call's result is that error.

    ``overrides`` are passed to `QueryEngine.subagent` (e.g. ``tools=`` to give
    the subagent a narrower tool set); ``policies=`` is a template, forked for each
    subagent, so children running at once never share a policy's counters. Agent ids are ``<agent_prefix>-<n>``,
    numbered across the whole tree of engines under one main engine, so two
    delegate tools, or a child's own, never hand out the same id (nor the same
    sidechain file); with a `JsonlSession`, ids whose sidechain file exists
    already (a resumed session, another session given the same ``sidechain_dir``) are skipped, and an id
    is taken by creating its file, so two processes never take the same one.
    """

    max_depth = count("max_depth", max_depth, 1, optional=False)
    max_turns = count("max_turns", max_turns, 0)
    overrides = _checked(overrides)

    async def handler(args: dict[str, Any], ctx: ToolContext) -> ToolResultBlock:
        task = args.get("task")
        refused = _refusal(task, ctx, max_depth)
        if refused is not None:
            return refused
        assert isinstance(task, str)
        agent_id = _new_agent_id(ctx.engine, agent_prefix, reserve="session" not in overrides)
        child = ctx.engine.subagent(agent_id=agent_id, max_turns=max_turns, **_child_settings(overrides, system))
        return await _run_child(child, task, agent_id, ctx)

    # A poller to the stationarity policies: the same task given again (best of n, in one
    # response) that comes back with another answer is progress, not a repeated call.
    return Tool(name, description, _SCHEMA, handler, concurrency_safe=True, poller=True)


def _checked(overrides: dict[str, Any]) -> dict[str, Any]:
    """``overrides`` with ``policies`` read once into a tuple (a generator, a set: each child
    forks from it). Raises TypeError for ``policies`` that is not a list of policies. (An
    ``agent_prefix`` with a ``/`` in it works, but not under a `JsonlSession`, whose sidechain
    files are named after the ids: each call's result then says so.)"""
    given = overrides.get("policies")
    if isinstance(given, Policy) or (given is not None and not isinstance(given, Iterable)):
        raise TypeError(f"policies takes a list of policies: policies=[{given!r}]")
    if given is not None:
        overrides["policies"] = tuple(given)
    return overrides


def _refusal(task: object, ctx: ToolContext, max_depth: int) -> ToolResultBlock | None:
    """The error result for a call that starts no subagent (no task, or too deep), else None."""
    if not isinstance(task, str) or not task.strip():
        return ToolResultBlock(tool_use_id=ctx.tool_use_id, content="The task must be a non-empty string.", is_error=True)
    if _depth(ctx.engine) >= max_depth:
        return ToolResultBlock(
            tool_use_id=ctx.tool_use_id,
            content=(
                f"No subagent started: the subagent depth limit ({max_depth}) was reached. "
                "Do this task yourself."
            ),
            is_error=True,
        )
    return None


def _child_settings(overrides: dict[str, Any], system: str | None) -> dict[str, Any]:
    """The keyword arguments of one child: ``overrides``, each template policy forked (children
    running at once never share a policy's counters), and ``system`` when given."""
    extra = dict(overrides)
    given = extra.get("policies")
    if given is not None:
        extra["policies"] = [p.fork() if isinstance(p, Policy) else p for p in given]
    if system is not None:
        extra["system"] = system
    return extra


async def _run_child(child: QueryEngine, task: str, agent_id: str, ctx: ToolContext) -> ToolResultBlock:
    """Run ``child`` on ``task``, its events passed to the parent tagged with ``agent_id``; its
    final answer is the call's result. Raises `AbortError` when the parent's abort reached it."""
    end: TurnEnded | None = None
    # The attempt streaming, and the child's last response that said something (its answer, or its
    # last words), came out of a doom loop that was not resampled away.
    looping = looped = False
    async for event in child.run(task):
        ctx.emit(_tag(event, agent_id, ctx.tool_use_id))
        if isinstance(event, TurnEnded):
            end = event
        elif event.agent_id is not None:  # a grandchild's
            continue
        elif isinstance(event, DoomLoopDetected):  # one not resampled: its response is accepted
            looping = looping or event.action in ("disarmed", "off")
        elif isinstance(event, AssistantMessage):
            if event.message.text.strip():
                looped = looping
            looping = False
        elif isinstance(event, AttemptDiscarded):
            looping = False
    if end is not None and end.reason == "completed":  # its answer, also if the parent's abort came after
        last = child.messages[-1] if child.messages else None
        # Only the child's own words: when it said nothing, its last message is the task itself.
        answer = last.text if last is not None and last.role == "assistant" else ""
        return _result(ctx.tool_use_id, agent_id, answer, end, looped=looped)
    if ctx.signal.aborted:  # the parent's abort reached the child
        return _stopped(child, ctx)
    return _result(ctx.tool_use_id, agent_id, _last_words(child), end, looped=looped)


def _stopped(child: QueryEngine, ctx: ToolContext) -> ToolResultBlock:
    """The result of a call whose child the parent's abort stopped: the interrupted call's text,
    then what the child had said (a host that asks for "what you have" gets it to the model).
    Raises `AbortError` when the child said nothing, for the engine's own result."""
    words = _last_words(child).strip()
    if not words:
        raise AbortError(ctx.signal.reason or "cancel")
    stopped = told_for(ctx.engine.options.texts.stopped_running, ctx.signal.reason)
    text = f"{stopped} Its last words: {words[:2000]}"
    return ToolResultBlock(tool_use_id=ctx.tool_use_id, content=text, is_error=True)


def _last_words(child: QueryEngine) -> str:
    """The text of the last response of a child that stopped before finishing that said something
    (stopped by a limit after a tool batch, or by an abort: what it had found so far). Never its task."""
    for message in reversed(child.messages):
        if message.role == "assistant" and message.text.strip():
            return message.text
    return ""


def _depth(engine: QueryEngine) -> int:
    """How many engines are above ``engine`` (0 for a main engine)."""
    depth = 0
    parent = engine.parent
    while parent is not None:
        depth += 1
        parent = parent.parent
    return depth


def main_engine(engine: QueryEngine) -> QueryEngine:
    """The engine at the top of ``engine``'s tree (itself, for a main engine)."""
    while engine.parent is not None:
        engine = engine.parent
    return engine


# Per main engine: the last number given to each prefix (an engine going away takes its numbers).
_numbers: WeakKeyDictionary[QueryEngine, dict[str, int]] = WeakKeyDictionary()


def _new_agent_id(engine: QueryEngine, prefix: str, *, reserve: bool) -> str:
    """The next id of ``prefix`` under ``engine``'s main engine whose sidechain file is free;
    with ``reserve``, the file is created (and held) as the id is taken."""
    numbers = _numbers.setdefault(main_engine(engine), {})
    n = numbers.get(prefix, 0)
    while True:
        n += 1
        agent_id = f"{prefix}-{n}"
        if _sidechain_free(engine, agent_id, reserve=reserve):
            break
    numbers[prefix] = n
    return agent_id


def _sidechain_free(engine: QueryEngine, agent_id: str, *, reserve: bool) -> bool:
    """Whether no sidechain file holds ``agent_id`` yet (a resumed session's, another session's
    given the same ``sidechain_dir``). With ``reserve`` it is taken by creating the file: only one process
    can, where a look first and a create later let two take it."""
    from .sessions import JsonlSession

    store = engine.session
    if not isinstance(store, JsonlSession):
        return True
    if not reserve:
        return not (store.sidechain_dir / f"{agent_id}.jsonl").exists()
    try:
        return store.sidechain(agent_id)._acquire_new()
    except SessionLockedError:  # created by another writer just now
        return False
    except (OSError, ValueError):  # cannot be created (a full disk, a closed session): the run reports it
        return True


def _tag(event: Event, agent_id: str, tool_use_id: str) -> Event:
    """The child's own ``event`` tagged with its ``agent_id`` (a grandchild's is tagged already);
    its `TurnStarted` also with the parent's call that runs it (``parent_tool_use_id``)."""
    if event.agent_id is not None:
        return event
    if isinstance(event, TurnStarted):
        return replace(event, agent_id=agent_id, parent_tool_use_id=tool_use_id)
    return replace(event, agent_id=agent_id)


def _result(tool_use_id: str, agent_id: str, answer: str, end: TurnEnded | None, *, looped: bool) -> ToolResultBlock:
    """The call's result from the child's ``end``. ``looped``: ``answer`` came out of a doom loop
    the child did not leave (its resample budget spent, or recovery off), which the parent's model
    is told, as it is told that a child stopped for repeating its tool calls."""
    if end is None:
        return ToolResultBlock(tool_use_id=tool_use_id, content=f"Subagent {agent_id} ended without a result.", is_error=True)
    if end.reason == "completed":
        text = answer.strip() or "(the subagent gave no answer)"
        if looped and answer.strip():
            text = f"({_LOOPED.format(agent_id=agent_id)})\n\n{text}"
        return ToolResultBlock(tool_use_id=tool_use_id, content=text)
    why = end.abort_reason or end.error or end.detail
    if why == end.reason:  # said once: "(deadline)", not "(deadline: deadline)"
        why = None
    text = f"Subagent {agent_id} stopped before finishing ({end.reason}: {why})." if why else (
        f"Subagent {agent_id} stopped before finishing ({end.reason})."
    )
    if end.reason == "stationarity_ended":
        text += f" {_CIRCLES}"
    if answer.strip():
        text += f" Its last words: {answer.strip()[:2000]}"
        if looped:
            text += f" ({_LOOPED.format(agent_id=agent_id)})"
    return ToolResultBlock(tool_use_id=tool_use_id, content=text, is_error=True)


_LOOPED = (
    "Subagent {agent_id}'s answer came out of a doom loop: its output kept repeating itself and "
    "resampling did not stop it, so it may be cut short or padded with repeats. Check it before relying on it."
)
_CIRCLES = (
    "It was going round in circles with its tool calls: given again unchanged, the task would likely "
    "loop again (narrow it, or say what the subagent lacked)."
)


# -- linking a child's runs to its parent (SPEC §9) ------------------------------


def abort_background(engine: QueryEngine, reason: str) -> None:
    """With ``background_subagents="abort"``, stop ``engine``'s background children with
    ``reason`` (the run that aborted): also those whose run is not linked to this one (started
    while the engine was idle, or in an earlier run of it)."""
    children = engine._background_children
    if children is None or engine.options.background_subagents != "abort":
        return
    for child in list(children):
        pending = child._start_pending
        if child._state is None and pending is not None:
            # Its task has not begun the run yet (it has had no step): there is nothing to
            # interrupt, so the run starts aborted.
            if not pending:
                pending.append(reason)
        else:
            child.interrupt(reason)


def take_abort_at_start(engine: QueryEngine) -> str | None:
    """The reason a background run that is beginning must start aborted with, if any (once)."""
    pending, engine._start_pending = engine._start_pending, None
    return pending[0] if pending else None


def link_signal(engine: QueryEngine) -> AbortSignal | None:
    """The signal a new run of ``engine`` follows (its parent's run), if any."""
    parent = engine.parent
    if parent is None or parent._state is None:
        return None
    if parent.options.background_subagents == "keep":
        children = parent._background_children  # start_background() children
        if children is not None and engine in children:
            return None
    return parent._state.signal
