"""Maintenance and recovery under attack: garbage collection, retention, compaction, fsck and
checkpoint deletion raced (deterministically, through the engine's own hook points) against
checkpoints, rollbacks, diffs and reads, and run on damaged stores.

Every race here is made deterministic: a monkeypatched fault point (``gc.listed``,
``restore.change``) or a wrapped engine step runs the competing operation at exactly the moment
under attack. No test sleeps to provoke a race.
"""

from __future__ import annotations

import contextlib
import os
import random
import threading
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from pathlib import Path

import grpc
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from ulid import ULID

from checkpoint.v1 import checkpoint_service_pb2 as pb
from checkpoint.v1 import checkpoint_service_pb2_grpc as pb_grpc
from checkpointd.core.config.registry import (
    RETENTION_MAX_AGE_SECONDS,
    RETENTION_MAX_CHECKPOINTS,
    RETENTION_SAFETY_MAX_AGE_SECONDS,
)
from checkpointd.core.engine.requests import RollbackRequest
from checkpointd.core.kernel.errors import DataLoss, NotFound
from checkpointd.core.kernel.faults import Point
from checkpointd.core.maintenance import retention as retention_module
from checkpointd.core.maintenance.fsck import CannotCheck, FindingKind, check, check_data_dir
from checkpointd.core.maintenance.retention import (
    Candidate,
    GcAborted,
    Policy,
    Rule,
    select_prunable,
)
from checkpointd.core.store import content_store as content_store_module
from checkpointd.core.store.content_store import ContentStore
from checkpointd.core.store.packs import DELTA_HEADER, DELTAS
from checkpointd.core.workspace.readworker import RECORD
from tests.helpers import tree_state
from tests.ops.conftest import run_cli, wait_until
from tests.ops.test_maintenance_engine import Engine as MaintenanceEngine
from tests.ops.test_maintenance_engine import interrupt_a_rollback


class Engine(MaintenanceEngine):
    """An engine laid out as a server's data directory (``checkpointd.db`` and ``store/`` under
    one root), so that the offline fsck can check it once it is closed."""

    def __init__(self, root: Path, store_kind: str) -> None:
        super().__init__(root, store_kind, db_name="checkpointd.db", engine_data="engine-data")
        self.closed = False

    def ids(self, plan_id: str) -> list[str]:
        return [c.row.checkpoint_id for c in self.checkpoints.list(plan_id)[0]]

    def close(self) -> None:
        if not self.closed:
            self.closed = True
            super().close()


@pytest.fixture(params=["disk", "db"])
def engine(request, tmp_path: Path) -> Iterator[Engine]:
    engine = Engine(tmp_path, request.param)
    try:
        yield engine
    finally:
        engine.close()


@pytest.fixture
def disk_engine(tmp_path: Path) -> Iterator[Engine]:
    engine = Engine(tmp_path, "disk")
    try:
        yield engine
    finally:
        engine.close()


def _fsck_problems(engine: Engine) -> list:
    return check(engine.db, engine.store).problems


# -- found by attack, mended ------------------------------------------------------------------


def test_a_checkpoint_deleted_and_collected_while_its_state_is_read_is_not_found(engine: Engine,
                                                                                 monkeypatch) -> None:
    plan_id = str(ULID())
    engine.create(plan_id, state=b"an older checkpoint of the plan")
    doomed = engine.create(plan_id, state=os.urandom(3000))
    read_state = engine.checkpoints.parts.state

    def deleted_and_collected_first(row):
        engine.checkpoints.delete(row.checkpoint_id)
        assert engine.maintenance.collect_garbage().deleted_objects >= 1
        return read_state(row)

    monkeypatch.setattr(engine.checkpoints.parts, "state", deleted_and_collected_first)
    with pytest.raises(NotFound):
        engine.checkpoints.get(doomed.checkpoint_id, with_state=True)


