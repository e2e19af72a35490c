"""`QueryEngine`: the public face of the loop.

The engine holds the transcript, the configuration and the host's inbox; the
loop itself lives in `agentloop._loop` and is the only one: every way of using
the engine (iterating `run()`, a subagent, the demo) drains the same event
stream.
"""

from __future__ import annotations

import asyncio
import contextvars
import inspect
import logging
import numbers
import operator
import os
import threading
import weakref
from collections.abc import AsyncGenerator, Awaitable, Callable, Coroutine, Mapping, Sequence
from dataclasses import dataclass, field, fields
from typing import TYPE_CHECKING, Any, Literal

from ._abort import AbortSignal
from ._errors import SessionLockedError
from ._events import Event, TurnEnded
from ._inbox import Inbox, Texts
from ._messages import Message
from ._model import Model
from ._policy import Policy
from ._tools import PermissionCallback, Tool
from ._transcript import is_valid, repair

if TYPE_CHECKING:
    from ._commit import ToolIds
    from ._run import NextRun, RunState
    from .sessions import SessionStore

__all__ = ["EngineOptions", "QueryEngine", "wait_at_run_end"]

log = logging.getLogger("agentloop")

AbortHook = Callable[[str], Awaitable[None] | None]
ToolWatcher = Callable[[Mapping[str, Tool]], Sequence[Tool] | None]


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


# The running engine writing to each session store (by `_store_key`): a store holds one
# transcript, and two engines appending to it at once would interleave their records. Weak:
# an engine whose run could never end (its event loop closed under it) frees the store when
# the engine goes.
_store_writers: weakref.WeakValueDictionary[object, QueryEngine] = weakref.WeakValueDictionary()
# Held while a run checks that its store is free and claims it, as one step: engines may start
# runs in several threads (an event loop each), and a run starting between another's check and
# its claim would pass the check too.
_store_claims = threading.Lock()


def _store_key(store: SessionStore) -> object:
    """What identifies a store's records: a `JsonlSession`'s file (two objects may open one,
    as a server resuming the file for each request does), any other store itself."""
    from .sessions import JsonlSession

    if isinstance(store, JsonlSession):
        try:
            return store.path.resolve()
        except (OSError, RuntimeError):  # a symlink loop: the file cannot be opened anyway
            return store.path
    return id(store)

# The engine whose abort hooks are being called (set around each call, in the run's task).
_hooked_engine: contextvars.ContextVar[QueryEngine | None] = contextvars.ContextVar("agentloop_hooked", default=None)


def wait_at_run_end(task: asyncio.Task[Any]) -> bool:
    """From an abort hook: let cleanup it started go on without delaying the turn's end.

    The run's ``TurnEnded`` does not wait for ``task``; the run itself waits for it
    before it returns, within ``tool_cancel_grace`` (past that, ``task`` is left to
    whoever owns it). Returns False (and does nothing) outside an abort hook.
    """
    engine = _hooked_engine.get()
    if engine is None or engine._state is None:
        return False
    if engine._cleanup is None:
        engine._cleanup = set()
    engine._cleanup.add(task)
    return True


def _tool_map(tools: Sequence[Tool]) -> dict[str, Tool]:
    if isinstance(tools, Tool):
        raise TypeError(f"tools takes a list of tools: tools=[{tools.name}]")
    for t in tools:
        if not isinstance(t, Tool):
            what = getattr(t, "__name__", None)
            hint = f": decorate {what} with @tool (an async def with annotated parameters)" if what else ""
            raise TypeError(f"tools takes Tool objects, not {type(t).__name__} {t!r}{hint}")
    names = [t.name for t in tools]
    if len(set(names)) != len(names):
        raise ValueError(f"duplicate tool names: {sorted(n for n in set(names) if names.count(n) > 1)}")
    return {t.name: t for t in tools}


def _check_model(model: object) -> None:
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


def _holds_records(store: SessionStore | None) -> bool:
    """True when ``store`` is a `JsonlSession` whose file holds records already."""
    from .sessions import JsonlSession

    if not isinstance(store, JsonlSession):
        return False
    try:
        return store.path.stat().st_size > 0
    except OSError:
        return False


_SHOWN_CHANGES = 20  # a long broken history is summed up, not listed whole in one log line


_TEXTS = Texts()  # frozen: every engine without texts= shares it


