"""Prometheus metrics on their own port and JSON logs, scraped and read from real servers."""

from __future__ import annotations

import json
import re
import time
from collections import Counter

import grpc
import pytest
from prometheus_client.parser import text_string_to_metric_families
from ulid import ULID

from checkpoint.v1 import checkpoint_service_pb2 as pb
from checkpoint.v1 import checkpoint_service_pb2_grpc as pb_grpc
from checkpointd.core.kernel import telemetry
from checkpointd.core.store.content_store import ContentStore
from checkpointd.metrics import PrometheusMetrics
from tests.helpers import error_info
from tests.ops.conftest import wait_until


def _samples(text: str) -> dict[tuple[str, frozenset], float]:
    return {(s.name, frozenset(s.labels.items())): s.value
            for family in text_string_to_metric_families(text) for s in family.samples}


def _value(samples: dict, name: str, **labels: str) -> float:
    return samples.get((name, frozenset(labels.items())), 0.0)


def test_metrics_count_calls_by_code_and_measure_checkpoints(ops_server):
    server = ops_server("--metrics-listen", "127.0.0.1:0")
    workspace = server.new_workspace()
    (workspace / "a.txt").write_bytes(b"a" * 5000)
    (workspace / "b.txt").write_bytes(b"b" * 3000)
    before = _samples(server.scrape())
    plan_id = str(ULID())
    with grpc.insecure_channel(server.tcp_target) as channel:
        stub = pb_grpc.CheckpointServiceStub(channel)
        stub.CreateCheckpoint(pb.CreateCheckpointRequest(plan_id=plan_id, workspace_root=str(workspace)),
                              timeout=30)
        for _ in range(2):
            with pytest.raises(grpc.RpcError):
                stub.ListCheckpoints(pb.ListCheckpointsRequest(plan_id="not-a-ulid"), timeout=10)
    service = "checkpoint.v1.CheckpointService"
    handled = "checkpointd_grpc_server_handled_total"
    # A call is counted once its handler has returned, which may be just after its status reached
    # the client (an abort): the count is awaited, then checked exactly.
    def counted() -> str | None:
        scraped = server.scrape()
        failed = _value(_samples(scraped), handled, grpc_service=service, grpc_method="ListCheckpoints",
                        grpc_code="INVALID_ARGUMENT")
        return scraped if failed >= 2 else None

    text = wait_until(counted, "the failed calls to be counted", timeout=10)
    after = _samples(text)
    assert _value(after, handled, grpc_service=service, grpc_method="CreateCheckpoint", grpc_code="OK") == 1
    assert _value(after, handled, grpc_service=service, grpc_method="ListCheckpoints",
                  grpc_code="INVALID_ARGUMENT") == 2
    assert _value(after, "checkpointd_grpc_server_handling_seconds_count", grpc_service=service,
                  grpc_method="CreateCheckpoint") == 1
    assert _value(after, "checkpointd_checkpoint_size_bytes_sum", trigger="manual") == 8000
    assert _value(after, "checkpointd_checkpoint_files_sum", trigger="manual") == 2
    assert _value(before, "checkpointd_checkpoint_files_count", trigger="manual") == 0
    assert _value(after, "checkpointd_store_objects") >= 0
    for family in ("checkpointd_store_bytes", "checkpointd_watcher_fallbacks", "checkpointd_gc_reclaimed_bytes",
                   "checkpointd_retention_pruned_checkpoints", "process_resident_memory_bytes"):
        assert re.search(rf"^# HELP {family}(_total)? ", text, re.MULTILINE), family


def test_metrics_are_off_unless_asked_for(checkpointd_server):
    assert "checkpointd metrics:" not in checkpointd_server.log()


