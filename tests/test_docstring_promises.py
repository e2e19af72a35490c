"""What the public docstrings promise, held to it: ``help(agentloop.X)`` and an IDE's hover text
are read before the docs, so each name has a docstring, each parameter it names exists, and each
behaviour it states is true."""

from __future__ import annotations

import asyncio
import importlib
import inspect
import json
import re
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
from hypothesis import given
from hypothesis import strategies as st

from agentloop import (
    AbortController,
    AbortSignal,
    AssistantMessage,
    ConservativeDoomLoopPolicy,
    Deny,
    DoomLoopPolicy,
    DoomLoopSignal,
    IdenticalToolCallRun,
    Message,
    ModelRequest,
    Policy,
    ProcessResult,
    QueryEngine,
    RepetitionDetector,
    ScriptedModel,
    ScriptedResponse,
    ScriptedToolCall,
    StreamProtocolError,
    TextBlock,
    TextDelta,
    Texts,
    Tool,
    ToolCallFinished,
    ToolContext,
    ToolResultBlock,
    ToolUseBlock,
    TurnEnded,
    Usage,
    delegate_tool,
    event_json,
    run_process,
    tool,
    validate_transcript,
)
from agentloop.models import SSEDecoder, StreamEnd, StreamText, StreamToolUseStart, StreamUsage, parse_retry
from agentloop.policies import EndTurn, Nudge, canonical_key, is_keepalive
from agentloop.sessions import JsonlSession
from agentloop.testing import collect, turn_ended

PUBLIC_MODULES = [
    "agentloop",
    "agentloop.policies",
    "agentloop.sessions",
    "agentloop.models",
    "agentloop.mcp",
    "agentloop.testing",
]
API_MD = Path(__file__).resolve().parent.parent / "docs" / "api.md"
_CODE_SPAN = re.compile(r"``(.+?)``|`([^`]+)`", re.S)
#: The project's way to define a parameter: ````name``: what it is`` at the start of a line or a
#: sentence (no Args/Parameters sections: the docstrings are prose).
_DEFINITION = re.compile(r"(?:^|[.;] )``(\w+)``:", re.M)


def _public() -> Iterator[tuple[str, Any]]:
    """Each public object once, with the first public name it has."""
    seen: set[int] = set()
    for module_name in PUBLIC_MODULES:
        module = importlib.import_module(module_name)
        for name in module.__all__:
            obj = getattr(module, name)
            if id(obj) not in seen:
                seen.add(id(obj))
                yield f"{module_name}.{name}", obj


def _is_alias(obj: object) -> bool:
    """A type alias (a union, a ``Literal``, a ``Callable``): it cannot carry a docstring."""
    return not isinstance(obj, type) and not inspect.isfunction(obj)


def _members(cls: type) -> Iterator[tuple[str, Callable[..., Any] | property]]:
    """The public methods and properties a class defines itself (and ``__call__``)."""
    for key, value in vars(cls).items():
        if key.startswith("_") and key != "__call__":
            continue
        if isinstance(value, classmethod | staticmethod):
            yield key, value.__func__
        elif isinstance(value, property) or inspect.isfunction(value):
            yield key, value


def _own_doc(cls: type) -> str | None:
    """The class's own docstring: the one a dataclass writes for itself (its signature) is none."""
    doc = cls.__doc__
    if doc is None or doc.startswith(f"{cls.__name__}("):
        return None
    return doc


def _signature(obj: Any) -> inspect.Signature | None:
    try:
        return inspect.signature(obj)
    except (TypeError, ValueError):
        return None


def _code_words(text: str | None) -> set[str]:
    words: set[str] = set()
    for double, single in _CODE_SPAN.findall(text or ""):
        words |= set(re.findall(r"\w+", double or single))
    return words


def _parameters(fn: Any) -> list[str]:
    sig = _signature(fn)
    return [] if sig is None else [p for p in sig.parameters if p not in ("self", "cls")]


def test_every_public_name_has_a_docstring_and_every_member_too() -> None:
    missing: list[str] = []
    for qual, obj in _public():
        if _is_alias(obj):
            continue
        if isinstance(obj, type):
            if _own_doc(obj) is None:
                missing.append(qual)
            for key, member in _members(obj):
                doc = member.__doc__ if isinstance(member, property) else inspect.getdoc(member)
                if not doc or doc == "Call self as a function.":
                    missing.append(f"{qual}.{key}")
        elif not inspect.getdoc(obj):
            missing.append(qual)
    assert missing == []


