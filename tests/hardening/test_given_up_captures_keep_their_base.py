"""A watched capture stopped because its caller gave up keeps the base it would have built on (what
it took from the file-event journal goes back to it), unless it had dropped watches to scan a
directory or the workspace again (service/checkpointd/core/capture/capturer.py). Either way, the
next checkpoint must hold the workspace exactly: these tests give up on a rollback in the middle of
its safety capture through a real server, change the workspace in the ways an incremental capture
could miss (a directory renamed, a nested .gitignore edited, a write through a file's other name,
a brand-new directory made while the capture ran and written into after, a directory's mode
changed and put back), and read the next checkpoint back byte for byte. The capture metrics say
whether that checkpoint built on the kept base (incremental) or scanned in full."""

from __future__ import annotations

import os
import threading

import grpc
from ulid import ULID

from checkpoint.v1 import checkpoint_service_pb2 as pb
from checkpoint.v1 import checkpoint_service_pb2_grpc as pb_grpc
from tests.hardening.support import (
    abandoned,
    assert_fsck_clean,
    captured,
    exported,
    list_all,
    metric,
    start_with_faults,
    wait_until,
)
from tests.helpers import tree_state

#: Files a rollback's safety capture finds changed: enough that it is still reading them when its caller gives up.
MANY = 2000
WAIT_SECONDS = 60.0


def _captures(mode: str) -> str:
    return f'checkpointd_capture_seconds_count{{mode="{mode}"}}'


def _give_up_on_rollback(stub, server, plan_id: str, target_id: str, during, after_seconds: float) -> None:
    """A rollback to ``target_id``, cancelled ``after_seconds`` after it was sent (``during`` runs
    meanwhile); returns once the server counted its capture as stopped."""
    stopped = metric(server, abandoned("rollback", "cancelled"))
    call = stub.Rollback.future(pb.RollbackRequest(plan_id=plan_id, checkpoint_id=target_id,
                                                   request_id=str(ULID())), timeout=120)
    during()
    threading.Event().wait(after_seconds)
    assert call.cancel(), "the rollback ended before it was given up on"
    wait_until(lambda: metric(server, abandoned("rollback", "cancelled")) >= stopped + 1,
               "the server counted the rollback's capture as stopped", server, WAIT_SECONDS)


def test_a_rollback_stopped_mid_capture_keeps_its_base_and_the_next_create_misses_nothing(idle_server):
    """The safety capture is stopped while it reads the thousands of files changed since the last
    checkpoint (its base is kept: nothing dropped watches). Made while it ran: a new directory
    with a file. Made after it stopped: that directory written into again (and a subdirectory of
    it), a directory renamed, a nested .gitignore that now ignores a file, a write through one
    name of a file with two, a file deleted and one of the thousands changed back. The next
    create builds on the kept base (incremental) and holds all of it exactly."""
    server = idle_server
    server.extra_args = (*server.extra_args, "--metrics-listen", "127.0.0.1:0")
    server.start()
    root = server.new_workspace()
    for i in range(6):
        (root / f"d{i}").mkdir()
        (root / f"d{i}" / ".gitignore").write_text("*.log\n")
        (root / f"d{i}" / "notes.txt").write_text(f"notes {i}\n")
        (root / f"d{i}" / "skipped.log").write_text("ignored\n")
    (root / "many").mkdir()
    for i in range(MANY):
        (root / "many" / f"f{i:04}.txt").write_text(f"first {i}\n")
    (root / "other").mkdir()
    (root / "d0" / "shared.txt").write_text("one file, two names\n")
    os.link(root / "d0" / "shared.txt", root / "other" / "shared.txt")
    plan_id = str(ULID())
    with grpc.insecure_channel(server.tcp_target) as channel:
        stub = pb_grpc.CheckpointServiceStub(channel)
        target = stub.CreateCheckpoint(pb.CreateCheckpointRequest(plan_id=plan_id, workspace_root=str(root)),
                                       timeout=120).checkpoint
        (root / "d1" / "notes.txt").write_text("a base built incrementally\n")
        stub.CreateCheckpoint(pb.CreateCheckpointRequest(plan_id=plan_id), timeout=120)
        for i in range(MANY):
            (root / "many" / f"f{i:04}.txt").write_text(f"second {i}\n")
        before = tree_state(root)

        def during() -> None:
            # Taken by the capture or not, it sorts after "many": the capture is stopped before
            # it gets there (a new directory would be scanned, its watches dropped first).
            (root / "zfresh").mkdir()
            (root / "zfresh" / "first.txt").write_text("made while the capture ran\n")

        _give_up_on_rollback(stub, server, plan_id, target.checkpoint_id, during, 0.05)
        assert tree_state(root) == {**before, "zfresh": ("dir", 0o755),
                                    "zfresh/first.txt": ("file", b"made while the capture ran\n", 0o644)}
        assert len(list_all(stub, plan_id)) == 2, "a rollback stopped in its safety capture records nothing"

        (root / "zfresh" / "second.txt").write_text("written after the capture stopped\n")
        (root / "zfresh" / "sub").mkdir()
        (root / "zfresh" / "sub" / "deep.txt").write_text("deeper\n")
        os.rename(root / "d2", root / "d2-moved")
        (root / "d2-moved" / "notes.txt").write_text("renamed, then written\n")
        (root / "d3" / ".gitignore").write_text("*.log\nnotes.txt\n")
        with open(root / "other" / "shared.txt", "r+b") as f:  # no event names d0/shared.txt
            f.write(b"ONE")
        (root / "d4" / "notes.txt").unlink()
        (root / "many" / "f0007.txt").write_text("first 7\n")
        incremental, full = metric(server, _captures("incremental")), metric(server, _captures("full"))
        after = stub.CreateCheckpoint(pb.CreateCheckpointRequest(plan_id=plan_id), timeout=120).checkpoint
        assert exported(stub, after.checkpoint_id) == captured(
            root, lambda path: path.endswith(".log") or path == "d3/notes.txt")
        assert (metric(server, _captures("incremental")), metric(server, _captures("full"))) == (
            incremental + 1, full), "the create after the stopped capture built on the base it kept"
    server.stop()
    assert_fsck_clean(server)


