"""Doom-loop signals: the shared vocabulary of server frames and the client detector.

Grammar (SPEC §6), ``channel`` being ``thinking`` or ``text``:

    tail_repetition:{threshold}@{channel}     threshold = period of the repeating tail
    tail_repetition@{channel}                 a server that stopped a loop without its period
    low_logprob@{channel}
    exact_repetition:{tokens}x{copies}@{channel}

A server counts tokens; agentloop's own detector counts characters. The unit
is not part of the wire grammar, so it travels beside it in ``unit``
(``"tokens"`` for parsed server signals, ``"chars"`` for the detector's).

A server that ends the response itself on a loop it saw (vLLM's ``finish_reason:
"repetition"``) reports a ``tail_repetition`` without a period, marked ``stopped``: the
stream is already cut, so what is left to decide is whether to resample or accept it.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Literal

__all__ = ["DoomLoopSignal", "SignalKind", "SignalUnit"]

SignalKind = Literal["tail_repetition", "low_logprob", "exact_repetition"]
SignalUnit = Literal["tokens", "chars"]

_TAIL = re.compile(r"tail_repetition(?::(\d+))?@(\w+)")
_LOW = re.compile(r"low_logprob@(\w+)")
_EXACT = re.compile(r"exact_repetition:(\d+)x(\d+)@(\w+)")


@dataclass(frozen=True, slots=True)
class DoomLoopSignal:
    """One signal. ``threshold`` is set for tail_repetition, ``tokens`` and
    ``copies`` for exact_repetition (``tokens`` is the repeated length, in
    ``unit``s; a server ``tail_repetition`` may come without a ``threshold``).
    ``source`` is "server" or "client". ``stopped``: the server ended the response
    on this signal itself (vLLM's ``finish_reason: "repetition"``)."""

    kind: SignalKind
    channel: str
    threshold: int | None = None
    tokens: int | None = None
    copies: int | None = None
    unit: SignalUnit = "tokens"
    source: Literal["server", "client"] = "server"
    stopped: bool = False

    @classmethod
    def parse(cls, text: str, *, unit: SignalUnit = "tokens") -> DoomLoopSignal:
        """Parse one signal string; raises ValueError with the text on bad input."""
        s = text.strip()
        if m := _TAIL.fullmatch(s):
            return cls("tail_repetition", m[2], threshold=int(m[1]) if m[1] else None, unit=unit)
        if m := _LOW.fullmatch(s):
            return cls("low_logprob", m[1], unit=unit)
        if m := _EXACT.fullmatch(s):
            return cls("exact_repetition", m[3], tokens=int(m[1]), copies=int(m[2]), unit=unit)
        raise ValueError(f"not a doom-loop signal: {text!r}")

    def format(self) -> str:
        """The wire form (inverse of `parse`)."""
        if self.kind == "tail_repetition":
            if self.threshold is None:
                return f"tail_repetition@{self.channel}"
            return f"tail_repetition:{self.threshold}@{self.channel}"
        if self.kind == "low_logprob":
            return f"low_logprob@{self.channel}"
        return f"exact_repetition:{self.tokens}x{self.copies}@{self.channel}"

    def __str__(self) -> str:
        return f"{self.format()} ({self.unit})"
