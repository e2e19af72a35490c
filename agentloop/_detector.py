"""Client-side repetition detector: streamed text in, doom-loop signals out.

A runaway generation is a *periodic suffix*: from some onset on, every
character equals the one ``p`` characters earlier. `RepetitionDetector` finds
the smallest such ``p`` (up to ``window`` characters) for the text streamed on
one channel and reports it, in characters, with the server's vocabulary:

    tail_repetition:{p}@{channel}            the tail repeats with period p
    exact_repetition:{p}x{copies}@{channel}  a p-char unit repeated `copies` times

How (exact, no hashing heuristics):

- Checkpoints sit at fixed absolute offsets (every ``step`` characters), so the
  work done never depends on how the stream is chunked. At a checkpoint the
  last ``anchor`` characters are looked up backwards with ``str.rfind``; the
  latest earlier occurrence at distance ``d`` is the smallest candidate period
  (a tail with period p contains its anchor p characters back, so the latest
  occurrence is never further than p). A candidate is kept only when the text
  really holds two full copies (one slice comparison), and its onset is found
  by comparing slices backwards.
- The search reach grows geometrically with the checkpoint's alignment:
  ``2*step`` characters at every checkpoint, twice that (and twice the stride)
  at every 2nd, and so on up to ``window``. A period p is therefore adopted at
  most one stride (shorter than p, or ``step`` for p <= step) after its second
  copy is complete, before any rule that asks for three copies can be due;
  scanning costs O(log window) C-level character comparisons per character,
  and Python runs once per checkpoint, not per character (one ``rfind`` per
  reach; a method call only when the needle recurs). Growing by 2 rather than
  4 scans about a quarter less: a chunk pays for the farthest-reaching
  checkpoint it spans, and the next reach up is only twice as far.
- Candidates come from the anchor itself only within the first 64 distances. A
  period p past them holds two copies before it is adopted, so its last p
  characters recur p back: the distances beyond are searched with the last 64
  characters, a needle that recurs by chance far less often in real text
  (indentation, keywords, a line written twice) and that CPython's search
  skips along faster. While no run is live and the reach is at most 4,096 (the
  default window), one search of the anchor over the whole reach comes first:
  the far needle ends with the anchor, so where the anchor does not recur
  (most checkpoints), the far needle does not either, and a checkpoint costs
  that one search. The anchor crosses a long reach more slowly than the far
  needle would, but one search costs less than two (each is a Python call, a
  needle sliced and its skip table built): with the detector on, streaming 24- and
  120-character deltas costs 1.094x and 1.137x the instructions it costs off, against 1.100x
  and 1.155x with two searches (callgrind; docs/policies.md). A wider reach is searched in two
  parts, the near distances
  with the anchor and the far ones with the far needle.
- A live candidate is extended per delta with one slice comparison; the first
  mismatch (found only when the comparison fails) ends the run.
- Memory is bounded: the buffer keeps at most ``3*window + 2*anchor``
  characters.

Thresholds: a run of length L with smallest period p fires when ``L/p`` and
``L`` reach the first `Rule` whose ``below`` exceeds p, per channel. The
defaults (tuned on the benchmark in ``benchmarks/runaway``) are stricter on the
content channel than on the thinking channel, and stricter still inside a
Markdown code fence (a line opening with three back-ticks): fences raise the
thresholds, they never switch detection off.

Boundary cases (documented policy, see docs/policies.md): exact repetition that
may be legitimate — base64 of zero bytes, a zero matrix, a hexdump of a zero
page, or text the user asked to be repeated — *is* reported, because the
detector cannot know intent. The stock policies never abort on the text
channel, so on that channel such output only produces a non-confident warning;
the confident verdict is reserved for the thinking channel.
"""

from __future__ import annotations

import functools
from collections.abc import Mapping
from dataclasses import dataclass
from types import MappingProxyType

from ._checks import count
from ._signals import DoomLoopSignal

__all__ = ["RepetitionDetector", "Rule"]


@dataclass(frozen=True, slots=True)
class Rule:
    """Fire for periods ``p < below`` once ``L/p >= min_copies`` and ``L >= min_chars``."""

    below: int
    min_copies: float
    min_chars: int


