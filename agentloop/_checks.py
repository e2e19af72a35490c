"""Checks of the numbers a class or function is given when it is made: a count, a number of
seconds. One wording, and one idea of a whole number (any `numbers.Integral` but a bool, as
numpy's integers are), for every setting (`JsonlSession`'s ``fsync_every`` alone also takes a
whole float, such as a config file's ``2.0``); each error names the setting.

This module imports nothing of agentloop's: every layer (the kernel, the providers, the
session store) may use it.
"""

from __future__ import annotations

import numbers
from typing import Any

__all__ = ["count", "non_negative"]


def count(name: str, value: Any, least: int, *, optional: bool = True) -> Any:
    """``value``, checked as a setting that counts: a whole number of at least ``least`` (an
    int, also when it came as another `numbers.Integral`), or None (off) when ``optional``.
    Raises TypeError or ValueError naming ``name``."""
    if type(value) is int and value >= least:  # the usual case first: a policy is made per engine
        return value
    if value is None and optional:
        return None
    if isinstance(value, bool) or not isinstance(value, numbers.Integral):
        raise TypeError(f"{name} takes a whole number{' or None' if optional else ''}, not {value!r}")
    if int(value) < least:
        raise ValueError(f"{name} must be at least {least}, not {value!r}")
    return int(value)


def non_negative(name: str, value: Any, *, whole: bool = False, optional: bool = False) -> None:
    """Raise TypeError unless ``value`` is a number of seconds (with ``whole``, a whole number),
    or None when ``optional``; ValueError for one below 0, NaN, or an int past any float (no
    number of seconds a clock can add, no count a run can use)."""
    if value is None and optional:
        return
    if isinstance(value, bool) or not isinstance(value, numbers.Integral if whole else numbers.Real):
        what = "a whole number" if whole else "a number of seconds"
        raise TypeError(f"{name} takes {what}{' or None' if optional else ''}, not {value!r}")
    try:
        at_least_zero = float(value) >= 0  # NaN too
    except OverflowError:
        raise ValueError(f"{name} is too large{'' if whole else ' for a number of seconds'}") from None
    if not at_least_zero:
        raise ValueError(f"{name} must be >= 0, not {value!r}")
