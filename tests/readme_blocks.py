"""The code blocks of the READMEs, each run by a test or marked as not meant to run.

In the markdown, the line before a fenced block (blank lines aside) says which:

    <!-- readme-test: NAME -->       a test runs it, fetching it with readme_block(FILE, NAME)
    <!-- not-run: WHY -->            it is not meant to run (deployment, a map, the test suite itself)

tests/contract/test_readme_blocks.py fails if a block has neither, or if no test asks for a
NAME. Blocks run in a ``Checkout``: a directory that looks like the repository, with a server
started in it as ``make run`` starts one (only its TCP port differs: blocks have the default
address 127.0.0.1:50051 replaced by it, see ``Checkout.adapt``).
"""

from __future__ import annotations

import os
import re
import subprocess
from dataclasses import dataclass
from pathlib import Path

from checkpointd_client.targets import DEFAULT_TCP, SOCKET_NAME
from tests.conftest import CHECKPOINTD, SERVER_ARGS, RunningServer

REPO = Path(__file__).resolve().parents[1]
#: Every markdown file whose blocks must be run or marked.
READMES = ("README.md", "clients/python/README.md", "clients/node/README.md")
_MARKER = re.compile(r"<!--\s*(readme-test|not-run):\s*(.*?)\s*-->")
_FENCE = re.compile(r"^(```+)(\S*)\s*$")


@dataclass(frozen=True)
class Block:
    readme: str
    line: int
    language: str
    text: str
    test: str = ""
    not_run: str = ""

    @property
    def where(self) -> str:
        return f"{self.readme}:{self.line}"


def blocks(readme: str) -> list[Block]:
    """Every fenced block of ``readme`` (a path relative to the repository) with its marker."""
    lines = (REPO / readme).read_text(encoding="utf-8").splitlines()
    found: list[Block] = []
    index = 0
    while index < len(lines):
        opening = _FENCE.match(lines[index])
        if not opening:
            index += 1
            continue
        end = next((i for i in range(index + 1, len(lines)) if lines[i].startswith(opening.group(1))), None)
        if end is None:
            raise AssertionError(f"{readme}:{index + 1}: a code block is never closed")
        before = next((lines[i] for i in range(index - 1, -1, -1) if lines[i].strip()), "")
        marker = _MARKER.fullmatch(before.strip())
        kind, value = marker.groups() if marker else ("", "")
        found.append(Block(readme, index + 1, opening.group(2), "\n".join(lines[index + 1:end]) + "\n",
                           test=value if kind == "readme-test" else "", not_run=value if kind == "not-run" else ""))
        index = end + 1
    return found


def readme_block(readme: str, name: str) -> str:
    """The text of the block of ``readme`` marked ``<!-- readme-test: name -->``."""
    named = [block for block in blocks(readme) if block.test == name]
    assert len(named) == 1, f"{readme} has {len(named)} blocks marked readme-test: {name}"
    return named[0].text


def clean_environment() -> dict[str, str]:
    """The test run's environment without any CHECKPOINTD_* setting of its own."""
    return {key: value for key, value in os.environ.items() if not key.startswith("CHECKPOINTD_")}


class Checkout(RunningServer):
    """A directory that looks like the repository (its .venv and clients linked), with a server
    started in it the way ``make run`` starts one: ``checkpointd serve`` from the checkout (so the
    checkout is the allowed workspace root) with its data dir's unix socket, and TCP on a free
    port. ``CHECKPOINTD_DATA_DIR`` names the data dir, so the CLI and the Python client find the
    socket as they find ``make run``'s by default."""

    def __init__(self, base: Path, db_url: str = "", extra_args: tuple[str, ...] = SERVER_ARGS) -> None:
        super().__init__(base, db_url=db_url, extra_args=extra_args)
        self.root = base / "checkout"
        self.root.mkdir()
        for name in (".venv", "clients"):
            (self.root / name).symlink_to(REPO / name)
        self.allowed_root = self.root
        self.socket_path = self.data_dir / SOCKET_NAME
        self.unix_target = f"unix://{self.socket_path}"

    def command(self) -> list[str]:
        cmd = [CHECKPOINTD, "serve", "--listen", self.tcp_target, "--listen", self.unix_target,
               "--grace-seconds", "5", *self.extra_args]
        return cmd + (["--db-url", self.db_url] if self.db_url else [])

    def environment(self) -> dict[str, str]:
        """What a reader's shell has: no CHECKPOINTD_* but the data dir that stands for the default one."""
        return {**clean_environment(), "CHECKPOINTD_DATA_DIR": str(self.data_dir)}

    def start(self, timeout: float = 30.0) -> None:
        self.data_dir.mkdir(parents=True, exist_ok=True)
        with open(self.log_path, "ab") as log:
            self.process = subprocess.Popen(self.command(), stdout=log, stderr=subprocess.STDOUT, cwd=self.root,
                                            env=self.environment())
        self.wait_serving(timeout)

    def adapt(self, text: str) -> str:
        """A block as it runs here: the default address is this server's."""
        return text.replace(DEFAULT_TCP, self.tcp_target)

    def run_shell(self, block: str, timeout: float = 180) -> subprocess.CompletedProcess:
        """A shell block run as pasted into a terminal in the checkout, after `source .venv/bin/activate`
        (which every block that calls `checkpointd` or `grpcurl` by name assumes); stops at the first
        failure."""
        env = self.environment()
        env["PATH"] = f"{self.root / '.venv' / 'bin'}:/usr/bin:/bin"
        return subprocess.run(["bash", "--norc", "--noprofile", "-euo", "pipefail", "-c", self.adapt(block)],
                              cwd=self.root, env=env, capture_output=True, text=True, timeout=timeout,
                              stdin=subprocess.DEVNULL)