def test_engine_events_reach_prometheus_through_the_facade(tmp_path):
    """core.telemetry is what the engine calls; once bound, the server's metrics see it."""
    metrics = PrometheusMetrics(ContentStore(tmp_path / "store"))
    telemetry.watcher_fallback("queue_overflow")
    assert metrics.watcher_fallbacks.labels("queue_overflow")._value.get() == 0
    telemetry.bind(metrics)
    try:
        telemetry.watcher_fallback("queue_overflow")
        telemetry.watcher_fallback("queue_overflow")
        telemetry.checkpoints_pruned("max_age", 3)
        telemetry.captured(telemetry.CaptureMode.INCREMENTAL, 0.003)
        telemetry.made_durable(telemetry.Durable.METADATA, 0.0015)
    finally:
        telemetry.unbind(metrics)
    telemetry.watcher_fallback("queue_overflow")
    assert metrics.watcher_fallbacks.labels("queue_overflow")._value.get() == 2
    assert metrics.pruned.labels("max_age")._value.get() == 3
    assert metrics.capture_seconds.labels("incremental")._sum.get() == 0.003
    assert metrics.durable_seconds.labels("metadata")._sum.get() == 0.0015


def test_a_checkpoint_s_time_splits_into_its_capture_and_the_syncs_it_waits_for(ops_server):
    """Where a slow checkpoint spends its time, from a real server: the first capture of a
    workspace reads all of it, the next only what changed; each checkpoint that stored new
    content syncs its objects, then its metadata transaction."""
    server = ops_server("--metrics-listen", "127.0.0.1:0")
    workspace = server.new_workspace()
    (workspace / "a.txt").write_text("first")
    plan_id = str(ULID())
    with grpc.insecure_channel(server.tcp_target) as channel:
        stub = pb_grpc.CheckpointServiceStub(channel)
        for content in ("first", "second"):
            (workspace / "a.txt").write_text(content)
            stub.CreateCheckpoint(pb.CreateCheckpointRequest(plan_id=plan_id, workspace_root=str(workspace)),
                                  timeout=30)
    after = _samples(server.scrape())
    captures = {mode: _value(after, "checkpointd_capture_seconds_count", mode=mode)
                for mode in ("full", "incremental", "unwatched")}
    args = server.command()
    watched = ("--watcher", "off") not in zip(args, args[1:], strict=False)
    assert captures == ({"full": 1, "incremental": 1, "unwatched": 0} if watched else
                        {"full": 0, "incremental": 0, "unwatched": 2})
    if server.store_kind == "disk":
        assert _value(after, "checkpointd_durable_write_seconds_count", what="objects") == 2
    assert _value(after, "checkpointd_durable_write_seconds_count", what="metadata") == 2
    assert _value(after, "checkpointd_durable_write_seconds_sum", what="metadata") > 0


def test_json_logs_carry_plan_checkpoint_and_request_ids(ops_server):
    server = ops_server("--log-format", "json")
    workspace = server.new_workspace()
    (workspace / "f.txt").write_text("x")
    plan_id = str(ULID())
    request_id = "req-" + str(ULID())
    with grpc.insecure_channel(server.tcp_target) as channel:
        stub = pb_grpc.CheckpointServiceStub(channel)
        created = stub.CreateCheckpoint(pb.CreateCheckpointRequest(
            plan_id=plan_id, workspace_root=str(workspace), request_id=request_id), timeout=30).checkpoint
        _, call = stub.GetCheckpoint.with_call(pb.GetCheckpointRequest(checkpoint_id=created.checkpoint_id),
                                               timeout=10, metadata=(("x-request-id", "trace-42"),))
        assert dict(call.trailing_metadata())["x-request-id"] == "trace-42"
        fresh = [dict(stub.GetCheckpoint.with_call(pb.GetCheckpointRequest(checkpoint_id=created.checkpoint_id),
                                                   timeout=10)[1].trailing_metadata())["x-request-id"]
                 for _ in range(2)]
        assert all(re.fullmatch(r"[0-9a-f]{32}", value) for value in fresh) and fresh[0] != fresh[1], fresh
    # Access lines are written once each reply has gone: wait for the GetCheckpoint one.
    deadline = time.monotonic() + 10
    while True:
        records = [json.loads(line) for line in server.log_path.read_text().splitlines() if line.startswith("{")]
        if any(r.get("method", "").endswith("/GetCheckpoint") for r in records) or time.monotonic() > deadline:
            break
        time.sleep(0.05)
    assert records, server.log()
    assert all({"time", "level", "logger", "message"} <= r.keys() for r in records)
    create = [r for r in records if r.get("method") == "/checkpoint.v1.CheckpointService/CreateCheckpoint"]
    assert len(create) == 1
    assert (create[0]["plan_id"], create[0]["checkpoint_id"], create[0]["request_id"], create[0]["code"]) == (
        plan_id, created.checkpoint_id, request_id, "OK")
    get = [r for r in records if r.get("method") == "/checkpoint.v1.CheckpointService/GetCheckpoint"]
    assert (get[0]["checkpoint_id"], get[0]["request_id"]) == (created.checkpoint_id, "trace-42")


