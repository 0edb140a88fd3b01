"""Path attacks: crafted requests and crafted workspaces that try to make checkpointd read or
write outside a plan's workspace root. Canary directories outside the root (one beside the
allowed root, one a neighbouring workspace) are fingerprinted before and after every case:
nothing in them may change and nothing new may appear beside them. Symlinks in the cases point
into the canaries, so a write that followed one would land there.
"""

from __future__ import annotations

import os
import shutil
import socket
import threading
import uuid
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

import grpc
import pytest
from ulid import ULID

from checkpoint.v1 import checkpoint_service_pb2 as pb
from checkpoint.v1 import checkpoint_service_pb2_grpc as pb_grpc
from tests.hardening.support import fingerprint_tree, start_with_faults, workspace_state
from tests.helpers import error_info, refused, tree_state

SECRET = b"canary: must never change\n"


@dataclass
class Scene:
    stub: pb_grpc.CheckpointServiceStub
    base: Path
    allowed_root: Path
    workspace: Path
    outside: Path
    neighbor: Path
    #: A look-alike of a workspace outside the allowed root: .../decoy/ws/f.
    decoy: Path
    plan_id: str = field(default_factory=lambda: str(ULID()))
    #: Names a case itself adds under the allowed root (e.g. a symlinked alias of its workspace).
    allowed_new: set[str] = field(default_factory=set)

    def create(self, root: Path | str | None = None, **fields) -> pb.Checkpoint:
        request = pb.CreateCheckpointRequest(plan_id=self.plan_id, workspace_root=str(root or self.workspace),
                                             **fields)
        return self.stub.CreateCheckpoint(request, timeout=60).checkpoint

    def create_in_remembered_root(self) -> pb.Checkpoint:
        request = pb.CreateCheckpointRequest(plan_id=self.plan_id)
        return self.stub.CreateCheckpoint(request, timeout=60).checkpoint

    def rollback(self, checkpoint: pb.Checkpoint, paths: tuple[str, ...] = ()) -> pb.RollbackResponse:
        return self.stub.Rollback(pb.RollbackRequest(plan_id=self.plan_id, checkpoint_id=checkpoint.checkpoint_id,
                                                     scope=pb.ROLLBACK_SCOPE_FILES, paths=list(paths)), timeout=60)

    def diff(self, base: pb.Checkpoint, paths: tuple[str, ...] = ()) -> list[pb.FileChange]:
        return list(self.stub.DiffCheckpoints(pb.DiffCheckpointsRequest(
            base_checkpoint_id=base.checkpoint_id, paths=list(paths)), timeout=60).changes)


def write(path: Path, content: bytes = b"x") -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(content)
    return path


def replace_with_symlink(path: Path, target: Path | str) -> None:
    if path.is_dir() and not path.is_symlink():
        shutil.rmtree(path)
    elif path.exists() or path.is_symlink():
        path.unlink()
    path.symlink_to(target)


# -- requests that name paths -----------------------------------------------------------------

BAD_RELATIVE_PATHS = ["..", "../outside", "a/../../outside", "/etc/passwd", "/", "//x", "./a", "a/./b", "a//b",
                      "a/..", "a/\x00b", ""]


def _bad_rollback_path(path: str) -> Callable[[Scene], None]:
    def case(scene: Scene) -> None:
        write(scene.workspace / "a" / "b")
        checkpoint = scene.create()
        before = tree_state(scene.workspace)
        refused(lambda: scene.rollback(checkpoint, (path,)), grpc.StatusCode.INVALID_ARGUMENT, "INVALID_PATH")
        assert tree_state(scene.workspace) == before
    return case


def _bad_diff_path(path: str) -> Callable[[Scene], None]:
    def case(scene: Scene) -> None:
        checkpoint = scene.create()
        refused(lambda: scene.diff(checkpoint, (path,)), grpc.StatusCode.INVALID_ARGUMENT, "INVALID_PATH")
    return case


def _bad_root(make_root: Callable[[Scene], str], code: grpc.StatusCode, reason: str) -> Callable[[Scene], None]:
    def case(scene: Scene) -> None:
        refused(lambda: scene.create(make_root(scene)), code, reason)
    return case


