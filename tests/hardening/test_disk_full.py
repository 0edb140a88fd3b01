"""Disk full: the data directory on a small tmpfs, and a workspace on another. Running out of
room is RESOURCE_EXHAUSTED (reason STORAGE_EXHAUSTED) every time, nothing half-written becomes
visible, the server keeps serving, and once there is room again everything recorded restores
exactly and passes fsck. A rollback that runs out of room in the workspace is undone.

Needs root (mount); skipped otherwise.
"""

from __future__ import annotations

import contextlib
import os
import random
import subprocess
from collections.abc import Iterator
from pathlib import Path

import grpc
import pytest
from ulid import ULID

from checkpoint.v1 import checkpoint_service_pb2 as pb
from checkpoint.v1 import checkpoint_service_pb2_grpc as pb_grpc
from tests.hardening.support import assert_fsck_clean, list_all, serving
from tests.helpers import error_info, skip_unless_ci, tree_state

if os.geteuid() != 0:
    skip_unless_ci("mounting a tmpfs needs root", allow_module_level=True)


@contextlib.contextmanager
def tmpfs(path: Path, size: str) -> Iterator[Path]:
    path.mkdir(parents=True, exist_ok=True)
    subprocess.run(["mount", "-t", "tmpfs", "-o", f"size={size}", "tmpfs", str(path)], check=True)
    try:
        yield path
    finally:
        subprocess.run(["umount", "-l", str(path)], check=False)


def resize(path: Path, size: str) -> None:
    subprocess.run(["mount", "-o", f"remount,size={size}", str(path)], check=True)


def _full(error: grpc.RpcError) -> bool:
    return error.code() == grpc.StatusCode.RESOURCE_EXHAUSTED and error_info(error).reason == "STORAGE_EXHAUSTED"


def test_a_full_data_directory(idle_server) -> None:
    rng = random.Random(3)
    with tmpfs(idle_server.data_dir, "3m"):
        idle_server.start()
        try:
            workspace = idle_server.new_workspace()
            plan_id = str(ULID())
            acked: dict[str, dict] = {}
            failures: list[str] = []
            with grpc.insecure_channel(idle_server.tcp_target) as channel:
                stub = pb_grpc.CheckpointServiceStub(channel)
                for i in range(40):
                    (workspace / "big.bin").write_bytes(rng.randbytes(512 * 1024))
                    (workspace / "small.txt").write_text(f"step {i}")
                    try:
                        created = stub.CreateCheckpoint(pb.CreateCheckpointRequest(
                            plan_id=plan_id, workspace_root=str(workspace), request_id=str(ULID())),
                            timeout=60).checkpoint
                    except grpc.RpcError as error:
                        assert _full(error), f"{error.code()}: {error.details()}\n{idle_server.log()}"
                        failures.append(error.details())
                        if len(failures) >= 3:
                            break
                        continue
                    acked[created.checkpoint_id] = tree_state(workspace)
                assert acked and failures, (len(acked), failures)

                assert serving(idle_server.tcp_target)
                assert {c.checkpoint_id for c in list_all(stub, plan_id)} == set(acked), \
                    "a checkpoint that failed for lack of room must not be visible"
                for _ in range(3):
                    try:
                        stub.CreateCheckpoint(pb.CreateCheckpointRequest(plan_id=str(ULID()), state=b"s" * 4096),
                                              timeout=60)
                    except grpc.RpcError as error:
                        assert _full(error), f"{error.code()}: {error.details()}"
                before = tree_state(workspace)
                try:
                    stub.Rollback(pb.RollbackRequest(plan_id=plan_id, checkpoint_id=next(iter(acked))), timeout=60)
                except grpc.RpcError as error:
                    assert _full(error), f"{error.code()}: {error.details()}"
                    assert tree_state(workspace) == before, "a rollback refused for lack of room changed files"

                resize(idle_server.data_dir, "64m")
                stub.CreateCheckpoint(pb.CreateCheckpointRequest(plan_id=plan_id), timeout=60)
                for checkpoint_id, content in acked.items():
                    stub.Rollback(pb.RollbackRequest(plan_id=plan_id, checkpoint_id=checkpoint_id), timeout=60)
                    assert tree_state(workspace) == content
        finally:
            idle_server.stop()
        assert_fsck_clean(idle_server)


