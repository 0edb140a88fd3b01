"""What a server keeps (workspace contents, plan state, the stat index's paths) is readable by
its own user only, whatever the umask it was started with; a data directory an earlier release
left open to others is made private when a server starts on it, and serves on exactly as before."""

from __future__ import annotations

import os
import stat
from pathlib import Path

import grpc
from ulid import ULID

from checkpoint.v1 import checkpoint_service_pb2 as pb
from checkpoint.v1 import checkpoint_service_pb2_grpc as pb_grpc
from tests.helpers import tree_state


def _started_with_umask(ops_server, *args: str):
    """A server whose process starts with the usual umask 022 (the suite's may be tighter)."""
    previous = os.umask(0o022)
    try:
        return ops_server(*args)
    finally:
        os.umask(previous)


def _open_to_others(data_dir: Path) -> list[str]:
    """What below the data directory a group or others may reach and then read or write: its own
    mode lets them, and so does every directory between it and the data directory (which is left
    as it was made: a socket may live in it for its group)."""
    found = []
    for directory, dirs, files in os.walk(data_dir):
        below = Path(directory).relative_to(data_dir).parts
        if any(stat.S_IMODE(os.lstat(data_dir.joinpath(*below[:depth])).st_mode) & 0o077 == 0
               for depth in range(1, len(below) + 1)):
            continue  # in a directory only its user may enter
        for name in dirs + files:
            st = os.lstat(os.path.join(directory, name))
            if stat.S_ISSOCK(st.st_mode) or stat.S_ISLNK(st.st_mode):
                continue
            if stat.S_IMODE(st.st_mode) & 0o077:
                where = os.path.relpath(os.path.join(directory, name), data_dir)
                found.append(f"{oct(stat.S_IMODE(st.st_mode))} {where}")
    return found


def _kept(data_dir: Path) -> set[str]:
    return {os.path.relpath(os.path.join(d, n), data_dir) for d, dirs, files in os.walk(data_dir) for n in dirs + files}


def _fill(stub, workspace: Path, plan_id: str) -> tuple[str, dict]:
    """A secret the user keeps 0600, packed and loose contents, two checkpoints and a deletion."""
    secret = workspace / ".env"
    secret.write_text("API_KEY=sk-not-for-other-users\n")
    secret.chmod(0o600)
    (workspace / "notes.txt").write_text("packed\n" * 100)
    (workspace / "big.bin").write_bytes(os.urandom(3 << 20))
    first = stub.CreateCheckpoint(pb.CreateCheckpointRequest(
        plan_id=plan_id, workspace_root=str(workspace), state=b"plan state: also private"), timeout=60).checkpoint
    kept = tree_state(workspace)
    (workspace / "notes.txt").write_text("second version\n" * 100)
    second = stub.CreateCheckpoint(pb.CreateCheckpointRequest(
        plan_id=plan_id, workspace_root=str(workspace)), timeout=60).checkpoint
    stub.DeleteCheckpoint(pb.DeleteCheckpointRequest(checkpoint_id=second.checkpoint_id), timeout=30)
    return first.checkpoint_id, kept


def test_nothing_a_server_keeps_is_open_to_other_users(ops_server):
    server = _started_with_umask(ops_server, "--gc-interval", "0.1")
    workspace = server.new_workspace()
    with grpc.insecure_channel(server.tcp_target) as channel:
        _fill(pb_grpc.CheckpointServiceStub(channel), workspace, str(ULID()))
    kept = _kept(server.data_dir)
    if server.store_kind == "disk":
        assert {"store/packs", "store/objects", "engine/stat-index.sqlite"} <= kept, kept
        assert any(name.startswith("store/packs/pack-") for name in kept), kept
        assert any(name.startswith("store/objects/") and len(name) > 20 for name in kept), "a loose object"
    if not server.db_url:
        assert "checkpointd.db" in kept
    assert _open_to_others(server.data_dir) == []


def test_a_data_directory_left_open_by_an_earlier_release_is_made_private(ops_server):
    server = _started_with_umask(ops_server)
    workspace = server.new_workspace()
    plan_id = str(ULID())
    with grpc.insecure_channel(server.tcp_target) as channel:
        checkpoint_id, kept = _fill(pb_grpc.CheckpointServiceStub(channel), workspace, plan_id)
    server.stop()
    # What a release before this rule left under a umask of 022.
    for directory, dirs, files in os.walk(server.data_dir):
        for name in dirs:
            os.chmod(os.path.join(directory, name), 0o755)
        for name in files:
            os.chmod(os.path.join(directory, name), 0o644)
    assert _open_to_others(server.data_dir)

    previous = os.umask(0o022)
    try:
        server.start()
    finally:
        os.umask(previous)
    if server.store_kind == "disk" or not server.db_url:
        # Made private at start-up: the store, the stat index, the SQLite database (each that this
        # server keeps), each named in a warning.
        assert "made private" in server.log()
    with grpc.insecure_channel(server.tcp_target) as channel:
        stub = pb_grpc.CheckpointServiceStub(channel)
        for path in workspace.iterdir():
            path.unlink()
        stub.Rollback(pb.RollbackRequest(plan_id=plan_id, checkpoint_id=checkpoint_id), timeout=60)
        assert tree_state(workspace) == kept
        assert stat.S_IMODE((workspace / ".env").stat().st_mode) == 0o600
    assert _open_to_others(server.data_dir) == []
