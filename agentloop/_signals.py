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
import reprlib
from dataclasses import dataclass
from typing import Literal

from ._checks import count

__all__ = ["DoomLoopSignal", "SignalKind", "SignalUnit"]

SignalKind = Literal["tail_repetition", "low_logprob", "exact_repetition"]
SignalUnit = Literal["tokens", "chars"]

# ASCII only: a server writes its counts in ASCII digits, and int() would also read "٣٢" as 32.
# A count has at most 18 digits (a longer one is no count a server could have made).
_N = r"([0-9]{1,18})"
_CHANNEL = re.compile(r"\w+", re.ASCII)
_TAIL = re.compile(rf"tail_repetition(?::{_N})?@(\w+)", re.ASCII)
_LOW = re.compile(r"low_logprob@(\w+)", re.ASCII)
_EXACT = re.compile(rf"exact_repetition:{_N}x{_N}@(\w+)", re.ASCII)
_KINDS = ("tail_repetition", "low_logprob", "exact_repetition")


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

    def __post_init__(self) -> None:
        """Raises ValueError (TypeError for a count that is not a whole number) for a signal that has no
        wire form: `format` would write what `parse` refuses."""
        if self.kind not in _KINDS:
            raise ValueError(f"DoomLoopSignal kind must be one of {', '.join(_KINDS)}, not {self.kind!r}")
        if not isinstance(self.channel, str) or not _CHANNEL.fullmatch(self.channel):
            raise ValueError(f"DoomLoopSignal channel must be a name such as 'thinking' or 'text', not {self.channel!r}")
        for name in ("threshold", "tokens", "copies"):
            object.__setattr__(self, name, count(f"DoomLoopSignal {name}", getattr(self, name), 1))
        if self.kind == "exact_repetition" and (self.tokens is None or self.copies is None):
            raise ValueError("an exact_repetition DoomLoopSignal needs tokens and copies")

    @classmethod
    def parse(cls, text: str, *, unit: SignalUnit = "tokens") -> DoomLoopSignal:
        """Parse one signal string; raises ValueError with the text on bad input (also a count
        of 0, or digits other than ASCII), TypeError for what is not a str."""
        if not isinstance(text, str):
            raise TypeError(f"DoomLoopSignal.parse takes a str, not {type(text).__name__}")
        s = text.strip()
        try:
            if m := _TAIL.fullmatch(s):
                return cls("tail_repetition", m[2], threshold=int(m[1]) if m[1] else None, unit=unit)
            if m := _LOW.fullmatch(s):
                return cls("low_logprob", m[1], unit=unit)
            if m := _EXACT.fullmatch(s):
                return cls("exact_repetition", m[3], tokens=int(m[1]), copies=int(m[2]), unit=unit)
        except ValueError:  # a count of 0
            pass
        raise ValueError(f"not a doom-loop signal: {reprlib.repr(text)}")

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
