"""Events and stream events: frozen records whose quick constructor matches the dataclass one exactly."""

from __future__ import annotations

import dataclasses
import inspect
import json
from typing import Any, get_args

import pytest
from hypothesis import given
from hypothesis import strategies as st

from agentloop import Event, TurnEnded, Usage
from agentloop._messages import text_block, tool_result_block, tool_use_block
from agentloop._model import ModelRequest, StreamEvent
from agentloop._quick import quick_init, quick_new
from agentloop._tools import ToolContext

EVENT_CLASSES = (*get_args(Event), Usage, ModelRequest, ToolContext, *get_args(StreamEvent))
_VALUES = st.sampled_from(
    [None, "x", "", 0, 3, True, (), ("a",), Usage(1, 2), text_block("t"), tool_use_block("toolu_1", "t", {}), tool_result_block("toolu_1", "ok")]
)


def _outcome(make: Any, kwargs: dict[str, Any]) -> Any:
    try:
        return make(**kwargs)
    except TypeError as exc:
        return ("TypeError", str(exc).split("(")[-1].split(")")[-1])


@given(cls=st.sampled_from(EVENT_CLASSES), data=st.data())
def test_property_quick_init_builds_what_the_dataclass_init_builds(cls: Any, data: st.DataObject) -> None:
    names = [f.name for f in dataclasses.fields(cls)]
    positional = [f.name for f in dataclasses.fields(cls) if not f.kw_only]
    args = data.draw(st.lists(_VALUES, max_size=len(positional) + 1))
    chosen = data.draw(st.lists(st.sampled_from([*names, "unknown_field"]), unique=True))
    kwargs = {name: data.draw(_VALUES) for name in chosen}

    def reference(*a: Any, **kw: Any) -> Any:
        obj = object.__new__(cls)
        cls._dataclass_init(obj, *a, **kw)
        return obj

    quick = _outcome(lambda **kw: cls(*args, **kw), kwargs)
    ref = _outcome(lambda **kw: reference(*args, **kw), kwargs)
    if isinstance(ref, tuple):
        assert isinstance(quick, tuple) and quick[0] == "TypeError"  # same failure, same kind
    else:
        assert quick == ref and repr(quick) == repr(ref)


@given(cls=st.sampled_from(EVENT_CLASSES), data=st.data())
def test_property_quick_new_builds_what_the_class_builds(cls: Any, data: st.DataObject) -> None:
    names = [f.name for f in dataclasses.fields(cls)]
    positional = [f.name for f in dataclasses.fields(cls) if not f.kw_only]
    args = data.draw(st.lists(_VALUES, max_size=len(positional) + 1))
    chosen = data.draw(st.lists(st.sampled_from([*names, "unknown_field"]), unique=True))
    kwargs = {name: data.draw(_VALUES) for name in chosen}
    make = quick_new(cls)

    made = _outcome(lambda **kw: make(*args, **kw), kwargs)
    ref = _outcome(lambda **kw: cls(*args, **kw), kwargs)
    if isinstance(ref, tuple):
        assert isinstance(made, tuple) and made[0] == "TypeError"
    else:
        assert type(made) is cls and made == ref and repr(made) == repr(ref)
        with pytest.raises(dataclasses.FrozenInstanceError):
            setattr(made, names[0], None)


@pytest.mark.parametrize("cls", EVENT_CLASSES, ids=lambda c: c.__name__)
def test_quick_new_takes_the_class_signature(cls: Any) -> None:
    made, own = inspect.signature(quick_new(cls)).parameters, inspect.signature(cls).parameters
    assert [(p.name, p.kind, repr(p.default)) for p in made.values()] == [
        (p.name, p.kind, repr(p.default)) for p in own.values()
    ]
    ended = quick_new(TurnEnded)(reason="completed")
    assert ended.usage == Usage() and quick_new(TurnEnded)(reason="completed").usage is not ended.usage


@pytest.mark.parametrize("cls", EVENT_CLASSES, ids=lambda c: c.__name__)
def test_quick_init_keeps_the_signature_and_frozenness(cls: Any) -> None:
    quick = inspect.signature(cls)
    original = inspect.signature(cls._dataclass_init)
    assert [(p.name, p.kind) for p in quick.parameters.values()] == [
        (p.name, p.kind) for p in list(original.parameters.values())[1:]
    ]
    for p, q in zip(list(original.parameters.values())[1:], quick.parameters.values(), strict=True):
        assert (p.default is inspect.Parameter.empty) == (q.default is inspect.Parameter.empty)
        if repr(p.default) != "<factory>":
            assert q.default is p.default or q.default == p.default
    ended = TurnEnded(reason="completed")
    with pytest.raises(dataclasses.FrozenInstanceError):
        ended.reason = "max_turns"  # type: ignore[misc]
    assert ended.usage == Usage() and TurnEnded(reason="completed").usage is not ended.usage  # factory per instance


