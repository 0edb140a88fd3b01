"""DeleteCheckpoints: every checkpoint a filter selects, in one plan or across plans, and nothing
else; what the deleted checkpoints shared with the others stays restorable."""

from __future__ import annotations

import uuid

from ulid import ULID

from checkpoint.v1 import checkpoint_service_pb2 as pb
from tests.service.test_errors import INVALID, expect


def _create(stub, plan_id: str, **fields) -> pb.Checkpoint:
    return stub.CreateCheckpoint(pb.CreateCheckpointRequest(plan_id=plan_id, **fields)).checkpoint


def _ids(stub, plan_id: str) -> set[str]:
    return {c.checkpoint_id for c in stub.ListCheckpoints(pb.ListCheckpointsRequest(plan_id=plan_id)).checkpoints}


def test_a_label_filter_deletes_its_matches_in_every_plan_and_nothing_else(checkpoint_stub, workspace):
    run, other_run = str(uuid.uuid4()), str(uuid.uuid4())
    first_plan, second_plan = str(ULID()), str(ULID())
    (workspace / "shared.txt").write_text("in every checkpoint")
    doomed_first = _create(checkpoint_stub, first_plan, workspace_root=str(workspace), labels={"run": run})
    kept_first = _create(checkpoint_stub, first_plan, labels={"run": other_run})
    doomed_second = _create(checkpoint_stub, second_plan, labels={"run": run, "kind": "x"})
    kept_second = _create(checkpoint_stub, second_plan)

    deleted = checkpoint_stub.DeleteCheckpoints(pb.DeleteCheckpointsRequest(filter=f'labels.run = "{run}"')).checkpoints

    assert sorted((c.checkpoint_id, c.plan_id, c.labels["run"]) for c in deleted) == sorted(
        [(doomed_first.checkpoint_id, first_plan, run), (doomed_second.checkpoint_id, second_plan, run)])
    assert all(not c.state for c in deleted)
    assert _ids(checkpoint_stub, first_plan) == {kept_first.checkpoint_id}
    assert _ids(checkpoint_stub, second_plan) == {kept_second.checkpoint_id}
    # The kept checkpoint's files (shared with the deleted one) are intact.
    (workspace / "shared.txt").write_text("changed")
    checkpoint_stub.Rollback(pb.RollbackRequest(plan_id=first_plan, checkpoint_id=kept_first.checkpoint_id))
    assert (workspace / "shared.txt").read_text() == "in every checkpoint"
    # Nothing left to match: a repeat deletes nothing.
    again = checkpoint_stub.DeleteCheckpoints(pb.DeleteCheckpointsRequest(filter=f'labels.run = "{run}"'))
    assert not again.checkpoints


def test_a_plan_without_a_filter_is_emptied_and_other_plans_are_not(checkpoint_stub):
    emptied, untouched = str(ULID()), str(ULID())
    made = {_create(checkpoint_stub, emptied).checkpoint_id for _ in range(3)}
    survivor = _create(checkpoint_stub, untouched).checkpoint_id
    deleted = checkpoint_stub.DeleteCheckpoints(pb.DeleteCheckpointsRequest(plan_id=emptied)).checkpoints
    assert {c.checkpoint_id for c in deleted} == made
    assert _ids(checkpoint_stub, emptied) == set()
    assert _ids(checkpoint_stub, untouched) == {survivor}
    # The plan's sequence goes on from where it was: no number is given out twice.
    assert _create(checkpoint_stub, emptied).sequence == 4


def test_a_filter_within_a_plan_spares_that_plans_other_checkpoints(checkpoint_stub):
    plan = str(ULID())
    doomed = _create(checkpoint_stub, plan, source_tool="tool/a", labels={"k": "v"})
    kept = {_create(checkpoint_stub, plan, source_tool="tool/a").checkpoint_id,
            _create(checkpoint_stub, plan, source_tool="tool/b", labels={"k": "v"}).checkpoint_id}
    deleted = checkpoint_stub.DeleteCheckpoints(pb.DeleteCheckpointsRequest(
        plan_id=plan, filter='source_tool = "tool/a" AND labels.k = "v"')).checkpoints
    assert [c.checkpoint_id for c in deleted] == [doomed.checkpoint_id]
    assert _ids(checkpoint_stub, plan) == kept


def test_bad_requests_are_refused_with_a_reason(checkpoint_stub):
    info = expect(INVALID, "MISSING_FIELD", checkpoint_stub.DeleteCheckpoints, pb.DeleteCheckpointsRequest())
    assert info.metadata["field"] == "filter"
    expect(INVALID, "MISSING_FIELD", checkpoint_stub.DeleteCheckpoints, pb.DeleteCheckpointsRequest(filter="  "))
    expect(INVALID, "INVALID_PLAN_ID", checkpoint_stub.DeleteCheckpoints,
           pb.DeleteCheckpointsRequest(plan_id="nope", filter='labels.a = "b"'))
    expect(INVALID, "INVALID_FILTER", checkpoint_stub.DeleteCheckpoints, pb.DeleteCheckpointsRequest(filter="labels.a"))
    expect(INVALID, "INVALID_FILTER", checkpoint_stub.DeleteCheckpoints,
           pb.DeleteCheckpointsRequest(filter='colour = "red"'))
