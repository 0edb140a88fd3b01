"""Prometheus metrics, served over plain HTTP on their own port (``--metrics-listen``).

Binds core.telemetry to Prometheus and records every RPC (via api.access). Uses its own
registry, so several servers in one process (tests) never share counters.
"""

from __future__ import annotations

import threading
import time
from typing import Any

import grpc
from prometheus_client import CollectorRegistry, Counter, Histogram
from prometheus_client.core import GaugeMetricFamily
from prometheus_client.exposition import start_http_server
from prometheus_client.gc_collector import GCCollector
from prometheus_client.platform_collector import PlatformCollector
from prometheus_client.process_collector import ProcessCollector

from checkpoint.v1 import checkpoint_service_pb2
from checkpointd.core.kernel import telemetry
from checkpointd.core.kernel.telemetry import CaptureMode, Durable, GcReport
from checkpointd.core.maintenance.retention import store_footprint
from checkpointd.core.maintenance.usage import PlansUsage
from checkpointd.core.store.content_store import ContentStore
from checkpointd.core.store.db_store import DatabaseStore
from checkpointd.listeners import Listener, ListenerError, parse_tcp

_LATENCY_BUCKETS = (0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 120)
#: A sync to a local disk takes about a millisecond: finer below it.
_SYNC_BUCKETS = (0.00025, 0.0005, 0.001, 0.002, 0.004, 0.008, 0.016, 0.032, 0.064, 0.125, 0.25, 0.5, 1, 2.5)
_SIZE_BUCKETS = tuple(float(1 << n) for n in range(10, 41, 3))
_FILE_COUNT_BUCKETS = (1, 10, 100, 1_000, 10_000, 100_000, 1_000_000)
_STORE_BYTES = ("checkpointd_store_bytes", "Bytes held by the content store (disk store: its files' sizes).")
_STORE_OBJECTS = ("checkpointd_store_objects", "Objects in the content store.")
#: A scrape re-measures the store at most this often (a GC report refreshes it too).
STORE_SCAN_SECONDS = 60.0
_PLAN_STORE_BYTES = ("checkpointd_plan_store_bytes",
                     "Bytes the distinct objects a plan's checkpoints reference take in the content store "
                     "(compressed, as stored; shared content counts in every plan that references it), for the "
                     "plans with the most, as last measured (see checkpointd_plan_usage_timestamp_seconds).",
                     None, ["plan_id"])
_PLAN_EXCLUSIVE_BYTES = ("checkpointd_plan_exclusive_store_bytes",
                         "The part of checkpointd_plan_store_bytes no other plan references: what deleting the "
                         "plan's checkpoints would let garbage collection reclaim.", None, ["plan_id"])
_PLAN_USAGE_PLANS = ("checkpointd_plan_usage_plans",
                     "Plans with checkpoints at the last measurement (only the largest "
                     "PLAN_USAGE_EXPORTED get a checkpointd_plan_store_bytes series).")
_PLAN_USAGE_TIMESTAMP = ("checkpointd_plan_usage_timestamp_seconds",
                         "When the last per-plan store usage measurement started (Unix time); absent before the "
                         "first.")
#: Per-plan series exported at most (the plans with the most store_bytes): one series per plan
#: would grow without bound with the plans a server has seen.
PLAN_USAGE_EXPORTED = 100


def _split_method(full_method: str) -> tuple[str, str]:
    service, _, method = full_method.lstrip("/").partition("/")
    return service, method


def _trigger_name(value: int) -> str:
    return checkpoint_service_pb2.Trigger.Name(value).removeprefix("TRIGGER_").lower()


class _StoreUsage:
    """checkpointd_store_bytes / _objects: measured lazily, cached, refreshed by GC reports."""

    def __init__(self, store: ContentStore | DatabaseStore) -> None:
        self.store = store
        self._lock = threading.Lock()
        self._measured_at = float("-inf")
        self._objects = 0
        self._bytes = 0

    def update(self, objects: int, size: int) -> None:
        with self._lock:
            self._objects, self._bytes, self._measured_at = objects, size, time.monotonic()

    def _measure(self) -> None:
        self.update(*store_footprint(self.store))

    def describe(self):
        yield GaugeMetricFamily(*_STORE_BYTES)
        yield GaugeMetricFamily(*_STORE_OBJECTS)

    def collect(self):
        with self._lock:
            stale = time.monotonic() - self._measured_at > STORE_SCAN_SECONDS
        if stale:
            self._measure()
        yield GaugeMetricFamily(*_STORE_BYTES, value=self._bytes)
        yield GaugeMetricFamily(*_STORE_OBJECTS, value=self._objects)


