"""How the client's config watch behaves while the server misbehaves (policy.py), in process
against a scripted ConfigService or no server at all: a value it refuses does not end the watch,
and reconnecting to a server that is down backs off, doubling up to its maximum, rather than
hammering it."""

from __future__ import annotations

import socket
import threading

from checkpointd_client import (
    AutoTrigger,
    CheckpointConfigWatcher,
    ConfigClient,
    ConfigKey,
    OnUnavailable,
    open_channel,
)

WAIT_S = 30


def test_a_refused_value_does_not_end_the_watch_the_other_keys_are_still_followed(scripted_config_server) -> None:
    service = scripted_config_server.service
    watcher = CheckpointConfigWatcher(ConfigClient(open_channel(scripted_config_server.target)),
                                      reconnect_backoff_s=(0.05, 0.2)).start()  # the first read is done
    try:
        service.push(ConfigKey.AUTO_CREATE_ON, ["on_teleport"])  # so the watch is what refuses it
        assert watcher.wait_for_refusal(timeout=WAIT_S)
        service.push(ConfigKey.ON_UNAVAILABLE, "refuse")
        service.push(ConfigKey.AUTO_CREATE_ON, ["on_error"])
        assert watcher.wait_for(lambda s: s.on_unavailable is OnUnavailable.REFUSE
                                and s.auto_create_on == {AutoTrigger.ON_ERROR}, timeout=WAIT_S)
        assert service.watches_opened == 1, "the refused value ended the stream"
    finally:
        watcher.close()


class _RecordedWaits(threading.Event):
    """The watcher's stop event, noting each wait between two reconnects."""

    def __init__(self, wanted: int) -> None:
        super().__init__()
        self.waits: list[float | None] = []
        self.enough = threading.Event()
        self._wanted = wanted

    def wait(self, timeout: float | None = None) -> bool:
        self.waits.append(timeout)
        if len(self.waits) >= self._wanted:
            self.enough.set()
        return super().wait(timeout)


def test_reconnecting_to_a_server_that_is_down_backs_off_doubling_up_to_the_maximum() -> None:
    with socket.socket() as probe:  # a port nothing listens on
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    watcher = CheckpointConfigWatcher(ConfigClient(open_channel(f"127.0.0.1:{port}")),
                                      reconnect_backoff_s=(0.01, 0.04))
    watcher._closed = waits = _RecordedWaits(wanted=5)  # noqa: SLF001 - observed, not replaced
    watcher.start(wait=False)
    try:
        assert waits.enough.wait(timeout=WAIT_S)
    finally:
        watcher.close()
    assert waits.waits[:5] == [0.01, 0.02, 0.04, 0.04, 0.04]
