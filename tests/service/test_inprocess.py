"""Servicers in-process through pytest-grpc's real-server fixtures (a real grpc.server
and channel), where faults can be injected into the domain underneath."""

from __future__ import annotations

import errno
import os
import threading
import time
from types import SimpleNamespace

import grpc
import pytest
from google.rpc import code_pb2, error_details_pb2
from ulid import ULID

from checkpoint.v1 import checkpoint_service_pb2 as pb
from checkpoint.v1 import checkpoint_service_pb2_grpc, config_service_pb2_grpc
from checkpointd.api.checkpoint_servicer import CheckpointServicer
from checkpointd.api.config_servicer import ConfigServicer
from checkpointd.api.errors import to_status
from checkpointd.api.interceptors import ErrorInterceptor
from checkpointd.core.config.registry import ConfigStore
from checkpointd.core.engine.checkpoints import Checkpoints
from checkpointd.core.engine.requests import EngineSettings
from checkpointd.core.kernel import telemetry
from checkpointd.core.kernel.cancellation import Cancellation, Why
from checkpointd.core.metadata.db import Database
from checkpointd.core.store import content_store as store_module
from checkpointd.core.store.content_store import ContentStore
from checkpointd.core.workspace.workspace import Workspace
from tests.helpers import error_info

grpc_max_workers = 16


@pytest.fixture(scope="module")
def engine(tmp_path_factory):
    base = tmp_path_factory.mktemp("inprocess")
    (base / "workspaces").mkdir()
    db = Database(f"sqlite:///{base / 'meta.db'}")
    db.create_schema()
    config = ConfigStore(db)
    store = ContentStore(base / "store")
    checkpoints = Checkpoints(db, store, config, EngineSettings(base / "data", (str(base / "workspaces"),)))
    return SimpleNamespace(base=base, checkpoints=checkpoints, config=config, store=store)


@pytest.fixture(scope="module")
def grpc_interceptors():
    return [ErrorInterceptor()]


@pytest.fixture(scope="module")
def grpc_servicer(engine):
    return SimpleNamespace(checkpoint=CheckpointServicer(engine.checkpoints),
                           config=ConfigServicer(engine.config, lambda: False))


@pytest.fixture(scope="module")
def grpc_add_to_server():
    def add(servicer, server):
        checkpoint_service_pb2_grpc.add_CheckpointServiceServicer_to_server(servicer.checkpoint, server)
        config_service_pb2_grpc.add_ConfigServiceServicer_to_server(servicer.config, server)

    return add


@pytest.fixture(scope="module")
def grpc_stub_cls():
    return checkpoint_service_pb2_grpc.CheckpointServiceStub


@pytest.fixture
def ws(engine):
    path = engine.base / "workspaces" / str(ULID())
    path.mkdir()
    (path / "file.txt").write_text("content")
    return path


def test_unexpected_failure_is_internal_with_error_info_and_the_server_keeps_serving(grpc_stub, engine,
                                                                                     monkeypatch):
    def explode(*_args, **_kwargs):
        raise RuntimeError("bug")

    monkeypatch.setattr(engine.checkpoints, "get", explode)
    with pytest.raises(grpc.RpcError) as caught:
        grpc_stub.GetCheckpoint(pb.GetCheckpointRequest(checkpoint_id=str(ULID())))
    assert caught.value.code() == grpc.StatusCode.INTERNAL
    assert "bug" not in caught.value.details()
    assert error_info(caught.value).reason == "INTERNAL"
    monkeypatch.undo()
    assert grpc_stub.ListCheckpoints(pb.ListCheckpointsRequest(plan_id=str(ULID()))).checkpoints == []


def test_disk_full_is_resource_exhausted_and_records_nothing(grpc_stub, engine, ws, monkeypatch):
    """Every way the store writes (pack appends, staged large objects) runs out of space."""
    plan_id = str(ULID())
    store_root = str(engine.store.root)
    real_open = store_module.os.open

    def no_space(*_args, **_kwargs):
        raise OSError(errno.ENOSPC, "No space left on device")

    def full_open(path, flags, *args, **kwargs):
        if str(path).startswith(store_root) and flags & os.O_CREAT:
            no_space()
        return real_open(path, flags, *args, **kwargs)

    monkeypatch.setattr(store_module.os, "open", full_open)
    monkeypatch.setattr(store_module.os, "pwrite", no_space)
    (ws / "new-content.txt").write_text("never stored before " + plan_id)
    (ws / "large.bin").write_bytes(os.urandom(2 << 20))
    with pytest.raises(grpc.RpcError) as caught:
        grpc_stub.CreateCheckpoint(pb.CreateCheckpointRequest(plan_id=plan_id, workspace_root=str(ws)))
    assert caught.value.code() == grpc.StatusCode.RESOURCE_EXHAUSTED
    assert error_info(caught.value).reason == "STORAGE_EXHAUSTED"
    monkeypatch.undo()
    assert grpc_stub.ListCheckpoints(pb.ListCheckpointsRequest(plan_id=plan_id)).checkpoints == []
    assert list(engine.store.staging.iterdir()) == []
    created = grpc_stub.CreateCheckpoint(pb.CreateCheckpointRequest(plan_id=plan_id, workspace_root=str(ws)))
    assert created.checkpoint.sequence == 1 and created.checkpoint.file_count == 3
    (ws / "large.bin").unlink()


