"""Instruction counts (valgrind callgrind) for the loop and the doom-loop detector.

Wall-clock figures on a shared machine move by tens of percent between runs;
instruction counts do not. Each figure is the difference between a long and a
short run of the same scenario, so start-up costs cancel out. The streaming
figures also leave out building the scenario's SSE body (a ``json.dumps`` per
delta, about 40% of the count): a run that only builds it is subtracted.

Run: ``python benchmarks/callgrind_overhead.py`` (needs ``valgrind``; takes a few
minutes). Not part of ``python -m benchmarks``, which stays wall-clock only.
"""

from __future__ import annotations

import asyncio
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent))
sys.path.insert(0, str(HERE))


def _scenario(kind: str, size: int, delta: int, mode: str) -> None:
    import bench_kernel as b
    import httpx

    from agentloop import QueryEngine
    from agentloop.models import AnthropicModel
    from agentloop.policies import ConservativeDoomLoopPolicy

    async def stream() -> None:
        body = b._anthropic_body(b._corpus(size), delta, "text")
        client = httpx.AsyncClient(transport=httpx.MockTransport(lambda _r: httpx.Response(200, content=body)))
        policies = [ConservativeDoomLoopPolicy()] if mode == "on" else []
        engine = QueryEngine(AnthropicModel("m", api_key="k", http_client=client), policies=policies)
        async for _event in engine.run("go"):
            pass
        await client.aclose()

    if kind == "loop":
        asyncio.run(b.agentloop_iterations(size, policies=False))
    elif kind == "body":  # what the stream scenario does before the engine runs
        b._anthropic_body(b._corpus(size), delta, "text")
    else:
        asyncio.run(stream())


def _instructions(*args: str) -> int:
    out = subprocess.run(
        ["valgrind", "--tool=callgrind", "--callgrind-out-file=/dev/null", sys.executable, __file__, "--child", *args],
        capture_output=True,
        text=True,
        check=True,
        env={**os.environ, "PYTHONHASHSEED": "0"},  # the same dict and set layouts in every run
    )
    match = re.search(r"Collected : (\d+)", out.stderr)
    assert match is not None, out.stderr[-500:]
    return int(match.group(1))


def _per_unit(kind: str, small: int, large: int, units: float, *rest: str) -> float:
    a = _instructions(kind, str(small), *rest)
    b = _instructions(kind, str(large), *rest)
    return (b - a) / units


def streaming(delta: int) -> tuple[float, float]:
    """Instructions per delta of an Anthropic stream through the engine to the host, detector
    off and on: each stream run less a run that only builds its SSE body and text."""
    small, large = 8_000, 40_000
    units = (large - small) / delta
    body = _per_unit("body", small, large, units, str(delta), "off")
    off = _per_unit("stream", small, large, units, str(delta), "off") - body
    on = _per_unit("stream", small, large, units, str(delta), "on") - body
    return off, on


def main() -> None:
    if shutil.which("valgrind") is None:
        print("valgrind is not installed: nothing measured")
        return
    loop = _per_unit("loop", 200, 700, 500, "0", "off")
    print("## Instructions per model -> tool -> model iteration (no policies)\n")
    print(f"| agentloop | {loop:,.0f} |\n")
    print("## Doom-loop detector overhead in instructions per delta (Anthropic SSE -> engine -> host)\n")
    print("| chars / delta | detector off | on | on / off |")
    print("|---|---|---|---|")
    for delta in (4, 24, 120):
        off, on = streaming(delta)
        print(f"| {delta} | {off:,.0f} | {on:,.0f} | {on / off:.2f} |")


if __name__ == "__main__":
    if len(sys.argv) > 1 and sys.argv[1] == "--child":
        kind, size, delta, mode = sys.argv[2:6]
        _scenario(kind, int(size), int(delta), mode)
    else:
        main()
