"""The log filter that keeps live credentials out of records scrubs every part of a record a
handler prints: the message, a traceback (as ``exc_info`` or already formatted as ``exc_text``),
the call stack (``stack_info=True``) and the ``extra=`` attributes a format string names."""

from __future__ import annotations

import contextlib
import logging
import logging.handlers
import os
import pickle
import subprocess
import sys
from collections.abc import Iterator

import httpx
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from agentloop import AbortController, Message
from agentloop.models import ModelRequest, OpenAIChatModel
from agentloop.models._http._secrets import (
    Redactor,
    _UrlCredentialsFilter,
    scrub_record,
    shown_forms,
    url_credentials,
)

URL = "https://gw.invalid/v1?key=topsecret123456"
SECRET = "topsecret123456"
SHOWN = "https://gw.invalid/v1?key=[REDACTED]"


class _Owner:
    """Something credentials live with (a model's connection, an MCP server)."""


class _Kept(logging.Handler):
    """Keeps the records it is handed, and what its format makes of them."""

    def __init__(self, fmt: str) -> None:
        super().__init__(logging.DEBUG)
        self.setFormatter(logging.Formatter(fmt))
        self.records: list[logging.LogRecord] = []
        self.lines: list[str] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.records.append(record)
        self.lines.append(self.format(record))


@contextlib.contextmanager
def _watched(others: int, fmt: str = "%(message)s") -> Iterator[tuple[logging.Logger, _Kept]]:
    """A logger whose records pass a filter watching ``URL``'s credentials (and those of ``others``
    owners more: past a few, a record is looked up by the credentials' tails), into a `_Kept`."""
    owners = [_Owner() for _ in range(others + 1)]
    scrubber = _UrlCredentialsFilter()
    scrubber.watch(owners[0], url_credentials(URL), ())
    for n, owner in enumerate(owners[1:]):
        scrubber.watch(owner, [f"other-secret-{n:03d}"], ())
    logger = logging.getLogger("tests.secrets_records")
    kept = _Kept(fmt)
    logger.addFilter(scrubber)
    logger.addHandler(kept)
    logger.setLevel(logging.DEBUG)
    logger.propagate = False
    try:
        yield logger, kept
    finally:
        logger.removeFilter(scrubber)
        logger.removeHandler(kept)
        logger.setLevel(logging.NOTSET)
        logger.propagate = True
        del owners


def _connect(logger: logging.Logger, url: str) -> None:
    logger.warning("connecting", stack_info=True)


@pytest.mark.parametrize("others", [0, 30])
def test_the_call_stack_printed_with_a_record_shows_no_credential(others: int) -> None:
    with _watched(others) as (logger, kept):
        _connect(logger, "https://gw.invalid/v1?key=topsecret123456")  # this line is in the stack printed
    [line] = kept.lines
    assert line.startswith("connecting\nStack (most recent call last):")
    assert SHOWN in line  # the source line of the caller's frame, scrubbed
    assert SECRET not in line


@pytest.mark.parametrize("others", [0, 30])
def test_an_extra_a_format_prints_shows_no_credential_and_other_extras_are_kept(others: int) -> None:
    payload = {"url": URL}
    with _watched(others, "%(message)s url=%(url)s attempt=%(attempt)d") as (logger, kept):
        logger.info("request failed", extra={"url": URL, "attempt": 3, "payload": payload})
        logger.info("request sent", extra={"url": "https://gw.invalid/v1", "attempt": 1})
    assert kept.lines == [f"request failed url={SHOWN} attempt=3", "request sent url=https://gw.invalid/v1 attempt=1"]
    record = kept.records[0]
    assert record.attempt == 3
    assert record.payload is payload  # not a string: left as it is
    assert payload == {"url": URL}


def test_an_extra_of_a_record_with_a_traceback_shows_no_credential() -> None:
    with _watched(0, "%(message)s url=%(url)s") as (logger, kept):
        try:
            raise ConnectionError("connection refused")
        except ConnectionError:
            logger.exception("request failed", extra={"url": URL}, stack_info=True)
    [line] = kept.lines
    assert line.startswith(f"request failed url={SHOWN}\nTraceback")
    assert "ConnectionError: connection refused" in line and "Stack (most recent call last):" in line
    assert SECRET not in line


@pytest.mark.parametrize("others", [0, 30])
def test_a_traceback_already_formatted_as_text_shows_no_credential(others: int) -> None:
    # A record from another process, as a socket handler sends it: its traceback as text only.
    try:
        raise ValueError(f"refused {URL}")
    except ValueError:
        sent = logging.LogRecord("tests", logging.ERROR, __file__, 1, "request failed", (), sys.exc_info())
    pickled = logging.handlers.SocketHandler("localhost", None).makePickle(sent)
    received = logging.makeLogRecord(pickle.loads(pickled[4:]))
    assert received.exc_info is None and SECRET in str(received.exc_text)
    with _watched(others) as (logger, kept):
        logger.handle(received)
    [line] = kept.lines
    assert line.startswith("request failed\nTraceback") and f"ValueError: refused {SHOWN}" in line
    assert SECRET not in line


