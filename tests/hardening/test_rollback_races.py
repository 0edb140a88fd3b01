"""A rollback meets a workspace it does not control: a tool writes while the rollback is being
applied, or a path cannot be read or written. Nothing may be lost either way: a path whose
state differs from what the rollback's safety capture saw is never overwritten or deleted, the
rollback stops with a clear status, what it had already changed is taken back, and the
racing content stays where its writer put it.

Each race is made deterministic with CHECKPOINTD_PAUSE_AT=restore.change:N (the server stops
before its Nth workspace change until the test says resume)."""

from __future__ import annotations

import os
import threading
from collections.abc import Callable
from pathlib import Path

import grpc
import pytest
from ulid import ULID

from checkpoint.v1 import checkpoint_service_pb2 as pb
from checkpoint.v1 import checkpoint_service_pb2_grpc as pb_grpc
from tests.hardening.support import assert_fsck_clean, start_with_faults
from tests.helpers import error_info, tree_state

#: Files the rollback rewrites, in the order it rewrites them (a diff lists names sorted).
NAMES = ("a.txt", "b.txt", "c.txt", "d.txt")


def write(path: Path, content: bytes) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(content)


def run_paused(handshake: Path, point: str, call: Callable[[], object], meanwhile: Callable[[], None]) -> dict:
    """Runs ``call`` until the server pauses at ``point``, runs ``meanwhile``, resumes; returns
    {"reply": ...} or {"error": RpcError}."""
    outcome: dict[str, object] = {}

    def run() -> None:
        try:
            outcome["reply"] = call()
        except grpc.RpcError as error:
            outcome["error"] = error

    worker = threading.Thread(target=run)
    worker.start()
    paused = handshake / f"paused.{point}"
    while not paused.exists() and worker.is_alive():
        worker.join(timeout=0.01)
    assert paused.exists(), f"the call never paused at {point}: {outcome}"
    meanwhile()
    (handshake / f"resume.{point}").touch()
    worker.join(timeout=120)
    assert not worker.is_alive()
    return outcome


@pytest.fixture
def paused_at_second_change(idle_server, tmp_path):
    """A server that pauses its first rollback before the rollback's second workspace change."""
    handshake = tmp_path / "faults"
    handshake.mkdir()
    start_with_faults(idle_server, CHECKPOINTD_PAUSE_AT="restore.change:2", CHECKPOINTD_FAULT_DIR=str(handshake))
    with grpc.insecure_channel(idle_server.tcp_target) as channel:
        yield idle_server, handshake, pb_grpc.CheckpointServiceStub(channel)


def _same_size_same_mtime(path: Path) -> None:
    """Rewrites the file with other bytes of the same length and puts its mtime back: only its
    ctime tells (a check on size and mtime alone would overwrite it)."""
    before = path.stat()
    write(path, bytes(reversed(path.read_bytes())).upper())
    os.utime(path, ns=(before.st_atime_ns, before.st_mtime_ns))
    assert path.stat().st_size == before.st_size and path.stat().st_mtime_ns == before.st_mtime_ns


#: How a tool races the rollback: files checkpointed besides NAMES, files changed since (None:
#: deleted), the path the tool writes while the rollback is paused, and how.
RACES = {
    # The rollback will replace e.txt; the tool rewrites it first.
    "rewrite": ({"e.txt": b"checkpointed e"}, {"e.txt": b"changed since e"}, "e.txt",
                lambda p: write(p, b"written while the rollback ran")),
    # The same, with a rewrite that leaves size and mtime as they were.
    "rewrite-same-size-and-mtime": ({"e.txt": b"checkpointed e"}, {"e.txt": b"changed since e"}, "e.txt",
                                    _same_size_same_mtime),
    # The rollback will delete d.new and e.new (the checkpoint lacks them), in that order; the
    # tool rewrites e.new first.
    "rewrite-a-file-the-rollback-deletes": ({}, {"d.new": b"new since", "e.new": b"new since"}, "e.new",
                                            lambda p: write(p, b"written while the rollback ran")),
    # The rollback will replace e.log, which a .gitignore written since leaves out: the safety
    # capture reads it on its own (no stat identity of it is recorded), and the tool rewrites it with
    # as many bytes, its mtime put back: only its content tells.
    "rewrite-a-file-ignored-now": ({"e.log": b"checkpointed e"},
                                   {"e.log": b"changed since e", ".gitignore": b"*.log\n"}, "e.log",
                                   _same_size_same_mtime),
    # The rollback will create e.txt (the checkpoint has it); the tool creates it first.
    "create-a-file-the-rollback-creates": ({"e.txt": b"checkpointed e"}, {"e.txt": None}, "e.txt",
                                           lambda p: write(p, b"created while the rollback ran")),
}


