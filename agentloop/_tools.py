"""Tools: the `@tool` decorator, `Tool`, `ToolContext`, and permission answers.

A `Tool` is a name, a description, a JSON schema and an async handler taking
``(input: dict, ctx: ToolContext)``. `@tool` builds one from an annotated async
function: the schema comes from the annotations through pydantic, the
description from the docstring, and a parameter annotated `ToolContext` is
injected rather than shown to the model.
"""

from __future__ import annotations

import functools
import hashlib
import inspect
import json
import re
from collections.abc import Awaitable, Callable, Mapping, Sequence
from dataclasses import dataclass, field
from types import CodeType, NoneType, UnionType
from typing import (
    TYPE_CHECKING,
    Annotated,
    Any,
    Literal,
    Union,
    get_args,
    get_origin,
    get_type_hints,
    overload,
)

from pydantic import (
    BaseModel,
    ConfigDict,
    Field,
    PydanticSchemaGenerationError,
    PydanticUserError,
    ValidationError,
    create_model,
)
from pydantic.fields import FieldInfo

from ._abort import AbortSignal
from ._checks import non_negative
from ._docstring import split_docstring
from ._errors import ToolInputError
from ._events import check_event
from ._messages import TextBlock, ToolResultBlock, ToolUseBlock, jsonable, tool_result_block
from ._process import ProcessResult
from ._quick import quick_init
from ._schema import plain_schema

if TYPE_CHECKING:
    from ._engine import QueryEngine
    from ._events import Event

__all__ = [
    "Allow",
    "Deny",
    "PermissionCallback",
    "Tool",
    "ToolContext",
    "ToolOutput",
    "cut_result",
    "result_length",
    "tool",
]

#: The tool names every provider accepts (OpenAI's rule, the strictest): letters, digits,
#: ``_`` and ``-``, at most 64 of them.
TOOL_NAME = re.compile(r"[a-zA-Z0-9_-]{1,64}")
_NOT_IN_NAME = re.compile(r"[^a-zA-Z0-9_-]")
#: The parameter names every provider accepts: Anthropic's property keys allow ``[a-zA-Z0-9_.-]``,
#: Gemini's letters, digits and ``_``, starting with a letter or ``_``; 64 at most for both.
PARAM_NAME = re.compile(r"[a-zA-Z_][a-zA-Z0-9_]{0,63}")


def safe_name(name: str) -> str:
    """``name`` if every provider accepts it as a tool name, else a name they all accept:
    its allowed characters (others become ``_``), cut to fit, and a hash of the whole name
    (so two names stay apart, and the same name always gives the same result).

    For names made elsewhere: an MCP server's ``github.create_issue``, or a name a model
    made up (``multi_tool_use.parallel``) that a request would echo back. Anthropic holds
    the tool call ids it is sent back to the same rule (another provider's
    ``functions.read:0`` is refused), so its adapter sends ids through this too.
    """
    return name if TOOL_NAME.fullmatch(name) else fitted(name, 64, safe_chars=True)


def fitted(text: str, max_len: int, *, safe_chars: bool) -> str:
    """``text`` made to fit a provider's rule: cut to ``max_len`` characters (with
    ``safe_chars``, every one outside ``[a-zA-Z0-9_-]`` first becomes ``_``), ending in ``_``
    and a hash of the whole of ``text``. Deterministic, and two texts stay apart."""
    digest = hashlib.sha256(text.encode("utf-8", "surrogatepass")).hexdigest()[:10]
    stem = _NOT_IN_NAME.sub("_", text) if safe_chars else text
    return f"{stem[: max_len - len(digest) - 1]}_{digest}"

ToolOutput = str | list[TextBlock] | ToolResultBlock | Any
Handler = Callable[[dict[str, Any], "ToolContext"], Awaitable[ToolOutput]]


