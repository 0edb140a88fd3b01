"""Attacks on cooperative cancellation (a Rollback or live DiffCheckpoints whose caller gives up
stops its capture before its commit point; a CreateCheckpoint runs to its end).

Every race is made deterministic with the server's PAUSE fault on ``workspace.read`` (one .gitignore
read per directory of the workspaces below): the Nth read since the server started pauses the
capture in the middle of its workspace, the test gives up on the call (or stops or kills the
server), waits until the server has ended the call's handler, then lets the capture go on, which
must stop at its next check. What is asserted is what the server does and says: the rows, the
rollback journal, the workspace, the checkpoints' exported content against the files on disk,
its log, its counters and fsck; never how fast.

Defects these tests found (fixed):

- ``..._has_its_safety_checkpoint_durable`` and ``..._live_diff_given_up_on_and_a_crash_has_its_objects_durable``:
  the objects an abandoned capture appended to the packs (never synced: its batch aborted) were
  indexed as stored, and taken as durable, by the next start (``pack_replay._recover`` verified the
  records past a pack's durable length and set ``pack.durable`` to their end without a sync). The
  next capture reused them without writing or syncing them, and a checkpoint (a rollback's safety
  checkpoint: the only copy of the files it replaces) was acknowledged with objects no sync covered.
  Now the pack is synced on open, then its hint moved.
- CALL_ABANDONED's reference (errors.proto, API.md) said a CreateCheckpoint's capture is stopped; it is not.
"""

from __future__ import annotations

import signal
import tempfile
import threading
from pathlib import Path

import grpc
import pytest
from ulid import ULID

from checkpoint.v1 import checkpoint_service_pb2 as pb
from checkpoint.v1 import checkpoint_service_pb2_grpc as pb_grpc
from checkpointd.core.store.packs import PACK_HEADER
from tests.conftest import RunningServer
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

#: Directories of the workspaces, each with a .gitignore: one read (a fault point) each.
DIRECTORIES = 12
#: The read a capture pauses at: the capture has read the first PAUSE_AT - 1 directories whole.
PAUSE_AT = 4


def _populate(root: Path) -> None:
    for i in range(DIRECTORIES):
        directory = root / f"d{i:02}"
        directory.mkdir()
        (directory / ".gitignore").write_text("*.log\n")
        (directory / "notes.txt").write_text(f"notes {i}\n")
        (directory / "skipped.log").write_text("ignored\n")
        for j in range(3):
            (directory / f"f{j}.bin").write_bytes(bytes([i, j]) * (100 + 50 * j))
    (root / "big.bin").write_bytes(bytes(range(256)) * (12 * 1024))  # 3 MiB: read in chunks


class Faults:
    """The handshake directory of a server's PAUSE faults."""

    def __init__(self, base: Path) -> None:
        self.dir = base
        self.dir.mkdir(exist_ok=True)

    def paused(self, point: str) -> bool:
        return (self.dir / f"paused.{point}").exists()

    def wait_paused(self, point: str, server, call=None) -> None:
        wait_until(lambda: self.paused(point) or (call is not None and call.done()), f"a pause at {point}", server)
        assert self.paused(point), f"the call ended before it paused at {point}: {call.exception()}"

    def resume(self, point: str) -> None:
        (self.dir / f"resume.{point}").touch()


def _start(server: RunningServer, faults: Faults, **variables: str) -> None:
    if "--metrics-listen" not in server.extra_args:
        server.extra_args = (*server.extra_args, "--metrics-listen", "127.0.0.1:0")
    start_with_faults(server, CHECKPOINTD_FAULT_DIR=str(faults.dir), **variables)


def _full_log(server: RunningServer) -> str:
    return server.log_path.read_text(errors="replace")


def _retried_after_a_restart_restores(server: RunningServer, faults: Faults, root: Path, request: pb.RollbackRequest,
                                      wanted: dict, before: dict) -> None:
    """The server started again: the rollback given up on recorded nothing (its target is the
    plan's only checkpoint), and ``request`` retried restores ``root`` to ``wanted`` exactly, its
    safety checkpoint holding ``before`` less the ignored files; the log is sane and fsck clean."""
    _start(server, faults)
    with grpc.insecure_channel(server.tcp_target) as channel:
        stub = pb_grpc.CheckpointServiceStub(channel)
        assert [c.checkpoint_id for c in list_all(stub, request.plan_id)] == [request.checkpoint_id]
        reply = stub.Rollback(request, timeout=120)
        assert captured(root) == wanted
        assert exported(stub, reply.safety_checkpoint.checkpoint_id) == {
            p: v for p, v in before.items() if not p.endswith(".log")}
    server.stop()
    _assert_log_sane(server)
    assert_fsck_clean(server)


def _assert_log_sane(server: RunningServer) -> None:
    """A call given up on never surfaces as an unexpected error."""
    log = _full_log(server)
    for bad in ("Traceback", "unexpected error", "INTERNAL", "UNKNOWN", "never retrieved"):
        assert bad not in log, f"{bad!r} in the server log:\n{log[-6000:]}"


