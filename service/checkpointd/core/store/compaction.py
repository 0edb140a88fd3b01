"""Deleting objects, and compacting a pack that is mostly dead records (a mixin of
``ContentStore``): a deletion is recorded as a tombstone, and a compaction carries the
tombstones an older pack still needs."""

from __future__ import annotations

import contextlib
import logging

from checkpointd.core.kernel.faults import Point, crash_point
from checkpointd.core.store.packs import (
    DELETED,
    DELTAS,
    Pack,
    dead_key,
    fsync_dir,
)
from checkpointd.core.workspace.readworker import RECORD, pack_body

log = logging.getLogger("checkpointd.store")


class Compaction:
    """``ContentStore``'s deletion and pack compaction (see the module docstring)."""

    # -- deleting -----------------------------------------------------------------------

    def delete(self, digest: str) -> None:
        self._rewrite_dependents(digest)
        location = self._committed.pop(digest, None)
        self.deletions += 1
        with contextlib.suppress(FileNotFoundError):
            self.path_of(digest).unlink()
        if location is not None and location.pack is not None:
            # Recorded so that a reopened store does not index it again.
            self._writable_pack().append(digest, DELETED, b"")
            self._mark_dead(digest, location)
            pack = location.pack
            if self._dead[pack] * 2 > pack.size:
                self._compact(pack)

    def _rewrite_dependents(self, base: str) -> None:
        """Stores in full every object kept as a delta against ``base``, before ``base`` goes.
        Each leaves the base's dependents only once rewritten: if one cannot be read (damaged),
        the deletion fails and the rest stay known, so a later attempt cannot orphan them."""
        dependents = self._dependents.get(base, set())
        rewritten: dict[Pack, int] = {}
        try:
            for dependent in sorted(dependents):
                location = self._committed.get(dependent)
                if location is not None and location.kind in DELTAS and location.base == base:
                    kind, body = pack_body(self.read_bytes(dependent))
                    new = self._writable_pack().append(dependent, kind, body)
                    rewritten[new.pack] = max(rewritten.get(new.pack, 0), new.offset + new.length)
                    self._mark_dead(dependent, location)
                    self._committed[dependent] = new
                dependents.discard(dependent)
        finally:
            for pack, end in rewritten.items():
                pack.sync_to(end)
        self._dependents.pop(base, None)

    def _compact(self, pack: Pack) -> None:
        """Moves a mostly dead pack's live records to the active pack, then removes it. The pack
        being appended to is compacted too (a store smaller than one pack would otherwise give
        nothing back to the disk until it filled one): it is made durable, and its records move
        to a new pack. Called under ``collecting()`` (by ``delete``, ``compact_all`` and
        ``compact_mostly_dead``): no batch is between writing and committing, so nothing appends
        to a pack meanwhile.

        The pack's tombstones of objects that are not stored again go along while an older
        pack may still hold a record they end: without them a reopened store would index
        those records again. Everything appended so far is made durable before the pack goes,
        so a crash at any step leaves either the pack or its replacement records."""
        if pack.damaged_at is not None:
            return  # its unreadable bytes are kept for repair (see _recover)
        if pack is self._active:
            pack.sync_to(pack.size)
            self._active = None  # the next append starts a pack
        moving = [(digest, location) for digest, location in self._committed.items() if location.pack is pack]
        tombstones = {digest for digest, kind, _body, _length in self._records(pack, pack.size) if kind == DELETED}
        carried = [digest for digest in sorted(tombstones)
                   if digest not in self._committed and digest not in self._staged
                   and self._older_pack_may_hold(digest, pack)]
        target = self._writable_pack()
        moved = {digest: target.append(digest, location.kind, pack.read(location), location.base, location.depth)
                 for digest, location in moving}
        if carried:
            target.append_records([RECORD.pack(bytes.fromhex(digest), DELETED, 0) for digest in carried])
        crash_point(Point.COMPACT_COPIED)
        for written in list(self._packs):
            written.sync_to(written.size)
        for digest, location in moved.items():
            if self._committed.get(digest) is not None:
                self._committed[digest] = location
        with self._pack_lock:
            self._packs.remove(pack)
            self._dead.pop(pack, None)
            self._dead_keys.pop(pack, None)
        self._retired.retire(pack)
        crash_point(Point.COMPACT_SYNCED)
        pack.path.unlink(missing_ok=True)
        fsync_dir(self.packs_dir)
        log.info("compacted %s: %d live object(s) moved, %d tombstone(s) carried", pack.path.name, len(moved),
                 len(carried))

    def compact_all(self) -> tuple[int, int]:
        """Repacks: every pack holding a dead record (deleted, superseded, dropped) has its live
        records moved to a new pack and is removed, the active one included (a new one is started
        for them). Returns (packs compacted, bytes reclaimed). Call under ``collecting()``; each pack
        goes as ``_compact`` does, so a crash at any step loses nothing."""
        with self._pack_lock:
            dead = [pack for pack in self._packs if self._dead.get(pack, 0) > 0]
        if not dead:
            return 0, 0
        before = sum(pack.size for pack in self._packs)
        for pack in self._active_first(dead):
            self._compact(pack)
        return len(dead), max(0, before - sum(pack.size for pack in self._packs))

    def compact_mostly_dead(self) -> None:
        """Compacts every pack more than half dead: records die without a deletion too (a dropped
        batch's, such as a look's directory nodes; one superseded by another batch's), and
        ``delete`` compacts only the pack of what it deletes. Call under ``collecting()``."""
        with self._pack_lock:
            mostly_dead = [pack for pack in self._packs if self._dead.get(pack, 0) * 2 > pack.size]
        for pack in self._active_first(mostly_dead):
            self._compact(pack)

    def _active_first(self, packs: list[Pack]) -> list[Pack]:
        """``packs`` in order, the active one first: the others' records then move to the new
        pack it leaves behind, not into it, to be moved a second time."""
        return sorted(packs, key=lambda pack: pack is not self._active)

    def _older_pack_may_hold(self, digest: str, pack: Pack) -> bool:
        """Whether a pack before ``pack`` may hold a (dead) record of ``digest``."""
        key = dead_key(digest)
        return any(other.number < pack.number and key in self._dead_keys.get(other, ()) for other in self._packs)
