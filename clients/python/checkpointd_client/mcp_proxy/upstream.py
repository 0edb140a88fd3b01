"""The proxy's client half: one session with the wrapped MCP server, over stdio or Streamable HTTP.

Requests are forwarded as raw JSON-RPC params and results, so whatever the upstream server says
about its tools (schemas, annotations, `_meta`) reaches the host as it was sent, sieved only by the
SDK to the protocol version each side negotiated.
"""

from __future__ import annotations

import logging
from collections.abc import AsyncIterator, Awaitable, Callable, Mapping
from contextlib import AsyncExitStack, asynccontextmanager
from pathlib import Path
from typing import Any

import httpx2
import mcp_types as types
from mcp.client.session import ClientRequestContext, ClientSession, IncomingMessage
from mcp.client.stdio import StdioServerParameters, stdio_client
from mcp.client.streamable_http import streamable_http_client
from mcp.shared.dispatcher import ProgressFnT
from pydantic import TypeAdapter

from checkpointd_client.mcp_proxy.options import HttpUpstream, StdioUpstream, Upstream

logger = logging.getLogger(__name__)

CLIENT_NAME = "checkpointd-mcp-proxy"
# A tool call may hold its response stream open for long: only connecting and writing are bounded.
HTTP_TIMEOUT = httpx2.Timeout(30.0, read=None)
# A server whose cursor never ends cannot keep the proxy listing forever.
MAX_TOOL_PAGES = 100
RawResult = dict[str, Any]
_RAW_RESULT: TypeAdapter[RawResult] = TypeAdapter(RawResult)
# `_meta` keys the SDK stamps per connection (protocol version, client info...); each side sets its own.
_RESERVED_META_PREFIX = "io.modelcontextprotocol/"

NotificationSink = Callable[[types.ServerNotification], Awaitable[None]]


def forwardable_params(params: Mapping[str, Any] | None) -> dict[str, Any] | None:
    """The host's params as the upstream should get them: without the host connection's own
    `_meta` stamps and progress token (the upstream request gets its own)."""
    if params is None:
        return None
    forwarded = dict(params)
    meta = forwarded.pop("_meta", None)
    if isinstance(meta, Mapping):
        kept = {
            key: value
            for key, value in meta.items()
            if key != "progressToken" and not key.startswith(_RESERVED_META_PREFIX)
        }
        if kept:
            forwarded["_meta"] = kept
    return forwarded


class UpstreamSession:
    """The live session with the wrapped server, as the proxy uses it."""

    def __init__(self, session: ClientSession, initialized: types.InitializeResult) -> None:
        self.session = session
        self.initialized = initialized

    @property
    def capabilities(self) -> types.ServerCapabilities:
        return self.initialized.capabilities

    async def request(
        self, method: str, params: Mapping[str, Any] | None, *, on_progress: ProgressFnT | None = None
    ) -> RawResult:
        """Send one request upstream and return its result as sent; an error reply raises MCPError.

        Cancelling the awaiting task sends the upstream a `notifications/cancelled` for it.
        """
        request = types.Request[dict[str, Any] | None, str](method=method, params=forwardable_params(params))
        return await self.session.send_request(request, _RAW_RESULT, progress_callback=on_progress)

    async def list_all_tools(self) -> list[dict[str, Any]]:
        """Every upstream tool, all pages (at most MAX_TOOL_PAGES of them), as raw tool objects."""
        tools: list[dict[str, Any]] = []
        cursor: str | None = None
        for _ in range(MAX_TOOL_PAGES):
            result = await self.request("tools/list", {"cursor": cursor} if cursor else None)
            tools.extend(tool for tool in result.get("tools", []) if isinstance(tool, dict))
            cursor = result.get("nextCursor")
            if not isinstance(cursor, str) or not cursor:
                return tools
        logger.warning("the wrapped server's tool list goes on past %d pages; using the first ones", MAX_TOOL_PAGES)
        return tools


def _roots_answer(workspace_root: Path) -> Callable[[ClientRequestContext], Awaitable[types.ListRootsResult]]:
    """The upstream's roots are the workspace: what it may touch is what checkpointd captures."""
    result = types.ListRootsResult(roots=[types.Root(uri=workspace_root.as_uri(), name=workspace_root.name)])

    async def list_roots(context: ClientRequestContext) -> types.ListRootsResult:
        return result

    return list_roots


@asynccontextmanager
async def connect_upstream(
    upstream: Upstream, *, workspace_root: Path, on_notification: NotificationSink
) -> AsyncIterator[UpstreamSession]:
    """Start or reach the wrapped server, run the MCP handshake, and close it all on exit.

    `on_notification` gets the upstream's notifications (log messages, list changes, resource
    updates); progress goes to each request's own callback, cancellations are the SDK's.
    """

    async def message_handler(message: IncomingMessage) -> None:
        if isinstance(message, Exception):
            logger.warning("the upstream MCP connection reported: %s", message)
            return
        await on_notification(message)

    async with AsyncExitStack() as stack:
        match upstream:
            case StdioUpstream():
                parameters = StdioServerParameters(
                    command=upstream.command,
                    args=list(upstream.args),
                    env=dict(upstream.env),
                    cwd=upstream.cwd,
                )
                read_stream, write_stream = await stack.enter_async_context(stdio_client(parameters))
            case HttpUpstream():
                http_client = await stack.enter_async_context(
                    httpx2.AsyncClient(headers=dict(upstream.headers), timeout=HTTP_TIMEOUT)
                )
                read_stream, write_stream = await stack.enter_async_context(
                    streamable_http_client(upstream.url, http_client=http_client)
                )
        session = await stack.enter_async_context(
            ClientSession(
                read_stream,
                write_stream,
                list_roots_callback=_roots_answer(workspace_root),
                message_handler=message_handler,
                client_info=types.Implementation(name=CLIENT_NAME, version=_version()),
            )
        )
        initialized = await session.initialize()
        logger.info(
            "wrapping MCP server %s %s (protocol %s)",
            initialized.server_info.name,
            initialized.server_info.version,
            initialized.protocol_version,
        )
        yield UpstreamSession(session, initialized)


def _version() -> str:
    from importlib.metadata import PackageNotFoundError, version

    try:
        return version("checkpointd")
    except PackageNotFoundError:
        return "0"
