"""The rollback journal: what a rollback is doing to a workspace, kept in the database so that
every replica sees it (table ``rollback_journal``, one entry per plan).

A rollback's entry is inserted in the transaction that commits its safety checkpoint (the
workspace as it was) and its request_id's record: an entry exists exactly when the safety
checkpoint does. Then the workspace changes, then the entry is deleted. An entry found later
means a process died (or gave up) part-way. Whoever takes the plan next finishes it first —
this server when it starts, and any server on the database before it creates a checkpoint,
rolls back or diffs against the live workspace of that plan (under the plan's lock): ``COMPLETE``
brings the paths the rollback covers to its target checkpoint, ``UNDO`` takes back what the
rollback had written (only paths that still hold it). Either way it first records what the
workspace holds, if that is not what the rollback's newest safety checkpoint holds, as a new
safety checkpoint.

An entry is never applied once its plan has moved on: a checkpoint newer than the last one the
rollback recorded means some server went on with the plan (one that predates this journal, or
one that could not finish the entry); that checkpoint holds what the workspace held, and the
entry is dropped.

The deletion of a finished rollback's entry does not wait for the disk (SQLite commits it
without a sync, PostgreSQL with ``synchronous_commit`` off): a process killed after it loses
nothing, and the next synced commit of any checkpoint makes it durable. Only a power cut before
that can bring the entry back; finishing it again then changes only what was written after the
rollback (recorded first in a new safety checkpoint), and nothing if nothing was.

A server before this journal kept entries as files (``DATA_DIR/rollback-journal/PLAN.json``);
one left by such a server is imported once, when the server starts.
"""

from __future__ import annotations

import contextlib
import enum
import json
import logging
import threading
import uuid
from dataclasses import asdict, dataclass, fields
from pathlib import Path

from sqlalchemy import delete, select, update
from sqlmodel import Session

from checkpointd.core.metadata.db import Database
from checkpointd.core.metadata.models import OperationRow, RollbackJournalRow, utcnow
from checkpointd.core.store.tree import Entry, EntryKind
from checkpointd.core.workspace.windows import Window

log = logging.getLogger("checkpointd.journal")

#: Entries are dictionaries in the table's JSON column, with this version.
FORMAT_VERSION = 2
#: Files of the journal before it moved to the database: ``<directory>/<plan_id>.json``, version 1.
LEGACY_DIRECTORY = "rollback-journal"
LEGACY_SUFFIX = ".json"
LEGACY_VERSION = 1
_TABLE = RollbackJournalRow.__table__
_OPERATIONS = OperationRow.__table__


class Goal(enum.StrEnum):
    """What recovery makes of an interrupted rollback."""

    #: Finish it: the covered paths become the target checkpoint's.
    COMPLETE = "complete"
    #: Take it back: what it wrote (``written``; every covered path when unknown) becomes the
    #: safety checkpoint's.
    UNDO = "undo"


