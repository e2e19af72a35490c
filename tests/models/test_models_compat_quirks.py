"""More deviations of OpenAI-compatible servers and proxies, each fed as the server sends it (an
``httpx.MockTransport``):

- The finish reason spelled otherwise: ``finishReason`` (Gemini's OpenAI-compatible endpoint in
  its first versions, gateways that pass Gemini's chunks on), Gemini's own upper-case values
  (``STOP``, ``MAX_TOKENS``, ``SAFETY``, higress and other proxies before they lowered them).
- A tool call that begins with a ``{}`` placeholder, its arguments after it (gateways in front of
  Gemini), and whole calls that share one id at one index (the same call again: a resend).
- Azure OpenAI's content filter chunks (``prompt_filter_results`` on a ``choices: []`` chunk with
  ``"id": ""`` first, ``content_filter_results`` on a choice with no delta after the finish),
  ``delta: null``, ``role`` on every delta, usage on the finish chunk, gaps in the tool call
  indexes.
"""

from __future__ import annotations

import json
import logging
from typing import Any
from unittest import mock

import pytest
from _models_support import chat_chunk, chat_stream
from hypothesis import example, given, settings
from hypothesis import strategies as st
from test_models_compat_streams import _JSON, call, calls, engine_run, inputs, run_chat, shown_and_recorded

from agentloop._errors import StreamProtocolError
from agentloop.models.openai_chat import _stream


def finish_chunk(reason: Any, key: str = "finish_reason") -> dict[str, Any]:
    chunk = chat_chunk({})
    del chunk["choices"][0]["finish_reason"]
    chunk["choices"][0][key] = reason
    return chunk


# -- the finish reason -------------------------------------------------------------------------


@pytest.mark.parametrize("done", [True, False], ids=["done", "no-done"])
async def test_a_camel_case_finish_reason_ends_the_answer(done: bool) -> None:
    body = chat_stream(chat_chunk({"content": "Hi"}), finish_chunk("stop", "finishReason"), done=done)
    _, acc = await run_chat(body)
    assert (acc.message().text, acc.stop_reason) == ("Hi", "end_turn")


@pytest.mark.parametrize(
    ("reason", "stop"),
    [("STOP", "end_turn"), ("MAX_TOKENS", "max_tokens"), ("SAFETY", "refusal"), ("RECITATION", "refusal"),
     ("PROHIBITED_CONTENT", "refusal"), ("Length", "max_tokens"), ("TOOL_CALLS", "tool_use"), ("end_turn", "end_turn")],
)  # fmt: skip
async def test_finish_reasons_in_geminis_spelling_are_read_as_openais(reason: str, stop: str) -> None:
    _, acc = await run_chat(chat_stream(chat_chunk({"content": "Hi"}), finish_chunk(reason, "finishReason")))
    assert acc.stop_reason == stop


async def test_a_gemini_stop_after_a_call_is_a_tool_use() -> None:
    body = chat_stream(calls(call(0, "a", "f", '{"x": 1}')), finish_chunk("STOP", "finishReason"))
    _, acc = await run_chat(body)
    assert (inputs(acc), acc.stop_reason) == ([("a", "f", {"x": 1}, None)], "tool_use")


async def test_an_unknown_finish_reason_ends_the_answer_as_given_with_a_warning(
    caplog: pytest.LogCaptureFixture,
) -> None:
    with caplog.at_level(logging.WARNING, "agentloop"):
        _, acc = await run_chat(chat_stream(chat_chunk({"content": "Hi"}), finish_chunk("MALFORMED_FUNCTION_CALL")))
    assert (acc.message().text, acc.stop_reason) == ("Hi", "malformed_function_call")
    (record,) = [r for r in caplog.records if "finish_reason" in r.getMessage()]
    assert "'MALFORMED_FUNCTION_CALL'" in record.getMessage() and "not one this library knows" in record.getMessage()


async def test_an_unknown_finish_reason_on_several_chunks_is_warned_of_once(caplog: pytest.LogCaptureFixture) -> None:
    # Some servers repeat the finish reason on the chunks after it (the usage chunk, a filter's).
    body = chat_stream(chat_chunk({"content": "Hi"}), *[finish_chunk("MALFORMED_FUNCTION_CALL")] * 3)
    with caplog.at_level(logging.WARNING, "agentloop"):
        _, acc = await run_chat(body)
    assert acc.stop_reason == "malformed_function_call"
    assert len([r for r in caplog.records if "not one this library knows" in r.getMessage()]) == 1


