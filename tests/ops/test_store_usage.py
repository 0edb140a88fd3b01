"""Each plan's store usage: `checkpointd_plan_store_bytes` / `checkpointd_plan_exclusive_store_bytes`
(measured by the server's usage thread) and the `store bytes` / `exclusive bytes` of `checkpointd stats`.

The content is random (stored as is: its size plus at most a 37-byte record header) except one highly
compressible file, so every figure is known to within the few small tree nodes a checkpoint adds."""

from __future__ import annotations

import json
import random
import time

import grpc
from prometheus_client.parser import text_string_to_metric_families
from ulid import ULID

from checkpoint.v1 import checkpoint_service_pb2 as pb
from checkpoint.v1 import checkpoint_service_pb2_grpc as pb_grpc
from checkpointd.core.maintenance.usage import PlansUsage, PlanUsage
from checkpointd.metrics import PLAN_USAGE_EXPORTED, PrometheusMetrics
from tests.ops.conftest import run_cli, wait_until

#: What tree nodes, record headers and the compressible file may add to a figure.
SLACK = 2048
SHARED = 200_000
A_ONLY = 120_000
A_STATE = 40_000
B_BIG = 1_500_000  # over 1 MiB: a loose object on disk, two chunks in the database store
C_STATE = 30_000
COMPRESSIBLE = 300_000


def _db_args(server) -> list[str]:
    args = ["--store", server.store_kind]
    return [*args, "--db-url", server.db_url] if server.db_url else args


def _create(stub, plan_id: str, workspace=None, state: bytes = b"") -> pb.Checkpoint:
    return stub.CreateCheckpoint(pb.CreateCheckpointRequest(
        plan_id=plan_id, workspace_root=str(workspace or ""), state=state), timeout=60).checkpoint


def _scrape_usage(server) -> tuple[float, dict[str, tuple[int, int]]]:
    """(when the server's last measurement started, {plan_id: (store_bytes, exclusive_bytes)})."""
    families = {family.name: family for family in text_string_to_metric_families(server.scrape())}
    timestamps = [sample.value for sample in families["checkpointd_plan_usage_timestamp_seconds"].samples] \
        if "checkpointd_plan_usage_timestamp_seconds" in families else []
    store = {s.labels["plan_id"]: int(s.value) for s in families["checkpointd_plan_store_bytes"].samples}
    exclusive = {s.labels["plan_id"]: int(s.value) for s in families["checkpointd_plan_exclusive_store_bytes"].samples}
    assert store.keys() == exclusive.keys()
    return (timestamps[0] if timestamps else 0.0), {plan: (store[plan], exclusive[plan]) for plan in store}


def _measured_after(server, moment: float) -> dict[str, tuple[int, int]]:
    """The per-plan gauges of the first measurement that started after ``moment``."""
    def fresh():
        measured_at, plans = _scrape_usage(server)
        return plans if measured_at > moment else None

    return wait_until(fresh, f"a store usage measurement after {moment}")


def _within(figure: int, content: int, slack: int = SLACK) -> bool:
    return content <= figure <= content + slack


