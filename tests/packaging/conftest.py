"""Fresh virtual environments for the packaging tests, filled without the network when possible.

A venv gets no pip of its own (`venv --without-pip`): the dev venv's pip installs into it with
`--python`. Packages come from a wheelhouse in the user's cache (like pip's own cache, it outlives
the clone: CI runs in a fresh one) with `--no-index`; when something is missing there (a first
run, a new dependency), `pip download` fetches it from the index and the install is retried
offline, so later runs need no index at all. CHECKPOINTD_TEST_WHEELHOUSE puts it elsewhere.
"""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Sequence
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
VERSION = (REPO / "VERSION").read_text().strip()
USER_CACHE = Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache")
WHEELHOUSE = Path(os.environ.get("CHECKPOINTD_TEST_WHEELHOUSE") or USER_CACHE / "checkpointd" / "test-wheelhouse")
PIP = [sys.executable, "-m", "pip", "--disable-pip-version-check"]
#: This repository's own distributions: never kept in the wheelhouse, always taken from a fresh build.
OWN_DISTRIBUTIONS = ("checkpointd-", "checkpointd_client-")


def run(command: Sequence[str | os.PathLike], *, cwd: Path | None = None, env: dict[str, str] | None = None,
        timeout: float = 300) -> str:
    """Runs a command; its combined output, or a failure that shows it."""
    result = subprocess.run([str(c) for c in command], cwd=cwd, env=env, capture_output=True, text=True,
                            timeout=timeout)
    if result.returncode != 0:
        pytest.fail(f"{' '.join(map(str, command))} exited {result.returncode}:\n{result.stdout}\n{result.stderr}",
                    pytrace=False)
    return result.stdout + result.stderr


def clean_env() -> dict[str, str]:
    """The environment without anything that could point a venv's Python or a server at the repository."""
    return {k: v for k, v in os.environ.items()
            if not k.startswith(("CHECKPOINTD_", "PYTHON", "VIRTUAL_ENV", "PIP_REQUIRE"))}


class Venv:
    def __init__(self, path: Path) -> None:
        self.path = path
        self.python = path / "bin" / "python"
        run([sys.executable, "-m", "venv", "--without-pip", path])

    def bin(self, name: str) -> Path:
        return self.path / "bin" / name

    def install(self, *requirements: str | Path, find_links: Sequence[Path] = (), constraints: Path | None = None,
                downloads: Sequence[Sequence[str | Path]] | None = None) -> None:
        """pip install REQUIREMENTS from FIND_LINKS and the wheelhouse only. When that fails, each group
        of `pip download` arguments in DOWNLOADS (default: the requirements) fills the wheelhouse first."""
        options = [f"--find-links={path}" for path in (*find_links, WHEELHOUSE)]
        if constraints is not None:
            options.append(f"--constraint={constraints}")
        offline = [*PIP, "--python", self.python, "install", "--no-index", "--no-cache-dir", *options, *requirements]
        if subprocess.run([str(c) for c in offline], capture_output=True, env=clean_env()).returncode == 0:
            return
        WHEELHOUSE.mkdir(parents=True, exist_ok=True)
        for group in downloads if downloads is not None else [requirements]:
            run([*PIP, "download", "--dest", WHEELHOUSE, *options, *group], env=clean_env())
        for own in WHEELHOUSE.iterdir():
            if own.name.startswith(OWN_DISTRIBUTIONS):
                own.unlink(missing_ok=True)
        run(offline, env=clean_env())

    def python_output(self, code: str, *args: str | Path, cwd: Path) -> str:
        """Runs CODE with the venv's Python in isolated mode (no cwd, PYTHONPATH or user site on the path)."""
        return run([self.python, "-I", "-c", code, *args], cwd=cwd, env=clean_env())


@pytest.fixture(scope="module")
def dist(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """Both sdists and wheels, each wheel built from its sdist as `make dist` does (here with the dev
    venv's build tools instead of a throwaway environment each, to keep the test short)."""
    out = tmp_path_factory.mktemp("dist")
    for project in (REPO / "clients" / "python", REPO):
        run([sys.executable, "-m", "build", "--no-isolation", "--outdir", out, project])
    return out


@pytest.fixture
def new_venv(tmp_path: Path):
    return lambda name: Venv(tmp_path / name)
