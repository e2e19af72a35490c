"""Runaway-defence benchmark: recall, delay, false flags, cost and overhead.

    .venv/bin/python benchmarks/runaway/run.py [--quick]

Runs the RUNAWAY.md §(d) scenarios through `RepetitionDetector` and the stock
policies at three chunkings, then a real corpus nobody here wrote (the Python
standard library's source and the docs shipped by installed packages), real
files as a model writes them through the stock policy (sources.py), loops drawn
at random (generated.py) and loop families built as models write them
(families.py), and prints tables. Timings are the best of several runs; nothing
here is asserted.
"""

from __future__ import annotations

import json
import random
import sys
import sysconfig
import time
from collections import defaultdict
from collections.abc import Callable, Iterable
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))
sys.path.insert(0, str(Path(__file__).resolve().parent))

from families import families
from generated import draw
from scenarios import Case, text_cases
from sources import flags, kinds, responses
from tools import tool_scenarios

from agentloop._accumulate import Accumulator
from agentloop._detector import RepetitionDetector
from agentloop._model import StreamEvent, StreamText, StreamThinking
from agentloop.policies import ConservativeDoomLoopPolicy, DoomLoopPolicy, Resample, Warn

CHUNKINGS = [(1, 4), (1, 24), (30, 200)]
SEEDS = (1, 2, 3)


def chunks(text: str, lo: int, hi: int, seed: int) -> list[str]:
    rnd, out, i = random.Random(seed), [], 0
    while i < len(text):
        k = rnd.randint(lo, hi)
        out.append(text[i : i + k])
        i += k
    return out


def first_fire(channel: str, deltas: Iterable[str]) -> int | None:
    det, pos = RepetitionDetector(channel), 0
    for d in deltas:
        pos += len(d)
        if any(s.kind == "tail_repetition" for s in det.feed(d)):
            return pos
    return None


def first_fire_policy(channel: str, deltas: Iterable[str], **detector: int) -> int | None:
    """Like `first_fire`, through the stock policy's hand-over (``every`` deltas while cold)."""
    pol, pos = DoomLoopPolicy(detector=detector), 0
    pol.begin_attempt()
    for d in deltas:
        pos += len(d)
        v = pol.on_stream(StreamThinking(0, d) if channel == "thinking" else StreamText(0, d))
        if isinstance(v, (Warn, Resample)) and any(s.kind == "tail_repetition" for s in v.signals):
            return pos
    return None


def verdict(case: Case) -> str:
    pol = ConservativeDoomLoopPolicy()
    pol.begin_attempt()
    seen = "none"
    for d in chunks(case.text, 1, 24, 1):
        ev: StreamEvent = StreamThinking(0, d) if case.channel == "thinking" else StreamText(0, d)
        v = pol.on_stream(ev)
        if isinstance(v, Resample):
            return "abort"
        if isinstance(v, Warn):
            seen = "warn"
    return seen


def period_class(p: int) -> str:
    return "1-15" if p < 16 else "16-63" if p < 64 else "64-255" if p < 256 else "256+"


def pct(values: list[float], q: float) -> float:
    values = sorted(values)
    return values[min(len(values) - 1, round(q * (len(values) - 1)))]


