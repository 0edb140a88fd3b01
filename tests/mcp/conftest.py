"""Fixtures for the MCP proxy tests: the pinned reference filesystem server, the tiny slow server,
and the host side (the SDK's own ClientSession) driving `checkpointd mcp-proxy` subprocesses."""

from __future__ import annotations

from pathlib import Path

import pytest

HERE = Path(__file__).parent
FILESYSTEM_SERVER = HERE / "upstream" / "node_modules" / ".bin" / "mcp-server-filesystem"


@pytest.fixture
def anyio_backend() -> str:
    return "asyncio"


@pytest.fixture(scope="session")
def filesystem_server() -> Path:
    """The reference MCP filesystem server from npm, as pinned in tests/mcp/upstream/package-lock.json."""
    if not FILESYSTEM_SERVER.exists():
        pytest.fail(
            f"{FILESYSTEM_SERVER} is missing: `make test` installs it (or: cd tests/mcp/upstream && npm ci)",
            pytrace=False,
        )
    return FILESYSTEM_SERVER
