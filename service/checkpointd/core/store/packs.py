"""The pack file: its header and record format, an append-only pack with shared syncs, where
an object's body is (``Location``), and what replaying the packs on open learns (``Recovery``).
The record header and the RAW/ZLIB/ZSTD encoding are shared with reader processes (``readworker``)."""

from __future__ import annotations

import contextlib
import errno
import os
import struct
import threading
import zlib
from dataclasses import dataclass, field
from pathlib import Path

import zstandard

from checkpointd.core.kernel.errors import Reason, ResourceExhausted
from checkpointd.core.workspace.readworker import COMPRESS_LIMIT, RAW, RECORD, ZLIB, ZSTD

#: Record kinds besides RAW and ZLIB, whose encoding (like the record header) reader
#: processes share (see ``readworker``).
#: A delta as servers before zstd deltas wrote it (zlib: the base's last 32 KiB as dictionary).
DELTA = b"X"

#: A delta: zstd with the whole base as its dictionary.
ZSTD_DELTA = b"Y"

DELTAS = (DELTA, ZSTD_DELTA)

DELETED = b"D"

KINDS = (RAW, ZLIB, ZSTD, DELTA, ZSTD_DELTA, DELETED)

#: A delta is an object compressed with the content of another object (its base) as
#: dictionary: ``base digest (32 bytes) | depth (1) | stream``, the stream zstd with all of the
#: base as a raw-content dictionary (kind ``Y``), or, written before, zlib with the base's last
#: 32 KiB (kind ``X``: zlib looks back no further, so a change near the top of a file over 32
#: KiB cost a whole copy, and level-1 zlib deltas of small files were about 1.8x zstd's). A new
#: version of a file or of a directory node is stored against the previous one, or against a
#: stored object found like it by content (``similar``); chains stay short to bound reads.
DELTA_HEADER = struct.Struct(">32sB")

#: Packs that may hold zstd deltas. A server from before them refuses such a pack as "not a
#: pack" rather than taking its first such record for a torn tail and cutting the rest off.
PACK_MAGIC = b"CKPTPAK3"

#: Packs written before zstd deltas (no ``Y`` records): read, never appended to.
PACK_MAGIC_ZSTD = b"CKPTPAK2"

#: Packs written before zstd (raw and zlib records only): read, never appended to.
PACK_MAGIC_ZLIB = b"CKPTPAK1"

PACK_HEADER = struct.Struct(">8sQ")

#: What a corrupt record body raises when it is decoded.
BODY_ERRORS = (zlib.error, zstandard.ZstdError)

_decompressors = threading.local()

#: What every zstd frame this store writes starts with. A skippable frame (magic 0x184D2A5?)
#: reports no content size and asks the decoder for the size its own header claims (up to
#: 4 GiB): a record that is not a plain frame is corrupt.
ZSTD_FRAME_MAGIC = b"\x28\xb5\x2f\xfd"


def _check_frame(frame: bytes) -> None:
    """Refuses a frame that is not one this store writes, or that says it holds more than a
    packed object may (a corrupt one is not given the memory it asks for)."""
    if not frame.startswith(ZSTD_FRAME_MAGIC):
        raise zstandard.ZstdError("a zstd record does not start with a zstd frame")
    size = zstandard.frame_content_size(frame)
    if not 0 <= size <= COMPRESS_LIMIT:
        raise zstandard.ZstdError(f"a zstd record claims {size} bytes")


def zlib_decompress(body: bytes, zdict: bytes | None = None) -> bytes:
    """A zlib record's content (records written before zstd; ``zdict``: a zlib delta's base),
    held to COMPRESS_LIMIT like a zstd one's: a corrupt body is not inflated without bound."""
    decompressor = zlib.decompressobj() if zdict is None else zlib.decompressobj(zdict=zdict)
    data = decompressor.decompress(body, COMPRESS_LIMIT + 1)
    if len(data) > COMPRESS_LIMIT or decompressor.unconsumed_tail:
        raise zlib.error(f"a zlib record inflates past {COMPRESS_LIMIT} bytes")
    if not decompressor.eof:
        raise zlib.error("a zlib record ends before its stream does")
    return data


def zstd_decompress(body: bytes, base: bytes | None = None) -> bytes:
    """A zstd record's content (``base``: a zstd delta's, its dictionary). Only objects up to
    COMPRESS_LIMIT are packed: a frame that says it holds more is corrupt, and is not given the
    memory it asks for."""
    _check_frame(body)
    if base is not None:
        dictionary = zstandard.ZstdCompressionDict(base, dict_type=zstandard.DICT_TYPE_RAWCONTENT)
        return zstandard.ZstdDecompressor(dict_data=dictionary).decompress(body, max_output_size=COMPRESS_LIMIT)
    return _thread_decompressor().decompress(body, max_output_size=COMPRESS_LIMIT)


def _thread_decompressor() -> zstandard.ZstdDecompressor:
    """This thread's decompressor without a dictionary (one is not shared between threads)."""
    decompressor = getattr(_decompressors, "decompressor", None)
    if decompressor is None:
        decompressor = _decompressors.decompressor = zstandard.ZstdDecompressor()
    return decompressor


def zstd_decompress_chain(frames: list[bytes]) -> bytes:
    """The content at the end of a chain of zstd frames: the first stands alone, each next one
    is a delta whose dictionary is the content before it (as ``zstd_decompress`` with ``base``).
    One decompression context for the whole chain: making one costs ~13 µs, decoding a link of
    a small file ~1-2 µs. A frame that claims more than COMPRESS_LIMIT is refused, as there."""
    for frame in frames:
        _check_frame(frame)
    try:
        return _thread_decompressor().decompress_content_dict_chain(frames)
    except ValueError as exc:  # a frame without its content size: not one this store writes
        raise zstandard.ZstdError(str(exc)) from exc


