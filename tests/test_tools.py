"""@tool, batching, and run_process."""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import dataclasses
import datetime
import functools
import gc
import io
import itertools
import json
import logging
import os
import signal
import subprocess
import sys
import warnings
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Annotated, Any

import pytest
from hypothesis import given
from hypothesis import strategies as st
from pydantic import BaseModel, Field

from agentloop import (
    AbortController,
    AbortError,
    Allow,
    Deny,
    QueryEngine,
    ScriptedModel,
    ScriptedResponse,
    ScriptedToolCall,
    TextBlock,
    TextDelta,
    Texts,
    Tool,
    ToolCallFinished,
    ToolCallStarted,
    ToolContext,
    ToolInputError,
    ToolResultBlock,
    TurnEnded,
    run_process,
    tool,
    validate_transcript,
)
from agentloop._executor import Mailbox, plan_batches
from agentloop._inbox import told_for
from agentloop._messages import ToolUseBlock
from agentloop._tools import TOOL_NAME, cut_result, safe_name
from tests.helpers import Fifo, VirtualClock, collect, exited


def test_tool_schema_from_annotations_and_description_from_docstring() -> None:
    @tool(concurrency_safe=True, timeout=5, stationarity="tight")
    async def read_file(path: Annotated[str, Field(description="file to read")], limit: int = 100, *, ctx: ToolContext) -> str:
        """Read a text file.

        Returns its first lines."""
        return path

    assert read_file.name == "read_file"
    assert read_file.description.startswith("Read a text file.")
    schema = read_file.input_schema
    assert schema["required"] == ["path"]
    assert schema["properties"]["path"] == {"type": "string", "description": "file to read"}
    assert schema["properties"]["limit"]["default"] == 100
    assert "ctx" not in schema["properties"]
    assert (read_file.concurrency_safe, read_file.timeout, read_file.stationarity) == (True, 5, "tight")


def test_tool_rejects_sync_functions_and_missing_annotations() -> None:
    def sync(x: int) -> int:
        return x

    with pytest.raises(TypeError, match="async"):
        tool(sync)  # type: ignore[arg-type]

    async def bare(x):  # type: ignore[no-untyped-def]
        return x

    with pytest.raises(TypeError, match="annotation"):
        tool(bare)

    async def add(a: int, b: int) -> str:
        return str(a + b)

    with pytest.raises(TypeError, match=r"functools\.partial: define an async def"):
        tool(functools.partial(add, b=1))


def test_an_async_generator_or_a_sync_function_is_refused_saying_what_to_write_instead() -> None:
    # An ``async def`` that yields was told "@tool needs an async function", which it looks like.
    async def lines(path: str) -> AsyncIterator[str]:
        yield path

    with pytest.raises(TypeError, match=r"async generator .* one result: collect what it yields and return that"):
        tool(lines)  # type: ignore[arg-type]

    def count(path: str) -> int:
        return len(path)

    with pytest.raises(TypeError, match=r"sync function .*async def.*asyncio\.to_thread"):
        tool(count)  # type: ignore[arg-type]


async def test_tool_parameters_named_like_pydantic_members_reach_the_function() -> None:
    # Plain parameter names a tool may well have; pydantic reserves, shadows or forbids them.
    async def query(
        schema: str, json: bool, copy: int, model_config: str, model_extra: str, model_fields_set: str, _raw: str = "-"
    ) -> str:
        """Run a query."""
        return repr((schema, json, copy, model_config, model_extra, model_fields_set, _raw))

    with warnings.catch_warnings():
        warnings.simplefilter("error")  # no "shadows an attribute in parent BaseModel" at import time
        made = tool(query)
    props = made.input_schema["properties"]
    assert list(props) == ["schema", "json", "copy", "model_config", "model_extra", "model_fields_set", "_raw"]
    assert props["_raw"] == {"default": "-", "type": "string"}
    assert made.input_schema["required"] == list(props)[:-1]
    given = {"schema": "s", "json": True, "copy": 2, "model_config": "c", "model_extra": "e", "model_fields_set": "f", "_raw": "r"}
    ctx = ToolContext(AbortController().signal, "t1", QueryEngine(ScriptedModel([])))
    assert await made(given, ctx) == repr(("s", True, 2, "c", "e", "f", "r"))
    with pytest.raises(ToolInputError, match=r"model_extra: Field required"):
        await made({k: v for k, v in given.items() if k != "model_extra"}, ctx)


async def test_a_context_parameter_that_may_be_none_or_is_annotated_is_injected() -> None:
    # ``ctx: ToolContext | None = None`` lets the function be called directly (in a test) too.
    seen: list[object] = []

    @tool
    async def optional(path: str, ctx: ToolContext | None = None) -> str:
        """Read."""
        seen.append(ctx)
        return path

    @tool
    async def annotated(path: str, context: Annotated[ToolContext, "injected"]) -> str:
        """Read."""
        seen.append(context)
        return path

    for made in (optional, annotated):
        assert list(made.input_schema["properties"]) == ["path"]
        ctx = ToolContext(AbortController().signal, "t1", QueryEngine(ScriptedModel([])))
        assert await made({"path": "a"}, ctx) == "a"
        assert seen.pop() is ctx


async def test_positional_only_parameters_are_passed_by_position() -> None:
    @tool
    async def read(ctx: ToolContext, path: str, /, limit: int = 10) -> str:
        """Read."""
        return f"{path}:{limit}:{ctx.tool_use_id}"

    assert read.input_schema["required"] == ["path"]
    ctx = ToolContext(AbortController().signal, "t1", QueryEngine(ScriptedModel([])))
    assert await read({"path": "a.txt"}, ctx) == "a.txt:10:t1"
    assert await read({"path": "a.txt", "limit": 3}, ctx) == "a.txt:3:t1"


def test_tool_name_and_description_overrides() -> None:
    @tool(name="grep", description="Search.")
    async def search(pattern: str) -> str:
        """Ignored."""
        return pattern

    assert (search.name, search.description) == ("grep", "Search.")


async def test_tool_outputs_are_normalised_to_results() -> None:
    @tool
    async def many(kind: str) -> object:
        return {"text": "plain", "none": None, "blocks": [TextBlock(text="b")], "json": {"a": 1}, "block": TextBlock(text="one")}[kind]

    @tool
    async def custom() -> ToolResultBlock:
        return ToolResultBlock(tool_use_id="ignored", content="mine", is_error=True)

    script = ScriptedResponse(
        tool_calls=[ScriptedToolCall("many", {"kind": k}) for k in ("text", "none", "blocks", "json", "block")]
        + [ScriptedToolCall("custom", {})]
    )
    engine = QueryEngine(ScriptedModel([script, "ok"]), tools=[many, custom], policies=[])
    await collect(engine, "go")
    got = [r for m in engine.messages for r in m.tool_results]
    assert [r.text for r in got] == ["plain", "(no output)", "b", '{"a": 1}', "one", "mine"]  # a lone text block is text too
    assert got[-1].is_error and got[-1].tool_use_id == engine.messages[1].tool_uses[-1].id


async def test_an_empty_list_returned_is_the_json_of_an_empty_list_not_no_output() -> None:
    # A search with no match returned [] and the model read "(no output)", as from a tool that
    # printed nothing; {} already read "{}". An empty list is JSON like any list of data.
    @tool
    async def grep(pattern: str) -> list[str]:
        """Find lines."""
        return [] if pattern == "none" else ["a.py:1: hit"]

    script = ScriptedResponse(tool_calls=[ScriptedToolCall("grep", {"pattern": p}) for p in ("none", "hit")])
    engine = QueryEngine(ScriptedModel([script, "ok"]), tools=[grep], policies=[])
    await collect(engine, "go")
    got = [(r.text, r.is_error) for m in engine.messages for r in m.tool_results]
    assert got == [("[]", False), ('["a.py:1: hit"]', False)]


async def test_a_tools_own_timeout_error_keeps_its_message_and_a_bare_exception_has_no_dangling_colon() -> None:
    @tool(concurrency_safe=True)
    async def fails(kind: str) -> str:
        """Fail."""
        raise {"timeout": TimeoutError("the database did not answer in 5 s"), "bare": ValueError()}[kind]

    script = ScriptedResponse(tool_calls=[ScriptedToolCall("fails", {"kind": k}) for k in ("timeout", "bare")])
    engine = QueryEngine(ScriptedModel([script, "ok"]), tools=[fails], policies=[])
    await collect(engine, "go")
    assert [r.text for m in engine.messages for r in m.tool_results] == [
        "Tool 'fails' raised TimeoutError: the database did not answer in 5 s",  # was "raised TimeoutError."
        "Tool 'fails' raised ValueError.",  # was "raised ValueError: "
    ]



