"""JsonlSession when the disk, other processes and users misbehave: a full or read-only disk,
the file deleted or replaced under a writer, damaged files read back."""

from __future__ import annotations

import contextlib
import errno
import json
import os
import threading
from pathlib import Path
from typing import Any

import pytest

from agentloop import (
    Message,
    QueryEngine,
    ScriptedModel,
    ScriptedResponse,
    ScriptedToolCall,
    ToolResultBlock,
    tool,
)
from agentloop.sessions import JsonlSession


def _fail_writes_while(monkeypatch: pytest.MonkeyPatch, full: dict[str, bool], code: int = errno.ENOSPC) -> None:
    """Every write fails with ``code`` while ``full["on"]`` is set (a full or read-only disk)."""
    real_write = os.write

    def write(fd: int, data: Any) -> int:
        if full["on"]:
            raise OSError(code, os.strerror(code))
        return real_write(fd, data)

    monkeypatch.setattr(os, "write", write)


def _looking_model() -> ScriptedModel:
    return ScriptedModel([
        ScriptedResponse(text="Looking.", tool_calls=[ScriptedToolCall("disk", {})]),
        ScriptedResponse(text="Again.", tool_calls=[ScriptedToolCall("disk", {})]),
        "Done.",
    ])


@pytest.mark.parametrize("code", [errno.ENOSPC, errno.EROFS, errno.EIO])
async def test_the_file_replays_to_the_engine_messages_once_the_disk_recovers(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, code: int
) -> None:
    """A message the store failed to append (disk full for a moment) was missing from the file
    for good: the later appends succeeded, and the file replayed to a transcript with a hole in
    it (a tool call without its result, repaired into a synthetic error on resume)."""
    full = {"on": False}
    calls = 0

    @tool
    async def disk() -> str:
        """Fill the disk, then free it."""
        nonlocal calls
        calls += 1
        full["on"] = calls == 1  # the first call's result is lost; the second's is written
        return f"call {calls}"

    path = tmp_path / "s.jsonl"
    with JsonlSession(path) as session:
        engine = QueryEngine(_looking_model(), tools=[disk], session=session, policies=[])
        _fail_writes_while(monkeypatch, full, code)
        async for _ in engine.run("go"):
            pass
    assert engine.messages[-1].text == "Done."
    # The first call's result and the message after it, while the disk was full.
    assert len(engine.session_errors) == 2 and all(os.strerror(code) in e for e in engine.session_errors)
    loaded = JsonlSession(path).load()
    assert loaded.warnings == [] and loaded.repairs == []
    assert loaded.messages == engine.messages


