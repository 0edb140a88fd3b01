"""The clients accept every response the server may send: their receive limits are the server's
send limit (gRPC's default of 4 MiB would leave acknowledged checkpoints with large states,
pages of records and long change lists unreadable; see tests/langgraph/test_saver_attacked.py)."""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

import pytest

from checkpointd import server
from checkpointd.core.engine import pending_writes
from checkpointd_client import client

NODE_CLIENT = Path(__file__).resolve().parents[2] / "clients" / "node" / "src" / "client.js"


def test_the_python_client_accepts_what_the_server_sends() -> None:
    assert client.MAX_RESPONSE_BYTES == server.MAX_SEND_BYTES


@pytest.mark.skipif(shutil.which("node") is None, reason="needs Node")
def test_the_node_client_accepts_what_the_server_sends() -> None:
    printed = subprocess.run(["node", "-e", f"console.log(require({str(NODE_CLIENT)!r}).MAX_RESPONSE_BYTES)"],
                             capture_output=True, text=True, check=True, timeout=60).stdout
    assert int(printed) == server.MAX_SEND_BYTES


def test_the_python_client_splits_pending_writes_at_the_servers_limits() -> None:
    assert client.MAX_WRITES_PER_CALL == pending_writes.MAX_WRITES
    assert client.MAX_WRITE_BYTES_PER_CALL == pending_writes.MAX_TOTAL_BYTES
