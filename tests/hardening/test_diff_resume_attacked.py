"""Attacks on DiffCheckpoints' resumed pages (7164451: the tree walk resumes at the token's path and,
between two checkpoints, the token carries how many changes the later pages hold): split
directories, odd names, paths= subsets, pages cut at 16 MiB, tokens used elsewhere or edited,
checkpoints deleted (and collected) between or during pages, the live workspace changed at the
token's path, paths as long as a workspace can hold. What held stays as a regression test; what
did not is marked xfail (strict) with its cause."""

from __future__ import annotations

import os
import random
import shutil
from pathlib import Path

import grpc
import pytest
from ulid import ULID

from checkpoint.v1 import checkpoint_service_pb2 as pb
from checkpoint.v1 import checkpoint_service_pb2_grpc as pb_grpc
from checkpointd.api import convert
from checkpointd.api.checkpoint_servicer import CheckpointServicer
from checkpointd.core.capture.snapshot import MAX_DIR_DEPTH
from checkpointd.core.engine.filtering import LONGEST_PATH_KEY
from checkpointd.core.kernel.errors import InvalidArgument, NotFound
from checkpointd.core.store import tree as tree_module
from checkpointd.core.store.tree import EntryKind
from tests.core.restore.test_rollback_write_path_attacked import Plan, write
from tests.hardening.support import start_with_faults
from tests.helpers import checkpoint_id_of, nodes_read, refused
from tests.ops.test_maintenance_engine import Engine as MaintenanceEngine


@pytest.fixture
def plan(tmp_path):
    opened = Plan(tmp_path)
    try:
        yield opened
    finally:
        opened.close()


