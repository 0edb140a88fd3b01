"""The group commit's writer on PostgreSQL (``Database._row_transaction`` takes it), kept apart
so that a server on SQLite never imports the PostgreSQL driver."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager

import psycopg
from sqlalchemy import Column, Engine, Executable, Table
from sqlalchemy.exc import DBAPIError

from checkpointd.core.metadata.rows import (
    ADVISORY_LOCKS_HELD,
    XACT_LOCK_SHARED,
    DedicatedConnection,
    increment_statement,
    insert_statement,
    was_dropped,
)


class PostgresRows(DedicatedConnection):
    """A RowWriter on one dedicated PostgreSQL connection that sends a transaction's statements
    in pipeline mode: BEGIN and the numbering UPDATEs go in one round trip, the INSERTs and
    COMMIT in a second (through Core, each statement and the BEGIN and COMMIT cost one each,
    plus the pool's checkout).

    Statements are compiled for the driver's positional parameters. Driver errors come out as
    SQLAlchemy's (an ``IntegrityError`` stays one); a connection left in a transaction is rolled
    back, one that cannot be is not used again. Callers serialize its use."""

    driver_error = psycopg.Error

    def __init__(self, engine: Engine) -> None:
        super().__init__(engine, type(engine.dialect)(paramstyle="format"))
        self._driver.autocommit = True
        self._cursor = self._driver.cursor()
        self._pipeline: psycopg.Pipeline | None = None

    @contextmanager
    def transaction(self) -> Iterator[None]:
        try:
            with self._driver.pipeline() as pipeline:
                self._pipeline = pipeline
                self._driver.execute("BEGIN")
                yield
                self._driver.execute("COMMIT")
                pipeline.sync()
        except psycopg.Error as error:
            self._end_transaction()
            raise DBAPIError.instance("COMMIT", (), error, psycopg.Error) from error
        except BaseException:
            self._end_transaction()
            raise
        finally:
            self._pipeline = None

    def _end_transaction(self) -> None:
        try:
            if self._driver.info.transaction_status != psycopg.pq.TransactionStatus.IDLE:
                self._driver.execute("ROLLBACK")
        except psycopg.Error:
            # A connection that cannot roll back is not used again.
            self.close()

    def usable(self) -> bool:
        return not self.closed and not was_dropped(self._driver)

    def increment(self, counter: Column, key: Column, keys: list[object],
                  also: Column | None = None) -> dict[object, tuple[int, object]]:
        compiled = self._compile(increment_statement(counter, key, also, one_key=True))
        cursor = self._cursor
        try:
            cursor.executemany(compiled.sql, [compiled.parameters({"key": value}) for value in keys], returning=True)
            self._pipeline.sync()
            values = {}
            for value in keys:
                row = cursor.fetchone()
                if row is not None:
                    values[value] = (row[0], row[1] if also is not None else None)
                cursor.nextset()
        except psycopg.Error as error:
            raise DBAPIError.instance(compiled.sql, (), error, psycopg.Error) from error
        return values

    def insert(self, table: Table, rows: list[dict[str, object]]) -> None:
        compiled = self._compile(insert_statement(table))
        try:
            self._cursor.executemany(compiled.sql, [compiled.parameters(row) for row in rows])
        except psycopg.Error as error:
            raise DBAPIError.instance(compiled.sql, (), error, psycopg.Error) from error

    def scalar_under_shared_lock(self, lock_key: int, statement: Executable) -> object:
        lock, read = self._compile(XACT_LOCK_SHARED), self._compile(statement)
        try:
            self._driver.execute(lock.sql, lock.parameters({"key": lock_key}))
            self._cursor.execute(read.sql, read.parameters({}))
            self._pipeline.sync()
            row = self._cursor.fetchone()
        except psycopg.Error as error:
            raise DBAPIError.instance(read.sql, (), error, psycopg.Error) from error
        return row[0]

    def advisory_locks_held(self, pids: list[int]) -> set[tuple[int, int, object]]:
        compiled = self._compile(ADVISORY_LOCKS_HELD)
        try:
            self._cursor.execute(compiled.sql, compiled.parameters({"pids": pids}))
            self._pipeline.sync()
            rows = self._cursor.fetchall()
        except psycopg.Error as error:
            raise DBAPIError.instance(compiled.sql, (), error, psycopg.Error) from error
        return {(key, pid, start) for key, pid, start in rows}
