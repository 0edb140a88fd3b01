"""The ``restorer`` fixture of the workspace tests: a restorer over a content store of its own."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from checkpointd.core.restore.restorer import Restorer
from checkpointd.core.store.content_store import ContentStore
from checkpointd.core.store.tree import Trees


@pytest.fixture
def restorer(tmp_path: Path) -> Iterator[Restorer]:
    store = ContentStore(tmp_path / "store")
    try:
        yield Restorer(store, Trees(store))
    finally:
        store.close()
