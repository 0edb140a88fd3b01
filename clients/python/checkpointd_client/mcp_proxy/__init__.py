"""`checkpointd mcp-proxy`: an MCP server to the host, an MCP client to the wrapped MCP server,
taking checkpoints around the wrapped server's write tools (needs the `mcp` extra).

Write tools are those whose annotations do not say `readOnlyHint: true`; each call runs between a
before_tool_execute and (when it succeeds) an after_tool_execute checkpoint, decided exactly as
the Python client's `ToolCheckpointInterceptor` decides them, because it is that interceptor.
"""

from checkpointd_client.mcp_proxy.options import (
    CheckpointdConnection,
    HttpListener,
    HttpUpstream,
    ProxyOptions,
    ProxyOptionsError,
    StdioUpstream,
)
from checkpointd_client.mcp_proxy.run import new_plan_id, run, serve
from checkpointd_client.mcp_proxy.server import McpProxy, ToolNameClash
from checkpointd_client.mcp_proxy.tool_kinds import ToolKinds, annotated_read_only

__all__ = [
    "CheckpointdConnection",
    "HttpListener",
    "HttpUpstream",
    "McpProxy",
    "ProxyOptions",
    "ProxyOptionsError",
    "StdioUpstream",
    "ToolKinds",
    "ToolNameClash",
    "annotated_read_only",
    "new_plan_id",
    "run",
    "serve",
]
