"""Retention and garbage collection on the engine itself (real SQLite, real content stores on disk
and in the database, no server): what README's "Retention and garbage collection" promises, checked
object by object. "Only unreferenced content goes": after a collection the store holds exactly what
the remaining checkpoints reference (plan states, file contents, every subtree), and the report
counts what went. These take a few seconds, so `make mutants` runs them per mutant of
`core/maintenance/retention.py`; the server-level variants are in test_retention.py and test_gc_references.py.
"""

from __future__ import annotations

import logging
import os
import time
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest
from ulid import ULID

from checkpointd.core.config.registry import (
    RETENTION_MAX_AGE_SECONDS,
    RETENTION_MAX_CHECKPOINTS,
    RETENTION_SAFETY_MAX_AGE_SECONDS,
    ConfigStore,
)
from checkpointd.core.engine.checkpoints import Checkpoints
from checkpointd.core.engine.requests import CreateRequest, EngineSettings, RollbackRequest, Scope
from checkpointd.core.kernel import telemetry
from checkpointd.core.kernel.faults import Point
from checkpointd.core.maintenance import fsck
from checkpointd.core.maintenance import retention as retention_module
from checkpointd.core.maintenance.retention import (
    Candidate,
    GcAborted,
    Maintenance,
    Policy,
    Rule,
    object_sizes,
    select_prunable,
)
from checkpointd.core.metadata.db import Database
from checkpointd.core.restore import restorer as restore_module
from checkpointd.core.store.db_store import DatabaseStore, open_store
from checkpointd.core.store.tree import EMPTY_TREE, EntryKind


class Engine:
    def __init__(self, root: Path, store_kind: str, db_name: str = "meta.db", engine_data: str = "data") -> None:
        self.workspaces = root / "workspaces"
        self.workspaces.mkdir(exist_ok=True)
        self.db = Database(f"sqlite:///{root / db_name}")
        self.db.migrate()
        self.store = open_store(store_kind, self.db, root)
        self.config = ConfigStore(self.db)
        self.checkpoints = Checkpoints(self.db, self.store, self.config,
                                       EngineSettings(root / engine_data, (str(self.workspaces),), watcher=False))
        self.maintenance = Maintenance(self.db, self.store, self.checkpoints.trees, self.config,
                                       self.checkpoints.delete)

    def workspace(self) -> Path:
        path = self.workspaces / str(ULID())
        path.mkdir()
        return path

    def create(self, plan_id: str, workspace: Path | None = None, state: bytes = b"", **fields):
        request = CreateRequest(plan_id=plan_id, state=state, workspace_root=str(workspace or ""), **fields)
        return self.checkpoints.create(request).row

    def referenced(self) -> set[str]:
        """Every object the checkpoints in the database reference, walked here independently of GC."""
        return set().union(*(self.referenced_by(row) for row in self._rows()))

    def referenced_by(self, row) -> set[str]:
        """The objects one checkpoint row references: its state, its tree's nodes and files."""
        found = {row.state_digest} if row.state_digest else set()
        pending = [row.tree_digest] if row.tree_digest else []
        while pending:
            digest = pending.pop()
            found.add(digest)
            for entry in self.checkpoints.trees.read(digest).values():
                if entry.kind is EntryKind.DIR:
                    pending.append(entry.digest)
                elif entry.kind is EntryKind.FILE:
                    found.add(entry.digest)
        return found

    def _rows(self):
        from sqlmodel import select

        from checkpointd.core.metadata.models import CheckpointRow
        with self.db.session() as session:
            return list(session.exec(select(CheckpointRow)).all())

    def stored(self) -> set[str]:
        return set(self.store.iter_digests())

    def close(self) -> None:
        self.checkpoints.close()
        self.store.close()
        self.db.dispose()


@pytest.fixture(params=["disk", "db"])
def engine(request, tmp_path: Path) -> Iterator[Engine]:
    engine = Engine(tmp_path, request.param)
    try:
        yield engine
    finally:
        engine.close()


