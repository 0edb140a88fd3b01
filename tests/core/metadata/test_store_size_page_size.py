"""A metadata database created now has small pages (each near-empty table costs 1 KiB, not 4:
issue 21's store size), and one created with SQLite's 4 KiB pages is still read and written,
its log still checkpointed after the same number of bytes."""

from __future__ import annotations

import sqlite3
from pathlib import Path

from sqlalchemy import text

from checkpointd.core.metadata import db as db_module
from checkpointd.core.metadata.db import Database


def _pragma(database: Database, name: str) -> int:
    with database.engine.connect() as connection:
        return connection.exec_driver_sql(f"PRAGMA {name}").scalar()


def test_a_new_database_has_small_pages_and_checkpoints_its_log_after_a_mebibyte(tmp_path: Path) -> None:
    database = Database(f"sqlite:///{tmp_path / 'meta.db'}")
    try:
        database.migrate()  # creates the database: the schema a server starts with
        assert _pragma(database, "page_size") == db_module.PAGE_SIZE == 1024
        assert _pragma(database, "wal_autocheckpoint") * 1024 == db_module.WAL_AUTOCHECKPOINT_BYTES
        tables = _pragma(database, "page_count")
        assert tables * db_module.PAGE_SIZE < 48 * 1024, "each near-empty table or index: 1 KiB"
        with database.engine.begin() as connection:
            connection.execute(text("CREATE TABLE rows_of_a_test (id INTEGER PRIMARY KEY, body TEXT)"))
        assert _pragma(database, "page_count") == tables + 1
    finally:
        database.dispose()


def test_a_database_with_4_kib_pages_keeps_them_and_is_read_and_written(tmp_path: Path) -> None:
    path = tmp_path / "old.db"
    old = sqlite3.connect(path)
    old.execute("PRAGMA page_size=4096")
    old.execute("PRAGMA journal_mode=WAL")
    old.execute("CREATE TABLE rows_of_a_test (id INTEGER PRIMARY KEY, body TEXT)")
    old.executemany("INSERT INTO rows_of_a_test (body) VALUES (?)", [(f"row {i}",) for i in range(500)])
    old.commit()
    old.close()
    database = Database(f"sqlite:///{path}")
    try:
        assert _pragma(database, "page_size") == 4096
        assert _pragma(database, "wal_autocheckpoint") * 4096 == db_module.WAL_AUTOCHECKPOINT_BYTES
        with database.engine.begin() as connection:
            connection.execute(text("INSERT INTO rows_of_a_test (body) VALUES ('written now')"))
        with database.engine.connect() as connection:
            bodies = connection.execute(text("SELECT body FROM rows_of_a_test ORDER BY id")).scalars().all()
        assert bodies == [f"row {i}" for i in range(500)] + ["written now"]
    finally:
        database.dispose()
