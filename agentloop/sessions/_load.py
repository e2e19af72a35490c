"""Reading a session file back: its records, torn and corrupt lines skipped, repaired.

`load_file` is what `JsonlSession.load` does; a message written by a newer version is kept
without the fields and blocks this version does not know (but for a field that changes what a
message of text means, such as OpenAI's ``tool_calls``: that message is skipped).
"""

from __future__ import annotations

import contextlib
import gc
import logging
import os
import re
import stat
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from pydantic import BaseModel, ValidationError

from .._messages import (
    Message,
    ProviderBlock,
    RedactedThinkingBlock,
    TextBlock,
    ThinkingBlock,
    ToolResultBlock,
    ToolUseBlock,
)
from .._repair import repair
from ._format import loads_record

log = logging.getLogger("agentloop")

_ENCODED_SURROGATE = re.compile(rb"\xed[\xa0-\xbf]")


@dataclass(slots=True)
class LoadedSession:
    """What `JsonlSession.load` found.

    ``messages``: the repaired, valid transcript. ``repairs``: one line per change
    `repair_transcript` made. ``warnings``: torn or corrupt lines that were
    skipped. ``events``: the event records, as JSON objects (``event["type"]``
    is the event's type tag; a tool call's record an older version wrote without ``input``
    has it filled in).
    """

    messages: list[Message]
    repairs: list[str] = field(default_factory=list)
    warnings: list[str] = field(default_factory=list)
    events: list[dict[str, Any]] = field(default_factory=list)


def load_file(path: Path, *, quiet: bool = False) -> LoadedSession:
    """The session in the file at ``path``, repaired (see `JsonlSession.load`); raises OSError
    if the file exists but cannot be read. ``quiet``: the warnings are returned, not logged."""
    try:
        data = _read(path)
    except FileNotFoundError:
        return LoadedSession(messages=[])
    if data is None:
        return _not_a_file(path, quiet=quiet)
    # A string holds a surrogate only through a \ud escape, or through the bytes of one
    # encoded as if it were a character (0xED 0xA0-0xBF: json decodes bytes with
    # "surrogatepass"; CESU-8 writers do this): without either, rule R9 need not be
    # checked string by string (about a tenth of a large load).
    escaped = b"\\u" in data and (b"\\ud" in data or b"\\uD" in data)
    encoded = b"\xed" in data and _ENCODED_SURROGATE.search(data) is not None
    lines = _lines(data)
    del data  # the lines hold it from here on, each let go once read: a large file is not held twice
    loaded = LoadedSession(messages=[])
    problems: list[str] = []
    notes: list[str] = []  # what a record from a newer version lost, yet was kept
    with _gc_paused():
        for lineno, line, complete in lines:
            why = _read_record(line, loaded, notes)
            if why is not None and not complete:
                why = "no final newline"  # torn: a whole record without one is kept (JSON Lines)
            if why is not None:
                where = "the torn last line" if lineno == -1 else f"corrupt line {lineno}"
                problems.append(f"skipped {where} ({why})")
                notes = []  # what the skipped line would have lost: not news of the next line
            elif notes:
                where = "the last line" if lineno == -1 else f"line {lineno}"
                problems += [f"{where}: {note}" for note in notes]
                notes = []
    for problem in problems:
        warning = f"{path}: {problem}"
        if not quiet:
            log.warning("%s", warning)
        loaded.warnings.append(warning)
    loaded.messages = repair(loaded.messages, changes=loaded.repairs, text_checked=not (escaped or encoded))
    return loaded


def _read(path: Path) -> bytes | None:
    """The bytes of the file at ``path``; None when it is not a regular file (a FIFO, a socket,
    a device), which is not read: a FIFO would be read until a writer came and went (for ever),
    a pipe another process reads (``/dev/stdout`` piped to a viewer) would lose its data, and
    ``/dev/zero`` never ends. Raises OSError as reading does (`IsADirectoryError` for a
    directory)."""
    mode = path.stat().st_mode
    if not stat.S_ISREG(mode) and not stat.S_ISDIR(mode):
        return None
    return path.read_bytes()


def _not_a_file(path: Path, *, quiet: bool) -> LoadedSession:
    """What a path that is not a regular file loads as: nothing, with a warning (but for
    ``os.devnull``, where a host that keeps nothing writes)."""
    loaded = LoadedSession(messages=[])
    with contextlib.suppress(OSError):
        if os.path.samefile(path, os.devnull):
            return loaded
    warning = f"{path}: not a regular file (a FIFO, a socket or a device): nothing is read back from it"
    if not quiet:
        log.warning("%s", warning)
    loaded.warnings.append(warning)
    return loaded


@contextlib.contextmanager
def _gc_paused() -> Iterator[None]:
    # Decoding builds many small acyclic objects; letting the cyclic GC scan
    # them over and over roughly doubles the time of a large load.
    enabled = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if enabled:
            gc.enable()


def _lines(data: bytes) -> Iterator[tuple[int, bytes, bool]]:
    """(line number, line, ends with newline); the line number of a torn tail is -1.

    Holds ``data`` only until it is split, and each line only until it is read (the caller
    drops its own reference to ``data``), so that memory holds the file about once."""
    parts = data.split(b"\n")
    del data
    tail = parts.pop()  # b"" when the data ends with a newline
    last = len(parts)
    parts.reverse()  # popped from the end, in file order
    for i in range(1, last + 1):
        part = parts.pop()
        if part.strip():
            yield (-1 if i == last and not tail else i), part, True
    if tail:
        yield -1, tail, False


