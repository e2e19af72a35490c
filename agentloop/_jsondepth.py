"""How deeply decoded JSON may nest, the same on every Python version.

How deep `json` decodes moved with the interpreter: 3.11 stops a little short of the
recursion limit (about 1000 levels), 3.12 and 3.13 go further (3.13 tens of
thousands of levels), and a value nested that deeply then fails whatever walks it in
Python later (a repr, a session file, a surrogate scrub). The library's own limit
holds on each.
"""

from __future__ import annotations

import json
import re
from itertools import accumulate
from typing import Any

__all__ = ["MAX_JSON_DEPTH", "TOO_DEEP", "check_depth", "deeper_than", "json_too_deep", "loads"]

#: The most levels of arrays and objects decoded JSON may nest (a model stuck repeating ``[``
#: goes past it; real tool inputs and stream events nest a few).
MAX_JSON_DEPTH = 400

_BRACKET = re.compile(r"[][{}]")
_STEP = {"[": 1, "{": 1, "]": -1, "}": -1}


def deeper_than(value: Any, limit: int) -> bool:
    """Whether ``value`` nests dicts and lists more than ``limit`` levels below itself (found
    without recursion, so any depth is measured)."""
    stack = [(value, 0)]
    while stack:
        item, depth = stack.pop()
        if depth > limit:
            return True
        children = item.values() if isinstance(item, dict) else item
        stack.extend((c, depth + 1) for c in children if isinstance(c, dict | list))
    return False


def json_too_deep(text: str) -> bool:
    """Whether JSON ``text`` opens more than `MAX_JSON_DEPTH` levels of arrays and objects at
    once (brackets inside strings aside), whether or not it is valid or complete. Free for a
    text with too few brackets to nest that deep."""
    if len(text) <= MAX_JSON_DEPTH or text.count("[") + text.count("{") <= MAX_JSON_DEPTH:
        return False
    steps = map(_STEP.__getitem__, _BRACKET.findall(_outside_strings(text)))
    return max(accumulate(steps), default=0) > MAX_JSON_DEPTH  # the deepest point, summed in C


def _outside_strings(text: str) -> str:
    """``text`` without its strings (one left open runs to the end), in a few passes of C: in
    JSON a backslash only ever starts an escape, so with the escapes gone every quote opens or
    closes a string."""
    if "\\" in text:
        text = text.replace("\\\\", "")  # an escaped backslash first: it escapes no quote
    if "\\" in text:
        text = text.replace('\\"', "")
    return "".join(text.split('"')[::2])


#: The error for JSON past `MAX_JSON_DEPTH`.
TOO_DEEP = f"the JSON is nested too deeply to decode (more than {MAX_JSON_DEPTH} levels)"


def check_depth(text: str) -> None:
    """Raise `ValueError` (`TOO_DEEP`) when JSON ``text`` nests past `MAX_JSON_DEPTH`."""
    if json_too_deep(text):
        raise ValueError(TOO_DEEP)


def loads(text: str | bytes | bytearray) -> Any:
    """``json.loads(text)`` for text from outside the library: `ValueError` for invalid JSON and
    for JSON nested more than `MAX_JSON_DEPTH` levels (`TOO_DEEP`), never `RecursionError`."""
    if not isinstance(text, str):
        raw = bytes(text)
        text = raw.decode(json.detect_encoding(raw), "surrogatepass")
    check_depth(text)
    try:
        return json.loads(text)
    except RecursionError:
        raise ValueError(TOO_DEEP) from None
