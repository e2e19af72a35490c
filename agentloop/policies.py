"""Stock runaway defences, built on the `agentloop._policy` seam (SPEC §6-7).

Two families, composable in ``QueryEngine(policies=[...])``:

- doom-loop policies watch the stream (`DoomLoopPolicy`, `ConservativeDoomLoopPolicy`):
  server ``response.doom_loop_check`` signals and the client-side
  `RepetitionDetector` are judged by one method, ``judge(signal)``;
- stationarity policies watch the tool calls (`IdenticalToolCallRun`,
  `ToolCallCycle`, `RepeatedErrorResult`): one method, ``key(call, result)``,
  says when two calls are "the same".

Every policy resets its counters at a genuine user message only
(``begin_turn(real_user=True)``), never at the library's own nudges. The
stationarity policies are implemented in `agentloop._stationarity`, the
detector in `agentloop._detector`; this module is their public home.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import replace
from typing import TYPE_CHECKING, Any, Literal

from ._checks import count
from ._detector import RepetitionDetector, Rule
from ._messages import Message
from ._model import (
    StreamEvent,
    StreamLogprobs,
    StreamSignals,
    StreamText,
    StreamThinking,
    StreamToolInput,
    StreamToolUseStart,
)
from ._policy import EndTurn, Hold, Nudge, Policy, Resample, Verdict, Warn
from ._signals import DoomLoopSignal
from ._stationarity import (
    IdenticalToolCallRun,
    RepeatedErrorResult,
    StationarityPolicy,
    ToolCallCycle,
    canonical_key,
    is_keepalive,
)

if TYPE_CHECKING:
    from ._accumulate import _Part

__all__ = [
    "ConservativeDoomLoopPolicy",
    "DoomLoopPolicy",
    "DoomLoopSignal",
    "EndTurn",
    "IdenticalToolCallRun",
    "Judgement",
    "Nudge",
    "Policy",
    "RepeatedErrorResult",
    "RepetitionDetector",
    "Resample",
    "Rule",
    "StationarityPolicy",
    "ToolCallCycle",
    "Verdict",
    "Warn",
    "canonical_key",
    "default_policies",
    "is_keepalive",
]

Judgement = Literal["ignore", "warn", "abort"]
_JUDGEMENTS = ("ignore", "warn", "abort")
_SIGNALS = (StreamSignals, StreamLogprobs)  # the events a tapped policy still takes one by one
_DELTAS = frozenset({StreamText, StreamThinking, StreamToolInput, StreamToolUseStart})  # what the engine holds back
# Without a client detector no delta is read: the engine holds back 255 at a time, a count it counts
# down among Python's cached small ints (a count past 256 makes a new int object per delta).
_NO_DETECTOR_HOLDS = 255


class DoomLoopPolicy(Policy):
    """Judge doom-loop signals from the server and from the client detector.

    Override `judge` to decide per signal: any "abort" cuts the stream and
    resamples (`Resample`), else any "warn" reports (`Warn`). This base class
    warns on everything and never aborts.

    ``client_detector=False`` relies on server frames only, ``server_signals=False`` on the
    client detector only (the server's `StreamSignals` are ignored then); ``channels``: the
    channels the client detector watches, some of "thinking" and "text" (TypeError or
    ValueError otherwise); ``detector`` passes
    keyword arguments to each channel's `RepetitionDetector` (e.g.
    ``{"window": 2048}``). Low-logprob: ``low_logprob@{channel}`` is raised once
    per run of ``logprob_run`` consecutive tokens whose log probability is below
    ``logprob_floor`` (defaults -6.0 and 24: two dozen tokens in a row the model
    itself found very unlikely, the mark of degenerate sampling rather than of
    a chant); ``logprob_floor=None`` turns it off.

    ``every`` (default 4) trades delay for cost: while nothing repeats, each
    detector gets the text once per ``every`` deltas (a detector search costs
    about as much as all the loop's other work for a few deltas), so a loop is
    seen at most ``every - 1`` deltas later than with ``every=1``: three
    characters for one-character deltas, 360 for 120-character ones. Once a run
    is live, every delta goes through, so it fires in the delta that crosses its
    threshold. Inside an engine, as its only stream watcher, the policy reads the
    deltas from the engine's accumulator, which holds them anyway, and the engine
    calls `on_stream` for one delta in ``every`` only (and for every other event);
    a subclass that overrides `on_stream` gets every event.
    """

    one_engine = True  # per-run state: one engine at a time

    def __init__(
        self,
        *,
        client_detector: bool = True,
        server_signals: bool = True,
        channels: tuple[str, ...] = ("thinking", "text"),
        detector: Mapping[str, Any] | None = None,
        logprob_floor: float | None = -6.0,
        logprob_run: int = 24,
        every: int = 4,
    ) -> None:
        every = count("every", every, 1, optional=False)
        logprob_run = count("logprob_run", logprob_run, 1, optional=False)
        channels = _channels(channels)
        opts = dict(detector or {})
        self.detectors = {ch: RepetitionDetector(ch, **opts) for ch in channels} if client_detector else {}
        self.every = every
        self._text = _Channel(self.detectors["text"]) if "text" in self.detectors else None
        self._thinking = _Channel(self.detectors["thinking"]) if "thinking" in self.detectors else None
        self.server_signals = server_signals
        self.logprob_floor = _floor(logprob_floor)
        self.logprob_run = logprob_run
        self._seen: set[str] = set()
        self._low_runs: dict[str, int] = {}
        self._blocks: Mapping[int, _Part] | None = None  # the attempt's blocks, when tapped
        self._feeding: tuple[_Channel, ...] = ()  # the channels a block of the attempt streams to
        self._read_blocks = 0
        self._holds = 0  # deltas the engine may hold back while no run is live

    def judge(self, signal: DoomLoopSignal) -> Judgement:
        """What to do about one new signal. Base: always "warn"."""
        return "warn"

    def begin_attempt(self) -> None:
        for det in self.detectors.values():
            det.reset()
        self._release()
        self._seen.clear()
        self._low_runs.clear()

    def on_response(self, message: Message) -> Verdict | None:
        self._release()  # the attempt is over: its deltas are the message's now
        return None

    def _release(self) -> None:
        for ch in (self._text, self._thinking):
            if ch is not None:
                ch.parts = []  # a new list: when tapped, the old one was the accumulator's
                ch.seen = 0
        self._feeding = ()
        self._blocks = None

    def _tap(self, blocks: Mapping[int, _Part], hold: Hold) -> Callable[[StreamEvent], Verdict | None] | None:
        if type(self).on_stream is not DoomLoopPolicy.on_stream:
            return None  # a subclass that watches each event itself
        self._blocks = blocks
        self._read_blocks = 0
        hold.skip = self._holds = self.every - 1 if self.detectors else _NO_DETECTOR_HOLDS
        # The policy keeps no reference to the engine: nothing of the run outlives it. A fork (a
        # deep copy) made mid-stream copies the attempt's chunks and buffers, which its own
        # `begin_attempt` clears before it reads any.
        return self._watcher(hold)

    def on_stream(self, event: StreamEvent) -> Verdict | None:
        # Called once per delta (once per `every` when tapped): exact-type tests first.
        if type(event) is StreamText:
            ch, delta = self._text, event.text
        elif type(event) is StreamThinking:
            ch, delta = self._thinking, event.thinking
        elif isinstance(event, StreamSignals):
            return self._verdict(self._server(event.signals, event.stopped)) if self.server_signals else None
        elif isinstance(event, StreamLogprobs):
            return self._verdict(self._logprobs(event))
        else:
            return self._watcher(_Unheld())(event) if self._blocks is not None else None
        if self._blocks is not None:  # tapped, and called by someone else than the engine
            return self._watcher(_Unheld())(event)
        if ch is None:  # no client detector on this channel
            return None
        parts = ch.parts
        parts.append(delta)
        if len(parts) < self.every and not ch.live:
            return None
        signals = ch.flush()
        return self._verdict(signals) if signals else None

    def _watcher(self, hold: Hold) -> Callable[[StreamEvent], Verdict | None]:
        """The tapped watcher, which the engine calls for one delta in `every` (for each one
        while a run is live) and for every other event. It hands each detector what its block
        received since the last call, and sets how many deltas the engine holds back next
        (``hold.skip``): after a delta, ``every - 1`` (0 while a run is live); after another
        event, the count goes on unless a run is live now. Only the channels a block of the
        attempt streams to are looked at (``_feeding``): a text-only stream pays for one
        channel, not two. No blocks: another engine's run, which one object cannot serve at
        once (``one_engine``), released them; nothing to read.

        The body is the closure itself, not a call of a method from it: the engine calls it
        once per hand-over, and a Python call more there costs ~300 instructions a hand-over
        (`benchmarks/callgrind_overhead.py`)."""

        def watch(event: StreamEvent) -> Verdict | None:
            blocks = self._blocks
            if blocks is None:
                return None
            if type(event) in _DELTAS:
                left = -1
            elif isinstance(event, _SIGNALS):
                return self.on_stream(event)
            else:
                left = hold.skip
            signals = self._follow(blocks) if len(blocks) != self._read_blocks else ()
            skips = self._holds
            for ch in self._feeding:
                parts, seen = ch.parts, ch.seen
                n = len(parts)
                if n > seen:
                    ch.seen = n
                    got = ch.det.feed("".join(parts[seen:]))  # one part: that part, not a copy
                    if got:
                        signals += got
                if ch.live:
                    skips = 0
            hold.skip = left if left >= 0 and skips else skips
            return self._verdict(signals) if signals else None

        return watch

    def _follow(self, blocks: Mapping[int, _Part]) -> tuple[DoomLoopSignal, ...]:
        """Blocks began since the last call: in the order they began, each channel reads the
        rest of the block it was reading, then moves on to its new one."""
        signals: tuple[DoomLoopSignal, ...] = ()
        for block in list(blocks.values())[self._read_blocks :]:
            ch = self._text if block.kind == "text" else self._thinking if block.kind == "thinking" else None
            if ch is not None:
                parts, seen = ch.parts, ch.seen
                if len(parts) > seen:
                    signals += ch.det.feed("".join(parts[seen:]))
                ch.parts, ch.seen = block.chunks, 0
                if ch not in self._feeding:  # in the channels' fixed order: signals keep theirs
                    self._feeding = tuple(c for c in (self._text, self._thinking) if c is ch or c in self._feeding)
        self._read_blocks = len(blocks)
        return signals

    def _verdict(self, signals: Sequence[DoomLoopSignal]) -> Verdict | None:
        if not signals:
            return None
        judged = [(s, self._judged(s)) for s in signals]
        kept = tuple(s for s, j in judged if j != "ignore")
        if any(j == "abort" for _, j in judged):
            return Resample(kept)
        return Warn(kept) if kept else None

    def _judged(self, signal: DoomLoopSignal) -> Judgement:
        """``judge(signal)``, checked: anything but a judgement (``"resample"``, ``None``) is a
        bug of the policy, raised (so logged once per attempt by the engine), never a warning."""
        judgement = self.judge(signal)
        if judgement not in _JUDGEMENTS:
            raise ValueError(
                f"{self.name}.judge returned {judgement!r} for {signal.format()}, not a judgement: "
                "it returns 'ignore', 'warn' or 'abort'"
            )
        return judgement

    def _server(self, raw: tuple[str, ...], stopped: bool = False) -> list[DoomLoopSignal]:
        """New signals of a server frame (frames repeat all signals so far); ``stopped``:
        the server ended the response on them."""
        new: list[DoomLoopSignal] = []
        for text in raw:
            if text in self._seen:
                continue
            self._seen.add(text)
            try:
                signal = DoomLoopSignal.parse(text)
            except ValueError:
                continue  # an unknown signal from a newer server is not an error
            new.append(replace(signal, stopped=True) if stopped else signal)
        return new

    def _logprobs(self, event: StreamLogprobs) -> list[DoomLoopSignal]:
        floor = self.logprob_floor
        if floor is None:
            return []
        run = self._low_runs.get(event.channel, 0)
        fired = False
        for lp in event.logprobs:
            if lp >= floor:
                run = 0
                continue
            run += 1
            fired = fired or run == self.logprob_run
        self._low_runs[event.channel] = run
        if not fired:
            return []
        return [DoomLoopSignal("low_logprob", event.channel, source="client")]


def _channels(value: Iterable[str]) -> tuple[str, ...]:
    """``channels``, checked: some of "thinking" and "text" (a str alone would be read letter
    by letter, and watch no channel). Raises TypeError or ValueError."""
    if value == ("thinking", "text"):  # the default, as it is (no walk: a policy is made per engine)
        return value
    try:
        if isinstance(value, str):
            raise TypeError
        names = tuple(value)
    except TypeError:
        raise TypeError(f'channels takes a tuple of "thinking" and "text", not {value!r}') from None
    for ch in names:
        if ch not in ("thinking", "text"):
            raise ValueError(f'channels takes "thinking" and "text", not {ch!r}')
    return names


def _floor(value: float | None) -> float | None:
    """``logprob_floor``, checked: a number (not NaN) or None. Raises TypeError or ValueError."""
    if value is None:
        return None
    if type(value) is float and value == value:  # the usual case first (not NaN)
        return value
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise TypeError(f"logprob_floor must be a number or None, not {value!r}")
    if math.isnan(value):
        raise ValueError("logprob_floor must be a number, not NaN")
    return value


class _Unheld:
    """The hold of a call of the tapped watcher that the engine did not make (`on_stream`
    called directly): it holds back nothing, and what the watcher sets is dropped."""

    __slots__ = ("skip",)

    def __init__(self) -> None:
        self.skip = 0


class _Channel:
    """One channel's detector and the deltas held back from it: its own list, or, when the
    engine taps the policy, the chunks of the block being streamed (``seen`` of them read)."""

    __slots__ = ("det", "live", "parts", "seen")

    def __init__(self, det: RepetitionDetector) -> None:
        self.det = det
        self.live = det._live  # the detector's own dict (kept across resets), not its read-only view
        self.parts: list[str] = []
        self.seen = 0

    def flush(self) -> tuple[DoomLoopSignal, ...]:
        parts = self.parts
        text = parts[0] if len(parts) == 1 else "".join(parts)
        parts.clear()
        return self.det.feed(text)


class ConservativeDoomLoopPolicy(DoomLoopPolicy):
    """SPEC §6 default: only a short thinking-channel tail repetition is confident,
    and a loop the server stopped the response on itself.

    A server ``tail_repetition`` on the thinking channel aborts when its period
    is at most ``max_threshold`` tokens; a client one (counted in characters)
    when its period is at most ``max_chars`` (default 256, about 64 tokens at
    four characters a token). The client detector only emits a thinking-channel
    ``tail_repetition`` once the loop is unmistakable (at least 256 characters
    of a short period, four copies of a 16-63-character unit, three copies of a
    longer one), so this never aborts on a single repeated phrase. Every other
    signal, and every text-channel signal, only warns, except a signal the server
    ended the response on (``stopped``: vLLM's ``finish_reason: "repetition"``), on
    either channel: the output is cut already, so resampling it loses nothing more.
    Other keyword arguments (``kwargs``) go to `DoomLoopPolicy`.
    """

    def __init__(self, max_threshold: int = 64, *, max_chars: int = 256, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        # 0: no tail from that source is confident (a period is at least 1).
        self.max_threshold = count("max_threshold", max_threshold, 0, optional=False)
        self.max_chars = count("max_chars", max_chars, 0, optional=False)

    def judge(self, signal: DoomLoopSignal) -> Judgement:
        """"abort" for a signal the server stopped the response on, and for a thinking-channel
        ``tail_repetition`` whose period is at most ``max_threshold`` tokens (``max_chars``
        characters, from the client detector); "warn" for any other."""
        if signal.stopped:
            return "abort"
        if signal.kind != "tail_repetition" or signal.channel != "thinking":
            return "warn"
        limit = self.max_chars if signal.unit == "chars" else self.max_threshold
        return "abort" if signal.threshold is not None and signal.threshold <= limit else "warn"


def default_policies() -> list[Policy]:
    """The policies a `QueryEngine` uses when given ``policies=None``."""
    return [ConservativeDoomLoopPolicy(), IdenticalToolCallRun()]
