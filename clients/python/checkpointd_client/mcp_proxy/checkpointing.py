"""The tool interceptor's before/after steps around an MCP tool call, run off the event loop.

The decisions (which triggers fire, what on_unavailable means, the deadline) are the Python
client's `ToolCheckpointInterceptor`; this module only moves its blocking gRPC calls to worker
threads and turns its outcomes into what an MCP host can see.
"""

from __future__ import annotations

import logging
from pathlib import Path

import anyio

from checkpointd_client.errors import CheckpointdClientError
from checkpointd_client.interceptors import ToolCall, ToolCheckpointInterceptor, ToolCheckpoints

logger = logging.getLogger(__name__)


class WriteToolRefused(Exception):
    """The before_tool_execute checkpoint could not be taken and the write tool must not run."""


class ToolCallCheckpoints:
    """Before/after checkpoints of one plan's write tools, with the plan's workspace."""

    def __init__(self, interceptor: ToolCheckpointInterceptor, plan_id: str, workspace_root: Path) -> None:
        self._interceptor = interceptor
        self.plan_id = plan_id
        self.workspace_root = workspace_root
        #: Why the latest write tool without a before checkpoint had none (refused, or ran without
        #: it); None while every write tool had one. checkpoint_list says it when it finds nothing.
        self.unrecorded: str | None = None

    def _call(self, tool_name: str) -> ToolCall:
        return ToolCall(tool_name=tool_name, plan_id=self.plan_id, workspace_root=self.workspace_root)

    async def before(self, tool_name: str) -> ToolCheckpoints:
        """The before_tool_execute step; raises WriteToolRefused when the tool must not run.

        A host cancelling meanwhile waits for the step to end (it is bounded by the deadline), so
        a checkpoint being recorded is never left half-known; the tool then does not run.
        """
        try:
            taken = await anyio.to_thread.run_sync(self._interceptor.begin, self._call(tool_name))
        except CheckpointdClientError as error:
            # CheckpointUnavailableError (on_unavailable is "refuse"), a request checkpointd refused
            # (a workspace outside its roots, a bad token), or settings this client cannot use.
            self.unrecorded = f"the write tool {tool_name!r} was not run, its checkpoint not recorded: {error}"
            raise WriteToolRefused(
                f"checkpointd mcp-proxy did not run the write tool {tool_name!r}: {error}"
            ) from error
        if taken.before is None and taken.warnings:
            self.unrecorded = f"the write tool {tool_name!r} ran without its checkpoint: {taken.warnings[0]}"
        return taken

    async def after(self, tool_name: str, taken: ToolCheckpoints) -> None:
        """The after_tool_execute step, for a tool that succeeded; a failure only adds a warning,
        because what the tool did cannot be stopped any more and its result must reach the host."""
        try:
            await anyio.to_thread.run_sync(self._interceptor.finish, self._call(tool_name), taken)
        except CheckpointdClientError as error:
            warning = f"the after_tool_execute checkpoint of plan {self.plan_id} failed: {error}"
            logger.warning("%s", warning)
            taken.warnings.append(warning)
