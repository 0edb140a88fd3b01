"""What a newcomer reaches for, as `checkpointd` commands against a live server: plans, plan show,
cat, ls-files, export, diff -p, and a rollback refused for a nested workspace. Expected failures are one line
on stderr and exit status 1, never a traceback."""

from __future__ import annotations

import io
import json
import os
import subprocess
import tarfile

import pytest
from ulid import ULID

from checkpoint.v1 import checkpoint_service_pb2 as pb
from tests.ops.conftest import CHECKPOINTD, run_cli


@pytest.fixture
def tcp(checkpointd_server) -> list[str]:
    return ["--target", checkpointd_server.tcp_target]


def _create(tcp, plan_id, root) -> dict:
    done = run_cli("create", plan_id, "--workspace-root", str(root), "--json", *tcp)
    assert done.returncode == 0, done.stderr
    return json.loads(done.stdout)


def _one_line_failure(done) -> str:
    assert done.returncode == 1, done.stdout + done.stderr
    assert "Traceback" not in done.stderr
    errors = [line for line in done.stderr.splitlines() if line.startswith("error:")]
    assert len(errors) == 1, done.stderr
    return errors[0]


def test_plans_lists_and_plan_show_describes(tcp, workspace):
    (workspace / "sub").mkdir()
    (workspace / "f.txt").write_text("abc")
    first, second = str(ULID()), str(ULID())
    _create(tcp, first, workspace)
    newest = _create(tcp, first, workspace)
    _create(tcp, second, workspace / "sub")
    listed = run_cli("plans", "--under", str(workspace), "--json", *tcp)
    assert listed.returncode == 0, listed.stderr
    assert [p["plan_id"] for p in json.loads(listed.stdout)] == [second, first]
    table = run_cli("plans", "--filter", f'workspace_root = "{workspace}"', *tcp)
    assert table.returncode == 0 and first in table.stdout and second not in table.stdout
    assert "1 plan," in table.stdout
    shown = run_cli("plan", "show", first, *tcp)
    assert shown.returncode == 0, shown.stderr
    assert str(workspace) in shown.stdout and newest["checkpoint_id"] in shown.stdout
    assert json.loads(run_cli("plan", "show", first, "--json", *tcp).stdout)["checkpoint_count"] == "2"
    line = _one_line_failure(run_cli("plan", "show", str(ULID()), *tcp))
    assert "not found" in line and "checkpointd plans" in line
    line = _one_line_failure(run_cli("plans", "--filter", 'owner = "me"', *tcp))
    assert "unknown field 'owner'" in line and "workspace_root" in line


def test_cat_prints_the_bytes_as_they_were(tcp, workspace, plan_id):
    (workspace / "dir").mkdir()
    (workspace / "dir" / "notes.txt").write_bytes(b"first\xff\0\n")
    cp = _create(tcp, plan_id, workspace)
    (workspace / "dir" / "notes.txt").write_text("second\n")
    done = subprocess.run([CHECKPOINTD, "cat", cp["checkpoint_id"], "dir/notes.txt", *tcp], capture_output=True,
                          timeout=120)
    assert done.returncode == 0 and done.stdout == b"first\xff\0\n", done.stderr
    line = _one_line_failure(run_cli("cat", cp["checkpoint_id"], "dir", *tcp))
    assert "is a directory" in line
    line = _one_line_failure(run_cli("cat", cp["checkpoint_id"], "dir/missing.txt", *tcp))
    assert "has no 'dir/missing.txt'" in line


def test_ls_files_lists_a_directory_as_it_was(tcp, workspace, plan_id, checkpoint_stub):
    (workspace / "dir" / "sub").mkdir(parents=True)
    (workspace / "dir" / "notes.txt").write_text("12345")
    (workspace / "dir" / "sub" / "deep.txt").write_text("")
    (workspace / "dir" / "link").symlink_to("notes.txt")
    # Created over gRPC, not the CLI: each CLI run costs a process start.
    cp = {"checkpoint_id": checkpoint_stub.CreateCheckpoint(pb.CreateCheckpointRequest(
        plan_id=plan_id, workspace_root=str(workspace))).checkpoint.checkpoint_id}
    (workspace / "dir" / "later.txt").write_text("not in the checkpoint")
    done = run_cli("ls-files", cp["checkpoint_id"], "dir", *tcp)
    assert done.returncode == 0, done.stderr
    rows = [line.split() for line in done.stdout.splitlines()]
    assert [row[3] for row in rows] == ["dir/link", "dir/notes.txt", "dir/sub"]
    assert rows[0][1:] == ["symlink", "9", "dir/link", "->", "notes.txt"]
    assert rows[1][1:] == ["file", "5", "dir/notes.txt"] and rows[2][1] == "dir"
    recursive = run_cli("ls-files", cp["checkpoint_id"], "-r", *tcp)
    assert [line.split()[3] for line in recursive.stdout.splitlines()] == [
        "dir", "dir/link", "dir/notes.txt", "dir/sub", "dir/sub/deep.txt"]
    line = _one_line_failure(run_cli("ls-files", cp["checkpoint_id"], "dir/notes.txt", *tcp))
    assert "not a directory" in line and "cat" in line


