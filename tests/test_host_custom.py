"""A host with a model adapter of its own and a large tool set, built from the docs alone.

The adapter speaks an invented NDJSON protocol (one JSON object a line) over httpx to a local
model server played by an ``httpx.MockTransport``; the tools are written the way users write
them (pydantic models, enums, ``Literal``, optional and defaulted parameters, blocking work
handed to a thread, results of every shape). After every run: a valid transcript, and nothing
left open (the conftest fixtures check responses and tasks).
"""

from __future__ import annotations

import asyncio
import enum
import json
import time
from collections.abc import AsyncIterator, Callable, Iterable
from contextlib import aclosing
from typing import Any, Literal

import httpx
import pytest
from pydantic import BaseModel, Field

from agentloop import (
    AbortSignal,
    Event,
    Message,
    ModelError,
    QueryEngine,
    ScriptedModel,
    ScriptedResponse,
    ScriptedToolCall,
    StreamProtocolError,
    TextDelta,
    ThinkingBlock,
    ToolCallFinished,
    ToolCallStarted,
    ToolContext,
    TurnEnded,
    tool,
    validate_transcript,
)
from agentloop.models import (
    ModelRequest,
    StreamBlockStop,
    StreamEnd,
    StreamEvent,
    StreamSignature,
    StreamText,
    StreamThinking,
    StreamToolInput,
    StreamToolUseStart,
    StreamUsage,
    Usage,
    parse_retry,
)
from agentloop.testing import assert_valid, collect

# ---------------------------------------------------------------------------------------------
# The local model server's protocol: POST /generate, one JSON object a line:
#   {"t": "text", "i": 0, "v": "..."}            {"t": "think", "i": 0, "v": "..."}
#   {"t": "sig", "i": 0, "v": "..."}             {"t": "call", "i": 1, "id": "c1", "name": "x"}
#   {"t": "args", "i": 1, "v": "{\"a\":"}        {"t": "close", "i": 1}
#   {"t": "usage", "in": 10, "out": 5}           {"t": "done", "why": "stop" | "tools" | "length"}
#   {"t": "error", "v": "...", "retry": true}


STOP_REASONS = {"stop": "end_turn", "tools": "tool_use", "length": "max_tokens"}


def to_wire(messages: Iterable[Message]) -> list[dict[str, Any]]:
    """The transcript in the server's format (done at once: the view is valid during the call)."""
    return [
        {"role": m.role, "parts": [{"kind": b.type, **b.model_dump(exclude={"type"})} for b in m.content]}
        for m in messages
    ]


class LocalModel:
    """A `Model` for the local server: one streamed POST a request, NDJSON back."""

    def __init__(self, client: httpx.AsyncClient, url: str = "http://local.model/generate") -> None:
        self.client = client
        self.url = url
        self.bodies: list[dict[str, Any]] = []

    async def stream(self, request: ModelRequest, signal: AbortSignal) -> AsyncIterator[StreamEvent]:
        body = {
            "system": request.system,
            "messages": to_wire(request.messages),
            "tools": [{"name": t.name, "description": t.description, "schema": dict(t.input_schema)} for t in request.tools],
            "max_tokens": request.max_tokens,
        }
        self.bodies.append(body)
        async with self.client.stream("POST", self.url, json=body) as response:
            if response.status_code != 200:
                await response.aread()
                retryable, retry_after = parse_retry(response.status_code, response.headers)
                message = f"local model HTTP {response.status_code}: {response.text[:200]}"
                raise ModelError(message, retryable=retryable, retry_after=retry_after)
            async with aclosing(response.aiter_lines()) as lines:
                async for line in lines:
                    if not line.strip():
                        continue
                    for event in self.events(line):
                        yield event

    def events(self, line: str) -> list[StreamEvent]:
        try:
            obj = json.loads(line)
        except ValueError:
            raise StreamProtocolError(f"local model sent a line that is not JSON: {line[:60]!r}", retryable=True) from None
        kind = obj.get("t")
        if kind == "text":
            return [StreamText(obj["i"], obj["v"])]
        if kind == "think":
            return [StreamThinking(obj["i"], obj["v"])]
        if kind == "sig":
            return [StreamSignature(obj["i"], obj["v"])]
        if kind == "call":
            return [StreamToolUseStart(obj["i"], obj["id"], obj["name"])]
        if kind == "args":
            return [StreamToolInput(obj["i"], obj["v"])]
        if kind == "close":
            return [StreamBlockStop(obj["i"])]
        if kind == "usage":
            return [StreamUsage(Usage(input_tokens=obj["in"], output_tokens=obj["out"]))]
        if kind == "done":
            return [StreamEnd(STOP_REASONS.get(obj["why"], obj["why"]))]
        if kind == "error":
            raise ModelError(f"local model: {obj['v']}", retryable=bool(obj.get("retry")))
        raise StreamProtocolError(f"local model sent an unknown event {kind!r}", retryable=True)


