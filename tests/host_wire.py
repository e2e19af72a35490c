"""Mock Anthropic Messages and OpenAI Responses servers for the host tests.

Each server streams scripted replies shaped like the recorded streams in the wire fixtures, one
SSE event per chunk, and refuses (HTTP 400, with the API's own wording) a request the real API
refuses: a tool call without its result, a result without its call, an empty text, a thinking
block left last, a reasoning item without the item it led to, a wrong key. A reply may stall
after some events, as a slow model does, until the client closes the response.
"""

from __future__ import annotations

import asyncio
import json
import re
from abc import ABC, abstractmethod
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass, field
from typing import Any

import httpx


@dataclass
class Call:
    """A tool call in a scripted reply."""

    name: str
    input: dict[str, Any]
    id: str = ""


@dataclass
class Reply:
    """One scripted reply: text, then tool calls; `stall_after` stops the stream after that many
    content events (deltas) until the client closes it."""

    text: str = ""
    calls: list[Call] = field(default_factory=list)
    thinking: str = ""
    stall_after: int | None = None
    chunk: int = 8
    #: An error event sent (and the stream ended) after `stall_after` deltas instead of stalling.
    error: str | None = None


class _Stream(httpx.AsyncByteStream):
    """A response body of SSE events, one per chunk; records whether the client closed it."""

    def __init__(self, server: _Server, events: list[str], stall_at: int | None, error: str | None) -> None:
        self._server = server
        self._events = events
        self._stall_at = stall_at
        self._error = error
        self.closed = False

    async def __aiter__(self) -> AsyncIterator[bytes]:
        for i, event in enumerate(self._events):
            if i == self._stall_at and self._error is not None:
                yield self._error.encode()
                return
            if i == self._stall_at:
                self._server.stalled.set()
                await asyncio.Event().wait()  # a model that thinks until the client gives up
            yield event.encode()

    async def aclose(self) -> None:
        self.closed = True


class _Server(ABC):
    """What both servers share: the script, the checks, the bookkeeping."""

    def __init__(self, key: str, replies: list[Reply]) -> None:
        self.key = key
        self.replies = list(replies)
        self.bodies: list[dict[str, Any]] = []
        self.rejections: list[str] = []
        self.streams: list[_Stream] = []
        self.stalled = asyncio.Event()
        self.on_request: Callable[[dict[str, Any]], None] | None = None
        self._ids = 0

    def client(self) -> httpx.AsyncClient:
        return httpx.AsyncClient(transport=httpx.MockTransport(self._handle))

    @property
    def open_responses(self) -> int:
        return sum(not s.closed for s in self.streams)

    def next_id(self, prefix: str) -> str:
        self._ids += 1
        return f"{prefix}{self._ids:04d}"

    async def _handle(self, request: httpx.Request) -> httpx.Response:
        body = json.loads(request.content)
        self.bodies.append(body)
        problem = self.check_auth(request) or self.check(body)
        if problem is not None:
            self.rejections.append(problem)
            status = 401 if "key" in problem else 400
            return httpx.Response(status, json=self.error_body(problem))
        if self.on_request is not None:
            self.on_request(body)
        reply = self.replies.pop(0) if self.replies else Reply(text="(no more replies)")
        events, stall_at = self.render(reply)
        error = None if reply.error is None else self.error_event(reply.error)
        stream = _Stream(self, events, stall_at, error)
        self.streams.append(stream)
        return httpx.Response(200, headers={"content-type": "text/event-stream"}, stream=stream)

    @abstractmethod
    def check_auth(self, request: httpx.Request) -> str | None:
        ...

    @abstractmethod
    def check(self, body: dict[str, Any]) -> str | None:
        ...

    @abstractmethod
    def error_body(self, message: str) -> dict[str, Any]:
        ...

    @abstractmethod
    def render(self, reply: Reply) -> tuple[list[str], int | None]:
        ...

    @abstractmethod
    def error_event(self, message: str) -> str:
        ...


def _pieces(text: str, size: int) -> list[str]:
    return [text[i : i + size] for i in range(0, len(text), size)]


