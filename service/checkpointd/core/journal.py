"""The rollback journal: what a rollback is doing to a workspace, durable before it starts.

A rollback writes its journal entry, then commits its safety checkpoint (the workspace as
it was), then changes the workspace, then removes the entry. An entry found later means the
process died (or gave up) part-way. If its safety checkpoint never committed, nothing had
changed and the entry is dropped; otherwise it says how to finish: ``COMPLETE`` brings the
paths the rollback covers to its target checkpoint, ``UNDO`` brings them back to the safety
checkpoint. Either way the workspace is never partly restored without a committed checkpoint
that holds what was there before.

One entry per plan (a plan's rollbacks are serialized), one file per entry, written to a
temporary name, fsynced and renamed, so an entry is either whole or absent.
"""

from __future__ import annotations

import contextlib
import enum
import errno
import json
import logging
import os
import uuid
from dataclasses import asdict, dataclass
from pathlib import Path

from checkpointd.core.errors import Reason, ResourceExhausted
from checkpointd.core.faults import Point, crash_point

log = logging.getLogger("checkpointd.journal")

#: Entries are named ``<plan_id><JOURNAL_SUFFIX>``.
JOURNAL_SUFFIX = ".json"
_TEMP_SUFFIX = ".tmp"
FORMAT_VERSION = 1


class Goal(enum.StrEnum):
    """What recovery makes of an interrupted rollback."""

    #: Finish it: the covered paths become the target checkpoint's.
    COMPLETE = "complete"
    #: Take it back: the covered paths become the safety checkpoint's (the state before).
    UNDO = "undo"


@dataclass(frozen=True)
class JournalEntry:
    plan_id: str
    workspace_root: str
    target_checkpoint_id: str
    safety_checkpoint_id: str
    #: The safety checkpoint's tree: a workspace still equal to it was not changed yet.
    safety_tree: str
    #: The request's path subset ('' entries never occur; empty means the whole workspace).
    paths: tuple[str, ...]
    #: Temporary files of this rollback are named ``<workspace temp prefix><temp_tag>-...``.
    temp_tag: str
    #: Directories the rollback writes into: where its temporary files may be left behind.
    directories: tuple[str, ...]
    #: The rollback's idempotency key: its record is dropped if the rollback is not finished.
    request_id: str = ""
    goal: Goal = Goal.COMPLETE

    @property
    def goal_checkpoint_id(self) -> str:
        return self.target_checkpoint_id if self.goal is Goal.COMPLETE else self.safety_checkpoint_id

    def to_json(self) -> bytes:
        body = asdict(self)
        body["version"] = FORMAT_VERSION
        return json.dumps(body, sort_keys=True).encode()

    @classmethod
    def from_json(cls, data: bytes) -> JournalEntry:
        body = json.loads(data)
        if body.pop("version", None) != FORMAT_VERSION:
            raise ValueError("unknown journal format version")
        body["paths"] = tuple(body["paths"])
        body["directories"] = tuple(body["directories"])
        body["goal"] = Goal(body["goal"])
        return cls(**body)


def new_temp_tag() -> str:
    return uuid.uuid4().hex


class RollbackJournal:
    def __init__(self, directory: Path) -> None:
        self.directory = directory
        directory.mkdir(parents=True, exist_ok=True)
        for leftover in directory.glob(f"*{_TEMP_SUFFIX}"):
            leftover.unlink(missing_ok=True)

    def _path(self, plan_id: str) -> Path:
        return self.directory / f"{plan_id}{JOURNAL_SUFFIX}"

    def write(self, entry: JournalEntry) -> None:
        """Makes ``entry`` durable, replacing the plan's previous one."""
        temp = self.directory / f"{entry.plan_id}.{uuid.uuid4().hex}{_TEMP_SUFFIX}"
        try:
            fd = os.open(temp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_CLOEXEC, 0o600)
            try:
                with os.fdopen(fd, "wb") as out:
                    out.write(entry.to_json())
                    out.flush()
                    os.fsync(out.fileno())
                os.rename(temp, self._path(entry.plan_id))
            except BaseException:
                temp.unlink(missing_ok=True)
                raise
            self._sync_directory()
        except OSError as exc:
            if exc.errno in (errno.ENOSPC, errno.EDQUOT):
                raise ResourceExhausted(Reason.STORAGE_EXHAUSTED,
                                        f"no room for the rollback journal: {exc.strerror}") from exc
            raise
        crash_point(Point.ROLLBACK_JOURNALED)

    def remove(self, plan_id: str) -> None:
        with contextlib.suppress(FileNotFoundError):
            self._path(plan_id).unlink()
            self._sync_directory()

    def get(self, plan_id: str) -> JournalEntry | None:
        try:
            data = self._path(plan_id).read_bytes()
        except FileNotFoundError:
            return None
        return JournalEntry.from_json(data)

    def plan_ids(self) -> list[str]:
        """Plans with an entry, in a stable order."""
        return sorted(p.name.removesuffix(JOURNAL_SUFFIX) for p in self.directory.glob(f"*{JOURNAL_SUFFIX}"))

    def _sync_directory(self) -> None:
        fd = os.open(self.directory, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
        try:
            os.fsync(fd)
        finally:
            os.close(fd)
