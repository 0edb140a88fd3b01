"""The domain core: everything checkpointd does to workspaces, blobs and rows, and nothing of gRPC.

One package per subsystem, lowest first: kernel, workspace, metadata, store, capture, config,
restore, maintenance, engine. A package imports only those before it (tests/contract/test_layering.py).
"""
