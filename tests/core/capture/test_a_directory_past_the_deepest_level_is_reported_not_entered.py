"""A full scan enters directories down to ``MAX_DIR_DEPTH`` levels below the root, and reports
the first one deeper as skipped (``TOO_DEEP``) without entering it: trees, diffs and restores
recurse once per level. The deepest level entered is captured whole."""

from __future__ import annotations

from pathlib import Path

from checkpointd.core.capture.snapshot import MAX_DIR_DEPTH, SKIP_TOO_DEEP, Snapshotter, disk_rules
from checkpointd.core.capture.stat_index import StatIndex
from checkpointd.core.store.content_store import ContentStore
from checkpointd.core.store.tree import EntryKind, Trees
from checkpointd.core.workspace.workspace import Workspace
from tests.engine.conftest import write


def test_the_deepest_level_is_captured_and_the_next_is_reported_too_deep(tmp_path: Path) -> None:
    root = tmp_path / "ws"
    deepest = "/".join(["d"] * MAX_DIR_DEPTH)  # MAX_DIR_DEPTH - 1 slashes: entered
    write(root / deepest / "kept.txt", "deepest level\n")
    write(root / deepest / "d" / "lost.txt", "one level too deep\n")
    store = ContentStore(tmp_path / "store")
    trees = Trees(store)
    snapshotter = Snapshotter(store, trees, StatIndex(), reader_processes=0)
    workspace = Workspace(str(root))
    try:
        with store.batch() as batch:
            result = snapshotter.capture(workspace, disk_rules(workspace, [], []), 1 << 20, batch)
    finally:
        snapshotter.close()
    assert [(s.path, s.size, s.reason) for s in result.skipped] == [(f"{deepest}/d", 0, SKIP_TOO_DEEP)]
    files = {p: store.read_bytes(e.digest) for p, e in trees.flatten(result.tree) if e.kind is EntryKind.FILE}
    assert files == {f"{deepest}/kept.txt": b"deepest level\n"}
