"""Attacks on the `checkpointd` command line, run as a user runs it (a subprocess): garbage
arguments, ids that do not exist, servers that are down or are not checkpointd, names that are not
UTF-8, output into a closed pipe, Ctrl-C against a server that never answers, and the offline
maintenance commands (gc, stats, fsck) on data directories they should refuse.

The standard: a user never sees a traceback for an expected condition, a failure never exits 0,
and nothing the command was not asked to change is touched. Tests marked xfail(strict=True) prove
a defect (the reason says which); the others are attacks that held."""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import time
from collections.abc import Iterator
from concurrent import futures

import grpc
import pytest
from ulid import ULID

from tests.conftest import CHECKPOINTD, free_port
from tests.helpers import interruptible
from tests.ops.conftest import run_cli

NOT_UTF8 = "\udcff"  # how sys.argv carries the byte 0xff (subprocess passes it back as that byte)
FAR_AWAY = "01ARZ3NDEKTSV4RRFFQ69G5FZZ"  # a valid ULID no server knows


def _clean_env(**extra: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("CHECKPOINTD_")}
    return {**env, "COLUMNS": "250", **extra}


def _run(*args: str, env: dict[str, str] | None = None, timeout: float = 120, **kwargs) -> subprocess.CompletedProcess:
    return subprocess.run([CHECKPOINTD, *args], capture_output=True, text=True, timeout=timeout,
                          env=env or _clean_env(), errors="replace", **kwargs)


def _no_traceback(done: subprocess.CompletedProcess) -> None:
    assert "Traceback" not in done.stderr, done.stderr
    assert "Exception ignored" not in done.stderr, done.stderr


def _one_line_failure(done: subprocess.CompletedProcess, codes: tuple[int, ...] = (1, 2)) -> str:
    assert done.returncode in codes, (done.returncode, done.stdout, done.stderr)
    _no_traceback(done)
    errors = [line for line in done.stderr.splitlines() if "error" in line.lower()]
    assert len(errors) == 1, done.stderr
    return errors[0]


# -- 1. garbage arguments and ids that do not exist --------------------------------------------


@pytest.mark.parametrize("args", [
    ["show", FAR_AWAY],
    ["show", "not-a-ulid"],
    ["delete", FAR_AWAY, "--yes"],
    ["diff", FAR_AWAY],
    ["diff", "garbage", "garbage2"],
    ["rollback", FAR_AWAY, FAR_AWAY, "--yes"],
    ["rollback", "my-plan", "x", "--yes"],
    ["cat", FAR_AWAY, "a.txt"],
    ["ls-files", FAR_AWAY],
    ["plan", "show", FAR_AWAY],
    ["ls", "my-plan"],
    ["ls", FAR_AWAY, "--filter", "this is ((( not a filter"],
    ["plans", "--filter", "nonsense ==="],
    ["config", "get", "no.such.key"],
    ["config", "set", "no.such.key", "1"],
    ["config", "set", "core.checkpoints.client_deadline_ms", "-5"],
    ["config", "clear", "no.such.key"],
    ["create", FAR_AWAY, "--workspace-root", "/definitely/not/allowed"],
    ["create", FAR_AWAY, "--state-file", "/nonexistent/state.bin"],
], ids=lambda a: " ".join(a)[:50])
def test_garbage_and_unknown_ids_are_one_line_and_exit_nonzero(args, tcp):
    _one_line_failure(run_cli(*args, *tcp))


def test_a_state_file_that_cannot_be_read_is_named_with_why(tcp, tmp_path):
    line = _one_line_failure(run_cli("create", FAR_AWAY, "--state-file", str(tmp_path / "missing.bin"), *tcp))
    assert line.endswith(f"{tmp_path / 'missing.bin'}: No such file or directory"), line


def test_a_state_file_over_the_request_limit_is_one_line(tcp, tmp_path):
    big = tmp_path / "state.bin"
    big.write_bytes(b"x" * (40 << 20))
    line = _one_line_failure(run_cli("create", str(ULID()), "--state-file", str(big), *tcp))
    assert "RESOURCE_EXHAUSTED" in line or "larger than" in line or "16 MiB" in line, line


def test_export_of_an_unknown_checkpoint_leaves_no_file_behind(tcp, tmp_path):
    output = tmp_path / "out.tar"
    _one_line_failure(run_cli("export", FAR_AWAY, "-o", str(output), *tcp))
    assert list(tmp_path.iterdir()) == [], "a failed export left a file"


@pytest.mark.parametrize("args", [[], ["plan"], ["config"], ["ls"], ["rollback", FAR_AWAY], ["bogus-command"],
                                  ["ls", FAR_AWAY, "--timeout", "soon"], ["diff", FAR_AWAY, "--color", "pink"]])
