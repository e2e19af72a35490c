"""A tool's docstring read as the model needs it: what the tool does, and each parameter's part.

The parameter section of a docstring, in any of the three usual forms, gives each parameter
its description in the input schema, and leaves the tool's description:

- Google: ``Args:`` (or ``Arguments:``, ``Parameters:``, ``Keyword Args:``...), then one
  ``name: text`` or ``name (type): text`` per parameter, its text going on in deeper lines;
- NumPy: ``Parameters`` underlined with dashes, then ``name : type`` lines, each with its
  text in the deeper lines under it;
- reST (Sphinx): ``:param name: text`` or ``:param type name: text`` fields, with their
  ``:type name:`` fields.

A section that does not read as one of these (prose under ``Args:``), or that names none of the
function's parameters, is left as it is, and gives no descriptions.
"""

from __future__ import annotations

import re
from collections.abc import Collection

__all__ = ["split_docstring"]

_GOOGLE_HEADER = re.compile(
    r"(?i)(args|arguments|parameters|params|keyword args|keyword arguments|kwargs|other parameters)\s*:"
)
_GOOGLE_ENTRY = re.compile(r"\*{0,2}(\w+)\s*(?:\([^)]*\))?\s*:(?:\s+(.*))?")
_NUMPY_HEADER = re.compile(r"(?i)(parameters|other parameters|keyword arguments)")
_NUMPY_ENTRY = re.compile(r"(\*{0,2}\w+(?:\s*,\s*\*{0,2}\w+)*)\s*(?::.*)?")
_UNDERLINE = re.compile(r"-{3,}\s*")
_REST_PARAM = re.compile(r":(?:param|parameter|arg|argument|key|keyword)\s+(?:[^:]*\s)?\*{0,2}(\w+)\s*:(.*)")
_REST_TYPE = re.compile(r":type\s+\*{0,2}(\w+)\s*:.*")


def split_docstring(doc: str, names: Collection[str]) -> tuple[str, dict[str, str]]:
    """``doc`` (cleaned, as `inspect.getdoc` gives it) without its parameter sections, and the
    description each of them gives to one of ``names`` (the function's parameters)."""
    lines = doc.splitlines()
    params: dict[str, str] = {}
    kept: list[str] = []
    i = 0
    while i < len(lines):
        found: dict[str, str] = {}
        end = _google(lines, i, found) or _numpy(lines, i, found) or _rest(lines, i, found)
        if end and any(name in names for name in found):
            for name, text in found.items():
                if text:  # a ``:type x:`` field names ``x`` with no text
                    params.setdefault(name, text)
            i = end
            continue
        kept.append(lines[i])
        i += 1
    if not params:
        return doc, {}
    text = "\n".join(kept)
    return re.sub(r"\n{3,}", "\n\n", text).strip(), {k: v for k, v in params.items() if k in names}


def _indent(line: str) -> int:
    return len(line) - len(line.lstrip())


_Entry = tuple[list[str], list[str]]  # the names an entry documents, and its text's lines


def _entries(lines: list[str], start: int, depth: int, entry: re.Pattern[str]) -> tuple[int, list[_Entry]]:
    """The entries from ``start``: each a line at one indentation (deeper than ``depth``) that
    ``entry`` matches, and the deeper lines under it. Returns where they end (0 when a line at
    their indentation is no entry) and, for each, its names and its text's lines."""
    found: list[_Entry] = []
    at: int | None = None
    i = start
    while i < len(lines):
        line = lines[i]
        if not line.strip():
            i += 1
            continue
        if _indent(line) <= depth:
            break
        if at is None:
            at = _indent(line)
        if _indent(line) == at:
            m = entry.fullmatch(line.strip())
            if m is None:
                return 0, []
            names = [n.strip().lstrip("*") for n in m.group(1).split(",")]
            first = m.group(2) if len(m.groups()) > 1 else None  # Google's text starts on the name's line
            found.append((names, [first] if first else []))
        elif _indent(line) > at and found:
            found[-1][1].append(line.strip())
        else:
            return 0, []
        i += 1
    while i > start and not lines[i - 1].strip():  # blank lines after the section stay
        i -= 1
    return (i, found) if found else (0, [])


def _keep(params: dict[str, str], found: list[_Entry]) -> None:
    for names, text in found:
        for name in names:
            if text:
                params.setdefault(name, " ".join(text))


def _google(lines: list[str], i: int, params: dict[str, str]) -> int:
    if not _GOOGLE_HEADER.fullmatch(lines[i].strip()):
        return 0
    end, found = _entries(lines, i + 1, _indent(lines[i]), _GOOGLE_ENTRY)
    _keep(params, found)
    return end


def _numpy(lines: list[str], i: int, params: dict[str, str]) -> int:
    if i + 1 >= len(lines) or not _NUMPY_HEADER.fullmatch(lines[i].strip()):
        return 0
    if not _UNDERLINE.fullmatch(lines[i + 1].strip()):
        return 0
    # The entries sit at the header's indentation: read them as if one deeper.
    body = [" " + line if line.strip() else line for line in _until_next_numpy_header(lines, i + 2)]
    end, found = _entries(body, 0, _indent(lines[i]), _NUMPY_ENTRY)
    _keep(params, found)
    return i + 2 + end if end else 0


def _until_next_numpy_header(lines: list[str], start: int) -> list[str]:
    for j in range(start, len(lines) - 1):
        if lines[j].strip() and _UNDERLINE.fullmatch(lines[j + 1].strip()):
            return lines[start:j]
    return lines[start:]


def _rest(lines: list[str], i: int, params: dict[str, str]) -> int:
    line = lines[i].strip()
    m = _REST_PARAM.fullmatch(line) or _REST_TYPE.fullmatch(line)
    if m is None:
        return 0
    depth = _indent(lines[i])
    j = i + 1
    text = [m.group(2).strip()] if m.re is _REST_PARAM and m.group(2).strip() else []
    while j < len(lines) and lines[j].strip() and _indent(lines[j]) > depth:
        text.append(lines[j].strip())
        j += 1
    params.setdefault(m.group(1), " ".join(text) if m.re is _REST_PARAM else "")
    return j