def run_scenarios() -> None:
    print("\n## Text scenarios (RUNAWAY §d 1-21, E* = loops not used for tuning)\n")
    print(
        f"{'id':<4} {'scenario':<42} {'ch':<8} {'p':>5} {'expect':<15} {'fired':>5} {'exact':>6} {'copies@fire':>14} {'verdict':<7}"
    )
    delays: dict[tuple[str, str], list[float]] = defaultdict(list)
    via_policy: dict[tuple[str, str], list[float]] = defaultdict(list)
    caught = total = 0
    over4: list[str] = []
    for case in text_cases():
        fires = [
            first_fire(case.channel, chunks(case.text, lo, hi, seed))
            for lo, hi in CHUNKINGS
            for seed in SEEDS
        ]
        hit = [f for f in fires if f is not None]
        span = exact = "-"
        if case.expect == "catch":
            total += len(fires)
            caught += len(hit)
            cps = [(f - case.onset) / case.period for f in hit]
            for c in cps:
                delays[(period_class(case.period), case.channel)].append(c)
            for lo, hi in CHUNKINGS if case.period >= 16 else ():
                for seed in SEEDS:
                    deltas = chunks(case.text, lo, hi, seed)
                    bare, held = first_fire(case.channel, deltas), first_fire_policy(case.channel, deltas)
                    if bare is not None and held is not None:
                        row = via_policy[(f"{lo}-{hi}", case.channel)]
                        row.append((bare - case.onset) / case.period)
                        row.append((held - case.onset) / case.period)
            span = f"{min(cps):.1f}-{max(cps):.1f}" if cps else "-"
            one = first_fire(case.channel, list(case.text))  # 1-char deltas: the chunking-free delay
            exact = f"{(one - case.onset) / case.period:.1f}" if one is not None else "miss"
            if case.period >= 16 and (one is None or one - case.onset > 4 * case.period):
                over4.append(case.sid)
        print(
            f"{case.sid:<4} {case.name[:42]:<42} {case.channel:<8} {case.period or '':>5} {case.expect:<15} "
            f"{len(hit):>2}/{len(fires):<2} {exact:>6} {span:>14} {verdict(case):<7}"
        )
    print(f"\nrecall on exact loops: {caught}/{total} = {caught / total:.1%} (3 chunkings x 3 seeds each)")
    print(f"periods >= 16 caught later than 4 copies (1-char deltas): {over4 or 'none'}")
    print("('exact' = copies at fire with 1-char deltas; with larger deltas the fire comes at the end of")
    print(" the delta holding that point, so copies@fire exceeds it by at most one delta)")
    print("\n## Detection delay in copies (from onset to fire)\n")
    print(f"{'period':<8} {'channel':<9} {'n':>3} {'p50':>6} {'p95':>6} {'max':>6}")
    for (cls, ch), vals in sorted(delays.items()):
        print(
            f"{cls:<8} {ch:<9} {len(vals):>3} {pct(vals, 0.5):>6.2f} {pct(vals, 0.95):>6.2f} {max(vals):>6.2f}"
        )
    print(f"\n## Periods >= 16: bare detector vs the stock policy (every={DoomLoopPolicy().every}), copies at fire\n")
    print("The policy hands cold text to the detector once per `every` deltas, so a loop can be seen")
    print("up to `every - 1` deltas later than by the bare detector.\n")
    print(f"{'deltas':<8} {'channel':<9} {'n':>3} {'bare p50':>9} {'p95':>6} {'policy p50':>11} {'p95':>6}")
    for (chunking, ch), vals in sorted(via_policy.items(), key=lambda kv: (int(kv[0][0].split("-")[0]), kv[0][1])):
        bare, held = vals[0::2], vals[1::2]
        print(
            f"{chunking:<8} {ch:<9} {len(bare):>3} {pct(bare, 0.5):>9.2f} {pct(bare, 0.95):>6.2f} "
            f"{pct(held, 0.5):>11.2f} {pct(held, 0.95):>6.2f}"
        )


def corpus(limit: int) -> list[tuple[str, str]]:
    """(kind, text) of ~6 KB responses: stdlib .py, then package docs."""
    stdlib = Path(sysconfig.get_paths()["stdlib"])
    py = sorted(p for p in stdlib.rglob("*.py") if "site-packages" not in p.parts and "test" not in p.parts)
    base = {"base": sys.base_prefix, "platbase": sys.base_prefix}
    sites = {Path(sysconfig.get_paths()["purelib"]), Path(sysconfig.get_paths(vars=base)["purelib"])}
    docs = sorted(
        p
        for site in sites
        for ext in ("md", "rst", "txt")
        for p in site.rglob(f"*.{ext}")
        if 1000 < p.stat().st_size < 300_000
    )
    out: list[tuple[str, str]] = []
    for kind, paths, budget in (("stdlib .py", py, limit), ("package docs", docs, limit)):
        text = _read(paths, budget)
        out += [(kind, text[i : i + 6000]) for i in range(0, len(text), 6000)]
    return out


def _read(paths: list[Path], budget: int) -> str:
    parts, size = [], 0
    for p in paths:
        try:
            t = p.read_text(encoding="utf-8")
        except (UnicodeDecodeError, OSError):
            continue
        parts.append(t)
        size += len(t)
        if size >= budget:
            break
    return "".join(parts)[:budget]


def run_corpus(limit: int) -> None:
    print("\n## False flags on a real corpus (~6 KB responses, deltas of 1-24 chars)\n")
    responses = corpus(limit)
    print(
        f"{'corpus':<14} {'channel':<9} {'MB':>5} {'responses':>9} {'flagged':>7} {'flags/MB':>8}  periods flagged"
    )
    for kind in ("stdlib .py", "package docs"):
        items = [t for k, t in responses if k == kind]
        mb = sum(len(t) for t in items) / 1e6
        for ch in ("text", "thinking"):
            flagged, periods = 0, []
            for i, t in enumerate(items):
                det = RepetitionDetector(ch)
                sigs = [s for d in chunks(t, 1, 24, i) for s in det.feed(d) if s.kind == "tail_repetition"]
                flagged += bool(sigs)
                periods += [s.threshold for s in sigs]
            print(
                f"{kind:<14} {ch:<9} {mb:>5.2f} {len(items):>9} {flagged:>7} {flagged / mb:>8.1f}  {periods[:8]}"
            )


