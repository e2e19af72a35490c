"""OpenAI Chat Completions (and compatible servers): request building, chunk mapping,
and the `OpenAIChatModel`.

Wire reference: WIRE.md §2 and §5. Local-server quirks handled here:

- vLLM: a tool call whose every chunk repeats its id (or carries a fresh one)
  stays one call, keyed by ``index``; ``delta.reasoning``; integer error ``code``.
- Gemini: parallel calls sent whole, one per chunk, all with ``index`` 0 (or
  none): a named delta with an id of its own, after whole JSON arguments, starts
  the next call (`_Call.succeeded_by`). A call's ``extra_content`` (Gemini 3's
  thought signature, which must go back with the call) is kept in a thinking block
  whose signature is `EXTRA_CONTENT` JSON, and sent back on that call.
- Ollama: a whole tool call in one chunk; ``delta.reasoning``.
- Mistral's reasoning models: ``delta.content`` as a list of typed chunks
  (``thinking``, ``text``); litellm: ``arguments`` as an object.
- DeepSeek and Moonshot (Kimi) thinking mode: ``delta.reasoning_content``, which must
  go back on every assistant message with tool calls (``echo_reasoning``, on by default
  for their hosts); without it the next request is refused with a 400.
- llama.cpp: ``delta.reasoning_content``; old builds report a mid-stream
  failure as an ``error: {json}`` SSE *field* line, which spec decoders
  ignore. This adapter decodes that line as an ``error`` event and raises
  `ProviderStreamError` (an event named ``error`` is always an error here).
- OpenRouter: ``delta.reasoning_details`` (signed or encrypted reasoning), kept in a thinking
  block whose signature is `REASONING_DETAILS` JSON, and sent back on its message.
- Together (``finish_reason`` ``eos``, one number as a chunk's ``logprobs``), TGI
  (``stop_sequence``), DeepSeek (``insufficient_system_resource``, a cut;
  ``prompt_cache_hit_tokens``), Moonshot (usage in the finish choice), LiteLLM's proxy
  (an error ``code`` that is an HTTP status as a str).
- The output limit goes as ``max_tokens`` to any server but OpenAI's and Azure's
  (Ollama drops ``max_completion_tokens``, Mistral's API refuses it).

A ``data: {"error": ...}`` chunk raises `ProviderStreamError`. The terminator
is ``data: [DONE]``, or the final usage chunk after a ``finish_reason`` (the server
has finished then), or a body that ends cleanly after a ``finish_reason`` (servers that
send no ``[DONE]``); a stream without either, or whose ``[DONE]`` follows neither a
``finish_reason`` nor the final usage chunk (a cut stream closed by a proxy),
raises `StreamProtocolError`.
"""

from __future__ import annotations

import json
import uuid
from collections.abc import AsyncIterator, Sequence
from typing import Any

import httpx

from .._abort import AbortSignal
from .._accumulate import CUT_BY
from .._errors import PromptTooLongError, ProviderError, ProviderStreamError, StreamProtocolError
from .._messages import TextBlock, ThinkingBlock, ToolResultBlock, ToolUseBlock
from .._model import (
    ModelRequest,
    StreamBlockStop,
    StreamEnd,
    StreamEvent,
    StreamLogprobs,
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
    error_fields,
    openai_connection,
    openai_headers,
    prompt_too_long,
)
from ._sse import ServerSentEvent

__all__ = ["OpenAIChatModel", "build_request"]

_FINISH = {"stop": "end_turn", "tool_calls": "tool_use", "function_call": "tool_use",
           "length": "max_tokens", "model_length": "max_tokens", "content_filter": "refusal",
           "repetition": "repetition", "eos": "end_turn", "eos_token": "end_turn",
           "stop_sequence": "stop_sequence"}  # fmt: skip
#: Finish reasons that stop the output wherever it was, as a dropped connection does: vLLM's
#: "abort" (the server aborted the request), DeepSeek's "insufficient_system_resource".
_CUT_FINISH = {"abort": "the server aborted the response",
               "insufficient_system_resource": "the server ran out of resources for the response"}  # fmt: skip
_RETRYABLE_CODES = frozenset({"rate_limit_exceeded", "server_error", "internal_server_error",
                              "server_is_overloaded", "slow_down", "InternalServerError",
                              "ServiceUnavailableError", "too_many_requests"})  # fmt: skip
