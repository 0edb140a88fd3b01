"""Shared fixtures: real `checkpointd serve` processes over TCP and a unix socket."""

from __future__ import annotations

import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
import uuid
from collections.abc import Iterator
from pathlib import Path

import grpc
import pytest
from grpc_health.v1 import health_pb2, health_pb2_grpc
from ulid import ULID

from checkpoint.v1 import checkpoint_service_pb2_grpc, config_service_pb2_grpc

CHECKPOINTD = str(Path(sys.executable).with_name("checkpointd"))


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class RunningServer:
    """A `checkpointd serve` subprocess; restartable on the same port, socket and data."""

    def __init__(self, base: Path, db_url: str = "", extra_args: tuple[str, ...] = ()) -> None:
        self.base = base
        self.data_dir = base / "data"
        self.allowed_root = base / "workspaces"
        self.allowed_root.mkdir(parents=True, exist_ok=True)
        self.socket_path = base / "checkpointd.sock"
        self.port = free_port()
        self.tcp_target = f"127.0.0.1:{self.port}"
        self.unix_target = f"unix://{self.socket_path}"
        self.db_url = db_url
        self.extra_args = extra_args
        self.log_path = base / "server.log"
        self.process: subprocess.Popen | None = None

    def command(self) -> list[str]:
        cmd = [CHECKPOINTD, "serve", "--listen", self.tcp_target, "--listen", self.unix_target,
               "--data-dir", str(self.data_dir), "--workspace-root", str(self.allowed_root),
               "--grace-seconds", "5", *self.extra_args]
        if self.db_url:
            cmd += ["--db-url", self.db_url]
        return cmd

    def start(self, timeout: float = 30.0) -> None:
        with open(self.log_path, "ab") as log:
            self.process = subprocess.Popen(self.command(), stdout=log, stderr=subprocess.STDOUT)
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.process.poll() is not None:
                raise RuntimeError(f"checkpointd exited with {self.process.returncode}:\n{self.log()}")
            if self.serving():
                return
            time.sleep(0.05)
        self.stop()
        raise RuntimeError(f"checkpointd did not become healthy in {timeout}s:\n{self.log()}")

    def serving(self) -> bool:
        try:
            with grpc.insecure_channel(self.tcp_target) as channel:
                reply = health_pb2_grpc.HealthStub(channel).Check(health_pb2.HealthCheckRequest(), timeout=0.5)
            return reply.status == health_pb2.HealthCheckResponse.SERVING
        except grpc.RpcError:
            return False

    def stop(self, sig: int = signal.SIGTERM) -> int | None:
        if self.process is None:
            return None
        if self.process.poll() is None:
            self.process.send_signal(sig)
            try:
                self.process.wait(timeout=30)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait()
        code, self.process = self.process.returncode, None
        return code

    def kill(self) -> None:
        self.stop(signal.SIGKILL)

    def log(self) -> str:
        return self.log_path.read_text(errors="replace")[-5000:] if self.log_path.exists() else ""

    def new_workspace(self) -> Path:
        path = self.allowed_root / f"ws-{uuid.uuid4().hex[:12]}"
        path.mkdir()
        return path


@pytest.fixture(scope="session")
def short_tmp() -> Iterator[Path]:
    """A short base path: unix socket paths must stay under 108 bytes."""
    base = Path(tempfile.mkdtemp(prefix="cpd-", dir="/tmp"))
    yield base
    shutil.rmtree(base, ignore_errors=True)


def _server(base: Path, **kwargs) -> Iterator[RunningServer]:
    server = RunningServer(base, **kwargs)
    server.start()
    try:
        yield server
    finally:
        server.stop()


@pytest.fixture(scope="session")
def checkpointd_server(short_tmp: Path) -> Iterator[RunningServer]:
    yield from _server(short_tmp / "session")


@pytest.fixture
def fresh_server(short_tmp: Path) -> Iterator[RunningServer]:
    yield from _server(Path(tempfile.mkdtemp(prefix="f-", dir=short_tmp)))


@pytest.fixture
def workspace(checkpointd_server: RunningServer) -> Path:
    return checkpointd_server.new_workspace()


@pytest.fixture
def plan_id() -> str:
    return str(ULID())


@pytest.fixture(scope="session")
def channel(checkpointd_server: RunningServer) -> Iterator[grpc.Channel]:
    with grpc.insecure_channel(checkpointd_server.tcp_target) as ch:
        yield ch


@pytest.fixture(scope="session")
def checkpoint_stub(channel: grpc.Channel) -> checkpoint_service_pb2_grpc.CheckpointServiceStub:
    return checkpoint_service_pb2_grpc.CheckpointServiceStub(channel)


@pytest.fixture(scope="session")
def config_stub(channel: grpc.Channel) -> config_service_pb2_grpc.ConfigServiceStub:
    return config_service_pb2_grpc.ConfigServiceStub(channel)


def pytest_report_header(config) -> str:
    return f"checkpointd binary: {CHECKPOINTD} (exists: {os.path.exists(CHECKPOINTD)})"
