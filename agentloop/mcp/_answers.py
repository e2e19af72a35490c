"""What a server's answers become when they are not what the protocol allows.

The SDK validates an answer as a whole: one tool of an invalid schema failed a whole
tools/list (and with it every later call, which lists the tools again to check its result),
one content block of a type this SDK does not know failed a whole result, and an answer of
the wrong shape was dropped, leaving its request waiting for ever. Here each costs only itself:

- `readable` is a result with the tools of a listing that are not valid tools left out (a
  warning names each), and each content block of an unknown type replaced by a text saying
  what it was;
- `readable` also makes the SDK's error for an HTTP answer that is not JSON-RPC one line;
- `error_answer` is the error answer that stands for an answer of the wrong shape, so that its
  request fails at once, saying why, and `undecodable_answer` the one for an answer that cannot be
  decoded at all (cut short, or nested too deeply); `cut_before_id` tells an answer cut short
  before its id, which no request can be given (the transport ends the connection then);
- `invalid_result` is the error of a result that still does not validate: a line, not
  pydantic's dump of every error (with links to its site and the server's values).
"""

from __future__ import annotations

import json
import logging
import re
from collections.abc import Callable
from typing import Any, get_args

from mcp import types
from mcp.shared.exceptions import MCPError
from pydantic import ValidationError
from pydantic_core import ErrorDetails

from ..models._errbody import clipped

log = logging.getLogger("agentloop")

#: How the errors of the SDK's HTTP transport for an answer it could not parse begin.
_SDK_UNPARSED = ("Failed to parse SSE message: ", "Failed to parse JSON response: ")

_by_version: Callable[[str, str, dict[str, Any]], object] | None
try:  # how the SDK checks a result for the protocol version agreed: a surface a later SDK may move
    from mcp.types.methods import validate_server_result as _by_version
except (ImportError, AttributeError):  # pragma: no cover - mcp 2.3 has it; without it, not checked so
    _by_version = None


def _content_types() -> frozenset[str]:
    """The block types a tool result may hold, as the SDK's `CallToolResult` reads them: the
    ``type`` of each member of its content union (so a later SDK's new types are known)."""
    found: set[str] = set()
    field = getattr(types.CallToolResult, "model_fields", {}).get("content")
    if field is None:  # a later SDK that reads results otherwise: every type left to it
        return frozenset()
    hints: list[Any] = [field.annotation]
    while hints:  # list[...], a union, Annotated[...]: down to the models in them
        hint = hints.pop()
        fields = getattr(hint, "model_fields", None)
        if isinstance(fields, dict) and "type" in fields:
            found.update(arg for arg in get_args(fields["type"].annotation) if isinstance(arg, str))
        else:
            hints.extend(get_args(hint))
    return frozenset(found)


#: The content block types of a tool result in the protocol this SDK reads (none found: a block is
#: left to the SDK to validate).
_KNOWN_CONTENT = _content_types()


def readable(message: Any, label: str, version: str | None) -> Any:
    """``message`` (what the transport read; ``version`` the protocol the session agreed) with a
    result's content of unknown types described and a listing's invalid tools left out;
    anything else as it is."""
    if isinstance(message, types.JSONRPCError):
        return _unparsed(message, label)
    if not isinstance(message, types.JSONRPCResponse) or not isinstance(message.result, dict):
        return message
    result = message.result
    content, tools = result.get("content"), result.get("tools")
    if isinstance(content, list) and any(_unknown(block) for block in content):
        result = {**result, "content": [_described(block) if _unknown(block) else block for block in content]}
    if isinstance(tools, list):
        invalid = _invalid_tools(result, version)
        for i in sorted(invalid):
            _warn_invalid_tool(tools[i], invalid[i], label)
        if invalid:
            result = {**result, "tools": [tool for i, tool in enumerate(tools) if i not in invalid]}
    if result is message.result:
        return message
    return message.model_copy(update={"result": result})


