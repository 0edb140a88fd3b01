"""The proxy's server half: the wrapped server's tools, resources and prompts, offered to the host,
with write tools run between a before and an after checkpoint, plus the undo tools."""

from __future__ import annotations

import logging
from collections.abc import Mapping
from typing import Any

import mcp_types as types
from mcp.server.context import ServerRequestContext
from mcp.server.lowlevel.server import NotificationOptions, Server
from mcp.server.models import InitializationOptions
from mcp.shared.dispatcher import ProgressFnT

from checkpointd_client.mcp_proxy.checkpointing import ToolCallCheckpoints, WriteToolRefused
from checkpointd_client.mcp_proxy.hosts import HostConnections
from checkpointd_client.mcp_proxy.tool_kinds import ToolKinds
from checkpointd_client.mcp_proxy.undo_tools import NAMES as UNDO_TOOL_NAMES
from checkpointd_client.mcp_proxy.undo_tools import UndoTools, definitions, text_result
from checkpointd_client.mcp_proxy.upstream import RawResult, UpstreamSession

logger = logging.getLogger(__name__)

WARNING_PREFIX = "checkpointd warning: "

# Requests passed through unchanged, by the upstream capability that makes them exist.
_RESOURCE_REQUESTS: tuple[tuple[str, type[types.RequestParams]], ...] = (
    ("resources/list", types.PaginatedRequestParams),
    ("resources/templates/list", types.PaginatedRequestParams),
    ("resources/read", types.ReadResourceRequestParams),
)
_SUBSCRIBE_REQUESTS: tuple[tuple[str, type[types.RequestParams]], ...] = (
    ("resources/subscribe", types.SubscribeRequestParams),
    ("resources/unsubscribe", types.UnsubscribeRequestParams),
)
_PROMPT_REQUESTS: tuple[tuple[str, type[types.RequestParams]], ...] = (
    ("prompts/list", types.PaginatedRequestParams),
    ("prompts/get", types.GetPromptRequestParams),
)


class _ProxyServer(Server[Any]):
    """A lowlevel Server that announces the list-change notifications the upstream announced,
    whichever transport asks for its initialization options."""

    def __init__(self, name: str, *, notification_options: NotificationOptions, **kwargs: Any) -> None:
        super().__init__(name, **kwargs)
        self._notification_options = notification_options

    def create_initialization_options(
        self,
        notification_options: NotificationOptions | None = None,
        experimental_capabilities: dict[str, dict[str, Any]] | None = None,
        extensions: dict[str, dict[str, Any]] | None = None,
    ) -> InitializationOptions:
        return super().create_initialization_options(
            notification_options or self._notification_options, experimental_capabilities, extensions
        )


class ToolNameClash(Exception):
    """An upstream tool has the name of one of the proxy's own tools."""


def _completed(result: Mapping[str, Any]) -> bool:
    """A tool result that reports success (not isError, and not a request for more input)."""
    return result.get("isError") is not True and result.get("resultType") != "input_required"


def _with_warnings(result: RawResult, warnings: list[str]) -> RawResult:
    content = list(result.get("content") or [])
    content += [{"type": "text", "text": WARNING_PREFIX + warning} for warning in warnings]
    return {**result, "content": content}


def _progress_relay(ctx: ServerRequestContext[Any, Any]) -> ProgressFnT | None:
    """Forward the upstream's progress on this call to the host, if the host asked for progress."""
    meta = (ctx.params or {}).get("_meta")
    if not isinstance(meta, Mapping) or meta.get("progressToken") is None:
        return None

    async def relay(progress: float, total: float | None, message: str | None) -> None:
        await ctx.session.report_progress(progress, total, message)

    return relay


