"""One live connection to an MCP server: its SDK session, run by a task of its own
(`Connection`), and the read stream that tells it when the server closed it (`_Watched`).

``Connect`` is what a transport gives it: a callable that opens the transport's stream pair.
"""

from __future__ import annotations

import asyncio
import dataclasses
import logging
from collections.abc import Callable
from contextlib import AbstractAsyncContextManager
from typing import Any

import anyio
from mcp import ClientSession, types
from mcp.shared.exceptions import MCPError
from mcp.shared.message import SessionMessage

from .. import __version__
from ..models._errbody import clipped
from ._answers import readable

log = logging.getLogger("agentloop")

#: What the client says it is in ``initialize`` (the SDK's default is a placeholder, "mcp" 0.1.0).
_CLIENT = types.Implementation(name="agentloop", version=__version__)

Streams = tuple[Any, Any]
Connect = Callable[[], AbstractAsyncContextManager[Streams]]


class Connection:
    """One live MCP session, owned by a background task.

    The SDK's transports are anyio task groups, which must be exited by the task
    that entered them; a dedicated owner task lets any task (a tool call, an
    abort hook, ``aclose``) use and close the connection.

    ``lost`` turns True when the transport's read stream ends: the server closed the
    connection (a stdio server's stdout ended, its process exited). Once the session is
    ready, ``on_lost`` is then called with the connection, at once. ``shown`` makes an error's
    text fit for a log line (the server's credentials scrubbed, the text cut).
    """

    def __init__(
        self,
        connect: Connect,
        label: str,
        timeout: float | None,
        on_message: Callable[[object], None],
        on_lost: Callable[[Connection], None],
        shown: Callable[[str], str] = clipped,
    ) -> None:
        self._stop = asyncio.Event()
        self._shown = shown  # what of an error's text a log line quotes (scrubbed, cut)
        self._on_message = on_message
        self._on_lost = on_lost
        self._ready: asyncio.Future[ClientSession] = asyncio.get_running_loop().create_future()
        self.label = label
        self.timeout = timeout  # for the initialize handshake
        self.lost = False
        self.listed = False  # the server's tools were listed on it (its SDK session knows them)
        self.first_listing: asyncio.Task[None] | None = None  # the listing its first call waits for
        self._read: Any = None  # the transport's read stream
        self._task = asyncio.create_task(self._run(connect), name=f"agentloop-mcp {label}")

    @property
    def ready(self) -> bool:
        """Whether the session is open (it may be lost since)."""
        ready = self._ready
        return ready.done() and not ready.cancelled() and ready.exception() is None

    @property
    def forgotten(self) -> bool:
        """Whether the server said it forgot this connection's session (an HTTP 404 to a message
        posted in it): the session is gone, whatever the other connections' are."""
        return bool(getattr(self._read, "forgotten", False))

    def reads(self, stream: object) -> bool:
        """Whether ``stream`` is this connection's transport read stream."""
        return stream is not None and self._read is stream

    def why(self, *, stderr: bool = False) -> str:
        """Why the server closed the connection, as far as the transport says (a stdio server's
        exit status; with ``stderr``, the last lines it wrote there): a suffix for a message."""
        reason = getattr(self._read, "end_reason", None)
        if not reason:
            return ""
        tail = getattr(self._read, "stderr_tail", "") if stderr else ""
        return f": {reason}" + (f"; the last lines of its stderr: {tail}" if tail else "")

    def closed(self, how: str = "", *, stderr: bool = False) -> MCPError:
        """The error for a request the closed connection failed, saying why it closed."""
        # The stderr tail is scrubbed as it is read: the cut cannot split a credential.
        message = clipped(f"Connection closed: MCP server {self.label}{how}{self.why(stderr=stderr)}")
        return MCPError(types.CONNECTION_CLOSED, message)

    async def session(self) -> ClientSession:
        # shield: a caller giving up must not cancel the shared future.
        return await asyncio.shield(self._ready)

    async def _run(self, connect: Connect) -> None:
        timeout = self.timeout
        try:
            async with connect() as (read, write):
                self._read = read
                watched = _Watched(read, self._ended, self.label)
                async with _Session(watched, write, message_handler=self._message, client_info=_CLIENT) as session:
                    watched.session = session
                    session.label, session.listing_timeout = self.label, timeout
                    try:
                        async with asyncio.timeout(timeout):
                            await session.initialize()
                    except TimeoutError:
                        raise TimeoutError(
                            f"MCP server {self.label} did not answer the initialize request within {timeout:g} s"
                        ) from None
                    self._ready.set_result(session)
                    if self.lost:  # it ended as the handshake finished
                        self._on_lost(self)
                    await self._stop.wait()
        except Exception as exc:
            if not self._ready.done():
                error = _unwrap(exc)
                if isinstance(error, MCPError) and error.code == types.CONNECTION_CLOSED and self.why():
                    error = self.closed(stderr=True)  # the server is stopped by now: its stderr is all in
                self._ready.set_exception(error)
            else:
                log.warning("MCP connection to %s ended with an error: %s", self.label, self._shown(repr(exc)))
        finally:
            if not self._ready.done():
                self._ready.set_exception(ConnectionError(f"MCP connection to {self.label} was closed"))
            if not self._ready.cancelled():
                self._ready.exception()  # mark it retrieved: callers may all have given up

    def _ended(self) -> None:
        if self.lost:
            return
        self.lost = True
        if self.ready:
            self._on_lost(self)  # before that, the handshake fails and `MCPServer.session` drops it

    async def _message(self, message: object) -> None:
        # Runs in the SDK's read loop: it must not wait for the server (a request from here
        # would never get its answer), so it only hands the news over.
        self._on_message(message)

    async def close(self) -> None:
        """Close the session and its transport (stops a stdio server). Idempotent."""
        self._stop.set()
        if not self._ready.done():
            self._task.cancel()  # still connecting: nobody is using it yet
        try:
            await asyncio.shield(self._task)
        except asyncio.CancelledError:
            # The cancellation of the connecting task above stays here; one of the caller's
            # own (its task is being cancelled) propagates.
            caller = asyncio.current_task()
            if not self._task.cancelled() or caller is None or caller.cancelling():
                raise


