"""Faster constructors for the frozen dataclasses built on the loop's hot path.

A frozen dataclass's generated ``__init__`` sets each field through a global
lookup and ``object.__setattr__``. The loop builds several events and stream
events per iteration, so `quick_init` gives a slotted frozen dataclass an
equivalent ``__init__``: the same signature (positional and keyword-only
parameters, defaults, default factories), which sets the slots through their
descriptors. The dataclass's own stays available as ``_dataclass_init``; the
tests hold the two to the same results.
"""

from __future__ import annotations

from dataclasses import MISSING, fields
from typing import Any

__all__ = ["quick_init"]


class _Factory:
    def __repr__(self) -> str:
        return "<factory>"  # as dataclasses shows a default_factory in a signature


_NO_VALUE = _Factory()


def quick_init(cls: Any) -> Any:
    """Replace ``cls.__init__`` (a slotted, frozen dataclass without ``__post_init__``
    or ``init=False`` fields, which the generated code does not reproduce)."""
    if (
        not cls.__dataclass_params__.frozen
        or "__slots__" not in cls.__dict__
        or hasattr(cls, "__post_init__")
        or not all(f.init for f in fields(cls))
    ):
        raise TypeError(f"quick_init needs a slotted frozen dataclass without __post_init__ or init=False fields: {cls!r}")
    positional: list[str] = []
    keyword: list[str] = []
    lines: list[str] = []
    namespace: dict[str, Any] = {"_NO_VALUE": _NO_VALUE}
    for i, f in enumerate(fields(cls)):
        namespace[f"_set{i}"] = getattr(cls, f.name).__set__
        if f.default is not MISSING:
            namespace[f"_d{i}"] = f.default
            param = f"{f.name}=_d{i}"
        elif f.default_factory is not MISSING:
            namespace[f"_f{i}"] = f.default_factory
            param = f"{f.name}=_NO_VALUE"
            lines.append(f"    if {f.name} is _NO_VALUE: {f.name} = _f{i}()")
        else:
            param = f.name
        (keyword if f.kw_only else positional).append(param)
        lines.append(f"    _set{i}(self, {f.name})")
    params = ["self", *positional, *(["*", *keyword] if keyword else [])]
    source = f"def __init__({', '.join(params)}):\n" + "\n".join(lines or ["    pass"]) + "\n"
    exec(source, namespace)  # the technique dataclasses itself uses
    init = namespace["__init__"]
    original = cls.__init__
    init.__qualname__ = f"{cls.__qualname__}.__init__"
    init.__module__ = cls.__module__
    init.__annotations__ = dict(original.__annotations__)
    init.__doc__ = original.__doc__
    cls._dataclass_init = original
    cls.__init__ = init
    return cls
