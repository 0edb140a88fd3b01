"""The integrity check finds what it must: every damage made here to a stopped server's data
directory shows up as a problem, and a torn tail of the last pack (what a power cut leaves) is
cut off on open without losing an acknowledged checkpoint."""

from __future__ import annotations

import json
import random
from datetime import UTC, datetime
from pathlib import Path

import grpc
import pytest
from sqlalchemy import create_engine, text
from ulid import ULID

from checkpoint.v1 import checkpoint_service_pb2 as pb
from checkpoint.v1 import checkpoint_service_pb2_grpc as pb_grpc
from checkpointd.core.journal import Goal, JournalEntry
from tests.hardening.support import assert_fsck_clean, fsck
from tests.helpers import skip_unless_ci, tree_state


def _populate(server) -> tuple[str, list[pb.Checkpoint], Path]:
    """A plan with small files (packed), a large one (stored on its own), state, and a rollback."""
    rng = random.Random(1)
    workspace = server.new_workspace()
    plan_id = str(ULID())
    checkpoints = []
    with grpc.insecure_channel(server.tcp_target) as channel:
        stub = pb_grpc.CheckpointServiceStub(channel)
        for i in range(2):
            (workspace / "small.txt").write_text(f"version {i}")
            (workspace / "large.bin").write_bytes(rng.randbytes(3 << 19))
            checkpoints.append(stub.CreateCheckpoint(pb.CreateCheckpointRequest(
                plan_id=plan_id, workspace_root=str(workspace), state=b"state %d" % i), timeout=60).checkpoint)
        stub.Rollback(pb.RollbackRequest(plan_id=plan_id, checkpoint_id=checkpoints[0].checkpoint_id), timeout=60)
    return plan_id, checkpoints, workspace


def _sql(server, statement: str, **params) -> None:
    engine = create_engine(server.db_url or f"sqlite:///{server.data_dir / 'checkpointd.db'}")
    try:
        with engine.begin() as connection:
            connection.execute(text(statement), params)
    finally:
        engine.dispose()


def _kinds(server) -> set[str]:
    return {p.kind for p in fsck(server).problems}


@pytest.fixture
def populated(idle_server):
    idle_server.start()
    plan_id, checkpoints, workspace = _populate(idle_server)
    idle_server.stop()
    assert_fsck_clean(idle_server)
    return idle_server, plan_id, checkpoints, workspace


def test_every_kind_of_damage_is_reported(populated) -> None:
    server, plan_id, checkpoints, _ = populated
    _sql(server, "UPDATE checkpoints SET tree_digest = :d WHERE checkpoint_id = :c", d="ab" * 32,
         c=checkpoints[1].checkpoint_id)
    _sql(server, "UPDATE checkpoints SET phase = 'bogus' WHERE checkpoint_id = :c", c=checkpoints[0].checkpoint_id)
    _sql(server, "UPDATE plans SET last_sequence = 1 WHERE plan_id = :p", p=plan_id)
    if server.store_kind == "db":
        digests = _large_digests_in_db(server)
        _sql(server, "UPDATE object_chunks SET data = :x WHERE digest = :d", x=b"not the content", d=digests[0])
        _sql(server, "DELETE FROM objects WHERE digest = :d", d=digests[1])
    else:
        loose = sorted(p for p in (server.data_dir / "store" / "objects").rglob("*") if p.is_file())
        assert len(loose) >= 2, "files over 1 MiB must be stored on their own"
        data = bytearray(loose[0].read_bytes())
        data[len(data) // 2] ^= 0xFF
        loose[0].write_bytes(bytes(data))
        loose[1].unlink()
    kinds = _kinds(server)
    assert {"missing_object", "corrupt_object", "bad_row", "sequence_conflict"} <= kinds, kinds


def _large_digests_in_db(server) -> list[str]:
    engine = create_engine(server.db_url or f"sqlite:///{server.data_dir / 'checkpointd.db'}")
    try:
        with engine.connect() as connection:
            return list(connection.execute(text("SELECT digest FROM objects WHERE size > 1000000 ORDER BY digest"))
                        .scalars())
    finally:
        engine.dispose()


def test_unfinished_and_unreadable_journals(populated) -> None:
    """Entries of the rollback journal in the database, and files an older server left, are
    listed as pending; any that cannot be read is a problem too."""
    server, plan_id, checkpoints, _ = populated
    entry = JournalEntry(plan_id=plan_id, workspace_root="/nowhere", target_checkpoint_id=checkpoints[0].checkpoint_id,
                         safety_checkpoint_id=checkpoints[1].checkpoint_id, safety_tree="00" * 32, paths=(),
                         temp_tag="t", directories=("",), goal=Goal.COMPLETE, last_sequence=2)
    garbled = str(ULID())
    for plan, body in ((plan_id, entry.to_record()), (garbled, {"version": 99})):
        _sql(server, "INSERT INTO rollback_journal (plan_id, entry, create_time) VALUES (:p, :e, :t)", p=plan,
             e=json.dumps(body), t=datetime.now(UTC))
    legacy = server.data_dir / "rollback-journal"
    legacy.mkdir()
    old, old_garbled = str(ULID()), str(ULID())
    legacy_body = {**entry.to_record(), "plan_id": old, "version": 1}
    del legacy_body["last_sequence"], legacy_body["written"]
    (legacy / f"{old}.json").write_text(json.dumps(legacy_body))
    (legacy / f"{old_garbled}.json").write_text(json.dumps({"version": 99}))
    report = fsck(server)
    assert sorted(report.pending_rollbacks) == sorted([plan_id, garbled, old, old_garbled])
    unreadable = sorted(p.subject for p in report.problems if p.kind == "unreadable_journal")
    assert unreadable == sorted([garbled, old_garbled])


def test_a_torn_pack_tail_is_cut_off_and_loses_nothing_acknowledged(populated) -> None:
    server, plan_id, checkpoints, workspace = populated
    if server.store_kind == "db":
        skip_unless_ci("packs exist only in the disk store")
    packs = sorted((server.data_dir / "store" / "packs").glob("pack-*.pack"))
    assert packs
    expected = tree_state(workspace)
    with open(packs[-1], "ab") as pack:
        pack.write(bytes.fromhex("ab" * 32) + b"Z" + (4096).to_bytes(4, "big") + b"torn record, cut short")
    assert_fsck_clean(server)
    server.start()
    with grpc.insecure_channel(server.tcp_target) as channel:
        stub = pb_grpc.CheckpointServiceStub(channel)
        (workspace / "small.txt").write_text("changed")
        stub.Rollback(pb.RollbackRequest(plan_id=plan_id, checkpoint_id=checkpoints[0].checkpoint_id), timeout=60)
        assert tree_state(workspace) == expected
    server.stop()
    assert_fsck_clean(server)
