"""A rollback's writes are made durable together, after every file is renamed into place (see
``core/restore``). The server is killed at that point (``restore.unsynced``): every file renamed,
nothing synced, the journal entry still there. A kill -9 leaves the page cache, so this test also
leaves the workspace as a power cut at that point could: one renamed file whose content never
reached the disk (empty), one rename that never happened (the file as it was), a temporary file
of the rollback. The restarted server must finish the rollback exactly, record what it found
first, and keep the first safety checkpoint able to bring back the workspace as it was."""

from __future__ import annotations

import json
import uuid
from pathlib import Path

import grpc
import pytest
from sqlalchemy import create_engine, text
from ulid import ULID

from checkpoint.v1 import checkpoint_service_pb2 as pb
from checkpoint.v1 import checkpoint_service_pb2_grpc as pb_grpc
from checkpointd.core.workspace.workspace import TEMP_PREFIX
from tests.hardening.support import assert_fsck_clean, pending_rollbacks, start_with_faults
from tests.helpers import tree_state

FILES = [f"src/module_{i}.py" for i in range(12)] + [f"docs/page_{i}.md" for i in range(6)] + ["README.md"]


def _write(workspace: Path, version: str, names: list[str]) -> None:
    for name in names:
        (workspace / name).parent.mkdir(parents=True, exist_ok=True)
        (workspace / name).write_text(f"{version} of {name}\n" * 20)


def _journal_entry(server) -> dict:
    engine = create_engine(server.db_url or f"sqlite:///{server.data_dir / 'checkpointd.db'}")
    try:
        with engine.connect() as connection:
            (raw,) = connection.execute(text("SELECT entry FROM rollback_journal")).scalars()
    finally:
        engine.dispose()
    return raw if isinstance(raw, dict) else json.loads(raw)


def test_a_rollback_killed_before_its_batch_sync_is_finished_exactly_whatever_reached_the_disk(idle_server) -> None:
    server = idle_server
    start_with_faults(server, CHECKPOINTD_CRASH_AT="restore.unsynced:1")
    workspace = server.new_workspace()
    plan_id = str(ULID())
    request = pb.RollbackRequest(plan_id=plan_id, request_id=str(uuid.uuid4()))
    with grpc.insecure_channel(server.tcp_target) as channel:
        stub = pb_grpc.CheckpointServiceStub(channel)
        _write(workspace, "v1", FILES)
        (workspace / "docs" / "only_in_v1.md").write_text("deleted later")
        target = stub.CreateCheckpoint(pb.CreateCheckpointRequest(plan_id=plan_id, workspace_root=str(workspace)),
                                       timeout=60).checkpoint
        wanted = tree_state(workspace)
        _write(workspace, "v2", FILES[::2])
        (workspace / "docs" / "only_in_v1.md").unlink()
        _write(workspace, "v2", ["new/deep/added.py", "src/added.py"])
        before = tree_state(workspace)
        request.checkpoint_id = target.checkpoint_id
        with pytest.raises(grpc.RpcError) as killed:
            stub.Rollback(request, timeout=60)
        assert killed.value.code() == grpc.StatusCode.UNAVAILABLE
    server.process.wait(timeout=60)
    server.stop()
    assert tree_state(workspace) == wanted, "the kill came before every change was renamed into place"
    assert pending_rollbacks(server) == [plan_id], "the batch was not synced: the journal entry must stay"

    # What a power cut at that point could leave instead of the page cache's view.
    entry = _journal_entry(server)
    (workspace / "src" / "module_0.py").write_bytes(b"")  # renamed, content not on the disk
    (workspace / "src" / "module_2.py").write_text("v2 of src/module_2.py\n" * 20)  # rename not on the disk
    leftover = workspace / "src" / f"{TEMP_PREFIX}{entry['temp_tag']}-{uuid.uuid4().hex}"
    leftover.write_bytes(b"half a file")
    damaged = tree_state(workspace)

    server.start()
    assert tree_state(workspace) == wanted, "recovery did not bring the workspace exactly to the target"
    assert pending_rollbacks(server) == []
    with grpc.insecure_channel(server.tcp_target) as channel:
        stub = pb_grpc.CheckpointServiceStub(channel)
        replayed = stub.Rollback(request, timeout=60)
        assert tree_state(workspace) == wanted
        first_safety = replayed.safety_checkpoint
        listed = stub.ListCheckpoints(pb.ListCheckpointsRequest(plan_id=plan_id), timeout=60).checkpoints
        recorded = [c for c in listed if c.checkpoint_id not in (target.checkpoint_id, first_safety.checkpoint_id)]
        assert len(recorded) == 1, "recovery must record what it found before it changed it"
        stub.Rollback(pb.RollbackRequest(plan_id=plan_id, checkpoint_id=recorded[0].checkpoint_id), timeout=60)
        assert tree_state(workspace) == {k: v for k, v in damaged.items() if k != leftover.relative_to(workspace)
                                         .as_posix()}
        stub.Rollback(pb.RollbackRequest(plan_id=plan_id, checkpoint_id=first_safety.checkpoint_id), timeout=60)
        assert tree_state(workspace) == before, "the first safety checkpoint no longer holds the workspace as it was"
    server.stop()
    assert_fsck_clean(server)
