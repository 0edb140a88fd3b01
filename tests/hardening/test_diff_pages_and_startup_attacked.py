"""Attacks on DiffCheckpoints paging and on serve's undoing of an interrupted or failed start-up
(helper-54, 4 December): what they found is fixed and guarded here (a lower-case id with live text
diffs, a start failing after the migration, a second signal as the built server is handed back),
beside the attacks that held."""

from __future__ import annotations

import os
import subprocess
import sys
import tempfile
import textwrap
from pathlib import Path

import grpc
import pytest

from checkpoint.v1 import checkpoint_service_pb2 as pb
from checkpointd.core.maintenance.datadir_lock import DataDirBusy
from checkpointd.server import CheckpointdServer, ServerSettings
from tests.conftest import free_port
from tests.helpers import checkpoint_id_of, error_info, interruptible


def _key(change) -> bytes:
    return change.raw_path or change.path.encode()


def _paged(stub, base, target="", **fields) -> list[bytes]:
    """Every page's paths (as bytes), following the tokens."""
    listed, token = [], ""
    for _ in range(500):
        response = stub.DiffCheckpoints(pb.DiffCheckpointsRequest(
            base_checkpoint_id=base, target_checkpoint_id=target, page_token=token, **fields))
        listed += [_key(c) for c in response.changes]
        token = response.next_page_token
        if not token:
            return listed
    pytest.fail("the pages never end")


# --- DiffCheckpoints paging ------------------------------------------------------------------------

def test_a_lower_case_base_id_with_live_text_diffs_is_no_data_loss(checkpoint_stub, workspace, plan_id):
    (workspace / "a.txt").write_text("old\n")
    base = checkpoint_id_of(checkpoint_stub, plan_id, workspace)
    (workspace / "a.txt").write_text("new, never captured by a checkpoint\n")
    upper = checkpoint_stub.DiffCheckpoints(pb.DiffCheckpointsRequest(base_checkpoint_id=base, text_diffs=True))
    assert [c.path for c in upper.changes] == ["a.txt"] and "+new, never" in upper.changes[0].text_diff
    lower = checkpoint_stub.DiffCheckpoints(pb.DiffCheckpointsRequest(base_checkpoint_id=base.lower(),
                                                                      text_diffs=True, page_size=1))
    assert [(c.path, c.text_diff) for c in lower.changes] == [(c.path, c.text_diff) for c in upper.changes]


#: Names that sort around '/' ('!', '.', ' ' below it, '0' above), not UTF-8 (surrogate escapes, which
#: sort among U+DC80..U+DCFF, between U+00E9 and U+FF01 in code points but not in bytes), astral.
NAMES = [b"a", b"a!", b"a.txt", b"a0", b"a b", b"\xff", b"\xef\xbc\x81", b"\xf0\x9f\x98\x80", b"\xed\xb2\x80",
         b"\xc3\xa9", b"\xf5x", b"-"]


def test_pages_of_odd_names_add_up_to_the_whole_diff(checkpoint_stub, workspace, plan_id):
    """Held: the resume compares component lists of the same strings the tree sorts, so pages of
    any size, with text diffs or raw_paths, list each path once, in the whole diff's order."""
    root = os.fsencode(workspace)
    base = checkpoint_id_of(checkpoint_stub, plan_id, workspace)
    for name in NAMES:
        os.mkdir(os.path.join(root, name))
        for child in NAMES:
            with open(os.path.join(root, name, child), "wb") as f:
                f.write(name + b"/" + child + b"\n")
    target = checkpoint_id_of(checkpoint_stub, plan_id)
    for side in (target, ""):
        whole = checkpoint_stub.DiffCheckpoints(pb.DiffCheckpointsRequest(base_checkpoint_id=base,
                                                                          target_checkpoint_id=side))
        expected = [_key(c) for c in whole.changes]
        assert len(expected) == len(NAMES) * (len(NAMES) + 1) and whole.next_page_token == ""
        for size in (1, 7):
            assert _paged(checkpoint_stub, base, side, page_size=size) == expected
        assert _paged(checkpoint_stub, base, side, page_size=5, text_diffs=True) == expected
        wanted = [b"\xff", b"a"]
        assert _paged(checkpoint_stub, base, side, page_size=3, raw_paths=wanted) == [
            k for k in expected if k.split(b"/")[0] in wanted]


