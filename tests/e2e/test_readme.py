"""The README's grpcurl walk-through, run verbatim with bash against a live server."""

from __future__ import annotations

import re
import shutil
import subprocess
import sys
from pathlib import Path

README = Path(__file__).resolve().parents[2] / "README.md"
GRPCURL = str(Path(sys.executable).with_name("grpcurl"))


def walkthrough() -> str:
    text = README.read_text()
    block = re.search(r"<!-- walkthrough:start -->\n```bash\n(.*?)```\n<!-- walkthrough:end -->", text, re.S)
    assert block, "README lost its walk-through block"
    return block.group(1)


def test_readme_walkthrough_restores_the_file(fresh_server):
    cwd = fresh_server.new_workspace()
    result = subprocess.run(
        ["bash", "-euo", "pipefail", "-c", walkthrough()],
        cwd=cwd, capture_output=True, text=True, timeout=120,
        env={"PATH": "/usr/bin:/bin", "ADDR": fresh_server.tcp_target, "GRPCURL": GRPCURL},
    )
    assert result.returncode == 0, result.stderr + result.stdout
    assert result.stdout.rstrip().endswith("hello\nstray.txt removed")
    assert '"kind": "CHANGE_KIND_MODIFIED"' in result.stdout
    assert '"phase": "PHASE_ROLLBACK_SAFETY"' in result.stdout
    assert (cwd / "demo" / "notes.txt").read_text() == "hello\n"


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


def test_grpcurl_shows_the_error_reason(checkpointd_server):
    result = subprocess.run([GRPCURL, "-plaintext", "-d", '{"plan_id": "nope"}', checkpointd_server.tcp_target,
                             "checkpoint.v1.CheckpointService/ListCheckpoints"],
                            capture_output=True, text=True, timeout=30)
    assert result.returncode != 0
    assert "InvalidArgument" in result.stderr and '"reason":"INVALID_PLAN_ID"' in result.stderr
