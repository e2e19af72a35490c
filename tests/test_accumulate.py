"""The accumulator's own decisions: tool input decoding and usage arithmetic."""

from __future__ import annotations

import json
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from agentloop import QueryEngine, TurnEnded, validate_transcript
from agentloop._accumulate import Accumulator
from agentloop._messages import Message, ProviderBlock, RedactedThinkingBlock, TextBlock, ThinkingBlock
from agentloop._model import (
    StreamBlockStop,
    StreamEnd,
    StreamProviderBlock,
    StreamRedactedThinking,
    StreamSignature,
    StreamText,
    StreamThinking,
    StreamToolInput,
    StreamToolUseStart,
    Usage,
)

_JSON = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False) | st.text(max_size=8),
    lambda children: st.lists(children, max_size=3) | st.dictionaries(st.text(max_size=5), children, max_size=3),
    max_leaves=8,
)
_NOISE = st.sampled_from(["", " ", "\n", "\t", "\r\n", "\x0c", "\u00a0", "x", "}", ",", "{"])


def _input_of(body: str) -> tuple[dict[str, Any], str | None]:
    acc = Accumulator()
    for event in (StreamToolUseStart(0, "toolu_1", "t"), StreamToolInput(0, body), StreamBlockStop(0), StreamEnd()):
        acc.feed(event)
    use = acc.message().tool_uses[0]
    return use.input, use.input_error


def _reject(name: str) -> Any:
    raise ValueError(f"{name} is not a JSON value")


def strict_loads(text: str) -> Any:
    """json.loads without Python's extensions (NaN, Infinity): JSON as providers parse it."""
    return json.loads(text, parse_constant=_reject)


@given(value=_JSON, before=_NOISE, after=_NOISE)
def test_property_tool_input_decodes_exactly_as_json_loads(value: Any, before: str, after: str) -> None:
    body = before + json.dumps(value) + after
    got, error = _input_of(body)
    try:
        expected = strict_loads(body)
    except ValueError as exc:
        assert error is not None and str(exc) in error  # json.loads's own message
        return
    if isinstance(expected, dict):
        assert error is None and got == expected
    else:
        assert error is not None and "must be a JSON object" in error


@given(text=st.text(max_size=12))
def test_property_any_text_as_tool_input_matches_json_loads(text: str) -> None:
    got, error = _input_of(text)
    if not text.strip():
        assert (got, error) == ({}, None)  # no input at all: an empty object
        return
    try:
        expected = strict_loads(text)
    except ValueError:
        assert error is not None and got == {}
        return
    assert (got, error) == ((expected, None) if isinstance(expected, dict) else ({}, error))


@pytest.mark.parametrize("constant", ["NaN", "Infinity", "-Infinity"])
def test_nan_or_infinity_in_a_tool_input_is_an_input_error(constant: str) -> None:
    # Python's json reads them; JSON has no such values, and a provider would reject every
    # later request that echoed the call back with them.
    got, error = _input_of(f'{{"x": 1, "y": {constant}}}')
    assert got == {}
    assert error is not None and f"{constant.lstrip('-')} is not a JSON value" in error


_DEEP = [(5000, inner, closed) for inner in ("1", '"\\ud800"') for closed in (True, False)]


@pytest.mark.parametrize(("depth", "inner", "closed"), [*_DEEP, (700, '"\\ud800"', True)])
def test_a_tool_input_nested_too_deeply_is_an_input_error_never_a_recursion_error(
    depth: int, inner: str, closed: bool
) -> None:
    # A model stuck repeating "[" in its arguments: past Python's recursion limit json raises
    # RecursionError, and so does the scrub of a lone surrogate in a value json could still
    # decode (700 levels); neither may escape the accumulator.
    body = '{"path": ' + "[" * depth + inner + ("]" * depth + "}" if closed else "")
    got, error = _input_of(body)
    assert got == {}
    assert error is not None and "nested too deeply" in error


