"""Thin interceptors that take automatic checkpoints around a framework's own calls.

Each wraps one kind of call - a tool run, a sub-plan spawn, the Execute phase - and asks its
TriggerPolicy whether to checkpoint. They know nothing about any particular runner: a framework
describes the call with a small dataclass and hands over a callable (`around`) or uses the
context manager (`guard`).

With no CheckpointClient, or no plan_id, an interceptor does nothing at all. The settings applied
are those of the call's plan (a plan's override wins). When checkpointd cannot record a checkpoint
in time (unreachable, deadline exceeded, store full: RESOURCE_EXHAUSTED with reason
STORAGE_EXHAUSTED), `core.checkpoints.on_unavailable` decides: "proceed" logs a warning and carries
on; "refuse" raises CheckpointUnavailableError before a write tool or sub-plan starts. A checkpoint
refused for any other reason (a request over a limit, a workspace outside the server's roots)
stops a write tool or sub-plan even under "proceed". Checkpoints taken after the fact
(after_tool_execute, on_error) cannot stop what already happened, so their failures, whatever
they are, are only logged and never hide the tool's result or the original error.
"""

from __future__ import annotations

import logging
import os
import time
import uuid
from collections.abc import Callable, Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import TypeVar

import grpc

from checkpointd_client.client import Checkpoint, CheckpointClient
from checkpointd_client.errors import CheckpointdRpcError, CheckpointUnavailableError
from checkpointd_client.policy import TriggerPolicy, is_unavailable
from checkpointd_client.vocabulary import AutoTrigger, OnUnavailable

logger = logging.getLogger(__name__)

SUBPLAN_SOURCE_TOOL = "subplan_execution_service"
EXECUTOR_SOURCE_TOOL = "plan_executor"
MAX_LABEL_VALUE = 256
MAX_SOURCE_TOOL = 256
MAX_DESCRIPTION = 4096
# The server's limit on a checkpoint's plan state (CreateCheckpointRequest.state).
MAX_STATE_BYTES = 16 * 1024 * 1024

_Result = TypeVar("_Result")
StateProvider = Callable[[], bytes]
PathLike = str | os.PathLike[str]


def declares_read_only(tool: object) -> bool:
    """True only for a tool whose `read_only` attribute is literally True; anything else may write."""
    return getattr(tool, "read_only", False) is True


def _guards_an_action(trigger: AutoTrigger) -> bool:
    """Whether the checkpoint is taken before the action it protects (so refusing can still stop it)."""
    match trigger:
        case AutoTrigger.BEFORE_TOOL_EXECUTE | AutoTrigger.ON_SUBPLAN_SPAWN:
            return True
        case AutoTrigger.AFTER_TOOL_EXECUTE | AutoTrigger.ON_ERROR:
            return False


def _clip(text: str, limit: int) -> str:
    return text if len(text) <= limit else text[: limit - 1] + "…"