def _read_record(line: bytes, loaded: LoadedSession, notes: list[str]) -> str | None:
    """Add one record to ``loaded``; return why it was skipped, or None (``notes``: what a
    record kept from a newer version lost)."""
    try:
        record, replaced = loads_record(line)  # bytes that are not UTF-8 cost only themselves
        if replaced:
            notes.append("replaced bytes that are not UTF-8 with U+FFFD")
        kind = record.get("type") if isinstance(record, dict) else None
        if kind == "message":
            loaded.messages.append(_message(record["message"], notes))
        elif kind == "event" and isinstance(record.get("event"), dict):
            loaded.events.append(_with_input(record["event"]))
        elif kind == "checkpoint":
            loaded.messages = [_message(m, notes) for m in record["messages"]]
        else:
            return f"unknown record type {_quoted(kind)}"
    except (ValueError, KeyError, TypeError, ValidationError, RecursionError) as exc:
        # RecursionError: a line nested deeper than the parser's stack (damage, or not a session)
        return f"{type(exc).__name__}: {str(exc).splitlines()[0][:200]}"
    return None


_TOOL_CALL_EVENTS = frozenset({"tool_call_started", "tool_call_finished"})


def _with_input(event: dict[str, Any]) -> dict[str, Any]:
    """``event``, a tool call's record from an older version (written without ``input``, the
    input the call ran with) given it as a record written today holds it: ``updated_input``,
    else the model's ``tool_use.input``. Any other record (or one too damaged to tell) as it is."""
    if event.get("type") not in _TOOL_CALL_EVENTS or "input" in event:
        return event
    ran = event.get("updated_input")
    if ran is None:
        call = event.get("tool_use")
        ran = call.get("input") if isinstance(call, dict) else None
    if isinstance(ran, dict):
        event["input"] = ran
    return event


#: Fields (OpenAI's) that make a message of text content something else: one holding them is skipped.
_MEANING_CHANGING = ("tool_calls", "tool_call_id", "function_call")

_BLOCKS: dict[str, type[BaseModel]] = {
    cls.model_fields["type"].default: cls
    for cls in (TextBlock, ThinkingBlock, RedactedThinkingBlock, ToolUseBlock, ToolResultBlock, ProviderBlock)
}


def _message(data: Any, notes: list[str]) -> Message:
    """``data`` as a `Message`. One written by a newer version is kept without the fields and
    the blocks this version does not know (each noted in ``notes``) rather than skipped whole;
    raises the original ValidationError when even that does not validate."""
    try:
        return Message.model_validate(data)
    except ValidationError as exc:
        if not isinstance(data, dict) or not isinstance(data.get("content"), list | str):
            raise
        if isinstance(data["content"], str) and (changing := [k for k in _MEANING_CHANGING if k in data]):
            # Text with tool calls, or a tool's result, written as another tool writes them: kept
            # as plain text, it would tell the model something else than the file says.
            raise ValueError(f"a message of text content with {_quoted(changing[0])}, which changes its meaning") from None
        lost: list[str] = []
        known = _known_fields(data, Message, "message", lost)
        if isinstance(data["content"], list):  # a string is text: no block in it to drop
            known["content"] = _known_blocks(data["content"], lost)
        try:
            message = Message.model_validate(known)
        except ValidationError:
            raise exc from None
        notes += lost
        return message


def _known_blocks(blocks: list[Any], lost: list[str]) -> list[Any]:
    out: list[Any] = []
    for block in blocks:
        cls = _BLOCKS.get(str(block.get("type"))) if isinstance(block, dict) else None
        if cls is None:
            if isinstance(block, dict):
                lost.append(f"dropped a block of unknown type {_quoted(block.get('type'))}")
            else:
                out.append(block)  # not a block at all: validation fails, as it should
            continue
        known = _known_fields(block, cls, f"{block['type']} block", lost)  # a known type: short
        if cls is ToolResultBlock and isinstance(known.get("content"), list):
            known["content"] = _known_blocks(known["content"], lost)
        out.append(known)
    return out


def _known_fields(data: dict[str, Any], cls: type[BaseModel], what: str, lost: list[str]) -> dict[str, Any]:
    unknown = [k for k in data if k not in cls.model_fields]
    if unknown:
        names = ", ".join(map(_quoted, unknown[:_NAMED]))
        more = f" and {len(unknown) - _NAMED} more" if len(unknown) > _NAMED else ""
        lost.append(f"ignored unknown field(s) {names}{more} of a {what}")
    return {k: v for k, v in data.items() if k in cls.model_fields}


_QUOTED = 80  # characters of a value a warning quotes
_NAMED = 5  # unknown fields a warning names


def _quoted(value: Any) -> str:
    """``repr(value)`` cut to `_QUOTED` characters: a warning quotes what a damaged line holds,
    never all of it (a line of a megabyte would be a megabyte of log)."""
    text = repr(value)
    return text if len(text) <= _QUOTED else f"{text[:_QUOTED]}..."
