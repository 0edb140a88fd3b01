"""A directory of more children than ``SPLIT_ENTRIES`` is stored split into parts, and a part is an
ordinary directory node: a directory elsewhere in the workspace holding exactly the same files
(names, modes, contents) as one part has its digest. An incremental capture that adds a file to
that other directory writes it with the new child last, and the node is remembered so. The next
capture that changes the big directory beside that part re-cuts its parts from there, and must
take the children in name order: taken as remembered, parts would start at the wrong names, a
later edit of a file in them would be recorded beside its old entry (which reads back) and the
checkpoints would no longer hold what a full scan holds."""

from __future__ import annotations

import os

import pytest

from checkpointd.core.capture import watcher as watcher_module
from checkpointd.core.capture.capturer import Capturer
from checkpointd.core.capture.snapshot import Snapshotter
from checkpointd.core.capture.stat_index import StatIndex
from checkpointd.core.capture.watcher import Watcher
from checkpointd.core.store import tree as tree_module
from checkpointd.core.store.content_store import ContentStore
from checkpointd.core.store.tree import Trees, split_parts
from checkpointd.core.workspace.workspace import Workspace
from tests.core.store.test_perf_paths_attacked import _names
from tests.engine.conftest import write


def test_a_big_directory_changed_beside_a_copy_of_part_of_it_is_captured_as_a_full_scan_captures_it(tmp_path):
    if not watcher_module.available():
        pytest.fail("inotify_simple is not installed: the watcher cannot run (see pyproject dependencies)")
    root = tmp_path / "ws"
    store = ContentStore(tmp_path / "store")
    trees = Trees(store)
    watcher = Watcher()
    watched = Capturer(Snapshotter(store, trees, StatIndex(), reader_processes=0), trees, watcher)

    def capture(capturer: Capturer) -> str:
        with store.batch() as batch:
            result = capturer.capture(Workspace(str(root)), [], [], 1 << 30, batch)
        capturer.record(str(root), result.tree)
        return result.tree

    def full_scan() -> str:
        """A full scan by a capturer of its own (its own remembered nodes)."""
        own = Trees(store)
        full = Capturer(Snapshotter(store, own, StatIndex(), reader_processes=0), own, None)
        try:
            return capture(full)
        finally:
            full.snapshotter.close()

    names = _names(tree_module.SPLIT_ENTRIES + 200, None)
    content = {name: f"file {i}\n" for i, name in enumerate(names)}
    for name in names:
        write(root / "big" / name, content[name])
    complete, rest = split_parts([(name, None) for name in names])
    parts = [[name for name, _ in part] for part in [*complete, rest] if part]
    assert len(parts) >= 3
    edited = parts[1][::max(1, len(parts[1]) // 8)]
    try:
        checkpoints = [capture(watched)]
        for name in parts[1][1:]:  # a copy of the second part, then its first file
            write(root / "copy" / name, content[name])
        checkpoints.append(capture(watched))
        write(root / "copy" / parts[1][0], content[parts[1][0]])
        checkpoints.append(capture(watched))
        assert trees.lookup(checkpoints[-1], "copy").digest in trees.parts(trees.lookup(checkpoints[-1], "big").digest)
        os.unlink(root / "big" / parts[0][-1])  # the file that ends the first part
        checkpoints.append(capture(watched))
        scanned = [full_scan()]
        for name in edited:
            write(root / "big" / name, f"edited {name}\n")
        checkpoints.append(capture(watched))
        recorded = Trees(store).read(trees.lookup(checkpoints[-1], "big").digest)
        assert {name: store.read_bytes(recorded[name].digest) for name in edited} == {
            name: f"edited {name}\n".encode() for name in edited}, "an edit was not recorded"
        scanned.append(full_scan())
        assert checkpoints[-2:] == scanned
    finally:
        watched.close()
        watcher.close()
        watched.snapshotter.close()
        store.close()
