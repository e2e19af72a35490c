"""Anthropic Messages API: request building, event mapping and the `AnthropicModel`.

Wire reference: WIRE.md §1. The request body is built in `_request`, the event stream is
mapped in `_stream` (server-tool blocks are skipped there, so a ``pause_turn`` response is
continued without them), and `_model` holds the model: its key, headers and connection.
"""

from ._model import AnthropicModel
from ._request import build_request
from ._stream import AnthropicMapper

__all__ = ["AnthropicMapper", "AnthropicModel", "build_request"]
