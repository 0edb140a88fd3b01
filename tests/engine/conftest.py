"""Engine fixtures: a content store with a watched capturer and a full-scan capturer side by
side, so every watched (incremental) capture can be checked against a full scan of the
same workspace at the same moment; and the same check through real servers (see ``live``)."""

from __future__ import annotations

import contextlib
import os
import tempfile
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from checkpointd.core.capture import watcher as watcher_module
from checkpointd.core.capture.capturer import Capturer
from checkpointd.core.capture.snapshot import CaptureResult, Snapshotter
from checkpointd.core.capture.stat_index import StatIndex
from checkpointd.core.capture.watcher import Watcher
from checkpointd.core.store.content_store import ContentStore
from checkpointd.core.store.tree import Trees
from checkpointd.core.workspace.workspace import Workspace
from tests.conftest import PostgresDatabases, RunningServer
from tests.engine.live import NamespacedServer, Session, serve


@dataclass
class Engines:
    store: ContentStore
    trees: Trees
    watched: Capturer
    full: Capturer
    watcher: Watcher
    root: Path
    patterns: list[str]
    max_size: int = 1 << 30

    def capture(self, capturer: Capturer, patterns: list[str] | None = None) -> CaptureResult:
        """A capture, committed and recorded as a checkpoint would be (see ``Capturer.record``)."""
        with self.store.batch() as batch:
            result = capturer.capture(Workspace(str(self.root)), self.patterns if patterns is None else patterns,
                                      [], self.max_size, batch)
        capturer.record(str(self.root), result.tree)
        return result

    def check(self, expect: str = "incremental") -> CaptureResult:
        """A watched capture, compared with a full scan; ``expect`` says which kind of capture
        the watched one must have been ("incremental", "full", or "any")."""
        before = dict(self.watched.counts)
        watched = self.capture(self.watched)
        reference = self.capture(self.full)
        moved = {k: self.watched.counts[k] - before[k] for k in before if self.watched.counts[k] != before[k]}
        assert list(moved.values()) == [1], f"one capture counted once: {moved}"
        [kind] = moved
        assert (watched.tree, watched.file_count, watched.total_size, watched.skipped) == (
            reference.tree, reference.file_count, reference.total_size, reference.skipped), (
            f"{kind} capture differs from a full scan: "
            f"{describe(self.trees, reference.tree, watched.tree)}")
        if expect != "any":
            assert kind == expect, f"expected an {expect} capture, got {kind}"
        return watched


def describe(trees: Trees, expected: str, actual: str) -> str:
    return "; ".join(f"{c.path}: full scan {c.base} vs watched {c.target}"
                     for c in list(trees.diff(expected, actual))[:10]) or "same tree, other totals"


@contextlib.contextmanager
def open_engines(base: Path) -> Iterator[Engines]:
    """A watched capturer and a full-scan one over one store in ``base``, on a new workspace
    ``base``/ws."""
    store = ContentStore(base / "store")
    trees = Trees(store)
    watcher = Watcher()
    watched = Capturer(Snapshotter(store, trees, StatIndex(base / "index.sqlite")), trees, watcher)
    full = Capturer(Snapshotter(store, trees, StatIndex()), trees, None)
    root = base / "ws"
    root.mkdir()
    try:
        yield Engines(store, trees, watched, full, watcher, root, [])
    finally:
        watched.close()
        watcher.close()
        watched.snapshotter.close()
        full.snapshotter.close()


@pytest.fixture
def engines(tmp_path: Path) -> Iterator[Engines]:
    if not watcher_module.available():
        pytest.fail("inotify_simple is not installed: the watcher cannot run (see pyproject dependencies)")
    with open_engines(tmp_path) as opened:
        yield opened


def write(path: Path, text: str | bytes, mode: int | None = None) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    data = text.encode() if isinstance(text, str) else text
    path.write_bytes(data)
    if mode is not None:
        os.chmod(path, mode)


@pytest.fixture(params=["on", "off"])
def live_server(request, short_tmp: Path, suite_databases: PostgresDatabases | None) -> Iterator[RunningServer]:
    """A real server with the watcher on, then off (see ``live``)."""
    yield from serve(Path(tempfile.mkdtemp(prefix="u-", dir=short_tmp)), suite_databases, request.param)


@pytest.fixture
def live(live_server: RunningServer, tmp_path: Path) -> Iterator[Session]:
    """A plan on a new workspace of ``live_server``, each checkpoint checked against a full scan."""
    opened = Session(live_server, live_server.new_workspace(), tmp_path)
    yield opened
    opened.close()


@pytest.fixture(params=["on", "off"])
def namespaced_server(request, short_tmp: Path,
                      suite_databases: PostgresDatabases | None) -> Iterator[NamespacedServer]:
    """Like ``live_server``, in a mount namespace of its own (see ``live.NamespacedServer``)."""
    yield from serve(Path(tempfile.mkdtemp(prefix="m-", dir=short_tmp)), suite_databases, request.param,
                     NamespacedServer)