async def test_a_tool_whose_command_line_parser_exits_gives_an_error_result_not_a_host_exit() -> None:
    # argparse (click, typer) raises SystemExit on arguments it refuses; inside a tool that is the
    # model's bad input, which must not end the host program.
    @tool
    async def grep(args: list[str]) -> str:
        """Search with grep-like arguments."""
        parser = argparse.ArgumentParser(prog="grep")
        parser.add_argument("pattern")
        with contextlib.redirect_stderr(io.StringIO()):
            parsed = parser.parse_args(args)
        return f"searched for {parsed.pattern}"

    script = ScriptedResponse(tool_calls=[ScriptedToolCall("grep", {"args": ["--nope"]})])
    engine = QueryEngine(ScriptedModel([script, "ok"]), tools=[grep], policies=[])
    events = await collect(engine, "go")
    [result] = [r for m in engine.messages for r in m.tool_results]
    assert result.is_error and result.text == "Tool 'grep' tried to exit the program (SystemExit(2)); it was stopped there."
    assert isinstance(events[-1], TurnEnded) and events[-1].reason == "completed"
    assert validate_transcript(engine.messages) == []


@pytest.mark.parametrize("kind", ["sync", "async"])
async def test_a_permission_callback_whose_parser_exits_is_a_failed_check_not_a_host_exit(
    kind: str, caplog: pytest.LogCaptureFixture
) -> None:
    # A prompt that parses the user's typed answer with argparse exits on one it refuses: as in a
    # tool, that SystemExit must not end the host program (nor leave the event loop from the
    # prompt's task); the call is not run, and the turn goes on.
    @tool
    async def act() -> str:
        """Act."""
        raise AssertionError("a call whose check failed must not run")

    def parse(answer: list[str]) -> Allow:
        parser = argparse.ArgumentParser(prog="confirm")
        parser.add_argument("--yes", action="store_true", required=True)
        with contextlib.redirect_stderr(io.StringIO()):
            parser.parse_args(answer)
        return Allow()

    def sync_check(use: ToolUseBlock, ctx: ToolContext) -> Allow:
        return parse(["--nope"])

    async def async_check(use: ToolUseBlock, ctx: ToolContext) -> Allow:
        await asyncio.sleep(0)
        return parse(["--nope"])

    check = sync_check if kind == "sync" else async_check
    model = ScriptedModel([ScriptedResponse(tool_calls=[ScriptedToolCall("act", {})]), "ok"])
    engine = QueryEngine(model, tools=[act], permission=check, policies=[])
    with caplog.at_level(logging.ERROR, logger="agentloop"):
        events = await collect(engine, "go")
    [result] = [r for m in engine.messages for r in m.tool_results]
    assert result.is_error and result.text == "The permission check failed (SystemExit: 2); the tool was not run."
    assert isinstance(events[-1], TurnEnded) and events[-1].reason == "completed"
    assert not any(isinstance(e, ToolCallStarted) for e in events)
    assert validate_transcript(engine.messages) == []
    assert any("permission callback failed" in r.getMessage() for r in caplog.records)


def test_a_host_listeners_exit_during_a_permission_prompt_still_ends_the_program() -> None:
    # The callback interrupts the run and a host abort listener calls sys.exit(): that SystemExit
    # propagates out of abort() (docs/concepts.md), so it ends the program; it is not the
    # callback's parser refusing an answer, and must not become a failed check.
    script = """
import asyncio, sys
from agentloop import Deny, QueryEngine, tool
from agentloop.testing import ScriptedModel, ScriptedResponse, ScriptedToolCall

@tool
async def act() -> str:
    \"\"\"Act.\"\"\"
    return "ran"

async def check(use, ctx):
    ctx.signal.add_listener(lambda reason: sys.exit(7))
    engine.interrupt("user typed q")
    return Deny("q")

model = ScriptedModel([ScriptedResponse(tool_calls=[ScriptedToolCall("act", {})]), "ok"])
engine = QueryEngine(model, tools=[act], permission=check, policies=[])

async def main():
    async for _ in engine.run("go"):
        pass
    print("run ended without the exit")

asyncio.run(main())
"""
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=60, check=False)
    assert done.returncode == 7, (done.stdout, done.stderr[-2000:])
    assert "run ended without the exit" not in done.stdout


class _Point(BaseModel):
    x: int
    label: str
    seen: datetime.date


@dataclasses.dataclass
class _Size:
    width: int


async def test_a_tool_returning_pydantic_models_or_dataclasses_gives_the_model_their_json() -> None:
    # They used to reach the model as their str(): "x=1 label='a' seen=datetime.date(2024, 5, 1)".
    @tool
    async def shapes(kind: str) -> object:
        point = _Point(x=1, label="a", seen=datetime.date(2024, 5, 1))
        endless = {"count": itertools.count()}  # never drained: it would block the loop for good
        return {"model": point, "models": [point], "dataclass": _Size(3), "bytes": {"b": b"\xff"}, "endless": endless}[kind]

    kinds = ("model", "models", "dataclass", "bytes", "endless")
    script = ScriptedResponse(tool_calls=[ScriptedToolCall("shapes", {"kind": k}) for k in kinds])
    engine = QueryEngine(ScriptedModel([script, "ok"]), tools=[shapes], policies=[])
    await collect(engine, "go")
    got = [r.text for m in engine.messages for r in m.tool_results]
    point = {"x": 1, "label": "a", "seen": "2024-05-01"}
    assert [json.loads(t) for t in got] == [point, [point], {"width": 3}, {"b": "b'\\xff'"}, {"count": "count(0)"}]


class _Rows(BaseModel):
    total: int
    rows: Any  # a lazy cursor


@dataclasses.dataclass
class _Page:
    title: str
    lines: Any


class _Raw(BaseModel):
    name: str
    raw: bytes


async def test_a_tool_result_holding_an_iterator_inside_a_model_or_dataclass_never_runs_it() -> None:
    # Pydantic drains an iterator it finds inside a model or a dataclass: an endless one
    # (a cursor, itertools.count()) blocked the event loop for good, and a finite one was used up.
    advanced: list[str] = []

    def cursor(name: str) -> Any:  # finite here, so that the old code fails rather than hangs
        advanced.append(name)
        yield "row"

    @tool
    async def fetch(kind: str) -> object:
        return {
            "model": _Rows(total=2, rows=cursor("model")),
            "dataclass": _Page(title="t", lines=cursor("dataclass")),
            "nested": [{"page": _Page(title="n", lines=[_Rows(total=1, rows=cursor("nested"))])}],
            "raw": _Raw(name="blob", raw=b"\xff\xfe"),  # whole, pydantic cannot dump it: field by field
        }[kind]

    kinds = ("model", "dataclass", "nested", "raw")
    script = ScriptedResponse(tool_calls=[ScriptedToolCall("fetch", {"kind": k}) for k in kinds])
    engine = QueryEngine(ScriptedModel([script, "ok"]), tools=[fetch], policies=[])
    await collect(engine, "go")
    assert advanced == []
    got = [json.loads(r.text) for m in engine.messages for r in m.tool_results]
    assert got[0]["total"] == 2 and got[0]["rows"].startswith("<generator object")
    assert got[1]["title"] == "t" and got[1]["lines"].startswith("<generator object")
    [[row]] = [page["page"]["lines"] for page in got[2]]
    assert row["total"] == 1 and row["rows"].startswith("<generator object")
    assert got[3] == {"name": "blob", "raw": repr(b"\xff\xfe")}  # was the model's str(): "name='blob' raw=..."


