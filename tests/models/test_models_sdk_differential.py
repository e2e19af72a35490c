"""Differential property tests: agentloop's streaming adapters vs the official SDKs.

For each API, hypothesis builds a random but protocol-valid stream (WIRE.md §1
Anthropic Messages, §2 Chat Completions, §3 Responses): a few text / thinking /
redacted-thinking / reasoning-summary / tool-call blocks (and Anthropic web
search calls with their results), text with arbitrary
unicode (emoji, CJK, newlines, quotes, backslashes, U+2028, NUL), tool
arguments serialized from random nested JSON values (ASCII-escaped or raw,
compact, spaced or indented) and split into fragments at random characters
(so also inside ``\\uXXXX`` escapes and between surrogate-pair escapes), empty
deltas where the protocol allows them, usage, and stop reasons. The stream is
serialized as SSE (``\\n``, ``\\r\\n`` or ``\\r`` line ends, with or without
the space after ``data:``, optional comment lines), cut into random byte
chunks (also inside multi-byte UTF-8 sequences; or one line per chunk; or
fixed sizes down to one byte), and the same chunks are fed through mock
transports to agentloop (`AnthropicModel`, `OpenAIChatModel`,
`OpenAIResponsesModel` + `Accumulator`) and to the official SDK's own stream
accumulator (``anthropic`` ``messages.stream().get_final_message()``,
``openai`` ``chat.completions.stream().get_final_completion()`` and
``responses.stream().get_final_response()``; the installed SDKs use ``httpx2``).

The final summaries must be equal: concatenated text, thinking text (and, for
Anthropic, the signatures, redacted blocks and server tool blocks; for Responses, the saved
reasoning items), tool calls as (id, name, parsed input, input error), stop
reason (the SDK's finish reason mapped the way agentloop documents it), usage
and response id. Both must also equal what the generator put in the stream, so
a generator bug cannot pass as agreement.

``test_responses_summary_parts_that_stream_nothing`` pins the one
disagreement found this way, now fixed: a reasoning summary part that streamed
no delta (or only empty ones) gave the item's thinking text a different shape
than the same item sent whole in ``output_item.done``.

Known SDK-side facts the generator respects (not agentloop bugs):

- Responses: ``get_final_response()`` is built from the ``response.completed``
  payload, not from the deltas, so the generator makes every ``.done`` payload
  and the completed ``output`` consistent with the deltas; only
  ``response.completed`` ends a stream the SDK accepts.
- Chat: the SDK concatenates every string field of a delta (``id``,
  ``function.name``), so as OpenAI does, they are sent only in a call's first
  delta; arguments are never empty (OpenAI sends at least ``{}``).
- Anthropic: one ``message_delta`` (the SDK overwrites ``stop_reason`` with
  each one, even with null); usage counts are cumulative, so never decrease.
"""

from __future__ import annotations

import asyncio
import itertools
import json
from collections.abc import AsyncIterator, Callable, Iterable, Sequence
from dataclasses import dataclass
from typing import Any

import anthropic
import httpx2
import openai
import pytest
from _models_support import API_KEY, MockServer, collect, split
from hypothesis import given, note, settings
from hypothesis import strategies as st
from hypothesis.control import currently_in_test_context

from agentloop._accumulate import Accumulator
from agentloop._messages import ProviderBlock, RedactedThinkingBlock, TextBlock, ThinkingBlock
from agentloop.models import AnthropicModel, OpenAIChatModel, OpenAIResponsesModel

MAX_EXAMPLES = 150

# -- values ------------------------------------------------------------------------------

_SPECIAL = [
    "😀",
    "👩\u200d💻",
    "漢字",
    "한국어",
    "é",
    "\n",
    "\r\n",
    "\r",
    '"',
    "\\",
    "\t",
    "\u2028",
    "\x85",
    "\x00",
    "\\u00e9",
    "\\n",
    "data: x",
    "\n\n",
    "event: y",
    "{",
    "}",
    "[DONE]",
]
texts = st.lists(
    st.sampled_from(_SPECIAL) | st.text(st.characters(codec="utf-8"), max_size=4), max_size=4
).map("".join)
scalars = (
    st.none()
    | st.booleans()
    | st.integers(-(2**63), 2**63 - 1)
    | st.floats(allow_nan=False, allow_infinity=False)
    | texts
)
json_values = st.recursive(
    scalars, lambda kids: st.lists(kids, max_size=3) | st.dictionaries(texts, kids, max_size=3), max_leaves=6
)
tool_inputs = st.dictionaries(texts, json_values, max_size=4)
idents = st.text("abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789", min_size=1, max_size=24)
tool_names = st.from_regex(r"[A-Za-z_][A-Za-z0-9_-]{0,15}", fullmatch=True)
deltas = st.lists(texts, max_size=4)
tokens = st.integers(0, 10_000)
_JSON_STYLES: list[dict[str, Any]] = [{}, {"separators": (",", ":")}, {"indent": 1}, {"indent": "\t"}]