def _seed(server: RunningServer) -> tuple[Path, str, pb.Checkpoint]:
    """A workspace and a plan with one checkpoint of it, taken by ``server`` (running; no fault it
    has armed fires during that create)."""
    root = server.new_workspace()
    _populate(root)
    plan_id = str(ULID())
    with grpc.insecure_channel(server.tcp_target) as channel:
        stub = pb_grpc.CheckpointServiceStub(channel)
        target = stub.CreateCheckpoint(pb.CreateCheckpointRequest(plan_id=plan_id, workspace_root=str(root)),
                                       timeout=60).checkpoint
    return root, plan_id, target


def _edit(root: Path, tag: str) -> None:
    for i in range(0, DIRECTORIES, 2):
        (root / f"d{i:02}" / "notes.txt").write_text(f"{tag} {i}\n")
    (root / "d01" / f"added-{tag}.txt").write_text(f"added {tag}\n")
    (root / "d03" / "f1.bin").unlink(missing_ok=True)


def test_a_rollback_given_up_with_a_create_queued_and_writes_racing_its_capture(idle_server, tmp_path):
    """The caller gives up on a rollback paused in its safety capture while files change both where
    the capture has been and where it has not, and a create of the same plan waits for the plan:
    the rollback stops, counted and logged once, records nothing and changes nothing; the create
    then runs and its checkpoint holds exactly the files on disk (what the abandoned capture had
    taken from the watcher is not lost, whatever it had read is not built on); so do the next
    create's and a full rollback's."""
    server = idle_server
    faults = Faults(tmp_path / "faults")
    _start(server, faults)
    root, plan_id, target = _seed(server)
    wanted = captured(root)
    server.stop()
    _edit(root, "before")
    _start(server, faults, CHECKPOINTD_PAUSE_AT=f"workspace.read:{PAUSE_AT}")
    with grpc.insecure_channel(server.tcp_target) as channel:
        stub = pb_grpc.CheckpointServiceStub(channel)
        rollback = pb.RollbackRequest(plan_id=plan_id, checkpoint_id=target.checkpoint_id, request_id=str(ULID()))
        call = stub.Rollback.future(rollback, timeout=120)
        faults.wait_paused("workspace.read", server, call)
        # Written while the capture is paused: in a directory it read whole, in the one it is in, in
        # one it has not reached, and a new directory.
        (root / "d00" / "notes.txt").write_text("written during the abandoned capture\n")
        (root / f"d{PAUSE_AT - 1:02}" / "f0.bin").write_bytes(b"changed in the paused directory")
        (root / "d10" / "notes.txt").write_text("written ahead of the abandoned capture\n")
        (root / "fresh").mkdir()
        (root / "fresh" / "x.txt").write_text("a new directory\n")
        queued = stub.CreateCheckpoint.future(pb.CreateCheckpointRequest(plan_id=plan_id, description="queued"),
                                              timeout=120)
        assert call.cancel(), "the rollback ended before it was given up on"
        wait_until(lambda: metric(server, handled("Rollback", "CANCELLED")) >= 1, "the handler ended", server)
        before = tree_state(root)
        faults.resume("workspace.read")
        created = queued.result().checkpoint
        wait_until(lambda: metric(server, abandoned("rollback", "cancelled")) >= 1, "the rollback counted", server)
        assert _full_log(server).count(f"rollback of plan {plan_id} abandoned") == 1
        assert tree_state(root) == before, "a rollback given up on in its capture changes no file"
        assert pending_rollbacks(server) == []
        assert [c.checkpoint_id for c in list_all(stub, plan_id)] == [target.checkpoint_id, created.checkpoint_id]
        assert exported(stub, created.checkpoint_id) == captured(root)

        _edit(root, "after")
        (root / "fresh" / "x.txt").write_text("changed after\n")
        after = stub.CreateCheckpoint(pb.CreateCheckpointRequest(plan_id=plan_id), timeout=120).checkpoint
        assert exported(stub, after.checkpoint_id) == captured(root)

        current = captured(root)
        reply = stub.Rollback(rollback, timeout=120)
        assert captured(root) == wanted
        assert exported(stub, reply.safety_checkpoint.checkpoint_id) == current
    assert pending_rollbacks(server) == []
    server.stop()
    _assert_log_sane(server)
    assert_fsck_clean(server)