def root_symlink_inside(scene: Scene) -> None:
    """A workspace root that is itself a symlink (to a directory inside the allowed root) is
    resolved once, when the plan gets it; the plan keeps the real path."""
    alias = scene.allowed_root / f"alias-{uuid.uuid4().hex[:8]}"
    scene.allowed_new.add(alias.name)
    alias.symlink_to(scene.workspace)
    write(scene.workspace / "f", b"one")
    checkpoint = scene.create(alias)
    assert checkpoint.workspace_root == str(scene.workspace)
    write(scene.workspace / "f", b"two")
    scene.rollback(checkpoint)
    assert (scene.workspace / "f").read_bytes() == b"one"
    alias.unlink()


def root_through_symlinked_parent(scene: Scene) -> None:
    parent_alias = scene.allowed_root / f"palias-{uuid.uuid4().hex[:8]}"
    scene.allowed_new.add(parent_alias.name)
    parent_alias.symlink_to(scene.allowed_root)
    checkpoint = scene.create(parent_alias / scene.workspace.name)
    assert checkpoint.workspace_root == str(scene.workspace)
    parent_alias.unlink()


def root_swapped_for_symlink_after_first_checkpoint(scene: Scene) -> None:
    """The plan's root is replaced by a symlink to the outside canary: every later call refuses
    (naming the root again resolves it outside the allowed root)."""
    write(scene.workspace / "f", b"mine")
    checkpoint = scene.create()
    moved = scene.workspace.with_name(scene.workspace.name + "-moved")
    scene.allowed_new.add(moved.name)
    scene.workspace.rename(moved)
    scene.workspace.symlink_to(scene.outside)
    try:
        refused(lambda: scene.create(), grpc.StatusCode.PERMISSION_DENIED, "WORKSPACE_ROOT_NOT_ALLOWED")
        refused(scene.create_in_remembered_root, grpc.StatusCode.FAILED_PRECONDITION, "WORKSPACE_UNAVAILABLE")
        refused(lambda: scene.rollback(checkpoint), grpc.StatusCode.FAILED_PRECONDITION, "WORKSPACE_UNAVAILABLE")
        refused(lambda: scene.diff(checkpoint), grpc.StatusCode.FAILED_PRECONDITION, "WORKSPACE_UNAVAILABLE")
    finally:
        scene.workspace.unlink()
        moved.rename(scene.workspace)


def root_parent_swapped_for_symlink(scene: Scene) -> None:
    """A directory above the root is swapped for a symlink to a look-alike outside: refused, since
    the root is reached from / without following any symlink."""
    nest = scene.workspace / "nest"
    inner_root = nest / "ws"
    write(inner_root / "f", b"real")
    plan_checkpoint = scene.create(inner_root)
    nest.rename(scene.workspace / "nest-real")
    nest.symlink_to(scene.decoy)
    try:
        refused(lambda: scene.create(inner_root), grpc.StatusCode.PERMISSION_DENIED, "WORKSPACE_ROOT_NOT_ALLOWED")
        refused(scene.create_in_remembered_root, grpc.StatusCode.FAILED_PRECONDITION, "WORKSPACE_UNAVAILABLE")
        refused(lambda: scene.diff(plan_checkpoint), grpc.StatusCode.FAILED_PRECONDITION, "WORKSPACE_UNAVAILABLE")
        refused(lambda: scene.rollback(plan_checkpoint), grpc.StatusCode.FAILED_PRECONDITION,
                "WORKSPACE_UNAVAILABLE")
    finally:
        nest.unlink()
        (scene.workspace / "nest-real").rename(nest)


# -- workspaces that hold links -----------------------------------------------------------------


def symlink_dir_replaced_by_real_dir(scene: Scene) -> None:
    """A checkpoint has dir/ with files; now dir is a symlink to the outside: the rollback
    replaces the link itself and writes into a new real directory."""
    write(scene.workspace / "dir" / "x", b"mine")
    checkpoint = scene.create()
    replace_with_symlink(scene.workspace / "dir", scene.outside)
    scene.rollback(checkpoint)
    assert not (scene.workspace / "dir").is_symlink()
    assert (scene.workspace / "dir" / "x").read_bytes() == b"mine"