def test_a_rollback_that_fills_the_workspace_disk_is_undone(idle_server) -> None:
    idle_server.start()
    workspace = idle_server.allowed_root / "small-disk"
    with tmpfs(workspace, "1m"), grpc.insecure_channel(idle_server.tcp_target) as channel:
        stub = pb_grpc.CheckpointServiceStub(channel)
        plan_id = str(ULID())
        rng = random.Random(5)
        (workspace / "x.bin").write_bytes(rng.randbytes(600 * 1024))
        (workspace / "pad.bin").write_bytes(rng.randbytes(300 * 1024))
        target = stub.CreateCheckpoint(pb.CreateCheckpointRequest(plan_id=plan_id, workspace_root=str(workspace)),
                                       timeout=60).checkpoint
        (workspace / "x.bin").write_bytes(rng.randbytes(600 * 1024))
        before = tree_state(workspace)

        with pytest.raises(grpc.RpcError) as refused:
            stub.Rollback(pb.RollbackRequest(plan_id=plan_id, checkpoint_id=target.checkpoint_id), timeout=60)
        assert _full(refused.value), refused.value.details()
        assert "undone" in refused.value.details()
        assert tree_state(workspace) == before
        assert [n for n in os.listdir(workspace) if n.startswith(".checkpointd-tmp-")] == []

        resize(workspace, "4m")
        stub.Rollback(pb.RollbackRequest(plan_id=plan_id, checkpoint_id=target.checkpoint_id), timeout=60)
        assert (workspace / "x.bin").read_bytes() != before["x.bin"][1]
        idle_server.stop()
    assert_fsck_clean(idle_server)


def _fill(directory: Path) -> Path:
    """Writes a file in ``directory`` until its file system is full; returns the file."""
    filler = directory / "filler.bin"
    with open(filler, "wb", buffering=0) as out:
        chunk = b"\0" * 4096
        with contextlib.suppress(OSError):
            while True:
                out.write(chunk)
    return filler


def test_a_full_disk_while_new_plans_record_their_first_checkpoint(idle_server) -> None:
    """The new plan's row or its first checkpoint cannot be committed (the content it needs is
    stored already): RESOURCE_EXHAUSTED, nothing half-recorded, and every plan works once
    there is room again."""
    with tmpfs(idle_server.data_dir, "4m"):
        idle_server.start()
        try:
            workspace = idle_server.new_workspace()
            (workspace / "shared.txt").write_text("content every plan has\n")
            with grpc.insecure_channel(idle_server.tcp_target) as channel:
                stub = pb_grpc.CheckpointServiceStub(channel)
                first = str(ULID())
                kept = stub.CreateCheckpoint(pb.CreateCheckpointRequest(
                    plan_id=first, workspace_root=str(workspace), state=b"known state"), timeout=60).checkpoint
                filler = _fill(idle_server.data_dir)
                refused: list[str] = []
                recorded: list[str] = []
                for i in range(60):
                    plan_id = str(ULID())
                    request = pb.CreateCheckpointRequest(plan_id=plan_id, state=b"known state" if i % 2 else b"")
                    if i % 3 == 0:
                        request.workspace_root = str(workspace)
                    try:
                        stub.CreateCheckpoint(request, timeout=60)
                    except grpc.RpcError as error:
                        assert _full(error), f"{error.code()}: {error.details()}\n{idle_server.log()}"
                        refused.append(plan_id)
                        if len(refused) >= 4:
                            break
                    else:
                        recorded.append(plan_id)
                assert refused, "the disk never filled up"
                assert serving(idle_server.tcp_target)
                for plan_id in refused:
                    assert list_all(stub, plan_id) == [], "a refused first checkpoint must not be visible"
                filler.unlink()
                for plan_id in [*refused, *recorded]:
                    stub.CreateCheckpoint(pb.CreateCheckpointRequest(plan_id=plan_id, state=b"later"), timeout=60)
                    assert [c.sequence for c in list_all(stub, plan_id)] == list(
                        range(1, 2 + (plan_id in recorded))), "sequences must stay gap-free"
                (workspace / "shared.txt").write_text("changed\n")
                stub.Rollback(pb.RollbackRequest(plan_id=first, checkpoint_id=kept.checkpoint_id), timeout=60)
                assert (workspace / "shared.txt").read_text() == "content every plan has\n"
        finally:
            idle_server.stop()
        assert_fsck_clean(idle_server)