def test_a_live_diff_given_up_on_poisons_nothing_the_next_capture_builds_on(idle_server, tmp_path):
    """A live diff's deadline passes while its look is paused, having hashed (never stored) the new
    contents of the directories it read; those files change again meanwhile. Nothing of the look
    reaches the stat index or the capturer's base: the next create stores every new content and
    reads back exactly the files on disk, a diff of it against the live workspace is empty, and a
    diff that is let finish lists exactly what changed."""
    server = idle_server
    faults = Faults(tmp_path / "faults")
    _start(server, faults)
    root, plan_id, target = _seed(server)
    server.stop()
    _edit(root, "looked-at")
    (root / "d00" / "large.bin").write_bytes(b"L" * (3 << 20))  # hashed in chunks by the look
    _start(server, faults, CHECKPOINTD_PAUSE_AT=f"workspace.read:{PAUSE_AT}")
    with grpc.insecure_channel(server.tcp_target) as channel:
        stub = pb_grpc.CheckpointServiceStub(channel)
        call = stub.DiffCheckpoints.future(pb.DiffCheckpointsRequest(base_checkpoint_id=target.checkpoint_id),
                                           timeout=2.0)
        faults.wait_paused("workspace.read", server, call)
        assert call.exception(timeout=30).code() is grpc.StatusCode.DEADLINE_EXCEEDED
        wait_until(lambda: metric(server, handled("DiffCheckpoints", "DEADLINE_EXCEEDED")) >= 1,
              "the handler ended", server)
        (root / "d00" / "notes.txt").write_text("x" * len("looked-at 0\n"))  # same size, new content
        (root / "d02" / "notes.txt").write_text("changed after the look\n")
        faults.resume("workspace.read")
        wait_until(lambda: metric(server, abandoned("diff", "deadline_exceeded")) >= 1, "the diff counted", server)
        created = stub.CreateCheckpoint(pb.CreateCheckpointRequest(plan_id=plan_id), timeout=120).checkpoint
        assert exported(stub, created.checkpoint_id) == captured(root)
        live = stub.DiffCheckpoints(pb.DiffCheckpointsRequest(base_checkpoint_id=created.checkpoint_id),
                                    timeout=120)
        assert list(live.changes) == []
        listed = stub.DiffCheckpoints(pb.DiffCheckpointsRequest(base_checkpoint_id=target.checkpoint_id),
                                      timeout=120)
        between = stub.DiffCheckpoints(pb.DiffCheckpointsRequest(base_checkpoint_id=target.checkpoint_id,
                                                                 target_checkpoint_id=created.checkpoint_id),
                                       timeout=120)
        assert [c.path for c in listed.changes] == [c.path for c in between.changes] != []
        assert [c.checkpoint_id for c in list_all(stub, plan_id)] == [target.checkpoint_id, created.checkpoint_id]
    server.stop()
    _assert_log_sane(server)
    assert_fsck_clean(server)


def test_a_rollback_given_up_on_right_after_its_last_check_runs_to_its_end(idle_server, tmp_path):
    """Given up on at ``rollback.planned``: its last check has passed and its safety checkpoint's
    objects are durable, no row yet. It is past its commit point: it records its safety checkpoint,
    restores exactly, leaves no journal entry, is not counted as abandoned, and its request_id
    answers with the same safety checkpoint."""
    server = idle_server
    faults = Faults(tmp_path / "faults")
    _start(server, faults, CHECKPOINTD_PAUSE_AT="rollback.planned:1")
    root, plan_id, target = _seed(server)
    wanted = captured(root)
    _edit(root, "second")
    before = captured(root)
    with grpc.insecure_channel(server.tcp_target) as channel:
        stub = pb_grpc.CheckpointServiceStub(channel)
        request = pb.RollbackRequest(plan_id=plan_id, checkpoint_id=target.checkpoint_id, request_id=str(ULID()))
        call = stub.Rollback.future(request, timeout=120)
        faults.wait_paused("rollback.planned", server, call)
        assert call.cancel()
        wait_until(lambda: metric(server, handled("Rollback", "CANCELLED")) >= 1, "the handler ended", server)
        faults.resume("rollback.planned")
        wait_until(lambda: captured(root) == wanted and not pending_rollbacks(server), "the restore", server)
        [_, safety] = list_all(stub, plan_id)
        assert exported(stub, safety.checkpoint_id) == before
        assert stub.Rollback(request, timeout=60).safety_checkpoint.checkpoint_id == safety.checkpoint_id
        assert captured(root) == wanted
    assert metric(server, abandoned("rollback", "cancelled")) == 0
    assert "abandoned" not in _full_log(server)
    server.stop()
    _assert_log_sane(server)
    assert_fsck_clean(server)


def test_a_rollback_given_up_on_while_it_waits_for_its_plan_never_happens_later(idle_server, tmp_path):
    """A create holds the plan (paused after its capture); a rollback of the plan waits for it and
    its caller gives up. Once the create ends, the rollback must not run: no safety checkpoint, no
    file changed, no journal entry, and the next rollback restores exactly."""
    server = idle_server
    faults = Faults(tmp_path / "faults")
    _start(server, faults, CHECKPOINTD_PAUSE_AT="create.captured:2")
    root, plan_id, target = _seed(server)
    wanted = captured(root)
    _edit(root, "second")
    with grpc.insecure_channel(server.tcp_target) as channel:
        stub = pb_grpc.CheckpointServiceStub(channel)
        holding = stub.CreateCheckpoint.future(pb.CreateCheckpointRequest(plan_id=plan_id, description="holds"),
                                               timeout=120)
        faults.wait_paused("create.captured", server, holding)
        request = pb.RollbackRequest(plan_id=plan_id, checkpoint_id=target.checkpoint_id, request_id=str(ULID()))
        with pytest.raises(grpc.RpcError) as gave_up:
            stub.Rollback(request, timeout=1.0)
        assert gave_up.value.code() is grpc.StatusCode.DEADLINE_EXCEEDED
        wait_until(lambda: metric(server, handled("Rollback", "DEADLINE_EXCEEDED")) >= 1, "the handler ended", server)
        before = tree_state(root)
        faults.resume("create.captured")
        held = holding.result().checkpoint
        # Whatever the plan's next call is, it comes after the rollback given up on, if that ran.
        later = stub.CreateCheckpoint(pb.CreateCheckpointRequest(plan_id=plan_id), timeout=120).checkpoint
        assert tree_state(root) == before
        assert [c.checkpoint_id for c in list_all(stub, plan_id)] == [target.checkpoint_id, held.checkpoint_id,
                                                                      later.checkpoint_id]
        assert pending_rollbacks(server) == []
        reply = stub.Rollback(request, timeout=120)
        assert captured(root) == wanted
        assert exported(stub, reply.safety_checkpoint.checkpoint_id) == exported(stub, later.checkpoint_id)
    server.stop()
    _assert_log_sane(server)
    assert_fsck_clean(server)


