"""README: "Files are replaced atomically (temporary file, fsync, rename)". A power cut is not
something a test can cause, so this records the system calls a restore makes and checks their
order: the complete content is synced under a temporary name, renamed over the file, and the
directory that holds the new name is synced after the rename.

A rollback batches those syncs (``SyncBatch``): every file is written and renamed first, then
each renamed file (with all of its content) and each directory whose entries changed is synced
before ``Restorer.apply`` returns, which is before the rollback's journal entry goes and the
rollback is acknowledged. An undo keeps one sync per file, before its rename, and syncs the
directory of each change right after it (see test_each_change_of_an_undo_is_synced_before_the_next_begins)."""

from __future__ import annotations

import errno
import hashlib
import os
import stat
from pathlib import Path

import pytest

from checkpointd.core.restore.restorer import ApplyInterrupted, Restorer
from checkpointd.core.store.tree import Change, Entry, EntryKind
from checkpointd.core.workspace import syncbatch
from checkpointd.core.workspace.workspace import TEMP_PREFIX, Workspace
from tests.helpers import descriptors_under


@pytest.fixture
def calls(monkeypatch: pytest.MonkeyPatch) -> list[tuple]:
    recorded: list[tuple] = []
    real_fsync, real_rename, real_unlink = os.fsync, os.rename, os.unlink

    def fsync(fd: int) -> None:
        st = os.fstat(fd)
        recorded.append(("fsync-dir" if stat.S_ISDIR(st.st_mode) else "fsync-file", st.st_ino, st.st_size))
        real_fsync(fd)

    def rename(src, dst, *, src_dir_fd=None, dst_dir_fd=None) -> None:
        st = os.lstat(src, dir_fd=src_dir_fd)
        recorded.append(("rename", src, dst, st.st_ino, st.st_size))
        real_rename(src, dst, src_dir_fd=src_dir_fd, dst_dir_fd=dst_dir_fd)

    def unlink(path, *, dir_fd=None) -> None:
        recorded.append(("unlink", path))
        real_unlink(path, dir_fd=dir_fd)

    monkeypatch.setattr(os, "fsync", fsync)
    monkeypatch.setattr(os, "rename", rename)
    monkeypatch.setattr(os, "unlink", unlink)
    return recorded


def test_a_restored_file_is_synced_complete_under_a_temporary_name_then_renamed_then_its_directory_synced(
    tmp_path: Path, calls: list[tuple]
) -> None:
    (tmp_path / "sub").mkdir()
    (tmp_path / "sub" / "notes.txt").write_text("old")
    content = [b"new ", b"content"]

    Workspace(str(tmp_path)).write_file("sub/notes.txt", iter(content), 0o640)

    assert (tmp_path / "sub" / "notes.txt").read_bytes() == b"new content"
    assert stat.S_IMODE((tmp_path / "sub" / "notes.txt").stat().st_mode) == 0o640
    kinds = [call[0] for call in calls]
    assert kinds == ["fsync-file", "rename", "fsync-dir"], calls
    synced_file, renamed, synced_dir = calls
    assert renamed[1].startswith(TEMP_PREFIX) and renamed[2] == "notes.txt"
    assert synced_file[1] == renamed[3], "the file synced is the one renamed into place"
    assert synced_file[2] == renamed[4] == len(b"new content"), "synced with all of its content"
    assert synced_dir[1] == (tmp_path / "sub").stat().st_ino
    assert [p.name for p in (tmp_path / "sub").iterdir()] == ["notes.txt"]


def test_a_restored_symlink_is_renamed_into_place_and_its_directory_synced(tmp_path: Path, calls: list[tuple]) -> None:
    (tmp_path / "link").write_text("a file that becomes a link")

    Workspace(str(tmp_path)).write_symlink("link", "target.txt")

    assert os.readlink(tmp_path / "link") == "target.txt"
    assert [call[0] for call in calls] == ["rename", "fsync-dir"], calls
    assert calls[1][1] == tmp_path.stat().st_ino


