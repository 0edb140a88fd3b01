"""The little a reference component needs to know about a plan."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path


@dataclass
class PlanContext:
    """A plan's identity, its workspace directory and its opaque executor state.

    `plan_id` may be None for work that is not part of a tracked plan; nothing is checkpointed then.
    """

    workspace_root: Path
    plan_id: str | None = None
    state: bytes = b""

    def current_state(self) -> bytes:
        """The state at this moment; the interceptors call it at each checkpoint."""
        return self.state
