"""An advisory lock on the data directory, so that garbage collection never runs beside a
process it cannot fence.

The GC fence (ContentStore.collecting) only covers writers in the same process. Servers
therefore hold the lock shared, a server that runs periodic GC holds it exclusively, and
the offline ``checkpointd gc`` holds it exclusively: a GC never shares the store with a
writer in another process.

A server on the disk store holds it exclusively too: each process appends to the newest pack
at the end it knows of, so a second writer (a replica given the same data directory) would
write over the first one's committed records.
"""

from __future__ import annotations

import contextlib
import fcntl
import logging
import os
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Self

from checkpointd.core.kernel.private_files import PRIVATE_FILE, tighten
from checkpointd.core.metadata.db import Database
from checkpointd.core.store.db_store import StoreKind

log = logging.getLogger("checkpointd")
LOCK_NAME = "checkpointd.lock"


def needs_data_dir_lock(store: str, db: Database) -> bool:
    """Whether GC must be fenced from other processes by the data dir lock: always for the
    disk store; for the database store only on SQLite (on PostgreSQL its own fence spans replicas)."""
    return store == StoreKind.DISK.value or db.is_sqlite


class DataDirBusy(RuntimeError):
    """Another process holds the data directory in a conflicting mode."""


@dataclass(frozen=True)
class OfflineCommand:
    """The command that takes the locks without a server, for its refusal to name: what was
    refused, and what its user can do other than stop the server (``otherwise``, a clause that
    follows "stop it first")."""

    name: str = "an offline command"
    otherwise: str = ""


#: What a refusal names when the command did not say who it is (fsck, which says it itself).
SOME_OFFLINE_COMMAND = OfflineCommand()


class _FileLock:
    """A non-blocking flock on one file; refused at once with DataDirBusy when taken."""

    #: What is unprotected when the file system cannot lock at all (logged, not fatal).
    protection = ""

    def __init__(self, path: Path, exclusive: bool) -> None:
        self.path = path
        self.exclusive = exclusive
        self._fd: int | None = None

    def acquire(self) -> Self:
        fd = os.open(self.path, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, PRIVATE_FILE)
        tighten(self.path)
        try:
            fcntl.flock(fd, (fcntl.LOCK_EX if self.exclusive else fcntl.LOCK_SH) | fcntl.LOCK_NB)
        except BlockingIOError:
            os.close(fd)
            raise DataDirBusy(self._busy_message()) from None
        except OSError as exc:
            log.warning("cannot lock %s (%s); %s is off", self.path, exc.strerror, self.protection)
        self._fd = fd
        return self

    def _busy_message(self) -> str:
        raise NotImplementedError

    def release(self) -> None:
        if self._fd is not None:
            with contextlib.suppress(OSError):
                fcntl.flock(self._fd, fcntl.LOCK_UN)
            os.close(self._fd)
            self._fd = None

    def __enter__(self) -> Self:
        return self.acquire()

    def __exit__(self, *_exc: object) -> None:
        self.release()


class DataDirLock(_FileLock):
    protection = "cross-process GC protection"

    def __init__(self, data_dir: Path, exclusive: bool, disk_store_writer: bool = False,
                 offline: OfflineCommand | None = None, replica: bool = False) -> None:
        super().__init__(data_dir / LOCK_NAME, exclusive)
        self.disk_store_writer = disk_store_writer
        self.offline = offline
        self.replica = replica

    @classmethod
    def for_server(cls, data_dir: Path, store: str, gc_interval_seconds: float,
                   fenced_by_database: bool = False) -> DataDirLock:
        """A server's hold: exclusive to collect garbage, or to write a disk store (one writing
        process per store, see the module docstring); shared otherwise. A replica whose
        collections the database fences (``needs_data_dir_lock`` false) holds its directory
        alone: its staged files and stat index are its own, and a second server starting there
        would sweep the first one's staged files from under its checkpoints."""
        if fenced_by_database:
            return cls(data_dir, exclusive=True, replica=True)
        disk_store_writer = store == StoreKind.DISK.value
        return cls(data_dir, exclusive=gc_interval_seconds > 0 or disk_store_writer,
                   disk_store_writer=disk_store_writer)

    def _busy_message(self) -> str:
        if self.replica:
            return (f"{self.path.parent} is in use by another checkpointd server; each replica needs a data "
                    "directory of its own (--data-dir): its staged files and stat index are that server's")
        if self.disk_store_writer:
            return (f"{self.path.parent} is in use by another checkpointd process; its content store "
                    "(--store disk) takes one server at a time (several replicas on PostgreSQL keep content "
                    "in the database with --store db, each with a data directory of its own; see README)")
        if self.offline is not None:
            return (f"{self.path.parent} is in use by another checkpointd process; {self.offline.name} needs it "
                    f"alone: stop that process first{self.offline.otherwise}")
        if self.exclusive:
            return (f"{self.path.parent} is in use by another checkpointd process; garbage collection needs it "
                    "alone (stop the other process, or run GC inside the one server with --gc-interval)")
        return f"{self.path.parent} is locked by a garbage collection (checkpointd gc or a server with --gc-interval)"


class ServingLock(_FileLock):
    """One server per SQLite database, held for as long as it serves: what it keeps in memory
    (resolved config, known plans, the content store's index) assumes that no other server
    writes the database. Offline commands that open the store take it too (``held_offline``).
    The lock file lies beside the database's real file: a server given a symlink to it is another server on it."""

    protection = "the one-server-per-database check"

    def __init__(self, database: Path, offline: OfflineCommand | None = None) -> None:
        real = Path(os.path.realpath(database))
        super().__init__(real.with_name(real.name + ".serving.lock"), exclusive=True)
        self.database = database
        self.offline = offline

    def _busy_message(self) -> str:
        if self.offline is not None:
            return (f"the SQLite database {self.database} is served by a running checkpointd; {self.offline.name} "
                    f"needs the database alone: stop that server first{self.offline.otherwise}")
        return (f"the SQLite database {self.database} is already served by another checkpointd; SQLite takes one "
                "server per database (run several replicas on PostgreSQL, see README)")


@contextlib.contextmanager
def held_offline(data_dir: Path, store: str, db: Database,
                 command: OfflineCommand = SOME_OFFLINE_COMMAND) -> Iterator[None]:
    """What an offline command that opens the content store holds (DataDirBusy naming ``command`` if it cannot):
    the data dir alone, and on SQLite the database's serving lock, so that no server serves the
    database meanwhile whatever data dir it was given (with --store db the content store is that
    database: a collection beside such a server deleted what its next checkpoint reused)."""
    with contextlib.ExitStack() as stack:
        if needs_data_dir_lock(store, db):
            stack.enter_context(DataDirLock(data_dir, exclusive=True, offline=command))
        if db.sqlite_path:
            stack.enter_context(ServingLock(Path(db.sqlite_path), offline=command))
        yield
