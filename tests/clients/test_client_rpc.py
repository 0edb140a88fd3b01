"""The typed clients against the real server, over TCP and over the unix socket."""

from __future__ import annotations

import json
import os
from pathlib import Path

import grpc
import pytest

from checkpoint.v1 import checkpoint_service_pb2 as pb
from checkpointd_client import (
    AutoTrigger,
    CheckpointClient,
    Checkpointd,
    CheckpointdRpcError,
    ConfigKey,
    from_value,
    new_request_id,
    open_channel,
    phase_name,
    retry_service_config,
    to_value,
    trigger_name,
)
from checkpointd_client.client import validate_target


def test_create_get_and_list_round_trip(checkpointd: Checkpointd, workspace: Path, plan_id: str) -> None:
    (workspace / "notes.txt").write_text("hello")
    created = checkpointd.checkpoints.create_checkpoint(
        plan_id,
        source_tool="test",
        labels={"step": "one"},
        description="a manual checkpoint",
        state=b"plan-state-1",
        workspace_root=workspace,
    )

    fetched = checkpointd.checkpoints.get_checkpoint(created.checkpoint_id, full=True)
    listed = checkpointd.checkpoints.list_checkpoints(plan_id)

    assert fetched.checkpoint_id == created.checkpoint_id
    assert (phase_name(fetched.phase), trigger_name(fetched.trigger)) == ("manual", "manual")
    assert fetched.state == b"plan-state-1"
    assert dict(fetched.labels) == {"step": "one"}
    assert fetched.has_files and fetched.file_count == 1
    assert [c.checkpoint_id for c in listed] == [created.checkpoint_id]


def test_automatic_trigger_records_the_phase_it_implies(
    checkpointd: Checkpointd, workspace: Path, plan_id: str
) -> None:
    created = {
        trigger: checkpointd.checkpoints.create_checkpoint(plan_id, trigger=trigger, workspace_root=workspace)
        for trigger in AutoTrigger
    }

    recorded = {trigger: (phase_name(c.phase), trigger_name(c.trigger)) for trigger, c in created.items()}
    assert recorded == {
        AutoTrigger.BEFORE_TOOL_EXECUTE: ("before_tool_execute", "before_tool_execute"),
        AutoTrigger.AFTER_TOOL_EXECUTE: ("after_tool_execute", "after_tool_execute"),
        AutoTrigger.ON_SUBPLAN_SPAWN: ("execute", "on_subplan_spawn"),
        AutoTrigger.ON_ERROR: ("on_error", "on_error"),
    }


def test_a_repeated_request_id_returns_the_first_checkpoint(
    checkpointd: Checkpointd, workspace: Path, plan_id: str
) -> None:
    request_id = new_request_id()
    first = checkpointd.checkpoints.create_checkpoint(plan_id, workspace_root=workspace, request_id=request_id)
    again = checkpointd.checkpoints.create_checkpoint(plan_id, workspace_root=workspace, request_id=request_id)

    assert again.checkpoint_id == first.checkpoint_id
    assert len(checkpointd.checkpoints.list_checkpoints(plan_id)) == 1


def test_each_call_gets_its_own_request_id(checkpointd: Checkpointd, workspace: Path, plan_id: str) -> None:
    first = checkpointd.checkpoints.create_checkpoint(plan_id, workspace_root=workspace)
    second = checkpointd.checkpoints.create_checkpoint(plan_id, workspace_root=workspace)

    assert first.checkpoint_id != second.checkpoint_id
    assert [c.sequence for c in checkpointd.checkpoints.list_checkpoints(plan_id)] == [2, 1]


