"""Real files nobody here wrote, cut into responses the way a model would write them.

Only files a fresh machine has: the Python standard library (its data tables, its
test suite and test data where the build ships them) and the packages the
project's ``dev`` and ``bench`` extras install (their sources, data files, type
stubs such as mypy's typeshed, and the README each ships in its metadata). Code
and structured data go out in a Markdown code fence with their language, as a
model writes them in an answer; prose, logs and mail go out as they are.

`flags` streams a response through the stock `ConservativeDoomLoopPolicy` on the
content channel and returns the doom-loop reports it gives.
"""

from __future__ import annotations

import random
import sysconfig
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path

from agentloop._model import StreamText
from agentloop.policies import ConservativeDoomLoopPolicy, Resample, Warn

RESPONSE = 6000  # characters per response
FENCES = {
    ".py": "python",
    ".pyi": "python",
    ".json": "json",
    ".csv": "csv",
    ".toml": "toml",
    ".cfg": "ini",
    ".html": "html",
    ".xml": "xml",
    ".pem": "text",
}
DATA = {".txt", ".json", ".csv", ".decTest", ".cfg", ".ini", ".xml", ".html", ".out", ".pem", ".toml"}


@dataclass(frozen=True)
class Response:
    kind: str
    path: Path
    offset: int  # of the slice in the file
    text: str


def _stdlib() -> Path:
    return Path(sysconfig.get_paths()["stdlib"])


def _site_files(pattern: str) -> list[Path]:
    """The environment's own packages (a virtual environment's: what the extras installed), in
    an order shuffled once and for all, so that a budget samples every package, not the first."""
    site = Path(sysconfig.get_paths()["purelib"])
    found = sorted(p for p in site.rglob(pattern) if p.is_file() and "__pycache__" not in p.parts)
    random.Random(len(found)).shuffle(found)
    return found


def _stdlib_tables() -> list[Path]:
    lib = _stdlib()
    tables = [lib / "html" / "entities.py", lib / "stringprep.py", lib / "pydoc_data" / "topics.py"]
    return sorted((lib / "encodings").glob("*.py")) + [p for p in tables if p.is_file()]


def _stdlib_tests() -> list[Path]:
    return sorted((_stdlib() / "test").glob("test_*.py"))


def _stdlib_test_data() -> list[Path]:
    test = _stdlib() / "test"
    return sorted(
        p for p in test.rglob("*") if p.is_file() and p.suffix in DATA and "__pycache__" not in p.parts
    )


def _readmes() -> list[Path]:
    return sorted(Path(sysconfig.get_paths()["purelib"]).glob("*.dist-info/METADATA"))


SOURCES: dict[str, Callable[[], list[Path]]] = {
    "stdlib tables": _stdlib_tables,
    "stdlib tests": _stdlib_tests,  # the test suite and its data: where the build ships them
    "stdlib test data": _stdlib_test_data,
    "type stubs": lambda: _site_files("*.pyi"),
    "package .py": lambda: _site_files("*.py"),
    "package data": lambda: [p for p in _site_files("*") if p.suffix in DATA],
    "package READMEs": _readmes,
}


def kinds() -> dict[str, list[Path]]:
    """The files of each kind of source (a kind with no file on this machine is empty)."""
    return {kind: find() for kind, find in SOURCES.items()}


def responses(kind: str, paths: list[Path], budget: int) -> Iterator[Response]:
    """Responses of up to `RESPONSE` characters cut from ``paths`` in order, about ``budget``
    characters in all; code and data in a fence of their language."""
    size = 0
    for path in paths:
        try:
            text = path.read_text(encoding="utf-8")
        except (UnicodeDecodeError, OSError):
            continue
        lang = FENCES.get(path.suffix)
        for i in range(0, len(text), RESPONSE):
            part = text[i : i + RESPONSE]
            if lang is not None:
                part = f"Here is that part of `{path.name}`:\n\n```{lang}\n{part}\n```\n"
            size += len(part)
            yield Response(kind, path, i, part)
        if size >= budget:
            return


def chunks(text: str, lo: int, hi: int, seed: int) -> list[str]:
    rnd, out, i = random.Random(seed), [], 0
    while i < len(text):
        k = rnd.randint(lo, hi)
        out.append(text[i : i + k])
        i += k
    return out


def flags(text: str, lo: int = 1, hi: int = 24, seed: int = 0) -> list[tuple[int, int]]:
    """(offset, period) of each tail repetition the stock policy reports on the content channel."""
    pol = ConservativeDoomLoopPolicy()
    pol.begin_attempt()
    out: list[tuple[int, int]] = []
    pos = 0
    for d in chunks(text, lo, hi, seed):
        pos += len(d)
        v = pol.on_stream(StreamText(0, d))
        if isinstance(v, (Warn, Resample)):
            out += [(pos, s.threshold or 0) for s in v.signals if s.kind == "tail_repetition"]
    return out
