"""Everything that writes to the transcript on the loop's behalf.

Each function leaves ``engine.messages`` valid (SPEC §3) and is synchronous, so
it can run from a finalizer (a host that stopped iterating) as well as from
the loop.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from ._events import Event, InterjectionInjected, PolicyNudge, TerminalReason, ToolCallFinished
from ._inbox import Queued, envelope, told_for
from ._messages import Block, Message, TextBlock, ToolResultBlock, ToolUseBlock, message
from ._policy import notify
from ._repair import unused_id
from ._run import RunState
from ._tools import input_noted
from ._transcript import interrupted_result

if TYPE_CHECKING:
    from ._engine import QueryEngine

_NO_NOTICE = frozenset({"send_now", "consumer_closed", "deadline"})


def abort_terminal(st: RunState) -> TerminalReason:
    if st.signal.reason == "deadline":
        return "deadline"
    return "aborted_tools" if st.phase == "tools" else "aborted_streaming"


def paused(message: Message) -> Message:
    """``message``, a response the server paused (stop reason ``"pause_turn"``), marked so in its
    ``meta`` (``"stop_reason": "pause_turn"``): kept with it, and in a session file, the mark lets
    a run with no prompt go on from it, in this engine or in one built later (`is_paused`)."""
    return message.model_copy(update={"meta": {**message.meta, "stop_reason": "pause_turn"}})


def refused(message: Message) -> Message:
    """``message``, a response a refusal stopped (stop reason ``"refusal"``: Anthropic's streaming
    classifiers, a content filter), marked so in its ``meta`` (``"stop_reason": "refusal"``):
    kept with it, and in a session file, the mark lets a provider leave the refused turn out of
    later requests (Anthropic asks for that)."""
    return message.model_copy(update={"meta": {**message.meta, "stop_reason": "refusal"}})


def is_paused(message: Message) -> bool:
    """Whether ``message`` is a response the server paused, which a request of the transcript as
    it is lets go on (see `paused`)."""
    return message.role == "assistant" and message.meta.get("stop_reason") == "pause_turn"


def commit_response(engine: QueryEngine, message: Message) -> tuple[Message, list[ToolUseBlock]]:
    """Commit a streamed assistant message; returns it as committed, and its tool calls (what
    ``message.tool_uses`` would list, without reading the blocks again).

    A tool call the provider sent without an id, or with one the transcript already holds (some
    servers number their calls afresh in every response), gets a fresh id: providers reject a
    transcript whose ids are missing or repeated, and results are paired by id.
    """
    calls: list[ToolUseBlock] = []
    for block in message.content:
        if block.type == "tool_use":
            ids = engine._tool_ids
            if ids is None:  # made at the first tool call: most engines never need one
                ids = engine._tool_ids = ToolIds()
            message, calls = ids.claim(message, engine.messages)
            break
    engine._commit(message)
    return message, calls


class ToolIds:
    """The tool_use ids of one transcript, brought up to date as it grows."""

    __slots__ = ("_ids", "_last", "_of", "_upto")

    def __init__(self) -> None:
        self._ids: set[str] = set()
        self._of: list[Message] | None = None
        self._upto = 0  # messages of ``_of`` already read
        self._last: Message | None = None  # the message read last, at ``_upto - 1``

    def claim(self, message: Message, transcript: list[Message]) -> tuple[Message, list[ToolUseBlock]]:
        """``message`` with every tool_use id unique in ``transcript``, and its tool_use blocks;
        records their ids.

        The caller appends the message to ``transcript`` next, so it is not read again (were it
        not appended, the next claim would find the list shorter than read and read it all).
        """
        end = len(transcript)
        upto = self._upto
        if upto != end or self._stale(transcript):  # what was committed since: in a loop, one message of results
            self._read(transcript, end)
        self._upto = end + 1
        ids = self._ids
        calls: list[ToolUseBlock] = []
        for i, block in enumerate(message.content):
            if block.type == "tool_use":
                key = block.id  # read once: a pydantic model's fields go through its __getattr__ hook
                if not key or key in ids:
                    message = self._renamed(message, i)
                    calls = message.tool_uses
                    break
                ids.add(key)
                calls.append(block)
        self._last = message
        return message, calls

    def _stale(self, transcript: list[Message]) -> bool:
        """True if ``transcript`` is not the list read so far: another list, or this one rewritten
        in place by the host between runs (``messages[:] = ...``, ``clear()`` then ``extend()``)."""
        upto = self._upto
        return transcript is not self._of or (upto > 0 and transcript[upto - 1] is not self._last)

    def _read(self, transcript: list[Message], end: int) -> None:
        upto = self._upto
        if upto > end or self._stale(transcript):  # a new, shortened or rewritten list: read it all
            self._ids.clear()
            self._of, upto = transcript, 0
        add = self._ids.add
        for seen in transcript[upto:end]:
            if seen.role == "assistant":
                for block in seen.content:
                    if block.type == "tool_use":
                        add(block.id)

    def _renamed(self, message: Message, first: int) -> Message:
        ids = self._ids
        content = list(message.content)
        for i in range(first, len(content)):
            block = content[i]
            if block.type != "tool_use":
                continue
            if block.id and block.id not in ids:
                ids.add(block.id)
                continue
            fresh = unused_id(block.id, ids)
            ids.add(fresh)
            content[i] = block.model_copy(update={"id": fresh})
        return message.model_copy(update={"content": content})


def settle_partial(engine: QueryEngine, st: RunState) -> None:
    """Commit what the current attempt streamed, marked partial (sync)."""
    acc = st.acc
    st.acc = None
    if acc is None or acc.empty:
        return
    message = acc.committable(partial=True)
    if message is None:
        return
    reason = st.signal.reason
    if reason is not None:
        # Kept with the message (and in a session file): whether the next user message is
        # wrapped in the interrupt envelope follows from the transcript, whichever engine runs next.
        message = message.model_copy(update={"meta": {**message.meta, "abort_reason": reason}})
    _, st.owed = commit_response(engine, message)  # completed calls in a cut response never started


def ran_with(st: RunState, use_id: str) -> dict[str, Any] | None:
    """The input a started call ran with when the permission callback replaced the model's
    (``Allow(updated_input=...)``), else None."""
    runner = st.runner
    if runner is None or not runner.updated or use_id not in st.started:
        return None
    return runner.updated.get(use_id)


def noted(engine: QueryEngine, result: ToolResultBlock, updated: dict[str, Any] | None) -> ToolResultBlock:
    """``result``, told to the model as that of a call that ran with ``updated`` (when not None)."""
    return result if updated is None else input_noted(result, updated, engine.options.texts.input_updated)


def settle_results(engine: QueryEngine, st: RunState, not_run: str | None = None) -> list[Event]:
    """Commit the results owed to the last assistant message, synthesizing missing ones (sync)."""
    if not st.owed:
        return []
    texts = engine.options.texts
    blocks: list[Block] = []
    last = st.last_results = {}
    events: list[Event] = []
    for use in st.owed:
        result = st.results.get(use.id)
        if result is None:
            text = not_run or told_for(
                texts.stopped_running if use.id in st.started else texts.never_started, st.signal.reason
            )
            updated = ran_with(st, use.id)
            result = noted(engine, interrupted_result(use.id, text), updated)
            events.append(ToolCallFinished(tool_use=use, result=result, synthetic=True, updated_input=updated))
        blocks.append(result)
        last[result.tool_use_id] = result
    st.owed, st.results = [], {}
    engine._commit(message("user", blocks, synthetic=True, kind="tool_results"))
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


def interjection_message(engine: QueryEngine, items: list[Queued]) -> Message:
    """Interjections sent while the model worked, as the one message that tells it so."""
    texts = engine.options.texts
    body = envelope(texts.interjection_intro, [q.text for q in items], texts.interjection_reminder)
    return Message.user(body, synthetic=True, kind="interjection", meta={"receipts": [q.id for q in items]})


def drain_interjections(engine: QueryEngine, st: RunState) -> list[Event]:
    items = engine.inbox.take(engine.inbox.interjections)
    if not items:
        return []
    engine._commit(interjection_message(engine, items))
    notify(engine.policies, "begin_turn", engine=engine, real_user=True)
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
    # "envelope" (grok's way) writes nothing now: the next user message is wrapped (envelope_due).


def envelope_due(engine: QueryEngine) -> bool:
    """True when the next user message goes in the interrupt envelope: the transcript ends with
    assistant text an interrupt cut (no dangling call), as a partial message records it."""
    if engine.options.interrupt_notice != "envelope" or not engine.messages:
        return False
    last = engine.messages[-1]
    reason = last.meta.get("abort_reason") if last.role == "assistant" and last.partial else None
    return isinstance(reason, str) and reason not in _NO_NOTICE
