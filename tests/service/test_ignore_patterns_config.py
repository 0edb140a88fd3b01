"""core.snapshot.ignore_patterns over a real server: a pattern that can never match is refused at
SetConfig with INVALID_CONFIG_VALUE, naming the pattern and why, and nothing is stored; a valid
pattern that makes backtracking matchers take exponential time is accepted and captures promptly."""

from __future__ import annotations

import tempfile
from pathlib import Path

import grpc
import pytest
from google.protobuf import json_format, struct_pb2
from ulid import ULID

from checkpoint.v1 import checkpoint_service_pb2 as pb
from checkpoint.v1 import checkpoint_service_pb2_grpc, config_service_pb2_grpc
from checkpoint.v1 import config_service_pb2 as cfg
from tests.conftest import serving_server
from tests.helpers import error_info

KEY = "core.snapshot.ignore_patterns"


def value(data) -> struct_pb2.Value:
    return json_format.ParseDict(data, struct_pb2.Value())


@pytest.fixture(scope="module")
def stubs(short_tmp, suite_databases):
    """A server of this module's own: a regression would store bad global values."""
    for server in serving_server(Path(tempfile.mkdtemp(prefix="ip-", dir=short_tmp)), suite_databases):
        with grpc.insecure_channel(server.tcp_target) as channel:
            yield (config_service_pb2_grpc.ConfigServiceStub(channel),
                   checkpoint_service_pb2_grpc.CheckpointServiceStub(channel), server)


@pytest.mark.parametrize("bad, why", [
    ("!", "negates nothing"),
    ("docs\\", "backslash"),
    ("[abc", "unclosed '['"),
    ("[[:nope:]]", "[:nope:]"),
    ("#secrets", "comment"),
    ("", "empty"),
])
@pytest.mark.parametrize("scope", ["global", "plan"])
def test_a_pattern_that_can_never_match_is_refused_and_nothing_is_stored(stubs, bad, why, scope):
    config, _, _ = stubs
    plan_id = str(ULID()) if scope == "plan" else ""
    with pytest.raises(grpc.RpcError) as refused:
        config.SetConfig(cfg.SetConfigRequest(key=KEY, plan_id=plan_id, value=value(["*.log", bad, "build/"])),
                         timeout=10)
    assert refused.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    info = error_info(refused.value)
    assert info.reason == "INVALID_CONFIG_VALUE" and info.metadata["key"] == KEY
    assert repr(bad) in refused.value.details() and why in refused.value.details(), refused.value.details()
    entry = config.GetConfig(cfg.GetConfigRequest(key=KEY, plan_id=plan_id), timeout=10).entry
    assert entry.source == cfg.CONFIG_SOURCE_DEFAULT
    assert json_format.MessageToDict(entry.value) == []


def test_a_pattern_that_backtracking_matchers_choke_on_is_accepted_and_captures_promptly(stubs):
    config, checkpoints, server = stubs
    plan_id = str(ULID())
    pattern = "*a*a*a*a*a*a*a*a*a*a*a*a*a*a*b"
    entry = config.SetConfig(cfg.SetConfigRequest(key=KEY, plan_id=plan_id, value=value([pattern])), timeout=10).entry
    assert json_format.MessageToDict(entry.value) == [pattern]
    root = server.new_workspace()
    (root / ("a" * 200)).write_text("kept")
    (root / ("a" * 199 + "b")).write_text("ignored")
    created = checkpoints.CreateCheckpoint(pb.CreateCheckpointRequest(plan_id=plan_id, workspace_root=str(root)),
                                           timeout=30).checkpoint
    assert created.file_count == 1
