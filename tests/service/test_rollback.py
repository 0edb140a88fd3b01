"""Rollback semantics end to end: a real server over TCP, real files."""

from __future__ import annotations

import os
import uuid

import grpc
import pytest
from google.protobuf import struct_pb2

from checkpoint.v1 import checkpoint_service_pb2 as pb
from checkpoint.v1 import config_service_pb2 as cfg
from tests.helpers import error_info, tree_state


@pytest.fixture
def cp(checkpoint_stub, workspace, plan_id):
    """Shortcuts bound to one plan and workspace."""

    class Plan:
        root = workspace
        id = plan_id
        stub = checkpoint_stub

        def create(self, **kwargs) -> pb.Checkpoint:
            kwargs.setdefault("workspace_root", str(workspace))
            return checkpoint_stub.CreateCheckpoint(pb.CreateCheckpointRequest(plan_id=plan_id, **kwargs)).checkpoint

        def rollback(self, checkpoint: pb.Checkpoint, **kwargs) -> pb.RollbackResponse:
            return checkpoint_stub.Rollback(
                pb.RollbackRequest(plan_id=plan_id, checkpoint_id=checkpoint.checkpoint_id, **kwargs))

        def diff(self, base: pb.Checkpoint, target: pb.Checkpoint | None = None, **kwargs) -> dict[str, int]:
            reply = checkpoint_stub.DiffCheckpoints(pb.DiffCheckpointsRequest(
                base_checkpoint_id=base.checkpoint_id,
                target_checkpoint_id=target.checkpoint_id if target else "", **kwargs))
            return {c.path: c.kind for c in reply.changes}

    return Plan()


def write(root, rel, content="x", mode=None):
    path = root / rel
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(content.encode() if isinstance(content, str) else content)
    if mode is not None:
        path.chmod(mode)
    return path


def test_modified_deleted_created_and_renamed_files_come_back_exactly(cp):
    write(cp.root, "keep.txt", "keep")
    write(cp.root, "edit.txt", "v1")
    write(cp.root, "gone.txt", "soon deleted")
    write(cp.root, "old/name.txt", "renamed later")
    before = tree_state(cp.root)
    target = cp.create()

    write(cp.root, "edit.txt", "v2")
    (cp.root / "gone.txt").unlink()
    write(cp.root, "brand/new.txt", "created")
    (cp.root / "old/name.txt").rename(cp.root / "new-name.txt")

    reply = cp.rollback(target)
    assert tree_state(cp.root) == before
    kinds = {c.path: c.kind for c in reply.changes}
    assert kinds["edit.txt"] == pb.CHANGE_KIND_MODIFIED
    assert kinds["gone.txt"] == pb.CHANGE_KIND_ADDED
    assert kinds["brand/new.txt"] == pb.CHANGE_KIND_DELETED
    assert kinds["new-name.txt"] == pb.CHANGE_KIND_DELETED
    assert kinds["old/name.txt"] == pb.CHANGE_KIND_ADDED
    assert "keep.txt" not in kinds


def test_symlinks_are_restored_as_links_and_never_followed(cp, tmp_path):
    outside = tmp_path / "outside.txt"
    outside.write_text("outside stays")
    write(cp.root, "real.txt", "real")
    os.symlink("real.txt", cp.root / "link")
    os.symlink(str(outside), cp.root / "escape")
    before = tree_state(cp.root)
    target = cp.create()

    (cp.root / "link").unlink()
    os.symlink("elsewhere", cp.root / "link")
    (cp.root / "escape").unlink()
    write(cp.root, "escape", "now a file")
    cp.rollback(target)

    assert tree_state(cp.root) == before
    assert outside.read_text() == "outside stays"


