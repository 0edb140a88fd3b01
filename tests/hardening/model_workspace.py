"""The model of the model-based test (tests/hardening/test_model.py): what a workspace looks like,
what a checkpoint of it must hold under the README's capture rules, what a diff between two such
trees reports, and what a rollback must leave on disk.

Names come from small pools so that edits collide (a file becomes a directory, a link replaces a
file...). The root ``.gitignore`` is drawn from a few fixed texts whose meaning is written out here
by hand (``Rules.excluded``), rather than asked of the server's own matcher: the model must not
share the code it checks. Git's full syntax is proved elsewhere (tests/core/capture/test_gitignore_vs_git.py).
"""

from __future__ import annotations

import contextlib
import os
import stat
from dataclasses import dataclass
from pathlib import Path

#: One path's state: (kind, content, mode). kind is "file", "symlink" or "dir"; content is a
#: file's bytes or a link's text (empty for a directory); a link's mode is 0o777, as recorded.
Node = tuple[str, bytes, int]
Tree = dict[str, Node]

DIR_NAMES = ("a", "b", "build")
LEAF_NAMES = ("x.txt", "y.log", "keep.log", "top.tmp", "z")
#: Root .gitignore texts, each spelled out in ``Rules.excluded``.
GITIGNORES = (b"", b"*.log\n", b"*.log\n!keep.log\n", b"build/\n", b"*.log\nbuild/\n/top.tmp\n")
FILE_MODES = (0o644, 0o600, 0o755, 0o4755, 0o2755, 0o6711, 0o1644)
DIR_MODES = (0o755, 0o700, 0o2775, 0o1777, 0o3755)
LINK_TARGETS = ("x.txt", "../a", "/etc/hostname", "missing", "a/x.txt", "..")
#: Files larger than this are skipped (the plan's core.snapshot.max_file_size_bytes).
MAX_FILE_SIZE = 40_000
BIG_FILE_SIZE = 50_000


def read_tree(root: Path) -> Tree:
    """Everything under ``root`` exactly, never following links (.git left out, as the server does)."""
    out: Tree = {}
    for dirpath, dirnames, filenames in os.walk(root):
        dirnames[:] = [d for d in dirnames if d != ".git"]
        for name in dirnames + filenames:
            full = Path(dirpath, name)
            rel = full.relative_to(root).as_posix()
            st = full.lstat()
            if stat.S_ISLNK(st.st_mode):
                out[rel] = ("symlink", os.fsencode(os.readlink(full)), 0o777)
            elif stat.S_ISDIR(st.st_mode):
                out[rel] = ("dir", b"", stat.S_IMODE(st.st_mode))
            elif stat.S_ISREG(st.st_mode):
                out[rel] = ("file", full.read_bytes(), stat.S_IMODE(st.st_mode))
    return out


def parents(path: str) -> list[str]:
    parts = path.split("/")
    return ["/".join(parts[:i]) for i in range(1, len(parts))]


def through_a_link(root: Path, path: str) -> bool:
    """Whether a directory above ``path`` is a symbolic link: an edit of that path would reach
    through it (perhaps out of the workspace, or into the directory being removed), so the model's
    edits leave such paths alone, as ``make_parents`` does for the edits that create."""
    return any((root / parent).is_symlink() for parent in parents(path))


def inside(path: str, top: str) -> bool:
    return path == top or path.startswith(top + "/")


@dataclass(frozen=True)
class Rules:
    """What a capture leaves out: the root .gitignore (one of GITIGNORES) and the size limit."""

    gitignore: bytes
    max_size: int = MAX_FILE_SIZE

    @classmethod
    def of(cls, tree: Tree) -> Rules:
        node = tree.get(".gitignore")
        return cls(node[1] if node is not None and node[0] == "file" else b"")

    def _ignored(self, name: str, is_dir: bool, at_root: bool, state: bool) -> bool:
        for line in self.gitignore.decode().splitlines():
            if line == "*.log" and name.endswith(".log"):
                state = True
            elif line == "!keep.log" and name == "keep.log":
                state = False
            elif (line == "build/" and is_dir and name == "build") or (
                    line == "/top.tmp" and at_root and name == "top.tmp"):
                state = True
        return state

    def ignored(self, path: str, tree: Tree) -> bool:
        """Whether the .gitignore leaves ``path`` out (below an excluded directory git never
        re-includes anything)."""
        parts = path.split("/")
        for depth in range(1, len(parts) + 1):
            node = tree["/".join(parts[:depth])]
            if self._ignored(parts[depth - 1], node[0] == "dir", depth == 1, False):
                return True
        return False

    def oversized(self, path: str, tree: Tree) -> bool:
        node = tree[path]
        return node[0] == "file" and len(node[1]) > self.max_size

    def excluded(self, path: str, tree: Tree) -> bool:
        """Whether a capture under these rules leaves ``path`` of ``tree`` out."""
        return self.ignored(path, tree) or self.oversized(path, tree)


