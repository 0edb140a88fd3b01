"""The config registry's promises, in process (fast enough to run against every mutant).

What a user is told (each key's description, ConfigService in config_service.proto): keys come
from a fixed registry, a value that fails its key's schema is refused with INVALID_CONFIG_VALUE
(naming the key and why), an unknown key with UNKNOWN_CONFIG_KEY, and the effective value is the
plan's override, else the global value, else the default. The wire form of these errors is
pinned by tests/service/test_errors.py and tests/service/test_config.py.
"""

from __future__ import annotations

import threading
from pathlib import Path

import pytest
from sqlmodel import select

from checkpointd.core.capture.gitignore import MAX_PATTERN_BYTES
from checkpointd.core.config.registry import (
    AUTO_CREATE_ON,
    CLIENT_DEADLINE_MS,
    IGNORE_PATTERNS,
    MAX_FILE_SIZE_BYTES,
    ON_UNAVAILABLE,
    REGISTRY,
    RETENTION_MAX_AGE_SECONDS,
    RETENTION_MAX_CHECKPOINTS,
    RETENTION_SAFETY_MAX_AGE_SECONDS,
    ConfigStore,
    Source,
)
from checkpointd.core.kernel.errors import InvalidArgument, Reason
from checkpointd.core.metadata.db import Database
from checkpointd.core.metadata.models import ConfigRow

ALL_TRIGGERS = ["before_tool_execute", "after_tool_execute", "on_subplan_spawn", "on_error"]
TEN_YEARS_SECONDS = 10 * 366 * 24 * 3600
PLAN = "plan-1"

#: Each integer key with the inclusive range its description states.
INTEGER_RANGES = {
    CLIENT_DEADLINE_MS: (1, 600_000),
    MAX_FILE_SIZE_BYTES: (0, 1 << 40),
    RETENTION_MAX_CHECKPOINTS: (0, 1_000_000),
    RETENTION_MAX_AGE_SECONDS: (0, TEN_YEARS_SECONDS),
    RETENTION_SAFETY_MAX_AGE_SECONDS: (0, TEN_YEARS_SECONDS),
}


def open_database(url: str) -> Database:
    db = Database(url)
    db.migrate()
    return db


@pytest.fixture
def db(tmp_path: Path) -> Database:
    return open_database(f"sqlite:///{tmp_path / 'meta.db'}")


@pytest.fixture
def store(db: Database) -> ConfigStore:
    return ConfigStore(db)


def refused(store: ConfigStore, key: str, value: object, plan_id: str = "") -> InvalidArgument:
    """Sets a bad value: it must be refused, and change nothing."""
    before = store.resolve(key, plan_id)
    with pytest.raises(InvalidArgument) as caught:
        store.set(key, value, plan_id)
    assert caught.value.reason is Reason.INVALID_CONFIG_VALUE
    assert caught.value.metadata["key"] == key and caught.value.metadata["detail"]
    assert caught.value.metadata["detail"] in caught.value.message
    after = store.resolve(key, plan_id)
    assert (after.value, after.source) == (before.value, before.source)
    return caught.value


def store_raw(db: Database, key: str, value: object, plan_id: str = "") -> None:
    """A value stored without the checks of `set`: one an older server accepted."""
    with db.session() as session:
        session.add(ConfigRow(plan_id=plan_id, key=key, value=value))
        session.commit()


@pytest.mark.parametrize("key", sorted(INTEGER_RANGES))
def test_integer_keys_accept_their_stated_range_inclusive_and_refuse_what_lies_outside(store, key):
    low, high = INTEGER_RANGES[key]
    for good in (low, high):
        assert store.set(key, good).value == good
    for bad in (low - 1, high + 1):
        assert "between" in refused(store, key, bad).metadata["detail"]


@pytest.mark.parametrize("key", sorted(INTEGER_RANGES))
def test_integer_keys_refuse_booleans_fractions_and_text_and_normalize_whole_floats(store, key):
    low, high = INTEGER_RANGES[key]
    for bad in (True, False, 1.5, "10", None, [low]):
        assert refused(store, key, bad).metadata["detail"] == "must be an integer"
    middle = (low + high) // 2
    effective = store.set(key, float(middle))
    assert effective.value == middle and type(effective.value) is int