@pytest.mark.parametrize("against", ["checkpoint", "live"])
def test_a_diff_whose_checkpoint_is_deleted_and_collected_midway_is_not_found(engine: Engine, monkeypatch,
                                                                              against: str) -> None:
    workspace = engine.workspace()
    (workspace / "sub").mkdir()
    (workspace / "sub" / "f.txt").write_text("first")
    plan_id = str(ULID())
    first = engine.create(plan_id, workspace)
    (workspace / "sub" / "f.txt").write_text("second")
    (workspace / "new.txt").write_text("new")
    second = engine.create(plan_id, workspace)
    (workspace / "sub" / "f.txt").write_text("third, not in any checkpoint")
    doomed = second if against == "checkpoint" else first
    trees = engine.checkpoints.trees
    fired: list[bool] = []

    def delete_and_collect() -> None:
        fired.append(True)
        engine.checkpoints.delete(doomed.checkpoint_id)
        assert engine.maintenance.collect_garbage().deleted_objects >= 1
        with trees._cache_lock:
            trees._cache.clear()  # long evicted on a busy server

    if against == "checkpoint":
        real_diff = trees.diff

        def collected_before_the_walk(base, target, *args, **kwargs):
            if not fired:
                delete_and_collect()
            return real_diff(base, target, *args, **kwargs)

        monkeypatch.setattr(trees, "diff", collected_before_the_walk)
        call = lambda: engine.checkpoints.diff(first.checkpoint_id, second.checkpoint_id)  # noqa: E731
    else:
        diffs = engine.checkpoints._diffs
        real_live = diffs._diff_live

        def collected_before_the_fence(base, plan, *args):
            delete_and_collect()
            return real_live(base, plan, *args)

        monkeypatch.setattr(diffs, "_diff_live", collected_before_the_fence)
        call = lambda: engine.checkpoints.diff(first.checkpoint_id)  # noqa: E731
    with pytest.raises(NotFound):
        call()
    assert fired


def test_gc_of_a_store_with_one_damaged_delta_is_reported_not_stuck(disk_engine: Engine) -> None:
    engine, store = disk_engine, disk_engine.store
    old = random.Random(1).randbytes(20_000)
    new = old[:10_000] + b"an edit" + old[10_000:]
    with store.batch() as batch:
        base = batch.put_bytes(old)
    with store.batch() as batch:
        dependent = batch.put_bytes(new, similar=base)
    location = store._committed[dependent]
    assert location.kind in DELTAS and location.base == base
    plan_id = str(ULID())
    kept = engine.create(plan_id, state=new)  # references the delta only; its base is garbage
    workspace = engine.workspace()
    (workspace / "intact.txt").write_text("intact content")
    intact = engine.create(str(ULID()), workspace)
    # The disk flips a byte in the middle of the delta's body.
    at = location.offset + DELTA_HEADER.size + (location.length - DELTA_HEADER.size) // 2
    with open(location.pack.path, "r+b") as pack:
        pack.seek(at)
        byte = pack.read(1)
        pack.seek(at)
        pack.write(bytes([byte[0] ^ 0xFF]))
    with pytest.raises(DataLoss):
        store.read_bytes(dependent)

    with contextlib.suppress(GcAborted):  # reported, like a missing tree node: acceptable
        engine.maintenance.collect_garbage()

    assert engine.checkpoints.get(intact.checkpoint_id).row.tree_digest
    for digest in engine.referenced_by(intact):
        store.read_bytes(digest)
    assert kept.state_digest == dependent


@pytest.mark.parametrize("damage", ["magic", "empty"])
def test_fsck_reports_a_pack_with_a_damaged_header_and_checks_the_rest(tmp_path: Path, monkeypatch,
                                                                       damage: str) -> None:
    engine = Engine(tmp_path, "disk")
    try:
        plan_id = str(ULID())
        engine.create(plan_id, state=os.urandom(5000))  # pack 1
        monkeypatch.setattr(content_store_module, "PACK_ROTATE_BYTES", 1)
        with engine.store.batch() as batch:
            batch.put_bytes(b"x" * 100)  # rotates: pack 1 is closed for appends
        monkeypatch.undo()
        intact = engine.create(plan_id, state=os.urandom(5000))
    finally:
        engine.close()
    packs = sorted((tmp_path / "store" / "packs").glob("pack-*.pack"))
    assert len(packs) >= 2
    if damage == "magic":
        with open(packs[0], "r+b") as pack:
            pack.write(b"\0" * 8)
    else:
        packs[0].write_bytes(b"")

    try:
        report = check_data_dir(tmp_path)
    except CannotCheck:
        return  # a clean refusal (exit status 2) is a report too
    except DataLoss as crash:
        pytest.fail(f"fsck crashed instead of reporting: {crash!r}")
    assert any(p.kind is FindingKind.DAMAGED_STORE and packs[0].name in p.subject for p in report.problems), \
        report.to_json()
    assert intact.state_digest not in {p.subject for p in report.problems}


