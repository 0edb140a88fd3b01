"""Before replacing or removing a file, the rollback checks that it still holds what its safety
capture saw. For a file the capture took from the stat index (restoring.py ``seen_by_capture``),
that check is the index's stat identity: an unchanged file is not read again (docs/PERFORMANCE.md:
"a stat index means an unchanged file is never read again"); only a file the index cannot vouch
for (written within its racy window, or read outside it) is hashed."""

from __future__ import annotations

import os

import pytest

from checkpointd.core.capture import stat_index as stat_index_module
from checkpointd.core.restore import restorer as restorer_module
from tests.core.restore.test_rollback_write_path_attacked import Plan, write


def _write_files(plan: Plan, contents: dict[str, str]) -> None:
    for name, content in contents.items():
        write(plan.root / name, content)


@pytest.fixture
def hashed(monkeypatch: pytest.MonkeyPatch) -> list[str]:
    """The files whose content the restorer's check reads (restorer.py ``_digest``)."""
    read: list[str] = []
    real = restorer_module._digest

    def digest(dir_fd: int, name: str, st: os.stat_result) -> str:
        read.append(name)
        return real(dir_fd, name, st)

    monkeypatch.setattr(restorer_module, "_digest", digest)
    return read


def test_the_files_a_rollback_replaces_are_checked_by_their_stat_not_read_again(
        plan: Plan, hashed: list[str], monkeypatch: pytest.MonkeyPatch) -> None:
    # Files just written are in the index's racy window (their ctime cannot be dated back), where
    # the check must hash them: that window is the index's tests' subject, not this one's.
    monkeypatch.setattr(stat_index_module, "RACY_WINDOW_NS", 0)
    _write_files(plan, {"a.txt": "target a\n", "b.txt": "target b\n"})
    target = plan.checkpoint()
    _write_files(plan, {"a.txt": "changed a\n", "b.txt": "changed b\n", "new.txt": "new\n"})
    plan.checkpoint()  # indexes the changed files

    plan.rollback(target)

    assert plan.state() == plan.files_of(target)
    assert hashed == [], "the check read files again that the stat index vouched for"

