"""Benchmark (and oracle check) of the provider adapters against the official SDKs.

Usage: ``.venv/bin/python benchmarks/bench_providers.py [--reps N] [--repeat K]``

For each API the recorded fixture streams (tests/models/fixtures) are made
longer by repeating their text/thinking delta events ``K`` times, served
through a mock transport one SSE event per chunk, and parsed + accumulated by:

- agentloop: the adapter (`AnthropicModel`, `OpenAIChatModel`,
  `OpenAIResponsesModel`) feeding `agentloop._accumulate.Accumulator`;
- the official SDK's stream accumulator (``anthropic`` / ``openai``, which use
  ``httpx2``), when installed;
- a floor: the same httpx mock transport, split lines, ``json.loads`` each
  ``data:`` payload, nothing else.

Prints µs per SSE event and ratios. Then, as an oracle, compares agentloop's
final message with each SDK's on the unmodified fixtures (text, tool names and
inputs, thinking, stop reason) and prints OK / MISMATCH. Nothing is asserted.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from pathlib import Path
from typing import Any

import httpx

from agentloop._abort import AbortController
from agentloop._accumulate import Accumulator
from agentloop._messages import Message, TextBlock, ThinkingBlock
from agentloop.models import AnthropicModel, ModelRequest, OpenAIChatModel, OpenAIResponsesModel

FIXTURES = Path(__file__).resolve().parent.parent / "tests" / "models" / "fixtures"
GROUPS: dict[str, list[str]] = {
    "anthropic": [
        "anthropic_text.sse",
        "anthropic_tool_use.sse",
        "anthropic_thinking_tool_use.assembled.sse",
        "anthropic_refusal.sdkfixture.sse",
        "anthropic_tool_use.sdkfixture.sse",
        "anthropic_web_search.repaired.sse",
    ],
    "openai_chat": [
        "openai_chat_text.recorded.sse",
        "openai_chat_tool.recorded.sse",
        "openai_chat_parallel_tools.recorded.sse",
        "openai_chat_logprobs.recorded.sse",
    ],
    "openai_responses": [
        "openai_responses_text.prism.sse",
        "openai_responses_reasoning_function_call.prism.sse",
    ],
}
_REPEATABLE = ('"text_delta"', '"thinking_delta"', '"content":"', "response.output_text.delta",
               "response.reasoning_summary_text.delta")  # fmt: skip


def load(name: str) -> bytes:
    body = (FIXTURES / name).read_bytes()
    while not body.endswith(b"\n\n"):
        body += b"\n"
    return body


def events_of(body: bytes) -> list[bytes]:
    return [e + b"\n\n" for e in body.split(b"\n\n") if e.strip()]


def lengthen(body: bytes, k: int) -> list[bytes]:
    """The stream's events (one per chunk), text/thinking deltas repeated ``k`` times.

    The final copies of the text that a Responses stream sends after its deltas (``.done``
    events, the finished item, the completed response) are rewritten to the lengthened text,
    so the stream stays one a server could send: its final copies are authoritative."""
    out: list[bytes] = []
    for ev in events_of(body):
        text = ev.decode()
        repeat = k if any(m in text for m in _REPEATABLE) and "tool_calls" not in text else 1
        out.extend([ev] * repeat)
    if b"event: response." in body:
        out = _finals_follow_deltas(out)
    return out


def _finals_follow_deltas(events: list[bytes]) -> list[bytes]:
    """A Responses stream with every final copy of a text part set to what its deltas add up to."""
    texts: dict[tuple[str, int, int], str] = {}
    out: list[bytes] = []
    for ev in events:
        head, sep, data = ev.decode().partition("data: ")
        if not sep:
            out.append(ev)
            continue
        obj = json.loads(data)
        kind = obj.get("type", "")
        if kind == "response.output_text.delta":
            key = ("text", obj["output_index"], obj["content_index"])
            texts[key] = texts.get(key, "") + obj["delta"]
        elif kind == "response.reasoning_summary_text.delta":
            key = ("summary", obj["output_index"], obj["summary_index"])
            texts[key] = texts.get(key, "") + obj["delta"]
        else:
            _set_finals(obj, texts)
        out.append(f"{head}data: {json.dumps(obj, ensure_ascii=False, separators=(',', ':'))}\n\n".encode())
    return out


def _set_finals(obj: dict[str, Any], texts: dict[tuple[str, int, int], str]) -> None:
    kind = obj.get("type", "")
    index = obj.get("output_index")
    if kind in ("response.output_text.done", "response.content_part.done"):
        final = texts.get(("text", index, obj.get("content_index")))
        target = obj if kind.endswith("text.done") else obj.get("part", {})
    elif kind in ("response.reasoning_summary_text.done", "response.reasoning_summary_part.done"):
        final = texts.get(("summary", index, obj.get("summary_index")))
        target = obj if kind.endswith("text.done") else obj.get("part", {})
    elif kind == "response.output_item.done":
        _set_item(obj["item"], index, texts)
        return
    elif kind == "response.completed":
        for i, item in enumerate(obj["response"].get("output") or []):
            _set_item(item, i, texts)
        return
    else:
        return
    if final is not None and "text" in target:
        target["text"] = final


def _set_item(item: dict[str, Any], index: Any, texts: dict[tuple[str, int, int], str]) -> None:
    for field, parts in (("text", item.get("content") or []), ("summary", item.get("summary") or [])):
        for j, part in enumerate(parts):
            final = texts.get((field, index, j))
            if final is not None and "text" in part:
                part["text"] = final


# -- the three contenders -------------------------------------------------------


class Chunks(httpx.AsyncByteStream):
    def __init__(self, chunks: list[bytes]) -> None:
        self.chunks = chunks

    async def __aiter__(self) -> AsyncIterator[bytes]:
        for c in self.chunks:
            yield c


def httpx_client(chunks: list[bytes]) -> httpx.AsyncClient:
    def handler(request: httpx.Request) -> httpx.Response:
        return httpx.Response(200, headers={"content-type": "text/event-stream"}, stream=Chunks(chunks))

    return httpx.AsyncClient(transport=httpx.MockTransport(handler))


_MODELS = {
    "anthropic": AnthropicModel,
    "openai_chat": OpenAIChatModel,
    "openai_responses": OpenAIResponsesModel,
}
_REQUEST = ModelRequest(messages=[Message.user("hi")])


async def run_agentloop(group: str, client: httpx.AsyncClient) -> Accumulator:
    model = _MODELS[group]("m", api_key="bench-key", http_client=client)
    acc = Accumulator()
    async for ev in model.stream(_REQUEST, AbortController().signal):
        acc.feed(ev)
    return acc


async def run_floor(group: str, client: httpx.AsyncClient, *, raw: bool = False) -> int:
    """Split lines and json.loads each data payload; ``raw`` reads the transport stream
    directly (as agentloop does) instead of through `Response.aiter_bytes`."""
    n = 0
    async with client.stream("POST", "http://bench/", content=b"{}") as response:
        tail = b""
        source: Any = response.stream if raw else response.aiter_bytes()
        async for chunk in source:
            lines = (tail + chunk).split(b"\n")
            tail = lines.pop()
            for line in lines:
                if line.startswith(b"data:") and line[5:].strip() != b"[DONE]":
                    json.loads(line[5:])
                    n += 1
    return n


def sdk_runner(group: str) -> Callable[[list[bytes]], Awaitable[Any]] | None:
    """An async function running the official SDK over the chunks, or None if not installed."""
    try:
        import httpx2  # type: ignore[import-not-found]

        if group == "anthropic":
            import anthropic  # type: ignore[import-not-found]
        else:
            import openai  # type: ignore[import-not-found]
    except ImportError:
        return None

    class Chunks2(httpx2.AsyncByteStream):  # type: ignore[misc]
        def __init__(self, chunks: list[bytes]) -> None:
            self.chunks = chunks

        async def __aiter__(self) -> AsyncIterator[bytes]:
            for c in self.chunks:
                yield c

    def client2(chunks: list[bytes]) -> Any:
        def handler(request: Any) -> Any:
            return httpx2.Response(200, headers={"content-type": "text/event-stream"}, stream=Chunks2(chunks))

        return httpx2.AsyncClient(transport=httpx2.MockTransport(handler))

    msgs = [{"role": "user", "content": "hi"}]

    async def run(chunks: list[bytes]) -> Any:
        http = client2(chunks)
        if group == "anthropic":
            a = anthropic.AsyncAnthropic(api_key="x", max_retries=0, http_client=http)
            async with a.messages.stream(model="m", max_tokens=16, messages=msgs) as s:
                return await s.get_final_message()
        o = openai.AsyncOpenAI(api_key="x", max_retries=0, http_client=http)
        if group == "openai_chat":
            async with o.chat.completions.stream(model="m", messages=msgs) as s:
                return await s.get_final_completion()
        async with o.responses.stream(model="m", input="hi") as s:
            return await s.get_final_response()

    return run


# -- timing ---------------------------------------------------------------------


ROUNDS = 7


async def time_all(fns: dict[str, Callable[[], Awaitable[Any]]], reps: int) -> dict[str, float]:
    """Seconds per call of each function: the best of `ROUNDS` interleaved rounds of
    ``reps`` calls (interleaving and the minimum damp the noise of a shared machine)."""
    for fn in fns.values():  # warm up
        for _ in range(3):
            await fn()
    best = dict.fromkeys(fns, float("inf"))
    for _ in range(ROUNDS):
        for name, fn in fns.items():
            start = time.perf_counter()
            for _ in range(reps):
                await fn()
            best[name] = min(best[name], (time.perf_counter() - start) / reps)
    return best


async def bench(reps: int, k: int) -> None:
    print(
        f"µs per SSE event (text/thinking deltas repeated {k}x, one event per chunk; "
        f"best of {ROUNDS} interleaved rounds of {reps} runs)\n"
    )
    header = (
        f"{'API':<18}{'events':>8}{'floor':>8}{'floor-raw':>11}{'agentloop':>11}{'SDK':>9}"
        f"{'al/floor':>10}{'al/raw':>8}{'SDK/al':>8}"
    )
    print(header)
    print("-" * len(header))
    for group, names in GROUPS.items():
        streams = [lengthen(load(n), k) for n in names]
        n_events = sum(len(s) for s in streams)
        clients = [httpx_client(s) for s in streams]

        async def floor(clients: list[httpx.AsyncClient] = clients, group: str = group) -> None:
            for c in clients:
                await run_floor(group, c)

        async def floor_raw(clients: list[httpx.AsyncClient] = clients, group: str = group) -> None:
            for c in clients:
                await run_floor(group, c, raw=True)

        async def ours(clients: list[httpx.AsyncClient] = clients, group: str = group) -> None:
            for c in clients:
                await run_agentloop(group, c)

        fns: dict[str, Callable[[], Awaitable[Any]]] = {"floor": floor, "raw": floor_raw, "ours": ours}
        sdk = sdk_runner(group)
        if sdk is not None:

            async def theirs(streams: list[list[bytes]] = streams, sdk: Any = sdk) -> None:
                for s in streams:
                    await sdk(s)

            fns["sdk"] = theirs
        t = {k_: v / n_events * 1e6 for k_, v in (await time_all(fns, reps)).items()}
        if "sdk" in t:
            sdk_cols, ratio = f"{t['sdk']:>9.2f}", f"{t['sdk'] / t['ours']:>8.2f}"
        else:
            sdk_cols, ratio = f"{'n/a':>9}", f"{'n/a':>8}"
        print(
            f"{group:<18}{n_events:>8}{t['floor']:>8.2f}{t['raw']:>11.2f}{t['ours']:>11.2f}{sdk_cols}"
            f"{t['ours'] / t['floor']:>10.2f}{t['ours'] / t['raw']:>8.2f}{ratio}"
        )
        for c in clients:
            await c.aclose()


# -- oracle ---------------------------------------------------------------------


def ours_summary(acc: Accumulator) -> dict[str, Any]:
    msg = acc.message()
    return {
        "text": "".join(b.text for b in msg.content if isinstance(b, TextBlock)),
        "tools": [(t.name, t.input) for t in msg.tool_uses],
        "thinking": "".join(b.thinking for b in msg.content if isinstance(b, ThinkingBlock)),
        "stop": acc.stop_reason,
    }


def sdk_summary(group: str, final: Any) -> dict[str, Any]:
    if group == "anthropic":
        blocks = final.content
        return {
            "text": "".join(b.text for b in blocks if b.type == "text"),
            "tools": [(b.name, b.input) for b in blocks if b.type == "tool_use"],
            "thinking": "".join(b.thinking for b in blocks if b.type == "thinking"),
            "stop": final.stop_reason,
        }
    if group == "openai_chat":
        choice = final.choices[0]
        calls = choice.message.tool_calls or []
        finish = {"stop": "end_turn", "tool_calls": "tool_use", "length": "max_tokens"}[choice.finish_reason]
        return {
            "text": choice.message.content or "",
            "tools": [(c.function.name, json.loads(c.function.arguments)) for c in calls],
            "thinking": "",
            "stop": "tool_use" if calls else finish,
        }
    items = final.output
    calls = [(i.name, json.loads(i.arguments)) for i in items if i.type == "function_call"]
    return {
        "text": "".join(
            c.text for i in items if i.type == "message" for c in i.content if c.type == "output_text"
        ),
        "tools": calls,
        "thinking": "\n\n".join(s.text for i in items if i.type == "reasoning" for s in i.summary),
        "stop": "tool_use" if calls else "end_turn",
    }


async def oracle() -> None:
    print("\nOracle (agentloop final message vs the official SDK's, unmodified fixtures):")
    for group, names in GROUPS.items():
        sdk = sdk_runner(group)
        for name in names:
            chunks = events_of(load(name))
            async with httpx_client(chunks) as client:
                ours = ours_summary(await run_agentloop(group, client))
            if sdk is None:
                print(f"  {'SKIP':<9}{name} (SDK not installed)")
                continue
            try:
                theirs = sdk_summary(group, await sdk(chunks))
            except Exception as exc:
                print(f"  {'SDK-ERR':<9}{name}: {type(exc).__name__}: {exc}")
                continue
            status = "OK" if ours == theirs else "MISMATCH"
            print(f"  {status:<9}{name}")
            if status != "OK":
                for key in ours:
                    if ours[key] != theirs[key]:
                        print(
                            f"      {key}: agentloop={ours[key]!r}\n      {' ' * len(key)}  sdk={theirs[key]!r}"
                        )


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--reps", type=int, default=20, help="runs of each stream per round (default 20)")
    parser.add_argument("--repeat", type=int, default=20, help="text/thinking delta repetition (default 20)")
    args = parser.parse_args()
    asyncio.run(bench(args.reps, args.repeat))
    asyncio.run(oracle())


if __name__ == "__main__":
    main()
