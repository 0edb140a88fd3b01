"""Every caller mistake gets its own status code and ErrorInfo reason, never INTERNAL."""

from __future__ import annotations

import os

import grpc
import pytest
from google.protobuf import struct_pb2
from ulid import ULID

from checkpoint.v1 import checkpoint_service_pb2 as pb
from checkpoint.v1 import config_service_pb2 as cfg
from tests.helpers import error_info

INVALID = grpc.StatusCode.INVALID_ARGUMENT


def expect(code, reason, call, request):
    with pytest.raises(grpc.RpcError) as caught:
        call(request)
    assert (caught.value.code(), error_info(caught.value).reason) == (code, reason), caught.value.details()
    info = error_info(caught.value)
    assert info.domain == "checkpointd"
    return info


@pytest.fixture
def first(checkpoint_stub, workspace, plan_id):
    (workspace / "f.txt").write_text("x")
    return checkpoint_stub.CreateCheckpoint(
        pb.CreateCheckpointRequest(plan_id=plan_id, workspace_root=str(workspace))).checkpoint


@pytest.mark.parametrize("request_fields, code, reason", [
    ({"plan_id": "not-a-ulid"}, INVALID, "INVALID_PLAN_ID"),
    ({"plan_id": "01ARZ3NDEKTSV4RRFFQ69G5FA"}, INVALID, "INVALID_PLAN_ID"),
    ({"trigger": 99}, INVALID, "UNKNOWN_ENUM_VALUE"),
    ({"phase": 42}, INVALID, "UNKNOWN_ENUM_VALUE"),
    ({"trigger": pb.TRIGGER_ON_ERROR, "phase": pb.PHASE_EXECUTE}, INVALID, "INVALID_PHASE"),
    ({"trigger": pb.TRIGGER_ROLLBACK}, INVALID, "INVALID_PHASE"),
    ({"phase": pb.PHASE_ROLLBACK_SAFETY}, INVALID, "INVALID_PHASE"),
    ({"labels": {"Bad Key": "v"}}, INVALID, "INVALID_LABEL"),
    ({"labels": {"k": "v" * 300}}, INVALID, "INVALID_LABEL"),
    ({"labels": {f"k{i}": "v" for i in range(65)}}, INVALID, "INVALID_LABEL"),
    ({"source_tool": "t" * 257}, INVALID, "FIELD_TOO_LONG"),
    ({"description": "d" * 4097}, INVALID, "FIELD_TOO_LONG"),
    ({"request_id": "has space"}, INVALID, "INVALID_REQUEST_ID"),
    ({"request_id": "r" * 129}, INVALID, "INVALID_REQUEST_ID"),
    ({"workspace_root": "relative/path"}, INVALID, "INVALID_WORKSPACE_ROOT"),
    ({"workspace_root": "/etc"}, grpc.StatusCode.PERMISSION_DENIED, "WORKSPACE_ROOT_NOT_ALLOWED"),
])
def test_create_checkpoint_refuses_bad_fields(checkpoint_stub, request_fields, code, reason):
    fields = {"plan_id": str(ULID()), **request_fields}
    expect(code, reason, checkpoint_stub.CreateCheckpoint, pb.CreateCheckpointRequest(**fields))


def test_create_checkpoint_requires_a_plan_id(checkpoint_stub):
    info = expect(INVALID, "MISSING_FIELD", checkpoint_stub.CreateCheckpoint, pb.CreateCheckpointRequest())
    assert info.metadata["field"] == "plan_id"


@pytest.mark.parametrize("value, problem", [
    ("my-plan", "it is 7 characters long; a ULID has 26"),
    ("01ARZ3NDEKTSV4RRFFQ69G5FAI", "characters outside Crockford base32: 'I' (a ULID uses the digits and the letters "
                                   "A-Z except I, L, O and U)"),
    ("01ARZ3NDEKTSV4RRFFQ69G5F-u", "characters outside Crockford base32: '-', 'u'"),
    ("81ARZ3NDEKTSV4RRFFQ69G5FA1", "starts with '8', so it overflows 128 bits: a ULID's first character is 0-7"),
])
def test_a_refused_plan_id_names_its_problem_and_how_to_make_one(checkpoint_stub, value, problem):
    with pytest.raises(grpc.RpcError) as caught:
        checkpoint_stub.ListCheckpoints(pb.ListCheckpointsRequest(plan_id=value))
    assert error_info(caught.value).reason == "INVALID_PLAN_ID"
    assert error_info(caught.value).metadata["value"] == value
    message = caught.value.details()
    assert message.startswith(f"plan_id {value!r} is not a ULID: ") and problem in message, message
    assert "`checkpointd new-plan-id`" in message and "new_plan_id()" in message, message