def test_every_public_type_alias_is_in_the_api_reference() -> None:
    words = _code_words(API_MD.read_text(encoding="utf-8"))
    aliases = [qual for qual, obj in _public() if _is_alias(obj)]
    assert aliases  # Event, Block, TerminalReason... are aliases
    assert [qual for qual in aliases if qual.rsplit(".", 1)[1] not in words] == []


def test_every_parameter_a_docstring_defines_exists() -> None:
    wrong: list[str] = []
    for qual, obj in _public():
        if _is_alias(obj):
            continue
        targets: list[tuple[str, Any, str | None]] = [(qual, obj, obj.__doc__)]
        if isinstance(obj, type):
            targets += [(f"{qual}.{k}", m, m.__doc__) for k, m in _members(obj)]
        for where, target, doc in targets:
            known = set(_parameters(target)) | set(_parameters(obj))
            wrong += [
                f"{where}: ``{name}``"
                for name in _DEFINITION.findall(doc or "")
                if name not in known and not (isinstance(obj, type) and hasattr(obj, name))
            ]
    assert wrong == []


def test_every_public_parameter_is_explained_in_its_docstring_or_the_api_reference() -> None:
    """A parameter is explained when its docstring (the class's, for a constructor or a method)
    names it, or when docs/api.md shows it in code."""
    api_words = _code_words(API_MD.read_text(encoding="utf-8"))
    unexplained: list[str] = []

    def check(where: str, fn: Any, *docs: str | None) -> None:
        text = "\n".join(d for d in docs if d)
        unexplained.extend(
            f"{where}: {name}"
            for name in _parameters(fn)
            if name not in api_words and not re.search(rf"(?<!\w){re.escape(name)}(?!\w)", text)
        )

    for qual, obj in _public():
        if _is_alias(obj):
            continue
        if not isinstance(obj, type):
            check(qual, obj, inspect.getdoc(obj))
            continue
        # A constructor is explained where it is defined: an error subclass takes its base's.
        owner = next((c for c in obj.__mro__ if "__init__" in vars(c)), obj)
        if not getattr(obj, "_is_protocol", False):
            check(f"{qual}()", obj, _own_doc(obj), _own_doc(owner), vars(owner)["__init__"].__doc__)
        for key, member in _members(obj):
            if not isinstance(member, property):
                check(f"{qual}.{key}", member, inspect.getdoc(member), _own_doc(obj))
    assert unexplained == []


@pytest.mark.parametrize("module_name", PUBLIC_MODULES)
def test_the_walk_sees_each_public_module(module_name: str) -> None:
    module = importlib.import_module(module_name)
    assert module.__doc__
    assert module.__all__


# -- what the docstrings say, held to it ------------------------------------------------------------


async def test_scripted_response_error_is_raised_after_error_after_events_however_many_there_are() -> None:
    """``ScriptedResponse``: "``error``: raised after ``error_after`` events"."""
    from agentloop import ModelError, ScriptedResponse

    short = ScriptedResponse(text="hi", error=ModelError("reset"), error_after=2)  # 3 events
    stream = ScriptedModel([short]).stream(_request(), AbortController().signal)
    assert [type(await anext(stream)).__name__ for _ in range(2)] == ["StreamText", "StreamBlockStop"]
    with pytest.raises(ModelError, match="reset"):
        await anext(stream)
    late = ScriptedResponse(events=[StreamText(0, "Hel")], error=ModelError("cut"), error_after=1)
    stream = ScriptedModel([late]).stream(_request(), AbortController().signal)
    assert isinstance(await anext(stream), StreamText)
    with pytest.raises(ModelError, match="cut"):  # once every event is out: not a missing terminator
        await anext(stream)
    for after in (4, 7, -1):  # past the end of the stream, or before its start: never raised
        with pytest.raises(ValueError, match="error_after"):
            ScriptedResponse(text="hi", error=ModelError("reset"), error_after=after)