def test_a_server_stopped_during_a_rollbacks_capture_stops_it_and_restarts_clean(idle_server, tmp_path):
    """SIGTERM while a rollback's safety capture is paused: the grace period ends, the call is cut
    off (UNAVAILABLE, SHUTTING_DOWN), its capture stops at its next check, the server exits; once
    restarted, nothing was recorded and no file changed, and the rollback retried restores exactly."""
    server = idle_server
    faults = Faults(tmp_path / "faults")
    _start(server, faults)
    root, plan_id, target = _seed(server)
    wanted = captured(root)
    server.stop()
    _edit(root, "second")
    before = tree_state(root)
    _start(server, faults, CHECKPOINTD_PAUSE_AT=f"workspace.read:{PAUSE_AT}")
    request = pb.RollbackRequest(plan_id=plan_id, checkpoint_id=target.checkpoint_id, request_id=str(ULID()))
    with grpc.insecure_channel(server.tcp_target) as channel:
        stub = pb_grpc.CheckpointServiceStub(channel)
        call = stub.Rollback.future(request, timeout=120)
        faults.wait_paused("workspace.read", server, call)
        server.process.send_signal(signal.SIGTERM)
        error = call.exception(timeout=60)
        assert error is not None and error.code() is grpc.StatusCode.UNAVAILABLE, error
        faults.resume("workspace.read")
        assert server.process.wait(timeout=60) == 0, server.log()
        server.process = None
    assert _full_log(server).count(f"rollback of plan {plan_id} abandoned") == 1, server.log()
    assert tree_state(root) == before
    assert pending_rollbacks(server) == []
    _retried_after_a_restart_restores(server, faults, root, request, wanted, before)


def test_a_server_killed_right_after_a_rollback_was_abandoned_recovers_clean(idle_server, tmp_path):
    """kill -9 right after a rollback given up on stopped (counted): the restarted server finds no
    journal entry and no safety checkpoint, fsck finds nothing staged or unreferenced that matters,
    and the rollback retried with the same request_id restores exactly."""
    server = idle_server
    faults = Faults(tmp_path / "faults")
    _start(server, faults)
    root, plan_id, target = _seed(server)
    wanted = captured(root)
    server.stop()
    _edit(root, "second")
    (root / "d00" / "large.bin").write_bytes(b"K" * (3 << 20))  # staged, then dropped
    before = tree_state(root)
    _start(server, faults, CHECKPOINTD_PAUSE_AT=f"workspace.read:{PAUSE_AT}")
    request = pb.RollbackRequest(plan_id=plan_id, checkpoint_id=target.checkpoint_id, request_id=str(ULID()))
    with grpc.insecure_channel(server.tcp_target) as channel:
        stub = pb_grpc.CheckpointServiceStub(channel)
        call = stub.Rollback.future(request, timeout=120)
        faults.wait_paused("workspace.read", server, call)
        assert call.cancel()
        wait_until(lambda: metric(server, handled("Rollback", "CANCELLED")) >= 1, "the handler ended", server)
        faults.resume("workspace.read")
        wait_until(lambda: metric(server, abandoned("rollback", "cancelled")) >= 1, "the rollback counted", server)
    server.kill()
    assert tree_state(root) == before
    assert pending_rollbacks(server) == []
    assert_fsck_clean(server)
    _retried_after_a_restart_restores(server, faults, root, request, wanted, before)


def _packs(server: RunningServer) -> list[Path]:
    return sorted(server.data_dir.rglob("pack-*.pack"))


def _lose_what_no_sync_covered(server: RunningServer) -> list[str]:
    """A power loss, at its worst: every pack loses what no fdatasync made durable, i.e. what lies
    past the durable length its header records (``Pack.sync_to`` writes it right after each sync;
    it is exact here, where no sync races an append). Returns the packs cut."""
    cut = []
    for path in _packs(server):
        with open(path, "r+b") as pack:
            _magic, durable = PACK_HEADER.unpack(pack.read(PACK_HEADER.size))
            size = path.stat().st_size
            if durable < size:
                pack.truncate(durable)
                cut.append(f"{path.name}: {size} -> {durable}")
    return cut


