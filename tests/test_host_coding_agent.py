"""A coding-agent host written from the docs, driven as a chat UI drives it.

The host runs the Anthropic and the OpenAI Responses providers against mock servers that refuse
what the real APIs refuse (tests/host_wire.py), with four tools (a parallel-safe read, a write
that needs permission, a shell over `run_process`, a linter that crashes). The user interrupts at
awkward moments, steers while tools run, redirects while the model streams, queues follow-ups,
and the session is saved and resumed on the other provider. After every run: the transcript is
valid, the next request is accepted, no response, task or process is left, no key is shown.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import os
import select
import sys
from collections.abc import AsyncIterator, Callable
from pathlib import Path
from typing import Any

import pytest

from agentloop import (
    Allow,
    Deny,
    Event,
    InterjectionInjected,
    Message,
    ProcessResult,
    QueryEngine,
    Tool,
    ToolCallFinished,
    ToolCallStarted,
    ToolContext,
    ToolUseBlock,
    TurnEnded,
    TurnStarted,
    event_json,
    run_process,
    tool,
    validate_transcript,
)
from agentloop.models import AnthropicModel, OpenAIResponsesModel
from agentloop.sessions import JsonlSession
from tests.host_wire import AnthropicServer, Call, Reply, ResponsesServer, _Server

ANTHROPIC_KEY = "sk-ant-api03-hostA-never-shown-7d1f"
OPENAI_KEY = "sk-proj-hostA-never-shown-42c9"
KEYS = (ANTHROPIC_KEY, OPENAI_KEY)

BUGGY = "def add(a, b):\n    return a - b\n"
FIXED = "def add(a, b):\n    return a + b\n"
TEST = "from calc import add\nassert add(2, 3) == 5\nprint('1 passed')\n"


def make_tools(workspace: Path) -> list[Tool]:
    """The host's tools, over a workspace directory."""

    @tool(concurrency_safe=True)
    async def read_file(path: str) -> str:
        """Read a file of the workspace."""
        return (workspace / path).read_text(encoding="utf-8")

    @tool
    async def write_file(path: str, content: str) -> str:
        """Write a file of the workspace (asks the user first)."""
        (workspace / path).write_text(content, encoding="utf-8")
        return f"wrote {len(content)} characters to {path}"

    @tool(timeout=30)
    async def shell(command: str, ctx: ToolContext) -> ProcessResult:
        """Run a shell command in the workspace."""
        return await run_process("/bin/sh", "-c", command, signal=ctx.signal, cwd=workspace)

    @tool
    async def lint() -> str:
        """Lint the workspace."""
        raise RuntimeError("linter crashed: no configuration found")

    return [read_file, write_file, shell, lint]


class Host:
    """The chat UI: one engine, a permission prompt, an event log, and the checks after a run."""

    def __init__(self, server: _Server, model: Any, workspace: Path, **options: Any) -> None:
        self.server = server
        self.model = model
        self.prompt_open = asyncio.Event()
        self.answer: asyncio.Future[Allow | Deny] | None = None
        self.asked: list[str] = []
        self.log: list[str] = []
        self.pressing: asyncio.Future[None] | None = None
        self.engine = QueryEngine(model, tools=make_tools(workspace), permission=self.permission,
                                  system="You are a careful coding agent.", **options)

    async def permission(self, use: ToolUseBlock, ctx: ToolContext) -> Allow | Deny:
        self.asked.append(use.name)
        if use.name != "write_file":
            return Allow()
        if self.answer is None:
            return Allow()
        return await self.answer  # the user has not answered yet

    async def drive(self, prompt: str | None, react: Callable[[Event], Any] | None = None) -> list[Event]:
        events: list[Event] = []
        async with contextlib.aclosing(self.engine.run(prompt)) as run:
            async for event in run:
                self.log.append(event_json(event))
                events.append(event)
                if react is not None:
                    outcome = react(event)
                    if asyncio.iscoroutine(outcome):
                        await outcome
        await self.settled()
        return events

    async def settled(self) -> None:
        """What must hold whenever a run has ended."""
        assert validate_transcript(self.engine.messages) == []
        assert self.server.rejections == []
        assert self.server.open_responses == 0
        for line in self.log:
            json.loads(line)
            assert not any(key in line for key in KEYS)
        me = asyncio.current_task()
        for _ in range(3):
            await asyncio.sleep(0)
        assert [t for t in asyncio.all_tasks() if t is not me and not t.done()] == []

    async def next_request_accepted(self) -> None:
        """The request after this transcript: the server takes it."""
        self.server.replies.append(Reply(text="Nothing else to do."))
        events = await self.drive("Anything else?")
        assert events[-1].type == "turn_ended" and events[-1].reason == "completed"