def _two_checkpoints_then_delete_the_first(engine: Engine) -> tuple[str, set[str]]:
    """A plan with an old checkpoint (deleted) and a new one sharing part of its tree; returns the
    kept checkpoint's id and the objects only the deleted one referenced."""
    workspace = engine.workspace()
    (workspace / "shared").mkdir()
    (workspace / "shared" / "same.txt").write_text("the same in both")
    (workspace / "old" / "deeper").mkdir(parents=True)
    (workspace / "old" / "deeper" / "gone.bin").write_bytes(os.urandom(5000))
    (workspace / "top.txt").write_text("first")
    plan_id = str(ULID())
    first = engine.create(plan_id, workspace, state=os.urandom(3000))
    only_first_before = engine.referenced()
    (workspace / "old" / "deeper" / "gone.bin").unlink()
    (workspace / "old" / "deeper").rmdir()
    (workspace / "old").rmdir()
    (workspace / "top.txt").write_text("second")
    second = engine.create(plan_id, workspace, state=os.urandom(3000))
    only_first = only_first_before - (engine.referenced() - only_first_before) - engine.referenced_by(second)
    engine.checkpoints.delete(first.checkpoint_id)
    return second.checkpoint_id, only_first


def test_gc_deletes_exactly_what_no_checkpoint_references_and_counts_it(engine: Engine) -> None:
    kept_id, only_deleted = _two_checkpoints_then_delete_the_first(engine)
    state_only = engine.create(str(ULID()), state=b"a plan state and nothing else" * 100)
    before = engine.stored()
    assert len(only_deleted) >= 5  # the old state, gone.bin, old/, old/deeper/, top.txt, the root

    started = time.monotonic()
    report = engine.maintenance.collect_garbage()
    elapsed = time.monotonic() - started

    after = engine.stored()
    assert before - after == only_deleted
    assert 0 <= report.duration_seconds <= elapsed
    assert after == engine.referenced()
    assert state_only.state_digest in after
    assert report.deleted_objects == len(only_deleted)
    assert report.reclaimed_bytes >= 5000 + 3000
    assert (report.store_objects, report.dry_run) == (len(after), False)
    assert report.store_bytes > 0
    if not isinstance(engine.store, DatabaseStore):  # on disk: every file under the store's root, to the byte
        assert report.store_bytes == sum(path.lstat().st_size for path in Path(engine.store.root).rglob("*")
                                         if path.is_file())
    else:  # in the database: the objects as stored (compressed), what the per-plan figures count
        assert report.store_bytes == sum(engine.store.stored_sizes(after).values())
        assert report.store_bytes < sum(object_sizes(engine.store, after).values())  # a state compressed
    assert engine.checkpoints.get(kept_id, with_state=True).state  # the kept one still reads
    # Nothing is left to collect: a second run deletes nothing.
    assert engine.maintenance.collect_garbage().deleted_objects == 0


def test_a_subtree_two_checkpoints_share_never_hides_the_rest_of_either(engine: Engine) -> None:
    workspace = engine.workspace()
    (workspace / "z_shared").mkdir()
    (workspace / "z_shared" / "same.txt").write_text("in both")
    (workspace / "a_own" / "deeper").mkdir(parents=True)
    (workspace / "a_own" / "deeper" / "f.txt").write_text("first")
    plan_id = str(ULID())
    engine.create(plan_id, workspace)
    (workspace / "a_own" / "deeper" / "f.txt").write_text("second")
    engine.create(plan_id, workspace)
    before = engine.stored()

    assert engine.maintenance.collect_garbage().deleted_objects == 0

    assert engine.stored() == before == engine.referenced()


def test_every_unreferenced_object_is_counted_however_many_there_are(engine: Engine) -> None:
    with engine.store.batch() as batch:
        for _ in range(1001):  # more than one chunk of the database store's size query
            batch.put_bytes(os.urandom(100))

    report = engine.maintenance.collect_garbage()

    assert (report.deleted_objects, report.reclaimed_bytes) == (1001, 1001 * 100)
    assert engine.stored() == set() and report.store_objects == 0
    if isinstance(engine.store, DatabaseStore):
        assert report.store_bytes == 0


