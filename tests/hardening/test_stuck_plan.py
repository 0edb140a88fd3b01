"""One plan's capture is stuck (paused at its .gitignore read) and a client keeps firing calls
at that plan, far more than the server has threads: health and other plans' creates keep
answering within the bound. The calls for the stuck plan wait without holding a thread, or are
refused UNAVAILABLE / PLAN_BUSY (which clients retry); none fails otherwise, and once the
capture resumes every accepted call completes.

Garbage collection runs every 0.2 s meanwhile: it cannot run while the stuck capture references
the store, and must not hold the other plans' captures back behind it (it is postponed). With
``--store db`` the stuck capture also holds the replica fence past its turn: the other captures
must not wait for it either. Runs on SQLite and (Makefile PG stage) PostgreSQL + database store."""

from __future__ import annotations

import threading
import time

import grpc
from grpc_health.v1 import health_pb2, health_pb2_grpc
from ulid import ULID

from checkpoint.v1 import checkpoint_service_pb2 as pb
from checkpoint.v1 import checkpoint_service_pb2_grpc as pb_grpc
from checkpointd.core.engine.plan_locks import MAX_WAITERS
from tests.hardening.liveness import BOUND_SECONDS, STALLED_SECONDS, Probes, over_bound
from tests.hardening.support import list_all, metric, start_with_faults
from tests.helpers import error_info

#: Calls fired at the stuck plan: more than the server has threads (32) and than may wait for a plan.
FLOOD = MAX_WAITERS + 32


def test_a_stuck_capture_and_a_flood_of_calls_for_its_plan_stall_no_other_plan(idle_server, tmp_path):
    server = idle_server
    handshake = tmp_path / "faults"
    handshake.mkdir()
    server.extra_args = (*server.extra_args, "--gc-interval", "0.2", "--metrics-listen", "127.0.0.1:0")
    start_with_faults(server, CHECKPOINTD_PAUSE_AT="workspace.read:1", CHECKPOINTD_FAULT_DIR=str(handshake))
    probes = Probes(server)  # their workspaces have no .gitignore: they never reach workspace.read
    stuck_root = server.new_workspace()
    (stuck_root / "a.txt").write_text("first")
    plan_id = str(ULID())
    with grpc.insecure_channel(server.tcp_target) as channel:
        stub = pb_grpc.CheckpointServiceStub(channel)
        first = stub.CreateCheckpoint(pb.CreateCheckpointRequest(plan_id=plan_id, workspace_root=str(stuck_root)),
                                      timeout=30).checkpoint
        (stuck_root / ".gitignore").write_text("*.tmp\n")  # the next capture reads it, and pauses there
        stuck = stub.CreateCheckpoint.future(pb.CreateCheckpointRequest(plan_id=plan_id), timeout=120)
        paused = handshake / "paused.workspace.read"
        reached = threading.Event()
        for _ in range(3000):
            if paused.exists() or stuck.done():
                break
            reached.wait(0.01)
        assert paused.exists(), f"the capture never paused: {stuck.exception() if stuck.done() else 'running'}"
        # A collection gives up on a capture once it has referenced the store for its patience:
        # from then on, every collection gives up at once (the stuck capture is older than that).
        postponed_before = metric(server, "checkpointd_gc_postponed_total")
        for _ in range(3000):
            if metric(server, "checkpointd_gc_postponed_total") > postponed_before:
                break
            reached.wait(0.01)
        assert metric(server, "checkpointd_gc_postponed_total") > postponed_before, server.log()

        flood = []
        for i in range(FLOOD):
            if i % 8 == 0:
                call = stub.DiffCheckpoints.future(pb.DiffCheckpointsRequest(base_checkpoint_id=first.checkpoint_id),
                                                   timeout=120)
            elif i % 8 == 1:
                call = stub.Rollback.future(pb.RollbackRequest(plan_id=plan_id, checkpoint_id=first.checkpoint_id,
                                                               dry_run=True), timeout=120)
            else:
                call = stub.CreateCheckpoint.future(pb.CreateCheckpointRequest(plan_id=plan_id), timeout=120)
            flood.append(call)
        # The flood has been taken in once the calls past the waiting limit are answered (a server
        # that gives each call a thread answers none: the probes then meet the stall).
        for _ in range(1500):
            if sum(call.done() for call in flood) >= FLOOD - MAX_WAITERS:
                break
            reached.wait(0.01)
        try:
            probes.run(rounds=30)
            probes.assert_within_bound()
        finally:
            (handshake / "resume.workspace.read").touch()
            probes.close()

        assert stuck.result(timeout=120).checkpoint.sequence == 2
        created = busy = 0
        for call in flood:
            try:
                reply = call.result(timeout=120)
                created += isinstance(reply, pb.CreateCheckpointResponse)
            except grpc.RpcError as error:
                assert error.code() == grpc.StatusCode.UNAVAILABLE, (error.code(), error.details())
                assert error_info(error).reason == "PLAN_BUSY" and error_info(error).metadata["plan_id"] == plan_id
                busy += 1
        assert busy >= FLOOD - MAX_WAITERS, "calls past the waiting limit are refused"
        assert len(list_all(stub, plan_id)) == 2 + created, "every create that was accepted is recorded"


