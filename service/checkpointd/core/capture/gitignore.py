"""Git's ignore-pattern syntax, matched in bounded time.

A pattern list (one ``.gitignore``, or the configured patterns) is parsed exactly as git's
``dir.c`` reads it and each pattern is matched exactly as git's ``wildmatch`` would, byte for
byte: blank lines and ``#`` comments, ``\\`` escapes, unescaped trailing spaces dropped, ``!``
negation, a trailing ``/`` for directories only, a ``/`` at the start or in the middle anchoring
the pattern to its file's directory, ``*`` ``?`` ``[...]`` (ranges, ``!``/``^``, the POSIX classes
git knows) never matching ``/``, and ``**`` before, after or between slashes. What git would
never match (a trailing backslash, an unclosed ``[``, an unknown ``[:class:]``, a bare ``!``)
never matches here either; nothing in a pattern list raises.

Why not translate patterns to ordinary regular expressions: a backtracking engine takes
exponential time on ``*a*a*a*a*a*b`` against a long name, and Python's ``re`` holds the
interpreter lock all the while. Matching here is polynomial instead, with no backtracking
across stars: within one path segment a ``*`` cannot match ``/``, so every chunk between two
stars has a fixed length and its earliest occurrence is always a right choice (later chunks
only get more room); the last chunk is anchored at the segment's end. The same argument holds
one level up for ``**``: the segments between two ``**`` are placed at their earliest fitting
segment. Each such choice is an atomic group (``(?>...)``), so the regex engine cannot
revisit it, and a match costs at most O(len(pattern) x len(path)) steps.

Paths are matched as their bytes (``os.fsencode``), each byte one character of a latin-1
``str``: ``?`` and classes match one byte, as in git, whatever the encoding of a name.
"""

from __future__ import annotations

import functools
import os
import re
import time
from dataclasses import dataclass

#: Longest pattern (in bytes, after trimming) that is matched; longer ones never match.
#: Real patterns are path-sized: git's own paths are limited to PATH_MAX.
MAX_PATTERN_BYTES = 1024
#: Patterns read from one .gitignore (or configured); the lines after the last one are ignored.
MAX_PATTERNS_PER_FILE = 10_000
#: Wildcards (``*``, ``?``, ``[``) in one file's patterns: each costs its regex tens of
#: microseconds to build, so a 1 MiB file of nothing but stars would take half a minute to read.
#: Real files hold hundreds; the lines past the limit are ignored.
MAX_WILDCARDS_PER_FILE = 4096

_STAR, _QUESTION, _LBRACKET, _RBRACKET = ord("*"), ord("?"), ord("["), ord("]")
_BACKSLASH, _SLASH, _BANG, _CARET, _DASH, _COLON = ord("\\"), ord("/"), ord("!"), ord("^"), ord("-"), ord(":")
_GLOB_SPECIAL = frozenset(b"*?[\\")
_BOM = b"\xef\xbb\xbf"


def _bytes(*ranges: tuple[int, int] | int) -> frozenset[int]:
    out: set[int] = set()
    for item in ranges:
        low, high = item if isinstance(item, tuple) else (item, item)
        out.update(range(low, high + 1))
    return frozenset(out)


_DIGIT, _UPPER, _LOWER = _bytes((0x30, 0x39)), _bytes((0x41, 0x5A)), _bytes((0x61, 0x7A))
#: The classes of git's wildmatch, with git's own ctype (ASCII only; its isspace is \t \n \r and space).
_CLASSES: dict[bytes, frozenset[int]] = {
    b"alnum": _DIGIT | _UPPER | _LOWER,
    b"alpha": _UPPER | _LOWER,
    b"blank": _bytes(0x09, 0x20),
    b"cntrl": _bytes((0x00, 0x1F), 0x7F),
    b"digit": _DIGIT,
    b"graph": _bytes((0x21, 0x7E)),
    b"lower": _LOWER,
    b"print": _bytes((0x20, 0x7E)),
    b"punct": _bytes((0x21, 0x2F), (0x3A, 0x40), (0x5B, 0x60), (0x7B, 0x7E)),
    b"space": _bytes(0x09, 0x0A, 0x0D, 0x20),
    b"upper": _UPPER,
    b"xdigit": _DIGIT | _bytes((0x41, 0x46), (0x61, 0x66)),
}


class _Never(Exception):
    """The pattern can never match anything; the message says why."""


