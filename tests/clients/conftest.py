"""Fixtures for the client tests: connections to the real server over TCP and the unix socket."""

from __future__ import annotations

import tempfile
from collections.abc import Callable, Iterator
from pathlib import Path

import grpc
import pytest
from ulid import ULID

from checkpointd_client import Checkpoint, CheckpointClient, Checkpointd, CheckpointdRpcError

ListPlan = Callable[..., list[Checkpoint]]


@pytest.fixture(params=["tcp", "unix"])
def target(request: pytest.FixtureRequest, checkpointd_server) -> str:
    """The session server's address, once per transport."""
    return checkpointd_server.tcp_target if request.param == "tcp" else checkpointd_server.unix_target


@pytest.fixture
def checkpointd(target: str) -> Iterator[Checkpointd]:
    """A client wired to the session server, reading its checkpoint settings."""
    with Checkpointd(target) as connection:
        yield connection


@pytest.fixture
def fresh_checkpointd(fresh_server) -> Iterator[Checkpointd]:
    """A client wired to a server of this test's own (which the test may stop)."""
    with Checkpointd(fresh_server.tcp_target) as connection:
        yield connection


@pytest.fixture
def fresh_workspace(fresh_server) -> Path:
    """An empty workspace the fresh server accepts."""
    return Path(tempfile.mkdtemp(prefix="ws-", dir=fresh_server.allowed_root))


def new_plan_id() -> str:
    return str(ULID())


def list_plan(client: CheckpointClient, plan_id: str, filter_expr: str = "") -> list[Checkpoint]:
    """A plan's checkpoints; a plan the server has never seen has none (PLAN_NOT_FOUND)."""
    try:
        return client.list_checkpoints(plan_id, filter_expr=filter_expr)
    except CheckpointdRpcError as error:
        if error.code == grpc.StatusCode.NOT_FOUND and error.reason == "PLAN_NOT_FOUND":
            return []
        raise
