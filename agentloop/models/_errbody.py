"""What an error body says: its text in the charset it was sent in, and a web page told by its
title or its visible text rather than quoted as markup.

Proxies, gateways and web servers in front of an API answer with their own pages (nginx's
"502 Bad Gateway", Cloudflare's "524: A timeout occurred", a login wall), whose first few
hundred characters are tags. The event stream itself is always UTF-8 (`_sse`); an error body
is whatever the server wrote.
"""

from __future__ import annotations

import codecs
import html
import re
from collections.abc import Mapping

__all__ = ["PAGE_TYPES", "QUOTE_LIMIT", "clipped", "decode_body", "is_page", "media_type", "page_text"]

#: How much of a page is searched for its title and text: a page says what it is near its
#: start, and the patterns never scan a huge one.
_PAGE_LIMIT = 64 << 10
_TITLE = re.compile(r"<title\b[^>]*>(.*?)</title\s*>", re.IGNORECASE | re.DOTALL)
#: What a browser does not show: scripts, styles, the head, comments.
_HIDDEN = re.compile(r"<(script|style|head)\b.*?</\1\s*>|<!--.*?-->", re.IGNORECASE | re.DOTALL)
_TAG = re.compile(r"<[^>]*>")
#: The most characters of a server's text an error message quotes: an error event or a transport
#: error quoting a payload of megabytes is cut to its start and its end.
QUOTE_LIMIT = 2_000
#: How much of the end of a cut text is kept (the rest of the limit goes to its start).
_QUOTE_TAIL = 500
#: The media types of a web page.
PAGE_TYPES = ("text/html", "application/xhtml+xml")
#: The media types the APIs answer with: a body sent as one is not taken for a page.
_API_TYPES = ("application/json", "text/event-stream")


def media_type(headers: Mapping[str, str]) -> str:
    """The response's media type (``text/html``), lowercased, without parameters."""
    return headers.get("content-type", "").partition(";")[0].strip().lower()


def decode_body(raw: bytes, headers: Mapping[str, str]) -> str:
    """``raw`` decoded in the ``charset`` its ``content-type`` names (UTF-8 when it names none
    or one Python does not know; a byte order mark dropped), undecodable bytes as U+FFFD."""
    charset = ""
    for param in headers.get("content-type", "").split(";")[1:]:
        name, _, value = param.partition("=")
        if name.strip().lower() == "charset":
            charset = value.strip().strip("\"'")
    try:
        codec = codecs.lookup(charset).name if charset else "utf-8"
    except LookupError:
        codec = "utf-8"
    return raw.decode("utf-8-sig" if codec == "utf-8" else codec, errors="replace")


def is_page(text: str, headers: Mapping[str, str]) -> bool:
    """Whether a body is a web page: said by its content type, or, sent without one or with
    one that is neither JSON nor an event stream (``text/plain``), by how it begins."""
    media = media_type(headers)
    if media in PAGE_TYPES:
        return True
    if media in _API_TYPES:
        return False
    start = text[:64].lstrip().lower()
    return start.startswith(("<!doctype html", "<html"))


def page_text(text: str, limit: int = 200) -> str:
    """What a web page says, in at most about ``limit`` characters: its title, else its visible
    text (tags, scripts, styles and comments left out, entities decoded, whitespace collapsed)."""
    text = text[:_PAGE_LIMIT]
    match = _TITLE.search(text)
    said = _words(match.group(1)) if match is not None else ""
    if not said:
        said = _words(_HIDDEN.sub(" ", text))
    return said[:limit]


def _words(fragment: str) -> str:
    return " ".join(html.unescape(_TAG.sub(" ", fragment)).split())


def clipped(text: str, limit: int = QUOTE_LIMIT) -> str:
    """``text`` itself when at most ``limit`` characters long; otherwise its start and its last
    `_QUOTE_TAIL` characters, with a line between them saying how many characters were cut."""
    if len(text) <= limit:
        return text
    head = max(limit - _QUOTE_TAIL, 0)
    tail = min(_QUOTE_TAIL, limit)
    return f"{text[:head]} [... {len(text) - head - tail:,} characters cut ...] {text[len(text) - tail:]}"
