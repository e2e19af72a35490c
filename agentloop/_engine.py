"""`QueryEngine`: the public face of the loop.

The engine holds the transcript, the configuration and the host's inbox; the
loop itself lives in `agentloop._loop` and is the only one: every way of using
the engine (iterating `run()`, a subagent, the demo) drains the same event
stream.
"""

from __future__ import annotations

import asyncio
import logging
import operator
import weakref
from collections.abc import AsyncGenerator, Awaitable, Callable, Mapping, Sequence
from dataclasses import fields
from typing import TYPE_CHECKING, Any, Literal

from ._abort import AbortSignal
from ._events import Event, TurnEnded
from ._executor import describe
from ._handle import RunHandle, forget_closed_run
from ._hostlog import log_failure
from ._inbox import Inbox, Texts
from ._messages import Message
from ._model import Model
from ._options import (
    DEFAULT_TEXTS,
    EngineOptions,
    Setting,
    check_entries,
    check_lineage,
    check_model,
    check_session,
    message_list,
    policy_list,
    recovery_default,
    tool_map,
)
from ._policy import Policy, bind_all, occupied
from ._recording import holds_messages, holds_no_records, holds_records, record_lost, record_message
from ._repair import valid_history
from ._subagent import take_abort_at_start
from ._toolphase import run_secrets
from ._tools import PermissionCallback, Tool
from ._transcript import lineage_credentials, redacted
from ._unicode import scrub
from ._validate import is_valid

if TYPE_CHECKING:
    from ._commit import ToolIds
    from ._run import NextRun, RunState
    from .sessions import SessionStore

__all__ = ["EngineOptions", "QueryEngine"]

log = logging.getLogger("agentloop")

AbortHook = Callable[[str], Awaitable[None] | None]
ToolWatcher = Callable[[Mapping[str, Tool]], Sequence[Tool] | None]