def test_fsck_counts_as_referenced_what_a_collection_keeps_an_empty_directory_included(engine: Engine) -> None:
    """The empty tree reads as no entries without its object, but an empty directory's capture
    stores it: a collection keeps it (referenced), so fsck must not count it unreferenced."""
    workspace = engine.workspace()
    (workspace / "empty").mkdir()
    (workspace / "file.txt").write_text("beside an empty directory\n")
    engine.create(str(ULID()), workspace)
    engine.maintenance.collect_garbage()
    assert EMPTY_TREE in engine.stored()

    report = fsck.check(engine.db, engine.store, full=True)

    assert (report.problems, report.unreferenced_objects) == ([], 0)


def test_a_checkpoint_committed_while_gc_runs_keeps_what_it_references(engine: Engine, monkeypatch) -> None:
    workspace = engine.workspace()
    (workspace / "dir").mkdir()
    (workspace / "dir" / "content.txt").write_text("referenced again by a checkpoint made during the GC")
    engine.create(str(ULID()), state=b"another plan's checkpoint, listed first" * 100)
    plan_id = str(ULID())
    engine.checkpoints.delete(engine.create(plan_id, workspace).checkpoint_id)
    made: list = []

    def checkpoint_meanwhile(point: Point) -> None:
        if point is Point.GC_LISTED:  # the candidates are listed; nothing is deleted yet
            made.append(engine.create(plan_id, workspace))

    monkeypatch.setattr(retention_module, "crash_point", checkpoint_meanwhile)
    report = engine.maintenance.collect_garbage()

    assert made and report.deleted_objects == 0
    assert engine.referenced_by(made[0]) <= engine.stored()


def test_a_dry_run_collection_reports_the_same_and_deletes_nothing(engine: Engine) -> None:
    _kept, only_deleted = _two_checkpoints_then_delete_the_first(engine)
    before = engine.stored()

    dry = engine.maintenance.collect_garbage(dry_run=True)

    assert engine.stored() == before
    assert (dry.deleted_objects, dry.dry_run) == (len(only_deleted), True)
    real = engine.maintenance.collect_garbage()
    assert (real.deleted_objects, real.reclaimed_bytes) == (dry.deleted_objects, dry.reclaimed_bytes)


def test_a_missing_subtree_aborts_the_collection_before_anything_is_deleted(engine: Engine) -> None:
    workspace = engine.workspace()
    (workspace / "a" / "b").mkdir(parents=True)
    (workspace / "a" / "b" / "f.txt").write_text("deep")
    plan_id = str(ULID())
    engine.create(plan_id, workspace)
    (workspace / "a" / "b" / "f.txt").write_text("changed")
    doomed = engine.create(plan_id, workspace)
    root = engine.checkpoints.trees.read(doomed.tree_digest)
    engine.store.delete(root["a"].digest)  # damage: a referenced subtree is gone
    engine.checkpoints.trees = type(engine.checkpoints.trees)(engine.store)  # no cached copy hides it
    maintenance = Maintenance(engine.db, engine.store, engine.checkpoints.trees, engine.config,
                              engine.checkpoints.delete)
    engine.checkpoints.delete(engine.checkpoints.list(plan_id)[0][-1].row.checkpoint_id)
    before = engine.stored()

    with pytest.raises(GcAborted, match="missing"):
        maintenance.collect_garbage()
    assert engine.stored() == before