@dataclass(frozen=True)
class JournalEntry:
    plan_id: str
    workspace_root: str
    target_checkpoint_id: str
    safety_checkpoint_id: str
    #: The tree of the newest safety checkpoint recorded for this rollback (its own, or one its
    #: recovery recorded): a workspace still equal to it needs no new one.
    safety_tree: str
    #: The request's path subset ('' entries never occur; empty means the whole workspace).
    paths: tuple[str, ...]
    #: Temporary files of this rollback are named ``<workspace temp prefix><temp_tag>-...``.
    temp_tag: str
    #: Directories the rollback writes into: where its temporary files may be left behind.
    directories: tuple[str, ...]
    #: The rollback's idempotency key: its record is dropped if the rollback is not finished.
    request_id: str = ""
    goal: Goal = Goal.COMPLETE
    #: The sequence of the newest checkpoint this rollback recorded (its safety checkpoint, or one
    #: its recovery recorded): a newer one means the plan moved on without it.
    last_sequence: int = 0
    #: For an undo: each path the rollback changed and what it wrote there (None: removed). Only
    #: paths still holding that are taken back. None: unknown, every covered path is.
    written: tuple[tuple[str, Entry | None], ...] | None = None
    #: Owner-write windows open on read-only directories (``core/workspace/windows.py``), recorded
    #: before they open and dropped when they close: whoever finishes the entry first sets back
    #: those a kill left open (``Workspace.close_window``).
    opened: tuple[Window, ...] = ()
    #: For an undo: paths its own steps may leave between what the rollback wrote and what the
    #: undo puts back: nothing (a directory removed before a file or link goes back in its place)
    #: or a directory it made still waiting for its mode. Found so, they are still the undo's to
    #: finish (no one else's deletion or directory).
    interim: tuple[str, ...] = ()

    @property
    def goal_checkpoint_id(self) -> str:
        return self.target_checkpoint_id if self.goal is Goal.COMPLETE else self.safety_checkpoint_id

    def to_record(self) -> dict[str, object]:
        body = asdict(self)
        body["version"] = FORMAT_VERSION
        body["written"] = None if self.written is None else [[path, _entry_json(entry)]
                                                             for path, entry in self.written]
        # A window's birth time goes in a list of its own: a server before it reads each window
        # as four fields, ignores the list (an unknown field) and matches the inode alone.
        body["opened"] = [window[:4] for window in self.opened]
        if any(window.born_ns for window in self.opened):
            body["opened_born_ns"] = [window.born_ns for window in self.opened]
        for optional in ("opened", "interim"):  # left out when empty: a server before them reads the rest
            if not body[optional]:
                del body[optional]
        return body

    @classmethod
    def from_record(cls, body: dict[str, object]) -> JournalEntry:
        if not isinstance(body, dict):
            raise ValueError("a journal entry is not an object")
        body = dict(body)
        if body.pop("version", None) != FORMAT_VERSION:
            raise ValueError("unknown journal entry version")
        written = body.get("written")
        body["written"] = None if written is None else tuple((path, _entry_from_json(entry))
                                                             for path, entry in written)
        return cls._typed(body)

    @classmethod
    def from_legacy_json(cls, data: bytes) -> JournalEntry:
        """An entry file written by a server before this journal (no sequence, no ``written``)."""
        body = json.loads(data)
        if not isinstance(body, dict):
            raise ValueError("a journal entry file does not hold an object")
        if body.pop("version", None) != LEGACY_VERSION:
            raise ValueError("unknown journal format version")
        return cls._typed(body)

    @classmethod
    def _typed(cls, body: dict) -> JournalEntry:
        body["paths"] = tuple(body["paths"])
        body["directories"] = tuple(body["directories"])
        body["goal"] = Goal(body["goal"])
        opened = body.get("opened", ())
        born = list(body.pop("opened_born_ns", None) or ()) or [0] * len(opened)
        if len(born) != len(opened):
            raise ValueError("a journal entry's windows and their birth times do not pair up")
        body["opened"] = tuple(Window(str(path), int(mode), int(dev), int(ino), int(born_ns))
                               for (path, mode, dev, ino, *_newer), born_ns in zip(opened, born, strict=True))
        body["interim"] = tuple(str(path) for path in body.get("interim", ()))
        unknown = body.keys() - {f.name for f in fields(cls)}
        if unknown:  # a newer server's additions: what they would add is not known here, the rest is
            log.warning("ignoring fields %s of a rollback journal entry (written by a newer server)",
                        ", ".join(sorted(unknown)))
        return cls(**{name: value for name, value in body.items() if name not in unknown})


def _entry_json(entry: Entry | None) -> list[object] | None:
    return None if entry is None else [entry.kind.value, entry.mode, entry.size, entry.digest, entry.target]


def _entry_from_json(raw: list | None) -> Entry | None:
    return None if raw is None else Entry(EntryKind(raw[0]), raw[1], raw[2], raw[3], raw[4])


def new_temp_tag() -> str:
    return uuid.uuid4().hex


