"""JsonlSession: round trips, sidechains, resume + repair, fsync policy, crash safety."""

from __future__ import annotations

import asyncio
import datetime
import errno
import gc
import inspect
import json
import logging
import math
import os
import signal
import subprocess
import sys
import tempfile
import threading
import warnings
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import agentloop
from agentloop import (
    Message,
    ProviderBlock,
    QueryEngine,
    RedactedThinkingBlock,
    ScriptedModel,
    ScriptedResponse,
    ScriptedToolCall,
    TextBlock,
    ThinkingBlock,
    ToolResultBlock,
    ToolUseBlock,
    tool,
    validate_transcript,
)
from agentloop._events import AssistantMessage, InterjectionInjected, Retrying, TurnEnded, TurnStarted
from agentloop._model import Usage
from agentloop.sessions import JsonlSession, LoadedSession, SessionStore

REPO = Path(agentloop.__file__).resolve().parent.parent


def make_message(i: int) -> Message:
    """The i-th message of a deterministic transcript: question, tool call, result, ..."""
    from agentloop import Message, TextBlock, ToolResultBlock, ToolUseBlock

    if i % 3 == 0:
        return Message(role="user", content=[TextBlock(text=f"question {i} \u00e9\u4e2d")])
    if i % 3 == 1:
        use = ToolUseBlock(id=f"t{i}", name="echo", input={"n": i, "pad": "x" * (i % 97)})
        return Message(role="assistant", content=[TextBlock(text=f"calling {i}"), use])
    return Message(role="user", content=[ToolResultBlock(tool_use_id=f"t{i - 1}", content=f"result {i}")])


def test_round_trip_every_block_type(tmp_path: Path) -> None:
    messages = [
        Message.user("hello\nworld", meta={"host": {"k": [1, 2]}}),
        Message(
            role="assistant",
            content=[
                ThinkingBlock(thinking="hmm", signature="sig=="),
                RedactedThinkingBlock(data="opaque"),
                TextBlock(text="let me look"),
                ToolUseBlock(id="a", name="read", input={"path": "x.py", "n": [1, {"z": None}]}),
                ToolUseBlock(id="b", name="grep", input={}),
                ProviderBlock(provider="anthropic", data={"type": "server_tool_use", "id": "srvtoolu_1", "input": {}}),
            ],
        ),
        Message(
            role="user",
            content=[
                ToolResultBlock(tool_use_id="a", content="file body"),
                ToolResultBlock(tool_use_id="b", content=[TextBlock(text="no match")], is_error=True),
                TextBlock(text="and also"),
            ],
            synthetic=True,
            kind="tool_results",
        ),
        Message.assistant("partial answer", partial=True),
    ]
    with JsonlSession(tmp_path / "s.jsonl") as session:
        for m in messages:
            session.append_message(m)
    loaded = JsonlSession(tmp_path / "s.jsonl").load()
    assert loaded.messages == messages
    assert loaded.repairs == [] and loaded.warnings == []


def test_the_origin_of_thinking_round_trips_and_a_line_without_one_loads_as_unknown(tmp_path: Path) -> None:
    """The server that made a thinking block is kept in the file, so that a resumed session sends
    it back there only; a block of unknown origin is written as before the field existed, and a
    line written then (no ``origin``) loads as unknown, without a warning."""
    path = tmp_path / "s.jsonl"
    made = Message(
        role="assistant",
        content=[
            ThinkingBlock(thinking="hm", signature="ZHM=", origin="https://api.deepseek.com"),
            RedactedThinkingBlock(data="ZHMy", origin="https://api.deepseek.com"),
            ThinkingBlock(thinking="old", signature="EqQB"),
            RedactedThinkingBlock(data="EmwK"),
            TextBlock(text="ok"),
        ],
    )
    with JsonlSession(path) as session:
        session.append_message(made)
    written = json.loads(path.read_text(encoding="utf-8"))["message"]["content"]
    assert [b.get("origin", "-") for b in written] == ["https://api.deepseek.com"] * 2 + ["-"] * 3
    older = {"role": "assistant", "content": [{"type": "thinking", "thinking": "old", "signature": "EqQB"},
                                              {"type": "redacted_thinking", "data": "EmwK"}]}  # fmt: skip
    with path.open("a", encoding="utf-8") as f:
        f.write(json.dumps({"type": "message", "message": older}) + "\n")
    loaded = JsonlSession(path).load()
    assert loaded.messages == [made, Message(role="assistant", content=made.content[2:4])]
    assert [getattr(b, "origin", "-") for m in loaded.messages for b in m.content] == [
        "https://api.deepseek.com", "https://api.deepseek.com", None, None, "-", None, None]  # fmt: skip
    assert loaded.repairs == [] and loaded.warnings == []


def test_every_line_is_one_record_for_splitlines_too(tmp_path: Path) -> None:
    """U+2028, U+2029 and U+0085 (NEL: cp1252's ellipsis decoded as Latin-1) were written raw
    inside JSON strings: a line break to ``str.splitlines()``, which read the file as more lines
    than records, each one a broken record. They are written as \\u escapes."""
    path = tmp_path / "s.jsonl"
    text = "web text\u2028with breaks\u2029and an ellipsis\x85 \\\u2028"
    message = Message.user(text, meta={"k\u2028": text})
    with JsonlSession(path) as session:
        session.append_message(message)
        session.append_message(Message.user(text, meta={"host": _HostObject()}))  # the fallback encoder
        session.append_event({"type": "custom", "text": text})
        session.append_checkpoint([message])
    lines = path.read_text(encoding="utf-8").splitlines()
    assert [json.loads(line)["type"] for line in lines] == ["message", "message", "event", "checkpoint"]
    loaded = JsonlSession(path).load()
    assert loaded.messages == [message] and loaded.events == [{"type": "custom", "text": text}]
    assert json.loads(lines[1])["message"]["content"][0]["text"] == text


def test_events_are_serialised_generically(tmp_path: Path) -> None:
    session = JsonlSession(tmp_path / "s.jsonl")
    session.append_event(TurnEnded(reason="aborted_tools", abort_reason="cancel", usage=Usage(), turns=2))
    session.append_event(InterjectionInjected(texts=("a", "b"), ids=("1", "2"), agent_id="sub"))
    session.append_event(AssistantMessage(message=Message.assistant("hi")))
    session.append_event({"type": "custom", "value": object()})
    session.close()
    events = JsonlSession(tmp_path / "s.jsonl").load().events
    assert events[0]["type"] == "turn_ended"
    assert events[0]["reason"] == "aborted_tools" and events[0]["abort_reason"] == "cancel"
    assert events[0]["usage"]["input_tokens"] == 0
    assert events[1] == {
        "type": "interjection_injected",
        "agent_id": "sub",
        "texts": ["a", "b"],
        "ids": ["1", "2"],
    }
    assert Message.model_validate(events[2]["message"]) == Message.assistant("hi")
    assert events[3]["value"].startswith("<object object")


def _strict_json(line: str) -> Any:
    """json.loads without Python's extensions (NaN, Infinity): JSON as every other reader parses it."""

    def refuse(token: str) -> None:
        raise ValueError(f"{token} is not JSON")

    return json.loads(line, parse_constant=refuse)


def _nulled(value: Any) -> Any:
    """``value`` as written: every NaN or infinite float becomes None."""
    if isinstance(value, float) and not math.isfinite(value):
        return None
    if isinstance(value, dict):
        return {k: _nulled(v) for k, v in value.items()}
    if isinstance(value, list):
        return [_nulled(v) for v in value]
    return value


_JSON_VALUES = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats() | st.text(max_size=4),
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=3), inner, max_size=3),
    max_leaves=8,
)


@settings(max_examples=60, deadline=None)
@given(value=_JSON_VALUES, bad=st.sampled_from([math.nan, math.inf, -math.inf]))
def test_a_non_finite_float_is_written_as_null_by_every_record_type(value: Any, bad: float) -> None:
    """A NaN or an infinity was written as null in a message but as a bare ``NaN`` token (not
    JSON: other readers refuse the line) in an event, and in a message whose meta needed the
    fallback encoder. Every record now writes null, and load() reads back exactly that."""
    with tempfile.TemporaryDirectory() as d:
        path = Path(d) / "s.jsonl"
        values = {"value": value, "bad": bad, "list": [bad, 1.5]}
        plain = Message.user("plain", meta=values)
        fallback = Message.user("fallback", meta={**values, "host": _HostObject()})
        use = Message(role="assistant", content=[ToolUseBlock(id="t1", name="calc", input=values)])
        with JsonlSession(path) as session:
            for m in (plain, fallback, use):
                session.append_message(m)
            session.append_event(Retrying(attempt=1, error="overloaded", delay=bad))
            session.append_event({"type": "custom", **values})
        session, loaded = JsonlSession.resume(path)  # repairs the dangling tool_use: a checkpoint
        session.close()
        lines = path.read_text(encoding="utf-8").split("\n")  # not splitlines(): "\x85" is in a string
        assert lines.pop() == ""
        records = [_strict_json(line) for line in lines]
        assert [r["type"] for r in records] == ["message"] * 3 + ["event"] * 2 + ["checkpoint"]
        written = _nulled(values)
        assert records[3]["event"]["delay"] is None and records[4]["event"]["bad"] is None
        assert loaded.messages[0].meta == written and loaded.messages[2].tool_uses[0].input == written
        assert loaded.messages[1].meta == {**written, "host": "<HostObject>"}
        assert loaded.events[1] == {"type": "custom", **written}
        again = JsonlSession(path).load()
        assert again.messages == loaded.messages and again.repairs == [] and again.warnings == []
        assert [Message.model_validate(m) for m in records[5]["messages"]] == loaded.messages


def test_a_bare_nan_token_from_an_older_version_loads_as_null(tmp_path: Path) -> None:
    """Older versions wrote ``NaN``/``Infinity`` tokens in events (and in fallback messages): they
    load as None, as the null written today, so a tool input loaded from such a file can be sent
    again (a NaN in a request is refused)."""
    path = tmp_path / "s.jsonl"
    path.write_bytes(
        b'{"type":"message","message":{"role":"assistant","content":[{"type":"tool_use","id":"t1",'
        b'"name":"calc","input":{"x":NaN,"y":[Infinity,-Infinity]}}]}}\r\n'
        b'{"type":"message","message":{"role":"user","content":[{"type":"tool_result","tool_use_id":"t1",'
        b'"content":"ok"}]}}\r\n'
        b'{"type":"event","event":{"type":"retrying","delay":Infinity}}\r\n'
    )
    loaded = JsonlSession(path).load()
    assert loaded.warnings == [] and loaded.repairs == []
    assert loaded.messages[0].tool_uses[0].input == {"x": None, "y": [None, None]}
    assert loaded.events == [{"type": "retrying", "delay": None}]


class _HostObject:
    def __repr__(self) -> str:
        return "<HostObject>"


