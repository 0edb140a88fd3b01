"""The Python client's promises as the README states them, against a real server.

- `core.checkpoints.on_unavailable` = "refuse" stops a write tool only through its BEFORE
  checkpoint: an after-checkpoint that cannot be taken never hides the tool's result (the write
  happened; refusing then would only lose its outcome).
- Local switches: `Checkpointd.executor_interceptor(disabled=["on_error"])` (and the tool and
  sub-plan interceptors' `disabled=`) turn a trigger off for that component only.
"""

from __future__ import annotations

import logging
from pathlib import Path

import grpc
import pytest

from checkpointd_client import (
    CheckpointClient,
    Checkpointd,
    CheckpointdRpcError,
    CheckpointSettings,
    ConfigKey,
    ExecutePhase,
    FixedSettings,
    SubplanSpawn,
    ToolCall,
    ToolCheckpointInterceptor,
    TriggerPolicy,
    phase_name,
)

WAIT_S = 30


class ActorFailure(RuntimeError):
    """What the test's execute phase raises."""


def _refuse_when_unavailable(checkpointd: Checkpointd) -> None:
    checkpointd.config.set_config(ConfigKey.ON_UNAVAILABLE, "refuse")
    checkpointd.config.set_config(ConfigKey.CLIENT_DEADLINE_MS, 2000)
    assert checkpointd.settings.wait_for(
        lambda s: s.on_unavailable.value == "refuse" and s.client_deadline_s == 2.0, timeout=WAIT_S
    )


@pytest.mark.parametrize("style", ["around", "guard"])
def test_refuse_never_withholds_a_tool_result_when_only_the_after_checkpoint_fails(
    fresh_server, fresh_checkpointd: Checkpointd, fresh_workspace: Path, plan_id: str, list_plan, caplog, style
) -> None:
    _refuse_when_unavailable(fresh_checkpointd)
    tools = fresh_checkpointd.tool_interceptor()
    call = ToolCall("custom/outage", plan_id, fresh_workspace)

    def tool() -> str:
        (fresh_workspace / "out.txt").write_text("written")
        fresh_server.stop()  # checkpointd goes away while the tool runs
        return "the tool's result"

    with caplog.at_level(logging.WARNING, logger="checkpointd_client"):
        if style == "around":
            result = tools.around(call, tool)
        else:
            with tools.guard(call) as taken:
                result = tool()
            assert taken.before is not None and taken.after is None

    assert result == "the tool's result"
    assert (fresh_workspace / "out.txt").read_text() == "written"
    warnings = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]
    assert any("after_tool_execute" in message and plan_id in message for message in warnings), warnings
    fresh_server.start()
    grpc.channel_ready_future(fresh_checkpointd.channel).result(timeout=60)
    assert [phase_name(c.phase) for c in list_plan(fresh_checkpointd.checkpoints, plan_id)] == ["before_tool_execute"]


def test_each_interceptor_made_with_disabled_triggers_records_none_of_them(
    checkpointd: Checkpointd, workspace: Path, plan_id: str, new_plan_id, list_plan
) -> None:
    errors = checkpointd.executor_interceptor(disabled=["on_error"])
    tools = checkpointd.tool_interceptor(disabled=["before_tool_execute", "after_tool_execute"])
    spawns = checkpointd.subplan_interceptor(disabled=["on_subplan_spawn"])
    failure = ActorFailure("the actor broke")

    with pytest.raises(ActorFailure) as raised, errors.guard(ExecutePhase(plan_id, workspace)):
        raise failure
    with tools.guard(ToolCall("framework/patch", plan_id, workspace)) as taken:
        (workspace / "patched.txt").write_text("patched")
    assert spawns.around(SubplanSpawn(plan_id, new_plan_id(), workspace), lambda: "child ran") == "child ran"

    assert raised.value is failure
    assert getattr(failure, "__notes__", []) == []
    assert taken.before is None and taken.after is None
    assert list_plan(checkpointd.checkpoints, plan_id) == []
    # The same server settings, no local switch: every trigger records (so the above is the switches' doing).
    with pytest.raises(ActorFailure), checkpointd.executor_interceptor().guard(ExecutePhase(plan_id, workspace)):
        raise ActorFailure("again")
    checkpointd.tool_interceptor().around(ToolCall("framework/patch", plan_id, workspace), lambda: None)
    checkpointd.subplan_interceptor().around(SubplanSpawn(plan_id, new_plan_id(), workspace), lambda: None)
    assert sorted(phase_name(c.phase) for c in list_plan(checkpointd.checkpoints, plan_id)) == [
        "after_tool_execute", "before_tool_execute", "execute", "on_error"]


