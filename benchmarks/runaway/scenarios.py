"""The RUNAWAY.md §(d) text scenarios (1-21), plus loops the detector was not tuned on (E1-E6).

Each scenario is a `Case`: the text streamed on one channel, and for a loop the
onset (first character of the first copy) and the smallest period, so the
runner can measure the delay in copies. Text is generated deterministically.
"""

from __future__ import annotations

import base64
import json
import random
from dataclasses import dataclass
from typing import Literal

Expect = Literal["catch", "clean", "boundary", "documented_miss"]

WORDS = [
    "the",
    "build",
    "config",
    "parser",
    "module",
    "test",
    "file",
    "change",
    "plan",
    "error",
    "value",
    "user",
    "request",
    "result",
    "cache",
    "server",
    "client",
    "token",
    "stream",
    "window",
    "period",
    "buffer",
    "detector",
    "policy",
    "thread",
    "worker",
    "queue",
    "index",
    "schema",
    "field",
    "record",
    "table",
    "column",
    "output",
    "input",
    "format",
    "check",
    "update",
    "review",
    "merge",
    "branch",
    "commit",
]


@dataclass(frozen=True)
class Case:
    sid: str
    name: str
    channel: Literal["thinking", "text"]
    text: str
    expect: Expect
    onset: int = 0
    period: int = 0


def prose(n: int, seed: int) -> str:
    """Varied sentences (no sentence twice) of about ``n`` characters."""
    rnd, out, size = random.Random(seed), [], 0
    while size < n:
        words = [rnd.choice(WORDS) for _ in range(rnd.randint(6, 14))]
        s = " ".join(words).capitalize() + rnd.choice([".", ".", "?", ":"]) + rnd.choice([" ", " ", "\n"])
        out.append(s)
        size += len(s)
    return "".join(out)


