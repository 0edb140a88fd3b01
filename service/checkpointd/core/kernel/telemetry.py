"""Metrics facade for the domain: the core reports events here and knows nothing of how
they are exported. The defaults do nothing; the server binds a Prometheus-backed sink at
start-up (checkpointd.metrics). Imports nothing from grpc or prometheus on purpose.
"""

from __future__ import annotations

import enum
import threading
from dataclasses import dataclass


class CaptureMode(enum.StrEnum):
    """How a capture read its workspace (a metric label)."""

    #: Only the paths the file watcher saw change since the last capture.
    INCREMENTAL = "incremental"
    #: The whole workspace, watched, because the watcher could not vouch for it (see watcher_fallback).
    FULL = "full"
    #: The whole workspace, which no watcher watches (watcher off, or no watch left for it).
    UNWATCHED = "unwatched"


class Durable(enum.StrEnum):
    """What a sync made durable before a checkpoint could be acknowledged (a metric label)."""

    #: A batch's new objects in the content store (its packs and loose files).
    OBJECTS = "objects"
    #: A group commit's transaction of new checkpoint rows.
    METADATA = "metadata"


@dataclass(frozen=True)
class GcReport:
    """What one garbage collection did (or, on a dry run, would do)."""

    deleted_objects: int = 0
    #: Bytes the deleted objects accounted for (see core.retention.object_sizes).
    reclaimed_bytes: int = 0
    #: What the store holds afterwards (see core.retention.store_footprint).
    store_objects: int = 0
    store_bytes: int = 0
    duration_seconds: float = 0.0
    dry_run: bool = False


class Sink:
    """Receives domain events. Every method is a no-op here; subclasses export them."""

    def watcher_fallback(self, reason: str) -> None:
        """A file watcher could not vouch for a workspace and a full scan ran instead.

        ``reason`` must come from a small fixed set (it becomes a metric label).
        """

    def watcher_missed(self, count: int) -> None:
        """A recheck found ``count`` files changed without a file-watcher event (see capture.recheck)."""

    def checkpoints_pruned(self, rule: str, count: int) -> None:
        """Retention deleted ``count`` checkpoints under ``rule`` (see core.retention.Rule)."""

    def garbage_collected(self, report: GcReport) -> None:
        """A garbage collection finished; also carries the store's size after it."""

    def gc_postponed(self) -> None:
        """A garbage collection gave up waiting for a capture that may be stuck; nothing was deleted."""

    def captured(self, mode: CaptureMode, seconds: float) -> None:
        """A workspace capture took ``seconds``."""

    def capture_abandoned(self, operation: str, why: str) -> None:
        """A capture stopped before its commit point because its caller gave up (see
        kernel.cancellation): ``operation`` is "rollback" or "diff", ``why``
        "cancelled" or "deadline_exceeded" (both metric labels)."""

    def made_durable(self, what: Durable, seconds: float) -> None:
        """A sync that a checkpoint waits for took ``seconds``: the split between the two kinds and
        the captures tells whether slow checkpoints wait for the disk or read the workspace."""


_sink: Sink = Sink()
_bind_lock = threading.Lock()


def bind(sink: Sink) -> None:
    """Routes every later event to ``sink`` (the server does this once at start-up)."""
    global _sink
    with _bind_lock:
        _sink = sink


def unbind(sink: Sink) -> None:
    """Back to the no-op sink, if ``sink`` is still the bound one."""
    global _sink
    with _bind_lock:
        if _sink is sink:
            _sink = Sink()


def sink() -> Sink:
    return _sink


def watcher_fallback(reason: str) -> None:
    _sink.watcher_fallback(reason)


def watcher_missed(count: int) -> None:
    _sink.watcher_missed(count)


def checkpoints_pruned(rule: str, count: int) -> None:
    _sink.checkpoints_pruned(rule, count)


def garbage_collected(report: GcReport) -> None:
    _sink.garbage_collected(report)


def gc_postponed() -> None:
    _sink.gc_postponed()


def captured(mode: CaptureMode, seconds: float) -> None:
    _sink.captured(mode, seconds)


def capture_abandoned(operation: str, why: str) -> None:
    _sink.capture_abandoned(operation, why)


def made_durable(what: Durable, seconds: float) -> None:
    _sink.made_durable(what, seconds)
