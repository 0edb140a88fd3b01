"""Shared pieces of the hardening tests: starting a server with faults armed, the offline
integrity check, workspace mutations and canaries."""

from __future__ import annotations

import hashlib
import io
import os
import random
import re
import stat
import tarfile
import threading
import urllib.request
from collections.abc import Callable
from pathlib import Path

import grpc
from grpc_health.v1 import health_pb2, health_pb2_grpc
from sqlalchemy import create_engine, inspect, text

from checkpoint.v1 import checkpoint_service_pb2 as pb
from checkpointd.core.kernel.faults import FAULT_DIR_VARIABLE, Action
from checkpointd.core.maintenance.fsck import FsckReport, check_data_dir
from tests.helpers import tree_state

FAULT_VARIABLES = tuple(action.value for action in Action)
#: Variables that shrink a server's limits so that a test reaches what they bound (see ``store``).
TEST_KNOBS = ("CHECKPOINTD_PACK_ROTATE_BYTES", "CHECKPOINTD_TREE_SPLIT_ENTRIES")
#: Codes a call gets when the server died under it (or is not back yet).
GONE = (grpc.StatusCode.UNAVAILABLE, grpc.StatusCode.DEADLINE_EXCEEDED, grpc.StatusCode.CANCELLED)


def start_with_faults(server, **variables: str) -> None:
    """(Re)starts ``server`` with faults armed, e.g. CHECKPOINTD_CRASH_AT="restore.change:3".

    The variables go on that one server's command line (``env NAME=VALUE checkpointd ...``; env
    execs, so the process is the server itself), never into this process's environment: servers
    of tests running side by side each get their own faults.
    """
    unknown = set(variables) - set(FAULT_VARIABLES) - {FAULT_DIR_VARIABLE, *TEST_KNOBS}
    assert not unknown, f"not fault variables: {unknown}"
    plain = type(server).command
    unset = [arg for name in (*FAULT_VARIABLES, FAULT_DIR_VARIABLE) for arg in ("-u", name)]
    server.command = lambda: ["env", *unset, *(f"{k}={v}" for k, v in variables.items()), *plain(server)]
    try:
        server.start()
    finally:
        del server.command


def fsck(server, full: bool = True) -> FsckReport:
    """The integrity check of a stopped server's data directory."""
    assert server.process is None, "stop the server first: fsck needs its data directory alone"
    return check_data_dir(server.data_dir, server.db_url, server.store_kind, full=full)


def pending_rollbacks(server) -> list[str]:
    """Plans with an unfinished rollback: the rollback journal's entries in the server's database
    (its SQLite file or its PostgreSQL database); readable while the server runs."""
    sqlite_file = server.data_dir / "checkpointd.db"
    if not server.db_url and not sqlite_file.exists():
        return []
    engine = create_engine(server.db_url or f"sqlite:///{sqlite_file}")
    try:
        with engine.connect() as connection:
            if not inspect(connection).has_table("rollback_journal"):
                return []
            return sorted(connection.execute(text("SELECT plan_id FROM rollback_journal")).scalars())
    finally:
        engine.dispose()


def assert_fsck_clean(server, allow_pending: bool = False) -> FsckReport:
    report = fsck(server)
    assert report.ok, report.to_json()
    if not allow_pending:
        assert report.pending_rollbacks == [], report.to_json()
    return report


def serving(target: str) -> bool:
    try:
        with grpc.insecure_channel(target) as channel:
            reply = health_pb2_grpc.HealthStub(channel).Check(health_pb2.HealthCheckRequest(), timeout=5)
    except grpc.RpcError:
        return False
    return reply.status == health_pb2.HealthCheckResponse.SERVING


def list_all(stub, plan_id: str) -> list[pb.Checkpoint]:
    """Every checkpoint of a plan, oldest first ([] for a plan never seen)."""
    found: list[pb.Checkpoint] = []
    token = ""
    while True:
        try:
            reply = stub.ListCheckpoints(pb.ListCheckpointsRequest(plan_id=plan_id, page_size=1000, page_token=token),
                                         timeout=30)
        except grpc.RpcError as error:
            if error.code() == grpc.StatusCode.NOT_FOUND:
                return []
            raise
        found.extend(reply.checkpoints)
        token = reply.next_page_token
        if not token:
            return sorted(found, key=lambda c: c.sequence)


# -- workspaces -----------------------------------------------------------------------------

TOP_DIRECTORIES = ("alpha", "beta", "gamma")
GITIGNORE_TEXT = b"*.log\n"


def seed_workspace(root: Path, rng: random.Random, files: int = 12) -> None:
    """Directories, each with a .gitignore (nothing in the workloads matches it), files of
    assorted sizes and modes, and symlinks (relative and absolute, never followed)."""
    for top in TOP_DIRECTORIES:
        for sub in ("", "/inner"):
            directory = root / f"{top}{sub}"
            directory.mkdir(parents=True, exist_ok=True)
            (directory / ".gitignore").write_bytes(GITIGNORE_TEXT)
    for _ in range(files):
        mutate_workspace(root, rng)


def _random_file(root: Path, rng: random.Random) -> Path:
    top = rng.choice(TOP_DIRECTORIES)
    sub = rng.choice(["", "inner/"])
    return root / top / f"{sub}f{rng.randrange(40)}.bin"


