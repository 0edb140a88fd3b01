"""Which automatic checkpoints to take, and what to do when checkpointd cannot take them.

The server's `core.checkpoints.*` keys are read once and then kept fresh by a background
WatchConfig stream that reconnects on its own, so every decision is a lookup in memory and a
server that has gone away still leaves the last known answer behind. Each component then layers
its own local switches on top ("the on_error trigger is disabled on the executor").
"""

from __future__ import annotations

import json
import logging
import threading
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field, replace
from typing import Protocol, Self

import grpc

from checkpoint.v1 import config_service_pb2
from checkpointd_client.client import ConfigClient, ConfigEntry, ConfigWatch, JsonValue, from_value
from checkpointd_client.errors import CheckpointdRpcError, InvalidConfigValueError
from checkpointd_client.vocabulary import AutoTrigger, ConfigKey, OnUnavailable

logger = logging.getLogger(__name__)

# close() waits this long for the watch thread (a daemon) before leaving it behind.
CLOSE_TIMEOUT_S = 5.0

# Failures that mean "checkpointd cannot answer right now", as opposed to a refused request.
UNAVAILABLE_CODES = frozenset(
    {grpc.StatusCode.UNAVAILABLE, grpc.StatusCode.DEADLINE_EXCEEDED, grpc.StatusCode.RESOURCE_EXHAUSTED}
)


@dataclass(frozen=True)
class CheckpointSettings:
    """The server-side checkpoint settings; the defaults match the server's registry defaults."""

    auto_create_on: frozenset[AutoTrigger] = field(default_factory=lambda: frozenset(AutoTrigger))
    on_unavailable: OnUnavailable = OnUnavailable.PROCEED
    client_deadline_s: float = 5.0

    def with_value(self, key: str, value: JsonValue) -> CheckpointSettings:
        """These settings with one key's value replaced; values outside the key's schema raise."""
        try:
            parsed_key = ConfigKey(key)
        except ValueError:
            raise InvalidConfigValueError(key, value, "not a checkpoint setting this client reads") from None
        match parsed_key:
            case ConfigKey.AUTO_CREATE_ON:
                return replace(self, auto_create_on=parse_auto_create_on(value))
            case ConfigKey.ON_UNAVAILABLE:
                if not isinstance(value, str):
                    raise InvalidConfigValueError(key, value, "expected a string")
                return replace(self, on_unavailable=OnUnavailable.parse(value))
            case ConfigKey.CLIENT_DEADLINE_MS:
                return replace(self, client_deadline_s=parse_deadline_ms(value) / 1000)


def parse_auto_create_on(value: JsonValue) -> frozenset[AutoTrigger]:
    """The trigger set of `core.checkpoints.auto_create_on`; unknown names raise UnknownTriggerError."""
    if not isinstance(value, list) or not all(isinstance(name, str) for name in value):
        raise InvalidConfigValueError(ConfigKey.AUTO_CREATE_ON, value, "expected a list of trigger names")
    source = f"config {ConfigKey.AUTO_CREATE_ON.value}"
    return frozenset(AutoTrigger.parse(name, source=source) for name in value if isinstance(name, str))


def parse_deadline_ms(value: JsonValue) -> int:
    if isinstance(value, bool) or not isinstance(value, int | float) or value != int(value) or value <= 0:
        raise InvalidConfigValueError(ConfigKey.CLIENT_DEADLINE_MS, value, "expected a positive integer")
    return int(value)


def _source(entry: ConfigEntry) -> str:
    """Where an entry's value comes from: "default", "global" or "plan"."""
    names = config_service_pb2.ConfigSource.DESCRIPTOR.values_by_number
    name = names[entry.source].name if entry.source in names else str(entry.source)
    return name.removeprefix("CONFIG_SOURCE_").lower()


class SettingsSource(Protocol):
    """Anything that can say what the current checkpoint settings are."""

    def current(self) -> CheckpointSettings: ...


@dataclass(frozen=True)
class FixedSettings:
    """Settings pinned in code, for a component that must not depend on the server's config."""

    settings: CheckpointSettings = field(default_factory=CheckpointSettings)

    def current(self) -> CheckpointSettings:
        return self.settings