@pytest.mark.parametrize("reason", [1, {"type": "stop"}, ["stop"], True])
async def test_a_finish_reason_that_is_not_a_string_is_a_clear_protocol_error(reason: Any) -> None:
    with pytest.raises(StreamProtocolError, match="finish_reason is not a string") as info:
        await run_chat(chat_stream(chat_chunk({"content": "Hi"}), finish_chunk(reason)))
    assert not info.value.retryable


async def test_the_snake_case_finish_reason_wins_over_the_camel_case_one() -> None:
    chunk = finish_chunk("length")
    chunk["choices"][0]["finishReason"] = "STOP"
    _, acc = await run_chat(chat_stream(chat_chunk({"content": "Hi"}), chunk))
    assert acc.stop_reason == "max_tokens"


# -- a {} placeholder before the arguments -----------------------------------------------------


@pytest.mark.parametrize(
    "pieces",
    [["{}", '{"x": 7}'], ["{}", '{"x": ', "7}"], [" {} ", '{"x": 7}'], ["{}", ' {"x": 7} ']],
    ids=["whole", "in-pieces", "spaces", "spaces-after"],
)
async def test_a_placeholder_then_whole_arguments_runs_with_the_arguments(pieces: list[str]) -> None:
    body = chat_stream(
        calls(call(0, "a", "echo", pieces[0])), *(calls(call(0, args=p)) for p in pieces[1:]),
        chat_chunk({}, "tool_calls"),
    )
    engine = await engine_run(body, chat_stream(chat_chunk({"content": "ok"}), chat_chunk({}, "stop")))
    (result,) = engine.messages[2].tool_results
    assert (result.is_error, result.text) == (False, "x=7")


async def test_a_placeholder_then_whole_arguments_is_shown_as_recorded() -> None:
    body = chat_stream(calls(call(0, "a", "f", "{}")), calls(call(0, args='{"x": 7}')), chat_chunk({}, "tool_calls"))
    events, acc = await run_chat(body)
    assert inputs(acc) == [("a", "f", {"x": 7}, None)]
    assert shown_and_recorded(events, acc) == [('{"x": 7}', '{"x": 7}')]


@pytest.mark.parametrize(
    ("pieces", "finish"),
    [(["{}", '{"x": 7'], "tool_calls"),  # the arguments after it are not whole
     (["{}", '{"x": 7}'], "length"),  # the output was cut: nothing is read into it
     (["{}", "[1]"], "tool_calls"),  # not an object
     (["{}", '{"x": 7}', '{"x": 8}'], "tool_calls")],  # two objects after it
)  # fmt: skip
async def test_a_placeholder_before_what_is_not_one_whole_object_is_still_an_error(
    pieces: list[str], finish: str
) -> None:
    body = chat_stream(
        calls(call(0, "a", "f", pieces[0])), *(calls(call(0, args=p)) for p in pieces[1:]), chat_chunk({}, finish)
    )
    events, acc = await run_chat(body)
    ((_, _, _, error),) = inputs(acc)
    assert error is not None and "".join(pieces) in error
    assert shown_and_recorded(events, acc) == [("".join(pieces), "".join(pieces))]


async def test_a_call_with_no_arguments_sent_as_a_placeholder_alone_is_run() -> None:
    body = chat_stream(calls(call(0, "a", "f", "{}")), calls(call(1, "b", "g", "{}")), chat_chunk({}, "tool_calls"))
    events, acc = await run_chat(body)
    assert inputs(acc) == [("a", "f", {}, None), ("b", "g", {}, None)]
    assert shown_and_recorded(events, acc) == [("{}", "{}")] * 2


@settings(max_examples=300, deadline=None)
@given(value=_JSON, cuts=st.lists(st.integers(1, 80), max_size=6), short=st.integers(0, 6),
       finish=st.sampled_from(["tool_calls", "stop", "length"]))  # fmt: skip