def mutate_workspace(root: Path, rng: random.Random) -> None:
    """One random change: write, rewrite, delete, chmod, symlink, or a whole directory."""
    action = rng.random()
    path = _random_file(root, rng)
    path.parent.mkdir(parents=True, exist_ok=True)
    present = path.is_symlink() or path.exists()
    if present and (action < 0.15 or path.is_symlink()):
        path.unlink()
    elif action < 0.7:
        path.write_bytes(rng.randbytes(rng.choice([0, 1, 100, 5000, 70_000])))
        path.chmod(rng.choice([0o644, 0o600, 0o755]))
    elif action < 0.8:
        if present:
            path.unlink()
        path.symlink_to(rng.choice(["../elsewhere", "/etc/hostname", "f1.bin", "a\nb"]))
    elif action < 0.9:
        if present:
            path.chmod(rng.choice([0o644, 0o640, 0o700]))
    else:
        extra = root / rng.choice(TOP_DIRECTORIES) / f"d{rng.randrange(5)}"
        if extra.is_dir():
            for child in extra.iterdir():
                child.unlink()
            extra.rmdir()
        else:
            extra.mkdir()
            (extra / "x.txt").write_bytes(rng.randbytes(rng.randrange(1, 300)))


def workspace_state(root: Path) -> dict[str, tuple]:
    return tree_state(root)


def with_subset(target: dict[str, tuple], before: dict[str, tuple], top: str | None) -> dict[str, tuple]:
    """The workspace a rollback to ``target`` leaves: all of it, or only the top-level ``top``."""
    if top is None:
        return dict(target)

    def inside(path: str) -> bool:
        return path == top or path.startswith(top + "/")

    merged = {p: v for p, v in before.items() if not inside(p)}
    merged.update({p: v for p, v in target.items() if inside(p)})
    return merged


# -- canaries -------------------------------------------------------------------------------


def fingerprint_tree(root: Path) -> dict[str, tuple]:
    """Everything under ``root`` (never following links): type, mode, size, content digest, inode
    links; a canary directory must read the same before and after an attack."""
    out: dict[str, tuple] = {}
    for dirpath, dirnames, filenames in os.walk(root):
        for name in dirnames + filenames:
            full = os.path.join(dirpath, name)
            st = os.lstat(full)
            if stat.S_ISLNK(st.st_mode):
                out[full] = ("link", os.readlink(full))
            elif stat.S_ISDIR(st.st_mode):
                out[full] = ("dir", stat.S_IMODE(st.st_mode))
            else:
                with open(full, "rb") as f:
                    digest = hashlib.sha256(f.read()).hexdigest()
                out[full] = ("file", stat.S_IMODE(st.st_mode), st.st_size, digest, st.st_mtime_ns)
    return out


def metric(server, name: str) -> float:
    """A sample of the server's /metrics (started with ``--metrics-listen``), 0 if absent."""
    found = re.findall(r"checkpointd metrics: (http://\S+)", server.log_path.read_text())
    assert found, server.log()
    with urllib.request.urlopen(found[-1], timeout=10) as reply:
        text = reply.read().decode()
    for line in text.splitlines():
        if line.startswith(name + " "):
            return float(line.split()[1])
    return 0.0


def wait_until(condition: Callable[[], object], what: str, server, seconds: float = 60.0) -> None:
    """Returns once ``condition()`` holds, polled every 20 ms; fails, with the server's log,
    after ``seconds`` (what the server does is done long before)."""
    waited = threading.Event()
    for _ in range(int(seconds / 0.02)):
        if condition():
            return
        waited.wait(0.02)
    raise AssertionError(f"{what}, never:\n{server.log()}")


def captured(root: Path, ignored: Callable[[str], bool] = lambda path: path.endswith(".log")) -> dict[str, tuple]:
    """What a checkpoint of ``root`` must hold: its files, in ``tree_state``'s shape, less the
    ignored ones (by default the ``*.log`` files the tests' .gitignore files name)."""
    return {path: value for path, value in tree_state(root).items() if not ignored(path)}


def handled(method: str, code: str) -> str:
    """The name of the metric counting CheckpointService ``method`` calls that ended with ``code``."""
    return (f'checkpointd_grpc_server_handled_total{{grpc_code="{code}",grpc_method="{method}",'
            'grpc_service="checkpoint.v1.CheckpointService"}')


def abandoned(operation: str, cause: str) -> str:
    """The name of the metric counting captures of ``operation`` stopped because the caller gave up."""
    return f'checkpointd_captures_abandoned_total{{cause="{cause}",operation="{operation}"}}'


def exported(stub, checkpoint_id: str) -> dict[str, tuple]:
    """A checkpoint's files, read back through ExportCheckpoint, in ``tests.helpers.tree_state``'s shape."""
    data = b"".join(c.data for c in stub.ExportCheckpoint(pb.ExportCheckpointRequest(checkpoint_id=checkpoint_id),
                                                          timeout=60))
    out: dict[str, tuple] = {}
    with tarfile.open(fileobj=io.BytesIO(data)) as archive:
        for member in archive.getmembers():
            if member.isdir():
                out[member.name] = ("dir", member.mode)
            elif member.issym():
                out[member.name] = ("symlink", member.linkname)
            else:
                out[member.name] = ("file", archive.extractfile(member).read(), member.mode)
    return out
