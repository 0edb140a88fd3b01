"""The metadata database's write-ahead log stays small: it is checkpointed every
``WAL_AUTOCHECKPOINT_BYTES`` (not SQLite's 4 MiB), and emptied after maintenance."""

from __future__ import annotations

import os
from pathlib import Path

from sqlalchemy import Column, Integer, LargeBinary, MetaData, Table, insert

from checkpointd.core.metadata import db as db_module
from checkpointd.core.metadata.db import Database

_metadata = MetaData()
_BLOBS = Table("wal_blobs", _metadata, Column("id", Integer, primary_key=True), Column("body", LargeBinary))


def test_every_connection_checkpoints_a_small_log_and_truncate_wal_empties_it(tmp_path: Path) -> None:
    database = Database(f"sqlite:///{tmp_path / 'meta.db'}")
    try:
        _metadata.create_all(database.engine)
        with database.engine.connect() as connection:
            pages = connection.exec_driver_sql("PRAGMA wal_autocheckpoint").scalar()
            limit = connection.exec_driver_sql("PRAGMA journal_size_limit").scalar()
        assert pages * db_module.PAGE_SIZE == db_module.WAL_AUTOCHECKPOINT_BYTES < 1000 * 4096
        assert limit == db_module.WAL_SIZE_LIMIT
        wal = tmp_path / "meta.db-wal"
        with database.engine.begin() as connection:  # one bulk transaction: the log grows past the limit
            connection.execute(insert(_BLOBS), [{"body": os.urandom(4096)} for _ in range(600)])
        assert wal.stat().st_size > db_module.WAL_SIZE_LIMIT

        assert database.truncate_wal() is True

        assert wal.stat().st_size == 0
    finally:
        database.dispose()