@dataclass(frozen=True, slots=True)
class ToolContext:
    """What a running tool receives.

    ``signal`` aborts when the run is interrupted: pass it on to anything that
    can wait (`run_process`, a subagent, your own IO). ``emit`` sends an event
    into the run's event stream (a subagent's events reach the host this way);
    it may be called from any thread (a worker of ``asyncio.to_thread``). Anything but an
    agentloop event is a TypeError, also for a context made by hand (to test a tool), whose
    ``emit`` drops the events unless one is given.
    """

    signal: AbortSignal
    tool_use_id: str
    engine: QueryEngine
    emit: Callable[[Event], None] = field(repr=False, default=check_event)  # by hand: events dropped, checked


quick_init(ToolContext)  # one per tool call


@dataclass(frozen=True, slots=True)
class Allow:
    """Permission granted; ``updated_input`` replaces the model's input when given."""

    updated_input: dict[str, Any] | None = None


@dataclass(frozen=True, slots=True)
class Deny:
    """Permission refused; ``message`` becomes the call's error result (TypeError for one that
    is not a str)."""

    message: str

    def __post_init__(self) -> None:
        if not isinstance(self.message, str):
            raise TypeError(f"Deny message must be a str, not {type(self.message).__name__}")


# Usually an async def (it may wait for a person); a plain function answering at once is one too.
PermissionCallback = Callable[[ToolUseBlock, ToolContext], Awaitable[Allow | Deny] | Allow | Deny]


class Tool:
    """A tool the model can call.

    ``name``: 1 to 64 letters, digits, ``_`` or ``-`` (ValueError otherwise).
    ``description`` and ``input_schema`` (a JSON Schema object) are what the model is shown.
    ``handler``: ``async (input, ctx) -> result``, called with the model's input (a dict) and
    a `ToolContext`; TypeError for one that is not callable or is an async generator function.
    ``concurrency_safe``: may run alongside other concurrency-safe calls.
    ``timeout``: seconds before the call is cancelled with an error result (TypeError for
    what is not a number of seconds, ValueError for a negative one or NaN).
    ``stationarity``: "tight" tools (file reads, todo lists) get the stricter
    repeated-call thresholds ("normal" the others; ValueError for another word). ``poller``: a repeated call whose result changes
    counts as progress.
    """

    __slots__ = (
        "concurrency_safe",
        "description",
        "handler",
        "input_schema",
        "name",
        "poller",
        "stationarity",
        "timeout",
    )

    def __init__(
        self,
        name: str,
        description: str,
        input_schema: Mapping[str, Any],
        handler: Handler,
        *,
        concurrency_safe: bool = False,
        timeout: float | None = None,
        stationarity: Literal["normal", "tight"] = "normal",
        poller: bool = False,
    ) -> None:
        if not isinstance(name, str) or not TOOL_NAME.fullmatch(name):
            raise ValueError(
                f"tool name {name!r} is not accepted by the providers: use 1-64 letters, digits, '_' or '-'"
            )
        non_negative("timeout", timeout, optional=True)  # a config file's "30" would fail every call
        if stationarity not in ("normal", "tight"):
            raise ValueError(f'stationarity must be "normal" or "tight", not {stationarity!r}')
        _check_handler(handler)
        self.name = name
        self.description = description
        self.input_schema = dict(input_schema)
        self.handler = handler
        self.concurrency_safe = concurrency_safe
        self.timeout = timeout
        self.stationarity = stationarity
        self.poller = poller

    def __repr__(self) -> str:
        return f"<Tool {self.name!r} concurrency_safe={self.concurrency_safe}>"

    async def __call__(self, input: dict[str, Any], ctx: ToolContext) -> ToolOutput:
        """Await the handler with ``input`` and ``ctx`` and return what it returns; the engine
        adds the rest around it (the permission check, the ``timeout``, the result block)."""
        return await self.handler(input, ctx)


@overload
def tool(fn: Callable[..., Awaitable[Any]]) -> Tool: ...
@overload
def tool(
    fn: None = None,
    *,
    name: str | None = None,
    description: str | None = None,
    concurrency_safe: bool = False,
    timeout: float | None = None,
    stationarity: Literal["normal", "tight"] = "normal",
    poller: bool = False,
) -> Callable[[Callable[..., Awaitable[Any]]], Tool]: ...


