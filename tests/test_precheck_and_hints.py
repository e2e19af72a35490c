"""A `@tool`'s input checked before its permission prompt, and the errors told of a refused key,
an unended stream and an empty response: each says only what is true of the case."""

from __future__ import annotations

import asyncio
import base64
import gc
import inspect
import json
import warnings
from collections.abc import AsyncIterator
from typing import Annotated, Any

import httpx
import pytest
from pydantic import AfterValidator, Field

from agentloop import (
    AbortSignal,
    Allow,
    Deny,
    Event,
    QueryEngine,
    ScriptedModel,
    ScriptedResponse,
    ScriptedToolCall,
    Tool,
    ToolCallFinished,
    ToolCallStarted,
    ToolContext,
    ToolProgress,
    ToolUseBlock,
    TurnEnded,
    _tools,
    tool,
)
from agentloop.models import AnthropicModel, ModelRequest, OpenAIChatModel, OpenAIResponsesModel, StreamEvent
from agentloop.models._sse import ServerSentEvent, SSEDecoder
from agentloop.testing import collect, turn_ended

KEY = "sk-test-precheck-0123456789abcdefgh"
TOKEN = "tok-gateway-9876543210zyxwvutsrq"


def _tool_events(events: list[Event]) -> list[tuple[str, str]]:
    out: list[tuple[str, str]] = []
    for e in events:
        if isinstance(e, ToolCallStarted):
            out.append(("started", e.tool_use.id))
        elif isinstance(e, ToolCallFinished):
            out.append(("finished", e.result.text))
        elif isinstance(e, ToolProgress):
            out.append(("progress", e.text))
    return out


async def _allow(use: ToolUseBlock, ctx: ToolContext) -> Allow:
    return Allow()


_SEEN: list[str] = []  # the values the validator saw
_MADE: list[int] = []  # the defaults the factory made


def _check(value: str) -> str:
    _SEEN.append(value)
    if value == "boom":
        raise RuntimeError("validator bug")
    return value


def _fresh() -> list[str]:
    _MADE.append(1)
    return []


@tool
async def checked(path: Annotated[str, AfterValidator(_check)], tags: Annotated[list[str], Field(default_factory=_fresh)]) -> str:
    """T."""
    return "ran " + path


@pytest.mark.parametrize("permission", [None, _allow])
async def test_a_validator_that_raises_is_the_tools_failure(permission: Any) -> None:
    # With a permission callback, a RuntimeError from an AfterValidator escaped the check made
    # before the prompt and was told as "failed inside agentloop".
    model = ScriptedModel([ScriptedResponse(tool_calls=[ScriptedToolCall("checked", {"path": "boom"})]), "Done."])
    engine = QueryEngine(model, tools=[checked], permission=permission)
    events = await collect(engine.run("go"))
    assert turn_ended(events).reason == "completed"
    assert _tool_events(events) == [
        ("started", "toolu_0001"),
        ("finished", "Tool 'checked' raised RuntimeError: validator bug"),
    ]


async def test_an_allowed_call_is_validated_once() -> None:
    # Validators and default factories ran twice for every call a callback allowed.
    _SEEN.clear()
    _MADE.clear()
    model = ScriptedModel([ScriptedResponse(tool_calls=[ScriptedToolCall("checked", {"path": "a"})]), "Done."])
    events = await collect(QueryEngine(model, tools=[checked], permission=_allow).run("go"))
    assert engine_text(events) == "ran a"
    assert _SEEN == ["a"] and _MADE == [1]


def engine_text(events: list[Event]) -> str:
    return next(e.result.text for e in events if isinstance(e, ToolCallFinished))


@pytest.mark.parametrize(
    "answer", [Deny("no"), Allow(updated_input={"path": "b"})], ids=["deny", "updated"]
)
async def test_a_checked_call_not_run_as_checked_leaves_no_coroutine_unawaited(answer: Allow | Deny) -> None:
    ran: list[str] = []

    @tool
    async def t(path: str) -> str:
        """T."""
        ran.append(path)
        return "ran " + path

    def ask(use: ToolUseBlock, ctx: ToolContext) -> Allow | Deny:
        return answer

    model = ScriptedModel([ScriptedResponse(tool_calls=[ScriptedToolCall("t", {"path": "a"})]), "Done."])
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        await collect(QueryEngine(model, tools=[t], permission=ask).run("go"))
        gc.collect()
    assert [w for w in caught if issubclass(w.category, RuntimeWarning)] == []
    assert ran == ([] if isinstance(answer, Deny) else ["b"])


class _Unequal:
    """A value that cannot be compared: its ``==`` raises."""

    __hash__ = None  # type: ignore[assignment]

    def __eq__(self, other: object) -> bool:
        raise ValueError("cannot compare")


