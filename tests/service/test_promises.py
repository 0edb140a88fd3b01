"""The README's and the proto's promises, one test each, over a real server.

Each test here was written from what a user is told, and each was seen to fail with a plausible
bug planted in the server (tests/mutation/critical/ keeps those bugs as patches and checks that
they are still caught):

- a rollback never deletes what the target did not account for: files it skipped for size, files
  its ignore rules (including the configured ``core.snapshot.ignore_patterns``) left out;
- the configured ignore patterns apply at capture;
- directory permission bits are restored;
- a Rollback request_id is bound to the whole request, dry_run included (AIP-155);
- ListCheckpoints lowers a page_size above 1000 to 1000.
"""

from __future__ import annotations

import stat
import uuid
from concurrent.futures import ThreadPoolExecutor

import grpc
import pytest
from google.protobuf import struct_pb2

from checkpoint.v1 import checkpoint_service_pb2 as pb
from checkpoint.v1 import config_service_pb2 as cfg
from tests.helpers import error_info, tree_state


def _value(python: object) -> struct_pb2.Value:
    value = struct_pb2.Value()
    if isinstance(python, list):
        value.list_value.values.extend(struct_pb2.Value(string_value=item) for item in python)
    else:
        value.number_value = python
    return value


@pytest.fixture
def plan(checkpoint_stub, config_stub, workspace, plan_id):
    """Shortcuts bound to one plan and its workspace."""

    class Plan:
        root = workspace
        id = plan_id
        stub = checkpoint_stub

        def configure(self, key: str, value: object) -> None:
            config_stub.SetConfig(cfg.SetConfigRequest(key=key, plan_id=plan_id, value=_value(value)), timeout=10)

        def create(self, **kwargs) -> pb.Checkpoint:
            request = pb.CreateCheckpointRequest(plan_id=plan_id, workspace_root=str(workspace), **kwargs)
            return checkpoint_stub.CreateCheckpoint(request, timeout=60).checkpoint

        def rollback(self, target: pb.Checkpoint, **kwargs) -> pb.RollbackResponse:
            request = pb.RollbackRequest(plan_id=plan_id, checkpoint_id=target.checkpoint_id, **kwargs)
            return checkpoint_stub.Rollback(request, timeout=60)

        def count(self) -> int:
            return len(checkpoint_stub.ListCheckpoints(pb.ListCheckpointsRequest(plan_id=plan_id, page_size=1000),
                                                       timeout=10).checkpoints)

    return Plan()


def write(root, rel: str, content: bytes | str = "x"):
    path = root / rel
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(content.encode() if isinstance(content, str) else content)
    return path


# -- "never deletes what the target checkpoint does not account for" ---------------------------


def test_a_file_the_target_skipped_for_size_is_never_deleted_by_a_rollback_to_it(plan):
    """README: larger files are "recorded as skipped, never silently dropped, never deleted by a
    rollback". Here they have since become small enough to be captured, so the live workspace
    holds them and the target does not: only the target's skipped list keeps them."""
    plan.configure("core.snapshot.max_file_size_bytes", 10)
    write(plan.root, "small.txt", "tiny")
    write(plan.root, "big.bin", b"y" * 100)
    write(plan.root, "deep/huge.bin", b"h" * 100)
    write(plan.root, "deep/kept.txt", "kept")
    target = plan.create()
    assert sorted(s.path for s in target.skipped_files) == ["big.bin", "deep/huge.bin"]

    plan.configure("core.snapshot.max_file_size_bytes", 1_000_000)
    write(plan.root, "big.bin", "now small")
    write(plan.root, "deep/huge.bin", "small too")
    write(plan.root, "small.txt", "changed")
    reply = plan.rollback(target)

    assert (plan.root / "big.bin").read_text() == "now small"
    assert (plan.root / "deep/huge.bin").read_text() == "small too"
    assert (plan.root / "small.txt").read_text() == "tiny"
    assert {c.path for c in reply.changes} == {"small.txt"}


def test_configured_ignore_patterns_leave_files_out_of_a_checkpoint_and_out_of_its_rollback(plan):
    """README: core.snapshot.ignore_patterns are extra gitignore patterns; a rollback leaves
    files the target's ignore rules left out alone."""
    plan.configure("core.snapshot.ignore_patterns", ["*.log", "cache/"])
    write(plan.root, "code.py", "v1")
    write(plan.root, "debug.log", "log v1")
    write(plan.root, "cache/blob.bin", "cached")
    target = plan.create()
    assert target.file_count == 1

    write(plan.root, "code.py", "v2")
    write(plan.root, "debug.log", "log v2")
    write(plan.root, "cache/new.bin", "new cache entry")
    diff = plan.stub.DiffCheckpoints(pb.DiffCheckpointsRequest(base_checkpoint_id=target.checkpoint_id), timeout=60)
    assert [c.path for c in diff.changes] == ["code.py"]
    plan.rollback(target)

    assert (plan.root / "code.py").read_text() == "v1"
    assert (plan.root / "debug.log").read_text() == "log v2"
    assert (plan.root / "cache/blob.bin").read_text() == "cached"
    assert (plan.root / "cache/new.bin").read_text() == "new cache entry"


