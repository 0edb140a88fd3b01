"""checkpoints.pending_write_bytes, the total each put leaves so that the next one checks the limit
without reading the writes: exact through replaced special writes and racing replicas, filled by
migration 0007 from the rows already stored, and checked by fsck."""

from __future__ import annotations

import threading

import pytest
from sqlmodel import col, select, update

from checkpointd.core.engine import pending_writes
from checkpointd.core.engine.pending_writes import MAX_CHECKPOINT_BYTES, PendingWrite
from checkpointd.core.kernel.errors import Reason, ResourceExhausted
from checkpointd.core.maintenance.fsck import FindingKind
from checkpointd.core.metadata.db import Database
from checkpointd.core.metadata.models import WRITE_FRAMING_BYTES, CheckpointRow
from tests.postgres.conftest import Engine
from tests.postgres.test_migrations import execute, upgrade_to

MIB = 1 << 20


def _write(task: str, index: int, size: int, channel: str = "c", task_path: str = "") -> PendingWrite:
    return PendingWrite(task, index, channel, "bytes", b"v" * size, task_path)


def test_names_count_in_utf8_bytes_as_the_rows_hold_them(engine: Engine) -> None:
    checkpoint_id = engine.checkpoint()
    pending_writes.put(engine.db, checkpoint_id, [_write("tâche-ü", 0, 10, "canal-€", "~nœud:😀"),
                                                  _write("t", -1, 3)])
    recorded, stored = engine.total(checkpoint_id)
    assert recorded == stored == 10 + len("canal-€".encode()) + len("tâche-ü".encode()) + 5 + len(
        "~nœud:😀".encode()) + 3 + 1 + 1 + 5 + 2 * WRITE_FRAMING_BYTES


def test_a_replaced_special_write_gives_back_what_it_held(engine: Engine) -> None:
    checkpoint_id = engine.checkpoint()
    put = pending_writes.put
    put(engine.db, checkpoint_id, [_write("t", -1, 15 * MIB)])
    put(engine.db, checkpoint_id, [_write("t", 0, 15 * MIB)])
    put(engine.db, checkpoint_id, [_write("t", -1, 1)])  # the error superseded by a small one
    # 15 MiB more fits only if the 15 MiB replaced is no longer counted.
    put(engine.db, checkpoint_id, [_write("t", 1, 15 * MIB)])
    # A replacement that grows past the limit is refused, and changes nothing.
    with pytest.raises(ResourceExhausted) as refused:
        put(engine.db, checkpoint_id, [_write("t", -1, 3 * MIB)])
    assert refused.value.reason is Reason.PENDING_WRITES_FULL
    recorded, stored = engine.total(checkpoint_id)
    assert recorded == stored < MAX_CHECKPOINT_BYTES
    assert [(w.index, len(w.value)) for w in pending_writes.list_for(engine.db, checkpoint_id)] == [
        (-1, 1), (0, 15 * MIB), (1, 15 * MIB)]
    # A regular write put again keeps its first value and costs nothing; a special one put again
    # with the same value leaves the total as it was.
    put(engine.db, checkpoint_id, [_write("t", 0, 5 * MIB), _write("t", -1, 1)])
    assert engine.total(checkpoint_id) == (recorded, stored)
    assert engine.findings() == []


def test_one_put_naming_a_key_twice_is_counted_once(engine: Engine) -> None:
    checkpoint_id = engine.checkpoint()
    pending_writes.put(engine.db, checkpoint_id, [_write("t", 0, 7), _write("t", 0, 9), _write("t", -2, 100),
                                                  _write("t", -2, 4)])
    recorded, stored = engine.total(checkpoint_id)
    # values, "t" and "c", the type, the framing
    assert recorded == stored == (7 + 2) + (4 + 2) + 2 * len("bytes") + 2 * WRITE_FRAMING_BYTES
    assert [(w.index, len(w.value)) for w in pending_writes.list_for(engine.db, checkpoint_id)] == [(-2, 4), (0, 7)]


