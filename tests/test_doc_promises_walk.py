"""What a first host program meets: the errors it gets must say what to do."""

from __future__ import annotations

from pathlib import Path

import httpx
import pytest

from agentloop import QueryEngine
from agentloop.models import AnthropicModel, OpenAIChatModel, OpenAIResponsesModel
from agentloop.testing import collect, turn_ended

WIRE = Path(__file__).parent / "models" / "fixtures"
KEY = "sk-test-walkthrough-0123456789abcdef"


def _serving(*responses: httpx.Response) -> httpx.MockTransport:
    queue = list(responses)

    def serve(request: httpx.Request) -> httpx.Response:
        return queue.pop(0)

    return httpx.MockTransport(serve)


@pytest.mark.parametrize(
    ("cls", "env_var", "body"),
    [
        (AnthropicModel, "ANTHROPIC_API_KEY", {"type": "error", "error": {"type": "authentication_error", "message": "invalid x-api-key"}}),
        (OpenAIChatModel, "OPENAI_API_KEY", {"error": {"message": "Incorrect API key provided.", "code": "invalid_api_key"}}),
        (OpenAIResponsesModel, "OPENAI_API_KEY", {"error": {"message": "Incorrect API key provided.", "code": "invalid_api_key"}}),
    ],
)
async def test_a_refused_key_says_where_the_key_comes_from(cls: type, env_var: str, body: dict[str, object]) -> None:
    # "anthropic HTTP 401: invalid x-api-key" named neither the parameter nor the variable the key
    # is read from: a first host's wrong key left its author to guess where it came from.
    async with httpx.AsyncClient(transport=_serving(httpx.Response(401, json=body))) as client:
        engine = QueryEngine(cls("m", api_key=KEY, http_client=client))
        end = turn_ended(await collect(engine.run("hi")))
    assert end.reason == "model_error" and end.error is not None
    assert "HTTP 401" in end.error and "api_key=" in end.error and env_var in end.error
    assert KEY not in end.error
