"""Concurrency: 8 plans, each written by two concurrent clients (one channel each) that checkpoint
their own subtree of the shared workspace and roll it back now and then (a path-subset rollback,
so each client's files stay its own). Proven: nothing lost, per-plan sequences gap-free and in
each client's issue order, every checkpoint sampled restores exactly, no deadlock (every call has
a deadline and every thread must finish), and the store passes fsck afterwards. The same under a
rename storm, where captures race renames and the final capture must still be exact.
"""

from __future__ import annotations

import os
import random
import subprocess
import sys
import threading
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path

import grpc
import pytest
from ulid import ULID

from checkpoint.v1 import checkpoint_service_pb2 as pb
from checkpoint.v1 import checkpoint_service_pb2_grpc as pb_grpc
from tests.hardening.support import assert_fsck_clean, list_all
from tests.helpers import skip_unless_ci, tree_state

CALL_DEADLINE_S = 120
PLANS = 8
ROLLBACK_EVERY = 10


@dataclass
class Recorded:
    checkpoint_id: str
    sequence: int
    #: The client's own subtree when the checkpoint was taken (paths relative to the workspace).
    subtree: dict[str, tuple]


@dataclass
class ClientRun:
    plan_id: str
    workspace: Path
    name: str
    seed: int
    created: list[Recorded] = field(default_factory=list)
    safety_ids: list[str] = field(default_factory=list)

    @property
    def subtree_root(self) -> Path:
        return self.workspace / self.name

    def subtree(self) -> dict[str, tuple]:
        return {f"{self.name}/{path}": value for path, value in tree_state(self.subtree_root).items()}


def _mutate(root: Path, rng: random.Random) -> None:
    path = root / f"d{rng.randrange(4)}" / f"f{rng.randrange(12)}.txt"
    path.parent.mkdir(parents=True, exist_ok=True)
    if path.exists() and rng.random() < 0.2:
        path.unlink()
    else:
        path.write_bytes(rng.randbytes(rng.choice([10, 200, 3000])))


def run_client(target: str, run: ClientRun, checkpoints: int) -> None:
    rng = random.Random(run.seed)
    run.subtree_root.mkdir(exist_ok=True)
    with grpc.insecure_channel(target) as channel:
        stub = pb_grpc.CheckpointServiceStub(channel)
        for i in range(checkpoints):
            _mutate(run.subtree_root, rng)
            subtree = run.subtree()
            created = stub.CreateCheckpoint(pb.CreateCheckpointRequest(
                plan_id=run.plan_id, workspace_root=str(run.workspace), request_id=str(ULID()),
                labels={"client": run.name, "index": str(i)}), timeout=CALL_DEADLINE_S).checkpoint
            run.created.append(Recorded(created.checkpoint_id, created.sequence, subtree))
            if i % ROLLBACK_EVERY == ROLLBACK_EVERY - 1:
                target_checkpoint = rng.choice(run.created)
                reply = stub.Rollback(pb.RollbackRequest(
                    plan_id=run.plan_id, checkpoint_id=target_checkpoint.checkpoint_id, paths=[run.name],
                    scope=pb.ROLLBACK_SCOPE_FILES, request_id=str(ULID())), timeout=CALL_DEADLINE_S)
                run.safety_ids.append(reply.safety_checkpoint.checkpoint_id)
                assert run.subtree() == target_checkpoint.subtree, "a subset rollback under load was not exact"


