"""grpcurl through reflection only (no .proto files): list, describe every service, message and
enum, and call every RPC (the WatchConfig stream and health Check included) over TCP and over
the unix socket; errors show their ErrorInfo reason. buf curl works the same way.
"""

from __future__ import annotations

import base64
import io
import json
import shutil
import subprocess
import sys
import tarfile
from pathlib import Path

import pytest
from google.rpc import error_details_pb2

from checkpoint.v1 import admin_service_pb2, checkpoint_service_pb2, config_service_pb2, errors_pb2
from tests.helpers import skip_unless_ci

REPO = Path(__file__).resolve().parents[2]
GRPCURL = shutil.which("grpcurl", path=str(Path(sys.executable).parent)) or shutil.which("grpcurl")
BUF = REPO / "clients" / "node" / "node_modules" / ".bin" / "buf"
CONTRACT_FILES = [checkpoint_service_pb2.DESCRIPTOR, config_service_pb2.DESCRIPTOR, errors_pb2.DESCRIPTOR,
                  admin_service_pb2.DESCRIPTOR]
SERVICES = [
    "checkpoint.v1.AdminService",
    "checkpoint.v1.CheckpointService",
    "checkpoint.v1.ConfigService",
    "grpc.health.v1.Health",
    "grpc.reflection.v1alpha.ServerReflection",
]

if GRPCURL is None:
    skip_unless_ci("grpcurl missing: `make install` installs it", allow_module_level=True)


def address(server, transport: str) -> list[str]:
    if transport == "tcp":
        return ["-plaintext", server.tcp_target]
    return ["-plaintext", "-unix", server.unix_target.removeprefix("unix://")]


def grpcurl(server, transport: str, *args: str, data: dict | None = None) -> subprocess.CompletedProcess[str]:
    """Runs grpcurl; `args` is [flags..., symbol-or-verb...] placed after the address."""
    verb_at = next(i for i, a in enumerate(args) if not a.startswith("-"))
    flags, rest = list(args[:verb_at]), list(args[verb_at:])
    if data is not None:
        flags += ["-d", json.dumps(data)]
    command = [GRPCURL, *flags, *address(server, transport), *rest]
    return subprocess.run(command, capture_output=True, text=True, timeout=60, stdin=subprocess.DEVNULL)


def call(server, transport: str, method: str, data: dict | None = None) -> dict:
    result = grpcurl(server, transport, method, data=data or {})
    assert result.returncode == 0, f"{method}: {result.stdout}{result.stderr}"
    return json.loads(result.stdout)


def contract_symbols() -> list[str]:
    symbols = []
    for file in CONTRACT_FILES:
        symbols += [s.full_name for s in file.services_by_name.values()]
        symbols += [m.full_name for m in file.message_types_by_name.values()]
        symbols += [e.full_name for e in file.enum_types_by_name.values()]
    return symbols


@pytest.fixture(params=["tcp", "unix"])
def transport(request) -> str:
    return request.param


def test_list_shows_every_service(checkpointd_server, transport):
    result = grpcurl(checkpointd_server, transport, "list")
    assert result.returncode == 0, result.stderr
    assert result.stdout.split() == SERVICES


def test_describe_every_service_message_and_enum(checkpointd_server, transport):
    symbols = contract_symbols()
    assert len(symbols) > 30
    for symbol in symbols:
        result = grpcurl(checkpointd_server, transport, "describe", symbol)
        assert result.returncode == 0, f"describe {symbol}: {result.stderr}"
        assert result.stdout.startswith(f"{symbol} is a"), result.stdout


def test_describe_shows_fields_and_rpcs(checkpointd_server, transport):
    service = grpcurl(checkpointd_server, transport, "describe", "checkpoint.v1.CheckpointService").stdout
    for rpc in checkpoint_service_pb2.DESCRIPTOR.services_by_name["CheckpointService"].methods_by_name:
        assert f"rpc {rpc} (" in service
    message = grpcurl(checkpointd_server, transport, "describe", "checkpoint.v1.Checkpoint").stdout
    assert ".google.protobuf.Timestamp create_time = 9;" in message
    assert "map<string, string> labels = 7;" in message


def test_health_check(checkpointd_server, transport):
    assert call(checkpointd_server, transport, "grpc.health.v1.Health/Check") == {"status": "SERVING"}