@pytest.mark.parametrize("inner", ["1", '"\\ud800"'])
def test_a_tool_input_is_refused_past_the_json_depth_limit_on_every_python(inner: str) -> None:
    """The limit is the library's, not the interpreter's (3.12 and 3.13 decode far deeper
    than 3.11): the deepest input allowed decodes, one level more is an input error."""
    from agentloop._jsondepth import MAX_JSON_DEPTH

    def body(levels: int) -> str:  # the input object is a level of its own
        return '{"path": ' + "[" * (levels - 1) + inner + "]" * (levels - 1) + "}"

    got, error = _input_of(body(MAX_JSON_DEPTH))
    assert error is None and str(got["path"]).startswith("[[[")
    got, error = _input_of(body(MAX_JSON_DEPTH + 1))
    assert got == {} and error is not None and "nested too deeply" in error


def test_usage_adds_and_merges_without_losing_counts() -> None:
    zero, some = Usage(), Usage(3, 4, 1, 2)
    assert not zero and some
    assert zero + some is some and some + zero is some  # nothing new: no new object
    assert some + some == Usage(6, 8, 2, 4)
    acc = Accumulator()
    assert acc.usage == zero
    acc.feed(StreamEnd(usage=Usage(5, 0)))
    assert acc.usage == Usage(5, 0)
    acc.feed(StreamEnd(usage=Usage(0, 7)))
    assert acc.usage == Usage(5, 7)  # each count keeps its latest non-zero report


def test_a_later_signature_replaces_the_earlier_one() -> None:
    # Anthropic's signature_delta carries the whole signature (its SDK replaces, too):
    # appending a second one would make a signature the API rejects.
    acc = Accumulator()
    for event in (
        StreamThinking(0, "hmm"),
        StreamSignature(0, "AAAA"),
        StreamSignature(0, "BBBB"),
        StreamBlockStop(0),
        StreamEnd(),
    ):
        acc.feed(event)
    (block,) = acc.message().content
    assert isinstance(block, ThinkingBlock)
    assert (block.thinking, block.signature) == ("hmm", "BBBB")


def test_thinking_keeps_the_origin_its_model_streamed() -> None:
    acc = Accumulator()
    for event in (
        StreamThinking(0, "hmm"),
        StreamSignature(0, "AAAA", origin="https://a.test"),
        StreamRedactedThinking(1, "opaque", origin="https://a.test"),
        StreamThinking(2, "more"),
        StreamSignature(2, "BBBB"),
        StreamEnd(),
    ):
        acc.feed(event)
    made = [acc.message().content, acc.committable().content]  # type: ignore[union-attr]
    assert made[0] == made[1] == [
        ThinkingBlock(thinking="hmm", signature="AAAA", origin="https://a.test"),
        RedactedThinkingBlock(data="opaque", origin="https://a.test"),
        ThinkingBlock(thinking="more", signature="BBBB"),
    ]


class _WrongTypes:
    """A custom model that streams a field of the wrong type after some good text."""

    def __init__(self, bad: object) -> None:
        self.bad = bad

    async def stream(self, request: object, signal: object) -> Any:
        yield StreamText(0, "partial ")
        yield self.bad
        yield StreamBlockStop(0)
        yield StreamEnd(stop_reason="end_turn")


@pytest.mark.parametrize(
    "bad",
    [
        StreamText(0, 5),  # type: ignore[arg-type]
        StreamText(0, ["a", "b"]),  # type: ignore[arg-type]
        StreamThinking(1, None),  # type: ignore[arg-type]
        StreamToolUseStart(2, 7, "read"),  # type: ignore[arg-type]
        StreamToolInput(2, {"path": "a"}),  # type: ignore[arg-type]
        StreamSignature(1, b"sig"),  # type: ignore[arg-type]
        StreamSignature(1, "sig", origin=["https://a.test"]),  # type: ignore[arg-type]
        StreamRedactedThinking(1, "data", origin=443),  # type: ignore[arg-type]
    ],
    ids=[
        "int-text",
        "list-text",
        "null-thinking",
        "int-id",
        "dict-arguments",
        "bytes-signature",
        "list-origin",
        "int-origin",
    ],
)
async def test_a_custom_model_streaming_a_field_of_the_wrong_type_ends_the_turn_not_the_run(bad: object) -> None:
    engine = QueryEngine(_WrongTypes(bad), policies=[], retry_budget=0)  # type: ignore[arg-type]
    events = [e async for e in engine.run("go")]
    end = events[-1]
    assert isinstance(end, TurnEnded) and end.reason == "model_error"
    assert end.error is not None and f"{type(bad).__name__}'s " in end.error and ", not a str" in end.error
    assert validate_transcript(engine.messages) == []
    assert engine.messages[-1].text == "partial"  # what streamed before it is kept, as for any failure


