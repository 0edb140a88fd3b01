"""Integrity check of the metadata and the content store (``checkpointd fsck``).

What it proves, for every checkpoint row: its tree (every node, file and symlink object
under it) and its state are in the store and hash to their names, so the checkpoint can be
restored; its fields are in the closed vocabularies; its plan exists and its sequence is
unique and not past the plan's counter; the total of its pending writes it records is theirs
(the limit on them is checked against it). Every object is read back and hashed once, however
many checkpoints share it. With ``full`` it also reads every other object in the store
(those no checkpoint references, which garbage collection would delete). The store's own
bookkeeping is checked too (packs as long as what is indexed in them, every delta's base
stored). Rollbacks left unfinished (entries of the rollback journal in the database, and files
an older server left) are listed: a server finishes each before that plan is next used, and all
of them when it starts; one that cannot be read, or names no plan, is a finding.

Sequence gaps are not findings: deleting a checkpoint (or retention) leaves one, and nothing
records which numbers were deleted. What is checked is what a lost or doubled allocation
would leave: two checkpoints with one number, or one past the plan's counter.

``check`` runs inside a server on its live store: each checkpoint is verified while holding
the GC fence, so garbage collection runs between two checkpoints' checks but never under one;
what is found missing of a checkpoint deleted since the rows were read is not reported.
``check_data_dir`` opens a stopped server's data directory itself (see its docstring).
"""

from __future__ import annotations

import contextlib
import enum
import json
import os
import re
import tempfile
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

from sqlmodel import col, func, select

from checkpointd.core.kernel.errors import CheckpointdError, DataLoss
from checkpointd.core.kernel.vocabulary import Phase, Trigger
from checkpointd.core.metadata.db import Database, known_revisions
from checkpointd.core.metadata.models import CheckpointRow, PendingWriteRow, PlanRow, RollbackJournalRow, stored_bytes
from checkpointd.core.restore.journal import LEGACY_DIRECTORY, JournalEntry, legacy_entries
from checkpointd.core.store.content_store import digest_bytes
from checkpointd.core.store.tree import EMPTY_TREE, Entry, EntryKind, decode_index, decode_node, is_index

_DIGEST = re.compile(r"[0-9a-f]{64}")
JOURNAL_DIRECTORY = LEGACY_DIRECTORY


class FindingKind(enum.StrEnum):
    """What a finding is about; mirrored one-to-one by checkpoint.v1.FindingKind."""

    MISSING_OBJECT = "missing_object"
    CORRUPT_OBJECT = "corrupt_object"
    BAD_TREE_NODE = "bad_tree_node"
    BAD_ROW = "bad_row"
    ORPHAN_ROW = "orphan_row"
    SEQUENCE_CONFLICT = "sequence_conflict"
    UNREADABLE_JOURNAL = "unreadable_journal"
    DAMAGED_STORE = "damaged_store"


@dataclass(frozen=True)
class Problem:
    kind: FindingKind
    #: The checkpoint id, plan id, digest or file concerned.
    subject: str
    detail: str


@dataclass
class FsckReport:
    plans: int = 0
    checkpoints: int = 0
    #: Distinct objects read back and verified.
    objects_verified: int = 0
    #: Objects in the store no checkpoint references (garbage collection removes them).
    unreferenced_objects: int = 0
    problems: list[Problem] = field(default_factory=list)
    #: Plans with an unfinished rollback (finished when the server starts).
    pending_rollbacks: list[str] = field(default_factory=list)

    @property
    def ok(self) -> bool:
        return not self.problems

    def to_json(self) -> dict[str, object]:
        return {"ok": self.ok, "plans": self.plans, "checkpoints": self.checkpoints,
                "objects_verified": self.objects_verified, "unreferenced_objects": self.unreferenced_objects,
                "pending_rollbacks": self.pending_rollbacks,
                "problems": [{"kind": p.kind.value, "subject": p.subject, "detail": p.detail}
                             for p in self.problems]}


