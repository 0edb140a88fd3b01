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

import anyio
import httpx2
import mcp_types as types
from mcp.client.session import ClientRequestContext, ClientSession, IncomingMessage
from mcp.client.streamable_http import MCP_SESSION_ID, streamable_http_client
from mcp.shared.dispatcher import ProgressFnT
from mcp.shared.exceptions import MCPError
from pydantic import TypeAdapter

from checkpointd_client.mcp_proxy.options import HttpUpstream, StdioUpstream, Upstream
from checkpointd_client.mcp_proxy.upstream_process import (
    EXIT_GRACE_S,
    UpstreamGone,
    UpstreamProcess,
    stdio_transport,
)

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
    """The live session with the wrapped server, as the proxy uses it.

    `gone()` returns once the wrapped server is gone for good, with why as an exception to raise:
    its process exited, or (HTTP) it no longer knows the session. An HTTP server that cannot be
    reached at all fails the request that finds out, and that failure ends the proxy by itself.
    """

    def __init__(
        self,
        session: ClientSession,
        initialized: types.InitializeResult,
        gone: Callable[[], Awaitable[UpstreamGone]],
    ) -> None:
        self.session = session
        self.initialized = initialized
        self.gone = gone

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


class UpstreamSessionLost(UpstreamGone):
    """An HTTP upstream answered 404 to the session id: it was restarted, or ended the session."""

    def __init__(self, url: str) -> None:
        super().__init__(
            f"the wrapped MCP server ({url}) no longer knows the proxy's session (HTTP 404): "
            "it was restarted or ended the session"
        )


class _SessionLossWatch:
    """Sees every HTTP response from the upstream (an httpx response hook). By the MCP spec, a 404
    to a request that carried the session id means that session is over for good."""

    def __init__(self, url: str) -> None:
        self.url = url
        self._lost = anyio.Event()

    async def on_response(self, response: httpx2.Response) -> None:
        if response.status_code == 404 and MCP_SESSION_ID in response.request.headers:
            self._lost.set()

    async def lost(self) -> UpstreamGone:
        await self._lost.wait()
        return UpstreamSessionLost(self.url)

    def is_lost(self) -> bool:
        return self._lost.is_set()


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

    session_loss: _SessionLossWatch | None = None
    try:
        async with _connected(upstream, workspace_root, message_handler) as (connection, set_loss):
            session_loss = set_loss
            yield connection
    except Exception as error:
        # Closing the SDK's HTTP transport after the server forgot the session can raise its own
        # errors (BrokenResourceError from a reply with nowhere to go) over the reason: the
        # reason is what the user needs to read.
        if session_loss is None or not session_loss.is_lost() or isinstance(error, UpstreamGone):
            raise
        raise UpstreamSessionLost(session_loss.url) from error


@asynccontextmanager
async def _connected(
    upstream: Upstream, workspace_root: Path, message_handler: Callable[[IncomingMessage], Awaitable[None]]
) -> AsyncIterator[tuple[UpstreamSession, _SessionLossWatch | None]]:
    session_loss: _SessionLossWatch | None = None
    async with AsyncExitStack() as stack:
        process: UpstreamProcess | None = None
        match upstream:
            case StdioUpstream():
                read_stream, write_stream, process = await stack.enter_async_context(stdio_transport(upstream))
                gone = process.exited
            case HttpUpstream():
                session_loss = _SessionLossWatch(upstream.url)
                http_client = await stack.enter_async_context(
                    httpx2.AsyncClient(
                        headers=dict(upstream.headers),
                        timeout=HTTP_TIMEOUT,
                        event_hooks={"response": [session_loss.on_response]},
                    )
                )
                read_stream, write_stream = await stack.enter_async_context(
                    streamable_http_client(upstream.url, http_client=http_client)
                )
                gone = session_loss.lost
        session = await stack.enter_async_context(
            ClientSession(
                read_stream,
                write_stream,
                list_roots_callback=_roots_answer(workspace_root),
                message_handler=message_handler,
                client_info=types.Implementation(name=CLIENT_NAME, version=_version()),
            )
        )
        try:
            initialized = await session.initialize()
        except MCPError as error:
            if process is None or error.code != types.CONNECTION_CLOSED:
                raise
            # A server that exited says more by how it exited than "Connection closed".
            exited = await process.exited_within(EXIT_GRACE_S, when=" during the MCP handshake")
            if exited is None:
                raise
            raise exited from error
        logger.info(
            "wrapping MCP server %s %s (protocol %s)",
            initialized.server_info.name,
            initialized.server_info.version,
            initialized.protocol_version,
        )
        yield UpstreamSession(session, initialized, gone), session_loss


def _version() -> str:
    from importlib.metadata import PackageNotFoundError, version

    try:
        return version("checkpointd")
    except PackageNotFoundError:
        return "0"
