"""Content blocks and messages: the provider-neutral transcript.

Blocks follow the Anthropic Messages shapes (the strictest of the wire
formats); the provider adapters map them to other formats. All models are
frozen: a message, once built, is never edited in place, so a transcript can be
shared with a request that is in flight.
"""

from __future__ import annotations

import dataclasses
from collections import deque
from collections.abc import AsyncIterator, Callable, Iterable, Iterator, Mapping
from typing import Annotated, Any, Literal, NoReturn, TypeVar

from pydantic import (
    BaseModel,
    ConfigDict,
    Field,
    SerializerFunctionWrapHandler,
    field_validator,
    model_serializer,
)
from pydantic_core import PydanticSerializationError, to_jsonable_python

__all__ = [
    "Block",
    "Message",
    "ProviderBlock",
    "RedactedThinkingBlock",
    "TextBlock",
    "ThinkingBlock",
    "ToolResultBlock",
    "ToolUseBlock",
]

_FROZEN = ConfigDict(frozen=True, extra="forbid")
_FIELD_SETS: dict[frozenset[str], set[str]] = {}


def _shared(names: Iterable[str]) -> set[str]:
    """One set object per distinct set of field names.

    Every pydantic instance carries the set of fields that were given; an empty
    set alone is 216 bytes, about a quarter of a short message. The models are
    frozen and pydantic copies the set before changing a copy's, so instances can
    share it.
    """
    key = frozenset(names)
    found = _FIELD_SETS.get(key)
    if found is None:
        found = _FIELD_SETS[key] = set(key)
    return found


class _NoMeta(dict[str, Any]):
    """The ``meta`` of a message built without one: empty, read-only, and shared.

    A message is frozen, so its ``meta`` is set when it is built (``meta=`` or
    ``model_copy(update={"meta": ...})``); sharing one empty mapping saves every
    message a dict of its own.
    """

    __slots__ = ()

    def _read_only(self, *args: Any, **kwargs: Any) -> NoReturn:
        raise TypeError("a message's meta is read-only: pass meta= when building it, or use model_copy(update=...)")

    __setitem__ = __delitem__ = update = setdefault = pop = popitem = clear = __ior__ = _read_only

    def __copy__(self) -> dict[str, Any]:
        return {}

    def __deepcopy__(self, memo: dict[int, Any]) -> dict[str, Any]:
        return {}

    def __reduce__(self) -> tuple[Any, ...]:
        return (dict, ())


NO_META: dict[str, Any] = _NoMeta()


class _Shared(BaseModel):
    """Base of the transcript models: validated instances share their fields set."""

    def model_post_init(self, context: Any, /) -> None:
        object.__setattr__(self, "__pydantic_fields_set__", _shared(self.__pydantic_fields_set__))
_M = TypeVar("_M", bound=BaseModel)


class TextBlock(_Shared):
    """Plain text."""

    model_config = _FROZEN
    type: Literal["text"] = "text"
    text: str


class _Signed(_Shared):
    """Base of the thinking blocks: a block whose ``origin`` is unknown (None) is dumped
    without it, as a version that did not know the field wrote it."""

    @model_serializer(mode="wrap")
    def _without_unknown_origin(self, handler: SerializerFunctionWrapHandler) -> Any:
        data = handler(self)
        if isinstance(data, dict) and data.get("origin", "") is None:
            del data["origin"]
        return data


class ThinkingBlock(_Signed):
    """Model reasoning (``thinking``). ``signature`` is opaque provider data that must be sent back
    unchanged; a block with an empty signature is incomplete and never sent.
    ``origin``: the server that made it and alone can check the signature
    (``"https://api.anthropic.com"``: the base URL's scheme, host, port and path), set by each
    provider on the blocks it makes; None: unknown."""

    model_config = _FROZEN
    type: Literal["thinking"] = "thinking"
    thinking: str
    signature: str = ""
    origin: str | None = None


class RedactedThinkingBlock(_Signed):
    """Encrypted reasoning, passed back to the provider unchanged. ``origin``: the server
    that made it, as for `ThinkingBlock`."""

    model_config = _FROZEN
    type: Literal["redacted_thinking"] = "redacted_thinking"
    data: str
    origin: str | None = None


