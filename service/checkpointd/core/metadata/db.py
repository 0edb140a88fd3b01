"""Database engine, sessions, schema migrations and cross-replica locks.

The URL selects the engine: SQLite (the default, one file in the data dir, served by one
process) or PostgreSQL (``postgresql+psycopg://user@host/db``, shared by any number of
replicas). The schema is owned by the Alembic migrations in ``checkpointd.migrations``;
``Database.migrate`` brings a database to this server's newest revision and refuses one
that a newer server has already moved past.
"""

from __future__ import annotations

import contextlib
import errno
import hashlib
import logging
import select
import sqlite3
import threading
import time
from collections.abc import Callable, Iterator
from concurrent.futures import Future
from contextlib import contextmanager
from typing import TYPE_CHECKING, Generic, Protocol, TypeVar

from alembic import command
from alembic.config import Config
from alembic.runtime.migration import MigrationContext
from alembic.script import ScriptDirectory
from sqlalchemy import Column, Connection, Engine, Executable, Table, bindparam, event, insert, inspect, text, update
from sqlalchemy.engine import Dialect, make_url
from sqlalchemy.exc import ArgumentError, DBAPIError, DisconnectionError
from sqlalchemy.pool import PoolProxiedConnection
from sqlmodel import Session, create_engine

from checkpointd.core.kernel import telemetry
from checkpointd.core.kernel.errors import Reason, ResourceExhausted
from checkpointd.core.metadata import models  # noqa: F401 - registers the tables

if TYPE_CHECKING:
    from checkpointd.core.metadata.postgres_rows import PostgresRows

log = logging.getLogger("checkpointd.db")
U = TypeVar("U")

#: Alembic's bookkeeping table, named so that it cannot clash with another application's.
SCHEMA_VERSION_TABLE = "checkpointd_schema_version"
#: The schema every checkpointd wrote before migrations existed; such a database is adopted at this revision.
BASELINE_REVISION = "0001"
BASELINE_TABLES = frozenset({"plans", "checkpoints", "operations", "config_values"})

#: Connections one server opens per pool at most (PostgreSQL: two pools, so twice this, plus the
#: group commit's own). Above the server's 32 RPC threads plus its background work.
POOL_LIMIT = 40

SQLITE = "sqlite"
POSTGRESQL = "postgresql"
#: URL schemes accepted, and the driver each one is run with.
_DRIVERS = {
    "sqlite": "sqlite",
    "sqlite+pysqlite": "sqlite",
    "postgresql": "postgresql+psycopg",
    "postgres": "postgresql+psycopg",
    "postgresql+psycopg": "postgresql+psycopg",
}


class SchemaError(RuntimeError):
    """The database holds a schema this server cannot use; it must not start on it."""


class DatabaseUrlError(ValueError):
    """A database URL this server cannot use."""


def normalize_url(url: str) -> str:
    """The URL with its driver made explicit; anything but SQLite or PostgreSQL (psycopg 3) is refused."""
    try:
        parsed = make_url(url)
    except ArgumentError:
        # The URL itself is not echoed: it may hold a password.
        raise DatabaseUrlError("the database URL cannot be parsed: use sqlite:///PATH or "
                               "postgresql+psycopg://USER@HOST:PORT/DB") from None
    driver = _DRIVERS.get(parsed.drivername)
    if driver is None:
        raise DatabaseUrlError(f"unsupported database URL scheme {parsed.drivername!r}: use sqlite:///PATH or "
                         "postgresql+psycopg://USER@HOST:PORT/DB")
    return parsed.set(drivername=driver).render_as_string(hide_password=False)


#: PostgreSQL's SQLSTATE for a full disk ("disk_full", class 53: insufficient resources).
_SQLSTATE_DISK_FULL = "53100"


