"""Opening a store: its packs replayed in order, a torn tail cut off, and deltas whose chain
of bases does not end in a stored whole object dropped (a mixin of ``ContentStore``, whose
index it fills)."""

from __future__ import annotations

import logging
import os
from collections.abc import Iterator

from checkpointd.core.kernel.errors import DataLoss, Reason
from checkpointd.core.store.packs import (
    DELETED,
    DELTA_HEADER,
    DELTAS,
    KINDS,
    MAX_CHAIN_LINKS,
    PACK_HEADER,
    PACK_MAGIC,
    PACK_MAGIC_ZLIB,
    PACK_MAGIC_ZSTD,
    Location,
    Pack,
    Recovery,
)
from checkpointd.core.workspace.readworker import RECORD

log = logging.getLogger("checkpointd.store")


class PackReplay:
    """``ContentStore``'s replay of its packs on open (see the module docstring)."""

    def _records(self, pack: Pack, size: int) -> Iterator[tuple[str, bytes, int, int]]:
        """A pack's well-formed records up to ``size``, in order: (digest, kind, body offset,
        body length). Stops at the first that is not (a torn tail)."""
        offset = PACK_HEADER.size
        buffer, buffer_start = b"", offset
        while offset + RECORD.size <= size:
            if offset + RECORD.size > buffer_start + len(buffer):
                buffer, buffer_start = os.pread(pack.fd, 4 << 20, offset), offset
            raw_digest, kind, length = RECORD.unpack_from(buffer, offset - buffer_start)
            body_at = offset + RECORD.size
            if kind not in KINDS or body_at + length > size:
                return
            yield raw_digest.hex(), kind, body_at, length
            offset = body_at + length

    def _recover(self, pack: Pack, recovery: Recovery) -> None:
        """Indexes a pack's records; past the durable hint each one is verified, and the
        first incomplete or corrupt record (a write cut short by a crash) ends the pack."""
        size = os.fstat(pack.fd).st_size
        magic, durable_hint = PACK_HEADER.unpack(os.pread(pack.fd, PACK_HEADER.size, 0).ljust(16, b"\0"))
        if magic not in (PACK_MAGIC, PACK_MAGIC_ZSTD, PACK_MAGIC_ZLIB):
            raise DataLoss(Reason.CORRUPT_CONTENT, f"{pack.path} is not a pack")
        pack.appendable = magic == PACK_MAGIC
        end = PACK_HEADER.size
        for digest, kind, body_at, length in self._records(pack, size):
            if kind in DELTAS:
                if length < DELTA_HEADER.size:
                    break
                raw_base, depth = DELTA_HEADER.unpack(os.pread(pack.fd, DELTA_HEADER.size, body_at))
                location = Location(pack, body_at, length, kind, raw_base.hex(), depth)
            else:
                location = Location(pack, body_at, length, kind)
            if body_at + length > durable_hint and kind != DELETED:
                if kind in DELTAS:
                    # Its base may be in a later pack (moved by a compaction): checked once all are read.
                    recovery.unverified.append((digest, location))
                elif not self._verifies(digest, location):
                    break
            end = body_at + length
            previous = self._committed.pop(digest, None)
            if previous is not None:
                self._mark_dead(digest, previous)
            recovery.record(digest, location, previous)
            if kind != DELETED:
                self._committed[digest] = location
                if kind in DELTAS:
                    self._dependents.setdefault(location.base, set()).add(digest)
        if end < durable_hint <= size:
            # Not a torn tail: the durable part is damaged. Cutting here would destroy every intact
            # record after it, so they stay in the file (unindexed) for whoever repairs it.
            log.error("%s: the record at offset %d, within the durable part (%d bytes), cannot be read; "
                      "the %d bytes from there are left in place and not indexed", pack.path, end,
                      durable_hint, size - end)
            pack.appendable = False
            pack.damaged_at = end
        elif end != size:
            os.ftruncate(pack.fd, end)
            os.fsync(pack.fd)
        elif end > durable_hint:
            # Intact records past the last sync a process made: a committed batch's whose hint
            # was not yet on disk, or one never made durable (aborted, a live diff's, a capture whose
            # caller gave up, a crash), read back from the page cache. From now on they count as
            # stored and a batch may reference them without writing them again: on disk first.
            os.fdatasync(pack.fd)
            recovery.synced.append((pack, end))
        pack.size = pack.durable = end

    def _settle_deltas(self, recovery: Recovery) -> None:
        """Once every pack is read: a delta written past a durable hint must reproduce its
        object, and every delta's chain of bases must end in a stored whole object (a
        tombstone lost with a compacted pack, or a batch's record left behind, may have
        indexed one whose base is gone). Headers only, but for the deltas not known durable."""
        for digest, location in recovery.unverified:
            if self._committed.get(digest) is location and not self._verifies(digest, location):
                log.warning("dropping %s: its delta does not reproduce it (a write cut short)", digest)
                self._fall_back(digest, recovery)
                self._stop_appending(location.pack)
        resolved: dict[str, bool] = {}
        for digest in [d for d, location in self._committed.items() if location.kind in DELTAS]:
            self._resolves(digest, recovery, resolved)
        self._prefer_shallower_records(recovery)
        self._move_hints(recovery)

    def _move_hints(self, recovery: Recovery) -> None:
        """Once the deltas are settled: the durable hint of each pack synced on open is moved to
        the end of its records, unless a record past the old hint was dropped (see
        ``_stop_appending``: no hint may cover it). After the sync, so a hint never says more than
        the disk holds."""
        for pack, end in recovery.synced:
            if pack.appendable:
                pack.write_hint(end)

    def _prefer_shallower_records(self, recovery: Recovery) -> None:
        """An object indexed as a delta that has an earlier record, since its last tombstone,
        fewer deltas deep is indexed by the shallowest of those that reads. Two batches wrote it
        at once: one committed it, the other's deeper delta came later in the pack (that batch
        aborted, died, or committed first and was replaced in memory). Objects stored since as
        deltas of it counted the depth the server had indexed; the deeper record would make their
        chains longer than their records say, growing with every such race across restarts."""
        for digest, earlier in list(recovery.superseded.items()):
            current = self._committed.get(digest)
            if current is None or current.kind not in DELTAS:
                continue
            for candidate in sorted(earlier, key=lambda location: location.depth):
                if candidate.depth >= current.depth:
                    break
                if candidate.kind in DELTAS and not (self._chain_avoids(candidate.base, digest)
                                                     and self._verifies(digest, candidate)):
                    continue
                self._mark_dead(digest, current)
                self._index_again(digest, candidate)
                if candidate.kind in DELTAS:
                    self._dependents.setdefault(candidate.base, set()).add(digest)
                break

    def _chain_avoids(self, base: str, digest: str) -> bool:
        """Whether ``base``'s indexed chain ends in a whole object without passing ``digest``."""
        current, links = base, 0
        while current != digest and links <= MAX_CHAIN_LINKS:
            location = self._committed.get(current)
            if location is None:
                return False
            if location.kind not in DELTAS:
                return True
            current, links = location.base, links + 1
        return False

    def _stop_appending(self, pack: Pack) -> None:
        """A record dropped past a pack's durable hint stays in the file (the records after it
        may be ones a commit made durable before the hint said so). Nothing more is appended to
        that pack, so no sync ever writes a hint that covers the dropped record: every open
        checks it again, and drops it again, until a compaction leaves it behind."""
        pack.appendable = False
        if self._active is pack:
            self._active = None

    def _resolves(self, digest: str, recovery: Recovery, resolved: dict[str, bool]) -> bool:
        """Whether ``digest`` is readable from what is indexed, dropping (or falling back
        from) every delta on its chain that is not."""
        chain: dict[str, None] = {}
        current = digest
        while True:
            if current in recovery.falling_back:
                # An earlier record of it is being tried and this chain leads back to it: whether
                # the chain resolves is for that fall-back to find out, so nothing on it is settled.
                return False
            if current in resolved:
                ok = resolved[current]
                break
            location = self._committed.get(current)
            if location is None or current in chain:
                ok = False
                break
            if location.kind not in DELTAS:
                ok = resolved[current] = True
                break
            chain[current] = None
            current = location.base
        for delta in reversed(chain):
            if delta in resolved:  # settled meanwhile, on the chain of a record fallen back on
                ok = resolved[delta]
                continue
            if not ok:
                log.warning("dropping %s: it is a delta against %s, which is not stored", delta,
                            self._committed[delta].base)
                ok = self._fall_back(delta, recovery, resolved)
            resolved[delta] = ok
        return ok

    def _index_again(self, digest: str, earlier: Location) -> None:
        """Indexes a superseded record of ``digest`` again (no longer counted dead)."""
        self._committed[digest] = earlier
        if earlier.pack is not None:
            self._dead[earlier.pack] -= RECORD.size + earlier.length

    def _fall_back(self, digest: str, recovery: Recovery, resolved: dict[str, bool] | None = None) -> bool:
        """Drops the indexed record of ``digest``; an earlier record of it that resolves
        (one a later batch's record superseded) takes its place. Whether one did."""
        self._mark_dead(digest, self._committed.pop(digest))
        recovery.falling_back.add(digest)
        try:
            for earlier in reversed(recovery.superseded.pop(digest, [])):
                self._index_again(digest, earlier)
                if earlier.kind not in DELTAS or self._resolves(earlier.base, recovery,
                                                                  {} if resolved is None else resolved):
                    return True
                self._mark_dead(digest, self._committed.pop(digest))
            return False
        finally:
            recovery.falling_back.discard(digest)
