"""A file's new content is written under a fresh temporary name, created exclusively: whatever
already has that name (a clash of 128 random bits, or something planted there: a file, or a
symlink to a file outside the root) is never opened, written through or replaced; the write
fails and the file keeps its content."""

from __future__ import annotations

from pathlib import Path

import pytest

from checkpointd.core.workspace.workspace import TEMP_PREFIX, Workspace

TAKEN = f"{TEMP_PREFIX}{'0' * 32}"


@pytest.mark.parametrize("planted", ["file", "symlink"])
def test_a_write_whose_temporary_name_is_taken_fails_and_changes_nothing(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, planted: str) -> None:
    root, outside = tmp_path / "ws", tmp_path / "outside"
    root.mkdir()
    outside.write_text("outside the root")
    (root / "f").write_text("the user's")
    if planted == "file":
        (root / TAKEN).write_text("already there")
    else:
        (root / TAKEN).symlink_to(outside)
    workspace = Workspace(str(root))
    monkeypatch.setattr(workspace, "_temp_name", lambda: TAKEN)

    with pytest.raises(FileExistsError):
        workspace.write_file("f", iter([b"new"]), 0o644)

    assert (root / "f").read_text() == "the user's"
    assert outside.read_text() == "outside the root"
    assert (root / TAKEN).is_symlink() if planted == "symlink" else (root / TAKEN).read_text() == "already there"
