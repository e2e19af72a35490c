"""The public surface: API.md names are reachable and __all__ is sorted and exact."""

from __future__ import annotations

import types

import agentloop
import agentloop.models
import agentloop.policies

API_NAMES = ["AbortError", "AbortSignal", "AbortController", "TextBlock", "ThinkingBlock", "RedactedThinkingBlock", "ToolUseBlock", "ToolResultBlock", "Message", "validate_transcript", "repair_transcript", "ToolContext", "tool", "Tool", "run_process", "QueryEngine", "Allow", "Deny", "PermissionCallback", "TurnStarted", "TextDelta", "ThinkingDelta", "AssistantMessage", "ToolCallStarted", "ToolCallFinished", "InterjectionInjected", "PolicyNudge", "DoomLoopDetected", "Resampling", "Retrying", "TurnEnded", "TerminalReason", "Model", "ScriptedModel", "DoomLoopSignal"]


def test_all_is_sorted_and_matches_the_module() -> None:
    names = agentloop.__all__
    assert names == sorted(names)
    assert len(names) == len(set(names))
    for name in names:
        assert hasattr(agentloop, name), name
    public = {
        n for n in dir(agentloop) if not n.startswith("_") and not isinstance(getattr(agentloop, n), types.ModuleType)
    }
    assert public - set(names) == set()


def test_every_api_md_name_is_exported() -> None:
    missing = [n for n in API_NAMES if n not in agentloop.__all__]
    assert missing == []


def test_extension_modules_export_the_rest() -> None:
    for name in ("AnthropicModel", "OpenAIChatModel", "OpenAIResponsesModel", "ModelRequest", "StreamText"):
        assert name in agentloop.models.__all__, name
    for name in ("DoomLoopPolicy", "ConservativeDoomLoopPolicy", "RepetitionDetector", "StationarityPolicy", "IdenticalToolCallRun"):
        assert name in agentloop.policies.__all__, name
    assert agentloop.models.__all__ == sorted(agentloop.models.__all__)
    assert agentloop.policies.__all__ == sorted(agentloop.policies.__all__)


async def test_testing_module_helpers() -> None:
    import pytest

    from agentloop import Message, QueryEngine, TranscriptError
    from agentloop.testing import ScriptedModel, assert_valid, collect

    engine = QueryEngine(ScriptedModel(["hello"]), policies=[])
    events = await collect(engine.run("hi"))
    assert type(events[-1]).__name__ == "TurnEnded"
    assert_valid(engine.messages)
    with pytest.raises(TranscriptError, match="empty message"):
        assert_valid([Message(role="user", content=[])])


def test_an_engine_keeps_few_enough_attributes_to_share_one_key_table() -> None:
    # CPython 3.11 shares one key table among a class's instances, and the first instance can put
    # 29 keys in it (the table allows 30, less one for its own creation). Past that every engine
    # gets a dict of its own: 1.3 KB more for each idle engine, against the memory goal.
    import asyncio

    from agentloop import QueryEngine, ScriptedModel

    engine = QueryEngine(ScriptedModel(["hi"]))
    assert len(vars(engine)) <= 29

    async def run() -> None:
        async for _event in engine.run("hello"):
            pass

    asyncio.run(run())
    assert len(vars(engine)) <= 29  # a run adds none


# Measured in a fresh interpreter: CPython 3.11 gives the instances of a class one shared key
# table whose room shrinks by one with each instance made before the first one is whole (which
# is why the package makes a whole engine as it is imported), and an engine with more attributes
# than the table holds has a dict of its own.
_IDLE_ENGINE_MEMORY = """
import gc, sys, tracemalloc
from agentloop import Message, QueryEngine, ScriptedModel

history = [Message.user(f"question {i}") if i % 2 == 0 else Message.assistant(f"answer {i}") for i in range(10)]
engines = [QueryEngine(ScriptedModel(["hi"]), messages=history, policies=[])]  # first-use caches
gc.collect()
tracemalloc.start()
base = tracemalloc.get_traced_memory()[0]
engines += [QueryEngine(ScriptedModel(["hi"]), messages=history, policies=[]) for _ in range(200)]
print((tracemalloc.get_traced_memory()[0] - base) / 200)
"""


def idle_engine_bytes(before: str = "") -> float:
    """Bytes per idle engine, measured in a new interpreter after running ``before`` there."""
    import subprocess
    import sys

    done = subprocess.run(
        [sys.executable, "-c", before + _IDLE_ENGINE_MEMORY], capture_output=True, text=True, timeout=50, check=False
    )
    assert done.returncode == 0, done.stderr
    return float(done.stdout)


def test_an_idle_engine_holds_little_memory() -> None:
    # What the engines themselves hold (not the transcript they share): the goal is 20 KB; a few
    # KB at most, so one more attribute (a dict per engine) or per-engine list shows up here.
    per_engine = idle_engine_bytes()
    assert per_engine <= 2_600, f"{per_engine:.0f} bytes per idle engine"


def test_the_memory_measure_sees_engines_that_each_hold_a_dict() -> None:
    # The measure above would catch a dict per engine: attributes past the key table force one.
    fat = (
        "from agentloop import QueryEngine\n"
        "init = QueryEngine.__init__\n"
        "def fat(self, *args, **kwargs):\n"
        "    init(self, *args, **kwargs)\n"
        "    for i in range(4):\n"
        "        setattr(self, f'extra{i}', None)\n"
        "QueryEngine.__init__ = fat\n"
    )
    assert idle_engine_bytes(fat) > 2_600


async def test_turn_ended_returns_the_runs_terminal_and_fails_clearly_without_one() -> None:
    """Every host test narrowed ``events[-1]`` to `TurnEnded` itself; `turn_ended` does it, and
    says what is wrong when the events do not end with the run's own terminal."""
    import dataclasses

    import pytest

    from agentloop import QueryEngine, TextDelta, TurnEnded
    from agentloop.testing import ScriptedModel, collect, turn_ended

    engine = QueryEngine(ScriptedModel(["hello"]), policies=[])
    events = await collect(engine.run("hi"))
    end = turn_ended(events)
    assert isinstance(end, TurnEnded) and end.reason == "completed" and end is events[-1]
    with pytest.raises(AssertionError, match=r"no TurnEnded among the 0 events"):
        turn_ended([])
    deltas = [e for e in events if isinstance(e, TextDelta)]
    with pytest.raises(AssertionError, match=r"no TurnEnded among the \d+ events.*last is TextDelta"):
        turn_ended(deltas)
    with pytest.raises(AssertionError, match=r"TurnEnded is not the last event: TextDelta comes after it"):
        turn_ended([*events, deltas[0]])
    child_end = dataclasses.replace(end, agent_id="sub-1")
    with pytest.raises(AssertionError, match=r"last event is the TurnEnded of subagent 'sub-1'"):
        turn_ended([*deltas, child_end])
