"""A reference sub-plan execution service: spawns child plans and checkpoints the parent first."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Generic, TypeVar

from checkpointd_client.client import CheckpointClient
from checkpointd_client.interceptors import SubplanCheckpointInterceptor, SubplanSpawn
from checkpointd_client.policy import TriggerPolicy
from checkpointd_client.reference.plan import PlanContext

_Result = TypeVar("_Result")


@dataclass(frozen=True)
class Subplan:
    """A child plan to run in the parent's workspace."""

    plan_id: str
    goal: str = ""


class SubplanExecutionService(Generic[_Result]):
    """Runs configured sub-plans of one parent plan with `run_subplan(child_plan, subplan)`."""

    def __init__(
        self,
        parent: PlanContext,
        run_subplan: Callable[[PlanContext, Subplan], _Result],
        checkpoints: CheckpointClient | None = None,
        policy: TriggerPolicy | None = None,
    ) -> None:
        self.parent = parent
        self._run_subplan = run_subplan
        self._configured: list[Subplan] = []
        self.interceptor = SubplanCheckpointInterceptor(checkpoints, policy)

    def configure(self, subplan: Subplan) -> None:
        if any(known.plan_id == subplan.plan_id for known in self._configured):
            raise ValueError(f"sub-plan {subplan.plan_id} is already configured")
        self._configured.append(subplan)

    @property
    def configured(self) -> tuple[Subplan, ...]:
        return tuple(self._configured)

    def execute(self, subplan: Subplan) -> _Result:
        spawn = SubplanSpawn(
            parent_plan_id=self.parent.plan_id,
            child_plan_id=subplan.plan_id,
            workspace_root=self.parent.workspace_root,
            plan_state=self.parent.current_state,
            goal=subplan.goal,
        )
        child = PlanContext(workspace_root=self.parent.workspace_root, plan_id=subplan.plan_id)
        return self.interceptor.around(spawn, lambda: self._run_subplan(child, subplan))

    def execute_all(self) -> list[_Result]:
        return [self.execute(subplan) for subplan in self._configured]