def capture(tree: Tree, rules: Rules | None = None) -> Tree:
    """What a checkpoint of ``tree`` holds (its own .gitignore decides unless ``rules`` are given)."""
    rules = rules or Rules.of(tree)
    return {p: n for p, n in tree.items() if not rules.excluded(p, tree)}


#: One reported change: (kind, base type, target type, base size, target size, base mode, target mode).
ChangeRow = tuple[str, str, str, int, int, int, int]


def _side(node: Node | None) -> tuple[str, int, int]:
    if node is None:
        return "", 0, 0
    return node[0], 0 if node[0] == "dir" else len(node[1]), node[2]


def diff(base: Tree, target: Tree) -> dict[str, ChangeRow]:
    """What DiffCheckpoints reports from ``base`` to ``target``: every differing path; a
    directory on both sides only when its mode differs."""
    out: dict[str, ChangeRow] = {}
    for path in sorted(base.keys() | target.keys()):
        b, t = base.get(path), target.get(path)
        if b == t or (b is not None and t is not None and b[0] == t[0] == "dir" and b[2] == t[2]):
            continue
        if b is None:
            kind = "ADDED"
        elif t is None:
            kind = "DELETED"
        elif b[0] != t[0]:
            kind = "TYPE_CHANGED"
        else:
            kind = "MODIFIED"
        bt, bs, bm = _side(b)
        tt, ts, tm = _side(t)
        out[path] = (kind, bt, tt, bs, ts, bm, tm)
    return out


@dataclass
class Expected:
    """What a rollback must leave: ``after`` on success; whether ROLLBACK_CONFLICT is allowed
    (then nothing may change); what its safety checkpoint holds."""

    after: Tree
    may_conflict: bool
    safety: Tree
    changes: set[str]


def expect_rollback(before: Tree, target: Tree, target_rules: Rules, top: str | None = None,
                    target_skipped: frozenset[str] = frozenset()) -> Expected:
    """A rollback of the workspace ``before`` to the checkpoint ``target`` (captured under
    ``target_rules``, reporting ``target_skipped`` as too large), of everything or of the
    top-level path ``top`` only.

    Inside the scope, every path the target holds is restored exactly; a path the target's rules
    would not capture, or that today's leave out and the target lacks, stays as it is (with the
    directories above it); every other path goes. A path of the target that today's capture
    leaves out is added to the safety checkpoint first (with the directories above it)."""
    def scoped(path: str) -> bool:
        return top is None or inside(path, top)

    now_rules = Rules.of(before)
    # Left alone: what the target's rules leave out, and what today's leave out that the target
    # lacks (the rollback does not see it; deleting it would lose it, as no safety capture has it).
    # And what is at or under a path the target skipped as too large: it never saw what is there
    # (a file it skipped may be a directory now).
    kept = {p for p in before if scoped(p) and (target_rules.excluded(p, before)
                                                 or (p not in target and now_rules.excluded(p, before))
                                                 or any(inside(p, s) for s in target_skipped))}
    after: Tree = {p: n for p, n in before.items() if not scoped(p)}
    after.update({p: n for p, n in target.items() if scoped(p)})
    may_conflict = False
    for path in kept:
        if path in target and target[path] != before[path]:
            may_conflict = True  # the target captured it, today it is ignored or too large
            continue
        after.setdefault(path, before[path])
        for parent in parents(path):
            node = target.get(parent)
            if node is not None and node[0] != "dir":
                may_conflict = True
            after.setdefault(parent, before[parent])
    if top is not None and top not in target:
        # A scoped rollback of a path the target lacks still keeps what its rules skip.
        pass
    changes = {p for p in before.keys() | after.keys() if before.get(p) != after.get(p)}
    now = capture(before)
    safety = dict(now)
    for path in before.keys() & (changes | target.keys()):
        if scoped(path) and path not in now:
            safety[path] = before[path]
            for parent in parents(path):
                safety[parent] = before[parent]
    return Expected(after, may_conflict, safety, changes)


