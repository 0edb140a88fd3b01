"""The curated critical mutants: plausible bugs in the data-safety and trigger guarantees that the
suite must catch. `make test-mutants` (and CI) runs this; it fails if any mutant survives, if a
patch no longer applies (the code it names has changed: update the patch), or if the tests it
names are not found or fail on the unmutated code.

Each mutant in critical.toml is a search/replace on a snippet that occurs exactly once in one
file, plus the tests that must kill it (pytest arguments, or a Node test file and name pattern).
Mutants run in scratch copies of the tree, one per worker, so the working tree is never modified
(Ctrl-C leaves nothing behind); PYTHONPATH points the tests, and the `checkpointd serve`
subprocesses they start, at the copy. The runner checks that before it trusts any result.

    python -m tests.mutation.critical [--jobs N] [--only ID ...] [--list] [--no-baseline]
"""

from __future__ import annotations

import argparse
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
import tomllib
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
CATALOGUE = Path(__file__).with_name("critical.toml")
#: What a scratch copy holds (the rest of the tree is not needed by the tests).
COPIED = ("service", "clients", "protos", "tests", "pyproject.toml", "README.md")
IGNORED = shutil.ignore_patterns("__pycache__", "*.pyc", "node_modules", "*.egg-info", ".pytest_cache", "demo")
#: Import roots, in the order the editable install maps them.
IMPORT_ROOTS = ("service", "clients/python", "protos")
TIMEOUT_S = 240
#: pytest exit codes: 1 = tests failed (the mutant is killed); anything else is not a verdict.
PYTEST_FAILED = 1


@dataclass(frozen=True)
class Mutant:
    id: str
    guarantee: str
    file: str
    search: str
    replace: str
    pytest: tuple[str, ...] = ()
    node_test: str = ""
    node_pattern: str = ""

    def apply_to(self, text: str) -> str:
        count = text.count(self.search)
        if count != 1:
            raise Drift(f"{self.id}: the snippet occurs {count} times in {self.file} (expected exactly once)")
        return text.replace(self.search, self.replace)


class Drift(Exception):
    """A patch no longer applies to the code it was written for."""


@dataclass
class Outcome:
    mutant: Mutant
    verdict: str  # killed | survived | error
    seconds: float
    detail: str = ""


@dataclass
class Scratch:
    """A copy of the tree that tests run in; PYTHONPATH makes every process import from it."""

    root: Path
    env: dict[str, str] = field(default_factory=dict)

    @classmethod
    def make(cls, parent: Path, name: str) -> Scratch:
        root = parent / name
        root.mkdir()
        for item in COPIED:
            source = REPO / item
            if source.is_dir():
                shutil.copytree(source, root / item, ignore=IGNORED, symlinks=True)
            elif source.exists():
                shutil.copy2(source, root / item)
        (root / ".venv").symlink_to(REPO / ".venv")
        node_modules = REPO / "clients" / "node" / "node_modules"
        if node_modules.exists():
            (root / "clients" / "node" / "node_modules").symlink_to(node_modules)
        env = {k: v for k, v in os.environ.items() if not k.startswith("PYTEST_")}
        env["PYTHONPATH"] = os.pathsep.join(str(root / r) for r in IMPORT_ROOTS)
        env["PYTHONDONTWRITEBYTECODE"] = "1"
        return cls(root, env)

    def check_imports(self) -> None:
        """Fails unless a new process (as the tests' servers are) imports the copy, not the tree."""
        probe = ("import checkpoint, checkpointd, checkpointd_client;"
                 "print(checkpoint.__path__[0]); print(checkpointd.__file__); print(checkpointd_client.__file__)")
        out = subprocess.run([str(REPO / ".venv" / "bin" / "python"), "-c", probe], env=self.env, cwd=self.root,
                             capture_output=True, text=True, check=True).stdout.split()
        outside = [path for path in out if not path.startswith(str(self.root))]
        if outside or len(out) != 3:
            raise SystemExit(f"the scratch copy is not what the tests import: {out}")

    def run(self, mutant: Mutant | None, pytest_args: tuple[str, ...], node: tuple[str, str] | None,
            stop: threading.Event) -> tuple[int, str, str]:
        """Runs the tests; returns (exit code, which runner, output tail)."""
        if pytest_args:
            command = [str(REPO / ".venv" / "bin" / "python"), "-m", "pytest", "-x", "-q", "-p", "no:cacheprovider",
                       *pytest_args]
            code, out = _run(command, self.root, self.env, stop)
            if code != 0 or node is None:
                return code, "pytest", out
        if node is not None:
            test_file, pattern = node
            selection = [f"--test-name-pattern={pattern}"] if pattern else []
            command = ["node", "--test", "--test-concurrency=1", *selection, test_file]
            code, out = _run(command, self.root / "clients" / "node", self.env, stop)
            return code, "node", out
        return 0, "none", ""