def test_retention_prunes_by_each_rule_and_a_plan_override_wins(engine: Engine) -> None:
    counted, aged, overridden = (str(ULID()) for _ in range(3))
    for plan_id in (counted, overridden):
        for n in range(4):
            engine.create(plan_id, state=f"{plan_id} {n}".encode())
    pinned = engine.create(counted, state=b"pinned", labels={"pinned": "true"})
    old_aged = engine.create(aged, state=b"old")
    newest_aged = engine.create(aged, state=b"newest")
    safety = engine.checkpoints.rollback(RollbackRequest(
        aged, old_aged.checkpoint_id, scope=Scope.STATE, current_state=b"before the rollback")).safety.row
    engine.config.set(RETENTION_MAX_CHECKPOINTS, 2)
    engine.config.set(RETENTION_MAX_CHECKPOINTS, 3, plan_id=overridden)
    engine.config.set(RETENTION_MAX_AGE_SECONDS, 60, plan_id=aged)
    engine.config.set(RETENTION_SAFETY_MAX_AGE_SECONDS, 60, plan_id=aged)
    later = datetime.now(UTC) + timedelta(hours=1)

    pruned_events: list[tuple[str, int]] = []

    class Recorder(telemetry.Sink):
        def checkpoints_pruned(self, rule: str, count: int) -> None:
            pruned_events.append((rule, count))

    recorder = Recorder()
    telemetry.bind(recorder)
    try:
        dry = engine.maintenance.prune(now=later, dry_run=True)
        assert pruned_events == []  # a dry run is not counted as pruning, and deletes nothing
        assert sum(engine.checkpoints.count(p) for p in (counted, aged, overridden)) == 5 + 3 + 4
        report = engine.maintenance.prune(now=later)
    finally:
        telemetry.unbind(recorder)
    assert sorted(pruned_events) == [("max_age", 1), ("max_checkpoints_per_plan", 3), ("safety_max_age", 1)]
    assert dry.dry_run and dry.total == 2 + 1 + 1 + 1

    assert report.pruned == {Rule.MAX_CHECKPOINTS: 3, Rule.MAX_AGE: 1, Rule.SAFETY_MAX_AGE: 1}
    assert sorted(report.checkpoint_ids) == sorted(dry.checkpoint_ids)
    assert [c.row.checkpoint_id for c in engine.checkpoints.list(aged)[0]] == [newest_aged.checkpoint_id]
    assert safety.checkpoint_id in report.checkpoint_ids
    assert pinned.checkpoint_id in {c.row.checkpoint_id for c in engine.checkpoints.list(counted)[0]}
    assert (engine.checkpoints.count(counted), engine.checkpoints.count(overridden)) == (3, 3)
    assert engine.maintenance.prune(now=later).total == 0


def test_a_global_rule_alone_prunes_every_plan(engine: Engine) -> None:
    plans = [str(ULID()) for _ in range(2)]
    for plan_id in plans:
        for n in range(3):
            engine.create(plan_id, state=f"{plan_id} {n}".encode() * 100)
    engine.config.set(RETENTION_MAX_CHECKPOINTS, 1)

    assert engine.maintenance.prune().pruned[Rule.MAX_CHECKPOINTS] == 4
    assert [engine.checkpoints.count(p) for p in plans] == [1, 1]


def test_only_plans_with_an_override_are_pruned_when_no_global_rule_is_set(engine: Engine) -> None:
    free, limited = str(ULID()), str(ULID())
    for plan_id in (free, limited):
        for n in range(3):
            engine.create(plan_id, state=f"{plan_id} {n}".encode() * 100)
    assert engine.maintenance.prune().total == 0
    engine.config.set(RETENTION_MAX_CHECKPOINTS, 1, plan_id=limited)
    engine.config.set(RETENTION_MAX_AGE_SECONDS, 0, plan_id=free)  # an override that keeps every rule off

    report = engine.maintenance.run()

    assert report.prune.total == 2
    assert (engine.checkpoints.count(free), engine.checkpoints.count(limited)) == (3, 1)
    summary = report.as_dict()
    assert summary["pruned_checkpoints"] == 2
    assert summary["pruned_by_rule"] == {"max_checkpoints_per_plan": 2, "max_age": 0, "safety_max_age": 0}
    assert summary["deleted_objects"] == report.gc.deleted_objects > 0
    assert summary["dry_run"] is False


