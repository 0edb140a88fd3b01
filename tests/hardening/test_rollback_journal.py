"""The rollback journal across restarts and server versions: a journal file left by a server
from before the journal moved into the database is read once when the server starts — finished
if its plan is where the rollback left it, dropped (never applied) if the plan has moved on."""

from __future__ import annotations

import json
import os
from pathlib import Path

import grpc
import pytest
from sqlalchemy import create_engine, text
from ulid import ULID

from checkpoint.v1 import checkpoint_service_pb2 as pb
from checkpoint.v1 import checkpoint_service_pb2_grpc as pb_grpc
from tests.hardening.support import assert_fsck_clean, pending_rollbacks, start_with_faults
from tests.helpers import tree_state


def _write_all(workspace: Path, version: str) -> None:
    for name in ("a.txt", "b.txt", "c.txt", "sub/d.txt"):
        (workspace / name).parent.mkdir(exist_ok=True)
        (workspace / name).write_text(f"{version} of {name}")


def _legacy_journal_file(server, plan_id: str, workspace: Path, target_id: str, safety_id: str,
                         safety_tree: str) -> Path:
    """What a server before the database journal left for an unfinished rollback to ``target_id``."""
    directory = server.data_dir / "rollback-journal"
    directory.mkdir(exist_ok=True)
    path = directory / f"{plan_id}.json"
    path.write_text(json.dumps({
        "version": 1, "plan_id": plan_id, "workspace_root": os.path.realpath(workspace),
        "target_checkpoint_id": target_id, "safety_checkpoint_id": safety_id, "safety_tree": safety_tree,
        "paths": [], "temp_tag": "0" * 32, "directories": ["", "sub"], "request_id": "", "goal": "complete"}))
    return path


def _sql(server, statement: str) -> list:
    engine = create_engine(server.db_url or f"sqlite:///{server.data_dir / 'checkpointd.db'}")
    try:
        with engine.begin() as connection:
            result = connection.execute(text(statement))
            return list(result) if result.returns_rows else []
    finally:
        engine.dispose()


def _create(stub, plan_id: str, workspace: Path) -> pb.Checkpoint:
    return stub.CreateCheckpoint(pb.CreateCheckpointRequest(plan_id=plan_id, workspace_root=str(workspace)),
                                 timeout=60).checkpoint


def test_an_old_journal_file_is_never_applied_after_the_plan_moved_on(idle_server) -> None:
    """A replica that kept its journal in its data dir comes back much later: the plan has had a
    finished rollback and new checkpoints since. Applying its stale entry would revert them."""
    server = idle_server
    server.start()
    workspace = server.new_workspace()
    plan_id = str(ULID())
    with grpc.insecure_channel(server.tcp_target) as channel:
        stub = pb_grpc.CheckpointServiceStub(channel)
        _write_all(workspace, "v1")
        target = _create(stub, plan_id, workspace)
        _write_all(workspace, "v2")
        safety = stub.Rollback(pb.RollbackRequest(plan_id=plan_id, checkpoint_id=target.checkpoint_id),
                               timeout=60).safety_checkpoint
        _write_all(workspace, "v3")
        (workspace / "new.txt").write_text("work done after the rollback")
        newest = _create(stub, plan_id, workspace)
    after = tree_state(workspace)
    server.stop()
    stale = _legacy_journal_file(server, plan_id, workspace, target.checkpoint_id, safety.checkpoint_id,
                                 safety.tree_digest)

    server.start()
    assert tree_state(workspace) == after, "a stale journal entry was applied over newer checkpoints"
    assert not stale.exists() and not stale.parent.exists()
    assert pending_rollbacks(server) == []
    with grpc.insecure_channel(server.tcp_target) as channel:
        stub = pb_grpc.CheckpointServiceStub(channel)
        again = _create(stub, plan_id, workspace)
        assert again.tree_digest == newest.tree_digest and again.sequence == newest.sequence + 1
    server.stop()
    assert_fsck_clean(server)


def test_an_old_journal_file_of_an_interrupted_rollback_is_finished_at_start(idle_server) -> None:
    """A rollback killed half-way, its entry as an older server wrote it (a file): the server
    imports it and finishes the rollback when it starts, and the file is gone."""
    server = idle_server
    start_with_faults(server, CHECKPOINTD_CRASH_AT="restore.change:2")
    workspace = server.new_workspace()
    plan_id = str(ULID())
    with grpc.insecure_channel(server.tcp_target) as channel:
        stub = pb_grpc.CheckpointServiceStub(channel)
        _write_all(workspace, "v1")
        target = _create(stub, plan_id, workspace)
        checkpointed = tree_state(workspace)
        _write_all(workspace, "v2")
        before = tree_state(workspace)
        with pytest.raises(grpc.RpcError):
            stub.Rollback(pb.RollbackRequest(plan_id=plan_id, checkpoint_id=target.checkpoint_id), timeout=60)
    server.process.wait(timeout=60)
    server.stop()
    half = tree_state(workspace)
    assert half not in (before, checkpointed)
    (safety_id, safety_tree), = _sql(server, "SELECT checkpoint_id, tree_digest FROM checkpoints "
                                             "WHERE trigger = 'rollback'")
    _sql(server, "DELETE FROM rollback_journal")
    _legacy_journal_file(server, plan_id, workspace, target.checkpoint_id, safety_id, safety_tree)

    server.start()
    assert tree_state(workspace) == checkpointed
    assert pending_rollbacks(server) == [] and not (server.data_dir / "rollback-journal").exists()
    with grpc.insecure_channel(server.tcp_target) as channel:
        stub = pb_grpc.CheckpointServiceStub(channel)
        stub.Rollback(pb.RollbackRequest(plan_id=plan_id, checkpoint_id=safety_id), timeout=60)
        assert tree_state(workspace) == before
    server.stop()
    assert_fsck_clean(server)