def test_exec_bits_and_permissions_are_restored(cp):
    write(cp.root, "run.sh", "#!/bin/sh\n", mode=0o755)
    write(cp.root, "secret", "s", mode=0o600)
    target = cp.create()
    (cp.root / "run.sh").chmod(0o644)
    (cp.root / "secret").chmod(0o644)
    assert cp.diff(target) == {"run.sh": pb.CHANGE_KIND_MODIFIED, "secret": pb.CHANGE_KIND_MODIFIED}
    cp.rollback(target)
    assert (cp.root / "run.sh").stat().st_mode & 0o777 == 0o755
    assert (cp.root / "secret").stat().st_mode & 0o777 == 0o600


def test_nested_gitignore_is_honoured_and_ignored_files_are_never_touched(cp):
    write(cp.root, ".gitignore", "*.log\nbuild/\n")
    write(cp.root, "sub/.gitignore", "!keep.log\n*.tmp\n")
    write(cp.root, "app.log", "root log")
    write(cp.root, "sub/keep.log", "kept by negation")
    write(cp.root, "sub/x.tmp", "tmp")
    write(cp.root, "build/out.bin", "artifact")
    write(cp.root, "src.py", "code")
    target = cp.create()
    assert target.file_count == 4  # .gitignore, sub/.gitignore, sub/keep.log, src.py

    write(cp.root, "app.log", "changed log")
    write(cp.root, "sub/x.tmp", "changed tmp")
    write(cp.root, "build/new.bin", "new artifact")
    write(cp.root, "sub/keep.log", "changed keep")
    cp.rollback(target)

    assert (cp.root / "sub/keep.log").read_text() == "kept by negation"
    assert (cp.root / "app.log").read_text() == "changed log"
    assert (cp.root / "sub/x.tmp").read_text() == "changed tmp"
    assert (cp.root / "build/new.bin").read_text() == "new artifact"


def test_file_ignored_by_the_old_gitignore_survives_rolling_back_to_it(cp):
    """The Cline #14367 case: restoring an older .gitignore must not delete untracked files."""
    write(cp.root, ".gitignore", "secrets/\n")
    write(cp.root, "main.py", "v1")
    target = cp.create()

    write(cp.root, ".gitignore", "")
    write(cp.root, "secrets/key.pem", "private key")
    write(cp.root, "main.py", "v2")
    cp.create()
    reply = cp.rollback(target)

    assert (cp.root / "secrets/key.pem").read_text() == "private key"
    assert (cp.root / ".gitignore").read_text() == "secrets/\n"
    assert (cp.root / "main.py").read_text() == "v1"
    assert "secrets/key.pem" not in {c.path for c in reply.changes}


def test_file_ignored_now_but_captured_then_is_restored_and_saved_first(cp):
    write(cp.root, "notes.log", "captured version")
    target = cp.create()
    write(cp.root, ".gitignore", "*.log\n")
    write(cp.root, "notes.log", "ignored now, precious")

    reply = cp.rollback(target)
    assert (cp.root / "notes.log").read_text() == "captured version"
    assert not (cp.root / ".gitignore").exists()
    cp.rollback(reply.safety_checkpoint)
    assert (cp.root / "notes.log").read_text() == "ignored now, precious"


def test_rollback_past_several_checkpoints_including_deleted_files(cp):
    write(cp.root, "a.txt", "a1")
    write(cp.root, "b.txt", "b1")
    first = tree_state(cp.root)
    cp1 = cp.create()
    (cp.root / "b.txt").unlink()
    write(cp.root, "a.txt", "a2")
    cp.create()
    write(cp.root, "c.txt", "c3")
    (cp.root / "a.txt").unlink()
    cp.create()
    write(cp.root, "d.txt", "d4")
    cp.rollback(cp1)
    assert tree_state(cp.root) == first


def test_type_changes_file_to_directory_and_back(cp):
    write(cp.root, "thing", "a file")
    os.mkdir(cp.root / "empty-dir")
    before = tree_state(cp.root)
    target = cp.create()
    (cp.root / "thing").unlink()
    write(cp.root, "thing/inside.txt", "now a dir")
    os.rmdir(cp.root / "empty-dir")
    write(cp.root, "empty-dir", "now a file")
    cp.rollback(target)
    assert tree_state(cp.root) == before