def test_triggers_are_a_closed_vocabulary_each_listed_at_most_once(store):
    assert store.set(AUTO_CREATE_ON, ALL_TRIGGERS).value == ALL_TRIGGERS
    assert store.set(AUTO_CREATE_ON, []).value == []
    assert store.set(AUTO_CREATE_ON, ["on_error"]).value == ["on_error"]
    unknown = refused(store, AUTO_CREATE_ON, ["on_error", "on_tuesday"]).metadata["detail"]
    assert "on_tuesday" in unknown and all(t in unknown for t in ALL_TRIGGERS)
    # The server records rollback and manual checkpoints itself: they are not automatic triggers.
    for not_automatic in ("rollback", "manual", ""):
        refused(store, AUTO_CREATE_ON, [not_automatic])
    assert "twice" in refused(store, AUTO_CREATE_ON, ["on_error", "on_error"]).metadata["detail"]
    assert "at most 4" in refused(store, AUTO_CREATE_ON, [*ALL_TRIGGERS, "on_error"]).metadata["detail"]
    for not_a_list in ("on_error", None, {"on_error": True}, ["on_error", 1]):
        assert refused(store, AUTO_CREATE_ON, not_a_list).metadata["detail"] == "must be a list of strings"


def test_on_unavailable_is_proceed_or_refuse_and_nothing_else(store):
    assert store.resolve(ON_UNAVAILABLE).value == "proceed"
    assert store.set(ON_UNAVAILABLE, "refuse").value == "refuse"
    assert store.set(ON_UNAVAILABLE, "proceed").value == "proceed"
    for bad in ("maybe", "REFUSE", "", 1, None, ["refuse"]):
        assert refused(store, ON_UNAVAILABLE, bad).metadata["detail"] == "must be one of: proceed, refuse"


def test_ignore_patterns_have_a_bounded_count_and_length(store):
    longest = "a" * MAX_PATTERN_BYTES
    assert store.set(IGNORE_PATTERNS, [longest]).value == [longest]
    many = [f"build-{i}/" for i in range(1000)]
    assert store.set(IGNORE_PATTERNS, many).value == many
    assert "at most 1000" in refused(store, IGNORE_PATTERNS, [*many, "one-more"]).metadata["detail"]
    too_long = refused(store, IGNORE_PATTERNS, ["*.log", longest + "a"]).metadata["detail"]
    assert f"at most {MAX_PATTERN_BYTES} characters" in too_long
    refused(store, IGNORE_PATTERNS, "*.log")


@pytest.mark.parametrize("pattern", ["!", "trailing\\", "[unclosed", "[[:nope:]]", "# a comment", "", "a\nb"])
def test_ignore_patterns_that_can_never_match_are_refused_naming_the_pattern(store, pattern):
    detail = refused(store, IGNORE_PATTERNS, ["*.log", pattern]).metadata["detail"]
    assert detail.startswith(f"pattern {pattern!r} ")


def test_a_refused_long_pattern_is_shown_clipped(store):
    pattern = "[" + "x" * 100
    detail = refused(store, IGNORE_PATTERNS, [pattern]).metadata["detail"]
    assert detail.startswith(f"pattern {pattern[:80] + '...'!r} ")
    exactly_80 = "[" + "x" * 79
    assert refused(store, IGNORE_PATTERNS, [exactly_80]).metadata["detail"].startswith(f"pattern {exactly_80!r} ")


def test_a_pattern_stored_before_it_was_refused_keeps_working(db, store):
    """`admit` checks a value being set only: what an older server accepted still resolves."""
    store_raw(db, IGNORE_PATTERNS, ["*.log", "!"])
    effective = store.resolve(IGNORE_PATTERNS)
    assert (effective.value, effective.source) == (["*.log", "!"], Source.GLOBAL)


def test_a_stored_value_that_fails_its_schema_resolves_to_the_default(db, store):
    store_raw(db, CLIENT_DEADLINE_MS, 0)
    store_raw(db, ON_UNAVAILABLE, "refuse", PLAN)
    store_raw(db, AUTO_CREATE_ON, ["on_tuesday"], PLAN)
    deadline = store.resolve(CLIENT_DEADLINE_MS, PLAN)
    assert (deadline.value, deadline.source) == (5000, Source.DEFAULT)
    triggers = store.resolve(AUTO_CREATE_ON, PLAN)
    assert (triggers.value, triggers.source) == (ALL_TRIGGERS, Source.DEFAULT)
    assert store.resolve(ON_UNAVAILABLE, PLAN).value == "refuse"


