"""The per-workspace stat index (path -> size, mtime, ctime, inode, digest), kept like git's
index so that an unchanged file is never read again, and persisted so that a restarted
server does not re-read every file either.

It is a cache, never a source of truth: an entry is used only when the file's stat still
matches it exactly, outside the "racily clean" window, and its object is still stored.
It lives in its own SQLite file (WAL, ``synchronous=NORMAL``: an update lost in a power
cut only costs a re-read); each capture writes just the entries that changed. A damaged
index file is discarded and rebuilt.

The file is written by a thread of its own: a capture updates the in-memory map and goes on,
so no checkpoint waits for the index's SQLite (a first capture of 100k files spent 0.47 s
there, and every few hundred small updates SQLite checkpoints its log inside one of them).
Updates that queue up meanwhile are merged, per path, into the next write.
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

from checkpointd.core.kernel.private_files import private_dir, tighten_sqlite
from checkpointd.core.metadata.db import PAGE_SIZE, WAL_AUTOCHECKPOINT_BYTES, WAL_SIZE_LIMIT

log = logging.getLogger("checkpointd.index")

#: Files modified this close to their indexing are re-read on the next capture: a write in
#: the same clock tick as the read that indexed them would not change their stat.
RACY_WINDOW_NS = 2_000_000_000
#: Entries written at once beyond which the write-ahead log is emptied right after (see _persist).
BULK_UPDATE_ROWS = 2_000
#: How long the writer lets updates gather before writing them: long enough for the capture
#: that queued them to answer first (the writer would take the interpreter lock from it).
WRITE_DELAY_SECONDS = 0.02

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
            # The ctime too: a tool that writes a file and then sets its mtime back (cp -p,
            # tar, rsync -t) leaves an old mtime on content changed within the window.
            and max(st.st_mtime_ns, st.st_ctime_ns) < self.indexed_ns - RACY_WINDOW_NS
        )


_COLUMNS = "root_id, path, size, mtime_ns, ctime_ns, ino, digest, indexed_ns"
_SQLITE_INTEGERS = range(-(1 << 63), 1 << 63)


def _sqlite_row(entry: Indexed) -> tuple[int, int, int, int, bytes, int] | None:
    """The entry's columns after the path, or None when SQLite's signed 64-bit integers cannot
    hold them: an inode number from 2**63 up (some file systems give them) is stored as its two's
    complement; an mtime past the year 2262 (``touch -d``) is not stored at all."""
    ino = entry.ino - (1 << 64) if entry.ino >= 1 << 63 else entry.ino
    numbers = (entry.size, entry.mtime_ns, entry.ctime_ns, ino, entry.indexed_ns)
    if not all(n in _SQLITE_INTEGERS for n in numbers):
        return None
    return entry.size, entry.mtime_ns, entry.ctime_ns, ino, bytes.fromhex(entry.digest), entry.indexed_ns


def _from_sqlite_ino(stored: int) -> int:
    return stored + (1 << 64) if stored < 0 else stored


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
        self._owner._queue_write(self, fresh, gone)

    def paths(self) -> list[str]:
        return list(self.entries)

    def snapshot(self) -> list[tuple[str, Indexed]]:
        """Every entry as it is now (another thread may be recording a capture meanwhile)."""
        with self._owner._lock:
            return list(self.entries.items())


class _PendingWrite(NamedTuple):
    """What is still to be written for one root: the newest entry of each path, and removals."""

    fresh: dict[str, Indexed]
    gone: set[str]


class StatIndex:
    """Stat indexes of every workspace root, persisted in ``path`` (in memory when None)."""

    def __init__(self, path: Path | None = None) -> None:
        self._path = path
        #: Guards the in-memory maps only; never held while the file is used.
        self._lock = threading.Lock()
        self._by_root: dict[str, RootIndex] = {}
        #: Serializes use of the SQLite connection (the writer thread's, and loading a root).
        self._db_lock = threading.Lock()
        self._db: sqlite3.Connection | None = None
        self._pending: dict[int, _PendingWrite] = {}
        self._writing = False
        self._closing = False
        self._changed = threading.Condition()
        self._writer: threading.Thread | None = None
        if path is not None:
            self._db = self._connect(path)

    def _damage_mark(self, path: Path) -> Path:
        return path.with_name(path.name + ".damaged")

    def _connect(self, path: Path) -> sqlite3.Connection | None:
        private_dir(path.parent, parents=True)
        if self._damage_mark(path).exists():
            log.warning("stat index %s was found damaged while serving; starting a new one", path)
            self._discard(path)
        for attempt in range(2):
            with contextlib.suppress(OSError):  # where it cannot be made, sqlite3's open says why
                tighten_sqlite(path)
            try:
                db = sqlite3.connect(path, check_same_thread=False, isolation_level=None)
                # Small pages, as the metadata database's: an index created now (an existing one
                # keeps its page size) spends less on half-empty pages in a small workspace.
                db.execute(f"PRAGMA page_size={PAGE_SIZE}")
                # And pages freed as files come and go given back to the file system at each write
                # (on the writer thread, so no capture waits for it): after 200 commits of a real
                # history, 21 of an index's 51 pages were free. Like the page size, only for an
                # index created now.
                db.execute("PRAGMA auto_vacuum=FULL")
                db.execute("PRAGMA journal_mode=WAL")
                db.execute("PRAGMA synchronous=NORMAL")
                # Keep the write-ahead log small: it counts against the data dir's size.
                page_size = db.execute("PRAGMA page_size").fetchone()[0]
                db.execute(f"PRAGMA wal_autocheckpoint={max(1, WAL_AUTOCHECKPOINT_BYTES // page_size)}")
                db.execute(f"PRAGMA journal_size_limit={WAL_SIZE_LIMIT}")
                db.executescript(_SCHEMA)
                # Tables of another layout (IF NOT EXISTS keeps them) would fail every load.
                db.execute("SELECT root_id, root FROM roots LIMIT 0").fetchall()
                db.execute(f"SELECT {_COLUMNS} FROM entries LIMIT 0").fetchall()
                return db
            except sqlite3.DatabaseError as exc:
                log.warning("stat index %s is unusable (%s); starting a new one", path, exc)
                with contextlib.suppress(Exception):
                    db.close()
                if attempt == 0:
                    self._discard(path)
        log.warning("stat index disabled: %s cannot be created", path)
        return None

    def _discard(self, path: Path) -> None:
        for suffix in ("", "-wal", "-shm", ".damaged"):
            Path(f"{path}{suffix}").unlink(missing_ok=True)

    def for_root(self, root: str) -> RootIndex:
        """The root's index, read from the file on first use. The read waits for the writer,
        so it is done outside the map's lock: other roots' updates must not queue behind it."""
        with self._lock:
            index = self._by_root.get(root)
        if index is not None:
            return index
        loaded = self._load(root)
        with self._lock:
            return self._by_root.setdefault(root, loaded)

    def _load(self, root: str) -> RootIndex:
        with self._db_lock:
            return self._load_locked(root)

    def _load_locked(self, root: str) -> RootIndex:
        if self._db is None:
            return RootIndex(self, root, None, {})
        try:
            stored_root = os.fsencode(root)
            self._db.execute("INSERT OR IGNORE INTO roots (root) VALUES (?)", (stored_root,))
            (root_id,) = self._db.execute("SELECT root_id FROM roots WHERE root = ?", (stored_root,)).fetchone()
            rows = self._db.execute(f"SELECT {_COLUMNS} FROM entries WHERE root_id = ?", (root_id,))
            entries = {os.fsdecode(path): Indexed(size, mtime, ctime, _from_sqlite_ino(ino), digest.hex(), indexed)
                       for _, path, size, mtime, ctime, ino, digest, indexed in rows}
        except sqlite3.DatabaseError as exc:
            # This root's entries stay in memory; the next start replaces the file (every root's
            # files read once more) rather than failing here again at each start.
            log.warning("stat index unreadable for %s (%s); files will be re-read", root, exc)
            if self._path is not None:
                with contextlib.suppress(OSError):
                    self._damage_mark(self._path).touch()
            return RootIndex(self, root, None, {})
        return RootIndex(self, root, root_id, entries)

    def _queue_write(self, index: RootIndex, fresh: dict[str, Indexed], gone: list[str]) -> None:
        """Hands an update to the writer thread (started on first use); returns at once."""
        if self._db is None or index.root_id is None:
            return
        with self._changed:
            pending = self._pending.get(index.root_id)
            if pending is None:
                self._pending[index.root_id] = _PendingWrite(dict(fresh), set(gone))
            else:
                for path in gone:
                    pending.fresh.pop(path, None)
                pending.gone.update(gone)
                pending.fresh.update(fresh)
            if self._writer is None:
                self._writer = threading.Thread(target=self._write_forever, name="stat-index-writer", daemon=True)
                self._writer.start()
            self._changed.notify_all()

    def _write_forever(self) -> None:
        while True:
            with self._changed:
                while not self._pending and not self._closing:
                    self._changed.wait()
                if not self._pending:
                    return
                if not self._closing:
                    self._changed.wait_for(lambda: self._closing, timeout=WRITE_DELAY_SECONDS)
                pending, self._pending = self._pending, {}
                self._writing = True
            try:
                with self._db_lock:
                    for root_id, write in pending.items():
                        self._persist(root_id, write)
            except Exception:
                # The writer must outlive any one write, or every later update would queue forever.
                log.exception("stat index write failed; those entries stay in memory only")
            finally:
                with self._changed:
                    self._writing = False
                    self._changed.notify_all()

    def _persist(self, root_id: int, write: _PendingWrite) -> None:
        if self._db is None:
            return
        try:
            rows = {path: _sqlite_row(e) for path, e in write.fresh.items()}
            # An entry SQLite cannot hold goes with the removals: the file is read again after a
            # restart, and an older row of the path cannot stand in for it.
            gone = write.gone | {path for path, row in rows.items() if row is None}
            self._db.execute("BEGIN")
            try:
                # Removals first: a path removed, then indexed again, ends up with its new entry.
                if gone:
                    self._db.executemany("DELETE FROM entries WHERE root_id = ? AND path = ?",
                                         [(root_id, os.fsencode(path)) for path in gone])
                if write.fresh:
                    self._db.executemany(
                        "INSERT OR REPLACE INTO entries VALUES (?, ?, ?, ?, ?, ?, ?, ?)",
                        [(root_id, os.fsencode(path), *row) for path, row in rows.items() if row is not None])
                self._db.execute("COMMIT")
            except BaseException:
                self._db.execute("ROLLBACK")
                raise
            if len(write.fresh) + len(write.gone) >= BULK_UPDATE_ROWS:
                # Such an update leaves a log beyond journal_size_limit, which SQLite would cut
                # back at the next write. Emptied here instead, off every request's path.
                self._db.execute("PRAGMA wal_checkpoint(TRUNCATE)").fetchall()
        except sqlite3.DatabaseError as exc:
            log.warning("stat index update failed (%s); it stays in memory only", exc)

    def flush(self) -> None:
        """Returns once every update queued before the call is in the file."""
        with self._changed:
            while self._pending or self._writing:
                self._changed.wait()

    def close(self) -> None:
        """Writes what is queued, stops the writer, closes the file."""
        with self._changed:
            self._closing = True
            self._changed.notify_all()
            writer = self._writer
        if writer is not None:
            writer.join()
        with self._db_lock:
            if self._db is not None:
                self._db.close()
                self._db = None
