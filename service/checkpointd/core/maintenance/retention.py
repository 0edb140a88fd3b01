"""Retention (which checkpoints to prune) and garbage collection of the content store.

Retention is configured per plan through three config keys (global value or a plan's
override); every rule is off by default, so nothing is ever pruned unless asked for:

- ``core.retention.max_checkpoints_per_plan``: keep the newest N regular checkpoints.
- ``core.retention.max_age_seconds``: prune regular checkpoints older than this, except
  the plan's newest one, so an idle plan never loses its last known state.
- ``core.retention.safety_max_age_seconds``: rollback safety checkpoints follow only this
  rule (they are neither counted nor aged by the two above).

A checkpoint labelled ``pinned=true`` is never pruned and does not count.

Garbage collection deletes store objects that no checkpoint references. Trees are Merkle
nodes, so the referenced set is every tree node reachable from a checkpoint's
``tree_digest``, every file digest in those nodes, and every ``state_digest``. Marking
runs concurrently with writers; only the final step (marking rows committed since, then
deleting) holds ``ContentStore.collecting()``, which waits until no checkpoint is between
writing its objects and committing its row and keeps new ones from starting meanwhile. It
never waits on a capture that has been in that section for ``GC_PATIENCE_SECONDS`` (it may be
stuck on its workspace, and every other plan's captures would wait behind the collection):
the collection is then postponed (``GcPostponed``) and the next one tries again.
Checkpoints are immutable, so deleting one only ever frees objects no other one uses.
"""

from __future__ import annotations

import contextlib
import enum
import logging
import os
import time
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass, field
from datetime import UTC, datetime

from sqlmodel import col, func, select

from checkpointd.core.config.registry import (
    RETENTION_MAX_AGE_SECONDS,
    RETENTION_MAX_CHECKPOINTS,
    RETENTION_SAFETY_MAX_AGE_SECONDS,
    ConfigStore,
)
from checkpointd.core.kernel import telemetry
from checkpointd.core.kernel.errors import CheckpointdError, DataLoss, NotFound, RollbackUnfinished
from checkpointd.core.kernel.faults import Point, crash_point
from checkpointd.core.kernel.telemetry import GcReport
from checkpointd.core.kernel.vocabulary import Phase
from checkpointd.core.metadata.db import Database
from checkpointd.core.metadata.models import CheckpointRow, ConfigRow, ObjectChunkRow, ObjectRow
from checkpointd.core.store.content_store import ContentStore, Postponed
from checkpointd.core.store.db_store import DatabaseStore
from checkpointd.core.store.tree import EntryKind, Trees

log = logging.getLogger("checkpointd.retention")

PINNED_LABEL = "pinned"
PINNED_VALUE = "true"
#: How long a collection waits for a moment when no capture references the store, and the
#: longest a capture may have been doing so before the collection stops waiting for it.
GC_PATIENCE_SECONDS = 2.0
RETENTION_KEYS = [RETENTION_MAX_CHECKPOINTS, RETENTION_MAX_AGE_SECONDS, RETENTION_SAFETY_MAX_AGE_SECONDS]


def object_sizes(store: ContentStore | DatabaseStore, digests: Iterable[str]) -> dict[str, int]:
    """Bytes each object accounts for: its size in the database store; on disk, a loose
    object's file size, or a packed (small) object's content length."""
    wanted = list(digests)
    if isinstance(store, DatabaseStore):
        found: dict[str, int] = {}
        with store.db.session() as session:
            for start in range(0, len(wanted), 500):
                chunk = wanted[start:start + 500]
                found.update(session.exec(select(ObjectRow.digest, ObjectRow.size)
                                          .where(col(ObjectRow.digest).in_(chunk))).all())
        return found
    sizes = {}
    for digest in wanted:
        try:
            sizes[digest] = store.path_of(digest).stat().st_size
        except FileNotFoundError:
            try:
                sizes[digest] = sum(len(chunk) for chunk in store.iter_chunks(digest))
            except CheckpointdError:
                sizes[digest] = 0
    return sizes


