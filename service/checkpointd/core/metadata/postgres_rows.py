"""The group commit's writer on PostgreSQL (``Database._row_transaction`` takes it), kept apart
so that a server on SQLite never imports the PostgreSQL driver."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager

import psycopg
from sqlalchemy import Column, Engine, Executable, Table
from sqlalchemy.exc import DBAPIError

from checkpointd.core.metadata.rows import (
    DedicatedConnection,
    Judge,
    Statement,
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
        self._checks: list[tuple[list[Statement], Judge]] = []
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
            checks, self._checks = self._checks, []
            checked = [(judge, [self._queue(statement, parameters) for statement, parameters in statements])
                       for statements, judge in checks]
            self._pipeline.sync()
            values = {}
            for value in keys:
                row = cursor.fetchone()
                if row is not None:
                    values[value] = (row[0], row[1] if also is not None else None)
                cursor.nextset()
            results = [(judge, [queued.fetchall() for queued in cursors]) for judge, cursors in checked]
        except psycopg.Error as error:
            raise DBAPIError.instance(compiled.sql, (), error, psycopg.Error) from error
        for judge, rows in results:
            judge(rows)
        return values

    def _queue(self, statement: Executable, parameters: dict[str, object]) -> psycopg.Cursor:
        """Sends a check's statement in the pipeline on a cursor of its own (read after the sync)."""
        compiled = self._compile(statement)
        queued = self._driver.cursor()
        queued.execute(compiled.sql, compiled.parameters(parameters))
        return queued

    def insert(self, table: Table, rows: list[dict[str, object]]) -> None:
        compiled = self._compile(insert_statement(table))
        try:
            self._cursor.executemany(compiled.sql, [compiled.parameters(row) for row in rows])
        except psycopg.Error as error:
            raise DBAPIError.instance(compiled.sql, (), error, psycopg.Error) from error

    def check(self, statements: list[Statement], judge: Judge) -> None:
        self._checks.append((statements, judge))
