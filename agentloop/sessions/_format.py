"""The records of a session file, written and read: one JSON object per line.

`event_to_json` turns an event (or anything in one) into JSON-ready data; a line is written
as strict JSON in UTF-8, a value JSON cannot encode as its ``repr`` and a lone surrogate
escaped, with every line break inside it escaped too (`encode_line`); `loads_non_finite`
reads one back, with the ``NaN`` an older version wrote read as null and an integer of any
length read whole, and `loads_record` as a reader of the file does (bytes that are not UTF-8
as U+FFFD).
"""

from __future__ import annotations

import dataclasses
import decimal
import enum
import json
import math
import re
import secrets
from collections.abc import Mapping, Sequence
from typing import Any

from pydantic import BaseModel
from pydantic_core import PydanticSerializationError

from .._jsondepth import check_depth
from .._messages import Message, holds_iterator, jsonable
from .._unicode import has_surrogates

_OTHER_LINE_BREAK = re.compile("[\x85\u2028\u2029]")  # JSON escapes the others (\n, \r, \v, \f, \x1c-\x1e)


def event_to_json(value: Any) -> Any:
    """Turn an event (or any value inside one) into JSON-ready data.

    Dataclasses become objects (with their ``type`` tag when they have one, and after their
    fields the properties their ``_json_properties`` names, as a tool call's ``input``),
    pydantic models are dumped in JSON mode (a value a model cannot dump, such as a
    host's object in a message's ``meta``, as its repr), tuples and sets become lists, enums
    their value; anything else JSON cannot encode is left for the encoder's
    ``repr`` fallback.
    """
    if isinstance(value, BaseModel):
        if not meta_holds_iterator(value):
            try:
                return _keys_kept(value.model_dump(mode="json"), value)
            except (PydanticSerializationError, ValueError):  # a host's object in a message's meta, ...
                pass
        return _fields_to_json(value)
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        out: dict[str, Any] = {}
        tag = getattr(type(value), "type", None)
        if isinstance(tag, str):
            out["type"] = tag
        for f in dataclasses.fields(value):
            out[f.name] = event_to_json(getattr(value, f.name))
        for name in getattr(type(value), "_json_properties", ()):  # derived, kept for readers (``input``)
            out[name] = event_to_json(getattr(value, name))
        return out
    if isinstance(value, Mapping):
        return {str(k): event_to_json(v) for k, v in value.items()}
    if isinstance(value, list | tuple | set | frozenset):
        return [event_to_json(v) for v in value]
    if isinstance(value, enum.Enum):
        return event_to_json(value.value)
    return value


def _fields_to_json(model: BaseModel) -> dict[str, Any]:
    """A model pydantic cannot dump whole, field by field: each as a dump writes it (its keys kept,
    see `_keys_kept`), but a message's ``meta`` (the host's data), and any field pydantic cannot
    dump, with what JSON cannot encode in it as its repr."""
    out: dict[str, Any] = {}
    for name in type(model).model_fields:
        field = getattr(model, name)
        if not (name == "meta" and isinstance(model, Message)):  # a dump may drain an iterator there
            try:
                dumped = model.model_dump(mode="json", include={name})
            except (PydanticSerializationError, ValueError):
                pass
            else:
                if name in dumped:  # else left out by the model's serializer, as in a whole dump
                    out[name] = _keys_kept(dumped[name], field)
                continue
        out[name] = jsonable(field, repr)
    return out


def _keys_kept(dumped: Any, raw: Any) -> Any:
    """``dumped`` (a JSON-mode dump of ``raw``) with each key that held a surrogate as ``raw`` has
    it: the dump writes such a key's UTF-8 bytes, one U+FFFD each (a pair of halves, an emoji,
    becomes six), where it keeps a value exactly, for the writer to escape and the reader to
    repair. ``dumped`` itself (not a copy) when no key needed it."""
    if isinstance(dumped, dict):
        if isinstance(raw, BaseModel):
            raws = [(key, getattr(raw, key, None)) for key in dumped]
        elif isinstance(raw, Mapping) and len(raw) == len(dumped):
            raws = list(raw.items())
        elif isinstance(raw, Mapping):  # keys that differ only in their surrogates, made one by the dump
            return event_to_json(raw)
        else:
            return dumped
        out: dict[Any, Any] = {}
        for (key, value), (was, old) in zip(dumped.items(), raws, strict=True):
            if isinstance(was, str) and key != was and key == _mangled(was):
                key = was
            out[key] = _keys_kept(value, old)
        same = all(k is d for k, d in zip(out, dumped, strict=True)) and all(
            v is d for v, d in zip(out.values(), dumped.values(), strict=True)
        )
        return dumped if same else out
    if isinstance(dumped, list) and isinstance(raw, list | tuple) and len(raw) == len(dumped):
        items = [_keys_kept(d, r) for d, r in zip(dumped, raw, strict=True)]
        return dumped if all(i is d for i, d in zip(items, dumped, strict=True)) else items
    return dumped


def _mangled(key: str) -> str:
    """``key`` as a JSON-mode dump writes a key holding a surrogate (see `_keys_kept`)."""
    return key.encode("utf-8", "surrogatepass").decode("utf-8", "replace")


