"""The text log format: logging's own time stamps, with the context fields and extras after."""

from __future__ import annotations

import io
import json
import logging

from hypothesis import given
from hypothesis import strategies as st

from checkpointd.logging_setup import LogFormat, TextFormatter, configure


def record_at(created: float, message: str = "m", **extra: object) -> logging.LogRecord:
    record = logging.LogRecord("checkpointd.access", logging.INFO, __file__, 1, message, (), None)
    record.created = created
    record.msecs = int((created - int(created)) * 1000) + 0.0
    record.__dict__.update(extra)
    return record


@given(st.lists(st.floats(min_value=0, max_value=4_000_000_000), min_size=1, max_size=20))
def test_time_stamps_are_logging_s_own_in_any_order_of_records(times):
    ours, standard = TextFormatter(), logging.Formatter()
    for created in times:
        assert ours.formatTime(record_at(created)) == standard.formatTime(record_at(created))


def test_a_line_carries_the_set_fields_and_leaves_out_the_empty_ones():
    line = TextFormatter().format(record_at(1_800_000_000.5, "CreateCheckpoint OK", plan_id="01P", request_id=""))
    assert line.endswith(" INFO checkpointd.access CreateCheckpoint OK plan_id=01P")
    assert line.startswith(logging.Formatter().formatTime(record_at(1_800_000_000.5)))


def test_the_server_s_logging_does_not_look_up_what_no_format_prints(monkeypatch):
    """An access line is written per call; the thread, process and caller lookups were a measurable part of it."""
    for name in ("logThreads", "logProcesses", "logMultiprocessing", "_srcfile"):
        monkeypatch.setattr(logging, name, getattr(logging, name))
    root = logging.getLogger()
    monkeypatch.setattr(root, "handlers", list(root.handlers))
    monkeypatch.setattr(root, "level", root.level)
    stream = io.StringIO()
    configure("INFO", LogFormat.JSON, stream)
    records: list[logging.LogRecord] = []
    root.handlers[0].addFilter(lambda record: records.append(record) or True)
    logging.getLogger("checkpointd.access").info("CreateCheckpoint OK", extra={"plan_id": "01P"})
    (record,) = records
    assert (record.thread, record.threadName, record.process, record.processName) == (None, None, None, None)
    assert record.funcName == "(unknown function)"
    assert json.loads(stream.getvalue())["plan_id"] == "01P"
