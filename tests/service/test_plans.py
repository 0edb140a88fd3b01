"""ListPlans and GetPlan: finding plans without remembering their ids (AIP-158 paging, AIP-160 filter)."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import grpc
import pytest
from ulid import ULID

from checkpoint.v1 import checkpoint_service_pb2 as pb
from tests.helpers import error_info


def _plans_under(stub, parent, page_size=0, extra=""):
    text = f'workspace_root : "{parent}"' + (f" AND {extra}" if extra else "")
    seen, token, pages = [], "", 0
    while True:
        page = stub.ListPlans(pb.ListPlansRequest(page_size=page_size, page_token=token, filter=text))
        pages += 1
        seen += page.plans
        token = page.next_page_token
        if not token:
            return seen, pages


def _new_plan(stub, root, states=(b"s",)):
    plan_id = str(ULID())
    created = [stub.CreateCheckpoint(pb.CreateCheckpointRequest(plan_id=plan_id, workspace_root=str(root),
                                                                state=s)).checkpoint for s in states]
    return plan_id, created


def test_pages_walk_every_plan_newest_id_first(checkpoint_stub, workspace):
    ids = []
    for i in range(5):
        (workspace / f"p{i}").mkdir()
        ids.append(_new_plan(checkpoint_stub, workspace / f"p{i}")[0])
    seen, pages = _plans_under(checkpoint_stub, workspace, page_size=2)
    assert [p.plan_id for p in seen] == sorted(ids, reverse=True)
    assert pages == 3
    assert {p.workspace_root for p in seen} == {str(workspace / f"p{i}") for i in range(5)}


def test_a_plan_reports_its_count_size_and_newest_checkpoint(checkpoint_stub, workspace):
    (workspace / "a.txt").write_bytes(b"12345")
    plan_id, created = _new_plan(checkpoint_stub, workspace, states=(b"ab", b"cde"))
    plan = checkpoint_stub.GetPlan(pb.GetPlanRequest(plan_id=plan_id)).plan
    assert plan.plan_id == plan_id and plan.workspace_root == str(workspace)
    assert plan.checkpoint_count == 2
    assert plan.newest_checkpoint_id == created[-1].checkpoint_id
    assert plan.total_size_bytes == 5 + 2 + 5 + 3
    assert plan.update_time == created[-1].create_time
    assert plan.create_time.ToDatetime() <= plan.update_time.ToDatetime()
    checkpoint_stub.DeleteCheckpoint(pb.DeleteCheckpointRequest(checkpoint_id=created[-1].checkpoint_id))
    after = checkpoint_stub.GetPlan(pb.GetPlanRequest(plan_id=plan_id)).plan
    assert after.checkpoint_count == 1 and after.newest_checkpoint_id == created[0].checkpoint_id
    listed, _ = _plans_under(checkpoint_stub, workspace)
    assert listed == [after]


def test_state_only_plans_are_listed_and_found(checkpoint_stub):
    plan_id = str(ULID())
    checkpoint_stub.CreateCheckpoint(pb.CreateCheckpointRequest(plan_id=plan_id, state=b"x"))
    plan = checkpoint_stub.GetPlan(pb.GetPlanRequest(plan_id=plan_id)).plan
    assert plan.workspace_root == "" and plan.checkpoint_count == 1
    newest = checkpoint_stub.ListPlans(pb.ListPlansRequest(page_size=1000)).plans
    assert plan_id in {p.plan_id for p in newest}


def test_filter_by_exact_root_under_root_and_update_time(checkpoint_stub, workspace):
    (workspace / "inner").mkdir()
    outer, _ = _new_plan(checkpoint_stub, workspace)
    inner, _ = _new_plan(checkpoint_stub, workspace / "inner")

    def ids(text):
        return [p.plan_id for p in checkpoint_stub.ListPlans(pb.ListPlansRequest(filter=text, page_size=1000)).plans]

    assert ids(f'workspace_root = "{workspace}"') == [outer]
    assert ids(f'workspace_root = "{workspace}/"') == [outer]
    assert ids(f'workspace_root : "{workspace}"') == [inner, outer]
    assert ids(f'workspace_root : "{workspace}/inner"') == [inner]
    assert ids(f'workspace_root : "{workspace}/inn"') == []
    past = (datetime.now(UTC) - timedelta(hours=1)).isoformat().replace("+00:00", "Z")
    future = (datetime.now(UTC) + timedelta(hours=1)).isoformat()
    assert ids(f'workspace_root : "{workspace}" AND update_time > "{past}"') == [inner, outer]
    assert ids(f'workspace_root : "{workspace}" AND update_time >= "{future}"') == []
    assert ids(f'workspace_root : "{workspace}" AND update_time < "{future}" AND update_time > "{past}"') == [
        inner, outer]
    assert ids(f'workspace_root : "{workspace}" AND update_time <= "{past}"') == []


def test_filter_by_labels_of_a_plans_checkpoints(checkpoint_stub, workspace):
    """A plan has a label when one of its checkpoints has it; two label terms may be met by two
    checkpoints; other plans' checkpoints never count."""
    agent = str(ULID())
    tagged, untagged, other = str(ULID()), str(ULID()), str(ULID())
    for plan_id, labels in ((tagged, {"agent": agent}), (tagged, {"step": "2"}), (untagged, {}),
                            (other, {"agent": "someone-else", "step": "2"})):
        checkpoint_stub.CreateCheckpoint(pb.CreateCheckpointRequest(plan_id=plan_id, labels=labels))

    def ids(text):
        return [p.plan_id for p in checkpoint_stub.ListPlans(pb.ListPlansRequest(filter=text, page_size=1000)).plans]

    assert ids(f'labels.agent = "{agent}"') == [tagged]
    assert ids(f'labels.agent = "{agent}" AND labels.step = "2"') == [tagged]
    assert ids(f'labels.agent = "{agent}" AND labels.step = "3"') == []
    assert ids('labels.agent = "someone-else" AND labels.step = "2"') == [other]
    future = (datetime.now(UTC) + timedelta(hours=1)).isoformat()
    assert ids(f'labels.agent = "{agent}" AND update_time < "{future}"') == [tagged]
    first = checkpoint_stub.ListPlans(pb.ListPlansRequest(filter='labels.step = "2"', page_size=1))
    assert len(first.plans) == 1 and first.next_page_token