def test_quick_init_refuses_what_it_cannot_copy() -> None:
    @dataclasses.dataclass
    class Mutable:
        x: int

    @dataclasses.dataclass(frozen=True, slots=True)
    class Checked:
        x: int

        def __post_init__(self) -> None:
            pass

    @dataclasses.dataclass(frozen=True, slots=True)
    class Derived:
        x: int
        y: int = dataclasses.field(init=False, default=0)

    for cls in (Mutable, Checked, Derived):
        with pytest.raises(TypeError, match="slotted frozen dataclass"):
            quick_init(cls)


# -- events as JSON (a host streaming them to a browser) -------------------------------


def _strict_loads(line: str) -> Any:
    def refuse(constant: str) -> None:
        raise ValueError(f"not JSON: {constant}")

    return json.loads(line, parse_constant=refuse)


async def test_event_json_gives_every_event_of_a_run_as_one_line_of_strict_json() -> None:
    from agentloop import (
        ModelError,
        QueryEngine,
        ScriptedModel,
        ScriptedResponse,
        ScriptedToolCall,
        event_json,
        tool,
    )

    @tool
    async def weather(city: str) -> str:
        """The weather of a city."""
        return f"{city}: 12°C ☀\u2028naïve"

    model = ScriptedModel([
        ScriptedResponse(thinking="Zürich?", text="Looking 🌍. ", tool_calls=[ScriptedToolCall("weather", {"city": "Zürich"})]),
        ScriptedResponse(text="Mild. ", error=ModelError("upstream said 502: ünïcode"), error_after=1),
    ])
    engine = QueryEngine(model, tools=[weather])
    events = []
    async for event in engine.run("Weather in Zürich?"):
        events.append(event)
        if event.type == "tool_call_started":
            engine.interject("also Bern ✓")
    seen = set()
    for event in events:
        line = event_json(event)
        assert isinstance(line, str) and line.splitlines() == [line]  # one line for any reader of lines
        line.encode("utf-8")
        data = _strict_loads(line)
        assert next(iter(data)) == "type" and data["type"] == event.type
        assert data["agent_id"] is None
        seen.add(event.type)
    assert {"thinking_delta", "text_delta", "tool_input_delta", "assistant_message", "tool_call_started",
            "tool_call_finished", "interjection_injected", "turn_ended"} <= seen
    by_type = {e.type: _strict_loads(event_json(e)) for e in events}
    assert by_type["tool_call_started"]["tool_use"]["input"] == {"city": "Zürich"}
    assert by_type["tool_call_finished"]["result"]["content"] == "Zürich: 12°C ☀\u2028naïve"
    assert by_type["assistant_message"]["message"]["role"] == "assistant"
    assert by_type["turn_ended"]["reason"] == "model_error"
    assert "ünïcode" in by_type["turn_ended"]["error"]
    assert by_type["turn_ended"]["usage"]["input_tokens"] >= 0


@given(text=st.text(), value=st.floats() | st.text() | st.integers())
def test_property_event_json_is_strict_utf8_json_on_one_line(text: str, value: Any) -> None:
    from agentloop import DoomLoopSignal, event_json
    from agentloop._events import DoomLoopDetected, TextDelta, ToolCallStarted

    class Opaque:
        def __repr__(self) -> str:
            return "<opaque>"

    for event in (
        TextDelta(text=text),
        ToolCallStarted(tool_use=tool_use_block("toolu_1", "t", {"v": value, "o": Opaque()}), updated_input={"v": value}),
        DoomLoopDetected(signals=(DoomLoopSignal("tail_repetition", "thinking"),), confident=True),
    ):
        line = event_json(event)
        assert line.splitlines() == [line]
        line.encode("utf-8")
        assert _strict_loads(line)["type"] == event.type


def test_event_json_refuses_what_is_not_an_event() -> None:
    from agentloop import Message, event_json

    for thing in ({"type": "text_delta"}, Message.user("hi"), None):
        with pytest.raises(TypeError, match="agentloop event"):
            event_json(thing)  # type: ignore[arg-type]


def test_event_json_carries_the_input_a_call_ran_with() -> None:
    """``input`` is a property of ToolCallStarted/ToolCallFinished (``updated_input``, else the
    model's), so a client reading event_json() had to derive it again: it is in the JSON now."""
    from agentloop import event_json
    from agentloop._events import ToolCallFinished, ToolCallStarted

    call = tool_use_block("toolu_1", "read", {"path": "../etc/passwd"})
    result = tool_result_block("toolu_1", "ok")
    for event in (
        ToolCallStarted(tool_use=call),
        ToolCallStarted(tool_use=call, updated_input={"path": "docs/a.md"}),
        ToolCallFinished(tool_use=call, result=result),
        ToolCallFinished(tool_use=call, result=result, updated_input={"path": "docs/a.md"}),
    ):
        data = _strict_loads(event_json(event))
        assert data["input"] == event.input
        assert data["tool_use"]["input"] == {"path": "../etc/passwd"}  # the model's call, as written
        assert data["updated_input"] == event.updated_input
