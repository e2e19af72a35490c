"""A small MCP server for the tests of `agentloop.mcp`.

Run over stdio (default) or streamable HTTP (``--http PORT``, on 127.0.0.1).
``--markers DIR`` (or ``AGENTLOOP_MCP_MARKERS``) is where the ``slow`` tool
leaves ``<tag>.started``, ``<tag>.cancelled`` and ``<tag>.finished`` files, so
a test can see what the server saw; where DIR holds a named pipe ``events``, each
marker's name is written to it as a line too, for a test to wait on. ``--linger S`` keeps a stdio server alive
for S seconds after its stdin closes.
"""

from __future__ import annotations

import argparse
import os
import time
from pathlib import Path

import anyio
from mcp.server.mcpserver import Context, MCPServer
from mcp.server.mcpserver.exceptions import ToolError

server = MCPServer("agentloop-test")
markers = Path(os.environ.get("AGENTLOOP_MCP_MARKERS", "."))
started: dict[str, anyio.Event] = {}


def mark(name: str, text: str) -> None:
    """Leave the marker file ``name``, and tell a test waiting on the ``events`` pipe."""
    (markers / name).write_text(text)
    events = markers / "events"
    if events.is_fifo():
        with events.open("a") as pipe:
            pipe.write(f"{name}\n")


@server.tool()
def echo(text: str) -> str:
    """Return the text unchanged."""
    return text


@server.tool()
def add(a: int, b: int) -> int:
    """Add two integers."""
    return a + b


@server.tool(name="notes.read")
def notes_read(title: str) -> str:
    """A name with a dot: MCP allows it, the model providers do not."""
    return f"notes of {title}"


@server.tool()
def fail(message: str) -> str:
    """Always fail with ``message``."""
    raise ToolError(message)


@server.tool()
def pid() -> int:
    """The server's process id (tells a reconnect from a kept connection)."""
    return os.getpid()


@server.tool()
async def slow(seconds: float, tag: str = "slow") -> str:
    """Sleep for ``seconds``, recording whether the call was cancelled."""
    mark(f"{tag}.started", str(os.getpid()))
    started.setdefault(tag, anyio.Event()).set()
    try:
        await anyio.sleep(seconds)
    except anyio.get_cancelled_exc_class():
        mark(f"{tag}.cancelled", "cancelled")
        raise
    mark(f"{tag}.finished", "finished")
    return f"slept {seconds}"


def extra(x: int) -> int:
    """Double ``x`` (a tool that `grow` adds)."""
    return 2 * x


@server.tool()
async def grow(ctx: Context) -> str:
    """Add the tool ``extra`` and tell the client that the tool list changed."""
    server.add_tool(extra)
    await ctx.session.send_tool_list_changed()
    return "grown"


@server.tool()
async def retire(ctx: Context, name: str, after: str = "") -> str:
    """Remove the tool ``name`` (once the ``slow`` call tagged ``after`` has started) and tell the client."""
    if after:
        with anyio.fail_after(10):
            await started.setdefault(after, anyio.Event()).wait()
    server.remove_tool(name)
    await ctx.session.send_tool_list_changed()
    return f"retired {name}"


def main() -> None:
    global markers
    parser = argparse.ArgumentParser()
    parser.add_argument("--http", type=int, metavar="PORT", help="serve streamable HTTP on 127.0.0.1:PORT")
    parser.add_argument("--markers", type=Path, help="directory for the slow tool's marker files")
    parser.add_argument("--linger", type=float, default=0.0, help="seconds to stay alive after stdin closes")
    args = parser.parse_args()
    if args.markers is not None:
        markers = args.markers
    if args.http is None:
        server.run("stdio")
        time.sleep(args.linger)  # a server slow to exit: the client has to wait, or kill it
    else:
        server.run("streamable-http", host="127.0.0.1", port=args.http)


if __name__ == "__main__":
    main()
