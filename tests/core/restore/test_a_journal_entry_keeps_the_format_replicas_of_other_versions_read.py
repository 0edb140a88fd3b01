"""Replicas of different releases share one rollback journal during an upgrade: an entry is
written as format version 2, which every release since the journal moved into the database
reads, and a record exactly as such a release wrote it is read back (a replica that refused it
would drop the entry as unreadable, and the rollback would be left half-way unfinished)."""

from __future__ import annotations

import json

from checkpointd.core.restore.journal import Goal, JournalEntry
from checkpointd.core.store.tree import Entry, EntryKind

RECORD_OF_AN_EARLIER_RELEASE = {
    "version": 2, "plan_id": "01JA0000000000000000000000", "workspace_root": "/w", "target_checkpoint_id": "t",
    "safety_checkpoint_id": "s", "safety_tree": "tree", "paths": ["a"], "temp_tag": "tag", "directories": ["", "a"],
    "request_id": "r", "goal": "undo", "last_sequence": 7, "written": [["a/x", ["f", 420, 3, "d1", ""]], ["b", None]],
}


def test_an_entry_is_written_as_format_version_2() -> None:
    entry = JournalEntry.from_record(RECORD_OF_AN_EARLIER_RELEASE)
    assert json.loads(json.dumps(entry.to_record())) == RECORD_OF_AN_EARLIER_RELEASE  # as the JSON column keeps it


def test_a_record_an_earlier_release_wrote_is_read() -> None:
    assert JournalEntry.from_record(dict(RECORD_OF_AN_EARLIER_RELEASE)) == JournalEntry(
        plan_id="01JA0000000000000000000000", workspace_root="/w", target_checkpoint_id="t",
        safety_checkpoint_id="s", safety_tree="tree", paths=("a",), temp_tag="tag", directories=("", "a"),
        request_id="r", goal=Goal.UNDO, last_sequence=7,
        written=(("a/x", Entry(EntryKind.FILE, 0o644, 3, "d1", "")), ("b", None)))
