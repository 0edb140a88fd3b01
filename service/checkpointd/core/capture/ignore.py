"""Which workspace paths a snapshot captures: .gitignore files at every level plus
configured patterns, with git's precedence (a deeper .gitignore wins over a shallower
one; configured patterns, like git's excludes file, rank lowest). ``.git`` is never
captured.

Rules are built from a loader that returns the content of ``<dir>/.gitignore``, so the same
code answers for the live disk and for a stored checkpoint's tree. Patterns are matched by
``gitignore`` (git's syntax, in bounded time); no .gitignore content makes this raise.
"""

from __future__ import annotations

import logging
import os
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass

from checkpointd.core.capture.gitignore import (
    MatchBudget,
    MatchBudgetExhausted,
    PatternList,
    parse_configured,
    parse_file,
    path_text,
)
from checkpointd.core.kernel.errors import FailedPrecondition, Reason

NEVER_CAPTURED = frozenset({".git"})
GITIGNORE = ".gitignore"

#: A .gitignore larger than this is not read: its patterns are not applied, and captures say so.
MAX_GITIGNORE_BYTES = 1 << 20


@dataclass(frozen=True)
class Oversized:
    """What a loader returns for a .gitignore over ``MAX_GITIGNORE_BYTES``: its size."""

    size: int


#: The content of ``<directory>/.gitignore`` (bytes as on disk; a str is encoded back), None, or Oversized.
GitignoreLoader = Callable[[str], bytes | str | Oversized | None]

log = logging.getLogger("checkpointd.ignore")


class IgnoreRules:
    def __init__(self, configured_patterns: Iterable[str], loader: GitignoreLoader,
                 excluded_paths: Iterable[str] = ()) -> None:
        configured = parse_configured(list(configured_patterns))
        _report("core.snapshot.ignore_patterns", configured)
        self._configured = configured if configured else None
        self._loader = loader
        self._per_dir: dict[str, PatternList | None] = {}
        self._excluded = frozenset(excluded_paths)
        #: directory -> the pattern lists that decide for its entries, deepest .gitignore first, each
        #: with the bytes of a path before the part it sees ('' or 'a/b/') and where it comes from
        self._chains: dict[str, tuple[tuple[PatternList, int, str], ...]] = {}
        #: What matching may cost (see MatchBudget): no workspace's patterns hold a core for long.
        self.budget = MatchBudget()
        #: .gitignore path -> size, for those too large to be read (their patterns are not applied).
        self.unapplied: dict[str, int] = {}

    def _dir_patterns(self, directory: str) -> PatternList | None:
        if directory not in self._per_dir:
            content = self._loader(directory)
            source = f"{directory}/{GITIGNORE}" if directory else GITIGNORE
            if isinstance(content, Oversized):
                log.warning("%s is larger than %d bytes: its patterns are not applied", source, MAX_GITIGNORE_BYTES)
                self.unapplied[source] = content.size
                content = None
            if isinstance(content, str):
                content = content.encode("utf-8", "surrogateescape")
            patterns = self._parsed(content, source) if content else None
            if patterns is not None:
                _report(source, patterns)
            self._per_dir[directory] = patterns if patterns else None
        return self._per_dir[directory]

    def _parsed(self, content: bytes, source: str) -> PatternList:
        """``content``'s patterns; building them (a regex per wildcard pattern) is charged to the
        budget as matching is: a workspace of many costly files is refused as one costly file is."""
        started = time.thread_time()
        try:
            return parse_file(content)
        finally:
            try:
                self.budget.charge(time.thread_time() - started)
            except MatchBudgetExhausted:
                raise self._too_costly(source) from None

    def _too_costly(self, source: str) -> FailedPrecondition:
        budget = self.budget
        return FailedPrecondition(
            Reason.IGNORE_RULES_TOO_COSTLY,
            f"reading and matching the ignore patterns took {budget.spent:.1f} s of CPU for {budget.entries} "
            f"paths, more than any real pattern file needs; {source} was being read or matched: simplify its "
            "patterns (a few thousand plain ones are fine; hundreds of wildcards in a pattern are not)",
            path=source)

    def _chain(self, directory: str) -> tuple[tuple[PatternList, int, str], ...]:
        chain = self._chains.get(directory)
        if chain is None:
            own = self._dir_patterns(directory)
            source = f"{directory}/{GITIGNORE}" if directory else GITIGNORE
            mine = (((own, len(os.fsencode(directory)) + 1 if directory else 0, source),)
                    if own is not None else ())
            if directory:
                chain = mine + self._chain(directory.rpartition("/")[0])
            else:
                chain = mine + (((self._configured, 0, "core.snapshot.ignore_patterns"),)
                                if self._configured is not None else ())
            self._chains[directory] = chain
        return chain

    def note_absent(self, directory: str) -> None:
        """``directory`` has no .gitignore (a scan's listing of it says so): no need to ask
        the loader. Rules already loaded for it are kept."""
        self._per_dir.setdefault(directory, None)

    def forget(self, directory: str) -> None:
        """Drop the cached rules of one directory (its .gitignore changed)."""
        self._per_dir.pop(directory, None)
        self.unapplied.pop(f"{directory}/{GITIGNORE}" if directory else GITIGNORE, None)
        self._chains.clear()
        self.budget = MatchBudget()

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
        if not path.isascii():
            path = path_text(path)
            name = path.rpartition("/")[2]
        budget = self.budget
        budget.entries += 1
        for patterns, strip, source in chain:
            try:
                verdict = patterns.verdict(path, strip, name, is_dir, budget)
            except MatchBudgetExhausted:
                raise self._too_costly(source) from None
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


def _report(source: str, patterns: PatternList) -> None:
    for problem in patterns.problems:
        log.warning("%s, line %d: %s", source, problem.line_number, problem.why)