def test_missing_or_malformed_arguments_are_usage_errors(args):
    done = _run(*args)
    assert done.returncode == 2, done.stderr
    _no_traceback(done)
    assert "usage:" in done.stderr


@pytest.mark.parametrize("timeout", ["0", "-1"])
def test_a_non_positive_timeout_is_refused_in_one_line(timeout):
    done = _run("ls", FAR_AWAY, "--target", f"127.0.0.1:{free_port()}", "--timeout", timeout)
    _one_line_failure(done)


def test_a_garbage_serve_variable_does_not_break_client_commands():
    env = _clean_env(CHECKPOINTD_GRACE_SECONDS="thirty")
    done = _run("new-plan-id", env=env)
    _no_traceback(done)
    assert done.returncode == 0, done.stderr
    refused = _run("serve", "--listen", "127.0.0.1:0", "--data-dir", "/tmp/never-made", env=env)
    _one_line_failure(refused, codes=(2,))


# -- square brackets in arguments ------------------------------------------------------------

_MARKUP = "[/oops]"


@pytest.mark.parametrize("args", [
    ["create", _MARKUP],
    ["rollback", _MARKUP, "x", "--yes"],
    ["health", "--target", f"unix:///tmp/{_MARKUP}.sock"],
    ["gc", "--data-dir", f"/tmp/{_MARKUP}"],
    ["stats", "--data-dir", f"/tmp/{_MARKUP}"],
    ["fsck", "--data-dir", f"/tmp/{_MARKUP}"],
], ids=lambda a: a[0])
def test_square_brackets_in_an_argument_are_text_not_markup(args):
    target = [] if "--target" in args or args[0] in ("gc", "stats", "fsck") else \
        ["--target", f"127.0.0.1:{free_port()}", "--timeout", "5"]
    done = _run(*args, *target)
    _no_traceback(done)
    assert done.returncode != 0
    assert _MARKUP in done.stderr + done.stdout, done.stderr


# -- names that are not UTF-8 ------------------------------------------------------------------


@pytest.mark.parametrize("args", [
    ["ls", f"plan{NOT_UTF8}"],
    ["show", f"cp{NOT_UTF8}"],
    ["create", FAR_AWAY, "--workspace-root", f"/tmp/ws{NOT_UTF8}"],
    ["create", FAR_AWAY, "--label", f"k=v{NOT_UTF8}"],
    ["create", FAR_AWAY, "--description", f"d{NOT_UTF8}"],
    ["plans", "--under", f"/tmp/ws{NOT_UTF8}"],
    ["config", "get", f"key{NOT_UTF8}"],
    ["health", "--service", f"svc{NOT_UTF8}"],
], ids=lambda a: a[0] + (" " + a[2] if len(a) > 2 and a[2].startswith("--") else ""))
def test_an_argument_that_is_not_utf8_is_a_clear_error(args, tcp):
    _one_line_failure(run_cli(*args, *tcp))


def test_a_path_that_is_not_utf8_names_the_file_in_cat(checkpoint, tcp):
    """The documented way to name a non-UTF-8 file: it is passed as its bytes (held)."""
    done = run_cli("cat", checkpoint["checkpoint_id"], f"x{NOT_UTF8}", *tcp)
    line = _one_line_failure(done)
    assert "NOT_FOUND" in line or "not found" in line.lower(), line


# -- 2. a server that is down, a socket that is not one, a server that is not checkpointd --------


@pytest.mark.parametrize("kind", ["missing", "regular-file", "directory", "dangling-symlink", "no-directory"])
def test_a_socket_path_that_is_not_a_live_socket_is_named_in_one_line(tmp_path, kind):
    path = tmp_path / "s.sock"
    if kind == "regular-file":
        path.write_text("not a socket")
    elif kind == "directory":
        path.mkdir()
    elif kind == "dangling-symlink":
        path.symlink_to(tmp_path / "nowhere")
    elif kind == "no-directory":
        path = tmp_path / "missing-dir" / "s.sock"
    target = f"unix://{path}"
    done = _run("ls", FAR_AWAY, "--target", target, "--timeout", "10")
    line = _one_line_failure(done, codes=(1,))
    assert f"cannot reach checkpointd at {target}" in line, line
    if kind == "regular-file":
        assert path.read_text() == "not a socket"


def _silent_listener() -> tuple[socket.socket, str]:
    """A TCP port that accepts connections (the kernel's backlog) and never says a word."""
    listener = socket.socket()
    listener.bind(("127.0.0.1", 0))
    listener.listen(16)
    return listener, f"127.0.0.1:{listener.getsockname()[1]}"