def test_plan_store_bytes_in_metrics_and_stats_count_shared_and_exclusive_content(ops_server):
    server = ops_server("--metrics-listen", "127.0.0.1:0", "--usage-interval", "0.1")
    a, b, c = sorted(str(ULID()) for _ in range(3))
    shared = random.randbytes(SHARED)
    a_workspace, b_workspace = server.new_workspace(), server.new_workspace()
    (a_workspace / "shared.bin").write_bytes(shared)
    (a_workspace / "a.bin").write_bytes(random.randbytes(A_ONLY))
    (a_workspace / "compressible.txt").write_bytes(b"x" * COMPRESSIBLE)
    (b_workspace / "shared.bin").write_bytes(shared)
    (b_workspace / "big.bin").write_bytes(random.randbytes(B_BIG))
    with grpc.insecure_channel(server.tcp_target) as channel:
        stub = pb_grpc.CheckpointServiceStub(channel)
        a_checkpoint = _create(stub, a, a_workspace, state=random.randbytes(A_STATE))
        b_first = _create(stub, b, b_workspace)
        (b_workspace / "big.bin").unlink()
        _create(stub, b, b_workspace)  # shared.bin only
        _create(stub, c, state=random.randbytes(C_STATE))
        written = time.time()
        plans = _measured_after(server, written)
        a_store, a_exclusive = plans[a]
        # The shared file counts in both plans; the compressible one by what it takes compressed.
        assert _within(a_store, SHARED + A_ONLY + A_STATE), plans[a]
        assert _within(a_exclusive, A_ONLY + A_STATE), plans[a]
        assert _within(a_store - a_exclusive, SHARED), plans[a]
        b_store, b_exclusive = plans[b]
        assert _within(b_store, SHARED + B_BIG), plans[b]
        assert _within(b_exclusive, B_BIG), plans[b]
        assert plans[c] == (plans[c][0], plans[c][0]) and _within(plans[c][0], C_STATE, slack=37), plans[c]
        assert list(plans) == [b, a, c]  # largest first

        # Deleting a checkpoint drops what only it referenced from its plan's figure, before any GC.
        stub.DeleteCheckpoint(pb.DeleteCheckpointRequest(checkpoint_id=b_first.checkpoint_id), timeout=10)
        plans = _measured_after(server, time.time())
        assert _within(plans[b][0], SHARED) and plans[b][1] <= SLACK, plans[b]
        assert plans[a] == (a_store, a_exclusive)
        # With plan a gone, the content it shared with b is b's alone.
        stub.DeleteCheckpoint(pb.DeleteCheckpointRequest(checkpoint_id=a_checkpoint.checkpoint_id), timeout=10)
        plans = _measured_after(server, time.time())
        assert a not in plans and sorted(plans) == [b, c]
        assert _within(plans[b][1], SHARED) and plans[b][0] == plans[b][1], plans[b]
    metrics = plans

    # Offline, `checkpointd stats` finds what the server measured, and the store still holds the
    # deleted checkpoints' content until garbage collection.
    online = server.store_kind == "db" and bool(server.db_url)
    if not online:
        server.stop()
    before = json.loads(run_cli("stats", "--data-dir", str(server.data_dir), "--json", *_db_args(server)).stdout)
    assert {plan["plan_id"]: (plan["store_bytes"], plan["exclusive_bytes"]) for plan in before["plans"]} == metrics
    assert before["store_bytes"] >= SHARED + A_ONLY + A_STATE + B_BIG + C_STATE
    # --compact: on disk, deleted records leave their packs only when these are rewritten.
    collected = run_cli("gc", "--data-dir", str(server.data_dir), "--compact", "--json", *_db_args(server))
    assert collected.returncode == 0, collected.stderr
    after = json.loads(run_cli("stats", "--data-dir", str(server.data_dir), "--json", *_db_args(server)).stdout)
    # Garbage collection leaves what the plans reference, but an object stored as a delta against
    # one it deleted (b's newest tree node, against the deleted checkpoint's) is rewritten whole.
    remaining = {plan["plan_id"]: (plan["store_bytes"], plan["exclusive_bytes"]) for plan in after["plans"]}
    assert remaining.keys() == metrics.keys()
    for plan, (store_bytes, exclusive_bytes) in remaining.items():
        assert _within(store_bytes, metrics[plan][0]) and _within(exclusive_bytes, metrics[plan][1]), plan
    assert before["store_bytes"] - after["store_bytes"] >= A_ONLY + A_STATE + B_BIG
    assert after["store_bytes"] >= sum(plan["exclusive_bytes"] for plan in after["plans"])

    only_b = run_cli("stats", "--data-dir", str(server.data_dir), "--plan", b, "--json", *_db_args(server))
    assert only_b.returncode == 0, only_b.stderr
    (row,) = json.loads(only_b.stdout)["plans"]
    assert (row["plan_id"], row["store_bytes"], row["exclusive_bytes"]) == (b, *remaining[b])
    table = run_cli("stats", "--data-dir", str(server.data_dir), "--plan", b, *_db_args(server))
    assert table.returncode == 0 and "exclusive bytes" in table.stdout and b in table.stdout, table.stderr
    assert c not in table.stdout and "whole store" not in table.stdout
    unknown = run_cli("stats", "--data-dir", str(server.data_dir), "--plan", a, *_db_args(server))
    assert unknown.returncode == 1 and f"no checkpoints of plan {a}" in unknown.stderr
    assert "Traceback" not in unknown.stderr
    if online:
        server.stop()


def test_only_the_largest_plans_get_a_series():
    plans = [PlanUsage(f"plan-{n:04d}", 1, 1, n, n // 2) for n in range(PLAN_USAGE_EXPORTED + 50, 0, -1)]
    usage = PrometheusMetrics(store=None).plan_usage
    assert {family.name: family.samples for family in usage.collect()} == {
        "checkpointd_plan_store_bytes": [], "checkpointd_plan_exclusive_store_bytes": []}
    usage.update(PlansUsage(plans, 0, 1234.5))
    families = {family.name: family.samples for family in usage.collect()}
    exported = {sample.labels["plan_id"]: sample.value for sample in families["checkpointd_plan_store_bytes"]}
    assert exported == {plan.plan_id: plan.store_bytes for plan in plans[:PLAN_USAGE_EXPORTED]}
    assert min(exported.values()) == 51
    assert [s.value for s in families["checkpointd_plan_usage_plans"]] == [PLAN_USAGE_EXPORTED + 50]
    assert [s.value for s in families["checkpointd_plan_usage_timestamp_seconds"]] == [1234.5]