def _unparsed(message: types.JSONRPCError, label: str) -> types.JSONRPCError:
    """``message``, but for the error the SDK's HTTP transport answers a request with when the
    server's answer was not JSON-RPC ("Failed to parse SSE message: " and pydantic's dump of
    every error, the server's text quoted): that one in a line."""
    error = message.error
    if error.code != types.PARSE_ERROR or not error.message.startswith(_SDK_UNPARSED):
        return message
    what = error.message.partition(":")[0]
    text = f"MCP server {label} answered with a message that is not valid JSON-RPC ({what})"
    return message.model_copy(update={"error": error.model_copy(update={"message": text, "data": None})})


def _unknown(block: Any) -> bool:
    kind = block.get("type") if isinstance(block, dict) else None
    return isinstance(kind, str) and bool(_KNOWN_CONTENT) and kind not in _KNOWN_CONTENT


def _described(block: dict[str, Any]) -> dict[str, Any]:
    return {"type": "text", "text": f"[{block['type'][:40]} content, not shown]"}


def _invalid_tools(result: dict[str, Any], version: str | None) -> dict[int, str]:
    """The index of each tool of the tools/list ``result`` that does not validate (as the SDK
    validates it: for ``version``, then as its own model), with what is wrong with it."""
    checks: list[Callable[[], object]] = [lambda: types.ListToolsResult.model_validate(result, by_name=False)]
    by_version = _by_version
    if version is not None and by_version is not None:
        checks.insert(0, lambda: by_version("tools/list", version, result))
    invalid: dict[int, str] = {}
    for check in checks:
        try:
            check()
        except ValidationError as exc:
            for error in exc.errors(include_url=False, include_input=False):
                loc = error["loc"]
                if len(loc) >= 2 and loc[0] == "tools" and isinstance(loc[1], int):
                    invalid.setdefault(loc[1], _said(error, skip=2))
        except Exception:  # a version or a method the SDK has no surface for, or its own bug:
            continue  # the answer goes on to the SDK, which reports what is wrong with it
    return invalid


def _warn_invalid_tool(tool: Any, why: str, label: str) -> None:
    name = tool.get("name") if isinstance(tool, dict) else None
    what = f"the tool {name[:100]!r}" if isinstance(name, str) else "an entry"
    log.warning("MCP server %s lists %s that is not a valid MCP tool (%s); it is not offered", label, what, why)


def error_answer(value: Any, label: str) -> types.JSONRPCError | None:
    """The error answer standing for ``value`` (decoded JSON) when it is an answer to a request
    (``"jsonrpc": "2.0"``, an ``id``, a ``result`` or an ``error``, no ``method``) that is not
    valid JSON-RPC; None for anything else (a JSON log line that happens to hold an ``id``)."""
    if not isinstance(value, dict) or value.get("jsonrpc") != "2.0" or "method" in value:
        return None
    if "result" not in value and "error" not in value:
        return None
    request = value.get("id")
    if not isinstance(request, str | int) or isinstance(request, bool):
        return None
    return _failing(request, label, "")


def undecodable_answer(text: str, label: str) -> types.JSONRPCError | None:
    """The error answer standing for JSON ``text`` that cannot be decoded (cut short, or nested
    deeper than `MAX_JSON_DEPTH`) when it opens an answer to a request: an object whose own
    members, in any order, as far as they can be read, are ``"jsonrpc": "2.0"`` (or, cut short,
    none yet: it may have been to come), an ``id``, and a ``result`` or an ``error`` (no
    ``method``); None for anything else, and for an answer cut short before its whole id
    (`cut_before_id`). An id that the cut may have shortened (a number the text ends with) is not
    taken for the id: it could be another request's."""
    members, cut, keys = _members(text)
    if not _answer(members, cut, keys):
        return None
    raw = members.get("id")
    if raw is None or _ANSWER_ID.fullmatch(raw) is None:
        return None
    return _failing(json.loads(raw), label, " (it could not be decoded: cut short, or nested too deeply)")


def cut_before_id(text: str) -> bool:
    """Whether JSON ``text`` that cannot be decoded is an answer to a request (as
    `undecodable_answer` reads one) cut short before its whole id: which request it answers
    cannot be told, so no request would ever get it."""
    members, cut, keys = _members(text)
    return cut and _answer(members, cut, keys) and "id" not in members


#: The members an answer has: a line cut short before its "jsonrpc" is taken for one only when
#: every member read is one of these (a JSON log line has others: "level", "message").
_ANSWER_KEYS = frozenset(("jsonrpc", "id", "result", "error"))


