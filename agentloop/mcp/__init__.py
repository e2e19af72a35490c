"""MCP servers as agentloop tools, over stdio or streamable HTTP (extra: ``agentloop[mcp]``).

    async with MCPServer.stdio("python", ["server.py"]) as server:
        engine = QueryEngine(model, tools=await server.list_tools())
        server.attach(engine)   # main-only abort hook, see `MCPServer.on_main_abort`

Cancellation: every tool handler races its MCP request against the run's abort
signal. On abort it stops waiting at once, the MCP SDK sends the server
``notifications/cancelled`` for the request in flight (mcp >= 2 does this
itself for a cancelled request, with the reason "caller cancelled"; agentloop's
reason is on the `AbortError` and in the log), and the handler raises
`AbortError` so the engine records "stopped while running". The connection
stays open for the next call.

Connection lifetime: one connection per `MCPServer`, opened on first use and
shared by the main engine and all its subagents. It is closed only by its
owner (`aclose` or leaving ``async with``) or by the main-only abort hook
`on_main_abort`, never by a subagent's interrupt. A connection the server closed
(a stdio server exited) is dropped at once: the next call opens a new one, and a
call starts the server at most once.

The package: `MCPServer` (`_server`) over one `_connection` at a time, opened by a
transport (`_stdio`, which `_stop` ends, or `_http`); `_tools` maps the server's tools and
their results to agentloop's; `_scrub` keeps the server's credentials out of its errors and logs.
"""

import inspect as _inspect

# Every part of the SDK the package uses, imported here first: without it, or with one older than
# mcp 2.3 (2.0 to 2.2 import, but their HTTP client sets no limit on an event's size, so every
# call over streamable HTTP would fail), importing agentloop.mcp says what to install.
try:
    import anyio  # noqa: F401
    import httpx2  # noqa: F401
    from mcp import ClientSession, StdioServerParameters, types  # noqa: F401
    from mcp.client.stdio import stdio_client  # noqa: F401
    from mcp.client.streamable_http import streamable_http_client
    from mcp.shared.exceptions import MCPError  # noqa: F401

    if "max_sse_event_size" not in _inspect.signature(streamable_http_client).parameters:
        raise ImportError("mcp older than 2.3")
except ImportError as exc:  # pragma: no cover - depends on the environment
    raise ImportError("agentloop.mcp needs the MCP SDK (mcp >= 2.3): pip install 'agentloop[mcp]'") from exc

from ._server import MCPServer
from ._tools import result_to_block as result_to_block  # importable from here, though not in __all__

__all__ = ["MCPServer"]
