"""The persisted stat index (core.index): what a capture learned survives a restart, in any
order it was learned, a bulk update leaves no long write-ahead log for the next one, and no
update waits for the index's file."""

from __future__ import annotations

import os
import random
import sqlite3
import threading

from checkpointd.core.capture.stat_index import BULK_UPDATE_ROWS, Indexed, StatIndex
from checkpointd.core.metadata.db import PAGE_SIZE, WAL_AUTOCHECKPOINT_BYTES


def _entries(count: int) -> dict[str, Indexed]:
    rng = random.Random(7)
    paths = [f"dir{rng.randrange(50)}/file{n}.txt" for n in range(count)]
    rng.shuffle(paths)
    return {path: Indexed(n, 10 + n, 20 + n, 30 + n, f"{n:064x}", 40 + n) for n, path in enumerate(paths)}


def _read_back(path) -> dict[str, Indexed]:
    """The entries a new index on ``path`` (a restarted server's) loads for the workspace."""
    reopened = StatIndex(path)
    try:
        return reopened.for_root("/workspace").entries
    finally:
        reopened.close()


def test_a_bulk_update_is_read_back_after_a_restart_and_empties_the_log(tmp_path):
    path = tmp_path / "stat-index.sqlite"
    entries = _entries(BULK_UPDATE_ROWS)
    index = StatIndex(path)
    index.for_root("/workspace").update(entries)
    index.flush()
    assert os.path.getsize(f"{path}-wal") == 0
    index.close()

    assert _read_back(path) == entries


def test_small_updates_and_removals_are_read_back_after_a_restart(tmp_path):
    path = tmp_path / "stat-index.sqlite"
    entries = _entries(10)
    index = StatIndex(path)
    root = index.for_root("/workspace")
    root.update(entries)
    gone, changed = sorted(entries)[:2]
    root.update({changed: entries[changed]._replace(size=999)}, removed=[gone])
    index.close()

    expected = {**entries, changed: entries[changed]._replace(size=999)}
    del expected[gone]
    assert _read_back(path) == expected


def test_an_update_does_not_wait_for_the_file_and_queued_updates_merge(tmp_path):
    """While the writer is held up (its connection lock taken here), updates return at once and
    pile up; what lands afterwards is their sum, path by path, removals included."""
    path = tmp_path / "stat-index.sqlite"
    entries = _entries(10)
    index = StatIndex(path)
    root = index.for_root("/workspace")
    first, second = sorted(entries)[:2]
    with index._db_lock:
        updates = threading.Thread(target=lambda: (
            root.update(entries),
            root.update({first: entries[first]._replace(size=1)}, removed=[second]),
            root.update({second: entries[second]._replace(size=2)}, removed=[first]),
        ))
        updates.start()
        updates.join(timeout=10)
        assert not updates.is_alive(), "an update waited for the index file"
    index.close()

    expected = {**entries, second: entries[second]._replace(size=2)}
    del expected[first]
    assert _read_back(path) == expected


def test_loading_a_new_root_while_the_writer_works_holds_up_no_other_roots_update(tmp_path):
    """A new workspace's index is read from the file, which waits for the writer; another
    workspace's update meanwhile must still return at once."""
    index = StatIndex(tmp_path / "stat-index.sqlite")
    known = index.for_root("/known")
    with index._db_lock:
        loading = threading.Thread(target=index.for_root, args=("/new",))
        loading.start()
        loading.join(timeout=0.5)
        assert loading.is_alive(), "the new root's read did not wait for the file"
        update = threading.Thread(target=known.update, args=(_entries(3),))
        update.start()
        update.join(timeout=10)
        assert not update.is_alive(), "an update queued behind another root's read"
    loading.join(timeout=10)
    index.close()


def test_a_new_index_has_small_pages_and_an_old_one_keeps_its_own(tmp_path):
    """A new index takes the metadata database's small pages (issue 21: a small workspace's index is
    mostly half-empty pages), its log still checkpointed after the same bytes; one created with
    SQLite's 4 KiB pages keeps them and is read and written as before."""
    def pragmas(path):
        db = sqlite3.connect(path)
        try:
            return [db.execute(f"PRAGMA {name}").fetchone()[0] for name in ("page_size", "wal_autocheckpoint")]
        finally:
            db.close()

    entries = _entries(500)
    new = tmp_path / "new.sqlite"
    index = StatIndex(new)
    assert index._db.execute("PRAGMA wal_autocheckpoint").fetchone()[0] * PAGE_SIZE == WAL_AUTOCHECKPOINT_BYTES
    index.for_root("/workspace").update(entries)
    index.close()
    assert pragmas(new)[0] == PAGE_SIZE == 1024
    assert _read_back(new) == entries

    old = tmp_path / "old.sqlite"
    db = sqlite3.connect(old)
    db.execute("PRAGMA page_size=4096")
    db.execute("PRAGMA journal_mode=WAL")
    db.close()
    index = StatIndex(old)
    assert index._db.execute("PRAGMA wal_autocheckpoint").fetchone()[0] * 4096 == WAL_AUTOCHECKPOINT_BYTES
    index.for_root("/workspace").update(entries)
    index.close()
    assert pragmas(old)[0] == 4096
    assert _read_back(old) == entries


def test_a_new_index_gives_back_the_pages_of_files_that_went(tmp_path):
    """Files removed from a workspace leave no free pages in a new index's file (issue 21: 21 of
    51 pages were free after a real history of 200 commits); the rows kept read back."""
    def pages(path) -> tuple[int, int, int]:
        db = sqlite3.connect(path)
        try:
            db.execute("PRAGMA wal_checkpoint(TRUNCATE)")
            return tuple(db.execute(f"PRAGMA {name}").fetchone()[0]
                         for name in ("auto_vacuum", "page_count", "freelist_count"))
        finally:
            db.close()

    path = tmp_path / "index.sqlite"
    entries = _entries(2000)
    index = StatIndex(path)
    index.for_root("/workspace").update(entries)
    index.close()
    _, full, _ = pages(path)
    index = StatIndex(path)
    gone = sorted(entries)[:1800]
    index.for_root("/workspace").update({}, removed=gone)
    index.close()
    auto_vacuum, kept, free = pages(path)
    assert (auto_vacuum, free) == (1, 0)  # FULL
    assert kept < full / 4
    assert _read_back(path) == {p: e for p, e in entries.items() if p not in gone}
