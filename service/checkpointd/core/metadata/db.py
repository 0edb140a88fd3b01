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
import sqlite3
import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from datetime import datetime
from typing import TYPE_CHECKING, TypeVar

from alembic import command
from alembic.config import Config
from alembic.runtime.migration import MigrationContext
from alembic.script import ScriptDirectory
from sqlalchemy import Connection, Engine, Executable, event, inspect, text
from sqlalchemy.engine import make_url
from sqlalchemy.exc import ArgumentError, DBAPIError, DisconnectionError
from sqlalchemy.pool import PoolProxiedConnection
from sqlmodel import Session, create_engine

from checkpointd.core.kernel.errors import Reason, ResourceExhausted
from checkpointd.core.kernel.private_files import tighten_sqlite
from checkpointd.core.metadata import models  # noqa: F401 - registers the tables
from checkpointd.core.metadata.group_commit import GroupCommit
from checkpointd.core.metadata.rows import RowWriter, SqliteRows, was_dropped

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
    if driver == "sqlite" and parsed.database in (None, "", ":memory:"):
        # Every checkpoint would be gone at the next start (and each pooled connection would get
        # a database of its own).
        raise DatabaseUrlError("a SQLite database in memory keeps nothing across a restart: use sqlite:///PATH")
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


#: libpq's TCP keepalives, unless the URL sets its own: a connection whose peer vanished with its
#: network (no farewell on the socket) is seen dead in about 25 s rather than when TCP gives up
#: (minutes), and a replica holding locks on it stops (see ``AdvisoryLock.session_ended``).
TCP_KEEPALIVES = {"keepalives": 1, "keepalives_idle": 10, "keepalives_interval": 5, "keepalives_count": 3}


def _tcp_keepalives(url: str) -> dict[str, int]:
    given = make_url(url).query
    return {name: value for name, value in TCP_KEEPALIVES.items() if name not in given}


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
            if self.sqlite_path is not None:
                # Made private before SQLite makes it (with the umask's mode), where it can be made:
                # where it cannot, SQLite's own open says why.
                with contextlib.suppress(OSError):
                    tighten_sqlite(self.sqlite_path)
            self.engine = create_engine(self.url, connect_args={"check_same_thread": False, "timeout": 30}, **pool)
            event.listen(self.engine, "connect", _sqlite_pragmas)
        else:
            keepalives = _tcp_keepalives(self.url)
            self.engine = create_engine(self.url, connect_args=keepalives, **pool)
            # Advisory locks live on connections of their own: a lock survives the commits of the
            # work it guards, and a waiting lock never holds a connection that work needs.
            self._locks_engine = create_engine(self.url, isolation_level="AUTOCOMMIT", connect_args=keepalives,
                                               **pool)
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
            dbapi_connection.execute(f"PRAGMA page_size={PAGE_SIZE}")  # a database this creates

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

    def truncate_wal(self) -> bool:
        """SQLite: copies the whole write-ahead log into the database and empties it (after a
        maintenance run, which writes much of it). False if a reader kept part of it (it is copied
        at a later checkpoint) or on PostgreSQL, which keeps no such file here."""
        if not self.is_sqlite:
            return False
        with self.engine.connect() as connection:
            busy, _log_pages, _copied = connection.exec_driver_sql("PRAGMA wal_checkpoint(TRUNCATE)").one()
        return not busy

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
    _TRY_LOCK_SQL = {False: "SELECT pg_try_advisory_lock(%s)", True: "SELECT pg_try_advisory_lock_shared(%s)"}

    def __init__(self, engine: Engine | None, key: int, shared: bool) -> None:
        self._engine = engine
        self._key = key
        #: While held: the session that holds it (see ``LockHolder``).
        self.holder: LockHolder | None = None
        self._lock_sql = self._LOCK_SQL[shared]
        self._unlock_sql = self._UNLOCK_SQL[shared]
        self._try_lock_sql = self._TRY_LOCK_SQL[shared]
        self._connection: PoolProxiedConnection | None = None
        self._guard = threading.Lock()

    def acquire(self, wait: bool = True) -> bool:
        """Takes the lock; without ``wait``, only if no one holds or waits for a conflicting
        one (then it never queues ahead of others): whether it was taken."""
        if self._engine is None:
            return True
        statement = self._lock_sql if wait else self._try_lock_sql
        dialect = self._engine.dialect
        driver_error = dialect.loaded_dbapi.Error
        for attempt in (1, 2):
            try:
                connection = self._engine.raw_connection()
            except driver_error as exc:
                # As Core reports a failed connect: the driver's error inside SQLAlchemy's.
                raise DBAPIError.instance(None, None, exc, driver_error) from exc
            try:
                taken = connection.driver_connection.execute(statement, (self._key,)).fetchone()[0] is not False
            except BaseException as exc:
                dropped = dialect.is_disconnect(exc, connection.driver_connection, None)
                connection.invalidate()
                connection.close()
                # A pooled connection the server dropped (a restart): once more on a new one.
                if attempt == 1 and dropped:
                    continue
                if isinstance(exc, driver_error):
                    raise DBAPIError.instance(statement, (self._key,), exc, driver_error,
                                              connection_invalidated=dropped) from exc
                raise
            if not taken:
                connection.close()
                return False
            try:
                holder = LockHolder(self._key, *_session_of(connection))
            except BaseException as exc:
                connection.invalidate()  # ends the session, and so the lock
                connection.close()
                if isinstance(exc, driver_error):
                    raise DBAPIError.instance("backend_start", (), exc, driver_error) from exc
                raise
            with self._guard:
                self._connection = connection
                self.holder = holder
            return True
        return False

    def release(self) -> None:
        with self._guard:
            connection, self._connection = self._connection, None
            self.holder = None
        if connection is None:
            return
        try:
            connection.driver_connection.execute(self._unlock_sql, (self._key,))
        except Exception:
            # A connection that cannot unlock is closed for good, which releases its locks.
            connection.invalidate()
        finally:
            connection.close()

    def session_ended(self) -> bool:
        """Whether the session holding this lock is seen ended (and the lock with it): the database's
        farewell on its socket, checked without a round trip. False for a lock not held."""
        with self._guard:
            connection = self._connection
        return connection is not None and was_dropped(connection.driver_connection)

    def run_in_session(self, statements: list[tuple[str, tuple[object, ...]]]) -> None:
        """Runs driver statements in one transaction on the session holding this lock (which must
        be held): they commit only while it holds the lock, as a session the database ended can
        commit nothing."""
        with self._guard:
            connection = self._connection
        if connection is None:
            raise RuntimeError("run_in_session needs the lock held")
        driver = connection.driver_connection
        driver_error = self._engine.dialect.loaded_dbapi.Error
        try:
            with driver.transaction():
                for statement, parameters in statements:
                    driver.execute(statement, parameters)
        except driver_error as exc:
            raise DBAPIError.instance(statements[0][0] if statements else "", (), exc, driver_error) from exc

    def __enter__(self) -> AdvisoryLock:
        self.acquire()
        return self

    def __exit__(self, *_exc: object) -> None:
        self.release()