async def test_scripted_model_past_its_script_raises_model_error_and_cycle_starts_again() -> None:
    from agentloop import ModelError

    once = ScriptedModel(["a"])
    await _drain(once)
    with pytest.raises(ModelError, match="no response left"):
        await _drain(once)
    cycling = ScriptedModel(["a", "b"], cycle=True, record=False)
    texts = [await _drain(cycling) for _ in range(3)]
    assert texts == ["a", "b", "a"]
    assert cycling.requests == [] and cycling.request_count == 3
    with pytest.raises(TypeError, match="list of responses"):
        ScriptedModel("ab")  # type: ignore[arg-type]


async def test_scripted_tool_call_without_an_id_gets_a_fresh_one_each_play() -> None:
    call = ScriptedResponse(tool_calls=[ScriptedToolCall("read", {"path": "a"}), ScriptedToolCall("read", id="mine")])
    model = ScriptedModel([call, call])
    ids = [
        [e.id async for e in model.stream(_request(), AbortController().signal) if isinstance(e, StreamToolUseStart)]
        for _ in range(2)
    ]
    assert ids == [["toolu_0001", "mine"], ["toolu_0002", "mine"]]


def test_usage_total_is_input_plus_output() -> None:
    assert Usage(input_tokens=7, output_tokens=5, cache_read_tokens=3, cache_write_tokens=2).total == 12


async def test_stream_usage_later_events_replace_the_non_zero_fields() -> None:
    """``StreamUsage``: "later events replace non-zero fields of earlier ones"; ``StreamEnd``'s
    usage is merged the same way."""
    events = [
        StreamUsage(Usage(input_tokens=100, cache_read_tokens=40)),
        StreamText(0, "ok"),
        StreamUsage(Usage(output_tokens=9)),
        StreamEnd("end_turn", Usage(output_tokens=12)),
    ]
    engine = QueryEngine(ScriptedModel([ScriptedResponse(events=events)]), policies=[])
    message = next(e for e in await collect(engine.run("hi")) if isinstance(e, AssistantMessage))
    assert message.usage == Usage(input_tokens=100, output_tokens=12, cache_read_tokens=40)


def test_abort_controller_unlink_stops_following_the_parent() -> None:
    parent = AbortController()
    child = AbortController(parent=parent.signal)
    child.unlink()
    parent.abort("stop")
    assert not child.signal.aborted
    child.abort("own")
    assert child.signal.reason == "own" and parent.signal.reason == "stop"


def test_abort_with_a_reason_that_is_not_a_str_raises_and_aborts_nothing() -> None:
    controller = AbortController()
    with pytest.raises(TypeError):
        controller.abort(None)  # type: ignore[arg-type]
    assert not controller.signal.aborted
    controller.abort("later")
    assert controller.signal.reason == "later"


def test_message_user_takes_the_other_fields_validated_as_the_constructor_does() -> None:
    from pydantic import ValidationError

    made = Message.user("hello", synthetic=True, kind="nudge", meta={"k": 1})
    assert made == Message(role="user", content=[TextBlock(text="hello")], synthetic=True, kind="nudge", meta={"k": 1})
    assert Message.assistant("hi", partial=True).partial
    with pytest.raises(ValidationError):
        Message.user("hello", synthetic="maybe")


@given(
    text=st.text(max_size=20),
    synthetic=st.one_of(st.booleans(), st.sampled_from([0, 1, "yes", None])),
    kind=st.one_of(st.none(), st.text(max_size=5), st.integers()),
)
def test_message_user_builds_what_the_constructor_builds(text: str, synthetic: Any, kind: Any) -> None:
    """The quick path of `Message.user` and the constructor agree on every value, refused or not."""
    from pydantic import ValidationError

    def made(build: Callable[[], Message]) -> Message | str:
        try:
            return build()
        except ValidationError:
            return "refused"

    quick = made(lambda: Message.user(text, synthetic=synthetic, kind=kind))
    slow = made(lambda: Message(role="user", content=[TextBlock(text=text)], synthetic=synthetic, kind=kind))
    assert quick == slow


