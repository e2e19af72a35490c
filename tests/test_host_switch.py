"""A host that moves one conversation between providers: Anthropic Messages, OpenAI Chat
Completions (an OpenAI-compatible server via `base_url`) and OpenAI Responses.

Written from the docs (README, providers.md, sessions.md, subagents.md). One `httpx.MockTransport`
plays the three servers, records every request body, and each body is checked against the rules
of its API (/work/shared/WIRE.md): roles, call/result pairing, ids, thinking and reasoning items.
"""

from __future__ import annotations

import asyncio
import json
import re
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from pydantic import ValidationError

from agentloop import (
    Message,
    QueryEngine,
    ThinkingBlock,
    ToolContext,
    ToolUseBlock,
    TurnEnded,
    delegate_tool,
    tool,
    validate_transcript,
)
from agentloop.models import AnthropicModel, OpenAIChatModel, OpenAIResponsesModel
from agentloop.sessions import JsonlSession

ANTHROPIC_SIG = "EqQBCgIYAhIM1gbcDa9GJwZA2b3hGgxBdjrkzLoky3dl1pkiMOYds"
ENCRYPTED = "gAAAAABoencrypted-reasoning-blob"
GEMINI_SIG = "CiQBVKhc7thought-signature"
REDACTED_DATA = "EmwKAhgBEgy3va3pzixredacted"
GROK_ENCRYPTED = "xai-sealed-reasoning"
#: DeepSeek's Anthropic-compatible API signs its thinking with keys of its own.
DS_SIG = "ZHMtc2lnbmVkLXRoaW5raW5n"
DS_REDACTED = "ZHMtcmVkYWN0ZWQ"
#: What only the API that made it may ever see again.
OWNED = {
    ANTHROPIC_SIG: {"anthropic"},
    REDACTED_DATA: {"anthropic"},
    ENCRYPTED: {"responses"},
    GEMINI_SIG: {"gemini"},
    GROK_ENCRYPTED: {"grok"},
    DS_SIG: {"ds_anthropic"},
    DS_REDACTED: {"ds_anthropic"},
}
GEMINI_HOST = "generativelanguage.googleapis.com"

# --------------------------------------------------------------------------- the servers


