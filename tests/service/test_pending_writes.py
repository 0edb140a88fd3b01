"""PutPendingWrites / ListPendingWrites: writes that follow a checkpoint, merged as documented,
ordered, and deleted with their checkpoint however it goes."""

from __future__ import annotations

import grpc
from ulid import ULID

from checkpoint.v1 import checkpoint_service_pb2 as pb
from checkpoint.v1 import checkpoint_service_pb2_grpc as pb_grpc
from tests.service.test_errors import INVALID, expect


def _write(task_id: str, index: int, channel: str, value: bytes, task_path: str = "") -> pb.PendingWrite:
    return pb.PendingWrite(task_id=task_id, index=index, channel=channel, value_type="bytes", value=value,
                           task_path=task_path)


def _listed(stub, checkpoint_id: str) -> list[tuple]:
    writes = stub.ListPendingWrites(pb.ListPendingWritesRequest(checkpoint_id=checkpoint_id)).writes
    return [(w.task_path, w.task_id, w.index, w.channel, w.value) for w in writes]


def _checkpoint(stub, plan_id: str | None = None) -> pb.Checkpoint:
    return stub.CreateCheckpoint(pb.CreateCheckpointRequest(plan_id=plan_id or str(ULID()))).checkpoint


def test_a_regular_write_keeps_its_first_value_a_special_one_its_last_in_order(checkpoint_stub):
    checkpoint = _checkpoint(checkpoint_stub)
    put = checkpoint_stub.PutPendingWrites
    put(pb.PutPendingWritesRequest(checkpoint_id=checkpoint.checkpoint_id, writes=[
        _write("t2", 0, "a", b"first", "~b"), _write("t2", -1, "__error__", b"first error", "~b")]))
    put(pb.PutPendingWritesRequest(checkpoint_id=checkpoint.checkpoint_id, writes=[
        _write("t2", 0, "a", b"second", "~b"), _write("t2", -1, "__error__", b"last error", "~b"),
        _write("t2", 1, "b", b"new", "~b")]))
    put(pb.PutPendingWritesRequest(checkpoint_id=checkpoint.checkpoint_id, writes=[_write("t1", 0, "a", b"x", "~a")]))
    assert _listed(checkpoint_stub, checkpoint.checkpoint_id) == [
        ("~a", "t1", 0, "a", b"x"),
        ("~b", "t2", -1, "__error__", b"last error"),
        ("~b", "t2", 0, "a", b"first"),
        ("~b", "t2", 1, "b", b"new"),
    ]
    # Another checkpoint has none of them.
    assert _listed(checkpoint_stub, _checkpoint(checkpoint_stub).checkpoint_id) == []


def test_writes_are_deleted_with_their_checkpoint_by_every_kind_of_delete(checkpoint_stub):
    plan = str(ULID())
    one, two, kept = (_checkpoint(checkpoint_stub, plan) for _ in range(3))
    for checkpoint in (one, two, kept):
        checkpoint_stub.PutPendingWrites(pb.PutPendingWritesRequest(
            checkpoint_id=checkpoint.checkpoint_id, writes=[_write("t", 0, "c", b"v")]))
    checkpoint_stub.DeleteCheckpoint(pb.DeleteCheckpointRequest(checkpoint_id=one.checkpoint_id))
    checkpoint_stub.DeleteCheckpoints(pb.DeleteCheckpointsRequest(
        plan_id=plan, filter=f'labels.none = "{ULID()}"'))  # matches nothing: deletes nothing
    assert _listed(checkpoint_stub, two.checkpoint_id) == [("", "t", 0, "c", b"v")]
    checkpoint_stub.DeleteCheckpoints(pb.DeleteCheckpointsRequest(plan_id=plan))
    for gone in (one, two, kept):
        expect(grpc.StatusCode.NOT_FOUND, "CHECKPOINT_NOT_FOUND", checkpoint_stub.ListPendingWrites,
               pb.ListPendingWritesRequest(checkpoint_id=gone.checkpoint_id))
    # The same plan's next checkpoint starts with none (no row survived the cascade).
    assert _listed(checkpoint_stub, _checkpoint(checkpoint_stub, plan).checkpoint_id) == []


def test_bad_writes_are_refused_with_a_reason(checkpoint_stub):
    checkpoint_id = _checkpoint(checkpoint_stub).checkpoint_id
    put = checkpoint_stub.PutPendingWrites

    def refused(reason: str, writes: list, target: str = checkpoint_id, code=INVALID) -> None:
        expect(code, reason, put, pb.PutPendingWritesRequest(checkpoint_id=target, writes=writes))

    refused("MISSING_FIELD", [])
    refused("MISSING_FIELD", [_write("", 0, "c", b"")])
    refused("MISSING_FIELD", [_write("t", 0, "", b"")])
    refused("FIELD_TOO_LONG", [_write("t" * 257, 0, "c", b"")])
    refused("FIELD_TOO_LONG", [_write("t", i, "c", b"") for i in range(1001)])
    refused("FIELD_TOO_LONG", [_write("t", 0, "c", b"", task_path="p" * 1025)])
    refused("INVALID_CHECKPOINT_ID", [_write("t", 0, "c", b"")], target="nope")
    refused("CHECKPOINT_NOT_FOUND", [_write("t", 0, "c", b"")], target=str(ULID()), code=grpc.StatusCode.NOT_FOUND)
    expect(INVALID, "MISSING_FIELD", checkpoint_stub.ListPendingWrites, pb.ListPendingWritesRequest())
    assert _listed(checkpoint_stub, checkpoint_id) == []



def test_a_put_past_a_checkpoints_pending_writes_limit_is_refused_and_records_nothing(checkpointd_server):
    """ListPendingWrites answers all of a checkpoint's writes in one message, so their total is
    bounded (32 MiB) where they are accepted: the put that would go past it is RESOURCE_EXHAUSTED /
    PENDING_WRITES_FULL and leaves nothing of itself; what was accepted stays listable. A
    replaced special write counts once."""
    options = [("grpc.max_receive_message_length", 64 << 20)]
    with grpc.insecure_channel(checkpointd_server.tcp_target, options=options) as channel:
        stub = pb_grpc.CheckpointServiceStub(channel)
        checkpoint = _checkpoint(stub)
        put = stub.PutPendingWrites
        put(pb.PutPendingWritesRequest(checkpoint_id=checkpoint.checkpoint_id,
                                       writes=[_write("t1", 0, "a", b"x" * (15 << 20))]))
        for _ in range(3):  # replaced each time: one value of 15 MiB
            put(pb.PutPendingWritesRequest(checkpoint_id=checkpoint.checkpoint_id,
                                           writes=[_write("t1", -1, "__error__", b"e" * (15 << 20))]))
        info = expect(grpc.StatusCode.RESOURCE_EXHAUSTED, "PENDING_WRITES_FULL", put, pb.PutPendingWritesRequest(
            checkpoint_id=checkpoint.checkpoint_id,
            writes=[_write("t2", 0, "b", b"small"), _write("t2", 1, "b", b"y" * (3 << 20))]))
        assert info.metadata["limit"] == str(32 << 20)
        assert [(t, i) for _, t, i, _, _ in _listed(stub, checkpoint.checkpoint_id)] == [("t1", -1), ("t1", 0)]
