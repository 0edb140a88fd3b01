"""A reader process hands back, unread, the files it does not read itself: one larger than it
handles (``COMPRESS_LIMIT``), and those of a task past its answer budget (``ANSWER_BYTES``). The
server reads each in its place among the reader's answers (and itself reads, beside them, the
files known larger than that before any reader is asked); a result put in the wrong place, or
the wrong one taken, would give a file another file's content, or fail the scan."""

from __future__ import annotations

import os
from pathlib import Path

from checkpointd.core.capture.snapshot import Snapshotter, disk_rules
from checkpointd.core.capture.stat_index import StatIndex
from checkpointd.core.store.content_store import ContentStore
from checkpointd.core.store.tree import EntryKind, Trees
from checkpointd.core.workspace import readworker
from checkpointd.core.workspace.workspace import Workspace
from tests.engine.conftest import write

MAX_SIZE = 16 << 20


def _scan(tmp_path: Path, root: Path, name: str, processes: int):
    store = ContentStore(tmp_path / name)
    trees = Trees(store)
    snapshotter = Snapshotter(store, trees, StatIndex(), reader_processes=processes, readers_min_files=1)
    workspace = Workspace(str(root))
    try:
        with store.batch() as batch:
            result = snapshotter.capture(workspace, disk_rules(workspace, [], []), MAX_SIZE, batch)
        if processes:
            assert snapshotter.readers is not None and snapshotter.readers.pids(), "the readers were not used"
    finally:
        snapshotter.close()
    files = {path: store.read_bytes(entry.digest) for path, entry in trees.flatten(result.tree)
             if entry.kind is EntryKind.FILE}
    return result, files


def test_files_handed_back_by_a_reader_hold_their_own_content(tmp_path: Path) -> None:
    root = tmp_path / "ws"
    # Stated while walked (the readers start for this directory): at the limit a reader takes it.
    write(root / "a" / "first.txt", "read while the readers start\n")
    write(root / "a" / "limit.bin", b"l" * readworker.COMPRESS_LIMIT)
    write(root / "a" / "over.bin", b"o" * (readworker.COMPRESS_LIMIT + 1))
    # Walked once the readers run (sizes unknown): one task, whose files pass the answer budget.
    budget_files = readworker.ANSWER_BYTES // readworker.COMPRESS_LIMIT + 2
    for i in range(budget_files):
        write(root / "b" / f"m{i:02}.bin", bytes([65 + i]) * readworker.COMPRESS_LIMIT)
        write(root / "b" / f"s{i:02}.txt", f"small {i}\n")
    write(root / "b" / "l-large.bin", os.urandom(readworker.COMPRESS_LIMIT + 100))
    write(root / "b" / "l-large2.bin", b"z" * (readworker.COMPRESS_LIMIT + 1))
    expected = {p.relative_to(root).as_posix(): p.read_bytes() for p in root.rglob("*") if p.is_file()}

    in_process, files = _scan(tmp_path, root, "alone", 0)
    assert files == expected
    with_readers, files = _scan(tmp_path, root, "readers", 1)
    assert files == expected
    assert (with_readers.tree, with_readers.file_count, with_readers.total_size, with_readers.skipped) == (
        in_process.tree, in_process.file_count, in_process.total_size, in_process.skipped)
