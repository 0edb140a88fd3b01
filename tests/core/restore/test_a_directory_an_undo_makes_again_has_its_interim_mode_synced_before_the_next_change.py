"""An undo makes a directory again (the rollback had removed it, or put a file in its place) with
``Workspace.make_dir``: ``mkdir`` at 0700, then its mode set to the target's with the owner's
bits (``mode | 0o700``) until the undo's mode step, last. Whoever finishes an undo killed in
between recognizes the directory as the undo's own by that interim mode
(``restoring.plan_restore``'s ``keep``: ``base.mode == target.mode | 0o700``) and takes it on to
its mode; a directory with any other mode is someone else's and is left as it is. An undo counts
each change done once it is on the disk, and the next begins only then: the new directory's
entry in its parent is synced (``_changing``), but by POSIX that says nothing of the new
directory's own mode, which only an fsync of the directory (or of its file system) makes durable.
A power cut after the next change then may leave it at 0700: not the undo's, so never given the
user's mode back. Checked by the durability oracle (``durability_oracle``): the check it makes
before each change of an undo."""

from __future__ import annotations

from pathlib import Path

import pytest

from checkpointd.core.store.tree import Change, Entry, EntryKind
from checkpointd.core.workspace.workspace import Workspace
from tests.core.restore.durability_oracle import DurabilityOracle
from tests.core.restore.test_rollback_write_path_attacked import Plan


def test_a_directory_an_undo_makes_has_its_interim_mode_synced_before_anything_goes_into_it(
        plan: Plan, monkeypatch: pytest.MonkeyPatch) -> None:
    restorer = plan.engine.parts.restorer
    with restorer.store.batch() as batch:
        digest = batch.put_bytes(b"the user's work")
    changes = [Change("kept", None, Entry(EntryKind.DIR, 0o755)),
               Change("kept/users-file.txt", None, Entry(EntryKind.FILE, 0o644, 15, digest))]
    oracle = DurabilityOracle(str(plan.root)).install(monkeypatch, plan.engine)

    restorer.apply(Workspace(str(plan.root)), changes, batched=False)

    assert (Path(plan.root) / "kept/users-file.txt").read_bytes() == b"the user's work"
    assert "an undo's next change begins" in oracle.moments
    oracle.assert_durable()
