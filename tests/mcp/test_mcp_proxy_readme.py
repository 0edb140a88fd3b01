"""The `mcpServers` configuration in the README's "Use with any MCP host", run as a host would.

Only the workspace path and the checkpointd executable are the test's; checkpointd's address comes
from CHECKPOINTD_TARGET, as it may for a host. `npx -y @modelcontextprotocol/server-filesystem`
runs as written, from tests/mcp/upstream, where npx finds the pinned package without a download.
"""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest
from mcp.client.session import ClientSession
from mcp.client.stdio import StdioServerParameters, stdio_client

from tests.conftest import CHECKPOINTD
from tests.contract.readme_commands import fenced_blocks, section
from tests.mcp.conftest import HERE
from tests.mcp.proxy_host import checkpoints_of, text_of, timeline

pytestmark = pytest.mark.anyio

README = Path(__file__).resolve().parents[2] / "README.md"
EXAMPLE_WORKSPACE = "/home/me/project"


def readme_host_config() -> dict:
    (block,) = fenced_blocks(section(README.read_text(encoding="utf-8"), "Use with any MCP host"), "json")
    return json.loads(block)


async def test_the_readme_host_configuration_checkpoints_a_write(
    checkpointd_server, workspace: Path, filesystem_server
) -> None:
    server = readme_host_config()["mcpServers"]["filesystem"]
    assert server["command"] == "checkpointd"
    args = [arg.replace(EXAMPLE_WORKSPACE, str(workspace)) for arg in server["args"]]
    parameters = StdioServerParameters(
        command=CHECKPOINTD, args=args, cwd=HERE / "upstream", env={"CHECKPOINTD_TARGET": checkpointd_server.tcp_target}
    )
    stderr_path = workspace.parent / f"{workspace.name}.readme.log"
    with open(stderr_path, "w") as errlog:
        async with (
            stdio_client(parameters, errlog=errlog) as (read_stream, write_stream),
            ClientSession(read_stream, write_stream) as session,
        ):
            await session.initialize()
            written = await session.call_tool("write_file", {"path": str(workspace / "a.txt"), "content": "a"})
            assert not written.is_error, text_of(written)

    plan_id = re.search(r"checkpointd mcp-proxy: plan (\w+)", stderr_path.read_text()).group(1)
    assert timeline(checkpoints_of(checkpointd_server.tcp_target, plan_id)) == [
        ("before_tool_execute", "write_file"),
        ("after_tool_execute", "write_file"),
    ]
