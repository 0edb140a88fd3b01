"""A metadata database that keeps nothing across a restart (SQLite in memory: ``sqlite://``,
``sqlite:///:memory:``) would lose every acknowledged checkpoint when the server stops, and its
pool would hand each connection a database of its own: the URL is refused as unusable, saying why,
like any other URL the server cannot use (never a traceback)."""

from __future__ import annotations

import subprocess

import pytest

from checkpointd.core.metadata.db import Database, DatabaseUrlError, normalize_url
from tests.conftest import CHECKPOINTD


@pytest.mark.parametrize("url", ["sqlite://", "sqlite:///:memory:", "sqlite+pysqlite:///:memory:"])
def test_an_in_memory_sqlite_url_is_refused(url: str) -> None:
    with pytest.raises(DatabaseUrlError, match="in memory"):
        normalize_url(url)
    with pytest.raises(DatabaseUrlError, match="in memory"):
        Database(url)


def test_serve_refuses_an_in_memory_database_without_a_traceback(tmp_path) -> None:
    result = subprocess.run([CHECKPOINTD, "serve", "--data-dir", str(tmp_path), "--listen", "127.0.0.1:0",
                             "--db-url", "sqlite://"], capture_output=True, text=True, timeout=60)
    output = result.stdout + result.stderr
    assert result.returncode != 0
    assert "in memory" in output
    assert "Traceback" not in output
