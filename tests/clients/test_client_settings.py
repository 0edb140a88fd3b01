"""The client's reading of `core.checkpoints.*`: each key's schema, the cache kept when checkpointd is
unreachable, and a watch that follows changes across stream deadlines and broken streams.

Written from the README's promises on the client ("the server's settings are read once and kept
fresh"; "a value the client cannot understand is refused loudly"). These run in-process against a
scripted ConfigService (a fake that can fail on demand), in a second or two, so `make mutants`
runs them per mutant of `checkpointd_client/policy.py`.
"""

from __future__ import annotations

import logging
import socket
import threading

import grpc
import pytest

from checkpointd_client import (
    AutoTrigger,
    CheckpointConfigWatcher,
    CheckpointdRpcError,
    CheckpointSettings,
    ConfigClient,
    ConfigKey,
    FixedSettings,
    OnUnavailable,
    TriggerPolicy,
    open_channel,
)
from checkpointd_client import policy as policy_module
from checkpointd_client.errors import InvalidConfigValueError

WAIT_S = 30


def _watcher(target: str, **kwargs) -> CheckpointConfigWatcher:
    return CheckpointConfigWatcher(ConfigClient(open_channel(target)), **kwargs)


@pytest.mark.parametrize(
    ("key", "value"),
    [
        (ConfigKey.AUTO_CREATE_ON, "before_tool_execute"),
        (ConfigKey.AUTO_CREATE_ON, ["on_error", 3]),
        (ConfigKey.ON_UNAVAILABLE, 1),
        (ConfigKey.ON_UNAVAILABLE, "maybe"),
        (ConfigKey.CLIENT_DEADLINE_MS, 0),
        (ConfigKey.CLIENT_DEADLINE_MS, -5),
        (ConfigKey.CLIENT_DEADLINE_MS, 1.5),
        (ConfigKey.CLIENT_DEADLINE_MS, True),
        (ConfigKey.CLIENT_DEADLINE_MS, "100"),
        ("core.checkpoints.something_else", 1),
    ],
)
def test_a_value_outside_its_keys_schema_is_refused(key: str, value) -> None:
    with pytest.raises(InvalidConfigValueError) as refused:
        CheckpointSettings().with_value(key, value)
    assert refused.value.key == key


@pytest.mark.parametrize(("value", "seconds"), [(750, 0.75), (1, 0.001), (2000.0, 2.0)])
def test_client_deadline_ms_becomes_seconds(value, seconds: float) -> None:
    assert CheckpointSettings().with_value(ConfigKey.CLIENT_DEADLINE_MS, value).client_deadline_s == seconds


def test_each_key_replaces_only_its_own_setting() -> None:
    settings = (
        CheckpointSettings()
        .with_value(ConfigKey.AUTO_CREATE_ON, ["on_error"])
        .with_value(ConfigKey.ON_UNAVAILABLE, "refuse")
    )

    assert settings == CheckpointSettings(
        auto_create_on=frozenset({AutoTrigger.ON_ERROR}), on_unavailable=OnUnavailable.REFUSE, client_deadline_s=5.0
    )
    assert CheckpointSettings().with_value(ConfigKey.AUTO_CREATE_ON, []).auto_create_on == frozenset()


def test_refresh_reads_every_key_for_the_plan_and_says_what_changed(scripted_config_server, caplog) -> None:
    service = scripted_config_server.service
    service.push(ConfigKey.AUTO_CREATE_ON, ["before_tool_execute"])
    service.push(ConfigKey.ON_UNAVAILABLE, "refuse")
    service.push(ConfigKey.CLIENT_DEADLINE_MS, 1250)
    watcher = _watcher(scripted_config_server.target, plan_id="plan-7")
    assert not watcher.fetched

    with caplog.at_level(logging.INFO, logger="checkpointd_client"):
        settings = watcher.refresh()

    assert settings == watcher.current() == CheckpointSettings(
        auto_create_on=frozenset({AutoTrigger.BEFORE_TOOL_EXECUTE}),
        on_unavailable=OnUnavailable.REFUSE,
        client_deadline_s=1.25,
    )
    assert watcher.fetched
    assert service.plans_read == ["plan-7"] * 3
    assert 'checkpointd config core.checkpoints.on_unavailable is now "refuse" (global)' in caplog.text


def test_an_unreachable_server_leaves_the_defaults_then_the_last_known_settings(scripted_config_server, caplog) -> None:
    with socket.socket() as unused:
        unused.bind(("127.0.0.1", 0))
        nobody_listens = f"127.0.0.1:{unused.getsockname()[1]}"
    with caplog.at_level(logging.WARNING, logger="checkpointd_client"):
        assert _watcher(nobody_listens).refresh() == CheckpointSettings()
    assert "using default settings" in caplog.text

    service = scripted_config_server.service
    service.push(ConfigKey.ON_UNAVAILABLE, "refuse")
    watcher = _watcher(scripted_config_server.target)
    watcher.refresh()
    service.read_failure = grpc.StatusCode.UNAVAILABLE
    caplog.clear()
    with caplog.at_level(logging.WARNING, logger="checkpointd_client"):
        assert watcher.refresh().on_unavailable is OnUnavailable.REFUSE
    assert "using last known settings" in caplog.text


