"""Every ```python block in README.md and docs/*.md runs; docs/api.md names every public name.

Convention (documented in docs/index.md): a block fenced ```python runs as a complete script in a
fresh interpreter, with warnings as errors, and a comment after a ``print(...)`` is the line it
prints; a block fenced ```python no-run (it needs a network or an API key) is only compiled. A
```text block right after a runnable block, introduced by prose that speaks of its ``print``s, is
lines it prints in that order. The names the docs use, in their prose and in every block, must
exist (see the last section).
"""

from __future__ import annotations

import ast
import dataclasses
import importlib
import inspect
import io
import json
import os
import pkgutil
import re
import subprocess
import sys
import tokenize
import types
import typing
from pathlib import Path

import pytest

import agentloop
import agentloop.mcp
import agentloop.models
import agentloop.policies
import agentloop.sessions
import agentloop.testing

ROOT = Path(__file__).resolve().parent.parent
DOCS = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
FENCE = re.compile(r"^```python([^\n]*)\n(.*?)^```[ \t]*$", re.DOTALL | re.MULTILINE)
# What a block prints, shown after it: prose that mentions its `print`s, then a ```text block.
SHOWN = re.compile(r"\n((?:(?!```)[^\n]*\n)*?[^\n]*`print`[^\n]*\n(?:(?!```)[^\n]*\n)*?)```text\n(.*?)^```", re.DOTALL | re.MULTILINE)


def _blocks() -> list[tuple[str, str, bool, list[str]]]:
    out = []
    for path in DOCS:
        text = path.read_text(encoding="utf-8")
        for m in FENCE.finditer(text):
            line = text.count("\n", 0, m.start()) + 1
            info = m.group(1).split()
            shown = SHOWN.match(text, m.end())
            in_order = shown.group(2).splitlines() if shown else []
            out.append((f"{path.relative_to(ROOT)}:{line}", m.group(2), "no-run" not in info, in_order))
    return out


BLOCKS = _blocks()


def test_the_docs_have_examples() -> None:
    runnable = [name for name, _, run, _ in BLOCKS if run]
    assert any(n.startswith("README.md") for n in runnable)
    for page in ("quickstart", "concepts", "interrupts", "cookbook", "subagents"):
        assert any(n.startswith(f"docs/{page}.md") for n in runnable), page


@pytest.mark.parametrize(("where", "code", "runs", "in_order"), BLOCKS, ids=[b[0] for b in BLOCKS])
def test_code_block(where: str, code: str, runs: bool, in_order: list[str], tmp_path: Path) -> None:
    # A syntax error fails here, runnable or not; a no-run snippet may use top-level await.
    compile(code, where, "exec", flags=0 if runs else ast.PyCF_ALLOW_TOP_LEVEL_AWAIT)
    if not runs:
        return
    script = tmp_path / "example.py"
    script.write_text(code, encoding="utf-8")
    env = dict(os.environ, PYTHONPATH=str(ROOT))
    proc = subprocess.run(
        [sys.executable, "-W", "error", str(script)],
        cwd=tmp_path, env=env, capture_output=True, text=True, timeout=50,
    )
    assert proc.returncode == 0, f"{where} failed:\n{proc.stdout[-2000:]}\n{proc.stderr[-4000:]}"
    printed = proc.stdout.splitlines()
    for line, shown in _shown_output(code):
        pattern = ".*".join(re.escape(part) for part in shown.split("..."))
        assert any(re.fullmatch(pattern, out.rstrip()) for out in printed), (
            f"{where}, line {line}: the comment says it prints {shown!r}; it printed:\n{proc.stdout[-2000:]}"
        )
    assert _in_order(in_order, [out.rstrip() for out in printed]), (
        f"{where}: the page shows it prints, in this order:\n{chr(10).join(in_order)}\nit printed:\n{proc.stdout[-2000:]}"
    )