def test_a_list_files_token_is_no_diff_token(checkpoint_stub, workspace, plan_id):
    """Held: the path-keyed tokens now shared with ListCheckpointFiles are scoped apart."""
    for n in range(3):
        (workspace / f"f{n}").write_text("x")
    base = checkpoint_id_of(checkpoint_stub, plan_id, workspace)
    listed = checkpoint_stub.ListCheckpointFiles(pb.ListCheckpointFilesRequest(checkpoint_id=base, page_size=1))
    assert listed.next_page_token
    with pytest.raises(grpc.RpcError) as refused:
        checkpoint_stub.DiffCheckpoints(pb.DiffCheckpointsRequest(base_checkpoint_id=base,
                                                                  page_token=listed.next_page_token))
    assert error_info(refused.value).reason == "INVALID_PAGE_TOKEN"


# --- serve start-up ---------------------------------------------------------------------------------

def test_a_start_that_fails_opening_the_store_releases_the_locks(short_tmp):
    base = Path(tempfile.mkdtemp(prefix="s12-", dir=short_tmp))
    settings = ServerSettings(listen=("127.0.0.1:0",), data_dir=base / "data", workspace_roots=(str(base),))
    (base / "data").mkdir()
    (base / "data" / "store").write_text("not a directory")
    with pytest.raises(OSError):
        CheckpointdServer(settings)
    (base / "data" / "store").unlink()
    try:
        server = CheckpointdServer(settings)
    except DataDirBusy as exc:
        pytest.fail(f"the failed start kept its locks: {exc}")
    server.stop(0)


#: `checkpointd serve ARGS` in this interpreter: a first SIGINT while the build runs (noted), and the
#: second just as the built server is handed back to serve, before serve swaps the raising handler
#: for one that notes: the signal's handler runs at the first call there (emulated by a wrapper of
#: that call, where the interpreter would run it at the call itself).
HANDED_BACK_SCRIPT = textwrap.dedent("""
    import os, signal, sys, time
    from checkpointd import cli, server

    real_add_listener = server.CheckpointdServer._add_listener

    def add_listener(self, listener):
        address = real_add_listener(self, listener)
        if listener.is_unix:
            os.kill(os.getpid(), signal.SIGINT)
            time.sleep(1)  # noted by the main thread, which waits for the build in slices
        return address

    real_note = cli._note_drain_signals
    sent = []

    def note(noted):
        if len(noted) == 1 and not sent:  # serve's, after the build (main's runs with none noted)
            sent.append(True)
            os.kill(os.getpid(), signal.SIGINT)
            for _ in range(100_000):  # the handler runs at one of these backward jumps
                pass
        return real_note(noted)

    server.CheckpointdServer._add_listener = add_listener
    cli._note_drain_signals = note
    sys.exit(cli.main(["serve", *sys.argv[1:]]))
""")


def test_a_second_signal_as_the_built_server_is_handed_back_leaves_no_socket_file(short_tmp):
    base = Path(tempfile.mkdtemp(prefix="s12-", dir=short_tmp))
    args = ["--data-dir", str(base / "data"), "--workspace-root", str(base),
            "--listen", f"127.0.0.1:{free_port()}", "--listen", f"unix://{base / 's.sock'}"]
    done = subprocess.run(interruptible([sys.executable, "-c", HANDED_BACK_SCRIPT, *args]),
                          capture_output=True, text=True, timeout=60)
    assert done.returncode == 130, (done.stdout, done.stderr[-3000:])
    assert "interrupted while starting" in done.stderr
    assert not (base / "s.sock").exists(), "the interrupted server left its socket file"