def pwrite_all(fd: int, data: bytes, offset: int) -> None:
    """Writes all of ``data``; a short write is retried, so a full disk surfaces as ENOSPC."""
    view = memoryview(data)
    while view:
        written = os.pwrite(fd, view, offset)
        if written == 0:
            raise OSError(errno.ENOSPC, "no space left to append to the pack")
        view, offset = view[written:], offset + written

def storage_error(exc: OSError) -> Exception:
    if exc.errno in (errno.ENOSPC, errno.EDQUOT):
        return ResourceExhausted(Reason.STORAGE_EXHAUSTED, f"content store is full: {exc.strerror}")
    return exc

def fsync_dir(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY | os.O_DIRECTORY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)

@dataclass(frozen=True, slots=True)
class Location:
    """Where an object's body is: a pack and offset, or (pack None) its loose file."""

    pack: Pack | None
    offset: int = 0
    length: int = 0
    kind: bytes = RAW
    #: Deltas only: the base's digest and how many deltas deep this one is.
    base: str = ""
    depth: int = 0

#: How many deltas deep the store writes an object at most.
MAX_DELTA_DEPTH = 16
#: Links past which a chain being read is taken for damaged (see ``ContentStore._base``): a
#: margin over the deepest the store writes.
MAX_CHAIN_LINKS = 4 * MAX_DELTA_DEPTH


def dead_key(digest: str) -> int:
    """What ``ContentStore._dead_keys`` holds of a digest: its first 64 bits (a false match
    only keeps a tombstone that is not needed)."""
    return int(digest[:16], 16)

@dataclass
class Recovery:
    """What opening the packs learns besides the index, for ``ContentStore._settle_deltas``."""

    #: Deltas written past their pack's durable hint, not verified yet.
    unverified: list[tuple[str, Location]] = field(default_factory=list)
    #: Earlier records of an object whose latest record is a delta, oldest first (rare: two
    #: batches wrote it at once), to fall back on when that delta does not resolve.
    superseded: dict[str, list[Location]] = field(default_factory=dict)
    #: Objects whose earlier records a ``_fall_back`` is trying: a chain that reaches one is left
    #: for that fall-back to decide, not settled (nor fallen back on again) from inside it.
    falling_back: set[str] = field(default_factory=set)
    #: Packs synced on open because intact records lay past their durable hint, with the end of
    #: those records: the hint is moved there once the deltas among them are settled.
    synced: list[tuple[Pack, int]] = field(default_factory=list)

    def record(self, digest: str, location: Location, previous: Location | None) -> None:
        if location.kind not in DELTAS:
            self.superseded.pop(digest, None)
        elif previous is not None:
            self.superseded.setdefault(digest, []).append(previous)

class Pack:
    """One append-only pack file. Appends are serialized; syncs are shared (group commit)."""

    def __init__(self, path: Path, number: int, fd: int, size: int, durable: int) -> None:
        self.path = path
        self.number = number
        self.fd = fd
        self.size = size
        self.durable = durable
        #: False for a pack from before zstd deltas (see PACK_MAGIC_ZSTD), or a damaged one.
        self.appendable = True
        #: Where a record its header says is durable cannot be read: the bytes from there on are
        #: kept (not indexed, never compacted away) for repair; fsck reports them.
        self.damaged_at: int | None = None
        self._append_lock = threading.Lock()
        self._sync_lock = threading.Lock()

    def append(self, digest: str, kind: bytes, body: bytes, base: str = "", depth: int = 0) -> Location:
        offset = self._append(RECORD.pack(bytes.fromhex(digest), kind, len(body)) + body)
        return Location(self, offset + RECORD.size, len(body), kind, base, depth)

    def append_records(self, records: list[bytes]) -> list[Location]:
        """Appends whole records (header and body) with one write; their locations, in order."""
        offset = self._append(b"".join(records))
        locations = []
        header = RECORD.size
        for record in records:
            locations.append(Location(self, offset + header, len(record) - header, record[32:33]))
            offset += len(record)
        return locations

    def _append(self, data: bytes) -> int:
        """Writes ``data`` at the end of the pack; returns where it starts. A write that fails
        part-way is cut off again, so the pack never ends in a torn record of ours."""
        with self._append_lock:
            offset = self.size
            try:
                pwrite_all(self.fd, data, offset)
            except OSError as exc:
                with contextlib.suppress(OSError):
                    os.ftruncate(self.fd, offset)
                raise storage_error(exc) from exc
            self.size = offset + len(data)
        return offset

    def sync_to(self, end: int) -> None:
        """Makes the pack durable at least up to ``end``; one fdatasync serves every waiter."""
        if self.durable >= end:
            return
        with self._sync_lock:
            if self.durable >= end:
                return
            target = self.size
            try:
                os.fdatasync(self.fd)
            except OSError as exc:
                raise storage_error(exc) from exc
            self.durable = target
            self.write_hint(target)

    def write_hint(self, durable: int) -> None:
        """Records in the header that the pack is on disk up to ``durable`` (call after the sync
        that made it so): a hint for recovery, made durable by the next sync, that the records
        before it need no check."""
        os.pwrite(self.fd, struct.pack(">Q", durable), 8)

    def read(self, location: Location) -> bytes:
        data = os.pread(self.fd, location.length, location.offset)
        if len(data) != location.length:
            raise OSError(errno.EIO, f"pack {self.path.name} is truncated")
        return data