def canon(value: Any) -> str:
    """A strict comparable form of a JSON value (types, key order and -0.0 kept)."""
    return json.dumps(value, ensure_ascii=False)


@st.composite
def arguments(draw: st.DrawFn, value: dict[str, Any]) -> str:
    """``value`` serialized the way a model might (whitespace and escaping vary)."""
    style = draw(st.sampled_from(_JSON_STYLES))
    return json.dumps(value, ensure_ascii=draw(st.booleans()), **style)


@st.composite
def fragments(draw: st.DrawFn, text: str, *, empty: bool = True) -> list[str]:
    """``text`` cut at random characters, biased to the inside of ``\\uXXXX`` escapes;
    ``empty`` allows empty fragments (repeated cut points)."""
    escapes = [i + k for i in range(len(text)) if text[i] == "\\" for k in range(1, 6)]
    points = st.integers(0, len(text))
    if escapes:
        points = points | st.sampled_from([p for p in escapes if p <= len(text)])
    cuts = sorted(draw(st.lists(points, max_size=6)))
    edges = [0, *cuts, len(text)]
    pieces = [text[a:b] for a, b in itertools.pairwise(edges)]
    return pieces if empty else [p for p in pieces if p] or [text]


# -- SSE ---------------------------------------------------------------------------------


@dataclass(frozen=True)
class Wire:
    """How one stream is put on the wire."""

    eol: str
    ensure_ascii: bool
    compact: bool
    space: bool
    comments: frozenset[int]

    def encode(self, events: Sequence[tuple[str | None, Any]]) -> bytes:
        out: list[str] = []
        sep = (",", ":") if self.compact else (", ", ": ")
        lead = " " if self.space else ""
        for n, (name, data) in enumerate(events):
            if n in self.comments:
                out.append(": keep-alive" + self.eol)
            if name is not None:
                out.append(f"event:{lead}{name}{self.eol}")
            text = (
                data
                if isinstance(data, str)
                else json.dumps(data, ensure_ascii=self.ensure_ascii, separators=sep)
            )
            out.append(f"data:{lead}{text}{self.eol}{self.eol}")
        return "".join(out).encode()


wires = st.builds(
    Wire,
    eol=st.sampled_from(["\n", "\n", "\r\n", "\r"]),
    ensure_ascii=st.booleans(),
    compact=st.booleans(),
    space=st.booleans(),
    comments=st.frozensets(st.integers(0, 40), max_size=3),
)


@dataclass(frozen=True)
class Case:
    """A generated stream: its bytes, and the summary both parsers must produce."""

    body: bytes
    expected: dict[str, Any]


@st.composite
def chunkings(draw: st.DrawFn, body: bytes) -> list[bytes]:
    """``body`` cut into chunks: at random bytes (biased to the inside of multi-byte
    UTF-8 characters), one SSE line per chunk, or a fixed size down to one byte."""
    mode = draw(st.sampled_from(["random", "random", "random", "lines", "fixed"]))
    if mode == "fixed":
        size = draw(st.integers(1, 16))
        return [body[i : i + size] for i in range(0, len(body), size)]
    if mode == "lines":
        cuts = [
            i + 1 for i in range(len(body) - 1) if body[i : i + 1] in b"\n\r" and body[i + 1] not in b"\n"
        ]
        return split(body, cuts)
    cuts = draw(st.lists(st.integers(1, len(body) - 1), max_size=40))
    inside = [i for i in range(1, len(body)) if 0x80 <= body[i] < 0xC0]
    if inside:
        cuts += draw(st.lists(st.sampled_from(inside), max_size=12))
    return split(body, cuts)


# -- Anthropic Messages --------------------------------------------------------------------


