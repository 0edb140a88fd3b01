"""Closed vocabularies of the domain: phases and triggers.

Every name the service accepts is listed here; callers convert at the edge and an
unknown name is refused (see ``parse_trigger``), never silently ignored.
"""

from __future__ import annotations

import enum

from checkpointd.core.kernel.errors import InvalidArgument, Reason


class Phase(enum.StrEnum):
    BEFORE_TOOL_EXECUTE = "before_tool_execute"
    AFTER_TOOL_EXECUTE = "after_tool_execute"
    EXECUTE = "execute"
    ON_ERROR = "on_error"
    MANUAL = "manual"
    ROLLBACK_SAFETY = "rollback_safety"


class Trigger(enum.StrEnum):
    BEFORE_TOOL_EXECUTE = "before_tool_execute"
    AFTER_TOOL_EXECUTE = "after_tool_execute"
    ON_SUBPLAN_SPAWN = "on_subplan_spawn"
    ON_ERROR = "on_error"
    MANUAL = "manual"
    ROLLBACK = "rollback"


#: The phase each trigger implies; MANUAL alone lets the caller choose.
IMPLIED_PHASE: dict[Trigger, Phase | None] = {
    Trigger.BEFORE_TOOL_EXECUTE: Phase.BEFORE_TOOL_EXECUTE,
    Trigger.AFTER_TOOL_EXECUTE: Phase.AFTER_TOOL_EXECUTE,
    Trigger.ON_SUBPLAN_SPAWN: Phase.EXECUTE,
    Trigger.ON_ERROR: Phase.ON_ERROR,
    Trigger.MANUAL: None,
    Trigger.ROLLBACK: Phase.ROLLBACK_SAFETY,
}

#: Triggers that fire by themselves and can be switched with core.checkpoints.auto_create_on.
AUTO_TRIGGERS: tuple[Trigger, ...] = (
    Trigger.BEFORE_TOOL_EXECUTE,
    Trigger.AFTER_TOOL_EXECUTE,
    Trigger.ON_SUBPLAN_SPAWN,
    Trigger.ON_ERROR,
)

#: Only the server records these (a rollback's safety checkpoint).
SERVER_ONLY_TRIGGERS = frozenset({Trigger.ROLLBACK})
SERVER_ONLY_PHASES = frozenset({Phase.ROLLBACK_SAFETY})


def parse_trigger(name: str) -> Trigger:
    try:
        return Trigger(name)
    except ValueError:
        raise InvalidArgument(
            Reason.UNKNOWN_ENUM_VALUE,
            f"unknown trigger {name!r}; known: {', '.join(t.value for t in Trigger)}",
            field="trigger",
            value=name,
        ) from None


def parse_phase(name: str) -> Phase:
    try:
        return Phase(name)
    except ValueError:
        raise InvalidArgument(
            Reason.UNKNOWN_ENUM_VALUE,
            f"unknown phase {name!r}; known: {', '.join(p.value for p in Phase)}",
            field="phase",
            value=name,
        ) from None


def resolve_phase(trigger: Trigger, phase: Phase | None) -> Phase:
    """The phase a checkpoint gets: the one its trigger implies, or the caller's for MANUAL."""
    implied = IMPLIED_PHASE[trigger]
    if implied is None:
        chosen = phase or Phase.MANUAL
        if chosen in SERVER_ONLY_PHASES:
            raise InvalidArgument(
                Reason.INVALID_PHASE,
                f"phase {chosen.value!r} is recorded by the server only",
                phase=chosen.value,
                trigger=trigger.value,
            )
        return chosen
    if phase is not None and phase != implied:
        raise InvalidArgument(
            Reason.INVALID_PHASE,
            f"trigger {trigger.value!r} implies phase {implied.value!r}, got {phase.value!r}",
            phase=phase.value,
            trigger=trigger.value,
        )
    return implied
