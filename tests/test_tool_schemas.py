"""What `@tool` tells the model: the input schema and the description it builds from a function."""

from __future__ import annotations

import enum
import json
import sys
import typing
from collections.abc import Callable
from typing import Annotated, Any, Literal

import pytest
from hypothesis import given
from hypothesis import strategies as st
from jsonschema import Draft202012Validator
from pydantic import BaseModel, Field

from agentloop import AbortController, QueryEngine, ScriptedModel, ToolContext, ToolInputError, tool
from agentloop._schema import plain_schema

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


class Cat(BaseModel):
    kind: Literal["cat"]
    lives: int


class Dog(BaseModel):
    kind: Literal["dog"]
    breed: str


def test_a_discriminated_union_is_an_any_of_with_no_pointer_left_to_the_definitions() -> None:
    # Pydantic writes it as a oneOf with an OpenAPI "discriminator" whose mapping points into
    # $defs: once they are written out, those pointers lead nowhere. OpenAI's strict mode and
    # Gemini take anyOf, not oneOf; the branches are told apart by their "kind" all the same.
    @tool
    async def adopt(pet: Annotated[Cat | Dog, Field(discriminator="kind")]) -> str:
        """Adopt a pet."""
        return ""

    schema = adopt.input_schema
    assert "#/$defs" not in str(schema)
    pet = schema["properties"]["pet"]
    assert set(pet) == {"anyOf"}
    assert [branch["properties"]["kind"] for branch in pet["anyOf"]] == [
        {"const": "cat", "type": "string"},
        {"const": "dog", "type": "string"},
    ]


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


class Limits(BaseModel):
    max_bytes: float = float("inf")
    ratio: float = 0.5


NO_LIMITS = Limits()


async def test_a_default_json_cannot_hold_leaves_the_schema_sendable_and_still_applies() -> None:
    # ``limit: float = math.inf`` ("no limit") was written into the schema as ``Infinity``, which
    # is not JSON: every request that offered the tool failed to encode, blaming no tool.
    @tool
    async def scan(path: str, limit: float = float("inf"), floor: float = float("-inf"), limits: Limits = NO_LIMITS) -> str:
        """Scan a file."""
        return f"{path} {limit} {floor} {limits.max_bytes}"

    schema = scan.input_schema
    json.dumps(schema, allow_nan=False)  # what the provider adapters send
    props = schema["properties"]
    assert "default" not in props["limit"] and "default" not in props["floor"]
    assert props["limits"]["properties"]["ratio"]["default"] == 0.5  # a finite default stays
    assert "default" not in props["limits"]["properties"]["max_bytes"]
    assert "default" not in props["limits"]  # the model's default holds an infinity too
    assert props["path"] == {"type": "string"} and schema["required"] == ["path"]
    assert await scan.handler({"path": "a"}, None) == "a inf -inf inf"  # type: ignore[arg-type]


def _descriptions(made: Any) -> dict[str, str | None]:
    return {name: prop.get("description") for name, prop in made.input_schema["properties"].items()}


def test_a_google_style_args_section_describes_each_parameter() -> None:
    @tool
    async def read(path: str, limit: int = 100, *, encoding: str | None = None, ctx: ToolContext) -> str:
        """Read a text file.

        Args:
            path: The file to read, relative to the project.
            limit (int): How many lines to return; the rest is
                summarised in one line.
            encoding: The file's encoding.
            ctx: The call's context.

        Returns:
            The lines read.
        """
        return path

    assert _descriptions(read) == {
        "path": "The file to read, relative to the project.",
        "limit": "How many lines to return; the rest is summarised in one line.",
        "encoding": "The file's encoding.",
    }
    assert read.description == "Read a text file.\n\nReturns:\n    The lines read."


def test_a_numpy_style_parameters_section_describes_each_parameter() -> None:
    @tool
    async def search(pattern: str, paths: list[str], ignore_case: bool = False) -> str:
        """Search files for a pattern.

        Parameters
        ----------
        pattern : str
            A regular expression.
        paths : list of str
            Where to look: files or
            directories.
        ignore_case : bool, optional
            Match either case.

        Returns
        -------
        str
            The matching lines.
        """
        return pattern

    assert _descriptions(search) == {
        "pattern": "A regular expression.",
        "paths": "Where to look: files or directories.",
        "ignore_case": "Match either case.",
    }
    assert search.description == "Search files for a pattern.\n\nReturns\n-------\nstr\n    The matching lines."


def test_rest_param_fields_describe_each_parameter() -> None:
    @tool
    async def move(src: str, dst: str, overwrite: bool = False) -> str:
        """Move a file.

        :param src: The file to move.
        :type src: str
        :param str dst: Where it goes,
            a file or a directory.
        :param overwrite: Replace what is there.
        :returns: The new path.
        """
        return dst

    assert _descriptions(move) == {
        "src": "The file to move.",
        "dst": "Where it goes, a file or a directory.",
        "overwrite": "Replace what is there.",
    }
    assert move.description == "Move a file.\n\n:returns: The new path."


