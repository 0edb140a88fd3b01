"""Which automatic checkpoints to take, and what to do when checkpointd cannot take them.

The server's `core.checkpoints.*` keys are read once and then kept fresh by a background
WatchConfig stream that reconnects on its own, so every decision is a lookup in memory and a
server that has gone away still leaves the last known answer behind. A plan's own settings (its
overrides win) are followed the same way, from its first checkpoint on (PlanSettings, bounded).
Each component then layers its own local switches on top ("the on_error trigger is disabled on the
executor").
"""

from __future__ import annotations

import json
import logging
import threading
from collections import OrderedDict
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

# Failures that mean "checkpointd cannot answer right now", as opposed to a refused request. A
# RESOURCE_EXHAUSTED counts too, but only checkpointd's own "store full" (see is_unavailable).
UNAVAILABLE_CODES = frozenset({grpc.StatusCode.UNAVAILABLE, grpc.StatusCode.DEADLINE_EXCEEDED})
# The ErrorInfo reason of checkpointd's RESOURCE_EXHAUSTED: its store ran out of space.
STORAGE_EXHAUSTED_REASON = "STORAGE_EXHAUSTED"
# How many plans' own settings a connection follows at once (one WatchConfig stream each).
MAX_WATCHED_PLANS = 32


def is_unavailable(error: CheckpointdRpcError) -> bool:
    """Whether a failed call means "checkpointd cannot record right now" (on_unavailable decides).

    That is UNAVAILABLE, DEADLINE_EXCEEDED, and RESOURCE_EXHAUSTED with checkpointd's ErrorInfo
    reason STORAGE_EXHAUSTED (its store is full). A RESOURCE_EXHAUSTED without that reason is gRPC's
    own refusal of a message over the size limit: the request is wrong, like any refused request,
    and retrying it later would not help. The Node client classifies the same way (errors.js).
    """
    if error.code in UNAVAILABLE_CODES:
        return True
    return error.code == grpc.StatusCode.RESOURCE_EXHAUSTED and error.reason == STORAGE_EXHAUSTED_REASON


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


