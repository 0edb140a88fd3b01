"""A reference plan executor: runs the Execute phase through its actor inside the error interceptor."""

from __future__ import annotations

from collections.abc import Callable

from checkpointd_client.client import CheckpointClient
from checkpointd_client.interceptors import ExecutePhase, ExecutorCheckpointInterceptor
from checkpointd_client.policy import TriggerPolicy
from checkpointd_client.reference.plan import PlanContext

ExecuteActor = Callable[[PlanContext], object]


class PlanExecutor:
    """Runs a plan's Execute phase; if the actor raises, an on_error checkpoint is taken first."""

    def __init__(
        self,
        execute_actor: ExecuteActor,
        checkpoints: CheckpointClient | None = None,
        policy: TriggerPolicy | None = None,
    ) -> None:
        self._execute_actor = execute_actor
        self.interceptor = ExecutorCheckpointInterceptor(checkpoints, policy)

    def run_execute_phase(self, plan: PlanContext) -> object:
        phase = ExecutePhase(plan_id=plan.plan_id, workspace_root=plan.workspace_root, plan_state=plan.current_state)
        return self.interceptor.around(phase, lambda: self._execute_actor(plan))