class _PlanUsage:
    """checkpointd_plan_store_bytes and friends: what the last measurement (made by the server's
    usage thread, see core.maintenance.usage) found; a scrape only reads it."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._usage: PlansUsage | None = None

    def update(self, usage: PlansUsage) -> None:
        with self._lock:
            self._usage = usage

    def describe(self):
        yield GaugeMetricFamily(*_PLAN_STORE_BYTES)
        yield GaugeMetricFamily(*_PLAN_EXCLUSIVE_BYTES)
        yield GaugeMetricFamily(*_PLAN_USAGE_PLANS)
        yield GaugeMetricFamily(*_PLAN_USAGE_TIMESTAMP)

    def collect(self):
        with self._lock:
            usage = self._usage
        store_bytes = GaugeMetricFamily(*_PLAN_STORE_BYTES)
        exclusive_bytes = GaugeMetricFamily(*_PLAN_EXCLUSIVE_BYTES)
        if usage is None:
            yield from (store_bytes, exclusive_bytes)
            return
        for plan in usage.plans[:PLAN_USAGE_EXPORTED]:  # largest first
            store_bytes.add_metric([plan.plan_id], plan.store_bytes)
            exclusive_bytes.add_metric([plan.plan_id], plan.exclusive_bytes)
        yield from (store_bytes, exclusive_bytes)
        yield GaugeMetricFamily(*_PLAN_USAGE_PLANS, value=len(usage.plans))
        yield GaugeMetricFamily(*_PLAN_USAGE_TIMESTAMP, value=usage.measured_at)


class PrometheusMetrics(telemetry.Sink):
    def __init__(self, store: ContentStore | DatabaseStore) -> None:
        self.registry = CollectorRegistry(auto_describe=True)
        for collector in (ProcessCollector, PlatformCollector, GCCollector):
            collector(registry=self.registry)
        r = self.registry
        self.rpc_handled = Counter("checkpointd_grpc_server_handled", "RPCs completed, by method and status code.",
                                   ["grpc_service", "grpc_method", "grpc_code"], registry=r)
        self.rpc_latency = Histogram("checkpointd_grpc_server_handling_seconds",
                                     "RPC latency until the handler returned (streams: until they ended).",
                                     ["grpc_service", "grpc_method"], buckets=_LATENCY_BUCKETS, registry=r)
        self.checkpoint_bytes = Histogram("checkpointd_checkpoint_size_bytes",
                                          "Logical size of the files in each recorded checkpoint.",
                                          ["trigger"], buckets=_SIZE_BUCKETS, registry=r)
        self.checkpoint_files = Histogram("checkpointd_checkpoint_files",
                                          "Files captured in each recorded checkpoint.",
                                          ["trigger"], buckets=_FILE_COUNT_BUCKETS, registry=r)
        self.state_bytes = Histogram("checkpointd_checkpoint_state_bytes", "Plan state size of each checkpoint.",
                                     buckets=_SIZE_BUCKETS, registry=r)
        self.watcher_fallbacks = Counter("checkpointd_watcher_fallbacks",
                                         "Times a workspace watcher could not vouch for a workspace and a full "
                                         "scan ran instead.", ["reason"], registry=r)
        self.watcher_missed_files = Counter("checkpointd_watcher_missed_files",
                                            "Files a recheck found changed without a file-watcher event (a hard "
                                            "link outside the workspace, a shared mmap...).", registry=r)
        self.pruned = Counter("checkpointd_retention_pruned_checkpoints", "Checkpoints deleted by retention.",
                              ["rule"], registry=r)
        self.gc_runs = Counter("checkpointd_gc_runs", "Garbage collections completed.", registry=r)
        self.gc_deleted = Counter("checkpointd_gc_deleted_objects", "Store objects deleted by GC.", registry=r)
        self.gc_reclaimed = Counter("checkpointd_gc_reclaimed_bytes", "Bytes reclaimed by GC.", registry=r)
        self.gc_seconds = Histogram("checkpointd_gc_duration_seconds", "Duration of each garbage collection.",
                                    buckets=_LATENCY_BUCKETS, registry=r)
        self.gc_postponed_runs = Counter("checkpointd_gc_postponed",
                                         "Garbage collections postponed, deleting nothing, because a capture "
                                         "held the content store past their patience (it may be stuck).",
                                         registry=r)
        self.gc_failures = Counter("checkpointd_maintenance_failures",
                                   "Retention/GC runs that failed (see the server log).", registry=r)
        self.capture_seconds = Histogram("checkpointd_capture_seconds",
                                         "Workspace captures, by how the workspace was read.", ["mode"],
                                         buckets=_LATENCY_BUCKETS, registry=r)
        self.captures_abandoned = Counter("checkpointd_captures_abandoned",
                                          "Captures stopped before their commit point, recording nothing, because "
                                          "their caller cancelled the call or its deadline passed.",
                                          ["operation", "cause"], registry=r)
        self.durable_seconds = Histogram("checkpointd_durable_write_seconds",
                                         "Syncs a checkpoint waits for before it is acknowledged: its new objects, "
                                         "then its metadata transaction (shared by a group commit).", ["what"],
                                         buckets=_SYNC_BUCKETS, registry=r)
        self.store_usage = _StoreUsage(store)
        r.register(self.store_usage)
        self.plan_usage = _PlanUsage()
        r.register(self.plan_usage)
        self._http: Any = None

    # -- RPCs (api.access.RpcRecorder) --------------------------------------------------

    def record_rpc(self, method: str, code: grpc.StatusCode, seconds: float, response: Any) -> None:
        service, name = _split_method(method)
        self.rpc_handled.labels(service, name, code.name).inc()
        self.rpc_latency.labels(service, name).observe(seconds)
        if isinstance(response, checkpoint_service_pb2.CreateCheckpointResponse):
            self._checkpoint(response.checkpoint)
        elif isinstance(response, checkpoint_service_pb2.RollbackResponse) and response.HasField(
                "safety_checkpoint"):
            self._checkpoint(response.safety_checkpoint)

    def _checkpoint(self, checkpoint: checkpoint_service_pb2.Checkpoint) -> None:
        trigger = _trigger_name(checkpoint.trigger)
        if checkpoint.has_files:
            self.checkpoint_bytes.labels(trigger).observe(checkpoint.total_size_bytes)
            self.checkpoint_files.labels(trigger).observe(checkpoint.file_count)
        self.state_bytes.observe(checkpoint.state_size_bytes)

    # -- domain events (core.telemetry.Sink) --------------------------------------------

    def watcher_fallback(self, reason: str) -> None:
        self.watcher_fallbacks.labels(reason).inc()

    def watcher_missed(self, count: int) -> None:
        self.watcher_missed_files.inc(count)

    def checkpoints_pruned(self, rule: str, count: int) -> None:
        self.pruned.labels(rule).inc(count)

    def garbage_collected(self, report: GcReport) -> None:
        if not report.dry_run:
            self.gc_runs.inc()
            self.gc_deleted.inc(report.deleted_objects)
            self.gc_reclaimed.inc(report.reclaimed_bytes)
            self.gc_seconds.observe(report.duration_seconds)
        self.store_usage.update(report.store_objects, report.store_bytes)

    def gc_postponed(self) -> None:
        self.gc_postponed_runs.inc()

    def captured(self, mode: CaptureMode, seconds: float) -> None:
        self.capture_seconds.labels(mode.value).observe(seconds)

    def capture_abandoned(self, operation: str, why: str) -> None:
        self.captures_abandoned.labels(operation, why).inc()

    def made_durable(self, what: Durable, seconds: float) -> None:
        self.durable_seconds.labels(what.value).observe(seconds)

    def maintenance_failed(self) -> None:
        self.gc_failures.inc()

    # -- HTTP ---------------------------------------------------------------------------

    def serve(self, address: str) -> str:
        """Starts the /metrics endpoint on HOST:PORT; returns the bound address."""
        listener: Listener = parse_tcp(address)
        try:
            self._http, _thread = start_http_server(listener.port, addr=listener.host, registry=self.registry)
        except OSError as exc:
            raise ListenerError(f"cannot serve metrics on {address}: {exc.strerror or exc}; pick another address "
                                "with --metrics-listen HOST:PORT (env CHECKPOINTD_METRICS_LISTEN)") from None
        port = self._http.server_address[1]
        return f"{listener.display_host}:{port}"

    def close(self) -> None:
        if self._http is not None:
            self._http.shutdown()
            self._http.server_close()
            self._http = None
