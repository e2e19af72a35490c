"""validate_transcript reports every rule; repair_transcript fixes each, idempotently."""

from __future__ import annotations

import pytest
from hypothesis import example, given, settings
from hypothesis import strategies as st
from pydantic import ValidationError

from agentloop import (
    Block,
    Message,
    ProviderBlock,
    RedactedThinkingBlock,
    TextBlock,
    ThinkingBlock,
    ToolResultBlock,
    ToolUseBlock,
    repair_transcript,
    validate_transcript,
)
from agentloop._transcript import NO_RESULT
from agentloop._unicode import scrub


def use(i: str, name: str = "t", **kw: object) -> ToolUseBlock:
    return ToolUseBlock(id=i, name=name, input={}, **kw)  # type: ignore[arg-type]


def res(i: str, text: str = "ok") -> ToolResultBlock:
    return ToolResultBlock(tool_use_id=i, content=text)


def a(*blocks: object) -> Message:
    return Message(role="assistant", content=list(blocks))  # type: ignore[arg-type]


def u(*blocks: object) -> Message:
    return Message(role="user", content=list(blocks))  # type: ignore[arg-type]


T = TextBlock


def only(messages: list[Message], needle: str) -> None:
    problems = validate_transcript(messages)
    assert len(problems) == 1 and needle in problems[0], problems
    changes: list[str] = []
    fixed = repair_transcript(messages, changes=changes)
    assert validate_transcript(fixed) == []
    assert changes, "the repair changed the transcript without saying so"


def test_valid_transcript_has_no_violations_and_repair_returns_it_unchanged() -> None:
    msgs = [
        u(T(text="hi")),
        a(ThinkingBlock(thinking="hm", signature="s"), T(text="calling"), use("1"), use("2")),
        u(res("2"), res("1"), T(text="and also")),
        a(RedactedThinkingBlock(data="x"), T(text="done")),
    ]
    assert validate_transcript(msgs) == []
    changes: list[str] = []
    fixed = repair_transcript(msgs, changes=changes)
    assert changes == []
    assert all(x is y for x, y in zip(fixed, msgs, strict=True))


def test_rule_tool_use_without_result_is_reported() -> None:
    only([u(T(text="q")), a(use("1")), u(T(text="next"))], "'1' (t) has no tool_result")


def test_rule_tool_use_at_the_end_is_reported() -> None:
    only([u(T(text="q")), a(use("1"))], "transcript ends after it")


def test_rule_result_must_be_in_the_very_next_message() -> None:
    problems = validate_transcript([u(T(text="q")), a(use("1")), a(T(text="x")), u(res("1"))])
    assert any("has no tool_result in the next message" in p for p in problems)
    assert any("has no tool_use" in p for p in problems)


def test_rule_results_come_first() -> None:
    only([u(T(text="q")), a(use("1")), u(T(text="first"), res("1"))], "comes after other content")


def test_repair_says_that_it_moved_a_result_before_the_users_text() -> None:
    changes: list[str] = []
    fixed = repair_transcript([u(T(text="q")), a(use("1")), u(T(text="first"), res("1", "out"))], changes=changes)
    assert [(b.type, getattr(b, "text", None)) for b in fixed[2].content] == [("tool_result", "out"), ("text", "first")]
    assert changes == ["moved the tool_result for '1' before the other content of its message"]


def test_rule_orphan_result_is_reported_and_kept_as_text() -> None:
    msgs = [u(T(text="q")), a(T(text="no call")), u(res("9", "payload"))]
    only(msgs, "'9' has no tool_use")
    fixed = repair_transcript(msgs)
    assert "payload" in fixed[-1].text  # nothing is lost


def test_rule_duplicate_result() -> None:
    only([u(T(text="q")), a(use("1")), u(res("1"), res("1"))], "duplicate tool_result")


def test_rule_duplicate_tool_use_id() -> None:
    problems = validate_transcript([u(T(text="q")), a(use("1"), use("1")), u(res("1"))])
    assert any("duplicate tool_use id" in p for p in problems)
    assert validate_transcript(repair_transcript([u(T(text="q")), a(use("1"), use("1")), u(res("1"))])) == []


def test_validate_reports_what_is_not_a_list_of_messages_instead_of_raising() -> None:
    ok = u(T(text="q"))
    assert validate_transcript(None) == ["messages is of type NoneType, not a list of Message objects"]  # type: ignore[arg-type]
    assert validate_transcript(ok) == ["messages is of type Message, not a list of Message objects"]  # type: ignore[arg-type]
    assert validate_transcript([ok, {"role": "user", "content": "hi"}, None]) == [  # type: ignore[list-item]
        "messages[1] is of type dict, not a Message",
        "messages[2] is of type NoneType, not a Message",
    ]
    # A message whose fields were replaced without validation (model_copy(update=...) does not check).
    assert validate_transcript(
        [
            ok.model_copy(update={"content": "hello"}),
            ok.model_copy(update={"content": [T(text="x"), {"type": "text", "text": "y"}]}),
            ok.model_copy(update={"role": "system"}),
        ]
    ) == [
        "messages[0]: content is of type str, not a list of blocks",
        "messages[1]: content[1] is of type dict, not a block",
        "messages[2] has the role 'system', neither 'user' nor 'assistant'",
    ]
    assert validate_transcript(iter([ok, a(T(text="fine"))])) == []  # type: ignore[arg-type]  # any iterable