def test_an_explicit_field_description_wins_over_the_docstring_and_prose_stays_prose() -> None:
    @tool(description="Copy.")
    async def copy(src: Annotated[str, Field(description="from here", min_length=1)], dst: str) -> str:
        """Copy a file.

        Args:
            src: ignored, the annotation says it.
            dst: where to.
        """
        return dst

    assert _descriptions(copy) == {"src": "from here", "dst": "where to."}
    assert copy.input_schema["properties"]["src"]["minLength"] == 1
    assert copy.description == "Copy."

    @tool
    async def prose(path: str) -> str:
        """Delete a file.

        Args:
            Anything the model asks for, within the project.
        """
        return path

    assert _descriptions(prose) == {"path": None}
    assert prose.description == "Delete a file.\n\nArgs:\n    Anything the model asks for, within the project."


def test_a_parameter_s_docstring_description_goes_with_its_model_type() -> None:
    @tool
    async def ship(to: Address, via: Color | None = None) -> str:
        """Ship a parcel.

        Args:
            to: The recipient's address.
            via: The carrier's color.
        """
        return ""

    props = ship.input_schema["properties"]
    assert props["to"]["description"] == "The recipient's address."  # not the model's own "A postal address."
    assert props["to"]["properties"]["street"] == {"type": "string"}
    assert props["via"]["description"] == "The carrier's color."


class _Connection:  # a class pydantic knows nothing of
    pass


class _Options(typing.TypedDict):  # typing's, which pydantic refuses before Python 3.12
    verbose: bool


def test_an_annotation_pydantic_cannot_describe_is_a_type_error_naming_the_parameter() -> None:
    async def query(sql: str, conn: _Connection) -> str:
        return sql

    with pytest.raises(TypeError, match=r"^@tool cannot describe parameter 'conn' of query to the model: .*_Connection"):
        tool(query)

    async def sort(items: list[int], key: Callable[[int], int]) -> str:
        return ""

    with pytest.raises(TypeError, match=r"^@tool cannot describe parameter 'key' of sort to the model"):
        tool(sort)

    async def run(command: str, options: _Options) -> str:
        return command

    if sys.version_info < (3, 12):
        with pytest.raises(TypeError, match=r"parameter 'options' of run .*typing_extensions\.TypedDict"):
            tool(run)
    else:
        assert tool(run).input_schema["properties"]["options"]["properties"] == {"verbose": {"type": "boolean"}}


class _Repo:
    def __init__(self, root: str) -> None:
        self.root = root

    async def read(self, path: str) -> str:
        """Read a file of the repository.

        Args:
            path: Relative to the repository's root.
        """
        return f"{self.root}/{path}"


async def test_a_bound_method_is_a_tool_and_a_method_decorated_in_its_class_is_a_clear_error() -> None:
    made = tool(_Repo("/src").read)
    assert made.name == "read"
    assert made.input_schema["properties"] == {"path": {"description": "Relative to the repository's root.", "type": "string"}}
    ctx = ToolContext(AbortController().signal, "t1", QueryEngine(ScriptedModel([])))
    assert await made({"path": "a.py"}, ctx) == "/src/a.py"

    with pytest.raises(TypeError, match=r"^@tool got the method read with its 'self'.*tool\(instance\.read\)"):
        tool(_Repo.read)


def test_args_and_kwargs_are_refused_naming_the_parameter() -> None:
    async def run(*commands: str) -> str:
        return ""

    async def call(name: str, **arguments: int) -> str:
        return ""

    with pytest.raises(TypeError, match=r"^@tool cannot describe \*commands of run to the model: .*named parameter, or take one commands: list\[str\]$"):
        tool(run)
    with pytest.raises(TypeError, match=r"^@tool cannot describe \*\*arguments of call to the model: .*dict\[str, int\]"):
        tool(call)


# -- what the model reads when its input does not validate ----------------------------------------


async def _input_error(made: Any, given: dict[str, Any]) -> str:
    ctx = ToolContext(AbortController().signal, "t1", QueryEngine(ScriptedModel([])))
    with pytest.raises(ToolInputError) as caught:
        await made(given, ctx)
    return str(caught.value)


@tool
async def _resize(width: int, height: int, unit: Literal["px", "mm"] = "px", tags: list[int] = []) -> str:  # noqa: B006
    """Resize the image."""
    return f"{width}x{height}{unit}"


async def test_a_wrong_value_is_quoted_so_the_model_sees_what_it_sent() -> None:
    message = await _input_error(_resize, {"width": "wide", "height": 2.5, "unit": "cm"})
    assert message == (
        "invalid tool input: width: Input should be a valid integer, unable to parse string as an integer "
        "(got \"wide\"); height: Input should be a valid integer, got a number with a fractional part (got 2.5); "
        "unit: Input should be 'px' or 'mm' (got \"cm\")"
    )
    quoted = await _input_error(_resize, {"width": "x" * 5000, "height": 1})
    assert len(quoted) < 300 and quoted.endswith('(got "' + "x" * 60 + '...")')