@st.composite
def anthropic_cases(draw: st.DrawFn) -> Case:
    msg_id = "msg_" + draw(idents)
    start_usage: dict[str, Any] = {"input_tokens": draw(tokens), "output_tokens": draw(st.integers(0, 5))}
    for key in ("cache_creation_input_tokens", "cache_read_input_tokens"):
        if draw(st.booleans()):
            start_usage[key] = draw(tokens)
    events: list[tuple[str | None, Any]] = [
        (
            "message_start",
            {
                "type": "message_start",
                "message": {
                    "id": msg_id,
                    "type": "message",
                    "role": "assistant",
                    "content": [],
                    "model": "claude-x",
                    "stop_reason": None,
                    "stop_sequence": None,
                    "usage": start_usage,
                },
            },
        ),
    ]
    kinds = draw(st.lists(st.sampled_from(["thinking", "thinking", "redacted"]), max_size=2))
    kinds += draw(st.lists(st.sampled_from(["text", "tool", "server"]), max_size=4))
    if kinds.count("tool") > 3:
        kinds = [k for k in kinds if k != "tool"] + ["tool"] * 3
    text: list[str] = []
    thinking: list[str] = []
    signatures: list[str] = []
    redacted: list[str] = []
    tools: list[tuple[str, str, str, None]] = []
    server: list[dict[str, Any]] = []  # server tool blocks, as the SDK's to_dict() gives them

    def delta(index: int, d: dict[str, Any]) -> tuple[str, Any]:
        return ("content_block_delta", {"type": "content_block_delta", "index": index, "delta": d})

    index = -1
    for kind in kinds:
        index += 1
        block: dict[str, Any]
        body: list[tuple[str, Any]] = []
        if kind == "thinking":
            block = {"type": "thinking", "thinking": "", "signature": ""}
            parts = draw(deltas)
            # Normally one signature_delta; a later one replaces the earlier (as the SDK does).
            sent = draw(
                st.lists(
                    st.text("ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/=", max_size=40),
                    min_size=1,
                    max_size=2,
                )
            )
            body = [delta(index, {"type": "thinking_delta", "thinking": p}) for p in parts]
            body += [delta(index, {"type": "signature_delta", "signature": sig}) for sig in sent]
            thinking.append("".join(parts))
            signatures.append(sent[-1])
        elif kind == "redacted":
            data = draw(
                st.text("ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/=", min_size=1)
            )
            block = {"type": "redacted_thinking", "data": data}
            redacted.append(data)
        elif kind == "text":
            block = {"type": "text", "text": ""}
            parts = draw(deltas)
            body = [delta(index, {"type": "text_delta", "text": p}) for p in parts]
            text.append("".join(parts))
        elif kind == "server":  # a web search: its call streams its input, its result comes whole
            call_id, value = f"srvtoolu_{index}{draw(idents)}", draw(tool_inputs)
            block = {"type": "server_tool_use", "id": call_id, "name": "web_search", "input": {}}
            pieces = [""] if not value and draw(st.booleans()) else draw(fragments(draw(arguments(value))))
            body = [delta(index, {"type": "input_json_delta", "partial_json": p}) for p in pieces]
            result = {"type": "web_search_tool_result", "tool_use_id": call_id, "content": [
                {"type": "web_search_result", "title": draw(texts), "url": "https://example.com/",
                 "encrypted_content": "Ev0D", "page_age": None}]}  # fmt: skip
            server += [{**block, "input": value}, result]
            events.append(("content_block_start", {"type": "content_block_start", "index": index, "content_block": block}))
            events.extend(body)
            events.append(("content_block_stop", {"type": "content_block_stop", "index": index}))
            index += 1
            block, body = result, []
        else:
            call_id, name, value = f"toolu_{index}{draw(idents)}", draw(tool_names), draw(tool_inputs)
            block = {"type": "tool_use", "id": call_id, "name": name, "input": {}}
            if not value and draw(st.booleans()):
                pieces = [""]  # a tool without arguments: no JSON at all
            else:
                pieces = draw(fragments(draw(arguments(value))))
                if draw(st.booleans()):
                    pieces.insert(0, "")  # the usual empty first fragment
            body = [delta(index, {"type": "input_json_delta", "partial_json": p}) for p in pieces]
            tools.append((call_id, name, canon(value), None))
        events.append(
            ("content_block_start", {"type": "content_block_start", "index": index, "content_block": block})
        )
        events.extend(body)
        events.append(("content_block_stop", {"type": "content_block_stop", "index": index}))

    if tools:
        stop = "tool_use"
    else:
        stop = draw(st.sampled_from(["end_turn", "max_tokens", "stop_sequence", "refusal", "pause_turn"]))
    end_usage: dict[str, Any] = {"output_tokens": start_usage["output_tokens"] + draw(tokens)}
    final = dict(start_usage, output_tokens=end_usage["output_tokens"])
    for key in ("input_tokens", "cache_creation_input_tokens", "cache_read_input_tokens"):
        choice = draw(st.sampled_from(["absent", "null", "value"]))
        if choice == "null":
            end_usage[key] = None
        elif choice == "value":
            end_usage[key] = final[key] = start_usage.get(key, 0) + draw(st.integers(0, 5))
    events.append(
        (
            "message_delta",
            {
                "type": "message_delta",
                "delta": {"stop_reason": stop, "stop_sequence": "###" if stop == "stop_sequence" else None},
                "usage": end_usage,
            },
        )
    )
    events.append(("message_stop", {"type": "message_stop"}))
    for _ in range(draw(st.integers(0, 2))):  # pings anywhere after message_start
        events.insert(draw(st.integers(1, len(events) - 1)), ("ping", {"type": "ping"}))

    expected = {
        "text": "".join(text),
        "thinking": "".join(thinking),
        "signatures": signatures,
        "redacted": redacted,
        "tools": tools,
        "server": server,
        "stop": stop,
        "usage": (  # agentloop's input_tokens counts the cached prompt too, as OpenAI's do
            final["input_tokens"] + final.get("cache_read_input_tokens", 0) + final.get("cache_creation_input_tokens", 0),
            final["output_tokens"],
            final.get("cache_read_input_tokens", 0),
            final.get("cache_creation_input_tokens", 0),
        ),
        "id": msg_id,
    }
    return Case(draw(wires).encode(events), expected)


