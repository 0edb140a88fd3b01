"""The group commit's row writers: a dedicated connection per database that sends the same
Core statements without the ORM (``SqliteRows`` here, ``PostgresRows`` in ``postgres_rows``),
and ``CoreRows`` on an ordinary SQLAlchemy connection."""

from __future__ import annotations

import contextlib
import select
import sqlite3
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Protocol

from sqlalchemy import Column, Connection, Engine, Executable, Table, bindparam, func, insert, text, update
from sqlalchemy import select as sql_select
from sqlalchemy.engine import Dialect
from sqlalchemy.exc import DBAPIError


class RowWriter(Protocol):
    """The writes a group commit makes, on either database."""

    def increment(self, counter: Column, key: Column, keys: list[object],
                  also: Column | None = None) -> dict[object, tuple[int, object]]:
        """Adds one to the integer ``counter`` in the rows whose ``key`` is in ``keys``; returns key ->
        (new value, the row's ``also`` column or None), read in the same statement."""

    def insert(self, table: Table, rows: list[dict[str, object]]) -> None:
        """Inserts ``rows``; each gives every column of ``table`` (defaults are not applied)."""

    def check(self, statements: list[Statement], judge: Judge) -> None:
        """Queues ``statements`` to run in this transaction right after the next ``increment``'s (in
        its round trip on PostgreSQL), in order, each with a snapshot of its own, then hands
        ``judge`` each one's rows: what it raises ends the transaction (nothing is committed)."""


#: A statement and its parameters, for ``RowWriter.check``.
Statement = tuple[Executable, dict[str, object]]
#: Judges the rows of ``RowWriter.check``'s statements (a list of rows per statement).
Judge = Callable[[list[list[tuple]]], None]


#: Takes an advisory lock shared for the rest of the transaction (waiting for an exclusive holder).
XACT_LOCK_SHARED = sql_select(func.pg_advisory_xact_lock_shared(bindparam("key")))
#: The advisory locks held now by the sessions ``:pids``: (key, pid, session start) each.
#: pg_locks shows a bigint key as its high (classid) and low (objid) 32 bits;
#: shifting the high half back into a bigint gives the key's sign back too.
ADVISORY_LOCKS_HELD = text(
    "SELECT ((l.classid::bigint << 32) | l.objid::bigint), l.pid, a.backend_start "
    "FROM pg_locks l JOIN pg_stat_activity a ON a.pid = l.pid "
    "WHERE l.locktype = 'advisory' AND l.granted AND l.objsubid = 1 AND l.pid = ANY(:pids) "
    "AND l.database = (SELECT oid FROM pg_database WHERE datname = current_database())")


class CoreRows:
    """A RowWriter on a SQLAlchemy connection: any database, and inside ORM sessions."""

    def __init__(self, connection: Connection) -> None:
        self.connection = connection
        self._checks: list[tuple[list[Statement], Judge]] = []

    def increment(self, counter: Column, key: Column, keys: list[object],
                  also: Column | None = None) -> dict[object, tuple[int, object]]:
        result = self.connection.execute(increment_statement(counter, key, also, one_key=False), {"keys": keys})
        values = {row[0]: (row[1], row[2] if also is not None else None) for row in result}
        self._run_checks()
        return values

    def insert(self, table: Table, rows: list[dict[str, object]]) -> None:
        self.connection.execute(insert_statement(table), rows)

    def check(self, statements: list[Statement], judge: Judge) -> None:
        self._checks.append((statements, judge))

    def _run_checks(self) -> None:
        checks, self._checks = self._checks, []
        for statements, judge in checks:
            judge([list(map(tuple, self.connection.execute(statement, parameters)))
                   for statement, parameters in statements])


#: The writers' statements by what they do: building one costs more than running it.
_STATEMENTS: dict[tuple[object, ...], Executable] = {}


def increment_statement(counter: Column, key: Column, also: Column | None, *, one_key: bool) -> Executable:
    """``counter = counter + 1`` in the row with ``:key`` (returning the new value), or in the
    rows whose key is in ``:keys`` (returning key and value); either also returns ``also``."""
    name = ("increment", counter.table.name, counter.name, key.name, also.name if also is not None else "", one_key)
    statement = _STATEMENTS.get(name)
    if statement is None:
        where = key == bindparam("key") if one_key else key.in_(bindparam("keys", expanding=True))
        returned = (counter,) if one_key else (key, counter)
        if also is not None:
            returned += (also,)
        statement = _STATEMENTS[name] = (update(counter.table).where(where)
                                         .values({counter.name: counter + 1}).returning(*returned))
    return statement


def insert_statement(table: Table) -> Executable:
    name = ("insert", table.name)
    statement = _STATEMENTS.get(name)
    if statement is None:
        statement = _STATEMENTS[name] = insert(table)
    return statement


