"""ListCheckpointFiles over a real server: a directory as it was, its paging and its errors."""

from __future__ import annotations

import os

import grpc
from ulid import ULID

from checkpoint.v1 import checkpoint_service_pb2 as pb
from tests.helpers import error_info, refused


def _checkpoint(stub, plan_id, root):
    return stub.CreateCheckpoint(pb.CreateCheckpointRequest(plan_id=plan_id, workspace_root=str(root))).checkpoint


def _list(stub, checkpoint_id, path="", **fields):
    return stub.ListCheckpointFiles(pb.ListCheckpointFilesRequest(checkpoint_id=checkpoint_id, path=path, **fields))


def _all_pages(stub, checkpoint_id, path="", **fields):
    """Every page's paths, and how many pages there were."""
    paths, token, pages = [], "", 0
    while True:
        response = _list(stub, checkpoint_id, path, page_token=token, **fields)
        paths += [f.path for f in response.files]
        pages += 1
        assert pages <= 100, "the pages never end"
        token = response.next_page_token
        if not token:
            return paths, pages


def _tree(workspace):
    (workspace / "src" / "pkg").mkdir(parents=True)
    (workspace / "src" / "pkg" / "mod.py").write_text("x = 1\n")
    (workspace / "src" / "a.py").write_text("print('a')\n")
    (workspace / "src" / "a.py").chmod(0o640)
    (workspace / "src" / "z.txt").write_text("z")
    (workspace / "README").write_text("hello")
    (workspace / "link").symlink_to("src/a.py")


def test_lists_a_directory_as_it_was_with_types_sizes_modes_and_targets(checkpoint_stub, workspace, plan_id):
    _tree(workspace)
    first = _checkpoint(checkpoint_stub, plan_id, workspace)
    (workspace / "src" / "a.py").write_text("changed later, and longer\n")
    (workspace / "src" / "new.py").write_text("")
    _checkpoint(checkpoint_stub, plan_id, workspace)

    root = {f.path: f for f in _list(checkpoint_stub, first.checkpoint_id).files}
    assert list(root) == ["README", "link", "src"]
    assert root["README"].entry_type == pb.ENTRY_TYPE_FILE and root["README"].size_bytes == 5
    assert root["link"].entry_type == pb.ENTRY_TYPE_SYMLINK and root["link"].symlink_target == "src/a.py"
    assert root["src"].entry_type == pb.ENTRY_TYPE_DIRECTORY and root["src"].size_bytes == 0
    assert root["README"].symlink_target == "" and root["README"].raw_path == b""

    src = {f.path: f for f in _list(checkpoint_stub, first.checkpoint_id, "src/").files}
    assert list(src) == ["src/a.py", "src/pkg", "src/z.txt"]
    assert src["src/a.py"].size_bytes == len("print('a')\n") and src["src/a.py"].mode == 0o640

    everything = [f.path for f in _list(checkpoint_stub, first.checkpoint_id, recursive=True).files]
    assert everything == ["README", "link", "src", "src/a.py", "src/pkg", "src/pkg/mod.py", "src/z.txt"]