def smallest_period(unit: str) -> int:
    return next(
        p for p in range(1, len(unit) + 1) if len(unit) % p == 0 and unit[:p] * (len(unit) // p) == unit
    )


def loop(
    sid: str, name: str, channel: str, prefix: str, unit: str, copies: int, expect: Expect = "catch"
) -> Case:
    ch: Literal["thinking", "text"] = "thinking" if channel == "thinking" else "text"
    return Case(sid, name, ch, prefix + unit * copies, expect, len(prefix), smallest_period(unit))


def _loops() -> list[Case]:
    para300 = prose(300, 3).strip() + "\n\n"
    para700 = prose(700, 4).strip() + "\n\n"
    a = "All done! I've updated the parser, the tests pass, and the cache is now invalidated on write.\n\n"
    b = "Everything is complete. The parser change is in place and the whole suite is green again.\n\n"
    fn = "def check(value):\n    if value is None:\n        return False\n    return value > 0\n\n"
    return [
        loop("1", "short thinking chant", "thinking", prose(400, 1), "I'll do it.\nI'll execute.\n", 40),
        loop(
            "2",
            "blank-line chant",
            "thinking",
            prose(400, 2),
            "Response is ready.\n\nI'll send.\n\nDone.\n\n",
            30,
        ),
        loop("3t", "~300-char paragraph (text)", "text", prose(600, 5), para300, 8),
        loop("3r", "~300-char paragraph (thinking)", "thinking", prose(600, 5), para300, 8),
        loop("4", "~700-char paragraph after 4 KB", "text", prose(4096, 6), para700, 6),
        loop("5", "two-variant completion cycle", "text", prose(500, 7), a + b, 8),
        loop("6a", "'so ' flood", "text", prose(300, 8), "so ", 400),
        loop("6b", "'-' flood", "text", prose(300, 9), "-", 1500),
        loop("6c", "newline flood", "thinking", prose(300, 10), "\n", 1500),
        loop("7", "CJK chant", "thinking", "我先看一下这个函数的实现。", "我需要再检查一下这个文件。", 60),
        loop("8", "function looped in a code fence", "text", prose(300, 11) + "\n```python\n", fn, 80),
        Case(
            "9",
            "templated counter loop",
            "thinking",
            "".join(f"Attempt {i}: retrying the build with the same flags.\n" for i in range(1, 80)),
            "documented_miss",
        ),
        Case("10", "loop with drift (paraphrase)", "thinking", _drift(), "documented_miss"),
    ]


def _drift() -> str:
    rnd = random.Random(12)
    starts = ["Let me", "I should", "I'll", "Now I will", "Next, I'll"]
    verbs = ["check", "re-check", "look at", "verify", "inspect"]
    return "".join(
        f"{rnd.choice(starts)} {rnd.choice(verbs)} the config file {rnd.choice(['again', 'once more', 'now'])}.\n"
        for _ in range(120)
    )


def _extra_loops() -> list[Case]:
    big = "".join(f"    value_{i} = compute(value_{i - 1}, {i})\n" for i in range(1, 50))
    return [
        loop(
            "E1",
            "tool-argument JSON loop",
            "text",
            prose(300, 20),
            '{"path": "src/app.py", "line": 12}, ',
            40,
        ),
        loop("E2", "2 KB code block x3 in thinking", "thinking", prose(800, 21), big, 4),
        loop(
            "E3",
            "'Wait, actually' chant",
            "thinking",
            prose(300, 22),
            "Wait, actually, let me reconsider. ",
            30,
        ),
        loop("E4", "identical list item", "text", prose(300, 23), "- Check the logs again.\n", 40),
        loop("E5", "emoji chant", "thinking", prose(300, 24), "🔁 retry now 🔁\n", 60),
        loop(
            "E6", "closing-phrase loop", "text", prose(300, 25), "Let me know if you need anything else! ", 30
        ),
    ]


def _legit() -> list[Case]:
    rnd = random.Random(30)
    table = "| # | name | status |\n" + "|---|---|---|\n"
    table += "".join(
        f"| {i} | {rnd.choice(WORDS)}_{i} | {rnd.choice(['ok', 'fail', 'skip'])} |\n" for i in range(40)
    )
    sep40 = "|" + "---|" * 40 + "\n"
    pad = "".join(f"| {rnd.choice(WORDS):<60} | {i:>54} |\n" for i in range(20))
    shared = "".join(f"- projects/acme-prod/locations/us-central1/services/service-{i}\n" for i in range(30))
    asserts = "```python\n" + "".join(f"assert parse('x{i}') == Token('x{i}')\n" for i in range(30)) + "```\n"
    params = "```python\n@pytest.mark.parametrize('a,b', [\n" + "".join(
        f"    ({i}, {i * i}),\n" for i in range(40)
    )
    box = "╭" + "─" * 40 + "╮\n" + "".join(f"│ row {i:<34} │\n" for i in range(20)) + "╰" + "─" * 40 + "╯\n"
    dividers = "".join(f"{c * n}\n{prose(200, n)}\n" for c, n in [("=", 80), ("-", 100), ("*", 120)])
    b64 = base64.b64encode(random.Random(31).randbytes(3072)).decode()
    items = "".join(f"{i}. {prose(60, 100 + i).strip()}\n" for i in range(1, 41))
    objs = json.dumps([{"id": i, "text": prose(40, 200 + i).strip()} for i in range(30)], indent=2)
    chorus = (
        "And we sing, oh we sing, till the morning light,\nhold the line, hold the line, through the night.\n"
    )
    song = "".join(prose(200, 300 + v) + "\n" + chorus + chorus + "\n" for v in range(4))
    cases = {
        "11": ("Markdown table + 40-column separator", table + sep40),
        "12": ("prettier-padded table", pad),
        "13": ("list with a 70-char shared prefix", shared),
        "14": ("parametrised data and 30 asserts in fences", params + "])\n```\n" + asserts),
        "15": ("box-drawing art and long dividers", box + dividers),
        "16": ("base64 of random bytes in a fence", "```\n" + b64 + "\n```\n"),
        "17": ("numbered list of 40 items and a JSON array", items + "```json\n" + objs + "\n```\n"),
        "18": ("song with a chorus", song),
    }
    return [Case(sid, name, "text", prose(200, 40) + body, "clean") for sid, (name, body) in cases.items()]


def _boundary() -> list[Case]:
    zeros = "```\n" + base64.b64encode(bytes(3072)).decode() + "\n```\n"
    matrix = (
        "```python\ngrid = [\n" + "    [0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0],\n" * 16 + "]\n```\n"
    )
    hexdump = (
        "```\n"
        + "".join(
            f"{i * 16:08x}: 0000 0000 0000 0000 0000 0000 0000 0000  ................\n" for i in range(256)
        )
        + "```\n"
    )
    return [
        Case("19", "base64 of zero bytes (fence)", "text", "Here is the file:\n" + zeros, "boundary"),
        Case("20a", "16x16 zero matrix (fence)", "text", "The empty level:\n" + matrix, "boundary"),
        Case("20b", "hexdump of a zero page (fence)", "text", "The page is empty:\n" + hexdump, "boundary"),
        Case("21", "user asked: 'hello world' x50", "text", "hello world " * 50, "boundary"),
    ]


def text_cases() -> list[Case]:
    return _loops() + _extra_loops() + _legit() + _boundary()