def test_a_read_refused_for_another_reason_is_raised_not_hidden(scripted_config_server) -> None:
    scripted_config_server.service.read_failure = grpc.StatusCode.PERMISSION_DENIED
    watcher = _watcher(scripted_config_server.target)

    with pytest.raises(CheckpointdRpcError) as refused:
        watcher.refresh()
    assert refused.value.code == grpc.StatusCode.PERMISSION_DENIED


def test_the_watch_follows_changes_across_stream_deadlines_and_broken_streams(scripted_config_server, caplog) -> None:
    service = scripted_config_server.service
    caplog.set_level(logging.INFO, logger="checkpointd_client")
    watcher = _watcher(scripted_config_server.target, reconnect_backoff_s=(0.05, 0.2), watch_deadline_s=0.5).start()
    try:
        assert watcher.wait_for(lambda s: s == CheckpointSettings(), timeout=WAIT_S)
        # Past the stream's own deadline: the watch opens a new stream.
        while service.watches_opened < 2:
            assert watcher.wait_for(lambda s: False, timeout=0.1) is False
        service.push(ConfigKey.CLIENT_DEADLINE_MS, 900)
        assert watcher.wait_for(lambda s: s.client_deadline_s == 0.9, timeout=WAIT_S)
        # A stream reaching its own deadline is renewed quietly; only a broken one is reported.
        assert "watch interrupted" not in caplog.text

        opened = service.watches_opened
        service.break_watches()
        while service.watches_opened == opened:
            watcher.wait_for(lambda s: False, timeout=0.1)
        service.push(ConfigKey.ON_UNAVAILABLE, "refuse")
        assert watcher.wait_for(lambda s: s.on_unavailable is OnUnavailable.REFUSE, timeout=WAIT_S)
        assert "checkpointd config watch interrupted (UNAVAILABLE); reconnecting" in caplog.text
    finally:
        watcher.close()
    assert not watcher._thread.is_alive()  # noqa: SLF001 - close() must end the watch
    assert "did not stop" not in caplog.text


def test_wait_for_is_false_while_a_value_is_refused(scripted_config_server) -> None:
    service = scripted_config_server.service
    watcher = _watcher(scripted_config_server.target, reconnect_backoff_s=(0.05, 0.2)).start()
    try:
        service.push(ConfigKey.AUTO_CREATE_ON, ["on_teleport"])
        assert watcher.wait_for_refusal(timeout=WAIT_S)
        assert watcher.wait_for(lambda s: True, timeout=0.2) is False
        service.push(ConfigKey.AUTO_CREATE_ON, ["on_error"])
        assert watcher.wait_for(lambda s: s.auto_create_on == {AutoTrigger.ON_ERROR}, timeout=WAIT_S)
        assert watcher.current().auto_create_on == {AutoTrigger.ON_ERROR}
    finally:
        watcher.close()


def test_a_policy_decides_on_the_settings_it_is_given_and_its_own_switches() -> None:
    policy = TriggerPolicy(disabled=["after_tool_execute"])
    only_on_error = CheckpointSettings(auto_create_on=frozenset({AutoTrigger.ON_ERROR}))

    assert policy.settings() == CheckpointSettings()
    assert policy.locally_disabled == {AutoTrigger.AFTER_TOOL_EXECUTE}
    assert {t for t in AutoTrigger if policy.is_enabled(t)} == set(AutoTrigger) - {AutoTrigger.AFTER_TOOL_EXECUTE}
    assert {t for t in AutoTrigger if policy.is_enabled(t, only_on_error)} == {AutoTrigger.ON_ERROR}
    derived = policy.derive(disabled=["on_error"])
    assert derived.locally_disabled == {AutoTrigger.ON_ERROR}
    assert derived.is_enabled("after_tool_execute") and not derived.is_enabled("on_error")
    assert FixedSettings().current() == CheckpointSettings()


def test_a_refused_first_read_in_the_background_still_follows_later_changes(scripted_config_server) -> None:
    service = scripted_config_server.service
    service.push(ConfigKey.AUTO_CREATE_ON, ["on_teleport"])
    watcher = _watcher(scripted_config_server.target, reconnect_backoff_s=(0.05, 0.2)).start(wait=False)
    try:
        assert watcher.wait_for_refusal(timeout=WAIT_S)
        service.push(ConfigKey.AUTO_CREATE_ON, ["on_error"])
        assert watcher.wait_for(lambda s: s.auto_create_on == {AutoTrigger.ON_ERROR}, timeout=WAIT_S)
    finally:
        watcher.close()