@pytest.mark.parametrize(
    "url",
    [
        "https://gw.invalid/v1?key=ab%2fcd%2bef0123",  # lower-case escapes, as written
        "https://us%2fer:pa%2fss0123@gw.invalid/v1",
    ],
)
async def test_a_credential_written_with_lower_case_escapes_is_scrubbed_from_httpxs_line(url: str) -> None:
    """httpx keeps the escapes of a URL as they are written, so its line quotes the credential in
    the form ``base_url`` holds it, which the filter watches."""
    kept = _Kept("%(message)s")
    logger = logging.getLogger("httpx")
    level = logger.level
    logger.addHandler(kept)
    logger.setLevel(logging.INFO)
    transport = httpx.MockTransport(lambda request: httpx.Response(401, json={"error": {"message": "no"}}))
    try:
        async with httpx.AsyncClient(transport=transport) as client:
            model = OpenAIChatModel("m", api_key="sk-records-0123456789", base_url=url, http_client=client)
            request = ModelRequest(messages=[Message.user("hi")])
            with pytest.raises(Exception, match="401"):
                async with contextlib.aclosing(model.stream(request, AbortController().signal)) as stream:
                    async for _ in stream:
                        pass
            del model
    finally:
        logger.removeHandler(kept)
        logger.setLevel(level)
    shown = "\n".join(kept.lines)
    assert "HTTP Request: POST" in shown and "[REDACTED]" in shown
    assert "%2f" not in shown.lower(), shown


_SECRET = st.text(alphabet=st.sampled_from("abcXYZ019-_.:/%@ \"'\\é\n"), min_size=1, max_size=12)
_PARTS = ("msg", "stack_info", "exc_text", "url")


def _made(parts: dict[str, str]) -> logging.LogRecord:
    record = logging.LogRecord("tests", logging.INFO, __file__, 1, "%s", (parts["msg"],), None)
    record.stack_info = parts["stack_info"]
    record.exc_text, record.url = parts["exc_text"], parts["url"]
    return record


@settings(max_examples=150, deadline=None)
@given(secrets=st.lists(_SECRET, min_size=1, max_size=8), others=st.sampled_from([0, 20]),
       shown=st.lists(st.tuples(st.integers(0, 7), st.sampled_from(_PARTS), st.booleans()), max_size=4),
       around=st.fixed_dictionaries({part: _SECRET for part in _PARTS}))  # fmt: skip
def test_every_part_of_a_record_is_scrubbed_as_a_search_for_every_live_credential_would(
    secrets: list[str], others: int, shown: list[tuple[int, str, bool]], around: dict[str, str]
) -> None:
    owners = [_Owner() for _ in range(len(secrets) + others)]
    scrubber = _UrlCredentialsFilter()
    for n, owner in enumerate(owners):
        scrubber.watch(owner, [secrets[n] if n < len(secrets) else f"other-secret-{n:03d}"], ())
    parts = dict(around)
    for i, part, first in shown:  # a form of a credential, glued to what is around it
        form = sorted(shown_forms(secrets[i % len(secrets)]))[0 if first else -1]
        parts[part] = parts[part] + form if first else form + parts[part]
    record, expected = _made(parts), _made(parts)
    scrubber.filter(record)
    scrub_record(expected, Redactor(secrets))
    formatter = logging.Formatter("%(message)s %(url)s")
    assert formatter.format(record) == formatter.format(expected)
    # "[REDACTED]" is made of none of the letters drawn: no form of a credential can be left in it.
    printed = [record.getMessage(), record.stack_info, record.exc_text, record.url]
    assert not [form for secret in secrets for form in shown_forms(secret) for text in printed if form in text]


def test_overlapping_forms_of_one_length_are_scrubbed_the_same_whatever_the_hash_seed() -> None:
    # Two credentials whose forms have one length and overlap in the text: the filter scrubs with
    # those a record was found to hold, and that must give what scrubbing with all of them gives,
    # in every process (a set's order follows the hash seed).
    text, watched, found = '.."."...".', ["..", "\\", '".'], ['".', ".."]
    code = (
        "from agentloop.models._http._secrets import Redactor\n"
        f"a = Redactor({watched!r}).scrub({text!r})\n"
        f"b = Redactor({found!r}).scrub({text!r})\n"
        "print(a == b, b)\n"
    )
    seen = set()
    for seed in range(8):
        out = subprocess.run(
            [sys.executable, "-c", code], capture_output=True, text=True, check=True,
            env={**os.environ, "PYTHONHASHSEED": str(seed)},
        ).stdout.split()
        assert out[0] == "True", (seed, out)
        seen.add(out[1])
    assert len(seen) == 1, seen  # the same scrubbed text in every process


@pytest.mark.parametrize("others", [0, 30])
def test_a_record_that_cannot_be_formatted_has_its_other_parts_scrubbed(others: int) -> None:
    # One argument for two placeholders: the filter scrubs what such a record carries, its
    # extras and call stack too, before a handler tries (and fails) to format it.
    with _watched(others) as (logger, _kept):
        record = logger.makeRecord(
            logger.name, logging.WARNING, __file__, 1, "POST %s %s", (URL,), None,
            extra={"url": URL}, sinfo=f"Stack (most recent call last):\n  connect({URL!r})",
        )
        for flt in logger.filters:
            assert isinstance(flt, logging.Filter) and flt.filter(record)
        assert SECRET not in record.url and SHOWN in record.url
        assert record.stack_info is not None and SECRET not in record.stack_info
        assert SHOWN in record.stack_info