def test_every_checkpoint_rpc(checkpointd_server, transport, workspace, plan_id):
    (workspace / "notes.txt").write_text("one")
    service = "checkpoint.v1.CheckpointService"
    first = call(
        checkpointd_server,
        transport,
        f"{service}/CreateCheckpoint",
        {"plan_id": plan_id, "workspace_root": str(workspace), "trigger": "TRIGGER_MANUAL", "labels": {"k": "v"}},
    )["checkpoint"]
    assert first["phase"] == "PHASE_MANUAL" and first["has_files"] is True
    (workspace / "notes.txt").write_text("two")
    second = call(checkpointd_server, transport, f"{service}/CreateCheckpoint", {"planId": plan_id})["checkpoint"]

    got = call(checkpointd_server, transport, f"{service}/GetCheckpoint", {"checkpoint_id": first["checkpoint_id"]})
    assert got["checkpoint"]["labels"] == {"k": "v"}
    listed = call(checkpointd_server, transport, f"{service}/ListCheckpoints", {"plan_id": plan_id})
    assert [c["checkpoint_id"] for c in listed["checkpoints"]] == [second["checkpoint_id"], first["checkpoint_id"]]
    diff = call(
        checkpointd_server,
        transport,
        f"{service}/DiffCheckpoints",
        {"base_checkpoint_id": first["checkpoint_id"], "target_checkpoint_id": second["checkpoint_id"]},
    )
    assert [(c["path"], c["kind"]) for c in diff["changes"]] == [("notes.txt", "CHANGE_KIND_MODIFIED")]
    patched = call(checkpointd_server, transport, f"{service}/DiffCheckpoints",
                   {"base_checkpoint_id": first["checkpoint_id"], "target_checkpoint_id": second["checkpoint_id"],
                    "text_diffs": True})
    assert patched["changes"][0]["text_diff"].endswith("-one\n\\ No newline at end of file\n+two\n"
                                                       "\\ No newline at end of file\n")
    plans = call(checkpointd_server, transport, f"{service}/ListPlans",
                 {"filter": f'workspace_root = "{workspace}"'})
    assert [p["plan_id"] for p in plans["plans"]] == [plan_id]
    plan = call(checkpointd_server, transport, f"{service}/GetPlan", {"plan_id": plan_id})["plan"]
    assert plan["checkpoint_count"] == "2" and plan["newest_checkpoint_id"] == second["checkpoint_id"]
    read = call(checkpointd_server, transport, f"{service}/ReadCheckpointFile",
                {"checkpoint_id": first["checkpoint_id"], "path": "notes.txt"})
    assert base64.b64decode(read["data"]) == b"one" and read["entry_type"] == "ENTRY_TYPE_FILE"
    listed_files = call(checkpointd_server, transport, f"{service}/ListCheckpointFiles",
                        {"checkpoint_id": first["checkpoint_id"], "recursive": True})
    assert [(f["path"], f["entry_type"]) for f in listed_files["files"]] == [("notes.txt", "ENTRY_TYPE_FILE")]
    exported = call(checkpointd_server, transport, f"{service}/ExportCheckpoint",
                    {"checkpoint_id": first["checkpoint_id"]})
    with tarfile.open(fileobj=io.BytesIO(base64.b64decode(exported["data"]))) as tar:
        assert tar.extractfile("notes.txt").read() == b"one"
    rollback = call(
        checkpointd_server,
        transport,
        f"{service}/Rollback",
        {"plan_id": plan_id, "checkpoint_id": first["checkpoint_id"], "scope": "ROLLBACK_SCOPE_FILES"},
    )
    assert rollback["safety_checkpoint"]["trigger"] == "TRIGGER_ROLLBACK"
    assert (workspace / "notes.txt").read_text() == "one"
    deleted = call(
        checkpointd_server, transport, f"{service}/DeleteCheckpoint", {"checkpoint_id": second["checkpoint_id"]}
    )
    assert deleted == {}
    emptied = call(checkpointd_server, transport, f"{service}/DeleteCheckpoints", {"plan_id": plan_id})
    assert sorted(c["checkpoint_id"] for c in emptied["checkpoints"]) == sorted(
        [first["checkpoint_id"], rollback["safety_checkpoint"]["checkpoint_id"]])


