"""Replicas on one PostgreSQL database with the database content store (--store db), attacked.

Races are made deterministic through the engine's own fault points (``crash_point``,
monkeypatched in-process as tests/ops/test_maintenance_attacked.py does) on two in-process
engines that share one PostgreSQL database exactly as two ``checkpointd serve --store db``
replicas do (each its own ``Database``, ``DatabaseStore``, staging and data dir). Attacked:

- the cross-replica fences (the content store's GC fence and the per-plan lock), which are
  PostgreSQL *session* advisory locks: what happens when the session that holds one is ended
  by the database (a restart of a pooler, an administrator, ``idle_session_timeout``) while
  the replica still believes it holds it;
- garbage collection on one replica while another reuses (deduplicates) content;
- retention/DeleteCheckpoint on one replica against a rollback on the other;
- the same request_id sent for a Rollback to both replicas at once.
"""

from __future__ import annotations

import hashlib
import threading
import uuid

import pytest
from ulid import ULID

from checkpointd.core.engine import create as create_module
from checkpointd.core.engine.requests import RollbackRequest
from checkpointd.core.kernel.errors import Reason, Unavailable
from checkpointd.core.kernel.faults import Point
from checkpointd.core.maintenance import retention as retention_module
from checkpointd.core.maintenance.retention import GcAborted
from checkpointd.core.restore import restorer as restorer_module
from checkpointd.core.workspace import workspace as workspace_module
from tests.helpers import tree_state
from tests.postgres.replica_pair import Replica, end_session, fence_pid, holders, stored_garbage, workspace_in

pytestmark = pytest.mark.postgres


# -- the GC fence's session is lost while a create reuses content --------------------------------


def test_a_create_whose_gc_fence_session_was_lost_is_refused_and_its_retry_keeps_its_content(
        pair, admin, monkeypatch):
    """The replica GC fence is a session advisory lock: the database ends its session while a create
    sits between its objects (reused content, its state) and its row, and the other replica
    collects, deleting them. The create is not acknowledged (UNAVAILABLE / LOCK_LOST, nothing
    recorded: its commit confirms the fence under the fence's lock and finds the GC epoch moved),
    and its retry stores everything again: every object the acknowledged checkpoint references is
    readable through both replicas."""
    first, second, workspaces = pair
    workspace, shared = stored_garbage(first, second, workspaces)
    new_plan = str(ULID())

    collected: list[object] = []

    def at(point: Point) -> None:
        if point is Point.CREATE_CAPTURED and not collected:
            # The create reused the stored content (dedup) and holds the fence; the database
            # ends the fence's session; the other replica collects.
            pid = fence_pid(first)
            assert pid in holders(admin, "content-store-gc")
            end_session(admin, pid)
            collected.append(second.maintenance.collect_garbage())

    monkeypatch.setattr(create_module, "crash_point", at)
    with pytest.raises(Unavailable) as refused:
        first.create(new_plan, workspace, state=b"new state")
    assert collected and collected[0].deleted_objects > 0, "the collection ran and deleted while the create waited"
    assert refused.value.reason is Reason.LOCK_LOST
    assert second.checkpoints.list(new_plan)[0] == []  # nothing recorded

    acknowledged = first.create(new_plan, workspace, state=b"new state")  # the retry

    wanted = {"its state": acknowledged.state_digest, "its tree": acknowledged.tree_digest,
              "shared.txt (reused)": hashlib.sha256(shared).hexdigest()}
    assert sorted(name for name, digest in wanted.items() if not second.store.has(digest)) == []
    for replica in (first, second):
        got = replica.checkpoints.get(acknowledged.checkpoint_id, with_state=True)
        assert got.state == b"new state"
        for _path, entry in replica.checkpoints.trees.flatten(acknowledged.tree_digest):
            assert replica.store.read_bytes(entry.digest) == shared