def _stall_index(reply: Reply, deltas: list[int]) -> int | None:
    """The index of the event to stall before: after `stall_after` delta events."""
    if reply.stall_after is None:
        return None
    return deltas[reply.stall_after] if reply.stall_after < len(deltas) else None


# -- Anthropic Messages -------------------------------------------------------------------------

_ANTHROPIC_ID = re.compile(r"^[a-zA-Z0-9_-]+$")


def _sse(event: str, data: dict[str, Any]) -> str:
    return f"event: {event}\ndata: {json.dumps(data)}\n\n"


class AnthropicServer(_Server):
    """`POST /v1/messages`, as the recorded anthropic_*.sse streams show it."""

    def check_auth(self, request: httpx.Request) -> str | None:
        if request.headers.get("x-api-key") != self.key:
            return "invalid x-api-key"
        if request.url.path != "/v1/messages":
            return f"no route {request.url.path}"
        return None

    def error_body(self, message: str) -> dict[str, Any]:
        kind = "authentication_error" if "key" in message else "invalid_request_error"
        return {"type": "error", "error": {"type": kind, "message": message}, "request_id": "req_011"}

    def error_event(self, message: str) -> str:
        return _sse("error", {"type": "error", "error": {"type": "overloaded_error", "message": message}})

    def check(self, body: dict[str, Any]) -> str | None:
        if body.get("stream") is not True or not isinstance(body.get("max_tokens"), int):
            return "stream and max_tokens are required"
        messages = body.get("messages")
        if not messages or messages[0]["role"] != "user":
            return "messages: first message must use the user role"
        if messages[-1]["role"] != "user":
            return "Prefilling assistant messages is not supported for this model."
        for n, msg in enumerate(messages):
            problem = self._check_message(n, msg, messages)
            if problem:
                return problem
        if body.get("thinking", {}).get("type") in ("enabled", "adaptive"):
            return self._check_thinking_turn(messages)
        return None

    @staticmethod
    def _check_thinking_turn(messages: list[dict[str, Any]]) -> str | None:
        """With thinking on, a request that answers tool results continues the assistant turn
        that called them, which must start with its thinking."""
        last = messages[-1]["content"]
        if isinstance(last, str) or not any(b["type"] == "tool_result" for b in last):
            return None
        n = len(messages) - 2
        first = messages[n]["content"][0]
        if first["type"] not in ("thinking", "redacted_thinking"):
            return (
                f"messages.{n}.content.0.type: Expected `thinking` or `redacted_thinking`, but found "
                f"`{first['type']}`. When `thinking` is enabled, a final `assistant` message must start "
                "with a thinking block (preceeding the lastmost set of `tool_use` and `tool_result` blocks)."
            )
        return None

    def _check_message(self, n: int, msg: dict[str, Any], messages: list[dict[str, Any]]) -> str | None:
        if n and messages[n - 1]["role"] == msg["role"]:
            return f"messages.{n}: roles must alternate between user and assistant"
        content = msg["content"]
        if isinstance(content, str):
            content = [{"type": "text", "text": content}]
        if not content:
            return f"messages.{n}: all messages must have non-empty content"
        for block in content:
            if block["type"] == "text" and not block["text"].strip():
                return f"messages.{n}: text content blocks must contain non-whitespace text"
            if block["type"] == "thinking" and not block.get("signature"):
                return f"messages.{n}: thinking.signature: Field required"
        if msg["role"] == "assistant" and content[-1]["type"] in ("thinking", "redacted_thinking"):
            return f"messages.{n}: the final block in an assistant message cannot be `thinking`."
        if msg["role"] == "assistant":
            return self._check_calls(n, content, messages)
        return self._check_results(n, content, messages)

    def _check_calls(self, n: int, content: list[dict[str, Any]], messages: list[dict[str, Any]]) -> str | None:
        ids = [b["id"] for b in content if b["type"] == "tool_use"]
        if not ids:
            return None
        if any(not _ANTHROPIC_ID.match(i) for i in ids):
            return f"messages.{n}: tool_use.id: String should match pattern '^[a-zA-Z0-9_-]+$'"
        after = messages[n + 1]["content"] if n + 1 < len(messages) else []
        answered = {b["tool_use_id"] for b in after if isinstance(b, dict) and b["type"] == "tool_result"}
        missing = [i for i in ids if i not in answered]
        if missing:
            return (
                f"messages.{n}: `tool_use` ids were found without `tool_result` blocks immediately "
                f"after: {', '.join(missing)}. Each `tool_use` block must have a corresponding "
                "`tool_result` block in the next message."
            )
        return None

    def _check_results(self, n: int, content: list[dict[str, Any]], messages: list[dict[str, Any]]) -> str | None:
        kinds = [b["type"] for b in content]
        results = [i for i, k in enumerate(kinds) if k == "tool_result"]
        if results and any(k != "tool_result" for k in kinds[: results[-1]]):
            return f"messages.{n}: tool_result blocks must come first"
        before = messages[n - 1]["content"] if n else []
        called = {b["id"] for b in before if isinstance(b, dict) and b["type"] == "tool_use"}
        for block in content:
            if block["type"] == "tool_result" and block["tool_use_id"] not in called:
                return (
                    f"messages.{n}: unexpected `tool_use_id` found in `tool_result` blocks: "
                    f"{block['tool_use_id']}. Each `tool_result` block must have a corresponding "
                    "`tool_use` block in the previous message."
                )
        return None

    def render(self, reply: Reply) -> tuple[list[str], int | None]:
        events = [_sse("message_start", {"type": "message_start", "message": {
            "id": self.next_id("msg_"), "type": "message", "role": "assistant", "model": "claude-opus-4-7",
            "content": [], "stop_reason": None, "stop_sequence": None,
            "usage": {"input_tokens": 472, "output_tokens": 2}}})]
        deltas: list[int] = []
        index = 0
        if reply.thinking:
            index = self._thinking(events, deltas, reply)
        if reply.text:
            events.append(_sse("content_block_start", {"type": "content_block_start", "index": index,
                                                       "content_block": {"type": "text", "text": ""}}))
            events.append(_sse("ping", {"type": "ping"}))
            for piece in _pieces(reply.text, reply.chunk):
                deltas.append(len(events))
                events.append(_sse("content_block_delta", {"type": "content_block_delta", "index": index,
                                                           "delta": {"type": "text_delta", "text": piece}}))
            events.append(_sse("content_block_stop", {"type": "content_block_stop", "index": index}))
            index += 1
        for call in reply.calls:
            self._tool_use(events, deltas, index, call, reply.chunk)
            index += 1
        stop = "tool_use" if reply.calls else "end_turn"
        events.append(_sse("message_delta", {"type": "message_delta",
                                             "delta": {"stop_reason": stop, "stop_sequence": None},
                                             "usage": {"output_tokens": 89}}))
        events.append(_sse("message_stop", {"type": "message_stop"}))
        return events, _stall_index(reply, deltas)

    def _thinking(self, events: list[str], deltas: list[int], reply: Reply) -> int:
        events.append(_sse("content_block_start", {"type": "content_block_start", "index": 0,
                                                   "content_block": {"type": "thinking", "thinking": ""}}))
        for piece in _pieces(reply.thinking, reply.chunk):
            deltas.append(len(events))
            events.append(_sse("content_block_delta", {"type": "content_block_delta", "index": 0,
                                                       "delta": {"type": "thinking_delta", "thinking": piece}}))
        events.append(_sse("content_block_delta", {"type": "content_block_delta", "index": 0,
                                                   "delta": {"type": "signature_delta", "signature": "EqQBCgIYAhIM"}}))
        events.append(_sse("content_block_stop", {"type": "content_block_stop", "index": 0}))
        return 1

    def _tool_use(self, events: list[str], deltas: list[int], index: int, call: Call, chunk: int) -> None:
        call.id = call.id or self.next_id("toolu_01")
        events.append(_sse("content_block_start", {"type": "content_block_start", "index": index,
                                                   "content_block": {"type": "tool_use", "id": call.id,
                                                                     "name": call.name, "input": {}}}))
        events.append(_sse("content_block_delta", {"type": "content_block_delta", "index": index,
                                                   "delta": {"type": "input_json_delta", "partial_json": ""}}))
        for piece in _pieces(json.dumps(call.input), chunk):
            deltas.append(len(events))
            events.append(_sse("content_block_delta", {"type": "content_block_delta", "index": index,
                                                       "delta": {"type": "input_json_delta", "partial_json": piece}}))
        events.append(_sse("content_block_stop", {"type": "content_block_stop", "index": index}))


