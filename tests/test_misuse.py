"""What a newcomer meets when they misuse the API: an error that says what to do instead."""

from __future__ import annotations

import asyncio
import gc
import os
import re
import subprocess
import sys
import threading
from collections.abc import AsyncIterator
from pathlib import Path

import pytest

from agentloop import (
    Event,
    Message,
    ModelRequest,
    QueryEngine,
    ScriptedModel,
    ScriptedResponse,
    ScriptedToolCall,
    Tool,
    TurnEnded,
    tool,
    validate_transcript,
)
from agentloop._abort import AbortSignal
from agentloop.testing import collect


class NoStream:
    """A model someone forgot to finish."""


@pytest.mark.parametrize(
    ("model", "hint"),
    [
        ("claude-sonnet-4-5", "AnthropicModel('claude-sonnet-4-5')"),
        (ScriptedModel, "pass an instance of it"),
        (NoStream(), "NoStream object"),
        (None, "got None"),
    ],
)
def test_a_model_without_stream_is_refused_at_construction(model: object, hint: str) -> None:
    with pytest.raises(TypeError, match=r"needs a model with a stream\(request, signal\) method") as info:
        QueryEngine(model)  # type: ignore[arg-type]
    assert hint in str(info.value)


async def test_a_stream_written_as_a_coroutine_gets_a_model_error_that_says_how_to_write_it() -> None:
    class ReturnsInsteadOfYields:
        async def stream(self, request: ModelRequest, signal: AbortSignal) -> list[object]:
            return []

    class ReturnsAList:
        def stream(self, request: ModelRequest, signal: AbortSignal) -> list[object]:
            return []

    for model, says in (
        (ReturnsInsteadOfYields(), "returned a coroutine, not an async iterator: write it as an async generator"),
        (ReturnsAList(), "returned list, not an async iterator of stream events"),
    ):
        engine = QueryEngine(model)  # type: ignore[arg-type]
        events = await collect(engine.run("hi"))
        end = events[-1]
        assert isinstance(end, TurnEnded) and end.reason == "model_error"
        assert end.error is not None and says in end.error, end.error
        gc.collect()  # a coroutine left unclosed would warn here ("never awaited"), an error under -W error


async def test_an_async_generator_model_still_works() -> None:
    class Echo:
        async def stream(self, request: ModelRequest, signal: AbortSignal) -> AsyncIterator[object]:
            async for event in ScriptedModel(["hello"]).stream(request, signal):
                yield event

    engine = QueryEngine(Echo())  # type: ignore[arg-type]
    events = await collect(engine.run("hi"))
    assert isinstance(events[-1], TurnEnded) and events[-1].reason == "completed"


async def _add(a: int, b: int) -> str:
    """Add two integers."""
    return str(a + b)


def test_a_function_in_tools_is_refused_with_a_hint_to_decorate_it() -> None:
    with pytest.raises(TypeError, match=r"tools takes Tool objects, not function .*: decorate _add with @tool"):
        QueryEngine(ScriptedModel(["hi"]), tools=[_add])  # type: ignore[list-item]
    with pytest.raises(TypeError, match=r"tools takes Tool objects, not str 'add'$"):
        QueryEngine(ScriptedModel(["hi"]), tools=["add"])  # type: ignore[list-item]
    add = tool(_add)
    with pytest.raises(TypeError, match=r"tools takes a list of tools: tools=\[_add\]"):
        QueryEngine(ScriptedModel(["hi"]), tools=add)  # type: ignore[arg-type]
    assert list(QueryEngine(ScriptedModel(["hi"]), tools=(add,)).tools) == ["_add"]


