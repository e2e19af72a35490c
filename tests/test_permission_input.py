"""`Allow(updated_input=...)`: the call runs with the new input, the host's events say so, and
the transcript keeps the model's call while its result tells the model what ran."""

from __future__ import annotations

import asyncio
import json
from typing import Any

from agentloop import (
    Allow,
    Deny,
    QueryEngine,
    ScriptedModel,
    ScriptedResponse,
    ScriptedToolCall,
    TextBlock,
    Texts,
    ToolCallFinished,
    ToolCallStarted,
    ToolContext,
    ToolUseBlock,
    TurnEnded,
    tool,
    validate_transcript,
)
from tests.helpers import collect

ran: list[dict[str, Any]] = []


@tool
async def shell(command: str, cwd: str = ".") -> str:
    """Run a command."""
    ran.append({"command": command, "cwd": cwd})
    return f"ran {command} in {cwd}"


def _engine(permission: Any, *inputs: dict[str, Any], **kw: Any) -> QueryEngine:
    script = ScriptedResponse(tool_calls=[ScriptedToolCall("shell", i) for i in inputs])
    return QueryEngine(ScriptedModel([script, "done"]), tools=[shell], permission=permission, policies=[], **kw)


async def _sandboxed(use: ToolUseBlock, ctx: ToolContext) -> Allow | Deny:
    return Allow(updated_input={**use.input, "cwd": "/sandbox"})


async def test_the_events_say_which_input_ran_and_the_transcript_keeps_the_models_call() -> None:
    ran.clear()
    engine = _engine(_sandboxed, {"command": "ls"})
    events = await collect(engine, "look")
    assert isinstance(events[-1], TurnEnded) and events[-1].reason == "completed"
    assert ran == [{"command": "ls", "cwd": "/sandbox"}]

    [started] = [e for e in events if isinstance(e, ToolCallStarted)]
    [finished] = [e for e in events if isinstance(e, ToolCallFinished)]
    for event in (started, finished):
        assert event.tool_use.input == {"command": "ls"}  # the model's call, as the transcript holds it
        assert event.updated_input == {"command": "ls", "cwd": "/sandbox"}
        assert event.input == {"command": "ls", "cwd": "/sandbox"}  # what ran

    [use] = engine.messages[1].tool_uses
    assert use.input == {"command": "ls"}  # the model's own words are not rewritten
    [result] = engine.messages[2].tool_results
    assert result == finished.result
    assert not result.is_error
    assert json.dumps({"command": "ls", "cwd": "/sandbox"}) in result.text
    assert result.text.startswith(Texts().input_updated.split("{input}")[0])
    assert result.text.endswith("\n\nran ls in /sandbox")
    assert validate_transcript(engine.messages) == []


async def test_an_allow_that_changes_nothing_reads_as_a_plain_allow() -> None:
    async def same(use: ToolUseBlock, ctx: ToolContext) -> Allow:
        return Allow(updated_input=dict(use.input))

    async def plain(use: ToolUseBlock, ctx: ToolContext) -> Allow:
        return Allow()

    for permission in (same, plain):
        engine = _engine(permission, {"command": "ls"})
        events = await collect(engine, "look")
        for event in events:
            if isinstance(event, ToolCallStarted | ToolCallFinished):
                assert event.updated_input is None
                assert event.input == {"command": "ls"}
        [result] = engine.messages[2].tool_results
        assert result.text == "ran ls in ."


async def test_the_note_is_a_text_the_host_can_change() -> None:
    engine = _engine(_sandboxed, {"command": "ls"}, texts=Texts(input_updated="(run in a sandbox)"))
    await collect(engine, "look")
    [result] = engine.messages[2].tool_results
    assert result.text == "(run in a sandbox)\n\nran ls in /sandbox"

    engine = _engine(_sandboxed, {"command": "ls"}, texts=Texts(input_updated=""))
    await collect(engine, "look")
    [result] = engine.messages[2].tool_results
    assert result.text == "ran ls in /sandbox"


async def test_a_list_result_gets_the_note_as_its_first_block() -> None:
    @tool
    async def pages(command: str) -> list[TextBlock]:
        """Two pages."""
        return [TextBlock(text=f"page 1 of {command}"), TextBlock(text="page 2")]

    async def permission(use: ToolUseBlock, ctx: ToolContext) -> Allow:
        return Allow(updated_input={"command": "safe"})

    script = ScriptedResponse(tool_calls=[ScriptedToolCall("pages", {"command": "rm"})])
    engine = QueryEngine(ScriptedModel([script, "done"]), tools=[pages], permission=permission, policies=[])
    await collect(engine, "go")
    [result] = engine.messages[2].tool_results
    assert isinstance(result.content, list)
    assert [b.text for b in result.content[1:]] == ["page 1 of safe", "page 2"]
    assert '{"command": "safe"}' in result.content[0].text