# -- OpenAI Responses ---------------------------------------------------------------------------


class ResponsesServer(_Server):
    """`POST /v1/responses`, as the recorded openai_responses_*.sse streams show it."""

    def check_auth(self, request: httpx.Request) -> str | None:
        if request.headers.get("authorization") != f"Bearer {self.key}":
            return "Incorrect API key provided"
        if request.url.path != "/v1/responses":
            return f"no route {request.url.path}"
        return None

    def error_body(self, message: str) -> dict[str, Any]:
        return {"error": {"message": message, "type": "invalid_request_error", "param": "input", "code": None}}

    def error_event(self, message: str) -> str:
        data = {"type": "error", "sequence_number": 99,
                "error": {"type": "server_error", "code": "server_error", "message": message, "param": None}}
        return f"event: error\ndata: {json.dumps(data)}\n\n"

    def check(self, body: dict[str, Any]) -> str | None:
        items = body.get("input")
        if body.get("stream") is not True or not isinstance(items, list) or not items:
            return "input and stream are required"
        calls: dict[str, int] = {}
        for n, item in enumerate(items):
            problem = self._check_item(n, item, items, calls)
            if problem:
                return problem
        answered = {i["call_id"] for i in items if i.get("type") == "function_call_output"}
        for call_id in calls:
            if call_id not in answered:
                return f"No tool output found for function call {call_id}."
        return None

    def _check_item(self, n: int, item: dict[str, Any], items: list[dict[str, Any]], calls: dict[str, int]) -> str | None:
        kind = item.get("type", "message")
        if kind == "message":
            parts = item["content"]
            if isinstance(parts, str):
                parts = [{"text": parts}]
            if not parts or any(not p.get("text", "").strip() for p in parts):
                return f"Invalid 'input[{n}].content': empty text."
            allowed = {"assistant": ("output_text", "refusal")}.get(item["role"], ("input_text", "input_image"))
            for k, part in enumerate(parts):
                if "type" in part and part["type"] not in allowed:
                    return (f"Invalid value: '{part['type']}'. Supported values are: "
                            f"{' and '.join(repr(a) for a in allowed)}. (input[{n}].content[{k}].type)")
        elif kind == "function_call":
            if len(item["call_id"]) > 64 or not isinstance(item["arguments"], str):
                return f"Invalid 'input[{n}].call_id'."
            json.loads(item["arguments"])
            calls[item["call_id"]] = n
        elif kind == "function_call_output":
            if not isinstance(item.get("output"), (str, list)):
                return f"Invalid type for 'input[{n}].output': expected a string or an array."
            if item["call_id"] not in calls:
                return f"No tool call found for function call output with call_id {item['call_id']}."
        elif kind == "reasoning":
            following = items[n + 1].get("type") if n + 1 < len(items) else None
            if following not in ("message", "function_call"):
                return f"Item '{item['id']}' of type 'reasoning' was provided without its required following item."
        return None

    def render(self, reply: Reply) -> tuple[list[str], int | None]:
        seq = iter(range(10_000))
        response_id = self.next_id("resp_")

        def ev(data: dict[str, Any]) -> str:
            data = {"type": data["type"], "sequence_number": next(seq), **data}
            return f"event: {data['type']}\ndata: {json.dumps(data)}\n\n"

        shell = {"id": response_id, "object": "response", "status": "in_progress", "output": [], "usage": None}
        events = [ev({"type": "response.created", "response": shell}),
                  ev({"type": "response.in_progress", "response": shell})]
        deltas: list[int] = []
        output: list[dict[str, Any]] = []
        if reply.thinking:
            output.append(self._reasoning(events, deltas, ev, reply))
        if reply.text:
            output.append(self._message(events, deltas, ev, len(output), reply))
        for call in reply.calls:
            output.append(self._function_call(events, deltas, ev, len(output), call, reply.chunk))
        done = {**shell, "status": "completed", "output": output,
                "usage": {"input_tokens": 321, "output_tokens": 54, "total_tokens": 375,
                          "input_tokens_details": {"cached_tokens": 0},
                          "output_tokens_details": {"reasoning_tokens": 0}}}
        events.append(ev({"type": "response.completed", "response": done}))
        return events, _stall_index(reply, deltas)

    def _reasoning(self, events: list[str], deltas: list[int], ev: Callable[[dict[str, Any]], str],
                   reply: Reply) -> dict[str, Any]:
        item_id = self.next_id("rs_")
        item: dict[str, Any] = {"id": item_id, "type": "reasoning", "summary": []}
        events.append(ev({"type": "response.output_item.added", "output_index": 0, "item": item}))
        where = {"item_id": item_id, "output_index": 0, "summary_index": 0}
        events.append(ev({"type": "response.reasoning_summary_part.added", **where,
                          "part": {"type": "summary_text", "text": ""}}))
        for piece in _pieces(reply.thinking, reply.chunk):
            deltas.append(len(events))
            events.append(ev({"type": "response.reasoning_summary_text.delta", **where, "delta": piece}))
        part = {"type": "summary_text", "text": reply.thinking}
        events.append(ev({"type": "response.reasoning_summary_text.done", **where, "text": reply.thinking}))
        events.append(ev({"type": "response.reasoning_summary_part.done", **where, "part": part}))
        item = {**item, "summary": [part], "encrypted_content": "gAAAAABoSzEq"}
        events.append(ev({"type": "response.output_item.done", "output_index": 0, "item": item}))
        return item

    def _message(self, events: list[str], deltas: list[int], ev: Callable[[dict[str, Any]], str],
                 out: int, reply: Reply) -> dict[str, Any]:
        item_id = self.next_id("msg_")
        item = {"id": item_id, "type": "message", "status": "in_progress", "role": "assistant", "content": []}
        events.append(ev({"type": "response.output_item.added", "output_index": out, "item": item}))
        part = {"type": "output_text", "text": "", "annotations": []}
        events.append(ev({"type": "response.content_part.added", "item_id": item_id, "output_index": out,
                          "content_index": 0, "part": part}))
        for piece in _pieces(reply.text, reply.chunk):
            deltas.append(len(events))
            events.append(ev({"type": "response.output_text.delta", "item_id": item_id, "output_index": out,
                              "content_index": 0, "delta": piece, "logprobs": []}))
        events.append(ev({"type": "response.output_text.done", "item_id": item_id, "output_index": out,
                          "content_index": 0, "text": reply.text, "logprobs": []}))
        whole = {**part, "text": reply.text}
        events.append(ev({"type": "response.content_part.done", "item_id": item_id, "output_index": out,
                          "content_index": 0, "part": whole}))
        item = {**item, "status": "completed", "content": [whole]}
        events.append(ev({"type": "response.output_item.done", "output_index": out, "item": item}))
        return item

    def _function_call(self, events: list[str], deltas: list[int], ev: Callable[[dict[str, Any]], str],
                       out: int, call: Call, chunk: int) -> dict[str, Any]:
        call.id = call.id or self.next_id("call_")
        item_id = self.next_id("fc_")
        arguments = json.dumps(call.input)
        item = {"id": item_id, "type": "function_call", "status": "in_progress", "arguments": "",
                "call_id": call.id, "name": call.name}
        events.append(ev({"type": "response.output_item.added", "output_index": out, "item": item}))
        for piece in _pieces(arguments, chunk):
            deltas.append(len(events))
            events.append(ev({"type": "response.function_call_arguments.delta", "item_id": item_id,
                              "output_index": out, "delta": piece}))
        events.append(ev({"type": "response.function_call_arguments.done", "item_id": item_id,
                          "output_index": out, "arguments": arguments}))
        item = {**item, "status": "completed", "arguments": arguments}
        events.append(ev({"type": "response.output_item.done", "output_index": out, "item": item}))
        return item