async def test_messages_that_are_not_message_objects_are_refused_at_construction() -> None:
    with pytest.raises(TypeError, match=r"messages takes Message objects, not dict: .*Message.model_validate\(d\)"):
        QueryEngine(ScriptedModel(["hi"]), messages=[{"role": "user", "content": "hi"}])  # type: ignore[list-item]
    with pytest.raises(TypeError, match="messages takes a list of Message objects, not a str"):
        QueryEngine(ScriptedModel(["hi"]), messages="hello")  # type: ignore[arg-type]
    with pytest.raises(TypeError, match="messages takes a list of Message objects, not a Message"):
        QueryEngine(ScriptedModel(["hi"]), messages=Message.user("hello"))  # type: ignore[arg-type]
    engine = QueryEngine(ScriptedModel(["hi"]), messages=(Message.model_validate({"role": "user", "content": "hello"}),))
    events = await collect(engine.run())
    assert isinstance(events[-1], TurnEnded) and events[-1].reason == "completed"
    assert [m.text for m in engine.messages] == ["hello", "hi"]


@pytest.mark.parametrize("how", ["append", "replace"])
async def test_a_dict_put_into_messages_between_runs_is_a_type_error_naming_its_index(how: str) -> None:
    engine = QueryEngine(ScriptedModel(["hi", "again"]))
    await collect(engine.run("hello"))
    wire = {"role": "user", "content": "more"}
    if how == "append":
        engine.messages.append(wire)  # type: ignore[arg-type]
    else:
        engine.messages[0] = wire  # type: ignore[call-overload]
    where = 2 if how == "append" else 0
    with pytest.raises(TypeError, match=rf"engine.messages\[{where}\] is a dict, not a Message: .*model_validate\(d\)"):
        await collect(engine.run())
    assert engine._state is None  # refused before it began: the engine is free for the next run
    engine.messages[where] = Message.model_validate(wire)
    events = await collect(engine.run("go on"))
    assert isinstance(events[-1], TurnEnded) and events[-1].reason == "completed"


async def test_a_plain_function_is_a_permission_callback_too() -> None:
    """A newcomer's first permission check is often a plain def: every call used to be refused
    with "object Allow can't be used in 'await' expression", told only to the model."""
    from agentloop import Allow, Deny, ScriptedResponse, ScriptedToolCall, ToolUseBlock

    @tool
    async def delete(path: str) -> str:
        """Delete a file."""
        return f"deleted {path}"

    def ask(use: ToolUseBlock, ctx: object) -> Allow | Deny:
        if use.input["path"].startswith("/etc"):
            return Deny("not outside the project")
        return Allow(updated_input={"path": use.input["path"].strip()})

    model = ScriptedModel([
        ScriptedResponse(tool_calls=[
            ScriptedToolCall("delete", {"path": "/etc/passwd"}),
            ScriptedToolCall("delete", {"path": " notes.txt "}),
        ]),
        "done",
    ])
    engine = QueryEngine(model, tools=[delete], permission=ask)  # type: ignore[arg-type]
    events = await collect(engine.run("clean up"))
    assert isinstance(events[-1], TurnEnded) and events[-1].reason == "completed"
    results = engine.messages[2].tool_results
    assert [(r.is_error, r.text.rpartition("\n\n")[2]) for r in results] == [
        (True, "Permission denied: not outside the project"),
        (False, "deleted notes.txt"),
    ]
    assert '{"path": "notes.txt"}' in results[1].text  # the model is told which input ran


def test_a_permission_that_cannot_be_called_is_refused_at_construction() -> None:
    with pytest.raises(TypeError, match=r"permission takes a callable \(use, ctx\) -> Allow \| Deny, not True"):
        QueryEngine(ScriptedModel(["hi"]), permission=True)  # type: ignore[arg-type]


async def test_a_deny_without_a_message_reads_as_a_sentence() -> None:
    """``Deny("")`` gave the model "Permission denied: " with nothing after it."""
    from agentloop import Deny, ToolUseBlock

    @tool
    async def delete(path: str) -> str:
        """Delete a file."""
        return f"deleted {path}"

    async def ask(use: ToolUseBlock, ctx: object) -> Deny:
        return Deny(" ")

    model = ScriptedModel([ScriptedResponse(tool_calls=[ScriptedToolCall("delete", {"path": "x"})]), "done"])
    engine = QueryEngine(model, tools=[delete], permission=ask)  # type: ignore[arg-type]
    await collect(engine.run("clean up"))
    [result] = engine.messages[2].tool_results
    assert result.is_error and result.text == "Permission denied."