# A background start's first read is waited for at most this long (one registry-default deadline).
FIRST_READ_WAIT_S = CheckpointSettings().client_deadline_s


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

    `start(wait=False)` makes the first read in the background, for a component that must not wait
    on checkpointd to start (the MCP proxy). Until that read has ended, `current()` waits for it,
    but never longer than the registry's client deadline: the defaults apply after that.
    """

    WATCHED_KEYS = tuple(key.value for key in ConfigKey)

    def __init__(
        self,
        config: ConfigClient,
        *,
        plan_id: str = "",
        reconnect_backoff_s: tuple[float, float] = (0.1, 1.0),
        watch_deadline_s: float = 300.0,
        initial: CheckpointSettings | None = None,
    ) -> None:
        self._config = config
        self._plan_id = plan_id
        self._backoff_initial_s, self._backoff_max_s = reconnect_backoff_s
        self._watch_deadline_s = watch_deadline_s
        # `initial`: what applies until the first read (the registry defaults unless given).
        self._settings = initial if initial is not None else CheckpointSettings()
        # Where each key's value came from (config_service_pb2.ConfigSource), once read.
        self._sources: dict[str, int] = {}
        self._refused: dict[str, Exception] = {}
        self._fetched = False
        # True from a background start until its first read has ended (answered or failed).
        self._first_read_pending = False
        self._changed = threading.Condition()
        self._closed = threading.Event()
        self._stream: ConfigWatch | None = None
        self._thread: threading.Thread | None = None

    @property
    def plan_id(self) -> str:
        """The plan whose effective settings this follows ("" for the global ones)."""
        return self._plan_id

    @property
    def fetched(self) -> bool:
        """True once a value was read from the server (else the defaults are in use)."""
        with self._changed:
            return self._fetched

    def current(self) -> CheckpointSettings:
        with self._changed:
            if self._first_read_pending:
                self._changed.wait_for(lambda: not self._first_read_pending, timeout=FIRST_READ_WAIT_S)
        return self._known()

    def known_with_sources(self, timeout: float) -> tuple[CheckpointSettings, dict[str, int]]:
        """The settings and each read key's source, after waiting at most `timeout` seconds for a
        first read still under way."""
        with self._changed:
            if self._first_read_pending:
                self._changed.wait_for(lambda: not self._first_read_pending, timeout=timeout)
            return self._known(), dict(self._sources)

    def _known(self) -> CheckpointSettings:
        """The settings as known now, without waiting for a first read."""
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
            if not is_unavailable(error):
                raise
            logger.warning("checkpointd config unreachable (%s); using %s settings", error, self._cache_kind())
            return self._known()
        for entry in entries:
            self._apply(entry)
        return self._known()

    def start(self, *, wait: bool = True) -> Self:
        """Read the settings once, then follow changes in a background thread.

        With `wait=False` the first read happens in that thread too, and start returns at once.
        """
        if wait:
            self.refresh()
        if self._thread is None:
            if not wait:
                with self._changed:
                    self._first_read_pending = True
            target = self._watch_forever if wait else self._read_then_watch
            self._thread = threading.Thread(target=target, name="checkpointd-config-watch", daemon=True)
            self._thread.start()
        return self

    def stop(self) -> None:
        """Stop following changes, without waiting for the thread (see close)."""
        self._closed.set()
        with self._changed:
            stream = self._stream
        if stream is not None:
            stream.cancel()

    def close(self) -> None:
        self.stop()
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
                self._sources[entry.key] = entry.source
            except ValueError as error:
                logger.error("refusing checkpointd config %s from the server: %s", entry.key, error)
                self._refused[entry.key] = error
                raise
            else:
                self._refused.pop(entry.key, None)
                self._fetched = True
            finally:
                self._changed.notify_all()

    def _read_then_watch(self) -> None:
        try:
            self.refresh()
        except ValueError:
            pass  # a value this client cannot use: _apply said so, and current() raises it
        except CheckpointdRpcError as error:  # refused (a bad token...); the watch below keeps trying
            if not self._closed.is_set():
                logger.error("could not read the checkpointd config: %s", error)
        finally:
            with self._changed:
                self._first_read_pending = False
                self._changed.notify_all()
        self._watch_forever()

    def _watch_forever(self) -> None:
        backoff_s = self._backoff_initial_s
        while not self._closed.is_set():
            try:
                stream = self._config.watch_config(
                    self.WATCHED_KEYS, plan_id=self._plan_id, timeout=self._watch_deadline_s
                )
            except ValueError:  # grpc's "closed channel": its owner closed it after stop()
                if self._closed.is_set():
                    return
                raise
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


# The CheckpointSettings field each key sets.
_FIELDS = {
    ConfigKey.AUTO_CREATE_ON.value: "auto_create_on",
    ConfigKey.ON_UNAVAILABLE.value: "on_unavailable",
    ConfigKey.CLIENT_DEADLINE_MS.value: "client_deadline_s",
}


class PlanSettings:
    """Each plan's own settings (a plan's override wins), on top of a connection's watcher.

    `current()` is the connection watcher's (global, or its bound plan's) settings; `for_plan(id)`
    those in force for one plan. The first call for a plan starts a watcher of that plan's effective
    values (a WatchConfig stream with its plan_id, read once, then kept fresh like the connection's
    own) and waits for its first read within the client deadline; later calls are lookups in
    memory. At most `max_plans` plans are followed, the least recently used one is dropped (its
    stream ended) for a new one. For each key, a value set on the plan itself comes from the plan's
    watcher; any other (global or default) from the connection's, which learns of a global change
    first when it watches the global values. While a plan's settings cannot be read, the
    connection's apply.
    """

    def __init__(
        self,
        config: ConfigClient,
        base: CheckpointConfigWatcher,
        *,
        max_plans: int = MAX_WATCHED_PLANS,
        watcher_options: dict[str, object] | None = None,
    ) -> None:
        self._config = config
        self._base = base
        self._max_plans = max_plans
        self._watcher_options = dict(watcher_options or {})
        self._plans: OrderedDict[str, CheckpointConfigWatcher] = OrderedDict()
        self._lock = threading.Lock()
        self._closed = False

    @property
    def base(self) -> CheckpointConfigWatcher:
        return self._base

    def watched_plans(self) -> list[str]:
        """The plans followed now, least recently used first."""
        with self._lock:
            return list(self._plans)

    def current(self) -> CheckpointSettings:
        return self._base.current()

    def for_plan(self, plan_id: str | None) -> CheckpointSettings:
        base_settings = self._base.current()
        if not plan_id or plan_id == self._base.plan_id:
            return base_settings
        watcher = self._watcher(plan_id, base_settings)
        if watcher is None:
            return base_settings
        plan_settings, plan_sources = watcher.known_with_sources(timeout=base_settings.client_deadline_s)
        _, base_sources = self._base.known_with_sources(timeout=0)
        merged: dict[str, object] = {}
        for key, attribute in _FIELDS.items():
            plan_source = plan_sources.get(key)
            if plan_source == config_service_pb2.CONFIG_SOURCE_PLAN:
                merged[attribute] = getattr(plan_settings, attribute)
            elif base_sources.get(key) != config_service_pb2.CONFIG_SOURCE_PLAN:
                merged[attribute] = getattr(base_settings, attribute)  # global or default: the same for every plan
            elif plan_source is not None:
                merged[attribute] = getattr(plan_settings, attribute)
            else:  # the base is another plan's override and this plan's value is unknown
                merged[attribute] = getattr(CheckpointSettings(), attribute)
        return replace(base_settings, **merged)

    def _watcher(self, plan_id: str, seed: CheckpointSettings) -> CheckpointConfigWatcher | None:
        evicted: CheckpointConfigWatcher | None = None
        with self._lock:
            if self._closed:
                return None
            watcher = self._plans.get(plan_id)
            if watcher is not None:
                self._plans.move_to_end(plan_id)
                return watcher
            watcher = CheckpointConfigWatcher(self._config, plan_id=plan_id, initial=seed, **self._watcher_options)
            self._plans[plan_id] = watcher
            if len(self._plans) > self._max_plans:
                _, evicted = self._plans.popitem(last=False)
            watcher.start(wait=False)
        if evicted is not None:
            evicted.stop()
        return watcher

    def stop(self) -> None:
        """Stop following every plan (and refuse new ones), without waiting for the threads."""
        with self._lock:
            self._closed = True
            watchers = list(self._plans.values())
        for watcher in watchers:
            watcher.stop()

    def close(self) -> None:
        self.stop()
        with self._lock:
            watchers = list(self._plans.values())
            self._plans.clear()
        for watcher in watchers:
            watcher.close()


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

    def settings(self, plan_id: str | None = None) -> CheckpointSettings:
        """The settings in force; for `plan_id`, that plan's own where the source knows them
        (a PlanSettings: a plan's override wins)."""
        for_plan = getattr(self._source, "for_plan", None)
        if plan_id and for_plan is not None:
            return for_plan(plan_id)
        return self._source.current()

    def is_enabled(self, trigger: str | AutoTrigger, settings: CheckpointSettings | None = None) -> bool:
        """True when the server's auto_create_on lists the trigger and no local switch turned it off."""
        parsed = AutoTrigger.parse(trigger)
        current = settings if settings is not None else self.settings()
        return parsed in current.auto_create_on and parsed not in self._disabled
