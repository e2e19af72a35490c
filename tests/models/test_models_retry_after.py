"""``Retry-After`` as servers write it."""

from __future__ import annotations

import time
from collections.abc import Iterator

import pytest

from agentloop.models import parse_retry

_NOW = 1_700_000_000.0  # 2023-11-14 22:13:20 GMT


@pytest.fixture
def far_from_gmt(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    """The machine's local time zone is not GMT (an engineer's laptop, not a server)."""
    monkeypatch.setenv("TZ", "America/New_York")
    time.tzset()
    yield
    monkeypatch.undo()
    time.tzset()


@pytest.mark.usefixtures("far_from_gmt")
@pytest.mark.parametrize(
    "date",
    [
        "Tue Nov 14 22:13:32 2023",  # asctime, which RFC 9110 still accepts: GMT, with no zone said
        "Tue, 14 Nov 2023 22:13:32 -0000",  # RFC 2822's "zone unknown", which HTTP writes for GMT
        "Tue, 14 Nov 2023 22:13:32 GMT",
        "Tuesday, 14-Nov-23 22:13:32 GMT",  # RFC 850
    ],
)
def test_an_http_date_is_gmt_whatever_the_local_time_zone(date: str) -> None:
    # A date with no zone was read in local time: five hours off in New York, so a 12 s wait
    # became 18,012 s (the turn ended: "longer than the engine waits") or nothing at all.
    assert parse_retry(429, {"retry-after": date}, now=_NOW) == (True, pytest.approx(12.0))


@pytest.mark.parametrize(
    ("pairs", "wait"),
    [
        ([("retry-after", "7"), ("retry-after", "7")], 7.0),
        ([("retry-after", "12"), ("retry-after", "30")], 12.0),
        ([("retry-after-ms", "1500"), ("retry-after-ms", "1500"), ("retry-after", "9")], 1.5),
    ],
    ids=["twice", "two-values", "ms-twice"],
)
def test_a_retry_after_sent_twice_is_read(pairs: list[tuple[str, str]], wait: float) -> None:
    # A gateway that adds its own Retry-After next to the upstream's: httpx joins the two
    # ("7, 7"), which read as no number and no date, and the server's wait was ignored.
    import httpx

    assert parse_retry(429, httpx.Headers(pairs), now=_NOW) == (True, wait)
