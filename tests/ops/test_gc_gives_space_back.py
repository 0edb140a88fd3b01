"""A running server's collection gives the space of what it deletes back to the disk, also in a
store smaller than one pack (the pack still being appended to is compacted once half of it is
dead, as every other pack is); what is kept restores exactly, after a restart too."""

from __future__ import annotations

import random
import shutil

import grpc
import pytest
from ulid import ULID

from checkpoint.v1 import checkpoint_service_pb2 as pb
from checkpoint.v1 import checkpoint_service_pb2_grpc as pb_grpc
from tests.hardening.support import assert_fsck_clean
from tests.helpers import tree_state
from tests.ops.conftest import wait_until


def _pack_bytes(server) -> int:
    return sum(path.stat().st_size for path in (server.data_dir / "store" / "packs").glob("*.pack"))


def _new_version(stub, plan_id: str, workspace, rng: random.Random, files: int) -> tuple[str, dict]:
    """Every file rewritten with new random bytes (packed: under the loose limit), then a checkpoint."""
    for number in range(files):
        (workspace / f"f{number:02}.bin").write_bytes(rng.randbytes(4000))
    checkpoint = stub.CreateCheckpoint(pb.CreateCheckpointRequest(
        plan_id=plan_id, workspace_root=str(workspace)), timeout=60).checkpoint
    return checkpoint.checkpoint_id, tree_state(workspace)


def _each_restores_exactly(stub, plan_id: str, workspace, kept: list[tuple[str, dict]]) -> None:
    for checkpoint_id, state in kept:
        shutil.rmtree(workspace)
        workspace.mkdir()
        stub.Rollback(pb.RollbackRequest(plan_id=plan_id, checkpoint_id=checkpoint_id), timeout=60)
        assert tree_state(workspace) == state


def test_a_running_server_gives_back_the_space_it_collects(ops_server):
    server = ops_server("--gc-interval", "0.1")
    if server.store_kind != "disk":
        pytest.skip("the database store keeps no packs")
    rng = random.Random(7)
    workspace = server.new_workspace()
    plan_id = str(ULID())
    kept: list[tuple[str, dict]] = []
    with grpc.insecure_channel(server.tcp_target) as channel:
        stub = pb_grpc.CheckpointServiceStub(channel)
        for _version in range(5):
            kept.append(_new_version(stub, plan_id, workspace, rng, files=80))
        whole = _pack_bytes(server)
        assert whole > 5 * 80 * 4000, "the versions are packed, not loose"
        for checkpoint_id, _state in kept[:3]:
            stub.DeleteCheckpoint(pb.DeleteCheckpointRequest(checkpoint_id=checkpoint_id), timeout=30)
        kept = kept[3:]
        # Three of five versions collected: the packs hold the two left (and a few tombstones).
        wait_until(lambda: _pack_bytes(server) < whole * 0.6, f"the packs ({whole} bytes) to shrink", timeout=20)

    server.stop()
    assert_fsck_clean(server)
    server.start()
    with grpc.insecure_channel(server.tcp_target) as channel:
        stub = pb_grpc.CheckpointServiceStub(channel)
        _each_restores_exactly(stub, plan_id, workspace, kept)


def test_a_collection_compacts_records_that_died_without_a_deletion(ops_server):
    """Looks at the live workspace write their directory nodes and drop them: dead records no
    deletion ever reaches. A collection that deletes nothing still gives their space back."""
    server = ops_server("--gc-interval", "0.1")
    if server.store_kind != "disk":
        pytest.skip("the database store keeps no packs")
    workspace = server.new_workspace()
    (workspace / "kept.txt").write_text("kept\n")
    plan_id = str(ULID())
    with grpc.insecure_channel(server.tcp_target) as channel:
        stub = pb_grpc.CheckpointServiceStub(channel)
        base = stub.CreateCheckpoint(pb.CreateCheckpointRequest(
            plan_id=plan_id, workspace_root=str(workspace)), timeout=60).checkpoint.checkpoint_id
        kept = tree_state(workspace)
        for directory in range(60):
            (workspace / f"d{directory:02}").mkdir()
            for number in range(30):
                name = f"d{directory:02}/a-rather-long-file-name-{number:03}.txt"
                (workspace / name).write_text(name)
        for _look in range(8):
            reply = stub.DiffCheckpoints(pb.DiffCheckpointsRequest(base_checkpoint_id=base), timeout=60)
            assert len(reply.changes) == 60 * 31
        # Each look writes ~78 KB of directory nodes: less than one look's worth is left.
        wait_until(lambda: _pack_bytes(server) < 40_000, "the looks' dead nodes to be compacted away", timeout=20)
        for directory in range(60):
            shutil.rmtree(workspace / f"d{directory:02}")
        (workspace / "kept.txt").write_text("changed\n")
        stub.Rollback(pb.RollbackRequest(plan_id=plan_id, checkpoint_id=base), timeout=60)
    assert tree_state(workspace) == kept
    server.stop()
    assert_fsck_clean(server)


def test_a_server_stopped_in_the_middle_of_a_compaction_loses_nothing(ops_server, tmp_path):
    """SIGTERM while a collection is compacting (paused after copying the live records): the
    server does not close the packs under it (it exits with them open, as a kill would leave
    them), and the restarted server has every checkpoint it kept, exactly."""
    handshake = tmp_path / "faults"
    handshake.mkdir()
    server = ops_server("--gc-interval", "0.1", "--grace-seconds", "1",
                        env={"CHECKPOINTD_PAUSE_AT": "compact.copied:1", "CHECKPOINTD_FAULT_DIR": str(handshake)})
    if server.store_kind != "disk":
        pytest.skip("the database store keeps no packs")
    rng = random.Random(11)
    workspace = server.new_workspace()
    plan_id = str(ULID())
    kept = []
    with grpc.insecure_channel(server.tcp_target) as channel:
        stub = pb_grpc.CheckpointServiceStub(channel)
        for _version in range(3):
            kept.append(_new_version(stub, plan_id, workspace, rng, files=40))
        for checkpoint_id, _state in kept[:2]:
            stub.DeleteCheckpoint(pb.DeleteCheckpointRequest(checkpoint_id=checkpoint_id), timeout=30)
        kept = kept[2:]
        wait_until(lambda: (handshake / "paused.compact.copied").exists(), "a compaction to pause")
    server.stop()
    assert "the content store is left open for it" in server.log()
    assert_fsck_clean(server)
    server.start()
    with grpc.insecure_channel(server.tcp_target) as channel:
        stub = pb_grpc.CheckpointServiceStub(channel)
        _each_restores_exactly(stub, plan_id, workspace, kept)
