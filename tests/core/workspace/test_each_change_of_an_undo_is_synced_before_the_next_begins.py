"""An undo (``Restorer.apply(..., batched=False)``, from recovery) takes back only the paths that
still hold what its rollback wrote, and its journal entry is removed right after it without a
sync: the next synced commit of any checkpoint makes that removal durable, while nothing ever
syncs the workspace again. So each change the undo makes must be on the disk before the next one
begins (and the last before ``apply`` returns): not only each file's content and its new name, but
a removal (unlink, rmdir) and a new directory (mkdir), whose entry lives in the parent directory,
and a directory's mode. Otherwise a power cut after the entry's removal is durable brings back
what the undo removed, or takes away a directory it made again with the user's files in it (a
file's fsync does not make its directory's entry in *its* parent durable), and no entry is left
to finish the undo.

A power cut is not something a test can cause: this records each directory fsync with what the
directory held and its mode at that moment, and ``keep_going`` (called before each change) marks
where one change ends and the next begins."""

from __future__ import annotations

import hashlib
import os
import stat
from pathlib import Path

import pytest

from checkpointd.core.restore.restorer import Restorer
from checkpointd.core.store.tree import Change, Entry, EntryKind
from checkpointd.core.workspace.workspace import Workspace

#: Marks the start of a change (``keep_going``) and the return of ``apply``.
STEP, DONE = "step", "done"


@pytest.fixture
def events(monkeypatch: pytest.MonkeyPatch) -> list[tuple]:
    """(STEP,), (DONE,), and ("sync", inode, permission bits, names held) of each directory fsynced."""
    recorded: list[tuple] = []
    real_fsync = os.fsync

    def fsync(fd: int) -> None:
        st = os.fstat(fd)
        if stat.S_ISDIR(st.st_mode):
            recorded.append(("sync", st.st_ino, stat.S_IMODE(st.st_mode), frozenset(os.listdir(fd))))
        real_fsync(fd)

    monkeypatch.setattr(os, "fsync", fsync)
    return recorded


def _undo(restorer: Restorer, ws: Path, changes: list[Change], events: list[tuple]) -> list[list[tuple]]:
    """Applies ``changes`` as an undo; the directory syncs made during each change, in order."""
    events.clear()
    restorer.apply(Workspace(str(ws)), changes, batched=False, keep_going=lambda: events.append((STEP,)))
    events.append((DONE,))
    assert events[0] == (STEP,), "something was synced before the first change"
    steps: list[list[tuple]] = []
    for event in events:
        if event[0] == STEP:
            steps.append([])
        elif event[0] != DONE:
            steps[-1].append(event)
    return steps


def _entry_of(path: Path) -> Entry:
    data = path.read_bytes()
    return Entry(EntryKind.FILE, stat.S_IMODE(path.stat().st_mode), len(data), hashlib.sha256(data).hexdigest())


def _stored(restorer: Restorer, content: bytes, mode: int = 0o644) -> Entry:
    with restorer.store.batch() as batch:
        digest = batch.put_bytes(content)
    return Entry(EntryKind.FILE, mode, len(content), digest)


def _synced(step: list[tuple], directory: Path) -> list[tuple[int, frozenset]]:
    """(mode, names) of each sync of ``directory`` in ``step``."""
    ino = directory.stat().st_ino
    return [(mode, names) for _sync, synced_ino, mode, names in step if synced_ino == ino]


def test_a_file_the_undo_removes_is_gone_from_its_synced_directory_before_the_next_change(
        tmp_path: Path, restorer: Restorer, events: list[tuple]) -> None:
    ws = tmp_path / "ws"
    (ws / "a").mkdir(parents=True)
    (ws / "a" / "written-by-the-rollback.txt").write_text("the rollback's file")
    (ws / "also-the-rollbacks").mkdir()
    changes = [Change("a/written-by-the-rollback.txt", _entry_of(ws / "a" / "written-by-the-rollback.txt"), None),
               Change("also-the-rollbacks", Entry(EntryKind.DIR, 0o755), None)]

    unlink, _rmdir = _undo(restorer, ws, changes, events)

    assert not (ws / "a" / "written-by-the-rollback.txt").exists()
    assert any("written-by-the-rollback.txt" not in names for _mode, names in _synced(unlink, ws / "a")), \
        f"the unlink's directory was not synced before the next change: {unlink}"


