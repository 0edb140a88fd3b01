"""Fail-open and fail-closed: what the interceptors do when checkpointd is stopped or hangs."""

from __future__ import annotations

import logging
from pathlib import Path

import grpc
import pytest

from checkpointd_client import (
    AutoTrigger,
    CheckpointClient,
    Checkpointd,
    CheckpointSettings,
    CheckpointUnavailableError,
    ConfigKey,
    FixedSettings,
    OnUnavailable,
    ToolCall,
    ToolCheckpointInterceptor,
    TriggerPolicy,
    open_channel,
)
from checkpointd_client.reference import (
    PlanContext,
    PlanExecutor,
    Subplan,
    SubplanExecutionService,
    ToolRunner,
    WriteFileTool,
)

WAIT_S = 30
WRITE = {"path": "out.txt", "content": "written"}


class ActorFailure(RuntimeError):
    """What the test's execute actor raises."""


def _configure(checkpointd: Checkpointd, on_unavailable: str, deadline_ms: int) -> None:
    """Set the fail-open/fail-closed choice on the server and wait until the client has seen it."""
    checkpointd.config.set_config(ConfigKey.ON_UNAVAILABLE, on_unavailable)
    checkpointd.config.set_config(ConfigKey.CLIENT_DEADLINE_MS, deadline_ms)
    assert checkpointd.settings.wait_for(
        lambda s: s.on_unavailable.value == on_unavailable and s.client_deadline_s == deadline_ms / 1000,
        timeout=WAIT_S,
    )


def _runner(checkpoints: CheckpointClient, policy: TriggerPolicy) -> ToolRunner:
    runner = ToolRunner(checkpoints, policy)
    runner.register(WriteFileTool())
    return runner


def _warnings(caplog: pytest.LogCaptureFixture) -> list[str]:
    return [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING and "proceeding" in r.getMessage()]


def test_server_stopped_with_proceed_runs_the_tool_and_warns(
    fresh_server, fresh_checkpointd: Checkpointd, fresh_workspace: Path, plan_id: str, caplog, list_plan
) -> None:
    _configure(fresh_checkpointd, "proceed", 1000)
    runner = _runner(fresh_checkpointd.checkpoints, fresh_checkpointd.policy())
    plan = PlanContext(workspace_root=fresh_workspace, plan_id=plan_id)

    fresh_server.stop()
    with caplog.at_level(logging.WARNING, logger="checkpointd_client"):
        result = runner.execute("local/write-file", WRITE, plan)

    assert result.output.startswith("wrote")
    assert (fresh_workspace / "out.txt").read_text() == "written"
    warnings = _warnings(caplog)
    assert len(warnings) == 2
    assert "before_tool_execute" in warnings[0] and "after_tool_execute" in warnings[1]
    fresh_server.start()
    grpc.channel_ready_future(fresh_checkpointd.channel).result(timeout=60)
    assert list_plan(fresh_checkpointd.checkpoints, plan_id) == []


def test_server_stopped_with_refuse_keeps_the_write_tool_from_running(
    fresh_server, fresh_checkpointd: Checkpointd, fresh_workspace: Path, plan_id: str, new_plan_id
) -> None:
    _configure(fresh_checkpointd, "refuse", 1000)
    runner = _runner(fresh_checkpointd.checkpoints, fresh_checkpointd.policy())
    plan = PlanContext(workspace_root=fresh_workspace, plan_id=plan_id)
    spawned: list[str] = []
    service = SubplanExecutionService(
        plan, lambda child, sub: spawned.append(sub.plan_id), fresh_checkpointd.checkpoints, fresh_checkpointd.policy()
    )
    service.configure(Subplan(new_plan_id()))

    fresh_server.stop()
    with pytest.raises(CheckpointUnavailableError) as refused_tool:
        runner.execute("local/write-file", WRITE, plan)
    with pytest.raises(CheckpointUnavailableError) as refused_spawn:
        service.execute_all()

    assert not (fresh_workspace / "out.txt").exists()
    assert spawned == []
    assert refused_tool.value.trigger is AutoTrigger.BEFORE_TOOL_EXECUTE
    assert refused_tool.value.cause.code in (grpc.StatusCode.UNAVAILABLE, grpc.StatusCode.DEADLINE_EXCEEDED)
    assert refused_spawn.value.trigger is AutoTrigger.ON_SUBPLAN_SPAWN


