"""The three interceptors and the reference components, end to end against the real server."""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path

import pytest

from checkpoint.v1 import checkpoint_service_pb2 as pb
from checkpointd_client import (
    Checkpointd,
    ExecutePhase,
    ExecutorCheckpointInterceptor,
    SubplanCheckpointInterceptor,
    SubplanSpawn,
    ToolCall,
    ToolCheckpointInterceptor,
    phase_name,
    trigger_name,
)
from checkpointd_client.reference import (
    PlanContext,
    PlanExecutor,
    ReadFileTool,
    Subplan,
    SubplanExecutionService,
    ToolResult,
    ToolRunner,
    WorkspacePathError,
    WriteFileTool,
)


class ActorFailure(RuntimeError):
    """What the test's execute actor raises."""


class UndeclaredTool:
    """A tool that never says whether it writes: it must be treated as a write tool."""

    name = "custom/undeclared"

    def run(self, workspace_root: Path, arguments: Mapping[str, str]) -> ToolResult:
        (workspace_root / "undeclared.txt").write_text("written")
        return ToolResult(output="ok")


class TruthyReadOnlyTool(UndeclaredTool):
    """`read_only = "yes"` is not a declaration; only the boolean True is."""

    name = "custom/truthy"
    read_only = "yes"


@pytest.fixture
def runner(checkpointd: Checkpointd) -> ToolRunner:
    tool_runner = ToolRunner(checkpointd.checkpoints, checkpointd.policy())
    for tool in (WriteFileTool(), ReadFileTool(), UndeclaredTool(), TruthyReadOnlyTool()):
        tool_runner.register(tool)
    return tool_runner


def test_rolling_back_to_the_before_checkpoint_restores_the_old_content(
    checkpointd: Checkpointd, runner: ToolRunner, workspace: Path, plan_id: str
) -> None:
    (workspace / "notes.txt").write_text("old content")
    plan = PlanContext(workspace_root=workspace, plan_id=plan_id, state=b"before the write")

    runner.execute("local/write-file", {"path": "notes.txt", "content": "new content"}, plan)
    assert (workspace / "notes.txt").read_text() == "new content"
    (before,) = checkpointd.checkpoints.list_checkpoints(plan_id, filter_expr='phase = "before_tool_execute"')
    (after,) = checkpointd.checkpoints.list_checkpoints(plan_id, filter_expr='phase = "after_tool_execute"')
    restored = checkpointd.checkpoints.rollback(plan_id, before.checkpoint_id)

    assert (workspace / "notes.txt").read_text() == "old content"
    assert restored.state == b"before the write"
    assert before.labels["tool_call_id"] == after.labels["tool_call_id"]
    checkpointd.checkpoints.rollback(plan_id, after.checkpoint_id)
    assert (workspace / "notes.txt").read_text() == "new content"


def test_a_failed_write_tool_gets_a_before_but_no_after_checkpoint(
    checkpointd: Checkpointd, runner: ToolRunner, workspace: Path, plan_id: str, list_plan
) -> None:
    plan = PlanContext(workspace_root=workspace, plan_id=plan_id)

    with pytest.raises(WorkspacePathError):
        runner.execute("local/write-file", {"path": "../escaped.txt", "content": "x"}, plan)

    assert not (workspace.parent / "escaped.txt").exists()
    assert [phase_name(c.phase) for c in list_plan(checkpointd.checkpoints, plan_id)] == ["before_tool_execute"]


def test_read_only_tools_never_checkpoint(
    checkpointd: Checkpointd, runner: ToolRunner, workspace: Path, plan_id: str, list_plan
) -> None:
    (workspace / "README.md").write_text("read me")
    plan = PlanContext(workspace_root=workspace, plan_id=plan_id)

    result = runner.execute("local/read-file", {"path": "README.md"}, plan)

    assert result.output == "read me"
    assert list_plan(checkpointd.checkpoints, plan_id) == []


@pytest.mark.parametrize("tool_name", ["custom/undeclared", "custom/truthy"])
def test_a_tool_that_does_not_declare_itself_read_only_is_a_write_tool(
    checkpointd: Checkpointd, runner: ToolRunner, workspace: Path, plan_id: str, tool_name: str
) -> None:
    runner.execute(tool_name, {}, PlanContext(workspace_root=workspace, plan_id=plan_id))

    phases = [phase_name(c.phase) for c in checkpointd.checkpoints.list_checkpoints(plan_id)]
    assert phases == ["after_tool_execute", "before_tool_execute"]