def exits_soon(pid: int) -> bool:
    """True once ``pid`` has exited (waited for on a pidfd, up to 5 s). run_process returns when
    the group has let go of its pipes and been sent SIGKILL: a grandchild may still be on its way
    out of the kernel then, for microseconds."""
    try:
        fd = os.pidfd_open(pid)
    except ProcessLookupError:
        return True
    try:
        return bool(select.select([fd], [], [], 5)[0])
    finally:
        os.close(fd)


def last_user_text(body: dict[str, Any]) -> str:
    """The text of an Anthropic request's last user message."""
    content = body["messages"][-1]["content"]
    if isinstance(content, str):
        return content
    return "".join(b.get("text", "") for b in content if b["type"] == "text")


@pytest.fixture
def workspace(tmp_path: Path) -> Path:
    root = tmp_path / "repo"
    root.mkdir()
    (root / "calc.py").write_text(BUGGY, encoding="utf-8")
    (root / "test_calc.py").write_text(TEST, encoding="utf-8")
    return root


@contextlib.asynccontextmanager
async def anthropic_host(workspace: Path, replies: list[Reply], **options: Any) -> AsyncIterator[Host]:
    server = AnthropicServer(ANTHROPIC_KEY, replies)
    async with server.client() as client:
        model = AnthropicModel("claude-opus-4-7", api_key=ANTHROPIC_KEY, http_client=client)
        yield Host(server, model, workspace, **options)


@contextlib.asynccontextmanager
async def responses_host(workspace: Path, replies: list[Reply], **options: Any) -> AsyncIterator[Host]:
    server = ResponsesServer(OPENAI_KEY, replies)
    async with server.client() as client:
        model = OpenAIResponsesModel("gpt-5", api_key=OPENAI_KEY, http_client=client)
        yield Host(server, model, workspace, **options)


# -- a whole task, steered and followed up ------------------------------------------------------


def fix_the_bug_script() -> list[Reply]:
    return [
        Reply(text="Let me read the code and its test.",
              calls=[Call("read_file", {"path": "calc.py"}), Call("read_file", {"path": "test_calc.py"})]),
        Reply(text="`add` subtracts. Fixing it.", calls=[Call("write_file", {"path": "calc.py", "content": FIXED})]),
        Reply(calls=[Call("shell", {"command": f"{sys.executable} test_calc.py"})]),
        Reply(calls=[Call("lint", {})]),
        Reply(text="Fixed `add`; the test passes. The linter crashed, so it did not run."),
        Reply(text="In short: one character, `-` to `+`."),
    ]


async def test_a_coding_task_steered_while_tools_run_and_followed_up(workspace: Path) -> None:
    async with anthropic_host(workspace, fix_the_bug_script()) as host:
        receipts: dict[str, str] = {}

        def react(event: Event) -> None:
            if isinstance(event, ToolCallStarted) and "steer" not in receipts:
                receipts["steer"] = host.engine.interject("Keep the public API unchanged.")
            if event.type == "text_delta" and "follow" not in receipts:
                receipts["follow"] = host.engine.follow_up("Summarise the fix in one line.")

        events = await host.drive("Fix the failing test.", react)

    finished = {e.tool_use.name: e.result for e in events if isinstance(e, ToolCallFinished)}
    assert (workspace / "calc.py").read_text(encoding="utf-8") == FIXED
    assert "1 passed" in finished["shell"].text and not finished["shell"].is_error
    assert finished["lint"].is_error and "linter crashed" in finished["lint"].text
    injected = [e for e in events if isinstance(e, InterjectionInjected)]
    assert [e.ids for e in injected] == [(receipts["steer"],)]
    # The steer reached the model in the request after the reads, behind their results.
    assert "Keep the public API unchanged." in last_user_text(host.server.bodies[1])
    assert host.server.bodies[1]["messages"][-1]["content"][0]["type"] == "tool_result"
    started = [e for e in events if isinstance(e, TurnStarted)]
    assert len(started) == 2 and started[1].ids == (receipts["follow"],)
    ended = [e for e in events if isinstance(e, TurnEnded)]
    assert [e.reason for e in ended] == ["completed", "completed"]
    assert host.asked.count("write_file") == 1
    assert host.engine.messages[-1].text == "In short: one character, `-` to `+`."


# -- interrupts at awkward moments --------------------------------------------------------------


async def test_an_interrupt_while_the_answer_streams_keeps_the_partial_text(workspace: Path) -> None:
    replies = [Reply(text="Here is my long plan for the refactor, step by step: first...", stall_after=3)]
    async with anthropic_host(workspace, replies) as host:

        def react(event: Event) -> None:
            if event.type == "text_delta":
                host.engine.interrupt()

        events = await host.drive("Plan the refactor.", react)
        assert events[-1].type == "turn_ended" and events[-1].reason == "aborted_streaming"
        assert host.server.streams[0].closed
        partial = host.engine.messages[1]
        assert partial.partial and partial.text == "Here is"  # shown: "Here is ", trailing space trimmed
        assert host.engine.messages[-1].kind == "interrupt_notice"
        await host.next_request_accepted()