class McpProxy:
    """Handlers for every request the host can send, forwarding to one upstream session."""

    def __init__(
        self,
        *,
        kinds: ToolKinds,
        checkpoints: ToolCallCheckpoints,
        undo: UndoTools | None,
        hosts: HostConnections,
    ) -> None:
        self.kinds = kinds
        self.checkpoints = checkpoints
        self.undo = undo
        self.hosts = hosts
        self._upstream: UpstreamSession | None = None

    @property
    def upstream(self) -> UpstreamSession:
        if self._upstream is None:
            raise RuntimeError("the upstream MCP server is not connected yet")
        return self._upstream

    async def attach(self, upstream: UpstreamSession) -> None:
        """Take the connected upstream and learn its tools; a clash with the undo tools refuses."""
        self._upstream = upstream
        if upstream.capabilities.tools is not None:
            tools = await upstream.list_all_tools()
            self._check_names(tools)
            self.kinds.replace_all(tools)

    def _check_names(self, tools: list[dict[str, Any]]) -> None:
        if self.undo is None:
            return
        clashing = sorted({tool.get("name") for tool in tools} & set(UNDO_TOOL_NAMES))
        if clashing:
            raise ToolNameClash(
                f"the wrapped server has tools named {', '.join(clashing)}, like the proxy's own undo tools; "
                "rerun with --no-extra-tools to leave them out"
            )

    # --- the server the host talks to -----------------------------------------------------

    def build_server(self) -> Server[Any]:
        """A lowlevel Server whose capabilities mirror the upstream's (tools always, for the undo tools)."""
        upstream = self.upstream
        initialized = upstream.initialized
        capabilities = upstream.capabilities
        server = _ProxyServer(
            initialized.server_info.name,
            version=initialized.server_info.version,
            title=f"{initialized.server_info.title or initialized.server_info.name} (checkpointed by checkpointd)",
            instructions=initialized.instructions,
            notification_options=NotificationOptions(
                prompts_changed=bool(capabilities.prompts and capabilities.prompts.list_changed),
                resources_changed=bool(capabilities.resources and capabilities.resources.list_changed),
                tools_changed=True,
            ),
        )
        if capabilities.tools is not None or self.undo is not None:
            server.add_request_handler("tools/list", types.PaginatedRequestParams, self._list_tools)
            server.add_request_handler("tools/call", types.CallToolRequestParams, self._call_tool)
        forwarded: list[tuple[str, type[types.RequestParams]]] = []
        if capabilities.resources is not None:
            forwarded += _RESOURCE_REQUESTS
            if capabilities.resources.subscribe:
                forwarded += _SUBSCRIBE_REQUESTS
        if capabilities.prompts is not None:
            forwarded += _PROMPT_REQUESTS
        if capabilities.completions is not None:
            forwarded.append(("completion/complete", types.CompleteRequestParams))
        if capabilities.logging is not None:
            forwarded.append(("logging/setLevel", types.SetLevelRequestParams))
        for method, params_type in forwarded:
            server.add_request_handler(method, params_type, self._forward)
        server.add_notification_handler("notifications/initialized", types.NotificationParams, self._host_initialized)
        return server

    async def _host_initialized(self, ctx: ServerRequestContext[Any, Any], params: types.NotificationParams) -> None:
        self.hosts.add(ctx.session)

    async def _forward(self, ctx: ServerRequestContext[Any, Any], params: types.RequestParams) -> RawResult:
        return await self.upstream.request(ctx.method, ctx.params, on_progress=_progress_relay(ctx))

    async def _list_tools(
        self, ctx: ServerRequestContext[Any, Any], params: types.PaginatedRequestParams
    ) -> RawResult:
        if self.upstream.capabilities.tools is None:
            result: RawResult = {"tools": []}
        else:
            result = await self.upstream.request("tools/list", ctx.params)
        tools = [tool for tool in result.get("tools", []) if isinstance(tool, dict)]
        self.kinds.learn(tools)
        if self.undo is not None:
            # A clash that appears after start-up: the proxy's own tool wins, and says so.
            for tool in tools:
                if tool.get("name") in UNDO_TOOL_NAMES:
                    logger.error("hiding the wrapped server's tool %r: the proxy has its own", tool["name"])
            tools = [tool for tool in tools if tool.get("name") not in UNDO_TOOL_NAMES]
            if not params.cursor:
                tools += definitions(self.undo.plan_id)
        return {**result, "tools": tools}

    async def _call_tool(self, ctx: ServerRequestContext[Any, Any], params: types.CallToolRequestParams) -> RawResult:
        name = params.name
        if self.undo is not None and self.undo.owns(name):
            return await self.undo.call(name, params.arguments or {})
        if not self.kinds.knows(name) and self.upstream.capabilities.tools is not None:
            self.kinds.replace_all(await self.upstream.list_all_tools())
        on_progress = _progress_relay(ctx)
        if self.kinds.is_read_only(name):
            return await self.upstream.request("tools/call", ctx.params, on_progress=on_progress)
        try:
            taken = await self.checkpoints.before(name)
        except WriteToolRefused as refusal:
            logger.warning("%s", refusal)
            return text_result(str(refusal), is_error=True)
        # Cancelled here (the host gave up): the before checkpoint stays, there is no after.
        result = await self.upstream.request("tools/call", ctx.params, on_progress=on_progress)
        if _completed(result):
            await self.checkpoints.after(name, taken)
        return _with_warnings(result, taken.warnings) if taken.warnings else result

    # --- what the upstream says by itself --------------------------------------------------

    async def on_upstream_notification(self, notification: types.ServerNotification) -> None:
        match notification:
            case types.ToolListChangedNotification():
                if self._upstream is not None:
                    self.kinds.replace_all(await self._upstream.list_all_tools())
                await self.hosts.broadcast(notification)
            case (
                types.ResourceListChangedNotification()
                | types.ResourceUpdatedNotification()
                | types.PromptListChangedNotification()
                | types.LoggingMessageNotification()
            ):
                await self.hosts.broadcast(notification)
            case _:
                logger.debug("not forwarding the upstream's %s", type(notification).__name__)