def symlink_file_replaced_by_file(scene: Scene) -> None:
    write(scene.workspace / "secret.txt", b"mine")
    checkpoint = scene.create()
    replace_with_symlink(scene.workspace / "secret.txt", scene.outside / "secret.txt")
    scene.rollback(checkpoint)
    assert not (scene.workspace / "secret.txt").is_symlink()
    assert (scene.workspace / "secret.txt").read_bytes() == b"mine"


def symlinked_parent_of_a_restored_file(scene: Scene) -> None:
    write(scene.workspace / "a" / "b" / "c.txt", b"deep")
    checkpoint = scene.create()
    replace_with_symlink(scene.workspace / "a" / "b", scene.outside / "dir")
    scene.rollback(checkpoint)
    assert (scene.workspace / "a" / "b" / "c.txt").read_bytes() == b"deep"
    assert not (scene.workspace / "a" / "b").is_symlink()


def symlinked_top_directory(scene: Scene) -> None:
    write(scene.workspace / "a" / "inner.txt", b"mine")
    checkpoint = scene.create()
    replace_with_symlink(scene.workspace / "a", scene.neighbor)
    scene.rollback(checkpoint)
    assert tree_state(scene.workspace)["a/inner.txt"][1] == b"mine"


def symlinks_are_restored_as_links_never_followed(scene: Scene) -> None:
    (scene.workspace / "to-outside").symlink_to(scene.outside)
    (scene.workspace / "to-secret").symlink_to(scene.outside / "secret.txt")
    (scene.workspace / "to-root").symlink_to("/")
    (scene.workspace / "relative-escape").symlink_to("../../..")
    checkpoint = scene.create()
    assert checkpoint.file_count == 4
    for name in ("to-outside", "to-secret", "to-root", "relative-escape"):
        (scene.workspace / name).unlink()
    scene.rollback(checkpoint)
    assert os.readlink(scene.workspace / "to-secret") == str(scene.outside / "secret.txt")
    assert os.readlink(scene.workspace / "relative-escape") == "../../.."


def deleting_a_link_to_a_directory_deletes_only_the_link(scene: Scene) -> None:
    write(scene.workspace / "keep", b"k")
    checkpoint = scene.create()
    (scene.workspace / "link").symlink_to(scene.outside)
    scene.rollback(checkpoint)
    assert not (scene.workspace / "link").exists() and not (scene.workspace / "link").is_symlink()


def rollback_subset_through_a_symlink(scene: Scene) -> None:
    """paths=["link/secret.txt"] where link points outside: nothing is read or written there."""
    checkpoint = scene.create()
    (scene.workspace / "link").symlink_to(scene.outside)
    reply = scene.rollback(checkpoint, ("link/secret.txt",))
    assert list(reply.changes) == []
    assert (scene.workspace / "link").is_symlink()


def rollback_subset_naming_a_symlinked_dir(scene: Scene) -> None:
    write(scene.workspace / "link" / "f", b"mine")
    checkpoint = scene.create()
    replace_with_symlink(scene.workspace / "link", scene.outside)
    scene.rollback(checkpoint, ("link",))
    assert (scene.workspace / "link" / "f").read_bytes() == b"mine"


def diff_against_live_never_descends_links(scene: Scene) -> None:
    checkpoint = scene.create()
    (scene.workspace / "link").symlink_to(scene.outside)
    changes = scene.diff(checkpoint)
    assert [(c.path, c.target_type) for c in changes] == [("link", pb.ENTRY_TYPE_SYMLINK)]


def gitignore_symlink_is_not_followed(scene: Scene) -> None:
    """A .gitignore that links to an outside file that would ignore everything is not read."""
    (scene.workspace / ".gitignore").symlink_to(scene.outside / "ignore-all")
    write(scene.workspace / "visible.txt", b"v")
    checkpoint = scene.create()
    assert checkpoint.file_count == 2


def gitignore_fifo_does_not_block(scene: Scene) -> None:
    os.mkfifo(scene.workspace / ".gitignore")
    write(scene.workspace / "f", b"v")
    checkpoint = scene.create()
    assert checkpoint.file_count == 1
    assert [s.reason for s in checkpoint.skipped_files] == ["UNSUPPORTED_FILE_TYPE"]