def anthropic_sdk_summary(final: Any) -> dict[str, Any]:
    blocks = final.content
    u = final.usage
    return {
        "text": "".join(b.text for b in blocks if b.type == "text"),
        "thinking": "".join(b.thinking for b in blocks if b.type == "thinking"),
        "signatures": [b.signature for b in blocks if b.type == "thinking"],
        "redacted": [b.data for b in blocks if b.type == "redacted_thinking"],
        "tools": [(b.id, b.name, canon(b.input), None) for b in blocks if b.type == "tool_use"],
        "server": [b.to_dict() for b in blocks if b.type in ("server_tool_use", "web_search_tool_result")],
        "stop": final.stop_reason,
        "usage": (
            u.input_tokens + (u.cache_read_input_tokens or 0) + (u.cache_creation_input_tokens or 0),
            u.output_tokens,
            u.cache_read_input_tokens or 0,
            u.cache_creation_input_tokens or 0,
        ),
        "id": final.id,
    }


def anthropic_ours_summary(acc: Accumulator) -> dict[str, Any]:
    summary = ours_summary(acc)
    content = acc.message().content
    summary["signatures"] = [b.signature for b in content if isinstance(b, ThinkingBlock)]
    summary["redacted"] = [b.data for b in content if isinstance(b, RedactedThinkingBlock)]
    summary["server"] = [b.data for b in content if isinstance(b, ProviderBlock)]
    return summary


# -- OpenAI Chat Completions ---------------------------------------------------------------

_CHAT_FINISH = {
    "stop": "end_turn",
    "tool_calls": "tool_use",
    "length": "max_tokens",
    "content_filter": "refusal",
}


@st.composite
def chat_cases(draw: st.DrawFn) -> Case:
    chat_id = "chatcmpl-" + draw(idents)
    null_usage = draw(st.booleans())  # with include_usage, OpenAI may send "usage": null on every chunk

    def chunk(delta: dict[str, Any] | None, finish: str | None = None) -> tuple[None, dict[str, Any]]:
        obj: dict[str, Any] = {
            "id": chat_id,
            "object": "chat.completion.chunk",
            "created": 1727346178,
            "model": "gpt-x",
            "system_fingerprint": "fp_x",
        }
        if delta is not None:
            obj["choices"] = [{"index": 0, "delta": delta, "logprobs": None, "finish_reason": finish}]
        if null_usage:
            obj["usage"] = None
        return (None, obj)

    first: dict[str, Any] = {"role": "assistant", "content": draw(st.sampled_from([None, ""]))}
    if draw(st.booleans()):
        first["refusal"] = None
    events: list[tuple[None, Any]] = [chunk(first)]
    parts = draw(deltas)
    events += [chunk({"content": p}) for p in parts]

    tools: list[tuple[str, str, str, None]] = []
    per_call: list[list[dict[str, Any]]] = []
    for i in range(draw(st.integers(0, 3))):
        call_id, name, value = f"call_{i}{draw(idents)}", draw(tool_names), draw(tool_inputs)
        pieces = draw(fragments(draw(arguments(value))))
        head = {
            "index": i,
            "id": call_id,
            "type": "function",
            "function": {"name": name, "arguments": "" if draw(st.booleans()) else pieces.pop(0)},
        }
        per_call.append([head] + [{"index": i, "function": {"arguments": p}} for p in pieces])
        tools.append((call_id, name, canon(value), None))
    # Parallel calls: fragments of different calls may interleave (each call's own order
    # kept, and each call starts after the previous one started), and one chunk may carry
    # several entries.
    entries: list[dict[str, Any]] = []
    pending = [list(c) for c in per_call]
    started = 0
    while any(pending):
        choices = [n for n, c in enumerate(pending) if c and n <= started]
        n = draw(st.sampled_from(choices))
        entries.append(pending[n].pop(0))
        started = max(started, n + 1)
    while entries:
        take = draw(st.integers(1, min(3, len(entries))))
        events.append(chunk({"tool_calls": entries[:take]}))
        entries = entries[take:]

    finish = "tool_calls" if tools else draw(st.sampled_from(["stop", "length", "content_filter"]))
    events.append(chunk({}, finish))
    usage = (0, 0, 0, 0)
    if draw(st.booleans()):
        prompt, completion = draw(tokens), draw(tokens)
        raw: dict[str, Any] = {
            "prompt_tokens": prompt,
            "completion_tokens": completion,
            "total_tokens": prompt + completion,
        }
        cached = 0
        if draw(st.booleans()):
            cached = draw(tokens)
            raw["prompt_tokens_details"] = {"cached_tokens": cached}
        _, last = chunk(None)
        events.append((None, dict(last, choices=[], usage=raw)))
        usage = (prompt, completion, cached, 0)
    events.append((None, "[DONE]"))  # the one data line that is not JSON

    expected = {
        "text": "".join(parts),
        "thinking": "",
        "tools": tools,
        "stop": _CHAT_FINISH[finish],
        "usage": usage,
        "id": chat_id,
    }
    return Case(draw(wires).encode(events), expected)