def _stored(restorer: Restorer, content: bytes, mode: int = 0o644) -> Entry:
    with restorer.store.batch() as batch:
        digest = batch.put_bytes(content)
    return Entry(EntryKind.FILE, mode, len(content), digest)


def _entry_of(path: Path) -> Entry:
    data = path.read_bytes()
    return Entry(EntryKind.FILE, stat.S_IMODE(path.stat().st_mode), len(data), hashlib.sha256(data).hexdigest())


def _rollback_changes(restorer: Restorer, root: Path) -> list[Change]:
    """A rollback of several files: two replaced, one created in a new directory, one removed."""
    (root / "ws").mkdir()
    for name in ("a.txt", "b.txt", "gone.txt"):
        (root / "ws" / name).write_text(f"current {name}")
    ws = root / "ws"
    return [
        Change("a.txt", _entry_of(ws / "a.txt"), _stored(restorer, b"target a, longer than before")),
        Change("b.txt", _entry_of(ws / "b.txt"), _stored(restorer, b"target b", 0o755)),
        Change("sub", None, Entry(EntryKind.DIR, 0o755)),
        Change("sub/new.txt", None, _stored(restorer, b"a file the target has in a new directory")),
        Change("gone.txt", _entry_of(ws / "gone.txt"), None),
    ]


def test_a_rollback_renames_every_file_then_syncs_each_complete_and_each_changed_directory_before_returning(
    tmp_path: Path, restorer: Restorer, calls: list[tuple]
) -> None:
    changes = _rollback_changes(restorer, tmp_path)
    ws = tmp_path / "ws"
    calls.clear()

    restorer.apply(Workspace(str(ws)), changes)

    assert (ws / "a.txt").read_bytes() == b"target a, longer than before" and not (ws / "gone.txt").exists()
    kinds = [call[0] for call in calls]
    last_change = max(i for i, kind in enumerate(kinds) if kind in ("rename", "unlink"))
    first_sync = kinds.index("fsync-file")
    assert first_sync > last_change, f"a sync came before the last rename: the rollback was not batched: {calls}"
    synced_files = {(ino, size) for kind, ino, size in (c for c in calls if c[0] == "fsync-file")}
    renamed = [c for c in calls if c[0] == "rename"]
    assert len(renamed) == 3
    for path in ("a.txt", "b.txt", "sub/new.txt"):
        st = (ws / path).stat()
        assert (st.st_ino, st.st_size) in synced_files, f"{path} was renamed into place but never synced complete"
    synced_dirs = {c[1] for c in calls if c[0] == "fsync-dir"}
    assert {ws.stat().st_ino, (ws / "sub").stat().st_ino} <= synced_dirs, \
        "a directory whose entries changed was not synced"
    assert len(synced_dirs) == len([c for c in calls if c[0] == "fsync-dir"]), "a directory was synced twice"


def test_an_undo_syncs_each_file_before_renaming_it(tmp_path: Path, restorer: Restorer, calls: list[tuple]) -> None:
    changes = _rollback_changes(restorer, tmp_path)
    calls.clear()

    ws = tmp_path / "ws"
    restorer.apply(Workspace(str(ws)), changes, batched=False)

    # gone.txt removed (the root synced), then sub made (its own mode synced, then its entry in the
    # root), the three files, sub's mode
    assert [call[0] for call in calls] == (["unlink", "fsync-dir", "fsync-dir", "fsync-dir"]
                                           + ["fsync-file", "rename", "fsync-dir"] * 3 + ["fsync-dir"]), calls
    root, sub = ws.stat().st_ino, (ws / "sub").stat().st_ino
    assert [call[1] for call in calls if call[0] == "fsync-dir"] == [root, sub, root, root, root, sub, sub], calls