def tool(
    fn: Callable[..., Awaitable[Any]] | None = None,
    *,
    name: str | None = None,
    description: str | None = None,
    concurrency_safe: bool = False,
    timeout: float | None = None,
    stationarity: Literal["normal", "tight"] = "normal",
    poller: bool = False,
) -> Tool | Callable[[Callable[..., Awaitable[Any]]], Tool]:
    """Make a `Tool` from an annotated async function (usable with or without arguments).

    Raises TypeError for a sync function, a ``functools.partial``, a parameter without an
    annotation, an annotation that names something not defined or that pydantic cannot validate
    or describe; ValueError for a parameter name the providers refuse (see `PARAM_NAME`); TypeError
    or ValueError for a ``timeout`` that is not a number of seconds >= 0.
    """

    def build(f: Callable[..., Awaitable[Any]]) -> Tool:
        _check_async(f)
        summary, param_docs = split_docstring(inspect.getdoc(f) or "", inspect.signature(f).parameters)
        args_model, schema, names, ctx_param = _args_model(f, param_docs)
        doc = description if description is not None else summary
        handler = _handler(f, args_model, names, ctx_param)
        return Tool(
            name or f.__name__,
            doc,
            schema,
            handler,
            concurrency_safe=concurrency_safe,
            timeout=timeout,
            stationarity=stationarity,
            poller=poller,
        )

    if isinstance(fn, str):  # @tool("search"): the name goes by keyword
        raise TypeError(f"@tool takes the function, not a string: to name the tool, write @tool(name={fn!r})")
    return build if fn is None else build(fn)


def _check_async(f: object) -> None:
    """Raise TypeError for what `@tool` cannot make a tool of: a sync function, an async
    generator, a partial."""
    if isinstance(f, functools.partial):  # it passes iscoroutinefunction, then has no name or hints
        raise TypeError(
            "@tool needs an async function, got a functools.partial: define an async def that calls "
            "it (its name, docstring and annotations describe the tool to the model)"
        )
    if inspect.iscoroutinefunction(f):
        return
    if inspect.isasyncgenfunction(f):
        raise TypeError(
            f"@tool needs an async function that returns, got the async generator {f.__qualname__}: a tool "
            "call gives one result: collect what it yields and return that"
        )
    if inspect.isfunction(f) or inspect.ismethod(f):
        raise TypeError(
            f"@tool needs an async function, got the sync function {f.__qualname__}: define it with async def "
            "(blocking work inside it goes to await asyncio.to_thread(...))"
        )
    if callable(f) and inspect.iscoroutinefunction(type(f).__call__):
        raise TypeError(
            f"@tool needs an async function, got a {type(f).__name__} object whose __call__ is async: "
            "pass its bound method with a name for the tool, as in tool(name='search')(obj.__call__) "
            "(the method's docstring and annotations describe the tool)"
        )
    raise TypeError(f"@tool needs an async function, got {f!r}")


def _check_handler(handler: object) -> None:
    """Raise TypeError for a `Tool` handler that could never give a result: not callable, or an
    async generator function. A sync def passes: one returning an awaitable is a handler too
    (`@tool` makes such), so one returning its result is told only when called."""
    if not callable(handler):
        raise TypeError(
            f"handler takes an async function (input, ctx) -> result, not {type(handler).__name__} "
            f"{handler!r}: or use @tool on an annotated async def"
        )
    if inspect.isasyncgenfunction(handler):
        raise TypeError(
            f"handler takes an async function that returns, not the async generator {handler!r}: "
            "a tool call gives one result"
        )


