"""The host's inbox: interjections, follow-ups and send-now messages.

All three queues are fed from any thread (`QueryEngine.interject` and friends
are plain sync calls) and drained by the loop at its safe points. Each queued
text gets a receipt id, returned to the caller and repeated in the event that
reports its delivery or its drop, so a host can always tell what happened.
"""

from __future__ import annotations

import itertools
import re
import secrets
from dataclasses import dataclass, fields, replace

from ._unicode import scrub

__all__ = ["Inbox", "Queued", "Texts", "escape_envelope", "told_for"]


@dataclass(frozen=True, slots=True)
class Queued:
    id: str
    text: str
    n: int = 0  # when it was queued: receipts of all three queues are counted together
    idle: bool = False  # queued while no run was going
    late: bool = False  # queued after run(prompt) was called, before that run began


@dataclass(frozen=True, slots=True)
class Texts:
    """Every text the library writes into a transcript; override any of them.

    ``never_started`` and ``stopped_running``: the results synthesized after an abort for a
    call that never started, and for one stopped while it ran (after the run's deadline, or
    the host's code that stopped reading the run, the "Interrupted by user" they open with
    goes on to say which: "Interrupted by user-set deadline (...)", "Interrupted by user code
    (...)"). ``interrupt_notice``: the user
    message that records an interrupt (``QueryEngine(interrupt_notice="append")``);
    ``interrupt_envelope``: the line the next prompt is wrapped under instead (``"envelope"``).
    ``interjection_intro`` and ``interjection_reminder``: the lines before and after the
    texts of an interjection. ``doom_reminder``: the reminder a resample after a doom loop
    sends. ``result_cut``: put where a tool result over ``max_tool_result_chars`` was cut
    (``{cut}`` and ``{total}``: the characters cut, and those of the whole result).
    ``input_updated``: put before the result of a call that ran with the input a permission
    callback gave it (``{input}``: that input as JSON).
    """

    never_started: str = "Interrupted by user: this tool call never started, so it had no effect."
    stopped_running: str = (
        "Interrupted by user: this tool call was stopped while it was running; "
        "it may have had side effects."
    )
    interrupt_notice: str = "[Request interrupted by user]"
    interrupt_envelope: str = "The user interrupted the previous turn:"
    interjection_intro: str = "The user sent a message while you were working:"
    interjection_reminder: str = (
        "Take this into account, and do not drop the work you were doing unless the "
        "message asks you to: finish or adjust the unfinished steps."
    )
    doom_reminder: str = (
        "Your previous output was judged to be a repetition loop and was discarded. "
        "Do not repeat it: take a different approach, be concise, and move the task forward."
    )
    #: Put where a tool result over ``max_tool_result_chars`` was cut; ``{cut}`` and
    #: ``{total}`` become the numbers of characters cut and of the whole result.
    result_cut: str = "[... {cut} of the {total} characters of this tool result were cut here ...]"
    #: Put before the result of a call that ran with the input a permission callback gave it
    #: (``Allow(updated_input=...)``) instead of the model's; ``{input}`` becomes that input as JSON.
    input_updated: str = "The permission check changed this call's input; it ran with this input instead: {input}"

    def __post_init__(self) -> None:
        """Raises TypeError for a text that is not a str, and ValueError for a blank
        ``interrupt_notice`` or ``doom_reminder`` (each a user message, or its start, which
        providers refuse blank): either would fail only when written, in the middle of a run.
        A lone UTF-16 surrogate (a text read with ``surrogateescape``) becomes U+FFFD, as in
        the host's other text: these go into the transcript."""
        for f in fields(self):
            value = getattr(self, f.name)
            if not isinstance(value, str):
                hint = _NO_NOTICE_HINT if f.name == "interrupt_notice" else ""
                raise TypeError(f"Texts.{f.name} takes a str, not {value!r}{hint}")
            object.__setattr__(self, f.name, scrub(value))  # frozen: set as __init__ does
        if not self.interrupt_notice.strip():
            raise ValueError(f"Texts.interrupt_notice needs text in it: it is a user message of its own{_NO_NOTICE_HINT}")
        if not self.doom_reminder.strip():
            raise ValueError(
                "Texts.doom_reminder needs text in it: it opens the resample's user message, which is "
                "blank without it when nothing is replayed"
            )


_NO_NOTICE_HINT = "; to write no notice, pass QueryEngine(interrupt_notice=None)"