def test_every_config_rpc_including_the_watch_stream(checkpointd_server, transport, plan_id):
    service = "checkpoint.v1.ConfigService"
    key = "core.checkpoints.auto_create_on"
    keys = [e["key"] for e in call(checkpointd_server, transport, f"{service}/ListConfig")["entries"]]
    assert key in keys
    assert call(checkpointd_server, transport, f"{service}/GetConfig", {"key": key})["entry"]["source"] == (
        "CONFIG_SOURCE_DEFAULT"
    )

    command = [
        GRPCURL, "-max-time", "60", "-d", json.dumps({"keys": [key], "plan_id": plan_id}),
        *address(checkpointd_server, transport), f"{service}/WatchConfig",
    ]  # fmt: skip
    watch = subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        current = read_json_message(watch)
        assert current["entry"]["source"] == "CONFIG_SOURCE_DEFAULT"
        set_reply = call(
            checkpointd_server,
            transport,
            f"{service}/SetConfig",
            {"key": key, "plan_id": plan_id, "value": ["on_error"]},
        )
        assert set_reply["entry"]["value"] == ["on_error"]
        changed = read_json_message(watch)
        assert changed["entry"]["value"] == ["on_error"]
        assert changed["entry"]["source"] == "CONFIG_SOURCE_PLAN"
    finally:
        watch.kill()
        watch.wait()
        watch.stdout.close()
        watch.stderr.close()


def test_the_admin_rpc(checkpointd_server, transport):
    reply = call(checkpointd_server, transport, "checkpoint.v1.AdminService/CheckIntegrity",
                 {"verify_unreferenced_objects": False})
    assert reply["ok"] is True, reply


def read_json_message(process: subprocess.Popen) -> dict:
    """The next pretty-printed JSON message grpcurl writes (a top-level `{` ... `}` block)."""
    lines = []
    for line in process.stdout:
        lines.append(line)
        if line.rstrip() == "}":
            return json.loads("".join(lines))
    raise AssertionError(f"the stream ended early: {''.join(lines)}{process.stderr.read()}")


def test_errors_show_their_error_info_reason(checkpointd_server, transport):
    result = grpcurl(
        checkpointd_server, transport, "checkpoint.v1.CheckpointService/CreateCheckpoint", data={"plan_id": "nope"}
    )
    assert result.returncode == 64 + 3, result.stdout + result.stderr
    output = result.stdout + result.stderr
    assert "Code: InvalidArgument" in output
    assert '"@type":"type.googleapis.com/google.rpc.ErrorInfo"' in output
    assert '"reason":"INVALID_PLAN_ID"' in output and '"domain":"checkpointd"' in output


def test_buf_curl_over_tcp_and_unix(checkpointd_server, plan_id):
    if not BUF.exists():
        skip_unless_ci("buf missing: run `npm ci` in clients/node")
    base = [str(BUF), "curl", "--protocol", "grpc", "--http2-prior-knowledge"]
    tcp = subprocess.run(
        [*base, "-d", json.dumps({"key": "core.checkpoints.on_unavailable"}),
         f"http://{checkpointd_server.tcp_target}/checkpoint.v1.ConfigService/GetConfig"],
        capture_output=True, text=True, timeout=60,
    )  # fmt: skip
    assert tcp.returncode == 0, tcp.stderr
    assert json.loads(tcp.stdout)["entry"]["defaultValue"] == "proceed"
    socket_path = checkpointd_server.unix_target.removeprefix("unix://")
    unix = subprocess.run(
        [*base, "--unix-socket", socket_path, "-d", json.dumps({"plan_id": plan_id}),
         "http://localhost/checkpoint.v1.CheckpointService/ListCheckpoints"],
        capture_output=True, text=True, timeout=60,
    )  # fmt: skip
    assert unix.returncode == 0, unix.stderr
    assert json.loads(unix.stdout) == {}
    failing = subprocess.run(
        [*base, "-d", json.dumps({"checkpoint_id": "bad"}),
         f"http://{checkpointd_server.tcp_target}/checkpoint.v1.CheckpointService/GetCheckpoint"],
        capture_output=True, text=True, timeout=60,
    )  # fmt: skip
    assert failing.returncode != 0
    # buf curl prints the Connect error JSON; it cannot resolve ErrorInfo, so the detail is base64.
    error = json.loads(failing.stderr)
    assert error["code"] == "invalid_argument"
    [detail] = error["details"]
    assert detail["type"] == "google.rpc.ErrorInfo"
    info = error_details_pb2.ErrorInfo.FromString(base64.b64decode(detail["value"] + "=" * (-len(detail["value"]) % 4)))
    assert (info.reason, info.domain) == ("INVALID_CHECKPOINT_ID", "checkpointd")
