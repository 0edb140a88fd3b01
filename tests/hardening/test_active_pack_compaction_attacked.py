"""Attacks on 8d2711a: the pack being appended to (the active pack) is compacted once over half of
it is dead, by ``Compaction.delete`` itself, so a store smaller than one pack gives space back on a
running server, and the active pack may be compacted again and again within one collection.

What is attacked: the index and the tombstones across many compactions of the active pack and
reopenings (an object deleted and recorded again must neither come back nor go); a read whose
record is moved (twice) while it reads (a removed pack stays open until the reads that may still
use it end, ``RetiredPacks``; helper-59 found the version before closing all but the last); kill
-9 at each step of a compaction of the active pack during a running server's periodic collection;
creates of several plans (state-only on the event loop, and with files) and readers streaming
files and archives while the server collects every 0.1 s; and the database store, which keeps no
packs and must collect as before."""

from __future__ import annotations

import contextlib
import io
import os
import random
import tarfile
import threading
from pathlib import Path

import grpc
import pytest
from ulid import ULID

from checkpoint.v1 import checkpoint_service_pb2 as pb
from checkpoint.v1 import checkpoint_service_pb2_grpc as pb_grpc
from checkpointd.core.kernel.errors import DataLoss
from checkpointd.core.store import compaction as compaction_module
from checkpointd.core.store import content_store as store_module
from checkpointd.core.store.content_store import ContentStore
from checkpointd.core.store.packs import Pack
from tests.hardening.support import assert_fsck_clean, start_with_faults

GC_EVERY_100_MS = ("--gc-interval", "0.1")


# -- the store alone --------------------------------------------------------------------------


@pytest.fixture
def active_compactions(monkeypatch) -> list[int]:
    """Counts the compactions of the active pack (``_compact`` of the pack being appended to)."""
    counted: list[int] = []
    original = compaction_module.Compaction._compact

    def counting(self, pack):
        if pack is self._active:
            counted.append(pack.number)
        return original(self, pack)

    monkeypatch.setattr(compaction_module.Compaction, "_compact", counting)
    return counted


def _put(store: ContentStore, data: bytes, similar: str = "") -> str:
    with store.batch() as batch:
        return batch.put_bytes(data, similar)


def _delete(store: ContentStore, *digests: str) -> None:
    with store.collecting():
        for digest in digests:
            store.delete(digest)


def _check(store: ContentStore, model: dict[str, bytes], gone: set[str], where: str) -> None:
    for digest, data in model.items():
        assert store.has(digest), f"{where}: {digest} was lost"
        assert store.read_bytes(digest) == data, f"{where}: {digest} reads back different bytes"
    for digest in gone - set(model):
        assert not store.has(digest), f"{where}: deleted {digest} is counted as stored again"
    assert store.damage() == [], f"{where}: {store.damage()}"


