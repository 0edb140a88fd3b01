"""Step definitions for auto_triggers.feature, run against the real checkpointd server.

Tool-runner scenarios talk to the server over TCP; sub-plan, executor and config scenarios over
its unix socket. Every checkpoint assertion lists what the server actually recorded.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

import grpc
import pytest
from pytest_bdd import given, parsers, scenarios, then, when
from ulid import ULID

from checkpointd_client import (
    Checkpoint,
    CheckpointClient,
    Checkpointd,
    CheckpointdRpcError,
    ConfigClient,
    UnknownTriggerError,
    from_value,
    open_channel,
    phase_name,
)
from checkpointd_client.reference import (
    PlanContext,
    PlanExecutor,
    ReadFileTool,
    Subplan,
    SubplanExecutionService,
    Tool,
    ToolResult,
    ToolRunner,
    WorkspacePathError,
    WriteFileTool,
)

scenarios("auto_triggers.feature")

TOOLS: dict[str, type[WriteFileTool] | type[ReadFileTool]] = {
    WriteFileTool.name: WriteFileTool,
    ReadFileTool.name: ReadFileTool,
}
READ_FIXTURE = ("README.md", "contents for the read-only tool")


class ExecuteActorFailure(RuntimeError):
    """What the scenario's execute actor raises."""


@dataclass
class World:
    """What the steps of one scenario share."""

    workspace: Path
    client: CheckpointClient | None = None
    plan: PlanContext | None = None
    runner: ToolRunner | None = None
    subplans: SubplanExecutionService[str] | None = None
    executor: PlanExecutor | None = None
    actor_error: ExecuteActorFailure | None = None
    config: ConfigClient | None = None
    config_value: object = None
    tool_result: ToolResult | None = None
    raised: Exception | None = None
    spawned: list[str] = field(default_factory=list)
    found: Checkpoint | None = None

    def require_success(self) -> None:
        """Checkpoint assertions only make sense if the action itself did not blow up."""
        if self.raised is not None:
            raise AssertionError(f"the action raised {self.raised!r}") from self.raised

    def checkpoints(self, plan_id: str, filter_expr: str = "") -> list[Checkpoint]:
        assert self.client is not None, "the scenario has no checkpoint service to ask"
        try:
            return self.client.list_checkpoints(plan_id, filter_expr=filter_expr)
        except CheckpointdRpcError as error:
            if error.code == grpc.StatusCode.NOT_FOUND and error.reason == "PLAN_NOT_FOUND":
                return []
            raise


@pytest.fixture
def world(workspace: Path, checkpointd_server) -> Iterator[World]:
    channel = open_channel(checkpointd_server.tcp_target)
    yield World(workspace=workspace, client=CheckpointClient(channel))
    channel.close()


def _attempt(world: World, action) -> None:
    try:
        action()
    except Exception as error:
        world.raised = error


# ───────────────────────────── tool runner ─────────────────────────────


@given(parsers.parse('a tool runner with a checkpoint service and plan_id "{plan_id}"'))
def tool_runner_with_service(world: World, tcp_checkpointd: Checkpointd, plan_id: str) -> None:
    world.runner = ToolRunner(tcp_checkpointd.checkpoints, tcp_checkpointd.policy())
    world.plan = PlanContext(workspace_root=world.workspace, plan_id=plan_id, state=b"tool runner state")


@given("a tool runner WITHOUT a checkpoint service")
def tool_runner_without_service(world: World) -> None:
    world.runner = ToolRunner()
    world.plan = PlanContext(workspace_root=world.workspace, plan_id=None)


@given(parsers.parse('the "{trigger}" trigger is disabled'))
def tool_trigger_disabled(world: World, trigger: str) -> None:
    assert world.runner is not None
    world.runner.interceptor.policy.disable(trigger)


def _register(world: World, tool_name: str) -> Tool:
    assert world.runner is not None
    tool = TOOLS[tool_name]()
    world.runner.register(tool)
    return tool


@given(parsers.parse('a write tool "{tool_name}" is registered'))
def write_tool_registered(world: World, tool_name: str) -> None:
    assert not _register(world, tool_name).read_only


@given(parsers.parse('a read-only tool "{tool_name}" is registered'))
def read_only_tool_registered(world: World, tool_name: str) -> None:
    assert _register(world, tool_name).read_only
    path, content = READ_FIXTURE
    (world.workspace / path).write_text(content)


@given(parsers.parse('the workspace file "{path}" contains "{content}"'))
def workspace_file_contains(world: World, path: str, content: str) -> None:
    (world.workspace / path).write_text(content)