@example(value={}, cuts=[], short=0, finish="tool_calls")  # a placeholder alone: the call takes no arguments
@example(value={}, cuts=[1], short=0, finish="tool_calls")
@example(value={"a": {}}, cuts=[5], short=0, finish="tool_calls")  # a "{}" piece inside
async def test_an_ordinary_streams_arguments_cut_anywhere_are_never_changed(
    value: Any, cuts: list[int], short: int, finish: str
) -> None:
    # Whatever the arguments (any JSON text, a placeholder's "{}" itself, or any beginning of it
    # when the token limit cut the output), when they came as pieces of one text the placeholder
    # reading never applies: the call is mapped as with the reading turned off, and whole
    # arguments are exactly the pieces joined.
    text = json.dumps(value)
    if finish == "length":
        text = text[: len(text) - short] or text
    ends = sorted({c for c in cuts if c < len(text)} | {len(text)})
    pieces = [text[a:b] for a, b in zip([0, *ends], ends, strict=False)]
    body = chat_stream(
        calls(call(0, "a", "f", pieces[0])), *(calls(call(0, args=p)) for p in pieces[1:]), chat_chunk({}, finish)
    )
    events, acc = await run_chat(body)
    with mock.patch.object(_stream, "_after_placeholder", lambda text: None):
        unread, unread_acc = await run_chat(body)
    assert shown_and_recorded(events, acc) == shown_and_recorded(unread, unread_acc)
    assert inputs(acc) == inputs(unread_acc)
    if finish != "length" or not short:
        assert shown_and_recorded(events, acc) == [(text, text)]


@settings(max_examples=200, deadline=None)
@given(value=st.dictionaries(st.sampled_from(["a", "b"]), _JSON, min_size=1, max_size=3),
       cuts=st.lists(st.integers(1, 80), max_size=5))  # fmt: skip
async def test_a_placeholder_then_any_object_in_any_pieces_is_that_object(value: dict[str, Any], cuts: list[int]) -> None:
    text = json.dumps(value)
    ends = sorted({c for c in cuts if c < len(text)} | {len(text)})
    pieces = [text[a:b] for a, b in zip([0, *ends], ends, strict=False)]
    body = chat_stream(calls(call(0, "a", "f", "{}")), *(calls(call(0, args=p)) for p in pieces),
                       chat_chunk({}, "tool_calls"))  # fmt: skip
    events, acc = await run_chat(body)
    assert inputs(acc) == [("a", "f", value, None)]
    assert shown_and_recorded(events, acc) == [(text, text)]


# -- calls that share one id at one index ------------------------------------------------------


@pytest.mark.parametrize(
    "second",
    [call(0, "a", "f", '{"x": 2}'), call(0, "a", "g", '{"x": 1}'), call(0, "a", "g", "{}"), call(0, "a", "f", {"x": 2})],
    ids=["other-arguments", "other-name", "other-name-no-arguments", "arguments-as-object"],
)
async def test_a_whole_call_with_the_same_id_at_the_same_index_is_the_next_call(second: dict[str, Any]) -> None:
    # Servers that reuse one id for parallel calls (DeepSeek, GLM, engines behind OpenRouter),
    # all at index 0: a delta that names a call, with whole arguments of its own, after whole ones.
    body = chat_stream(calls(call(0, "a", "f", '{"x": 1}')), calls(second), chat_chunk({}, "tool_calls"))
    _, acc = await run_chat(body)
    args = second["function"]["arguments"]
    assert inputs(acc) == [("a", "f", {"x": 1}, None),
                           ("a", second["function"]["name"], args if type(args) is dict else json.loads(args), None)]  # fmt: skip


@pytest.mark.parametrize(
    "first",
    [['{"q": ', "1}"], ['{"q": 1}'], ['{"q":', " 1", "}"], ['{"q": 1}', " "]],
    ids=["in-pieces", "whole", "three-pieces", "whitespace-after"],
)
@pytest.mark.parametrize("repeat", ['{"q": 1}', '{"q":1}', {"q": 1}], ids=["same-text", "other-spacing", "object"])
async def test_an_identical_whole_repeat_before_the_finish_chunk_is_a_resend_run_once(
    first: list[str], repeat: Any, caplog: pytest.LogCaptureFixture
) -> None:
    # GLM-style servers resend the whole call (its id, name and arguments) once its arguments are
    # whole, on a chunk of its own before the finish chunk: one call, run once, with a warning.
    # Two identical calls sharing one id, whole one per chunk, look just the same: read as one
    # (a tool run twice is worse than a duplicate call missed), and the warning says so.
    body = chat_stream(
        calls(call(0, "c1", "echo", first[0])), *(calls(call(0, args=p)) for p in first[1:]),
        calls(call(0, "c1", "echo", repeat)), chat_chunk({}, "tool_calls"),
    )
    with caplog.at_level(logging.WARNING, "agentloop"):
        events, acc = await run_chat(body)
    assert inputs(acc) == [("c1", "echo", {"q": 1}, None)]
    assert shown_and_recorded(events, acc) == [("".join(first), "".join(first))]
    (record,) = [r for r in caplog.records if "again" in r.getMessage()]
    assert "'c1'" in record.getMessage() and "'echo'" in record.getMessage()