def symlink_loop(scene: Scene) -> None:
    (scene.workspace / "a").symlink_to("b")
    (scene.workspace / "b").symlink_to("a")
    (scene.workspace / "self").symlink_to("self")
    checkpoint = scene.create()
    for name in ("a", "b", "self"):
        (scene.workspace / name).unlink()
    scene.rollback(checkpoint)
    assert os.readlink(scene.workspace / "self") == "self"


def file_became_symlink_to_outside_file(scene: Scene) -> None:
    """Live `f` links to the outside secret; the checkpoint had a file there: the link is
    replaced, the secret keeps its content."""
    write(scene.workspace / "f", b"mine")
    checkpoint = scene.create()
    replace_with_symlink(scene.workspace / "f", scene.outside / "secret.txt")
    reply = scene.rollback(checkpoint)
    assert [c.kind for c in reply.changes] == [pb.CHANGE_KIND_TYPE_CHANGED]
    assert (scene.workspace / "f").read_bytes() == b"mine"


# -- hard links, odd names, odd files ------------------------------------------------------------


def hard_link_to_outside_file(scene: Scene) -> None:
    """A file hard-linked to an outside file is captured by content; restoring it makes a new
    inode in the workspace and leaves the outside file as it was."""
    os.link(scene.outside / "secret.txt", scene.workspace / "h")
    checkpoint = scene.create()
    (scene.workspace / "h").unlink()
    write(scene.workspace / "h", b"other")
    scene.rollback(checkpoint)
    assert (scene.workspace / "h").read_bytes() == SECRET
    assert os.stat(scene.workspace / "h").st_ino != os.stat(scene.outside / "secret.txt").st_ino


def hard_link_overwritten_by_rollback(scene: Scene) -> None:
    write(scene.workspace / "h", b"checkpointed")
    checkpoint = scene.create()
    (scene.workspace / "h").unlink()
    os.link(scene.outside / "secret.txt", scene.workspace / "h")
    scene.rollback(checkpoint)
    assert (scene.workspace / "h").read_bytes() == b"checkpointed"
    assert os.stat(scene.workspace / "h").st_ino != os.stat(scene.outside / "secret.txt").st_ino


def _names_round_trip(names: list[bytes]) -> Callable[[Scene], None]:
    def case(scene: Scene) -> None:
        root = os.fsencode(scene.workspace)
        for i, name in enumerate(names):
            with open(os.path.join(root, name), "wb") as f:
                f.write(b"content %d" % i)
        checkpoint = scene.create()
        assert checkpoint.file_count == len(names)
        expected = workspace_state(scene.workspace)
        for name in names:
            os.unlink(os.path.join(root, name))
        reply = scene.rollback(checkpoint)
        assert len(reply.changes) == len(names)
        assert workspace_state(scene.workspace) == expected
    return case


def non_utf8_names_diff_and_restore(scene: Scene) -> None:
    root = os.fsencode(scene.workspace)
    os.mkdir(os.path.join(root, b"dir\xff"))
    with open(os.path.join(root, b"dir\xff", b"caf\xe9"), "wb") as f:
        f.write(b"latin-1")
    checkpoint = scene.create()
    expected = workspace_state(scene.workspace)
    shutil.rmtree(os.path.join(root, b"dir\xff"))
    paths = [c.path for c in scene.diff(checkpoint)]
    assert paths == ["dir\\xff", "dir\\xff/caf\\xe9"]
    scene.rollback(checkpoint)
    assert workspace_state(scene.workspace) == expected


def deep_nesting(scene: Scene) -> None:
    deep = scene.workspace.joinpath(*["d"] * 120)
    write(deep / "leaf", b"bottom")
    checkpoint = scene.create()
    shutil.rmtree(scene.workspace / "d")
    scene.rollback(checkpoint)
    assert (deep / "leaf").read_bytes() == b"bottom"


def temp_prefixed_user_file_is_left_alone(scene: Scene) -> None:
    """A user's file that only starts with the server's temporary prefix is captured like any
    other (only the server's exact temporary names are left out), and a rollback keeps it."""
    write(scene.workspace / ".checkpointd-tmp-users-own", b"user data")
    write(scene.workspace / "f", b"1")
    checkpoint = scene.create()
    assert checkpoint.file_count == 2
    write(scene.workspace / "f", b"2")
    scene.rollback(checkpoint)
    assert (scene.workspace / ".checkpointd-tmp-users-own").read_bytes() == b"user data"


