"""The ignore rules' fast path (a regex pre-check, per-directory chains) decides exactly
like asking every .gitignore's spec in turn."""

from __future__ import annotations

import random

import pathspec

from checkpointd.core.ignore import NEVER_CAPTURED, IgnoreRules

PATTERNS = [
    "*.log", "!keep.log", "build/", "/dist", "**/tmp", "a/**/b", "!a/x/b", "*.py[co]", "docs/*.md",
    "node_modules/", "!/node_modules/", "x?z", "[ab]*", "!b*", "deep/er/", "\\#hash", "trailing\\ ",
    "foo/**", "!foo/bar", "**/", "*", "!*/", "!*.txt", "sub", "/sub/inner",
]
NAMES = ["a", "b", "x", "sub", "inner", "build", "dist", "tmp", "node_modules", "foo", "bar", "docs",
         "deep", "er", "keep.log", "app.log", "m.pyc", "readme.md", "x1z", "xyz", "#hash", "notes.txt"]


def reference(files: dict[str, str], configured: list[str], path: str, is_dir: bool) -> bool:
    """The rules as git states them, asked pattern file by pattern file (no caching)."""
    def spec(lines):
        lines = [line for line in lines if line.strip() and not line.lstrip().startswith("#")]
        return pathspec.GitIgnoreSpec.from_lines(lines) if lines else None

    parts = path.split("/")
    for depth in range(1, len(parts) + 1):
        entry = "/".join(parts[:depth])
        if parts[depth - 1] in NEVER_CAPTURED:
            return True
        candidate = entry + "/" if (is_dir or depth < len(parts)) else entry
        verdict = None
        for level in range(depth - 1, -1, -1):
            directory = "/".join(parts[:level])
            s = spec((files.get(directory) or "").splitlines())
            if s is None:
                continue
            verdict = s.check_file(candidate[len(directory) + 1:] if directory else candidate).include
            if verdict is not None:
                break
        if verdict is None:
            c = spec(configured)
            verdict = c.check_file(candidate).include if c is not None else None
        if verdict:
            return True
    return False


def test_fast_path_agrees_with_asking_each_spec():
    rng = random.Random(4)
    for _ in range(60):
        dirs = ["", "a", "sub", "a/b", "foo", "deep"]
        files = {d: "\n".join(rng.sample(PATTERNS, rng.randint(0, 5))) for d in dirs if rng.random() < 0.6}
        configured = rng.sample(PATTERNS, rng.randint(0, 3))
        rules = IgnoreRules(configured, files.get)
        for _ in range(80):
            path = "/".join(rng.choice(NAMES) for _ in range(rng.randint(1, 4)))
            is_dir = rng.random() < 0.4
            assert rules.ignores_path(path, is_dir) == reference(files, configured, path, is_dir), (
                files, configured, path, is_dir)


def test_forgetting_a_directory_reloads_its_rules_for_entries_below():
    files = {"": "", "a": "*.tmp\n"}
    rules = IgnoreRules([], files.get)
    assert rules.ignores_path("a/b/c.tmp")
    files["a"] = ""
    rules.forget("a")
    assert not rules.ignores_path("a/b/c.tmp")
