"""The trigger policy: server settings kept fresh through WatchConfig, local switches, a closed vocabulary."""

from __future__ import annotations

from concurrent import futures
from pathlib import Path

import grpc
import pytest

from checkpoint.v1 import checkpoint_service_pb2 as pb
from checkpointd_client import (
    AutoTrigger,
    CheckpointConfigWatcher,
    Checkpointd,
    CheckpointSettings,
    ConfigClient,
    ConfigKey,
    FixedSettings,
    OnUnavailable,
    TriggerPolicy,
    UnknownTriggerError,
    from_value,
    open_channel,
)
from checkpointd_client.reference import PlanContext, ToolRunner, WriteFileTool

WAIT_S = 30


def test_watcher_starts_from_the_servers_settings(fresh_checkpointd: Checkpointd) -> None:
    assert fresh_checkpointd.settings.fetched
    assert fresh_checkpointd.settings.current() == CheckpointSettings(
        auto_create_on=frozenset(AutoTrigger), on_unavailable=OnUnavailable.PROCEED, client_deadline_s=5.0
    )


def test_server_default_names_exactly_the_clients_triggers(checkpointd: Checkpointd) -> None:
    entry = checkpointd.config.get_config(ConfigKey.AUTO_CREATE_ON)

    assert sorted(from_value(entry.default_value)) == sorted(trigger.value for trigger in AutoTrigger)


def test_set_config_reaches_the_policy_through_watch_config(
    fresh_checkpointd: Checkpointd, fresh_workspace: Path, plan_id: str, list_plan
) -> None:
    runner = ToolRunner(fresh_checkpointd.checkpoints, fresh_checkpointd.policy())
    runner.register(WriteFileTool())
    plan = PlanContext(workspace_root=fresh_workspace, plan_id=plan_id)

    fresh_checkpointd.config.set_config(ConfigKey.AUTO_CREATE_ON, ["before_tool_execute"])
    assert fresh_checkpointd.settings.wait_for(
        lambda s: s.auto_create_on == {AutoTrigger.BEFORE_TOOL_EXECUTE}, timeout=WAIT_S
    )
    runner.execute("local/write-file", {"path": "a.txt", "content": "x"}, plan)

    assert [c.phase for c in list_plan(fresh_checkpointd.checkpoints, plan_id)] == [pb.PHASE_BEFORE_TOOL_EXECUTE]
    assert not runner.interceptor.policy.is_enabled(AutoTrigger.AFTER_TOOL_EXECUTE)


def test_watch_reconnects_after_a_server_restart(fresh_server, fresh_checkpointd: Checkpointd) -> None:
    fresh_server.stop()
    fresh_server.start()
    channel = open_channel(fresh_server.unix_target)
    grpc.channel_ready_future(channel).result(timeout=60)
    config = ConfigClient(channel)

    config.set_config(ConfigKey.ON_UNAVAILABLE, "refuse")
    config.set_config(ConfigKey.CLIENT_DEADLINE_MS, 750)

    assert fresh_checkpointd.settings.wait_for(
        lambda s: (s.on_unavailable, s.client_deadline_s) == (OnUnavailable.REFUSE, 0.75), timeout=WAIT_S
    )


def test_an_unknown_trigger_read_from_the_server_is_refused(scripted_config_server) -> None:
    scripted_config_server.service.push(ConfigKey.AUTO_CREATE_ON, ["before_tool_execute", "on_teleport"])
    watcher = CheckpointConfigWatcher(ConfigClient(open_channel(scripted_config_server.target)))

    with pytest.raises(UnknownTriggerError, match="on_teleport") as refused:
        watcher.refresh()
    assert refused.value.name == "on_teleport"
    with pytest.raises(UnknownTriggerError):
        watcher.current()