def storage_exhausted(error: BaseException) -> ResourceExhausted | None:
    """The domain error for a write that the disk or the database had no room for (ENOSPC or
    EDQUOT, SQLite's SQLITE_FULL, PostgreSQL's disk_full), found in ``error`` or what caused
    it; None for any other error."""
    cause: BaseException | None = error
    for _ in range(8):
        if isinstance(cause, DBAPIError):
            cause = cause.orig
        if cause is None:
            break
        if isinstance(cause, OSError) and cause.errno in (errno.ENOSPC, errno.EDQUOT):
            return ResourceExhausted(Reason.STORAGE_EXHAUSTED, f"no room left to store data: {cause.strerror}")
        code = getattr(cause, "sqlite_errorcode", 0) if isinstance(cause, sqlite3.Error) else 0
        sqlite_full = code & 0xFF == sqlite3.SQLITE_FULL
        if sqlite_full or getattr(cause, "sqlstate", None) == _SQLSTATE_DISK_FULL:
            return ResourceExhausted(Reason.STORAGE_EXHAUSTED, "the metadata database has no room left on its disk")
        cause = cause.__cause__ or cause.__context__
    return None


def lock_key(name: str) -> int:
    """A stable signed 64-bit key for a PostgreSQL advisory lock, namespaced to checkpointd."""
    return int.from_bytes(hashlib.sha256(f"checkpointd:{name}".encode()).digest()[:8], "big", signed=True)


def alembic_config() -> Config:
    """Programmatic Alembic configuration (there is no alembic.ini)."""
    config = Config()
    config.set_main_option("script_location", "checkpointd:migrations")
    return config


def known_revisions() -> tuple[set[str], str]:
    """Every revision this server's migrations know, and the newest one."""
    script = ScriptDirectory.from_config(alembic_config())
    return {revision.revision for revision in script.walk_revisions()}, script.get_current_head()


