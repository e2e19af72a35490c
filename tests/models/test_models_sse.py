"""SSEDecoder: the WHATWG framing rules of WIRE.md §0.1, under any chunking."""

from __future__ import annotations

import itertools

import pytest
from _models_support import API_KEY, FIXTURES, MockServer, chat_chunk, chat_stream, collect, split
from hypothesis import given, settings
from hypothesis import strategies as st

from agentloop._errors import StreamProtocolError
from agentloop.models import OpenAIChatModel, ServerSentEvent, SSEDecoder, _sse


def decode(*chunks: bytes, error_field: bool = False) -> list[ServerSentEvent]:
    dec = SSEDecoder(error_field=error_field)
    out: list[ServerSentEvent] = []
    for c in chunks:
        out += dec.feed(c)
    out += dec.close()
    return out


def test_basic_event_and_data() -> None:
    (ev,) = decode(b"event: ping\ndata: {}\n\n")
    assert (ev.event, ev.data) == ("ping", "{}")


def test_all_line_endings() -> None:
    for sep in (b"\n", b"\r\n", b"\r"):
        body = b"event: a" + sep + b"data: 1" + sep + sep + b"data: 2" + sep + sep
        assert [(e.event, e.data) for e in decode(body)] == [("a", "1"), (None, "2")]


def test_crlf_split_across_chunks_is_one_line_break() -> None:
    events = decode(b"data: 1\r", b"\n\r", b"\ndata: 2\r\n\r\n")
    assert [e.data for e in events] == ["1", "2"]


def test_lone_cr_at_chunk_end_then_text() -> None:
    assert [e.data for e in decode(b"data: 1\r", b"\rdata: 2\r\r")] == ["1", "2"]


def test_multiline_data_joined_with_newline() -> None:
    (ev,) = decode(b"data: a\ndata:b\ndata\n\n")
    assert ev.data == "a\nb\n"


def test_one_leading_space_stripped_only() -> None:
    (ev,) = decode(b"data:  two spaces\n\n")
    assert ev.data == " two spaces"


def test_comments_and_unknown_fields_ignored() -> None:
    (ev,) = decode(b": keep-alive\nfoo: bar\nerror: {}\ndata: x\n\n")
    assert (ev.event, ev.data) == (None, "x")


def test_id_and_retry_parsed() -> None:
    dec = SSEDecoder()
    (ev,) = dec.feed(b"id: 42\nretry: 1500\nretry: soon\ndata: x\n\n")
    assert ev.id == "42"
    assert dec.last_event_id == "42"
    assert dec.retry == 1500


def test_dispatch_only_on_blank_line_and_only_with_data() -> None:
    assert decode(b"event: a\n\n") == []
    assert decode(b"data: unterminated\n") == []  # dropped at EOF
    assert decode(b"data: unterminated") == []


def test_event_name_reset_after_dispatch() -> None:
    events = decode(b"event: a\ndata: 1\n\ndata: 2\n\n")
    assert [e.event for e in events] == ["a", None]


def test_utf8_split_across_chunks() -> None:
    body = "data: héllo - 😀\n\n".encode()
    cut = body.index("😀".encode()) + 2
    (ev,) = decode(body[:cut], body[cut:])
    assert ev.data == "héllo - 😀"


@pytest.mark.parametrize("cut", range(5))
def test_a_leading_byte_order_mark_is_dropped_wherever_the_chunks_split(cut: int) -> None:
    # A .NET server writing UTF-8 "with BOM": the first line would read "\ufeffdata: ..."
    # and the first event (the first chunk of a response) would be lost.
    body = b"\xef\xbb\xbfdata: first\n\ndata: \xef\xbb\xbfsecond\n\n"
    events = decode(body[:cut], body[cut:])
    assert [e.data for e in events] == ["first", "\ufeffsecond"]  # only the stream's first BOM goes


async def test_a_stream_that_starts_with_a_byte_order_mark_loses_nothing() -> None:
    body = b"\xef\xbb\xbf" + chat_stream(chat_chunk({"content": "Hello"}), chat_chunk({"content": "!"}, finish="stop"))
    server = MockServer(body)
    async with server.client() as client:
        _, acc = await collect(OpenAIChatModel("m", api_key=API_KEY, http_client=client))
    assert acc.message().text == "Hello!"


