"""What each plan's checkpoints hold in the content store (``checkpointd stats``, and the
``checkpointd_plan_*store_bytes`` gauges).

A plan's **store_bytes** is the sum, over the distinct objects its checkpoints reference (every
tree node reachable from a checkpoint's tree, every file content in those nodes, every plan-state
object), of the bytes each object takes in the store as it is stored, compressed:

- disk store: a packed object's record (its 37-byte header and its body: zstd, raw, or a delta
  against its base object), a large (loose) object's file;
- database store (``--store db``): the length of its ``object_chunks`` data (zlib when smaller).

Content is deduplicated across checkpoints and plans: an object counts once per plan however many
of the plan's checkpoints reference it, and in every plan that references it, so the plans'
figures may add up to more than the store holds.

A plan's **exclusive_bytes** is the part of its store_bytes made of objects no other plan
references: what deleting every checkpoint of the plan and collecting garbage would reclaim
(approximately, on the disk store: an object stored as a delta against one of them is rewritten
whole first, and packs shrink only when compacted).

Neither counts what the store spends besides objects (pack headers, records nothing indexes any
more until compaction, SQLite's write-ahead logs): the store's own totals, in ``StoreUsage``, do.

The cost is about a garbage collection's marking with a cold cache: each plan's trees are walked
(a node two plans share is decoded once, while the measurement's own ``Trees`` cache holds it) and
each distinct referenced object's size is looked up once. It runs in the server's usage thread or
on demand (``checkpointd stats``), never on a scrape or an RPC.
"""

from __future__ import annotations

import os
import time
from collections.abc import Iterable
from dataclasses import asdict, dataclass
from pathlib import Path

from sqlmodel import select

from checkpointd.core.maintenance.retention import _Marker, store_footprint
from checkpointd.core.metadata.db import Database
from checkpointd.core.metadata.models import CheckpointRow
from checkpointd.core.store.content_store import ContentStore
from checkpointd.core.store.db_store import DatabaseStore
from checkpointd.core.store.tree import Trees

#: ``_owner`` value of an object more than one plan references.
_SHARED = ""


@dataclass(frozen=True)
class PlanUsage:
    plan_id: str
    checkpoints: int
    #: Distinct stored objects the plan's checkpoints reference.
    objects: int
    #: What those objects take in the store (see the module's docstring).
    store_bytes: int
    #: The part of ``store_bytes`` no other plan references.
    exclusive_bytes: int


@dataclass(frozen=True)
class PlansUsage:
    #: Largest store_bytes first.
    plans: list[PlanUsage]
    #: Referenced tree nodes that could not be read: the plans' figures leave out what is under them.
    missing_nodes: int
    #: When the measurement started (seconds since the epoch): it counts every checkpoint committed before.
    measured_at: float


@dataclass(frozen=True)
class StoreUsage:
    plans: list[PlanUsage]
    store_objects: int
    store_bytes: int
    #: SQLite's write-ahead logs beside the data (the metadata's and the stat index's), 0 on PostgreSQL.
    wal_bytes: int
    #: Referenced tree nodes that could not be read: the plan's figure leaves out what is under them.
    missing_nodes: int

    def as_dict(self) -> dict[str, object]:
        return asdict(self)


def _wal_bytes(data_dir: Path) -> int:
    total = 0
    for directory, _dirs, files in os.walk(data_dir):
        for name in files:
            if name.endswith("-wal"):
                total += os.lstat(os.path.join(directory, name)).st_size
    return total


def _checkpoints_by_plan(db: Database) -> dict[str, list[tuple[str | None, str | None]]]:
    rows: dict[str, list[tuple[str | None, str | None]]] = {}
    with db.session() as session:
        for plan_id, tree_digest, state_digest in session.exec(
                select(CheckpointRow.plan_id, CheckpointRow.tree_digest, CheckpointRow.state_digest)):
            rows.setdefault(plan_id, []).append((tree_digest, state_digest))
    return rows


def plans_usage(db: Database, store: ContentStore | DatabaseStore) -> PlansUsage:
    """Every plan's store_bytes and exclusive_bytes (see the module's docstring).

    Holds one plan's referenced set at a time, plus, for every referenced object, its size and
    which plan references it (or that several do)."""
    measured_at = time.time()
    trees = Trees(store)
    sizes: dict[str, int] = {}
    owner: dict[str, str] = {}
    totals: dict[str, tuple[int, int, int]] = {}
    missing = 0
    for plan_id, checkpoints in _checkpoints_by_plan(db).items():
        marker = _Marker(trees)
        for tree_digest, state_digest in checkpoints:
            marker.add_row(tree_digest, state_digest)
        missing += len(marker.missing)
        referenced = marker.referenced - marker.missing
        sizes.update(store.stored_sizes(digest for digest in referenced if digest not in sizes))
        stored = [digest for digest in referenced if digest in sizes]
        for digest in stored:
            owner[digest] = plan_id if owner.get(digest, plan_id) == plan_id else _SHARED
        totals[plan_id] = (len(checkpoints), len(stored), sum(sizes[digest] for digest in stored))
    exclusive = dict.fromkeys(totals, 0)
    for digest, plan_id in owner.items():
        if plan_id != _SHARED:
            exclusive[plan_id] += sizes[digest]
    plans = [PlanUsage(plan_id, checkpoints, objects, size, exclusive[plan_id])
             for plan_id, (checkpoints, objects, size) in totals.items()]
    plans.sort(key=lambda usage: (-usage.store_bytes, usage.plan_id))
    return PlansUsage(plans, missing, measured_at)


def store_usage(db: Database, store: ContentStore | DatabaseStore, data_dir: Path,
                plan_ids: Iterable[str] = ()) -> StoreUsage:
    """Every plan's usage (only ``plan_ids``' if given; exclusive_bytes still weighs every plan),
    largest first, and the store's own totals."""
    usage = plans_usage(db, store)
    wanted = set(plan_ids)
    plans = [plan for plan in usage.plans if not wanted or plan.plan_id in wanted]
    objects, size = store_footprint(store)
    return StoreUsage(plans, objects, size, _wal_bytes(data_dir), usage.missing_nodes)