def test_a_refused_workspace_root_names_the_allowed_roots_and_how_to_add_one(checkpoint_stub, checkpointd_server):
    with pytest.raises(grpc.RpcError) as caught:
        checkpoint_stub.CreateCheckpoint(pb.CreateCheckpointRequest(plan_id=str(ULID()), workspace_root="/etc"))
    info = error_info(caught.value)
    assert (caught.value.code(), info.reason) == (grpc.StatusCode.PERMISSION_DENIED, "WORKSPACE_ROOT_NOT_ALLOWED")
    allowed = os.path.realpath(checkpointd_server.allowed_root)
    assert info.metadata["allowed_workspace_roots"] == allowed
    message = caught.value.details()
    assert f"allowed: {allowed}" in message and "--workspace-root" in message, message
    assert "CHECKPOINTD_WORKSPACE_ROOT" in message, message


def test_workspace_root_outside_allow_list_via_symlink_is_denied(checkpoint_stub, workspace, plan_id):
    os.symlink("/etc", workspace / "etc-link")
    expect(grpc.StatusCode.PERMISSION_DENIED, "WORKSPACE_ROOT_NOT_ALLOWED", checkpoint_stub.CreateCheckpoint,
           pb.CreateCheckpointRequest(plan_id=plan_id, workspace_root=str(workspace / "etc-link")))


def test_workspace_root_that_is_not_a_directory(checkpoint_stub, workspace, plan_id):
    (workspace / "file").write_text("x")
    expect(INVALID, "INVALID_WORKSPACE_ROOT", checkpoint_stub.CreateCheckpoint,
           pb.CreateCheckpointRequest(plan_id=plan_id, workspace_root=str(workspace / "file")))


def test_workspace_root_is_remembered_and_a_different_one_refused(checkpoint_stub, first, checkpointd_server):
    other = checkpointd_server.new_workspace()
    info = expect(grpc.StatusCode.FAILED_PRECONDITION, "WORKSPACE_ROOT_MISMATCH", checkpoint_stub.CreateCheckpoint,
                  pb.CreateCheckpointRequest(plan_id=first.plan_id, workspace_root=str(other)))
    assert info.metadata["plan_workspace_root"] == first.workspace_root
    again = checkpoint_stub.CreateCheckpoint(pb.CreateCheckpointRequest(plan_id=first.plan_id)).checkpoint
    assert again.has_files and again.workspace_root == first.workspace_root and again.sequence == 2


def test_a_state_only_plan_takes_a_root_later_and_keeps_it(checkpoint_stub, workspace, plan_id, checkpointd_server):
    create = checkpoint_stub.CreateCheckpoint
    assert not create(pb.CreateCheckpointRequest(plan_id=plan_id, state=b"s1")).checkpoint.has_files
    with_root = create(pb.CreateCheckpointRequest(plan_id=plan_id, workspace_root=str(workspace))).checkpoint
    assert with_root.has_files and with_root.sequence == 2
    remembered = create(pb.CreateCheckpointRequest(plan_id=plan_id, state=b"s3")).checkpoint
    assert remembered.has_files and remembered.workspace_root == with_root.workspace_root and remembered.sequence == 3
    expect(grpc.StatusCode.FAILED_PRECONDITION, "WORKSPACE_ROOT_MISMATCH", create,
           pb.CreateCheckpointRequest(plan_id=plan_id, workspace_root=str(checkpointd_server.new_workspace())))


