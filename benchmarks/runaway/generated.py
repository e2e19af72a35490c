"""Loops nobody tuned the detector on: units cut at random from real text, and chants in other scripts.

The catalogue in `scenarios` was written here and the thresholds were tuned on
it. These loops are drawn instead: a unit is a random slice (16 to 2,048
characters) of the standard library's source or of the docs installed packages
ship, with its indentation runs, blank lines and repeated words, or a run of
words in a script the catalogue does not use (Cyrillic, Greek, Arabic, Hangul,
Devanagari, CJK, emoji). Each follows a prose prefix and repeats well past the
channel's threshold.

For each loop the runner knows the earliest point the channel's rule allows a
fire (``need`` characters after the onset) and reports how late the detector
fires after it, in copies of the unit; a fire before that point would be a bug.
"""

from __future__ import annotations

import math
import random
from dataclasses import dataclass

from scenarios import prose

from agentloop._detector import RepetitionDetector

# (name, first code point, last code point, word separator)
SCRIPTS = [
    ("Cyrillic", 0x430, 0x44F, " "),
    ("Greek", 0x3B1, 0x3C9, " "),
    ("Arabic", 0x627, 0x64A, " "),
    ("Hangul", 0xAC00, 0xD7A3, " "),
    ("Devanagari", 0x915, 0x939, " "),
    ("CJK", 0x4E00, 0x9FFF, ""),
    ("emoji", 0x1F600, 0x1F64F, " "),
]


@dataclass(frozen=True)
class Drawn:
    source: str  # "real text" or a script's name
    channel: str
    text: str
    onset: int  # first index from which the text is periodic
    period: int  # smallest period of the tail
    need: int  # characters after the onset before the channel's rule allows a fire


def smallest_period(unit: str) -> int:
    n = len(unit)
    return next(q for q in range(1, n + 1) if n % q == 0 and unit[:q] * (n // q) == unit)


def _words(rnd: random.Random, script: tuple[str, int, int, str], length: int) -> str:
    _, lo, hi, sep = script
    out = ""
    while len(out) < length:
        out += "".join(chr(rnd.randint(lo, hi)) for _ in range(rnd.randint(2, 7))) + sep
    return out[: length - 1] + rnd.choice(".!?\n")


def draw(pool: str, count: int, seed: int) -> list[Drawn]:
    """``count`` loops: two in three cut from ``pool``, one in three in another script."""
    rnd = random.Random(seed)
    out: list[Drawn] = []
    while len(out) < count:
        channel = rnd.choice(["thinking", "text"])
        if rnd.random() < 2 / 3:
            source = "real text"
            length = int(16 * 128 ** rnd.random())  # 16 to 2,048, log-uniform
            at = rnd.randrange(len(pool) - length)
            unit = pool[at : at + length]
            if "`" in unit:  # a fence would switch to the fence thresholds: not what is measured here
                continue
        else:
            script = rnd.choice(SCRIPTS)
            source = script[0]
            unit = _words(rnd, script, int(16 * 32 ** rnd.random()))  # 16 to 512
        p = smallest_period(unit)
        if p < 16:  # floods and short dividers are judged by length: the catalogue covers them
            continue
        rule = next(r for r in RepetitionDetector(channel).rules if p < r.below)
        need = max(math.ceil(rule.min_copies * p), rule.min_chars)
        prefix = prose(rnd.randint(200, 1500), rnd.randrange(1 << 30))
        text = prefix + unit * (need // p + 4)
        onset = len(prefix)
        while onset > 0 and text[onset - 1] == text[onset - 1 + p]:
            onset -= 1
        out.append(Drawn(source, channel, text, onset, p, need))
    return out