class _Compiled:
    """A statement rendered once for one dialect, with its parameters' order and converters."""

    __slots__ = ("sql", "_names", "_constants", "_converters")

    def __init__(self, statement: Executable, dialect: Dialect) -> None:
        compiled = statement.compile(dialect=dialect)
        self.sql = compiled.string
        self._names = tuple(compiled.positiontup)
        self._constants = compiled.params
        self._converters = tuple(compiled.binds[name].type.dialect_impl(dialect).bind_processor(dialect)
                                 for name in self._names)

    def parameters(self, values: dict[str, object]) -> tuple[object, ...]:
        constants = self._constants
        out = []
        for name, convert in zip(self._names, self._converters, strict=True):
            value = values[name] if name in values else constants[name]
            # Called for None too, as Core does (a JSON column turns it into 'null').
            out.append(value if convert is None else convert(value))
        return tuple(out)


class DedicatedConnection:
    """What the group commit's writers share: a driver connection taken out of the pool for
    good, and Core statements compiled once for it (so column types convert values as Core
    does). ``driver_error`` is the driver's base exception."""

    driver_error: type[Exception] = Exception

    def __init__(self, engine: Engine, dialect: Dialect) -> None:
        self._dialect = dialect
        proxied = engine.raw_connection()
        self._driver = proxied.driver_connection
        proxied.detach()
        self._compiled: dict[Executable, _Compiled] = {}
        self.closed = False

    def usable(self) -> bool:
        """False once the connection is closed (or found dropped): a new writer takes over."""
        return not self.closed

    def close(self) -> None:
        self.closed = True
        with contextlib.suppress(self.driver_error):
            self._driver.close()

    def _compile(self, statement: Executable) -> _Compiled:
        compiled = self._compiled.get(statement)
        if compiled is None:
            compiled = self._compiled[statement] = _Compiled(statement, self._dialect)
        return compiled


class SqliteRows(DedicatedConnection):
    """A RowWriter on one dedicated SQLite connection.

    Statements run on the driver's cursor. Driver errors come out as SQLAlchemy's (an
    ``IntegrityError`` stays one). Callers serialize its use."""

    driver_error = sqlite3.Error

    def __init__(self, engine: Engine) -> None:
        super().__init__(engine, engine.dialect)
        # Autocommit mode: this connection's transactions are the explicit BEGIN IMMEDIATE below.
        self._driver.isolation_level = None
        self._cursor = self._driver.cursor()

    def close(self) -> None:
        # The cursor first: a statement it still holds (the one that failed) would keep the closed
        # connection open, with its transaction's write lock, until the cursor is collected.
        with contextlib.suppress(sqlite3.Error):
            self._cursor.close()
        super().close()

    @contextmanager
    def transaction(self) -> Iterator[None]:
        self._checks: list[tuple[list[Statement], Judge]] = []
        self._run("BEGIN IMMEDIATE", ())
        try:
            yield
            self._run("COMMIT", ())
        except BaseException:
            try:
                if self._driver.in_transaction:
                    self._driver.execute("ROLLBACK")
            except sqlite3.Error:
                # A connection that cannot roll back is not used again.
                self.close()
            raise

    def _run(self, sql: str, parameters: tuple[object, ...]) -> sqlite3.Cursor:
        try:
            return self._cursor.execute(sql, parameters)
        except sqlite3.Error as error:
            raise DBAPIError.instance(sql, parameters, error, sqlite3.Error) from error

    def increment(self, counter: Column, key: Column, keys: list[object],
                  also: Column | None = None) -> dict[object, tuple[int, object]]:
        compiled = self._compile(increment_statement(counter, key, also, one_key=True))
        values = {}
        for value in keys:
            row = self._run(compiled.sql, compiled.parameters({"key": value})).fetchone()
            if row is not None:
                values[value] = (row[0], row[1] if also is not None else None)
        checks, self._checks = self._checks, []
        for statements, judge in checks:
            judge([self._fetch(statement, parameters) for statement, parameters in statements])
        return values

    def _fetch(self, statement: Executable, parameters: dict[str, object]) -> list[tuple]:
        compiled = self._compile(statement)
        return self._run(compiled.sql, compiled.parameters(parameters)).fetchall()

    def insert(self, table: Table, rows: list[dict[str, object]]) -> None:
        compiled = self._compile(insert_statement(table))
        for row in rows:
            self._run(compiled.sql, compiled.parameters(row))

    def check(self, statements: list[Statement], judge: Judge) -> None:
        self._checks.append((statements, judge))


def was_dropped(connection) -> bool:
    """Whether an idle connection is closed, or its socket has something to read: the server's
    farewell (see ``db._discard_if_dropped``)."""
    if connection.closed or connection.broken:
        return True
    poller = select.poll()
    poller.register(connection.fileno(), select.POLLIN | select.POLLPRI)
    return bool(poller.poll(0))
