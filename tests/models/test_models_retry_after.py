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
