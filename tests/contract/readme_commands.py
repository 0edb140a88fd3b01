"""Runs the shell commands of a README section the way a reader would, one bash session for all.

Used by test_readme_commands.py so the README's grpcurl debugging walk-through cannot rot: each
command's own exit code and output are checked (some fail on purpose).
"""

from __future__ import annotations

import re
import subprocess
from dataclasses import dataclass
from pathlib import Path

MARKER = "@@readme-command@@"


@dataclass(frozen=True)
class CommandResult:
    command: str
    exit_code: int
    output: str


def commands(block: str) -> list[str]:
    """The block's commands: comments and blank lines dropped, backslash continuations joined."""
    out: list[str] = []
    pending = ""
    for line in block.splitlines():
        if not pending and (not line.strip() or line.lstrip().startswith("#")):
            continue
        if line.endswith("\\"):
            pending += line[:-1] + " "
            continue
        out.append(pending + line)
        pending = ""
    if pending:
        out.append(pending)
    return out


def run(command_list: list[str], cwd: Path, env: dict[str, str], timeout: float = 180) -> list[CommandResult]:
    """Runs the commands in one bash, in order, in ``env``.

    Every command runs even if an earlier one failed, and each one's exit code and combined
    output are returned.
    """
    script = ["exec 2>&1"]
    for index, command in enumerate(command_list):
        script.append(command)
        script.append(f'printf "\\n{MARKER} {index} %d\\n" "$?"')
    completed = subprocess.run(
        ["bash", "--norc", "--noprofile", "-c", "\n".join(script)],
        cwd=cwd,
        env=env,
        capture_output=True,
        text=True,
        timeout=timeout,
        stdin=subprocess.DEVNULL,
    )
    results = []
    chunks = re.split(rf"\n?{MARKER} (\d+) (\d+)\n", completed.stdout)
    for i in range(1, len(chunks) - 1, 3):
        index, code = int(chunks[i]), int(chunks[i + 1])
        results.append(CommandResult(command_list[index], code, chunks[i - 1]))
    if len(results) != len(command_list):
        raise AssertionError(f"only {len(results)} of {len(command_list)} commands ran:\n{completed.stdout}")
    return results
