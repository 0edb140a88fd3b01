"""Conditional config changes (AIP-154 etags) racing: many read-modify-write updates made from one
read, at once, on SQLite (one server) and on PostgreSQL (two replicas, each its own connections):
exactly one goes through, the others are refused ETAG_MISMATCH, and the value is the winner's."""

from __future__ import annotations

import contextlib
import threading

import pytest
from ulid import ULID

from checkpointd.core.config.registry import RETENTION_MAX_AGE_SECONDS, ConfigStore
from checkpointd.core.kernel.errors import Aborted, Reason
from checkpointd.core.metadata.db import Database


@pytest.mark.parametrize("scope", ["global", "plan-inheriting-the-global-value", "plan"])
def test_updates_from_one_read_racing_let_exactly_one_through(any_db_url: str, scope: str) -> None:
    databases = [Database(any_db_url)]
    databases[0].migrate()
    if not databases[0].is_sqlite:
        databases.append(Database(any_db_url))  # a second replica
    stores = [ConfigStore(db) for db in databases]
    plan_id = "" if scope == "global" else str(ULID())
    if scope != "global":
        stores[0].set(RETENTION_MAX_AGE_SECONDS, 1000)  # a global value for the plan to inherit
    if scope == "plan":
        stores[0].set(RETENTION_MAX_AGE_SECONDS, 2000, plan_id)
    read = stores[-1].resolve(RETENTION_MAX_AGE_SECONDS, plan_id)
    start = threading.Barrier(8)
    won: list[int] = []
    refused: list[Aborted] = []

    def update(value: int) -> None:
        start.wait()
        try:
            stores[value % len(stores)].set(RETENTION_MAX_AGE_SECONDS, value, plan_id, read.etag)
            won.append(value)
        except Aborted as exc:
            refused.append(exc)

    threads = [threading.Thread(target=update, args=(3000 + i,)) for i in range(8)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=60)
    try:
        assert len(won) == 1, (won, refused)
        assert len(refused) == 7 and all(e.reason is Reason.ETAG_MISMATCH for e in refused)
        for store in stores:
            now = store.resolve(RETENTION_MAX_AGE_SECONDS, plan_id)
            assert now.value == won[0] and now.etag != read.etag
        assert all(e.metadata["etag"] != read.etag for e in refused), "a refusal names the etag it refused"
    finally:
        for db in databases:
            db.dispose()


def test_a_change_reading_while_another_changes_waits_for_its_commit(any_db_url: str, monkeypatch) -> None:
    """Deterministically, the interleaving the race above hits by chance: change A has read the
    value's rows and checked the etag; change B (another replica's on PostgreSQL, the same
    server's on SQLite) must not read them until A has committed (rows locked; changes taking
    turns), so B checks its etag against A's value and is refused. Each side pauses after its
    check for the other to reach its own (at most 2 s): only A gets there, and the pause runs out."""
    from checkpointd.core.config import registry as registry_module

    databases = [Database(any_db_url)]
    databases[0].migrate()
    if not databases[0].is_sqlite:
        databases.append(Database(any_db_url))
    stores = [ConfigStore(db) for db in databases] * (3 - len(databases))
    plan_id = str(ULID())
    stores[0].set(RETENTION_MAX_AGE_SECONDS, 1000)
    stores[0].set(RETENTION_MAX_AGE_SECONDS, 2000, plan_id)
    read = stores[1].resolve(RETENTION_MAX_AGE_SECONDS, plan_id)
    both_checked = threading.Barrier(2, timeout=2)
    real_effective = registry_module._effective

    def effective_then_pause(*args, **kwargs):
        found = real_effective(*args, **kwargs)
        with contextlib.suppress(threading.BrokenBarrierError):
            both_checked.wait()
        return found

    monkeypatch.setattr(registry_module, "_effective", effective_then_pause)
    won: list[int] = []
    refused: list[Aborted] = []

    def update(replica: int) -> None:
        try:
            stores[replica].set(RETENTION_MAX_AGE_SECONDS, 3000 + replica, plan_id, read.etag)
            won.append(replica)
        except Aborted as exc:
            refused.append(exc)

    threads = [threading.Thread(target=update, args=(replica,)) for replica in (0, 1)]
    try:
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join(timeout=60)
        assert len(won) == 1 and len(refused) == 1, (won, refused)
        assert refused[0].reason is Reason.ETAG_MISMATCH
        assert stores[0].resolve(RETENTION_MAX_AGE_SECONDS, plan_id).value == 3000 + won[0]
    finally:
        for db in databases:
            db.dispose()