@pytest.mark.parametrize(("name", "reported"), [("thing", "thing"), (os.fsdecode(b"thing\xff"), "thing\\xff")],
                         ids=["utf8", "not-utf8"])
def test_directory_holding_unaccounted_files_is_a_conflict_and_nothing_changes(cp, name, reported):
    """The error names the path; bytes a proto string cannot carry travel as escapes (before,
    such a name made the error's conversion fail and the caller got UNKNOWN)."""
    write(cp.root, ".gitignore", "*.cache\n")
    write(cp.root, name, "a file")
    write(cp.root, "other.txt", "v1")
    target = cp.create()
    (cp.root / name).unlink()
    write(cp.root, f"{name}/data.cache", "ignored, never captured")
    write(cp.root, "other.txt", "v2")
    before = tree_state(cp.root)
    with pytest.raises(grpc.RpcError) as caught:
        cp.rollback(target)
    assert caught.value.code() == grpc.StatusCode.FAILED_PRECONDITION
    info = error_info(caught.value)
    assert info.reason == "ROLLBACK_CONFLICT" and info.metadata["path"] == reported
    assert tree_state(cp.root) == before


def test_oversized_files_are_recorded_as_skipped_and_never_deleted(cp, config_stub):
    config_stub.SetConfig(cfg.SetConfigRequest(key="core.snapshot.max_file_size_bytes", plan_id=cp.id,
                                               value=struct_pb2.Value(number_value=10)))
    write(cp.root, "small.txt", "tiny")
    write(cp.root, "big.bin", b"y" * 100)
    target = cp.create()
    assert [(s.path, s.size_bytes, s.reason) for s in target.skipped_files] == [("big.bin", 100, "FILE_TOO_LARGE")]
    write(cp.root, "big.bin", b"z" * 200)
    cp.rollback(target)
    assert (cp.root / "big.bin").read_bytes() == b"z" * 200


def test_a_skipped_file_whose_name_is_not_utf8_is_named_by_its_raw_bytes(cp, config_stub):
    config_stub.SetConfig(cfg.SetConfigRequest(key="core.snapshot.max_file_size_bytes", plan_id=cp.id,
                                               value=struct_pb2.Value(number_value=10)))
    latin1 = b"caf\xe9.bin"
    write(cp.root, os.fsdecode(latin1), b"y" * 100)
    write(cp.root, "big.bin", b"z" * 50)
    target = cp.create()
    assert sorted((s.path, s.raw_path, s.size_bytes) for s in target.skipped_files) == [
        ("big.bin", b"", 50), ("caf\\xe9.bin", latin1, 100)]
    listed = cp.stub.GetCheckpoint(pb.GetCheckpointRequest(checkpoint_id=target.checkpoint_id)).checkpoint
    assert listed.skipped_files == target.skipped_files


def test_git_directory_is_never_captured_or_touched(cp):
    write(cp.root, ".git/HEAD", "ref: refs/heads/main\n")
    write(cp.root, "code.py", "v1")
    target = cp.create()
    assert target.file_count == 1
    write(cp.root, ".git/HEAD", "ref: refs/heads/other\n")
    write(cp.root, ".git/new-object", "x")
    write(cp.root, "code.py", "v2")
    cp.rollback(target)
    assert (cp.root / ".git/HEAD").read_text() == "ref: refs/heads/other\n"
    assert (cp.root / ".git/new-object").exists()


def test_path_subset_restores_only_those_paths(cp):
    write(cp.root, "a/one.txt", "1")
    write(cp.root, "b/two.txt", "2")
    target = cp.create()
    write(cp.root, "a/one.txt", "changed")
    write(cp.root, "b/two.txt", "changed")
    write(cp.root, "a/extra.txt", "new")
    reply = cp.rollback(target, paths=["a"])
    assert sorted(c.path for c in reply.changes) == ["a/extra.txt", "a/one.txt"]
    assert (cp.root / "a/one.txt").read_text() == "1"
    assert not (cp.root / "a/extra.txt").exists()
    assert (cp.root / "b/two.txt").read_text() == "changed"