@pytest.mark.parametrize("in_background", [False, True])
def test_once_the_first_read_has_ended_decisions_no_longer_wait(scripted_config_server, monkeypatch,
                                                                in_background: bool) -> None:
    # A first read that never ended would hold every decision for this long; the test waits far less.
    monkeypatch.setattr(policy_module, "FIRST_READ_WAIT_S", 120.0)
    scripted_config_server.service.push(ConfigKey.ON_UNAVAILABLE, "refuse")
    watcher = _watcher(scripted_config_server.target).start(wait=not in_background)
    try:
        if not in_background:  # start() itself read the settings
            assert watcher.fetched and watcher._settings.on_unavailable is OnUnavailable.REFUSE  # noqa: SLF001
        assert watcher.wait_for(lambda s: s.on_unavailable is OnUnavailable.REFUSE, timeout=WAIT_S)
        decided = threading.Event()
        threading.Thread(target=lambda: (watcher.current(), decided.set()), daemon=True).start()
        assert decided.wait(WAIT_S)
    finally:
        watcher.close()


def test_a_background_first_read_refused_for_another_reason_still_watches(scripted_config_server) -> None:
    service = scripted_config_server.service
    service.read_failure = grpc.StatusCode.PERMISSION_DENIED  # GetConfig refused; WatchConfig answers
    service.push(ConfigKey.ON_UNAVAILABLE, "refuse")
    watcher = _watcher(scripted_config_server.target, reconnect_backoff_s=(0.05, 0.2)).start(wait=False)
    try:
        assert watcher.wait_for(lambda s: s.on_unavailable is OnUnavailable.REFUSE, timeout=WAIT_S)
    finally:
        watcher.close()


def test_a_watch_whose_channel_its_owner_closes_after_stop_ends_quietly(scripted_config_server, monkeypatch) -> None:
    """An owner may stop the watcher and close its channel while the watch thread is between two
    streams: the thread then opens its next stream on a closed channel (grpc raises ValueError).
    It must end quietly, not die with an unhandled exception."""
    channel = open_channel(scripted_config_server.target)
    config = ConfigClient(channel)
    watcher = CheckpointConfigWatcher(config, reconnect_backoff_s=(0.05, 0.2), watch_deadline_s=0.5)
    opened: list[int] = []
    real_watch_config = config.watch_config

    def owner_closes_before_the_second_stream(*args, **kwargs):
        opened.append(len(opened))
        if len(opened) == 2:  # the first stream reached its deadline; the thread is between streams
            watcher.stop()
            channel.close()
        return real_watch_config(*args, **kwargs)

    monkeypatch.setattr(config, "watch_config", owner_closes_before_the_second_stream)
    unhandled: list[threading.ExceptHookArgs] = []
    monkeypatch.setattr(threading, "excepthook", unhandled.append)

    watcher.start()
    watcher._thread.join(WAIT_S)  # noqa: SLF001 - the watch thread itself must end

    assert not watcher._thread.is_alive()  # noqa: SLF001
    assert len(opened) == 2
    assert unhandled == []


@pytest.mark.parametrize("stopped", [False, True], ids=["running", "stopped meanwhile"])
def test_a_refused_background_first_read_is_reported_unless_the_watcher_was_stopped(
        scripted_config_server, caplog, monkeypatch, stopped: bool) -> None:
    monkeypatch.setattr(policy_module, "FIRST_READ_WAIT_S", float(WAIT_S))
    service = scripted_config_server.service
    service.read_failure = grpc.StatusCode.PERMISSION_DENIED
    service.hold_reads()
    caplog.set_level(logging.ERROR, logger="checkpointd_client")
    watcher = _watcher(scripted_config_server.target, reconnect_backoff_s=(0.05, 0.2)).start(wait=False)
    try:
        assert service.reads_started.wait(WAIT_S)
        if stopped:
            watcher.stop()
        service.release_reads()
        if stopped:
            watcher._thread.join(WAIT_S)  # noqa: SLF001 - the read ended, then the thread
            assert not watcher._thread.is_alive()  # noqa: SLF001
        else:
            watcher.current()  # waits for the first read to end
    finally:
        watcher.close()
    assert ("could not read the checkpointd config" in caplog.text) is not stopped


def test_a_program_that_never_closes_its_watcher_still_exits(scripted_config_server) -> None:
    """The watch runs in a daemon thread: it never keeps the interpreter from exiting."""
    import subprocess
    import sys

    program = (
        "from checkpointd_client import CheckpointConfigWatcher, ConfigClient, open_channel\n"
        f"watcher = CheckpointConfigWatcher(ConfigClient(open_channel({scripted_config_server.target!r}))).start()\n"
        "assert watcher.fetched\n"
        "print('started', flush=True)\n"
    )
    try:
        done = subprocess.run([sys.executable, "-c", program], capture_output=True, text=True, timeout=60)
    except subprocess.TimeoutExpired:
        pytest.fail("the interpreter waited for the watch thread at exit")
    assert (done.returncode, done.stdout) == (0, "started\n"), done.stderr