# -- edits ------------------------------------------------------------------------------------

#: Every path an edit may name: a leaf under at most two directories of DIR_NAMES.
ALL_PATHS = tuple([leaf for leaf in DIR_NAMES + LEAF_NAMES]
                  + [f"{d}/{leaf}" for d in DIR_NAMES for leaf in DIR_NAMES + LEAF_NAMES]
                  + [f"{d1}/{d2}/{leaf}" for d1 in DIR_NAMES for d2 in DIR_NAMES for leaf in DIR_NAMES + LEAF_NAMES])


def remove(full: Path) -> None:
    """Deletes whatever is at ``full`` (a directory with its content), never following a link."""
    if full.is_symlink() or not full.is_dir():
        with contextlib.suppress(FileNotFoundError, NotADirectoryError):  # nothing there
            full.unlink()
        return
    for child in full.iterdir():
        remove(child)
    full.rmdir()


def make_parents(root: Path, path: str) -> bool:
    """Creates the directories above ``path``; False (nothing done) when one of them is not a
    directory: the edit is then a no-op."""
    for parent in parents(path):
        full = root / parent
        if full.is_symlink() or (full.exists() and not full.is_dir()):
            return False
        if not full.exists():
            full.mkdir()
    return True


def write_file(root: Path, path: str, data: bytes, mode: int | None = None) -> None:
    """Writes ``data`` at ``path`` in place (O_TRUNC: every hard link of the file sees it)."""
    if not make_parents(root, path):
        return
    full = root / path
    if full.is_symlink() or full.is_dir():
        remove(full)
    with open(full, "wb") as f:
        f.write(data)
    if mode is not None:
        os.chmod(full, mode)


def append(root: Path, path: str, data: bytes) -> None:
    full = root / path
    if full.is_file() and not full.is_symlink():
        with open(full, "ab") as f:
            f.write(data)


def rewrite_same_size_same_mtime(root: Path, path: str) -> None:
    """Other bytes of the same length, the mtime put back: only the ctime (and content) tell."""
    full = root / path
    if not full.is_file() or full.is_symlink():
        return
    before = full.lstat()
    old = full.read_bytes()
    with open(full, "r+b") as f:
        f.write(bytes((b + 1) % 256 for b in old))
    os.utime(full, ns=(before.st_atime_ns, before.st_mtime_ns))


def rename(root: Path, source: str, destination: str) -> None:
    src, dst = root / source, root / destination
    if inside(destination, source) or not (src.is_symlink() or src.exists()) or not make_parents(root, destination):
        return
    if dst.is_symlink() or dst.exists():
        remove(dst)
    os.rename(src, dst)


def make_dir(root: Path, path: str, mode: int) -> None:
    if not make_parents(root, path):
        return
    full = root / path
    if full.is_symlink() or full.exists():
        remove(full)
    full.mkdir()
    os.chmod(full, mode)


def chmod(root: Path, path: str, file_mode: int, dir_mode: int) -> None:
    full = root / path
    if not full.is_symlink() and full.exists():
        os.chmod(full, file_mode if full.is_file() else dir_mode)


def symlink(root: Path, path: str, target: str) -> None:
    if not make_parents(root, path):
        return
    full = root / path
    if full.is_symlink() or full.exists():
        remove(full)
    os.symlink(target, full)


def hard_link(root: Path, existing: Path, path: str) -> None:
    """Gives the regular file ``existing`` (inside the workspace or not) a second name at ``path``."""
    if not existing.is_file() or existing.is_symlink() or not make_parents(root, path):
        return
    full = root / path
    if full.is_symlink() or full.exists():
        if full.is_file() and os.path.samefile(full, existing):
            return
        remove(full)
    os.link(existing, full)


def flip_type(root: Path, path: str) -> None:
    """A file becomes a directory, a directory a link, a link a file."""
    full = root / path
    if full.is_symlink():
        remove(full)
        full.write_bytes(b"was a link\n")
    elif full.is_dir():
        remove(full)
        os.symlink("x.txt", full)
    elif full.exists():
        remove(full)
        full.mkdir()
        (full / "x.txt").write_bytes(b"was a file\n")
