"""ReadCheckpointFile, ExportCheckpoint and DiffCheckpoints' text diffs, over a real server."""

from __future__ import annotations

import io
import os
import tarfile

import grpc
from ulid import ULID

from checkpoint.v1 import checkpoint_service_pb2 as pb
from tests.helpers import error_info, refused


def _checkpoint(stub, plan_id, root):
    return stub.CreateCheckpoint(pb.CreateCheckpointRequest(plan_id=plan_id, workspace_root=str(root))).checkpoint


def _read(stub, checkpoint_id, path="", raw_path=b""):
    return list(stub.ReadCheckpointFile(pb.ReadCheckpointFileRequest(checkpoint_id=checkpoint_id, path=path,
                                                                     raw_path=raw_path)))


def test_reads_a_file_as_it_was_in_chunks(checkpoint_stub, workspace, plan_id):
    big = os.urandom(200_000) + b"tail"
    (workspace / "dir").mkdir()
    (workspace / "dir" / "big.bin").write_bytes(big)
    (workspace / "small.txt").write_text("v1\n")
    (workspace / "empty").write_bytes(b"")
    (workspace / "small.txt").chmod(0o640)
    first = _checkpoint(checkpoint_stub, plan_id, workspace)
    (workspace / "small.txt").write_text("v2\n")
    (workspace / "dir" / "big.bin").unlink()
    _checkpoint(checkpoint_stub, plan_id, workspace)

    chunks = _read(checkpoint_stub, first.checkpoint_id, "dir/big.bin")
    assert len(chunks) == 4 and all(len(c.data) <= 64 * 1024 for c in chunks)
    assert b"".join(c.data for c in chunks) == big
    assert chunks[0].entry_type == pb.ENTRY_TYPE_FILE and chunks[0].size_bytes == len(big)
    small = _read(checkpoint_stub, first.checkpoint_id, "small.txt")
    assert [c.data for c in small] == [b"v1\n"] and small[0].mode == 0o640
    empty = _read(checkpoint_stub, first.checkpoint_id, "empty")
    assert len(empty) == 1 and empty[0].data == b"" and empty[0].size_bytes == 0


def test_a_symlink_reads_as_its_target_text_never_followed(checkpoint_stub, workspace, plan_id):
    (workspace / "link").symlink_to("/etc/hostname")
    cp = _checkpoint(checkpoint_stub, plan_id, workspace)
    [only] = _read(checkpoint_stub, cp.checkpoint_id, "link")
    assert only.entry_type == pb.ENTRY_TYPE_SYMLINK and only.data == b"/etc/hostname"


def test_a_name_that_is_not_utf8_is_read_by_its_raw_path(checkpoint_stub, workspace, plan_id):
    name = b"caf\xe9.txt"
    with open(os.path.join(os.fsencode(workspace), name), "wb") as f:
        f.write(b"latin-1 name")
    cp = _checkpoint(checkpoint_stub, plan_id, workspace)
    assert b"".join(c.data for c in _read(checkpoint_stub, cp.checkpoint_id, raw_path=name)) == b"latin-1 name"


