"""A transcript the host supplies, or edits between runs, is repaired before any of it is sent.

API.md: `QueryEngine.messages` is "the transcript, valid whenever no run is in progress". A
history loaded from elsewhere (another framework's crash left a call without its result, a
database returned a blank message) would otherwise make every request fail with a 400.
"""

from __future__ import annotations

import logging
from pathlib import Path

import pytest
from helpers import collect
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from test_transcript import transcripts

from agentloop import (
    Message,
    QueryEngine,
    ScriptedModel,
    TextBlock,
    ToolResultBlock,
    ToolUseBlock,
    TurnEnded,
    validate_transcript,
)
from agentloop.sessions import JsonlSession


def _call(tool_id: str) -> Message:
    return Message(role="assistant", content=[TextBlock(text="Let me look."), ToolUseBlock(id=tool_id, name="read", input={})])


def _result(tool_id: str) -> Message:
    return Message(role="user", content=[ToolResultBlock(tool_use_id=tool_id, content="text of the file")])


def _sent(model: ScriptedModel, n: int = 0) -> list[Message]:
    return list(model.requests[n].messages)


BROKEN = [
    Message.user("Read the config."),
    _call("toolu_1"),  # the host's process died here: no result was saved
    Message.user("Go on."),
    Message.assistant("Done.  \n"),  # trailing whitespace on the final answer
]


async def test_a_history_that_breaks_the_rules_is_repaired_at_construction(caplog: pytest.LogCaptureFixture) -> None:
    assert validate_transcript(BROKEN) != []
    model = ScriptedModel(["Sure."])
    with caplog.at_level(logging.WARNING, logger="agentloop"):
        engine = QueryEngine(model, messages=BROKEN, policies=[])
    assert validate_transcript(engine.messages) == []
    assert "synthetic result for tool_use 'toolu_1'" in caplog.text  # says what it changed
    assert BROKEN[1].tool_uses[0].id == "toolu_1" and len(BROKEN) == 4  # the host's own list is untouched

    events = await collect(engine, "And the logs?")
    assert isinstance(events[-1], TurnEnded) and events[-1].reason == "completed"
    sent = _sent(model)
    assert validate_transcript(sent) == []
    answer = next(m for m in sent if any(b.type == "tool_result" for b in m.content))
    assert answer.tool_results[0].tool_use_id == "toolu_1" and answer.tool_results[0].is_error
    assert validate_transcript(engine.messages) == []


async def test_a_valid_history_is_sent_as_given(caplog: pytest.LogCaptureFixture) -> None:
    """Same objects, in the same order: a provider's prompt cache still matches the prefix."""
    history = [Message.user("Read it."), _call("toolu_1"), _result("toolu_1"), Message.assistant("It says hi.")]
    model = ScriptedModel(["Sure."])
    with caplog.at_level(logging.WARNING, logger="agentloop"):
        engine = QueryEngine(model, messages=history, policies=[])
        await collect(engine, "Thanks.")
    assert all(a is b for a, b in zip(_sent(model), history, strict=False))
    assert caplog.text == ""


@pytest.mark.parametrize(
    "breakage",
    ["append a call with no result", "append a blank message", "edit an earlier message", "replace the list's contents"],
)
async def test_what_the_host_changes_between_runs_is_repaired_before_it_is_sent(
    breakage: str, caplog: pytest.LogCaptureFixture
) -> None:
    model = ScriptedModel(["First answer.", "Second answer."])
    engine = QueryEngine(model, policies=[])
    await collect(engine, "First question.")
    assert validate_transcript(engine.messages) == []
    if breakage == "append a call with no result":
        engine.messages.append(_call("toolu_9"))
    elif breakage == "append a blank message":
        engine.messages.append(Message(role="user", content=[TextBlock(text="  ")]))
    elif breakage == "edit an earlier message":  # same length, same last message: only a full check sees it
        engine.messages[0] = Message(role="user", content=[ToolResultBlock(tool_use_id="nowhere", content="x")])
    else:
        engine.messages[:] = [*BROKEN]
    assert validate_transcript(engine.messages) != []

    with caplog.at_level(logging.WARNING, logger="agentloop"):
        events = await collect(engine, "Second question.")
    assert isinstance(events[-1], TurnEnded) and events[-1].reason == "completed"
    assert "changed since the last run" in caplog.text
    assert validate_transcript(_sent(model, 1)) == []
    assert validate_transcript(engine.messages) == []


