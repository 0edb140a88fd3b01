"""A caller that gives up (its deadline passes, or it cancels) stops the server's work for a
rollback or a live diff, if that work has not reached its commit point; work past it, and every
create, runs to its end.

A capture is made slow deterministically: every .gitignore read (one per directory of the
workspaces below) sleeps (``CHECKPOINTD_SLOW_AT=workspace.read``), so a full capture takes many
seconds, and the last directory's read pauses (``CHECKPOINTD_PAUSE_AT``): its handshake file
appears only if a capture reaches the end of its workspace, which an abandoned one must never do.
What is asserted is what the server says and does (its log line, its counter, the plan's lock
given back, the rows, the workspace, fsck), never how fast."""

from __future__ import annotations

import re
import threading
from pathlib import Path

import grpc
import pytest
from ulid import ULID

from checkpoint.v1 import checkpoint_service_pb2 as pb
from checkpoint.v1 import checkpoint_service_pb2_grpc as pb_grpc
from tests.hardening.support import (
    abandoned,
    assert_fsck_clean,
    captured,
    exported,
    handled,
    list_all,
    metric,
    pending_rollbacks,
    start_with_faults,
    wait_until,
)
from tests.helpers import tree_state

#: Directories of the slow workspaces, each with a .gitignore: one slow read each.
DIRECTORIES = 30
#: Seconds each of those reads sleeps: a full capture takes DIRECTORIES times as long.
SLOW_SECONDS = 0.4
#: The deadline of the calls that give up: a few directories into their capture.
GIVE_UP_SECONDS = 1.0
#: How long a test waits for the server to stop the work given up on (it is done long before).
WAIT_SECONDS = 60.0


def _slow_workspace(root: Path) -> None:
    for i in range(DIRECTORIES):
        directory = root / f"d{i:02}"
        directory.mkdir()
        (directory / ".gitignore").write_text("*.log\n")
        (directory / "notes.txt").write_text(f"notes {i}\n")
        (directory / "skipped.log").write_text("ignored\n")
    (root / "big.bin").write_bytes(bytes(range(256)) * (12 * 1024))  # 3 MiB: read in chunks


def _wait_until_given_up(server, method: str) -> None:
    """Returns once the server has ended its handler of a ``method`` call the caller cancelled: the
    work that call runs in a thread has been told (the handler sets its token as it ends)."""
    wait_until(lambda: metric(server, handled(method, "CANCELLED")) >= 1,
               f"the server ended the cancelled {method}", server, WAIT_SECONDS)


def _start_slow(server, handshake: Path) -> None:
    """(Re)starts ``server`` with slow .gitignore reads; the last directory's read of its first
    full capture pauses (see the module docstring)."""
    handshake.mkdir(exist_ok=True)
    start_with_faults(server, CHECKPOINTD_SLOW_AT=f"workspace.read:{SLOW_SECONDS}",
                      CHECKPOINTD_PAUSE_AT=f"workspace.read:{DIRECTORIES}", CHECKPOINTD_FAULT_DIR=str(handshake))


def _wait_until_stopped(server, handshake: Path, counter: str) -> None:
    """Returns once the server counted the work given up on as abandoned; fails at once if that
    work reached the end of its workspace instead."""
    reached_the_end = handshake / "paused.workspace.read"
    waited = threading.Event()
    for _ in range(int(WAIT_SECONDS / 0.05)):
        if reached_the_end.exists():
            (handshake / "resume.workspace.read").touch()  # the server can stop without waiting for it
            raise AssertionError(f"the capture given up on went on to its last directory:\n{server.log()}")
        if metric(server, counter) >= 1:
            return
        waited.wait(0.05)
    raise AssertionError(f"the capture given up on was never stopped:\n{server.log()}")


