"""The proxy's own tools, so an agent (or the human watching it) can inspect and undo its steps.

checkpoint_list and checkpoint_diff only read; checkpoint_rollback is a dry run unless called with
`confirm: true`, and then checkpointd records a safety checkpoint first, so a rollback can itself
be rolled back. Their results are plain text meant to be read by a model and a person alike.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping, Sequence
from datetime import UTC
from functools import partial
from typing import Any

import anyio
import grpc

from checkpoint.v1 import checkpoint_service_pb2 as pb
from checkpointd_client.client import Checkpoint, CheckpointClient, FileChange
from checkpointd_client.errors import CheckpointdRpcError
from checkpointd_client.patches import format_patch
from checkpointd_client.targets import unreachable_hint
from checkpointd_client.vocabulary import trigger_name

LIST_TOOL = "checkpoint_list"
DIFF_TOOL = "checkpoint_diff"
ROLLBACK_TOOL = "checkpoint_rollback"
NAMES = (LIST_TOOL, DIFF_TOOL, ROLLBACK_TOOL)
#: How the proxy is pointed at another checkpointd (the hint of a call nothing answered).
PROXY_POINT_WITH = "restart the proxy with --target HOST:PORT or --target unix:///PATH (env CHECKPOINTD_TARGET)"
DEFAULT_LIST_LIMIT = 20
MAX_LIST_LIMIT = 1000
# A diff or dry run listing more paths than this says how many more there are instead.
MAX_LISTED_CHANGES = 200
# A diff with patch: true shows at most this many characters of changed lines (a model's context
# is finite; the server already bounds each file and each response).
MAX_PATCH_CHARS = 100_000

_CHECKPOINT_ID = {"type": "string", "description": "a checkpoint id (a ULID) from checkpoint_list"}
_PATHS = {
    "type": "array",
    "items": {"type": "string"},
    "description": "only these workspace-relative paths (and what is under them); default: the whole workspace",
}


def definitions(plan_id: str) -> list[dict[str, Any]]:
    """The three tools as MCP tool objects (wire form)."""
    return [
        {
            "name": LIST_TOOL,
            "title": "List checkpoints",
            "description": (
                f"List the checkpoints of this session (plan {plan_id}), newest first. checkpointd takes one "
                "before and one after every tool call that may write to the workspace; each line shows the "
                "checkpoint id, when, why (trigger) and which tool. Use the ids with checkpoint_diff and "
                "checkpoint_rollback."
            ),
            "inputSchema": {
                "type": "object",
                "properties": {
                    "limit": {
                        "type": "integer",
                        "minimum": 1,
                        "maximum": MAX_LIST_LIMIT,
                        "description": f"how many to show (default {DEFAULT_LIST_LIMIT})",
                    }
                },
                "additionalProperties": False,
            },
            "annotations": {"title": "List checkpoints", "readOnlyHint": True, "openWorldHint": False},
        },
        {
            "name": DIFF_TOOL,
            "title": "Diff since a checkpoint",
            "description": (
                "Show which workspace paths changed between a checkpoint and the workspace as it is now, or "
                "another checkpoint (target_checkpoint_id): added, modified, deleted, type changed. With "
                "patch: true, also the changed lines of each text file, as a unified diff."
            ),
            "inputSchema": {
                "type": "object",
                "properties": {
                    "checkpoint_id": _CHECKPOINT_ID,
                    "target_checkpoint_id": {
                        **_CHECKPOINT_ID,
                        "description": "the newer side; default: the workspace as it is now",
                    },
                    "paths": _PATHS,
                    "patch": {
                        "type": "boolean",
                        "default": False,
                        "description": "true also shows the changed lines (binary and very large files are "
                        "named, not shown)",
                    },
                },
                "required": ["checkpoint_id"],
                "additionalProperties": False,
            },
            "annotations": {"title": "Diff since a checkpoint", "readOnlyHint": True, "openWorldHint": False},
        },
        {
            "name": ROLLBACK_TOOL,
            "title": "Roll back to a checkpoint",
            "description": (
                "Restore the workspace files to a checkpoint. Without confirm it is a dry run that only "
                "lists what would change; with confirm: true it applies, after checkpointd records a safety "
                "checkpoint of the workspace as it is, so the rollback itself can be undone."
            ),
            "inputSchema": {
                "type": "object",
                "properties": {
                    "checkpoint_id": _CHECKPOINT_ID,
                    "confirm": {
                        "type": "boolean",
                        "default": False,
                        "description": "true applies the rollback; false (the default) is a dry run",
                    },
                    "paths": _PATHS,
                },
                "required": ["checkpoint_id"],
                "additionalProperties": False,
            },
            "annotations": {
                "title": "Roll back to a checkpoint",
                "readOnlyHint": False,
                "destructiveHint": True,
                "idempotentHint": False,
                "openWorldHint": False,
            },
        },
    ]


def text_result(text: str, *, is_error: bool = False) -> dict[str, Any]:
    return {"content": [{"type": "text", "text": text}], "isError": is_error}


class InvalidArguments(ValueError):
    """Arguments outside a tool's input schema."""


