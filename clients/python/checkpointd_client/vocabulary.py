"""The closed vocabularies the client speaks: automatic triggers, phases, config keys and values.

Names follow the server's spelling: the proto enum value name in lower case without its prefix
(TRIGGER_ON_SUBPLAN_SPAWN -> "on_subplan_spawn"). The automatic triggers are checked against the
generated `checkpoint.v1.Trigger` enum at import time, so a contract change that adds or renames
a trigger fails loudly here instead of being silently ignored by the interceptors.
"""

from __future__ import annotations

from enum import StrEnum

from checkpoint.v1 import checkpoint_service_pb2 as pb
from checkpointd_client.errors import InvalidConfigValueError, UnknownTriggerError

TriggerValue = pb.Trigger.ValueType
PhaseValue = pb.Phase.ValueType


def _enum_name(full_name: str, prefix: str) -> str:
    return full_name.removeprefix(prefix).lower()


class AutoTrigger(StrEnum):
    """The four moments at which checkpoints are taken without anyone asking."""

    BEFORE_TOOL_EXECUTE = "before_tool_execute"
    AFTER_TOOL_EXECUTE = "after_tool_execute"
    ON_SUBPLAN_SPAWN = "on_subplan_spawn"
    ON_ERROR = "on_error"

    @classmethod
    def parse(cls, name: str | AutoTrigger, *, source: str = "") -> AutoTrigger:
        """The trigger called `name`; anything outside the vocabulary raises UnknownTriggerError."""
        if isinstance(name, AutoTrigger):
            return name
        try:
            return cls(name)
        except ValueError:
            raise UnknownTriggerError(name, allowed=[t.value for t in cls], source=source) from None

    @property
    def proto(self) -> TriggerValue:
        """The `checkpoint.v1.Trigger` value sent on the wire."""
        return pb.Trigger.Value("TRIGGER_" + self.name)

    @property
    def phase(self) -> PhaseValue:
        """The phase this trigger implies (the server rejects any other combination)."""
        match self:
            case AutoTrigger.BEFORE_TOOL_EXECUTE:
                return pb.PHASE_BEFORE_TOOL_EXECUTE
            case AutoTrigger.AFTER_TOOL_EXECUTE:
                return pb.PHASE_AFTER_TOOL_EXECUTE
            case AutoTrigger.ON_SUBPLAN_SPAWN:
                return pb.PHASE_EXECUTE
            case AutoTrigger.ON_ERROR:
                return pb.PHASE_ON_ERROR


# Proto triggers that are not automatic: "not set", an explicit request, and the server's own
# rollback safety checkpoint. Every other proto trigger must be an AutoTrigger and vice versa.
_NON_AUTOMATIC_TRIGGERS = frozenset({"unspecified", "manual", "rollback"})
_proto_automatic = {_enum_name(n, "TRIGGER_") for n in pb.Trigger.DESCRIPTOR.values_by_name} - _NON_AUTOMATIC_TRIGGERS
if _proto_automatic != {trigger.value for trigger in AutoTrigger}:
    raise ImportError(
        f"checkpoint.v1.Trigger defines automatic triggers {sorted(_proto_automatic)}, "
        f"this client knows {sorted(t.value for t in AutoTrigger)}: regenerate or update the client"
    )


def trigger_name(value: TriggerValue) -> str:
    """Lower-case name of any proto Trigger value, e.g. "manual"."""
    return _enum_name(pb.Trigger.Name(value), "TRIGGER_")


def phase_name(value: PhaseValue) -> str:
    """Lower-case name of any proto Phase value, e.g. "before_tool_execute"."""
    return _enum_name(pb.Phase.Name(value), "PHASE_")


def parse_phase(name: str) -> PhaseValue:
    """The proto Phase called `name` (lower-case, no prefix); unknown names raise ValueError."""
    allowed = [_enum_name(n, "PHASE_") for n in pb.Phase.DESCRIPTOR.values_by_name]
    if name not in allowed or name == "unspecified":
        raise ValueError(f"unknown phase {name!r}; allowed: {allowed[1:]}")
    return pb.Phase.Value("PHASE_" + name.upper())


class OnUnavailable(StrEnum):
    """What an interceptor does when checkpointd cannot record a checkpoint in time."""

    PROCEED = "proceed"
    REFUSE = "refuse"

    @classmethod
    def parse(cls, name: str) -> OnUnavailable:
        try:
            return cls(name)
        except ValueError:
            raise InvalidConfigValueError(
                ConfigKey.ON_UNAVAILABLE, name, f"expected one of {[v.value for v in cls]}"
            ) from None


class ConfigKey(StrEnum):
    """The server config keys the client reads."""

    AUTO_CREATE_ON = "core.checkpoints.auto_create_on"
    ON_UNAVAILABLE = "core.checkpoints.on_unavailable"
    CLIENT_DEADLINE_MS = "core.checkpoints.client_deadline_ms"
