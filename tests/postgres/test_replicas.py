"""Several `checkpointd serve` replicas on one PostgreSQL database, content in the database
(--store db) and no shared data dir: sequences, request_id replays and rollbacks stay correct
when the same plan is driven through different replicas at once."""

from __future__ import annotations

import signal
import subprocess
import tempfile
import threading
import uuid
from collections.abc import Callable
from concurrent import futures
from functools import partial
from pathlib import Path

import grpc
import pytest
from sqlalchemy import create_engine
from sqlalchemy.pool import NullPool
from ulid import ULID

from checkpoint.v1 import checkpoint_service_pb2 as pb
from tests.conftest import RunningServer
from tests.hardening.support import start_with_faults
from tests.helpers import end_other_sessions, error_info, tree_state

pytestmark = pytest.mark.postgres

FILES = 150


def list_all(stub, plan_id: str) -> list[pb.Checkpoint]:
    out: list[pb.Checkpoint] = []
    token = ""
    while True:
        reply = stub.ListCheckpoints(pb.ListCheckpointsRequest(plan_id=plan_id, page_size=50, page_token=token))
        out.extend(reply.checkpoints)
        token = reply.next_page_token
        if not token:
            return out


def in_parallel(*calls: Callable[[], object]) -> list[object]:
    """Runs the calls at the same moment; returns each one's result or the RpcError it raised."""
    barrier = threading.Barrier(len(calls))

    def run(call: Callable[[], object]) -> object:
        barrier.wait()
        try:
            return call()
        except grpc.RpcError as error:
            return error

    with futures.ThreadPoolExecutor(len(calls)) as pool:
        return list(pool.map(run, calls))


