"""Within a batch, a file about to be replaced is first held open (``Workspace._hold``, an O_PATH
reference, so that its blocks are freed off the rollback's path). Holding it is an optimisation,
never a reason to fail: a file deleted between the ``lstat`` that found it and the open that would
hold it is simply not held, and the change goes on to its check. A plain write replaces nothing
then and writes the file; a rollback's check sees the deletion, made after the safety capture,
and stops as a race (``ROLLBACK_CONFLICT``, "it changed after the rollback's safety checkpoint"),
leaving the path deleted, as the user left it.

The deletion is made real, inside the open that would hold the file (the one call with O_PATH)."""

from __future__ import annotations

import hashlib
import os
import stat
from pathlib import Path

import pytest

from checkpointd.core.restore.restorer import ApplyInterrupted, Restorer
from checkpointd.core.store.tree import Change, Entry, EntryKind
from checkpointd.core.workspace.workspace import TEMP_PREFIX, Workspace

pytestmark = pytest.mark.skipif(not hasattr(os, "O_PATH"), reason="files are held only where O_PATH exists")


@pytest.fixture
def deleted_as_held(monkeypatch: pytest.MonkeyPatch) -> list[str]:
    """Each file deleted right before an O_PATH open of it (the names, in order)."""
    deleted: list[str] = []
    real_open = os.open

    def open_(path, flags, mode=0o777, *, dir_fd=None):
        if flags & os.O_PATH and not stat.S_ISDIR(os.lstat(path, dir_fd=dir_fd).st_mode):
            os.unlink(path, dir_fd=dir_fd)
            deleted.append(path)
        return real_open(path, flags, mode, dir_fd=dir_fd)

    monkeypatch.setattr(os, "open", open_)
    return deleted


def test_a_batched_write_over_a_file_deleted_as_it_would_be_held_writes_the_file(
        tmp_path: Path, deleted_as_held: list[str]) -> None:
    (tmp_path / "f.txt").write_text("about to be replaced")
    workspace = Workspace(str(tmp_path))

    with workspace.batched_sync() as pending:
        workspace.write_file("f.txt", iter([b"new content"]), 0o644)
        pending.flush()

    assert deleted_as_held == ["f.txt"], "the file was never about to be held: this test tests nothing"
    assert (tmp_path / "f.txt").read_bytes() == b"new content"
    assert [p.name for p in tmp_path.iterdir()] == ["f.txt"]


def test_a_rollback_over_a_file_deleted_as_it_would_be_held_stops_as_a_race_and_leaves_it_deleted(
        tmp_path: Path, restorer: Restorer, deleted_as_held: list[str]) -> None:
    ws = tmp_path / "ws"
    ws.mkdir()
    (ws / "f.txt").write_text("captured by the safety checkpoint")
    data = (ws / "f.txt").read_bytes()
    captured = Entry(EntryKind.FILE, 0o644, len(data), hashlib.sha256(data).hexdigest())
    (ws / "f.txt").chmod(0o644)
    with restorer.store.batch() as batch:
        target = Entry(EntryKind.FILE, 0o644, len(b"the target"), batch.put_bytes(b"the target"))

    with pytest.raises(ApplyInterrupted) as interrupted:
        restorer.apply(Workspace(str(ws)), [Change("f.txt", captured, target)])

    assert deleted_as_held == ["f.txt"], "the file was never about to be held: this test tests nothing"
    assert interrupted.value.raced, f"not stopped as a race: {interrupted.value.cause!r}"
    assert interrupted.value.path == "f.txt" and interrupted.value.written == []
    assert not any(p.name.startswith(TEMP_PREFIX) for p in ws.iterdir())
    assert list(ws.iterdir()) == [], "the user's deletion was undone"