def test_validate_reports_a_block_whose_fields_were_replaced_without_validation_instead_of_raising() -> None:
    # One level down from a message's fields: validate raised AttributeError or TypeError, and
    # repair_transcript failed the same way instead of with its TypeError that says which entry.
    q = u(T(text="q"))
    broken = [
        q.model_copy(update={"content": [T(text="x").model_copy(update={"text": None})]}),
        a(use("1"), ThinkingBlock(thinking="t", signature="s").model_copy(update={"signature": None})),
        u(res("1").model_copy(update={"content": None}), res("2").model_copy(update={"content": ["a"]})),
        a(use("3").model_copy(update={"id": 3}), use("4").model_copy(update={"input": "{}"})),
        q.model_copy(update={"content": [res("3").model_copy(update={"is_error": "yes"}), T(text="y").model_copy(update={"type": "thinking"})]}),
    ]
    assert validate_transcript(broken) == [
        "messages[0]: content[0] (text): text is of type NoneType, not str",
        "messages[1]: content[1] (thinking): signature is of type NoneType, not str",
        "messages[2]: content[0] (tool_result): content is of type NoneType, not a string or a list of text blocks",
        "messages[2]: content[1] (tool_result): content is of type list, not a string or a list of text blocks",
        "messages[3]: content[0] (tool_use): id is of type int, not str",
        "messages[3]: content[1] (tool_use): input is of type str, not dict",
        "messages[4]: content[0] (tool_result): is_error is of type str, not bool",
        "messages[4]: content[1] (text): type is 'thinking', not 'text'",
    ]
    with pytest.raises(TypeError, match=r"messages\[0\]: content\[0\] \(text\): text is of type NoneType.*and 5 more"):
        repair_transcript(broken)


@given(st.recursive(st.none() | st.integers() | st.text(max_size=3) | st.just(Message.user("x")), lambda c: st.lists(c, max_size=3) | st.dictionaries(st.text(max_size=2), c, max_size=2), max_leaves=6))
def test_property_validate_never_raises_and_repair_raises_only_type_error(value: object) -> None:
    problems = validate_transcript(value)  # type: ignore[arg-type]
    assert all(isinstance(p, str) for p in problems)
    try:
        fixed = repair_transcript(value)  # type: ignore[arg-type]
    except TypeError as exc:
        assert problems and "repair_transcript takes a list of Message objects" in str(exc)
    else:
        assert validate_transcript(fixed) == []


def test_repair_refuses_what_is_not_a_list_of_messages_with_a_type_error_that_says_why() -> None:
    with pytest.raises(TypeError, match=r"messages\[0\] is of type dict, not a Message.*Message.model_validate"):
        repair_transcript([{"role": "user", "content": "hi"}])  # type: ignore[list-item]
    assert repair_transcript(iter([u(T(text="q"))])) == [u(T(text="q"))]  # type: ignore[arg-type]


def test_repair_gives_a_repeated_or_missing_tool_use_id_an_unused_one_and_keeps_its_result() -> None:
    """Servers that number their calls afresh in every response leave repeated ids in a saved
    transcript; the repair renames the later call and the result that answers it, losing nothing."""
    msgs = [
        u(T(text="q")), a(use("call_0")), u(res("call_0", "first")),
        a(use("call_0"), use("call_0")), u(res("call_0", "second"), res("call_0", "third")),
        a(use("")), u(res("", "fourth")),
    ]
    problems = validate_transcript(msgs)
    assert any("duplicate tool_use id 'call_0'" in p for p in problems)
    assert any("without an id" in p for p in problems)
    changes: list[str] = []
    fixed = repair_transcript(msgs, changes=changes)
    assert validate_transcript(fixed) == []
    pairs = [(r.tool_use_id, r.text) for m in fixed for r in m.tool_results]
    assert pairs == [("call_0", "first"), ("call_0_1", "second"), ("call_0_2", "third"), ("toolu_1", "fourth")]
    assert [b.id for m in fixed for b in m.tool_uses] == ["call_0", "call_0_1", "call_0_2", "toolu_1"]
    assert changes[3:] == [
        "gave a tool_result for 'call_0' the id 'call_0_1' of the call renamed from it",
        "gave a tool_result for 'call_0' the id 'call_0_2' of the call renamed from it",
        "gave a tool_result for '' the id 'toolu_1' of the call renamed from it",
    ]
    assert len(changes) == 6 and repair_transcript(fixed) == fixed


