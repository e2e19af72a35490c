"""The model seam: one streamed request in, provider-neutral stream events out.

A `Model` turns a `ModelRequest` into an async iterator of `StreamEvent`s. The
events are deliberately low level (content block index + delta) so that every
provider maps its wire format onto them directly, and one accumulator in the
kernel (`agentloop._accumulate`) builds the final message the same way for all.

Contract for implementers:
- yield `StreamEnd` exactly once, last; a stream that stops without it was cut;
- raise `ModelError` (or a subclass) for failures, with ``retryable`` set for
  errors that a new attempt could fix;
- do not catch `asyncio.CancelledError`: the engine cancels the await to stop a
  stream at once, and closing the HTTP response must happen on the way out
  (an ``async with`` around the response does it).
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, ClassVar, Literal, Protocol, get_args, runtime_checkable

from ._abort import AbortSignal
from ._messages import Message
from ._quick import quick_init

__all__ = [
    "Model",
    "ModelRequest",
    "StreamBlockStop",
    "StreamEnd",
    "StreamEvent",
    "StreamLogprobs",
    "StreamProviderBlock",
    "StreamRedactedThinking",
    "StreamSignals",
    "StreamSignature",
    "StreamText",
    "StreamThinking",
    "StreamToolInput",
    "StreamToolUseStart",
    "StreamUsage",
    "ToolSpec",
    "Usage",
]


@runtime_checkable
class ToolSpec(Protocol):
    """What a provider needs to declare a tool (a `Tool` satisfies it)."""

    @property
    def name(self) -> str:
        """The name the model calls the tool by."""
        ...

    @property
    def description(self) -> str:
        """What the tool does, as the model reads it."""
        ...

    @property
    def input_schema(self) -> Mapping[str, Any]:
        """The JSON Schema of the tool's input (an object)."""
        ...


@dataclass(frozen=True, slots=True)
class Usage:
    """Token counts; providers report what they know and leave the rest at 0."""

    input_tokens: int = 0
    output_tokens: int = 0
    cache_read_tokens: int = 0
    cache_write_tokens: int = 0

    @property
    def total(self) -> int:
        """``input_tokens + output_tokens`` (the cache counts are part of ``input_tokens``)."""
        return self.input_tokens + self.output_tokens

    def __bool__(self) -> bool:
        """False when every count is 0."""
        return bool(self.input_tokens or self.output_tokens or self.cache_read_tokens or self.cache_write_tokens)

    def __add__(self, other: Usage) -> Usage:
        if not other:  # most attempts report nothing new: no new object
            return self
        if not self:
            return other
        return Usage(
            self.input_tokens + other.input_tokens,
            self.output_tokens + other.output_tokens,
            self.cache_read_tokens + other.cache_read_tokens,
            self.cache_write_tokens + other.cache_write_tokens,
        )


@dataclass(frozen=True, slots=True)
class ModelRequest:
    """One model request.

    ``messages`` is a read-only view of the transcript (plus, on a doom-loop
    resample, the recovery reminder); it is valid for the duration of the call
    and must not be kept. ``tool_choice`` is "auto", "none", "any" (or OpenAI's word for it,
    "required") or a tool name.
    ``attempt`` counts transport retries and resamples of the same turn step.
    """

    messages: Sequence[Message]
    system: str | None = None
    tools: Sequence[ToolSpec] = ()
    tool_choice: str | None = None
    max_tokens: int | None = None
    attempt: int = 0
    metadata: Mapping[str, Any] = field(default_factory=dict)


# -- stream events ------------------------------------------------------------
# ``index`` is the content block index within the response. Blocks of one index
# are contiguous; a block ends at StreamBlockStop (or at StreamEnd).


@dataclass(frozen=True, slots=True)
class StreamText:
    """A fragment of the text of block ``index`` (the block's index in the response)."""

    type: ClassVar[str] = "text"
    index: int
    text: str


@dataclass(frozen=True, slots=True)
class StreamThinking:
    """A fragment of the reasoning (``thinking``) of block ``index``."""

    type: ClassVar[str] = "thinking"
    index: int
    thinking: str