@pytest.mark.parametrize("step", ["fsck", "start"])
def test_a_legacy_journal_file_that_is_not_an_object_is_reported_and_dropped(tmp_path: Path, step: str) -> None:
    engine = Engine(tmp_path, "disk")
    plan_id = str(ULID())
    kept = engine.create(plan_id, state=b"an acknowledged state")
    engine.close()
    legacy = (tmp_path if step == "fsck" else tmp_path / "engine-data") / "rollback-journal"
    legacy.mkdir(parents=True, exist_ok=True)
    (legacy / f"{plan_id}.json").write_text("null")
    if step == "fsck":
        report = check_data_dir(tmp_path)
        assert [p.kind for p in report.problems] == [FindingKind.UNREADABLE_JOURNAL]
        return
    engine = Engine(tmp_path, "disk")  # a server starting on the data directory
    try:
        assert engine.checkpoints.get(kept.checkpoint_id, with_state=True).state == b"an acknowledged state"
        assert not (legacy / f"{plan_id}.json").exists()
    finally:
        engine.close()


def test_offline_gc_beside_a_server_on_the_same_sqlite_database_store_loses_nothing(ops_server,
                                                                                    tmp_path: Path) -> None:
    handshake = tmp_path / "faults"
    handshake.mkdir()
    server = ops_server("--store", "db", env={"CHECKPOINTD_PAUSE_AT": "create.captured:2",
                                              "CHECKPOINTD_FAULT_DIR": str(handshake)})
    if server.db_url:
        pytest.skip("SQLite only: on PostgreSQL the replicas' advisory locks fence the collection")
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    state = os.urandom(3000)
    plan_id = str(ULID())
    with grpc.insecure_channel(server.tcp_target) as channel:
        stub = pb_grpc.CheckpointServiceStub(channel)
        first = stub.CreateCheckpoint(pb.CreateCheckpointRequest(plan_id=plan_id, state=state), timeout=30).checkpoint
        stub.DeleteCheckpoint(pb.DeleteCheckpointRequest(checkpoint_id=first.checkpoint_id), timeout=30)
        # The same state again: the capture finds it stored and reuses it; paused before its row.
        pending = stub.CreateCheckpoint.future(pb.CreateCheckpointRequest(plan_id=plan_id, state=state), timeout=90)
        wait_until(lambda: (handshake / "paused.create.captured").exists(), "the create to pause before its row")
        gc = run_cli("gc", "--data-dir", str(elsewhere), "--db-url", f"sqlite:///{server.data_dir / 'checkpointd.db'}",
                     "--store", "db", "--json")
        (handshake / "resume.create.captured").touch()
        second = pending.result().checkpoint  # acknowledged
        try:
            full = stub.GetCheckpoint(pb.GetCheckpointRequest(checkpoint_id=second.checkpoint_id,
                                                              view=pb.CHECKPOINT_VIEW_FULL), timeout=30).checkpoint
        except grpc.RpcError as error:
            pytest.fail(f"an acknowledged checkpoint lost its state to `checkpointd gc` (exit {gc.returncode}, "
                        f"{gc.stdout.strip()}): {error.code()} {error.details()}")
    assert full.state == state


# -- edges that held (guards) ----------------------------------------------------------------


