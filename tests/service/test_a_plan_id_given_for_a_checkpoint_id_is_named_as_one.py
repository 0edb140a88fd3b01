"""Plan ids and checkpoint ids are both ULIDs, and a newcomer has the plan id at hand: one given
where a checkpoint id belongs is still CHECKPOINT_NOT_FOUND, and the message says it is a plan's
and how to list its checkpoints. An id that is neither gets the plain message."""

from __future__ import annotations

import grpc
import pytest
from ulid import ULID

from checkpoint.v1 import checkpoint_service_pb2 as pb
from tests.helpers import checkpoint_id_of, refused


@pytest.mark.parametrize("call", ["GetCheckpoint", "ReadCheckpointFile", "DiffCheckpoints", "Rollback"])
def test_a_plan_id_given_for_a_checkpoint_id_is_named_as_one(checkpoint_stub, workspace, plan_id, call):
    (workspace / "a.txt").write_text("a")
    checkpoint_id_of(checkpoint_stub, plan_id, workspace)
    requests = {
        "GetCheckpoint": lambda cid: checkpoint_stub.GetCheckpoint(pb.GetCheckpointRequest(checkpoint_id=cid)),
        "ReadCheckpointFile": lambda cid: list(checkpoint_stub.ReadCheckpointFile(
            pb.ReadCheckpointFileRequest(checkpoint_id=cid, path="a.txt"))),
        "DiffCheckpoints": lambda cid: checkpoint_stub.DiffCheckpoints(
            pb.DiffCheckpointsRequest(base_checkpoint_id=cid)),
        "Rollback": lambda cid: checkpoint_stub.Rollback(pb.RollbackRequest(plan_id=plan_id, checkpoint_id=cid)),
    }
    error = refused(lambda: requests[call](plan_id), grpc.StatusCode.NOT_FOUND, "CHECKPOINT_NOT_FOUND")
    assert f"{plan_id} is a plan id" in error.details()
    assert f"checkpointd ls {plan_id}" in error.details()

    unknown = str(ULID())
    error = refused(lambda: requests[call](unknown), grpc.StatusCode.NOT_FOUND, "CHECKPOINT_NOT_FOUND")
    assert "plan id" not in error.details()
