"""Integrity check of the metadata and the content store (``checkpointd fsck``).

What it proves, for every checkpoint row: its tree (every node, file and symlink object
under it) and its state are in the store and hash to their names, so the checkpoint can be
restored; its fields are in the closed vocabularies; its plan exists and its sequence is
unique and not past the plan's counter. Every object is read back and hashed once, however
many checkpoints share it. With ``full`` it also reads every other object in the store
(those no checkpoint references, which garbage collection would delete). Rollbacks left
unfinished (entries of the rollback journal in the database, and files an older server left)
are listed: a server finishes each before that plan is next used, and all of them when it starts.

``check`` runs inside a server on its live store (holding the GC fence, so nothing is
collected under it). ``check_data_dir`` opens a stopped server's data directory itself;
it takes the data directory's lock exclusively, so it refuses to run beside a server, and
opens the store as a server would (a pack's torn tail left by a crash is cut off then).
"""

from __future__ import annotations

import json
import os
import re
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

from sqlmodel import select

from checkpointd.core.db import Database
from checkpointd.core.errors import CheckpointdError
from checkpointd.core.journal import LEGACY_DIRECTORY, JournalEntry, legacy_entries
from checkpointd.core.models import CheckpointRow, PlanRow, RollbackJournalRow
from checkpointd.core.store import digest_bytes
from checkpointd.core.tree import EMPTY_TREE, EntryKind, decode_node
from checkpointd.core.vocabulary import Phase, Trigger

_DIGEST = re.compile(r"[0-9a-f]{64}")
JOURNAL_DIRECTORY = LEGACY_DIRECTORY


@dataclass(frozen=True)
class Problem:
    #: What is wrong, from a closed list: missing_object, corrupt_object, bad_tree_node,
    #: bad_row, orphan_row, sequence_conflict, unreadable_journal.
    kind: str
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
                "problems": [{"kind": p.kind, "subject": p.subject, "detail": p.detail} for p in self.problems]}


class _Verifier:
    """Reads each object once; remembers what was good and what was not."""

    def __init__(self, store, report: FsckReport) -> None:
        self.store = store
        self.report = report
        self.good: set[str] = set()
        self.bad: dict[str, str] = {}

    def read(self, digest: str) -> bytes | None:
        """The object's content if it is present and intact; None (and a problem) otherwise."""
        if digest in self.bad or not self._present(digest):
            return None
        try:
            data = self.store.read_bytes(digest)
        except (CheckpointdError, OSError) as exc:
            self._fail(digest, "corrupt_object", str(exc))
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
            self._fail(digest, "corrupt_object", str(exc))
            return False
        self._passed(digest)
        return True

    def _present(self, digest: str) -> bool:
        """Committed (durable) in the store: objects of unfinished batches do not count."""
        if self.store.has(digest):
            return True
        self._fail(digest, "missing_object", "referenced but not in the store")
        return False

    def _passed(self, digest: str) -> None:
        if digest not in self.good:
            self.good.add(digest)
            self.report.objects_verified += 1

    def _fail(self, digest: str, kind: str, detail: str) -> None:
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
                continue
            data = self.read(digest)
            if data is None:
                intact = False
                continue
            try:
                children = decode_node(data)
            except (ValueError, TypeError) as exc:
                self.bad[digest] = "bad_tree_node"
                self.report.problems.append(Problem("bad_tree_node", digest, f"not a tree node: {exc}"))
                intact = False
                continue
            for name, entry in children.items():
                if not name or "/" in name or name in (".", ".."):
                    self.report.problems.append(Problem("bad_tree_node", digest, f"unsafe entry name {name!r}"))
                    intact = False
                elif entry.kind is EntryKind.DIR:
                    stack.append(entry.digest)
                elif entry.kind is EntryKind.SYMLINK:
                    if digest_bytes(os.fsencode(entry.target)) != entry.digest:
                        self.report.problems.append(Problem("bad_tree_node", digest,
                                                            f"symlink {name!r} does not match its digest"))
                        intact = False
                elif not self.verify(entry.digest):
                    intact = False
        return intact


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


def check(db: Database, store, journal_directory: Path | None = None, full: bool = False) -> FsckReport:
    """Checks every checkpoint of ``db`` against ``store`` (see module docstring)."""
    report = FsckReport()
    verifier = _Verifier(store, report)
    with store.referencing():
        with db.session() as session:
            plans = {p.plan_id: p for p in session.exec(select(PlanRow)).all()}
            rows = list(session.exec(select(CheckpointRow)).all())
            journal = list(session.exec(select(RollbackJournalRow)).all())
        report.plans = len(plans)
        report.checkpoints = len(rows)
        sequences: dict[tuple[str, int], str] = {}
        for row in rows:
            subject = row.checkpoint_id
            for detail in _row_problems(row):
                report.problems.append(Problem("bad_row", subject, detail))
            plan = plans.get(row.plan_id)
            if plan is None:
                report.problems.append(Problem("orphan_row", subject, f"plan {row.plan_id} does not exist"))
            elif row.sequence > plan.last_sequence:
                report.problems.append(Problem("sequence_conflict", subject,
                                               f"sequence {row.sequence} is past the plan's counter "
                                               f"{plan.last_sequence}"))
            other = sequences.setdefault((row.plan_id, row.sequence), subject)
            if other != subject:
                report.problems.append(Problem("sequence_conflict", subject,
                                               f"shares sequence {row.sequence} with {other}"))
            if row.tree_digest and _DIGEST.fullmatch(row.tree_digest):
                verifier.tree(row.tree_digest)
            if row.state_digest and _DIGEST.fullmatch(row.state_digest):
                verifier.verify(row.state_digest)
        referenced = verifier.good | set(verifier.bad)
        for digest in store.iter_digests():
            if digest in referenced:
                continue
            report.unreferenced_objects += 1
            if full:
                verifier.verify(digest)
    for row in journal:
        try:
            JournalEntry.from_record(row.entry)
        except (ValueError, KeyError, TypeError, IndexError) as exc:
            report.problems.append(Problem("unreadable_journal", row.plan_id, str(exc)))
        report.pending_rollbacks.append(row.plan_id)
    if journal_directory is not None:
        for path, entry in legacy_entries(journal_directory):
            plan_id = path.name.removesuffix(path.suffix)
            if isinstance(entry, Exception):
                report.problems.append(Problem("unreadable_journal", plan_id, str(entry)))
            report.pending_rollbacks.append(plan_id)
    return report


def check_data_dir(data_dir: Path, db_url: str = "", store_kind: str = "disk", full: bool = False) -> FsckReport:
    """Checks a stopped server's data directory (refused while a server holds it)."""
    from checkpointd.core.db_store import open_store
    from checkpointd.datadir_lock import DataDirLock

    data_dir = Path(data_dir)
    with DataDirLock(data_dir, exclusive=True):
        db = Database(db_url or f"sqlite:///{data_dir / 'checkpointd.db'}")
        try:
            store = open_store(store_kind, db, data_dir)
            return check(db, store, data_dir / JOURNAL_DIRECTORY, full=full)
        finally:
            db.dispose()


def render(report: FsckReport) -> str:
    return json.dumps(report.to_json(), indent=2, sort_keys=True)