def test_a_rollback_safety_checkpoint_made_between_listing_and_deleting_keeps_what_it_reuses(
        engine: Engine, monkeypatch) -> None:
    """The rollback's safety capture finds a listed candidate (the workspace is back to a deleted
    checkpoint's content: its file and its very root node) stored, and reuses it; the collection's
    second mark, under the fence, must keep it, so that the safety checkpoint restores exactly."""
    workspace = engine.workspace()
    (workspace / "d").mkdir()
    content = random.Random(7).randbytes(20_000)
    (workspace / "d" / "f.bin").write_bytes(content)
    (workspace / "keep.txt").write_text("unchanged")
    plan_id = str(ULID())
    gone = engine.create(plan_id, workspace)
    (workspace / "d" / "f.bin").write_bytes(b"another version")
    target = engine.create(plan_id, workspace)
    engine.checkpoints.delete(gone.checkpoint_id)
    (workspace / "d" / "f.bin").write_bytes(content)  # the workspace is the deleted checkpoint's again
    before = tree_state(workspace)
    made: list = []

    def rollback_meanwhile(point: Point) -> None:
        if point is Point.GC_LISTED and not made:
            made.append(engine.checkpoints.rollback(RollbackRequest(plan_id, target.checkpoint_id)).safety.row)

    monkeypatch.setattr(retention_module, "crash_point", rollback_meanwhile)
    engine.maintenance.collect_garbage()
    monkeypatch.undo()

    safety = made[0]
    assert safety.tree_digest == gone.tree_digest, "the safety capture reused the listed root node"
    stored = set(engine.store.iter_digests())
    assert engine.referenced_by(safety) <= stored
    assert not _fsck_problems(engine)
    engine.checkpoints.rollback(RollbackRequest(plan_id, safety.checkpoint_id))
    assert tree_state(workspace) == before


def test_a_checkpoint_deleted_while_a_rollback_to_it_runs_waits_for_the_rollback(disk_engine: Engine,
                                                                               monkeypatch) -> None:
    """DeleteCheckpoint of the target (and a collection right after it) while the rollback is
    writing the workspace: the deletion waits for the plan, the rollback restores the target exactly,
    and only then is the target deleted and its content collected."""
    from checkpointd.core.restore import restorer as restorer_module

    engine = disk_engine
    workspace = engine.workspace()
    for n in range(3):
        (workspace / f"f{n}.txt").write_text(f"target version {n}")
    plan_id = str(ULID())
    target = engine.create(plan_id, workspace)
    expected = tree_state(workspace)
    for n in range(3):
        (workspace / f"f{n}.txt").write_text(f"newer version {n}")
    engine.create(plan_id, workspace)
    outcome: dict[str, object] = {}

    def delete_the_target() -> None:
        try:
            engine.checkpoints.delete(target.checkpoint_id)
            outcome["deleted"] = True
        except Exception as exc:  # noqa: BLE001 - reported by the assertions below
            outcome["error"] = exc

    deleter = threading.Thread(target=delete_the_target)
    blocked: list[bool] = []

    def mid_rollback(point: Point) -> None:
        if point is Point.RESTORE_CHANGE and not blocked:
            deleter.start()
            deleter.join(timeout=0.5)
            blocked.append(deleter.is_alive())

    monkeypatch.setattr(restorer_module, "crash_point", mid_rollback)
    engine.checkpoints.rollback(RollbackRequest(plan_id, target.checkpoint_id))
    monkeypatch.undo()
    deleter.join(timeout=30)

    assert blocked == [True], "the deletion did not wait for the rollback to its checkpoint"
    assert outcome == {"deleted": True}
    assert tree_state(workspace) == expected
    engine.maintenance.collect_garbage()
    assert not _fsck_problems(engine)


