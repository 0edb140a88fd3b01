"""Deterministic synthetic workspaces for the benchmark, the edits applied to them, and a
content digest of a whole tree used to check that a rollback really restored what was
captured.

A workspace of N files holds N tracked files of ~4 KiB (mostly code-like text, some random
binary, a few executables) in nested directories of roughly 20-50 entries, depth 3-5, plus
an ``node_modules/`` of N/2 more files that the root ``.gitignore`` ignores. The same seed
gives byte-identical trees, so the git and checkpointd copies start out equal.
"""

from __future__ import annotations

import hashlib
import math
import os
import random
import stat
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from functools import partial
from pathlib import Path

FILES_PER_LEAF_DIR = 35
MIN_FILE_SIZE = 2048
MAX_FILE_SIZE = 6144
BINARY_FRACTION = 0.2
EXECUTABLE_FRACTION = 0.01
IGNORED_DIR = "node_modules"
GITIGNORE_TEXT = f"{IGNORED_DIR}/\n*.log\n"

_WORDS = (
    "alpha", "beta", "gamma", "delta", "core", "util", "api", "model", "view", "store", "cache",
    "index", "tree", "node", "leaf", "parse", "build", "render", "client", "server", "worker", "task",
    "plan", "step", "event", "queue", "stream", "buffer", "config", "option", "value", "key", "name",
    "path", "file", "dir", "scan", "hash", "digest", "blob", "chunk", "pack", "entry", "request",
    "response", "error", "status", "token", "session", "user", "admin", "auth", "policy", "rule",
    "filter", "map",
)
_TEXT_EXTENSIONS = ("py", "ts", "js", "md", "json", "txt", "go", "rs")
_BINARY_EXTENSIONS = ("png", "bin", "wasm", "so", "pyc")
_LINE_TEMPLATES = (
    "def {a}_{b}({c}, {d}):",
    "    return {a}.{b}({c}) + {n}",
    "    if {a} is None or {b} > {n}:",
    "        raise ValueError('{a} {b} {c}')",
    "class {A}{B}({C}):",
    "    \"\"\"{A} {b} for the {c} {d}.\"\"\"",
    "const {a}{B} = require('./{c}/{d}');",
    "export function {a}{B}({c}: number): {C} {{ return new {C}({c} * {n}); }}",
    "// TODO({a}): handle the {b} case when {c} is empty",
    "    {a}_{b} = {{'{c}': {n}, '{d}': [{n}, {n2}]}}",
    "import {a}.{b} as {c}",
    "",
)


def _pool_line(rng: random.Random) -> str:
    words = {letter: rng.choice(_WORDS) for letter in "abcd"}
    words.update({letter.upper(): word.capitalize() for letter, word in words.items()})
    return rng.choice(_LINE_TEMPLATES).format(n=rng.randrange(1000), n2=rng.randrange(1000), **words)


@dataclass
class GeneratedWorkspace:
    """A generated tree: where it is and which tracked files it holds (relative, '/'-separated)."""

    path: Path
    tracked_files: list[str]
    text_files: list[str]
    ignored_file_count: int
    tracked_bytes: int
    ignored_bytes: int
    directories: list[str] = field(default_factory=list)


class _ContentMaker:
    """Makes file bodies from one seeded stream: text from a shared pool of code-like lines."""

    def __init__(self, rng: random.Random) -> None:
        self._rng = rng
        self._lines = [_pool_line(rng) for _ in range(4000)]

    def size(self) -> int:
        return self._rng.randint(MIN_FILE_SIZE, MAX_FILE_SIZE)

    def text(self, header: str, size: int) -> bytes:
        pieces = [f"# {header}"]
        length = len(pieces[0]) + 1
        start = self._rng.randrange(len(self._lines))
        while length < size:
            line = self._lines[(start + len(pieces) * 7) % len(self._lines)]
            if self._rng.random() < 0.3:
                line = self._rng.choice(self._lines)
            pieces.append(line)
            length += len(line) + 1
        return ("\n".join(pieces) + "\n").encode()[:size]

    def binary(self, size: int) -> bytes:
        return self._rng.randbytes(size)


def _leaf_depth(file_count: int) -> int:
    leaves = max(1.0, file_count / FILES_PER_LEAF_DIR)
    return min(5, max(3, math.ceil(math.log(leaves, 10))))


