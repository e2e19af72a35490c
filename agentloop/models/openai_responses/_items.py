"""The output items of a Responses stream: which one an event is about, and what it streamed.

`Item` is what the mapper knows of one output item (its block, its ids, the text each of
its parts streamed); `ItemIndex` finds the item an event names, by ``output_index`` or by
id, through the servers that number them oddly; `final_rest` and `canonical_json` say what a
final copy of a text or of a call's arguments adds to what streamed, or that the two
contradict each other.
"""

from __future__ import annotations

import json
from typing import Any

from ..._errors import StreamProtocolError
from .._driver import excerpt, loads


class Item:
    """One output item of the stream: its block, its kind and ids, and what it has streamed."""

    __slots__ = ("before", "block", "chunks", "done", "done_parts", "id", "kind", "part", "raw", "started",
                 "streamed")  # fmt: skip

    def __init__(self, block: int, kind: str) -> None:
        self.block = block
        self.kind = kind  # the output item's type: message, function_call, reasoning, a hosted tool's
        self.id: str | None = None  # the item's id (a function call without one: its call_id)
        self.started = False  # a function call: its StreamToolUseStart was emitted
        self.raw = False  # a reasoning item: its thinking is its raw reasoning text, not its summary
        self.done = False  # its output_item.done came: its block is stopped
        self.streamed = False  # deltas (text, thinking or arguments) were emitted
        # The text emitted so far, by part (a message's content part, a reasoning summary
        # part; a function call has one): ``chunks`` for the part now streaming, ``part``,
        # and the text of the parts before it in ``done_parts``.
        self.part = -1
        self.chunks: list[str] = []
        self.done_parts: dict[Any, str] = {}
        # The item, done already, that this one continues (text or thinking that came after its
        # output_item.done): its final copies are of the two streamed texts, one after the other.
        self.before: Item | None = None

    def text_of(self, part: Any) -> str:
        """The text ``part`` has streamed: in the items this one continues, then in this one."""
        texts = []
        item: Item | None = self
        while item is not None:  # (a loop: a server may close and continue an item many times)
            texts.append("".join(item.chunks) if part == item.part else item.done_parts.get(part, ""))
            item = item.before
        return "".join(reversed(texts))

    def switch(self, part: Any) -> None:
        """Make ``part`` the part now streaming."""
        if self.chunks:
            self.done_parts[self.part] = "".join(self.chunks)
        before = self.done_parts.pop(part, "")
        self.chunks = [before] if before else []
        self.part = part