@pytest.mark.parametrize("index", ["0", None, 1.0, True, [0]], ids=["str", "null", "float", "bool", "list"])
@pytest.mark.parametrize(
    "make",
    [
        lambda i: StreamText(i, "x"),
        lambda i: StreamThinking(i, "x"),
        lambda i: StreamToolUseStart(i, "t1", "read"),
        lambda i: StreamToolInput(i, "{}"),
        lambda i: StreamSignature(i, "sig"),
        lambda i: StreamBlockStop(i),
    ],
    ids=["text", "thinking", "tool-start", "tool-input", "signature", "stop"],
)
async def test_a_custom_model_streaming_an_index_that_is_not_an_int_ends_the_turn_not_the_run(
    index: object, make: Any
) -> None:
    engine = QueryEngine(_WrongTypes(make(index)), policies=[], retry_budget=0)  # type: ignore[arg-type]
    events = [e async for e in engine.run("go")]
    end = events[-1]
    assert isinstance(end, TurnEnded) and end.reason == "model_error"
    assert end.error is not None and "index" in end.error and type(index).__name__ in end.error
    assert validate_transcript(engine.messages) == []


_PIECES = st.sampled_from(["", " ", "\n", "a", "b c", "x \n", "\ud800", "{", "}", '{"k": 1}', "[1]"])


@st.composite
def _stream(draw: st.DrawFn) -> list[Any]:
    """Blocks of every kind, each closed or left open, whitespace and surrogates included, with or
    without the end event (and a stop reason that cuts the output, or not)."""
    events: list[Any] = []
    for index in range(draw(st.integers(0, 4))):
        kind = draw(st.sampled_from(["text", "thinking", "tool_use", "redacted"]))
        if kind == "tool_use":
            events.append(StreamToolUseStart(index, f"toolu_{index}", "t"))
        if kind == "redacted":
            events.append(StreamRedactedThinking(index, "cmVk"))
            continue
        for piece in draw(st.lists(_PIECES, max_size=3)):
            if kind == "text":
                events.append(StreamText(index, piece))
            elif kind == "thinking":
                events.append(StreamThinking(index, piece))
            else:
                events.append(StreamToolInput(index, piece))
        if kind == "thinking" and draw(st.booleans()):
            events.append(StreamSignature(index, draw(st.sampled_from(["", "sig"]))))
        if draw(st.booleans()):
            events.append(StreamBlockStop(index))
    if draw(st.booleans()):
        events.append(StreamEnd(stop_reason=draw(st.sampled_from(["end_turn", "tool_use", "max_tokens"]))))
    return events


def clean_assistant(message: Message) -> Message | None:
    """The reference: the streamed message without the blocks `validate_transcript` calls
    droppable, trailing whitespace stripped from the last text block if only thinking follows
    it (None: nothing left)."""
    from agentloop._messages import text_block
    from agentloop._transcript import droppable as _droppable

    kept = [b for b in message.content if _droppable(b) is None]
    if not kept:
        return None
    end = len(kept) - 1
    while end >= 0 and isinstance(kept[end], ThinkingBlock | RedactedThinkingBlock):
        end -= 1
    last = kept[end] if end >= 0 else None
    if isinstance(last, TextBlock) and last.text != last.text.rstrip():
        kept[end] = text_block(last.text.rstrip())
    return message.model_copy(update={"content": kept})