def _in_order(shown: list[str], printed: list[str]) -> bool:
    """Each line of ``shown`` is printed, after the one before it."""
    rest = iter(printed)
    return all(any(out == line for out in rest) for line in shown)


def test_the_printed_order_a_page_shows_is_checked() -> None:
    assert _in_order(["a", "c"], ["a", "b", "c"])
    assert not _in_order(["c", "a"], ["a", "b", "c"])
    assert not _in_order(["a", "a"], ["a", "b"])
    shown = {where: lines for where, _, _, lines in BLOCKS if lines}
    assert any(where.startswith("docs/subagents.md") for where in shown), shown


def _shown_output(code: str) -> list[tuple[int, str]]:
    """The output a block's comments promise: ``print(x)  # 42`` says that a line ``42`` is
    printed (``...`` standing for any text)."""
    lines = code.splitlines()
    return [
        (tok.start[0], tok.string[1:].strip())
        for tok in tokenize.generate_tokens(io.StringIO(code).readline)
        if tok.type == tokenize.COMMENT and lines[tok.start[0] - 1].lstrip().startswith("print(")
    ]


def test_shown_output_reads_the_comments_after_prints() -> None:
    code = 'print("a")  # a\nx = 1  # not output\nprint("#", 2)  # # 2\n'
    assert _shown_output(code) == [(1, "a"), (3, "# 2")]


def test_the_scenario_files_the_docs_show_play() -> None:
    # A ```json block holding "steps" is a demo scenario: `--script FILE` must accept it.
    from agentloop.demo.scenario import parse

    shown = [
        json.loads(m.group(1))
        for page in DOCS
        for m in re.finditer(r"^```json\n(.*?)^```", page.read_text(encoding="utf-8"), re.DOTALL | re.MULTILINE)
    ]
    scenarios = [data for data in shown if isinstance(data, dict) and "steps" in data]
    assert scenarios
    for data in scenarios:
        assert parse(data).steps


def _anchors(page: Path) -> set[str]:
    """The anchors GitHub gives ``page``'s headings."""
    headings = re.findall(r"^#+ (.+)$", _prose(page.read_text(encoding="utf-8")), re.MULTILINE)
    return {re.sub(r"[^\w\- ]", "", h.strip().lower()).replace(" ", "-") for h in headings}


@pytest.mark.parametrize("page", DOCS, ids=[str(p.relative_to(ROOT)) for p in DOCS])
def test_links_resolve(page: Path) -> None:
    # [concepts.md](concepts.md#reasons): the file, and the heading, must exist.
    broken = []
    for target in re.findall(r"\]\(([^)\s]+)\)", _prose(page.read_text(encoding="utf-8"))):
        if re.match(r"[a-z]+:", target):  # https://..., mailto:
            continue
        path, _, anchor = target.partition("#")
        linked = (page.parent / path).resolve() if path else page
        if not linked.exists():
            broken.append(f"{target}: no such file")
        elif anchor and linked.suffix == ".md" and anchor not in _anchors(linked):
            broken.append(f"{target}: {linked.name} has no heading #{anchor}")
    assert not broken, "\n".join(broken)


def test_api_md_names_every_public_name() -> None:
    text = (ROOT / "docs" / "api.md").read_text(encoding="utf-8")
    documented = set(re.findall(r"^- `([A-Za-z_][A-Za-z0-9_]*)", text, re.MULTILINE))
    missing = sorted(set(agentloop.__all__) - documented)
    assert not missing, f"docs/api.md does not document: {missing}"
    stale = sorted(documented - set(agentloop.__all__) - {"agentloop"})
    assert not stale, f"docs/api.md documents names that are not in agentloop.__all__: {stale}"


# -- names: every agentloop name the docs use exists, with the parameters they show --------------
# The prose's `code spans` and the blocks' imports and keyword arguments are read against the code,
# so a name that was renamed or removed, or a parameter the code no longer takes, fails a test.