async def test_a_call_stopped_while_running_with_a_changed_input_says_which_input() -> None:
    entered = asyncio.Event()

    @tool
    async def slow(command: str) -> str:
        """Wait."""
        entered.set()
        await asyncio.Event().wait()
        return "never"

    async def permission(use: ToolUseBlock, ctx: ToolContext) -> Allow:
        return Allow(updated_input={"command": "safe"})

    script = ScriptedResponse(tool_calls=[ScriptedToolCall("slow", {"command": "rm"})])
    engine = QueryEngine(ScriptedModel([script, "done"]), tools=[slow], permission=permission, policies=[])
    events = []
    async for event in engine.run("go"):
        events.append(event)
        if isinstance(event, ToolCallStarted):
            await entered.wait()
            engine.interrupt()
    [finished] = [e for e in events if isinstance(e, ToolCallFinished)]
    assert finished.synthetic and finished.updated_input == {"command": "safe"}
    [result] = engine.messages[2].tool_results
    assert result == finished.result
    assert result.is_error and '{"command": "safe"}' in result.text
    assert Texts().stopped_running in result.text
    assert validate_transcript(engine.messages) == []


async def test_an_updated_input_that_is_not_a_dict_is_refused_not_run() -> None:
    ran.clear()

    async def permission(use: ToolUseBlock, ctx: ToolContext) -> Allow:
        return Allow(updated_input="ls -la")  # type: ignore[arg-type]

    engine = _engine(permission, {"command": "ls"})
    events = await collect(engine, "look")
    assert ran == []
    [result] = engine.messages[2].tool_results
    assert result.is_error
    assert "updated_input" in result.text and "not run" in result.text
    assert not any(isinstance(e, ToolCallStarted) for e in events)


def test_the_note_shows_an_input_json_cannot_encode_too() -> None:
    from pathlib import PurePosixPath

    from agentloop import ToolResultBlock
    from agentloop._tools import input_noted

    result = ToolResultBlock(tool_use_id="t1", content="done")
    looped: dict[str, Any] = {"path": PurePosixPath("/sandbox")}
    assert input_noted(result, looped, "ran with {input}").text == "ran with {\"path\": \"PurePosixPath('/sandbox')\"}\n\ndone"
    looped["self"] = looped
    assert input_noted(result, looped, "ran with {input}").text.startswith("ran with {'path': PurePosixPath('/sandbox'), 'self': {...}}")


async def test_a_permission_callback_failing_with_the_models_key_logs_it_scrubbed(caplog: Any) -> None:
    """The callback's exception was logged as it was: a message (or a cause) holding the model's
    key put the key in the log; it is scrubbed there as in the call's error result."""
    from agentloop.models import OpenAIChatModel

    key = "sk-test-permission-0123456789abcdef"
    real = OpenAIChatModel("gpt-x", api_key=key)

    class Keyed(ScriptedModel):
        def _credentials(self) -> tuple[str, ...]:
            return real._credentials()

    async def check(use: ToolUseBlock, ctx: ToolContext) -> Allow:
        try:
            raise KeyError(f"no policy for {key}")
        except KeyError as exc:
            raise RuntimeError(f"policy server refused key={key}") from exc

    script = ScriptedResponse(tool_calls=[ScriptedToolCall("shell", {"command": "ls"})])
    engine = QueryEngine(Keyed([script, "done"]), tools=[shell], permission=check, policies=[])
    with caplog.at_level("ERROR", logger="agentloop"):
        events = await collect(engine, "go")
    finished = [e for e in events if isinstance(e, ToolCallFinished)]
    assert finished[0].result.is_error and key not in finished[0].result.text
    logged = "\n".join(caplog.text.splitlines() + [r.getMessage() for r in caplog.records])
    assert "permission callback failed" in logged and "RuntimeError" in logged and "KeyError" in logged
    assert key not in logged and "key=[REDACTED]" in logged


async def test_an_updated_input_whose_comparison_raises_is_the_hosts_error_not_agentloops(caplog: Any) -> None:
    """A value of ``updated_input`` whose ``__eq__`` raises (a host object): comparing it with the
    model's input raised out of the call, and the call was reported as failed inside agentloop.
    It is the permission callback's answer that is wrong: an error result that says so."""
    ran.clear()

    class Touchy:
        def __eq__(self, other: object) -> bool:
            raise TypeError("cannot compare a Touchy")

        __hash__ = object.__hash__

    async def permission(use: ToolUseBlock, ctx: ToolContext) -> Allow:
        return Allow(updated_input={"command": Touchy()})

    engine = _engine(permission, {"command": "ls"})
    with caplog.at_level("WARNING", logger="agentloop"):
        events = await collect(engine, "look")
    assert ran == []
    assert isinstance(events[-1], TurnEnded) and events[-1].reason == "completed"
    [result] = engine.messages[2].tool_results
    assert result.is_error
    assert "inside agentloop" not in result.text
    assert "updated_input" in result.text and "cannot compare a Touchy" in result.text and "not run" in result.text
    assert not any(isinstance(e, ToolCallStarted) for e in events)
    assert [r.levelname for r in caplog.records] == ["WARNING"]
