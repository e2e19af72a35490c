"""Every ```python block in README.md and docs/*.md runs; docs/api.md names every public name.

Convention (documented in docs/index.md): a block fenced ```python runs as a complete script in a
fresh interpreter, with warnings as errors; a block fenced ```python no-run (it needs a network or
an API key) is only compiled.
"""

from __future__ import annotations

import ast
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

import agentloop

ROOT = Path(__file__).resolve().parent.parent
DOCS = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
FENCE = re.compile(r"^```python([^\n]*)\n(.*?)^```[ \t]*$", re.DOTALL | re.MULTILINE)


def _blocks() -> list[tuple[str, str, bool]]:
    out = []
    for path in DOCS:
        text = path.read_text(encoding="utf-8")
        for m in FENCE.finditer(text):
            line = text.count("\n", 0, m.start()) + 1
            info = m.group(1).split()
            out.append((f"{path.relative_to(ROOT)}:{line}", m.group(2), "no-run" not in info))
    return out


BLOCKS = _blocks()


def test_the_docs_have_examples() -> None:
    runnable = [name for name, _, run in BLOCKS if run]
    assert any(n.startswith("README.md") for n in runnable)
    for page in ("quickstart", "concepts", "interrupts", "cookbook", "subagents"):
        assert any(n.startswith(f"docs/{page}.md") for n in runnable), page


@pytest.mark.parametrize(("where", "code", "runs"), BLOCKS, ids=[b[0] for b in BLOCKS])
def test_code_block(where: str, code: str, runs: bool, tmp_path: Path) -> None:
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


def test_api_md_names_every_public_name() -> None:
    text = (ROOT / "docs" / "api.md").read_text(encoding="utf-8")
    documented = set(re.findall(r"^- `([A-Za-z_][A-Za-z0-9_]*)", text, re.MULTILINE))
    missing = sorted(set(agentloop.__all__) - documented)
    assert not missing, f"docs/api.md does not document: {missing}"
    stale = sorted(documented - set(agentloop.__all__) - {"agentloop"})
    assert not stale, f"docs/api.md documents names that are not in agentloop.__all__: {stale}"
