"""Restore: plans and applies the changes that bring a workspace to a tree, never overwriting
what changed since the safety capture, and the journal that lets a crashed rollback finish.
May import: kernel, workspace, metadata, store, capture, config."""
