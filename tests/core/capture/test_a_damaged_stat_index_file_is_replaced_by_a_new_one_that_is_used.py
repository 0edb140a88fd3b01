"""The stat index is a cache: a damaged file costs re-reading the workspace once, never a failed
start or capture, and the new file that replaces it keeps what later captures learn across the
next restart. An index whose entries cannot be read gives none (every file is read again) and is
replaced at the next start; an index whose directories do not exist yet is made with them."""

from __future__ import annotations

import sqlite3

from checkpointd.core.capture.stat_index import Indexed, StatIndex

ENTRIES = {f"dir/file{n}.txt": Indexed(n, 10 + n, 20 + n, 30 + n, f"{n:064x}", 40 + n) for n in range(5)}


def _learn_then_restart(path) -> dict[str, Indexed]:
    """What a restarted server's index holds after one that opened ``path`` learned ENTRIES."""
    index = StatIndex(path)
    assert index.for_root("/workspace").entries == {}
    index.for_root("/workspace").update(ENTRIES)
    index.close()
    reopened = StatIndex(path)
    try:
        return reopened.for_root("/workspace").entries
    finally:
        reopened.close()


def test_a_file_that_is_not_a_database_is_replaced(tmp_path):
    path = tmp_path / "stat-index.sqlite"
    path.write_bytes(b"this is not an SQLite database, nor was it ever one\n" * 100)
    assert _learn_then_restart(path) == ENTRIES


def test_a_database_whose_header_was_overwritten_is_replaced(tmp_path):
    path = tmp_path / "stat-index.sqlite"
    index = StatIndex(path)
    index.for_root("/workspace").update({"old.txt": ENTRIES["dir/file0.txt"]})
    index.close()
    with open(path, "r+b") as f:
        f.write(b"\xff" * 100)
    assert _learn_then_restart(path) == ENTRIES


def test_an_index_whose_directories_do_not_exist_yet_is_made_with_them(tmp_path):
    assert _learn_then_restart(tmp_path / "data" / "engine" / "stat-index.sqlite") == ENTRIES


def test_an_index_whose_tables_have_another_layout_is_replaced(tmp_path):
    path = tmp_path / "stat-index.sqlite"
    db = sqlite3.connect(path)
    db.execute("CREATE TABLE roots (root_id INTEGER PRIMARY KEY, root BLOB NOT NULL UNIQUE)")
    db.execute("CREATE TABLE entries (root_id INTEGER, garbage BLOB)")
    db.commit()
    db.close()
    assert _learn_then_restart(path) == ENTRIES


def test_an_index_whose_entries_cannot_be_read_while_serving_is_replaced_at_the_next_start(tmp_path):
    path = tmp_path / "stat-index.sqlite"
    index = StatIndex(path)
    # Damaged after the server opened it, before the workspace's entries are first read.
    other = sqlite3.connect(path)
    other.execute("DROP TABLE entries")
    other.execute("CREATE TABLE entries (root_id INTEGER, garbage BLOB)")
    other.commit()
    other.close()
    root = index.for_root("/workspace")
    assert root.entries == {}
    root.update(ENTRIES)  # kept in memory for this run; nothing is written beside the garbage
    assert root.get("dir/file1.txt") == ENTRIES["dir/file1.txt"]
    index.close()
    assert _learn_then_restart(path) == ENTRIES
    assert not path.with_name(path.name + ".damaged").exists()
