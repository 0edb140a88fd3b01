"""Garbage collection with pack compaction never takes back a deletion, nor an acknowledged
checkpoint. A real server with small packs records checkpoints of a file edited a line at a
time (each version stored as a delta of the one before) beside a file rewritten in full;
checkpoints are deleted so that some packs are compacted and others not, GC runs offline
between restarts (and is killed half-way through a compaction), then the deleted versions
are recorded again. Every acknowledged checkpoint must restore exactly; fsck must stay clean."""

from __future__ import annotations

import os
import random
import signal
import subprocess

import grpc
import pytest
from ulid import ULID

from checkpoint.v1 import checkpoint_service_pb2 as pb
from checkpoint.v1 import checkpoint_service_pb2_grpc as pb_grpc
from tests.conftest import CHECKPOINTD
from tests.hardening.support import assert_fsck_clean, start_with_faults
from tests.helpers import tree_state

#: Packs this small hold about three checkpoints of the workload below.
SMALL_PACKS = {"CHECKPOINTD_PACK_ROTATE_BYTES": "16384"}


def _gc(server, crash_at: str = "") -> int:
    """`checkpointd gc` on the stopped server's data dir; its exit status (-9 when killed)."""
    command = [CHECKPOINTD, "gc", "--data-dir", str(server.data_dir), "--store", server.store_kind, "--json"]
    if server.db_url:
        command += ["--db-url", server.db_url]
    environment = {k: v for k, v in os.environ.items() if not k.startswith("CHECKPOINTD_")}
    environment.update(SMALL_PACKS)
    if crash_at:
        environment["CHECKPOINTD_CRASH_AT"] = crash_at
    done = subprocess.run(command, env=environment, capture_output=True, text=True, timeout=120)
    assert done.returncode in (0, -signal.SIGKILL), done.stderr
    return done.returncode


class _Workload:
    """One plan: notes.txt edited a line at a time, blob.bin rewritten with random bytes at
    every checkpoint, and what every acknowledged checkpoint must restore."""

    def __init__(self, server) -> None:
        self.rng = random.Random(3)
        self.workspace = server.new_workspace()
        self.plan_id = str(ULID())
        self.notes = b"".join(b"%d: %x\n" % (i, self.rng.getrandbits(64)) for i in range(250))
        self.expected: dict[str, dict] = {}
        self.created: list[str] = []
        #: The notes of deleted checkpoints, recorded again at the end.
        self.deleted_notes: list[bytes] = []

    def create(self, stub, count: int) -> None:
        for _ in range(count):
            lines = self.notes.splitlines(keepends=True)
            lines[self.rng.randrange(len(lines))] = b"edited %x\n" % self.rng.getrandbits(64)
            self.notes = b"".join(lines)
            self.created.append(self.record(stub, self.notes))

    def record(self, stub, notes: bytes) -> str:
        (self.workspace / "notes.txt").write_bytes(notes)
        (self.workspace / "blob.bin").write_bytes(self.rng.randbytes(5000))
        checkpoint = stub.CreateCheckpoint(pb.CreateCheckpointRequest(
            plan_id=self.plan_id, workspace_root=str(self.workspace)), timeout=60).checkpoint
        self.expected[checkpoint.checkpoint_id] = tree_state(self.workspace)
        return checkpoint.checkpoint_id

    def delete(self, stub, *numbers: int) -> None:
        """Deletes the checkpoints created in these places (1-based, in creation order)."""
        for number in numbers:
            checkpoint_id = self.created[number - 1]
            stub.DeleteCheckpoint(pb.DeleteCheckpointRequest(checkpoint_id=checkpoint_id), timeout=30)
            self.deleted_notes.append(self.expected.pop(checkpoint_id)["notes.txt"][1])

    def rollback(self, stub, checkpoint_id: str) -> None:
        """Rolls back to ``checkpoint_id``; its safety checkpoint is acknowledged too."""
        before = tree_state(self.workspace)
        reply = stub.Rollback(pb.RollbackRequest(plan_id=self.plan_id, checkpoint_id=checkpoint_id,
                                                 scope=pb.ROLLBACK_SCOPE_FILES), timeout=60)
        assert tree_state(self.workspace) == self.expected[checkpoint_id], f"rollback to {checkpoint_id} is not exact"
        self.expected[reply.safety_checkpoint.checkpoint_id] = before

    def record_again_and_restore(self, stub, notes: bytes) -> None:
        """Records deleted content again, changes it, and rolls back to it at once (before a
        later checkpoint could store its base again)."""
        checkpoint_id = self.record(stub, notes)
        (self.workspace / "notes.txt").write_bytes(b"changed after the checkpoint\n")
        self.rollback(stub, checkpoint_id)


@pytest.mark.parametrize("crash_at", ["", "compact.copied:1", "compact.synced:1"])
def test_content_recorded_again_after_gc_and_compaction_restores_exactly(idle_server, crash_at) -> None:
    server = idle_server
    work = _Workload(server)
    killed = 0
    # Round 1 deletes versions 2-4: the pack of versions 1-3 is compacted, the one of 4-6 is
    # not. Round 2 deletes what makes the pack of round 1's tombstones mostly dead.
    for create, delete in ((6, (2, 3, 4)), (3, (1, 7))):
        start_with_faults(server, **SMALL_PACKS)
        with grpc.insecure_channel(server.tcp_target) as channel:
            stub = pb_grpc.CheckpointServiceStub(channel)
            work.create(stub, create)
            work.delete(stub, *delete)
        server.stop()
        if crash_at and _gc(server, crash_at) != 0:
            killed += 1
            assert_fsck_clean(server)
        assert _gc(server) == 0
    if crash_at and server.store_kind == "disk":
        assert killed, f"no GC run reached {crash_at}: nothing was compacted"
    start_with_faults(server, **SMALL_PACKS)
    with grpc.insecure_channel(server.tcp_target) as channel:
        stub = pb_grpc.CheckpointServiceStub(channel)
        for notes in reversed(work.deleted_notes):
            work.record_again_and_restore(stub, notes)
        server.stop()
        start_with_faults(server, **SMALL_PACKS)
        for checkpoint_id in list(work.expected):
            work.rollback(stub, checkpoint_id)
    server.stop()
    assert_fsck_clean(server)