def store_footprint(store: ContentStore | DatabaseStore) -> tuple[int, int]:
    """(objects, bytes) held by the store, as stored (what ``stored_sizes`` counts per object):
    on disk, every file under its root (packs and loose objects alike); in the database, the
    length of every chunk (compressed or a delta), an object's not yet committed included."""
    if isinstance(store, DatabaseStore):
        with store.db.session() as session:
            count = session.exec(select(func.count()).select_from(ObjectRow)).one()
            total = session.exec(select(func.coalesce(func.sum(func.length(ObjectChunkRow.data)), 0))).one()
        return count, int(total)
    total = 0
    for directory, _dirs, files in os.walk(store.root):
        for name in files:
            with contextlib.suppress(FileNotFoundError):
                total += os.lstat(os.path.join(directory, name)).st_size
    return sum(1 for _ in store.iter_digests()), total


class Rule(enum.StrEnum):
    """Why a checkpoint was pruned (also a metric label)."""

    MAX_CHECKPOINTS = "max_checkpoints_per_plan"
    MAX_AGE = "max_age"
    SAFETY_MAX_AGE = "safety_max_age"


@dataclass(frozen=True)
class Policy:
    max_checkpoints: int = 0
    max_age_seconds: int = 0
    safety_max_age_seconds: int = 0

    @property
    def active(self) -> bool:
        return bool(self.max_checkpoints or self.max_age_seconds or self.safety_max_age_seconds)


@dataclass(frozen=True)
class Candidate:
    """What retention needs to know about one checkpoint."""

    checkpoint_id: str
    plan_id: str
    sequence: int
    phase: str
    labels: dict[str, str]
    create_time: datetime

    @property
    def pinned(self) -> bool:
        return self.labels.get(PINNED_LABEL) == PINNED_VALUE

    @property
    def safety(self) -> bool:
        return self.phase == Phase.ROLLBACK_SAFETY.value


def _age_seconds(created: datetime, now: datetime) -> float:
    if created.tzinfo is None:
        created = created.replace(tzinfo=UTC)
    return (now - created).total_seconds()


def select_prunable(newest_first: list[Candidate], policy: Policy, now: datetime) -> list[tuple[Candidate, Rule]]:
    """The checkpoints of one plan that ``policy`` prunes, with the rule that prunes each."""
    doomed: list[tuple[Candidate, Rule]] = []
    newest_regular = next((c.checkpoint_id for c in newest_first if not c.safety), None)
    kept_regular = 0
    for candidate in newest_first:
        if candidate.pinned:
            continue
        age = _age_seconds(candidate.create_time, now)
        if candidate.safety:
            if policy.safety_max_age_seconds and age > policy.safety_max_age_seconds:
                doomed.append((candidate, Rule.SAFETY_MAX_AGE))
            continue
        if policy.max_checkpoints and kept_regular >= policy.max_checkpoints:
            doomed.append((candidate, Rule.MAX_CHECKPOINTS))
            continue
        if policy.max_age_seconds and age > policy.max_age_seconds and candidate.checkpoint_id != newest_regular:
            doomed.append((candidate, Rule.MAX_AGE))
            continue
        kept_regular += 1
    return doomed


@dataclass
class PruneReport:
    pruned: dict[Rule, int] = field(default_factory=lambda: dict.fromkeys(Rule, 0))
    checkpoint_ids: list[str] = field(default_factory=list)
    dry_run: bool = False

    @property
    def total(self) -> int:
        return sum(self.pruned.values())


@dataclass(frozen=True)
class MaintenanceReport:
    prune: PruneReport
    gc: GcReport

    def as_dict(self) -> dict[str, object]:
        return {
            "dry_run": self.gc.dry_run,
            "pruned_checkpoints": self.prune.total,
            "pruned_by_rule": {rule.value: n for rule, n in self.prune.pruned.items()},
            "pruned_checkpoint_ids": self.prune.checkpoint_ids,
            "deleted_objects": self.gc.deleted_objects,
            "reclaimed_bytes": self.gc.reclaimed_bytes,
            "store_objects": self.gc.store_objects,
            "store_bytes": self.gc.store_bytes,
            "gc_seconds": round(self.gc.duration_seconds, 3),
        }