def test_rules_are_strict_bounds() -> None:
    now = datetime(2026, 1, 1, tzinfo=UTC)
    naive_now = now.replace(tzinfo=None)

    def candidate(sequence: int, age_s: float, phase: str = "manual", naive: bool = False) -> Candidate:
        created = (naive_now if naive else now) - timedelta(seconds=age_s)
        return Candidate(f"cp{sequence}", "plan", sequence, phase, {}, created)

    newest_first = [candidate(3, 0), candidate(2, 100, naive=True), candidate(1, 100, "rollback_safety")]
    assert select_prunable(newest_first, Policy(max_age_seconds=100, safety_max_age_seconds=100), now) == []
    pruned = select_prunable(newest_first, Policy(max_age_seconds=99, safety_max_age_seconds=99), now)
    assert [(c.checkpoint_id, rule) for c, rule in pruned] == [("cp2", Rule.MAX_AGE), ("cp1", Rule.SAFETY_MAX_AGE)]
    assert select_prunable(newest_first, Policy(max_checkpoints=2), now) == []
    assert [c.checkpoint_id for c, _ in select_prunable(newest_first, Policy(max_checkpoints=1), now)] == ["cp2"]
    assert not Policy().active
    assert all(p.active for p in (Policy(max_checkpoints=1), Policy(max_age_seconds=1),
                                  Policy(safety_max_age_seconds=1)))


def test_a_maintenance_run_empties_the_sqlite_write_ahead_log(engine: Engine, tmp_path: Path) -> None:
    """docs/PERFORMANCE.md: the write-ahead log is emptied after each maintenance run, which writes much of it."""
    _two_checkpoints_then_delete_the_first(engine)
    wal = tmp_path / "meta.db-wal"
    assert wal.stat().st_size > 0

    report = engine.maintenance.run()

    assert report.gc.deleted_objects > 0
    assert wal.stat().st_size == 0


class Killed(BaseException):
    """The process dying at a fault point: nothing in the engine handles it."""


def interrupt_a_rollback(engine: Engine, monkeypatch, workspace: Path, plan_id: str,
                         edit_since: str = "") -> list[str]:
    """Three checkpoints of two files (``edit_since``: then a.txt written with it), and a rollback to
    the first killed after its first change, so that the plan's rollback is left unfinished.
    Returns the checkpoints' ids, oldest first."""
    ids = []
    for n in range(3):
        (workspace / "a.txt").write_text(f"a {n}")
        (workspace / "b.txt").write_text(f"b {n}")
        ids.append(engine.create(plan_id, workspace).checkpoint_id)
    if edit_since:
        (workspace / "a.txt").write_text(edit_since)
    calls: list[Point] = []

    def killed_after_one_change(point: Point) -> None:
        calls.append(point)
        if point is Point.RESTORE_CHANGE and len(calls) == 2:
            raise Killed

    monkeypatch.setattr(restore_module, "crash_point", killed_after_one_change)
    with pytest.raises(Killed):
        engine.checkpoints.rollback(RollbackRequest(plan_id, ids[0]))
    return ids


def test_a_plan_whose_interrupted_rollback_cannot_be_finished_keeps_every_checkpoint_that_run(
        engine: Engine, monkeypatch) -> None:
    """Pruning a plan first finishes its interrupted rollback; if that fails, the plan keeps all its
    checkpoints in this run (none of them is pruned half-way through the list), and the next run,
    once the rollback can be finished, prunes them."""
    workspace = engine.workspace()
    plan_id = str(ULID())
    ids = interrupt_a_rollback(engine, monkeypatch, workspace, plan_id)
    attempts: list[Point] = []

    def unwritable_once(point: Point) -> None:
        attempts.append(point)
        if len(attempts) == 1:
            raise OSError(5, "Input/output error")  # the first attempt to finish it fails; later ones work

    monkeypatch.setattr(restore_module, "crash_point", unwritable_once)
    engine.config.set(RETENTION_MAX_CHECKPOINTS, 1)
    regular = [c.row.checkpoint_id for c in engine.checkpoints.list(plan_id)[0] if c.row.phase != "rollback_safety"]
    assert sorted(regular) == sorted(ids)

    first = engine.maintenance.prune()

    assert attempts and first.total == 0
    assert {c.row.checkpoint_id for c in engine.checkpoints.list(plan_id)[0]} >= set(ids)
    second = engine.maintenance.prune()
    assert second.pruned[Rule.MAX_CHECKPOINTS] == 2
    assert (workspace / "a.txt").read_text() == "a 0"  # the interrupted rollback was finished first


