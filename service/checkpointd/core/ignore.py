"""Which workspace paths a snapshot captures: .gitignore files at every level plus
configured patterns, with git's precedence (a deeper .gitignore wins over a shallower
one; configured patterns, like git's excludes file, rank lowest). ``.git`` is never
captured.

Rules are built from a loader that returns the text of ``<dir>/.gitignore``, so the same
code answers for the live disk and for a stored checkpoint's tree.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable

import pathspec

NEVER_CAPTURED = frozenset({".git"})
GITIGNORE = ".gitignore"

GitignoreLoader = Callable[[str], str | None]


def _spec(lines: Iterable[str]) -> pathspec.GitIgnoreSpec | None:
    lines = [line for line in lines if line.strip() and not line.lstrip().startswith("#")]
    return pathspec.GitIgnoreSpec.from_lines(lines) if lines else None


class _Matcher:
    """One spec with a fast "no pattern matches" test: the regexes ``check_file`` would
    try, searched directly (paths given here are already normalized: relative, '/'-separated),
    so that only a path some pattern matches pays for the full check."""

    __slots__ = ("spec", "searches", "strip")

    def __init__(self, spec: pathspec.GitIgnoreSpec, strip: int) -> None:
        self.spec = spec
        #: Characters of a workspace path before the part this spec sees.
        self.strip = strip
        regexes = []
        for pattern in spec.patterns:
            if getattr(pattern, "include", None) is None:
                continue
            regex = getattr(pattern, "regex", None)
            if regex is None or not hasattr(regex, "search"):
                regexes = None
                break
            regexes.append(regex.search)
        #: None: no fast test is possible, always ask the spec.
        self.searches = tuple(regexes) if regexes is not None else None

    def verdict(self, candidate: str) -> bool | None:
        relative = candidate[self.strip:]
        searches = self.searches
        if searches is not None:
            for search in searches:
                if search(relative) is not None:
                    break
            else:
                return None
        return self.spec.check_file(relative).include


class IgnoreRules:
    def __init__(self, configured_patterns: Iterable[str], loader: GitignoreLoader,
                 excluded_paths: Iterable[str] = ()) -> None:
        self._configured = _spec(configured_patterns)
        self._loader = loader
        self._per_dir: dict[str, pathspec.GitIgnoreSpec | None] = {}
        self._excluded = frozenset(excluded_paths)
        #: directory -> the matchers that decide for its entries, deepest .gitignore first
        self._chains: dict[str, tuple[_Matcher, ...]] = {}

    def _dir_spec(self, directory: str) -> pathspec.GitIgnoreSpec | None:
        if directory not in self._per_dir:
            text = self._loader(directory)
            self._per_dir[directory] = _spec(text.splitlines()) if text else None
        return self._per_dir[directory]

    def _chain(self, directory: str) -> tuple[_Matcher, ...]:
        chain = self._chains.get(directory)
        if chain is None:
            own = self._dir_spec(directory)
            if directory:
                mine = (_Matcher(own, len(directory) + 1),) if own is not None else ()
                chain = mine + self._chain(directory.rpartition("/")[0])
            else:
                chain = (_Matcher(own, 0),) if own is not None else ()
                if self._configured is not None:
                    chain += (_Matcher(self._configured, 0),)
            self._chains[directory] = chain
        return chain

    def note_absent(self, directory: str) -> None:
        """``directory`` has no .gitignore (a scan's listing of it says so): no need to ask
        the loader. Rules already loaded for it are kept."""
        self._per_dir.setdefault(directory, None)

    def forget(self, directory: str) -> None:
        """Drop the cached rules of one directory (its .gitignore changed)."""
        self._per_dir.pop(directory, None)
        self._chains.clear()

    def ignores_entry(self, path: str, is_dir: bool) -> bool:
        """Whether ``path`` itself is ignored, assuming its parent directory is not."""
        directory, _, name = path.rpartition("/")
        if name in NEVER_CAPTURED or path in self._excluded:
            return True
        chain = self._chains.get(directory)
        if chain is None:
            chain = self._chain(directory)
        if not chain:
            return False
        candidate = path + "/" if is_dir else path
        for matcher in chain:
            verdict = matcher.verdict(candidate)
            if verdict is not None:
                return verdict
        return False

    def ignores_path(self, path: str, is_dir: bool = False) -> bool:
        """Whether ``path`` would be left out of a capture, counting ignored ancestors."""
        parts = path.split("/")
        for depth in range(1, len(parts)):
            if self.ignores_entry("/".join(parts[:depth]), is_dir=True):
                return True
        return self.ignores_entry(path, is_dir)