def test_racing_replicas_replacing_and_adding_keep_the_total_exact(engine: Engine, any_db_url: str) -> None:
    """Puts from two replicas replace the same special writes with values of every size while adding
    their own: a put that counted what it replaced from a row another put was replacing would leave
    the total off by that row's size."""
    checkpoint_id = engine.checkpoint()
    replicas = [engine.db] if engine.db.is_sqlite else [engine.db, Database(any_db_url)]
    start = threading.Barrier(8)
    failures: list[BaseException] = []

    def put(worker: int) -> None:
        start.wait()
        try:
            for step in range(15):
                pending_writes.put(replicas[worker % len(replicas)], checkpoint_id, [
                    _write("shared", -1, (worker * 37 + step * 101) % 3000),
                    _write("shared", -2, (worker * 53 + step * 7) % 500),
                    _write(f"worker-{worker}", step, worker + step)])
        except BaseException as exc:  # noqa: BLE001 - reported by the assertion below
            failures.append(exc)

    threads = [threading.Thread(target=put, args=(worker,)) for worker in range(8)]
    try:
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join(timeout=120)
    finally:
        for replica in replicas[1:]:
            replica.dispose()
    assert failures == []
    recorded, stored = engine.total(checkpoint_id)
    assert recorded == stored
    assert len(pending_writes.list_for(engine.db, checkpoint_id)) == 2 + 8 * 15


def test_fsck_reports_a_total_that_is_not_the_rows(engine: Engine) -> None:
    checkpoint_id, untouched = engine.checkpoint(), engine.checkpoint()
    pending_writes.put(engine.db, checkpoint_id, [_write("t", 0, 10)])
    assert engine.findings() == []
    with engine.db.session() as session:
        session.exec(update(CheckpointRow).where(col(CheckpointRow.checkpoint_id) == checkpoint_id)
                     .values(pending_write_bytes=3))
        session.exec(update(CheckpointRow).where(col(CheckpointRow.checkpoint_id) == untouched)
                     .values(pending_write_bytes=1))
        session.commit()
    assert sorted(engine.findings()) == sorted([
        (FindingKind.BAD_ROW, checkpoint_id,
         f"pending_write_bytes is 3, but its pending writes total {17 + WRITE_FRAMING_BYTES} bytes (a put past the "
         "limit could be accepted, or one within it refused)"),
        (FindingKind.BAD_ROW, untouched,
         "pending_write_bytes is 1, but its pending writes total 0 bytes (a put past the limit could be accepted, "
         "or one within it refused)")])


def test_migration_0007_fills_the_total_from_the_rows_already_stored(any_db_url: str) -> None:
    upgrade_to(any_db_url, "0006")
    execute(
        any_db_url,
        "INSERT INTO plans (plan_id, workspace_root, last_sequence, create_time) "
        "VALUES ('01JPLAN0000000000000000001', NULL, 2, CURRENT_TIMESTAMP)",
        *(f"INSERT INTO checkpoints (checkpoint_id, plan_id, sequence, phase, trigger, source_tool, description, "
          f"labels, create_time, file_count, total_size_bytes, state_size_bytes, skipped, ignore_patterns, "
          f"excluded_paths) VALUES ('01JCKPT000000000000000000{n}', '01JPLAN0000000000000000001', {n}, 'execute', "
          f"'manual', '', '', '{{}}', CURRENT_TIMESTAMP, 0, 0, 0, '[]', '[]', '[]')" for n in (1, 2)),
        "INSERT INTO pending_writes (checkpoint_id, task_id, idx, channel, value_type, value, task_path) VALUES "
        "('01JCKPT0000000000000000001', 'tâche', 0, 'canal-€', 'bytes', :value, '~😀'), "
        "('01JCKPT0000000000000000001', 'tâche', -1, '__error__', '', :empty, '')",
        value=b"x" * 1000, empty=b"")
    database = Database(any_db_url)
    try:
        database.migrate()
        with database.session() as session:
            totals = dict(session.exec(select(CheckpointRow.checkpoint_id, CheckpointRow.pending_write_bytes)).all())
    finally:
        database.dispose()
    first = 1000 + len("tâche".encode()) + len("canal-€".encode()) + 5 + len("~😀".encode()) + 32
    second = len("tâche".encode()) + len("__error__") + 32  # 32: the framing 0007 counts
    assert totals == {"01JCKPT0000000000000000001": first + second, "01JCKPT0000000000000000002": 0}
