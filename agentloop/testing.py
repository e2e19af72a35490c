"""Test doubles and helpers for code built on agentloop.

`ScriptedModel` plays scripted responses offline (see `ScriptedResponse`);
`collect` drains a run; `assert_valid` fails with every rule a transcript breaks.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Sequence

from ._errors import TranscriptError
from ._events import Event
from ._messages import Message
from ._scripted import ScriptedModel, ScriptedResponse, ScriptedToolCall
from ._validate import validate_transcript

__all__ = ["ScriptedModel", "ScriptedResponse", "ScriptedToolCall", "assert_valid", "collect"]


async def collect(run: AsyncIterator[Event]) -> list[Event]:
    """Every event of ``run`` (for example ``await collect(engine.run("hi"))``)."""
    return [event async for event in run]


def assert_valid(messages: Sequence[Message]) -> None:
    """Raise `TranscriptError` listing every violation when ``messages`` breaks a provider rule."""
    problems = validate_transcript(messages)
    if problems:
        raise TranscriptError(problems)