class ProviderBlock(_Shared):
    """Content that a provider's server made and reads back itself: Anthropic's server tool
    calls and their results (``server_tool_use``, ``web_search_tool_result``, ...), which
    its servers ran. ``data`` is the block as the provider sent it, and is sent back
    unchanged to the provider named by ``provider``; requests to any other leave it out.
    It is no call for the host to run, and needs no result."""

    model_config = _FROZEN
    type: Literal["provider"] = "provider"
    provider: str
    data: dict[str, Any]


class ToolUseBlock(_Shared):
    """A tool call requested by the model.

    ``complete`` is False while (or if) the input JSON never finished streaming;
    such a block is shown in events but never kept in history. ``input_error``
    is set when the input arrived complete but was not a JSON object, or when a
    ``max_tokens`` or ``refusal`` stop cut it before its JSON was finished; the
    call then gets an error result without running.
    """

    model_config = _FROZEN
    type: Literal["tool_use"] = "tool_use"
    id: str
    name: str
    input: dict[str, Any] = Field(default_factory=dict)
    complete: bool = True
    input_error: str | None = None


class ToolResultBlock(_Shared):
    """The outcome of a tool call, matched to its `ToolUseBlock` by ``tool_use_id``."""

    model_config = _FROZEN
    type: Literal["tool_result"] = "tool_result"
    tool_use_id: str
    content: str | list[TextBlock]
    is_error: bool = False

    @property
    def text(self) -> str:
        """The content as one string."""
        if isinstance(self.content, str):
            return self.content
        return "".join(b.text for b in self.content)


Block = Annotated[
    TextBlock | ThinkingBlock | RedactedThinkingBlock | ToolUseBlock | ToolResultBlock | ProviderBlock,
    Field(discriminator="type"),
]


class Message(_Shared):
    """One transcript entry.

    ``partial``: the model's output was cut by an abort mid-stream.
    ``synthetic``: written by the library (a synthesized result, a notice, an
    interjection envelope, a policy reminder), not by the user or the model.
    ``kind``: for synthetic messages, what wrote it ("tool_results",
    "interrupt_notice", "interjection", "nudge", ...).
    ``meta``: free-form host data, persisted by session stores and never sent.
    """

    model_config = _FROZEN
    role: Literal["user", "assistant"]
    content: list[Block]
    partial: bool = False
    synthetic: bool = False
    kind: str | None = None
    meta: dict[str, Any] = Field(default_factory=lambda: NO_META)

    @field_validator("content", mode="before")
    @classmethod
    def _text_shorthand(cls, value: Any) -> Any:
        if isinstance(value, str):
            return [{"type": "text", "text": value}]
        return value

    @classmethod
    def user(cls, text: str, **fields: Any) -> Message:
        """A user message holding one text block of ``text``; ``fields`` are its other fields
        (``synthetic``, ``kind``, ``meta``...), validated as by the constructor."""
        return _one_text(cls, "user", text, fields)

    @classmethod
    def assistant(cls, text: str, **fields: Any) -> Message:
        """An assistant message holding one text block of ``text``; ``fields`` as for `user`."""
        return _one_text(cls, "assistant", text, fields)

    @property
    def text(self) -> str:
        """The concatenated text blocks."""
        # By the discriminator rather than isinstance: an isinstance that fails against a
        # pydantic class runs its metaclass's __instancecheck__ in Python (about 10x slower).
        return "".join(b.text for b in self.content if b.type == "text")

    @property
    def tool_uses(self) -> list[ToolUseBlock]:
        """The tool_use blocks, in order."""
        return [b for b in self.content if b.type == "tool_use"]

    @property
    def tool_results(self) -> list[ToolResultBlock]:
        """The tool_result blocks, in order."""
        return [b for b in self.content if b.type == "tool_result"]


# -- trusted fast construction ----------------------------------------------------------
# The loop builds a few blocks and messages per iteration from values it produced
# itself. Validating them again costs more than the rest of the iteration, so the
# loop uses these constructors, which fill a model exactly as validation would
# (every field set, defaults included) without running the validator. Public
# construction (hosts, providers, sessions) always validates.


# BaseModel's four slots, set through their descriptors: a C call each, where
# object.__setattr__ would look every name up again.
_new = object.__new__
_set_dict = BaseModel.__dict__["__dict__"].__set__
_set_fields_set = BaseModel.__dict__["__pydantic_fields_set__"].__set__
_set_extra = BaseModel.__dict__["__pydantic_extra__"].__set__
_set_private = BaseModel.__dict__["__pydantic_private__"].__set__