@pytest.mark.parametrize("rotate", [1 << 20, 6000])
@pytest.mark.parametrize("seed", [1, 2, 3])
def test_the_store_keeps_exactly_what_it_holds_across_many_compactions_of_the_active_pack(
        tmp_path, monkeypatch, active_compactions, rotate, seed):
    """A seeded model: files edited a little at a time (deltas of their previous version), contents
    recorded again after their deletion, random objects; collections delete half of what is
    stored; the store is reopened now and then, and compacted offline. After every step every
    stored object reads back and no deleted one is stored; after each reopen too."""
    monkeypatch.setattr(store_module, "PACK_ROTATE_BYTES", rotate)
    rng = random.Random(seed)
    store = ContentStore(tmp_path)
    model: dict[str, bytes] = {}
    gone: set[str] = set()
    recorded: list[bytes] = []
    files = [rng.randbytes(300) + b"x" * rng.randrange(50, 2000) for _ in range(4)]
    previous = [""] * 4
    for step in range(160):
        roll = rng.random()
        if roll < 0.45:
            with store.batch() as batch:
                for _ in range(rng.randrange(1, 4)):
                    i = rng.randrange(4)
                    pick = rng.random()
                    if pick < 0.5:
                        edited = bytearray(files[i])
                        at = rng.randrange(len(edited))
                        edited[at:at + 8] = rng.randbytes(8)
                        data = files[i] = bytes(edited)
                    elif pick < 0.8 and recorded:
                        data = rng.choice(recorded)  # perhaps deleted before: recorded again
                    else:
                        data = rng.randbytes(rng.randrange(10, 600))
                    digest = batch.put_bytes(data, previous[i] if rng.random() < 0.7 else "")
                    previous[i] = digest
                    model[digest] = data
                    recorded.append(data)
        elif roll < 0.85:
            victims = [digest for digest in model if rng.random() < 0.5]
            _delete(store, *victims)
            for digest in victims:
                del model[digest]
                gone.add(digest)
        elif roll < 0.93:
            store.close()
            store = ContentStore(tmp_path)
        else:
            with store.collecting():
                store.compact_all()
        gone -= set(model)
        _check(store, model, gone, f"step {step}")
    store.close()
    reopened = ContentStore(tmp_path)
    assert set(reopened.iter_digests()) == set(model)
    _check(reopened, model, gone, "reopened at the end")
    assert len(active_compactions) >= 10, "the active pack was hardly compacted: the model attacked nothing"


def test_a_deleted_object_recorded_again_and_deleted_again_across_compactions_of_the_active_pack(
        tmp_path, monkeypatch, active_compactions):
    """X's first record is in an old pack; X is deleted (tombstone in the active pack), recorded
    again, the active pack is compacted (the tombstone is not carried: X is stored), X is deleted
    again and the new active pack compacted: its tombstone must be carried, or a restart indexes
    X's first record again. Then X recorded once more must be stored after a restart."""
    monkeypatch.setattr(store_module, "PACK_ROTATE_BYTES", 3000)
    store = ContentStore(tmp_path)
    x = b"the object deleted and recorded again " * 40 + os.urandom(600)
    x_digest = _put(store, x)
    old_pack = store._committed[x_digest].pack
    keep = {_put(store, data): data for data in (os.urandom(900) for _ in range(4))}
    assert store._active is not old_pack, "X's first record is in a pack no longer appended to"
    monkeypatch.setattr(store_module, "PACK_ROTATE_BYTES", 1 << 20)

    def garbage(count: int) -> list[str]:
        return [_put(store, os.urandom(2500)) for _ in range(count)]

    _delete(store, x_digest)
    _put(store, x)
    _delete(store, *garbage(3))  # the active pack: compacted, X's new record moved
    first = len(active_compactions)
    assert first >= 1
    _delete(store, x_digest)
    _delete(store, *garbage(3))
    assert len(active_compactions) > first, "the active pack holding X's second tombstone was not compacted"
    assert old_pack in store._packs, "X's first record must still be on disk for the attack to mean anything"
    _check(store, keep, {x_digest}, "before the restart")
    store.close()
    store = ContentStore(tmp_path)
    _check(store, keep, {x_digest}, "after the restart")
    _put(store, x)
    _delete(store, *garbage(3))
    store.close()
    store = ContentStore(tmp_path)
    _check(store, {**keep, x_digest: x}, set(), "X recorded a third time, after a restart")