# -- elements of a pattern -----------------------------------------------------------------

@dataclass(frozen=True, slots=True)
class _Char:
    """Matches exactly one byte: a regex fragment of width one."""

    regex: str


@dataclass(frozen=True, slots=True)
class _Slash:
    """A literal '/' of an anchored pattern: the boundary between two segments."""


@dataclass(frozen=True, slots=True)
class _Star:
    """``*``: any run of bytes other than '/'."""


@dataclass(frozen=True, slots=True)
class _Segments:
    """A ``**`` between slashes: at least ``least`` whole segments (each with its '/'); with
    ``to_end``, whatever is left of the path after them."""

    least: int
    to_end: bool = False


_Element = _Char | _Slash | _Star | _Segments
_SLASH_ELEMENT, _STAR_ELEMENT = _Slash(), _Star()
_ANY = _Char("[^/]")


def _literal(byte: int) -> _Char:
    char = chr(byte)
    return _Char(char if char.isascii() and char.isalnum() else f"\\x{byte:02x}")


def _byte_class(allowed: frozenset[int]) -> _Char:
    if not allowed:
        raise _Never("its character class matches no character")
    ranges: list[str] = []
    ordered = sorted(allowed)
    start = previous = ordered[0]
    for byte in [*ordered[1:], -1]:
        if byte == previous + 1:
            previous = byte
            continue
        ranges.append(f"\\x{start:02x}" if start == previous else f"\\x{start:02x}-\\x{previous:02x}")
        start = previous = byte
    return _Char(f"[{''.join(ranges)}]")


def _bracket(body: bytes, at: int) -> tuple[frozenset[int], bool, int]:
    """The class opening at ``body[at] == '['`` as git's wildmatch reads it: its members,
    whether it is negated, and the index after its ']'. Raises _Never where wildmatch aborts."""

    def byte(i: int) -> int:
        return body[i] if i < len(body) else 0

    i = at + 1
    p_ch = byte(i)
    if p_ch == _CARET:
        p_ch = _BANG
    negated = p_ch == _BANG
    if negated:
        i += 1
        p_ch = byte(i)
    members: set[int] = set()
    prev_ch = 0
    while True:
        if not p_ch:
            raise _Never("it has an unclosed '['")
        if p_ch == _BACKSLASH:
            i += 1
            p_ch = byte(i)
            if not p_ch:
                raise _Never("it has an unclosed '['")
            members.add(p_ch)
        elif p_ch == _DASH and prev_ch and byte(i + 1) and byte(i + 1) != _RBRACKET:
            i += 1
            p_ch = byte(i)
            if p_ch == _BACKSLASH:
                i += 1
                p_ch = byte(i)
                if not p_ch:
                    raise _Never("it has an unclosed '['")
            members.update(range(prev_ch, p_ch + 1))
            p_ch = 0
        elif p_ch == _LBRACKET and byte(i + 1) == _COLON:
            i += 2
            name_start = i
            while byte(i) and byte(i) != _RBRACKET:
                i += 1
            p_ch = byte(i)
            if not p_ch:
                raise _Never("it has an unclosed '['")
            length = i - name_start - 1
            if length < 0 or body[i - 1] != _COLON:
                # No ":]": the '[' is an ordinary member and the scan goes on after it.
                i = name_start - 2
                p_ch = _LBRACKET
                members.add(p_ch)
            else:
                name = body[name_start:name_start + length]
                if name not in _CLASSES:
                    raise _Never(f"[:{name.decode('latin-1')}:] is not a character class git knows")
                members.update(_CLASSES[name])
                p_ch = 0
        else:
            members.add(p_ch)
        prev_ch = p_ch
        i += 1
        p_ch = byte(i)
        if p_ch == _RBRACKET:
            return frozenset(members), negated, i + 1


