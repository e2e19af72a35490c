"""Lone UTF-16 surrogates: strings Python holds but UTF-8 cannot encode.

They reach a transcript from outside: a JSON ``\\ud83d`` escape without its other
half (a server that slices text by UTF-16 unit), or a tool's output holding a
file name decoded with ``surrogateescape`` (``os.listdir`` on a name that is
not UTF-8 gives ``'caf\\udce9.txt'``). Kept as they are, they make every later
request fail to encode. The library scrubs them where model output and tool
results come in: two adjacent halves become the character they encode, and a
lone one becomes U+FFFD.
"""

from __future__ import annotations

import re
from typing import Any

__all__ = ["has_surrogates", "json_escapes_surrogate", "scrub", "scrub_json"]

_SURROGATE = re.compile("[\ud800-\udfff]")


def has_surrogates(text: str) -> bool:
    """True when ``text`` holds a surrogate code point (so UTF-8 cannot encode it)."""
    return not text.isascii() and _SURROGATE.search(text) is not None


def scrub(text: str) -> str:
    """``text`` with each pair of adjacent surrogate halves joined into its character
    and each lone half replaced by U+FFFD; ``text`` itself when it has none."""
    if not has_surrogates(text):
        return text
    return text.encode("utf-16-le", "surrogatepass").decode("utf-16-le", "replace")


def scrub_json(value: Any) -> Any:
    """`scrub` applied to every string (keys too) of a JSON-like value."""
    if isinstance(value, str):
        return scrub(value)
    if isinstance(value, dict):
        return {scrub(k) if isinstance(k, str) else k: scrub_json(v) for k, v in value.items()}
    if isinstance(value, list):
        return [scrub_json(v) for v in value]
    return value


def json_escapes_surrogate(text: str) -> bool:
    """True when JSON ``text`` may decode to a surrogate: it holds a ``\\uD...`` escape
    (a cheap over-approximation, checked before decoding) or a raw surrogate."""
    return "\\ud" in text or "\\uD" in text or (not text.isascii() and has_surrogates(text))  # one call less for ASCII
