"""OpenAI Responses API: request building, event mapping and `OpenAIResponsesModel`.

Wire reference: WIRE.md §3. The request body (input items, reasoning items passed back) is
built in `_request`; the event stream is mapped in `_stream`, with the output items it
builds kept in `_items`; `_model` holds the model: its key, headers, options and connection.
"""

from ._model import OpenAIResponsesModel
from ._request import build_request
from ._stream import ResponsesMapper

__all__ = ["OpenAIResponsesModel", "ResponsesMapper", "build_request"]