class CheckpointConfigWatcher:
    """The server's checkpoint settings, cached and kept fresh by a reconnecting WatchConfig stream.

    Until the first successful read the registry defaults apply (proceed, 5000 ms, all triggers).
    A value the client cannot understand, such as an unknown trigger name, is refused loudly:
    `current()` raises until the server sends a usable value for that key again.
    """

    WATCHED_KEYS = tuple(key.value for key in ConfigKey)

    def __init__(
        self,
        config: ConfigClient,
        *,
        plan_id: str = "",
        reconnect_backoff_s: tuple[float, float] = (0.1, 1.0),
        watch_deadline_s: float = 300.0,
    ) -> None:
        self._config = config
        self._plan_id = plan_id
        self._backoff_initial_s, self._backoff_max_s = reconnect_backoff_s
        self._watch_deadline_s = watch_deadline_s
        self._settings = CheckpointSettings()
        self._refused: dict[str, Exception] = {}
        self._fetched = False
        self._changed = threading.Condition()
        self._closed = threading.Event()
        self._stream: ConfigWatch | None = None
        self._thread: threading.Thread | None = None

    @property
    def fetched(self) -> bool:
        """True once a value was read from the server (else the defaults are in use)."""
        with self._changed:
            return self._fetched

    def current(self) -> CheckpointSettings:
        with self._changed:
            if self._refused:
                raise next(iter(self._refused.values()))
            return self._settings

    def refresh(self) -> CheckpointSettings:
        """Read every watched key now; if checkpointd is unreachable, keep and return the cache."""
        deadline_s = self._settings.client_deadline_s
        try:
            entries = [
                self._config.get_config(key, plan_id=self._plan_id, timeout=deadline_s)
                for key in self.WATCHED_KEYS
            ]
        except CheckpointdRpcError as error:
            if error.code not in UNAVAILABLE_CODES:
                raise
            logger.warning("checkpointd config unreachable (%s); using %s settings", error, self._cache_kind())
            return self.current()
        for entry in entries:
            self._apply(entry)
        return self.current()

    def start(self) -> Self:
        """Read the settings once, then follow changes in a background thread."""
        self.refresh()
        if self._thread is None:
            self._thread = threading.Thread(target=self._watch_forever, name="checkpointd-config-watch", daemon=True)
            self._thread.start()
        return self

    def close(self) -> None:
        self._closed.set()
        with self._changed:
            stream = self._stream
        if stream is not None:
            stream.cancel()
        if self._thread is not None:
            self._thread.join(timeout=CLOSE_TIMEOUT_S)
            if self._thread.is_alive():
                logger.warning("checkpointd config watch did not stop within %.0f s; abandoning it", CLOSE_TIMEOUT_S)

    def wait_for(self, predicate: Callable[[CheckpointSettings], bool], timeout: float) -> bool:
        """Block until the settings satisfy `predicate` (True) or `timeout` seconds pass (False)."""
        with self._changed:
            return self._changed.wait_for(
                lambda: not self._refused and predicate(self._settings), timeout=timeout
            )

    def wait_for_refusal(self, timeout: float) -> bool:
        """Block until a server value has been refused (True) or `timeout` seconds pass (False)."""
        with self._changed:
            return self._changed.wait_for(lambda: bool(self._refused), timeout=timeout)

    def _cache_kind(self) -> str:
        return "last known" if self._fetched else "default"

    def _apply(self, entry: ConfigEntry) -> None:
        with self._changed:
            try:
                value = from_value(entry.value)
                settings = self._settings.with_value(entry.key, value)
                if settings != self._settings:
                    # Says when a change made on the server is in force here (operators, and tests, wait on it).
                    logger.info("checkpointd config %s is now %s (%s)", entry.key, json.dumps(value), _source(entry))
                self._settings = settings
            except ValueError as error:
                logger.error("refusing checkpointd config %s from the server: %s", entry.key, error)
                self._refused[entry.key] = error
                raise
            else:
                self._refused.pop(entry.key, None)
                self._fetched = True
            finally:
                self._changed.notify_all()

    def _watch_forever(self) -> None:
        backoff_s = self._backoff_initial_s
        while not self._closed.is_set():
            stream = self._config.watch_config(
                self.WATCHED_KEYS, plan_id=self._plan_id, timeout=self._watch_deadline_s
            )
            with self._changed:
                self._stream = stream
            if self._closed.is_set():
                stream.cancel()
                return
            try:
                for entry in stream:
                    backoff_s = self._backoff_initial_s
                    try:
                        self._apply(entry)
                    except ValueError:
                        continue
            except CheckpointdRpcError as error:
                if self._closed.is_set():
                    return
                if error.code == grpc.StatusCode.DEADLINE_EXCEEDED:
                    continue
                logger.info("checkpointd config watch interrupted (%s); reconnecting", error.code.name)
            self._closed.wait(backoff_s)
            backoff_s = min(backoff_s * 2, self._backoff_max_s)


class TriggerPolicy:
    """Decides whether an automatic trigger fires: server config AND this component's local switches."""

    def __init__(self, source: SettingsSource | None = None, *, disabled: Iterable[str | AutoTrigger] = ()) -> None:
        self._source: SettingsSource = source or FixedSettings()
        self._disabled = frozenset(AutoTrigger.parse(name) for name in disabled)

    def derive(self, *, disabled: Iterable[str | AutoTrigger] = ()) -> TriggerPolicy:
        """A policy for another component: same server settings, its own local switches."""
        return TriggerPolicy(self._source, disabled=disabled)

    def disable(self, trigger: str | AutoTrigger) -> None:
        self._disabled = self._disabled | {AutoTrigger.parse(trigger)}

    def enable(self, trigger: str | AutoTrigger) -> None:
        self._disabled = self._disabled - {AutoTrigger.parse(trigger)}

    @property
    def locally_disabled(self) -> frozenset[AutoTrigger]:
        return self._disabled

    def settings(self) -> CheckpointSettings:
        return self._source.current()

    def is_enabled(self, trigger: str | AutoTrigger, settings: CheckpointSettings | None = None) -> bool:
        """True when the server's auto_create_on lists the trigger and no local switch turned it off."""
        parsed = AutoTrigger.parse(trigger)
        current = settings if settings is not None else self.settings()
        return parsed in current.auto_create_on and parsed not in self._disabled
