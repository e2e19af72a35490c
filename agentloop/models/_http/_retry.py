"""Whether a failed HTTP response is worth another attempt, and after how long.

`parse_retry` reads the status and the ``x-should-retry``, ``retry-after-ms`` and
``retry-after`` headers. The attempts themselves, their back-off and its budget are the
model phase's (`agentloop._streaming`), which goes by what the error says.
"""

from __future__ import annotations

import datetime
import email.utils
import math
import time
from collections.abc import Mapping

#: HTTP statuses a new attempt can fix (408 timeout, 409 conflict/lock,
#: 429 rate limit, 5xx transient, 520-524 Cloudflare in front of the server: unknown
#: error, origin down, connect timeout, origin unreachable, read timeout; 529 Anthropic
#: overloaded).
RETRYABLE_STATUSES = frozenset({408, 409, 429, 500, 502, 503, 504, 520, 521, 522, 523, 524, 529})


def parse_retry(
    status: int | None, headers: Mapping[str, str], *, now: float | None = None
) -> tuple[bool, float | None]:
    """Decide ``(retryable, retry_after_seconds)`` for a failed HTTP response: its ``status``
    and its ``headers`` (httpx's, whose names match in any case; in a plain dict, lower case).

    ``x-should-retry: true|false`` decides outright; otherwise the status
    decides (`RETRYABLE_STATUSES`). The delay comes from ``retry-after-ms``
    (wins) or ``retry-after`` (seconds, or an HTTP-date, GMT, relative to ``now``; the first
    of several values); missing, negative or unparsable values give None. Never raises.
    """
    should = headers.get("x-should-retry", "").strip().lower()
    if should == "true":
        retryable = True
    elif should == "false":
        retryable = False
    else:
        retryable = status in RETRYABLE_STATUSES
    return retryable, _retry_after(headers, now)


def _retry_after(headers: Mapping[str, str], now: float | None) -> float | None:
    raw_ms = headers.get("retry-after-ms")
    if raw_ms is not None:
        ms = _float(raw_ms)
        if ms is not None:
            return ms / 1000.0
    raw = headers.get("retry-after")
    if raw is None:
        return None
    seconds = _float(raw)
    if seconds is not None:
        return seconds
    try:
        when = email.utils.parsedate_to_datetime(raw.strip())
    except (TypeError, ValueError, IndexError):
        return None
    if when.tzinfo is None:  # asctime or "-0000": an HTTP date is GMT, never local time
        when = when.replace(tzinfo=datetime.UTC)
    return max(0.0, when.timestamp() - (time.time() if now is None else now))


def _float(raw: str) -> float | None:
    """A wait in seconds (or ms): finite, not negative; the first value of several (a gateway's
    ``Retry-After`` next to the upstream's, which the HTTP layer joins with a comma)."""
    if "," in raw:
        raw = raw.partition(",")[0]
    try:
        value = float(raw.strip())
    except ValueError:
        return None
    return value if math.isfinite(value) and value >= 0 else None
