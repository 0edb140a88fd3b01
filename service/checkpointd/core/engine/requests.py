"""What the engine's callers send and get back: requests, checkpoints, rollback results, the
engine's settings. The servicer converts protobuf messages to and from these."""

from __future__ import annotations

import enum
from dataclasses import dataclass, field
from pathlib import Path

from checkpointd.core.engine.nesting import NestedWorkspace
from checkpointd.core.engine.records import CheckpointRecord
from checkpointd.core.kernel.vocabulary import Phase, Trigger
from checkpointd.core.metadata.models import CheckpointRow
from checkpointd.core.store.tree import Change


class Scope(enum.Enum):
    FILES = "files"
    STATE = "state"
    FILES_AND_STATE = "files_and_state"

    @property
    def files(self) -> bool:
        return self is not Scope.STATE

    @property
    def state(self) -> bool:
        return self is not Scope.FILES


@dataclass(frozen=True)
class CreateRequest:
    plan_id: str
    trigger: Trigger | None = None
    phase: Phase | None = None
    source_tool: str = ""
    labels: dict[str, str] = field(default_factory=dict)
    description: str = ""
    state: bytes = b""
    workspace_root: str = ""
    request_id: str = ""


@dataclass(frozen=True)
class RollbackRequest:
    plan_id: str
    checkpoint_id: str
    scope: Scope = Scope.FILES_AND_STATE
    paths: tuple[str, ...] = ()
    dry_run: bool = False
    request_id: str = ""
    current_state: bytes = b""
    #: Let the changes reach into another plan's workspace (see ``nesting``).
    allow_nested_workspaces: bool = False


@dataclass(frozen=True)
class Checkpoint:
    row: CheckpointRow | CheckpointRecord
    state: bytes | None = None


@dataclass(frozen=True)
class RollbackResult:
    changes: list[Change]
    state: bytes
    safety: Checkpoint | None
    dry_run: bool
    #: Other plans' workspaces the changes reach into (allowed by the request).
    nested: list[NestedWorkspace] = field(default_factory=list)


@dataclass(frozen=True)
class EngineSettings:
    data_dir: Path
    allowed_roots: tuple[str, ...]
    #: Watch workspaces (inotify) so that a capture re-examines only what changed.
    watcher: bool = True
    #: Seconds between rechecks of the watched workspaces' files (capture.recheck); 0 for none.
    recheck_interval_seconds: float = 0.0