def test_get_and_delete_unknown_or_malformed_ids(checkpoint_stub):
    missing = str(ULID())
    info = expect(grpc.StatusCode.NOT_FOUND, "CHECKPOINT_NOT_FOUND", checkpoint_stub.GetCheckpoint,
                  pb.GetCheckpointRequest(checkpoint_id=missing))
    assert info.metadata["checkpoint_id"] == missing
    expect(INVALID, "INVALID_CHECKPOINT_ID", checkpoint_stub.GetCheckpoint, pb.GetCheckpointRequest(checkpoint_id="x"))
    expect(INVALID, "MISSING_FIELD", checkpoint_stub.GetCheckpoint, pb.GetCheckpointRequest())
    expect(INVALID, "UNKNOWN_ENUM_VALUE", checkpoint_stub.GetCheckpoint,
           pb.GetCheckpointRequest(checkpoint_id=missing, view=7))
    expect(grpc.StatusCode.NOT_FOUND, "CHECKPOINT_NOT_FOUND", checkpoint_stub.DeleteCheckpoint,
           pb.DeleteCheckpointRequest(checkpoint_id=missing))


def test_list_refuses_bad_paging_and_filters(checkpoint_stub, first):
    plan = first.plan_id
    expect(INVALID, "INVALID_PAGE_SIZE", checkpoint_stub.ListCheckpoints,
           pb.ListCheckpointsRequest(plan_id=plan, page_size=-1))
    expect(INVALID, "INVALID_PAGE_TOKEN", checkpoint_stub.ListCheckpoints,
           pb.ListCheckpointsRequest(plan_id=plan, page_token="forged"))
    for bad in ['phase = "nope"', 'colour = "red"', 'phase = on_error', 'phase = "x" OR trigger = "y"',
                'phase = "on_error" AND', 'trigger = "sometimes"']:
        expect(INVALID, "INVALID_FILTER", checkpoint_stub.ListCheckpoints,
               pb.ListCheckpointsRequest(plan_id=plan, filter=bad))


def test_page_token_is_bound_to_its_query(checkpoint_stub, workspace, plan_id):
    for _ in range(3):
        checkpoint_stub.CreateCheckpoint(pb.CreateCheckpointRequest(plan_id=plan_id, workspace_root=str(workspace)))
    page = checkpoint_stub.ListCheckpoints(pb.ListCheckpointsRequest(plan_id=plan_id, page_size=1))
    assert page.next_page_token
    expect(INVALID, "INVALID_PAGE_TOKEN", checkpoint_stub.ListCheckpoints,
           pb.ListCheckpointsRequest(plan_id=plan_id, page_token=page.next_page_token, filter='phase = "manual"'))
    expect(INVALID, "INVALID_PAGE_TOKEN", checkpoint_stub.ListCheckpoints,
           pb.ListCheckpointsRequest(plan_id=str(ULID()), page_token=page.next_page_token))


def test_rollback_errors(checkpoint_stub, first, plan_id, checkpointd_server):
    expect(grpc.StatusCode.NOT_FOUND, "CHECKPOINT_NOT_FOUND", checkpoint_stub.Rollback,
           pb.RollbackRequest(plan_id=first.plan_id, checkpoint_id=str(ULID())))
    expect(grpc.StatusCode.FAILED_PRECONDITION, "CHECKPOINT_PLAN_MISMATCH", checkpoint_stub.Rollback,
           pb.RollbackRequest(plan_id=str(ULID()), checkpoint_id=first.checkpoint_id))
    expect(INVALID, "UNKNOWN_ENUM_VALUE", checkpoint_stub.Rollback,
           pb.RollbackRequest(plan_id=first.plan_id, checkpoint_id=first.checkpoint_id, scope=9))
    for bad_path in ["/etc/passwd", "../escape", "a/../../b", "a//b", "./a", ""]:
        info = expect(INVALID, "INVALID_PATH", checkpoint_stub.Rollback,
                      pb.RollbackRequest(plan_id=first.plan_id, checkpoint_id=first.checkpoint_id, paths=[bad_path]))
        assert info.metadata["path"] == bad_path
    state_only_plan = str(ULID())
    state_only = checkpoint_stub.CreateCheckpoint(
        pb.CreateCheckpointRequest(plan_id=state_only_plan, state=b"s")).checkpoint
    assert not state_only.has_files
    expect(grpc.StatusCode.FAILED_PRECONDITION, "NO_WORKSPACE", checkpoint_stub.Rollback,
           pb.RollbackRequest(plan_id=state_only_plan, checkpoint_id=state_only.checkpoint_id,
                              scope=pb.ROLLBACK_SCOPE_FILES))
    reply = checkpoint_stub.Rollback(pb.RollbackRequest(plan_id=state_only_plan,
                                                        checkpoint_id=state_only.checkpoint_id))
    assert reply.state == b"s" and not reply.changes


