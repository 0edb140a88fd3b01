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
from tests.helpers import error_info

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


def test_patterns_past_their_matching_budget_refuse_the_checkpoint_and_a_simpler_file_is_captured(fresh_server):
    """Patterns within every size limit can still take long per entry (a wildcard matching every
    name first, then four thousand prefixes tried in turn: about a millisecond an entry). Past
    its budget of CPU (two seconds, plus 0.1 ms an entry) the checkpoint is refused with
    FAILED_PRECONDITION / IGNORE_RULES_TOO_COSTLY naming the file, and nothing is recorded; once
    the file is simplified, the next checkpoint holds every change made meanwhile (the refused
    capture lost none of what the watcher had told it)."""
    server = fresh_server
    root = server.new_workspace()
    (root / "deep").mkdir()
    (root / "deep" / ".gitignore").write_text("x00*\n")
    for i in range(6_000):
        (root / "deep" / f"x{i:05d}").write_text("")
    (root / "kept.txt").write_text("before")
    plan_id = str(ULID())

    def create(stub):
        return stub.CreateCheckpoint(pb.CreateCheckpointRequest(plan_id=plan_id, workspace_root=str(root)),
                                     timeout=120).checkpoint

    with grpc.insecure_channel(server.tcp_target) as channel:
        stub = pb_grpc.CheckpointServiceStub(channel)
        assert create(stub).file_count == 2 + 6_000 - 1_000  # kept.txt and .gitignore, less x00000-x00999
        (root / "kept.txt").write_text("changed while the patterns were costly")
        (root / "deep" / "x05999").write_text("changed too")
        (root / "deep" / ".gitignore").write_text("x*\n" + "".join(f"y{i}*\n" for i in range(4_000)))
        started = time.monotonic()
        try:
            create(stub)
        except grpc.RpcError as error:
            refused = error
        else:
            raise AssertionError("a checkpoint was taken past the ignore patterns' budget")
        assert time.monotonic() - started < 60
        assert refused.code() == grpc.StatusCode.FAILED_PRECONDITION, refused.details()
        info = error_info(refused)
        assert (info.reason, info.metadata["path"]) == ("IGNORE_RULES_TOO_COSTLY", "deep/.gitignore")
        assert len(stub.ListCheckpoints(pb.ListCheckpointsRequest(plan_id=plan_id)).checkpoints) == 1
        (root / "deep" / ".gitignore").write_text("x00*\n")
        made = create(stub)
        assert made.file_count == 2 + 6_000 - 1_000

        def content(path: str) -> bytes:
            return b"".join(chunk.data for chunk in stub.ReadCheckpointFile(
                pb.ReadCheckpointFileRequest(checkpoint_id=made.checkpoint_id, path=path)))

        assert content("kept.txt") == b"changed while the patterns were costly"
        assert content("deep/x05999") == b"changed too"
