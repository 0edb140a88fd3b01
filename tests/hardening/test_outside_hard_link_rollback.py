"""A rollback meets a write the file watcher never saw: a workspace file that gained a second
name OUTSIDE the workspace after a checkpoint, and was written through that name.

That is a documented blind spot of the watcher (see ``watcher.py``): inotify reports the new
link count and the write only to watches on the inode itself and on the outside directory, never
to the workspace's directory watch, so the next incremental capture (the rollback's safety
capture included) still records the file's old content. The promise tested here is the one the
blind spot must not break: **a rollback never loses such a write.** Before the restorer replaces
or removes a file it checks the file against the stat identity (inode, size, mtime, ctime) the
stat index recorded, hashing it when only the ctime moved or the identity is racy
(``restorer._Expect._same_file``), so it must either

* refuse (FAILED_PRECONDITION/ABORTED, ROLLBACK_CONFLICT) and leave the file as its writer left
  it, or
* succeed only with the outside-written bytes readable from the rollback's safety checkpoint;

and a rollback whose target leaves the file alone leaves the outside-written bytes in place.
The outside name itself always keeps the old inode (the restorer renames a new file over the
workspace name), so what is checked is the workspace path and the safety checkpoint, never the
outside name.

Through one real server (``--watcher on``, disk store) over a real channel, with the Python
client. The attacker variants write the same number of bytes and put the mtime back to the one
the checkpoint recorded (``os.utime``), so only the ctime tells; the ``old mtime`` variants give
the file an mtime far outside the stat index's racy window, so the index's identity is trusted
and the ctime-only branch of the check is what stands between the rollback and the user's write.
"""

from __future__ import annotations

import os
import tempfile
import time
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import grpc
import pytest

from checkpoint.v1 import checkpoint_service_pb2 as pb
from checkpointd_client import CheckpointClient, CheckpointdRpcError, new_plan_id, open_channel
from tests.conftest import SERVER_ARGS, PostgresDatabases, RunningServer, serving_server

NAME = "f.txt"
#: A file sorted before NAME: a rollback rewrites it first, so a refusal at NAME must undo it.
EARLIER = "a.txt"
C1_BYTES = b"version one of the file\n"
C2_BYTES = b"version two of the file\n"  # the same size as C1_BYTES
SAME_SIZE = b"OUTSIDE write, same size\n"[: len(C2_BYTES)]
OTHER_SIZE = b"an outside write of quite another size than either version\n"
#: An mtime well outside the stat index's 2 s racy window.
OLD_MTIME_NS = (int(time.time()) - 3 * 3600) * 1_000_000_000

assert len(SAME_SIZE) == len(C2_BYTES) and SAME_SIZE != C2_BYTES


@pytest.fixture(scope="module")
def server(short_tmp: Path, suite_databases: PostgresDatabases | None) -> Iterator[RunningServer]:
    yield from serving_server(Path(tempfile.mkdtemp(prefix="hl-", dir=short_tmp)), suite_databases,
                              extra_args=(*SERVER_ARGS, "--store", "disk", "--watcher", "on"))


@pytest.fixture(scope="module")
def client(server: RunningServer) -> Iterator[CheckpointClient]:
    channel = open_channel(server.tcp_target)
    try:
        yield CheckpointClient(channel, deadline_s=30)
    finally:
        channel.close()


def test_the_server_really_watches(server: RunningServer) -> None:
    """The scenario needs the inotify watcher running (a server without it scans fully and sees
    the outside write): the server process holds an inotify descriptor."""
    fds = Path(f"/proc/{server.process.pid}/fd")
    kinds = set()
    for fd in fds.iterdir():
        try:
            kinds.add(os.readlink(fd))
        except OSError:
            continue
    assert "anon_inode:inotify" in kinds, f"no inotify descriptor in the server: {sorted(kinds)}"


# -- the scenario ----------------------------------------------------------------------------------


@dataclass
class Scene:
    plan: str
    root: Path
    path: Path
    outside: Path
    checkpoints: dict[str, str]
    written: bytes
    inode: int


def _checkpoint(client: CheckpointClient, plan: str, root: Path | None = None) -> str:
    return client.create_checkpoint(plan, workspace_root=root).checkpoint_id


def _read(client: CheckpointClient, checkpoint_id: str, path: str) -> bytes | None:
    try:
        return b"".join(client.read_file(checkpoint_id, path))
    except CheckpointdRpcError as error:
        if error.code is grpc.StatusCode.NOT_FOUND:
            return None
        raise


