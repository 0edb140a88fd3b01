"""A stat index entry spares a capture reading a file only while the file's stat is the one it
recorded, every field of it (size, mtime, ctime, inode: a field that differs alone means another
version, or another file, whose content the entry does not hold), and only once the file was last
modified (and its inode last changed) well before it was read: within the racy window, a write in
the same clock tick as that read would leave the stat as it was. A stale entry trusted would have
a checkpoint record the old content. The stats are a real file's, each field then changed alone
(which no file system does on its own, as a write changes several)."""

from __future__ import annotations

import os
import types

import pytest

from checkpointd.core.capture.stat_index import RACY_WINDOW_NS, Indexed

_FIELDS = ("st_size", "st_mtime_ns", "st_ctime_ns", "st_ino")


def _stat(path, **changed) -> types.SimpleNamespace:
    st = os.stat(path)
    return types.SimpleNamespace(**{name: getattr(st, name) for name in _FIELDS} | changed)


def _entry(st, indexed_ns: int) -> Indexed:
    return Indexed(st.st_size, st.st_mtime_ns, st.st_ctime_ns, st.st_ino, "ab" * 32, indexed_ns)


@pytest.fixture
def path(tmp_path):
    path = tmp_path / "file.txt"
    path.write_bytes(b"indexed content\n")
    return path


def test_an_unchanged_file_read_well_after_its_last_change_is_trusted(path):
    st = _stat(path)
    assert _entry(st, st.st_mtime_ns + 10 * RACY_WINDOW_NS).matches(st)


@pytest.mark.parametrize("field", _FIELDS)
def test_a_file_whose_stat_differs_in_any_one_field_is_read_again(path, field):
    st = _stat(path)
    entry = _entry(st, st.st_mtime_ns + 10 * RACY_WINDOW_NS)
    for other in (getattr(st, field) + 1, getattr(st, field) - 1):
        assert not entry.matches(_stat(path, **{field: other})), field


def test_a_file_modified_within_the_racy_window_of_its_reading_is_read_again(path):
    """Up to the window's end (a modification exactly that long before the read included); one
    nanosecond earlier is the first the entry may vouch for."""
    st = _stat(path)
    for read_after in (0, 1, RACY_WINDOW_NS // 2, RACY_WINDOW_NS):
        assert not _entry(st, st.st_mtime_ns + read_after).matches(st), read_after
    assert _entry(st, st.st_mtime_ns + RACY_WINDOW_NS + 1).matches(st)


def test_a_file_dated_after_its_reading_is_read_again(path):
    """An mtime later than the read (a clock set back, a file copied with its future date): the
    entry cannot know the read saw that version."""
    st = _stat(path)
    assert not _entry(st, st.st_mtime_ns - RACY_WINDOW_NS).matches(st)
    assert not _entry(st, st.st_mtime_ns - 10 * RACY_WINDOW_NS).matches(st)


def test_a_file_whose_mtime_was_set_back_is_read_again_within_the_racy_window_of_its_ctime(path):
    """A tool that writes a file and then sets its mtime back (cp -p, tar, rsync -t) leaves an old
    mtime on content changed just now: the inode's change time is the one the window counts from."""
    os.utime(path, ns=(1_000_000_000, 1_000_000_000))
    st = _stat(path)
    assert st.st_ctime_ns - st.st_mtime_ns > 10 * RACY_WINDOW_NS
    for read_after in (0, RACY_WINDOW_NS // 2, RACY_WINDOW_NS):
        assert not _entry(st, st.st_ctime_ns + read_after).matches(st), read_after
    assert _entry(st, st.st_ctime_ns + RACY_WINDOW_NS + 1).matches(st)