async def test_tool_choice_required_is_openais_word_for_any_and_a_bad_one_is_refused() -> None:
    """``tool_choice="required"`` (OpenAI's spelling) was sent as the name of a tool, so every
    request was refused by the provider; a non-string failed only inside a request."""
    seen: list[str | None] = []

    def reply(request: ModelRequest) -> str:
        seen.append(request.tool_choice)
        return "ok"

    await collect(QueryEngine(ScriptedModel([reply]), tools=[tool(_add)], tool_choice="required").run("hi"))
    assert seen == ["any"]
    for bad in (True, "", 3):
        with pytest.raises(TypeError, match=r'tool_choice takes "auto", "any", "none" or a tool name'):
            QueryEngine(ScriptedModel(["hi"]), tool_choice=bad)  # type: ignore[arg-type]


def test_delegate_tool_refuses_one_policy_where_a_list_is_wanted() -> None:
    """``delegate_tool(policies=IdenticalToolCallRun())`` failed only when the model first
    delegated, as an error result; it is refused when the tool is made."""
    from agentloop import delegate_tool
    from agentloop.policies import IdenticalToolCallRun

    with pytest.raises(TypeError, match=r"policies takes a list of policies: policies=\[<"):
        delegate_tool(policies=IdenticalToolCallRun())
    with pytest.raises(TypeError, match=r"policies takes a list of policies"):
        delegate_tool(policies=3)


async def test_ctx_emit_refuses_what_is_not_an_event() -> None:
    """A tool that emitted a str or a dict put it into the host's event stream, where the
    host's ``event.type`` broke; the tool now gets a TypeError (its error result says so)."""
    from agentloop import ToolContext

    @tool
    async def chatty(ctx: ToolContext) -> str:
        """Report progress."""
        ctx.emit({"progress": 50})  # type: ignore[arg-type]
        return "done"

    model = ScriptedModel([ScriptedResponse(tool_calls=[ScriptedToolCall("chatty")]), "ok"])
    engine = QueryEngine(model, tools=[chatty])
    events = await collect(engine.run("go"))
    assert all(hasattr(e, "type") for e in events)
    [result] = engine.messages[2].tool_results
    assert result.is_error and "ctx.emit takes an agentloop event (such as a subagent's), not dict" in result.text


def test_tool_takes_its_function_by_keyword_as_api_md_writes_it_and_a_name_only_by_keyword() -> None:
    made = tool(fn=_add)  # API.md: tool(fn=None, *, name=None, ...)
    assert isinstance(made, Tool) and made.name == "_add"
    with pytest.raises(TypeError, match=r"@tool takes the function, not a string: to name the tool, write @tool\(name='add'\)"):
        tool("add")  # type: ignore[call-overload]


async def test_scripted_model_takes_a_list_of_scripts() -> None:
    """ScriptedModel("Hello!") used to play "H", then "e", ... one character per request."""
    with pytest.raises(TypeError, match=r"ScriptedModel takes a list of responses: ScriptedModel\(\['Hello!'\]\)"):
        ScriptedModel("Hello!")  # type: ignore[arg-type]
    with pytest.raises(TypeError, match="ScriptedModel takes a list of responses"):
        ScriptedModel(ScriptedResponse(text="Hello!"))  # type: ignore[arg-type]
    with pytest.raises(TypeError, match="ScriptedModel response 1 is a dict: a response is a str, a ScriptedResponse"):
        ScriptedModel(["Hi", {"text": "Hello!"}])  # type: ignore[list-item]
    engine = QueryEngine(ScriptedModel([lambda request: {"text": "Hello!"}]))  # type: ignore[list-item]
    events = await collect(engine.run("hi"))
    end = events[-1]
    assert isinstance(end, TurnEnded) and end.reason == "model_error"
    assert end.error is not None and "returned dict, not a str or a ScriptedResponse" in end.error