_BIG = 1 << 30
THINKING_RULES = (Rule(16, 0, 256), Rule(64, 4, 0), Rule(_BIG, 3, 0))
TEXT_RULES = (Rule(16, 0, 512), Rule(64, 4, 96), Rule(_BIG, 3, 0))
FENCE_RULES = (Rule(16, 0, 2048), Rule(64, 12, 1024), Rule(_BIG, 4, 0))
_DEFAULT_RULES = {"thinking": THINKING_RULES, "text": TEXT_RULES}
# A short unit made of words ("I'll check.", a CJK phrase) is a chant, not a divider:
# periods of 6-15 characters holding at least 3 letters are judged by copies, not by
# length. Punctuation-only units (table separators, box drawing) keep the length rule.
WORDY_RULES = {"thinking": Rule(16, 4, 48), "text": Rule(16, 5, 64)}
_WORDY_MIN_PERIOD = 6
_WORDY_MIN_LETTERS = 3
# In a fence, a unit of up to _ROW_LINES lines this long or longer is judged by the rule of a
# row one character shorter when that is stricter: identical rows of a table are not a block
# that loops.
_ROW_FROM = 64
_ROW_LINES = 2
_BLOCK = 64  # slice size for the backwards onset search
_NEAR = 64  # distances searched with the anchor itself; farther ones with the far needle
_FAR_NEEDLE = 64  # the needle of the far search: any period past _NEAR repeats this much
_LONG_NEEDLE = 64  # longest needle of a continued candidate search
_WIDE = 4096  # a reach past this is searched in two parts (the anchor near, the far needle far)


@functools.lru_cache(maxsize=16)
def _reach_table(step: int, window: int) -> tuple[int, ...]:
    """The search reach by bit length (see `RepetitionDetector.__init__`): one table per
    (step, window), shared by the detectors that use it (a policy makes two per engine)."""
    return tuple(min(step << max(b, 1), window) for b in range(65))


def _stricter(rule: Rule | None, other: Rule | None) -> Rule | None:
    """A rule asking for both rules' copies and characters (``rule`` when either is None)."""
    if rule is None or other is None:
        return rule
    return Rule(rule.below, max(rule.min_copies, other.min_copies), max(rule.min_chars, other.min_chars))


def _table_rows(unit: str) -> bool:
    """True when every line of ``unit`` (taken from a line start) is a Markdown table row."""
    cut = unit.index("\n") + 1
    lines = (unit[cut:] + unit[:cut]).split("\n")[:-1]
    return all(line.strip(" \t").startswith("|") and line.strip(" \t\r").endswith("|") for line in lines)


class _Run:
    """A live candidate: the text from ``onset`` on has period ``period``."""

    __slots__ = ("onset", "period", "reported")

    def __init__(self, period: int, onset: int) -> None:
        self.period = period
        self.onset = onset
        self.reported = 0  # copies at the last report; 0 = never reported