def _handler(
    f: Callable[..., Awaitable[Any]],
    args_model: type[BaseModel],
    names: tuple[tuple[str, str], ...],
    ctx_param: str | None,
) -> Callable[[dict[str, Any], ToolContext], Awaitable[ToolOutput]]:
    """The tool's handler: the model's input validated by ``args_model``, then ``f`` called with
    it (``names``: field and parameter pairs) and the `ToolContext` as ``ctx_param``, if any."""
    validate = args_model.__pydantic_validator__.validate_python  # model_validate, minus its wrapper
    params = inspect.signature(f).parameters
    positional = [p for p, param in params.items() if param.kind is param.POSITIONAL_ONLY]

    def handler(raw: dict[str, Any], ctx: ToolContext) -> Awaitable[ToolOutput]:
        # Validates now and returns the function's coroutine: awaiting it directly
        # saves every call a coroutine level. Bad input raises ToolInputError here.
        try:
            parsed = validate(raw)
        except ValidationError as exc:
            raise ToolInputError(_validation_message(exc, [p for _, p in names])) from None
        kwargs = _arguments(parsed, names) if names else {}  # no call for none
        if ctx_param is not None:
            kwargs[ctx_param] = ctx
        if positional:  # ``def f(path: str, /)``: those cannot be passed by name
            return f(*_positional(kwargs, positional), **kwargs)
        return f(**kwargs)

    if is_async_def(f):  # a sync def marked as async runs its body when called: not checked first
        handler._agentloop_checked_first = _VALIDATING  # type: ignore[attr-defined]
    return handler


#: The mark of a handler `@tool` made over an ``async def`` (its ``_agentloop_checked_first``):
#: it validates its input when called and runs nothing of the function until awaited, so it
#: can be called before its call starts. An attribute, read in C once per call, where a
#: `weakref.WeakSet` lookup made a weak reference in Python each time; a private object, which
#: no other callable (a mock answering every attribute) can hold by chance.
_VALIDATING = object()


def is_async_def(f: object) -> bool:
    """Whether ``f`` (a function or a bound method) is an ``async def``: calling it runs none of
    its body. A sync def that `inspect.markcoroutinefunction` marked (Python 3.12+) is not."""
    code = getattr(getattr(f, "__func__", f), "__code__", None)
    return isinstance(code, CodeType) and bool(code.co_flags & inspect.CO_COROUTINE)


def checked_call(tool: Tool, given: dict[str, Any], ctx: ToolContext) -> Awaitable[ToolOutput] | Exception | None:
    """``tool``'s handler called with ``given`` before the call starts, which checks the input
    and runs nothing of the tool: what it returned (a coroutine not yet started, to await or
    `close_unstarted`), or what validation raised (a `ToolInputError`, or a validator's own
    error, the tool's failure). None for a handler that may act as soon as it is called (one
    made by hand): it is called when the call starts."""
    handler = tool.handler
    try:
        if getattr(handler, "_agentloop_checked_first", None) is not _VALIDATING:
            return None
    except Exception:  # a callable whose attributes raise is not one `@tool` made
        return None
    try:
        return handler(given, ctx)
    except Exception as exc:
        return exc


def close_unstarted(pending: object) -> None:
    """Close what `checked_call` returned, for a call that will not run it: no coroutine is
    left never awaited."""
    if inspect.iscoroutine(pending):
        pending.close()


# The handler's comprehensions are functions of their own: written in it, their free variables
# (the parsed input, the arguments) would be cells made on every call of every tool.
def _arguments(parsed: BaseModel, names: tuple[tuple[str, str], ...]) -> dict[str, Any]:
    """The keyword arguments of a tool's function: its parameters, named ``names``' way."""
    return {p: getattr(parsed, k) for k, p in names}


def _positional(kwargs: dict[str, Any], positional: list[str]) -> list[Any]:
    """Take the positional-only parameters out of ``kwargs``, in order."""
    return [kwargs.pop(p) for p in positional]


