"""Metadata tables (SQLModel). Portable across SQLite and PostgreSQL: plain columns,
JSON for small structured values, no dialect-specific types."""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Any

from sqlalchemy import (
    JSON,
    BigInteger,
    Column,
    ColumnElement,
    DateTime,
    ForeignKey,
    Index,
    LargeBinary,
    String,
    UniqueConstraint,
    cast,
)
from sqlmodel import Field, SQLModel, func


def utcnow() -> datetime:
    return datetime.now(UTC)


def _time_column(**kwargs: Any) -> Any:
    return Field(default_factory=utcnow, sa_column=Column(DateTime(timezone=True), nullable=False, **kwargs))


class PlanRow(SQLModel, table=True):
    __tablename__ = "plans"
    #: Finds the plans whose workspaces nest (equality only: a hash index on PostgreSQL, which takes
    #: keys of any length).
    __table_args__ = (Index("ix_plans_workspace_root", "workspace_root", postgresql_using="hash"),)

    plan_id: str = Field(primary_key=True, max_length=26)
    workspace_root: str | None = Field(default=None, max_length=4096)
    last_sequence: int = 0
    create_time: datetime = _time_column()


class CheckpointRow(SQLModel, table=True):
    __tablename__ = "checkpoints"
    #: The unique (plan_id, sequence) index also serves keyset pagination, newest first.
    __table_args__ = (UniqueConstraint("plan_id", "sequence", name="uq_checkpoints_plan_sequence"),)

    checkpoint_id: str = Field(primary_key=True, max_length=26)
    plan_id: str = Field(max_length=26, foreign_key="plans.plan_id")
    sequence: int
    phase: str = Field(max_length=32)
    trigger: str = Field(max_length=32)
    source_tool: str = Field(default="", max_length=256)
    description: str = ""
    labels: dict[str, str] = Field(default_factory=dict, sa_column=Column(JSON, nullable=False))
    create_time: datetime = _time_column()
    workspace_root: str | None = Field(default=None, max_length=4096)
    tree_digest: str | None = Field(default=None, max_length=64)
    file_count: int = 0
    total_size_bytes: int = Field(default=0, sa_type=BigInteger)
    state_digest: str | None = Field(default=None, max_length=64)
    state_size_bytes: int = 0
    skipped: list[list[Any]] = Field(default_factory=list, sa_column=Column(JSON, nullable=False))
    ignore_patterns: list[str] = Field(default_factory=list, sa_column=Column(JSON, nullable=False))
    excluded_paths: list[str] = Field(default_factory=list, sa_column=Column(JSON, nullable=False))
    rollback_target_checkpoint_id: str | None = Field(default=None, max_length=26)
    #: What the checkpoint's pending writes total (values, names and framing, in bytes), kept by every put
    #: so that it is checked against the limit without reading them (``pending_writes``; fsck
    #: checks it against the rows).
    pending_write_bytes: int = Field(default=0, sa_column=Column(BigInteger, nullable=False, server_default="0"))


class OperationRow(SQLModel, table=True):
    """A mutating request that carried a request_id (AIP-155), with what it returned."""

    __tablename__ = "operations"

    request_id: str = Field(primary_key=True, max_length=128)
    method: str = Field(max_length=64)
    fingerprint: str = Field(max_length=64)
    result: dict[str, Any] = Field(default_factory=dict, sa_column=Column(JSON, nullable=False))
    create_time: datetime = _time_column()


class ConfigRow(SQLModel, table=True):
    __tablename__ = "config_values"
    __table_args__ = (UniqueConstraint("plan_id", "key", name="uq_config_plan_key"),)

    id: int | None = Field(default=None, primary_key=True)
    #: Empty for the global value.
    plan_id: str = Field(default="", max_length=26)
    key: str = Field(max_length=128)
    value: Any = Field(sa_column=Column(JSON, nullable=False))
    update_time: datetime = _time_column()


class ObjectRow(SQLModel, table=True):
    """A content-store object kept in the database (``--store db``); its bytes are in ``object_chunks``.

    Inserted in the same transaction as its chunks, so a row here means the whole object is there.
    """

    __tablename__ = "objects"

    digest: str = Field(primary_key=True, max_length=64)
    #: Size of the content (before compression).
    size: int = Field(sa_type=BigInteger)
    #: "R" raw chunks, or "Z" one zlib-compressed chunk.
    encoding: str = Field(max_length=1)
    chunk_count: int
    create_time: datetime = _time_column()


class ObjectChunkRow(SQLModel, table=True):
    __tablename__ = "object_chunks"

    digest: str = Field(primary_key=True, max_length=64)
    seq: int = Field(primary_key=True)
    data: bytes = Field(sa_type=LargeBinary)


class ContentStoreStateRow(SQLModel, table=True):
    """One row: bumped by every garbage collection, so replicas know to forget which objects they saw."""

    __tablename__ = "content_store_state"

    id: int = Field(primary_key=True, sa_column_kwargs={"autoincrement": False})
    gc_epoch: int = Field(default=0, sa_type=BigInteger)


class RollbackJournalRow(SQLModel, table=True):
    """An unfinished rollback of one plan (see ``journal``): visible to every replica of the database."""

    __tablename__ = "rollback_journal"

    plan_id: str = Field(primary_key=True, max_length=26)
    entry: dict[str, Any] = Field(default_factory=dict, sa_column=Column(JSON, nullable=False))
    create_time: datetime = _time_column()


class ServerSecretRow(SQLModel, table=True):
    """A random secret shared by every replica of one database (e.g. the page-token key)."""

    __tablename__ = "server_secrets"

    name: str = Field(primary_key=True, max_length=64)
    value: bytes = Field(sa_type=LargeBinary)
    create_time: datetime = _time_column()


class PendingWriteRow(SQLModel, table=True):
    """A write a task made after a checkpoint (PutPendingWrites); deleted with its checkpoint by the
    foreign key's cascade, whichever way the checkpoint goes (DeleteCheckpoint(s), retention)."""

    __tablename__ = "pending_writes"

    checkpoint_id: str = Field(sa_column=Column(
        String(26), ForeignKey("checkpoints.checkpoint_id", ondelete="CASCADE"), primary_key=True))
    task_id: str = Field(primary_key=True, max_length=256)
    idx: int = Field(primary_key=True)
    channel: str = Field(max_length=256)
    value_type: str = Field(default="", max_length=64)
    value: bytes = Field(default=b"", sa_type=LargeBinary)
    task_path: str = Field(default="", max_length=1024)


#: What a pending write costs in a ListPendingWritesResponse beyond its value and names, at most: the
#: tags and lengths of its fields and of itself, and a negative index's 10-byte varint. Counted with
#: each write, so that the checkpoint's limit bounds the answer however small its writes (at 3 bytes
#: each, 32 MiB of them made a 150 MiB answer, past the 64 MiB a message may take).
WRITE_FRAMING_BYTES = 32


def stored_bytes(is_sqlite: bool) -> ColumnElement[int]:
    """A pending write's bytes in SQL, as ``checkpoints.pending_write_bytes`` counts them: its value's
    length (of a blob: bytes, read from the record's header without the value), its names' UTF-8
    lengths (SQLite's length() of text counts characters) and WRITE_FRAMING_BYTES."""

    def size(column):
        return func.length(cast(column, LargeBinary)) if is_sqlite else func.octet_length(column)

    row = PendingWriteRow
    return (func.length(row.value) + size(row.channel) + size(row.task_id) + size(row.value_type)
            + size(row.task_path) + WRITE_FRAMING_BYTES)
