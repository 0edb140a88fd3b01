"""Two plans whose workspaces nest: a rollback of either must not silently rewrite the other's files.

Refused with FAILED_PRECONDITION / NESTED_WORKSPACE (naming the other plan), dry run included,
unless the request sets allow_nested_workspaces or the files lie outside what the other plan tracks
(the outer plan ignores the inner directory)."""

from __future__ import annotations

import grpc
import pytest
from google.protobuf import json_format, struct_pb2
from ulid import ULID

from checkpoint.v1 import checkpoint_service_pb2 as pb
from checkpoint.v1 import config_service_pb2 as cfg
from tests.helpers import error_info


def _checkpoint(stub, plan_id, root):
    return stub.CreateCheckpoint(pb.CreateCheckpointRequest(plan_id=plan_id, workspace_root=str(root))).checkpoint


def _rollback(stub, plan_id, checkpoint_id, **kwargs):
    return stub.Rollback(pb.RollbackRequest(plan_id=plan_id, checkpoint_id=checkpoint_id,
                                            scope=pb.ROLLBACK_SCOPE_FILES, **kwargs))


def _refused(stub, plan_id, checkpoint_id, **kwargs):
    with pytest.raises(grpc.RpcError) as caught:
        _rollback(stub, plan_id, checkpoint_id, **kwargs)
    assert caught.value.code() is grpc.StatusCode.FAILED_PRECONDITION, caught.value.details()
    info = error_info(caught.value)
    assert info.reason == "NESTED_WORKSPACE"
    return info, caught.value.details()


@pytest.fixture
def nested(checkpoint_stub, workspace):
    """An outer plan on ``workspace`` and an inner one on ``workspace/inner``, each with one checkpoint,
    then both workspaces edited."""
    inner_root = workspace / "inner"
    inner_root.mkdir()
    (inner_root / "work.txt").write_text("inner v1\n")
    (workspace / "top.txt").write_text("outer v1\n")
    outer, inner = str(ULID()), str(ULID())
    outer_cp = _checkpoint(checkpoint_stub, outer, workspace)
    inner_cp = _checkpoint(checkpoint_stub, inner, inner_root)
    (inner_root / "work.txt").write_text("inner v2\n")
    (workspace / "top.txt").write_text("outer v2\n")
    return workspace, outer, outer_cp, inner, inner_cp


def test_rolling_back_the_outer_plan_refuses_to_rewrite_the_inner_plans_files(checkpoint_stub, nested):
    workspace, outer, outer_cp, inner, _ = nested
    for dry_run in (True, False):
        info, message = _refused(checkpoint_stub, outer, outer_cp.checkpoint_id, dry_run=dry_run)
        assert info.metadata["plan_id"] == inner
        assert info.metadata["workspace_root"] == str(workspace / "inner")
        assert info.metadata["path"] == "inner/work.txt"
        assert inner in message and "allow_nested_workspaces" in message
    assert (workspace / "inner" / "work.txt").read_text() == "inner v2\n"
    assert (workspace / "top.txt").read_text() == "outer v2\n"
    listed = checkpoint_stub.ListCheckpoints(pb.ListCheckpointsRequest(plan_id=outer)).checkpoints
    assert len(listed) == 1, "a refused rollback records no safety checkpoint"

    only_outer = _rollback(checkpoint_stub, outer, outer_cp.checkpoint_id, paths=["top.txt"])
    assert [c.path for c in only_outer.changes] == ["top.txt"] and not only_outer.nested_workspaces
    assert (workspace / "top.txt").read_text() == "outer v1\n"

    allowed = _rollback(checkpoint_stub, outer, outer_cp.checkpoint_id, allow_nested_workspaces=True)
    assert [(n.plan_id, n.workspace_root, n.change_count) for n in allowed.nested_workspaces] == [
        (inner, str(workspace / "inner"), 1)]
    assert (workspace / "inner" / "work.txt").read_text() == "inner v1\n"


def test_rolling_back_the_inner_plan_refuses_to_rewrite_files_the_outer_plan_tracks(checkpoint_stub, nested):
    workspace, outer, _, inner, inner_cp = nested
    info, _ = _refused(checkpoint_stub, inner, inner_cp.checkpoint_id)
    assert info.metadata["plan_id"] == outer and info.metadata["workspace_root"] == str(workspace)
    assert (workspace / "inner" / "work.txt").read_text() == "inner v2\n"
    dry = _rollback(checkpoint_stub, inner, inner_cp.checkpoint_id, dry_run=True, allow_nested_workspaces=True)
    assert dry.dry_run and [n.plan_id for n in dry.nested_workspaces] == [outer]
    assert (workspace / "inner" / "work.txt").read_text() == "inner v2\n"


def test_an_outer_plan_that_ignores_the_inner_workspace_leaves_both_free(checkpoint_stub, config_stub, workspace):
    inner_root = workspace / "inner"
    inner_root.mkdir()
    (inner_root / "work.txt").write_text("inner v1\n")
    (workspace / "top.txt").write_text("outer v1\n")
    outer, inner = str(ULID()), str(ULID())
    config_stub.SetConfig(cfg.SetConfigRequest(key="core.snapshot.ignore_patterns", plan_id=outer,
                                               value=json_format.ParseDict(["/inner/"], struct_pb2.Value())))
    outer_cp = _checkpoint(checkpoint_stub, outer, workspace)
    inner_cp = _checkpoint(checkpoint_stub, inner, inner_root)
    (inner_root / "work.txt").write_text("inner v2\n")
    (workspace / "top.txt").write_text("outer v2\n")
    outer_back = _rollback(checkpoint_stub, outer, outer_cp.checkpoint_id)
    assert [c.path for c in outer_back.changes] == ["top.txt"]
    inner_back = _rollback(checkpoint_stub, inner, inner_cp.checkpoint_id)
    assert [c.path for c in inner_back.changes] == ["work.txt"] and not inner_back.nested_workspaces
    assert (inner_root / "work.txt").read_text() == "inner v1\n"


def test_sibling_workspaces_and_a_shared_root_are_not_nested(checkpoint_stub, workspace):
    (workspace / "a").mkdir()
    (workspace / "ab").mkdir()
    (workspace / "a" / "f").write_text("1")
    (workspace / "ab" / "f").write_text("1")
    first, sibling, same_root = str(ULID()), str(ULID()), str(ULID())
    cp = _checkpoint(checkpoint_stub, first, workspace / "a")
    _checkpoint(checkpoint_stub, sibling, workspace / "ab")
    _checkpoint(checkpoint_stub, same_root, workspace / "a")
    (workspace / "a" / "f").write_text("2")
    back = _rollback(checkpoint_stub, first, cp.checkpoint_id)
    assert [c.path for c in back.changes] == ["f"] and not back.nested_workspaces