_RETRYABLE_INT = RETRYABLE_STATUSES

#: The signature of a reasoning block kept for ``echo_reasoning``: not a real signature, and
#: JSON, so the Anthropic and Responses adapters see it as another provider's and never send it.
REASONING_SIGNATURE = '{"type":"reasoning_content"}'

#: The ``type`` of the JSON signature of a thinking block that holds a tool call's
#: ``extra_content`` (``{"type": "extra_content", "call": <id>, "host": <the server's host>,
#: "extra_content": {...}}``): no thinking, and JSON, so the Anthropic and Responses adapters
#: never send it either; nor does this one to another host (Mistral's API refuses a field it
#: does not know).
EXTRA_CONTENT = "extra_content"
#: Likewise for OpenRouter's ``reasoning_details`` of a response (``{"type": "reasoning_details",
#: "host": ..., "reasoning_details": [...]}``), which go back on its assistant message.
REASONING_DETAILS = "reasoning_details"
_KEPT_PREFIXES = ('{"type":"extra_content",', '{"type":"reasoning_details",')

#: Hosts whose thinking mode needs the reasoning of a tool-call turn passed back (DeepSeek,
#: Moonshot's Kimi): ``echo_reasoning`` defaults to on for them.
_ECHO_HOSTS = frozenset({"api.deepseek.com", "api.moonshot.ai", "api.moonshot.cn"})
#: Hosts of OpenAI's own models, where the output limit is ``max_completion_tokens`` (its
#: reasoning models refuse ``max_tokens``): OpenAI and Azure OpenAI. Other servers read
#: ``max_tokens``, and some do not know the newer name: Ollama drops it unread, Mistral's API
#: and older vLLM refuse it (422, 400).
_COMPLETION_TOKENS_HOSTS = ("api.openai.com", ".openai.azure.com", ".cognitiveservices.azure.com")


# -- request ------------------------------------------------------------------