def test_a_rollback_retried_after_an_abandoned_one_and_a_crash_has_its_safety_checkpoint_durable(idle_server,
                                                                                                  tmp_path):
    """The abandoned rollback's capture appended the workspace's new contents to the packs (its
    batch then aborted: never synced) and the server is killed. The restarted server finds those
    records intact (they are in the page cache) and indexes them as stored; the rollback retried
    with the same request_id then reuses them for its safety checkpoint, which is the only record of
    the files the rollback replaces. Before that checkpoint is acknowledged its objects must be
    durable: a power loss right after must lose none of them (simulated by cutting every pack to
    what a sync covered). Packs rotate small here (CHECKPOINTD_PACK_ROTATE_BYTES), as a large
    workspace's capture rotates past the default 256 MiB, so that the retry's own writes go to
    another pack and its sync covers nothing of the abandoned capture's."""
    server = idle_server
    faults = Faults(tmp_path / "faults")
    rotate = {"CHECKPOINTD_PACK_ROTATE_BYTES": "2048"}
    _start(server, faults, **rotate)
    root, plan_id, target = _seed(server)
    wanted = captured(root)
    server.stop()
    for i in range(DIRECTORIES - 1):  # new contents in every directory the capture reads whole
        (root / f"d{i:02}" / "notes.txt").write_text(f"only in the workspace {i}: " + "z" * 300 + "\n")
    before = captured(root)
    # Pauses at the last directory: every other one has been read and its node written.
    _start(server, faults, CHECKPOINTD_PAUSE_AT=f"workspace.read:{DIRECTORIES}", **rotate)
    request = pb.RollbackRequest(plan_id=plan_id, checkpoint_id=target.checkpoint_id, request_id=str(ULID()))
    with grpc.insecure_channel(server.tcp_target) as channel:
        stub = pb_grpc.CheckpointServiceStub(channel)
        call = stub.Rollback.future(request, timeout=120)
        faults.wait_paused("workspace.read", server, call)
        assert call.cancel()
        wait_until(lambda: metric(server, handled("Rollback", "CANCELLED")) >= 1, "the handler ended", server)
        faults.resume("workspace.read")
        wait_until(lambda: metric(server, abandoned("rollback", "cancelled")) >= 1, "the rollback counted", server)
    server.kill()
    _start(server, faults, **rotate)
    with grpc.insecure_channel(server.tcp_target) as channel:
        stub = pb_grpc.CheckpointServiceStub(channel)
        reply = stub.Rollback(request, timeout=120)
        safety = reply.safety_checkpoint.checkpoint_id
        assert captured(root) == wanted
        assert exported(stub, safety) == before
    server.stop()
    cut = _lose_what_no_sync_covered(server)
    _start(server, faults, **rotate)
    with grpc.insecure_channel(server.tcp_target) as channel:
        stub = pb_grpc.CheckpointServiceStub(channel)
        try:
            restored = exported(stub, safety)
        except grpc.RpcError as error:
            raise AssertionError(f"the safety checkpoint lost files to a power loss after it was acknowledged "
                                 f"({error.code().name}: {error.details()}); packs cut: {cut}") from None
        assert restored == before, f"packs cut: {cut}"
    server.stop()
    assert_fsck_clean(server)


def test_a_rollback_given_up_on_while_another_replica_holds_the_plan_never_happens_later(postgres, short_tmp):
    """Two replicas on one PostgreSQL database (--store db). Replica A holds the plan (a create
    paused between its capture and its commit); replica B's rollback of the plan waits for the
    plan's advisory lock in a thread, and its caller gives up. When A lets go, B's rollback takes
    the plan and must stop before doing anything: counted and logged once by B, no safety
    checkpoint, no journal entry, no file changed; the plan's next rollback through B is exact."""
    base = Path(tempfile.mkdtemp(prefix="ac-", dir=short_tmp))
    shared = base / "shared"
    shared.mkdir()
    db_url = postgres.create()
    servers = [RunningServer(Path(tempfile.mkdtemp(prefix="r-", dir=base)), db_url=db_url,
                             extra_args=("--store", "db", "--workspace-root", str(shared))) for _ in range(2)]
    first, second = servers
    faults = Faults(base / "faults")
    try:
        _start(first, faults, CHECKPOINTD_PAUSE_AT="create.captured:2")
        _start(second, faults)
        root = Path(tempfile.mkdtemp(prefix="ws-", dir=shared))
        _populate(root)
        plan_id = str(ULID())
        with grpc.insecure_channel(first.tcp_target) as a, grpc.insecure_channel(second.tcp_target) as b:
            stub_a, stub_b = pb_grpc.CheckpointServiceStub(a), pb_grpc.CheckpointServiceStub(b)
            target = stub_a.CreateCheckpoint(pb.CreateCheckpointRequest(plan_id=plan_id, workspace_root=str(root)),
                                             timeout=60).checkpoint
            wanted = captured(root)
            _edit(root, "second")
            holding = stub_a.CreateCheckpoint.future(pb.CreateCheckpointRequest(plan_id=plan_id), timeout=120)
            faults.wait_paused("create.captured", first, holding)
            request = pb.RollbackRequest(plan_id=plan_id, checkpoint_id=target.checkpoint_id,
                                         request_id=str(ULID()))
            with pytest.raises(grpc.RpcError) as gave_up:
                stub_b.Rollback(request, timeout=1.0)
            assert gave_up.value.code() is grpc.StatusCode.DEADLINE_EXCEEDED
            wait_until(lambda: metric(second, handled("Rollback", "DEADLINE_EXCEEDED")) >= 1, "B ended the handler",
                       second)
            before = tree_state(root)
            faults.resume("create.captured")
            held = holding.result().checkpoint
            wait_until(lambda: metric(second, abandoned("rollback", "deadline_exceeded")) >= 1,
                  "B's rollback counted as abandoned", second)
            assert _full_log(second).count(f"rollback of plan {plan_id} abandoned") == 1
            assert tree_state(root) == before
            assert [c.checkpoint_id for c in list_all(stub_b, plan_id)] == [target.checkpoint_id, held.checkpoint_id]
            assert pending_rollbacks(second) == []
            reply = stub_b.Rollback(request, timeout=120)
            assert captured(root) == wanted
            assert exported(stub_a, reply.safety_checkpoint.checkpoint_id) == exported(stub_a, held.checkpoint_id)
        for server in servers:
            server.stop()
            _assert_log_sane(server)
        assert_fsck_clean(second)
    finally:
        for server in servers:
            server.stop()
        postgres.drop(db_url)


