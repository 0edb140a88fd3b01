"""LookBatch, the batch of a look at the live workspace: file contents hashed, never stored; the
directory nodes in the store's batch; never committed; nothing it hashed is reusable by another
batch (both store kinds)."""

from __future__ import annotations

import errno
import hashlib
import os
from collections.abc import Iterator
from pathlib import Path

import pytest

from checkpointd.core.capture.look import LookBatch
from checkpointd.core.kernel.errors import DataLoss
from checkpointd.core.metadata.db import Database
from checkpointd.core.store.content_store import UnreadableSource, digest_bytes
from checkpointd.core.store.db_store import open_store
from checkpointd.core.workspace.readworker import COMPRESS_LIMIT


@pytest.fixture(params=["disk", "db"])
def store(request, tmp_path: Path) -> Iterator:
    db = Database(f"sqlite:///{tmp_path / 'meta.db'}")
    db.migrate()
    opened = open_store(request.param, db, tmp_path / "store")
    try:
        yield opened
    finally:
        opened.close()
        db.dispose()


def _fd_of(path: Path, data: bytes) -> int:
    path.write_bytes(data)
    return os.open(path, os.O_RDONLY)


@pytest.mark.parametrize("size", [0, 100, COMPRESS_LIMIT + 1], ids=["empty", "packed", "loose"])
def test_a_look_hashes_a_file_without_storing_it(store, tmp_path: Path, size: int) -> None:
    data = os.urandom(size)
    fd = _fd_of(tmp_path / "f", data)
    look = LookBatch(store.batch())
    digest = digest_bytes(data)
    try:
        assert look.put_fd(fd, size) == (hashlib.sha256(data).hexdigest(), size)
        # Not even readable as an object of the open batch (as what a batch writes is).
        with pytest.raises(DataLoss):
            store.read_bytes(digest)
    finally:
        os.close(fd)
        look.abort()
    assert look.reuse(digest)
    assert not store.has(digest)
    with store.batch() as other:
        assert not other.reuse(digest)


def test_a_look_reads_a_file_to_its_end_whatever_size_was_expected(store, tmp_path: Path) -> None:
    data = b"grew since its stat\n" * 1000
    fd = _fd_of(tmp_path / "f", data)
    look = LookBatch(store.batch())
    try:
        assert look.put_fd(fd, 10) == (digest_bytes(data), len(data))
    finally:
        os.close(fd)
        look.abort()


def test_a_look_stores_its_nodes_until_it_is_dropped(store) -> None:
    look = LookBatch(store.batch())
    node = b"a directory node"
    digest = look.put_bytes(node)
    assert store.read_bytes(digest) == node
    look.abort()
    assert not store.has(digest)
    with pytest.raises(DataLoss):
        store.read_bytes(digest)


def test_a_look_is_never_committed(store, tmp_path: Path) -> None:
    finished = []
    look = LookBatch(store.batch())
    look.when_finished(finished.append)
    fd = _fd_of(tmp_path / "f", b"content")
    try:
        digest, _size = look.put_fd(fd, 7)
    finally:
        os.close(fd)
    with pytest.raises(RuntimeError):
        look.commit()
    look.abort()
    assert finished == [False]
    assert not store.has(digest)


def test_a_read_that_fails_is_the_files_fault(store, tmp_path: Path) -> None:
    fd = os.open(tmp_path, os.O_RDONLY | os.O_DIRECTORY)  # opens; every read is EISDIR
    look = LookBatch(store.batch())
    try:
        with pytest.raises(UnreadableSource) as raised:
            look.put_fd(fd, 100)
    finally:
        os.close(fd)
        look.abort()
    assert raised.value.errno == errno.EISDIR
