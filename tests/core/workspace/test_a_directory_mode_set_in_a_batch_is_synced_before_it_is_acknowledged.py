"""A rollback's changes are durable before it is acknowledged (its writes are synced together at
the batch's flush, before the journal entry goes): a directory's mode is one of those changes. A
rollback whose only change is a directory's mode (the user chmod-ed it), or whose directory had
none of its entries changed, must sync that directory after setting its mode, not leave the new
mode to whenever the file system commits next (the batch flushes nothing, the journal entry goes,
and a power cut puts the user's mode back under a rollback reported done)."""

from __future__ import annotations

import os
import stat
from pathlib import Path

import pytest

from checkpointd.core.restore.restorer import Restorer
from checkpointd.core.store.tree import Change, Entry, EntryKind
from checkpointd.core.workspace import syncbatch
from checkpointd.core.workspace.workspace import Workspace


@pytest.fixture
def synced(monkeypatch: pytest.MonkeyPatch) -> list[tuple[int, int]]:
    """(inode, permission bits) of each directory fsynced, as it was when synced; a syncfs syncs all."""
    calls: list[tuple[int, int]] = []
    real_fsync = os.fsync

    def fsync(fd: int) -> None:
        st = os.fstat(fd)
        if stat.S_ISDIR(st.st_mode):
            calls.append((st.st_ino, stat.S_IMODE(st.st_mode)))
        real_fsync(fd)

    def syncfs(fd: int) -> None:
        calls.append(("syncfs", os.fstat(fd).st_dev))

    monkeypatch.setattr(os, "fsync", fsync)
    monkeypatch.setattr(syncbatch, "_syncfs", syncfs)
    return calls


def _durable(synced: list, directory: Path, mode: int) -> bool:
    return (directory.stat().st_ino, mode) in synced or ("syncfs", directory.stat().st_dev) in synced


def test_a_mode_set_within_a_batch_is_synced_at_its_flush(tmp_path: Path, synced: list) -> None:
    (tmp_path / "d").mkdir(mode=0o755)
    workspace = Workspace(str(tmp_path))
    with workspace.batched_sync() as pending:
        workspace.set_dir_mode("d", 0o700)
        pending.flush()
    assert stat.S_IMODE((tmp_path / "d").stat().st_mode) == 0o700
    assert _durable(synced, tmp_path / "d", 0o700), synced


def test_a_rollback_that_only_changes_a_directorys_mode_syncs_it_before_returning(
        tmp_path: Path, restorer: Restorer, synced: list) -> None:
    ws = tmp_path / "ws"
    (ws / "d").mkdir(parents=True, mode=0o755)
    (ws / "d" / "kept.txt").write_text("unchanged")

    restorer.apply(Workspace(str(ws)), [Change("d", Entry(EntryKind.DIR, 0o755), Entry(EntryKind.DIR, 0o750))])

    assert stat.S_IMODE((ws / "d").stat().st_mode) == 0o750
    assert _durable(synced, ws / "d", 0o750), f"the directory's new mode was never synced: {synced}"


def test_a_new_empty_directorys_mode_is_synced_before_the_rollback_returns(
        tmp_path: Path, restorer: Restorer, synced: list) -> None:
    ws = tmp_path / "ws"
    ws.mkdir()

    restorer.apply(Workspace(str(ws)), [Change("empty", None, Entry(EntryKind.DIR, 0o500))])

    assert stat.S_IMODE((ws / "empty").stat().st_mode) == 0o500
    assert _durable(synced, ws / "empty", 0o500), synced
    (ws / "empty").chmod(0o700)
