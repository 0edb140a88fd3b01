"""Python client for checkpointd, and interceptors that checkpoint an agent's plan automatically.

Uses only the generated checkpoint.v1 code, never the server package.
"""

from checkpointd_client.client import (
    Checkpoint,
    CheckpointClient,
    CheckpointFile,
    ConfigClient,
    ConfigEntry,
    ConfigWatch,
    FileChange,
    Plan,
    RollbackResponse,
    from_value,
    new_request_id,
    open_channel,
    retry_service_config,
    to_value,
)
from checkpointd_client.errors import (
    CheckpointdClientError,
    CheckpointdRpcError,
    CheckpointUnavailableError,
    InvalidConfigValueError,
    UnknownTriggerError,
)
from checkpointd_client.ids import new_plan_id
from checkpointd_client.interceptors import (
    AutoCheckpointer,
    ExecutePhase,
    ExecutorCheckpointInterceptor,
    SubplanCheckpointInterceptor,
    SubplanSpawn,
    ToolCall,
    ToolCheckpointInterceptor,
    ToolCheckpoints,
    declares_read_only,
)
from checkpointd_client.patches import format_patch
from checkpointd_client.policy import (
    CheckpointConfigWatcher,
    CheckpointSettings,
    FixedSettings,
    PlanSettings,
    SettingsSource,
    TriggerPolicy,
)
from checkpointd_client.targets import default_target
from checkpointd_client.vocabulary import AutoTrigger, ConfigKey, OnUnavailable, phase_name, trigger_name
from checkpointd_client.wiring import Checkpointd

__all__ = [
    "AutoCheckpointer",
    "AutoTrigger",
    "Checkpoint",
    "CheckpointClient",
    "CheckpointConfigWatcher",
    "CheckpointSettings",
    "CheckpointUnavailableError",
    "Checkpointd",
    "CheckpointdClientError",
    "CheckpointdRpcError",
    "ConfigClient",
    "ConfigEntry",
    "ConfigKey",
    "ConfigWatch",
    "ExecutePhase",
    "ExecutorCheckpointInterceptor",
    "CheckpointFile",
    "FileChange",
    "Plan",
    "FixedSettings",
    "PlanSettings",
    "InvalidConfigValueError",
    "OnUnavailable",
    "RollbackResponse",
    "SettingsSource",
    "SubplanCheckpointInterceptor",
    "SubplanSpawn",
    "ToolCall",
    "ToolCheckpointInterceptor",
    "ToolCheckpoints",
    "TriggerPolicy",
    "UnknownTriggerError",
    "declares_read_only",
    "default_target",
    "format_patch",
    "from_value",
    "new_plan_id",
    "new_request_id",
    "open_channel",
    "phase_name",
    "retry_service_config",
    "to_value",
    "trigger_name",
]