@pytest.mark.parametrize("how", ["raises", "aborts", "unequal"])
async def test_a_checked_call_is_closed_whatever_ends_its_prompt(how: str) -> None:
    # The coroutine made to check the input before the prompt was left never awaited when
    # comparing the permission's input raised; the raising and aborting prompts are closed too.
    ran: list[object] = []

    @tool
    async def t(path: Any) -> str:
        """T."""
        ran.append(path)
        return "ran"

    def ask(use: ToolUseBlock, ctx: ToolContext) -> Allow:
        if how == "raises":
            raise RuntimeError("prompt broke")
        if how == "aborts":
            engine.interrupt()
            return Allow()
        return Allow(updated_input={"path": _Unequal()})

    model = ScriptedModel([ScriptedResponse(tool_calls=[ScriptedToolCall("t", {"path": "a"})]), "Done."])
    engine = QueryEngine(model, tools=[t], permission=ask)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        events = await collect(engine.run("go"))
        gc.collect()
    assert [str(w.message) for w in caught if issubclass(w.category, RuntimeWarning)] == []
    assert ran == []
    assert not any(isinstance(e, ToolCallStarted) for e in events)
    assert turn_ended(events).reason == ("aborted_tools" if how == "aborts" else "completed")


async def test_a_hand_made_handler_runs_after_its_call_started() -> None:
    # A sync handler returning an awaitable was called before ToolCallStarted: its progress came
    # first, and one that raised had a ToolCallFinished with no ToolCallStarted.
    async def work() -> str:
        return "done"

    def handler(inp: dict[str, Any], ctx: ToolContext) -> Any:
        ctx.emit(ToolProgress(tool_use_id=ctx.tool_use_id, text="starting"))
        if inp.get("fail"):
            raise ValueError("bad")
        return work()

    hand = Tool("h", "hand made", {"type": "object", "properties": {}}, handler)
    calls = [ScriptedToolCall("h", {}), ScriptedToolCall("h", {"fail": True})]
    events = await collect(QueryEngine(ScriptedModel([ScriptedResponse(tool_calls=calls), "ok"]), tools=[hand]).run("go"))
    assert _tool_events(events) == [
        ("started", "toolu_0001"),
        ("progress", "starting"),
        ("finished", "done"),
        ("started", "toolu_0002"),
        ("progress", "starting"),
        ("finished", "Tool 'h' raised ValueError: bad"),
    ]


def test_only_a_real_async_def_is_checked_before_it_runs(monkeypatch: pytest.MonkeyPatch) -> None:
    def sync(path: str) -> Any:
        return None

    async def real(path: str) -> str:
        return path

    class Holder:
        async def method(self, path: str) -> str:
            return path

    # Marked as inspect.markcoroutinefunction marks one (3.12+); below 3.12 the mark and the
    # check that reads it are put in place the same way, so the test can fail on any version.
    marker = getattr(inspect, "_is_coroutine_mark", None)
    if marker is None:
        marker = object()
        real_check = inspect.iscoroutinefunction

        def marked_check(f: object) -> bool:
            return getattr(f, "_is_coroutine_marker", None) is marker or real_check(f)

        monkeypatch.setattr(inspect, "_is_coroutine_mark", marker, raising=False)
        monkeypatch.setattr(inspect, "iscoroutinefunction", marked_check)
    sync._is_coroutine_marker = marker  # type: ignore[attr-defined]
    assert inspect.iscoroutinefunction(sync)  # what a check by inspect alone would let through
    assert not _tools.is_async_def(sync)
    assert _tools.is_async_def(real) and _tools.is_async_def(Holder().method)


async def test_a_sync_function_marked_async_does_not_run_before_its_permission(monkeypatch: pytest.MonkeyPatch) -> None:
    # On 3.12+, inspect.markcoroutinefunction lets a sync def through @tool: called to check its
    # input, its body ran before a callback that then denied the call.
    ran: list[str] = []

    def rm(path: str) -> Any:
        """Remove."""
        ran.append(path)
        done = asyncio.get_running_loop().create_future()
        done.set_result("removed")
        return done

    if hasattr(inspect, "markcoroutinefunction"):
        inspect.markcoroutinefunction(rm)
    else:  # below 3.12 no mark passes @tool's check: let it through as 3.12 does
        monkeypatch.setattr(_tools, "_check_async", lambda f: None)
    t = tool(rm)

    def deny(use: ToolUseBlock, ctx: ToolContext) -> Deny:
        return Deny("no")

    model = ScriptedModel([ScriptedResponse(tool_calls=[ScriptedToolCall("rm", {"path": "/x"})]), "ok"])
    engine = QueryEngine(model, tools=[t], permission=deny)
    await collect(engine.run("go"))
    assert ran == []
    assert engine.messages[2].tool_results[0].text == "Permission denied: no"


