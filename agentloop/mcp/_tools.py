"""MCP tools as agentloop tools, and MCP tool results as tool results.

A listed tool becomes a `Tool` whose handler (`Remote`) calls it on the server; a listing
keeps the first tool of each name and only the tools whose input can be an object (what the
providers accept); a result's text stays text and other content is described in a line.
"""

from __future__ import annotations

import json
import logging
from typing import TYPE_CHECKING, Any

from mcp import types

from .._messages import TextBlock, ToolResultBlock
from .._tools import ToolContext, ToolOutput
from .._transcript import without_credentials
from ._scrub import clean_error

if TYPE_CHECKING:
    from ._server import MCPServer

log = logging.getLogger("agentloop")


class Remote:
    """The handler of a tool made by `MCPServer.list_tools`: it calls the server's tool
    ``remote``; ``listing`` holds the names of the listing it came from."""

    __slots__ = ("listing", "remote", "server")

    def __init__(self, server: MCPServer, remote: str, listing: frozenset[str]) -> None:
        self.server = server
        self.remote = remote
        self.listing = listing

    def _credentials(self) -> tuple[str, ...]:
        """The credentials the host gave the server, those long enough to scrub out of any text:
        an engine holding this tool knows them (`agentloop._transcript.tool_credentials`)."""
        return self.server._secrets

    async def __call__(self, input: dict[str, Any], ctx: ToolContext) -> ToolOutput:
        redactor = self.server._redactor
        try:
            result = await self.server.call_tool(self.remote, input, signal=ctx.signal)
        except Exception as exc:
            # Its message becomes the tool's error result: the server's credentials taken out, cut.
            if not clean_error(exc, redactor):
                raise RuntimeError(f"the MCP call failed ({type(exc).__name__}; its message quoted a credential)") from None
            raise
        return without_credentials(result_to_block(ctx.tool_use_id, result), self.server._secrets)


def unique_specs(specs: list[types.Tool], label: str) -> list[types.Tool]:
    """``specs`` with the first tool of each name: a request offering two tools of one
    name fails at every provider, so a server that lists a name twice loses the later ones."""
    first: dict[str, types.Tool] = {}
    for spec in specs:
        if spec.name in first:
            log.warning(
                "MCP server %s lists the tool %r more than once; only its first listing is offered",
                label,
                spec.name,
            )
        else:
            first[spec.name] = spec
    return specs if len(first) == len(specs) else list(first.values())


def offerable_specs(specs: list[types.Tool], label: str) -> list[types.Tool]:
    """``specs`` without the tools whose input cannot be an object: MCP arguments always
    are, and the providers refuse a whole request holding a tool schema of another type."""
    kept: list[types.Tool] = []
    for spec in specs:
        if object_schema(spec.input_schema) is not None:
            kept.append(spec)
        else:
            log.warning(
                "MCP server %s: the tool %r takes %r, not an object; it is not offered",
                label,
                spec.name,
                spec.input_schema.get("type"),
            )
    return kept


def object_schema(schema: dict[str, Any]) -> dict[str, Any] | None:
    """``schema`` with ``"type": "object"`` (the only type the providers accept) when it allows
    an object (no type given, as in ``{}`` or a bare ``$ref``, or a list of types holding
    "object"), else None."""
    kind = schema.get("type")
    if kind == "object":
        return schema
    if kind is None or (isinstance(kind, list) and "object" in kind):
        return {"type": "object", **{k: v for k, v in schema.items() if k != "type"}}
    return None


def result_to_block(tool_use_id: str, result: types.CallToolResult) -> ToolResultBlock:
    """Map an MCP tool result to a `ToolResultBlock`: text stays text, other content
    is described in a short line, and ``is_error`` is kept."""
    parts = [TextBlock(text=text) for text in map(_describe, result.content) if text]
    if not parts and result.structured_content is not None:
        parts = [TextBlock(text=json.dumps(result.structured_content, ensure_ascii=False, default=str))]
    content: str | list[TextBlock] = parts if parts else "(no output)"
    if len(parts) == 1:
        content = parts[0].text
    return ToolResultBlock(tool_use_id=tool_use_id, content=content, is_error=result.is_error)


def _describe(block: types.ContentBlock) -> str:
    if isinstance(block, types.TextContent):
        return block.text
    if isinstance(block, types.ImageContent | types.AudioContent):
        size = len(block.data) * 3 // 4
        return f"[{block.type}: {block.mime_type}, about {size} bytes, not shown]"
    if isinstance(block, types.ResourceLink):
        return f"[resource link: {block.uri}{f' ({block.mime_type})' if block.mime_type else ''}]"
    if isinstance(block, types.EmbeddedResource):
        res = block.resource
        if isinstance(res, types.TextResourceContents):
            return res.text
        return f"[resource: {res.uri} ({res.mime_type or 'binary'}), not shown]"
    return f"[{getattr(block, 'type', 'unknown')} content, not shown]"