def _elements(body: bytes, start: int, anchored: bool) -> list[_Element]:
    """``body`` as git's wildmatch reads it. In an anchored pattern, wildmatch starts at
    ``start`` (after the literal prefix that git compares on its own), where a ``**`` counts
    as at the start of the pattern, as it does after a '/'."""
    out: list[_Element] = [_SLASH_ELEMENT if b == _SLASH else _literal(b) for b in body[:start]]
    i, n = start, len(body)
    while i < n:
        c = body[i]
        if c == _BACKSLASH:
            if i + 1 == n:
                raise _Never("it ends with a backslash that escapes nothing")
            c = body[i + 1]
            out.append(_SLASH_ELEMENT if c == _SLASH and anchored else _literal(c))
            i += 2
        elif c == _QUESTION:
            out.append(_ANY)
            i += 1
        elif c == _STAR:
            j = i
            while j < n and body[j] == _STAR:
                j += 1
            if anchored and j - i > 1 and (i == start or body[i - 1] == _SLASH):
                if j == n:
                    out.append(_Segments(0, to_end=True))
                    i = j
                    continue
                if body[j] == _SLASH:
                    out.append(_Segments(0))
                    i = j + 1
                    continue
                if body[j] == _BACKSLASH and j + 1 < n and body[j + 1] == _SLASH:
                    out.append(_Segments(1))
                    i = j + 2
                    continue
            out.append(_STAR_ELEMENT)
            i = j
        elif c == _LBRACKET:
            members, negated, i = _bracket(body, i)
            allowed = (frozenset(range(1, 256)) - members) if negated else members
            out.append(_byte_class(allowed - {_SLASH, 0}))
        else:
            out.append(_SLASH_ELEMENT if c == _SLASH and anchored else _literal(c))
            i += 1
    return out


# -- regular expressions that cannot backtrack across stars -----------------------------------

def _segment_regex(elements: list[_Element]) -> str:
    """One segment's elements (no '/' among them, the segment ends at a '/' or the end)."""
    chunks: list[list[str]] = [[]]
    for element in elements:
        if isinstance(element, _Star):
            chunks.append([])
        else:
            chunks[-1].append(element.regex)
    out = "".join(chunks[0])
    if len(chunks) == 1:
        return out
    for chunk in chunks[1:-1]:
        if chunk:
            # The chunk's earliest occurrence, committed to.
            out += f"(?>[^/]*?{''.join(chunk)})"
    last = chunks[-1]
    if not last:
        return out + "[^/]*+"
    # The last chunk ends where the segment ends: take the segment, then look back.
    return out + f"(?=[^/]{{{len(last)}}})[^/]*+(?<={''.join(last)})"


def _piece_regex(elements: list[_Element]) -> str:
    """Whole segments separated by literal slashes."""
    segments: list[list[_Element]] = [[]]
    for element in elements:
        if isinstance(element, _Slash):
            segments.append([])
        else:
            segments[-1].append(element)
    return "/".join(_segment_regex(segment) for segment in segments)


def _merged(elements: list[_Element]) -> list[_Element]:
    """Adjacent ``**`` merged into one (``**/**/`` is ``**/``): no two quantifiers side by side."""
    out: list[_Element] = []
    for element in elements:
        if isinstance(element, _Segments) and out and isinstance(out[-1], _Segments):
            previous = out.pop()
            element = _Segments(previous.least + element.least, previous.to_end or element.to_end)
        out.append(element)
    return out


def _anchored_regex(elements: list[_Element]) -> str:
    pieces: list[tuple[_Segments | None, list[_Element]]] = [(None, [])]
    for element in _merged(elements):
        if isinstance(element, _Segments):
            pieces.append((element, []))
        else:
            pieces[-1][1].append(element)
    out = _piece_regex(pieces[0][1])
    for index, (gap, piece) in enumerate(pieces[1:], start=1):
        skip = f"(?:[^/]*+/){{{gap.least},}}?"
        if gap.to_end:
            out += (f"(?:[^/]*+/){{{gap.least}}}" if gap.least else "") + "[\\s\\S]*"
        elif index == len(pieces) - 1:
            out += skip + _piece_regex(piece)
        else:
            # The piece's earliest fitting segment, committed to.
            out += f"(?>{skip}{_piece_regex(piece)})"
    return out + r"\Z"


# -- patterns ------------------------------------------------------------------------------

class Kind:
    """How a pattern is tested; all but REGEX are plain string operations."""

    NEVER = "never"
    NAME = "name"  # the name equals the text
    SUFFIX = "suffix"  # the name ends with the text ("*.log")
    PREFIX = "prefix"  # the name starts with the text ("build*")
    PATH = "path"  # the path (below the pattern's directory) equals the text
    NAME_REGEX = "name-regex"
    PATH_REGEX = "path-regex"


