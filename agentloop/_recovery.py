"""The doom-loop recovery reminder sent with a resample request.

It goes with the retry request only: the transcript never keeps the reminder,
the replay or the cut attempt. When the failed attempt made no tool calls, its
reasoning and text are replayed, cut to 8 KB and 4 KB (UTF-8 bytes, never
splitting a character), so the model can continue instead of starting over.
"""

from __future__ import annotations

from ._accumulate import Accumulator
from ._inbox import Texts
from ._messages import Message
from ._policy import Resample
from ._unicode import scrub

__all__ = ["REPLAY_TEXT_BYTES", "REPLAY_THINKING_BYTES", "doom_reminder", "truncate_utf8"]

REPLAY_THINKING_BYTES = 8 * 1024
REPLAY_TEXT_BYTES = 4 * 1024


def truncate_utf8(text: str, limit: int) -> str:
    """The longest prefix of ``text`` whose UTF-8 encoding fits in ``limit`` bytes."""
    data = text.encode("utf-8")
    if len(data) <= limit:
        return text
    return data[:limit].decode("utf-8", "ignore")


def doom_reminder(texts: Texts, acc: Accumulator, verdict: Resample) -> Message:
    """The synthetic user message appended to the resample request."""
    parts = [verdict.reminder or texts.doom_reminder]
    if verdict.signals:
        parts.append("Signals: " + ", ".join(str(s) for s in verdict.signals))
    if acc.tool_calls == 0 and verdict.replay:
        # The cut attempt's deltas as they streamed: a lone surrogate in them is replaced, as it
        # is in a committed message, or the replay could not be cut (nor sent) as UTF-8.
        thinking = truncate_utf8(scrub(acc.thinking_text()), REPLAY_THINKING_BYTES)
        text = truncate_utf8(scrub(acc.text()), REPLAY_TEXT_BYTES)
        if thinking:
            parts.append(f"Your discarded reasoning began:\n<previous_reasoning>\n{thinking}\n</previous_reasoning>")
        if text:
            parts.append(f"Your discarded answer began:\n<previous_text>\n{text}\n</previous_text>")
    return Message.user("\n\n".join(parts), synthetic=True, kind="doom_reminder")