async def test_a_disk_that_stays_full_leaves_the_file_a_whole_earlier_transcript(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Each failure is listed; the file replays to the transcript as it was before the first
    failure, and the next run after the disk recovers brings it up to date."""
    full = {"on": False}

    @tool
    async def disk() -> str:
        """Fill the disk."""
        full["on"] = True
        return "full"

    path = tmp_path / "s.jsonl"
    with JsonlSession(path) as session:
        engine = QueryEngine(_looking_model(), tools=[disk], session=session, policies=[])
        _fail_writes_while(monkeypatch, full)
        async for _ in engine.run("go"):
            pass
        before = JsonlSession(path).load()  # the call without its result: repaired as interrupted
        assert before.messages[:2] == engine.messages[:2] and len(before.messages) == 3
        assert all("No space left on device" in line for line in engine.session_errors)
        full["on"] = False
        engine.model = ScriptedModel(["Still here."])
        async for _ in engine.run("and now?"):
            pass
    assert JsonlSession(path).load().messages == engine.messages


def test_an_io_error_names_the_session_file(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A write that failed said "[Errno 28] No space left on device" and nothing else: a host
    with many sessions (and their sidechains) could not tell which file lacked the record."""
    path = tmp_path / "s.jsonl"
    full = {"on": False}
    _fail_writes_while(monkeypatch, full)
    with JsonlSession(path) as session:
        session.append_message(Message.user("one"))
        full["on"] = True
        with pytest.raises(OSError) as raised:
            session.append_message(Message.user("two"))
        full["on"] = False
    assert raised.value.errno == errno.ENOSPC
    assert raised.value.filename == str(path)
    assert str(path) in str(raised.value)


@pytest.mark.parametrize("how", ["deleted", "replaced"])
def test_an_append_to_a_file_deleted_or_replaced_under_the_writer_is_refused(
    tmp_path: Path, how: str
) -> None:
    """A session file deleted (or replaced by a rename over it) while a session held it open
    went on "appending" to the unlinked file: every later record was lost without an error,
    and the file at the path (if any) held none of them."""
    path = tmp_path / "s.jsonl"
    with JsonlSession(path) as session:
        session.append_message(Message.user("one"))
        if how == "deleted":
            path.unlink()
        else:
            other = tmp_path / "other.jsonl"
            other.write_bytes(b"")
            os.replace(other, path)
        with pytest.raises(OSError, match="deleted, moved away, or replaced") as raised:
            session.append_message(Message.user("two"))
        assert raised.value.filename == str(path) and raised.value.errno == errno.ESTALE
        session.append_message(Message.user("three"))  # at the path again
    assert [m.text for m in JsonlSession(path).load().messages] == ["three"]


@pytest.mark.parametrize("how", ["moved", "moved, then replaced", "hard-linked, then deleted"])
def test_an_append_to_a_file_moved_away_under_the_writer_is_refused_and_the_next_opens_the_path(
    tmp_path: Path, how: str
) -> None:
    """A file renamed while open (``mv`` of a live session, a log rotation) took every later
    record to its new name: the path held nothing, or a file put there later that no writer
    had locked, and a resume from the path lost them. The path is looked up at each append now:
    the append is refused (``ESTALE``), the moved file keeps what it had, and the next append
    opens the file at the path (an engine then writes its whole transcript there)."""
    path, moved = tmp_path / "s.jsonl", tmp_path / "archive.jsonl"
    with JsonlSession(path) as session:
        session.append_message(Message.user("one"))
        if how.startswith("hard-linked"):
            os.link(path, moved)
            path.unlink()
        else:
            path.rename(moved)
        if how.endswith("replaced"):
            path.write_bytes(b"")
        with pytest.raises(OSError, match="deleted, moved away, or replaced") as raised:
            session.append_message(Message.user("two"))
        assert raised.value.filename == str(path) and raised.value.errno == errno.ESTALE
        session.append_message(Message.user("three"))  # at the path again
    assert [m.text for m in JsonlSession(moved).load().messages] == ["one"]
    assert [m.text for m in JsonlSession(path).load().messages] == ["three"]


@pytest.mark.parametrize("how", ["deleted", "replaced", "moved"])
async def test_a_run_whose_file_is_deleted_under_it_writes_its_whole_transcript_again(
    tmp_path: Path, how: str
) -> None:
    """The engine learns of it as of any failed append, and its next commit writes the whole
    transcript as a checkpoint into the file at the path: nothing of the conversation is lost."""
    path = tmp_path / "s.jsonl"
    calls = 0

    @tool
    async def disk() -> str:
        """Delete (or replace) the session file."""
        nonlocal calls
        calls += 1
        if calls == 1:
            if how == "deleted":
                path.unlink()
            elif how == "moved":
                path.rename(tmp_path / "archive.jsonl")
            else:
                (tmp_path / "x.jsonl").write_text('{"type":"message","message":{"role":"user","content":"x"}}\n')
                os.replace(tmp_path / "x.jsonl", path)
        return f"call {calls}"

    with JsonlSession(path) as session:
        engine = QueryEngine(_looking_model(), tools=[disk], session=session, policies=[])
        async for _ in engine.run("go"):
            pass
    assert len(engine.session_errors) == 1 and "deleted, moved away, or replaced" in engine.session_errors[0]
    loaded = JsonlSession(path).load()
    assert loaded.warnings == [] and loaded.repairs == []
    assert loaded.messages == engine.messages


def test_a_writer_whose_file_was_replaced_does_not_write_beside_the_new_files_writer(tmp_path: Path) -> None:
    """The lock is the open file's: a file replaced by a rename over it and resumed by another
    writer is locked by that one only. The first writer, still holding the old file, appended
    to it unseen; now it finds the file replaced, and then is refused the new one."""
    from agentloop.sessions import SessionLockedError

    path = tmp_path / "s.jsonl"
    with JsonlSession(path) as first:
        first.append_message(Message.user("one"))
        (tmp_path / "new.jsonl").write_bytes(b"")
        os.replace(tmp_path / "new.jsonl", path)
        second, _ = JsonlSession.resume(path)
        with second:
            second.append_message(Message.user("two"))
            with pytest.raises(OSError, match="replaced"):
                first.append_message(Message.user("lost"))
            with pytest.raises(SessionLockedError):
                first.append_message(Message.user("refused"))
    assert [m.text for m in JsonlSession(path).load().messages] == ["two"]


async def test_a_fork_taken_while_a_tool_runs_sees_the_call_interrupted_and_records_it(tmp_path: Path) -> None:
    """Forking a file another run is writing: the fork holds the records so far, the call still
    running there as interrupted, and its own file replays to the fork's transcript."""
    main, fork_path = tmp_path / "main.jsonl", tmp_path / "fork.jsonl"
    forked: list[QueryEngine] = []

    @tool
    async def disk() -> str:
        """Fork the conversation while this call runs."""
        loaded = JsonlSession(main).load()
        assert [r.split(" (")[0] for r in loaded.repairs] == ["added a synthetic result for tool_use 'toolu_0001'"]
        with JsonlSession(fork_path) as fork:
            branch = QueryEngine(ScriptedModel(["Forked."]), session=fork, messages=loaded.messages, policies=[])
            async for _ in branch.run("and then?"):
                pass
        forked.append(branch)
        return "ran"

    with JsonlSession(main) as session:
        engine = QueryEngine(_looking_model(), tools=[disk], session=session, policies=[])
        async for _ in engine.run("go"):
            pass
    (branch,) = forked
    result = branch.messages[2].content[0]
    assert isinstance(result, ToolResultBlock) and result.is_error
    assert JsonlSession(fork_path).load().messages == branch.messages
    assert JsonlSession(main).load().messages == engine.messages


async def test_a_directory_where_the_session_file_should_be_is_an_error_not_a_conversation(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """A directory at the session's path was taken for a file that holds a conversation: the
    engine warned that its first run would write over "the file's conversation"."""
    path = tmp_path / "s.jsonl"
    path.mkdir()
    with JsonlSession(path) as session, caplog.at_level("WARNING", logger="agentloop"):
        engine = QueryEngine(ScriptedModel(["hi"]), session=session, policies=[])
        assert not [r for r in caplog.records if r.levelname == "WARNING"]
        async for _ in engine.run("x"):
            pass
    assert engine.messages[-1].text == "hi"
    assert engine.session_errors and all(f"Is a directory: '{path}'" in e for e in engine.session_errors)
    assert not any("checkpoint" in e for e in engine.session_errors)
    with pytest.raises(IsADirectoryError, match="Is a directory"):
        JsonlSession(path).load()


def test_a_line_written_but_for_its_newline_is_cut_at_the_close(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A write that stopped one byte short (the disk full before the newline), whose fragment
    could not be cut at once either, was left at the close: a whole record without its newline,
    which a load keeps. The append had raised, so the record was counted as lost (a host that
    appended it again once the disk recovered, in another process, recorded it twice)."""
    real_write, real_truncate = os.write, os.ftruncate
    state = {"write": 0, "truncate": 0}

    def write(fd: int, data: Any) -> int:
        state["write"] += 1
        if state["write"] == 2:
            return real_write(fd, bytes(data)[:-1])
        if state["write"] == 3:
            raise OSError(errno.ENOSPC, "No space left on device")
        return real_write(fd, data)

    def ftruncate(fd: int, length: int) -> None:
        state["truncate"] += 1
        if state["truncate"] == 1:
            raise OSError(errno.EIO, "Input/output error")
        real_truncate(fd, length)

    path = tmp_path / "s.jsonl"
    monkeypatch.setattr(os, "write", write)
    monkeypatch.setattr(os, "ftruncate", ftruncate)
    with JsonlSession(path) as session:
        session.append_message(Message.user("one"))
        with pytest.raises(OSError, match="No space left"):
            session.append_message(Message.user("two"))
    loaded = JsonlSession(path).load()
    assert [m.text for m in loaded.messages] == ["one"] and loaded.warnings == []


@pytest.mark.parametrize("replaced", [False, True])
def test_a_device_number_that_differs_between_the_path_and_the_open_file_alone_is_not_a_move(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, replaced: bool
) -> None:
    """On overlayfs and some network file systems a `stat` of the path and an `fstat` of the
    open file can give one file two device numbers: the check that the path still names the
    open file compared the path's with the open file's, and refused every append there. It
    compares the path's now with the path's at open; a file replaced at the path is still refused."""
    path = tmp_path / "s.jsonl"
    real_stat = os.stat

    def stat(target: Any, *args: Any, **kwargs: Any) -> os.stat_result:
        found = real_stat(target, *args, **kwargs)
        if isinstance(target, (str, os.PathLike)) and Path(target) == path:
            fields = list(found)
            fields[2] += 1  # st_dev, as an overlay's upper layer gives it
            return os.stat_result(fields)
        return found

    monkeypatch.setattr(os, "stat", stat)
    with JsonlSession(path) as session:
        session.append_message(Message.user("one"))
        if replaced:
            other = tmp_path / "other.jsonl"
            other.write_bytes(b"")
            os.replace(other, path)
            with pytest.raises(OSError, match="deleted, moved away, or replaced"):
                session.append_message(Message.user("two"))
        else:
            session.append_message(Message.user("two"))
        monkeypatch.undo()
    expected = [] if replaced else ["one", "two"]
    assert [m.text for m in JsonlSession(path).load().messages] == expected


@pytest.mark.parametrize("how", ["load", "resume"])
def test_a_fifo_at_the_session_path_is_not_read_for_ever(
    tmp_path: Path, how: str, caplog: pytest.LogCaptureFixture
) -> None:
    """A FIFO at the session's path was read until a writer opened and closed it: `load` and
    `resume` waited for ever (and on a pipe another process reads, as ``/dev/stdout`` piped to a
    viewer, they would have taken its data). What is written to a pipe is not kept there: it
    loads as empty, and says why."""
    path = tmp_path / "s.jsonl"
    os.mkfifo(path)
    outcome: list[Any] = []

    def read() -> None:
        if how == "load":
            outcome.append(JsonlSession(path).load())
        else:
            session, loaded = JsonlSession.resume(path)
            session.close()
            outcome.append(loaded)

    reader = threading.Thread(target=read, daemon=True)
    with caplog.at_level("WARNING", logger="agentloop"):
        reader.start()
        reader.join(timeout=30)
    if reader.is_alive():
        with contextlib.suppress(OSError):  # a writer that comes and goes ends the wait of `load`
            os.close(os.open(path, os.O_WRONLY | os.O_NONBLOCK))
        pytest.fail(f"{how} waited for a writer of the FIFO")
    (loaded,) = outcome
    assert loaded.messages == [] and len(loaded.warnings) == 1
    assert str(path) in loaded.warnings[0] and "not a regular file" in loaded.warnings[0]
    assert [r.getMessage() for r in caplog.records if r.levelname == "WARNING"] == loaded.warnings


def test_devnull_loads_as_empty_without_a_warning(caplog: pytest.LogCaptureFixture) -> None:
    """``os.devnull`` is how a host keeps nothing: loading it (or resuming it) says nothing."""
    with caplog.at_level("WARNING", logger="agentloop"):
        session, loaded = JsonlSession.resume(os.devnull)
        session.close()
    assert loaded.messages == [] and loaded.warnings == [] and caplog.records == []


def test_a_huge_value_in_a_damaged_line_is_not_quoted_whole_in_its_warning(tmp_path: Path) -> None:
    """The warnings for a record of an unknown type, a block of an unknown type, or fields this
    version does not know quoted the value whole: a line of a megabyte was a megabyte of log."""
    huge = "x" * (1 << 20)
    records = [
        {"type": huge},
        {"type": "message", "message": {"role": "user", "content": [{"type": huge}, {"type": "text", "text": "a"}]}},
        {"type": "message", "message": {"role": "user", "content": [{"type": "text", "text": "b"}], huge: 1, "y" * 99: 2}},
    ]
    path = tmp_path / "s.jsonl"
    path.write_text("".join(json.dumps(r) + "\n" for r in records), encoding="utf-8")
    loaded = JsonlSession(path).load()
    assert [m.text for m in loaded.messages] == ["a", "b"]
    assert len(loaded.warnings) == 3 and all(len(w) < 500 + len(str(path)) for w in loaded.warnings), [
        len(w) for w in loaded.warnings
    ]
    assert "unknown record type 'xxx" in loaded.warnings[0] and "block of unknown type 'xxx" in loaded.warnings[1]
    assert "ignored unknown field(s) 'xxx" in loaded.warnings[2] and "'yyy" in loaded.warnings[2]


def test_a_message_of_plain_text_content_with_a_field_this_version_does_not_know_is_kept(tmp_path: Path) -> None:
    """A message whose content is a string (as `Message` accepts, and a file written by hand or by
    another tool holds) was skipped whole for one unknown field, where one whose content is a
    list of blocks lost only that field."""
    path = tmp_path / "s.jsonl"
    record = {"type": "message", "message": {"role": "user", "content": "hi", "id": "m1"}}
    path.write_text(json.dumps(record) + "\n", encoding="utf-8")
    loaded = JsonlSession(path).load()
    assert loaded.messages == [Message.user("hi")]
    assert [w.split(": ", 1)[1] for w in loaded.warnings] == ["the last line: ignored unknown field(s) 'id' of a message"]


@pytest.mark.parametrize(
    "field",
    [
        {"tool_calls": [{"id": "c1", "type": "function", "function": {"name": "rm", "arguments": "{}"}}]},
        {"tool_call_id": "c1"},
        {"function_call": {"name": "rm", "arguments": "{}"}},
    ],
)
@pytest.mark.parametrize("content", ["calling", [{"type": "text", "text": "calling"}]], ids=["str", "blocks"])
def test_a_message_with_a_field_that_changes_its_meaning_is_skipped(
    tmp_path: Path, field: dict[str, Any], content: object
) -> None:
    """A message with a field that makes it something else than text (an assistant's tool
    calls, a tool's result, as OpenAI writes them) was kept as plain text, with only a warning:
    a transcript the model would read as saying what it did not. So with content blocks."""
    path = tmp_path / "s.jsonl"
    records = [
        {"type": "message", "message": {"role": "user", "content": "hi"}},
        {"type": "message", "message": {"role": "assistant", "content": content, **field}},
    ]
    path.write_text("".join(json.dumps(r) + "\n" for r in records), encoding="utf-8")
    loaded = JsonlSession(path).load()
    assert loaded.messages == [Message.user("hi")]
    (warning,) = loaded.warnings
    assert "skipped" in warning and repr(next(iter(field))) in warning, warning


@pytest.mark.parametrize("agent_id", ["C:evil", "c:", "a:stream", "CON", "nul", "Com1.x", "COM\u00b9", "lpt\u00b2", "LPT\u00b3.x", "aux .x", "a?b", "a|b", "a\tb"])
def test_an_id_windows_reads_as_a_drive_a_stream_or_a_device_is_not_a_file_name_there(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, agent_id: str
) -> None:
    """On Windows, ``<folder> / "C:evil.jsonl"`` is ``C:evil.jsonl``, in drive C's working directory:
    out of the session's folder. ``a:stream`` writes to a hidden stream of a file ``a``, ``CON``
    to the console. Each was taken as a plain file name there."""
    from pathlib import PureWindowsPath

    from agentloop.sessions import _files

    assert PureWindowsPath("D:/srv/subagents/s") / "C:evil.jsonl" == PureWindowsPath("C:evil.jsonl")
    session = JsonlSession(tmp_path / "s.jsonl")
    monkeypatch.setattr(_files, "WINDOWS", True)
    with pytest.raises(ValueError, match="cannot be used as a file name"):
        session.sidechain(agent_id)
    assert session.sidechain("helper-1").path.name == "helper-1.jsonl"
    monkeypatch.setattr(_files, "WINDOWS", False)  # elsewhere each is a file name like any other
    assert session.sidechain(agent_id).path.name == f"{agent_id}.jsonl"
    session.close()