async def test_a_returned_result_block_built_without_validation_gives_a_result_not_a_crashed_run() -> None:
    # model_copy(update=...) and model_construct do not validate: a block whose content was None,
    # bytes or a list of strings reached the loop and ended run() with a TypeError.
    made = ToolResultBlock(tool_use_id="mine", content="draft")

    @tool(concurrency_safe=True)
    async def odd(kind: str) -> ToolResultBlock:
        return {
            "none": made.model_copy(update={"content": None}),
            "bytes": made.model_copy(update={"content": b"raw", "is_error": True}),
            "strings": ToolResultBlock.model_construct(tool_use_id="x", content=["a", "b"]),
            "blocks": made.model_copy(update={"content": [TextBlock(text="fine")]}),
        }[kind]

    kinds = ("none", "bytes", "strings", "blocks")
    script = ScriptedResponse(tool_calls=[ScriptedToolCall("odd", {"kind": k}) for k in kinds])
    engine = QueryEngine(ScriptedModel([script, "ok"]), tools=[odd], policies=[])
    events = await collect(engine, "go")
    assert isinstance(events[-1], TurnEnded) and events[-1].reason == "completed"
    assert validate_transcript(engine.messages) == []
    got = [(r.text, r.is_error) for m in engine.messages for r in m.tool_results]
    assert got == [("(no output)", False), ("raw", True), ('["a", "b"]', False), ("fine", False)]


class _NoMessage(Exception):
    def __str__(self) -> str:
        raise AttributeError("'_NoMessage' object has no attribute 'msg'")


class _Unprintable(Exception):
    def __str__(self) -> str:
        raise self

    def __repr__(self) -> str:
        raise RuntimeError("no repr either")


class _FrameworkStop(BaseException):
    pass


async def test_a_tool_failure_that_cannot_be_printed_or_is_a_base_exception_is_the_tools_error() -> None:
    @tool(concurrency_safe=True)
    async def fails(kind: str) -> str:
        """Fail in an odd way."""
        raise {"nomessage": _NoMessage(), "unprintable": _Unprintable(), "base": _FrameworkStop("halt")}[kind]

    kinds = ("nomessage", "unprintable", "base")
    script = ScriptedResponse(tool_calls=[ScriptedToolCall("fails", {"kind": k}) for k in kinds])
    engine = QueryEngine(ScriptedModel([script, "ok"]), tools=[fails], policies=[])
    events = await collect(engine, "go")
    assert isinstance(events[-1], TurnEnded) and events[-1].reason == "completed"
    got = [r for m in engine.messages for r in m.tool_results]
    assert all(r.is_error and "inside agentloop" not in r.text for r in got)
    assert [r.text for r in got] == [
        "Tool 'fails' raised _NoMessage (its message could not be formatted)",
        "Tool 'fails' raised _Unprintable (its message could not be formatted)",
        "Tool 'fails' raised _FrameworkStop: halt",
    ]


def test_ctrl_c_in_a_tools_own_code_goes_through_and_the_call_gets_the_interrupted_result(caplog: pytest.LogCaptureFixture) -> None:
    # A KeyboardInterrupt raised in the tool's code (a second Ctrl-C under asyncio.run, or the first
    # under a loop that keeps Python's default SIGINT handler) ends the host's loop. The call was
    # stopped by the user, as when the first Ctrl-C cancels the run: it gets that result, not a
    # failure blamed on agentloop.
    @tool
    async def crunch() -> str:
        """Crunch numbers."""
        raise KeyboardInterrupt

    engine = QueryEngine(ScriptedModel([ScriptedResponse(tool_calls=[ScriptedToolCall("crunch", {})]), "ok"]), tools=[crunch])

    async def main() -> None:
        async for _ in engine.run("go"):
            pass

    with pytest.raises(KeyboardInterrupt):
        asyncio.run(main())
    gc.collect()  # asyncio would log the call's task, "exception was never retrieved", now rather than at random
    assert "never retrieved" not in caplog.text  # the run recorded the outcome: nothing left to report
    assert validate_transcript(engine.messages) == []
    [result] = engine.messages[-1].tool_results
    assert result.is_error and result.text == Texts().stopped_running


def _ctrl_c(shape: str) -> BaseException:
    """Ctrl-C as a call's own code may raise it: bare, or wrapped in the exception group of a task
    group one of whose children it landed in (beside another child's failure, or nested)."""
    if shape == "bare":
        return KeyboardInterrupt()
    if shape == "group":
        return BaseExceptionGroup("unhandled errors in a TaskGroup", [KeyboardInterrupt()])
    inner = BaseExceptionGroup("inner", [asyncio.CancelledError(), KeyboardInterrupt()])
    return BaseExceptionGroup("outer", [ValueError("a sibling failed"), inner])


@pytest.mark.parametrize("shape", ["bare", "group", "nested"])
def test_ctrl_c_wrapped_in_an_exception_group_stops_the_run_as_a_bare_one_does(
    shape: str, caplog: pytest.LogCaptureFixture
) -> None:
    # A BaseExceptionGroup holding a KeyboardInterrupt was the tool's failure (an error result, the
    # run going on to ask the model again) and the Ctrl-C was swallowed. This one's KeyboardInterrupt
    # never left the event loop (raised in the call's own task): it goes out from there, bare, the
    # group chained to it. One a real task group's child raised went out from that child's step
    # already (the tests with real task groups below): no second one is raised for it.
    @tool
    async def crunch() -> str:
        """Crunch numbers."""
        raise _ctrl_c(shape)

    model = ScriptedModel([ScriptedResponse(tool_calls=[ScriptedToolCall("crunch", {})]), "ok"])
    engine = QueryEngine(model, tools=[crunch])

    async def main() -> None:
        async for _ in engine.run("go"):
            pass

    with pytest.raises(KeyboardInterrupt):
        asyncio.run(main())
    gc.collect()
    assert "never retrieved" not in caplog.text
    assert validate_transcript(engine.messages) == [] and not engine.running
    assert model.request_count == 1
    [result] = [r for m in engine.messages for r in m.tool_results]
    assert result.is_error and result.text == Texts().stopped_running


@pytest.mark.parametrize("shape", ["bare", "group", "nested"])
def test_ctrl_c_wrapped_in_an_exception_group_at_a_permission_prompt_stops_the_run(
    shape: str, caplog: pytest.LogCaptureFixture
) -> None:
    ran: list[str] = []

    @tool
    async def crunch() -> str:
        """Crunch numbers."""
        ran.append("crunch")
        return "crunched"

    async def ask(use: ToolUseBlock, ctx: ToolContext) -> Allow | Deny:
        raise _ctrl_c(shape)

    model = ScriptedModel([ScriptedResponse(tool_calls=[ScriptedToolCall("crunch", {})]), "ok"])
    engine = QueryEngine(model, tools=[crunch], permission=ask)

    async def main() -> None:
        async for _ in engine.run("go"):
            pass

    with caplog.at_level(logging.ERROR, logger="agentloop"), pytest.raises(KeyboardInterrupt):
        asyncio.run(main())
    gc.collect()
    assert "never retrieved" not in caplog.text and "permission callback failed" not in caplog.text
    assert validate_transcript(engine.messages) == [] and not engine.running
    assert ran == [] and model.request_count == 1
    [result] = [r for m in engine.messages for r in m.tool_results]
    assert result.is_error and result.text == Texts().never_started


async def _ctrl_c_in_a_child(group: str) -> None:
    """Ctrl-C landing in one child of a real task group (asyncio's own or anyio's), the other
    child waiting: asyncio lets it out of the event loop from the child's own step."""

    async def child() -> None:
        raise KeyboardInterrupt

    if group == "asyncio":
        async with asyncio.TaskGroup() as tg:
            tg.create_task(child())
            await asyncio.Event().wait()
    elif group == "body":  # in the task group's own body, the call's task: it never left the loop
        async with asyncio.TaskGroup() as tg:
            tg.create_task(asyncio.Event().wait())
            await asyncio.sleep(0)
            raise KeyboardInterrupt
    elif group == "await":  # a child task awaited: asyncio throws its KeyboardInterrupt into the awaiting task
        await asyncio.create_task(child())
    elif group == "wait_for":  # a task made for the coroutine: the call's task reads the result from it
        await asyncio.wait_for(child(), 60)
    else:
        import anyio

        async with anyio.create_task_group() as atg:
            atg.start_soon(child)
            await asyncio.Event().wait()


def _engine_with_a_task_group(group: str, where: str) -> tuple[QueryEngine, ScriptedModel, list[str]]:
    ran: list[str] = []

    @tool
    async def crunch() -> str:
        """Crunch numbers."""
        ran.append("crunch")
        if where == "tool":
            await _ctrl_c_in_a_child(group)
        return "crunched"

    async def ask(use: ToolUseBlock, ctx: ToolContext) -> Allow | Deny:
        await _ctrl_c_in_a_child(group)
        return Allow()

    model = ScriptedModel([ScriptedResponse(tool_calls=[ScriptedToolCall("crunch", {})]), "ok"])
    engine = QueryEngine(model, tools=[crunch], permission=ask if where == "permission" else None)
    return engine, model, ran