class GcAborted(RuntimeError):
    """Marking could not read a referenced tree node, so sweeping might delete live data."""


class GcPostponed(GcAborted):
    """A capture held the store past the collection's patience: nothing was deleted, try later."""


class _Marker:
    """The set of referenced object digests, grown row by row (Merkle walk, each node once)."""

    def __init__(self, trees: Trees) -> None:
        self.trees = trees
        self.referenced: set[str] = set()
        self.missing: set[str] = set()
        self._visited_trees: set[str] = set()

    def add_row(self, tree_digest: str | None, state_digest: str | None) -> None:
        if state_digest:
            self.referenced.add(state_digest)
        if tree_digest:
            self._walk(tree_digest)

    def _walk(self, root: str) -> None:
        pending = [root]
        while pending:
            digest = pending.pop()
            if digest in self._visited_trees:
                continue
            self._visited_trees.add(digest)
            self.referenced.add(digest)
            try:
                # A split directory's parts are objects of their own (see ``tree``).
                self.referenced.update(self.trees.parts(digest))
                node = self.trees.read(digest)
            except CheckpointdError:
                self.missing.add(digest)
                continue
            for entry in node.values():
                if entry.kind is EntryKind.DIR:
                    pending.append(entry.digest)
                elif entry.kind is EntryKind.FILE:
                    self.referenced.add(entry.digest)


