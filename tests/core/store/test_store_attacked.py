"""The content store attacked: forged and damaged pack bytes (each read gives the stored bytes or
DataLoss, never another error, a recursion or the memory a forged header claims), the one-pass
decoding of zstd delta chains, a torn delta dropped on open for good, deletion and compaction
racing readers, and a damaged dependent that must not let its base's deletion orphan the others.
(Two stores on one directory are refused a level up: tests/postgres/test_replicas.py.)"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import struct
import subprocess
import sys
import textwrap
import tracemalloc
import zlib
from pathlib import Path

import pytest
import zstandard
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from checkpointd.core.kernel.errors import DataLoss
from checkpointd.core.store import content_store as store_module
from checkpointd.core.store.content_store import MAX_DELTA_DEPTH, ContentStore
from checkpointd.core.workspace.readworker import COMPRESS_LIMIT
from tests.core.store.test_store_edges import _chain, _packs, _versions

#: A zstd skippable frame's header claiming 0xFFFFFFF0 bytes of skippable content (8 bytes).
_SKIPPABLE = struct.pack("<II", 0x184D2A50, 0xFFFFFFF0)


def _text(lines: int = 300) -> bytes:
    return _versions(lines)[0]


def _when_located(store: ContentStore, monkeypatch, digest: str, action) -> None:
    """Runs ``action`` once, when a read has just found where ``digest`` is and before it reads
    it there (a reader descheduled at that moment while a collection runs)."""
    real_locate = store._locate
    done = []

    def locate(wanted):
        location = real_locate(wanted)
        if wanted == digest and not done:
            done.append(True)
            action()
        return location

    monkeypatch.setattr(store, "_locate", locate)


def _record(data: bytes, kind: bytes, body: bytes) -> bytes:
    return hashlib.sha256(data).digest() + kind + len(body).to_bytes(4, "big") + body


def _write_pack(root: Path, records: bytes, magic: bytes = b"CKPTPAK3", number: int = 1) -> Path:
    """A pack of ``records`` whose header says all of it is durable (so nothing is verified on open)."""
    (root / "packs").mkdir(parents=True, exist_ok=True)
    path = root / "packs" / f"pack-{number:06d}.pack"
    path.write_bytes(magic + (16 + len(records)).to_bytes(8, "big") + records)
    return path


def _overwrite(path: Path, offset: int, data: bytes) -> None:
    with open(path, "r+b") as f:
        f.seek(offset)
        f.write(data)


def _peak_bytes(action) -> int:
    """The most memory Python's allocators held at once while ``action`` ran (its own exceptions
    are left to the caller's check)."""
    tracemalloc.start()
    try:
        with contextlib.suppress(Exception):  # what it raises is checked by the caller separately
            action()
        return tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()


# -- findings ---------------------------------------------------------------------------


def test_a_forged_skippable_frame_is_not_given_the_memory_it_claims(tmp_path):
    """``zstd_decompress``: 'a frame that says it holds more is corrupt, and is not given the
    memory it asks for'. A skippable frame's header claims its size in another field."""
    data = b"content of a file " * 40
    store = ContentStore(tmp_path)
    with store.batch() as batch:
        digest = batch.put_bytes(data)
    location = store._committed[digest]
    assert location.kind == b"S"
    _overwrite(location.pack.path, location.offset, _SKIPPABLE)
    with pytest.raises(DataLoss):
        store.read_bytes(digest)
    assert _peak_bytes(lambda: store.read_bytes(digest)) < 4 * COMPRESS_LIMIT


_UNDER_A_MEMORY_LIMIT = textwrap.dedent("""
    import json, resource, sys
    from pathlib import Path
    from checkpointd.core.kernel.errors import DataLoss
    from checkpointd.core.store.content_store import ContentStore
    root, digests, extra = Path(sys.argv[1]), sys.argv[2].split(","), bytes.fromhex(sys.argv[3])
    size = int(next(l for l in open("/proc/self/status") if l.startswith("VmSize")).split()[1]) * 1024
    resource.setrlimit(resource.RLIMIT_AS, (size + (1 << 30), resource.RLIM_INFINITY))
    outcome = {}
    def attempt(name, action):
        try:
            action()
            outcome[name] = "ok"
        except DataLoss as exc:
            outcome[name] = "DataLoss " + str(exc.metadata.get("digest"))
        except BaseException as exc:
            outcome[name] = type(exc).__name__
    store = ContentStore(root)
    for digest in digests:
        attempt(digest, lambda: store.read_bytes(digest))
    def new_version():
        with store.batch() as batch:
            new = batch.put_bytes(extra, digests[-1])
        assert store.read_bytes(new) == extra
    attempt("new version", new_version)
    print(json.dumps(outcome))
""")