def _check_interrupted(engine: QueryEngine, model: ScriptedModel, ran: list[str], where: str) -> None:
    assert validate_transcript(engine.messages) == [] and not engine.running
    assert model.request_count == 1
    [result] = [r for m in engine.messages for r in m.tool_results]
    text = Texts().stopped_running if where == "tool" else Texts().never_started
    # Stopped for Ctrl-C, or by asyncio.run's cleanup, which may cancel the run's reader first.
    assert result.is_error and result.text in (text, told_for(text, "consumer_closed"))
    assert ran == (["crunch"] if where == "tool" else [])


@pytest.mark.parametrize("where", ["tool", "permission"])
@pytest.mark.parametrize("group", ["asyncio", "anyio", "await", "wait_for", "body"])
def test_ctrl_c_in_a_real_task_groups_child_reaches_the_host_once(
    group: str, where: str, caplog: pytest.LogCaptureFixture
) -> None:
    # The child's KeyboardInterrupt leaves the loop from the child's step: the host has it. The
    # group then raises it again in the call's task (bare, or in a BaseExceptionGroup); raising it
    # once more from there was a second Ctrl-C, landing in asyncio.run's cleanup ("Task exception
    # was never retrieved", "Task was destroyed but it is pending").
    engine, model, ran = _engine_with_a_task_group(group, where)

    async def main() -> None:
        async for _ in engine.run("go"):
            pass

    interrupts = 0
    with caplog.at_level(logging.DEBUG, logger="asyncio"):
        try:
            asyncio.run(main())
        except KeyboardInterrupt:
            interrupts += 1
        gc.collect()
    assert interrupts == 1
    assert [r.getMessage() for r in caplog.records if r.name == "asyncio" and r.levelno >= logging.ERROR] == []
    assert "never retrieved" not in caplog.text and "destroyed but it is pending" not in caplog.text
    _check_interrupted(engine, model, ran, where)


@pytest.mark.parametrize("where", ["tool", "permission"])
@pytest.mark.parametrize("group", ["asyncio", "anyio", "await", "wait_for", "body"])
def test_ctrl_c_in_a_real_task_groups_child_leaves_no_stray_interrupt_for_the_next_cell(
    group: str, where: str, caplog: pytest.LogCaptureFixture
) -> None:
    # A notebook runs its loop again for the next cell: that one must not get a Ctrl-C no one pressed.
    engine, model, ran = _engine_with_a_task_group(group, where)

    async def main() -> None:
        async for _ in engine.run("go"):
            pass

    loop = asyncio.new_event_loop()
    try:
        with caplog.at_level(logging.DEBUG, logger="asyncio"):
            cell = loop.create_task(main())
            interrupts = 0
            for _ in range(2):  # this cell, and the next one, which waits for the run: it ends, interrupted
                try:
                    loop.run_until_complete(cell)
                except KeyboardInterrupt:  # a second one would be a Ctrl-C no one pressed
                    interrupts += 1
            gc.collect()
    finally:
        loop.close()
    assert interrupts == 1 and cell.done()
    assert [r.getMessage() for r in caplog.records if r.name == "asyncio" and r.levelno >= logging.ERROR] == []
    assert "never retrieved" not in caplog.text and "destroyed but it is pending" not in caplog.text
    _check_interrupted(engine, model, ran, where)


async def test_a_tools_timeout_holds_although_the_tool_swallows_the_cancellation(caplog: pytest.LogCaptureFixture) -> None:
    # The timeout cancels the call; a call that swallows that is given up on a cancel grace
    # later, with its timeout error, and the loop goes on. It used to run as long as it liked.
    @tool(timeout=1)
    async def stuck() -> str:
        """Hang."""
        try:
            await asyncio.sleep(50)
        except asyncio.CancelledError:
            pass  # swallowed: it carries on
        await asyncio.sleep(50)
        return "late"

    grace = 2.0
    with VirtualClock() as clock:
        script = ScriptedResponse(tool_calls=[ScriptedToolCall("stuck", {})])
        engine = QueryEngine(ScriptedModel([script, "ok"]), tools=[stuck], policies=[], tool_cancel_grace=grace)
        times = {}
        with caplog.at_level(logging.WARNING, logger="agentloop"):
            async for event in engine.run("go"):
                times[type(event).__name__] = clock.now
                if isinstance(event, TurnEnded):
                    ended = event
        for task in [t for t in asyncio.all_tasks() if t is not asyncio.current_task()]:
            await asyncio.gather(task, return_exceptions=True)  # the abandoned call, cancelled once more
    assert times["ToolCallFinished"] - times["ToolCallStarted"] <= 1 + grace + 0.01
    assert ended.reason == "completed"
    [result] = [r for m in engine.messages for r in m.tool_results]
    assert result.is_error and result.text.startswith("Tool 'stuck' timed out after 1 s")
    assert caplog.text.count("ignored cancellation") == 1 and "'stuck'" in caplog.text


async def test_a_tool_that_honours_its_timeout_is_not_called_abandoned_when_the_cancel_grace_is_zero(
    caplog: pytest.LogCaptureFixture,
) -> None:
    # tool_cancel_grace=0 (interrupts cancel at once) left a timed-out call no time at all to
    # unwind: every call that timed out was said to have ignored its cancellation, and abandoned.
    cleaned = []

    @tool(timeout=1)
    async def fetch() -> str:
        """Fetch slowly."""
        try:
            await asyncio.sleep(50)
        finally:
            await asyncio.sleep(0)  # a cleanup that awaits (closing a connection)
            cleaned.append(True)
        return "fetched"

    with VirtualClock():
        script = ScriptedResponse(tool_calls=[ScriptedToolCall("fetch", {})])
        engine = QueryEngine(ScriptedModel([script, "ok"]), tools=[fetch], policies=[], tool_cancel_grace=0)
        with caplog.at_level(logging.WARNING, logger="agentloop"):
            events = await collect(engine, "go")
    assert isinstance(events[-1], TurnEnded) and events[-1].reason == "completed"
    [result] = [r for m in engine.messages for r in m.tool_results]
    assert result.is_error and result.text == "Tool 'fetch' timed out after 1 s and was stopped."
    assert cleaned == [True] and "ignored cancellation" not in caplog.text


EMIT_FROM_A_THREAD = """
import asyncio, threading
from agentloop import QueryEngine, ScriptedModel, ScriptedResponse, ScriptedToolCall, TextDelta, ToolCallStarted, ToolContext, tool

async def main():
    host_saw_start, host_saw_progress = asyncio.Event(), asyncio.Event()
    go, errors = threading.Event(), []

    def work(ctx):
        go.wait(10)
        try:
            ctx.emit(TextDelta(text="50% done"))
        except Exception as exc:
            errors.append(exc)

    @tool
    async def report(ctx: ToolContext) -> str:
        \"\"\"Work in a thread, reporting progress.\"\"\"
        worker = threading.Thread(target=work, args=(ctx,))
        worker.start()
        await host_saw_start.wait()  # the loop is back waiting for the calls
        go.set()
        await host_saw_progress.wait()
        await asyncio.to_thread(worker.join)
        return "finished"

    engine = QueryEngine(ScriptedModel([ScriptedResponse(tool_calls=[ScriptedToolCall("report", {})]), "ok"]), tools=[report], policies=[])
    async for event in engine.run("go"):
        if isinstance(event, ToolCallStarted):
            host_saw_start.set()
        if isinstance(event, TextDelta) and event.text == "50% done":
            host_saw_progress.set()
    print(errors, engine.messages[2].tool_results[0].text)

asyncio.run(main(), debug=True)
"""


def test_a_tool_can_emit_events_from_a_worker_thread() -> None:
    # Progress reported from a worker thread (asyncio.to_thread) touched the loop's mailbox from
    # that thread: in asyncio debug mode the put raised there and the loop was never woken again,
    # so the run hung for good (interrupt() could not end it); otherwise the event waited for
    # something else to wake the loop. A child process, so that a hang is bounded.
    import agentloop

    env = {**os.environ, "PYTHONPATH": str(Path(agentloop.__file__).parents[1])}
    try:
        done = subprocess.run([sys.executable, "-c", EMIT_FROM_A_THREAD], env=env, capture_output=True, text=True, timeout=30)
    except subprocess.TimeoutExpired:
        pytest.fail("the run hung after a tool emitted an event from a worker thread")
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "[] finished"