def _open_fds(server: RunningServer) -> int:
    return len(list(Path(f"/proc/{server.process.pid}/fd").iterdir()))


def _children(pid: int) -> list[int]:
    found = []
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            fields = stat.read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue
        if int(fields[1]) == pid:
            found.append(int(stat.parent.name))
    return found


def test_a_rollback_given_up_on_while_reader_processes_read_for_it(idle_server, tmp_path):
    """A capture with over 2,000 files to read hands them to reader processes, whose records the
    server appends to the capture's batch. Given up on then: the capture waits for what it handed
    out, stops, and nothing of it is kept or recorded; the readers serve the next capture, which is
    exact, and fsck is clean."""
    server = idle_server
    faults = Faults(tmp_path / "faults")
    _start(server, faults)
    root, plan_id, target = _seed(server)
    for i in range(DIRECTORIES):
        for j in range(200):
            (root / f"d{i:02}" / f"many{j:03}.txt").write_text(f"first {i} {j}\n")
    with grpc.insecure_channel(server.tcp_target) as channel:
        stub = pb_grpc.CheckpointServiceStub(channel)
        first = stub.CreateCheckpoint(pb.CreateCheckpointRequest(plan_id=plan_id), timeout=120).checkpoint
    server.stop()
    for i in range(DIRECTORIES):
        for j in range(200):
            (root / f"d{i:02}" / f"many{j:03}.txt").write_text(f"second {i} {j}\n")
    before = tree_state(root)
    _start(server, faults, CHECKPOINTD_PAUSE_AT=f"workspace.read:{DIRECTORIES}")
    with grpc.insecure_channel(server.tcp_target) as channel:
        stub = pb_grpc.CheckpointServiceStub(channel)
        request = pb.RollbackRequest(plan_id=plan_id, checkpoint_id=first.checkpoint_id, request_id=str(ULID()))
        call = stub.Rollback.future(request, timeout=120)
        faults.wait_paused("workspace.read", server, call)
        assert _children(server.process.pid), "reader processes read for the capture"
        assert call.cancel()
        wait_until(lambda: metric(server, handled("Rollback", "CANCELLED")) >= 1, "the handler ended", server)
        faults.resume("workspace.read")
        wait_until(lambda: metric(server, abandoned("rollback", "cancelled")) >= 1, "the rollback counted", server)
        assert tree_state(root) == before
        assert [c.checkpoint_id for c in list_all(stub, plan_id)] == [target.checkpoint_id, first.checkpoint_id]
        assert pending_rollbacks(server) == []
        (root / "d11" / "many000.txt").write_text("third\n")
        created = stub.CreateCheckpoint(pb.CreateCheckpointRequest(plan_id=plan_id), timeout=120).checkpoint
        assert exported(stub, created.checkpoint_id) == captured(root)
        current = captured(root)
        reply = stub.Rollback(request, timeout=120)
        assert exported(stub, reply.safety_checkpoint.checkpoint_id) == current
        assert exported(stub, first.checkpoint_id) == captured(root)
    server.stop()
    _assert_log_sane(server)
    assert_fsck_clean(server)


