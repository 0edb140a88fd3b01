"""A pack whose durable part is damaged (one header byte flipped by the disk, a stray write) must
not be cut short when the store opens: only a torn tail past the durable length may be. Cutting
at the damaged record destroyed every intact record after it; left in place, fsck reports the
damage and a repaired byte brings every object back."""

from __future__ import annotations

import grpc
import pytest
from ulid import ULID

from checkpoint.v1 import checkpoint_service_pb2 as pb
from checkpoint.v1 import checkpoint_service_pb2_grpc as pb_grpc
from checkpointd.core.workspace.readworker import RECORD
from tests.hardening.support import assert_fsck_clean, fsck

_PACK_HEADER_SIZE = 16
_KIND_OFFSET = _PACK_HEADER_SIZE + 32  # the first record's kind byte, after its digest


def _read_all(stub, checkpoint_id: str, names: list[str]) -> dict[str, bytes]:
    return {name: b"".join(r.data for r in stub.ReadCheckpointFile(
        pb.ReadCheckpointFileRequest(checkpoint_id=checkpoint_id, path=name), timeout=60)) for name in names}


def test_a_damaged_record_header_in_a_packs_durable_part_does_not_cut_off_the_records_after_it(idle_server) -> None:
    server = idle_server
    if server.store_kind == "db":
        pytest.skip("packs exist only in the disk store")
    server.start()
    workspace = server.new_workspace()
    names = [f"file_{i}.txt" for i in range(8)]
    for i, name in enumerate(names):
        (workspace / name).write_bytes(bytes(range(256)) * (i + 1))  # distinct, so one record each
    with grpc.insecure_channel(server.tcp_target) as channel:
        stub = pb_grpc.CheckpointServiceStub(channel)
        checkpoint = stub.CreateCheckpoint(pb.CreateCheckpointRequest(
            plan_id=str(ULID()), workspace_root=str(workspace)), timeout=60).checkpoint
        wanted = _read_all(stub, checkpoint.checkpoint_id, names)
    server.stop()
    pack = sorted((server.data_dir / "store" / "packs").glob("pack-*.pack"))[0]
    content = pack.read_bytes()
    assert int.from_bytes(content[8:16], "big") == len(content) > _KIND_OFFSET + RECORD.size, \
        "the whole pack must be known durable for this test"
    original = content[_KIND_OFFSET]
    with open(pack, "r+b") as damaged:
        damaged.seek(_KIND_OFFSET)
        damaged.write(b"?")

    server.start()  # opens the store: must leave the damaged pack's bytes alone
    server.stop()
    assert pack.stat().st_size == len(content), "records after the damaged one were cut off"
    report = fsck(server)
    assert not report.ok and any(p.kind == "damaged_store" and p.subject == pack.name for p in report.problems), \
        report.to_json()

    with open(pack, "r+b") as repaired:
        repaired.seek(_KIND_OFFSET)
        repaired.write(bytes([original]))
    server.start()
    with grpc.insecure_channel(server.tcp_target) as channel:
        stub = pb_grpc.CheckpointServiceStub(channel)
        assert _read_all(stub, checkpoint.checkpoint_id, names) == wanted
    server.stop()
    assert_fsck_clean(server)
