"""README: "Files are replaced atomically (temporary file, fsync, rename)". A power cut is not
something a test can cause, so this records the system calls a restore makes and checks their
order: the complete content is synced under a temporary name, renamed over the file, and the
directory that holds the new name is synced after the rename."""

from __future__ import annotations

import os
import stat
from pathlib import Path

import pytest

from checkpointd.core.workspace.workspace import TEMP_PREFIX, Workspace


@pytest.fixture
def calls(monkeypatch: pytest.MonkeyPatch) -> list[tuple]:
    recorded: list[tuple] = []
    real_fsync, real_rename = os.fsync, os.rename

    def fsync(fd: int) -> None:
        st = os.fstat(fd)
        recorded.append(("fsync-dir" if stat.S_ISDIR(st.st_mode) else "fsync-file", st.st_ino, st.st_size))
        real_fsync(fd)

    def rename(src, dst, *, src_dir_fd=None, dst_dir_fd=None) -> None:
        st = os.lstat(src, dir_fd=src_dir_fd)
        recorded.append(("rename", src, dst, st.st_ino, st.st_size))
        real_rename(src, dst, src_dir_fd=src_dir_fd, dst_dir_fd=dst_dir_fd)

    monkeypatch.setattr(os, "fsync", fsync)
    monkeypatch.setattr(os, "rename", rename)
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