PUBLIC_MODULES = (agentloop, agentloop.models, agentloop.policies, agentloop.sessions, agentloop.testing, agentloop.mcp)
NAMES: dict[str, object] = {"agentloop": agentloop}
for _module in PUBLIC_MODULES:
    for _name in _module.__all__:
        NAMES.setdefault(_name, getattr(_module, _name))
# What the prose calls its running examples: `engine.send_now(text)` is QueryEngine's.
INSTANCES: dict[str, object] = {
    "engine": agentloop.QueryEngine,
    "child": agentloop.QueryEngine,
    "ctx": agentloop.ToolContext,
    "controller": agentloop.AbortController,
    "message": agentloop.Message,
    "policy": agentloop.Policy,
    "session": agentloop.sessions.JsonlSession,
    "loaded": agentloop.sessions.LoadedSession,
    "server": agentloop.mcp.MCPServer,
}
# Callables whose **kwargs go on to another one's parameters.
FORWARDS = {
    "delegate_tool": agentloop.QueryEngine,
    "QueryEngine.subagent": agentloop.QueryEngine,
    "MCPServer.stdio": agentloop.mcp.MCPServer,
    "MCPServer.http": agentloop.mcp.MCPServer,
    "JsonlSession.resume": agentloop.sessions.JsonlSession,
}
SPAN = re.compile(r"`([^`\n]+)`")
DOTTED = re.compile(r"(?:await )?([A-Za-z_]\w*(?:\.[A-Za-z_]\w*)*)(\(.*\))?")
DEFINITION = re.compile(r"(?:- |#+ )?`")  # a span that opens a paragraph, a bullet or a heading defines


def _prose(text: str) -> str:
    """``text`` with its fenced blocks blanked out (line numbers kept)."""
    return re.sub(r"^```.*?^```", lambda m: "\n" * m.group(0).count("\n"), text, flags=re.DOTALL | re.MULTILINE)


def _root(name: str) -> object | None:
    if name in NAMES:
        return NAMES[name]
    if name in INSTANCES:
        return INSTANCES[name]
    if name.startswith("_"):  # design.md points into the private modules
        for package in ("agentloop", "agentloop.models"):
            try:
                return importlib.import_module(f"{package}.{name}")
            except ImportError:
                pass
    return None


def _hint_class(hint: object) -> object | None:
    """The class an annotation names (the first class of a union, None left out)."""
    if isinstance(hint, type):
        return hint
    for arg in typing.get_args(hint):
        if isinstance(arg, type) and arg is not type(None):
            return arg
    return None


def _member(owner: object, attr: str) -> tuple[bool, object | None]:
    """Whether ``owner`` (a module, a class, a function) has ``attr``, and what it is, as far as
    can be told without an instance (a field's annotated class; None when unknown)."""
    if isinstance(owner, types.ModuleType):
        if hasattr(owner, attr):
            return True, getattr(owner, attr)
        try:
            return True, importlib.import_module(f"{owner.__name__}.{attr}")
        except ImportError:
            return False, None
    if not isinstance(owner, type):
        return hasattr(owner, attr), getattr(owner, attr, None)
    try:
        hints = typing.get_type_hints(owner, localns=dict(NAMES))
    except Exception:
        hints = {}
    fields = set(getattr(owner, "model_fields", {}))
    if dataclasses.is_dataclass(owner):
        fields |= {f.name for f in dataclasses.fields(owner)}
    if attr in fields:
        return True, _hint_class(hints.get(attr))
    value = inspect.getattr_static(owner, attr, None)
    if isinstance(value, property):
        returns = typing.get_type_hints(value.fget, localns=dict(NAMES)).get("return") if value.fget else None
        return True, _hint_class(returns)
    if hasattr(owner, attr):
        return True, getattr(owner, attr)
    for cls in owner.__mro__:  # an attribute set in __init__
        try:
            source = inspect.getsource(cls)
        except (OSError, TypeError):
            continue
        if re.search(rf"self\.{attr}\b\s*(:[^=\n]*)?=[^=]", source):
            return True, _hint_class(hints.get(attr))
    return False, None


