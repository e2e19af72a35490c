"""OpenAI Chat Completions (and compatible servers): request building, chunk mapping,
and the `OpenAIChatModel`.

Wire reference: WIRE.md §2 and §5. The request body is built in `_request`, the chunks are
mapped in `_stream` (the errors sent in the stream in `_errors`), and `_model` holds the
model: its key, headers, stream options and connection. Local-server quirks handled here:

- vLLM: a tool call whose every chunk repeats its id (or carries a fresh one)
  stays one call, keyed by ``index``; ``delta.reasoning``; integer error ``code``.
- Gemini: parallel calls sent whole, one per chunk, all with ``index`` 0 (or
  none): a named delta with an id of its own, after whole JSON arguments, starts
  the next call (``_Call.succeeded_by`` in `_stream`). A call's ``extra_content`` (Gemini 3's
  thought signature, which must go back with the call) is kept in a thinking block
  whose signature is `EXTRA_CONTENT` JSON, and sent back on that call, to the server that
  sent it only (the block's ``origin``). Its first versions (and gateways passing its chunks
  on) spell the finish reason ``finishReason``, in Gemini's upper case (``STOP``); gateways in
  front of it may send a ``{}`` placeholder before a call's arguments (``_after_placeholder``).
- DeepSeek, GLM and engines behind OpenRouter: parallel calls with one id at one index; a
  named delta with that id and whole arguments of its own starts the next call, the same call
  again is a GLM-style resend, dropped with a warning (``_Call._named_again``).
- Ollama: a whole tool call in one chunk; ``delta.reasoning``.
- DeepSeek and Baidu Qianfan in cumulative mode: every tool-call chunk carries all the
  arguments so far; GLM-style servers: the whole arguments again on the last chunk. Either
  is taken once when the pieces joined are not valid JSON (``_Call.arguments`` in `_stream`).
- Mistral's reasoning models: ``delta.content`` as a list of typed chunks
  (``thinking``, ``text``); litellm: ``arguments`` as an object.
- DeepSeek and Moonshot (Kimi) thinking mode: ``delta.reasoning_content``, which must
  go back on every assistant message with tool calls (``echo_reasoning``, on by default
  for their hosts); without it the next request is refused with a 400.
- llama.cpp: ``delta.reasoning_content``; old builds report a mid-stream
  failure as an ``error: {json}`` SSE *field* line, which spec decoders
  ignore. `OpenAIChatModel` has the SSE decoder read that line as an ``error``
  event (``error_field=True``), and it raises `ProviderStreamError` (an event named
  ``error`` is always an error here).
- OpenRouter: ``delta.reasoning_details`` (signed or encrypted reasoning), kept in a thinking
  block whose signature is `REASONING_DETAILS` JSON, and sent back on its message, to the
  server that sent it only.
- Together (``finish_reason`` ``eos``, one number as a chunk's ``logprobs``), TGI
  (``stop_sequence``), DeepSeek (``insufficient_system_resource``, a cut;
  ``prompt_cache_hit_tokens``), Moonshot (usage in the finish choice), LiteLLM's proxy
  (an error ``code`` that is an HTTP status as a str).
- Gateways in front of Gemini and others (LiteLLM, one-api, one-hub): ``finish_reason``
  ``stop`` on every chunk, or on the text before the tool calls; output after a finish reason
  is kept (not after ``repetition`` or a filter's verdict), the reason after the last output
  decides, the end grace no longer applies, and the whole text sent again at the end is left
  out (``ChatMapper._chunk``, ``ChatMapper._unresent``).
- The output limit goes as ``max_tokens`` to any server but OpenAI's and Azure's
  (Ollama drops ``max_completion_tokens``, Mistral's API refuses it).

A ``data: {"error": ...}`` chunk raises `ProviderStreamError`. The terminator
is ``data: [DONE]``, or the final usage chunk after a ``finish_reason`` (the server
has finished then), or a body that ends cleanly after a ``finish_reason`` (servers that
send no ``[DONE]``); a stream without either, or whose ``[DONE]`` follows neither a
``finish_reason`` nor the final usage chunk (a cut stream closed by a proxy),
raises `StreamProtocolError`. A body held open once the answer is whole ends as complete after
the model's ``end_grace`` (the mapper's ``settled``).
"""

from ._model import OpenAIChatModel
from ._request import EXTRA_CONTENT, REASONING_DETAILS, build_request
from ._stream import REASONING_SIGNATURE, ChatMapper

__all__ = ["EXTRA_CONTENT", "REASONING_DETAILS", "REASONING_SIGNATURE", "ChatMapper", "OpenAIChatModel", "build_request"]