class QueryEngine:
    """An agent loop over ``model`` and ``tools``.

    Control calls (`interrupt`, `send_now`, `interject`, `follow_up`, `submit`)
    are plain synchronous calls, safe from any thread; only `run()` is async.

    ``max_parallel_tools`` (default 10): how many consecutive concurrency-safe calls of one
    response run at once. ``follow_up_behavior``: what `submit` does, "queue" (`follow_up`,
    the default) or "steer" (`interject`). ``doom_loop_recovery``: cut and resample a doom
    loop (True) or only report it (False); None reads ``AGENTLOOP_DOOM_LOOP_RECOVERY`` (on
    unless false, 0, no or off).

    Keyword arguments beyond API.md: ``usage_limit`` (total tokens per run,
    subagents' included, terminal ``usage_limit``; it cannot hold when the provider's usage is
    unreadable, counted as 0 with a warning that says so), ``deadline`` (seconds of wall clock per run,
    terminal ``deadline``), ``texts`` (every text the library writes),
    ``session`` (a `agentloop.sessions.SessionStore` receiving each committed
    message; a record it fails to append costs the run nothing and adds one line
    to ``session_errors``, as does a subagent's), ``background_subagents``
    ("keep" or "abort" on a parent cancel), ``retry_base_delay``/``retry_max_delay`` (back-off bounds, seconds),
    ``max_tokens`` and ``tool_choice`` (passed on in each request), ``max_tool_result_chars``
    (a longer tool result is cut in the middle before it enters the transcript, default
    100,000 characters, None for no cap; `ToolCallFinished.full_result` keeps the whole).
    """

    # Each setting of `EngineOptions` reads and writes as an attribute too, checked on the way in
    # (a name the engine never read would otherwise take the value and change nothing).
    system: Setting[str | None] = Setting()
    max_turns: Setting[int | None] = Setting()
    max_parallel_tools: Setting[int] = Setting()
    tool_cancel_grace: Setting[float] = Setting()
    permission: Setting[PermissionCallback | None] = Setting()
    follow_up_behavior: Setting[Literal["queue", "steer"]] = Setting()
    interrupt_notice: Setting[Literal["append", "envelope"] | None] = Setting()
    doom_loop_recovery: Setting[bool] = Setting(recovery_default)
    doom_budget: Setting[int] = Setting()
    retry_budget: Setting[int] = Setting()
    retry_base_delay: Setting[float] = Setting()
    retry_max_delay: Setting[float] = Setting()
    usage_limit: Setting[int | None] = Setting()
    deadline: Setting[float | None] = Setting()
    max_tokens: Setting[int | None] = Setting()
    tool_choice: Setting[str | None] = Setting()
    background_subagents: Setting[Literal["keep", "abort"]] = Setting()
    texts: Setting[Texts] = Setting()
    max_tool_result_chars: Setting[int | None] = Setting()

    @property
    def model(self) -> Model:
        """The model each request goes to; assigning one (between runs) checks it as the
        constructor does, so a wrong value is a TypeError here rather than in the next run."""
        return self._model

    @model.setter
    def model(self, model: Model) -> None:
        check_model(model)
        self._model = model

    @property
    def tools(self) -> dict[str, Tool]:
        """The tools by name. Assign a list of tools (or a dict such as this one) to change
        them: checked as at construction, offered from the next model request on."""
        return self._tools

    @tools.setter
    def tools(self, tools: Sequence[Tool] | Mapping[str, Tool]) -> None:
        self._set_tools(tools)

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
        """Raises TypeError or ValueError for an argument the engine cannot run with (see
        `agentloop._options`, where the checks are). Longer than most: its signature is the
        public list of settings, and its body sets each attribute once (see the limit below)."""
        check_model(model)
        check_session(session)
        check_lineage(parent, agent_id, QueryEngine)
        # At most 29 attributes: CPython 3.11 shares one key table among the instances of a class,
        # and the first instance can put 29 keys in it (30 less the one its own creation takes);
        # past that every engine holds a dict of its own (1.3 KB more per engine).
        self._model = model
        self._tools = tool_map(tools)
        self.tool_specs: tuple[Tool, ...] = tuple(self.tools.values())  # what each request declares
        self.options = EngineOptions(
            system=system,
            max_turns=max_turns,
            max_parallel_tools=max_parallel_tools,
            tool_cancel_grace=tool_cancel_grace,
            permission=permission,
            follow_up_behavior=follow_up_behavior,
            interrupt_notice=interrupt_notice,
            doom_loop_recovery=recovery_default(doom_loop_recovery),
            doom_budget=doom_budget,
            retry_budget=retry_budget,
            retry_base_delay=retry_base_delay,
            retry_max_delay=retry_max_delay,
            usage_limit=usage_limit,
            deadline=deadline,
            max_tokens=max_tokens,
            tool_choice=tool_choice,
            background_subagents=background_subagents,
            texts=texts if texts is not None else DEFAULT_TEXTS,
            max_tool_result_chars=max_tool_result_chars,
        )
        given = message_list(messages)
        self.messages: list[Message] = valid_history(given, "the messages given to QueryEngine")
        # The transcript as last seen valid: run() checks only what the host changed since.
        self._vetted: list[Message] = list(self.messages)
        if policies is None:
            from .policies import default_policies

            policies = default_policies()
        self.policies: list[Policy] = policy_list(policies)
        with occupied(self.policies, self):  # not one another engine's run is using: its own fork
            bind_all(self.policies, self, strict=True)
            if self.policies and self.messages:  # a saved transcript resumed: the policies catch up on it
                from ._turns import catch_up_policies

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
        # start_background() made a task for this child whose run has not begun yet (a list), and
        # the reason its parent's "abort" setting gave while it had not (the list's one item): the
        # run starts aborted. None when no such task is pending.
        self._start_pending: list[str] | None = None
        self._own_sidechain = False  # its session is the sidechain `subagent()` asked for: released after each run
        # The last run() made (its token), until its first step begins it, and the reason an
        # interrupt() gave meanwhile (a run handed to a task that has not started yet): it begins aborted.
        self._fresh_run: tuple[object, str | None] | None = None
        # The background children (start_background) a "abort" setting stops on this engine's aborts.
        self._background_children: weakref.WeakSet[QueryEngine] | None = None
        # The session holds another transcript's records already, or none of the messages given
        # (a conversation forked into a new file): the first run writes the transcript whole.
        self._checkpoint_due = bool(given) and holds_no_records(session)
        if session is not None and parent is None and not given and holds_messages(session):
            # A file of an earlier conversation, none of which this engine was given (a task run
            # again with the session of its last attempt): the file is to replay to this engine's
            # transcript, not to both joined.
            self._checkpoint_due = True
            log.warning(
                "session file %s holds a conversation already, and this engine was given none of it: "
                "its first run writes a checkpoint, so the file replays to this engine's transcript. "
                "To continue the file's conversation instead, `session, loaded = JsonlSession.resume(path)` "
                "and pass `messages=loaded.messages`",
                session.path,
            )
        self._cleanup: set[asyncio.Task[Any]] | None = None  # abort hooks' cleanup the run waits for at its end
        self._store_claimed: object = None  # this engine's key in _store_writers while it runs

    def __repr__(self) -> str:
        who = f" agent_id={self.agent_id!r}" if self.agent_id else ""
        state = "running" if self._in_progress() else "idle"
        return f"<QueryEngine{who} {state} messages={len(self.messages)}>"

    # -- running ---------------------------------------------------------------

    @property
    def running(self) -> bool:
        """True while a `run()` is in progress: one the host iterates, or one waiting for the
        last run's cleanup before it begins.

        A run the host stopped iterating (``break``, the handle dropped or closed) is over for
        the host, though its cleanup may still go on in the background: False then, as for
        `interject` (idle) and `submit` (a follow-up). A run left in an event loop that was
        closed under it (closed without shutting down its async generators) can never go on:
        it has ended, and is settled when this is read, so `messages` is valid and whole (its
        streamed text kept) from then on."""
        st = self._state
        if st is not None and st.loop.is_closed():
            forget_closed_run(self, st)
        return self._in_progress()

    def _in_progress(self) -> bool:
        """A run is in progress as the host sees it (see `running`)."""
        state = self._state
        # A run made and not begun yet (handed to a task that has had no step) is going too.
        return (state is not None and not state.released) or self._next_run is not None or self._fresh_run is not None

    @property
    def signal(self) -> AbortSignal | None:
        """The current turn's abort signal (None when idle); a later turn of the run has its own.
        A run the host stopped iterating is none: its cleanup may go on, its signal aborted."""
        state = self._state
        return state.signal if state is not None and not state.released else None

    def run(self, prompt: str | Message | None = None) -> AsyncGenerator[Event, None]:
        """Run the loop on ``prompt``; iterate the returned object for events.

        Stopping the iteration early (``break``, ``aclose()``, a cancelled task)
        aborts the run with reason ``"consumer_closed"`` and leaves a valid
        transcript. A prompt `Message` that breaks a transcript rule is repaired
        before it is sent, as a message appended between runs is. Raises
        RuntimeError (on first iteration) if a run is already in progress, or
        another engine's run is writing to this one's session store; ValueError
        if there is nothing to run: at once for a blank text (or a prompt that
        is not a str or a user `Message`, TypeError and ValueError), so that a
        server answers it before it streams; on first iteration when the
        transcript and the queue hold nothing to resume from.
        """
        from ._loop import drive
        from ._turns import refuse_prompt

        refuse_prompt(prompt)
        token = object()
        self._fresh_run = (token, None)
        return RunHandle(self, drive(self, prompt, token), token)

    # -- control (sync, thread-safe) --------------------------------------------

    def interrupt(self, reason: str = "cancel") -> None:
        """Abort the current run with ``reason``. Never blocks, never raises.

        The credentials the engine knows (its model's, its ancestors') are replaced by
        ``[REDACTED]`` in ``reason``, which goes into events, session files and logs.

        A run that waits for the last one's cleanup before it begins (started right after the
        host stopped iterating the last one) is the current run: it starts aborted.
        """
        try:
            # The host's reason is always a str, and never blank (one read from an empty field
            # would say nothing in the terminal event, the session file and the abort hooks).
            reason = "cancel" if reason is None else str(reason)
            if not reason.strip():
                reason = "cancel"
            reason = scrub(reason)  # kept in the cut message's meta: text UTF-8 can encode
            # The host's text (an error message passed on) may quote the model's key: the reason
            # reaches the terminal event, the session file, the abort hooks and their logs.
            reason = self._without_credentials(reason)
            # The waiting run first: it puts its state in place before it stops waiting.
            waiting = self._next_run
            if waiting is not None:
                waiting.controller.abort(reason)
            state = self._state
            if state is not None and state.released and self._fresh_run is not None:
                state = None  # the host stopped iterating that run and made another: that one is current
            if state is not None:
                controller = state.controller
                controller.abort(reason)
                if controller.signal.reason == "send_now" and reason != "send_now":
                    # A send_now stopped this turn already: the stop is for the turn its text
                    # starts, before that turn's model request (the text stays in the transcript).
                    state.stop_next = reason
                    if state.controller is not controller:  # that turn began meanwhile (another thread)
                        # and may have taken its pending stop already: stop it here, and leave
                        # none pending for a turn after it (a later send-now's).
                        state.stop_next = None
                        state.controller.abort(reason)
            elif waiting is None and (fresh := self._fresh_run) is not None:
                # A run() made but not begun (handed to a task that has had no step yet) is the
                # current run: it begins aborted. Begun meanwhile in another thread, it is here.
                if fresh[1] is None:
                    self._fresh_run = (fresh[0], reason)
                state = self._state
                if state is not None:
                    state.controller.abort(reason)
        except Exception:  # a control call must never raise into its caller
            log_failure(self, "interrupt() failed")

    def _without_credentials(self, reason: str) -> str:
        """``reason`` without the credentials the engine knows; as it is if they cannot be read
        (a stop must stop, whatever the model's key holder does)."""
        try:
            state = self._state  # a run's are read once per model and tool set, as for its tool results
            return redacted(reason, run_secrets(self, state) if state is not None else lineage_credentials(self))
        except Exception:
            return reason

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
        # A run() made and not begun is the turn to stop: its text follows that run's prompt.
        late = state is None and self._next_run is None and self._fresh_run is not None
        receipt = self.inbox.put(self.inbox.send_now, text, "send", late=late)
        if late:
            self.interrupt("send_now")  # it begins aborted; begun meanwhile (a thread), it is stopped
        elif controller is not None:
            try:
                controller.abort("send_now")
            except Exception:  # as interrupt(): a control call never raises once the text is queued
                log_failure(self, "send_now() failed to stop the turn")
        return receipt

    def interject(self, text: str) -> str:
        """Queue ``text`` for the model at the next safe point, cancelling nothing.

        When idle, ``text`` starts the next run as the user's own message (before its prompt).
        Returns a receipt id, repeated in the InterjectionInjected (or
        InterjectionDropped) event. Raises ValueError for a blank text.
        """
        # As the host sees it. Late: run(prompt) was called and has not begun (nor been dropped),
        # so the text was typed after that prompt. Idle: no run in progress or waiting to begin
        # either; a run the host stopped iterating is none, though its cleanup may still go on.
        late = self._fresh_run is not None
        idle = not late and not self._in_progress()
        return self.inbox.put(self.inbox.interjections, text, "int", idle=idle, late=late)

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
        hook runs only when the main engine (not a subagent) is aborted. An async hook
        runs in the run's task and gets what is left of ``tool_cancel_grace`` (counted from
        the abort, at least 0.1 s), then is cancelled once, with a warning.
        Raises TypeError for an ``fn`` that is not callable.
        """
        if not callable(fn):
            raise TypeError(f"on_abort takes a callable fn(reason), sync or async, not {type(fn).__name__}")
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

    def _set_tools(self, tools: Sequence[Tool] | Mapping[str, Tool]) -> None:
        self._tools = tool_map(tools)  # a new dict: a tool phase in progress keeps its own
        self.tool_specs = tuple(self.tools.values())  # a new tuple: a run reads its servers' credentials again
        with occupied(self.policies, self):  # not one another engine's run is using: its own fork
            bind_all(self.policies, self)  # each one: a policy's bug leaves the others bound to these tools

    def _refresh_tools(self) -> None:
        """Apply the tool watchers (the loop calls this before each model request)."""
        for fn in self._tool_watchers:
            try:
                tools = fn(self.tools)
                if tools is not None:
                    self._set_tools(tools)
            except Exception:
                log_failure(self, "tool watcher %r failed; the tools are kept", fn)

    # -- subagents ---------------------------------------------------------------

    def subagent(self, *, agent_id: str, **overrides: Any) -> QueryEngine:
        """A child engine sharing this one's model and tools.

        Its runs are linked to this engine's current run: a parent abort aborts
        the child with the same reason; the child's own abort leaves the parent
        running. ``overrides`` are any `QueryEngine` keyword arguments.

        Raises ValueError when ``agent_id`` is this engine's own or an ancestor's: its events
        could not be told from that engine's, and its sidechain file would be that engine's;
        TypeError or ValueError for an ``agent_id`` that is not a name (None, a number, a blank).
        """
        check_lineage(self, agent_id, QueryEngine)
        _check_nested_id(self, agent_id)
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
        child._checkpoint_due = child._checkpoint_due or holds_records(child.session)
        child._own_sidechain = "session" not in overrides and child.session is not None
        return child

    def start_background(self, child: QueryEngine, prompt: str | Message) -> asyncio.Task[list[Event]]:
        """Run ``child`` (from `subagent`) in the background; the task returns its events.

        A background child is not linked to this engine's runs: on a parent
        cancel it keeps running, unless ``background_subagents="abort"``.
        """
        if child.parent is not self:
            raise ValueError("start_background() needs a subagent of this engine")
        if self._background_children is None:
            self._background_children = weakref.WeakSet()
        self._background_children.add(child)

        async def drain() -> list[Event]:
            return [ev async for ev in child.run(prompt)]

        task = asyncio.get_running_loop().create_task(drain(), name=f"agentloop-bg-{child.agent_id}")
        child._start_pending = []
        task.add_done_callback(lambda _: take_abort_at_start(child))  # never begun (cancelled, say)
        if self._background is None:
            self._background = set()  # a running task must never be garbage-collected
        self._background.add(task)
        task.add_done_callback(self._background.discard)
        return task

    def _commit(self, message: Message) -> None:
        self.messages.append(message)
        if self.session is not None:
            assert self._recorded is not None
            self._recorded.append(message)
            record_message(self, message)

    def _record_event(self, event: Event) -> None:
        if self.session is not None:
            try:
                self.session.append_event(event)
            except Exception as exc:
                if isinstance(exc, OSError):  # the file may be a new one (the old one deleted under it)
                    record_lost(self)
                self._store_failed(f"an event ({event.type})", exc)

    def _vet_history(self) -> None:
        """As a run starts: repair what the host broke in `messages` since it was last valid
        (appended, edited or replaced between runs), before any of it is sent."""
        messages, vetted = self.messages, self._vetted
        n = len(vetted)
        if len(messages) >= n and all(map(operator.is_, messages, vetted)):
            if len(messages) == n:
                return
            fresh = messages[n:]
            check_entries(fresh, n)
            # A valid prefix owes no result, so appended messages are checked on their own, unless
            # they make calls (whose ids must differ from every earlier call's).
            calls = any(b.type == "tool_use" for m in fresh for b in m.content)
            valid = is_valid(messages if calls else fresh)
        else:
            check_entries(messages, 0)
            valid = is_valid(messages)
        if not valid:
            messages[:] = valid_history(messages, "the transcript, as changed since the last run")
        self._vetted = list(messages)

    def _store_failed(self, what: str, exc: Exception) -> None:
        # The run goes on (the transcript in memory is whole), but the file is not: say so where
        # the host can look, on this engine and on each one above it (a sidechain is part of the
        # main session, and a subagent engine is often gone by the time the host looks).
        who = f"subagent {self.agent_id!r}: " if self.parent is not None and self.agent_id else ""
        note = redacted(f"{who}could not record {what}: {describe(exc)}", lineage_credentials(self))
        log_failure(self, "session store failed: %s", note, exc=exc)
        engine: QueryEngine | None = self
        while engine is not None:
            engine.session_errors.append(note)
            engine = engine.parent


def _check_nested_id(engine: QueryEngine, agent_id: str) -> None:
    """Raise ValueError when ``agent_id`` names ``engine`` or one of its ancestors."""
    chain: list[str] = []
    node: QueryEngine | None = engine
    while node is not None:
        if node.agent_id is not None:
            chain.append(node.agent_id)
        node = node.parent
    if agent_id in chain:
        path = " > ".join(repr(a) for a in reversed(chain))
        raise ValueError(
            f"agent_id {agent_id!r} is taken by an ancestor of the subagent (its line: {path}): "
            "a nested subagent needs an id of its own (its sidechain file would be that ancestor's)"
        )


def _fill_key_table() -> None:
    """Make one whole engine as the class is defined.

    CPython gives a class's instances one shared key table, whose room for new keys shrinks by
    one with each instance made before the keys are all in it. Engines refused half-made (a
    bad argument, in a notebook cell run twice) before the first whole one left too little room,
    and every later engine of the process held a dict of its own (1.3 KB more each).
    """
    from ._scripted import ScriptedModel

    QueryEngine(ScriptedModel([]), policies=[], doom_loop_recovery=False)


_fill_key_table()
