"""Test doubles and helpers for code built on agentloop.

`ScriptedModel` plays scripted responses offline (see `ScriptedResponse`);
`collect` drains a run; `turn_ended` is its terminal; `assert_valid` fails with every rule a
transcript breaks.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Sequence

from ._errors import TranscriptError
from ._events import Event, TurnEnded
from ._messages import Message
from ._scripted import ScriptedModel, ScriptedResponse, ScriptedToolCall
from ._validate import validate_transcript

__all__ = ["ScriptedModel", "ScriptedResponse", "ScriptedToolCall", "assert_valid", "collect", "turn_ended"]


async def collect(run: AsyncIterator[Event]) -> list[Event]:
    """Every event of ``run`` (for example ``await collect(engine.run("hi"))``)."""
    return [event async for event in run]


def assert_valid(messages: Sequence[Message]) -> None:
    """Raise `TranscriptError` listing every violation when ``messages`` breaks a provider rule."""
    problems = validate_transcript(messages)
    if problems:
        raise TranscriptError(problems)


def turn_ended(events: Sequence[Event]) -> TurnEnded:
    """The run's `TurnEnded`: the last of ``events`` (as `collect` returns them), the engine's own.

    Raises AssertionError saying what is wrong when there is none, when other events come after
    it (a list filtered or added to), or when the last one is a subagent's (the run stopped early).
    """
    last = events[-1] if events else None
    if isinstance(last, TurnEnded):
        if last.agent_id is not None:
            raise AssertionError(
                f"the last event is the TurnEnded of subagent {last.agent_id!r}, not the run's own "
                "(the run did not finish: was it drained to the end?)"
            )
        return last
    ends = [i for i, event in enumerate(events) if isinstance(event, TurnEnded) and event.agent_id is None]
    if not ends:
        tail = f"; the last is {type(last).__name__}" if last is not None else ""
        raise AssertionError(f"no TurnEnded among the {len(events)} events{tail} (was the run drained to the end?)")
    after = events[ends[-1] + 1]
    raise AssertionError(
        f"TurnEnded is not the last event: {type(after).__name__} comes after it "
        f"(event {ends[-1] + 1} of {len(events)}); a run ends with its TurnEnded"
    )
