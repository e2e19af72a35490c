"""What `@tool` tells the model: the input schema and the description it builds from a function."""

from __future__ import annotations

import enum
from typing import Annotated, Any, Literal

from pydantic import BaseModel, Field

from agentloop import tool

# A schema the providers all accept holds no ``$ref`` (Gemini's function declarations refuse
# it, and the gateways in front of Gemini) and no ``title`` (pydantic's restatement of each
# name, which the model reads for nothing: "title": "Path" above "path").
SCHEMA_KEYWORDS_THAT_HOLD_SCHEMAS = ("items", "additionalProperties", "not", "contains", "propertyNames")


def _walk(schema: Any, found: list[tuple[str, Any]], where: str = "") -> None:
    """Every (path, schema) pair of ``schema``'s nodes, the property maps' keys kept apart from keywords."""
    if not isinstance(schema, dict):
        return
    found.append((where, schema))
    for key, value in schema.items():
        if key in ("properties", "$defs", "patternProperties"):
            for name, sub in value.items():
                _walk(sub, found, f"{where}/{key}/{name}")
        elif key in ("anyOf", "oneOf", "allOf", "prefixItems"):
            for i, sub in enumerate(value):
                _walk(sub, found, f"{where}/{key}/{i}")
        elif key in SCHEMA_KEYWORDS_THAT_HOLD_SCHEMAS:
            _walk(value, found, f"{where}/{key}")


class Color(enum.Enum):
    RED = "red"
    BLUE = "blue"


class Address(BaseModel):
    """A postal address."""

    street: str
    city: str = Field(description="the city's name")


class Person(BaseModel):
    name: str
    title: str | None = None  # a property called "title" is a property, not noise
    home: Address
    colors: list[Color] = []


class Node(BaseModel):
    """A tree node."""

    label: str
    children: list[Node] = []


def test_a_schema_has_no_ref_and_no_title_noise_at_any_depth() -> None:
    @tool
    async def register(
        person: Person, others: list[Person], favourite: Color = Color.RED, at: Address | None = None
    ) -> str:
        """Register people."""
        return ""

    schema = register.input_schema
    nodes: list[tuple[str, Any]] = []
    _walk(schema, nodes)
    assert "$defs" not in schema
    assert [where for where, node in nodes if "$ref" in node] == []
    assert [where for where, node in nodes if "title" in node] == []
    person = schema["properties"]["person"]
    assert person["properties"]["home"]["properties"]["city"] == {"type": "string", "description": "the city's name"}
    assert person["properties"]["home"]["description"] == "A postal address."
    assert list(person["properties"]) == ["name", "title", "home", "colors"]
    assert person["properties"]["colors"]["items"] == {"enum": ["red", "blue"], "type": "string"}
    assert schema["properties"]["others"]["items"] == person
    assert schema["properties"]["favourite"] == {"enum": ["red", "blue"], "type": "string", "default": "red"}
    assert schema["properties"]["at"]["anyOf"][0]["properties"]["street"] == {"type": "string"}


def test_a_field_s_own_description_wins_over_its_model_s_docstring() -> None:
    @tool
    async def send(to: Annotated[Address, Field(description="where the letter goes")]) -> str:
        """Send a letter."""
        return ""

    assert send.input_schema["properties"]["to"]["description"] == "where the letter goes"


def test_a_recursive_model_keeps_a_ref_to_itself_and_the_rest_is_inlined() -> None:
    @tool
    async def plant(tree: Node, mode: Literal["a", "b"] = "a", where: Address | None = None) -> str:
        """Plant a tree."""
        return ""

    schema = plant.input_schema
    assert set(schema["$defs"]) == {"Node"}  # only what cannot be inlined
    assert schema["properties"]["tree"] == {"$ref": "#/$defs/Node"}
    node = schema["$defs"]["Node"]
    assert "title" not in node
    assert node["properties"]["children"]["items"] == {"$ref": "#/$defs/Node"}
    assert "$ref" not in str(schema["properties"]["where"])