#: The abort reasons of interrupts no person asked for at that moment, and what interrupted: the
#: run's own deadline, and the host's code that stopped iterating the run. Each keeps the opening
#: "Interrupted by user" (SPEC section 3) and says whose setting or code it was. Any other reason
#: is the user's (Ctrl-C, send-now, a host's own reason, which is treated like "cancel").
_NOT_THE_USER = {
    "deadline": "by user-set deadline (the run's deadline passed)",
    "consumer_closed": "by user code (the application stopped reading the run)",
}
_USER_WORDS = "Interrupted by user"  # the opening of the stock results: "Interrupted by user: ..."


def told_for(text: str, reason: str | None) -> str:
    """``text`` (one of the `Texts` written for an interrupted call) true to ``reason``, the
    abort's: for an interrupt no person asked for (the run's deadline, the host's code that
    stopped reading the run) the words "Interrupted by user" it opens with go on to say what
    interrupted ("Interrupted by user-set deadline (...)"), so the text still begins
    "Interrupted by user". A text that does not open with those words as a whole (the host's
    own, "Uninterrupted ...", "Interrupted by users' ...") is kept as written."""
    why = _NOT_THE_USER.get(reason) if reason is not None else None
    if why is None or not text.startswith(_USER_WORDS):
        return text
    rest = text[len(_USER_WORDS) :]
    if rest[:1].isalnum() or rest[:1] in "_'-":
        return text  # a longer word ("Interrupted by username"): not the stock opening
    return f"Interrupted {why}{rest}"


_TAG = re.compile(r"<(?=\s*/?\s*user_query)", re.IGNORECASE)


def escape_envelope(text: str) -> str:
    """Neutralise anything in ``text`` that could open or close a ``<user_query>`` tag."""
    return _TAG.sub("&lt;", text)


def envelope(intro: str, texts: list[str], outro: str | None = None) -> str:
    """``intro``, each text inside its own ``<user_query>`` tag, then ``outro``."""
    parts = [intro]
    parts += [f"<user_query>\n{escape_envelope(t)}\n</user_query>" for t in texts]
    if outro:
        parts.append(outro)
    return "\n".join(parts)


class Inbox:
    """Three thread-safe FIFO queues with receipt ids (the loop polls them at its safe points).

    No lock: a signal handler runs on the thread it interrupts, which may be the loop's own,
    in the middle of a `take`; with a lock held there, a control call from the handler would
    wait for it forever. ``list.append``, a slice copy and a slice deletion are each atomic, and
    so is drawing the next id; the engine's run is the one taker, so a text queued at any instant
    is either taken or left for the next take. (Lists, not deques: an empty deque holds a
    half-kilobyte block, and every engine has three queues.)
    """

    def __init__(self) -> None:
        self._ids = itertools.count(1)
        # Receipts outlive the engine in a session file: one resumed by a new engine (another
        # process, a server's next request) must not hand out the ids the file already holds.
        # Made at the first receipt: most engines never give one.
        self._tag: str | None = None
        self.interjections: list[Queued] = []
        self.follow_ups: list[Queued] = []
        self.send_now: list[Queued] = []

    def put(self, queue: list[Queued], text: str, prefix: str, *, idle: bool = False, late: bool = False) -> str:
        if not isinstance(text, str):
            raise TypeError(f"expected a str, got {type(text).__name__}")
        if not text.strip():
            # A turn would start with a blank user message, which providers refuse; an
            # interjection would be an empty envelope, which says nothing to the model.
            raise ValueError("a message for the model needs text in it (this one is blank)")
        text = scrub(text)  # a lone UTF-16 surrogate could never be sent (see agentloop._unicode)
        tag = self._tag
        if tag is None:
            # Two first receipts at once may each make a tag: both are fresh, and the count
            # they share keeps every id distinct.
            tag = self._tag = secrets.token_hex(4)
        n = next(self._ids)
        receipt = f"{prefix}-{tag}-{n}"
        queue.append(Queued(receipt, text, n, idle, late))
        return receipt

    def forget_late(self) -> None:
        """The run that send-now texts were sent after was dropped before it began: they are
        texts sent while idle, for the next run."""
        queue = self.send_now
        n = len(queue)
        items = queue[:n]
        if any(q.late for q in items):
            # Only the first ``n`` are replaced: a text queued meanwhile (another thread) stays.
            queue[:n] = [replace(q, late=False) for q in items]

    def take(self, queue: list[Queued]) -> list[Queued]:
        """Remove and return everything in ``queue`` (oldest first); a text queued meanwhile
        is either among them or left for the next take."""
        if not queue:
            return []
        n = len(queue)
        items = queue[:n]
        del queue[:n]  # a text appended since the copy sits after them, and stays
        return items
