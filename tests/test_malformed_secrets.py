"""A model of the host's own (the `Model` protocol) that streams a value of the wrong type holding
a credential: the accumulator's error names the type, never the value, so no key it holds (one
the engine knows or not) reaches the turn's error, the events, the log or the exception."""

from __future__ import annotations

import logging
from typing import Any

import pytest

from agentloop import QueryEngine, TurnEnded
from agentloop._accumulate import Accumulator
from agentloop._errors import StreamProtocolError
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
    StreamUsage,
    Usage,
)

KEY = "sk-host-SECRET-9876543210fedcba"
PIECE = KEY[8:20]  # a quote cut short would still show it

_BAD: dict[str, Any] = {
    "text": StreamText(0, [KEY]),
    "thinking": StreamThinking(1, {"k": KEY}),
    "signature": StreamSignature(1, [KEY]),
    "origin": StreamSignature(1, "sig", origin=[KEY]),
    "redacted": StreamRedactedThinking(1, {"k": KEY}),
    "redacted-origin": StreamRedactedThinking(1, "data", origin={"k": KEY}),
    "tool-id": StreamToolUseStart(2, [KEY], "read"),
    "tool-name": StreamToolUseStart(2, "t1", {"k": KEY}),
    "partial-json": StreamToolInput(2, {"path": KEY}),
    "provider": StreamProviderBlock(3, [KEY], {}),
    "provider-data": StreamProviderBlock(3, "p", [KEY]),  # type: ignore[arg-type]
    "index": StreamText(KEY, "x"),  # type: ignore[arg-type]
    "stop-index": StreamBlockStop([KEY]),  # type: ignore[arg-type]
    "usage": StreamUsage({"input_tokens": KEY}),  # type: ignore[arg-type]
    "usage-count": StreamUsage(Usage(input_tokens=KEY)),  # type: ignore[arg-type]
    "stop-reason": StreamEnd([KEY]),  # type: ignore[arg-type]
    "end-usage": StreamEnd("end_turn", Usage(output_tokens=[KEY])),  # type: ignore[arg-type]
    "not-an-event": {"type": "text", "text": KEY},
    "a-str": KEY,
}


class _Leaky:
    """A host's model that streams one bad event after some good text; it says what its key is,
    as the library's own models do, so the engine knows it (a key it does not know is tested too)."""

    def __init__(self, bad: object, known: bool) -> None:
        self.bad = bad
        self.known = known

    def _credentials(self) -> tuple[str, ...]:
        return (KEY,) if self.known else ()

    async def stream(self, request: object, signal: object) -> Any:
        yield StreamText(0, "partial ")
        yield self.bad
        yield StreamBlockStop(0)
        yield StreamEnd(stop_reason="end_turn")


def _no_key(*texts: str) -> None:
    for text in texts:
        assert KEY not in text
        assert PIECE not in text


@pytest.mark.parametrize("bad", list(_BAD.values()), ids=list(_BAD))
def test_the_accumulators_error_names_the_type_never_the_value(bad: object) -> None:
    acc = Accumulator()
    with pytest.raises(StreamProtocolError) as info:
        acc.feed(bad)  # type: ignore[arg-type]
    error = info.value
    assert error.message.startswith("malformed stream event")
    _no_key(str(error), repr(error), repr(error.args))


@pytest.mark.parametrize("known", [True, False], ids=["known-key", "unknown-key"])
@pytest.mark.parametrize("bad", list(_BAD.values()), ids=list(_BAD))
async def test_a_custom_models_value_of_the_wrong_type_never_shows_its_key(
    bad: object, known: bool, caplog: pytest.LogCaptureFixture
) -> None:
    engine = QueryEngine(_Leaky(bad, known), policies=[], retry_budget=1, retry_base_delay=0)  # type: ignore[arg-type]
    with caplog.at_level(logging.DEBUG, "agentloop"):
        events = [e async for e in engine.run("go")]
    end = events[-1]
    assert isinstance(end, TurnEnded) and end.reason == "model_error"
    assert end.error is not None and "malformed stream event" in end.error
    log = "\n".join(logging.Formatter("%(message)s").format(r) for r in caplog.records)
    _no_key(end.error, repr(events), repr(engine.messages), log)


#: What each error says of its event: the field that is of the wrong type, and that type.
_SAYS: dict[str, str] = {
    "text": "StreamText's text is list, not a str",
    "thinking": "StreamThinking's thinking is dict, not a str",
    "signature": "StreamSignature's signature is list, not a str",
    "origin": "StreamSignature's origin is list, not a str",
    "redacted": "StreamRedactedThinking's data is dict, not a str",
    "redacted-origin": "StreamRedactedThinking's origin is dict, not a str",
    "tool-id": "StreamToolUseStart's id is list, not a str",
    "tool-name": "StreamToolUseStart's name is dict, not a str",
    "partial-json": "StreamToolInput's partial_json is dict, not a str",
    "provider": "StreamProviderBlock's provider is list, not a str",
    "provider-data": "StreamProviderBlock's data is list, not a dict",
}


@pytest.mark.parametrize(("case", "says"), list(_SAYS.items()), ids=list(_SAYS))
def test_the_accumulators_error_names_the_field_of_the_wrong_type(case: str, says: str) -> None:
    # Before, an event of two str fields (a tool call's id and name, a signature and its origin)
    # gave the same error for either: which field was bad could not be told.
    with pytest.raises(StreamProtocolError) as info:
        Accumulator().feed(_BAD[case])
    assert info.value.message == f"malformed stream event: {says}"
    assert info.value.retryable is True
