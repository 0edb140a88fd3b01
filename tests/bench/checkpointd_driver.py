"""Drives a real ``checkpointd serve`` subprocess over gRPC with the generated stubs, end to
end as a client would: every timing is one blocking RPC measured at the client."""

from __future__ import annotations

import socket
import subprocess
import time
from pathlib import Path

import grpc
from grpc_health.v1 import health_pb2, health_pb2_grpc

from checkpoint.v1 import checkpoint_service_pb2 as pb
from checkpoint.v1 import checkpoint_service_pb2_grpc as pb_grpc
from tests.bench.measure import BackgroundWork, disk_usage_bytes, wait_for_idle_cpu

STARTUP_LIMIT_SECONDS = 60.0
CALL_DEADLINE_SECONDS = 900.0


def free_tcp_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


class ServerProcess:
    """A server in a process of its own, started by ``start`` and ended by ``stop`` (or the
    ``with`` block): SIGTERM, then SIGKILL if it has not exited in 20 s."""

    def __init__(self, log_path: Path) -> None:
        self.log_path = log_path
        self.target = ""
        self._process: subprocess.Popen[bytes] | None = None

    @property
    def pid(self) -> int:
        if self._process is None:
            raise RuntimeError(f"{type(self).__name__} is not running")
        return self._process.pid

    def start(self) -> None:
        raise NotImplementedError

    def stop(self) -> None:
        if self._process is None:
            return
        if self._process.poll() is None:
            self._process.terminate()
            try:
                self._process.wait(timeout=20)
            except subprocess.TimeoutExpired:
                self._process.kill()
                self._process.wait()
        self._process = None

    def __enter__(self):
        self.start()
        return self

    def __exit__(self, *_exc: object) -> None:
        self.stop()


class CheckpointdServer(ServerProcess):
    """One ``checkpointd serve`` process listening on a free 127.0.0.1 port."""

    def __init__(self, executable: Path, data_dir: Path, workspace_root: Path, log_path: Path) -> None:
        super().__init__(log_path)
        self.executable = executable
        self.data_dir = data_dir
        self.workspace_root = workspace_root

    def start(self) -> None:
        self.data_dir.mkdir(parents=True, exist_ok=True)
        self.target = f"127.0.0.1:{free_tcp_port()}"
        command = [str(self.executable), "serve", "--listen", self.target, "--data-dir", str(self.data_dir),
                   "--workspace-root", str(self.workspace_root)]
        with open(self.log_path, "ab") as log:
            log.write(f"$ {' '.join(command)}\n".encode())
            log.flush()
            self._process = subprocess.Popen(command, stdout=log, stderr=subprocess.STDOUT,
                                             stdin=subprocess.DEVNULL)
        self._wait_until_serving()

    def _wait_until_serving(self) -> None:
        deadline = time.monotonic() + STARTUP_LIMIT_SECONDS
        with grpc.insecure_channel(self.target) as channel:
            health = health_pb2_grpc.HealthStub(channel)
            while time.monotonic() < deadline:
                if self._process is not None and self._process.poll() is not None:
                    raise RuntimeError(f"checkpointd exited with {self._process.returncode} during startup; "
                                       f"log tail:\n{self.log_tail()}")
                try:
                    reply = health.Check(health_pb2.HealthCheckRequest(service=""), timeout=1.0)
                    if reply.status == health_pb2.HealthCheckResponse.SERVING:
                        return
                except grpc.RpcError:
                    pass
                time.sleep(0.1)
        self.stop()
        raise RuntimeError(f"checkpointd did not report SERVING within {STARTUP_LIMIT_SECONDS:.0f} s; "
                           f"log tail:\n{self.log_tail()}")

    def log_tail(self, lines: int = 30) -> str:
        try:
            return "\n".join(self.log_path.read_text(errors="replace").splitlines()[-lines:])
        except OSError:
            return "(no log)"

    def wait_for_idle(self, quiet_seconds: float = 1.0) -> BackgroundWork:
        """How long the server kept a CPU busy after its last answer (see wait_for_idle_cpu)."""
        return wait_for_idle_cpu(self.pid, quiet_seconds=quiet_seconds)

    def store_size_bytes(self) -> int:
        return disk_usage_bytes(self.data_dir)


class CheckpointdClient:
    """A gRPC client of one server; each method is one RPC, timed end to end."""

    def __init__(self, target: str) -> None:
        self._channel = grpc.insecure_channel(target)
        grpc.channel_ready_future(self._channel).result(timeout=STARTUP_LIMIT_SECONDS)
        self._stub = pb_grpc.CheckpointServiceStub(self._channel)

    def close(self) -> None:
        self._channel.close()

    def checkpoint(self, plan_id: str, workspace_root: Path | None, description: str,
                   state: bytes = b"") -> tuple[pb.Checkpoint, float]:
        """CreateCheckpoint; returns (checkpoint, seconds). No workspace means state-only."""
        request = pb.CreateCheckpointRequest(
            plan_id=plan_id, trigger=pb.TRIGGER_MANUAL, source_tool="bench/driver", description=description,
            state=state, workspace_root=str(workspace_root) if workspace_root else "")
        start = time.perf_counter()
        reply = self._stub.CreateCheckpoint(request, timeout=CALL_DEADLINE_SECONDS)
        return reply.checkpoint, time.perf_counter() - start

    def rollback(self, plan_id: str, checkpoint_id: str) -> tuple[pb.RollbackResponse, float]:
        """Rollback of files and state to ``checkpoint_id``; returns (reply, seconds)."""
        request = pb.RollbackRequest(plan_id=plan_id, checkpoint_id=checkpoint_id,
                                     scope=pb.ROLLBACK_SCOPE_FILES_AND_STATE)
        start = time.perf_counter()
        reply = self._stub.Rollback(request, timeout=CALL_DEADLINE_SECONDS)
        return reply, time.perf_counter() - start

    def __enter__(self) -> CheckpointdClient:
        return self

    def __exit__(self, *_exc: object) -> None:
        self.close()
