"""A checkpoint deleted, and its content collected, while a client still reads it (an export of a
large tree, a slow reader) is gone: the stream ends NOT_FOUND, CHECKPOINT_NOT_FOUND. It used to
end DATA_LOSS ("object ... is missing"), which tells an operator the store is corrupt when
nothing was lost that anyone still wanted."""

from __future__ import annotations

import os
import re
import time

import grpc
import pytest
from ulid import ULID

from checkpoint.v1 import checkpoint_service_pb2 as pb
from checkpoint.v1 import checkpoint_service_pb2_grpc as pb_grpc
from tests.helpers import error_info

FILES = 40
FILE_BYTES = 512 << 10  # 20 MiB in all: more than the stream's flow-control windows hold


def _collected(server, timeout: float = 60.0) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if re.search(r"deleted [1-9]\d* object", server.log()):
            return
        time.sleep(0.05)
    pytest.fail(f"garbage collection deleted nothing within {timeout}s:\n{server.log()[-3000:]}")


def test_an_export_whose_checkpoint_is_deleted_and_collected_midway_ends_not_found(idle_server) -> None:
    server = idle_server
    server.extra_args = (*server.extra_args, "--gc-interval", "0.05")
    server.start()
    workspace = server.new_workspace()
    for i in range(FILES):
        (workspace / f"f{i:02d}.bin").write_bytes(os.urandom(FILE_BYTES))
    with grpc.insecure_channel(server.tcp_target) as channel:
        stub = pb_grpc.CheckpointServiceStub(channel)
        checkpoint = stub.CreateCheckpoint(pb.CreateCheckpointRequest(
            plan_id=str(ULID()), workspace_root=str(workspace)), timeout=60).checkpoint
        for i in range(FILES):
            (workspace / f"f{i:02d}.bin").unlink()  # no live capture keeps the content either
        stream = stub.ExportCheckpoint(pb.ExportCheckpointRequest(checkpoint_id=checkpoint.checkpoint_id),
                                       timeout=120)
        received = len(next(stream).data)
        stub.DeleteCheckpoint(pb.DeleteCheckpointRequest(checkpoint_id=checkpoint.checkpoint_id), timeout=60)
        _collected(server)
        with pytest.raises(grpc.RpcError) as ended:
            for response in stream:
                received += len(response.data)
        assert received < FILES * FILE_BYTES, "the whole archive was sent before the content was collected"
        assert ended.value.code() == grpc.StatusCode.NOT_FOUND, ended.value.details()
        assert error_info(ended.value).reason == "CHECKPOINT_NOT_FOUND"
