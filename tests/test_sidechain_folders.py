"""The default subagent folder of a session file: one per file, never shared."""

from __future__ import annotations

from pathlib import Path

from hypothesis import given
from hypothesis import strategies as st

from agentloop import Message
from agentloop.sessions import JsonlSession
from agentloop.sessions._store import default_sidechain_dir


def test_sessions_named_a_and_a_jsonl_keep_their_subagents_apart(tmp_path: Path) -> None:
    # Both took ``subagents/a/``: their subagents of one id wrote into one file, or were refused
    # with SessionLockedError when they ran at once.
    plain, suffixed = JsonlSession(tmp_path / "a"), JsonlSession(tmp_path / "a.jsonl")
    assert plain.sidechain_dir != suffixed.sidechain_dir
    with plain, suffixed:
        mine, theirs = plain.sidechain("agent-1"), suffixed.sidechain("agent-1")
        mine.append_message(Message.user("for a"))
        theirs.append_message(Message.user("for a.jsonl"))  # both open at once: no SessionLockedError
    assert [m.content[0].text for m in JsonlSession(mine.path).load().messages] == ["for a"]
    assert [m.content[0].text for m in JsonlSession(theirs.path).load().messages] == ["for a.jsonl"]


def test_a_jsonl_session_keeps_the_folder_it_had(tmp_path: Path) -> None:
    # Folders written before stay where a session looks for them.
    assert JsonlSession(tmp_path / "main.jsonl").sidechain_dir == tmp_path / "subagents" / "main"


_ENDINGS = st.sampled_from(["", ".jsonl", ".d", ".jsonl.jsonl", ".d.jsonl", ".jsonl.d"])
_NAMES = st.builds("".join, st.lists(st.one_of(st.sampled_from(["a", "."]), _ENDINGS), min_size=1, max_size=4)).filter(
    lambda n: n not in ("", ".", "..")
)


@given(_NAMES, _NAMES)
def test_property_two_session_files_never_share_a_subagent_folder(first: str, second: str) -> None:
    here = Path("/sessions")
    if first != second:
        assert default_sidechain_dir(here / first) != default_sidechain_dir(here / second)
    # Nor is a folder a legacy sidechain file of the shared ``subagents/`` (``<id>.jsonl``).
    assert not default_sidechain_dir(here / first).name.endswith(".jsonl")