def test_server_stopped_with_refuse_still_raises_the_original_execute_error(
    fresh_server, fresh_checkpointd: Checkpointd, fresh_workspace: Path, plan_id: str
) -> None:
    _configure(fresh_checkpointd, "refuse", 1000)
    failure = ActorFailure("actor broke")

    def actor(plan: PlanContext) -> object:
        raise failure

    executor = PlanExecutor(actor, fresh_checkpointd.checkpoints, fresh_checkpointd.policy())

    fresh_server.stop()
    with pytest.raises(ActorFailure) as raised:
        executor.run_execute_phase(PlanContext(workspace_root=fresh_workspace, plan_id=plan_id))

    assert raised.value is failure


@pytest.mark.parametrize("on_unavailable", [OnUnavailable.PROCEED, OnUnavailable.REFUSE])
def test_a_hung_server_is_bounded_by_the_client_deadline(
    hung_server_target: str, tmp_path: Path, plan_id: str, on_unavailable: OnUnavailable, caplog
) -> None:
    settings = CheckpointSettings(on_unavailable=on_unavailable, client_deadline_s=0.3)
    runner = _runner(CheckpointClient(open_channel(hung_server_target)), TriggerPolicy(FixedSettings(settings)))
    plan = PlanContext(workspace_root=tmp_path, plan_id=plan_id)

    with caplog.at_level(logging.WARNING, logger="checkpointd_client"):
        if on_unavailable is OnUnavailable.REFUSE:
            with pytest.raises(CheckpointUnavailableError) as refused:
                runner.execute("local/write-file", WRITE, plan)
            assert refused.value.cause.code == grpc.StatusCode.DEADLINE_EXCEEDED
            assert not (tmp_path / "out.txt").exists()
        else:
            runner.execute("local/write-file", WRITE, plan)
            assert (tmp_path / "out.txt").read_text() == "written"
            assert len(_warnings(caplog)) == 2


def test_a_server_never_reached_leaves_the_defaults_in_force(
    fresh_server, fresh_workspace: Path, plan_id: str, caplog
) -> None:
    fresh_server.stop()
    with caplog.at_level(logging.WARNING, logger="checkpointd_client"), Checkpointd(fresh_server.tcp_target) as down:
        runner = _runner(down.checkpoints, down.policy())
        runner.execute("local/write-file", WRITE, PlanContext(workspace_root=fresh_workspace, plan_id=plan_id))

        assert not down.settings.fetched
        assert down.settings.current() == CheckpointSettings()
    assert (fresh_workspace / "out.txt").read_text() == "written"
    assert any("default settings" in r.getMessage() for r in caplog.records)


def test_begin_and_finish_collect_the_warnings_they_proceeded_past(hung_server_target: str, tmp_path: Path) -> None:
    """An async runner's two steps (the MCP proxy's): each checkpoint that could not be recorded
    leaves its warning in ToolCheckpoints.warnings, for the runner to show with the result."""
    settings = CheckpointSettings(on_unavailable=OnUnavailable.PROCEED, client_deadline_s=0.3)
    interceptor = ToolCheckpointInterceptor(
        CheckpointClient(open_channel(hung_server_target)), TriggerPolicy(FixedSettings(settings))
    )
    call = ToolCall("mcp/write", "01ARZ3NDEKTSV4RRFFQ69G5FAV", tmp_path)

    taken = interceptor.begin(call)
    assert taken.before is None and len(taken.warnings) == 1
    interceptor.finish(call, taken)

    assert taken.after is None and len(taken.warnings) == 2
    assert "before_tool_execute" in taken.warnings[0] and "after_tool_execute" in taken.warnings[1]
    assert all("DEADLINE_EXCEEDED" in warning and "proceeding without it" in warning for warning in taken.warnings)
    read = ToolCall("mcp/read", "01ARZ3NDEKTSV4RRFFQ69G5FAV", tmp_path, read_only=True)
    untouched = interceptor.finish(read, interceptor.begin(read))
    assert (untouched.before, untouched.after, untouched.warnings) == (None, None, [])
