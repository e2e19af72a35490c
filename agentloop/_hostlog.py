"""Logging what the host's own code raised (a policy hook, an abort hook, a tool watcher, a
session store) without the credentials the engine knows.

Such an error is logged with its traceback, which may quote the engine's model key (a hook
that prints the request it saw, an exception raised with a header in its message). Only on
this error path are the engine's credentials read and the traceback searched: a record that
holds one is logged with the traceback as text, the credentials replaced by ``[REDACTED]``.
"""

from __future__ import annotations

import logging
import reprlib
import sys
import traceback
import weakref
from collections.abc import Callable, Iterable
from typing import Any

from ._transcript import lineage_credentials, redacted

log = logging.getLogger("agentloop")


def log_failure(
    engine: Any, message: str, *args: object, exc: BaseException | None = None, level: int = logging.ERROR
) -> None:
    """Log ``message % args`` at ``level`` (ERROR) with the traceback of ``exc`` (by default the
    exception being handled), as ``log.exception`` would; with the credentials ``engine`` knows
    (its model's and its ancestors', `lineage_credentials`) replaced by ``[REDACTED]`` in both."""
    log_scrubbed(
        lambda: lineage_credentials(engine) if engine is not None else (), message, *args, exc=exc, stacklevel=3, level=level
    )


def log_scrubbed(
    secrets: Callable[[], Iterable[str]],
    message: str,
    *args: object,
    exc: BaseException | None = None,
    stacklevel: int = 2,
    level: int = logging.ERROR,
) -> None:
    """`log_failure` with the credentials ``secrets()`` gives (called only when there is an
    error to log; one that fails counts as none), at ``level``."""
    if not log.isEnabledFor(level):  # a DEBUG line nobody reads costs no search for credentials
        return
    exc = exc if exc is not None else sys.exc_info()[1]
    found: tuple[str, ...] = ()
    if exc is not None:
        try:
            found = tuple(sorted({s for s in secrets() if s}, key=len, reverse=True))
        except Exception:  # what knows them failed: the error is still logged, as it is
            log.debug("the credentials to scrub from an error could not be read", exc_info=True)
    if found:
        text = message % args if args else message
        trace = "".join(traceback.format_exception(exc)).rstrip()
        if any(secret in text or secret in trace for secret in found):
            log.log(level, "%s\n%s", redacted(text, found), redacted(trace, found), stacklevel=stacklevel)
            return
    log.log(level, message, *args, exc_info=exc, stacklevel=stacklevel)


#: How much of a long string or repr `host_repr` reads: all of it but for a giant, so that a
#: credential in it is whole when scrubbed (one cut in two by the bound would not be found).
_READ = reprlib.Repr()
_READ.maxstring = _READ.maxother = 1_000_000
#: How much of it is shown once scrubbed: its start and end, this long in all.
_LONG = 4_000
#: How much of it a log line shows, as `reprlib.repr` would.
_SHORT = 30


def host_repr(engine: Any, value: object, *, short: bool = False) -> str:
    """The repr of ``value``, what a host's callback returned by mistake (a policy hook, the
    permission callback), for a log line or an error result: read whole (up to a million
    characters), the credentials ``engine`` knows (`lineage_credentials`) replaced by
    ``[REDACTED]``, then cut to its start and end (4,000 characters; ``short``: the 30 or so
    `reprlib.repr` shows), so that no piece of one is shown. Read only on this error path."""
    text = _READ.repr(value)
    try:
        secrets = lineage_credentials(engine) if engine is not None else ()
    except Exception:  # what knows them failed: the repr is still shown
        secrets = ()
    clean = redacted(text, secrets)
    if not short:
        return clean if len(clean) <= _LONG else f"{clean[: _LONG // 2]}...{clean[-_LONG // 2 :]}"
    if clean is text:  # nothing to take out: as it was always shown
        return reprlib.repr(value)
    if len(clean) <= 2 * _SHORT:
        return clean
    return f"{clean[:_SHORT]}...{clean[-_SHORT:]}"


def engine_secrets(engine: Any) -> Callable[[], tuple[str, ...]]:
    """What gives the credentials ``engine`` knows (`lineage_credentials`), holding it weakly: a
    signal that outlives its engine does not keep it alive."""
    ref = weakref.ref(engine)

    def known() -> tuple[str, ...]:
        current = ref()
        return lineage_credentials(current) if current is not None else ()

    return known