def test_message_text_and_tool_result_text_concatenate_their_text() -> None:
    message = Message(
        role="assistant",
        content=[TextBlock(text="a"), ToolUseBlock(id="t1", name="x"), TextBlock(text="b"), ToolUseBlock(id="t2", name="y")],
    )
    assert message.text == "ab"
    assert [u.id for u in message.tool_uses] == ["t1", "t2"]
    block = ToolResultBlock(tool_use_id="t1", content=[TextBlock(text="x"), TextBlock(text="y")])
    assert block.text == "xy"


def test_process_result_ok_is_exit_zero_without_a_timeout() -> None:
    assert ProcessResult(("true",), 0, "", "").ok
    assert not ProcessResult(("false",), 1, "", "").ok
    assert not ProcessResult(("sleep",), 0, "", "", timed_out=True).ok


def test_policy_name_is_its_class_name() -> None:
    class Mine(Policy):
        pass

    assert Mine().name == "Mine"
    assert IdenticalToolCallRun().name == "IdenticalToolCallRun"


def test_policy_fork_raises_type_error_naming_a_policy_that_cannot_be_copied() -> None:
    import threading

    class Locked(Policy):
        def __init__(self) -> None:
            self.lock = threading.Lock()

    with pytest.raises(TypeError, match="Locked"):
        Locked().fork()


def test_conservative_judge_aborts_only_on_short_thinking_tails_and_stopped_signals() -> None:
    policy = ConservativeDoomLoopPolicy()
    judge = policy.judge
    assert judge(DoomLoopSignal("tail_repetition", "thinking", threshold=64)) == "abort"
    assert judge(DoomLoopSignal("tail_repetition", "thinking", threshold=65)) == "warn"
    assert judge(DoomLoopSignal("tail_repetition", "thinking")) == "warn"  # a period not given
    assert judge(DoomLoopSignal("tail_repetition", "thinking", threshold=256, unit="chars", source="client")) == "abort"
    assert judge(DoomLoopSignal("tail_repetition", "thinking", threshold=257, unit="chars", source="client")) == "warn"
    assert judge(DoomLoopSignal("tail_repetition", "text", threshold=2)) == "warn"
    assert judge(DoomLoopSignal("exact_repetition", "thinking", tokens=2, copies=99)) == "warn"
    assert judge(DoomLoopSignal("tail_repetition", "text", stopped=True)) == "abort"
    assert DoomLoopPolicy().judge(DoomLoopSignal("tail_repetition", "thinking", threshold=1, stopped=True)) == "warn"


def test_doom_loop_policy_channels_are_checked() -> None:
    assert set(DoomLoopPolicy(channels=("thinking",)).detectors) == {"thinking"}
    with pytest.raises((TypeError, ValueError)):
        DoomLoopPolicy(channels="text")  # type: ignore[arg-type]
    with pytest.raises(ValueError):
        DoomLoopPolicy(channels=("speech",))


def test_repetition_detector_refuses_a_window_it_cannot_search() -> None:
    with pytest.raises(ValueError, match="window"):
        RepetitionDetector(window=16, anchor=16)
    with pytest.raises(ValueError):
        RepetitionDetector(anchor=1)
    with pytest.raises(ValueError):
        RepetitionDetector(step=0)
    detector = RepetitionDetector()
    detector.feed("abc")
    assert detector.chars == 3
    detector.reset()
    assert detector.chars == 0 and detector.tail() is None


@given(st.from_regex(r"\A(tail_repetition(:[1-9][0-9]{0,4})?|low_logprob|exact_repetition:[1-9][0-9]{0,3}x[1-9][0-9]{0,3})@[a-z_]{1,8}\Z"))
def test_doom_loop_signal_format_is_the_inverse_of_parse(text: str) -> None:
    signal = DoomLoopSignal.parse(text)
    assert signal.format() == text
    assert DoomLoopSignal.parse(signal.format()) == signal


def test_doom_loop_signal_parse_refuses_what_is_no_signal() -> None:
    for bad in ("tail_repetition:0@thinking", "exact_repetition:3x0@text", "tail_repetition:٣@text", "loop@text"):
        with pytest.raises(ValueError, match="not a doom-loop signal"):
            DoomLoopSignal.parse(bad)
    with pytest.raises(TypeError):
        DoomLoopSignal.parse(b"tail_repetition@text")  # type: ignore[arg-type]


