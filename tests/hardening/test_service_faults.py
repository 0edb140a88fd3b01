"""Service faults under the client interceptors, injected into the real server: slow (past the
client deadline), answering UNAVAILABLE (a few times, or always), killed in the middle of a
checkpoint and restarted. The reference tool runner must do exactly what
core.checkpoints.on_unavailable says, give up at its deadline rather than wait for the server,
and never record a checkpoint twice. (tests/clients covers a stopped server, a hung socket and
lost responses; these add faults that only the server itself can produce.)
"""

from __future__ import annotations

import logging
from pathlib import Path

import grpc
import pytest
from ulid import ULID

from checkpoint.v1 import checkpoint_service_pb2 as pb
from checkpoint.v1 import checkpoint_service_pb2_grpc as pb_grpc
from checkpointd_client import Checkpointd, CheckpointUnavailableError, ConfigKey, OnUnavailable
from checkpointd_client.reference import PlanContext, ToolRunner, WriteFileTool
from tests.hardening.support import list_all, start_with_faults

WAIT_S = 60
WRITE = {"path": "out.txt", "content": "written"}


def _configure(connection: Checkpointd, on_unavailable: OnUnavailable, deadline_ms: int) -> None:
    connection.config.set_config(ConfigKey.ON_UNAVAILABLE, on_unavailable.value)
    connection.config.set_config(ConfigKey.CLIENT_DEADLINE_MS, deadline_ms)
    assert connection.settings.wait_for(
        lambda s: s.on_unavailable is on_unavailable and s.client_deadline_s == deadline_ms / 1000, timeout=WAIT_S)


def _runner(connection: Checkpointd) -> ToolRunner:
    runner = ToolRunner(connection.checkpoints, connection.policy())
    runner.register(WriteFileTool())
    return runner


def _warnings(caplog: pytest.LogCaptureFixture) -> list[str]:
    return [r.getMessage() for r in caplog.records
            if r.levelno == logging.WARNING and "proceeding without it" in r.getMessage()]


def _phases(server, plan_id: str) -> list[int]:
    with grpc.insecure_channel(server.tcp_target) as channel:
        return [c.phase for c in list_all(pb_grpc.CheckpointServiceStub(channel), plan_id)]


def _run_tool(runner: ToolRunner, plan: PlanContext, on_unavailable: OnUnavailable,
              expected_code: grpc.StatusCode, caplog) -> None:
    """Runs the write tool through a failing checkpointd and checks the on_unavailable contract."""
    with caplog.at_level(logging.WARNING, logger="checkpointd_client"):
        if on_unavailable is OnUnavailable.REFUSE:
            with pytest.raises(CheckpointUnavailableError) as refused:
                runner.execute("local/write-file", WRITE, plan)
            assert refused.value.cause.code == expected_code
            assert not (plan.workspace_root / "out.txt").exists(), "refuse must keep the write tool from running"
        else:
            result = runner.execute("local/write-file", WRITE, plan)
            assert result.output.startswith("wrote")
            assert (plan.workspace_root / "out.txt").read_text() == "written"
            warnings = _warnings(caplog)
            assert len(warnings) == 2 and all(expected_code.name in w for w in warnings), warnings


@pytest.mark.parametrize("on_unavailable", list(OnUnavailable))
def test_a_slow_server_is_cut_off_at_the_client_deadline_and_nothing_is_recorded_twice(
        idle_server, on_unavailable: OnUnavailable, caplog) -> None:
    start_with_faults(idle_server, CHECKPOINTD_SLOW_AT="create.captured:2")
    workspace = idle_server.new_workspace()
    plan_id = str(ULID())
    with Checkpointd(idle_server.tcp_target) as connection:
        _configure(connection, on_unavailable, 500)
        _run_tool(_runner(connection), PlanContext(workspace_root=workspace, plan_id=plan_id), on_unavailable,
                  grpc.StatusCode.DEADLINE_EXCEEDED, caplog)
        connection.checkpoints.create_checkpoint(plan_id, workspace_root=workspace, timeout=WAIT_S)
    phases = _phases(idle_server, plan_id)
    if on_unavailable is OnUnavailable.REFUSE:
        assert phases == [pb.PHASE_BEFORE_TOOL_EXECUTE, pb.PHASE_MANUAL]
    else:
        # The after-checkpoint waits for the plan, which the slow before-checkpoint still holds; whether
        # its deadline passes before it begins (then it is never recorded) or after (then it is, once)
        # depends on the server's pace. Either way nothing is recorded twice.
        assert phases in ([pb.PHASE_BEFORE_TOOL_EXECUTE, pb.PHASE_AFTER_TOOL_EXECUTE, pb.PHASE_MANUAL],
                          [pb.PHASE_BEFORE_TOOL_EXECUTE, pb.PHASE_MANUAL])