def test_repair_renames_the_result_of_a_renamed_call_wherever_it_would_move_it_from() -> None:
    """A renamed call's result is found where the call's own would be: one message per result
    (OpenAI Chat histories, from a server that numbers calls afresh in each response), after an
    assistant message, inside the call's own message. It was left with the old id there, so the
    call got a synthetic "Interrupted by user" result and its real one was turned into text."""
    k0, k1 = "functions.read:0", "functions.read:1"
    first = [u(T(text="q")), a(use(k0), use(k1)), u(res(k0, "one")), u(res(k1, "two"))]
    cases = {
        "split": [*first, a(use(k0), use(k1)), u(res(k0, "three")), u(res(k1, "four")), a(T(text="done"))],
        "after text": [*first, a(use(k0), use(k1)), u(T(text="hi")), u(res(k0, "three"), res(k1, "four"))],
        "after assistant": [*first, a(use(k0), use(k1)), a(T(text="x")), u(res(k0, "three"), res(k1, "four"))],
        "inside": [*first, a(use(k0), use(k1), res(k0, "three"), res(k1, "four"))],
    }
    for name, msgs in cases.items():
        changes: list[str] = []
        fixed = repair_transcript(msgs, changes=changes)
        assert validate_transcript(fixed) == [], name
        pairs = [(r.tool_use_id, r.text, r.is_error) for m in fixed for r in m.tool_results]
        assert pairs == [
            (k0, "one", False), (k1, "two", False), (f"{k0}_1", "three", False), (f"{k1}_1", "four", False)
        ], (name, fixed)
        assert not any("synthetic" in c or "orphan" in c for c in changes), (name, changes)


def test_repair_pairs_the_results_for_a_repeated_id_with_its_calls_in_order() -> None:
    """The second complete call 'a' is renamed 'a_1'. The first result for 'a' (in an assistant
    message whose own calls never completed) answered 'a' and was then dropped for the user's
    one; 'a_1' got a synthetic result. The results now answer the calls in order."""
    msgs = [
        a(use("a"), use("a", complete=False), use("a")),
        a(use("a", complete=False), use("a", complete=False), res("a", "in the call's message")),
        u(res("a", "out 1")),
    ]
    changes: list[str] = []
    fixed = repair_transcript(msgs, changes=changes)
    assert validate_transcript(fixed) == []
    assert [b.id for m in fixed for b in m.tool_uses] == ["a", "a_1"]
    pairs = [(r.tool_use_id, r.text, r.is_error) for m in fixed for r in m.tool_results]
    assert pairs == [("a", "in the call's message", False), ("a_1", "out 1", False)]
    assert "gave a tool_result for 'a' the id 'a_1' of the call renamed from it" in changes
    assert not any("synthetic" in c for c in changes), changes
    assert repair_transcript(fixed) == fixed


def test_repair_keeps_as_text_a_result_that_comes_after_the_one_paired_with_its_call() -> None:
    """A result in an assistant message after the call answers it; a second one for the same id,
    in the user message after that, was dropped without a word, since that message took the place
    of the empty assistant one. It is kept as text now, and said so."""
    changes: list[str] = []
    fixed = repair_transcript([u(T(text="q")), a(use("1")), a(res("1", "early")), u(res("1", "late"))], changes=changes)
    assert validate_transcript(fixed) == []
    assert [(r.tool_use_id, r.text) for m in fixed for r in m.tool_results] == [("1", "early")]
    assert "late" in fixed[-1].text
    assert "turned orphan tool_result for '1' into text" in changes