async def test_a_missing_or_unknown_argument_says_which_parameters_the_tool_takes() -> None:
    assert await _input_error(_resize, {"width": 1}) == "invalid tool input: height: Field required"
    assert await _input_error(_resize, {"width": 1, "height": 2, "depth": 3, "colour": "red"}) == (
        "invalid tool input: depth: not a parameter of this tool; colour: not a parameter of this tool "
        "(its parameters: width, height, unit, tags)"
    )


async def test_an_input_with_thousands_of_errors_gives_the_first_few_and_a_count() -> None:
    message = await _input_error(_resize, {"width": 1, "height": 2, "tags": ["a"] * 5000})
    assert len(message) < 2000
    assert message.startswith('invalid tool input: tags.0: Input should be a valid integer, unable to parse string as an integer (got "a"); tags.1: ')
    assert message.endswith("; and 4,990 more errors")


async def test_a_string_holding_a_number_is_accepted_for_a_number_as_documented() -> None:
    # Models send "5" for an integer now and then: lax validation takes it, and the tool gets 5.
    ctx = ToolContext(AbortController().signal, "t1", QueryEngine(ScriptedModel([])))
    assert await _resize({"width": "5", "height": 7.0}, ctx) == "5x7px"


def test_a_parameter_name_the_providers_refuse_is_refused_when_the_tool_is_made() -> None:
    # Anthropic holds property keys to ^[a-zA-Z0-9_.-]{1,64}$, Gemini parameter names to letters,
    # digits and _ (64 at most): one such name fails every request that offers the tool.
    namespace: dict[str, Any] = {}
    long_name = "p" * 65
    exec(f"async def measure(größe: int, {long_name}: int = 0) -> str:\n    return ''", namespace)
    with pytest.raises(ValueError, match=r"^parameter 'größe' of measure is not accepted by the providers as a name"):
        tool(namespace["measure"])
    exec(f"async def measure(size: int, {long_name}: int = 0) -> str:\n    return ''", namespace)
    with pytest.raises(ValueError, match=rf"^parameter '{long_name}' of measure"):
        tool(namespace["measure"])
    exec(f"async def measure(size: int, {long_name[:64]}: int = 0) -> str:\n    return ''", namespace)
    assert list(tool(namespace["measure"]).input_schema["properties"]) == ["size", long_name[:64]]


# -- the schema written out still describes the same inputs ---------------------------------------

_NOISE = st.none() | st.booleans() | st.integers(-3, 3) | st.sampled_from(["red", "cat", ""]) | st.just([]) | st.just({})


def _mostly(valid: st.SearchStrategy[Any]) -> st.SearchStrategy[Any]:
    """``valid``, and now and then a value of the wrong type instead."""
    return st.integers(0, 9).flatmap(lambda roll: _NOISE if roll == 0 else valid)


_TEXT = st.text(max_size=3)
_ADDRESS = st.fixed_dictionaries({"street": _mostly(_TEXT), "city": _mostly(_TEXT)}, optional={"zip": _TEXT})
_PERSON = st.fixed_dictionaries(
    {"name": _mostly(_TEXT), "home": _mostly(_ADDRESS)},
    optional={"title": _mostly(_TEXT | st.none()), "colors": _mostly(st.lists(st.sampled_from(["red", "blue", "green"]), max_size=2))},
)
_NODE = st.recursive(
    st.fixed_dictionaries({"label": _mostly(_TEXT)}),
    lambda kids: st.fixed_dictionaries({"label": _mostly(_TEXT), "children": st.lists(_mostly(kids), max_size=2)}),
    max_leaves=6,
)
_PET = st.fixed_dictionaries(
    {"kind": st.sampled_from(["cat", "dog", "cow"])}, optional={"lives": _mostly(st.integers(0, 9)), "breed": _mostly(_TEXT)}
)
_INPUT = st.fixed_dictionaries(
    {"person": _mostly(_PERSON)},
    optional={
        "others": _mostly(st.lists(_mostly(_PERSON), max_size=2)),
        "tree": _mostly(_NODE | st.none()),
        "pet": _mostly(_PET | st.none()),
        "extra": st.integers(),
    },
)


class _Everything(BaseModel):
    person: Person
    others: list[Person] = []
    tree: Node | None = None
    pet: Annotated[Cat | Dog, Field(discriminator="kind")] | None = None


_ORIGINAL = Draft202012Validator(_Everything.model_json_schema())
_PLAIN = Draft202012Validator(plain_schema(_Everything.model_json_schema()))


def _errors(validator: Draft202012Validator, value: Any) -> list[tuple[str | int, ...]]:
    return sorted(tuple(e.absolute_path) for e in validator.iter_errors(value))


@given(_INPUT)
def test_the_written_out_schema_accepts_exactly_what_pydantic_s_schema_accepts(value: Any) -> None:
    # Where each refuses the input, not only whether: a part gone lax shows though another fails.
    assert _errors(_PLAIN, value) == _errors(_ORIGINAL, value)