@pytest.mark.parametrize("code", [errno.EMFILE, errno.ENFILE, errno.ENOMEM])
def test_a_server_short_of_descriptors_or_memory_is_unavailable_and_records_nothing(grpc_stub, ws, monkeypatch, code):
    """Retryable, unlike a full disk; never INTERNAL, and never a checkpoint without the file."""
    plan_id = str(ULID())
    real_open = os.open

    def short_open(path, flags, *args, **kwargs):
        if path == "file.txt":
            raise OSError(code, os.strerror(code))
        return real_open(path, flags, *args, **kwargs)

    monkeypatch.setattr(os, "open", short_open)
    with pytest.raises(grpc.RpcError) as caught:
        grpc_stub.CreateCheckpoint(pb.CreateCheckpointRequest(plan_id=plan_id, workspace_root=str(ws)))
    assert caught.value.code() == grpc.StatusCode.UNAVAILABLE, caught.value.details()
    assert error_info(caught.value).reason == "SERVER_RESOURCES_EXHAUSTED"
    monkeypatch.undo()
    assert grpc_stub.ListCheckpoints(pb.ListCheckpointsRequest(plan_id=plan_id)).checkpoints == []
    created = grpc_stub.CreateCheckpoint(pb.CreateCheckpointRequest(plan_id=plan_id, workspace_root=str(ws)))
    assert created.checkpoint.sequence == 1 and created.checkpoint.file_count == 1


def test_concurrent_creates_on_one_plan_get_gap_free_sequences(grpc_stub, ws):
    plan_id = str(ULID())
    grpc_stub.CreateCheckpoint(pb.CreateCheckpointRequest(plan_id=plan_id, workspace_root=str(ws)))
    sequences, errors = [], []

    def worker(n):
        try:
            for i in range(10):
                (ws / f"w{n}.txt").write_text(str(i))
                reply = grpc_stub.CreateCheckpoint(pb.CreateCheckpointRequest(plan_id=plan_id))
                sequences.append(reply.checkpoint.sequence)
        except grpc.RpcError as exc:
            errors.append(exc)

    threads = [threading.Thread(target=worker, args=(n,)) for n in range(6)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not errors
    assert sorted(sequences) == list(range(2, 62))


def test_a_caller_who_gives_up_stops_the_live_diff_and_the_plan_is_free(grpc_stub, ws, monkeypatch):
    """On a sync grpc.server the call's termination callback sets its token (see
    ``kernel.cancellation``): the deadline of a diff against the live workspace passes while its
    capture reads .gitignore files, made slow here; it stops before the rest and is counted, and
    the plan's next calls go through."""
    for i in range(20):
        (ws / f"d{i:02}").mkdir()
        (ws / f"d{i:02}" / ".gitignore").write_text("*.log\n")
    plan_id = str(ULID())
    base = grpc_stub.CreateCheckpoint(pb.CreateCheckpointRequest(plan_id=plan_id, workspace_root=str(ws)),
                                      timeout=30).checkpoint
    (ws / "d19" / "new.txt").write_text("new since the checkpoint\n")
    for i in range(20):  # read again by the diff's capture
        (ws / f"d{i:02}" / ".gitignore").write_text("*.log\n*.tmp\n")
    reads: list[str] = []
    real_read = Workspace.read_small

    def slow_read(self, path, *args):
        reads.append(path)
        time.sleep(0.25)
        return real_read(self, path, *args)

    abandoned: list[tuple[str, str]] = []

    class Recorder(telemetry.Sink):
        def capture_abandoned(self, operation: str, why: str) -> None:
            abandoned.append((operation, why))

    recorder = Recorder()
    telemetry.bind(recorder)
    monkeypatch.setattr(Workspace, "read_small", slow_read)
    try:
        with pytest.raises(grpc.RpcError) as caught:
            grpc_stub.DiffCheckpoints(pb.DiffCheckpointsRequest(base_checkpoint_id=base.checkpoint_id), timeout=0.75)
        assert caught.value.code() == grpc.StatusCode.DEADLINE_EXCEEDED
        waited = threading.Event()
        for _ in range(600):
            if abandoned:
                break
            waited.wait(0.05)
        assert abandoned == [("diff", "deadline_exceeded")]
        assert len(reads) < 20, "the capture stopped before its last directory"
    finally:
        telemetry.unbind(recorder)
        monkeypatch.undo()
    diff = grpc_stub.DiffCheckpoints(pb.DiffCheckpointsRequest(base_checkpoint_id=base.checkpoint_id), timeout=30)
    assert [c.path for c in diff.changes] == [*(f"d{i:02}/.gitignore" for i in range(20)), "d19/new.txt"]
    created = grpc_stub.CreateCheckpoint(pb.CreateCheckpointRequest(plan_id=plan_id), timeout=30)
    assert created.checkpoint.sequence == 2 and created.checkpoint.file_count == 22


@pytest.mark.parametrize(("why", "code"), [(Why.CANCELLED, code_pb2.CANCELLED),
                                           (Why.DEADLINE_EXCEEDED, code_pb2.DEADLINE_EXCEEDED)])
def test_work_given_up_on_ends_cancelled_or_deadline_exceeded_with_its_reason_never_internal(why, code):
    """What the stopped work raises, should it reach a status (a sync server's call): the code of
    what happened, with ErrorInfo reason CALL_ABANDONED."""
    cancel = Cancellation()
    cancel.cancel(why)
    status = to_status(cancel.error())
    info = error_details_pb2.ErrorInfo()
    assert status.details[0].Unpack(info)
    assert (status.code, info.reason, info.domain) == (code, "CALL_ABANDONED", "checkpointd")