def test_checkpoints_capture_the_workspace_at_that_moment(
    checkpointd: Checkpointd, runner: ToolRunner, workspace: Path, plan_id: str
) -> None:
    plan = PlanContext(workspace_root=workspace, plan_id=plan_id)
    runner.execute("local/write-file", {"path": "dir/new.txt", "content": "12345"}, plan)

    after, before = checkpointd.checkpoints.list_checkpoints(plan_id)
    changes = checkpointd.checkpoints.diff_checkpoints(before.checkpoint_id, after.checkpoint_id)

    assert before.has_files and after.has_files
    assert (before.file_count, after.file_count) == (0, 1)
    assert after.workspace_root == str(workspace)
    assert {(c.path, c.kind) for c in changes} >= {("dir/new.txt", pb.CHANGE_KIND_ADDED)}


def test_sub_plan_spawns_checkpoint_the_parent_before_each_child_runs(
    checkpointd: Checkpointd, workspace: Path, plan_id: str, new_plan_id, list_plan
) -> None:
    children = [new_plan_id(), new_plan_id()]

    def run_child(child: PlanContext, subplan: Subplan) -> str:
        (child.workspace_root / f"{subplan.plan_id}.txt").write_text(subplan.goal)
        return subplan.plan_id

    parent = PlanContext(workspace_root=workspace, plan_id=plan_id, state=b"parent state")
    service = SubplanExecutionService(parent, run_child, checkpointd.checkpoints, checkpointd.policy())
    for child_id in children:
        service.configure(Subplan(plan_id=child_id, goal=f"goal of {child_id}"))

    assert service.execute_all() == children
    checkpoints = list(reversed(checkpointd.checkpoints.list_checkpoints(plan_id)))
    assert [c.labels["child_plan_id"] for c in checkpoints] == children
    assert {(phase_name(c.phase), trigger_name(c.trigger), c.source_tool) for c in checkpoints} == {
        ("execute", "on_subplan_spawn", "subplan_execution_service")
    }
    first_spawn_changes = checkpointd.checkpoints.diff_checkpoints(checkpoints[0].checkpoint_id)
    assert {c.path for c in first_spawn_changes} == {f"{child}.txt" for child in children}
    assert checkpointd.checkpoints.get_checkpoint(checkpoints[0].checkpoint_id, full=True).state == b"parent state"
    assert all(list_plan(checkpointd.checkpoints, child) == [] for child in children)


def test_a_failing_execute_phase_checkpoints_then_raises_the_original_error(
    checkpointd: Checkpointd, workspace: Path, plan_id: str
) -> None:
    failure = ActorFailure("the model returned garbage")

    def actor(plan: PlanContext) -> object:
        (plan.workspace_root / "partial.txt").write_text("half done")
        raise failure

    plan = PlanContext(workspace_root=workspace, plan_id=plan_id, state=b"mid-execute")
    executor = PlanExecutor(actor, checkpointd.checkpoints, checkpointd.policy())

    with pytest.raises(ActorFailure) as raised:
        executor.run_execute_phase(plan)

    (on_error,) = checkpointd.checkpoints.list_checkpoints(plan_id)
    assert raised.value is failure
    assert (phase_name(on_error.phase), trigger_name(on_error.trigger)) == ("on_error", "on_error")
    assert on_error.labels["error_type"].endswith("ActorFailure")
    assert "the model returned garbage" in on_error.description
    assert on_error.file_count == 1
    assert checkpointd.checkpoints.get_checkpoint(on_error.checkpoint_id, full=True).state == b"mid-execute"


def test_a_successful_execute_phase_takes_no_checkpoint(
    checkpointd: Checkpointd, workspace: Path, plan_id: str, list_plan
) -> None:
    executor = PlanExecutor(lambda plan: "done", checkpointd.checkpoints, checkpointd.policy())

    assert executor.run_execute_phase(PlanContext(workspace_root=workspace, plan_id=plan_id)) == "done"
    assert list_plan(checkpointd.checkpoints, plan_id) == []