@dataclass
class Rep:
    """One scripted reply: reasoning, text, then tool calls `(id, name, input)`; the usage is
    (whole prompt, output, cached part of the prompt)."""

    text: str = ""
    think: str = ""
    calls: list[tuple[str, str, dict[str, Any]]] = field(default_factory=list)
    usage: tuple[int, int, int] = (100, 10, 0)
    cut: bool = False  # the output token limit cuts the last call's arguments in half

    def arguments(self, k: int) -> str:
        """The JSON the model writes for call ``k``: the first half of it for a cut call."""
        text = json.dumps(self.calls[k][2])
        return text[: len(text) // 2] if self.cut and k == len(self.calls) - 1 else text


def _sse(data: dict[str, Any], event: str | None = None) -> str:
    head = f"event: {event}\n" if event else ""
    return f"{head}data: {json.dumps(data)}\n\n"


def _halves(text: str) -> list[str]:
    """A tool call's arguments in two deltas, so that a stream cut between them cuts the input."""
    return [text[: len(text) // 2], text[len(text) // 2 :]]


def anthropic_stream(rep: Rep, n: int) -> str:
    prompt, out, cached = rep.usage
    usage = {"input_tokens": prompt - cached, "cache_read_input_tokens": cached, "output_tokens": 1}
    start = {
        "id": f"msg_{n}",
        "type": "message",
        "role": "assistant",
        "content": [],
        "model": "claude",
        "stop_reason": None,
        "stop_sequence": None,
        "usage": usage,
    }
    events = [_sse({"type": "message_start", "message": start}, "message_start")]
    blocks: list[tuple[dict[str, Any], list[dict[str, Any]]]] = []
    if rep.think:
        blocks.append(
            (
                {"type": "thinking", "thinking": "", "signature": ""},
                [
                    {"type": "thinking_delta", "thinking": rep.think},
                    {"type": "signature_delta", "signature": f"{ANTHROPIC_SIG}{n}"},
                ],
            )
        )
        blocks.append(({"type": "redacted_thinking", "data": f"{REDACTED_DATA}{n}"}, []))
    if rep.text:
        blocks.append(({"type": "text", "text": ""}, [{"type": "text_delta", "text": rep.text}]))
    for k, (cid, name, _) in enumerate(rep.calls):
        blocks.append(
            (
                {"type": "tool_use", "id": cid, "name": name, "input": {}},
                [{"type": "input_json_delta", "partial_json": half} for half in _halves(rep.arguments(k))],
            )
        )
    for i, (block, deltas) in enumerate(blocks):
        events.append(
            _sse({"type": "content_block_start", "index": i, "content_block": block}, "content_block_start")
        )
        events += [
            _sse({"type": "content_block_delta", "index": i, "delta": d}, "content_block_delta")
            for d in deltas
        ]
        events.append(_sse({"type": "content_block_stop", "index": i}, "content_block_stop"))
    stop = "max_tokens" if rep.cut else "tool_use" if rep.calls else "end_turn"
    events.append(
        _sse(
            {
                "type": "message_delta",
                "delta": {"stop_reason": stop, "stop_sequence": None},
                "usage": {"output_tokens": out},
            },
            "message_delta",
        )
    )
    events.append(_sse({"type": "message_stop"}, "message_stop"))
    return "".join(events)


def chat_stream(rep: Rep, n: int, gemini: bool = False) -> str:
    def chunk(delta: dict[str, Any], finish: str | None = None) -> str:
        choice = {"index": 0, "delta": delta, "finish_reason": finish}
        return _sse({"id": f"chatcmpl-{n}", "object": "chat.completion.chunk", "choices": [choice]})

    events = [chunk({"role": "assistant", "content": ""})]
    if rep.think:
        events.append(chunk({"reasoning_content": rep.think}))
    if rep.text:
        events.append(chunk({"content": rep.text}))
    for i, (cid, name, _) in enumerate(rep.calls):
        start: dict[str, Any] = {
            "index": i,
            "id": cid,
            "type": "function",
            "function": {"name": name, "arguments": ""},
        }
        if gemini and i == 0:
            start["extra_content"] = {"google": {"thought_signature": f"{GEMINI_SIG}{n}"}}
        events.append(chunk({"tool_calls": [start]}))
        events += [
            chunk({"tool_calls": [{"index": i, "function": {"arguments": half}}]})
            for half in _halves(rep.arguments(i))
        ]
    events.append(chunk({}, "length" if rep.cut else "tool_calls" if rep.calls else "stop"))
    prompt, out, cached = rep.usage
    usage = {
        "prompt_tokens": prompt,
        "completion_tokens": out,
        "total_tokens": prompt + out,
        "prompt_tokens_details": {"cached_tokens": cached},
    }
    events.append(
        _sse({"id": f"chatcmpl-{n}", "object": "chat.completion.chunk", "choices": [], "usage": usage})
    )
    events.append("data: [DONE]\n\n")
    return "".join(events)


def _responses_items(rep: Rep, n: int) -> list[dict[str, Any]]:
    items: list[dict[str, Any]] = []
    if rep.think:
        items.append(
            {
                "id": f"rs_{n}",
                "type": "reasoning",
                "encrypted_content": f"{ENCRYPTED}{n}",
                "summary": [{"type": "summary_text", "text": rep.think}],
            }
        )
    if rep.text:
        items.append(
            {
                "id": f"msg_{n}",
                "type": "message",
                "role": "assistant",
                "status": "completed",
                "content": [{"type": "output_text", "text": rep.text, "annotations": []}],
            }
        )
    for i, (cid, name, _) in enumerate(rep.calls):
        items.append(
            {
                "id": f"fc_{n}_{i}",
                "type": "function_call",
                "status": "completed",
                "call_id": cid,
                "name": name,
                "arguments": rep.arguments(i),
            }
        )
    return items


def responses_stream(rep: Rep, n: int) -> str:
    def ev(data: dict[str, Any]) -> str:
        return _sse(data, data["type"])

    head = {"id": f"resp_{n}", "object": "response", "status": "in_progress", "output": []}
    events = [ev({"type": "response.created", "response": head})]
    items = _responses_items(rep, n)
    for i, item in enumerate(items):
        empty = {"function_call": {"arguments": ""}, "message": {"content": []}, "reasoning": {"summary": []}}
        added = {**item, **empty[item["type"]]}
        events.append(ev({"type": "response.output_item.added", "output_index": i, "item": added}))
        if item["type"] == "message":
            events.append(
                ev(
                    {
                        "type": "response.output_text.delta",
                        "item_id": item["id"],
                        "output_index": i,
                        "content_index": 0,
                        "delta": rep.text,
                    }
                )
            )
        if item["type"] == "function_call":
            events += [
                ev(
                    {
                        "type": "response.function_call_arguments.delta",
                        "item_id": item["id"],
                        "output_index": i,
                        "delta": half,
                    }
                )
                for half in _halves(item["arguments"])
            ]
        events.append(ev({"type": "response.output_item.done", "output_index": i, "item": item}))
    prompt, out, cached = rep.usage
    usage = {
        "input_tokens": prompt,
        "input_tokens_details": {"cached_tokens": cached},
        "output_tokens": out,
        "output_tokens_details": {"reasoning_tokens": 0},
        "total_tokens": prompt + out,
    }
    done = {**head, "status": "completed", "output": items, "usage": usage}
    if rep.cut:
        done |= {"status": "incomplete", "incomplete_details": {"reason": "max_output_tokens"}}
    events.append(ev({"type": "response.incomplete" if rep.cut else "response.completed", "response": done}))
    return "".join(events)


API_OF_PATH = {"/v1/messages": "anthropic", "/v1/chat/completions": "chat", "/v1/responses": "responses"}
HOST_API = {
    "deepseek.test": "deepseek",
    "mistral.test": "mistral",
    GEMINI_HOST: "gemini",
    "grok.test": "grok",
    "ds-anthropic.test": "ds_anthropic",
}
STREAMS: dict[str, Callable[[Rep, int], str]] = {
    "anthropic": anthropic_stream,
    "chat": chat_stream,
    "responses": responses_stream,
    "deepseek": chat_stream,
    "mistral": chat_stream,
    "gemini": lambda rep, n: chat_stream(rep, n, gemini=True),
    "grok": lambda rep, n: responses_stream(rep, n).replace(ENCRYPTED, GROK_ENCRYPTED),
    "ds_anthropic": lambda rep, n: anthropic_stream(rep, n).replace(ANTHROPIC_SIG, DS_SIG).replace(REDACTED_DATA, DS_REDACTED),
}


class Servers:
    """The three APIs behind one transport. Each request is validated for its API and recorded;
    an invalid one gets the 400 the real API would give. Replies come from `script`, a queue of
    `Rep`s, or from `answer(api, body)` when it is set."""

    def __init__(self) -> None:
        self.requests: list[tuple[str, dict[str, Any]]] = []
        self.script: list[Rep] = []
        self.answer: Callable[[str, dict[str, Any]], Rep] | None = None
        self.client = httpx.AsyncClient(transport=httpx.MockTransport(self._handle))

    def _handle(self, request: httpx.Request) -> httpx.Response:
        api = HOST_API.get(request.url.host) or API_OF_PATH[request.url.path]
        body = json.loads(request.content)
        self.requests.append((api, body))
        problems = VALIDATORS[api](body)
        if problems:
            error = {"type": "invalid_request_error", "message": "; ".join(problems)}
            return httpx.Response(
                400, json={"type": "error", "error": error} if api in ANTHROPIC_APIS else {"error": error}
            )
        rep = self.answer(api, body) if self.answer else self.script.pop(0)
        return httpx.Response(
            200, headers={"content-type": "text/event-stream"}, text=STREAMS[api](rep, len(self.requests))
        )

    def models(self) -> dict[str, Any]:
        return {
            "anthropic": AnthropicModel(
                "claude-sonnet-4-6",
                api_key="sk-ant-test-key-0123456789abcdef",
                base_url="http://anthropic.test",
                http_client=self.client,
                thinking=2000,
            ),
            "chat": OpenAIChatModel(
                "qwen3", api_key="", base_url="http://vllm.test/v1", http_client=self.client
            ),
            "responses": OpenAIResponsesModel(
                "o4-mini",
                api_key="sk-openai-test-key-0123456789",
                store=False,
                base_url="http://openai.test/v1",
                http_client=self.client,
                reasoning={"effort": "low", "summary": "auto"},
            ),
            "deepseek": OpenAIChatModel(
                "deepseek-reasoner",
                api_key="",
                base_url="http://deepseek.test/v1",
                http_client=self.client,
                echo_reasoning=True,
            ),
            "mistral": OpenAIChatModel(
                "magistral",
                api_key="",
                base_url="http://mistral.test/v1",
                http_client=self.client,
                short_tool_ids=True,
            ),
            "grok": OpenAIResponsesModel(
                "grok-4",
                api_key="",
                store=False,
                base_url="http://grok.test/v1",
                http_client=self.client,
                reasoning={"effort": "low"},
            ),
            "gemini": OpenAIChatModel(
                "gemini-3-pro",
                api_key="",
                base_url=f"http://{GEMINI_HOST}/v1beta/openai",
                http_client=self.client,
            ),
            "ds_anthropic": AnthropicModel(
                "deepseek-reasoner",
                api_key="sk-deepseek-test-key-0123456789",
                base_url="http://ds-anthropic.test/anthropic",
                http_client=self.client,
                thinking=2000,
            ),
        }

    def bodies(self, api: str) -> list[dict[str, Any]]:
        return [body for kind, body in self.requests if kind == api]

    def problems(self) -> list[str]:
        found = [
            f"request {i} ({api}): {p}"
            for i, (api, body) in enumerate(self.requests)
            for p in VALIDATORS[api](body)
        ]
        for i, (api, body) in enumerate(self.requests):
            text = json.dumps(body)
            found += [
                f"request {i} ({api}): carries {secret!r}, which only {owners} may see"
                for secret, owners in OWNED.items()
                if secret in text and api not in owners
            ]
        return found


# --------------------------------------------------------------------------- the validators

ANTHROPIC_ID = re.compile(r"^[a-zA-Z0-9_-]+$")
TOOL_NAME = re.compile(r"^[a-zA-Z0-9_-]{1,64}$")


def _looks_like_json_object(text: str) -> bool:
    try:
        return isinstance(json.loads(text), dict)
    except ValueError:
        return False


def _anthropic_blocks(i: int, msg: dict[str, Any]) -> list[str]:
    problems: list[str] = []
    content = msg["content"]
    if isinstance(content, str):
        return [] if content.strip() else [f"messages.{i}: empty text"]
    if not content:
        problems.append(f"messages.{i}: empty content")
    for j, block in enumerate(content):
        kind = block["type"]
        if kind == "text" and not block["text"].strip():
            problems.append(f"messages.{i}.content.{j}: text content blocks must be non-empty")
        if kind == "thinking":
            if not block.get("signature") or _looks_like_json_object(block["signature"]):
                problems.append(f"messages.{i}.content.{j}: Invalid `signature` in `thinking` block")
            if msg["role"] != "assistant":
                problems.append(f"messages.{i}.content.{j}: thinking in a user turn")
        if kind == "tool_use" and not TOOL_NAME.match(block["name"]):
            problems.append(
                f"messages.{i}.content.{j}.name: String should match pattern '^[a-zA-Z0-9_-]{{1,64}}$'"
            )
        if kind == "tool_use" and not ANTHROPIC_ID.match(block["id"]):
            problems.append(f"messages.{i}.content.{j}.id: String should match pattern '^[a-zA-Z0-9_-]+$'")
        if kind == "tool_result" and not ANTHROPIC_ID.match(block["tool_use_id"]):
            problems.append(f"messages.{i}.content.{j}.tool_use_id: bad pattern")
        if kind not in {"text", "thinking", "redacted_thinking", "tool_use", "tool_result"}:
            problems.append(f"messages.{i}.content.{j}: unexpected block type {kind}")
        extra = set(block) - {
            "type",
            "text",
            "thinking",
            "signature",
            "data",
            "id",
            "name",
            "input",
            "tool_use_id",
            "content",
            "is_error",
            "cache_control",
        }
        if extra:
            problems.append(f"messages.{i}.content.{j}: extra fields {sorted(extra)}")
    if msg["role"] == "assistant" and content and content[-1]["type"] in {"thinking", "redacted_thinking"}:
        problems.append(f"messages.{i}: an assistant turn cannot end with thinking")
    return problems


def _blocks(msg: dict[str, Any], kind: str) -> list[dict[str, Any]]:
    content = msg["content"]
    return [] if isinstance(content, str) else [b for b in content if b["type"] == kind]


def _anthropic_pairing(messages: list[dict[str, Any]]) -> list[str]:
    problems: list[str] = []
    for i, msg in enumerate(messages):
        results = [b["tool_use_id"] for b in _blocks(msg, "tool_result")]
        if results:
            content = msg["content"]
            first_other = next((k for k, b in enumerate(content) if b["type"] != "tool_result"), len(content))
            if any(b["type"] == "tool_result" for b in content[first_other:]):
                problems.append(f"messages.{i}: tool_result blocks must come first")
            prev = [b["id"] for b in _blocks(messages[i - 1], "tool_use")] if i else []
            orphans = [r for r in results if r not in prev]
            if orphans or len(set(results)) != len(results):
                problems.append(
                    f"messages.{i}: unexpected `tool_use_id` found in `tool_result` blocks: {orphans}"
                )
        uses = [b["id"] for b in _blocks(msg, "tool_use")]
        if uses:
            nxt = (
                [b["tool_use_id"] for b in _blocks(messages[i + 1], "tool_result")]
                if i + 1 < len(messages)
                else []
            )
            missing = [u for u in uses if u not in nxt]
            if missing:
                problems.append(
                    f"messages.{i}: `tool_use` ids were found without `tool_result` blocks "
                    f"immediately after: {', '.join(missing)}"
                )
            if len(set(uses)) != len(uses):
                problems.append(f"messages.{i}: duplicate tool_use ids")
    return problems


def validate_anthropic(body: dict[str, Any]) -> list[str]:
    messages = body["messages"]
    problems: list[str] = []
    if not messages or messages[0]["role"] != "user" or messages[-1]["role"] != "user":
        problems.append("the conversation must start and end with a user turn")
    for i, msg in enumerate(messages):
        if i and msg["role"] == messages[i - 1]["role"]:
            problems.append(f"messages.{i}: roles must alternate")
        problems += _anthropic_blocks(i, msg)
    problems += _anthropic_pairing(messages)
    if body.get("thinking") and body.get("tool_choice", {}).get("type") in {"any", "tool"}:
        problems.append("Thinking may not be enabled when tool_choice forces tool use.")
    if body.get("thinking") and len(messages) >= 2 and _blocks(messages[-1], "tool_result"):
        content = messages[-2]["content"]
        if not content or content[0]["type"] not in {"thinking", "redacted_thinking"}:
            problems.append(
                f"messages.{len(messages) - 2}.content.0.type: Expected `thinking` or "
                "`redacted_thinking`: a final `assistant` message must start with a thinking block"
            )
    return problems


def _chat_message(i: int, msg: dict[str, Any], echo: bool, gemini: bool) -> list[str]:
    problems: list[str] = []
    role = msg["role"]
    if role not in {"system", "developer", "user", "assistant", "tool"}:
        problems.append(f"messages.[{i}].role: unknown role {role}")
    content = msg.get("content")
    if role in {"user", "system", "tool"} and (
        not isinstance(content, str) or (role == "user" and not content.strip())
    ):
        problems.append(f"messages.[{i}].content: empty or not a string")
    if role == "assistant":
        if not msg.get("tool_calls") and not (isinstance(content, str) and content.strip()):
            problems.append(f"messages.[{i}]: an assistant message needs content or tool_calls")
        if isinstance(content, str) and not content.strip() and content != "":
            problems.append(f"messages.[{i}]: blank assistant content")
        if "reasoning_content" in msg and not echo:
            problems.append(f"messages.[{i}]: reasoning_content sent to a server that does not take it")
    for call in msg.get("tool_calls") or []:
        if set(call) - {"id", "type", "function"} - ({"extra_content"} if gemini else set()):
            problems.append(f"messages.[{i}].tool_calls: unknown fields {sorted(set(call))}")
        if not TOOL_NAME.match(call["function"]["name"]):
            problems.append(
                f"messages.[{i}].tool_calls: Invalid 'function.name' {call['function']['name']!r}"
            )
        if len(call["id"]) > 40:
            problems.append(f"messages.[{i}].tool_calls: 'id' is too long ({len(call['id'])} > 40)")
        json.loads(call["function"]["arguments"])
    extra = set(msg) - {"role", "content", "tool_calls", "tool_call_id", "name", "reasoning_content"}
    if extra:
        problems.append(f"messages.[{i}]: extra fields {sorted(extra)}")
    if '"signature"' in json.dumps(msg):
        problems.append(f"messages.[{i}]: a signature was sent")
    return problems


def validate_chat(body: dict[str, Any], echo: bool = False, gemini: bool = False) -> list[str]:
    messages = body["messages"]
    problems: list[str] = []
    owed: list[str] = []
    for i, msg in enumerate(messages):
        problems += _chat_message(i, msg, echo, gemini)
        if msg["role"] == "tool":
            if msg.get("tool_call_id") not in owed:
                problems.append(
                    f"messages.[{i}].role: messages with role 'tool' must be a response to a "
                    "preceeding message with 'tool_calls'."
                )
            else:
                owed.remove(msg["tool_call_id"])
            continue
        if owed:
            problems.append(
                f"messages.[{i}].role: An assistant message with 'tool_calls' must be followed by "
                f"tool messages responding to each 'tool_call_id'. Missing: {', '.join(owed)}"
            )
            owed = []
        owed = [call["id"] for call in msg.get("tool_calls") or []]
        if len(set(owed)) != len(owed):
            problems.append(f"messages.[{i}]: duplicate tool call ids")
    if owed:
        problems.append(f"the last assistant message's tool_calls have no tool messages: {owed}")
    if not messages or messages[-1]["role"] not in {"user", "tool"}:
        problems.append("the last message must be the user's or a tool result")
    return problems


def _responses_item(i: int, item: dict[str, Any]) -> list[str]:
    problems: list[str] = []
    kind = item.get("type", "message")
    if kind == "message":
        content = item["content"]
        texts = [content] if isinstance(content, str) else [part.get("text", "") for part in content]
        if not texts or any(not t.strip() for t in texts):
            problems.append(f"input[{i}]: empty text")
    elif kind in {"function_call", "function_call_output"}:
        if not item.get("call_id") or len(item["call_id"]) > 64:
            problems.append(f"input[{i}].call_id: missing or longer than 64 characters")
        if kind == "function_call":
            json.loads(item["arguments"])
            if not TOOL_NAME.match(item["name"]):
                problems.append(f"input[{i}].name: Invalid function name {item['name']!r}")
            if "id" in item and not str(item["id"]).startswith("fc"):
                problems.append(f"input[{i}].id: Expected an ID that begins with 'fc'")
    elif kind == "reasoning":
        if not str(item.get("id", "")).startswith("rs_"):
            problems.append(f"input[{i}].id: Expected an ID that begins with 'rs'")
        if not item.get("encrypted_content"):
            problems.append(f"input[{i}]: Item with id '{item.get('id')}' not found (store=false)")
    else:
        problems.append(f"input[{i}]: unexpected item type {kind}")
    if ANTHROPIC_SIG in json.dumps(item):
        problems.append(f"input[{i}]: an Anthropic signature was sent")
    return problems


def validate_responses(body: dict[str, Any]) -> list[str]:
    items = body["input"]
    problems: list[str] = []
    calls = {it["call_id"]: i for i, it in enumerate(items) if it.get("type") == "function_call"}
    outputs: dict[str, int] = {}
    for i, item in enumerate(items):
        problems += _responses_item(i, item)
        kind = item.get("type", "message")
        if kind == "function_call_output":
            cid = item["call_id"]
            if cid not in calls or calls[cid] > i:
                problems.append(f"No tool call found for function call output with call_id {cid}.")
            if cid in outputs:
                problems.append(f"input[{i}]: a second output for call_id {cid}")
            outputs[cid] = i
        if kind == "reasoning":
            nxt = items[i + 1].get("type", "message") if i + 1 < len(items) else None
            role = items[i + 1].get("role") if nxt == "message" else "assistant"
            if nxt not in {"message", "function_call"} or role != "assistant":
                problems.append(
                    f"Item '{item.get('id')}' of type 'reasoning' was provided without its required "
                    "following item."
                )
    for cid in calls:
        if cid not in outputs:
            problems.append(f"No tool output found for function call {cid}.")
    if len(calls) != sum(1 for it in items if it.get("type") == "function_call"):
        problems.append("duplicate function_call call_ids")
    return problems


def validate_deepseek(body: dict[str, Any]) -> list[str]:
    """Chat Completions, and every assistant message with tool calls carries `reasoning_content`."""
    problems = validate_chat(body, echo=True)
    for i, msg in enumerate(body["messages"]):
        if msg.get("tool_calls") and not isinstance(msg.get("reasoning_content"), str):
            problems.append(
                f"Missing `reasoning_content` field in the assistant message at message index {i}"
            )
    return problems


def validate_mistral(body: dict[str, Any]) -> list[str]:
    """Chat Completions, and every tool call id exactly nine letters or digits."""
    problems = validate_chat(body)
    ids = [c["id"] for m in body["messages"] for c in m.get("tool_calls") or []]
    ids += [m["tool_call_id"] for m in body["messages"] if m["role"] == "tool"]
    problems += [
        f"Tool call id was {i} but must be a-z, A-Z, 0-9, with a length of 9"
        for i in ids
        if not re.fullmatch(r"[a-zA-Z0-9]{9}", i)
    ]
    return problems


def validate_gemini(body: dict[str, Any]) -> list[str]:
    """Chat Completions; a call Gemini made goes back with its thought signature."""
    problems = validate_chat(body, gemini=True)
    for i, msg in enumerate(body["messages"]):
        for call in msg.get("tool_calls") or []:
            sig = call.get("extra_content", {}).get("google", {}).get("thought_signature", GEMINI_SIG)
            if not sig.startswith(GEMINI_SIG):
                problems.append(f"messages.[{i}]: a thought signature that is not Gemini's")
    return problems


def signed_by(signature: str, redacted: str) -> Callable[[dict[str, Any]], list[str]]:
    """The Messages API of a server that checks the thinking it is sent: a signature, or
    redacted data, that another server made is refused, as each server signs with its own keys."""

    def validate(body: dict[str, Any]) -> list[str]:
        problems = validate_anthropic(body)
        for i, msg in enumerate(body["messages"]):
            problems += [
                f"messages.{i}.content.{j}: Invalid `signature` in `thinking` block"
                for j, b in enumerate(msg["content"] if isinstance(msg["content"], list) else [])
                if b["type"] == "thinking" and not b["signature"].startswith(signature)
            ]
            problems += [
                f"messages.{i}.content.{j}: Invalid `data` in `redacted_thinking` block"
                for j, b in enumerate(msg["content"] if isinstance(msg["content"], list) else [])
                if b["type"] == "redacted_thinking" and not b["data"].startswith(redacted)
            ]
        return problems

    return validate


ANTHROPIC_APIS = {"anthropic", "ds_anthropic"}
VALIDATORS: dict[str, Callable[[dict[str, Any]], list[str]]] = {
    "anthropic": signed_by(ANTHROPIC_SIG, REDACTED_DATA),
    "ds_anthropic": signed_by(DS_SIG, DS_REDACTED),
    "chat": validate_chat,
    "responses": validate_responses,
    "deepseek": validate_deepseek,
    "mistral": validate_mistral,
    "gemini": validate_gemini,
    "grok": validate_responses,
}


# --------------------------------------------------------------------------- the host


@tool(concurrency_safe=True)
async def lookup(key: str) -> str:
    """Look a key up."""
    return f"value of {key}"


@tool
async def wait_forever(reason: str, ctx: ToolContext) -> str:
    """A tool that runs until it is interrupted."""
    await ctx.signal.wait()
    return "never"


TOOLS = [lookup, wait_forever]


async def turn(engine: QueryEngine, prompt: str | None, interrupt_on: str | None = None) -> list[Any]:
    """One run of the host: every event; `interrupt_on` names the event type at which the user
    presses Ctrl-C (`thinking_delta`, `text_delta`, `tool_call_started`)."""
    events: list[Any] = []
    async for event in engine.run(prompt):
        events.append(event)
        if interrupt_on is not None and event.type == interrupt_on and event.agent_id is None:
            engine.interrupt()
            interrupt_on = None
    retried = [e.error for e in events if e.type == "retrying"]
    assert retried == [], retried  # a request the mock servers refused, or a stream they garbled
    return events


def ended(events: list[Any]) -> TurnEnded:
    return [e for e in events if isinstance(e, TurnEnded) and e.agent_id is None][-1]


def run(coro: Any) -> Any:
    return asyncio.run(coro)


LONG_VLLM_ID = "chatcmpl-tool-" + "0123456789abcdef" * 2  # 46 characters: too long for Chat Completions
KIMI_ID = "functions.lookup:0"  # Anthropic refuses the '.' and ':'


# --------------------------------------------------------------------------- thinking and reasoning


def test_thinking_goes_only_to_the_provider_that_made_it() -> None:
    servers = Servers()
    models = servers.models()

    async def main() -> QueryEngine:
        engine = QueryEngine(models["anthropic"], tools=TOOLS)
        servers.script = [
            Rep(think="Look it up.", text="Checking.", calls=[("toolu_01A", "lookup", {"key": "a"})]),
            Rep(think="Found.", text="It is a."),
        ]
        assert ended(await turn(engine, "What is a?")).reason == "completed"
        engine.model = models["chat"]
        servers.script = [
            Rep(think="chat thoughts", calls=[(LONG_VLLM_ID, "lookup", {"key": "b"})]),
            Rep(text="b."),
        ]
        assert ended(await turn(engine, "And b?")).reason == "completed"
        engine.model = models["responses"]
        servers.script = [
            Rep(think="Reasoning on c.", calls=[("call_c1", "lookup", {"key": "c"})]),
            Rep(think="Done with c.", text="c."),
        ]
        assert ended(await turn(engine, "And c?")).reason == "completed"
        engine.model = models["anthropic"]
        servers.script = [Rep(think="Summing up.", text="a, b and c.")]
        assert ended(await turn(engine, "All three?")).reason == "completed"
        return engine

    engine = run(main())
    assert servers.problems() == []
    assert validate_transcript(engine.messages) == []
    # Chat Completions: no thinking of any kind, the long vLLM id mapped the same for call and result.
    last_chat = servers.bodies("chat")[-1]
    assert "thinking" not in json.dumps(last_chat) and "reasoning" not in json.dumps(last_chat)
    (call,) = [
        c
        for m in last_chat["messages"]
        for c in m.get("tool_calls") or []
        if c["function"]["arguments"] == '{"key": "b"}'
    ]
    assert len(call["id"]) <= 40 and call["id"] != LONG_VLLM_ID
    assert [m["tool_call_id"] for m in last_chat["messages"] if m["role"] == "tool"][-1] == call["id"]
    # Responses: reasoning items are its own only, each with its encrypted content.
    last_resp = servers.bodies("responses")[-1]
    reasoning = [it for it in last_resp["input"] if it.get("type") == "reasoning"]
    assert [it["encrypted_content"] for it in reasoning] == [f"{ENCRYPTED}{i}" for i in (5, 6)][
        : len(reasoning)
    ]
    assert len(reasoning) >= 1
    assert ANTHROPIC_SIG not in json.dumps(last_resp)
    # Back on Anthropic: its own signed thinking goes back byte for byte, nothing else does.
    final = servers.bodies("anthropic")[-1]
    thinking = [
        b
        for m in final["messages"]
        if m["role"] == "assistant" and not isinstance(m["content"], str)
        for b in m["content"]
        if b["type"] == "thinking"
    ]
    assert {b["signature"] for b in thinking} <= {f"{ANTHROPIC_SIG}{i}" for i in (1, 2)}
    assert "Reasoning on c." not in json.dumps(final) and ENCRYPTED not in json.dumps(final)
    assert "chat thoughts" not in json.dumps(final)
    # The ids another provider made reach Anthropic in its own alphabet, paired.
    ids = [b["id"] for m in final["messages"] for b in _blocks(m, "tool_use")]
    assert all(ANTHROPIC_ID.match(i) for i in ids) and len(ids) == 3


def test_tool_call_made_on_one_provider_answered_on_another() -> None:
    """A call made by Kimi (an id Anthropic refuses) whose turn ended at max_turns: the next run,
    on Anthropic, sends the call and its result under one mapped id."""
    servers = Servers()
    models = servers.models()

    async def main() -> QueryEngine:
        engine = QueryEngine(models["chat"], tools=TOOLS, max_turns=1)
        servers.script = [
            Rep(
                text="Looking.", calls=[(KIMI_ID, "lookup", {"key": "k"}), ("x" * 70, "lookup", {"key": "j"})]
            )
        ]
        assert ended(await turn(engine, "What is k?")).reason == "max_turns"
        engine.model = models["anthropic"]
        servers.script = [Rep(think="Both found.", text="k and j.")]
        assert ended(await turn(engine, None)).reason == "completed"
        engine.model = models["responses"]
        servers.script = [Rep(text="Yes.")]
        assert ended(await turn(engine, "Sure?")).reason == "completed"
        return engine

    run(main())
    assert servers.problems() == []
    body = servers.bodies("anthropic")[-1]
    assert "thinking" not in body  # the turn it answers has no thinking block: sent without it
    uses = [b["id"] for b in _blocks(body["messages"][-2], "tool_use")]
    results = [b["tool_use_id"] for b in _blocks(body["messages"][-1], "tool_result")]
    assert uses == results and len(set(uses)) == 2
    items = servers.bodies("responses")[-1]["input"]
    calls = [it["call_id"] for it in items if it.get("type") == "function_call"]
    outs = [it["call_id"] for it in items if it.get("type") == "function_call_output"]
    assert calls == outs and len(set(calls)) == 2 and all(len(c) <= 64 for c in calls)


# --------------------------------------------------------------------------- interrupts


@pytest.mark.parametrize(
    ("first", "second"),
    [("anthropic", "chat"), ("chat", "responses"), ("responses", "anthropic"), ("anthropic", "responses")],
)
def test_interrupt_mid_tool_then_another_provider(first: str, second: str) -> None:
    servers = Servers()
    models = servers.models()

    async def main() -> QueryEngine:
        engine = QueryEngine(models[first], tools=TOOLS)
        servers.script = [
            Rep(
                think="Wait for it.",
                text="Running.",
                calls=[
                    ("toolu_W1" if first == "anthropic" else LONG_VLLM_ID, "wait_forever", {"reason": "x"}),
                    ("call_L2", "lookup", {"key": "q"}),
                ],
            )
        ]
        assert ended(await turn(engine, "Start", interrupt_on="tool_call_started")).reason == "aborted_tools"
        engine.model = models[second]
        servers.script = [Rep(text="Stopped as asked.")]
        assert ended(await turn(engine, "What happened?")).reason == "completed"
        return engine

    engine = run(main())
    assert servers.problems() == []
    assert validate_transcript(engine.messages) == []
    body = servers.bodies(second)[-1]
    text = json.dumps(body)
    assert "What happened?" in text
    if second == "anthropic":
        assert "thinking" not in body  # the last turn's thinking was the other provider's


# --------------------------------------------------------------------------- usage


def test_usage_adds_up_across_providers_and_a_subagent() -> None:
    servers = Servers()
    models = servers.models()
    replies = {
        "anthropic": [
            Rep(think="Delegate.", calls=[("toolu_T1", "task", {"task": "Find k."})], usage=(1000, 50, 800)),
            Rep(think="Got it.", text="k is found.", usage=(1200, 40, 1000)),
        ],
        "chat": [
            Rep(calls=[(LONG_VLLM_ID, "lookup", {"key": "k"})], usage=(500, 20, 300)),
            Rep(text="k has a value.", usage=(600, 25, 500)),
        ],
        "responses": [Rep(think="Short.", text="Yes.", usage=(700, 30, 600))],
    }
    servers.answer = lambda api, body: replies[api].pop(0)

    async def main() -> tuple[list[Any], list[Any]]:
        engine = QueryEngine(
            models["anthropic"], tools=[lookup, delegate_tool(model=models["chat"], max_turns=4)]
        )
        first = await turn(engine, "Where is k?")
        engine.model = models["responses"]
        second = await turn(engine, "Sure?")
        return first, second

    first, second = run(main())
    assert servers.problems() == []
    assert [api for api, _ in servers.requests] == ["anthropic", "chat", "chat", "anthropic", "responses"]
    child = [e for e in first if isinstance(e, TurnEnded) and e.agent_id is not None]
    assert len(child) == 1 and child[0].reason == "completed"
    assert (child[0].usage.input_tokens, child[0].usage.output_tokens, child[0].usage.cache_read_tokens) == (
        1100,
        45,
        800,
    )
    usage = ended(first).usage
    assert (usage.input_tokens, usage.output_tokens, usage.cache_read_tokens) == (3300, 135, 2600)
    assert usage.total == 3435
    usage = ended(second).usage  # a new run counts from zero
    assert (usage.input_tokens, usage.output_tokens, usage.cache_read_tokens) == (700, 30, 600)


# --------------------------------------------------------------------------- subagents


def test_subagent_on_another_provider_keeps_each_request_valid() -> None:
    """The parent thinks on Anthropic, its child works on the Responses API; the parent's next
    request carries the child's answer as the result of its own call, with its signed thinking."""
    servers = Servers()
    models = servers.models()
    replies = {
        "anthropic": [
            Rep(
                think="Delegate it.",
                text="Asking a helper.",
                calls=[("toolu_T1", "task", {"task": "Find k."})],
            ),
            Rep(think="The helper answered.", text="k is 42."),
        ],
        "responses": [
            Rep(think="Look it up.", calls=[("call_" + "z" * 60, "lookup", {"key": "k"})]),
            Rep(think="Done.", text="k is 42."),
        ],
    }
    servers.answer = lambda api, body: replies[api].pop(0)

    async def main() -> QueryEngine:
        engine = QueryEngine(models["anthropic"], tools=[lookup, delegate_tool(model=models["responses"])])
        assert ended(await turn(engine, "What is k?")).reason == "completed"
        return engine

    engine = run(main())
    assert servers.problems() == []
    assert validate_transcript(engine.messages) == []
    child_first, child_last = servers.bodies("responses")
    assert child_first["input"] == [{"type": "message", "role": "user", "content": "Find k."}]
    assert [it["type"] for it in child_last["input"]] == [
        "message",
        "reasoning",
        "function_call",
        "function_call_output",
    ]
    parent_last = servers.bodies("anthropic")[-1]
    assert parent_last["thinking"]["type"] == "enabled"
    first_block = parent_last["messages"][1]["content"][0]
    assert first_block["type"] == "thinking" and first_block["signature"] == f"{ANTHROPIC_SIG}1"
    (result,) = _blocks(parent_last["messages"][2], "tool_result")
    assert "k is 42." in json.dumps(result["content"])


# --------------------------------------------------------------------------- sessions


def test_resumed_session_continues_on_other_providers(tmp_path: Path) -> None:
    servers = Servers()
    models = servers.models()
    path = tmp_path / "chat.jsonl"

    async def first() -> None:
        with JsonlSession(path) as session:
            engine = QueryEngine(models["anthropic"], tools=TOOLS, session=session)
            servers.script = [
                Rep(think="Look.", calls=[("toolu_S1", "lookup", {"key": "s"})]),
                Rep(think="Ok.", text="s."),
            ]
            assert ended(await turn(engine, "What is s?")).reason == "completed"

    async def resumed(model: str, prompt: str, reps: list[Rep]) -> QueryEngine:
        session, loaded = JsonlSession.resume(path)
        assert loaded.repairs == []
        with session:
            engine = QueryEngine(models[model], tools=TOOLS, session=session, messages=loaded.messages)
            servers.script = reps
            assert ended(await turn(engine, prompt)).reason == "completed"
        return engine

    run(first())
    run(
        resumed(
            "responses",
            "And t?",
            [
                Rep(think="Thinking on t.", calls=[("call_t", "lookup", {"key": "t"})]),
                Rep(think="Fine.", text="t."),
            ],
        )
    )
    run(resumed("chat", "And u?", [Rep(calls=[(KIMI_ID, "lookup", {"key": "u"})]), Rep(text="u.")]))
    engine = run(resumed("anthropic", "All?", [Rep(think="All of them.", text="s, t, u.")]))
    assert servers.problems() == []
    assert len(engine.messages) == 14
    final = servers.bodies("anthropic")[-1]
    thinking = [b for m in final["messages"] for b in _blocks(m, "thinking")]
    assert [b["signature"] for b in thinking] == [f"{ANTHROPIC_SIG}1", f"{ANTHROPIC_SIG}2"]
    # the Responses reasoning item survived the file and the Chat turn in between
    assert any(it.get("type") == "reasoning" for it in servers.bodies("responses")[-1]["input"])


def test_crashed_session_from_one_provider_resumes_on_another(tmp_path: Path) -> None:
    """A process running a Kimi-made call died; the file resumes on Anthropic with thinking on."""
    path = tmp_path / "crash.jsonl"
    with JsonlSession(path) as session:
        session.append_message(Message.user("Run it"))
        session.append_message(
            Message(
                role="assistant",
                content=[
                    ThinkingBlock(thinking="Kimi thinks.", signature='{"type":"reasoning_content"}'),
                    ToolUseBlock(id=KIMI_ID, name="lookup", input={"key": "r"}),
                ],
            )
        )
    servers = Servers()
    models = servers.models()

    async def main() -> None:
        session, loaded = JsonlSession.resume(path)
        assert loaded.repairs == [f"added a synthetic result for tool_use '{KIMI_ID}' (lookup)"]
        with session:
            engine = QueryEngine(models["anthropic"], tools=TOOLS, session=session, messages=loaded.messages)
            servers.script = [Rep(text="It was interrupted.")]
            assert ended(await turn(engine, None)).reason == "completed"

    run(main())
    assert servers.problems() == []
    (body,) = servers.bodies("anthropic")
    assert "thinking" not in body and "Kimi thinks." not in json.dumps(body)


# --------------------------------------------------------------------------- attachments


def test_an_image_block_is_refused_before_anything_is_sent() -> None:
    """The docs: a message holds no images or files; an image block is a ValidationError that
    lists the block types there are, so no provider ever gets one."""
    image = {"type": "image", "source": {"type": "base64", "media_type": "image/png", "data": "iVBORw0KGgo="}}
    with pytest.raises(ValidationError, match="text") as caught:
        Message.model_validate(
            {"role": "user", "content": [{"type": "text", "text": "What is this?"}, image]}
        )
    assert "tool_result" in str(caught.value)


# --------------------------------------------------------------------------- the property

APIS = ["anthropic", "chat", "responses", "deepseek", "mistral", "gemini", "grok", "ds_anthropic"]
MADE_UP = ["multi_tool_use.parallel", "", "functions.lookup", "x" * 70]
ID_STYLES: dict[str, Callable[[int], str]] = {
    "anthropic": lambda n: f"toolu_01{n:022d}",
    "openai": lambda n: f"call_{n:024d}",
    "vllm": lambda n: f"chatcmpl-tool-{n:032x}",
    "kimi": lambda n: f"functions.lookup:{n}",
    "long": lambda n: f"id-{n}-" + "y" * 80,
    "mistral": lambda n: f"{n:09d}",
    "reused": lambda n: "call_0",
}


@dataclass
class Step:
    api: str
    think: bool
    calls: list[str]  # id styles
    interrupt: str | None
    final_think: bool
    made_up: str | None = None  # a tool name the model made up, for its last call
    text: bool = True
    cut: bool = False


steps = st.builds(
    Step,
    api=st.sampled_from(APIS),
    think=st.booleans(),
    calls=st.lists(st.sampled_from(sorted(ID_STYLES)), max_size=4),
    made_up=st.sampled_from([None, None, *MADE_UP]),
    text=st.booleans(),
    cut=st.booleans(),
    interrupt=st.sampled_from(
        [None, None, "thinking_delta", "text_delta", "tool_input_delta", "tool_call_started"]
    ),
    final_think=st.booleans(),
)


def _replies(step: Step, n: int) -> list[Rep]:
    blocking = step.interrupt == "tool_call_started" and step.calls
    calls = [
        (
            ID_STYLES[style](n + k),
            "wait_forever" if blocking and k == 0 else "lookup",
            {"reason": "r"} if blocking and k == 0 else {"key": str(k)},
        )
        for k, style in enumerate(step.calls)
    ]
    if step.made_up is not None and calls and not blocking:
        calls[-1] = (calls[-1][0], step.made_up, calls[-1][2])
    first = Rep(
        think="Thinking it over." if step.think else "",
        text="Working on it." if step.text else "",
        calls=calls,
        cut=step.cut and bool(calls) and step.interrupt != "tool_call_started",
    )
    return [first, Rep(think="Wrapping up." if step.final_think else "", text="Done.")]


async def _play(servers: Servers, plan: list[Step]) -> QueryEngine:
    models = servers.models()
    engine = QueryEngine(models[plan[0].api], tools=TOOLS)
    for n, step in enumerate(plan):
        engine.model = models[step.api]
        servers.script = _replies(step, 10 * n)
        await turn(engine, f"Question {n}?", interrupt_on=step.interrupt)
        assert validate_transcript(engine.messages) == []
    return engine


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(plan=st.lists(steps, min_size=2, max_size=6))
def test_every_request_is_valid_for_its_api_whatever_the_switches(plan: list[Step]) -> None:
    servers = Servers()
    engine = run(_play(servers, plan))
    assert servers.problems() == []
    assert all(not e.partial or e.role == "assistant" for e in engine.messages)
    apis_asked = [api for api, _ in servers.requests]
    assert set(apis_asked) <= set(APIS) and apis_asked[0] == plan[0].api


def test_a_child_on_another_provider_never_sends_its_parents_key() -> None:
    """The child's tool prints the environment; the parent's Anthropic key, and the child's own
    Responses key, are replaced before the child's next request to the Responses API."""
    servers = Servers()
    models = servers.models()
    anthropic_key, openai_key = "sk-ant-test-key-0123456789abcdef", "sk-openai-test-key-0123456789"

    @tool
    async def printenv() -> str:
        """Print the environment."""
        return f"ANTHROPIC_API_KEY={anthropic_key}\nOPENAI_API_KEY={openai_key}\nHOME=/root"

    replies = {
        "anthropic": [Rep(calls=[("toolu_T1", "task", {"task": "Show the env."})]), Rep(text="Done.")],
        "responses": [Rep(calls=[("call_env", "printenv", {})]), Rep(text="HOME is /root.")],
    }
    servers.answer = lambda api, body: replies[api].pop(0)

    async def main() -> list[Any]:
        engine = QueryEngine(models["anthropic"], tools=[printenv, delegate_tool(model=models["responses"])])
        return await turn(engine, "What is in the env?")

    events = run(main())
    assert servers.problems() == []
    for api, body in servers.requests:
        text = json.dumps(body)
        assert anthropic_key not in text and openai_key not in text, api
    (output,) = [
        it["output"]
        for it in servers.bodies("responses")[-1]["input"]
        if it.get("type") == "function_call_output"
    ]
    assert "ANTHROPIC_API_KEY=[REDACTED]" in json.dumps(output) and "HOME=/root" in json.dumps(output)
    assert all(anthropic_key not in repr(e) for e in events)


def test_anthropic_cache_counts_add_to_the_prompt_as_the_openai_ones_do() -> None:
    """Anthropic's `input_tokens` is the part after the cache; OpenAI's is the whole prompt. A run
    over both reports one kind of count."""
    servers = Servers()
    models = servers.models()

    def anthropic_with_cache_write(rep: Rep, n: int) -> str:
        stream = anthropic_stream(rep, n)
        return stream.replace(
            '"cache_read_input_tokens": 800',
            '"cache_read_input_tokens": 800, "cache_creation_input_tokens": 150',
            1,
        )

    replies = {
        "anthropic": [Rep(text="Hi.", usage=(1000, 5, 800))],
        "chat": [Rep(text="Hello.", usage=(1000, 7, 950))],
    }
    servers.answer = lambda api, body: replies[api].pop(0)

    async def main() -> tuple[TurnEnded, TurnEnded]:
        engine = QueryEngine(models["anthropic"])
        first = ended(await turn(engine, "Hi"))
        engine.model = models["chat"]
        return first, ended(await turn(engine, "Again"))

    STREAMS["anthropic"] = anthropic_with_cache_write
    try:
        first, second = run(main())
    finally:
        STREAMS["anthropic"] = anthropic_stream
    # 200 uncached + 800 read + 150 written: the whole prompt, as OpenAI counts it
    assert (first.usage.input_tokens, first.usage.cache_read_tokens, first.usage.cache_write_tokens) == (
        1150,
        800,
        150,
    )
    assert (second.usage.input_tokens, second.usage.cache_read_tokens, second.usage.cache_write_tokens) == (
        1000,
        950,
        0,
    )


def test_two_calls_of_one_responses_reply_sharing_a_call_id_stay_two() -> None:
    """A Responses-compatible server that numbers its calls per response (`call_0` in each)
    sends two function call items, apart by item id and output_index, with one call_id: both
    run, with their own input, and the next request (there, and on Chat) pairs each result."""
    servers = Servers()
    models = servers.models()

    async def main() -> QueryEngine:
        engine = QueryEngine(models["responses"], tools=TOOLS, retry_budget=0)
        servers.script = [
            Rep(calls=[("call_0", "lookup", {"key": "0"}), ("call_0", "lookup", {"key": "1"})]),
            Rep(text="Both."),
        ]
        events = await turn(engine, "Look up 0 and 1")
        assert ended(events).reason == "completed", ended(events).error
        assert sorted(e.input["key"] for e in events if e.type == "tool_call_started") == ["0", "1"]
        engine.model = models["chat"]
        servers.script = [Rep(text="Still both.")]
        assert ended(await turn(engine, "Sure?")).reason == "completed"
        return engine

    engine = run(main())
    assert servers.problems() == []
    assert validate_transcript(engine.messages) == []
    items = servers.bodies("responses")[-1]["input"]
    calls = [it for it in items if it.get("type") == "function_call"]
    assert [json.loads(c["arguments"]) for c in calls] == [{"key": "0"}, {"key": "1"}]


@pytest.mark.parametrize("first", ["anthropic", "chat", "responses"])
@pytest.mark.parametrize("second", ["anthropic", "chat", "responses", "mistral"])
def test_a_call_the_token_limit_cut_is_answered_and_sent_on_another_provider(first: str, second: str) -> None:
    """The output limit cuts a call's JSON on one provider: it is not run, its error result says
    why, and the next provider gets a request it takes."""
    servers = Servers()
    models = servers.models()

    async def main() -> QueryEngine:
        engine = QueryEngine(models[first], tools=TOOLS)
        servers.script = [
            Rep(
                text="Writing.",
                calls=[("call_ok", "lookup", {"key": "a"}), ("call_cut", "lookup", {"key": "k" * 20})],
                cut=True,
            ),
            Rep(text="Too long; I will ask for less."),
        ]
        events = await turn(engine, "Go")
        results = [e.result for e in events if e.type == "tool_call_finished"]
        assert [r.is_error for r in results] == [False, True]
        assert "incomplete" in results[1].text
        engine.model = models[second]
        servers.script = [Rep(text="Fine.")]
        assert ended(await turn(engine, "Next")).reason == "completed"
        return engine

    engine = run(main())
    assert servers.problems() == []
    assert validate_transcript(engine.messages) == []


@pytest.mark.parametrize("choice", ["required", "lookup"])
def test_a_forced_tool_choice_carried_to_anthropic_with_thinking_is_a_request_it_takes(choice: str) -> None:
    """The host forces a tool (`tool_choice="required"`, OpenAI's word, or a tool's name) and
    moves to Claude with thinking on. Anthropic refuses thinking with a forced tool choice
    ("any" or "tool"), so the request goes without thinking, as for a turn it cannot think in."""
    servers = Servers()
    models = servers.models()

    async def main() -> None:
        engine = QueryEngine(models["responses"], tools=TOOLS, tool_choice=choice, max_turns=1)
        servers.script = [Rep(text="a is 1.")]
        assert ended(await turn(engine, "What is a?")).reason == "completed"
        engine.model = models["anthropic"]
        servers.script = [Rep(calls=[("toolu_2", "lookup", {"key": "b"})])]
        assert ended(await turn(engine, "And b")).reason == "max_turns"

    run(main())
    assert servers.problems() == []
    (body,) = servers.bodies("anthropic")
    expected = {"type": "any"} if choice == "required" else {"type": "tool", "name": "lookup"}
    assert body["tool_choice"] == expected and "thinking" not in body


def test_reasoning_items_go_back_only_to_the_responses_server_that_made_them() -> None:
    """OpenAI's encrypted reasoning is sealed for OpenAI, xAI's for xAI: a host that moves a
    conversation between two Responses servers (OpenAI, then Grok through `base_url`, then
    OpenAI again) sends each its own reasoning items, with their calls and messages intact."""
    servers = Servers()
    models = servers.models()

    async def main() -> None:
        engine = QueryEngine(models["responses"], tools=TOOLS)
        servers.script = [
            Rep(think="Plan.", calls=[("call_a", "lookup", {"key": "a"})]),
            Rep(think="Ok.", text="a."),
        ]
        assert ended(await turn(engine, "What is a?")).reason == "completed"
        engine.model = models["grok"]
        servers.script = [
            Rep(think="Grok plans.", calls=[("call_b", "lookup", {"key": "b"})]),
            Rep(text="b."),
        ]
        assert ended(await turn(engine, "And b?")).reason == "completed"
        engine.model = models["responses"]
        servers.script = [Rep(text="Both.")]
        assert ended(await turn(engine, "Both?")).reason == "completed"

    run(main())
    assert servers.problems() == []
    grok_last = servers.bodies("grok")[-1]["input"]
    assert [it["encrypted_content"] for it in grok_last if it.get("type") == "reasoning"] == [
        f"{GROK_ENCRYPTED}3"
    ]
    openai_last = servers.bodies("responses")[-1]["input"]
    assert [it["encrypted_content"] for it in openai_last if it.get("type") == "reasoning"] == [
        f"{ENCRYPTED}1",
        f"{ENCRYPTED}2",
    ]
    calls = [it["call_id"] for it in openai_last if it.get("type") == "function_call"]
    assert (
        calls
        == [it["call_id"] for it in openai_last if it.get("type") == "function_call_output"]
        == ["call_a", "call_b"]
    )


def test_interrupt_while_a_child_on_another_provider_runs_a_tool() -> None:
    """The parent (Chat) delegates to a child on Anthropic whose tool hangs; Ctrl-C stops both.
    The next turn, on the Responses API, sends the parent's call with its synthesized result,
    and the child's transcript is valid for Anthropic."""
    servers = Servers()
    models = servers.models()
    replies = {
        "chat": [Rep(calls=[(LONG_VLLM_ID, "task", {"task": "Wait for it."})])],
        "anthropic": [Rep(think="Wait.", calls=[("toolu_W", "wait_forever", {"reason": "x"})])],
        "responses": [Rep(think="It was stopped.", text="Stopped.")],
    }
    servers.answer = lambda api, body: replies[api].pop(0)

    async def main() -> QueryEngine:
        engine = QueryEngine(models["chat"], tools=[*TOOLS, delegate_tool(model=models["anthropic"])])
        async for event in engine.run("Delegate the wait"):
            if event.type == "tool_call_started" and event.agent_id is not None:
                engine.interrupt()
        engine.model = models["responses"]
        assert ended(await turn(engine, "What happened?")).reason == "completed"
        return engine

    engine = run(main())
    assert servers.problems() == []
    assert validate_transcript(engine.messages) == []
    items = servers.bodies("responses")[-1]["input"]
    (call,) = [it for it in items if it.get("type") == "function_call"]
    (output,) = [it for it in items if it.get("type") == "function_call_output"]
    assert call["call_id"] == output["call_id"] == LONG_VLLM_ID
    assert [it["type"] for it in items].count("reasoning") == 0  # Anthropic's thinking stayed with the child


def _thinking_sent(body: dict[str, Any]) -> list[str]:
    """The signatures and redacted data of the thinking a Messages request carries, in order."""
    return [
        b["signature"] if b["type"] == "thinking" else b["data"]
        for m in body["messages"]
        for b in _blocks(m, "thinking") + _blocks(m, "redacted_thinking")
    ]


def test_thinking_of_an_anthropic_compatible_server_goes_back_to_that_server_only() -> None:
    """DeepSeek's Anthropic API signs its thinking with its own keys, as api.anthropic.com does:
    a host that moves a conversation from one to the other and back (`engine.model`) sends each
    server its own thinking only, while the transcript keeps all of it."""
    servers = Servers()
    models = servers.models()
    claude = AnthropicModel(
        "claude-sonnet-4-6", api_key="sk-ant-test-key-0123456789abcdef", http_client=servers.client, thinking=2000
    )

    async def main() -> QueryEngine:
        engine = QueryEngine(models["ds_anthropic"], tools=TOOLS)
        servers.script = [
            Rep(think="Look a up.", calls=[("toolu_D1", "lookup", {"key": "a"})]),
            Rep(think="Got a.", text="a."),
        ]
        assert ended(await turn(engine, "What is a?")).reason == "completed"
        engine.model = claude
        servers.script = [
            Rep(think="Look b up.", calls=[("toolu_C1", "lookup", {"key": "b"})]),
            Rep(think="Got b.", text="b."),
        ]
        assert ended(await turn(engine, "And b?")).reason == "completed"
        engine.model = models["ds_anthropic"]
        servers.script = [Rep(text="a and b.")]
        assert ended(await turn(engine, "Both?")).reason == "completed"
        return engine

    engine = run(main())
    assert servers.problems() == []
    assert [api for api, _ in servers.requests] == ["ds_anthropic"] * 2 + ["anthropic"] * 2 + ["ds_anthropic"]
    to_claude = servers.bodies("anthropic")
    assert [_thinking_sent(body) for body in to_claude] == [[], [f"{ANTHROPIC_SIG}3", f"{REDACTED_DATA}3"]]
    assert all("thinking" in body for body in to_claude)
    back = servers.bodies("ds_anthropic")[-1]
    assert _thinking_sent(back) == [f"{DS_SIG}1", f"{DS_REDACTED}1", f"{DS_SIG}2", f"{DS_REDACTED}2"]
    kept = [
        b.signature if isinstance(b, ThinkingBlock) else b.data
        for m in engine.messages
        for b in m.content
        if b.type in ("thinking", "redacted_thinking")
    ]
    assert len(kept) == 8 and validate_transcript(engine.messages) == []


def test_claude_thinking_resumed_on_an_anthropic_compatible_server_mid_tool_call(tmp_path: Path) -> None:
    """Claude's turn stops at its tool call's result (`max_turns`); the session is resumed on
    DeepSeek's Anthropic API, which gets the call and its result without Claude's thinking (and
    so without `thinking`, which a tool turn that does not start with thinking cannot have),
    then back on Claude, which gets its own thinking again: the origin survives the file."""
    servers = Servers()
    models = servers.models()
    path = tmp_path / "moved.jsonl"

    async def play(model: str, prompt: str, reps: list[Rep], **options: Any) -> QueryEngine:
        session, loaded = JsonlSession.resume(path)
        assert loaded.repairs == []
        with session:
            engine = QueryEngine(models[model], tools=TOOLS, session=session, messages=loaded.messages, **options)
            servers.script = reps
            await turn(engine, prompt)
        return engine

    run(play("anthropic", "What is a?", [Rep(think="Look.", calls=[("toolu_A1", "lookup", {"key": "a"})])], max_turns=1))
    run(play("ds_anthropic", "Go on.", [Rep(think="DeepSeek on a.", text="a."), Rep(text="Sure.")]))
    engine = run(play("anthropic", "Sure?", [Rep(text="Yes.")]))
    assert servers.problems() == []
    first_ds, = servers.bodies("ds_anthropic")
    assert _thinking_sent(first_ds) == [] and "thinking" not in first_ds
    assert [b["id"] for m in first_ds["messages"] for b in _blocks(m, "tool_use")] == ["toolu_A1"]
    assert _thinking_sent(servers.bodies("anthropic")[-1]) == [f"{ANTHROPIC_SIG}1", f"{REDACTED_DATA}1"]
    assert validate_transcript(engine.messages) == []