class _Session(ClientSession):
    """The SDK's session, whose listing after a call's answer is bounded.

    The SDK checks a call's result against the tool's output schema, and lists the tools first
    when it has not seen that one listed (the listing before the call timed out, say): a server
    that answers calls but never tools/list would hold that answer for ever. The listing is
    bounded by ``connect_timeout``, as every other is; past it the answer is kept, unchecked."""

    label = ""
    listing_timeout: float | None = None

    async def validate_tool_result(self, name: str, result: types.CallToolResult) -> None:
        timeout = self.listing_timeout
        try:
            async with asyncio.timeout(timeout) as bound:
                await super().validate_tool_result(name, result)
        except TimeoutError:
            if not bound.expired():
                raise
            log.warning(
                "MCP server %s answered the call of %r but not tools/list within %s s (to check the "
                "answer against the tool's output schema): the answer is kept unchecked",
                self.label,
                name,
                timeout,
            )


class _Watched:
    """A transport's read stream that calls ``on_end`` when it ends (the server closed the
    connection). The SDK's session fails the requests then in flight, and every later one;
    this lets the next one go to a new connection instead, since it never reached the old.
    An answer is handed on `readable`: what of it is not valid MCP costs only itself."""

    __slots__ = ("_label", "_on_end", "_stream", "session")

    def __init__(self, stream: Any, on_end: Callable[[], None], label: str) -> None:
        self._stream = stream
        self._on_end = on_end
        self._label = label
        self.session: ClientSession | None = None  # the session reading it: the protocol it agreed

    @property
    def last_context(self) -> Any:  # the streamable HTTP transport's, read by the SDK's dispatcher
        return getattr(self._stream, "last_context", None)

    async def receive(self) -> Any:
        try:
            item = await self._stream.receive()
        except (anyio.EndOfStream, anyio.ClosedResourceError):
            self._on_end()
            raise
        if isinstance(item, SessionMessage):
            version = self.session.protocol_version if self.session is not None else None
            message = readable(item.message, self._label, version)
            if message is not item.message:
                item = dataclasses.replace(item, message=message)
        return item

    def __aiter__(self) -> _Watched:
        return self

    async def __anext__(self) -> Any:
        try:
            return await self.receive()
        except (anyio.EndOfStream, anyio.ClosedResourceError):
            raise StopAsyncIteration from None

    async def aclose(self) -> None:
        await self._stream.aclose()

    async def __aenter__(self) -> _Watched:
        return self

    async def __aexit__(self, *exc_info: object) -> None:
        await self.aclose()


def _unwrap(exc: Exception) -> Exception:
    """The one error the SDK's task groups wrapped (a group of one, nested), else ``exc``."""
    while isinstance(exc, ExceptionGroup) and len(exc.exceptions) == 1:
        exc = exc.exceptions[0]
    return exc