def test_a_create_whose_deadline_passes_mid_capture_runs_to_its_end_and_its_retry_answers_with_it(idle_server,
                                                                                                  tmp_path):
    """The deadline passes a few directories into the capture: the create goes on to the end of
    the workspace (a capture abandoned at each deadline would never be recorded for a workspace
    whose capture outlasts it) and records its checkpoint once; a retry with the same request_id
    answers with it, exact, nothing is counted as abandoned, and fsck finds nothing wrong."""
    server = idle_server
    server.extra_args = (*server.extra_args, "--metrics-listen", "127.0.0.1:0")
    server.start()
    root = server.new_workspace()
    _slow_workspace(root)
    plan_id = str(ULID())
    with grpc.insecure_channel(server.tcp_target) as channel:
        stub = pb_grpc.CheckpointServiceStub(channel)
        first = stub.CreateCheckpoint(pb.CreateCheckpointRequest(plan_id=plan_id, workspace_root=str(root)),
                                      timeout=60).checkpoint
    server.stop()
    handshake = tmp_path / "faults"
    _start_slow(server, handshake)
    (root / "d00" / "notes.txt").write_text("changed before the create given up on\n")
    (root / "new.txt").write_text("new before the create given up on\n")
    request = pb.CreateCheckpointRequest(plan_id=plan_id, request_id=str(ULID()), description="given up on")
    with grpc.insecure_channel(server.tcp_target) as channel:
        stub = pb_grpc.CheckpointServiceStub(channel)
        with pytest.raises(grpc.RpcError) as gave_up:
            stub.CreateCheckpoint(request, timeout=GIVE_UP_SECONDS)
        assert gave_up.value.code() is grpc.StatusCode.DEADLINE_EXCEEDED, gave_up.value.details()
        reached_the_end = handshake / "paused.workspace.read"
        wait_until(lambda: reached_the_end.exists() or metric(server, abandoned("create", "deadline_exceeded")),
                   "the create given up on reached its last directory or was stopped", server, WAIT_SECONDS)
        assert reached_the_end.exists(), f"the create given up on did not go on to its last directory:\n{server.log()}"
        (handshake / "resume.workspace.read").touch()
        wait_until(lambda: len(list_all(stub, plan_id)) == 2, "the create given up on recorded its checkpoint",
                   server, WAIT_SECONDS)
        [_, recorded] = list_all(stub, plan_id)
        assert recorded.description == "given up on" and recorded.sequence == 2
        assert exported(stub, recorded.checkpoint_id) == captured(root)
        assert stub.CreateCheckpoint(request, timeout=120).checkpoint.checkpoint_id == recorded.checkpoint_id
        assert [c.checkpoint_id for c in list_all(stub, plan_id)] == [first.checkpoint_id, recorded.checkpoint_id]
        (root / "d01" / "notes.txt").write_text("changed after the retry\n")
        (root / "new.txt").unlink()
        after = stub.CreateCheckpoint(pb.CreateCheckpointRequest(plan_id=plan_id), timeout=120).checkpoint
        assert exported(stub, after.checkpoint_id) == captured(root)
    assert metric(server, abandoned("create", "deadline_exceeded")) == 0
    assert "abandoned" not in server.log()
    # The call is recorded as its caller saw it end, though its capture went on.
    assert metric(server, handled("CreateCheckpoint", "DEADLINE_EXCEEDED")) == 1
    assert re.search(r"CreateCheckpoint DEADLINE_EXCEEDED \S+ms", server.log()), server.log()
    server.stop()
    assert_fsck_clean(server)


def test_a_rollback_cancelled_during_its_safety_capture_changes_nothing_and_its_retry_restores(idle_server,
                                                                                             tmp_path):
    """The caller cancels a rollback while its safety capture scans: the server stops it, records
    no safety checkpoint and no journal entry, and the workspace is exactly as it was; the same
    request again rolls back, with a safety checkpoint of the workspace as it was. A live diff
    given up on stops the same way."""
    server = idle_server
    server.extra_args = (*server.extra_args, "--metrics-listen", "127.0.0.1:0")
    server.start()
    root = server.new_workspace()
    _slow_workspace(root)
    plan_id = str(ULID())
    with grpc.insecure_channel(server.tcp_target) as channel:
        stub = pb_grpc.CheckpointServiceStub(channel)
        target = stub.CreateCheckpoint(pb.CreateCheckpointRequest(plan_id=plan_id, workspace_root=str(root)),
                                       timeout=60).checkpoint
    wanted = captured(root)
    server.stop()
    for i in range(0, DIRECTORIES, 3):
        (root / f"d{i:02}" / "notes.txt").write_text(f"edited {i}\n")
    (root / "d05" / "added.txt").write_text("added after the checkpoint\n")
    before = tree_state(root)
    handshake = tmp_path / "faults"
    _start_slow(server, handshake)
    request = pb.RollbackRequest(plan_id=plan_id, checkpoint_id=target.checkpoint_id, request_id=str(ULID()))
    with grpc.insecure_channel(server.tcp_target) as channel:
        stub = pb_grpc.CheckpointServiceStub(channel)
        call = stub.Rollback.future(request, timeout=120)
        threading.Event().wait(GIVE_UP_SECONDS)  # a few directories into the safety capture
        assert call.cancel(), "the rollback ended before it was cancelled"
        _wait_until_stopped(server, handshake, abandoned("rollback", "cancelled"))
        assert server.log().count(f"rollback of plan {plan_id} abandoned") == 1, server.log()
        assert tree_state(root) == before, "a rollback stopped in its safety capture changed nothing"
        assert [c.checkpoint_id for c in list_all(stub, plan_id)] == [target.checkpoint_id]
        assert pending_rollbacks(server) == []

        with pytest.raises(grpc.RpcError) as gave_up:
            stub.DiffCheckpoints(pb.DiffCheckpointsRequest(base_checkpoint_id=target.checkpoint_id),
                                 timeout=GIVE_UP_SECONDS)
        assert gave_up.value.code() is grpc.StatusCode.DEADLINE_EXCEEDED, gave_up.value.details()
        _wait_until_stopped(server, handshake, abandoned("diff", "deadline_exceeded"))
        # Recorded as the caller saw it, not as the transport ended the handler (CANCELLED).
        assert metric(server, handled("DiffCheckpoints", "DEADLINE_EXCEEDED")) == 1
        assert metric(server, handled("DiffCheckpoints", "CANCELLED")) == 0
        assert metric(server, handled("Rollback", "CANCELLED")) == 1

        (handshake / "resume.workspace.read").touch()
        reply = stub.Rollback(request, timeout=120)
        ignored = {path: value for path, value in before.items() if path.endswith(".log")}
        assert tree_state(root) == {**wanted, **ignored}
        assert exported(stub, reply.safety_checkpoint.checkpoint_id) == {
            path: value for path, value in before.items() if not path.endswith(".log")}
        assert stub.Rollback(request, timeout=120).safety_checkpoint.checkpoint_id == \
            reply.safety_checkpoint.checkpoint_id
    assert pending_rollbacks(server) == []
    server.stop()
    assert_fsck_clean(server)


