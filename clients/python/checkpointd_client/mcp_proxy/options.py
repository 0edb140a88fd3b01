"""What one `checkpointd mcp-proxy` run is told: the server it wraps, the workspace, checkpointd."""

from __future__ import annotations

import os
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path

import grpc

from checkpointd_client.client import DEFAULT_DEADLINE_S


class ProxyOptionsError(ValueError):
    """Options the proxy cannot run with; the message says which and why."""


@dataclass(frozen=True)
class StdioUpstream:
    """An MCP server the proxy starts as a child process and speaks to over its stdin/stdout."""

    command: str
    args: tuple[str, ...] = ()
    # The whole environment by default: the host hands the wrapped server's variables to the proxy.
    env: Mapping[str, str] = field(default_factory=lambda: dict(os.environ))
    cwd: Path | None = None

    def describe(self) -> str:
        return " ".join((self.command, *self.args))


@dataclass(frozen=True)
class HttpUpstream:
    """An MCP server already running behind a Streamable HTTP endpoint."""

    url: str
    headers: Mapping[str, str] = field(default_factory=dict)

    def describe(self) -> str:
        return self.url


Upstream = StdioUpstream | HttpUpstream


@dataclass(frozen=True)
class CheckpointdConnection:
    """How to reach checkpointd: the same target, token and TLS options as the rest of the client."""

    target: str
    token: str | None = None
    credentials: grpc.ChannelCredentials | None = None
    server_name: str | None = None
    # Deadline of the undo tools' calls (list, diff, rollback); checkpoints use client_deadline_ms.
    call_deadline_s: float = DEFAULT_DEADLINE_S


@dataclass(frozen=True)
class HttpListener:
    """Serve the host over Streamable HTTP at http://HOST:PORT/mcp instead of stdio."""

    host: str
    port: int
    path: str = "/mcp"

    @classmethod
    def parse(cls, address: str) -> HttpListener:
        host, separator, port = address.rpartition(":")
        if not separator or not host or not port.isdigit() or not 0 < int(port) < 65536:
            raise ProxyOptionsError(f"--listen-http takes HOST:PORT, got {address!r}")
        return cls(host.strip("[]"), int(port))


@dataclass(frozen=True)
class ProxyOptions:
    """Everything a proxy run needs; `validated()` refuses combinations that cannot work."""

    upstream: Upstream
    workspace_root: Path
    checkpointd: CheckpointdConnection
    plan_id: str | None = None
    read_only_tools: frozenset[str] = frozenset()
    write_tools: frozenset[str] = frozenset()
    extra_tools: bool = True
    listen_http: HttpListener | None = None

    def validated(self) -> ProxyOptions:
        root = Path(os.path.abspath(self.workspace_root.expanduser()))
        if not root.is_dir():
            raise ProxyOptionsError(f"--workspace-root {root} is not a directory")
        both = self.read_only_tools & self.write_tools
        if both:
            raise ProxyOptionsError(f"tools named both --read-only-tool and --write-tool: {', '.join(sorted(both))}")
        if isinstance(self.upstream, StdioUpstream) and not self.upstream.command:
            raise ProxyOptionsError("no MCP server to wrap: give -- COMMAND [ARGS...] or --upstream-url URL")
        if isinstance(self.upstream, HttpUpstream) and not self.upstream.url.startswith(("http://", "https://")):
            raise ProxyOptionsError(f"--upstream-url must be an http:// or https:// URL, got {self.upstream.url!r}")
        return ProxyOptions(
            upstream=self.upstream,
            workspace_root=root,
            checkpointd=self.checkpointd,
            plan_id=self.plan_id,
            read_only_tools=self.read_only_tools,
            write_tools=self.write_tools,
            extra_tools=self.extra_tools,
            listen_http=self.listen_http,
        )
