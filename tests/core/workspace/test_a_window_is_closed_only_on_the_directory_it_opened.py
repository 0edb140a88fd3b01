"""An owner-write window names its directory by device, inode and birth time (``Window``), so a
directory made after a kill, which may get the freed inode number, is never taken for it: the
birth time read (``born_ns``) is the directory's creation, unchanged by later changes. Whoever
finishes a rollback killed with a window open sets the mode back (``Workspace.close_window``) only
on that directory, and only as the window left it (not after the user chmod-ed it)."""

from __future__ import annotations

import os
import stat
from pathlib import Path

import pytest

from checkpointd.core.workspace import windows
from checkpointd.core.workspace.windows import Window, born_ns
from checkpointd.core.workspace.workspace import Workspace


def test_a_directorys_birth_time_is_its_creation_and_stays(tmp_path: Path) -> None:
    (tmp_path / "d").mkdir()
    fd = os.open(tmp_path / "d", os.O_RDONLY | os.O_DIRECTORY)
    try:
        created = os.fstat(fd).st_ctime_ns
        born = born_ns(fd)
        assert born == created, "no birth time read (this test expects a file system that keeps one)"
        os.chmod(tmp_path / "d", 0o700)
        (tmp_path / "d" / "f").write_text("x")
        assert born_ns(fd) == born
    finally:
        os.close(fd)


def test_a_window_is_its_directory_only_with_the_same_inode_and_birth(tmp_path: Path) -> None:
    (tmp_path / "d").mkdir()
    st = os.stat(tmp_path / "d")
    window = Window("d", 0o555, st.st_dev, st.st_ino, 1000)
    assert window.writable == 0o755
    assert window.same_directory(st, 1000)
    assert window.same_directory(st, 0), "a birth time unknown now: the inode decides"
    assert Window("d", 0o555, st.st_dev, st.st_ino, 0).same_directory(st, 1000)
    assert not window.same_directory(st, 1001), "born again with the freed inode"
    assert not Window("d", 0o555, st.st_dev, st.st_ino + 1, 1000).same_directory(st, 1000)
    assert not Window("d", 0o555, st.st_dev + 1, st.st_ino, 1000).same_directory(st, 1000)


def test_without_statx_in_the_c_library_no_birth_time_is_known(tmp_path: Path, monkeypatch) -> None:
    monkeypatch.setattr(windows, "_statx", None)
    fd = os.open(tmp_path, os.O_RDONLY | os.O_DIRECTORY)
    try:
        assert born_ns(fd) == 0
    finally:
        os.close(fd)


def _window_of(directory: Path, mode: int, born: int | None = None) -> Window:
    st = os.stat(directory)
    fd = os.open(directory, os.O_RDONLY | os.O_DIRECTORY)
    try:
        return Window(directory.name, mode, st.st_dev, st.st_ino, born_ns(fd) if born is None else born)
    finally:
        os.close(fd)


def test_a_window_a_kill_left_open_is_closed_only_on_its_directory_as_it_was_left(tmp_path: Path) -> None:
    workspace = Workspace(str(tmp_path))
    (tmp_path / "d").mkdir(mode=0o755)
    window = _window_of(tmp_path / "d", 0o555)
    assert workspace.close_window(window) is True
    assert stat.S_IMODE((tmp_path / "d").stat().st_mode) == 0o555

    (tmp_path / "d").chmod(0o700)  # the user's mode since
    assert workspace.close_window(window) is False
    assert stat.S_IMODE((tmp_path / "d").stat().st_mode) == 0o700

    (tmp_path / "d").chmod(0o755)
    assert workspace.close_window(_window_of(tmp_path / "d", 0o555, born=1)) is False, "born again at the path"
    assert workspace.close_window(_window_of(tmp_path / "d", 0o755)) is False, "no window: it was writable"
    assert stat.S_IMODE((tmp_path / "d").stat().st_mode) == 0o755

    os.rename(tmp_path / "d", tmp_path / "moved")
    assert workspace.close_window(window) is False, "gone from the path"
    (tmp_path / "d").symlink_to(tmp_path / "moved")
    assert workspace.close_window(window) is False, "a symlink at the path is never followed"
    assert stat.S_IMODE((tmp_path / "moved").stat().st_mode) == 0o755


class _Journal:
    def __init__(self) -> None:
        self.opened: list[Window] = []
        self.closed_: list[Window] = []

    def opening(self, window: Window) -> None:
        self.opened.append(window)

    def closed(self, window: Window) -> None:
        self.closed_.append(window)


def test_a_journaled_window_names_its_directory_with_its_birth_time(tmp_path: Path) -> None:
    ro = tmp_path / "ro"
    ro.mkdir()
    ro.chmod(0o555)
    journal = _Journal()

    Workspace(str(tmp_path), windows=journal).write_file("ro/f", iter([b"new"]), 0o644)

    fd = os.open(ro, os.O_RDONLY | os.O_DIRECTORY)
    try:
        born = born_ns(fd)
    finally:
        os.close(fd)
    st = ro.stat()
    assert journal.opened == [Window("ro", 0o555, st.st_dev, st.st_ino, born)] == journal.closed_
    assert born, "no birth time read (this test expects a file system that keeps one)"
    assert stat.S_IMODE(st.st_mode) == 0o555
    ro.chmod(0o755)


def test_where_statx_fails_or_keeps_no_birth_time_none_is_known(tmp_path: Path, monkeypatch) -> None:
    fd = os.open(tmp_path, os.O_RDONLY | os.O_DIRECTORY)
    try:
        monkeypatch.setattr(windows, "_statx", lambda *_args: -1)
        assert born_ns(fd) == 0
        monkeypatch.setattr(windows, "_statx", lambda *_args: 0)  # succeeds, mask without STATX_BTIME
        assert born_ns(fd) == 0
    finally:
        os.close(fd)


class _ChmodWhileJournaling(_Journal):
    """The user chmods the directory while its first window is being journaled."""

    def __init__(self, directory: Path, mode: int) -> None:
        super().__init__()
        self.directory, self.mode = directory, mode

    def opening(self, window: Window) -> None:
        super().opening(window)
        if len(self.opened) == 1:
            self.directory.chmod(self.mode)


@pytest.mark.parametrize("in_a_run", [False, True])
def test_a_chmod_made_while_a_window_is_journaled_is_the_users_and_kept(tmp_path: Path, in_a_run: bool) -> None:
    ro = tmp_path / "ro"
    ro.mkdir()
    ro.chmod(0o555)
    journal = _ChmodWhileJournaling(ro, 0o511)
    workspace = Workspace(str(tmp_path), windows=journal)

    if in_a_run:
        with workspace.windows_open():
            workspace.write_file("ro/f", iter([b"new"]), 0o644)
            workspace.write_file("ro/g", iter([b"new"]), 0o644)
    else:
        workspace.write_file("ro/f", iter([b"new"]), 0o644)

    first, second = journal.opened
    assert (first.mode, second.mode) == (0o555, 0o511)
    assert journal.closed_ == [first, second], "each window journaled is journaled closed, once"
    assert stat.S_IMODE(ro.stat().st_mode) == 0o511, "the user's mode"
    assert (ro / "f").read_bytes() == b"new"
    ro.chmod(0o755)


def test_a_window_journaled_without_a_birth_time_matches_its_inode(tmp_path: Path) -> None:
    st = os.stat(tmp_path)
    assert Window("d", 0o555, st.st_dev, st.st_ino).same_directory(st, 1000)
