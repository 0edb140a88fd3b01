"""The ignore rules' fast path (a quick "no pattern matches" test, per-directory chains) decides
exactly like asking every pattern of every .gitignore in turn, deepest file first."""

from __future__ import annotations

import random

from checkpointd.core.capture.gitignore import parse_configured, parse_file, path_text
from checkpointd.core.capture.ignore import NEVER_CAPTURED, IgnoreRules

PATTERNS = [
    "*.log", "!keep.log", "build/", "/dist", "**/tmp", "a/**/b", "!a/x/b", "*.py[co]", "docs/*.md",
    "node_modules/", "!/node_modules/", "x?z", "[ab]*", "!b*", "deep/er/", "\\#hash", "trailing\\ ",
    "foo/**", "!foo/bar", "**/", "*", "!*/", "!*.txt", "sub", "/sub/inner", "a*", "*r", "/a/*", "!/sub/*/x",
]
NAMES = ["a", "b", "x", "sub", "inner", "build", "dist", "tmp", "node_modules", "foo", "bar", "docs",
         "deep", "er", "keep.log", "app.log", "m.pyc", "readme.md", "x1z", "xyz", "#hash", "notes.txt", "trailing "]


def reference(files: dict[str, str], configured: list[str], path: str, is_dir: bool) -> bool:
    """Every pattern asked in turn, file by file, no quick test and no caching."""
    def last_match(patterns, relative: str, dir_here: bool) -> bool | None:
        text = path_text(relative)
        name = text.rpartition("/")[2]
        for pattern in reversed(patterns.patterns):
            if (dir_here or not pattern.dir_only) and pattern.matches(text, name):
                return not pattern.negative
        return None

    parts = path.split("/")
    for depth in range(1, len(parts) + 1):
        entry = "/".join(parts[:depth])
        if parts[depth - 1] in NEVER_CAPTURED:
            return True
        dir_here = is_dir or depth < len(parts)
        verdict = None
        for level in range(depth - 1, -1, -1):
            directory = "/".join(parts[:level])
            if files.get(directory):
                verdict = last_match(parse_file(files[directory].encode()),
                                     entry[len(directory) + 1:] if directory else entry, dir_here)
                if verdict is not None:
                    break
        if verdict is None:
            verdict = last_match(parse_configured(configured), entry, dir_here)
        if verdict:
            return True
    return False


def test_fast_path_agrees_with_asking_each_pattern():
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


def test_each_pattern_alone_agrees_with_asking_it():
    """A file of one kind of pattern takes the quick test's shortest way."""
    paths = ["/".join(p) for p in ((a,) for a in NAMES)] + [f"{a}/{b}" for a in NAMES[:8] for b in NAMES]
    for pattern in PATTERNS:
        for where in ("", "a"):
            files = {where: pattern}
            rules = IgnoreRules([], files.get)
            for path in paths:
                for is_dir in (False, True):
                    assert rules.ignores_path(path, is_dir) == reference(files, [], path, is_dir), (
                        pattern, where, path, is_dir)


def test_forgetting_a_directory_reloads_its_rules_for_entries_below():
    files = {"": "", "a": "*.tmp\n"}
    rules = IgnoreRules([], files.get)
    assert rules.ignores_path("a/b/c.tmp")
    files["a"] = ""
    rules.forget("a")
    assert not rules.ignores_path("a/b/c.tmp")
