"""What each plan's checkpoints hold in the content store (``checkpointd stats``).

A plan's ``store_bytes`` is what the objects its checkpoints reference take in the store
(compressed, as packed; a loose object's file): the tree nodes, file contents and states, each
counted once per plan. Content is deduplicated across plans, so an object two plans share is
counted in both, and the plans' figures may add up to more than the store holds.
"""

from __future__ import annotations

import os
from dataclasses import asdict, dataclass
from pathlib import Path

from sqlmodel import select

from checkpointd.core.maintenance.retention import _Marker, object_sizes, store_footprint
from checkpointd.core.metadata.db import Database
from checkpointd.core.metadata.models import CheckpointRow
from checkpointd.core.store.content_store import ContentStore
from checkpointd.core.store.db_store import DatabaseStore
from checkpointd.core.store.tree import Trees


@dataclass(frozen=True)
class PlanUsage:
    plan_id: str
    checkpoints: int
    objects: int
    store_bytes: int


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


def _stored_sizes(store: ContentStore | DatabaseStore, digests: set[str]) -> dict[str, int]:
    if isinstance(store, ContentStore):
        return {digest: store.stored_size(digest) or 0 for digest in digests}
    return object_sizes(store, digests)


def _wal_bytes(data_dir: Path) -> int:
    total = 0
    for directory, _dirs, files in os.walk(data_dir):
        for name in files:
            if name.endswith("-wal"):
                total += os.lstat(os.path.join(directory, name)).st_size
    return total


def store_usage(db: Database, store: ContentStore | DatabaseStore, data_dir: Path) -> StoreUsage:
    """Every plan's checkpoints and store bytes, largest first, and the store's own totals."""
    trees = Trees(store)
    rows: dict[str, list[tuple[str | None, str | None]]] = {}
    with db.session() as session:
        for plan_id, tree_digest, state_digest in session.exec(
                select(CheckpointRow.plan_id, CheckpointRow.tree_digest, CheckpointRow.state_digest)):
            rows.setdefault(plan_id, []).append((tree_digest, state_digest))
    plans, missing = [], 0
    for plan_id, checkpoints in rows.items():
        marker = _Marker(trees)
        for tree_digest, state_digest in checkpoints:
            marker.add_row(tree_digest, state_digest)
        sizes = _stored_sizes(store, marker.referenced - marker.missing)
        plans.append(PlanUsage(plan_id, len(checkpoints), len(sizes), sum(sizes.values())))
        missing += len(marker.missing)
    plans.sort(key=lambda usage: (-usage.store_bytes, usage.plan_id))
    objects, size = store_footprint(store)
    return StoreUsage(plans, objects, size, _wal_bytes(data_dir), missing)
