"""Fixtures of the hardening tests. A server start costs seconds, and most of these tests start
their server with faults armed, so these hand over servers that are not started yet."""

from __future__ import annotations

import tempfile
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from tests.conftest import PostgresDatabases, RunningServer


@pytest.fixture
def idle_servers(short_tmp: Path, suite_databases: PostgresDatabases | None) -> Iterator[Callable[[], RunningServer]]:
    """Makes servers like `fresh_server` (same database and serve arguments) that are not started:
    the test starts them, usually through support.start_with_faults. All are stopped at the end."""
    made: list[tuple[RunningServer, str]] = []

    def make() -> RunningServer:
        db_url = suite_databases.create() if suite_databases is not None else ""
        server = RunningServer(Path(tempfile.mkdtemp(prefix="h-", dir=short_tmp)), db_url=db_url)
        made.append((server, db_url))
        return server

    yield make
    for server, db_url in made:
        server.stop()
        if suite_databases is not None:
            suite_databases.drop(db_url)


@pytest.fixture
def idle_server(idle_servers: Callable[[], RunningServer]) -> RunningServer:
    return idle_servers()
