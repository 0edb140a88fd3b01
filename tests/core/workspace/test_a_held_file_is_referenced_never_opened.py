"""A batch holds each small file a rollback replaces or removes until it ends (see
``SyncBatch.release_later``). It holds a reference to the inode only (O_PATH): the file is never
opened for reading, so no permission is needed, no lease is broken, a FIFO swapped in meanwhile
is not opened (which would wait for a writer), and a symlink swapped in is not followed."""

from __future__ import annotations

import os
import stat
from pathlib import Path

import pytest

from checkpointd.core.workspace import syncbatch
from checkpointd.core.workspace.workspace import Workspace
from tests.helpers import descriptors_under

_O_PATH = getattr(os, "O_PATH", None)


def _held(root: Path) -> list[tuple[str, int]]:
    """(name, open flags) of what this process holds open under ``root`` whose last link is gone."""
    held = []
    for fd in os.listdir("/proc/self/fd"):
        try:
            target = os.readlink(f"/proc/self/fd/{fd}")
            with open(f"/proc/self/fdinfo/{fd}") as info:
                flags = next(int(line.split()[1], 8) for line in info if line.startswith("flags:"))
        except (OSError, StopIteration):
            continue
        if target.startswith(f"{root}/") and target.endswith(" (deleted)"):
            held.append((Path(target.removesuffix(" (deleted)")).name, flags))
    return held


@pytest.mark.skipif(_O_PATH is None, reason="O_PATH is Linux's")
def test_replaced_and_removed_files_are_held_as_references_not_opened(tmp_path: Path) -> None:
    for name in ("replaced", "removed"):
        (tmp_path / name).write_text(f"old {name}")
    syncbatch.wait_for_releases()
    workspace = Workspace(str(tmp_path))
    with workspace.batched_sync() as pending:
        workspace.write_file("replaced", iter([b"new"]), 0o644)
        workspace.remove("removed")
        held = _held(tmp_path)
        pending.flush()
    syncbatch.wait_for_releases()

    assert sorted(name for name, _flags in held) == ["removed", "replaced"]
    for name, flags in held:
        assert flags & _O_PATH, f"{name} was opened ({flags:o}), not only referenced"
        assert flags & os.O_CLOEXEC, f"{name}'s descriptor would leak into a child process"
    assert _held(tmp_path) == []


@pytest.mark.skipif(_O_PATH is None, reason="O_PATH is Linux's")
def test_a_symlink_swapped_in_before_the_file_is_held_is_not_followed(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    root, outside = tmp_path / "ws", tmp_path / "outside"
    root.mkdir()
    outside.write_text("outside the root")
    (root / "f").write_text("old")
    syncbatch.wait_for_releases()
    real_lstat = os.lstat

    def lstat_then_swap(path, *, dir_fd=None):
        st = real_lstat(path, dir_fd=dir_fd)
        if path == "f" and stat.S_ISREG(st.st_mode):  # the file as it was seen; a symlink by the time it is held
            os.unlink(root / "f")
            (root / "f").symlink_to(outside)
        return st

    workspace = Workspace(str(root))
    with workspace.batched_sync() as pending:
        monkeypatch.setattr(os, "lstat", lstat_then_swap)
        workspace.write_file("f", iter([b"new"]), 0o644)
        monkeypatch.undo()
        held_outside = descriptors_under(outside)
        pending.flush()
    syncbatch.wait_for_releases()

    assert held_outside == [], "the symlink swapped in was followed to a file outside the root"
    assert (root / "f").read_bytes() == b"new" and outside.read_text() == "outside the root"
