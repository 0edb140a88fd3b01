"""What a checkpoint holds, byte for byte: one file (ReadCheckpointFile), a directory's listing
(ListCheckpointFiles), the whole tree as a tar archive (ExportCheckpoint), and unified text diffs
of changed files (DiffCheckpoints with text_diffs).

A listing pages by the last path it returned: a checkpoint's tree never changes, and each page
walks down to that path (skipping what sorts before it), so page N costs no more than page 1.

Reads stream in chunks of at most ``CHUNK`` bytes: a file is never held whole in memory, except
one stored packed (small by construction). The tar archive is written member by member, its
headers by ``tarfile`` and its content straight from the store, so a large file is not
buffered either.
"""

from __future__ import annotations

import difflib
import itertools
import tarfile
import time
from collections.abc import Iterable, Iterator
from dataclasses import dataclass

from checkpointd.core.engine import filtering
from checkpointd.core.engine.parts import checkpoint_not_found, not_found_if_deleted
from checkpointd.core.kernel import validation
from checkpointd.core.kernel.errors import DataLoss, FailedPrecondition, NotFound, Reason
from checkpointd.core.metadata.db import Database
from checkpointd.core.metadata.models import CheckpointRow, PlanRow
from checkpointd.core.store.content_store import ContentStore, digest_bytes
from checkpointd.core.store.tree import Change, Entry, EntryKind, Trees
from checkpointd.core.workspace.workspace import Workspace, validate_relpath

CHUNK = 64 * 1024
#: A side larger than this gets no text diff (TOO_LARGE).
MAX_TEXT_DIFF_SIDE = 1 << 20
#: Text diffs of one response stop (TOO_LARGE) once they reach this many characters in total.
MAX_TEXT_DIFF_TOTAL = 2 << 20
#: A side with more lines than this gets no text diff (TOO_LARGE): difflib's cost grows with the
#: product of the two sides' lines in the worst case (a shuffled file of 200,000 short repeated
#: lines took 34 s of CPU); at 20,000 lines the worst seen was about 1 s.
MAX_TEXT_DIFF_LINES = 20_000
#: Once the diffs of one response have taken this long, the remaining files get TOO_LARGE: a
#: workspace's content never holds a server thread for long.
MAX_TEXT_DIFF_SECONDS = 5.0
_BLOCK = tarfile.BLOCKSIZE
#: The scope of ListCheckpointFiles' page tokens (with the checkpoint id and recursive).
_LIST_TOKEN_SCOPE = "ListCheckpointFiles"


class TextDiffStatus:
    TEXT = "TEXT"
    BINARY = "BINARY"
    TOO_LARGE = "TOO_LARGE"
    NOT_A_FILE = "NOT_A_FILE"
    UNREADABLE = "UNREADABLE"


@dataclass(frozen=True)
class TextDiff:
    status: str
    text: str = ""


def rechunk(chunks: Iterable[bytes], size: int = CHUNK) -> Iterator[bytes]:
    """The same bytes in pieces of at most ``size``."""
    for chunk in chunks:
        for start in range(0, len(chunk), size):
            yield chunk[start:start + size]


