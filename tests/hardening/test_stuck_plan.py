"""One plan's capture is stuck (paused at its .gitignore read) and a client keeps firing calls
at that plan, far more than the server has threads: health and other plans' creates keep
answering within the bound. The calls for the stuck plan wait without holding a thread, or are
refused UNAVAILABLE / PLAN_BUSY (which clients retry); none fails otherwise, and once the
capture resumes every accepted call completes."""

from __future__ import annotations

import threading

import grpc
from ulid import ULID

from checkpoint.v1 import checkpoint_service_pb2 as pb
from checkpoint.v1 import checkpoint_service_pb2_grpc as pb_grpc
from checkpointd.core.engine.plan_locks import MAX_WAITERS
from tests.hardening.liveness import Probes
from tests.hardening.support import list_all, start_with_faults
from tests.helpers import error_info

#: Calls fired at the stuck plan: more than the server has threads (32) and than may wait for a plan.
FLOOD = MAX_WAITERS + 32


def test_a_stuck_capture_and_a_flood_of_calls_for_its_plan_stall_no_other_plan(idle_server, tmp_path):
    server = idle_server
    handshake = tmp_path / "faults"
    handshake.mkdir()
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
