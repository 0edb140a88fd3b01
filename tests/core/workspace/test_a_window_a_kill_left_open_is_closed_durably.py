"""Whoever finishes a rollback killed with an owner-write window open sets the directory's mode
back (``Workspace.close_window``), drops the window from the journal entry and, once the rollback
is finished or undone, the entry itself, neither with a sync: the next synced commit of any
checkpoint makes both durable, and nothing syncs that directory again. So the mode set back must
be on the disk before ``close_window`` returns, or a power cut leaves the user's read-only
directory owner-writable with no window left in the journal to set it back."""

from __future__ import annotations

import os
import stat
from pathlib import Path

import pytest

from checkpointd.core.workspace.windows import Window, born_ns
from checkpointd.core.workspace.workspace import Workspace


def test_the_mode_a_window_is_closed_to_is_synced_before_close_window_returns(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    directory = tmp_path / "read-only"
    directory.mkdir(mode=0o755)  # as the kill left it: the window's writable mode
    fd = os.open(directory, os.O_RDONLY | os.O_DIRECTORY)
    try:
        st = os.fstat(fd)
        window = Window("read-only", 0o555, st.st_dev, st.st_ino, born_ns(fd))
    finally:
        os.close(fd)
    synced: list[tuple[int, int]] = []
    real_fsync = os.fsync

    def fsync(fd: int) -> None:
        st = os.fstat(fd)
        synced.append((st.st_ino, stat.S_IMODE(st.st_mode)))
        real_fsync(fd)

    monkeypatch.setattr(os, "fsync", fsync)
    try:
        assert Workspace(str(tmp_path)).close_window(window) is True

        assert stat.S_IMODE(directory.stat().st_mode) == 0o555
        assert (directory.stat().st_ino, 0o555) in synced, f"the mode set back was not synced: {synced}"
    finally:
        directory.chmod(0o755)