@dataclass(frozen=True, slots=True)
class Pattern:
    """One line of a pattern list. ``text``/``regex`` are over latin-1 strings of path bytes."""

    line: bytes
    negative: bool
    dir_only: bool
    kind: str
    #: The literal to compare (PATH_REGEX: the literal start every matching path has).
    text: str = ""
    regex: re.Pattern[str] | None = None
    #: Why it can never match (None: it can).
    never: str | None = None

    def matches(self, path: str, name: str) -> bool:
        kind = self.kind
        if kind == Kind.NAME:
            return name == self.text
        if kind == Kind.SUFFIX:
            return name.endswith(self.text)
        if kind == Kind.PREFIX:
            return name.startswith(self.text)
        if kind == Kind.PATH:
            return path == self.text
        if kind == Kind.NAME_REGEX:
            return self.regex.fullmatch(name) is not None
        if kind == Kind.PATH_REGEX:
            return self.regex.fullmatch(path) is not None
        return False


def _trim_trailing_spaces(line: bytes) -> bytes:
    """Git's trim_trailing_spaces: unescaped trailing spaces go; a trailing backslash stays."""
    last_space = -1
    i, n = 0, len(line)
    while i < n:
        c = line[i]
        if c == 0x20:
            if last_space < 0:
                last_space = i
        elif c == _BACKSLASH:
            i += 1
            if i == n:
                return line
            last_space = -1
        else:
            last_space = -1
        i += 1
    return line[:last_space] if last_space >= 0 else line


def parse_pattern(line: bytes) -> Pattern:
    """A pattern line whose comment, carriage return and trailing spaces are already dealt with."""
    body = line
    negative = body[:1] == b"!"
    if negative:
        body = body[1:]
    dir_only = body[-1:] == b"/"
    if dir_only:
        body = body[:-1]

    def never(why: str) -> Pattern:
        return Pattern(line, negative, dir_only, Kind.NEVER, never=why)

    if len(line) > MAX_PATTERN_BYTES:
        return never(f"it is longer than {MAX_PATTERN_BYTES} bytes")
    if not body:
        return never("'!' negates nothing" if negative else "it is only '/'" if dir_only else "it is empty")
    special = next((i for i, b in enumerate(body) if b in _GLOB_SPECIAL), len(body))
    try:
        if _SLASH not in body:
            text = body.decode("latin-1")
            if special == len(body):
                return Pattern(line, negative, dir_only, Kind.NAME, text)
            if special == 0 and body[0] == _STAR and not any(b in _GLOB_SPECIAL for b in body[1:]):
                return Pattern(line, negative, dir_only, Kind.SUFFIX, text[1:])
            if special == len(body) - 1 and body[-1] == _STAR:
                return Pattern(line, negative, dir_only, Kind.PREFIX, text[:-1])
            regex = _segment_regex(_elements(body, 0, anchored=False)) + r"\Z"
            return Pattern(line, negative, dir_only, Kind.NAME_REGEX, regex=_compile(regex))
        if body[0] == _SLASH:
            body = body[1:]
            special -= 1
            if not body:
                return never("it is only '/'")
        if special == len(body):
            return Pattern(line, negative, dir_only, Kind.PATH, body.decode("latin-1"))
        regex = _anchored_regex(_elements(body, special, anchored=True))
        return Pattern(line, negative, dir_only, Kind.PATH_REGEX, body[:special].decode("latin-1"), _compile(regex))
    except _Never as reason:
        return never(str(reason))


def _compile(regex: str) -> re.Pattern[str]:
    try:
        return re.compile(regex)
    except (re.error, RecursionError, OverflowError) as exc:  # a translation bug must not break a capture
        raise _Never(f"it could not be compiled ({exc})") from None


def pattern_lines(data: bytes) -> list[tuple[int, bytes]]:
    """The pattern lines of a pattern file, numbered from 1, as git's add_patterns_from_buffer
    reads them (a UTF-8 byte-order mark skipped, CRLF endings, a NUL ending a line's pattern)."""
    if data.startswith(_BOM):
        data = data[len(_BOM):]
    out = []
    for number, raw in enumerate(data.split(b"\n"), start=1):
        if not raw or raw[0] == 0x23:  # blank, or a comment
            continue
        if raw[-1] == 0x0D:
            raw = raw[:-1]
        raw = raw.split(b"\0", 1)[0]
        out.append((number, _trim_trailing_spaces(raw)))
    return out


@dataclass(frozen=True, slots=True)
class Problem:
    """A line of a pattern list that is left out because it is past a limit."""

    line_number: int
    why: str


class MatchBudgetExhausted(Exception):
    """Matching took more CPU than its ``MatchBudget`` allows."""


