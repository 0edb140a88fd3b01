"""A directory tree moved (or deleted) out of a watched workspace gives its inotify watches back:
they count against a per-user limit, and one left behind would keep reporting changes made
outside the workspace under the path the tree had inside it. Real watched and full-scan
capturers over one store (``tests/engine/conftest.open_engines``)."""

from __future__ import annotations

import os
import shutil
from pathlib import Path

from checkpointd.core.capture import watcher as watcher_module
from tests.engine.conftest import Engines, write


def _journal(engines: Engines) -> watcher_module.Journal:
    [journal] = [j for j in engines.watcher.journals() if j.root == str(engines.root)]
    return journal


def _tree(root: Path) -> None:
    for top in ("leaving", "deleted", "staying"):
        write(root / top / "a" / "b" / "f.txt", f"{top}\n")
        write(root / top / "g.txt", f"{top} top\n")


def test_a_tree_moved_out_gives_its_watches_back_and_reports_nothing_from_outside(engines, tmp_path):
    _tree(engines.root)
    engines.check(expect="full")
    journal = _journal(engines)
    watched = engines.watcher.watch_count()
    assert {"", "leaving", "leaving/a", "leaving/a/b"} <= set(journal.watches)

    outside = tmp_path / "outside"
    os.rename(engines.root / "leaving", outside)
    engines.check()
    # Its three directories are no longer watched, by the journal nor by the kernel.
    assert not [d for d in journal.watches if d == "leaving" or d.startswith("leaving/")]
    assert engines.watcher.watch_count() == watched - 3

    write(outside / "a" / "b" / "f.txt", "edited outside the workspace\n")
    write(outside / "a" / "new.txt", "made outside the workspace\n")
    assert engines.watcher.sync()
    assert not [p for p in journal.dirty if p == "leaving" or p.startswith("leaving/")], journal.dirty
    engines.check()

    shutil.rmtree(engines.root / "deleted")
    engines.check()
    assert engines.watcher.watch_count() == watched - 6
    # What is left is still watched: an edit deep in it is seen.
    write(engines.root / "staying" / "a" / "b" / "f.txt", "edited after the others left\n")
    engines.check()


def test_a_tree_moved_within_the_workspace_is_watched_under_its_new_path_only(engines):
    _tree(engines.root)
    engines.check(expect="full")
    journal = _journal(engines)
    watched = engines.watcher.watch_count()
    os.rename(engines.root / "leaving", engines.root / "staying" / "moved")
    engines.check()
    assert not [d for d in journal.watches if d == "leaving" or d.startswith("leaving/")]
    assert {"staying/moved", "staying/moved/a", "staying/moved/a/b"} <= set(journal.watches)
    assert engines.watcher.watch_count() == watched
    write(engines.root / "staying" / "moved" / "a" / "b" / "f.txt", "edited where it went\n")
    assert engines.watcher.sync()
    assert "staying/moved/a/b/f.txt" in journal.dirty
    engines.check()
