"""One object that wires a framework to checkpointd: channel, clients, shared settings, interceptors."""

from __future__ import annotations

from collections.abc import Iterable
from typing import Self

import grpc

from checkpointd_client.client import DEFAULT_DEADLINE_S, CheckpointClient, ConfigClient, open_channel
from checkpointd_client.interceptors import (
    ExecutorCheckpointInterceptor,
    SubplanCheckpointInterceptor,
    ToolCheckpointInterceptor,
)
from checkpointd_client.policy import CheckpointConfigWatcher, PlanSettings, TriggerPolicy
from checkpointd_client.targets import default_target
from checkpointd_client.vocabulary import AutoTrigger


class Checkpointd:
    """A connection to checkpointd plus the config watcher every interceptor made here shares.

    `target` is "host:port" or "unix:///absolute/path"; by default CHECKPOINTD_TARGET, else the
    unix socket a local `checkpointd serve` (or `make run`) makes in its default data dir, else
    127.0.0.1:50051, as for the `checkpointd` command. With `watch_config=False` the server's
    settings are never read and the registry defaults apply (useful for plain client use).
    With `settings_in_background=True` they are read in the background, so constructing this never
    waits on checkpointd; a checkpoint asked for meanwhile waits for them within its own deadline
    (see `CheckpointConfigWatcher.start`). `plan_id` makes `settings` that plan's (as the MCP proxy
    does for its one plan); whatever it is, each interceptor applies the settings of the plan of
    the call it wraps (`plan_settings`: a plan's override wins).
    `credentials` and `server_name` connect over TLS (see `open_channel`); `token` is the
    server's bearer token.
    """

    def __init__(
        self,
        target: str | None = None,
        *,
        token: str | None = None,
        credentials: grpc.ChannelCredentials | None = None,
        server_name: str | None = None,
        deadline_s: float = DEFAULT_DEADLINE_S,
        watch_config: bool = True,
        settings_in_background: bool = False,
        plan_id: str = "",
    ) -> None:
        self.target = target = target or default_target()
        self.channel = open_channel(target, credentials=credentials, server_name=server_name)
        self.checkpoints = CheckpointClient(self.channel, deadline_s=deadline_s, token=token)
        self.config = ConfigClient(self.channel, deadline_s=deadline_s, token=token)
        self.settings = CheckpointConfigWatcher(self.config, plan_id=plan_id)
        self.plan_settings = PlanSettings(self.config, self.settings)
        self._watching = watch_config
        if watch_config:
            try:
                self.settings.start(wait=not settings_in_background)
            except BaseException:
                self.channel.close()
                raise

    def policy(self, *, disabled: Iterable[str | AutoTrigger] = ()) -> TriggerPolicy:
        """A policy on the shared server settings with this component's own local switches."""
        return TriggerPolicy(self.plan_settings if self._watching else None, disabled=disabled)

    def tool_interceptor(self, *, disabled: Iterable[str | AutoTrigger] = ()) -> ToolCheckpointInterceptor:
        return ToolCheckpointInterceptor(self.checkpoints, self.policy(disabled=disabled))

    def subplan_interceptor(self, *, disabled: Iterable[str | AutoTrigger] = ()) -> SubplanCheckpointInterceptor:
        return SubplanCheckpointInterceptor(self.checkpoints, self.policy(disabled=disabled))

    def executor_interceptor(self, *, disabled: Iterable[str | AutoTrigger] = ()) -> ExecutorCheckpointInterceptor:
        return ExecutorCheckpointInterceptor(self.checkpoints, self.policy(disabled=disabled))

    def close(self) -> None:
        if self._watching:
            self.plan_settings.stop()
            self.settings.stop()
        # Closing the channel also ends a settings read in flight, so the watchers stop at once.
        self.channel.close()
        if self._watching:
            self.plan_settings.close()
            self.settings.close()

    def __enter__(self) -> Self:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()