def chat_sdk_summary(final: Any) -> dict[str, Any]:
    choice = final.choices[0]
    calls = choice.message.tool_calls or []
    u = final.usage
    details = u.prompt_tokens_details if u is not None else None
    return {
        "text": choice.message.content or "",
        "thinking": "",
        "tools": [(c.id, c.function.name, canon(json.loads(c.function.arguments)), None) for c in calls],
        # agentloop maps finish reasons as documented in openai_chat._FINISH, and says
        # "tool_use" whenever a tool call was streamed.
        "stop": "tool_use" if calls else _CHAT_FINISH[choice.finish_reason],
        "usage": (0, 0, 0, 0)
        if u is None
        else (
            u.prompt_tokens,
            u.completion_tokens,
            (details.cached_tokens if details else 0) or 0,
            0,
        ),
        "id": final.id,
    }


# -- OpenAI Responses ----------------------------------------------------------------------


def _summary_events(events: list[dict[str, Any]], ref: dict[str, Any], parts: list[list[str]]) -> list[Any]:
    """Append the events of a reasoning item's summary parts (part ``s`` streams the deltas
    ``parts[s]``) to ``events``; return the summary the item ends with."""
    summary = []
    for s, deltas in enumerate(parts):
        part, full = {"type": "summary_text", "text": ""}, "".join(deltas)
        events.append(
            {"type": "response.reasoning_summary_part.added", **ref, "summary_index": s, "part": part}
        )
        events += [
            {"type": "response.reasoning_summary_text.delta", **ref, "summary_index": s, "delta": d}
            for d in deltas
        ]
        events.append(
            {"type": "response.reasoning_summary_text.done", **ref, "summary_index": s, "text": full}
        )
        part_done = {"type": "response.reasoning_summary_part.done", **ref, "summary_index": s}
        events.append({**part_done, "part": dict(part, text=full)})
        summary.append(dict(part, text=full))
    return summary