def run_plans(server, per_plan: int, sample: int) -> None:
    runs: list[ClientRun] = []
    for p in range(PLANS):
        plan_id, workspace = str(ULID()), server.new_workspace()
        runs += [ClientRun(plan_id, workspace, name, seed=p * 10 + c) for c, name in enumerate(("a", "b"))]
    with ThreadPoolExecutor(max_workers=len(runs)) as pool:
        futures = [pool.submit(run_client, server.tcp_target, run, per_plan // 2) for run in runs]
        for future in futures:
            future.result(timeout=CALL_DEADLINE_S * per_plan)

    with grpc.insecure_channel(server.tcp_target) as channel:
        stub = pb_grpc.CheckpointServiceStub(channel)
        for plan_runs in (runs[i:i + 2] for i in range(0, len(runs), 2)):
            listed = list_all(stub, plan_runs[0].plan_id)
            by_id = {c.checkpoint_id: c for c in listed}
            expected = {r.checkpoint_id for run in plan_runs for r in run.created}
            expected |= {s for run in plan_runs for s in run.safety_ids}
            assert set(by_id) == expected, "a checkpoint was lost or appeared from nowhere"
            assert [c.sequence for c in listed] == list(range(1, len(listed) + 1))
            for run in plan_runs:
                sequences = [r.sequence for r in run.created]
                assert sequences == sorted(sequences), "a client's checkpoints are out of its issue order"
                assert [by_id[r.checkpoint_id].labels["index"] for r in run.created] == \
                    [str(i) for i in range(len(run.created))]
            rng = random.Random(len(listed))
            for run in plan_runs:
                for recorded in rng.sample(run.created, min(sample, len(run.created))):
                    stub.Rollback(pb.RollbackRequest(plan_id=run.plan_id, checkpoint_id=recorded.checkpoint_id,
                                                     paths=[run.name], scope=pb.ROLLBACK_SCOPE_FILES),
                                  timeout=CALL_DEADLINE_S)
                    assert run.subtree() == recorded.subtree
    server.stop()
    assert_fsck_clean(server)


@pytest.mark.timeout(900)
def test_eight_plans_with_concurrent_clients_and_rollbacks(fresh_server) -> None:
    run_plans(fresh_server, per_plan=100, sample=10)


@pytest.mark.slow
@pytest.mark.timeout(2400)
def test_eight_plans_times_a_thousand_checkpoints(fresh_server) -> None:
    run_plans(fresh_server, per_plan=1000, sample=25)


# -- rename storm -------------------------------------------------------------------------------


def _watcher_arguments() -> list[list[str]]:
    """Server variants: the file watcher off (full scans) and on (incremental captures)."""
    checkpointd = str(Path(sys.executable).with_name("checkpointd"))
    usage = subprocess.run([checkpointd, "serve", "--help"], capture_output=True, text=True, timeout=60).stdout
    return [["--watcher", "off"], ["--watcher", "on"]] if "--watcher" in usage else [[]]


def _storm(root: Path, stop: threading.Event, seed: int) -> int:
    """Renames files between directories and swaps whole directories, until told to stop; never
    overwrites, so the files (240) are all still there afterwards. A capture that meets a file
    renamed away under it records the file as skipped; a rollback leaves skipped paths alone."""
    rng = random.Random(seed)
    renames = 0
    while not stop.is_set():
        directory = root / f"dir{rng.randrange(6)}"
        names = os.listdir(directory)
        if rng.random() < 0.1:
            other = root / f"dir{rng.randrange(6)}"
            moved = root / f"moving-{rng.randrange(1000)}"
            directory.rename(moved)
            other_moved = root / f"moving-{rng.randrange(1000, 2000)}"
            if other != directory:
                other.rename(other_moved)
                moved.rename(other)
                other_moved.rename(directory)
            else:
                moved.rename(directory)
        elif names:
            destination = root / f"dir{rng.randrange(6)}" / f"r{rng.randrange(1_000_000)}.txt"
            if not destination.exists():
                os.rename(directory / rng.choice(names), destination)
        renames += 1
    return renames


def _files_at(path: Path) -> int:
    """Files at ``path``: itself when it is one, those under it when it is a directory."""
    if path.is_dir() and not path.is_symlink():
        return sum(len(files) for _, _, files in os.walk(path))
    return int(path.exists() or path.is_symlink())


@pytest.mark.parametrize("extra_args", _watcher_arguments(), ids=lambda a: " ".join(a) or "default")
def test_rename_storm_captures_stay_consistent_and_the_last_one_exact(short_tmp, extra_args) -> None:
    from tests.conftest import SERVER_ARGS, TEST_DB_URL, RunningServer

    if TEST_DB_URL:
        skip_unless_ci("uses its own SQLite server (the storm is about the file system, not the database)")
    server = RunningServer(short_tmp / f"storm-{ULID()}", extra_args=(*SERVER_ARGS, *extra_args))
    server.start()
    try:
        workspace = server.new_workspace()
        rng = random.Random(7)
        for d in range(6):
            (workspace / f"dir{d}").mkdir()
            for f in range(40):
                (workspace / f"dir{d}" / f"r{d * 40 + f}.txt").write_bytes(rng.randbytes(64))
        plan_id = str(ULID())
        stop = threading.Event()
        with grpc.insecure_channel(server.tcp_target) as channel, ThreadPoolExecutor(max_workers=1) as pool:
            stub = pb_grpc.CheckpointServiceStub(channel)
            storm = pool.submit(_storm, workspace, stop, 11)
            during = []
            try:
                for _ in range(15):
                    during.append(stub.CreateCheckpoint(pb.CreateCheckpointRequest(
                        plan_id=plan_id, workspace_root=str(workspace)), timeout=CALL_DEADLINE_S).checkpoint)
            finally:
                stop.set()
            assert storm.result(timeout=60) > 0
            quiet = tree_state(workspace)
            final = stub.CreateCheckpoint(pb.CreateCheckpointRequest(plan_id=plan_id),
                                          timeout=CALL_DEADLINE_S).checkpoint
            assert final.file_count == 240
            for d in range(6):
                for child in (workspace / f"dir{d}").iterdir():
                    child.unlink()
            (workspace / "stray.txt").write_bytes(b"after")
            stub.Rollback(pb.RollbackRequest(plan_id=plan_id, checkpoint_id=final.checkpoint_id),
                          timeout=CALL_DEADLINE_S)
            assert tree_state(workspace) == quiet, "the capture after the storm missed a rename"
            for checkpoint in during[::4]:
                stub.Rollback(pb.RollbackRequest(plan_id=plan_id, checkpoint_id=checkpoint.checkpoint_id),
                              timeout=CALL_DEADLINE_S)
                # What the checkpoint skipped (a directory renamed away mid-scan is skipped as
                # unreadable) is left alone by the rollback, files inside such a directory included.
                kept = sum(_files_at(workspace / s.path) for s in checkpoint.skipped_files)
                on_disk = _files_at(workspace)
                assert on_disk == checkpoint.file_count + kept, "a restore is not what was captured"
    finally:
        server.stop()
    assert_fsck_clean(server)
