"""The database store out of room: staging a large object on a full disk, or a commit the database
refuses for want of resources (SQLSTATE class 53), is STORAGE_EXHAUSTED (RESOURCE_EXHAUSTED to a
client, never INTERNAL); any other database error is raised as itself. Either way the batch is
aborted: nothing staged is left, and its callers are told it did not commit. Also what an
interrupted batch left in the staging directory is dropped when the store opens (nothing ever
referenced it)."""

from __future__ import annotations

import errno
import os

import psycopg
import pytest
from sqlalchemy.exc import IntegrityError, OperationalError

from checkpointd.core.kernel.errors import Reason, ResourceExhausted
from checkpointd.core.store import db_store
from checkpointd.core.store.db_store import DatabaseStore

MIB = 1 << 20


def a_full_disk(monkeypatch) -> None:
    """Staged files are opened on /dev/full: every write fails with the kernel's own ENOSPC."""
    monkeypatch.setattr(db_store, "private_opener", lambda _path, _flags: os.open("/dev/full", os.O_WRONLY))


@pytest.mark.parametrize("how", ["put_bytes", "put_fd"])
def test_staging_a_large_object_on_a_full_disk_is_storage_exhausted(objects, tmp_path, monkeypatch, how):
    content = os.urandom(MIB + 1)
    source = tmp_path / "big.bin"
    source.write_bytes(content)
    a_full_disk(monkeypatch)
    with objects.batch() as batch, pytest.raises(ResourceExhausted) as raised:
        if how == "put_bytes":
            batch.put_bytes(content)
        else:
            fd = os.open(source, os.O_RDONLY)
            try:
                batch.put_fd(fd, len(content))
            finally:
                os.close(fd)
    assert raised.value.reason is Reason.STORAGE_EXHAUSTED
    assert list(objects.staging.iterdir()) == []


def refused_commit(objects, error: Exception, monkeypatch) -> tuple[pytest.ExceptionInfo, list[bool]]:
    """A batch (one small, one large object) whose transaction the database refuses with ``error``."""
    def insert(_connection, _pending) -> None:
        raise error

    monkeypatch.setattr(objects, "_insert", insert)
    outcomes: list[bool] = []
    batch = objects.batch()
    batch.when_finished(outcomes.append)
    digests = [batch.put_bytes(b"small"), batch.put_bytes(os.urandom(MIB + 1))]
    with pytest.raises(Exception) as raised:
        batch.commit()
    assert list(objects.staging.iterdir()) == [], "a staged file was left behind"
    assert [objects.has(digest) for digest in digests] == [False, False]
    return raised, outcomes


def test_a_commit_the_database_refuses_for_want_of_room_is_storage_exhausted(objects, monkeypatch):
    full = OperationalError("INSERT INTO objects", (), psycopg.errors.DiskFull("could not extend file"))
    raised, outcomes = refused_commit(objects, full, monkeypatch)
    assert isinstance(raised.value, ResourceExhausted)
    assert raised.value.reason is Reason.STORAGE_EXHAUSTED
    assert outcomes == [False]


def test_a_commit_refused_for_another_reason_raises_that_error(objects, monkeypatch):
    clash = IntegrityError("INSERT INTO object_chunks", (), psycopg.errors.UniqueViolation("duplicate key"))
    raised, outcomes = refused_commit(objects, clash, monkeypatch)
    assert raised.value is clash
    assert outcomes == [False]


def test_what_an_interrupted_batch_left_staged_is_dropped_when_the_store_opens(database, tmp_path):
    staging = tmp_path / "staging"
    first = DatabaseStore(database, staging)
    batch = first.batch()
    batch.put_bytes(os.urandom(MIB + 1))  # staged in a file; the process is then killed
    first.close()
    assert len(list(staging.iterdir())) == 1
    DatabaseStore(database, staging).close()
    assert list(staging.iterdir()) == []


@pytest.mark.parametrize("code", [errno.EIO, errno.EACCES])
def test_other_staging_errors_are_raised_as_themselves(objects, monkeypatch, code):
    def failing(_path, _flags):
        raise OSError(code, os.strerror(code))

    monkeypatch.setattr(db_store, "private_opener", failing)
    with objects.batch() as batch, pytest.raises(OSError) as raised:
        batch.put_bytes(os.urandom(MIB + 1))
    assert raised.value.errno == code and not isinstance(raised.value, ResourceExhausted)