def _plan_directories(rng: random.Random, file_count: int, depth: int, prefix: str) -> list[tuple[str, int]]:
    """Splits ``file_count`` files over a directory tree ``depth`` levels deep: a few files at
    inner levels (READMEs, package markers), the bulk in leaves of ~FILES_PER_LEAF_DIR."""
    placements: list[tuple[str, int]] = []

    def split(directory: str, count: int, level: int) -> None:
        if level >= depth or count <= FILES_PER_LEAF_DIR + 15:
            placements.append((directory, count))
            return
        here = min(count, rng.randint(0, 4))
        if here:
            placements.append((directory, here))
        rest = count - here
        branches = max(2, round((rest / FILES_PER_LEAF_DIR) ** (1 / (depth - level))))
        weights = [rng.uniform(0.6, 1.4) for _ in range(branches)]
        total_weight = sum(weights)
        shares = [int(rest * weight / total_weight) for weight in weights]
        shares[0] += rest - sum(shares)
        for index, share in enumerate(shares):
            if share:
                name = f"{rng.choice(_WORDS)}_{index}"
                split(f"{directory}/{name}" if directory else name, share, level + 1)

    split(prefix, file_count, 0)
    return placements


def _write(path: Path, body: bytes, executable: bool) -> None:
    with open(path, "wb") as handle:
        handle.write(body)
    if executable:
        os.chmod(path, 0o755)


def generate_workspace(path: Path, file_count: int, seed: int) -> GeneratedWorkspace:
    """Writes a fresh workspace of ``file_count`` tracked files (plus ``file_count // 2`` ignored
    ones) into the empty or absent directory ``path``."""
    path.mkdir(parents=True, exist_ok=False)
    rng = random.Random(f"checkpointd-bench:{seed}:{file_count}")
    maker = _ContentMaker(rng)
    tracked: list[str] = []
    text_files: list[str] = []
    directories: list[str] = []
    tracked_bytes = len(GITIGNORE_TEXT)
    ignored_bytes = 0

    (path / ".gitignore").write_text(GITIGNORE_TEXT)
    tracked.append(".gitignore")
    for directory, count in _plan_directories(rng, file_count - 1, _leaf_depth(file_count), ""):
        (path / directory).mkdir(parents=True, exist_ok=True)
        directories.append(directory)
        for index in range(count):
            size = maker.size()
            is_binary = rng.random() < BINARY_FRACTION
            extension = rng.choice(_BINARY_EXTENSIONS if is_binary else _TEXT_EXTENSIONS)
            relative = f"{directory}/{rng.choice(_WORDS)}_{index}.{extension}" if directory else \
                f"{rng.choice(_WORDS)}_{index}.{extension}"
            body = maker.binary(size) if is_binary else maker.text(relative, size)
            _write(path / relative, body, executable=not is_binary and rng.random() < EXECUTABLE_FRACTION)
            tracked.append(relative)
            if not is_binary:
                text_files.append(relative)
            tracked_bytes += len(body)

    ignored_count = file_count // 2
    package_index = 0
    remaining = ignored_count
    while remaining > 0:
        package_files = min(remaining, rng.randint(10, 60))
        package = f"{IGNORED_DIR}/{rng.choice(_WORDS)}-{package_index}"
        for directory, count in _plan_directories(rng, package_files, 2, package):
            (path / directory).mkdir(parents=True, exist_ok=True)
            for index in range(count):
                size = maker.size()
                is_binary = rng.random() < 0.05
                relative = f"{directory}/{rng.choice(_WORDS)}_{index}.{'node' if is_binary else 'js'}"
                body = maker.binary(size) if is_binary else maker.text(relative, size)
                _write(path / relative, body, executable=False)
                ignored_bytes += len(body)
        remaining -= package_files
        package_index += 1

    tracked.sort()
    text_files.sort()
    return GeneratedWorkspace(path, tracked, text_files, ignored_count, tracked_bytes, ignored_bytes, directories)


@dataclass(frozen=True)
class Delta:
    """One applied edit: its kind ("modify", "add" or "delete"), the path it touched, and what
    was there before (content and permission bits; None for an add)."""

    kind: str
    path: str
    before: bytes | None = None
    before_mode: int | None = None