def test_calls_given_up_on_at_random_moments_while_garbage_collection_runs(idle_server, tmp_path):
    """Rollbacks (some dry runs), live diffs and creates given up on at random moments (a deadline, or a cancel
    after a random wait) on a plan whose captures are slow, while garbage collection runs every
    0.1 s and old checkpoints are deleted. After each, the plan's next create waits for whatever
    still runs and must hold exactly the files on disk; a rollback either did nothing or restored
    its target exactly (never half); no journal entry stays; no give-up is ever answered with
    anything but CANCELLED or DEADLINE_EXCEEDED; at the end every kept checkpoint still reads back
    as recorded, the log has no traceback and fsck is clean."""
    import random

    rng = random.Random(20261205)
    server = idle_server
    server.extra_args = (*server.extra_args, "--gc-interval", "0.1")
    faults = Faults(tmp_path / "faults")
    _start(server, faults, CHECKPOINTD_SLOW_AT="workspace.read:0.04")
    root = server.new_workspace()
    _populate(root)
    plan_id = str(ULID())
    recorded: dict[str, dict[str, tuple]] = {}
    with grpc.insecure_channel(server.tcp_target) as channel:
        stub = pb_grpc.CheckpointServiceStub(channel)
        target = stub.CreateCheckpoint(pb.CreateCheckpointRequest(plan_id=plan_id, workspace_root=str(root)),
                                       timeout=60).checkpoint
        recorded[target.checkpoint_id] = wanted = captured(root)
        kept = [target.checkpoint_id]
        fds = []
        for step in range(10):
            fds.append(_open_fds(server))
            _edit(root, f"step{step}")
            fresh = root / f"new{step}"
            fresh.mkdir()
            (fresh / ".gitignore").write_text("*.log\n")
            (fresh / "x.txt").write_text(f"step {step}\n")
            if step % 3 == 2:
                (root / ".gitignore").write_text(f"*.log\n# {step}\n")  # the next capture scans fully
            before = tree_state(root)
            kind = rng.choice(["rollback", "rollback", "dry run", "diff", "create"])
            wait = rng.uniform(0.0, 0.8)
            if kind in ("rollback", "dry run"):
                call = stub.Rollback.future(pb.RollbackRequest(plan_id=plan_id, checkpoint_id=target.checkpoint_id,
                                                               dry_run=kind == "dry run"),
                                            timeout=wait if rng.random() < 0.5 else 60)
            elif kind == "diff":
                call = stub.DiffCheckpoints.future(pb.DiffCheckpointsRequest(base_checkpoint_id=target.checkpoint_id),
                                                   timeout=wait if rng.random() < 0.5 else 60)
            else:
                call = stub.CreateCheckpoint.future(pb.CreateCheckpointRequest(plan_id=plan_id), timeout=wait + 0.01)
            threading.Event().wait(wait)
            call.cancel()
            error = call.exception(timeout=60) if not call.cancelled() else None
            if error is not None:
                assert error.code() in (grpc.StatusCode.CANCELLED, grpc.StatusCode.DEADLINE_EXCEEDED), error
            settled = stub.CreateCheckpoint(pb.CreateCheckpointRequest(plan_id=plan_id), timeout=120).checkpoint
            assert pending_rollbacks(server) == []
            now = captured(root)
            if kind == "rollback" and now == wanted:
                pass  # it went past its commit point and restored its target
            else:
                assert tree_state(root) == before, f"step {step}: a {kind} given up on changed the workspace"
            assert exported(stub, settled.checkpoint_id) == now, f"step {step} ({kind})"
            recorded[settled.checkpoint_id] = now
            kept.append(settled.checkpoint_id)
            if len(kept) > 4:
                doomed = kept.pop(1)
                stub.DeleteCheckpoint(pb.DeleteCheckpointRequest(checkpoint_id=doomed), timeout=60)
                del recorded[doomed]
        listed = {c.checkpoint_id for c in list_all(stub, plan_id)}
        stopped = sum(metric(server, abandoned(operation, cause)) for operation in ("rollback", "diff")
                      for cause in ("cancelled", "deadline_exceeded"))
        assert stopped >= 1, "some call was given up on in the middle of its capture"
        # A capture stopped mid-walk closes every directory it held open.
        assert _open_fds(server) <= max(fds[1:]) + 4, (fds, _open_fds(server))
        for checkpoint_id, files in recorded.items():
            assert checkpoint_id in listed
            assert exported(stub, checkpoint_id) == files
    server.stop()
    _assert_log_sane(server)
    assert_fsck_clean(server)


