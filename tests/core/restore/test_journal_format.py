"""The rollback journal's entries as the database keeps them: the fields added after version 2
(``opened``, ``interim``) are left out while empty, so a server that predates them still reads
every entry without them, and one that has them reads the entries of one that does not."""

from __future__ import annotations

import json

import pytest

from checkpointd.core.restore.journal import Goal, JournalEntry
from checkpointd.core.store.tree import Entry, EntryKind
from checkpointd.core.workspace.windows import Window


def _entry(**fields) -> JournalEntry:
    return JournalEntry(plan_id="p", workspace_root="/w", target_checkpoint_id="t", safety_checkpoint_id="s",
                        safety_tree="tree", paths=("a",), temp_tag="tag", directories=("", "a"), **fields)


def test_an_entry_without_windows_or_interim_paths_is_recorded_as_before_them() -> None:
    record = _entry().to_record()
    assert "opened" not in record and "interim" not in record
    assert JournalEntry.from_record(json.loads(json.dumps(record))) == _entry()


def test_windows_and_interim_paths_survive_the_database() -> None:
    undo = _entry(goal=Goal.UNDO, written=(("a", Entry(EntryKind.DIR, 0o755, 0, "", "")), ("b", None)),
                  opened=(Window("", 0o555, 2049, 2), Window("a", 0o500, 2049, 77)), interim=("a",))
    assert JournalEntry.from_record(json.loads(json.dumps(undo.to_record()))) == undo


def test_a_field_a_newer_server_added_is_ignored_and_the_rest_is_read() -> None:
    """A replica not yet upgraded takes over an entry a newer one wrote: it finishes the entry as
    far as it understands it rather than drop it as unreadable."""
    record = json.loads(json.dumps(_entry(interim=("a",)).to_record()))
    record["something_newer"] = [1, 2, 3]
    assert JournalEntry.from_record(record) == _entry(interim=("a",))


def test_a_windows_birth_time_survives_the_database_beside_what_an_older_server_reads() -> None:
    """A window's birth time (the directory's statx btime) rides in a list of its own, so a replica
    before it still reads each window as the four fields it knows, and ignores the list."""
    entry = _entry(opened=(Window("", 0o555, 2049, 2, 0), Window("a", 0o500, 2049, 77, 1_796_000_000_123_456_789)))
    record = json.loads(json.dumps(entry.to_record()))
    assert record["opened"] == [["", 0o555, 2049, 2], ["a", 0o500, 2049, 77]]
    assert record["opened_born_ns"] == [0, 1_796_000_000_123_456_789]
    assert JournalEntry.from_record(record) == entry
    del record["opened_born_ns"]
    assert [w.born_ns for w in JournalEntry.from_record(record).opened] == [0, 0]


def test_windows_and_birth_times_that_do_not_pair_up_are_refused() -> None:
    record = json.loads(json.dumps(_entry(opened=(Window("a", 0o500, 2049, 77, 5),)).to_record()))
    record["opened_born_ns"] = [5, 6]
    with pytest.raises(ValueError, match="pair up"):
        JournalEntry.from_record(record)
