"""The demo's pretend project and the tools the agent uses on it.

The files live in memory (`Project`), so the demo never touches the user's
disk; ``run_tests`` is nevertheless a real subprocess started through
`agentloop.run_process`: a small Python program that receives the project's
sources on stdin, runs every ``test_*`` function in ``test_utils.py`` and prints
its progress with pauses, so an interrupt really kills a running process group.
Each line it prints is sent to the host as it comes, a `ToolProgress` (as is
what ``ci_status`` asks): how a tool shows the host its progress.
"""

from __future__ import annotations

import asyncio
import json
import sys

from .._events import ToolProgress
from .._messages import ToolUseBlock
from .._process import run_process
from .._tools import Allow, Deny, PermissionCallback, Tool, ToolContext, tool

__all__ = ["Project", "make_permission", "make_tools"]

_UTILS = '''def slugify(title: str) -> str:
    """'Hello World' -> 'hello-world'."""
    return title.strip().lower()
'''

_TESTS = '''from utils import slugify


def test_slugify_spaces():
    assert slugify("Hello World") == "hello-world"


def test_slugify_strip():
    assert slugify("  Tidy  ") == "tidy"
'''

_README = "# slugs\n\nA tiny library that turns titles into URL slugs.\n"

# The test runner: sources arrive as JSON on stdin; argv[1] is the pause (s).
_RUNNER = r"""
import json, sys, time, types
files = json.loads(sys.stdin.read())
pause = float(sys.argv[1])
print("collecting tests ...", flush=True)
time.sleep(pause)
utils = types.ModuleType("utils")
exec(files["utils.py"], utils.__dict__)
sys.modules["utils"] = utils
tests = types.ModuleType("test_utils")
exec(files["test_utils.py"], tests.__dict__)
names = sorted(n for n in vars(tests) if n.startswith("test_"))
failed = 0
for i, name in enumerate(names, 1):
    time.sleep(pause)
    try:
        getattr(tests, name)()
        print(f"[{i}/{len(names)}] {name} PASSED", flush=True)
    except AssertionError:
        failed += 1
        print(f"[{i}/{len(names)}] {name} FAILED: assert slugify(...) returned the wrong slug", flush=True)
time.sleep(pause)
print(f"{failed} failed, {len(names) - failed} passed" if failed else f"{len(names)} passed", flush=True)
sys.exit(1 if failed else 0)
"""


class Project:
    """In-memory files of a tiny Python project with one failing test."""

    def __init__(self, test_pause: float = 0.6) -> None:
        self.files: dict[str, str] = {
            "README.md": _README,
            "utils.py": _UTILS,
            "test_utils.py": _TESTS,
        }
        self.test_pause = test_pause

    def listing(self) -> str:
        return "\n".join(f"{name}  ({len(text.splitlines())} lines)" for name, text in sorted(self.files.items()))

    def read(self, path: str) -> str:
        if path not in self.files:
            raise FileNotFoundError(f"no such file: {path!r} (files: {', '.join(sorted(self.files))})")
        return self.files[path]

    def edit(self, path: str, old: str, new: str) -> str:
        text = self.read(path)
        if old not in text:
            raise ValueError(f"{old!r} does not occur in {path}")
        self.files[path] = text.replace(old, new, 1)
        return f"edited {path}: 1 replacement"

    async def run_tests(self, ctx: ToolContext) -> str:
        def report(line: str) -> None:  # each line of the runner's, as it prints it
            if line.strip():
                ctx.emit(ToolProgress(tool_use_id=ctx.tool_use_id, text=line))

        result = await run_process(
            sys.executable,
            "-c",
            _RUNNER,
            str(self.test_pause),
            signal=ctx.signal,
            timeout=60,
            stdin=json.dumps(self.files).encode(),
            on_line=report,
        )
        out = result.stdout.strip()
        if result.stderr.strip():
            out += "\n" + result.stderr.strip()[-400:]
        return f"$ pytest -q   (exit code {result.returncode})\n{out}"


def make_tools(project: Project, poll_pause: float = 0.2) -> list[Tool]:
    """The five tools of the demo, bound to ``project``."""

    @tool(concurrency_safe=True)
    async def list_files(path: str = ".") -> str:
        """List the files of the project."""
        return project.listing()

    @tool(concurrency_safe=True, stationarity="tight")
    async def read_file(path: str) -> str:
        """Read one file of the project."""
        return project.read(path)

    @tool
    async def edit_file(path: str, old: str, new: str) -> str:
        """Replace the first occurrence of ``old`` by ``new`` in a file."""
        return project.edit(path, old, new)

    @tool
    async def run_tests(ctx: ToolContext) -> str:
        """Run the test suite (a real subprocess, a few seconds)."""
        return await project.run_tests(ctx)

    @tool(stationarity="tight")
    async def ci_status(ctx: ToolContext, pipeline: str = "main") -> str:
        """The state of the CI pipeline."""
        ctx.emit(ToolProgress(tool_use_id=ctx.tool_use_id, text=f"asking the CI server about pipeline {pipeline} ..."))
        await asyncio.sleep(poll_pause)
        return f"pipeline {pipeline}: running (3/7 jobs done)"

    return [list_files, read_file, edit_file, run_tests, ci_status]


def make_permission(pause: float) -> PermissionCallback:
    """A permission callback: edits wait ``pause`` seconds ("the user reads the diff"), then are allowed."""

    async def permission(use: ToolUseBlock, ctx: ToolContext) -> Allow | Deny:
        if use.name != "edit_file":
            return Allow()
        await asyncio.sleep(pause)
        return Allow()

    return permission