def test_an_incremental_capture_given_up_on_with_writes_racing_it_leaves_the_next_one_exact(idle_server, tmp_path):
    """The file watcher is on and the plan's last capture is recorded, so the rollback's safety
    capture is incremental: it takes the watcher's changes and examines them one by one (a new
    directory makes it read the .gitignore files again: the pause). Given up on there, while files
    change in directories it has examined, is examining and has not reached: what it had taken is
    handed back, and the plan's next create holds exactly what is on disk, as does the one after."""
    server = idle_server
    faults = Faults(tmp_path / "faults")
    # The seed's full capture reads DIRECTORIES .gitignore files; the rollback's reads 3 more, then pauses.
    _start(server, faults, CHECKPOINTD_PAUSE_AT=f"workspace.read:{DIRECTORIES + 3}")
    root, plan_id, target = _seed(server)
    wanted = captured(root)
    with grpc.insecure_channel(server.tcp_target) as channel:
        stub = pb_grpc.CheckpointServiceStub(channel)
        _edit(root, "watched")
        (root / "fresh").mkdir()
        (root / "fresh" / ".gitignore").write_text("*.tmp\n")
        (root / "fresh" / "x.txt").write_text("a new directory\n")
        before_call = tree_state(root)
        request = pb.RollbackRequest(plan_id=plan_id, checkpoint_id=target.checkpoint_id, request_id=str(ULID()))
        call = stub.Rollback.future(request, timeout=120)
        faults.wait_paused("workspace.read", server, call)
        assert tree_state(root) == before_call
        (root / "d00" / "notes.txt").write_text("written behind the abandoned capture\n")
        (root / "d02" / "f2.bin").write_bytes(b"written where it paused")
        (root / "d10" / "notes.txt").write_text("written ahead of the abandoned capture\n")
        (root / "d11" / "late.txt").write_text("a new file in a directory it had no change for\n")
        (root / "fresh" / "x.txt").unlink()
        assert call.cancel()
        wait_until(lambda: metric(server, handled("Rollback", "CANCELLED")) >= 1, "the handler ended", server)
        faults.resume("workspace.read")
        wait_until(lambda: metric(server, abandoned("rollback", "cancelled")) >= 1, "the rollback counted", server)
        assert [c.checkpoint_id for c in list_all(stub, plan_id)] == [target.checkpoint_id]
        created = stub.CreateCheckpoint(pb.CreateCheckpointRequest(plan_id=plan_id), timeout=120).checkpoint
        assert exported(stub, created.checkpoint_id) == captured(root)
        (root / "d04" / "notes.txt").write_text("after the create\n")
        (root / "fresh" / "y.txt").write_text("after the create\n")
        after = stub.CreateCheckpoint(pb.CreateCheckpointRequest(plan_id=plan_id), timeout=120).checkpoint
        assert exported(stub, after.checkpoint_id) == captured(root)
        reply = stub.Rollback(request, timeout=120)
        assert captured(root) == wanted
        assert exported(stub, reply.safety_checkpoint.checkpoint_id) == exported(stub, after.checkpoint_id)
    server.stop()
    _assert_log_sane(server)
    assert_fsck_clean(server)


def test_a_create_after_a_live_diff_given_up_on_and_a_crash_has_its_objects_durable(idle_server, tmp_path):
    """A live diff's look writes the directory nodes of the workspace as it is (its file contents
    are only hashed) and is dropped, never synced; given up on in its last directory, it has
    written all but the root's. The server is killed and restarted: it indexes those nodes as
    stored. The plan's next create stores the new file contents and reuses the nodes: before the
    create is acknowledged they must be durable, so a power loss right after (every pack cut to
    what a sync covered) must leave the checkpoint readable. Packs rotate small, as in
    ``test_a_rollback_retried_after_an_abandoned_one_and_a_crash_has_its_safety_checkpoint_durable``."""
    server = idle_server
    faults = Faults(tmp_path / "faults")
    rotate = {"CHECKPOINTD_PACK_ROTATE_BYTES": "2048"}
    _start(server, faults, **rotate)
    root, plan_id, target = _seed(server)
    server.stop()
    for i in range(DIRECTORIES - 1):
        for j in range(8):
            (root / f"d{i:02}" / f"new{j}.txt").write_text(f"{i} {j}\n")
    _start(server, faults, CHECKPOINTD_PAUSE_AT=f"workspace.read:{DIRECTORIES}", **rotate)
    with grpc.insecure_channel(server.tcp_target) as channel:
        stub = pb_grpc.CheckpointServiceStub(channel)
        call = stub.DiffCheckpoints.future(pb.DiffCheckpointsRequest(base_checkpoint_id=target.checkpoint_id),
                                           timeout=2.0)
        faults.wait_paused("workspace.read", server, call)
        assert call.exception(timeout=30).code() is grpc.StatusCode.DEADLINE_EXCEEDED
        wait_until(lambda: metric(server, handled("DiffCheckpoints", "DEADLINE_EXCEEDED")) >= 1, "the handler ended",
                   server)
        faults.resume("workspace.read")
        wait_until(lambda: metric(server, abandoned("diff", "deadline_exceeded")) >= 1, "the diff counted", server)
    server.kill()
    _start(server, faults, **rotate)
    with grpc.insecure_channel(server.tcp_target) as channel:
        stub = pb_grpc.CheckpointServiceStub(channel)
        created = stub.CreateCheckpoint(pb.CreateCheckpointRequest(plan_id=plan_id), timeout=120).checkpoint
        assert exported(stub, created.checkpoint_id) == captured(root)
    server.stop()
    cut = _lose_what_no_sync_covered(server)
    _start(server, faults, **rotate)
    with grpc.insecure_channel(server.tcp_target) as channel:
        stub = pb_grpc.CheckpointServiceStub(channel)
        try:
            recorded = exported(stub, created.checkpoint_id)
        except grpc.RpcError as error:
            raise AssertionError(f"the checkpoint lost files to a power loss after it was acknowledged "
                                 f"({error.code().name}: {error.details()}); packs cut: {cut}") from None
        assert recorded == captured(root), f"packs cut: {cut}"
    server.stop()
    assert_fsck_clean(server)
