"""Live servers for the engine tests: a plan whose every checkpoint is checked against a full
scan of its workspace made at that moment (digests are content addresses: a scan into a
scratch store gives the same tree), with the watcher on or off, on SQLite or PostgreSQL (as
the suite runs); optionally in a mount namespace of its own, so that a test can mount inside
workspaces without touching the machine's mounts."""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import grpc
from ulid import ULID

from checkpoint.v1 import checkpoint_service_pb2 as pb
from checkpoint.v1 import checkpoint_service_pb2_grpc as pb_grpc
from checkpointd.core.capture.snapshot import CaptureResult, Snapshotter, disk_rules
from checkpointd.core.capture.stat_index import StatIndex
from checkpointd.core.store.content_store import ContentStore
from checkpointd.core.store.tree import Trees
from checkpointd.core.workspace.workspace import Workspace
from tests.conftest import SERVER_ARGS, PostgresDatabases, RunningServer

REPO = Path(__file__).resolve().parents[2]
DEFAULT_MAX_FILE_SIZE = 64 * 1024 * 1024


def full_scan(root: Path, scratch: Path) -> CaptureResult:
    """What a full scan of ``root`` captures, as a server with default settings would."""
    store = ContentStore(scratch)
    workspace = Workspace(str(root))
    with store.batch() as batch:
        return Snapshotter(store, Trees(store), StatIndex(), reader_processes=0).capture(
            workspace, disk_rules(workspace, [], []), DEFAULT_MAX_FILE_SIZE, batch)


def serve(base: Path, databases: PostgresDatabases | None, watcher: str,
          server_class: type[RunningServer] = RunningServer) -> Iterator[RunningServer]:
    db_url = databases.create() if databases is not None else ""
    running = server_class(base, db_url=db_url, extra_args=(*SERVER_ARGS, "--watcher", watcher))
    try:
        running.start()
        yield running
    finally:
        running.stop()
        if databases is not None:
            databases.drop(db_url)


class Session:
    """One plan on one workspace of a server; every checkpoint is checked against a full scan."""

    def __init__(self, server: RunningServer, root: Path, scratch: Path) -> None:
        self.server = server
        self.root = root
        self.plan_id = str(ULID())
        self.scratch = scratch
        self.scans = 0
        self.channel = grpc.insecure_channel(server.tcp_target)
        self.stub = pb_grpc.CheckpointServiceStub(self.channel)

    def full_scan(self) -> str:
        self.scans += 1
        return full_scan(self.root, self.scratch / f"scan{self.scans}").tree

    def checkpoint(self) -> pb.Checkpoint:
        made = self.stub.CreateCheckpoint(pb.CreateCheckpointRequest(plan_id=self.plan_id,
                                                                     workspace_root=str(self.root)),
                                          timeout=60).checkpoint
        assert made.tree_digest == "sha256:" + self.full_scan(), "the checkpoint differs from a full scan"
        return made

    def diff_live(self, base: pb.Checkpoint) -> list[pb.FileChange]:
        return list(self.stub.DiffCheckpoints(pb.DiffCheckpointsRequest(base_checkpoint_id=base.checkpoint_id),
                                              timeout=60).changes)

    def rollback(self, checkpoint: pb.Checkpoint) -> pb.RollbackResponse:
        return self.stub.Rollback(pb.RollbackRequest(plan_id=self.plan_id, checkpoint_id=checkpoint.checkpoint_id),
                                  timeout=60)

    def close(self) -> None:
        self.channel.close()


class NamespacedServer(RunningServer):
    """A server in a mount namespace of its own."""

    def command(self) -> list[str]:
        unshare = ["unshare", "--mount", "--propagation", "private"]
        if os.geteuid() != 0:
            unshare[1:1] = ["--user", "--map-root-user"]
        return [*unshare, *super().command()]

    def _enter(self, command: tuple[str, ...]) -> list[str]:
        enter = ["nsenter", "--target", str(self.process.pid), "--mount"]
        if os.geteuid() != 0:
            enter += ["--user", "--preserve-credentials"]
        return [*enter, "--", *command]

    def in_namespace(self, *command: str) -> None:
        """Runs ``command`` in the server's mount namespace."""
        done = subprocess.run(self._enter(command), capture_output=True, text=True)
        assert done.returncode == 0, f"{command} failed in the server's namespace: {done.stderr}"

    def in_namespace_process(self, *command: str) -> subprocess.Popen:
        """Starts ``command`` in the server's mount namespace, with pipes for stdin and stdout."""
        return subprocess.Popen(self._enter(command), stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                stderr=subprocess.PIPE, text=True, env={**os.environ, "PYTHONPATH": str(REPO)})


class NamespacedSession(Session):
    """Full scans run in the server's mount namespace (only there are its mounts seen), by one
    helper process that reads a scratch directory per line and answers with the tree digest."""

    SCANNER = ("import sys\n"
               "from pathlib import Path\n"
               "from tests.engine.live import full_scan\n"
               "for line in sys.stdin:\n"
               "    print(full_scan(Path(sys.argv[1]), Path(line.strip())).tree, flush=True)\n")

    def __init__(self, server: NamespacedServer, root: Path, scratch: Path) -> None:
        super().__init__(server, root, scratch)
        self.scanner = server.in_namespace_process(sys.executable, "-c", self.SCANNER, str(root))

    def full_scan(self) -> str:
        self.scans += 1
        self.scanner.stdin.write(f"{self.scratch / f'scan{self.scans}'}\n")
        self.scanner.stdin.flush()
        digest = self.scanner.stdout.readline().strip()
        assert digest, f"the scanner in the server's namespace failed: {self.scanner.stderr.read()}"
        return digest

    def close(self) -> None:
        self.scanner.stdin.close()
        self.scanner.wait(timeout=30)
        super().close()