def test_an_unfinishable_rollback_keeps_its_safety_and_target_checkpoints_past_every_age_rule(
        disk_engine: Engine, monkeypatch) -> None:
    """Retention with every rule at its tightest, while the plan's interrupted rollback cannot be
    finished: its safety checkpoint (the only record of the workspace before it) and its target
    stay, and so does what they reference; once it can be finished, they follow the rules."""
    from checkpointd.core.restore import restorer as restorer_module

    engine = disk_engine
    workspace = engine.workspace()
    plan_id = str(ULID())
    interrupt_a_rollback(engine, monkeypatch, workspace, plan_id, edit_since="work since the last checkpoint")
    entry = engine.checkpoints.journal.get(plan_id)
    assert entry is not None

    def always_unwritable(point: Point) -> None:
        raise OSError(5, "Input/output error")

    monkeypatch.setattr(restorer_module, "crash_point", always_unwritable)
    engine.config.set(RETENTION_MAX_CHECKPOINTS, 1)
    engine.config.set(RETENTION_MAX_AGE_SECONDS, 1)
    engine.config.set(RETENTION_SAFETY_MAX_AGE_SECONDS, 1)
    later = datetime.now(UTC) + timedelta(days=1)

    report = engine.maintenance.prune(now=later)
    gc = engine.maintenance.collect_garbage()

    assert report.total == 0
    remaining = set(engine.ids(plan_id))
    assert {entry.safety_checkpoint_id, entry.target_checkpoint_id} <= remaining
    safety = engine.checkpoints.get(entry.safety_checkpoint_id).row
    assert engine.referenced_by(safety) <= set(engine.store.iter_digests())
    assert gc.deleted_objects >= 0 and not _fsck_problems(engine)
    monkeypatch.undo()
    engine.maintenance.prune(now=later)
    assert engine.checkpoints.journal.get(plan_id) is None
    assert (workspace / "a.txt").read_text() == "a 0"


def test_repeated_failures_to_finish_a_rollback_record_the_workspace_once(
        disk_engine: Engine, monkeypatch) -> None:
    """Each attempt to finish an interrupted rollback that fails records the workspace first if no
    checkpoint of this rollback holds it yet; a workspace unchanged since the last attempt is not
    recorded again (one more safety checkpoint per failed attempt would pile up without end)."""
    from checkpointd.core.restore import restorer as restorer_module

    engine = disk_engine
    workspace = engine.workspace()
    plan_id = str(ULID())
    interrupt_a_rollback(engine, monkeypatch, workspace, plan_id)

    def always_unwritable(point: Point) -> None:
        raise OSError(5, "Input/output error")

    def safety_ids() -> list[str]:
        return [c.row.checkpoint_id for c in engine.checkpoints.list(plan_id)[0]
                if c.row.phase == "rollback_safety"]

    before = safety_ids()
    monkeypatch.setattr(restorer_module, "crash_point", always_unwritable)
    for _ in range(4):
        assert engine.checkpoints.recovery.recover_interrupted_rollbacks() == [plan_id]
    after_failures = safety_ids()
    (workspace / "b.txt").write_text("written between two attempts")
    assert engine.checkpoints.recovery.recover_interrupted_rollbacks() == [plan_id]
    after_an_edit = safety_ids()
    monkeypatch.undo()
    assert engine.checkpoints.recovery.recover_interrupted_rollbacks() == []

    assert len(after_failures) == len(before) + 1  # the half-rolled-back workspace, once
    assert len(after_an_edit) == len(after_failures) + 1  # then each change, once
    assert len(safety_ids()) == len(after_an_edit)
    assert (workspace / "a.txt").read_text() == "a 0"
    assert (workspace / "b.txt").read_text() == "b 0"  # the edit is in the last safety checkpoint