async def test_an_identical_whole_repeat_is_run_once_by_the_engine() -> None:
    same = call(0, "call_0", "echo", '{"x": 1}')
    first = chat_stream(calls(same), calls(same), calls(same), chat_chunk({}, "tool_calls"))
    engine = await engine_run(first, chat_stream(chat_chunk({"content": "ok"}), chat_chunk({}, "stop")))
    assert [u.input for u in engine.messages[1].tool_uses] == [{"x": 1}]
    assert [r.text for r in engine.messages[2].tool_results] == ["x=1"]


@pytest.mark.parametrize(
    "repeat",
    [call(0, "c1", "other", '{"q": 1}'), call(0, "c1", "echo", '{"q": 2}'), call(0, "c1", "echo", '{"q": 1, "r": 0}')],
    ids=["other-name", "other-arguments", "more-arguments"],
)
async def test_a_repeat_of_the_id_with_another_name_or_other_arguments_after_pieces_is_the_next_call(
    repeat: dict[str, Any],
) -> None:
    body = chat_stream(
        calls(call(0, "c1", "echo", '{"q": ')), calls(call(0, args="1}")), calls(repeat), chat_chunk({}, "tool_calls")
    )
    _, acc = await run_chat(body)
    fn = repeat["function"]
    assert inputs(acc) == [("c1", "echo", {"q": 1}, None), ("c1", fn["name"], json.loads(fn["arguments"]), None)]


async def test_an_identical_call_on_the_finish_chunk_is_read_as_a_resend_with_a_warning(
    caplog: pytest.LogCaptureFixture,
) -> None:
    # GLM-style servers (vLLM's glm parsers repeat the id and name) send the whole arguments again
    # on the finish chunk: one call, and the log says how it was read.
    same = call(0, "a", "f", '{"x": 1}')
    body = chat_stream(calls(same), chat_chunk({"tool_calls": [same]}, "tool_calls"))
    with caplog.at_level(logging.WARNING, "agentloop"):
        _, acc = await run_chat(body)
    assert inputs(acc) == [("a", "f", {"x": 1}, None)]
    (record,) = [r for r in caplog.records if "again" in r.getMessage()]
    assert "'a'" in record.getMessage() and "'f'" in record.getMessage()


async def test_a_call_with_the_same_id_after_whitespace_pieces_is_the_next_call() -> None:
    body = chat_stream(
        calls(call(0, "a", "f", '{"x": ')), calls(call(0, "a", "f", "1}")), calls(call(0, "a", "f", " ")),
        calls(call(0, "a", "g", '{"y": 2}')), chat_chunk({}, "tool_calls"),
    )
    _, acc = await run_chat(body)
    assert inputs(acc) == [("a", "f", {"x": 1}, None), ("a", "g", {"y": 2}, None)]


def test_pieces_with_the_id_and_name_repeated_are_not_all_parsed_again_at_each_piece() -> None:
    # vLLM's id and name on every piece: the check for a next call with the same id parses the
    # arguments so far only where they could be whole (they end with "}"), not at every piece.
    mapper, parsed = _stream.ChatMapper(), []
    real = _stream.loads

    def counting(text: str) -> Any:
        parsed.append(len(text))
        return real(text)

    pieces = ['{"rows": [', *(['{"a": ', "1}, "] * 300), '{"a": 1}]}']
    with mock.patch.object(_stream, "loads", counting):
        for piece in pieces:
            mapper._chunk(calls(call(0, "a", "f", piece)))
    assert sum(parsed) < 20 * len("".join(pieces))