def test_a_rollback_keeps_files_the_targets_configured_patterns_ignored_though_they_no_longer_apply(plan):
    """The patterns that count are those the target was captured with: a file they ignored was
    never accounted for by the target, so a rollback to it must not delete it, even after the
    patterns changed and the file is captured now."""
    plan.configure("core.snapshot.ignore_patterns", ["*.log", "scratch/"])
    write(plan.root, "code.py", "v1")
    target = plan.create()

    plan.configure("core.snapshot.ignore_patterns", [])
    write(plan.root, "precious.log", "not in any checkpoint before now")
    write(plan.root, "scratch/notes.txt", "nor this")
    write(plan.root, "code.py", "v2")
    reply = plan.rollback(target)

    assert (plan.root / "precious.log").read_text() == "not in any checkpoint before now"
    assert (plan.root / "scratch/notes.txt").read_text() == "nor this"
    assert (plan.root / "code.py").read_text() == "v1"
    assert {c.path for c in reply.changes} == {"code.py"}


def test_a_rollback_that_would_replace_a_directory_holding_ignored_files_changes_nothing(plan):
    """README: "If a rollback cannot proceed without destroying such a file ... it refuses with
    FAILED_PRECONDITION / ROLLBACK_CONFLICT and changes nothing": the refusal comes before any
    change, so no file is touched (not even removed and put back) and no safety checkpoint is
    recorded."""
    write(plan.root, ".gitignore", "*.cache\n")
    write(plan.root, "thing", "a file")
    target = plan.create()
    (plan.root / "thing").unlink()
    write(plan.root, "thing/data.cache", "ignored, never captured")
    write(plan.root, "new/deeper/still/extra.txt", "created after the target")
    before = tree_state(plan.root)
    inodes = {path: (plan.root / path).stat().st_ino for path in before}
    count = plan.count()

    with pytest.raises(grpc.RpcError) as caught:
        plan.rollback(target)

    assert caught.value.code() == grpc.StatusCode.FAILED_PRECONDITION
    assert error_info(caught.value).reason == "ROLLBACK_CONFLICT"
    assert tree_state(plan.root) == before
    assert {path: (plan.root / path).stat().st_ino for path in before} == inodes
    assert plan.count() == count


def test_a_rollback_of_one_path_recreates_its_missing_or_replaced_parents(plan):
    """Restoring only ``paths`` still creates what they need above them: a parent directory
    deleted since, or replaced by a file (which the safety checkpoint keeps)."""
    write(plan.root, "gone/deep/file.txt", "v1")
    write(plan.root, "flipped/file.txt", "v1")
    write(plan.root, "untouched/file.txt", "v1")
    write(plan.root, "untouched/deleted.txt", "v1")
    write(plan.root, "untouched/mode.d/file.txt", "v1")
    target = plan.create()
    (plan.root / "untouched/deleted.txt").unlink()
    (plan.root / "untouched/mode.d/file.txt").unlink()
    (plan.root / "untouched/mode.d").rmdir()
    write(plan.root, "untouched/mode.d", "now a file")
    for name in ("gone/deep/file.txt", "flipped/file.txt"):
        (plan.root / name).unlink()
    (plan.root / "gone/deep").rmdir()
    (plan.root / "gone").rmdir()
    (plan.root / "flipped").rmdir()
    write(plan.root, "flipped", "a file where the directory was")
    write(plan.root, "untouched/file.txt", "v2")

    reply = plan.rollback(target, paths=["gone/deep/file.txt", "flipped/file.txt"])

    assert (plan.root / "gone/deep/file.txt").read_text() == "v1"
    assert (plan.root / "flipped/file.txt").read_text() == "v1"
    assert (plan.root / "untouched/file.txt").read_text() == "v2"
    assert not (plan.root / "untouched/deleted.txt").exists()
    assert (plan.root / "untouched/mode.d").read_text() == "now a file"
    assert {c.path for c in reply.changes} == {"gone", "gone/deep", "gone/deep/file.txt", "flipped", "flipped/file.txt"}
    undo = plan.rollback(reply.safety_checkpoint)
    assert (plan.root / "flipped").read_text() == "a file where the directory was"
    assert not (plan.root / "gone").exists()
    assert undo.safety_checkpoint.checkpoint_id