def test_verdicts_refuse_what_the_engine_could_not_write() -> None:
    with pytest.raises(ValueError, match="reminder"):
        Nudge("  ")
    with pytest.raises(ValueError, match="stationarity_ended"):
        EndTurn("stop", reason="completed")  # type: ignore[arg-type]


def test_texts_are_checked_as_they_are_made() -> None:
    with pytest.raises(TypeError, match="never_started"):
        Texts(never_started=None)  # type: ignore[arg-type]
    for name in ("interrupt_notice", "doom_reminder"):
        with pytest.raises(ValueError, match=name):
            Texts(**{name: " "})


async def test_a_blank_deny_message_is_permission_denied_alone() -> None:
    @tool
    async def touch(path: str) -> str:
        """Touch a file."""
        return "touched"

    async def deny(use: ToolUseBlock, ctx: ToolContext) -> Deny:
        return Deny("  ")

    script = [ScriptedResponse(tool_calls=[ScriptedToolCall("touch", {"path": "a"})]), "done"]
    engine = QueryEngine(ScriptedModel(script), tools=[touch], permission=deny, policies=[])
    finished = [e for e in await collect(engine.run("go")) if isinstance(e, ToolCallFinished)]
    assert [(f.result.text, f.result.is_error) for f in finished] == [("Permission denied.", True)]


def test_jsonl_session_sidechain_and_close_keep_their_word(tmp_path: Path) -> None:
    session = JsonlSession(tmp_path / "s.jsonl")
    child = session.sidechain("sub-1")
    assert session.sidechain("sub-1") is child
    assert child.path == tmp_path / "subagents" / "s" / "sub-1.jsonl"
    for bad in ("../up", "a/b", ""):
        with pytest.raises(ValueError):
            session.sidechain(bad)
    session.append_message(Message.user("hi"))
    session.close()
    session.close()  # idempotent
    with pytest.raises(ValueError):
        session.append_message(Message.user("again"))
    late = session.sidechain("sub-2")
    with pytest.raises(ValueError):
        late.append_message(Message.user("late"))
    assert JsonlSession(tmp_path / "none.jsonl").load().messages == []
    assert not (tmp_path / "none.jsonl").exists()