@pytest.mark.parametrize(
    ("make", "message"),
    [
        (lambda: ScriptedResponse(tool_calls=ScriptedToolCall("add", {"a": 1})), r"tool_calls takes a list: tool_calls=\[ScriptedToolCall"),
        (lambda: ScriptedResponse(tool_calls=[("add", {"a": 1})]), r"tool_calls holds ScriptedToolCall\(name, input\), not \('add'"),
        (lambda: ScriptedResponse(tool_calls=[ScriptedToolCall("add", '{"a": 1}')]), "input must be a dict"),
        (lambda: ScriptedResponse(text=5), "text must be a str, not int"),
    ],
)
def test_a_scripted_response_that_could_only_fail_when_played_is_refused_when_written(make: object, message: str) -> None:
    """Each used to end the run with model_error ("the model raised TypeError: ...")."""
    with pytest.raises(TypeError, match=message):
        make()  # type: ignore[operator]


_CLOSED_LOOP_SCRIPT = """
import asyncio
from agentloop import QueryEngine, ScriptedModel, ScriptedResponse, validate_transcript

engine = QueryEngine(ScriptedModel([ScriptedResponse(text="word " * 40, chunk=5, delay=0.01), "second answer"]))
run = engine.run("first")
loop = asyncio.new_event_loop()
for _ in range(3):  # TurnStarted, then two deltas: the run is mid-stream
    loop.run_until_complete(run.__anext__())
loop.close()  # closed without shutting down its async generators: the run can never end there
# The run has ended (it never can go on): the engine says so, and its transcript is settled.
print(engine.running, [m.role for m in engine.messages], validate_transcript(engine.messages))


async def again() -> None:
    async for _ in engine.run("second"):
        pass
    print(engine.last_turn_ended.reason, [m.role for m in engine.messages], validate_transcript(engine.messages))

asyncio.run(again())
print("partial kept:", engine.messages[1].partial, engine.messages[1].text)
"""


