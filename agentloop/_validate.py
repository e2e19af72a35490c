"""Checking a transcript against the rules (`agentloop._transcript`): `validate_transcript`
says what is wrong, line by line; `is_valid` says only whether anything is, at a fraction
of the cost (the engine asks it before every run, the session loader on every load).
"""

from __future__ import annotations

from collections.abc import Sequence

from ._messages import Message, ToolResultBlock, ToolUseBlock
from ._transcript import as_messages, droppable, ends_with_space, misplaced, unencodable
from ._unicode import has_surrogates

__all__ = ["is_valid", "validate_transcript"]


def validate_transcript(messages: Sequence[Message]) -> list[str]:
    """Return one line per rule violation; an empty list means the transcript is valid.

    Never raises: what is not a list of well-formed `Message` objects is reported instead,
    one line per bad entry, and not checked against the rules."""
    messages, malformed = as_messages(messages)
    if malformed:
        return malformed
    out: list[str] = []
    seen_use: set[str] = set()
    seen_result: set[str] = set()
    expected: dict[str, str] = {}  # tool_use id -> name, owed by the next message
    owed_at = -1
    for i, msg in enumerate(messages):
        where = f"messages[{i}] ({msg.role})"
        if not msg.content:
            out.append(f"{where}: empty message")
        for block in msg.content:
            out.extend(f"{where}: {why}" for why in (droppable(block), misplaced(block, msg.role)) if why is not None)
            if unencodable(block):
                out.append(f"{where}: {block.type} block holds text UTF-8 cannot encode (a lone UTF-16 surrogate)")
        if expected:
            out.extend(_check_answer(messages, i, owed_at, expected, seen_result))
            expected = {}
        else:
            out.extend(
                f"{where}: tool_result for {block.tool_use_id!r} has no tool_use in the message just before it"
                for block in msg.content
                if isinstance(block, ToolResultBlock) and msg.role == "user"
            )
        if msg.role == "assistant":
            for block in msg.content:
                if isinstance(block, ToolUseBlock):
                    if not block.id:
                        out.append(f"{where}: tool_use ({block.name}) without an id")
                    elif block.id in seen_use:
                        out.append(f"{where}: duplicate tool_use id {block.id!r}")
                    seen_use.add(block.id)
                    if block.complete:  # an incomplete call is dropped, not answered
                        expected[block.id] = block.name
            owed_at = i
    for tid, name in expected.items():
        out.append(
            f"messages[{owed_at}] (assistant): tool_use {tid!r} ({name}) has no tool_result "
            "(the transcript ends after it)"
        )
    if messages and messages[-1].role == "assistant" and ends_with_space(messages[-1]):
        out.append(f"messages[{len(messages) - 1}] (assistant): final assistant message ends with whitespace")
    return out


def is_valid(messages: Sequence[Message]) -> bool:
    """True exactly when `validate_transcript` would report nothing, without writing its lines
    (a property test holds the two together): one pass, stopping at the first violation."""
    seen_use: set[str] = set()
    seen_result: set[str] = set()
    owed: set[str] | None = None  # the ids the message must answer: the calls just before it
    for msg in messages:
        content = msg.content
        if not content:
            return False
        user = msg.role == "user"
        calls: set[str] | None = None
        answered = 0
        leading = True
        for block in content:
            if block.type == "text":
                text = block.text
                if not text or text.isspace() or has_surrogates(text):
                    return False
                leading = False
                continue
            if block.type == "tool_result":
                tid = block.tool_use_id
                if not user or not leading or owed is None or tid not in owed or tid in seen_result:
                    return False
                seen_result.add(tid)
                answered += 1
            elif block.type == "tool_use":
                tid = block.id
                if user or not block.complete or not tid or tid in seen_use:
                    return False
                seen_use.add(tid)
                if calls is None:
                    calls = set()
                calls.add(tid)
                leading = False
            else:  # thinking, redacted thinking, a provider's block
                if user or (block.type == "thinking" and not block.signature):
                    return False
                leading = False
            if unencodable(block):
                return False
        if owed is not None and answered != len(owed):
            return False
        owed = calls
    if owed:
        return False
    return not (messages and messages[-1].role == "assistant" and ends_with_space(messages[-1]))


def _check_answer(
    messages: Sequence[Message],
    i: int,
    owed_at: int,
    expected: dict[str, str],
    seen_result: set[str],
) -> list[str]:
    msg = messages[i]
    out: list[str] = []
    if msg.role != "user":
        return [
            f"messages[{owed_at}] (assistant): tool_use {tid!r} ({name}) has no tool_result "
            f"in the next message (messages[{i}] is an assistant message)"
            for tid, name in expected.items()
        ]
    leading = True
    answered: set[str] = set()
    for block in msg.content:
        if not isinstance(block, ToolResultBlock):
            leading = False
            continue
        tid = block.tool_use_id
        if tid in seen_result or tid in answered:
            out.append(f"messages[{i}] (user): duplicate tool_result for {tid!r}")
            continue
        if tid not in expected:
            out.append(
                f"messages[{i}] (user): tool_result for {tid!r} has no tool_use "
                "in the message just before it"
            )
            continue
        if not leading:
            out.append(f"messages[{i}] (user): tool_result for {tid!r} comes after other content")
        answered.add(tid)
    seen_result |= answered
    for tid, name in expected.items():
        if tid not in answered:
            out.append(
                f"messages[{owed_at}] (assistant): tool_use {tid!r} ({name}) has no tool_result "
                f"in the next message (messages[{i}])"
            )
    return out
