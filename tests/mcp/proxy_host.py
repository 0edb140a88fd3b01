"""The host side of the MCP proxy tests: a real `mcp` ClientSession talking to `checkpointd
mcp-proxy` (a subprocess) over stdio or Streamable HTTP, and what the tests read back."""

from __future__ import annotations

import subprocess
import sys
import time
from collections.abc import AsyncIterator, Sequence
from contextlib import asynccontextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import anyio
import grpc
import httpx2
import mcp_types as types
from mcp.client.session import ClientSession
from mcp.client.stdio import StdioServerParameters, stdio_client
from mcp.client.streamable_http import streamable_http_client

from checkpointd_client import Checkpoint, CheckpointClient, CheckpointdRpcError, trigger_name
from tests.conftest import CHECKPOINTD, free_port

SLOW_SERVER = [sys.executable, str(Path(__file__).with_name("slow_server.py"))]
WAIT_S = 30.0


@dataclass
class Proxy:
    """A running proxy as the host sees it, plus its stderr (the host's MCP log)."""

    session: ClientSession
    stderr_path: Path

    def stderr(self) -> str:
        return self.stderr_path.read_text(errors="replace")

    async def wait_for_stderr(self, text: str, timeout: float = WAIT_S) -> str:
        """Wait until the proxy has written `text` to stderr; its whole stderr so far."""
        deadline = time.monotonic() + timeout
        while text not in (log := self.stderr()):
            if time.monotonic() > deadline:
                raise AssertionError(f"the proxy never wrote {text!r}; its stderr:\n{log}")
            await anyio.sleep(0.05)
        return log

    async def call(self, tool: str, arguments: dict | None = None, **kwargs) -> types.CallToolResult:
        return await self.session.call_tool(tool, arguments or {}, **kwargs)


def proxy_command(target: str, workspace: Path, *, plan_id: str | None, extra: Sequence[str]) -> list[str]:
    command = [CHECKPOINTD, "mcp-proxy", "--target", target, "--workspace-root", str(workspace), "--log-level", "INFO"]
    if plan_id is not None:
        command += ["--plan-id", plan_id]
    return [*command, *extra]


def _upstream_args(upstream: Sequence[str]) -> list[str]:
    return list(upstream) if upstream[0] == "--upstream-url" else ["--", *upstream]


@asynccontextmanager
async def proxied(
    target: str,
    workspace: Path,
    upstream: Sequence[str],
    *,
    plan_id: str | None,
    options: Sequence[str] = (),
    **session_options: Any,
) -> AsyncIterator[Proxy]:
    """The host's session with a proxy started over stdio, wrapping `upstream` (a command, or
    ["--upstream-url", URL]); `session_options` go to the host's ClientSession."""
    command = proxy_command(target, workspace, plan_id=plan_id, extra=[*options, *_upstream_args(upstream)])
    stderr_path = workspace.parent / f"{workspace.name}.proxy.log"
    parameters = StdioServerParameters(command=command[0], args=command[1:])
    with open(stderr_path, "w") as errlog:
        async with (
            stdio_client(parameters, errlog=errlog) as (read_stream, write_stream),
            ClientSession(read_stream, write_stream, **session_options) as session,
        ):
            await session.initialize()
            yield Proxy(session, stderr_path)


@asynccontextmanager
async def proxied_over_http(
    target: str, workspace: Path, upstream: Sequence[str], *, plan_id: str | None
) -> AsyncIterator[Proxy]:
    """The host's session with a proxy serving Streamable HTTP (--listen-http)."""
    port = free_port()
    command = proxy_command(
        target, workspace, plan_id=plan_id, extra=["--listen-http", f"127.0.0.1:{port}", *_upstream_args(upstream)]
    )
    stderr_path = workspace.parent / f"{workspace.name}.proxy.log"
    with open(stderr_path, "w") as errlog:
        process = subprocess.Popen(command, stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=errlog)
    try:
        await wait_for_port(port, process)
        async with (
            httpx2.AsyncClient(timeout=httpx2.Timeout(30.0, read=None)) as http_client,
            streamable_http_client(f"http://127.0.0.1:{port}/mcp", http_client=http_client) as (read, write),
            ClientSession(read, write) as session,
        ):
            await session.initialize()
            yield Proxy(session, stderr_path)
    finally:
        stop(process)


async def wait_for_port(port: int, process: subprocess.Popen, timeout: float = WAIT_S) -> None:
    deadline = time.monotonic() + timeout
    while True:
        if process.poll() is not None:
            raise AssertionError(f"{process.args} exited with {process.returncode}")
        try:
            stream = await anyio.connect_tcp("127.0.0.1", port)
        except OSError:
            if time.monotonic() > deadline:
                raise AssertionError(f"nothing listens on port {port} after {timeout}s") from None
            await anyio.sleep(0.05)
        else:
            await stream.aclose()
            return


def stop(process: subprocess.Popen) -> None:
    if process.poll() is None:
        process.terminate()
        try:
            process.wait(timeout=10)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait()


def text_of(result: types.CallToolResult) -> str:
    return "\n".join(block.text for block in result.content if isinstance(block, types.TextContent))


def checkpoints_of(target: str, plan_id: str) -> list[Checkpoint]:
    """The plan's checkpoints, oldest first; [] for a plan checkpointd has never seen."""
    with grpc.insecure_channel(target) as channel:
        try:
            checkpoints = CheckpointClient(channel).list_checkpoints(plan_id)
        except CheckpointdRpcError as error:
            if error.reason == "PLAN_NOT_FOUND":
                return []
            raise
    return list(reversed(checkpoints))


def timeline(checkpoints: Sequence[Checkpoint]) -> list[tuple[str, str]]:
    """(trigger, source_tool) per checkpoint, oldest first."""
    return [(trigger_name(checkpoint.trigger), checkpoint.source_tool) for checkpoint in checkpoints]