async def test_a_permission_input_the_tool_refuses_gets_one_true_message() -> None:
    @tool
    async def rd(n: int) -> str:
        """R."""
        return f"r{n}"

    def ask(use: ToolUseBlock, ctx: ToolContext) -> Allow:
        return Allow(updated_input={"n": "zz"})

    model = ScriptedModel([ScriptedResponse(tool_calls=[ScriptedToolCall("rd", {"n": 1})]), "ok"])
    engine = QueryEngine(model, tools=[rd], permission=ask)
    events = await collect(engine.run("go"))
    text = engine.messages[2].tool_results[0].text
    assert "ran with this input" not in text
    assert text.startswith("Tool 'rd' was not run: the permission check changed this call's input, and the tool refused")
    assert "valid integer" in text
    assert not any(isinstance(e, ToolCallStarted) for e in events)
    finished = next(e for e in events if isinstance(e, ToolCallFinished))
    assert finished.updated_input is None and finished.input == {"n": 1}


async def test_an_empty_response_is_told_only_on_a_completed_turn() -> None:
    # The empty-response detail stayed set when an interjection made the turn go on, and ended
    # up on a TurnEnded(reason="max_turns").
    class Interjected(ScriptedModel):
        async def stream(self, request: ModelRequest, signal: AbortSignal) -> AsyncIterator[StreamEvent]:
            if len(self.requests) == 0:
                engine.interject("also this")  # while the response streams: the turn goes on after it
            async for event in super().stream(request, signal):
                yield event

    engine = QueryEngine(Interjected([ScriptedResponse(text=""), "Hi"]), max_turns=1)
    ends = [event async for event in engine.run("go") if isinstance(event, TurnEnded)]
    assert (ends[0].reason, ends[0].detail) == ("max_turns", None)


# --- the refused key -------------------------------------------------------------------------


def _echo(request: httpx.Request) -> httpx.Response:
    said = json.dumps(dict(request.headers))
    return httpx.Response(401, json={"error": {"message": "refused " + said, "type": "authentication_error"}})


async def _refused(model_for: Any) -> str:
    async with httpx.AsyncClient(transport=httpx.MockTransport(_echo)) as client:
        end = turn_ended(await collect(QueryEngine(model_for(client), retry_budget=0).run("hi")))
    assert end.reason == "model_error" and end.error is not None
    assert KEY not in end.error and TOKEN not in end.error and KEY[-8:] not in end.error
    return end.error


@pytest.mark.parametrize("cls", [AnthropicModel, OpenAIChatModel, OpenAIResponsesModel])
async def test_a_refused_key_passed_as_api_key_says_so(cls: Any) -> None:
    error = await _refused(lambda c: cls("m", api_key=KEY, http_client=c))
    assert error.endswith("(the server refused the key passed as api_key=)")