async def test_an_interrupt_while_a_call_streams_leaves_the_call_out(workspace: Path) -> None:
    replies = [Reply(text="Writing it.", calls=[Call("write_file", {"path": "calc.py", "content": FIXED})],
                     stall_after=4)]
    async with anthropic_host(workspace, replies) as host:

        def react(event: Event) -> None:
            if event.type == "tool_input_delta":
                host.engine.interrupt()

        events = await host.drive("Fix calc.py.", react)
        assert events[-1].type == "turn_ended" and events[-1].reason == "aborted_streaming"
        assert all(not m.tool_uses for m in host.engine.messages)
        assert host.engine.messages[1].text == "Writing it."
        assert (workspace / "calc.py").read_text(encoding="utf-8") == BUGGY
        await host.next_request_accepted()


async def test_an_interrupt_during_the_permission_prompt(workspace: Path) -> None:
    replies = [Reply(text="Reading, then writing.", calls=[
        Call("read_file", {"path": "calc.py"}), Call("write_file", {"path": "calc.py", "content": FIXED})])]
    async with anthropic_host(workspace, replies) as host:
        host.answer = asyncio.get_running_loop().create_future()  # the user never answers

        def react(event: Event) -> None:
            if event.type == "permission_requested" and event.tool_use.name == "write_file":
                host.engine.interrupt()

        events = await host.drive("Fix calc.py.", react)
        assert events[-1].type == "turn_ended" and events[-1].reason == "aborted_tools"
        read, write = host.engine.messages[2].tool_results
        assert not read.is_error and read.text == BUGGY
        assert write.is_error and "never started" in write.text
        assert (workspace / "calc.py").read_text(encoding="utf-8") == BUGGY
        host.answer = None
        await host.next_request_accepted()


async def test_an_interrupt_while_a_process_runs_kills_its_group(workspace: Path, tmp_path: Path) -> None:
    fifo = tmp_path / "started"
    os.mkfifo(fifo)
    # The shell starts a grandchild that reports its pid, then waits; the group dies together.
    command = f"{sys.executable} -c \"import os, time; open('{fifo}', 'w').write(str(os.getpid())); time.sleep(60)\" & wait"
    replies = [Reply(text="Running the tests.", calls=[Call("shell", {"command": command})])]
    async with responses_host(workspace, replies) as host:
        pids: list[int] = []

        async def react(event: Event) -> None:
            if isinstance(event, ToolCallStarted):
                pids.append(int(await asyncio.to_thread(fifo.read_text)))
                host.engine.interrupt()

        events = await host.drive("Run the tests.", react)
        assert events[-1].type == "turn_ended" and events[-1].reason == "aborted_tools"
        result = host.engine.messages[2].tool_results[0]
        assert result.is_error and "stopped while it was running" in result.text
        assert exits_soon(pids[0])
        await host.next_request_accepted()


async def test_send_now_while_the_model_streams_redirects_the_turn(workspace: Path) -> None:
    replies = [Reply(text="I will now rewrite the whole module from scratch, starting with", stall_after=2),
               Reply(text="Only the test, then: it fails on add(2, 3).")]
    async with responses_host(workspace, replies) as host:
        receipt: list[str] = []

        def react(event: Event) -> None:
            if event.type == "text_delta" and not receipt:
                receipt.append(host.engine.send_now("Stop. Just tell me why the test fails."))

        events = await host.drive("Improve calc.py.", react)
        assert [e.reason for e in events if isinstance(e, TurnEnded)] == ["aborted_streaming", "completed"]
        assert [e.ids for e in events if isinstance(e, TurnStarted)][1] == (receipt[0],)
        assert [m.role for m in host.engine.messages] == ["user", "assistant", "user", "assistant"]
        assert host.engine.messages[1].partial
        second = host.server.bodies[1]["input"]
        assert second[-1]["role"] == "user" and "why the test fails" in json.dumps(second[-1])
        await host.next_request_accepted()


def interrupt_when_stalled(host: Host) -> None:
    """A stop pressed while the server is silent (the host's own timer or key press)."""

    async def press() -> None:
        await host.server.stalled.wait()
        host.engine.interrupt()

    host.pressing = asyncio.ensure_future(press())