class AutoCheckpointer:
    """Records one automatic checkpoint if the policy allows it, applying on_unavailable."""

    def __init__(self, client: CheckpointClient | None, policy: TriggerPolicy | None = None) -> None:
        self.client = client
        self.policy = policy or TriggerPolicy()

    def record(
        self,
        trigger: AutoTrigger,
        plan_id: str | None,
        *,
        source_tool: str,
        workspace_root: PathLike | None = None,
        plan_state: StateProvider | None = None,
        labels: Mapping[str, str] | None = None,
        description: str = "",
        warnings: list[str] | None = None,
    ) -> Checkpoint | None:
        """The recorded checkpoint, or None when nothing was (or could be) recorded.

        A checkpoint that checkpointd could not record, where on_unavailable lets the action go
        on, is logged and its warning also appended to `warnings` (for a runner that shows it).
        """
        if self.client is None or not plan_id:
            return None
        started = time.monotonic()
        # Waits (bounded) only for settings still being read for the first time in the background.
        settings = self.policy.settings(plan_id)
        if not self.policy.is_enabled(trigger, settings):
            return None
        # One deadline for the whole step: a wait for the settings leaves the checkpoint less time.
        remaining_s = settings.client_deadline_s - (time.monotonic() - started)
        try:
            if remaining_s <= 0:
                raise CheckpointdRpcError(
                    "CreateCheckpoint",
                    grpc.StatusCode.DEADLINE_EXCEEDED,
                    f"checkpointd's settings could not be read within the {settings.client_deadline_s:g} s deadline",
                )
            state = plan_state() if plan_state is not None else b""
            if len(state) > MAX_STATE_BYTES:
                # Refused here as the server refuses it: a state over 32 MiB would not even reach it
                # (gRPC's own RESOURCE_EXHAUSTED for a message over its request limit).
                raise CheckpointdRpcError(
                    "CreateCheckpoint",
                    grpc.StatusCode.INVALID_ARGUMENT,
                    f"state is longer than {MAX_STATE_BYTES}",
                    reason="FIELD_TOO_LONG",
                    metadata={"field": "state", "limit": str(MAX_STATE_BYTES)},
                )
            return self.client.create_checkpoint(
                plan_id,
                trigger=trigger,
                source_tool=_clip(source_tool, MAX_SOURCE_TOOL),
                labels=labels,
                description=_clip(description, MAX_DESCRIPTION),
                state=state,
                workspace_root=os.path.abspath(workspace_root) if workspace_root is not None else None,
                timeout=remaining_s,
            )
        except CheckpointdRpcError as error:
            if not is_unavailable(error):
                raise
            if settings.on_unavailable is OnUnavailable.REFUSE and _guards_an_action(trigger):
                raise CheckpointUnavailableError(trigger, plan_id, error) from error
            warning = (
                f"checkpointd could not record the {trigger.value} checkpoint of plan {plan_id} "
                f"({error.code.name}: {error.message}); proceeding without it"
            )
            logger.warning("%s", warning)
            if warnings is not None:
                warnings.append(warning)
            return None


@dataclass(frozen=True)
class ToolCall:
    """One tool invocation, as the tool interceptor needs to see it."""

    tool_name: str
    plan_id: str | None
    workspace_root: PathLike | None = None
    # Only True itself makes a call read-only (as `declares_read_only`); anything else may write.
    read_only: bool = False
    plan_state: StateProvider | None = None


@dataclass
class ToolCheckpoints:
    """The checkpoints taken around one tool call (None where none was taken), and the warnings
    of any that checkpointd could not record while on_unavailable said to proceed."""

    tool_call_id: str
    before: Checkpoint | None = None
    after: Checkpoint | None = None
    warnings: list[str] = field(default_factory=list)


class ToolCheckpointInterceptor:
    """before_tool_execute before a write tool runs, after_tool_execute once it has succeeded."""

    def __init__(self, client: CheckpointClient | None, policy: TriggerPolicy | None = None) -> None:
        self._checkpointer = AutoCheckpointer(client, policy)

    @property
    def policy(self) -> TriggerPolicy:
        return self._checkpointer.policy

    @contextmanager
    def guard(self, call: ToolCall) -> Iterator[ToolCheckpoints]:
        """Wrap the tool's body; an exception in it skips the after-checkpoint and propagates."""
        taken = self.begin(call)
        yield taken
        self.finish(call, taken)

    def begin(self, call: ToolCall) -> ToolCheckpoints:
        """Step one of `guard`, for a runner that cannot wrap the tool in a `with` (an async one):
        the before_tool_execute checkpoint of a write tool. Raises CheckpointUnavailableError
        when the tool must not run."""
        taken = ToolCheckpoints(tool_call_id=uuid.uuid4().hex)
        if call.read_only is not True:
            taken.before = self._record(AutoTrigger.BEFORE_TOOL_EXECUTE, call, taken)
        return taken

    def finish(self, call: ToolCall, taken: ToolCheckpoints) -> ToolCheckpoints:
        """Step two of `guard`, only once the tool has succeeded: the after_tool_execute checkpoint.

        Never raises (an Exception): the tool has run, so a checkpoint that could not be recorded,
        for whatever reason, is a warning (logged and in `taken.warnings`), never an error that
        would hide the tool's result."""
        if call.read_only is not True:
            try:
                taken.after = self._record(AutoTrigger.AFTER_TOOL_EXECUTE, call, taken)
            except Exception as error:  # noqa: BLE001 - the write happened: whatever failed only warns
                warning = (
                    f"the after_tool_execute checkpoint of plan {call.plan_id} could not be recorded "
                    f"({error}); the tool's result stands"
                )
                logger.warning("%s", warning)
                taken.warnings.append(warning)
        return taken

    def around(self, call: ToolCall, run: Callable[[], _Result]) -> _Result:
        with self.guard(call):
            return run()

    def _record(self, trigger: AutoTrigger, call: ToolCall, taken: ToolCheckpoints) -> Checkpoint | None:
        return self._checkpointer.record(
            trigger,
            call.plan_id,
            source_tool=call.tool_name,
            workspace_root=call.workspace_root,
            plan_state=call.plan_state,
            labels={"tool_call_id": taken.tool_call_id},
            description=f"{trigger.value} {call.tool_name}",
            warnings=taken.warnings,
        )


