"""run_process: credentials on a command line, and the process group gone when it returns."""

from __future__ import annotations

import asyncio
import json
import os
import sys
from pathlib import Path
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from agentloop import (
    AbortController,
    AbortError,
    QueryEngine,
    ScriptedModel,
    ScriptedResponse,
    ScriptedToolCall,
    ToolCallFinished,
    ToolContext,
    run_process,
    tool,
)
from agentloop._process import ProcessResult
from tests.helpers import Fifo, collect, pid_alive

TOKEN = "ghp_0123456789abcdefSECRET"


def _result(*args: str) -> ProcessResult:
    return ProcessResult(args=args, returncode=0, stdout="", stderr="")


@pytest.mark.parametrize(
    ("args", "shown"),
    [
        (("gh", "--token", TOKEN, "pr", "list"), ["gh", "--token", "[REDACTED]", "pr", "list"]),
        (("gh", f"--token={TOKEN}", "pr"), ["gh", "--token=[REDACTED]", "pr"]),
        (("env", f"GITHUB_TOKEN={TOKEN}", "make"), ["env", "GITHUB_TOKEN=[REDACTED]", "make"]),
        (("curl", "-H", f"Authorization: Bearer {TOKEN}", "https://x.invalid/a"),
         ["curl", "-H", "Authorization: [REDACTED]", "https://x.invalid/a"]),
        (("git", "clone", f"https://bob:{TOKEN}@git.invalid/r.git"),
         ["git", "clone", "https://[REDACTED]@git.invalid/r.git"]),
        (("curl", f"https://x.invalid/a?api_key={TOKEN}&page=2"),
         ["curl", "https://x.invalid/a?api_key=[REDACTED]&page=2"]),
        (("mysql", f"--password={TOKEN}", "--user", "bob", "db"), ["mysql", "--password=[REDACTED]", "--user", "bob", "db"]),
        (("curl", f"https://bob:{TOKEN}@x.invalid?token={TOKEN}"), ["curl", "https://[REDACTED]@x.invalid?token=[REDACTED]"]),
        (("ls", "-la", "/tmp", "--color=auto"), ["ls", "-la", "/tmp", "--color=auto"]),
    ],
)  # fmt: skip
def test_process_result_as_json_redacts_credentials_on_the_command_line(args: tuple[str, ...], shown: list[str]) -> None:
    # The args went to the model as given: a token on a command line ended up in the transcript,
    # the session file and every later request. What is not a credential is still shown.
    result = _result(*args)
    data = result.as_json()
    assert data["args"] == shown
    assert result.args == args  # the host keeps the command as run
    assert TOKEN not in repr(result) and TOKEN not in json.dumps(data)


@given(st.text(min_size=4, alphabet=st.characters(blacklist_categories=("Cs",))))
def test_property_a_credential_option_value_never_shows(secret: str) -> None:
    for args in (("cmd", "--api-key", secret), ("cmd", f"--api-key={secret}"), ("cmd", f"API_KEY={secret}")):
        shown = _result(*args).as_json()["args"]
        assert shown[0] == "cmd" and secret not in shown[1:] and shown[-1].endswith("[REDACTED]")


async def test_a_tool_running_a_command_with_a_token_gives_the_model_no_token() -> None:
    @tool
    async def push(ctx: ToolContext) -> Any:
        """Push."""
        return await run_process(sys.executable, "-c", "print('pushed')", f"--token={TOKEN}", signal=ctx.signal)

    model = ScriptedModel([ScriptedResponse(tool_calls=[ScriptedToolCall("push", {})]), "ok"])
    engine = QueryEngine(model, tools=[push], policies=[])
    [result] = [e.result for e in await collect(engine, "go") if isinstance(e, ToolCallFinished)]
    got = json.loads(result.text)
    assert got["stdout"] == "pushed\n" and got["args"][-1] == "--token=[REDACTED]"
    assert TOKEN not in json.dumps([m.model_dump() for m in engine.messages])


# The child starts grandchildren in its group that ignore SIGTERM (and do not hold the output
# pipes), writes their pids as a line to the pipe named by its argument, then waits ignoring
# SIGTERM too.
_IGNORING = """
import signal, subprocess, sys
code = "import signal, time; signal.signal(signal.SIGTERM, signal.SIG_IGN); print('up', flush=True); time.sleep(60)"
kids = [subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE, stdin=subprocess.DEVNULL) for _ in range(4)]
for k in kids:
    k.stdout.readline()
signal.signal(signal.SIGTERM, signal.SIG_IGN)
with open(sys.argv[1], "w") as out:
    out.write(" ".join(str(k.pid) for k in kids) + "\\n")
signal.pause()
"""