@pytest.mark.parametrize("after", [["thinking"], ["redacted"], ["thinking", "redacted"], ["tool_use"], []])
def test_committed_text_followed_only_by_thinking_ends_without_whitespace(after: list[str]) -> None:
    # The end of the message as a request sends it (thinking is left out at the end of a turn).
    acc = Accumulator()
    for event in [StreamText(0, "Let me see  \n"), StreamBlockStop(0)]:
        acc.feed(event)
    for index, kind in enumerate(after, 1):
        if kind == "thinking":
            acc.feed(StreamThinking(index, "hmm"))
            acc.feed(StreamSignature(index, "sig"))
        elif kind == "redacted":
            acc.feed(StreamRedactedThinking(index, "cmVk"))
        else:
            acc.feed(StreamToolUseStart(index, "toolu_1", "t"))
            acc.feed(StreamToolInput(index, "{}"))
        acc.feed(StreamBlockStop(index))
    acc.feed(StreamEnd(stop_reason="end_turn"))
    got = acc.committable()
    assert got is not None and len(got.content) == 1 + len(after)
    assert got.content[0] == TextBlock(text="Let me see  \n" if after == ["tool_use"] else "Let me see")


@given(events=_stream(), partial=st.booleans())
def test_property_committable_is_the_cleaned_message(events: list[Any], partial: bool) -> None:
    acc = Accumulator()
    for event in events:
        acc.feed(event)
    got = acc.committable(partial=partial)
    expected = clean_assistant(acc.message(partial=partial))
    if expected is None:
        assert got is None
    else:
        assert got is not None and got.model_dump() == expected.model_dump() and got == expected


class _EndsWith:
    """A model whose stream ends with ``end`` after some text."""

    def __init__(self, end: object) -> None:
        self.end = end

    async def stream(self, request: object, signal: object) -> Any:
        yield StreamText(0, "partial ")
        yield StreamBlockStop(0)
        yield self.end


@pytest.mark.parametrize("reason", [["end_turn"], {"type": "stop"}, 7], ids=["list", "dict", "int"])
async def test_a_stop_reason_that_is_not_a_str_ends_the_turn_not_the_run(reason: object) -> None:
    engine = QueryEngine(_EndsWith(StreamEnd(stop_reason=reason)), policies=[], retry_budget=0)  # type: ignore[arg-type]
    events = [e async for e in engine.run("go")]
    end = events[-1]
    assert isinstance(end, TurnEnded) and end.reason == "model_error"
    assert end.error is not None and "stop_reason" in end.error and type(reason).__name__ in end.error
    assert validate_transcript(engine.messages) == []
    assert engine.messages[-1].text == "partial"


def _nested(depth: int) -> dict[str, Any]:
    data: dict[str, Any] = {"leaf": 1}
    for _ in range(depth):
        data = {"a": data}
    return data


@pytest.mark.parametrize("depth", [150, 600, 900])
async def test_a_provider_block_nested_too_deeply_ends_the_turn_not_the_run(depth: int) -> None:
    # Every later request (and the session file) would have to encode it: past the interpreter's
    # recursion limit, committing it crashed run() with a RecursionError.
    block = StreamProviderBlock(1, "anthropic", {"type": "web_search_tool_result", "content": _nested(depth)})
    engine = QueryEngine(_WrongTypes(block), policies=[], retry_budget=0)  # type: ignore[arg-type]
    events = [e async for e in engine.run("go")]
    end = events[-1]
    assert isinstance(end, TurnEnded) and end.reason == "model_error"
    assert end.error is not None and "nested" in end.error
    assert validate_transcript(engine.messages) == []
    assert engine.messages[-1].text == "partial"


def test_a_provider_block_nested_as_deeply_as_real_ones_is_kept() -> None:
    acc = Accumulator()
    data = {"type": "mcp_tool_result", "content": _nested(60)}
    acc.feed(StreamProviderBlock(0, "anthropic", data))
    acc.feed(StreamEnd())
    (block,) = acc.message().content
    assert isinstance(block, ProviderBlock) and block.data == data