def valid_history(messages: list[Message], what: str) -> list[Message]:
    """``messages`` itself when every provider would accept it, else a repaired copy: a host's
    history with, say, a call left without its result would make every request fail. Says what
    it changed in a warning."""
    if is_valid(messages):
        return messages
    changes: list[str] = []
    repaired = repair(messages, changes=changes)
    shown = "; ".join(changes[:_SHOWN_CHANGES])
    more = f"; and {len(changes) - _SHOWN_CHANGES} more" if len(changes) > _SHOWN_CHANGES else ""
    log.warning("%s broke the transcript rules; repaired before sending: %s%s", what, shown, more)
    return repaired


def _message_list(messages: Sequence[Message]) -> list[Message]:
    """``messages`` as a new list. Raises TypeError for anything but `Message`s (a dict in the
    wire format would otherwise fail later, at a request, far from where it came in)."""
    if isinstance(messages, str | Message):
        raise TypeError(f"messages takes a list of Message objects, not a {type(messages).__name__}")
    out = list(messages)
    for m in out:
        if not isinstance(m, Message):
            raise TypeError(
                f"messages takes Message objects, not {type(m).__name__}: build one with "
                "Message.user(text), Message(role=..., content=[...]) or, from a dict, Message.model_validate(d)"
            )
    return out


def _check_entries(messages: Sequence[object], start: int) -> None:
    """Raises TypeError for an entry of `engine.messages` that is not a `Message` (one the host
    appended or assigned between runs), naming its index, before anything reads it."""
    for i, m in enumerate(messages, start):
        if not isinstance(m, Message):
            raise TypeError(
                f"engine.messages[{i}] is a {type(m).__name__}, not a Message: build one with "
                "Message.user(text), Message(role=..., content=[...]) or, from a dict, Message.model_validate(d)"
            )


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


def _check_options(options: EngineOptions) -> None:
    """Raise TypeError or ValueError for a numeric setting that is not a number >= 0."""
    for name, whole, optional in _NUMBERS:
        value: Any = getattr(options, name)
        if value is None and optional:
            continue
        if isinstance(value, bool) or not isinstance(value, numbers.Integral if whole else numbers.Real):
            what = "a whole number" if whole else "a number of seconds"
            raise TypeError(f"{name} takes {what}{' or None' if optional else ''}, not {value!r}")
        if not float(value) >= 0:  # NaN too
            raise ValueError(f"{name} must be >= 0, not {value!r}")


def _policy_list(policies: Sequence[Policy]) -> list[Policy]:
    """``policies`` as a new list. Raises TypeError for anything but `Policy` instances."""
    if isinstance(policies, Policy):
        raise TypeError(f"policies takes a list of policies: policies=[{type(policies).__name__}(...)]")
    out = list(policies)
    for p in out:
        if isinstance(p, type):
            raise TypeError(f"policies takes Policy objects, not the class {p.__name__}: write {p.__name__}()")
        if not isinstance(p, Policy):
            raise TypeError(f"policies takes Policy objects (subclasses of agentloop.Policy), not {p!r}")
    return out


def _recovery_default(value: bool | None) -> bool:
    """The argument, else ``AGENTLOOP_DOOM_LOOP_RECOVERY`` (on unless false, 0, no or off; a value
    it does not know keeps recovery on, and says so in the log)."""
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