def _run(command: list[str], cwd: Path, env: dict[str, str], stop: threading.Event) -> tuple[int, str]:
    if stop.is_set():
        return -1, "interrupted"
    with subprocess.Popen(command, cwd=cwd, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                          start_new_session=True) as proc:
        try:
            out, _ = proc.communicate(timeout=TIMEOUT_S)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            out, _ = proc.communicate()
            return -2, f"timed out after {TIMEOUT_S} s\n{out[-3000:]}"
    return proc.returncode, out[-3000:]


def load(path: Path = CATALOGUE) -> list[Mutant]:
    with open(path, "rb") as f:
        raw = tomllib.load(f)["mutant"]
    mutants = []
    for item in raw:
        node = item.get("node", {})
        mutants.append(Mutant(id=item["id"], guarantee=item["guarantee"], file=item["file"], search=item["search"],
                              replace=item["replace"], pytest=tuple(item.get("pytest", ())),
                              node_test=node.get("test", ""), node_pattern=node.get("pattern", "")))
    ids = [m.id for m in mutants]
    duplicates = {i for i in ids if ids.count(i) > 1}
    if duplicates:
        raise SystemExit(f"duplicate mutant ids in {path}: {sorted(duplicates)}")
    for mutant in mutants:
        if not mutant.pytest and not mutant.node_test:
            raise SystemExit(f"{mutant.id}: names no test that must kill it")
        if mutant.search == mutant.replace:
            raise SystemExit(f"{mutant.id}: the replacement changes nothing")
    return mutants


def check_patches(mutants: list[Mutant]) -> list[str]:
    """Every patch applies to the tree exactly once and leaves valid Python: the drift check."""
    problems = []
    for mutant in mutants:
        path = REPO / mutant.file
        if not path.exists():
            problems.append(f"{mutant.id}: {mutant.file} does not exist")
            continue
        try:
            patched = mutant.apply_to(path.read_text())
        except Drift as drift:
            problems.append(str(drift))
            continue
        if path.suffix == ".py":
            try:
                compile(patched, str(path), "exec")
            except SyntaxError as exc:
                problems.append(f"{mutant.id}: the patched {mutant.file} is not valid Python ({exc})")
    return problems


def run_mutant(scratch: Scratch, mutant: Mutant, stop: threading.Event) -> Outcome:
    started = time.monotonic()
    target = scratch.root / mutant.file
    original = target.read_text()
    target.write_text(mutant.apply_to(original))
    try:
        node = (mutant.node_test, mutant.node_pattern) if mutant.node_test else None
        code, runner, out = scratch.run(mutant, mutant.pytest, node, stop)
    finally:
        target.write_text(original)
    seconds = time.monotonic() - started
    if code == 0:
        return Outcome(mutant, "survived", seconds, out)
    if code == -2 or (runner == "pytest" and code == PYTEST_FAILED) or (runner == "node" and code == 1):
        return Outcome(mutant, "killed", seconds, out.splitlines()[-1] if out else "")
    return Outcome(mutant, "error", seconds, f"{runner} exited with {code}:\n{out}")


