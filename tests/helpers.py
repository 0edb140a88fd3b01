"""Small helpers for tests: exact workspace snapshots and error details."""

from __future__ import annotations

import os
import stat
from pathlib import Path

import grpc
from google.rpc import error_details_pb2
from grpc_status import rpc_status


def tree_state(root: Path, skip: tuple[str, ...] = (".git",)) -> dict[str, tuple]:
    """Everything under root, exactly: kind, content or link text, permission bits."""
    out: dict[str, tuple] = {}
    for dirpath, dirnames, filenames in os.walk(root):
        dirnames[:] = [d for d in dirnames if d not in skip]
        for name in dirnames + filenames:
            full = Path(dirpath, name)
            rel = full.relative_to(root).as_posix()
            st = full.lstat()
            mode = stat.S_IMODE(st.st_mode)
            if stat.S_ISLNK(st.st_mode):
                out[rel] = ("symlink", os.readlink(full))
            elif stat.S_ISDIR(st.st_mode):
                out[rel] = ("dir", mode)
            else:
                out[rel] = ("file", full.read_bytes(), mode)
    return out


def error_info(error: grpc.RpcError) -> error_details_pb2.ErrorInfo:
    """The one ErrorInfo every checkpointd error carries."""
    status = rpc_status.from_call(error)
    assert status is not None, f"no rich status on {error.code()}: {error.details()}"
    infos = []
    for detail in status.details:
        info = error_details_pb2.ErrorInfo()
        if detail.Unpack(info):
            infos.append(info)
    assert len(infos) == 1, f"expected exactly one ErrorInfo, got {infos}"
    return infos[0]