def test_a_collection_whose_lock_session_was_lost_deletes_nothing_another_replica_references_since(
        pair, admin, monkeypatch):
    """The collection's exclusive fence is a session advisory lock too: the database ends its
    session after the collection marked (under it) and before it deletes; replica A then takes the
    fence and commits a checkpoint that reuses the marked content. The collection deletes nothing
    more (its deletions run on the lock's own session, which can commit nothing now): A's
    acknowledged checkpoint stays whole, and the next collection deletes only garbage."""
    first, second, workspaces = pair
    workspace, shared = stored_garbage(first, second, workspaces)
    acknowledged = []
    delete = second.store.delete

    def delete_after_the_lock_session_ended(digest: str) -> None:
        if not acknowledged:
            end_session(admin, second.store._collector_lock.holder.pid)
            acknowledged.append(first.create(str(ULID()), workspace, state=b"new state"))
        delete(digest)

    monkeypatch.setattr(second.store, "delete", delete_after_the_lock_session_ended)
    with pytest.raises(GcAborted, match="on the session holding the collection's lock failed"):
        second.maintenance.collect_garbage()
    monkeypatch.undo()

    (checkpoint,) = acknowledged
    for replica in (first, second):
        assert replica.checkpoints.get(checkpoint.checkpoint_id, with_state=True).state == b"new state"
        for _path, entry in replica.checkpoints.trees.flatten(checkpoint.tree_digest):
            assert replica.store.read_bytes(entry.digest) == shared
    assert second.maintenance.collect_garbage().deleted_objects == 1  # the deleted checkpoint's state
    assert first.checkpoints.get(checkpoint.checkpoint_id, with_state=True).state == b"new state"


def test_a_collection_listed_before_a_create_reused_its_content_keeps_that_content(pair, monkeypatch):
    """The fence holding: replica B's collection lists the (then unreferenced) content; replica A's
    create reuses it and commits its row while the collection waits for the fence; the collection,
    marking again under the fence, keeps everything the acknowledged checkpoint references."""
    first, second, workspaces = pair
    workspace, shared = stored_garbage(first, second, workspaces)

    listed = threading.Event()
    reports: list[object] = []
    errors: list[BaseException] = []

    def gc_at(point: Point) -> None:
        if point is Point.GC_LISTED:
            listed.set()

    def collect() -> None:
        try:
            reports.append(second.maintenance.collect_garbage())
        except BaseException as exc:  # reported below
            errors.append(exc)

    collector = threading.Thread(target=collect)

    def create_at(point: Point) -> None:
        if point is Point.CREATE_CAPTURED and not collector.is_alive() and not listed.is_set():
            collector.start()
            assert listed.wait(30), "the collection never listed its candidates"

    monkeypatch.setattr(retention_module, "crash_point", gc_at)
    monkeypatch.setattr(create_module, "crash_point", create_at)
    acknowledged = first.create(str(ULID()), workspace, state=b"new state")
    collector.join(60)
    assert errors == [] and len(reports) == 1
    assert reports[0].deleted_objects == 1  # only the deleted checkpoint's own state went
    for replica in (first, second):
        assert replica.checkpoints.get(acknowledged.checkpoint_id, with_state=True).state == b"new state"
        for _path, entry in replica.checkpoints.trees.flatten(acknowledged.tree_digest):
            assert replica.store.read_bytes(entry.digest) == shared


# -- the plan lock's session is lost while a create captures -------------------------------------

FILES = 10


