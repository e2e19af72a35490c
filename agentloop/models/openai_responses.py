"""OpenAI Responses API: request building, event mapping and `OpenAIResponsesModel`.

Wire reference: WIRE.md §3. Reasoning items round-trip through
`ThinkingBlock.signature`, which holds the JSON ``{"id", "summary", "content"?,
"encrypted_content"?}`` of the item; thinking blocks whose signature is not
such JSON (from another provider) are not sent.

Doom-loop frames (``response.doom_loop_check``, SPEC §6) become
`StreamSignals` and never reach normal event parsing. Unknown event types are
ignored. Terminators: ``response.completed``, ``response.incomplete``, whose
``output`` is authoritative (``response.failed`` and ``error`` raise
`ProviderStreamError`, a failed response once its output and usage are out).
"""

from __future__ import annotations

import json
from collections.abc import AsyncIterator, Sequence
from typing import Any

import httpx

from .._abort import AbortSignal
from .._errors import PromptTooLongError, ProviderError, ProviderStreamError, StreamProtocolError
from .._messages import TextBlock, ThinkingBlock, ToolResultBlock, ToolUseBlock
from .._model import (
    ModelRequest,
    StreamBlockStop,
    StreamEnd,
    StreamEvent,
    StreamSignals,
    StreamSignature,
    StreamText,
    StreamThinking,
    StreamToolInput,
    StreamToolUseStart,
    StreamUsage,
    Usage,
)
from .._tools import safe_name
from ._driver import (
    Prepared,
    count_tokens,
    dumps_input,
    excerpt,
    loads,
    result_text,
    run_stream,
    turns,
    wire_id,
)
from ._http import (
    RETRYABLE_STATUSES,
    HTTPModel,
    check_headers,
    openai_connection,
    openai_headers,
    prompt_too_long,
)
from ._sse import ServerSentEvent

__all__ = ["OpenAIResponsesModel", "build_request"]

_DOOM = "response.doom_loop_check"
_RETRYABLE_CODES = frozenset({"rate_limit_exceeded", "too_many_requests", "server_error", "internal_error",
                              "server_is_overloaded", "slow_down", "vector_store_timeout",
                              "internal_server_error", "InternalServerError", "ServiceUnavailableError",
                              "RateLimitError"})  # fmt: skip
_INCOMPLETE = {"max_output_tokens": "max_tokens", "content_filter": "refusal"}


# -- request ------------------------------------------------------------------


def build_request(request: ModelRequest, *, model: str, stored: bool = True) -> dict[str, Any]:
    """The JSON body (without ``stream`` and options) of a Responses request.

    ``stored=False`` (the request says ``store: false``): a reasoning item is sent only
    with its encrypted content, since the server keeps nothing to look its id up by (it
    would answer every request with "Item with id 'rs_...' not found").
    """
    items: list[dict[str, Any]] = []
    for role, blocks in turns(request.messages):
        made = (_item(role, b, stored) for b in blocks)
        turn = [item for item in made if item is not None]
        items.extend(_followed(turn) if role == "assistant" else turn)
    body: dict[str, Any] = {"model": model, "input": items}
    if request.system:
        body["instructions"] = request.system
    if request.tools:
        body["tools"] = [
            {
                "type": "function",
                "name": t.name,
                "description": t.description,
                "parameters": dict(t.input_schema),
                "strict": False,
            }
            for t in request.tools
        ]
    choice = request.tool_choice
    if choice is not None:
        if choice in ("auto", "none"):
            body["tool_choice"] = choice
        elif choice == "any":
            body["tool_choice"] = "required"
        else:
            body["tool_choice"] = {"type": "function", "name": choice}
    if request.max_tokens:
        body["max_output_tokens"] = request.max_tokens
    return body


