"""Reference runner, sub-plan service and executor, each wired to its interceptor.

Small on purpose: they show the shape an agent framework copies. The interceptors do not depend
on anything here.
"""

from checkpointd_client.reference.executor import ExecuteActor, PlanExecutor
from checkpointd_client.reference.plan import PlanContext
from checkpointd_client.reference.subplans import Subplan, SubplanExecutionService
from checkpointd_client.reference.tool_runner import ToolRunner, UnknownToolError
from checkpointd_client.reference.tools import (
    ReadFileTool,
    Tool,
    ToolResult,
    WorkspacePathError,
    WriteFileTool,
    resolve_in_workspace,
)

__all__ = [
    "ExecuteActor",
    "PlanContext",
    "PlanExecutor",
    "ReadFileTool",
    "Subplan",
    "SubplanExecutionService",
    "Tool",
    "ToolResult",
    "ToolRunner",
    "UnknownToolError",
    "WorkspacePathError",
    "WriteFileTool",
    "resolve_in_workspace",
]
