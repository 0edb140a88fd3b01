"""Where a local checkpointd is found when nobody says: the place `checkpointd serve` (and so
`make run`) listens by default. Shared by the client, the CLI and the server, so all three agree."""

from __future__ import annotations

import os
from pathlib import Path

DEFAULT_TCP = "127.0.0.1:50051"
SOCKET_NAME = "checkpointd.sock"


def default_data_dir() -> Path:
    """CHECKPOINTD_DATA_DIR, else $XDG_DATA_HOME/checkpointd, else ~/.local/share/checkpointd."""
    configured = os.environ.get("CHECKPOINTD_DATA_DIR")
    if configured:
        return Path(configured)
    base = os.environ.get("XDG_DATA_HOME") or os.path.join(os.path.expanduser("~"), ".local", "share")
    return Path(base) / "checkpointd"


def default_target() -> str:
    """CHECKPOINTD_TARGET, else the default data dir's unix socket if it exists, else 127.0.0.1:50051."""
    configured = os.environ.get("CHECKPOINTD_TARGET")
    if configured:
        return configured
    socket_path = default_data_dir().expanduser().resolve() / SOCKET_NAME
    return f"unix://{socket_path}" if socket_path.exists() else DEFAULT_TCP
