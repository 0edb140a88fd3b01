"""Config: the typed registry of configuration keys (global and per plan), their validation
and the store that keeps and watches them.
May import: kernel, workspace, metadata, store, capture."""