def meta_holds_iterator(value: object) -> bool:
    """Whether ``value`` is a message whose ``meta`` (the host's data) holds an iterator, which
    a pydantic dump would drain: forever, for an endless one."""
    return isinstance(value, Message) and bool(value.meta) and holds_iterator(value.meta)


def encode_line(line: str) -> bytes:
    return escape_line_breaks(line).encode("utf-8")


def escape_line_breaks(line: str) -> str:
    """``line`` (JSON text) with U+0085, U+2028 and U+2029 escaped: raw in a JSON string, yet
    line breaks to str.splitlines() and to other readers of "lines". Escaped, a record is one
    line for every reader."""
    if _OTHER_LINE_BREAK.search(line) is not None:
        line = _OTHER_LINE_BREAK.sub(lambda m: f"\\u{ord(m.group()):04x}", line)
    return line


def message_json(message: Message) -> str:
    """``message`` as JSON text: pydantic's, or, for one holding a lone UTF-16 surrogate (kept
    exactly, as a \\udXXX escape, in a key too) or a value in the host's ``meta`` that JSON
    cannot encode (written as its repr, as in an event record), `dumps` of `event_to_json`."""
    if not meta_holds_iterator(message):
        try:
            text = message.model_dump_json()
        except (PydanticSerializationError, ValueError):
            pass
        else:
            # A key holding a surrogate is written as U+FFFDs, with no error (see `_keys_kept`).
            if "\ufffd" not in text:
                return text
    return dumps(event_to_json(message))


def checkpoint_line(messages: Sequence[Message]) -> str:
    return '{"type":"checkpoint","messages":[' + ",".join(map(message_json, messages)) + "]}\n"


def dumps(obj: Any) -> str:
    try:
        text = json.dumps(obj, ensure_ascii=False, separators=(",", ":"), default=repr, allow_nan=False)
    except ValueError:
        # A NaN or an infinity, which JSON has no number for: null, as in a message. Or an
        # integer of more digits than int() writes (sys.get_int_max_str_digits): written whole.
        longs: dict[str, str] = {}
        obj = _finite(obj, longs)
        text = _with_longs(json.dumps(obj, ensure_ascii=False, separators=(",", ":"), default=repr), longs)
        if has_surrogates(text):
            text = _with_longs(json.dumps(obj, ensure_ascii=True, separators=(",", ":"), default=repr), longs)
        return text
    if has_surrogates(text):  # UTF-8 cannot encode it: escape everything non-ASCII instead
        text = json.dumps(obj, ensure_ascii=True, separators=(",", ":"), default=repr)
    return text


_LONG_MARK = "\x00long-int-" + secrets.token_hex(8) + "-"


def _finite(value: Any, longs: dict[str, str]) -> Any:
    """``value`` with every float that is NaN or infinite replaced by None, and every integer
    too long for int() to write by a string that ``longs`` maps to its JSON (`_with_longs`)."""
    if isinstance(value, float):
        return value if math.isfinite(value) else None
    if isinstance(value, int):
        try:
            repr(value)
        except ValueError:
            mark = f"{_LONG_MARK}{len(longs)}"
            longs[json.dumps(mark)] = format(decimal.Decimal(value), "f")  # no digit limit
            return mark
        return value
    if isinstance(value, dict):
        return {k: _finite(v, longs) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [_finite(v, longs) for v in value]
    return value


def _with_longs(text: str, longs: dict[str, str]) -> str:
    for mark, digits in longs.items():
        text = text.replace(mark, digits)
    return text


def _non_finite(constant: str) -> None:
    """What a ``NaN``, ``Infinity`` or ``-Infinity`` token (not JSON; an older version wrote
    them in event records) reads as: None, as the null written for one today."""
    return None


def _long_int(digits: str) -> int:
    """An integer token, however many digits: ``int()`` refuses more than
    ``sys.get_int_max_str_digits()`` (4300), which a record written by pydantic may hold."""
    try:
        return int(digits)
    except ValueError:
        return int(decimal.Decimal(digits))


_DECODER = json.JSONDecoder(parse_constant=_non_finite)
_LONG_INT_DECODER = json.JSONDecoder(parse_constant=_non_finite, parse_int=_long_int)


def loads_non_finite(line: bytes) -> Any:
    """json.loads, with a ``NaN`` or ``Infinity`` token read as None, and an integer of any
    length read whole (it costs what json.loads costs: each is handled only where it occurs)."""
    # As json.loads does with bytes: UTF-8 (or the UTF-16/32 a BOM or NUL bytes show), with
    # surrogates kept for the repair to join or replace.
    text = line.decode(json.detect_encoding(line), "surrogatepass")
    check_depth(text)  # the same limit on every Python version
    try:
        return _DECODER.decode(text)
    except json.JSONDecodeError:
        raise
    except ValueError:  # not a syntax error: an integer of more digits than int() converts
        return _LONG_INT_DECODER.decode(text)


def loads_record(line: bytes) -> tuple[Any, bool]:
    """`loads_non_finite`, with bytes that are not UTF-8 (edited or damaged elsewhere) read as
    U+FFFD rather than failing the line; and whether any were."""
    try:
        return loads_non_finite(line), False
    except UnicodeDecodeError:
        return loads_non_finite(line.decode("utf-8", "replace").encode("utf-8")), True
