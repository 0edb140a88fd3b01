"""Fixtures of the CLI tests: the session server's TCP target as `--target` arguments, and a plan
with one checkpoint made through the CLI."""

from __future__ import annotations

import json

import pytest
from ulid import ULID

from tests.ops.conftest import run_cli


@pytest.fixture
def tcp(checkpointd_server) -> list[str]:
    return ["--target", checkpointd_server.tcp_target]


@pytest.fixture
def checkpoint(checkpointd_server, tcp) -> dict:
    """A plan with one checkpoint of a workspace holding a.txt, and some plan state."""
    workspace = checkpointd_server.new_workspace()
    (workspace / "a.txt").write_text("original")
    state = workspace.parent / f"{workspace.name}.state"
    state.write_text('{"step": 1}')
    done = run_cli("create", str(ULID()), "--workspace-root", str(workspace), "--state-file", str(state),
                   "--json", *tcp)
    assert done.returncode == 0, done.stderr
    return json.loads(done.stdout) | {"_workspace": workspace}
