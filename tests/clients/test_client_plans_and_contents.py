"""The Python client's plans, file contents and text-diff helpers against the real server."""

from __future__ import annotations

import io
import os
import tarfile
from pathlib import Path

import pytest
from ulid import ULID

from checkpoint.v1 import checkpoint_service_pb2 as pb
from checkpointd_client import Checkpointd, CheckpointdRpcError, format_patch


def test_list_plans_pages_through_and_get_plan_describes(checkpointd: Checkpointd, workspace: Path) -> None:
    client = checkpointd.checkpoints
    ids = []
    for name in ("a", "b", "c"):
        (workspace / name).mkdir()
        ids.append(str(ULID()))
        client.create_checkpoint(ids[-1], workspace_root=workspace / name, state=b"xy")
    plans = client.list_plans(filter_expr=f'workspace_root : "{workspace}"', page_size=2)
    assert [p.plan_id for p in plans] == sorted(ids, reverse=True)
    plan = client.get_plan(ids[0])
    assert (plan.workspace_root, plan.checkpoint_count, plan.total_size_bytes) == (str(workspace / "a"), 1, 2)
    with pytest.raises(CheckpointdRpcError) as caught:
        client.get_plan(str(ULID()))
    assert caught.value.reason == "PLAN_NOT_FOUND"
    with pytest.raises(CheckpointdRpcError) as caught:
        client.list_plans(filter_expr="update_time > 5")
    assert caught.value.reason == "INVALID_FILTER"


def test_read_file_streams_and_reports_errors_on_first_read(checkpointd: Checkpointd, workspace: Path,
                                                            plan_id: str) -> None:
    client = checkpointd.checkpoints
    content = os.urandom(300_000)
    (workspace / "blob").write_bytes(content)
    name = os.fsdecode(b"n\xe9")
    with open(os.path.join(os.fsencode(workspace), b"n\xe9"), "wb") as f:
        f.write(b"raw")
    (workspace / "dir").mkdir()
    cp = client.create_checkpoint(plan_id, workspace_root=workspace)
    chunks = list(client.read_file(cp.checkpoint_id, "blob"))
    assert len(chunks) > 1 and b"".join(chunks) == content
    assert b"".join(client.read_file(cp.checkpoint_id, name)) == b"raw"
    assert b"".join(client.read_file(cp.checkpoint_id, b"n\xe9")) == b"raw"
    for path, reason in (("dir", "NOT_A_FILE"), ("nope", "PATH_NOT_FOUND"), ("../x", "INVALID_PATH")):
        with pytest.raises(CheckpointdRpcError) as caught:
            next(client.read_file(cp.checkpoint_id, path))
        assert caught.value.reason == reason


def test_list_files_pages_through_names_raw_paths_and_reports_errors(checkpointd: Checkpointd, workspace: Path,
                                                                     plan_id: str) -> None:
    client = checkpointd.checkpoints
    (workspace / "src" / "pkg").mkdir(parents=True)
    for name in ("src/a.py", "src/pkg/mod.py", "src/z.txt", "README"):
        (workspace / name).write_text(name)
    os.mkdir(os.path.join(os.fsencode(workspace), b"d\xe9"))
    with open(os.path.join(os.fsencode(workspace), b"d\xe9", b"f"), "wb") as f:
        f.write(b"raw")
    cp = client.create_checkpoint(plan_id, workspace_root=workspace)
    files = client.list_files(cp.checkpoint_id, "src", recursive=True, page_size=2)
    assert [f.path for f in files] == ["src/a.py", "src/pkg", "src/pkg/mod.py", "src/z.txt"]
    assert [(f.path, f.entry_type) for f in client.list_files(cp.checkpoint_id)] == [
        ("README", pb.ENTRY_TYPE_FILE), ("d\\xe9", pb.ENTRY_TYPE_DIRECTORY), ("src", pb.ENTRY_TYPE_DIRECTORY)]
    for raw_name in (b"d\xe9", os.fsdecode(b"d\xe9")):
        assert [f.raw_path for f in client.list_files(cp.checkpoint_id, raw_name)] == [b"d\xe9/f"]
    for path, reason in (("README", "NOT_A_DIRECTORY"), ("nope", "PATH_NOT_FOUND"), ("../x", "INVALID_PATH")):
        with pytest.raises(CheckpointdRpcError) as caught:
            client.list_files(cp.checkpoint_id, path)
        assert caught.value.reason == reason


def test_export_checkpoint_is_a_tar_archive(checkpointd: Checkpointd, workspace: Path, plan_id: str) -> None:
    (workspace / "x.txt").write_text("x")
    cp = checkpointd.checkpoints.create_checkpoint(plan_id, workspace_root=workspace)
    data = b"".join(checkpointd.checkpoints.export_checkpoint(cp.checkpoint_id))
    with tarfile.open(fileobj=io.BytesIO(data)) as tar:
        assert tar.getnames() == ["x.txt"] and tar.extractfile("x.txt").read() == b"x"


def test_format_patch_renders_text_binary_and_colour(checkpointd: Checkpointd, workspace: Path, plan_id: str) -> None:
    client = checkpointd.checkpoints
    (workspace / "a.txt").write_text("one\ntwo\n")
    (workspace / "b.bin").write_bytes(b"\0")
    base = client.create_checkpoint(plan_id, workspace_root=workspace)
    (workspace / "a.txt").write_text("one\n2\n")
    (workspace / "b.bin").write_bytes(b"\0\0")
    (workspace / "a.txt").chmod(0o600)
    changes = client.diff_checkpoints(base.checkpoint_id, text_diffs=True)
    assert changes.omitted == 0 and isinstance(changes, list)
    assert format_patch(changes) == (
        "diff --checkpointd a/a.txt b/a.txt\nold mode 644\nnew mode 600\n--- a/a.txt\n+++ b/a.txt\n"
        "@@ -1,2 +1,2 @@\n one\n-two\n+2\n"
        "diff --checkpointd a/b.bin b/b.bin\nBinary files differ\n")
    coloured = format_patch(changes, color=True)
    assert "\x1b[31m-two\x1b[0m" in coloured and "\x1b[32m+2\x1b[0m" in coloured
    assert format_patch([]) == ""
    without = client.diff_checkpoints(base.checkpoint_id)
    assert all(c.text_diff_status == pb.TEXT_DIFF_STATUS_UNSPECIFIED for c in without)


def test_rollback_reports_nested_workspaces_when_allowed(checkpointd: Checkpointd, workspace: Path) -> None:
    client = checkpointd.checkpoints
    (workspace / "inner").mkdir()
    (workspace / "inner" / "f").write_text("1")
    outer, inner = str(ULID()), str(ULID())
    cp = client.create_checkpoint(outer, workspace_root=workspace)
    client.create_checkpoint(inner, workspace_root=workspace / "inner")
    (workspace / "inner" / "f").write_text("2")
    with pytest.raises(CheckpointdRpcError) as caught:
        client.rollback(outer, cp.checkpoint_id, dry_run=True)
    assert caught.value.reason == "NESTED_WORKSPACE" and caught.value.metadata["plan_id"] == inner
    done = client.rollback(outer, cp.checkpoint_id, allow_nested_workspaces=True)
    assert [n.plan_id for n in done.nested_workspaces] == [inner]
    assert (workspace / "inner" / "f").read_text() == "1"
