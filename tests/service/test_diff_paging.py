"""DiffCheckpoints a page at a time (AIP-158): the pages together are the whole diff, in its order,
each path once; a token is bound to its request; against the live workspace each page is a new
look that never lists a path twice."""

from __future__ import annotations

import grpc

from checkpoint.v1 import checkpoint_service_pb2 as pb
from tests.helpers import checkpoint_id_of, refused


def _diff(stub, base, target="", **fields):
    return stub.DiffCheckpoints(pb.DiffCheckpointsRequest(base_checkpoint_id=base, target_checkpoint_id=target,
                                                          **fields))


def _pages(stub, base, target="", between=None, **fields):
    """Each page's (paths, changes_omitted), following the tokens; ``between(n)`` runs after page n."""
    pages, token = [], ""
    while True:
        response = _diff(stub, base, target, page_token=token, **fields)
        pages.append(([c.path for c in response.changes], response.changes_omitted))
        assert len(pages) <= 100, "the pages never end"
        token = response.next_page_token
        if not token:
            return pages
        if between is not None:
            between(len(pages))


def _two_checkpoints(stub, workspace, plan_id):
    """A diff of 7 changes whose order is not the paths' string order: a directory's children
    come before a sibling whose name sorts after the directory's ('a/...' before 'a.txt')."""
    (workspace / "a").mkdir()
    (workspace / "gone.txt").write_text("bye")
    base = checkpoint_id_of(stub, plan_id, workspace)
    for path in ("a/b.txt", "a/c/d.txt", "a.txt", "b.txt", "z/y.txt"):
        (workspace / path).parent.mkdir(exist_ok=True)
        (workspace / path).write_text(path)
    (workspace / "gone.txt").unlink()
    return base, checkpoint_id_of(stub, plan_id)


def test_pages_of_every_size_add_up_to_the_whole_diff_in_its_order(checkpoint_stub, workspace, plan_id):
    base, target = _two_checkpoints(checkpoint_stub, workspace, plan_id)
    whole = _diff(checkpoint_stub, base, target)
    expected = [c.path for c in whole.changes]
    assert expected == ["a/b.txt", "a/c", "a/c/d.txt", "a.txt", "b.txt", "gone.txt", "z", "z/y.txt"]
    assert whole.changes_omitted == 0 and whole.next_page_token == ""
    for size in (1, 2, 3, 7, 8, 50):
        pages = _pages(checkpoint_stub, base, target, page_size=size)
        assert [p for paths, _ in pages for p in paths] == expected, size
        assert all(len(paths) == min(size, len(expected) - size * i) for i, (paths, _) in enumerate(pages))
        # What each page leaves for the later ones is counted.
        assert [omitted for _, omitted in pages] == [max(0, len(expected) - size * (i + 1))
                                                      for i in range(len(pages))]


def test_a_page_token_is_bound_to_its_request(checkpoint_stub, workspace, plan_id):
    base, target = _two_checkpoints(checkpoint_stub, workspace, plan_id)
    token = _diff(checkpoint_stub, base, target, page_size=2).next_page_token
    assert token
    assert [c.path for c in _diff(checkpoint_stub, base, target, page_size=2, page_token=token).changes] == [
        "a/c/d.txt", "a.txt"]
    for other in ({"target": ""}, {"paths": ["a"]}, {"text_diffs": True}):
        fields = {"target": target, "page_size": 2, "page_token": token} | other
        refused(lambda f=fields: _diff(checkpoint_stub, base, **f), grpc.StatusCode.INVALID_ARGUMENT,
                "INVALID_PAGE_TOKEN")
    refused(lambda: _diff(checkpoint_stub, target, base, page_token=token), grpc.StatusCode.INVALID_ARGUMENT,
            "INVALID_PAGE_TOKEN")
    # A character changed in the middle (the last one may carry only base64's unused bits, and
    # another spelling of the same token is that token).
    for forged in ("x", token[:-2], token[:10] + ("A" if token[10] != "A" else "B") + token[11:]):
        refused(lambda t=forged: _diff(checkpoint_stub, base, target, page_token=t), grpc.StatusCode.INVALID_ARGUMENT,
                "INVALID_PAGE_TOKEN")
    refused(lambda: _diff(checkpoint_stub, base, target, page_size=-1), grpc.StatusCode.INVALID_ARGUMENT,
            "INVALID_PAGE_SIZE")


def test_paths_and_text_diffs_page_too(checkpoint_stub, workspace, plan_id):
    base, target = _two_checkpoints(checkpoint_stub, workspace, plan_id)
    pages = _pages(checkpoint_stub, base, target, page_size=1, paths=["a", "z"], text_diffs=True)
    assert [p for paths, _ in pages for p in paths] == ["a/b.txt", "a/c", "a/c/d.txt", "z", "z/y.txt"]
    response = _diff(checkpoint_stub, base, target, paths=["a"], text_diffs=True, page_size=1)
    assert "\n+a/b.txt\n" in response.changes[0].text_diff


def test_a_live_diff_lists_each_path_once_however_the_workspace_changes_between_pages(
        checkpoint_stub, workspace, plan_id):
    for name in ("b", "d", "f"):
        (workspace / name).write_text("old")
    base = checkpoint_id_of(checkpoint_stub, plan_id, workspace)
    for name in ("b", "d", "f"):
        (workspace / name).write_text("new")

    def change_between(page: int) -> None:
        if page == 1:  # "b" was listed: "a" sorts before it, "e" after
            (workspace / "a").write_text("added before the last path listed")
            (workspace / "e").write_text("added after it")
            (workspace / "d").write_text("old")  # back as it was: no longer differs

    pages = _pages(checkpoint_stub, base, between=change_between, page_size=1)
    assert [p for paths, _ in pages for p in paths] == ["b", "e", "f"]
    # A diff taken now sees all of them.
    assert [c.path for c in _diff(checkpoint_stub, base).changes] == ["a", "b", "e", "f"]