def test_errors_carry_the_error_info_reason(checkpointd: Checkpointd, plan_id: str) -> None:
    with pytest.raises(CheckpointdRpcError) as bad_id:
        checkpointd.checkpoints.get_checkpoint("not-a-ulid")
    with pytest.raises(CheckpointdRpcError) as bad_plan:
        checkpointd.checkpoints.create_checkpoint("plan-1")
    with pytest.raises(CheckpointdRpcError) as missing:
        checkpointd.checkpoints.get_checkpoint(plan_id)

    assert (bad_id.value.code, bad_id.value.reason) == (grpc.StatusCode.INVALID_ARGUMENT, "INVALID_CHECKPOINT_ID")
    assert bad_id.value.domain == "checkpointd"
    assert bad_id.value.metadata.get("value") == "not-a-ulid"
    assert (bad_plan.value.code, bad_plan.value.reason) == (grpc.StatusCode.INVALID_ARGUMENT, "INVALID_PLAN_ID")
    assert (missing.value.code, missing.value.reason) == (grpc.StatusCode.NOT_FOUND, "CHECKPOINT_NOT_FOUND")


def test_diff_rollback_and_delete(checkpointd: Checkpointd, workspace: Path, plan_id: str) -> None:
    client = checkpointd.checkpoints
    (workspace / "a.txt").write_text("one")
    base = client.create_checkpoint(plan_id, workspace_root=workspace, state=b"s1")
    (workspace / "a.txt").write_text("two, longer")
    (workspace / "b.txt").write_text("new")
    target = client.create_checkpoint(plan_id, workspace_root=workspace, state=b"s2")

    changes = {c.path: c.kind for c in client.diff_checkpoints(base.checkpoint_id, target.checkpoint_id)}
    dry = client.rollback(plan_id, base.checkpoint_id, dry_run=True)
    unchanged_by_dry_run = (workspace / "a.txt").read_text()
    restored = client.rollback(plan_id, base.checkpoint_id)

    assert changes == {"a.txt": pb.CHANGE_KIND_MODIFIED, "b.txt": pb.CHANGE_KIND_ADDED}
    # Every page by default; only the first, with the rest counted, on request.
    paged = client.diff_checkpoints(base.checkpoint_id, target.checkpoint_id, page_size=1)
    assert ([c.path for c in paged], paged.omitted) == (["a.txt", "b.txt"], 0)
    first = client.diff_checkpoints(base.checkpoint_id, target.checkpoint_id, page_size=1, all_pages=False)
    assert ([c.path for c in first], first.omitted) == (["a.txt"], 1)
    assert dry.dry_run and {c.path for c in dry.changes} == {"a.txt", "b.txt"}
    assert unchanged_by_dry_run == "two, longer"
    assert (workspace / "a.txt").read_text() == "one"
    assert not (workspace / "b.txt").exists()
    assert restored.state == b"s1"
    assert phase_name(restored.safety_checkpoint.phase) == "rollback_safety"

    client.delete_checkpoint(target.checkpoint_id)
    with pytest.raises(CheckpointdRpcError) as gone:
        client.get_checkpoint(target.checkpoint_id)
    assert gone.value.reason == "CHECKPOINT_NOT_FOUND"


def test_paths_may_be_bytes_for_names_that_are_not_utf8(checkpointd: Checkpointd, workspace: Path,
                                                        plan_id: str) -> None:
    client = checkpointd.checkpoints
    latin1 = os.path.join(os.fsencode(workspace), b"caf\xe9.txt")
    with open(latin1, "wb") as f:
        f.write(b"v1")
    (workspace / "other.txt").write_text("v1")
    base = client.create_checkpoint(plan_id, workspace_root=workspace)
    with open(latin1, "wb") as f:
        f.write(b"v2")
    (workspace / "other.txt").write_text("v2")

    (change,) = client.diff_checkpoints(base.checkpoint_id, paths=[b"caf\xe9.txt"])
    restored = client.rollback(plan_id, base.checkpoint_id, paths=[change.raw_path])

    assert (change.path, change.raw_path) == ("caf\\xe9.txt", b"caf\xe9.txt")
    assert [c.raw_path for c in restored.changes] == [b"caf\xe9.txt"]
    assert Path(os.fsdecode(latin1)).read_bytes() == b"v1"
    assert (workspace / "other.txt").read_text() == "v2"
    for not_a_path_list in ([Path("other.txt")], "other.txt"):
        with pytest.raises(TypeError):
            client.rollback(plan_id, base.checkpoint_id, paths=not_a_path_list)
    assert (workspace / "other.txt").read_text() == "v2"


