"""Promises of docs/sessions.md that no other test pins."""

from __future__ import annotations

import asyncio
import errno
import tempfile
import threading
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from agentloop import (
    Event,
    Message,
    QueryEngine,
    ScriptedModel,
    ScriptedResponse,
    ScriptedToolCall,
    TurnEnded,
    delegate_tool,
    validate_transcript,
)
from agentloop.sessions import JsonlSession, SessionLockedError
from agentloop.testing import collect


class _Store:
    """A store of the protocol's methods, an ``acquire()`` that raises ``refusal`` (if set), and
    ``append_message`` failing at the appends numbered in ``failing``."""

    def __init__(self, refusal: Exception | None = None, failing: tuple[int, ...] = ()) -> None:
        self.refusal = refusal
        self.failing = failing
        self.appends = 0
        self.records: list[Message | Event] = []

    def acquire(self) -> None:
        if self.refusal is not None:
            raise self.refusal

    def append_message(self, message: Message) -> None:
        self.appends += 1
        if self.appends in self.failing:
            raise OSError(errno.ENOSPC, "No space left on device")
        self.records.append(message)

    def append_event(self, event: Event) -> None:
        self.records.append(event)

    def sidechain(self, agent_id: str) -> _Store:
        return _Store()

    def close(self) -> None:
        pass


# -- Sessions: the SessionStore protocol ----------------------------------------------------------


async def test_a_store_whose_acquire_raises_session_locked_refuses_the_run_before_anything() -> None:
    """sessions.md: ``acquire()`` is optional; one that raises `SessionLockedError` refuses the
    run (on its first iteration, before it writes or sends anything), and the store is free for
    the next run once the other writer is gone."""
    store = _Store(refusal=SessionLockedError("/srv/sessions/a.jsonl", 4242))
    model = ScriptedModel(["Hello."])
    engine = QueryEngine(model, session=store, policies=[])
    with pytest.raises(SessionLockedError, match=r"pid 4242") as refused:
        await collect(engine.run("Hi"))
    assert isinstance(refused.value, OSError) and refused.value.path == "/srv/sessions/a.jsonl"
    assert store.records == [] and engine.messages == [] and model.requests == []
    assert not engine.running and engine.session_errors == []
    store.refusal = None
    await collect(engine.run("Hi"))
    assert [r.text for r in store.records if isinstance(r, Message)] == ["Hi", "Hello."]


async def test_any_other_error_of_acquire_is_left_for_the_appends_to_report() -> None:
    """sessions.md: any error ``acquire()`` raises other than `SessionLockedError` does not stop
    the run; the appends report what fails (here none does, so nothing is listed)."""
    store = _Store(refusal=PermissionError(errno.EACCES, "Permission denied"))
    engine = QueryEngine(ScriptedModel(["Hello."]), session=store, policies=[])
    events = await collect(engine.run("Hi"))
    assert isinstance(events[-1], TurnEnded) and events[-1].reason == "completed"
    assert [r.text for r in store.records if isinstance(r, Message)] == ["Hi", "Hello."]
    assert isinstance(store.records[-1], TurnEnded) and engine.session_errors == []


# -- When an append fails -------------------------------------------------------------------------


async def test_a_store_without_append_checkpoint_keeps_its_lost_record_listed_and_is_not_mended() -> None:
    """sessions.md, When an append fails: the mend is a checkpoint, for a store that has
    ``append_checkpoint``. One without it gets the later records appended as they come, and its
    ``session_errors`` line is the lasting record of what it lacks (no run mends it)."""
    store = _Store(failing=(2,))  # the first reply is lost
    engine = QueryEngine(ScriptedModel(["one", "two"]), session=store, policies=[])
    await collect(engine.run("first"))
    await collect(engine.run("second"))
    assert [m.text for m in engine.messages] == ["first", "one", "second", "two"]
    assert [r.text for r in store.records if isinstance(r, Message)] == ["first", "second", "two"]
    assert engine.session_errors == [
        "could not record a message (assistant): OSError: [Errno 28] No space left on device"
    ]


# -- Crash safety / What is not protected ---------------------------------------------------------