class Database:
    def __init__(self, url: str) -> None:
        self.url = normalize_url(url)
        self.dialect = make_url(self.url).get_backend_name()
        self._locks_engine: Engine | None = None
        self._writer_turn = threading.Lock()
        self._writer: SqliteRows | PostgresRows | None = None
        # An operation holds one connection for its session and briefly takes a second (a config
        # read, a store commit): the pool must exceed the RPC threads, or they can all hold one
        # and wait for another.
        pool = {"pool_size": 10, "max_overflow": POOL_LIMIT - 10}
        if self.is_sqlite:
            self.engine = create_engine(self.url, connect_args={"check_same_thread": False, "timeout": 30}, **pool)
            event.listen(self.engine, "connect", _sqlite_pragmas)
        else:
            self.engine = create_engine(self.url, **pool)
            # Advisory locks live on connections of their own: a lock survives the commits of the
            # work it guards, and a waiting lock never holds a connection that work needs.
            self._locks_engine = create_engine(self.url, isolation_level="AUTOCOMMIT", **pool)
            for engine in (self.engine, self._locks_engine):
                event.listen(engine, "checkout", _discard_if_dropped)

    @property
    def is_sqlite(self) -> bool:
        return self.dialect == SQLITE

    @property
    def sqlite_path(self) -> str | None:
        """The SQLite database's file; None for PostgreSQL or an in-memory database."""
        database = make_url(self.url).database if self.is_sqlite else None
        return None if not database or database == ":memory:" else database

    @property
    def is_postgresql(self) -> bool:
        return self.dialect == POSTGRESQL

    # -- schema -------------------------------------------------------------------------

    def migrate(self) -> str:
        """Upgrades the schema to this server's newest revision; returns it.

        Replicas starting together on PostgreSQL take turns (an advisory lock held for the
        whole upgrade, which PostgreSQL runs in one transaction). A database at a revision
        this server does not know (a newer server migrated it) is refused with SchemaError.
        """
        known, head = known_revisions()
        engine = self._migration_engine()
        config = alembic_config()
        try:
            with engine.connect() as connection, connection.begin():
                if self.is_postgresql:
                    connection.execute(text("SELECT pg_advisory_xact_lock(:key)"), {"key": lock_key("migrate")})
                current = self._current_revisions(connection)
                unknown = sorted(current - known)
                if unknown:
                    raise SchemaError(
                        f"the database schema is at revision {', '.join(unknown)}, which this checkpointd does not "
                        f"know (its newest is {head}): a newer checkpointd has migrated this database. Run that "
                        "version, or point this one at another database.")
                config.attributes["connection"] = connection
                if not current and self._adopt_baseline(connection):
                    command.stamp(config, BASELINE_REVISION)
                    current = {BASELINE_REVISION}
                command.upgrade(config, "head")
            before = ", ".join(sorted(current)) or "an empty database"
            log.info("database schema at revision %s%s (%s)", head,
                     "" if current == {head} else f", upgraded from {before}", make_url(self.url).render_as_string())
        finally:
            if engine is not self.engine:
                engine.dispose()
        return head

    def create_schema(self) -> None:
        """Creates a new database's schema or upgrades an old one: the migrations do both."""
        self.migrate()

    def schema_revision(self) -> str | None:
        """The revision the database is at; None before the first migration."""
        with self.engine.connect() as connection:
            current = self._current_revisions(connection)
        return next(iter(current), None)

    @staticmethod
    def _current_revisions(connection: Connection) -> set[str]:
        context = MigrationContext.configure(connection, opts={"version_table": SCHEMA_VERSION_TABLE})
        return set(context.get_current_heads())

    @staticmethod
    def _adopt_baseline(connection: Connection) -> bool:
        """True for a database made before migrations existed: it has exactly the baseline tables."""
        present = BASELINE_TABLES & set(inspect(connection).get_table_names())
        if present and present != BASELINE_TABLES:
            raise SchemaError(f"the database has some checkpointd tables ({', '.join(sorted(present))}) but not "
                              f"all, and no {SCHEMA_VERSION_TABLE} table: refusing to guess its schema")
        return bool(present)

    def _migration_engine(self) -> Engine:
        """PostgreSQL runs DDL in transactions as is. Python's sqlite3 does not begin one before
        DDL, so SQLite migrations get an engine that does, with BEGIN IMMEDIATE: an upgrade is
        all or nothing, and a second process waits for the first instead of racing it."""
        if not self.is_sqlite:
            return self.engine
        engine = create_engine(self.url, connect_args={"check_same_thread": False, "timeout": 60})

        @event.listens_for(engine, "connect")
        def _manual_transactions(dbapi_connection, _record) -> None:
            dbapi_connection.isolation_level = None

        @event.listens_for(engine, "begin")
        def _begin_immediate(connection: Connection) -> None:
            connection.exec_driver_sql("BEGIN IMMEDIATE")

        return engine

    # -- sessions and locks -------------------------------------------------------------

    @contextmanager
    def session(self) -> Iterator[Session]:
        with Session(self.engine, expire_on_commit=False) as session:
            yield session

    @contextmanager
    def _row_transaction(self) -> Iterator[RowWriter]:
        """A short write transaction for ``group_commit``, committed on exit.

        On SQLite this process's writers take turns on a lock first (SQLite admits one writer at
        a time and makes the others poll with sleeps of milliseconds, which would cap concurrent
        checkpoints at a few hundred per second), then write on one dedicated connection with
        precompiled statements: the pool checkout and statement execution of the ORM layer cost
        more than the write itself. PostgreSQL writes the same way, pipelined (``PostgresRows``)."""
        with self._writer_turn:
            writer = self._writer
            if writer is None or not writer.usable():
                if writer is not None:
                    writer.close()
                writer = self._writer = self._new_writer()
            with writer.transaction():
                yield writer

    def _new_writer(self) -> SqliteRows | PostgresRows:
        if self.is_sqlite:
            return SqliteRows(self.engine)
        # Imported here: a server on SQLite never loads the PostgreSQL driver.
        from checkpointd.core.metadata.postgres_rows import PostgresRows

        return PostgresRows(self.engine)

    def commit_unsynced(self, statement: Executable) -> None:
        """Runs one write statement in a transaction of its own whose commit does not wait for the
        disk. A process killed after it keeps it (SQLite's log and PostgreSQL's are written before
        this returns); a power cut may take it back, with every later commit up to the next synced
        one, which makes it durable (the log is one sequence). For writes whose loss is harmless."""
        with self.engine.connect() as connection:
            if self.is_sqlite:
                # A pragma of this connection only (WAL mode: the commit appends to the log, unsynced).
                connection.exec_driver_sql("PRAGMA synchronous=NORMAL")
                try:
                    connection.execute(statement)
                    connection.commit()
                finally:
                    try:
                        connection.exec_driver_sql("PRAGMA synchronous=FULL")
                    except BaseException:
                        # A pooled connection must never commit unsynced by mistake.
                        connection.invalidate()
                        raise
            else:
                connection.execute(text("SET LOCAL synchronous_commit TO OFF"))
                connection.execute(statement)
                connection.commit()

    def group_commit(self, write: Callable[[RowWriter, list[U]], None]) -> GroupCommit[U]:
        """A queue whose items are written by ``write`` in transactions shared by concurrent callers."""
        return GroupCommit(self._row_transaction, write)

    def advisory_lock(self, name: str, shared: bool = False) -> AdvisoryLock:
        """A lock every replica on this database sees (PostgreSQL); a no-op on SQLite, whose
        single server process serializes with in-process locks (every plan operation asks for
        one: on SQLite it costs neither a hash of the name nor an object)."""
        if self._locks_engine is None:
            return _NO_LOCK
        return AdvisoryLock(self._locks_engine, lock_key(name), shared)

    def dispose(self) -> None:
        with self._writer_turn:
            if self._writer is not None:
                self._writer.close()
                self._writer = None
        self.engine.dispose()
        if self._locks_engine is not None:
            self._locks_engine.dispose()


