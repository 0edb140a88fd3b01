"""A full scan lists the regular files with more than one name (``CaptureResult.linked``),
captured or too large: a write through another name, maybe outside the workspace, reaches no
watch of ours, and the next incremental capture looks at these files again for that. A file
missing from the list could be changed through its other name and the next checkpoint would
hold its old content. The list must be the same whoever reads the files: the scan itself (stat
taken while walking), or reader processes (stat taken once opened, by the reader; a file a
reader found too large is not opened again by the server)."""

from __future__ import annotations

import os
from collections import Counter
from pathlib import Path

import pytest

from checkpointd.core.capture import snapshot as snapshot_module
from checkpointd.core.capture.snapshot import SKIP_TOO_LARGE, Snapshotter, disk_rules
from checkpointd.core.capture.stat_index import StatIndex
from checkpointd.core.store.content_store import ContentStore
from checkpointd.core.store.tree import Trees
from checkpointd.core.workspace.workspace import Workspace
from tests.engine.conftest import write

MAX_SIZE = 1000


def _workspace(root: Path, outside: Path) -> dict[str, tuple[int, int]]:
    """Files with a second name outside the root, small and too large, in the first directory a
    scan hands to readers (stated while walked) and in a later one (walked unstated); the
    (dev, inode) of each."""
    linked = {}
    for directory in ("a", "b"):
        for name, size in (("small.txt", 10), ("big.bin", MAX_SIZE + 1)):
            path = f"{directory}/{name}"
            write(root / path, b"x" * size)
            os.link(root / path, outside / f"{directory}-{name}")
            st = os.lstat(root / path)
            linked[path] = (st.st_dev, st.st_ino)
        for i in range(3):
            write(root / directory / f"single{i}.txt", f"one name {i}\n")
    write(root / "b" / "single-big.bin", b"y" * (MAX_SIZE + 1))
    return linked


@pytest.mark.parametrize("processes", [0, 1], ids=["in-process", "reader-processes"])
def test_every_file_with_several_names_is_reported_captured_or_too_large(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, processes: int) -> None:
    root, outside = tmp_path / "ws", tmp_path / "outside"
    outside.mkdir()
    linked = _workspace(root, outside)
    read: Counter[str] = Counter()
    real_read_files = snapshot_module._read_files

    def read_files(dir_fd, names, *args, **kwargs):
        read.update(name for name, _ in names)
        return real_read_files(dir_fd, names, *args, **kwargs)

    monkeypatch.setattr(snapshot_module, "_read_files", read_files)
    store = ContentStore(tmp_path / "store")
    snapshotter = Snapshotter(store, Trees(store), StatIndex(), reader_processes=processes, readers_min_files=1)
    workspace = Workspace(str(root))
    try:
        with store.batch() as batch:
            result = snapshotter.capture(workspace, disk_rules(workspace, [], []), MAX_SIZE, batch)
        if processes:
            assert snapshotter.readers is not None and snapshotter.readers.pids(), "the readers were not used"
            # What a reader found too large it says so: the server does not open it again.
            assert read == Counter(), read
    finally:
        snapshotter.close()
    assert result.linked == linked
    assert sorted((s.path, s.reason) for s in result.skipped) == [
        ("a/big.bin", SKIP_TOO_LARGE), ("b/big.bin", SKIP_TOO_LARGE), ("b/single-big.bin", SKIP_TOO_LARGE)]
    assert result.file_count == 2 + 6
