"""One proxy run: plan, checkpointd connection, upstream session, then serving the host until it leaves."""

from __future__ import annotations

import logging
import os
import signal
import sys
import time
from collections.abc import Awaitable, Callable
from functools import partial

import anyio
from mcp.server.lowlevel.server import Server
from mcp.server.stdio import stdio_server

from checkpointd_client.mcp_proxy.checkpointing import ToolCallCheckpoints
from checkpointd_client.mcp_proxy.host_stdin import HostStdin
from checkpointd_client.mcp_proxy.hosts import HostConnections
from checkpointd_client.mcp_proxy.options import HttpListener, ProxyOptions
from checkpointd_client.mcp_proxy.server import McpProxy
from checkpointd_client.mcp_proxy.tool_kinds import ToolKinds
from checkpointd_client.mcp_proxy.undo_tools import UndoTools
from checkpointd_client.mcp_proxy.upstream import UpstreamSession, connect_upstream
from checkpointd_client.wiring import Checkpointd

logger = logging.getLogger(__name__)

_CROCKFORD = "0123456789ABCDEFGHJKMNPQRSTVWXYZ"


def new_plan_id() -> str:
    """A fresh ULID (48-bit millisecond time, 80 random bits), as checkpointd wants plan ids."""
    value = (time.time_ns() // 1_000_000) << 80 | int.from_bytes(os.urandom(10), "big")
    return "".join(_CROCKFORD[(value >> shift) & 31] for shift in range(125, -1, -5))


def run(options: ProxyOptions) -> None:
    """Serve the host until it disconnects (stdio) or the process is stopped (HTTP)."""
    anyio.run(serve, options)


async def serve(options: ProxyOptions) -> None:
    plan_id = options.plan_id or new_plan_id()
    connection = options.checkpointd
    # The host shows the proxy's stderr in its MCP log: the plan id is what `checkpointd ls` needs.
    print(
        f"checkpointd mcp-proxy: plan {plan_id}, workspace {options.workspace_root}, "
        f"checkpointd {connection.target}, wrapping {options.upstream.describe()}",
        file=sys.stderr,
        flush=True,
    )
    checkpointd = await anyio.to_thread.run_sync(
        partial(
            Checkpointd,
            connection.target,
            token=connection.token,
            credentials=connection.credentials,
            server_name=connection.server_name,
            deadline_s=connection.call_deadline_s,
            # The host's initialize and tools/list come from the upstream: they never wait on checkpointd.
            settings_in_background=True,
            plan_id=plan_id,
        )
    )
    try:
        async with anyio.create_task_group() as task_group:
            if options.listen_http is None:  # uvicorn handles the signals when serving HTTP
                task_group.start_soon(_stop_on_signals, task_group.cancel_scope)
            await _proxy(options, plan_id, checkpointd)
            task_group.cancel_scope.cancel()
    finally:
        await anyio.to_thread.run_sync(checkpointd.close)


async def _proxy(options: ProxyOptions, plan_id: str, checkpointd: Checkpointd) -> None:
    connection = options.checkpointd
    checkpoints = ToolCallCheckpoints(checkpointd.tool_interceptor(), plan_id, options.workspace_root)
    proxy = McpProxy(
        kinds=ToolKinds(read_only=options.read_only_tools, write=options.write_tools),
        checkpoints=checkpoints,
        undo=(
            UndoTools(checkpointd.checkpoints, plan_id, deadline_s=connection.call_deadline_s,
                      target=connection.target, unrecorded=lambda: checkpoints.unrecorded)
            if options.extra_tools
            else None
        ),
        hosts=HostConnections(),
    )
    async with connect_upstream(
        options.upstream, workspace_root=options.workspace_root, on_notification=proxy.on_upstream_notification
    ) as upstream:
        await proxy.attach(upstream)
        await _serve_while_upstream_lives(upstream, partial(_serve_host, proxy.build_server(), options))


async def _serve_while_upstream_lives(upstream: UpstreamSession, serve_host: Callable[[], Awaitable[None]]) -> None:
    """Serve the host until it leaves. A wrapped server gone first stops the serving and raises why:
    the proxy exits, so the host sees its server down instead of every call failing from then on."""
    gone: Exception | None = None
    async with anyio.create_task_group() as task_group:

        async def watch() -> None:
            nonlocal gone
            gone = await upstream.gone()
            task_group.cancel_scope.cancel()

        task_group.start_soon(watch)
        await serve_host()
        task_group.cancel_scope.cancel()
    if gone is not None:
        raise gone


async def _serve_host(server: Server, options: ProxyOptions) -> None:
    if options.listen_http is None:
        async with stdio_server(stdin=HostStdin().start()) as (read_stream, write_stream):
            await server.run(read_stream, write_stream, server.create_initialization_options())
    else:
        await _serve_http(server, options.listen_http)


async def _stop_on_signals(scope: anyio.CancelScope) -> None:
    """SIGTERM or SIGINT (a host stopping its server) ends the run cleanly: the wrapped server is
    told to stop through its stdin rather than left writing to a closed pipe."""
    with anyio.open_signal_receiver(signal.SIGTERM, signal.SIGINT) as signals:
        async for signum in signals:
            logger.info("received %s, stopping", signal.Signals(signum).name)
            scope.cancel()
            return


async def _serve_http(server: Server, listener: HttpListener) -> None:
    import uvicorn

    app = server.streamable_http_app(streamable_http_path=listener.path, host=listener.host)
    config = uvicorn.Config(app, host=listener.host, port=listener.port, log_level="warning", lifespan="on")
    http_server = uvicorn.Server(config)
    print(f"checkpointd mcp-proxy: serving http://{listener.host}:{listener.port}{listener.path}",
          file=sys.stderr, flush=True)
    await http_server.serve()