@pytest.mark.parametrize("text", [
    'plan_id = "x"',
    'workspace_root > "/a"',
    'workspace_root = "relative"',
    'update_time = "2026-01-01T00:00:00Z"',
    'update_time > "yesterday"',
    'update_time > "2026-01-01T00:00:00"',
    'workspace_root = "/a" OR workspace_root = "/b"',
    'workspace_root = /a',
    'labels.agent : "x"',
    'labels. = "x"',
])
def test_a_bad_filter_is_invalid_argument_with_its_reason(checkpoint_stub, text):
    with pytest.raises(grpc.RpcError) as caught:
        checkpoint_stub.ListPlans(pb.ListPlansRequest(filter=text))
    assert caught.value.code() is grpc.StatusCode.INVALID_ARGUMENT
    assert error_info(caught.value).reason == "INVALID_FILTER"


def test_page_tokens_are_bound_to_their_filter_and_cannot_be_forged(checkpoint_stub, workspace):
    for i in range(3):
        (workspace / f"p{i}").mkdir()
        _new_plan(checkpoint_stub, workspace / f"p{i}")
    text = f'workspace_root : "{workspace}"'
    token = checkpoint_stub.ListPlans(pb.ListPlansRequest(page_size=1, filter=text)).next_page_token
    assert token
    checks = checkpoint_stub.ListCheckpoints(pb.ListCheckpointsRequest(plan_id=str(ULID()), page_size=1))
    for bad_token, bad_filter in ((token, ""), (token[:-2] + ("AA" if token[-2:] != "AA" else "BB"), text),
                                  ("not-a-token", text), (token + "A", text), (checks.next_page_token or "x", text)):
        with pytest.raises(grpc.RpcError) as caught:
            checkpoint_stub.ListPlans(pb.ListPlansRequest(page_size=1, page_token=bad_token, filter=bad_filter))
        assert caught.value.code() is grpc.StatusCode.INVALID_ARGUMENT
        assert error_info(caught.value).reason == "INVALID_PAGE_TOKEN"
    with pytest.raises(grpc.RpcError) as caught:
        checkpoint_stub.ListPlans(pb.ListPlansRequest(page_size=-1))
    assert error_info(caught.value).reason == "INVALID_PAGE_SIZE"


def test_get_plan_of_an_unknown_or_malformed_id(checkpoint_stub):
    with pytest.raises(grpc.RpcError) as caught:
        checkpoint_stub.GetPlan(pb.GetPlanRequest(plan_id=str(ULID())))
    assert caught.value.code() is grpc.StatusCode.NOT_FOUND
    assert error_info(caught.value).reason == "PLAN_NOT_FOUND"
    assert "checkpointd plans" in caught.value.details()
    for bad in ("", "my-plan"):
        with pytest.raises(grpc.RpcError) as caught:
            checkpoint_stub.GetPlan(pb.GetPlanRequest(plan_id=bad))
        assert caught.value.code() is grpc.StatusCode.INVALID_ARGUMENT
        assert error_info(caught.value).reason in ("INVALID_PLAN_ID", "MISSING_FIELD")
