"""The ``plan`` fixture of the in-process rollback and store tests: one engine, one plan, one workspace."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.core.restore.test_rollback_write_path_attacked import Plan


@pytest.fixture
def plan(tmp_path: Path) -> Iterator[Plan]:
    opened = Plan(tmp_path)
    try:
        yield opened
    finally:
        opened.close()
