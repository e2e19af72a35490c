"""Two shapes of OpenAI-compatible servers and proxies that carry nothing of the answer, or carry
the server's failure in a shape of its own:

- An event whose data is empty or only whitespace (``data:`` or ``data: `` then the blank line),
  which some proxies send as a keep-alive. The event-stream rules dispatch it (the data buffer
  holds the line break of its ``data`` line), with data ``""``; it holds no JSON, nothing of the
  answer, so each provider passes over it, in any place of the stream.
- Older vLLM (and other servers built on its protocol classes) write an error as a flat object,
  ``{"object": "error", "message", "type", "param", "code": <int HTTP status>}``, with no
  ``error`` key: in the stream after the 200, or as the whole body of a 200.
"""

from __future__ import annotations

import json
from typing import Any

import pytest
from _models_support import API_KEY, MockServer, chat_chunk, chat_stream, collect, final, load
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from agentloop._errors import (
    PromptTooLongError,
    ProviderStatusError,
    ProviderStreamError,
    StreamProtocolError,
)
from agentloop.models import AnthropicModel, OpenAIChatModel, OpenAIResponsesModel

#: Each provider's class, and a whole recorded stream it reads.
STREAMS: dict[str, tuple[type[Any], str]] = {
    "anthropic": (AnthropicModel, "anthropic_text.sse"),
    "openai_chat": (OpenAIChatModel, "openai_chat_text.recorded.sse"),
    "openai_responses": (OpenAIResponsesModel, "openai_responses_text.prism.sse"),
}

#: Events with no data to speak of, as proxies write their keep-alives.
BLANK_EVENTS = [b"data:\n\n", b"data: \n\n", b"data:  \n\n", b"data: \t \n\n", b"data:\r\n\r\n", b"data:\ndata: \n\n"]


async def run(cls: type[Any], body: bytes | list[bytes], **headers: str) -> tuple[list[Any], Any]:
    server = MockServer(body, headers=headers or None)
    async with server.client() as client:
        return await collect(cls("m", api_key=API_KEY, http_client=client))


def events_of(name: str) -> list[bytes]:
    """The recorded stream's events, each with its blank line."""
    body = load(name)
    return [e + b"\n\n" for e in body.split(b"\n\n") if e.strip()]


# -- events with empty data ----------------------------------------------------------------


@pytest.mark.parametrize("provider", sorted(STREAMS))
@pytest.mark.parametrize("blank", BLANK_EVENTS, ids=repr)
async def test_an_event_with_empty_data_carries_nothing_and_is_passed_over(provider: str, blank: bytes) -> None:
    # It failed the stream as malformed JSON (retryable), and the retry met the same proxy.
    cls, name = STREAMS[provider]
    events = events_of(name)
    _, plain = await run(cls, b"".join(events))
    with_blanks = [events[0], blank, *events[1:-1], blank, events[-1]]
    _, acc = await run(cls, b"".join(with_blanks))
    assert final(acc) == final(plain)


@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(
    provider=st.sampled_from(sorted(STREAMS)),
    data=st.data(),
)
async def test_blank_events_anywhere_leave_the_answer_as_it_is(provider: str, data: st.DataObject) -> None:
    cls, name = STREAMS[provider]
    events = events_of(name)
    _, plain = await run(cls, b"".join(events))
    places = data.draw(st.lists(st.integers(0, len(events)), max_size=6))
    blanks = data.draw(st.lists(st.sampled_from(BLANK_EVENTS), min_size=len(places), max_size=len(places)))
    body = list(events)
    for place, blank in sorted(zip(places, blanks, strict=True), reverse=True):
        body.insert(place, blank)
    _, acc = await run(cls, b"".join(body))
    assert final(acc) == final(plain)


async def test_a_stream_of_only_blank_events_is_still_cut() -> None:
    # Nothing of the answer came: not an empty answer, a stream that ended before its end.
    with pytest.raises(StreamProtocolError, match="without data: \\[DONE\\]") as info:
        await run(OpenAIChatModel, b"data: \n\n" * 3)
    assert info.value.retryable is True