def test_an_engine_whose_run_was_left_in_a_closed_event_loop_runs_in_the_next_one(tmp_path: Path) -> None:
    """It used to fail for good: "Task ... got Future ... attached to a different loop" on every later run."""
    script = tmp_path / "closed_loop.py"
    script.write_text(_CLOSED_LOOP_SCRIPT, encoding="utf-8")
    proc = subprocess.run(
        [sys.executable, str(script)], cwd=tmp_path, capture_output=True, text=True, timeout=50,
        env=dict(os.environ, PYTHONPATH=str(Path(__file__).resolve().parent.parent)),
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    lines = proc.stdout.splitlines()
    assert lines[0] == "False ['user', 'assistant'] []", proc.stdout
    assert lines[1] == "completed ['user', 'assistant', 'user', 'assistant'] []", proc.stdout
    assert lines[2] == "partial kept: True word word"


_CLOSED_LOOP_STORE_SCRIPT = """
import asyncio, gc, sys
from agentloop import QueryEngine, ScriptedModel, ScriptedResponse
from agentloop.sessions import JsonlSession

path = sys.argv[1]
first = QueryEngine(ScriptedModel([ScriptedResponse(text="word " * 40, chunk=5, delay=0.01)]), session=JsonlSession(path))
run = first.run("first")
loop = asyncio.new_event_loop()
for _ in range(3):  # mid-stream
    loop.run_until_complete(run.__anext__())
loop.close()  # the first run can never end, nor write again


async def other(store: JsonlSession) -> str:
    engine = QueryEngine(ScriptedModel(["answer"]), session=store)
    async for _ in engine.run("second"):
        pass
    return engine.last_turn_ended.reason

first.session.close()  # its session's file lock goes with the close (or with the session)
print(asyncio.run(other(JsonlSession(path))))  # the first engine is still referenced
del run, first
gc.collect()
print(asyncio.run(other(JsonlSession(path))))
"""


def test_a_store_whose_writer_was_left_in_a_closed_loop_is_free_for_another_engine(tmp_path: Path) -> None:
    """A run left in a closed event loop will never write again: its session file must not stay
    refused to every other engine (as "in use by another running engine")."""
    script = tmp_path / "closed_loop_store.py"
    script.write_text(_CLOSED_LOOP_STORE_SCRIPT, encoding="utf-8")
    proc = subprocess.run(
        [sys.executable, str(script), str(tmp_path / "s.jsonl")], cwd=tmp_path, capture_output=True, text=True,
        timeout=50, env=dict(os.environ, PYTHONPATH=str(Path(__file__).resolve().parent.parent)),
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert proc.stdout.splitlines() == ["completed", "completed"], proc.stdout


async def test_a_run_going_on_in_another_loop_is_named_in_the_error() -> None:
    engine = QueryEngine(ScriptedModel([ScriptedResponse(text="word " * 40, chunk=5, delay=0.01)]))
    started, stop = threading.Event(), threading.Event()

    def other_thread() -> None:
        async def drive() -> None:
            async for _ in engine.run("first"):
                started.set()
                await asyncio.to_thread(stop.wait)
                break

        asyncio.run(drive())

    thread = threading.Thread(target=other_thread)
    thread.start()
    try:
        assert await asyncio.to_thread(started.wait, 10)
        with pytest.raises(RuntimeError, match="a run of this engine is in progress in another event loop"):
            await collect(engine.run("second"))
    finally:
        stop.set()
        await asyncio.to_thread(thread.join, 10)
    assert not engine.running


def test_a_run_object_alive_at_interpreter_exit_prints_nothing(tmp_path: Path) -> None:
    """A script holding a half-iterated ``run()`` in a global used to end with "Exception ignored in:
    <function _Run.__del__> ... ImportError: sys.meta_path is None" on stderr."""
    script = tmp_path / "global_run.py"
    script.write_text(
        "import asyncio\n"
        "from agentloop import QueryEngine, ScriptedModel, ScriptedResponse\n"
        "engine = QueryEngine(ScriptedModel([ScriptedResponse(text='word ' * 40, chunk=5, delay=0.01)]))\n"
        "run = engine.run('first')\n"
        "async def main() -> None:\n"
        "    await run.__anext__()\n"
        "    await run.__anext__()\n"
        "asyncio.run(main())\n"
        "print('done', engine.running)\n",
        encoding="utf-8",
    )
    proc = subprocess.run(
        [sys.executable, "-W", "error", str(script)], cwd=tmp_path, capture_output=True, text=True, timeout=50,
        env=dict(os.environ, PYTHONPATH=str(Path(__file__).resolve().parent.parent)),
    )
    assert (proc.returncode, proc.stdout, proc.stderr) == (0, "done False\n", "")


def test_policies_takes_a_list_of_policy_instances() -> None:
    from agentloop import IdenticalToolCallRun

    model = ScriptedModel(["hi"])
    with pytest.raises(TypeError, match=r"policies takes a list of policies: policies=\[IdenticalToolCallRun\(...\)\]"):
        QueryEngine(model, policies=IdenticalToolCallRun())  # type: ignore[arg-type]
    with pytest.raises(TypeError, match=r"not the class IdenticalToolCallRun: write IdenticalToolCallRun\(\)"):
        QueryEngine(model, policies=[IdenticalToolCallRun])  # type: ignore[list-item]
    with pytest.raises(TypeError, match=r"policies takes Policy objects \(subclasses of agentloop.Policy\), not 'doom'"):
        QueryEngine(model, policies=["doom"])  # type: ignore[list-item]
    assert len(QueryEngine(model, policies=(IdenticalToolCallRun(),)).policies) == 1


@pytest.mark.parametrize(
    ("setting", "value", "error", "message"),
    [
        ("max_turns", "3", TypeError, "max_turns takes a whole number or None, not '3'"),
        ("max_turns", 2.5, TypeError, "max_turns takes a whole number or None"),
        ("max_turns", -1, ValueError, "max_turns must be >= 0, not -1"),
        ("max_parallel_tools", None, TypeError, "max_parallel_tools takes a whole number, not None"),
        ("tool_cancel_grace", "2", TypeError, "tool_cancel_grace takes a number of seconds, not '2'"),
        ("tool_cancel_grace", -1, ValueError, "tool_cancel_grace must be >= 0"),
        ("deadline", float("nan"), ValueError, "deadline must be >= 0, not nan"),
        ("retry_budget", True, TypeError, "retry_budget takes a whole number, not True"),
        ("usage_limit", "9000", TypeError, "usage_limit takes a whole number or None"),
        ("max_tokens", 1e3, TypeError, "max_tokens takes a whole number or None"),
    ],
)
def test_a_numeric_setting_of_the_wrong_type_is_refused_at_construction(
    setting: str, value: object, error: type[Exception], message: str
) -> None:
    """max_turns="3" (from a config file or an environment variable) used to be accepted, and the run
    then raised "TypeError: '>=' not supported between instances of 'int' and 'str'" out of run()."""
    with pytest.raises(error, match=re.escape(message)):
        QueryEngine(ScriptedModel(["hi"]), **{setting: value})  # type: ignore[arg-type]


async def test_numeric_settings_in_range_still_work() -> None:
    engine = QueryEngine(ScriptedModel(["hi"]), max_turns=0, tool_cancel_grace=0, deadline=30.0, retry_budget=0)
    events = await collect(engine.run("hi"))
    assert isinstance(events[-1], TurnEnded) and events[-1].reason == "max_turns"


def test_a_controller_where_a_signal_belongs_says_to_pass_its_signal() -> None:
    """AbortController(parent=controller) and AbortSignal.any([controller]) used to raise
    AttributeError: 'AbortController' object has no attribute 'add_listener'."""
    from agentloop import AbortController, AbortSignal

    app, call = AbortController(), AbortController()
    with pytest.raises(TypeError, match=r"AbortController\(parent=...\) takes an AbortSignal, not an AbortController: pass its .signal"):
        AbortController(parent=app)  # type: ignore[arg-type]
    with pytest.raises(TypeError, match=r"AbortSignal.any\(\) takes an AbortSignal, not an AbortController"):
        AbortSignal.any([app.signal, call])  # type: ignore[list-item]
    assert app.signal._listeners == {}  # the refused any() left no listener on the signal before the slip
    child = AbortController(parent=call.signal)
    call.abort("done")
    assert child.signal.reason == "done"


async def test_a_run_iterated_from_two_tasks_says_so_and_the_first_goes_on() -> None:
    """It used to be Python's own "anext(): asynchronous generator is already running"."""
    engine = QueryEngine(ScriptedModel([ScriptedResponse(text="word " * 20, chunk=3, delay=0.001)]), policies=[])
    run = engine.run("go")

    async def consume() -> list[Event]:
        return [event async for event in run]

    first, second = await asyncio.gather(consume(), consume(), return_exceptions=True)
    assert isinstance(second, RuntimeError) and "iterated by another task" in str(second)
    assert isinstance(first, list) and isinstance(first[-1], TurnEnded) and first[-1].reason == "completed"
    assert validate_transcript(engine.messages) == [] and not engine.running


@pytest.mark.parametrize(
    ("value", "error", "message"),
    [
        ("30", TypeError, "timeout takes a number of seconds or None, not '30'"),
        (True, TypeError, "timeout takes a number of seconds or None, not True"),
        (-1, ValueError, "timeout must be >= 0, not -1"),
        (float("nan"), ValueError, "timeout must be >= 0, not nan"),
    ],
)
async def test_a_tool_timeout_that_is_not_a_number_of_seconds_is_refused_when_the_tool_is_made(
    value: object, error: type[Exception], message: str
) -> None:
    """@tool(timeout=os.environ["TOOL_TIMEOUT"]) used to be accepted, and then every call of the tool
    failed with "Tool 'build' raised TypeError: can only concatenate str...", blamed on the tool."""

    async def build() -> str:
        """Build."""
        return "built"

    with pytest.raises(error, match=re.escape(message)):
        tool(timeout=value)(build)  # type: ignore[arg-type]
    with pytest.raises(error, match=re.escape(message)):
        Tool("build", "Build.", {"type": "object"}, lambda _i, _c: build(), timeout=value)  # type: ignore[arg-type]
    assert tool(timeout=2)(build).timeout == 2 and tool(timeout=0.5)(build).timeout == 0.5


@pytest.mark.parametrize(
    ("texts", "error"),
    [
        ({"interrupt_notice": None}, TypeError),  # meant as "no notice": the engine's option does that
        ({"interrupt_notice": "  "}, ValueError),  # a blank user message, refused by the providers
        ({"doom_reminder": " \n"}, ValueError),  # the resample's user message, blank without a replay
        ({"never_started": 5}, TypeError),
    ],
)
def test_a_text_that_could_only_fail_when_written_is_refused_when_texts_is_made(texts: dict[str, object], error: type) -> None:
    """`Texts(interrupt_notice=None)` crashed the run at its first interrupt with a pydantic
    error from inside the loop; a blank notice left a blank user message in the transcript."""
    from agentloop import Texts

    with pytest.raises(error) as info:
        Texts(**texts)  # type: ignore[arg-type]
    name = next(iter(texts))
    assert f"Texts.{name}" in str(info.value)
    if name == "interrupt_notice":
        assert "QueryEngine(interrupt_notice=None)" in str(info.value)


def test_texts_given_as_a_dict_is_refused_at_construction() -> None:
    with pytest.raises(TypeError, match=r"texts takes Texts\(\.\.\.\)"):
        QueryEngine(ScriptedModel([]), texts={"interrupt_notice": "[stopped]"})  # type: ignore[arg-type]


@pytest.mark.parametrize("session", ["chat.jsonl", Path("chat.jsonl"), object()], ids=["str", "path", "object"])
def test_a_session_that_is_not_a_store_is_refused_at_construction(session: object) -> None:
    """A path passed as `session=` was accepted: the run went on, every record failed to append
    (an ERROR logged for each), and nothing was saved."""
    with pytest.raises(TypeError, match=r"session takes a session store .*JsonlSession\(path\)"):
        QueryEngine(ScriptedModel([]), session=session)  # type: ignore[arg-type]


def test_one_class_function_or_number_where_a_list_is_wanted_says_so() -> None:
    """``policies=IdenticalToolCallRun`` (the class, no list), ``policies=3``, ``tools=fn`` or
    ``tools=5`` raised Python's "'type' object is not iterable", which names neither the argument
    nor the fix."""
    from agentloop.policies import IdenticalToolCallRun

    async def grep(pattern: str) -> str:
        return pattern

    model = ScriptedModel(["hi"])
    with pytest.raises(TypeError, match=r"policies takes a list of policies, not the class IdenticalToolCallRun: policies=\[IdenticalToolCallRun\(\)\]"):
        QueryEngine(model, policies=IdenticalToolCallRun)  # type: ignore[arg-type]
    for bad in (3, "doom"):
        with pytest.raises(TypeError, match=r"policies takes a list of policies, not "):
            QueryEngine(model, policies=bad)  # type: ignore[arg-type]
    with pytest.raises(TypeError, match=r"tools takes a list of tools, not the function grep: decorate grep with @tool"):
        QueryEngine(model, tools=grep)  # type: ignore[arg-type]
    for bad in (5, "grep"):
        with pytest.raises(TypeError, match=r"tools takes a list of tools, not "):
            QueryEngine(model, tools=bad)  # type: ignore[arg-type]


def test_tools_given_as_a_generator_are_all_kept() -> None:
    """``tools=(t for t in ...)`` was read twice, so the second pass found it spent and the engine
    had no tools at all, without a word."""

    @tool
    async def ping() -> str:
        """Ping."""
        return "pong"

    engine = QueryEngine(ScriptedModel(["hi"]), tools=(t for t in [ping]))
    assert list(engine.tools) == ["ping"]


async def test_tools_and_model_assigned_between_runs_are_checked_when_assigned() -> None:
    """``engine.tools = ...`` and ``engine.model = ...`` took anything, which then failed deep in
    the next run; they are checked as the constructor checks them, and good values take effect."""

    @tool
    async def ping() -> str:
        """Ping."""
        return "pong"

    async def grep(pattern: str) -> str:
        return pattern

    engine = QueryEngine(ScriptedModel(["hi"]))
    with pytest.raises(TypeError, match=r"decorate grep with @tool"):
        engine.tools = [grep]  # type: ignore[list-item]
    with pytest.raises(TypeError, match=r"tools takes a list of tools: tools=\[ping\]"):
        engine.tools = ping  # type: ignore[assignment]
    with pytest.raises(TypeError, match=r"AnthropicModel\('claude-sonnet-4-5'\)"):
        engine.model = "claude-sonnet-4-5"  # type: ignore[assignment]
    assert engine.tools == {} and engine.tool_specs == ()

    engine.tools = [ping]
    assert list(engine.tools) == ["ping"] and engine.tool_specs == (ping,)
    engine.tools = dict(engine.tools)  # what reading it gives back
    assert engine.tool_specs == (ping,)
    with pytest.raises(ValueError, match=r"the key 'pong' names the tool 'ping'"):
        engine.tools = {"pong": ping}
    model = ScriptedModel([ScriptedResponse(tool_calls=[ScriptedToolCall("ping", {})]), "done"])
    engine.model = model
    events = await collect(engine.run("go"))
    assert isinstance(events[-1], TurnEnded) and events[-1].reason == "completed"
    assert engine.model is model and engine.messages[-1].text == "done"
    assert "pong" in str(model.requests[1].messages[-1].content[0])


@pytest.mark.parametrize("bad", [5, b"no", None, ["no"]])
def test_a_deny_whose_message_is_not_text_is_refused_at_construction(bad: object) -> None:
    """``Deny(5)`` was taken, and the model was told only "Permission denied." (the host's reason lost)."""
    from agentloop import Deny

    with pytest.raises(TypeError, match=r"Deny message must be a str, not "):
        Deny(bad)  # type: ignore[arg-type]


async def test_a_deny_made_without_its_check_whose_message_is_not_text_is_still_a_denial() -> None:
    """A `Deny` made around its check (``object.__new__``, an unpickler setting its slot) with a
    message that is not a str: reading its message raised AttributeError outside the callback's
    guard, and the run failed where the call was to be denied."""
    from agentloop import Deny, ToolUseBlock

    @tool
    async def delete(path: str) -> str:
        """Delete a file."""
        return f"deleted {path}"

    odd = object.__new__(Deny)
    object.__setattr__(odd, "message", 5)

    async def ask(use: ToolUseBlock, ctx: object) -> Deny:
        return odd

    model = ScriptedModel([ScriptedResponse(tool_calls=[ScriptedToolCall("delete", {"path": "x"})]), "done"])
    engine = QueryEngine(model, tools=[delete], permission=ask)  # type: ignore[arg-type]
    await collect(engine.run("clean up"))
    [result] = engine.messages[2].tool_results
    assert result.is_error and result.text == "Permission denied."
    assert engine.messages[-1].text == "done"
