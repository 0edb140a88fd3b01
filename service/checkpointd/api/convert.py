"""Proto messages <-> domain values. Enums convert by name, exhaustively, and an enum
value the server does not know is refused."""

from __future__ import annotations

import enum
import math
from collections.abc import Callable, Iterable, Mapping, Sequence
from datetime import UTC, datetime
from typing import Any, TypeVar

from google.protobuf import json_format, struct_pb2, timestamp_pb2

from checkpoint.v1 import admin_service_pb2 as admin_pb
from checkpoint.v1 import checkpoint_service_pb2 as pb
from checkpoint.v1 import config_service_pb2 as config_pb
from checkpointd.core.config.registry import Effective, Source
from checkpointd.core.engine.contents import TextDiff
from checkpointd.core.engine.nesting import NestedWorkspace
from checkpointd.core.engine.plans import PlanSummary
from checkpointd.core.engine.requests import Checkpoint, Scope
from checkpointd.core.kernel.errors import InvalidArgument, Reason
from checkpointd.core.kernel.vocabulary import Phase, Trigger
from checkpointd.core.maintenance.fsck import FindingKind, FsckReport
from checkpointd.core.store.tree import Change, Entry, EntryKind

E = TypeVar("E", bound=enum.Enum)
T = TypeVar("T")
M = TypeVar("M")


def _enum_table(proto_enum: Any, prefix: str, domain: type[E]) -> dict[int, E]:
    """Proto number -> domain member, checked to be a bijection (except UNSPECIFIED)."""
    table = {}
    for name, number in proto_enum.items():
        short = name.removeprefix(prefix)
        if short == "UNSPECIFIED":
            continue
        table[number] = domain[short]
    if set(table.values()) != set(domain):
        raise RuntimeError(f"{proto_enum.DESCRIPTOR.name} and {domain.__name__} differ")
    return table


PHASES = _enum_table(pb.Phase, "PHASE_", Phase)
TRIGGERS = _enum_table(pb.Trigger, "TRIGGER_", Trigger)
SCOPES = _enum_table(pb.RollbackScope, "ROLLBACK_SCOPE_", Scope)
SOURCES = _enum_table(config_pb.ConfigSource, "CONFIG_SOURCE_", Source)
FINDING_KINDS = _enum_table(admin_pb.FindingKind, "FINDING_KIND_", FindingKind)
ENTRY_TYPES = {EntryKind.FILE: pb.ENTRY_TYPE_FILE, EntryKind.SYMLINK: pb.ENTRY_TYPE_SYMLINK,
               EntryKind.DIR: pb.ENTRY_TYPE_DIRECTORY}
_PHASE_NUMBERS = {v: k for k, v in PHASES.items()}
_TRIGGER_NUMBERS = {v: k for k, v in TRIGGERS.items()}
_SOURCE_NUMBERS = {v: k for k, v in SOURCES.items()}
_FINDING_NUMBERS = {v: k for k, v in FINDING_KINDS.items()}


def from_proto_enum(table: dict[int, E], number: int, field: str) -> E | None:
    """None for UNSPECIFIED; INVALID_ARGUMENT for a number this server does not know."""
    if number == 0:
        return None
    try:
        return table[number]
    except KeyError:
        raise InvalidArgument(Reason.UNKNOWN_ENUM_VALUE, f"unknown {field} value {number}", field=field,
                              value=number) from None


def known_enum_value(proto_enum: Any, number: int, field: str) -> int:
    """For enums with no domain counterpart: refuse numbers the contract does not define."""
    if number not in proto_enum.values():
        raise InvalidArgument(Reason.UNKNOWN_ENUM_VALUE, f"unknown {field} value {number}", field=field,
                              value=number)
    return number


def text(value: str) -> str:
    """Paths may hold bytes that are not UTF-8 (kept as surrogates); proto strings may not."""
    return value.encode("utf-8", "surrogateescape").decode("utf-8", "backslashreplace")


def raw_path(value: str) -> bytes:
    """A path's exact bytes when they are not valid UTF-8 (its text form is lossy), else b""."""
    try:
        value.encode("utf-8")
    except UnicodeEncodeError:
        return value.encode("utf-8", "surrogateescape")
    return b""


