"""Keys that gateways take in the URL's query string."""

from __future__ import annotations

import json

import httpx
import pytest
from _models_support import API_KEY, MockServer, collect

from agentloop._errors import ModelError
from agentloop.models import AnthropicModel, OpenAIChatModel, OpenAIResponsesModel

_FUNCTION_KEY = "azfn-KEY-0123456789abcdef=="


@pytest.mark.parametrize("cls", [AnthropicModel, OpenAIChatModel, OpenAIResponsesModel])
@pytest.mark.parametrize("name", ["code", "Code"])
async def test_an_azure_functions_key_in_the_query_string_is_never_shown(
    cls: type, name: str, caplog: pytest.LogCaptureFixture
) -> None:
    # A gateway hosted on Azure Functions takes its function key as ?code=...; the name says
    # nothing of a credential, so the key was shown in the model's repr, in an error that
    # echoed the URL, and in httpx's INFO line for every request.
    base = f"https://gw.azurewebsites.net/api/v1?{name}={_FUNCTION_KEY}&region=eu"
    echo = json.dumps({"error": {"message": f"No route for POST /api/v1/chat?{name}={_FUNCTION_KEY}"}})
    server = MockServer(echo.encode(), status=404, headers={"content-type": "application/json"})
    async with server.client() as client:
        model = cls("m", api_key=API_KEY, base_url=base, http_client=client)
        with caplog.at_level("INFO", logger="httpx"), pytest.raises(ModelError) as caught:
            await collect(model)
    shown = [repr(model), str(caught.value), repr(caught.value.args), *(r.getMessage() for r in caplog.records)]
    assert [text for text in shown if _FUNCTION_KEY in text] == []
    assert f"{name}=[REDACTED]&region=eu" in repr(model)
    assert any(f"{name}=[REDACTED]" in r.getMessage() for r in caplog.records if r.name == "httpx")
    assert httpx.URL(str(server.requests[0].url)).params[name] == _FUNCTION_KEY  # what is sent is untouched
