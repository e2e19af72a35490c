"""Responses stream events mapped to `StreamEvent`s (WIRE.md §3), one block per output item.

Doom-loop frames (``response.doom_loop_check``, SPEC §6) become `StreamSignals` and never
reach normal event parsing. Unknown event types are ignored. Terminators:
``response.completed``, ``response.incomplete``, whose ``output`` is authoritative
(``response.failed`` and ``error`` raise `ProviderStreamError`, a failed response once its
output and usage are out).

Longer than most modules: `ResponsesMapper` is one state machine, and each of its handlers
reads and writes the same state (which item an event is about, what each part of it has
streamed, whether a final copy or the terminal output agrees with that), so its rules are
kept in one place. Which item an event is about, and what needs no state, are in `_items`.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from typing import Any

from ..._errors import PromptTooLongError, ProviderError, ProviderStreamError, StreamProtocolError
from ..._model import (
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
from .._driver import count_tokens, excerpt, loads, usage_fields
from .._http._errors import prompt_too_long
from .._http._retry import RETRYABLE_STATUSES
from .._sse import ServerSentEvent
from ._items import Item, ItemIndex, canonical_json, final_rest, item_ids

_DOOM = "response.doom_loop_check"
_RETRYABLE_CODES = frozenset({"rate_limit_exceeded", "too_many_requests", "server_error", "internal_error",
                              "server_is_overloaded", "slow_down", "vector_store_timeout",
                              "internal_server_error", "InternalServerError", "ServiceUnavailableError",
                              "RateLimitError"})  # fmt: skip
_INCOMPLETE = {"max_output_tokens": "max_tokens", "content_filter": "refusal"}


def _doom_signals(value: object) -> tuple[str, ...]:
    """The signal strings of a doom-loop frame's ``signals``, a list of them (what is not a
    str in it is left out); anything else (a number, an object, one bare string) carries none.
    The frame is a side channel, so what it holds never fails the response it comes with."""
    if isinstance(value, list):
        return tuple(s for s in value if isinstance(s, str))
    return ()


class ResponsesMapper(ItemIndex):
    """Maps Responses stream events to `StreamEvent`s, one block per output item (which
    item an event is about is `ItemIndex`'s to say)."""

    __slots__ = ("_calls", "_refusal", "done", "failure", "origin", "request_id", "response_id", "terminator")

    def __init__(self, request_id: str | None = None, origin: str | None = None) -> None:
        self.request_id = request_id
        self.origin = origin  # the server's (`origin_of`), kept as each reasoning item's block's origin
        self.done = False
        self.failure: ProviderError | None = None  # raised once the events of its response are out
        self.terminator = "response.completed"
        self.response_id: str | None = None
        ItemIndex.__init__(self)
        self._calls = 0
        self._refusal = False

    def handle(self, sse: ServerSentEvent) -> Sequence[StreamEvent] | None:
        """Map one SSE event. Raises `StreamProtocolError` for malformed data and
        `ProviderStreamError` for ``error`` and ``response.failed``."""
        try:
            obj = loads(sse.data)
        except ValueError as exc:
            if sse.event == "error":  # the server's error, in words: its message (as in Chat)
                err = {"message": sse.data.strip()}
                raise self._error({"error": err}, err) from None
            if not sse.data.strip() and (sse.event in (None, "message") or sse.event not in _READ):
                # "data:" alone, with no name, or an event this mapper does not read (a proxy's
                # "event: keepalive" or "event: ping" with empty data): it carries nothing.
                return None
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
            return (StreamSignals(_doom_signals(obj.get("signals"))),)
        if kind == "error" or sse.event == "error":
            nested = obj.get("error")
            if isinstance(nested, str) and nested:  # a proxy's error in words is its message
                nested = {"message": nested}
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
            item = self._item(obj, "message")
            delta = _str(obj, "delta")
            if not delta:
                return None  # an empty delta changes nothing (not even the part streaming)
            self._refusal |= kind == "response.refusal.delta"
            if item.done:  # text after the message was given whole: a block of its own
                item = self._reopen(item)
            part = obj.get("content_index", 0)
            if part != item.part:
                _switch(item, part, kind)
            item.streamed = True
            item.chunks.append(delta)
            return (StreamText(item.block, delta),)
        if kind == "response.function_call_arguments.delta":
            item = self._item(obj, "function_call")
            delta = _str(obj, "delta")
            if item.done and delta:
                raise _after_done(item, kind, retryable=False)
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
            self.response_id = _id_or(obj.get("response"), self.response_id)
            return None
        if kind == "response.completed" or kind == "response.incomplete":
            response = obj["response"]
            status = response.get("status")
            if type(status) is str and status in _FAILED:  # a failure, whichever event ends it (a
                return self._failed(obj)  # list or a dict is no status: looked up, it is unhashable)
            return self._end(response, kind == "response.incomplete")
        if kind == "response.failed":
            return self._failed(obj)
        nested = obj.get("error")
        if nested:  # a proxy's error in the Chat Completions shape, {"error": {...}} (LiteLLM)
            raise self._error(obj, nested if isinstance(nested, dict) else {"message": str(nested)})
        return None  # unknown and uninteresting events

    # -- text, thinking and arguments

    def _thinking(self, obj: dict[str, Any], raw: bool) -> Sequence[StreamEvent] | None:
        item = self._item(obj, "reasoning")
        if raw:
            item.raw = True  # its summary is not what streamed: not compared with it
        text = _str(obj, "delta")
        if not text:
            return None  # an empty part adds nothing, not even a separator
        if item.done:  # thinking after the item was given whole (LiteLLM, reasoning again): a new block
            item = self._reopen(item)
        part = obj.get("content_index" if raw else "summary_index", 0)
        if part != item.part:
            _switch(item, part, str(obj.get("type")))
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

    def _settle_text(self, item: Item, part: Any, final: Any) -> list[StreamEvent]:
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
        # An item continued after its output_item.done: the final copy is of both blocks' text.
        earlier = "" if item.before is None else item.before.text_of(part)
        rest = final_rest(earlier + streamed, final)
        if rest is None:
            raise StreamProtocolError(
                "openai responses stream: a streamed text differs from its final text "
                f"(streamed {excerpt(earlier + streamed)!r}, final {excerpt(final)!r})",
                retryable=True,
            )
        if not rest:
            return []
        if item.done:
            raise _after_done(item, "a final copy that adds to its text")
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

    def _start_call(self, item: Item, raw: dict[str, Any]) -> list[StreamEvent]:
        item.started = True
        self._calls += 1
        name = _str(raw, "name")
        args = raw.get("arguments")
        if args and type(args) is not str:
            raise _malformed_value(raw, "arguments", args)
        out: list[StreamEvent] = [StreamToolUseStart(item.block, raw.get("call_id") or raw["id"], name)]
        if args:
            item.streamed = True
            item.chunks.append(args)
            out.append(StreamToolInput(item.block, args))
        return out

    def _settle(self, item: Item, final: Any) -> list[StreamEvent]:
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
            if item.done:
                raise _after_done(item, "final arguments that add to its input", retryable=False)
            item.chunks.append(rest)
            item.streamed = True
            return [StreamToolInput(item.block, rest)]
        same = canonical_json(streamed)
        if same is None or same != canonical_json(final):
            raise StreamProtocolError(
                "openai responses stream: a function call's streamed arguments differ from its final "
                f"arguments (streamed {excerpt(streamed)!r}, final {excerpt(final)!r})",
                retryable=True,
            )
        return []  # the same JSON, written differently: the streamed copy stands

    # -- whole items

    def _item_added(self, obj: dict[str, Any]) -> Sequence[StreamEvent] | None:
        raw = obj["item"]
        item = self._output_item(obj, raw, added=True)
        if raw["type"] != "function_call" or item.started:
            return None
        return self._start_call(item, raw)

    def _item_done(self, obj: dict[str, Any]) -> Sequence[StreamEvent] | None:
        raw = obj["item"]
        return self._finish(self._output_item(obj, raw), raw)

    def _finish(self, item: Item, raw: dict[str, Any]) -> list[StreamEvent]:
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
            if not item.done and item.before is None:  # (the item went with the block it continues)
                out.append(StreamSignature(item.block, json.dumps(saved, separators=(",", ":")), self.origin))
        elif kind == "message":
            for i, p in enumerate(raw.get("content") or ()):
                out.extend(self._settle_text(item, i, self._part_text(p)))
        else:
            return out  # hosted tool items (web search, ...) are not kept
        if not item.done:
            item.done = True
            out.append(StreamBlockStop(item.block))
        return out

    def _settle_reasoning(self, item: Item, raw: dict[str, Any]) -> list[StreamEvent]:
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
        nameless = next((i for i in self._items.values() if i.kind == "function_call" and not i.started), None)
        if nameless is not None:
            raise StreamProtocolError(
                f"openai responses stream: the arguments of the function call {excerpt(repr(nameless.id))} "
                "streamed, but no event named the call (no output_item event, not in the response's "
                "output): it cannot be made without its name",
                retryable=True,
            )
        self.done = True
        self.response_id = _id_or(response, self.response_id)
        reason = None
        # Cut by the token limit or a filter: that is why it stopped, even with a call in it.
        if incomplete or response.get("status") == "incomplete":
            # Its details are an object with a reason, or (a proxy's) the reason itself; details of
            # another shape, or a reason that is not a string, say none: it ends as its status says.
            details = response.get("incomplete_details")
            said = details if type(details) is str else details.get("reason") if type(details) is dict else None
            reason = _INCOMPLETE.get(said) if type(said) is str else None
        if reason is None:
            reason = "tool_use" if self._calls else "refusal" if self._refusal else "end_turn"
        out.append(StreamEnd(reason, _usage(response), self.response_id))
        return out

    def _failed(self, obj: dict[str, Any]) -> Sequence[StreamEvent]:
        """``response.failed``, or a ``response.completed`` whose response's ``status`` is
        ``failed`` or ``cancelled`` (`_FAILED`): its error, raised once what the failed response
        holds is out (the output the stream had not carried, the usage it was billed) as `failure`."""
        response = obj.get("response") or {}
        given = response.get("error")
        # A failure the server says nothing of is taken for a transient one (as Chat's
        # finish_reason "error" with no error is); a cancelled response is not retried.
        silent = not given and response.get("status") != "cancelled"
        if isinstance(given, str) and given:  # a proxy's error in words is its message
            given = {"message": given}
        elif not given and obj.get("type") != "response.failed":  # its status is the news
            given = {"message": f"the response ended with status {excerpt(repr(response.get('status')))}"}
        error = self._error(obj, given if isinstance(given, dict) else {}, transient=silent)
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
        named = {i for raw in kept for i in item_ids(raw)}
        found: list[Item | None] = []
        claimed: set[int] = set()
        for raw in kept:  # by id first, so that a renamed item cannot take a named one's place
            item = self.known(item_ids(raw))
            if item is not None:
                if item.kind != raw["type"]:
                    raise StreamProtocolError(
                        f"openai responses stream: the output item {excerpt(item_ids(raw)[0])!r} is a "
                        f"{raw['type']} in the response and a {item.kind} in the stream",
                        retryable=True,
                    )
                claimed.add(item.block)
            found.append(item)
        streamed: list[Item] | None = None
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

    def _error(self, obj: dict[str, Any], err: dict[str, Any], *, transient: bool = False) -> ProviderError:
        """`ProviderStreamError`, or `PromptTooLongError` (``status=200``) for a context
        overflow (``context_length_exceeded``, sent as an ``error`` event); ``transient``:
        retryable whatever ``err`` says."""
        code = err.get("code") or err.get("type")
        message = err.get("message") or "stream error"
        too_long = prompt_too_long(message, err.get("type"), err.get("code"))
        cls = PromptTooLongError if too_long else ProviderStreamError
        # A proxy's code may be an HTTP status, as an int or a str (LiteLLM's "429").
        status = str(err.get("code"))
        retryable = not too_long and (
            transient
            or bool({str(code), str(err.get("type"))} & _RETRYABLE_CODES)
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


def _block(item: Item) -> int:
    return item.block


def _usage(response: dict[str, Any]) -> Usage:
    given = usage_fields(response.get("usage"), "openai responses stream", *_COUNTS)
    return Usage(count_tokens(given[0]), count_tokens(given[1]), count_tokens(given[2]))


#: The counts a usage object gives, in the order of `Usage`'s fields.
_COUNTS = ("input_tokens", "output_tokens", "input_tokens_details.cached_tokens")


#: The ``status`` of a response that did not finish: one that a ``response.completed`` (or
#: ``.incomplete``) carries is the failure ``response.failed`` would be.
_FAILED = frozenset({"failed", "cancelled"})
#: The event names this mapper reads: empty data in one is malformed (in another, it is passed over).
_READ = frozenset({"error", _DOOM, "response.completed", "response.incomplete", "response.failed",
                   "response.created", "response.in_progress", "response.queued",
                   "response.output_item.added", "response.output_item.done",
                   "response.output_text.delta", "response.refusal.delta",
                   "response.function_call_arguments.delta", "response.function_call_arguments.done",
                   "response.reasoning_summary_text.delta", "response.reasoning_text.delta",
                   "response.output_text.done", "response.refusal.done", "response.content_part.done",
                   "response.reasoning_summary_text.done", "response.reasoning_summary_part.done",
                   "response.reasoning_text.done"})  # fmt: skip
#: The events that carry a part's final text.
_FINAL_TEXT = frozenset({"response.output_text.done", "response.refusal.done", "response.content_part.done",
                         "response.reasoning_summary_text.done", "response.reasoning_summary_part.done",
                         "response.reasoning_text.done"})  # fmt: skip


def _id_or(response: Any, before: str | None) -> str | None:
    """The ``id`` of ``response`` when it is a non-empty string, else ``before``: an id of another
    type (a list, a number) is not kept, as the other providers' mappings drop one."""
    given = response.get("id") if type(response) is dict else None
    return given if type(given) is str and given else before


def _str(obj: dict[str, Any], field: str) -> str:
    """The str ``obj[field]`` (KeyError when absent). Another type is a malformed event raised
    here, where the model's errors are scrubbed of its secrets, and not passed on in an event
    whose own check would quote it whole."""
    value = obj[field]
    if type(value) is not str:
        raise _malformed_value(obj, field, value)
    return value


def _malformed_value(obj: dict[str, Any], field: str, value: Any) -> StreamProtocolError:
    return StreamProtocolError(
        f"openai responses stream: malformed {obj.get('type')} {'event' if field == 'delta' else 'item'}: "
        f"its {field} is {type(value).__name__}, not a str: {excerpt(repr(value))}",
        retryable=True,
    )


def _switch(item: Item, part: Any, kind: str) -> None:
    """Make ``part`` the part of ``item`` now streaming. A part before the one streaming (a
    number lower than its) cannot be put in its place: its text would follow the later part's."""
    if type(part) is int and type(item.part) is int and part < item.part:
        raise StreamProtocolError(
            f"openai responses stream: a {kind} event for part {part} after part {item.part} of the "
            f"{item.kind} item {excerpt(repr(item.id))}: its text cannot be put in its place",
            retryable=True,
        )
    item.switch(part)


def _after_done(item: Item, what: str, *, retryable: bool = True) -> StreamProtocolError:
    """A final copy that adds to an item's text, or arguments added to a call, after its
    ``output_item.done``, which gave the item whole and stopped its block: taken, it would make
    the item what the server said it is not (a call's input changed after it was given). Not
    ``retryable`` for a call's arguments: a server that sends them does so on every attempt, and
    each retry would be billed for the same stream."""
    return StreamProtocolError(
        f"openai responses stream: {what} for the {item.kind} item {excerpt(repr(item.id))} after its "
        "output_item.done, which gave it whole",
        retryable=retryable,
    )


def _part(obj: dict[str, Any]) -> dict[str, Any]:
    """The ``part`` of a ``.part.done`` event ({} when there is none)."""
    part: dict[str, Any] = obj.get("part") or {}
    return part