class QueryEngine:
    """An agent loop over ``model`` and ``tools``.

    Control calls (`interrupt`, `send_now`, `interject`, `follow_up`, `submit`)
    are plain synchronous calls, safe from any thread; only `run()` is async.

    Keyword arguments beyond API.md: ``usage_limit`` (total tokens per run,
    subagents' included, terminal ``usage_limit``), ``deadline`` (seconds of wall clock per run,
    terminal ``deadline``), ``texts`` (every text the library writes),
    ``session`` (a `agentloop.sessions.SessionStore` receiving each committed
    message; a record it fails to append costs the run nothing and adds one line
    to ``session_errors``, as does a subagent's), ``background_subagents``
    ("keep" or "abort" on a parent cancel), ``retry_base_delay``/``retry_max_delay`` (back-off bounds, seconds),
    ``max_tokens`` and ``tool_choice`` (passed on in each request), ``max_tool_result_chars``
    (a longer tool result is cut in the middle before it enters the transcript, default
    100,000 characters, None for no cap; `ToolCallFinished.full_result` keeps the whole).
    """

    def __init__(
        self,
        model: Model,
        *,
        tools: Sequence[Tool] = (),
        system: str | None = None,
        messages: Sequence[Message] = (),
        policies: Sequence[Policy] | None = None,
        max_turns: int | None = None,
        max_parallel_tools: int = 10,
        tool_cancel_grace: float = 2.0,
        permission: PermissionCallback | None = None,
        follow_up_behavior: Literal["queue", "steer"] = "queue",
        interrupt_notice: Literal["append", "envelope"] | None = "append",
        doom_loop_recovery: bool | None = None,
        doom_budget: int = 2,
        retry_budget: int = 3,
        parent: QueryEngine | None = None,
        agent_id: str | None = None,
        usage_limit: int | None = None,
        deadline: float | None = None,
        texts: Texts | None = None,
        session: SessionStore | None = None,
        background_subagents: Literal["keep", "abort"] = "keep",
        retry_base_delay: float = 0.5,
        retry_max_delay: float = 8.0,
        max_tokens: int | None = None,
        tool_choice: str | None = None,
        max_tool_result_chars: int | None = 100_000,
    ) -> None:
        if follow_up_behavior not in ("queue", "steer"):
            raise ValueError(f"follow_up_behavior must be 'queue' or 'steer', not {follow_up_behavior!r}")
        if interrupt_notice not in ("append", "envelope", None):
            raise ValueError(f"interrupt_notice must be 'append', 'envelope' or None, not {interrupt_notice!r}")
        if max_tool_result_chars is not None:
            if isinstance(max_tool_result_chars, bool) or not isinstance(max_tool_result_chars, int):
                raise TypeError(f"max_tool_result_chars takes a whole number or None, not {max_tool_result_chars!r}")
            if max_tool_result_chars < 1:
                raise ValueError(f"max_tool_result_chars must be at least 1, not {max_tool_result_chars!r}")
        _check_model(model)
        if session is not None and not (
            callable(getattr(session, "append_message", None)) and callable(getattr(session, "append_event", None))
        ):
            raise TypeError(
                "session takes a session store (append_message, append_event), such as "
                f"agentloop.sessions.JsonlSession(path), not {type(session).__name__}"
            )
        if texts is not None and not isinstance(texts, Texts):
            raise TypeError(f"texts takes Texts(...) (the texts to change, by keyword), not {type(texts).__name__}")
        if permission is not None and not callable(permission):
            raise TypeError(f"permission takes a callable (use, ctx) -> Allow | Deny, not {permission!r}")
        if tool_choice is not None and (not isinstance(tool_choice, str) or not tool_choice.strip()):
            raise TypeError(f'tool_choice takes "auto", "any", "none" or a tool name, not {tool_choice!r}')
        if tool_choice == "required":  # OpenAI's word for "any": not a tool name
            tool_choice = "any"
        # At most 30 attributes: CPython 3.11 shares one key table among the instances of a class
        # up to 30 keys; past that every engine holds a dict of its own (1.3 KB more per engine).
        self.model = model
        self.tools = _tool_map(tools)
        self.tool_specs: tuple[Tool, ...] = tuple(self.tools.values())  # what each request declares
        self.options = EngineOptions(
            system=system,
            max_turns=max_turns,
            max_parallel_tools=max_parallel_tools,
            tool_cancel_grace=tool_cancel_grace,
            permission=permission,
            follow_up_behavior=follow_up_behavior,
            interrupt_notice=interrupt_notice,
            doom_loop_recovery=_recovery_default(doom_loop_recovery),
            doom_budget=doom_budget,
            retry_budget=retry_budget,
            retry_base_delay=retry_base_delay,
            retry_max_delay=retry_max_delay,
            usage_limit=usage_limit,
            deadline=deadline,
            max_tokens=max_tokens,
            tool_choice=tool_choice,
            background_subagents=background_subagents,
            texts=texts if texts is not None else _TEXTS,
            max_tool_result_chars=max_tool_result_chars,
        )
        _check_options(self.options)
        given = _message_list(messages)
        self.messages: list[Message] = valid_history(given, "the messages given to QueryEngine")
        # The transcript as last seen valid: run() checks only what the host changed since.
        self._vetted: list[Message] = list(self.messages)
        if policies is None:
            from .policies import default_policies

            policies = default_policies()
        self.policies: list[Policy] = _policy_list(policies)
        for policy in self.policies:
            policy.bind(self.tools)
        if self.policies and self.messages:  # a saved transcript resumed: the policies catch up on it
            from ._loop import catch_up_policies

            catch_up_policies(self)
        self.parent = parent
        self.agent_id = agent_id
        self.session = session
        self.inbox = Inbox()
        self.last_turn_ended: TurnEnded | None = None
        self.session_errors: list[str] = []
        # What the session holds (messages given at construction: all of them); kept only with a session.
        # A repair is not in the session yet: the first run records it as a checkpoint.
        self._recorded: list[Message] | None = list(given) if session is not None else None
        self._abort_hooks: list[tuple[AbortHook, bool]] = list(parent._abort_hooks) if parent else []
        self._tool_watchers: tuple[ToolWatcher, ...] = parent._tool_watchers if parent else ()
        self._state: RunState | None = None
        self._closing: asyncio.Future[None] | None = None
        self._next_run: NextRun | None = None  # a run() waiting for the last run's cleanup to begin
        self._tool_ids: ToolIds | None = None  # made at the first tool call: most engines hold none
        self._background: set[asyncio.Task[Any]] | None = None  # strong refs to background tasks, made on first use
        self._background_child = False
        # start_background() made a task for this child whose run has not begun yet, and the
        # reason its parent's "abort" setting gave while it had not: the run starts aborted.
        self._start_pending = False
        self._abort_at_start: str | None = None
        self._own_sidechain = False  # its session is the sidechain `subagent()` asked for: released after each run
        # The last run() made, until its first step begins it, and the reason an interrupt() gave
        # meanwhile (a run handed to a task that has not started yet): it begins aborted.
        self._fresh_token: object | None = None
        self._fresh_abort: str | None = None
        # The background children (start_background) a "abort" setting stops on this engine's aborts.
        self._background_children: weakref.WeakSet[QueryEngine] | None = None
        self._checkpoint_due = False  # the session holds another transcript's records already
        if session is not None and parent is None and not given and _holds_records(session):
            # A file of an earlier conversation, none of which this engine was given (a task run
            # again with the session of its last attempt): the file is to replay to this engine's
            # transcript, not to both joined.
            self._checkpoint_due = True
            log.warning(
                "session file %s holds a conversation already, and this engine was given none of it: "
                "its first run writes a checkpoint, so the file replays to this engine's transcript. "
                "To continue the file's conversation instead, `session, loaded = JsonlSession.resume(path)` "
                "and pass `messages=loaded.messages`",
                session.path,  # type: ignore[attr-defined]  # a JsonlSession (_holds_records)
            )
        self._cleanup: set[asyncio.Task[Any]] | None = None  # abort hooks' cleanup the run waits for at its end
        self._store_claimed: object = None  # this engine's key in _store_writers while it runs

    def __repr__(self) -> str:
        who = f" agent_id={self.agent_id!r}" if self.agent_id else ""
        state = "running" if self._state is not None else "idle"
        return f"<QueryEngine{who} {state} messages={len(self.messages)}>"

    # -- running ---------------------------------------------------------------

    @property
    def running(self) -> bool:
        """True while a `run()` is in progress.

        A run left in an event loop that was closed under it (closed without shutting down its
        async generators) can never go on: it has ended, and is settled when this is read, so
        `messages` is valid and whole (its streamed text kept) from then on."""
        st = self._state
        if st is not None and st.loop.is_closed():
            from ._loop import forget_closed_run

            forget_closed_run(self, st)
        return self._state is not None

    @property
    def signal(self) -> AbortSignal | None:
        """The current run's abort signal (None when idle)."""
        return self._state.signal if self._state is not None else None

    def run(self, prompt: str | Message | None = None) -> AsyncGenerator[Event, None]:
        """Run the loop on ``prompt``; iterate the returned object for events.

        Stopping the iteration early (``break``, ``aclose()``, a cancelled task)
        aborts the run with reason ``"consumer_closed"`` and leaves a valid
        transcript. A prompt `Message` that breaks a transcript rule is repaired
        before it is sent, as a message appended between runs is. Raises
        RuntimeError (on first iteration) if a run is already in progress, or
        another engine's run is writing to this one's session store; ValueError
        if there is nothing to run (a prompt with no text in it).
        """
        from ._loop import drive

        token = object()
        self._fresh_token, self._fresh_abort = token, None
        return _Run(self, drive(self, prompt, token), token)

    # -- control (sync, thread-safe) --------------------------------------------

    def interrupt(self, reason: str = "cancel") -> None:
        """Abort the current run with ``reason``. Never blocks, never raises.

        A run that waits for the last one's cleanup before it begins (started right after the
        host stopped iterating the last one) is the current run: it starts aborted.
        """
        try:
            # The waiting run first: it puts its state in place before it stops waiting.
            waiting = self._next_run
            if waiting is not None:
                waiting.controller.abort(str(reason))
            state = self._state
            if state is not None:
                controller = state.controller
                controller.abort(str(reason))
                if controller.signal.reason == "send_now" and reason != "send_now":
                    # A send_now stopped this turn already: the stop is for the turn its text
                    # starts, before that turn's model request (the text stays in the transcript).
                    state.stop_next = str(reason)
                    if state.controller is not controller:  # that turn began meanwhile (another thread)
                        state.controller.abort(str(reason))
            elif waiting is None and self._fresh_token is not None:
                # A run() made but not begun (handed to a task that has had no step yet) is the
                # current run: it begins aborted. Begun meanwhile in another thread, it is here.
                if self._fresh_abort is None:
                    self._fresh_abort = str(reason)
                state = self._state
                if state is not None:
                    state.controller.abort(str(reason))
        except Exception:  # a control call must never raise into its caller
            log.exception("interrupt() failed")

    def send_now(self, text: str) -> str:
        """Stop the current turn and start a new one with ``text`` at once.

        When idle, ``text`` starts the next run. Returns a receipt id; the text
        is never lost (it is delivered by this run or the next one). Raises
        ValueError for a blank text (it would be a blank user message).
        """
        # The turn to stop is the one running now. Read before the text is queued: from another
        # thread, the loop may take the text and start its turn before the abort below, and
        # that turn must not be the one stopped.
        state = self._state
        controller = state.controller if state is not None else None
        receipt = self.inbox.put(self.inbox.send_now, text, "send")
        if controller is not None:
            try:
                controller.abort("send_now")
            except Exception:  # as interrupt(): a control call never raises once the text is queued
                log.exception("send_now() failed to stop the turn")
        return receipt

    def interject(self, text: str) -> str:
        """Queue ``text`` for the model at the next safe point, cancelling nothing.

        Returns a receipt id, repeated in the InterjectionInjected (or
        InterjectionDropped) event. Raises ValueError for a blank text.
        """
        return self.inbox.put(self.inbox.interjections, text, "int")

    def follow_up(self, text: str) -> str:
        """Queue ``text`` as a new turn after the current turn completes (ValueError if blank)."""
        return self.inbox.put(self.inbox.follow_ups, text, "fup")

    def submit(self, text: str) -> str:
        """`follow_up` or `interject`, according to ``follow_up_behavior`` (ValueError if blank)."""
        if self.options.follow_up_behavior == "steer" and self.running:
            return self.interject(text)
        return self.follow_up(text)

    def on_abort(self, fn: AbortHook, *, main_only: bool = False) -> None:
        """Call ``fn(reason)`` (sync or async) when a run is aborted.

        Hooks are inherited by subagents created afterwards; a ``main_only``
        hook runs only when the main engine (not a subagent) is aborted.
        """
        self._abort_hooks.append((fn, main_only))

    def watch_tools(self, fn: ToolWatcher) -> None:
        """Let ``fn`` change the tool set: ``fn(tools)`` gets the current tools by name and
        returns the tools to offer instead, or None to keep them.

        It is called before each model request of a run (never during a request or a tool
        batch: the calls of a response run with the tools the model was offered). A tool
        server whose tool list changes uses it (`agentloop.mcp.MCPServer.attach`). Subagents
        created afterwards inherit it. A watcher that raises, or returns duplicate names, is
        logged and the tools are kept.
        """
        self._tool_watchers = (*self._tool_watchers, fn)

    def _set_tools(self, tools: Sequence[Tool]) -> None:
        self.tools = _tool_map(tools)  # a new dict: a tool phase in progress keeps its own
        self.tool_specs = tuple(self.tools.values())
        for policy in self.policies:
            policy.bind(self.tools)

    def _refresh_tools(self) -> None:
        """Apply the tool watchers (the loop calls this before each model request)."""
        for fn in self._tool_watchers:
            try:
                tools = fn(self.tools)
                if tools is not None:
                    self._set_tools(tools)
            except Exception:
                log.exception("tool watcher %r failed; the tools are kept", fn)

    async def _run_abort_hooks(self, reason: str) -> None:
        token = _hooked_engine.set(self)
        try:
            for fn, main_only in self._abort_hooks:
                if main_only and self.parent is not None:
                    continue
                try:
                    result = fn(reason)
                    if inspect.isawaitable(result):
                        await result
                except Exception:
                    log.exception("on_abort hook %r failed", fn)
                except asyncio.CancelledError:
                    task = asyncio.current_task()
                    if task is None or task.cancelling():  # the run's task is being cancelled: it goes on
                        raise
                    # Nobody cancelled the run: the hook met a cancellation of its own (it awaited
                    # something that was cancelled). A failed hook, like one that raises.
                    log.exception("on_abort hook %r failed: it was cancelled, though the run was not", fn)
        finally:
            _hooked_engine.reset(token)

    # -- subagents ---------------------------------------------------------------

    def subagent(self, *, agent_id: str, **overrides: Any) -> QueryEngine:
        """A child engine sharing this one's model and tools.

        Its runs are linked to this engine's current run: a parent abort aborts
        the child with the same reason; the child's own abort leaves the parent
        running. ``overrides`` are any `QueryEngine` keyword arguments.
        """
        # Every setting is copied but two: a child writes no interrupt notice (its parent's
        # transcript tells the story), and a forced tool_choice is the parent's own business.
        kwargs: dict[str, Any] = {f.name: getattr(self.options, f.name) for f in fields(EngineOptions)}
        kwargs.update(
            tools=list(self.tools.values()),
            interrupt_notice=None,
            tool_choice=None,
            session=self.session.sidechain(agent_id) if self.session is not None else None,
        )
        if "policies" not in overrides:  # given ones replace the parent's, which are not copied then
            kwargs["policies"] = [p.fork() for p in self.policies]
        kwargs.update(overrides)
        model = kwargs.pop("model", self.model)
        child = QueryEngine(model, parent=self, agent_id=agent_id, **kwargs)
        # An agent_id used before (earlier in this run, or in the run a session was resumed from)
        # has a sidechain holding that child's conversation: this child's first record is a
        # checkpoint, so the file replays to this child's transcript, not to both joined.
        child._checkpoint_due = _holds_records(child.session)
        child._own_sidechain = "session" not in overrides and child.session is not None
        return child

    def start_background(self, child: QueryEngine, prompt: str | Message) -> asyncio.Task[list[Event]]:
        """Run ``child`` (from `subagent`) in the background; the task returns its events.

        A background child is not linked to this engine's runs: on a parent
        cancel it keeps running, unless ``background_subagents="abort"``.
        """
        if child.parent is not self:
            raise ValueError("start_background() needs a subagent of this engine")
        child._background_child = True
        if self._background_children is None:
            self._background_children = weakref.WeakSet()
        self._background_children.add(child)

        async def drain() -> list[Event]:
            return [ev async for ev in child.run(prompt)]

        task = asyncio.get_running_loop().create_task(drain(), name=f"agentloop-bg-{child.agent_id}")
        child._start_pending = True
        task.add_done_callback(lambda _: child._take_abort_at_start())  # never begun (cancelled, say)
        if self._background is None:
            self._background = set()  # a running task must never be garbage-collected
        self._background.add(task)
        task.add_done_callback(self._background.discard)
        return task

    def _abort_background(self, reason: str) -> None:
        """With ``background_subagents="abort"``, stop this engine's background children with
        ``reason`` (the run that aborted): also those whose run is not linked to this one (started
        while this engine was idle, or in an earlier run of it)."""
        children = self._background_children
        if children is None or self.options.background_subagents != "abort":
            return
        for child in list(children):
            if child._state is None and child._start_pending:
                # Its task has not begun the run yet (it has had no step): there is nothing to
                # interrupt, so the run starts aborted.
                if child._abort_at_start is None:
                    child._abort_at_start = reason
            else:
                child.interrupt(reason)

    def _take_fresh_abort(self, token: object) -> str | None:
        """As the run made with ``token`` begins (its state in place): the reason an interrupt()
        gave between run() and this first step, if any (once)."""
        if self._fresh_token is not token:
            return None
        self._fresh_token = None
        reason, self._fresh_abort = self._fresh_abort, None
        return reason

    def _take_abort_at_start(self) -> str | None:
        """The reason a background run that is beginning must start aborted with, if any (once)."""
        reason = self._abort_at_start
        self._start_pending = False
        self._abort_at_start = None
        return reason

    def _link_signal(self) -> AbortSignal | None:
        """The signal a new run of this engine follows (its parent's run), if any."""
        parent = self.parent
        if parent is None or parent._state is None:
            return None
        if self._background_child and parent.options.background_subagents == "keep":
            return None
        return parent._state.signal

    def _commit(self, message: Message) -> None:
        self.messages.append(message)
        if self.session is not None:
            assert self._recorded is not None
            self._recorded.append(message)
            try:
                self.session.append_message(message)
            except Exception as exc:
                self._store_failed(f"a message ({message.role})", exc)

    def _record_event(self, event: Event) -> None:
        if self.session is not None:
            try:
                self.session.append_event(event)
            except Exception as exc:
                self._store_failed(f"an event ({event.type})", exc)

    def _claim_store(self) -> None:
        """As a run starts: claim this engine's session store for the run. Raises RuntimeError
        if another engine's run writes to it (or is starting on it), `SessionLockedError` if
        the store has another writer elsewhere (another process). `_release_store` undoes it."""
        store = self.session
        if store is None:
            return
        key = _store_key(store)
        with _store_claims:
            other = _store_writers.get(key)
            if other is not None and other is not self and other._writes_to(key):
                who = f" (agent_id={other.agent_id!r})" if other.agent_id else ""
                if other.session is store:
                    fix = "a store records one transcript (give each engine its own, a subagent its own agent_id)"
                else:  # another session object on the same file: the file is what they share
                    fix = (
                        "its file records one transcript, whichever session object writes it (give each "
                        "engine a file of its own: two JsonlSession objects on one file are one store)"
                    )
                raise RuntimeError(f"the session store {store!r} is in use by another running engine{who}: {fix}")
            _store_writers[key] = self
            self._store_claimed = key
        acquire = getattr(store, "acquire", None)
        if acquire is not None:
            try:
                acquire()  # a JsonlSession's file lock: taken now, or the run's records go nowhere
            except SessionLockedError:
                self._release_store()
                raise
            except Exception:  # a file it cannot open: each append fails too, and is listed
                pass

    def _writes_to(self, key: object) -> bool:
        """Whether this engine, found as the writer of store ``key``, still writes to it: its run
        is starting (claimed, no state yet) or going on in an open loop (a run left in an event
        loop that was closed under it writes no more)."""
        state = self._state
        return (
            (state is None or not state.loop.is_closed())
            and self.session is not None
            and _store_key(self.session) == key
        )

    def _release_store(self) -> None:
        """As a run ends (or fails to start): this engine no longer writes to its store."""
        key, self._store_claimed = self._store_claimed, None
        if key is not None:
            with _store_claims:
                if _store_writers.get(key) is self:
                    del _store_writers[key]

    def _vet_history(self) -> None:
        """As a run starts: repair what the host broke in `messages` since it was last valid
        (appended, edited or replaced between runs), before any of it is sent."""
        messages, vetted = self.messages, self._vetted
        n = len(vetted)
        if len(messages) >= n and all(map(operator.is_, messages, vetted)):
            if len(messages) == n:
                return
            fresh = messages[n:]
            _check_entries(fresh, n)
            # A valid prefix owes no result, so appended messages are checked on their own, unless
            # they make calls (whose ids must differ from every earlier call's).
            calls = any(b.type == "tool_use" for m in fresh for b in m.content)
            valid = is_valid(messages if calls else fresh)
        else:
            _check_entries(messages, 0)
            valid = is_valid(messages)
        if not valid:
            messages[:] = valid_history(messages, "the transcript, as changed since the last run")
        self._vetted = list(messages)

    def _catch_up_session(self) -> None:
        """As a run starts: record in the session what the host did to `messages` since the
        last commit (appended messages are appended; a rewound or edited transcript is written
        as a checkpoint), so that the session replays to the transcript the run starts from."""
        recorded = self._recorded
        if self.session is None or recorded is None:
            return
        messages = self.messages
        due, self._checkpoint_due = self._checkpoint_due, False
        if not due and len(messages) >= len(recorded) and all(map(operator.is_, messages, recorded)):
            if len(messages) == len(recorded):
                return
            for message in messages[len(recorded) :]:  # appended by the host
                self._commit_to_store(message)
        else:
            checkpoint = getattr(self.session, "append_checkpoint", None)
            try:
                if checkpoint is None:
                    raise TypeError(f"{type(self.session).__name__} has no append_checkpoint()")
                checkpoint(list(messages))
            except Exception as exc:
                self._store_failed("a checkpoint of the transcript" + ("" if due else " the host rewrote"), exc)
        self._recorded = list(messages)

    def _commit_to_store(self, message: Message) -> None:
        assert self.session is not None
        try:
            self.session.append_message(message)
        except Exception as exc:
            self._store_failed(f"a message ({message.role})", exc)

    def _release_sidechain(self) -> None:
        """As a subagent's run ends: close the file of the sidechain `subagent()` gave it (a
        `JsonlSession` opens it again on its next append), rather than hold it open until the
        parent's session is closed. The sidechain is the parent's store's to close, not ours."""
        release = getattr(self.session, "release", None)
        if not self._own_sidechain or release is None:
            return
        try:
            release()
        except Exception as exc:
            self._store_failed("the end of its sidechain file (closing it)", exc)

    def _store_failed(self, what: str, exc: Exception) -> None:
        # The run goes on (the transcript in memory is whole), but the file is not: say so where
        # the host can look, on this engine and on each one above it (a sidechain is part of the
        # main session, and a subagent engine is often gone by the time the host looks).
        who = f"subagent {self.agent_id!r}: " if self.parent is not None and self.agent_id else ""
        note = f"{who}could not record {what}: {type(exc).__name__}: {exc}"
        log.error("session store failed: %s", note, exc_info=exc)
        engine: QueryEngine | None = self
        while engine is not None:
            engine.session_errors.append(note)
            engine = engine.parent


