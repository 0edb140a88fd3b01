"""Ignore rules follow git's precedence."""

from __future__ import annotations

import pytest

from checkpointd.core.capture.ignore import IgnoreRules


def rules(files: dict[str, str], configured=(), excluded=()) -> IgnoreRules:
    return IgnoreRules(configured, lambda directory: files.get(directory), excluded)


@pytest.mark.parametrize("path, is_dir, ignored", [
    ("app.log", False, True),
    ("src/app.log", False, True),
    ("src/keep.log", False, False),
    ("build", True, True),
    ("build", False, False),
    ("src/build", True, True),
    ("src/generated/x.py", False, True),
    (".git", True, True),
    ("sub/.git", False, True),
    ("notes.txt", False, False),
])
def test_nested_gitignore_precedence(path, is_dir, ignored):
    r = rules({"": "*.log\nbuild/\n", "src": "!keep.log\ngenerated/\n"})
    assert r.ignores_path(path, is_dir) is ignored


def test_a_file_inside_an_ignored_directory_cannot_be_re_included():
    r = rules({"": "vendor/\n!vendor/keep.txt\n"})
    assert r.ignores_path("vendor/keep.txt")


def test_configured_patterns_rank_below_gitignore_files():
    r = rules({"": "!important.pem\n"}, configured=["*.pem"])
    assert r.ignores_path("key.pem")
    assert not r.ignores_path("important.pem")


def test_excluded_paths_are_never_captured():
    r = rules({}, excluded=["var/checkpointd-data"])
    assert r.ignores_path("var/checkpointd-data", True)
    assert r.ignores_path("var/checkpointd-data/store/x")
    assert not r.ignores_path("var/other")


def test_comments_and_blank_lines_are_not_patterns():
    r = rules({"": "# *.py\n\n"})
    assert not r.ignores_path("main.py")