@pytest.mark.parametrize("args, message", [
    (["ls", FAR_AWAY], "aborted, nothing changed"),
    (["config", "ls"], "aborted, nothing changed"),
    (["create", FAR_AWAY], "interrupted after the checkpoint was requested"),
    (["delete", FAR_AWAY, "--yes"], "interrupted after the delete was sent"),
])
def test_ctrl_c_while_waiting_on_a_silent_server_exits_130_without_a_traceback(args, message):
    listener, target = _silent_listener()
    with listener:
        process = subprocess.Popen(interruptible([CHECKPOINTD, *args, "--target", target, "--timeout", "60"]),
                                   stdout=subprocess.PIPE, stderr=subprocess.PIPE, env=_clean_env())
        try:
            time.sleep(2.5)
            assert process.poll() is None, process.communicate()
            process.send_signal(signal.SIGINT)
            _, stderr = process.communicate(timeout=30)
        finally:
            if process.poll() is None:
                process.kill()
                process.wait()
    stderr = stderr.decode(errors="replace")
    assert process.returncode == 130, stderr
    assert "Traceback" not in stderr and "KeyboardInterrupt" not in stderr, stderr
    assert message in stderr, stderr


class _Foreign(grpc.GenericRpcHandler):
    """A gRPC server that is up and answers every call UNAVAILABLE with a message of its own
    (an overloaded proxy, a mesh sidecar whose upstream is gone)."""

    def service(self, details):
        def answer(_request, context):
            context.abort(grpc.StatusCode.UNAVAILABLE, "upstream overloaded: shed by proxy")

        return grpc.unary_unary_rpc_method_handler(answer, lambda b: b, lambda b: b)


@pytest.fixture
def foreign_server() -> Iterator[str]:
    server = grpc.server(futures.ThreadPoolExecutor(max_workers=4))
    server.add_generic_rpc_handlers((_Foreign(),))
    port = server.add_insecure_port("127.0.0.1:0")
    server.start()
    yield f"127.0.0.1:{port}"
    server.stop(None)


def test_an_unavailable_answer_shows_what_the_server_said(foreign_server):
    done = _run("ls", FAR_AWAY, "--target", foreign_server, "--timeout", "10")
    line = _one_line_failure(done, codes=(1,))
    assert "upstream overloaded: shed by proxy" in line, line


def test_an_unimplemented_answer_is_one_line():
    """A target that is some other gRPC server: the call fails in one line (held)."""
    server = grpc.server(futures.ThreadPoolExecutor(max_workers=2))
    port = server.add_insecure_port("127.0.0.1:0")
    server.start()
    try:
        done = _run("ls", FAR_AWAY, "--target", f"127.0.0.1:{port}", "--timeout", "10")
    finally:
        server.stop(None)
    assert "UNIMPLEMENTED" in _one_line_failure(done, codes=(1,))


def test_a_token_file_that_is_missing_is_one_line():
    done = _run("ls", FAR_AWAY, "--target", f"127.0.0.1:{free_port()}", "--token-file", "/nonexistent/token")
    assert "cannot read token file" in _one_line_failure(done, codes=(1,))


def test_a_token_file_that_is_not_utf8_is_one_line(tmp_path):
    token = tmp_path / "token"
    token.write_bytes(b"\xff\xfe binary secret \x00\x01")
    done = _run("ls", FAR_AWAY, "--target", f"127.0.0.1:{free_port()}", "--token-file", str(token))
    _one_line_failure(done, codes=(1,))


# -- output into a closed pipe (`checkpointd ... | head -0`) -----------------------------------


def _into_closed_pipe(*args: str) -> subprocess.CompletedProcess:
    read_end, write_end = os.pipe()
    os.close(read_end)  # the reader is gone before the command writes a byte
    try:
        return subprocess.run([CHECKPOINTD, *args], stdout=write_end, stderr=subprocess.PIPE, text=True,
                              timeout=120, env=_clean_env(), errors="replace")
    finally:
        os.close(write_end)


def _closed_pipe_is_quiet(done: subprocess.CompletedProcess) -> None:
    assert done.returncode == 0, (done.returncode, done.stderr)
    for noise in ("Traceback", "Exception ignored", "Broken pipe", "BrokenPipeError", "error:"):
        assert noise not in done.stderr, done.stderr


@pytest.mark.parametrize("command", [
    "new-plan-id",
    "ls-json",
    "ls",
    "show",
    "plans",
    "config-ls",
    "diff-p",
    "ls-files",
    "cat",
])
def test_output_into_a_closed_pipe_is_not_an_error(command, checkpoint, tcp):
    cp, plan = checkpoint["checkpoint_id"], checkpoint["plan_id"]
    (checkpoint["_workspace"] / "a.txt").write_text("changed")
    args = {
        "new-plan-id": ["new-plan-id"],
        "ls-json": ["ls", plan, "--json", *tcp],
        "ls": ["ls", plan, *tcp],
        "show": ["show", cp, *tcp],
        "plans": ["plans", *tcp],
        "config-ls": ["config", "ls", *tcp],
        "diff-p": ["diff", cp, "-p", *tcp],
        "ls-files": ["ls-files", cp, *tcp],
        "cat": ["cat", cp, "a.txt", *tcp],
    }[command]
    _closed_pipe_is_quiet(_into_closed_pipe(*args))