def _trusted(cls: type[_M], values: dict[str, Any], fields_set: set[str]) -> _M:
    obj = _new(cls)
    _set_dict(obj, values)
    _set_fields_set(obj, fields_set)
    _set_extra(obj, None)
    _set_private(obj, None)
    return obj


_TEXT = _shared(("text",))
_THINKING = _shared(("thinking", "signature"))
_THINKING_ORIGIN = _shared(("thinking", "signature", "origin"))
_USE = _shared(("id", "name", "input"))
_USE_PARTIAL = _shared(("id", "name", "input", "complete"))
_RESULT = _shared(("tool_use_id", "content"))
_RESULT_ERROR = _shared(("tool_use_id", "content", "is_error"))


def text_block(text: str) -> TextBlock:
    return _trusted(TextBlock, {"type": "text", "text": text}, _TEXT)


def thinking_block(thinking: str, signature: str, origin: str | None = None) -> ThinkingBlock:
    values = {"type": "thinking", "thinking": thinking, "signature": signature, "origin": origin}
    return _trusted(ThinkingBlock, values, _THINKING if origin is None else _THINKING_ORIGIN)


def tool_use_block(id: str, name: str, input: dict[str, Any], *, complete: bool = True) -> ToolUseBlock:
    # `_trusted`, written out: one is made for every call a model makes, so one frame less each.
    block: ToolUseBlock = _new(ToolUseBlock)
    _set_dict(block, {"type": "tool_use", "id": id, "name": name, "input": input, "complete": complete, "input_error": None})
    _set_fields_set(block, _USE if complete else _USE_PARTIAL)
    _set_extra(block, None)
    _set_private(block, None)
    return block


def tool_result_block(tool_use_id: str, content: str, *, is_error: bool = False) -> ToolResultBlock:
    # `_trusted`, written out: one is made for every call a model makes, so one frame less each.
    block: ToolResultBlock = _new(ToolResultBlock)
    _set_dict(block, {"type": "tool_result", "tool_use_id": tool_use_id, "content": content, "is_error": is_error})
    _set_fields_set(block, _RESULT_ERROR if is_error else _RESULT)
    _set_extra(block, None)
    _set_private(block, None)
    return block


# The fields set of a trusted message, by (content given, partial, synthetic, kind given,
# meta given): looked up, not built, on the loop's hot path.
_MESSAGE_FIELDS = {
    (c, p, s, k, m): _shared(
        ("role",) + ("content",) * c + ("partial",) * p + ("synthetic",) * s + ("kind",) * k + ("meta",) * m
    )
    for c in (False, True)
    for p in (False, True)
    for s in (False, True)
    for k in (False, True)
    for m in (False, True)
}


def message(
    role: Literal["user", "assistant"],
    content: list[Block],
    *,
    partial: bool = False,
    synthetic: bool = False,
    kind: str | None = None,
) -> Message:
    # `_trusted`, written out: two are made in every iteration (a response, its results), so one frame less each.
    made: Message = _new(Message)
    _set_dict(made, {"role": role, "content": content, "partial": partial, "synthetic": synthetic, "kind": kind, "meta": NO_META})
    _set_fields_set(made, _MESSAGE_FIELDS[bool(content), partial, synthetic, bool(kind), False])
    _set_extra(made, None)
    _set_private(made, None)
    return made


def _one_text(cls: type[Message], role: Literal["user", "assistant"], text: str, fields: dict[str, Any]) -> Message:
    """`Message.user` / `Message.assistant`: built as validation would, without running it
    when every value already has its exact type (the library's own messages, most hosts')."""
    if cls is Message and type(text) is str and fields.keys() <= _QUICK_FIELDS:
        partial = fields.get("partial", False)
        synthetic = fields.get("synthetic", False)
        kind = fields.get("kind")
        meta = fields.get("meta", NO_META)
        if (
            type(partial) is bool
            and type(synthetic) is bool
            and (kind is None or type(kind) is str)
            and (meta is NO_META or (type(meta) is dict and all(type(key) is str for key in meta)))
        ):
            values = {
                "role": role,
                "content": [text_block(text)],
                "partial": partial,
                "synthetic": synthetic,
                "kind": kind,
                "meta": meta if meta is NO_META else dict(meta),  # a copy, as validation makes
            }
            given = (True, "partial" in fields, "synthetic" in fields, "kind" in fields, "meta" in fields)
            return _trusted(Message, values, _MESSAGE_FIELDS[given])
    return cls(role=role, content=[TextBlock(text=text)], **fields)


