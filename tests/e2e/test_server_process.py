"""`checkpointd serve` as a process: defaults, environment, unix socket, drain."""

from __future__ import annotations

import os
import signal
import socket
import stat
import subprocess
import tempfile
import time
from pathlib import Path

import grpc
import pytest
from grpc_health.v1 import health_pb2, health_pb2_grpc
from ulid import ULID

from checkpoint.v1 import checkpoint_service_pb2 as pb
from checkpoint.v1 import checkpoint_service_pb2_grpc
from tests.conftest import CHECKPOINTD, free_port
from tests.helpers import dump_stacks_then_kill, skip_unless_ci


def wait_serving(target: str, process: subprocess.Popen, timeout: float = 30) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        assert process.poll() is None, process.stdout.read() if process.stdout else ""
        try:
            with grpc.insecure_channel(target) as channel:
                status = health_pb2_grpc.HealthStub(channel).Check(health_pb2.HealthCheckRequest(), timeout=0.5)
            if status.status == health_pb2.HealthCheckResponse.SERVING:
                return
        except grpc.RpcError:
            time.sleep(0.1)
    raise AssertionError(f"{target} never became healthy")


def sigterm_and_wait(process: subprocess.Popen, timeout: float = 30) -> int:
    """SIGTERM, then the exit status; a server that has not stopped within ``timeout`` fails
    the test with its log, stacks included (see dump_stacks_then_kill)."""
    process.send_signal(signal.SIGTERM)
    try:
        return process.wait(timeout=timeout)
    except subprocess.TimeoutExpired:
        dump_stacks_then_kill(process)
        pytest.fail(f"the server did not stop within {timeout}s of SIGTERM; its output:\n{process.stdout.read()}")


def test_help_documents_every_serve_option():
    top = subprocess.run([CHECKPOINTD, "--help"], capture_output=True, text=True, check=True).stdout
    assert "serve" in top
    serve = subprocess.run([CHECKPOINTD, "serve", "--help"], capture_output=True, text=True, check=True).stdout
    for option in ("--listen", "--data-dir", "--db-url", "--workspace-root", "CHECKPOINTD_LISTEN",
                   "CHECKPOINTD_DATA_DIR", "CHECKPOINTD_DB_URL", "CHECKPOINTD_WORKSPACE_ROOT"):
        assert option in serve


def test_embedded_defaults_listen_on_50051_and_a_socket_in_the_data_dir(short_tmp):
    # Under short_tmp: the socket's path must stay under 108 bytes, which a pytest-xdist worker's
    # tmp_path (/tmp/pytest-of-root/pytest-1134/popen-gw0/...) does not leave room for.
    tmp_path = Path(tempfile.mkdtemp(prefix="e-", dir=short_tmp))
    with socket.socket() as probe:
        if probe.connect_ex(("127.0.0.1", 50051)) == 0:
            skip_unless_ci("port 50051 is in use on this machine")
    env = {k: v for k, v in os.environ.items() if not k.startswith("CHECKPOINTD_")}
    env["XDG_DATA_HOME"] = str(tmp_path / "xdg")
    process = subprocess.Popen([CHECKPOINTD, "serve"], cwd=tmp_path, env=env, stdout=subprocess.PIPE,
                               stderr=subprocess.STDOUT, text=True)
    try:
        wait_serving("127.0.0.1:50051", process)
        data_dir = tmp_path / "xdg" / "checkpointd"
        sock = data_dir / "checkpointd.sock"
        assert stat.S_ISSOCK(sock.stat().st_mode)
        assert (data_dir / "checkpointd.db").exists()
        with grpc.insecure_channel(f"unix://{sock}") as channel:
            stub = checkpoint_service_pb2_grpc.CheckpointServiceStub(channel)
            (tmp_path / "work").mkdir()
            created = stub.CreateCheckpoint(pb.CreateCheckpointRequest(
                plan_id=str(ULID()), workspace_root=str(tmp_path / "work")), timeout=10).checkpoint
            assert created.has_files
    finally:
        assert sigterm_and_wait(process) == 0