def _run_tool(world: World, tool_name: str, path: str | None = None) -> None:
    assert world.runner is not None and world.plan is not None
    if tool_name == WriteFileTool.name:
        arguments = {"path": path or "notes.txt", "content": f"written by {tool_name}"}
    else:
        arguments = {"path": path or READ_FIXTURE[0]}

    def run() -> None:
        assert world.runner is not None and world.plan is not None
        world.tool_result = world.runner.execute(tool_name, arguments, world.plan)

    _attempt(world, run)
    if world.raised is None and tool_name == WriteFileTool.name:
        assert (world.workspace / arguments["path"]).read_text() == arguments["content"]
    if world.raised is None and tool_name == ReadFileTool.name:
        assert world.tool_result is not None and world.tool_result.output == READ_FIXTURE[1]


@when(parsers.re(r'I execute tool "(?P<tool_name>[^"]+)" with plan_id "(?P<plan_id>[^"]+)"'))
def execute_tool_for_plan(world: World, tool_name: str, plan_id: str) -> None:
    assert world.plan is not None and world.plan.plan_id == plan_id
    _run_tool(world, tool_name)


@when(parsers.parse('I execute tool "{tool_name}" on path "{path}" with plan_id "{plan_id}"'))
def execute_tool_on_path(world: World, tool_name: str, path: str, plan_id: str) -> None:
    assert world.plan is not None and world.plan.plan_id == plan_id
    _run_tool(world, tool_name, path)


@when(parsers.parse('I execute tool "{tool_name}" without a plan_id'))
def execute_tool_without_plan(world: World, tool_name: str) -> None:
    assert world.plan is not None and world.plan.plan_id is None
    _run_tool(world, tool_name)


@when(parsers.parse('I roll plan "{plan_id}" back to its "{phase}" checkpoint'))
def roll_back_to_phase(world: World, plan_id: str, phase: str) -> None:
    world.require_success()
    assert world.client is not None
    (target,) = world.checkpoints(plan_id, f'phase = "{phase}"')
    world.client.rollback(plan_id, target.checkpoint_id)


@when(parsers.parse('I disable the "{trigger}" trigger'))
def disable_trigger(world: World, trigger: str) -> None:
    assert world.runner is not None
    _attempt(world, lambda: world.runner.interceptor.policy.disable(trigger))


@then("the tool should have failed")
def tool_failed(world: World) -> None:
    assert isinstance(world.raised, WorkspacePathError)
    world.raised = None


@then(parsers.parse('the workspace file "{path}" should contain "{content}"'))
def workspace_file_should_contain(world: World, path: str, content: str) -> None:
    assert (world.workspace / path).read_text() == content


@then(parsers.parse('the trigger name "{trigger}" should be refused'))
def trigger_name_refused(world: World, trigger: str) -> None:
    assert isinstance(world.raised, UnknownTriggerError)
    assert world.raised.name == trigger


# ───────────────────────────── checkpoints on the server ─────────────────────────────


@then(parsers.parse('a checkpoint with phase "{phase}" should exist for plan "{plan_id}"'))
def checkpoint_with_phase_exists(world: World, phase: str, plan_id: str) -> None:
    world.require_success()
    (checkpoint,) = world.checkpoints(plan_id, f'phase = "{phase}"')
    assert phase_name(checkpoint.phase) == phase
    assert checkpoint.has_files and checkpoint.workspace_root
    world.found = checkpoint


@then(parsers.parse('no checkpoint with phase "{phase}" should exist for plan "{plan_id}"'))
def no_checkpoint_with_phase(world: World, phase: str, plan_id: str) -> None:
    world.require_success()
    assert world.checkpoints(plan_id, f'phase = "{phase}"') == []


@then(parsers.parse('{count:d} checkpoints should exist for plan "{plan_id}"'))
def checkpoint_count(world: World, count: int, plan_id: str) -> None:
    world.require_success()
    assert len(world.checkpoints(plan_id)) == count


@then(parsers.parse('no checkpoints should exist for plan "{plan_id}"'))
def no_checkpoints(world: World, plan_id: str) -> None:
    world.require_success()
    assert world.checkpoints(plan_id) == []


@then(parsers.parse('the checkpoint source_tool should be "{source_tool}"'))
def checkpoint_source_tool(world: World, source_tool: str) -> None:
    assert world.found is not None
    assert world.found.source_tool == source_tool


@then(parsers.parse('the checkpoint should name child plan "{child_plan_id}"'))
def checkpoint_names_child(world: World, child_plan_id: str) -> None:
    assert world.found is not None
    assert world.found.labels["child_plan_id"] == child_plan_id


@then("no auto-trigger exception should be raised")
def no_exception(world: World) -> None:
    assert world.raised is None


# ───────────────────────────── sub-plan execution service ─────────────────────────────


def _subplan_service(world: World, parent: PlanContext, checkpointd: Checkpointd | None) -> None:
    def run_child(child: PlanContext, subplan: Subplan) -> str:
        (child.workspace_root / f"subplan-{subplan.plan_id}.txt").write_text(subplan.goal)
        world.spawned.append(subplan.plan_id)
        return subplan.plan_id

    world.plan = parent
    if checkpointd is None:
        world.subplans = SubplanExecutionService(parent, run_child)
    else:
        world.subplans = SubplanExecutionService(parent, run_child, checkpointd.checkpoints, checkpointd.policy())