def _outside_dir(server: RunningServer, root: Path) -> Path:
    outside = server.base / f"outside-{uuid.uuid4().hex[:8]}"
    outside.mkdir()
    assert outside.stat().st_dev == root.stat().st_dev, "the outside link needs the workspace's file system"
    assert not outside.resolve().is_relative_to(server.allowed_root.resolve())
    return outside


def _scene(server: RunningServer, client: CheckpointClient, *, content: bytes, reset_mtime: bool,
           old_mtime: bool, truncate: bool = False, earlier: bool = False) -> Scene:
    """C0 without NAME; C1 with C1_BYTES; C2 with C2_BYTES (written in the workspace, so the watcher
    reports it and C2's stat index entry is fresh); then an outside link, and ``content`` written
    through it (``truncate``: the file is truncated to nothing instead). Nothing is checkpointed
    after the outside write: the next capture is the rollback's safety capture."""
    root, plan = server.new_workspace(), new_plan_id()
    path = root / NAME
    (root / "keep.txt").write_bytes(b"kept\n")
    if earlier:
        (root / EARLIER).write_bytes(b"earlier one\n")
    checkpoints = {"C0": _checkpoint(client, plan, root)}
    path.write_bytes(C1_BYTES)
    checkpoints["C1"] = _checkpoint(client, plan)
    path.write_bytes(C2_BYTES)
    if earlier:
        (root / EARLIER).write_bytes(b"earlier two, longer\n")
    if old_mtime:
        os.utime(path, ns=(OLD_MTIME_NS, OLD_MTIME_NS))
    checkpoints["C2"] = _checkpoint(client, plan)
    assert _read(client, checkpoints["C2"], NAME) == C2_BYTES
    recorded = path.stat()
    assert recorded.st_nlink == 1

    outside = _outside_dir(server, root) / "alias.txt"
    os.link(path, outside)
    if truncate:
        with open(outside, "r+b") as handle:
            handle.truncate(0)
        written = b""
    else:
        with open(outside, "r+b") as handle:
            handle.write(content)
            handle.truncate(len(content))
        written = content
    if reset_mtime:
        os.utime(outside, ns=(recorded.st_atime_ns, recorded.st_mtime_ns))
    now = path.stat()
    assert now.st_ino == recorded.st_ino and now.st_nlink == 2 and path.read_bytes() == written
    if reset_mtime:
        assert now.st_mtime_ns == recorded.st_mtime_ns
    if not truncate and len(content) == len(C2_BYTES):
        assert now.st_size == recorded.st_size  # the attacker case: only the ctime moved
    return Scene(plan, root, path, outside, checkpoints, written, recorded.st_ino)


@dataclass
class Outcome:
    refused: CheckpointdRpcError | None
    safety_id: str
    #: What the safety checkpoint holds at NAME (None: not there).
    safety_bytes: bytes | None

    @property
    def missed(self) -> bool:
        """The safety capture did not see the outside write (the watcher's blind spot)."""
        return self.safety_bytes == C2_BYTES


def _roll_back(client: CheckpointClient, scene: Scene, target: str) -> Outcome:
    target_id = scene.checkpoints[target]
    try:
        reply = client.rollback(scene.plan, target_id, scope=pb.ROLLBACK_SCOPE_FILES)
    except CheckpointdRpcError as error:
        refused = error
        safeties = [c for c in client.list_checkpoints(scene.plan) if c.rollback_target_checkpoint_id == target_id]
        assert safeties, f"a refused rollback left no safety checkpoint: {error}"
        safety_id = max(safeties, key=lambda c: c.sequence).checkpoint_id
    else:
        refused = None
        assert reply.HasField("safety_checkpoint")
        safety_id = reply.safety_checkpoint.checkpoint_id
    outcome = Outcome(refused, safety_id, _read(client, safety_id, NAME))
    print(f"rollback to {target}: {'refused (' + refused.reason + ')' if refused else 'applied'}; safety checkpoint "
          f"holds {outcome.safety_bytes!r}; {NAME} holds "
          f"{scene.path.read_bytes() if scene.path.exists() else None!r}")
    return outcome


def _assert_refused_cleanly(outcome: Outcome, scene: Scene) -> None:
    error = outcome.refused
    assert error.code in (grpc.StatusCode.FAILED_PRECONDITION, grpc.StatusCode.ABORTED), error
    assert error.reason == "ROLLBACK_CONFLICT", error
    assert error.metadata.get("path") == NAME, error
    st = scene.path.stat()
    assert st.st_ino == scene.inode and st.st_nlink == 2, "the refused rollback replaced the file"