# ---------------------------------------------------------------------------------------------
# The server: each request takes the next scripted reply (lines, or a status with a body).


def ln(**fields: Any) -> str:
    return json.dumps(fields) + "\n"


def text_reply(text: str, *, usage: tuple[int, int] = (10, 5)) -> list[str]:
    words = text.split(" ")
    pieces = [words[0]] + [" " + w for w in words[1:]]
    lines = [ln(t="text", i=0, v=p) for p in pieces]
    return [*lines, ln(t="close", i=0), ln(t="usage", **{"in": usage[0], "out": usage[1]}), ln(t="done", why="stop")]


def calls_reply(*calls: tuple[str, dict[str, Any]], think: str | None = None, pieces: int = 3) -> list[str]:
    lines: list[str] = []
    index = 0
    if think is not None:
        lines += [ln(t="think", i=0, v=think), ln(t="sig", i=0, v="sig-" + think[:8]), ln(t="close", i=0)]
        index = 1
    for n, (name, args) in enumerate(calls):
        raw = json.dumps(args)
        step = max(1, len(raw) // pieces + 1)
        lines.append(ln(t="call", i=index, id=f"c{index}_{n}", name=name))
        lines += [ln(t="args", i=index, v=raw[k : k + step]) for k in range(0, len(raw), step)]
        lines.append(ln(t="close", i=index))
        index += 1
    return [*lines, ln(t="usage", **{"in": 20, "out": 8}), ln(t="done", why="tools")]


class Hang(httpx.AsyncByteStream):
    """A body that sends its lines, then holds the connection open until closed."""

    def __init__(self, lines: list[str]) -> None:
        self.lines = lines
        self.closed = False
        self.sent = asyncio.Event()

    async def __aiter__(self) -> AsyncIterator[bytes]:
        for line in self.lines:
            yield line.encode()
        self.sent.set()
        await asyncio.Event().wait()  # until cancelled

    async def aclose(self) -> None:
        self.closed = True


Reply = list[str] | httpx.Response | Hang


class Server:
    def __init__(self, replies: list[Reply]) -> None:
        self.replies = list(replies)
        self.requests: list[dict[str, Any]] = []

    def handle(self, request: httpx.Request) -> httpx.Response:
        self.requests.append(json.loads(request.content))
        reply = self.replies.pop(0)
        if isinstance(reply, httpx.Response):
            return reply
        if isinstance(reply, Hang):
            return httpx.Response(200, stream=reply, headers={"content-type": "application/x-ndjson"})
        return httpx.Response(200, content="".join(reply).encode(), headers={"content-type": "application/x-ndjson"})

    def client(self) -> httpx.AsyncClient:
        return httpx.AsyncClient(transport=httpx.MockTransport(self.handle))


async def run_all(engine: QueryEngine, prompt: str | None) -> list[Event]:
    events = await collect(engine.run(prompt))
    assert validate_transcript(engine.messages) == []
    assert not engine.running
    return events


def ended(events: list[Event]) -> TurnEnded:
    last = events[-1]
    assert isinstance(last, TurnEnded)
    return last


# ---------------------------------------------------------------------------------------------
# The tools, as users write them.


class Priority(enum.Enum):
    low = "low"
    high = "high"


class Address(BaseModel):
    city: str
    zip_code: str | None = None


class Customer(BaseModel):
    name: str
    tags: list[str] = Field(default_factory=list)
    address: Address


@tool
async def create_ticket(
    title: str,
    priority: Priority,
    customer: Customer,
    channel: Literal["email", "phone"] = "email",
    assignee: str | None = None,
    labels: list[str] | None = None,
) -> dict[str, Any]:
    """Open a support ticket.

    Args:
        title: One line saying what is wrong.
        priority: How urgent it is.
        customer: Who reported it.
        channel: How they reached us.
        assignee: Who takes it, if anyone yet.
        labels: Free-form labels.
    """
    return {
        "title": title,
        "priority": priority.value,
        "city": customer.address.city,
        "channel": channel,
        "assignee": assignee,
        "labels": labels or [],
    }


def blocking_lookup(sku: str) -> str:
    time.sleep(0.01)  # a blocking client library
    return f"{sku}: 3 in stock"


@tool(concurrency_safe=True)
async def stock(sku: str) -> str:
    """How many of an item are in stock."""
    return await asyncio.to_thread(blocking_lookup, sku)


@tool
async def list_orders(customer: str) -> list[dict[str, Any]]:
    """The customer's orders."""
    return [{"id": 1, "customer": customer}, {"id": 2, "customer": customer}]


@tool
async def get_customer(name: str) -> Customer:
    """Look a customer up."""
    return Customer(name=name, tags=["vip"], address=Address(city="Oslo"))


@tool
async def thumbnail(sku: str) -> bytes:
    """The item's picture."""
    return b"\x89PNG\r\n\x1a\n" + sku.encode()


@tool
async def fetch_page(url: str) -> bytes:
    """Fetch a page (as an HTTP client's ``response.content``)."""
    return f'<p class="note">{url}</p>\nÅpen 09:00\n'.encode()


@tool
async def forget(sku: str) -> None:
    """Drop an item from the cache."""


@tool
async def export(rows: int) -> str:
    """Export the table as CSV."""
    return "".join(f"{n},row number {n}\n" for n in range(rows))


@tool
async def crash(reason: str) -> str:
    """Always fails."""
    raise RuntimeError(f"backend down: {reason}")


ALL_TOOLS = [create_ticket, stock, list_orders, get_customer, thumbnail, fetch_page, forget, export, crash]

# ---------------------------------------------------------------------------------------------
# The adapter


async def test_a_full_exchange_over_the_adapter() -> None:
    ticket = {
        "title": "Broken lid",
        "priority": "high",
        "customer": {"name": "Ann", "address": {"city": "Oslo"}},
        "channel": "phone",
    }
    server = Server([calls_reply(("create_ticket", ticket), ("stock", {"sku": "LID-1"}), think="The lid is broken"), text_reply("Ticket opened.")])
    async with server.client() as client:
        engine = QueryEngine(LocalModel(client), tools=ALL_TOOLS, system="Be brief.")
        events = await run_all(engine, "My lid broke")
    end = ended(events)
    assert end.reason == "completed"
    assert end.usage == Usage(30, 13)
    answer = engine.messages[1]
    assert isinstance(answer.content[0], ThinkingBlock)
    assert answer.content[0].signature == "sig-The lid "
    assert [u.input for u in answer.tool_uses] == [ticket, {"sku": "LID-1"}]
    results = engine.messages[2].tool_results
    assert json.loads(results[0].text) == {
        "title": "Broken lid", "priority": "high", "city": "Oslo", "channel": "phone", "assignee": None, "labels": [],
    }
    assert results[1].text == "LID-1: 3 in stock"
    assert engine.messages[-1].text == "Ticket opened."
    # The second request carried the thinking (with its signature), the calls and their results.
    second = server.requests[1]["messages"]
    assert second[1]["parts"][0] == {"kind": "thinking", "thinking": "The lid is broken", "signature": "sig-The lid "}
    assert second[2]["parts"][0]["kind"] == "tool_result"
    assert server.requests[0]["system"] == "Be brief."


async def test_the_schema_the_server_sees() -> None:
    schema = create_ticket.input_schema
    props = schema["properties"]
    assert schema["required"] == ["title", "priority", "customer"]
    assert props["priority"]["enum"] == ["low", "high"]
    assert props["channel"]["enum"] == ["email", "phone"] and props["channel"]["default"] == "email"
    assert props["customer"]["properties"]["address"]["properties"]["city"] == {"type": "string"}
    assert props["title"]["description"] == "One line saying what is wrong."
    assert "$ref" not in json.dumps(schema)


async def test_an_interrupt_mid_stream_closes_the_response() -> None:
    body = Hang([ln(t="text", i=0, v="Looking"), ln(t="text", i=0, v=" into it")])
    server = Server([body])
    async with server.client() as client:
        engine = QueryEngine(LocalModel(client), tools=ALL_TOOLS)
        run = engine.run("Where is my order?")
        seen = ""
        async for event in run:
            if isinstance(event, TextDelta):
                seen += event.text
                if seen == "Looking into it":
                    engine.interrupt()
        assert validate_transcript(engine.messages) == []
    assert body.closed
    assert engine.last_turn_ended is not None and engine.last_turn_ended.reason == "aborted_streaming"
    assert engine.messages[1].partial and engine.messages[1].text == "Looking into it"


async def test_a_429_then_a_500_are_retried() -> None:
    server = Server([
        httpx.Response(429, json={"error": "slow down"}, headers={"retry-after-ms": "30"}),
        httpx.Response(500, text="oops"),
        text_reply("Done."),
    ])
    async with server.client() as client:
        engine = QueryEngine(LocalModel(client), retry_base_delay=0)
        events = await run_all(engine, "Hi")
    retries = [e for e in events if e.type == "retrying"]
    assert [e.attempt for e in retries] == [1, 2]
    assert retries[0].delay >= 0.03  # the server's retry-after-ms, read by parse_retry
    assert "429" in retries[0].error and "500" in retries[1].error
    assert ended(events).reason == "completed"


async def test_a_400_is_not_retried() -> None:
    server = Server([httpx.Response(400, text="bad request")])
    async with server.client() as client:
        engine = QueryEngine(LocalModel(client), retry_base_delay=0)
        events = await run_all(engine, "Hi")
    end = ended(events)
    assert end.reason == "model_error" and end.error is not None and "400" in end.error
    assert len(server.requests) == 1


async def test_a_malformed_line_and_a_cut_stream_are_retried_and_erased() -> None:
    server = Server([
        [ln(t="text", i=0, v="Hel"), "{not json\n"],
        [ln(t="text", i=0, v="Hello"), ln(t="text", i=0, v=" wor")],  # no "done"
        text_reply("Hello world."),
    ])
    async with server.client() as client:
        engine = QueryEngine(LocalModel(client), retry_base_delay=0)
        events = await run_all(engine, "Hi")
    discarded = [e.text_chars for e in events if e.type == "attempt_discarded"]
    assert discarded == [3, 9]
    errors = [e.error for e in events if e.type == "retrying"]
    assert "not JSON" in errors[0]
    assert ended(events).reason == "completed"
    assert engine.messages[-1].text == "Hello world."


class BrokenModel:
    """Fails in each way a model of one's own can fail before or instead of a good event."""

    def __init__(self, how: str) -> None:
        self.how = how
        self.calls = 0

    def stream(self, request: ModelRequest, signal: AbortSignal) -> AsyncIterator[StreamEvent]:
        self.calls += 1
        if self.how == "call":
            raise ModelError("the server is not running")
        return self.events()

    async def events(self) -> AsyncIterator[Any]:
        if self.how == "first":
            raise ModelError("no such model: llama-9")
        if self.how == "wrong-type":
            yield {"t": "text", "v": "a dict, not an event"}
        if self.how == "wrong-field":
            yield StreamText(0, 42)  # type: ignore[arg-type]
        if self.how == "subclass":
            yield LoudText(0, "HELLO")
        if self.how == "key-error":
            yield StreamText(0, "partial ")
            raise KeyError("v")
        yield StreamEnd("end_turn")


async def model_error_of(how: str) -> tuple[BrokenModel, QueryEngine, str]:
    """Run a turn on a `BrokenModel` broken `how`: it ends with a model error, given back."""
    model = BrokenModel(how)
    engine = QueryEngine(model, retry_base_delay=0)
    end = ended(await run_all(engine, "Hi"))
    assert end.reason == "model_error"
    assert end.error is not None
    return model, engine, end.error


@pytest.mark.parametrize("how", ["call", "first"])
async def test_a_model_that_fails_before_its_first_event(how: str) -> None:
    model, engine, error = await model_error_of(how)
    assert "not running" in error or "llama-9" in error
    assert model.calls == 1
    assert [m.role for m in engine.messages] == ["user"]


async def test_a_model_that_yields_something_else_is_an_error_not_silence() -> None:
    model, _, error = await model_error_of("wrong-type")
    assert "yielded dict, not one of the stream events" in error
    assert model.calls == 1  # the adapter's bug: a new attempt would meet it again


async def test_a_model_whose_event_has_a_wrong_field_is_retried() -> None:
    model, _, error = await model_error_of("wrong-field")
    assert "StreamText's text is int, not a str" in error
    assert model.calls == 4  # retried as a malformed stream, within retry_budget=3


async def test_a_bug_in_the_adapter_ends_the_turn_with_its_error() -> None:
    _, engine, error = await model_error_of("key-error")
    assert "KeyError" in error
    assert engine.messages[-1].partial and engine.messages[-1].text == "partial"


class LoudText(StreamText):
    """A host's own subclass of a stream event."""


async def test_a_subclass_of_a_stream_event_is_that_event() -> None:
    engine = QueryEngine(BrokenModel("subclass"))
    events = await run_all(engine, "Hi")
    assert ended(events).reason == "completed"
    assert engine.messages[-1].text == "HELLO"


# ---------------------------------------------------------------------------------------------
# The tools


def scripted_calls(*calls: tuple[str, dict[str, Any]]) -> ScriptedModel:
    return ScriptedModel([ScriptedResponse(tool_calls=[ScriptedToolCall(n, a) for n, a in calls]), "Done."])


async def results_of(calls: list[tuple[str, dict[str, Any]]], tools: list[Any], **options: Any) -> list[ToolCallFinished]:
    engine = QueryEngine(scripted_calls(*calls), tools=tools, **options)
    events = await run_all(engine, "Go")
    assert ended(events).reason == "completed"
    return [e for e in events if isinstance(e, ToolCallFinished)]


async def test_results_of_every_shape() -> None:
    calls = [
        ("list_orders", {"customer": "Ann"}),
        ("get_customer", {"name": "Ann"}),
        ("thumbnail", {"sku": "LID-1"}),
        ("fetch_page", {"url": "https://shop.example"}),
        ("forget", {"sku": "LID-1"}),
        ("export", {"rows": 20_000}),
        ("crash", {"reason": "maintenance"}),
    ]
    done = await results_of(calls, ALL_TOOLS)
    by_name = {e.tool_use.name: e for e in done}
    assert json.loads(by_name["list_orders"].result.text) == [{"id": 1, "customer": "Ann"}, {"id": 2, "customer": "Ann"}]
    assert json.loads(by_name["get_customer"].result.text) == {
        "name": "Ann", "tags": ["vip"], "address": {"city": "Oslo", "zip_code": None},
    }
    assert by_name["thumbnail"].result.text == "b'\\x89PNG\\r\\n\\x1a\\nLID-1'"  # not UTF-8: its repr, once
    assert by_name["fetch_page"].result.text == '<p class="note">https://shop.example</p>\nÅpen 09:00\n'
    assert by_name["forget"].result.text == "(no output)"
    big = by_name["export"]
    assert big.full_result is not None and big.full_result.text.count("\n") == 20_000
    assert len(big.result.text) < 101_000 and "characters" in big.result.text
    failed = by_name["crash"].result
    assert failed.is_error and "backend down: maintenance" in failed.text


async def test_a_tool_timeout_and_an_abort_seen_by_the_tool() -> None:
    started = asyncio.Event()
    seen: list[str] = []

    @tool(timeout=0.05)
    async def slow_report(days: int = 7) -> str:
        """Build a report (slowly)."""
        await asyncio.Event().wait()
        return "never"

    @tool
    async def watch(ctx: ToolContext) -> str:
        """Wait for the deploy to finish."""
        started.set()
        seen.append(await ctx.signal.wait())
        return "stopped watching"

    done = await results_of([("slow_report", {})], [slow_report])
    assert done[0].result.is_error and "timed out" in done[0].result.text.lower()

    engine = QueryEngine(scripted_calls(("watch", {})), tools=[watch])
    async for event in engine.run("Deploy"):
        if isinstance(event, ToolCallStarted):
            await started.wait()
            engine.interrupt()
    assert validate_transcript(engine.messages) == []
    assert seen == ["cancel"]
    assert engine.messages[2].tool_results[0].text == "stopped watching"


async def test_a_tool_reports_progress_from_its_worker_thread() -> None:
    @tool
    async def migrate(tables: list[str], ctx: ToolContext) -> str:
        """Migrate tables one by one."""

        def work() -> int:
            for n, _ in enumerate(tables):
                ctx.emit(TextDelta(text=f"[{ctx.tool_use_id}] table {n + 1}/{len(tables)}\n"))
            return len(tables)

        count = await asyncio.to_thread(work)
        assert ctx.engine is not None
        return f"migrated {count}"

    engine = QueryEngine(scripted_calls(("migrate", {"tables": ["a", "b"]})), tools=[migrate])
    events = await run_all(engine, "Migrate")
    shown = [e.text for e in events if isinstance(e, TextDelta)]
    call_id = engine.messages[1].tool_uses[0].id
    assert shown[:2] == [f"[{call_id}] table 1/2\n", f"[{call_id}] table 2/2\n"]
    assert engine.messages[2].tool_results[0].text == "migrated 2"


async def test_safe_tools_run_together_and_the_others_alone_in_order() -> None:
    log: list[str] = []
    both = asyncio.Event()
    running = 0

    @tool(concurrency_safe=True)
    async def read(key: str) -> str:
        """Read a key."""
        nonlocal running
        running += 1
        if running == 2:
            both.set()
        await both.wait()  # only returns if both reads run at once
        log.append(f"read {key}")
        return key

    @tool
    async def write(key: str) -> str:
        """Write a key."""
        log.append(f"write {key}")
        return "ok"

    calls = [("read", {"key": "a"}), ("read", {"key": "b"}), ("write", {"key": "a"}), ("read", {"key": "c"})]
    engine = QueryEngine(
        ScriptedModel([ScriptedResponse(tool_calls=[ScriptedToolCall(n, a) for n, a in calls]), "Done."]),
        tools=[read, write],
    )
    events = await run_all(engine, "Go")
    assert both.is_set()
    assert sorted(log[:2]) == ["read a", "read b"] and log[2:] == ["write a", "read c"]
    assert ended(events).reason == "completed"


def test_what_tool_refuses_it_refuses_when_made() -> None:
    with pytest.raises(TypeError, match="on_done"):

        @tool
        async def schedule(when: str, on_done: Callable[[], None]) -> str:
            """Schedule a job."""
            return when

    with pytest.raises(TypeError, match="async def"):

        @tool  # type: ignore[arg-type]
        def lookup(sku: str) -> str:
            """Blocking lookup."""
            return sku


async def test_sixty_tools_at_once() -> None:
    def make(n: int) -> Any:
        @tool(name=f"tool_{n:02d}", concurrency_safe=n % 2 == 0)
        async def handler(value: int, note: str | None = None) -> dict[str, int]:
            """Echo a value."""
            return {"tool": n, "value": value}

        return handler

    tools = [make(n) for n in range(60)]
    calls = [(f"tool_{n:02d}", {"value": n * 10}) for n in range(60)]
    seen: list[int] = []

    def check(request: ModelRequest) -> ScriptedResponse:
        seen.append(len(request.tools))
        return ScriptedResponse(tool_calls=[ScriptedToolCall(n, a) for n, a in calls])

    engine = QueryEngine(ScriptedModel([check, "All done."]), tools=tools)
    events = await run_all(engine, "Use them all")
    assert seen == [60]
    results = engine.messages[2].tool_results
    assert [json.loads(r.text) for r in results] == [{"tool": n, "value": n * 10} for n in range(60)]
    assert ended(events).reason == "completed"


# ---------------------------------------------------------------------------------------------
# The product's own tests, with agentloop.testing as docs/cookbook.md shows.


def support_agent(model: Any) -> QueryEngine:
    """The product: a support agent over the tool set, with a system prompt of its own."""
    return QueryEngine(model, tools=ALL_TOOLS, system="You are the shop's support agent.", retry_base_delay=0)


async def test_product_an_urgent_complaint_opens_a_high_priority_ticket() -> None:
    def triage(request: ModelRequest) -> ScriptedResponse:
        assert "create_ticket" in {t.name for t in request.tools}
        urgent = "urgent" in request.messages[-1].text.lower()
        customer = {"name": "Ann", "address": {"city": "Oslo"}}
        args = {"title": request.messages[-1].text[:40], "priority": "high" if urgent else "low", "customer": customer}
        return ScriptedResponse(text="Opening a ticket. ", tool_calls=[ScriptedToolCall("create_ticket", args)])

    model = ScriptedModel([triage, "Your ticket is open."])
    engine = support_agent(model)
    events = await collect(engine.run("URGENT: the lid broke"))
    assert_valid(engine.messages)
    assert ended(events).reason == "completed"  # an assertion in triage would end it with model_error
    opened = [e for e in events if isinstance(e, ToolCallFinished)]
    assert json.loads(opened[0].result.text)["priority"] == "high"
    assert model.request_count == 2
    assert model.requests[1].messages[-1].tool_results[0].tool_use_id == opened[0].tool_use.id


async def test_product_a_stop_during_a_slow_lookup_is_reported_to_the_model() -> None:
    model = ScriptedModel([
        ScriptedResponse(tool_calls=[ScriptedToolCall("slow_stock", {"sku": "LID-1"})]),
        "Sorry, I stopped.",
    ])
    started = asyncio.Event()

    @tool(name="slow_stock")
    async def slow_stock(sku: str) -> str:
        """Stock, from the slow warehouse."""
        started.set()
        await asyncio.Event().wait()
        return "never"

    engine = QueryEngine(model, tools=[slow_stock], tool_cancel_grace=0)  # it ignores ctx.signal
    async for event in engine.run("How many lids?"):
        if isinstance(event, ToolCallStarted):
            await started.wait()
            engine.interrupt()
    assert_valid(engine.messages)
    result = engine.messages[2].tool_results[0]
    assert result.is_error and result.text.startswith("Interrupted by user")
    assert engine.messages[-1].kind == "interrupt_notice"
    events = await collect(engine.run("Never mind, thanks"))  # the next run goes on from there
    assert ended(events).reason == "completed" and engine.messages[-1].text == "Sorry, I stopped."
    assert_valid(engine.messages)
