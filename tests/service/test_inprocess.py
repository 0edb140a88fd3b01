"""Servicers in-process through pytest-grpc's real-server fixtures (a real grpc.server
and channel), where faults can be injected into the domain underneath."""

from __future__ import annotations

import errno
import os
import threading
from types import SimpleNamespace

import grpc
import pytest
from ulid import ULID

from checkpoint.v1 import checkpoint_service_pb2 as pb
from checkpoint.v1 import checkpoint_service_pb2_grpc, config_service_pb2_grpc
from checkpointd.api.checkpoint_servicer import CheckpointServicer
from checkpointd.api.config_servicer import ConfigServicer
from checkpointd.api.interceptors import ErrorInterceptor
from checkpointd.core.config.registry import ConfigStore
from checkpointd.core.engine.checkpoints import Checkpoints
from checkpointd.core.engine.requests import EngineSettings
from checkpointd.core.metadata.db import Database
from checkpointd.core.store import content_store as store_module
from checkpointd.core.store.content_store import ContentStore
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
