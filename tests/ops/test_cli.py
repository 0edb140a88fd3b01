"""The human CLI against a live server, over TCP and the unix socket: tables, --json,
confirmation before a rollback, progress output, config, health."""

from __future__ import annotations

import json
import os

import pytest
from ulid import ULID

from tests.conftest import free_port
from tests.helpers import skip_unless_ci, tree_state
from tests.ops.conftest import TOKEN, run_cli, server_exit


@pytest.fixture(params=["tcp", "unix"])
def target(request, checkpointd_server) -> list[str]:
    """Both transports, for the main flows."""
    server = checkpointd_server
    return ["--target", server.tcp_target if request.param == "tcp" else server.unix_target]


@pytest.fixture
def tcp(checkpointd_server) -> list[str]:
    return ["--target", checkpointd_server.tcp_target]


def _create(target: list[str], plan_id: str, workspace, *extra: str) -> dict:
    done = run_cli("create", plan_id, "--workspace-root", str(workspace), "--json", *extra, *target)
    assert done.returncode == 0, done.stderr
    return json.loads(done.stdout)


def test_create_ls_show_and_diff(target, workspace, plan_id):
    (workspace / "notes.txt").write_text("hello")
    created = run_cli("create", plan_id, "--workspace-root", str(workspace), "--label", "step=1",
                      "--description", "first", *target)
    assert created.returncode == 0, created.stderr
    assert "Recording a checkpoint" in created.stderr and "done in" in created.stderr
    assert "notes" not in created.stderr
    first = json.loads(run_cli("ls", plan_id, "--json", *target).stdout)[0]
    assert (first["labels"], first["description"], first["file_count"]) == ({"step": "1"}, "first", "1")
    (workspace / "notes.txt").write_text("changed")
    (workspace / "extra.txt").write_text("new")
    second = _create(target, plan_id, workspace, "--pin")
    assert second["labels"] == {"pinned": "true"}

    table = run_cli("ls", plan_id, *target)
    assert table.returncode == 0
    assert first["checkpoint_id"] in table.stdout and second["checkpoint_id"] in table.stdout
    assert "pinned=true" in table.stdout and "2 checkpoints" in table.stdout
    assert table.stdout.index(second["checkpoint_id"]) < table.stdout.index(first["checkpoint_id"])
    filtered = json.loads(run_cli("ls", plan_id, "--filter", 'labels.pinned = "true"', "--json", *target).stdout)
    assert [c["checkpoint_id"] for c in filtered] == [second["checkpoint_id"]]

    shown = run_cli("show", first["checkpoint_id"], *target)
    assert shown.returncode == 0 and plan_id in shown.stdout and "step=1" in shown.stdout

    diff = run_cli("diff", first["checkpoint_id"], second["checkpoint_id"], *target)
    assert "1 added, 1 modified" in diff.stdout
    assert "notes.txt" in diff.stdout and "extra.txt" in diff.stdout
    changes = json.loads(run_cli("diff", first["checkpoint_id"], "--json", *target).stdout)
    assert {(c["path"], c["kind"]) for c in changes} == {("notes.txt", "CHANGE_KIND_MODIFIED"),
                                                        ("extra.txt", "CHANGE_KIND_ADDED")}


def test_rollback_shows_the_dry_run_and_asks_first(target, workspace, plan_id):
    (workspace / "a.txt").write_text("original")
    checkpoint = _create(target, plan_id, workspace)
    expected = tree_state(workspace)
    (workspace / "a.txt").write_text("edited")
    (workspace / "stray.txt").write_text("stray")
    edited = tree_state(workspace)

    declined = run_cli("rollback", plan_id, checkpoint["checkpoint_id"], *target, stdin="n\n")
    assert declined.returncode == 1
    assert "1 modified, 1 deleted" in declined.stdout and "stray.txt" in declined.stdout
    assert "[y/N]" in declined.stderr and "nothing was changed" in declined.stderr
    assert tree_state(workspace) == edited
    no_answer = run_cli("rollback", plan_id, checkpoint["checkpoint_id"], *target, stdin="")
    assert no_answer.returncode == 1 and tree_state(workspace) == edited

    accepted = run_cli("rollback", plan_id, checkpoint["checkpoint_id"], *target, stdin="y\n")
    assert accepted.returncode == 0, accepted.stderr
    assert "rolled back: 1 modified, 1 deleted" in accepted.stdout and "Safety checkpoint" in accepted.stdout
    assert tree_state(workspace) == expected

    undo = json.loads(run_cli("ls", plan_id, "--json", *target).stdout)[0]
    assert undo["phase"] == "PHASE_ROLLBACK_SAFETY"
    unattended = run_cli("rollback", plan_id, undo["checkpoint_id"], "--yes", "--json", *target, stdin="")
    assert unattended.returncode == 0, unattended.stderr
    result = json.loads(unattended.stdout)
    assert result["applied"] and result["safety_checkpoint_id"]
    assert {c["path"] for c in result["dry_run"]} == {c["path"] for c in result["changes"]} == {"a.txt", "stray.txt"}
    assert tree_state(workspace) == edited