def _parameters(fn: object, qualname: str) -> dict[str, inspect.Parameter] | None:
    """The parameters ``fn`` takes by name (a class: its constructor's, up the MRO while each
    passes **kwargs on; then FORWARDS' callee's). None when it takes any name."""
    out: dict[str, inspect.Parameter] = {}
    target = fn
    while True:
        if isinstance(target, type):
            inits = [c.__init__ for c in target.__mro__ if "__init__" in vars(c) and c is not object]
        else:
            inits = [target]
        open_ended = False
        for init in inits:
            try:
                signature = inspect.signature(init)
            except (TypeError, ValueError):
                return None
            open_ended = False
            for p in signature.parameters.values():
                if p.kind is p.VAR_KEYWORD:
                    open_ended = True
                elif p.kind is not p.VAR_POSITIONAL and p.name != "self":
                    out.setdefault(p.name, p)
            if not open_ended:
                break
        if not open_ended:
            return out
        if qualname not in FORWARDS:
            return None
        target, qualname = FORWARDS[qualname], ""


def _arguments(args: str) -> list[tuple[str | None, str]]:
    """``(a, b=1, *, c=...)`` as (name or None, the text after ``=``) pairs, split at top-level commas."""
    inner, depth, part, parts = args[1:-1], 0, "", []
    for ch in inner:
        if ch in "([{":
            depth += 1
        elif ch in ")]}":
            depth -= 1
        if ch == "," and depth == 0:
            parts.append(part)
            part = ""
        else:
            part += ch
    parts.append(part)
    out: list[tuple[str | None, str]] = []
    for raw in (p.strip() for p in parts):
        name, eq, value = raw.partition("=")
        if eq and re.fullmatch(r"[A-Za-z_]\w*", name.strip()):
            out.append((name.strip(), value.strip()))
        else:
            out.append((None, raw))
    return out


SOURCE_DIRS = (
    ROOT / "agentloop", ROOT / "agentloop/models", ROOT / "agentloop/demo", ROOT, ROOT / "tests",
    ROOT / "tests/models", ROOT / "benchmarks", ROOT / "benchmarks/runaway",
    Path(importlib.import_module("mcp").__file__ or "").parent.parent,  # the mcp SDK's own files
)


def _check_span(span: str, defines: bool) -> list[str]:
    if re.fullmatch(r"[\w/.-]+\.(py|md)", span):  # a file: `_loop.py`, `benchmarks/bench_sessions.py`
        if not any((d / span).is_file() for d in SOURCE_DIRS):
            return [f"`{span}`: no such file"]
        return []
    if re.fullmatch(r"models/\w+\.\w+", span):  # `models/_driver.loads`
        span = "agentloop." + span.replace("/", ".")
    m = DOTTED.fullmatch(span)
    if m is None:
        return []
    dotted, args = m.groups()
    parts = dotted.split(".")
    obj = _root(parts[0])
    if obj is None:
        return []
    qualname = getattr(obj, "__name__", parts[0]) if parts[0] in INSTANCES else parts[0]
    for i, attr in enumerate(parts[1:], 1):
        found, value = _member(obj, attr)
        if not found:
            return [f"`{span}`: {'.'.join(parts[:i])} has no attribute {attr!r}"]
        if value is None:
            return []
        qualname = f"{qualname}.{attr}"
        obj = value
    if not args or not callable(obj):
        return []
    params = _parameters(obj, qualname)
    if params is None:
        return []
    problems = []
    for name, value in _arguments(args):
        if name is None:
            bare = value.lstrip("*")
            if defines and re.fullmatch(r"[A-Za-z_]\w*", bare) and bare not in params:
                problems.append(f"`{span}`: {qualname} has no parameter {bare!r}")
            continue
        if name not in params:
            problems.append(f"`{span}`: {qualname} has no parameter {name!r}")
            continue
        if not defines:
            continue
        try:
            documented = ast.literal_eval(value)
        except (ValueError, SyntaxError):
            continue  # not a literal: `fence_rules=...`, `max_event_size=64 MiB`
        default = params[name].default
        if documented is not Ellipsis and default is not inspect.Parameter.empty and documented != default:
            problems.append(f"`{span}`: {qualname}'s {name} defaults to {default!r}, not {documented!r}")
    return problems