def test_a_utf8_byte_order_mark_and_crlf_line_ends_load_as_if_absent(tmp_path: Path) -> None:
    """sessions.md, What is not protected: a byte order mark on UTF-8 and ``\\r\\n`` line ends
    (a file saved by a Windows editor) load as if absent, with nothing skipped or repaired, and
    the file resumes and goes on."""
    path = tmp_path / "s.jsonl"
    with JsonlSession(path) as session:
        session.append_message(Message.user("Hi"))
        session.append_message(Message(role="assistant", content="Hello."))
    path.write_bytes(b"\xef\xbb\xbf" + path.read_bytes().replace(b"\n", b"\r\n"))
    loaded = JsonlSession(path).load()
    assert [m.text for m in loaded.messages] == ["Hi", "Hello."]
    assert (loaded.warnings, loaded.repairs) == ([], [])
    session, loaded = JsonlSession.resume(path)
    with session:
        engine = QueryEngine(ScriptedModel(["Again."]), session=session, messages=loaded.messages, policies=[])
        asyncio.run(collect(engine.run("More")))
    again = JsonlSession(path).load()
    assert again.messages == engine.messages and (again.warnings, again.repairs) == ([], [])


# -- Why writes are synchronous -------------------------------------------------------------------


def test_a_session_shared_by_threads_appending_at_once_keeps_every_record_whole() -> None:
    """sessions.md, Why writes are synchronous: appends are serialised by a lock, so a session
    may be shared by threads: no line is torn or lost, and each thread's records keep its order."""
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "s.jsonl"
        start = threading.Barrier(4)
        with JsonlSession(path) as session:

            def writer(n: int) -> None:
                start.wait()
                for i in range(150):
                    session.append_message(Message.user(f"{n}:{i}:" + "x" * 3000))

            threads = [threading.Thread(target=writer, args=(n,)) for n in range(4)]
            for thread in threads:
                thread.start()
            for thread in threads:
                thread.join()
        loaded = JsonlSession(path).load()
    assert loaded.warnings == [] and len(loaded.messages) == 600
    for n in range(4):
        mine = [int(m.text.split(":")[1]) for m in loaded.messages if m.text.startswith(f"{n}:")]
        assert mine == list(range(150))


# -- Subagents: sidechain files -------------------------------------------------------------------


@settings(max_examples=200, deadline=None)
@given(agent_id=st.text(min_size=0, max_size=12))
def test_property_a_sidechain_is_a_file_of_the_sessions_folder_or_a_value_error(agent_id: str) -> None:
    """sessions.md, Subagents: ``sidechain(agent_id)`` is ``<dir>/subagents/<name>/<agent_id>.jsonl``,
    the same object for the same id, and an id that is not a plain file name raises ValueError:
    no id reaches another folder. Asking for one creates nothing (the first append does)."""
    with tempfile.TemporaryDirectory() as tmp:
        session = JsonlSession(Path(tmp) / "main.jsonl")
        try:
            side = session.sidechain(agent_id)
        except ValueError as exc:
            assert "cannot be used as a file name" in str(exc)
            assert agent_id in ("", ".", "..") or any(c in agent_id for c in "/\\\0")
        else:
            assert side.path == Path(tmp) / "subagents" / "main" / f"{agent_id}.jsonl"
            assert side is session.sidechain(agent_id)
        finally:
            session.close()
        assert list(Path(tmp).iterdir()) == []