def baseline(scratch: Scratch, mutants: list[Mutant], stop: threading.Event) -> None:
    """The tests that must kill the mutants pass on the unmutated copy (else a "kill" means nothing)."""
    plain: dict[str, None] = {}
    with_options: dict[tuple[str, ...], None] = {}
    for mutant in mutants:
        if any(arg.startswith("-") for arg in mutant.pytest):
            with_options[mutant.pytest] = None
        else:
            plain.update(dict.fromkeys(mutant.pytest))
    groups = ([tuple(plain)] if plain else []) + list(with_options)
    node_files = dict.fromkeys(m.node_test for m in mutants if m.node_test)
    started = time.monotonic()
    for group in groups:
        code, _, out = scratch.run(None, group, None, stop)
        if code != 0:
            raise SystemExit(f"baseline: the selected tests fail on the unmutated code (exit {code}):\n{out}")
    for node_file in node_files:
        code, _, out = scratch.run(None, (), (node_file, ""), stop)
        if code != 0:
            raise SystemExit(f"baseline: {node_file} fails on the unmutated code (exit {code}):\n{out}")
    print(f"baseline: the selected tests pass on the unmutated code ({time.monotonic() - started:.0f} s)", flush=True)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--jobs", type=int, default=min(2, os.cpu_count() or 1))
    parser.add_argument("--only", nargs="*", default=[], help="run only these mutant ids")
    parser.add_argument("--list", action="store_true", help="list the mutants and check that they apply")
    parser.add_argument("--no-baseline", action="store_true", help="skip running the tests on unmutated code")
    args = parser.parse_args(argv)

    mutants = load()
    if args.only:
        unknown = set(args.only) - {m.id for m in mutants}
        if unknown:
            raise SystemExit(f"unknown mutant ids: {sorted(unknown)}")
        mutants = [m for m in mutants if m.id in args.only]
    problems = check_patches(mutants)
    if args.list:
        for mutant in mutants:
            print(f"{mutant.id:45} {mutant.file}: {mutant.guarantee}")
    if problems:
        print("patches that no longer apply (update them to the code they mean):", *problems, sep="\n  ")
        return 1
    if args.list:
        return 0

    stop = threading.Event()
    started = time.monotonic()
    parent = Path(tempfile.mkdtemp(prefix="cpd-mutants-"))
    outcomes: list[Outcome] = []
    try:
        scratches = [Scratch.make(parent, f"w{i}") for i in range(max(1, args.jobs))]
        scratches[0].check_imports()
        if not args.no_baseline:
            baseline(scratches[0], mutants, stop)
        free = list(scratches)
        free_lock = threading.Lock()

        def work(mutant: Mutant) -> Outcome:
            with free_lock:
                scratch = free.pop()
            try:
                outcome = run_mutant(scratch, mutant, stop)
            finally:
                with free_lock:
                    free.append(scratch)
            print(f"{outcome.verdict:8} {outcome.seconds:5.1f} s  {mutant.id}", flush=True)
            return outcome

        with ThreadPoolExecutor(len(scratches)) as pool:
            try:
                outcomes = list(pool.map(work, mutants))
            except KeyboardInterrupt:
                stop.set()
                raise
    finally:
        shutil.rmtree(parent, ignore_errors=True)

    survived = [o for o in outcomes if o.verdict == "survived"]
    errors = [o for o in outcomes if o.verdict == "error"]
    killed = len(outcomes) - len(survived) - len(errors)
    print(f"\ncritical mutants: {killed} killed, {len(survived)} survived, {len(errors)} errors "
          f"of {len(outcomes)} in {time.monotonic() - started:.0f} s")
    for outcome in survived:
        print(f"SURVIVED {outcome.mutant.id}: {outcome.mutant.guarantee}\n  tests: "
              f"{' '.join(outcome.mutant.pytest) or outcome.mutant.node_test}")
    for outcome in errors:
        print(f"ERROR {outcome.mutant.id}: {outcome.detail}")
    return 1 if survived or errors else 0


if __name__ == "__main__":
    sys.exit(main())
