"""Properties of a session file: whatever transcript is saved loads back as its repair, and
appending after a resume keeps that so."""

from __future__ import annotations

import tempfile
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from agentloop import Message, TextBlock, ToolResultBlock, ToolUseBlock, repair_transcript
from agentloop.sessions import JsonlSession

#: Text with what trips encoders: lone and paired surrogate halves, line breaks JSON leaves raw
#: (U+2028, U+2029, U+0085), control characters, NUL, a BOM, astral characters.
_TEXT = st.text(
    alphabet=st.one_of(
        st.characters(codec="utf-8"),
        st.characters(min_codepoint=0xD800, max_codepoint=0xDFFF),
        st.sampled_from(["\u2028", "\u2029", "\x85", "\x00", "\r", "\n", "\ufeff", "\\", '"', "\U0001f600"]),
    ),
    max_size=12,
)
_JSON = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False, allow_infinity=False) | _TEXT,
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(_TEXT, inner, max_size=3),
    max_leaves=6,
)
_IDS = st.sampled_from(["t1", "t2", "t3"])
_BLOCK = st.one_of(
    st.builds(TextBlock, text=_TEXT),
    st.builds(
        ToolUseBlock,
        id=_IDS,
        name=st.sampled_from(["read", "bash"]),
        input=st.dictionaries(_TEXT, _JSON, max_size=3),
    ),
    st.builds(
        ToolResultBlock,
        tool_use_id=_IDS,
        content=_TEXT | st.lists(st.builds(TextBlock, text=_TEXT), max_size=2),
        is_error=st.booleans(),
    ),
)
_MESSAGE = st.builds(
    Message,
    role=st.sampled_from(["user", "assistant"]),
    content=st.lists(_BLOCK, min_size=1, max_size=3),
    meta=st.dictionaries(_TEXT, _JSON, max_size=2),
)
_TRANSCRIPT = st.lists(_MESSAGE, max_size=6)


def _save(path: Path, messages: list[Message]) -> None:
    with JsonlSession(path, fsync="never") as session:
        for message in messages:
            session.append_message(message)


_HOST = object()


@pytest.mark.parametrize(
    ("meta", "meta_loaded"),
    [
        ({}, {}),
        ({"host": _HOST}, {"host": repr(_HOST)}),  # not JSON: its repr, the message dumped field by field
        ({"a": {"\ud83d": 2}}, {"a": {"\ud83d": 2}}),  # a key pydantic cannot encode: the same
    ],
)
def test_a_key_holding_surrogates_loads_as_the_repair_has_it(
    tmp_path: Path, meta: dict[str, object], meta_loaded: dict[str, object]
) -> None:
    """A key holding a surrogate (a tool call's input, the host's ``meta``) was written as its UTF-8
    bytes, one U+FFFD each: an emoji given as a pair of halves came back as six U+FFFD, not joined
    as the repair joins it, and a lone half as three. Keys are written as values are, exactly,
    also in a message whose ``meta`` pydantic cannot dump."""
    emoji, lone = "\ud83d\ude00", "k\ud800"
    use = ToolUseBlock(id="t1", name="read", input={emoji: emoji, lone: {lone: [{emoji: 1}]}})
    messages = [
        Message.user("look", meta={lone: lone}),
        Message(role="assistant", content=[use]),
        Message(role="user", content=[ToolResultBlock(tool_use_id="t1", content="ok")]),
        Message(
            role="assistant", content=[ToolUseBlock(id="t2", name="read", input={emoji: 1})], meta={lone: 2, **meta}
        ),
        Message(role="user", content=[ToolResultBlock(tool_use_id="t2", content="ok")]),
    ]
    path = tmp_path / "s.jsonl"
    _save(path, messages)
    with JsonlSession(path, fsync="never") as session:
        session.append_checkpoint(messages)
    for line in path.read_text(encoding="utf-8").splitlines():
        assert "\ufffd" not in line and "\\ufffd" not in line
    loaded = JsonlSession(path).load()
    assert [m.model_copy(update={"meta": {}}) for m in loaded.messages] == [
        m.model_copy(update={"meta": {}}) for m in repair_transcript(messages)
    ]
    assert loaded.messages[1].content[0].input == {
        "\U0001f600": "\U0001f600",
        "k\ufffd": {"k\ufffd": [{"\U0001f600": 1}]},
    }
    assert loaded.messages[3].content[0].input == {"\U0001f600": 1}
    assert loaded.messages[0].meta == {lone: lone}  # the host's, exactly
    assert loaded.messages[3].meta == {lone: 2, **meta_loaded}


@settings(max_examples=120, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(messages=_TRANSCRIPT, later=_TRANSCRIPT, huge=st.integers(min_value=0, max_value=2))
def test_any_transcript_saved_loads_as_its_repair_and_appends_after_a_resume(
    messages: list[Message], later: list[Message], huge: int
) -> None:
    if huge and messages:  # a tool result of megabytes is one line like any other
        messages[0] = messages[0].model_copy(
            update={"content": [ToolResultBlock(tool_use_id="t1", content="\u00e9x" * (huge * 700_000))]}
        )
    with tempfile.TemporaryDirectory() as d:
        path = Path(d) / "s.jsonl"
        _save(path, messages)
        loaded = JsonlSession(path).load()
        assert loaded.warnings == []
        assert loaded.messages == repair_transcript(messages)
        assert repair_transcript(loaded.messages) == loaded.messages

        session, resumed = JsonlSession.resume(path, fsync="never")
        with session:
            assert resumed.messages == loaded.messages
            for message in later:
                session.append_message(message)
        again = JsonlSession(path).load()
        assert again.warnings == []
        assert again.messages == repair_transcript([*loaded.messages, *later])


@settings(max_examples=10, deadline=None)
@given(threads=st.integers(min_value=2, max_value=6), each=st.integers(min_value=1, max_value=40))
def test_appends_from_many_threads_are_whole_records_each_threads_in_order(threads: int, each: int) -> None:
    import json
    import threading

    with tempfile.TemporaryDirectory() as d:
        path = Path(d) / "s.jsonl"
        start = threading.Barrier(threads)
        errors: list[BaseException] = []
        with JsonlSession(path, fsync="never") as session:

            def append(n: int) -> None:
                try:
                    start.wait()
                    for i in range(each):
                        session.append_message(Message.user(f"{n}:{i}:" + "x" * (i * 997 % 5000)))
                        if i % 7 == 3:
                            session.release()  # let go of the file while the others write
                except BaseException as exc:  # reported below, in the test's thread
                    errors.append(exc)

            workers = [threading.Thread(target=append, args=(n,)) for n in range(threads)]
            for worker in workers:
                worker.start()
            for worker in workers:
                worker.join()
        assert errors == []
        lines = path.read_bytes().split(b"\n")
        assert lines.pop() == b""
        texts = [json.loads(line)["message"]["content"][0]["text"].split(":")[:2] for line in lines]
        assert len(texts) == threads * each
        for n in range(threads):
            assert [int(i) for m, i in texts if int(m) == n] == list(range(each))