def test_what_an_interrupted_rollback_wrote_is_synced_before_it_reports_the_interruption(
    tmp_path: Path, restorer: Restorer, calls: list[tuple]
) -> None:
    """The undo that follows is recorded against these writes: they must be on the disk first."""
    changes = _rollback_changes(restorer, tmp_path)
    ws = tmp_path / "ws"
    (ws / "b.txt").write_text("written by a tool after the safety capture")
    calls.clear()

    with pytest.raises(ApplyInterrupted) as interrupted:
        restorer.apply(Workspace(str(ws)), changes)

    assert interrupted.value.raced and interrupted.value.path == "b.txt"
    assert [path for path, _ in interrupted.value.written] == ["gone.txt", "sub", "a.txt"]
    st = (ws / "a.txt").stat()
    assert ("fsync-file", st.st_ino, st.st_size) in calls
    assert ws.stat().st_ino in {c[1] for c in calls if c[0] == "fsync-dir"}
    assert (ws / "b.txt").read_text() == "written by a tool after the safety capture"


def test_a_batch_that_cannot_be_synced_interrupts_the_rollback_at_the_file_that_failed(
    tmp_path: Path, restorer: Restorer, monkeypatch: pytest.MonkeyPatch
) -> None:
    changes = _rollback_changes(restorer, tmp_path)
    ws = tmp_path / "ws"
    real_fsync = os.fsync

    def failing_fsync(fd: int) -> None:
        if os.fstat(fd).st_size == len(b"target b"):
            raise OSError(errno.EIO, "Input/output error")
        real_fsync(fd)

    monkeypatch.setattr(os, "fsync", failing_fsync)
    with pytest.raises(ApplyInterrupted) as interrupted:
        restorer.apply(Workspace(str(ws)), changes)

    assert interrupted.value.path == "b.txt" and interrupted.value.cause.errno == errno.EIO
    assert {path for path, _ in interrupted.value.written} == {c.path for c in changes}, \
        "every change was made: the undo must see them all"