@pytest.mark.parametrize("provider", ["anthropic", "responses"])
async def test_an_interrupt_right_after_the_reasoning_before_any_answer(provider: str, workspace: Path) -> None:
    """The reasoning is complete (signed), nothing follows it yet: the next request must not end
    an assistant turn with it (Anthropic), nor send a reasoning item alone (Responses)."""
    thinking = "The test fails because add subtracts."
    reply = Reply(thinking=thinking, text="It subtracts.", calls=[Call("read_file", {"path": "calc.py"})],
                  stall_after=len(thinking) // 8 + 1)
    opened = anthropic_host if provider == "anthropic" else responses_host
    async with opened(workspace, [reply]) as host:
        interrupt_when_stalled(host)
        events = await host.drive("Why does the test fail?")
        await host.pressing
        assert events[-1].type == "turn_ended" and events[-1].reason == "aborted_streaming"
        assert any(e.type == "thinking_delta" for e in events)
        assert not any(e.type == "text_delta" for e in events)
        await host.next_request_accepted()


async def test_a_host_that_stops_iterating_mid_stream_leaves_no_response_open(workspace: Path) -> None:
    replies = [Reply(text="A very long answer that the user will not wait for.", stall_after=2)]
    async with responses_host(workspace, replies) as host:
        run = host.engine.run("Explain everything.")
        async for event in run:
            host.log.append(event_json(event))
            if event.type == "text_delta":
                break
        await run.aclose()
        assert host.server.streams[0].closed
        await host.settled()
        last = host.engine.messages[-1]
        assert last.partial and last.meta["abort_reason"] == "consumer_closed"  # no notice
        await host.next_request_accepted()


@pytest.mark.parametrize("provider", ["anthropic", "responses"])
async def test_continue_after_stopping_mid_stream(provider: str, workspace: Path) -> None:
    """A "continue" button after the host stopped iterating mid-answer: the transcript ends with
    the partial answer, so `run()` needs a prompt, and says so."""
    replies = [Reply(text="A very long answer that the user will not wait for.", stall_after=2),
               Reply(text="...and that is the rest of it.")]
    opened = anthropic_host if provider == "anthropic" else responses_host
    async with opened(workspace, replies) as host:
        async with contextlib.aclosing(host.engine.run("Explain everything.")) as run:
            async for event in run:
                if event.type == "text_delta":
                    break
        await host.settled()
        with pytest.raises(ValueError, match="needs a prompt"):
            await host.drive(None)
        events = await host.drive("continue")
        assert events[-1].type == "turn_ended" and events[-1].reason == "completed"
        await host.next_request_accepted()


@pytest.mark.parametrize("provider", ["anthropic", "responses"])
async def test_a_follow_up_an_interrupt_held_back_starts_the_next_run(provider: str, workspace: Path) -> None:
    replies = [Reply(text="Working on the first thing, slowly.", stall_after=2), Reply(text="Second thing done.")]
    opened = anthropic_host if provider == "anthropic" else responses_host
    async with opened(workspace, replies) as host:
        receipt: list[str] = []

        def react(event: Event) -> None:
            if event.type == "text_delta" and not receipt:
                receipt.append(host.engine.follow_up("Then do the second thing."))
                host.engine.interrupt()

        events = await host.drive("Do the first thing.", react)
        assert [e.reason for e in events if isinstance(e, TurnEnded)] == ["aborted_streaming"]
        events = await host.drive(None)
        started = [e for e in events if isinstance(e, TurnStarted)]
        assert [e.ids for e in started] == [(receipt[0],)]
        assert host.engine.messages[-1].text == "Second thing done."
        await host.next_request_accepted()


async def test_steer_and_redirect_during_the_permission_prompt(workspace: Path) -> None:
    """The user types while the prompt waits: a steer, then a send-now that replaces the turn."""
    replies = [Reply(text="Writing.", calls=[Call("write_file", {"path": "calc.py", "content": FIXED})]),
               Reply(text="Fine, I will leave calc.py alone.")]
    async with anthropic_host(workspace, replies) as host:
        host.answer = asyncio.get_running_loop().create_future()
        receipts: list[str] = []

        def react(event: Event) -> None:
            if event.type == "permission_requested":
                receipts.append(host.engine.interject("Mind the docstring."))
                receipts.append(host.engine.send_now("Actually, do not touch calc.py."))

        events = await host.drive("Fix calc.py.", react)
        assert [e.reason for e in events if isinstance(e, TurnEnded)] == ["aborted_tools", "completed"]
        dropped = [e for e in events if e.type == "interjection_dropped"]
        injected = [e for e in events if isinstance(e, InterjectionInjected)]
        assert [e.ids for e in dropped] + [e.ids for e in injected] == [(receipts[0],)]
        assert (workspace / "calc.py").read_text(encoding="utf-8") == BUGGY
        assert "do not touch calc.py" in last_user_text(host.server.bodies[1])
        host.answer = None
        await host.next_request_accepted()


async def test_an_interrupt_from_another_thread_while_tools_run(workspace: Path) -> None:
    replies = [Reply(calls=[Call("read_file", {"path": "calc.py"}),
                            Call("shell", {"command": "sleep 30"})])]
    async with responses_host(workspace, replies) as host:

        async def react(event: Event) -> None:
            if isinstance(event, ToolCallStarted) and event.tool_use.name == "shell":
                await asyncio.to_thread(host.engine.interrupt)  # a signal handler, a UI thread

        events = await host.drive("Read, then wait.", react)
        assert events[-1].type == "turn_ended" and events[-1].reason == "aborted_tools"
        read, shell = host.engine.messages[2].tool_results
        assert read.text == BUGGY and shell.is_error
        await host.next_request_accepted()


# -- saved, resumed on the other provider -------------------------------------------------------


async def test_a_session_saved_with_anthropic_resumes_with_openai_responses(workspace: Path, tmp_path: Path) -> None:
    path = tmp_path / "sessions" / "fix.jsonl"
    with JsonlSession(path) as session:
        async with anthropic_host(workspace, fix_the_bug_script()[:3], session=session) as host:
            host.answer = asyncio.get_running_loop().create_future()

            def react(event: Event) -> None:
                if event.type == "permission_requested":
                    host.engine.interrupt()

            await host.drive("Fix the failing test.", react)
            host.answer = None
            await host.drive("Go on, you may write it.")
            saved = list(host.engine.messages)
    assert not any(key in path.read_text(encoding="utf-8") for key in KEYS)

    session, loaded = JsonlSession.resume(path)
    assert loaded.repairs == [] and loaded.warnings == []
    assert [m.model_dump() for m in loaded.messages] == [m.model_dump() for m in saved]
    with session:
        async with responses_host(workspace, [Reply(text="The fix is in; the test passes.")],
                                  session=session, messages=loaded.messages) as host:
            events = await host.drive("Where are we?")
            assert events[-1].type == "turn_ended" and events[-1].reason == "completed"
            items = host.server.bodies[0]["input"]
            outputs = [i for i in items if i.get("type") == "function_call_output"]
            assert len(outputs) == sum(len(m.tool_uses) for m in saved)
            await host.next_request_accepted()
            final = list(host.engine.messages)
    again = JsonlSession(path).load()
    assert [m.model_dump() for m in again.messages] == [m.model_dump() for m in final]


# -- keys ----------------------------------------------------------------------------------------


async def test_a_refused_key_is_never_shown(workspace: Path, caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.DEBUG)
    server = AnthropicServer("sk-ant-the-right-one", [])
    async with server.client() as client:
        model = AnthropicModel("claude-opus-4-7", api_key=ANTHROPIC_KEY, http_client=client)
        host = Host(server, model, workspace)
        events: list[Event] = []
        async for event in host.engine.run("Hi"):
            host.log.append(event_json(event))
            events.append(event)
    ended = events[-1]
    assert isinstance(ended, TurnEnded) and ended.reason == "model_error"
    assert "401" in (ended.error or "")
    shown = [repr(model), str(ended.error), caplog.text, *host.log, repr(host.engine)]
    assert not any(ANTHROPIC_KEY in text for text in shown)
    assert validate_transcript(host.engine.messages) == []
    assert [m.role for m in host.engine.messages] == ["user"]
    assert Message.user("Hi").text == host.engine.messages[0].text


@pytest.mark.parametrize("provider", ["anthropic", "responses"])
async def test_a_stream_error_that_quotes_the_key_is_retried_and_never_shown(
    provider: str, workspace: Path, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.DEBUG)
    key = ANTHROPIC_KEY if provider == "anthropic" else OPENAI_KEY
    replies = [Reply(text="Half an answer, then the server fails.", stall_after=2,
                     error=f"Overloaded while serving the request with key {key}"),
               Reply(text="A whole answer.")]
    opened = anthropic_host if provider == "anthropic" else responses_host
    async with opened(workspace, replies, retry_base_delay=0, retry_max_delay=0) as host:
        events = await host.drive("Hi")
        assert [e.type for e in events if e.type in ("attempt_discarded", "retrying")] == [
            "attempt_discarded", "retrying"]
        assert events[-1].type == "turn_ended" and events[-1].reason == "completed"
        assert host.engine.messages[-1].text == "A whole answer."
        assert key not in caplog.text


async def test_a_tool_that_prints_the_key_does_not_put_it_in_the_transcript(
    workspace: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The key comes from the environment, as providers.md advises, so the shell tool's
    subprocess inherits it, and a project's `.env` may hold it: the model asks for either. The
    key must not reach the events, the transcript, the session file or the next request."""
    monkeypatch.setenv("ANTHROPIC_API_KEY", ANTHROPIC_KEY)
    (workspace / ".env").write_text(f"ANTHROPIC_API_KEY={ANTHROPIC_KEY}\n", encoding="utf-8")
    replies = [Reply(calls=[Call("shell", {"command": "printenv ANTHROPIC_API_KEY"}),
                            Call("read_file", {"path": ".env"})]),
               Reply(text="Your environment is set up.")]
    server = AnthropicServer(ANTHROPIC_KEY, replies)
    path = tmp_path / "keys.jsonl"
    with JsonlSession(path) as session:
        async with server.client() as client:
            host = Host(server, AnthropicModel("claude-opus-4-7", http_client=client), workspace, session=session)
            events = await host.drive("Is my environment set up?")
    results = [e.result.text for e in events if isinstance(e, ToolCallFinished)]
    assert len(results) == 2 and all("[REDACTED]" in text for text in results)
    assert ANTHROPIC_KEY not in json.dumps(server.bodies)
    assert ANTHROPIC_KEY not in path.read_text(encoding="utf-8")
    assert not any(ANTHROPIC_KEY in m.model_dump_json() for m in host.engine.messages)


async def test_a_gateway_token_in_a_long_tool_result_is_redacted_in_both_copies(workspace: Path) -> None:
    """A gateway's credential header counts as the key does, in a result that is cut too
    (`result` and `full_result` both)."""
    token = "gw-token-hostA-5f0e9a"
    (workspace / "build.log").write_text("x" * 300 + f" token={token} " + "y" * 300, encoding="utf-8")
    server = ResponsesServer(token, [Reply(calls=[Call("read_file", {"path": "build.log"})]), Reply(text="Read.")])
    async with server.client() as client:
        model = OpenAIResponsesModel("gpt-5", api_key="", http_client=client,
                                     extra_headers={"Authorization": f"Bearer {token}"})
        host = Host(server, model, workspace, max_tool_result_chars=200)
        events = await host.drive("Read the build log.")
    finished = next(e for e in events if isinstance(e, ToolCallFinished))
    assert finished.full_result is not None and "token=[REDACTED]" in finished.full_result.text
    assert token not in finished.result.text and token not in json.dumps(server.bodies)


async def test_an_anthropic_gateway_credential_in_extra_headers_needs_no_key(
    workspace: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """providers.md: an `x-api-key` given in `extra_headers` is sent instead of the key, so the
    model needs none (as with one set on the host's own `http_client`)."""
    monkeypatch.delenv("ANTHROPIC_API_KEY", raising=False)
    token = "gw-anthropic-hostA-77aa1c"
    server = AnthropicServer(token, [Reply(text="Hello through the gateway.")])
    async with server.client() as client:
        model = AnthropicModel("claude-opus-4-7", api_key="", http_client=client, extra_headers={"X-Api-Key": token})
        host = Host(server, model, workspace)
        events = await host.drive("Hi")
    assert events[-1].type == "turn_ended" and events[-1].reason == "completed"


async def test_switching_engine_model_mid_conversation_both_ways(workspace: Path) -> None:
    """The user picks another model between runs (`engine.model = ...`): each provider gets a
    request it accepts, its own reasoning included and the other's left out."""
    a_server = AnthropicServer(ANTHROPIC_KEY, [
        Reply(thinking="Read the file first.", text="Reading.", calls=[Call("read_file", {"path": "calc.py"})]),
        Reply(thinking="It subtracts.", text="`add` subtracts."),
        Reply(text="Back on Claude."),
    ])
    o_server = ResponsesServer(OPENAI_KEY, [
        Reply(thinking="Check the test too.", calls=[Call("read_file", {"path": "test_calc.py"})]),
        Reply(text="The test expects 5."),
    ])
    async with a_server.client() as a_client, o_server.client() as o_client:
        claude = AnthropicModel("claude-opus-4-7", api_key=ANTHROPIC_KEY, http_client=a_client, thinking=2000)
        gpt = OpenAIResponsesModel("gpt-5", api_key=OPENAI_KEY, http_client=o_client, reasoning={"effort": "low"})
        host = Host(a_server, claude, workspace)
        await host.drive("Why does the test fail?")
        host.engine.model, host.server = gpt, o_server
        await host.drive("And what does the test expect?")
        sent = o_server.bodies[0]["input"]
        assert not any(i.get("type") == "reasoning" for i in sent)  # Claude's thinking stays home
        assert any(i.get("type") == "reasoning" for i in o_server.bodies[1]["input"])  # its own goes back
        host.engine.model, host.server = claude, a_server
        events = await host.drive("Thanks.")
        assert events[-1].type == "turn_ended" and events[-1].reason == "completed"
        blocks = [b for m in a_server.bodies[-1]["messages"] if m["role"] == "assistant"
                  for b in (m["content"] if isinstance(m["content"], list) else [])]
        assert all(b.get("signature") == "EqQBCgIYAhIM" for b in blocks if b["type"] == "thinking")


async def test_a_sandboxed_write_a_failing_read_and_a_steer_dropped_by_an_interrupt(workspace: Path) -> None:
    """The permission prompt moves a write into a scratch directory; a parallel read of a missing
    file fails on its own; a steer typed while the shell runs is reported dropped when the user
    then stops the turn."""
    (workspace / "scratch").mkdir()
    replies = [
        Reply(calls=[Call("read_file", {"path": "calc.py"}), Call("read_file", {"path": "missing.py"}),
                     Call("write_file", {"path": "calc.py", "content": FIXED})]),
        Reply(calls=[Call("shell", {"command": "sleep 30"})]),
    ]
    async with responses_host(workspace, replies) as host:

        async def sandbox(use: ToolUseBlock, ctx: ToolContext) -> Allow | Deny:
            if use.name == "write_file":
                return Allow(updated_input={**use.input, "path": "scratch/" + use.input["path"]})
            return Allow()

        host.engine.permission = sandbox
        steer: list[str] = []

        def react(event: Event) -> None:
            if isinstance(event, ToolCallStarted) and event.tool_use.name == "shell":
                steer.append(host.engine.interject("Use the fast tests only."))
                host.engine.interrupt()

        events = await host.drive("Fix calc.py safely.", react)
        results = {e.tool_use.id: e for e in events if isinstance(e, ToolCallFinished)}
        read_ok, read_missing, write, shell = results.values()
        assert read_ok.result.text == BUGGY and read_missing.result.is_error
        assert "FileNotFoundError" in read_missing.result.text
        assert write.updated_input == {"path": "scratch/calc.py", "content": FIXED}
        assert (workspace / "scratch" / "calc.py").read_text(encoding="utf-8") == FIXED
        assert (workspace / "calc.py").read_text(encoding="utf-8") == BUGGY
        assert shell.synthetic and shell.result.is_error
        dropped = [e for e in events if e.type == "interjection_dropped"]
        assert [e.ids for e in dropped] == [(steer[0],)]
        await host.next_request_accepted()


def short_task() -> list[Reply]:
    return [
        Reply(thinking="The test imports add; read both files first.", text="Reading both.", chunk=40,
              calls=[Call("read_file", {"path": "calc.py"}), Call("read_file", {"path": "test_calc.py"})]),
        Reply(thinking="add subtracts; fix it, then test and lint.", chunk=40, calls=[Call("write_file", {"path": "calc.py", "content": FIXED}),
                               Call("shell", {"command": "echo 1 passed"}), Call("lint", {})]),
        Reply(text="Done.", chunk=40),
    ]


async def control_at(provider: str, workspace: Path, action: str, at: int | None) -> int:
    """Run the short task, doing ``action`` at event number ``at``; return how many events came."""
    (workspace / "calc.py").write_text(BUGGY, encoding="utf-8")
    opened = anthropic_host if provider == "anthropic" else responses_host
    async with opened(workspace, [*short_task(), Reply(text="Redirected.")]) as host:
        if provider == "anthropic":
            host.model.thinking = {"type": "enabled", "budget_tokens": 2000}
        count = 0

        def react(event: Event) -> None:
            nonlocal count
            if count == at:
                if action == "interrupt":
                    host.engine.interrupt()
                elif action == "send_now":
                    host.engine.send_now("Stop and explain instead.")
                else:
                    host.engine.interject("Keep the API.")
            count += 1

        await host.drive("Fix the test.", react)
        await host.next_request_accepted()
    return count


@pytest.mark.parametrize("action", ["interrupt", "send_now", "interject"])
@pytest.mark.parametrize("provider", ["anthropic", "responses"])
async def test_a_control_call_at_every_event_of_a_task(provider: str, action: str, workspace: Path) -> None:
    """Whatever event the user acts at, the transcript is valid and the next request accepted
    (Host.drive and next_request_accepted check both, and that nothing is left running)."""
    total = await control_at(provider, workspace, action, None)
    assert total > 20
    for at in range(total):
        await control_at(provider, workspace, action, at)


async def test_a_session_closed_right_after_the_host_broke_off_mid_tool_resumes_valid(
    workspace: Path, tmp_path: Path
) -> None:
    """The UI quits while the shell runs: it breaks out of the run and closes the session at once,
    while the run's cleanup still stops the process in the background. The file resumes to a
    valid transcript, which the next request is accepted with."""
    path = tmp_path / "quit.jsonl"
    replies = [Reply(text="Running the tests.", calls=[Call("shell", {"command": "sleep 30"})])]
    with JsonlSession(path) as session:
        async with anthropic_host(workspace, replies, session=session, tool_cancel_grace=0.2) as host:
            run = host.engine.run("Run the tests.")
            async for event in run:
                if isinstance(event, ToolCallStarted):
                    break
            await run.aclose()
            left = list(host.engine.messages)
    assert validate_transcript(left) == []
    session, loaded = JsonlSession.resume(path)
    assert loaded.repairs == []
    assert [m.model_dump() for m in loaded.messages] == [m.model_dump() for m in left]
    with session:
        async with anthropic_host(workspace, [Reply(text="The run was stopped.")], session=session,
                                  messages=loaded.messages) as host:
            events = await host.drive("What happened?")
            assert events[-1].type == "turn_ended" and events[-1].reason == "completed"


@pytest.mark.parametrize("provider", ["anthropic", "responses"])
async def test_a_rewind_that_cuts_a_tool_exchange_in_half(provider: str, workspace: Path, tmp_path: Path) -> None:
    """The UI's "edit an earlier message": the host cuts the transcript right after a call,
    before its result, and sends again. The request is accepted, and the session file replays to
    the transcript the engine went on with."""
    path = tmp_path / "rewind.jsonl"
    opened = anthropic_host if provider == "anthropic" else responses_host
    replies = [*fix_the_bug_script()[:2], Reply(text="Done."), Reply(text="Starting over, read-only.")]
    with JsonlSession(path) as session:
        async with opened(workspace, replies, session=session) as host:
            await host.drive("Fix the failing test.")
            assert host.engine.messages[1].tool_uses
            del host.engine.messages[2:]  # keep the calls, drop their results and all after
            events = await host.drive("Only read; change nothing.")
            assert events[-1].type == "turn_ended" and events[-1].reason == "completed"
            final = list(host.engine.messages)
    loaded = JsonlSession(path).load()
    assert [m.model_dump() for m in loaded.messages] == [m.model_dump() for m in final]


@pytest.mark.parametrize("moment", ["streaming", "permission", "process"])
async def test_the_consuming_task_cancelled_as_a_web_client_disconnects(moment: str, workspace: Path) -> None:
    """A web host's request handler is cancelled when its client goes away: the run stops, the
    response is closed, the process is killed, and the transcript is valid for the next request."""
    replies = {
        "streaming": [Reply(text="A long answer nobody will read to the end.", stall_after=2)],
        "permission": [Reply(calls=[Call("write_file", {"path": "calc.py", "content": FIXED})])],
        "process": [Reply(calls=[Call("shell", {"command": "sleep 30"})])],
    }[moment]
    async with anthropic_host(workspace, replies, tool_cancel_grace=0.2) as host:
        host.answer = asyncio.get_running_loop().create_future()
        reached = asyncio.Event()

        async def handler() -> None:
            async for event in host.engine.run("Go."):
                if event.type in ("text_delta", "permission_requested", "tool_call_started"):
                    reached.set()

        task = asyncio.create_task(handler())
        await reached.wait()
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task
        host.answer = None
        await host.next_request_accepted()
        assert (workspace / "calc.py").read_text(encoding="utf-8") == BUGGY


async def test_a_placeholder_key_of_a_local_server_is_not_redacted_from_tool_output(workspace: Path) -> None:
    """Local servers take any key, and their docs pass a word (`api_key="ollama"`, `"EMPTY"`):
    redacting that word would garble every tool result that mentions it."""
    (workspace / "README.md").write_text("Serve the model with ollama; set OLLAMA_HOST if EMPTY.", encoding="utf-8")
    server = ResponsesServer("ollama", [Reply(calls=[Call("read_file", {"path": "README.md"})]), Reply(text="Read.")])
    server.check_auth = lambda request: None  # type: ignore[method-assign]
    async with server.client() as client:
        for key in ("ollama", "EMPTY", "sk-no-key-required"):
            server.replies = [Reply(calls=[Call("read_file", {"path": "README.md"})]), Reply(text="Read.")]
            model = OpenAIResponsesModel("qwen3", base_url="http://localhost:11434/v1", api_key=key, http_client=client)
            host = Host(server, model, workspace)
            events = await host.drive("Read the README.")
            finished = next(e for e in events if isinstance(e, ToolCallFinished))
            assert finished.result.text == (workspace / "README.md").read_text(encoding="utf-8")


@pytest.mark.parametrize("call", ["follow_up", "interject", "send_now"])
async def test_text_typed_as_the_answer_ends_gets_its_own_turn(call: str, workspace: Path) -> None:
    """The user presses Enter just as the turn ends (at its TurnEnded): the text is answered in
    the same run, never lost."""
    replies = [Reply(text="The test fails because add subtracts."), Reply(text="Yes, one character.")]
    async with responses_host(workspace, replies) as host:
        receipt: list[str] = []

        def react(event: Event) -> None:
            if isinstance(event, TurnEnded) and not receipt:
                receipt.append(getattr(host.engine, call)("Is it a one-character fix?"))

        events = await host.drive("Why does the test fail?", react)
        assert [e.reason for e in events if isinstance(e, TurnEnded)] == ["completed", "completed"]
        # A follow-up or send-now starts its turn (TurnStarted.ids); an interjection is merged into
        # a turn of its own, which starts without a prompt (InterjectionInjected.ids).
        kind = InterjectionInjected if call == "interject" else TurnStarted
        assert receipt[0] in [i for e in events if isinstance(e, kind) for i in e.ids]
        assert host.engine.messages[-1].text == "Yes, one character."
