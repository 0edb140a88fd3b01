"""The adoption example, in the main README and in clients/python/README.md, runs as written
against a server started as `make run` starts one (tests.readme_blocks): its Checkpointd() finds
that server by itself."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import pytest

from checkpointd_client import new_plan_id, phase_name
from tests.readme_blocks import readme_block

EXAMPLES = [("README.md", "python-wiring"), ("clients/python/README.md", "adoption")]


@dataclass
class Plan:
    id: str
    workspace: Path


class FileWriter:
    """A framework's own write tool: no read_only declaration at all."""

    name = "framework/write"

    def __init__(self, workspace: Path) -> None:
        self._workspace = workspace

    def __call__(self, path: str, content: str) -> str:
        (self._workspace / path).write_text(content)
        return path


class Crash(Exception):
    """What the example's failing actor raises."""


@pytest.mark.parametrize("readme, name", EXAMPLES)
def test_the_example_stays_under_twenty_lines(readme: str, name: str) -> None:
    assert len(readme_block(readme, name).strip().splitlines()) < 20


def test_both_readmes_show_the_same_example() -> None:
    assert len({readme_block(readme, name) for readme, name in EXAMPLES}) == 1


@pytest.mark.parametrize("readme, name", EXAMPLES)
def test_the_readme_example_checkpoints_a_plan(checkout, monkeypatch, readme: str, name: str) -> None:
    for variable, value in checkout.environment().items():
        monkeypatch.setenv(variable, value)
    monkeypatch.delenv("CHECKPOINTD_TARGET", raising=False)
    namespace: dict[str, object] = {}
    exec(compile(readme_block(readme, name), readme, "exec"), namespace)
    checkpointd = namespace["checkpointd"]
    assert checkpointd.target == checkout.unix_target, "Checkpointd() did not find make run's socket"
    workspace = checkout.new_workspace()
    plan = Plan(new_plan_id(), workspace)
    (workspace / "notes.txt").write_text("before")
    child = new_plan_id()

    def failing_actor(plan: Plan) -> object:
        raise Crash("actor failed")

    try:
        namespace["run_tool"](FileWriter(workspace), {"path": "notes.txt", "content": "after"}, plan)
        assert namespace["spawn_subplan"](plan, child, lambda: child) == child
        with pytest.raises(Crash):
            namespace["execute"](plan, failing_actor)

        checkpoints = list(reversed(checkpointd.checkpoints.list_checkpoints(plan.id)))
        assert [phase_name(c.phase) for c in checkpoints] == [
            "before_tool_execute",
            "after_tool_execute",
            "execute",
            "on_error",
        ]
        assert checkpoints[2].labels["child_plan_id"] == child
        checkpointd.checkpoints.rollback(plan.id, checkpoints[0].checkpoint_id)
        assert (workspace / "notes.txt").read_text() == "before"
    finally:
        checkpointd.close()
