"""The credentials a host gives an MCP server, and keeping them out of what is shown of it.

A server's credentials are the values of its credential-named ``env`` variables and
``headers``, those in its URL and those on its command line (`command_line_credentials`).
They are scrubbed out of the errors its connection raises (`scrubbing`; an `MCPError` keeps
its text in ``error``, not in its ``args``: `scrub_error` knows it) and, by a log filter
(`watch`), out of the records of the loggers that could quote them. What such an error quotes
is then cut to its start and end (`clip_error`), as a provider's error is.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterable, Iterator, Mapping, Sequence
from urllib.parse import unquote

from mcp.shared.exceptions import MCPError

from .._cmdline import hidden_values, shown_args
from ..models._errbody import QUOTE_LIMIT, clipped
from ..models._http import Redactor, credential_parts, is_credential
from ..models._http._secrets import URL_LOGS, exception_tree, url_credentials

_MARK = "[REDACTED]"

#: The loggers that may quote what a server or its connection said or was sent: agentloop's own,
#: the MCP SDK's (its transport logs the URL, its session a message it could not handle, with a
#: traceback) and its HTTP client's (every request URL).
LOGGERS = (
    "agentloop",
    "mcp.client.streamable_http",
    "mcp.client.session",
    "mcp.shared.jsonrpc_dispatcher",
    "mcp.shared.dispatcher",
    "httpx2",
    "httpx",
)


def command_line_credentials(args: Sequence[str]) -> list[str]:
    """The credentials on a command line, where `shown_args` finds them: the value of a
    credential-named option (``--token X``, ``--api-key=X``), variable (``TOKEN=X``) or header
    (``Authorization: Bearer X``), a URL's user info and credential query parameters; each as
    written, percent-decoded and in its parts (`credential_parts`)."""
    found: list[str] = []
    for arg, shown in zip(args, shown_args(tuple(args)), strict=True):
        if shown == arg:
            continue
        for value in hidden_values(arg, shown):
            # A URL's user info is ``user:password``: the password alone is one too.
            password = value.partition(":")[2] if "://" in arg else ""
            for part in (value, password):
                found += [*credential_parts(part), *credential_parts(unquote(part))]
    return found


def server_credentials(given: Mapping[str, str], url: str = "", args: Sequence[str] = ()) -> tuple[str, ...]:
    """The credentials a host gives a server (the values of its credential-named ``env``
    variables or ``headers``, those in its ``url``, those on its command line ``args``) of 4
    characters or more, longest first."""
    found = {part for name, value in given.items() if is_credential(name) for part in credential_parts(value)}
    found.update(url_credentials(url) if url else ())
    found.update(command_line_credentials(args))
    return tuple(sorted((v for v in found if len(v) >= 4), key=len, reverse=True))


def watch(owner: object, secrets: Iterable[str]) -> None:
    """Scrub ``secrets`` out of the records of `LOGGERS` for as long as ``owner`` lives."""
    secrets = tuple(secrets)
    if secrets:
        URL_LOGS.watch(owner, secrets, LOGGERS)


def scrub_error(exc: BaseException, redactor: Redactor) -> bool:
    """Scrub ``redactor``'s secrets out of ``exc`` and every exception chained to it, in place
    (`Redactor.scrub_chain`), an `MCPError`'s ``error`` (its message and data) included.
    Returns False when a secret is still shown."""
    for current in exception_tree(exc):
        if isinstance(current, MCPError):
            error = current.error
            message, data = redactor.scrub(error.message), redactor._scrub_json(error.data)
            current.error = error.model_copy(update={"message": message, "data": data})
            current.args = (error.code, message, data)
    return redactor.scrub_chain(exc)


def clip_error(exc: BaseException) -> None:
    """Cut what ``exc`` and every exception chained to it quote (an `MCPError`'s message, and its
    data when it is text; the text ``args`` of another) to its start and end (`clipped`), in
    place: a server's error text, a connection's, a stderr tail may be megabytes. To be called
    once the secrets are scrubbed: a cut never splits one it could then miss."""
    for current in exception_tree(exc):
        if isinstance(current, MCPError):
            error = current.error
            data = clipped(error.data) if isinstance(error.data, str) else error.data
            if len(error.message) > QUOTE_LIMIT or data is not error.data:
                current.error = error.model_copy(update={"message": clipped(error.message), "data": data})
                current.args = (error.code, current.error.message, data)
        elif any(isinstance(a, str) and len(a) > QUOTE_LIMIT for a in current.args):
            current.args = tuple(clipped(a) if isinstance(a, str) else a for a in current.args)


def clean_error(exc: BaseException, redactor: Redactor | None) -> bool:
    """Scrub ``redactor``'s secrets out of ``exc`` (`scrub_error`), then cut what it quotes
    (`clip_error`). Returns False when a secret is still shown."""
    if redactor is not None and not scrub_error(exc, redactor):
        return False
    clip_error(exc)
    return True


def shown_text(text: str, redactor: Redactor | None) -> str:
    """``text`` (an error's repr for a log line) scrubbed of ``redactor``'s secrets, then cut."""
    return clipped(redactor.scrub(text) if redactor is not None else text)


@contextlib.contextmanager
def scrubbing(redactor: Redactor | None, label: str) -> Iterator[None]:
    """Raise what the block raises with ``redactor``'s secrets scrubbed out of it and what it
    quotes cut (`clean_error`); an error whose text cannot be scrubbed is replaced by a
    `ConnectionError` naming its type."""
    try:
        yield
    except Exception as exc:
        if clean_error(exc, redactor):
            raise
        raise ConnectionError(
            f"MCP server {label}: {type(exc).__name__} (its message quoted a credential, not shown)"
        ) from None
