"""Secrets shared by the replicas of one database (server_secrets), on SQLite and PostgreSQL."""

from __future__ import annotations

import threading
from concurrent import futures

from checkpointd.core.metadata.db import Database
from checkpointd.core.metadata.server_secrets import shared_secret


def test_a_shared_secret_is_made_once_however_many_ask_at_once(any_db_url: str) -> None:
    databases = [Database(any_db_url) for _ in range(4)]
    databases[0].migrate()
    barrier = threading.Barrier(len(databases))

    def ask(database: Database) -> bytes:
        barrier.wait()
        return shared_secret(database, "test-secret")

    try:
        with futures.ThreadPoolExecutor(len(databases)) as pool:
            secrets = list(pool.map(ask, databases))
        assert len(set(secrets)) == 1 and len(secrets[0]) == 32
        assert shared_secret(Database(any_db_url), "test-secret") == secrets[0]
        assert shared_secret(databases[0], "another") != secrets[0]
    finally:
        for database in databases:
            database.dispose()
