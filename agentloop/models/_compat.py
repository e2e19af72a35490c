"""What a request must respect to reach a stricter server: tool names, tool call ids, and the
schemas OpenAI's strict function calling takes.

Each is applied when a request body is built, never to the transcript.
"""

from __future__ import annotations

import hashlib
import re
from collections.abc import Callable, Mapping, Sequence
from typing import Any

from .._errors import ModelError
from .._model import ToolSpec
from .._tools import TOOL_NAME

__all__ = ["GEMINI_TOOL_NAME", "check_tool_names", "short_ids", "strict_schema"]

#: Mistral's API (and the chat templates of Mistral's models, on vLLM or llama.cpp) take a
#: tool call id of exactly nine letters or digits.
SHORT_ID = re.compile(r"[a-zA-Z0-9]{9}")
_ALPHABET = "0123456789ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz"

#: Gemini's OpenAI-compatible endpoint: a tool name starts with a letter or ``_``.
GEMINI_TOOL_NAME = re.compile(r"[a-zA-Z_][a-zA-Z0-9_-]{0,63}")
_RULE = "1-64 letters, digits, '_' or '-'"
_GEMINI_RULE = "a letter or '_' first, then letters, digits, '_' or '-', 64 at most"


def _short(text: str, salt: int) -> str:
    """Nine base-62 digits of a hash of ``text`` (and ``salt``)."""
    seed = text if not salt else f"{salt}\0{text}"
    n = int.from_bytes(hashlib.sha256(seed.encode("utf-8", "surrogatepass")).digest()[:8], "big")
    out = []
    for _ in range(9):
        n, r = divmod(n, 62)
        out.append(_ALPHABET[r])
    return "".join(out)


def short_ids() -> Callable[[str], str]:
    """A mapping, for one request, of tool call ids to nine letters or digits (Mistral's rule).

    An id that fits is sent as it is; another becomes a hash of it. Deterministic: the same id
    maps to the same wire id in every request (a call and its result stay paired, prompt caches
    hold). Collision-free within the request: an id is mapped in the order it first appears, and
    a wire id already taken by another id makes it take the next hash (a case so rare that it
    never moves the ids mapped before it)."""
    given: dict[str, str] = {}
    taken: set[str] = set()

    def wire(tool_id: str) -> str:
        out = given.get(tool_id)
        if out is not None:
            return out
        out = tool_id if SHORT_ID.fullmatch(tool_id) else _short(tool_id, 0)
        salt = 0
        while out in taken:
            salt += 1
            out = _short(tool_id, salt)
        given[tool_id] = out
        taken.add(out)
        return out

    return wire


def check_tool_names(provider: str, tools: Sequence[ToolSpec], *, gemini: bool = False) -> None:
    """Raise `ModelError` (not retryable) for a declared tool whose name the server refuses:
    every request declaring it would fail with a 400. A `Tool` already refuses names no provider
    accepts; a tool described otherwise (a `ToolSpec` of the host's), or a name Gemini's stricter
    rule refuses (``gemini``), is caught here, before anything is sent."""
    pattern, rule = (GEMINI_TOOL_NAME, _GEMINI_RULE) if gemini else (TOOL_NAME, _RULE)
    for t in tools:
        if not isinstance(t.name, str) or not pattern.fullmatch(t.name):
            where = "Gemini" if gemini else provider
            raise ModelError(f"tool name {t.name!r} is not accepted by {where}: use {rule} (rename the tool)")


def strict_schema(tool: str, schema: Mapping[str, Any]) -> dict[str, Any]:
    """``schema`` as OpenAI's strict function calling takes it (a copy): every object closed
    (``additionalProperties: false``), every property required, no ``default``.

    A property that was optional becomes required only when its schema accepts ``null`` (a
    Python ``x: T | None = None``): the model then sends ``null`` for "not given", which such a
    parameter reads as its default. Raises `ModelError` (not retryable), naming the tool and the
    property, for what cannot be made strict without changing what the tool accepts: an optional
    property that does not accept ``null``, an object open to other properties, a root that is not
    an object."""
    if schema.get("type") != "object":
        raise ModelError(f"tool {tool!r} cannot be made strict: its input schema is not an object")
    out = _strict(tool, schema, "")
    assert isinstance(out, dict)
    return out


def _strict(tool: str, node: Any, where: str) -> Any:
    if isinstance(node, list):
        return [_strict(tool, v, where) for v in node]
    if not isinstance(node, Mapping):
        return node
    out: dict[str, Any] = {}
    for key, value in node.items():
        if key == "default":
            continue
        if key in ("properties", "$defs", "definitions", "patternProperties") and isinstance(value, Mapping):
            out[key] = {k: _strict(tool, v, k if key == "properties" else where) for k, v in value.items()}
        elif key in ("items", "anyOf", "oneOf", "allOf", "prefixItems", "not"):
            out[key] = _strict(tool, value, where)
        else:
            out[key] = value
    if node.get("type") == "object" or "properties" in node:
        extra = node.get("additionalProperties", False)
        if extra is not False:
            what = f"property {where!r}" if where else "its input"
            raise ModelError(
                f"tool {tool!r} cannot be made strict: {what} is an object open to other properties "
                "(additionalProperties), which strict mode refuses"
            )
        out["additionalProperties"] = False
        required = list(node.get("required") or [])
        for name, prop in (node.get("properties") or {}).items():
            if name in required:
                continue
            if not _accepts_null(prop):
                raise ModelError(
                    f"tool {tool!r} cannot be made strict: the optional property {name!r} does not accept "
                    "null (strict mode requires every property; give it a type that allows null, "
                    "`x: T | None = None`, or make it required)"
                )
            required.append(name)
        if "properties" in node or "required" in node:
            out["required"] = required
    return out


def _accepts_null(schema: Any) -> bool:
    if not isinstance(schema, Mapping):
        return False
    kind = schema.get("type")
    if kind == "null" or (isinstance(kind, list) and "null" in kind):
        return True
    return any(_accepts_null(s) for key in ("anyOf", "oneOf") for s in schema.get(key) or ())