def test_config_client_reads_and_overrides_per_plan(checkpointd: Checkpointd, plan_id: str) -> None:
    config = checkpointd.config
    keys = {entry.key for entry in config.list_config()}
    global_value = from_value(config.get_config(ConfigKey.ON_UNAVAILABLE).value)

    overridden = config.set_config(ConfigKey.ON_UNAVAILABLE, "refuse", plan_id=plan_id)
    for_plan = from_value(config.get_config(ConfigKey.ON_UNAVAILABLE, plan_id=plan_id).value)
    still_global = from_value(config.get_config(ConfigKey.ON_UNAVAILABLE).value)
    cleared = config.clear_config(ConfigKey.ON_UNAVAILABLE, plan_id=plan_id)

    assert {key.value for key in ConfigKey} <= keys
    assert from_value(overridden.value) == "refuse" and for_plan == "refuse"
    assert still_global == global_value
    assert from_value(cleared.value) == global_value
    with pytest.raises(CheckpointdRpcError) as invalid:
        config.set_config(ConfigKey.ON_UNAVAILABLE, "sometimes", plan_id=plan_id)
    assert (invalid.value.code, invalid.value.reason) == (grpc.StatusCode.INVALID_ARGUMENT, "INVALID_CONFIG_VALUE")


def test_bearer_token_travels_as_authorization_metadata(fault_proxy, plan_id: str) -> None:
    with_token = CheckpointClient(open_channel(fault_proxy.target), token="s3cret")
    without_token = CheckpointClient(open_channel(fault_proxy.target))

    for client in (with_token, without_token):
        with pytest.raises(CheckpointdRpcError):
            client.get_checkpoint(plan_id)

    sent = [call.metadata.get("authorization") for call in fault_proxy.calls_to("GetCheckpoint")]
    assert sent == ["Bearer s3cret", None]


@pytest.mark.parametrize("address", ["localhost", "unix:relative.sock", "unix://relative.sock", ":50051", "h:port",
                                     "[::1]:99999", "localhost:0"])
def test_malformed_targets_are_refused_before_dialing(address: str) -> None:
    with pytest.raises(ValueError, match="target"):
        validate_target(address)


def test_tls_options_that_cannot_work_are_refused_before_dialing() -> None:
    credentials = grpc.ssl_channel_credentials()
    with pytest.raises(ValueError, match="unix sockets in plaintext"):
        open_channel("unix:///run/checkpointd.sock", credentials=credentials)
    with pytest.raises(ValueError, match="TLS only"):
        open_channel("127.0.0.1:50051", server_name="localhost")
    open_channel("127.0.0.1:50051", credentials=credentials, server_name="localhost").close()


def test_retry_policy_retries_unary_calls_on_unavailable_only() -> None:
    (method_config,) = json.loads(retry_service_config())["methodConfig"]

    assert method_config["retryPolicy"]["retryableStatusCodes"] == ["UNAVAILABLE"]
    assert {(n["service"], n.get("method", "*")) for n in method_config["name"]} == {
        ("checkpoint.v1.CheckpointService", "*"),
        ("checkpoint.v1.ConfigService", "GetConfig"),
        ("checkpoint.v1.ConfigService", "ListConfig"),
        ("checkpoint.v1.ConfigService", "SetConfig"),
    }


@pytest.mark.parametrize("value", [None, True, 3.0, "x", ["a", "b"], {"k": [1.0, {"n": None}]}])
def test_json_values_round_trip_through_protobuf_value(value: object) -> None:
    assert from_value(to_value(value)) == value
