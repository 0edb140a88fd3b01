"""How LangGraph's data is laid out on checkpointd's contract, in one place (a saver in another
language must follow the same layout to share threads with this one).

- A thread is a plan. LangGraph thread ids are arbitrary strings while plan ids are ULIDs, so the
  plan id is derived: the first 128 bits of SHA-256("langgraph-thread\\0" + thread_id) in ULID form.
  Deterministic, so every process (and a saver in any language) finds the thread's plan with no
  lookup table to keep consistent, and the contract's plan ids stay ULIDs.
- A LangGraph checkpoint is a checkpointd checkpoint. Its state is an envelope (msgpack): the
  thread id, namespace, checkpoint id, parent id, and the checkpoint and metadata as the saver's
  serializer wrote them (type, bytes). Labels make it findable on the server: the record kind, the
  checkpoint id, the namespace (or its digest, when longer than a label value may be) and the
  metadata's scalar entries, typed (``metadata_label``), so a list's filter and delete_for_runs
  (``run_id``) run on the server; the saver checks every match against the exact metadata.
- Pending writes are the checkpoint's (PutPendingWrites / ListPendingWrites): the write's task id,
  index (LangGraph's, negative for its special channels), channel, the serializer's type and bytes,
  and task path. They are deleted with the checkpoint.
"""

from __future__ import annotations

import hashlib
import re
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import ormsgpack

from checkpointd_client.ids import _CROCKFORD_BASE32

ENVELOPE_FORMAT = "checkpointd.langgraph/1"
KIND_LABEL = "langgraph_record"
CHECKPOINT_LABEL = "langgraph_checkpoint_id"
NAMESPACE_LABEL = "langgraph_ns"
#: Metadata entries, one label each (``metadata_label``): a list's filter runs on the server.
METADATA_LABEL_PREFIX = "langgraph_md."
#: Set on a record whose metadata had more label-able entries than fit.
PARTIAL_LABEL = "langgraph_md_partial"
CHECKPOINT_KIND = "checkpoint"
#: checkpointd's limit on a label value.
MAX_LABEL_VALUE = 256
MAX_LABELS = 64
_LABEL_KEY = re.compile(r"[a-z][a-z0-9_./-]{0,62}")
SOURCE_TOOL = "langgraph"


def _ulid_shaped(seed: str) -> str:
    value = int.from_bytes(hashlib.sha256(seed.encode()).digest()[:16], "big")
    return "".join(_CROCKFORD_BASE32[(value >> shift) & 31] for shift in range(125, -1, -5))


def thread_plan_id(thread_id: str) -> str:
    """The plan that holds a LangGraph thread's checkpoints (and, with a workspace, its files)."""
    return _ulid_shaped("langgraph-thread\0" + str(thread_id))


def label_value(text: str) -> str:
    """``text`` as a label value: itself when short enough, else its digest (the exact text is in
    the record's state, which the saver checks)."""
    if len(text) <= MAX_LABEL_VALUE:
        return text
    return "sha256:" + hashlib.sha256(text.encode()).hexdigest()


def quoted(text: str) -> str:
    return '"' + text.replace("\\", "\\\\").replace('"', '\\"') + '"'


def label_filter(**labels: str) -> str:
    """An AIP-160 filter selecting checkpoints by label values."""
    return " AND ".join(f"labels.{key} = {quoted(value)}" for key, value in labels.items())


def metadata_label(key: str, value: Any) -> tuple[str, str] | None:
    """A metadata entry as a label the server can filter on, typed so that 1, True and "1" differ
    ("i:1", "b:true", "s:1"); None for an entry that cannot be one (another type, a key that is not
    a label key, a value too long). The saver checks every match against the exact metadata."""
    label_key = METADATA_LABEL_PREFIX + key
    if not _LABEL_KEY.fullmatch(label_key):
        return None
    if isinstance(value, bool):
        text = "b:true" if value else "b:false"
    elif isinstance(value, int) or (isinstance(value, float) and value.is_integer()):
        text = f"i:{int(value)}"  # 1.0 == 1, as a filter compares them
    elif isinstance(value, str):
        text = "s:" + value
    else:
        return None
    return (label_key, text) if len(text) <= MAX_LABEL_VALUE else None


def checkpoint_labels(checkpoint_id: str, ns: str, metadata: Mapping[str, Any]) -> dict[str, str]:
    """The labels of a checkpoint's record: its kind, id and namespace, and every metadata entry
    that can be a label. When those are more than a checkpoint may carry, none is set and the record
    is marked partial (a filter then reads it whatever its metadata)."""
    labels = {KIND_LABEL: CHECKPOINT_KIND, CHECKPOINT_LABEL: label_value(checkpoint_id),
              NAMESPACE_LABEL: label_value(ns)}
    entries = [entry for key, value in metadata.items() if (entry := metadata_label(key, value))]
    if len(labels) + len(entries) < MAX_LABELS:
        labels.update(entries)
    else:
        labels[PARTIAL_LABEL] = "true"
    return labels


@dataclass(frozen=True)
class CheckpointEnvelope:
    thread_id: str
    ns: str
    checkpoint_id: str
    parent_id: str | None
    checkpoint: tuple[str, bytes]
    metadata: tuple[str, bytes]

    def dumps(self) -> bytes:
        return ormsgpack.packb({
            "format": ENVELOPE_FORMAT, "thread_id": self.thread_id, "ns": self.ns, "id": self.checkpoint_id,
            "parent": self.parent_id, "checkpoint": list(self.checkpoint), "metadata": list(self.metadata),
        })

    @classmethod
    def loads(cls, data: bytes) -> CheckpointEnvelope | None:
        """The envelope in a checkpoint's state; None when the state is not one (not written by a saver)."""
        try:
            raw = ormsgpack.unpackb(data)
        except ormsgpack.MsgpackDecodeError:
            return None
        if not isinstance(raw, dict) or raw.get("format") != ENVELOPE_FORMAT:
            return None
        return cls(raw["thread_id"], raw["ns"], raw["id"], raw["parent"], tuple(raw["checkpoint"]),
                   tuple(raw["metadata"]))
