"""Defaults shared by the server and the human CLI, so both agree on where to meet (kept in the
client package, whose Checkpointd() finds the server the same way)."""

from __future__ import annotations

from checkpointd_client.targets import DEFAULT_TCP, SOCKET_NAME, default_data_dir, default_target

__all__ = ["DEFAULT_TCP", "MAX_SECONDS", "SOCKET_NAME", "default_data_dir", "default_target"]

#: The longest interval or timeout an option takes (a year): beyond it a float of seconds
#: overflows what threads and gRPC deadlines can wait for (OverflowError, or a deadline past).
MAX_SECONDS = 365 * 24 * 3600
