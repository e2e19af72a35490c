"""Doom-loop signals: the shared vocabulary of server frames and the client detector.

Grammar (SPEC §6), ``channel`` being ``thinking`` or ``text``:

    tail_repetition:{threshold}@{channel}     threshold = period of the repeating tail
    low_logprob@{channel}
    exact_repetition:{tokens}x{copies}@{channel}

A server counts tokens; agentloop's own detector counts characters. The unit
is not part of the wire grammar, so it travels beside it in ``unit``
(``"tokens"`` for parsed server signals, ``"chars"`` for the detector's).
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Literal

__all__ = ["DoomLoopSignal", "SignalKind", "SignalUnit"]

SignalKind = Literal["tail_repetition", "low_logprob", "exact_repetition"]
SignalUnit = Literal["tokens", "chars"]

_TAIL = re.compile(r"tail_repetition:(\d+)@(\w+)")
_LOW = re.compile(r"low_logprob@(\w+)")
_EXACT = re.compile(r"exact_repetition:(\d+)x(\d+)@(\w+)")


@dataclass(frozen=True, slots=True)
class DoomLoopSignal:
    """One signal. ``threshold`` is set for tail_repetition, ``tokens`` and
    ``copies`` for exact_repetition (``tokens`` is the repeated length, in
    ``unit``s). ``source`` is "server" or "client"."""

    kind: SignalKind
    channel: str
    threshold: int | None = None
    tokens: int | None = None
    copies: int | None = None
    unit: SignalUnit = "tokens"
    source: Literal["server", "client"] = "server"

    @classmethod
    def parse(cls, text: str, *, unit: SignalUnit = "tokens") -> DoomLoopSignal:
        """Parse one signal string; raises ValueError with the text on bad input."""
        s = text.strip()
        if m := _TAIL.fullmatch(s):
            return cls("tail_repetition", m[2], threshold=int(m[1]), unit=unit)
        if m := _LOW.fullmatch(s):
            return cls("low_logprob", m[1], unit=unit)
        if m := _EXACT.fullmatch(s):
            return cls("exact_repetition", m[3], tokens=int(m[1]), copies=int(m[2]), unit=unit)
        raise ValueError(f"not a doom-loop signal: {text!r}")

    def format(self) -> str:
        """The wire form (inverse of `parse`)."""
        if self.kind == "tail_repetition":
            return f"tail_repetition:{self.threshold}@{self.channel}"
        if self.kind == "low_logprob":
            return f"low_logprob@{self.channel}"
        return f"exact_repetition:{self.tokens}x{self.copies}@{self.channel}"

    def __str__(self) -> str:
        return f"{self.format()} ({self.unit})"
