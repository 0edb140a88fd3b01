"""Fixtures of the hardening tests. A server start costs seconds, and most of these tests start
their server with faults armed, so `idle_server` hands over one that is not started yet."""

from __future__ import annotations

import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.conftest import PostgresDatabases, RunningServer


@pytest.fixture
def idle_server(short_tmp: Path, suite_databases: PostgresDatabases | None) -> Iterator[RunningServer]:
    """Like `fresh_server` (same database and serve arguments), but not started: the test starts it,
    usually through support.start_with_faults."""
    db_url = suite_databases.create() if suite_databases is not None else ""
    server = RunningServer(Path(tempfile.mkdtemp(prefix="h-", dir=short_tmp)), db_url=db_url)
    try:
        yield server
    finally:
        server.stop()
        if suite_databases is not None:
            suite_databases.drop(db_url)
