"""What a newcomer runs into, said in one line that tells what to do, never a traceback: a busy
port at `serve`, Ctrl-C, a server that is not running, a workspace outside the allowed roots, a
relative --workspace-root, a list-valued config key, and `serve --help` showing real defaults.
Every case runs the real `checkpointd` command in a subprocess."""

from __future__ import annotations

import inspect
import json
import os
import re
import signal
import socket
import subprocess
import time
from pathlib import Path

from ulid import ULID

from checkpoint.v1 import checkpoint_service_pb2 as pb
from checkpointd_client import CheckpointClient
from tests.conftest import CHECKPOINTD, free_port
from tests.helpers import interruptible, tree_state
from tests.ops.conftest import run_cli, server_exit, wait_until


def error_lines(stderr: str) -> list[str]:
    return [line for line in stderr.splitlines() if "error" in line.lower()]


def assert_one_line_no_traceback(stderr: str) -> str:
    assert "Traceback" not in stderr, stderr
    lines = error_lines(stderr)
    assert len(lines) == 1, stderr
    return lines[0]


def test_serve_on_a_busy_port_says_so_in_one_line_and_creates_nothing(tmp_path: Path):
    port = free_port()
    with socket.socket() as holder:
        holder.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        holder.bind(("127.0.0.1", port))
        holder.listen()
        data_dir = tmp_path / "data"
        refused = server_exit(["--listen", f"127.0.0.1:{port}", "--data-dir", str(data_dir),
                               "--workspace-root", str(tmp_path)])
    assert refused.returncode == 2, refused.stderr
    line = assert_one_line_no_traceback(refused.stderr)
    assert f"cannot listen on 127.0.0.1:{port}: another process is already listening there" in line
    assert "--listen HOST:PORT" in line and "CHECKPOINTD_LISTEN" in line
    assert not data_dir.exists(), "a server that cannot listen created its data dir (and database)"


def test_serve_help_shows_each_default_once_and_never_none():
    shown = subprocess.run([CHECKPOINTD, "serve", "--help"], capture_output=True, text=True, timeout=60,
                           env={**os.environ, "COLUMNS": "1000"})
    assert shown.returncode == 0, shown.stderr
    options = re.split(r"\n(?=  -)", shown.stdout.split("options:", 1)[1])
    helps = {option.split()[0]: " ".join(option.split()) for option in options if option.startswith("  --")}
    assert len(helps) >= 18, helps.keys()
    for text in helps.values():
        assert "None" not in text and "(default:" not in text, text
        assert text.count("Default:") == 1, text


def _stderr_until(process: subprocess.Popen, marker: bytes, timeout: float = 60) -> bytes:
    """Reads the process's stderr until ``marker`` shows (a prompt waits without a newline)."""
    seen = b""
    deadline = time.monotonic() + timeout
    while marker not in seen:
        assert time.monotonic() < deadline, f"no {marker!r} on stderr: {seen!r}"
        chunk = os.read(process.stderr.fileno(), 4096)
        assert chunk, f"stderr closed before {marker!r}: {seen!r}"
        seen += chunk
    return seen


