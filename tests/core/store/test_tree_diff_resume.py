"""A diff resumed after a path (a DiffCheckpoints page token's) lists exactly the changes of the
whole diff that sort after it, in the same order, and reads no subtree that sorts wholly before
it: the order is that of the paths' component lists, so ``a/b`` comes before ``a.txt``."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from checkpointd.core.store.content_store import ContentStore, digest_bytes
from checkpointd.core.store.tree import EMPTY_TREE, Entry, EntryKind, Trees

#: Names that sort around one another and around '/': a directory's children must come before a
#: sibling named like it with a suffix ('a' < 'a-b' < 'a.txt' < 'a0', while 'a/...' < 'a-b').
NAMES = ("a", "a-b", "a.txt", "a0", "b", "z")


@pytest.fixture(scope="module")
def trees(tmp_path_factory):
    store = ContentStore(tmp_path_factory.mktemp("store"))
    yield Trees(store)
    store.close()


def _file(text: str) -> Entry:
    return Entry(EntryKind.FILE, 0o644, len(text), digest_bytes(text.encode()))


def _tree(trees: Trees, layout: dict) -> str:
    """Stores a nested {name: text | {...}} layout, returns its digest."""
    children = {name: (Entry(EntryKind.DIR, 0o755, 0, _tree(trees, sub)) if isinstance(sub, dict) else _file(sub))
                for name, sub in layout.items()}
    with trees.store.batch() as batch:
        return trees.write(batch, children) if children else EMPTY_TREE


_layouts = st.recursive(st.sampled_from(["x", "y"]),
                        lambda inner: st.dictionaries(st.sampled_from(NAMES), inner, max_size=4), max_leaves=14)
_roots = st.dictionaries(st.sampled_from(NAMES), _layouts, max_size=5)
_paths = st.lists(st.sampled_from(NAMES), min_size=1, max_size=4)


@settings(max_examples=150, deadline=None, derandomize=True)
@given(base=_roots, target=_roots, elsewhere=st.lists(_paths, max_size=3))
def test_a_resumed_diff_is_the_rest_of_the_whole_diff(trees, base, target, elsewhere):
    base_digest, target_digest = _tree(trees, base), _tree(trees, target)
    whole = [(c.path, c.base, c.target) for c in trees.diff(base_digest, target_digest)]
    # Resume after every path listed, and after paths the diff does not hold (a live diff's
    # path that changed back between two pages).
    for after in [path.split("/") for path, _, _ in whole] + elsewhere:
        resumed = [(c.path, c.base, c.target) for c in trees.diff(base_digest, target_digest, after=tuple(after))]
        assert resumed == [change for change in whole if change[0].split("/") > after], after


def test_a_resumed_diff_reads_no_subtree_before_its_path(trees, monkeypatch):
    """Twenty changed directories; resumed in the tenth, the first nine are not read."""
    base = {f"d{i:02}": {f"f{j:02}": f"old {i}" for j in range(5)} for i in range(20)}
    target = {f"d{i:02}": {f"f{j:02}": f"new {i}" for j in range(5)} for i in range(20)}
    base_digest, target_digest = _tree(trees, base), _tree(trees, target)
    skipped = {trees.lookup(root, f"d{i:02}").digest for root in (base_digest, target_digest) for i in range(9)}
    read: list[str] = []
    node = trees._node
    monkeypatch.setattr(trees, "_node", lambda digest: read.append(digest) or node(digest))
    resumed = [c.path for c in trees.diff(base_digest, target_digest, after=("d09", "f02"))]
    assert resumed[:3] == ["d09/f03", "d09/f04", "d10/f00"] and len(resumed) == 2 + 10 * 5
    assert read and not skipped & set(read)