def request_paths(paths: Iterable[str], raw_paths: Iterable[bytes]) -> tuple[str, ...]:
    """A request's paths and raw_paths as one tuple of domain paths (bytes that are not UTF-8
    become surrogates, as the engine holds them)."""
    return (*paths, *(raw.decode("utf-8", "surrogateescape") for raw in raw_paths))


_EPOCH = datetime(1970, 1, 1, tzinfo=UTC)


def timestamp(value: datetime) -> timestamp_pb2.Timestamp:
    """As ``Timestamp.FromDatetime`` (a naive value is UTC), in a fraction of its time."""
    since = (value if value.tzinfo is not None else value.replace(tzinfo=UTC)) - _EPOCH
    return timestamp_pb2.Timestamp(seconds=since.days * 86400 + since.seconds, nanos=since.microseconds * 1000)


#: A response lists changes up to this many bytes of them (gRPC's send limit is 64 MiB; a
#: rollback's answer also holds a state and its safety checkpoint); the rest are counted.
LISTED_CHANGES_BYTES = 16 << 20
#: A list of checkpoints (a ListCheckpoints page, a DeleteCheckpoints answer) up to this many
#: bytes: a checkpoint's labels, description and skipped files can take ~100 KB, so 1,000 of them
#: would not fit in one message; a page ends early (with its token), a deletion counts the rest.
LISTED_CHECKPOINTS_BYTES = 32 << 20
#: A checkpoint message lists at most this many skipped files, and this many bytes of them.
LISTED_SKIPPED = 1000
LISTED_SKIPPED_BYTES = 32 << 10


def bounded(items: Iterable[T], to_message: Callable[[T], M], budget: int, total: int) -> tuple[list[M], int]:
    """The messages of the first ``items`` that fit in ``budget`` bytes (the first always, so a
    page moves on), and how many of ``total`` are left out."""
    listed: list[M] = []
    size = 0
    for item in items:
        message = to_message(item)
        size += message.ByteSize()
        if size > budget and listed:
            break
        listed.append(message)
    return listed, total - len(listed)


def changes(found: Sequence[Change], texts: Mapping[str, TextDiff] | None = None) -> tuple[list[pb.FileChange], int]:
    """The first of ``found`` as messages, up to ``LISTED_CHANGES_BYTES``, and how many are left out."""
    return bounded(found, lambda c: change(c, texts.get(c.path) if texts else None), LISTED_CHANGES_BYTES,
                   len(found))


def checkpoints(found: Sequence[Checkpoint]) -> tuple[list[pb.Checkpoint], int]:
    """The first of ``found`` as messages, up to ``LISTED_CHECKPOINTS_BYTES``, and how many are left out."""
    return bounded(found, checkpoint, LISTED_CHECKPOINTS_BYTES, len(found))


def _skipped_file(skipped: list) -> pb.SkippedFile:
    p, size, reason = skipped
    return pb.SkippedFile(path=text(p), raw_path=raw_path(p), size_bytes=size, reason=reason)


def _skipped(skipped: list) -> tuple[list[pb.SkippedFile], int]:
    # One skipped file is at most ~20 KB (a 4 KiB path not UTF-8: escaped and raw): the first fits.
    return bounded(skipped[:LISTED_SKIPPED], _skipped_file, LISTED_SKIPPED_BYTES, len(skipped))


def checkpoint(cp: Checkpoint) -> pb.Checkpoint:
    row = cp.row
    skipped, skipped_omitted = _skipped(row.skipped)
    return pb.Checkpoint(
        checkpoint_id=row.checkpoint_id,
        plan_id=row.plan_id,
        sequence=row.sequence,
        phase=_PHASE_NUMBERS[Phase(row.phase)],
        trigger=_TRIGGER_NUMBERS[Trigger(row.trigger)],
        source_tool=row.source_tool,
        labels=row.labels,
        description=row.description,
        create_time=timestamp(row.create_time),
        workspace_root=text(row.workspace_root or ""),
        has_files=row.tree_digest is not None,
        file_count=row.file_count,
        total_size_bytes=row.total_size_bytes,
        state_size_bytes=row.state_size_bytes,
        skipped_files=skipped,
        skipped_files_omitted=skipped_omitted,
        tree_digest=f"sha256:{row.tree_digest}" if row.tree_digest else "",
        rollback_target_checkpoint_id=row.rollback_target_checkpoint_id or "",
        state=cp.state or b"",
    )