def fifo_and_socket_are_skipped_and_kept(scene: Scene) -> None:
    os.mkfifo(scene.workspace / "pipe")
    sock = socket.socket(socket.AF_UNIX)
    sock_path = scene.workspace / "s.sock"
    if len(os.fsencode(sock_path)) < 100:
        sock.bind(str(sock_path))
    sock.close()
    write(scene.workspace / "f", b"1")
    checkpoint = scene.create()
    assert checkpoint.file_count == 1
    write(scene.workspace / "f", b"2")
    scene.rollback(checkpoint)
    assert (scene.workspace / "pipe").exists()


def directory_holding_unaccounted_files_is_not_replaced(scene: Scene) -> None:
    """The checkpoint has a file where a directory now holds an ignored file: refused, nothing changed."""
    write(scene.workspace / ".gitignore", b"*.log\n")
    write(scene.workspace / "thing", b"file")
    checkpoint = scene.create()
    (scene.workspace / "thing").unlink()
    write(scene.workspace / "thing" / "debug.log", b"ignored, never captured")
    before = tree_state(scene.workspace)
    refused(lambda: scene.rollback(checkpoint), grpc.StatusCode.FAILED_PRECONDITION, "ROLLBACK_CONFLICT")
    assert tree_state(scene.workspace) == before


def attack_cases() -> dict[str, Callable[[Scene], None]]:
    cases: dict[str, Callable[[Scene], None]] = {}
    for path in BAD_RELATIVE_PATHS:
        cases[f"rollback-path-{path!r}"] = _bad_rollback_path(path)
    for path in BAD_RELATIVE_PATHS[:8]:
        cases[f"diff-path-{path!r}"] = _bad_diff_path(path)
    invalid, denied = grpc.StatusCode.INVALID_ARGUMENT, grpc.StatusCode.PERMISSION_DENIED
    roots = {
        "relative": (lambda s: "workspaces/x", invalid, "INVALID_WORKSPACE_ROOT"),
        "dotdot-escape": (lambda s: f"{s.workspace}/../../outside", denied, "WORKSPACE_ROOT_NOT_ALLOWED"),
        "dotdot-to-outside-canary": (lambda s: f"{s.allowed_root}/../{s.outside.name}", denied,
                                     "WORKSPACE_ROOT_NOT_ALLOWED"),
        "filesystem-root": (lambda s: "/", denied, "WORKSPACE_ROOT_NOT_ALLOWED"),
        "etc": (lambda s: "/etc", denied, "WORKSPACE_ROOT_NOT_ALLOWED"),
        "allowed-root-prefix-lookalike": (lambda s: f"{s.allowed_root}-evil", denied, "WORKSPACE_ROOT_NOT_ALLOWED"),
        "nul": (lambda s: f"{s.workspace}\x00/x", invalid, "INVALID_WORKSPACE_ROOT"),
        "a-file": (lambda s: str(write(s.workspace / "plain-file")), invalid, "INVALID_WORKSPACE_ROOT"),
        "missing": (lambda s: f"{s.workspace}/missing", invalid, "INVALID_WORKSPACE_ROOT"),
    }
    for name, (make_root, code, reason) in roots.items():
        cases[f"root-{name}"] = _bad_root(make_root, code, reason)

    def symlink_root_to_outside(scene: Scene) -> str:
        link = scene.workspace / "escape"
        link.symlink_to(scene.outside)
        return str(link)

    cases["root-symlink-to-outside"] = _bad_root(symlink_root_to_outside, denied, "WORKSPACE_ROOT_NOT_ALLOWED")
    for case in (root_symlink_inside, root_through_symlinked_parent, root_swapped_for_symlink_after_first_checkpoint,
                 root_parent_swapped_for_symlink, symlink_dir_replaced_by_real_dir, symlink_file_replaced_by_file,
                 symlinked_parent_of_a_restored_file, symlinked_top_directory,
                 symlinks_are_restored_as_links_never_followed, deleting_a_link_to_a_directory_deletes_only_the_link,
                 rollback_subset_through_a_symlink, rollback_subset_naming_a_symlinked_dir,
                 diff_against_live_never_descends_links, gitignore_symlink_is_not_followed,
                 gitignore_fifo_does_not_block, symlink_loop, file_became_symlink_to_outside_file,
                 hard_link_to_outside_file, hard_link_overwritten_by_rollback, non_utf8_names_diff_and_restore,
                 deep_nesting, temp_prefixed_user_file_is_left_alone, fifo_and_socket_are_skipped_and_kept,
                 directory_holding_unaccounted_files_is_not_replaced):
        cases[case.__name__] = case
    cases["names-with-newlines"] = _names_round_trip([b"a\nb", b"\n", b"x\r\ny", b"trailing\n"])
    cases["case-colliding-names"] = _names_round_trip([b"README", b"readme", b"ReadMe", b"rEADME"])
    cases["non-utf8-names"] = _names_round_trip([b"\xff\xfe", b"caf\xe9", b"\xed\xa0\x80", b"ok-\x80"])
    cases["dot-and-shell-names"] = _names_round_trip([b"...", b"..a", b". ", b"-rf", b"*", b"\\", b"a:b", b"~"])
    cases["long-names"] = _names_round_trip([b"n" * 255, b"\xc3\xa9" * 127])
    return cases


