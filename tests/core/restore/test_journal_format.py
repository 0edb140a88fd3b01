"""The rollback journal's entries as the database keeps them: the fields added after version 2
(``opened``, ``interim``) are left out while empty, so a server that predates them still reads
every entry without them, and one that has them reads the entries of one that does not."""

from __future__ import annotations

import json

from checkpointd.core.restore.journal import Goal, JournalEntry
from checkpointd.core.store.tree import Entry, EntryKind


def _entry(**fields) -> JournalEntry:
    return JournalEntry(plan_id="p", workspace_root="/w", target_checkpoint_id="t", safety_checkpoint_id="s",
                        safety_tree="tree", paths=("a",), temp_tag="tag", directories=("", "a"), **fields)


def test_an_entry_without_windows_or_interim_paths_is_recorded_as_before_them() -> None:
    record = _entry().to_record()
    assert "opened" not in record and "interim" not in record
    assert JournalEntry.from_record(json.loads(json.dumps(record))) == _entry()


def test_windows_and_interim_paths_survive_the_database() -> None:
    undo = _entry(goal=Goal.UNDO, written=(("a", Entry(EntryKind.DIR, 0o755, 0, "", "")), ("b", None)),
                  opened=(("", 0o555), ("a", 0o500)), interim=("a",))
    assert JournalEntry.from_record(json.loads(json.dumps(undo.to_record()))) == undo