@dataclass(frozen=True)
class SubplanSpawn:
    """A sub-plan about to be started by a parent plan."""

    parent_plan_id: str | None
    child_plan_id: str
    workspace_root: PathLike | None = None
    plan_state: StateProvider | None = None
    goal: str = ""
    labels: Mapping[str, str] = field(default_factory=dict)


class SubplanCheckpointInterceptor:
    """One on_subplan_spawn checkpoint on the PARENT plan for every sub-plan it spawns."""

    def __init__(
        self,
        client: CheckpointClient | None,
        policy: TriggerPolicy | None = None,
        *,
        source_tool: str = SUBPLAN_SOURCE_TOOL,
    ) -> None:
        self._checkpointer = AutoCheckpointer(client, policy)
        self._source_tool = source_tool

    @property
    def policy(self) -> TriggerPolicy:
        return self._checkpointer.policy

    @contextmanager
    def guard(self, spawn: SubplanSpawn) -> Iterator[Checkpoint | None]:
        """Checkpoint the parent, then run the sub-plan's body."""
        yield self._checkpointer.record(
            AutoTrigger.ON_SUBPLAN_SPAWN,
            spawn.parent_plan_id,
            source_tool=self._source_tool,
            workspace_root=spawn.workspace_root,
            plan_state=spawn.plan_state,
            labels={**spawn.labels, "child_plan_id": spawn.child_plan_id},
            description=_clip(
                f"spawning sub-plan {spawn.child_plan_id}" + (f": {spawn.goal}" if spawn.goal else ""),
                MAX_DESCRIPTION,
            ),
        )

    def around(self, spawn: SubplanSpawn, run: Callable[[], _Result]) -> _Result:
        with self.guard(spawn):
            return run()


@dataclass(frozen=True)
class ExecutePhase:
    """A plan's Execute phase, as the executor interceptor needs to see it."""

    plan_id: str | None
    workspace_root: PathLike | None = None
    plan_state: StateProvider | None = None


class ExecutorCheckpointInterceptor:
    """An on_error checkpoint when the Execute phase raises; the original exception always propagates."""

    def __init__(
        self,
        client: CheckpointClient | None,
        policy: TriggerPolicy | None = None,
        *,
        source_tool: str = EXECUTOR_SOURCE_TOOL,
    ) -> None:
        self._checkpointer = AutoCheckpointer(client, policy)
        self._source_tool = source_tool

    @property
    def policy(self) -> TriggerPolicy:
        return self._checkpointer.policy

    @contextmanager
    def guard(self, phase: ExecutePhase) -> Iterator[None]:
        try:
            yield
        except Exception as error:
            self._record_failure(phase, error)
            raise

    def around(self, phase: ExecutePhase, run: Callable[[], _Result]) -> _Result:
        with self.guard(phase):
            return run()

    def _record_failure(self, phase: ExecutePhase, error: Exception) -> None:
        error_type = type(error).__qualname__
        if type(error).__module__ != "builtins":
            error_type = f"{type(error).__module__}.{error_type}"
        try:
            self._checkpointer.record(
                AutoTrigger.ON_ERROR,
                phase.plan_id,
                source_tool=self._source_tool,
                workspace_root=phase.workspace_root,
                plan_state=phase.plan_state,
                labels={"error_type": _clip(error_type, MAX_LABEL_VALUE)},
                description=_clip(f"{error_type}: {error}", MAX_DESCRIPTION),
            )
        except Exception as checkpoint_error:
            logger.error("the on_error checkpoint of plan %s failed: %s", phase.plan_id, checkpoint_error)
            error.add_note(f"checkpointd: the on_error checkpoint could not be recorded: {checkpoint_error}")
