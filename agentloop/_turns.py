"""Where a turn's messages come from, and how a run and each turn begin.

A run begins with the host's prompt, or with what is queued (texts sent now while the
engine was idle start it, then follow-ups), or resumes a transcript that ends with a user
message (SPEC §4, §5). After a turn ends, a send-now text always starts the next one;
follow-ups only after a turn that completed with no abort. A text that follows an answer
an interrupt cut short goes in the interrupt envelope, when the engine writes notices that
way. Each turn tells the policies whether a person asked for it (`begin_turn`).
"""

from __future__ import annotations

import asyncio
from collections.abc import Sequence
from typing import TYPE_CHECKING

from ._abort import AbortController, enter_run, scrub_listener_errors
from ._commit import envelope_due, interjection_message, is_paused
from ._events import InterjectionInjected, TurnStarted
from ._handle import left_in_another_loop
from ._hostlog import engine_secrets
from ._inbox import Queued, envelope
from ._messages import Message, TextBlock
from ._policy import Policy, ask, claim, notify
from ._recording import catch_up_session, claim_store, release_store
from ._repair import valid_history
from ._run import NextRun, RunState
from ._subagent import link_signal, take_abort_at_start
from ._transcript import encodable_message
from ._unicode import scrub
from ._validate import is_valid

if TYPE_CHECKING:
    from ._engine import QueryEngine

__all__ = ["catch_up_policies", "deadline_passed", "next_turn", "open_run", "refuse_prompt", "start_turn"]


async def open_run(
    engine: QueryEngine, prompt: str | Message | None, token: object
) -> tuple[RunState, list[Message] | None]:
    """Begin a `run()`: its state in place, and the first turn's messages (None: no turn).

    A run started while the last one still cleans up (the host stopped iterating it and began
    another at once) waits for that cleanup; meanwhile `interrupt()` and `aclose()` reach it,
    through the controller its first turn will use. Raises RuntimeError when another run of
    the engine is in progress, ValueError or TypeError for a prompt it cannot run.
    """
    try:
        return await _open(engine, prompt, token)
    except BaseException:  # refused: a run made and never begun is not going any more
        fresh = engine._fresh_run
        if fresh is not None and fresh[0] is token:
            engine._fresh_run = None
        raise


def run_controller(engine: QueryEngine) -> AbortController:
    """The controller of a run or turn of ``engine``: it follows the run of the engine above, and
    a listener of its signal (or of a signal that follows it: a tool's, a subagent's, an MCP
    call's) that raises is logged without the credentials ``engine`` knows."""
    controller = AbortController(parent=link_signal(engine))
    scrub_listener_errors(controller.signal, engine_secrets(engine))
    return controller


async def _open(
    engine: QueryEngine, prompt: str | Message | None, token: object
) -> tuple[RunState, list[Message] | None]:
    previous = engine._state
    if previous is not None and previous.loop is not asyncio.get_running_loop():
        left_in_another_loop(engine, previous)
    if previous is None or not previous.finishing or engine._closing is None:
        return _begin(engine, prompt, token)
    waiting = engine._next_run = NextRun(token, run_controller(engine))
    try:
        await asyncio.shield(engine._closing)
        return _begin(engine, prompt, token, waiting)
    except BaseException:  # cancelled while it waited, or refused: its controller goes unused
        waiting.controller.unlink()
        raise
    finally:
        if engine._next_run is waiting:  # cleared once the run's state is in place (or it failed)
            engine._next_run = None


def _take_fresh_abort(engine: QueryEngine, token: object) -> str | None:
    """As the run made with ``token`` begins (its state in place): the reason an interrupt()
    gave between run() and this first step, if any (once)."""
    fresh = engine._fresh_run
    if fresh is None or fresh[0] is not token:
        return None
    engine._fresh_run = None
    return fresh[1]


_IN_PROGRESS = (
    "a run is already in progress on this engine (one you stopped iterating but still hold "
    "ends when you await its aclose() or drop it)"
)

# The engines (by id) whose run is beginning, each with that run's token: runs of one engine
# begun at once in two threads (an event loop each) are one run and one RuntimeError. An entry
# is there only while `_begin` runs.
_beginning: dict[int, object] = {}


