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


class IgnoreRules:
    def __init__(self, configured_patterns: Iterable[str], loader: GitignoreLoader,
                 excluded_paths: Iterable[str] = ()) -> None:
        self._configured = _spec(configured_patterns)
        self._loader = loader
        self._per_dir: dict[str, pathspec.GitIgnoreSpec | None] = {}
        self._excluded = frozenset(excluded_paths)

    def _dir_spec(self, directory: str) -> pathspec.GitIgnoreSpec | None:
        if directory not in self._per_dir:
            text = self._loader(directory)
            self._per_dir[directory] = _spec(text.splitlines()) if text else None
        return self._per_dir[directory]

    def forget(self, directory: str) -> None:
        """Drop the cached rules of one directory (its .gitignore changed)."""
        self._per_dir.pop(directory, None)

    def ignores_entry(self, path: str, is_dir: bool) -> bool:
        """Whether ``path`` itself is ignored, assuming its parent directory is not."""
        name = path.rsplit("/", 1)[-1]
        if name in NEVER_CAPTURED or path in self._excluded:
            return True
        candidate = path + "/" if is_dir else path
        parts = path.split("/")
        for depth in range(len(parts) - 1, -1, -1):
            directory = "/".join(parts[:depth])
            spec = self._dir_spec(directory)
            if spec is None:
                continue
            relative = candidate[len(directory) + 1:] if directory else candidate
            verdict = spec.check_file(relative).include
            if verdict is not None:
                return verdict
        if self._configured is not None:
            verdict = self._configured.check_file(candidate).include
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
