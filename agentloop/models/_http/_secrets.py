"""Secrets of the HTTP providers, and scrubbing them out of whatever is shown.

The API key is held in a `Secret`, whose repr hides it. A `Redactor` scrubs the key, the
values of a request's credential headers (an ``extra_headers`` ``Authorization`` for a
proxy, ``api-key``, a cookie) and the credentials in ``base_url`` out of error messages,
error bodies and chained exceptions; `hide_url_credentials` keeps the credentials of a live
URL out of other libraries' log records.
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import re
import sys
import traceback
import weakref
from collections.abc import Callable, Iterable, Iterator
from typing import Any
from urllib.parse import quote, quote_plus, unquote, unquote_plus

import httpx

from ..._errors import ModelError, ProviderError
from ..._forklock import ForkSafeLock
from ..._transcript import redacted

#: Words in a header or query parameter name that mark its value as a credential:
#: ``authorization``, ``proxy-authorization``, ``x-api-key``, ``api-key``, ``cookie``,
#: ``x-auth-token``, ``client-secret``, ``password``, ``sig`` (a signed URL)...
_CREDENTIAL_WORDS = ("auth", "key", "token", "secret", "cookie", "pass", "session", "credential", "sig")
#: Shorter values are not scrubbed: no credential is that short, and replacing every "1" of
#: an error (a header such as ``x-session-affinity: 1``) would garble it.
_MIN_PART = 4
#: A cookie's value is scrubbed on its own from this length (or when the cookie's name marks a
#: credential); the header's whole value is scrubbed whatever its cookies.
_MIN_COOKIE = 8


#: Query parameters that carry a credential although their name says nothing of one: Azure
#: Functions takes its function key as ``?code=...``.
_QUERY_CREDENTIALS = frozenset({"code"})


def is_credential(name: str) -> bool:
    """Whether a header or query parameter called ``name`` carries a credential."""
    lowered = name.lower()
    return any(word in lowered for word in _CREDENTIAL_WORDS)


def is_query_credential(name: str) -> bool:
    """Whether a query parameter called ``name`` (percent-decoded) carries a credential."""
    return is_credential(name) or name.lower() in _QUERY_CREDENTIALS


def credential_parts(value: str) -> list[str]:
    """What to scrub for a credential ``value``: the value, the credentials after its
    scheme (``Bearer <token>``, ``Basic <base64>``) and each cookie's value that can be a
    credential (8 characters or more, or a cookie named as one), since a server may echo any
    one of them."""
    parts = [value]
    rest = value.partition(" ")[2].strip()
    if rest:
        parts.append(rest)
    for pair in value.split(";"):
        name, eq, part = pair.partition("=")
        part = part.strip()
        # A cookie's value alone, when it can be one: a session id is long, or its cookie is
        # named as a credential is; a preference (``lang=en-US``, ``theme=dark``) is neither,
        # and scrubbing it would garble every record that holds the word.
        if eq and part and (len(part) >= _MIN_COOKIE or is_credential(name)):
            parts.append(part)
    # As the HTTP layer quotes a value it refuses (a line break in it: "Illegal header value
    # b'tok\\n'"), escaped: the value as given is not in that text.
    escaped = repr(value.encode("utf-8", "backslashreplace"))[2:-1]
    if escaped != value:
        parts.append(escaped)
    return [p for p in parts if len(p) >= _MIN_PART]


#: Characters that no escaping or percent-encoding changes: a credential made of them only
#: (most keys and tokens) has one form.
_PLAIN = frozenset("ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789-_.~")


def shown_forms(value: str) -> set[str]:
    """The forms ``value`` takes in the texts an error can hold: as given, escaped in JSON (an
    error body that echoes a header: ``\\"`` for ``"``), in a repr (the HTTP layer quotes a value
    it refuses as bytes: ``b'tok\\n'``) and percent-encoded, every reserved character (a URL's
    query parameter, a form).

    Not escaped in lower case (``%2f``): httpx and `quote` write upper case, and httpx quotes a
    URL's escapes as written, the form `url_credentials` takes as given. Nor the base64 of a URL's
    ``user:password``: neither httpx nor agentloop prints the Basic header made of it (an error's
    request shows it ``[REDACTED]``; a server's echo is scrubbed as the sent header's value)."""
    if _PLAIN.issuperset(value):
        return {value}
    return {
        value,
        json.dumps(value)[1:-1],
        json.dumps(value, ensure_ascii=False)[1:-1],
        repr(value)[1:-1],
        repr(value.encode("utf-8", "backslashreplace"))[2:-1],
        quote(value, safe=""),
        quote_plus(value, safe=""),  # a query string's or form's value
    }


def exception_tree(exc: BaseException) -> Iterator[BaseException]:
    """``exc`` and every exception chained to it (``__cause__``, ``__context__``) or in it (an
    exception group's members, which a traceback prints with it), each once, in no set order.
    Each is yielded before its links are read: a caller may change it in place."""
    todo, seen = [exc], set()
    while todo:
        current = todo.pop()
        if id(current) in seen:
            continue
        seen.add(id(current))
        yield current
        todo += [e for e in (current.__cause__, current.__context__) if e is not None]
        if isinstance(current, BaseExceptionGroup):
            todo += current.exceptions


def _longest_first(text: str) -> tuple[int, str]:
    return -len(text), text


class Redactor:
    """Scrubs secrets (the API key, credential headers, credentials in ``base_url``)
    out of text and errors; its repr shows none of them."""

    __slots__ = ("_make", "_sorted")

    def __init__(self, values: Iterable[str] | Callable[[], Iterable[str]]) -> None:
        # A callable is called at the first scrub: a request's redactor is needed only when
        # something goes wrong, so a request that succeeds never collects its secrets.
        self._make = values
        self._sorted: tuple[tuple[str, ...], tuple[str, ...]] | None = (
            None if callable(values) else self._order(values)
        )

    @staticmethod
    def _order(values: Iterable[str]) -> tuple[tuple[str, ...], tuple[str, ...]]:
        """The secrets, and every form of them (`shown_forms`), each longest first: a secret
        that holds another (``Bearer <key>`` and ``<key>``) goes whole. Were a secret's escaped
        form left alone, a shorter secret inside it would be scrubbed and the rest shown."""
        plain = {v for v in values if v}
        forms = {form for v in plain for form in shown_forms(v)}
        # Ties of length in one fixed order: two overlapping forms of one length are replaced the
        # same way whichever set they came in (and whatever the hash seed), so the scrubbed text is
        # the same for the credentials a record was found to hold and for all of those watched.
        return tuple(sorted(plain, key=_longest_first)), tuple(sorted(forms, key=_longest_first))

    @property
    def values(self) -> tuple[str, ...]:
        """The secrets as given, longest first."""
        return self._ordered[0]

    @property
    def _values(self) -> tuple[str, ...]:
        """The secrets in every form they can be shown in, longest first."""
        return self._ordered[1]

    @property
    def _ordered(self) -> tuple[tuple[str, ...], tuple[str, ...]]:
        ordered = self._sorted
        if ordered is None:
            make = self._make
            assert callable(make)
            ordered = self._sorted = self._order(make())
        return ordered

    def scrub(self, text: str) -> str:
        """``text`` with every occurrence of a secret replaced by ``[REDACTED]``."""
        return redacted(text, self._values)

    def _found_in(self, text: str) -> bool:
        return any(value in text for value in self._values)

    def scrub_error(self, exc: ModelError) -> None:
        """Scrub the secrets out of ``exc`` in place: its message and, for a `ProviderError`,
        its body (an error event or chunk inside a stream that echoes a secret). The body's
        strings are searched as decoded: a JSON escape (``\\/`` for ``/``) hides nothing."""
        if self._found_in(exc.message):
            exc.message = self.scrub(exc.message)
            exc.args = (exc.message,)
        if isinstance(exc, ProviderError) and exc.body is not None:
            exc.body = self._scrub_json(exc.body)

    def scrub_chain(self, exc: BaseException) -> bool:
        """Scrub the secrets out of the string ``args`` and the notes (``add_note``) of ``exc``
        and of every exception chained to it (``__cause__``, ``__context__``), which a printed
        traceback shows. Returns False when a secret is still shown (an exception whose str is
        not its args)."""
        clean = True
        for current in exception_tree(exc):
            clean = self._scrub_one(current) and clean
        return clean

    def make_safe(self, exc: BaseException) -> None:
        """Make what ``exc`` and the exceptions chained to it carry besides their text safe, in
        place (`_scrub_carried`): for an error whose text shows no secret but whose request does
        (a log record's ``exc_info``)."""
        for current in exception_tree(exc):
            self._scrub_carried(current)

    def _scrub_one(self, exc: BaseException) -> bool:
        """Scrub ``exc``'s string args and notes in place; False when its str still shows a secret."""
        notes = getattr(exc, "__notes__", None)
        if isinstance(notes, list) and any(isinstance(n, str) and self._found_in(n) for n in notes):
            notes[:] = [self.scrub(n) if isinstance(n, str) else n for n in notes]
        self._scrub_carried(exc)
        try:
            shown = str(exc)
        except Exception:  # a broken __str__: printed as "<exception str() failed>", nothing of it
            shown = ""
        if self._found_in(shown) or self._found_in(repr(exc.args)):
            exc.args = tuple(self.scrub(a) if isinstance(a, str) else a for a in exc.args)
            return not (self._found_in(str(exc)) or self._found_in(repr(exc.args)))
        return True

    def _scrub_carried(self, exc: BaseException) -> None:
        """Scrub what ``exc`` carries besides its text, in place: an httpx or httpx2 error's request
        (and a status error's response's) becomes `safe_request`'s copy, a JSON decoding error's ``doc``
        and an `OSError`'s file names (which its str quotes: a missing command) are scrubbed."""
        for library in _http_libraries():
            if isinstance(exc, library.RequestError):
                try:
                    exc.request = self.safe_request(exc.request)
                except RuntimeError:  # made without a request: nothing to scrub
                    pass
                return
            if isinstance(exc, library.HTTPStatusError):
                exc.request = exc.response.request = self.safe_request(exc.request)
                return
        if isinstance(exc, json.JSONDecodeError) and self._found_in(exc.doc):
            exc.doc = self.scrub(exc.doc)
        elif isinstance(exc, OSError):
            for name in ("filename", "filename2"):
                value = getattr(exc, name)
                if isinstance(value, str) and self._found_in(value):
                    setattr(exc, name, self.scrub(value))

    def safe_request(self, request: Any) -> Any:
        """What of ``request`` an error may keep: its method, its URL without user info and its
        headers, the value of every credential header and query parameter replaced by
        ``[REDACTED]`` and the secrets scrubbed out of the rest; not its body."""
        url = request.url
        path, mark, query = url.raw_path.decode("ascii", "replace").partition("?")
        if mark:
            query = "&".join(
                f"{name}=[REDACTED]" if eq and is_query_credential(unquote(name)) else name + eq + value
                for name, eq, value in (pair.partition("=") for pair in query.split("&"))
            )
        # The host is kept: a secret that is a piece of its name ("prox" of proxy.example) would
        # leave no host to make a URL of, and a host name is no credential.
        shown = f"{url.scheme}://{url.netloc.decode('ascii', 'replace')}{self.scrub(path + mark + query)}"
        headers = [(name, "[REDACTED]" if is_credential(name) else self.scrub(value))
                   for name, value in request.headers.multi_items()]  # fmt: skip
        return type(request)(request.method, shown, headers=headers)  # an httpx2 one for httpx2's

    def _scrub_json(self, value: Any) -> Any:
        if isinstance(value, str):
            return self.scrub(value)
        if isinstance(value, dict):
            return {self._scrub_json(k): self._scrub_json(v) for k, v in value.items()}
        if isinstance(value, list):
            return [self._scrub_json(v) for v in value]
        return value

    def __repr__(self) -> str:
        return f"{type(self).__name__}('[REDACTED]')"

    __str__ = __repr__


#: The environment variable each provider's key is read from when ``api_key=`` is not given.
KEY_VARIABLES = {"anthropic": "ANTHROPIC_API_KEY", "openai": "OPENAI_API_KEY"}


class Secret(Redactor):
    """An API key that never shows itself in a repr or str; ``origin`` says where it came from
    (``api_key=``, an environment variable), for the error of a server that refuses it."""

    __slots__ = ("_value", "origin")

    def __init__(self, value: str, origin: str = "the key given") -> None:
        super().__init__((value,))
        self._value = value
        self.origin = origin

    def reveal(self) -> str:
        """The key itself, for the request header only."""
        return self._value

    def check(self, provider: str) -> None:
        """Raise `ModelError` (not retryable, without the key) unless the key can go in an
        HTTP header: printable ASCII without surrounding whitespace.

        A key read from a file with its trailing newline would otherwise be refused by the
        HTTP layer with an error that quotes the header, key and all (escaped, so scrubbing
        misses it), and a non-ASCII character would raise `UnicodeEncodeError`.
        """
        value = self._value
        if not (value.isascii() and value.isprintable() and value == value.strip()):
            raise ModelError(
                f"the {provider} API key holds a character an HTTP header cannot carry (a line "
                "break, a control or non-ASCII character, or whitespace at either end): check how "
                "the key was read"
            )


def resolve_key(api_key: str | None, env_var: str) -> Secret | None:
    """The explicit key, else the environment variable's, else None."""
    if api_key is not None:
        return Secret(api_key, "the key passed as api_key=") if api_key else None
    value = os.environ.get(env_var)
    return Secret(value, f"the key read from the {env_var} environment variable") if value else None


class _UrlCredentialsFilter(logging.Filter):
    """Scrubs the credentials of live owners out of the log records of the loggers they name:
    a model's URL credentials (a ``?key=...``, user info) out of httpx's INFO line ``HTTP
    Request: POST <url> ...``, an MCP server's credentials (its URL's, its credential headers,
    its ``env`` and command line) out of what the MCP SDK, its HTTP client and agentloop log.

    Put on a logger by the first owner (a connection, an MCP server) with credentials, and
    forgets an owner when it is garbage-collected. A record holding none of them passes
    untouched; none is made while the logger is below its level. A record whose traceback
    (``exc_info``) quotes one is logged with that traceback as text, scrubbed, in its message:
    a handler reading ``exc_info`` itself would otherwise see the credential. The other parts of
    a record a formatter prints are scrubbed in place (`_other_parts`): its call stack, a
    traceback it holds as text only, and its string extras (a host's format's ``%(url)s``).

    A record's message (with those other parts, in the same search) is searched for the
    credentials by their last four characters (`_Tails`), not one credential after another once
    there are more than a few: a process with a model per
    conversation, each of its own key, pays per record about what a process with one pays. A
    record with a traceback is searched for each of them in turn (an error is rare; what it
    carries, not only its text, is made safe). A record that cannot be formatted is searched in
    its ``msg`` and ``args``, which the logging module prints when it reports it, and keeps them
    scrubbed. An owner collected while a record is looked up is forgotten at the next record."""

    def __init__(self) -> None:
        super().__init__()
        self._live: dict[int, tuple[weakref.ref[object], tuple[str, ...]]] = {}
        self._tails = _Tails()
        self._gone: list[int] = []  # owners collected, not yet dropped
        self._lock = ForkSafeLock()  # records are logged from any thread; a forked child finds it free
        self._reading = False  # the lock's holder is looking at the entries: a collection leaves them

    def watch(self, owner: object, secrets: Iterable[str], loggers: Iterable[str]) -> None:
        values = tuple(secrets)
        key = id(owner)
        with self._entries():
            entry = self._live.get(key)
            if entry is not None:  # its own, watched again, or a collected one's at the address
                self._tails.remove(entry[1])
            self._live[key] = (weakref.ref(owner, self._forget(key)), values)
            self._tails.add(values)
        for name in loggers:
            logging.getLogger(name).addFilter(self)  # a filter already there is not added again

    def _forget(self, key: int) -> Callable[[weakref.ref[object]], None]:
        def gone(ref: weakref.ref[object]) -> None:  # run by a collection: maybe mid-lookup, any thread
            self._gone.append(key)
            if not self._reading and self._lock.acquire(blocking=False):
                try:
                    if not self._reading:
                        with self._entries():
                            pass
                finally:
                    self._lock.release()

        return gone

    @contextlib.contextmanager
    def _entries(self) -> Iterator[None]:
        """The entries to look at or change: the lock held, the owners collected meanwhile forgotten,
        and a collection while they are looked at leaves them as they are (forgotten next time)."""
        with self._lock:
            self._reading = True
            try:
                self._drop_gone()
                yield
            finally:
                self._reading = False

    def _drop_gone(self) -> None:
        """Forget the owners collected: an entry of a new owner at the address stays."""
        while self._gone:
            key = self._gone.pop()
            entry = self._live.get(key)
            if entry is not None and entry[0]() is None:
                del self._live[key]
                self._tails.remove(entry[1])

    def filter(self, record: logging.LogRecord) -> bool:
        if not self._live:
            return True
        if record.exc_info and record.exc_info[1] is not None:
            with self._entries():
                secrets = [value for _, values in self._live.values() for value in values]
            scrub_record(record, Redactor(secrets))
            return True
        text = _shown_text(record)
        others = _other_parts(record)
        if others:  # a call stack, a traceback as text, extras: searched with the message, at once
            text = "\n".join([text, *(value for _, value in others)])
        with self._entries():
            found = self._tails.found_in(text)
        if found:
            scrub_record(record, Redactor(found))
        return True


#: Each four characters of a text, overlapping: found in C, for a text of any length.
_QUADS = re.compile(r"(?=(.{4}))", re.DOTALL)
#: A longer text is searched in pieces of this many characters (each with the three after it, so
#: that a tail across two pieces is found): its four-character pieces take memory.
_CHUNK = 65_536
#: With this many forms or fewer, a text is searched for each in turn: a few searches in C cost
#: less than the four-character pieces of a long text.
_FEW_FORMS = 16


class _Tails:
    """Credentials indexed by the last four characters of each form they are shown in
    (`shown_forms`), each counted as often as it was added: which of them a text holds is found
    by looking its four-character pieces up, whatever the number of credentials, a long text a
    piece at a time. Shorter forms, and all of them while there are few, are looked for one by one."""

    def __init__(self) -> None:
        self._by_tail: dict[str, dict[tuple[str, str], int]] = {}
        self._short: dict[tuple[str, str], int] = {}
        self._count = 0  # the (form, credential) pairs held

    def add(self, values: Iterable[str]) -> None:
        for pair in self._pairs(values):
            form = pair[0]
            bucket = self._short if len(form) < 4 else self._by_tail.setdefault(form[-4:], {})
            if pair not in bucket:
                self._count += 1
            bucket[pair] = bucket.get(pair, 0) + 1

    def remove(self, values: Iterable[str]) -> None:
        for pair in self._pairs(values):
            form = pair[0]
            bucket = self._short if len(form) < 4 else self._by_tail.get(form[-4:])
            if bucket is None or pair not in bucket:
                continue
            bucket[pair] -= 1
            if not bucket[pair]:
                del bucket[pair]
                self._count -= 1
                if not bucket and len(form) >= 4:
                    del self._by_tail[form[-4:]]

    def __len__(self) -> int:
        return self._count

    @staticmethod
    def _pairs(values: Iterable[str]) -> set[tuple[str, str]]:
        """(form, credential) for each form of each credential."""
        return {(form, value) for value in values if value for form in shown_forms(value)}

    def found_in(self, text: str) -> list[str]:
        """The credentials one of whose forms ``text`` holds."""
        pairs: Iterable[tuple[str, str]]
        if self._count <= _FEW_FORMS:
            pairs = [p for bucket in self._by_tail.values() for p in bucket]
        else:
            tails: set[str] = set()
            for start in range(0, max(len(text) - 3, 1), _CHUNK):
                tails |= self._by_tail.keys() & set(_QUADS.findall(text, start, start + _CHUNK + 3))
            pairs = [p for tail in tails for p in self._by_tail[tail]]
        return sorted({value for form, value in [*pairs, *self._short] if form in text})


def _shown_text(record: logging.LogRecord) -> str:
    """The text of ``record`` a handler can show: its message or, when it cannot be formatted, its
    ``msg`` and ``args``, which the logging module prints in its report of the failure."""
    try:
        return record.getMessage()
    except Exception:
        try:
            return f"{record.msg!s} {record.args!r}"
        except Exception:  # the report says it cannot print them either
            return ""


#: The attributes of every record, and those a formatter sets (``message``, ``asctime``, made
#: anew each time it formats one): any other is an ``extra=`` (or a record factory's) that a
#: host's format string can print (``%(url)s``).
_STANDARD = frozenset(vars(logging.LogRecord("", 0, "", 0, "", (), None))) | {"message", "asctime"}
#: How many attributes a record made by the logging module has: one with no more has no extra.
_PLAIN_RECORD = len(vars(logging.LogRecord("", 0, "", 0, "", (), None)))


def _other_parts(record: logging.LogRecord) -> list[tuple[str, str]]:
    """(attribute, text) of each part of ``record`` besides its message and ``exc_info`` that a
    formatter prints: its call stack (``stack_info``), a traceback already formatted (``exc_text``,
    which a record sent from another process carries without ``exc_info``) and each extra that is
    a string. A record without any costs a look at two attributes and a count of them all."""
    attributes = record.__dict__
    extras = len(attributes) > _PLAIN_RECORD
    if not extras and attributes.get("stack_info") is None and attributes.get("exc_text") is None:
        return []
    names = ["stack_info", "exc_text", *(attributes.keys() - _STANDARD if extras else ())]
    return [(name, value) for name in names if isinstance(value := attributes.get(name), str)]


def _scrub_other_parts(record: logging.LogRecord, redactor: Redactor) -> None:
    """Scrub ``redactor``'s secrets out of `_other_parts` of ``record``, in place: an extra that is
    not a string is left as it is (a host's format may need its type: ``%(attempt)d``)."""
    for name, value in _other_parts(record):
        if redactor._found_in(value):
            setattr(record, name, redactor.scrub(value))


def scrub_record(record: logging.LogRecord, redactor: Redactor) -> None:
    """Scrub ``redactor``'s secrets out of ``record`` in place: its message and, when the
    traceback it carries quotes one, that traceback (then folded into the message as text); its
    call stack, a traceback it holds as text and its string extras (`_other_parts`)."""
    try:
        text = record.getMessage()
    except Exception:  # malformed: the logging module reports it with its msg and args
        _scrub_malformed(record, redactor)
        _scrub_other_parts(record, redactor)
        return
    trace = ""
    if record.exc_info and record.exc_info[1] is not None:
        trace = record.exc_text or "".join(traceback.format_exception(record.exc_info[1])).rstrip()
    if redactor._found_in(trace):
        record.msg, record.args = f"{redactor.scrub(text)}\n{redactor.scrub(trace)}", ()
        record.exc_info, record.exc_text = None, None
    elif redactor._found_in(text):
        record.msg, record.args = redactor.scrub(text), ()
    if record.exc_info and record.exc_info[1] is not None:
        # Kept for the handlers: what it carries is made safe (an HTTP error's request and headers).
        redactor.make_safe(record.exc_info[1])
    _scrub_other_parts(record, redactor)


def _scrub_malformed(record: logging.LogRecord, redactor: Redactor) -> None:
    """Scrub ``redactor``'s secrets out of a record that cannot be formatted, in place: its ``msg``
    and ``args`` become scrubbed strings (as many, so that it stays malformed and is reported so),
    and a traceback that quotes one is kept as scrubbed text (``exc_text``)."""
    if redactor._found_in(_shown_text(record)):
        args = record.args if isinstance(record.args, tuple) else (record.args,)
        record.msg = redactor.scrub(str(record.msg))
        record.args = tuple(_scrubbed_arg(arg, redactor) for arg in args)
    if record.exc_info and record.exc_info[1] is not None:
        trace = record.exc_text or "".join(traceback.format_exception(record.exc_info[1])).rstrip()
        if redactor._found_in(trace):
            record.exc_info, record.exc_text = None, redactor.scrub(trace)
        else:
            redactor.make_safe(record.exc_info[1])


def _scrubbed_arg(arg: object, redactor: Redactor) -> object:
    """``arg`` itself, or when its repr shows a secret, its text scrubbed."""
    try:
        shown = repr(arg)
    except Exception:
        return "[REDACTED]"
    if not redactor._found_in(shown):
        return arg
    return redactor.scrub(arg if isinstance(arg, str) else shown)


URL_LOGS = _UrlCredentialsFilter()


def _http_libraries() -> Iterator[Any]:
    """httpx, and httpx2 (the MCP SDK's HTTP client, with errors of its own) once it is imported:
    no error of it can exist before."""
    yield httpx
    httpx2 = sys.modules.get("httpx2")
    if httpx2 is not None:
        yield httpx2


def hide_url_credentials(owner: object, url: str, loggers: Iterable[str]) -> None:
    """Scrub the credentials in ``url`` out of the records of ``loggers`` for as long as
    ``owner`` lives."""
    secrets = url_credentials(url)
    if secrets:
        URL_LOGS.watch(owner, secrets, loggers)


def url_credentials(url: str) -> list[str]:
    """The credentials in ``url``, as written and percent-decoded: its user info
    (``user:password``, and the password alone) and the values of its credential query
    parameters (``?key=...``)."""
    parsed = httpx.URL(url)
    userinfo = parsed.userinfo.decode("ascii", "replace")
    out = [p for p in (userinfo, unquote(userinfo), parsed.password or "") if len(p) >= _MIN_PART]
    for pair in parsed.query.decode("ascii", "replace").split("&"):
        name, eq, value = pair.partition("=")
        if eq and value and is_query_credential(unquote(name)):
            out += [value, *credential_parts(unquote_plus(value))]
    return out
