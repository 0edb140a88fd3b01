"""Retention and garbage collection: the pruning rules, reclaimed bytes, the offline
`checkpointd gc`, and GC racing concurrent checkpoint writers on a real server."""

from __future__ import annotations

import json
import random
import threading
from datetime import UTC, datetime, timedelta

import grpc
import pytest
from google.protobuf import struct_pb2
from ulid import ULID

from checkpoint.v1 import checkpoint_service_pb2 as pb
from checkpoint.v1 import checkpoint_service_pb2_grpc as pb_grpc
from checkpoint.v1 import config_service_pb2 as config_pb
from checkpoint.v1 import config_service_pb2_grpc as config_grpc
from checkpointd.core.maintenance.retention import Candidate, Policy, Rule, select_prunable
from tests.helpers import tree_state
from tests.ops.conftest import run_cli, wait_until

NOW = datetime(2026, 1, 1, tzinfo=UTC)


def _candidate(sequence: int, age_s: float, phase: str = "manual", **labels: str) -> Candidate:
    return Candidate(f"cp{sequence}", "plan", sequence, phase, labels, NOW - timedelta(seconds=age_s))


def _pruned(candidates: list[Candidate], policy: Policy) -> dict[str, Rule]:
    newest_first = sorted(candidates, key=lambda c: -c.sequence)
    return {c.checkpoint_id: rule for c, rule in select_prunable(newest_first, policy, NOW)}


def test_count_rule_keeps_the_newest_and_ignores_pinned_and_safety_checkpoints():
    checkpoints = [_candidate(1, 50), _candidate(2, 40, pinned="true"), _candidate(3, 30),
                   _candidate(4, 20, phase="rollback_safety"), _candidate(5, 10), _candidate(6, 0)]
    assert _pruned(checkpoints, Policy(max_checkpoints=2)) == {"cp3": Rule.MAX_CHECKPOINTS,
                                                               "cp1": Rule.MAX_CHECKPOINTS}
    assert _pruned(checkpoints, Policy()) == {}


def test_age_rule_never_prunes_the_newest_checkpoint_of_a_plan():
    checkpoints = [_candidate(1, 300), _candidate(2, 200), _candidate(3, 100, pinned="true")]
    # cp3 is newest but pinned; cp2 is the newest regular one... the newest of all is kept anyway.
    assert _pruned(checkpoints, Policy(max_age_seconds=50)) == {"cp1": Rule.MAX_AGE, "cp2": Rule.MAX_AGE}
    idle = [_candidate(1, 300), _candidate(2, 200)]
    assert _pruned(idle, Policy(max_age_seconds=50)) == {"cp1": Rule.MAX_AGE}
    assert _pruned(idle, Policy(max_age_seconds=250)) == {"cp1": Rule.MAX_AGE}
    assert _pruned(idle, Policy(max_age_seconds=500)) == {}


def test_safety_checkpoints_follow_their_own_age_rule():
    checkpoints = [_candidate(1, 500, phase="rollback_safety"), _candidate(2, 100, phase="rollback_safety"),
                   _candidate(3, 900, phase="rollback_safety", pinned="true"), _candidate(4, 1000)]
    assert _pruned(checkpoints, Policy(max_checkpoints=1, max_age_seconds=10)) == {}
    assert _pruned(checkpoints, Policy(safety_max_age_seconds=200)) == {"cp1": Rule.SAFETY_MAX_AGE}


def _set_config(channel: grpc.Channel, key: str, value: float, plan_id: str = "") -> None:
    config_grpc.ConfigServiceStub(channel).SetConfig(
        config_pb.SetConfigRequest(key=key, value=struct_pb2.Value(number_value=value), plan_id=plan_id), timeout=10)


def _create(stub, plan_id: str, workspace, **labels: str) -> pb.Checkpoint:
    return stub.CreateCheckpoint(pb.CreateCheckpointRequest(plan_id=plan_id, workspace_root=str(workspace),
                                                            labels=labels), timeout=60).checkpoint


def _rollback_is_exact(stub, plan_id: str, checkpoint_id: str, workspace, expected: dict) -> None:
    stub.Rollback(pb.RollbackRequest(plan_id=plan_id, checkpoint_id=checkpoint_id, scope=pb.ROLLBACK_SCOPE_FILES),
                  timeout=60)
    assert tree_state(workspace) == expected, f"rollback to {checkpoint_id} is not exact"