class MatchBudget:
    """The CPU time matching may take beyond the quick test: ``BASE_SECONDS``, plus
    ``PER_ENTRY_SECONDS`` for every entry asked about (``entries``, counted by the caller). Real
    pattern files cost microseconds per entry; a crafted one (a thousand patterns of hundreds
    of stars each, against long names) costs a tenth of a second per entry and would hold a core
    for minutes: past its budget, ``charge`` raises instead."""

    BASE_SECONDS = 2.0
    PER_ENTRY_SECONDS = 100e-6

    __slots__ = ("entries", "spent")

    def __init__(self) -> None:
        self.entries = 0
        self.spent = 0.0

    def charge(self, seconds: float) -> None:
        self.spent += seconds
        if self.spent > self.BASE_SECONDS + self.PER_ENTRY_SECONDS * self.entries:
            raise MatchBudgetExhausted(self.spent)


class PatternList:
    """The patterns of one file, last match wins; with a quick test that no pattern matches
    (the common case for nearly every path), made of set lookups and a regex per group."""

    __slots__ = ("patterns", "problems", "_names", "_suffixes", "_prefixes", "_paths",
                 "_name_regexes", "_path_regexes", "_path_starts", "_has_path_patterns",
                 "_name_at", "_path_at", "_others")

    #: Regex patterns tested together by one alternation in the quick test: few, since one call
    #: holds the interpreter lock throughout (a crafted pattern and path cost a few ms each).
    GROUP = 8

    def __init__(self, patterns: list[Pattern], problems: list[Problem]) -> None:
        self.patterns = tuple(patterns)
        self.problems = tuple(problems)
        by_kind: dict[str, list[Pattern]] = {}
        for pattern in patterns:
            by_kind.setdefault(pattern.kind, []).append(pattern)

        def texts(kind: str) -> list[str]:
            return [p.text for p in by_kind.get(kind, ())]

        self._names = frozenset(texts(Kind.NAME))
        self._suffixes = tuple(set(texts(Kind.SUFFIX)))
        self._prefixes = tuple(set(texts(Kind.PREFIX)))
        self._paths = frozenset(texts(Kind.PATH))
        self._name_regexes = self._groups(by_kind.get(Kind.NAME_REGEX, ()))
        self._path_regexes = self._groups(by_kind.get(Kind.PATH_REGEX, ()))
        #: Where every path pattern has a literal start: what a path must start with to be tried.
        starts = texts(Kind.PATH_REGEX)
        self._path_starts = tuple(set(starts)) if starts and all(starts) else None
        self._has_path_patterns = bool(self._paths or self._path_regexes)
        #: Where each literal name and path is (line order): found by lookup, not by trying every
        #: pattern, so a file of thousands of plain names costs nothing per path; the others
        #: (with their place) are tried in turn.
        self._name_at: dict[str, list[int]] = {}
        self._path_at: dict[str, list[int]] = {}
        others = []
        for index, pattern in enumerate(patterns):
            if pattern.kind == Kind.NAME:
                self._name_at.setdefault(pattern.text, []).append(index)
            elif pattern.kind == Kind.PATH:
                self._path_at.setdefault(pattern.text, []).append(index)
            elif pattern.kind != Kind.NEVER:
                others.append((index, pattern))
        self._others = tuple(reversed(others))

    @classmethod
    def _groups(cls, patterns) -> tuple[re.Pattern[str], ...]:
        regexes = [p.regex for p in patterns]
        groups = []
        for i in range(0, len(regexes), cls.GROUP):
            members = regexes[i:i + cls.GROUP]
            try:
                groups.append(re.compile("|".join(f"(?:{r.pattern})" for r in members)))
            except (re.error, RecursionError, OverflowError):  # each on its own then: slower, as exact
                groups.extend(members)
        return tuple(groups)

    def __bool__(self) -> bool:
        return bool(self.patterns)

    def may_match(self, path: str, name: str) -> bool:
        """False when no pattern can match ``path`` (whose last segment is ``name``): the quick
        test alone, set lookups first."""
        if name in self._names or (self._suffixes and name.endswith(self._suffixes)) \
                or (self._prefixes and name.startswith(self._prefixes)):
            return True
        for regex in self._name_regexes:
            if regex.fullmatch(name) is not None:
                return True
        if self._has_path_patterns:
            if path in self._paths:
                return True
            if self._path_starts is not None and not path.startswith(self._path_starts):
                return False
            for regex in self._path_regexes:
                if regex.fullmatch(path) is not None:
                    return True
        return False

    def verdict(self, path: str, strip: int, name: str, is_dir: bool,
                budget: MatchBudget | None = None) -> bool | None:
        """Whether the last pattern matching ``path[strip:]`` (the path below the patterns'
        directory) ignores it (True) or re-includes it (False); None when none matches. What it
        takes beyond the set lookups is charged to ``budget``."""
        # The quick test inlined: this runs for every entry of every scan.
        listed = (name in self._names or (self._suffixes and name.endswith(self._suffixes))
                  or (self._prefixes and name.startswith(self._prefixes)))
        if not listed and not self._name_regexes and not self._has_path_patterns:
            return None
        if budget is None:
            return self._verdict(path[strip:], name, is_dir, listed)
        started = time.thread_time()
        try:
            return self._verdict(path[strip:], name, is_dir, listed)
        finally:
            budget.charge(time.thread_time() - started)

    def _verdict(self, path: str, name: str, is_dir: bool, listed: bool) -> bool | None:
        if not listed and not self.may_match(path, name):
            return None
        # The last pattern that applies and matches: the last literal one found by lookup, then
        # any other after it.
        patterns = self.patterns
        last = -1
        for at in (self._name_at.get(name), self._path_at.get(path)):
            for index in reversed(at or ()):
                if index <= last:
                    break
                if is_dir or not patterns[index].dir_only:
                    last = index
                    break
        for index, pattern in self._others:
            if index <= last:
                break
            if pattern.dir_only and not is_dir:
                continue
            if pattern.matches(path, name):
                last = index
                break
        return None if last < 0 else not patterns[last].negative


