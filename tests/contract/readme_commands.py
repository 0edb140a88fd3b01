"""Runs the shell commands of a README section the way a reader would, one bash session for all.

Used by test_readme_commands.py so the README's grpcurl walk-through cannot rot.
"""

from __future__ import annotations

import os
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


def section(markdown: str, heading: str) -> str:
    """The text under `## heading` up to the next heading of level 1 or 2 outside code fences."""
    lines = markdown.splitlines(keepends=True)
    start = next((i for i, line in enumerate(lines) if line.rstrip() == f"## {heading}"), None)
    if start is None:
        raise LookupError(f"README has no '## {heading}' section")
    body: list[str] = []
    in_fence = False
    for line in lines[start + 1 :]:
        if line.startswith("```"):
            in_fence = not in_fence
        elif not in_fence and re.match(r"#{1,2} ", line):
            break
        body.append(line)
    return "".join(body)


def fenced_blocks(markdown: str, languages: str) -> list[str]:
    """The bodies of the fenced code blocks tagged with one of `languages` ("sh|bash")."""
    return re.findall(rf"^```(?:{languages})[ \t]*\n(.*?)^```", markdown, re.M | re.S)


def shell_blocks(markdown: str) -> list[str]:
    return fenced_blocks(markdown, "sh|bash|shell")


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


def run(command_list: list[str], cwd: Path, assignments: dict[str, str], timeout: float = 180) -> list[CommandResult]:
    """Runs the commands in one bash, in order, replacing `NAME=...` lines for the given names.

    Every command runs even if an earlier one failed, and each one's exit code and combined
    output are returned.
    """
    script = ["exec 2>&1"]
    for index, command in enumerate(command_list):
        name = command.split("=", 1)[0]
        if "=" in command and name in assignments and re.fullmatch(r"[A-Z_]+", name):
            command = f"{name}={assignments[name]}"
        script.append(command)
        script.append(f'printf "\\n{MARKER} {index} %d\\n" "$?"')
    env = {k: v for k, v in os.environ.items() if not k.startswith("CHECKPOINTD_")}
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