def run_sources(budget: int) -> None:
    print("\n## False flags on the content channel: real files as a model writes them (stock policy)\n")
    print("sources.py: code and data in a fence of their language, prose, logs and mail as they are;")
    print(f"~6 KB responses through `ConservativeDoomLoopPolicy`, deltas of 1-24 chars, up to {budget / 1e6:.0f} MB a kind.\n")
    print(f"{'corpus':<18} {'files':>6} {'MB':>6} {'responses':>9} {'flagged':>7} {'flags/MB':>8}")
    seen: list[str] = []
    for kind, paths in kinds().items():
        size = count = flagged = 0
        for i, r in enumerate(responses(kind, paths, budget)):
            size += len(r.text)
            count += 1
            found = flags(r.text, seed=i)
            flagged += bool(found)
            seen += [f"{kind}: {r.path.name} @{r.offset + at}, period {p}" for at, p in found]
        mb = size / 1e6
        print(f"{kind:<18} {len(paths):>6} {mb:>6.2f} {count:>9} {flagged:>7} {flagged / max(mb, 1e-9):>8.2f}")
    print("\nflags (judged in docs/policies.md, 'Boundary cases'):", *(seen or ["none"]), sep="\n  ")


def run_families(per_family: int) -> None:
    print(f"\n## Loop families built as models write them (families.py), {per_family} a family, stock policy\n")
    print("Delay = characters from the onset to the end of the delta that fired, in copies of the unit")
    print("(for a flood, the unit is 1-2 characters: see the chars column). 'early' = fired in the prose")
    print("before the loop (a false flag). The counter family has no exact period: it is a documented miss.\n")
    print(
        f"{'family':<34} {'deltas':<7} {'loops':>5} {'caught':>6} {'early':>5} {'copies p50':>10} {'p95':>6} "
        f"{'max':>6} {'chars p50':>9}"
    )
    loops = list(families(per_family, 7))
    variants: list[tuple[str, dict[str, int]]] = [("", {})]
    variants.append((" (window=8192)", {"window": 8192}))
    for family in dict.fromkeys(g.family for g in loops):
        mine = [g for g in loops if g.family == family]
        for suffix, opts in variants if family.startswith("long") else variants[:1]:
            for lo, hi in CHUNKINGS:
                fired = [
                    first_fire_policy(g.channel, chunks(g.text, lo, hi, i), **opts) for i, g in enumerate(mine)
                ]
                late = [(f - g.onset, g.unit) for f, g in zip(fired, mine, strict=True) if f is not None]
                early = sum(d < 0 for d, _ in late)
                ok = [(d / u, d) for d, u in late if d >= 0] or [(0.0, 0)]
                cps, chars = [c for c, _ in ok], [float(d) for _, d in ok]
                print(
                    f"{family + suffix:<34} {f'{lo}-{hi}':<7} {len(mine):>5} {len(late):>6} {early:>5} "
                    f"{pct(cps, 0.5):>10.2f} {pct(cps, 0.95):>6.2f} {max(cps):>6.2f} {pct(chars, 0.5):>9.0f}"
                )


def fire_span(channel: str, deltas: Iterable[str]) -> tuple[int, int, int] | None:
    """(start, end) of the delta in which the first tail_repetition fired, and its period."""
    det, pos = RepetitionDetector(channel), 0
    for d in deltas:
        start, pos = pos, pos + len(d)
        tail = next((s for s in det.feed(d) if s.kind == "tail_repetition"), None)
        if tail is not None:
            return start, pos, tail.threshold or 0
    return None


def run_generated(pool: str, count: int) -> None:
    print(f"\n## {count} loops drawn at random, never seen in tuning (generated.py)\n")
    print("Units cut from the corpus above (16-2,048 chars) or made of words in other scripts, after prose.")
    print("'on time' = fired in the delta in which the channel's rule is first met; 'late' = a later delta")
    print("(by how many copies); 'early' = before the rule allows it (a bug if ever > 0).\n")
    print(
        f"{'source':<14} {'deltas':<7} {'loops':>5} {'caught':>6} {'period ok':>9} {'on time':>7} {'late':>4} "
        f"{'late max':>8} {'early':>5} {'copies p50':>10} {'p95':>5} {'max':>5}"
    )
    loops = draw(pool, count, 2026)
    for group in ("real text", "other scripts"):
        mine = [g for g in loops if (g.source == "real text") == (group == "real text")]
        for lo, hi in CHUNKINGS:
            caught = period_ok = on_time = early = 0
            late: list[float] = []
            copies: list[float] = []
            for i, g in enumerate(mine):
                span = fire_span(g.channel, chunks(g.text, lo, hi, i))
                if span is None:
                    continue
                start, end, period = span
                caught += 1
                period_ok += period == g.period
                allowed = g.onset + g.need  # characters fed when the rule is first met
                if end < allowed:
                    early += 1
                elif start >= allowed:
                    late.append((start - allowed) / g.period)
                else:
                    on_time += 1
                copies.append((end - g.onset) / g.period)
            print(
                f"{group:<14} {f'{lo}-{hi}':<7} {len(mine):>5} {caught:>6} {period_ok:>9} {on_time:>7} {len(late):>4} "
                f"{max(late, default=0.0):>8.2f} {early:>5} {pct(copies, 0.5):>10.2f} {pct(copies, 0.95):>5.2f} "
                f"{max(copies, default=0.0):>5.2f}"
            )