def test_a_rollback_stopped_while_it_scans_a_directory_again_leaves_no_base(idle_server, tmp_path):
    """A directory whose read bits changed is scanned again: its watches are dropped and added
    back as the scan walks it (each of its subdirectories' .gitignore reads is slow here). The
    rollback is given up on in the middle of that scan; then the directory's mode is put back (its
    one event says only that its mode changed) and a file is written in a subdirectory the scan
    never reached (no watch, no event). Built on the old base, the next create would look at the
    directory's mode alone and miss the file: it must scan, and hold it."""
    server = idle_server
    server.extra_args = (*server.extra_args, "--metrics-listen", "127.0.0.1:0")
    root = server.new_workspace()
    (root / "top.txt").write_text("top\n")
    for i in range(12):
        directory = root / "tree" / f"s{i:02}"
        directory.mkdir(parents=True)
        (directory / ".gitignore").write_text("*.log\n")
        (directory / "notes.txt").write_text(f"notes {i}\n")
    (root / "other").mkdir()
    (root / "other" / ".gitignore").write_text("*.log\n")
    handshake = tmp_path / "faults"
    handshake.mkdir()
    start_with_faults(server, CHECKPOINTD_SLOW_AT="workspace.read:0.3", CHECKPOINTD_FAULT_DIR=str(handshake))
    plan_id = str(ULID())
    with grpc.insecure_channel(server.tcp_target) as channel:
        stub = pb_grpc.CheckpointServiceStub(channel)
        target = stub.CreateCheckpoint(pb.CreateCheckpointRequest(plan_id=plan_id, workspace_root=str(root)),
                                       timeout=120).checkpoint
        (root / "top.txt").write_text("a base built incrementally\n")
        stub.CreateCheckpoint(pb.CreateCheckpointRequest(plan_id=plan_id), timeout=120)
        os.chmod(root / "tree", 0o700)
        # A nested .gitignore rewritten as it was: the ignore rules are read again, slowly.
        (root / "other" / ".gitignore").write_text("*.log\n")
        before = tree_state(root)
        _give_up_on_rollback(stub, server, plan_id, target.checkpoint_id, lambda: None, 1.2)
        assert tree_state(root) == before
        os.chmod(root / "tree", 0o755)
        (root / "tree" / "s11" / "unseen.txt").write_text("written where no watch was\n")
        (root / "tree" / "s10" / "notes.txt").write_text("edited where no watch was\n")
        after = stub.CreateCheckpoint(pb.CreateCheckpointRequest(plan_id=plan_id), timeout=120).checkpoint
        assert exported(stub, after.checkpoint_id) == captured(root)
    server.stop()
    assert_fsck_clean(server)
