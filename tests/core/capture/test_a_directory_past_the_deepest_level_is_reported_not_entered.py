"""A full scan enters directories down to ``MAX_DIR_DEPTH`` levels below the root, and reports
the first one deeper as skipped (``TOO_DEEP``) without entering it: trees, diffs and restores
recurse once per level. The deepest level entered is captured whole."""

from __future__ import annotations

from pathlib import Path

from checkpointd.core.capture.snapshot import MAX_DIR_DEPTH, SKIP_TOO_DEEP
from checkpointd.core.store.tree import EntryKind
from tests.core.capture.full_scan import full_scan
from tests.engine.conftest import write


def test_the_deepest_level_is_captured_and_the_next_is_reported_too_deep(tmp_path: Path) -> None:
    root = tmp_path / "ws"
    deepest = "/".join(["d"] * MAX_DIR_DEPTH)  # MAX_DIR_DEPTH - 1 slashes: entered
    write(root / deepest / "kept.txt", "deepest level\n")
    write(root / deepest / "d" / "lost.txt", "one level too deep\n")
    store, trees, result = full_scan(tmp_path / "store", root)
    assert [(s.path, s.size, s.reason) for s in result.skipped] == [(f"{deepest}/d", 0, SKIP_TOO_DEEP)]
    files = {p: store.read_bytes(e.digest) for p, e in trees.flatten(result.tree) if e.kind is EntryKind.FILE}
    assert files == {f"{deepest}/kept.txt": b"deepest level\n"}