def test_versions_over_a_forged_skippable_base_are_data_loss_under_a_memory_limit(tmp_path):
    store = ContentStore(tmp_path)
    versions, digests = _chain(store, 3)
    location = store._committed[digests[0]]
    assert location.kind == b"S"
    store.close()
    _overwrite(_packs(store)[0], location.offset, _SKIPPABLE)
    extra = versions[-1] + b"one more line\n"
    run = subprocess.run([sys.executable, "-c", _UNDER_A_MEMORY_LIMIT, str(tmp_path), ",".join(digests),
                          extra.hex()], capture_output=True, text=True, timeout=60, check=True)
    outcome = json.loads(run.stdout.splitlines()[-1])
    assert outcome == {**{d: f"DataLoss {digests[0]}" for d in digests}, "new version": "ok"}


def test_a_read_in_flight_during_compact_all_still_reads_its_object(tmp_path, monkeypatch):
    monkeypatch.setattr(store_module, "PACK_ROTATE_BYTES", 2000)
    store = ContentStore(tmp_path)
    objects: dict[str, bytes] = {}
    for _ in range(4):
        data = os.urandom(900)
        with store.batch() as batch:
            objects[batch.put_bytes(data)] = data
        aborted = store.batch()
        aborted.put_bytes(os.urandom(900))  # a dead record in the same pack
        aborted.abort()
    assert len([pack for pack, dead in store._dead.items() if dead]) >= 2
    target = min(objects, key=lambda d: store._committed[d].pack.number)
    compacted = []

    def collect() -> None:
        with store.collecting():
            compacted.append(store.compact_all())

    _when_located(store, monkeypatch, target, collect)
    assert store.read_bytes(target) == objects[target]
    assert compacted[0][0] >= 2


def test_a_read_in_flight_while_gc_deletes_its_base_still_reads_its_object(tmp_path, monkeypatch):
    store = ContentStore(tmp_path)
    versions, digests = _chain(store, 2)
    base, live = digests

    def collect() -> None:  # GC deletes the unreferenced base, rewriting the live delta whole first
        with store.collecting():
            store.delete(base)

    _when_located(store, monkeypatch, live, collect)
    assert store.read_bytes(live) == versions[1]
    assert store._committed[live].kind != b"Y" and not store.has(base)


@pytest.mark.parametrize("rank", [0, 1], ids=["damaged-reached-first", "damaged-reached-second"])
def test_a_damaged_dependent_never_lets_a_retried_delete_orphan_its_intact_siblings(tmp_path, rank):
    """Whichever sibling the deletion reaches first: a set's order follows PYTHONHASHSEED, so
    both ranks are tried (one rank alone let a planted bug survive half the runs)."""
    store = ContentStore(tmp_path)
    text = _text()
    with store.batch() as batch:
        base = batch.put_bytes(text)
    versions: dict[str, bytes] = {}
    for i in range(2):
        data = text.replace(b"line %d " % (i * 10), b"edit %d " % i)
        with store.batch() as batch:
            versions[batch.put_bytes(data, base)] = data
    assert all(store._committed[d].kind == b"Y" for d in versions)
    damaged = sorted(versions)[rank]
    intact = next(d for d in versions if d != damaged)
    location = store._committed[damaged]
    _overwrite(location.pack.path, location.offset + location.length - 3, b"\xff\x00\xff")
    for _attempt in range(2):  # GC tries again on its next run
        with contextlib.suppress(DataLoss):
            store.delete(base)
    assert store.read_bytes(intact) == versions[intact]
    assert ContentStore(tmp_path).read_bytes(intact) == versions[intact]


@pytest.mark.parametrize("earlier", [False, True], ids=["only-record", "after-a-whole-record"])
def test_a_torn_delta_dropped_on_open_stays_dropped_on_every_later_open(tmp_path, earlier):
    text = _text()
    version = text + b"one more line\n"
    store = ContentStore(tmp_path)
    with store.batch() as batch:
        base = batch.put_bytes(text)
    if earlier:
        with store.batch() as batch:
            batch.put_bytes(version)  # another batch stored it whole meanwhile
    store.close()
    garbage = zstandard.ZstdCompressor().compress(b"not the delta of anything " * 20)
    with open(_packs(store)[0], "ab") as f:  # written, then the crash: never synced, never committed
        f.write(_record(version, b"Y", bytes.fromhex(base) + bytes([1]) + garbage))
    digest = hashlib.sha256(version).hexdigest()
    after_crash = ContentStore(tmp_path)
    assert after_crash.has(digest) is earlier
    with after_crash.batch() as batch:
        batch.put_bytes(b"the next checkpoint's object " * 5)
    after_crash.close()
    later = ContentStore(tmp_path)
    with later.batch() as batch:  # a capture of that content: acknowledged
        assert batch.put_bytes(version) == digest
    assert later.read_bytes(digest) == version


