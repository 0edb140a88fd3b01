"""The lost-session fencing of commit 3a7f939 (LOCK_LOST), attacked.

Replicas share one PostgreSQL database with the database content store; their cross-replica
locks are session advisory locks, and a checkpoint's commit confirms, in its own transaction,
the content-store fence (GC epoch under the fence's lock taken shared) and its plan's lock
(pg_locks + pg_stat_activity, by pid and backend start). Attacked here:

- false refusals in normal operation: a group commit mixing several plans (lock keys of both
  signs) of which only one lost its lock's session; every idle pooled session ended (a pooler
  or database restart), after which the pooled lock connections are new sessions whose cached
  backend start must be read again;
- a remaining hole: a rollback whose safety capture reuses content that another replica's
  collection deletes while the rollback's fence session is gone (the safety checkpoint's commit
  goes through CoreRows on the rollback's ORM session);
- what a client sees over a real server: UNAVAILABLE with ErrorInfo reason LOCK_LOST (never
  INTERNAL), nothing recorded, and the retry answered.

Races are deterministic: monkeypatched ``crash_point``s and a wrapped group-commit writer in
process (the ``Replica`` pair of tests/postgres/test_replicas_attacked.py), and the server's own
PAUSE fault over gRPC.
"""

from __future__ import annotations

import tempfile
import threading
import time
from pathlib import Path

import grpc
import pytest
from ulid import ULID

from checkpoint.v1 import checkpoint_service_pb2 as pb
from checkpoint.v1 import checkpoint_service_pb2_grpc
from checkpointd.core.engine import rollback as rollback_module
from checkpointd.core.engine.requests import RollbackRequest
from checkpointd.core.kernel.errors import Reason, Unavailable
from checkpointd.core.kernel.faults import Point
from checkpointd.core.metadata.db import lock_key
from tests.conftest import RunningServer
from tests.hardening.support import start_with_faults
from tests.helpers import end_other_sessions, error_info, tree_state
from tests.postgres.replica_pair import end_session, fence_pid, holders, workspace_in

pytestmark = pytest.mark.postgres


def _plan_with_key_sign(negative: bool) -> str:
    while True:
        plan_id = str(ULID())
        if (lock_key(f"plan:{plan_id}") < 0) == negative:
            return plan_id


# -- false refusals ------------------------------------------------------------------------------


def test_a_group_commit_of_several_plans_refuses_only_the_plan_whose_lock_session_was_lost(pair, admin):
    """Three creates on one replica: the first leads a group commit that waits until the other two
    are queued behind it, so those two are written in one transaction. Before that transaction,
    the database ends the session holding one of the two plans' locks (its key is negative, the
    other's positive: pg_locks shows both as unsigned halves). Only that plan's create is refused
    (LOCK_LOST, nothing recorded); the other, in the same group, is committed."""
    first, _second, workspaces = pair
    leader_plan = str(ULID())
    lost_plan, kept_plan = _plan_with_key_sign(negative=True), _plan_with_key_sign(negative=False)
    group_commit = first.checkpoints.parts.new_checkpoints
    write = group_commit._write
    groups: list[list[str]] = []
    queued = threading.Event()

    def grouped_write(rows, items):
        plans = [item.record.plan_id for item in items]
        groups.append(plans)
        if plans == [leader_plan]:
            deadline = time.monotonic() + 10
            while len(group_commit._queue) < 2 and time.monotonic() < deadline:
                time.sleep(0.01)
            assert len(group_commit._queue) == 2, "the other two creates never queued"
            (pid,) = holders(admin, f"plan:{lost_plan}")
            end_session(admin, pid)
            queued.set()
        return write(rows, items)

    for plan_id in (leader_plan, lost_plan, kept_plan):  # known plans: the creates go straight to their commit
        first.create(plan_id, state=b"warm")
    group_commit._write = grouped_write
    outcome: dict[str, object] = {}

    def create(plan_id: str) -> None:
        try:
            outcome[plan_id] = first.create(plan_id, state=plan_id.encode())
        except BaseException as exc:  # reported below
            outcome[plan_id] = exc

    leader = threading.Thread(target=create, args=(leader_plan,))
    leader.start()
    while not groups:
        time.sleep(0.005)
    others = [threading.Thread(target=create, args=(p,)) for p in (lost_plan, kept_plan)]
    for thread in others:
        thread.start()
    for thread in (leader, *others):
        thread.join(60)
    assert queued.is_set()
    assert sorted([lost_plan, kept_plan]) in [sorted(g) for g in groups], groups
    assert not isinstance(outcome[leader_plan], BaseException), outcome
    assert isinstance(outcome[lost_plan], Unavailable) and outcome[lost_plan].reason is Reason.LOCK_LOST, outcome
    assert not isinstance(outcome[kept_plan], BaseException), outcome
    listed = {p: [c.row.state_digest for c in first.checkpoints.list(p)[0]] for p in (lost_plan, kept_plan)}
    assert len(listed[lost_plan]) == 1, "nothing of the refused create was recorded"
    assert len(listed[kept_plan]) == 2
    assert first.checkpoints.get(outcome[kept_plan].checkpoint_id, with_state=True).state == kept_plan.encode()
    assert first.create(lost_plan, state=b"retry").sequence == 2  # the retry, on a new lock session