class RowWriter(Protocol):
    """The writes a group commit makes, on either database."""

    def increment(self, counter: Column, key: Column, keys: list[object],
                  also: Column | None = None) -> dict[object, tuple[int, object]]:
        """Adds one to the integer ``counter`` in the rows whose ``key`` is in ``keys``; returns key ->
        (new value, the row's ``also`` column or None), read in the same statement."""

    def insert(self, table: Table, rows: list[dict[str, object]]) -> None:
        """Inserts ``rows``; each gives every column of ``table`` (defaults are not applied)."""


class CoreRows:
    """A RowWriter on a SQLAlchemy connection: any database, and inside ORM sessions."""

    def __init__(self, connection: Connection) -> None:
        self.connection = connection

    def increment(self, counter: Column, key: Column, keys: list[object],
                  also: Column | None = None) -> dict[object, tuple[int, object]]:
        result = self.connection.execute(_increment_statement(counter, key, also, one_key=False), {"keys": keys})
        return {row[0]: (row[1], row[2] if also is not None else None) for row in result}

    def insert(self, table: Table, rows: list[dict[str, object]]) -> None:
        self.connection.execute(_insert_statement(table), rows)


#: The writers' statements by what they do: building one costs more than running it.
_STATEMENTS: dict[tuple[object, ...], Executable] = {}


def _increment_statement(counter: Column, key: Column, also: Column | None, *, one_key: bool) -> Executable:
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


def _insert_statement(table: Table) -> Executable:
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

    @contextmanager
    def transaction(self) -> Iterator[None]:
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
        compiled = self._compile(_increment_statement(counter, key, also, one_key=True))
        values = {}
        for value in keys:
            row = self._run(compiled.sql, compiled.parameters({"key": value})).fetchone()
            if row is not None:
                values[value] = (row[0], row[1] if also is not None else None)
        return values

    def insert(self, table: Table, rows: list[dict[str, object]]) -> None:
        compiled = self._compile(_insert_statement(table))
        for row in rows:
            self._run(compiled.sql, compiled.parameters(row))


class _Unit(Generic[U]):
    __slots__ = ("item", "finished", "error", "prepare", "future")

    def __init__(self, item: U, prepare: Callable[[], None] | None = None, future: Future[None] | None = None) -> None:
        self.item = item
        self.finished = False
        self.error: BaseException | None = None
        #: Work the committing thread does for this item before its transaction (see ``submit_nowait``).
        self.prepare = prepare
        #: Set for items submitted without waiting: completed when the item is written or has failed.
        self.future = future


