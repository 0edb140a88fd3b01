"""The gitignore matcher's bounds: pathological patterns take bounded work, limits are
reported and never crash, no content raises, and configured patterns that can never match
are refused with the reason."""

from __future__ import annotations

import logging
import subprocess
import sys
import textwrap

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from checkpointd.core.capture.gitignore import MAX_PATTERN_BYTES, MAX_PATTERNS_PER_FILE, parse_file, refusal
from checkpointd.core.capture.ignore import IgnoreRules

#: Lines that make a backtracking matcher take exponential time, with paths that trigger it.
PATHOLOGICAL = [
    ("*a*a*a*a*a*a*a*a*a*a*a*a*a*a*b", "a" * 250),
    ("**/*a*a*a*a*a*a*a*a*a*a*a*a*c/**", "/".join(["a" * 40] * 60)),
    ("a/**/a/**/a/**/a/**/a/**/a/**/a/**/b", "/".join(["a"] * 1000)),
    ("*?*?*?*?*?*?*?*?*?*?*?*?*?*?x", "y" * 250),
    ("[a-z]*[a-z]*[a-z]*[a-z]*[a-z]*[a-z]*[a-z]*[a-z]*[a-z]*[a-z]*!", "q" * 250),
    ("**a**a**a**a**a**a**a**a**a**a**a**b", "/".join(["a" * 50] * 40)),
]


def test_pathological_patterns_take_bounded_work():
    """In a process of its own, so that a matcher that backtracks fails by the timeout instead of
    hanging the test run (a regex match holds the interpreter lock; no signal stops it)."""
    code = textwrap.dedent("""
        import sys
        from checkpointd.core.capture.ignore import IgnoreRules
        cases = eval(sys.stdin.read())
        for line, path in cases:
            for rules in (IgnoreRules([line], lambda d: None),
                          IgnoreRules([], lambda d: (line + "\\n").encode() if d == "" else None)):
                parts = path.split("/")
                for depth in range(1, len(parts) + 1):  # as a capture's walk asks
                    rules.ignores_entry("/".join(parts[:depth]), is_dir=depth < len(parts))
        print("done")
    """)
    done = subprocess.run([sys.executable, "-c", code], input=repr(PATHOLOGICAL), capture_output=True, text=True,
                          timeout=120)
    assert done.returncode == 0 and done.stdout.strip() == "done", done.stderr


def test_lines_past_the_pattern_limit_are_reported_and_ignored(caplog):
    lines = [f"f{i}" for i in range(MAX_PATTERNS_PER_FILE)] + ["late"]
    rules = IgnoreRules([], lambda d: "\n".join(lines).encode() if d == "" else None)
    with caplog.at_level(logging.WARNING, logger="checkpointd.ignore"):
        assert rules.ignores_path("f0") and rules.ignores_path(f"f{MAX_PATTERNS_PER_FILE - 1}")
        assert not rules.ignores_path("late")
    assert any(".gitignore, line 10001" in r.getMessage() and "ignored" in r.getMessage() for r in caplog.records)


def test_a_pattern_past_the_length_limit_never_matches_and_is_reported(caplog):
    long_name = "n" * (MAX_PATTERN_BYTES + 1)
    rules = IgnoreRules([], lambda d: f"short\n{long_name}\n".encode() if d == "sub" else None)
    with caplog.at_level(logging.WARNING, logger="checkpointd.ignore"):
        assert rules.ignores_path("sub/short")
        assert not rules.ignores_path(f"sub/{long_name}")
    assert any("sub/.gitignore, line 2" in r.getMessage() for r in caplog.records)


@settings(max_examples=200, deadline=None)
@given(content=st.binary(max_size=300), path=st.lists(st.text(min_size=1, max_size=8).filter(
    lambda s: "/" not in s and "\0" not in s), min_size=1, max_size=4).map("/".join),
    configured=st.lists(st.text(max_size=20), max_size=3), is_dir=st.booleans())
def test_no_gitignore_content_raises(content, path, configured, is_dir):
    rules = IgnoreRules(configured, lambda d: content)
    assert rules.ignores_path(path, is_dir) in (True, False)


@pytest.mark.parametrize("line", ["!", "/", "!/", "x\\", "[abc", "a[[:nope:]]", "[[:alpha:]", "[/]"])
def test_patterns_git_never_matches_never_match(line):
    patterns = parse_file(line.encode() + b"\n")
    assert all(p.never for p in patterns.patterns)
    assert patterns.verdict("a", 0, "a", True) is None


@pytest.mark.parametrize("pattern, why", [
    ("!", "negates nothing"),
    ("x\\", "backslash"),
    ("[abc", "unclosed '['"),
    ("a[[:nope:]]", "[:nope:]"),
    ("#notes", "comment"),
    ("", "empty"),
    ("   ", "empty"),
    ("a\nb", "line break"),
    ("/", "only '/'"),
    ("n" * (MAX_PATTERN_BYTES + 1), f"longer than {MAX_PATTERN_BYTES} bytes"),
])
def test_configured_patterns_that_cannot_match_are_refused_with_the_reason(pattern, why):
    reason = refusal(pattern)
    assert reason is not None and why in reason


@pytest.mark.parametrize("pattern", ["*.log", "!keep.log", "\\#notes", "*a*a*a*a*a*a*a*a*b", "a/**/b", "build/",
                                     "[[:alpha:]]*", "trailing\\ ", " leading"])
def test_valid_configured_patterns_are_accepted(pattern):
    assert refusal(pattern) is None