async def test_an_aborted_run_process_returns_once_grandchildren_that_ignore_term_are_dead(tmp_path: Path) -> None:
    # After the abort, SIGTERM, then SIGKILL: the call returned once the child was reaped, while a
    # grandchild (which does not hold the output pipes) could still be alive for a moment.
    for i in range(3):
        ctl = AbortController()
        async with Fifo(tmp_path / f"pids{i}") as fifo:
            task = asyncio.ensure_future(run_process(sys.executable, "-c", _IGNORING, str(fifo), signal=ctl.signal, kill_grace=0.05))
            pids = [int(p) for p in (await fifo.line(within=30)).split()]
        assert all(pid_alive(p) for p in pids)
        ctl.abort("cancel")
        with pytest.raises(AbortError):
            await task
        assert [p for p in pids if pid_alive(p)] == []


async def test_no_grandchild_of_an_interrupted_tool_is_alive_when_run_returns(tmp_path: Path) -> None:
    fifo = Fifo(tmp_path / "pids")

    @tool
    async def build(ctx: ToolContext) -> Any:
        """Build."""
        return await run_process(sys.executable, "-c", _IGNORING, str(fifo), signal=ctx.signal, kill_grace=0.05)

    model = ScriptedModel([ScriptedResponse(tool_calls=[ScriptedToolCall("build", {})]), "ok"])
    engine = QueryEngine(model, tools=[build], policies=[])
    pids: list[int] = []
    async with asyncio.timeout(60), fifo:
        async for event in engine.run("go"):
            if event.type == "tool_call_started":
                pids += [int(p) for p in (await fifo.line(within=30)).split()]
                engine.interrupt()
    assert len(pids) == 4
    assert [p for p in pids if pid_alive(p)] == []



# A child that writes lines and waits, after each, for the test's answer on descriptor argv[1]:
# it goes on only once ``on_line`` has seen the line, so the lines must come as they are written.
_STEPS = r"""
import os, sys
for line in ("collecting", "[1/2] a PASSED", "[2/2] b PASSED"):
    print(line, flush=True)
    os.read(int(sys.argv[1]), 1)
sys.stdout.write("2 passed")  # the last line has no line break
"""


async def test_on_line_sees_each_line_while_the_child_runs() -> None:
    # A tool that shows progress (`ToolProgress`) had the child's output only when it had ended.
    seen: list[str] = []
    answer_r, answer_w = os.pipe()

    def on_line(line: str) -> None:
        seen.append(line)
        os.write(answer_w, b".")

    try:
        result = await asyncio.wait_for(
            run_process(
                sys.executable, "-c", _STEPS, str(answer_r), signal=AbortController().signal,
                on_line=on_line, pass_fds=(answer_r,),
            ),
            20,
        )
    finally:
        os.close(answer_w)
        os.close(answer_r)
    assert seen == ["collecting", "[1/2] a PASSED", "[2/2] b PASSED", "2 passed"]
    assert result.stdout == "collecting\n[1/2] a PASSED\n[2/2] b PASSED\n2 passed"


async def test_an_on_line_that_raises_is_raised_from_run_process_once_the_child_ended() -> None:
    def on_line(line: str) -> None:
        raise ValueError(f"cannot show {line}")

    code = "print('one', flush=True); print('two', flush=True)"
    with pytest.raises(ValueError, match="cannot show one"):
        await run_process(sys.executable, "-c", code, signal=AbortController().signal, on_line=on_line)


def test_on_line_must_be_callable() -> None:
    with pytest.raises(TypeError, match="on_line"):
        asyncio.run(run_process("true", signal=AbortController().signal, on_line="print"))  # type: ignore[arg-type]


@given(st.text(alphabet="ab\n\u00e9", max_size=40), st.lists(st.integers(1, 8), max_size=10))
def test_property_on_line_gets_the_output_line_by_line_however_it_is_read(text: str, sizes: list[int]) -> None:
    from agentloop._process import _Lines

    seen: list[str] = []
    lines = _Lines(seen.append)
    data, i = text.encode(), 0
    for size in sizes:  # reads cut anywhere, inside a character too
        lines.feed(data[i : i + size])
        i += size
    lines.feed(data[i:])
    lines.feed(b"", final=True)
    assert seen == text.removesuffix("\n").split("\n") if text else seen == []


async def test_a_second_cancel_during_the_group_kill_is_raised_only_once_the_kill_is_over(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # A cancellation arriving while the cancelled call killed its group came out at once, the kill
    # going on behind it: the caller saw the cancel with the group still alive.
    from agentloop import _process

    real = _process._kill_group
    entered, release = asyncio.Event(), asyncio.Event()
    done: list[int] = []

    async def slow_kill(pgid: int, proto: Any, grace: float) -> None:
        entered.set()
        await release.wait()
        await real(pgid, proto, grace)
        done.append(pgid)

    monkeypatch.setattr(_process, "_kill_group", slow_kill)
    code = "import time; print('up', flush=True); time.sleep(30)"
    up = asyncio.Event()
    task = asyncio.ensure_future(
        run_process(sys.executable, "-c", code, signal=AbortController().signal, on_line=lambda _: up.set())
    )
    await up.wait()
    task.cancel()
    await entered.wait()
    task.cancel()  # a second one, during the kill
    for _ in range(20):
        await asyncio.sleep(0)
    assert not task.done()
    release.set()
    with pytest.raises(asyncio.CancelledError):
        await task
    assert len(done) == 1
    assert not pid_alive(done[0])