def test_a_directory_the_undo_removes_is_gone_from_its_synced_parent_before_apply_returns(
        tmp_path: Path, restorer: Restorer, events: list[tuple]) -> None:
    ws = tmp_path / "ws"
    (ws / "made-by-the-rollback").mkdir(parents=True)

    (rmdir,) = _undo(restorer, ws, [Change("made-by-the-rollback", Entry(EntryKind.DIR, 0o755), None)], events)

    assert not (ws / "made-by-the-rollback").exists()
    assert any("made-by-the-rollback" not in names for _mode, names in _synced(rmdir, ws)), \
        f"the rmdir's parent was not synced: {rmdir}"


def test_a_directory_the_undo_makes_again_is_in_its_synced_parent_before_files_go_into_it(
        tmp_path: Path, restorer: Restorer, events: list[tuple]) -> None:
    """The rollback had removed ``kept`` and the user's file in it; the undo makes both again. The
    file's own syncs (its content, then ``kept``) leave ``kept``'s entry in the root unsynced."""
    ws = tmp_path / "ws"
    ws.mkdir()
    changes = [Change("kept", None, Entry(EntryKind.DIR, 0o750)),
               Change("kept/users-file.txt", None, _stored(restorer, b"the user's work"))]

    mkdir, write, set_mode = _undo(restorer, ws, changes, events)

    assert (ws / "kept" / "users-file.txt").read_bytes() == b"the user's work"
    assert any("kept" in names for _mode, names in _synced(mkdir, ws)), \
        f"the new directory's entry in its parent was not synced before the next change: {mkdir}"
    assert any("users-file.txt" in names for _mode, names in _synced(write, ws / "kept")), write
    assert (0o750, frozenset({"users-file.txt"})) in _synced(set_mode, ws / "kept"), \
        f"the directory's mode was not synced: {set_mode}"


def test_a_directory_mode_the_undo_sets_back_is_synced_before_apply_returns(
        tmp_path: Path, restorer: Restorer, events: list[tuple]) -> None:
    ws = tmp_path / "ws"
    (ws / "d").mkdir(parents=True, mode=0o700)
    (ws / "d" / "unchanged.txt").write_text("not the undo's")

    _keep_it, set_mode = _undo(restorer, ws, [Change("d", Entry(EntryKind.DIR, 0o700), Entry(EntryKind.DIR, 0o751))],
                               events)

    assert stat.S_IMODE((ws / "d").stat().st_mode) == 0o751
    assert any(mode == 0o751 for mode, _names in _synced(set_mode, ws / "d")), \
        f"the directory's new mode was not synced: {set_mode}"


def test_a_removal_in_a_read_only_directory_is_synced_with_the_directorys_mode_set_back(
        tmp_path: Path, restorer: Restorer, events: list[tuple]) -> None:
    """The directory is made owner-writable for the removal (a window) and set back right after:
    the sync that makes the removal durable comes after that, so it holds the user's mode too."""
    ws = tmp_path / "ws"
    (ws / "read-only").mkdir(parents=True)
    (ws / "read-only" / "written-by-the-rollback.txt").write_text("the rollback's file")
    (ws / "read-only").chmod(0o555)
    try:
        (unlink,) = _undo(restorer, ws, [Change("read-only/written-by-the-rollback.txt",
                                                _entry_of(ws / "read-only" / "written-by-the-rollback.txt"), None)],
                          events)

        assert stat.S_IMODE((ws / "read-only").stat().st_mode) == 0o555
        assert (0o555, frozenset()) in _synced(unlink, ws / "read-only"), \
            f"the removal was not synced after the directory's mode was set back: {unlink}"
    finally:
        (ws / "read-only").chmod(0o755)


def test_a_file_the_undo_writes_in_a_read_only_directory_is_synced_again_once_the_mode_is_set_back(
        tmp_path: Path, restorer: Restorer, events: list[tuple]) -> None:
    """The rename is synced right after it, while the directory is still owner-writable: the
    user's mode, set back after that, needs a sync of its own."""
    ws = tmp_path / "ws"
    (ws / "read-only").mkdir(parents=True)
    (ws / "read-only").chmod(0o555)
    try:
        (write,) = _undo(restorer, ws, [Change("read-only/users-file.txt", None,
                                               _stored(restorer, b"the user's work"))], events)

        assert (ws / "read-only" / "users-file.txt").read_bytes() == b"the user's work"
        assert stat.S_IMODE((ws / "read-only").stat().st_mode) == 0o555
        assert _synced(write, ws / "read-only")[-1] == (0o555, frozenset({"users-file.txt"})), \
            f"the directory's mode set back after the write was not synced: {write}"
    finally:
        (ws / "read-only").chmod(0o755)