async def test_a_meta_value_json_cannot_encode_does_not_cost_the_message(tmp_path: Path) -> None:
    """``meta`` is free-form host data: a value JSON cannot encode is written as its repr (as in
    an event record), where the whole message, content and all, used to be left out of the file,
    and an event holding such a message failed to append."""
    path = tmp_path / "s.jsonl"
    when = datetime.datetime(2024, 6, 1, 12, 0)
    meta = {"obj": _HostObject(), "raw": b"\xff\xfe", "when": when, "tags": {"a"}, "text": "caf\udce9"}
    prompt = Message.user("Refactor the parser", meta=meta)
    with JsonlSession(path) as session:
        engine = QueryEngine(ScriptedModel(["Done."]), session=session, policies=[])
        async for event in engine.run(prompt):
            if isinstance(event, TurnStarted):  # a host that records an event holding the message
                session.append_event(event)
    loaded = JsonlSession(path).load()
    assert Message.model_validate(loaded.events[0]["prompt"]) == loaded.messages[0]
    assert loaded.warnings == []
    assert [m.model_copy(update={"meta": {}}) for m in loaded.messages] == [
        m.model_copy(update={"meta": {}}) for m in engine.messages
    ]
    assert loaded.messages[0].meta == {
        "obj": "<HostObject>",
        "raw": repr(b"\xff\xfe"),
        "when": "2024-06-01T12:00:00",
        "tags": ["a"],
        "text": "caf\udce9",
    }


async def test_a_meta_that_holds_itself_does_not_cost_the_message(tmp_path: Path) -> None:
    # A dict inside itself (a host's tree with a parent link) sent the encoder's fallback round
    # and round to a RecursionError: the message was left out of the file.
    tree: dict[str, object] = {"name": "root", "raw": b"\xff"}
    tree["self"] = tree
    path = tmp_path / "s.jsonl"
    with JsonlSession(path) as session:
        engine = QueryEngine(ScriptedModel(["Done."]), session=session, policies=[])
        async for _ in engine.run(Message.user("Walk the tree", meta={"tree": tree})):
            pass
    assert engine.session_errors == []
    loaded = JsonlSession(path).load()
    assert [m.text for m in loaded.messages] == ["Walk the tree", "Done."]
    written = loaded.messages[0].meta["tree"]
    assert written["name"] == "root" and written["raw"] == repr(b"\xff") and written["self"] == repr(tree)


async def test_a_meta_that_holds_an_iterator_is_written_without_running_it(tmp_path: Path) -> None:
    # Pydantic drains an iterator it dumps: a host's cursor in a message's meta was used up as
    # the message was recorded, and an endless one blocked the event loop for good.
    advanced: list[str] = []

    def cursor() -> Any:  # finite here, so that the old code fails rather than hangs
        advanced.append("rows")
        yield "row"

    path = tmp_path / "s.jsonl"
    rows = cursor()
    with JsonlSession(path) as session:
        engine = QueryEngine(ScriptedModel(["Done."]), session=session, policies=[])
        async for _ in engine.run(Message.user("Summarise", meta={"query": {"rows": rows}})):
            pass
    assert advanced == [] and engine.session_errors == []
    loaded = JsonlSession(path).load()
    assert [m.text for m in loaded.messages] == ["Summarise", "Done."]
    assert loaded.messages[0].meta == {"query": {"rows": repr(rows)}}


def test_sidechain_files_live_next_to_the_main_file(tmp_path: Path) -> None:
    main = JsonlSession(tmp_path / "proj" / "main.jsonl", fsync="never")
    child = main.sidechain("agent-1")
    assert child is main.sidechain("agent-1")
    assert child.path == tmp_path / "proj" / "subagents" / "main" / "agent-1.jsonl"
    assert child.fsync == "never"
    assert child.sidechain("agent-2").path == tmp_path / "proj" / "subagents" / "main" / "agent-2.jsonl"
    child.append_message(Message.user("from the subagent"))
    main.append_message(Message.user("from the main agent"))
    main.close()
    assert JsonlSession(child.path).load().messages == [Message.user("from the subagent")]
    assert JsonlSession(main.path).load().messages == [Message.user("from the main agent")]
    with pytest.raises(ValueError, match="closed"):
        child.append_message(Message.user("late"))
    for bad in ("", "..", "a/b", "a\\b"):
        with pytest.raises(ValueError):
            main.sidechain(bad)


