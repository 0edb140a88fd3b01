"""The ignore rules' fast path (a quick "no pattern matches" test, per-directory chains) decides
exactly like asking every pattern of every .gitignore in turn, deepest file first."""

from __future__ import annotations

import random

import pytest

from checkpointd.core.capture.gitignore import (
    MAX_WILDCARDS_PER_FILE,
    MatchBudget,
    Pattern,
    parse_configured,
    parse_file,
    path_text,
)
from checkpointd.core.capture.ignore import NEVER_CAPTURED, IgnoreRules
from checkpointd.core.kernel.errors import CheckpointdError, Reason

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


def _agrees_on_random_paths(rng: random.Random, files: dict[str, str], configured: list[str], paths: int,
                            depth: int, dirs: float) -> None:
    rules = IgnoreRules(configured, files.get)
    for _ in range(paths):
        path = "/".join(rng.choice(NAMES) for _ in range(rng.randint(1, depth)))
        is_dir = rng.random() < dirs
        assert rules.ignores_path(path, is_dir) == reference(files, configured, path, is_dir), (
            files, configured, path, is_dir)


def test_fast_path_agrees_with_asking_each_pattern():
    rng = random.Random(4)
    for _ in range(60):
        dirs = ["", "a", "sub", "a/b", "foo", "deep"]
        files = {d: "\n".join(rng.sample(PATTERNS, rng.randint(0, 5))) for d in dirs if rng.random() < 0.6}
        _agrees_on_random_paths(rng, files, rng.sample(PATTERNS, rng.randint(0, 3)), 80, 4, 0.4)


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


#: Literal names and paths, repeated, negated and directory-only, around wildcards: the lookups
#: that find the last literal match must agree with trying each pattern in turn.
LITERALS = ["sub", "!sub", "sub/", "!sub/", "/sub/inner", "!/sub/inner", "x", "!x", "x/", "inner", "!inner",
            "a/b", "!a/b", "a/b/", "*", "!*/", "x*", "!*x"]


def test_literal_lookups_agree_with_asking_each_pattern():
    rng = random.Random(11)
    for _ in range(120):
        dirs = ["", "a", "sub"]
        files = {d: "\n".join(rng.choices(LITERALS + PATTERNS, k=rng.randint(0, 14))) for d in dirs
                 if rng.random() < 0.7}
        _agrees_on_random_paths(rng, files, rng.choices(LITERALS, k=rng.randint(0, 4)), 60, 3, 0.5)


def test_thousands_of_plain_names_cost_a_lookup_per_path(monkeypatch):
    """A file of 9,999 plain names after a wildcard that matches every entry: the verdict is the
    wildcard's, found without trying the names one by one (1.5 ms an entry before): one pattern
    is tried per entry."""
    tried: list[str] = []
    real_matches = Pattern.matches
    monkeypatch.setattr(Pattern, "matches",
                        lambda self, path, name: tried.append(name) or real_matches(self, path, name))
    text = "x*\n" + "".join(f"name{i}\n" for i in range(9_999))
    rules = IgnoreRules([], {"": text}.get)
    for i in range(2_000):
        assert rules.ignores_entry(f"x{i:05d}", False)
    assert len(tried) == 2_000
    assert not rules.ignores_entry("name10000", False) and rules.ignores_entry("name5", False)


def test_matching_past_its_budget_stops_the_capture_naming_the_file(monkeypatch):
    """Patterns that take long to match (here thousands of prefixes tried one by one per entry)
    stop after their budget of CPU with FAILED_PRECONDITION / IGNORE_RULES_TOO_COSTLY naming the
    file, instead of holding a core for as long as the workspace is large."""
    monkeypatch.setattr(MatchBudget, "BASE_SECONDS", 0.05)
    monkeypatch.setattr(MatchBudget, "PER_ENTRY_SECONDS", 1e-6)
    text = "x*\n" + "".join(f"y{i}*\n" for i in range(4_000))
    rules = IgnoreRules([], {"": "", "deep": text}.get)
    with pytest.raises(CheckpointdError) as stopped:
        for i in range(2_000):  # about a millisecond each: the budget runs out after some fifty
            rules.ignores_entry(f"deep/x{i:05d}", False)
    assert stopped.value.reason is Reason.IGNORE_RULES_TOO_COSTLY
    assert "deep/.gitignore" in str(stopped.value)


def test_a_file_of_more_wildcards_than_the_limit_applies_the_lines_before_it():
    """Each wildcard costs its regex time to build: a file past MAX_WILDCARDS_PER_FILE (a 1 MiB
    file of stars took half a minute to read) has its later lines ignored, and says so."""
    star_line = "*a" * 99 + "*b"  # 100 wildcards
    lines = [star_line + str(i) for i in range(MAX_WILDCARDS_PER_FILE // 100 + 5)]
    parsed = parse_file("\n".join(["kept.txt", *lines, "late.txt"]).encode())
    assert len(parsed.patterns) == 1 + MAX_WILDCARDS_PER_FILE // 100
    (problem,) = parsed.problems
    assert "wildcards" in problem.why
    rules = IgnoreRules([], {"": "\n".join(["kept.txt", *lines, "late.txt"])}.get)
    assert rules.ignores_entry("kept.txt", False) and not rules.ignores_entry("late.txt", False)