def _begin(
    engine: QueryEngine, prompt: str | Message | None, token: object, waited: NextRun | None = None
) -> tuple[RunState, list[Message] | None]:
    """The run's state, put in place once its store is claimed and the host's changes to the
    transcript are vetted and recorded; ``waited``: the hand-over of a run that waited."""
    key = id(engine)
    if _beginning.setdefault(key, token) is not token:  # atomic: one of two at once gets it
        raise RuntimeError(_IN_PROGRESS)
    try:
        if engine._state is not None:  # read once the entry is ours: a run begun meanwhile is seen
            raise RuntimeError(_IN_PROGRESS)
        return _begin_alone(engine, prompt, token, waited)
    finally:
        del _beginning[key]


def _begin_alone(
    engine: QueryEngine, prompt: str | Message | None, token: object, waited: NextRun | None
) -> tuple[RunState, list[Message] | None]:
    """`_begin`, no other run of ``engine`` beginning and none in progress."""
    claim_store(engine)
    try:
        engine._vet_history()
        catch_up_session(engine)
        starts, injected = _first_turn(engine, prompt)
        controller = waited.controller if waited is not None else run_controller(engine)
    except BaseException:  # refused: the store is free again
        release_store(engine)
        raise
    st = RunState(controller, asyncio.current_task(), engine.options.tool_cancel_grace)
    st.token = token
    st.injected = injected
    if waited is not None and waited.closed:  # aclose() from another task while it waited
        st.finishing = True
    if engine._start_pending is not None:  # a background child's run: its parent's abort may have come first
        early = take_abort_at_start(engine)
        if early is not None:
            st.controller.abort(early)
    engine._state = st
    early = _take_fresh_abort(engine, token)  # an interrupt() between run() and this first step
    if early is not None:
        st.controller.abort(early)
    if engine.policies:
        forks = claim(engine.policies, engine)
        if forks:  # copies of policies another engine's run holds: they catch up on this transcript
            catch_up_policies(engine, forks)
    engine._closing = st.loop.create_future()
    if engine.options.deadline is not None:
        st.deadline_handle = st.loop.call_later(engine.options.deadline, deadline_passed, st)
    # A listener raising in the run's own task (a policy hook or an abort hook aborting the
    # host's own signal) is logged without the engine's credentials, as in its tool calls.
    st.leave = enter_run(st.signal._secrets or engine_secrets(engine))  # the run controller's own
    return st, starts


def start_turn(
    engine: QueryEngine, st: RunState, starts: list[Message], queued: int, stopped: bool
) -> TurnStarted:
    """Begin a turn with ``starts``, whose first ``queued`` messages come from the inbox
    (``stopped``: the spent turn's signal had aborted when the inbox was read)."""
    # The first turn uses the run's controller; a later one (send-now, follow-up) gets a fresh one.
    spent = st.signal
    st.new_turn(run_controller(engine) if st.turn_index else None)
    if spent is not st.signal and not stopped and spent.reason not in (None, "send_now"):
        # interrupt() from another thread found the spent turn still in place, after the inbox
        # was read: the stop was meant for this turn. (A send_now's stop never is: it stops the
        # turn it interrupted, and the text it queued starts a turn of its own.)
        st.controller.abort(spent.reason)
    held, st.stop_next = st.stop_next, None
    if held is not None:  # interrupt() after the send_now that stopped the spent turn: "stop" came last
        st.controller.abort(held)
    engine.last_turn_ended = None  # until this turn ends: a turn its host stops iterating leaves none
    for message in starts:
        engine._commit(message)
    if st.injected is not None:  # the interjections queued before the run: the loop yields it next
        engine._record_event(st.injected)
    # A prompt the host marked synthetic (an automatic "continue") is no person's, as in a resume.
    real_user = any(map(_by_person, starts)) or _unanswered_person(engine.messages)
    notify(engine.policies, "begin_turn", engine=engine, real_user=real_user)
    ids = tuple(r for m in starts[:queued] for r in _receipts(m))
    return TurnStarted(turn=st.turn_index, prompt=starts[-1] if starts else None, ids=ids)


def _receipt_meta(q: Queued) -> dict[str, object]:
    """Where a queued text's message keeps its receipt: an interjection's under "receipts", as
    in the envelope (its delivery is its InterjectionInjected), another's under "receipt"."""
    return {"receipts": [q.id]} if q.idle else {"receipt": q.id}  # only an interjection is marked idle


def _receipts(message: Message) -> list[str]:
    """The receipt ids of the queued texts ``message`` delivers (one, or an envelope's several)."""
    one = message.meta.get("receipt")
    return [one] if one is not None else list(message.meta.get("receipts", ()))