def test_ctrl_c_at_the_rollback_prompt_aborts_and_changes_nothing(checkpointd_server, workspace, plan_id):
    target = ["--target", checkpointd_server.tcp_target]
    (workspace / "a.txt").write_text("original")
    created = run_cli("create", plan_id, "--workspace-root", str(workspace), "--json", *target)
    checkpoint = json.loads(created.stdout)["checkpoint_id"]
    (workspace / "a.txt").write_text("edited")
    edited = tree_state(workspace)

    asking = subprocess.Popen(interruptible([CHECKPOINTD, "rollback", plan_id, checkpoint, *target]),
                              stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    try:
        shown = _stderr_until(asking, b"[y/N] ")
        asking.send_signal(signal.SIGINT)
        _, rest = asking.communicate(timeout=60)
    finally:
        if asking.poll() is None:
            asking.kill()
    stderr = (shown + rest).decode()
    assert asking.returncode == 130, stderr
    assert "Traceback" not in stderr and "KeyboardInterrupt" not in stderr, stderr
    assert stderr.rstrip().endswith("[y/N] \ncheckpointd: aborted, nothing changed"), stderr
    assert tree_state(workspace) == edited
    listed = json.loads(run_cli("ls", plan_id, "--json", *target).stdout)
    assert [c["checkpoint_id"] for c in listed] == [checkpoint], "a safety checkpoint was recorded"


def test_ctrl_c_after_the_rollback_was_sent_says_it_may_have_happened(ops_server, tmp_path: Path):
    fault_dir = tmp_path / "faults"
    fault_dir.mkdir()
    server = ops_server(env={"CHECKPOINTD_PAUSE_AT": "rollback.planned:1", "CHECKPOINTD_FAULT_DIR": str(fault_dir)})
    target = ["--target", server.tcp_target]
    workspace = server.new_workspace()
    plan_id = str(ULID())
    (workspace / "a.txt").write_text("original")
    checkpoint = json.loads(run_cli("create", plan_id, "--workspace-root", str(workspace), "--json",
                                    *target).stdout)["checkpoint_id"]
    (workspace / "a.txt").write_text("edited")

    rolling = subprocess.Popen(interruptible([CHECKPOINTD, "rollback", plan_id, checkpoint, "--yes", *target]),
                               stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    try:
        wait_until(lambda: (fault_dir / "paused.rollback.planned").exists(), "the rollback to reach the server")
        rolling.send_signal(signal.SIGINT)
        _, stderr = rolling.communicate(timeout=60)
    finally:
        (fault_dir / "resume.rollback.planned").touch()
        if rolling.poll() is None:
            rolling.kill()
    stderr = stderr.decode()
    assert rolling.returncode == 130, stderr
    assert "Traceback" not in stderr and "nothing changed" not in stderr, stderr
    assert "interrupted after the rollback was sent" in stderr and f"checkpointd ls {plan_id}" in stderr, stderr
    # What the message warns of: the server finished the rollback it had started.
    wait_until(lambda: (workspace / "a.txt").read_text() == "original", "the server to finish the rollback")
    phases = [c["phase"] for c in json.loads(run_cli("ls", plan_id, "--json", *target).stdout)]
    assert phases[0] == "PHASE_ROLLBACK_SAFETY", phases


def test_a_server_that_is_not_running_is_named_with_how_to_start_or_find_one(tmp_path: Path):
    tcp, unix = f"127.0.0.1:{free_port()}", f"unix://{tmp_path}/nothing.sock"
    for command, target, cause in ((("ls", str(ULID())), tcp, "connection refused"),
                                   (("config", "ls"), unix, "no socket at that path"),
                                   (("rollback", str(ULID()), str(ULID()), "--yes"), tcp, "connection refused")):
        refused = run_cli(*command, "--target", target, "--timeout", "10")
        assert refused.returncode == 1, refused.stderr
        line = assert_one_line_no_traceback(refused.stderr)
        assert f"cannot reach checkpointd at {target} ({cause})" in line, line
        for hint in ("--target", "CHECKPOINTD_TARGET", "make run", "checkpointd serve"):
            assert hint in line, line
        assert "failed to connect to all addresses" not in line and "UNAVAILABLE" not in line, line
    down = run_cli("health", "--target", f"127.0.0.1:{free_port()}", "--timeout", "5")
    assert down.returncode == 1 and "UNAVAILABLE" in down.stdout
    assert "make run" in assert_one_line_no_traceback(down.stderr)


def test_a_workspace_outside_the_allowed_roots_names_them_in_one_line(checkpointd_server, tmp_path: Path):
    refused = run_cli("create", str(ULID()), "--workspace-root", str(tmp_path), "--target",
                      checkpointd_server.tcp_target)
    assert refused.returncode == 1
    line = assert_one_line_no_traceback(refused.stderr)
    assert "PERMISSION_DENIED [WORKSPACE_ROOT_NOT_ALLOWED]" in line
    assert f"(allowed: {os.path.realpath(checkpointd_server.allowed_root)})" in line, line
    assert "--workspace-root DIR" in line and "CHECKPOINTD_WORKSPACE_ROOT" in line, line


def test_a_relative_workspace_root_is_resolved_by_the_cli(checkpointd_server, workspace, plan_id):
    (workspace / "notes.txt").write_text("hello")
    link = workspace.parent / f"{workspace.name}-link"
    link.symlink_to(workspace)
    created = run_cli("create", plan_id, "--workspace-root", link.name, "--json", "--target",
                      checkpointd_server.tcp_target, cwd=workspace.parent)
    assert created.returncode == 0, created.stderr
    checkpoint = json.loads(created.stdout)
    assert (checkpoint["workspace_root"], checkpoint["file_count"]) == (os.path.realpath(workspace), "1")


def test_config_set_takes_a_list_as_words_and_shows_the_accepted_form(checkpointd_server, plan_id):
    tcp = ["--target", checkpointd_server.tcp_target, "--plan", plan_id]

    def value(*words: str):
        done = run_cli("config", "set", *words, "--json", *tcp)
        assert done.returncode == 0, done.stderr
        return json.loads(done.stdout)[0]["value"]

    assert value("core.checkpoints.auto_create_on", "on_error") == ["on_error"]
    assert value("core.checkpoints.auto_create_on", "before_tool_execute", "on_error") == [
        "before_tool_execute", "on_error"]
    assert value("core.snapshot.ignore_patterns", '["*.log", "a,b.txt"]') == ["*.log", "a,b.txt"]
    assert value("core.snapshot.ignore_patterns", "a,b.txt") == ["a,b.txt"]
    assert value("core.snapshot.ignore_patterns", "[]") == []
    assert value("core.checkpoints.on_unavailable", "refuse") == "refuse"

    not_a_list = run_cli("config", "set", "core.snapshot.ignore_patterns", "5", *tcp)
    assert not_a_list.returncode == 1
    line = assert_one_line_no_traceback(not_a_list.stderr)
    assert "INVALID_CONFIG_VALUE" in line and "must be a list of strings" in line, line
    assert "config set core.snapshot.ignore_patterns ITEM [ITEM...]" in line and """'["a","b"]'""" in line, line
    two_words = run_cli("config", "set", "core.snapshot.max_file_size_bytes", "1", "2", *tcp)
    assert two_words.returncode == 2
    assert "takes one value, got 2 words" in assert_one_line_no_traceback(two_words.stderr)


def test_the_cli_rolls_back_files_and_state_by_default_as_the_clients_do(checkpointd_server, plan_id, tmp_path):
    from checkpointd.commands import DEFAULT_SCOPE
    from checkpointd.commands.checkpoints import _SCOPES

    client_default = inspect.signature(CheckpointClient.rollback).parameters["scope"].default
    assert _SCOPES[DEFAULT_SCOPE] == client_default == pb.ROLLBACK_SCOPE_FILES_AND_STATE
    tcp = ["--target", checkpointd_server.tcp_target]
    state = tmp_path / "state.json"
    state.write_text('{"step": 1}')
    checkpoint = json.loads(run_cli("create", plan_id, "--state-file", str(state), "--json", *tcp).stdout)
    restored = tmp_path / "restored.json"
    done = run_cli("rollback", plan_id, checkpoint["checkpoint_id"], "--yes", "--state-out", str(restored), *tcp)
    assert done.returncode == 0, done.stderr
    assert restored.read_text() == '{"step": 1}'


def test_new_plan_id_prints_a_fresh_ulid_the_server_takes(checkpointd_server):
    first, second = (run_cli("new-plan-id").stdout.strip() for _ in range(2))
    assert first != second
    assert str(ULID.from_str(first)) == first
    created = run_cli("create", first, "--json", "--target", checkpointd_server.tcp_target)
    assert created.returncode == 0 and json.loads(created.stdout)["plan_id"] == first, created.stderr
