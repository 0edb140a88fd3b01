"""A full scan given up on (the caller cancelled, or its deadline passed) stops within
``CHECK_EVERY`` entries, even inside one directory of thousands: the token is checked every
``CHECK_EVERY`` entries of a listing, not only as each directory begins (a workspace whose one
directory holds a million entries would otherwise keep a thread and the plan's lock for the whole
listing after its caller left). The entries are ignored by a pattern, so nothing else (a file's
read) checks the token; it is set once the scan has gone past the first ``CHECK_EVERY``."""

from __future__ import annotations

from pathlib import Path

import pytest

from checkpointd.core.capture.snapshot import Snapshotter, disk_rules
from checkpointd.core.capture.stat_index import StatIndex
from checkpointd.core.kernel.cancellation import CHECK_EVERY, Cancellation
from checkpointd.core.kernel.errors import Cancelled
from checkpointd.core.store.content_store import ContentStore
from checkpointd.core.store.tree import Trees
from checkpointd.core.workspace.workspace import Workspace


def test_a_scan_given_up_on_stops_within_one_huge_directory(tmp_path: Path) -> None:
    root = tmp_path / "ws"
    (root / "huge").mkdir(parents=True)
    entries = 3 * CHECK_EVERY + 10
    for n in range(entries):
        (root / "huge" / f"{n:05}.tmp").touch()
    store = ContentStore(tmp_path / "store")
    snapshotter = Snapshotter(store, Trees(store), StatIndex(), reader_processes=0)
    workspace = Workspace(str(root))
    rules = disk_rules(workspace, ["*.tmp"], [])
    cancel = Cancellation()
    judged: list[str] = []
    real = rules.ignores_entry

    def judging(path: str, is_dir: bool) -> bool:
        judged.append(path)
        if len(judged) == CHECK_EVERY + 1:
            cancel.cancel()  # the caller gives up past the first CHECK_EVERY entries
        return real(path, is_dir)

    rules.ignores_entry = judging  # type: ignore[method-assign]
    try:
        with pytest.raises(Cancelled), store.batch() as batch:
            batch.cancel = cancel
            snapshotter.capture(workspace, rules, 1 << 20, batch)
    finally:
        snapshotter.close()
    huge = [path for path in judged if path.startswith("huge/")]
    assert CHECK_EVERY < len(huge) <= 2 * CHECK_EVERY + 1, len(huge)
