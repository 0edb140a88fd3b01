"""A full scan in this process, as several capture tests run one: a new store under ``store_dir``,
no reader processes, no ignore rules but the workspace's own, a 1 MiB size cap."""

from __future__ import annotations

from pathlib import Path

from checkpointd.core.capture.snapshot import CaptureResult, Snapshotter, disk_rules
from checkpointd.core.capture.stat_index import StatIndex
from checkpointd.core.store.content_store import ContentStore
from checkpointd.core.store.tree import Trees
from checkpointd.core.workspace.workspace import Workspace


def full_scan(store_dir: Path, root: Path) -> tuple[ContentStore, Trees, CaptureResult]:
    """The store, its trees and the capture of ``root`` (an exception of the scan is raised)."""
    store = ContentStore(store_dir)
    trees = Trees(store)
    snapshotter = Snapshotter(store, trees, StatIndex(), reader_processes=0)
    workspace = Workspace(str(root))
    try:
        with store.batch() as batch:
            result = snapshotter.capture(workspace, disk_rules(workspace, [], []), 1 << 20, batch)
    finally:
        snapshotter.close()
    return store, trees, result
