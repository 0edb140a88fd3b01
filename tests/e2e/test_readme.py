"""The README's walk-through, its error transcript, the `checkpointd` command session and the
configuration example, each run as written in a checkout with a server started as `make run`
starts one (tests.readme_blocks)."""

from __future__ import annotations

import json
import re
import shlex
import shutil
import subprocess
import sys
from pathlib import Path

from tests.readme_blocks import readme_block

GRPCURL = str(Path(sys.executable).with_name("grpcurl"))


def test_readme_walkthrough_restores_the_file(checkout):
    result = checkout.run_shell(readme_block("README.md", "walkthrough"))
    assert result.returncode == 0, result.stderr + result.stdout
    assert result.stdout.rstrip().endswith("hello\nstray.txt removed")
    assert '"kind": "CHANGE_KIND_MODIFIED"' in result.stdout
    assert '"phase": "PHASE_ROLLBACK_SAFETY"' in result.stdout
    assert (checkout.root / "demo" / "walkthrough" / "notes.txt").read_text() == "hello\n"


def test_readme_walkthrough_run_again_after_the_other_examples_keeps_their_files(checkout):
    """Each example has its own folder under demo/ and a fresh plan, so running the walk-through
    once more (after the others) neither deletes their files nor mixes up plans."""
    first = checkout.run_shell(readme_block("README.md", "walkthrough"))
    assert first.returncode == 0, first.stderr + first.stdout
    cli = checkout.run_shell(readme_block("README.md", "cli"))
    assert cli.returncode == 0, cli.stderr + cli.stdout
    others = {path: path.read_bytes() for path in (checkout.root / "demo" / "cli").rglob("*") if path.is_file()}
    assert others
    again = checkout.run_shell(readme_block("README.md", "walkthrough"))
    assert again.returncode == 0, again.stderr + again.stdout
    assert again.stdout.rstrip().endswith("hello\nstray.txt removed")
    assert {path: path.read_bytes() for path in others} == others


def test_the_readme_error_transcript_is_what_grpcurl_prints(checkout):
    """The block is a terminal transcript: its `$` line, run, prints the rest of it exactly."""
    command, _, shown = readme_block("README.md", "plan-id-error").partition("\n")
    assert command.startswith("$ grpcurl ")
    argv = shlex.split(checkout.adapt(command.removeprefix("$ ")))
    result = subprocess.run([GRPCURL, *argv[1:]], capture_output=True, text=True, timeout=60)
    assert result.returncode == 64 + 3  # grpcurl exits 64 + the status code (INVALID_ARGUMENT)
    assert (result.stdout + result.stderr).rstrip("\n") == shown.rstrip("\n")


def test_the_readme_cli_session_rolls_back_and_configures(checkout):
    result = checkout.run_shell(readme_block("README.md", "cli"))
    assert result.returncode == 0, result.stderr + result.stdout
    notes = checkout.root / "demo" / "cli" / "notes.txt"
    assert notes.read_text() == "draft\n" and not (notes.parent / "scratch.txt").exists()
    assert "rolled back: 1 modified, 1 deleted" in result.stdout, result.stdout
    assert "'*.log'" not in result.stdout and "*.log" in result.stdout  # the list, set item by item
    assert f"{checkout.unix_target}: SERVING" in result.stdout, "the CLI did not find make run's socket by itself"


def test_the_readme_contents_session_finds_the_plan_reads_diffs_and_exports(checkout):
    result = checkout.run_shell(readme_block("README.md", "cli-contents"))
    assert result.returncode == 0, result.stderr + result.stdout
    assert "1 plan," in result.stdout
    assert re.search(r"^0[0-7]{3} file +8 notes\.txt$", result.stdout, re.MULTILINE), "ls-files listed the file"
    assert "one\ntwo\n" in result.stdout, "cat printed the file as it was"
    assert "--- a/notes.txt\n+++ b/notes.txt\n@@ -1,2 +1,2 @@\n one\n-two\n+2\n" in result.stdout
    assert "notes.txt" in result.stdout.splitlines()[-1], "tar lists the exported file"
    assert (checkout.root / "demo" / "contents.tar").is_file()


def test_the_readme_configuration_example_sets_and_clears_a_plan_override(checkout):
    result = checkout.run_shell(readme_block("README.md", "config-keys"))
    assert result.returncode == 0, result.stderr + result.stdout
    assert '"on_error"' in result.stdout and "CONFIG_SOURCE_PLAN" in result.stdout
    outcome = subprocess.run([str(checkout.root / ".venv" / "bin" / "checkpointd"), "config", "get",
                              "core.checkpoints.auto_create_on", "--json"], capture_output=True, text=True,
                             timeout=120, env=checkout.environment(), cwd=checkout.root)
    assert json.loads(outcome.stdout)[0]["source"] == "CONFIG_SOURCE_DEFAULT", "the example changed the global value"


def test_grpcurl_lists_and_describes_through_reflection_over_tcp_and_unix_socket(checkpointd_server):
    assert shutil.which(GRPCURL)
    for target in (["-plaintext", checkpointd_server.tcp_target],
                   ["-plaintext", "-unix", str(checkpointd_server.socket_path)]):
        listed = subprocess.run([GRPCURL, *target, "list"], capture_output=True, text=True, timeout=30)
        assert listed.returncode == 0, listed.stderr
        assert {"checkpoint.v1.CheckpointService", "checkpoint.v1.ConfigService",
                "grpc.health.v1.Health"} <= set(listed.stdout.split())
        described = subprocess.run([GRPCURL, *target, "describe", "checkpoint.v1.RollbackRequest"],
                                   capture_output=True, text=True, timeout=30)
        assert described.returncode == 0 and "dry_run" in described.stdout, described.stderr
