"""RetiredPacks: a pack removed by a compaction stays open while a read that began before its
removal is on, and is closed as soon as none is; reads that began after it never hold it."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from checkpointd.core.store.packs import Pack
from checkpointd.core.store.retired_packs import RetiredPacks


def _pack(tmp_path: Path, number: int) -> Pack:
    path = tmp_path / f"pack-{number:06d}.pack"
    path.write_bytes(b"records of pack %d" % number)
    return Pack(path, number, os.open(path, os.O_RDONLY), 0, 0)


def _is_open(pack: Pack) -> bool:
    try:
        os.fstat(pack.fd)
    except OSError:
        return False
    return os.readlink(f"/proc/self/fd/{pack.fd}") == str(pack.path)


def test_a_pack_is_closed_once_the_reads_begun_before_its_removal_end(tmp_path: Path) -> None:
    retired = RetiredPacks()
    first, second = _pack(tmp_path, 1), _pack(tmp_path, 2)
    with retired.reading():
        retired.retire(first)
        with retired.reading():  # began after the first removal: holds only what is removed later
            retired.retire(second)
            assert _is_open(first) and _is_open(second)
        assert _is_open(first) and _is_open(second), "the outer read began before both removals"
    assert retired.open_count() == 0
    assert not _is_open(first) and not _is_open(second)


def test_a_read_begun_after_a_removal_does_not_keep_the_pack_open(tmp_path: Path) -> None:
    retired = RetiredPacks()
    early = _pack(tmp_path, 1)
    with retired.reading():
        retired.retire(early)
        later = _pack(tmp_path, 2)
        with retired.reading():
            pass
        assert _is_open(early)
    assert not _is_open(early)
    with retired.reading():
        retired.retire(later)
    assert not _is_open(later)


def test_with_no_read_on_a_removed_pack_is_closed_at_once(tmp_path: Path) -> None:
    retired = RetiredPacks()
    pack = _pack(tmp_path, 1)
    retired.retire(pack)
    assert retired.open_count() == 0 and not _is_open(pack)


def test_a_read_that_raises_still_lets_the_pack_go(tmp_path: Path) -> None:
    retired = RetiredPacks()
    pack = _pack(tmp_path, 1)
    with pytest.raises(RuntimeError), retired.reading():
        retired.retire(pack)
        raise RuntimeError("a damaged record")
    assert not _is_open(pack)


def test_close_all_closes_what_reads_still_hold(tmp_path: Path) -> None:
    retired = RetiredPacks()
    pack = _pack(tmp_path, 1)
    with retired.reading():
        retired.retire(pack)
        retired.close_all()
        assert not _is_open(pack)
