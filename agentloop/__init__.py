"""agentloop: an embeddable asyncio agent-loop kernel.

Interrupt it (`QueryEngine.interrupt`), steer it (`QueryEngine.interject`),
replace its turn (`QueryEngine.send_now`): the transcript stays valid for the
provider whatever happens, and the loop climbs out of runaway behaviour by
itself. Extension points live in `agentloop.models`, `agentloop.policies`,
`agentloop.sessions` and `agentloop.testing`.
"""

from . import _sigint  # first: under python -m, a Ctrl-C from here on ends it without a traceback

try:
    from ._abort import AbortController, AbortSignal
    from ._engine import QueryEngine
    from ._errors import (
        AbortError,
        AgentloopError,
        ModelError,
        PromptTooLongError,
        ProviderError,
        StreamProtocolError,
        ToolInputError,
        TranscriptError,
    )
    from ._eventjson import event_json
    from ._events import (
        AssistantMessage,
        AttemptDiscarded,
        DoomLoopDetected,
        Event,
        InterjectionDropped,
        InterjectionInjected,
        PermissionRequested,
        PolicyNudge,
        Resampling,
        Retrying,
        TerminalReason,
        TextDelta,
        ThinkingDelta,
        ToolCallFinished,
        ToolCallStarted,
        ToolInputDelta,
        ToolProgress,
        TurnEnded,
        TurnStarted,
    )
    from ._inbox import Texts
    from ._messages import (
        Block,
        Message,
        ProviderBlock,
        RedactedThinkingBlock,
        TextBlock,
        ThinkingBlock,
        ToolResultBlock,
        ToolUseBlock,
    )
    from ._model import Model, ModelRequest, Usage
    from ._policy import Policy
    from ._process import ProcessResult, run_process
    from ._repair import repair_transcript
    from ._scripted import ScriptedModel, ScriptedResponse, ScriptedToolCall
    from ._signals import DoomLoopSignal
    from ._subagent import delegate_tool
    from ._tools import Allow, Deny, PermissionCallback, Tool, ToolContext, tool
    from ._validate import validate_transcript
    from .models import AnthropicModel, OpenAIChatModel, OpenAIResponsesModel
    from .policies import (
        ConservativeDoomLoopPolicy,
        DoomLoopPolicy,
        IdenticalToolCallRun,
        RepetitionDetector,
        StationarityPolicy,
    )
finally:  # last: Python's handler again, however the import ended (a missing dependency too)
    _sigint.done_importing()

__version__ = "0.1.0"

__all__ = [
    "AbortController",
    "AbortError",
    "AbortSignal",
    "AgentloopError",
    "Allow",
    "AnthropicModel",
    "AssistantMessage",
    "AttemptDiscarded",
    "Block",
    "ConservativeDoomLoopPolicy",
    "Deny",
    "DoomLoopDetected",
    "DoomLoopPolicy",
    "DoomLoopSignal",
    "Event",
    "IdenticalToolCallRun",
    "InterjectionDropped",
    "InterjectionInjected",
    "Message",
    "Model",
    "ModelError",
    "ModelRequest",
    "OpenAIChatModel",
    "OpenAIResponsesModel",
    "PermissionCallback",
    "PermissionRequested",
    "Policy",
    "PolicyNudge",
    "ProcessResult",
    "PromptTooLongError",
    "ProviderBlock",
    "ProviderError",
    "QueryEngine",
    "RedactedThinkingBlock",
    "RepetitionDetector",
    "Resampling",
    "Retrying",
    "ScriptedModel",
    "ScriptedResponse",
    "ScriptedToolCall",
    "StationarityPolicy",
    "StreamProtocolError",
    "TerminalReason",
    "TextBlock",
    "TextDelta",
    "Texts",
    "ThinkingBlock",
    "ThinkingDelta",
    "Tool",
    "ToolCallFinished",
    "ToolCallStarted",
    "ToolContext",
    "ToolInputDelta",
    "ToolInputError",
    "ToolProgress",
    "ToolResultBlock",
    "ToolUseBlock",
    "TranscriptError",
    "TurnEnded",
    "TurnStarted",
    "Usage",
    "delegate_tool",
    "event_json",
    "repair_transcript",
    "run_process",
    "tool",
    "validate_transcript",
]