def test_export_writes_a_tar_and_never_overwrites_unless_forced(tcp, workspace, plan_id, tmp_path):
    (workspace / "run.sh").write_text("#!/bin/sh\n")
    (workspace / "run.sh").chmod(0o755)
    (workspace / "link").symlink_to("run.sh")
    cp = _create(tcp, plan_id, workspace)
    output = tmp_path / "x.tar"
    done = run_cli("export", cp["checkpoint_id"], "--output", str(output), *tcp)
    assert done.returncode == 0, done.stderr
    with tarfile.open(output) as tar:
        members = {m.name: m for m in tar.getmembers()}
        assert members["run.sh"].mode == 0o755 and members["link"].linkname == "run.sh"
    line = _one_line_failure(run_cli("export", cp["checkpoint_id"], "--output", str(output), *tcp))
    assert "already exists" in line and "--force" in line
    output.write_bytes(b"precious")
    assert _one_line_failure(run_cli("export", cp["checkpoint_id"], "-o", str(output), *tcp))
    assert output.read_bytes() == b"precious"
    assert "is a directory" in _one_line_failure(run_cli("export", cp["checkpoint_id"], "-o", str(tmp_path), *tcp))
    elsewhere = tmp_path / "elsewhere.txt"
    elsewhere.write_text("not an archive's place")
    (tmp_path / "alias.tar").symlink_to(elsewhere)
    forced = run_cli("export", cp["checkpoint_id"], "-o", str(tmp_path / "alias.tar"), "--force", *tcp)
    assert forced.returncode == 0, forced.stderr
    assert elsewhere.read_text() == "not an archive's place", "--force replaced the link, not what it points to"
    assert not os.path.islink(tmp_path / "alias.tar")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["alias.tar", "elsewhere.txt", "x.tar"]
    failed = run_cli("export", str(ULID()), "-o", str(tmp_path / "new.tar"), *tcp)
    assert "not found" in _one_line_failure(failed)
    assert not (tmp_path / "new.tar").exists() and not [p for p in tmp_path.iterdir() if p.suffix == ".part"]
    longest = tmp_path / ("n" * 251 + ".tar")  # 255 bytes: the longest name a file may have here
    done = run_cli("export", cp["checkpoint_id"], "-o", str(longest), *tcp)
    assert done.returncode == 0, done.stderr
    assert tarfile.is_tarfile(longest)


def test_export_to_stdout_is_the_same_archive(tcp, workspace, plan_id):
    (workspace / "a.txt").write_text("a")
    cp = _create(tcp, plan_id, workspace)
    data = subprocess.run([CHECKPOINTD, "export", cp["checkpoint_id"], "-o", "-", *tcp], capture_output=True,
                          timeout=120, check=True).stdout
    with tarfile.open(fileobj=io.BytesIO(data)) as tar:
        assert tar.extractfile("a.txt").read() == b"a"


def test_diff_patch_shows_lines_names_binaries_and_colours_on_request(tcp, workspace, plan_id):
    (workspace / "a.txt").write_text("one\ntwo\n")
    (workspace / "b.bin").write_bytes(b"\0\1")
    base = _create(tcp, plan_id, workspace)
    (workspace / "a.txt").write_text("one\n2\n")
    (workspace / "b.bin").write_bytes(b"\0\2")
    plain = run_cli("diff", base["checkpoint_id"], "-p", *tcp)
    assert plain.returncode == 0, plain.stderr
    assert "--- a/a.txt\n+++ b/a.txt\n@@ -1,2 +1,2 @@\n one\n-two\n+2\n" in plain.stdout
    assert "diff --checkpointd a/b.bin b/b.bin\nBinary files differ" in plain.stdout
    assert "\x1b[" not in plain.stdout, "not a terminal: no colour by default"
    coloured = run_cli("diff", base["checkpoint_id"], "-p", "--color", "always", *tcp)
    assert "\x1b[32m+2\x1b[0m" in coloured.stdout and "\x1b[31m-two\x1b[0m" in coloured.stdout
    as_json = json.loads(run_cli("diff", base["checkpoint_id"], "-p", "--json", *tcp).stdout)
    assert {c["path"]: c["text_diff_status"] for c in as_json} == {"a.txt": "TEXT_DIFF_STATUS_TEXT",
                                                                    "b.bin": "TEXT_DIFF_STATUS_BINARY"}


def test_rollback_of_a_plan_containing_another_is_refused_in_one_line(tcp, workspace):
    (workspace / "inner").mkdir()
    (workspace / "inner" / "f.txt").write_text("v1")
    outer, inner = str(ULID()), str(ULID())
    cp = _create(tcp, outer, workspace)
    _create(tcp, inner, workspace / "inner")
    (workspace / "inner" / "f.txt").write_text("v2")
    line = _one_line_failure(run_cli("rollback", outer, cp["checkpoint_id"], "--yes", *tcp))
    assert inner in line and "--allow-nested" in line
    assert (workspace / "inner" / "f.txt").read_text() == "v2"
    done = run_cli("rollback", outer, cp["checkpoint_id"], "--yes", "--allow-nested", *tcp)
    assert done.returncode == 0, done.stderr
    assert (workspace / "inner" / "f.txt").read_text() == "v1"
    assert inner in done.stdout


@pytest.mark.parametrize("command", ["export", "cat"])
def test_a_reader_that_stops_early_is_not_an_error(tcp, workspace, plan_id, command):
    """`checkpointd export -o - | tar -t | head`, or `cat ... | head`: the pipe closes while the
    command writes, which is what the reader asked for, so no error and exit status 0."""
    (workspace / "big.bin").write_bytes(os.urandom(2 << 20))  # past any pipe buffer
    cp = _create(tcp, plan_id, workspace)
    args = ["-o", "-"] if command == "export" else ["big.bin"]
    with subprocess.Popen([CHECKPOINTD, command, cp["checkpoint_id"], *args, *tcp], stdout=subprocess.PIPE,
                          stderr=subprocess.PIPE) as reader:
        assert len(reader.stdout.read(100)) == 100
        reader.stdout.close()
        stderr = reader.stderr.read().decode()
        assert reader.wait(timeout=120) == 0, stderr
    assert stderr == ""
