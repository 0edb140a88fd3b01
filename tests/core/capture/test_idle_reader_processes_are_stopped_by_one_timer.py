"""Reader processes left idle are stopped by a timer, started when the last scan using them
ends: one at a time, none while no reader runs or once they are closed (a timer started at the
end of every scan would leave a thread behind each for as long as the idle delay). Readers a
scan is using are never stopped for idleness."""

from __future__ import annotations

from checkpointd.core.capture.readers import Readers


def _never(*_args) -> list:
    raise AssertionError("nothing is read here")


def test_one_idle_timer_at_a_time_and_none_without_readers_or_once_closed() -> None:
    readers = Readers(1, _never, idle_seconds=3600)
    try:
        with readers.using():
            pass
        assert readers._reaper is None, "a timer for readers that never started"
        assert readers.start()
        with readers.using():
            pass
        first = readers._reaper
        assert first is not None
        with readers.using():
            pass
        assert readers._reaper is first, "a second timer while the first waits"
    finally:
        readers.close()
    assert first.finished.is_set(), "closing did not cancel the timer"
    with readers.using():
        pass
    assert readers._reaper is first, "a timer for readers already closed"


def test_readers_a_scan_is_using_are_not_stopped_however_long_ago_they_were_last_used() -> None:
    readers = Readers(1, _never, idle_seconds=0)
    try:
        with readers.using():
            assert readers.start()
            pids = readers.pids()
            readers._reap()  # as the timer would, the idle delay long past
            assert readers.pids() == pids, "readers stopped under a scan using them"
        readers._reap()
        assert readers.pids() == []
    finally:
        readers.close()
