from checkpoint.v1 import checkpoint_service_pb2 as pb


def test_create_and_get_over_tcp(checkpoint_stub, workspace, plan_id):
    (workspace / "a.txt").write_text("hello")
    created = checkpoint_stub.CreateCheckpoint(
        pb.CreateCheckpointRequest(plan_id=plan_id, workspace_root=str(workspace))).checkpoint
    assert created.file_count == 1 and created.sequence == 1
    got = checkpoint_stub.GetCheckpoint(pb.GetCheckpointRequest(checkpoint_id=created.checkpoint_id)).checkpoint
    assert got == created
