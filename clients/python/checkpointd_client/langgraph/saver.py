"""CheckpointdSaver: a LangGraph checkpointer that keeps a thread's checkpoints (and, given a
workspace, the files the graph's nodes change) in checkpointd, so that time travel rewinds both.

The layout on checkpointd's contract is in ``records``. The async methods run the sync ones on a
worker thread: the calls are short unary RPCs on one shared channel.
"""

from __future__ import annotations

import asyncio
import os
import random
import threading
import time
from collections.abc import AsyncIterator, Iterator, Sequence
from typing import Any

import grpc
from langchain_core.runnables import RunnableConfig
from langgraph.checkpoint.base import (
    WRITES_IDX_MAP,
    BaseCheckpointSaver,
    ChannelVersions,
    Checkpoint,
    CheckpointMetadata,
    CheckpointTuple,
    get_checkpoint_id,
    get_checkpoint_metadata,
)
from langgraph.checkpoint.serde.base import SerializerProtocol

from checkpoint.v1 import checkpoint_service_pb2 as pb
from checkpointd_client.client import DEFAULT_DEADLINE_S, CheckpointClient, open_channel
from checkpointd_client.errors import CheckpointdRpcError
from checkpointd_client.langgraph import records
from checkpointd_client.langgraph.records import (
    CHECKPOINT_KIND,
    CHECKPOINT_LABEL,
    KIND_LABEL,
    NAMESPACE_LABEL,
    CheckpointEnvelope,
    label_filter,
    label_value,
    thread_plan_id,
)
from checkpointd_client.targets import default_target

PRUNE_STRATEGIES = ("keep_latest", "delete")
#: LangGraph checkpoints whose checkpointd id the saver remembers (the newest put).
REMEMBERED_CHECKPOINTS = 4096
#: checkpointd's limit on the terms of a filter.
MAX_FILTER_TERMS = 16
#: Records asked for per ListCheckpoints call: LangGraph copies a run's metadata into every
#: checkpoint's labels, so a page of a long thread can be large.
LIST_PAGE_SIZE = 100
#: Keys LangGraph puts in the config of a running graph (langgraph._internal._constants).
RUNTIME_KEY = "__pregel_runtime"
DURABILITY_KEY = "__pregel_durability"


def _thread_root_mismatch(thread_id: str, plan_id: str, error: CheckpointdRpcError) -> CheckpointdRpcError:
    """The server's WORKSPACE_ROOT_MISMATCH, said of the LangGraph thread (whose plan id the caller
    never chose): same code, reason and metadata, so code matching on them is unaffected."""
    recorded = error.metadata.get("plan_workspace_root", "")
    asked = error.metadata.get("workspace_root", "")
    return CheckpointdRpcError(
        error.method, error.code,
        f"LangGraph thread {thread_id!r} (checkpointd plan {plan_id}) already has workspace_root {recorded!r}, "
        f"not {asked!r}: use that directory for this thread, leave workspace_root out (of the saver and the "
        f"thread's config) to keep it, or use a new thread_id for {asked!r}",
        reason=error.reason, domain=error.domain, metadata=error.metadata)


class _AsyncMethods:
    """LangGraph's async interface over the sync methods, each run on a worker thread: the calls
    are short unary RPCs on one shared channel."""

    async def aget_tuple(self, config: RunnableConfig) -> CheckpointTuple | None:
        return await asyncio.to_thread(self.get_tuple, config)

    async def alist(
        self,
        config: RunnableConfig | None,
        *,
        filter: dict[str, Any] | None = None,  # noqa: A002
        before: RunnableConfig | None = None,
        limit: int | None = None,
    ) -> AsyncIterator[CheckpointTuple]:
        found = await asyncio.to_thread(lambda: list(self.list(config, filter=filter, before=before, limit=limit)))
        for item in found:
            yield item

    async def aput(
        self, config: RunnableConfig, checkpoint: Checkpoint, metadata: CheckpointMetadata,
        new_versions: ChannelVersions,
    ) -> RunnableConfig:
        return await asyncio.to_thread(self.put, config, checkpoint, metadata, new_versions)

    async def aput_writes(
        self, config: RunnableConfig, writes: Sequence[tuple[str, Any]], task_id: str, task_path: str = ""
    ) -> None:
        await asyncio.to_thread(self.put_writes, config, writes, task_id, task_path)

    async def adelete_thread(self, thread_id: str) -> None:
        await asyncio.to_thread(self.delete_thread, thread_id)

    async def adelete_for_runs(self, run_ids: Sequence[str]) -> None:
        await asyncio.to_thread(self.delete_for_runs, run_ids)

    async def acopy_thread(self, source_thread_id: str, target_thread_id: str) -> None:
        await asyncio.to_thread(self.copy_thread, source_thread_id, target_thread_id)

    async def aprune(self, thread_ids: Sequence[str], *, strategy: str = "keep_latest") -> None:
        await asyncio.to_thread(self.prune, thread_ids, strategy=strategy)