@dataclass(frozen=True)
class LockHolder:
    """An advisory lock as held by one session: a session-level lock is lost only with its
    session (the database may end one: a failover, a pooler, an administrator, a timeout), and
    a session is told apart from a later one that got its pid by its start time."""

    key: int
    pid: int
    backend_start: datetime


def _session_of(connection: PoolProxiedConnection) -> tuple[int, datetime]:
    """(pid, start time) of a pooled connection's session; the start is read once per connection."""
    driver = connection.driver_connection
    start = connection.info.get("backend_start")
    if start is None:
        start = connection.info["backend_start"] = driver.execute(
            "SELECT backend_start FROM pg_stat_activity WHERE pid = pg_backend_pid()").fetchone()[0]
    return driver.info.backend_pid, start


#: The lock of a database without advisory locks (SQLite): taking it does nothing, so one serves all.
_NO_LOCK = AdvisoryLock(None, 0, False)


def _discard_if_dropped(dbapi_connection, _record, _proxy) -> None:
    """Replaces a pooled PostgreSQL connection that the server has ended, before it is used.

    The server writes its reason and closes the socket when it ends a session (a restart, a
    failover, ``pg_terminate_backend``), so an idle connection's socket turns readable. Checking
    that costs no round trip, where ``pool_pre_ping`` sends a query on every checkout. The pool
    retries a checkout on ``DisconnectionError`` with a new connection. A connection that dies
    silently with its host is not caught here, nor by a ping until TCP gives up."""
    if was_dropped(dbapi_connection):
        raise DisconnectionError("the server ended this pooled connection")


#: Bytes of write-ahead log after which a commit copies its pages into the database (SQLite's
#: default is 1,000 pages: a log of 4 MiB that stays that size while serving, beside a database of
#: a few MiB).
WAL_AUTOCHECKPOINT_BYTES = 1 << 20
#: The page size of a database created now. SQLite's default, 4 KiB, makes each of the two dozen
#: tables and indexes take 4 KiB however few rows it holds: ~100 KiB of a store that after 200
#: checkpoints holds 1.3 MiB of content (issue 21). A database created before keeps its 4 KiB
#: pages (a WAL database's page size never changes); both read alike.
PAGE_SIZE = 1024
#: What a log grown past it (a bulk write) is cut back to when it is next reset.
WAL_SIZE_LIMIT = 1 << 20


def _sqlite_pragmas(dbapi_connection, _record) -> None:
    """WAL for concurrent readers; FULL sync so a committed checkpoint survives power loss; a
    small log (it counts against the data directory's size)."""
    cursor = dbapi_connection.cursor()
    cursor.execute(f"PRAGMA page_size={PAGE_SIZE}")  # before anything creates the file's first page
    cursor.execute("PRAGMA journal_mode=WAL")
    cursor.execute("PRAGMA synchronous=FULL")
    page_size = cursor.execute("PRAGMA page_size").fetchone()[0]
    cursor.execute(f"PRAGMA wal_autocheckpoint={max(1, WAL_AUTOCHECKPOINT_BYTES // page_size)}")
    cursor.execute(f"PRAGMA journal_size_limit={WAL_SIZE_LIMIT}")
    cursor.execute("PRAGMA foreign_keys=ON")
    cursor.close()
