"""JsonlSession throughput and resume time.

    .venv/bin/python benchmarks/bench_sessions.py [--messages 10000] [--dir /path/on/the/disk/to/test]

Prints, as markdown tables, appends per second for each fsync policy and the
time to load a session of ``--messages`` messages; the goal for 10,000 is <= 0.5 s.
"""

from __future__ import annotations

import argparse
import statistics
import tempfile
import time
from collections.abc import Callable, Sequence
from pathlib import Path

from agentloop import Message, TextBlock, ToolResultBlock, ToolUseBlock, validate_transcript
from agentloop._events import TurnEnded
from agentloop.sessions import FsyncPolicy, JsonlSession

PROSE = "The quick brown fox jumps over the lazy dog. " * 8  # ~360 bytes of text


def message(i: int) -> Message:
    """A realistic mix: user prompt, assistant text + tool call, tool result."""
    if i % 3 == 0:
        return Message.user(f"step {i}: {PROSE}")
    if i % 3 == 1:
        use = ToolUseBlock(id=f"toolu_{i}", name="read_file", input={"path": f"src/mod_{i}.py", "limit": 200})
        return Message(role="assistant", content=[TextBlock(text=f"Reading file {i}. {PROSE}"), use])
    result = ToolResultBlock(tool_use_id=f"toolu_{i - 1}", content=PROSE * 3)
    return Message(role="user", content=[result])


def bench_append(directory: Path, policy: FsyncPolicy, count: int) -> tuple[float, int]:
    """Return (messages per second, bytes written)."""
    path = directory / f"append-{policy}.jsonl"
    messages = [message(i) for i in range(count)]
    session = JsonlSession(path, fsync=policy)
    start = time.perf_counter()
    for m in messages:
        session.append_message(m)
    session.close()  # "batch" pays its one fsync here
    elapsed = time.perf_counter() - start
    return count / elapsed, path.stat().st_size


def timed(fn: Callable[[], object]) -> float:
    start = time.perf_counter()
    fn()
    return time.perf_counter() - start


def bench_resume(directory: Path, count: int) -> tuple[float, float, int]:
    """Return (best load seconds, median load seconds, file bytes) for a ``count``-message session."""
    path = directory / "resume.jsonl"
    with JsonlSession(path, fsync="never") as session:
        for i in range(count):
            session.append_message(message(i))
            if i % 50 == 49:
                session.append_event(TurnEnded(reason="completed", turns=i))
    loaded = JsonlSession(path).load()
    assert len(loaded.messages) >= count and validate_transcript(loaded.messages) == []
    times = [timed(lambda: JsonlSession(path).load()) for _ in range(5)]
    return min(times), statistics.median(times), path.stat().st_size


def table(header: Sequence[str], rows: Sequence[Sequence[str]], align: str) -> str:
    """A markdown table, padded so it also reads as plain text.

    ``align`` has one letter per column: ``l`` (left) or ``r`` (right).
    """
    widths = [max(len(h), *(len(r[i]) for r in rows), 3) for i, h in enumerate(header)]

    def line(cells: Sequence[str]) -> str:
        padded = (
            c.ljust(w) if a == "l" else c.rjust(w) for c, w, a in zip(cells, widths, align, strict=True)
        )
        return "| " + " | ".join(padded) + " |"

    rule = ["-" * (w - 1) + (":" if a == "r" else "-") for w, a in zip(widths, align, strict=True)]
    return "\n".join([line(header), line(rule), *(line(r) for r in rows)])


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--messages", type=int, default=10_000, help="session size for the resume test")
    parser.add_argument("--dir", type=Path, default=None, help="directory to write in (default: a temp dir)")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(dir=args.dir) as d:
        directory = Path(d)
        rows = []
        for policy, count in (("never", 20_000), ("batch", 20_000), ("always", 2_000)):
            rate, size = bench_append(directory, policy, count)  # type: ignore[arg-type]
            rows.append(
                [f"`{policy}`", f"{count:,}", f"{rate:,.0f}", f"{1e6 / rate:.1f}", f"{size / 1e6:.1f}"]
            )
        print("### Append throughput\n")
        print(table(["fsync policy", "messages", "msgs/s", "us/msg", "MB"], rows, "lrrrr"))
        best, median, size = bench_resume(directory, args.messages)
        verdict = "ok" if best <= 0.5 else "SLOW"
        print("\n### Resume (load)\n")
        print(
            table(
                ["messages", "MB", "best ms", "median ms (of 5)", "goal ms", "result"],
                [
                    [
                        f"{args.messages:,}",
                        f"{size / 1e6:.1f}",
                        f"{best * 1000:.0f}",
                        f"{median * 1000:.0f}",
                        "<= 500",
                        verdict,
                    ]
                ],
                "rrrrrl",
            )
        )


if __name__ == "__main__":
    main()