def test_jsonl_session_takes_a_relative_path_from_the_working_directory_at_construction(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.chdir(tmp_path)
    session = JsonlSession("rel.jsonl")
    monkeypatch.chdir("/")
    session.append_message(Message.user("hi"))
    session.close()
    assert (tmp_path / "rel.jsonl").exists()
    monkeypatch.setenv("HOME", str(tmp_path))
    assert JsonlSession("~/home.jsonl").path == tmp_path / "home.jsonl"


def test_jsonl_session_append_event_writes_what_json_cannot_encode_as_its_repr(tmp_path: Path) -> None:
    class Opaque:
        def __repr__(self) -> str:
            return "<opaque>"

    session = JsonlSession(tmp_path / "s.jsonl")
    session.append_event({"type": "custom", "value": Opaque()})
    session.close()
    assert session.load().events == [{"type": "custom", "value": "<opaque>"}]


def test_sse_decoder_drops_an_unfinished_event_at_the_end_and_bounds_what_it_holds() -> None:
    decoder = SSEDecoder()
    assert [e.data for e in decoder.feed(b"id: 7\nretry: 50\ndata: a\n\ndata: b\n")] == ["a"]
    assert decoder.last_event_id == "7" and decoder.retry == 50
    assert decoder.close() == []
    bounded = SSEDecoder(max_event_bytes=10)
    with pytest.raises(StreamProtocolError):
        bounded.feed(b"data: " + b"x" * 20)
    llama = SSEDecoder(error_field=True)
    assert [(e.event, e.data) for e in llama.feed(b'error: {"message": "oom"}\n\n')] == [("error", '{"message": "oom"}')]


def test_parse_retry_reads_the_documented_headers() -> None:
    assert parse_retry(400, {"x-should-retry": "true"}) == (True, None)
    assert parse_retry(503, {"x-should-retry": "false"}) == (False, None)
    assert parse_retry(503, {"retry-after-ms": "1500", "retry-after": "9"}) == (True, 1.5)
    assert parse_retry(429, {"retry-after": "4, 60"}) == (True, 4.0)
    assert parse_retry(429, {"retry-after": "-3"}) == (True, None)
    assert parse_retry(429, {"retry-after": "Thu, 01 Jan 1970 00:01:40 GMT"}, now=40.0) == (True, 60.0)
    assert parse_retry(429, httpx.Headers({"Retry-After": "2"})) == (True, 2.0)


@given(st.text(), st.text(), st.one_of(st.none(), st.integers(100, 599)))
def test_parse_retry_never_raises(retry_after: str, retry_after_ms: str, status: int | None) -> None:
    retryable, delay = parse_retry(status, {"retry-after": retry_after, "retry-after-ms": retry_after_ms})
    assert isinstance(retryable, bool)
    assert delay is None or delay >= 0


def test_canonical_key_compares_arguments_by_value() -> None:
    a = ToolUseBlock(id="1", name="read", input={"path": "é", "n": 1.0, "opts": {"b": 1, "a": 2}})
    b = ToolUseBlock(id="2", name="read", input={"opts": {"a": 2, "b": 1}, "n": 1, "path": "é"})
    assert canonical_key(a) == canonical_key(b)
    assert "é" in canonical_key(a)[1]
    broken = [ToolUseBlock(id=str(i), name="read", input_error=f"not JSON: {i}") for i in range(2)]
    assert len({canonical_key(c) for c in broken} | {canonical_key(ToolUseBlock(id="9", name="read"))}) == 3


def test_is_keepalive_knows_a_shell_call_by_the_tool_s_name() -> None:
    def call(name: str, **args: Any) -> ToolUseBlock:
        return ToolUseBlock(id="1", name=name, input=args)

    assert is_keepalive(call("run_shell_command", command="true"))
    assert is_keepalive(call("runTerminalCommand", cmd="sleep 0"))
    assert is_keepalive(call("bash", command=["bash", "-lc", ":"]))
    assert is_keepalive(call("tool", script="exit 0"), shell_tools={"tool"})
    assert not is_keepalive(call("search", command="true"))
    assert not is_keepalive(call("bash", command="make"))


def test_stationarity_signature_counts_parallel_copies() -> None:
    uses = [ToolUseBlock(id=str(i), name="read", input={"p": "a"}) for i in range(5)]
    base, multiplicity = IdenticalToolCallRun().signature(Message(role="assistant", content=list(uses)), [])
    assert multiplicity == 5 and len(base) == 1


def test_subagent_refuses_its_own_or_an_ancestor_s_id() -> None:
    engine = QueryEngine(ScriptedModel([]), agent_id="main", policies=[])
    child = engine.subagent(agent_id="child")
    for taken in ("main", "child"):
        with pytest.raises(ValueError):
            child.subagent(agent_id=taken)


def test_delegate_tool_refuses_a_depth_that_is_not_a_whole_number_of_at_least_one() -> None:
    for bad, error in ((0, ValueError), (1.5, TypeError), ("2", TypeError), (True, TypeError)):
        with pytest.raises(error):
            delegate_tool(max_depth=bad)  # type: ignore[arg-type]


@given(st.text(), st.one_of(st.none(), st.text(max_size=300)))
def test_event_json_is_one_line_of_utf8_json_whatever_the_text(text: str, agent_id: str | None) -> None:
    """``event_json``: "no line break of any kind", "always encodes as UTF-8", every field there."""
    line = event_json(TextDelta(text=text, agent_id=agent_id))
    assert len(line.splitlines()) == 1
    line.encode("utf-8")
    assert json.loads(line) == {"type": "text_delta", "agent_id": agent_id, "text": text}
    bounded = json.loads(event_json(TextDelta(text=text, agent_id=agent_id), max_text_chars=8))
    if agent_id is not None and len(agent_id) <= 256:
        assert bounded["agent_id"] == agent_id  # an id a reader matches on is kept whole


def test_event_json_refuses_what_is_no_event_and_a_bad_bound() -> None:
    with pytest.raises(TypeError):
        event_json({"type": "text_delta"})  # type: ignore[arg-type]
    with pytest.raises(ValueError):
        event_json(TextDelta(text="x"), max_text_chars=-1)
    with pytest.raises(TypeError):
        event_json(TextDelta(text="x"), max_text_chars=2.5)  # type: ignore[arg-type]


@given(st.lists(st.one_of(st.none(), st.integers(), st.text(max_size=3), st.just(Message(role="user", content=[]))), max_size=4))
def test_validate_transcript_never_raises(entries: list[Any]) -> None:
    problems = validate_transcript(entries)
    assert isinstance(problems, list)
    assert bool(problems) == bool(entries) or all(isinstance(e, Message) for e in entries)


def test_turn_ended_says_what_is_wrong() -> None:
    end = TurnEnded(reason="completed")
    assert turn_ended([TextDelta(text="a"), end]) is end
    with pytest.raises(AssertionError, match="no TurnEnded"):
        turn_ended([TextDelta(text="a")])
    with pytest.raises(AssertionError, match="not the last event"):
        turn_ended([end, TextDelta(text="a")])
    with pytest.raises(AssertionError, match="subagent"):
        turn_ended([TurnEnded(reason="completed", agent_id="sub-1")])


def test_tool_refuses_what_it_cannot_make_a_tool_of() -> None:
    import functools

    def sync(x: int) -> int:
        return x

    async def untyped(x):  # type: ignore[no-untyped-def]
        return x

    async def fine(x: int) -> int:
        return x

    for bad in (sync, functools.partial(fine, 1), untyped):
        with pytest.raises(TypeError):
            tool(bad)  # type: ignore[arg-type]
    with pytest.raises(TypeError, match="name="):
        tool("search")  # type: ignore[call-overload]
    with pytest.raises(ValueError):
        tool(timeout=-1)(fine)
    with pytest.raises(ValueError):
        Tool("has space", "", {"type": "object"}, fine)  # type: ignore[arg-type]
    with pytest.raises(TypeError):
        Tool("t", "", {"type": "object"}, "not callable")  # type: ignore[arg-type]


async def test_tool_call_runs_the_handler_with_input_and_context() -> None:
    seen: list[tuple[dict[str, Any], ToolContext]] = []

    async def handler(raw: dict[str, Any], ctx: ToolContext) -> str:
        seen.append((raw, ctx))
        return "ran"

    ctx = ToolContext(AbortController().signal, "t1", QueryEngine(ScriptedModel([]), policies=[]))
    assert await Tool("t", "", {"type": "object"}, handler)({"a": 1}, ctx) == "ran"
    assert seen == [({"a": 1}, ctx)]


def _request() -> ModelRequest:
    return ModelRequest(messages=[Message.user("hi")])


async def _drain(model: ScriptedModel) -> str:
    events = [e async for e in model.stream(_request(), AbortController().signal)]
    return "".join(e.text for e in events if isinstance(e, StreamText))


def test_a_tool_context_made_by_hand_refuses_what_is_no_event_as_the_engine_s_does() -> None:
    """`ToolContext.emit` takes an agentloop event, anything else is a TypeError (API): also the
    default of a context a host makes to test its tool, which drops the events."""
    ctx = ToolContext(AbortController().signal, "t1", QueryEngine(ScriptedModel([]), policies=[]))
    ctx.emit(TextDelta(text="progress"))
    with pytest.raises(TypeError, match="agentloop event"):
        ctx.emit("50% done")  # type: ignore[arg-type]


def test_jsonl_session_fsync_every_takes_a_whole_number_of_appends(tmp_path: Path) -> None:
    """``fsync_every``: "also fsync every N appends": a count, refused clearly otherwise."""
    for bad, error in (("3", TypeError), (2.5, TypeError), (True, TypeError), (0, ValueError)):
        with pytest.raises(error, match="fsync_every"):
            JsonlSession(tmp_path / "s.jsonl", fsync_every=bad)  # type: ignore[arg-type]
    assert JsonlSession(tmp_path / "s.jsonl", fsync_every=3).fsync_every == 3


@pytest.mark.parametrize(
    ("field", "value"),
    [
        ("chunk", "4"),
        ("chunk", 0),
        ("delay", "0.1"),
        ("delay", -1.0),
        ("error", "boom"),
        ("events", [StreamText(0, "a"), "b"]),
        ("usage", {"input_tokens": 3}),
    ],
)
def test_a_scripted_response_that_could_only_fail_when_played_is_refused_when_made(field: str, value: Any) -> None:
    """``ScriptedResponse``: "Raises TypeError for a script that could only fail when played,
    blamed on the model" (ValueError for a number out of range)."""
    with pytest.raises((TypeError, ValueError), match=field):
        ScriptedResponse(text="hello", **{field: value})


@pytest.mark.parametrize(
    ("field", "value", "error"),
    [
        ("window", "4096", TypeError),
        ("step", 2.5, TypeError),
        ("max_candidates", "8", TypeError),
        ("max_candidates", 0, ValueError),
        ("tries", 0, ValueError),
        ("anchor", True, TypeError),
    ],
)
def test_repetition_detector_refuses_a_setting_it_could_only_fail_on_later(field: str, value: Any, error: type) -> None:
    """A detector made with a count that is no count failed at its first checkpoint, inside a run
    (or, with ``tries=0``, never found a loop): refused when it is made, naming the setting."""
    with pytest.raises(error, match=field):
        RepetitionDetector(**{field: value})


def test_tool_classes_given_by_name_are_names_not_letters() -> None:
    """``StationarityPolicy``: tools "can be added by name with ``tight_tools`` / ``poller_tools``":
    a bare string would be read letter by letter and class no tool."""
    for field in ("tight_tools", "poller_tools"):
        with pytest.raises(TypeError, match=field):
            IdenticalToolCallRun(**{field: "read_file"})
    assert IdenticalToolCallRun(tight_tools=["read_file"]).tight_tools == {"read_file"}


def test_a_tool_s_stationarity_is_normal_or_tight() -> None:
    """``Tool``: "``stationarity``: "tight" tools ... get the stricter thresholds": another word
    (a typo, "Tight") silently made a normal tool."""

    async def fine(x: int) -> int:
        return x

    with pytest.raises(ValueError, match="stationarity"):
        Tool("t", "", {"type": "object"}, fine, stationarity="Tight")  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="stationarity"):
        tool(stationarity="strict")(fine)  # type: ignore[call-overload]
    assert tool(stationarity="tight")(fine).stationarity == "tight"