CASES = attack_cases()


@pytest.fixture
def scene(checkpointd_server, checkpoint_stub) -> Scene:
    base = checkpointd_server.base
    outside = base / f"outside-{uuid.uuid4().hex[:8]}"
    write(outside / "secret.txt", SECRET)
    write(outside / "dir" / "inner.txt", SECRET)
    write(outside / "ignore-all", b"*\n")
    (outside / "dir" / "c.txt").symlink_to("inner.txt")
    decoy = base / f"decoy-{uuid.uuid4().hex[:8]}"
    write(decoy / "ws" / "f", SECRET)
    neighbor = checkpointd_server.new_workspace()
    write(neighbor / "inner.txt", SECRET)
    write(neighbor / "f", SECRET)
    scene = Scene(checkpoint_stub, base, checkpointd_server.allowed_root, checkpointd_server.new_workspace(),
                  outside, neighbor, decoy)
    canaries = {path: fingerprint_tree(path) for path in (outside, neighbor, decoy)}
    base_names = set(os.listdir(base))
    allowed_names = set(os.listdir(scene.allowed_root))
    yield scene
    for path, fingerprint in canaries.items():
        assert fingerprint_tree(path) == fingerprint, f"something under {path} changed"
    assert set(os.listdir(base)) == base_names, "a new entry appeared beside the allowed root"
    assert set(os.listdir(scene.allowed_root)) - allowed_names - scene.allowed_new == set(), \
        "a new entry appeared under the allowed root"
    shutil.rmtree(outside)
    shutil.rmtree(decoy)


def test_there_are_at_least_fifty_cases() -> None:
    assert len(CASES) >= 50, len(CASES)


@pytest.mark.parametrize("name", sorted(CASES))
def test_path_attack(scene: Scene, name: str) -> None:
    CASES[name](scene)


# -- a symlink swapped in between snapshot and restore (TOCTOU) ------------------------------------


@pytest.fixture
def paused_server(idle_server, tmp_path):
    """A server that pauses its first rollback once the safety checkpoint is committed, until the
    test says resume (handshake files in tmp_path)."""
    handshake = tmp_path / "faults"
    handshake.mkdir()
    start_with_faults(idle_server, CHECKPOINTD_PAUSE_AT="rollback.safety_committed:1",
                      CHECKPOINTD_FAULT_DIR=str(handshake))
    return idle_server, handshake


def _while_paused(handshake: Path, attack: Callable[[], None], call: Callable[[], object]) -> object:
    outcome: dict[str, object] = {}

    def run() -> None:
        try:
            outcome["reply"] = call()
        except grpc.RpcError as error:
            outcome["error"] = error

    worker = threading.Thread(target=run)
    worker.start()
    paused = handshake / "paused.rollback.safety_committed"
    for _ in range(6000):
        if paused.exists() or not worker.is_alive():
            break
        threading.Event().wait(0.01)
    assert paused.exists(), f"the rollback never paused: {outcome}"
    attack()
    (handshake / "resume.rollback.safety_committed").touch()
    worker.join(timeout=120)
    assert not worker.is_alive()
    return outcome