def next_turn(engine: QueryEngine, st: RunState, stopped: bool) -> list[Message] | None:
    """The next turn's messages, if this run goes on (read again after the host saw TurnEnded).

    A send-now text always goes on, until the deadline; follow-ups, and interjections sent
    while the host held the last events (a new turn with no prompt delivers them), only after a
    turn that completed with no abort: an interrupt while the host held the turn's last events
    (or between turns) means "stop", so they stay queued for the next run. ``stopped``: the
    turn's signal has aborted.
    """
    if st.expired or st.finishing:  # the deadline passed, or aclose() from another task
        return None
    follow_ups = st.last_reason == "completed" and not stopped
    starts = _take_starts(engine, follow_ups=follow_ups)
    if not starts and follow_ups and engine.inbox.interjections:
        return []
    return starts or None


def _user(engine: QueryEngine, text: str, wrap: bool, **fields: object) -> Message:
    """A user message of ``text``; ``wrap``: in the interrupt envelope."""
    if wrap:
        text = envelope(engine.options.texts.interrupt_envelope, [text])
    return Message.user(text, **fields)


def refuse_prompt(prompt: object) -> None:
    """What ``run(prompt)`` refuses whatever the engine's state: raised by `run()` itself, before
    any iteration, so that a host can answer it before it starts streaming."""
    if isinstance(prompt, str):
        if not prompt.strip():  # it would be a blank user message, which providers refuse
            raise ValueError("run() needs a prompt with text in it (or None, to resume)")
    elif isinstance(prompt, Message):
        if prompt.role != "user":
            raise ValueError("run() takes a user message as its prompt")
    elif prompt is not None:
        raise TypeError(f"run() takes a str or a Message, not {type(prompt).__name__}")


def _first_turn(
    engine: QueryEngine, prompt: str | Message | None
) -> tuple[list[Message], InterjectionInjected | None]:
    """The first turn's messages: what was queued before the run (see `_queued_first`), then
    ``prompt``; without one, what was queued (follow-ups among it), or [] to resume; and the
    receipt of the interjections among them. Raises ValueError or TypeError for a prompt it
    cannot send, ValueError when there is nothing to run."""
    if isinstance(prompt, Message):  # refused by run() unless a user message (`refuse_prompt`)
        return _queued_first(engine, _vetted_prompt(encodable_message(prompt)), follow_ups=False)
    if isinstance(prompt, str):
        return _queued_first(engine, [Message.user(scrub(prompt))], follow_ups=False)
    queued, injected = _queued_first(engine, [], follow_ups=True)
    if queued:
        return queued, injected
    last = engine.messages[-1] if engine.messages else None
    if engine.inbox.interjections or (last is not None and (last.role == "user" or is_paused(last))):
        return [], None  # resume: the transcript (or the queue) holds the input, or a paused turn goes on
    if last is None:
        raise ValueError("run() needs a prompt: the transcript is empty, so there is nothing to go on from")
    raise ValueError(
        "run() needs a prompt: the transcript does not end with a user message but with the model's "
        "response (run() with no prompt goes on from a user message, or from a paused response)"
    )


def _queued_first(
    engine: QueryEngine, given: list[Message], *, follow_ups: bool
) -> tuple[list[Message], InterjectionInjected | None]:
    """``given`` after the texts queued before the run, which were typed first: interjections an
    earlier run left queued (sent while the model worked: in their envelope), then the texts sent
    while the engine was idle (send-now texts, else, with ``follow_ups``, the follow-ups; and
    interjections, nothing being at work to interject in) as the user's own messages, in the
    order sent. The first of those, or ``given``, goes in the interrupt envelope when due.
    Interjections sent after ``run(prompt)`` was called stay queued, to follow the prompt."""
    inbox = engine.inbox
    items = inbox.take(inbox.send_now)
    if any(q.late for q in items):  # sent after run(prompt) was called: they start the next turn
        inbox.send_now[:0] = [q for q in items if q.late]
        items = [q for q in items if not q.late]
    if not items and follow_ups:
        items = inbox.take(inbox.follow_ups)
    steered = inbox.take(inbox.interjections)
    late = [q for q in steered if q.late]
    if late:  # typed after the prompt: merged at the first safe point, after it
        inbox.interjections[:0] = late  # ahead of any queued since the take (one atomic step)
        steered = [q for q in steered if not q.late]
    earlier = [q for q in steered if not q.idle]
    typed = sorted([*items, *(q for q in steered if q.idle)], key=lambda q: q.n)
    own = [Message.user(q.text, meta=_receipt_meta(q)) for q in typed]  # texts scrubbed when queued
    own += given
    if own and envelope_due(engine):
        own[0] = _in_envelope(engine, own[0])
    if not steered:
        return own, None
    injected = InterjectionInjected(texts=tuple(q.text for q in steered), ids=tuple(q.id for q in steered))
    return ([interjection_message(engine, earlier)] if earlier else []) + own, injected