def test_a_large_batch_is_synced_in_parts_and_keeps_no_descriptor_open(
    tmp_path: Path, calls: list[tuple], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(syncbatch, "MAX_PENDING", 4)
    workspace = Workspace(str(tmp_path))
    with workspace.batched_sync() as pending:
        for i in range(10):
            workspace.write_file(f"f{i}", iter([b"x" * i]), 0o644)
        pending.flush()
    # What the batch opened is under the workspace (its files, its directory). Counting every
    # descriptor of the process failed when an earlier test's background closes landed meanwhile.
    assert descriptors_under(tmp_path) == []
    synced = {(c[1], c[2]) for c in calls if c[0] == "fsync-file"}
    for i in range(10):
        st = (tmp_path / f"f{i}").stat()
        assert (st.st_ino, st.st_size) in synced


def test_a_large_batch_is_synced_with_one_syncfs_per_file_system_after_every_rename(
    tmp_path: Path, restorer: Restorer, calls: list[tuple], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(syncbatch, "SYNCFS_MIN", 1)
    real_syncfs = syncbatch._syncfs

    def syncfs(fd: int) -> None:
        calls.append(("syncfs", os.fstat(fd).st_dev))
        real_syncfs(fd)

    monkeypatch.setattr(syncbatch, "_syncfs", syncfs)
    changes = _rollback_changes(restorer, tmp_path)
    calls.clear()

    restorer.apply(Workspace(str(tmp_path / "ws")), changes)

    assert [c for c in calls if c[0].startswith(("fsync", "syncfs"))] == [("syncfs", tmp_path.stat().st_dev)]
    assert calls[-1][0] == "syncfs", "the file system was synced before the last rename"


def _assert_fsynced_file_by_file(ws: Path, calls: list[tuple]) -> None:
    synced = {(c[1], c[2]) for c in calls if c[0] == "fsync-file"}
    for path in ("a.txt", "b.txt", "sub/new.txt"):
        st = (ws / path).stat()
        assert (st.st_ino, st.st_size) in synced


def test_a_batch_whose_syncfs_fails_is_synced_file_by_file(
    tmp_path: Path, restorer: Restorer, calls: list[tuple], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(syncbatch, "SYNCFS_MIN", 1)

    def failing_syncfs(fd: int) -> None:
        raise OSError(errno.EIO, "Input/output error")

    monkeypatch.setattr(syncbatch, "_syncfs", failing_syncfs)
    changes = _rollback_changes(restorer, tmp_path)
    ws = tmp_path / "ws"
    calls.clear()

    restorer.apply(Workspace(str(ws)), changes)

    _assert_fsynced_file_by_file(ws, calls)


def test_a_batch_flushed_early_that_fails_leaves_no_change_unrecorded(
    tmp_path: Path, restorer: Restorer, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A full batch is flushed as the next file or directory joins it. If that flush fails, the
    step that was joining must not have changed its path yet: the undo takes back only what
    ``written`` lists, so a file renamed into place but left out would keep the target's content."""
    changes = _rollback_changes(restorer, tmp_path)
    ws = tmp_path / "ws"
    # Joins, in order: ws (gone.txt's removal), a.txt, b.txt, sub/new.txt, then sub after new.txt's
    # rename: with five, the early flush comes with that last one.
    monkeypatch.setattr(syncbatch, "MAX_PENDING", 5)
    real_fsync = os.fsync

    def failing_fsync(fd: int) -> None:
        if os.fstat(fd).st_size == len(b"target b"):
            raise OSError(errno.EIO, "Input/output error")
        real_fsync(fd)

    monkeypatch.setattr(os, "fsync", failing_fsync)
    with pytest.raises(ApplyInterrupted) as interrupted:
        restorer.apply(Workspace(str(ws)), changes)

    recorded = {path for path, _ in interrupted.value.written}
    for change in changes:
        on_disk = ws / change.path
        now = None if not os.path.lexists(on_disk) else (
            Entry(EntryKind.DIR, change.target.mode) if on_disk.is_dir() else _entry_of(on_disk))
        changed = (now is None) != (change.base is None) or (
            now is not None and now.kind is EntryKind.FILE and now != change.base)
        assert not changed or change.path in recorded, f"{change.path} was changed but not recorded: {recorded}"


@pytest.mark.parametrize("release, version", [
    ("6.18.44-fc-v1098", (6, 18)), ("5.8.0", (5, 8)), ("5.7.19-arch1", (5, 7)), ("4.19.0-27-amd64", (4, 19)),
    ("5.10+rc1", (5, 10)), ("garbage", (0, 0)), ("", (0, 0)),
])
def test_kernel_versions_are_read_from_the_release_string(release: str, version: tuple[int, int]) -> None:
    assert syncbatch.kernel_version(release) == version


def test_a_kernel_whose_syncfs_hides_write_errors_syncs_file_by_file(
    tmp_path: Path, restorer: Restorer, calls: list[tuple], monkeypatch: pytest.MonkeyPatch
) -> None:
    """Before Linux 5.8 syncfs(2) returns 0 after a writeback error: a batch acknowledged on it could
    be lost, so there the files are fsynced one by one."""
    real = os.uname()
    monkeypatch.setattr(os, "uname", lambda: os.uname_result((real.sysname, real.nodename, "5.4.0-150-generic",
                                                               real.version, real.machine)))
    assert syncbatch._find_syncfs() is None
    monkeypatch.setattr(syncbatch, "_libc_syncfs", syncbatch._find_syncfs())
    monkeypatch.setattr(syncbatch, "SYNCFS_MIN", 1)
    changes = _rollback_changes(restorer, tmp_path)
    ws = tmp_path / "ws"
    calls.clear()

    restorer.apply(Workspace(str(ws)), changes)

    _assert_fsynced_file_by_file(ws, calls)
