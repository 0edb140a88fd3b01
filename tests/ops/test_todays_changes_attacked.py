"""An adversarial review of one day's changes (ignore lookup and budget, bounded responses,
bounded pending writes, unreadable sources, window birth times, direct writes), against real
servers (helper-52, 4 December). Each test is a defect it found, fixed the same day: pending writes
counted in characters, skipped files counted in characters, pages and bulk deletions of
checkpoints without a bound, and compiling pattern files left out of the ignore budget."""

from __future__ import annotations

import os
import time
from collections.abc import Iterator

import grpc
import pytest
from ulid import ULID

from checkpoint.v1 import checkpoint_service_pb2 as pb
from checkpoint.v1 import checkpoint_service_pb2_grpc as pb_grpc

#: What gRPC's default server send limit is, and this server's (server.MAX_SEND_BYTES).
SEND_LIMIT = 64 << 20


def _stub(server) -> Iterator[pb_grpc.CheckpointServiceStub]:
    # No receive limit on this side: what fails is the server's answer, not the test's channel.
    with grpc.insecure_channel(server.tcp_target, options=[("grpc.max_receive_message_length", -1),
                                                           ("grpc.max_send_message_length", -1)]) as channel:
        yield pb_grpc.CheckpointServiceStub(channel)


@pytest.fixture
def stub(fresh_server) -> Iterator[pb_grpc.CheckpointServiceStub]:
    yield from _stub(fresh_server)


def test_pending_writes_of_non_ascii_names_stay_listable(stub):
    checkpoint = stub.CreateCheckpoint(pb.CreateCheckpointRequest(plan_id=str(ULID())), timeout=30).checkpoint
    wide = "\U0001d11e"  # four bytes in UTF-8, one character
    for put in range(11):  # 11,000 writes of 1,600 characters, 6,400 bytes each: 17 MB counted, 70 MB held
        writes = [pb.PendingWrite(task_id=f"{put:02d}{i:04d}" + wide * 250, index=0, channel=wide * 256,
                                  value_type=wide * 64, value=b"", task_path=wide * 1024) for i in range(1000)]
        try:
            stub.PutPendingWrites(pb.PutPendingWritesRequest(checkpoint_id=checkpoint.checkpoint_id, writes=writes),
                                  timeout=120)
        except grpc.RpcError as error:  # refused past the cap: what the cap promises
            assert error.code() == grpc.StatusCode.RESOURCE_EXHAUSTED, error.details()
            break
    # Whatever was accepted can be listed.
    stub.ListPendingWrites(pb.ListPendingWritesRequest(checkpoint_id=checkpoint.checkpoint_id), timeout=120)


def _odd_workspace(server, files: int):
    """A workspace whose checkpoints each list the most skipped-path bytes the cap lets through:
    FIFOs (UNSUPPORTED_FILE_TYPE) whose 255-byte names are not UTF-8 (each listed as 4 bytes of
    text per byte, plus its raw bytes, while the cap counts 1)."""
    root = server.new_workspace()
    for i in range(files):
        os.mkfifo(os.path.join(os.fsencode(root), b"x" + b"%03d" % i + b"\xff" * 251))
    return root


def test_a_checkpoint_of_odd_files_lists_a_bounded_share_of_them(fresh_server, stub):
    """255-byte names that are not UTF-8 are sent escaped and raw (~5 bytes for each): the cap
    counts the message's bytes, not the path's characters."""
    root = _odd_workspace(fresh_server, 260)
    made = stub.CreateCheckpoint(pb.CreateCheckpointRequest(plan_id=str(ULID()), workspace_root=str(root)),
                                 timeout=60).checkpoint
    listed = sum(f.ByteSize() for f in made.skipped_files)
    assert 0 < listed <= 32 << 10, listed
    assert len(made.skipped_files) + made.skipped_files_omitted == 260


def test_a_page_of_large_checkpoints_ends_early_and_the_next_page_goes_on(fresh_server, stub):
    """Checkpoints of ~80 KB each (64 labels of 256 four-byte characters, a description of 4,096):
    a page of 1,000 would be ~80 MB, so it ends at 32 MiB with a token, and paging on lists every
    checkpoint once."""
    plan_id = str(ULID())
    made = _large_checkpoints(stub, plan_id, 450)
    seen: list[str] = []
    token = ""
    pages = 0
    while True:
        page = stub.ListCheckpoints(pb.ListCheckpointsRequest(plan_id=plan_id, page_size=1000, page_token=token),
                                    timeout=120)
        assert page.ByteSize() <= 33 << 20
        seen += [c.checkpoint_id for c in page.checkpoints]
        pages += 1
        token = page.next_page_token
        if not token:
            break
    assert pages == 2 and sorted(seen) == sorted(made)



def test_many_costly_gitignores_are_refused_within_the_budget(fresh_server, stub):
    root = fresh_server.new_workspace()
    for d in range(60):  # 60 x ~0.35 s of compiling: ~20 s of CPU for 120 entries (budget: 2 s + 12 ms)
        (root / f"d{d}").mkdir()
        (root / f"d{d}" / ".gitignore").write_bytes(b"".join(b"*%d*a*a*a*a*a*a*a\n" % (d * 1000 + i)
                                                              for i in range(512)))
    started = time.monotonic()
    try:
        stub.CreateCheckpoint(pb.CreateCheckpointRequest(plan_id=str(ULID()), workspace_root=str(root)),
                              timeout=300)
    except grpc.RpcError as error:
        assert error.code() == grpc.StatusCode.FAILED_PRECONDITION, (error.code(), error.details())
        assert "IGNORE_RULES_TOO_COSTLY" in str(error.trailing_metadata()), error.details()
    else:
        took = time.monotonic() - started
        assert took < 6, f"the capture took {took:.0f} s of compiling patterns and was not refused"


def _large_checkpoints(stub, plan_id: str, count: int) -> list[str]:
    """``count`` checkpoints of ~80 KB each (64 labels of 256 four-byte characters, a description
    of 4,096): 1,000 of them would be ~80 MB in one message."""
    wide = "\U0001d11e"
    labels = {f"k{i:02d}": wide * 256 for i in range(64)}
    return [stub.CreateCheckpoint(pb.CreateCheckpointRequest(plan_id=plan_id, labels=labels, description=wide * 4096),
                                  timeout=60).checkpoint.checkpoint_id for _ in range(count)]


def test_a_bulk_delete_of_many_checkpoints_is_answered(fresh_server, stub):
    """The checkpoints a DeleteCheckpoints removed are listed up to 32 MiB and the rest counted:
    the answer always arrives, so the caller knows what went."""
    plan_id = str(ULID())
    made = _large_checkpoints(stub, plan_id, 450)
    try:
        deleted = stub.DeleteCheckpoints(pb.DeleteCheckpointsRequest(plan_id=plan_id), timeout=120)
    except grpc.RpcError as error:
        left = stub.ListCheckpoints(pb.ListCheckpointsRequest(plan_id=plan_id, page_size=1), timeout=30)
        pytest.fail(f"{error.code().name}: {error.details()}; checkpoints left: {len(left.checkpoints)}")
    assert 0 < len(deleted.checkpoints) < len(made)
    assert len(deleted.checkpoints) + deleted.checkpoints_omitted == len(made)
    assert set(c.checkpoint_id for c in deleted.checkpoints) <= set(made)
