"""The defaults and figures the docs state in prose hold for the code and for benchmarks/REPORT.md."""

from __future__ import annotations

import inspect
import re
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from agentloop import (
    QueryEngine,
    ScriptedModel,
    ScriptedResponse,
    ScriptedToolCall,
    ToolCallFinished,
    delegate_tool,
    run_process,
    tool,
)
from agentloop.mcp import MCPServer
from agentloop.models import AnthropicModel
from agentloop.policies import (
    ConservativeDoomLoopPolicy,
    IdenticalToolCallRun,
    RepeatedErrorResult,
    RepetitionDetector,
    ToolCallCycle,
)
from agentloop.sessions import JsonlSession
from agentloop.testing import collect

ROOT = Path(__file__).resolve().parent.parent


def _defaults(fn: Callable[..., Any]) -> dict[str, Any]:
    return {n: p.default for n, p in inspect.signature(fn).parameters.items() if p.default is not p.empty}


# Each default as the docs state it (page in the comment).
STATED: list[tuple[Callable[..., Any], dict[str, Any]]] = [
    # concepts.md, interrupts.md, quickstart.md, providers.md "Errors and retries", policies.md
    (
        QueryEngine,
        {
            "tool_cancel_grace": 2.0,
            "max_parallel_tools": 10,
            "max_tool_result_chars": 100_000,
            "follow_up_behavior": "queue",
            "interrupt_notice": "append",
            "retry_budget": 3,
            "retry_base_delay": 0.5,
            "retry_max_delay": 8.0,
            "doom_budget": 2,
            "background_subagents": "keep",
        },
    ),
    (delegate_tool, {"name": "task", "max_turns": 10, "max_depth": 3}),  # subagents.md, api.md
    (JsonlSession, {"fsync": "batch"}),  # sessions.md
    (run_process, {"kill_grace": 2.0, "timeout": None}),  # api.md
    (AnthropicModel, {"max_tokens": 4096, "auth_header": "x-api-key", "anthropic_version": "2023-06-01"}),  # providers.md
    (MCPServer, {"connect_timeout": 60.0}),  # mcp.md (stdio() and http() pass it on)
    (MCPServer.stdio, {"max_message_size": 64 << 20}),  # mcp.md
    (MCPServer.http, {"http_timeout": 30.0, "max_event_size": 64 << 20}),  # mcp.md
    (  # policies.md, api.md
        IdenticalToolCallRun,
        {"nudge_at": 8, "end_at": 12, "tight_nudge_at": 4, "tight_end_at": 8, "keepalive_end_at": 4},
    ),
    (ToolCallCycle, {"max_period": 5, "nudge_repeats": 3, "end_repeats": 5}),  # policies.md
    (RepeatedErrorResult, {"nudge_at": 3, "end_at": 6, "prefix": 200}),  # policies.md
    (ConservativeDoomLoopPolicy, {"max_threshold": 64, "max_chars": 256}),  # policies.md
    (RepetitionDetector, {"window": 4096, "anchor": 16, "step": 32}),  # policies.md
]


@pytest.mark.parametrize(("fn", "stated"), STATED, ids=[getattr(f, "__qualname__", str(f)) for f, _ in STATED])
def test_the_defaults_the_docs_state(fn: Callable[..., Any], stated: dict[str, Any]) -> None:
    actual = _defaults(fn)
    assert {k: actual.get(k, "<no default>") for k in stated} == stated


def test_the_doom_loop_policy_defaults_the_docs_state() -> None:
    # policies.md: every=4, logprob_run 24, logprob_floor -6.0 (these go through **kwargs of the subclass)
    policy = ConservativeDoomLoopPolicy()
    assert (policy.every, policy.logprob_run, policy.logprob_floor) == (4, 24, -6.0)


@tool
async def dump(n: int) -> str:
    """Return n characters."""
    return "x" * n


@pytest.mark.parametrize(("n", "cut"), [(100_000, False), (100_001, True)])
async def test_a_result_is_cut_past_100000_characters_by_default(n: int, cut: bool) -> None:
    model = ScriptedModel([ScriptedResponse(tool_calls=[ScriptedToolCall("dump", {"n": n})]), "done"])
    engine = QueryEngine(model, tools=[dump])
    finished = [e for e in await collect(engine.run("go")) if isinstance(e, ToolCallFinished)]
    assert (finished[0].full_result is not None) is cut
    kept = engine.messages[2].tool_results[0].text
    assert kept.count("x") == 100_000  # the first and last halves of the cap, or the whole result
    assert ("characters of this tool result were cut" in kept) is cut


def _report() -> str:
    return (ROOT / "benchmarks" / "REPORT.md").read_text(encoding="utf-8")


def test_the_provider_timings_in_the_docs_are_the_recorded_run() -> None:
    # providers.md says its table is "the run recorded in benchmarks/REPORT.md".
    page = (ROOT / "docs" / "providers.md").read_text(encoding="utf-8")
    rows = re.findall(r"^(?:anthropic|openai_chat|openai_responses) +\d.*$", page, re.MULTILINE)
    assert len(rows) == 3
    report = _report()
    assert [r for r in rows if r not in report] == []


def test_the_session_timings_in_the_docs_are_the_recorded_run() -> None:
    # sessions.md says its tables are "the run recorded in benchmarks/REPORT.md".
    page = (ROOT / "docs" / "sessions.md").read_text(encoding="utf-8")
    perf = page[page.index("## Performance") :]
    rows = re.findall(r"^\| +(?:`\w+`|[\d,]+) +\|.*$", perf, re.MULTILINE)
    assert len(rows) == 4
    report = _report()
    assert [r for r in rows if r not in report] == []