def build_request(
    request: ModelRequest, *, model: str, echo_reasoning: bool = False, host: str | None = None
) -> dict[str, Any]:
    """The JSON body (without stream options) of a Chat Completions request.

    ``echo_reasoning``: an assistant message with tool calls carries its turn's thinking
    as ``reasoning_content`` (``""`` when there was none), as DeepSeek and Kimi require.
    ``host``: the server's; a tool call's kept ``extra_content`` (`EXTRA_CONTENT`) goes back
    only to the host that sent it (None: whatever host sent it).
    """
    messages: list[dict[str, Any]] = []
    if request.system:
        messages.append({"role": "system", "content": request.system})
    for role, blocks in turns(request.messages):
        if role == "assistant":
            messages.extend(_assistant(blocks, echo_reasoning, host))
            continue
        texts: list[str] = []
        for b in blocks:
            if isinstance(b, ToolResultBlock):
                messages.append(
                    {
                        "role": "tool",
                        "tool_call_id": wire_id(b.tool_use_id, max_len=40),
                        "content": result_text(b, mark_error=True),
                    }
                )
            elif isinstance(b, TextBlock):
                texts.append(b.text)
        if texts:
            messages.append({"role": "user", "content": "\n\n".join(texts)})
    body: dict[str, Any] = {"model": model, "messages": messages}
    if request.tools:
        body["tools"] = [
            {
                "type": "function",
                "function": {
                    "name": t.name,
                    "description": t.description,
                    "parameters": dict(t.input_schema),
                },
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
            body["tool_choice"] = {"type": "function", "function": {"name": choice}}
    return body


def _assistant(blocks: Sequence[Any], echo_reasoning: bool, host: str | None) -> list[dict[str, Any]]:
    text = "".join(b.text for b in blocks if isinstance(b, TextBlock))
    extras, details = _kept(blocks, host)
    calls = []
    for b in blocks:
        if isinstance(b, ToolUseBlock):
            call = {"id": wire_id(b.id, max_len=40), "type": "function",
                    "function": {"name": safe_name(b.name), "arguments": dumps_input(b.input)}}  # fmt: skip
            extra = extras.get(b.id) if extras else None
            if extra is not None:
                call["extra_content"] = extra
            calls.append(call)
    if not text and not calls:
        return []  # thinking only: not sent to Chat Completions
    msg: dict[str, Any] = {"role": "assistant", "content": text or None}
    if details:
        msg[REASONING_DETAILS] = details
    if calls:
        msg["tool_calls"] = calls
        if echo_reasoning:
            # Required on a tool-call turn, even empty; a turn without calls may leave it out,
            # and does (a server that does not take the field is then spared it).
            msg["reasoning_content"] = "".join(b.thinking for b in blocks if isinstance(b, ThinkingBlock))
    return [msg]


def _kept(blocks: Sequence[Any], host: str | None) -> tuple[dict[str, Any], list[Any]]:
    """What the turn's thinking blocks keep for ``host`` (None: any host) to have back: the
    ``extra_content`` of each tool call id (`EXTRA_CONTENT`), and the ``reasoning_details``
    (`REASONING_DETAILS`)."""
    extras: dict[str, Any] = {}
    details: list[Any] = []
    for b in blocks:
        if isinstance(b, ThinkingBlock) and b.signature.startswith(_KEPT_PREFIXES):
            try:
                kept = json.loads(b.signature)
            except ValueError:
                continue
            if not isinstance(kept, dict) or (host is not None and kept.get("host") != host):
                continue
            if kept.get("type") == EXTRA_CONTENT and isinstance(kept.get("call"), str):
                extras[kept["call"]] = kept.get(EXTRA_CONTENT)
            elif kept.get("type") == REASONING_DETAILS and isinstance(kept.get(REASONING_DETAILS), list):
                details.extend(kept[REASONING_DETAILS])
    return extras, details


# -- stream -------------------------------------------------------------------


class _Call:
    __slots__ = ("args", "block", "carried", "extra", "id", "name", "pending", "started")

    def __init__(self, block: int) -> None:
        self.block = block
        self.id = ""
        self.name = ""
        self.pending: list[str] = []  # argument fragments seen before the name
        self.args: list[str] = []  # every argument fragment, in order
        self.started = False
        self.extra: dict[str, Any] | None = None  # its extra_content, until carried into a block
        self.carried = False

    def succeeded_by(self, raw: dict[str, Any], fn: dict[str, Any]) -> bool:
        """Whether a delta under this call's ``index`` is in fact the next call: Gemini's
        OpenAI endpoint (and gateways in front of it) send parallel calls whole, one per
        chunk, all with ``index`` 0 or none. Such a delta has a name and an id of its own,
        and this call's arguments are already a whole JSON object (a vLLM fragment with a
        fresh id has neither a name nor follows whole arguments)."""
        new_id = raw.get("id")
        if not (self.started and fn.get("name") and new_id and new_id != self.id):
            return False
        try:
            value = loads("".join(self.args))
        except ValueError:
            return False
        return isinstance(value, dict)


class ChatMapper:
    """Maps chat completion chunks to `StreamEvent`s. Terminator: ``[DONE]``.

    Block indices are assigned in order of appearance: text and reasoning get
    a new block whenever the channel changes; each tool call ``index`` gets
    its own block, stopped at the end of the stream.
    """

    __slots__ = ("_calls", "_cur", "_cur_kind", "_details", "_final_usage", "_finish", "_last_kind", "_next",
                 "_refusal", "_usage", "done", "host", "keep_reasoning", "logprobs", "request_id", "response_id",
                 "terminator")  # fmt: skip

    def __init__(
        self, request_id: str | None = None, *, logprobs: bool = False, keep_reasoning: bool = False, host: str = ""
    ) -> None:
        self.request_id = request_id
        self.host = host  # the server's, kept with what goes back only to it
        self.logprobs = logprobs
        self.keep_reasoning = keep_reasoning  # sign each finished reasoning block, so it is kept
        self.done = False
        self.terminator = "data: [DONE]"
        self.response_id: str | None = None
        self._calls: dict[int, _Call] = {}
        self._cur = -1  # the open text/thinking block
        self._cur_kind = ""
        self._last_kind = "text"  # what streamed last: "thinking", or "text" (text or tool arguments)
        self._next = 0
        self._finish: str | None = None
        self._refusal = False
        self._usage: Usage | None = None
        self._final_usage = False  # the usage-only chunk a server sends once it has finished
        self._details: list[dict[str, Any]] = []  # OpenRouter's reasoning_details, pieces joined

    def handle(self, sse: ServerSentEvent) -> Sequence[StreamEvent] | None:
        """Map one SSE event. Raises `StreamProtocolError` for malformed data and
        `ProviderStreamError` for an error chunk or ``error`` event."""
        data = sse.data
        if data[:6] == "[DONE]":
            return self._end()
        try:
            obj = loads(data)
        except ValueError as exc:
            if sse.event == "error":
                raise self._error({"error": {"message": data}}) from None
            raise StreamProtocolError(
                f"openai chat stream: malformed JSON in data: {exc}; data: {excerpt(data)!r}", retryable=True
            ) from None
        if not isinstance(obj, dict):
            raise StreamProtocolError(f"openai chat stream: expected a JSON object, got {excerpt(data)!r}")
        if sse.event == "error" or obj.get("error"):
            raise self._error(obj)
        try:
            return self._chunk(obj)
        except (KeyError, TypeError, AttributeError, IndexError) as exc:
            raise StreamProtocolError(
                f"openai chat stream: malformed chunk ({type(exc).__name__}: {exc})", retryable=True
            ) from None

    def _chunk(self, obj: dict[str, Any]) -> list[StreamEvent] | None:
        if not self.response_id:  # Azure's filter chunks carry "id": ""
            self.response_id = obj.get("id") or None
        out: list[StreamEvent] = []
        usage = obj.get("usage")
        if usage and type(usage) is dict:
            self._read_usage(usage, out)
        choices = obj.get("choices")
        if usage and not choices:
            self._final_usage = True
            if self._finish is not None:
                # The server has finished: what follows ([DONE]) carries nothing, so a connection
                # lost before it loses nothing either.
                out.extend(self._end())
                return out
        if choices:
            choice = choices[0]
            delta = choice.get("delta")
            if delta:
                self._delta(delta, out)
            if self.logprobs:
                values = _logprob_values(choice.get("logprobs"))
                if values:  # the tokens of what this chunk streamed: reasoning, or text
                    out.append(StreamLogprobs("thinking" if self._last_kind == "thinking" else "text", values))
            if choice.get("finish_reason"):
                self._finish = choice["finish_reason"]
                nested = choice.get("usage")  # Moonshot's place for it
                if not usage and nested and type(nested) is dict:
                    self._read_usage(nested, out)
                if self._finish == "error":
                    raise self._failed(choice.get("error"))
                if self._finish == "repetition":
                    # vLLM's repetition_detection: the server judged the output a token loop and
                    # ended it there. A doom-loop verdict for the policies, not a normal stop.
                    out.append(StreamSignals((f"tail_repetition@{self._last_kind}",), stopped=True))
                elif self._finish in _CUT_FINISH:
                    # The output stops wherever it was, as with a dropped connection, so it is not
                    # passed off as a finished answer.
                    raise StreamProtocolError(
                        f"openai chat stream: {_CUT_FINISH[self._finish]} (finish_reason "
                        f"{self._finish!r}); the output was cut",
                        retryable=True,
                    )
        return out or None

    def _read_usage(self, usage: dict[str, Any], out: list[StreamEvent]) -> None:
        details = usage.get("prompt_tokens_details")
        cached = count_tokens(details.get("cached_tokens")) if type(details) is dict else 0
        self._usage = Usage(
            count_tokens(usage.get("prompt_tokens")),
            count_tokens(usage.get("completion_tokens")),
            cached or count_tokens(usage.get("prompt_cache_hit_tokens")),  # DeepSeek's name for it
        )
        out.append(StreamUsage(self._usage))

    def _delta(self, delta: dict[str, Any], out: list[StreamEvent]) -> None:
        reasoning = delta.get("reasoning") or delta.get("reasoning_content")
        if reasoning:
            out.append(StreamThinking(self._channel("thinking", out), reasoning))
        details = delta.get("reasoning_details")
        if details and type(details) is list:
            self._keep_details(details)
        content = delta.get("content")
        if content:
            if type(content) is list:
                self._parts(content, out)
            else:
                out.append(StreamText(self._channel("text", out), content))
        refusal = delta.get("refusal")
        if refusal:
            self._refusal = True
            out.append(StreamText(self._channel("text", out), refusal))
        calls = delta.get("tool_calls")
        if calls:
            for pos, call in enumerate(calls):
                self._tool_delta(call, pos, out)

    def _keep_details(self, details: list[Any]) -> None:
        """Keep OpenRouter's ``reasoning_details`` pieces, as one list for the response: the
        consecutive ``reasoning.text`` pieces of one block (one ``index``) joined, its signature
        (on the last piece) kept; other entries (``reasoning.encrypted``, ``reasoning.summary``)
        as they came."""
        kept = self._details
        for d in details:
            if type(d) is not dict:
                continue
            last = kept[-1] if kept else None
            if d.get("type") == "reasoning.text" and last is not None and last.get("type") == "reasoning.text" \
                    and last.get("index") == d.get("index"):  # fmt: skip
                last["text"] = (last.get("text") or "") + (d.get("text") or "")
                for key, value in d.items():
                    if value and not last.get(key):  # the signature, a format the first piece lacked
                        last[key] = value
            else:
                kept.append(dict(d))

    def _parts(self, parts: list[Any], out: list[StreamEvent]) -> None:
        """``content`` as a list of typed chunks (Mistral's reasoning models):
        ``{"type": "text", "text"}`` and ``{"type": "thinking", "thinking": [{"type":
        "text", "text"}, ...]}``. Chunks without text (images, references) are skipped."""
        for part in parts:
            kind = part.get("type")
            if kind == "text":
                piece = part.get("text") or ""
                if piece:
                    out.append(StreamText(self._channel("text", out), piece))
            elif kind == "thinking":
                inner = part.get("thinking") or ""
                if type(inner) is list:
                    piece = "".join(p.get("text") or "" for p in inner)
                else:
                    piece = inner
                if piece:
                    out.append(StreamThinking(self._channel("thinking", out), piece))

    def _channel(self, kind: str, out: list[StreamEvent]) -> int:
        if self._cur_kind != kind:
            self._close_current(out)
            self._cur, self._cur_kind = self._next, kind
            self._last_kind = kind
            self._next += 1
        return self._cur

    def _close_current(self, out: list[StreamEvent]) -> None:
        if self._cur_kind:
            if self._cur_kind == "thinking" and self.keep_reasoning:
                out.append(StreamSignature(self._cur, REASONING_SIGNATURE))
            out.append(StreamBlockStop(self._cur))
            self._cur_kind = ""

    def _tool_delta(self, raw: dict[str, Any], pos: int, out: list[StreamEvent]) -> None:
        key = raw.get("index")
        if key is None:  # no index (Gemini) or a null one: placed by position
            key = pos
        elif type(key) is not int:
            raise StreamProtocolError(
                f"openai chat stream: malformed chunk: a tool call's index is {type(key).__name__}, "
                f"not an int: {excerpt(repr(key))}",
                retryable=True,
            )
        call = self._calls.get(key)
        fn = raw.get("function") or {}
        if call is not None and call.succeeded_by(raw, fn):
            out.append(StreamBlockStop(call.block))  # complete: it ends here
            call = None
        if call is None:
            self._close_current(out)
            call = self._calls[key] = _Call(self._next)
            self._next += 1
        if not call.started:
            # vLLM may repeat the id (or send a fresh one) on every chunk: the first wins.
            call.id = call.id or raw.get("id") or ""
            call.name = call.name or fn.get("name") or ""
        extra = raw.get("extra_content")
        if extra and not call.carried and type(extra) is dict:
            call.extra = extra
        args = fn.get("arguments")
        if args:
            self._last_kind = "text"
            # A whole input sent as an object (litellm's ollama_chat adapter) is encoded as JSON.
            args = json.dumps(args) if type(args) is dict else args
            call.args.append(args)
        if not call.started and call.name:
            call.started = True
            call.id = call.id or _fresh_id()
            out.append(StreamToolUseStart(call.block, call.id, call.name))
            out.extend(StreamToolInput(call.block, p) for p in call.pending)
            call.pending.clear()
        if args:
            if call.started:
                out.append(StreamToolInput(call.block, args))
            else:
                call.pending.append(args)
        if call.extra is not None and call.started:
            self._carry(call, out)

    def _carry(self, call: _Call, out: list[StreamEvent]) -> None:
        """Keep a call's ``extra_content`` (Gemini's thought signature) in a block of its own, a
        thinking block with no text whose signature names the call (`EXTRA_CONTENT`)."""
        kept = {"type": EXTRA_CONTENT, "call": call.id, "host": self.host, EXTRA_CONTENT: call.extra}
        call.extra, call.carried = None, True
        self._close_current(out)
        block = self._next
        self._next += 1
        out.append(StreamSignature(block, json.dumps(kept, separators=(",", ":"))))
        out.append(StreamBlockStop(block))

    def at_eof(self) -> list[StreamEvent] | None:
        """The end of a body that stopped cleanly without ``[DONE]``: complete once a
        ``finish_reason`` came (TGI before 2.2, ik_llama.cpp end there), else None (cut)."""
        return self._end() if self._finish is not None else None

    def _end(self) -> list[StreamEvent]:
        if self._finish is None and not self._final_usage:
            # The output may have been cut anywhere (a proxy that closes a broken upstream with
            # its own [DONE]): before it began, mid-sentence, or inside a tool call's arguments.
            # The usage-only chunk (``include_usage``) comes once the server has finished
            # generating, so a stream that has it is complete even if no choice carried a
            # finish_reason.
            raise StreamProtocolError(
                "openai chat stream: [DONE] without a finish_reason or final usage (the response was cut)",
                retryable=True,
            )
        if self._finish is None and self._next == 0:
            raise StreamProtocolError("openai chat stream: [DONE] without any output or finish_reason")
        out: list[StreamEvent] = []
        self._close_current(out)
        started = False
        for call in self._calls.values():
            if call.started:
                started = True
                out.append(StreamBlockStop(call.block))
        if self._details:  # kept in a block of its own, to go back on this message
            kept = {"type": REASONING_DETAILS, "host": self.host, REASONING_DETAILS: self._details}
            out.append(StreamSignature(self._next, json.dumps(kept, separators=(",", ":"))))
            out.append(StreamBlockStop(self._next))
            self._next += 1
        reason = _FINISH.get(self._finish or "stop", self._finish)
        if started and reason not in CUT_BY:  # a stop that cut the output wherever it was
            # Some servers say "stop" after a tool call; but a call cut by the token limit
            # (or a filter) is not one the model finished, and the host is told why.
            reason = "tool_use"
        elif self._refusal:
            reason = "refusal"
        self.done = True
        out.append(StreamEnd(reason, self._usage, self.response_id))
        return out

    def _error(self, obj: dict[str, Any]) -> ProviderError:
        """`ProviderStreamError`, or `PromptTooLongError` (``status=200``) for a context
        overflow (llama.cpp's ``exceed_context_size_error``, OpenAI's ``context_length_exceeded``)."""
        message, kind = error_fields(obj)
        err = obj.get("error")
        code = err.get("code") if isinstance(err, dict) else None
        if kind == "None":  # how LiteLLM's proxy writes the type of an exception that has none
            kind = str(code) if code is not None else None
        too_long = prompt_too_long(message, kind, code)
        # A code that is an HTTP status (vLLM's int, LiteLLM's str "429") is retryable as it is.
        status = str(code)
        retryable = not too_long and (
            (status.isascii() and status.isdigit() and int(status) in _RETRYABLE_INT)
            or bool({status, kind} & _RETRYABLE_CODES)
        )
        cls = PromptTooLongError if too_long else ProviderStreamError
        label = kind or (str(code) if code is not None else "")
        return cls(
            f"openai chat stream error ({label}): {message or 'stream error'}"
            if label
            else f"openai chat stream error: {message or 'stream error'}",
            provider="openai",
            status=200,
            body=obj,
            request_id=self.request_id,
            error_type=kind or (str(code) if code is not None else None),
            retryable=retryable,
        )


    def _failed(self, detail: Any) -> ProviderError:
        """The error for ``finish_reason: "error"`` (Mistral, OpenRouter): the generation
        failed midway, so what streamed is not the whole answer. Retryable, as a server
        failure is, unless the context does not fit."""
        if not isinstance(detail, dict) or not detail.get("message"):
            detail = {"message": "the server ended the response with finish_reason 'error'"}
        err = self._error({"error": detail})
        if not isinstance(err, PromptTooLongError):
            err.retryable = True
        return err


def _logprob_values(lp: Any) -> tuple[float, ...]:
    """The log probabilities in a choice's ``logprobs``, whatever its shape: OpenAI's
    ``{"content": [{"logprob"}, ...], "refusal": [...]}``, the completions shape
    ``{"token_logprobs": [...]}`` (older vLLM), or one number (Together). Another shape, or an
    entry that is not a number, gives nothing: log probabilities never fail the answer."""
    if type(lp) is dict:
        entries = lp.get("content") or lp.get("refusal")
        values: Any = lp.get("token_logprobs")
        if type(entries) is list:
            values = [e.get("logprob") for e in entries if type(e) is dict]
        elif type(values) is not list:
            return ()
        return tuple(float(v) for v in values if type(v) is float or type(v) is int)
    if type(lp) is float or type(lp) is int:
        return (float(lp),)
    return ()


def _fresh_id() -> str:
    return "call_" + uuid.uuid4().hex[:24]


# -- model --------------------------------------------------------------------


class OpenAIChatModel(HTTPModel):
    """A `Model` backed by OpenAI Chat Completions or a compatible server.

    ``api_key`` defaults to ``OPENAI_API_KEY``; with a ``base_url`` (a local
    vLLM, llama.cpp or Ollama server) it may be absent. ``logprobs=True``
    requests log probabilities and emits `StreamLogprobs`.
    ``max_tokens_param``: the body field for `ModelRequest.max_tokens`; ``None`` (the default)
    sends ``"max_completion_tokens"`` to OpenAI and Azure OpenAI (``api.openai.com``,
    ``*.openai.azure.com``, ``*.cognitiveservices.azure.com``) and ``"max_tokens"`` elsewhere, the
    name every compatible server reads; the resolved name is the model's ``max_tokens_param``.
    ``extra_body`` is merged into every request body.
    ``echo_reasoning``: keep the streamed reasoning (``delta.reasoning_content``) in the
    transcript and send it back as ``reasoning_content`` on each assistant message with tool
    calls, as DeepSeek's and Kimi's thinking modes require; ``None`` (the default) turns it
    on for the hosts ``api.deepseek.com``, ``api.moonshot.ai`` and ``api.moonshot.cn`` only.
    Errors: the `ProviderError` tree, `StreamProtocolError`, `AbortError`.
    """

    def __init__(
        self,
        model: str,
        *,
        api_key: str | None = None,
        base_url: str | None = None,
        http_client: httpx.AsyncClient | None = None,
        logprobs: bool = False,
        top_logprobs: int | None = None,
        include_usage: bool = True,
        max_tokens_param: str | None = None,
        extra_headers: dict[str, str] | None = None,
        extra_body: dict[str, Any] | None = None,
        echo_reasoning: bool | None = None,
    ) -> None:
        self.model = model
        self.logprobs = logprobs
        self.top_logprobs = top_logprobs
        self.include_usage = include_usage
        self.extra_headers = check_headers(extra_headers)
        self.extra_body = dict(extra_body or {})
        self._key_optional = base_url is not None
        self._conn = openai_connection(api_key, base_url, http_client)
        host = self._host = (httpx.URL(self._conn.base_url).host or "").lower()
        if echo_reasoning is None:
            echo_reasoning = host in _ECHO_HOSTS
        self.echo_reasoning = echo_reasoning
        if max_tokens_param is None:
            openai = host == _COMPLETION_TOKENS_HOSTS[0] or host.endswith(_COMPLETION_TOKENS_HOSTS[1:])
            max_tokens_param = "max_completion_tokens" if openai else "max_tokens"
        self.max_tokens_param = max_tokens_param

    def stream(self, request: ModelRequest, signal: AbortSignal) -> AsyncIterator[StreamEvent]:
        """Stream one response; see `agentloop.models.Model`."""
        logprobs, keep, host = self.logprobs, self.echo_reasoning, self._host
        return run_stream(
            self._conn,
            lambda: self._prepare(request),
            lambda rid: ChatMapper(rid, logprobs=logprobs, keep_reasoning=keep, host=host),
            signal,
            error_field=True,
        )

    def _prepare(self, request: ModelRequest) -> Prepared:
        headers = openai_headers(self._conn, key_optional=self._key_optional, extra=self.extra_headers)
        body = build_request(request, model=self.model, echo_reasoning=self.echo_reasoning, host=self._host)
        body["stream"] = True
        if self.include_usage:
            body["stream_options"] = {"include_usage": True}
        if request.max_tokens:
            body[self.max_tokens_param] = request.max_tokens
        if self.logprobs:
            body["logprobs"] = True
            if self.top_logprobs is not None:
                body["top_logprobs"] = self.top_logprobs
        body.update(self.extra_body)
        return "/chat/completions", headers, body
