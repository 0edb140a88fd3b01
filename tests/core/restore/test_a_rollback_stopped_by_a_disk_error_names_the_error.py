"""A rollback stopped by an error of the workspace's disk is undone and refused with the error's
name in its ErrorInfo (``errno``: restoring.py ``errno_name``), so a client can tell EIO from
EACCES or ENOSPC without parsing the message."""

from __future__ import annotations

import errno
import os

import pytest

from checkpointd.core.kernel.errors import FailedPrecondition, Reason
from checkpointd.core.workspace import syncbatch as syncbatch_module
from tests.core.restore.test_restore_engine import Plan, _listing, _two_edits


def test_a_rollback_whose_sync_fails_with_eio_says_eio(plan: Plan, monkeypatch: pytest.MonkeyPatch) -> None:
    target, before = _two_edits(plan)
    monkeypatch.setattr(syncbatch_module, "_sync", lambda fd: OSError(errno.EIO, os.strerror(errno.EIO)))
    monkeypatch.setattr(syncbatch_module, "_synced_whole_file_systems", lambda fds: False)

    with pytest.raises(FailedPrecondition) as refused:
        plan.rollback(target)

    assert refused.value.reason is Reason.ROLLBACK_CONFLICT
    assert refused.value.metadata.get("errno") == "EIO", refused.value.metadata
    assert _listing(plan.root) == before
