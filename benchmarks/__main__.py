"""``python -m benchmarks``: run every benchmark and write ``benchmarks/REPORT.md``.

A benchmark is a module with a ``main()`` that prints markdown tables on stdout:
``benchmarks/bench_*.py`` and ``benchmarks/<name>/run.py``. Each runs in its
own interpreter (``main()`` is called directly, so a missing ``__main__`` guard
does not matter) with a timeout. The report opens with one line about the
machine, then each benchmark's output, in discovery order. A benchmark that
fails or times out is reported as failed, with the tail of its stderr; the
runner then exits 1.
"""

from __future__ import annotations

import argparse
import contextlib
import datetime as dt
import os
import platform
import signal
import subprocess
import sys
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent
# Calls main() with an argv of its own (benchmarks may parse arguments).
_CALL = (
    "import importlib, sys; name = sys.argv[1]; sys.argv = [name]; "
    "r = importlib.import_module(name).main(); sys.exit(r if isinstance(r, int) else 0)"
)


@dataclass(frozen=True, slots=True)
class Outcome:
    module: str
    path: Path
    ok: bool
    seconds: float
    stdout: str
    detail: str = ""


def discover(root: Path = HERE) -> list[tuple[str, Path]]:
    """(module name, path) of every benchmark, sorted by path."""
    found = sorted(root.glob("bench_*.py")) + sorted(root.glob("*/run.py"))
    out = []
    for path in found:
        rel = path.relative_to(root.parent).with_suffix("")
        out.append((".".join(rel.parts), path))
    return out


def run_one(module: str, path: Path, timeout: float) -> Outcome:
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")])))
    start = time.perf_counter()
    # A session of its own, so a timeout kills the benchmark with every process it started.
    proc = subprocess.Popen(
        [sys.executable, "-c", _CALL, module],
        cwd=ROOT, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, start_new_session=True,
    )
    try:
        stdout, stderr = proc.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGKILL)
        stdout, _ = proc.communicate()
        return Outcome(module, path, False, time.perf_counter() - start, stdout, f"timed out after {timeout:g} s")
    seconds = time.perf_counter() - start
    if proc.returncode != 0:
        tail = "\n".join(stderr.strip().splitlines()[-15:])
        return Outcome(module, path, False, seconds, stdout, f"exit code {proc.returncode}\n{tail}")
    return Outcome(module, path, True, seconds, stdout)


def machine() -> str:
    """One line: CPU model, cores, Python version, OS, date."""
    cpu = platform.processor() or platform.machine()
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.lower().startswith("model name"):
                cpu = line.split(":", 1)[1].strip()
                break
    except OSError:
        pass
    now = dt.datetime.now(dt.UTC).strftime("%Y-%m-%d %H:%M UTC")
    return (
        f"Machine: {cpu}, {os.cpu_count()} cores; Python {platform.python_version()} "
        f"({platform.python_implementation()}); {platform.system()} {platform.machine()}; {now}."
    )


def report(outcomes: Sequence[Outcome]) -> str:
    lines = ["# Benchmark report", "", machine(), "",
             "Written by `python -m benchmarks`; each section is one benchmark script's output.", ""]
    failed = [o for o in outcomes if not o.ok]
    if failed:
        lines += [f"**{len(failed)} of {len(outcomes)} benchmarks failed:** "
                  + ", ".join(f"`{o.module}`" for o in failed), ""]
    for o in outcomes:
        rel = o.path.relative_to(ROOT)
        status = f"{o.seconds:.1f} s" if o.ok else f"FAILED, {o.detail.splitlines()[0]}"
        lines += [f"## `{o.module}` ({status})", "", f"Source: [{rel}]({o.path.relative_to(HERE)})", ""]
        if o.stdout.strip():
            lines += [o.stdout.rstrip(), ""]
        if not o.ok:
            lines += ["```text", o.detail, "```", ""]
    return "\n".join(lines)


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m benchmarks", description=__doc__.splitlines()[0])
    parser.add_argument("names", nargs="*", help="run only benchmarks whose module name contains one of these")
    parser.add_argument("--timeout", type=float, default=900.0, help="seconds per benchmark (default 900)")
    parser.add_argument("--output", type=Path, default=HERE / "REPORT.md", help="the report to write")
    parser.add_argument("--list", action="store_true", help="list the benchmarks and exit")
    args = parser.parse_args(argv)
    found = [(m, p) for m, p in discover() if not args.names or any(n in m for n in args.names)]
    if args.list or not found:
        for module, path in found:
            print(f"{module}  ({path.relative_to(ROOT)})")
        return 0 if found else 1
    outcomes = []
    for module, path in found:
        print(f"running {module} ...", end=" ", flush=True)
        outcome = run_one(module, path, args.timeout)
        print(f"{'ok' if outcome.ok else 'FAILED'} ({outcome.seconds:.1f} s)", flush=True)
        outcomes.append(outcome)
    args.output.write_text(report(outcomes), encoding="utf-8")
    print(f"wrote {args.output}")
    return 0 if all(o.ok for o in outcomes) else 1


if __name__ == "__main__":
    sys.exit(main())