class GroupCommit(Generic[U]):
    """Group commit: items submitted by concurrent callers are written together, in one
    transaction, so one commit (one log fsync) and one statement per table serve every item
    waiting at that moment.

    The first caller of ``submit`` to find no group running leads one with every item queued so
    far, its own included; the others wait for theirs to be written or for their turn to lead. A
    caller alone pays nothing extra. Callers that must not block (an event loop) use
    ``submit_nowait``; a thread of the group commit's own leads when no caller does.
    ``write(rows, items)`` writes a group. If a group's transaction fails, each of its items is
    written again alone, so one item's error (a request_id taken before) fails only that item;
    ``write`` must therefore not change anything outside the database that a second run would not set again.
    """

    def __init__(self, transaction: Callable[[], contextlib.AbstractContextManager[RowWriter]],
                 write: Callable[[RowWriter, list[U]], None]) -> None:
        self._transaction = transaction
        self._write = write
        self._queue: list[_Unit[U]] = []
        self._leading = False
        guard = threading.Lock()
        self._turn = threading.Condition(guard)
        #: Wakes the group commit's own thread: items of ``submit_nowait`` wait and nobody leads.
        self._unled = threading.Condition(guard)
        self._committer: threading.Thread | None = None
        self._closed = False

    def submit(self, item: U) -> None:
        """Returns once ``item`` is committed; raises what writing it raised."""
        unit = _Unit(item)
        with self._turn:
            self._queue.append(unit)
            while self._leading and not unit.finished:
                self._turn.wait()
            if not unit.finished:
                self._leading = True
                group, self._queue = self._queue, []
        if not unit.finished:
            self._lead(group)
        if unit.error is not None:
            raise unit.error

    def submit_nowait(self, item: U, prepare: Callable[[], None] | None = None) -> Future[None]:
        """Queues ``item`` and returns at once: the future completes when the item is committed
        (or fails with what writing it raised). ``prepare`` runs on the committing thread before
        the item's transaction, so that a caller that must not block hands its blocking work over
        (making durable the objects the item references); if it raises, the item fails alone."""
        unit = _Unit(item, prepare, Future())
        with self._turn:
            if self._closed:
                raise RuntimeError("the group commit is closed")
            self._queue.append(unit)
            if self._committer is None:
                self._committer = threading.Thread(target=self._lead_unled, name="group-commit", daemon=True)
                self._committer.start()
            if not self._leading:
                self._unled.notify()
        return unit.future

    def close(self) -> None:
        """Ends the group commit's own thread once the items queued without waiting are written."""
        with self._turn:
            self._closed = True
            self._unled.notify()
            committer = self._committer
        if committer is not None:
            committer.join()

    def _lead_unled(self) -> None:
        while True:
            with self._turn:
                while self._leading or not self._queue:
                    if self._closed and not self._queue:
                        return
                    self._unled.wait()
                self._leading = True
                group, self._queue = self._queue, []
            self._lead(group)

    def _lead(self, group: list[_Unit[U]]) -> None:
        try:
            self._apply(group)
        finally:
            with self._turn:
                self._leading = False
                self._turn.notify_all()
                if self._queue:
                    self._unled.notify()

    def _apply(self, group: list[_Unit[U]]) -> None:
        ready = []
        for unit in group:
            if unit.prepare is not None:
                try:
                    unit.prepare()
                except BaseException as exc:
                    self._finish(unit, exc)
                    continue
                # A lone second attempt (below) does not prepare again.
                unit.prepare = None
            ready.append(unit)
        if not ready:
            return
        started = time.perf_counter()
        try:
            with self._transaction() as rows:
                self._write(rows, [unit.item for unit in ready])
        except BaseException as exc:
            if len(ready) == 1 or not isinstance(exc, Exception):
                for unit in ready:
                    self._finish(unit, exc)
                return
            for unit in ready:
                self._apply([unit])
            return
        telemetry.made_durable(telemetry.Durable.METADATA, time.perf_counter() - started)
        for unit in ready:
            self._finish(unit, None)

    @staticmethod
    def _finish(unit: _Unit[U], error: BaseException | None) -> None:
        unit.error, unit.finished = error, True
        if unit.future is None:
            return
        if error is None:
            unit.future.set_result(None)
        else:
            unit.future.set_exception(error)


