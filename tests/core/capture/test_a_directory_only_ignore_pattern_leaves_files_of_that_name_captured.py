"""A pattern ending in a slash ignores directories only (git's rule): a regular file or a
symlink of that name is captured, whether the scan stated it or walked it unstated for a reader
process. Taken as ignored, the file would be missing from the checkpoint, and a rollback to it
would keep whatever the file holds then (ignored paths are left alone)."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from checkpointd.core.capture.snapshot import Snapshotter, disk_rules
from checkpointd.core.capture.stat_index import StatIndex
from checkpointd.core.store.content_store import ContentStore
from checkpointd.core.store.tree import EntryKind, Trees
from checkpointd.core.workspace.workspace import Workspace
from tests.engine.conftest import write


@pytest.mark.parametrize("processes", [0, 1], ids=["in-process", "reader-processes"])
def test_files_and_links_named_as_a_directory_pattern_are_captured(tmp_path: Path, processes: int) -> None:
    root = tmp_path / "ws"
    write(root / ".gitignore", "out/\nlnk/\n")
    write(root / "a" / "first.txt", "first\n")  # the readers start for this directory
    for directory in ("", "b/"):
        write(root / f"{directory}out", "a file named out\n")
        write(root / f"{directory}sub" / "out" / "built.o", "ignored\n")
        os.symlink("first.txt", root / f"{directory}lnk")
    store = ContentStore(tmp_path / "store")
    trees = Trees(store)
    snapshotter = Snapshotter(store, trees, StatIndex(), reader_processes=processes, readers_min_files=1)
    workspace = Workspace(str(root))
    try:
        with store.batch() as batch:
            result = snapshotter.capture(workspace, disk_rules(workspace, [], []), 1 << 20, batch)
        if processes:
            assert snapshotter.readers is not None and snapshotter.readers.pids(), "the readers were not used"
    finally:
        snapshotter.close()
    kinds = {path: entry.kind for path, entry in trees.flatten(result.tree)}
    for directory in ("", "b/"):
        assert kinds.get(f"{directory}out") is EntryKind.FILE
        assert kinds.get(f"{directory}lnk") is EntryKind.SYMLINK
        assert f"{directory}sub/out" not in kinds and f"{directory}sub/out/built.o" not in kinds