@st.composite
def responses_cases(draw: st.DrawFn, shape: str = "openai") -> Case:
    """A Responses stream as OpenAI sends it; ``shape="llama.cpp"``: without ``output_index``,
    and function call items without an ``id`` (their deltas name them by ``call_id``), as
    llama.cpp's emulation sends them (WIRE.md §5); ``shape="sparse"``: what a gateway forwards
    when it stops forwarding the item events at some point, or never forwards the final copies
    (``.done`` events), before ``response.completed``, whose ``output`` is whole."""
    resp_id = "resp_" + draw(idents)
    response: dict[str, Any] = {
        "id": resp_id,
        "object": "response",
        "created_at": 1749896124,
        "status": "in_progress",
        "background": False,
        "error": None,
        "incomplete_details": None,
        "instructions": None,
        "max_output_tokens": None,
        "model": "gpt-x",
        "output": [],
        "parallel_tool_calls": True,
        "previous_response_id": None,
        "reasoning": {"effort": None, "summary": None},
        "service_tier": "auto",
        "store": True,
        "temperature": 1.0,
        "text": {"format": {"type": "text"}},
        "tool_choice": "auto",
        "tools": [],
        "top_p": 1.0,
        "truncation": "disabled",
        "usage": None,
        "user": None,
        "metadata": {},
    }
    events: list[dict[str, Any]] = [{"type": "response.created", "response": response}]
    if draw(st.booleans()):
        events.append({"type": "response.in_progress", "response": response})
    kinds = draw(st.lists(st.sampled_from(["reasoning", "message", "function_call"]), max_size=4))
    if kinds.count("function_call") > 3:
        kinds = [k for k in kinds if k != "function_call"] + ["function_call"] * 3
    done_items: list[dict[str, Any]] = []
    text: list[str] = []
    thinking: list[str] = []
    reasoning: list[dict[str, Any]] = []
    tools: list[tuple[str, str, str, None]] = []

    for k, kind in enumerate(kinds):
        ref: dict[str, Any] = {"output_index": k}
        if kind == "reasoning":
            item_id = f"rs_{k}{draw(idents)}"
            ref["item_id"] = item_id
            events.append(
                {
                    "type": "response.output_item.added",
                    **ref,
                    "item": {"id": item_id, "type": "reasoning", "summary": []},
                }
            )
            # A summary part streams any number of deltas (also none, or only empty ones).
            summary = _summary_events(events, ref, draw(st.lists(st.lists(texts, max_size=3), max_size=3)))
            item: dict[str, Any] = {"id": item_id, "type": "reasoning", "summary": summary}
            if draw(st.booleans()):
                item["encrypted_content"] = "gAAAA" + draw(idents)
            thinking.append(_joined(p["text"] for p in summary))
            reasoning.append(item)
        elif kind == "message":
            item_id = f"msg_{k}{draw(idents)}"
            ref["item_id"] = item_id
            events.append(
                {
                    "type": "response.output_item.added",
                    **ref,
                    "item": {
                        "id": item_id,
                        "type": "message",
                        "status": "in_progress",
                        "content": [],
                        "role": "assistant",
                    },
                }
            )
            content = []
            for c, parts in enumerate(draw(st.lists(deltas, min_size=1, max_size=2))):
                full = "".join(parts)
                part = {"type": "output_text", "annotations": [], "text": ""}
                cref = {**ref, "content_index": c}
                events.append({"type": "response.content_part.added", **cref, "part": part})
                events += [
                    {"type": "response.output_text.delta", **cref, "delta": p, "logprobs": []} for p in parts
                ]
                events.append({"type": "response.output_text.done", **cref, "text": full, "logprobs": []})
                events.append({"type": "response.content_part.done", **cref, "part": dict(part, text=full)})
                content.append(dict(part, text=full))
                text.append(full)
            item = {
                "id": item_id,
                "type": "message",
                "status": "completed",
                "content": content,
                "role": "assistant",
            }
        else:
            suffix = f"{k}{draw(idents)}"
            item_id, call_id = f"fc_{suffix}", f"call_{suffix}"
            name, value = draw(tool_names), draw(tool_inputs)
            args = draw(arguments(value))
            ref["item_id"] = item_id
            added = {
                "id": item_id,
                "type": "function_call",
                "status": "in_progress",
                "arguments": "",
                "call_id": call_id,
                "name": name,
            }
            events.append({"type": "response.output_item.added", **ref, "item": added})
            events += [
                {"type": "response.function_call_arguments.delta", **ref, "delta": p}
                for p in draw(fragments(args))
            ]
            events.append({"type": "response.function_call_arguments.done", **ref, "arguments": args})
            item = dict(added, status="completed", arguments=args)
            tools.append((call_id, name, canon(value), None))
        events.append({"type": "response.output_item.done", "output_index": k, "item": item})
        done_items.append(item)

    if shape == "llama.cpp":
        for ev in events:
            ev.pop("output_index", None)
            item = ev.get("item")
            if isinstance(item, dict) and item["type"] == "function_call":
                ev["item"] = {k: v for k, v in item.items() if k != "id"}
                done_items[:] = [ev["item"] if d is item else d for d in done_items]
            if str(ev.get("item_id")).startswith("fc_"):
                ev["item_id"] = "call_" + ev["item_id"][len("fc_") :]
    if shape == "sparse":
        head = 2 if len(events) > 1 and events[1]["type"] == "response.in_progress" else 1
        if draw(st.booleans(), label="no final copies"):
            events = [ev for ev in events if not ev["type"].endswith(".done")]
        events = events[: draw(st.integers(head, len(events)), label="forwarded until")]
    usage = (draw(tokens), draw(tokens), draw(tokens))
    completed = dict(
        response,
        status="completed",
        output=done_items,
        usage={
            "input_tokens": usage[0],
            "input_tokens_details": {"cached_tokens": usage[2]},
            "output_tokens": usage[1],
            "output_tokens_details": {"reasoning_tokens": 0},
            "total_tokens": usage[0] + usage[1],
        },
    )
    events.append({"type": "response.completed", "response": completed})
    for n, ev in enumerate(events):
        ev["sequence_number"] = n

    expected = {
        "text": "".join(text),
        "thinking": "".join(thinking),
        "reasoning": [
            {
                "id": r["id"],
                "summary": r["summary"],
                **({"encrypted_content": r["encrypted_content"]} if "encrypted_content" in r else {}),
            }
            for r in reasoning
        ],
        "tools": tools,
        "stop": "tool_use" if tools else "end_turn",
        "usage": (*usage, 0),
        "id": resp_id,
    }
    return Case(draw(wires).encode([(ev["type"], ev) for ev in events]), expected)


def _joined(parts: Iterable[str]) -> str:
    """agentloop's thinking text for one reasoning item: non-empty parts, a blank line between two."""
    return "\n\n".join(p for p in parts if p)


def responses_sdk_summary(final: Any) -> dict[str, Any]:
    items = final.output
    u = final.usage
    saved = []
    for i in items:
        if i.type == "reasoning":
            entry: dict[str, Any] = {"id": i.id, "summary": [s.to_dict() for s in i.summary]}
            if i.encrypted_content:
                entry["encrypted_content"] = i.encrypted_content
            saved.append(entry)
    calls = [
        (i.call_id, i.name, canon(json.loads(i.arguments)), None) for i in items if i.type == "function_call"
    ]
    return {
        "text": "".join(
            c.text for i in items if i.type == "message" for c in i.content if c.type == "output_text"
        ),
        # agentloop's convention: one thinking block per reasoning item, its non-empty
        # summary parts joined by a blank line
        "thinking": "".join(_joined(s.text for s in i.summary) for i in items if i.type == "reasoning"),
        "reasoning": saved,
        "tools": calls,
        "stop": "tool_use" if calls else "end_turn",
        "usage": (u.input_tokens, u.output_tokens, u.input_tokens_details.cached_tokens or 0, 0),
        "id": final.id,
    }


