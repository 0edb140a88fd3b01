"""A file that opens but whose read fails (EIO from a failing disk, EINVAL from a special file
system such as /proc) is the file's fault, not the store's: the stores raise ``UnreadableSource``
and leave nothing staged, a capture records the file as skipped (unreadable), and a rollback that
would have to replace it refuses with ROLLBACK_CONFLICT naming it, changing nothing (it could not
be kept in the safety checkpoint). Found by an edge sweep: it was INTERNAL."""

from __future__ import annotations

import errno
import os
from collections.abc import Iterator
from pathlib import Path

import pytest

from checkpointd.core.capture.snapshot import SKIP_UNREADABLE
from checkpointd.core.kernel.errors import CheckpointdError, Reason
from checkpointd.core.metadata.db import Database
from checkpointd.core.store import content_store as content_store_module
from checkpointd.core.store.content_store import UnreadableSource
from checkpointd.core.store.db_store import open_store
from tests.core.restore.test_rollback_write_path_attacked import Plan, write


@pytest.fixture(params=["disk", "db"])
def store(request, tmp_path: Path) -> Iterator:
    db = Database(f"sqlite:///{tmp_path / 'meta.db'}")
    db.migrate()
    opened = open_store(request.param, db, tmp_path)
    try:
        yield opened
    finally:
        opened.close()
        db.dispose()


@pytest.mark.parametrize("size", [100, 3 << 20], ids=["packed", "loose"])
def test_a_source_whose_read_fails_is_unreadable_and_leaves_nothing_staged(store, tmp_path: Path, size: int) -> None:
    fd = os.open(tmp_path, os.O_RDONLY | os.O_DIRECTORY)  # opens; every read is EISDIR
    staged_before = {p.name for p in tmp_path.rglob("*")}
    try:
        with store.batch() as batch, pytest.raises(UnreadableSource) as raised:
            batch.put_fd(fd, size)
    finally:
        os.close(fd)
    assert raised.value.errno == errno.EISDIR
    assert {p.name for p in tmp_path.rglob("*")} == staged_before, "a staged file was left behind"


def _failing_reads_of(name: str, monkeypatch) -> None:
    """Every read, by the store, of a file named ``name`` fails with EIO."""
    real = content_store_module._read_all

    def read_all(fd: int, expected_size: int = 1 << 20) -> bytes:
        if os.readlink(f"/proc/self/fd/{fd}").endswith("/" + name):
            raise OSError(errno.EIO, os.strerror(errno.EIO))
        return real(fd, expected_size)

    monkeypatch.setattr(content_store_module, "_read_all", read_all)


def test_a_capture_skips_a_file_whose_read_fails_as_unreadable(plan: Plan, monkeypatch) -> None:
    write(plan.root / "ok.txt", "fine\n")
    write(plan.root / "bad.txt", "on a failing sector\n")
    _failing_reads_of("bad.txt", monkeypatch)
    row = plan.checkpoint()
    assert [skipped[0] for skipped in row.skipped] == ["bad.txt"]
    assert SKIP_UNREADABLE in row.skipped[0]
    files = plan.files_of(row)
    assert "ok.txt" in files and "bad.txt" not in files


def test_a_rollback_that_would_replace_a_file_whose_read_fails_refuses_and_changes_nothing(
        plan: Plan, monkeypatch) -> None:
    write(plan.root / "bad.txt", "target\n")
    write(plan.root / "other.txt", "target other\n")
    target = plan.checkpoint()
    write(plan.root / "bad.txt", "the user's latest, on a failing sector\n")
    write(plan.root / "other.txt", "the user's other\n")
    _failing_reads_of("bad.txt", monkeypatch)
    with pytest.raises(CheckpointdError) as refused:
        plan.rollback(target)
    assert refused.value.reason is Reason.ROLLBACK_CONFLICT
    assert "bad.txt" in str(refused.value)
    assert (plan.root / "bad.txt").read_text() == "the user's latest, on a failing sector\n"
    assert (plan.root / "other.txt").read_text() == "the user's other\n"
