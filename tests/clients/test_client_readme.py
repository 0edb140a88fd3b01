"""The adoption example in clients/python/README.md runs as written against the real server."""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path

import pytest

from checkpointd_client import phase_name

README = Path(__file__).resolve().parents[2] / "clients" / "python" / "README.md"
EXAMPLE_TARGET = "unix:///run/checkpointd/checkpointd.sock"


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


def _example() -> str:
    (block,) = re.findall(r"```python\n(.*?)```", README.read_text(), flags=re.DOTALL)
    return block


def test_the_example_stays_under_twenty_lines() -> None:
    assert len(_example().strip().splitlines()) < 20


def test_the_readme_example_checkpoints_a_plan(checkpointd_server, workspace: Path, plan_id: str, new_plan_id) -> None:
    source = _example()
    assert EXAMPLE_TARGET in source
    namespace: dict[str, object] = {}
    exec(compile(source.replace(EXAMPLE_TARGET, checkpointd_server.unix_target), str(README), "exec"), namespace)
    checkpointd = namespace["checkpointd"]
    plan = Plan(plan_id, workspace)
    (workspace / "notes.txt").write_text("before")
    child = new_plan_id()

    def failing_actor(plan: Plan) -> object:
        raise Crash("actor failed")

    try:
        namespace["run_tool"](FileWriter(workspace), {"path": "notes.txt", "content": "after"}, plan)
        assert namespace["spawn_subplan"](plan, child, lambda: child) == child
        with pytest.raises(Crash):
            namespace["execute"](plan, failing_actor)

        checkpoints = list(reversed(checkpointd.checkpoints.list_checkpoints(plan_id)))
        assert [phase_name(c.phase) for c in checkpoints] == [
            "before_tool_execute",
            "after_tool_execute",
            "execute",
            "on_error",
        ]
        assert checkpoints[2].labels["child_plan_id"] == child
        checkpointd.checkpoints.rollback(plan_id, checkpoints[0].checkpoint_id)
        assert (workspace / "notes.txt").read_text() == "before"
    finally:
        checkpointd.close()
