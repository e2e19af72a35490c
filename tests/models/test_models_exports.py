"""The public surface of agentloop.models."""

from __future__ import annotations

import agentloop.models as models
from agentloop import _model, _scripted


def test_all_is_sorted_and_complete() -> None:
    assert models.__all__ == sorted(models.__all__)
    for name in models.__all__:
        assert hasattr(models, name), name
    for name in _model.__all__:
        assert name in models.__all__, name
    for name in _scripted.__all__:
        assert name in models.__all__, name
    for name in (
        "AnthropicModel",
        "OpenAIChatModel",
        "OpenAIResponsesModel",
        "SSEDecoder",
        "ServerSentEvent",
    ):
        assert name in models.__all__


def test_providers_satisfy_the_model_protocol() -> None:
    for cls in (models.AnthropicModel, models.OpenAIChatModel, models.OpenAIResponsesModel):
        assert isinstance(cls("m", api_key="k"), models.Model)