def test_a_checkpoint_never_records_a_half_restored_workspace_when_the_plan_locks_session_is_lost(
        pair, admin, monkeypatch):
    """The plan's lock across replicas is a session advisory lock: the database ends its session
    while replica A captures the plan, and replica B rolls the plan back meanwhile, half-way while
    A still reads. A's checkpoint is not acknowledged (UNAVAILABLE / LOCK_LOST, nothing recorded:
    its commit finds the lock no longer held by the session that took it); its retry records the
    rolled-back workspace."""
    first, second, workspaces = pair
    workspace = workspace_in(workspaces)
    plan_id = str(ULID())

    def write_all(version: str) -> None:
        for i in range(FILES):
            (workspace / f"f{i}.txt").write_text(f"{version} of file {i}\n")

    (workspace / ".gitignore").write_text("*.tmp\n")  # read (WORKSPACE_READ) as a capture starts
    write_all("v1")
    target = first.create(plan_id, workspace)
    checkpointed = tree_state(workspace)
    write_all("v2")
    before = tree_state(workspace)

    half_applied, finish_rollback = threading.Event(), threading.Event()
    rollback_errors: list[BaseException] = []
    state = {"capturing": None, "rolling_back": None, "changes": 0}

    def roll_back() -> None:
        state["rolling_back"] = threading.get_ident()
        try:
            second.checkpoints.rollback(RollbackRequest(plan_id=plan_id, checkpoint_id=target.checkpoint_id))
        except BaseException as exc:  # reported below
            rollback_errors.append(exc)
        finally:
            half_applied.set()

    rollback_thread = threading.Thread(target=roll_back)

    def at(point: Point) -> None:
        me = threading.get_ident()
        if point is Point.WORKSPACE_READ and me == state["capturing"] and not rollback_thread.is_alive() \
                and not half_applied.is_set():
            # The create holds the plan (its lock, capture to commit) and starts capturing; the
            # database ends the plan lock's session; the other replica rolls the plan back.
            (pid,) = holders(admin, f"plan:{plan_id}")
            end_session(admin, pid)
            rollback_thread.start()
            assert half_applied.wait(30), "the rollback never got the plan"
        elif point is Point.RESTORE_CHANGE and me == state["rolling_back"]:
            state["changes"] += 1
            if state["changes"] == FILES // 2 + 1:
                half_applied.set()
                finish_rollback.wait(30)

    monkeypatch.setattr(workspace_module, "crash_point", at)
    monkeypatch.setattr(restorer_module, "crash_point", at)
    state["capturing"] = threading.get_ident()
    try:
        with pytest.raises(Unavailable) as refused:
            first.create(plan_id, workspace)
    finally:
        finish_rollback.set()
        if rollback_thread.is_alive():
            rollback_thread.join(60)
    assert rollback_errors == []
    assert state["changes"] > FILES // 2, "the rollback was half-way while the capture read"
    assert refused.value.reason is Reason.LOCK_LOST
    assert tree_state(workspace) == checkpointed
    recorded = [c.row for c in second.checkpoints.list(plan_id)[0]]
    assert len(recorded) == 2 and sum(c.phase == "rollback_safety" for c in recorded) == 1, recorded  # none of A's

    monkeypatch.undo()
    taken = first.create(plan_id, workspace)  # the retry
    assert first.checkpoints.diff(target.checkpoint_id, taken.checkpoint_id) == []
    assert before != checkpointed


def test_a_rollback_whose_plan_locks_session_is_lost_stops_and_is_finished_once_by_the_other_replica(
        pair, admin, monkeypatch):
    """Replica A's rollback loses its plan lock's session part-way: it stops before its next change
    (UNAVAILABLE / LOCK_LOST; nothing undone, its journal entry left), so it never writes beside the
    replica that takes the plan next, which finishes the rollback first: the workspace is the
    target's, and the files A had not reached are written once, by B."""
    first, second, workspaces = pair
    workspace = workspace_in(workspaces)
    plan_id = str(ULID())
    for i in range(FILES):
        (workspace / f"f{i}.txt").write_text(f"v1 of file {i}\n")
    target = first.create(plan_id, workspace)
    checkpointed = tree_state(workspace)
    for i in range(FILES):
        (workspace / f"f{i}.txt").write_text(f"v2 of file {i}\n")
    changes = {"before": 0, "after": 0}

    def at(point: Point) -> None:
        if point is Point.RESTORE_CHANGE:
            if changes["before"] == 3:
                end_session(admin, *holders(admin, f"plan:{plan_id}"))
                changes["after"] += 1
            else:
                changes["before"] += 1

    monkeypatch.setattr(restorer_module, "crash_point", at)
    with pytest.raises(Unavailable) as stopped:
        first.checkpoints.rollback(RollbackRequest(plan_id=plan_id, checkpoint_id=target.checkpoint_id))
    monkeypatch.undo()
    assert stopped.value.reason is Reason.LOCK_LOST
    assert changes["after"] <= 1, "the rollback went on writing after its plan lock's session ended"
    assert first.checkpoints.journal.get(plan_id) is not None, "its journal entry is left to be finished"

    taken = second.create(plan_id, workspace)  # finishes the rollback first

    assert tree_state(workspace) == checkpointed
    assert second.checkpoints.diff(target.checkpoint_id, taken.checkpoint_id) == []
    assert second.checkpoints.journal.get(plan_id) is None