@dataclass(frozen=True, slots=True)
class StreamSignature:
    """Completes thinking block ``index`` (the signature is opaque; pass it back verbatim).

    A later one for the same block replaces it, as Anthropic's ``signature_delta``
    does (it carries the whole signature, not a piece of it). ``origin``: the server
    that made it, kept as the block's `ThinkingBlock.origin`.
    """

    type: ClassVar[str] = "signature"
    index: int
    signature: str
    origin: str | None = None


@dataclass(frozen=True, slots=True)
class StreamRedactedThinking:
    """Encrypted reasoning, a whole block at ``index``; ``origin`` as for `StreamSignature`."""

    type: ClassVar[str] = "redacted_thinking"
    index: int
    data: str
    origin: str | None = None


@dataclass(frozen=True, slots=True)
class StreamProviderBlock:
    """A whole block at ``index`` that the provider's server made and reads back itself
    (Anthropic's ``server_tool_use`` and ``*_tool_result`` blocks): kept as a `ProviderBlock`,
    no call for the host to run."""

    type: ClassVar[str] = "provider_block"
    index: int
    provider: str
    data: dict[str, Any]


@dataclass(frozen=True, slots=True)
class StreamToolUseStart:
    """A tool call starts as block ``index``: its ``id`` and the ``name`` of the tool."""

    type: ClassVar[str] = "tool_use_start"
    index: int
    id: str
    name: str


@dataclass(frozen=True, slots=True)
class StreamToolInput:
    """A fragment (``partial_json``) of the input JSON text of tool call block ``index``."""

    type: ClassVar[str] = "tool_input"
    index: int
    partial_json: str


@dataclass(frozen=True, slots=True)
class StreamBlockStop:
    """Block ``index`` is complete."""

    type: ClassVar[str] = "block_stop"
    index: int


@dataclass(frozen=True, slots=True)
class StreamUsage:
    """Usage so far; later events replace non-zero fields of earlier ones."""

    type: ClassVar[str] = "usage"
    usage: Usage


@dataclass(frozen=True, slots=True)
class StreamSignals:
    """Doom-loop signals sent by the server (all signals so far in this response).

    ``stopped``: the server ended the response on them itself (vLLM's ``finish_reason:
    "repetition"``); the stream's `StreamEnd` follows.
    """

    type: ClassVar[str] = "signals"
    signals: tuple[str, ...]
    stopped: bool = False


@dataclass(frozen=True, slots=True)
class StreamLogprobs:
    """``logprobs``: the log probabilities of the tokens just streamed on ``channel``, in order."""

    type: ClassVar[str] = "logprobs"
    channel: Literal["text", "thinking"]
    logprobs: tuple[float, ...]


@dataclass(frozen=True, slots=True)
class StreamEnd:
    """The response is complete. ``stop_reason`` uses Anthropic's vocabulary:
    "end_turn", "tool_use", "max_tokens", "stop_sequence", "refusal", "pause_turn" (the
    server paused a turn of its own tools: the engine asks again, to let it go on),
    "model_context_window_exceeded"; plus "repetition": the server cut the output as a
    repetition loop (vLLM). ``usage``: the response's usage, merged as a `StreamUsage` is.
    ``response_id``: the provider's id of the response, when it gives one."""

    type: ClassVar[str] = "end"
    stop_reason: str | None = None
    usage: Usage | None = None
    response_id: str | None = None


StreamEvent = (
    StreamText
    | StreamThinking
    | StreamSignature
    | StreamRedactedThinking
    | StreamProviderBlock
    | StreamToolUseStart
    | StreamToolInput
    | StreamBlockStop
    | StreamUsage
    | StreamSignals
    | StreamLogprobs
    | StreamEnd
)


@runtime_checkable
class Model(Protocol):
    """One streamed request. See the module docstring for the contract."""

    def stream(self, request: ModelRequest, signal: AbortSignal) -> AsyncIterator[StreamEvent]:
        """Stream the response to ``request``, the run's ``signal`` at hand: yield `StreamEnd`
        exactly once, last; raise `ModelError` (``retryable`` when a new attempt could fix it) for
        a failure; let a cancellation through, closing the response on the way out (the engine
        cancels the stream to stop it at once)."""
        ...


# Built per delta by every provider, and per attempt by the loop: quick constructors.
for _cls in (Usage, ModelRequest, *get_args(StreamEvent)):
    quick_init(_cls)