def test_every_call_writes_exactly_one_access_line_whatever_runs_it_and_however_it_ends(ops_server):
    """Coroutine handlers (CreateCheckpoint) log from the call's done callback, plain ones (run in
    the thread pool) at once: each call once, succeeded or failed; a failed call's line carries
    its ErrorInfo reason, and no other line says it again."""
    server = ops_server("--log-format", "json")
    plan_id = str(ULID())
    calls = {
        "state-only-first": lambda stub, md: stub.CreateCheckpoint(pb.CreateCheckpointRequest(plan_id=plan_id),
                                                                   timeout=30, metadata=md),
        "state-only-on-the-loop": lambda stub, md: stub.CreateCheckpoint(
            pb.CreateCheckpointRequest(plan_id=plan_id, state=b"s"), timeout=30, metadata=md),
        "create-refused": lambda stub, md: stub.CreateCheckpoint(pb.CreateCheckpointRequest(plan_id="nope"),
                                                                 timeout=30, metadata=md),
        "list-ok": lambda stub, md: stub.ListCheckpoints(pb.ListCheckpointsRequest(plan_id=plan_id),
                                                         timeout=30, metadata=md),
        "get-not-found": lambda stub, md: stub.GetCheckpoint(pb.GetCheckpointRequest(checkpoint_id=str(ULID())),
                                                             timeout=30, metadata=md),
    }
    codes, reasons = {}, {}
    with grpc.insecure_channel(server.tcp_target) as channel:
        stub = pb_grpc.CheckpointServiceStub(channel)
        for name, call in calls.items():
            try:
                call(stub, (("x-request-id", name),))
                codes[name] = "OK"
            except grpc.RpcError as error:
                codes[name] = error.code().name
                reasons[name] = error_info(error).reason
    assert codes == {"state-only-first": "OK", "state-only-on-the-loop": "OK", "create-refused": "INVALID_ARGUMENT",
                     "list-ok": "OK", "get-not-found": "NOT_FOUND"}

    def access_lines() -> list[dict]:
        lines = [json.loads(line) for line in server.log_path.read_text().splitlines() if line.startswith("{")]
        return [r for r in lines if r.get("logger") == "checkpointd.access"]

    # One more call, made after every call above has been answered: once its line is written, a
    # second line of any call above (written when that call ended, before this one began) is too.
    with grpc.insecure_channel(server.tcp_target) as channel:
        pb_grpc.CheckpointServiceStub(channel).ListCheckpoints(
            pb.ListCheckpointsRequest(plan_id=plan_id), timeout=30, metadata=(("x-request-id", "last"),))
    wait_until(lambda: {*calls, "last"} <= {r.get("request_id") for r in access_lines()}, "every call's access line")
    logged = Counter(r["request_id"] for r in access_lines() if r.get("request_id") in calls)
    assert logged == Counter(calls.keys()), server.log()
    assert {r["request_id"]: r["code"] for r in access_lines() if r.get("request_id") in calls} == codes
    assert {r["request_id"]: r["reason"] for r in access_lines() if "reason" in r} == reasons, server.log()
    assert all(f"{codes[name]} {reason} " in r["message"] for name, reason in reasons.items()
               for r in access_lines() if r.get("request_id") == name)
    said = [r for r in (json.loads(line) for line in server.log_path.read_text().splitlines() if line.startswith("{"))
            if r.get("request_id") in calls and r.get("logger") != "checkpointd.access"]
    assert not said, f"a call's outcome logged twice: {said}"
