"""A batch that cannot tell when it is committed (no ``when_finished``, no ``reuse``, no
``cancel``: a store's batch with only the writes) still gets a whole capture: the stat index
learns the files read at once, a first capture's pause of garbage collection ends when the
capture returns, and the next capture leaves unchanged files unread (asking the store whether
their content is stored). Waiting for a report that never comes would leave collection off for the
life of the server and read every file again on each capture."""

from __future__ import annotations

import gc
from pathlib import Path

from checkpointd.core.capture.snapshot import Snapshotter, disk_rules
from checkpointd.core.capture.stat_index import StatIndex
from checkpointd.core.kernel import heap
from checkpointd.core.store.content_store import ContentStore
from checkpointd.core.store.tree import EntryKind, Trees
from checkpointd.core.workspace.workspace import Workspace
from tests.engine.conftest import write


class _WritesOnly:
    """A batch with the writes alone."""

    def __init__(self, batch) -> None:
        self._batch = batch
        self.files_read = 0

    def put_fd(self, fd: int, expected_size: int) -> tuple[str, int]:
        self.files_read += 1
        return self._batch.put_fd(fd, expected_size)

    def put_bytes(self, data: bytes, similar: str = "") -> str:
        return self._batch.put_bytes(data, similar)


def test_a_capture_into_a_batch_without_end_reports_indexes_at_once_and_resumes_collection(tmp_path: Path) -> None:
    root = tmp_path / "ws"
    for i in range(10):
        write(root / "d" / f"f{i}.txt", f"file {i}\n")
    write(root / "top.txt", "top\n")
    store = ContentStore(tmp_path / "store")
    trees = Trees(store)
    index = StatIndex()
    snapshotter = Snapshotter(store, trees, index, reader_processes=0)
    workspace = Workspace(str(root))
    assert gc.isenabled()
    try:
        with store.batch() as real:
            first = _WritesOnly(real)
            result = snapshotter.capture(workspace, disk_rules(workspace, [], []), 1 << 20, first)
            assert first.files_read == 11
            assert gc.isenabled(), "the first capture's pause of garbage collection never ended"
            assert heap._pauses == 0
            indexed = index.for_root(str(root))
            assert sorted(indexed.paths()) == sorted(["top.txt", *(f"d/f{i}.txt" for i in range(10))])
        # As if indexed well after the files' last change (out of the index's racy window).
        indexed.update({path: entry._replace(indexed_ns=entry.indexed_ns + 3600 * 10**9)
                        for path, entry in indexed.snapshot()})
        with store.batch() as real:
            again = _WritesOnly(real)
            assert snapshotter.capture(workspace, disk_rules(workspace, [], []), 1 << 20, again).tree == result.tree
            assert again.files_read == 0
    finally:
        snapshotter.close()
    files = {p: store.read_bytes(e.digest) for p, e in trees.flatten(result.tree) if e.kind is EntryKind.FILE}
    assert files == {p.relative_to(root).as_posix(): p.read_bytes() for p in root.rglob("*") if p.is_file()}
