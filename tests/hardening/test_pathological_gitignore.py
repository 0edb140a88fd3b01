"""A .gitignore line that sends a backtracking matcher into exponential time (``*a*a*...*b``
against long names) must cost its own capture bounded work and nothing else: while a real
server checkpoints such a workspace, health and other plans' creates keep answering within
the bound, the checkpoint completes, and SIGTERM still stops the server promptly."""

from __future__ import annotations

import signal
import subprocess
import threading
import time

import grpc
from ulid import ULID

from checkpoint.v1 import checkpoint_service_pb2 as pb
from checkpoint.v1 import checkpoint_service_pb2_grpc as pb_grpc
from tests.hardening.liveness import Probes

LINE = "*a*a*a*a*a*a*a*a*a*a*a*a*a*a*a*a*b"
NAME = "a" * 240
#: Long names in nested directories: kept, and asked of the pattern at every level.
FILES = 300


def pathological_workspace(server):
    root = server.new_workspace()
    (root / ".gitignore").write_text(f"{LINE}\n{LINE}/\n/deep/**/{LINE}\n")
    for i in range(FILES):
        directory = root / "deep" / f"{NAME[:200]}{i % 10}"
        directory.mkdir(parents=True, exist_ok=True)
        (directory / f"{NAME}{i}").write_text("kept")
    (root / f"{NAME[:-1]}b").write_text("ignored: the pattern matches it")
    return root


def test_a_pathological_gitignore_stalls_nothing_and_sigterm_stops_the_server(fresh_server):
    server = fresh_server
    probes = Probes(server)
    root = pathological_workspace(server)
    outcome: dict[str, object] = {}

    def checkpoint() -> None:
        with grpc.insecure_channel(server.tcp_target) as channel:
            try:
                outcome["reply"] = pb_grpc.CheckpointServiceStub(channel).CreateCheckpoint(
                    pb.CreateCheckpointRequest(plan_id=str(ULID()), workspace_root=str(root)), timeout=60)
            except grpc.RpcError as error:
                outcome["error"] = error

    capture = threading.Thread(target=checkpoint)
    try:
        capture.start()
        probes.run(rounds=20, until=lambda: not capture.is_alive(), give_up_seconds=90)
        probes.assert_within_bound()
        capture.join(timeout=60)
        assert "error" not in outcome, outcome
        assert outcome["reply"].checkpoint.file_count == FILES + 1  # the .gitignore and the long names
    finally:
        probes.close()

    # SIGTERM as a second such capture is sent (it runs, or is refused by the drain): the server
    # stops promptly. (A matcher that backtracks would hold the interpreter lock, and no signal
    # handler would run: the first part above fails on that already.)
    again = pathological_workspace(server)
    with grpc.insecure_channel(server.tcp_target) as channel:
        running = pb_grpc.CheckpointServiceStub(channel).CreateCheckpoint.future(
            pb.CreateCheckpointRequest(plan_id=str(ULID()), workspace_root=str(again)), timeout=60)
        process = server.process
        started = time.monotonic()
        process.send_signal(signal.SIGTERM)
        try:
            process.wait(timeout=20)
        except subprocess.TimeoutExpired:
            raise AssertionError("checkpointd did not stop within 20 s of SIGTERM") from None
        assert time.monotonic() - started < 20
        try:
            assert running.result(timeout=5).checkpoint.file_count == FILES + 1
        except grpc.RpcError as error:
            # It arrived after the drain began or after the listeners closed (UNAVAILABLE), or, still
            # undelivered to any handler, as gRPC's own stop began (CANCELLED; seen once in CI on 4
            # December, before the drain lingered; now only a call stalled past the linger on a loaded
            # machine). A call the server admitted finishes within the grace period here, or is
            # answered UNAVAILABLE (tests/ops/test_shutdown.py).
            assert error.code() in (grpc.StatusCode.UNAVAILABLE, grpc.StatusCode.CANCELLED), (
                error.code(), error.details())
    server.process = None
