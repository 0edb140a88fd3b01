"""Typed configuration registry and its store.

Every key is declared once here with its default, description and validator; anything
else is refused. A value is set globally or overridden for one plan; the effective value
is the plan's override, else the global value, else the default.
"""

from __future__ import annotations

import difflib
import enum
import hashlib
import json
import threading
from collections.abc import Callable
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from sqlalchemy.exc import IntegrityError
from sqlmodel import select

from checkpointd.core.capture.gitignore import MAX_PATTERN_BYTES, refusal
from checkpointd.core.kernel.errors import Aborted, InvalidArgument, Reason
from checkpointd.core.kernel.vocabulary import AUTO_TRIGGERS
from checkpointd.core.metadata.db import Database
from checkpointd.core.metadata.models import ConfigRow, utcnow


class Source(enum.Enum):
    DEFAULT = "default"
    GLOBAL = "global"
    PLAN = "plan"


class OnUnavailable(enum.StrEnum):
    """What a client does when checkpointd cannot be reached in time."""

    PROCEED = "proceed"
    REFUSE = "refuse"


Validator = Callable[[Any], Any]


@dataclass(frozen=True)
class ConfigKey:
    name: str
    default: Any
    description: str
    validate: Validator
    #: Further checks for a value being set, not for one already stored (which still resolves as
    #: ``validate`` allows): what was accepted before keeps working as it did.
    admit: Validator | None = None


def _integer(low: int, high: int) -> Validator:
    def check(value: Any) -> int:
        if isinstance(value, bool) or not isinstance(value, int | float) or int(value) != value:
            raise ValueError("must be an integer")
        if not low <= value <= high:
            raise ValueError(f"must be between {low} and {high}")
        return int(value)

    return check


def _string_list(max_items: int, max_length: int, item: Callable[[str], str] = str) -> Validator:
    def check(value: Any) -> list[str]:
        if not isinstance(value, list) or not all(isinstance(v, str) for v in value):
            raise ValueError("must be a list of strings")
        if len(value) > max_items:
            raise ValueError(f"must have at most {max_items} items")
        if any(len(v) > max_length for v in value):
            raise ValueError(f"items must be at most {max_length} characters")
        return [item(v) for v in value]

    return check


def _trigger_name(name: str) -> str:
    if name not in {t.value for t in AUTO_TRIGGERS}:
        known = ", ".join(t.value for t in AUTO_TRIGGERS)
        raise ValueError(f"unknown trigger {name!r}; automatic triggers are: {known}")
    return name


def _triggers(value: Any) -> list[str]:
    names = _string_list(len(AUTO_TRIGGERS), 64, _trigger_name)(value)
    if len(set(names)) != len(names):
        raise ValueError("lists a trigger twice")
    return names


def _ignore_patterns(value: list[str]) -> list[str]:
    for pattern in value:
        why = refusal(pattern)
        if why is not None:
            shown = pattern if len(pattern) <= 80 else pattern[:80] + "..."
            raise ValueError(f"pattern {shown!r} {why}")
    return value


def _one_of(kind: type[enum.StrEnum]) -> Validator:
    def check(value: Any) -> str:
        if not isinstance(value, str) or value not in {v.value for v in kind}:
            raise ValueError(f"must be one of: {', '.join(v.value for v in kind)}")
        return value

    return check


AUTO_CREATE_ON = "core.checkpoints.auto_create_on"
ON_UNAVAILABLE = "core.checkpoints.on_unavailable"
CLIENT_DEADLINE_MS = "core.checkpoints.client_deadline_ms"
IGNORE_PATTERNS = "core.snapshot.ignore_patterns"
MAX_FILE_SIZE_BYTES = "core.snapshot.max_file_size_bytes"
RETENTION_MAX_CHECKPOINTS = "core.retention.max_checkpoints_per_plan"
RETENTION_MAX_AGE_SECONDS = "core.retention.max_age_seconds"
RETENTION_SAFETY_MAX_AGE_SECONDS = "core.retention.safety_max_age_seconds"
_TEN_YEARS_SECONDS = 10 * 366 * 24 * 3600

