"""Workspace.directories: many paths' directory descriptors, each directory opened once, never
through a symlink (what Workspace.dir_fd guarantees for one path)."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from checkpointd.core.workspace.workspace import UnsafePath, Workspace
from tests.helpers import descriptors_under


def test_each_path_is_reached_without_following_links(tmp_path: Path) -> None:
    root = tmp_path / "ws"
    for directory in ("a/b/c", "a/d", "e"):
        (root / directory).mkdir(parents=True)
    (root / "link").symlink_to("a")
    (root / "a/file").write_text("not a directory\n")
    with Workspace(str(root)).directories() as dirs:
        for path in ["", "a", "a/b/c", "a/b", "a/d", "e", "a/b/c", ""]:
            assert os.fstat(dirs.fd(path)).st_ino == (root / path).stat().st_ino, path
        with pytest.raises(UnsafePath):
            dirs.fd("link/b")
        with pytest.raises(UnsafePath):
            dirs.fd("a/file/x")
        with pytest.raises(FileNotFoundError):
            dirs.fd("a/missing/x")
        assert os.fstat(dirs.fd("a/b")).st_ino == (root / "a/b").stat().st_ino


def test_no_more_descriptors_are_open_than_the_path_is_deep(tmp_path: Path) -> None:
    root = tmp_path / "ws"
    for i in range(50):
        (root / f"d{i}" / "sub").mkdir(parents=True)
    with Workspace(str(root)).directories() as dirs:
        for i in range(50):
            dirs.fd(f"d{i}/sub")
        # Only this workspace's descriptors are counted: other threads of the process open and close theirs.
        assert len(descriptors_under(root)) <= 3
    assert descriptors_under(root) == []


def test_asked_in_sorted_order_each_directory_is_opened_once(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    root = tmp_path / "ws"
    for directory in ("a/b/c", "a/d", "e/f"):
        (root / directory).mkdir(parents=True)
    opened: list[str] = []
    real_open = os.open

    def counting_open(path, flags, mode=0o777, *, dir_fd=None):
        opened.append(path)
        return real_open(path, flags, mode, dir_fd=dir_fd)

    with Workspace(str(root)).directories() as dirs:
        monkeypatch.setattr(os, "open", counting_open)
        for path in ["", "a", "a/b", "a/b/c", "a/b/c", "a/d", "e", "e/f"]:
            assert os.fstat(dirs.fd(path)).st_ino == (root / path).stat().st_ino, path
        monkeypatch.undo()
    assert opened == ["a", "b", "c", "d", "e", "f"]