def test_without_a_client_or_a_plan_id_nothing_happens(
    checkpointd: Checkpointd, workspace: Path, plan_id: str, list_plan
) -> None:
    unwired = ToolRunner()
    unwired.register(WriteFileTool())
    no_plan = ToolRunner(checkpointd.checkpoints, checkpointd.policy())
    no_plan.register(WriteFileTool())
    failure = ActorFailure("boom")

    def failing_actor(plan: PlanContext) -> object:
        raise failure

    unwired.execute("local/write-file", {"path": "a.txt", "content": "a"}, PlanContext(workspace, plan_id))
    no_plan.execute("local/write-file", {"path": "b.txt", "content": "b"}, PlanContext(workspace, None))
    spawned = SubplanExecutionService(PlanContext(workspace, plan_id), lambda child, sub: sub.plan_id)
    spawned.configure(Subplan("01ARZ3NDEKTSV4RRFFQ69G5FZZ"))
    with pytest.raises(ActorFailure) as raised:
        PlanExecutor(failing_actor).run_execute_phase(PlanContext(workspace, plan_id))

    assert (workspace / "a.txt").read_text() == "a" and (workspace / "b.txt").read_text() == "b"
    assert spawned.execute_all() == ["01ARZ3NDEKTSV4RRFFQ69G5FZZ"]
    assert raised.value is failure
    assert getattr(raised.value, "__notes__", []) == []
    assert list_plan(checkpointd.checkpoints, plan_id) == []


def test_a_framework_uses_the_interceptors_without_the_reference_classes(
    checkpointd: Checkpointd, workspace: Path, plan_id: str, new_plan_id
) -> None:
    tools = ToolCheckpointInterceptor(checkpointd.checkpoints, checkpointd.policy())
    spawns = SubplanCheckpointInterceptor(checkpointd.checkpoints, checkpointd.policy())
    errors = ExecutorCheckpointInterceptor(checkpointd.checkpoints, checkpointd.policy())
    child = new_plan_id()

    with tools.guard(ToolCall("framework/patch", plan_id, workspace)) as taken:
        (workspace / "patched.py").write_text("print('hi')\n")
    spawned = spawns.around(SubplanSpawn(plan_id, child, workspace), lambda: child)
    with pytest.raises(KeyError), errors.guard(ExecutePhase(plan_id, workspace)):
        raise KeyError("missing step")

    recorded = {c.checkpoint_id: c for c in checkpointd.checkpoints.list_checkpoints(plan_id)}
    assert taken.before is not None and taken.after is not None
    assert {taken.before.checkpoint_id, taken.after.checkpoint_id} <= recorded.keys()
    assert spawned == child
    assert sorted(phase_name(c.phase) for c in recorded.values()) == [
        "after_tool_execute",
        "before_tool_execute",
        "execute",
        "on_error",
    ]


def _long_class_name(length: int) -> type[Exception]:
    return type("E" * length, (RuntimeError,), {})


def test_long_goals_and_errors_are_clipped_to_what_the_server_keeps_never_refused(
    checkpointd: Checkpointd, workspace: Path, plan_id: str
) -> None:
    """A description holds at most 4096 characters and a label value 256 (checkpoint_service.proto):
    an automatic checkpoint clips its own text to those limits rather than be refused for it."""
    spawns = SubplanCheckpointInterceptor(checkpointd.checkpoints, checkpointd.policy())
    errors = ExecutorCheckpointInterceptor(checkpointd.checkpoints, checkpointd.policy())
    prefix = "spawning sub-plan child: "
    fits = spawns.around(SubplanSpawn(plan_id, "child", workspace, goal="g" * (4096 - len(prefix))), lambda: "ran")
    clipped = spawns.around(SubplanSpawn(plan_id, "child", workspace, goal="g" * 5000), lambda: "ran")
    long_error = _long_class_name(300)("x" * 5000)
    with pytest.raises(RuntimeError) as raised, errors.guard(ExecutePhase(plan_id, workspace)):
        raise long_error

    assert (fits, clipped, raised.value) == ("ran", "ran", long_error)
    assert getattr(long_error, "__notes__", []) == [], "the on_error checkpoint was refused"
    spawn_fits, spawn_clipped, on_error = reversed(checkpointd.checkpoints.list_checkpoints(plan_id))
    assert spawn_fits.description == prefix + "g" * (4096 - len(prefix))
    assert spawn_clipped.description == prefix + "g" * (4095 - len(prefix)) + "…"
    error_type = f"{__name__}.{'E' * 300}"
    assert on_error.labels["error_type"] == error_type[:255] + "…"
    assert on_error.description == f"{error_type}: {'x' * 5000}"[:4095] + "…"


@pytest.mark.parametrize("described", [
    ToolCall("tool", "plan"), SubplanSpawn("parent", "child"), ExecutePhase("plan")])
def test_a_call_handed_to_an_interceptor_cannot_change_between_its_checkpoints(described) -> None:
    """What `begin` read (the plan, the workspace) is what `finish` checkpoints."""
    with pytest.raises(AttributeError):
        described.workspace_root = "/elsewhere"