def test_a_before_checkpoint_refused_for_a_bad_request_stops_the_write_tool_even_under_proceed(
    checkpointd: Checkpointd, tmp_path: Path, plan_id: str
) -> None:
    """`proceed` covers a checkpointd that cannot answer; a request it refuses (here a workspace
    outside its allow-list) is an error the caller must see, and the write must not happen."""
    assert checkpointd.settings.current().on_unavailable.value == "proceed"
    ran: list[bool] = []
    outside = tmp_path / "not-allowed"
    outside.mkdir()

    with pytest.raises(CheckpointdRpcError) as refused:
        checkpointd.tool_interceptor().around(ToolCall("custom/write", plan_id, outside), lambda: ran.append(True))

    assert refused.value.code == grpc.StatusCode.PERMISSION_DENIED
    assert refused.value.reason == "WORKSPACE_ROOT_NOT_ALLOWED"
    assert ran == []


def test_an_on_error_checkpoint_that_fails_never_replaces_the_original_error(
    checkpointd: Checkpointd, tmp_path: Path, plan_id: str
) -> None:
    """README: "when the Execute phase raises (phase on_error, then the original exception)"; a
    checkpoint that cannot be recorded is noted on that exception, not raised instead of it."""
    outside = tmp_path / "not-allowed"
    outside.mkdir()
    failure = ActorFailure("the actor broke")

    executor = checkpointd.executor_interceptor()
    with pytest.raises(ActorFailure) as raised, executor.guard(ExecutePhase(plan_id, outside)):
        raise failure

    assert raised.value is failure
    assert any("on_error checkpoint could not be recorded" in note for note in failure.__notes__)


def test_checkpointd_reads_the_settings_before_it_returns_unless_told_not_to_wait_or_not_to_read(
    target: str, hung_server_target: str
) -> None:
    """`Checkpointd` (wiring.py): by default the server's settings are read before the constructor
    returns; with `settings_in_background=True` constructing never waits on checkpointd (here, a
    server that never answers); with `watch_config=False` they are never read."""
    with Checkpointd(target) as waited:
        assert waited.settings.fetched
    with Checkpointd(hung_server_target, settings_in_background=True) as background:
        assert not background.settings.fetched
    with Checkpointd(target, watch_config=False) as unwatched:
        assert not unwatched.settings.fetched
        assert unwatched.policy().is_enabled("on_error")


def test_a_deadline_spent_waiting_for_the_settings_is_reported_as_such_without_a_call(hung_server_target: str) -> None:
    """One deadline covers the wait for the settings and the checkpoint (interceptors.py): when
    nothing is left of it, no call is made and the warning says where the time went."""
    spent = FixedSettings(CheckpointSettings(client_deadline_s=0.0))
    with grpc.insecure_channel(hung_server_target) as channel:
        interceptor = ToolCheckpointInterceptor(CheckpointClient(channel), TriggerPolicy(spent))
        taken = interceptor.begin(ToolCall("framework/patch", "01M8X8FY7GXHDEE1ASHKVMYEVJ"))
    assert taken.before is None
    (warning,) = taken.warnings
    assert "DEADLINE_EXCEEDED: checkpointd's settings could not be read within the 0 s deadline" in warning