def test_error_field_extension_for_llama_cpp() -> None:
    body = b'error: {"message":"boom"}\n\ndata: [DONE]\n\n'
    assert [e.data for e in decode(body)] == ["[DONE]"]
    events = decode(body, error_field=True)
    assert [(e.event, e.data) for e in events] == [("error", '{"message":"boom"}'), (None, "[DONE]")]


BODY = (
    'event: a\r\ndata: 1\r\n\r\n: c\rdata: ü\rdata: 2\r\rid: 7\ndata: {"k": "v"}\n\nevent: e\ndata:\n\n'
).encode()


@settings(max_examples=300, deadline=None)
@given(st.lists(st.integers(min_value=1, max_value=len(BODY) - 1), max_size=12))
def test_any_chunking_gives_the_same_events(cuts: list[int]) -> None:
    points = sorted(set(cuts))
    edges = [0, *points, len(BODY)]
    chunks = [BODY[a:b] for a, b in itertools.pairwise(edges)]
    assert decode(*chunks) == decode(BODY)
    assert [e.data for e in decode(BODY)] == ["1", "ü\n2", '{"k": "v"}', ""]


@pytest.mark.parametrize(
    "piece",
    [b"x" * 100, b"data: " + b"y" * 94 + b"\n", b": keep me waiting\r"],
    ids=["one-line-never-ends", "data-lines-never-blank", "comment-lines-only-cr"],
)
def test_an_event_that_never_ends_is_an_error_once_past_the_limit_not_unbounded_memory(piece: bytes) -> None:
    dec = SSEDecoder(max_event_bytes=10_000)
    assert dec.feed(b"data: ok\n\n")[0].data == "ok"
    with pytest.raises(StreamProtocolError, match="10000 bytes") as info:
        for _ in range(1000):
            assert dec.feed(piece) == []
    assert info.value.retryable is False


def test_events_that_end_reset_the_limit() -> None:
    dec = SSEDecoder(max_event_bytes=100)
    for _ in range(100):
        assert [e.data for e in dec.feed(b"data: " + b"z" * 60 + b"\n\n")] == ["z" * 60]


def test_the_default_limit_is_far_above_any_real_event() -> None:
    assert SSEDecoder().max_event_bytes == 64 * 1024 * 1024


async def test_a_body_that_never_ends_its_line_fails_the_stream(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(_sse, "MAX_EVENT_BYTES", 4096)
    server = MockServer([b"data: " + b"{" * 1000] * 10)
    async with server.client() as client:
        with pytest.raises(StreamProtocolError, match="4096 bytes"):
            await collect(OpenAIChatModel("m", api_key=API_KEY, http_client=client))
    assert server.streams[0].closed


_WIRE = {p.name: p.read_bytes() for p in sorted(FIXTURES.glob("*.sse"))}


@st.composite
def _reframed(draw: st.DrawFn) -> tuple[bytes, bytes]:
    """A fixture, and the same stream with each line ending drawn from LF, CRLF and CR, maybe a
    byte order mark in front (a CR is never followed by an LF that ends the next, empty line:
    the two would be one CRLF)."""
    body = _WIRE[draw(st.sampled_from(sorted(_WIRE)))]
    lines = body.split(b"\n")
    out = [b"\xef\xbb\xbf"] if draw(st.booleans()) else []
    previous = b""
    for line in lines[:-1]:
        choices = [b"\r\n", b"\r"] if previous == b"\r" and not line else [b"\n", b"\r\n", b"\r"]
        previous = draw(st.sampled_from(choices))
        out += [line, previous]
    out.append(lines[-1])
    return body, b"".join(out)


@settings(max_examples=200, deadline=None)
@given(_reframed(), st.data())
def test_every_fixture_reframed_and_rechunked_gives_the_same_events(framed: tuple[bytes, bytes], data: st.DataObject) -> None:
    body, reframed = framed
    cuts = data.draw(st.lists(st.integers(1, len(reframed) - 1), max_size=40))
    assert decode(*split(reframed, cuts)) == decode(body)
