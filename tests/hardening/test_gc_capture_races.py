"""Garbage collection against captures that reuse what it is about to delete.

Garbage collection lists the objects no checkpoint references, then (under the store's fence)
marks again and deletes them. An object on that list can be reused meanwhile by a capture that
finds it stored: safe when a committed checkpoint references the capture (the second mark
keeps it), lost when nothing does. Each test pauses a collection right after its listing
(fault point ``gc.listed``), reuses a listed object in between, lets the collection delete,
and then demands what a user is promised: the next acknowledged checkpoint restores exactly,
and the offline integrity check finds nothing missing.
"""

from __future__ import annotations

import random
import re
import time
import urllib.request
from pathlib import Path

import grpc
import pytest
from ulid import ULID

from checkpoint.v1 import checkpoint_service_pb2 as pb
from checkpoint.v1 import checkpoint_service_pb2_grpc as pb_grpc
from tests.hardening.support import assert_fsck_clean, start_with_faults
from tests.helpers import tree_state

PAUSED = "paused.gc.listed"
RESUME = "resume.gc.listed"


@pytest.fixture(params=["watcher-on", "watcher-off"])
def gc_server(request, idle_server, tmp_path):
    """A server not started yet; ``start_paused`` restarts it with a collection every 0.2 s,
    the first of which pauses once it has listed its candidates."""
    idle_server.extra_args = (*idle_server.extra_args, "--watcher", request.param.removeprefix("watcher-"),
                              "--metrics-listen", "127.0.0.1:0")
    handshake = tmp_path / "faults"
    handshake.mkdir()

    def start_paused() -> None:
        idle_server.stop()
        idle_server.extra_args = (*idle_server.extra_args, "--gc-interval", "0.2")
        start_with_faults(idle_server, CHECKPOINTD_PAUSE_AT="gc.listed:1", CHECKPOINTD_FAULT_DIR=str(handshake))
        _wait_for(lambda: (handshake / PAUSED).exists(), "the collection to pause after listing its candidates")

    def resume() -> None:
        (handshake / RESUME).touch()
        _wait_for(lambda: _metric(idle_server, "checkpointd_gc_runs_total") >= 1, "the paused collection to finish")
        assert _metric(idle_server, "checkpointd_gc_deleted_objects_total") > 0, "the collection deleted nothing"

    idle_server.start()
    return idle_server, start_paused, resume


def _wait_for(condition, what: str, timeout: float = 60.0) -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.02)


def _metric(server, name: str) -> float:
    found = re.findall(r"checkpointd metrics: (http://\S+)", server.log_path.read_text())
    assert found, server.log()
    with urllib.request.urlopen(found[-1], timeout=10) as reply:
        text = reply.read().decode()
    for line in text.splitlines():
        if line.startswith(name + " "):
            return float(line.split()[1])
    return 0.0


def _create(stub, plan_id: str, workspace: Path | None = None) -> pb.Checkpoint:
    request = pb.CreateCheckpointRequest(plan_id=plan_id, workspace_root=str(workspace) if workspace else "")
    return stub.CreateCheckpoint(request, timeout=60).checkpoint


def _orphan_content(server, workspace: Path, plan_id: str, content: bytes) -> pb.Checkpoint:
    """Checkpoints ``content`` in f.bin, then another version, then deletes the first checkpoint:
    ``content`` is stored but no checkpoint references it (a candidate for collection)."""
    (workspace / "keep.txt").write_text("unchanged\n")
    (workspace / "f.bin").write_bytes(content)
    with grpc.insecure_channel(server.tcp_target) as channel:
        stub = pb_grpc.CheckpointServiceStub(channel)
        first = _create(stub, plan_id, workspace)
        (workspace / "f.bin").write_bytes(b"another version\n")
        second = _create(stub, plan_id)
        stub.DeleteCheckpoint(pb.DeleteCheckpointRequest(checkpoint_id=first.checkpoint_id), timeout=30)
    return second


def _restores_exactly(server, plan_id: str, checkpoint_id: str, workspace: Path, expected: dict) -> None:
    (workspace / "f.bin").write_bytes(b"changed after the checkpoint\n")
    with grpc.insecure_channel(server.tcp_target) as channel:
        stub = pb_grpc.CheckpointServiceStub(channel)
        try:
            stub.Rollback(pb.RollbackRequest(plan_id=plan_id, checkpoint_id=checkpoint_id), timeout=60)
        except grpc.RpcError as error:
            pytest.fail(f"rollback to an acknowledged checkpoint failed: {error.code()} {error.details()}")
    assert tree_state(workspace) == expected


def test_a_live_diff_between_listing_and_deleting_loses_nothing(gc_server) -> None:
    """The diff's capture reuses the listed object; no checkpoint references that capture, so
    the collection deletes the object. The next checkpoint must not build on that capture."""
    server, start_paused, resume = gc_server
    workspace = server.new_workspace()
    plan_id = str(ULID())
    content = random.randbytes(20_000)
    second = _orphan_content(server, workspace, plan_id, content)
    start_paused()
    (workspace / "f.bin").write_bytes(content)
    # A tree no checkpoint ever had (written after the listing, so not a candidate itself).
    (workspace / "new.txt").write_text("new since the listing\n")
    with grpc.insecure_channel(server.tcp_target) as channel:
        stub = pb_grpc.CheckpointServiceStub(channel)
        changes = stub.DiffCheckpoints(pb.DiffCheckpointsRequest(base_checkpoint_id=second.checkpoint_id),
                                       timeout=60).changes
        assert sorted(c.path for c in changes) == ["f.bin", "new.txt"]
        resume()
        expected = tree_state(workspace)
        third = _create(stub, plan_id)
    _restores_exactly(server, plan_id, third.checkpoint_id, workspace, expected)
    server.stop()
    assert_fsck_clean(server)


def test_a_checkpoint_deleted_between_listing_and_deleting_is_no_base(gc_server) -> None:
    """A checkpoint reuses the listed object and is deleted before the collection marks again:
    the object goes, while the checkpoint's capture (written after the listing) stays stored.
    The next checkpoint must not trust that capture because its root is still there."""
    server, start_paused, resume = gc_server
    workspace = server.new_workspace()
    plan_id = str(ULID())
    content = random.randbytes(20_000)
    _orphan_content(server, workspace, plan_id, content)
    start_paused()
    (workspace / "f.bin").write_bytes(content)
    # A tree no checkpoint ever had (written after the listing, so not a candidate itself).
    (workspace / "new.txt").write_text("new since the listing\n")
    with grpc.insecure_channel(server.tcp_target) as channel:
        stub = pb_grpc.CheckpointServiceStub(channel)
        doomed = _create(stub, plan_id)
        stub.DeleteCheckpoint(pb.DeleteCheckpointRequest(checkpoint_id=doomed.checkpoint_id), timeout=30)
        resume()
        (workspace / "other.txt").write_text("a change elsewhere\n")
        expected = tree_state(workspace)
        later = _create(stub, plan_id)
    _restores_exactly(server, plan_id, later.checkpoint_id, workspace, expected)
    server.stop()
    assert_fsck_clean(server)

