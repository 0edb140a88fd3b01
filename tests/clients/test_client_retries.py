"""Retries never duplicate a checkpoint: lost responses, and a server restarted in the middle of a plan."""

from __future__ import annotations

from pathlib import Path

import grpc
import pytest

from checkpoint.v1 import checkpoint_service_pb2 as pb
from checkpointd_client import CheckpointClient, Checkpointd, CheckpointdRpcError, new_request_id, open_channel
from checkpointd_client.reference import PlanContext, ToolRunner, WriteFileTool


def test_a_lost_response_is_retried_with_the_same_request_id(
    fault_proxy, checkpointd_server, workspace: Path, plan_id: str
) -> None:
    through_proxy = CheckpointClient(open_channel(fault_proxy.target))
    direct = CheckpointClient(open_channel(checkpointd_server.tcp_target))
    fault_proxy.drop_responses("CreateCheckpoint", 1)

    created = through_proxy.create_checkpoint(plan_id, workspace_root=workspace)

    attempts = fault_proxy.calls_to("CreateCheckpoint")
    sent = [pb.CreateCheckpointRequest.FromString(attempt.request) for attempt in attempts]
    assert len(attempts) == 2
    assert sent[0].request_id and sent[0] == sent[1]
    assert [c.checkpoint_id for c in direct.list_checkpoints(plan_id)] == [created.checkpoint_id]


def test_errors_other_than_unavailable_are_not_retried(fault_proxy) -> None:
    client = CheckpointClient(open_channel(fault_proxy.target))

    with pytest.raises(CheckpointdRpcError) as refused:
        client.create_checkpoint("not-a-plan")

    assert refused.value.reason == "INVALID_PLAN_ID"
    assert len(fault_proxy.calls_to("CreateCheckpoint")) == 1


def test_restarting_the_server_mid_plan_duplicates_nothing(
    fresh_server, fresh_checkpointd: Checkpointd, fresh_workspace: Path, plan_id: str
) -> None:
    runner = ToolRunner(fresh_checkpointd.checkpoints, fresh_checkpointd.policy())
    runner.register(WriteFileTool())
    plan = PlanContext(workspace_root=fresh_workspace, plan_id=plan_id, state=b"step-1")
    runner.execute("local/write-file", {"path": "a.txt", "content": "first"}, plan)
    request_id = new_request_id()
    manual = fresh_checkpointd.checkpoints.create_checkpoint(
        plan_id, workspace_root=fresh_workspace, request_id=request_id
    )

    fresh_server.stop()
    fresh_server.start()
    grpc.channel_ready_future(fresh_checkpointd.channel).result(timeout=60)
    replayed = fresh_checkpointd.checkpoints.create_checkpoint(
        plan_id, workspace_root=fresh_workspace, request_id=request_id
    )
    plan.state = b"step-2"
    runner.execute("local/write-file", {"path": "a.txt", "content": "second"}, plan)

    checkpoints = fresh_checkpointd.checkpoints.list_checkpoints(plan_id)
    assert replayed.checkpoint_id == manual.checkpoint_id
    assert [c.sequence for c in checkpoints] == [5, 4, 3, 2, 1]
    assert [(c.source_tool, c.phase) for c in checkpoints] == [
        ("local/write-file", pb.PHASE_AFTER_TOOL_EXECUTE),
        ("local/write-file", pb.PHASE_BEFORE_TOOL_EXECUTE),
        ("", pb.PHASE_MANUAL),
        ("local/write-file", pb.PHASE_AFTER_TOOL_EXECUTE),
        ("local/write-file", pb.PHASE_BEFORE_TOOL_EXECUTE),
    ]
    assert (fresh_workspace / "a.txt").read_text() == "second"