def test_compaction_leaves_a_damaged_pack_in_place_and_loses_nothing_intact(tmp_path: Path, monkeypatch) -> None:
    """`gc --compact` on a store whose closed pack has a damaged record header in its durable part:
    the pack is not compacted away (its unindexed records are the only copy), what is indexed stays
    readable through the compaction and a reopen, and repairing the byte brings the rest back."""
    root = tmp_path / "store"
    store = ContentStore(root)
    blobs = [random.Random(n).randbytes(3000) for n in range(5)]
    with store.batch() as batch:
        digests = [batch.put_bytes(blob) for blob in blobs]
    monkeypatch.setattr(content_store_module, "PACK_ROTATE_BYTES", 1)
    with store.batch() as batch:
        other = batch.put_bytes(b"in the next pack" * 10)
    monkeypatch.undo()
    first = store._committed[digests[0]].pack
    assert all(store._committed[d].pack is first for d in digests) and store._active is not first
    damaged_record = store._committed[digests[3]]
    kind_at = damaged_record.offset - RECORD.size + 32
    store.close()
    pack_path = root / "packs" / first.path.name
    content = pack_path.read_bytes()
    assert int.from_bytes(content[8:16], "big") == len(content), "the whole pack must be known durable"
    with open(pack_path, "r+b") as pack:
        pack.seek(kind_at)
        pack.write(b"?")

    store = ContentStore(root)
    try:
        assert store.has(digests[2]) and not store.has(digests[3])
        for doomed in digests[:2]:
            store.delete(doomed)  # most of the indexed part is dead now
        with store.collecting():
            store.compact_all()
        assert pack_path.stat().st_size == len(content), "the damaged pack was compacted away"
        assert store.read_bytes(digests[2]) == blobs[2]
        assert store.read_bytes(other) == b"in the next pack" * 10
        assert any(pack_path.name in subject for subject, _ in store.damage())
    finally:
        store.close()
    store = ContentStore(root)
    try:
        assert store.read_bytes(digests[2]) == blobs[2]
    finally:
        store.close()
    with open(pack_path, "r+b") as pack:
        pack.seek(kind_at)
        pack.write(bytes([content[kind_at]]))
    store = ContentStore(root)
    try:
        assert [store.read_bytes(d) for d in digests[2:]] == blobs[2:]
        assert not store.has(digests[0]) and not store.has(digests[1]), "a deletion came back"
    finally:
        store.close()


_NOW = datetime(2026, 6, 1, tzinfo=UTC)


@st.composite
def _plans(draw):
    count = draw(st.integers(min_value=0, max_value=12))
    candidates = []
    for sequence in range(count, 0, -1):  # newest first
        candidates.append(Candidate(
            checkpoint_id=f"c{sequence}", plan_id="p", sequence=sequence,
            phase=draw(st.sampled_from(["manual", "rollback_safety"])),
            labels={"pinned": "true"} if draw(st.booleans()) and draw(st.booleans()) else {},
            create_time=_NOW - timedelta(seconds=draw(st.integers(min_value=0, max_value=1000)))))
    policy = Policy(draw(st.integers(min_value=0, max_value=4)), draw(st.sampled_from([0, 10, 500])),
                    draw(st.sampled_from([0, 10, 500])))
    return candidates, policy


@settings(max_examples=30, deadline=None, derandomize=True)
@given(_plans())
def test_retention_selection_never_prunes_what_it_must_keep(plan) -> None:
    """Pinned checkpoints are never pruned; safety checkpoints only by their own age rule; the
    plan's newest regular checkpoint never; the count rule keeps exactly the newest N unpinned."""
    candidates, policy = plan
    doomed = select_prunable(candidates, policy, _NOW)
    doomed_ids = {candidate.checkpoint_id for candidate, _rule in doomed}
    regular = [c for c in candidates if not c.safety]
    for candidate, rule in doomed:
        assert not candidate.pinned
        age = (_NOW - candidate.create_time).total_seconds()
        if candidate.safety:
            assert rule is Rule.SAFETY_MAX_AGE
            assert policy.safety_max_age_seconds and age > policy.safety_max_age_seconds
        else:
            assert rule in (Rule.MAX_CHECKPOINTS, Rule.MAX_AGE)
            if rule is Rule.MAX_AGE:
                assert age > policy.max_age_seconds > 0
    if regular:
        assert regular[0].checkpoint_id not in doomed_ids, "the plan's newest regular checkpoint was pruned"
    if policy.max_checkpoints:
        unpinned = [c.checkpoint_id for c in regular if not c.pinned]
        kept = [c for c in unpinned if c not in doomed_ids]
        assert len(kept) <= policy.max_checkpoints
        if not policy.max_age_seconds:
            assert kept == unpinned[:policy.max_checkpoints]
    if not policy.active:
        assert not doomed
