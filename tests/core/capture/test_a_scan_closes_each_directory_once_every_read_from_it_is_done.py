"""A scan reads a directory's files through the directory's descriptor, from several threads
and reader processes at once; the descriptor is closed once the last of those reads is done.
Closed too early, a later read would open a name relative to whatever the number was reused
for (another directory: the wrong file's content); never closed, every scan leaks one per
directory until the server can open nothing."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from checkpointd.core.capture.snapshot import Snapshotter, disk_rules
from checkpointd.core.capture.stat_index import StatIndex
from checkpointd.core.store.content_store import ContentStore
from checkpointd.core.store.tree import EntryKind, Trees
from checkpointd.core.workspace import readworker
from checkpointd.core.workspace.workspace import Workspace
from tests.engine.conftest import write


def _open_under(root: Path) -> list[str]:
    """What this process holds open inside ``root``."""
    held = []
    for fd in os.listdir("/proc/self/fd"):
        try:
            target = os.readlink(f"/proc/self/fd/{fd}")
        except OSError:
            continue
        if target == str(root) or target.startswith(f"{root}/"):
            held.append(target)
    return held


def _scan(store: ContentStore, trees: Trees, snapshotter: Snapshotter, root: Path):
    workspace = Workspace(str(root))
    with store.batch() as batch:
        return snapshotter.capture(workspace, disk_rules(workspace, [], []), 4 << 20, batch)


@pytest.mark.parametrize("processes", [0, 1], ids=["threads", "threads-and-reader-processes"])
@pytest.mark.parametrize("files", [3, 12, 40], ids=["read-inline", "read-by-threads", "many"])
def test_no_directory_stays_open_after_a_scan_and_each_file_has_its_own_content(
        tmp_path: Path, processes: int, files: int) -> None:
    root = tmp_path / "ws"
    for d in range(4):
        for f in range(files):
            write(root / f"d{d}" / f"f{f:02}.txt", f"{d}/{f}\n" * (f + 1))
    # Larger than a reader takes: the scan reads it itself, beside the readers' share.
    write(root / "d0" / "large.bin", b"L" * (readworker.COMPRESS_LIMIT + 10))
    store = ContentStore(tmp_path / "store")
    trees = Trees(store)
    snapshotter = Snapshotter(store, trees, StatIndex(), reader_processes=processes, readers_min_files=1)
    try:
        _scan(store, trees, snapshotter, root)
        assert _open_under(root) == []
        # Edited files have a previous version: the scan reads them itself, beside the readers'.
        for d in range(4):
            for f in range(0, files, 2):
                write(root / f"d{d}" / f"f{f:02}.txt", f"edited {d}/{f}\n" * (f + 2))
        result = _scan(store, trees, snapshotter, root)
        assert _open_under(root) == []
    finally:
        snapshotter.close()
    expected = {p.relative_to(root).as_posix(): p.read_bytes() for p in root.rglob("*") if p.is_file()}
    assert {path: store.read_bytes(entry.digest) for path, entry in trees.flatten(result.tree)
            if entry.kind is EntryKind.FILE} == expected
    # Each file counted once, whoever read it.
    assert (result.file_count, result.total_size) == (len(expected), sum(map(len, expected.values())))