def test_an_unknown_trigger_pushed_by_watch_config_stops_write_tools(
    scripted_config_server, tmp_path: Path, plan_id: str
) -> None:
    with Checkpointd(scripted_config_server.target) as checkpointd:
        runner = ToolRunner(checkpointd.checkpoints, checkpointd.policy())
        runner.register(WriteFileTool())
        plan = PlanContext(workspace_root=tmp_path, plan_id=plan_id)

        scripted_config_server.service.push(ConfigKey.AUTO_CREATE_ON, ["on_teleport"])
        assert checkpointd.settings.wait_for_refusal(timeout=WAIT_S)
        with pytest.raises(UnknownTriggerError, match="on_teleport"):
            runner.execute("local/write-file", {"path": "a.txt", "content": "x"}, plan)
        assert not (tmp_path / "a.txt").exists()

        scripted_config_server.service.push(ConfigKey.AUTO_CREATE_ON, ["on_error"])
        assert checkpointd.settings.wait_for(
            lambda s: s.auto_create_on == {AutoTrigger.ON_ERROR}, timeout=WAIT_S
        )
        runner.execute("local/write-file", {"path": "a.txt", "content": "x"}, plan)
        assert (tmp_path / "a.txt").read_text() == "x"


def test_settings_read_in_the_background_hold_up_the_first_decision_not_the_start(scripted_config_server) -> None:
    service = scripted_config_server.service
    service.push(ConfigKey.ON_UNAVAILABLE, "refuse")
    service.hold_reads()
    with Checkpointd(scripted_config_server.target, settings_in_background=True) as checkpointd:
        assert service.reads_started.wait(WAIT_S)  # constructed while its first read is stuck
        with futures.ThreadPoolExecutor(1) as pool:
            decided = pool.submit(checkpointd.policy().settings)
            # Not the defaults at once: a decision waits for the read (at most one deadline)...
            assert not futures.wait([decided], timeout=0.5).done
            service.release_reads()
            # ... so it follows what the server says, here "refuse" rather than the default "proceed".
            assert decided.result(timeout=WAIT_S).on_unavailable is OnUnavailable.REFUSE


@pytest.mark.parametrize("name", ["on_teleport", "manual", "rollback", "BEFORE_TOOL_EXECUTE", ""])
def test_local_switches_refuse_unknown_trigger_names(name: str) -> None:
    policy = TriggerPolicy()

    with pytest.raises(UnknownTriggerError):
        TriggerPolicy(disabled=[name])
    with pytest.raises(UnknownTriggerError):
        policy.disable(name)
    with pytest.raises(UnknownTriggerError):
        policy.is_enabled(name)


def test_local_switches_narrow_the_server_settings() -> None:
    server = FixedSettings(
        CheckpointSettings(auto_create_on=frozenset({AutoTrigger.BEFORE_TOOL_EXECUTE, AutoTrigger.ON_ERROR}))
    )
    tools = TriggerPolicy(server, disabled=["on_error"])
    executor = tools.derive()

    enabled_for_tools = {t for t in AutoTrigger if tools.is_enabled(t)}
    enabled_for_executor = {t for t in AutoTrigger if executor.is_enabled(t)}
    executor.disable("before_tool_execute")
    tools.enable("on_error")

    assert enabled_for_tools == {AutoTrigger.BEFORE_TOOL_EXECUTE}
    assert enabled_for_executor == {AutoTrigger.BEFORE_TOOL_EXECUTE, AutoTrigger.ON_ERROR}
    assert {t for t in AutoTrigger if executor.is_enabled(t)} == {AutoTrigger.ON_ERROR}
    assert {t for t in AutoTrigger if tools.is_enabled(t)} == {AutoTrigger.BEFORE_TOOL_EXECUTE, AutoTrigger.ON_ERROR}


def test_the_automatic_triggers_are_the_proto_enum_minus_the_non_automatic_ones() -> None:
    proto_names = {name.removeprefix("TRIGGER_").lower() for name in pb.Trigger.DESCRIPTOR.values_by_name}

    assert proto_names - {"unspecified", "manual", "rollback"} == {t.value for t in AutoTrigger}
    assert all(pb.Trigger.Name(t.proto) == "TRIGGER_" + t.value.upper() for t in AutoTrigger)
