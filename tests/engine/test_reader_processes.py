"""Reader processes (``readers``): a large scan hands its file reads to them. What it stores
must be exactly what an in-process scan stores, whatever the files are, and a reader that
dies (or a server killed -9 mid-scan) must leave neither a wrong tree, nor a checkpoint
referencing something not durable, nor a stray process."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest

from checkpointd.core.capture.readers import Readers
from checkpointd.core.capture.snapshot import SKIP_TOO_LARGE, Snapshotter, disk_rules
from checkpointd.core.capture.stat_index import StatIndex
from checkpointd.core.store.content_store import ContentStore
from checkpointd.core.store.tree import EntryKind, Trees
from checkpointd.core.workspace import readworker
from checkpointd.core.workspace.workspace import Workspace
from tests.engine.conftest import write

SERVICE = Path(__file__).resolve().parents[2] / "service"


def populate(root: Path, dirs: int = 12, files: int = 20) -> None:
    rng = __import__("random").Random(7)
    for d in range(dirs):
        for f in range(files):
            if f % 5 == 0:
                data = rng.randbytes(rng.randint(0, 6000))
            else:
                data = (f"line {d} {f} " * rng.randint(0, 400)).encode()
            write(root / f"d{d}" / ("sub" if f % 3 else "") / f"f{f}.txt", data)
    write(root / "same1.txt", "duplicate content\n" * 50)
    write(root / "d0" / "same2.txt", "duplicate content\n" * 50)
    write(root / "empty", b"")
    write(root / "big.bin", os.urandom(readworker.COMPRESS_LIMIT + 4096))
    write(root / "huge.bin", b"x" * 300_000)
    # Walked once the readers run, unstated: the readers find these too large for them.
    write(root / "d9" / "zz-big.bin", os.urandom(readworker.COMPRESS_LIMIT + 4096))
    write(root / "d9" / "zz-huge.bin", b"y" * 300_000)
    write(root / "skip.log", "ignored\n")
    write(root / ".gitignore", "*.log\n")
    write(root / "d1" / ".gitignore", "f1*.txt\n!f10.txt\n")
    write(root / "mode.sh", "#!/bin/sh\n", mode=0o755)
    os.symlink("d0/f1.txt", root / "link")
    os.mkfifo(root / "fifo")
    (root / os.fsdecode(b"caf\xe9-latin1.txt")).write_bytes(b"a name that is not UTF-8\n" * 10)


def scan(store: ContentStore, root: Path, snapshotter: Snapshotter, max_size: int = 250_000, on_dir=None):
    workspace = Workspace(str(root))
    with store.batch() as batch:
        result = snapshotter.capture(workspace, disk_rules(workspace, [], []), max_size, batch, on_dir)
    return result


def contents(store: ContentStore, trees: Trees, tree: str) -> dict[str, tuple]:
    out = {}
    for path, entry in trees.flatten(tree):
        data = store.read_bytes(entry.digest) if entry.kind is EntryKind.FILE else b""
        out[path] = (entry.kind, entry.mode, entry.size, entry.digest, entry.target, data)
    return out


@pytest.fixture
def reference(tmp_path):
    """The workspace, and what an in-process scan (no reader processes) captures of it."""
    root = tmp_path / "ws"
    populate(root)
    store = ContentStore(tmp_path / "ref-store")
    trees = Trees(store)
    result = scan(store, root, Snapshotter(store, trees, StatIndex(), reader_processes=0))
    return root, result, contents(store, trees, result.tree)


def readers_snapshotter(store: ContentStore, processes: int = 2) -> Snapshotter:
    return Snapshotter(store, Trees(store), StatIndex(), reader_processes=processes, readers_min_files=1)


def scan_with_readers(store: ContentStore, root: Path):
    """A scan by reader processes (which must have been used), which are stopped afterwards."""
    snapshotter = readers_snapshotter(store)
    try:
        result = scan(store, root, snapshotter)
        assert snapshotter.readers.pids(), "the readers were not used"
    finally:
        snapshotter.close()
    return result


def test_a_scan_with_reader_processes_stores_what_an_in_process_scan_stores(tmp_path, reference):
    root, expected, expected_contents = reference
    store = ContentStore(tmp_path / "store")
    result = scan_with_readers(store, root)
    assert (result.tree, result.file_count, result.total_size, result.skipped) == (
        expected.tree, expected.file_count, expected.total_size, expected.skipped)
    assert any(s.reason == SKIP_TOO_LARGE for s in result.skipped)
    # Durable and indexed as any other write: a reopened store has every object.
    reopened = ContentStore(tmp_path / "store")
    assert contents(reopened, Trees(reopened), result.tree) == expected_contents


def test_reused_content_is_not_written_twice(tmp_path, reference):
    root, expected, _ = reference
    store = ContentStore(tmp_path / "store")
    first = readers_snapshotter(store)
    second = readers_snapshotter(store)
    try:
        scan(store, root, first)
        size = sum(p.stat().st_size for p in store.packs_dir.iterdir())
        # Another workspace's scan (its own stat index) of the same content writes no file again.
        assert scan(store, root, second).tree == expected.tree
    finally:
        first.close()
        second.close()
    grown = sum(p.stat().st_size for p in store.packs_dir.iterdir()) - size
    assert grown < 4096, f"{grown} bytes written for content already stored"


def test_a_reader_killed_mid_scan_leaves_the_same_tree(tmp_path, reference):
    root, expected, expected_contents = reference
    store = ContentStore(tmp_path / "store")
    snapshotter = readers_snapshotter(store)
    seen = []

    def kill_readers(directory: str, fd: int) -> None:
        seen.append(directory)
        if len(seen) == 6:
            for pid in snapshotter.readers.pids():
                os.kill(pid, signal.SIGKILL)

    try:
        result = scan(store, root, snapshotter, on_dir=kill_readers)
        assert (result.tree, result.file_count, result.total_size, result.skipped) == (
            expected.tree, expected.file_count, expected.total_size, expected.skipped)
        # The next large scan starts new readers.
        assert scan(store, root, snapshotter).tree == expected.tree
        assert snapshotter.readers.pids()
    finally:
        snapshotter.close()
    reopened = ContentStore(tmp_path / "store")
    assert contents(reopened, Trees(reopened), result.tree) == expected_contents


def test_a_reader_answering_nonsense_is_dropped_and_its_tasks_read_in_the_server(tmp_path, reference,
                                                                                 monkeypatch):
    root, expected, _ = reference
    fake = tmp_path / "fake_reader.py"
    fake.write_text(textwrap.dedent("""
        import os, socket, sys
        tasks = socket.socket(fileno=int(sys.argv[1]))
        message, fds, _, _ = socket.recv_fds(tasks, 1 << 16, 1)
        os.write(int(sys.argv[2]), b"\\0\\0\\0\\5junk!")
        while tasks.recv(1 << 16):
            pass
    """))
    monkeypatch.setattr(readworker, "__file__", str(fake))
    store = ContentStore(tmp_path / "store")
    snapshotter = readers_snapshotter(store, processes=1)
    try:
        result = scan(store, root, snapshotter)
    finally:
        snapshotter.close()
    assert (result.tree, result.file_count, result.skipped) == (expected.tree, expected.file_count, expected.skipped)


def test_small_scans_start_no_process(tmp_path):
    root = tmp_path / "ws"
    populate(root, dirs=2, files=5)
    store = ContentStore(tmp_path / "store")
    snapshotter = Snapshotter(store, Trees(store), StatIndex(), reader_processes=2)
    try:
        scan(store, root, snapshotter)
        assert snapshotter.readers.pids() == []
    finally:
        snapshotter.close()


def test_idle_readers_stop(tmp_path):
    root = tmp_path / "ws"
    populate(root, dirs=2, files=5)
    store = ContentStore(tmp_path / "store")
    snapshotter = readers_snapshotter(store)
    snapshotter.readers.idle_seconds = 0.2
    try:
        scan(store, root, snapshotter)
        pids = snapshotter.readers.pids()
        assert pids
        deadline = time.monotonic() + 10
        while snapshotter.readers.pids() and time.monotonic() < deadline:
            time.sleep(0.05)
        assert snapshotter.readers.pids() == []
        while any(_running(pid) for pid in pids) and time.monotonic() < deadline:
            time.sleep(0.05)
        assert not any(_running(pid) for pid in pids)
    finally:
        snapshotter.close()


def _running(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] != "Z"
    except FileNotFoundError:
        return False


def test_a_server_killed_mid_scan_leaves_no_reader_and_a_consistent_store(tmp_path):
    """kill -9 of the server during a scan with readers: they exit, nothing was committed,
    and the store reopens with only whole, correct objects."""
    root = tmp_path / "ws"
    populate(root, dirs=30, files=30)
    pids_file = tmp_path / "pids"
    program = textwrap.dedent(f"""
        import os, signal, sys
        sys.path.insert(0, {str(SERVICE)!r})
        from checkpointd.core.capture.stat_index import StatIndex
        from checkpointd.core.capture.snapshot import Snapshotter, disk_rules
        from checkpointd.core.store.content_store import ContentStore
        from checkpointd.core.store.tree import Trees
        from checkpointd.core.workspace.workspace import Workspace
        store = ContentStore(__import__("pathlib").Path({str(tmp_path / "store")!r}))
        snap = Snapshotter(store, Trees(store), StatIndex(), reader_processes=2, readers_min_files=1)
        seen = []
        def on_dir(directory, fd):
            seen.append(directory)
            if len(seen) == 20:
                open({str(pids_file)!r}, "w").write(" ".join(map(str, snap.readers.pids())))
                os.kill(os.getpid(), signal.SIGKILL)
        ws = Workspace({str(root)!r})
        with store.batch() as batch:
            snap.capture(ws, disk_rules(ws, [], []), 1 << 30, batch, on_dir)
    """)
    process = subprocess.run([sys.executable, "-c", program], timeout=120)
    assert process.returncode == -signal.SIGKILL
    pids = [int(p) for p in pids_file.read_text().split()]
    assert pids
    deadline = time.monotonic() + 10
    while any(_running(pid) for pid in pids) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert not any(_running(pid) for pid in pids), "a reader outlived the server"
    store = ContentStore(tmp_path / "store")
    for digest in store.iter_digests():
        assert store.read_bytes(digest)  # verified against its digest


def test_readers_can_be_closed_while_idle_and_refuse_work_after(tmp_path):
    readers = Readers(1, lambda fd, names, batch, max_size: [None for _ in names])
    assert readers.start()
    readers.close()
    assert not readers.start()
    assert readers.pids() == []


def test_a_scan_that_fails_writes_nothing_once_it_has_returned(tmp_path, reference):
    root, _, _ = reference
    store = ContentStore(tmp_path / "store")
    snapshotter = readers_snapshotter(store)
    seen = []

    def fail(directory: str, fd: int) -> None:
        seen.append(directory)
        if len(seen) == 8:
            raise RuntimeError("the scan stops here")

    try:
        with pytest.raises(RuntimeError):
            scan(store, root, snapshotter, on_dir=fail)
        size = sum(p.stat().st_size for p in store.packs_dir.iterdir())
        time.sleep(0.3)  # a window, not a wait for an event: a write still on its way would land in it
        assert sum(p.stat().st_size for p in store.packs_dir.iterdir()) == size
        assert not store._staged and not snapshotter.readers.answered
        assert not any(reader.in_flight for reader in snapshotter.readers._readers)
    finally:
        snapshotter.close()


def test_a_reader_gives_up_on_a_file_that_grows_past_what_it_handles(tmp_path):
    path = tmp_path / "growing"
    path.write_bytes(b"z" * (readworker.COMPRESS_LIMIT + 10))
    fd = os.open(path, os.O_RDONLY)
    try:
        assert readworker._read_bounded(fd, 100) is None
        os.lseek(fd, 0, os.SEEK_SET)
        assert readworker._read_bounded(fd, readworker.COMPRESS_LIMIT + 10) == b"z" * (readworker.COMPRESS_LIMIT + 10)
    finally:
        os.close(fd)
    path.write_bytes(b"short")
    fd = os.open(path, os.O_RDONLY)
    try:
        assert readworker._read_bounded(fd, 2) == b"short"
    finally:
        os.close(fd)


def _mutate(root: Path, rng) -> None:
    files = sorted(p for p in root.rglob("*") if p.is_file() and not p.is_symlink())
    for path in rng.sample(files, 5):
        with open(path, "ab") as f:
            f.write(rng.randbytes(rng.randint(1, 3000)) if rng.random() < 0.3 else b"more text\n" * rng.randint(1, 50))
    for path in rng.sample(files, 2):
        path.unlink()
    for _ in range(6):
        write(root / f"d{rng.randrange(14)}" / f"new{rng.randrange(10_000)}.txt", "fresh\n" * rng.randint(0, 90))
    chosen = root / f"d{rng.randrange(12)}"
    if rng.random() < 0.5:
        write(chosen / ".gitignore", rng.choice(["f2*.txt\n", "sub/\n", "*.txt\n!f1.txt\n", ""]))
    target = rng.choice(files)
    if target.exists():
        os.chmod(target, rng.choice([0o644, 0o755, 0o600]))


def test_repeated_scans_with_readers_match_scans_without(tmp_path):
    """The stat index, new files, changed .gitignore files: scans that use reader processes
    (and skip the stat of unindexed files) capture what in-process scans capture."""
    rng = __import__("random").Random(3)
    root = tmp_path / "ws"
    populate(root, dirs=12, files=12)
    store = ContentStore(tmp_path / "store")
    trees = Trees(store)
    index = StatIndex(tmp_path / "index.sqlite")
    with_readers = Snapshotter(store, trees, index, reader_processes=2, readers_min_files=1)
    without = Snapshotter(store, trees, StatIndex(), reader_processes=0)
    try:
        for _ in range(6):
            a = scan(store, root, with_readers)
            b = scan(store, root, without)
            assert (a.tree, a.file_count, a.total_size, a.skipped) == (b.tree, b.file_count, b.total_size, b.skipped)
            _mutate(root, rng)
    finally:
        with_readers.close()
        index.close()


def test_a_full_disk_while_readers_run_fails_the_scan_cleanly(tmp_path, reference, monkeypatch):
    import errno

    from checkpointd.core.kernel.errors import ResourceExhausted
    from checkpointd.core.store import content_store as store_module

    root, expected, _ = reference
    store = ContentStore(tmp_path / "store")
    snapshotter = readers_snapshotter(store)
    real_pwrite = os.pwrite
    writes = []

    def filling(fd, data, offset):
        writes.append(len(data))
        if len(writes) > 6:
            real_pwrite(fd, data[: len(data) // 2], offset)
            raise OSError(errno.ENOSPC, "No space left on device")
        return real_pwrite(fd, data, offset)

    try:
        monkeypatch.setattr(store_module.os, "pwrite", filling)
        with pytest.raises(ResourceExhausted):
            scan(store, root, snapshotter)
        monkeypatch.undo()
        assert not store._staged
        # Space is back: the same snapshotter (and its readers) captures everything.
        result = scan(store, root, snapshotter)
        assert result.tree == expected.tree
    finally:
        snapshotter.close()
    reopened = ContentStore(tmp_path / "store")
    trees = Trees(reopened)
    for _, entry in trees.flatten(result.tree):
        if entry.kind is EntryKind.FILE:
            reopened.read_bytes(entry.digest)


def test_a_directory_larger_than_the_read_ahead_window_is_read_whole_and_leaks_no_descriptor(tmp_path):
    """A task is opened and read ``READ_AHEAD`` files at a time: every kind of entry across
    several windows comes out as an in-process scan has it, and no file stays open."""
    root = tmp_path / "ws"
    rng = __import__("random").Random(11)
    for index in range(readworker.READ_AHEAD * 3 + 5):
        name = root / "wide" / f"e{index:03d}"
        match index % 7:
            case 0:
                os.makedirs(root / "wide", exist_ok=True)
                os.symlink(f"e{index + 1:03d}", name)
            case 1:
                os.makedirs(root / "wide", exist_ok=True)
                os.mkfifo(name)
            case 2:
                write(name, b"z" * 300_000)
            case 3:
                write(name / "inner.txt", f"inside {index}\n")
            case 4:
                write(name, b"")
            case _:
                write(name, rng.randbytes(rng.randint(1, 5000)))
    store = ContentStore(tmp_path / "ref-store")
    trees = Trees(store)
    expected = scan(store, root, Snapshotter(store, trees, StatIndex(), reader_processes=0))
    expected_contents = contents(store, trees, expected.tree)

    store = ContentStore(tmp_path / "store")
    snapshotter = readers_snapshotter(store, processes=1)
    try:
        result = scan(store, root, snapshotter)
        pids = snapshotter.readers.pids()
        assert pids, "the readers were not used"
        open_files = [os.readlink(f"/proc/{pid}/fd/{fd}") for pid in pids for fd in os.listdir(f"/proc/{pid}/fd")]
        assert not [path for path in open_files if str(root) in path], open_files
    finally:
        snapshotter.close()
    assert (result.tree, result.file_count, result.total_size, result.skipped) == (
        expected.tree, expected.file_count, expected.total_size, expected.skipped)
    assert contents(store, Trees(store), result.tree) == expected_contents



def test_readers_pack_with_zstd_in_their_isolated_interpreter(tmp_path, monkeypatch):
    """A reader runs as ``python -I -S`` and is told where the server's zstandard is: were it not,
    it could not pack at all, and every file would be read by the server instead."""
    from checkpointd.core.capture import snapshot as snapshot_module

    read_in_server = []
    original = snapshot_module._read_unstated
    monkeypatch.setattr(snapshot_module, "_read_unstated",
                        lambda *args, **kwargs: read_in_server.append(args[1]) or original(*args, **kwargs))
    root = tmp_path / "ws"
    for i in range(60):
        write(root / f"d{i % 3}" / f"f{i}.py", f"print('file {i}')\n" * 80)
    store = ContentStore(tmp_path / "store")
    result = scan_with_readers(store, root)
    assert result.file_count == 60 and read_in_server == []
    files = [entry for _, entry in Trees(store).flatten(result.tree) if entry.kind is EntryKind.FILE]
    assert {store._committed[entry.digest].kind for entry in files} == {readworker.ZSTD}