def _vetted_prompt(prompt: Message) -> list[Message]:
    """A prompt message as ``messages.append(prompt); run()`` would send it: one that breaks a
    rule (a blank text block, a result: the transcript it follows owes none) is repaired, with
    the same warning; one left with nothing to send is refused, as a blank text is."""
    if is_valid([prompt]):
        return [prompt]
    repaired = valid_history([prompt], "the prompt given to run()")
    if not repaired:
        raise ValueError("run() needs a prompt with text in it (or None, to resume)")
    return repaired


def _in_envelope(engine: QueryEngine, message: Message) -> Message:
    """``message`` (a vetted prompt: text only) in the interrupt envelope, its metadata kept."""
    text = "\n\n".join(b.text for b in message.content if isinstance(b, TextBlock))
    wrapped = envelope(engine.options.texts.interrupt_envelope, [text])
    return message.model_copy(update={"content": [TextBlock(text=wrapped)]})


def _take_starts(engine: QueryEngine, *, follow_ups: bool) -> list[Message]:
    """The queued texts that start a turn, as messages: the send-now texts, else (when
    ``follow_ups``) the follow-ups."""
    inbox = engine.inbox
    items = inbox.take(inbox.send_now)
    if not items and follow_ups:
        items = inbox.take(inbox.follow_ups)
    wrap = envelope_due(engine)  # the first text only: it follows the cut answer
    return [_user(engine, q.text, wrap and i == 0, meta={"receipt": q.id}) for i, q in enumerate(items)]


def catch_up_policies(engine: QueryEngine, policies: Sequence[Policy] | None = None) -> None:
    """A new engine over a saved transcript (a headless worker resuming its session after a
    restart): its policies are shown what the model did since the last request a person made,
    as if they had watched it, their verdicts dropped (the nudges they would give are in the
    transcript already). So a run that adds nothing gets no fresh allowance after
    ``stationarity_ended``, as a run again on the same engine gets none; a run that brings a
    person's message resets the counts at its ``begin_turn`` as always. ``policies``: only
    these (the forks a run starting takes of policies another engine's run holds)."""
    policies = engine.policies if policies is None else policies
    messages = engine.messages
    start = next((i + 1 for i in range(len(messages) - 1, -1, -1) if _by_person(messages[i])), 0)
    for i in range(start, len(messages)):
        message = messages[i]
        if message.role != "assistant":
            continue
        ask(policies, "on_response", message, engine=engine)
        uses = message.tool_uses
        if uses and i + 1 < len(messages):
            given = {r.tool_use_id: r for r in messages[i + 1].tool_results}
            results = [given.get(u.id) for u in uses]
            if all(r is not None for r in results):
                ask(policies, "on_results", message, results, engine=engine)


def _by_person(message: Message) -> bool:
    """A request a person made: their own message, or an interjection the library wrapped."""
    if message.role != "user" or (message.synthetic and message.kind != "interjection"):
        return False
    return not any(b.type == "tool_result" for b in message.content)


def _unanswered_person(messages: list[Message]) -> bool:
    """True when the transcript ends with a message a person wrote (a host appended it itself).

    A resume that adds nothing (the transcript ends with tool results, say) is not a new request
    from anyone: it keeps the policies' counts, so a host that runs again after
    ``stationarity_ended`` does not hand the loop a fresh allowance. Queued interjections are
    a person's words too (merging them calls ``begin_turn`` itself, and a transcript that ends
    with one is a request not answered yet)."""
    return bool(messages) and _by_person(messages[-1])


def deadline_passed(st: RunState) -> None:
    """The run's ``deadline`` timer, or the clock read before a request: the run expires,
    aborted with "deadline"."""
    st.expired = True
    if st.deadline_handle is not None:  # when the clock was read first: the timer has nothing left to do
        st.deadline_handle.cancel()
    st.controller.abort("deadline")