def _assert_not_lost(outcome: Outcome, scene: Scene) -> None:
    """The bytes written through the outside name are at the workspace path, or (only when the
    rollback went through) in the rollback's safety checkpoint."""
    on_disk = scene.path.read_bytes() if scene.path.exists() else None
    if outcome.refused is not None:
        _assert_refused_cleanly(outcome, scene)
        assert on_disk == scene.written, "a refused rollback changed the file"
        return
    assert on_disk == scene.written or outcome.safety_bytes == scene.written, (
        f"the outside-written bytes {scene.written!r} are gone: the workspace holds {on_disk!r}, the "
        f"rollback's safety checkpoint {outcome.safety_bytes!r}")


VARIANTS = [
    # (content, reset_mtime, old_mtime)
    pytest.param(SAME_SIZE, True, False, id="same-size-mtime-reset"),
    pytest.param(SAME_SIZE, True, True, id="same-size-mtime-reset-old-mtime"),
    pytest.param(SAME_SIZE, False, False, id="same-size"),
    pytest.param(SAME_SIZE, False, True, id="same-size-old-mtime"),
    pytest.param(OTHER_SIZE, True, True, id="other-size-mtime-reset-old-mtime"),
    pytest.param(OTHER_SIZE, False, False, id="other-size"),
]


# -- (1) the target changes the file --------------------------------------------------------------


@pytest.mark.parametrize(("content", "reset_mtime", "old_mtime"), VARIANTS)
def test_a_rollback_that_rewrites_the_file_refuses_or_keeps_the_outside_write(
        server: RunningServer, client: CheckpointClient, content: bytes, reset_mtime: bool, old_mtime: bool) -> None:
    """Rollback to C1 (the file holds C1_BYTES there): refused with the file untouched, or the
    outside-written bytes are in the safety checkpoint. While the watcher misses the write (the
    safety checkpoint holds C2_BYTES), only a refusal keeps them."""
    scene = _scene(server, client, content=content, reset_mtime=reset_mtime, old_mtime=old_mtime)
    outcome = _roll_back(client, scene, "C1")
    _assert_not_lost(outcome, scene)
    if outcome.missed:
        assert outcome.refused is not None, "the rollback replaced a file its safety capture had a stale view of"
    assert (scene.root / "keep.txt").read_bytes() == b"kept\n"
    assert scene.outside.read_bytes() == scene.written


@pytest.mark.parametrize(("content", "reset_mtime", "old_mtime"), VARIANTS[:2])
def test_a_rollback_that_removes_the_file_refuses_or_keeps_the_outside_write(
        server: RunningServer, client: CheckpointClient, content: bytes, reset_mtime: bool, old_mtime: bool) -> None:
    """Rollback to C0, where the file did not exist: the restorer would unlink it."""
    scene = _scene(server, client, content=content, reset_mtime=reset_mtime, old_mtime=old_mtime)
    outcome = _roll_back(client, scene, "C0")
    _assert_not_lost(outcome, scene)
    if outcome.missed:
        assert outcome.refused is not None
        assert scene.path.read_bytes() == scene.written


@pytest.mark.parametrize("old_mtime", [False, True], ids=["fresh-mtime", "old-mtime"])
def test_a_refusal_at_the_file_takes_back_what_the_rollback_wrote_before_it(
        server: RunningServer, client: CheckpointClient, old_mtime: bool) -> None:
    """EARLIER is rewritten before NAME is checked: the refusal at NAME undoes EARLIER, and NAME
    keeps the outside write."""
    scene = _scene(server, client, content=SAME_SIZE, reset_mtime=True, old_mtime=old_mtime, earlier=True)
    outcome = _roll_back(client, scene, "C1")
    _assert_not_lost(outcome, scene)
    if outcome.refused is not None:
        assert (scene.root / EARLIER).read_bytes() == b"earlier two, longer\n", "the refused rollback was not undone"
    else:
        assert (scene.root / EARLIER).read_bytes() == b"earlier one\n"


# -- (2) the target leaves the file as the safety capture saw it ------------------------------------