def _args_model(
    f: Callable[..., Any], param_docs: Mapping[str, str]
) -> tuple[type[BaseModel], dict[str, Any], tuple[tuple[str, str], ...], str | None]:
    """The input model, its JSON schema, its (field, parameter) name pairs, and the `ToolContext`
    parameter. ``param_docs`` describes parameters that their annotation or default does not.
    Raises `TypeError` naming a parameter whose annotation pydantic cannot validate or describe."""
    hints = _type_hints(f)
    fields: dict[str, Any] = {}
    names: list[tuple[str, str]] = []
    ctx_param: str | None = None
    params = inspect.signature(f).parameters
    for i, (pname, param) in enumerate(params.items()):
        if param.kind in (param.VAR_POSITIONAL, param.VAR_KEYWORD):
            item = _type_name(hints.get(pname, Any))
            if param.kind is param.VAR_POSITIONAL:
                stars, whole = "*", f"list[{item}]"
            else:
                stars, whole = "**", f"dict[str, {item}]"
            raise TypeError(
                f"@tool cannot describe {stars}{pname} of {f.__name__} to the model: the model passes "
                f"arguments by name, so declare each as a named parameter, or take one {pname}: {whole}"
            )
        ann = hints.get(pname)
        if ann is None and i == 0 and pname in ("self", "cls"):
            # ``@tool`` over a method in its class body: it runs before there is an instance.
            raise TypeError(
                f"@tool got the method {f.__name__} with its {pname!r}: make the tool from the bound "
                f"method, once there is an instance: tool(instance.{f.__name__})"
            )
        if ann is None:
            raise TypeError(f"@tool parameter {pname!r} of {f.__name__} needs an annotation")
        if _is_context(ann):
            ctx_param = pname
            continue
        if not PARAM_NAME.fullmatch(pname):  # a Python name may hold any letter, and be of any length
            raise ValueError(
                f"parameter {pname!r} of {f.__name__} is not accepted by the providers as a name: use 1-64 "
                "ASCII letters, digits or '_'"
            )
        default = ... if param.default is param.empty else param.default
        doc = param_docs.get(pname)
        if doc and not _described(ann, default):
            ann = Annotated[ann, Field(description=doc)]
        fname = pname
        if pname.startswith(("_", "model_")) or hasattr(BaseModel, pname):
            # pydantic forbids, reserves or shadows this name (``_raw``, ``model_config``,
            # ``schema``): the field gets a free name, and the parameter's name is its alias.
            fname = f"arg{i}"
            while fname in params:
                fname += "_"
            ann = Annotated[ann, Field(alias=pname)]
        fields[fname] = (ann, default)
        names.append((fname, pname))
    try:
        model, schema = _model(f"{f.__name__}_input", fields)
    except PydanticUserError as exc:
        raise _undescribable(f, fields, dict(names), exc) from None
    return model, schema, tuple(names), ctx_param


def _model(name: str, fields: dict[str, Any]) -> tuple[type[BaseModel], dict[str, Any]]:
    model: type[BaseModel] = create_model(name, __config__=ConfigDict(extra="forbid"), **fields)
    return model, plain_schema(model.model_json_schema())


def _undescribable(
    f: Callable[..., Any], fields: dict[str, Any], pnames: dict[str, str], exc: PydanticUserError
) -> TypeError:
    """The error for a function whose input model or schema pydantic refused (``exc``): it names
    the parameter whose annotation pydantic refuses on its own (pydantic's message does not), and
    says why without pydantic's advice on its model config, which a tool does not have."""
    for fname, spec in fields.items():
        try:
            _model("probe", {fname: spec})
        except PydanticUserError as one:
            exc = one
            where = f"parameter {pnames[fname]!r} of {f.__name__}"
            break
    else:
        where = f"the parameters of {f.__name__}"
    reason = str(exc).split("\n", 1)[0]
    if isinstance(exc, PydanticSchemaGenerationError):
        reason = reason.split(". Set `arbitrary_types_allowed", 1)[0] + (
            ": annotate it with a type pydantic validates (str, int, a pydantic model, a dataclass, a "
            "TypedDict...), and turn the model's input into your object inside the tool"
        )
    return TypeError(f"@tool cannot describe {where} to the model: {reason}")


def _type_hints(f: Callable[..., Any]) -> dict[str, Any]:
    """``f``'s resolved annotations. ``ToolContext`` resolves also when its module imports it only
    under ``if TYPE_CHECKING:`` (as linters advise for a name used only in annotations); any
    other name that cannot be resolved is a `TypeError` that says which, and why."""
    try:
        return get_type_hints(f, include_extras=True)
    except NameError:
        pass
    try:
        return get_type_hints(f, localns={"ToolContext": ToolContext}, include_extras=True)
    except NameError as exc:
        raise TypeError(
            f"@tool cannot resolve the annotations of {getattr(f, '__qualname__', f)!r}: {exc}. Names used in "
            "a tool's annotations must exist when @tool runs: import them at run time (not only under "
            "TYPE_CHECKING), and define the models they name at module level"
        ) from None