def test_repair_logs_only_its_own_changes_when_given_a_list_that_holds_some(caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level("INFO", logger="agentloop")
    changes: list[str] = []
    repair_transcript([u(T(text="q")), a(use("1"))], changes=changes)
    caplog.clear()
    repair_transcript([u(T(text="q")), a(use("2"))], changes=changes)  # one list for a batch of repairs
    assert len(changes) == 2
    assert [r.getMessage() for r in caplog.records] == [f"repair_transcript: {changes[1]}"]


def test_repair_never_gives_a_call_an_id_that_another_call_only_has_once_scrubbed() -> None:
    r"""'\ud800_1' becomes '\ufffd_1' when scrubbed: the second '\ud800' call, renamed, must not get
    that id too (a duplicate id in the repaired transcript, which every provider refuses)."""
    msgs = [u(T(text="q")), a(use("\ud800"), use("\ud800_1"), use("\ud800")), u(res("\ud800", "1"), res("\ud800_1", "2"), res("\ud800", "3"))]
    fixed = repair_transcript(msgs)
    assert validate_transcript(fixed) == []
    ids = [b.id for b in fixed[1].tool_uses]
    assert len(set(ids)) == 3 and ids[:2] == ["\ufffd", "\ufffd_1"]
    assert sorted(r.text for r in fixed[2].tool_results) == ["1", "2", "3"]
    assert repair_transcript(fixed) == fixed


def test_rule_empty_text_block() -> None:
    only([u(T(text="q")), a(T(text="  \n"), T(text="x"))], "empty or whitespace-only text block")


def test_rule_empty_message() -> None:
    only([u(T(text="q")), Message(role="assistant", content=[])], "empty message")


def test_rule_trailing_whitespace_in_final_assistant_message() -> None:
    msgs = [u(T(text="q")), a(T(text="answer \n"))]
    only(msgs, "ends with whitespace")
    assert repair_transcript(msgs)[-1].text == "answer"


def test_rule_trailing_whitespace_is_fine_when_not_final() -> None:
    assert validate_transcript([u(T(text="q")), a(T(text="answer ")), u(T(text="more"))]) == []


def test_rule_thinking_without_signature() -> None:
    only([u(T(text="q")), a(ThinkingBlock(thinking="x", signature=""), T(text="y"))], "without a signature")


def test_rule_incomplete_tool_use() -> None:
    only([u(T(text="q")), a(T(text="y"), use("1", complete=False))], "never completed")


def test_rule_blocks_in_the_wrong_role() -> None:
    only([u(T(text="q"), use("1"))], "tool_use block inside a user message")
    only([u(T(text="q")), a(T(text="x"), res("1"))], "tool_result inside an assistant message")
    only([u(T(text="q"), ThinkingBlock(thinking="t", signature="s"))], "thinking block inside a user message")


def test_a_block_that_breaks_two_rules_is_reported_once_for_each() -> None:
    # Only the first rule was reported: an unsigned thinking block in a user message was "without
    # a signature", and signing it would have left a block the user may not send.
    for block, rules in [
        (ThinkingBlock(thinking="t", signature=""), ["without a signature", "thinking block inside a user message"]),
        (use("1", complete=False), ["never completed", "tool_use block inside a user message"]),
    ]:
        problems = validate_transcript([u(T(text="q"), block)])
        assert len(problems) == 2 and all(rule in line for rule, line in zip(rules, problems, strict=True)), problems
        changes: list[str] = []
        assert validate_transcript(repair_transcript([u(T(text="q"), block)], changes=changes)) == [] and changes


def test_repair_synthesizes_a_result_saying_what_happened() -> None:
    changes: list[str] = []
    fixed = repair_transcript([u(T(text="q")), a(use("1", "bash"))], changes=changes)
    result = fixed[-1].content[0]
    assert isinstance(result, ToolResultBlock) and result.is_error
    assert result.text.startswith("Interrupted by user")
    assert any("synthetic result" in c and "bash" in c for c in changes)


def test_repair_of_an_incomplete_call_drops_it_and_its_orphan_result() -> None:
    fixed = repair_transcript([u(T(text="q")), a(T(text="x"), use("1", complete=False)), u(res("1", "r"))])
    assert validate_transcript(fixed) == []
    assert not any(isinstance(b, ToolUseBlock) for m in fixed for b in m.content)


def test_repair_keeps_results_split_over_consecutive_user_messages_with_their_calls() -> None:
    """A history imported from OpenAI Chat holds one message per result; a provider merges them
    (and would pair the results), so the repair moves each real result next to its call rather
    than calling it an interrupted call and its result an orphan."""
    msgs = [
        u(T(text="q")),
        a(T(text="reading"), use("1", "read"), use("2", "grep")),
        u(res("1", "file body")),
        u(res("2", "3 matches")),
        a(T(text="done")),
    ]
    changes: list[str] = []
    fixed = repair_transcript(msgs, changes=changes)
    assert validate_transcript(fixed) == []
    assert [m.role for m in fixed] == ["user", "assistant", "user", "assistant"]
    assert [(r.tool_use_id, r.text, r.is_error) for r in fixed[2].tool_results] == [
        ("1", "file body", False),
        ("2", "3 matches", False),
    ]
    assert not any("synthetic" in c or "orphan" in c for c in changes), changes
    assert repair_transcript(fixed) == fixed


def test_repair_moves_a_result_that_follows_other_user_text_or_a_later_assistant_message() -> None:
    after_text = repair_transcript([u(T(text="q")), a(use("1")), u(T(text="hi")), u(res("1", "out"))])
    assert validate_transcript(after_text) == []
    assert [(b.type, getattr(b, "text", None)) for b in after_text[2].content] == [("tool_result", "out"), ("text", "hi")]
    assert len(after_text) == 3

    after_assistant = repair_transcript([u(T(text="q")), a(use("1")), a(T(text="more")), u(res("1", "out"))])
    assert validate_transcript(after_assistant) == []
    assert [m.role for m in after_assistant] == ["user", "assistant", "user", "assistant"]
    assert [(r.tool_use_id, r.text, r.is_error) for r in after_assistant[2].tool_results] == [("1", "out", False)]
    assert after_assistant[3].text == "more"


def test_repair_pairs_each_call_of_consecutive_assistant_messages_with_its_own_result() -> None:
    msgs = [u(T(text="q")), a(use("1")), a(use("2")), u(res("2", "two")), u(res("1", "one"))]
    fixed = repair_transcript(msgs)
    assert validate_transcript(fixed) == []
    pairs = [(m.role, [(r.tool_use_id, r.text) for r in m.tool_results]) for m in fixed[1:]]
    assert pairs == [("assistant", []), ("user", [("1", "one")]), ("assistant", []), ("user", [("2", "two")])]


def test_repair_keeps_a_result_found_inside_an_assistant_message() -> None:
    """A converter that keeps each call and its output together puts the result in the
    assistant's message: it is moved next to its call, and one without a call kept as text."""
    changes: list[str] = []
    fixed = repair_transcript([u(T(text="q")), a(T(text="running"), use("1", "bash"), res("1", "exit 0"))], changes=changes)
    assert validate_transcript(fixed) == []
    assert [b.type for b in fixed[1].content] == ["text", "tool_use"]
    assert [(r.tool_use_id, r.text, r.is_error) for r in fixed[2].tool_results] == [("1", "exit 0", False)]
    assert not any("synthetic" in c for c in changes), changes

    stray = repair_transcript([u(T(text="q")), a(T(text="x"), res("9", "payload"))])
    assert validate_transcript(stray) == []
    assert "payload" in stray[-1].text


# -- properties ------------------------------------------------------------------

# The last three as other providers make them: Kimi's, vLLM's (46 characters), and a long one.
ids = st.sampled_from(["a", "b", "c", "d", "", "a_1", "functions.read:0", "chatcmpl-tool-" + "f" * 32, "x" * 70])
# Unicode spaces Python strips (U+00A0, U+3000) and one it does not (U+200B); the last: R9.
texts = st.sampled_from(["x", "", "  ", "hi ", "ok\n", "body", "a\r\n", "\xa0", "\u3000", "\u200b", "caf\udce9"])
blocks = st.one_of(
    texts.map(lambda t: TextBlock(text=t)),
    st.builds(ThinkingBlock, thinking=texts, signature=st.sampled_from(["", "sig", '{"id": "rs_1"}'])),  # last: OpenAI's
    st.builds(RedactedThinkingBlock, data=st.just("r")),
    st.builds(
        lambda i, n, c: ToolUseBlock(id=i, name=n, input={}, complete=c),
        ids,
        st.sampled_from(["t", "multi_tool_use.parallel"]),  # the second: a name a model made up
        st.booleans(),
    ),
    st.builds(
        lambda i, t, e: ToolResultBlock(tool_use_id=i, content=t, is_error=e),
        ids,
        texts.map(lambda t: t or "r") | st.lists(texts.map(lambda t: TextBlock(text=t)), max_size=3),  # a string, or blocks
        st.booleans(),
    ),
    st.builds(  # a server tool's call or result, as Anthropic sends it (the last: R9)
        lambda d: ProviderBlock(provider="anthropic", data=d),
        st.sampled_from(
            [
                {"type": "server_tool_use", "id": "srv_1", "input": {}},
                {"type": "web_search_tool_result", "tool_use_id": "srv_1", "content": []},
                {"type": "x", "q": "caf\udce9"},
            ]
        ),
    ),
)
messages = st.builds(
    lambda role, content, partial: Message(role=role, content=content, partial=partial),
    st.sampled_from(["user", "assistant"]),
    st.lists(blocks, max_size=4),
    st.booleans(),
)
transcripts = st.lists(messages, max_size=8)


@given(transcripts)
def test_property_repair_always_yields_a_valid_transcript(msgs: list[Message]) -> None:
    assert validate_transcript(repair_transcript(msgs)) == []


@given(transcripts)
def test_property_repair_is_idempotent(msgs: list[Message]) -> None:
    once = repair_transcript(msgs)
    changes: list[str] = []
    twice = repair_transcript(once, changes=changes)
    assert twice == once and changes == []


@given(transcripts)
def test_property_repair_is_deterministic(msgs: list[Message]) -> None:
    assert repair_transcript(msgs) == repair_transcript(list(msgs))


@given(transcripts)
def test_property_validate_reports_nothing_iff_repair_changes_nothing(msgs: list[Message]) -> None:
    changes: list[str] = []
    fixed = repair_transcript(msgs, changes=changes)
    assert (validate_transcript(msgs) == []) == (changes == [])
    if not changes:  # a valid transcript comes back as it was: the same objects, in the same order
        assert len(fixed) == len(msgs) and all(x is y for x, y in zip(fixed, msgs, strict=True))


def _tagged(msgs: list[Message]) -> list[Message]:
    """``msgs`` with every non-blank user text and tool output made unique, so each can be found."""
    out: list[Message] = []
    for n, m in enumerate(msgs):
        content: list[object] = []
        for k, b in enumerate(m.content):
            if isinstance(b, TextBlock) and b.text.strip():
                b = TextBlock(text=f"<said {n}.{k}> {b.text}")
            elif isinstance(b, ToolResultBlock) and b.text.strip():
                b = ToolResultBlock(tool_use_id=b.tool_use_id, content=f"<output {n}.{k}> {b.text}", is_error=b.is_error)
            content.append(b)
        out.append(Message(role=m.role, content=content))  # type: ignore[arg-type]
    return out


@given(transcripts.map(_tagged))
def test_property_repair_loses_no_user_text_and_no_tool_output(msgs: list[Message]) -> None:
    """Nothing is lost: every text a user wrote and every tool output is still there (a result
    where it can be paired, else as text), but a second result for one id in the message that
    answers it."""
    fixed = repair_transcript(msgs)
    kept = "\n".join(b.text for m in fixed for b in m.content if isinstance(b, TextBlock | ToolResultBlock))
    for m in msgs:
        answered: set[str] = set()
        for b in m.content:
            if isinstance(b, TextBlock) and m.role == "user" and b.text.strip():
                assert scrub(b.text) in kept
            if isinstance(b, ToolResultBlock) and b.text.strip() and b.tool_use_id not in answered:
                answered.add(b.tool_use_id)
                assert scrub(b.text).strip() in kept, (b, fixed)

def _placed(msgs: list[Message]) -> list[Message]:
    """``msgs`` with each call's input saying where it was and the id it had, and each tool
    output made unique, so that the repaired transcript can be traced back."""
    out: list[Message] = []
    for n, m in enumerate(msgs):
        content: list[Block] = []
        for k, b in enumerate(m.content):
            if isinstance(b, ToolUseBlock):
                b = ToolUseBlock(id=b.id, name=b.name, input={"at": n, "had": scrub(b.id)}, complete=b.complete)
            elif isinstance(b, ToolResultBlock):
                b = ToolResultBlock(tool_use_id=b.tool_use_id, content=f"<output {n}.{k}>", is_error=b.is_error)
            content.append(b)
        out.append(Message(role=m.role, content=content))
    return out


def _reach(msgs: list[Message], n: int) -> range:
    """The messages whose results a provider that merges consecutive messages of one role would
    pair with a call in ``msgs[n]``: that one, the assistant messages after it and the user
    messages after those."""
    end = n + 1
    for role in ("assistant", "user"):
        while end < len(msgs) and msgs[end].role == role:
            end += 1
    return range(n, end)


@given(transcripts.map(_placed))
@example(  # two calls 'a', then two results for 'a' (the first beside calls that never completed)
    _placed([a(use("a"), use("a")), a(use("a", complete=False), res("a")), u(res("a"))])
)
def test_property_repair_gives_no_call_a_synthetic_result_while_a_result_for_it_is_left_over(msgs: list[Message]) -> None:
    """A call left with a synthetic result had no real one within its reach: every result there
    with the id the call had answers another call."""
    fixed = repair_transcript(msgs)
    answered = {r.text for m in fixed for r in m.tool_results}
    calls = {b.id: b for m in fixed for b in m.tool_uses}
    for m in fixed:
        for r in m.tool_results:
            if r.text != NO_RESULT:
                continue
            call = calls[r.tool_use_id]
            at, had = call.input["at"], call.input["had"]
            assert isinstance(at, int)
            left = [
                b.text
                for j in _reach(msgs, at)
                for b in msgs[j].content
                if isinstance(b, ToolResultBlock) and scrub(b.tool_use_id) == had and b.text not in answered
            ]
            assert not left, (call, left, fixed)


@st.composite
def _exchange(draw: st.DrawFn) -> list[Message]:
    """An assistant message and the user messages after it, shaped like a real exchange (calls,
    then their results) and then broken: results missing, repeated, for another call, shuffled
    among the user's text, split over two messages, or left in the assistant's message."""
    pool = ["a", "b", "", "a_1"]
    calls = [
        ToolUseBlock(id=draw(st.sampled_from(pool)), name="t", input={}, complete=draw(st.booleans() | st.just(True)))
        for _ in range(draw(st.integers(0, 3)))
    ]
    head = draw(st.lists(st.sampled_from([T(text="said"), ThinkingBlock(thinking="t", signature="s"), T(text=" ")]), max_size=2))
    tail = draw(st.lists(st.sampled_from([T(text="tail "), res("a", "in the call's message")]), max_size=1))
    answer: list[Block] = [res(c.id, f"out {k}") for k, c in enumerate(calls) if draw(st.integers(0, 4))]
    if draw(st.integers(0, 3)) == 0:
        answer.append(res(draw(st.sampled_from(pool)), "extra"))
    answer += draw(st.lists(st.sampled_from([T(text="u"), T(text="v "), T(text="")]), max_size=2))
    answer = draw(st.permutations(answer))
    cut = draw(st.integers(0, len(answer))) if draw(st.booleans()) else len(answer)
    parts = [answer[:cut], answer[cut:]]
    return [a(*head, *calls, *tail)] + [u(*part) for part in parts if part or draw(st.booleans())]


exchanges = st.tuples(st.booleans(), st.lists(_exchange(), max_size=4)).map(
    lambda x: [u(T(text="go"))] * x[0] + [m for ex in x[1] for m in ex]
)


@settings(max_examples=200)
@given(exchanges)
@example([u(T(text="go")), a(use("a")), u(T(text="u"), res("a", "out"))])  # reordered, and said so
@example(  # the second complete 'a', renamed 'a_1', is answered by the second result for 'a'
    [
        a(use("a"), use("a", complete=False), use("a")),
        a(use("a", complete=False), use("a", complete=False), res("a", "in the call's message")),
        u(res("a", "out 1")),
    ]
)
def test_property_repair_of_a_broken_exchange_is_valid_idempotent_and_says_what_it_changed(msgs: list[Message]) -> None:
    changes: list[str] = []
    fixed = repair_transcript(msgs, changes=changes)
    assert validate_transcript(fixed) == []
    again: list[str] = []
    assert repair_transcript(fixed, changes=again) == fixed and again == []
    assert (validate_transcript(msgs) == []) == (changes == []), (validate_transcript(msgs), changes)
    if not changes:
        assert all(x is y for x, y in zip(fixed, msgs, strict=True))
    kept = "\n".join(b.text for m in fixed for b in m.content if isinstance(b, TextBlock | ToolResultBlock))
    for m in msgs:  # every tool output is kept (but a second result for one id in one message)
        answered: set[str] = set()
        for b in m.content:
            if isinstance(b, ToolResultBlock) and b.tool_use_id not in answered:
                answered.add(b.tool_use_id)
                assert b.text in kept, fixed


def test_messages_share_their_fields_set_and_copies_stay_independent() -> None:
    a, b = Message.user("one"), Message.user("two")
    assert a.__pydantic_fields_set__ is b.__pydantic_fields_set__  # one set per combination of fields
    assert a.content[0].__pydantic_fields_set__ is b.content[0].__pydantic_fields_set__
    flagged = a.model_copy(update={"partial": True})
    assert flagged.partial and "partial" in flagged.__pydantic_fields_set__
    assert a.__pydantic_fields_set__ == b.__pydantic_fields_set__ == {"role", "content"}
    assert a.model_dump(exclude_unset=True) == {"role": "user", "content": [{"text": "one"}]}
    with pytest.raises(ValidationError):
        a.role = "assistant"  # type: ignore[misc]  # frozen: the shared set can never be grown


def test_a_message_built_without_meta_shares_an_empty_read_only_one() -> None:
    import copy
    import pickle

    a, b = Message.user("one"), Message.assistant("two")
    assert a.meta == {} and a.meta is b.meta  # one shared mapping, not a dict per message
    with pytest.raises(TypeError, match="read-only"):
        a.meta["note"] = "x"
    with pytest.raises(TypeError, match="read-only"):
        a.meta.update(note="x")
    assert b.meta == {}  # nothing leaked into the other message
    noted = a.model_copy(update={"meta": {"note": "x"}})
    assert noted.meta == {"note": "x"} and a.meta == {}
    given_meta = Message.user("three", meta={"receipt": "r1"})
    given_meta.meta["extra"] = 1  # a host's own dict stays an ordinary dict
    assert given_meta.meta == {"receipt": "r1", "extra": 1}
    for clone in (copy.deepcopy(a), copy.copy(a.meta), pickle.loads(pickle.dumps(a))):
        meta = clone.meta if isinstance(clone, Message) else clone
        assert meta == {}
        meta["free"] = True  # copies are ordinary dicts again
    assert Message.model_validate_json(a.model_dump_json()) == a


_FIELD_VALUES = st.fixed_dictionaries(
    {},
    optional={
        "partial": st.sampled_from([True, False, 1, 0, "yes"]),
        "synthetic": st.sampled_from([True, False, 1]),
        "kind": st.sampled_from([None, "nudge", "", 3]),
        "meta": st.sampled_from([{}, {"receipt": "r1"}, {"n": [1, 2]}, {1: "x"}, "not a dict", None]),
    },
)


@given(text=st.one_of(st.text(max_size=20), st.integers(), st.none()), fields=_FIELD_VALUES, role=st.sampled_from(["user", "assistant"]))
def test_property_message_shorthands_build_what_validation_builds(text: object, fields: dict[str, object], role: str) -> None:
    # Message.user / Message.assistant skip the validator when every value already has its
    # exact type; whatever the input, the outcome must be what validation gives.
    shorthand = Message.user if role == "user" else Message.assistant
    try:
        expected = Message.model_validate({"role": role, "content": [TextBlock.model_validate({"text": text})], **fields})
    except ValidationError:
        with pytest.raises(ValidationError):
            shorthand(text, **fields)  # type: ignore[arg-type]
        return
    built = shorthand(text, **fields)  # type: ignore[arg-type]
    assert built == expected
    assert built.__pydantic_fields_set__ == expected.__pydantic_fields_set__
    assert built.content[0].__pydantic_fields_set__ == {"text"}
    assert type(built.meta) is type(expected.meta) or built.meta == expected.meta == {}
    if "meta" in fields and isinstance(fields["meta"], dict):
        assert built.meta is not fields["meta"]  # a copy, never the caller's dict



# is_valid: the engine's one-pass check of a host's history, held to validate_transcript on
# valid transcripts (repaired ones) edited in one or two places: each edit breaks a rule, or not.
edits = st.tuples(st.sampled_from(["add", "prepend", "set", "insert", "drop", "twice", "swap"]), st.integers(0, 15), blocks)


def _edited(msgs: list[Message], edit: tuple[str, int, object]) -> list[Message]:
    op, at, block = edit
    out = list(msgs)
    if not out:
        return [Message(role="user", content=[block])]  # type: ignore[list-item]
    i = at % len(out)
    target = out[i]
    if op == "add":  # a block at the end of a message
        out[i] = target.model_copy(update={"content": [*target.content, block]})
    elif op == "prepend":
        out[i] = target.model_copy(update={"content": [block, *target.content]})
    elif op == "set":  # a block replaced
        content = list(target.content)
        content[at % len(content)] = block  # type: ignore[call-overload]
        out[i] = target.model_copy(update={"content": content})
    elif op == "insert":  # a message of its own
        out.insert(i, Message(role="assistant" if at % 2 else "user", content=[block]))  # type: ignore[list-item]
    elif op == "drop":
        del out[i]
    elif op == "twice":  # a block repeated in its message
        blocks_ = list(target.content)
        out[i] = target.model_copy(update={"content": [*blocks_, blocks_[at % len(blocks_)]]})
    else:
        j = (i + 1) % len(out)
        out[i], out[j] = out[j], out[i]
    return out


@settings(max_examples=400)
@given(transcripts, st.lists(edits, max_size=2))
def test_property_is_valid_agrees_with_validate_transcript(msgs: list[Message], changes: list[tuple[str, int, object]]) -> None:
    from agentloop._validate import is_valid

    case = repair_transcript(msgs)
    assert is_valid(case)
    for edit in changes:
        case = _edited(case, edit)
    assert is_valid(case) == (validate_transcript(case) == []), validate_transcript(case)
    assert is_valid(msgs) == (validate_transcript(msgs) == [])


def test_is_valid_refuses_one_call_answered_twice_in_place_of_another() -> None:
    from agentloop._validate import is_valid

    case = [u(T(text="q")), a(use("1"), use("2")), u(res("1"), res("1"))]
    assert validate_transcript(case) != [] and not is_valid(case)
    assert is_valid(repair_transcript(case))


def test_repair_finds_unused_ids_for_many_calls_of_one_id_in_linear_work(monkeypatch: pytest.MonkeyPatch) -> None:
    # Each repeated id looked for its new one from "_1" up, past all those given before: a
    # history with thousands of calls of one id took seconds to repair (quadratic in them).
    from agentloop import _repair

    probes = 0

    class Counted(set[str]):
        def __contains__(self, item: object) -> bool:
            nonlocal probes
            probes += 1
            return super().__contains__(item)

    init = _repair._Ids.__init__

    def counted_init(self: _repair._Ids, messages: list[Message]) -> None:
        init(self, messages)
        self.taken = Counted(self.taken)

    monkeypatch.setattr(_repair._Ids, "__init__", counted_init)
    n = 400
    fixed = repair_transcript([u(T(text="go")), a(*[use("a") for _ in range(n)], use("a_3"))])
    assert validate_transcript(fixed) == []
    assert [b.id for b in fixed[1].tool_uses] == ["a", *[f"a_{k}" for k in (1, 2, *range(4, n + 1))], "a_3"]
    assert probes <= 3 * n