def test_reading_what_is_not_a_file_says_why(checkpoint_stub, workspace, plan_id):
    (workspace / "dir").mkdir()
    (workspace / "dir" / "f").write_text("x")
    cp = _checkpoint(checkpoint_stub, plan_id, workspace)
    state_only = checkpoint_stub.CreateCheckpoint(pb.CreateCheckpointRequest(plan_id=str(ULID()))).checkpoint
    refused(lambda: _read(checkpoint_stub, cp.checkpoint_id, "dir"), grpc.StatusCode.FAILED_PRECONDITION,
            "NOT_A_FILE")
    missing = refused(lambda: _read(checkpoint_stub, cp.checkpoint_id, "dir/nope"), grpc.StatusCode.NOT_FOUND,
                      "PATH_NOT_FOUND")
    assert error_info(missing).metadata["path"] == "dir/nope"
    refused(lambda: _read(checkpoint_stub, cp.checkpoint_id, "dir/f/below"), grpc.StatusCode.NOT_FOUND,
            "PATH_NOT_FOUND")
    not_a_dir = refused(lambda: _read(checkpoint_stub, cp.checkpoint_id, "dir/f/"), grpc.StatusCode.FAILED_PRECONDITION,
                        "NOT_A_DIRECTORY")
    assert error_info(not_a_dir).metadata["path"] == "dir/f"
    refused(lambda: _read(checkpoint_stub, cp.checkpoint_id, "dir/"), grpc.StatusCode.FAILED_PRECONDITION,
            "NOT_A_FILE")
    refused(lambda: _read(checkpoint_stub, state_only.checkpoint_id, "f"), grpc.StatusCode.FAILED_PRECONDITION,
            "NO_WORKSPACE")
    refused(lambda: _read(checkpoint_stub, str(ULID()), "f"), grpc.StatusCode.NOT_FOUND, "CHECKPOINT_NOT_FOUND")
    for bad in ("../etc/passwd", "/etc/passwd", "", "a/./b"):
        refused(lambda bad=bad: _read(checkpoint_stub, cp.checkpoint_id, bad), grpc.StatusCode.INVALID_ARGUMENT,
                "INVALID_PATH")
    refused(lambda: _read(checkpoint_stub, "nope", "f"), grpc.StatusCode.INVALID_ARGUMENT, "INVALID_CHECKPOINT_ID")


def test_export_is_a_tar_of_the_tree_with_modes_and_symlinks(checkpoint_stub, workspace, plan_id):
    (workspace / "bin").mkdir(mode=0o750)
    (workspace / "bin").chmod(0o750)
    (workspace / "bin" / "run.sh").write_text("#!/bin/sh\necho hi\n")
    (workspace / "bin" / "run.sh").chmod(0o755)
    (workspace / "data.bin").write_bytes(os.urandom(150_001))
    (workspace / "link").symlink_to("bin/run.sh")
    cp = _checkpoint(checkpoint_stub, plan_id, workspace)
    (workspace / "data.bin").write_bytes(b"changed later")
    chunks = [r.data for r in checkpoint_stub.ExportCheckpoint(pb.ExportCheckpointRequest(
        checkpoint_id=cp.checkpoint_id))]
    assert all(len(c) <= 64 * 1024 for c in chunks)
    with tarfile.open(fileobj=io.BytesIO(b"".join(chunks))) as tar:
        members = {m.name: m for m in tar.getmembers()}
        assert set(members) == {"bin", "bin/run.sh", "data.bin", "link"}
        assert members["bin"].isdir() and members["bin"].mode == 0o750
        assert members["bin/run.sh"].mode == 0o755
        assert tar.extractfile("bin/run.sh").read() == b"#!/bin/sh\necho hi\n"
        assert members["link"].issym() and members["link"].linkname == "bin/run.sh"
        exported = tar.extractfile("data.bin").read()
    assert len(exported) == 150_001
    assert exported == b"".join(c.data for c in _read(checkpoint_stub, cp.checkpoint_id, "data.bin"))


def test_export_of_a_state_only_or_unknown_checkpoint_fails_before_any_byte(checkpoint_stub):
    state_only = checkpoint_stub.CreateCheckpoint(pb.CreateCheckpointRequest(plan_id=str(ULID()))).checkpoint
    refused(lambda: list(checkpoint_stub.ExportCheckpoint(pb.ExportCheckpointRequest(
        checkpoint_id=state_only.checkpoint_id))), grpc.StatusCode.FAILED_PRECONDITION, "NO_WORKSPACE")
    refused(lambda: list(checkpoint_stub.ExportCheckpoint(pb.ExportCheckpointRequest(checkpoint_id=str(ULID())))),
            grpc.StatusCode.NOT_FOUND, "CHECKPOINT_NOT_FOUND")


def _diff(stub, base, target="", text_diffs=True):
    reply = stub.DiffCheckpoints(pb.DiffCheckpointsRequest(base_checkpoint_id=base, target_checkpoint_id=target,
                                                           text_diffs=text_diffs))
    return {c.path: c for c in reply.changes}