# -- OpenAI Chat Completions (and compatible gateways) ------------------------------------------


class ChatServer(_Server):
    """`POST {base}/chat/completions`, as the recorded openai_chat_*.sse streams show it; `path`
    is the route a compatible gateway serves it at (OpenRouter's `/api/v1/chat/completions`)."""

    def __init__(self, key: str, replies: list[Reply], path: str = "/v1/chat/completions") -> None:
        super().__init__(key, replies)
        self.path = path

    def check_auth(self, request: httpx.Request) -> str | None:
        if request.headers.get("authorization") != f"Bearer {self.key}":
            return "Incorrect API key provided"
        if request.url.path != self.path:
            return f"no route {request.url.path}"
        return None

    def error_body(self, message: str) -> dict[str, Any]:
        return {"error": {"message": message, "type": "invalid_request_error", "param": "messages", "code": None}}

    def error_event(self, message: str) -> str:
        return f"data: {json.dumps({'error': {'message': message, 'type': 'server_error', 'code': 500}})}\n\n"

    def check(self, body: dict[str, Any]) -> str | None:
        messages = body.get("messages")
        if body.get("stream") is not True or not isinstance(messages, list) or not messages:
            return "messages and stream are required"
        owed: list[str] = []
        for n, msg in enumerate(messages):
            problem = self._check_message(n, msg, owed)
            if problem:
                return problem
        if owed:
            return (f"An assistant message with 'tool_calls' must be followed by tool messages responding "
                    f"to each 'tool_call_id'. The following tool_call_ids did not have response messages: {owed[0]}")
        return None

    @staticmethod
    def _check_message(n: int, msg: dict[str, Any], owed: list[str]) -> str | None:
        role = msg.get("role")
        if role != "tool" and owed:
            return (f"An assistant message with 'tool_calls' must be followed by tool messages responding "
                    f"to each 'tool_call_id'. The following tool_call_ids did not have response messages: {owed[0]}")
        if role == "tool":
            if msg.get("tool_call_id") not in owed:
                return (f"Invalid parameter: messages with role 'tool' must be a response to a preceeding "
                        f"message with 'tool_calls'. (messages[{n}])")
            owed.remove(msg["tool_call_id"])
            return None
        content = msg.get("content")
        texts = [content] if isinstance(content, str) else [p.get("text", "") for p in content or []]
        if role == "assistant" and msg.get("tool_calls"):
            for call in msg["tool_calls"]:
                if len(call["id"]) > 40:
                    return f"Invalid 'messages[{n}].tool_calls[0].id': string too long."
                json.loads(call["function"]["arguments"])
                owed.append(call["id"])
            return None
        if not texts or any(not t.strip() for t in texts):
            return f"Invalid 'messages[{n}].content': empty text."
        return None

    def render(self, reply: Reply) -> tuple[list[str], int | None]:
        def chunk(delta: dict[str, Any] | None, finish: str | None = None, usage: dict[str, int] | None = None) -> str:
            data: dict[str, Any] = {"id": "gen-chat-0001", "object": "chat.completion.chunk", "created": 1727346168,
                                    "model": "openai/gpt-4o"}
            data["choices"] = [] if delta is None else [{"index": 0, "delta": delta, "logprobs": None,
                                                           "finish_reason": finish}]
            if usage is not None:
                data["usage"] = usage
            return f"data: {json.dumps(data)}\n\n"

        events = [chunk({"role": "assistant", "content": "", "refusal": None})]
        deltas: list[int] = []
        for piece in _pieces(reply.thinking, reply.chunk):
            deltas.append(len(events))
            events.append(chunk({"reasoning": piece}))
        for piece in _pieces(reply.text, reply.chunk):
            deltas.append(len(events))
            events.append(chunk({"content": piece}))
        for k, call in enumerate(reply.calls):
            call.id = call.id or self.next_id("call_")
            events.append(chunk({"tool_calls": [{"index": k, "id": call.id, "type": "function",
                                                 "function": {"name": call.name, "arguments": ""}}]}))
            for piece in _pieces(json.dumps(call.input), reply.chunk):
                deltas.append(len(events))
                events.append(chunk({"tool_calls": [{"index": k, "function": {"arguments": piece}}]}))
        events.append(chunk({}, "tool_calls" if reply.calls else "stop"))
        events.append(chunk(None, usage={"prompt_tokens": 120, "completion_tokens": 30, "total_tokens": 150}))
        events.append("data: [DONE]\n\n")
        return events, _stall_index(reply, deltas)