class CheckpointdSaver(_AsyncMethods, BaseCheckpointSaver[str]):
    """LangGraph checkpointer on a checkpointd server at ``target`` (as for ``Checkpointd``).

    With ``workspace_root`` (or ``config["configurable"]["workspace_root"]`` per thread: an
    absolute path on the server's host, under one of its ``--workspace-root`` directories), every
    checkpoint LangGraph puts also captures that directory's files, and ``rewind(config)`` brings
    them back as they were at the checkpoint ``config`` names. With ``rewind_forks``, a checkpoint
    put outside a run on an older parent (``graph.update_state`` on an earlier checkpoint: a fork)
    first rewinds the files to that parent, so the fork starts from the files of its step.
    """

    def __init__(
        self,
        target: str | None = None,
        *,
        token: str | None = None,
        workspace_root: str | os.PathLike[str] | None = None,
        serde: SerializerProtocol | None = None,
        deadline_s: float = DEFAULT_DEADLINE_S,
        credentials: grpc.ChannelCredentials | None = None,
        server_name: str | None = None,
        rewind_forks: bool = False,
    ) -> None:
        super().__init__(serde=serde)
        self.rewind_forks = rewind_forks
        self.target = target or default_target()
        # Absolute, as the server wants it; a relative path means one under this process's directory.
        self.workspace_root = os.path.abspath(workspace_root) if workspace_root is not None else None
        self._channel = open_channel(self.target, credentials=credentials, server_name=server_name)
        self.client = CheckpointClient(self._channel, deadline_s=deadline_s, token=token)
        self.deadline_s = deadline_s
        self._recorded: dict[tuple[str, str, str], str] = {}
        self._recorded_changed = threading.Condition()

    def close(self) -> None:
        self._channel.close()

    def __enter__(self) -> CheckpointdSaver:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()

    # -- put -------------------------------------------------------------------------------

    def put(
        self, config: RunnableConfig, checkpoint: Checkpoint, metadata: CheckpointMetadata,
        new_versions: ChannelVersions,
    ) -> RunnableConfig:
        configurable = config["configurable"]
        thread_id, ns = str(configurable["thread_id"]), configurable.get("checkpoint_ns", "")
        checkpoint_id = checkpoint["id"]
        if len(checkpoint_id) > records.MAX_LABEL_VALUE:
            raise ValueError(f"checkpoint ids longer than {records.MAX_LABEL_VALUE} characters are not supported")
        thread_root = configurable.get("workspace_root")
        workspace_root = os.path.abspath(thread_root) if thread_root else self.workspace_root
        if workspace_root and _saved_while_the_next_step_runs(configurable):
            raise ValueError(
                "a LangGraph thread with a workspace_root must run with durability='sync' (or 'exit'): with the "
                "default 'async' a checkpoint is saved while the next step runs, and its files could include what "
                "that step writes. Pass durability='sync' to invoke/stream.")
        parent_id = configurable.get("checkpoint_id")
        if self.rewind_forks and workspace_root and parent_id and RUNTIME_KEY not in configurable:
            self._rewind_if_fork(thread_id, ns, parent_id)
        stored_metadata = get_checkpoint_metadata(config, metadata)
        envelope = CheckpointEnvelope(
            thread_id, ns, checkpoint_id, configurable.get("checkpoint_id"),
            self.serde.dumps_typed(checkpoint), self.serde.dumps_typed(stored_metadata))
        plan_id = thread_plan_id(thread_id)
        description = f"LangGraph checkpoint {checkpoint_id} (namespace {ns!r}, step {stored_metadata.get('step')})"
        try:
            created = self.client.create_checkpoint(
                plan_id,
                source_tool=records.SOURCE_TOOL,
                labels=records.checkpoint_labels(checkpoint_id, ns, stored_metadata),
                description=description,
                state=envelope.dumps(),
                workspace_root=workspace_root,
            )
        except CheckpointdRpcError as error:
            if error.reason != "WORKSPACE_ROOT_MISMATCH":
                raise
            raise _thread_root_mismatch(thread_id, plan_id, error) from error
        self._remember(plan_id, ns, checkpoint_id, created.checkpoint_id)
        return _config(thread_id, ns, checkpoint_id)

    def put_writes(
        self, config: RunnableConfig, writes: Sequence[tuple[str, Any]], task_id: str, task_path: str = ""
    ) -> None:
        configurable = config["configurable"]
        thread_id, ns = str(configurable["thread_id"]), configurable.get("checkpoint_ns", "")
        recorded = self._recorded_id(thread_plan_id(thread_id), ns, configurable["checkpoint_id"])
        stored = []
        for index, (channel, value) in enumerate(writes):
            value_type, encoded = self.serde.dumps_typed(value)
            stored.append(pb.PendingWrite(task_id=task_id, index=WRITES_IDX_MAP.get(channel, index), channel=channel,
                                          value_type=value_type, value=encoded, task_path=task_path))
        self.client.put_pending_writes(recorded, stored)

    def _recorded_id(self, plan_id: str, ns: str, checkpoint_id: str) -> str:
        """The checkpointd checkpoint of a LangGraph checkpoint. Under LangGraph's "async" durability
        a task's writes can come while the checkpoint they follow is still being put by another
        thread of this process: they wait for it (as long as one call's deadline)."""
        key = (plan_id, ns, checkpoint_id)
        deadline = time.monotonic() + self.deadline_s
        while True:
            with self._recorded_changed:
                if key in self._recorded:
                    return self._recorded[key]
            found = self._records(plan_id, ns=ns, checkpoint_id=checkpoint_id)
            if found:
                return found[0].checkpoint_id
            left = deadline - time.monotonic()
            if left <= 0:
                raise LookupError(f"no checkpoint {checkpoint_id} in namespace {ns!r} of the thread of plan "
                                  f"{plan_id}: put it before its writes")
            with self._recorded_changed:
                if key not in self._recorded:
                    self._recorded_changed.wait(min(left, 0.5))

    def _remember(self, plan_id: str, ns: str, checkpoint_id: str, recorded: str) -> None:
        with self._recorded_changed:
            self._recorded[(plan_id, ns, checkpoint_id)] = recorded
            while len(self._recorded) > REMEMBERED_CHECKPOINTS:
                del self._recorded[next(iter(self._recorded))]
            self._recorded_changed.notify_all()

    # -- read ------------------------------------------------------------------------------

    def get_tuple(self, config: RunnableConfig) -> CheckpointTuple | None:
        configurable = config["configurable"]
        thread_id, ns = str(configurable["thread_id"]), configurable.get("checkpoint_ns", "")
        checkpoint_id = get_checkpoint_id(config)
        plan_id = thread_plan_id(thread_id)
        if checkpoint_id:
            candidates = self._records(plan_id, ns=ns, checkpoint_id=checkpoint_id)
        else:
            candidates = _latest_first(self._records(plan_id, ns=ns))
        for record in candidates:
            found = self._load(record, ns)
            if found is not None:
                return self._tuple(thread_id, found, self._writes(_same_checkpoint(record, candidates)))
        return None

    def list(
        self,
        config: RunnableConfig | None,
        *,
        filter: dict[str, Any] | None = None,  # noqa: A002 - LangGraph's parameter name
        before: RunnableConfig | None = None,
        limit: int | None = None,
    ) -> Iterator[CheckpointTuple]:
        configurable = (config or {}).get("configurable", {})
        if "thread_id" in configurable:
            plan_ids = [thread_plan_id(str(configurable["thread_id"]))]
        else:
            # Every thread, as LangGraph's own savers list them for no thread: one ListCheckpoints per
            # plan the server knows (plans that are not LangGraph threads hold no such records).
            plan_ids = [plan.plan_id for plan in self.client.list_plans()]
        ns = configurable.get("checkpoint_ns")
        checkpoint_id = get_checkpoint_id(config) if config else None
        found: list[pb.Checkpoint] = []
        for plan_id in plan_ids:
            found += self._records(plan_id, ns=ns, checkpoint_id=checkpoint_id, metadata=filter)
            if filter:
                # Records whose metadata did not fit in labels are judged on their state.
                found += self._records(plan_id, ns=ns, checkpoint_id=checkpoint_id,
                                       extra={records.PARTIAL_LABEL: "true"})
        everything = _latest_first(list({record.checkpoint_id: record for record in found}.values()))
        # A checkpoint put more than once (a retried put) is one checkpoint: its last put.
        newest: dict[tuple[str, str], pb.Checkpoint] = {}
        for record in everything:
            newest.setdefault(_checkpoint_key(record), record)
        candidates = list(newest.values())
        before_id = get_checkpoint_id(before) if before else None
        if before_id:
            candidates = [r for r in candidates if r.labels[CHECKPOINT_LABEL] < before_id]
        yielded = 0
        for record in candidates:
            if limit is not None and yielded >= limit:
                return
            found = self._load(record, ns)
            if found is None:
                continue
            metadata = self.serde.loads_typed(found.metadata)
            if filter and not all(key in metadata and _same(metadata[key], value) for key, value in filter.items()):
                continue
            yield self._tuple(found.thread_id, found, self._writes(_same_checkpoint(record, everything)), metadata)
            yielded += 1

    def _records(self, plan_id: str, *, ns: str | None = None, checkpoint_id: str | None = None,
                 metadata: dict[str, Any] | None = None, extra: dict[str, str] | None = None) -> list[pb.Checkpoint]:
        """The thread's LangGraph checkpoints (without state) that the labels select, newest first:
        a superset of those with these namespace, id and metadata entries (the caller checks)."""
        labels = {KIND_LABEL: CHECKPOINT_KIND, **(extra or {})}
        if ns is not None:
            labels[NAMESPACE_LABEL] = label_value(ns)
        if checkpoint_id:
            labels[CHECKPOINT_LABEL] = label_value(checkpoint_id)
        for key, value in (metadata or {}).items():
            entry = records.metadata_label(key, value)
            if entry is not None and len(labels) < MAX_FILTER_TERMS:
                labels[entry[0]] = entry[1]
        return self.client.list_checkpoints(plan_id, filter_expr=label_filter(**labels), page_size=LIST_PAGE_SIZE)

    def _load(self, record: pb.Checkpoint, ns: str | None) -> CheckpointEnvelope | None:
        full = self.client.get_checkpoint(record.checkpoint_id, full=True)
        envelope = CheckpointEnvelope.loads(full.state)
        if envelope is None or (ns is not None and envelope.ns != ns):
            return None
        return envelope

    def _writes(self, recorded: list[pb.Checkpoint]) -> list[tuple[str, str, Any]]:
        """The pending writes of a LangGraph checkpoint (those of each of its records, oldest first,
        if it was put more than once: as the server does for one record, a repeated (task, index)
        keeps its first value, or its last when the index is negative), in LangGraph's order
        (``writes_sort_key``, as the server lists them)."""
        merged: dict[tuple[str, int], pb.PendingWrite] = {}
        for record in sorted(recorded, key=lambda r: r.sequence):
            for write in self.client.list_pending_writes(record.checkpoint_id):
                key = (write.task_id, write.index)
                if write.index < 0 or key not in merged:
                    merged[key] = write
        ordered = sorted(merged.values(), key=lambda w: (w.task_path, w.task_id, w.index))
        return [(w.task_id, w.channel, self.serde.loads_typed((w.value_type, w.value))) for w in ordered]

    def _tuple(self, thread_id: str, envelope: CheckpointEnvelope, writes: list[tuple[str, str, Any]],
               metadata: CheckpointMetadata | None = None) -> CheckpointTuple:
        return CheckpointTuple(
            config=_config(thread_id, envelope.ns, envelope.checkpoint_id),
            checkpoint=self.serde.loads_typed(envelope.checkpoint),
            metadata=metadata if metadata is not None else self.serde.loads_typed(envelope.metadata),
            parent_config=_config(thread_id, envelope.ns, envelope.parent_id) if envelope.parent_id else None,
            pending_writes=writes,
        )

    # -- delete, copy, prune ----------------------------------------------------------------

    def delete_thread(self, thread_id: str) -> None:
        # Pending writes go with their checkpoints.
        self.client.delete_checkpoints(plan_id=thread_plan_id(str(thread_id)))

    def delete_for_runs(self, run_ids: Sequence[str]) -> None:
        for run_id in run_ids:
            run_label = records.metadata_label("run_id", run_id)
            if run_label is None:
                raise ValueError(f"run ids longer than {records.MAX_LABEL_VALUE - 2} characters are not supported")
            # Pending writes go with their checkpoints.
            self.client.delete_checkpoints(
                filter_expr=label_filter(**{KIND_LABEL: CHECKPOINT_KIND, run_label[0]: run_label[1]}))

    def copy_thread(self, source_thread_id: str, target_thread_id: str) -> None:
        """Copies every checkpoint and pending write of a thread, oldest first, as state: the files
        of the source thread's checkpoints are not copied (the target keeps its own workspace)."""
        source, target = thread_plan_id(str(source_thread_id)), thread_plan_id(str(target_thread_id))
        # A copy retried (after one that failed part-way) skips the checkpoints it copied already,
        # and puts their writes again (idempotent: they may not all have landed).
        copied_before = {_checkpoint_key(record): record.checkpoint_id
                         for record in sorted(self._records(target), key=lambda r: r.sequence)}
        for record in sorted(self._records(source), key=lambda r: r.sequence):
            recorded = copied_before.get(_checkpoint_key(record))
            if recorded is None:
                envelope = CheckpointEnvelope.loads(self.client.get_checkpoint(record.checkpoint_id, full=True).state)
                if envelope is None:
                    continue
                copied = CheckpointEnvelope(str(target_thread_id), envelope.ns, envelope.checkpoint_id,
                                            envelope.parent_id, envelope.checkpoint, envelope.metadata)
                recorded = self.client.create_checkpoint(
                    target, source_tool=records.SOURCE_TOOL, labels=dict(record.labels),
                    description=record.description, state=copied.dumps()).checkpoint_id
            writes = self.client.list_pending_writes(record.checkpoint_id)
            if writes:
                self.client.put_pending_writes(recorded, writes)

    def prune(self, thread_ids: Sequence[str], *, strategy: str = "keep_latest") -> None:
        """``keep_latest`` keeps the newest checkpoint of each namespace (and its writes);
        ``delete`` deletes the threads. Other checkpoints of the plans (a rewind's safety
        checkpoints) are not LangGraph's and stay."""
        if strategy not in PRUNE_STRATEGIES:
            raise ValueError(f"unknown prune strategy {strategy!r}; use one of {', '.join(PRUNE_STRATEGIES)}")
        for thread_id in thread_ids:
            if strategy == "delete":
                self.delete_thread(thread_id)
                continue
            plan_id = thread_plan_id(str(thread_id))
            kept: set[str] = set()
            for record in _latest_first(self._records(plan_id)):
                if record.labels[NAMESPACE_LABEL] not in kept:
                    kept.add(record.labels[NAMESPACE_LABEL])
                    continue
                self.client.delete_checkpoint(record.checkpoint_id)  # and its pending writes

    # -- workspace -------------------------------------------------------------------------

    def rewind(self, config: RunnableConfig) -> pb.RollbackResponse:
        """Rolls the thread's workspace files back to the checkpoint ``config`` names (its
        ``checkpoint_id``, e.g. from ``graph.get_state_history``). checkpointd records a safety
        checkpoint of the current files first, so the rewind can itself be undone. The graph state
        needs no rewinding: ``graph.invoke(None, config)`` resumes from that checkpoint."""
        configurable = config["configurable"]
        thread_id, ns = str(configurable["thread_id"]), configurable.get("checkpoint_ns", "")
        checkpoint_id = get_checkpoint_id(config)
        if not checkpoint_id:
            raise ValueError("rewind needs config['configurable']['checkpoint_id']: the checkpoint to go back to")
        plan_id = thread_plan_id(thread_id)
        for record in self._records(plan_id, ns=ns, checkpoint_id=checkpoint_id):
            if not record.has_files:
                raise ValueError(f"checkpoint {checkpoint_id} of thread {thread_id!r} has no files: "
                                 "give the saver (or the thread's config) a workspace_root")
            return self.client.rollback(plan_id, record.checkpoint_id, scope=pb.ROLLBACK_SCOPE_FILES)
        raise LookupError(f"thread {thread_id!r} has no checkpoint {checkpoint_id} in namespace {ns!r}")

    def _rewind_if_fork(self, thread_id: str, ns: str, parent_id: str) -> None:
        latest = next(iter(_latest_first(self._records(thread_plan_id(thread_id), ns=ns))), None)
        if latest is not None and latest.labels[CHECKPOINT_LABEL] != label_value(parent_id):
            self.rewind(_config(thread_id, ns, parent_id))

    async def arewind(self, config: RunnableConfig) -> pb.RollbackResponse:
        return await asyncio.to_thread(self.rewind, config)

    # -- versions and async ----------------------------------------------------------------

    def get_next_version(self, current: str | None, channel: None) -> str:
        """Monotonic string versions, as LangGraph's own database savers make them."""
        if current is None:
            number = 0
        elif isinstance(current, int):
            number = current
        else:
            number = int(current.split(".")[0])
        return f"{number + 1:032}.{random.random():016}"