def test_a_default_standing_in_for_an_invalid_stored_value_has_no_update_time(db, store):
    store_raw(db, CLIENT_DEADLINE_MS, 0)
    effective = store.resolve(CLIENT_DEADLINE_MS)
    assert (effective.source, effective.update_time) == (Source.DEFAULT, None)


def test_an_invalid_plan_value_falls_back_to_the_global_one(db, store):
    """A plan's stored value that no longer passes its schema is passed over as if it were not
    there: the global value applies (with its own update_time), not the default."""
    store.set(CLIENT_DEADLINE_MS, 7000)
    store_raw(db, CLIENT_DEADLINE_MS, 0, PLAN)
    effective = store.resolve(CLIENT_DEADLINE_MS, PLAN)
    assert (effective.value, effective.source) == (7000, Source.GLOBAL)
    assert effective.update_time == store.resolve(CLIENT_DEADLINE_MS).update_time is not None


def test_unknown_keys_are_refused_by_every_call(store):
    for call in (lambda: store.resolve("core.nope"), lambda: store.set("core.nope", 1),
                 lambda: store.clear("core.nope"), lambda: store.resolve_many([ON_UNAVAILABLE, "core.nope"])):
        with pytest.raises(InvalidArgument) as caught:
            call()
        assert caught.value.reason is Reason.UNKNOWN_CONFIG_KEY and caught.value.metadata == {"key": "core.nope"}


def test_the_plan_override_wins_over_the_global_value_which_wins_over_the_default(store):
    assert store.resolve(CLIENT_DEADLINE_MS, PLAN).source is Source.DEFAULT
    globally = store.set(CLIENT_DEADLINE_MS, 2000)
    assert (globally.value, globally.source, globally.plan_id) == (2000, Source.GLOBAL, "")
    assert globally.update_time is not None
    assert (store.resolve(CLIENT_DEADLINE_MS, PLAN).value, store.resolve(CLIENT_DEADLINE_MS, PLAN).source) \
        == (2000, Source.GLOBAL)
    override = store.set(CLIENT_DEADLINE_MS, 3000, PLAN)
    assert (override.value, override.source, override.plan_id) == (3000, Source.PLAN, PLAN)
    assert store.resolve(CLIENT_DEADLINE_MS).value == 2000
    assert store.resolve(CLIENT_DEADLINE_MS, "plan-2").value == 2000
    changed = store.set(CLIENT_DEADLINE_MS, 4000, PLAN)
    assert (changed.value, changed.source) == (4000, Source.PLAN) and changed.update_time >= override.update_time
    cleared = store.clear(CLIENT_DEADLINE_MS, PLAN)
    assert (cleared.value, cleared.source) == (2000, Source.GLOBAL)
    default = store.clear(CLIENT_DEADLINE_MS)
    assert (default.value, default.source, default.update_time) == (5000, Source.DEFAULT, None)
    assert store.clear(CLIENT_DEADLINE_MS).source is Source.DEFAULT  # clearing nothing is not an error


def test_resolving_many_keys_gives_each_its_own_source(store):
    store.set(ON_UNAVAILABLE, "refuse")
    store.set(CLIENT_DEADLINE_MS, 100, PLAN)
    resolved = store.resolve_many([ON_UNAVAILABLE, CLIENT_DEADLINE_MS, MAX_FILE_SIZE_BYTES], PLAN)
    assert {name: (e.value, e.source) for name, e in resolved.items()} == {
        ON_UNAVAILABLE: ("refuse", Source.GLOBAL), CLIENT_DEADLINE_MS: (100, Source.PLAN),
        MAX_FILE_SIZE_BYTES: (64 * 1024 * 1024, Source.DEFAULT)}


def test_every_resolve_after_a_change_sees_it_however_many_were_cached(store, monkeypatch):
    monkeypatch.setattr(ConfigStore, "CACHE_LIMIT", 3)
    plans = [f"plan-{i}" for i in range(5)]
    for plan in plans:  # more resolutions than the cache keeps
        assert store.resolve(ON_UNAVAILABLE, plan).value == "proceed"
    store.set(ON_UNAVAILABLE, "refuse")
    assert [store.resolve(ON_UNAVAILABLE, plan).value for plan in plans] == ["refuse"] * 5
    store.set(ON_UNAVAILABLE, "proceed", plans[0])
    assert store.resolve(ON_UNAVAILABLE, plans[0]).value == "proceed"
    store.clear(ON_UNAVAILABLE, plans[0])
    assert store.resolve(ON_UNAVAILABLE, plans[0]).value == "refuse"
    resolved = store.resolve_many([ON_UNAVAILABLE], plans[1])
    resolved.clear()  # a caller's copy: the cache keeps its own
    assert store.resolve(ON_UNAVAILABLE, plans[1]).value == "refuse"


