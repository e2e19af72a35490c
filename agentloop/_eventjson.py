"""An event as one line of strict JSON: what a host sends to a browser (server-sent events,
a websocket, JSON lines), in the form a session file's event records hold."""

from __future__ import annotations

from typing import get_args

from ._events import Event
from .sessions._format import dumps, escape_line_breaks, event_to_json

_EVENT_TYPES = get_args(Event)


def event_json(event: Event) -> str:
    """``event`` as one line of strict JSON, its ``type`` tag first.

    Every field is there (messages and blocks as a session file holds them, tuples as lists);
    a float JSON has no number for (NaN, an infinity) is ``null``, a value JSON cannot
    encode (a host's object in a tool input) its ``repr``. The line holds no line break of any
    kind, so it fits an SSE ``data:`` line, and it always encodes as UTF-8 (text UTF-8 cannot
    encode is written as ``\\u`` escapes). Anything but an agentloop event is a `TypeError`.
    """
    if not isinstance(event, _EVENT_TYPES):
        raise TypeError(f"event_json() takes an agentloop event, not {type(event).__name__}")
    return escape_line_breaks(dumps(event_to_json(event)))