def _string(arguments: Mapping[str, Any], name: str, *, required: bool) -> str:
    value = arguments.get(name)
    if value is None and not required:
        return ""
    if not isinstance(value, str) or not value:
        raise InvalidArguments(f"{name} must be a non-empty string, got {value!r}")
    return value


def _paths(arguments: Mapping[str, Any]) -> list[str]:
    value = arguments.get("paths")
    if value is None:
        return []
    if not isinstance(value, list) or not all(isinstance(path, str) and path for path in value):
        raise InvalidArguments(f"paths must be a list of non-empty strings, got {value!r}")
    return value


def _limit(arguments: Mapping[str, Any]) -> int:
    value = arguments.get("limit", DEFAULT_LIST_LIMIT)
    if isinstance(value, bool) or not isinstance(value, int | float) or not math.isfinite(value) \
            or value != int(value):
        raise InvalidArguments(f"limit must be an integer, got {value!r}")
    if not 1 <= value <= MAX_LIST_LIMIT:
        raise InvalidArguments(f"limit must be between 1 and {MAX_LIST_LIMIT}, got {value!r}")
    return int(value)


def _flag(arguments: Mapping[str, Any], name: str) -> bool:
    value = arguments.get(name, False)
    if not isinstance(value, bool):
        raise InvalidArguments(f"{name} must be true or false, got {value!r}")
    return value


def _unknown_arguments(arguments: Mapping[str, Any], allowed: Sequence[str]) -> None:
    unknown = sorted(set(arguments) - set(allowed))
    if unknown:
        raise InvalidArguments(f"unknown arguments {unknown}; allowed: {list(allowed)}")


def _when(checkpoint: Checkpoint) -> str:
    if not checkpoint.HasField("create_time"):
        return "?"
    return checkpoint.create_time.ToDatetime(tzinfo=UTC).isoformat(timespec="seconds")


def describe_checkpoint(checkpoint: Checkpoint) -> str:
    parts = [f"#{checkpoint.sequence}", checkpoint.checkpoint_id, _when(checkpoint), trigger_name(checkpoint.trigger)]
    if checkpoint.source_tool:
        parts.append(checkpoint.source_tool)
    if checkpoint.has_files:
        parts.append(f"({_plural(checkpoint.file_count, 'file')})")
    return "  ".join(parts)


def _change_kind(change: FileChange) -> str:
    return pb.ChangeKind.Name(change.kind).removeprefix("CHANGE_KIND_").lower().replace("_", " ")


# A rollback's changes go from the workspace now (base) to the checkpoint (target).
_ROLLBACK_EFFECT = {
    pb.CHANGE_KIND_ADDED: "re-create",
    pb.CHANGE_KIND_MODIFIED: "restore",
    pb.CHANGE_KIND_DELETED: "remove",
    pb.CHANGE_KIND_TYPE_CHANGED: "replace",
}


def _change_lines(changes: Sequence[FileChange], describe: Callable[[FileChange], str]) -> list[str]:
    lines = [f"  {describe(change):<12} {change.path}" for change in changes[:MAX_LISTED_CHANGES]]
    if len(changes) > MAX_LISTED_CHANGES:
        lines.append(f"  ... and {len(changes) - MAX_LISTED_CHANGES} more")
    return lines


def _plural(count: int, noun: str) -> str:
    return f"{count} {noun}" if count == 1 else f"{count} {noun}s"


def _paths_differ(count: int) -> str:
    return "1 path differs" if count == 1 else f"{count} paths differ"