async def test_a_relative_path_is_fixed_when_the_session_is_made(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The file is opened at the first append and a sidechain much later: a tool (or the host)
    that changed the working directory in between put them in another directory than the one
    the session was made in, and load() read yet another."""
    home, elsewhere = tmp_path / "project", tmp_path / "elsewhere"
    home.mkdir()
    elsewhere.mkdir()

    @tool
    async def cd(path: str) -> str:
        """Change the working directory."""
        os.chdir(path)
        return "ok"

    model = ScriptedModel([
        ScriptedResponse(tool_calls=[ScriptedToolCall("cd", {"path": str(elsewhere)})]),
        ScriptedResponse(tool_calls=[ScriptedToolCall("task", {"task": "look"})]),
        "sub answer",
        "Done.",
    ])
    monkeypatch.chdir(home)
    with JsonlSession("s.jsonl") as session:
        monkeypatch.chdir(tmp_path)  # before the first append, as a host may do
        engine = QueryEngine(model, tools=[cd, agentloop.delegate_tool()], session=session, policies=[])
        async for _ in engine.run("go"):
            pass
    assert Path.cwd() == elsewhere and engine.session_errors == []
    assert sorted(p.relative_to(tmp_path).as_posix() for p in tmp_path.rglob("*.jsonl")) == [
        "project/s.jsonl",
        "project/subagents/s/sub-1.jsonl",
    ]
    assert session.load().messages == engine.messages


async def test_a_subagent_id_another_process_takes_meanwhile_is_not_shared(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Sessions sharing a ``sidechain_dir`` share its files, and `delegate_tool` gave the
    first id whose sidechain file did not exist yet. Another process (a worker on another session
    sharing that folder) that made that file after the look, and finished its subagent, had its
    sidechain taken over: this child's checkpoint made the file replay to this child, not to the
    other's. An id is now taken by creating its file, which only one can do."""
    sidechains = tmp_path / "subagents"
    real_exists = Path.exists

    def exists(self: Path) -> bool:  # the look is made before the other process writes its file
        return False if self.parent == sidechains else real_exists(self)

    monkeypatch.setattr(Path, "exists", exists)
    with JsonlSession(tmp_path / "other.jsonl", sidechain_dir=sidechains).sidechain("sub-1") as theirs:
        theirs.append_message(Message.user("their task"))
    before = (sidechains / "sub-1.jsonl").read_bytes()
    model = ScriptedModel([ScriptedResponse(tool_calls=[ScriptedToolCall("task", {"task": "mine"})]), "sub answer", "Done."])
    with JsonlSession(tmp_path / "mine.jsonl", sidechain_dir=sidechains) as session:
        engine = QueryEngine(model, tools=[agentloop.delegate_tool()], session=session, policies=[])
        events = [ev async for ev in engine.run("go")]
    assert {e.agent_id for e in events if isinstance(e, TurnEnded)} == {"sub-2", None}
    assert (sidechains / "sub-1.jsonl").read_bytes() == before
    assert [m.text for m in JsonlSession(sidechains / "sub-2.jsonl").load().messages] == ["mine", "sub answer"]
    assert engine.session_errors == []


def test_close_closes_every_file_even_when_a_sync_fails(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A sidechain whose fsync fails at close (EIO) does not leave the main file, or the other
    sidechains, open and unsynced: all are closed, and the error is raised after."""
    main = JsonlSession(tmp_path / "main.jsonl")
    first, second = main.sidechain("agent-1"), main.sidechain("agent-2")
    for session in (main, first, second):
        session.append_message(Message.user("x"))
    failing = first.path.stat().st_ino
    synced: list[int] = []
    real_fsync = os.fsync

    def fake_fsync(fd: int) -> None:
        ino = os.fstat(fd).st_ino
        if ino == failing:
            raise OSError(errno.EIO, "Input/output error")
        synced.append(ino)
        real_fsync(fd)

    monkeypatch.setattr(os, "fsync", fake_fsync)
    with pytest.raises(OSError, match="Input/output error"):
        main.close()
    assert main.path.stat().st_ino in synced and second.path.stat().st_ino in synced
    for session in (main, first, second):
        with pytest.raises(ValueError, match="closed"):
            session.append_message(Message.user("late"))
    main.close()  # idempotent: nothing left to fail


def test_a_sidechain_asked_for_while_the_session_closes_comes_closed(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """close() in one thread while an engine in another starts a subagent: a sidechain made
    after close() had listed the sidechains, but before it marked the session closed, came
    open, and nothing would close its file (nor let go of its lock)."""
    session = JsonlSession(tmp_path / "main.jsonl")
    early = session.sidechain("early")
    late: list[JsonlSession] = []
    real_close = JsonlSession.close

    def close(self: JsonlSession) -> None:
        if self is early and not late:  # the other thread, just as close() reaches the sidechains
            late.append(session.sidechain("late"))
        real_close(self)

    monkeypatch.setattr(JsonlSession, "close", close)
    session.close()
    with pytest.raises(ValueError, match="closed session"):
        late[0].append_message(Message.user("written after the close"))
    assert not (tmp_path / "subagents").exists()


async def test_a_subagent_made_after_the_session_closed_writes_nothing(tmp_path: Path) -> None:
    """Once the owner closed the session, a subagent's sidechain comes closed too (its appends
    fail like the main file's), rather than opening a file nothing would ever close."""
    main = JsonlSession(tmp_path / "main.jsonl")
    main.close()
    engine = QueryEngine(ScriptedModel(["Done."]), session=main, policies=[])
    child = engine.subagent(agent_id="late")
    async for _ in child.run("go"):
        pass
    assert child.messages[-1].text == "Done."
    assert not (tmp_path / "subagents").exists()
    with pytest.raises(ValueError, match="closed"):
        main.sidechain("late").append_message(Message.user("x"))


def test_the_protocol_is_satisfied(tmp_path: Path) -> None:
    assert isinstance(JsonlSession(tmp_path / "s.jsonl"), SessionStore)


async def test_a_reply_ending_in_whitespace_replays_exactly_with_nothing_to_repair(tmp_path: Path) -> None:
    """Trailing whitespace is stripped before the message is committed, so the file holds the
    transcript the engine ends with (a later load reports no repair and writes no checkpoint)."""
    path = tmp_path / "s.jsonl"
    with JsonlSession(path) as session:
        engine = QueryEngine(ScriptedModel(["Done, all tests pass.  \n"]), session=session, policies=[])
        async for _ in engine.run("go"):
            pass
    assert engine.messages[-1].text == "Done, all tests pass."
    loaded = JsonlSession(path).load()
    assert loaded.repairs == [] and loaded.messages == engine.messages


class _ListStore:
    """A store of the four protocol methods only (no append_checkpoint)."""

    def __init__(self) -> None:
        self.messages: list[Message] = []

    def append_message(self, message: Message) -> None:
        self.messages.append(message)

    def append_event(self, event: object) -> None:
        pass

    def sidechain(self, agent_id: str) -> _ListStore:
        return _ListStore()

    def close(self) -> None:
        pass


async def test_a_transcript_the_host_rewound_or_extended_between_runs_replays_from_the_file(tmp_path: Path) -> None:
    """The file recorded only what the engine committed: after the host rewound the transcript
    (an edited question), the file still replayed the discarded exchange, and a message the host
    appended before a run was missing. The next run now records both, and nothing otherwise."""
    path = tmp_path / "s.jsonl"
    model = ScriptedModel(["A1", "A2", "A2 again", "A3"])
    with JsonlSession(path) as session:
        engine = QueryEngine(model, session=session, policies=[])
        for prompt in ("Q1", "Q2"):
            async for _ in engine.run(prompt):
                pass
        assert b'"checkpoint"' not in path.read_bytes()  # nothing to catch up on
        del engine.messages[2:]  # the user edits Q2
        async for _ in engine.run("Q2 edited"):
            pass
        engine.messages.append(Message.user("Q3, added by the host"))
        async for _ in engine.run():
            pass
    assert [m.text for m in engine.messages] == ["Q1", "A1", "Q2 edited", "A2 again", "Q3, added by the host", "A3"]
    loaded = JsonlSession(path).load()
    assert loaded.messages == engine.messages and loaded.repairs == [] and loaded.warnings == []
    assert path.read_bytes().count(b'{"type":"checkpoint"') == 1 and engine.session_errors == []

    store = _ListStore()  # a store that cannot record a checkpoint says so
    engine = QueryEngine(ScriptedModel(["A1", "A2"]), session=store, policies=[])
    async for _ in engine.run("Q1"):
        pass
    engine.messages.clear()
    async for _ in engine.run("Q2"):
        pass
    assert [m.text for m in store.messages] == ["Q1", "A1", "Q2", "A2"]
    assert engine.session_errors == [
        "could not record a checkpoint of the transcript the host rewrote: "
        "TypeError: _ListStore has no append_checkpoint()"
    ]


async def test_a_new_engine_given_none_of_a_files_conversation_starts_it_afresh_in_the_file(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """A batch worker runs a task again with the session file of its last attempt, and builds
    the engine without `messages=`: the model sees only the new prompt. The file used to replay
    to the old conversation with the new one appended, a transcript no engine ever had. Its
    first record is now a checkpoint, and a warning says how to continue the file instead."""
    path = tmp_path / "task-7.jsonl"
    for attempt in ("first", "second"):
        with JsonlSession(path) as session:
            engine = QueryEngine(ScriptedModel([f"{attempt} answer"]), session=session, policies=[])
            with caplog.at_level(logging.WARNING, logger="agentloop"):
                async for _ in engine.run(f"{attempt} attempt"):
                    pass
    assert [m.text for m in engine.messages] == ["second attempt", "second answer"]
    loaded = JsonlSession(path).load()
    assert loaded.messages == engine.messages and loaded.repairs == [] and engine.session_errors == []
    warned = [r.getMessage() for r in caplog.records if "holds a conversation already" in r.getMessage()]
    assert len(warned) == 1 and str(path) in warned[0] and "resume" in warned[0]

    # Given the file's conversation (the documented way to continue it), nothing changes.
    caplog.clear()
    session, loaded = JsonlSession.resume(path)
    with session:
        engine = QueryEngine(ScriptedModel(["third answer"]), session=session, messages=loaded.messages, policies=[])
        with caplog.at_level(logging.WARNING, logger="agentloop"):
            async for _ in engine.run("third attempt"):
                pass
    assert JsonlSession(path).load().messages == engine.messages
    assert path.read_bytes().count(b'{"type":"checkpoint"') == 1
    assert not [r for r in caplog.records if "holds a conversation already" in r.getMessage()]


async def test_a_conversation_forked_into_a_new_file_replays_from_that_file(tmp_path: Path) -> None:
    """Forking a saved conversation (its messages loaded, a new session file, `messages=`) left
    the new file without them: the given messages were taken to be in the session already, so
    the fork's file replayed to its own new messages only, and a resume of the fork lost the
    conversation it branched from. A file that holds no records gets them as a checkpoint first."""
    source = tmp_path / "main.jsonl"
    with JsonlSession(source) as session:
        engine = QueryEngine(ScriptedModel(["first answer"]), session=session, policies=[])
        async for _ in engine.run("first question"):
            pass
    loaded = JsonlSession(source).load()
    for fork in (tmp_path / "fork.jsonl", tmp_path / "empty.jsonl"):
        if fork.name == "empty.jsonl":
            fork.touch()  # made empty beforehand: it holds no records either
        with JsonlSession(fork) as session:
            branch = QueryEngine(ScriptedModel(["fork answer"]), session=session, messages=loaded.messages, policies=[])
            async for _ in branch.run("fork question"):
                pass
        assert [m.text for m in branch.messages] == ["first question", "first answer", "fork question", "fork answer"]
        replayed = JsonlSession(fork).load()
        assert replayed.messages == branch.messages and replayed.repairs == [] and branch.session_errors == []
    assert JsonlSession(source).load().messages == loaded.messages  # the source is untouched

    # A subagent given messages over its fresh sidechain is forked the same way.
    with JsonlSession(tmp_path / "parent.jsonl") as session:
        parent = QueryEngine(ScriptedModel(["child answer"]), session=session, policies=[])
        child = parent.subagent(agent_id="helper", messages=loaded.messages)
        async for _ in child.run("child question"):
            pass
    assert JsonlSession(tmp_path / "subagents" / "parent" / "helper.jsonl").load().messages == child.messages


async def test_a_resumed_session_never_hands_out_a_receipt_its_file_holds(tmp_path: Path) -> None:
    """Receipt ids were numbered from 1 by each engine: a session resumed by a new engine (the
    next process, a server's next request) handed out "int-1" again, and the file then held two
    deliveries of "int-1", of different texts."""
    path = tmp_path / "s.jsonl"
    handed: list[str] = []
    for _ in range(2):  # two processes, one session file
        session, loaded = JsonlSession.resume(path)
        with session:
            engine = QueryEngine(ScriptedModel(["ok", "later ok"]), messages=loaded.messages, session=session, policies=[])
            handed += [engine.interject("note"), engine.follow_up("later")]
            async for _ in engine.run("go"):
                pass
    loaded = JsonlSession(path).load()
    delivered = [i for e in loaded.events if e["type"] == "interjection_injected" for i in e["ids"]]
    delivered += [m.meta["receipt"] for m in loaded.messages if "receipt" in m.meta]
    assert sorted(delivered) == sorted(handed) and len(set(handed)) == 4


def test_missing_file_loads_empty_and_creates_nothing(tmp_path: Path) -> None:
    session = JsonlSession(tmp_path / "deep" / "s.jsonl")
    assert session.load() == LoadedSession(messages=[])
    session.close()
    assert not (tmp_path / "deep").exists()


def test_resume_repairs_a_dangling_tool_use_and_reports_it(tmp_path: Path) -> None:
    path = tmp_path / "s.jsonl"
    with JsonlSession(path) as session:
        for i in range(5):  # ends with the assistant's tool_use t4, no result
            session.append_message(make_message(i))
    session, loaded = JsonlSession.resume(path)
    assert (
        len(loaded.repairs) == 1 and "synthetic result" in loaded.repairs[0] and "'t4'" in loaded.repairs[0]
    )
    assert validate_transcript(loaded.messages) == []
    last = loaded.messages[-1]
    assert last.synthetic and last.tool_results[0].tool_use_id == "t4" and last.tool_results[0].is_error
    session.append_message(Message.user("go on"))
    session.close()
    again = JsonlSession(path).load()  # the checkpoint replays the repaired transcript
    assert again.repairs == [] and again.warnings == []
    assert again.messages == [*loaded.messages, Message.user("go on")]


def test_resume_of_a_file_it_cannot_write_loads_and_reports(tmp_path: Path, monkeypatch: Any) -> None:
    """A session that needs repair, on a file opened read-only (an archive, a read-only mount, a
    viewer with less permission): resume() used to raise from the checkpoint it appends, and the
    host got nothing, though load() alone reads it fine."""
    path = tmp_path / "s.jsonl"
    with JsonlSession(path) as session:
        for i in range(5):  # ends with the assistant's tool_use t4, no result
            session.append_message(make_message(i))
    before = path.read_bytes()
    real_open = os.open

    def read_only(file: Any, flags: int, *args: Any, **kw: Any) -> int:
        if Path(file) == path and flags & (os.O_RDWR | os.O_WRONLY):
            raise PermissionError(errno.EROFS, "Read-only file system", str(file))
        return real_open(file, flags, *args, **kw)

    monkeypatch.setattr(os, "open", read_only)
    session, loaded = JsonlSession.resume(path)
    assert loaded.messages == JsonlSession(path).load().messages and validate_transcript(loaded.messages) == []
    assert len(loaded.repairs) == 1
    assert len(loaded.warnings) == 1 and "checkpoint" in loaded.warnings[0] and "Read-only" in loaded.warnings[0]
    assert path.read_bytes() == before
    with pytest.raises(PermissionError):  # still read-only: each append says so (the engine lists it)
        session.append_message(Message.user("go on"))
    monkeypatch.setattr(os, "open", real_open)  # writable again: the owed checkpoint goes first
    session.append_message(Message.user("go on"))
    session.close()
    again = JsonlSession(path).load()
    assert again.repairs == [] and again.warnings == []
    assert again.messages == [*loaded.messages, Message.user("go on")]
def test_corrupt_middle_line_is_skipped_and_the_rest_kept(tmp_path: Path, caplog: Any) -> None:
    path = tmp_path / "s.jsonl"
    with JsonlSession(path) as session:
        session.append_message(Message.user("one"))
    with path.open("ab") as f:
        f.write(b'{"type":"message","message":{"role":"user"\n{"type":"mystery"}\n')
    with JsonlSession(path) as session:
        session.append_message(Message.user("two"))
    with caplog.at_level(logging.WARNING, logger="agentloop"):
        loaded = JsonlSession(path).load()
    assert loaded.messages == [Message.user("one"), Message.user("two")]
    assert len(loaded.warnings) == 2
    assert "corrupt line 2" in loaded.warnings[0] and "unknown record type 'mystery'" in loaded.warnings[1]
    assert [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING] == loaded.warnings


def test_a_line_nested_too_deep_to_parse_is_skipped_not_fatal(tmp_path: Path) -> None:
    """A damaged line of brackets nested past the JSON depth limit is one more
    corrupt line: the load goes on, rather than raising RecursionError for the whole file."""
    path = tmp_path / "s.jsonl"
    with JsonlSession(path) as session:
        session.append_message(Message.user("one"))
    with path.open("ab") as f:
        f.write(b"[" * 100_000 + b"\n" + b'{"type":"event","event":' * 50_000 + b"\n")
    with JsonlSession(path) as session:
        session.append_message(Message.user("two"))
    loaded = JsonlSession(path).load()
    assert loaded.messages == [Message.user("one"), Message.user("two")]
    assert len(loaded.warnings) == 2
    assert all("nested too deeply" in w for w in loaded.warnings)


def test_surrogates_encoded_as_bytes_are_repaired_on_load(tmp_path: Path) -> None:
    """A file from a CESU-8 writer (Java's modified UTF-8, Python's "surrogatepass") holds
    UTF-16 halves as raw bytes, which json decodes to lone surrogates without any \\ud escape:
    the load repairs them too, so the transcript it returns is valid (rule R9)."""
    path = tmp_path / "s.jsonl"
    text = "smile \ud83d\ude00, half \ud83d"
    body = Message.user("x").model_dump(mode="json")
    body["content"][0]["text"] = text
    line = json.dumps({"type": "message", "message": body}, ensure_ascii=False)
    path.write_bytes(line.encode("utf-8", "surrogatepass") + b"\n")
    loaded = JsonlSession(path).load()
    assert validate_transcript(loaded.messages) == []
    assert loaded.messages[0].text == "smile \U0001f600, half \ufffd"
    assert len(loaded.repairs) == 1 and "surrogate" in loaded.repairs[0]


def test_bytes_that_are_not_utf8_cost_only_themselves(tmp_path: Path) -> None:
    """A line holding a byte that is not UTF-8 (a file edited in Latin-1, a damaged sector) was
    skipped whole: a tool call lost that way took its result with it. The line is kept, each bad
    byte read as U+FFFD, with a warning."""
    path = tmp_path / "s.jsonl"
    with JsonlSession(path) as session:
        for i in range(3):  # a question, a tool call, its result
            session.append_message(make_message(i))
    data = path.read_bytes().replace(b"calling 1", b"caf\xe9 \xff 1")
    path.write_bytes(data)
    loaded = JsonlSession(path).load()
    assert [m.text for m in loaded.messages] == ["question 0 \u00e9\u4e2d", "caf\ufffd \ufffd 1", ""]
    assert loaded.messages[1].tool_uses == make_message(1).tool_uses and loaded.repairs == []
    assert loaded.messages[2] == make_message(2)
    assert [w.split(": ", 1)[1] for w in loaded.warnings] == ["line 2: replaced bytes that are not UTF-8 with U+FFFD"]


def test_a_message_from_a_newer_version_keeps_what_this_version_knows(tmp_path: Path) -> None:
    """A field or a block type this version does not know (a newer version wrote the file) costs
    only that field or block, with a warning each: the message used to be skipped whole, so an
    added optional field lost the entire transcript."""
    path = tmp_path / "s.jsonl"
    records = [
        {"role": "user", "content": [{"type": "text", "text": "hi", "cache_control": {"type": "ephemeral"}}], "id": "m1"},
        {"role": "assistant", "content": [{"type": "server_tool_use", "id": "s1"}, {"type": "tool_use", "id": "t1", "name": "grep"}]},
        {"role": "user", "content": [{"type": "tool_result", "tool_use_id": "t1", "content": [{"type": "text", "text": "r"}, {"type": "image"}]}]},
        {"role": "user", "content": "x", "partial": "not a bool", "extra": 1},  # still invalid: skipped
    ]
    path.write_text("".join(json.dumps({"type": "message", "message": r}) + "\n" for r in records), encoding="utf-8")
    loaded = JsonlSession(path).load()
    assert loaded.messages == [
        Message.user("hi"),
        Message(role="assistant", content=[ToolUseBlock(id="t1", name="grep")]),
        Message(role="user", content=[ToolResultBlock(tool_use_id="t1", content=[TextBlock(text="r")])]),
    ]
    assert loaded.repairs == []
    assert [w.split(": ", 1)[1] for w in loaded.warnings] == [
        "line 1: ignored unknown field(s) 'id' of a message",
        "line 1: ignored unknown field(s) 'cache_control' of a text block",
        "line 2: dropped a block of unknown type 'server_tool_use'",
        "line 3: dropped a block of unknown type 'image'",
        "skipped the torn last line (ValidationError: 2 validation errors for Message)",
    ]


def test_a_skipped_line_does_not_pass_its_notes_to_the_next_one(tmp_path: Path) -> None:
    """What a line that was skipped in the end would have lost was reported as news of the next
    line kept: a warning naming the wrong line, about a field it does not hold."""
    path = tmp_path / "s.jsonl"
    newer = {"role": "user", "content": [{"type": "text", "text": "hi"}], "id": "m1"}
    lines = [
        {"type": "checkpoint", "messages": [newer, {"role": "system", "content": []}]},
        {"type": "message", "message": Message.user("next").model_dump(mode="json")},
    ]
    path.write_bytes(b"".join(json.dumps(r).encode() + b"\n" for r in lines) + b'{"a": "\xff\n')
    loaded = JsonlSession(path).load()
    assert loaded.messages == [Message.user("next")]
    assert [w.split(": ", 1)[1] for w in loaded.warnings] == [
        "skipped corrupt line 1 (ValidationError: 1 validation error for Message)",
        "skipped the torn last line (JSONDecodeError: Unterminated string starting at: line 1 column 7 (char 6))",
    ]


def test_torn_tail_is_skipped_then_cut_before_the_next_append(tmp_path: Path) -> None:
    path = tmp_path / "s.jsonl"
    with JsonlSession(path) as session:
        session.append_message(Message.user("kept"))
    with path.open("ab") as f:
        f.write(b'{"type":"message","mess')
    loaded = JsonlSession(path).load()
    assert loaded.messages == [Message.user("kept")]
    assert len(loaded.warnings) == 1 and "the torn last line" in loaded.warnings[0]
    session, _ = JsonlSession.resume(path)
    session.append_message(Message.assistant("after the crash"))
    session.close()
    again = JsonlSession(path).load()
    assert again.warnings == []
    assert again.messages == [Message.user("kept"), Message.assistant("after the crash")]


def test_a_file_ending_without_a_newline_keeps_its_last_record(tmp_path: Path) -> None:
    """JSON Lines lets a file end without a newline (``"\\n".join(lines)``, a host that rewrote
    the file to redact it): its last record, whole, was skipped as torn on load, and the next
    append cut it off the file for good. It is kept, and ended with a newline before appending."""
    path = tmp_path / "s.jsonl"
    first = [make_message(i) for i in range(3)]
    lines = [json.dumps({"type": "message", "message": m.model_dump(mode="json")}) for m in first]
    path.write_text("\n".join(lines), encoding="utf-8")
    loaded = JsonlSession(path).load()
    assert loaded.messages == first and loaded.warnings == [] and loaded.repairs == []
    session, resumed = JsonlSession.resume(path)
    with session:
        session.append_message(Message.user("next"))
    assert resumed.messages == first
    assert path.read_text(encoding="utf-8").split("\n")[:3] == lines
    again = JsonlSession(path).load()
    assert again.messages == [*first, Message.user("next")] and again.warnings == []


def test_a_last_record_kept_with_bytes_that_are_not_utf8_is_not_cut_by_the_next_append(tmp_path: Path) -> None:
    """A file ending without a newline whose last record holds a byte that is not UTF-8 (edited
    in Latin-1): `load` kept that record (the byte read as U+FFFD), yet the next append cut it
    off as torn, so the file no longer replayed to the transcript the engine resumed from."""
    path = tmp_path / "s.jsonl"
    with JsonlSession(path) as session:
        session.append_message(Message.user("one"))
        session.append_message(Message.assistant("caf\u00e9"))
    path.write_bytes(path.read_bytes().rstrip(b"\n").replace("\u00e9".encode(), b"\xe9"))
    session, loaded = JsonlSession.resume(path)
    assert [m.text for m in loaded.messages] == ["one", "caf\ufffd"]
    with session:
        session.append_message(Message.user("two"))
    assert JsonlSession(path).load().messages == [*loaded.messages, Message.user("two")]


def test_an_integer_too_long_for_int_loads_back(tmp_path: Path) -> None:
    """A host's ``meta`` (or a tool input built by hand) holding an integer of more digits than
    ``int()`` converts by default (4300) was written, then skipped as corrupt on load: the
    message was lost to a resume."""
    path = tmp_path / "s.jsonl"
    big = 7 * 10**5000 + 1
    messages = [
        Message(role="user", content=[TextBlock(text="count")], meta={"n": big}),
        Message(role="assistant", content=[ToolUseBlock(id="t1", name="add", input={"a": -big})]),
        Message(role="user", content=[ToolResultBlock(tool_use_id="t1", content="ok")]),
    ]
    with JsonlSession(path) as session:
        for message in messages:
            session.append_message(message)
    loaded = JsonlSession(path).load()
    assert loaded.warnings == []
    assert loaded.messages == messages


def test_an_integer_too_long_for_int_is_written_by_every_record_type(tmp_path: Path) -> None:
    """Such an integer failed every record written with the json module: an event's (the
    append raised ValueError), and the checkpoint `resume()` writes after a repair, which
    escaped `resume()` with the file still locked by the session it never returned."""
    path = tmp_path / "s.jsonl"
    big = -7 * 10**5000 - 1
    with JsonlSession(path) as session:
        session.append_message(Message.user("count"))
        session.append_message(Message(role="assistant", content=[ToolUseBlock(id="t1", name="add", input={"a": big})]))
        session.append_event({"type": "note", "n": big, "x": math.nan})
    session, loaded = JsonlSession.resume(path)  # the dangling call is repaired: a checkpoint
    session.close()
    assert loaded.repairs != [] and loaded.warnings == []
    assert path.read_text(encoding="utf-8").splitlines()[-1].startswith('{"type":"checkpoint"')
    again = JsonlSession(path).load()
    assert again.repairs == [] and again.warnings == [] and again.messages == loaded.messages
    assert again.events == [{"type": "note", "n": big, "x": None}]


@pytest.mark.parametrize("has_pread", [True, False], ids=["pread", "no-pread"])
def test_torn_tail_cut_without_os_pread(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, has_pread: bool) -> None:
    """Windows has no ``os.pread``: the torn-tail check reads with a seek instead, and the
    append still lands at the end of the file (it is opened for appending)."""
    if not has_pread:
        monkeypatch.delattr(os, "pread", raising=False)
    path = tmp_path / "s.jsonl"
    with JsonlSession(path) as session:
        session.append_message(Message.user("kept"))
    with path.open("ab") as f:
        f.write(b'{"type":"message","mess')
    session, _ = JsonlSession.resume(path)
    with session:
        session.append_message(Message.assistant("after the crash"))
        session.append_message(Message.user("and again"))
    again = JsonlSession(path).load()
    assert again.warnings == []
    assert again.messages == [Message.user("kept"), Message.assistant("after the crash"), Message.user("and again")]


# -- fsync policy -----------------------------------------------------------------


def test_a_large_session_is_not_held_in_memory_twice_while_it_loads(tmp_path: Path) -> None:
    """Loading kept the whole file's bytes and every line split from them until the end, on top
    of the transcript it built: a peak of four times the file's size for a large session. The
    bytes go once split, and each line once read."""
    import tracemalloc

    path = tmp_path / "s.jsonl"
    with JsonlSession(path, fsync="never") as session:
        for i in range(3000):
            session.append_message(make_message(i))
    size = path.stat().st_size
    tracemalloc.start()
    try:
        loaded = JsonlSession(path).load()
        retained, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert len(loaded.messages) == 3000
    assert peak - retained < 1.3 * size, (peak - retained) / size  # the bytes, or the lines: not both


def _count_fsyncs(monkeypatch: pytest.MonkeyPatch, path: Path) -> dict[str, int]:
    counts = {"file": 0, "other": 0}
    real_fsync = os.fsync

    def fake_fsync(fd: int) -> None:
        same = path.exists() and os.fstat(fd).st_ino == path.stat().st_ino
        counts["file" if same else "other"] += 1
        real_fsync(fd)

    monkeypatch.setattr(os, "fsync", fake_fsync)
    return counts


@pytest.mark.parametrize(
    ("policy", "every", "after_appends", "after_flush", "after_close"),
    [
        ("always", None, 5, 5, 5),
        ("batch", None, 0, 1, 1),
        ("batch", 2, 2, 3, 3),
        ("never", None, 0, 0, 0),
    ],
)
def test_fsync_policy(
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    policy: Any,
    every: int | None,
    after_appends: int,
    after_flush: int,
    after_close: int,
) -> None:
    path = tmp_path / "s.jsonl"
    counts = _count_fsyncs(monkeypatch, path)
    session = JsonlSession(path, fsync=policy, fsync_every=every)
    for i in range(5):
        session.append_message(make_message(i))
    assert counts["file"] == after_appends
    session.flush()
    assert counts["file"] == after_flush
    session.close()
    assert counts["file"] == after_close
    assert counts["other"] == (0 if policy == "never" else 1)  # the new file's directory, once


def test_batch_close_syncs_unsynced_appends(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    path = tmp_path / "s.jsonl"
    counts = _count_fsyncs(monkeypatch, path)
    session = JsonlSession(path)
    session.append_message(Message.user("x"))
    session.close()
    session.close()
    assert counts["file"] == 1


@pytest.mark.parametrize("policy", ["always", "batch", "never"])
def test_a_new_file_and_the_directories_made_for_it_are_synced(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, policy: Any
) -> None:
    """A file is durable only once the entries naming it (and every directory made for it) are:
    ``close()`` of a batch session syncs them, an ``"always"`` append does at once."""
    synced: list[int] = []
    real_fsync = os.fsync

    def fake_fsync(fd: int) -> None:
        synced.append(os.fstat(fd).st_ino)
        real_fsync(fd)

    monkeypatch.setattr(os, "fsync", fake_fsync)
    path = tmp_path / "a" / "b" / "s.jsonl"
    session = JsonlSession(path, fsync=policy)
    session.append_message(Message.user("x"))
    chain = [path, path.parent, tmp_path / "a", tmp_path]
    if policy == "always":
        assert sorted(synced) == sorted(p.stat().st_ino for p in chain)
    session.close()
    expected = [] if policy == "never" else chain
    assert sorted(set(synced)) == sorted(p.stat().st_ino for p in expected)
    synced.clear()
    with JsonlSession(path, fsync=policy) as again:  # an existing file: only the file itself
        again.append_message(Message.user("y"))
    assert synced == ([] if policy == "never" else [path.stat().st_ino])


@pytest.mark.parametrize("policy", ["always", "batch", "never"])
def test_a_session_written_to_a_pipe_or_to_devnull_works_under_every_policy(policy: Any) -> None:
    """fsync refuses a pipe or a device with EINVAL: ``JsonlSession(os.devnull)`` (persistence
    off) failed at close, and a session piped to a viewer (``/dev/stdout | jq``) failed on every
    append with ``"always"``. Such a file has nothing to make durable: the sync is skipped."""
    read_end, write_end = os.pipe()
    try:
        piped = JsonlSession(f"/dev/fd/{write_end}", fsync=policy, fsync_every=1)
        discarded = JsonlSession(os.devnull, fsync=policy, fsync_every=1)
        for session in (piped, discarded):
            session.append_message(Message.user("hi"))
            session.append_event(TurnEnded(reason="completed"))
            session.flush()
            session.close()
        data = os.read(read_end, 65536)
    finally:
        os.close(read_end)
        os.close(write_end)
    records = [json.loads(line) for line in data.decode("utf-8").split("\n")[:-1]]
    assert [r["type"] for r in records] == ["message", "event"]
    assert Message.model_validate(records[0]["message"]) == Message.user("hi")


def test_sessions_writing_to_devnull_at_once_are_not_refused(tmp_path: Path) -> None:
    """``JsonlSession(os.devnull)`` is how a host turns persistence off, for every engine it
    makes: the writer's lock, taken on /dev/null too, refused all but the first. Only a regular
    file holds a transcript to protect; a device or a pipe is not locked."""
    sessions = [JsonlSession(os.devnull) for _ in range(3)]
    try:
        for session in sessions:
            session.acquire()
            session.append_message(Message.user("kept nowhere"))
    finally:
        for session in sessions:
            session.close()
    assert JsonlSession(os.devnull).load().messages == []  # kept nowhere indeed
    first, second = JsonlSession(tmp_path / "s.jsonl"), JsonlSession(tmp_path / "s.jsonl")
    try:  # the same on a regular file is refused
        first.acquire()
        with pytest.raises(agentloop.sessions.SessionLockedError):
            second.acquire()
    finally:
        first.close()
        second.close()


def test_a_failed_fsync_of_a_regular_file_is_still_raised(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    def fsync(fd: int) -> None:
        raise OSError(errno.EINVAL, "Invalid argument")

    session = JsonlSession(tmp_path / "s.jsonl", fsync="always")
    monkeypatch.setattr(os, "fsync", fsync)
    with pytest.raises(OSError, match="Invalid argument"):
        session.append_message(Message.user("hi"))
    monkeypatch.undo()
    session.close()


def test_bad_options_are_rejected(tmp_path: Path) -> None:
    with pytest.raises(ValueError):
        JsonlSession(tmp_path / "s.jsonl", fsync="sometimes")  # type: ignore[arg-type]
    with pytest.raises(ValueError):
        JsonlSession(tmp_path / "s.jsonl", fsync_every=0)


# -- crash safety with a real writer process ------------------------------------------

CHILD = (
    "from __future__ import annotations\n"
    + inspect.getsource(make_message)
    + '''
import os, sys
from agentloop.sessions import JsonlSession

path, mode, stall_at = sys.argv[1], sys.argv[2], int(sys.argv[3])
real_write = os.write
count = 0

def split_write(fd, data):
    """Write a line in two syscalls, so that a kill can land between them."""
    global count
    data = bytes(data)
    half = len(data) // 2
    written = real_write(fd, data[:half])
    if mode == "stall" and count == stall_at:
        print("mid-line", flush=True)
        sys.stdin.read()  # wait here, half a line written, until killed
    count += 1
    return written + real_write(fd, data[half:])

os.write = split_write
session = JsonlSession(path, fsync="always")
i = 0
while True:
    session.append_message(make_message(i))
    i += 1
    if i == 300:
        print("300 written", flush=True)  # and on it goes, flat out
'''
)


def _start_writer(path: Path, mode: str, stall_at: int = -1) -> subprocess.Popen[bytes]:
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(REPO), os.environ.get("PYTHONPATH", "")])}
    return subprocess.Popen(
        [sys.executable, "-c", CHILD, str(path), mode, str(stall_at)],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        env=env,
    )


def _kill(proc: subprocess.Popen[bytes]) -> None:
    if proc.poll() is None:
        os.kill(proc.pid, signal.SIGKILL)
    assert proc.wait(timeout=10) == -signal.SIGKILL
    assert proc.poll() is not None


def _check_recovered(path: Path) -> LoadedSession:
    data = path.read_bytes()
    committed = data.count(b"\n")
    torn = not data.endswith(b"\n")
    loaded = JsonlSession(path).load()
    assert len(loaded.warnings) == int(torn)
    assert loaded.messages[:committed] == [make_message(i) for i in range(committed)]
    assert len(loaded.messages) == committed + ((committed - 1) % 3 == 1)  # + a synthetic result
    assert len(loaded.repairs) == ((committed - 1) % 3 == 1)
    assert validate_transcript(loaded.messages) == []
    return loaded


def test_sigkill_mid_line_tears_only_the_last_line(tmp_path: Path) -> None:
    path = tmp_path / "s.jsonl"
    with _start_writer(path, "stall", stall_at=50) as proc:
        try:
            assert proc.stdout is not None
            assert proc.stdout.readline() == b"mid-line\n"  # the child is half-way through line 51
        finally:
            _kill(proc)
    assert path.read_bytes().count(b"\n") == 50
    loaded = _check_recovered(path)
    assert len(loaded.warnings) == 1 and len(loaded.repairs) == 1  # message 49 is a tool_use


def test_sigkill_while_writing_flat_out(tmp_path: Path) -> None:
    path = tmp_path / "s.jsonl"
    with _start_writer(path, "run") as proc:
        try:
            assert proc.stdout is not None
            assert proc.stdout.readline() == b"300 written\n"  # a blocking read: no polling
        finally:
            _kill(proc)
    _check_recovered(path)


def _session_bytes() -> tuple[bytes, list[int]]:
    """A session file of messages and events, and the offsets where each line ends."""
    with tempfile.TemporaryDirectory() as d:
        path = Path(d) / "s.jsonl"
        with JsonlSession(path, fsync="never") as session:
            for i in range(24):
                session.append_message(make_message(i))
                if i % 5 == 0:
                    session.append_event(TurnEnded(reason="completed", turns=i))
        data = path.read_bytes()
    ends = [i + 1 for i, b in enumerate(data) if b == ord("\n")]
    return data, ends


SESSION_BYTES, LINE_ENDS = _session_bytes()


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(cut=st.integers(min_value=0, max_value=len(SESSION_BYTES)))
def test_a_tear_at_any_byte_loses_only_the_torn_line(cut: int) -> None:
    with tempfile.TemporaryDirectory() as d:
        path = Path(d) / "s.jsonl"
        path.write_bytes(SESSION_BYTES[:cut])
        loaded = JsonlSession(path).load()
    complete = sum(end - 1 <= cut for end in LINE_ENDS)  # a whole record lacking only its newline counts
    torn = cut not in (0, *LINE_ENDS, *(end - 1 for end in LINE_ENDS))
    assert len(loaded.warnings) == int(torn)
    lines = SESSION_BYTES.split(b"\n")[:complete]
    prefix = b'{"type":"message","message":'
    expected = [Message.model_validate_json(ln[len(prefix) : -1]) for ln in lines if ln.startswith(prefix)]
    assert loaded.messages[: len(expected)] == expected
    assert validate_transcript(loaded.messages) == []
    assert len(loaded.events) == sum(line.startswith(b'{"type":"event"') for line in lines)


# -- IO failures --------------------------------------------------------------------


def _fail_next_write(monkeypatch: pytest.MonkeyPatch, *, truncate_fails: bool = False) -> None:
    """The next line is written in part, then the disk is full (ENOSPC); later writes succeed.
    With ``truncate_fails``, cutting the torn part off fails once too."""
    real_write, real_truncate = os.write, os.ftruncate
    state = {"writes": 0, "truncates": 0}

    def write(fd: int, data: Any) -> int:
        state["writes"] += 1
        if state["writes"] == 1:
            return real_write(fd, bytes(data)[: len(data) // 2])
        if state["writes"] == 2:
            raise OSError(errno.ENOSPC, "No space left on device")
        return real_write(fd, data)

    def ftruncate(fd: int, length: int) -> None:
        state["truncates"] += 1
        if truncate_fails and state["truncates"] == 1:
            raise OSError(errno.EIO, "Input/output error")
        real_truncate(fd, length)

    monkeypatch.setattr(os, "write", write)
    monkeypatch.setattr(os, "ftruncate", ftruncate)


@pytest.mark.parametrize("truncate_fails", [False, True])
def test_a_failed_write_never_costs_the_next_record(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, truncate_fails: bool
) -> None:
    """A write that fails part-way (disk full) leaves half a line; the next append must not be
    glued to it, or that record, reported as written, is lost on load as well."""
    path = tmp_path / "s.jsonl"
    with JsonlSession(path) as session:
        session.append_message(Message.user("one"))
        _fail_next_write(monkeypatch, truncate_fails=truncate_fails)
        with pytest.raises(OSError, match="No space left"):
            session.append_message(Message.user("two " * 50))
        session.append_message(Message.user("three"))
    loaded = JsonlSession(path).load()
    assert loaded.warnings == []
    assert loaded.messages == [Message.user("one"), Message.user("three")]


@pytest.mark.parametrize(("policy", "every"), [("always", None), ("batch", 2)])
@pytest.mark.parametrize("truncate_fails", [False, True])
@pytest.mark.parametrize("then", ["retry", "close"])
def test_an_append_whose_sync_fails_leaves_no_record_to_duplicate(
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    policy: Any,
    every: int | None,
    truncate_fails: bool,
    then: str,
) -> None:
    """An append whose fsync failed (EIO, a full disk on some file systems) raised OSError, yet
    its line stayed in the file: the engine listed the message as not recorded although the
    file held it, and a host that retried the append recorded the message twice."""
    path = tmp_path / "s.jsonl"
    real_fsync, real_truncate = os.fsync, os.ftruncate
    fail = {"fsync": False, "truncate": False}

    def fsync(fd: int) -> None:
        if fail["fsync"]:
            fail["fsync"] = False
            raise OSError(errno.EIO, "Input/output error")
        real_fsync(fd)

    def ftruncate(fd: int, length: int) -> None:
        if fail["truncate"]:
            fail["truncate"] = False
            raise OSError(errno.EIO, "Input/output error")
        real_truncate(fd, length)

    monkeypatch.setattr(os, "fsync", fsync)
    monkeypatch.setattr(os, "ftruncate", ftruncate)
    with JsonlSession(path, fsync=policy, fsync_every=every) as session:
        session.append_message(Message.user("one"))
        fail.update(fsync=True, truncate=truncate_fails)
        with pytest.raises(OSError, match="Input/output"):
            session.append_message(Message.user("two"))
        if then == "retry":  # the host tries again
            session.append_message(Message.user("two"))
            session.append_message(Message.user("three"))
    loaded = JsonlSession(path).load()
    expected = ["one", "two", "three"] if then == "retry" else ["one"]
    assert loaded.warnings == [] and [m.text for m in loaded.messages] == expected


async def test_a_record_the_store_fails_to_write_is_reported_on_the_engine(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A failed append (disk full) was only logged: the run went on and the host could not know
    its session file lacked a message. The run still goes on, and each lost record is listed in
    ``session_errors``: a subagent's too, on every engine above it."""
    real_write = os.write

    def write(fd: int, data: Any) -> int:
        if any(marker in bytes(data) for marker in (b"Looking.", b'"turn_ended"', b"the sub answer")):
            raise OSError(errno.ENOSPC, "No space left on device")
        return real_write(fd, data)

    model = ScriptedModel([
        ScriptedResponse(text="Looking.", tool_calls=[ScriptedToolCall("task", {"task": "look it up"})]),
        "the sub answer",
        "Done.",
    ])
    path = tmp_path / "s.jsonl"
    with JsonlSession(path) as session:
        engine = QueryEngine(model, tools=[agentloop.delegate_tool()], session=session, policies=[])
        monkeypatch.setattr(os, "write", write)
        events = [ev async for ev in engine.run("go")]
        monkeypatch.undo()
    ends = [e for e in events if isinstance(e, TurnEnded)]
    assert [(e.agent_id, e.reason) for e in ends] == [("sub-1", "completed"), (None, "completed")]
    assert engine.messages[-1].text == "Done."
    full = f"OSError: [Errno 28] No space left on device: '{path}'"
    sub = f"OSError: [Errno 28] No space left on device: '{tmp_path / 'subagents' / 's' / 'sub-1.jsonl'}'"
    # After a lost record, each message is written with the transcript before it (which holds
    # "Looking.", so here it fails again): the file replays to a whole, earlier transcript.
    assert engine.session_errors == [
        f"could not record a message (assistant): {full}",
        f"subagent 'sub-1': could not record a message (assistant): {sub}",
        f"subagent 'sub-1': could not record an event (turn_ended): {sub}",
        f"could not record a message (user), with the transcript before it: {full}",
        f"could not record a message (assistant), with the transcript before it: {full}",
        f"could not record an event (turn_ended): {full}",
    ]
    child = JsonlSession(tmp_path / "subagents" / "s" / "sub-1.jsonl").load()
    assert child.events == [] and [m.role for m in child.messages] == ["user"]
    loaded = JsonlSession(path).load()  # holds what the list says it lacks, and no more
    assert loaded.events == [] and [m.text for m in loaded.messages] == ["go"]


# -- a crash at any byte, resumed and continued ------------------------------------


@tool
async def echo(text: str) -> str:
    """Echo the text."""
    return text


async def _engine_session(path: Path) -> None:
    """What a real engine writes: parallel and serial tool calls, thinking, an interjection."""
    model = ScriptedModel(
        [
            ScriptedResponse(
                text="Looking.",
                thinking="Two reads.",
                tool_calls=[ScriptedToolCall("echo", {"text": "a"}), ScriptedToolCall("echo", {"text": "b"})],
            ),
            ScriptedResponse(tool_calls=[ScriptedToolCall("echo", {"text": "c"})]),
            "Done.",
        ]
    )
    with JsonlSession(path, fsync="never") as session:
        engine = QueryEngine(model, tools=[echo], session=session, policies=[])
        async for _ in engine.run("Start"):
            pass
        engine.interject("also this")
        async for _ in engine.run("Again"):
            pass


def _engine_bytes() -> bytes:
    with tempfile.TemporaryDirectory() as d:
        path = Path(d) / "s.jsonl"
        asyncio.run(_engine_session(path))
        return path.read_bytes()


ENGINE_BYTES = _engine_bytes()


async def _resume_and_continue(path: Path) -> QueryEngine:
    session, loaded = JsonlSession.resume(path)
    assert validate_transcript(loaded.messages) == []
    model = ScriptedModel([ScriptedResponse(tool_calls=[ScriptedToolCall("echo", {"text": "z"})]), "Fine."])
    with session:
        engine = QueryEngine(model, tools=[echo], messages=loaded.messages, session=session, policies=[])
        async for _ in engine.run("Continue"):
            pass
    return engine


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(cut=st.integers(min_value=0, max_value=len(ENGINE_BYTES)))
def test_a_crash_at_any_byte_resumes_continues_and_replays_exactly(cut: int) -> None:
    """Resume from a file cut at any byte, continue, resume again, continue: each time the file
    replays to exactly the engine's transcript, with nothing left to repair, and resuming a file
    that needs no repair writes nothing."""
    with tempfile.TemporaryDirectory() as d:
        path = Path(d) / "s.jsonl"
        path.write_bytes(ENGINE_BYTES[:cut])
        for _ in range(2):
            engine = asyncio.run(_resume_and_continue(path), debug=True)
            loaded = JsonlSession(path).load()
            assert loaded.repairs == [] and loaded.warnings == []
            assert loaded.messages == engine.messages
        before = path.read_bytes()
        JsonlSession.resume(path)[0].close()
        assert path.read_bytes() == before


async def test_two_session_objects_on_one_file_are_refused_with_an_error_that_names_the_file(tmp_path: Path) -> None:
    """Concurrent tasks of a batch worker, two of them with one task id: each engine had a
    `JsonlSession` of its own, on one path, and the second run was told to "give each engine its
    own" store, which it had. The error now says that the file is what is shared."""
    gate = asyncio.Event()

    @tool
    async def work() -> str:
        """Work."""
        await gate.wait()
        return "done"

    path = tmp_path / "task-3.jsonl"
    with JsonlSession(path) as one, JsonlSession(path) as other:
        first = QueryEngine(ScriptedModel([ScriptedResponse(tool_calls=[ScriptedToolCall("work")]), "A"]), tools=[work], session=one, policies=[])
        second = QueryEngine(ScriptedModel(["B"]), session=other, policies=[])
        async for ev in first.run("task A"):
            if ev.type == "tool_call_started":
                with pytest.raises(RuntimeError, match="session store") as refused:
                    await second.run("task B").__anext__()
                gate.set()
    said = str(refused.value)
    assert str(path) in said and "file of its own" in said and "one file" in said


async def test_a_store_a_running_engine_writes_is_refused_to_a_second_engine(tmp_path: Path) -> None:
    """Two engines running at once on one store interleaved their records: on resume, a tool's
    result landed after the other engine's messages, was turned into text, and its call got a
    synthetic "interrupted" result. The second run is refused before it writes anything."""
    gate = asyncio.Event()

    @tool
    async def work() -> str:
        """Work."""
        await gate.wait()
        return "done"

    path = tmp_path / "s.jsonl"
    with JsonlSession(path) as session:
        first = QueryEngine(
            ScriptedModel([ScriptedResponse(tool_calls=[ScriptedToolCall("work")]), "A done"]),
            tools=[work], session=session, policies=[],
        )
        second = QueryEngine(ScriptedModel(["B done"]), session=session, policies=[])
        second.follow_up("queued for B")
        run = first.run("task A")
        async for ev in run:
            if ev.type == "tool_call_started":
                with pytest.raises(RuntimeError, match="session store"):
                    await second.run("task B").__anext__()
                gate.set()
        assert second.messages == [] and len(second.inbox.follow_ups) == 1  # nothing taken or written
        async for _ in second.run():  # once the first run is over, the store is free again
            pass
    loaded = JsonlSession(path).load()
    assert loaded.repairs == [] and loaded.warnings == []
    assert [m.text for m in loaded.messages][-2:] == ["queued for B", "B done"]
    assert first.messages[-1].text == "A done" and first.session_errors == second.session_errors == []


def test_two_engines_starting_on_one_store_in_two_threads_do_not_both_run(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A server running each request's engine in its own thread (``asyncio.run`` per request),
    with the conversation's session shared: the check that the store is free and the claim of
    it were apart, so a run starting in another thread between them passed the check too, and
    both runs wrote to the file at once."""
    a_checked, b_tried = threading.Event(), threading.Event()
    outcome: dict[str, str] = {}
    real_vet = QueryEngine._vet_history

    with JsonlSession(tmp_path / "s.jsonl") as session:
        first = QueryEngine(ScriptedModel(["A done"]), session=session, policies=[])
        second = QueryEngine(ScriptedModel(["B done"]), session=session, policies=[])

        def vet(engine: QueryEngine) -> None:
            if engine is first:  # between the check and the run's start: let the other thread try
                a_checked.set()
                assert b_tried.wait(30)
            real_vet(engine)

        monkeypatch.setattr(QueryEngine, "_vet_history", vet)

        def run(engine: QueryEngine, prompt: str, name: str) -> None:
            try:
                asyncio.run(_drain(engine.run(prompt)), debug=True)
                outcome[name] = "ran"
            except RuntimeError as exc:
                outcome[name] = str(exc)

        def run_second() -> None:
            assert a_checked.wait(30)
            try:
                run(second, "task B", "B")
            finally:
                b_tried.set()

        threads = [threading.Thread(target=run, args=(first, "task A", "A")), threading.Thread(target=run_second)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
    assert outcome["A"] == "ran"
    assert "in use by another running engine" in outcome["B"] and second.messages == []
    assert [m.text for m in JsonlSession(tmp_path / "s.jsonl").load().messages] == ["task A", "A done"]


async def test_a_run_refused_as_it_starts_leaves_the_store_free(tmp_path: Path) -> None:
    with JsonlSession(tmp_path / "s.jsonl") as session:
        idle = QueryEngine(ScriptedModel(["never"]), session=session, policies=[])
        with pytest.raises(ValueError):  # nothing to run: no prompt, no history
            await idle.run().__anext__()
        other = QueryEngine(ScriptedModel(["ok"]), session=session, policies=[])
        async for _ in other.run("hi"):
            pass
    assert other.messages[-1].text == "ok" and other.session_errors == []


async def test_a_file_a_running_engine_writes_is_refused_through_another_session_object(tmp_path: Path) -> None:
    """A server that resumes the file for each request (a fresh JsonlSession each time) ran two
    requests on one conversation at once, and they interleaved their records in the file."""
    gate = asyncio.Event()

    @tool
    async def work() -> str:
        """Work."""
        await gate.wait()
        return "done"

    path = tmp_path / "conversations" / "c.jsonl"
    first_store, _ = JsonlSession.resume(path)
    second_store, _ = JsonlSession.resume(tmp_path / "conversations" / ".." / "conversations" / "c.jsonl")
    with first_store, second_store:
        first = QueryEngine(
            ScriptedModel([ScriptedResponse(tool_calls=[ScriptedToolCall("work")]), "A done"]),
            tools=[work], session=first_store, policies=[],
        )
        second = QueryEngine(ScriptedModel(["B done"]), session=second_store, policies=[])
        async for ev in first.run("task A"):
            if ev.type == "tool_call_started":
                with pytest.raises(RuntimeError, match="session store"):
                    await second.run("task B").__anext__()
                gate.set()
    loaded = JsonlSession(path).load()
    assert loaded.repairs == [] and loaded.messages == first.messages


# -- one writer per file, across processes --------------------------------------------

HOLDER = '''
import sys
from agentloop import Message
from agentloop.sessions import JsonlSession

session = JsonlSession(sys.argv[1])
session.append_message(Message.user("held"))
with open(sys.argv[1], "ab") as f:  # the holder is half-way through its next line
    f.write(b'{"type":"message","mess')
print("holding", flush=True)
if sys.stdin.readline() == "close\\n":
    session.close()
    print("closed", flush=True)
    sys.stdin.readline()
'''


async def _first_event(run: Any) -> Any:
    return await run.__anext__()


async def _drain(run: Any) -> None:
    async for _ in run:
        pass


@pytest.mark.parametrize("end", ["close", "sigkill"])
def test_a_second_process_is_refused_the_file_until_the_first_closes_it_or_dies(
    tmp_path: Path, end: str
) -> None:
    """A restarted worker (or a second terminal) opened a session another process still wrote:
    both appended, their records interleaved, and the file replayed to neither transcript. The
    second writer is refused, naming the file and the holder; readers are not; the lock goes
    with the holder's close, or with the holder itself when it dies."""
    from agentloop.sessions import SessionLockedError

    path = tmp_path / "s.jsonl"
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(REPO), os.environ.get("PYTHONPATH", "")])}
    with subprocess.Popen(
        [sys.executable, "-c", HOLDER, str(path)], stdin=subprocess.PIPE, stdout=subprocess.PIPE, env=env
    ) as holder:
        try:
            assert holder.stdout is not None and holder.stdin is not None
            assert holder.stdout.readline() == b"holding\n"
            before = path.read_bytes()

            with pytest.raises(SessionLockedError) as refused:
                JsonlSession(path).append_message(Message.user("second writer"))
            assert refused.value.pid == holder.pid and refused.value.path == str(path)
            assert str(path) in str(refused.value) and f"pid {holder.pid}" in str(refused.value)
            assert isinstance(refused.value, OSError)  # what a host catching IO errors expects
            with pytest.raises(SessionLockedError, match=f"pid {holder.pid}"):
                JsonlSession.resume(path)
            engine = QueryEngine(ScriptedModel(["never sent"]), session=JsonlSession(path), policies=[])
            with pytest.raises(SessionLockedError):  # refused before it takes or sends anything
                asyncio.run(_first_event(engine.run("second worker")), debug=True)
            assert engine.messages == [] and engine.session_errors == []
            assert path.read_bytes() == before  # the holder's half line was not cut under it

            loaded = JsonlSession(path).load()  # reading is never refused
            assert [m.text for m in loaded.messages] == ["held"] and len(loaded.warnings) == 1

            if end == "close":
                holder.stdin.write(b"close\n")
                holder.stdin.flush()
                assert holder.stdout.readline() == b"closed\n"
            else:
                _kill(holder)
            session, loaded = JsonlSession.resume(path)
            with session:
                engine = QueryEngine(ScriptedModel(["taken over"]), messages=loaded.messages, session=session)
                asyncio.run(_drain(engine.run("second worker")), debug=True)
        finally:
            holder.stdin.close()  # type: ignore[union-attr]
            if holder.poll() is None:
                _kill(holder)
    loaded = JsonlSession(path).load()
    assert [m.text for m in loaded.messages] == ["held", "second worker", "taken over"]
    assert loaded.repairs == []


def test_a_second_session_object_is_refused_an_open_file_until_the_first_lets_go(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Two session objects of one process appending to one file interleave as two processes
    do: the second is refused while the first holds the file open, and takes it once the
    first releases, closes or drops it."""
    from agentloop.sessions import SessionLockedError

    path = tmp_path / "s.jsonl"
    first, second = JsonlSession(path), JsonlSession(path)
    first.append_message(Message.user("one"))
    with pytest.raises(SessionLockedError, match="another session object of this process") as refused:
        second.append_message(Message.user("two"))
    assert refused.value.pid == os.getpid()
    first.release()
    second.append_message(Message.user("two"))
    with pytest.raises(SessionLockedError):
        first.acquire()
    second.close()
    first.acquire()
    first.append_message(Message.user("three"))
    with pytest.warns(ResourceWarning):
        del first
        gc.collect()

    def unreadable(self: Path) -> bytes:
        raise OSError(errno.EIO, "Input/output error")

    monkeypatch.setattr(Path, "read_bytes", unreadable)
    with pytest.raises(OSError, match="Input/output"):  # a resume that fails lets go of the file
        JsonlSession.resume(path)
    monkeypatch.undo()
    with JsonlSession(path) as third:
        third.append_message(Message.user("four"))
    assert [m.text for m in JsonlSession(path).load().messages] == ["one", "two", "three", "four"]


def test_a_file_system_that_cannot_lock_is_written_unlocked_with_a_warning(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, caplog: Any
) -> None:
    import fcntl

    def no_locks(fd: int, operation: int) -> None:
        raise OSError(errno.ENOLCK, "No locks available")

    monkeypatch.setattr(fcntl, "flock", no_locks)
    path = tmp_path / "s.jsonl"
    with caplog.at_level(logging.WARNING, logger="agentloop"), JsonlSession(path) as session:
        session.append_message(Message.user("kept"))
    assert [m.text for m in JsonlSession(path).load().messages] == ["kept"]
    assert "not locked against other writers" in caplog.text and "No locks available" in caplog.text


@pytest.mark.parametrize("umask", [0o000, 0o022, 0o077])
def test_session_files_are_0600_and_the_directories_made_for_them_0700(tmp_path: Path, umask: int) -> None:
    """Transcripts may hold secrets: only their owner may read them, whatever the umask."""
    path = tmp_path / "new" / "deeper" / "s.jsonl"
    old = os.umask(umask)
    try:
        with JsonlSession(path) as session:
            session.append_message(make_message(0))
            session.sidechain("sub-1").append_message(make_message(1))
    finally:
        os.umask(old)

    def mode(p: Path) -> int:
        return p.stat().st_mode & 0o777

    assert mode(path) == 0o600
    deeper = tmp_path / "new" / "deeper"
    assert mode(deeper / "subagents" / "s" / "sub-1.jsonl") == 0o600
    for directory in (tmp_path / "new", deeper, deeper / "subagents", deeper / "subagents" / "s"):
        assert mode(directory) == 0o700, directory


# -- a session the host never closes ------------------------------------------------


def _fds_on(path: Path) -> int:
    count = 0
    for fd in Path("/proc/self/fd").iterdir():
        try:
            count += Path(os.readlink(fd)) == path
        except OSError:  # closed meanwhile (the directory's own fd)
            pass
    return count


def test_a_session_collected_while_its_file_is_open_closes_it_with_a_resource_warning(tmp_path: Path) -> None:
    path = tmp_path / "s.jsonl"
    session = JsonlSession(path)
    session.append_message(Message.user("hi"))
    assert _fds_on(path) == 1
    with pytest.warns(ResourceWarning, match=r"unclosed session file .*s\.jsonl"):
        del session
        gc.collect()
    assert _fds_on(path) == 0
    assert [m.text for m in JsonlSession(path).load().messages] == ["hi"]  # nothing lost


def test_a_sidechain_collected_with_its_session_closes_its_file_too(tmp_path: Path) -> None:
    session = JsonlSession(tmp_path / "main.jsonl")
    side = session.sidechain("sub-1")
    side.append_message(Message.user("child"))
    side_path = side.path
    del side
    with pytest.warns(ResourceWarning) as caught:
        del session
        gc.collect()
    assert [str(w.message).count("sub-1.jsonl") for w in caught] == [1]  # the main file was never opened
    assert _fds_on(side_path) == 0


def test_a_session_shared_between_threads_is_closed_once_when_collected(tmp_path: Path) -> None:
    path = tmp_path / "s.jsonl"
    session = JsonlSession(path)
    start = threading.Barrier(4)

    def writer(shared: JsonlSession, n: int) -> None:
        start.wait()
        for i in range(50):
            shared.append_event({"type": "note", "thread": n, "i": i})

    threads = [threading.Thread(target=writer, args=(session, n)) for n in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    del threads  # each held the session in its args
    with pytest.warns(ResourceWarning) as caught:
        del session
        gc.collect()
    assert len(caught) == 1
    assert _fds_on(path) == 0
    assert len(JsonlSession(path).load().events) == 200


def test_a_session_that_holds_no_open_file_is_collected_without_a_warning(tmp_path: Path) -> None:
    # The suite runs with -W error: a warning here fails the test.
    closed = JsonlSession(tmp_path / "a.jsonl")
    closed.append_message(Message.user("a"))
    closed.close()
    released = JsonlSession(tmp_path / "b.jsonl")
    released.append_message(Message.user("b"))
    released.release()
    never_written = JsonlSession(tmp_path / "c.jsonl")
    del closed, released, never_written
    gc.collect()
    assert _fds_on(tmp_path / "a.jsonl") == _fds_on(tmp_path / "b.jsonl") == 0


@given(ops=st.lists(st.sampled_from(["append", "release", "flush", "close", "sidechain"]), max_size=8))
@settings(max_examples=40)
def test_a_dropped_session_warns_exactly_when_it_held_open_files_and_leaves_none(ops: list[str]) -> None:
    gc.freeze()  # what the test process holds already: the collection below need not walk it
    try:
        _drop_a_session(ops)
    finally:
        gc.unfreeze()


def _drop_a_session(ops: list[str]) -> None:
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "s.jsonl"
        session = JsonlSession(path)
        closed = False
        for op in ops:
            if op == "append" and not closed:
                session.append_message(Message.user("x"))
            elif op == "sidechain" and not closed:
                session.sidechain("sub").append_message(Message.user("y"))
            elif op == "release":
                session.release()
            elif op == "flush":
                session.flush()
            elif op == "close":
                session.close()
                closed = True
        side = Path(tmp) / "subagents" / "s" / "sub.jsonl"
        holding = _fds_on(path) + _fds_on(side)
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            del session
            gc.collect()
        assert len([w for w in caught if issubclass(w.category, ResourceWarning)]) == holding
        assert _fds_on(path) == _fds_on(side) == 0



def test_tool_call_records_carry_the_input_that_ran_and_older_ones_load_with_it(tmp_path: Path) -> None:
    """A ToolCallStarted/ToolCallFinished record holds ``input`` (the input the call ran with);
    a record an older version wrote without it loads with it filled in from ``updated_input``,
    else the model's ``tool_use.input``, so a reader sees one shape."""
    from agentloop._events import ToolCallFinished, ToolCallStarted
    from agentloop._messages import tool_result_block, tool_use_block

    path = tmp_path / "s.jsonl"
    call = tool_use_block("toolu_1", "read", {"path": "../etc/passwd"})
    with JsonlSession(path) as session:
        session.append_event(ToolCallStarted(tool_use=call, updated_input={"path": "docs/a.md"}))
        session.append_event(ToolCallFinished(tool_use=call, result=tool_result_block("toolu_1", "ok")))
    written = [json.loads(line)["event"] for line in path.read_text(encoding="utf-8").splitlines()]
    assert [e["input"] for e in written] == [{"path": "docs/a.md"}, {"path": "../etc/passwd"}]

    older = tmp_path / "old.jsonl"
    records = []
    for event in written:
        event = dict(event)
        del event["input"]
        records.append(json.dumps({"type": "event", "event": event}))
    odd = {"type": "tool_call_started", "tool_use": "not a block", "updated_input": None}
    records.append(json.dumps({"type": "event", "event": odd}))
    older.write_text("\n".join(records) + "\n", encoding="utf-8")
    loaded = JsonlSession(older).load()
    assert [e.get("input") for e in loaded.events] == [{"path": "docs/a.md"}, {"path": "../etc/passwd"}, None]
    assert loaded.events[2] == odd and loaded.warnings == []


def test_a_path_starting_with_a_tilde_is_taken_from_the_home_directory(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """``JsonlSession("~/x.jsonl")`` made a folder named ``~`` in the working directory, and
    the transcript went there rather than to the home directory the user meant."""
    home, cwd = tmp_path / "home", tmp_path / "cwd"
    home.mkdir()
    cwd.mkdir()
    monkeypatch.setenv("HOME", str(home))
    monkeypatch.chdir(cwd)
    with JsonlSession("~/sessions/x.jsonl", sidechain_dir="~/side") as session:
        assert session.path == home / "sessions" / "x.jsonl"
        assert session.sidechain_dir == home / "side"
        session.append_message(Message.user("hi"))
        session.sidechain("helper").append_message(Message.user("child"))
    assert not (cwd / "~").exists()
    assert [m.text for m in JsonlSession(home / "sessions" / "x.jsonl").load().messages] == ["hi"]
    assert (home / "side" / "helper.jsonl").is_file()
    resumed, loaded = JsonlSession.resume("~/sessions/x.jsonl")
    with resumed:
        assert resumed.path == home / "sessions" / "x.jsonl" and [m.text for m in loaded.messages] == ["hi"]
    with pytest.raises(ValueError, match="home directory"):
        JsonlSession("~no-such-user-agentloop/x.jsonl")


async def test_a_resumed_file_that_loads_no_messages_gives_no_warning_of_a_lost_conversation(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """A crash tore the very first line of a file: it resumes to no messages, and the engine
    given them (none) warned that it "was given none of" a conversation the file does not hold."""
    path = tmp_path / "s.jsonl"
    path.write_bytes(b'{"type":"message","mess')
    session, loaded = JsonlSession.resume(path)
    assert loaded.messages == [] and loaded.warnings
    with session, caplog.at_level(logging.WARNING, logger="agentloop"):
        engine = QueryEngine(ScriptedModel(["Hello."]), session=session, messages=loaded.messages, policies=[])
        async for _ in engine.run("Hi"):
            pass
    assert not [r for r in caplog.records if "holds a conversation already" in r.getMessage()]
    assert JsonlSession(path).load().messages == engine.messages and engine.session_errors == []

    # A file of events only, or rewound to no messages, holds no conversation either.
    for records in ([{"type": "event", "event": {"type": "turn_ended"}}], [{"type": "checkpoint", "messages": []}]):
        other = tmp_path / f"{records[0]['type']}.jsonl"
        other.write_text("".join(json.dumps(r) + "\n" for r in records), encoding="utf-8")
        with JsonlSession(other) as session, caplog.at_level(logging.WARNING, logger="agentloop"):
            QueryEngine(ScriptedModel(["x"]), session=session, policies=[])
        assert not [r for r in caplog.records if "holds a conversation already" in r.getMessage()]


async def test_sessions_of_one_directory_keep_their_subagents_files_apart(tmp_path: Path) -> None:
    """Every session of a directory wrote its subagents' files into the one ``subagents/``
    folder: a conversation and its fork (or any two conversations there) each running a child
    ``agent_id="helper"`` wrote into one file, the second child's checkpoint taking over the
    first's, and two at once refused with `SessionLockedError`. Each session now has a folder of
    its own in ``subagents/``, named after its file."""
    with JsonlSession(tmp_path / "main.jsonl") as main:
        engine = QueryEngine(ScriptedModel(["Use a dict."]), session=main, policies=[])
        async for _ in engine.run("How do I count words?"):
            pass
    loaded = JsonlSession(tmp_path / "main.jsonl").load()
    with JsonlSession(tmp_path / "main.jsonl") as main, JsonlSession(tmp_path / "fork.jsonl") as fork:
        assert main.sidechain_dir == tmp_path / "subagents" / "main"
        assert fork.sidechain("helper").path == tmp_path / "subagents" / "fork" / "helper.jsonl"
        main.sidechain("helper").acquire()  # the main conversation's child is running
        fork.sidechain("helper").acquire()  # and the fork's starts meanwhile
        children = []
        for session, text in ((main, "main"), (fork, "fork")):
            parent = QueryEngine(ScriptedModel([f"{text} child answer"]), session=session, messages=loaded.messages, policies=[])
            child = parent.subagent(agent_id="helper")
            async for _ in child.run(f"{text} child task"):
                pass
            assert child.session_errors == [] and parent.session_errors == []
            children.append(child)
    for name, child in zip(("main", "fork"), children, strict=True):
        side = JsonlSession(tmp_path / "subagents" / name / "helper.jsonl").load()
        assert side.messages == child.messages
        assert [m.text for m in side.messages] == [f"{name} child task", f"{name} child answer"]
    assert not (tmp_path / "subagents" / "helper.jsonl").exists()


async def test_a_session_written_with_the_shared_subagents_folder_still_resumes(tmp_path: Path) -> None:
    """A session an earlier version wrote keeps its subagents' files in ``subagents/`` itself:
    it resumes as it is (its subagents' new files go to its own folder, the old ones are left as
    they are), and with ``sidechain_dir`` naming the old folder, its children continue there."""
    old_side = tmp_path / "subagents" / "helper.jsonl"
    with JsonlSession(tmp_path / "old.jsonl", sidechain_dir=tmp_path / "subagents") as old:
        engine = QueryEngine(ScriptedModel(["old child answer", "old answer"]), session=old, policies=[])
        child = engine.subagent(agent_id="helper")
        async for _ in child.run("old child task"):
            pass
        async for _ in engine.run("old task"):
            pass
    before = old_side.read_bytes()
    session, loaded = JsonlSession.resume(tmp_path / "old.jsonl")
    with session:
        assert [m.text for m in loaded.messages] == ["old task", "old answer"] and loaded.warnings == []
        engine = QueryEngine(ScriptedModel(["new child answer"]), session=session, messages=loaded.messages, policies=[])
        child = engine.subagent(agent_id="helper")
        async for _ in child.run("new child task"):
            pass
    assert old_side.read_bytes() == before
    assert JsonlSession(tmp_path / "subagents" / "old" / "helper.jsonl").load().messages == child.messages
    session, loaded = JsonlSession.resume(tmp_path / "old.jsonl", sidechain_dir=tmp_path / "subagents")
    with session:
        engine = QueryEngine(ScriptedModel(["again"]), session=session, messages=loaded.messages, policies=[])
        earlier = JsonlSession(old_side).load().messages
        child = engine.subagent(agent_id="helper", messages=earlier)
        async for _ in child.run("continue"):
            pass
    assert [m.text for m in JsonlSession(old_side).load().messages] == ["old child task", "old child answer", "continue", "again"]