def test_a_directory_only_pattern_keeps_directories_but_not_a_file_of_that_name(plan):
    """``cache/`` ignores directories named cache, not files: the target accounts for a file
    named cache (it would have captured one), so a rollback deletes a file created there since,
    while a directory of that name, ignored by the target, stays."""
    plan.configure("core.snapshot.ignore_patterns", ["cache/"])
    write(plan.root, "code.py", "v1")
    target = plan.create()
    write(plan.root, "cache", "a file, which the pattern does not ignore")
    write(plan.root, "sub/cache/blob.bin", "an ignored directory's content")

    plan.rollback(target)

    assert not (plan.root / "cache").exists()
    assert (plan.root / "sub/cache/blob.bin").read_text() == "an ignored directory's content"


# -- "exact for every captured path (... permission bits ...)" ---------------------------------


def test_directory_permission_bits_are_restored(plan):
    write(plan.root, "private/key", "k")
    write(plan.root, "shared/readme", "r")
    write(plan.root, "sealed/inner/file", "f")
    (plan.root / "private").chmod(0o700)
    (plan.root / "shared").chmod(0o755)
    (plan.root / "sealed/inner").chmod(0o750)
    (plan.root / "sealed").chmod(0o555)
    before = tree_state(plan.root)
    target = plan.create()

    (plan.root / "private").chmod(0o777)
    (plan.root / "shared").chmod(0o700)
    (plan.root / "sealed").chmod(0o755)
    (plan.root / "sealed/inner/file").unlink()
    (plan.root / "sealed/inner").rmdir()
    plan.rollback(target)

    assert tree_state(plan.root) == before
    modes = {name: stat.S_IMODE((plan.root / name).stat().st_mode)
             for name in ("private", "shared", "sealed", "sealed/inner")}
    assert modes == {"private": 0o700, "shared": 0o755, "sealed": 0o555, "sealed/inner": 0o750}


# -- request_id (AIP-155): "a repeat with the same key returns the first result" ----------------


def test_a_rollback_request_id_is_refused_for_a_dry_run_of_the_same_rollback(plan):
    """A dry run is a different request: replaying the real rollback's result to it would
    report changes as made (and a safety checkpoint) although the caller asked for a preview."""
    write(plan.root, "a.txt", "v1")
    target = plan.create()
    write(plan.root, "a.txt", "v2")
    request_id = str(uuid.uuid4())
    done = plan.rollback(target, request_id=request_id)
    assert not done.dry_run and done.HasField("safety_checkpoint")
    write(plan.root, "a.txt", "v3")
    count = plan.count()

    with pytest.raises(grpc.RpcError) as caught:
        plan.rollback(target, request_id=request_id, dry_run=True)

    assert caught.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert error_info(caught.value).reason == "REQUEST_ID_REUSED"
    assert (plan.root / "a.txt").read_text() == "v3"
    assert plan.count() == count


def test_a_dry_runs_request_id_never_turns_a_real_rollback_into_a_preview(plan):
    """The reverse order: the real rollback that follows a dry run with the same request_id is
    either refused as REQUEST_ID_REUSED (changing nothing) or really done; never answered with
    the dry run's result."""
    write(plan.root, "a.txt", "v1")
    target = plan.create()
    write(plan.root, "a.txt", "v2")
    request_id = str(uuid.uuid4())
    preview = plan.rollback(target, request_id=request_id, dry_run=True)
    assert preview.dry_run and not preview.HasField("safety_checkpoint")
    assert (plan.root / "a.txt").read_text() == "v2"

    try:
        done = plan.rollback(target, request_id=request_id)
    except grpc.RpcError as refused:
        assert refused.code() == grpc.StatusCode.INVALID_ARGUMENT
        assert error_info(refused).reason == "REQUEST_ID_REUSED"
        assert (plan.root / "a.txt").read_text() == "v2"
    else:
        assert not done.dry_run and done.HasField("safety_checkpoint")
        assert (plan.root / "a.txt").read_text() == "v1"


ROLLBACK_VARIANTS = {
    "another checkpoint": lambda first, other: {"checkpoint_id": other.checkpoint_id},
    "another scope": lambda first, other: {"scope": pb.ROLLBACK_SCOPE_FILES},
    "other paths": lambda first, other: {"paths": ["a.txt"]},
    "another current state": lambda first, other: {"current_state": b"someone else's state"},
    "nested workspaces allowed": lambda first, other: {"allow_nested_workspaces": True},
}