def test_deltas_over_a_deleted_base_survive_compactions_of_the_active_pack_and_a_restart(
        tmp_path, monkeypatch, active_compactions):
    """Versions stored as deltas of each other, all in the active pack; deleting every other one
    rewrites its dependents whole into the pack that is then compacted (repeatedly)."""
    monkeypatch.setattr(store_module, "PACK_ROTATE_BYTES", 1 << 20)
    store = ContentStore(tmp_path)
    text = b"".join(b"line %d: %x\n" % (i, random.Random(i).getrandbits(64)) for i in range(300))
    versions: dict[str, bytes] = {}
    previous = ""
    for n in range(24):
        lines = text.splitlines(keepends=True)
        lines[n * 7 % len(lines)] = b"edited in version %d\n" % n
        text = b"".join(lines)
        previous = _put(store, text, previous)
        versions[previous] = text
    assert sum(store._committed[d].kind == store_module.ZSTD_DELTA for d in versions) > 10
    order = list(versions)
    doomed = order[::2]
    garbage = [_put(store, os.urandom(3000)) for _ in range(6)]
    _delete(store, *garbage, *doomed)
    kept = {d: versions[d] for d in order[1::2]}
    assert active_compactions, "the active pack was not compacted"
    _check(store, kept, set(doomed) | set(garbage), "after the collection")
    store.close()
    _check(ContentStore(tmp_path), kept, set(doomed) | set(garbage), "after a restart")


class _Overtaker:
    """Runs a collection that compacts the active pack twice in a row, the first times a pack
    read reaches the pack a test names: as a collection on another thread would, between the
    reader's lookup of the record and its read."""

    def __init__(self, store: ContentStore, monkeypatch, times: int, doomed: list[str]) -> None:
        self.store = store
        self.left = times
        #: Live objects stored before the one read, one deleted by each overtaking: the record read
        #: is then at another offset in the packs after (a closed fd, reused by a newer pack, would
        #: else read the very same record there).
        self.doomed = doomed
        self.overtaken: list[str] = []
        original = Pack.read
        overtaker = self

        def read(pack: Pack, location):
            if overtaker.left and pack is overtaker.store._active:
                overtaker.left -= 1
                overtaker.overtaken.append(pack.path.name)
                overtaker.compact_active_twice()
            return original(pack, location)

        monkeypatch.setattr(Pack, "read", read)

    def compact_active_twice(self) -> None:
        for round_ in range(2):
            garbage = [_put(self.store, os.urandom(3000)) for _ in range(4)]
            _delete(self.store, *([self.doomed.pop(0)] if round_ == 0 and self.doomed else []), *garbage)


def test_a_read_overtaken_by_two_compactions_of_the_active_pack_reads_where_its_record_went(
        tmp_path, monkeypatch, active_compactions):
    """The reader looked the record up in the active pack; two compactions later that pack is
    removed, but stays open until the read ends: the read gets the record it looked up, and the
    removed packs are closed once it is done."""
    monkeypatch.setattr(store_module, "PACK_ROTATE_BYTES", 1 << 20)
    store = ContentStore(tmp_path)
    doomed = [_put(store, os.urandom(700))]
    data = os.urandom(2000)
    digest = _put(store, data)
    _Overtaker(store, monkeypatch, times=1, doomed=doomed)
    assert store.read_bytes(digest) == data
    assert len(active_compactions) >= 2
    assert store._retired.open_count() == 0, "a removed pack was left open after the read"


def test_a_read_whose_retry_is_overtaken_too_still_reads_a_stored_object(tmp_path, monkeypatch, active_compactions):
    """Found by helper-59 against 8d2711a: a store that closed every removed pack but the last (and
    retried a failed read once, where the record had moved) failed the read of a stored object of
    an acknowledged checkpoint with DATA_LOSS when two pairs of compactions of the active pack
    overtook it, before the read and before its retry (a ReadCheckpointFile, an ExportCheckpoint, a
    diff, GetCheckpoint's state, on a server collecting a store smaller than one pack); a closed
    descriptor's number, reused by a newer pack, even read another pack's bytes. Removed packs now
    stay open until every read that began before their removal has ended."""
    monkeypatch.setattr(store_module, "PACK_ROTATE_BYTES", 1 << 20)
    store = ContentStore(tmp_path)
    doomed = [_put(store, os.urandom(700)) for _ in range(2)]
    data = os.urandom(2000)
    digest = _put(store, data)
    overtaker = _Overtaker(store, monkeypatch, times=2, doomed=doomed)
    try:
        read = store.read_bytes(digest)
    except DataLoss as lost:
        pytest.fail(f"a stored object could not be read after its record moved twice ({overtaker.overtaken}): {lost}")
    assert read == data
    assert store.has(digest)
    assert store._retired.open_count() == 0, "a removed pack was left open after the read"