def test_a_path_argument_that_is_not_utf8_names_that_file(tcp, workspace, plan_id):
    latin1 = os.fsdecode(b"caf\xe9.txt")
    (workspace / latin1).write_bytes(b"v1")
    (workspace / "other.txt").write_text("v1")
    checkpoint = _create(tcp, plan_id, workspace)
    (workspace / latin1).write_bytes(b"v2")
    (workspace / "other.txt").write_text("v2")

    diff = run_cli("diff", checkpoint["checkpoint_id"], "--path", latin1, "--json", *tcp)
    assert diff.returncode == 0, diff.stderr
    assert [c["path"] for c in json.loads(diff.stdout)] == ["caf\\xe9.txt"]
    restored = run_cli("rollback", plan_id, checkpoint["checkpoint_id"], "--path", latin1, "--yes", *tcp)
    assert restored.returncode == 0, restored.stderr
    assert (workspace / latin1).read_bytes() == b"v1"
    assert (workspace / "other.txt").read_text() == "v2"


def test_rollback_of_state_writes_it_out(tcp, workspace, plan_id, tmp_path):
    state_file = tmp_path / "state.json"
    state_file.write_text('{"step": 3}')
    checkpoint = _create(tcp, plan_id, workspace, "--state-file", str(state_file))
    out = tmp_path / "restored.json"
    done = run_cli("rollback", plan_id, checkpoint["checkpoint_id"], "--scope", "state", "--state-out", str(out),
                   "--yes", *tcp)
    assert done.returncode == 0, done.stderr
    assert out.read_text() == '{"step": 3}'


def test_config_get_set_clear(tcp, plan_id):
    key = "core.checkpoints.client_deadline_ms"
    set_plan = json.loads(run_cli("config", "set", key, "1234", "--plan", plan_id, "--json", *tcp).stdout)[0]
    assert (set_plan["value"], set_plan["source"]) == (1234, "CONFIG_SOURCE_PLAN")
    got = run_cli("config", "get", key, "--plan", plan_id, *tcp)
    assert "1234" in got.stdout and "plan" in got.stdout
    assert json.loads(run_cli("config", "get", key, "--json", *tcp).stdout)[0]["source"] != "CONFIG_SOURCE_PLAN"
    listed = run_cli("config", "ls", "--plan", plan_id, *tcp)
    assert "core.retention.max_checkpoints_per_plan" in listed.stdout and key in listed.stdout
    cleared = json.loads(run_cli("config", "clear", key, "--plan", plan_id, "--json", *tcp).stdout)[0]
    assert cleared["source"] != "CONFIG_SOURCE_PLAN"
    words = json.loads(run_cli("config", "set", "core.checkpoints.on_unavailable", "refuse", "--plan", plan_id,
                               "--json", *tcp).stdout)[0]
    assert words["value"] == "refuse"
    bad = run_cli("config", "set", "core.checkpoints.auto_create_on", '["on_tuesday"]', "--plan", plan_id, *tcp)
    assert bad.returncode == 1 and "INVALID_CONFIG_VALUE" in bad.stderr
    unknown = run_cli("config", "get", "core.nope", *tcp)
    assert unknown.returncode == 1 and "UNKNOWN_CONFIG_KEY" in unknown.stderr
    assert "core.retention.max_age_seconds" in unknown.stderr  # the keys there are
    typo = run_cli("config", "set", "core.checkpoints.auto_create_onn", '["on_error"]', *tcp)
    assert typo.returncode == 1 and "did you mean 'core.checkpoints.auto_create_on'?" in typo.stderr