def test_names_that_are_not_utf8_are_named_by_their_raw_bytes(cp):
    """A Latin-1 name and a name that spells its escape literally read the same as text;
    raw_path tells them apart, and raw_paths restores exactly the one asked for."""
    root = os.fsencode(cp.root)
    latin1, literal = b"caf\xe9.txt", rb"caf\xe9.txt"
    for name, content in ((latin1, b"latin-1 v1"), (literal, b"literal v1"), (b"other.txt", b"other v1")):
        write(cp.root, os.fsdecode(name), content)
    target = cp.create()
    for name in (latin1, literal, b"other.txt"):
        with open(os.path.join(root, name), "ab") as f:
            f.write(b" changed")
    live = cp.stub.DiffCheckpoints(pb.DiffCheckpointsRequest(base_checkpoint_id=target.checkpoint_id)).changes
    assert sorted((c.path, c.raw_path) for c in live) == [
        ("caf\\xe9.txt", b""), ("caf\\xe9.txt", latin1), ("other.txt", b"")]

    reply = cp.rollback(target, raw_paths=[latin1])
    assert [(c.path, c.raw_path) for c in reply.changes] == [("caf\\xe9.txt", latin1)]
    assert (cp.root / os.fsdecode(latin1)).read_bytes() == b"latin-1 v1"
    assert (cp.root / os.fsdecode(literal)).read_bytes() == b"literal v1 changed"
    reply = cp.rollback(target, paths=["caf\\xe9.txt"])
    assert [(c.path, c.raw_path) for c in reply.changes] == [("caf\\xe9.txt", b"")]
    assert (cp.root / os.fsdecode(literal)).read_bytes() == b"literal v1"
    assert (cp.root / "other.txt").read_bytes() == b"other v1 changed"


def test_raw_paths_are_validated_like_paths(cp):
    target = cp.create()
    for raw in (b"../outside", b"a/\x00b", b"/abs", b"\xff/../x", b""):
        with pytest.raises(grpc.RpcError) as caught:
            cp.rollback(target, raw_paths=[raw])
        assert caught.value.code() == grpc.StatusCode.INVALID_ARGUMENT, raw
        assert error_info(caught.value).reason == "INVALID_PATH", raw


def test_dry_run_reports_and_changes_nothing(cp):
    write(cp.root, "a.txt", "v1")
    target = cp.create()
    write(cp.root, "a.txt", "v2")
    write(cp.root, "b.txt", "new")
    before = tree_state(cp.root)
    count = len(cp.stub.ListCheckpoints(pb.ListCheckpointsRequest(plan_id=cp.id)).checkpoints)
    reply = cp.rollback(target, dry_run=True)
    assert reply.dry_run and not reply.HasField("safety_checkpoint")
    assert {c.path: c.kind for c in reply.changes} == {"a.txt": pb.CHANGE_KIND_MODIFIED,
                                                       "b.txt": pb.CHANGE_KIND_DELETED}
    assert tree_state(cp.root) == before
    assert len(cp.stub.ListCheckpoints(pb.ListCheckpointsRequest(plan_id=cp.id)).checkpoints) == count


def test_rollback_of_a_rollback_restores_the_pre_rollback_workspace(cp):
    write(cp.root, "a.txt", "v1")
    target = cp.create(state=b"state-1")
    write(cp.root, "a.txt", "v2")
    write(cp.root, "untracked-new.txt", "precious")
    before_rollback = tree_state(cp.root)
    reply = cp.rollback(target, current_state=b"state-2")
    assert reply.state == b"state-1"
    safety = reply.safety_checkpoint
    assert safety.phase == pb.PHASE_ROLLBACK_SAFETY and safety.trigger == pb.TRIGGER_ROLLBACK
    assert safety.rollback_target_checkpoint_id == target.checkpoint_id
    undo = cp.rollback(safety)
    assert tree_state(cp.root) == before_rollback
    assert undo.state == b"state-2"


