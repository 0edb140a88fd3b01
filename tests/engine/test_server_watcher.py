"""Through a real server over gRPC: with the watcher on (the default) and off, every
checkpoint's tree digest equals an in-process full scan of the workspace at that moment
(digests are content addresses, so a separate store gives the same tree), and rollbacks,
whose own writes the watcher sees, leave the next checkpoint exact too."""

from __future__ import annotations

import os
import shutil
from pathlib import Path

import grpc
import pytest
from ulid import ULID

from checkpoint.v1 import checkpoint_service_pb2 as pb
from checkpoint.v1 import checkpoint_service_pb2_grpc
from tests.conftest import RunningServer
from tests.engine.conftest import write
from tests.engine.live import full_scan


@pytest.fixture(params=["on", "off"])
def server(request, short_tmp: Path):
    running = RunningServer(short_tmp / f"watcher-{request.param}-{ULID()}",
                            extra_args=("--watcher", request.param))
    running.start()
    yield running
    running.stop()


def _full_scan_tree(root: Path, scratch: Path) -> str:
    return full_scan(root, scratch).tree


def test_checkpoints_and_rollbacks_match_full_scans(server, tmp_path):
    root = server.new_workspace()
    write(root / ".gitignore", "build/\n")
    for i in range(12):
        write(root / f"src/m{i % 3}/f{i}.py", f"print({i})\n")
    write(root / "build/out.bin", b"\0" * 100)
    plan = str(ULID())
    with grpc.insecure_channel(f"127.0.0.1:{server.port}") as channel:
        stub = checkpoint_service_pb2_grpc.CheckpointServiceStub(channel)
        scratch = iter(tmp_path / f"scan{i}" for i in range(100))

        def checkpoint() -> pb.Checkpoint:
            made = stub.CreateCheckpoint(pb.CreateCheckpointRequest(plan_id=plan, workspace_root=str(root)))
            assert made.checkpoint.tree_digest == "sha256:" + _full_scan_tree(root, next(scratch))
            return made.checkpoint

        first = checkpoint()
        write(root / "src/m0/f0.py", "print('edited')\n")
        os.rename(root / "src/m1", root / "src/moved")
        write(root / "src/new/deep/x.py", "x = 1\n")
        checkpoint()
        shutil.rmtree(root / "src/m2")
        write(root / "build/out.bin", b"\1" * 100)
        checkpoint()
        stub.Rollback(pb.RollbackRequest(plan_id=plan, checkpoint_id=first.checkpoint_id,
                                         scope=pb.ROLLBACK_SCOPE_FILES))
        after_rollback = checkpoint()
        assert after_rollback.tree_digest == first.tree_digest
        write(root / "src/m0/f3.py", "print('after the rollback')\n")
        checkpoint()