async def test_every_tool_phase_of_a_run_delivers_events_emitted_from_a_worker_thread() -> None:
    # The thread-safe emit is made once per mailbox and shared by the run's tool phases: the
    # second phase's tool gets the same one, and its event still reaches the host, in order.
    @tool
    async def report(ctx: ToolContext) -> str:
        """Reports progress from a worker thread."""
        await asyncio.to_thread(ctx.emit, TextDelta(text=f"progress of {ctx.tool_use_id}"))
        return "done"

    call = ScriptedResponse(tool_calls=[ScriptedToolCall("report", {}, id="a")])
    again = ScriptedResponse(tool_calls=[ScriptedToolCall("report", {}, id="b")])
    engine = QueryEngine(ScriptedModel([call, again, "ok"]), tools=[report], policies=[])
    events = await asyncio.wait_for(collect(engine, "go"), 10)
    seen = [(type(e).__name__, getattr(e, "text", None)) for e in events if isinstance(e, TextDelta | ToolCallFinished)]
    assert seen == [
        ("TextDelta", "progress of a"),
        ("ToolCallFinished", None),
        ("TextDelta", "progress of b"),
        ("ToolCallFinished", None),
        ("TextDelta", "ok"),
    ]

def _use(name: str, i: int) -> ToolUseBlock:
    return ToolUseBlock(id=f"{name}{i}", name=name, input={})


def test_batching_groups_consecutive_concurrency_safe_calls_up_to_the_limit() -> None:
    @tool(concurrency_safe=True)
    async def r() -> str:
        return ""

    @tool
    async def w() -> str:
        return ""

    tools = {"r": r, "w": w}
    uses = [_use("r", 1), _use("r", 2), _use("r", 3), _use("w", 4), _use("r", 5), _use("w", 6), _use("w", 7)]
    batches = plan_batches(uses, tools, max_parallel=2)
    assert [[u.id for u in b] for b in batches] == [["r1", "r2"], ["r3"], ["w4"], ["r5"], ["w6"], ["w7"]]


async def test_batches_run_concurrently_and_results_keep_the_model_order() -> None:
    active = 0
    peak = 0
    release = asyncio.Event()
    arrived = asyncio.Semaphore(0)

    @tool(concurrency_safe=True)
    async def safe(n: int) -> str:
        nonlocal active, peak
        active += 1
        peak = max(peak, active)
        arrived.release()
        await release.wait()
        active -= 1
        return f"r{n}"

    script = ScriptedResponse(tool_calls=[ScriptedToolCall("safe", {"n": n}) for n in range(5)])
    engine = QueryEngine(ScriptedModel([script, "ok"]), tools=[safe], policies=[], max_parallel_tools=3)
    run = asyncio.ensure_future(collect(engine, "go"))
    for _ in range(3):
        await arrived.acquire()
    assert active == 3  # the first batch of three runs together
    release.set()
    await run
    assert peak == 3
    assert [r.text for m in engine.messages for r in m.tool_results] == [f"r{n}" for n in range(5)]


# -- run_process -------------------------------------------------------------------------

SPAWNER = """
import os, subprocess, sys, time
child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(600)"])
open(sys.argv[1], "w").write(f"{child.pid}\\n")
time.sleep(600)
"""


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    stat = Path(f"/proc/{pid}/stat")
    return not (stat.exists() and stat.read_bytes().rsplit(b")", 1)[1].split()[0] == b"Z")


async def test_run_process_collects_output_and_status() -> None:
    ctl = AbortController()
    result = await run_process(sys.executable, "-c", "import sys; print('out'); print('err', file=sys.stderr); sys.exit(3)", signal=ctl.signal)
    assert (result.returncode, result.stdout.strip(), result.stderr.strip(), result.ok) == (3, "out", "err", False)


async def test_run_process_keeps_the_raw_bytes_of_binary_or_non_utf8_output() -> None:
    # Binary on stdout, Latin-1 on stderr: the decoded text cannot give them back.
    code = "import sys; sys.stdout.buffer.write(bytes(range(256))); sys.stderr.buffer.write('caf\\xe9'.encode('latin-1'))"
    result = await run_process(sys.executable, "-c", code, signal=AbortController().signal)
    assert result.ok
    assert result.stdout_bytes == bytes(range(256))
    assert result.stderr_bytes == b"caf\xe9" and result.stderr == "caf\ufffd"
    assert "stdout_bytes" not in repr(result)  # the repr stays short


async def test_run_process_can_merge_stderr_into_stdout_in_order() -> None:
    # A build log reads in the order it was written; this used to be a TypeError
    # ("got multiple values for keyword argument 'stderr'").
    code = "import sys\nfor i in range(3):\n    print('out', i, flush=True); print('err', i, file=sys.stderr, flush=True)"
    signal = AbortController().signal
    result = await run_process(sys.executable, "-c", code, signal=signal, stderr=subprocess.STDOUT)
    assert result.ok and result.stderr == ""
    assert result.stdout.splitlines() == ["out 0", "err 0", "out 1", "err 1", "out 2", "err 2"]
    with pytest.raises(ValueError, match="STDOUT"):
        await run_process("true", signal=signal, stderr=subprocess.DEVNULL)
    with pytest.raises(TypeError, match="stdout"):
        await run_process("true", signal=signal, stdout=subprocess.DEVNULL)


async def test_run_process_abort_kills_the_whole_group_including_grandchildren(tmp_path: Path) -> None:
    ctl = AbortController()
    async with Fifo(tmp_path / "pids") as pids:
        task = asyncio.ensure_future(run_process(sys.executable, "-c", SPAWNER, str(pids), signal=ctl.signal, kill_grace=0.5))
        grandchild = int(await pids.line())
    assert _alive(grandchild)
    ctl.abort("cancel")
    with pytest.raises(AbortError):
        await task
    await exited(grandchild)  # the kill is sent; its delivery is the kernel's
    assert not _alive(grandchild)


async def test_run_process_term_then_kill_after_grace(tmp_path: Path) -> None:
    ctl = AbortController()
    ignore_term = (
        "import signal, sys, time; signal.signal(signal.SIGTERM, signal.SIG_IGN);"
        "open(sys.argv[1], 'w').write('ready\\n'); time.sleep(600)"
    )
    async with Fifo(tmp_path / "ready") as ready:
        task = asyncio.ensure_future(run_process(sys.executable, "-c", ignore_term, str(ready), signal=ctl.signal, kill_grace=0.05))
        assert await ready.line() == "ready"  # SIGTERM is ignored from here on
    ctl.abort()
    with pytest.raises(AbortError):
        await task


async def test_run_process_timeout_is_a_result_not_an_error() -> None:
    ctl = AbortController()
    result = await run_process(sys.executable, "-c", "import time; time.sleep(600)", signal=ctl.signal, timeout=0.1, kill_grace=0.1)
    assert result.timed_out and not result.ok and result.returncode < 0


async def test_run_process_refuses_to_start_when_already_aborted() -> None:
    ctl = AbortController()
    ctl.abort("early")
    with pytest.raises(AbortError):
        await run_process("true", signal=ctl.signal)


@pytest.mark.parametrize(
    ("kwargs", "error", "says"),
    [
        ({"timeout": "30"}, TypeError, "timeout takes a number of seconds or None"),  # read from a config file
        ({"timeout": float("nan")}, ValueError, "timeout must be >= 0"),  # was a result saying timed_out=True
        ({"timeout": -1}, ValueError, "timeout must be >= 0"),
        ({"kill_grace": None}, TypeError, "kill_grace takes a number of seconds"),
        ({"kill_grace": -0.5}, ValueError, "kill_grace must be >= 0"),
        ({"stdin": "text"}, TypeError, r"stdin takes bytes .*\.encode\(\)"),  # was AssertionError('text')
    ],
)
async def test_run_process_refuses_a_bad_argument_before_the_child_starts(
    tmp_path: Path, kwargs: dict[str, Any], error: type[Exception], says: str
) -> None:
    started = tmp_path / "started"
    with pytest.raises(error, match=says):
        await run_process("sh", "-c", f"touch {started}; cat", signal=AbortController().signal, **kwargs)
    assert not started.exists()