def test_text_diffs_between_checkpoints_and_against_the_live_workspace(checkpoint_stub, workspace, plan_id):
    (workspace / "a.txt").write_text("one\ntwo\nthree\n")
    (workspace / "gone.txt").write_text("bye\n")
    (workspace / "img.bin").write_bytes(b"\x89PNG\0\0")
    (workspace / "huge.txt").write_text("x\n" * 600_000)
    (workspace / "dir").mkdir()
    base = _checkpoint(checkpoint_stub, plan_id, workspace)
    (workspace / "a.txt").write_text("one\nTWO\nthree")
    (workspace / "gone.txt").unlink()
    (workspace / "new.txt").write_text("hello\n")
    (workspace / "img.bin").write_bytes(b"\x89PNG\0\1")
    (workspace / "huge.txt").write_text("y\n" * 600_000)
    (workspace / "dir").chmod(0o700)
    target = _checkpoint(checkpoint_stub, plan_id, workspace)

    for against in (target.checkpoint_id, ""):
        changes = _diff(checkpoint_stub, base.checkpoint_id, against)
        assert changes["a.txt"].text_diff_status == pb.TEXT_DIFF_STATUS_TEXT
        assert changes["a.txt"].text_diff == ("--- a/a.txt\n+++ b/a.txt\n@@ -1,3 +1,3 @@\n one\n-two\n-three\n"
                                              "+TWO\n+three\n\\ No newline at end of file\n")
        assert changes["gone.txt"].text_diff == "--- a/gone.txt\n+++ /dev/null\n@@ -1 +0,0 @@\n-bye\n"
        assert changes["new.txt"].text_diff == "--- /dev/null\n+++ b/new.txt\n@@ -0,0 +1 @@\n+hello\n"
        assert changes["img.bin"].text_diff_status == pb.TEXT_DIFF_STATUS_BINARY
        assert changes["huge.txt"].text_diff_status == pb.TEXT_DIFF_STATUS_TOO_LARGE
        assert changes["dir"].text_diff_status == pb.TEXT_DIFF_STATUS_NOT_A_FILE
        assert not changes["img.bin"].text_diff and not changes["huge.txt"].text_diff
    plain = _diff(checkpoint_stub, base.checkpoint_id, target.checkpoint_id, text_diffs=False)
    assert all(c.text_diff_status == pb.TEXT_DIFF_STATUS_UNSPECIFIED and not c.text_diff for c in plain.values())


def test_text_diffs_of_one_response_are_bounded_in_total(checkpoint_stub, workspace, plan_id):
    for i in range(4):
        (workspace / f"f{i}.txt").write_text(("a" * 39 + "\n") * 15_000)
    base = _checkpoint(checkpoint_stub, plan_id, workspace)
    for i in range(4):
        (workspace / f"f{i}.txt").write_text(("b" * 39 + "\n") * 15_000)
    changes = _diff(checkpoint_stub, base.checkpoint_id)
    statuses = [changes[f"f{i}.txt"].text_diff_status for i in range(4)]
    assert statuses[0] == pb.TEXT_DIFF_STATUS_TEXT
    assert pb.TEXT_DIFF_STATUS_TOO_LARGE in statuses
    assert sum(len(c.text_diff) for c in changes.values()) <= 2 << 20


def test_a_file_of_too_many_lines_gets_no_text_diff(checkpoint_stub, workspace, plan_id):
    """Under the size limit but with more lines than the server diffs (difflib's worst case grows
    with the product of both sides' lines): TOO_LARGE, while a file just within the limit is diffed."""
    (workspace / "many.txt").write_text("x\n" * 20_001)
    (workspace / "enough.txt").write_text("x\n" * 20_000)
    base = _checkpoint(checkpoint_stub, plan_id, workspace)
    (workspace / "many.txt").write_text("y\n" * 20_001)
    (workspace / "enough.txt").write_text("y\n" * 20_000)
    changes = _diff(checkpoint_stub, base.checkpoint_id)
    assert changes["many.txt"].text_diff_status == pb.TEXT_DIFF_STATUS_TOO_LARGE
    assert changes["enough.txt"].text_diff_status == pb.TEXT_DIFF_STATUS_TEXT