def test_an_object_gone_between_listing_and_sizing_counts_no_bytes(engine: Engine, monkeypatch) -> None:
    """Another collector (or a compaction) may delete an object after this one listed it: it is
    deleted all the same, and reclaims no bytes here."""
    with engine.store.batch() as batch:
        digests = [batch.put_bytes(os.urandom(100)) for _ in range(3)]
    listed = engine.store.iter_digests
    vanished: list[str] = []

    def listing_then_another_deletes_one():
        yield from listed()
        if not vanished:
            vanished.append(digests[1])
            engine.store.delete(digests[1])

    monkeypatch.setattr(engine.store, "iter_digests", listing_then_another_deletes_one)
    report = engine.maintenance.collect_garbage()

    assert vanished
    assert (report.deleted_objects, report.reclaimed_bytes) == (3, 2 * 100)
    assert engine.stored() == set()


def test_a_checkpoint_deleted_by_someone_else_mid_prune_is_not_counted_and_the_rest_are_pruned(
        engine: Engine) -> None:
    plan_id = str(ULID())
    ids = [engine.create(plan_id, state=f"state {n}".encode() * 100).checkpoint_id for n in range(4)]
    engine.config.set(RETENTION_MAX_CHECKPOINTS, 1)
    deleted_meanwhile: list[str] = []

    def someone_else_deletes_the_first(checkpoint_id: str) -> None:
        if not deleted_meanwhile:
            deleted_meanwhile.append(checkpoint_id)
            engine.checkpoints.delete(checkpoint_id)  # a DeleteCheckpoint call got there first
        engine.checkpoints.delete(checkpoint_id)

    maintenance = Maintenance(engine.db, engine.store, engine.checkpoints.trees, engine.config,
                              someone_else_deletes_the_first)
    report = maintenance.prune()

    assert deleted_meanwhile
    assert report.pruned[Rule.MAX_CHECKPOINTS] == 2
    assert sorted(report.checkpoint_ids + deleted_meanwhile) == sorted(ids[:3])
    assert [c.row.checkpoint_id for c in engine.checkpoints.list(plan_id)[0]] == [ids[3]]


def test_the_maintenance_summary_says_when_it_was_a_dry_run(engine: Engine, caplog) -> None:
    _two_checkpoints_then_delete_the_first(engine)
    caplog.set_level(logging.DEBUG, logger="checkpointd.retention")

    engine.maintenance.run(dry_run=True)
    dry = [r.getMessage() for r in caplog.records if r.getMessage().startswith("maintenance:")]
    caplog.clear()
    engine.maintenance.run()
    real = [r.getMessage() for r in caplog.records if r.getMessage().startswith("maintenance:")]

    assert len(dry) == 1 and dry[0].endswith(" (dry run)")
    assert len(real) == 1 and "dry run" not in real[0] and "deleted 0 object(s)" not in real[0]


def test_a_candidate_referenced_again_during_gc_keeps_only_itself(engine: Engine, monkeypatch) -> None:
    """Objects a checkpoint committed during the collection references are kept; every other
    unreferenced object listed with them still goes."""
    workspace = engine.workspace()
    for n in range(4):
        (workspace / f"f{n}.txt").write_text(f"referenced again by a checkpoint made during the GC {n}")
    plan_id = str(ULID())
    engine.checkpoints.delete(engine.create(plan_id, workspace).checkpoint_id)
    with engine.store.batch() as batch:
        garbage = {batch.put_bytes(os.urandom(100)) for _ in range(60)}
    made: list = []

    def checkpoint_meanwhile(point: Point) -> None:
        if point is Point.GC_LISTED:
            made.append(engine.create(plan_id, workspace))

    monkeypatch.setattr(retention_module, "crash_point", checkpoint_meanwhile)
    report = engine.maintenance.collect_garbage()

    assert made and report.deleted_objects == len(garbage)
    assert not garbage & engine.stored()
    assert engine.referenced_by(made[0]) <= engine.stored()
