"""ListCheckpoints: newest first, AIP-158 paging, AIP-160 filter."""

from __future__ import annotations

import base64
import hashlib
import json

import grpc
import pytest
from ulid import ULID

from checkpoint.v1 import checkpoint_service_pb2 as pb
from tests.helpers import error_info


def _create(stub, plan_id, **kwargs):
    return stub.CreateCheckpoint(pb.CreateCheckpointRequest(plan_id=plan_id, **kwargs)).checkpoint


def test_pages_walk_every_checkpoint_newest_first_without_gaps(checkpoint_stub, plan_id):
    created = [_create(checkpoint_stub, plan_id, state=f"s{i}".encode()) for i in range(7)]
    assert [c.sequence for c in created] == list(range(1, 8))
    seen, token = [], ""
    while True:
        page = checkpoint_stub.ListCheckpoints(pb.ListCheckpointsRequest(plan_id=plan_id, page_size=3,
                                                                         page_token=token))
        assert len(page.checkpoints) <= 3
        seen += page.checkpoints
        token = page.next_page_token
        if not token:
            break
    assert [c.checkpoint_id for c in seen] == [c.checkpoint_id for c in reversed(created)]
    assert all(c.state == b"" for c in seen)


def test_default_and_maximum_page_size(checkpoint_stub, plan_id):
    for _ in range(55):
        _create(checkpoint_stub, plan_id)
    default = checkpoint_stub.ListCheckpoints(pb.ListCheckpointsRequest(plan_id=plan_id))
    assert len(default.checkpoints) == 50 and default.next_page_token
    capped = checkpoint_stub.ListCheckpoints(pb.ListCheckpointsRequest(plan_id=plan_id, page_size=5000))
    assert len(capped.checkpoints) == 55 and not capped.next_page_token


def test_filter_by_phase_trigger_source_tool_and_labels(checkpoint_stub, workspace, plan_id):
    root = str(workspace)
    before = _create(checkpoint_stub, plan_id, workspace_root=root, trigger=pb.TRIGGER_BEFORE_TOOL_EXECUTE,
                     source_tool="local/write-file")
    _create(checkpoint_stub, plan_id, trigger=pb.TRIGGER_AFTER_TOOL_EXECUTE, source_tool="local/write-file")
    spawn = _create(checkpoint_stub, plan_id, trigger=pb.TRIGGER_ON_SUBPLAN_SPAWN,
                    source_tool="subplan_execution_service", labels={"child_plan_id": "01ARZ3NDEKTSV4RRFFQ69G5FAA"})
    error = _create(checkpoint_stub, plan_id, trigger=pb.TRIGGER_ON_ERROR, labels={"error_type": "ValueError"})
    manual = _create(checkpoint_stub, plan_id, phase=pb.PHASE_EXECUTE, description="by hand")

    def ids(text):
        reply = checkpoint_stub.ListCheckpoints(pb.ListCheckpointsRequest(plan_id=plan_id, filter=text))
        return [c.checkpoint_id for c in reply.checkpoints]

    assert spawn.phase == pb.PHASE_EXECUTE and error.phase == pb.PHASE_ON_ERROR
    assert manual.trigger == pb.TRIGGER_MANUAL and manual.phase == pb.PHASE_EXECUTE
    assert ids('phase = "before_tool_execute"') == [before.checkpoint_id]
    assert ids('phase = "execute"') == [manual.checkpoint_id, spawn.checkpoint_id]
    assert ids('phase = "execute" AND trigger = "on_subplan_spawn"') == [spawn.checkpoint_id]
    assert len(ids('source_tool = "local/write-file"')) == 2
    assert ids('labels.child_plan_id = "01ARZ3NDEKTSV4RRFFQ69G5FAA"') == [spawn.checkpoint_id]
    assert ids('labels.error_type = "ValueError" AND phase = "on_error"') == [error.checkpoint_id]
    assert ids('labels.error_type = "KeyError"') == []


def test_filtered_paging(checkpoint_stub, plan_id):
    wanted = [_create(checkpoint_stub, plan_id, labels={"kind": "a" if i % 2 else "b"}) for i in range(9)]
    expected = [c.checkpoint_id for c in reversed(wanted) if c.labels["kind"] == "a"]
    seen, token = [], ""
    while True:
        page = checkpoint_stub.ListCheckpoints(pb.ListCheckpointsRequest(
            plan_id=plan_id, page_size=2, page_token=token, filter='labels.kind = "a"'))
        seen += [c.checkpoint_id for c in page.checkpoints]
        token = page.next_page_token
        if not token:
            break
    assert seen == expected


def test_unknown_plan_lists_nothing(checkpoint_stub, plan_id):
    assert not checkpoint_stub.ListCheckpoints(pb.ListCheckpointsRequest(plan_id=plan_id)).checkpoints