def _code_names(code: str, where: str) -> list[str]:
    """Stale names in a code block, also one that does not run: what it imports from agentloop,
    and the keywords it passes to agentloop's callables."""
    tree = compile(code, where, "exec", flags=ast.PyCF_ONLY_AST | ast.PyCF_ALLOW_TOP_LEVEL_AWAIT)
    problems: list[str] = []
    imported: dict[str, object] = {}
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom) and (node.module or "").split(".")[0] == "agentloop":
            module = importlib.import_module(node.module or "")
            for alias in node.names:
                if not hasattr(module, alias.name):
                    problems.append(f"{where}: {node.module} has no {alias.name!r}")
                else:
                    imported[alias.asname or alias.name] = getattr(module, alias.name)
    for node in ast.walk(tree):
        if isinstance(node, ast.Call):
            func = node.func
            owner, attr = (func.value, func.attr) if isinstance(func, ast.Attribute) else (func, None)
            if not isinstance(owner, ast.Name) or owner.id not in imported:
                continue
            target = imported[owner.id]
            qualname = getattr(target, "__qualname__", owner.id)
            if attr is not None:
                found, target = _member(target, attr)
                if not found:
                    problems.append(f"{where}: {owner.id} has no attribute {attr!r}")
                    continue
                qualname = f"{qualname}.{attr}"
            params = _parameters(target, qualname)
            if params is not None:
                unknown = [kw.arg for kw in node.keywords if kw.arg is not None and kw.arg not in params]
                problems += [f"{where}: {qualname} has no parameter {name!r}" for name in unknown]
    return problems


def _known_names() -> set[str]:
    """Every function, class, method, attribute and parameter name defined in agentloop."""
    known: set[str] = set()

    def add_callable(fn: object) -> None:
        try:
            known.update(inspect.signature(fn).parameters)  # type: ignore[arg-type]
        except (TypeError, ValueError):
            pass

    for info in pkgutil.walk_packages(agentloop.__path__, "agentloop."):
        module = importlib.import_module(info.name)
        for name, value in vars(module).items():
            if getattr(value, "__module__", None) != module.__name__:
                continue
            known.add(name)
            add_callable(value)
            if isinstance(value, type):
                for attr, member in vars(value).items():
                    known.add(attr)
                    add_callable(getattr(member, "__func__", member))
                known.update(getattr(value, "model_fields", {}))
                known.update(re.findall(r"self\.(\w+)\b\s*(?::[^=\n]*)?=[^=]", inspect.getsource(value)))
    return known


KNOWN = _known_names()
# Bare names the docs use that belong to others: httpx, builtins, asyncio and str methods, a URL query.
OTHERS = {"follow_redirects", "max_connections", "key", "wait", "any", "str", "print", "uncancel", "stderr", "stdin"}


def _check_bare(span: str) -> list[str]:
    """`deadline=`, `fork()`, `judge(signal)`: a keyword or a method named without its owner must
    still be one of agentloop's names (or one of OTHERS). A call with literal arguments
    (`lookup(word="true")`) is an example of a tool call a model makes, not a name."""
    m = re.fullmatch(r"(?:await )?([a-z_]\w*)(=.*|\(.*\))", span)
    if m is None or _root(m.group(1)) is not None or m.group(1) in KNOWN | OTHERS:
        return []
    if m.group(2).startswith("(") and re.search(r"[\"'0-9]", m.group(2)):
        return []
    return [f"`{span}`: agentloop has no {m.group(1)!r}"]