class _Verifier:
    """Reads each object once; remembers what was good and what was not."""

    def __init__(self, store, report: FsckReport) -> None:
        self.store = store
        self.report = report
        self.good: set[str] = set()
        self.bad: dict[str, FindingKind] = {}

    def read(self, digest: str) -> bytes | None:
        """The object's content if it is present and intact; None (and a problem) otherwise."""
        if digest in self.bad or not self._present(digest):
            return None
        try:
            data = self.store.read_bytes(digest)
        except (CheckpointdError, OSError) as exc:
            self._fail(digest, FindingKind.CORRUPT_OBJECT, _reason(exc))
            return None
        self._passed(digest)
        return data

    def verify(self, digest: str) -> bool:
        """Like read, without keeping the content (large objects are streamed)."""
        if digest in self.good:
            return True
        if digest in self.bad or not self._present(digest):
            return False
        try:
            for _ in self.store.iter_chunks(digest):
                pass
        except (CheckpointdError, OSError) as exc:
            self._fail(digest, FindingKind.CORRUPT_OBJECT, _reason(exc))
            return False
        self._passed(digest)
        return True

    def _present(self, digest: str) -> bool:
        """Committed (durable) in the store: objects of unfinished batches do not count."""
        if self.store.has(digest):
            return True
        self._fail(digest, FindingKind.MISSING_OBJECT, "referenced but not in the store")
        return False

    def forget(self, problems: list[Problem]) -> None:
        """Forgets what ``problems`` found of their objects (their checkpoint is gone)."""
        for problem in problems:
            self.bad.pop(problem.subject, None)

    def _passed(self, digest: str) -> None:
        if digest not in self.good:
            self.good.add(digest)
            self.report.objects_verified += 1

    def _fail(self, digest: str, kind: FindingKind, detail: str) -> None:
        self.bad[digest] = kind
        self.report.problems.append(Problem(kind, digest, detail))

    def tree(self, root: str) -> bool:
        """Verifies a whole tree; False when anything under it is missing or corrupt."""
        intact = True
        stack = [root]
        seen: set[str] = set()
        while stack:
            digest = stack.pop()
            if digest in seen:
                continue
            seen.add(digest)
            if digest == EMPTY_TREE and digest not in self.bad:
                # Reads as no entries without its object; stored (an empty directory's capture
                # stores it), it is referenced like any other node, and collections keep it.
                if self.store.has(digest):
                    self.verify(digest)
                continue
            data = self.read(digest)
            if data is None:
                intact = False
                continue
            try:
                children = self._children(data)
            except _PartMissing:
                intact = False
                continue
            except (ValueError, TypeError, KeyError) as exc:
                self.bad[digest] = FindingKind.BAD_TREE_NODE
                self.report.problems.append(Problem(FindingKind.BAD_TREE_NODE, digest, f"not a tree node: {exc}"))
                intact = False
                continue
            for name, entry in children.items():
                if not name or "/" in name or name in (".", ".."):
                    self.report.problems.append(Problem(FindingKind.BAD_TREE_NODE, digest,
                                                        f"unsafe entry name {name!r}"))
                    intact = False
                elif entry.kind is EntryKind.DIR:
                    stack.append(entry.digest)
                elif entry.kind is EntryKind.SYMLINK:
                    if digest_bytes(os.fsencode(entry.target)) != entry.digest:
                        self.report.problems.append(Problem(FindingKind.BAD_TREE_NODE, digest,
                                                            f"symlink {name!r} does not match its digest"))
                        intact = False
                elif not self.verify(entry.digest):
                    intact = False
        return intact

    def _children(self, data: bytes) -> dict[str, Entry]:
        """A node's children; a split directory's (see ``tree``) from its parts, each checked
        to hold what the index says, in order."""
        if not is_index(data):
            return decode_node(data)
        index = decode_index(data)
        children: dict[str, Entry] = {}
        for first, count, part in zip(index.firsts, index.counts, index.digests, strict=True):
            part_data = self.read(part)
            if part_data is None:
                raise _PartMissing(part)
            if is_index(part_data):
                raise ValueError(f"part {part} is itself split")
            names = list(decode_node(part_data).items())
            if len(names) != count or not names or names[0][0] != first:
                raise ValueError(f"part {part} does not hold what the index says")
            if children and names[0][0] <= next(reversed(children)):
                raise ValueError(f"part {part} is out of order")
            children.update(names)
        return children


class _PartMissing(Exception):
    """A part of a split directory is missing or corrupt (already reported)."""


def _reason(exc: BaseException) -> str:
    return exc.message if isinstance(exc, CheckpointdError) else str(exc)