def _split(monkeypatch, entries: int) -> None:
    """Directories of more than ``entries`` children stored split, in this process (as the server's
    CHECKPOINTD_TREE_SPLIT_ENTRIES does at start)."""
    monkeypatch.setattr(tree_module, "SPLIT_ENTRIES", entries)
    monkeypatch.setattr(tree_module, "PART_MASK", (1 << max(1, (entries // 4).bit_length() - 1)) - 1)
    monkeypatch.setattr(tree_module, "PART_MAX_ENTRIES", 2 * entries)


def _key(change) -> bytes:
    return change.raw_path or change.path.encode()


def _request(base, target="", **fields) -> pb.DiffCheckpointsRequest:
    return pb.DiffCheckpointsRequest(base_checkpoint_id=base, target_checkpoint_id=target, **fields)


def _pages(call, base, target="", between=None, **fields) -> list[tuple[list[bytes], int]]:
    """Every page's (paths as bytes, changes_omitted), following the tokens; ``between(n)`` runs after page n."""
    pages, token = [], ""
    for _ in range(3000):
        response = call(_request(base, target, page_token=token, **fields))
        pages.append(([_key(c) for c in response.changes], response.changes_omitted))
        token = response.next_page_token
        if not token:
            return pages
        if between is not None:
            between(len(pages))
    pytest.fail("the pages never end")


def _assert_pages_are(pages, expected: list[bytes]) -> None:
    """The pages list ``expected`` in order, each path once, and each counts exactly what is left."""
    assert [p for paths, _ in pages for p in paths] == expected
    left = len(expected)
    for paths, omitted in pages:
        left -= len(paths)
        assert omitted == left, (paths, omitted, left)


def _in_process(plan):
    servicer = CheckpointServicer(getattr(plan, "engine", None) or plan.checkpoints)
    return lambda request: servicer.DiffCheckpoints(request, None)


def _under(key: bytes, paths) -> bool:
    return not paths or any(key == p or key.startswith(p + b"/") for p in paths)


#: Names that sort around '/', '.', '-' and one another, not UTF-8 (a surrogate escape), accented.
ODD = [b"a", b"a!", b"a-b", b"a.txt", b"a0", b"a b", b"-", b"\xff", b"\xc3\xa9", b"\xef\xbc\x81", b"z"]
DIRS = [b"", b"a", b"a/a0", b"\xff", b"n03", b"a.txt"]


class _Mutator:
    """Random file, directory, kind and mode changes in a workspace (odd names, split directories)."""

    def __init__(self, root: Path, seed: int) -> None:
        self.root = os.fsencode(root)
        self.random = random.Random(seed)
        self.names = ODD + [b"n%02d" % i for i in range(25)]

    def __call__(self, count: int) -> None:
        rnd = self.random
        for _ in range(count):
            path = os.path.join(self.root, rnd.choice(DIRS), rnd.choice(self.names)).rstrip(b"/")
            op = rnd.random()
            try:
                if op < 0.5:
                    os.makedirs(os.path.dirname(path), exist_ok=True)
                    if os.path.isdir(path):
                        shutil.rmtree(path)
                    with open(path, "wb") as f:
                        f.write(bytes([rnd.randrange(3)]))
                elif op < 0.7:
                    if os.path.isdir(path):
                        shutil.rmtree(path)
                    elif os.path.lexists(path):
                        os.unlink(path)
                elif op < 0.85:
                    if os.path.isfile(path):
                        os.unlink(path)
                    os.makedirs(path, exist_ok=True)
                elif os.path.exists(path):
                    os.chmod(path, rnd.choice([0o700, 0o755, 0o644, 0o600]))
            except (NotADirectoryError, FileExistsError, FileNotFoundError):
                pass


def _reference(plan, base_row, target_row) -> list[bytes]:
    """The diff of two checkpoints worked out from their flattened trees, in component-list order."""
    sides = [dict(plan.engine.trees.flatten(row.tree_digest)) for row in (base_row, target_row)]
    out = []
    for path in sides[0].keys() | sides[1].keys():
        b, t = sides[0].get(path), sides[1].get(path)
        if b == t or (b is not None and t is not None and b.kind is t.kind is EntryKind.DIR and b.mode == t.mode):
            continue
        out.append(path)
    return [os.fsencode(p) for p in sorted(out, key=lambda p: p.split("/"))]


# --- in process: split directories, subsets, 16 MiB cuts ------------------------------------------

@pytest.mark.parametrize("seed", range(10))
def test_pages_between_split_checkpoints_are_the_whole_diff_and_count_what_is_left(plan, monkeypatch, seed):
    """Held: pages of every size, with and without paths=, resumed in split directories (parts
    shared or not), at odd names, kinds flipped and modes changed, list the whole diff once in its
    order, and each page's carried count is exactly what the later pages hold."""
    mutate = _Mutator(plan.root, seed)
    _split(monkeypatch, random.Random(seed).choice([2, 3, 4, 8]))
    mutate(150)
    base_row = plan.checkpoint()
    mutate(random.Random(seed).choice([5, 40, 150]))
    target_row = plan.checkpoint()
    assert tree_module.is_index(plan.store.read_bytes(target_row.tree_digest))
    call = _in_process(plan)
    base, target = base_row.checkpoint_id, target_row.checkpoint_id
    expected = [_key(c) for c in call(_request(base, target)).changes]
    assert expected == _reference(plan, base_row, target_row)
    for raw_paths in ([], [b"a"], [b"n03", b"a/a0"], [b"\xff", b"a.txt"]):
        wanted = [k for k in expected if _under(k, raw_paths)]
        for size in (1, 2, 3, 7):
            _assert_pages_are(_pages(call, base, target, page_size=size, raw_paths=raw_paths), wanted)


@pytest.mark.parametrize("seed", range(8))
def test_live_pages_of_split_directories_are_the_rest_of_a_new_look(plan, monkeypatch, seed):
    """Held: against the live workspace, changed between the pages (also at and around the token's
    path), each page is the start of what differs now after the last path listed, counted anew."""
    mutate = _Mutator(plan.root, seed)
    rnd = random.Random(seed)
    _split(monkeypatch, rnd.choice([2, 3, 4, 8]))
    mutate(150)
    base = plan.checkpoint().checkpoint_id
    mutate(60)
    call = _in_process(plan)
    paths, size = rnd.choice([[], ["a"], ["n03", "a/a0"]]), rnd.choice([1, 2, 3, 7])
    token, last = "", None
    for _ in range(500):
        now = [_key(c) for c in call(_request(base, paths=paths)).changes]
        if last is not None:
            now = [k for k in now if k.split(b"/") > last.split(b"/")]
        response = call(_request(base, paths=paths, page_size=size, page_token=token))
        listed = [_key(c) for c in response.changes]
        assert listed == now[:size]
        assert response.changes_omitted == len(now) - len(listed)
        token = response.next_page_token
        if not token:
            return
        last = listed[-1]
        mutate(rnd.choice([0, 1, 5]))
    pytest.fail("the pages never end")


@pytest.mark.parametrize("live", [False, True])
def test_pages_cut_at_the_byte_limit_count_and_resume_right(plan, monkeypatch, live):
    """Held: a page that ends early at LISTED_CHANGES_BYTES (lowered here; with text diffs) counts
    the cut changes in changes_omitted and in its token's count, and the next page starts at the
    first change cut, whatever the page size."""
    for i in range(12):
        write(plan.root / f"d{i % 3}/f{i:02}.txt", f"old {i}\n" * 20)
    base = plan.checkpoint().checkpoint_id
    for i in range(12):
        write(plan.root / f"d{i % 3}/f{i:02}.txt", f"new {i}\n" * 20)
    os.chmod(plan.root / "d1", 0o700)
    target = "" if live else plan.checkpoint().checkpoint_id
    call = _in_process(plan)
    expected = [_key(c) for c in call(_request(base, target)).changes]
    monkeypatch.setattr(convert, "LISTED_CHANGES_BYTES", 700)
    for size in (0, 1, 3, 5, 50):
        pages = _pages(call, base, target, page_size=size, text_diffs=True)
        assert len(pages) > len(expected) // max(size, 1) // 2 + 1 or size == 1
        _assert_pages_are(pages, expected)


def _rewritten(plan, files: int) -> tuple[str, str]:
    """Two checkpoints ``files`` rewritten files apart (f0, f1, ...)."""
    for i in range(files):
        write(plan.root / f"f{i}", "old")
    base = plan.checkpoint().checkpoint_id
    for i in range(files):
        write(plan.root / f"f{i}", "new")
    return base, plan.checkpoint().checkpoint_id


def test_an_edited_count_isrefused(plan):
    """Held: the count rides inside the HMAC'd key: a token whose count digits are changed (or
    whose count is taken off) is INVALID_PAGE_TOKEN, never trusted."""
    base, target = _rewritten(plan, 6)
    call = _in_process(plan)
    token = call(_request(base, target, page_size=1)).next_page_token
    key = plan.engine.page_tokens.check_after_path(token, f"DiffCheckpoints\0{base}\0{target}\0{0}", "")
    assert key.remaining == 5 and key.path == "f0"
    for position in (2, 3):  # the version byte, then the count's digits
        forged = token[:position] + ("A" if token[position] != "A" else "B") + token[position + 1:]
        with pytest.raises(InvalidArgument):
            call(_request(base, target, page_size=1, page_token=forged))


def test_a_counted_token_is_refused_by_a_release_that_knows_only_path_keys(plan):
    """A replica of the release before (during a rolling upgrade) read a path token with
    ``check_after``, which knows key tokens of version 2 only: the counted token has a version of
    its own, so it is INVALID_PAGE_TOKEN there, not a path misread from the count's digits."""
    base, target = _rewritten(plan, 3)
    token = _in_process(plan)(_request(base, target, page_size=1)).next_page_token
    scope = f"DiffCheckpoints\0{base}\0{target}\0{0}"
    assert plan.engine.page_tokens.check_after_path(token, scope, "").remaining == 2
    with pytest.raises(InvalidArgument):
        plan.engine.page_tokens.check_after(token, scope, "", LONGEST_PATH_KEY + 21)


def test_a_path_as_long_as_a_workspace_holds_pages_on(plan):
    """Held: the longest path a capture keeps (MAX_DIR_DEPTH directories of 255-byte names, not
    UTF-8: 64 KiB, under LONGEST_PATH_KEY's 96 KiB) makes a token, with its count, that the next
    page accepts, also on pages cut at 16 MiB; ListCheckpointFiles too."""
    plan.checkpoint()
    base_row = plan.checkpoint()
    base = base_row.checkpoint_id
    fd = os.open(plan.root, os.O_RDONLY | os.O_DIRECTORY)
    try:
        for _ in range(MAX_DIR_DEPTH + 2):
            os.mkdir(b"\xff" * 255, dir_fd=fd)
            fd, parent = os.open(b"\xff" * 255, os.O_RDONLY | os.O_DIRECTORY, dir_fd=fd), fd
            os.close(parent)
        for name in (b"f1", b"f2"):
            os.close(os.open(name, os.O_WRONLY | os.O_CREAT, 0o644, dir_fd=fd))
    finally:
        os.close(fd)
    target_row = plan.checkpoint()
    target = target_row.checkpoint_id
    whole = _reference(plan, base_row, target_row)
    assert len(whole) == MAX_DIR_DEPTH and len(max(whole, key=len)) > 65_000  # deeper: skipped
    call = _in_process(plan)
    for side in (target, ""):
        # As many as fit: the pages end at 16 MiB (each change's escaped path and raw_path ~330 KB).
        cut = _pages(call, base, side)
        assert len(cut) > 1
        _assert_pages_are(cut, whole)
        _assert_pages_are(_pages(call, base, side, page_size=1), whole)
    servicer = CheckpointServicer(plan.engine)
    listed, token = 0, ""
    while True:
        page = servicer.ListCheckpointFiles(pb.ListCheckpointFilesRequest(checkpoint_id=target, recursive=True,
                                                                          page_size=1, page_token=token), None)
        listed += len(page.files)
        token = page.next_page_token
        if not token:
            break
    assert listed == len(whole)


def _parts_read(plan, call) -> int:
    """How many nodes ``call`` reads that are parts of a split directory (not indexes)."""
    trees = plan.engine.trees
    return sum(1 for digest in nodes_read(trees, call) if not isinstance(trees._node(digest), tree_module.Index))


def test_a_page_resumed_in_a_split_directory_reads_only_the_parts_of_its_own_changes(plan, monkeypatch):
    _split(monkeypatch, 8)
    write(plan.root / "keep", "x")
    base = plan.checkpoint().checkpoint_id
    for i in range(400):
        write(plan.root / f"big/f{i:04}", str(i))
    target = plan.checkpoint().checkpoint_id
    assert len(plan.engine.trees.parts(plan.engine.trees.lookup(
        plan.engine.get(target).row.tree_digest, "big").digest)) > 100
    call = _in_process(plan)
    token = ""
    for _ in range(38):  # to the last pages: the token's name sorts after nearly every part
        token = call(_request(base, target, page_size=10, page_token=token)).next_page_token
    responses = []
    read = _parts_read(plan, lambda: responses.append(call(_request(base, target, page_size=10, page_token=token))))
    assert [c.path for c in responses[0].changes] == [f"big/f{i:04}" for i in range(379, 389)]  # after big, f0000..
    assert read <= 12, f"a page of 10 changes read {read} parts of the directory"


# --- in process: deleted and collected while a resumed page reads ---------------------------------

@pytest.fixture
def maintained(tmp_path):
    engine = MaintenanceEngine(tmp_path, "disk")
    try:
        yield engine
    finally:
        engine.close()


@pytest.mark.parametrize("doomed", ["base", "target"])
def test_a_checkpoint_deleted_and_collected_during_a_resumed_page_is_not_found(maintained, monkeypatch, doomed):
    """Held: the resumed walk (lazy, cut at the page size) runs inside the DataLoss guard: a side
    deleted and collected after the page loaded its rows is NOT_FOUND, never DATA_LOSS/INTERNAL."""
    workspace = maintained.workspace()
    for i in range(6):
        write(workspace / f"d{i}/f.txt", f"old {i}")
    plan_id = str(ULID())
    base = maintained.create(plan_id, workspace)
    for i in range(6):
        write(workspace / f"d{i}/f.txt", f"new {i}")
    target = maintained.create(plan_id, workspace)
    call = _in_process(maintained)
    token = call(_request(base.checkpoint_id, target.checkpoint_id, page_size=2)).next_page_token
    trees = maintained.checkpoints.trees
    real_diff = trees.diff
    fired: list[bool] = []

    def collected_before_the_walk(*args, **kwargs):
        if not fired:
            fired.append(True)
            maintained.checkpoints.delete((base if doomed == "base" else target).checkpoint_id)
            assert maintained.maintenance.collect_garbage().deleted_objects >= 1
            with trees._cache_lock:
                trees._cache.clear()
        return real_diff(*args, **kwargs)

    monkeypatch.setattr(trees, "diff", collected_before_the_walk)
    with pytest.raises(NotFound):
        call(_request(base.checkpoint_id, target.checkpoint_id, page_size=2, page_token=token))
    assert fired


# --- over gRPC: tokens used elsewhere, deletions between pages, the live token path ---------------


def _three(stub, workspace, plan_id) -> tuple[str, str]:
    for i in range(5):
        write(workspace / f"d{i}/f.txt", f"old {i}")
    base = checkpoint_id_of(stub, plan_id, workspace)
    for i in range(5):
        write(workspace / f"d{i}/f.txt", f"new {i}")
    return base, checkpoint_id_of(stub, plan_id)


def test_a_token_works_only_for_its_own_sides_and_kind(checkpoint_stub, workspace, plan_id):
    """Held: a token of A->B (with its count) is refused for B->A, A->live, A->A and another B; a
    live token for A->B; a diff token by ListCheckpointFiles and a ListCheckpointFiles token by
    DiffCheckpoints; ListCheckpointFiles still pages with the shared path tokens."""
    base, target = _three(checkpoint_stub, workspace, plan_id)
    other = checkpoint_id_of(checkpoint_stub, plan_id)
    diff = checkpoint_stub.DiffCheckpoints
    forward = diff(_request(base, target, page_size=2)).next_page_token
    live = diff(_request(base, page_size=2)).next_page_token
    assert forward and live
    for request in (_request(target, base, page_token=forward), _request(base, page_token=forward),
                    _request(base, base, page_token=forward), _request(base, other, page_token=forward),
                    _request(base, target, page_token=live), _request(target, page_token=live)):
        refused(lambda r=request: diff(r), grpc.StatusCode.INVALID_ARGUMENT, "INVALID_PAGE_TOKEN")
    files = checkpoint_stub.ListCheckpointFiles
    for token in (forward, live):
        refused(lambda t=token: files(pb.ListCheckpointFilesRequest(checkpoint_id=base, recursive=True,
                                                                     page_token=t)),
                 grpc.StatusCode.INVALID_ARGUMENT, "INVALID_PAGE_TOKEN")
    listed, token = [], ""
    while True:
        page = files(pb.ListCheckpointFilesRequest(checkpoint_id=target, recursive=True, page_size=3,
                                                   page_token=token))
        listed += [f.path for f in page.files]
        token = page.next_page_token
        if not token:
            break
        refused(lambda t=token: diff(_request(target, page_token=t)), grpc.StatusCode.INVALID_ARGUMENT,
                 "INVALID_PAGE_TOKEN")
    assert listed == [p for i in range(5) for p in (f"d{i}", f"d{i}/f.txt")]


@pytest.mark.parametrize("doomed", ["base", "target"])
def test_a_checkpoint_deleted_between_pages_is_not_found(checkpoint_stub, workspace, plan_id, doomed):
    """Held: the next page of a counted token, a side deleted since, is NOT_FOUND (with text diffs too)."""
    for text_diffs in (False, True):
        base, target = _three(checkpoint_stub, workspace, plan_id)
        request = _request(base, target, page_size=2, text_diffs=text_diffs)
        request.page_token = checkpoint_stub.DiffCheckpoints(request).next_page_token
        checkpoint_stub.DeleteCheckpoint(pb.DeleteCheckpointRequest(
            checkpoint_id=base if doomed == "base" else target))
        refused(lambda r=request: checkpoint_stub.DiffCheckpoints(r), grpc.StatusCode.NOT_FOUND,
                 "CHECKPOINT_NOT_FOUND")


def test_a_live_diff_changed_at_the_tokens_path_lists_what_sorts_after_it(checkpoint_stub, workspace, plan_id):
    """Held: between live pages the token's file becomes a directory (its children are listed, it is
    not again), the token's directory becomes a file (its base children after the token are listed
    as deleted), the token's path is deleted, a directory on the resume path changes mode only."""
    for name in ("a", "b", "c", "e"):
        write(workspace / name / "x", "old")
        write(workspace / name / "y", "old")
    write(workspace / "f", "old")
    base = checkpoint_id_of(checkpoint_stub, plan_id, workspace)
    for name in ("a", "b", "c", "e"):
        write(workspace / name / "x", "new")
        write(workspace / name / "y", "new")
    write(workspace / "f", "new")

    def between(page: int) -> None:
        if page == 1:  # a/x, a/y listed
            shutil.rmtree(workspace / "b")
            write(workspace / "b", "b is a file now")  # after a/y: listed
        elif page == 2:  # b, b/x listed
            (workspace / "b").unlink()  # the token's directory's... gone: b/y deleted, after b/x
            os.chmod(workspace / "c", 0o700)  # mode only, after the token: listed
        elif page == 3:  # b/y, c listed
            shutil.rmtree(workspace / "c")
            write(workspace / "c", "c is a file")  # c itself was listed; its children are deleted after it
        elif page == 5:  # e/x, e/y listed (after c/x, c/y)
            (workspace / "f").unlink()
            (workspace / "f").mkdir()
            write(workspace / "f" / "g", "new child")

    pages = _pages(checkpoint_stub.DiffCheckpoints, base, between=between, page_size=2)
    assert [p for paths, _ in pages for p in paths] == [
        b"a/x", b"a/y", b"b", b"b/x", b"b/y", b"c", b"c/x", b"c/y", b"e/x", b"e/y", b"f", b"f/g"]


def test_pages_of_a_server_with_split_directories(idle_server, plan_id):
    """Held: a server whose directories of more than two entries are stored split pages checkpoint and
    live diffs of odd names (not UTF-8 included), each page counting what is left."""
    start_with_faults(idle_server, CHECKPOINTD_TREE_SPLIT_ENTRIES="2")
    workspace = idle_server.new_workspace()
    root = os.fsencode(workspace)
    for name in ODD[:5]:
        os.mkdir(os.path.join(root, name))
        for child in ODD:
            with open(os.path.join(root, name, child), "wb") as f:
                f.write(b"old " + name + child)
    with grpc.insecure_channel(idle_server.tcp_target) as channel:
        stub = pb_grpc.CheckpointServiceStub(channel)
        base = checkpoint_id_of(stub, plan_id, workspace)
        for name in ODD:
            os.makedirs(os.path.join(root, name), exist_ok=True)
            for child in ODD[::2]:
                with open(os.path.join(root, name, child), "wb") as f:
                    f.write(b"new " + name + child)
        os.chmod(os.path.join(root, b"a"), 0o700)
        target = checkpoint_id_of(stub, plan_id)
        for side in (target, ""):
            expected = [_key(c) for c in stub.DiffCheckpoints(_request(base, side)).changes]
            assert len(expected) > 40
            for size in (1, 4, 9):
                _assert_pages_are(_pages(stub.DiffCheckpoints, base, side, page_size=size), expected)
            wanted = [b"\xff", b"a"]
            _assert_pages_are(_pages(stub.DiffCheckpoints, base, side, page_size=3, raw_paths=wanted),
                              [k for k in expected if k.split(b"/")[0] in wanted])