async def test_run_process_cancelled_task_still_kills_the_group(tmp_path: Path) -> None:
    ctl = AbortController()
    code = "import sys, time; open(sys.argv[1], 'w').write('ready\\n'); time.sleep(600)"
    async with Fifo(tmp_path / "ready") as ready:
        task = asyncio.ensure_future(run_process(sys.executable, "-c", code, str(ready), signal=ctl.signal, kill_grace=0.1))
        assert await ready.line() == "ready"
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task


# The child starts a grandchild in its group that keeps the child's stdout open, then exits
# (``sh -c "server &"``): the call waits for the output to end, which only the grandchild can do.
LEFT_RUNNING = """
import os, sys, time
pid = os.fork()
if pid == 0:
    time.sleep(600)
    os._exit(0)
print(pid, flush=True)
open(sys.argv[1], "w").write(f"{pid}\\n")
"""


async def test_a_cancelled_run_process_kills_the_group_although_the_child_has_exited(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    # A tool's `timeout` cancels it while run_process waits for a background grandchild's output
    # to end. The child is gone, but the grandchild must not outlive the call.
    from agentloop import _process

    collectors: list[Any] = []

    class Recording(_process._Collector):
        def __init__(self, *args: Any, **kw: Any) -> None:
            super().__init__(*args, **kw)
            collectors.append(self)

    monkeypatch.setattr(_process, "_Collector", Recording)
    grandchild: list[int] = []
    async with Fifo(tmp_path / "pids") as pids:
        task = asyncio.ensure_future(run_process(sys.executable, "-c", LEFT_RUNNING, str(pids), signal=AbortController().signal))
        try:
            grandchild.append(int(await pids.line()))  # written after the line on stdout
            await collectors[0].exited  # the child has exited, and been reaped
            assert _alive(grandchild[0]) and not task.done()
            task.cancel()
            with pytest.raises(asyncio.CancelledError):
                await task
            assert collectors[0].output[1] == f"{grandchild[0]}\n".encode()
            await exited(grandchild[0])  # SIGKILL is sent; its delivery is the kernel's
            assert not _alive(grandchild[0])
        finally:
            _reap_escapee(grandchild)
            await _cancelled(task)


# The child forks a process that leaves the group (setsid, as daemons do) and keeps the
# child's stdout and stderr open, then exits: killpg cannot reach it, and the pipes never end.
ESCAPEE = """
import os, sys, time
print("before", flush=True)
if os.fork() == 0:
    os.setsid()
    open(sys.argv[1], "w").write(f"{os.getpid()}\\n")
    time.sleep(60)
    os._exit(0)
"""


def _reap_escapee(pids: list[int]) -> None:
    # Not our child (it was re-parented when the child exited): killing it leaves no zombie here.
    for pid in pids:
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGKILL)


async def _cancelled(task: asyncio.Future[Any]) -> None:
    if not task.done():
        task.cancel()
        await asyncio.gather(task, return_exceptions=True)


@pytest.mark.parametrize("ending", ["abort", "timeout"])
async def test_run_process_returns_although_an_escaped_grandchild_holds_the_pipes(tmp_path: Path, ending: str) -> None:
    ctl = AbortController()
    timeout = 0.5 if ending == "timeout" else None
    escapee: list[int] = []
    async with Fifo(tmp_path / "escapee") as pids:
        task = asyncio.ensure_future(
            run_process(sys.executable, "-c", ESCAPEE, str(pids), signal=ctl.signal, timeout=timeout, kill_grace=0.1)
        )
        try:
            escapee.append(int(await pids.line()))
            if ending == "abort":
                ctl.abort("cancel")
                with pytest.raises(AbortError):
                    await asyncio.wait_for(task, 10)
            else:
                result = await asyncio.wait_for(task, 10)
                assert result.timed_out and result.returncode == 0  # the child itself had exited cleanly
                assert result.stdout == "before\n"  # what was written before the timeout is kept
            assert _alive(escapee[0])  # out of reach of the group kill: the call did not wait for it
        finally:
            _reap_escapee(escapee)
            await _cancelled(task)


# The child and its grandchild both ignore SIGTERM: only SIGKILL stops them.
STUBBORN = """
import os, signal, sys, time
signal.signal(signal.SIGTERM, signal.SIG_IGN)
if os.fork() == 0:
    open(sys.argv[1], "w").write(f"{os.getpid()}\\n")
    time.sleep(60)
    os._exit(0)
time.sleep(60)
"""


