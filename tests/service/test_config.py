"""ConfigService: typed registry, global value, per-plan override, watch stream."""

from __future__ import annotations

import queue
import threading

import grpc
import pytest
from google.protobuf import json_format, struct_pb2

from checkpoint.v1 import config_service_pb2 as cfg
from checkpoint.v1 import config_service_pb2_grpc

AUTO = "core.checkpoints.auto_create_on"
ALL_TRIGGERS = ["before_tool_execute", "after_tool_execute", "on_subplan_spawn", "on_error"]


def value(data) -> struct_pb2.Value:
    return json_format.ParseDict(data, struct_pb2.Value())


def plain(v: struct_pb2.Value):
    return json_format.MessageToDict(v)


@pytest.fixture
def fresh_config(fresh_server):
    """A server of its own, since these tests change global values."""
    with grpc.insecure_channel(fresh_server.tcp_target) as channel:
        yield config_service_pb2_grpc.ConfigServiceStub(channel)


def test_auto_create_on_is_registered_with_every_trigger_by_default(config_stub):
    entry = config_stub.GetConfig(cfg.GetConfigRequest(key=AUTO)).entry
    assert plain(entry.value) == ALL_TRIGGERS
    assert entry.source == cfg.CONFIG_SOURCE_DEFAULT and plain(entry.default_value) == ALL_TRIGGERS
    assert "on_subplan_spawn" in entry.description


def test_list_shows_every_registered_key_sorted(config_stub):
    keys = [e.key for e in config_stub.ListConfig(cfg.ListConfigRequest()).entries]
    assert keys == sorted(keys)
    assert {AUTO, "core.checkpoints.on_unavailable", "core.checkpoints.client_deadline_ms",
            "core.snapshot.ignore_patterns", "core.snapshot.max_file_size_bytes"} <= set(keys)


def test_plan_override_wins_over_global_and_clearing_falls_back(config_stub, plan_id):
    set_plan = config_stub.SetConfig(cfg.SetConfigRequest(key=AUTO, plan_id=plan_id, value=value(["on_error"])))
    assert plain(set_plan.entry.value) == ["on_error"] and set_plan.entry.source == cfg.CONFIG_SOURCE_PLAN
    assert plain(config_stub.GetConfig(cfg.GetConfigRequest(key=AUTO)).entry.value) == ALL_TRIGGERS
    for_plan = config_stub.GetConfig(cfg.GetConfigRequest(key=AUTO, plan_id=plan_id)).entry
    assert plain(for_plan.value) == ["on_error"] and for_plan.HasField("update_time")
    cleared = config_stub.SetConfig(cfg.SetConfigRequest(key=AUTO, plan_id=plan_id, clear=True)).entry
    assert plain(cleared.value) == ALL_TRIGGERS and cleared.source == cfg.CONFIG_SOURCE_DEFAULT


def test_global_value_and_integer_normalisation(fresh_config):
    entry = fresh_config.SetConfig(cfg.SetConfigRequest(key="core.checkpoints.client_deadline_ms",
                                                       value=value(2500))).entry
    assert entry.source == cfg.CONFIG_SOURCE_GLOBAL and plain(entry.value) == 2500
    empty = fresh_config.SetConfig(cfg.SetConfigRequest(key=AUTO, value=value([]))).entry
    assert plain(empty.value) == []


def test_duplicate_trigger_is_refused(config_stub, plan_id):
    with pytest.raises(grpc.RpcError) as caught:
        config_stub.SetConfig(cfg.SetConfigRequest(key=AUTO, plan_id=plan_id,
                                                   value=value(["on_error", "on_error"])))
    assert caught.value.code() == grpc.StatusCode.INVALID_ARGUMENT


def test_watch_sends_current_value_then_every_change(config_stub, plan_id):
    stream = config_stub.WatchConfig(cfg.WatchConfigRequest(keys=[AUTO], plan_id=plan_id), timeout=20)
    received: queue.Queue = queue.Queue()

    def pump():
        try:
            for message in stream:
                received.put(message.entry)
        except grpc.RpcError:
            pass

    threading.Thread(target=pump, daemon=True).start()
    first = received.get(timeout=10)
    assert plain(first.value) == ALL_TRIGGERS and first.source == cfg.CONFIG_SOURCE_DEFAULT
    config_stub.SetConfig(cfg.SetConfigRequest(key=AUTO, plan_id=plan_id, value=value(["before_tool_execute"])))
    second = received.get(timeout=10)
    assert plain(second.value) == ["before_tool_execute"] and second.source == cfg.CONFIG_SOURCE_PLAN
    config_stub.SetConfig(cfg.SetConfigRequest(key=AUTO, plan_id=plan_id, clear=True))
    third = received.get(timeout=10)
    assert plain(third.value) == ALL_TRIGGERS
    stream.cancel()


def test_watch_stream_ends_when_the_server_drains(fresh_server):
    with grpc.insecure_channel(fresh_server.tcp_target) as channel:
        stream = config_service_pb2_grpc.ConfigServiceStub(channel).WatchConfig(cfg.WatchConfigRequest(), timeout=60)
        assert next(stream).entry.key
        exit_code: list = []
        stopper = threading.Thread(target=lambda: exit_code.append(fresh_server.stop()))
        stopper.start()
        try:
            for _ in stream:
                pass
            ended = "cleanly"
        except grpc.RpcError as error:
            ended = error.code()
        stopper.join()
    assert ended != grpc.StatusCode.DEADLINE_EXCEEDED
    assert exit_code == [0], f"the server did not exit cleanly; its log:\n{fresh_server.log()}"
