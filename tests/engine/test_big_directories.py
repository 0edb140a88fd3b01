"""A directory large enough to be stored split (see ``tree.SPLIT_ENTRIES``) is captured exactly:
names created, deleted, renamed (within it, in and out of it), modes changed, hard links,
the directory shrinking back under the threshold and growing past it again; with the watcher
(each watched capture against a full scan), and through real servers with the watcher on and
off, where every checkpoint must equal a full scan and restore byte for byte, also after
writes made while the server was down."""

from __future__ import annotations

import os
from pathlib import Path

from checkpointd.core.store import tree as tree_module
from checkpointd.core.store.tree import SPLIT_ENTRIES
from tests.engine.conftest import Engines, write
from tests.engine.live import Session
from tests.helpers import tree_state

ENTRIES = SPLIT_ENTRIES + 600


def _fill(directory: Path, count: int = ENTRIES) -> None:
    directory.mkdir(parents=True, exist_ok=True)
    for i in range(count):
        (directory / f"entry_{i:06d}.txt").write_text(f"entry {i}\n")


def _is_split(engines: Engines, tree: str, path: str) -> bool:
    return bool(engines.trees.parts(engines.trees.lookup(tree, path).digest))


def test_edits_in_a_split_directory_match_full_scans(engines: Engines) -> None:
    big = engines.root / "big"
    _fill(big)
    write(engines.root / "other/keep.txt", "keep\n")
    result = engines.check(expect="full")
    assert _is_split(engines, result.tree, "big")
    write(big / "entry_000100.txt", "changed\n")
    engines.check()
    # A name that ends a part comes, one that ended a part goes: the parts are cut anew.
    ends = next(name for name in (f"new_{i}.txt" for i in range(100_000)) if tree_module._ends_part(name))
    write(big / ends, "ends a part\n")
    (big / next(name for name in sorted(os.listdir(big)) if tree_module._ends_part(name) and name != ends)).unlink()
    engines.check()
    write(big / "aaa_before_every_name.txt", "first\n")
    write(big / "zzz_after_every_name.txt", "last\n")
    (big / "entry_000000.txt").unlink()
    engines.check()
    os.rename(big / "entry_000200.txt", big / "entry_000200.renamed")
    os.rename(big / "entry_000300.txt", engines.root / "other/moved-out.txt")
    os.rename(engines.root / "other/keep.txt", big / "moved-in.txt")
    os.chmod(big / "entry_000400.txt", 0o600)
    os.symlink("entry_000401.txt", big / "a-link")
    (big / "sub").mkdir()
    write(big / "sub/inner.txt", "inner\n")
    engines.check()
    for i in range(500, 1500):
        (big / f"entry_{i:06d}.txt").unlink()
    result = engines.check()
    assert not _is_split(engines, result.tree, "big"), "the directory shrank under the threshold"
    _fill(big, ENTRIES)
    result = engines.check()
    assert _is_split(engines, result.tree, "big")
    # Every entry again, and new_*, aaa, zzz, moved-in, entry_000200.renamed, a-link, sub/inner, other/moved-out.
    assert result.file_count == ENTRIES + 8
    os.rename(big, engines.root / "renamed-big")
    engines.check()


def test_hard_links_in_a_split_directory(engines: Engines) -> None:
    big = engines.root / "big"
    _fill(big)
    engines.check(expect="full")
    os.link(big / "entry_000010.txt", big / "second-name.txt")
    engines.check(expect="any")
    with open(big / "second-name.txt", "r+b") as f:
        f.write(b"written through the second name\n")
    engines.check()
    with open(big / "entry_000010.txt", "r+b") as f:
        f.write(b"and through the first\n")
    engines.check()
    (big / "second-name.txt").unlink()
    engines.check()


def test_checkpoints_of_a_split_directory_restore_byte_for_byte(live: Session) -> None:
    big = live.root / "big"
    _fill(big)
    first = live.checkpoint()
    first_state = tree_state(live.root)
    write(big / "entry_000005.txt", "changed\n")
    write(big / "new.txt", "new\n")
    (big / "entry_000006.txt").unlink()
    os.rename(big / "entry_000007.txt", big / "zz_renamed.txt")
    os.link(big / "entry_000008.txt", big / "zz_linked.txt")
    second = live.checkpoint()
    second_state = tree_state(live.root)
    live.rollback(first)
    assert tree_state(live.root) == first_state
    live.rollback(second)
    assert tree_state(live.root) == second_state


def test_writes_to_a_split_directory_while_the_server_is_down(live: Session) -> None:
    big = live.root / "big"
    _fill(big)
    first = live.checkpoint()
    first_state = tree_state(live.root)
    live.server.stop()
    write(big / "entry_000050.txt", "written while the server was down\n")
    (big / "entry_000051.txt").unlink()
    write(big / "created-while-down.txt", "new\n")
    live.server.start()
    second = live.checkpoint()
    second_state = tree_state(live.root)
    assert second_state["big/entry_000050.txt"][1] == b"written while the server was down\n"
    write(big / "entry_000052.txt", "after the restart\n")
    live.checkpoint()
    live.rollback(first)
    assert tree_state(live.root) == first_state
    live.rollback(second)
    assert tree_state(live.root) == second_state