def test_state_scope_touches_no_file(cp):
    write(cp.root, "a.txt", "v1")
    target = cp.create(state=b"old")
    write(cp.root, "a.txt", "v2")
    reply = cp.rollback(target, scope=pb.ROLLBACK_SCOPE_STATE)
    assert reply.state == b"old" and not reply.changes
    assert (cp.root / "a.txt").read_text() == "v2"


def test_files_scope_returns_no_state(cp):
    write(cp.root, "a.txt", "v1")
    target = cp.create(state=b"old")
    write(cp.root, "a.txt", "v2")
    reply = cp.rollback(target, scope=pb.ROLLBACK_SCOPE_FILES)
    assert reply.state == b"" and (cp.root / "a.txt").read_text() == "v1"


def test_rollback_request_id_replay_does_not_roll_back_twice(cp):
    write(cp.root, "a.txt", "v1")
    target = cp.create()
    write(cp.root, "a.txt", "v2")
    request_id = str(uuid.uuid4())
    first = cp.rollback(target, request_id=request_id)
    write(cp.root, "a.txt", "v3 written after the rollback")
    again = cp.rollback(target, request_id=request_id)
    assert again.safety_checkpoint.checkpoint_id == first.safety_checkpoint.checkpoint_id
    assert list(again.changes) == list(first.changes)
    assert (cp.root / "a.txt").read_text() == "v3 written after the rollback"


def test_create_request_id_replay_returns_the_first_checkpoint(cp):
    write(cp.root, "a.txt", "v1")
    request_id = str(uuid.uuid4())
    first = cp.create(request_id=request_id, labels={"k": "v"})
    write(cp.root, "a.txt", "v2")
    again = cp.create(request_id=request_id, labels={"k": "v"})
    assert again == first
    listed = cp.stub.ListCheckpoints(pb.ListCheckpointsRequest(plan_id=cp.id)).checkpoints
    assert len(listed) == 1
    with pytest.raises(grpc.RpcError) as caught:
        cp.create(request_id=request_id, labels={"k": "different"})
    assert error_info(caught.value).reason == "REQUEST_ID_REUSED"


def stored_content(server) -> int:
    """Objects in the database store, or bytes the disk store keeps (packs and large objects)."""
    if server.store_kind == "db":
        return server.object_count()
    return sum(f.stat().st_size for f in (server.data_dir / "store").rglob("*")
               if f.is_file() and "staging" not in f.parts)


def test_unchanged_files_cost_no_new_objects(cp, checkpointd_server):
    for i in range(20):
        write(cp.root, f"f{i}.txt", f"content {i} of {cp.id}")
    first = cp.create()
    before = stored_content(checkpointd_server)
    second = cp.create()
    assert second.tree_digest == first.tree_digest
    assert stored_content(checkpointd_server) == before
    write(cp.root, "f0.txt", f"new content of {cp.id}")
    cp.create()
    assert stored_content(checkpointd_server) > before


def test_diff_between_checkpoints_and_against_live_workspace(cp):
    write(cp.root, "a.txt", "v1")
    write(cp.root, "b.txt", "b")
    one = cp.create()
    write(cp.root, "a.txt", "v2")
    (cp.root / "b.txt").unlink()
    os.symlink("a.txt", cp.root / "b.txt")
    write(cp.root, "c.txt", "c")
    two = cp.create()
    expected = {"a.txt": pb.CHANGE_KIND_MODIFIED, "b.txt": pb.CHANGE_KIND_TYPE_CHANGED,
                "c.txt": pb.CHANGE_KIND_ADDED}
    assert cp.diff(one, two) == expected
    assert cp.diff(one) == expected
    assert cp.diff(one, two, paths=["c.txt"]) == {"c.txt": pb.CHANGE_KIND_ADDED}
    (cp.root / "c.txt").unlink()
    assert cp.diff(two) == {"c.txt": pb.CHANGE_KIND_DELETED}