def test_periodic_retention_prunes_by_count_per_plan_and_keeps_pinned(ops_server):
    server = ops_server("--gc-interval", "0.2", "--metrics-listen", "127.0.0.1:0")
    workspace = server.new_workspace()
    plan_id, other_plan = str(ULID()), str(ULID())
    other_workspace = server.new_workspace()
    with grpc.insecure_channel(server.tcp_target) as channel:
        stub = pb_grpc.CheckpointServiceStub(channel)
        expected: dict[str, dict] = {}
        created = []
        for i in range(6):
            (workspace / "data.bin").write_bytes(random.randbytes(20_000))
            (workspace / "step.txt").write_text(str(i))
            checkpoint = _create(stub, plan_id, workspace, **({"pinned": "true"} if i == 0 else {}))
            expected[checkpoint.checkpoint_id] = tree_state(workspace)
            created.append(checkpoint.checkpoint_id)
        (other_workspace / "x").write_text("other")
        others = [_create(stub, other_plan, other_workspace).checkpoint_id for _ in range(3)]
        _set_config(channel, "core.retention.max_checkpoints_per_plan", 2, plan_id=plan_id)

        def survivors() -> list[str] | None:
            found = [c.checkpoint_id for c in stub.ListCheckpoints(
                pb.ListCheckpointsRequest(plan_id=plan_id), timeout=10).checkpoints]
            return found if len(found) == 3 else None

        kept = wait_until(survivors, "retention to prune the plan to 2 + the pinned one")
        assert kept == [created[5], created[4], created[0]]
        assert len(stub.ListCheckpoints(pb.ListCheckpointsRequest(plan_id=other_plan), timeout=10).checkpoints) == 3
        wait_until(lambda: "checkpointd_gc_reclaimed_bytes_total" in server.scrape() and _reclaimed(server) >= 60_000,
                   "GC to reclaim the pruned checkpoints' content")
        for checkpoint_id in kept:
            _rollback_is_exact(stub, plan_id, checkpoint_id, workspace, expected[checkpoint_id])
        assert others


def _reclaimed(server) -> float:
    for line in server.scrape().splitlines():
        if line.startswith("checkpointd_gc_reclaimed_bytes_total "):
            return float(line.split()[1])
    return 0.0


def test_deleting_a_checkpoint_never_breaks_another_and_gc_reports_reclaimed_bytes(ops_server):
    server = ops_server()
    workspace = server.new_workspace()
    plan_id = str(ULID())
    shared = random.randbytes(50_000)
    unique = random.randbytes(80_000)
    with grpc.insecure_channel(server.tcp_target) as channel:
        stub = pb_grpc.CheckpointServiceStub(channel)
        (workspace / "shared.bin").write_bytes(shared)
        (workspace / "sub").mkdir()
        (workspace / "sub" / "unique.bin").write_bytes(unique)
        doomed = _create(stub, plan_id, workspace)
        (workspace / "sub" / "unique.bin").unlink()
        (workspace / "sub" / "later.txt").write_text("later")
        survivor = _create(stub, plan_id, workspace)
        expected = tree_state(workspace)
        stub.DeleteCheckpoint(pb.DeleteCheckpointRequest(checkpoint_id=doomed.checkpoint_id), timeout=10)
    # The database store on PostgreSQL fences GC across processes itself, so gc runs beside the
    # server; anything else is locked by the server and needs it stopped.
    online = server.store_kind == "db" and bool(server.db_url)
    if not online:
        running = run_cli("gc", "--data-dir", str(server.data_dir), *_db_args(server))
        assert running.returncode == 1 and "in use by another checkpointd process" in running.stderr
        server.stop()
    dry = run_cli("gc", "--data-dir", str(server.data_dir), "--dry-run", "--json", *_db_args(server))
    assert dry.returncode == 0, dry.stderr
    preview = json.loads(dry.stdout)
    report = json.loads(run_cli("gc", "--data-dir", str(server.data_dir), "--json", *_db_args(server)).stdout)
    # unique.bin, and the old root and sub/ tree nodes: nothing else is unreferenced.
    assert report["deleted_objects"] == preview["deleted_objects"] == 3
    assert report["reclaimed_bytes"] == preview["reclaimed_bytes"] >= len(unique)
    assert report["store_objects"] == preview["store_objects"] - 3
    again = json.loads(run_cli("gc", "--data-dir", str(server.data_dir), "--json", *_db_args(server)).stdout)
    assert (again["deleted_objects"], again["reclaimed_bytes"]) == (0, 0)
    compacted = run_cli("gc", "--data-dir", str(server.data_dir), "--compact", "--json", *_db_args(server))
    assert compacted.returncode == 0, compacted.stderr
    compaction = json.loads(compacted.stdout)["compaction"]
    assert compaction["store_bytes"] <= report["store_bytes"]
    if server.store_kind == "disk":
        assert compaction["packs"] >= 1 and compaction["reclaimed_bytes"] > 0, compaction
    usage = json.loads(run_cli("stats", "--data-dir", str(server.data_dir), "--json", *_db_args(server)).stdout)
    (plan,) = usage["plans"]
    assert plan["plan_id"] == plan_id and plan["checkpoints"] == 1 and usage["missing_nodes"] == 0
    # shared.bin (random: stored whole), later.txt, the root and sub/ nodes; unique.bin is gone.
    assert plan["objects"] == 4 and len(shared) <= plan["store_bytes"] < len(shared) + len(unique)
    assert plan["store_bytes"] <= usage["store_bytes"]
    table = run_cli("gc", "--data-dir", str(server.data_dir), *_db_args(server))
    assert "bytes reclaimed" in table.stdout, table.stderr
    if online:
        server.stop()
    server.start()
    with grpc.insecure_channel(server.tcp_target) as channel:
        stub = pb_grpc.CheckpointServiceStub(channel)
        (workspace / "shared.bin").write_text("clobbered")
        _rollback_is_exact(stub, plan_id, survivor.checkpoint_id, workspace, expected)