def _followed(turn: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """An assistant turn's items without the reasoning items not directly followed by a
    message or function call.

    The API refuses a reasoning item "without its required following item". One can lose
    it: a cut stream leaves it last in its turn, and a hosted tool item that followed it
    (``web_search_call`` and the like) is not kept in the transcript, so it is followed by
    the next reasoning item instead. The transcript keeps such items; they are not sent.
    """
    if not any(item["type"] == "reasoning" for item in turn):
        return turn
    return [
        item
        for item, after in zip(turn, [*turn[1:], None], strict=True)
        if item["type"] != "reasoning" or (after is not None and after["type"] in ("message", "function_call"))
    ]


def _item(role: str, block: Any, stored: bool) -> dict[str, Any] | None:
    if isinstance(block, TextBlock):
        return {"type": "message", "role": role, "content": block.text}
    if isinstance(block, ToolResultBlock):
        return {
            "type": "function_call_output",
            "call_id": wire_id(block.tool_use_id, max_len=64),
            "output": result_text(block, mark_error=True),
        }
    if isinstance(block, ToolUseBlock):
        return {"type": "function_call", "call_id": wire_id(block.id, max_len=64), "name": safe_name(block.name),
                "arguments": dumps_input(block.input)}  # fmt: skip
    if isinstance(block, ThinkingBlock):
        return _reasoning_item(block, stored)
    return None  # redacted thinking (Anthropic only)


def _reasoning_item(block: ThinkingBlock, stored: bool) -> dict[str, Any] | None:
    try:
        saved = json.loads(block.signature)
    except ValueError:
        return None
    if not isinstance(saved, dict) or not isinstance(saved.get("id"), str):
        return None
    summary = saved.get("summary")
    if summary is None:
        summary = [{"type": "summary_text", "text": block.thinking}] if block.thinking else []
    item: dict[str, Any] = {"type": "reasoning", "id": saved["id"], "summary": summary}
    if saved.get("content"):
        item["content"] = saved["content"]
    if saved.get("encrypted_content"):
        item["encrypted_content"] = saved["encrypted_content"]
    elif not stored:
        return None  # nothing to look the id up by
    return item


# -- stream -------------------------------------------------------------------


class _Item:
    __slots__ = ("block", "chunks", "done", "done_parts", "id", "kind", "part", "raw", "started", "streamed")

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

    def switch(self, part: Any) -> None:
        """Make ``part`` the part now streaming."""
        if self.chunks:
            self.done_parts[self.part] = "".join(self.chunks)
        before = self.done_parts.pop(part, "")
        self.chunks = [before] if before else []
        self.part = part


class ResponsesMapper:
    """Maps Responses stream events to `StreamEvent`s, one block per output item.

    An event names its item by ``output_index``, or, from a server that sends none
    (llama.cpp), by ``item_id``; the item events (``output_item.added``/``.done``) carry the
    item's id too. An item is known by every key it was seen with. Two items at one
    ``output_index`` (Ollama gives the first function call after a message the message's
    index; LiteLLM puts a reasoning item and the message after it both at 0) are told apart
    by their ids.
    """

    __slots__ = ("_blocks", "_calls", "_items", "_refusal", "done", "failure", "request_id", "response_id",
                 "terminator")  # fmt: skip

    def __init__(self, request_id: str | None = None) -> None:
        self.request_id = request_id
        self.done = False
        self.failure: ProviderError | None = None  # raised once the events of its response are out
        self.terminator = "response.completed"
        self.response_id: str | None = None
        self._items: dict[Any, _Item] = {}  # by output_index and by item id (None: no key at all)
        self._blocks = 0
        self._calls = 0
        self._refusal = False

    def handle(self, sse: ServerSentEvent) -> Sequence[StreamEvent] | None:
        """Map one SSE event. Raises `StreamProtocolError` for malformed data and
        `ProviderStreamError` for ``error`` and ``response.failed``."""
        try:
            obj = loads(sse.data)
        except ValueError as exc:
            if sse.event == "error":  # the server's error, in words: its message (as in Chat)
                err = {"message": sse.data}
                raise self._error({"error": err}, err) from None
            raise StreamProtocolError(
                f"openai responses stream: malformed JSON in {sse.event or 'data'} event: {exc}; "
                f"data: {excerpt(sse.data)!r}",
                retryable=True,
            ) from None
        if not isinstance(obj, dict):
            raise StreamProtocolError(
                f"openai responses stream: expected a JSON object, got {excerpt(sse.data)!r}"
            )
        kind = obj.get("type") or sse.event
        if kind == _DOOM or sse.event == _DOOM:  # absorbed here, never parsed as output
            return (StreamSignals(tuple(str(s) for s in obj.get("signals") or ())),)
        if kind == "error" or sse.event == "error":
            nested = obj.get("error")
            raise self._error(obj, nested if isinstance(nested, dict) else obj)
        try:
            return self._event(kind, obj)
        except (KeyError, TypeError, AttributeError) as exc:
            raise StreamProtocolError(
                f"openai responses stream: malformed {kind} event ({type(exc).__name__}: {exc})",
                retryable=True,
            ) from None

    def _event(self, kind: str | None, obj: dict[str, Any]) -> Sequence[StreamEvent] | None:
        if kind == "response.output_text.delta" or kind == "response.refusal.delta":
            self._refusal |= kind == "response.refusal.delta"
            item = self._item(obj, "message")
            delta = obj["delta"]
            part = obj.get("content_index", 0)
            if part != item.part:
                item.switch(part)
            item.streamed = True
            item.chunks.append(delta)
            return (StreamText(item.block, delta),)
        if kind == "response.function_call_arguments.delta":
            item = self._item(obj, "function_call")
            delta = obj["delta"]
            if not item.started or not delta:
                return None  # arguments of a call we never saw start: taken from .done
            item.streamed = True
            item.chunks.append(delta)
            return (StreamToolInput(item.block, delta),)
        if kind == "response.function_call_arguments.done":
            item = self._item(obj, "function_call")
            if not item.started:
                return None  # output_item.done starts the call, with these arguments
            return self._settle(item, obj.get("arguments"))
        if kind == "response.reasoning_summary_text.delta" or kind == "response.reasoning_text.delta":
            return self._thinking(obj, kind == "response.reasoning_text.delta")
        if kind in _FINAL_TEXT:
            return self._final_text(kind, obj)
        if kind == "response.output_item.added":
            return self._item_added(obj)
        if kind == "response.output_item.done":
            return self._item_done(obj)
        if kind in ("response.created", "response.in_progress", "response.queued"):
            self.response_id = (obj.get("response") or {}).get("id") or self.response_id
            return None
        if kind == "response.completed" or kind == "response.incomplete":
            return self._end(obj["response"], kind == "response.incomplete")
        if kind == "response.failed":
            return self._failed(obj)
        nested = obj.get("error")
        if nested:  # a proxy's error in the Chat Completions shape, {"error": {...}} (LiteLLM)
            raise self._error(obj, nested if isinstance(nested, dict) else {"message": str(nested)})
        return None  # unknown and uninteresting events

    # -- items

    def _item(self, obj: dict[str, Any], kind: str) -> _Item:
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

    def _named(self, obj: dict[str, Any], kind: str) -> _Item:
        """The item an event with an unseen key names by ``item_id``, else a new one. (vLLM's
        older gpt-oss streaming sent an item's final copies with the next item's index.)"""
        ident = obj.get("item_id")
        item = self._items.get(ident) if type(ident) is str else None
        return item if item is not None and item.kind == kind else self._new(kind, ident)

    def _new(self, kind: str, ident: Any = None) -> _Item:
        item = _Item(self._blocks, kind)
        self._blocks += 1
        if ident and type(ident) is str:
            item.id = ident
            self._items.setdefault(ident, item)
        return item

    def _another(self, obj: dict[str, Any], key: Any, seen: _Item, kind: str) -> _Item:
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

    def _output_item(self, obj: dict[str, Any], raw: dict[str, Any]) -> _Item:
        """The item of an ``output_item.added``/``.done`` event, found by its id (a function
        call without one, from llama.cpp, by its ``call_id``, which its argument deltas name as
        their ``item_id``), else by its ``output_index`` unless another item is there, and then
        known by both."""
        kind = raw["type"]
        ids = _ids(raw)
        index = obj.get("output_index")
        if index is not None and type(index) is not int:
            raise _malformed(obj, "output_index", index)
        item = next((found for i in ids if (found := self._items.get(i)) is not None), None)
        if item is None:
            seen = self._items.get(index)  # (None: the item that nothing named)
            if seen is not None and seen.kind == kind and not (ids and seen.id and seen.id not in ids):
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

    # -- text, thinking and arguments

    def _thinking(self, obj: dict[str, Any], raw: bool) -> Sequence[StreamEvent] | None:
        item = self._item(obj, "reasoning")
        if raw:
            item.raw = True  # its summary is not what streamed: not compared with it
        text = obj["delta"]
        if not text:
            return None  # an empty part adds nothing, not even a separator
        part = obj.get("content_index" if raw else "summary_index", 0)
        if part != item.part:
            item.switch(part)
        item.chunks.append(text)
        if item.streamed and len(item.chunks) == 1:
            text = "\n\n" + text  # a new summary part
        item.streamed = True
        return (StreamThinking(item.block, text),)

    def _final_text(self, kind: str, obj: dict[str, Any]) -> Sequence[StreamEvent] | None:
        """A final copy of one part's text, from its ``.done`` event (see `_settle_text`)."""
        if kind == "response.reasoning_summary_text.done" or kind == "response.reasoning_summary_part.done":
            item = self._item(obj, "reasoning")
            if item.raw:
                return None  # (raw reasoning text, which the summary does not repeat)
            final = obj.get("text") if kind == "response.reasoning_summary_text.done" else _part(obj).get("text")
            return self._settle_text(item, obj.get("summary_index", 0), final)
        raw = kind == "response.reasoning_text.done"
        if raw or (kind == "response.content_part.done" and _part(obj).get("type") == "reasoning_text"):
            # The raw reasoning's final copy (vLLM closes it as a content part too).
            final = obj.get("text") if raw else _part(obj).get("text")
            if not final:
                return None  # (LiteLLM puts a reasoning part without text on the message)
            item = self._item(obj, "reasoning")
            if item.streamed and not item.raw:
                return None  # its summary streamed: that is its thinking
            item.raw = True
            return self._settle_text(item, obj.get("content_index", 0), final)
        item = self._item(obj, "message")
        part = obj.get("content_index", 0)
        if kind == "response.content_part.done":
            return self._settle_text(item, part, self._part_text(_part(obj)))
        if kind == "response.refusal.done":
            self._refusal |= bool(obj.get("refusal"))
            return self._settle_text(item, part, obj.get("refusal"))
        return self._settle_text(item, part, obj.get("text"))

    def _part_text(self, part: dict[str, Any]) -> Any:
        """The text of a message's content part: its ``text``, or for a ``refusal`` part
        its ``refusal`` (which makes the response a refusal)."""
        if part.get("type") == "refusal" or ("text" not in part and "refusal" in part):
            refusal = part.get("refusal")
            self._refusal |= bool(refusal)
            return refusal
        return part.get("text")

    def _settle_text(self, item: _Item, part: Any, final: Any) -> list[StreamEvent]:
        """A part's final text (a message's ``output_text`` or ``refusal``, a reasoning summary
        part), from its ``.done`` events or ``output_item.done``; authoritative, as for a
        function call's arguments (`_settle`): what the deltas left out is emitted once (all
        of it when none came). A final copy that is absent or empty, shorter than what
        streamed, or the same but for surrounding whitespace, leaves the streamed text; one
        that contradicts it raises `StreamProtocolError` (retryable)."""
        if not final:
            return []
        if type(final) is not str:
            raise StreamProtocolError(
                f"openai responses stream: malformed event: a final text is {type(final).__name__}, "
                f"not a str: {excerpt(repr(final))}",
                retryable=True,
            )
        if part == item.part:
            streamed = "".join(item.chunks)
            item.chunks = [streamed] if streamed else []
        else:
            streamed = item.done_parts.get(part, "")
        rest = _rest(streamed, final)
        if rest is None:
            raise StreamProtocolError(
                "openai responses stream: a streamed text differs from its final text "
                f"(streamed {excerpt(streamed)!r}, final {excerpt(final)!r})",
                retryable=True,
            )
        if not rest:
            return []
        if part != item.part:
            if item.part != -1 and not part > item.part:
                raise StreamProtocolError(
                    "openai responses stream: the final text of a part completes it after a later "
                    f"part streamed; it cannot be put in its place (missing {excerpt(rest)!r})",
                    retryable=True,
                )
            item.switch(part)
        text = rest
        if item.kind == "reasoning" and item.streamed and not streamed:
            text = "\n\n" + rest  # a new summary part, as streamed ones are
        item.chunks.append(rest)
        item.streamed = True
        return [StreamText(item.block, text) if item.kind == "message" else StreamThinking(item.block, text)]

    def _start_call(self, item: _Item, raw: dict[str, Any]) -> list[StreamEvent]:
        item.started = True
        self._calls += 1
        out: list[StreamEvent] = [
            StreamToolUseStart(item.block, raw.get("call_id") or raw["id"], raw["name"])
        ]
        if raw.get("arguments"):
            item.streamed = True
            item.chunks.append(raw["arguments"])
            out.append(StreamToolInput(item.block, raw["arguments"]))
        return out

    def _settle(self, item: _Item, final: Any) -> list[StreamEvent]:
        """A started call's final arguments (``function_call_arguments.done``, or the item in
        ``output_item.done``), which are authoritative: what the deltas left out is emitted
        (all of it when no delta came). An absent or empty copy leaves the deltas as they are;
        one that differs from them in more than whitespace or key order cannot be reconciled
        with the input already streamed, and raises `StreamProtocolError` (retryable)."""
        if not final:
            return []
        if type(final) is not str:
            raise StreamProtocolError(
                f"openai responses stream: malformed event: a function call's final arguments are "
                f"{type(final).__name__}, not a str: {excerpt(repr(final))}",
                retryable=True,
            )
        streamed = "".join(item.chunks)
        item.chunks = [streamed]
        if final == streamed:
            return []
        if final.startswith(streamed):
            rest = final[len(streamed) :]
            item.chunks.append(rest)
            item.streamed = True
            return [StreamToolInput(item.block, rest)]
        same = _canonical(streamed)
        if same is None or same != _canonical(final):
            raise StreamProtocolError(
                "openai responses stream: a function call's streamed arguments differ from its final "
                f"arguments (streamed {excerpt(streamed)!r}, final {excerpt(final)!r})",
                retryable=True,
            )
        return []  # the same JSON, written differently: the streamed copy stands

    # -- whole items

    def _item_added(self, obj: dict[str, Any]) -> Sequence[StreamEvent] | None:
        raw = obj["item"]
        item = self._output_item(obj, raw)
        if raw["type"] != "function_call" or item.started:
            return None
        return self._start_call(item, raw)

    def _item_done(self, obj: dict[str, Any]) -> Sequence[StreamEvent] | None:
        raw = obj["item"]
        return self._finish(self._output_item(obj, raw), raw)

    def _finish(self, item: _Item, raw: dict[str, Any]) -> list[StreamEvent]:
        """The events that make ``item`` what the finished item ``raw`` says it is (the item
        of ``output_item.done``), and close its block."""
        out: list[StreamEvent] = []
        kind = raw["type"]
        if kind == "function_call":
            args = raw.get("arguments")
            out.extend(self._settle(item, args) if item.started else self._start_call(item, raw))
        elif kind == "reasoning":
            out.extend(self._settle_reasoning(item, raw))
            saved = {"id": raw["id"], "summary": raw.get("summary") or []}
            if raw.get("content"):  # the raw reasoning (vLLM, llama.cpp), which llama.cpp wants back
                saved["content"] = raw["content"]
            if raw.get("encrypted_content"):
                saved["encrypted_content"] = raw["encrypted_content"]
            if not item.done:
                out.append(StreamSignature(item.block, json.dumps(saved, separators=(",", ":"))))
        elif kind == "message":
            for i, p in enumerate(raw.get("content") or ()):
                out.extend(self._settle_text(item, i, self._part_text(p)))
        else:
            return out  # hosted tool items (web search, ...) are not kept
        if not item.done:
            item.done = True
            out.append(StreamBlockStop(item.block))
        return out

    def _settle_reasoning(self, item: _Item, raw: dict[str, Any]) -> list[StreamEvent]:
        """A finished reasoning item's thinking, as streamed: the non-empty parts of its summary,
        a blank line between two; or of its raw reasoning text (``content``) when that is what
        streamed, or when it has no summary text."""
        summary = raw.get("summary") or ()
        if not item.raw and (item.streamed or any(p.get("text") for p in summary)):
            parts = [p.get("text") for p in summary]
        else:
            content = raw.get("content") or ()
            parts = [p.get("text") for p in content if p.get("type", "reasoning_text") == "reasoning_text"]
            item.raw = item.raw or any(parts)
        out: list[StreamEvent] = []
        for i, text in enumerate(parts):
            out.extend(self._settle_text(item, i, text))
        return out

    # -- the end

    def _end(self, response: dict[str, Any], incomplete: bool) -> Sequence[StreamEvent]:
        out = self._output(response)
        self.done = True
        self.response_id = response.get("id") or self.response_id
        reason = None
        # Cut by the token limit or a filter: that is why it stopped, even with a call in it.
        if incomplete or response.get("status") == "incomplete":
            details = response.get("incomplete_details") or {}
            reason = _INCOMPLETE.get(str(details.get("reason")))
        if reason is None:
            reason = "tool_use" if self._calls else "refusal" if self._refusal else "end_turn"
        out.append(StreamEnd(reason, _usage(response), self.response_id))
        return out

    def _failed(self, obj: dict[str, Any]) -> Sequence[StreamEvent]:
        """``response.failed``: its error, raised once what the failed response holds is out (the
        output the stream had not carried, the usage it was billed) as `failure`."""
        response = obj.get("response") or {}
        error = self._error(obj, response.get("error") or {})
        try:
            out = self._output(response)
        except (StreamProtocolError, KeyError, TypeError, AttributeError):
            out = []  # the failure is the news, not what its partial output says
        usage = _usage(response)
        if usage:
            out.append(StreamUsage(usage))
        if not out:
            raise error
        self.done = True
        self.failure = error
        return out

    def _output(self, response: dict[str, Any]) -> list[StreamEvent]:
        """The events that make the streamed items what the terminal event's ``output`` says
        they are, as for ``output_item.done`` (`_finish`): an item that never streamed is
        emitted whole, one that streamed in part is completed once, and one that contradicts
        what streamed raises `StreamProtocolError` (retryable). An item is matched by its id
        (a function call also by its ``call_id``), else to the first item of its type that
        streamed and that the output names by no id (a server that renamed it, or never named
        it). A streamed item that the output leaves out stays as it streamed (Ollama leaves out
        a message followed by calls)."""
        output = response.get("output")
        if not output:
            return []
        kept = [raw for raw in output if raw["type"] in _KEPT]
        named = {i for raw in kept for i in _ids(raw)}
        found: list[_Item | None] = []
        claimed: set[int] = set()
        for raw in kept:  # by id first, so that a renamed item cannot take a named one's place
            item = next((i for n in _ids(raw) if (i := self._items.get(n)) is not None), None)
            if item is not None:
                if item.kind != raw["type"]:
                    raise StreamProtocolError(
                        f"openai responses stream: the output item {excerpt(_ids(raw)[0])!r} is a "
                        f"{raw['type']} in the response and a {item.kind} in the stream",
                        retryable=True,
                    )
                claimed.add(item.block)
            found.append(item)
        streamed: list[_Item] | None = None
        out: list[StreamEvent] = []
        for raw, item in zip(kept, found, strict=True):
            if item is None:
                kind = raw["type"]
                if streamed is None:  # each item once (it is known by several keys), in block order
                    streamed = sorted({i.block: i for i in self._items.values()}.values(), key=_block)
                item = next((i for i in streamed if i.kind == kind and i.block not in claimed
                             and (i.id is None or i.id not in named)), None)  # fmt: skip
                if item is None:
                    item = self._new(kind)
                claimed.add(item.block)
            out.extend(self._finish(item, raw))
        return out

    def _error(self, obj: dict[str, Any], err: dict[str, Any]) -> ProviderError:
        """`ProviderStreamError`, or `PromptTooLongError` (``status=200``) for a context
        overflow (``context_length_exceeded``, sent as an ``error`` event)."""
        code = err.get("code") or err.get("type")
        message = err.get("message") or "stream error"
        too_long = prompt_too_long(message, err.get("type"), err.get("code"))
        cls = PromptTooLongError if too_long else ProviderStreamError
        # A proxy's code may be an HTTP status, as an int or a str (LiteLLM's "429").
        status = str(err.get("code"))
        retryable = not too_long and (
            bool({str(code), str(err.get("type"))} & _RETRYABLE_CODES)
            or (status.isdigit() and int(status) in RETRYABLE_STATUSES)
        )
        return cls(
            f"openai responses stream error ({code}): {message}" if code else f"openai responses stream error: {message}",
            provider="openai",
            status=200,
            body=obj,
            request_id=self.request_id,
            error_type=str(code) if code is not None else None,
            retryable=retryable,
        )


#: The output items that are kept (hosted tool items are not).
_KEPT = frozenset({"message", "function_call", "reasoning"})


def _block(item: _Item) -> int:
    return item.block


def _usage(response: dict[str, Any]) -> Usage:
    raw = response.get("usage") or {}
    return Usage(
        count_tokens(raw.get("input_tokens")),
        count_tokens(raw.get("output_tokens")),
        count_tokens((raw.get("input_tokens_details") or {}).get("cached_tokens")),
    )


#: The events that carry a part's final text.
_FINAL_TEXT = frozenset({"response.output_text.done", "response.refusal.done", "response.content_part.done",
                         "response.reasoning_summary_text.done", "response.reasoning_summary_part.done",
                         "response.reasoning_text.done"})  # fmt: skip


def _malformed(obj: dict[str, Any], field: str, value: Any) -> StreamProtocolError:
    wanted = "an int" if field == "output_index" else "a str"
    return StreamProtocolError(
        f"openai responses stream: malformed {obj.get('type')} event: its {field} is "
        f"{type(value).__name__}, not {wanted}: {excerpt(repr(value))}",
        retryable=True,
    )


def _ids(raw: dict[str, Any]) -> list[str]:
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


def _part(obj: dict[str, Any]) -> dict[str, Any]:
    """The ``part`` of a ``.part.done`` event ({} when there is none)."""
    part: dict[str, Any] = obj.get("part") or {}
    return part


def _rest(streamed: str, final: str) -> str | None:
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


def _canonical(text: str) -> str | None:
    """``text`` as JSON written one way (sorted keys, no spaces), or None if it is not JSON."""
    try:
        return json.dumps(loads(text), sort_keys=True, separators=(",", ":"))
    except (ValueError, RecursionError):  # RecursionError: nested about as deep as json can read
        return None


# -- model --------------------------------------------------------------------


class OpenAIResponsesModel(HTTPModel):
    """A `Model` backed by the OpenAI Responses API (streaming, stateless input).

    ``api_key`` defaults to ``OPENAI_API_KEY`` (optional when ``base_url`` is
    given). ``reasoning``: the Responses ``reasoning`` object (e.g.
    ``{"effort": "medium", "summary": "auto"}``); when set, encrypted reasoning
    is requested so it can be passed back. ``doom_loop_check=True`` asks the
    server for doom-loop signals (SPEC §6). ``store``: sent when not None.
    Errors: the `ProviderError` tree, `StreamProtocolError`, `AbortError`.
    """

    def __init__(
        self,
        model: str,
        *,
        api_key: str | None = None,
        base_url: str | None = None,
        http_client: httpx.AsyncClient | None = None,
        reasoning: dict[str, Any] | None = None,
        doom_loop_check: bool = False,
        store: bool | None = None,
        extra_headers: dict[str, str] | None = None,
        extra_body: dict[str, Any] | None = None,
    ) -> None:
        self.model = model
        self.reasoning = reasoning
        self.doom_loop_check = doom_loop_check
        self.store = store
        self.extra_headers = check_headers(extra_headers)
        self.extra_body = dict(extra_body or {})
        self._key_optional = base_url is not None
        self._conn = openai_connection(api_key, base_url, http_client)

    def stream(self, request: ModelRequest, signal: AbortSignal) -> AsyncIterator[StreamEvent]:
        """Stream one response; see `agentloop.models.Model`."""
        return run_stream(self._conn, lambda: self._prepare(request), ResponsesMapper, signal)

    def _prepare(self, request: ModelRequest) -> Prepared:
        headers = openai_headers(self._conn, key_optional=self._key_optional, extra=self.extra_headers)
        if self.doom_loop_check:
            headers["x-grok-doom-loop-check"] = "true"
            headers["x-grok-exact-repetition-check"] = "true"
        body = build_request(request, model=self.model, stored=self.store is not False)
        body["stream"] = True
        if self.reasoning is not None:
            body["reasoning"] = self.reasoning
            body["include"] = ["reasoning.encrypted_content"]
        if self.store is not None:
            body["store"] = self.store
        body.update(self.extra_body)
        return "/responses", headers, body