def responses_ours_summary(acc: Accumulator) -> dict[str, Any]:
    summary = ours_summary(acc)
    # the reasoning item agentloop keeps (in the signature) to send back next turn, to the server
    # its block's origin names only
    blocks = [b for b in acc.message().content if isinstance(b, ThinkingBlock)]
    assert all(b.origin == "https://api.openai.com/v1" for b in blocks)
    saved = [json.loads(b.signature) for b in blocks]
    summary["reasoning"] = saved
    return summary


# -- running both --------------------------------------------------------------------------


def ours_summary(acc: Accumulator) -> dict[str, Any]:
    msg = acc.message()
    u = acc.usage
    return {
        "text": "".join(b.text for b in msg.content if isinstance(b, TextBlock)),
        "thinking": "".join(b.thinking for b in msg.content if isinstance(b, ThinkingBlock)),
        "tools": [(t.id, t.name, canon(t.input), t.input_error) for t in msg.tool_uses],
        "stop": acc.stop_reason,
        "usage": (u.input_tokens, u.output_tokens, u.cache_read_tokens, u.cache_write_tokens),
        "id": acc.response_id,
    }


class _Chunks(httpx2.AsyncByteStream):
    def __init__(self, chunks: list[bytes]) -> None:
        self.chunks = chunks

    async def __aiter__(self) -> AsyncIterator[bytes]:
        for c in self.chunks:
            yield c


def _sdk_http(chunks: list[bytes]) -> Any:
    def handler(request: Any) -> Any:
        return httpx2.Response(200, headers={"content-type": "text/event-stream"}, stream=_Chunks(chunks))

    return httpx2.AsyncClient(transport=httpx2.MockTransport(handler))


async def _settle() -> None:
    """Let the event loop finish closing the SDK's abandoned async generators.

    SDK quirk: openai's ``AsyncStream.__stream__`` breaks out of its SSE loop at
    ``[DONE]`` and leaves its nested async generators (``_iter_events``, the SSE
    decoder, httpx2's ``aiter_bytes``) suspended; the loop's asyncgen finalizer
    closes them in tasks, one level per iteration. Yield (never sleep) until they
    are done, so none outlives the test (tests/conftest.py checks).
    """
    me = asyncio.current_task()
    for _ in range(3):  # the finalizer hook creates its task from a call_soon callback
        await asyncio.sleep(0)
    for _ in range(100):
        if all(t is me or t.done() for t in asyncio.all_tasks()):
            return
        await asyncio.sleep(0)


_MSGS: Any = [{"role": "user", "content": "hi"}]


async def anthropic_sdk(chunks: list[bytes]) -> Any:
    async with (
        anthropic.AsyncAnthropic(api_key="x", max_retries=0, http_client=_sdk_http(chunks)) as client,
        client.messages.stream(model="m", max_tokens=16, messages=_MSGS) as s,
    ):
        return await s.get_final_message()


async def chat_sdk(chunks: list[bytes]) -> Any:
    async with (
        openai.AsyncOpenAI(api_key="x", max_retries=0, http_client=_sdk_http(chunks)) as client,
        client.chat.completions.stream(model="m", messages=_MSGS) as s,
    ):
        try:
            return await s.get_final_completion()
        except (openai.LengthFinishReasonError, openai.ContentFilterFinishReasonError) as exc:
            # SDK quirk (openai 3.57.0): get_final_completion() raises for finish_reason
            # "length" and "content_filter" even without strict tools; the error carries
            # the accumulated completion.
            return exc.completion


async def responses_sdk(chunks: list[bytes]) -> Any:
    async with (
        openai.AsyncOpenAI(api_key="x", max_retries=0, http_client=_sdk_http(chunks)) as client,
        client.responses.stream(model="m", input="hi") as s,
    ):
        return await s.get_final_response()


def _note(text: str) -> None:
    """`hypothesis.note` (printed with a falsifying example), also usable outside @given."""
    if currently_in_test_context():
        note(text)


async def differential(
    case: Case,
    chunks: list[bytes],
    model_cls: type[Any],
    ours: Callable[[Accumulator], dict[str, Any]],
    sdk: Callable[[list[bytes]], Any],
    theirs: Callable[[Any], dict[str, Any]],
) -> None:
    _note(f"SSE body: {case.body!r}")
    _note(f"chunk sizes: {[len(c) for c in chunks]}")
    server = MockServer(chunks)
    async with server.client() as client:
        _, acc = await collect(model_cls("m", api_key=API_KEY, http_client=client))
    assert acc.ended
    got = ours(acc)
    want = theirs(await sdk(chunks))
    await _settle()
    _note(f"agentloop: {got!r}")
    _note(f"SDK:       {want!r}")
    assert got == want, "agentloop and the official SDK disagree"
    assert want == case.expected, "the SDK read something else than the generator wrote (generator bug?)"


@settings(max_examples=MAX_EXAMPLES)
@given(case=anthropic_cases(), data=st.data())
async def test_anthropic_agrees_with_sdk(case: Case, data: st.DataObject) -> None:
    chunks = data.draw(chunkings(case.body), label="chunks")
    await differential(
        case, chunks, AnthropicModel, anthropic_ours_summary, anthropic_sdk, anthropic_sdk_summary
    )