@pytest.mark.parametrize(
    "pieces",
    [['{"tex": "', *([r"\\frac{a}", "{b}"] * 2000), '"}'],  # LaTeX in a string
     ['{"m": [{"s": "', *(["x}", "{y"] * 2000), '"}]}'],  # a string in an object in a list
     ['{"s": "', *([r'\\\"}', r"{\\\\"] * 2000), '"}']],  # escaped quotes and backslashes
    ids=["latex", "nested", "escapes"],
)  # fmt: skip
def test_pieces_ending_with_a_brace_before_one_starting_with_one_are_scanned_once(pieces: list[str]) -> None:
    # vLLM's id and name on every piece, and arguments so far that end with "}" before a piece
    # that starts with "{" (in valid JSON, only inside a string: LaTeX): the arguments are not
    # joined and parsed again at each such piece, only where they may be whole.
    mapper, parsed = _stream.ChatMapper(), []
    real = _stream.loads

    def counting(text: str) -> Any:
        parsed.append(len(text))
        return real(text)

    events: list[Any] = []
    with mock.patch.object(_stream, "loads", counting):
        for piece in pieces:
            events.extend(mapper._chunk(calls(call(0, "a", "f", piece))) or ())
        events.extend(mapper._chunk(chat_chunk({}, "tool_calls")) or ())
        events.extend(mapper._end())
    text = "".join(pieces)
    assert sum(parsed) < 4 * len(text)
    assert [type(e).__name__ for e in events].count("StreamToolUseStart") == 1
    assert "".join(e.partial_json for e in events if type(e).__name__ == "StreamToolInput") == text


_TRICKY = st.text(alphabet='{}[]"\\ a', max_size=5)  # braces, quotes and backslashes in strings
_VALUES = st.recursive(
    st.none() | st.integers(-9, 99) | _TRICKY,
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(_TRICKY, inner, max_size=3),
    max_leaves=10,
)


@settings(max_examples=300, deadline=None)
@given(value=st.dictionaries(_TRICKY, _VALUES, max_size=3), copies=st.integers(1, 3),
       cuts=st.lists(st.integers(1, 300), max_size=8), indent=st.sampled_from([None, 1]))  # fmt: skip
def test_the_shape_of_arguments_in_any_pieces_says_whole_only_after_one_or_two_objects(
    value: dict[str, Any], copies: int, cuts: list[int], indent: int | None
) -> None:
    # The cheap test before a parse: true after any piece that ends one whole object, or two
    # (a placeholder and the arguments, or the arguments resent), never inside one or after three.
    one = json.dumps(value, indent=indent)
    text = " ".join([one] * copies)
    ends = sorted({c for c in cuts if c < len(text)} | {len(text)})
    shape, start = _stream._Shape(), 0
    for end in ends:
        shape.feed(text[start:end])
        start = end
        assert shape.may_be_whole() == (text[:end].rstrip() in (one, f"{one} {one}")), text[:end]


async def test_an_id_and_name_on_every_piece_and_an_empty_last_piece_keep_one_call() -> None:
    body = chat_stream(
        calls(call(0, "a", "f", '{"x": 1}')), calls(call(0, "a", "f", "")), calls(call(0, "a", "f", " ")),
        chat_chunk({}, "tool_calls"),
    )
    _, acc = await run_chat(body)
    assert inputs(acc) == [("a", "f", {"x": 1}, None)]


# -- Azure OpenAI, empty and null parts ----------------------------------------------------------

_FILTERS = {"hate": {"filtered": False, "severity": "safe"}, "violence": {"filtered": False, "severity": "safe"}}


def azure(choice: dict[str, Any] | None, **top: Any) -> dict[str, Any]:
    """A chunk as Azure OpenAI sends it: a choice with its ``content_filter_results``, or none."""
    chunk: dict[str, Any] = {"id": "chatcmpl-az", "object": "chat.completion.chunk", "created": 1, "model": "gpt-4o",
                             "choices": [] if choice is None else [{"index": 0, "content_filter_results": {}, **choice}]}  # fmt: skip
    chunk.update(top)
    return chunk


async def test_an_azure_stream_with_its_content_filter_chunks_is_read_as_the_answer() -> None:
    usage = {"prompt_tokens": 9, "completion_tokens": 2, "total_tokens": 11}
    body = chat_stream(
        azure(None, id="", model="", object="", created=0,
              prompt_filter_results=[{"prompt_index": 0, "content_filter_results": _FILTERS}]),
        azure({"delta": {"role": "assistant", "content": ""}, "finish_reason": None, "logprobs": None}),
        azure({"delta": {"content": "Hi"}, "finish_reason": None, "content_filter_results": _FILTERS}),
        azure({"delta": {}, "finish_reason": "stop"}),
        # Asynchronous filtering: the verdict on the last of the text, after the finish, with no delta.
        azure({"finish_reason": None, "content_filter_results": _FILTERS,
               "content_filter_offsets": {"check_offset": 0, "start_offset": 0, "end_offset": 2}}, id="", model=""),
        azure(None, usage=usage),
    )  # fmt: skip
    _, acc = await run_chat(body)
    assert (acc.message().text, acc.stop_reason, acc.usage.input_tokens, acc.response_id) == ("Hi", "end_turn", 9, "chatcmpl-az")