#: Seconds each capture of a workspace with a .gitignore stalls at its read, in the test below.
STALL_SECONDS = 6
#: Plans stalled at once: more than the server's threads (32).
STALLED_PLANS = 36


def test_captures_stuck_on_every_thread_leave_reads_and_health_answering(idle_server):
    """More plans than the server has threads are stuck in captures at once: reads (Get, List)
    and health still answer within the bound, as the stuck plan calls never take the threads
    kept for them; once the stall ends, every create completes."""
    server = idle_server
    start_with_faults(server, CHECKPOINTD_SLOW_AT=f"workspace.read:{STALL_SECONDS}")
    with grpc.insecure_channel(server.tcp_target) as channel:
        stub = pb_grpc.CheckpointServiceStub(channel)
        health = health_pb2_grpc.HealthStub(channel)
        reader = str(ULID())
        recorded = stub.CreateCheckpoint(pb.CreateCheckpointRequest(plan_id=reader, state=b"r"), timeout=30).checkpoint
        stuck = []
        for _ in range(STALLED_PLANS):
            root = server.new_workspace()
            (root / ".gitignore").write_text("*.tmp\n")  # each capture stalls reading it
            stuck.append(stub.CreateCheckpoint.future(
                pb.CreateCheckpointRequest(plan_id=str(ULID()), workspace_root=str(root)), timeout=120))
        waited = threading.Event()
        waited.wait(STALL_SECONDS / 4)  # the creates have reached their stall (an empty workspace is quick)
        assert not any(call.done() for call in stuck), "the stall ended before the reads were timed"
        samples: dict[str, list[float]] = {}
        calls = {
            "health": lambda: health.Check(health_pb2.HealthCheckRequest(), timeout=STALLED_SECONDS),
            "get": lambda: stub.GetCheckpoint(pb.GetCheckpointRequest(checkpoint_id=recorded.checkpoint_id),
                                              timeout=STALLED_SECONDS),
            "list": lambda: stub.ListCheckpoints(pb.ListCheckpointsRequest(plan_id=reader), timeout=STALLED_SECONDS),
        }
        for _ in range(5):
            for kind, call in calls.items():
                started = time.perf_counter()
                call()
                samples.setdefault(kind, []).append(time.perf_counter() - started)
        over = over_bound(samples)
        assert not over, f"calls slower than {BOUND_SECONDS * 1000:.0f} ms (ms): {over}"
        assert not any(call.done() for call in stuck), "the stall ended while the reads were timed"
        for call in stuck:
            assert call.result(timeout=120).checkpoint.sequence == 1