@pytest.mark.parametrize("variant", ROLLBACK_VARIANTS)
def test_a_rollback_request_id_is_bound_to_every_field_of_its_request(plan, variant):
    write(plan.root, "a.txt", "v1")
    write(plan.root, "b.txt", "v1")
    first = plan.create()
    write(plan.root, "a.txt", "v2")
    other = plan.create()
    write(plan.root, "a.txt", "v3")
    request_id = str(uuid.uuid4())
    plan.rollback(first, request_id=request_id, current_state=b"state")
    write(plan.root, "a.txt", "v4")
    count = plan.count()
    fields = {"checkpoint_id": first.checkpoint_id, "current_state": b"state",
              **ROLLBACK_VARIANTS[variant](first, other)}

    with pytest.raises(grpc.RpcError) as caught:
        plan.stub.Rollback(pb.RollbackRequest(plan_id=plan.id, request_id=request_id, **fields), timeout=60)

    assert caught.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert error_info(caught.value).reason == "REQUEST_ID_REUSED"
    assert (plan.root / "a.txt").read_text() == "v4"
    assert plan.count() == count


CREATE_VARIANTS = {
    "another state": {"state": b"other state"},
    "another description": {"description": "other"},
    "another source tool": {"source_tool": "other/tool"},
    "other labels": {"labels": {"k": "other"}},
    "another trigger": {"trigger": pb.TRIGGER_BEFORE_TOOL_EXECUTE},
    "no workspace root": {"workspace_root": ""},
}


@pytest.mark.parametrize("variant", CREATE_VARIANTS)
def test_a_create_request_id_is_bound_to_every_field_of_its_request(plan, variant):
    write(plan.root, "a.txt", "v1")
    fields = {"state": b"state", "description": "d", "source_tool": "t", "labels": {"k": "v"},
              "workspace_root": str(plan.root)}
    request_id = str(uuid.uuid4())
    first = plan.stub.CreateCheckpoint(pb.CreateCheckpointRequest(plan_id=plan.id, request_id=request_id, **fields),
                                       timeout=60).checkpoint
    assert plan.stub.CreateCheckpoint(pb.CreateCheckpointRequest(plan_id=plan.id, request_id=request_id, **fields),
                                      timeout=60).checkpoint == first

    with pytest.raises(grpc.RpcError) as caught:
        plan.stub.CreateCheckpoint(pb.CreateCheckpointRequest(
            plan_id=plan.id, request_id=request_id, **{**fields, **CREATE_VARIANTS[variant]}), timeout=60)

    assert caught.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert error_info(caught.value).reason == "REQUEST_ID_REUSED"
    assert plan.count() == 1


# -- "Workspace roots outside the allow-list are PERMISSION_DENIED" -----------------------------


def test_a_directory_beside_the_allowed_root_whose_name_extends_it_is_not_allowed(checkpoint_stub, checkpointd_server,
                                                                                   plan_id):
    """``/x/workspaces-evil`` starts with the characters of the allowed ``/x/workspaces``, but is
    not under it."""
    sibling = checkpointd_server.allowed_root.with_name(checkpointd_server.allowed_root.name + "-evil")
    sibling.mkdir(exist_ok=True)
    (sibling / "secret.txt").write_text("outside the allow-list")

    with pytest.raises(grpc.RpcError) as caught:
        checkpoint_stub.CreateCheckpoint(pb.CreateCheckpointRequest(plan_id=plan_id, workspace_root=str(sibling)),
                                         timeout=60)

    assert caught.value.code() == grpc.StatusCode.PERMISSION_DENIED
    assert error_info(caught.value).reason == "WORKSPACE_ROOT_NOT_ALLOWED"


# -- paging (AIP-158): "at most 1000 (larger values are lowered to 1000)" ----------------------


def test_a_page_size_above_the_maximum_is_lowered_to_1000(checkpoint_stub, plan_id):
    def create(index: int) -> None:
        checkpoint_stub.CreateCheckpoint(pb.CreateCheckpointRequest(plan_id=plan_id, state=b"%d" % index),
                                         timeout=60)

    create(0)  # the plan exists before the concurrent creates
    with ThreadPoolExecutor(8) as pool:
        list(pool.map(create, range(1, 1001)))

    for asked in (1001, 5000, 2**31 - 1):
        page = checkpoint_stub.ListCheckpoints(pb.ListCheckpointsRequest(plan_id=plan_id, page_size=asked),
                                               timeout=60)
        assert len(page.checkpoints) == 1000, asked
        assert page.next_page_token, asked
    rest = checkpoint_stub.ListCheckpoints(pb.ListCheckpointsRequest(
        plan_id=plan_id, page_size=5000, page_token=page.next_page_token), timeout=60)
    assert [c.sequence for c in rest.checkpoints] == [1] and not rest.next_page_token
