"""Chat completion chunks mapped to `StreamEvent`s (WIRE.md §2 and §5).

Block indices are given in order of appearance; the servers' quirks this mapping handles are
listed in the package's docstring. The terminator is ``data: [DONE]``, or the final usage chunk
after a ``finish_reason`` (the server has finished then), or a body that ends cleanly after a
``finish_reason`` (servers that send no ``[DONE]``); a stream without either, or whose
``[DONE]`` follows neither a ``finish_reason`` nor the final usage chunk (a cut stream closed
by a proxy), raises `StreamProtocolError`. Errors sent in the stream are mapped in `_errors`.
"""

from __future__ import annotations

import json
import logging
import re
import uuid
from array import array
from collections.abc import Sequence
from itertools import pairwise
from typing import Any

from ..._accumulate import CUT_BY
from ..._errors import StreamProtocolError
from ..._model import (
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
from .._driver import UsageReader, count_tokens, excerpt, loads, not_a_str
from .._http import Redactor
from .._sse import ServerSentEvent
from ._errors import finish_error, stream_error
from ._request import EXTRA_CONTENT, REASONING_DETAILS

log = logging.getLogger("agentloop")

_FINISH = {"stop": "end_turn", "tool_calls": "tool_use", "function_call": "tool_use",
           "length": "max_tokens", "model_length": "max_tokens", "content_filter": "refusal",
           "repetition": "repetition", "eos": "end_turn", "eos_token": "end_turn",
           "stop_sequence": "stop_sequence",
           # Gemini's own finish reasons, which gateways in front of it pass on (upper case,
           # read lowered): the token limit, and the safety and policy filters.
           "max_tokens": "max_tokens", "safety": "refusal", "recitation": "refusal",
           "blocklist": "refusal", "prohibited_content": "refusal", "spii": "refusal",
           "image_safety": "refusal",
           # Anthropic's, from gateways that translate its stop reasons into this wire.
           "end_turn": "end_turn", "tool_use": "tool_use"}  # fmt: skip
#: Finish reasons that stop the output wherever it was, as a dropped connection does: vLLM's
#: "abort" (the server aborted the request), DeepSeek's "insufficient_system_resource".
_CUT_FINISH = {"abort": "the server aborted the response",
               "insufficient_system_resource": "the server ran out of resources for the response"}  # fmt: skip

#: What a value of the wrong type makes malformed (`not_a_str`).
_MALFORMED = "openai chat stream: malformed chunk"

#: The signature of a reasoning block kept for ``echo_reasoning``: not a real signature, and
#: JSON, so the Anthropic and Responses adapters see it as another provider's and never send it.
REASONING_SIGNATURE = '{"type":"reasoning_content"}'
#: The counts a usage object gives, in the order `_read_usage` takes them.
_COUNTS = ("prompt_tokens", "completion_tokens", "prompt_tokens_details.cached_tokens", "prompt_cache_hit_tokens")


class _Call:
    __slots__ = ("args", "block", "carried", "chain", "extra", "held", "id", "minted", "name", "pending", "repeat_ok",
                 "shape", "size", "started")  # fmt: skip

    def __init__(self, block: int) -> None:
        self.block = block
        self.id = ""
        self.minted = False  # the id is ours: the server sent none
        self.name = ""
        self.pending: list[str] = []  # argument fragments seen before the name
        self.args: list[str] = []  # every argument fragment, in order, as it came (see `chain`)
        self.size = 0  # their length, joined
        self.held = -1  # once a fragment may resend the arguments: how much of them was shown
        # While each fragment held back starts with the one before (cumulative mode), the
        # fragments' lengths; ``args`` is then only the last, the others its beginnings.
        self.chain: array[int] | None = None
        self.shape = _Shape()  # of ``args`` joined, scanned as far as asked (`_may_be_whole`)
        self.repeat_ok = False  # the last fragment may be a whole repeat (see `arguments`)
        self.started = False
        self.extra: dict[str, Any] | None = None  # its extra_content, until carried into a block
        self.carried = False

    def add(self, piece: str, finishing: bool) -> str:
        """Keep ``piece`` of the arguments; what of it to show now. Some servers resend them
        (DeepSeek and Baidu Qianfan in cumulative mode send all the arguments so far on every
        chunk, GLM-style servers the whole arguments again on the last one), which only the end
        of the call tells (`arguments`): from a piece that starts with all the arguments so far
        on, nothing is shown until then. The caller passes only a piece as long as all the
        arguments so far, or any once held: rare in a real stream (the total doubles each time),
        so the arguments are joined to compare only a few times."""
        held = self.held >= 0
        if not held and self.args and len(piece) >= self.size and piece.startswith(self.args[0]):
            held = piece.startswith("".join(self.args))
            if held:
                self.held = self.size
                if all(b.startswith(a) for a, b in pairwise(self.args)):
                    self.chain = array("q", [len(a) for a in self.args])
                    del self.args[:-1]
                    self.shape = _Shape()  # not used while the chain lasts
        self._keep(piece)
        self.repeat_ok = finishing or (bool(self.id) and not self.minted)
        return "" if held else piece

    def _keep(self, piece: str) -> None:
        """Keep ``piece``: while each starts with the one before, only the last one whole (in
        cumulative mode the fragments together grow with the square of the arguments)."""
        chain = self.chain
        if chain is not None:
            if piece.startswith(self.args[-1]):
                self.args[-1] = piece
                chain.append(len(piece))
                self.size += len(piece)
                return
            self.args = self._chained()  # not a resend of all so far: every fragment counts
            self.chain = None
            self.shape = _Shape()
        self.args.append(piece)
        self.size += len(piece)

    def _chained(self, upto: int | None = None) -> list[str]:
        """The fragments of a `chain`, the first ``upto`` of them (all by default)."""
        last, lengths = self.args[-1], self.chain or ()
        return [last[:n] for n in lengths[:upto]]

    def arguments(self, cut: bool = False) -> str:
        """The call's arguments, decided by validity once it ends: the fragments joined whenever
        that is valid JSON (the standard wire); else, unless the output was ``cut`` where it
        was (a resend could not be told from a cut piece then), what follows a leading ``{}``
        placeholder when that is one whole object (`_after_placeholder`), or a reading of them
        as resent: the last fragment, when it is valid JSON and either each fragment starts with the one
        before (cumulative) or the fragments before it, joined, are whole JSON it starts with
        (whole again); else the fragments joined (an error quotes them), or, when each starts
        with the one before, the last (what the server meant). A last fragment that only
        repeats all before it is read so only if the call has the server's id or the fragment
        came with the ``finish_reason``: two identical calls without ids stay a visible error."""
        if self.chain is not None:
            return self._cumulative(cut)
        args = self.args
        plain = "".join(args)
        if self.held < 0 or cut or _valid(plain):
            return plain
        rest = _after_placeholder(plain)
        if rest is not None:
            return rest
        last = args[-1]
        before = plain[: len(plain) - len(last)]
        if last == before and not self.repeat_ok:
            return plain
        if last.startswith(before) and _valid(before) and _valid(last):
            return last
        return plain

    def _cumulative(self, cut: bool) -> str:
        """`arguments` when each fragment starts with the one before. The fragments joined are
        checked only while they are a few times the last one: an ordinary stream whose pieces
        each repeat all before them (a nested object, one digit at a time) stays short."""
        last = self.args[-1]
        if self.size <= _JOINED * len(last) + _JOINED_MIN:
            plain = "".join(self._chained())
            if _valid(plain):
                return plain
            if self.size == 2 * len(last) and plain == last + last and not self.repeat_ok:
                return plain  # a bare repeat, maybe a second identical call
        if not _valid(last):
            return last
        return "".join(self._chained()) if cut else last

    def settle(self, cut: bool = False, redactor: Redactor | None = None) -> str:
        """What of the arguments is left to show once the call ends (all of them joined or the
        resent whole, `arguments`, less what was shown); "" when nothing was held back."""
        if self.held < 0:
            return ""
        whole, shown = self.arguments(cut), self.held
        self.held = -1
        if not whole.startswith(self._shown(shown)):  # cannot be: each reading starts with what was shown
            whole = "".join(self._chained() if self.chain is not None else self.args)
        elif self.size == 2 * len(whole) and len(self.args[-1]) == len(whole):  # the same, twice: one call
            _resent(self, redactor)
        return whole[shown:]

    def _shown(self, shown: int) -> str:
        """The first ``shown`` characters of the fragments joined."""
        if self.chain is None:
            return "".join(self.args)[:shown]
        kept, count = 0, 0
        while kept < shown:
            kept += self.chain[count]
            count += 1
        return "".join(self._chained(count))[:shown]

    def succeeded_by(self, raw: dict[str, Any], fn: dict[str, Any]) -> str:
        """Whether a delta under this call's ``index`` is in fact the next call (``"next"``),
        this call resent whole (``"resend"``), or neither (``""``, a piece of this call).
        Gemini's OpenAI endpoint (and gateways in front of it) send parallel calls whole, one
        per chunk, all with ``index`` 0 or none. Such a delta has a name and an id (one of its
        own, or this call's: DeepSeek, GLM and engines behind OpenRouter give parallel calls one
        id, `_named_again`), and this call's arguments (`arguments`) are already a whole JSON
        object (a vLLM fragment with a fresh id has neither a name nor follows whole arguments)."""
        new_id = raw.get("id")
        if not (self.started and fn.get("name") and new_id):
            return ""
        if new_id == self.id:
            return self._named_again(fn)
        return "next" if self._may_be_whole() and self._whole() is not None else ""

    def _whole(self) -> dict[str, Any] | None:
        """The arguments (`arguments`), when they are a whole JSON object; else None."""
        try:
            value = loads(self.arguments())
        except ValueError:
            return None
        return value if type(value) is dict else None

    def _may_be_whole(self) -> bool:
        """Whether the arguments so far may be whole (a cheap test before `_whole`): their
        JSON shape (`_Shape`), scanned from where it was last asked, so each character is
        scanned once; in cumulative mode, whether the last fragment ends with ``}``."""
        if self.chain is not None:
            return self.args[-1].rstrip()[-1:] == "}"
        shape = self.shape
        for piece in self.args[shape.pieces :]:
            shape.feed(piece)
        return shape.may_be_whole()

    def _named_again(self, fn: dict[str, Any]) -> str:
        """What a delta with this call's id and a name is, after its whole arguments: when it
        carries the beginning of a JSON object, the next call if it names another tool or
        holds other arguments, else the same call resent whole (GLM-style servers resend the
        whole call, on the chunk with the ``finish_reason`` or before it). Two identical calls
        sharing one id look just the same, and are read as one too: a tool run twice is worse
        than a call missed (the caller warns of it). vLLM repeats the id and name on every
        piece, but a piece after whole arguments is none, or whitespace. Checked only when the
        arguments so far may be whole (`_may_be_whole`), so a stream of pieces is not joined
        and parsed again at every piece."""
        args = fn.get("arguments")
        if type(args) is dict:
            args = json.dumps(args)
        if type(args) is not str or args.lstrip()[:1] != "{" or not self._may_be_whole():
            return ""
        whole = self._whole()
        if whole is None:
            return ""
        if fn["name"] != self.name:
            return "next"
        try:
            same = loads(args) == whole
        except ValueError:
            return "next"  # the first piece of other arguments (or not JSON: kept apart, an error)
        return "resend" if same else "next"


class _Shape:
    """The JSON shape of a call's arguments joined, fed fragment by fragment: the nesting
    depth, inside a string or not (after a backslash or not), how many values closed at the
    top level. Arguments that may be read as one whole object (`_Call.arguments`: the
    fragments joined, a ``{}`` placeholder and an object, or an object and its resend) are at
    the top level, outside a string, after one or two values closed there with nothing else
    between them but whitespace; whatever else is ``broken`` for good."""

    __slots__ = ("broken", "closed", "depth", "escaped", "pieces", "string")

    def __init__(self) -> None:
        self.pieces = 0  # the fragments fed so far
        self.depth = 0
        self.string = False
        self.escaped = False
        self.closed = 0
        self.broken = False

    def may_be_whole(self) -> bool:
        return not self.broken and self.depth == 0 and not self.string and self.closed > 0

    def feed(self, text: str) -> None:
        self.pieces += 1
        pos, end = 0, len(text)
        if self.escaped:
            self.escaped, pos = False, 1
        while pos < end and not self.broken:
            if self.string:
                found = _IN_STRING.search(text, pos)
                if found is None:
                    return
                pos = found.end()
                if found.group() == "\\":
                    self.escaped = pos >= end
                    pos += 1
                else:
                    self.string = False
                continue
            found = _OUTSIDE.search(text, pos)
            stop = end if found is None else found.start()
            if self.depth == 0 and pos < stop and not text[pos:stop].isspace():
                self.broken = True  # a value other than an object or array, or after one
            if found is None:
                return
            pos = found.end()
            self._mark(found.group())

    def _mark(self, char: str) -> None:
        if char == '"':
            self.string = True
            self.broken |= self.depth == 0
        elif char in "{[":
            self.depth += 1
        else:
            self.depth -= 1
            if self.depth == 0:
                self.closed += 1
            self.broken |= self.depth < 0 or self.closed > 2


#: What ends or escapes in a JSON string; what opens or closes a value outside one.
_IN_STRING = re.compile(r'["\\]')
_OUTSIDE = re.compile(r'["{}\[\]]')


class ChatMapper:
    """Maps chat completion chunks to `StreamEvent`s. Terminator: ``[DONE]``.

    Block indices are assigned in order of appearance: text and reasoning get
    a new block whenever the channel changes; each tool call ``index`` gets
    its own block, stopped at the end of the stream.
    """

    __slots__ = ("_calls", "_choice", "_cur", "_cur_kind", "_details", "_final_usage", "_finish", "_last_kind",
                 "_late", "_next", "_open", "_refinished", "_refusal", "_resent", "_said", "_usage", "_usage_asked",
                 "_usage_read", "done", "keep_reasoning", "logprobs", "origin", "redactor", "request_id", "response_id", "resumed",
                 "settled", "terminator")  # fmt: skip

    def __init__(
        self,
        request_id: str | None = None,
        *,
        logprobs: bool = False,
        keep_reasoning: bool = False,
        origin: str | None = None,
        usage_asked: bool = False,
    ) -> None:
        self.request_id = request_id
        self.origin = origin  # the server's (`origin_of`), the kept blocks' `origin`
        self.logprobs = logprobs
        self.keep_reasoning = keep_reasoning  # sign each finished reasoning block, so it is kept
        self.done = False
        # The answer is whole: a finish_reason came; a body held open after it ends after the
        # grace, whether or not the usage the request asked for (``usage_asked``,
        # ``include_usage``) came in it (`grace_over`).
        self.settled = False
        # How many chunks brought output after a finish_reason (it was not final then): the
        # grace no longer applies once one did (`_driver._body`).
        self.resumed = 0
        self._usage_asked = usage_asked
        self._usage_read = UsageReader("openai chat stream")  # warns once of malformed usage
        self.terminator = "data: [DONE]"
        # The request's secrets, set by `run_stream`: taken out of the server's values a warning quotes.
        self.redactor: Redactor | None = None
        self.response_id: str | None = None
        self._calls: dict[int, _Call] = {}
        self._choice: Any = None  # the index of the answer's choice, once a chunk named one
        self._cur = -1  # the open text/thinking block
        self._cur_kind = ""
        self._last_kind = "text"  # what streamed last: "thinking", or "text" (text or tool arguments)
        self._next = 0
        self._finish: str | None = None
        self._late = False  # output came after a final finish (and was left out, with a warning)
        self._open = False  # output came after the finish_reason: the next one decides instead
        self._refinished = False  # another finish_reason came after it (ignored, with a warning)
        self._refusal = False
        # The pieces of the latest text and reasoning blocks, and their length: the whole of
        # one sent again after a finish_reason is a resend (`_unresent`).
        self._said: dict[str, tuple[list[str], int]] = {}
        self._resent = False  # a resend was left out (and warned of, once)
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
                raise stream_error({"error": {"message": data}}, self.request_id) from None
            if not data.strip():  # "data:" alone (a proxy's keep-alive): it carries nothing
                return None
            raise StreamProtocolError(
                f"openai chat stream: malformed JSON in data: {exc}; data: {excerpt(data)!r}", retryable=True
            ) from None
        if not isinstance(obj, dict):
            raise StreamProtocolError(f"openai chat stream: expected a JSON object, got {excerpt(data)!r}")
        if sse.event == "error" or obj.get("error") or obj.get("object") == "error":
            # The last: older vLLM's flat error, {"object": "error", "message", "type", "code"}.
            raise stream_error(obj, self.request_id)
        try:
            return self._chunk(obj)
        except (KeyError, TypeError, AttributeError, IndexError) as exc:
            raise StreamProtocolError(
                f"openai chat stream: malformed chunk ({type(exc).__name__}: {exc})", retryable=True
            ) from None

    def _chunk(self, obj: dict[str, Any]) -> list[StreamEvent] | None:
        if not self.response_id:  # Azure's filter chunks carry "id": ""
            given = obj.get("id")
            self.response_id = given if type(given) is str and given else None
        out: list[StreamEvent] = []
        usage = obj.get("usage")
        if usage:
            self._read_usage(usage, out)
            if self._finish is not None:  # after the finish (on a chunk with an empty choice, too)
                self.settled = True
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
            which = choice.get("index")
            if which is not None and which != self._choice:
                choice = self._ours(choices)
                if choice is None:
                    return out or None
            delta = choice.get("delta")
            resent = False
            if delta and self._finish is not None and _has_output(delta):
                # Gateways put "stop" on chunks that go on (on every one, or on the text before
                # the calls): output after the finish_reason means it was not final. But a
                # server that judged the output a loop, or a filter that stopped it, ended it
                # there: what follows is left out.
                if self._finish == "repetition" or _FINISH.get(self._finish) == "refusal":
                    delta = None
                    if not self._late:
                        self._late = self._refinished = _late_delta(choice["delta"], self._finish)
                else:
                    delta, resent = self._unresent(delta)
                    if delta:
                        self._open = True
                        self.resumed += 1
            if delta and (self._finish is None or self._open):
                self._delta(delta, out, bool(choice.get("finish_reason")))
            if self.logprobs and not resent and (self._finish is None or self._open):
                values = _logprob_values(choice.get("logprobs"))
                if values:  # the tokens of what this chunk streamed: reasoning, or text
                    out.append(StreamLogprobs("thinking" if self._last_kind == "thinking" else "text", values))
            finish = choice.get("finish_reason") or choice.get("finishReason")
            if finish:
                nested = choice.get("usage")  # Moonshot's place for it
                if not usage and nested:
                    self._read_usage(nested, out)
                if self._finish is not None and not self._open:
                    self._late_finish(finish)
                    return out or None
                first, self._open = self._finish, False
                # One sent again after output is warned of, if unknown, only where it differs.
                again = first if first is None or type(finish) is not str else finish.lower()
                if type(finish) is not str and first is not None:  # the one before it stands
                    self._late_finish(finish)
                    return out or None
                finish = _finish_reason(finish, again, self.redactor)
                self.settled = True
                self._finish = finish
                if finish == "error":
                    raise finish_error(choice.get("error"), self.request_id)
                if finish == "repetition":
                    # vLLM's repetition_detection: the server judged the output a token loop and
                    # ended it there. A doom-loop verdict for the policies, not a normal stop.
                    out.append(StreamSignals((f"tail_repetition@{self._last_kind}",), stopped=True))
                elif finish in _CUT_FINISH:
                    # The output stops wherever it was, as with a dropped connection, so it is not
                    # passed off as a finished answer.
                    raise StreamProtocolError(
                        f"openai chat stream: {_CUT_FINISH[finish]} (finish_reason "
                        f"{finish!r}); the output was cut",
                        retryable=True,
                    )
        return out or None

    def _unresent(self, delta: dict[str, Any]) -> tuple[dict[str, Any] | None, bool]:
        """A delta after a ``finish_reason`` without what it sends again: a ``content`` (or
        ``reasoning``) equal to the whole text of the latest text (or reasoning) block, of at
        least `_RESEND_MIN` characters, is the answer sent whole again (a gateway that ends
        with the aggregate), not more of it: it is left out, with a warning, once. The delta
        left (None when nothing is), and whether anything was left out."""
        dropped = []
        for field, kind in (("content", "text"), ("reasoning", "thinking"), ("reasoning_content", "thinking")):
            value = delta.get(field)
            said = self._said.get(kind)
            if type(value) is str and len(value) >= _RESEND_MIN and said is not None and said[1] == len(value) \
                    and "".join(said[0]) == value:  # fmt: skip
                dropped.append(field)
        if not dropped:
            return delta, False
        if not self._resent:
            self._resent = True
            log.warning(
                "openai chat stream: the server sent the whole %s again after its finish_reason %s; read as a "
                "resend, left out (an answer repeated word for word would be too)",
                " and ".join(dropped), _named(self._finish or ""),
            )
        left = {k: v for k, v in delta.items() if k not in dropped}
        return (left if _has_output(left) else None), True

    def _late_finish(self, finish: Any) -> None:
        """A ``finish_reason`` sent again after the answer's, with no output since: the first
        decides (``length`` then ``stop`` is still ``max_tokens``; a later ``abort``, ``error``
        or ``repetition`` neither cuts nor fails it, nor signals again; one that is not a string
        is ignored), except a filter's verdict (``content_filter``, Gemini's ``SAFETY``...) after
        a reason that is not one: the answer ends as a refusal then, so a host is never told a
        filtered answer ended normally. One that differs is warned of, once."""
        first = self._finish
        late = finish.lower() if type(finish) is str else None
        if late == first:
            return
        verdict = late is not None and _FINISH.get(late) == "refusal" and first != "repetition" \
            and _FINISH.get(first or "") != "refusal"  # fmt: skip
        if verdict:
            self._finish = late
        if self._refinished and not verdict:
            return
        self._refinished = True
        said = _named(late) if late is not None else f"of type {type(finish).__name__}"
        log.warning(
            "openai chat stream: the server sent finish_reason %s after its finish_reason %s; the answer ends "
            "with the %s", said, _named(first or ""), "filter's verdict, a refusal" if verdict else "first",
        )

    def _ours(self, choices: list[Any]) -> dict[str, Any] | None:
        """The answer's choice in a chunk, None when it has none. A server asked for one choice
        may still send several (a gateway that fans out, ``n`` set by a proxy), each chunk naming
        its choice's ``index``: the first index named is the answer's, and the chunks of the
        others are skipped, not mixed into it. A choice that names none is taken as the answer's."""
        if self._choice is None:
            first: dict[str, Any] = choices[0]
            self._choice = first.get("index")
            return first
        return next((c for c in choices if c.get("index") is None or c.get("index") == self._choice), None)

    def _read_usage(self, usage: Any, out: list[StreamEvent]) -> None:
        prompt, completion, cached, hit = self._usage_read(usage, *_COUNTS)
        self._usage = Usage(
            count_tokens(prompt),
            count_tokens(completion),
            count_tokens(cached) or count_tokens(hit),  # DeepSeek's name for it
        )
        out.append(StreamUsage(self._usage))

    def _delta(self, delta: dict[str, Any], out: list[StreamEvent], finishing: bool) -> None:
        reasoning = delta.get("reasoning") or delta.get("reasoning_content")
        if reasoning:
            if type(reasoning) is not str:
                field = "reasoning" if delta.get("reasoning") else "reasoning_content"
                raise not_a_str(_MALFORMED, f"delta's {field}", reasoning)
            out.append(StreamThinking(self._said_in("thinking", reasoning, out), reasoning))
        details = delta.get("reasoning_details")
        if details and type(details) is list:
            self._keep_details(details)
        content = delta.get("content")
        if content:
            if type(content) is list:
                self._parts(content, out)
            elif type(content) is str:
                out.append(StreamText(self._said_in("text", content, out), content))
            else:
                raise not_a_str(_MALFORMED, "delta's content", content)
        refusal = delta.get("refusal")
        if refusal:
            if type(refusal) is not str:
                raise not_a_str(_MALFORMED, "delta's refusal", refusal)
            self._refusal = True
            out.append(StreamText(self._said_in("text", refusal, out), refusal))
        calls = delta.get("tool_calls")
        if calls:
            for pos, call in enumerate(calls):
                self._tool_delta(call, pos, out, finishing)

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
                if type(piece) is not str:
                    raise not_a_str(_MALFORMED, "content part's text", piece)
                if piece:
                    out.append(StreamText(self._said_in("text", piece, out), piece))
            elif kind == "thinking":
                inner = part.get("thinking") or ""
                if type(inner) is list:
                    texts = [p.get("text") or "" for p in inner]
                    bad = next((t for t in texts if type(t) is not str), None)
                    if bad is not None:
                        raise not_a_str(_MALFORMED, "thinking part's text", bad)
                    piece = "".join(texts)
                elif type(inner) is str:
                    piece = inner
                else:
                    raise not_a_str(_MALFORMED, "content part's thinking", inner)
                if piece:
                    out.append(StreamThinking(self._said_in("thinking", piece, out), piece))

    def _said_in(self, kind: str, piece: str, out: list[StreamEvent]) -> int:
        """The block ``piece`` of ``kind`` goes to (`_channel`), the piece kept with the others
        of that block (`_unresent` compares a resend with them)."""
        block = self._channel(kind, out)
        pieces, size = self._said[kind]
        pieces.append(piece)
        self._said[kind] = pieces, size + len(piece)
        return block

    def _channel(self, kind: str, out: list[StreamEvent]) -> int:
        if self._cur_kind != kind:
            self._close_current(out)
            self._cur, self._cur_kind = self._next, kind
            self._last_kind = kind
            self._said[kind] = [], 0
            self._next += 1
        return self._cur

    def _close_current(self, out: list[StreamEvent]) -> None:
        if self._cur_kind:
            if self._cur_kind == "thinking" and self.keep_reasoning:
                out.append(StreamSignature(self._cur, REASONING_SIGNATURE, self.origin))
            out.append(StreamBlockStop(self._cur))
            self._cur_kind = ""

    def _tool_delta(self, raw: dict[str, Any], pos: int, out: list[StreamEvent], finishing: bool) -> None:
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
        for field, value in (("id", raw.get("id")), ("name", fn.get("name"))):
            if value and type(value) is not str:
                raise not_a_str(_MALFORMED, f"tool call's {field}", value)
        follows = "" if call is None else call.succeeded_by(raw, fn)
        if call is not None and follows == "next":
            self._settle(call, out)
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
        if follows == "resend":  # dropped: the call's arguments stand as they came
            _resent(call, self.redactor)
            args = None
        elif args:
            self._last_kind = "text"
            # A whole input sent as an object (litellm's ollama_chat adapter) is encoded as JSON.
            if type(args) is dict:
                args = json.dumps(args)
            elif type(args) is not str:
                raise not_a_str(_MALFORMED, "tool call's arguments", args)
            if call.held < 0 and (not call.args or len(args) < call.size):  # the common case: a new piece
                call.args.append(args)
                call.size += len(args)
                if call.size == len(args) and len(args) < 8 and args.strip() == "{}":
                    call.held, args = 0, ""  # maybe a placeholder: shown once the call ends
            else:
                args = call.add(args, finishing)  # rare: a piece that may resend the arguments
        if not call.started and call.name:
            call.started = True
            call.minted = not call.id
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

    def _settle(self, call: _Call, out: list[StreamEvent], cut: bool = False) -> None:
        """Show what of a call's arguments was held back (`_Call.settle`), now that it ends;
        ``cut``: the finish cut the output wherever it was (no resend is read then)."""
        text = call.settle(cut, self.redactor)
        if text:
            if call.started:
                out.append(StreamToolInput(call.block, text))
            else:
                call.pending.append(text)

    def _carry(self, call: _Call, out: list[StreamEvent]) -> None:
        """Keep a call's ``extra_content`` (Gemini's thought signature) in a block of its own, a
        thinking block with no text whose signature names the call (`EXTRA_CONTENT`)."""
        kept = {"type": EXTRA_CONTENT, "call": call.id, EXTRA_CONTENT: call.extra}
        call.extra, call.carried = None, True
        self._close_current(out)
        block = self._next
        self._next += 1
        out.append(StreamSignature(block, json.dumps(kept, separators=(",", ":")), self.origin))
        out.append(StreamBlockStop(block))

    def grace_over(self) -> None:
        """The body stayed open for the whole grace after the ``finish_reason``: warn when the
        usage the request asked for never came (the answer ends without it, its counts unknown,
        0, as for malformed usage)."""
        self._no_usage("within the end grace after the finish_reason")

    def at_eof(self) -> list[StreamEvent] | None:
        """The end of a body that stopped cleanly without ``[DONE]``: complete once a
        ``finish_reason`` came (TGI before 2.2, ik_llama.cpp end there), else None (cut); a
        usage asked for that never came is warned of, as when the grace ends the body."""
        if self._finish is None:
            return None
        self._no_usage("before the body ended after the finish_reason")
        return self._end()

    def _no_usage(self, when: str) -> None:
        """Warn, once, that the usage the request asked for (``include_usage``) did not come ``when``."""
        if self._usage_asked and self._usage is None:
            self._usage_asked = False  # warned: the grace's end is followed by `at_eof`
            log.warning(
                "openai chat stream: no usage came %s, though include_usage asked for it; the answer "
                "ends without it (its token counts unknown, 0)",
                when,
            )

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
        reason = _FINISH.get(self._finish or "stop", self._finish)
        started = self._close_calls(out, reason in CUT_BY)
        if self._details:  # kept in a block of its own, to go back on this message
            kept = {"type": REASONING_DETAILS, REASONING_DETAILS: self._details}
            out.append(StreamSignature(self._next, json.dumps(kept, separators=(",", ":")), self.origin))
            out.append(StreamBlockStop(self._next))
            self._next += 1
        if started and reason not in CUT_BY:  # a stop that cut the output wherever it was
            # Some servers say "stop" after a tool call; but a call cut by the token limit
            # (or a filter) is not one the model finished, and the host is told why.
            reason = "tool_use"
        elif self._refusal:
            reason = "refusal"
        self.done = True
        out.append(StreamEnd(reason, self._usage, self.response_id))
        return out

    def _close_calls(self, out: list[StreamEvent], cut: bool) -> bool:
        """Stop every tool call at the end of the stream; True if there was one. A call whose
        arguments came but whose name never did is started then, with no name: dropped, its
        turn would end as if nothing were called; kept, it is answered with an unknown-tool
        error the model can act on."""
        started = False
        for call in self._calls.values():
            if call.held >= 0:
                self._settle(call, out, cut)
            if not call.started and call.pending:
                call.started = True
                call.id = call.id or _fresh_id()
                out.append(StreamToolUseStart(call.block, call.id, ""))
                out.extend(StreamToolInput(call.block, p) for p in call.pending)
            if call.started:
                started = True
                out.append(StreamBlockStop(call.block))
        return started


#: The fragments of a call in cumulative mode are joined to check only while that is at most
#: this many times the last one, plus `_JOINED_MIN` characters.
_JOINED = 4
_JOINED_MIN = 4096


def _resent(call: _Call, redactor: Redactor | None) -> None:
    """Warn that ``call`` was sent whole again and read as a resend: one call."""
    log.warning(
        "openai chat stream: tool call %s (%s) sent its whole arguments again; read as a resend, one call "
        "(two identical calls would need ids of their own)", _quoted(call.id, redactor), _quoted(call.name, redactor),
    )


def _quoted(value: str, redactor: Redactor | None) -> str:
    """The repr of ``value``, a server's, for a warning: the request's secrets taken out of it (a
    server or a proxy may echo the key anywhere)."""
    text = repr(value)
    return redactor.scrub(text) if redactor is not None else text


def _after_placeholder(text: str) -> str | None:
    """The arguments after a leading ``{}`` placeholder (gateways in front of Gemini send one,
    then the call's arguments whole): ``text`` less the placeholder when what follows it is one
    whole JSON object, else None. Only for ``text`` that is not valid JSON: arguments that are,
    or a beginning of such arguments, never hold more after a leading ``{}`` than whitespace.
    What follows may not be ``{}`` again: that is a repeat (`_Call.arguments` reads those)."""
    head = text.lstrip()
    if head[:2] != "{}":
        return None
    rest = head[2:].strip()
    if rest[:1] != "{" or rest == "{}":
        return None
    try:
        value = loads(rest)
    except ValueError:
        return None
    return rest if type(value) is dict else None


def _valid(text: str) -> bool:
    """Whether ``text`` is valid JSON (as a call's arguments are once complete)."""
    try:
        loads(text)
    except ValueError:
        return False
    return True


def _finish_reason(value: Any, before: str | None, redactor: Redactor | None = None) -> str:
    """A choice's finish reason as this mapping reads it: lowered (Gemini's ``STOP``,
    ``MAX_TOKENS``, which gateways pass on). One it does not know is kept as it came (the answer
    ends with it as its stop reason), with a warning, once a response (not again on the chunks
    after it that repeat it, ``before``); one that is not a string is a `StreamProtocolError`
    (not retryable: the server would send it again)."""
    if type(value) is not str:
        raise StreamProtocolError(
            f"openai chat stream: the finish_reason is not a string: {excerpt(json.dumps(value))}"
        )
    reason = value.lower()
    if reason != before and not _known(reason):
        log.warning(
            "openai chat stream: finish_reason %s is not one this library knows; the answer ends with "
            "it as its stop reason", _quoted(value, redactor),
        )
    return reason


def _known(finish: str) -> bool:
    """Whether ``finish`` (lowered) is a finish reason this mapping knows: one it does not know is
    quoted only in the warning about it (`_finish_reason`), where the request's secrets are taken
    out of it as it came."""
    return finish in _FINISH or finish in _CUT_FINISH or finish == "error"


def _named(finish: str) -> str:
    """``finish`` (lowered) as a warning names it: quoted when it is one this mapping knows; one it
    does not know is quoted only in the warning about it (`_known`)."""
    return repr(finish) if _known(finish) else "(one this library does not know)"


#: The fewest characters a text sent whole again after a ``finish_reason`` has to have to be read
#: as a resend (`ChatMapper._unresent`): a shorter one may well be the model's next piece.
_RESEND_MIN = 16

#: The fields of a delta that bring output.
_OUTPUT = ("content", "refusal", "reasoning", "reasoning_content", "tool_calls")


def _has_output(delta: dict[str, Any]) -> bool:
    """Whether ``delta`` brings output (text, reasoning, a refusal, a tool call's piece)."""
    return any(delta.get(k) for k in _OUTPUT)


def _late_delta(delta: dict[str, Any], finish: str) -> bool:
    """Warn of a delta with output that came after the answer's ``finish`` (it is left out of
    the answer, as a stream ended there would have it); whether it had any."""
    late = [k for k in _OUTPUT if delta.get(k)]
    if late:
        log.warning(
            "openai chat stream: the server sent %s after its finish_reason %s; left out of the answer",
            " and ".join(late), _named(finish),
        )
    return bool(late)


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