def _type_name(ann: Any) -> str:
    """``ann`` as written in an annotation: ``int``, ``list[str]``."""
    return ann.__name__ if isinstance(ann, type) and not get_args(ann) else repr(ann).replace("typing.", "")


def _described(ann: Any, default: Any) -> bool:
    """Whether a ``Field(description=...)`` in the annotation or as the default describes it."""
    infos = [*get_args(ann)[1:]] if get_origin(ann) is Annotated else []
    return any(isinstance(i, FieldInfo) and i.description for i in [*infos, default])


def _is_context(ann: Any) -> bool:
    """``ToolContext``, also as ``ToolContext | None`` or ``Annotated[ToolContext, ...]``."""
    if get_origin(ann) is Annotated:
        ann = get_args(ann)[0]
    if get_origin(ann) in (Union, UnionType):
        return ToolContext in get_args(ann) and all(a in (ToolContext, NoneType) for a in get_args(ann))
    return ann is ToolContext


#: The most errors one message lists (a list of 5,000 wrong items is 5,000 errors), and the most
#: characters of a wrong value it quotes.
_MAX_ERRORS = 10
_MAX_QUOTE = 60


def _validation_message(exc: ValidationError, params: Sequence[str]) -> str:
    """What the model reads when its input fails: each error with the value it sent, and the
    tool's parameters when it sent one the tool does not take."""
    errors = exc.errors(include_url=False)
    lines = []
    unknown = False
    for err in errors[:_MAX_ERRORS]:
        loc = ".".join(str(p) for p in err["loc"]) or "(input)"
        if err["type"] == "extra_forbidden" and len(err["loc"]) == 1:
            unknown = True
            lines.append(f"{loc}: not a parameter of this tool")
        elif err["type"] == "missing":  # its input is the object the field is missing from
            lines.append(f"{loc}: {err['msg']}")
        else:
            lines.append(f"{loc}: {err['msg']} (got {_quote(err.get('input'))})")
    if len(errors) > _MAX_ERRORS:
        lines.append(f"and {len(errors) - _MAX_ERRORS:,} more errors")
    text = "invalid tool input: " + "; ".join(lines)
    if unknown:
        text += f" (its parameters: {', '.join(params) or 'none'})"
    return text


def _quote(value: object) -> str:
    """``value`` as JSON, cut to `_MAX_QUOTE` characters (a long string is cut before it is encoded)."""
    if isinstance(value, str) and len(value) > _MAX_QUOTE:
        return json.dumps(value[:_MAX_QUOTE], ensure_ascii=False)[:-1] + '..."'
    try:
        text = json.dumps(value, ensure_ascii=False, default=repr)
    except (TypeError, ValueError, RecursionError):
        text = repr(value)
    return text if len(text) <= _MAX_QUOTE else text[:_MAX_QUOTE] + "..."


def _as_json(value: object) -> object:
    # json.dumps's ``default``: what json cannot encode itself, as pydantic puts it in JSON;
    # a `ProcessResult` in a dict or a list as one returned alone, without its raw bytes.
    if isinstance(value, ProcessResult):
        return value.as_json()
    return jsonable(value, str)


def result_length(block: ToolResultBlock) -> int:
    """The number of characters of ``block``'s content."""
    content = block.content
    return len(content) if isinstance(content, str) else sum(len(b.text) for b in content)


