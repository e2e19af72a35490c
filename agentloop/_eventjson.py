"""An event as one line of strict JSON: what a host sends to a browser (server-sent events,
a websocket, JSON lines), in the form a session file's event records hold."""

from __future__ import annotations

from typing import Any, get_args

from ._checks import count
from ._events import Event
from .sessions._format import dumps, escape_line_breaks, event_to_json

_EVENT_TYPES = get_args(Event)
# What says what a value is, or which call or agent it belongs to, is not cut: a reader
# dispatches on the type tags and matches results to calls by id. Such a value longer than
# _TAG_CHARS is no tag or id (a key of a tool's input, say) and is cut as any other.
_WHOLE = frozenset({"type", "id", "tool_use_id", "agent_id", "parent_tool_use_id"})
_TAG_CHARS = 256


def event_json(event: Event, *, max_text_chars: int | None = None) -> str:
    """``event`` as one line of strict JSON, its ``type`` tag first.

    Every field is there (messages and blocks as a session file holds them, tuples as lists);
    a float JSON has no number for (NaN, an infinity) is ``null``, a value JSON cannot
    encode (a host's object in a tool input) its ``repr``. The line holds no line break of any
    kind, so it fits an SSE ``data:`` line, and it always encodes as UTF-8 (text UTF-8 cannot
    encode is written as ``\\u`` escapes). Anything but an agentloop event is a `TypeError`.

    ``max_text_chars`` bounds the line for a log pipeline: each string value longer than that
    (a tool's 5 MB ``full_result``, a long input) is cut in the middle, and the cut says how
    many characters were left out; the keys and the shape stay as they are, and so do the
    tags and ids a reader dispatches and matches on (the string values of ``type``, ``id``,
    ``tool_use_id``, ``agent_id`` and ``parent_tool_use_id`` up to 256 characters). None (the
    default) keeps every character. A value that is not a whole number >= 0 is a `TypeError` or
    `ValueError`.
    """
    if not isinstance(event, _EVENT_TYPES):
        raise TypeError(f"event_json() takes an agentloop event, not {type(event).__name__}")
    data = event_to_json(event)
    limit = count("event_json() max_text_chars", max_text_chars, 0)
    if limit is not None:
        data = _bounded(data, limit)
    return escape_line_breaks(dumps(data))


def _bounded(value: Any, limit: int) -> Any:
    """``value`` (JSON-ready data) with each string longer than ``limit`` cut in the middle."""
    if isinstance(value, str):
        if len(value) <= limit:
            return value
        head = limit - limit // 2
        tail = value[len(value) - limit // 2 :] if limit // 2 else ""
        return f"{value[:head]}[... {len(value) - limit} characters left out ...]{tail}"
    if isinstance(value, dict):
        return {k: v if _is_tag(k, v) else _bounded(v, limit) for k, v in value.items()}
    if isinstance(value, list):
        return [_bounded(v, limit) for v in value]
    return value


def _is_tag(key: str, value: Any) -> bool:
    """``value`` is a type tag or an id, kept whole (see ``_WHOLE``)."""
    return key in _WHOLE and isinstance(value, str) and len(value) <= _TAG_CHARS