class ItemIndex:
    """Which output item each event of a Responses stream is about (the base of the mapper).

    An event names its item by ``output_index``, or, from a server that sends none
    (llama.cpp), by ``item_id``; the item events (``output_item.added``/``.done``) carry the
    item's id too. An item is known by every key it was seen with. Two items at one
    ``output_index`` (Ollama gives the first function call after a message the message's
    index; LiteLLM puts a reasoning item and the message after it both at 0) are told apart
    by their ids. Each new item gets the next block index.
    """

    __slots__ = ("_blocks", "_items")

    def __init__(self) -> None:
        self._items: dict[Any, Item] = {}  # by output_index and by item id (None: no key at all)
        self._blocks = 0

    def _item(self, obj: dict[str, Any], kind: str) -> Item:
        """The item of type ``kind`` that a delta or final-copy event is about (new if unseen)."""
        key = obj.get("output_index")
        if key is None:  # llama.cpp's emulation sends no output_index: the item's id names it
            key = obj.get("item_id")
            if key is not None and type(key) is not str:
                raise _malformed(obj, "item_id", key)
        elif type(key) is not int:
            raise _malformed(obj, "output_index", key)
        item = self._items.get(key)
        if item is None:
            item = self._items[key] = self._named(obj, kind)
        elif item.kind != kind:
            item = self._another(obj, key, item, kind)
        return item

    def _named(self, obj: dict[str, Any], kind: str) -> Item:
        """The item an event with an unseen key names by ``item_id``, else a new one. (vLLM's
        older gpt-oss streaming sent an item's final copies with the next item's index.)"""
        ident = obj.get("item_id")
        item = self._items.get(ident) if type(ident) is str else None
        return item if item is not None and item.kind == kind else self._new(kind, ident)

    def _new(self, kind: str, ident: Any = None) -> Item:
        item = Item(self._blocks, kind)
        self._blocks += 1
        if ident and type(ident) is str:
            item.id = ident
            self._items.setdefault(ident, item)
        return item

    def _reopen(self, done: Item) -> Item:
        """A new item that continues ``done`` (its kind, its ids, in a block of its own), for text
        or thinking that came after its ``output_item.done``: from now on, the item every key of
        ``done`` names."""
        item = self._new(done.kind)
        item.id, item.raw, item.before = done.id, done.raw, done
        for key, found in list(self._items.items()):
            if found is done:
                self._items[key] = item
        return item

    def _another(self, obj: dict[str, Any], key: Any, seen: Item, kind: str) -> Item:
        """The item of type ``kind`` an event is about, when ``key`` names an item of another
        type: another item at the same ``output_index`` if the event's ``item_id`` says so (or
        the next item, from a server that names none), else a retryable `StreamProtocolError`
        (mapped, the event would put text into a function call's input, or thinking into the
        answer)."""
        if key is None:  # no output_index, no item_id: items come one after the other
            fresh = self._items[None] = self._new(kind)
            return fresh
        ident = obj.get("item_id")
        if not ident or type(ident) is not str or ident == seen.id:
            raise StreamProtocolError(
                f"openai responses stream: a {obj.get('type')} event for the {seen.kind} item at "
                f"{excerpt(repr(key))}: a {kind} event cannot go there",
                retryable=True,
            )
        item = self._items.get(ident)
        if item is None or item.kind != kind:
            item = self._items[ident] = self._new(kind)
            item.id = ident
        self._items[key] = item
        return item

    def known(self, ids: list[str]) -> Item | None:
        """The item already known by one of ``ids`` (an output item's `item_ids`), if any. A
        function call is found by its ``call_id`` only where that item has no other id: two
        calls of one response may share a ``call_id`` (a server that numbers them per
        response, ``call_0`` in each), never an item id."""
        for ident in ids:
            found = self._items.get(ident)
            if found is not None and (found.id is None or found.id in ids):
                return found
        return None

    def _output_item(self, obj: dict[str, Any], raw: dict[str, Any], added: bool = False) -> Item:
        """The item of an ``output_item.added``/``.done`` event, found by its id (a function
        call without one, from llama.cpp, by its ``call_id``, which its argument deltas name as
        their ``item_id``), else by its ``output_index`` unless another item is there, and then
        known by both. An ``added`` event does not take an item whose ``output_item.done`` came
        from its ``output_index`` alone: an item that nothing names after one that is done is a new one."""
        kind = raw["type"]
        ids = item_ids(raw)
        index = obj.get("output_index")
        if index is not None and type(index) is not int:
            raise _malformed(obj, "output_index", index)
        item = self.known(ids)
        if item is None:
            seen = self._items.get(index)  # (None: the item that nothing named)
            if (seen is not None and seen.kind == kind and not (added and seen.done)
                    and not (ids and seen.id and seen.id not in ids)):
                item = seen
        if item is None:
            item = self._new(kind)
        elif item.kind != kind:
            raise StreamProtocolError(
                f"openai responses stream: the output item {excerpt(ids[0])!r} is a {kind} here "
                f"and a {item.kind} before",
                retryable=True,
            )
        if index is not None or not ids:
            self._items[index] = item
        for i in ids:
            self._items.setdefault(i, item)
        item.id = item.id or (ids[0] if ids else None)
        return item


def _malformed(obj: dict[str, Any], field: str, value: Any) -> StreamProtocolError:
    wanted = "an int" if field == "output_index" else "a str"
    return StreamProtocolError(
        f"openai responses stream: malformed {obj.get('type')} event: its {field} is "
        f"{type(value).__name__}, not {wanted}: {excerpt(repr(value))}",
        retryable=True,
    )


def item_ids(raw: dict[str, Any]) -> list[str]:
    """The ids an output item is known by: its ``id``, and a function call's ``call_id``."""
    ids = [i for i in (raw.get("id"), raw.get("call_id")) if i]
    for i in ids:
        if type(i) is not str:
            raise StreamProtocolError(
                f"openai responses stream: malformed {raw.get('type')} item: its id is {type(i).__name__}, "
                f"not a str: {excerpt(repr(i))}",
                retryable=True,
            )
    return ids


def final_rest(streamed: str, final: str) -> str | None:
    """What ``final`` adds to ``streamed``: "" when it adds nothing (equal, shorter, or
    different only in surrounding whitespace), None when the two contradict each other.

    A proxy that takes its final copy early, or trims it, sends one shorter than the deltas;
    the streamed text stands then. Deltas that split a character outside the BMP into its two
    UTF-16 halves streamed two U+FFFD (`loads` scrubs each half): no contradiction either."""
    if final.startswith(streamed):
        return final[len(streamed) :]
    if streamed.startswith(final) or streamed.strip() == final.strip():
        return ""
    if "\ufffd" not in streamed:
        return None
    got, want = _halves(streamed), _halves(final)
    if got.startswith(want):
        return ""
    if not want.startswith(got):
        return None
    size = 0
    for i, ch in enumerate(final):  # where the streamed text ends in ``final``
        if size == len(got):
            return final[i:]
        size += 2 if ch > "\uffff" else 1
    return None  # it ends between the halves of a character


def _halves(text: str) -> str:
    """``text`` with each character outside the BMP as two U+FFFD."""
    return "".join("\ufffd\ufffd" if ch > "\uffff" else ch for ch in text)


def canonical_json(text: str) -> str | None:
    """``text`` as JSON written one way (sorted keys, no spaces), or None if it is not JSON."""
    try:
        return json.dumps(loads(text), sort_keys=True, separators=(",", ":"))
    except (ValueError, RecursionError):  # RecursionError: nested about as deep as json can read
        return None
