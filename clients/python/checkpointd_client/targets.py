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
    socket_path = default_socket()
    return f"unix://{socket_path}" if socket_path.exists() else DEFAULT_TCP


def default_socket() -> Path:
    """The unix socket `checkpointd serve` makes in the default data dir (whether it exists or not)."""
    return default_data_dir().expanduser().resolve() / SOCKET_NAME


def target_origin(target: str) -> str:
    """How ``target`` comes to be the one dialed when nobody names another: from CHECKPOINTD_TARGET,
    the default socket, or the TCP default; "" for any other target (one the caller chose)."""
    if target == os.environ.get("CHECKPOINTD_TARGET"):
        return "from CHECKPOINTD_TARGET"
    socket_path = default_socket()
    if target == f"unix://{socket_path}":
        return f"the default: the socket `checkpointd serve` makes in its data directory {socket_path.parent}"
    if target == DEFAULT_TCP and not os.environ.get("CHECKPOINTD_TARGET"):
        return f"the default: CHECKPOINTD_TARGET is unset and there is no socket at {socket_path}"
    return ""


#: How to start a local checkpointd (the CLI's hint uses it too).
START_HINT = "start one with `make run` (in a checkout) or `checkpointd serve`"
#: How a library user points the client at another server.
POINT_WITH_ENV = "point at yours with a target argument or CHECKPOINTD_TARGET (HOST:PORT or unix:///PATH)"


def unreachable_hint(target: str | None, *, point_with: str = POINT_WITH_ENV) -> str:
    """What to do when no checkpointd answered at ``target``: which target it was and how it was
    chosen, whether checkpointd is running, how to start one or point at another (``point_with``:
    the MCP proxy names its own option)."""
    where = ""
    if target:
        origin = target_origin(target)
        where = f" at {target}" + (f" ({origin})" if origin else "")
    return f"checkpointd is not reachable{where}: is it running? {START_HINT}, or {point_with}"
