"""What a newcomer meets when they misuse the API: an error that says what to do instead."""

from __future__ import annotations

import pytest

from agentloop import QueryEngine, ScriptedModel


class NoStream:
    """A model someone forgot to finish."""


@pytest.mark.parametrize(
    ("model", "hint"),
    [
        ("claude-sonnet-4-5", "AnthropicModel('claude-sonnet-4-5')"),
        (ScriptedModel, "pass an instance of it"),
        (NoStream(), "NoStream object"),
        (None, "got None"),
    ],
)
def test_a_model_without_stream_is_refused_at_construction(model: object, hint: str) -> None:
    with pytest.raises(TypeError, match=r"needs a model with a stream\(request, signal\) method") as info:
        QueryEngine(model)  # type: ignore[arg-type]
    assert hint in str(info.value)

