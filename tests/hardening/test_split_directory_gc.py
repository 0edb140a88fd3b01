"""Garbage collection keeps every part of a split directory (see ``tree``) that a remaining
checkpoint reaches, and takes those only deleted ones reached: after checkpoints of a large
directory changed a file at a time are deleted and collected, fsck is clean and every
remaining checkpoint restores byte for byte."""

from __future__ import annotations

import grpc
from ulid import ULID

from checkpoint.v1 import checkpoint_service_pb2 as pb
from checkpoint.v1 import checkpoint_service_pb2_grpc as pb_grpc
from checkpointd.core.store.tree import SPLIT_ENTRIES
from tests.hardening.support import assert_fsck_clean
from tests.hardening.test_gc_compaction import _gc
from tests.helpers import tree_state


def test_collecting_checkpoints_of_a_split_directory_keeps_what_the_others_need(idle_server) -> None:
    server = idle_server
    workspace = server.new_workspace()
    big = workspace / "big"
    big.mkdir()
    for i in range(SPLIT_ENTRIES * 2):
        (big / f"entry_{i:06d}.txt").write_text(f"entry {i}\n")
    plan_id = str(ULID())
    expected: dict[str, dict] = {}
    created: list[str] = []
    server.start()
    with grpc.insecure_channel(server.tcp_target) as channel:
        stub = pb_grpc.CheckpointServiceStub(channel)
        for step in range(6):
            # Each step changes a file in another part, and one it changed before.
            (big / f"entry_{step * 700:06d}.txt").write_text(f"step {step}\n")
            (big / "entry_000001.txt").write_text(f"every step: {step}\n")
            if step == 3:
                (big / "entry_002000.txt").unlink()
            checkpoint = stub.CreateCheckpoint(pb.CreateCheckpointRequest(
                plan_id=plan_id, workspace_root=str(workspace)), timeout=120).checkpoint
            expected[checkpoint.checkpoint_id] = tree_state(workspace)
            created.append(checkpoint.checkpoint_id)
        for checkpoint_id in (created[0], created[2], created[3]):
            stub.DeleteCheckpoint(pb.DeleteCheckpointRequest(checkpoint_id=checkpoint_id), timeout=30)
            del expected[checkpoint_id]
    server.stop()
    assert _gc(server) == 0
    assert_fsck_clean(server)
    server.start()
    with grpc.insecure_channel(server.tcp_target) as channel:
        stub = pb_grpc.CheckpointServiceStub(channel)
        for checkpoint_id, state in list(expected.items()):
            stub.Rollback(pb.RollbackRequest(plan_id=plan_id, checkpoint_id=checkpoint_id), timeout=120)
            assert tree_state(workspace) == state, f"rollback to {checkpoint_id} is not exact"
    server.stop()
    assert_fsck_clean(server)