@pytest.mark.parametrize("page", DOCS, ids=[str(p.relative_to(ROOT)) for p in DOCS])
def test_every_name_the_docs_use_exists(page: Path) -> None:
    # `engine.interject(text)`, `ToolCallFinished.full_result`, `JsonlSession(path, fsync=...)`:
    # a renamed or removed name, or a parameter the code no longer takes, fails here. A span that
    # opens a line or a heading defines the name, so its literal defaults must be the code's.
    text = _prose(page.read_text(encoding="utf-8"))
    problems = []
    previous = ""
    for line in text.splitlines():
        for m in SPAN.finditer(line):
            opens = bool(DEFINITION.fullmatch(line[: m.start() + 1])) and (line[0] != "`" or not previous.strip())
            problems += _check_span(m.group(1).strip(), opens) + _check_bare(m.group(1).strip())
        previous = line
    for where, code, _, _ in BLOCKS:
        if where.startswith(str(page.relative_to(ROOT)) + ":"):
            problems += _code_names(code, where)
    assert not problems, "\n".join(problems)


def test_the_user_docs_name_no_private_module() -> None:
    # What users are told to import or catch is public; only design.md walks the private modules.
    for page in DOCS:
        if page.name != "design.md":
            found = re.findall(r"agentloop(?:\.\w+)*\._[a-z]\w*", _prose(page.read_text(encoding="utf-8")))
            assert not found, f"{page.name} names private modules: {found}"


def test_the_name_check_catches_stale_names() -> None:
    assert _check_span("engine.interject(text)", False) == []
    assert _check_span("engine.interjekt(text)", False) != []
    assert _check_span("ToolCallFinished.full_result", False) == []
    assert _check_span("ToolCallFinished.whole_result", False) != []
    assert _check_span("ctx.signal.aborted", False) == []
    assert _check_span("ctx.signal.abortedd", False) != []
    assert _check_span("QueryEngine(max_turns=3)", False) == []
    assert _check_span("QueryEngine(max_turnz=3)", False) != []
    assert _check_span("delegate_tool(policies=[...])", False) == []  # on to QueryEngine
    assert _check_span("IdenticalToolCallRun(nudge_at=8, end_at=12)", True) == []
    assert _check_span("IdenticalToolCallRun(nudge_at=7)", True) != []  # a default that is not the code's
    assert _check_span("IdenticalToolCallRun(nudge_at=7)", False) == []  # a call, not a definition
    assert _check_span("JsonlSession(path, fsynk=...)", True) != []
    assert _check_bare("deadline=") == _check_bare("fork()") == []
    assert _check_bare("deadlines=") != [] and _check_bare("releas()") != []
    assert _check_bare('lookup(word="true")') == []  # a model's tool call, shown as an example
    assert _code_names("from agentloop import QueryEngine, Interject\n", "x") != []
    assert _code_names("from agentloop.models import OpenAIChatModel\nOpenAIChatModel('m', logprob=True)\n", "x") != []


def test_the_examples_pass_the_async_lint_rules(tmp_path: Path) -> None:
    """A host copies the examples into code its own linter checks: the `shell(command,
    timeout=60)` tool tripped ruff's ASYNC109 (an async function with a ``timeout`` parameter)."""
    for i, (where, code, _, _) in enumerate(BLOCKS):
        (tmp_path / f"block_{i:03d}.py").write_text(f"# {where}\n{code}", encoding="utf-8")
    proc = subprocess.run(
        [sys.executable, "-m", "ruff", "check", "--no-cache", "--isolated", "--select", "ASYNC", "--output-format",
         "concise", str(tmp_path)],
        capture_output=True, text=True, timeout=50,
    )
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-1000:]
