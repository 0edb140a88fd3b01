"""The start-up warm-up (checkpointd.core.engine.warm_up) runs a rollback's statements in a transaction it
rolls back: a server that has started, and even served a rollback, holds no row of it, and its
ids are ones no client can send."""

from __future__ import annotations

import grpc
import pytest
from sqlalchemy import create_engine, text

from checkpoint.v1 import checkpoint_service_pb2 as pb
from checkpoint.v1 import checkpoint_service_pb2_grpc as pb_grpc
from checkpointd.core.engine import warm_up
from tests.helpers import error_info


def _rows_of_the_warm_up(server) -> list[tuple[str, int]]:
    engine = create_engine(server.db_url or f"sqlite:///{server.data_dir / 'checkpointd.db'}")
    try:
        with engine.connect() as connection:
            return [
                ("plans", connection.execute(text("SELECT count(*) FROM plans WHERE plan_id = :plan"),
                                             {"plan": warm_up.WARM_UP_PLAN}).scalar_one()),
                ("checkpoints", connection.execute(text("SELECT count(*) FROM checkpoints WHERE plan_id = :plan"),
                                                   {"plan": warm_up.WARM_UP_PLAN}).scalar_one()),
                ("operations", connection.execute(text("SELECT count(*) FROM operations WHERE request_id = :rid"),
                                                  {"rid": warm_up.WARM_UP_REQUEST_ID}).scalar_one()),
            ]
    finally:
        engine.dispose()


def test_a_started_server_that_rolled_back_holds_nothing_of_its_warm_up(fresh_server, plan_id):
    workspace = fresh_server.new_workspace()
    (workspace / "a.txt").write_text("first\n")
    with grpc.insecure_channel(fresh_server.tcp_target) as channel:
        stub = pb_grpc.CheckpointServiceStub(channel)
        target = stub.CreateCheckpoint(pb.CreateCheckpointRequest(
            plan_id=plan_id, trigger=pb.TRIGGER_MANUAL, workspace_root=str(workspace)), timeout=30).checkpoint
        (workspace / "a.txt").write_text("second\n")
        stub.Rollback(pb.RollbackRequest(plan_id=plan_id, checkpoint_id=target.checkpoint_id,
                                         scope=pb.ROLLBACK_SCOPE_FILES, request_id="rollback-1"), timeout=30)
    assert (workspace / "a.txt").read_text() == "first\n"
    assert _rows_of_the_warm_up(fresh_server) == [("plans", 0), ("checkpoints", 0), ("operations", 0)]


@pytest.mark.parametrize(("ids", "reason"), [
    ({"plan_id": warm_up.WARM_UP_PLAN}, "INVALID_PLAN_ID"),
    ({"request_id": warm_up.WARM_UP_REQUEST_ID}, "INVALID_REQUEST_ID"),
], ids=["plan_id", "request_id"])
def test_clients_cannot_use_the_warm_up_ids(checkpoint_stub, plan_id, ids, reason):
    request = pb.CreateCheckpointRequest(**{"plan_id": plan_id, "trigger": pb.TRIGGER_MANUAL, **ids})
    with pytest.raises(grpc.RpcError) as caught:
        checkpoint_stub.CreateCheckpoint(request, timeout=30)
    assert caught.value.code() is grpc.StatusCode.INVALID_ARGUMENT
    assert error_info(caught.value).reason == reason