def best(fn: Callable[[], object], repeat: int = 5) -> float:
    times = []
    for _ in range(repeat):
        t = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t)
    return min(times)


def run_cost(text: str) -> None:
    print("\n## Cost and streaming overhead (best of 5; 1 MB of stdlib source)\n")
    print(
        f"{'deltas':<8} {'us/char':>8} {'us/delta':>9} {'acc only':>9} {'acc+policy':>11} {'ratio':>6} {'sse only':>9} {'sse+policy':>11} {'ratio':>6}"
    )
    for lo, hi in CHUNKINGS:
        deltas = chunks(text, lo, hi, 7)
        events = [StreamText(0, d) for d in deltas]
        frames = [_sse(d) for d in deltas]

        def detector(deltas: list[str] = deltas) -> None:
            det = RepetitionDetector("text")
            for d in deltas:
                det.feed(d)

        det_t = best(detector)
        acc = best(lambda events=events: _accumulate(events, None))
        accp = best(lambda events=events: _accumulate(events, _policy()))
        sse = best(lambda frames=frames: _stream(frames, None))
        ssep = best(lambda frames=frames: _stream(frames, _policy()))
        n = len(deltas)
        print(
            f"{lo}-{hi:<6} {det_t / len(text) * 1e6:>8.3f} {det_t / n * 1e6:>9.2f} {acc / n * 1e6:>9.2f} "
            f"{accp / n * 1e6:>11.2f} {accp / acc:>6.2f} {sse / n * 1e6:>9.2f} {ssep / n * 1e6:>11.2f} {ssep / sse:>6.2f}"
        )
    print("(us columns are per delta; 'sse' = parse one Anthropic content_block_delta SSE frame, build the")
    print(" StreamText and feed the Accumulator, i.e. what a provider adapter and the engine do per delta)")


def _policy() -> ConservativeDoomLoopPolicy:
    pol = ConservativeDoomLoopPolicy()
    pol.begin_attempt()
    return pol


def _accumulate(events: list[StreamText], pol: ConservativeDoomLoopPolicy | None) -> None:
    acc = Accumulator()
    for ev in events:
        acc.feed(ev)
        if pol is not None:
            pol.on_stream(ev)


def _sse(delta: str) -> bytes:
    data = {"type": "content_block_delta", "index": 0, "delta": {"type": "text_delta", "text": delta}}
    return b"event: content_block_delta\ndata: " + json.dumps(data).encode() + b"\n\n"


def _stream(frames: list[bytes], pol: ConservativeDoomLoopPolicy | None) -> None:
    acc = Accumulator()
    for raw in frames:
        _, data = raw.decode().split("\n", 2)[:2]
        payload = json.loads(data[6:])
        ev = StreamText(payload["index"], payload["delta"]["text"])
        acc.feed(ev)
        if pol is not None:
            pol.on_stream(ev)


def main() -> None:
    quick = "--quick" in sys.argv
    run_scenarios()
    print("\n## Tool-call stationarity scenarios (RUNAWAY §d 22-25)\n")
    for name, ok, detail in tool_scenarios():
        print(f"{'PASS' if ok else 'FAIL'}  {name:<62} {detail}")
    limit = 600_000 if quick else 2_200_000
    run_corpus(limit)
    run_sources(1_000_000 if quick else 8_000_000)
    run_generated("".join(t for _, t in corpus(300_000 if quick else 1_000_000)), 120 if quick else 400)
    run_families(4 if quick else 12)
    text = corpus(1_000_000)[0][1] if quick else "".join(t for k, t in corpus(1_000_000) if k == "stdlib .py")
    run_cost(text[:1_000_000])
    print(
        f"\npython {sys.version.split()[0]}; best of 5 runs on a shared machine (expect +-30% between runs)"
    )


if __name__ == "__main__":
    main()
