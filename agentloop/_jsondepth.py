"""How deeply decoded JSON may nest, the same on every Python version.

How deep `json` decodes moved with the interpreter: 3.11 stops a little short of the
recursion limit (about 1000 levels), 3.12 and 3.13 go further (3.13 tens of
thousands of levels), and a value nested that deeply then fails whatever walks it in
Python later (a repr, a session file, a surrogate scrub). The library's own limit
holds on each.
"""

from __future__ import annotations

import re
from typing import Any

__all__ = ["MAX_JSON_DEPTH", "deeper_than", "json_too_deep"]

#: The most levels of arrays and objects decoded JSON may nest (a model stuck repeating ``[``
#: goes past it; real tool inputs and stream events nest a few).
MAX_JSON_DEPTH = 400

_STRING = re.compile(r'"(?:[^"\\]|\\.)*"?')  # to the end of the text, for one left open
_BRACKET = re.compile(r"[][{}]")


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
    depth = 0
    for bracket in _BRACKET.findall(_STRING.sub("", text)):
        depth += 1 if bracket in "[{" else -1
        if depth > MAX_JSON_DEPTH:
            return True
    return False
