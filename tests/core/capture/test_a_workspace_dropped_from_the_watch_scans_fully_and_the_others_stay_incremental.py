"""The watcher bounds what it holds: at most ``max_roots`` workspaces, and at most its watch budget
of inotify watches. Past either, it drops the least recently captured workspace (which then
scans in full, as it missed what happened meanwhile), and only as many as it must: the others
stay watched and incremental. Real watched and full-scan capturers over one store
(``tests/engine/conftest.open_engines``), with a watcher of small bounds."""

from __future__ import annotations

import contextlib
import dataclasses
from collections.abc import Iterator
from pathlib import Path

from checkpointd.core.capture.capturer import Capturer
from checkpointd.core.capture.snapshot import Snapshotter
from checkpointd.core.capture.stat_index import StatIndex
from checkpointd.core.capture.watcher import Watcher
from tests.engine.conftest import Engines, write


@contextlib.contextmanager
def _workspaces(engines: Engines, tmp_path: Path, subdirs: dict[str, int],
                **bounds: int) -> Iterator[dict[str, Engines]]:
    """One workspace per name of ``subdirs``, with that many directories under its root, all
    captured through one capturer using one watcher of ``bounds``."""
    watcher = Watcher(**bounds)
    watched = Capturer(Snapshotter(engines.store, engines.trees, StatIndex()), engines.trees, watcher)
    spaces = {}
    for name, count in subdirs.items():
        root = tmp_path / name
        write(root / "top.txt", f"{name}\n")
        for i in range(count):
            write(root / f"d{i}" / "f.txt", f"{name} {i}\n")
        spaces[name] = dataclasses.replace(engines, root=root, watched=watched, watcher=watcher)
    try:
        yield spaces
    finally:
        watched.close()
        watcher.close()
        watched.snapshotter.close()


def _edit_and_check(space: Engines, expect: str) -> None:
    write(space.root / "top.txt", f"edited, then captured ({expect})\n")
    space.check(expect=expect)


def test_past_the_workspace_limit_only_the_least_recently_captured_is_dropped(engines, tmp_path):
    with _workspaces(engines, tmp_path, {"a": 1, "b": 1, "c": 1}, max_roots=2) as spaces:
        watcher = spaces["a"].watcher
        spaces["a"].check(expect="full")
        spaces["b"].check(expect="full")
        _edit_and_check(spaces["a"], "incremental")  # "b" is now the one captured least recently
        spaces["c"].check(expect="full")
        assert sorted(Path(j.root).name for j in watcher.journals()) == ["a", "c"]
        _edit_and_check(spaces["a"], "incremental")
        _edit_and_check(spaces["c"], "incremental")
        _edit_and_check(spaces["b"], "full")  # watched again: "a" goes
        _edit_and_check(spaces["c"], "incremental")
        _edit_and_check(spaces["b"], "incremental")
        _edit_and_check(spaces["a"], "full")
        assert watcher.watch_count() == 4


def test_past_the_watch_budget_only_as_many_workspaces_as_needed_are_dropped(engines, tmp_path):
    # "a" and "b" take one watch each (their roots), "c" two: the last watch "c" needs is past
    # the budget of three, and dropping "a" frees enough.
    with _workspaces(engines, tmp_path, {"a": 0, "b": 0, "c": 1}, watch_budget=3) as spaces:
        watcher = spaces["a"].watcher
        for name in ("a", "b", "c"):
            spaces[name].check(expect="full")
        assert sorted(Path(j.root).name for j in watcher.journals()) == ["b", "c"]
        assert watcher.watch_count() == 3
        _edit_and_check(spaces["b"], "incremental")
        _edit_and_check(spaces["c"], "incremental")
        write(spaces["c"].root / "d0" / "f.txt", "edited under the watch the budget had to make room for\n")
        spaces["c"].check()
        _edit_and_check(spaces["a"], "full")
        _edit_and_check(spaces["c"], "incremental")
        _edit_and_check(spaces["b"], "full")
        assert watcher.watch_count() <= 3


def test_the_default_watch_budget_leaves_half_the_users_inotify_watches_to_other_programs():
    """The inotify watch limit is per user: the server's editor, its language servers and other
    watchers of the same user need watches too."""
    limit = int(Path("/proc/sys/fs/inotify/max_user_watches").read_text())
    watcher = Watcher()
    try:
        assert 1024 <= watcher._budget <= max(1024, limit // 2)
    finally:
        watcher.close()