@given(parsers.parse('a subplan execution service with a checkpoint service and parent_plan_id "{plan_id}"'))
def subplan_service_with_service(world: World, unix_checkpointd: Checkpointd, plan_id: str) -> None:
    parent = PlanContext(workspace_root=world.workspace, plan_id=plan_id, state=b"parent state")
    _subplan_service(world, parent, unix_checkpointd)


@given("a subplan execution service WITHOUT a checkpoint service")
def subplan_service_without_service(world: World) -> None:
    _subplan_service(world, PlanContext(workspace_root=world.workspace, plan_id=str(ULID())), None)


@given(parsers.parse('the "{trigger}" trigger is disabled on the subplan service'))
def subplan_trigger_disabled(world: World, trigger: str) -> None:
    assert world.subplans is not None
    world.subplans.interceptor.policy.disable(trigger)


@given(parsers.parse('a subplan "{child_plan_id}" is configured'))
def subplan_configured(world: World, child_plan_id: str) -> None:
    assert world.subplans is not None
    world.subplans.configure(Subplan(plan_id=child_plan_id, goal=f"work of {child_plan_id}"))


@given(parsers.parse("{count:d} subplans are configured"))
def subplans_configured(world: World, count: int) -> None:
    assert world.subplans is not None
    for _ in range(count):
        child_plan_id = str(ULID())
        world.subplans.configure(Subplan(plan_id=child_plan_id, goal=f"work of {child_plan_id}"))


@when("the subplan execution service executes the subplan")
def execute_subplan(world: World) -> None:
    assert world.subplans is not None
    (subplan,) = world.subplans.configured
    _attempt(world, lambda: world.subplans.execute(subplan))
    if world.raised is None:
        assert world.spawned == [subplan.plan_id]


@when("the subplan execution service executes all subplans")
def execute_all_subplans(world: World) -> None:
    assert world.subplans is not None
    _attempt(world, world.subplans.execute_all)
    if world.raised is None:
        assert world.spawned == [subplan.plan_id for subplan in world.subplans.configured]


# ───────────────────────────── plan executor ─────────────────────────────


@given(parsers.parse('a plan executor with a checkpoint manager and plan_id "{plan_id}"'))
def plan_executor_with_service(world: World, unix_checkpointd: Checkpointd, plan_id: str) -> None:
    def execute_actor(plan: PlanContext) -> object:
        (plan.workspace_root / "progress.txt").write_text("started")
        if world.actor_error is not None:
            raise world.actor_error
        return "executed"

    world.plan = PlanContext(workspace_root=world.workspace, plan_id=plan_id, state=b"executor state")
    world.executor = PlanExecutor(execute_actor, unix_checkpointd.checkpoints, unix_checkpointd.policy())


@given(parsers.parse('the "{trigger}" trigger is disabled on the executor'))
def executor_trigger_disabled(world: World, trigger: str) -> None:
    assert world.executor is not None
    world.executor.interceptor.policy.disable(trigger)


@given("the execute actor raises an error")
def execute_actor_raises(world: World) -> None:
    world.actor_error = ExecuteActorFailure("the execute actor gave up")


@when(parsers.parse('I run the execute phase for plan "{plan_id}"'))
def run_execute_phase(world: World, plan_id: str) -> None:
    assert world.executor is not None and world.plan is not None and world.plan.plan_id == plan_id
    _attempt(world, lambda: world.executor.run_execute_phase(world.plan))


@then("the execute phase should fail")
def execute_phase_failed(world: World) -> None:
    assert world.actor_error is not None
    assert world.raised is world.actor_error


@then(parsers.parse('a checkpoint with phase "on_error" should have been created for plan "{plan_id}"'))
def on_error_checkpoint_created(world: World, plan_id: str) -> None:
    (checkpoint,) = world.checkpoints(plan_id, 'phase = "on_error"')
    assert checkpoint.labels["error_type"].endswith("ExecuteActorFailure")
    assert "the execute actor gave up" in checkpoint.description
    assert checkpoint.has_files and checkpoint.file_count == 1


@then(parsers.parse('no on_error checkpoint should have been created for plan "{plan_id}"'))
def no_on_error_checkpoint(world: World, plan_id: str) -> None:
    assert world.checkpoints(plan_id, 'phase = "on_error"') == []


# ───────────────────────────── config service ─────────────────────────────


@given("the config service is initialized")
def config_service_initialized(world: World, fresh_server) -> None:
    world.config = ConfigClient(open_channel(fresh_server.unix_target))


@when(parsers.parse('I get the config key "{key}"'))
def get_config_key(world: World, key: str) -> None:
    assert world.config is not None
    world.config_value = from_value(world.config.get_config(key).value)


@then(parsers.parse('the value should contain "{item}"'))
def value_contains(world: World, item: str) -> None:
    assert isinstance(world.config_value, list)
    assert item in world.config_value