async def test_a_grandchilds_lost_record_is_listed_on_every_engine_above_it_with_its_id(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """sessions.md, When an append fails: a subagent's failure is listed on its own engine and on
    every engine above it, prefixed with its id (a nested subagent's own, not its parent's); the
    nested subagent's file is in the main session's folder."""
    real_append = JsonlSession.append_message

    def append(self: JsonlSession, message: Message) -> None:
        if self.path.name == "sub-2.jsonl" and message.role == "assistant":
            raise OSError(errno.ENOSPC, "No space left on device")
        real_append(self, message)

    model = ScriptedModel([calls_task("outer"), calls_task("inner"), "inner done", "child done", "main done"])
    with JsonlSession(tmp_path / "m.jsonl") as session:
        engine = QueryEngine(model, tools=[delegate_tool()], session=session, policies=[])
        monkeypatch.setattr(JsonlSession, "append_message", append)
        await collect(engine.run("go"))
        monkeypatch.undo()
    side = tmp_path / "subagents" / "m" / "sub-2.jsonl"
    assert engine.messages[-1].text == "main done"
    assert engine.session_errors == [
        "subagent 'sub-2': could not record a message (assistant): OSError: [Errno 28] No space left on device"
    ]
    grandchild = JsonlSession(side).load()
    assert [m.role for m in grandchild.messages] == ["user"] and validate_transcript(grandchild.messages) == []


def calls_task(task: str) -> ScriptedResponse:
    return ScriptedResponse(tool_calls=[ScriptedToolCall("task", {"task": task})])


# -- When the host edits the transcript -----------------------------------------------------------


def _given() -> list[Message]:
    return [Message.user("How do I count words?"), Message(role="assistant", content="Use a dict.")]


async def test_messages_given_over_a_file_holding_only_a_torn_line_are_written_as_a_checkpoint(tmp_path: Path) -> None:
    """sessions.md, When the host edits the transcript: ``messages=`` are written as a checkpoint
    when the file holds no records yet. A file whose only line was torn by a crash (its first
    append cut short) holds none: the given messages were left out, and the file replayed to
    the new run's messages alone."""
    path = tmp_path / "s.jsonl"
    path.write_text('{"type":"message","mess', encoding="utf-8")
    with JsonlSession(path) as session:
        engine = QueryEngine(ScriptedModel(["Or collections.Counter."]), session=session, messages=_given())
        await collect(engine.run("Shorter?"))
    loaded = JsonlSession(path).load()
    assert loaded.messages == engine.messages and len(loaded.messages) == 4
    assert (loaded.warnings, loaded.repairs, engine.session_errors) == ([], [], [])


async def test_a_file_removed_between_runs_gets_the_whole_transcript_again(tmp_path: Path) -> None:
    """sessions.md: the file replays to the transcript each run starts from. A file removed
    while the session let it go between runs (``release()``, a clean-up job) is made again by
    the next run, which wrote its own messages only: the file replayed to half a conversation."""
    path = tmp_path / "s.jsonl"
    with JsonlSession(path) as session:
        engine = QueryEngine(ScriptedModel(["Use a dict.", "Or collections.Counter."]), session=session)
        await collect(engine.run("How do I count words?"))
        session.release()
        path.unlink()
        await collect(engine.run("Shorter?"))
    loaded = JsonlSession(path).load()
    assert loaded.messages == engine.messages and len(loaded.messages) == 4
    assert (loaded.repairs, engine.session_errors) == ([], [])


def test_the_fsync_policy_defaults_to_batch_without_a_count(tmp_path: Path) -> None:
    """sessions.md, fsync policy: ``"batch"`` is the default, syncing every ``fsync_every``
    appends only if set; `resume` takes the same options."""
    session = JsonlSession(tmp_path / "s.jsonl")
    assert (session.fsync, session.fsync_every) == ("batch", None)
    resumed, _ = JsonlSession.resume(tmp_path / "s.jsonl", fsync="always", fsync_every=None)
    with resumed:
        assert resumed.fsync == "always"
    assert not (tmp_path / "s.jsonl").exists()  # a missing file resumes as an empty session, made by no one


async def test_engines_taking_turns_on_one_store_continue_one_transcript(tmp_path: Path) -> None:
    """sessions.md: engines may take turns on one store: a later engine that starts from the
    transcript the file holds (``messages=`` the last engine's) continues it, no checkpoint
    needed, and the file replays to the last engine's transcript."""
    path = tmp_path / "s.jsonl"
    with JsonlSession(path) as session:
        first = QueryEngine(ScriptedModel(["Use a dict."]), session=session, policies=[])
        await collect(first.run("How do I count words?"))
        second = QueryEngine(
            ScriptedModel(["Or collections.Counter."]), session=session, messages=first.messages, policies=[]
        )
        await collect(second.run("Shorter?"))
    loaded = JsonlSession(path).load()
    assert loaded.messages == second.messages and len(loaded.messages) == 4
    assert b'"type":"checkpoint"' not in path.read_bytes()
    assert (first.session_errors, second.session_errors, loaded.repairs) == ([], [], [])