@settings(max_examples=MAX_EXAMPLES)
@given(case=chat_cases(), data=st.data())
async def test_openai_chat_agrees_with_sdk(case: Case, data: st.DataObject) -> None:
    chunks = data.draw(chunkings(case.body), label="chunks")
    await differential(case, chunks, OpenAIChatModel, ours_summary, chat_sdk, chat_sdk_summary)


@settings(max_examples=MAX_EXAMPLES)
@given(case=responses_cases(), data=st.data())
async def test_openai_responses_agrees_with_sdk(case: Case, data: st.DataObject) -> None:
    chunks = data.draw(chunkings(case.body), label="chunks")
    await differential(
        case, chunks, OpenAIResponsesModel, responses_ours_summary, responses_sdk, responses_sdk_summary
    )


@settings(max_examples=MAX_EXAMPLES)
@given(case=responses_cases(shape="llama.cpp"), data=st.data())
async def test_openai_responses_without_output_index_reads_as_with_it(case: Case, data: st.DataObject) -> None:
    """The same streams as llama.cpp sends them: no ``output_index``, function calls known by
    ``call_id``. The SDK refuses such a stream (it indexes by ``output_index``); agentloop must
    read what the generator wrote."""
    chunks = data.draw(chunkings(case.body), label="chunks")
    _note(f"SSE body: {case.body!r}")
    server = MockServer(chunks)
    async with server.client() as client:
        _, acc = await collect(OpenAIResponsesModel("m", api_key=API_KEY, http_client=client))
    assert responses_ours_summary(acc) == case.expected


@settings(max_examples=MAX_EXAMPLES)
@given(case=responses_cases(shape="sparse"), data=st.data())
async def test_openai_responses_completed_output_fills_in_what_did_not_stream(
    case: Case, data: st.DataObject
) -> None:
    """The SDK's final response is the ``response.completed`` output: agentloop's message must be
    the same when the item events stop partway, or carry no final copies."""
    chunks = data.draw(chunkings(case.body), label="chunks")
    await differential(
        case, chunks, OpenAIResponsesModel, responses_ours_summary, responses_sdk, responses_sdk_summary
    )


# -- a pinned disagreement -----------------------------------------------------------------


def _reasoning_only(parts: list[list[str]]) -> Case:
    """A Responses stream with one reasoning item whose summary part ``s`` streams the
    deltas ``parts[s]`` (none for ``[]``: valid, the part's text is then "")."""
    created = {
        "id": "resp_1",
        "object": "response",
        "created_at": 1,
        "status": "in_progress",
        "model": "m",
        "output": [],
        "usage": None,
    }
    ref = {"output_index": 0, "item_id": "rs_1"}
    events: list[dict[str, Any]] = [
        {"type": "response.created", "response": created},
        {
            "type": "response.output_item.added",
            **ref,
            "item": {"id": "rs_1", "type": "reasoning", "summary": []},
        },
    ]
    summary = _summary_events(events, ref, parts)
    item = {"id": "rs_1", "type": "reasoning", "summary": summary}
    usage = {
        "input_tokens": 1,
        "input_tokens_details": {"cached_tokens": 0},
        "output_tokens": 1,
        "output_tokens_details": {"reasoning_tokens": 0},
        "total_tokens": 2,
    }
    events.append({"type": "response.output_item.done", "output_index": 0, "item": item})
    events.append(
        {
            "type": "response.completed",
            "response": dict(created, status="completed", output=[item], usage=usage),
        }
    )
    for n, ev in enumerate(events):
        ev["sequence_number"] = n
    wire = Wire(eol="\n", ensure_ascii=False, compact=True, space=True, comments=frozenset())
    expected = {
        "text": "",
        "thinking": _joined("".join(d) for d in parts),
        "reasoning": [{"id": "rs_1", "summary": summary}],
        "tools": [],
        "stop": "end_turn",
        "usage": (1, 1, 0, 0),
        "id": "resp_1",
    }
    return Case(wire.encode([(ev["type"], ev) for ev in events]), expected)


@pytest.mark.parametrize(
    "parts",
    [[[], ["x"]], [["a"], []], [[""], ["x"]], [["a"], [""], ["b", ""]], [["a", "b"], ["c"]]],
    ids=["none-first", "none-last", "empty-delta-first", "empty-middle", "two-parts"],
)
async def test_responses_summary_parts_that_stream_nothing(parts: list[list[str]]) -> None:
    """A reasoning item's thinking is its non-empty summary parts, a blank line between two,
    whether the parts streamed or came whole in ``output_item.done``.

    Before the fix, an item that streamed nothing joined every part, empty ones too
    (``[["a"], []]`` gave ``"a\\n\\n"``), while a streamed item added the blank line on a
    delta whose ``summary_index`` changed, even after a part that had streamed only an
    empty delta (``[[""], ["x"]]`` gave ``"\\n\\nx"``).
    """
    case = _reasoning_only(parts)
    await differential(
        case, [case.body], OpenAIResponsesModel, responses_ours_summary, responses_sdk, responses_sdk_summary
    )
