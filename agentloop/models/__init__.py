"""The model extension API: the `Model` protocol, its stream events, and the HTTP providers.

Implement `Model.stream` to plug in any backend; use `AnthropicModel`,
`OpenAIChatModel` (also for OpenAI-compatible local servers) or
`OpenAIResponsesModel` for the hosted APIs, and `ScriptedModel` in tests.
"""

from .._model import (
    Model,
    ModelRequest,
    StreamBlockStop,
    StreamEnd,
    StreamEvent,
    StreamLogprobs,
    StreamProviderBlock,
    StreamRedactedThinking,
    StreamSignals,
    StreamSignature,
    StreamText,
    StreamThinking,
    StreamToolInput,
    StreamToolUseStart,
    StreamUsage,
    ToolSpec,
    Usage,
)
from .._scripted import ScriptedModel, ScriptedResponse, ScriptedToolCall
from ._http import parse_retry
from ._sse import ServerSentEvent, SSEDecoder
from .anthropic import AnthropicModel
from .openai_chat import OpenAIChatModel
from .openai_responses import OpenAIResponsesModel

__all__ = [
    "AnthropicModel",
    "Model",
    "ModelRequest",
    "OpenAIChatModel",
    "OpenAIResponsesModel",
    "SSEDecoder",
    "ScriptedModel",
    "ScriptedResponse",
    "ScriptedToolCall",
    "ServerSentEvent",
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
    "parse_retry",
]
