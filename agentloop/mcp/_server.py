"""`MCPServer`: one MCP server's connection, its tool listings and its tool calls.

Longer than most modules: the connection's lifetime, the calls in flight and the tool
listings share one state (a reset marks the tools for listing again, a call waits for the
listing it caused, an abort keeps a connection that other runs' calls still use), and its
rules are read together here. The connection itself is in `_connection`, the transports in
`_stdio` and `_http`, the mapping of tools and results in `_tools`.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable, Mapping, Sequence
from types import TracebackType
from typing import Any, Protocol

from mcp import ClientSession, types
from mcp.shared.exceptions import MCPError
from pydantic import ValidationError

from .._abort import AbortSignal
from .._cmdline import shown_args
from .._ending import wait_at_run_end
from .._errors import AbortError
from .._process import uncancellable
from .._tools import Tool, safe_name
from ..models._errbody import clipped
from ..models._http import Redactor, check_headers
from ..models._http._client import MIN_TOOL_SECRET
from ._answers import invalid_result
from ._connection import Connect, Connection
from ._http import check_url, http_connect, public_url, split_userinfo
from ._scrub import scrubbing, server_credentials, shown_text, watch
from ._stdio import stdio_connect
from ._tools import Remote, object_schema, offerable_specs, unique_specs

log = logging.getLogger("agentloop")

#: The listings that notifications/tools/list_changed may cause between two calls. A server may
#: say its list changed at every listing (a notification along with its tools/list answer):
#: listing again each time would never end, and a call's result waits for the listing.
_RELISTS = 3

#: The most tools/list pages one listing reads. A server that hands out a new cursor with every
#: page would otherwise be paged for ever (bounded only by ``connect_timeout``, which may be None);
#: real servers use a handful of pages, rarely more than a few dozen.
_MAX_PAGES = 1000


class _EngineLike(Protocol):
    def on_abort(self, fn: Callable[[str], Awaitable[None] | None], *, main_only: bool = False) -> None: ...

    def watch_tools(self, fn: Callable[[Mapping[str, Tool]], Sequence[Tool] | None]) -> None: ...


class MCPServer:
    """A connection to one MCP server, whose tools become agentloop `Tool`s.

    Build it with `MCPServer.stdio` or `MCPServer.http`; use it as an async
    context manager or call `aclose` when done. (The constructor takes ``connect``, a
    function opening one connection's streams, and ``label``, the name the repr, the logs and
    the errors give the server: what those two make.) ``prefix`` is prepended to every
    tool name (``"fs_"`` turns ``read`` into ``fs_read``); ``concurrency_safe``
    and ``timeout`` are passed to every `Tool` made. ``connect_timeout`` bounds
    the wait for the server's answer to ``initialize``, and apart from it the wait
    for its tools/list answer (None: no bound).
    """

    def __init__(
        self,
        connect: Connect,
        *,
        label: str,
        prefix: str = "",
        concurrency_safe: bool = False,
        timeout: float | None = None,
        connect_timeout: float | None = 60.0,
    ) -> None:
        self._connect = connect
        self.connect_timeout = connect_timeout
        self.label = label
        self.prefix = prefix
        self.concurrency_safe = concurrency_safe
        self.timeout = timeout
        self._conn: Connection | None = None
        self._closed = False
        self._in_flight: list[AbortSignal | None] = []  # the signal of each call in flight
        self._listed: dict[str, Tool] = {}  # the last tools/list answer, by the server's names
        self._stale = False  # the server said its tool list changed since the last listing began
        # A connection whose tools were listed was replaced: the server behind the next one (a
        # restarted process, a new HTTP session) may offer other tools, so they are listed again.
        self._relist_due = False
        self._relisting: asyncio.Task[None] | None = None
        self._relists_left = _RELISTS  # listings the server's notifications may still cause before the next call
        self._relists_warned = False
        self._closing: set[asyncio.Task[None]] = set()  # connections being closed
        self._clashes: set[str] = set()  # added tools not offered for a name clash (warned about)
        # The credentials the host gave the server (`server_credentials`): those of `MIN_TOOL_SECRET`
        # characters or more are scrubbed out of its results, all of them out of errors and logs.
        self._secrets: tuple[str, ...] = ()
        self._redactor: Redactor | None = None

    def __repr__(self) -> str:
        state = "closed" if self._closed else "open" if self._conn is not None else "idle"
        return f"<MCPServer {self.label} {state}>"

    @classmethod
    def stdio(
        cls,
        command: str,
        args: Sequence[str] = (),
        *,
        env: Mapping[str, str] | None = None,
        cwd: str | None = None,
        max_message_size: int | None = 64 << 20,
        **options: Any,
    ) -> MCPServer:
        """A server started as a subprocess and spoken to over its stdin/stdout.

        ``env`` is merged over the SDK's safe default environment (``HOME``, ``PATH``,
        ``SHELL``, ``TERM``, ``USER``, ``LOGNAME``): nothing else of the host's environment,
        its API keys included, reaches the server. The process starts on first use, in a
        process group of its own, and is stopped (with what it left in its group) when the
        connection closes. Its stderr is logged line by line on the ``agentloop`` logger at
        INFO, with the values of the credentials in ``env`` (a name holding ``key``,
        ``token``, ``secret``, ``pass``...) replaced by ``[REDACTED]``. ``max_message_size``:
        the most bytes one message from the server may hold (None: no limit); a longer one
        ends the connection, failing the calls in flight. ``command`` and ``args``: the program
        and its arguments; ``options`` go to the constructor (``prefix``, ``timeout``...).
        """
        # The command is shown as a command line is, its credentials redacted (``TOKEN=X cmd``).
        label = f"stdio:{shown_args((command,))[0]}"
        secrets = server_credentials(env or {}, args=(command, *args))
        connect = stdio_connect(
            command, args, env=env, cwd=cwd, label=label, max_message_size=max_message_size, secrets=secrets
        )
        server = cls(connect, label=label, **options)
        server._know(secrets)
        return server

    @classmethod
    def http(
        cls,
        url: str,
        *,
        headers: Mapping[str, str] | None = None,
        http_timeout: float = 30.0,
        max_event_size: int | None = 64 << 20,
        **options: Any,
    ) -> MCPServer:
        """A server reached over streamable HTTP at ``url`` (for example ``http://host/mcp``).

        ``headers`` go on every request (authentication, for instance);
        ``http_timeout`` is the HTTP connect/write timeout in seconds (reads wait
        for as long as a tool runs, bounded by the tool's own ``timeout``), and the
        read timeout of what a server answers at once: a notification (an abort's
        cancellation) and the DELETE that ends the session. A server that answers a
        notification later loses the connection (the next call opens a new one).
        ``max_event_size``: the most bytes one server-sent event may hold (the SDK's
        own default, 1 MiB, fails every tool result over it; the engine cuts a long
        result itself, see ``max_tool_result_chars``); None for no limit. The
        label (in the repr, logs and errors) is the URL without its user info
        and query, where credentials often ride.

        User info in ``url`` (``https://user:password@host/mcp``) is sent as HTTP
        Basic authentication, as the HTTP client would, but the URL handed to the
        SDK is without it: the SDK and the HTTP client log the URL they are given.
        A query string (``?token=...``) cannot be taken out, since it is part of
        the address: its credentials are scrubbed out of the records of the loggers
        that quote the URL (the SDK's and its HTTP client's), but prefer ``headers``.
        ``options`` go to the constructor (``prefix``, ``timeout``...).
        """
        check_url(url)
        # Refused here, not quoted: the HTTP layer's error for a header it cannot send quotes it.
        headers = check_headers(headers, "headers")
        target, auth = split_userinfo(url)

        def forgotten(stream: object) -> None:
            # A 404 to a request in a session means the server no longer knows that session (it
            # restarted, say): the SDK fails the call, and every later one, unless we reconnect.
            # The connection whose stream it is knows (`Connection.forgotten`); an old one, still
            # closing after a reset, is no longer used.
            conn = server._conn
            if conn is not None and conn.reads(stream):
                log.warning("MCP server %s: the server forgot the session (404); the next call starts a new one", server.label)
            else:
                log.info("MCP server %s: the server forgot a session no longer in use (404); the current one is kept", server.label)

        connect = http_connect(
            target, auth, headers=headers, http_timeout=http_timeout, max_event_size=max_event_size, on_forgotten=forgotten
        )
        server = cls(connect, label=public_url(url), **options)
        # The SDK logs the URL it connects to, and its HTTP client each request's URL.
        server._know(server_credentials(headers or {}, url))
        return server

    def _know(self, secrets: tuple[str, ...]) -> None:
        """Take ``secrets`` as the credentials the host gave this server: scrubbed out of its
        errors and of the records of the loggers that could quote them, and those of
        `MIN_TOOL_SECRET` characters or more out of its tools' results."""
        self._secrets = tuple(v for v in secrets if len(v) >= MIN_TOOL_SECRET)
        self._redactor = Redactor(secrets) if secrets else None
        watch(self, secrets)

    def _shown(self, text: str) -> str:
        """``text`` (an error's or an abort reason, for a log line) without this server's
        credentials, cut."""
        return shown_text(text, self._redactor)

    async def __aenter__(self) -> MCPServer:
        try:
            await self.session()
        except BaseException:
            await self.aclose()  # no __aexit__ will run: nothing may outlive this failed entry
            raise
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        await self.aclose()

    # -- connection ---------------------------------------------------------

    async def session(self) -> ClientSession:
        """The live `ClientSession`, connecting first if needed.

        Raises RuntimeError once closed, what the transport raises when the
        server cannot be reached, and TimeoutError when it does not answer
        ``initialize`` within ``connect_timeout`` (the next call tries again).
        """
        return (await self._open())[1]

    async def _open(self) -> tuple[Connection, ClientSession]:
        """The current connection and its session, connecting first if needed (at most once:
        a server that keeps exiting at start-up fails each call once, it is never retried)."""
        if self._closed:
            raise RuntimeError(f"{self!r} is closed")
        conn = self._conn
        if conn is None:
            conn = self._conn = Connection(
                self._connect, self.label, self.connect_timeout, self._on_message, self._on_lost, self._shown
            )
        try:
            with scrubbing(self._redactor, self.label):
                session = await conn.session()
        except Exception:
            if self._conn is conn:
                self._conn = None
            raise
        if conn.lost:  # `_on_lost` took it out of use already
            with scrubbing(self._redactor, self.label):
                raise conn.closed(" as soon as it was open", stderr=True)
        return conn, session

    def _on_lost(self, conn: Connection) -> None:
        """The server closed the connection ``conn`` (a stdio server exited): take it out of
        use, so that the next call, which cannot have reached the old server, opens a new one."""
        if self._conn is conn and not self._closed:
            log.warning(
                "MCP server %s closed the connection%s; the next call opens a new one",
                self.label,
                clipped(conn.why(stderr=True)),  # scrubbed as it was read
            )
            self._detach()

    async def reset(self) -> None:
        """Close the current connection; the next call opens a new one."""
        closing = self._detach()
        if closing is not None:
            await asyncio.shield(closing)  # a caller giving up leaves it to `aclose`

    async def aclose(self) -> None:
        """Close the connection for good (a stdio server process is stopped). Idempotent.

        Also waits for connections still closing after `on_main_abort`.
        """
        self._closed = True
        self._detach()
        await uncancellable(self._closed_down())  # a cancel of the caller's: raised once stopped

    async def _closed_down(self) -> None:
        """Wait until no connection is closing any more (closing one may start another's close)."""
        while pending := {task for task in self._closing if not task.done()}:
            await asyncio.wait(pending)

    def _detach(self) -> asyncio.Task[None] | None:
        """Take the connection out of use at once (the next call opens a new one) and close
        it in a task, which `aclose` waits for."""
        conn, self._conn = self._conn, None
        relisting, self._relisting = self._relisting, None
        if conn is not None and self._listed:
            self._relist_due = True
        if conn is None and relisting is None:
            return None
        task = asyncio.get_running_loop().create_task(_close(conn, relisting), name=f"agentloop-mcp-close {self.label}")
        self._closing.add(task)
        task.add_done_callback(self._closing.discard)
        return task

    async def on_main_abort(self, reason: str) -> None:
        """Abort hook for the *main* engine only: reset the connection.

        Register it with ``engine.on_abort(server.on_main_abort, main_only=True)``
        (or `attach`). Resetting stops server-side work that ignored the
        cancellation (a stdio server is restarted on next use) and clears
        per-connection state. Never register it for subagents: they share this
        connection with the main engine, which may keep using it.

        The connection is kept while a call whose run was not aborted is in
        flight on it (a background subagent that goes on running, a call made
        without a signal): resetting would kill that call too.

        As an engine's abort hook it returns at once, so the turn ends without
        waiting for the server to stop; the run waits for the close before it
        returns, within its ``tool_cancel_grace``, and `aclose` waits for what
        is left. Called directly, it waits for the close.
        """
        live = sum(signal is None or not signal.aborted for signal in self._in_flight)
        if live:
            log.info(
                "main engine aborted (%s): keeping MCP connection to %s, %d call(s) of runs not aborted use it",
                self._shown(reason),
                self.label,
                live,
            )
            return
        # The reason is the host's text: it may quote this server's credentials, and be long.
        log.info("main engine aborted (%s): resetting MCP connection to %s", self._shown(reason), self.label)
        closing = self._detach()
        # Stopping a server takes it a while (a stdio one gets seconds to exit): the turn's
        # end must not wait for it. The run waits for it before it returns, within its
        # tool_cancel_grace; outside a run's abort hooks, the caller waits here.
        if closing is not None and not wait_at_run_end(closing):
            await asyncio.shield(closing)

    def attach(self, engine: _EngineLike) -> None:
        """Register `on_main_abort` on ``engine`` as a main-only abort hook, and let the
        engine (and the subagents it makes afterwards) follow this server's tool list
        (`QueryEngine.watch_tools` with `follow_tools`)."""
        engine.on_abort(self.on_main_abort, main_only=True)
        engine.watch_tools(self.follow_tools)

    # -- tools --------------------------------------------------------------

    async def list_tools(self) -> list[Tool]:
        """The server's tools as agentloop `Tool`s (all pages).

        Raises `MCPError` when the server hands out a cursor it gave before, or a cursor still
        after 1,000 pages (its pages would never end), or for a protocol error (the connection
        lost: the next call reconnects);
        `TimeoutError` when the server has not answered every page within ``connect_timeout``
        (the requests are cancelled; the connection is kept, connecting is bounded apart).
        """
        conn, session = await self._open()
        return await self._list(conn, session)

    async def _list(self, conn: Connection, session: ClientSession) -> list[Tool]:
        timeout = self.connect_timeout
        try:
            async with asyncio.timeout(timeout) as bound:
                with scrubbing(self._redactor, self.label):
                    specs = await self._pages(session, conn)
        except TimeoutError:
            if not bound.expired():
                raise
            raise TimeoutError(
                f"MCP server {self.label} did not answer tools/list within {timeout:g} s"
            ) from None
        specs = offerable_specs(unique_specs(specs, self.label), self.label)
        listing = frozenset(spec.name for spec in specs)
        tools = [self._tool(spec, listing) for spec in specs]
        self._listed = {spec.name: tool for spec, tool in zip(specs, tools, strict=True)}
        conn.listed = True
        if self._conn is conn:
            self._relist_due = False  # this listing comes from the current connection
        return tools

    async def _pages(self, session: ClientSession, conn: Connection) -> list[types.Tool]:
        """Every page of the server's tools/list answer (at most `_MAX_PAGES`)."""
        specs: list[types.Tool] = []
        cursor: str | None = None
        seen: set[str] = set()
        for _ in range(_MAX_PAGES):
            params = types.PaginatedRequestParams(cursor=cursor) if cursor else None
            try:
                page = await session.list_tools(params=params)
            except ValidationError as exc:  # not a listing at all (its invalid tools are left out)
                raise invalid_result(exc, self.label, "tools/list") from None
            except MCPError as exc:
                await self._lost(exc, conn)
                raise
            specs.extend(page.tools)
            cursor = page.next_cursor
            if not cursor:
                return specs
            if cursor in seen:
                raise MCPError(
                    types.INTERNAL_ERROR,
                    f"MCP server {self.label} repeated the tools/list cursor {cursor[:40]!r}: its pages never end",
                )
            seen.add(cursor)
        raise MCPError(
            types.INTERNAL_ERROR,
            f"MCP server {self.label} still handed out a tools/list cursor after {_MAX_PAGES:,} pages "
            "(the most read): its pages never end",
        )

    def remote_name(self, name: str) -> str | None:
        """The server's own name of the tool its last listing offers as ``name`` (prefix and
        hash included: ``"notes.read"`` for ``"t_notes_read_3f2a..."``), or None when that
        listing offers no tool of this server under ``name``. For a permission callback or a
        log that knows the server's tools by their MCP names."""
        for remote, tool in self._listed.items():
            if tool.name == name:
                return remote
        return None

    def follow_tools(self, current: Mapping[str, Tool]) -> list[Tool] | None:
        """A tool watcher (`QueryEngine.watch_tools`; `attach` registers it): ``current``
        updated to this server's last tool listing, or None when it is up to date.

        This server's tools in ``current`` are replaced by their newest version, and
        dropped when the server no longer lists them; tools the server added are
        added only to an engine that held all of this server's tools (a subagent given
        a narrower set is never widened), and only under a name no other tool in ``current``
        has (a warning names such a tool). Other tools are kept as they are.
        """
        mine = [t.handler for t in current.values() if isinstance(t.handler, Remote) and t.handler.server is self]
        if not mine:
            return None
        listed = self._listed
        held = {h.remote for h in mine}
        wanted = set(listed) if held >= frozenset().union(*(h.listing for h in mine)) else held & set(listed)
        # A tool this server added under the name of another tool of the engine (another server's,
        # without a prefix) is left out: a tool set holding one name twice is refused as a whole.
        taken = {t.name for t in current.values() if not (isinstance(t.handler, Remote) and t.handler.server is self)}
        clashing = {remote for remote in wanted if listed[remote].name in taken}
        for remote in sorted(clashing - self._clashes):
            log.warning(
                "MCP server %s added the tool %r, but another tool is named %r already; it is not offered "
                "(give the servers a prefix)",
                self.label,
                remote,
                listed[remote].name,
            )
        self._clashes |= clashing
        wanted -= clashing
        if held == wanted and all(listed[h.remote].handler is h for h in mine):
            return None
        out: list[Tool] = []
        for tool in current.values():
            h = tool.handler
            if not (isinstance(h, Remote) and h.server is self):
                out.append(tool)
            elif h.remote in wanted:
                out.append(listed[h.remote])
        out += [tool for remote, tool in listed.items() if remote in wanted and remote not in held]
        return out

    def _on_message(self, message: object) -> None:
        if not isinstance(message, types.ToolListChangedNotification):
            return
        log.info("MCP server %s: its tool list changed", self.label)
        self._start_relisting()

    def _start_relisting(self) -> None:
        self._stale = True
        if self._relisting is None or self._relisting.done():
            self._relisting = asyncio.get_running_loop().create_task(
                self._relist(), name=f"agentloop-mcp-relist {self.label}"
            )

    async def _relist(self) -> None:
        """List the tools again (the server said they changed, or a new connection replaced
        one whose tools were listed), as long as the server keeps saying they changed, up to
        `_RELISTS` listings between two calls.

        Each listing is bounded by ``connect_timeout``: a call's result waits for it (so the
        model's next request sees the new list), and a server that never answers must not hold
        that call, and the turn, for ever. On timeout the tools listed before are kept."""
        timeout = self.connect_timeout
        while self._stale and not self._closed:
            conn = self._conn
            if conn is None or not conn.ready:
                return  # the call that opens the next connection lists them (`_relist_due`)
            if self._relists_left <= 0:  # `_stale` stays: the next call lists them again
                log.log(
                    logging.DEBUG if self._relists_warned else logging.WARNING,
                    "MCP server %s keeps saying its tool list changed (%d listings since the last call); "
                    "it is listed again at the next call",
                    self.label,
                    _RELISTS,
                )
                self._relists_warned = True
                return
            self._relists_left -= 1
            self._stale = False
            try:
                async with asyncio.timeout(timeout):
                    await self._list(conn, await conn.session())
            except TimeoutError:
                log.warning(
                    "MCP server %s: it did not answer tools/list within %s s (listing its tools again); "
                    "keeping the tools listed before",
                    self.label,
                    timeout,
                )
                return
            except Exception as exc:
                log.warning("MCP server %s: listing its tools again failed: %s", self.label, self._shown(repr(exc)))
                return

    async def call_tool(
        self, name: str, arguments: Mapping[str, Any], *, signal: AbortSignal | None = None
    ) -> types.CallToolResult:
        """Call tool ``name`` (the server's name, without prefix) with ``arguments`` and return
        the raw result.

        With ``signal``: on abort, stop waiting at once, let the SDK send the
        server ``notifications/cancelled`` for the request, and raise
        `AbortError` with the signal's reason. A result that arrived first wins. The abort waits
        for that notification to be handed to the transport, never for the server's answer. Over
        stdio it is queued for the server's stdin at once, also when a server that stopped
        reading has filled the pipe: agentloop's stdio transport never holds a notification back
        (only a request waits for room). Over HTTP it is posted after the messages before it,
        each answer read within ``http_timeout``, and the SDK stops waiting to hand it over after
        5 s (its ``_ABANDON_WRITE_TIMEOUT``, for a write that blocks on any transport): an abort
        waits 5 s at most there.
        Raises `MCPError` for a protocol error (unknown tool, connection lost).
        """
        self._in_flight.append(signal)
        try:
            return await self._call(name, arguments, signal)
        finally:
            self._in_flight.remove(signal)

    async def _call(
        self, name: str, arguments: Mapping[str, Any], signal: AbortSignal | None
    ) -> types.CallToolResult:
        if signal is None:
            result = await self._request(name, arguments)
        else:
            signal.throw_if_aborted()
            call = asyncio.create_task(self._request(name, arguments))
            aborted = asyncio.create_task(signal.wait())
            try:
                await asyncio.wait((call, aborted), return_when=asyncio.FIRST_COMPLETED)
            finally:
                aborted.cancel()
                if not call.done():
                    call.cancel()  # the SDK writes notifications/cancelled on the way out
                    await asyncio.wait((call,))  # bounded: see the docstring of call_tool
            if call.cancelled() or (signal.aborted and call.exception() is not None):
                # An error after the abort (the main abort hook reset the connection) is the abort.
                reason = signal.reason or "cancel"
                log.info("MCP call %s on %s aborted: %s", name, self.label, self._shown(reason))
                raise AbortError(reason)
            result = call.result()
        relisting = self._relisting
        if relisting is not None and not relisting.done():
            # The call changed the tool list (its notification came before its answer), or it was
            # the first on a new connection: the model's next request must see the new list, so
            # the result waits for it. An abort ends the wait, not the result, which has arrived:
            # the listing goes on for the next request.
            waits: list[asyncio.Future[Any]] = [relisting]
            if signal is not None:
                waits.append(asyncio.ensure_future(signal.wait()))
            try:
                await asyncio.wait(waits, return_when=asyncio.FIRST_COMPLETED)
            finally:
                for waiter in waits[1:]:
                    waiter.cancel()
        return result

    async def _request(self, name: str, arguments: Mapping[str, Any]) -> types.CallToolResult:
        conn, session = await self._open()
        self._relists_left = _RELISTS
        # The first call on a new connection lists its tools afresh, as does a call after a change
        # the server announced once its listings for the last call ran out.
        if self._relist_due or self._stale:
            self._relist_due = False
            self._start_relisting()
        if not conn.listed:
            await self._list_first(conn)
        try:
            with scrubbing(self._redactor, self.label):
                result = await session.call_tool(name, dict(arguments))
        except ValidationError as exc:  # the answer is not a valid tool result
            raise invalid_result(exc, self.label, f"tools/call {name[:100]!r}") from None
        except MCPError as exc:
            await self._lost(exc, conn)
            if exc.code == types.CONNECTION_CLOSED and conn.why():
                raise conn.closed() from exc  # the server's stderr stays in the log: this goes to the model
            raise
        return result

    async def _list_first(self, conn: Connection) -> None:
        """List the tools on ``conn`` before its first call is sent (once per connection).

        The SDK lists them itself after the answer to a call of a tool its session has not seen
        listed (to check the result against the tool's output schema): a server that exited
        once it answered failed the call it answered. This listing is bounded by
        ``connect_timeout``; whatever its outcome, the call is sent after it. A caller giving up
        leaves it going for the others."""
        if conn.first_listing is None:
            self._start_relisting()
            conn.first_listing = self._relisting
        if conn.first_listing is not None and not conn.first_listing.done():
            await asyncio.wait((conn.first_listing,))

    async def _lost(self, exc: MCPError, conn: Connection) -> None:
        if (exc.code == types.CONNECTION_CLOSED or conn.forgotten) and self._conn is conn:
            await self.reset()  # the server went away, or forgot the session: reconnect on the next call

    def _tool(self, spec: types.Tool, listing: frozenset[str]) -> Tool:
        return Tool(
            safe_name(self.prefix + spec.name),  # MCP allows '.', '/' and more; providers do not
            spec.description or "",
            object_schema(spec.input_schema) or {"type": "object"},
            Remote(self, spec.name, listing),
            concurrency_safe=self.concurrency_safe,
            timeout=self.timeout,
        )


async def _close(conn: Connection | None, relisting: asyncio.Task[None] | None) -> None:
    if relisting is not None and not relisting.done():
        relisting.cancel()  # it would open the next connection
        await asyncio.wait((relisting,))
    if conn is not None:
        await conn.close()