class Maintenance:
    """Retention and GC over one database and content store."""

    def __init__(self, db: Database, store: ContentStore | DatabaseStore, trees: Trees, config: ConfigStore,
                 delete_checkpoint: Callable[[str], None]) -> None:
        self.db = db
        self.store = store
        self.trees = trees
        self.config = config
        self.delete_checkpoint = delete_checkpoint

    # -- retention ----------------------------------------------------------------------

    def _policy(self, plan_id: str) -> Policy:
        values = self.config.resolve_many(RETENTION_KEYS, plan_id)
        return Policy(values[RETENTION_MAX_CHECKPOINTS].value, values[RETENTION_MAX_AGE_SECONDS].value,
                      values[RETENTION_SAFETY_MAX_AGE_SECONDS].value)

    def _plans_with_overrides(self) -> set[str]:
        with self.db.session() as session:
            rows = session.exec(select(ConfigRow.plan_id).where(
                col(ConfigRow.key).in_(RETENTION_KEYS), ConfigRow.plan_id != "")).all()
        return set(rows)

    def _candidates(self, plan_ids: Iterable[str] | None) -> dict[str, list[Candidate]]:
        query = select(CheckpointRow.checkpoint_id, CheckpointRow.plan_id, CheckpointRow.sequence,
                       CheckpointRow.phase, CheckpointRow.labels, CheckpointRow.create_time)
        if plan_ids is not None:
            query = query.where(col(CheckpointRow.plan_id).in_(list(plan_ids)))
        query = query.order_by(CheckpointRow.plan_id, col(CheckpointRow.sequence).desc())
        by_plan: dict[str, list[Candidate]] = {}
        with self.db.session() as session:
            for row in session.exec(query):
                by_plan.setdefault(row[1], []).append(Candidate(*row))
        return by_plan

    def prune(self, now: datetime | None = None, dry_run: bool = False) -> PruneReport:
        """Deletes the checkpoints the retention policy no longer keeps."""
        now = now or datetime.now(UTC)
        report = PruneReport(dry_run=dry_run)
        default_policy = self._policy("")
        overridden = self._plans_with_overrides()
        if not default_policy.active and not overridden:
            return report
        by_plan = self._candidates(None if default_policy.active else overridden)
        for plan_id, newest_first in by_plan.items():
            policy = self._policy(plan_id) if plan_id in overridden else default_policy
            if not policy.active:
                continue
            for candidate, rule in select_prunable(newest_first, policy, now):
                if not dry_run:
                    try:
                        self.delete_checkpoint(candidate.checkpoint_id)
                    except NotFound:
                        continue
                    except RollbackUnfinished:
                        break  # the plan's interrupted rollback keeps its checkpoints until finished
                report.pruned[rule] += 1
                report.checkpoint_ids.append(candidate.checkpoint_id)
        if not dry_run:
            for rule, count in report.pruned.items():
                if count:
                    telemetry.checkpoints_pruned(rule.value, count)
        return report

    # -- garbage collection -------------------------------------------------------------

    def _mark_rows(self, marker: _Marker, seen: set[str]) -> None:
        query = select(CheckpointRow.checkpoint_id, CheckpointRow.tree_digest, CheckpointRow.state_digest)
        with self.db.session() as session:
            rows = session.exec(query).all()
        for checkpoint_id, tree_digest, state_digest in rows:
            if checkpoint_id in seen:
                continue
            seen.add(checkpoint_id)
            marker.add_row(tree_digest, state_digest)

    @contextlib.contextmanager
    def _collecting(self) -> Iterator[None]:
        """The store's ``collecting`` fence, or ``GcPostponed`` if it is not had within the patience."""
        try:
            with self.store.collecting(GC_PATIENCE_SECONDS):
                yield
        except Postponed as exc:
            telemetry.gc_postponed()
            raise GcPostponed(f"garbage collection postponed, nothing was deleted: {exc} "
                              "(a capture may be stuck on its workspace)") from exc

    def collect_garbage(self, dry_run: bool = False) -> GcReport:
        """Deletes unreferenced objects; returns what was reclaimed and what remains."""
        started = time.monotonic()
        marker = _Marker(self.trees)
        seen: set[str] = set()
        self._mark_rows(marker, seen)
        # Objects written after this listing are never candidates; a candidate that a
        # checkpoint committed since then references is marked again under the fence.
        candidates = [d for d in self.store.iter_digests() if d not in marker.referenced]
        sizes = object_sizes(self.store, candidates)
        crash_point(Point.GC_LISTED)
        deleted = reclaimed = 0
        with self._collecting():
            self._mark_rows(marker, seen)
            if marker.missing:
                raise GcAborted(f"{len(marker.missing)} referenced tree node(s) are missing from the store "
                                f"(e.g. {sorted(marker.missing)[0]}); nothing was deleted")
            for digest in candidates:
                if digest in marker.referenced:
                    continue
                if not dry_run:
                    try:
                        self.store.delete(digest)
                    except Postponed as lost:
                        raise GcAborted(f"garbage collection stopped after deleting {deleted} objects: "
                                        f"{lost}") from lost
                    except DataLoss as damaged:
                        # A delta over it cannot be read to be stored whole: the base is kept (the
                        # delta may yet be repaired) and the rest is collected; fsck reports it.
                        log.error("garbage collection kept %s: %s; run `checkpointd fsck`", digest, damaged)
                        continue
                deleted += 1
                reclaimed += sizes.get(digest, 0)
            if not dry_run:
                # Packs that records died in without a deletion (dropped batches) are compacted too.
                self.store.compact_mostly_dead()
        objects, size = store_footprint(self.store)
        report = GcReport(deleted_objects=deleted, reclaimed_bytes=reclaimed, store_objects=objects,
                          store_bytes=size, duration_seconds=time.monotonic() - started, dry_run=dry_run)
        telemetry.garbage_collected(report)
        return report

    def run(self, dry_run: bool = False) -> MaintenanceReport:
        """Retention first (it frees references), then GC."""
        prune = self.prune(dry_run=dry_run)
        gc = self.collect_garbage(dry_run=dry_run)
        if not dry_run:
            self.db.truncate_wal()
        busy = prune.total or gc.deleted_objects
        log.log(logging.INFO if busy else logging.DEBUG,
                "maintenance: pruned %d checkpoint(s), deleted %d object(s), reclaimed %d bytes%s",
                prune.total, gc.deleted_objects, gc.reclaimed_bytes, " (dry run)" if dry_run else "",
                extra={"pruned": prune.total, "reclaimed_bytes": gc.reclaimed_bytes,
                       "deleted_objects": gc.deleted_objects})
        return MaintenanceReport(prune, gc)