def test_operations_after_every_idle_session_was_ended_are_not_refused(pair, admin):
    """A restart of the database (or of a pooler in front of it) ends every pooled session,
    those of the idle lock connections included. The pool replaces them with new sessions whose
    backend start is not the cached one of the old: creates (state-only and captured), a rollback
    (its safety commit through CoreRows) and a retry on the other replica are all accepted, twice
    over (the second time on the replaced connections, whose start was read again)."""
    first, second, workspaces = pair
    workspace = workspace_in(workspaces)
    plan_id = str(ULID())
    (workspace / "a.txt").write_text("v1")
    target = first.create(plan_id, workspace, state=b"target")
    second.create(str(ULID()), state=b"other replica")
    for round_number in range(2):
        time.sleep(0.4)  # the fences linger 0.2 s after their last user: every lock is let go
        assert end_other_sessions(admin) > 0
        (workspace / "a.txt").write_text(f"v2 round {round_number}")
        first.create(plan_id, workspace, state=b"after the restart")
        first.create(str(ULID()), state=b"state only")
        result = first.checkpoints.rollback(RollbackRequest(plan_id=plan_id, checkpoint_id=target.checkpoint_id))
        assert (workspace / "a.txt").read_text() == "v1" and result.safety is not None
        second.create(plan_id, workspace, state=b"on the other replica")


# -- a lost fence during a rollback's safety capture ---------------------------------------------


def test_a_rollback_whose_fence_session_was_lost_while_a_collection_deleted_its_safety_content_is_refused(
        pair, admin, monkeypatch):
    """The rollback's safety capture reuses stored garbage (a deleted checkpoint's file); the
    database ends the session of the rollback replica's GC fence and the other replica collects,
    deleting it. The safety checkpoint's commit (CoreRows on the rollback's ORM session) is refused
    with LOCK_LOST before anything changes: no safety checkpoint, no journal entry, the workspace
    untouched. The retry rolls back, and its safety checkpoint is whole through both replicas."""
    first, second, workspaces = pair
    workspace, elsewhere = workspace_in(workspaces), workspace_in(workspaces)
    plan_id = str(ULID())
    (workspace / "a.txt").write_text("target")
    target = first.create(plan_id, workspace)
    shared = b"content a deleted checkpoint stored " * 50
    (elsewhere / "shared.txt").write_bytes(shared)
    doomed = first.create(str(ULID()), elsewhere)
    second.checkpoints.delete(doomed.checkpoint_id)
    (workspace / "shared.txt").write_bytes(shared)
    (workspace / "a.txt").write_text("before the rollback")
    before = tree_state(workspace)
    collected: list[object] = []

    def at(point: Point) -> None:
        if point is Point.ROLLBACK_PLANNED and not collected:
            end_session(admin, fence_pid(first))
            collected.append(second.maintenance.collect_garbage())

    monkeypatch.setattr(rollback_module, "crash_point", at)
    with pytest.raises(Unavailable) as refused:
        first.checkpoints.rollback(RollbackRequest(plan_id=plan_id, checkpoint_id=target.checkpoint_id))
    monkeypatch.undo()
    assert collected and collected[0].deleted_objects > 0
    assert refused.value.reason is Reason.LOCK_LOST
    assert tree_state(workspace) == before
    assert [c.row.checkpoint_id for c in second.checkpoints.list(plan_id)[0]] == [target.checkpoint_id]
    assert second.checkpoints.journal.get(plan_id) is None

    result = first.checkpoints.rollback(RollbackRequest(plan_id=plan_id, checkpoint_id=target.checkpoint_id))
    assert (workspace / "a.txt").read_text() == "target" and not (workspace / "shared.txt").exists()
    for replica in (first, second):
        files = dict(replica.checkpoints.trees.flatten(result.safety.row.tree_digest))
        assert replica.store.read_bytes(files["shared.txt"].digest) == shared
    second.checkpoints.rollback(RollbackRequest(plan_id=plan_id, checkpoint_id=result.safety.row.checkpoint_id))
    assert tree_state(workspace) == before


