"""What the public docstrings promise, held to it: ``help(agentloop.X)`` and an IDE's hover text
are read before the docs, so each name has a docstring, each parameter it names exists, and each
behaviour it states is true."""

from __future__ import annotations

import importlib
import inspect
import re
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

PUBLIC_MODULES = [
    "agentloop",
    "agentloop.policies",
    "agentloop.sessions",
    "agentloop.models",
    "agentloop.mcp",
    "agentloop.testing",
]
API_MD = Path(__file__).resolve().parent.parent / "docs" / "api.md"
_CODE_SPAN = re.compile(r"``(.+?)``|`([^`]+)`", re.S)
#: The project's way to define a parameter: ````name``: what it is`` at the start of a line or a
#: sentence (no Args/Parameters sections: the docstrings are prose).
_DEFINITION = re.compile(r"(?:^|[.;] )``(\w+)``:", re.M)


def _public() -> Iterator[tuple[str, Any]]:
    """Each public object once, with the first public name it has."""
    seen: set[int] = set()
    for module_name in PUBLIC_MODULES:
        module = importlib.import_module(module_name)
        for name in module.__all__:
            obj = getattr(module, name)
            if id(obj) not in seen:
                seen.add(id(obj))
                yield f"{module_name}.{name}", obj


def _is_alias(obj: object) -> bool:
    """A type alias (a union, a ``Literal``, a ``Callable``): it cannot carry a docstring."""
    return not isinstance(obj, type) and not inspect.isfunction(obj)


def _members(cls: type) -> Iterator[tuple[str, Callable[..., Any] | property]]:
    """The public methods and properties a class defines itself (and ``__call__``)."""
    for key, value in vars(cls).items():
        if key.startswith("_") and key != "__call__":
            continue
        if isinstance(value, classmethod | staticmethod):
            yield key, value.__func__
        elif isinstance(value, property) or inspect.isfunction(value):
            yield key, value


def _own_doc(cls: type) -> str | None:
    """The class's own docstring: the one a dataclass writes for itself (its signature) is none."""
    doc = cls.__doc__
    if doc is None or doc.startswith(f"{cls.__name__}("):
        return None
    return doc


def _signature(obj: Any) -> inspect.Signature | None:
    try:
        return inspect.signature(obj)
    except (TypeError, ValueError):
        return None


def _code_words(text: str | None) -> set[str]:
    words: set[str] = set()
    for double, single in _CODE_SPAN.findall(text or ""):
        words |= set(re.findall(r"\w+", double or single))
    return words


def _parameters(fn: Any) -> list[str]:
    sig = _signature(fn)
    return [] if sig is None else [p for p in sig.parameters if p not in ("self", "cls")]


def test_every_public_name_has_a_docstring_and_every_member_too() -> None:
    missing: list[str] = []
    for qual, obj in _public():
        if _is_alias(obj):
            continue
        if isinstance(obj, type):
            if _own_doc(obj) is None:
                missing.append(qual)
            for key, member in _members(obj):
                doc = member.__doc__ if isinstance(member, property) else inspect.getdoc(member)
                if not doc or doc == "Call self as a function.":
                    missing.append(f"{qual}.{key}")
        elif not inspect.getdoc(obj):
            missing.append(qual)
    assert missing == []


def test_every_public_type_alias_is_in_the_api_reference() -> None:
    words = _code_words(API_MD.read_text(encoding="utf-8"))
    aliases = [qual for qual, obj in _public() if _is_alias(obj)]
    assert aliases  # Event, Block, TerminalReason... are aliases
    assert [qual for qual in aliases if qual.rsplit(".", 1)[1] not in words] == []


def test_every_parameter_a_docstring_defines_exists() -> None:
    wrong: list[str] = []
    for qual, obj in _public():
        if _is_alias(obj):
            continue
        targets: list[tuple[str, Any, str | None]] = [(qual, obj, obj.__doc__)]
        if isinstance(obj, type):
            targets += [(f"{qual}.{k}", m, m.__doc__) for k, m in _members(obj)]
        for where, target, doc in targets:
            known = set(_parameters(target)) | set(_parameters(obj))
            wrong += [
                f"{where}: ``{name}``"
                for name in _DEFINITION.findall(doc or "")
                if name not in known and not (isinstance(obj, type) and hasattr(obj, name))
            ]
    assert wrong == []


def test_every_public_parameter_is_explained_in_its_docstring_or_the_api_reference() -> None:
    """A parameter is explained when its docstring (the class's, for a constructor or a method)
    names it, or when docs/api.md shows it in code."""
    api_words = _code_words(API_MD.read_text(encoding="utf-8"))
    unexplained: list[str] = []

    def check(where: str, fn: Any, *docs: str | None) -> None:
        text = "\n".join(d for d in docs if d)
        unexplained.extend(
            f"{where}: {name}"
            for name in _parameters(fn)
            if name not in api_words and not re.search(rf"(?<!\w){re.escape(name)}(?!\w)", text)
        )

    for qual, obj in _public():
        if _is_alias(obj):
            continue
        if not isinstance(obj, type):
            check(qual, obj, inspect.getdoc(obj))
            continue
        # A constructor is explained where it is defined: an error subclass takes its base's.
        owner = next((c for c in obj.__mro__ if "__init__" in vars(c)), obj)
        if not getattr(obj, "_is_protocol", False):
            check(f"{qual}()", obj, _own_doc(obj), _own_doc(owner), vars(owner)["__init__"].__doc__)
        for key, member in _members(obj):
            if not isinstance(member, property):
                check(f"{qual}.{key}", member, inspect.getdoc(member), _own_doc(obj))
    assert unexplained == []


@pytest.mark.parametrize("module_name", PUBLIC_MODULES)
def test_the_walk_sees_each_public_module(module_name: str) -> None:
    module = importlib.import_module(module_name)
    assert module.__doc__
    assert module.__all__
