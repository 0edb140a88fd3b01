"""A read-only directory the server owns gets its owner's write bit for one change among its
entries and its mode back right after (``Workspace._changing``). The change is made by then: if
setting the mode back fails, that is logged and the directory left writable, never raised as if
the change had not been made (a caller would retry it, or undo around it, on a false premise)."""

from __future__ import annotations

import errno
import logging
import os
import stat
from pathlib import Path

import pytest

from checkpointd.core.workspace.workspace import Workspace


@pytest.mark.parametrize("change", ["write", "remove", "make_dir"])
def test_a_mode_that_cannot_be_set_back_leaves_the_change_made_and_the_directory_writable(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture, change: str) -> None:
    ro = tmp_path / "ro"
    ro.mkdir()
    (ro / "f").write_text("old")
    ro.chmod(0o555)
    real_fchmod = os.fchmod

    def fchmod(fd: int, mode: int) -> None:
        if mode == 0o555 and os.fstat(fd).st_ino == ro.stat().st_ino:
            raise OSError(errno.EIO, "Input/output error")
        real_fchmod(fd, mode)

    monkeypatch.setattr(os, "fchmod", fchmod)
    workspace = Workspace(str(tmp_path))
    with caplog.at_level(logging.WARNING, logger="checkpointd.workspace"):
        if change == "write":
            workspace.write_file("ro/f", iter([b"new"]), 0o644)
        elif change == "remove":
            workspace.remove("ro/f")
        else:
            workspace.make_dir("ro/sub", 0o755)
    monkeypatch.undo()

    if change == "write":
        assert (ro / "f").read_bytes() == b"new"
    elif change == "remove":
        assert not (ro / "f").exists()
    else:
        assert (ro / "sub").is_dir()
    assert stat.S_IMODE(ro.stat().st_mode) == 0o755, "left writable, as the change needed it"
    assert any("could not set the mode" in r.getMessage() for r in caplog.records)
    ro.chmod(0o755)


def test_the_mode_is_set_back_after_each_change(tmp_path: Path) -> None:
    ro = tmp_path / "ro"
    ro.mkdir()
    (ro / "f").write_text("old")
    ro.chmod(0o555)
    workspace = Workspace(str(tmp_path))

    workspace.write_file("ro/f", iter([b"new"]), 0o644)
    assert stat.S_IMODE(ro.stat().st_mode) == 0o555
    workspace.remove("ro/f")
    assert stat.S_IMODE(ro.stat().st_mode) == 0o555
    assert list(ro.iterdir()) == []
    ro.chmod(0o755)