def _db_args(server) -> list[str]:
    args = ["--store", server.store_kind]
    return [*args, "--db-url", server.db_url] if server.db_url else args


def test_gc_under_concurrent_writers_keeps_every_surviving_checkpoint_exact(ops_server):
    """Writers cycle file contents among a few values, so objects keep flipping between
    referenced and unreferenced while retention prunes and GC sweeps every 20 ms. No GC may
    find a referenced object missing, and after a restart (no cache to hide a lost object)
    every surviving checkpoint must roll back exactly, while GC keeps running."""
    server = ops_server("--gc-interval", "0.02", "--metrics-listen", "127.0.0.1:0")
    with grpc.insecure_channel(server.tcp_target) as channel:
        _set_config(channel, "core.retention.max_checkpoints_per_plan", 3)
    writers, rounds = 4, 12
    contents = [random.randbytes(3000) for _ in range(4)]
    expected: dict[str, tuple[str, object, dict]] = {}
    errors: list[BaseException] = []
    lock = threading.Lock()

    def writer(index: int) -> None:
        try:
            plan_id = str(ULID())
            workspace = server.new_workspace()
            rng = random.Random(index)
            with grpc.insecure_channel(server.tcp_target) as channel:
                stub = pb_grpc.CheckpointServiceStub(channel)
                for step in range(rounds):
                    (workspace / "shared.bin").write_bytes(rng.choice(contents))
                    (workspace / "dir").mkdir(exist_ok=True)
                    (workspace / "dir" / "own.txt").write_text(f"{index}-{rng.randrange(3)}")
                    if step % 4 == 3:
                        (workspace / "dir" / "own.txt").unlink()
                    checkpoint = _create(stub, plan_id, workspace)
                    with lock:
                        expected[checkpoint.checkpoint_id] = (plan_id, workspace, tree_state(workspace))
        except BaseException as exc:  # reported by the main thread
            errors.append(exc)

    threads = [threading.Thread(target=writer, args=(i,)) for i in range(writers)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=300)
    assert not errors, errors
    runs_after_writes = _gc_runs(server) + 2
    wait_until(lambda: _gc_runs(server) >= runs_after_writes, "two GC runs after the writers finished")
    metrics = server.scrape()
    assert _metric(metrics, 'checkpointd_retention_pruned_checkpoints_total{rule="max_checkpoints_per_plan"}') > 0
    assert _metric(metrics, "checkpointd_gc_deleted_objects_total") > 0
    assert _metric(metrics, "checkpointd_maintenance_failures_total") == 0, server.log()
    server.stop()
    server.start()
    with grpc.insecure_channel(server.tcp_target) as channel:
        stub = pb_grpc.CheckpointServiceStub(channel)
        plans = {plan_id: workspace for plan_id, workspace, _ in expected.values()}
        surviving = []
        for plan_id in plans:
            listed = stub.ListCheckpoints(pb.ListCheckpointsRequest(plan_id=plan_id), timeout=10).checkpoints
            assert len(listed) == 3
            surviving += [c.checkpoint_id for c in listed]
        for checkpoint_id in surviving:
            plan_id, workspace, state = expected[checkpoint_id]
            _rollback_is_exact(stub, plan_id, checkpoint_id, workspace, state)
    wait_until(lambda: _gc_runs(server) >= 2, "GC to run after the restart")
    assert _metric(server.scrape(), "checkpointd_maintenance_failures_total") == 0, server.log()


def _metric(text: str, name: str) -> float:
    for line in text.splitlines():
        if line.startswith(name + " "):
            return float(line.rsplit(" ", 1)[1])
    return 0.0


def _gc_runs(server) -> float:
    return _metric(server.scrape(), "checkpointd_gc_runs_total")


@pytest.mark.parametrize("value", [-1, 1.5, "ten"])
def test_retention_keys_refuse_invalid_values(checkpointd_server, value):
    with grpc.insecure_channel(checkpointd_server.tcp_target) as channel, pytest.raises(grpc.RpcError) as caught:
        wire = struct_pb2.Value(string_value=value) if isinstance(value, str) else struct_pb2.Value(number_value=value)
        config_grpc.ConfigServiceStub(channel).SetConfig(
            config_pb.SetConfigRequest(key="core.retention.max_age_seconds", value=wire), timeout=10)
    assert caught.value.code() is grpc.StatusCode.INVALID_ARGUMENT