def _row_problems(row: CheckpointRow) -> Iterator[str]:
    try:
        Phase(row.phase)
        Trigger(row.trigger)
    except ValueError as exc:
        yield str(exc)
    if row.sequence < 1:
        yield f"sequence {row.sequence} is not positive"
    for name in ("tree_digest", "state_digest"):
        value = getattr(row, name)
        if value is not None and not _DIGEST.fullmatch(value):
            yield f"{name} {value!r} is not a SHA-256 digest"
    if (row.tree_digest is None) != (row.workspace_root is None):
        yield "tree_digest and workspace_root must be set together"
    if row.trigger == Trigger.ROLLBACK.value and not row.rollback_target_checkpoint_id:
        yield "a rollback safety checkpoint without rollback_target_checkpoint_id"


def _row_still_exists(db: Database, checkpoint_id: str) -> bool:
    with db.session() as session:
        return session.get(CheckpointRow, checkpoint_id) is not None


def check(db: Database, store, journal_directory: Path | None = None, full: bool = False) -> FsckReport:
    """Checks every checkpoint of ``db`` against ``store`` (see module docstring)."""
    report = FsckReport()
    verifier = _Verifier(store, report)
    with db.session() as session:
        # Rows first: a plan's counter only grows, so one read after a row is never behind it.
        rows = list(session.exec(select(CheckpointRow)).all())
        plans = {p.plan_id: p for p in session.exec(select(PlanRow)).all()}
        # One statement, so that a put committing meanwhile is counted on both sides or neither.
        held = func.coalesce(func.sum(stored_bytes(db.is_sqlite)), 0)
        drifted = session.exec(
            select(CheckpointRow.checkpoint_id, CheckpointRow.pending_write_bytes, held)
            .join(PendingWriteRow, col(PendingWriteRow.checkpoint_id) == col(CheckpointRow.checkpoint_id),
                  isouter=True)
            .group_by(col(CheckpointRow.checkpoint_id), col(CheckpointRow.pending_write_bytes))
            .having(held != col(CheckpointRow.pending_write_bytes))).all()
    report.plans = len(plans)
    report.checkpoints = len(rows)
    for checkpoint_id, recorded, stored in drifted:
        report.problems.append(Problem(FindingKind.BAD_ROW, checkpoint_id,
                                       f"pending_write_bytes is {recorded}, but its pending writes total {stored} "
                                       "bytes (a put past the limit could be accepted, or one within it refused)"))
    sequences: dict[tuple[str, int], str] = {}
    for row in rows:
        subject = row.checkpoint_id
        for detail in _row_problems(row):
            report.problems.append(Problem(FindingKind.BAD_ROW, subject, detail))
        plan = plans.get(row.plan_id)
        if plan is None:
            report.problems.append(Problem(FindingKind.ORPHAN_ROW, subject, f"plan {row.plan_id} does not exist"))
        elif row.sequence > plan.last_sequence:
            report.problems.append(Problem(FindingKind.SEQUENCE_CONFLICT, subject,
                                           f"sequence {row.sequence} is past the plan's counter "
                                           f"{plan.last_sequence}"))
        other = sequences.setdefault((row.plan_id, row.sequence), subject)
        if other != subject:
            report.problems.append(Problem(FindingKind.SEQUENCE_CONFLICT, subject,
                                           f"shares sequence {row.sequence} with {other}"))
        found_before = len(report.problems)
        with store.referencing():
            if row.tree_digest and _DIGEST.fullmatch(row.tree_digest):
                verifier.tree(row.tree_digest)
            if row.state_digest and _DIGEST.fullmatch(row.state_digest):
                verifier.verify(row.state_digest)
            if len(report.problems) > found_before and not _row_still_exists(db, row.checkpoint_id):
                # Deleted (and collected) since the rows were read: nothing to restore any more.
                verifier.forget(report.problems[found_before:])
                del report.problems[found_before:]
    with store.referencing():
        for subject, detail in store.damage():
            report.problems.append(Problem(FindingKind.DAMAGED_STORE, subject, detail))
    referenced = verifier.good | set(verifier.bad)
    for digest in store.iter_digests():
        if digest in referenced:
            continue
        report.unreferenced_objects += 1
        if full:
            with store.referencing():
                if store.has(digest):
                    verifier.verify(digest)
    check_journal(report, db, journal_directory, set(plans))
    return report