class UndoTools:
    """Serves checkpoint_list, checkpoint_diff and checkpoint_rollback for one plan."""

    def __init__(
        self,
        checkpoints: CheckpointClient,
        plan_id: str,
        *,
        deadline_s: float,
        target: str = "",
        unrecorded: Callable[[], str | None] = lambda: None,
    ) -> None:
        self._checkpoints = checkpoints
        self.plan_id = plan_id
        self._deadline_s = deadline_s
        # Named when checkpointd does not answer; `unrecorded` says why a write tool had no checkpoint.
        self._target = target
        self._unrecorded = unrecorded

    @staticmethod
    def owns(name: str) -> bool:
        return name in NAMES

    async def call(self, name: str, arguments: Mapping[str, Any]) -> dict[str, Any]:
        """The tool's result; bad arguments and checkpointd errors are error results that say why."""
        try:
            match name:
                case "checkpoint_list":
                    _unknown_arguments(arguments, ("limit",))
                    answer = partial(self._list_text, _limit(arguments))
                case "checkpoint_diff":
                    _unknown_arguments(arguments, ("checkpoint_id", "target_checkpoint_id", "paths", "patch"))
                    answer = partial(
                        self._diff_text,
                        _string(arguments, "checkpoint_id", required=True),
                        _string(arguments, "target_checkpoint_id", required=False),
                        _paths(arguments),
                        _flag(arguments, "patch"),
                    )
                case "checkpoint_rollback":
                    _unknown_arguments(arguments, ("checkpoint_id", "confirm", "paths"))
                    answer = partial(
                        self._rollback_text,
                        _string(arguments, "checkpoint_id", required=True),
                        _flag(arguments, "confirm"),
                        _paths(arguments),
                    )
                case _:
                    raise InvalidArguments(f"no tool named {name!r} here")
            # The client's calls block: off the event loop, bounded by the deadline.
            return text_result(await anyio.to_thread.run_sync(answer))
        except InvalidArguments as error:
            return text_result(f"{name}: {error}", is_error=True)
        except CheckpointdRpcError as error:
            if error.hint:  # nothing answered: say where checkpointd was looked for and how to start it
                hint = unreachable_hint(self._target or None, point_with=PROXY_POINT_WITH)
                return text_result(f"{name}: {hint} ({error.method}: {error.code.name}: {error.message})",
                                   is_error=True)
            return text_result(f"{name}: checkpointd answered {error}", is_error=True)

    def _list_text(self, limit: int) -> str:
        try:
            checkpoints = self._checkpoints.list_checkpoints(self.plan_id, timeout=self._deadline_s)
        except CheckpointdRpcError as error:
            if error.code != grpc.StatusCode.NOT_FOUND or error.reason != "PLAN_NOT_FOUND":
                raise
            checkpoints = []
        if not checkpoints:
            unrecorded = self._unrecorded()
            if unrecorded:
                return f"Plan {self.plan_id} has no checkpoints yet: {unrecorded}"
            return f"Plan {self.plan_id} has no checkpoints yet: no tool has written to the workspace."
        shown = checkpoints[:limit]
        lines = [f"Plan {self.plan_id}: {_plural(len(checkpoints), 'checkpoint')}, newest first"]
        if checkpoints[0].workspace_root:
            lines[0] += f", workspace {checkpoints[0].workspace_root}"
        lines += [describe_checkpoint(checkpoint) for checkpoint in shown]
        if len(checkpoints) > len(shown):
            lines.append(f"... and {len(checkpoints) - len(shown)} older (raise limit to see them)")
        return "\n".join(lines)

    def _diff_text(self, base_id: str, target_id: str, paths: list[str], patch: bool) -> str:
        for checkpoint_id in filter(None, (base_id, target_id)):
            # Diffs are of this session's plan only (as rollbacks are): another plan's checkpoint
            # against "the workspace now" would show that plan's workspace, its files included.
            owner = self._checkpoints.get_checkpoint(checkpoint_id, timeout=self._deadline_s).plan_id
            if owner != self.plan_id:
                raise InvalidArguments(f"checkpoint {checkpoint_id} is not one of this session's (plan "
                                       f"{self.plan_id}); checkpoint_list shows them")
        # One page, of what the text shows (the server makes text diffs of those only).
        changes = self._checkpoints.diff_checkpoints(base_id, target_id, paths=paths, text_diffs=patch,
                                                     all_pages=False, page_size=MAX_LISTED_CHANGES,
                                                     timeout=self._deadline_s)
        target = f"checkpoint {target_id}" if target_id else "the workspace now"
        if not changes:
            return f"No differences between checkpoint {base_id} and {target}."
        header = f"{_paths_differ(len(changes) + changes.omitted)} from checkpoint {base_id} to {target}:"
        listed = _change_lines(changes, _change_kind)
        if changes.omitted:
            listed.append(f"  ... and {changes.omitted} more (diff fewer paths (paths) to see them)")
        text = "\n".join([header, *listed])
        if not patch:
            return text
        lines = format_patch(changes)
        if len(lines) > MAX_PATCH_CHARS:
            cut = lines.rfind("\n", 0, MAX_PATCH_CHARS) + 1
            lines = (lines[:cut] + f"... {len(lines) - cut} more characters of changes not shown: "
                     "diff fewer paths (paths) to see them\n")
        return f"{text}\n\n{lines}"

    def _rollback_text(self, checkpoint_id: str, confirm: bool, paths: list[str]) -> str:
        response = self._checkpoints.rollback(
            self.plan_id,
            checkpoint_id,
            scope=pb.ROLLBACK_SCOPE_FILES,
            paths=paths,
            dry_run=not confirm,
            timeout=self._deadline_s,
        )
        effects = _change_lines(response.changes, lambda change: _ROLLBACK_EFFECT[change.kind])
        if not confirm:
            if not response.changes:
                return f"Dry run: the workspace already matches checkpoint {checkpoint_id}; nothing would change."
            return "\n".join(
                [
                    f"Dry run: rolling back to checkpoint {checkpoint_id} would change "
                    f"{_plural(len(response.changes), 'path')}:",
                    *effects,
                    "Nothing has been changed. Call checkpoint_rollback again with confirm: true to apply it.",
                ]
            )
        safety = response.safety_checkpoint.checkpoint_id
        lines = [
            f"Rolled back to checkpoint {checkpoint_id}: {_plural(len(response.changes), 'path')} changed.",
            *effects,
        ]
        if safety:
            lines.append(
                f"Safety checkpoint {safety} holds the workspace as it was just before: call checkpoint_rollback "
                f"with checkpoint_id {safety} and confirm: true to undo this rollback."
            )
        return "\n".join(lines)