def _side(entry: Entry | None) -> tuple[int, int, int]:
    if entry is None:
        return pb.ENTRY_TYPE_UNSPECIFIED, 0, 0
    return ENTRY_TYPES[entry.kind], entry.size if entry.kind is not EntryKind.DIR else 0, entry.mode


def change(c: Change, text_diff: TextDiff | None = None) -> pb.FileChange:
    base_type, base_size, base_mode = _side(c.base)
    target_type, target_size, target_mode = _side(c.target)
    if c.base is None:
        kind = pb.CHANGE_KIND_ADDED
    elif c.target is None:
        kind = pb.CHANGE_KIND_DELETED
    elif c.base.kind is not c.target.kind:
        kind = pb.CHANGE_KIND_TYPE_CHANGED
    else:
        kind = pb.CHANGE_KIND_MODIFIED
    message = pb.FileChange(path=text(c.path), raw_path=raw_path(c.path), kind=kind, base_type=base_type,
                            target_type=target_type, base_size_bytes=base_size, target_size_bytes=target_size,
                            base_mode=base_mode, target_mode=target_mode)
    if text_diff is not None:
        message.text_diff_status = pb.TextDiffStatus.Value(f"TEXT_DIFF_STATUS_{text_diff.status}")
        message.text_diff = text_diff.text
    return message


def checkpoint_file(path: str, entry: Entry) -> pb.CheckpointFile:
    target = entry.target if entry.kind is EntryKind.SYMLINK else ""
    return pb.CheckpointFile(path=text(path), raw_path=raw_path(path), entry_type=ENTRY_TYPES[entry.kind],
                             size_bytes=entry.size if entry.kind is not EntryKind.DIR else 0, mode=entry.mode,
                             symlink_target=text(target), raw_symlink_target=raw_path(target))


def nested_workspace(nested: NestedWorkspace) -> pb.NestedWorkspace:
    return pb.NestedWorkspace(plan_id=nested.plan_id, workspace_root=text(nested.workspace_root),
                              change_count=nested.change_count)


def plan(summary: PlanSummary) -> pb.Plan:
    return pb.Plan(plan_id=summary.plan_id, workspace_root=text(summary.workspace_root or ""),
                   create_time=timestamp(summary.create_time), update_time=timestamp(summary.update_time),
                   checkpoint_count=summary.checkpoint_count, newest_checkpoint_id=summary.newest_checkpoint_id,
                   total_size_bytes=summary.total_size_bytes)


def value_to_python(value: struct_pb2.Value, key: str) -> Any:
    """A google.protobuf.Value as plain Python; non-finite numbers have no JSON form and are refused."""
    match value.WhichOneof("kind"):
        case "number_value":
            if not math.isfinite(value.number_value):
                raise InvalidArgument(Reason.INVALID_CONFIG_VALUE, f"invalid value for {key}: not a finite number",
                                      key=key, detail="not a finite number")
            return value.number_value
        case "string_value":
            return value.string_value
        case "bool_value":
            return value.bool_value
        case "list_value":
            return [value_to_python(item, key) for item in value.list_value.values]
        case "struct_value":
            return {name: value_to_python(item, key) for name, item in value.struct_value.fields.items()}
        case "null_value" | None:
            return None


def python_to_value(data: Any) -> struct_pb2.Value:
    value = struct_pb2.Value()
    json_format.ParseDict(data, value)
    return value


def config_entry(effective: Effective) -> config_pb.ConfigEntry:
    entry = config_pb.ConfigEntry(
        key=effective.key.name,
        value=python_to_value(effective.value),
        source=_SOURCE_NUMBERS[effective.source],
        default_value=python_to_value(effective.key.default),
        description=effective.key.description,
        plan_id=effective.plan_id,
        etag=effective.etag,
    )
    if effective.update_time is not None:
        entry.update_time.CopyFrom(timestamp(effective.update_time))
    return entry


def integrity_report(report: FsckReport) -> admin_pb.CheckIntegrityResponse:
    return admin_pb.CheckIntegrityResponse(
        ok=report.ok,
        plan_count=report.plans,
        checkpoint_count=report.checkpoints,
        verified_object_count=report.objects_verified,
        unreferenced_object_count=report.unreferenced_objects,
        findings=[admin_pb.IntegrityFinding(kind=_FINDING_NUMBERS[p.kind], subject=text(p.subject),
                                            detail=text(p.detail)) for p in report.problems],
        unfinished_rollback_plan_ids=report.pending_rollbacks,
    )
