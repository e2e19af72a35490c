"""The JSON schema `@tool` sends: pydantic's, made plain enough for every provider.

Pydantic writes each model, enum, dataclass and TypedDict once under ``$defs`` and points to
it with ``$ref``; Gemini's function declarations (and the gateways in front of Gemini) refuse
``$ref``, so every definition is written out where it is used. Only a definition that contains
itself (a tree's node) cannot be, and stays under ``$defs``. A discriminated union becomes a
plain ``anyOf`` (its OpenAPI ``discriminator`` maps tags to those refs). Pydantic also gives
every schema a ``title`` that restates its name ("title": "Path" over the property ``path``):
noise the model reads on every request, and a keyword Gemini's subset refuses; it goes. So does
a ``default`` that JSON cannot hold (``limit: float = math.inf``, "no limit"): written as
``Infinity`` it would make every request that offers the tool fail to encode. The parameter
keeps its default; the model is only not told what it is.
"""

from __future__ import annotations

import math
from typing import Any

__all__ = ["plain_schema"]

#: Keywords whose value is a schema, a list of schemas, or a map of names to schemas.
_ONE = frozenset({"items", "additionalProperties", "not", "contains", "propertyNames", "if", "then", "else"})
_LIST = frozenset({"anyOf", "oneOf", "allOf", "prefixItems"})
_MAP = frozenset({"properties", "patternProperties", "dependentSchemas"})
_DEFS = "#/$defs/"


def plain_schema(schema: dict[str, Any]) -> dict[str, Any]:
    """``schema`` (as pydantic makes it) with each ``$ref`` to its ``$defs`` replaced by the
    definition, and no ``title`` keyword. A definition that contains itself stays a ``$ref``,
    and is kept under ``$defs``."""
    defs: dict[str, Any] = schema.get("$defs", {})
    loops = {name for name in defs if name in _refs(defs[name], defs, set())}
    wanted: set[str] = set()
    out: dict[str, Any] = _plain({k: v for k, v in schema.items() if k != "$defs"}, defs, loops, wanted)
    kept: dict[str, Any] = {}
    while wanted - kept.keys():
        name = min(wanted - kept.keys())
        kept[name] = _plain(defs[name], defs, loops, wanted)
    if kept:
        out["$defs"] = dict(sorted(kept.items()))
    return out


def _def_name(node: dict[str, Any], defs: dict[str, Any]) -> str | None:
    ref = node.get("$ref")
    if isinstance(ref, str) and ref.startswith(_DEFS) and ref[len(_DEFS) :] in defs:
        return ref[len(_DEFS) :]
    return None


def _refs(node: Any, defs: dict[str, Any], seen: set[str]) -> set[str]:
    """The definitions ``node`` reaches, through the definitions it refers to."""
    if not isinstance(node, dict):
        return seen
    name = _def_name(node, defs)
    if name is not None and name not in seen:
        seen.add(name)
        _refs(defs[name], defs, seen)
    for key, value in node.items():
        if key in _ONE:
            _refs(value, defs, seen)
        elif key in _LIST and isinstance(value, list):
            for v in value:
                _refs(v, defs, seen)
        elif key in _MAP and isinstance(value, dict):
            for v in value.values():
                _refs(v, defs, seen)
    return seen


def _plain(node: Any, defs: dict[str, Any], loops: set[str], wanted: set[str]) -> Any:
    """``node`` with its refs written out (but those to ``loops``, which are added to ``wanted``)."""
    if not isinstance(node, dict):
        return node
    own = {k: _plain_value(k, v, defs, loops, wanted) for k, v in node.items() if k != "title"}
    if "default" in own and not _finite(own["default"]):
        del own["default"]
    if "discriminator" in own and "oneOf" in own:
        # A discriminated union: OpenAPI's "discriminator" maps each tag to a ``$ref`` (written
        # out now, so pointing nowhere). Its branches exclude each other by their tag, so an
        # anyOf says the same, in the JSON Schema that OpenAI's strict mode and Gemini take.
        del own["discriminator"]
        own["anyOf"] = own.pop("oneOf")
    name = _def_name(node, defs)
    if name is None:
        return own
    del own["$ref"]
    if name in loops:
        wanted.add(name)
        return {"$ref": node["$ref"], **own}
    # The use's own keywords (a field's description, its default) win over the definition's.
    return {**_plain(defs[name], defs, loops, wanted), **own}


def _finite(value: Any) -> bool:
    """Whether ``value`` (JSON data) holds no NaN or infinity, which strict JSON cannot hold."""
    if isinstance(value, float):
        return math.isfinite(value)
    if isinstance(value, dict):
        return all(_finite(v) for v in value.values())
    if isinstance(value, list):
        return all(_finite(v) for v in value)
    return True


def _plain_value(key: str, value: Any, defs: dict[str, Any], loops: set[str], wanted: set[str]) -> Any:
    if key in _ONE:
        return _plain(value, defs, loops, wanted)
    if key in _LIST and isinstance(value, list):
        return [_plain(v, defs, loops, wanted) for v in value]
    if key in _MAP and isinstance(value, dict):
        return {name: _plain(v, defs, loops, wanted) for name, v in value.items()}
    return value  # an enum's values, a default, a description: data, not schemas