class WorkspaceEditor:
    """Applies seeded one-file edits to a workspace, as an agent's write tool would. Two editors
    built with the same seed over equal workspaces make the same edits."""

    def __init__(self, workspace: GeneratedWorkspace, seed: int) -> None:
        self._workspace = workspace
        self._rng = random.Random(f"checkpointd-bench-edits:{seed}")
        self._text_files = list(workspace.text_files)
        self._counter = 0

    def _next_line(self) -> str:
        self._counter += 1
        return f"edit_{self._counter} = '{self._rng.choice(_WORDS)} {self._rng.randrange(10**9)}'"

    def modify(self) -> Delta:
        """Replaces one line of an existing text file (size stays about the same)."""
        relative = self._rng.choice(self._text_files)
        target = self._workspace.path / relative
        before = target.read_bytes()
        lines = before.decode().split("\n")
        lines[self._rng.randrange(len(lines))] = self._next_line()
        target.write_bytes("\n".join(lines).encode())
        return Delta("modify", relative, before, stat.S_IMODE(target.stat().st_mode))

    def add(self) -> Delta:
        """Creates one new text file in an existing directory."""
        directory = self._rng.choice(self._workspace.directories)
        name = f"added_{self._counter}_{self._rng.randrange(10**6)}.py"
        relative = f"{directory}/{name}" if directory else name
        body = "\n".join(self._next_line() for _ in range(60)) + "\n"
        (self._workspace.path / relative).write_text(body)
        self._text_files.append(relative)
        return Delta("add", relative)

    def delete(self) -> Delta:
        """Removes one existing text file."""
        relative = self._rng.choice(self._text_files)
        target = self._workspace.path / relative
        delta = Delta("delete", relative, target.read_bytes(), stat.S_IMODE(target.stat().st_mode))
        target.unlink()
        self._text_files.remove(relative)
        return delta

    def apply(self, kind: str) -> Delta:
        actions = {"modify": self.modify, "add": self.add, "delete": self.delete}
        if kind not in actions:
            raise ValueError(f"unknown edit kind {kind!r}; expected one of {sorted(actions)}")
        return actions[kind]()

    def rolled_back(self, delta: Delta) -> None:
        """Brings the editor's file list back in line after ``delta`` was undone by a rollback."""
        if delta.kind == "add":
            self._text_files.remove(delta.path)
        elif delta.kind == "delete":
            self._text_files.append(delta.path)


def sha256_hex(body: bytes) -> str:
    return hashlib.sha256(body).hexdigest()


def _file_digests(digest: Callable[[bytes], str], paths: list[str]) -> list[str]:
    digests = []
    for path in paths:
        with open(path, "rb") as handle:
            digests.append(digest(handle.read()))
    return digests


def tree_entries(root: Path, digest: Callable[[bytes], str] = sha256_hex) -> dict[str, str]:
    """Every entry under ``root`` (ignored ones included) as path -> "dir", "link <target>",
    "file <permission bits, octal> <digest of the content>" or "special <type>"; equal maps
    mean equal trees. Files are hashed in batches on two threads (reads and hashing release
    the GIL)."""
    entries: dict[str, str] = {}
    files: list[tuple[str, str, int]] = []
    pending = [("", str(root))]
    while pending:
        relative_dir, absolute_dir = pending.pop()
        with os.scandir(absolute_dir) as scan:
            for entry in scan:
                relative = f"{relative_dir}/{entry.name}" if relative_dir else entry.name
                info = entry.stat(follow_symlinks=False)
                if stat.S_ISDIR(info.st_mode):
                    entries[relative] = "dir"
                    pending.append((relative, entry.path))
                elif stat.S_ISLNK(info.st_mode):
                    entries[relative] = f"link {os.readlink(entry.path)}"
                elif stat.S_ISREG(info.st_mode):
                    files.append((relative, entry.path, stat.S_IMODE(info.st_mode)))
                else:
                    entries[relative] = f"special {stat.S_IFMT(info.st_mode)}"
    batches = [[absolute for _, absolute, _ in files[start:start + 2048]]
               for start in range(0, len(files), 2048)]
    with ThreadPoolExecutor(max_workers=2) as pool:
        digests = [hexdigest for batch in pool.map(partial(_file_digests, digest), batches) for hexdigest in batch]
    for (relative, _, mode), hexdigest in zip(files, digests, strict=True):
        entries[relative] = f"file {mode:o} {hexdigest}"
    return entries


def describe_difference(expected: dict[str, str], actual: dict[str, str], limit: int = 10) -> str:
    """A short human account of how two tree_entries maps differ."""
    missing = sorted(set(expected) - set(actual))
    extra = sorted(set(actual) - set(expected))
    changed = sorted(path for path in set(expected) & set(actual) if expected[path] != actual[path])
    parts = []
    for label, paths in (("missing", missing), ("unexpected", extra), ("changed", changed)):
        if paths:
            parts.append(f"{len(paths)} {label}: {', '.join(paths[:limit])}")
    return "; ".join(parts) or "identical"