def test_delete_keeps_other_checkpoints_restorable(checkpoint_stub, workspace, plan_id):
    (workspace / "shared.txt").write_text("same content in both")
    one = _create(checkpoint_stub, plan_id, workspace_root=str(workspace))
    two = _create(checkpoint_stub, plan_id)
    checkpoint_stub.DeleteCheckpoint(pb.DeleteCheckpointRequest(checkpoint_id=one.checkpoint_id))
    (workspace / "shared.txt").write_text("changed")
    checkpoint_stub.Rollback(pb.RollbackRequest(plan_id=plan_id, checkpoint_id=two.checkpoint_id))
    assert (workspace / "shared.txt").read_text() == "same content in both"
    listed = checkpoint_stub.ListCheckpoints(pb.ListCheckpointsRequest(plan_id=plan_id)).checkpoints
    assert one.checkpoint_id not in {c.checkpoint_id for c in listed}


def test_get_full_view_returns_state(checkpoint_stub, plan_id):
    created = _create(checkpoint_stub, plan_id, state=b"\x00opaque\xff")
    basic = checkpoint_stub.GetCheckpoint(pb.GetCheckpointRequest(checkpoint_id=created.checkpoint_id)).checkpoint
    full = checkpoint_stub.GetCheckpoint(pb.GetCheckpointRequest(checkpoint_id=created.checkpoint_id,
                                                                 view=pb.CHECKPOINT_VIEW_FULL)).checkpoint
    assert basic.state == b"" and basic.state_size_bytes == 8
    assert full.state == b"\x00opaque\xff"


def _refusal(stub, **request) -> grpc.RpcError:
    with pytest.raises(grpc.RpcError) as refused:
        stub.ListCheckpoints(pb.ListCheckpointsRequest(**request), timeout=30)
    return refused.value


def _legacy_token(plan_id: str, filter_text: str, sequence: int) -> str:
    """A token as the server used to make them: its check value any client could compute."""
    key = hashlib.sha256(f"{plan_id}\0{filter_text}".encode()).hexdigest()[:16]
    return base64.urlsafe_b64encode(json.dumps({"q": key, "s": sequence}).encode()).decode().rstrip("=")


def test_page_tokens_the_server_did_not_issue_are_refused(checkpoint_stub, plan_id):
    """A token is bound to its plan, its filter and its position by a MAC only the server can
    make; anything else is INVALID_ARGUMENT / INVALID_PAGE_TOKEN, however well-formed."""
    for i in range(4):
        _create(checkpoint_stub, plan_id, labels={"k": "v"}, state=f"s{i}".encode())
    other_plan = str(ULID())
    _create(checkpoint_stub, other_plan)
    _create(checkpoint_stub, other_plan)
    token = checkpoint_stub.ListCheckpoints(pb.ListCheckpointsRequest(plan_id=plan_id, page_size=1)).next_page_token
    filtered = checkpoint_stub.ListCheckpoints(pb.ListCheckpointsRequest(
        plan_id=plan_id, page_size=1, filter='labels.k = "v"')).next_page_token
    of_other_plan = checkpoint_stub.ListCheckpoints(pb.ListCheckpointsRequest(
        plan_id=other_plan, page_size=1)).next_page_token
    raw = bytearray(base64.urlsafe_b64decode(token + "=="))
    wrong_mac = bytes(raw[:-1]) + bytes([raw[-1] ^ 1])
    moved = bytes(raw[:8]) + bytes([raw[8] - 1]) + bytes(raw[9:])  # another position, the same MAC

    def encoded(data: bytes) -> str:
        return base64.urlsafe_b64encode(data).decode().rstrip("=")

    forged = {
        "wrong MAC": encoded(wrong_mac),
        "another position": encoded(moved),
        "another filter's token": filtered,
        "another plan's token": of_other_plan,
        "the old, computable format": _legacy_token(plan_id, "", 2),
        "garbage": "not a token at all",
        "truncated": token[:-1],
        "extended": token + "A",
        "huge": "A" * 1_000_000,
        "non-ASCII": "é" * 55,
    }
    for what, bad in forged.items():
        error = _refusal(checkpoint_stub, plan_id=plan_id, page_size=1, page_token=bad)
        assert error.code() == grpc.StatusCode.INVALID_ARGUMENT, what
        assert error_info(error).reason == "INVALID_PAGE_TOKEN", what
    assert error_info(_refusal(checkpoint_stub, plan_id=plan_id, page_token=token,
                               filter='labels.k = "v"')).reason == "INVALID_PAGE_TOKEN"
    page = checkpoint_stub.ListCheckpoints(pb.ListCheckpointsRequest(plan_id=plan_id, page_size=1, page_token=token))
    assert [c.sequence for c in page.checkpoints] == [3]
    page = checkpoint_stub.ListCheckpoints(pb.ListCheckpointsRequest(plan_id=plan_id, page_size=1,
                                                                     page_token=filtered, filter='labels.k = "v"'))
    assert [c.sequence for c in page.checkpoints] == [3]