async def test_a_valid_append_between_runs_is_not_touched(caplog: pytest.LogCaptureFixture) -> None:
    model = ScriptedModel(["First answer.", "Second answer."])
    engine = QueryEngine(model, policies=[])
    await collect(engine, "First question.")
    added = [Message.user("A note from the host."), Message.assistant("Noted.")]
    engine.messages.extend(added)
    before = list(engine.messages)
    with caplog.at_level(logging.WARNING, logger="agentloop"):
        await collect(engine, "Second question.")
    assert all(a is b for a, b in zip(engine.messages, before, strict=False))
    assert caplog.text == ""


async def test_the_session_file_replays_to_the_repaired_history(tmp_path: Path) -> None:
    path = tmp_path / "s.jsonl"
    with JsonlSession(path) as session:
        engine = QueryEngine(ScriptedModel(["Sure."]), messages=BROKEN, session=session, policies=[])
        await collect(engine, "And the logs?")
    assert engine.session_errors == []
    assert JsonlSession(path).load().messages == engine.messages


@settings(max_examples=60, suppress_health_check=[HealthCheck.too_slow])
@given(transcripts, st.booleans())
async def test_property_any_history_is_sent_valid_and_left_valid(history: list[Message], between_runs: bool) -> None:
    model = ScriptedModel(["One.", "Two."])
    if between_runs:  # the host puts the history in after a first run
        engine = QueryEngine(model, policies=[])
        await collect(engine, "First.")
        engine.messages.extend(history)
    else:
        engine = QueryEngine(model, messages=history, policies=[])
        assert validate_transcript(engine.messages) == []
    events = await collect(engine, "Go.")
    assert isinstance(events[-1], TurnEnded)
    assert validate_transcript(_sent(model, model.request_count - 1)) == []
    assert validate_transcript(engine.messages) == []


def test_a_long_list_of_repairs_is_summed_up_in_the_warning(caplog: pytest.LogCaptureFixture) -> None:
    history = [m for i in range(50) for m in (Message.user(f"q{i}"), _call(f"toolu_{i}"))]
    with caplog.at_level(logging.WARNING, logger="agentloop"):
        engine = QueryEngine(ScriptedModel(["ok"]), messages=history, policies=[])
    assert validate_transcript(engine.messages) == []
    warning = next(r.getMessage() for r in caplog.records if r.levelno == logging.WARNING)
    assert warning.count("synthetic result") == 20 and warning.endswith("; and 30 more")


@pytest.mark.parametrize(
    "prompt",
    [
        Message(role="user", content=[ToolResultBlock(tool_use_id="toolu_9", content="x"), TextBlock(text="Go on.")]),
        Message(role="user", content=[ToolUseBlock(id="toolu_9", name="read", input={}), TextBlock(text="Go on.")]),
        Message(role="user", content=[TextBlock(text="  "), TextBlock(text="Go on.")]),
    ],
    ids=["a result with no call", "a call in a user message", "a blank text block"],
)
async def test_a_prompt_message_that_breaks_the_rules_is_repaired_as_an_appended_one(
    prompt: Message, caplog: pytest.LogCaptureFixture
) -> None:
    """`run(message)` and `messages.append(message); run()` are one request: the prompt was sent
    as given (a result for no call, refused by every provider) and left the transcript invalid."""
    model = ScriptedModel(["First answer.", "Second answer."])
    engine = QueryEngine(model, policies=[])
    await collect(engine, "First question.")
    with caplog.at_level(logging.WARNING, logger="agentloop"):
        events = await collect(engine, prompt.model_copy(update={"meta": {"ticket": "OPS-12"}}))
    assert isinstance(events[-1], TurnEnded) and events[-1].reason == "completed"
    assert "the prompt given to run()" in caplog.text
    assert validate_transcript(_sent(model, 1)) == []
    assert validate_transcript(engine.messages) == []
    assert "Go on." in engine.messages[2].text and engine.messages[2].meta == {"ticket": "OPS-12"}


@pytest.mark.parametrize(
    "prompt",
    [Message(role="user", content=[]), Message(role="user", content=[TextBlock(text=" \n ")])],
    ids=["no content", "blank text"],
)
async def test_a_prompt_message_with_nothing_to_send_is_refused_as_a_blank_text_is(prompt: Message) -> None:
    model = ScriptedModel(["Answer."])
    engine = QueryEngine(model, policies=[])
    with pytest.raises(ValueError, match="needs a prompt with text in it"):
        await collect(engine, prompt)
    assert engine.messages == [] and not engine.running and model.request_count == 0
    await collect(engine, "A real question.")  # the engine stays free
    assert validate_transcript(engine.messages) == []