def test_a_few_unavailable_answers_are_retried_with_the_same_request_id(idle_server, caplog) -> None:
    start_with_faults(idle_server, CHECKPOINTD_UNAVAILABLE_AT="create.captured:2")
    workspace = idle_server.new_workspace()
    plan_id = str(ULID())
    with Checkpointd(idle_server.tcp_target) as connection:
        _configure(connection, OnUnavailable.REFUSE, 5000)
        with caplog.at_level(logging.WARNING, logger="checkpointd_client"):
            result = _runner(connection).execute("local/write-file", WRITE,
                                                 PlanContext(workspace_root=workspace, plan_id=plan_id))
    assert result.output.startswith("wrote")
    assert _warnings(caplog) == []
    assert _phases(idle_server, plan_id) == [pb.PHASE_BEFORE_TOOL_EXECUTE, pb.PHASE_AFTER_TOOL_EXECUTE]


@pytest.mark.parametrize("on_unavailable", list(OnUnavailable))
def test_a_server_that_keeps_answering_unavailable(idle_server, on_unavailable: OnUnavailable, caplog) -> None:
    start_with_faults(idle_server, CHECKPOINTD_UNAVAILABLE_AT="create.captured:1000")
    workspace = idle_server.new_workspace()
    plan_id = str(ULID())
    with Checkpointd(idle_server.tcp_target) as connection:
        _configure(connection, on_unavailable, 5000)
        _run_tool(_runner(connection), PlanContext(workspace_root=workspace, plan_id=plan_id), on_unavailable,
                  grpc.StatusCode.UNAVAILABLE, caplog)
    assert _phases(idle_server, plan_id) == []


@pytest.mark.parametrize("on_unavailable", list(OnUnavailable))
def test_killed_after_recording_then_restarted_mid_plan(idle_server, on_unavailable: OnUnavailable,
                                                        caplog) -> None:
    """The server dies after committing the before-checkpoint but before answering: the runner
    follows on_unavailable; after a restart the plan goes on, and that checkpoint exists once."""
    start_with_faults(idle_server, CHECKPOINTD_CRASH_AT="create.committed:1")
    workspace: Path = idle_server.new_workspace()
    plan = PlanContext(workspace_root=workspace, plan_id=str(ULID()))
    with Checkpointd(idle_server.tcp_target) as connection:
        _configure(connection, on_unavailable, 2000)
        runner = _runner(connection)
        _run_tool(runner, plan, on_unavailable, grpc.StatusCode.UNAVAILABLE, caplog)
        assert idle_server.process.wait(timeout=WAIT_S) < 0
        idle_server.stop()
        idle_server.start()
        grpc.channel_ready_future(connection.channel).result(timeout=WAIT_S)
        runner.execute("local/write-file", {"path": "next.txt", "content": "after restart"}, plan)
    assert _phases(idle_server, plan.plan_id) == [pb.PHASE_BEFORE_TOOL_EXECUTE, pb.PHASE_BEFORE_TOOL_EXECUTE,
                                                  pb.PHASE_AFTER_TOOL_EXECUTE]


def test_a_request_id_retried_across_a_kill_returns_the_checkpoint_it_recorded(idle_server) -> None:
    start_with_faults(idle_server, CHECKPOINTD_CRASH_AT="create.committed:1")
    workspace = idle_server.new_workspace()
    plan_id, request_id = str(ULID()), str(ULID())
    request = pb.CreateCheckpointRequest(plan_id=plan_id, workspace_root=str(workspace), request_id=request_id)
    with grpc.insecure_channel(idle_server.tcp_target) as channel:
        with pytest.raises(grpc.RpcError) as lost:
            pb_grpc.CheckpointServiceStub(channel).CreateCheckpoint(request, timeout=WAIT_S)
        assert lost.value.code() == grpc.StatusCode.UNAVAILABLE
    idle_server.process.wait(timeout=WAIT_S)
    idle_server.stop()
    idle_server.start()
    with grpc.insecure_channel(idle_server.tcp_target) as channel:
        stub = pb_grpc.CheckpointServiceStub(channel)
        first = stub.CreateCheckpoint(request, timeout=WAIT_S).checkpoint
        again = stub.CreateCheckpoint(request, timeout=WAIT_S).checkpoint
        assert first.checkpoint_id == again.checkpoint_id and first.sequence == 1
        assert [c.checkpoint_id for c in list_all(stub, plan_id)] == [first.checkpoint_id]