def test_a_forged_chain_deeper_than_any_the_store_writes_is_data_loss_not_recursion(tmp_path):
    previous = b"version 0 " * 10
    records = [_record(previous, b"R", previous)]
    for i in range(1, 3000):
        current = previous + b" %d" % i
        dictionary = zstandard.ZstdCompressionDict(previous, dict_type=zstandard.DICT_TYPE_RAWCONTENT)
        delta = zstandard.ZstdCompressor(level=1, dict_data=dictionary, write_content_size=True).compress(current)
        records.append(_record(current, b"Y", hashlib.sha256(previous).digest() + bytes([1]) + delta))
        previous = current
    _write_pack(tmp_path, b"".join(records))
    store = ContentStore(tmp_path)
    top = hashlib.sha256(previous).hexdigest()
    with contextlib.suppress(DataLoss):
        assert store.read_bytes(top) == previous


def test_a_forged_zlib_record_is_not_inflated_past_the_packed_size_limit(tmp_path):
    compressor = zlib.compressobj(9)
    bomb = b"".join(compressor.compress(bytes(1 << 20)) for _ in range(64)) + compressor.flush()
    named = b"what the digest names"
    _write_pack(tmp_path, _record(named, b"Z", bomb), magic=b"CKPTPAK1")
    store = ContentStore(tmp_path)
    digest = hashlib.sha256(named).hexdigest()
    with pytest.raises(DataLoss):
        store.read_bytes(digest)
    assert _peak_bytes(lambda: store.read_bytes(digest)) < 8 * COMPRESS_LIMIT


