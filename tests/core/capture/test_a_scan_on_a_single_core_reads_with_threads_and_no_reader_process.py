"""The number of reading threads and reader processes a scan uses follows the cores the server
may run on: on a single core (or when Python cannot tell) it still gets reading threads, and
starts no reader process (there is no other core for one to use); on several, reader
processes are there for large scans."""

from __future__ import annotations

from pathlib import Path

import pytest

from checkpointd.core.capture import snapshot as snapshot_module
from checkpointd.core.capture.snapshot import Snapshotter, disk_rules
from checkpointd.core.capture.stat_index import StatIndex
from checkpointd.core.store.content_store import ContentStore
from checkpointd.core.store.tree import EntryKind, Trees
from checkpointd.core.workspace.workspace import Workspace
from tests.engine.conftest import write


@pytest.mark.parametrize(("cores", "affinity"), [(None, True), (1, True), (2, True), (None, False), (2, False)],
                         ids=["unknown", "one", "two", "unknown-no-affinity", "two-no-affinity"])
def test_a_scan_gets_threads_whatever_the_cores_and_reader_processes_only_with_several(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, cores: int | None, affinity: bool) -> None:
    """``affinity``: the platform tells which cores the process may use (else: how many there are)."""
    monkeypatch.setattr(snapshot_module.os, "cpu_count", lambda: cores)
    if affinity:
        monkeypatch.setattr(snapshot_module.os, "sched_getaffinity", lambda _pid: set(range(cores or 1)))
    else:
        monkeypatch.delattr(snapshot_module.os, "sched_getaffinity", raising=False)
    root = tmp_path / "ws"
    for i in range(12):  # enough for the threads
        write(root / f"f{i:02}.txt", f"file {i}\n")
    store = ContentStore(tmp_path / "store")
    trees = Trees(store)
    snapshotter = Snapshotter(store, trees, StatIndex())
    workspace = Workspace(str(root))
    try:
        assert (snapshotter.readers is not None) == (cores == 2)
        with store.batch() as batch:
            result = snapshotter.capture(workspace, disk_rules(workspace, [], []), 1 << 20, batch)
    finally:
        snapshotter.close()
    files = {p: store.read_bytes(e.digest) for p, e in trees.flatten(result.tree) if e.kind is EntryKind.FILE}
    assert files == {p.name: p.read_bytes() for p in root.iterdir()}