class Contents:
    def __init__(self, db: Database, store: ContentStore, trees: Trees, page_tokens: filtering.PageTokens) -> None:
        self.db = db
        self.store = store
        self.trees = trees
        self.page_tokens = page_tokens

    def _files_of(self, checkpoint_id: str) -> CheckpointRow:
        checkpoint_id = validation.checkpoint_id(checkpoint_id)
        with self.db.session() as session:
            row = session.get(CheckpointRow, checkpoint_id)
            if row is None:
                raise checkpoint_not_found(session, checkpoint_id)
        if not row.tree_digest:
            raise FailedPrecondition(Reason.NO_WORKSPACE, f"checkpoint {checkpoint_id} has no files (state only)",
                                     checkpoint_id=checkpoint_id)
        return row

    def open_file(self, checkpoint_id: str, path: str) -> tuple[Entry, Iterator[bytes]]:
        """The entry at ``path`` and its content in chunks (a symlink's: its link text). Every
        error is raised here, before the first chunk; the chunks verify the content's digest."""
        names_a_directory = path.endswith("/")
        path = validate_relpath(path.rstrip("/"), "path")
        row = self._files_of(checkpoint_id)
        entry = self.trees.lookup(row.tree_digest, path)
        if entry is None:
            raise NotFound(Reason.PATH_NOT_FOUND, f"checkpoint {row.checkpoint_id} has no {path!r}",
                           checkpoint_id=row.checkpoint_id, path=path)
        if entry.kind is EntryKind.DIR:
            raise FailedPrecondition(Reason.NOT_A_FILE, f"{path!r} is a directory in checkpoint {row.checkpoint_id}; "
                                                        "ls-files lists it; export gets the whole tree",
                                     checkpoint_id=row.checkpoint_id, path=path)
        if names_a_directory:
            # As open(2) says ENOTDIR for "file/": a trailing '/' asks for a directory.
            raise FailedPrecondition(Reason.NOT_A_DIRECTORY,
                                     f"{path + '/'!r} names a directory, but {path!r} is a "
                                     f"{'symlink' if entry.kind is EntryKind.SYMLINK else 'file'} in checkpoint "
                                     f"{row.checkpoint_id}; drop the trailing '/' to read it",
                                     checkpoint_id=row.checkpoint_id, path=path)
        if entry.kind is EntryKind.SYMLINK:
            return entry, iter((entry.target.encode("utf-8", "surrogateescape"),))
        return entry, self._unless_deleted(row.checkpoint_id, self._content(entry))

    def list_files(self, checkpoint_id: str, path: str = "", recursive: bool = False, page_size: int = 0,
                   page_token: str = "") -> tuple[list[tuple[str, Entry]], str]:
        """One page of the entries under directory ``path`` ("" = the root), as (workspace-relative
        path, entry) pairs in depth-first order with names sorted, and the next page's token."""
        if path:
            path = validate_relpath(path.rstrip("/") or path, "path")
        size = filtering.page_size(page_size)
        row = self._files_of(checkpoint_id)
        scope = f"{_LIST_TOKEN_SCOPE}\0{row.checkpoint_id}\0{int(recursive)}"
        resume = self.page_tokens.check_after_path(page_token, scope, path)
        after_path = None if resume is None else resume.path
        try:
            return self._page(row, path, recursive, size, scope, after_path)
        except DataLoss:
            self._not_found_if_deleted(row.checkpoint_id)
            raise

    def _page(self, row: CheckpointRow, path: str, recursive: bool, size: int, scope: str,
              after_path: str | None) -> tuple[list[tuple[str, Entry]], str]:
        digest = row.tree_digest
        if path:
            entry = self.trees.lookup(row.tree_digest, path)
            if entry is None:
                raise NotFound(Reason.PATH_NOT_FOUND, f"checkpoint {row.checkpoint_id} has no {path!r}",
                               checkpoint_id=row.checkpoint_id, path=path)
            if entry.kind is not EntryKind.DIR:
                raise FailedPrecondition(Reason.NOT_A_DIRECTORY,
                                         f"{path!r} is a {'symlink' if entry.kind is EntryKind.SYMLINK else 'file'}, "
                                         f"not a directory, in checkpoint {row.checkpoint_id}; `cat` reads it",
                                         checkpoint_id=row.checkpoint_id, path=path)
            digest = entry.digest
        prefix = f"{path}/" if path else ""
        after = None if after_path is None else after_path.removeprefix(prefix).split("/")
        found = list(itertools.islice(self._walk(digest, prefix, recursive, after), size + 1))
        token = ""
        if len(found) > size:
            found = found[:size]
            token = self.page_tokens.issue_after_path(scope, path, found[-1][0])
        return found, token

    def _walk(self, digest: str, prefix: str, recursive: bool,
              after: list[str] | None) -> Iterator[tuple[str, Entry]]:
        """The entries of a tree node (and with ``recursive`` their subtrees), depth first, that
        come after the path whose components below this node are ``after``."""
        for name, entry in self.trees.read(digest).items():
            if after:
                if name < after[0]:
                    continue
                if name == after[0]:
                    if recursive and entry.kind is EntryKind.DIR:
                        yield from self._walk(entry.digest, f"{prefix}{name}/", recursive, after[1:])
                    continue
                after = None
            yield f"{prefix}{name}", entry
            if recursive and entry.kind is EntryKind.DIR:
                yield from self._walk(entry.digest, f"{prefix}{name}/", recursive, None)

    def _content(self, entry: Entry) -> Iterator[bytes]:
        sent = 0
        for chunk in rechunk(self.store.iter_chunks(entry.digest)):
            sent += len(chunk)
            yield chunk
        if sent != entry.size:
            raise DataLoss(Reason.CORRUPT_CONTENT, f"object {entry.digest} holds {sent} bytes, not {entry.size}",
                           digest=entry.digest)

    def export(self, checkpoint_id: str) -> Iterator[bytes]:
        """The checkpoint's tree as a pax tar archive; the checkpoint is looked up before the
        first chunk (so that a bad id fails the call, not the stream)."""
        row = self._files_of(checkpoint_id)
        return self._unless_deleted(row.checkpoint_id, self._archive(row))

    def _unless_deleted(self, checkpoint_id: str, chunks: Iterator[bytes]) -> Iterator[bytes]:
        """``chunks``, as a stream: content missing midway because the checkpoint was deleted (and
        collected) while it was read is NOT_FOUND, not the store's DATA_LOSS."""
        try:
            yield from chunks
        except DataLoss:
            self._not_found_if_deleted(checkpoint_id)
            raise

    def _not_found_if_deleted(self, checkpoint_id: str) -> None:
        not_found_if_deleted(self.db, checkpoint_id)

    def _archive(self, row: CheckpointRow) -> Iterator[bytes]:
        mtime = int(row.create_time.timestamp())
        for path, entry in self.trees.flatten(row.tree_digest):
            info = tarfile.TarInfo(path)
            info.mode = entry.mode & 0o7777
            info.mtime = mtime
            if entry.kind is EntryKind.DIR:
                info.type = tarfile.DIRTYPE
            elif entry.kind is EntryKind.SYMLINK:
                info.type = tarfile.SYMTYPE
                info.linkname = entry.target
            else:
                info.size = entry.size
            yield info.tobuf(tarfile.PAX_FORMAT, "utf-8", "surrogateescape")
            if entry.kind is EntryKind.FILE:
                yield from self._content(entry)
                if entry.size % _BLOCK:
                    yield b"\0" * (_BLOCK - entry.size % _BLOCK)
        yield b"\0" * (2 * _BLOCK)

    def text_diffs(self, base_id: str, target_id: str, changes: list[Change]) -> dict[str, TextDiff]:
        """A text diff (or why there is none) for each change, by path. The target side is read
        from the live workspace when ``target_id`` is empty; a live file that no longer has the
        content the diff saw is UNREADABLE."""
        with self.db.session() as session:
            base = session.get(CheckpointRow, base_id)
            if base is None:
                # Deleted since the diff read it: its live side (which no store holds) is not read there.
                raise NotFound(Reason.CHECKPOINT_NOT_FOUND, f"checkpoint {base_id} not found", checkpoint_id=base_id)
            plan = session.get(PlanRow, base.plan_id) if not target_id else None
        live = Workspace(plan.workspace_root) if plan is not None and plan.workspace_root else None
        budget = MAX_TEXT_DIFF_TOTAL
        give_up_at = time.monotonic() + MAX_TEXT_DIFF_SECONDS
        diffs = {}
        try:
            for change in changes:
                if time.monotonic() > give_up_at:
                    budget = 0
                result = self._text_diff(change, live if not target_id else None, budget)
                budget -= len(result.text)
                diffs[change.path] = result
        except DataLoss:
            # An object collected since the diff: NOT_FOUND if its checkpoint was deleted meanwhile.
            not_found_if_deleted(self.db, *filter(None, (base_id, target_id)))
            raise
        return diffs

    def _text_diff(self, change: Change, live: Workspace | None, budget: int) -> TextDiff:
        sides = [change.base, change.target]
        files = [e for e in sides if e is not None and e.kind is EntryKind.FILE]
        if not files:
            return TextDiff(TextDiffStatus.NOT_A_FILE)
        if any(e.size > MAX_TEXT_DIFF_SIDE for e in files) or budget <= 0:
            return TextDiff(TextDiffStatus.TOO_LARGE)
        contents = []
        for index, entry in enumerate(sides):
            if entry is None or entry.kind is not EntryKind.FILE:
                contents.append(b"")
                continue
            if index == 1 and live is not None:
                data = live.read_small(change.path, MAX_TEXT_DIFF_SIDE)
                if data is None or digest_bytes(data) != entry.digest:
                    return TextDiff(TextDiffStatus.UNREADABLE)
            else:
                data = self.store.read_bytes(entry.digest)
            contents.append(data)
        texts = []
        for data in contents:
            if b"\0" in data:
                return TextDiff(TextDiffStatus.BINARY)
            try:
                texts.append(data.decode("utf-8"))
            except UnicodeDecodeError:
                return TextDiff(TextDiffStatus.BINARY)
        sides_lines = [text.splitlines(keepends=True) for text in texts]
        if any(len(lines) > MAX_TEXT_DIFF_LINES for lines in sides_lines):
            return TextDiff(TextDiffStatus.TOO_LARGE)
        name = change.path.encode("utf-8", "surrogateescape").decode("utf-8", "backslashreplace")
        old = f"a/{name}" if change.base is not None and change.base.kind is EntryKind.FILE else "/dev/null"
        new = f"b/{name}" if change.target is not None and change.target.kind is EntryKind.FILE else "/dev/null"
        lines = difflib.unified_diff(sides_lines[0], sides_lines[1], old, new)
        text = "".join(line if line.endswith("\n") else line + "\n\\ No newline at end of file\n" for line in lines)
        if len(text) > budget:
            return TextDiff(TextDiffStatus.TOO_LARGE)
        return TextDiff(TextDiffStatus.TEXT, text)
