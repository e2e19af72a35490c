"""Logging what the host's own code raised (a policy hook, an abort hook, a tool watcher, a
session store) without the credentials the engine knows.

Such an error is logged with its traceback, which may quote the engine's model key (a hook
that prints the request it saw, an exception raised with a header in its message). Only on
this error path are the engine's credentials read and the traceback searched: a record that
holds one is logged with the traceback as text, the credentials replaced by ``[REDACTED]``.
"""

from __future__ import annotations

import logging
import sys
import traceback
from typing import Any

from ._transcript import lineage_credentials, redacted

log = logging.getLogger("agentloop")


def log_failure(engine: Any, message: str, *args: object, exc: BaseException | None = None) -> None:
    """Log ``message % args`` at ERROR with the traceback of ``exc`` (by default the exception
    being handled), as ``log.exception`` would; with the credentials ``engine`` knows (its
    model's and its ancestors', `lineage_credentials`) replaced by ``[REDACTED]`` in both."""
    exc = exc if exc is not None else sys.exc_info()[1]
    secrets = lineage_credentials(engine) if exc is not None and engine is not None else ()
    if secrets:
        text = message % args if args else message
        trace = "".join(traceback.format_exception(exc)).rstrip()
        if any(secret in text or secret in trace for secret in secrets):
            log.error("%s\n%s", redacted(text, secrets), redacted(trace, secrets), stacklevel=2)
            return
    log.error(message, *args, exc_info=exc, stacklevel=2)
