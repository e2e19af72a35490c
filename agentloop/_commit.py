"""Everything that writes to the transcript on the loop's behalf.

Each function leaves ``engine.messages`` valid (SPEC §3) and is synchronous, so
it can run from a finalizer (a host that stopped iterating) as well as from
the loop.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from ._events import Event, InterjectionInjected, PolicyNudge, TerminalReason, ToolCallFinished
from ._inbox import envelope
from ._messages import Message, TextBlock, message
from ._run import RunState
from ._transcript import clean_assistant, interrupted_result

if TYPE_CHECKING:
    from ._engine import QueryEngine

_NO_NOTICE = frozenset({"send_now", "consumer_closed", "deadline"})


def abort_terminal(st: RunState) -> TerminalReason:
    if st.signal.reason == "deadline":
        return "deadline"
    return "aborted_tools" if st.phase == "tools" else "aborted_streaming"


def settle_partial(engine: QueryEngine, st: RunState) -> None:
    """Commit what the current attempt streamed, marked partial (sync)."""
    acc = st.acc
    st.acc = None
    if acc is None or acc.empty:
        return
    message = clean_assistant(acc.message(partial=True))
    if message is None:
        return
    engine._commit(message)
    st.owed = message.tool_uses  # completed calls in a cut response never started


def settle_results(engine: QueryEngine, st: RunState, not_run: str | None = None) -> list[Event]:
    """Commit the results owed to the last assistant message, synthesizing missing ones (sync)."""
    if not st.owed:
        return []
    texts = engine.options.texts
    blocks = []
    events: list[Event] = []
    for use in st.owed:
        result = st.results.get(use.id)
        if result is None:
            text = not_run or (texts.stopped_running if use.id in st.started else texts.never_started)
            result = interrupted_result(use.id, text)
            events.append(ToolCallFinished(tool_use=use, result=result, synthetic=True))
        blocks.append(result)
    st.last_results = {b.tool_use_id: b for b in blocks}
    st.owed, st.results = [], {}
    engine._commit(message("user", list(blocks), synthetic=True, kind="tool_results"))
    return events


def strip_final(engine: QueryEngine) -> None:
    """The final assistant message may not end with whitespace (Anthropic rejects it)."""
    messages = engine.messages
    while messages and messages[-1].role == "assistant":
        last = messages[-1]
        block = last.content[-1]
        if block.type != "text" or block.text == block.text.rstrip():
            return
        content = [*last.content[:-1]]
        if block.text.strip():
            content.append(TextBlock(text=block.text.rstrip()))
        if content:
            messages[-1] = last.model_copy(update={"content": content})
            return
        messages.pop()


def drain_interjections(engine: QueryEngine, st: RunState) -> list[Event]:
    items = engine.inbox.take(engine.inbox.interjections)
    if not items:
        return []
    texts = engine.options.texts
    body = envelope(texts.interjection_intro, [q.text for q in items], texts.interjection_reminder)
    engine._commit(Message.user(body, synthetic=True, kind="interjection", meta={"receipts": [q.id for q in items]}))
    for policy in engine.policies:
        policy.begin_turn(real_user=True)
    event = InterjectionInjected(texts=tuple(q.text for q in items), ids=tuple(q.id for q in items))
    engine._record_event(event)
    return [event]


def flush_nudges(engine: QueryEngine, st: RunState) -> list[Event]:
    events: list[Event] = []
    for policy, nudge in st.nudges:
        engine._commit(Message.user(nudge.reminder, synthetic=True, kind="nudge", meta={"policy": policy}))
        events.append(PolicyNudge(policy=policy, reminder=nudge.reminder))
    st.nudges = []
    return events


def interrupt_notice(engine: QueryEngine, reason: TerminalReason, abort_reason: str) -> None:
    mode = engine.options.interrupt_notice
    if abort_reason in _NO_NOTICE or mode is None:
        return
    if mode == "append":
        engine._commit(Message.user(engine.options.texts.interrupt_notice, synthetic=True, kind="interrupt_notice"))
        return
    last = engine.messages[-1] if engine.messages else None
    if reason == "aborted_streaming" and last is not None and last.role == "assistant" and last.partial:
        engine._wrap_next = True  # grok's way: only truncated text, no dangling call
