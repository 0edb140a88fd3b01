"""The per-workspace stat index (path -> size, mtime, ctime, inode, digest), kept like git's
index so that an unchanged file is never read again, and persisted so that a restarted
server does not re-read every file either.

It is a cache, never a source of truth: an entry is used only when the file's stat still
matches it exactly, outside the "racily clean" window, and its object is still stored.
It lives in its own SQLite file (WAL, ``synchronous=NORMAL``: an update lost in a power
cut only costs a re-read); each capture writes just the entries that changed. A damaged
index file is discarded and rebuilt.
"""

from __future__ import annotations

import contextlib
import logging
import os
import sqlite3
import threading
from collections.abc import Iterable
from pathlib import Path
from typing import NamedTuple

log = logging.getLogger("checkpointd.index")

#: Files modified this close to their indexing are re-read on the next capture: a write in
#: the same clock tick as the read that indexed them would not change their stat.
RACY_WINDOW_NS = 2_000_000_000
#: Entries written at once beyond which the write-ahead log is emptied right after (see _persist).
BULK_UPDATE_ROWS = 2_000

_SCHEMA = """
CREATE TABLE IF NOT EXISTS roots (root_id INTEGER PRIMARY KEY, root BLOB NOT NULL UNIQUE);
CREATE TABLE IF NOT EXISTS entries (
    root_id INTEGER NOT NULL,
    path BLOB NOT NULL,
    size INTEGER NOT NULL,
    mtime_ns INTEGER NOT NULL,
    ctime_ns INTEGER NOT NULL,
    ino INTEGER NOT NULL,
    digest BLOB NOT NULL,
    indexed_ns INTEGER NOT NULL,
    PRIMARY KEY (root_id, path)
) WITHOUT ROWID;
"""


class Indexed(NamedTuple):
    """One file's stat and digest."""

    size: int
    mtime_ns: int
    ctime_ns: int
    ino: int
    digest: str
    indexed_ns: int

    def matches(self, st: os.stat_result) -> bool:
        return (
            self.size == st.st_size
            and self.mtime_ns == st.st_mtime_ns
            and self.ctime_ns == st.st_ctime_ns
            and self.ino == st.st_ino
            and st.st_mtime_ns < self.indexed_ns - RACY_WINDOW_NS
        )


class RootIndex:
    """The index of one workspace root: an in-memory map, loaded once, written through."""

    def __init__(self, owner: StatIndex, root: str, root_id: int | None, entries: dict[str, Indexed]) -> None:
        self._owner = owner
        self.root = root
        self.root_id = root_id
        self.entries = entries

    def get(self, path: str) -> Indexed | None:
        return self.entries.get(path)

    def update(self, fresh: dict[str, Indexed], removed: Iterable[str] = ()) -> None:
        """Records what a capture learned: new entries, and paths that are gone."""
        gone = [path for path in removed if path in self.entries and path not in fresh]
        if not fresh and not gone:
            return
        with self._owner._lock:
            for path in gone:
                del self.entries[path]
            self.entries.update(fresh)
        self._owner._persist(self, fresh, gone)

    def paths(self) -> list[str]:
        return list(self.entries)


class StatIndex:
    """Stat indexes of every workspace root, persisted in ``path`` (in memory when None)."""

    def __init__(self, path: Path | None = None) -> None:
        self._path = path
        self._lock = threading.RLock()
        self._by_root: dict[str, RootIndex] = {}
        self._db: sqlite3.Connection | None = None
        if path is not None:
            self._db = self._connect(path)

    def _connect(self, path: Path) -> sqlite3.Connection | None:
        path.parent.mkdir(parents=True, exist_ok=True)
        for attempt in range(2):
            try:
                db = sqlite3.connect(path, check_same_thread=False, isolation_level=None)
                db.execute("PRAGMA journal_mode=WAL")
                db.execute("PRAGMA synchronous=NORMAL")
                # Keep the write-ahead log small: it counts against the data dir's size.
                db.execute("PRAGMA wal_autocheckpoint=256")
                db.execute("PRAGMA journal_size_limit=1048576")
                db.executescript(_SCHEMA)
                db.execute("SELECT count(*) FROM roots").fetchone()
                return db
            except sqlite3.DatabaseError as exc:
                log.warning("stat index %s is unusable (%s); starting a new one", path, exc)
                with contextlib.suppress(Exception):
                    db.close()
                if attempt == 0:
                    for suffix in ("", "-wal", "-shm"):
                        Path(f"{path}{suffix}").unlink(missing_ok=True)
        log.warning("stat index disabled: %s cannot be created", path)
        return None

    def for_root(self, root: str) -> RootIndex:
        with self._lock:
            index = self._by_root.get(root)
            if index is None:
                index = self._load(root)
                self._by_root[root] = index
            return index

    def _load(self, root: str) -> RootIndex:
        if self._db is None:
            return RootIndex(self, root, None, {})
        try:
            stored_root = os.fsencode(root)
            self._db.execute("INSERT OR IGNORE INTO roots (root) VALUES (?)", (stored_root,))
            (root_id,) = self._db.execute("SELECT root_id FROM roots WHERE root = ?", (stored_root,)).fetchone()
            rows = self._db.execute(
                "SELECT path, size, mtime_ns, ctime_ns, ino, digest, indexed_ns FROM entries WHERE root_id = ?",
                (root_id,))
            entries = {os.fsdecode(path): Indexed(size, mtime, ctime, ino, digest.hex(), indexed)
                       for path, size, mtime, ctime, ino, digest, indexed in rows}
        except sqlite3.DatabaseError as exc:
            log.warning("stat index unreadable for %s (%s); files will be re-read", root, exc)
            return RootIndex(self, root, None, {})
        return RootIndex(self, root, root_id, entries)

    def _persist(self, index: RootIndex, fresh: dict[str, Indexed], gone: list[str]) -> None:
        if self._db is None or index.root_id is None:
            return
        root_id = index.root_id
        try:
            with self._lock:
                self._db.execute("BEGIN")
                try:
                    if gone:
                        self._db.executemany("DELETE FROM entries WHERE root_id = ? AND path = ?",
                                             [(root_id, os.fsencode(path)) for path in gone])
                    if fresh:
                        self._db.executemany(
                            "INSERT OR REPLACE INTO entries VALUES (?, ?, ?, ?, ?, ?, ?, ?)",
                            [(root_id, os.fsencode(path), e.size, e.mtime_ns, e.ctime_ns, e.ino,
                              bytes.fromhex(e.digest), e.indexed_ns) for path, e in fresh.items()])
                    self._db.execute("COMMIT")
                except BaseException:
                    self._db.execute("ROLLBACK")
                    raise
                if len(fresh) + len(gone) >= BULK_UPDATE_ROWS:
                    # Such an update leaves a log beyond journal_size_limit, which SQLite cuts back
                    # at the next write: 4 ms in the next, one-file checkpoint. Emptied here instead.
                    self._db.execute("PRAGMA wal_checkpoint(TRUNCATE)").fetchall()
        except (sqlite3.DatabaseError, OverflowError) as exc:
            log.warning("stat index update failed (%s); it stays in memory only", exc)

    def clear(self) -> None:
        with self._lock:
            self._by_root.clear()
            if self._db is not None:
                with contextlib.suppress(sqlite3.DatabaseError):
                    self._db.execute("DELETE FROM entries")

    def close(self) -> None:
        with self._lock:
            if self._db is not None:
                self._db.close()
                self._db = None
