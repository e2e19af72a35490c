"""The benchmarks' own inputs are streams a server could send: a benchmark that fails (or
measures an error path) on a change of the adapters is caught here, not by its next run."""

from __future__ import annotations

import pytest

from benchmarks.bench_providers import GROUPS, httpx_client, lengthen, load, ours_summary, run_agentloop


@pytest.mark.parametrize("group", sorted(GROUPS))
async def test_the_lengthened_provider_streams_parse_to_the_lengthened_message(group: str) -> None:
    for name in GROUPS[group]:
        async with httpx_client(lengthen(load(name), 1)) as client:
            once = ours_summary(await run_agentloop(group, client))
        async with httpx_client(lengthen(load(name), 3)) as client:
            thrice = ours_summary(await run_agentloop(group, client))
        assert (thrice["tools"], thrice["stop"]) == (once["tools"], once["stop"]), name
        assert len(thrice["text"]) == 3 * len(once["text"]), name  # every text delta three times over
        assert sorted(thrice["text"]) == sorted(once["text"] * 3), name


def test_the_callgrind_streaming_figures_leave_out_building_the_sse_body(monkeypatch: pytest.MonkeyPatch) -> None:
    """The stream scenario builds its SSE body (a json.dumps per delta) in the measured process:
    that work is the benchmark's, not the engine's, so it is not counted per delta."""
    from benchmarks import callgrind_overhead

    per_delta = {"body": 30_000, "off": 44_000, "on": 50_000}  # body built; the engine on top of it

    def instructions(kind: str, size: str, delta: str, mode: str) -> int:
        deltas = int(size) // int(delta)
        count = 5_000_000 + deltas * per_delta["body"]  # start-up, then the body
        if kind == "stream":
            count += deltas * per_delta[mode]
        return count

    monkeypatch.setattr(callgrind_overhead, "_instructions", instructions)
    assert callgrind_overhead.streaming(4) == (44_000, 50_000)
