"""A parent with two subagents in flight, sharing one real MCP server, under random interrupts.

After every run the three transcripts are valid, and the shared MCP connection
still answers (a subagent's interrupt never closes it; the parent's main-only
hook may reset it, after which it reconnects on first use).
"""

from __future__ import annotations

import asyncio
import sys
import tempfile
from dataclasses import dataclass
from pathlib import Path

from hypothesis import given, settings
from hypothesis import strategies as st

from agentloop import (
    AbortController,
    Event,
    ModelRequest,
    QueryEngine,
    ScriptedModel,
    ScriptedResponse,
    ScriptedToolCall,
    delegate_tool,
    validate_transcript,
)
from agentloop.mcp import MCPServer
from tests.helpers import child_pids_alive

SERVER = str(Path(__file__).with_name("mcp_server.py"))


@dataclass(frozen=True)
class Scenario:
    target: str  # "parent", "sub-1", "sub-2" or "none"
    at_event: int
    reason: str
    seconds: float


scenarios = st.builds(
    Scenario,
    st.sampled_from(["parent", "sub-1", "sub-2", "none"]),
    st.integers(1, 30),
    st.sampled_from(["cancel", "send_now", "escape"]),
    st.sampled_from([0.0, 0.02, 0.2]),
)


def respond(seconds: float):  # type: ignore[no-untyped-def]
    def script(request: ModelRequest) -> ScriptedResponse | str:
        first = request.messages[0].text
        has_results = any(m.tool_results for m in request.messages)
        if first.startswith("job"):  # a subagent
            if has_results:
                return "subtask finished"
            call = ScriptedToolCall("slow", {"seconds": seconds, "tag": first})
            return ScriptedResponse(text="working on " + first, chunk=3, tool_calls=[call])
        if has_results:
            return ScriptedResponse(text="both subtasks are done", chunk=4)
        calls = [ScriptedToolCall("task", {"task": f"job {i}"}) for i in (1, 2)]
        return ScriptedResponse(text="delegating", chunk=3, tool_calls=calls)

    return script


async def play(server: MCPServer, tools: list, scenario: Scenario) -> None:  # type: ignore[type-arg]
    parent = QueryEngine(
        ScriptedModel([respond(scenario.seconds)], cycle=True),
        tools=[*tools, delegate_tool()],
        tool_cancel_grace=0.2,
        max_turns=4,
    )
    server.attach(parent)
    children: dict[str, QueryEngine] = {}
    make_child = parent.subagent

    def spy(**kw):  # type: ignore[no-untyped-def]
        child = make_child(**kw)
        children[child.agent_id or ""] = child
        return child

    parent.subagent = spy  # type: ignore[method-assign]
    count = 0
    events: list[Event] = []
    async for event in parent.run("start"):
        events.append(event)
        count += 1
        if count != scenario.at_event:
            continue
        if scenario.target == "parent":
            if scenario.reason == "send_now":
                parent.send_now("forget it, summarise instead")
            else:
                parent.interrupt(scenario.reason)
        elif scenario.target in children:
            children[scenario.target].interrupt(scenario.reason)
    assert validate_transcript(parent.messages) == [], parent.messages
    for child in children.values():
        assert not child.running
        assert validate_transcript(child.messages) == [], child.messages
    result = await server.call_tool("echo", {"text": "still there"}, signal=AbortController().signal)
    assert "still there" in str(result.content)


async def play_all(batch: list[Scenario], markers: str) -> None:
    async with MCPServer.stdio(sys.executable, [SERVER, "--markers", markers], concurrency_safe=True) as server:
        tools = await server.list_tools()
        for scenario in batch:
            await play(server, tools, scenario)
    me = asyncio.current_task()
    for _ in range(3):
        await asyncio.sleep(0)
    assert [t for t in asyncio.all_tasks() if t is not me and not t.done()] == []


# About 30 s on a quiet machine: each parent interrupt restarts the real MCP server (a Python
# process importing the SDK); the suite's per-test timeout (pyproject.toml) leaves room for that.
@settings(max_examples=4)
@given(st.lists(scenarios, min_size=6, max_size=6))
def test_property_two_subagents_and_shared_mcp_survive_any_interrupt(batch: list[Scenario]) -> None:
    with tempfile.TemporaryDirectory() as markers:
        asyncio.run(play_all(batch, markers), debug=True)
    assert child_pids_alive() == set()
