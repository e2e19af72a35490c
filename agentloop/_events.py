"""Events yielded by `QueryEngine.run()`: small frozen records tagged by ``type``.

Every event carries ``agent_id``: None for the engine's own events, the
subagent's id for events forwarded from a subagent.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, ClassVar, Literal, get_args

from ._messages import Message, ToolResultBlock, ToolUseBlock
from ._model import Usage
from ._quick import quick_init
from ._signals import DoomLoopSignal

__all__ = [
    "AssistantMessage",
    "AttemptDiscarded",
    "DoomLoopDetected",
    "Event",
    "InterjectionDropped",
    "InterjectionInjected",
    "PermissionRequested",
    "PolicyNudge",
    "Resampling",
    "Retrying",
    "TerminalReason",
    "TextDelta",
    "ThinkingDelta",
    "ToolCallFinished",
    "ToolCallStarted",
    "ToolInputDelta",
    "ToolProgress",
    "TurnEnded",
    "TurnStarted",
]

TerminalReason = Literal[
    "completed",
    "aborted_streaming",
    "aborted_tools",
    "max_turns",
    "stationarity_ended",
    "usage_limit",
    "deadline",
    "model_error",
    "prompt_too_long",
    "hook_stopped",
]



@dataclass(frozen=True, slots=True, kw_only=True)
class _Event:
    agent_id: str | None = None


@dataclass(frozen=True, slots=True, kw_only=True)
class TurnStarted(_Event):
    """A turn begins: ``prompt`` is the user message that starts it (None when the
    run goes on from the transcript as it stands, or for the turn of an interjection sent
    after a completed turn's end). ``ids``: the
    receipts of the queued texts (`send_now`, `follow_up`, `submit`) it starts with.
    ``parent_tool_use_id``: for a subagent's turn run by `delegate_tool`, the id of the
    parent's tool call that runs it (None for a main engine's turn)."""

    type: ClassVar[Literal["turn_started"]] = "turn_started"
    turn: int
    prompt: Message | None = None
    ids: tuple[str, ...] = ()
    parent_tool_use_id: str | None = None


@dataclass(frozen=True, slots=True, kw_only=True)
class TextDelta(_Event):
    """A fragment of the response's text as it streams (``text``)."""

    type: ClassVar[Literal["text_delta"]] = "text_delta"
    text: str


@dataclass(frozen=True, slots=True, kw_only=True)
class ThinkingDelta(_Event):
    """A fragment of the response's reasoning as it streams (``thinking``)."""

    type: ClassVar[Literal["thinking_delta"]] = "thinking_delta"
    thinking: str


@dataclass(frozen=True, slots=True, kw_only=True)
class ToolInputDelta(_Event):
    """A fragment (``partial_json``) of a tool call's input JSON as it streams, for the call
    ``tool_use_id`` of tool ``name``. A call that came without an id, or with one the transcript
    already holds, gets a fresh id when its message is committed: from `AssistantMessage` on,
    events carry that one."""

    type: ClassVar[Literal["tool_input_delta"]] = "tool_input_delta"
    tool_use_id: str
    name: str
    partial_json: str


@dataclass(frozen=True, slots=True, kw_only=True)
class AssistantMessage(_Event):
    """The model's response as committed to the transcript, and why the model stopped
    (``stop_reason``: "end_turn", "tool_use", "max_tokens", "refusal", ...). ``usage``: the
    tokens of this response's request alone (its attempt), as the provider reported them."""

    type: ClassVar[Literal["assistant_message"]] = "assistant_message"
    message: Message
    stop_reason: str | None = None
    usage: Usage = field(default_factory=Usage)


@dataclass(frozen=True, slots=True, kw_only=True)
class PermissionRequested(_Event):
    """The permission callback is being awaited for the call ``tool_use``."""

    type: ClassVar[Literal["permission_requested"]] = "permission_requested"
    tool_use: ToolUseBlock


@dataclass(frozen=True, slots=True, kw_only=True)
class ToolCallStarted(_Event):
    """A call's handler starts.

    ``tool_use`` is the model's call, as the transcript holds it. ``updated_input`` is the
    input the call runs with instead when the permission callback replaced it
    (``Allow(updated_input=...)``), else None; ``input`` is the input it runs with either way.
    """

    type: ClassVar[Literal["tool_call_started"]] = "tool_call_started"
    #: Properties its JSON (`event_json`, a session's event record) holds too, after the fields.
    _json_properties: ClassVar[tuple[str, ...]] = ("input",)
    tool_use: ToolUseBlock
    updated_input: dict[str, Any] | None = None

    @property
    def input(self) -> dict[str, Any]:
        """The input the call runs with: ``updated_input``, else the model's."""
        return self.tool_use.input if self.updated_input is None else self.updated_input


@dataclass(frozen=True, slots=True, kw_only=True)
class ToolCallFinished(_Event):
    """A call's result: real, an error, or synthesized (``synthetic``) after an abort.

    ``result`` is what the transcript holds. A result longer than the engine's
    ``max_tool_result_chars`` is cut there; ``full_result`` is then the whole of it
    (else None). ``tool_use``, ``updated_input`` and ``input`` are as in `ToolCallStarted`
    (``updated_input`` is None for a call that never started).
    """

    type: ClassVar[Literal["tool_call_finished"]] = "tool_call_finished"
    _json_properties: ClassVar[tuple[str, ...]] = ("input",)
    tool_use: ToolUseBlock
    result: ToolResultBlock
    synthetic: bool = False
    full_result: ToolResultBlock | None = None
    updated_input: dict[str, Any] | None = None

    @property
    def input(self) -> dict[str, Any]:
        """The input the call ran with: ``updated_input``, else the model's."""
        return self.tool_use.input if self.updated_input is None else self.updated_input


