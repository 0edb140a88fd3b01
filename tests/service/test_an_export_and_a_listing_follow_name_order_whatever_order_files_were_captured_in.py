"""A checkpoint's export (a tar) and its file listing give entries in name order. An incremental
capture hands the tree its new children last; the node it writes is cached, so a reader that took
the cached node's order would give the same checkpoint's entries in a different order depending on
whether the server had just captured it or had restarted since."""

from __future__ import annotations

import io
import tarfile

from checkpoint.v1 import checkpoint_service_pb2 as pb


def _checkpoint(stub, plan_id, root):
    return stub.CreateCheckpoint(pb.CreateCheckpointRequest(plan_id=plan_id, workspace_root=str(root))).checkpoint


def test_an_export_and_a_listing_follow_name_order_whatever_order_files_were_captured_in(
        checkpoint_stub, workspace, plan_id):
    for name in ("m.txt", "n.txt"):
        (workspace / name).write_text(name)
    _checkpoint(checkpoint_stub, plan_id, workspace)
    # Captured after the first two, and first by name.
    (workspace / "a.txt").write_text("added later")
    (workspace / "z.txt").write_text("added later")
    cp = _checkpoint(checkpoint_stub, plan_id, workspace)

    chunks = [r.data for r in checkpoint_stub.ExportCheckpoint(pb.ExportCheckpointRequest(
        checkpoint_id=cp.checkpoint_id))]
    with tarfile.open(fileobj=io.BytesIO(b"".join(chunks))) as tar:
        exported = [m.name for m in tar.getmembers()]
    assert exported == ["a.txt", "m.txt", "n.txt", "z.txt"]

    listed = checkpoint_stub.ListCheckpointFiles(pb.ListCheckpointFilesRequest(checkpoint_id=cp.checkpoint_id))
    assert [f.path for f in listed.files] == ["a.txt", "m.txt", "n.txt", "z.txt"]