def test_delegate_tool_refuses_a_max_turns_its_subagents_could_not_run_with() -> None:
    """A ``max_turns`` no engine takes failed every delegated call, one error result at a time."""
    with pytest.raises(TypeError, match="max_turns"):
        delegate_tool(max_turns="10")  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="max_turns"):
        delegate_tool(max_turns=-1)
    assert delegate_tool(max_turns=1).name == "task"


def test_sse_decoder_refuses_a_bound_that_is_no_number_of_bytes() -> None:
    """``max_event_bytes``: "how many bytes may come while no event completes": a str failed
    with an unclear TypeError at the first chunk, and 0 failed every stream."""
    for bad, error in (("64", TypeError), (True, TypeError), (0, ValueError), (-1, ValueError)):
        with pytest.raises(error, match="max_event_bytes"):
            SSEDecoder(max_event_bytes=bad)  # type: ignore[arg-type]


async def test_a_timeout_longer_than_any_float_never_fires() -> None:
    """``AbortSignal.timeout``: "infinity (or more than ``threading.TIMEOUT_MAX``) never": an int
    too large for a float raised OverflowError instead."""
    import math

    for seconds in (10**400, math.inf):
        signal = AbortSignal.timeout(seconds)
        await asyncio.sleep(0)
        assert not signal.aborted
    long_ago = AbortSignal.timeout(-(10**400))  # less than zero: aborts at the first chance
    assert await asyncio.wait_for(long_ago.wait(), 10) == "deadline"


async def test_a_number_too_large_for_a_float_is_a_value_error_where_type_and_value_errors_are_promised() -> None:
    """`QueryEngine`, `Tool` and `run_process` raise "TypeError or ValueError" for a setting they
    cannot run with: an int past any float raised OverflowError instead."""
    big = 10**400

    async def fine(x: int) -> int:
        return x

    with pytest.raises(ValueError, match="deadline"):
        QueryEngine(ScriptedModel([]), deadline=big)
    with pytest.raises(ValueError, match="max_turns"):
        QueryEngine(ScriptedModel([]), max_turns=big)
    with pytest.raises(ValueError, match="timeout"):
        Tool("t", "", {"type": "object"}, fine, timeout=big)
    with pytest.raises(ValueError, match="kill_grace"):
        await run_process("true", signal=AbortController().signal, kill_grace=big)