@dataclass(frozen=True, slots=True, kw_only=True)
class ToolProgress(_Event):
    """A running tool's report for the host (``ctx.emit(ToolProgress(...))``): ``text`` to show,
    for the call ``tool_use_id``. Never part of the transcript; the model does not see it."""

    type: ClassVar[Literal["tool_progress"]] = "tool_progress"
    tool_use_id: str
    text: str


@dataclass(frozen=True, slots=True, kw_only=True)
class InterjectionInjected(_Event):
    """Queued interjections were merged into the transcript (receipt ``ids``)."""

    type: ClassVar[Literal["interjection_injected"]] = "interjection_injected"
    texts: tuple[str, ...]
    ids: tuple[str, ...] = ()


@dataclass(frozen=True, slots=True, kw_only=True)
class InterjectionDropped(_Event):
    """Queued interjections were not delivered because the run ended (``reason``)."""

    type: ClassVar[Literal["interjection_dropped"]] = "interjection_dropped"
    texts: tuple[str, ...]
    ids: tuple[str, ...] = ()
    reason: str = ""


@dataclass(frozen=True, slots=True, kw_only=True)
class PolicyNudge(_Event):
    """A policy (named by ``policy``) appended ``reminder`` for the model, as a synthetic user
    message before the next request."""

    type: ClassVar[Literal["policy_nudge"]] = "policy_nudge"
    policy: str
    reminder: str


@dataclass(frozen=True, slots=True, kw_only=True)
class DoomLoopDetected(_Event):
    """``action``: "resample" (stream cut, retrying), "warn" (not confident),
    "disarmed" (budget spent, result accepted), "off" (recovery switched off) or "ended"
    (stream cut, attempt discarded, and no resample: the run was aborted as it was cut, or
    its ``usage_limit`` is reached; the `TurnEnded` that follows says which)."""

    type: ClassVar[Literal["doom_loop_detected"]] = "doom_loop_detected"
    signals: tuple[DoomLoopSignal, ...]
    confident: bool
    action: Literal["resample", "warn", "disarmed", "off", "ended"] = "warn"
    policy: str = ""


@dataclass(frozen=True, slots=True, kw_only=True)
class Resampling(_Event):
    """A cut attempt is being resampled (within the engine's ``doom_budget``); ``attempt`` is
    the new attempt's number (`ModelRequest.attempt`)."""

    type: ClassVar[Literal["resampling"]] = "resampling"
    attempt: int


@dataclass(frozen=True, slots=True, kw_only=True)
class Retrying(_Event):
    """A failed request is being retried after ``delay`` seconds (within the engine's
    ``retry_budget``): ``error`` says what failed; ``attempt`` is the new attempt's number
    (`ModelRequest.attempt`)."""

    type: ClassVar[Literal["retrying"]] = "retrying"
    attempt: int
    error: str
    delay: float


@dataclass(frozen=True, slots=True, kw_only=True)
class AttemptDiscarded(_Event):
    """Output streamed by a failed or cut attempt was thrown away: a host showing
    deltas should erase ``text_chars`` characters of text and ``thinking_chars``
    of thinking from its view. ``usage``: the tokens the attempt was billed for (a
    failed attempt that streamed nothing but reported tokens is discarded too, with
    0 characters to erase)."""

    type: ClassVar[Literal["attempt_discarded"]] = "attempt_discarded"
    attempt: int
    reason: Literal["retry", "resample"]
    text_chars: int = 0
    thinking_chars: int = 0
    usage: Usage = field(default_factory=Usage)


@dataclass(frozen=True, slots=True, kw_only=True)
class TurnEnded(_Event):
    """The turn's terminal. Exactly one per turn; the last event of a run.

    ``error`` says what failed (model errors); ``detail`` why a policy ended the
    turn, or whose ``usage_limit`` ended it (the engine's own, or one above it); ``turns`` counts the model requests of the turn; ``usage`` is the
    run's token usage so far, its subagents' included; ``aborted_subagents`` lists subagents the abort
    reached, at any depth (a child's own subagents follow it)."""

    type: ClassVar[Literal["turn_ended"]] = "turn_ended"
    reason: TerminalReason
    abort_reason: str | None = None
    error: str | None = None
    detail: str | None = None
    usage: Usage = field(default_factory=Usage)
    turns: int = 0
    aborted_subagents: tuple[str, ...] = ()


Event = (
    TurnStarted
    | TextDelta
    | ThinkingDelta
    | ToolInputDelta
    | AssistantMessage
    | PermissionRequested
    | ToolCallStarted
    | ToolCallFinished
    | ToolProgress
    | InterjectionInjected
    | InterjectionDropped
    | PolicyNudge
    | DoomLoopDetected
    | Resampling
    | Retrying
    | AttemptDiscarded
    | TurnEnded
)


def check_event(item: object) -> None:
    """Raise TypeError for what is no agentloop event: what a tool gives ``ctx.emit`` goes to
    the host's loop, which reads the ``type`` of every event."""
    if not isinstance(item, _Event):
        raise TypeError(f"ctx.emit takes an agentloop event (such as a subagent's), not {type(item).__name__}")


# -- construction speed: the loop builds several events per iteration ------------------

for _cls in get_args(Event):
    quick_init(_cls)