_QUICK_FIELDS = frozenset({"partial", "synthetic", "kind", "meta"})


def jsonable(value: Any, fallback: Callable[[Any], str]) -> Any:
    """``value`` as JSON-ready data, as pydantic dumps it (models, dataclasses, datetimes,
    enums...); what it cannot dump becomes ``fallback(value)``, part by part inside a
    container that fails as a whole (bytes that are not UTF-8, nesting too deep): the items
    of a mapping or a sequence, the fields of a model or a dataclass. An iterator is never
    run (pydantic would drain it, forever for an endless one), also inside a container: it
    is ``fallback``'s too. So is a container met again inside itself.
    """
    return _jsonable(value, fallback, set())


def holds_iterator(value: object) -> bool:
    """Whether ``value`` is, or holds where pydantic's dump would reach it, an iterator:
    a dump would drain it (forever, for an endless one)."""
    return _holds_iterator(value, set())


def _jsonable(value: Any, fallback: Callable[[Any], str], path: set[int]) -> Any:
    """`jsonable`; ``path``: the ids of the containers being converted, from the outermost in."""
    kind = _kind(type(value))
    if kind == _ITERATOR:
        return fallback(value)
    if not _holds_iterator(value, set()):
        try:
            return to_jsonable_python(value, fallback=fallback)
        except (PydanticSerializationError, ValueError):
            pass
    if kind == _ATOM or id(value) in path:
        return fallback(value)
    if kind == _FIELDS:
        names = type(value).model_fields if isinstance(value, BaseModel) else [f.name for f in dataclasses.fields(value)]
        parts: Any = {name: getattr(value, name) for name in names}
        parts.update(getattr(value, "__pydantic_extra__", None) or {})
    else:
        parts = value
    path.add(id(value))
    try:
        if isinstance(parts, Mapping):
            return {str(k): _jsonable(v, fallback, path) for k, v in parts.items()}
        return [_jsonable(v, fallback, path) for v in parts]
    finally:
        path.discard(id(value))


# What a value is to pydantic's dump, by its type: an atom (nothing inside it is dumped), an
# iterator (which it would drain), a container of items, or a model or dataclass of fields.
_ATOM, _ITERATOR, _ITEMS, _FIELDS = range(4)
_KINDS: dict[type, int] = dict.fromkeys((str, int, float, bool, bytes, type(None)), _ATOM)


def _kind(cls: type) -> int:
    kind = _KINDS.get(cls)
    if kind is None:
        if issubclass(cls, Iterator | AsyncIterator):
            kind = _ITERATOR
        elif issubclass(cls, Mapping | list | tuple | set | frozenset | deque):
            kind = _ITEMS
        elif issubclass(cls, BaseModel) or dataclasses.is_dataclass(cls):
            kind = _FIELDS
        else:
            kind = _ATOM
        if len(_KINDS) < 1000:  # classes made on the fly (create_model) are not all kept
            _KINDS[cls] = kind
    return kind


def _holds_iterator(value: Any, seen: set[int]) -> bool:
    """Whether ``value`` is an iterator or holds one in what pydantic walks into (``seen``:
    the containers looked into already)."""
    kind = _kind(type(value))
    if kind == _ATOM:
        return False
    if kind == _ITERATOR:
        return True
    if id(value) in seen:
        return False
    seen.add(id(value))
    if kind == _FIELDS:
        # A model's fields are in its __dict__ (and its extra fields apart); a dataclass's too,
        # unless it has slots.
        extra = getattr(value, "__pydantic_extra__", None)
        if hasattr(value, "__dict__"):
            items: Iterable[Any] = [*value.__dict__.values(), *(extra or {}).values()]
        else:
            items = [getattr(value, f.name) for f in dataclasses.fields(value)]
    elif isinstance(value, Mapping):
        items = (x for item in value.items() for x in item)  # keys and values
    else:
        items = value
    kinds = _KINDS
    # The atoms' test inline: a list of a million numbers costs no call per number.
    return any(kinds.get(type(v)) != _ATOM and _holds_iterator(v, seen) for v in items)
