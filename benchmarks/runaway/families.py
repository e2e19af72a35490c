"""Loop families the catalogue and the random draw do not have, built the way models write them.

Each family yields `Case`-like loops (text, channel, onset, smallest period) at a
few sizes: a paragraph re-emitted with a counter that changes, the same tool-call
JSON written out again in the answer, "Wait, let me reconsider" blocks of several
lengths in a cycle, floods of one or two characters, units of 2 to 8 KB, CJK and
emoji paragraphs (with joiners and variation selectors), and CRLF line ends.
``period=0`` marks a loop with no exact period (the counter family): an exact
detector is expected to miss it.
"""

from __future__ import annotations

import json
import random
from collections.abc import Iterator
from dataclasses import dataclass

from scenarios import prose, smallest_period


@dataclass(frozen=True)
class Loop:
    family: str
    channel: str
    text: str
    onset: int  # first character of the first copy
    period: int  # smallest period of the tail; 0 = not exactly periodic
    unit: int  # length of one copy: delays are counted in these


def _loop(family: str, channel: str, prefix: str, unit: str, copies: int) -> Loop:
    text = prefix + unit * copies
    p = smallest_period(unit)
    onset = len(prefix)
    while onset > 0 and text[onset - 1] == text[onset - 1 + p]:
        onset -= 1
    return Loop(family, channel, text, onset, p, p)


def _counter(rnd: random.Random, channel: str) -> Loop:
    para = prose(rnd.randint(120, 600), rnd.randrange(1 << 30)).strip()
    prefix = prose(400, rnd.randrange(1 << 30))
    body = "".join(f"{para} (attempt {i})\n\n" for i in range(1, 13))
    return Loop("counter (attempt N)", channel, prefix + body, len(prefix), 0, len(para) + 14)


def _tool_json(rnd: random.Random, channel: str) -> Loop:
    call = {
        "type": "tool_use",
        "name": rnd.choice(["read_file", "run_tests", "search_code"]),
        "input": {"path": f"src/{rnd.choice(['app', 'db', 'api'])}/{rnd.randrange(100)}.py", "limit": 200},
    }
    indent = rnd.choice([None, 2])
    unit = "I'll call the tool:\n" + json.dumps(call, indent=indent) + "\n"
    return _loop(
        "tool-call JSON in text", channel, prose(rnd.randint(200, 900), rnd.randrange(1 << 30)), unit, 8
    )


def _reconsider(rnd: random.Random, channel: str) -> Loop:
    blocks = [
        "Wait, let me reconsider. " + prose(rnd.randint(20, 400), rnd.randrange(1 << 30)).strip() + "\n\n"
        for _ in range(rnd.randint(1, 3))
    ]
    unit = "".join(blocks)
    return _loop("'Wait, let me reconsider' blocks", channel, prose(600, rnd.randrange(1 << 30)), unit, 6)


def _flood(rnd: random.Random, channel: str) -> Loop:
    unit = rnd.choice(["!", "\n", ".", "ha", "\r\n", " -", "🙂", "。"])
    return _loop(
        "flood, period 1-2", channel, prose(rnd.randint(100, 800), rnd.randrange(1 << 30)), unit, 1600
    )


def _long(rnd: random.Random, channel: str) -> Loop:
    unit = prose(rnd.randint(2048, 8192), rnd.randrange(1 << 30)).strip() + "\n\n"
    return _loop("long unit, 2-8 KB", channel, prose(500, rnd.randrange(1 << 30)), unit, 4)


def _cjk(rnd: random.Random, channel: str) -> Loop:
    words = ["我们", "需要", "检查", "这个", "文件", "的", "配置", "然后", "再", "运行", "测试", "。"]
    emoji = ["👍", "🔁", "👨‍💻", "❤️", "🇯🇵", "✅"]
    unit = "".join(rnd.choice(words) for _ in range(rnd.randint(8, 120)))
    unit += rnd.choice(emoji) + rnd.choice(["\n", "", "\n\n"])
    return _loop(
        "CJK and emoji text",
        channel,
        "好的\uff0c我来看看这个问题。" + prose(300, rnd.randrange(1 << 30)),
        unit,
        8,
    )


def _crlf(rnd: random.Random, channel: str) -> Loop:
    para = prose(rnd.randint(40, 700), rnd.randrange(1 << 30)).strip().replace("\n", "\r\n")
    unit = para + "\r\n\r\n"
    return _loop("CRLF line ends", channel, prose(300, rnd.randrange(1 << 30)).replace("\n", "\r\n"), unit, 6)


FAMILIES = [_counter, _tool_json, _reconsider, _flood, _long, _cjk, _crlf]


def families(per_family: int, seed: int) -> Iterator[Loop]:
    """``per_family`` loops of each family, on both channels."""
    rnd = random.Random(seed)
    for make in FAMILIES:
        for i in range(per_family):
            yield make(rnd, ("thinking", "text")[i % 2])