@pytest.mark.parametrize(("cls", "var"), [(AnthropicModel, "ANTHROPIC_API_KEY"), (OpenAIChatModel, "OPENAI_API_KEY")])
async def test_a_refused_key_read_from_the_environment_names_the_variable(
    cls: Any, var: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv(var, KEY)
    error = await _refused(lambda c: cls("m", http_client=c))
    assert error.endswith(f"(the server refused the key read from the {var} environment variable)")


async def test_a_refused_credential_of_extra_headers_names_its_header() -> None:
    error = await _refused(
        lambda c: OpenAIChatModel("m", api_key=KEY, http_client=c, extra_headers={"Authorization": "Bearer " + TOKEN})
    )
    assert error.endswith("(the server refused the credential in the Authorization header of extra_headers)")
    assert "api_key=" not in error


async def test_a_refused_credential_of_the_hosts_client_says_so(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("OPENAI_API_KEY", raising=False)
    headers = {"Authorization": "Bearer " + TOKEN}
    async with httpx.AsyncClient(transport=httpx.MockTransport(_echo), headers=headers) as client:
        model = OpenAIChatModel("m", api_key=KEY, http_client=client)
        end = turn_ended(await collect(QueryEngine(model, retry_budget=0).run("hi")))
    assert end.error is not None and TOKEN not in end.error and KEY not in end.error
    assert end.error.endswith("(the server refused the credential in the authorization header the http_client sends)")


async def test_a_401_with_no_credential_sent_says_none_was(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("OPENAI_API_KEY", raising=False)
    error = await _refused(lambda c: OpenAIChatModel("m", base_url="http://localhost:8080/v1", http_client=c))
    assert error.endswith("(no credential was sent: pass api_key= or set the OPENAI_API_KEY environment variable)")


# --- an event stream that ends inside an event -------------------------------------------------


def test_the_decoder_tells_an_unended_event_from_a_cut_line() -> None:
    cases = {
        b"data: x\n": True,
        b"data: x\r": True,  # a CR alone ends a line too
        b"data: x\r\n": True,
        b"data: x": False,  # cut inside the line
        b"event: ping\n": False,  # no data line: nothing was dropped
        b"data: x\n\n": False,
    }
    for body, unended in cases.items():
        decoder = SSEDecoder()
        decoder.feed(body)
        decoder.close()
        assert decoder.unterminated is unended, body
        assert decoder.dropped == (ServerSentEvent("x") if unended else None), body


def test_an_event_too_long_to_hold_is_not_told_as_unended() -> None:
    decoder = SSEDecoder(max_event_bytes=16)
    decoder.feed(b"data: 0123\n")
    with pytest.raises(Exception, match="without an event completed"):
        decoder.feed(b"data: 0123456789abcdef\n")
    assert decoder.unterminated is False


_STREAM = (
    b'event: message_start\ndata: {"type":"message_start","message":{"id":"msg_1","type":"message",'
    b'"role":"assistant","content":[],"model":"m","usage":{"input_tokens":5,"output_tokens":1}}}\n\n'
    b'event: content_block_start\ndata: {"type":"content_block_start","index":0,"content_block":{"type":"text","text":""}}\n\n'
    b'event: content_block_delta\ndata: {"type":"content_block_delta","index":0,"delta":{"type":"text_delta","text":"Hi"}}\n'
)


async def test_a_stream_cut_after_a_whole_line_of_an_event_that_does_not_end_it_is_told_as_cut() -> None:
    sse = {"content-type": "text/event-stream"}
    transport = httpx.MockTransport(lambda request: httpx.Response(200, headers=sse, content=_STREAM))
    async with httpx.AsyncClient(transport=transport) as client:
        engine = QueryEngine(AnthropicModel("m", api_key=KEY, http_client=client), retry_budget=0)
        end = turn_ended(await collect(engine.run("hi")))
    assert end.error is not None and "without message_stop" in end.error
    assert "blank line" not in end.error and "recorded" not in end.error


PASSWORD = "pw-userinfo-5647382910abcdefgh"


async def _refused_by(model_for: Any, **client: Any) -> str:
    """The error of a 401 whose body echoes the request's headers: no secret of any origin in it."""
    async with httpx.AsyncClient(transport=httpx.MockTransport(_echo), **client) as c:
        end = turn_ended(await collect(QueryEngine(model_for(c), retry_budget=0).run("hi")))
    assert end.reason == "model_error" and end.error is not None
    basic = base64.b64encode(f"user:{PASSWORD}".encode()).decode()
    for secret in (KEY, TOKEN, PASSWORD, basic, KEY[-8:], PASSWORD[-8:]):
        assert secret not in end.error
    return end.error


@pytest.mark.parametrize("key", [KEY, None], ids=["with-key", "no-key"])
async def test_a_refused_user_info_of_base_url_is_not_put_down_to_extra_headers(
    key: str | None, monkeypatch: pytest.MonkeyPatch
) -> None:
    # httpx sends base_url's user:password as a Basic Authorization header, in place of the key's:
    # the 401 blamed an extra_headers the host never set.
    monkeypatch.delenv("OPENAI_API_KEY", raising=False)
    url = f"https://user:{PASSWORD}@gateway.example/v1"
    error = await _refused_by(lambda c: OpenAIChatModel("m", api_key=key, base_url=url, http_client=c))
    assert error.endswith("(the server refused the user info in base_url, sent in the authorization header)")


async def test_a_refused_credential_of_the_clients_auth_is_put_down_to_it() -> None:
    auth = httpx.BasicAuth("user", PASSWORD)
    error = await _refused_by(lambda c: OpenAIChatModel("m", api_key=KEY, http_client=c), auth=auth)
    assert error.endswith("(the server refused the credential the http_client's auth= puts in the authorization header)")


async def test_a_refused_credential_of_extra_headers_is_told_apart_from_the_key() -> None:
    extra = {"X-Gateway-Token": TOKEN}
    error = await _refused_by(lambda c: AnthropicModel("m", api_key=KEY, http_client=c, extra_headers=extra))
    assert error.endswith(
        "(the server refused one of the credentials sent: the key passed as api_key=; "
        "the credential in the X-Gateway-Token header of extra_headers)"
    )
