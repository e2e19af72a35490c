"""Values a server sent that a model keeps or quotes in a warning: an OpenAI Responses id that is
not a string is not kept, and a Chat Completions warning that quotes a value from the stream (a
finish reason, a tool call's id and name) never shows the model's key."""

from __future__ import annotations

import json
import logging
from typing import Any

import pytest
from _models_support import API_KEY, MockServer, chat_chunk, chat_stream, collect, ev, run_responses, sse

from agentloop.models import OpenAIChatModel, StreamEnd

# -- OpenAI Responses: the response id ------------------------------------------------------------


def _responses(created: Any, completed: Any) -> bytes:
    item = {"id": "msg_0", "type": "message", "role": "assistant", "content": []}
    done = {**item, "content": [{"type": "output_text", "text": "Hi"}]}
    return sse(
        ev("response.created", response={"id": created, "status": "in_progress"}),
        ev("response.output_item.added", output_index=0, item=item),
        ev("response.output_text.delta", output_index=0, content_index=0, item_id="msg_0", delta="Hi"),
        ev("response.output_item.done", output_index=0, item=done),
        ev("response.completed", response={"id": completed, "status": "completed",
                                           "usage": {"input_tokens": 3, "output_tokens": 1}}),
    )  # fmt: skip


@pytest.mark.parametrize(
    ("created", "completed", "kept"),
    [
        ([API_KEY], {"k": API_KEY}, None),  # neither is a string: no id
        ("resp_1", [API_KEY], "resp_1"),  # the string one the stream began with stands
        (7, "resp_2", "resp_2"),
        ("resp_1", "resp_2", "resp_2"),  # the end's, as ever
    ],
    ids=["neither", "end-list", "start-int", "both"],
)
async def test_a_responses_id_that_is_not_a_string_is_not_kept(created: Any, completed: Any, kept: str | None) -> None:
    # Before, the list or the int went into StreamEnd.response_id as it came (Chat and
    # Anthropic drop it): a key echoed in it would reach the accumulator.
    events, acc = await run_responses(_responses(created, completed))
    end = events[-1]
    assert isinstance(end, StreamEnd) and end.stop_reason == "end_turn"
    assert end.response_id == kept and acc.response_id == kept
    assert acc.text() == "Hi"


# -- OpenAI Chat Completions: warnings ----------------------------------------------------------


def _logged(caplog: pytest.LogCaptureFixture) -> str:
    fmt = logging.Formatter("%(message)s")
    return "\n".join(fmt.format(r) for r in caplog.records)


def _resend(call_id: str, name: str) -> bytes:
    args = json.dumps({"a": 1})
    call = {"index": 0, "id": call_id, "type": "function", "function": {"name": name, "arguments": args}}
    again = {"index": 0, "function": {"arguments": args}}
    return chat_stream(chat_chunk({"tool_calls": [call]}), chat_chunk({"tool_calls": [again]}),
                       chat_chunk(finish="tool_calls"))  # fmt: skip


_WARNED: dict[str, tuple[bytes, str]] = {
    "finish-reason": (chat_stream(chat_chunk({"content": "Hi"}), chat_chunk(finish=f"stop {API_KEY}")),
                      "is not one this library knows"),
    "late-finish": (chat_stream(chat_chunk({"content": "Hi"}), chat_chunk(finish=f"x{API_KEY}"),
                                chat_chunk(finish="length")), "after its finish_reason"),
    "resent-id": (_resend(f"call_{API_KEY}", "f"), "sent its whole arguments again"),
    "resent-name": (_resend("call_1", f"f_{API_KEY}"), "sent its whole arguments again"),
}  # fmt: skip


@pytest.mark.parametrize(("body", "said"), list(_WARNED.values()), ids=list(_WARNED))
async def test_a_chat_warning_that_quotes_the_stream_never_shows_the_key(
    body: bytes, said: str, caplog: pytest.LogCaptureFixture
) -> None:
    server = MockServer(body)
    with caplog.at_level(logging.WARNING, "agentloop"):
        async with server.client() as client:
            events, _ = await collect(OpenAIChatModel("m", api_key=API_KEY, http_client=client))
    assert isinstance(events[-1], StreamEnd)
    text = _logged(caplog)
    assert said in text  # the warning was given
    assert "[REDACTED]" in text  # with the value, its key taken out
    assert API_KEY not in text and API_KEY.lower() not in text and API_KEY[8:20] not in text
