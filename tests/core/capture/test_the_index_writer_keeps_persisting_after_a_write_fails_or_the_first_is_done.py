"""The stat index's writer thread persists every update until the index is closed: those made
after its first write, those after a write that failed (SQLite refusing it; an error no one
foresaw), those of another workspace queued beside a failing one. ``flush`` returns once what was
queued is in the file, a write under way included, and an update of many removals empties the
write-ahead log as one of many entries does."""

from __future__ import annotations

import os
import sqlite3
import threading

from checkpointd.core.capture.stat_index import BULK_UPDATE_ROWS, Indexed, StatIndex


def _entries(count: int, prefix: str = "file") -> dict[str, Indexed]:
    return {f"dir/{prefix}{n}.txt": Indexed(n, 10 + n, 20 + n, 30 + n, f"{n:064x}", 40 + n) for n in range(count)}


def _read_back(path, root: str = "/workspace") -> dict[str, Indexed]:
    reopened = StatIndex(path)
    try:
        return reopened.for_root(root).entries
    finally:
        reopened.close()


def _sqlite_refuses(path, name: str) -> None:
    """A real SQLite refusal of one path's row (a trigger), as a full disk or a damaged page gives."""
    db = sqlite3.connect(path)
    try:
        db.execute(f"CREATE TRIGGER refuse BEFORE INSERT ON entries WHEN NEW.path = X'{name.encode().hex()}' "
                   "BEGIN SELECT RAISE(ABORT, 'refused'); END")
        db.commit()
    finally:
        db.close()


def test_updates_after_the_first_write_are_persisted_too(tmp_path):
    path = tmp_path / "stat-index.sqlite"
    first, second = _entries(3, "first"), _entries(3, "second")
    index = StatIndex(path)
    root = index.for_root("/workspace")
    root.update(first)
    index.flush()
    root.update(second)
    root.update({}, removed=["dir/first0.txt"])
    index.close()
    expected = {**first, **second}
    del expected["dir/first0.txt"]
    assert _read_back(path) == expected


def test_a_write_sqlite_refuses_is_undone_and_later_writes_persist(tmp_path):
    path = tmp_path / "stat-index.sqlite"
    kept = _entries(3, "kept")
    later = _entries(3, "later")
    index = StatIndex(path)
    root = index.for_root("/workspace")
    root.update(kept)
    index.flush()
    _sqlite_refuses(path, "dir/refused.txt")
    root.update({"dir/refused.txt": Indexed(1, 2, 3, 4, "cd" * 32, 5)}, removed=["dir/kept0.txt"])
    index.flush()
    root.update(later)
    index.close()
    assert _read_back(path) == {**kept, **later}


def test_a_workspace_whose_write_fails_does_not_cost_another_its_write(tmp_path):
    """Both workspaces' updates wait for one write (the writer held up meanwhile)."""
    path = tmp_path / "stat-index.sqlite"
    index = StatIndex(path)
    failing, other = index.for_root("/failing"), index.for_root("/other")
    _sqlite_refuses(path, "dir/refused.txt")
    with index._db_lock:
        failing.update({"dir/refused.txt": Indexed(1, 2, 3, 4, "cd" * 32, 5)})
        other.update(_entries(4))
    index.close()
    assert _read_back(path, "/other") == _entries(4)
    assert _read_back(path, "/failing") == {}


def test_the_writer_outlives_an_error_no_one_foresaw(tmp_path):
    path = tmp_path / "stat-index.sqlite"
    index = StatIndex(path)
    root = index.for_root("/workspace")
    root.update({"dir/odd.txt": Indexed(1, 2, 3, 4, "not a hex digest", 5)})
    index.flush()
    root.update(_entries(3))
    index.close()
    assert _read_back(path) == _entries(3)


class _Announced:
    """The index's file lock, saying when someone (here: the writer) comes to take it."""

    def __init__(self, lock: threading.Lock) -> None:
        self.lock = lock
        self.waiting = threading.Event()

    def __enter__(self) -> None:
        self.waiting.set()
        self.lock.acquire()

    def __exit__(self, *exc) -> None:
        self.lock.release()


def test_flush_returns_once_the_write_under_way_is_in_the_file(tmp_path):
    path = tmp_path / "stat-index.sqlite"
    index = StatIndex(path)
    root = index.for_root("/workspace")
    gate = _Announced(index._db_lock)
    index._db_lock = gate
    with gate.lock:  # the writer takes the update, then waits for the file
        root.update(_entries(5))
        assert gate.waiting.wait(timeout=30)
        flushed = threading.Thread(target=index.flush)
        flushed.start()
        flushed.join(timeout=0.5)
        assert flushed.is_alive(), "flush returned before the write under way was done"
    flushed.join(timeout=30)
    assert not flushed.is_alive()
    other = sqlite3.connect(path)
    try:
        assert other.execute("SELECT count(*) FROM entries").fetchone()[0] == 5
    finally:
        other.close()
    index.close()


def test_updates_of_many_entries_or_many_removals_empty_the_log(tmp_path):
    path = tmp_path / "stat-index.sqlite"
    entries = _entries(BULK_UPDATE_ROWS + 1)
    index = StatIndex(path)
    root = index.for_root("/workspace")
    root.update(entries)
    index.flush()
    assert os.path.getsize(f"{path}-wal") == 0
    root.update({}, removed=list(entries))
    index.flush()
    assert os.path.getsize(f"{path}-wal") == 0
    index.close()
    assert _read_back(path) == {}
