"""A directory's files go to reader processes in tasks of at most ``TASK_FILES`` files and
``TASK_BYTES`` bytes, whose names fit a task message (``readworker.MAX_TASK_BYTES``; a longer
message would be cut, and the reader could not read it). Every file is in exactly one task, in
order; one file larger than ``TASK_BYTES`` is a task of its own."""

from __future__ import annotations

from checkpointd.core.capture.readers import TASK_BYTES, TASK_FILES, chunks
from checkpointd.core.workspace import readworker


def _names(count: int, length: int = 5) -> list[str]:
    return [f"{i:0{length}}" for i in range(count)]


def test_files_fill_a_task_up_to_its_byte_bound_exactly() -> None:
    names = _names(4)
    assert chunks(names, [TASK_BYTES // 4] * 4) == [names]
    assert chunks(names, [TASK_BYTES // 4] * 3 + [TASK_BYTES // 4 + 1]) == [names[:3], names[3:]]
    assert chunks(names, [0, TASK_BYTES, 0, 1]) == [names[:3], names[3:]]
    # A task after the first counts from nothing too.
    assert chunks(names[:3], [1, TASK_BYTES, 1]) == [names[:1], names[1:2], names[2:3]]


def test_files_fill_a_task_up_to_its_file_bound() -> None:
    names = _names(2 * TASK_FILES + 1)
    assert chunks(names, [1] * len(names)) == [names[:TASK_FILES], names[TASK_FILES:2 * TASK_FILES],
                                                  names[2 * TASK_FILES:]]
    # Unknown sizes (walked without a stat): by count alone.
    assert chunks(names, [-1] * len(names)) == [names[:TASK_FILES], names[TASK_FILES:2 * TASK_FILES],
                                                   names[2 * TASK_FILES:]]
    assert chunks(names[:TASK_FILES], [-1] * TASK_FILES) == [names[:TASK_FILES]]


def test_a_file_larger_than_a_task_is_a_task_of_its_own() -> None:
    names = _names(3)
    assert chunks(names, [1, TASK_BYTES + 1, 1]) == [names[:1], names[1:2], names[2:]]
    assert chunks(names[:1], [TASK_BYTES * 3]) == [names[:1]]


def test_long_names_keep_each_task_message_within_what_a_reader_receives() -> None:
    """Names of 254 characters count 1024 bytes each (4 per character, 8 more): a task's
    name budget (``MAX_TASK_BYTES // 2``) holds a whole number of them, to the byte."""
    length = 254
    per_task = readworker.MAX_TASK_BYTES // 2 // (length * 4 + 8)
    assert per_task * (length * 4 + 8) == readworker.MAX_TASK_BYTES // 2
    names = _names(2 * per_task + 1, length)
    tasks = chunks(names, [0] * len(names))
    assert tasks == [names[:per_task], names[per_task:2 * per_task], names[2 * per_task:]]
