"""A reference tool runner: looks tools up by name and runs them inside the tool interceptor."""

from __future__ import annotations

from collections.abc import Mapping

from checkpointd_client.client import CheckpointClient
from checkpointd_client.interceptors import ToolCall, ToolCheckpointInterceptor, declares_read_only
from checkpointd_client.policy import TriggerPolicy
from checkpointd_client.reference.plan import PlanContext
from checkpointd_client.reference.tools import Tool, ToolResult


class UnknownToolError(LookupError):
    """No tool of that name is registered."""


class ToolRunner:
    """Runs registered tools on a plan's workspace; write tools get before/after checkpoints."""

    def __init__(self, checkpoints: CheckpointClient | None = None, policy: TriggerPolicy | None = None) -> None:
        self._tools: dict[str, Tool] = {}
        self.interceptor = ToolCheckpointInterceptor(checkpoints, policy)

    def register(self, tool: Tool) -> None:
        if tool.name in self._tools:
            raise ValueError(f"a tool named {tool.name!r} is already registered")
        self._tools[tool.name] = tool

    def execute(self, tool_name: str, arguments: Mapping[str, str], plan: PlanContext) -> ToolResult:
        tool = self._tools.get(tool_name)
        if tool is None:
            raise UnknownToolError(f"no tool named {tool_name!r}; registered: {sorted(self._tools)}")
        call = ToolCall(
            tool_name=tool.name,
            plan_id=plan.plan_id,
            workspace_root=plan.workspace_root,
            read_only=declares_read_only(tool),
            plan_state=plan.current_state,
        )
        return self.interceptor.around(call, lambda: tool.run(plan.workspace_root, arguments))
