"""No doom-loop report on real files nobody here wrote, streamed as a model writes them.

A sample of the benchmark's corpus (benchmarks/runaway/sources.py): the standard
library's encoding tables and tests, type stubs, the data files and READMEs of the
installed packages, code and data in a fence of their language, through the stock
`ConservativeDoomLoopPolicy` on the content channel.
"""

from __future__ import annotations

import pytest

from benchmarks.runaway.sources import SOURCES, flags, responses

SAMPLE = ("stdlib tables", "stdlib tests", "type stubs", "package data", "package READMEs")


@pytest.mark.parametrize("kind", SAMPLE)
def test_real_files_get_no_doom_loop_report_on_the_content_channel(kind: str) -> None:
    paths = SOURCES[kind]()
    if kind in ("stdlib tables", "package READMEs"):  # on every machine: never an empty sample
        assert paths
    found: list[str] = []
    for i, r in enumerate(responses(kind, paths, 400_000)):
        found += [f"{r.path} @{r.offset + at}: period {p}" for at, p in flags(r.text, 1, 24, i)]
    assert found == []
