"""Anthropic Messages API: request building, event mapping and the `AnthropicModel`.

Wire reference: WIRE.md §1. The request body is built in `_request`, the event stream is
mapped in `_stream`, and `_model` holds the model: its key, headers and connection.
Server-tool blocks (``server_tool_use``, ``web_search_tool_result`` and the other
``*_tool_result`` blocks) are run by Anthropic itself and need no client result: each becomes
a `ProviderBlock`, kept in the transcript and sent back as it came (a call with its result),
so that the model sees its searches in later turns, and a ``pause_turn`` response is continued
as the API asks, with the paused call in it.
"""

from ._model import AnthropicModel
from ._request import build_request
from ._stream import AnthropicMapper

__all__ = ["AnthropicMapper", "AnthropicModel", "build_request"]
