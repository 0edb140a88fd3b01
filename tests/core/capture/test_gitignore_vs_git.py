"""The ignore matcher against git itself: generated .gitignore files (nested, with negation,
``**``, classes, escapes, trailing spaces, invalid lines) and configured patterns (git's
excludes file), generated files and directories on disk, and for every path the verdict of
``git check-ignore --no-index`` compared with ``IgnoreRules.ignores_path``."""

from __future__ import annotations

import os
import shutil
import subprocess
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st

from checkpointd.core.capture.ignore import IgnoreRules
from tests.helpers import skip_unless_ci

GIT = shutil.which("git")
if GIT is None:
    skip_unless_ci("git is not installed: nothing to compare the matcher with", allow_module_level=True)

#: Characters of generated names: glob specials, spaces, a tab, non-ASCII (UTF-8 and a lone byte).
NAME_CHARS = ["a", "b", "c", "ab", ".", "-", " ", "*", "?", "[", "]", "!", "\\", "#", "\t", "\x0b", "é",
              "\udce9", "A", "1", "x"]
#: Pieces of generated pattern lines.
PATTERN_PIECES = ["a", "b", "c", "ab", ".", "x", "A", "1", "é", "\udce9", " ", "\t", "-", "#", "!",
                  "*", "**", "?", "/", "/**/", "**/", "/**", "\\", "\\ ", "\\*", "\\/", "\\[", "[", "]",
                  "[ab]", "[!a]", "[^b]", "[a-c]", "[]a]", "[!]]", "[a-]", "[[:alpha:]]", "[[:space:]]",
                  "[[:punct:]]", "[[:digit:][:upper:]]", "[[:alpha:]", "[[:nope:]]", "[\\]]", "[/]", "[é]"]


def _name() -> st.SearchStrategy[str]:
    return (st.lists(st.sampled_from(NAME_CHARS), min_size=1, max_size=4).map("".join)
            .filter(lambda n: n not in (".", "..", ".git", ".gitignore") and not n.startswith(":")))


def _pattern_line() -> st.SearchStrategy[str]:
    body = st.lists(st.sampled_from(PATTERN_PIECES), min_size=0, max_size=6).map("".join)
    return st.tuples(st.sampled_from(["", "", "", "!", "/", "!/", "#"]), body,
                     st.sampled_from(["", "", "", "/", " ", "  ", "\\ ", "\r", "/ "])).map("".join)


#: Classes git knows, plain and negated, to stand for one character of a name.
CLASSES = [f"[{neg}[:{name}:]]" for name in ("alnum", "alpha", "blank", "cntrl", "digit", "graph", "lower", "print",
                                            "punct", "space", "upper", "xdigit") for neg in ("", "!")]


@st.composite
def _derived_line(draw, paths: list[str]) -> str:
    """A pattern made from a path that exists, so that it often matches: some of its segments
    (anchored or not), characters turned into wildcards or classes, ``**`` between segments."""
    parts = draw(st.sampled_from(paths)).split("/")
    parts = parts[draw(st.integers(0, len(parts) - 1)):]
    out = []
    for part in parts:
        choice = draw(st.integers(0, 9))
        if choice == 0:
            out.append(draw(st.sampled_from(["*", "**", "?*", "*?"])))
        elif choice == 1 and len(part) > 1:
            cut = draw(st.integers(1, len(part) - 1))
            out.append(_escaped(part[:cut], draw(st.booleans())) + draw(st.sampled_from(["*", "?*", "**", "[!x]*"])))
        elif choice == 2:
            stand_in = draw(st.sampled_from(["*", "?", "**", "[a-c]", *CLASSES]))
            cut = draw(st.integers(0, len(part) - 1))
            out.append(_escaped(part[:cut], True) + stand_in + _escaped(part[cut + 1:], True))
        else:
            out.append(_escaped(part, draw(st.booleans())))
        out.append(draw(st.sampled_from(["/"] * 6 + ["/**/", "/**\\/", "**/", "/**"])))
    line = "".join(out[:-1])
    return (draw(st.sampled_from(["", "", "!", "/", "!/"])) + line
            + draw(st.sampled_from(["", "", "/", " ", "/**", "\\ "])))


def _escaped(text: str, escape: bool) -> str:
    return "".join("\\" + c if escape and c in "*?[\\ #!" else c for c in text)


def _pattern_file(paths: list[str]) -> st.SearchStrategy[bytes]:
    line = st.one_of(_pattern_line(), _derived_line(paths)) if paths else _pattern_line()
    return st.lists(line, max_size=6).map(lambda lines: "\n".join(lines).encode("utf-8", "surrogateescape"))


@st.composite
def _workspaces(draw) -> tuple[dict[str, bool], dict[str, bytes], list[str]]:
    """Paths (path -> is a directory), .gitignore files (directory -> content), configured patterns."""
    entries: dict[str, bool] = {}
    for parts in draw(st.lists(st.lists(_name(), min_size=1, max_size=4), min_size=1, max_size=10)):
        is_dir = draw(st.booleans())
        prefixes = ["/".join(parts[:i]) for i in range(1, len(parts))]
        path = "/".join(parts)
        if any(entries.get(p) is False for p in prefixes) or path in entries:
            continue
        if any(other.startswith(path + "/") for other in entries):
            is_dir = True
        for p in prefixes:
            entries[p] = True
        entries[path] = is_dir
    directories = [""] + sorted(p for p, is_dir in entries.items() if is_dir)
    with_gitignore = draw(st.lists(st.sampled_from(directories), min_size=1, max_size=3, unique=True))
    gitignores = {}
    for directory in with_gitignore:
        below = [p[len(directory) + 1:] if directory else p for p in entries if p.startswith(directory + "/")
                 or not directory]
        gitignores[directory] = draw(_pattern_file(below))
    configured = draw(st.lists(st.one_of(_pattern_line(), _derived_line(sorted(entries))), max_size=3))
    return entries, gitignores, configured