# -- what a client sees --------------------------------------------------------------------------


def test_a_client_sees_unavailable_lock_lost_and_its_retry_is_answered(short_tmp: Path, pg_url: str, admin,
                                                                     monkeypatch):
    """Over a real replica: a create is paused between its capture and its commit (the server's
    PAUSE fault) while the database ends the session holding its plan's lock. The client gets
    UNAVAILABLE with ErrorInfo reason LOCK_LOST in domain checkpointd (not INTERNAL, not UNKNOWN),
    nothing is recorded, and the same request (same request_id) retried is answered."""
    base = Path(tempfile.mkdtemp(prefix="g-", dir=short_tmp))
    shared_root = base / "shared"
    shared_root.mkdir()
    faults = base / "faults"
    faults.mkdir()
    server = RunningServer(Path(tempfile.mkdtemp(prefix="r-", dir=base)), db_url=pg_url,
                           extra_args=("--store", "db", "--workspace-root", str(shared_root)))
    start_with_faults(server, CHECKPOINTD_PAUSE_AT="create.captured:2", CHECKPOINTD_FAULT_DIR=str(faults))
    channel = grpc.insecure_channel(server.tcp_target)
    try:
        stub = checkpoint_service_pb2_grpc.CheckpointServiceStub(channel)
        workspace = Path(tempfile.mkdtemp(prefix="ws-", dir=shared_root))
        (workspace / "a.txt").write_text("v1")
        plan_id = str(ULID())
        first = stub.CreateCheckpoint(pb.CreateCheckpointRequest(plan_id=plan_id, workspace_root=str(workspace)),
                                      timeout=60).checkpoint
        (workspace / "a.txt").write_text("v2")
        request = pb.CreateCheckpointRequest(plan_id=plan_id, workspace_root=str(workspace), state=b"s",
                                             request_id=str(ULID()))
        answer: dict[str, object] = {}

        def call() -> None:
            try:
                answer["reply"] = stub.CreateCheckpoint(request, timeout=60)
            except grpc.RpcError as error:
                answer["error"] = error

        caller = threading.Thread(target=call)
        caller.start()
        paused = faults / "paused.create.captured"
        deadline = time.monotonic() + 30
        while not paused.exists() and time.monotonic() < deadline:
            time.sleep(0.02)
        assert paused.exists(), server.log()
        (pid,) = holders(admin, f"plan:{plan_id}")
        end_session(admin, pid)
        (faults / "resume.create.captured").touch()
        caller.join(60)
        error = answer.get("error")
        assert isinstance(error, grpc.RpcError), answer
        assert error.code() is grpc.StatusCode.UNAVAILABLE, (error.code(), error.details())
        info = error_info(error)
        assert (info.reason, info.domain) == ("LOCK_LOST", "checkpointd")
        listed = stub.ListCheckpoints(pb.ListCheckpointsRequest(plan_id=plan_id, page_size=10)).checkpoints
        assert [c.checkpoint_id for c in listed] == [first.checkpoint_id]
        retried = stub.CreateCheckpoint(request, timeout=60).checkpoint
        assert retried.sequence == 2
        assert stub.CreateCheckpoint(request, timeout=60).checkpoint.checkpoint_id == retried.checkpoint_id
    finally:
        channel.close()
        server.stop()