class RepetitionDetector:
    """Periodic-suffix detector for one channel ("thinking" or "text").

    ``feed(delta)`` returns only new signals. A pattern (one run of one period)
    is reported once when it crosses its threshold and again, as an
    ``exact_repetition`` with the new count, each time its copies double.
    ``rules`` / ``fence_rules`` replace the channel's thresholds, and ``wordy_rule`` the one
    for a short unit with letters (a chant; None: the channel's own).

    ``window``: the longest period looked for, in characters (the text kept is bounded by
    it). ``anchor``: the length of the text looked up at each checkpoint; ``step``: the
    characters from one checkpoint to the next. ``max_candidates``: how many periods are
    tracked at once (the longest gives way to a new one); ``tries``: how many candidate
    distances one checkpoint checks at most. TypeError for one of these that is not a whole
    number; ValueError for one below 1, and unless ``window >= 2 * anchor`` and ``anchor >= 2``.

    ``live`` (a read-only view) maps each candidate period being tracked to its run; it
    is empty while the text does not repeat, and then a delta costs one append
    until the next checkpoint.
    """

    def __init__(
        self,
        channel: str = "text",
        *,
        window: int = 4096,
        anchor: int = 16,
        step: int = 32,
        rules: tuple[Rule, ...] | None = None,
        fence_rules: tuple[Rule, ...] | None = FENCE_RULES,
        wordy_rule: Rule | None = None,
        max_candidates: int = 8,
        tries: int = 4,
    ) -> None:
        window = count("RepetitionDetector window", window, 1, optional=False)
        anchor = count("RepetitionDetector anchor", anchor, 2, optional=False)
        step = count("RepetitionDetector step", step, 1, optional=False)
        max_candidates = count("RepetitionDetector max_candidates", max_candidates, 1, optional=False)
        tries = count("RepetitionDetector tries", tries, 1, optional=False)
        if window < 2 * anchor:
            raise ValueError(f"RepetitionDetector window must be at least 2 * anchor ({2 * anchor}), not {window!r}")
        self.channel = channel
        self.window = window
        self.rules = rules if rules is not None else _DEFAULT_RULES.get(channel, TEXT_RULES)
        self.fence_rules = fence_rules if fence_rules is not None else self.rules
        self.wordy_rule = wordy_rule if wordy_rule is not None else WORDY_RULES.get(channel)
        self._k = anchor
        self._step = step
        self._max_candidates = max_candidates
        self._tries = tries
        self._keep = 2 * window + 2 * anchor
        self._trim_at = self._keep + window  # the buffer's length past which it is trimmed to _keep
        self._live: dict[int, _Run] = {}
        # Search reach by the bit length of (first checkpoint index - 1) ^ (last index): twice
        # the stride of the chunk's farthest-reaching checkpoint.
        self._reach = _reach_table(step, window)
        self._far_needle = max(_FAR_NEEDLE, anchor)
        self._near = max(_NEAR, self._far_needle)
        self._split_from = self._near + self._far_needle  # a shorter buffer has no far distances
        self.reset()

    def reset(self) -> None:
        """Forget everything (a new attempt starts)."""
        self._buf = ""
        self._pending = ""  # text fed but not yet appended to _buf
        self._base = 0  # absolute offset of _buf[0]
        self._trim_n = self._trim_at  # the offset past which _buf is trimmed: _base + _trim_at
        self._n = 0  # characters fed so far
        self._done = 0  # characters appended to _buf and checked (read while a run is live)
        self._next_cp = self._step * ((self._k + self._step - 1) // self._step)
        self._live.clear()  # the same dict across resets: holders may keep a reference (`live`)
        self._in_fence = False
        self._fence_scan = 0
        self._toggles: list[int] = []  # fence toggles seen in the last chunk with a back-tick
        self.fired = 0

    @property
    def live(self) -> Mapping[int, _Run]:
        """The runs being tracked, by candidate period: a read-only view that follows the
        detector, also across resets."""
        return MappingProxyType(self._live)

    @property
    def chars(self) -> int:
        """Characters fed since the last reset."""
        return self._n

    @property
    def in_fence(self) -> bool:
        """True inside a Markdown code fence."""
        if self._pending:
            self._absorb()
        return self._in_fence

    def tail(self) -> tuple[int, int] | None:
        """(period, length) of the live run with the smallest period, or None."""
        if not self._live:
            return None
        p = min(self._live)
        return p, self._n - self._live[p].onset

    def feed(self, delta: str) -> tuple[DoomLoopSignal, ...]:
        """Add streamed text; return the signals that became due.

        While no run is live, a delta is only queued until the next checkpoint:
        the text is looked at then.
        """
        n = self._n + len(delta)
        self._n = n
        cp = self._next_cp
        if n < cp and not self._live:
            self._pending += delta
            return ()
        if self._pending:
            delta = self._pending + delta
            self._pending = ""
        buf = self._buf
        self._buf = ""  # drop the second reference so += can grow buf in place
        buf += delta
        self._buf = buf
        if "`" in delta:
            self._scan_fences(buf, n)
        if self._live:  # else a checkpoint is due (see the queueing above)
            return self._check(buf, n)
        # The common case, inline: a checkpoint reached and no live run. One search
        # per chunk, at its last checkpoint, reaching as far back as the
        # farthest-reaching checkpoint the chunk spans: a periodic tail is found from
        # any anchor inside it, so the skipped checkpoints would add nothing but cost.
        step = self._step
        last = n - n % step  # checkpoints sit at multiples of step
        self._next_cp = last + step
        e = last - self._base
        reach = self._reach[((cp // step - 1) ^ (last // step)).bit_length()]
        a = e - self._k  # the anchor is buf[a:e]
        if reach <= _WIDE or e <= self._split_from:
            # One search with the anchor over the whole reach: where it does not recur, neither
            # does the far needle, which ends with it (the usual case: nothing more to do).
            j = buf.rfind(buf[a:e], a - reach if a > reach else 0, e - 1)
            if j >= 0:
                return self._recurs(buf, n, last, j, reach)
        else:  # a wide reach: the anchor over the near distances, the far needle beyond (as in
            # `_recurs`, inline: a wide reach is most hand-overs of long deltas, and a call costs)
            near = self._near
            j = buf.rfind(buf[a:e], a - near, e - 1)
            if j >= 0:
                return self._recurs(buf, n, last, j, reach)
            f = e - self._far_needle  # the far needle is buf[f:e]
            j = buf.rfind(buf[f:e], f - reach if f > reach else 0, e - near - 1)
            if j >= 0:
                self._done = last
                self._candidates(buf, last, j, self._far_needle, reach)
                if self._live:
                    return self._check(buf, n)
        # No run is live, so `_done` is not read before the next adoption sets it.
        if n > self._trim_n:
            self._trim(buf, n)
        return ()

    # -- internals ----------------------------------------------------------

    def _recurs(self, buf: str, n: int, last: int, j: int, reach: int) -> tuple[DoomLoopSignal, ...]:
        """`feed` without a live run: the anchor ending at checkpoint ``last`` recurs at buffer
        index ``j``, its latest occurrence within ``reach``. The near distances are judged
        from it; past them, the far needle is searched for (a longer needle, far fewer false
        candidates)."""
        k, near, e = self._k, self._near, last - self._base
        self._done = last
        if reach <= near or e <= self._split_from:
            self._candidates(buf, last, j, k, reach)
        elif j >= e - k - near:  # a near distance
            self._far(buf, last, self._candidates(buf, last, j, k, near), reach)
        else:
            f = e - self._far_needle  # the far needle is buf[f:e]
            j = buf.rfind(buf[f:e], f - reach if f > reach else 0, e - near - 1)
            if j >= 0:
                self._candidates(buf, last, j, self._far_needle, reach)
        if self._live:
            return self._check(buf, n)
        # No run is live, so `_done` is not read before the next adoption sets it.
        if n > self._trim_n:
            self._trim(buf, n)
        return ()

    def _absorb(self) -> None:
        """Append the queued text to the buffer (and track code fences in it)."""
        chunk = self._pending
        self._pending = ""
        buf = self._buf
        self._buf = ""
        buf += chunk
        self._buf = buf
        if "`" in chunk:
            self._scan_fences(buf, self._n)

    def _check(self, buf: str, n: int) -> tuple[DoomLoopSignal, ...]:
        """The general case: live runs to extend and judge, and maybe a checkpoint."""
        runs, step = self._live, self._step
        out: list[DoomLoopSignal] = []
        pos = self._done
        cp = self._next_cp
        if cp <= n:
            last = n - n % step
            self._extend(buf, pos, last, out)
            # The checkpoint of [cp, last] divisible by the largest power of 2 (in strides)
            # sets the reach: its trailing zero bits are the highest bit where the first
            # checkpoint index minus one and the last index differ (O(1), no loop).
            self._search(buf, last, self._reach[((cp // step - 1) ^ (last // step)).bit_length()])
            pos = last
            self._next_cp = last + step
        self._extend(buf, pos, n, out)
        for p in sorted(runs):
            self._judge(runs[p], n, out, buf)
        self._done = n
        if n > self._trim_n:
            self._trim(buf, n)
        return tuple(out) if out else ()

    def _trim(self, buf: str, n: int) -> None:
        """Keep the last ``_keep`` characters of ``buf`` (which ends at ``n``)."""
        self._buf = buf[-self._keep :]
        self._base = n - self._keep
        self._trim_n = self._base + self._trim_at

    def _extend(self, buf: str, frm: int, to: int, out: list[DoomLoopSignal]) -> None:
        """Check positions [frm, to) of every live run; end the runs that break."""
        if frm >= to:
            return
        base = self._base
        for p in list(self._live):
            a, b = frm - base, to - base
            if buf[a:b] == buf[a - p : b - p]:
                continue
            end = next(i for i in range(a, b) if buf[i] != buf[i - p]) + base
            run = self._live.pop(p)
            self._judge(run, end, out, buf)  # a run that crossed its threshold mid-delta still fires

    def _search(self, buf: str, cp: int, reach: int) -> None:
        """Look for the periods up to ``reach`` that end at checkpoint ``cp``."""
        k, e, near = self._k, cp - self._base, self._near
        if reach <= near or e <= self._split_from:
            j = buf.rfind(buf[e - k : e], e - k - reach if e > k + reach else 0, e - 1)
            if j >= 0:
                self._candidates(buf, cp, j, k, reach)
            return
        j = buf.rfind(buf[e - k : e], e - k - near, e - 1)
        self._far(buf, cp, self._candidates(buf, cp, j, k, near) if j >= 0 else k, reach)

    def _far(self, buf: str, cp: int, n: int, reach: int) -> None:
        """Search the distances past ``near`` (up to ``reach``) with a needle of at least
        ``n`` characters (0: none to search).

        A period p > near that holds two copies repeats its last p characters p back, so a
        needle of up to p characters finds it: the far needle, longer than the anchor,
        recurs by chance far less often, so the search meets fewer false candidates and
        skips further (CPython's search skips by the needle's length past a character
        that is not in it).
        """
        if not n:
            return
        e, near = cp - self._base, self._near
        if n < self._far_needle:
            n = self._far_needle
        if e > near + n:
            j = buf.rfind(buf[e - n : e], e - n - reach if e > n + reach else 0, e - near - 1)
            if j >= 0:
                self._candidates(buf, cp, j, n, reach)

    def _candidates(self, buf: str, cp: int, j: int, n: int, reach: int) -> int:
        """The last ``n`` characters before ``cp`` recur at buffer index ``j`` (their latest
        earlier occurrence, at most ``reach`` back): adopt the smallest distance that holds
        two full copies. Returns the needle a search of farther distances needs (0: none)."""
        k, e = self._k, cp - self._base
        d = e - n - j
        for _ in range(self._tries):
            run = self._live.get(d)
            onset = run.onset if run is not None else self._onset(buf, cp, d)
            if onset is None:
                # Any longer period p > d repeats the last max(p, k) characters, so the last
                # n <= max(d + 1, k) recur p back as well: the search goes on with that longer
                # needle, which recurs far less often (fewer false candidates) and is found faster.
                n = max(n, min(max(d + 1, k), _LONG_NEEDLE))
            else:
                if run is None:
                    self._adopt(d, onset)
                # The anchor lies in a periodic run (an indentation, a divider) that can sit
                # inside one copy of a longer period: a needle one character longer than the
                # run reaches past it, and recurs p back if the tail is p-periodic. A run as
                # long as the window cannot sit inside a period the detector tracks.
                n = cp - onset + 1
                if n > self.window or n > e:
                    return 0
            j = buf.rfind(buf[e - n : e], e - n - reach if e > n + reach else 0, e - d - 1)
            if j < 0:
                return n
            d = e - n - j
        return n

    def _onset(self, buf: str, cp: int, d: int) -> int | None:
        """Start of the d-periodic run ending at ``cp`` if it holds two copies, else None."""
        base, k = self._base, self._k
        m = max(d, k)
        e = cp - base
        if e - m - d < 0:
            return None
        # Region comparisons are startswith() of one slice: half the copying of two slices.
        if m > _BLOCK + k:  # most candidates fail just before the anchor: test that block first
            f = e - k
            if not buf.startswith(buf[f - _BLOCK - d : f - d], f - _BLOCK):
                return None
        if not buf.startswith(buf[e - m - d : e - d], e - m):
            return None
        a = e - m  # buf[a:e] == buf[a-d:e-d]; walk back in blocks, then per char
        while a - _BLOCK - d >= 0 and buf.startswith(buf[a - _BLOCK - d : a - d], a - _BLOCK):
            a -= _BLOCK
        while a - 1 - d >= 0 and buf[a - 1] == buf[a - 1 - d]:
            a -= 1
        return a - d + base

    def _adopt(self, d: int, onset: int) -> None:
        for q in [q for q in self._live if q % d == 0 and self._live[q].onset >= onset]:
            del self._live[q]  # a multiple inside the new run adds nothing
        if len(self._live) >= self._max_candidates:
            del self._live[max(self._live)]
        self._live[d] = _Run(d, onset)

    def _judge(self, run: _Run, end: int, out: list[DoomLoopSignal], buf: str) -> None:
        p = run.period
        length = end - run.onset
        copies = length // p
        if run.reported:
            if copies >= 2 * run.reported:
                run.reported = copies
                out.append(self._exact(p, copies))
            return
        # The fence state over the run [onset, end): a marker at `end` (the closing back-ticks
        # that broke a run of rows) comes after it.
        fenced = self._in_fence ^ (sum(t >= end for t in self._toggles) % 2 == 1)
        rule = self._fenced_rule(p, end, buf) if fenced else self._plain_rule(p, end, buf)
        if rule is None or length < rule.min_chars or length < rule.min_copies * p:
            return
        run.reported = max(copies, 1)
        self.fired += 1
        out.append(
            DoomLoopSignal("tail_repetition", self.channel, threshold=p, unit="chars", source="client")
        )
        out.append(self._exact(p, copies))

    def _plain_rule(self, p: int, end: int, buf: str) -> Rule | None:
        """The rule for period ``p`` outside a fence. The unit (the run's last ``p`` characters)
        decides two exceptions: cells of one Markdown table row (a ``|`` and no line end) are
        judged by length as a separator row is, and rows of a table as rows in a fence are;
        a short unit with letters (not a table's) is a chant, judged by `wordy_rule`."""
        rule = next((r for r in self.rules if p < r.below), None)
        e = end - self._base
        if buf.find("|", e - p, e) >= 0:  # searched in place: a unit can be 4 KB, judged per delta
            if buf.find("\n", e - p, e) < 0:
                return _stricter(rule, next((r for r in self.rules if r.below > 1), None))
            if _table_rows(buf[e - p : e]):
                return self._fenced_rule(p, end, buf)
            return rule
        wordy = self.wordy_rule
        if (
            wordy is not None
            and _WORDY_MIN_PERIOD <= p < wordy.below
            and sum(ch.isalpha() for ch in buf[e - p : e]) >= _WORDY_MIN_LETTERS
        ):
            return wordy
        return rule

    def _fenced_rule(self, p: int, end: int, buf: str) -> Rule | None:
        """The fence rule for period ``p``. A unit of one or two lines (the same row written
        again: a lookup table's bitmap, a wide zero matrix, the expected trace of a loop) is
        judged at least as strictly as a row shorter than `_ROW_FROM` is, however long: only
        a block of three lines or more that repeats (a function written out again) is a loop
        at a block's copies."""
        rules = self.fence_rules
        rule = next((r for r in rules if p < r.below), None)
        if rule is None or p < _ROW_FROM:
            return rule
        e = end - self._base
        if buf.count("\n", e - p, e) > _ROW_LINES:
            return rule
        return _stricter(rule, next((r for r in rules if r.below >= _ROW_FROM), None))

    def _exact(self, p: int, copies: int) -> DoomLoopSignal:
        return DoomLoopSignal(
            "exact_repetition", self.channel, tokens=p, copies=copies, unit="chars", source="client"
        )

    def _scan_fences(self, buf: str, n: int) -> None:
        """Toggle the fence state at each line-leading three back-ticks not seen yet."""
        base = self._base
        self._toggles = []
        i = buf.find("```", max(self._fence_scan, base) - base)
        while i >= 0:
            line = buf.rfind("\n", 0, i)
            if not buf[line + 1 : i].strip(" \t"):
                self._in_fence = not self._in_fence
                self._toggles.append(i + base)
            self._fence_scan = i + 3 + base
            i = buf.find("```", i + 3)
        self._fence_scan = max(self._fence_scan, n - 2)