class GitRepository:
    """One repository reused by every example: its work tree is emptied between them."""

    def __init__(self, base: Path) -> None:
        self.root = base / "repo"
        self.root.mkdir()
        self.excludes = base / "excludes"
        home = base / "home"
        home.mkdir()
        self.env = {"PATH": os.environ.get("PATH", "/usr/bin:/bin"), "HOME": str(home),
                    "XDG_CONFIG_HOME": str(home), "GIT_CONFIG_NOSYSTEM": "1", "GIT_CONFIG_GLOBAL": os.devnull,
                    "LC_ALL": "C"}
        subprocess.run([GIT, "init", "-q", str(self.root)], check=True, env=self.env, timeout=60)

    def reset(self) -> None:
        for child in self.root.iterdir():
            if child.name != ".git":
                shutil.rmtree(child) if child.is_dir() and not child.is_symlink() else child.unlink()

    def check_ignore(self, paths: list[str], configured: list[str]) -> dict[str, bool]:
        self.excludes.write_bytes("\n".join(configured).encode("utf-8", "surrogateescape"))
        stdin = b"".join(os.fsencode(p) + b"\0" for p in paths)
        done = subprocess.run(
            [GIT, "-c", f"core.excludesFile={self.excludes}", "check-ignore", "--no-index",
             "-v", "-n", "-z", "--stdin"], cwd=self.root, input=stdin, capture_output=True, env=self.env, timeout=60)
        assert done.returncode in (0, 1), done.stderr.decode(errors="replace")
        fields = done.stdout.split(b"\0")[:-1]
        assert len(fields) == 4 * len(paths), (fields, paths)
        verdicts = {}
        for i in range(0, len(fields), 4):
            _source, _line, pattern, path = fields[i:i + 4]
            verdicts[os.fsdecode(path)] = bool(pattern) and not pattern.startswith(b"!")
        return verdicts


@pytest.fixture(scope="module")
def repository() -> Iterator[GitRepository]:
    # Thousands of files are made and removed: in memory where there is a tmpfs.
    shm = Path("/dev/shm")
    base = Path(tempfile.mkdtemp(prefix="gitignore-", dir=shm if shm.is_dir() and os.access(shm, os.W_OK) else None))
    try:
        yield GitRepository(base)
    finally:
        shutil.rmtree(base, ignore_errors=True)


def _compare(repository: GitRepository, workspace) -> None:
    entries, gitignores, configured = workspace
    repository.reset()
    root = repository.root
    for path, is_dir in sorted(entries.items()):
        target = root / path
        if is_dir:
            target.mkdir(exist_ok=True)
        else:
            target.write_bytes(b"x")
    for directory, content in gitignores.items():
        (root / directory / ".gitignore").write_bytes(content)
    queried = sorted(entries) + [f"{d}/.gitignore" if d else ".gitignore" for d in gitignores]
    expected = repository.check_ignore(queried, configured)
    rules = IgnoreRules(configured, lambda directory: gitignores.get(directory))
    for path in queried:
        is_dir = entries.get(path, False)
        assert rules.ignores_path(path, is_dir) == expected[path], (
            f"path {path!r} (dir={is_dir}): git says ignored={expected[path]}; "
            f".gitignore files {gitignores!r}; configured {configured!r}")


def _settings(examples: int):
    return settings(max_examples=examples, deadline=None, derandomize=False,
                    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow,
                                           HealthCheck.data_too_large])


@_settings(150)
@given(workspace=_workspaces())
@example(workspace=({"foo": True, "foo/bar": False, "foobar": False, "fooX": True, "fooX/Y": True,
                     "fooX/Y/bar": False}, {"": b"foo**/bar\n"}, []))
@example(workspace=({"a": True, "a/b": False, "a/x": True, "a/x/y": True, "a/x/y/b": False, "a/x/b": False},
                    {"": b"a/**\\/b\n"}, []))
@example(workspace=({"n\x0b": False, "n\t": False, "n\xe9": False, "n\udce9": False, "n?": False},
                    {"": b"n[[:space:]]\nn?\n!n[[:punct:]]\n"}, []))
@example(workspace=({"vendor": True, "vendor/keep.txt": False}, {"": b"vendor/\n!vendor/keep.txt\n"}, []))
@example(workspace=({"a": True, "a/b": True, "a/b/c": False, "a/x": False},
                    {"": b"a/**/c\n!a/**\n", "a": b"*\n!b\n"}, ["x", "!"]))
def test_matches_git_check_ignore(repository, workspace):
    _compare(repository, workspace)


@pytest.mark.slow
@pytest.mark.timeout(3600)
@_settings(3000)
@given(workspace=_workspaces())
def test_matches_git_check_ignore_long(repository, workspace):
    _compare(repository, workspace)