def test_on_postgresql_a_value_set_by_another_replica_is_seen_at_once(postgres):
    """Other replicas write the same database: a PostgreSQL server must never answer from a cache."""
    url = postgres.create()
    try:
        here, there = ConfigStore(open_database(url)), ConfigStore(open_database(url))
        assert here.resolve(ON_UNAVAILABLE).value == "proceed"
        there.set(ON_UNAVAILABLE, "refuse")
        assert here.resolve(ON_UNAVAILABLE).value == "refuse"
    finally:
        postgres.drop(url)


def test_every_local_change_wakes_watchers_and_listeners_until_removed(store):
    seen: list[int] = []
    remove = store.on_change(lambda: seen.append(store.version))
    start = store.version
    assert store.wait_for_change(start, timeout=0) == start  # nothing changed yet
    store.set(ON_UNAVAILABLE, "refuse")
    assert store.wait_for_change(start, timeout=0) == start + 1 == store.version
    store.clear(ON_UNAVAILABLE)
    store.wake_all()
    assert seen == [start + 1, start + 2, start + 3]
    remove()
    store.set(ON_UNAVAILABLE, "refuse")
    assert seen == [start + 1, start + 2, start + 3]
    with pytest.raises(InvalidArgument):
        store.set(ON_UNAVAILABLE, "maybe")
    assert store.version == start + 4  # a refused value changes nothing, so wakes nobody


class _ObservedCondition(threading.Condition):
    """The store's condition, telling the test when a watcher has started waiting on it."""

    def __init__(self) -> None:
        super().__init__()
        self.waiting = threading.Event()

    def wait(self, timeout: float | None = None) -> bool:
        self.waiting.set()
        return super().wait(timeout)


def test_a_watcher_waits_for_the_next_change_and_is_woken_by_it(store):
    store._changed = observed = _ObservedCondition()
    start = store.version
    woke: list[int] = []

    def watch() -> None:
        try:
            woke.append(store.wait_for_change(start, timeout=60))
        finally:
            observed.waiting.set()  # also when it returned without waiting: the test then fails

    waiter = threading.Thread(target=watch)
    waiter.start()
    assert observed.waiting.wait(timeout=60)
    store.set(ON_UNAVAILABLE, "refuse")
    waiter.join(timeout=60)
    assert woke == [start + 1]


def test_the_defaults_are_the_ones_the_readme_states(store):
    """README's config tables: every trigger on, proceed, 5 s, no extra patterns, 64 MiB, and
    retention keeping everything (a default that prunes would delete checkpoints nobody asked to)."""
    resolved = store.resolve_many(sorted(REGISTRY), PLAN)
    assert {name: e.value for name, e in resolved.items()} == {
        AUTO_CREATE_ON: ALL_TRIGGERS, ON_UNAVAILABLE: "proceed", CLIENT_DEADLINE_MS: 5000, IGNORE_PATTERNS: [],
        MAX_FILE_SIZE_BYTES: 67108864, RETENTION_MAX_CHECKPOINTS: 0, RETENTION_MAX_AGE_SECONDS: 0,
        RETENTION_SAFETY_MAX_AGE_SECONDS: 0}
    assert {e.source for e in resolved.values()} == {Source.DEFAULT}
    assert {e.update_time for e in resolved.values()} == {None}


def test_every_key_has_a_description_and_a_default_its_own_schema_accepts():
    for key in REGISTRY.values():
        assert key.description
        assert key.validate(key.default) == key.default


def test_stored_rows_hold_the_normalized_value(db, store):
    store.set(CLIENT_DEADLINE_MS, 2500.0)
    with db.session() as session:
        row = session.exec(select(ConfigRow).where(ConfigRow.key == CLIENT_DEADLINE_MS)).one()
    assert row.value == 2500 and type(row.value) is int