# -- what held: retention/delete against a rollback, one request_id for a rollback on both -------


def test_the_target_deleted_and_collected_through_one_replica_mid_rollback_on_the_other_is_restored_whole(
        pair, monkeypatch):
    """Replica A rolls back to a checkpoint; half-way through applying it, replica B is asked to
    delete that checkpoint and collect garbage. The delete waits for A's rollback (the plan's lock);
    the rollback completes with the target's content, and its safety checkpoint stays readable."""
    first, second, workspaces = pair
    workspace = workspace_in(workspaces)
    plan_id = str(ULID())
    for i in range(FILES):
        (workspace / f"f{i}.txt").write_bytes(f"v1 of file {i}\n".encode() * 100)
    target = first.create(plan_id, workspace)
    checkpointed = tree_state(workspace)
    for i in range(FILES):
        (workspace / f"f{i}.txt").write_bytes(f"v2 of file {i}\n".encode() * 100)
    before = tree_state(workspace)

    deleted, outcome = threading.Event(), {}

    def delete_and_collect() -> None:
        try:
            second.checkpoints.delete(target.checkpoint_id)
            deleted.set()
            outcome["gc"] = second.maintenance.collect_garbage()
        except BaseException as exc:  # reported below
            outcome["error"] = exc

    deleter = threading.Thread(target=delete_and_collect)
    rolling_back = threading.get_ident()
    count = {"changes": 0}

    def at(point: Point) -> None:
        if point is Point.RESTORE_CHANGE and threading.get_ident() == rolling_back:
            count["changes"] += 1
            if count["changes"] == 3:
                deleter.start()
                # B's delete must wait for A's plan lock: it cannot finish while A applies.
                assert not deleted.wait(1.0), "the target was deleted while a rollback to it was applied"

    monkeypatch.setattr(restorer_module, "crash_point", at)
    result = first.checkpoints.rollback(RollbackRequest(plan_id=plan_id, checkpoint_id=target.checkpoint_id))
    deleter.join(60)
    assert "error" not in outcome, outcome
    assert deleted.is_set() and outcome["gc"].deleted_objects > 0
    assert tree_state(workspace) == checkpointed
    # The safety checkpoint (the workspace before the rollback) is whole, through the other replica.
    second.checkpoints.rollback(RollbackRequest(plan_id=plan_id, checkpoint_id=result.safety.row.checkpoint_id))
    assert tree_state(workspace) == before


def test_one_rollback_request_id_sent_to_both_replicas_at_once_rolls_back_once(pair):
    first, second, workspaces = pair
    workspace = workspace_in(workspaces)
    plan_id = str(ULID())
    (workspace / "a.txt").write_text("v1")
    target = first.create(plan_id, workspace, state=b"target state")
    for round_number in range(5):
        (workspace / "a.txt").write_text(f"v2 round {round_number}")
        request = RollbackRequest(plan_id=plan_id, checkpoint_id=target.checkpoint_id, request_id=str(uuid.uuid4()))
        barrier = threading.Barrier(2)
        results: list[object] = [None, None]

        def run(index: int, replica: Replica, request=request, barrier=barrier, results=results) -> None:
            barrier.wait()
            try:
                results[index] = replica.checkpoints.rollback(request)
            except BaseException as exc:  # reported below
                results[index] = exc

        threads = [threading.Thread(target=run, args=(i, r)) for i, r in enumerate((first, second))]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join(60)
        assert all(not isinstance(r, BaseException) for r in results), results
        assert results[0].safety.row.checkpoint_id == results[1].safety.row.checkpoint_id
        assert results[0].state == results[1].state == b"target state"
        assert (workspace / "a.txt").read_text() == "v1"
    listed = first.checkpoints.list(plan_id, page_size=100)[0]
    assert [c.row.sequence for c in listed] == list(range(6, 0, -1)), "one safety checkpoint per request_id"