def parse_lines(lines: list[tuple[int, bytes]]) -> PatternList:
    patterns: list[Pattern] = []
    problems: list[Problem] = []
    wildcards = 0
    for number, line in lines:
        if len(patterns) == MAX_PATTERNS_PER_FILE:
            problems.append(Problem(number, f"more than {MAX_PATTERNS_PER_FILE} patterns: this line and the "
                                            "ones after it are ignored"))
            break
        wildcards += line.count(b"*") + line.count(b"?") + line.count(b"[")
        if wildcards > MAX_WILDCARDS_PER_FILE:
            problems.append(Problem(number, f"more than {MAX_WILDCARDS_PER_FILE} wildcards (*, ?, [) in the "
                                            "patterns so far: this line and the ones after it are ignored"))
            break
        pattern = parse_pattern(line)
        if len(line) > MAX_PATTERN_BYTES:
            problems.append(Problem(number, f"the pattern is longer than {MAX_PATTERN_BYTES} bytes and is ignored"))
        patterns.append(pattern)
    return PatternList(patterns, problems)


@functools.lru_cache(maxsize=512)
def _parse_small(data: bytes) -> PatternList:
    return parse_lines(pattern_lines(data))


#: Pattern files up to this size are parsed once per process (the parsed form is cached by content).
_CACHED_FILE_BYTES = 16 * 1024


def parse_file(data: bytes) -> PatternList:
    """A .gitignore's patterns. Never raises."""
    return _parse_small(data) if len(data) <= _CACHED_FILE_BYTES else parse_lines(pattern_lines(data))


def parse_configured(patterns: list[str] | tuple[str, ...]) -> PatternList:
    """Configured patterns, read like git's excludes file: one line each."""
    return parse_file("\n".join(patterns).encode("utf-8", "surrogateescape"))


def refusal(pattern: str) -> str | None:
    """Why a configured ignore pattern is refused (None: it is accepted): one that would never
    match anything, or would not be one pattern, is a mistake worth telling its author about."""
    if "\n" in pattern or "\r" in pattern or "\0" in pattern:
        return "contains a line break or a NUL, which would make it more than one pattern"
    lines = pattern_lines(pattern.encode("utf-8", "surrogateescape"))
    if not lines:
        if pattern.startswith("#"):
            return "starts with '#', which makes it a comment; write '\\#' to match a name that starts with '#'"
        return "is empty"
    parsed = parse_pattern(lines[0][1])
    if parsed.never is not None:
        return f"can never match: {parsed.never}"
    return None


def path_text(path: str) -> str:
    """``path`` as the matcher sees it: one character per byte of its name on disk."""
    return path if path.isascii() else os.fsencode(path).decode("latin-1")