class RollbackJournal:
    """The entries of unfinished rollbacks in the database.

    On SQLite one server process owns the database, so it keeps the plans that have an entry in
    memory (read when it starts): a create of any other plan asks nothing. On PostgreSQL another
    replica may leave an entry at any moment, so every lookup reads the table (one primary-key
    read, under the plan's lock)."""

    def __init__(self, db: Database) -> None:
        self.db = db
        self._guard = threading.Lock()
        self._pending: set[str] | None = set(self.plan_ids()) if db.is_sqlite else None

    def may_have(self, plan_id: str) -> bool:
        """False only when the plan surely has no entry (no read needed)."""
        return self._pending is None or plan_id in self._pending

    def record(self, entry: JournalEntry) -> dict[str, object]:
        """The entry's row, to insert in the caller's transaction (see ``added``)."""
        return {"plan_id": entry.plan_id, "entry": entry.to_record(), "create_time": utcnow()}

    def added(self, plan_id: str) -> None:
        """The caller's transaction that inserted the plan's entry has committed."""
        if self._pending is not None:
            with self._guard:
                self._pending.add(plan_id)

    def get(self, plan_id: str) -> JournalEntry | None:
        """The plan's entry; None if it has none. An entry that cannot be read is logged and dropped:
        it names a safety checkpoint that holds the workspace as it was, which stays. Its rollback
        did not finish, so the record of its request_id goes with it (when the entry still names
        one): a retry runs the rollback again rather than be answered as done."""
        with self.db.session() as session:
            body = session.connection().execute(
                select(_TABLE.c.entry).where(_TABLE.c.plan_id == plan_id)).scalar_one_or_none()
        if body is None:
            self.forget(plan_id)
            return None
        try:
            return JournalEntry.from_record(body)
        except (ValueError, KeyError, TypeError, IndexError) as exc:
            log.error("the rollback journal entry of plan %s is unreadable (%s); dropping it", plan_id, exc)
            request_id = body.get("request_id") if isinstance(body, dict) else None
            with self.db.session() as session:
                self.delete_unfinished(session, plan_id, request_id if isinstance(request_id, str) else "")
                session.commit()
            self.forget(plan_id)
            return None

    @staticmethod
    def delete_unfinished(session: Session, plan_id: str, request_id: str) -> None:
        """Deletes the plan's entry, in ``session``'s transaction (the caller commits and then calls
        ``forget``), with the record of its rollback's ``request_id`` (none when empty): a rollback
        dropped unfinished must not be replayed as done."""
        connection = session.connection()
        connection.execute(delete(_TABLE).where(_TABLE.c.plan_id == plan_id))
        if request_id:
            connection.execute(delete(_OPERATIONS).where(_OPERATIONS.c.request_id == request_id,
                                                          _OPERATIONS.c.method == "Rollback"))

    def put(self, entry: JournalEntry, session: Session | None = None) -> None:
        """Replaces the plan's entry. In ``session``'s transaction (the caller commits), or in one of
        its own that is committed (durably) before this returns."""
        if session is None:
            with self.db.session() as own:
                self.put(entry, own)
                own.commit()
            self.added(entry.plan_id)
            return
        connection = session.connection()
        connection.execute(delete(_TABLE).where(_TABLE.c.plan_id == entry.plan_id))
        connection.execute(_TABLE.insert().values(**self.record(entry)))

    def put_unsynced(self, entry: JournalEntry) -> None:
        """Replaces the plan's existing entry without waiting for the disk: for a change whose loss
        in a power cut costs nothing but what the entry said before (see the module docstring)."""
        self.db.commit_unsynced(update(_TABLE).where(_TABLE.c.plan_id == entry.plan_id)
                                .values(entry=entry.to_record()))

    def remove(self, plan_id: str) -> None:
        """Deletes the plan's entry without waiting for the disk (see the module docstring)."""
        self.db.commit_unsynced(delete(_TABLE).where(_TABLE.c.plan_id == plan_id))
        self.forget(plan_id)

    def forget(self, plan_id: str) -> None:
        """The plan's entry is gone (deleted in a transaction the caller committed)."""
        if self._pending is not None:
            with self._guard:
                self._pending.discard(plan_id)

    def plan_ids(self) -> list[str]:
        """Plans with an entry, in a stable order."""
        with self.db.session() as session:
            return sorted(session.connection().execute(select(_TABLE.c.plan_id)).scalars())


def legacy_entries(directory: Path) -> list[tuple[Path, JournalEntry | Exception]]:
    """The entry files an older server left in ``directory``: each parsed, or why it cannot be."""
    found: list[tuple[Path, JournalEntry | Exception]] = []
    if not directory.is_dir():
        return found
    for path in sorted(directory.glob(f"*{LEGACY_SUFFIX}")):
        try:
            found.append((path, JournalEntry.from_legacy_json(path.read_bytes())))
        except FileNotFoundError:
            continue
        except (ValueError, KeyError, TypeError) as exc:
            found.append((path, exc))
    return found


def remove_legacy_directory(directory: Path) -> None:
    """Removes the old journal's directory once its entries are imported (and its temporary files)."""
    if not directory.is_dir():
        return
    for leftover in directory.glob("*.tmp"):
        leftover.unlink(missing_ok=True)
    with contextlib.suppress(OSError):
        directory.rmdir()