# -- a running server -------------------------------------------------------------------------


def _server(idle_servers, *extra: str):
    server = idle_servers()
    server.extra_args = (*server.extra_args, *GC_EVERY_100_MS, *extra)
    return server


class _Acknowledged:
    """What every acknowledged checkpoint must give back: its files (path -> bytes) and its state."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.files: dict[str, dict[str, bytes]] = {}
        self.states: dict[str, bytes] = {}
        self.plans: dict[str, list[str]] = {}

    def add(self, plan_id: str, checkpoint_id: str, files: dict[str, bytes], state: bytes) -> None:
        with self.lock:
            self.files[checkpoint_id] = files
            self.states[checkpoint_id] = state
            self.plans.setdefault(plan_id, []).append(checkpoint_id)

    def forget(self, checkpoint_id: str) -> None:
        with self.lock:
            self.files.pop(checkpoint_id)
            self.states.pop(checkpoint_id)
            for ids in self.plans.values():
                if checkpoint_id in ids:
                    ids.remove(checkpoint_id)


def _verified_across_a_restart(server, acknowledged: _Acknowledged) -> None:
    """fsck clean on the stopped server; every acknowledged checkpoint exact after a restart."""
    server.stop()
    assert_fsck_clean(server)
    server.start()
    with grpc.insecure_channel(server.tcp_target) as channel:
        _verify(pb_grpc.CheckpointServiceStub(channel), acknowledged)
    server.stop()


def _read_file(stub, checkpoint_id: str, path: str) -> bytes:
    return b"".join(part.data for part in stub.ReadCheckpointFile(
        pb.ReadCheckpointFileRequest(checkpoint_id=checkpoint_id, path=path), timeout=60))


def _export(stub, checkpoint_id: str) -> dict[str, bytes]:
    archive = b"".join(part.data for part in stub.ExportCheckpoint(
        pb.ExportCheckpointRequest(checkpoint_id=checkpoint_id), timeout=60))
    with tarfile.open(fileobj=io.BytesIO(archive)) as tar:
        return {member.name: tar.extractfile(member).read() for member in tar.getmembers() if member.isfile()}


def _verify(stub, acknowledged: _Acknowledged) -> None:
    for checkpoint_id, files in acknowledged.files.items():
        got = stub.GetCheckpoint(pb.GetCheckpointRequest(checkpoint_id=checkpoint_id,
                                                         view=pb.CHECKPOINT_VIEW_FULL), timeout=30)
        assert got.checkpoint.state == acknowledged.states[checkpoint_id], f"state of {checkpoint_id}"
        if files:
            assert _export(stub, checkpoint_id) == files, f"files of {checkpoint_id}"


def _write_files(workspace: Path, rng: random.Random, count: int, size: int) -> dict[str, bytes]:
    files = {}
    for n in range(count):
        data = rng.randbytes(size) if rng.random() < 0.5 else (b"%d " % n) * (size // 4) + rng.randbytes(64)
        (workspace / f"f{n:02}.bin").write_bytes(data)
        files[f"f{n:02}.bin"] = data
    return files


def _create(stub, acknowledged: _Acknowledged, plan_id: str, rng: random.Random,
            workspace: Path | None = None) -> str:
    state = rng.randbytes(rng.randrange(200, 3000))
    files = _write_files(workspace, rng, 6, 1500) if workspace is not None else {}
    request = pb.CreateCheckpointRequest(plan_id=plan_id, state=state)
    if workspace is not None:
        request.workspace_root = str(workspace)
    checkpoint = stub.CreateCheckpoint(request, timeout=60).checkpoint
    acknowledged.add(plan_id, checkpoint.checkpoint_id, files, state)
    return checkpoint.checkpoint_id


@pytest.mark.parametrize("crash_at", ["compact.copied:1", "compact.synced:1"])
def test_kill_during_a_compaction_of_the_active_pack_by_periodic_gc_loses_no_acknowledged_checkpoint(
        idle_servers, crash_at):
    """A store smaller than one pack; checkpoints with files and state; deleting most of them makes
    the running server's next collection compact the active pack, and it is killed there. After a
    restart every acknowledged checkpoint reads back byte for byte, fsck is clean, and the deleted
    contents recorded again are stored (no tombstone left behind ends them on the next restart)."""
    server = _server(idle_servers)
    if server.store_kind != "disk":
        pytest.skip("the database store keeps no packs")
    rng = random.Random(11)
    acknowledged = _Acknowledged()
    plan_id, state_plan = str(ULID()), str(ULID())
    workspace = server.new_workspace()
    start_with_faults(server, CHECKPOINTD_CRASH_AT=crash_at)
    with grpc.insecure_channel(server.tcp_target) as channel:
        stub = pb_grpc.CheckpointServiceStub(channel)
        for _ in range(8):
            _create(stub, acknowledged, plan_id, rng, workspace)
            _create(stub, acknowledged, state_plan, rng)
        doomed = acknowledged.plans[plan_id][:6] + acknowledged.plans[state_plan][:6]
        deleted = {checkpoint_id: (acknowledged.files[checkpoint_id], acknowledged.states[checkpoint_id])
                   for checkpoint_id in doomed}
        with contextlib.suppress(grpc.RpcError):  # the server may die under the last ones
            for checkpoint_id in doomed:
                stub.DeleteCheckpoint(pb.DeleteCheckpointRequest(checkpoint_id=checkpoint_id), timeout=30)
                acknowledged.forget(checkpoint_id)
    server.process.wait(timeout=20)
    assert server.stop() == -9, f"the collection never reached {crash_at}:\n{server.log()}"
    assert_fsck_clean(server)
    server.start()
    with grpc.insecure_channel(server.tcp_target) as channel:
        stub = pb_grpc.CheckpointServiceStub(channel)
        _verify(stub, acknowledged)
        # The deleted contents, recorded again (the files' and the states' very bytes).
        for checkpoint_id, (files, state) in deleted.items():
            if checkpoint_id in acknowledged.files:
                continue  # its deletion was not acknowledged before the kill
            if files:
                for name, data in files.items():
                    (workspace / name).write_bytes(data)
                request = pb.CreateCheckpointRequest(plan_id=plan_id, state=state, workspace_root=str(workspace))
            else:
                request = pb.CreateCheckpointRequest(plan_id=state_plan, state=state)
            again = stub.CreateCheckpoint(request, timeout=60).checkpoint
            acknowledged.add(request.plan_id, again.checkpoint_id, files, state)
        _verify(stub, acknowledged)
    _verified_across_a_restart(server, acknowledged)
    assert_fsck_clean(server)


@pytest.mark.parametrize("rotate", ["", "16384"])
def test_concurrent_creates_deletes_and_reads_during_periodic_gc_lose_nothing(idle_servers, rotate):
    """Three plans of state-only creates (on the event loop once their plan is remembered) and two
    plans with files, each a thread, each deleting its older checkpoints as it goes; two readers
    stream files and archives of checkpoints never deleted; the server collects every 0.1 s, its
    active pack compacted again and again. No call fails; after it all, and after a restart, every
    acknowledged checkpoint reads back exactly and fsck is clean."""
    server = _server(idle_servers)
    if server.store_kind != "disk" and rotate:
        pytest.skip("the database store keeps no packs")
    knobs = {"CHECKPOINTD_PACK_ROTATE_BYTES": rotate} if rotate else {}
    start_with_faults(server, **knobs)
    acknowledged = _Acknowledged()
    pinned: dict[str, dict[str, bytes]] = {}  # checkpoints never deleted: the readers' targets
    errors: list[str] = []
    writers_done = threading.Event()

    def writer(number: int, with_files: bool) -> None:
        rng = random.Random(number)
        plan_id = str(ULID())
        workspace = server.new_workspace() if with_files else None
        try:
            with grpc.insecure_channel(server.tcp_target) as channel:
                stub = pb_grpc.CheckpointServiceStub(channel)
                first = _create(stub, acknowledged, plan_id, rng, workspace)
                with acknowledged.lock:
                    pinned[first] = acknowledged.files[first]
                for n in range(25 if with_files else 60):
                    _create(stub, acknowledged, plan_id, rng, workspace)
                    if n % 3 == 2:
                        for old in acknowledged.plans[plan_id][1:-2]:
                            stub.DeleteCheckpoint(pb.DeleteCheckpointRequest(checkpoint_id=old), timeout=30)
                            acknowledged.forget(old)
        except Exception as exc:  # noqa: BLE001 - reported below
            errors.append(f"writer {number}: {exc!r}")

    def reader() -> None:
        try:
            with grpc.insecure_channel(server.tcp_target) as channel:
                stub = pb_grpc.CheckpointServiceStub(channel)
                rounds = 0
                while not writers_done.is_set() or rounds < 3:
                    rounds += 1
                    with acknowledged.lock:
                        targets = dict(pinned)
                    for checkpoint_id, files in targets.items():
                        state = stub.GetCheckpoint(pb.GetCheckpointRequest(
                            checkpoint_id=checkpoint_id, view=pb.CHECKPOINT_VIEW_FULL), timeout=30).checkpoint.state
                        assert state == acknowledged.states[checkpoint_id], "state"
                        if files:
                            assert _export(stub, checkpoint_id) == files, "export"
                            for name, data in files.items():
                                assert _read_file(stub, checkpoint_id, name) == data, name
        except Exception as exc:  # noqa: BLE001 - reported below
            errors.append(f"reader: {exc!r}")

    writers = [threading.Thread(target=writer, args=(n, n >= 3)) for n in range(5)]
    readers = [threading.Thread(target=reader) for _ in range(2)]
    for thread in writers + readers:
        thread.start()
    for thread in writers:
        thread.join(timeout=120)
    writers_done.set()
    for thread in readers:
        thread.join(timeout=120)
    assert not errors, errors
    with grpc.insecure_channel(server.tcp_target) as channel:
        _verify(pb_grpc.CheckpointServiceStub(channel), acknowledged)
    server.stop()
    assert_fsck_clean(server)
    start_with_faults(server, **knobs)
    with grpc.insecure_channel(server.tcp_target) as channel:
        _verify(pb_grpc.CheckpointServiceStub(channel), acknowledged)
    server.stop()
    assert_fsck_clean(server)


def test_the_database_store_collects_and_keeps_what_is_referenced_as_before(idle_servers):
    """--store db keeps no packs: the same deletions under periodic collection leave every kept
    checkpoint exact, the collected objects gone from its table, fsck clean."""
    server = _server(idle_servers, "--store", "db")
    server.start()
    rng = random.Random(5)
    acknowledged = _Acknowledged()
    plan_id, state_plan = str(ULID()), str(ULID())
    workspace = server.new_workspace()
    with grpc.insecure_channel(server.tcp_target) as channel:
        stub = pb_grpc.CheckpointServiceStub(channel)
        for _ in range(5):
            _create(stub, acknowledged, plan_id, rng, workspace)
            _create(stub, acknowledged, state_plan, rng)
        before = server.object_count()
        for checkpoint_id in acknowledged.plans[plan_id][:3] + acknowledged.plans[state_plan][:3]:
            stub.DeleteCheckpoint(pb.DeleteCheckpointRequest(checkpoint_id=checkpoint_id), timeout=30)
            acknowledged.forget(checkpoint_id)
        deadline_rounds = 400
        while server.object_count() >= before and deadline_rounds:
            deadline_rounds -= 1
            threading.Event().wait(0.05)
        assert server.object_count() < before, "the database store collected nothing"
        _verify(stub, acknowledged)
    _verified_across_a_restart(server, acknowledged)