def test_diff_errors(checkpoint_stub, first):
    other_plan = checkpoint_stub.CreateCheckpoint(pb.CreateCheckpointRequest(plan_id=str(ULID()))).checkpoint
    expect(grpc.StatusCode.FAILED_PRECONDITION, "CHECKPOINT_PLAN_MISMATCH", checkpoint_stub.DiffCheckpoints,
           pb.DiffCheckpointsRequest(base_checkpoint_id=first.checkpoint_id,
                                     target_checkpoint_id=other_plan.checkpoint_id))
    expect(grpc.StatusCode.FAILED_PRECONDITION, "NO_WORKSPACE", checkpoint_stub.DiffCheckpoints,
           pb.DiffCheckpointsRequest(base_checkpoint_id=other_plan.checkpoint_id))
    expect(INVALID, "INVALID_CHECKPOINT_ID", checkpoint_stub.DiffCheckpoints,
           pb.DiffCheckpointsRequest(base_checkpoint_id=first.checkpoint_id, target_checkpoint_id="nope"))


def test_workspace_that_vanished_is_a_failed_precondition(checkpoint_stub, first):
    root = first.workspace_root
    os.rename(root, root + "-moved")
    try:
        expect(grpc.StatusCode.FAILED_PRECONDITION, "WORKSPACE_UNAVAILABLE", checkpoint_stub.CreateCheckpoint,
               pb.CreateCheckpointRequest(plan_id=first.plan_id))
    finally:
        os.rename(root + "-moved", root)


def test_config_errors(config_stub):
    expect(INVALID, "UNKNOWN_CONFIG_KEY", config_stub.GetConfig, cfg.GetConfigRequest(key="core.nope"))
    expect(INVALID, "UNKNOWN_CONFIG_KEY", config_stub.SetConfig,
           cfg.SetConfigRequest(key="core.nope", value=struct_pb2.Value(string_value="x")))
    triggers = struct_pb2.Value()
    triggers.list_value.values.add().string_value = "on_tuesday"
    info = expect(INVALID, "INVALID_CONFIG_VALUE", config_stub.SetConfig,
                  cfg.SetConfigRequest(key="core.checkpoints.auto_create_on", value=triggers))
    assert "on_tuesday" in info.metadata["detail"]
    expect(INVALID, "INVALID_CONFIG_VALUE", config_stub.SetConfig,
           cfg.SetConfigRequest(key="core.checkpoints.on_unavailable", value=struct_pb2.Value(string_value="maybe")))
    expect(INVALID, "INVALID_CONFIG_VALUE", config_stub.SetConfig,
           cfg.SetConfigRequest(key="core.checkpoints.client_deadline_ms", value=struct_pb2.Value(number_value=1.5)))
    expect(INVALID, "INVALID_PLAN_ID", config_stub.GetConfig,
           cfg.GetConfigRequest(key="core.checkpoints.auto_create_on", plan_id="bad"))
    with pytest.raises(grpc.RpcError) as caught:
        next(iter(config_stub.WatchConfig(cfg.WatchConfigRequest(keys=["core.nope"]), timeout=5)))
    assert error_info(caught.value).reason == "UNKNOWN_CONFIG_KEY"


def test_the_contract_reason_list_and_the_domain_reasons_are_the_same_set():
    from checkpoint.v1 import errors_pb2
    from checkpointd.core.kernel.errors import Reason

    contract = {n.removeprefix("ERROR_REASON_") for n in errors_pb2.ErrorReason.keys()} - {"UNSPECIFIED"}  # noqa: SIM118
    assert contract == {r.value for r in Reason}