@pytest.mark.parametrize("point", ["rollback.safety_committed", "restore.change"])
def test_a_rollback_cancelled_once_its_safety_checkpoint_is_committed_runs_to_its_end(idle_server, tmp_path, point):
    """Cancelled once its safety checkpoint and journal entry are committed (before its first
    change, or paused in the middle of its changes): the rollback restores the workspace exactly
    all the same, drops its journal entry, and is not counted as abandoned; its request_id
    answers with the same safety checkpoint."""
    server = idle_server
    server.extra_args = (*server.extra_args, "--metrics-listen", "127.0.0.1:0")
    handshake = tmp_path / "faults"
    handshake.mkdir()
    start_with_faults(server, CHECKPOINTD_PAUSE_AT=f"{point}:1", CHECKPOINTD_FAULT_DIR=str(handshake))
    root = server.new_workspace()
    for i in range(6):
        (root / f"f{i}.txt").write_text(f"first {i}\n")
    plan_id = str(ULID())
    with grpc.insecure_channel(server.tcp_target) as channel:
        stub = pb_grpc.CheckpointServiceStub(channel)
        target = stub.CreateCheckpoint(pb.CreateCheckpointRequest(plan_id=plan_id, workspace_root=str(root)),
                                       timeout=60).checkpoint
        wanted = tree_state(root)
        for i in range(6):
            (root / f"f{i}.txt").write_text(f"second {i}\n")
        (root / "extra.txt").write_text("not in the target\n")
        before = tree_state(root)
        request = pb.RollbackRequest(plan_id=plan_id, checkpoint_id=target.checkpoint_id, request_id=str(ULID()))
        call = stub.Rollback.future(request, timeout=120)
        paused = handshake / f"paused.{point}"
        wait_until(lambda: paused.exists() or call.done(), "the rollback paused or ended", server, WAIT_SECONDS)
        assert paused.exists(), f"the rollback never paused: {call.exception() if call.done() else server.log()}"
        assert call.cancel(), "the rollback ended before it was cancelled"
        _wait_until_given_up(server, "Rollback")  # before the rollback goes on
        (handshake / f"resume.{point}").touch()
        wait_until(lambda: not pending_rollbacks(server) and tree_state(root) == wanted,
                   "the rollback past its commit point ran to its end", server, WAIT_SECONDS)
        assert tree_state(root) == wanted, "a rollback past its commit point runs to its end"
        assert pending_rollbacks(server) == []
        replayed = stub.Rollback(request, timeout=60)
        [_, safety] = list_all(stub, plan_id)
        assert replayed.safety_checkpoint.checkpoint_id == safety.checkpoint_id
        assert exported(stub, safety.checkpoint_id) == before
        assert tree_state(root) == wanted
    assert metric(server, abandoned("rollback", "cancelled")) == 0
    assert "abandoned" not in server.log()
    server.stop()
    assert_fsck_clean(server)
