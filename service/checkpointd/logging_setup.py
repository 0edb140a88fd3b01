"""Logging for the server: text for people, JSON lines for log pipelines.

Every record carries the plan_id, checkpoint_id and request_id of the call being served
(set by api.access.AccessInterceptor in context variables), so a line logged deep in the
engine can still be tied to its request.
"""

from __future__ import annotations

import contextlib
import enum
import json
import logging
import sys
import time
from collections.abc import Iterator
from contextvars import ContextVar
from datetime import UTC, datetime
from typing import TextIO

plan_id_var: ContextVar[str] = ContextVar("plan_id", default="")
checkpoint_id_var: ContextVar[str] = ContextVar("checkpoint_id", default="")
request_id_var: ContextVar[str] = ContextVar("request_id", default="")
CONTEXT_FIELDS: dict[str, ContextVar[str]] = {
    "plan_id": plan_id_var,
    "checkpoint_id": checkpoint_id_var,
    "request_id": request_id_var,
}
_STANDARD_ATTRS = frozenset(logging.LogRecord("", 0, "", 0, "", (), None).__dict__) | {"message", "asctime"}


class LogFormat(enum.StrEnum):
    TEXT = "text"
    JSON = "json"


#: The levels --log-level accepts (any case).
LEVELS = ("DEBUG", "INFO", "WARNING", "ERROR", "CRITICAL")


def log_level(text: str) -> str:
    """A --log-level value (an argparse type): one of LEVELS, any case; anything else is a usage error."""
    import argparse

    if text.upper() not in LEVELS:
        raise argparse.ArgumentTypeError(f"{text!r} is not a log level: one of {', '.join(LEVELS)}")
    return text.upper()


@contextlib.contextmanager
def request_context(**values: str) -> Iterator[None]:
    """Sets the context fields named in ``values`` for the duration of one call."""
    tokens = [(CONTEXT_FIELDS[name], CONTEXT_FIELDS[name].set(value)) for name, value in values.items()]
    try:
        yield
    finally:
        for var, token in reversed(tokens):
            var.reset(token)


class ContextFilter(logging.Filter):
    """Copies the current call's context fields onto each record (explicit extras win)."""

    def filter(self, record: logging.LogRecord) -> bool:
        for name, var in CONTEXT_FIELDS.items():
            if not getattr(record, name, ""):
                setattr(record, name, var.get())
        return True


def _extras(record: logging.LogRecord) -> dict[str, object]:
    return {k: v for k, v in record.__dict__.items() if k not in _STANDARD_ATTRS and not k.startswith("_")}


class JsonFormatter(logging.Formatter):
    """One JSON object per line; empty context fields are left out."""

    def format(self, record: logging.LogRecord) -> str:
        payload: dict[str, object] = {
            "time": datetime.fromtimestamp(record.created, UTC).isoformat(timespec="milliseconds"),
            "level": record.levelname,
            "logger": record.name,
            "message": record.getMessage(),
        }
        payload.update((k, v) for k, v in _extras(record).items() if v not in ("", None))
        if record.exc_info:
            payload["exception"] = self.formatException(record.exc_info)
        return json.dumps(payload, default=str, ensure_ascii=False)


class TextFormatter(logging.Formatter):
    """The classic line, then ``key=value`` for each context field and extra that is set."""

    def __init__(self) -> None:
        super().__init__("%(asctime)s %(levelname)s %(name)s %(message)s")
        self._second: tuple[int, str] = (-1, "")

    def formatTime(self, record: logging.LogRecord, datefmt: str | None = None) -> str:  # noqa: N802
        """As logging's own, with the date and time of day rendered once per second: an access line
        is written for every call."""
        if datefmt:
            return super().formatTime(record, datefmt)
        second = int(record.created)
        cached, text = self._second
        if cached != second:
            text = time.strftime(self.default_time_format, self.converter(record.created))
            self._second = (second, text)
        return self.default_msec_format % (text, record.msecs)

    def format(self, record: logging.LogRecord) -> str:
        line = super().format(record)
        fields = " ".join(f"{k}={v}" for k, v in _extras(record).items() if v not in ("", None))
        if not fields:
            return line
        head, newline, rest = line.partition("\n")
        return f"{head} {fields}{newline}{rest}"


def _skip_unused_record_fields() -> None:
    """Neither format prints the thread, the process or the calling function, and the server
    writes an access line per call: logging is told not to look them up for every record (the
    logging HOWTO's "Optimization"). Caller lookup off also means ``stack_info`` is not rendered."""
    logging.logThreads = False
    logging.logProcesses = False
    logging.logMultiprocessing = False
    logging._srcfile = None


def configure(level: str, log_format: LogFormat, stream: TextIO | None = None) -> None:
    """Replaces the root handlers with one that writes ``log_format`` to ``stream`` (stderr)."""
    handler = logging.StreamHandler(stream or sys.stderr)
    handler.addFilter(ContextFilter())
    match log_format:
        case LogFormat.JSON:
            handler.setFormatter(JsonFormatter())
        case LogFormat.TEXT:
            handler.setFormatter(TextFormatter())
    _skip_unused_record_fields()
    root = logging.getLogger()
    for old in list(root.handlers):
        root.removeHandler(old)
    root.addHandler(handler)
    root.setLevel(level.upper())
    # Alembic narrates each migration step at INFO, its docstring included (twenty lines on a first
    # start); checkpointd.db's one line says which revision the schema is at and from which.
    logging.getLogger("alembic").setLevel(logging.WARNING if root.level > logging.DEBUG else logging.NOTSET)
