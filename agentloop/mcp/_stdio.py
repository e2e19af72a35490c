"""The stdio transport of `agentloop.mcp`: an MCP server as a subprocess (POSIX), one JSON-RPC
message per line on its stdin and stdout. It yields the stream pair the SDK's `ClientSession`
reads and writes, in place of the SDK's own ``stdio_client``, which:

- framed quadratically (each 64 KiB read was joined to all the line before it: a 40 MB result
  took 9 s of CPU) and without bound: here a message may hold ``max_message_size`` bytes, past
  which the connection ends with an error that says so;
- logged every stdout line that is not JSON-RPC (a banner, a stray ``print``) as an ERROR with
  a traceback quoting it: here such a line is skipped with one warning per connection;
- handed the server the host's own stderr (which then had to be a real file): here stderr is
  read line by line into the ``agentloop`` log (INFO), with the credentials the host passed in
  ``env`` or on the command line scrubbed, and its last lines say why a server stopped;
- dropped an answer holding bytes that are not UTF-8 or a lone surrogate, or one it could not
  read (cut short, of the wrong shape), leaving its request waiting for ever: here the first is
  read with U+FFFD, and the second fails its request (`_answers`), or, cut short before its id
  (no request can be told), ends the connection, which fails every call waiting on it;
- noticed a server's death only at the end of its stdout, which a process it left behind can
  hold open for ever: here its exit ends the connection too.

The server is stopped as the MCP spec says, with what it left in its process group (`_stop`).
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
import logging
import signal
import sys
from collections.abc import AsyncIterator, Awaitable, Mapping, Sequence
from contextlib import AbstractAsyncContextManager

import anyio
from mcp import StdioServerParameters, types
from mcp.client.stdio import get_default_environment, stdio_client
from mcp.shared.message import SessionMessage

from .._jsondepth import loads
from .._process import track, uncancellable, untrack
from .._unicode import json_escapes_surrogate, scrub_json
from ..models._http import Redactor
from ._answers import cut_before_id, error_answer, undecodable_answer
from ._child import ServerChild, spawn
from ._connection import Connect, Streams
from ._stop import stop

log = logging.getLogger("agentloop")

_DRAIN = 0.25  # seconds between one sign of a server's end (exit, end of stdout) and the other
_READ_AHEAD = 1 << 20  # bytes of whole messages read ahead of the session before reading pauses
_STDERR_BYTES = 8 << 10  # bytes of one stderr line kept (the rest of a longer one is dropped)
_STDERR_CHARS = 2000  # characters of one stderr line logged
_STDERR_TAIL = 5  # stderr lines kept for the error that says why a server stopped
_STDERR_LOGGED = 20  # past the window's budget, of the lines one read ends the last ones logged
_STDERR_WINDOW = 1.0  # seconds of the stderr budget's window
_STDERR_BUDGET_LINES = 200  # stderr lines of a window logged in full
_STDERR_BUDGET_BYTES = 64 << 10  # bytes of stderr lines of a window logged in full
_EXCERPT = 200  # characters quoted of a stdout line that is not JSON-RPC


@contextlib.asynccontextmanager
async def stdio_transport(
    command: str,
    args: Sequence[str],
    *,
    env: Mapping[str, str] | None,
    cwd: str | None,
    label: str,
    max_message_size: int | None,
    secrets: Sequence[str] = (),
) -> AsyncIterator[tuple[Stdout, Stdin]]:
    """Start ``command`` in a new session (so its own process group), with the SDK's safe default
    environment and ``env`` over it, and yield its (stdout, stdin) streams; stop it on the way out,
    even when cancelled (the cancellation is raised once it is stopped).

    ``secrets`` (the server's credentials, `server_credentials`) are scrubbed out of what it writes
    to stderr, and of a line on its stdout that is quoted. Raises what starting the process raises
    (`FileNotFoundError` for a missing command)."""
    loop = asyncio.get_running_loop()
    pipes = Pipes(loop, label, Redactor(secrets), max_message_size)
    # Started without awaiting: nothing here is left half connected when the host's loop is closed
    # (or its tasks cancelled) under the start.
    child = spawn(loop, command, args, {**get_default_environment(), **(env or {})}, cwd)
    pipes.child = child
    track(child)  # killed in loop.close() if the loop is closed under the connection
    try:
        child.begin(pipes)
        yield pipes.stdout, pipes.stdin
    finally:
        try:
            if not child.loop.is_closed():  # closed with its loop: killed as the loop closed
                await uncancellable(stop(child, pipes))
        finally:
            untrack(child)


def stdio_connect(
    command: str,
    args: Sequence[str],
    *,
    env: Mapping[str, str] | None,
    cwd: str | None,
    label: str,
    max_message_size: int | None,
    secrets: Sequence[str] = (),
) -> Connect:
    """What opens a connection to ``command`` run with ``args`` (see `MCPServer.stdio`): this
    module's `stdio_transport`, or on Windows, which has no process groups, the SDK's own."""
    if sys.platform == "win32":  # pragma: no cover - process groups are POSIX: the SDK's transport
        params = StdioServerParameters(command=command, args=list(args), env=dict(env or {}) or None, cwd=cwd)
        return lambda: stdio_client(params)
    argv = tuple(args)
    environment = dict(env or {})

    def connect() -> AbstractAsyncContextManager[Streams]:
        return stdio_transport(
            command, argv, env=environment, cwd=cwd, label=label, max_message_size=max_message_size, secrets=secrets
        )

    return connect

class _CutBeforeId(Exception):
    """A line holds an answer cut short before its id: no request can be given it (`Pipes.parse`)."""


class Pipes:
    """The server process's pipes: stdout cut into lines, stderr into the log, stdin's flow
    control, and the end of the connection (``end_reason`` once it has ended). Told of them by
    the server's `ServerChild` (``child``)."""

    def __init__(self, loop: asyncio.AbstractEventLoop, label: str, scrub: Redactor, limit: int | None) -> None:
        self.loop = loop
        self.label = label
        self.scrub = scrub
        self.limit = limit
        self.child: ServerChild | None = None
        self.open = {0, 1, 2}  # the pipes not yet lost
        self.exited: asyncio.Future[None] = loop.create_future()
        self.stdout = Stdout(self)
        self.stdin = Stdin(self)
        self.end_reason: str | None = None  # set when the connection has ended
        self.tail: collections.deque[str] = collections.deque(maxlen=_STDERR_TAIL)
        self.lines: collections.deque[bytearray] = collections.deque()  # whole stdout lines not yet read
        self._queued = 0  # their bytes
        self._partial = bytearray()  # the stdout line being received
        self._paused = False  # reading stdout is paused: the session is behind
        self._readable: asyncio.Future[None] | None = None  # the reader waiting for a line
        self._end_timer: asyncio.TimerHandle | None = None
        self._signs = False  # a sign that the server is going was seen (`_going`)
        self._err = bytearray()  # the stderr line being received
        self._err_skip = False  # dropping the rest of an overlong stderr line
        self._err_window = -_STDERR_WINDOW  # when the stderr budget's window began (loop time)
        self._err_lines_left = 0  # stderr lines the window may still log in full
        self._err_bytes_left = 0  # and their bytes
        self._writable: asyncio.Future[None] | None = None  # set while stdin's buffer is full

    # -- what the server child tells ------------------------------------------------

    def pipe_data_received(self, fd: int, data: bytes) -> None:
        if fd == 1:
            self._stdout(data)
        else:
            self._stderr(data)

    def pipe_connection_lost(self, fd: int, exc: Exception | None = None) -> None:
        self.open.discard(fd)
        if fd == 2:
            if self._err and not self._err_skip:
                self._err_line(bytes(self._err))
                self._err.clear()
        elif fd == 0:
            self.resume_writing()  # a writer waiting finds the pipe gone
            self._going()
        else:
            if self._partial and self.end_reason is None:  # a last message without its line break
                self._stdout(b"\n")
            self._going()

    def process_exited(self) -> None:
        if not self.exited.done():
            self.exited.set_result(None)
        self._going()

    def pause_writing(self) -> None:
        if self._writable is None:
            self._writable = self.loop.create_future()

    def resume_writing(self) -> None:
        writable, self._writable = self._writable, None
        if writable is not None and not writable.done():
            writable.set_result(None)

    # -- stdout ----------------------------------------------------------------------

    def _stdout(self, data: bytes) -> None:
        if self.end_reason is not None:
            return  # past an overlong message: read on (so the server is not blocked), keep nothing
        partial = self._partial
        start = len(partial)
        partial += data
        end = partial.rfind(b"\n", start)  # only the new bytes are searched: linear in the output
        if end >= 0:
            lines = partial[:end].split(b"\n")
            del partial[: end + 1]
            limit = self.limit
            if limit is not None and any(len(line) > limit for line in lines):
                self._too_long()
                return
            self.lines.extend(lines)
            self._queued += end + 1
            self._wake()
            if self._queued > _READ_AHEAD and not self._paused:
                self._pause(True)
        if self.limit is not None and len(partial) > self.limit:
            self._too_long()

    def _too_long(self) -> None:
        self._partial.clear()
        self._end(f"the server sent a message of more than {self.limit} bytes (max_message_size)")

    def _pause(self, paused: bool) -> None:
        if self.child is not None:
            self.child.pause_reading(paused, self)
        self._paused = paused
        # What is left in the paused pipe is not a process left behind holding it: the drain
        # delay of a server that is going runs only while reading goes on (see `_going`).
        timer, self._end_timer = self._end_timer, None
        if timer is not None:
            timer.cancel()
        if not paused and self._signs:
            self._going()

    def next_line(self) -> bytearray | None:
        if not self.lines:
            return None
        line = self.lines.popleft()
        self._queued -= len(line) + 1
        if self._paused and self._queued <= _READ_AHEAD // 2:
            self._pause(False)
        return line

    def readable(self) -> Awaitable[None]:
        if self._readable is None or self._readable.done():
            self._readable = self.loop.create_future()
        return self._readable

    def _wake(self) -> None:
        readable, self._readable = self._readable, None
        if readable is not None and not readable.done():
            readable.set_result(None)

    def parse(self, line: bytearray) -> list[SessionMessage]:
        """The messages on ``line``: one, or those of a JSON-RPC batch (a JSON array of them,
        which protocol 2025-03-26 lets a server send); none for a blank line or one that is not
        JSON-RPC. A batch's elements that are not JSON-RPC messages are skipped."""
        if not line.strip():
            return []
        if line.lstrip()[:1] == b"[":
            return self._batch(line)
        try:
            return [SessionMessage(types.jsonrpc_message_adapter.validate_json(line, by_name=False))]
        except ValueError:  # pydantic's ValidationError, invalid JSON included
            pass
        try:
            message = self._salvaged(line)
        except _CutBeforeId:
            self._end("the server sent an answer cut short before its id (which request it answers cannot be told)")
            return []
        if message is None:
            self._not_json_rpc(line)
            return []
        return [SessionMessage(message)]

    def _salvaged(self, line: bytearray) -> types.JSONRPCMessage | None:
        """The message on a line `parse` could not read as it is: one holding bytes that are not
        UTF-8 or a lone surrogate, read with U+FFFD in their place (a warning says so); one nested
        deeper than pydantic reads JSON (near 200 levels) but no deeper than `MAX_JSON_DEPTH`; or
        an answer it still cannot read (of the wrong shape, cut short, nested too deeply), read as
        an error answer to its request, which then fails rather than waits for ever. None for
        anything else (a line that is not JSON-RPC). Raises `_CutBeforeId` for an answer cut short
        before its id."""
        try:
            value, mangled = self._decoded(line)
        except ValueError:  # not JSON, or nested more than MAX_JSON_DEPTH levels
            text = bytes(line).decode("utf-8", "replace")
            answer = undecodable_answer(text, self.label)
            if answer is None and cut_before_id(text):
                raise _CutBeforeId from None
            return answer
        try:
            message: types.JSONRPCMessage = types.jsonrpc_message_adapter.validate_python(value, by_name=False)
        except ValueError:
            return error_answer(value, self.label)
        if mangled:
            self._mangled()
        return message

    def _decoded(self, line: bytearray) -> tuple[object, bool]:
        """The JSON on ``line``, and whether it was not valid Unicode: its bytes that are not
        UTF-8 and its lone surrogates are U+FFFD then (the caller warns, `_mangled`). Raises
        ValueError for a line that is not JSON or is nested more than `MAX_JSON_DEPTH` levels."""
        raw = bytes(line)
        try:
            text = raw.decode("utf-8")
        except UnicodeDecodeError:
            return scrub_json(loads(raw.decode("utf-8", "replace"))), True
        value = loads(text)
        if json_escapes_surrogate(text):  # may hold one (a cheap check): scrubbing tells
            scrubbed = scrub_json(value)
            return scrubbed, scrubbed != value
        return value, False

    def _mangled(self) -> None:
        log.log(
            logging.DEBUG if self.stdout.mangled else logging.WARNING,
            "MCP server %s wrote a message that is not valid UTF-8 (or holds a lone surrogate): read with "
            "U+FFFD in place of what could not be read",
            self.label,
        )
        self.stdout.mangled = True

    def _batch(self, line: bytearray) -> list[SessionMessage]:
        try:
            items, mangled = self._decoded(line)
        except ValueError:  # not JSON, or nested more than MAX_JSON_DEPTH levels
            items, mangled = None, False
        if mangled:
            self._mangled()
        messages: list[SessionMessage] = []
        for item in items if isinstance(items, list) else ():
            try:
                messages.append(SessionMessage(types.jsonrpc_message_adapter.validate_python(item, by_name=False)))
            except ValueError:
                error = error_answer(item, self.label)  # its request fails rather than waits
                if error is not None:
                    messages.append(SessionMessage(error))
        if not isinstance(items, list) or len(messages) < len(items) or not items:
            self._not_json_rpc(line)
        return messages

    def _not_json_rpc(self, line: bytearray) -> None:
        text = self.scrub.scrub(bytes(line[: 64 << 10]).decode("utf-8", "replace").strip())
        log.log(
            logging.DEBUG if self.stdout.noisy else logging.WARNING,
            "MCP server %s wrote a line to stdout that is not a JSON-RPC message (skipped; a server "
            "must write its logs to stderr): %r",
            self.label,
            text[:_EXCERPT],
        )
        self.stdout.noisy = True

    # -- the end of the connection -----------------------------------------------------

    def _going(self) -> None:
        """One sign that the server is going: its exit, or the end of its stdout or stdin. The
        connection ends when the server has exited and its stdout has ended (its last messages
        read), or `_DRAIN` s after the first sign (a process it left behind holds its stdout),
        counted only while stdout is read: not while reading is paused for a session behind."""
        self._signs = True
        if self.end_reason is not None:
            return
        if self.exited.done() and 1 not in self.open:
            self._end()
        elif self._end_timer is None and not self._paused:
            self._end_timer = self.loop.call_later(_DRAIN, self._end)

    def _end(self, reason: str | None = None) -> None:
        if self.end_reason is not None:
            return
        if self._end_timer is not None:
            self._end_timer.cancel()
        code = self.child.returncode if self.child is not None else None
        if reason is None and code is not None:
            reason = f"the server process exited with status {code}"
            if code < 0:
                with contextlib.suppress(ValueError):
                    reason = f"the server process was killed by {signal.Signals(-code).name}"
        self.end_reason = reason or f"the server closed its {'stdout' if 1 not in self.open else 'stdin'}"
        self._wake()

    # -- stderr ------------------------------------------------------------------------

    def _stderr(self, data: bytes) -> None:
        """A block read from stderr. Each window of `_STDERR_WINDOW` seconds logs its first lines in
        full (up to `_STDERR_BUDGET_LINES` lines or `_STDERR_BUDGET_BYTES`), so a traceback written
        at once is logged whole. Past that budget a flood (a server logging millions of lines) costs
        about a split per block, not Python work per line: of the lines a block ends, the last
        `_STDERR_LOGGED` are logged and kept for the tail, the others only counted."""
        *ended, rest = data.split(b"\n")
        if ended:
            if self._err_skip:  # the rest of an overlong line, logged already: dropped
                self._err_skip = False
                del ended[0]
            elif self._err:
                ended[0] = bytes(self._err) + ended[0]
            self._err.clear()
            self._err_lines(ended)
        if rest and not self._err_skip:
            self._err += rest[: _STDERR_BYTES + 1 - len(self._err)]
            if len(self._err) > _STDERR_BYTES:  # logged now, the rest of it dropped
                self._err_line(bytes(self._err))
                self._err.clear()
                self._err_skip = True

    def _err_lines(self, lines: list[bytes]) -> None:
        full = self._err_budget(lines)
        for line in lines[:full]:
            self._err_line(line)
        dropped = len(lines) - full - _STDERR_LOGGED
        if dropped > 0:
            log.info(
                "MCP server %s (stderr): %d lines not logged (more than %d lines or %d KiB in %g s)",
                self.label,
                dropped,
                _STDERR_BUDGET_LINES,
                _STDERR_BUDGET_BYTES >> 10,
                _STDERR_WINDOW,
            )
        for line in lines[max(full, len(lines) - _STDERR_LOGGED) :]:
            self._err_line(line)

    def _err_budget(self, lines: list[bytes]) -> int:
        """How many of ``lines``, from the first, the window's budget logs in full (spending it);
        a new window, once the last one is over, has the whole budget."""
        now = self.loop.time()
        if now - self._err_window >= _STDERR_WINDOW:
            self._err_window = now
            self._err_lines_left, self._err_bytes_left = _STDERR_BUDGET_LINES, _STDERR_BUDGET_BYTES
        full = 0
        for line in lines[: self._err_lines_left]:  # bounded by the budget, not by the block
            size = min(len(line), _STDERR_BYTES) + 1
            if size > self._err_bytes_left:
                self._err_bytes_left = 0
                break
            self._err_bytes_left -= size
            full += 1
        self._err_lines_left -= full
        return full

    def _err_line(self, line: bytes) -> None:
        text = self.scrub.scrub(line[: _STDERR_BYTES + 1].decode("utf-8", "replace").rstrip("\r"))
        if len(text) > _STDERR_CHARS:
            text = text[:_STDERR_CHARS] + "…"
        if text.strip():
            self.tail.append(text)
            log.info("MCP server %s (stderr): %s", self.label, text)


class Stdout:
    """The server's messages, read by the SDK's session (its ``ReadStream``); ``end_reason``
    and ``stderr_tail`` say why the connection ended, once it has."""

    def __init__(self, pipes: Pipes) -> None:
        self._pipes = pipes
        self._closed = False
        self._batch: collections.deque[SessionMessage] = collections.deque()  # the rest of a batch read
        self.noisy = False  # a line that is not JSON-RPC was seen (and warned about)
        self.mangled = False  # a message that is not valid Unicode was seen (and warned about)

    @property
    def end_reason(self) -> str | None:
        return self._pipes.end_reason

    @property
    def stderr_tail(self) -> str:
        return " | ".join(self._pipes.tail)

    async def receive(self) -> SessionMessage:
        pipes = self._pipes
        while True:
            if self._closed:
                raise anyio.ClosedResourceError
            if self._batch:
                return self._batch.popleft()
            line = pipes.next_line()
            if line is not None:
                self._batch.extend(pipes.parse(line))
            elif pipes.end_reason is not None:
                raise anyio.EndOfStream
            else:
                await pipes.readable()

    def __aiter__(self) -> Stdout:
        return self

    async def __anext__(self) -> SessionMessage:
        try:
            return await self.receive()
        except anyio.EndOfStream:
            raise StopAsyncIteration from None

    async def aclose(self) -> None:
        self._closed = True
        self._pipes._wake()

    async def __aenter__(self) -> Stdout:
        return self

    async def __aexit__(self, *exc_info: object) -> None:
        await self.aclose()


class Stdin:
    """Messages to the server, written by the SDK's session (its ``WriteStream``)."""

    def __init__(self, pipes: Pipes) -> None:
        self._pipes = pipes
        self._closed = False

    async def send(self, item: SessionMessage, /) -> None:
        """Write ``item``; a request then waits while the pipe's buffer is full (the server is
        behind), a notification never does. Raises `anyio.ClosedResourceError` once closed,
        `anyio.BrokenResourceError` once the server's stdin is gone (the session turns both into
        "Connection closed")."""
        if self._closed:
            raise anyio.ClosedResourceError
        pipes = self._pipes
        child = pipes.child
        if 0 not in pipes.open or child is None or not child.stdin_open:
            raise anyio.BrokenResourceError
        child.write(item.message.model_dump_json(by_alias=True, exclude_unset=True).encode() + b"\n", pipes)
        # The pipe's buffer is full: a request waits until the server reads. A notification (a
        # few bytes) does not: the notifications/cancelled of an abort must not wait for a server
        # that stopped reading, the abort would wait with it.
        if pipes._writable is not None and not isinstance(item.message, types.JSONRPCNotification):
            await asyncio.shield(pipes._writable)

    async def aclose(self) -> None:
        self._closed = True

    async def __aenter__(self) -> Stdin:
        return self

    async def __aexit__(self, *exc_info: object) -> None:
        await self.aclose()