async def test_an_azure_content_filter_finish_is_a_refusal() -> None:
    blocked = {**_FILTERS, "violence": {"filtered": True, "severity": "high"}}
    body = chat_stream(azure({"delta": {"content": "Par"}}), azure({"delta": {}, "finish_reason": "content_filter",
                                                                    "content_filter_results": blocked}))  # fmt: skip
    _, acc = await run_chat(body)
    assert (acc.message().text, acc.stop_reason) == ("Par", "refusal")


async def test_null_and_empty_parts_and_a_role_on_every_delta_are_read_as_nothing_more() -> None:
    body = chat_stream(
        {"id": "chatcmpl-1", "choices": None},
        {"id": "chatcmpl-1", "choices": []},
        chat_chunk({"role": "assistant", "content": "He"}),
        {"id": "chatcmpl-1", "choices": [{"index": 0, "delta": None, "finish_reason": None}]},
        chat_chunk({"role": "assistant", "content": "llo", "tool_calls": []}),
        chat_chunk({"role": "assistant"}, "stop", usage={"prompt_tokens": 3, "completion_tokens": 2}),
    )
    _, acc = await run_chat(body)
    assert (acc.message().text, acc.stop_reason, acc.usage.output_tokens) == ("Hello", "end_turn", 2)


@pytest.mark.parametrize("indexes", [[1, 2], [0, 2], [3, 1], [5, 0]], ids=["from-1", "gap", "descending", "gap-down"])
async def test_tool_call_indexes_with_gaps_keep_every_call_in_the_order_it_began(indexes: list[int]) -> None:
    first, second = indexes
    body = chat_stream(
        calls(call(first, "a", "f", '{"x": ')), calls(call(second, "b", "g", '{"y": ')),
        calls(call(first, args="1}"), call(second, args="2}")), chat_chunk({}, "tool_calls"),
    )
    _, acc = await run_chat(body)
    assert inputs(acc) == [("a", "f", {"x": 1}, None), ("b", "g", {"y": 2}, None)]


@pytest.mark.parametrize(
    "choices",
    [{"index": 0}, [None], ["text"], [{"index": 0, "delta": "text"}], [{"index": 0, "delta": {"tool_calls": {"x": 1}}}]],
    ids=["an-object", "null", "a-string", "delta-a-string", "calls-an-object"],
)
async def test_choices_of_another_shape_are_a_protocol_error_not_a_crash(choices: Any) -> None:
    body = chat_stream(chat_chunk({"content": "Hi"}), {"id": "chatcmpl-1", "choices": choices}, chat_chunk({}, "stop"))
    with pytest.raises(StreamProtocolError, match="malformed chunk"):
        await run_chat(body)


@settings(max_examples=150, deadline=None)
@given(sent=st.lists(st.tuples(st.sampled_from(["f", "g"]), st.dictionaries(st.sampled_from(["x", "y"]),
                                                                             st.integers(0, 2), max_size=2)),
                     min_size=1, max_size=4),
       same_id=st.booleans())  # fmt: skip
async def test_whole_calls_at_one_index_one_per_chunk_are_each_kept_once(
    sent: list[tuple[str, dict[str, Any]]], same_id: bool
) -> None:
    # Whole calls one after another at index 0, with one id for all or one each, identical or
    # not: each call once, with its own input, none merged, none doubled; with one id, a call
    # identical to the one before it is that call resent.
    chunks = [calls(call(0, "a" if same_id else f"c{k}", name, json.dumps(args))) for k, (name, args) in enumerate(sent)]
    _, acc = await run_chat(chat_stream(*chunks, chat_chunk({}, "tool_calls")))
    # With one id, a call identical to the one before it is a resend of it (one call).
    expected = [s for k, s in enumerate(sent) if not (same_id and k and s == sent[k - 1])]
    assert [(n, i, e) for _, n, i, e in inputs(acc)] == [(name, args, None) for name, args in expected]
