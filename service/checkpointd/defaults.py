"""Defaults shared by the server and the human CLI, so both agree on where to meet (kept in the
client package, whose Checkpointd() finds the server the same way)."""

from __future__ import annotations

from checkpointd_client.targets import DEFAULT_TCP, SOCKET_NAME, default_data_dir, default_target

__all__ = ["DEFAULT_TCP", "SOCKET_NAME", "default_data_dir", "default_target"]