@pytest.mark.parametrize("damage", ["truncated", "flipped"])
def test_a_damaged_legacy_loose_zlib_object_is_data_loss(tmp_path, damage):
    data = b"an object a store from before packs kept loose " * 10
    digest = hashlib.sha256(data).hexdigest()
    path = tmp_path / "objects" / digest[:2] / digest[2:]
    path.parent.mkdir(parents=True)
    packed = zlib.compress(data)
    body = packed[:len(packed) // 2] if damage == "truncated" else packed[:5] + b"\xff" * 10 + packed[15:]
    path.write_bytes(b"Z" + body)
    store = ContentStore(tmp_path)
    with pytest.raises(DataLoss):
        store.read_bytes(digest)


# -- edges that hold (regression guards) ------------------------------------------------


def test_a_chain_at_the_maximum_depth_is_still_decoded_in_one_pass(tmp_path, monkeypatch):
    """The deepest chain the store writes (MAX_DELTA_DEPTH deltas over a zstd base, 17 frames)
    is within ``_zstd_chain``'s bound: no link is decoded on its own, and it reads back."""
    store = ContentStore(tmp_path)
    versions, digests = _chain(store, MAX_DELTA_DEPTH + 1)
    assert store._committed[digests[0]].kind == b"S"
    per_link: list[int] = []
    real = store_module.zstd_decompress
    monkeypatch.setattr(store_module, "zstd_decompress", lambda body, base=None: per_link.append(1)
                        or real(body, base))
    assert store.read_bytes(digests[-1]) == versions[-1]
    assert per_link == []
    with store.batch() as batch:
        beyond = batch.put_bytes(versions[-1] + b"and one more\n", digests[-1])
    assert store._committed[beyond].kind != b"Y"  # the chain is not made any deeper


def test_a_delta_of_exactly_the_packed_size_limit_reads_back_in_one_pass(tmp_path, monkeypatch):
    line = b"compressible line of a large generated file\n"
    first = (line * (COMPRESS_LIMIT // len(line) + 1))[:COMPRESS_LIMIT]
    second = first[:1000] + b"EDITED" + first[1006:]
    store = ContentStore(tmp_path)
    with store.batch() as batch:
        base = batch.put_bytes(first)
    with store.batch() as batch:
        top = batch.put_bytes(second, base)
    assert store._committed[top].kind == b"Y" and len(second) == COMPRESS_LIMIT
    per_link: list[int] = []
    real = store_module.zstd_decompress
    monkeypatch.setattr(store_module, "zstd_decompress", lambda body, base=None: per_link.append(1)
                        or real(body, base))
    assert store.read_bytes(top) == second and per_link == []
    assert ContentStore(tmp_path).read_bytes(top) == second


def test_a_read_in_flight_during_one_compaction_still_reads_its_object(tmp_path, monkeypatch):
    """A compacted pack's fd stays open for reads that found their record in it before."""
    monkeypatch.setattr(store_module, "PACK_ROTATE_BYTES", 2000)
    store = ContentStore(tmp_path)
    data = os.urandom(900)
    with store.batch() as batch:
        target = batch.put_bytes(data)
    aborted = store.batch()
    aborted.put_bytes(os.urandom(900))
    aborted.abort()
    pack = store._committed[target].pack
    while pack is store._active:  # until the next pack is started: the first is then not active
        with store.batch() as batch:
            batch.put_bytes(os.urandom(900))
    assert pack is not store._active

    def collect() -> None:
        with store.collecting():
            store._compact(pack)

    _when_located(store, monkeypatch, target, collect)
    assert store.read_bytes(target) == data
    assert not pack.path.exists() and store._committed[target].pack is not pack


@pytest.mark.parametrize("frame", ["without-content-size", "skippable-small", "trailing-garbage"])
def test_odd_zstd_frames_in_a_delta_read_back_or_are_data_loss(tmp_path, frame):
    """Delta frames this store never writes: one without its content size, a small skippable
    frame (decodes to nothing), a valid frame followed by junk. Never another exception, never
    other bytes."""
    store = ContentStore(tmp_path)
    versions, digests = _chain(store, 3)
    location = store._committed[digests[1]]
    base = store.read_bytes(digests[0])
    dictionary = zstandard.ZstdCompressionDict(base, dict_type=zstandard.DICT_TYPE_RAWCONTENT)
    if frame == "without-content-size":
        body = zstandard.ZstdCompressor(dict_data=dictionary, write_content_size=False).compress(versions[1])
    elif frame == "skippable-small":
        body = struct.pack("<II", 0x184D2A50, 4) + b"abcd"
    else:
        body = zstandard.ZstdCompressor(dict_data=dictionary).compress(versions[1]) + b"\x28\xb5\x2f\xfd junk"
    header = store._packs[0].read(location)[:33]
    record = _record(versions[1], b"Y", header + body)
    store.close()
    with open(_packs(store)[0], "ab") as f:  # a later record of the same object supersedes it
        f.write(record)
    with open(_packs(store)[0], "r+b") as f:  # and is within the durable part: not verified on open
        f.seek(8)
        f.write(os.stat(_packs(store)[0]).st_size.to_bytes(8, "big"))
    reopened = ContentStore(tmp_path)
    for version, digest in zip(versions, digests, strict=True):
        try:
            assert reopened.read_bytes(digest) == version
        except DataLoss as exc:
            assert frame != "trailing-garbage" and exc.metadata["digest"] == digests[1]


def _template(root: Path) -> tuple[dict[str, bytes], bytes]:
    """A store with a zstd chain, a raw chain and lone objects of each kind; its pack's bytes."""
    store = ContentStore(root)
    versions, digests = _chain(store, 5, 80)
    contents = dict(zip(digests, versions, strict=True))
    raw = bytes(range(256)) * 12
    previous = ""
    for i in range(3):
        data = raw[:i * 50] + b"edit" + raw[i * 50 + 4:]
        with store.batch() as batch:
            previous = batch.put_bytes(data, previous)
        contents[previous] = data
    with store.batch() as batch:
        for data in (b"tiny", b"zstd whole object " * 30, b""):
            contents[batch.put_bytes(data)] = data
    store.close()
    [pack] = _packs(store)
    return contents, pack.read_bytes()


@pytest.fixture(scope="module")
def template(tmp_path_factory):
    return _template(tmp_path_factory.mktemp("template"))


@settings(max_examples=50, deadline=None, derandomize=True, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(data=st.data())
def test_damaged_pack_bytes_give_the_stored_bytes_or_data_loss(tmp_path_factory, template, data):
    """Bytes of the pack flipped, overwritten or cut off anywhere (header included): opening the
    store and reading every object gives each object's own bytes or DataLoss, nothing else."""
    contents, pack = template
    damaged = bytearray(pack)
    how = data.draw(st.sampled_from(["flip", "overwrite", "truncate", "skippable-small"]))
    at = data.draw(st.integers(0, len(pack) - 1))
    if how == "flip":
        damaged[at] ^= 1 << data.draw(st.integers(0, 7))
    elif how == "overwrite":
        junk = data.draw(st.binary(min_size=1, max_size=16))
        damaged[at:at + len(junk)] = junk
    elif how == "truncate":
        del damaged[at:]
    else:
        damaged[at:at + 12] = struct.pack("<II", 0x184D2A50, 4) + b"abcd"
    root = tmp_path_factory.mktemp("damaged")
    (root / "packs").mkdir()
    (root / "packs" / "pack-000001.pack").write_bytes(bytes(damaged))
    try:
        store = ContentStore(root)
    except DataLoss:
        return  # the header no longer says "pack"
    try:
        for digest, content in contents.items():
            try:
                got = store.read_bytes(digest)
            except DataLoss:
                continue
            assert got == content
    finally:
        store.close()
