"""OpenAI Chat Completions (and compatible servers): request building, chunk mapping,
and the `OpenAIChatModel`.

Wire reference: WIRE.md §2 and §5. The request body is built in `_request`, the chunks are
mapped in `_stream` (where the quirks of the local servers, vLLM, llama.cpp, Ollama, and of
Gemini, Mistral, DeepSeek and Kimi are handled), and `_model` holds the model: its key,
headers, stream options and connection.
"""

from ._model import OpenAIChatModel
from ._request import build_request
from ._stream import REASONING_SIGNATURE, ChatMapper

__all__ = ["REASONING_SIGNATURE", "ChatMapper", "OpenAIChatModel", "build_request"]