def _answer(members: dict[str, str], cut: bool, keys: set[str]) -> bool:
    """Whether an object's ``members`` are those of an answer: ``"jsonrpc": "2.0"`` (or, when
    it was ``cut`` short, none yet, and only members an answer has among the ``keys`` read), a
    ``result`` or an ``error``, no ``method``."""
    version = members.get("jsonrpc")
    if version != '"2.0"' and not (cut and version is None and keys <= _ANSWER_KEYS):
        return False
    return "method" not in members and ("result" in members or "error" in members)


#: A JSON token: a string, a punctuation mark, or a bare literal (a number, true, false, null).
_TOKEN = re.compile(r'\s*("[^"\\]*(?:\\.[^"\\]*)*"|[{}\[\],:]|[^\s{}\[\],:"]+)')
#: An id an answer may carry: a number, or a string of up to 200 characters.
_ANSWER_ID = re.compile(r'-?\d{1,18}|"(?:[^"\\]|\\.){0,200}"')
#: Tokens read at most, to find the members after a deeply nested value: a bound on the work.
_SCAN_TOKENS = 20_000


def _members(text: str) -> tuple[dict[str, str], bool, set[str]]:
    """The members of the JSON object ``text`` opens, read as far as the text goes or
    `_SCAN_TOKENS` tokens: each key with its value's raw text when that is a scalar, else the
    value's opening bracket; whether the text was cut short (it ran out, or ends in a
    string left open, inside the object); and every key read, its value whole or not. A bare
    value (a number) the text ends with may have been cut too: it is left out of the members
    (its key, too)."""
    found: dict[str, str] = {}
    keys: set[str] = set()
    opened = _TOKEN.match(text)
    if opened is None or opened.group(1) != "{":
        return found, False, keys
    pos, depth, key, want = opened.end(), 1, "", "key"
    for _ in range(_SCAN_TOKENS):
        token = _TOKEN.match(text, pos)
        if token is None:  # the end of the text, or a string it ends in: cut short
            return found, True, keys
        pos, tok = token.end(), token.group(1)
        if depth > 1:  # inside a member's value: only its brackets count
            depth += 1 if tok in ("{", "[") else -1 if tok in ("}", "]") else 0
        elif want == "key":
            if not tok.startswith('"'):
                break  # "}" (the end) or not JSON
            key, want = _key(tok), ":"
            keys.add(key)
        elif want == ":":
            if tok != ":":
                break
            want = "value"
        elif want == "value":
            if pos < len(text) or tok in ("{", "[") or tok.startswith('"'):
                found[key] = tok
            want = ","
            depth += tok in ("{", "[")
        elif tok != ",":
            break  # "}" (the end) or not JSON
        else:
            want = "key"
    return found, False, keys


def _key(token: str) -> str:
    try:
        key = json.loads(token)
    except ValueError:
        return ""
    return key if isinstance(key, str) else ""


def _failing(request: str | int, label: str, why: str) -> types.JSONRPCError:
    message = f"MCP server {label} answered with a message that is not a valid JSON-RPC answer{why}"
    log.warning("%s (to request %s); the request fails", message, repr(request)[:40])
    return types.JSONRPCError(jsonrpc="2.0", id=request, error=types.ErrorData(code=types.INTERNAL_ERROR, message=message))


def invalid_result(exc: ValidationError, label: str, what: str) -> MCPError:
    """The error for the answer to ``what`` (``tools/call 'x'``) that did not validate."""
    message = f"MCP server {label} answered {what} with a result that is not valid MCP ({_first(exc)})"
    return MCPError(types.INTERNAL_ERROR, clipped(message))


def _first(exc: ValidationError) -> str:
    """Where the first error is and what it says, without the value found there."""
    errors = exc.errors(include_url=False, include_input=False)
    if not errors:
        return "invalid"
    more = f"; {len(errors) - 1} more" if len(errors) > 1 else ""
    return _said(errors[0]) + more


def _said(error: ErrorDetails, skip: int = 0) -> str:
    where = ".".join(str(part) for part in error["loc"][skip:])[:100] or "the whole"
    return f"{where}: {error['msg'][:200]}"