def test_pages_walk_the_whole_listing_once_in_order(checkpoint_stub, workspace, plan_id):
    for top in ("a", "b", "c"):
        for inner in ("x", "y"):
            (workspace / top / inner).mkdir(parents=True)
            for name in ("1", "2", "3"):
                (workspace / top / inner / name).write_text(name)
    cp = _checkpoint(checkpoint_stub, plan_id, workspace)
    whole = [f.path for f in _list(checkpoint_stub, cp.checkpoint_id, recursive=True, page_size=1000).files]
    assert len(whole) == 3 * (1 + 2 * (1 + 3))
    for size in (1, 2, 4, 7):
        paths, pages = _all_pages(checkpoint_stub, cp.checkpoint_id, recursive=True, page_size=size)
        assert paths == whole and pages == -(-len(whole) // size), size
    under_b, _ = _all_pages(checkpoint_stub, cp.checkpoint_id, "b", recursive=True, page_size=3)
    assert under_b == [p for p in whole if p.startswith("b/")]
    flat, pages = _all_pages(checkpoint_stub, cp.checkpoint_id, "a", page_size=1)
    assert flat == ["a/x", "a/y"] and pages == 2


def test_a_page_token_only_continues_the_listing_it_came_from(checkpoint_stub, workspace, plan_id):
    for name in ("a", "b", "c"):
        (workspace / "d" / name).mkdir(parents=True)
    cp = _checkpoint(checkpoint_stub, plan_id, workspace)
    other = _checkpoint(checkpoint_stub, plan_id, workspace)
    token = _list(checkpoint_stub, cp.checkpoint_id, "d", page_size=1).next_page_token
    assert token
    for changed in ({"checkpoint_id": other.checkpoint_id, "path": "d"},
                    {"checkpoint_id": cp.checkpoint_id, "path": ""},
                    {"checkpoint_id": cp.checkpoint_id, "path": "d", "recursive": True},
                    {"checkpoint_id": cp.checkpoint_id, "path": "d", "page_token": token[:-2] + "AA"}):
        fields = {"page_token": token, **changed}
        refused(lambda f=fields: checkpoint_stub.ListCheckpointFiles(pb.ListCheckpointFilesRequest(**f)),
                grpc.StatusCode.INVALID_ARGUMENT, "INVALID_PAGE_TOKEN")
    refused(lambda: _list(checkpoint_stub, cp.checkpoint_id, page_size=-1), grpc.StatusCode.INVALID_ARGUMENT,
            "INVALID_PAGE_SIZE")


def test_a_name_that_is_not_utf8_is_listed_and_named_by_its_raw_bytes(checkpoint_stub, workspace, plan_id):
    directory = os.path.join(os.fsencode(workspace), b"d\xe9j\xe0")
    os.mkdir(directory)
    with open(os.path.join(directory, b"caf\xe9"), "wb") as f:
        f.write(b"bytes")
    os.symlink(b"caf\xe9", os.path.join(directory, b"ln"))
    cp = _checkpoint(checkpoint_stub, plan_id, workspace)
    [listed] = _list(checkpoint_stub, cp.checkpoint_id).files
    assert listed.raw_path == b"d\xe9j\xe0" and listed.path == "d\\xe9j\\xe0"
    inside = checkpoint_stub.ListCheckpointFiles(pb.ListCheckpointFilesRequest(
        checkpoint_id=cp.checkpoint_id, raw_path=listed.raw_path, page_size=1))
    assert [f.raw_path for f in inside.files] == [b"d\xe9j\xe0/caf\xe9"]
    rest = checkpoint_stub.ListCheckpointFiles(pb.ListCheckpointFilesRequest(
        checkpoint_id=cp.checkpoint_id, raw_path=listed.raw_path, page_token=inside.next_page_token))
    [link] = rest.files
    assert link.raw_path == b"d\xe9j\xe0/ln" and link.raw_symlink_target == b"caf\xe9" and not rest.next_page_token


def test_what_cannot_be_listed_says_why(checkpoint_stub, workspace, plan_id):
    _tree(workspace)
    cp = _checkpoint(checkpoint_stub, plan_id, workspace)
    state_only = checkpoint_stub.CreateCheckpoint(pb.CreateCheckpointRequest(plan_id=str(ULID()))).checkpoint
    for path in ("README", "link", "src/a.py"):
        error = refused(lambda p=path: _list(checkpoint_stub, cp.checkpoint_id, p),
                        grpc.StatusCode.FAILED_PRECONDITION, "NOT_A_DIRECTORY")
        assert error_info(error).metadata["path"] == path
    missing = refused(lambda: _list(checkpoint_stub, cp.checkpoint_id, "src/nope"), grpc.StatusCode.NOT_FOUND,
                      "PATH_NOT_FOUND")
    assert error_info(missing).metadata["path"] == "src/nope"
    refused(lambda: _list(checkpoint_stub, cp.checkpoint_id, "link/a.py"), grpc.StatusCode.NOT_FOUND,
            "PATH_NOT_FOUND")
    for bad in ("../etc", "/etc", "/", "src/../src", "./src"):
        refused(lambda p=bad: _list(checkpoint_stub, cp.checkpoint_id, p), grpc.StatusCode.INVALID_ARGUMENT,
                "INVALID_PATH")
    refused(lambda: _list(checkpoint_stub, str(ULID())), grpc.StatusCode.NOT_FOUND, "CHECKPOINT_NOT_FOUND")
    refused(lambda: _list(checkpoint_stub, "not-an-id"), grpc.StatusCode.INVALID_ARGUMENT, "INVALID_CHECKPOINT_ID")
    refused(lambda: _list(checkpoint_stub, state_only.checkpoint_id), grpc.StatusCode.FAILED_PRECONDITION,
            "NO_WORKSPACE")