_TWO_CONSUMERS = (
    "this run is being iterated by another task already: iterate a run() from one task only (to "
    "hand its events to several consumers, iterate it once and forward each event)"
)


class _Run(AsyncGenerator[Event, None]):
    """The object `run()` returns: an async generator of the loop's events.

    Dropping it (``break`` out of ``async for``) settles the transcript at once
    and lets the loop's cleanup finish in the background; ``aclose()`` does the
    same and waits for the cleanup. Typed as an async generator so that a host's
    ``aclose()`` type-checks.
    """

    __slots__ = ("_agen", "_engine", "_token")

    def __init__(self, engine: QueryEngine, agen: AsyncGenerator[Event, None], token: object) -> None:
        self._engine = engine
        self._agen = agen
        self._token = token

    def __aiter__(self) -> _Run:
        return self

    def __anext__(self) -> Coroutine[Any, Any, Event]:
        # The generator's own awaitable, not a coroutine around it: one frame less per event.
        if self._agen.ag_running:  # type: ignore[attr-defined]  # drive() is an async generator function
            raise RuntimeError(_TWO_CONSUMERS)
        return self._agen.__anext__()

    def asend(self, value: None) -> Coroutine[Any, Any, Event]:
        return self._agen.asend(value)

    def athrow(self, typ: Any, val: Any = None, tb: Any = None) -> Coroutine[Any, Any, Event]:
        return self._agen.athrow(typ) if val is None and tb is None else self._agen.athrow(typ, val, tb)

    async def aclose(self) -> None:
        """Stop the run (reason ``"consumer_closed"`` if still going) and wait for cleanup.

        Called while another task awaits the next event, it stops the run the same way and
        returns at once: that task receives the run's last events (its ``TurnEnded``), then the
        end of iteration, and the cleanup runs there.
        """
        from ._loop import close_elsewhere, consumer_gone

        if getattr(self._agen, "ag_running", False):  # another task is inside the loop: the run ends there
            close_elsewhere(self._engine, self._token)
            return
        consumer_gone(self._engine, self._token)
        await self._agen.aclose()

    def __del__(self) -> None:
        try:  # the import too: at interpreter exit, an import fails ("sys.meta_path is None")
            from ._loop import consumer_gone

            consumer_gone(self._engine, self._token)
        except Exception:  # never raise from a finalizer
            pass