def test_concurrent_creates_through_two_replicas_get_unique_gap_free_sequences(two_replicas):
    first, second, group = two_replicas
    workspace = group.workspace()
    for i in range(20):
        (workspace / f"f{i}.txt").write_text(f"file {i}")
    plan_id = _ulid()
    per_thread = 12

    def creator(stub, tag: str) -> Callable[[], list[tuple[pb.Checkpoint, bytes]]]:
        def create() -> list[tuple[pb.Checkpoint, bytes]]:
            made = []
            for n in range(per_thread):
                state = f"{tag}-{n}".encode()
                made.append((stub.CreateCheckpoint(pb.CreateCheckpointRequest(
                    plan_id=plan_id, workspace_root=str(workspace), state=state), timeout=60).checkpoint, state))
            return made

        return create

    results = in_parallel(*(creator(stub, f"{name}{t}") for name, stub in (("a", first), ("b", second))
                            for t in range(3)))
    states = {checkpoint.checkpoint_id: state for batch in results for checkpoint, state in batch}
    created = [checkpoint for batch in results for checkpoint, _ in batch]
    assert len(created) == 6 * per_thread
    assert sorted(c.sequence for c in created) == list(range(1, len(created) + 1))
    assert len({c.checkpoint_id for c in created}) == len(created)

    for stub in (first, second):
        listed = list_all(stub, plan_id)
        assert {(c.checkpoint_id, c.sequence) for c in listed} == {(c.checkpoint_id, c.sequence) for c in created}
    # Content written by one replica is read back through the other: it lives in the database.
    for checkpoint in created[:: per_thread // 2]:
        for stub in (first, second):
            got = stub.GetCheckpoint(pb.GetCheckpointRequest(
                checkpoint_id=checkpoint.checkpoint_id, view=pb.CHECKPOINT_VIEW_FULL)).checkpoint
            assert got.state == states[checkpoint.checkpoint_id]
            assert got.file_count == 20 and got.tree_digest == checkpoint.tree_digest


def test_a_request_id_sent_to_both_replicas_at_once_creates_one_checkpoint(two_replicas):
    first, second, group = two_replicas
    workspace = group.workspace()
    (workspace / "a.txt").write_text("a")
    plan_id = _ulid()
    rounds = 15
    for n in range(rounds):
        request = pb.CreateCheckpointRequest(plan_id=plan_id, workspace_root=str(workspace), state=b"s%d" % n,
                                             request_id=str(uuid.uuid4()))
        replies = in_parallel(lambda r=request: first.CreateCheckpoint(r, timeout=60),
                              lambda r=request: second.CreateCheckpoint(r, timeout=60))
        assert all(isinstance(reply, pb.CreateCheckpointResponse) for reply in replies), replies
        assert replies[0].checkpoint == replies[1].checkpoint
        assert replies[0].checkpoint.sequence == n + 1
        # A later retry through either replica replays the same checkpoint.
        assert second.CreateCheckpoint(request).checkpoint == replies[0].checkpoint
    assert [c.sequence for c in list_all(first, plan_id)] == list(range(rounds, 0, -1))


def test_a_root_recorded_through_one_replica_is_captured_by_the_other_that_knew_the_plan_without(two_replicas):
    """A replica remembers a plan it has seen without a workspace root; a root the other replica
    records afterwards must still reach its next checkpoints (the write checks the plan's row)."""
    first, second, group = two_replicas
    workspace = group.workspace()
    (workspace / "a.txt").write_text("a")
    plan_id = _ulid()
    state_only = first.CreateCheckpoint(pb.CreateCheckpointRequest(plan_id=plan_id, state=b"s1")).checkpoint
    assert state_only.tree_digest == ""
    rooted = second.CreateCheckpoint(pb.CreateCheckpointRequest(plan_id=plan_id, workspace_root=str(workspace),
                                                                state=b"s2")).checkpoint
    assert rooted.file_count == 1
    for n, stub in enumerate((first, first, second)):
        later = stub.CreateCheckpoint(pb.CreateCheckpointRequest(plan_id=plan_id, state=b"s%d" % n)).checkpoint
        assert (later.sequence, later.file_count, later.tree_digest) == (3 + n, 1, rooted.tree_digest)
    assert [c.sequence for c in list_all(first, plan_id)] == [5, 4, 3, 2, 1]


def test_one_request_id_used_for_two_plans_at_once_succeeds_once(two_replicas):
    first, second, group = two_replicas
    rounds = 10
    plans = (_ulid(), _ulid())
    for _ in range(rounds):
        request_id = str(uuid.uuid4())
        replies = in_parallel(*(
            partial(stub.CreateCheckpoint, pb.CreateCheckpointRequest(plan_id=plan, request_id=request_id, state=b"x"),
                    timeout=60)
            for stub, plan in ((first, plans[0]), (second, plans[1]))))
        ok = [r for r in replies if isinstance(r, pb.CreateCheckpointResponse)]
        refused = [r for r in replies if isinstance(r, grpc.RpcError)]
        assert len(ok) == 1 and len(refused) == 1, replies
        assert refused[0].code() == grpc.StatusCode.INVALID_ARGUMENT
        assert error_info(refused[0]).reason == "REQUEST_ID_REUSED"
    counts = [len(list_all(first, plan)) for plan in plans]
    assert sum(counts) == rounds
    for plan in plans:
        assert [c.sequence for c in list_all(second, plan)] == list(range(len(list_all(second, plan)), 0, -1))


def test_a_rollback_through_one_replica_serializes_with_checkpoints_through_the_other(two_replicas):
    """Every checkpoint taken through replica A while replica B rolls the workspace back sees the
    workspace wholly before or wholly after the rollback, never half restored."""
    first, second, group = two_replicas
    workspace = group.workspace()
    plan_id = _ulid()

    def write_all(version: str) -> None:
        for i in range(FILES):
            (workspace / f"d{i % 10}" / f"f{i}.txt").parent.mkdir(exist_ok=True)
            (workspace / f"d{i % 10}" / f"f{i}.txt").write_text(f"{version} of file {i}\n" * 50)

    def create(stub) -> pb.Checkpoint:
        return stub.CreateCheckpoint(pb.CreateCheckpointRequest(plan_id=plan_id, workspace_root=str(workspace)),
                                     timeout=60).checkpoint

    write_all("v1")
    before = tree_state(workspace)
    target = create(first)
    during: list[pb.Checkpoint] = []
    safeties: list[pb.Checkpoint] = []
    def roll_back(done: threading.Event) -> None:
        try:
            reply = second.Rollback(pb.RollbackRequest(plan_id=plan_id, checkpoint_id=target.checkpoint_id),
                                    timeout=120)
            safeties.append(reply.safety_checkpoint)
        finally:
            done.set()

    def checkpoint_until(done: threading.Event) -> None:
        while not done.is_set():
            during.append(create(first))
        during.append(create(first))

    for _ in range(3):
        write_all("v2")
        done = threading.Event()
        in_parallel(partial(roll_back, done), partial(checkpoint_until, done))
        assert tree_state(workspace) == before

    assert len(safeties) == 3
    for checkpoint in during:
        changed = first.DiffCheckpoints(pb.DiffCheckpointsRequest(
            base_checkpoint_id=target.checkpoint_id, target_checkpoint_id=checkpoint.checkpoint_id)).changes
        assert len(changed) in (0, FILES), f"checkpoint {checkpoint.sequence} saw a half-restored workspace"
    for safety in safeties:
        changed = second.DiffCheckpoints(pb.DiffCheckpointsRequest(
            base_checkpoint_id=target.checkpoint_id, target_checkpoint_id=safety.checkpoint_id)).changes
        assert len(changed) == FILES
    sequences = sorted(c.sequence for c in (target, *during, *safeties))
    assert sequences == list(range(1, len(sequences) + 1))


def _ulid() -> str:
    return str(ULID())


def test_more_plans_at_once_than_rpc_threads_all_get_their_checkpoint(replicas):
    """Each create holds a database connection for its session and briefly needs a second one;
    with every RPC thread busy on a different plan, none may wait forever for the second."""
    (server,) = replicas.start(1)
    server.start()
    stub = replicas.stub(server)
    plans = [(_ulid(), replicas.workspace()) for _ in range(48)]
    for _, workspace in plans:
        for i in range(30):
            (workspace / f"f{i}.txt").write_text(f"{workspace.name} {i}")

    def create(plan: tuple[str, object]) -> pb.Checkpoint:
        plan_id, workspace = plan
        return stub.CreateCheckpoint(pb.CreateCheckpointRequest(
            plan_id=plan_id, workspace_root=str(workspace), state=plan_id.encode()), timeout=120).checkpoint

    replies = in_parallel(*(partial(create, plan) for plan in plans))
    failed = [reply for reply in replies if isinstance(reply, grpc.RpcError)]
    assert failed == []
    assert all(reply.sequence == 1 and reply.file_count == 30 for reply in replies)


def test_connections_the_database_dropped_are_replaced_before_a_call_uses_them(replicas):
    """PostgreSQL ends a replica's idle connections (a restart, a failover, an administrator):
    the pools must notice before using one, so that no call fails for it."""
    (server,) = replicas.start(1)
    server.start()
    stub = replicas.stub(server)
    plans = [(_ulid(), replicas.workspace()) for _ in range(6)]
    for _, workspace in plans:
        (workspace / "a.txt").write_text(workspace.name)
    admin = create_engine(replicas.db_url, isolation_level="AUTOCOMMIT", poolclass=NullPool)

    def create_all(with_root: bool) -> list[object]:
        return in_parallel(*(partial(stub.CreateCheckpoint, pb.CreateCheckpointRequest(
            plan_id=plan_id, workspace_root=str(workspace) if with_root else "", state=b"s"), timeout=60)
            for plan_id, workspace in plans))

    assert all(isinstance(reply, pb.CreateCheckpointResponse) for reply in create_all(with_root=True))
    for round_number in range(3):
        assert end_other_sessions(admin) >= 2
        replies = create_all(with_root=round_number % 2 == 0)
        assert [reply for reply in replies if isinstance(reply, grpc.RpcError)] == []
        listed = stub.ListCheckpoints(pb.ListCheckpointsRequest(plan_id=plans[0][0])).checkpoints
        assert [c.sequence for c in listed] == list(range(round_number + 2, 0, -1))
    admin.dispose()


def test_content_already_stored_by_one_replica_costs_the_other_no_new_objects(two_replicas):
    first, second, group = two_replicas
    workspace = group.workspace()
    for i in range(20):
        (workspace / f"f{i}.txt").write_text(f"content {i}")
    plan_id = _ulid()

    def create(stub) -> pb.Checkpoint:
        return stub.CreateCheckpoint(pb.CreateCheckpointRequest(plan_id=plan_id, workspace_root=str(workspace),
                                                                state=b"same state")).checkpoint

    one = create(first)
    stored = group.servers[0].object_count()
    assert stored >= 22
    two = create(second)
    assert two.tree_digest == one.tree_digest
    assert group.servers[1].object_count() == stored
    (workspace / "f0.txt").write_text("changed")
    create(second)
    assert group.servers[0].object_count() == stored + 2


@pytest.mark.parametrize("first_call", ["retry", "create"])
def test_a_replica_killed_mid_rollback_never_replays_it_over_the_other_replicas_work(replicas, first_call):
    """Replica A dies half-way through a rollback. Replica B takes the plan next — with the retry
    of the same request_id, or with a new checkpoint — and finishes that rollback first: it never
    acknowledges (or records) a half-applied one. Then B records new work. A, started again
    later, finds nothing left to do: it never "finishes" its old rollback over B's work."""
    first, second = replicas.start(2)
    start_with_faults(first, CHECKPOINTD_CRASH_AT="restore.change:2")
    second.start()
    a, b = replicas.stub(first), replicas.stub(second)
    workspace = replicas.workspace()
    plan_id = _ulid()
    names = [f"f{i}.txt" for i in range(5)]

    def write_all(version: str) -> None:
        for name in names:
            (workspace / name).write_text(f"{version} of {name}")

    def create(stub) -> pb.Checkpoint:
        return stub.CreateCheckpoint(pb.CreateCheckpointRequest(plan_id=plan_id, workspace_root=str(workspace)),
                                     timeout=60).checkpoint

    write_all("v1")
    target = create(b)
    checkpointed = tree_state(workspace)
    write_all("v2")
    before = tree_state(workspace)
    request = pb.RollbackRequest(plan_id=plan_id, checkpoint_id=target.checkpoint_id, request_id=str(uuid.uuid4()))
    with pytest.raises(grpc.RpcError) as died:
        a.Rollback(request, timeout=60)
    assert died.value.code() in (grpc.StatusCode.UNAVAILABLE, grpc.StatusCode.CANCELLED)
    assert first.process.wait(timeout=60) == -signal.SIGKILL
    first.stop()
    half = tree_state(workspace)
    assert half not in (before, checkpointed), "the kill was to leave the rollback half-applied"

    if first_call == "create":
        taken = create(b)
        assert taken.tree_digest == target.tree_digest, "a checkpoint recorded a half-applied rollback"
    reply = b.Rollback(request, timeout=120)
    assert tree_state(workspace) == checkpointed, "the retry was acknowledged over a half-applied rollback"
    safety = reply.safety_checkpoint
    assert safety.trigger == pb.TRIGGER_ROLLBACK and safety.rollback_target_checkpoint_id == target.checkpoint_id
    assert b.Rollback(request, timeout=60).safety_checkpoint == safety, "a replay returns the first result"

    write_all("v3")
    (workspace / "new.txt").write_text("new work through B")
    newest = create(b)
    after = tree_state(workspace)

    first.start()  # A, back much later, with no faults armed
    assert tree_state(workspace) == after, "the restarted replica replayed its stale rollback"
    again = create(a)
    assert again.tree_digest == newest.tree_digest and again.sequence == newest.sequence + 1
    listed = list_all(a, plan_id)
    assert [c.sequence for c in listed] == list(range(len(listed), 0, -1))
    # The safety checkpoint of the first attempt holds the workspace as it was before the rollback.
    a.Rollback(pb.RollbackRequest(plan_id=plan_id, checkpoint_id=safety.checkpoint_id), timeout=120)
    assert tree_state(workspace) == before


def test_a_page_token_issued_by_one_replica_is_good_on_the_other(two_replicas):
    first, second, _ = two_replicas
    plan_id = _ulid()
    created = [first.CreateCheckpoint(pb.CreateCheckpointRequest(plan_id=plan_id, state=b"%d" % i)).checkpoint
               for i in range(5)]
    request = pb.ListCheckpointsRequest(plan_id=plan_id, page_size=2)
    # Both replicas issue their first token at once: the key they share is made once.
    from_first, from_second = in_parallel(lambda: first.ListCheckpoints(request).next_page_token,
                                          lambda: second.ListCheckpoints(request).next_page_token)
    assert from_first and from_first == from_second
    seen = list(first.ListCheckpoints(request).checkpoints)
    token, replicas = from_first, [second, first]
    while token:
        page = replicas[0].ListCheckpoints(pb.ListCheckpointsRequest(plan_id=plan_id, page_size=2, page_token=token))
        seen += page.checkpoints
        token = page.next_page_token
        replicas.reverse()
    assert [c.checkpoint_id for c in seen] == [c.checkpoint_id for c in reversed(created)]
    forged = from_first[:-2] + ("AA" if from_first[-2:] != "AA" else "BA")
    for stub in (first, second):
        with pytest.raises(grpc.RpcError) as refused:
            stub.ListCheckpoints(pb.ListCheckpointsRequest(plan_id=plan_id, page_size=2, page_token=forged))
        assert error_info(refused.value).reason == "INVALID_PAGE_TOKEN"


def test_a_second_replica_given_the_same_data_directory_is_refused_at_startup(replicas, short_tmp):
    """With --store db the content is in the database, but each replica's data directory holds its
    own staged files and stat index: a second server starting there would sweep the first one's
    staged files from under its checkpoints. It is refused; the first keeps serving."""
    (first,) = replicas.start(1)
    first.start()
    second = RunningServer(Path(tempfile.mkdtemp(prefix="r-", dir=short_tmp)), db_url=replicas.db_url,
                           extra_args=first.extra_args)
    second.data_dir = first.data_dir
    refused = subprocess.run(second.command(), capture_output=True, text=True, timeout=60)
    assert refused.returncode == 2, refused.stderr
    assert "each replica needs a data directory of its own" in refused.stderr
    assert "Traceback" not in refused.stderr
    assert first.serving()
    first.stop()
    second.start()
    assert second.serving(), "once the first replica has stopped, its directory can be used again"
    second.stop()


def test_a_second_replica_on_the_same_disk_store_is_refused_at_startup(replicas, short_tmp):
    """A disk store has one writing process: each appends to the newest pack at the end it knows
    of, so a replica given the same data directory would write over the other's committed records.
    It is refused with a message that points at --store db; the first replica keeps serving."""
    (first,) = replicas.start(1)
    first.extra_args = ("--store", "disk", "--workspace-root", str(replicas.shared_root))
    first.start()
    second = RunningServer(Path(tempfile.mkdtemp(prefix="r-", dir=short_tmp)), db_url=replicas.db_url,
                           extra_args=first.extra_args)
    second.data_dir = first.data_dir
    refused = subprocess.run(second.command(), capture_output=True, text=True, timeout=60)
    assert refused.returncode == 2, refused.stderr
    assert "takes one server at a time" in refused.stderr and "--store db" in refused.stderr
    assert first.serving()
    first.stop()
    second.start()
    assert second.serving(), "once the first replica has stopped, the store can be written again"
    second.stop()
