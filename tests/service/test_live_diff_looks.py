"""A diff against the live workspace is a look: it hashes the files changed since the checkpoint
and stores none of their contents (each look used to append them all to the store, dead once the
look was dropped). The look is still exact, and a checkpoint taken after it stores everything."""

from __future__ import annotations

import os
from pathlib import Path

import grpc

from checkpoint.v1 import checkpoint_service_pb2 as pb
from checkpoint.v1 import checkpoint_service_pb2_grpc
from tests.conftest import RunningServer
from tests.helpers import checkpoint_id_of

_FILES = 48
_FILE_BYTES = 40 << 10


def _store_bytes(server: RunningServer) -> int:
    store = server.data_dir / "store"
    return sum(path.stat().st_size for path in store.rglob("*") if path.is_file())


def _look(stub, base: str, **fields) -> list[tuple]:
    """Every page of a live diff, as (path, kind, target size, text diff status)."""
    changes, token = [], ""
    while True:
        reply = stub.DiffCheckpoints(pb.DiffCheckpointsRequest(base_checkpoint_id=base, page_token=token, **fields))
        changes += [(c.path, c.kind, c.target_size_bytes, c.text_diff_status) for c in reply.changes]
        token = reply.next_page_token
        if not token:
            return changes


def _read(stub, checkpoint_id: str, path: str) -> bytes:
    return b"".join(chunk.data for chunk in stub.ReadCheckpointFile(
        pb.ReadCheckpointFileRequest(checkpoint_id=checkpoint_id, path=path)))


def _new_files(workspace: Path) -> dict[str, bytes]:
    """~2 MiB not checkpointed, which compresses to nothing less: path -> content."""
    written = {f"new/f{i:02}.bin": os.urandom(_FILE_BYTES) for i in range(_FILES)}
    for path, data in written.items():
        (workspace / path).parent.mkdir(exist_ok=True)
        (workspace / path).write_bytes(data)
    return written


def test_a_look_at_the_live_workspace_stores_none_of_the_files_it_hashes(fresh_server: RunningServer, plan_id):
    workspace = fresh_server.new_workspace()
    (workspace / "same-size.txt").write_text("one\n")
    with grpc.insecure_channel(fresh_server.tcp_target) as channel:
        stub = checkpoint_service_pb2_grpc.CheckpointServiceStub(channel)
        base = checkpoint_id_of(stub, plan_id, workspace)
        # Not checkpointed: new files, and an edit of the same size.
        written = _new_files(workspace)
        (workspace / "same-size.txt").write_text("two\n")
        before = _store_bytes(fresh_server)

        whole = _look(stub, base)
        assert _look(stub, base, page_size=5) == whole
        assert _look(stub, base, text_diffs=True)[0][:3] == whole[0][:3]
        grown = _store_bytes(fresh_server) - before
        # Three looks of 2 MiB (13 calls): the directory nodes they wrote, no file's content.
        assert grown < _FILE_BYTES, f"the looks stored {grown} bytes"

        target = checkpoint_id_of(stub, plan_id)
        expected = _look_between(stub, base, target)
        assert whole == expected
        assert ("same-size.txt", pb.CHANGE_KIND_MODIFIED, 4, pb.TEXT_DIFF_STATUS_UNSPECIFIED) in whole
        # The checkpoint after the looks stored every file itself: nothing was taken as stored.
        for path, data in written.items():
            assert _read(stub, target, path) == data
        assert _read(stub, target, "same-size.txt") == b"two\n"


def _look_between(stub, base: str, target: str) -> list[tuple]:
    reply = stub.DiffCheckpoints(pb.DiffCheckpointsRequest(base_checkpoint_id=base, target_checkpoint_id=target))
    return [(c.path, c.kind, c.target_size_bytes, c.text_diff_status) for c in reply.changes]


def test_a_look_is_exact_when_the_workspace_changes_between_looks(fresh_server: RunningServer, plan_id):
    """A file hashed by one look and changed before the next is hashed again by the next."""
    workspace: Path = fresh_server.new_workspace()
    (workspace / "a.txt").write_text("a\n")
    with grpc.insecure_channel(fresh_server.tcp_target) as channel:
        stub = checkpoint_service_pb2_grpc.CheckpointServiceStub(channel)
        base = checkpoint_id_of(stub, plan_id, workspace)
        (workspace / "a.txt").write_text("b\n")
        assert [c[:2] for c in _look(stub, base)] == [("a.txt", pb.CHANGE_KIND_MODIFIED)]
        (workspace / "a.txt").write_text("a\n")
        assert _look(stub, base) == []
        (workspace / "a.txt").write_text("c\n")
        reply = stub.DiffCheckpoints(pb.DiffCheckpointsRequest(base_checkpoint_id=base, text_diffs=True))
        assert [(c.path, c.text_diff) for c in reply.changes] == [
            ("a.txt", "--- a/a.txt\n+++ b/a.txt\n@@ -1 +1 @@\n-a\n+c\n")]


def test_a_dry_run_rollback_is_a_look_too(fresh_server: RunningServer, plan_id):
    """A dry run stores none of the files it would replace; the real rollback after it still keeps
    every one of them in its safety checkpoint, and puts the target back exactly."""
    workspace = fresh_server.new_workspace()
    (workspace / "kept.txt").write_text("kept\n")
    with grpc.insecure_channel(fresh_server.tcp_target) as channel:
        stub = checkpoint_service_pb2_grpc.CheckpointServiceStub(channel)
        base = checkpoint_id_of(stub, plan_id, workspace)
        written = _new_files(workspace)
        (workspace / "kept.txt").write_text("edited\n")
        before = _store_bytes(fresh_server)
        request = pb.RollbackRequest(plan_id=plan_id, checkpoint_id=base, dry_run=True)
        previews = [stub.Rollback(request) for _ in range(3)]
        grown = _store_bytes(fresh_server) - before
        assert grown < _FILE_BYTES, f"the dry runs stored {grown} bytes"
        assert all(p.dry_run and not p.HasField("safety_checkpoint") for p in previews)
        listed = {c.path: c.kind for c in previews[0].changes}
        assert listed == {"kept.txt": pb.CHANGE_KIND_MODIFIED, "new": pb.CHANGE_KIND_DELETED,
                          **dict.fromkeys(written, pb.CHANGE_KIND_DELETED)}
        assert all([c.path for c in p.changes] == [c.path for c in previews[0].changes] for p in previews)

        done = stub.Rollback(pb.RollbackRequest(plan_id=plan_id, checkpoint_id=base))
        safety = done.safety_checkpoint.checkpoint_id
        for path, data in written.items():
            assert _read(stub, safety, path) == data
        assert _read(stub, safety, "kept.txt") == b"edited\n"
        assert sorted(p.name for p in workspace.iterdir()) == ["kept.txt"]
        assert (workspace / "kept.txt").read_text() == "kept\n"