def test_config_set_and_clear_with_an_etag_change_only_the_value_read(tcp, plan_id):
    """Read-modify-write from a shell: `config get --json` gives the etag, `--etag` makes the change
    conditional on it; a stale one changes nothing and says why, in one line."""
    key = "core.checkpoints.client_deadline_ms"
    read = json.loads(run_cli("config", "get", key, "--plan", plan_id, "--json", *tcp).stdout)[0]
    changed = json.loads(run_cli("config", "set", key, "2345", "--plan", plan_id, "--etag", read["etag"],
                                 "--json", *tcp).stdout)[0]
    assert changed["value"] == 2345 and changed["etag"] != read["etag"]
    stale = run_cli("config", "set", key, "3456", "--plan", plan_id, "--etag", read["etag"], *tcp)
    assert stale.returncode == 1 and "ABORTED [ETAG_MISMATCH]" in stale.stderr
    assert "Traceback" not in stale.stderr
    stale_clear = run_cli("config", "clear", key, "--plan", plan_id, "--etag", read["etag"], *tcp)
    assert stale_clear.returncode == 1 and "ETAG_MISMATCH" in stale_clear.stderr
    assert json.loads(run_cli("config", "get", key, "--plan", plan_id, "--json", *tcp).stdout)[0]["value"] == 2345
    cleared = json.loads(run_cli("config", "clear", key, "--plan", plan_id, "--etag", changed["etag"], "--json",
                                 *tcp).stdout)[0]
    assert cleared["source"] != "CONFIG_SOURCE_PLAN"


def test_errors_are_one_line_and_exit_1(tcp):
    missing = run_cli("show", str(ULID()), *tcp)
    assert missing.returncode == 1 and "NOT_FOUND [CHECKPOINT_NOT_FOUND]" in missing.stderr
    assert "Traceback" not in missing.stderr


def test_health(tcp):
    healthy = run_cli("health", "--json", *tcp)
    assert healthy.returncode == 0 and json.loads(healthy.stdout)["status"] == "SERVING"
    down = run_cli("health", "--target", f"127.0.0.1:{free_port()}", "--timeout", "2")
    assert down.returncode == 1 and "UNAVAILABLE" in down.stdout


def test_token_from_the_environment_or_a_file(ops_server, token_file):
    server = ops_server("--token-file", str(token_file))
    refused = run_cli("ls", str(ULID()), "--target", server.tcp_target, env={"CHECKPOINTD_TOKEN": ""})
    assert refused.returncode == 1 and "UNAUTHENTICATED" in refused.stderr
    by_env = run_cli("ls", str(ULID()), "--json", "--target", server.unix_target, env={"CHECKPOINTD_TOKEN": TOKEN})
    assert by_env.returncode == 0 and by_env.stdout.strip() == "[]", by_env.stderr
    by_file = run_cli("ls", str(ULID()), "--json", "--target", server.tcp_target, "--token-file", str(token_file))
    assert by_file.returncode == 0, by_file.stderr


def test_delete_asks_first(tcp, workspace, plan_id):
    checkpoint = _create(tcp, plan_id, workspace)
    kept = run_cli("delete", checkpoint["checkpoint_id"], *tcp, stdin="no\n")
    assert kept.returncode == 1 and len(json.loads(run_cli("ls", plan_id, "--json", *tcp).stdout)) == 1
    gone = run_cli("delete", checkpoint["checkpoint_id"], "--yes", *tcp)
    assert gone.returncode == 0 and json.loads(run_cli("ls", plan_id, "--json", *tcp).stdout) == []


def test_a_second_server_on_the_same_sqlite_database_is_refused(ops_server):
    first = ops_server()
    if first.db_url:
        skip_unless_ci("any number of servers may share a PostgreSQL database")
    refused = server_exit(["--listen", f"127.0.0.1:{free_port()}", "--data-dir", str(first.data_dir),
                           "--workspace-root", str(first.allowed_root)])
    assert refused.returncode == 2, refused.stderr
    assert "is already served by another checkpointd" in refused.stderr
    assert first.serving()
    first.stop()
    first.start()
    assert first.serving(), "once the first server has stopped, the database can be served again"