def test_parent_swapped_for_symlink_mid_rollback_is_undone(paused_server) -> None:
    server, handshake = paused_server
    outside = server.base / "outside"
    write(outside / "x.txt", SECRET)
    canary = fingerprint_tree(outside)
    workspace = server.new_workspace()
    write(workspace / "d" / "x.txt", b"checkpointed")
    write(workspace / "d" / "y.txt", b"checkpointed")
    write(workspace / "top.txt", b"checkpointed")
    with grpc.insecure_channel(server.tcp_target) as channel:
        stub = pb_grpc.CheckpointServiceStub(channel)
        plan_id = str(ULID())
        checkpoint = stub.CreateCheckpoint(pb.CreateCheckpointRequest(plan_id=plan_id, workspace_root=str(workspace)),
                                           timeout=60).checkpoint
        write(workspace / "d" / "x.txt", b"changed since")
        write(workspace / "top.txt", b"changed since")
        (workspace / "d" / "y.txt").unlink()
        before = tree_state(workspace)

        def swap() -> None:
            (workspace / "d").rename(workspace / "d-real")
            (workspace / "d").symlink_to(outside)

        outcome = _while_paused(handshake, swap, lambda: stub.Rollback(pb.RollbackRequest(
            plan_id=plan_id, checkpoint_id=checkpoint.checkpoint_id), timeout=120))
        error = outcome.get("error")
        assert error is not None, "a rollback through a swapped-in symlink must not report success"
        assert error.code() == grpc.StatusCode.FAILED_PRECONDITION
        assert error_info(error).reason == "ROLLBACK_CONFLICT" and "undone" in error.details()
        # What the rollback had changed is taken back; the swap, made after its safety checkpoint,
        # is left where its maker put it (never followed).
        swapped = {**{p: v for p, v in before.items() if p != "d" and not p.startswith("d/")},
                   "d": ("symlink", str(outside)), "d-real": before["d"],
                   **{f"d-real/{p[2:]}": v for p, v in before.items() if p.startswith("d/")}}
        assert tree_state(workspace) == swapped
        stub.Rollback(pb.RollbackRequest(plan_id=plan_id, checkpoint_id=checkpoint.checkpoint_id), timeout=120)
        assert not (workspace / "d").is_symlink() and (workspace / "d" / "x.txt").read_bytes() == b"checkpointed"
    assert fingerprint_tree(outside) == canary


def test_file_swapped_for_symlink_mid_rollback_is_left_and_the_rollback_refused(paused_server) -> None:
    server, handshake = paused_server
    outside = server.base / "outside"
    write(outside / "secret.txt", SECRET)
    canary = fingerprint_tree(outside)
    workspace = server.new_workspace()
    write(workspace / "f.txt", b"checkpointed")
    with grpc.insecure_channel(server.tcp_target) as channel:
        stub = pb_grpc.CheckpointServiceStub(channel)
        plan_id = str(ULID())
        checkpoint = stub.CreateCheckpoint(pb.CreateCheckpointRequest(plan_id=plan_id, workspace_root=str(workspace)),
                                           timeout=60).checkpoint
        write(workspace / "f.txt", b"changed since")
        outcome = _while_paused(handshake, lambda: replace_with_symlink(workspace / "f.txt", outside / "secret.txt"),
                                lambda: stub.Rollback(pb.RollbackRequest(plan_id=plan_id,
                                                                         checkpoint_id=checkpoint.checkpoint_id),
                                                      timeout=120))
        error = outcome.get("error")
        assert error is not None, "a path swapped after the safety checkpoint must not be replaced"
        assert error_info(error).reason == "ROLLBACK_CONFLICT" and error_info(error).metadata["path"] == "f.txt"
        assert os.readlink(workspace / "f.txt") == str(outside / "secret.txt")
        stub.Rollback(pb.RollbackRequest(plan_id=plan_id, checkpoint_id=checkpoint.checkpoint_id), timeout=120)
    assert not (workspace / "f.txt").is_symlink()
    assert (workspace / "f.txt").read_bytes() == b"checkpointed"
    assert fingerprint_tree(outside) == canary
