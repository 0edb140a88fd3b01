"""Garbage collection deletes only what no checkpoint references, and a checkpoint references its
plan state as much as its files (README, "Retention and garbage collection": "only unreferenced
content goes")."""

from __future__ import annotations

import os

import grpc
from ulid import ULID

from checkpoint.v1 import checkpoint_service_pb2 as pb
from checkpoint.v1 import checkpoint_service_pb2_grpc as pb_grpc
from tests.ops.conftest import wait_until


def _gc_runs(server) -> float:
    for line in server.scrape().splitlines():
        if line.startswith("checkpointd_gc_runs_total "):
            return float(line.split()[1])
    return 0.0


def _full(stub, checkpoint_id: str) -> pb.Checkpoint:
    request = pb.GetCheckpointRequest(checkpoint_id=checkpoint_id, view=pb.CHECKPOINT_VIEW_FULL)
    return stub.GetCheckpoint(request, timeout=30).checkpoint


def test_gc_keeps_the_plan_state_every_checkpoint_references(ops_server):
    server = ops_server("--gc-interval", "0.1", "--metrics-listen", "127.0.0.1:0")
    workspace = server.new_workspace()
    (workspace / "notes.txt").write_text("notes")
    (workspace / "sub" / "deeper").mkdir(parents=True)
    (workspace / "sub" / "deeper" / "nested.txt").write_text("nested")
    state_only, with_files = str(ULID()), str(ULID())
    states = {name: os.urandom(3000) for name in ("state-only", "with-files", "rollback-current")}
    with grpc.insecure_channel(server.tcp_target) as channel:
        stub = pb_grpc.CheckpointServiceStub(channel)
        bare = stub.CreateCheckpoint(pb.CreateCheckpointRequest(plan_id=state_only, state=states["state-only"]),
                                     timeout=60).checkpoint
        files = stub.CreateCheckpoint(pb.CreateCheckpointRequest(
            plan_id=with_files, workspace_root=str(workspace), state=states["with-files"]), timeout=60).checkpoint
        safety = stub.Rollback(pb.RollbackRequest(plan_id=with_files, checkpoint_id=files.checkpoint_id,
                                                  current_state=states["rollback-current"]),
                               timeout=60).safety_checkpoint
        runs = _gc_runs(server)
        wait_until(lambda: _gc_runs(server) >= runs + 2, "two GC runs after the checkpoints were written")

    # A restart, so that nothing the server kept in memory can hide a deleted object.
    server.stop()
    server.start()
    with grpc.insecure_channel(server.tcp_target) as channel:
        stub = pb_grpc.CheckpointServiceStub(channel)
        assert _full(stub, bare.checkpoint_id).state == states["state-only"]
        assert _full(stub, files.checkpoint_id).state == states["with-files"]
        assert _full(stub, safety.checkpoint_id).state == states["rollback-current"]
        restored = stub.Rollback(pb.RollbackRequest(plan_id=state_only, checkpoint_id=bare.checkpoint_id,
                                                    scope=pb.ROLLBACK_SCOPE_STATE), timeout=60)
        assert restored.state == states["state-only"]
        (workspace / "notes.txt").write_text("changed")
        (workspace / "sub" / "deeper" / "nested.txt").write_text("changed")
        stub.Rollback(pb.RollbackRequest(plan_id=with_files, checkpoint_id=files.checkpoint_id), timeout=60)
    assert (workspace / "notes.txt").read_text() == "notes"
    assert (workspace / "sub" / "deeper" / "nested.txt").read_text() == "nested"


def _captures(server, mode: str) -> float:
    prefix = f'checkpointd_capture_seconds_count{{mode="{mode}"}} '
    for line in server.scrape().splitlines():
        if line.startswith(prefix):
            return float(line.split()[1])
    return 0.0


def test_a_collection_that_deletes_nothing_leaves_the_next_capture_incremental(ops_server):
    """A collection tells every capture that objects may be gone (so the next one scans its whole
    workspace) only when it deleted something: here none can, as every object is referenced."""
    server = ops_server("--store", "db", "--watcher", "on", "--gc-interval", "0.1", "--metrics-listen", "127.0.0.1:0")
    workspace = server.new_workspace()
    (workspace / "a.txt").write_text("first")
    plan_id = str(ULID())
    with grpc.insecure_channel(server.tcp_target) as channel:
        stub = pb_grpc.CheckpointServiceStub(channel)

        def create(content: str) -> None:
            (workspace / "a.txt").write_text(content)
            stub.CreateCheckpoint(pb.CreateCheckpointRequest(plan_id=plan_id, workspace_root=str(workspace)),
                                  timeout=30)

        create("first")
        create("second")
        assert _captures(server, "incremental") == 1, "the watcher vouches for the workspace"
        full = _captures(server, "full")
        runs = _gc_runs(server)
        wait_until(lambda: _gc_runs(server) >= runs + 2, "two collections")
        create("third")
        assert _captures(server, "full") == full, "a collection that deleted nothing forced a full scan"
        assert _captures(server, "incremental") == 2
