"""The stat index's file holds SQLite's signed 64-bit integers. Some file systems give inode
numbers from 2**63 up, and ``touch -d 2300-01-01`` gives an mtime in nanoseconds past 2**63: one
such file must not make SQLite refuse the whole update it is in (every file of a first capture
read again after each restart). The inode number is stored as its two's complement and read back
as itself; an entry whose times cannot be stored is left out (that file alone is read again), and
an older row of its path goes, so it cannot stand in for it."""

from __future__ import annotations

import os

from checkpointd.core.capture.stat_index import Indexed, StatIndex


def _read_back(path, root: str = "/workspace") -> dict[str, Indexed]:
    reopened = StatIndex(path)
    try:
        return reopened.for_root(root).entries
    finally:
        reopened.close()


def test_an_inode_number_from_2_63_up_is_persisted_as_itself(tmp_path):
    path = tmp_path / "stat-index.sqlite"
    entries = {f"big-inode-{n}.txt": Indexed(1, 2, 3, inode, "ab" * 32, 4)
               for n, inode in enumerate((2 ** 63, 2 ** 64 - 5, 2 ** 63 - 1, 0))}
    index = StatIndex(path)
    index.for_root("/workspace").update(entries)
    index.close()
    assert _read_back(path) == entries


def test_a_file_dated_past_2262_is_left_out_and_the_rest_of_its_update_persists(tmp_path):
    future = tmp_path / "future.txt"
    future.write_text("from the future")
    os.utime(future, ns=(10_413_792_000_000_000_000, 10_413_792_000_000_000_000))
    st = os.stat(future)
    assert st.st_mtime_ns >= 2 ** 63
    path = tmp_path / "stat-index.sqlite"
    index = StatIndex(path)
    root = index.for_root("/workspace")
    root.update({"future.txt": Indexed(st.st_size, 10, 20, st.st_ino, "cd" * 32, 30)})
    index.flush()
    assert _read_back(path) == {"future.txt": Indexed(st.st_size, 10, 20, st.st_ino, "cd" * 32, 30)}

    # The file is dated forward; the same update indexes two others.
    dated = Indexed(st.st_size, st.st_mtime_ns, st.st_ctime_ns, st.st_ino, "ef" * 32, 40)
    others = {f"other-{n}.txt": Indexed(n, 50 + n, 60 + n, 70 + n, f"{n:064x}", 80) for n in range(2)}
    root.update({"future.txt": dated, **others})
    assert root.get("future.txt") == dated  # still used while the server runs
    index.close()
    assert _read_back(path) == others
