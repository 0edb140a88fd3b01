"""The integrity check finds what it must: every damage made here to a stopped server's data
directory shows up as a problem, and a torn tail of the last pack (what a power cut leaves) is
cut off on open without losing an acknowledged checkpoint. `checkpointd fsck` reports it
offline and through a running server (AdminService), with its exit status."""

from __future__ import annotations

import json
import random
import subprocess
import threading
import time
from datetime import UTC, datetime
from pathlib import Path

import grpc
import pytest
from sqlalchemy import create_engine, text
from ulid import ULID

from checkpoint.v1 import admin_service_pb2 as admin_pb
from checkpoint.v1 import admin_service_pb2_grpc as admin_grpc
from checkpoint.v1 import checkpoint_service_pb2 as pb
from checkpoint.v1 import checkpoint_service_pb2_grpc as pb_grpc
from checkpointd.core.restore.journal import Goal, JournalEntry
from tests.conftest import CHECKPOINTD
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
    cli = _cli(*_offline(server), "--json")
    assert cli.returncode == 1
    assert sorted(_json(cli)["pending_rollbacks"]) == sorted([plan_id, garbled, old, old_garbled])
    _sql(server, "DELETE FROM rollback_journal WHERE plan_id = :p", p=garbled)
    for name in (old, old_garbled):
        (legacy / f"{name}.json").unlink()
    pending_only = _cli(*_offline(server))
    assert pending_only.returncode == 1, "an unfinished rollback is a finding"
    assert f"plan {plan_id} has an unfinished rollback" in pending_only.stdout


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


def _cli(*args: str) -> subprocess.CompletedProcess:
    done = subprocess.run([CHECKPOINTD, "fsck", *args], capture_output=True, text=True, timeout=300,
                          env={"PATH": "/usr/bin:/bin", "COLUMNS": "250"})
    assert "Traceback" not in done.stderr + done.stdout, done.stderr
    return done


def _offline(server) -> list[str]:
    args = ["--data-dir", str(server.data_dir), "--store", server.store_kind]
    return [*args, "--db-url", server.db_url] if server.db_url else args


def _json(done: subprocess.CompletedProcess) -> dict:
    return json.loads(done.stdout)


def _damage_one_large_object(server) -> str:
    """Removes the stored content of one file over 1 MiB; returns its digest."""
    if server.store_kind == "db":
        digest = _large_digests_in_db(server)[0]
        _sql(server, "DELETE FROM object_chunks WHERE digest = :d", d=digest)
        return digest
    loose = sorted(p for p in (server.data_dir / "store" / "objects").rglob("*") if p.is_file())
    loose[0].unlink()
    return loose[0].parent.name + loose[0].name


def test_the_fsck_command_reports_damage_offline_and_through_a_running_server(populated) -> None:
    server, _plan_id, _checkpoints, _ = populated
    clean = _cli(*_offline(server), "--json")
    assert clean.returncode == 0, clean.stdout + clean.stderr
    assert _json(clean)["ok"] and _json(clean)["checkpoints"] == 3
    server.start()
    beside = _cli(*_offline(server))
    if server.store_kind == "db" and server.db_url.startswith("postgresql"):
        assert beside.returncode == 0, "fsck of a PostgreSQL database store runs beside the servers"
    else:
        assert beside.returncode == 2 and "in use by a running checkpointd" in beside.stderr, beside.stderr
    online = _cli("--target", server.tcp_target, "--unreferenced")
    assert online.returncode == 0 and "clean" in online.stdout, online.stdout + online.stderr

    digest = _damage_one_large_object(server)
    found = _cli("--target", server.unix_target, "--json")
    assert found.returncode == 1, found.stdout + found.stderr
    problems = _json(found)["problems"]
    assert {p["subject"] for p in problems} == {digest}, problems
    assert problems[0]["kind"] in ("missing_object", "corrupt_object")
    human = _cli("--target", server.tcp_target)
    assert human.returncode == 1 and digest in human.stdout and "problem" in human.stdout, human.stdout
    server.stop()
    offline = _cli(*_offline(server), "--json")
    assert offline.returncode == 1
    assert {p["subject"] for p in _json(offline)["problems"]} == {digest}


def test_the_fsck_command_explains_why_it_cannot_check(idle_server, tmp_path) -> None:
    missing = _cli("--data-dir", str(tmp_path / "nowhere"))
    assert missing.returncode == 2 and "no data directory" in missing.stderr
    empty = _cli("--data-dir", str(tmp_path))
    assert empty.returncode == 2 and "no checkpointd database" in empty.stderr
    assert not (tmp_path / "checkpointd.db").exists(), "a check must not create a database"
    down = _cli("--target", idle_server.tcp_target, "--timeout", "5")
    assert down.returncode == 2 and "UNAVAILABLE" in down.stderr
    both = _cli("--target", idle_server.tcp_target, "--data-dir", str(tmp_path))
    assert both.returncode == 2 and "--target" in both.stderr


def test_a_pack_cut_short_under_a_running_server_is_reported(populated) -> None:
    server, _plan_id, _checkpoints, _ = populated
    if server.store_kind == "db":
        pytest.skip("packs exist only in the disk store")
    server.start()
    pack = sorted((server.data_dir / "store" / "packs").glob("pack-*.pack"))[-1]
    with open(pack, "r+b") as f:
        f.truncate(pack.stat().st_size - 100)
    found = _cli("--target", server.tcp_target, "--json")
    assert found.returncode == 1
    kinds = {p["kind"] for p in _json(found)["problems"]}
    assert "damaged_store" in kinds, kinds
    server.stop()
    offline = _cli(*_offline(server), "--json")
    assert offline.returncode == 1, "the records cut off were referenced"


def test_fsck_through_a_server_that_deletes_and_collects_meanwhile_finds_nothing(idle_server) -> None:
    """Checkpoints are created and deleted, and garbage collected every 50 ms, while the server
    checks itself: a checkpoint deleted (and its objects collected) after the check read the
    rows is not a finding, and every other one is checked."""
    server = idle_server
    server.extra_args = (*server.extra_args, "--gc-interval", "0.05")
    server.start()
    workspace = server.new_workspace()
    plan_id = str(ULID())
    stop = threading.Event()
    churned = []

    def churn() -> None:
        rng = random.Random(4)
        with grpc.insecure_channel(server.tcp_target) as channel:
            stub = pb_grpc.CheckpointServiceStub(channel)
            while not stop.is_set():
                for name in ("a", "b", "c"):
                    (workspace / f"{name}.bin").write_bytes(rng.randbytes(2000))
                created = stub.CreateCheckpoint(pb.CreateCheckpointRequest(
                    plan_id=plan_id, workspace_root=str(workspace), state=rng.randbytes(100)), timeout=60).checkpoint
                stub.DeleteCheckpoint(pb.DeleteCheckpointRequest(checkpoint_id=created.checkpoint_id), timeout=60)
                churned.append(created.checkpoint_id)

    worker = threading.Thread(target=churn)
    worker.start()
    try:
        with grpc.insecure_channel(server.tcp_target) as channel:
            stub = admin_grpc.AdminServiceStub(channel)
            checks = 0
            deadline = time.monotonic() + 120
            while (len(churned) < 30 or checks < 10) and time.monotonic() < deadline:
                reply = stub.CheckIntegrity(admin_pb.CheckIntegrityRequest(verify_unreferenced_objects=True),
                                            timeout=120)
                assert reply.ok, list(reply.findings)
                checks += 1
    finally:
        stop.set()
        worker.join()
    assert len(churned) >= 30 and checks >= 10, (len(churned), checks)
