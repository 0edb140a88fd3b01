"""The servers of the model-based test (tests/hardening/test_model.py): one `checkpointd serve` on
SQLite and the disk store, or two replicas on one PostgreSQL database with `--store db`; each can
be restarted with faults armed (a kill -9 or a pause at a named point), killed, and collected
(`checkpointd gc`: offline on the single server's data dir, beside the running replicas on
PostgreSQL). Packs are kept small (CHECKPOINTD_PACK_ROTATE_BYTES) so collections compact them, and
directories of more than two entries are stored split (CHECKPOINTD_TREE_SPLIT_ENTRIES), so the
model's few-entry directories go in and out of the split form that big directories take."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import tempfile
import time
from collections import Counter
from pathlib import Path

import grpc
from grpc_health.v1 import health_pb2, health_pb2_grpc

from checkpoint.v1 import admin_service_pb2 as admin_pb
from checkpoint.v1 import admin_service_pb2_grpc as admin_grpc
from checkpoint.v1 import checkpoint_service_pb2_grpc as pb_grpc
from checkpoint.v1 import config_service_pb2_grpc as config_grpc
from tests.conftest import CHECKPOINTD, RunningServer
from tests.hardening.support import assert_fsck_clean, start_with_faults

#: Directories of more entries are stored split, in parts of about 2 (the model's hold up to 9).
SPLIT_ENTRIES = 2
#: Packs this small hold a few checkpoints each, so that deletions leave some mostly dead.
SMALL_PACKS_AND_PARTS = {"CHECKPOINTD_PACK_ROTATE_BYTES": "8192",
                         "CHECKPOINTD_TREE_SPLIT_ENTRIES": str(SPLIT_ENTRIES)}


class Cluster:
    """The servers a machine talks to, and what is armed in each."""

    def __init__(self, base: Path, db_url: str = "", replicas: int = 1) -> None:
        self.base = base
        self.db_url = db_url
        self.replicated = replicas > 1
        self.shared_root = base / "shared"
        self.shared_root.mkdir(parents=True, exist_ok=True)
        self.servers: list[RunningServer] = []
        for _ in range(replicas):
            extra: tuple[str, ...] = ("--workspace-root", str(self.shared_root))
            if self.replicated:
                extra = ("--store", "db", *extra)
            self.servers.append(RunningServer(Path(tempfile.mkdtemp(prefix="m-", dir=base)), db_url=db_url,
                                              extra_args=extra))
        #: Per server: the fault variables it was started with ({} when none).
        self.armed: list[dict[str, str]] = [{} for _ in self.servers]
        self.handshake = base / "faults"
        self.handshake.mkdir(exist_ok=True)
        self._channels: list[grpc.Channel | None] = [None for _ in self.servers]
        self.starts = 0
        #: What the runs did (calls by method, kills, races, collections, seconds by activity):
        #: printed at the end, and a test asserts its machine reached what it is meant to test.
        self.stats: Counter[str] = Counter()

    # -- lifecycle ------------------------------------------------------------------------------

    def start(self, index: int, race: bool = True, **faults: str) -> None:
        """(Re)starts a server; with ``race`` its first rollback that changes anything pauses
        before its first change (the machine writes into the workspace meanwhile)."""
        server = self.servers[index]
        server.stop()
        if race:
            faults = {"CHECKPOINTD_PAUSE_AT": "restore.change:1", **faults}
        if faults:
            faults = {**faults, "CHECKPOINTD_FAULT_DIR": str(self.handshake)}
        began = time.monotonic()
        start_with_faults(server, **SMALL_PACKS_AND_PARTS, **faults)
        self.stats["seconds starting servers"] += time.monotonic() - began
        self.starts += 1
        self.armed[index] = faults
        self._close(index)

    def start_all(self) -> None:
        for index in range(len(self.servers)):
            self.start(index)

    def stop_all(self) -> None:
        for index, server in enumerate(self.servers):
            self._close(index)
            server.stop()

    def alive(self, index: int) -> bool:
        """Whether the server runs; one armed to crash gets a moment to finish dying (its
        connections close just before its exit status is there to reap)."""
        process = self.servers[index].process
        if process is None:
            return False
        if "CHECKPOINTD_CRASH_AT" in self.armed[index]:
            try:
                process.wait(timeout=5)
            except subprocess.TimeoutExpired:
                return True
        return process.poll() is None

    def died_of_kill(self, index: int) -> bool:
        """Whether the server ended by SIGKILL (an armed crash); reaps it."""
        process = self.servers[index].process
        if process is None:
            return False
        try:
            code = process.wait(timeout=30)
        except subprocess.TimeoutExpired:
            return False
        self.servers[index].process = None
        self._close(index)
        assert code == -signal.SIGKILL, f"server {index} exited with {code}:\n{self.servers[index].log()}"
        return True

    def _close(self, index: int) -> None:
        channel = self._channels[index]
        if channel is not None:
            channel.close()
        self._channels[index] = None

    def channel(self, index: int) -> grpc.Channel:
        if self._channels[index] is None:
            self._channels[index] = grpc.insecure_channel(self.servers[index].tcp_target)
        return self._channels[index]

    def stub(self, index: int) -> pb_grpc.CheckpointServiceStub:
        return pb_grpc.CheckpointServiceStub(self.channel(index))

    def config(self, index: int) -> config_grpc.ConfigServiceStub:
        return config_grpc.ConfigServiceStub(self.channel(index))

    # -- checks ---------------------------------------------------------------------------------

    def healthy(self, index: int) -> bool:
        reply = health_pb2_grpc.HealthStub(self.channel(index)).Check(health_pb2.HealthCheckRequest(), timeout=10)
        return reply.status == health_pb2.HealthCheckResponse.SERVING

    def integrity(self, index: int) -> admin_pb.CheckIntegrityResponse:
        """`checkpointd fsck` against a running server (AdminService/CheckIntegrity)."""
        return admin_grpc.AdminServiceStub(self.channel(index)).CheckIntegrity(
            admin_pb.CheckIntegrityRequest(), timeout=120)

    def new_workspace(self) -> Path:
        return Path(tempfile.mkdtemp(prefix="ws-", dir=self.shared_root))

    # -- garbage collection ---------------------------------------------------------------------

    def gc(self, crash_at: str = "") -> list[dict]:
        """Retention and garbage collection with `checkpointd gc` (compacting small packs); with
        ``crash_at`` the first run is killed there and then run again. The single server is
        stopped for it (fsck offline before it starts again); replicas keep serving."""
        self.stats["collections"] += 1
        if not self.replicated:
            self._close(0)
            self.servers[0].stop()
        reports = []
        try:
            if crash_at:
                self._run_gc(crash_at)
                if not self.replicated:
                    assert_fsck_clean(self.servers[0])
            reports.append(self._run_gc())
            if not self.replicated:
                assert_fsck_clean(self.servers[0])
        finally:
            if not self.replicated:
                self.start(0)
        return reports

    def _run_gc(self, crash_at: str = "") -> dict:
        server = self.servers[0]
        data_dir = server.data_dir if not self.replicated else Path(tempfile.mkdtemp(prefix="gc-", dir=self.base))
        command = [CHECKPOINTD, "gc", "--data-dir", str(data_dir), "--store", server.store_kind, "--json"]
        if self.db_url:
            command += ["--db-url", self.db_url]
        environment = {k: v for k, v in os.environ.items() if not k.startswith("CHECKPOINTD_")}
        environment.update(SMALL_PACKS_AND_PARTS)
        if crash_at:
            environment["CHECKPOINTD_CRASH_AT"] = crash_at
        done = subprocess.run(command, env=environment, capture_output=True, text=True, timeout=300)
        assert done.returncode in (0, -signal.SIGKILL), f"checkpointd gc exited {done.returncode}: {done.stderr}"
        assert "Traceback" not in done.stderr, done.stderr
        return json.loads(done.stdout) if done.returncode == 0 else {}