def cut_result(block: ToolResultBlock, limit: int, marker: str) -> ToolResultBlock:
    """``block`` with its text cut to ``limit`` characters: the first and the last half are
    kept (a log's end says as much as a document's start), with ``marker`` between them,
    its ``{cut}`` and ``{total}`` filled in. Several text blocks become one string."""
    text = block.text
    total = len(text)
    head = (limit + 1) // 2
    tail = limit - head
    note = marker.replace("{cut}", f"{total - limit:,}").replace("{total}", f"{total:,}")
    cut = "\n\n".join(part for part in (text[:head], note, text[total - tail :] if tail else "") if part)
    return block.model_copy(update={"content": cut})


def input_noted(block: ToolResultBlock, updated_input: dict[str, Any], note: str) -> ToolResultBlock:
    """``block`` with ``note`` before its text, its ``{input}`` filled in with ``updated_input``
    as JSON: the result of a call that ran with the input a permission callback gave it tells
    the model so, whose own call is left as it wrote it."""
    if "{input}" in note:
        try:
            shown = json.dumps(updated_input, ensure_ascii=False, default=repr)
        except (ValueError, RecursionError):  # a dict that holds itself
            shown = repr(updated_input)
        note = note.replace("{input}", shown)
    if not note.strip():
        return block
    content = block.content
    if isinstance(content, str):
        noted: str | list[TextBlock] = f"{note}\n\n{content}" if content else note
    else:
        noted = [TextBlock(text=f"{note}\n\n"), *content]
    return block.model_copy(update={"content": noted})


def _well_formed(block: ToolResultBlock) -> bool:
    """Whether ``block`` holds what validation lets in (``model_construct`` and
    ``model_copy(update=...)`` do not validate): text content, and a bool ``is_error``."""
    content: object = block.content
    if type(block.is_error) is not bool:
        return False
    if isinstance(content, str):
        return True
    return isinstance(content, list) and all(isinstance(b, TextBlock) and isinstance(b.text, str) for b in content)


def _bytes_text(data: bytes) -> str:
    """Bytes a tool returned: the text they hold when they are UTF-8 (a page, a file read in
    binary), else their repr, once (not a JSON string of it, every backslash doubled)."""
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError:
        return repr(data)


def output_to_result(tool_use_id: str, output: ToolOutput) -> ToolResultBlock:
    """Normalise what a handler returned into a result block: text (a string, a text
    block or a non-empty list of them) as it is, bytes as the UTF-8 text they hold (else their repr), ``None``
    as "(no output)", anything else as JSON (an empty list too) (pydantic models and
    dataclasses by their fields; a `ProcessResult`, also in a dict or a list, without its raw
    bytes). Raises
    `TypeError` for an awaitable (a coroutine returned instead of awaited)."""
    if type(output) is str and output.strip():  # the common case, built without re-validation
        return tool_result_block(tool_use_id, output)
    if isinstance(output, ToolResultBlock):
        if not _well_formed(output):  # built or copied without validation: its content normalised now
            result = output_to_result(tool_use_id, output.content)
            return result.model_copy(update={"is_error": True}) if output.is_error is True else result
        if output.tool_use_id == tool_use_id:
            return output
        return output.model_copy(update={"tool_use_id": tool_use_id})
    if isinstance(output, str):
        content: str | list[TextBlock] = output
    elif isinstance(output, list) and output and all(isinstance(b, TextBlock) for b in output):
        content = output
    elif isinstance(output, TextBlock):
        content = [output]
    elif output is None:
        content = ""
    elif isinstance(output, bytes | bytearray):  # ``return response.content``, ``path.read_bytes()``
        content = _bytes_text(bytes(output))
    elif isinstance(output, ProcessResult):  # ``return await run_process(...)``
        content = json.dumps(output.as_json(), ensure_ascii=False)
    elif inspect.isawaitable(output):  # ``return fetch(url)``: an await left out
        close_unstarted(output)  # never run, and never warned about as "never awaited"
        raise TypeError(f"a {type(output).__name__} object, not its result (is an await missing?)")
    else:
        try:
            content = json.dumps(output, ensure_ascii=False, default=_as_json)
        except (TypeError, ValueError):
            content = repr(output)
    if not (content if isinstance(content, str) else "".join(b.text for b in content)).strip():
        content = "(no output)"
    return ToolResultBlock(tool_use_id=tool_use_id, content=content)