@pytest.mark.parametrize(("content", "reset_mtime", "old_mtime"), VARIANTS)
def test_a_rollback_that_leaves_the_file_alone_keeps_the_outside_write(
        server: RunningServer, client: CheckpointClient, content: bytes, reset_mtime: bool, old_mtime: bool) -> None:
    """Rollback to C2, whose NAME is what the (blind) safety capture thinks it still holds, while
    another file changed since C2 is restored: NAME keeps the outside-written bytes, on the same
    inode. (Were the write seen, the safety checkpoint would hold it and NAME would go back to C2.)"""
    scene = _scene(server, client, content=content, reset_mtime=reset_mtime, old_mtime=old_mtime)
    (scene.root / "keep.txt").write_bytes(b"changed after C2\n")
    outcome = _roll_back(client, scene, "C2")
    _assert_not_lost(outcome, scene)
    assert outcome.refused is None, outcome.refused
    assert (scene.root / "keep.txt").read_bytes() == b"kept\n"
    if outcome.missed:
        assert scene.path.read_bytes() == scene.written
        assert scene.path.stat().st_ino == scene.inode


# -- (3) truncated to nothing through the outside name ----------------------------------------------


@pytest.mark.parametrize("reset_mtime", [False, True], ids=["plain", "mtime-reset"])
@pytest.mark.parametrize("old_mtime", [False, True], ids=["fresh-mtime", "old-mtime"])
@pytest.mark.parametrize("target", ["C0", "C1", "C2"])
def test_a_file_truncated_through_the_outside_name(server: RunningServer, client: CheckpointClient,
                                                   target: str, old_mtime: bool, reset_mtime: bool) -> None:
    """The outside name truncates the file to zero bytes. C0 removes the file, C1 rewrites it
    (refused, or the empty content is in the safety checkpoint); C2 leaves it alone, so it stays
    empty while the capture misses the truncation."""
    scene = _scene(server, client, content=b"", reset_mtime=reset_mtime, old_mtime=old_mtime, truncate=True)
    if target == "C2":
        (scene.root / "keep.txt").write_bytes(b"changed after C2\n")
    outcome = _roll_back(client, scene, target)
    _assert_not_lost(outcome, scene)
    if outcome.missed:
        if target == "C2":
            assert outcome.refused is None, outcome.refused
            assert scene.path.read_bytes() == b"" and scene.path.stat().st_ino == scene.inode
        else:
            assert outcome.refused is not None


# -- after the refusal: what later captures and rollbacks do -----------------------------------------


def _kept_somewhere(client: CheckpointClient, scene: Scene) -> bool:
    """The outside-written bytes are at NAME, or in one of the plan's checkpoints."""
    if scene.path.exists() and scene.path.read_bytes() == scene.written:
        return True
    return any(_read(client, c.checkpoint_id, NAME) == scene.written for c in client.list_checkpoints(scene.plan))


def test_after_a_refusal_later_checkpoints_and_rollbacks_lose_nothing(
        server: RunningServer, client: CheckpointClient) -> None:
    """After the refused rollback: a plain checkpoint, a second rollback to C1, then a rollback to
    the first rollback's safety checkpoint (which holds C2_BYTES while the write was missed). The
    outside-written bytes must stay at NAME or be in one of the plan's checkpoints throughout.

    What the checkpoint after the refusal records for NAME is the documented blind spot's business
    (it might still be C2_BYTES), so it is only reported (``-s``), not asserted. Seen so far: the
    refused rollback makes the next capture see the write, so that checkpoint records it and the
    second rollback goes through with the bytes in its safety checkpoint."""
    scene = _scene(server, client, content=SAME_SIZE, reset_mtime=True, old_mtime=True)
    first = _roll_back(client, scene, "C1")
    _assert_not_lost(first, scene)
    if first.missed:
        assert first.refused is not None

    scene.checkpoints["C3"] = _checkpoint(client, scene.plan)
    print(f"the checkpoint after the first rollback records {_read(client, scene.checkpoints['C3'], NAME)!r}")
    assert _kept_somewhere(client, scene)

    second = _roll_back(client, scene, "C1")
    if second.refused is not None:
        _assert_refused_cleanly(second, scene)
    assert _kept_somewhere(client, scene), "the second rollback to C1 lost the outside-written bytes"

    scene.checkpoints["S1"] = first.safety_id
    third = _roll_back(client, scene, "S1")
    if third.refused is not None:
        _assert_refused_cleanly(third, scene)
    assert _kept_somewhere(client, scene), "rolling back to the first safety checkpoint lost the outside-written bytes"