async def test_an_error_event_with_empty_data_is_still_the_servers_error() -> None:
    body = chat_stream(chat_chunk({"content": "x"}), done=False) + b"event: error\ndata: \n\n"
    with pytest.raises(ProviderStreamError):
        await run(OpenAIChatModel, body)


async def test_data_that_is_not_json_and_not_blank_is_still_malformed() -> None:
    body = chat_stream(chat_chunk({"content": "x"}), done=False) + b"data: . \n\n"
    with pytest.raises(StreamProtocolError, match="malformed JSON") as info:
        await run(OpenAIChatModel, body)
    assert info.value.retryable is True


# -- vLLM's flat error object ----------------------------------------------------------------


def flat_error(code: int, message: str, kind: str = "BadRequestError") -> dict[str, Any]:
    """An error as older vLLM writes it: its ``ErrorResponse``, with no ``error`` key."""
    return {"object": "error", "message": message, "type": kind, "param": None, "code": code}


@pytest.mark.parametrize(
    ("code", "kind", "retryable"),
    [(400, "BadRequestError", False), (404, "NotFoundError", False), (408, "RequestTimeout", True),
     (429, "RateLimitError", True), (500, "InternalServerError", True), (503, "ServiceUnavailableError", True)],
)  # fmt: skip
async def test_a_flat_error_chunk_is_the_servers_error_not_a_cut_stream(code: int, kind: str, retryable: bool) -> None:
    # It was read as a chunk with no choice, and the stream then failed as cut: the server's
    # message was lost, and a bad request was sent again.
    body = chat_stream(chat_chunk({"content": "Hel"}), flat_error(code, "guided decoding failed", kind))
    with pytest.raises(ProviderStreamError, match="guided decoding failed") as info:
        await run(OpenAIChatModel, body)
    err = info.value
    assert (err.status, err.error_type, err.retryable) == (200, kind, retryable)
    assert err.body == flat_error(code, "guided decoding failed", kind)


async def test_a_flat_error_chunk_has_the_key_taken_out() -> None:
    body = chat_stream(flat_error(401, f"invalid key {API_KEY}", "AuthenticationError"))
    with pytest.raises(ProviderStreamError) as info:
        await run(OpenAIChatModel, body)
    err = info.value
    assert API_KEY not in str(err) and API_KEY not in json.dumps(err.body)
    assert "[REDACTED]" in str(err)
    assert err.retryable is False


async def test_a_flat_context_overflow_is_prompt_too_long() -> None:
    message = "This model's maximum context length is 4096 tokens. However, you requested 5000 tokens."
    with pytest.raises(PromptTooLongError):
        await run(OpenAIChatModel, chat_stream(flat_error(400, message)))


@pytest.mark.parametrize(("code", "retryable"), [(400, False), (422, False), (429, True), (500, True)])
@pytest.mark.parametrize("chunked", [False, True])
async def test_a_flat_error_as_the_whole_200_body_is_the_servers_error(code: int, retryable: bool, chunked: bool) -> None:
    # It was "answered with a JSON document, not an event stream": the server's message buried
    # in an excerpt, a 500 not retried.
    raw = json.dumps(flat_error(code, "the model m does not exist")).encode()
    body = [raw[i : i + 7] for i in range(0, len(raw), 7)] if chunked else raw
    with pytest.raises(ProviderStatusError, match="openai HTTP 200: the model m does not exist") as info:
        await run(OpenAIChatModel, body, **{"content-type": "application/json"})
    err = info.value
    assert (err.status, err.error_type, err.retryable) == (200, "BadRequestError", retryable)


async def test_an_object_that_is_an_error_only_in_name_is_no_error() -> None:
    # Only the flat error's own marker makes a chunk an error: a chunk naming another object
    # stays what it was (here, a stream cut after it).
    body = chat_stream({"object": "chat.completion.chunk", "message": "x", "code": 400, "choices": []}, done=False)
    with pytest.raises(StreamProtocolError, match="without data: \\[DONE\\]"):
        await run(OpenAIChatModel, body)