async def test_the_cancel_grace_kills_a_run_process_group_at_once(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    # The tool honours the abort; run_process is still in its TERM grace when the engine's cancel
    # grace runs out. The cancellation must SIGKILL the group now, not start another TERM grace.
    grandchild: list[int] = []

    async with Fifo(tmp_path / "pids") as pids:

        @tool
        async def build(ctx: ToolContext) -> str:
            """Run the build."""
            result = await run_process(sys.executable, "-c", STUBBORN, str(pids), signal=ctx.signal, kill_grace=30)
            return result.stdout

        engine = QueryEngine(ScriptedModel([ScriptedResponse(tool_calls=[ScriptedToolCall("build", {})]), "ok"]), tools=[build], tool_cancel_grace=0.2)

        async def drive() -> list[str]:
            texts = []
            async for event in engine.run("go"):
                if type(event).__name__ == "ToolCallStarted":
                    grandchild.append(int(await pids.line()))
                    engine.interrupt()
                elif isinstance(event, ToolCallFinished):
                    texts.append(event.result.text)
            return texts

        try:
            with caplog.at_level(logging.WARNING, logger="agentloop"):
                texts = await asyncio.wait_for(drive(), 10)
            await exited(grandchild[0])
            assert not _alive(grandchild[0])
            assert texts[0].startswith("Interrupted by user")
            assert "ignored cancellation" not in caplog.text
        finally:
            _reap_escapee(grandchild)


def test_a_tool_name_no_provider_accepts_is_refused_when_the_tool_is_made() -> None:
    # Every provider rejects the request (every request) that declares such a tool.
    async def handler(input: dict[str, Any], ctx: ToolContext) -> str:
        return ""

    for bad in ("", "read.file", "read file", "x" * 65, "ファイル"):
        with pytest.raises(ValueError, match="not accepted by the providers"):
            Tool(bad, "d", {"type": "object"}, handler)
    assert Tool("x" * 64, "d", {"type": "object"}, handler).name == "x" * 64
    with pytest.raises(ValueError, match="not accepted"):
        tool(name="fs.read")(handler_fn)


async def handler_fn(path: str) -> str:
    """Read."""
    return path


def test_safe_name_keeps_good_names_and_maps_others_apart() -> None:
    assert safe_name("read_file-2") == "read_file-2"
    made = [safe_name(n) for n in ("github.create_issue", "github/create_issue", "multi_tool_use.parallel", "ü" * 80)]
    assert len(set(made)) == len(made)
    assert all(TOOL_NAME.fullmatch(n) for n in made)
    assert made[0].startswith("github_create_issue_") and made[0] == safe_name("github.create_issue")


async def test_a_tool_watcher_changes_the_tools_only_between_model_requests(caplog: pytest.LogCaptureFixture) -> None:
    @tool
    async def old() -> str:
        return "old"

    @tool
    async def new() -> str:
        return "new"

    model = ScriptedModel([ScriptedResponse(tool_calls=[ScriptedToolCall("old", {})])] * 3 + ["done"])
    engine = QueryEngine(model, tools=[old], policies=[])
    seen: list[list[str]] = []

    def watcher(current: Any) -> list[Tool] | None:
        seen.append(sorted(current))
        if len(seen) == 2:
            raise RuntimeError("boom")  # logged; the tools are kept
        if len(seen) == 3:
            return [new, new]  # duplicate names: logged, kept
        return [new] if len(seen) == 4 else None

    engine.watch_tools(watcher)
    with caplog.at_level(logging.ERROR, logger="agentloop"):
        await collect(engine, "go")
    assert seen == [["old"]] * 4  # once before each model request
    assert [[t.name for t in r.tools] for r in model.requests] == [["old"], ["old"], ["old"], ["new"]]
    assert [r.text for m in engine.messages for r in m.tool_results] == ["old"] * 3
    assert "boom" in caplog.text and "duplicate tool names" in caplog.text
    assert engine.subagent(agent_id="c")._tool_watchers == (watcher,)  # inherited


async def test_run_process_says_which_stream_was_cut_and_cuts_on_a_whole_character() -> None:
    # 1 MiB + 1 byte of 'é' (two bytes each) on stderr, a short line on stdout: only stderr
    # was cut, and its text does not end in a U+FFFD made from half a character.
    code = "import sys; print('short'); sys.stderr.write('\\xe9' * (1 << 19) + 'x')"
    result = await run_process(sys.executable, "-c", code, signal=AbortController().signal)
    assert result.ok and result.truncated
    assert (result.stdout_truncated, result.stderr_truncated) == (False, True)
    assert result.stdout == "short\n"
    assert len(result.stderr_bytes) == 1 << 20 and result.stderr == "\xe9" * (1 << 19)
    code = "import sys; sys.stdout.write('ab' + '\\u20ac' * (1 << 19))"  # 3-byte characters, cut mid-character
    result = await run_process(sys.executable, "-c", code, signal=AbortController().signal)
    assert (result.stdout_truncated, result.stderr_truncated) == (True, False)
    assert result.stdout == "ab" + "\u20ac" * (((1 << 20) - 2) // 3) and "\ufffd" not in result.stdout


# -- the size cap on a tool's result ----------------------------------------------------------


async def test_a_huge_tool_result_is_cut_in_the_transcript_and_kept_whole_on_the_event() -> None:
    # A `cat` of a big log would otherwise ride along in every later request, each then
    # failing with the provider's "prompt is too long", for good.
    log = "START " + "x" * 999_988 + " END\u00e9\u20ac"
    blocks = [TextBlock(text="part one "), TextBlock(text="y" * 200_000)]

    @tool
    async def cat(which: str) -> str | list[TextBlock]:
        """Print a file."""
        return log if which == "log" else blocks

    model = ScriptedModel([
        ScriptedResponse(tool_calls=[ScriptedToolCall("cat", {"which": "log"}), ScriptedToolCall("cat", {"which": "b"})]),
        "done",
    ])  # fmt: skip
    engine = QueryEngine(model, tools=[cat], policies=[])
    events = await collect(engine, "show me")
    finished = [e for e in events if isinstance(e, ToolCallFinished)]
    results = [b for m in engine.messages for b in m.content if isinstance(b, ToolResultBlock)]
    assert [f.result for f in finished] == results  # the event says what the transcript holds
    first, second = results
    assert isinstance(first.content, str) and first.content.startswith("START xxx") and first.content.endswith(" END\u00e9\u20ac")
    assert "[... 900,000 of the 1,000,000 characters of this tool result were cut here ...]" in first.content
    assert len(first.content) - len("\n\n[... 900,000 of the 1,000,000 characters of this tool result were cut here ...]\n\n") == 100_000
    assert finished[0].full_result is not None and finished[0].full_result.content == log  # nothing is lost
    assert finished[1].full_result is not None and finished[1].full_result.content == blocks
    assert isinstance(second.content, str) and second.content.startswith("part one yyy") and "100,009 of the 200,009" in second.content
    assert engine.last_turn_ended is not None and engine.last_turn_ended.reason == "completed"
    assert validate_transcript(engine.messages) == []


async def test_the_tool_result_cap_can_be_set_or_switched_off() -> None:
    @tool
    async def big() -> str:
        """Big output."""
        return "0123456789" * 10

    def run(**kw: Any) -> QueryEngine:
        model = ScriptedModel([ScriptedResponse(tool_calls=[ScriptedToolCall("big", {})]), "ok"])
        return QueryEngine(model, tools=[big], policies=[], **kw)

    engine = run(max_tool_result_chars=10)
    finished = next(e for e in await collect(engine, "go") if isinstance(e, ToolCallFinished))
    assert finished.result.content == "01234\n\n[... 90 of the 100 characters of this tool result were cut here ...]\n\n56789"
    child = engine.subagent(agent_id="c")
    assert child.options.max_tool_result_chars == 10  # a subagent keeps its parent's cap
    engine = run(max_tool_result_chars=None)
    finished = next(e for e in await collect(engine, "go") if isinstance(e, ToolCallFinished))
    assert finished.result.content == "0123456789" * 10 and finished.full_result is None
    engine = run(max_tool_result_chars=100)  # exactly at the cap: not cut
    finished = next(e for e in await collect(engine, "go") if isinstance(e, ToolCallFinished))
    assert finished.result.content == "0123456789" * 10 and finished.full_result is None
    for bad in (0, -1):
        with pytest.raises(ValueError, match="max_tool_result_chars"):
            run(max_tool_result_chars=bad)
    for wrong in (1.5, True, "100"):  # a wrong type is a TypeError, as for the other numeric settings
        with pytest.raises(TypeError, match="max_tool_result_chars"):
            run(max_tool_result_chars=wrong)


async def test_a_finished_call_s_event_is_the_event_its_fields_make() -> None:
    # The loop fills the common event (a real text result, not cut) through its slots: it must
    # be the very event the dataclass makes, frozen, with every default, and equal to it.
    @tool
    async def plain() -> str:
        """Plain output."""
        return "done: 42"

    model = ScriptedModel([ScriptedResponse(tool_calls=[ScriptedToolCall("plain", {})]), "ok"])
    events = await collect(QueryEngine(model, tools=[plain], policies=[]), "go")
    finished = next(e for e in events if isinstance(e, ToolCallFinished))
    made = ToolCallFinished(tool_use=finished.tool_use, result=finished.result)
    assert finished == made and repr(finished) == repr(made)
    assert (finished.agent_id, finished.synthetic, finished.full_result) == (None, False, None)
    assert finished.result.content == "done: 42" and not finished.result.is_error
    assert dataclasses.replace(finished, agent_id="c").agent_id == "c"
    with pytest.raises(dataclasses.FrozenInstanceError):
        finished.synthetic = True  # type: ignore[misc]


@given(text=st.text(), limit=st.integers(min_value=1, max_value=50))
def test_a_cut_result_keeps_exactly_the_first_and_last_characters_up_to_the_limit(text: str, limit: int) -> None:
    block = ToolResultBlock(tool_use_id="t", content=text, is_error=True)
    if len(text) <= limit:
        return
    cut = cut_result(block, limit, "<{cut}/{total}>")
    assert cut.is_error and isinstance(cut.content, str)
    head, tail = (limit + 1) // 2, limit // 2
    note = f"<{len(text) - limit:,}/{len(text):,}>"
    assert cut.content == "\n\n".join(p for p in (text[:head], note, text[len(text) - tail :] if tail else "") if p)


async def test_a_tool_that_returns_a_process_result_gives_the_output_once_as_json() -> None:
    # The raw-bytes fields repeated stdout and stderr (twice the size in every later request),
    # and output that is not UTF-8 turned the whole result into a Python repr.
    @tool
    async def sh(code: str, ctx: ToolContext) -> Any:
        """Run Python code."""
        return await run_process(sys.executable, "-c", code, signal=ctx.signal)

    calls = [ScriptedToolCall("sh", {"code": "print('hello' * 3)"}),
             ScriptedToolCall("sh", {"code": "import sys; sys.stdout.buffer.write(b'caf\\xe9')"})]  # fmt: skip
    engine = QueryEngine(ScriptedModel([ScriptedResponse(tool_calls=calls), "ok"]), tools=[sh], policies=[])
    results = [e.result for e in await collect(engine, "go") if isinstance(e, ToolCallFinished)]
    first, second = (json.loads(r.text) for r in results)
    assert first["stdout"] == "hellohellohello\n" and first["returncode"] == 0
    assert results[0].text.count("hellohellohello") == 1
    assert second["stdout"] == "caf\ufffd"
    assert not {k for k in (*first, *second) if k.endswith("_bytes")}


async def test_process_results_returned_inside_a_dict_or_list_give_each_output_once() -> None:
    # Only a ProcessResult returned as it is lost its raw bytes: one in a dict (a lint run and a
    # test run reported together) repeated each output, and bytes not UTF-8 became a b'...' repr.
    @tool
    async def check(ctx: ToolContext) -> Any:
        """Lint and test."""
        lint = await run_process(sys.executable, "-c", "print('lint', 'ok')", signal=ctx.signal)
        test = await run_process(sys.executable, "-c", "import sys; sys.stdout.buffer.write(b'caf\\xe9')", signal=ctx.signal)
        return {"lint": lint, "runs": [test]}

    engine = QueryEngine(ScriptedModel([ScriptedResponse(tool_calls=[ScriptedToolCall("check", {})]), "ok"]), tools=[check], policies=[])
    [result] = [e.result for e in await collect(engine, "go") if isinstance(e, ToolCallFinished)]
    got = json.loads(result.text)
    assert result.text.count("lint ok") == 1
    assert got["lint"]["stdout"] == "lint ok\n" and got["runs"][0]["stdout"] == "caf\ufffd"
    assert not {k for r in (got["lint"], got["runs"][0]) for k in r if k.endswith("_bytes")}


async def test_a_process_run_from_a_path_gives_its_output_not_an_unusable_result(tmp_path: Path) -> None:
    # ``run_process(sys.executable, tmp_path / "x.py")``: the args kept the Path, which JSON cannot
    # hold, so the tool returning the result got "returned an unusable result" and no output.
    script = tmp_path / "hello.py"
    script.write_text("import sys; print('hi', sys.argv[1:])")

    @tool
    async def run(ctx: ToolContext) -> Any:
        """Run the script."""
        return await run_process(Path(sys.executable), script, b"raw", signal=ctx.signal)

    engine = QueryEngine(ScriptedModel([ScriptedResponse(tool_calls=[ScriptedToolCall("run", {})]), "ok"]), tools=[run], policies=[])
    [result] = [e.result for e in await collect(engine, "go") if isinstance(e, ToolCallFinished)]
    assert not result.is_error, result.text
    got = json.loads(result.text)
    assert got["stdout"] == "hi ['raw']\n"
    assert got["args"] == [sys.executable, str(script), "raw"]  # the command as run, as text


_TYPE_CHECKING_ONLY = '''
from __future__ import annotations
from typing import TYPE_CHECKING
from agentloop import tool
if TYPE_CHECKING:
    from agentloop import ToolContext

@tool
async def where(path: str, ctx: ToolContext) -> str:
    """Says where the call runs."""
    return f"{path} in {ctx.tool_use_id}"
'''


def test_a_tool_context_imported_only_for_type_checking_is_still_the_context() -> None:
    namespace: dict[str, Any] = {"__name__": "tools_module"}
    exec(_TYPE_CHECKING_ONLY, namespace)
    made = namespace["where"]
    assert made.input_schema["properties"].keys() == {"path"}  # the context is injected, not asked of the model

    async def main() -> str:
        engine = QueryEngine(
            ScriptedModel([ScriptedResponse(tool_calls=[ScriptedToolCall("where", {"path": "a.py"}, id="c1")]), "ok"]),
            tools=[made],
        )
        results = [e.result for e in [e async for e in engine.run("go")] if isinstance(e, ToolCallFinished)]
        return str(results[0].content)

    assert "a.py in c1" in asyncio.run(main())


def test_an_annotation_naming_something_undefined_is_a_clear_type_error() -> None:
    source = _TYPE_CHECKING_ONLY.replace("path: str", "path: Missing")
    with pytest.raises(TypeError, match=r"cannot resolve the annotations of 'where': name 'Missing' is not defined"):
        exec(source, {"__name__": "tools_module"})


async def _fetch() -> str:
    return "fetched"


@tool
async def forgets_await() -> Any:
    """Returns the coroutine instead of its result."""
    return _fetch()


def test_a_tool_that_returns_a_coroutine_gets_an_error_result_naming_the_missing_await() -> None:
    async def main() -> list[ToolCallFinished]:
        engine = QueryEngine(
            ScriptedModel([ScriptedResponse(tool_calls=[ScriptedToolCall("forgets_await", {})]), "ok"]),
            tools=[forgets_await],
        )
        events = [e async for e in engine.run("go")]
        assert validate_transcript(engine.messages) == []
        return [e for e in events if isinstance(e, ToolCallFinished)]

    with warnings.catch_warnings():
        warnings.simplefilter("error")  # the coroutine is closed, never left "never awaited"
        (finished,) = asyncio.run(main())
        gc.collect()
    assert finished.result.is_error
    assert "returned an unusable result: a coroutine object, not its result (is an await missing?)" in str(
        finished.result.content
    )


async def test_a_call_that_finishes_at_its_first_step_is_received_in_the_same_loop_pass() -> None:
    # The tool phase's first wait lets the calls it just started take their first step before it
    # waits on a future: a call that needs no await (most quick tools) is received at once, not
    # one pass of the event loop later. The callback the call schedules before it finishes runs
    # at the next pass: the wait was over before it.
    loop = asyncio.get_running_loop()
    box = Mailbox()
    order: list[str] = []

    async def call() -> None:
        loop.call_soon(order.append, "next pass")
        box.put("done")

    task = loop.create_task(call())
    box.fresh = True
    assert await box.get() == ["done"]
    order.append("received")
    await task
    await asyncio.sleep(0)
    assert order == ["received", "next pass"]


async def test_a_call_still_running_after_its_first_step_is_waited_for() -> None:
    # The first wait gives the calls one step only; one still running is then waited for.
    box = Mailbox()
    go = asyncio.Event()

    async def call() -> None:
        await go.wait()
        box.put("done")

    task = asyncio.get_running_loop().create_task(call())
    box.fresh = True
    getting = asyncio.ensure_future(box.get())
    await asyncio.sleep(0)
    await asyncio.sleep(0)
    assert not getting.done()
    go.set()
    assert await getting == ["done"]
    await task


async def test_a_hand_made_tool_whose_handler_cannot_be_awaited_says_how_to_write_it() -> None:
    """A handler that is not callable failed only when the model called it; a plain sync function
    gave the model "object str can't be used in 'await' expression". The first is refused when
    the tool is made; the second (a sync def returning an awaitable is a handler too, so it cannot
    be told there) gets a result saying to write it with async def."""
    with pytest.raises(TypeError, match=r"handler takes an async function \(input, ctx\)"):
        Tool("x", "d", {"type": "object"}, "not a function")  # type: ignore[arg-type]

    async def agen(input: dict[str, Any], ctx: ToolContext) -> AsyncIterator[str]:
        yield "x"

    with pytest.raises(TypeError, match=r"async generator"):
        Tool("x", "d", {"type": "object"}, agen)  # type: ignore[arg-type]

    def sync(input: dict[str, Any], ctx: ToolContext) -> str:
        return "done"

    def raises(input: dict[str, Any], ctx: ToolContext) -> str:
        raise TypeError("bad arguments")

    tools = [Tool(n, "d", {"type": "object"}, h) for n, h in (("sync", sync), ("raises", raises))]  # type: ignore[arg-type]
    script = ScriptedResponse(tool_calls=[ScriptedToolCall("sync", {}), ScriptedToolCall("raises", {})])
    engine = QueryEngine(ScriptedModel([script, "ok"]), tools=tools, policies=[])
    await collect(engine, "go")
    got = [r.text for m in engine.messages for r in m.tool_results]
    assert got[0] == (
        "Tool 'sync' has a handler that returned str, not an awaitable: "
        "its handler must be an async def (or return an awaitable)."
    )
    assert got[1] == "Tool 'raises' raised TypeError: bad arguments"  # its own TypeError is its own


def test_tool_says_what_to_do_with_an_object_whose_call_is_async() -> None:
    class Search:
        async def __call__(self, q: str) -> str:
            """Search for q."""
            return q

    with pytest.raises(TypeError, match=r"tool\(name='search'\)\(obj.__call__\)"):
        tool(Search())
    made = tool(name="search")(Search().__call__)  # what the message says works
    assert made.description == "Search for q." and list(made.input_schema["properties"]) == ["q"]


class _KeyedModel(ScriptedModel):
    """A scripted model holding a credential, as an HTTP provider does; counts its reads."""

    reads = 0

    def _credentials(self) -> tuple[str, ...]:
        self.reads += 1
        return ("sk-test-0123456789abcdefghij",)


async def test_the_models_credentials_are_read_once_a_run_and_redacted_from_every_result() -> None:
    @tool
    async def env(n: int) -> str:
        """Print the environment."""
        return f"{n}: API_KEY=sk-test-0123456789abcdefghij"

    calls = [ScriptedResponse(tool_calls=[ScriptedToolCall("env", {"n": i})]) for i in range(3)]
    model = _KeyedModel([*calls, "done"])
    engine = QueryEngine(model, tools=[env], policies=[])
    events = await collect(engine, "go")
    texts = [e.result.text for e in events if isinstance(e, ToolCallFinished)]
    assert texts == [f"{i}: API_KEY=[REDACTED]" for i in range(3)]
    assert model.reads == 1  # not once per tool batch: an HTTP model collects them from its headers