REGISTRY: dict[str, ConfigKey] = {
    key.name: key
    for key in (
        ConfigKey(
            AUTO_CREATE_ON,
            [t.value for t in AUTO_TRIGGERS],
            "Automatic triggers that create checkpoints: any of before_tool_execute, after_tool_execute, "
            "on_subplan_spawn, on_error. Unknown names are refused.",
            _triggers,
        ),
        ConfigKey(
            ON_UNAVAILABLE,
            OnUnavailable.PROCEED.value,
            "What a client does when checkpointd does not answer within its deadline: 'proceed' (log a "
            "warning and run the tool without a checkpoint) or 'refuse' (do not run the write tool).",
            _one_of(OnUnavailable),
        ),
        ConfigKey(
            CLIENT_DEADLINE_MS,
            5000,
            "Deadline in milliseconds that clients put on each checkpoint call (1 to 600000).",
            _integer(1, 600_000),
        ),
        ConfigKey(
            IGNORE_PATTERNS,
            [],
            "Extra gitignore patterns left out of every capture, on top of the workspace's own "
            ".gitignore files (which take precedence, as git's excludes file does), one pattern per item in "
            f"git's syntax. At most 1000, each at most {MAX_PATTERN_BYTES} bytes; a pattern that can never match "
            "(a bare '!', a trailing backslash, an unclosed '[', a comment, an empty one) is refused.",
            _string_list(1000, MAX_PATTERN_BYTES),
            _ignore_patterns,
        ),
        ConfigKey(
            MAX_FILE_SIZE_BYTES,
            64 * 1024 * 1024,
            "Files larger than this many bytes are recorded as skipped instead of captured (0 to 2^40).",
            _integer(0, 1 << 40),
        ),
        ConfigKey(
            RETENTION_MAX_CHECKPOINTS,
            0,
            "Retention: keep at most this many checkpoints per plan, newest first; older ones are pruned by the "
            "server's periodic GC. 0 keeps all. Pinned checkpoints (label pinned=true) and rollback safety "
            "checkpoints are not counted and never pruned by this rule.",
            _integer(0, 1_000_000),
        ),
        ConfigKey(
            RETENTION_MAX_AGE_SECONDS,
            0,
            "Retention: prune checkpoints older than this many seconds. 0 keeps them forever. A plan's newest "
            "checkpoint, pinned checkpoints and rollback safety checkpoints are never pruned by this rule.",
            _integer(0, _TEN_YEARS_SECONDS),
        ),
        ConfigKey(
            RETENTION_SAFETY_MAX_AGE_SECONDS,
            0,
            "Retention of rollback safety checkpoints: prune them once older than this many seconds. 0 keeps "
            "them forever. Pinned ones are never pruned.",
            _integer(0, _TEN_YEARS_SECONDS),
        ),
    )
}


@dataclass(frozen=True)
class Effective:
    key: ConfigKey
    value: Any
    source: Source
    plan_id: str
    update_time: datetime | None

    @property
    def etag(self) -> str:
        """Identifies this effective value (AIP-154), derived from what makes it: a set moves its
        update_time even to the same value, so no change goes unnoticed."""
        basis = [self.key.name, self.plan_id, self.source.name, self.value,
                 self.update_time.isoformat() if self.update_time is not None else ""]
        return hashlib.sha256(json.dumps(basis, sort_keys=True).encode()).hexdigest()[:24]


def lookup_key(name: str) -> ConfigKey:
    try:
        return REGISTRY[name]
    except KeyError:
        close = difflib.get_close_matches(name, REGISTRY, n=1)
        meant = f"did you mean {close[0]!r}? " if close else ""
        raise InvalidArgument(Reason.UNKNOWN_CONFIG_KEY, f"unknown config key {name!r}: {meant}the keys are "
                              f"{', '.join(sorted(REGISTRY))}", key=name) from None


def validate_value(key: ConfigKey, value: Any) -> Any:
    """A value about to be set, checked and normalized."""
    try:
        value = key.validate(value)
        return key.admit(value) if key.admit is not None else value
    except ValueError as exc:
        raise InvalidArgument(
            Reason.INVALID_CONFIG_VALUE, f"invalid value for {key.name}: {exc}", key=key.name, detail=str(exc)
        ) from None