# -- rollback --state-out that cannot be written -----------------------------------------------


def test_rollback_with_an_unwritable_state_out_changes_nothing_or_says_it_rolled_back(checkpoint, tcp, tmp_path):
    workspace = checkpoint["_workspace"]
    (workspace / "a.txt").write_text("edited")
    done = run_cli("rollback", checkpoint["plan_id"], checkpoint["checkpoint_id"], "--yes",
                   "--state-out", str(tmp_path / "missing-dir" / "state.json"), *tcp)
    _no_traceback(done)
    if done.returncode != 0:
        assert (workspace / "a.txt").read_text() == "edited", \
            f"exit {done.returncode} ({done.stderr.strip()}) but the rollback was applied"
    else:
        assert "Safety checkpoint" in done.stdout


# -- 5. offline maintenance commands -----------------------------------------------------------


def test_gc_stats_and_fsck_refuse_a_live_servers_data_dir_and_it_keeps_serving(fresh_server):
    workspace = fresh_server.new_workspace()
    (workspace / "f.txt").write_text("kept")
    tcp = ["--target", fresh_server.tcp_target]
    plan = str(ULID())
    assert run_cli("create", plan, "--workspace-root", str(workspace), *tcp).returncode == 0
    data = ["--data-dir", str(fresh_server.data_dir)]
    for args, code in ((["gc", *data], 1), (["gc", "--compact", *data], 1), (["stats", *data], 1),
                       (["fsck", *data], 2)):
        done = _run(*args)
        line = _one_line_failure(done, codes=(code,))
        assert "in use" in line or "served by" in line, line
    assert fresh_server.serving()
    listed = json.loads(run_cli("ls", plan, "--json", *tcp).stdout)
    assert len(listed) == 1
    assert run_cli("cat", listed[0]["checkpoint_id"], "f.txt", *tcp).stdout == "kept"


@pytest.mark.parametrize("command", ["stats", "gc"])
def test_a_report_on_a_directory_that_is_not_a_data_dir_creates_nothing(command, tmp_path):
    mistyped = tmp_path / "not-a-data-dir"
    mistyped.mkdir()
    (mistyped / "notes.txt").write_text("mine")
    done = _run(command, "--data-dir", str(mistyped))
    _no_traceback(done)
    assert sorted(p.name for p in mistyped.iterdir()) == ["notes.txt"]
    assert done.returncode != 0, done.stdout


@pytest.mark.parametrize("case", ["bad-url", "postgres-down", "corrupt-sqlite"])
@pytest.mark.parametrize("command", ["gc", "stats"])
def test_gc_and_stats_on_an_unusable_database_are_one_line(command, case, tmp_path):
    data_dir = tmp_path / "data"
    data_dir.mkdir()
    args = [command, "--data-dir", str(data_dir)]
    if case == "bad-url":
        args += ["--db-url", "mongodb://somewhere/db"]
    elif case == "postgres-down":
        args += ["--db-url", f"postgresql+psycopg://nobody@127.0.0.1:{free_port()}/nothing"]
    else:
        (data_dir / "checkpointd.db").write_bytes(b"this is not a database, just bytes" * 200)
    _one_line_failure(_run(*args, timeout=60), codes=(1, 2))


@pytest.mark.parametrize("case", ["bad-url", "postgres-down", "corrupt-sqlite", "empty-dir", "missing-dir"])
def test_fsck_on_an_unusable_database_is_one_line_exit_2(case, tmp_path):
    data_dir = tmp_path / "data"
    if case != "missing-dir":
        data_dir.mkdir()
    args = ["fsck", "--data-dir", str(data_dir)]
    if case == "bad-url":
        args += ["--db-url", "mongodb://somewhere/db"]
    elif case == "postgres-down":
        args += ["--db-url", f"postgresql+psycopg://nobody@127.0.0.1:{free_port()}/nothing"]
    elif case == "corrupt-sqlite":
        (data_dir / "checkpointd.db").write_bytes(b"this is not a database, just bytes" * 200)
    _one_line_failure(_run(*args, timeout=60), codes=(2,))


def test_fsck_through_a_server_that_is_down_is_exit_2():
    done = _run("fsck", "--target", f"127.0.0.1:{free_port()}", "--timeout", "10")
    _one_line_failure(done, codes=(2,))