@pytest.mark.parametrize("race", sorted(RACES))
def test_a_write_racing_a_rollback_is_kept_and_the_rollback_refused(paused_at_second_change, race) -> None:
    server, handshake, stub = paused_at_second_change
    checkpointed, changed, raced, racing_write = RACES[race]
    workspace = server.new_workspace()
    plan_id = str(ULID())
    for name in NAMES:
        write(workspace / name, f"checkpointed {name}".encode())
    for name, content in checkpointed.items():
        write(workspace / name, content)
    target = stub.CreateCheckpoint(pb.CreateCheckpointRequest(plan_id=plan_id, workspace_root=str(workspace)),
                                   timeout=60).checkpoint
    acknowledged = {target.checkpoint_id: tree_state(workspace)}
    for name in NAMES:
        write(workspace / name, f"changed since {name}".encode())
    for name, content in changed.items():
        if content is None:
            (workspace / name).unlink()
        else:
            write(workspace / name, content)
    before_rollback = tree_state(workspace)
    racing: dict[str, object] = {}

    def race_the_rollback() -> None:
        state = tree_state(workspace)
        reached = [n for n in sorted(state.keys() | before_rollback.keys()) if state.get(n) != before_rollback.get(n)]
        assert len(reached) == 1 and reached != [raced], f"paused before its second change, it changed {reached}"
        racing_write(workspace / raced)
        racing[raced] = tree_state(workspace)[raced]

    outcome = run_paused(handshake, "restore.change", lambda: stub.Rollback(pb.RollbackRequest(
        plan_id=plan_id, checkpoint_id=target.checkpoint_id, request_id=str(ULID())), timeout=120),
        race_the_rollback)

    error = outcome.get("error")
    assert error is not None, "a rollback that would overwrite a concurrent write must not succeed"
    assert error.code() == grpc.StatusCode.FAILED_PRECONDITION, error
    info = error_info(error)
    assert info.reason == "ROLLBACK_CONFLICT" and info.metadata["path"] == raced, (info, error.details())
    # The racing write is where its writer put it; what the rollback had changed is taken back.
    after = tree_state(workspace)
    assert after.get(raced) == racing[raced], "the concurrent write was overwritten or deleted"
    assert after == {**before_rollback, raced: racing[raced]}
    # Every acknowledged checkpoint still restores exactly.
    for checkpoint_id, content in acknowledged.items():
        stub.Rollback(pb.RollbackRequest(plan_id=plan_id, checkpoint_id=checkpoint_id), timeout=120)
        assert tree_state(workspace) == content
    server.stop()
    assert_fsck_clean(server)


# -- paths the server may not read or write ---------------------------------------------------------
#
# Tests run as root, and root reads and writes whatever the permission bits say (CAP_DAC_OVERRIDE).
# The server deployed runs as an ordinary user (uid 10001 in the image), and so do agents: for them a
# directory of mode 000 is closed. The server here runs as root without CAP_DAC_OVERRIDE and
# CAP_DAC_READ_SEARCH (setpriv drops them from its bounding and inheritable sets), so the permission
# bits of the files it owns apply to it exactly as they apply to an ordinary owner.

NO_DAC_OVERRIDE = ("setpriv", "--bounding-set=-dac_override,-dac_read_search",
                   "--inh-caps=-dac_override,-dac_read_search")


@pytest.fixture
def owner_bound_server(idle_server):
    plain = type(idle_server).command
    idle_server.command = lambda: [*NO_DAC_OVERRIDE, *plain(idle_server)]
    try:
        idle_server.start()
    finally:
        del idle_server.command
    with grpc.insecure_channel(idle_server.tcp_target) as channel:
        yield idle_server, pb_grpc.CheckpointServiceStub(channel)


def _closed_directory(workspace: Path) -> tuple[Path, str]:
    """A directory the rollback must enter (a file in it changed) is closed: mode 000."""
    (workspace / "d" / "x.txt").write_text("changed since")
    os.chmod(workspace / "d", 0)
    return workspace / "d", "d"


def _untraversable_directory(workspace: Path) -> tuple[Path, str]:
    """The same directory may be listed but not entered: mode 0400."""
    (workspace / "d" / "x.txt").write_text("changed since")
    os.chmod(workspace / "d", 0o400)
    return workspace / "d", "d"


def _unreadable_file(workspace: Path) -> tuple[Path, str]:
    """A file the rollback must replace changed since, and cannot be read: mode 000."""
    (workspace / "d" / "y.txt").write_text("changed since, unreadable")
    os.chmod(workspace / "d" / "y.txt", 0)
    return workspace / "d" / "y.txt", "d/y.txt"


@pytest.mark.parametrize("close", [_closed_directory, _untraversable_directory, _unreadable_file],
                         ids=["directory-000", "directory-400", "file-000"])
def test_a_path_the_server_may_not_read_is_a_clear_conflict_and_loses_nothing(owner_bound_server, close) -> None:
    server, stub = owner_bound_server
    workspace = server.new_workspace()
    plan_id = str(ULID())
    for name in ("d/x.txt", "d/y.txt", "top.txt"):
        write(workspace / name, b"checkpointed " + name.encode())
    target = stub.CreateCheckpoint(pb.CreateCheckpointRequest(plan_id=plan_id, workspace_root=str(workspace)),
                                   timeout=60).checkpoint
    checkpointed = tree_state(workspace)
    write(workspace / "top.txt", b"changed since")
    closed, reported = close(workspace)
    refused_on = tree_state(workspace)  # the test reads as root: mode 000 does not stop it
    with pytest.raises(grpc.RpcError) as caught:
        stub.Rollback(pb.RollbackRequest(plan_id=plan_id, checkpoint_id=target.checkpoint_id), timeout=120)
    error = caught.value
    assert error.code() == grpc.StatusCode.FAILED_PRECONDITION, (error.code(), error.details(), server.log())
    info = error_info(error)
    assert info.reason == "ROLLBACK_CONFLICT" and info.metadata["path"].startswith(reported), (info, error.details())
    assert "ermission denied" in error.details()
    assert tree_state(workspace) == refused_on, "nothing may change when the rollback is refused"
    # Once the path is open again, the same rollback goes through, and it can be taken back.
    os.chmod(closed, 0o755 if closed.is_dir() else 0o644)
    before = tree_state(workspace)
    reply = stub.Rollback(pb.RollbackRequest(plan_id=plan_id, checkpoint_id=target.checkpoint_id), timeout=120)
    assert tree_state(workspace) == checkpointed
    stub.Rollback(pb.RollbackRequest(plan_id=plan_id, checkpoint_id=reply.safety_checkpoint.checkpoint_id),
                  timeout=120)
    assert tree_state(workspace) == before