class ConfigStore:
    """Config values in the database. On SQLite, whose database only this server writes,
    resolved values are cached until the next local change; on PostgreSQL other replicas
    write too, so every resolve reads the database."""

    #: Resolutions kept at most; the cache starts over past this many.
    CACHE_LIMIT = 4096

    def __init__(self, db: Database) -> None:
        self.db = db
        self._changed = threading.Condition()
        #: This process's changes take turns (see ``_change``).
        self._turns = threading.Lock()
        self._version = 0
        self._listeners: list[Callable[[], None]] = []
        self._cache: dict[tuple[str, tuple[str, ...]], tuple[int, dict[str, Effective]]] | None = (
            {} if db.is_sqlite else None)

    @property
    def version(self) -> int:
        return self._version

    def resolve(self, name: str, plan_id: str = "") -> Effective:
        return self.resolve_many([name], plan_id)[name]

    def resolve_many(self, names: list[str], plan_id: str = "") -> dict[str, Effective]:
        if self._cache is None:
            return self._read(names, plan_id)
        # The version is read before the database: a change racing this read bumps it after.
        version = self._version
        cache_key = (plan_id, tuple(names))
        hit = self._cache.get(cache_key)
        if hit is not None and hit[0] == version:
            return dict(hit[1])
        resolved = self._read(names, plan_id)
        if len(self._cache) >= self.CACHE_LIMIT:
            self._cache.clear()
        self._cache[cache_key] = (version, resolved)
        return dict(resolved)

    def _read(self, names: list[str], plan_id: str) -> dict[str, Effective]:
        keys = [lookup_key(n) for n in names]
        with self.db.session() as session:
            rows = session.exec(_rows_of(names, plan_id)).all()
        found = {(r.plan_id, r.key): r for r in rows}
        return {key.name: _effective(key, plan_id, found) for key in keys}

    def set(self, name: str, value: Any, plan_id: str = "", etag: str = "") -> Effective:
        """Sets the value at ``plan_id``'s scope (global when empty); with ``etag``, only if the
        effective value there still has it (else Aborted / ETAG_MISMATCH)."""
        key = lookup_key(name)
        value = validate_value(key, value)

        def write(session, row: ConfigRow | None) -> None:
            if row is None:
                row = ConfigRow(plan_id=plan_id, key=name, value=value)
            else:
                row.value = value
                row.update_time = utcnow()
            session.add(row)

        try:
            self._change(key, plan_id, etag, write)
        except IntegrityError:
            # Another replica inserted the first value for this key at the same moment: update it
            # (with an etag, checked again: it was the value's absence that matched).
            self._change(key, plan_id, etag, write)
        self._notify()
        return self.resolve(name, plan_id)

    def clear(self, name: str, plan_id: str = "", etag: str = "") -> Effective:
        """Removes the value at ``plan_id``'s scope; with ``etag``, as ``set``."""
        key = lookup_key(name)

        def delete(session, row: ConfigRow | None) -> None:
            if row is not None:
                session.delete(row)

        self._change(key, plan_id, etag, delete)
        self._notify()
        return self.resolve(name, plan_id)

    def _change(self, key: ConfigKey, plan_id: str, etag: str,
                change: Callable[[Any, ConfigRow | None], None]) -> None:
        """Runs ``change`` on the row at ``plan_id``'s scope in one transaction, after checking
        ``etag`` against the effective value: rows locked on PostgreSQL (another replica's change
        waits), changes taking turns in this process on SQLite (the only server on its database)."""
        with self._turns, self.db.session() as session:
            rows = session.exec(_rows_of([key.name], plan_id).with_for_update()).all()
            found = {(r.plan_id, r.key): r for r in rows}
            if etag:
                current = _effective(key, plan_id, found)
                if current.etag != etag:
                    raise Aborted(Reason.ETAG_MISMATCH,
                                  f"{key.name} changed since it was read (etag {etag!r}, now {current.etag!r}): read "
                                  "it again and decide on the value it has now", key=key.name, plan_id=plan_id,
                                  etag=current.etag)
            change(session, found.get((plan_id, key.name)))
            session.commit()

    def _notify(self) -> None:
        with self._changed:
            self._version += 1
            self._changed.notify_all()
            listeners = list(self._listeners)
        for listener in listeners:
            listener()

    def on_change(self, listener: Callable[[], None]) -> Callable[[], None]:
        """Calls ``listener`` (on the changing thread; it must not block) after every local change
        and on ``wake_all``, for watchers that cannot wait on a thread; returns its removal."""
        with self._changed:
            self._listeners.append(listener)

        def remove() -> None:
            with self._changed:
                self._listeners.remove(listener)

        return remove

    def wait_for_change(self, seen_version: int, timeout: float) -> int:
        """Blocks until a local change after ``seen_version`` or the timeout; returns the version.

        Watchers also re-read on timeout, which picks up changes made by other replicas.
        """
        with self._changed:
            self._changed.wait_for(lambda: self._version != seen_version, timeout=timeout)
            return self._version

    def wake_all(self) -> None:
        """Wakes every watcher (used on shutdown)."""
        self._notify()


def _rows_of(names: list[str], plan_id: str):
    """The stored values of ``names`` at the scopes that resolve for ``plan_id``."""
    scopes = ["", plan_id] if plan_id else [""]
    return select(ConfigRow).where(ConfigRow.key.in_(names), ConfigRow.plan_id.in_(scopes))  # type: ignore[attr-defined]


def _effective(key: ConfigKey, plan_id: str, found: dict[tuple[str, str], ConfigRow]) -> Effective:
    """The plan's value, else the global one, else the default; a stored value that no longer
    passes the key's schema (written by another release) is passed over as if it were not there."""
    for row, source in ((found.get((plan_id, key.name)) if plan_id else None, Source.PLAN),
                        (found.get(("", key.name)), Source.GLOBAL)):
        if row is None:
            continue
        try:
            value = key.validate(row.value)
        except ValueError:
            continue
        return Effective(key, value, source, plan_id, row.update_time)
    return Effective(key, key.default, Source.DEFAULT, plan_id, None)