class AdvisoryLock:
    """A PostgreSQL session-level advisory lock held on its own pooled connection (checked
    by use rather than by a ping: a lock statement on a dropped connection is retried once).

    Both statements run on the pooled connection's driver: through Core (a ``Connection`` and a
    ``text()`` statement), taking and releasing a lock cost as much CPU as a checkpoint's whole
    transaction. If the server dies, PostgreSQL ends the connection and so releases the lock.
    ``acquire`` and ``release`` may run on different threads (the content store's GC fence does so).
    """

    _LOCK_SQL = {False: "SELECT pg_advisory_lock(%s)", True: "SELECT pg_advisory_lock_shared(%s)"}
    _UNLOCK_SQL = {False: "SELECT pg_advisory_unlock(%s)", True: "SELECT pg_advisory_unlock_shared(%s)"}

    def __init__(self, engine: Engine | None, key: int, shared: bool) -> None:
        self._engine = engine
        self._key = key
        self._lock_sql = self._LOCK_SQL[shared]
        self._unlock_sql = self._UNLOCK_SQL[shared]
        self._connection: PoolProxiedConnection | None = None
        self._guard = threading.Lock()

    def acquire(self) -> None:
        if self._engine is None:
            return
        dialect = self._engine.dialect
        driver_error = dialect.loaded_dbapi.Error
        for attempt in (1, 2):
            try:
                connection = self._engine.raw_connection()
            except driver_error as exc:
                # As Core reports a failed connect: the driver's error inside SQLAlchemy's.
                raise DBAPIError.instance(None, None, exc, driver_error) from exc
            try:
                connection.driver_connection.execute(self._lock_sql, (self._key,))
            except BaseException as exc:
                dropped = dialect.is_disconnect(exc, connection.driver_connection, None)
                connection.invalidate()
                connection.close()
                # A pooled connection the server dropped (a restart): once more on a new one.
                if attempt == 1 and dropped:
                    continue
                if isinstance(exc, driver_error):
                    raise DBAPIError.instance(self._lock_sql, (self._key,), exc, driver_error,
                                              connection_invalidated=dropped) from exc
                raise
            with self._guard:
                self._connection = connection
            return

    def release(self) -> None:
        with self._guard:
            connection, self._connection = self._connection, None
        if connection is None:
            return
        try:
            connection.driver_connection.execute(self._unlock_sql, (self._key,))
        except Exception:
            # A connection that cannot unlock is closed for good, which releases its locks.
            connection.invalidate()
        finally:
            connection.close()

    def __enter__(self) -> AdvisoryLock:
        self.acquire()
        return self

    def __exit__(self, *_exc: object) -> None:
        self.release()


#: The lock of a database without advisory locks (SQLite): taking it does nothing, so one serves all.
_NO_LOCK = AdvisoryLock(None, 0, False)


def _discard_if_dropped(dbapi_connection, _record, _proxy) -> None:
    """Replaces a pooled PostgreSQL connection that the server has ended, before it is used.

    The server writes its reason and closes the socket when it ends a session (a restart, a
    failover, ``pg_terminate_backend``), so an idle connection's socket turns readable. Checking
    that costs no round trip, where ``pool_pre_ping`` sends a query on every checkout. The pool
    retries a checkout on ``DisconnectionError`` with a new connection. A connection that dies
    silently with its host is not caught here, nor by a ping until TCP gives up."""
    if _was_dropped(dbapi_connection):
        raise DisconnectionError("the server ended this pooled connection")


def _was_dropped(connection) -> bool:
    """Whether an idle connection is closed, or its socket has something to read: the server's
    farewell (see ``_discard_if_dropped``)."""
    if connection.closed or connection.broken:
        return True
    poller = select.poll()
    poller.register(connection.fileno(), select.POLLIN | select.POLLPRI)
    return bool(poller.poll(0))


def _sqlite_pragmas(dbapi_connection, _record) -> None:
    """WAL for concurrent readers; FULL sync so a committed checkpoint survives power loss."""
    cursor = dbapi_connection.cursor()
    cursor.execute("PRAGMA journal_mode=WAL")
    cursor.execute("PRAGMA synchronous=FULL")
    cursor.execute("PRAGMA foreign_keys=ON")
    cursor.close()