def check_journal(report: FsckReport, db: Database, legacy_directory: Path | None, plan_ids: set[str]) -> None:
    """Lists the unfinished rollbacks (the database's journal rows, and files an older server left
    in ``legacy_directory``); an entry that cannot be read, or whose plan does not exist, is a finding."""
    with db.session() as session:
        rows = list(session.exec(select(RollbackJournalRow)).all())
    found: list[tuple[str, JournalEntry | Exception]] = []
    for row in rows:
        try:
            found.append((row.plan_id, JournalEntry.from_record(row.entry)))
        except (ValueError, KeyError, TypeError, IndexError) as exc:
            found.append((row.plan_id, exc))
    if legacy_directory is not None:
        found += [(path.name.removesuffix(path.suffix), entry) for path, entry in legacy_entries(legacy_directory)]
    for plan_id, entry in found:
        if isinstance(entry, Exception):
            report.problems.append(Problem(FindingKind.UNREADABLE_JOURNAL, plan_id, str(entry)))
        elif entry.plan_id not in plan_ids:
            report.problems.append(Problem(FindingKind.ORPHAN_ROW, plan_id,
                                           f"the rollback journal names plan {entry.plan_id}, which does not exist"))
        report.pending_rollbacks.append(plan_id)


class CannotCheck(Exception):
    """The check cannot run: no such data directory or database, a database of another
    schema revision, or a server holding the data directory."""


def check_data_dir(data_dir: Path, db_url: str = "", store_kind: str = "disk", full: bool = False) -> FsckReport:
    """Checks a data directory without a server. It is opened as a server would open it, so
    a pack's torn tail left by a crash is cut off; for that the data directory's lock is
    taken exclusively, and the check is refused (CannotCheck) while a server holds it. With
    ``--store db`` on PostgreSQL no lock is needed (nothing is changed, and the check holds
    the replicas' GC fence): it runs beside running replicas."""
    from checkpointd.core.maintenance.datadir_lock import DataDirBusy, held_offline, needs_data_dir_lock
    from checkpointd.core.store.db_store import StoreKind, open_store

    data_dir = Path(data_dir)
    if not data_dir.is_dir():
        raise CannotCheck(f"no data directory at {data_dir}")
    sqlite_file = data_dir / "checkpointd.db"
    if not db_url and not sqlite_file.is_file():
        raise CannotCheck(f"{data_dir} holds no checkpointd database ({sqlite_file.name})")
    db = Database(db_url or f"sqlite:///{sqlite_file}")
    try:
        with contextlib.ExitStack() as stack:
            _require_current_schema(db)
            kind = StoreKind(store_kind)
            if needs_data_dir_lock(kind.value, db):
                try:
                    stack.enter_context(held_offline(data_dir, kind.value, db))
                except DataDirBusy:
                    raise CannotCheck(f"{data_dir} is in use by a running checkpointd: stop it first, or check it "
                                      "through its AdminService with --target ADDR") from None
                try:
                    store = open_store(kind.value, db, data_dir)
                except DataLoss as exc:  # a pack whose header is not a pack's: the store cannot open
                    raise CannotCheck(f"the content store in {data_dir} cannot be opened: {exc}") from None
            else:
                # Beside running replicas: a staging directory of its own, so none of theirs is touched.
                store = open_store(kind.value, db, Path(stack.enter_context(tempfile.TemporaryDirectory())))
            stack.callback(store.close)
            return check(db, store, data_dir / JOURNAL_DIRECTORY, full=full)
    finally:
        db.dispose()


def _require_current_schema(db: Database) -> None:
    """fsck changes no schema: a database another version migrated (or none yet) is refused."""
    try:
        revision = db.schema_revision()
    except Exception as exc:  # noqa: BLE001 - any failure to reach the database is the reason
        raise CannotCheck(f"cannot read the database: {str(exc).strip().splitlines()[0]}") from None
    _known, head = known_revisions()
    if revision != head:
        raise CannotCheck(f"the database is at schema revision {revision or 'none'}, this checkpointd's is {head}: "
                          "run the matching checkpointd (a server of this version migrates it when it starts)")


def render(report: FsckReport) -> str:
    return json.dumps(report.to_json(), indent=2, sort_keys=True)