def test_environment_variables_configure_serve_and_sigterm_drains_cleanly(short_tmp):
    base = short_tmp / f"env-{ULID()}"
    base.mkdir()
    port = free_port()
    sock = base / "s.sock"
    roots = [base / "a", base / "b"]
    for root in roots:
        root.mkdir()
    env = {**os.environ, "CHECKPOINTD_LISTEN": f"127.0.0.1:{port},unix://{sock}",
           "CHECKPOINTD_DATA_DIR": str(base / "data"),
           "CHECKPOINTD_WORKSPACE_ROOT": os.pathsep.join(str(r) for r in roots)}
    process = subprocess.Popen([CHECKPOINTD, "serve"], env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                               text=True)
    try:
        wait_serving(f"127.0.0.1:{port}", process)
        assert stat.S_IMODE(sock.stat().st_mode) == 0o660
        with grpc.insecure_channel(f"unix://{sock}") as channel:
            stub = checkpoint_service_pb2_grpc.CheckpointServiceStub(channel)
            for root in roots:
                stub.CreateCheckpoint(pb.CreateCheckpointRequest(plan_id=str(ULID()), workspace_root=str(root)),
                                      timeout=10)
            with pytest.raises(grpc.RpcError) as caught:
                stub.CreateCheckpoint(pb.CreateCheckpointRequest(plan_id=str(ULID()), workspace_root=str(base)),
                                      timeout=10)
            assert caught.value.code() == grpc.StatusCode.PERMISSION_DENIED
    finally:
        assert sigterm_and_wait(process) == 0
    assert not sock.exists()
    output = process.stdout.read()
    assert "draining" in output
    # A first start names the schema's revision in one line, without Alembic's narration of each step.
    assert "upgraded from an empty database" in output and "alembic" not in output


def test_a_workspace_root_that_is_not_a_directory_is_named_at_start(short_tmp):
    base = short_tmp / f"roots-{ULID()}"
    base.mkdir()
    port = free_port()
    missing = base / "not-mounted-yet"
    process = subprocess.Popen([CHECKPOINTD, "serve", "--listen", f"127.0.0.1:{port}", "--data-dir", str(base / "data"),
                                "--workspace-root", str(base), "--workspace-root", str(missing)],
                               stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    try:
        wait_serving(f"127.0.0.1:{port}", process)
    finally:
        assert sigterm_and_wait(process) == 0
    output = process.stdout.read()
    assert f"workspace root {missing} is not a directory (yet)" in output
    assert f"workspace root {base} is not" not in output


def test_a_stale_socket_file_from_a_crashed_server_is_replaced(fresh_server):
    fresh_server.kill()
    stale = socket.socket(socket.AF_UNIX)
    if not fresh_server.socket_path.exists():
        stale.bind(str(fresh_server.socket_path))
    stale.close()
    assert fresh_server.socket_path.exists()
    fresh_server.start()
    with grpc.insecure_channel(fresh_server.unix_target) as channel:
        status = health_pb2_grpc.HealthStub(channel).Check(health_pb2.HealthCheckRequest(), timeout=5)
    assert status.status == health_pb2.HealthCheckResponse.SERVING


def test_a_second_server_on_a_live_socket_refuses_to_start(checkpointd_server, tmp_path):
    result = subprocess.run([CHECKPOINTD, "serve", "--listen", checkpointd_server.unix_target,
                             "--data-dir", str(tmp_path / "d"), "--workspace-root", str(tmp_path)],
                            capture_output=True, text=True, timeout=30)
    assert result.returncode == 2
    assert f"another server is listening on unix socket {checkpointd_server.socket_path}" in result.stderr
    assert "--listen unix:///PATH" in result.stderr and "Traceback" not in result.stderr
    assert not (tmp_path / "d").exists(), "a server that cannot listen created its data dir (and database)"