def _saved_while_the_next_step_runs(configurable: dict[str, Any]) -> bool:
    """True for a put from a running graph with LangGraph's "async" durability (its default): the
    graph runs the next step while the checkpoint is saved. A put outside a run (update_state) has
    no runtime in its config."""
    return RUNTIME_KEY in configurable and configurable.get(DURABILITY_KEY, "async") == "async"


def _same(stored: Any, wanted: Any) -> bool:
    """Filter equality, as the server's labels judge it: True is not 1 (Python says it is), 1.0 is."""
    if isinstance(stored, bool) or isinstance(wanted, bool):
        return isinstance(stored, bool) and isinstance(wanted, bool) and stored == wanted
    return stored == wanted


def _config(thread_id: str, ns: str, checkpoint_id: str) -> RunnableConfig:
    return {"configurable": {"thread_id": thread_id, "checkpoint_ns": ns, "checkpoint_id": checkpoint_id}}


def _checkpoint_key(record: pb.Checkpoint) -> tuple[str, str]:
    """The LangGraph checkpoint a record holds: (namespace, checkpoint id), as labelled."""
    return record.labels.get(NAMESPACE_LABEL, ""), record.labels[CHECKPOINT_LABEL]


def _same_checkpoint(record: pb.Checkpoint, found: list[pb.Checkpoint]) -> list[pb.Checkpoint]:
    """``record`` and the other records of ``found`` that hold its LangGraph checkpoint."""
    key = _checkpoint_key(record)
    return [other for other in found if _checkpoint_key(other) == key]


def _latest_first(found: list[pb.Checkpoint]) -> list[pb.Checkpoint]:
    """LangGraph's order, newest checkpoint id first; of records of one id, the last put first."""
    return sorted(found, key=lambda r: (r.labels[CHECKPOINT_LABEL], r.sequence), reverse=True)
